//! netpolicy/src/dnswire.rs and resolver.rs: any bytes as a query from the
//! sandbox and as an upstream answer. Nothing panics; a refusal is always a
//! well-formed response to the query (its ID, at most its question); a
//! forwarded query's name is one a rule allows; answers open only
//! addresses of A/AAAA records, for a lifetime inside the clamp.
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
        QueryDecision::Forward { header, question } => {
            assert!(names.decide(&question.name).allowed(), "{}", question.name);
            // ...and as the upstream's answer to it.
            if let Some(response) = resolver::matching_response(&header, &question, data) {
                for opening in resolver::openings(&names, &question, &response, clamp) {
                    assert!(opening.lifetime >= clamp.min && opening.lifetime <= clamp.max);
                    assert!(response.answers.iter().any(|r| r.address() == Some(opening.address)));
                }
            }
        }
        QueryDecision::Ignore => {}
    }
    let _ = dnswire::parse_response(data);
    if data.len() > 2 {
        let _ = dnswire::read_name(data, usize::from(data[0]) % data.len());
    }
});
