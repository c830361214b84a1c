//! Privileged tests of the Domain topology. Each test builds its own "host"
//! network namespace and a fake internet behind it; nothing is created in the
//! machine's real network namespace. They fail (never skip) without root.

mod support;

use std::net::{IpAddr, Ipv4Addr};

use lazaret_netpolicy::policy::{Action, PolicyInput, RuleOrigin, parse_prefixes};
use lazaret_netpolicy::topology::{
    DomainNetwork, SidecarId, TopologyConfig, TopologyError, host_policy, nat_tables, remove_stale,
};
use rtnetlink::{LinkVeth, RouteMessageBuilder};
use support::*;

fn input() -> PolicyInput {
    PolicyInput {
        allow: parse_prefixes(&[("10.222.0.0/16", "test.toml:1:1")]).expect("prefix"),
        dns: vec![IpAddr::V4(RESOLVER)],
        ..PolicyInput::default()
    }
}

fn build(net: &FakeInternet) -> DomainNetwork {
    DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &input())
        .unwrap_or_else(|error| panic!("building the Domain network failed: {error}"))
}

#[test]
fn policy_is_enforced_from_the_sandbox() {
    let net = FakeInternet::new();
    let domain = build(&net);
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let transit = domain.addresses().host_uplink;
    let cases = [
        (PUBLIC, Reach::Connected, "public address"),
        (ALLOWED_PRIVATE, Reach::Connected, "explicitly allowed part of 10/8"),
        (RESOLVER, Reach::Connected, "DNS resolver inside 10/8"),
        (PRIVATE_10, Reach::HostUnreachable, "RFC 1918 10/8"),
        (PRIVATE_172, Reach::HostUnreachable, "RFC 1918 172.16/12"),
        (METADATA, Reach::HostUnreachable, "link-local metadata"),
        (HOST_WAN, Reach::HostUnreachable, "host address"),
        (transit, Reach::HostUnreachable, "host end of the Domain uplink"),
    ];
    let preview = host_policy(&net.host, &TopologyConfig::new(net.state_file()), &input()).expect("host policy");
    for (address, expected, what) in cases {
        assert_eq!(
            preview.decide(IpAddr::V4(address)).action,
            domain.policy().decide(IpAddr::V4(address)).action,
            "`policy show` preview agrees with the running Domain for {address}"
        );
        assert_eq!(connect_from(sandbox, address), expected, "{what} ({address})");
        let verdict = domain.policy().decide(IpAddr::V4(address));
        let expected_action = if expected == Reach::Connected { Action::Allow } else { Action::Deny };
        assert_eq!(verdict.action, expected_action, "compiled verdict for {address}: {verdict}");
    }
    assert_eq!(domain.policy().decide(IpAddr::V4(HOST_WAN)).rule.origin, RuleOrigin::HostAddress);
    assert_eq!(domain.policy().decide(IpAddr::V4(transit)).rule.origin, RuleOrigin::DomainTransit);
    domain.verify_installed().expect("read-back matches");
    // The world saw the three allowed connections, all from the host's address (SNAT).
    assert_eq!(net.world_peers(), vec![IpAddr::V4(HOST_WAN); 3]);
    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![domain.sidecar_id()]);
    domain.teardown().expect("teardown");
    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![]);
}

#[test]
fn teardown_leaves_nothing_and_restores_forwarding() {
    let net = FakeInternet::new();
    let before = net.host_snapshot();
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv4/conf/wan0/forwarding"), "0");

    let first = build(&net);
    let second = build(&net);
    assert_ne!(first.sidecar_id(), second.sidecar_id());
    assert_ne!(first.addresses().slot, second.addresses().slot);
    assert!(!first.addresses().slot.overlaps(&second.addresses().slot));
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv4/conf/wan0/forwarding"), "1");
    assert!(net.state_file().exists(), "original forwarding values recorded");
    // Each Domain's sandbox can reach the public server.
    assert_eq!(connect_from(first.sandbox_netns().expect("ns"), PUBLIC), Reach::Connected);
    assert_eq!(connect_from(second.sandbox_netns().expect("ns"), PUBLIC), Reach::Connected);
    // One Domain cannot reach the other's addresses.
    assert_eq!(connect_from(first.sandbox_netns().expect("ns"), second.addresses().sandbox), Reach::HostUnreachable);

    let second_link = second.sidecar_id().host_link_name();
    first.teardown().expect("teardown first");
    let after_first = net.host_snapshot();
    assert!(after_first.iter().any(|l| l.ends_with(&format!(" {second_link}"))), "second Domain untouched");
    let lazaret_links: Vec<&str> = after_first
        .iter()
        .filter_map(|l| l.strip_prefix("link "))
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|name| SidecarId::from_host_link_name(name).is_some())
        .collect();
    assert_eq!(lazaret_links, vec![second_link.as_str()], "only the second Domain's uplink is left");
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv4/conf/wan0/forwarding"), "1", "still needed by the second Domain");
    assert_eq!(connect_from(second.sandbox_netns().expect("ns"), PUBLIC), Reach::Connected);

    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![second.sidecar_id()], "only the first Domain's NAT table removed");
    second.teardown().expect("teardown second");
    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![], "no Lazaret nftables table left");
    assert_eq!(net.host_snapshot(), before, "the test host is exactly as before");
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv4/conf/wan0/forwarding"), "0");
    assert!(!net.state_file().exists());
}

#[test]
fn root_in_the_sandbox_gains_nothing_by_rerouting() {
    let net = FakeInternet::new();
    let domain = build(&net);
    let sandbox = domain.sandbox_netns().expect("ns");
    let gateway = domain.addresses().sidecar_inner;
    // "Root inside" adds a more specific route of its own towards a denied server.
    sandbox
        .netlink(async move |handle| {
            let index = link_index_sync(&links(&handle).await?, "eth0");
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(PRIVATE_10, 32)
                .gateway(gateway)
                .output_interface(index)
                .build();
            handle.route().add(route).execute().await.map_err(nl("sandbox route"))
        })
        .expect("tamper with sandbox routes");
    assert_eq!(connect_from(sandbox, PRIVATE_10), Reach::HostUnreachable);
    match domain.verify_installed() {
        Err(TopologyError::Mismatch { differences }) => {
            assert!(differences.iter().any(|d| d.contains("unexpected sandbox route 10.1.1.1/32")), "{differences:?}")
        }
        other => panic!("tampering not detected: {other:?}"),
    }
    domain.teardown().expect("teardown");
}

#[test]
fn verify_detects_a_missing_sidecar_route() {
    let net = FakeInternet::new();
    let domain = build(&net);
    let sidecar = domain.sidecar_netns().expect("ns");
    sidecar
        .netlink(async |handle| {
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(Ipv4Addr::new(10, 0, 0, 0), 8)
                .kind(rtnetlink::packet_route::route::RouteType::Unreachable)
                .build();
            handle.route().del(route).execute().await.map_err(nl("delete sidecar route"))
        })
        .expect("remove a policy route");
    match domain.verify_installed() {
        Err(TopologyError::Mismatch { differences }) => {
            assert!(differences.iter().any(|d| d.contains("missing sidecar route 10.0.0.0/8")), "{differences:?}")
        }
        other => panic!("missing route not detected: {other:?}"),
    }
    domain.teardown().expect("teardown");
}

#[test]
fn stale_uplinks_are_found_by_id_and_removed() {
    let net = FakeInternet::new();
    let before = net.host_snapshot();
    // A leftover of a "crashed" run: a Lazaret-named veth holding slot 0.
    let stale = SidecarId::random().expect("id");
    let stale_name = stale.host_link_name();
    let name = stale_name.clone();
    net.host
        .netlink(async move |handle| {
            handle.link().add(LinkVeth::new(&name, "stalepeer").build()).execute().await.map_err(nl("stale veth"))?;
            let index = up(&handle, &name).await?;
            handle.address().add(index, IpAddr::V4(Ipv4Addr::new(100, 96, 0, 3)), 31).execute().await.map_err(nl("addr"))
        })
        .expect("create stale uplink");
    // A crash also leaves the host's NAT table behind (the namespaces die, nftables state does not).
    net.host.run(move || lazaret_netpolicy::topology::nat::install(stale, Ipv4Addr::new(100, 96, 0, 0))).expect("stale NAT table");
    let domain = build(&net);
    assert_eq!(domain.addresses().slot.to_string(), "100.96.0.4/30", "slot 0 is taken by the leftover");

    let removed = remove_stale(&net.host, &[domain.sidecar_id()], &net.state_file()).expect("remove_stale");
    assert_eq!(removed, vec![stale]);
    let snapshot = net.host_snapshot();
    assert!(!snapshot.iter().any(|l| l.contains(&stale_name) || l.contains("stalepeer")), "{snapshot:?}");
    assert!(snapshot.iter().any(|l| l.contains(&domain.sidecar_id().host_link_name())), "live Domain kept");
    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![domain.sidecar_id()], "only the stale NAT table removed");
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv4/conf/wan0/forwarding"), "1", "live Domain still forwards");
    assert_eq!(connect_from(domain.sandbox_netns().expect("ns"), PUBLIC), Reach::Connected);

    // After the live one is gone too, nothing is left.
    let id = domain.sidecar_id();
    drop(domain);
    assert_eq!(remove_stale(&net.host, &[id], &net.state_file()).expect("remove_stale"), vec![]);
    assert_eq!(net.host_snapshot(), before);
    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![]);
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv4/conf/wan0/forwarding"), "0");
}

#[test]
fn pool_colliding_with_a_host_route_is_refused() {
    let net = FakeInternet::new();
    net.host
        .netlink(async |handle| {
            let wan = link_index_sync(&links(&handle).await?, "wan0");
            let route = RouteMessageBuilder::<Ipv4Addr>::new()
                .destination_prefix(Ipv4Addr::new(100, 96, 8, 0), 24)
                .gateway(WORLD_WAN)
                .output_interface(wan)
                .build();
            handle.route().add(route).execute().await.map_err(nl("colliding route"))
        })
        .expect("add colliding route");
    let before = net.host_snapshot();
    match DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &input()) {
        Err(error @ TopologyError::PoolCollision { .. }) => {
            let message = error.to_string();
            assert!(message.contains("100.96.8.0/24") && message.contains("wan0"), "{message}");
        }
        other => panic!("expected a pool collision, got {other:?}"),
    }
    assert_eq!(net.host_snapshot(), before, "nothing created on refusal");
    let mut config = TopologyConfig::new(net.state_file());
    config.pool = "100.97.0.0/24".parse().expect("pool");
    let domain = DomainNetwork::create(&net.host, &config, &input()).expect("another pool works");
    assert_eq!(domain.addresses().slot.to_string(), "100.97.0.0/30");
    domain.teardown().expect("teardown");
}

#[test]
fn ipv6_enabled_domains_are_refused_not_half_policed() {
    let net = FakeInternet::new();
    // The fake host has no IPv6 route, so the config default would be ipv6 = false.
    assert!(!lazaret_netpolicy::topology::host_has_global_ipv6_route(&net.host).expect("route dump"));
    net.host
        .netlink(async |handle| {
            let wan = link_index_sync(&links(&handle).await?, "wan0");
            let route = RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .gateway("fe80::2".parse().expect("address"))
                .output_interface(wan)
                .build();
            handle.route().add(route).execute().await.map_err(nl("IPv6 default route"))
        })
        .expect("add IPv6 default route");
    assert!(lazaret_netpolicy::topology::host_has_global_ipv6_route(&net.host).expect("route dump"));
    let mut policy = input();
    policy.ipv6 = true;
    let error = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &policy).expect_err("refused");
    assert!(matches!(error, TopologyError::Ipv6NotSupported), "{error}");
}
