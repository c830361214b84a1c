//! What the locked-mode resolver decides, without any I/O: which queries
//! are answered at once (refused, malformed), which are forwarded, and
//! which addresses an upstream answer opens for how long.
//!
//! * A refused name is answered REFUSED by the resolver itself: nothing of
//!   it reaches the upstream resolvers, so a name cannot carry data out.
//! * An allowed name's answer opens the A and AAAA addresses at the end of
//!   its CNAME chain (starting from the name asked, so the chain's names
//!   need no rule of their own), for the smallest TTL along the chain,
//!   clamped to [`TtlClamp`] (default 30 s .. 1 h): a 0-second TTL must not
//!   close the address before the sandbox connects, a week-long one must
//!   not keep it open for a week.
//! * The answer must be the upstream's reply to this very query (ID,
//!   question name, type and class), else it is dropped.

use std::net::IpAddr;
use std::time::Duration;

use crate::dnswire::{self, CLASS_IN, Header, Question, Rcode, RecordData, Response, TYPE_CNAME};
use crate::names::{NamePolicy, Ports};

/// The range an answer's TTL is clamped to before it becomes the lifetime
/// of the addresses it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtlClamp {
    /// Shortest lifetime.
    pub min: Duration,
    /// Longest lifetime.
    pub max: Duration,
}

impl Default for TtlClamp {
    fn default() -> TtlClamp {
        TtlClamp { min: Duration::from_secs(30), max: Duration::from_secs(3600) }
    }
}

impl TtlClamp {
    /// `ttl` seconds, clamped.
    pub fn apply(&self, ttl: u32) -> Duration {
        Duration::from_secs(u64::from(ttl)).clamp(self.min, self.max.max(self.min))
    }
}

/// What to do with one packet from the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryDecision {
    /// Send `reply` back; `refused` is the refused name (for `policy log`),
    /// if the query was readable and refused by the policy.
    Reply {
        /// The reply message.
        reply: Vec<u8>,
        /// The refused name.
        refused: Option<String>,
    },
    /// Ask the upstream resolvers.
    Forward {
        /// The query's header.
        header: Header,
        /// Its question.
        question: Question,
    },
    /// Not a query at all (a response, or shorter than a header): no reply.
    Ignore,
}

/// Decides one query of the sandbox.
pub fn decide_query(names: &NamePolicy, query: &[u8]) -> QueryDecision {
    let Ok(header) = Header::parse(query) else {
        return QueryDecision::Ignore;
    };
    if header.is_response() {
        return QueryDecision::Ignore;
    }
    let reply = |end, rcode| dnswire::refusal(query, end, rcode);
    if header.opcode() != 0 {
        return QueryDecision::Reply { reply: reply(None, Rcode::NotImp), refused: None };
    }
    let question = match dnswire::parse_query(query) {
        Ok((_, question)) => question,
        Err(_) => return QueryDecision::Reply { reply: reply(None, Rcode::FormErr), refused: None },
    };
    if question.qclass != CLASS_IN || !names.decide(&question.name).allowed() {
        let refused = Some(question.name.clone());
        return QueryDecision::Reply { reply: reply(Some(question.end), Rcode::Refused), refused };
    }
    QueryDecision::Forward { header, question }
}

/// One address an answer opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opening {
    /// The address.
    pub address: IpAddr,
    /// The only port (TCP and UDP), or every port.
    pub port: Option<u16>,
    /// For how long.
    pub lifetime: Duration,
}

/// Reads the upstream's `response` to (`header`, `question`): `None` if it
/// is no reply to that query.
pub fn matching_response(header: &Header, question: &Question, response: &[u8]) -> Option<Response> {
    let parsed = dnswire::parse_response(response).ok()?;
    let same = parsed.header.is_response()
        && parsed.header.id == header.id
        && parsed.question.name == question.name
        && parsed.question.qtype == question.qtype
        && parsed.question.qclass == question.qclass;
    same.then_some(parsed)
}

/// At most this many CNAME links are followed.
const MAX_CHAIN: usize = 16;

/// The addresses `response` (a reply to `question`) opens under `names`.
pub fn openings(names: &NamePolicy, question: &Question, response: &Response, clamp: TtlClamp) -> Vec<Opening> {
    let verdict = names.decide(&question.name);
    if !verdict.allowed() || response.header.rcode() != Rcode::NoError as u8 {
        return Vec::new();
    }
    // The chain from the name asked: (name, smallest TTL on the way to it).
    let mut chain: Vec<(String, u32)> = vec![(question.name.clone(), u32::MAX)];
    let mut index = 0;
    while index < chain.len() && chain.len() <= MAX_CHAIN {
        let (owner, ttl) = chain[index].clone();
        for record in response.answers.iter().filter(|r| r.rtype == TYPE_CNAME && r.name == owner) {
            if let RecordData::Cname(target) = &record.data {
                if !chain.iter().any(|(name, _)| name == target) {
                    chain.push((target.clone(), ttl.min(record.ttl)));
                }
            }
        }
        index += 1;
    }
    let ports: Vec<Option<u16>> = match verdict.ports {
        Ports::All => vec![None],
        Ports::Only(ports) => ports.into_iter().map(Some).collect(),
    };
    let mut found: Vec<Opening> = Vec::new();
    for record in &response.answers {
        let (Some(address), Some((_, chain_ttl))) = (record.address(), chain.iter().find(|(name, _)| *name == record.name)) else {
            continue;
        };
        let lifetime = clamp.apply(record.ttl.min(*chain_ttl));
        for port in &ports {
            match found.iter_mut().find(|o| o.address == address && o.port == *port) {
                Some(existing) => existing.lifetime = existing.lifetime.max(lifetime),
                None => found.push(Opening { address, port: *port, lifetime }),
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dnswire::{AnswerRecord, TYPE_A, TYPE_AAAA, answer, query};
    use crate::names::{NameRule, parse_name_rule};

    fn policy(rules: &[&str]) -> NamePolicy {
        NamePolicy::new(
            rules
                .iter()
                .map(|text| {
                    let (pattern, port) = parse_name_rule(text).expect("valid test input");
                    NameRule { pattern, port, origin: "c:1:1".into() }
                })
                .collect(),
        )
    }

    fn record(name: &str, ttl: u32, data: &str) -> AnswerRecord {
        let data = match data.parse::<IpAddr>() {
            Ok(IpAddr::V4(a)) => RecordData::A(a),
            Ok(IpAddr::V6(a)) => RecordData::Aaaa(a),
            Err(_) => RecordData::Cname(data.to_string()),
        };
        AnswerRecord { name: name.into(), ttl, data }
    }

    fn forwarded(names: &NamePolicy, q: &[u8]) -> (Header, Question) {
        match decide_query(names, q) {
            QueryDecision::Forward { header, question } => (header, question),
            other => panic!("not forwarded: {other:?}"),
        }
    }

    #[test]
    fn refused_names_get_refused_without_upstream() {
        let names = policy(&["api.anthropic.com", "*.npmjs.org"]);
        let q = query(5, "x7f3a9.exfil.evil.example", TYPE_A).expect("encodable");
        match decide_query(&names, &q) {
            QueryDecision::Reply { reply, refused } => {
                assert_eq!(refused.as_deref(), Some("x7f3a9.exfil.evil.example"));
                let header = Header::parse(&reply).expect("header");
                assert_eq!((header.id, header.rcode()), (5, Rcode::Refused as u8));
            }
            other => panic!("{other:?}"),
        }
        forwarded(&names, &query(6, "API.Anthropic.COM", TYPE_AAAA).expect("encodable"));
        forwarded(&names, &query(6, "registry.npmjs.org", TYPE_A).expect("encodable"));
        // Responses and runts are ignored; garbage gets FORMERR; other opcodes NOTIMP.
        let mut response = q.clone();
        response[2] |= 0x80;
        assert_eq!(decide_query(&names, &response), QueryDecision::Ignore);
        assert_eq!(decide_query(&names, &q[..5]), QueryDecision::Ignore);
        let rcode = |bytes: &[u8]| match decide_query(&names, bytes) {
            QueryDecision::Reply { reply, .. } => Header::parse(&reply).expect("header").rcode(),
            other => panic!("{other:?}"),
        };
        assert_eq!(rcode(&q[..14]), Rcode::FormErr as u8);
        let mut notify = q.clone();
        notify[2] |= 4 << 3;
        assert_eq!(rcode(&notify), Rcode::NotImp as u8);
        // Class CH (version.bind and friends) is refused too.
        let mut chaos = query(1, "api.anthropic.com", TYPE_A).expect("encodable");
        let n = chaos.len();
        chaos[n - 1] = 3;
        assert_eq!(rcode(&chaos), Rcode::Refused as u8);
    }

    #[test]
    fn cname_chains_open_their_end_addresses() {
        let names = policy(&["www.example.org"]);
        let q = query(9, "www.example.org", TYPE_A).expect("encodable");
        let (header, question) = forwarded(&names, &q);
        let bytes = answer(&q, Rcode::NoError, &[
            record("www.example.org", 600, "edge.cdn.example"),
            record("edge.cdn.example", 120, "e1.cdn.example"),
            record("e1.cdn.example", 3000, "203.0.113.10"),
            record("e1.cdn.example", 3000, "2001:db8::10"),
            // Not on the chain: ignored.
            record("other.example", 3000, "198.51.100.66"),
        ])
        .expect("encodable");
        let response = matching_response(&header, &question, &bytes).expect("matches");
        let opened = openings(&names, &question, &response, TtlClamp::default());
        assert_eq!(opened, vec![
            Opening { address: "203.0.113.10".parse().expect("ip"), port: None, lifetime: Duration::from_secs(120) },
            Opening { address: "2001:db8::10".parse().expect("ip"), port: None, lifetime: Duration::from_secs(120) },
        ]);
    }

    #[test]
    fn ports_and_clamps() {
        let names = policy(&["github.com:22", "github.com:443"]);
        let q = query(1, "github.com", TYPE_A).expect("encodable");
        let (header, question) = forwarded(&names, &q);
        let bytes = answer(&q, Rcode::NoError, &[record("github.com", 0, "192.0.2.1"), record("github.com", 99999, "192.0.2.2")]).expect("encodable");
        let response = matching_response(&header, &question, &bytes).expect("matches");
        let opened = openings(&names, &question, &response, TtlClamp::default());
        assert_eq!(opened.len(), 4);
        assert_eq!((opened[0].port, opened[0].lifetime), (Some(22), Duration::from_secs(30)));
        assert_eq!((opened[3].port, opened[3].lifetime), (Some(443), Duration::from_secs(3600)));
        let short = TtlClamp { min: Duration::from_secs(1), max: Duration::from_secs(3600) };
        assert_eq!(short.apply(2), Duration::from_secs(2));
        assert_eq!(short.apply(0), Duration::from_secs(1));
    }

    #[test]
    fn foreign_or_failed_answers_open_nothing() {
        let names = policy(&["a.example.org"]);
        let q = query(1, "a.example.org", TYPE_A).expect("encodable");
        let (header, question) = forwarded(&names, &q);
        let other = query(2, "a.example.org", TYPE_A).expect("encodable");
        let wrong_id = answer(&other, Rcode::NoError, &[record("a.example.org", 60, "192.0.2.1")]).expect("encodable");
        assert!(matching_response(&header, &question, &wrong_id).is_none());
        let other = query(1, "b.example.org", TYPE_A).expect("encodable");
        let wrong_name = answer(&other, Rcode::NoError, &[record("b.example.org", 60, "192.0.2.1")]).expect("encodable");
        assert!(matching_response(&header, &question, &wrong_name).is_none());
        let failed = answer(&q, Rcode::ServFail, &[record("a.example.org", 60, "192.0.2.1")]).expect("encodable");
        let response = matching_response(&header, &question, &failed).expect("matches");
        assert!(openings(&names, &question, &response, TtlClamp::default()).is_empty());
        // The query itself is no response.
        assert!(matching_response(&header, &question, &q).is_none());
    }
}
