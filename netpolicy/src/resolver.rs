//! What the locked-mode resolver decides, without any I/O: which queries
//! are answered at once (refused, malformed), what is asked upstream,
//! which records of the upstream's answer reach the sandbox and which
//! addresses they open for how long.
//!
//! * A refused name is answered REFUSED by the resolver itself: nothing of
//!   it reaches the upstream resolvers, so a name cannot carry data out.
//!   Only address lookups (A, AAAA, and CNAME) of allowed names are
//!   forwarded: other types (TXT, NULL, ANY, SRV, ...) are refused too,
//!   since nothing in locked mode needs them and their records could not
//!   be checked.
//! * Upstream gets a query the resolver writes itself ([`upstream_query`]):
//!   a fresh ID, recursion desired, the one question in lower case, no
//!   other section and no EDNS (so no client subnet or other option of the
//!   sandbox's). Nothing the sandbox wrote but the name and the type leaves.
//! * The sandbox gets an answer rebuilt from scratch ([`rebuild`]): its own
//!   question, the CNAME chain that starts at the name it asked (one link
//!   per name, at most [`MAX_CHAIN`]), and the records of the asked type
//!   owned by the chain's last name, each address only if the Domain's
//!   policy would let the sandbox reach it ([`may_open`]: not a denied
//!   block, not one of the host's addresses, not the Lazaret pool, not an
//!   upstream resolver), at most [`MAX_ADDRESSES`]. Records of other names,
//!   the authority and additional sections, EDNS: all dropped.
//! * The chain's names need no rule of their own (a CDN's names rarely
//!   could have one): the allowed name's owner could put any address in it
//!   directly, so a CNAME gives them nothing more. The resolver never asks
//!   upstream for a chain name; the sandbox's own lookup of one is decided
//!   like any other name.
//! * The addresses kept are opened for the smallest TTL along the chain,
//!   clamped to [`TtlClamp`] (default 30 s .. 1 h): a 0-second TTL must not
//!   close the address before the sandbox connects, a week-long one must
//!   not keep it open for a week. The sandbox is told that lifetime as the
//!   TTL, so its cache does not outlive the opening.
//! * The answer must be the upstream's reply to this very query (ID,
//!   question name, type and class), else it is dropped.

use std::net::IpAddr;
use std::time::Duration;

use crate::dnswire::{self, AnswerRecord, CLASS_IN, Header, Question, Rcode, RecordData, Response, TYPE_A, TYPE_AAAA, TYPE_CNAME};
use crate::names::{NamePolicy, Ports};
use crate::policy::{Action, CompiledPolicy, RuleOrigin};

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
    if !FORWARDED_TYPES.contains(&question.qtype) {
        // No rule is missing: `policy log` would only mislead.
        return QueryDecision::Reply { reply: reply(Some(question.end), Rcode::Refused), refused: None };
    }
    QueryDecision::Forward { header, question }
}

/// The query types forwarded for an allowed name: addresses and the chain to them.
pub const FORWARDED_TYPES: [u16; 3] = [TYPE_A, TYPE_AAAA, TYPE_CNAME];

/// The query sent upstream for `question` (a forwarded one): ID `id`,
/// recursion desired, the question alone, no EDNS. `None` only for a name
/// that is no plain name (never one a rule allows).
pub fn upstream_query(id: u16, question: &Question) -> Option<Vec<u8>> {
    dnswire::query(id, &question.name, question.qtype)
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

/// Reads the upstream's `response` to the query with ID `id` for
/// `question`: `None` if it is no reply to that query.
pub fn matching_response(id: u16, question: &Question, response: &[u8]) -> Option<Response> {
    let parsed = dnswire::parse_response(response).ok()?;
    let same = parsed.header.is_response()
        && parsed.header.opcode() == 0
        && parsed.header.id == id
        && parsed.question.name == question.name
        && parsed.question.qtype == question.qtype
        && parsed.question.qclass == question.qclass;
    same.then_some(parsed)
}

/// At most this many CNAME links are followed.
pub const MAX_CHAIN: usize = 16;
/// At most this many addresses of one answer reach the sandbox and open:
/// a name the agent controls must not fill the sets with one answer.
pub const MAX_ADDRESSES: usize = 32;

/// Whether an answer may hand `address` to the sandbox and open it: the
/// Domain's routes would let the sandbox reach it (a public address, or
/// one inside an `allow_egress` prefix), and it is none of `plumbing` (the
/// upstream resolvers, the Domain's own addresses), also when embedded in
/// an IPv4-mapped or NAT64 (`64:ff9b::/96`) IPv6 address. In locked mode
/// the policy says `Locked` for what the routes allow without a config
/// rule; a resolver's own rule is such a rule, hence the explicit list.
pub fn may_open(policy: &CompiledPolicy, plumbing: &[IpAddr], address: IpAddr) -> bool {
    let verdict = policy.decide(address);
    let routed = verdict.action == Action::Allow || verdict.rule.origin == RuleOrigin::Locked;
    let embedded = match address {
        IpAddr::V6(v6) => {
            let [a, b, c, d, e, f, _, _] = v6.segments();
            let nat64 = [a, b, c, d, e, f] == [0x64, 0xff9b, 0, 0, 0, 0];
            v6.to_ipv4_mapped().or_else(|| nat64.then(|| std::net::Ipv4Addr::from(v6.to_bits() as u32))).map(IpAddr::V4)
        }
        IpAddr::V4(_) => None,
    };
    routed && !plumbing.contains(&address) && !embedded.is_some_and(|inner| plumbing.contains(&inner))
}

/// An upstream answer rebuilt for the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rebuilt {
    /// The records the sandbox gets: the CNAME chain from the name asked,
    /// then the kept records of the asked type at its end.
    pub records: Vec<AnswerRecord>,
    /// The addresses to open before the sandbox gets them.
    pub openings: Vec<Opening>,
    /// Addresses of the chain's end that were dropped (refused by
    /// `may_open`, or beyond [`MAX_ADDRESSES`]).
    pub dropped: usize,
}

/// Rebuilds `response` (a reply to `question`, see [`matching_response`])
/// for the sandbox under `names`, keeping only addresses `may_open`
/// accepts. A failed or refused answer keeps nothing.
pub fn rebuild(
    names: &NamePolicy,
    question: &Question,
    response: &Response,
    clamp: TtlClamp,
    may_open: impl Fn(IpAddr) -> bool,
) -> Rebuilt {
    let verdict = names.decide(&question.name);
    let rcode = response.header.rcode();
    if !verdict.allowed() || (rcode != Rcode::NoError as u8 && rcode != Rcode::NxDomain as u8) {
        return Rebuilt::default();
    }
    let longest = u32::try_from(clamp.max.as_secs()).unwrap_or(u32::MAX);
    let mut rebuilt = Rebuilt::default();
    // The chain: at most one CNAME per name (the first), no name twice.
    let mut owner = question.name.clone();
    let mut chain_ttl = u32::MAX;
    let mut visited = vec![owner.clone()];
    while rebuilt.records.len() < MAX_CHAIN {
        let link = response.answers.iter().find_map(|record| match &record.data {
            RecordData::Cname(target) if record.rtype == TYPE_CNAME && record.name == owner => Some((target.clone(), record.ttl)),
            _ => None,
        });
        let Some((target, ttl)) = link else { break };
        // A name the sandbox could not be sent (odd bytes) ends the chain too.
        if visited.contains(&target) || dnswire::encode_name(&target).is_none() {
            break;
        }
        chain_ttl = chain_ttl.min(ttl);
        rebuilt.records.push(AnswerRecord { name: owner.clone(), ttl: ttl.min(longest), data: RecordData::Cname(target.clone()) });
        visited.push(target.clone());
        owner = target;
        if question.qtype == TYPE_CNAME {
            // The one record asked for.
            return rebuilt;
        }
    }
    let ports: Vec<Option<u16>> = match verdict.ports {
        Ports::All => vec![None],
        Ports::Only(ports) => ports.into_iter().map(Some).collect(),
    };
    let mut kept: Vec<IpAddr> = Vec::new();
    for record in response.answers.iter().filter(|r| r.rtype == question.qtype && r.class == CLASS_IN && r.name == owner) {
        let Some(address) = record.address() else { continue };
        if kept.contains(&address) {
            continue;
        }
        if kept.len() >= MAX_ADDRESSES || !may_open(address) {
            rebuilt.dropped += 1;
            continue;
        }
        kept.push(address);
        let lifetime = clamp.apply(record.ttl.min(chain_ttl));
        let data = match address {
            IpAddr::V4(v4) => RecordData::A(v4),
            IpAddr::V6(v6) => RecordData::Aaaa(v6),
        };
        let told = u32::try_from(lifetime.as_secs()).unwrap_or(u32::MAX);
        rebuilt.records.push(AnswerRecord { name: owner.clone(), ttl: told, data });
        rebuilt.openings.extend(ports.iter().map(|port| Opening { address, port: *port, lifetime }));
    }
    rebuilt
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dnswire::{answer, query};
    use crate::names::{NameRule, parse_name_rule};
    use crate::policy::{PolicyInput, compile};
    use crate::prefix::Prefix;

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

    fn everything(_: IpAddr) -> bool {
        true
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("valid test input")
    }

    /// The forwarded question for `name`/`qtype` and the upstream's reply with `records`.
    fn exchange(names: &NamePolicy, name: &str, qtype: u16, rcode: Rcode, records: &[AnswerRecord]) -> (Question, Response) {
        let q = query(9, name, qtype).expect("encodable");
        let (_, question) = forwarded(names, &q);
        let upstream = upstream_query(0x7777, &question).expect("encodable");
        let bytes = answer(&upstream, rcode, records).expect("encodable");
        let response = matching_response(0x7777, &question, &bytes).expect("matches");
        (question, response)
    }

    #[test]
    fn only_address_types_are_forwarded_and_upstream_gets_a_bare_question() {
        let names = policy(&["www.example.org"]);
        for qtype in [16, 10, 255, 33, 65, 99] {
            match decide_query(&names, &query(1, "www.example.org", qtype).expect("encodable")) {
                QueryDecision::Reply { reply, refused } => {
                    assert_eq!(Header::parse(&reply).expect("header").rcode(), Rcode::Refused as u8, "type {qtype}");
                    assert_eq!(refused, None, "no rule is missing for type {qtype}");
                }
                other => panic!("type {qtype}: {other:?}"),
            }
        }
        // The sandbox's query with EDNS, odd bits and odd case: upstream gets only the question.
        let mut q = query(0xbeef, "WWW.Example.ORG", TYPE_AAAA).expect("encodable");
        q[3] = 0x70;
        q[11] = 1;
        q.extend([0, 0, 41, 16, 0, 0, 0, 0, 0, 0, 6, 0, 8, 0, 2, 0, 1]);
        let (_, question) = forwarded(&names, &q);
        assert_eq!(upstream_query(0x1234, &question), query(0x1234, "www.example.org", TYPE_AAAA));
    }

    #[test]
    fn cname_chains_open_their_end_addresses_only() {
        let names = policy(&["www.example.org"]);
        let (question, response) = exchange(
            &names,
            "www.example.org",
            TYPE_A,
            Rcode::NoError,
            &[
                record("www.example.org", 600, "edge.cdn.example"),
                // Not allowed beside a CNAME (RFC 1034 3.6.2): ignored.
                record("www.example.org", 600, "198.51.100.1"),
                record("edge.cdn.example", 120, "e1.cdn.example"),
                record("e1.cdn.example", 3000, "203.0.113.10"),
                // Not the type asked, not on the chain: ignored.
                record("e1.cdn.example", 3000, "2001:db8::10"),
                record("other.example", 3000, "198.51.100.66"),
                // A second CNAME of the same name: only the first link counts.
                record("www.example.org", 600, "evil.example"),
                record("evil.example", 600, "198.51.100.77"),
            ],
        );
        let rebuilt = rebuild(&names, &question, &response, TtlClamp::default(), everything);
        assert_eq!(
            rebuilt.records,
            vec![
                record("www.example.org", 600, "edge.cdn.example"),
                record("edge.cdn.example", 120, "e1.cdn.example"),
                record("e1.cdn.example", 120, "203.0.113.10"),
            ]
        );
        assert_eq!(rebuilt.openings, vec![Opening { address: ip("203.0.113.10"), port: None, lifetime: Duration::from_secs(120) }]);
        // A CNAME query gets the one link.
        let (question, response) = exchange(
            &names,
            "www.example.org",
            TYPE_CNAME,
            Rcode::NoError,
            &[record("www.example.org", 600, "edge.cdn.example"), record("edge.cdn.example", 120, "203.0.113.10")],
        );
        let rebuilt = rebuild(&names, &question, &response, TtlClamp::default(), everything);
        assert_eq!((rebuilt.records.len(), rebuilt.openings.len()), (1, 0));
        // A loop ends; a long chain stops at MAX_CHAIN.
        let (question, response) = exchange(
            &names,
            "www.example.org",
            TYPE_A,
            Rcode::NoError,
            &[record("www.example.org", 60, "a.example"), record("a.example", 60, "www.example.org")],
        );
        // The link back to a name already on the chain is dropped.
        assert_eq!(rebuild(&names, &question, &response, TtlClamp::default(), everything).records.len(), 1);
        let mut long = vec![record("www.example.org", 60, "l0.example")];
        long.extend((0..40).map(|i| record(&format!("l{i}.example"), 60, &format!("l{}.example", i + 1))));
        let (question, response) = exchange(&names, "www.example.org", TYPE_A, Rcode::NoError, &long);
        assert_eq!(rebuild(&names, &question, &response, TtlClamp::default(), everything).records.len(), MAX_CHAIN);
    }

    #[test]
    fn addresses_are_filtered_and_bounded() {
        let names = policy(&["many.example.org"]);
        let mut records: Vec<AnswerRecord> = (0..100).map(|i| record("many.example.org", 60, &format!("11.0.0.{i}"))).collect();
        records.push(record("many.example.org", 60, "11.0.0.1"));
        let (question, response) = exchange(&names, "many.example.org", TYPE_A, Rcode::NoError, &records);
        let odd_only = |address: IpAddr| matches!(address, IpAddr::V4(v4) if v4.octets()[3] % 2 == 1);
        let rebuilt = rebuild(&names, &question, &response, TtlClamp::default(), odd_only);
        assert_eq!(rebuilt.openings.len(), MAX_ADDRESSES);
        assert!(rebuilt.openings.iter().all(|o| odd_only(o.address)));
        assert_eq!(rebuilt.dropped, 100 - MAX_ADDRESSES);
    }

    #[test]
    fn ports_and_clamps() {
        let names = policy(&["github.com:22", "github.com:443"]);
        let (question, response) = exchange(
            &names,
            "github.com",
            TYPE_A,
            Rcode::NoError,
            &[record("github.com", 0, "192.0.2.1"), record("github.com", 99999, "192.0.2.2")],
        );
        let rebuilt = rebuild(&names, &question, &response, TtlClamp::default(), everything);
        let opened = rebuilt.openings;
        assert_eq!(opened.len(), 4);
        assert_eq!((opened[0].port, opened[0].lifetime), (Some(22), Duration::from_secs(30)));
        assert_eq!((opened[3].port, opened[3].lifetime), (Some(443), Duration::from_secs(3600)));
        // The sandbox is told the lifetime, not the upstream's TTL.
        assert_eq!(rebuilt.records.iter().map(|r| r.ttl).collect::<Vec<_>>(), vec![30, 3600]);
        let short = TtlClamp { min: Duration::from_secs(1), max: Duration::from_secs(3600) };
        assert_eq!(short.apply(2), Duration::from_secs(2));
        assert_eq!(short.apply(0), Duration::from_secs(1));
    }

    #[test]
    fn foreign_or_failed_answers_open_nothing() {
        let names = policy(&["a.example.org"]);
        let q = query(1, "a.example.org", TYPE_A).expect("encodable");
        let (_, question) = forwarded(&names, &q);
        let sent = upstream_query(7, &question).expect("encodable");
        let reply = answer(&sent, Rcode::NoError, &[record("a.example.org", 60, "192.0.2.1")]).expect("encodable");
        assert!(matching_response(7, &question, &reply).is_some());
        assert!(matching_response(8, &question, &reply).is_none(), "wrong ID");
        let other = query(7, "b.example.org", TYPE_A).expect("encodable");
        let wrong_name = answer(&other, Rcode::NoError, &[record("b.example.org", 60, "192.0.2.1")]).expect("encodable");
        assert!(matching_response(7, &question, &wrong_name).is_none());
        let other_type = query(7, "a.example.org", TYPE_AAAA).expect("encodable");
        assert!(matching_response(7, &question, &answer(&other_type, Rcode::NoError, &[]).expect("encodable")).is_none());
        for rcode in [Rcode::ServFail, Rcode::Refused, Rcode::FormErr] {
            let failed = answer(&sent, rcode, &[record("a.example.org", 60, "192.0.2.1")]).expect("encodable");
            let response = matching_response(7, &question, &failed).expect("matches");
            assert_eq!(rebuild(&names, &question, &response, TtlClamp::default(), everything), Rebuilt::default());
        }
        // The query itself is no response.
        assert!(matching_response(7, &question, &sent).is_none());
    }

    #[test]
    fn may_open_only_what_the_routes_allow_and_no_plumbing() {
        let locked = |ipv6: bool| {
            compile(&PolicyInput {
                locked: true,
                ipv6,
                dns: vec![ip("10.0.2.3"), ip("9.9.9.9")],
                allow: vec![(Prefix::host(ip("10.5.0.1")), "c:1:1".into())],
                host_addresses: vec![ip("11.0.0.2")],
                own_addresses: vec!["100.96.0.0/30".parse().expect("prefix")],
                ..PolicyInput::default()
            })
            .expect("compiles")
        };
        let policy = locked(true);
        let plumbing = [ip("10.0.2.3"), ip("9.9.9.9"), ip("100.96.0.1")];
        let open = |text: &str| may_open(&policy, &plumbing, ip(text));
        for allowed in ["8.8.8.8", "10.5.0.1", "2a00:1450::1", "64:ff9b::808:808"] {
            assert!(open(allowed), "{allowed}");
        }
        for denied in [
            "10.0.2.3",
            "9.9.9.9",
            "10.1.1.1",
            "127.0.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "169.254.169.254",
            "100.64.0.1",
            "224.0.0.251",
            "255.255.255.255",
            "100.96.0.1",
            "100.96.0.2",
            "11.0.0.2",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "ff02::1",
            "::ffff:8.8.8.8",
            "::ffff:10.0.2.3",
            "64:ff9b::a00:203",
            "64:ff9b::909:909",
            "64:ff9b::7f00:1",
            "2001:db8::1",
        ] {
            assert!(!open(denied), "{denied}");
        }
        // IPv6 disabled: no IPv6 address at all.
        let v4_only = locked(false);
        assert!(!may_open(&v4_only, &plumbing, ip("2a00:1450::1")));
    }
}
