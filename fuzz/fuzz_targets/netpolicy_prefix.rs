//! netpolicy/src/prefix.rs, policy.rs and dns.rs: prefixes and policies as a
//! configuration (and the host's resolv.conf) write them. A prefix that
//! parses prints and parses back to itself and contains its own network; a
//! policy that compiles decides every address by its longest matching rule,
//! keeps every configured rule exactly, and renders.
//!
//! Input: lines `allow P`, `deny P`, `dns A`, `ipv6`, `probe A`, anything
//! else is read as a resolv.conf line.
#![no_main]

use std::net::IpAddr;

use lazaret_netpolicy::policy::{Action, PolicyInput, RuleOrigin, compile, parse_prefixes};
use lazaret_netpolicy::{Prefix, dns};
use libfuzzer_sys::fuzz_target;

fn as_refs<'a>(v: &'a [(&'a str, String)]) -> Vec<(&'a str, &'a str)> {
    v.iter().map(|(p, l)| (*p, l.as_str())).collect()
}

fn check_prefix(text: &str) {
    if let Ok(prefix) = text.parse::<Prefix>() {
        let shown = prefix.to_string();
        assert_eq!(shown.parse::<Prefix>().as_ref(), Ok(&prefix), "{text:?} printed as {shown:?}");
        assert!(prefix.contains(prefix.network()));
        assert!(prefix.covers(&prefix) && prefix.overlaps(&prefix));
        assert_eq!(Prefix::truncating(prefix.network(), prefix.prefix_len()), prefix);
        assert_eq!(prefix.nth(0), Some(prefix.network()));
        if let Some(second) = prefix.nth(1) {
            assert!(prefix.contains(second), "{prefix} does not contain its address 1, {second}");
        }
        if let Some(sub) = prefix.subnet(prefix.prefix_len().saturating_add(1).min(if prefix.is_v4() { 32 } else { 128 }), 1) {
            assert!(prefix.covers(&sub), "{prefix} does not cover its subnet {sub}");
        }
    } else if let Err(error) = text.parse::<Prefix>() {
        let _ = error.to_string();
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut allow = Vec::new();
    let mut deny = Vec::new();
    let mut input = PolicyInput::default();
    let mut probes: Vec<IpAddr> = Vec::new();
    let mut resolv = String::new();
    for (number, line) in text.lines().enumerate().take(200) {
        let location = format!("fuzz.toml:{}:1", number + 1);
        match line.split_once(' ') {
            Some(("allow", p)) => {
                check_prefix(p);
                allow.push((p, location));
            }
            Some(("deny", p)) => {
                check_prefix(p);
                deny.push((p, location));
            }
            Some(("dns", a)) => input.dns.extend(a.parse::<IpAddr>()),
            Some(("probe", a)) => probes.extend(a.parse::<IpAddr>()),
            _ if line == "ipv6" => input.ipv6 = true,
            _ => {
                resolv.push_str(line);
                resolv.push('\n');
            }
        }
    }
    if let Ok(resolvers) = dns::resolvers_from_resolv_conf(&resolv, Some(&resolv)) {
        assert!(!resolvers.is_empty() && resolvers.iter().all(|r| !r.is_loopback()));
        let conf = dns::sandbox_resolv_conf(&resolvers);
        assert_eq!(dns::nameservers(&conf), resolvers, "the sandbox's resolv.conf reads back");
    }
    let (Ok(a), Ok(d)) = (parse_prefixes(&as_refs(&allow)), parse_prefixes(&as_refs(&deny))) else { return };
    input.allow = a;
    input.deny = d;
    let Ok(policy) = compile(&input) else { return };
    let rules = policy.rules();
    // Every configured prefix is a rule of its own with its action.
    for (list, action) in [(&input.allow, Action::Allow), (&input.deny, Action::Deny)] {
        for (prefix, location) in list {
            let rule = rules.iter().find(|r| r.prefix == *prefix).unwrap_or_else(|| panic!("{prefix} has no rule"));
            assert_eq!(rule.action, action, "{prefix}");
            assert_eq!(rule.origin, RuleOrigin::Config(location.clone()));
            probes.push(prefix.network());
        }
    }
    probes.extend(input.dns.iter().copied());
    for address in probes {
        let verdict = policy.decide(address);
        assert!(verdict.rule.prefix.contains(address), "{address}: {verdict}");
        if let Some(longer) = rules.iter().find(|r| r.prefix.contains(address) && r.prefix.prefix_len() > verdict.rule.prefix.prefix_len()) {
            panic!("{address}: decided by {} though {} is longer", verdict.rule.prefix, longer.prefix);
        }
        let _ = policy.explain(address);
    }
    let _ = policy.routes();
    let _ = policy.render_table();
});
