//! Privileged tests of live host addresses: an address the (fake) host gains
//! while a Domain runs is denied once the policy is refreshed, and its
//! denial goes away with it. Everything happens in the test's own
//! namespaces (FakeInternet); they fail (never skip) without root.

mod support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use lazaret_netpolicy::policy::{Action, PolicyInput, RuleOrigin, parse_prefixes};
use lazaret_netpolicy::topology::{DomainNetwork, HostWatcher, Netns, PolicyUpdate, TopologyConfig, TopologyError};
use support::*;

/// The address the host gains: public (no special-purpose block decides it),
/// outside the fake host's other networks.
const NEW4: Ipv4Addr = Ipv4Addr::new(11, 5, 5, 5);
const NEW6: Ipv6Addr = Ipv6Addr::new(0x2a0b, 5, 0, 0, 0, 0, 0, 5);

fn input(ipv6: bool) -> PolicyInput {
    PolicyInput {
        allow: parse_prefixes(&[("10.222.0.0/16", "test.toml:1:1")]).expect("prefix"),
        dns: vec![IpAddr::V4(RESOLVER)],
        ipv6,
        ..PolicyInput::default()
    }
}

/// The sidecar's main-table routes, like `ip route` prints them.
fn sidecar_routes(domain: &DomainNetwork) -> String {
    let sidecar = domain.sidecar_netns().expect("sidecar netns");
    let mut text = String::new();
    for family in ["-4", "-6"] {
        let output = sidecar
            .run(move || {
                std::process::Command::new("ip")
                    .args([family, "route", "show", "table", "main"])
                    .output()
                    .map_err(|source| TopologyError::Io { action: "run ip route".into(), source })
            })
            .expect("ip worker");
        assert!(output.status.success(), "ip route: {}", String::from_utf8_lossy(&output.stderr));
        text.push_str(&String::from_utf8_lossy(&output.stdout));
    }
    text
}

fn has_route(routes: &str, prefix: &str) -> bool {
    routes.lines().any(|line| line.starts_with(&format!("unreachable {prefix} ")) || line == format!("unreachable {prefix}"))
}

fn listen_in(ns: &Netns, address: IpAddr) -> TcpListener {
    ns.run(move || {
        TcpListener::bind(SocketAddr::new(address, PORT))
            .map_err(|source| TopologyError::Io { action: format!("listen on {address}"), source })
    })
    .expect("listener")
}

#[test]
fn an_address_the_host_gains_is_denied_after_the_refresh_and_its_denial_leaves_with_it() {
    let net = FakeInternet::with_ipv6();
    let before = net.host_snapshot();
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &input(true))
        .unwrap_or_else(|error| panic!("building the Domain network failed: {error}"));
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let update = domain.refresh_host().expect("refresh");
    assert!(update.is_empty(), "nothing changed yet: {update}");

    // The host gains an address of each family (a VPN coming up, say), with
    // the kernel's link routes for their networks.
    ip_in(&net.host, &["addr", "add", &format!("{NEW4}/24"), "dev", "wan0"]);
    ip_in(&net.host, &["addr", "add", &format!("{NEW6}/64"), "dev", "wan0", "nodad"]);
    let listener6 = listen_in(&net.host, IpAddr::V6(NEW6));
    // The snapshot policy allows them: the sandbox reaches the host's service on them.
    assert_eq!(domain.policy().decide(IpAddr::V4(NEW4)).action, Action::Allow);
    assert_eq!(connect_from(sandbox, NEW4), Reach::Connected, "{NEW4} before the refresh");
    assert_eq!(connect_from(sandbox, NEW6), Reach::Connected, "{NEW6} before the refresh");

    let update = domain.refresh_host().expect("refresh");
    let added: Vec<(String, RuleOrigin)> = update.added.iter().map(|rule| (rule.prefix.to_string(), rule.origin.clone())).collect();
    for expected in [
        (format!("{NEW4}/32"), RuleOrigin::HostAddress),
        ("11.5.5.0/24".to_string(), RuleOrigin::HostNetwork),
        (format!("{NEW6}/128"), RuleOrigin::HostAddress),
        ("2a0b:5::/64".to_string(), RuleOrigin::HostNetwork),
    ] {
        assert!(added.contains(&expected), "{expected:?} missing from {update}");
    }
    assert!(update.added.iter().all(|rule| rule.action == Action::Deny), "{update}");
    assert!(update.removed.is_empty(), "{update}");
    assert_eq!(connect_from(sandbox, NEW4), Reach::Unreachable, "{NEW4} after the refresh");
    assert_eq!(connect_from(sandbox, NEW6), Reach::Unreachable, "{NEW6} after the refresh");
    assert_eq!(domain.policy().decide(IpAddr::V4(NEW4)).rule.origin, RuleOrigin::HostAddress);
    let routes = sidecar_routes(&domain);
    for prefix in ["11.5.5.5", "11.5.5.0/24", "2a0b:5::5", "2a0b:5::/64"] {
        assert!(has_route(&routes, prefix), "unreachable {prefix} missing:\n{routes}");
    }
    // Everything else still works, and the full read-back agrees. (Not
    // IPv6 to the world here: NAT66 would pick the new address as the
    // source, which the fake world has no route back to.)
    assert_eq!(connect_from(sandbox, PUBLIC), Reach::Connected);
    domain.verify_installed().expect("read-back after the update");
    assert!(domain.refresh_host().expect("refresh").is_empty(), "a second refresh changes nothing");

    // The addresses go away: so do their denials.
    drop(listener6);
    ip_in(&net.host, &["addr", "del", &format!("{NEW4}/24"), "dev", "wan0"]);
    ip_in(&net.host, &["addr", "del", &format!("{NEW6}/64"), "dev", "wan0"]);
    let update = domain.refresh_host().expect("refresh");
    let removed: Vec<String> = update.removed.iter().map(|rule| rule.prefix.to_string()).collect();
    assert_eq!(removed.len(), 4, "{update}");
    for prefix in ["11.5.5.5/32", "11.5.5.0/24", "2a0b:5::5/128", "2a0b:5::/64"] {
        assert!(removed.contains(&prefix.to_string()), "{prefix} not removed: {update}");
    }
    assert!(update.added.is_empty(), "{update}");
    let routes = sidecar_routes(&domain);
    for prefix in ["11.5.5.5", "11.5.5.0/24", "2a0b:5::5", "2a0b:5::/64"] {
        assert!(!has_route(&routes, prefix), "unreachable {prefix} left behind:\n{routes}");
    }
    assert_eq!(domain.policy().decide(IpAddr::V4(NEW4)).action, Action::Allow);
    assert_eq!(connect_from(sandbox, PUBLIC6), Reach::Connected);
    domain.verify_installed().expect("read-back after the removal");
    domain.teardown().expect("teardown");
    assert_eq!(net.host_snapshot(), before, "the test host is as before");
}

#[test]
fn the_host_watcher_denies_a_new_address_within_a_second_and_lets_go_of_the_network() {
    let net = FakeInternet::new();
    let domain = Arc::new(
        DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &input(false))
            .unwrap_or_else(|error| panic!("building the Domain network failed: {error}")),
    );
    let (sender, updates) = mpsc::channel::<(Instant, Result<PolicyUpdate, String>)>();
    let watcher = HostWatcher::start(&domain, move |result| {
        let _ = sender.send((Instant::now(), result.map_err(|error| error.to_string())));
    })
    .expect("start the watcher");
    // Nothing changed since the network was built: no report.
    assert!(updates.recv_timeout(Duration::from_millis(300)).is_err(), "an empty update was reported");
    let sandbox = domain.sandbox_netns().expect("sandbox netns");

    let added_at = Instant::now();
    ip_in(&net.host, &["addr", "add", &format!("{NEW4}/32"), "dev", "wan0"]);
    let (reported_at, update) = updates.recv_timeout(Duration::from_secs(2)).expect("an update within 2 s");
    let update = update.expect("the update succeeded");
    let latency = reported_at - added_at;
    eprintln!("host address added -> deny route installed and verified: {latency:?} ({update})");
    assert!(latency < Duration::from_secs(1), "took {latency:?}");
    assert_eq!(
        update.added.iter().map(|rule| (rule.prefix.to_string(), rule.action)).collect::<Vec<_>>(),
        vec![(format!("{NEW4}/32"), Action::Deny)]
    );
    assert_eq!(connect_from(sandbox, NEW4), Reach::Unreachable);

    ip_in(&net.host, &["addr", "del", &format!("{NEW4}/32"), "dev", "wan0"]);
    let (_, update) = updates.recv_timeout(Duration::from_secs(2)).expect("an update within 2 s");
    let update = update.expect("the update succeeded");
    assert_eq!(update.removed.iter().map(|rule| rule.prefix.to_string()).collect::<Vec<_>>(), vec![format!("{NEW4}/32")]);
    assert!(!has_route(&sidecar_routes(&domain), "11.5.5.5"));

    // Stopped, the watcher holds nothing: the last handle can tear the network down.
    watcher.stop();
    let domain = Arc::try_unwrap(domain).expect("the watcher let go of the network");
    domain.teardown().expect("teardown");
}

/// A resolver that becomes reachable only through its DNS route (the host
/// gains an address on its network) gets the port-53 filter in place: the
/// sidecar's filter chain is replaced in one transaction, its counting sets
/// (and what they counted) and chains stay, and the read-back holds.
#[test]
fn a_resolver_the_host_comes_to_share_a_network_with_gets_the_port_53_filter_and_counts_survive() {
    const RESOLVER_PUBLIC: Ipv4Addr = Ipv4Addr::new(11, 5, 5, 53);
    let net = FakeInternet::new();
    let mut policy = input(false);
    policy.dns = vec![IpAddr::V4(RESOLVER_PUBLIC)];
    let domain = DomainNetwork::create(&net.host, &TopologyConfig::new(net.state_file()), &policy)
        .unwrap_or_else(|error| panic!("building the Domain network failed: {error}"));
    let sandbox = domain.sandbox_netns().expect("sandbox netns");
    let sidecar = domain.sidecar_netns().expect("sidecar netns");
    assert!(domain.policy().port53_only_resolvers().is_empty());
    assert_eq!(connect_from(sandbox, PRIVATE_10), Reach::Unreachable);
    let counted = |address: Ipv4Addr| {
        lazaret_netpolicy::topology::refused_destinations(sidecar)
            .expect("refused")
            .iter()
            .find(|r| r.address == IpAddr::V4(address))
            .map(|r| r.packets)
    };
    let before = counted(PRIVATE_10).expect("counted before the refresh");

    ip_in(&net.host, &["addr", "add", &format!("{NEW4}/24"), "dev", "wan0"]);
    let update = domain.refresh_host().expect("refresh replaces the filter and reads it back");
    assert_eq!(update.port53_only, Some(vec![IpAddr::V4(RESOLVER_PUBLIC)]), "{update}");
    domain.verify_installed().expect("read-back after the replacement");
    assert_eq!(counted(PRIVATE_10), Some(before), "the counts survived the replacement");
    // The new filter counts too: the resolver's port 8080 is refused.
    assert_eq!(connect_from(sandbox, RESOLVER_PUBLIC), Reach::Unreachable);
    assert!(counted(RESOLVER_PUBLIC).is_some_and(|n| n >= 1));

    ip_in(&net.host, &["addr", "del", &format!("{NEW4}/24"), "dev", "wan0"]);
    let update = domain.refresh_host().expect("refresh");
    assert_eq!(update.port53_only, Some(vec![]), "{update}");
    domain.verify_installed().expect("read-back after the second replacement");
    domain.teardown().expect("teardown");
}
