//! Live host addresses: the policy follows the host's addresses and on-link
//! networks while a Domain runs (a VPN coming up, a new IPv6 temporary
//! address), not only as they were when the Domain's network was created.
//!
//! * [`HostWatch`] subscribes to the host namespace's rtnetlink address and
//!   route notifications (`RTMGRP_IPV4_IFADDR`, `RTMGRP_IPV6_IFADDR`,
//!   `RTMGRP_IPV4_ROUTE`, `RTMGRP_IPV6_ROUTE`: on-link networks are derived
//!   from the host's link routes).
//! * [`DomainNetwork::refresh_host`] recompiles the policy with the host's
//!   addresses now and changes the sidecar's routes (and, if a resolver's
//!   port-53-only status changed, its filter) from the installed policy to
//!   the new one, then reads them back.
//! * [`HostWatcher`] does both on a dedicated thread until it is dropped.
//!
//! No window where a new host address is reachable: the new or changed
//! `unreachable` routes go in first (with `NLM_F_REPLACE`, so a retry after
//! a failure is harmless), then the filter, then new or changed routes via
//! the uplink, and only then are the routes of vanished rules deleted.
//! During the update every destination's longest match is a route of the
//! old or of the new policy, so its verdict is the old or the new one; a
//! host address is a /32 or /128, the longest route there is, so it is
//! denied from the moment its route is in.

use std::fmt;
use std::net::IpAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::MsgFlags;
use rtnetlink::constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV6_IFADDR, RTMGRP_IPV6_ROUTE};
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{Socket, SocketAddr};

use super::{
    DomainNetwork, Netns, SIDECAR_UPLINK, TopologyError, complete_input, link_index, net_view, netlink_error, nft,
    policy_route_differences, route_message,
};
use crate::policy::{CompiledPolicy, PolicyRoute, RouteKind, Rule, compile};

/// The notification groups [`HostWatch`] subscribes to.
pub const HOST_WATCH_GROUPS: u32 = RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE;
/// How long [`HostWatcher`] waits for a burst of notifications (an address
/// and its routes, say) to end before it updates the policy.
const SETTLE: Duration = Duration::from_millis(15);
/// At most this many settle periods: a host that changes all the time still gets updates.
const MAX_SETTLES: usize = 10;

/// What one [`DomainNetwork::refresh_host`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyUpdate {
    /// Rules of the new policy whose route is new or changed (with their origin).
    pub added: Vec<Rule>,
    /// Rules of the old policy whose prefix has no rule any more (their routes are gone).
    pub removed: Vec<Rule>,
    /// The resolvers the sidecar's filter limits to port 53, when that list changed.
    pub port53_only: Option<Vec<IpAddr>>,
}

impl PolicyUpdate {
    /// The changes from `old` to `new`.
    pub fn between(old: &CompiledPolicy, new: &CompiledPolicy) -> PolicyUpdate {
        let same_route = |a: &Rule, b: &Rule| a.prefix == b.prefix && a.action == b.action;
        let added = new.rules().iter().filter(|rule| !old.rules().iter().any(|o| same_route(o, rule))).cloned().collect();
        let removed = old.rules().iter().filter(|rule| !new.rules().iter().any(|n| n.prefix == rule.prefix)).cloned().collect();
        let port53_only = Some(new.port53_only_resolvers()).filter(|list| *list != old.port53_only_resolvers());
        PolicyUpdate { added, removed, port53_only }
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.port53_only.is_none()
    }
}

impl fmt::Display for PolicyUpdate {
    /// One line, e.g. `+deny 198.51.100.9/32 (default: host address); -deny 203.0.113.0/24 (...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no change");
        }
        let mut parts: Vec<String> = Vec::new();
        parts.extend(self.added.iter().map(|rule| format!("+{} {} ({})", rule.action, rule.prefix, rule.origin)));
        parts.extend(self.removed.iter().map(|rule| format!("-{} {} ({})", rule.action, rule.prefix, rule.origin)));
        if let Some(resolvers) = &self.port53_only {
            let list: Vec<String> = resolvers.iter().map(ToString::to_string).collect();
            parts.push(format!("port-53-only resolvers now [{}]", list.join(", ")));
        }
        f.write_str(&parts.join("; "))
    }
}

/// The route changes from `old` to `new`, in the order they are applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct RoutePlan {
    /// New or changed `unreachable` routes: first.
    deny: Vec<PolicyRoute>,
    /// New or changed routes via the uplink: after the denials.
    allow: Vec<PolicyRoute>,
    /// Routes whose prefix the new policy no longer has: last.
    remove: Vec<PolicyRoute>,
}

impl RoutePlan {
    fn between(old: &[PolicyRoute], new: &[PolicyRoute]) -> RoutePlan {
        let fresh = new.iter().filter(|route| !old.contains(route));
        let (deny, allow) = fresh.partition(|route| route.kind == RouteKind::Unreachable);
        let remove = old.iter().filter(|route| !new.iter().any(|n| n.prefix == route.prefix)).copied().collect();
        RoutePlan { deny, allow, remove }
    }

    fn is_empty(&self) -> bool {
        self.deny.is_empty() && self.allow.is_empty() && self.remove.is_empty()
    }
}

/// Whether a netlink error says the object was not there (a route deleted by an earlier, failed update).
fn is_missing(error: &rtnetlink::Error) -> bool {
    match error {
        rtnetlink::Error::NetlinkError(message) => {
            message.code.is_some_and(|code| [-(Errno::ESRCH as i32), -(Errno::ENOENT as i32)].contains(&code.get()))
        }
        _ => false,
    }
}

impl DomainNetwork {
    /// Recompiles the policy with the host's addresses and on-link networks
    /// as they are now, changes the sidecar from the installed policy to the
    /// new one (denials first, removals last: see the module documentation),
    /// checks the sidecar's policy routes and filter against it by read-back,
    /// and reports what changed. Updates are serialized (the policy's lock
    /// is held throughout). After a failure the installed policy is still
    /// the old one as far as this Domain knows; the next call repeats the
    /// whole change, which is safe to repeat.
    pub fn refresh_host(&self) -> Result<PolicyUpdate, TopologyError> {
        let (sidecar, _) = self.namespaces()?;
        let mut policy = self.locked_policy();
        let view = self.host.netlink(async |handle| net_view(&handle).await)?;
        let new = compile(&complete_input(&view, &self.config, &self.input, Some(&self.addresses)))?;
        let update = PolicyUpdate::between(&policy, &new);
        let expected = new.routes();
        let plan = RoutePlan::between(&policy.routes(), &expected);
        if update.is_empty() && plan.is_empty() {
            return Ok(update);
        }
        let filter = nft::sidecar_filter(&new.port53_only_resolvers());
        let replace_filter = update.port53_only.is_some();
        let addresses = self.addresses;
        let differences = sidecar.netlink(async move |handle| {
            let uplink = link_index(&handle, SIDECAR_UPLINK).await?;
            let gateways = (uplink, addresses.host_uplink, addresses.v6.host_uplink);
            for route in &plan.deny {
                let message = route_message(route, gateways)?;
                handle
                    .route()
                    .add(message)
                    .replace()
                    .execute()
                    .await
                    .map_err(netlink_error(format!("add sidecar route {} {:?}", route.prefix, route.kind)))?;
            }
            if replace_filter {
                filter.replace()?;
            }
            for route in &plan.allow {
                let message = route_message(route, gateways)?;
                handle
                    .route()
                    .add(message)
                    .replace()
                    .execute()
                    .await
                    .map_err(netlink_error(format!("add sidecar route {} {:?}", route.prefix, route.kind)))?;
            }
            for route in &plan.remove {
                let message = route_message(route, gateways)?;
                match handle.route().del(message).execute().await {
                    Err(error) if !is_missing(&error) => {
                        return Err(TopologyError::Netlink {
                            action: format!("delete sidecar route {} {:?}", route.prefix, route.kind),
                            source: error,
                        });
                    }
                    _ => {}
                }
            }
            let view = net_view(&handle).await?;
            let mut differences = policy_route_differences(&view, &addresses, &expected);
            differences.extend(filter.differences()?.into_iter().map(|d| format!("sidecar {d}")));
            Ok(differences)
        })?;
        if !differences.is_empty() {
            return Err(TopologyError::Mismatch { differences });
        }
        *policy = new;
        Ok(update)
    }
}

/// A subscription to the host namespace's address and route notifications
/// ([`HOST_WATCH_GROUPS`]). The socket belongs to the namespace it was
/// opened in, so it can be waited on from any thread.
#[derive(Debug)]
pub struct HostWatch {
    socket: Socket,
}

/// Why [`HostWatch::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// At least one notification arrived (all pending ones are consumed).
    Changed,
    /// The timeout passed.
    Timeout,
    /// The stop descriptor became readable or was closed.
    Stop,
}

impl HostWatch {
    /// Subscribes to `host`'s address and route notifications.
    pub fn subscribe(host: &Netns) -> Result<HostWatch, TopologyError> {
        let io = |action: &str| {
            let action = action.to_string();
            move |source| TopologyError::Io { action, source }
        };
        host.run(|| {
            let mut socket = Socket::new(NETLINK_ROUTE).map_err(io("open an rtnetlink notification socket"))?;
            socket.bind(&SocketAddr::new(0, HOST_WATCH_GROUPS)).map_err(io("subscribe to address and route notifications"))?;
            socket.set_non_blocking(true).map_err(io("make the notification socket non-blocking"))?;
            Ok(HostWatch { socket })
        })
    }

    /// Waits up to `timeout` for notifications; true if any arrived (every
    /// pending one is consumed). A receive buffer overrun counts as a change.
    pub fn wait_for_change(&self, timeout: Duration) -> Result<bool, TopologyError> {
        Ok(self.wait(Some(timeout), None)? == Wake::Changed)
    }

    fn wait(&self, timeout: Option<Duration>, stop: Option<BorrowedFd<'_>>) -> Result<Wake, TopologyError> {
        let timeout = match timeout {
            None => PollTimeout::NONE,
            Some(timeout) => PollTimeout::from(u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX)),
        };
        let mut fds = vec![PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
        fds.extend(stop.map(|fd| PollFd::new(fd, PollFlags::POLLIN)));
        match poll(&mut fds, timeout) {
            Ok(0) | Err(Errno::EINTR) => return Ok(Wake::Timeout),
            Ok(_) => {}
            Err(errno) => return Err(TopologyError::Namespace { action: "poll the notification socket", errno }),
        }
        if fds.get(1).and_then(PollFd::revents).is_some_and(|events| !events.is_empty()) {
            return Ok(Wake::Stop);
        }
        Ok(if self.drain()? { Wake::Changed } else { Wake::Timeout })
    }

    /// Reads every pending notification; true if there was any.
    fn drain(&self) -> Result<bool, TopologyError> {
        let mut buffer = vec![0u8; 64 * 1024];
        let mut any = false;
        loop {
            match nix::sys::socket::recv(std::os::fd::AsRawFd::as_raw_fd(&self.socket), &mut buffer, MsgFlags::MSG_DONTWAIT) {
                Ok(_) => any = true,
                // Notifications were lost: something changed.
                Err(Errno::ENOBUFS) => any = true,
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return Ok(any),
                Err(errno) => return Err(TopologyError::Namespace { action: "receive address and route notifications", errno }),
            }
        }
    }
}

/// A dedicated thread that keeps a running Domain's policy in step with the
/// host's addresses: on every burst of notifications it calls
/// [`DomainNetwork::refresh_host`] and passes each non-empty update (and
/// each failure) to its report function. It holds the network only as a
/// [`Weak`] (upgraded while an update runs); dropping the watcher stops and
/// joins the thread, after which it holds nothing.
#[derive(Debug)]
pub struct HostWatcher {
    stop: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl HostWatcher {
    /// Subscribes to the notifications of `network`'s host namespace, then
    /// starts the thread, whose first act is one refresh (for whatever
    /// changed between the network's creation and the subscription).
    pub fn start(
        network: &Arc<DomainNetwork>,
        report: impl FnMut(Result<PolicyUpdate, TopologyError>) + Send + 'static,
    ) -> Result<HostWatcher, TopologyError> {
        let watch = HostWatch::subscribe(&network.host)?;
        let (stop_read, stop_write) =
            nix::unistd::pipe().map_err(|errno| TopologyError::Namespace { action: "pipe for the host watcher", errno })?;
        let network = Arc::downgrade(network);
        let thread = std::thread::Builder::new()
            .name("lazaret-host-watch".into())
            .spawn(move || watch_loop(&watch, &network, stop_read, report))
            .map_err(|source| TopologyError::Io { action: "start the host watcher thread".into(), source })?;
        Ok(HostWatcher { stop: Some(stop_write), thread: Some(thread) })
    }

    /// Stops the thread and waits for it (what dropping the watcher does).
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        // Closing the pipe's write end wakes the thread (POLLHUP).
        self.stop = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for HostWatcher {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

fn watch_loop(
    watch: &HostWatch,
    network: &Weak<DomainNetwork>,
    stop: OwnedFd,
    mut report: impl FnMut(Result<PolicyUpdate, TopologyError>),
) {
    loop {
        // Let a burst of notifications end (bounded), then update once.
        for _ in 0..MAX_SETTLES {
            match watch.wait(Some(SETTLE), Some(stop.as_fd())) {
                Ok(Wake::Stop) => return,
                Ok(Wake::Changed) => {}
                Ok(Wake::Timeout) => break,
                Err(error) => report(Err(error)),
            }
        }
        let Some(strong) = network.upgrade() else { return };
        let result = strong.refresh_host();
        drop(strong);
        if !matches!(&result, Ok(update) if update.is_empty()) {
            report(result);
        }
        match watch.wait(None, Some(stop.as_fd())) {
            Ok(Wake::Stop) => return,
            Ok(_) => {}
            Err(error) => {
                report(Err(error));
                // Do not spin on a broken socket.
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Action, PolicyInput, RuleOrigin};
    use crate::prefix::Prefix;

    fn p(text: &str) -> Prefix {
        text.parse().expect("valid test prefix")
    }
    fn ip(text: &str) -> IpAddr {
        text.parse().expect("valid test address")
    }
    fn input(host: &[&str], networks: &[&str]) -> PolicyInput {
        PolicyInput {
            dns: vec![ip("11.22.33.53")],
            ipv6: true,
            host_addresses: host.iter().map(|a| ip(a)).collect(),
            host_networks: networks.iter().map(|n| p(n)).collect(),
            ..PolicyInput::default()
        }
    }
    fn compiled(host: &[&str], networks: &[&str]) -> CompiledPolicy {
        compile(&input(host, networks)).expect("compiles")
    }

    #[test]
    fn a_new_host_address_is_a_new_denial_applied_first() {
        let old = compiled(&["192.168.1.5"], &["192.168.1.0/24"]);
        let new = compiled(&["192.168.1.5", "11.9.9.9", "2a0b:9::9"], &["192.168.1.0/24"]);
        let update = PolicyUpdate::between(&old, &new);
        let added: Vec<(Prefix, Action, RuleOrigin)> = update.added.iter().map(|r| (r.prefix, r.action, r.origin.clone())).collect();
        assert_eq!(
            added,
            vec![(p("11.9.9.9/32"), Action::Deny, RuleOrigin::HostAddress), (p("2a0b:9::9/128"), Action::Deny, RuleOrigin::HostAddress)]
        );
        assert!(update.removed.is_empty() && update.port53_only.is_none());
        assert_eq!(update.to_string(), "+deny 11.9.9.9/32 (default: host address); +deny 2a0b:9::9/128 (default: host address)");
        let plan = RoutePlan::between(&old.routes(), &new.routes());
        assert_eq!(
            plan.deny,
            vec![
                PolicyRoute { prefix: p("11.9.9.9/32"), kind: RouteKind::Unreachable },
                PolicyRoute { prefix: p("2a0b:9::9/128"), kind: RouteKind::Unreachable },
            ]
        );
        assert!(plan.allow.is_empty() && plan.remove.is_empty());
        // Back again: the denial's route is removed, nothing added.
        let back = RoutePlan::between(&new.routes(), &old.routes());
        assert_eq!(back.remove.len(), 2);
        assert!(back.deny.is_empty() && back.allow.is_empty());
        assert_eq!(PolicyUpdate::between(&new, &old).removed.len(), 2);
        assert!(PolicyUpdate::between(&old, &old).is_empty());
        assert_eq!(PolicyUpdate::between(&old, &old).to_string(), "no change");
    }

    #[test]
    fn a_new_on_link_network_limits_a_resolver_inside_it_to_port_53() {
        // A VPN brings 11.22.33.0/24 on link: the resolver in it, fully open
        // before, is now opened by its DNS rule only.
        let old = compiled(&[], &[]);
        let new = compiled(&["11.22.33.7"], &["11.22.33.0/24"]);
        let update = PolicyUpdate::between(&old, &new);
        assert_eq!(update.port53_only, Some(vec![ip("11.22.33.53")]));
        assert!(update.added.iter().any(|r| r.prefix == p("11.22.33.0/24") && r.origin == RuleOrigin::HostNetwork));
        // The resolver's route stays an uplink route: it is in no plan.
        let plan = RoutePlan::between(&old.routes(), &new.routes());
        assert!(!plan.deny.iter().chain(&plan.allow).chain(&plan.remove).any(|r| r.prefix == p("11.22.33.53/32")));
        assert!(update.to_string().ends_with("port-53-only resolvers now [11.22.33.53]"), "{update}");
        assert_eq!(PolicyUpdate::between(&new, &old).port53_only, Some(vec![]));
    }

    #[test]
    fn a_prefix_that_changes_its_verdict_is_replaced_not_removed() {
        let old = PolicyRoute { prefix: p("11.0.0.0/8"), kind: RouteKind::Uplink };
        let new = PolicyRoute { prefix: p("11.0.0.0/8"), kind: RouteKind::Unreachable };
        let plan = RoutePlan::between(&[old], &[new]);
        assert_eq!(plan, RoutePlan { deny: vec![new], allow: vec![], remove: vec![] });
        let plan = RoutePlan::between(&[new], &[old]);
        assert_eq!(plan, RoutePlan { deny: vec![], allow: vec![old], remove: vec![] });
    }
}
