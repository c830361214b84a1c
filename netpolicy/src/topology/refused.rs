//! Counting what the sidecar refuses, for `lazaret policy log`.
//!
//! Each sidecar table that refuses something (`lazaret-filter`, and
//! `lazaret-locked` in locked mode) has two dynamic sets with a counter per
//! element, `refused4` (`ipv4_addr . inet_proto . inet_service`) and
//! `refused6`, bounded ([`REFUSED_SET_SIZE`] elements, each forgotten
//! [`REFUSED_TIMEOUT`] after it was last refused; a full set counts nothing
//! new and refuses as before), and a regular chain `refuse`
//! that puts the packet's destination, protocol and port (0 for protocols
//! without ports) into the set and rejects it (host-unreachable). The
//! tables' rejecting rules `goto refuse`.
//!
//! What the routes refuse (the `unreachable` routes of the policy) never
//! reaches a forward chain, so `lazaret-filter` also has a base chain
//! `refused-routes` (prerouting, priority filter) that counts every packet
//! from the sandbox starting something (`ct state` neither established nor
//! related) whose destination has no route out (`fib daddr oif` 0) and is
//! not one of the sidecar's own addresses (`fib daddr type != local`: the
//! resolver and the escalation listener live there). It only counts, never
//! decides: the packet goes on to the routes, which refuse it.
//!
//! These chains, rules and sets are `nftcodec` messages like the rest of
//! the table, and read back with it.

use std::net::IpAddr;
use std::time::Duration;

use super::nftcodec::{
    self as codec, BaseChain, Expr, NF_INET_PRE_ROUTING, NFPROTO_INET, NFT_CMP_EQ, NFT_CMP_NEQ, NFT_CT_STATE, NFT_DYNSET_OP_UPDATE,
    NFT_FIB_RESULT_ADDRTYPE, NFT_FIB_RESULT_OIF, NFT_META_IIFNAME, NFT_META_L4PROTO, NFT_META_NFPROTO, NFT_MSG_GETSETELEM,
    NFT_MSG_NEWSETELEM, NFT_PAYLOAD_NETWORK_HEADER, NFT_PAYLOAD_TRANSPORT_HEADER, NFT_REG_1, NFT_REG_2, NFT_REG32_00,
    NFT_REJECT_ICMPX_HOST_UNREACH, NFT_REJECT_ICMPX_UNREACH, NFTA_FIB_F_DADDR, SetDesc, attributes, be64_value, find,
};
use super::{SIDECAR_INNER_LINK, TopologyError};

/// Elements per set: the most recent distinct destinations kept.
pub const REFUSED_SET_SIZE: u32 = 1024;
/// How long a destination stays listed after it was last refused.
pub const REFUSED_TIMEOUT: Duration = Duration::from_secs(3600);
/// The regular chain every refusing rule of a counting table jumps to.
pub const REFUSE_CHAIN: &str = "refuse";
/// The base chain of `lazaret-filter` that counts what the routes refuse.
pub const ROUTES_CHAIN: &str = "refused-routes";

/// The set of one family.
pub fn refused_set_name(v4: bool) -> &'static str {
    if v4 { "refused4" } else { "refused6" }
}

/// What a table counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counting {
    /// Nothing (the host's table).
    Off,
    /// What its own rules reject.
    Rejects,
    /// What its rules reject and what the routes refuse.
    RejectsAndRoutes,
}

// nf_tables numbers (linux/netfilter/nf_tables.h) that only this module uses.
const RTN_LOCAL: u32 = 2;
const CT_ESTABLISHED: u32 = 2;
const CT_RELATED: u32 = 4;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const NFPROTO_IPV4: u8 = codec::NFPROTO_IPV4;
const NFPROTO_IPV6: u8 = codec::NFPROTO_IPV6;
/// nft's set flags `dynamic` (`NFT_SET_EVAL`) and `timeout`.
pub(crate) const NFT_SET_TIMEOUT: u32 = codec::NFT_SET_TIMEOUT;
pub(crate) const NFT_SET_EVAL: u32 = codec::NFT_SET_EVAL;
/// nft's key types of `ipv4_addr . inet_proto . inet_service` and the IPv6 twin.
pub(crate) const KEY_TYPE_V4: u32 = 7 << 12 | 12 << 6 | 13;
pub(crate) const KEY_TYPE_V6: u32 = 8 << 12 | 12 << 6 | 13;

/// Key length: the address, then protocol and port, each in a 4-byte register.
pub(crate) fn key_len(v4: bool) -> u32 {
    if v4 { 12 } else { 24 }
}

fn meta(key: u32, dreg: u32) -> Expr {
    Expr::Meta { key, dreg }
}

fn cmp(op: u32, value: &[u8]) -> Expr {
    Expr::Cmp { op, value: value.to_vec() }
}

fn payload(base: u32, offset: u32, len: u32, dreg: u32) -> Expr {
    Expr::Payload { base, offset, len, dreg }
}

fn fib(result: u32) -> Expr {
    Expr::Fib { result, flags: NFTA_FIB_F_DADDR }
}

/// One rule: its nft reading and its expressions.
#[derive(Debug, Clone)]
pub(crate) struct RawRule {
    pub chain: &'static str,
    pub text: String,
    pub expressions: Vec<Expr>,
}

/// One chain: base (prerouting) or regular, with its rules.
#[derive(Debug, Clone)]
pub(crate) struct RawChain {
    pub name: &'static str,
    pub prerouting: bool,
    pub rules: Vec<RawRule>,
}

/// The key loads and the set update of one family and protocol class
/// (`Some(p)`: TCP or UDP, with the port; `None`: any other protocol, port 0).
fn count(v4: bool, protocol: Option<u8>) -> (Vec<Expr>, String) {
    let (offset, len) = if v4 { (16, 4) } else { (24, 16) };
    // The 4-byte registers after the address: 9 and 10 (IPv4), 12 and 13
    // (IPv6), except that the kernel names a register that starts a 16-byte
    // one by the 16-byte name (12 is NFT_REG_2), and the read-back compares
    // what it dumps.
    let port_register = NFT_REG32_00 + len / 4 + 1;
    let proto_register = if v4 { port_register - 1 } else { NFT_REG_2 };
    let mut out = vec![payload(NFT_PAYLOAD_NETWORK_HEADER, offset, len, NFT_REG_1), meta(NFT_META_L4PROTO, proto_register)];
    let family = if v4 { "ip" } else { "ip6" };
    let set = refused_set_name(v4);
    let text = match protocol {
        Some(_) => {
            out.push(payload(NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2, port_register));
            format!("update @{set} {{ {family} daddr . meta l4proto . th dport }}")
        }
        None => {
            out.push(Expr::Immediate { dreg: port_register, value: vec![0; 4] });
            format!("update @{set} {{ {family} daddr . meta l4proto . 0 }}")
        }
    };
    out.push(Expr::Dynset { set: set.to_string(), op: NFT_DYNSET_OP_UPDATE, sreg: NFT_REG_1 });
    (out, text)
}

/// `meta nfproto F` and the protocol class's match.
fn family_and_protocol(v4: bool, protocol: Option<u8>) -> (Vec<Expr>, String) {
    let mut out = vec![
        meta(NFT_META_NFPROTO, NFT_REG_1),
        cmp(NFT_CMP_EQ, &[if v4 { NFPROTO_IPV4 } else { NFPROTO_IPV6 }]),
        meta(NFT_META_L4PROTO, NFT_REG_1),
    ];
    let mut text = format!("meta nfproto {} ", if v4 { "ipv4" } else { "ipv6" });
    match protocol {
        Some(p) => {
            out.push(cmp(NFT_CMP_EQ, &[p]));
            text.push_str(&format!("meta l4proto {} ", if p == IPPROTO_TCP { "tcp" } else { "udp" }));
        }
        None => {
            out.push(cmp(NFT_CMP_NEQ, &[IPPROTO_TCP]));
            out.push(cmp(NFT_CMP_NEQ, &[IPPROTO_UDP]));
            text.push_str("meta l4proto != tcp meta l4proto != udp ");
        }
    }
    (out, text)
}

const CLASSES: [Option<u8>; 3] = [Some(IPPROTO_TCP), Some(IPPROTO_UDP), None];

/// The `refuse` chain: count, then reject.
fn refuse_chain() -> RawChain {
    let mut rules = Vec::new();
    for v4 in [true, false] {
        for protocol in CLASSES {
            let (mut expressions, mut text) = family_and_protocol(v4, protocol);
            let (update, update_text) = count(v4, protocol);
            expressions.extend(update);
            text.push_str(&update_text);
            rules.push(RawRule { chain: REFUSE_CHAIN, text, expressions });
        }
    }
    let reject = Expr::Reject { kind: NFT_REJECT_ICMPX_UNREACH, code: NFT_REJECT_ICMPX_HOST_UNREACH };
    rules.push(RawRule { chain: REFUSE_CHAIN, text: "reject with icmpx host-unreachable".into(), expressions: vec![reject] });
    RawChain { name: REFUSE_CHAIN, prerouting: false, rules }
}

/// The `refused-routes` chain: count what the routes will refuse.
fn routes_chain() -> RawChain {
    let mut name = [0u8; 16];
    name[..SIDECAR_INNER_LINK.len()].copy_from_slice(SIDECAR_INNER_LINK.as_bytes());
    let mut rules = Vec::new();
    for v4 in [true, false] {
        for protocol in CLASSES {
            let mut expressions = vec![meta(NFT_META_IIFNAME, NFT_REG_1), cmp(NFT_CMP_EQ, &name)];
            let (matches, matches_text) = family_and_protocol(v4, protocol);
            expressions.extend(matches);
            expressions.extend([
                Expr::Ct { key: NFT_CT_STATE },
                cmp(NFT_CMP_NEQ, &CT_ESTABLISHED.to_ne_bytes()),
                cmp(NFT_CMP_NEQ, &CT_RELATED.to_ne_bytes()),
                fib(NFT_FIB_RESULT_OIF),
                cmp(NFT_CMP_EQ, &0u32.to_ne_bytes()),
                fib(NFT_FIB_RESULT_ADDRTYPE),
                cmp(NFT_CMP_NEQ, &RTN_LOCAL.to_ne_bytes()),
            ]);
            let (update, update_text) = count(v4, protocol);
            expressions.extend(update);
            let text = format!(
                "iifname \"{SIDECAR_INNER_LINK}\" {matches_text}ct state != established ct state != related fib daddr oif 0 fib daddr type != local {update_text}"
            );
            rules.push(RawRule { chain: ROUTES_CHAIN, text, expressions });
        }
    }
    RawChain { name: ROUTES_CHAIN, prerouting: true, rules }
}

/// The chains a table with `counting` has besides its own.
pub(crate) fn chains(counting: Counting) -> Vec<RawChain> {
    match counting {
        Counting::Off => Vec::new(),
        Counting::Rejects => vec![refuse_chain()],
        Counting::RejectsAndRoutes => vec![refuse_chain(), routes_chain()],
    }
}

/// The `NFT_MSG_NEWCHAIN` attributes of `chain` in `table`.
pub(crate) fn chain_payload(table: &str, chain: &RawChain) -> Vec<u8> {
    let base = chain.prerouting.then_some(BaseChain { hook: NF_INET_PRE_ROUTING, priority: 0, kind: "filter" });
    codec::chain(table, chain.name, base)
}

/// The `NFT_MSG_NEWRULE` attributes of `rule` in `table` (no comment).
pub(crate) fn rule_payload(table: &str, rule: &RawRule) -> Vec<u8> {
    codec::rule(table, rule.chain, &rule.expressions)
}

/// The `NFT_MSG_NEWSET` attributes of a counting set.
pub(crate) fn set_payload(table: &str, v4: bool, id: u32) -> Vec<u8> {
    codec::set(&SetDesc {
        table,
        name: refused_set_name(v4),
        flags: NFT_SET_TIMEOUT | NFT_SET_EVAL,
        key_type: if v4 { KEY_TYPE_V4 } else { KEY_TYPE_V6 },
        key_len: key_len(v4),
        id,
        size: Some(REFUSED_SET_SIZE),
        timeout_ms: Some(u64::try_from(REFUSED_TIMEOUT.as_millis()).unwrap_or(u64::MAX)),
        counter: true,
    })
}

/// One destination the sidecar refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedDestination {
    /// Where the sandbox tried to go.
    pub address: IpAddr,
    /// The IP protocol number (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6, ...).
    pub protocol: u8,
    /// The destination port (TCP and UDP only).
    pub port: Option<u16>,
    /// Packets refused (every connection attempt and retry, every datagram).
    pub packets: u64,
    /// How long ago the last one was refused.
    pub last_ago: Duration,
}

impl RefusedDestination {
    /// `tcp`, `udp`, `icmp`, ... or the protocol number.
    pub fn protocol_name(&self) -> String {
        match self.protocol {
            1 => "icmp".into(),
            6 => "tcp".into(),
            17 => "udp".into(),
            58 => "icmpv6".into(),
            132 => "sctp".into(),
            other => other.to_string(),
        }
    }
}

/// A set element's key (`address . protocol . port`) as the kernel dumps it.
pub(crate) fn parse_key(key: &[u8]) -> Option<(IpAddr, u8, Option<u16>)> {
    let (address, rest) = match key.len() {
        12 => (IpAddr::from(<[u8; 4]>::try_from(&key[..4]).ok()?), &key[4..]),
        24 => (IpAddr::from(<[u8; 16]>::try_from(&key[..16]).ok()?), &key[16..]),
        _ => return None,
    };
    let protocol = rest[0];
    let port = u16::from_be_bytes([rest[4], rest[5]]);
    let port = (protocol == IPPROTO_TCP || protocol == IPPROTO_UDP || protocol == 132).then_some(port);
    Some((address, protocol, port))
}

/// Merges the elements of several sets (same destination: packets added,
/// the most recent time kept) and orders them most refused first.
pub fn merge(found: Vec<RefusedDestination>) -> Vec<RefusedDestination> {
    let mut merged: Vec<RefusedDestination> = Vec::new();
    for item in found {
        match merged.iter_mut().find(|m| (m.address, m.protocol, m.port) == (item.address, item.protocol, item.port)) {
            Some(m) => {
                m.packets += item.packets;
                m.last_ago = m.last_ago.min(item.last_ago);
            }
            None => merged.push(item),
        }
    }
    merged.sort_by(|a, b| b.packets.cmp(&a.packets).then(a.last_ago.cmp(&b.last_ago)).then(a.address.cmp(&b.address)));
    merged
}

/// The packets of the `counter` among an element's expressions
/// (`NFTA_SET_ELEM_EXPR`: one expression; `NFTA_SET_ELEM_EXPRESSIONS`: a list).
fn counter_packets(element: &[u8]) -> Option<u64> {
    let counter = |expression: &[u8]| -> Option<u64> {
        let name = find(expression, 1)?;
        if name.split(|b| *b == 0).next() != Some(b"counter".as_slice()) {
            return None;
        }
        let packets = find(find(expression, 2)?, 2)?;
        be64_value(packets)
    };
    if let Some(found) = find(element, 7).and_then(counter) {
        return Some(found);
    }
    attributes(find(element, 11)?)?.into_iter().find_map(|(_, expression)| counter(expression))
}

/// The destinations in the counting sets of table `inet TABLE` (calling
/// thread's namespace).
pub(crate) fn read_table(table: &str) -> Result<Vec<RefusedDestination>, TopologyError> {
    let mut found = Vec::new();
    for v4 in [true, false] {
        let set = refused_set_name(v4);
        let payload = codec::set_element(table, set, None, None);
        let messages = codec::dump(NFT_MSG_GETSETELEM, NFPROTO_INET, &payload)
            .map_err(|source| TopologyError::Io { action: format!("nftables: dump set {set} of inet {table}"), source })?;
        for message in messages.iter().filter(|m| m.kind == NFT_MSG_NEWSETELEM) {
            let Some(list) = find(&message.attributes, 3) else { continue };
            for (_, element) in attributes(list).unwrap_or_default() {
                let Some((address, protocol, port)) = find(element, 1).and_then(|k| find(k, 1)).and_then(parse_key) else { continue };
                let millis = |kind| find(element, kind).and_then(be64_value);
                let timeout = millis(4).map_or(REFUSED_TIMEOUT, Duration::from_millis);
                let expires = millis(5).map_or(timeout, Duration::from_millis);
                found.push(RefusedDestination {
                    address,
                    protocol,
                    port,
                    packets: counter_packets(element).unwrap_or(0),
                    last_ago: timeout.saturating_sub(expires),
                });
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_read_like_nft() {
        let refuse = refuse_chain();
        assert_eq!(refuse.rules.len(), 7);
        assert_eq!(refuse.rules[0].text, "meta nfproto ipv4 meta l4proto tcp update @refused4 { ip daddr . meta l4proto . th dport }");
        assert_eq!(
            refuse.rules[5].text,
            "meta nfproto ipv6 meta l4proto != tcp meta l4proto != udp update @refused6 { ip6 daddr . meta l4proto . 0 }"
        );
        assert_eq!(refuse.rules[6].text, "reject with icmpx host-unreachable");
        let routes = routes_chain();
        assert!(routes.prerouting && routes.rules.len() == 6);
        assert!(
            routes.rules[1].text.starts_with("iifname \"lzs0\" meta nfproto ipv4 meta l4proto udp ct state != established"),
            "{}",
            routes.rules[1].text
        );
        assert!(chains(Counting::Off).is_empty());
        // Every rule is a well-formed attribute list whose expressions are named.
        for rule in refuse.rules.iter().chain(&routes.rules) {
            let encoded = codec::expressions(&rule.expressions);
            let list = attributes(&encoded).expect("expressions");
            assert!(list.iter().all(|(kind, _)| *kind == 1), "NFTA_LIST_ELEM");
            let last = attributes(list.last().expect("one").1).expect("expression");
            let name = String::from_utf8_lossy(last[0].1);
            assert!(name.starts_with("dynset") || name.starts_with("reject"), "{name}");
        }
    }

    /// The same bytes as the raw encoder that came before `nftcodec`
    /// (`meta` and `ct` attributes key first, see `counting_chains_fixture`).
    #[test]
    fn counting_chains_match_the_raw_encoder() {
        use crate::topology::nftcodec::testing::{assert_same, counting_chains_fixture};
        use crate::topology::nftcodec::{Batch, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE, NLM_F_APPEND, NLM_F_CREATE};
        let mut batch = Batch::new();
        for chain in chains(Counting::RejectsAndRoutes) {
            batch.add(NFT_MSG_NEWCHAIN, NLM_F_CREATE, NFPROTO_INET, &chain_payload("lazaret-filter", &chain));
            for rule in &chain.rules {
                batch.add(NFT_MSG_NEWRULE, NLM_F_CREATE | NLM_F_APPEND, NFPROTO_INET, &rule_payload("lazaret-filter", rule));
            }
        }
        assert_same(&batch.finish().bytes, &counting_chains_fixture(), "counting chains");
    }

    #[test]
    fn keys_parse_with_and_without_ports() {
        let mut v4 = vec![192, 0, 2, 7, 6, 0, 0, 0, 0, 80, 0, 0];
        assert_eq!(parse_key(&v4), Some(("192.0.2.7".parse().expect("ip"), 6, Some(80))));
        v4[4] = 1;
        assert_eq!(parse_key(&v4), Some(("192.0.2.7".parse().expect("ip"), 1, None)));
        let mut v6 = vec![0u8; 24];
        v6[0] = 0x20;
        v6[1] = 0x01;
        v6[16] = 17;
        v6[20..22].copy_from_slice(&53u16.to_be_bytes());
        assert_eq!(parse_key(&v6), Some(("2001::".parse().expect("ip"), 17, Some(53))));
        assert_eq!(parse_key(&[1, 2, 3]), None);
    }

    #[test]
    fn merge_adds_counts_and_orders_by_count() {
        let item = |address: &str, packets, secs| RefusedDestination {
            address: address.parse().expect("ip"),
            protocol: 6,
            port: Some(443),
            packets,
            last_ago: Duration::from_secs(secs),
        };
        let merged = merge(vec![item("192.0.2.1", 1, 50), item("192.0.2.2", 3, 9), item("192.0.2.1", 4, 5)]);
        assert_eq!(merged, vec![item("192.0.2.1", 5, 5), item("192.0.2.2", 3, 9)]);
    }
}
