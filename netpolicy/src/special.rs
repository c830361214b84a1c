//! The address blocks that are not globally reachable, from the IANA
//! special-purpose address registries: the policy's default denials.
//!
//! Transcribed from `iana-ipv4-special-registry` and
//! `iana-ipv6-special-registry` (RFC 6890, RFC 8190) as of their 2025-10-09
//! versions, plus the multicast blocks (IPv4 multicast registry, IPv6
//! address-space registry) and IPv6's deprecated site-local block, which
//! those two registries do not list. Every row the registries mark
//! "Globally Reachable: False" is here, and so is every row they mark
//! "N/A" whose addresses tunnel to embedded IPv4 addresses (Teredo, 6to4)
//! or whose registration was terminated (192.88.99.0/24).
//!
//! Rows marked globally reachable matter only where they sit inside a
//! denied block (192.0.0.9/32 inside 192.0.0.0/24, the 2001::/23
//! exceptions): such a row is not a default allow of its own but inherits
//! whatever the policy decides outside the special-purpose blocks, so a
//! `deny_egress = ["0.0.0.0/0"]` allow-list still covers it (see
//! [`crate::policy`]).

use std::fmt;

use crate::prefix::Prefix;

/// Which IANA registry a row comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Registry {
    /// `iana-ipv4-special-registry`.
    Ipv4Special,
    /// `iana-ipv6-special-registry`.
    Ipv6Special,
    /// `multicast-addresses` (IPv4 multicast address space).
    Ipv4Multicast,
    /// `ipv6-address-space` (multicast, deprecated site-local).
    Ipv6AddressSpace,
}

impl fmt::Display for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Registry::Ipv4Special | Registry::Ipv6Special => "IANA special-purpose",
            Registry::Ipv4Multicast => "IANA IPv4 multicast",
            Registry::Ipv6AddressSpace => "IANA IPv6 address space",
        })
    }
}

/// One registry row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct SpecialBlock {
    /// The address block, as the registry writes it.
    pub block: &'static str,
    /// The RFC that defines it (the first the registry names).
    pub rfc: &'static str,
    /// What it is.
    pub name: &'static str,
    /// The registry's "Globally Reachable" column (N/A counts as false).
    pub globally_reachable: bool,
    /// Where the row comes from.
    pub registry: Registry,
}

impl SpecialBlock {
    /// The block as a prefix (every row parses: see the tests).
    pub fn prefix(&self) -> Option<Prefix> {
        self.block.parse().ok()
    }
}

const fn row(block: &'static str, rfc: &'static str, name: &'static str, globally_reachable: bool, registry: Registry) -> SpecialBlock {
    SpecialBlock { block, rfc, name, globally_reachable, registry }
}

const V4: Registry = Registry::Ipv4Special;
const V6: Registry = Registry::Ipv6Special;
const DENY: bool = false;
const REACHABLE: bool = true;

/// The table. Nested rows (0.0.0.0/32 in 0.0.0.0/8, Teredo in 2001::/23)
/// change nothing that their enclosing row does not already decide; they
/// are listed so the table reads like the registries.
pub const SPECIAL_BLOCKS: &[SpecialBlock] = &[
    // iana-ipv4-special-registry
    row("0.0.0.0/8", "RFC 791", "\"this network\"", DENY, V4),
    row("0.0.0.0/32", "RFC 1122", "\"this host on this network\"", DENY, V4),
    row("10.0.0.0/8", "RFC 1918", "private-use", DENY, V4),
    row("100.64.0.0/10", "RFC 6598", "shared address space: carrier-grade NAT, Tailscale", DENY, V4),
    row("127.0.0.0/8", "RFC 1122", "loopback", DENY, V4),
    row("169.254.0.0/16", "RFC 3927", "link local, cloud metadata", DENY, V4),
    row("172.16.0.0/12", "RFC 1918", "private-use", DENY, V4),
    row("192.0.0.0/24", "RFC 6890", "IETF protocol assignments", DENY, V4),
    row("192.0.0.0/29", "RFC 7335", "IPv4 service continuity prefix", DENY, V4),
    row("192.0.0.8/32", "RFC 7600", "IPv4 dummy address", DENY, V4),
    row("192.0.0.9/32", "RFC 7723", "Port Control Protocol anycast", REACHABLE, V4),
    row("192.0.0.10/32", "RFC 8155", "TURN anycast", REACHABLE, V4),
    row("192.0.0.170/32", "RFC 8880", "NAT64/DNS64 discovery", DENY, V4),
    row("192.0.0.171/32", "RFC 8880", "NAT64/DNS64 discovery", DENY, V4),
    row("192.0.2.0/24", "RFC 5737", "documentation TEST-NET-1", DENY, V4),
    row("192.31.196.0/24", "RFC 7535", "AS112-v4", REACHABLE, V4),
    row("192.52.193.0/24", "RFC 7450", "AMT", REACHABLE, V4),
    row("192.88.99.0/24", "RFC 7526", "deprecated 6to4 relay anycast, registration terminated", DENY, V4),
    row("192.88.99.2/32", "RFC 6751", "6a44-relay anycast", DENY, V4),
    row("192.168.0.0/16", "RFC 1918", "private-use", DENY, V4),
    row("192.175.48.0/24", "RFC 7534", "direct delegation AS112 service", REACHABLE, V4),
    row("198.18.0.0/15", "RFC 2544", "benchmarking", DENY, V4),
    row("198.51.100.0/24", "RFC 5737", "documentation TEST-NET-2", DENY, V4),
    row("203.0.113.0/24", "RFC 5737", "documentation TEST-NET-3", DENY, V4),
    row("240.0.0.0/4", "RFC 1112", "reserved", DENY, V4),
    row("255.255.255.255/32", "RFC 8190", "limited broadcast", DENY, V4),
    // IPv4 multicast address space registry
    row("224.0.0.0/4", "RFC 5771", "multicast", DENY, Registry::Ipv4Multicast),
    // iana-ipv6-special-registry
    row("::1/128", "RFC 4291", "loopback", DENY, V6),
    row("::/128", "RFC 4291", "unspecified", DENY, V6),
    row("::ffff:0:0/96", "RFC 4291", "IPv4-mapped", DENY, V6),
    row("64:ff9b::/96", "RFC 6052", "IPv4-IPv6 translation, well-known NAT64 prefix", REACHABLE, V6),
    row("64:ff9b:1::/48", "RFC 8215", "local-use IPv4-IPv6 translation", DENY, V6),
    row("100::/64", "RFC 6666", "discard-only", DENY, V6),
    row("100:0:0:1::/64", "RFC 9780", "dummy IPv6 prefix", DENY, V6),
    row("2001::/23", "RFC 2928", "IETF protocol assignments", DENY, V6),
    row("2001::/32", "RFC 4380", "Teredo, tunnels to IPv4 (registry: N/A)", DENY, V6),
    row("2001:1::1/128", "RFC 7723", "Port Control Protocol anycast", REACHABLE, V6),
    row("2001:1::2/128", "RFC 8155", "TURN anycast", REACHABLE, V6),
    row("2001:1::3/128", "RFC 9665", "DNS-SD service registration protocol anycast", REACHABLE, V6),
    row("2001:2::/48", "RFC 5180", "benchmarking", DENY, V6),
    row("2001:3::/32", "RFC 7450", "AMT", REACHABLE, V6),
    row("2001:4:112::/48", "RFC 7535", "AS112-v6", REACHABLE, V6),
    row("2001:10::/28", "RFC 4843", "deprecated (previously ORCHID)", DENY, V6),
    row("2001:20::/28", "RFC 7343", "ORCHIDv2", REACHABLE, V6),
    row("2001:30::/28", "RFC 9374", "drone remote ID protocol entity tags", REACHABLE, V6),
    row("2001:db8::/32", "RFC 3849", "documentation", DENY, V6),
    row("2002::/16", "RFC 3056", "6to4, tunnels to IPv4 (registry: N/A)", DENY, V6),
    row("2620:4f:8000::/48", "RFC 7534", "direct delegation AS112 service", REACHABLE, V6),
    row("3fff::/20", "RFC 9637", "documentation", DENY, V6),
    row("5f00::/16", "RFC 9602", "segment routing SRv6 SIDs", DENY, V6),
    row("fc00::/7", "RFC 4193", "unique local, ULA", DENY, V6),
    row("fe80::/10", "RFC 4291", "link-local unicast", DENY, V6),
    // IPv6 address space registry
    row("fec0::/10", "RFC 3879", "deprecated site-local", DENY, Registry::Ipv6AddressSpace),
    row("ff00::/8", "RFC 4291", "multicast", DENY, Registry::Ipv6AddressSpace),
];

/// The well-known NAT64 prefix (RFC 6052): globally reachable itself, but
/// an address in it names an IPv4 destination, so each denied IPv4 block
/// is denied inside it too.
pub const NAT64_PREFIX: &str = "64:ff9b::/96";

/// The denied rows of one family that no other denied row contains: the
/// ones the policy needs (a nested denied row would only shadow a config
/// allow of its enclosing block).
pub fn outermost_denied(v4: bool) -> Vec<(Prefix, &'static SpecialBlock)> {
    let denied: Vec<(Prefix, &'static SpecialBlock)> = SPECIAL_BLOCKS
        .iter()
        .filter(|block| !block.globally_reachable)
        .filter_map(|block| Some((block.prefix()?, block)))
        .filter(|(prefix, _)| prefix.is_v4() == v4)
        .collect();
    denied.iter().filter(|(prefix, _)| !denied.iter().any(|(other, _)| other != prefix && other.covers(prefix))).copied().collect()
}

/// The globally reachable rows of one family that lie inside a denied row.
pub fn reachable_inside_denied(v4: bool) -> Vec<(Prefix, &'static SpecialBlock)> {
    let denied = outermost_denied(v4);
    SPECIAL_BLOCKS
        .iter()
        .filter(|block| block.globally_reachable)
        .filter_map(|block| Some((block.prefix()?, block)))
        .filter(|(prefix, _)| prefix.is_v4() == v4 && denied.iter().any(|(outer, _)| outer.covers(prefix)))
        .collect()
}

/// `prefix` (IPv4) inside the well-known NAT64 prefix: `64:ff9b::a.b.c.d/(96+len)`.
pub fn nat64(prefix: &Prefix) -> Option<Prefix> {
    let std::net::IpAddr::V4(network) = prefix.network() else { return None };
    let base: Prefix = NAT64_PREFIX.parse().ok()?;
    let std::net::IpAddr::V6(base) = base.network() else { return None };
    let embedded = std::net::Ipv6Addr::from_bits(base.to_bits() | u128::from(network.to_bits()));
    Prefix::new(std::net::IpAddr::V6(embedded), 96 + prefix.prefix_len()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Prefix {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn every_row_parses_without_host_bits_and_names_an_rfc() {
        for block in SPECIAL_BLOCKS {
            assert!(block.prefix().is_some(), "{} does not parse", block.block);
            assert!(block.rfc.starts_with("RFC ") && block.rfc[4..].parse::<u32>().is_ok(), "{}: {}", block.block, block.rfc);
            let v4 = block.prefix().is_some_and(|p| p.is_v4());
            let registry_family = matches!(block.registry, Registry::Ipv4Special | Registry::Ipv4Multicast);
            assert_eq!(v4, registry_family, "{} is in the wrong registry", block.block);
        }
        let mut seen: Vec<&str> = SPECIAL_BLOCKS.iter().map(|b| b.block).collect();
        seen.sort();
        let total = seen.len();
        seen.dedup();
        assert_eq!(seen.len(), total, "a block is listed twice");
    }

    #[test]
    fn the_required_blocks_are_denied() {
        let denied4: Vec<Prefix> = outermost_denied(true).into_iter().map(|(p, _)| p).collect();
        for block in [
            "0.0.0.0/8",
            "10.0.0.0/8",
            "100.64.0.0/10",
            "127.0.0.0/8",
            "169.254.0.0/16",
            "172.16.0.0/12",
            "192.0.0.0/24",
            "192.0.2.0/24",
            "192.168.0.0/16",
            "198.18.0.0/15",
            "198.51.100.0/24",
            "203.0.113.0/24",
            "224.0.0.0/4",
            "240.0.0.0/4",
        ] {
            assert!(denied4.contains(&p(block)), "{block} missing");
        }
        // Nested rows are left out: 255.255.255.255 lies in 240/4.
        assert!(!denied4.contains(&p("255.255.255.255/32")) && !denied4.contains(&p("0.0.0.0/32")));
        let denied6: Vec<Prefix> = outermost_denied(false).into_iter().map(|(p, _)| p).collect();
        for block in [
            "::/128",
            "::1/128",
            "::ffff:0:0/96",
            "64:ff9b:1::/48",
            "100::/64",
            "2001::/23",
            "2001:db8::/32",
            "2002::/16",
            "3fff::/20",
            "5f00::/16",
            "fc00::/7",
            "fe80::/10",
            "fec0::/10",
            "ff00::/8",
        ] {
            assert!(denied6.contains(&p(block)), "{block} missing");
        }
        assert!(!denied6.contains(&p("2001::/32")), "Teredo is inside 2001::/23");
        assert!(!denied6.iter().any(|d| d.covers(&p("64:ff9b::/96"))), "the NAT64 prefix is globally reachable");
        assert!(!denied6.iter().any(|d| d.covers(&p("2620:4f:8000::/48"))));
    }

    #[test]
    fn globally_reachable_exceptions_inside_denied_blocks() {
        let v4: Vec<Prefix> = reachable_inside_denied(true).into_iter().map(|(p, _)| p).collect();
        assert_eq!(v4, vec![p("192.0.0.9/32"), p("192.0.0.10/32")]);
        let v6: Vec<Prefix> = reachable_inside_denied(false).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            v6,
            ["2001:1::1/128", "2001:1::2/128", "2001:1::3/128", "2001:3::/32", "2001:4:112::/48", "2001:20::/28", "2001:30::/28"]
                .map(p)
                .to_vec()
        );
    }

    #[test]
    fn nat64_embeds_the_ipv4_block() {
        assert_eq!(nat64(&p("10.0.0.0/8")), Some(p("64:ff9b::a00:0/104")));
        assert_eq!(nat64(&p("169.254.0.0/16")), Some(p("64:ff9b::a9fe:0/112")));
        assert_eq!(nat64(&p("fc00::/7")), None);
    }
}
