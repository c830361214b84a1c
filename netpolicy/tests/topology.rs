//! Privileged tests of the Domain topology. Each test builds its own "host"
//! network namespace and a fake internet behind it; nothing is created in the
//! machine's real network namespace. They fail (never skip) without root.

mod support;

use std::net::{IpAddr, Ipv4Addr};

use lazaret_netpolicy::policy::{Action, PolicyInput, RuleOrigin, parse_prefixes};
use lazaret_netpolicy::topology::{
    DomainNetwork, ESCALATION_PORT, Netns, SidecarId, TopologyConfig, TopologyError, debug_view, host_can_forward_ipv6,
    host_has_global_ipv6_route, host_policy, nat_tables, refused_destinations, remove_stale,
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
        (PRIVATE_10, Reach::Unreachable, "RFC 1918 10/8"),
        (PRIVATE_172, Reach::Unreachable, "RFC 1918 172.16/12"),
        (METADATA, Reach::Unreachable, "link-local metadata"),
        (HOST_WAN, Reach::Unreachable, "host address"),
        (transit, Reach::Unreachable, "host end of the Domain uplink"),
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
    // The resolver inside 10/8 is routed (its DNS rule) but only port 53 gets through the sidecar's filter.
    assert_eq!(domain.policy().decide(IpAddr::V4(RESOLVER)).rule.origin, RuleOrigin::DnsPort53);
    assert_eq!(connect_from(sandbox, RESOLVER), Reach::Unreachable, "the resolver's port {PORT}");
    assert_eq!(domain.policy().decide(IpAddr::V4(HOST_WAN)).rule.origin, RuleOrigin::HostAddress);
    assert_eq!(domain.policy().decide(IpAddr::V4(transit)).rule.origin, RuleOrigin::DomainTransit);
    domain.verify_installed().expect("read-back matches");
    // What the routes and the resolver filter refused is counted, with
    // protocol and port; what was allowed is not.
    let refused = refused_destinations(domain.sidecar_netns().expect("ns")).expect("refused destinations");
    for (address, what) in
        [(PRIVATE_10, "RFC 1918"), (METADATA, "metadata"), (HOST_WAN, "host address"), (transit, "transit"), (RESOLVER, "resolver filter")]
    {
        let found = refused.iter().find(|r| r.address == IpAddr::V4(address));
        assert!(
            found.is_some_and(|r| r.protocol == 6
                && r.port == Some(PORT)
                && r.packets >= 1
                && r.last_ago < std::time::Duration::from_secs(60)),
            "{what} ({address}) not counted as refused TCP port {PORT}: {refused:?}"
        );
    }
    for address in [PUBLIC, ALLOWED_PRIVATE] {
        assert!(!refused.iter().any(|r| r.address == IpAddr::V4(address)), "allowed {address} listed as refused: {refused:?}");
    }
    // Nor the sidecar's own addresses (the escalation listener, the locked resolver live there).
    assert!(!refused.iter().any(|r| r.address == IpAddr::V4(domain.addresses().sidecar_inner)), "{refused:?}");
    // The world saw the two allowed connections, both from the host's address (SNAT).
    assert_eq!(net.world_peers(), vec![IpAddr::V4(HOST_WAN); 2]);
    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![domain.sidecar_id()]);
    domain.teardown().expect("teardown");
    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![]);
}

#[test]
fn special_purpose_servers_are_unreachable_by_default_and_an_allow_opens_them() {
    let net = FakeInternet::new();
    let domain = build(&net);
    let sandbox = domain.sandbox_netns().expect("ns");
    for (address, rfc) in [(CGNAT, "RFC 6598"), (BENCHMARK, "RFC 2544"), (RESERVED, "RFC 1112")] {
        assert_eq!(connect_from(sandbox, address), Reach::Unreachable, "{address}");
        let origin = domain.policy().decide(IpAddr::V4(address)).rule.origin.to_string();
        assert!(origin.starts_with(&format!("default: {rfc} ")) && origin.ends_with("(IANA special-purpose)"), "{origin}");
    }
    assert_eq!(connect_from(sandbox, PUBLIC), Reach::Connected);
    domain.teardown().expect("teardown");

    // An explicit allow of CGNAT (a Tailscale network, say) opens exactly that block.
    let mut policy = input();
    policy.allow.extend(parse_prefixes(&[("100.64.0.0/10", "test.toml:2:1")]).expect("prefix"));
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &policy).expect("create");
    let sandbox = domain.sandbox_netns().expect("ns");
    assert_eq!(connect_from(sandbox, CGNAT), Reach::Connected);
    assert_eq!(connect_from(sandbox, BENCHMARK), Reach::Unreachable);
    // The pool (inside 100.64/10) stays denied: other Domains are a longer prefix.
    assert_eq!(domain.policy().decide(IpAddr::V4(Ipv4Addr::new(100, 96, 9, 9))).rule.origin, RuleOrigin::OtherDomain);
    domain.teardown().expect("teardown");
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
    assert_eq!(connect_from(first.sandbox_netns().expect("ns"), second.addresses().sandbox), Reach::Unreachable);

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
            let route =
                RouteMessageBuilder::<Ipv4Addr>::new().destination_prefix(PRIVATE_10, 32).gateway(gateway).output_interface(index).build();
            handle.route().add(route).execute().await.map_err(nl("sandbox route"))
        })
        .expect("tamper with sandbox routes");
    assert_eq!(connect_from(sandbox, PRIVATE_10), Reach::Unreachable);
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
fn verify_detects_a_tampered_guard_rule() {
    let net = FakeInternet::with_ipv6();
    let mut policy = input();
    policy.ipv6 = true;
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &policy)
        .unwrap_or_else(|error| panic!("building the IPv6-enabled Domain network failed: {error}"));
    let sidecar = domain.sidecar_netns().expect("ns");
    // Drop the IPv6 spoof guard and put the kernel's `lookup local` back in front.
    sidecar
        .netlink(async |handle| {
            let rules: Vec<_> = futures_util::TryStreamExt::try_collect(handle.rule().get(rtnetlink::IpVersion::V6).execute())
                .await
                .map_err(nl("dump rules"))?;
            let spoof_guard = rules
                .into_iter()
                .find(|rule| rule.attributes.contains(&rtnetlink::packet_route::rule::RuleAttribute::Priority(402)))
                .expect("the spoof guard rule at 402");
            handle.rule().del(spoof_guard).execute().await.map_err(nl("delete spoof guard"))?;
            let mut local = handle.rule().add().v6().table_id(255).priority(0);
            local.message_mut().header.action = rtnetlink::packet_route::rule::RuleAction::ToTable;
            local.execute().await.map_err(nl("add local rule"))
        })
        .expect("tamper with the rules");
    match domain.verify_installed() {
        Err(TopologyError::Mismatch { differences }) => {
            assert!(differences.contains(&"sidecar IPv6 rule missing: 402: iif lzs0 from all Blackhole".to_string()), "{differences:?}");
            assert!(differences.contains(&"unexpected sidecar IPv6 rule: 0: from all lookup 255".to_string()), "{differences:?}");
        }
        other => panic!("tampered rules not detected: {other:?}"),
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
    net.host.run(move || lazaret_netpolicy::topology::nat::install(stale, Ipv4Addr::new(100, 96, 0, 0), None)).expect("stale NAT table");
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
fn ipv6_enabled_is_policed_like_ipv4_and_leaves_nothing() {
    let plain = FakeInternet::new();
    assert!(!host_has_global_ipv6_route(&plain.host).expect("route dump"), "no IPv6 route: the config default is ipv6 = false");
    drop(plain);

    let net = FakeInternet::with_ipv6();
    assert!(host_has_global_ipv6_route(&net.host).expect("route dump"));
    assert!(
        host_can_forward_ipv6(&net.host).expect("sysctl"),
        "this kernel has no net.ipv6.conf.*.force_forwarding (Linux 6.17+), which IPv6-enabled Domains need on a host that is not an IPv6 router"
    );
    let before = net.host_snapshot();
    let mut policy = input();
    policy.ipv6 = true;
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &policy)
        .unwrap_or_else(|error| panic!("building the IPv6-enabled Domain network failed: {error}"));
    let v6 = domain.addresses().v6;
    let sandbox = domain.sandbox_netns().expect("ns");
    for (what, address, expected) in [
        ("public IPv6 server", IpAddr::V6(PUBLIC6), Reach::Connected),
        ("public IPv4 server", IpAddr::V4(PUBLIC), Reach::Connected),
        ("ULA server", IpAddr::V6(ULA6), Reach::Unreachable),
        ("the host's own IPv6 address", IpAddr::V6(HOST_WAN6), Reach::Unreachable),
        ("a neighbour on the host's global IPv6 LAN", IpAddr::V6(WORLD_WAN6), Reach::Unreachable),
        ("the host end of the uplink", IpAddr::V6(v6.host_uplink), Reach::Unreachable),
        ("the sidecar's uplink address", IpAddr::V6(v6.sidecar_uplink), Reach::Unreachable),
        ("the sandbox's own gateway address", IpAddr::V6(v6.sidecar_inner), Reach::Unreachable),
    ] {
        assert_eq!(connect_from(sandbox, address), expected, "{what} ({address})");
    }
    let refused = refused_destinations(domain.sidecar_netns().expect("ns")).expect("refused destinations");
    for address in [IpAddr::V6(ULA6), IpAddr::V6(HOST_WAN6), IpAddr::V6(WORLD_WAN6), IpAddr::V6(v6.host_uplink)] {
        assert!(
            refused.iter().any(|r| r.address == address && r.protocol == 6 && r.port == Some(PORT)),
            "{address} not counted: {refused:?}"
        );
    }
    assert!(!refused.iter().any(|r| r.address == IpAddr::V6(PUBLIC6)), "{refused:?}");
    assert_eq!(domain.policy().decide(IpAddr::V6(WORLD_WAN6)).rule.origin, RuleOrigin::HostNetwork, "the host's on-link prefix");
    assert_eq!(domain.policy().decide(IpAddr::V6(WORLD_WAN6)).rule.prefix.to_string(), "2a0b:1::/64");
    // Link-local: the only link-local peer the sandbox has is the sidecar's
    // end of their link, and the self-guard keeps it out of reach.
    let sidecar_link_local = domain
        .sidecar_netns()
        .expect("ns")
        .netlink(async |handle| {
            let lzs0 = link_index_sync(&links(&handle).await?, "lzs0");
            let mut addresses = handle.address().get().set_link_index_filter(lzs0).execute();
            let mut found = None;
            while let Some(message) = futures_util::TryStreamExt::try_next(&mut addresses).await.map_err(nl("address dump"))? {
                for attribute in &message.attributes {
                    if let rtnetlink::packet_route::address::AddressAttribute::Address(IpAddr::V6(address)) = attribute {
                        if address.is_unicast_link_local() {
                            found = Some(*address);
                        }
                    }
                }
            }
            Ok(found)
        })
        .expect("sidecar addresses")
        .expect("the sidecar's lzs0 has a link-local address (neighbour discovery needs one)");
    let eth0 = sandbox.netlink(async |handle| Ok(link_index_sync(&links(&handle).await?, "eth0"))).expect("eth0 index");
    let link_local_outcome = sandbox
        .run(move || {
            let target = std::net::SocketAddrV6::new(sidecar_link_local, PORT, 0, eth0);
            Ok(std::net::TcpStream::connect_timeout(&target.into(), std::time::Duration::from_secs(5))
                .map(|_| ())
                .map_err(|e| e.raw_os_error()))
        })
        .expect("link-local connect");
    let refused = [nix::errno::Errno::EHOSTUNREACH, nix::errno::Errno::ENETUNREACH].map(|errno| Err(Some(errno as i32)));
    assert!(refused.contains(&link_local_outcome), "the sidecar's link-local address {sidecar_link_local}: {link_local_outcome:?}");
    // The upstream router (or a LAN peer) routing the IPv6 pool via the host
    // gets no datagram into the sandbox: the host's forward guard drops it.
    let sandbox6 = std::net::SocketAddr::new(IpAddr::V6(v6.sandbox), PORT);
    let inbound = sandbox
        .run(move || std::net::UdpSocket::bind(sandbox6).map_err(|source| TopologyError::Io { action: "sandbox udp".into(), source }))
        .expect("sandbox udp");
    inbound.set_read_timeout(Some(std::time::Duration::from_millis(500))).expect("timeout");
    ip_in(&net.world, &["-6", "route", "add", "fd6c:617a:6172::/96", "via", &HOST_WAN6.to_string()]);
    net.world
        .run(move || {
            let socket =
                std::net::UdpSocket::bind((WORLD_WAN6, 0)).map_err(|source| TopologyError::Io { action: "world udp".into(), source })?;
            socket.send_to(b"unsolicited", sandbox6).map_err(|source| TopologyError::Io { action: "world send".into(), source })
        })
        .expect("world datagram");
    let mut buffer = [0u8; 32];
    assert!(inbound.recv_from(&mut buffer).is_err(), "an unsolicited IPv6 datagram reached the sandbox");
    // NAT66: the world saw the sandbox as the host's IPv6 address.
    assert_eq!(net.world_peers6(), vec![IpAddr::V6(HOST_WAN6)]);
    // Forwarding through the host is per interface; the host is not made an IPv6 router.
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv6/conf/all/forwarding"), "0");
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv6/conf/wan0/force_forwarding"), "1");
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv6/conf/wan0/forwarding"), "0", "wan0 still takes router advertisements");

    // A forged IPv6 source gets nowhere: root inside adds an address the
    // sidecar does not know and connects from it.
    let spoofed: std::net::Ipv6Addr = "2001:db8:dead::1".parse().expect("address");
    sandbox
        .netlink(async move |handle| {
            let eth0 = link_index_sync(&links(&handle).await?, "eth0");
            add_nodad(&handle, eth0, IpAddr::V6(spoofed), 128).await
        })
        .expect("add the spoofed address");
    let outcome = sandbox.run(move || Ok(connect_from_source(spoofed, PUBLIC6))).expect("spoofed connect");
    assert_eq!(outcome, "timed out", "a spoofed source must be dropped silently");
    assert_eq!(net.world_peers6(), Vec::<IpAddr>::new(), "nothing from a spoofed source reached the world");

    domain.teardown().expect("teardown");
    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![]);
    assert_eq!(net.host_snapshot(), before, "the test host is exactly as before");
    assert_eq!(net.host_sysctl("/proc/sys/net/ipv6/conf/wan0/force_forwarding"), "0", "restored after the last Domain");
    assert!(!net.state_file().exists());
}

/// An IPv6 TCP connect from `source` (an address of the calling thread's
/// namespace) to `target`, given 1.5 s: "connected", "timed out" or the error.
fn connect_from_source(source: std::net::Ipv6Addr, target: std::net::Ipv6Addr) -> String {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn6, bind, connect, getsockopt, socket, sockopt};
    use std::net::SocketAddrV6;
    use std::os::fd::{AsFd, AsRawFd};
    let socket = socket(AddressFamily::Inet6, SockType::Stream, SockFlag::SOCK_NONBLOCK, None).expect("socket");
    bind(socket.as_raw_fd(), &SockaddrIn6::from(SocketAddrV6::new(source, 0, 0, 0))).expect("bind");
    match connect(socket.as_raw_fd(), &SockaddrIn6::from(SocketAddrV6::new(target, PORT, 0, 0))) {
        Ok(()) => return "connected".into(),
        Err(nix::errno::Errno::EINPROGRESS) => {}
        Err(errno) => return errno.desc().to_string(),
    }
    let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::from(1500u16)).expect("poll") {
        0 => "timed out".into(),
        _ => match getsockopt(&socket, sockopt::SocketError).expect("SO_ERROR") {
            0 => "connected".into(),
            errno => nix::errno::Errno::from_raw(errno).desc().to_string(),
        },
    }
}

#[test]
fn a_lan_peer_cannot_reach_the_sandbox_through_the_host() {
    let net = FakeInternet::new();
    let peer = net.add_lan_peer("100.96.0.0/16");
    let domain = build(&net);
    let sandbox = domain.sandbox_netns().expect("ns");
    let target = std::net::SocketAddr::new(IpAddr::V4(domain.addresses().sandbox), PORT);
    // Servers inside the sandbox, on its own address.
    let (tcp, udp) = sandbox
        .run(move || {
            let io = |source| TopologyError::Io { action: "sandbox server".into(), source };
            Ok((std::net::TcpListener::bind(target).map_err(io)?, std::net::UdpSocket::bind(target).map_err(io)?))
        })
        .expect("sandbox servers");
    udp.set_read_timeout(Some(std::time::Duration::from_millis(500))).expect("timeout");
    // The peer routes the pool via the host's uplink address; the host
    // forwards on its uplink because the Domain needs that for its replies.
    let tcp_outcome = peer.run(move || Ok(tcp_from(IpAddr::V4(PEER_PUBLIC), target, 1500))).expect("peer connect");
    for source in [PEER_PUBLIC, PEER_WAN] {
        peer.run(move || {
            let socket =
                std::net::UdpSocket::bind((source, 0)).map_err(|source| TopologyError::Io { action: "peer udp".into(), source })?;
            socket.send_to(b"from the LAN", target).map_err(|source| TopologyError::Io { action: "peer send".into(), source })
        })
        .expect("peer datagram");
    }
    let mut buffer = [0u8; 64];
    let datagram = udp.recv_from(&mut buffer).ok().map(|(length, from)| (String::from_utf8_lossy(&buffer[..length]).to_string(), from));
    tcp.set_nonblocking(true).expect("nonblocking");
    let accepted = tcp.accept().ok().map(|(_, from)| from);
    eprintln!("LAN peer -> sandbox: tcp {tcp_outcome:?}, accepted {accepted:?}, datagram {datagram:?}");
    assert_eq!(datagram, None, "a datagram from the LAN reached the sandbox");
    assert_eq!(accepted, None, "a TCP connection from the LAN reached the sandbox");
    assert_ne!(tcp_outcome, "connected");
    // The sandbox's own traffic and its replies still pass.
    assert_eq!(connect_from(sandbox, PUBLIC), Reach::Connected);
    // The host's other forwarding is untouched: the peer still gets to the
    // world through the host.
    ip_in(&peer, &["route", "add", &format!("{PUBLIC}/32"), "via", &HOST_WAN.to_string()]);
    let forwarded =
        peer.run(|| Ok(tcp_from(IpAddr::V4(PEER_WAN), std::net::SocketAddr::new(IpAddr::V4(PUBLIC), PORT), 1500))).expect("peer to world");
    assert_eq!(forwarded, "connected");
    domain.teardown().expect("teardown");
}

/// A DNS server (UDP and TCP port 53) and a web server (TCP port 80) on
/// [`LAN_RESOLVER`] in the world; the UDP one answers "answer: <query>"
/// until the returned guard is dropped.
struct LanRouter {
    _tcp53: std::net::TcpListener,
    _tcp80: std::net::TcpListener,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    worker: Option<std::thread::JoinHandle<()>>,
}

impl Drop for LanRouter {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

fn lan_router(net: &FakeInternet) -> LanRouter {
    let (udp, tcp53, tcp80) = net
        .world
        .run(|| {
            let io = |source| TopologyError::Io { action: "LAN router servers".into(), source };
            Ok((
                std::net::UdpSocket::bind((LAN_RESOLVER, 53)).map_err(io)?,
                std::net::TcpListener::bind((LAN_RESOLVER, 53)).map_err(io)?,
                std::net::TcpListener::bind((LAN_RESOLVER, 80)).map_err(io)?,
            ))
        })
        .expect("LAN router");
    udp.set_read_timeout(Some(std::time::Duration::from_millis(50))).expect("timeout");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let worker = std::thread::spawn(move || {
        let mut buffer = [0u8; 512];
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            if let Ok((length, from)) = udp.recv_from(&mut buffer) {
                let answer = [b"answer: ", &buffer[..length]].concat();
                let _ = udp.send_to(&answer, from);
            }
        }
    });
    LanRouter { _tcp53: tcp53, _tcp80: tcp80, stop, worker: Some(worker) }
}

/// A UDP query from inside `ns` to `target` on a connected socket: the
/// answer, or the error (an ICMP error shows up on the receive).
fn udp_query(ns: &lazaret_netpolicy::topology::Netns, target: std::net::SocketAddr) -> Result<String, String> {
    ns.run(move || {
        let io = |source| TopologyError::Io { action: "udp query".into(), source };
        let socket = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(io)?;
        socket.set_read_timeout(Some(std::time::Duration::from_secs(2))).map_err(io)?;
        socket.connect(target).map_err(io)?;
        socket.send(b"example.com A").map_err(io)?;
        let mut buffer = [0u8; 512];
        Ok(match socket.recv(&mut buffer) {
            Ok(length) => Ok(String::from_utf8_lossy(&buffer[..length]).to_string()),
            Err(error) => Err(error.to_string()),
        })
    })
    .expect("udp worker")
}

#[test]
fn a_resolver_the_policy_denies_answers_dns_but_nothing_else() {
    let net = FakeInternet::new();
    let _router = lan_router(&net);
    let resolver = IpAddr::V4(LAN_RESOLVER);
    let dns = |port| std::net::SocketAddr::new(resolver, port);
    let mut policy = input();
    policy.dns = vec![resolver];
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &policy).expect("create");
    let sandbox = domain.sandbox_netns().expect("ns");
    assert_eq!(domain.policy().port53_only_resolvers(), vec![resolver]);
    assert_eq!(udp_query(sandbox, dns(53)), Ok("answer: example.com A".to_string()), "DNS over UDP");
    assert_eq!(connect_to(sandbox, dns(53)), Reach::Connected, "DNS over TCP");
    assert_eq!(connect_to(sandbox, dns(80)), Reach::Unreachable, "the router's web interface");
    assert_eq!(connect_to(sandbox, dns(22)), Reach::Unreachable);
    // UDP elsewhere never reaches the router: without the filter its "port
    // unreachable" would come back as ECONNREFUSED; the filter's host
    // unreachable is not fatal for a UDP socket, so the query just times out.
    let other_udp = udp_query(sandbox, dns(54));
    assert!(other_udp.as_ref().is_err_and(|e| e.contains("temporarily unavailable")), "UDP to port 54: {other_udp:?}");
    // Other addresses of the denied range stay unreachable on every port.
    assert_eq!(connect_to(sandbox, std::net::SocketAddr::new(IpAddr::V4(Ipv4Addr::new(192, 168, 7, 2)), 53)), Reach::Unreachable);
    domain.verify_installed().expect("read-back matches");
    let refused = refused_destinations(domain.sidecar_netns().expect("ns")).expect("refused destinations");
    let count = |protocol: u8, port: u16| {
        refused.iter().find(|r| r.address == resolver && r.protocol == protocol && r.port == Some(port)).map(|r| r.packets)
    };
    assert!(count(6, 80).is_some_and(|n| n >= 1) && count(6, 22).is_some_and(|n| n >= 1), "TCP to the router's other ports: {refused:?}");
    assert!(count(17, 54).is_some_and(|n| n >= 1), "UDP to port 54: {refused:?}");
    assert_eq!((count(17, 53), count(6, 53)), (None, None), "DNS is allowed: {refused:?}");
    assert!(refused.iter().any(|r| r.address == IpAddr::V4(Ipv4Addr::new(192, 168, 7, 2)) && r.port == Some(53)), "{refused:?}");
    let listing = nft_in(domain.sidecar_netns().expect("ns"), &["list", "ruleset"]);
    assert!(listing.contains("table inet lazaret-filter") && listing.contains("192.168.7.1"), "{listing}");

    // Tampering with either table is found before the sandbox would start.
    let sidecar = domain.sidecar_netns().expect("ns");
    nft_in(sidecar, &["flush", "chain", "inet", "lazaret-filter", "forward"]);
    nft_in(sidecar, &["add", "table", "inet", "extra"]);
    let table = format!("lazaret-{}", domain.sidecar_id());
    nft_in(&net.host, &["add", "rule", "inet", &table, "forward", "accept"]);
    match domain.verify_installed() {
        Err(TopologyError::Mismatch { differences }) => {
            let rule = "sidecar nftables table inet lazaret-filter: rule missing: chain forward: iifname \"lzs0\" meta nfproto ipv4 ip daddr 192.168.7.1 goto refuse";
            assert!(differences.iter().any(|d| d == rule), "{differences:?}");
            assert!(differences.iter().any(|d| d.contains("unexpected nftables table extra")), "{differences:?}");
            assert!(
                differences.iter().any(|d| d.starts_with(&format!("host nftables table inet {table}: unexpected rule in chain forward"))),
                "{differences:?}"
            );
        }
        other => panic!("tampered filters not detected: {other:?}"),
    }
    domain.teardown().expect("teardown");
    assert_eq!(nat_tables(&net.host).expect("nat tables"), vec![]);
    assert_eq!(nft_in(&net.host, &["list", "tables"]), "", "no nftables table of the Domain is left on the host");

    // An explicit allow of the resolver's address opens it fully, as before.
    policy.allow.extend(parse_prefixes(&[("192.168.7.1/32", "test.toml:3:1")]).expect("prefix"));
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &policy).expect("create");
    let sandbox = domain.sandbox_netns().expect("ns");
    assert_eq!(domain.policy().port53_only_resolvers(), Vec::<IpAddr>::new());
    assert_eq!(connect_to(sandbox, dns(80)), Reach::Connected, "explicitly allowed");
    assert_eq!(udp_query(sandbox, dns(53)), Ok("answer: example.com A".to_string()));
    let refused = udp_query(sandbox, dns(54));
    assert!(refused.as_ref().is_err_and(|e| e.contains("Connection refused")), "UDP to port 54 reaches the router: {refused:?}");
    domain.verify_installed().expect("read-back matches");
    domain.teardown().expect("teardown");
    assert_eq!(nft_in(&net.host, &["list", "tables"]), "");
}

#[test]
fn only_the_sandbox_address_is_forwarded_out_of_the_domain() {
    let net = FakeInternet::new();
    let domain = build(&net);
    let world = net
        .world
        .run(|| std::net::UdpSocket::bind((PUBLIC, PORT)).map_err(|source| TopologyError::Io { action: "world udp".into(), source }))
        .expect("world udp");
    world.set_read_timeout(Some(std::time::Duration::from_millis(500))).expect("timeout");
    let send_from = |ns: &lazaret_netpolicy::topology::Netns, source: Ipv4Addr| {
        ns.run(move || {
            let socket = std::net::UdpSocket::bind((source, 0)).map_err(|source| TopologyError::Io { action: "udp".into(), source })?;
            socket
                .send_to(source.to_string().as_bytes(), (PUBLIC, PORT))
                .map_err(|source| TopologyError::Io { action: "send".into(), source })
        })
        .expect("datagram");
    };
    let mut buffer = [0u8; 64];
    // The sidecar's own uplink address (no sandbox can use it; the guard is
    // defence in depth behind the sidecar's rp_filter): dropped on the host.
    send_from(domain.sidecar_netns().expect("ns"), domain.addresses().sidecar_uplink);
    assert!(world.recv_from(&mut buffer).is_err(), "a packet from the sidecar's address left the Domain");
    // The sandbox's own address: forwarded and masqueraded.
    send_from(domain.sandbox_netns().expect("ns"), domain.addresses().sandbox);
    let (length, from) = world.recv_from(&mut buffer).expect("the sandbox's datagram");
    assert_eq!((&buffer[..length], from.ip()), (domain.addresses().sandbox.to_string().as_bytes(), IpAddr::V4(HOST_WAN)));
    domain.teardown().expect("teardown");
}

/// A TCP listener on `address` inside `ns` (a decoy for the escalation tests).
fn listen_in(ns: &Netns, address: std::net::SocketAddr) -> std::net::TcpListener {
    ns.run(move || {
        std::net::TcpListener::bind(address).map_err(|source| TopologyError::Io { action: format!("listen on {address}"), source })
    })
    .expect("decoy listener")
}

#[test]
fn only_the_sandbox_reaches_the_escalation_listener_whatever_the_egress_policy() {
    use std::io::{Read, Write};
    use std::net::SocketAddr;
    let net = FakeInternet::with_ipv6();
    let policy = PolicyInput {
        deny: parse_prefixes(&[("0.0.0.0/0", "test.toml:1:1"), ("::/0", "test.toml:1:2")]).expect("prefix"),
        ipv6: true,
        ..PolicyInput::default()
    };
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &policy)
        .unwrap_or_else(|error| panic!("building the deny-all Domain network failed: {error}"));
    let (sandbox, sidecar) = (domain.sandbox_netns().expect("ns"), domain.sidecar_netns().expect("ns"));
    let addresses = domain.addresses();
    let gateway = IpAddr::V4(addresses.sidecar_inner);
    let escalation = domain.escalation_address();
    assert_eq!(escalation, SocketAddr::new(gateway, 7418));
    assert_eq!(ESCALATION_PORT, 7418);

    let listener = domain.bind_escalation_listener().expect("bind the escalation listener");
    assert_eq!(listener.local_addr().expect("local address"), escalation);
    let fd_flags = nix::fcntl::fcntl(&listener, nix::fcntl::FcntlArg::F_GETFD).expect("F_GETFD");
    assert!(nix::fcntl::FdFlag::from_bits_truncate(fd_flags).contains(nix::fcntl::FdFlag::FD_CLOEXEC), "close-on-exec");
    // Decoys in the sidecar, so that a refusal below is the guard's and not an absent listener's.
    let decoys = [
        SocketAddr::new(gateway, ESCALATION_PORT + 1),
        SocketAddr::new(IpAddr::V4(addresses.sidecar_uplink), ESCALATION_PORT),
        SocketAddr::new(IpAddr::V6(addresses.v6.sidecar_inner), ESCALATION_PORT),
        SocketAddr::new(IpAddr::V6(addresses.v6.sidecar_uplink), ESCALATION_PORT),
    ]
    .map(|address| (address, listen_in(sidecar, address)));

    // All egress is denied.
    assert_eq!(connect_from(sandbox, PUBLIC), Reach::Unreachable);
    assert_eq!(connect_from(sandbox, PUBLIC6), Reach::Unreachable);
    // The sandbox reaches the listener, and a full exchange works (the
    // connection waits in the backlog, accepted from this thread in the host).
    let client = sandbox
        .run(move || {
            std::net::TcpStream::connect_timeout(&escalation, std::time::Duration::from_secs(5))
                .map_err(|source| TopologyError::Io { action: format!("connect to {escalation}"), source })
        })
        .expect("the sandbox connects to the escalation listener");
    let (mut served, peer) = listener.accept().expect("accept");
    assert_eq!(peer.ip(), IpAddr::V4(addresses.sandbox), "the peer is the sandbox");
    for stream in [&client, &served] {
        stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).expect("timeout");
    }
    let mut client = client;
    client.write_all(b"ping").expect("client write");
    let mut buffer = [0u8; 4];
    served.read_exact(&mut buffer).expect("server read");
    assert_eq!(&buffer, b"ping");
    served.write_all(b"pong").expect("server write");
    client.read_exact(&mut buffer).expect("client read");
    assert_eq!(&buffer, b"pong");
    drop((client, served));

    // Every other port and address of the sidecar stays refused, IPv6 included.
    for (address, _) in &decoys {
        assert_eq!(connect_to(sandbox, *address), Reach::Unreachable, "the sidecar's {address}");
    }
    for (address, decoy) in &decoys {
        decoy.set_nonblocking(true).expect("nonblocking");
        assert!(decoy.accept().is_err(), "a connection from the sandbox reached the decoy on {address}");
    }
    // The host routes the sandbox link through the sidecar, but the sidecar
    // routes nothing back to the host's addresses (denied): no connection.
    let host_uplink = IpAddr::V4(addresses.host_uplink);
    let from_host = net.host.run(move || Ok(tcp_from(host_uplink, escalation, 1500))).expect("host connect");
    assert_eq!(from_host, "timed out", "the host's processes reach the escalation listener");
    listener.set_nonblocking(true).expect("nonblocking");
    assert!(listener.accept().is_err(), "a connection from the host reached the escalation listener");

    domain.verify_installed().expect("read-back matches");
    let view = debug_view(sidecar).expect("debug view of the sidecar");
    let rules = &view[view.find("IPv4 rules:").expect("IPv4 rules")..view.find("IPv6 rules:").expect("IPv6 rules")];
    let exception = format!("\n  490: from all to {gateway} iif lzs0 ipproto tcp dport 7418-7418 lookup local");
    assert!(rules.contains(&exception), "{rules}");
    assert_eq!(rules.matches("dport").count(), 1, "{rules}");
    assert!(!view[view.find("IPv6 rules:").expect("IPv6 rules")..].contains("dport"), "an IPv6 exception:\n{view}");

    // Without the exception the self-guard refuses the channel, and verification says so.
    ip_in(sidecar, &["rule", "del", "pref", "490"]);
    assert_eq!(connect_to(sandbox, escalation), Reach::Unreachable);
    match domain.verify_installed() {
        Err(TopologyError::Mismatch { differences }) => {
            let missing =
                format!("sidecar IPv4 rule missing: 490: iif lzs0 from all to {gateway}/32 ipproto Tcp dport 7418-7418 lookup 255");
            assert_eq!(differences, vec![missing]);
        }
        other => panic!("the missing exception was not detected: {other:?}"),
    }
    drop(listener);
    domain.teardown().expect("teardown");
}
