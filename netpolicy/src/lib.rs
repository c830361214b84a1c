//! Lazaret's egress policy and the sidecar network that enforces it.
//!
//! * [`policy`]: the pure compiler from `allow_egress`/`deny_egress`, DNS and
//!   defaults to a longest-prefix table ([`compile`], [`CompiledPolicy::decide`],
//!   [`CompiledPolicy::render_table`] for `lazaret policy show`,
//!   [`CompiledPolicy::explain`] for `lazaret policy explain`).
//! * [`special`]: the IANA special-purpose address blocks the policy denies
//!   by default, one table naming the registry and the RFC of each row.
//! * [`names`]: the name rules of locked mode (`egress = "locked"`):
//!   names, `*.` wildcards, optional ports, and which rule decides a name.
//! * [`dnswire`] and [`resolver`]: the DNS messages of the locked-mode
//!   resolver and its decisions (refuse, forward, which addresses an answer
//!   opens for how long), without I/O.
//! * [`dns`]: the Domain's resolvers from config or the host's resolv.conf, and
//!   the sandbox's `/etc/resolv.conf`.
//! * [`topology`]: per Domain a sandbox netns and a sidecar (router) netns with
//!   the policy as routes, an uplink to the host, host-side forwarding and
//!   source NAT over netlink, read-back verification and crash recovery;
//!   [`topology::debug_view`] prints a namespace's links, addresses, routes
//!   and rules like `ip` does, for `lazaret debug`.
//!
//! Start-up order for the coordinator (OrderedNetworkStartup):
//! [`topology::remove_stale`] with the Sidecar IDs of Domains still alive →
//! [`topology::DomainNetwork::create`] (builds, installs and verifies) → write
//! [`sandbox_resolv_conf`] into the sandbox → before every runsc start
//! [`topology::DomainNetwork::readdress_sandbox`] and
//! [`topology::DomainNetwork::verify_installed`] → runsc with the sandbox
//! namespace's [`topology::Netns::proc_path`] → while the Domain runs, a
//! [`topology::HostWatcher`] (the host's address and route notifications →
//! [`topology::DomainNetwork::refresh_host`], so an address the host gains
//! is denied within milliseconds), dropped before →
//! [`topology::DomainNetwork::teardown`].

#![forbid(unsafe_code)]

pub mod dns;
pub mod dnswire;
pub mod names;
pub mod policy;
pub mod prefix;
pub mod resolver;
pub mod special;
mod sys;
pub mod topology;

pub use dns::{DnsError, resolvers_from_resolv_conf, sandbox_resolv_conf};
pub use names::{NameError, NamePattern, NamePolicy, NameRule, NameVerdict, Ports, parse_name_rule};
pub use policy::{
    Action, CompiledPolicy, PolicyError, PolicyInput, PolicyProblem, PolicyRoute, RouteKind, Rule, RuleOrigin, Verdict, compile,
    parse_prefixes,
};
pub use prefix::{Prefix, PrefixError};
