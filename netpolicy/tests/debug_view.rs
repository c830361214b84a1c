//! Privileged tests of `topology::debug_view`, the `ip`-like dump behind
//! `lazaret debug`. Each test builds its own "host" network namespace (and a
//! fake internet behind it); nothing is created in the machine's real network
//! namespace, and every namespace vanishes with its descriptor. They fail
//! (never skip) without root.

mod support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lazaret_netpolicy::policy::{PolicyInput, parse_prefixes};
use lazaret_netpolicy::topology::{DomainNetwork, TopologyConfig, debug_view};
use rtnetlink::RouteMessageBuilder;
use rtnetlink::packet_route::route::RouteType;
use rtnetlink::packet_route::rule::RuleAction;
use support::*;

/// The line of `view` that contains `needle`, or a failure showing the view.
fn line_with<'a>(view: &'a str, needle: &str) -> &'a str {
    view.lines().find(|line| line.contains(needle)).unwrap_or_else(|| panic!("no line with {needle:?} in the debug view:\n{view}"))
}

/// The lines of `name`'s entry in the links section: its header line and
/// the indented lines under it (link layer, addresses).
fn link_block(view: &str, name: &str) -> String {
    let mut lines = view.lines().skip_while(|line| !line.starts_with("  ") || !line.contains(&format!(": {name}")));
    let header = lines.next().unwrap_or_else(|| panic!("no link {name} in the debug view:\n{view}"));
    std::iter::once(header).chain(lines.take_while(|line| line.starts_with("      "))).collect::<Vec<_>>().join("\n")
}

#[test]
fn shows_links_addresses_routes_of_every_table_and_rules_of_both_families() {
    let net = FakeInternet::with_ipv6();
    // Known extras in table 100 and two policy rules, one per family.
    net.host
        .netlink(async |handle| {
            let unreachable = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(Ipv4Addr::new(203, 0, 113, 0), 24)
                .table_id(100)
                .kind(RouteType::Unreachable)
                .build();
            handle.route().add(unreachable).execute().await.map_err(nl("add unreachable route"))?;
            let blackhole = RouteMessageBuilder::<Ipv6Addr>::new()
                .destination_prefix(Ipv6Addr::new(0x2001, 0xdb8, 0xdead, 0, 0, 0, 0, 0), 48)
                .table_id(100)
                .kind(RouteType::BlackHole)
                .build();
            handle.route().add(blackhole).execute().await.map_err(nl("add blackhole route"))?;
            handle
                .rule()
                .add()
                .v4()
                .source_prefix(Ipv4Addr::new(198, 51, 100, 0), 24)
                .table_id(100)
                .priority(1234)
                .action(RuleAction::ToTable)
                .execute()
                .await
                .map_err(nl("add IPv4 rule"))?;
            handle
                .rule()
                .add()
                .v6()
                .destination_prefix(Ipv6Addr::new(0x2001, 0xdb8, 0xdead, 0, 0, 0, 0, 0), 48)
                .priority(1235)
                .action(RuleAction::Unreachable)
                .execute()
                .await
                .map_err(nl("add IPv6 rule"))
        })
        .expect("add the known routes and rules");

    let view = debug_view(&net.host).unwrap_or_else(|error| panic!("debug view of the test host failed: {error}"));

    // Links with flags and state, each followed by its addresses.
    let lo = line_with(&view, ": lo: <");
    assert!(lo.contains("LOOPBACK") && lo.contains("UP") && lo.contains(" state "), "{lo}");
    let wan = line_with(&view, ": wan0@if");
    assert!(wan.contains(",UP") && wan.contains(" mtu 1500 state "), "{wan}");
    assert!(view.contains(" veth link-netnsid "), "no veth details:\n{view}");
    let wan_block = link_block(&view, "wan0");
    assert!(wan_block.contains("inet 192.0.2.1/24 scope global"), "wan0 lacks its IPv4 address:\n{wan_block}");
    assert!(wan_block.contains(&format!("inet6 {}/64 scope global", support::HOST_WAN6)), "wan0 lacks its IPv6 address:\n{wan_block}");
    assert!(view.contains("inet 127.0.0.1/8 scope host"), "{view}");
    assert!(view.contains("inet6 ::1/128 scope host"), "{view}");

    // Routes of every table: main, local and 100, both families.
    assert!(view.contains("\n  default via 192.0.2.2 dev wan0 table main proto static"), "{view}");
    assert!(view.contains(&format!("\n  default via {} dev wan0 table main proto static", support::WORLD_WAN6)), "{view}");
    assert!(view.contains("\n  192.0.2.0/24 dev wan0 table main proto kernel scope link src 192.0.2.1"), "{view}");
    assert!(view.contains("\n  unreachable 203.0.113.0/24 table 100 proto static"), "{view}");
    // (The kernel puts IPv6 reject routes on `lo`.)
    let blackhole_route = line_with(&view, "  blackhole 2001:db8:dead::/48 ");
    assert!(blackhole_route.contains(" table 100 proto static"), "{blackhole_route}");
    assert!(view.contains("\n  local 192.0.2.1 dev wan0 table local proto kernel scope host src 192.0.2.1"), "{view}");
    let v4_routes = view.find("IPv4 routes (all tables):").expect("IPv4 section");
    let v6_routes = view.find("IPv6 routes (all tables):").expect("IPv6 section");
    let v4_rules = view.find("IPv4 rules:").expect("IPv4 rules section");
    let v6_rules = view.find("IPv6 rules:").expect("IPv6 rules section");
    assert!(v4_routes < v6_routes && v6_routes < v4_rules && v4_rules < v6_rules, "sections out of order:\n{view}");
    let unreachable = view.find("unreachable 203.0.113.0/24").expect("unreachable route");
    let blackhole = view.find("blackhole 2001:db8:dead::/48").expect("blackhole route");
    assert!((v4_routes..v6_routes).contains(&unreachable), "IPv4 route outside its section:\n{view}");
    assert!((v6_routes..v4_rules).contains(&blackhole), "IPv6 route outside its section:\n{view}");

    // Policy rules, the kernel's and ours, each in its family.
    let v4_rule_text = &view[v4_rules..v6_rules];
    let v6_rule_text = &view[v6_rules..];
    assert!(v4_rule_text.contains("\n  0: from all lookup local"), "{v4_rule_text}");
    assert!(v4_rule_text.contains("\n  1234: from 198.51.100.0/24 lookup 100"), "{v4_rule_text}");
    assert!(v4_rule_text.contains("\n  32766: from all lookup main"), "{v4_rule_text}");
    assert!(v6_rule_text.contains("\n  1235: from all to 2001:db8:dead::/48 unreachable"), "{v6_rule_text}");
    assert!(v6_rule_text.contains("\n  32766: from all lookup main"), "{v6_rule_text}");
    assert!(!v6_rule_text.contains("1234:"), "IPv4 rule among the IPv6 ones:\n{v6_rule_text}");
}

#[test]
fn shows_a_domain_sidecar_and_sandbox_as_built() {
    let net = FakeInternet::new();
    let input = PolicyInput {
        allow: parse_prefixes(&[("10.222.0.0/16", "test.toml:1:1")]).expect("prefix"),
        dns: vec![IpAddr::V4(RESOLVER)],
        ..PolicyInput::default()
    };
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &input)
        .unwrap_or_else(|error| panic!("building the Domain network failed: {error}"));
    let addresses = domain.addresses();

    let sidecar = debug_view(domain.sidecar_netns().expect("sidecar")).expect("debug view of the sidecar");
    assert!(sidecar.contains("\n  unreachable 10.0.0.0/8 table main proto static"), "{sidecar}");
    assert!(
        sidecar.contains(&format!("\n  10.222.0.0/16 via {} dev lzup0 table main proto static onlink", addresses.host_uplink)),
        "{sidecar}"
    );
    assert!(sidecar.contains(&format!("\n  unreachable {} table 200 proto static", addresses.sidecar_inner)), "{sidecar}");
    assert!(sidecar.contains("\n  throw default table 200 proto static"), "{sidecar}");
    let rules = &sidecar[sidecar.find("IPv4 rules:").expect("IPv4 rules")..sidecar.find("IPv6 rules:").expect("IPv6 rules")];
    assert!(rules.contains("\n  500: from all iif lzs0 ipproto icmp lookup 200"), "{rules}");
    assert!(rules.contains("\n  500: from all iif lzs0 ipproto tcp lookup 200"), "{rules}");
    assert!(rules.contains("\n  1000: from all lookup local"), "{rules}");
    assert!(!rules.contains("\n  0: from all lookup local"), "the kernel's first local rule is still there:\n{rules}");
    assert!(sidecar.contains(&format!("inet {}/31 scope global", addresses.sidecar_inner)), "{sidecar}");
    line_with(&sidecar, ": lzs0@if");
    line_with(&sidecar, ": lzup0@if");

    let sandbox = debug_view(domain.sandbox_netns().expect("sandbox")).expect("debug view of the sandbox");
    assert!(sandbox.contains(&format!("\n  default via {} dev eth0 table main proto static", addresses.sidecar_inner)), "{sandbox}");
    assert!(sandbox.contains(&format!("inet {}/31 scope global", addresses.sandbox)), "{sandbox}");
    domain.teardown().expect("teardown");
}
