//! netpolicy/src/dnswire.rs and resolver.rs: any bytes as a query from the
//! sandbox and as an upstream answer. Nothing panics; a refusal is always a
//! well-formed response to the query (its ID, at most its question); a
//! forwarded query's name is one a rule allows, of an address type, and
//! goes upstream as that bare question; answers open only addresses of
//! A/AAAA records that the filter accepts, at most MAX_ADDRESSES per port,
//! for a lifetime inside the clamp; the rebuilt reply parses.
#![no_main]

use lazaret_netpolicy::dnswire::{self, Header};
use lazaret_netpolicy::names::{NamePolicy, NameRule, parse_name_rule};
use lazaret_netpolicy::resolver::{self, QueryDecision, TtlClamp};
use libfuzzer_sys::fuzz_target;

fn policy() -> NamePolicy {
    let rule = |text: &str| {
        let (pattern, port) = parse_name_rule(text).expect("valid rule");
        NameRule { pattern, port, origin: "fuzz".into() }
    };
    NamePolicy::new(vec![rule("a.example.org"), rule("*.npmjs.org"), rule("github.com:22")])
}

fuzz_target!(|data: &[u8]| {
    let names = policy();
    let clamp = TtlClamp::default();
    // The same bytes as a query...
    match resolver::decide_query(&names, data) {
        QueryDecision::Reply { reply, .. } => {
            let header = Header::parse(&reply).expect("a reply has a header");
            assert!(header.is_response());
            assert_eq!(&reply[..2], &data[..2]);
            assert!(header.qdcount <= 1 && header.ancount == 0);
        }
        QueryDecision::Forward { question, .. } => {
            assert!(names.decide(&question.name).allowed(), "{}", question.name);
            assert!(resolver::FORWARDED_TYPES.contains(&question.qtype));
            // Upstream gets the bare question...
            let sent = resolver::upstream_query(0x4242, &question).expect("an allowed name encodes");
            assert_eq!(dnswire::parse_query(&sent).map(|(_, q)| (q.name, q.qtype)), Ok((question.name.clone(), question.qtype)));
            // ...and the same bytes, with the ID of the query sent, as its answer.
            let mut reply = data.to_vec();
            reply[..2].copy_from_slice(&0x4242u16.to_be_bytes());
            if let Some(response) = resolver::matching_response(0x4242, &question, &reply) {
                let rebuilt = resolver::rebuild(&names, &question, &response, clamp, |a| !a.is_loopback());
                for opening in &rebuilt.openings {
                    assert!(opening.lifetime >= clamp.min && opening.lifetime <= clamp.max);
                    assert!(!opening.address.is_loopback());
                    assert!(response.answers.iter().any(|r| r.address() == Some(opening.address)));
                }
                assert!(rebuilt.openings.len() <= resolver::MAX_ADDRESSES);
                // What the sandbox gets is a well-formed reply to its query.
                let sandbox_reply = dnswire::answer(data, dnswire::Rcode::NoError, &rebuilt.records).expect("encodable");
                assert_eq!(dnswire::parse_response(&sandbox_reply).map(|r| r.answers.len()), Ok(rebuilt.records.len()));
            }
        }
        QueryDecision::Ignore => {}
    }
    let _ = dnswire::parse_response(data);
    if data.len() > 2 {
        let _ = dnswire::read_name(data, usize::from(data[0]) % data.len());
    }
});
