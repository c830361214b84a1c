//! Lazaret's egress policy: a pure compiler from configuration to a
//! longest-prefix table ([`policy`]), DNS resolver selection ([`dns`]), and the
//! per-Domain sidecar network topology that enforces the table ([`topology`]).

pub mod dns;
pub mod policy;
pub mod prefix;
pub mod topology;

pub use dns::{DnsError, resolvers_from_resolv_conf, sandbox_resolv_conf};
pub use policy::{
    Action, CompiledPolicy, PolicyError, PolicyInput, PolicyProblem, PolicyRoute, RouteKind, Rule, RuleOrigin,
    Verdict, compile, parse_prefixes,
};
pub use prefix::{Prefix, PrefixError};
