//! The egress policy compiler: configuration + defaults -> a longest-prefix table.
//!
//! # Semantics
//!
//! * Every destination is decided by the rule with the **longest prefix** that
//!   contains it. Each family always has a `/0` rule, so every address gets a verdict.
//! * Defaults: `0.0.0.0/0` (and, with IPv6, `::/0`) allowed; every block the
//!   IANA special-purpose registries mark as not globally reachable denied
//!   ([`crate::special`]: RFC 1918, CGNAT `100.64/10`, link-local `169.254/16`
//!   (cloud metadata), documentation, benchmarking, multicast, reserved, ULA,
//!   IPv6 link-local, ...), with IPv6 also the IPv4 denials inside the NAT64
//!   prefix `64:ff9b::/96`; the host's own addresses and on-link networks (its
//!   LAN: the prefixes of its addresses and on-link routes, unless a
//!   special-purpose block already covers them), the Domain's transit/uplink
//!   addresses and other Domains' addresses denied. When IPv6 is disabled the
//!   IPv6 table holds a single `::/0` deny, so no IPv6 traffic leaves.
//! * Rows the registries mark globally reachable inside a denied block
//!   (`192.0.0.9/32` in `192.0.0.0/24`, the `2001::/23` exceptions) are no
//!   defaults of their own: they take the verdict of the longest rule around
//!   them that is not a special-purpose default (normally `0.0.0.0/0`; in
//!   allow-list mode the config's `deny 0.0.0.0/0`).
//! * Configuration rules (`allow_egress`, `deny_egress`) on a prefix **equal** to a
//!   default replace that default: `allow 10.0.0.0/8` is the explicit allow that
//!   opens RFC 1918's 10/8, `deny 0.0.0.0/0` turns the Domain into allow-list mode.
//!   More-specific config rules simply win by longest prefix.
//! * Two config rules on the same prefix are an error: allow+deny is a conflict
//!   naming both locations; the same prefix listed twice is a duplicate error.
//! * DNS resolvers get host routes (`/32`, `/128`) allowed, even inside denied
//!   ranges, and beat a default deny on the same host prefix (e.g. a resolver that
//!   is a host address). A config `deny` of exactly a resolver's host prefix is a
//!   conflict error. Routes cannot match ports, so a resolver the policy would
//!   otherwise deny (origin [`RuleOrigin::DnsPort53`], e.g. the LAN router) is
//!   opened by its route for the whole address, and the sidecar's packet filter
//!   narrows it to UDP and TCP port 53 ([`CompiledPolicy::port53_only_resolvers`]).
//!   An allow from the configuration that covers the resolver opens it fully.
//! * Among defaults on an equal prefix, deny wins.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crate::names::{NamePolicy, NameRule};
use crate::prefix::{Prefix, PrefixError};
use crate::special::{self, SpecialBlock};

/// What happens to traffic towards a prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Forwarded out of the Domain's uplink.
    Allow,
    /// Rejected in the sidecar (`unreachable` route).
    Deny,
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
        })
    }
}

/// Why a rule is in the table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum RuleOrigin {
    /// A built-in default; the text names it (e.g. "public IPv4").
    Default(&'static str),
    /// A block the IANA special-purpose registries mark as not globally reachable.
    Special(&'static SpecialBlock),
    /// A globally reachable registry row inside a denied block: it takes the
    /// verdict of the rules around the special-purpose blocks.
    SpecialReachable(&'static SpecialBlock),
    /// A denied IPv4 block inside the NAT64 prefix `64:ff9b::/96`.
    Nat64(&'static SpecialBlock),
    /// An `allow_egress` / `deny_egress` entry; the text is its config location.
    Config(String),
    /// Reachability for one of the Domain's DNS resolvers.
    Dns,
    /// Reachability for a DNS resolver the policy would otherwise deny: the
    /// sidecar's filter lets only UDP and TCP port 53 through to it.
    DnsPort53,
    /// One of the host's own addresses.
    HostAddress,
    /// One of the host's on-link networks (its LAN).
    HostNetwork,
    /// The Domain's own transit or uplink addresses.
    DomainTransit,
    /// Address space of other Domains (the Lazaret address pool).
    OtherDomain,
    /// IPv6 is disabled for this Domain.
    Ipv6Disabled,
    /// Locked mode (`egress = "locked"`): an address the routes would allow
    /// is reachable only while a name rule's answer holds it (or through an
    /// `allow_egress` prefix).
    Locked,
}

impl fmt::Display for RuleOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleOrigin::Default(what) => write!(f, "default: {what}"),
            RuleOrigin::Special(block) => write!(f, "default: {} {} ({})", block.rfc, block.name, block.registry),
            RuleOrigin::SpecialReachable(block) => {
                write!(f, "default: {} {}, globally reachable inside a denied block ({})", block.rfc, block.name, block.registry)
            }
            RuleOrigin::Nat64(block) => {
                write!(f, "default: {} {} inside the NAT64 prefix {} (RFC 6052)", block.rfc, block.name, special::NAT64_PREFIX)
            }
            RuleOrigin::Config(location) => write!(f, "config: {location}"),
            RuleOrigin::Dns => f.write_str("DNS resolver"),
            RuleOrigin::DnsPort53 => f.write_str(
                "DNS resolver, UDP/TCP port 53 only (the address is otherwise denied; an allow_egress entry covering it opens it fully)",
            ),
            RuleOrigin::Locked => f.write_str(
                "locked mode: reachable only as an address an allowed name resolved to, while its answer lasts, or through an allow_egress prefix",
            ),
            RuleOrigin::HostAddress => f.write_str("default: host address"),
            RuleOrigin::HostNetwork => f.write_str("default: the host's on-link network (LAN)"),
            RuleOrigin::DomainTransit => f.write_str("default: Domain transit/uplink address"),
            RuleOrigin::OtherDomain => f.write_str("default: other Domains (Lazaret pool)"),
            RuleOrigin::Ipv6Disabled => f.write_str("IPv6 disabled for this Domain (ipv6 = false)"),
        }
    }
}

/// One row of the compiled table.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Rule {
    /// Destination prefix.
    pub prefix: Prefix,
    /// Verdict for destinations whose longest match is this rule.
    pub action: Action,
    /// Where the rule came from.
    pub origin: RuleOrigin,
}

/// Everything the compiler needs. The config parser fills `allow`, `deny`,
/// `dns` and `ipv6`; the topology fills the host/Domain address fields.
#[derive(Debug, Clone, Default)]
pub struct PolicyInput {
    /// `allow_egress` prefixes with their config locations ("file:line:col").
    pub allow: Vec<(Prefix, String)>,
    /// `deny_egress` prefixes with their config locations.
    pub deny: Vec<(Prefix, String)>,
    /// The Domain's DNS resolvers (see [`crate::dns`]).
    pub dns: Vec<IpAddr>,
    /// Whether IPv6 is policed (true) or disabled (false) for the Domain.
    pub ipv6: bool,
    /// The host's own addresses (denied unless explicitly allowed).
    pub host_addresses: Vec<IpAddr>,
    /// The host's on-link networks: the prefixes of its addresses and
    /// on-link routes (denied unless explicitly allowed, like RFC 1918).
    pub host_networks: Vec<Prefix>,
    /// The Domain's own transit/uplink addresses that the sandbox must not reach.
    pub own_addresses: Vec<Prefix>,
    /// Address space of other Domains (typically the whole Lazaret pool).
    pub other_domains: Vec<Prefix>,
    /// Locked mode (`egress = "locked"`): only what `allow` and `names` name
    /// is reachable; open mode (false) allows the public internet.
    pub locked: bool,
    /// The name entries of `allow_egress` (locked mode only).
    pub names: Vec<NameRule>,
}

/// One thing wrong with a policy input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyProblem {
    /// A prefix in the configuration does not parse.
    #[error("{location}: {error}")]
    InvalidPrefix {
        /// Config location of the entry.
        location: String,
        /// The parse error.
        error: PrefixError,
    },
    /// The same prefix is both allowed and denied.
    #[error("{prefix} is both allowed (allow_egress at {allow_location}) and denied (deny_egress at {deny_location}); remove one of them")]
    Conflict {
        /// The contested prefix.
        prefix: Prefix,
        /// Location of the allow entry.
        allow_location: String,
        /// Location of the deny entry.
        deny_location: String,
    },
    /// The same prefix is listed twice in one list.
    #[error("{prefix} is listed twice in {list} (at {first_location} and {second_location}); remove one of them")]
    Duplicate {
        /// The repeated prefix.
        prefix: Prefix,
        /// `allow_egress` or `deny_egress`.
        list: &'static str,
        /// Location of the first entry.
        first_location: String,
        /// Location of the second entry.
        second_location: String,
    },
    /// An IPv6 allow entry while IPv6 is disabled for the Domain.
    #[error(
        "{location}: {prefix} is an IPv6 allow entry but IPv6 is disabled for this Domain (ipv6 = false); remove it or set ipv6 = true"
    )]
    FamilyDisabled {
        /// The IPv6 prefix.
        prefix: Prefix,
        /// Its config location.
        location: String,
    },
    /// A DNS resolver's exact host prefix is denied by configuration.
    #[error("DNS resolver {resolver} is denied by deny_egress at {deny_location}; remove that entry or choose other resolvers in `dns`")]
    ResolverDenied {
        /// The resolver.
        resolver: IpAddr,
        /// Location of the deny entry.
        deny_location: String,
    },
    /// A name entry in `allow_egress` while the profile's egress is open.
    #[error(
        "{location}: {rule} is a DNS name, but names are only allowed with egress = \"locked\" (open mode already allows every public address); set egress = \"locked\" in the profile or write the destination as a prefix such as \"192.0.2.0/24\""
    )]
    NameNeedsLocked {
        /// The rule as written.
        rule: String,
        /// Its config location.
        location: String,
    },
    /// The same name rule (pattern and port) twice.
    #[error("{rule} is listed twice in allow_egress (at {first_location} and {second_location}); remove one of them")]
    DuplicateName {
        /// The rule.
        rule: String,
        /// Location of the first entry.
        first_location: String,
        /// Location of the second entry.
        second_location: String,
    },
    /// A DNS resolver the sandbox cannot use.
    #[error("DNS resolver {resolver} cannot be used by the sandbox: {reason}")]
    ResolverUnusable {
        /// The resolver.
        resolver: IpAddr,
        /// Why.
        reason: &'static str,
    },
}

/// All the problems found in one policy input (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid egress policy:{}", .problems.iter().map(|p| format!("\n  - {p}")).collect::<String>())]
pub struct PolicyError {
    /// Every problem, in input order.
    pub problems: Vec<PolicyProblem>,
}

/// Parses config prefix strings, collecting every invalid one with its location.
///
/// `entries` are `(text, location)` pairs as read from the configuration.
pub fn parse_prefixes(entries: &[(&str, &str)]) -> Result<Vec<(Prefix, String)>, PolicyError> {
    let mut parsed = Vec::new();
    let mut problems = Vec::new();
    for (text, location) in entries {
        match text.parse::<Prefix>() {
            Ok(prefix) => parsed.push((prefix, (*location).to_string())),
            Err(error) => problems.push(PolicyProblem::InvalidPrefix { location: (*location).to_string(), error }),
        }
    }
    if problems.is_empty() { Ok(parsed) } else { Err(PolicyError { problems }) }
}

/// The verdict for one destination and the rule that decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Allow or deny.
    pub action: Action,
    /// The longest-prefix rule that matched.
    pub rule: Rule,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (rule {} {}, {})", self.action, self.rule.action, self.rule.prefix, self.rule.origin)
    }
}

/// The compiled, conflict-free table: at most one rule per prefix.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CompiledPolicy {
    /// Rules sorted IPv4 first, then by descending prefix length, then address.
    rules: Vec<Rule>,
    /// The DNS resolvers the sandbox's resolv.conf names.
    resolvers: Vec<IpAddr>,
    /// Whether IPv6 is policed (true) or disabled (false).
    ipv6: bool,
    /// Locked mode: see [`PolicyInput::locked`].
    locked: bool,
    /// The name rules (locked mode).
    names: NamePolicy,
}

fn default_rules(input: &PolicyInput) -> Vec<Rule> {
    let policed = |prefix: &Prefix| input.ipv6 || prefix.is_v4();
    let mut rules = vec![Rule { prefix: Prefix::any(true), action: Action::Allow, origin: RuleOrigin::Default("public IPv4") }];
    let denied4 = special::outermost_denied(true);
    rules.extend(denied4.iter().map(|(prefix, block)| Rule { prefix: *prefix, action: Action::Deny, origin: RuleOrigin::Special(block) }));
    let mut denied = denied4.clone();
    if input.ipv6 {
        rules.push(Rule { prefix: Prefix::any(false), action: Action::Allow, origin: RuleOrigin::Default("public IPv6") });
        let denied6 = special::outermost_denied(false);
        rules.extend(denied6.iter().map(|(prefix, block)| Rule {
            prefix: *prefix,
            action: Action::Deny,
            origin: RuleOrigin::Special(block),
        }));
        rules.extend(denied4.iter().filter_map(|(prefix, block)| {
            Some(Rule { prefix: special::nat64(prefix)?, action: Action::Deny, origin: RuleOrigin::Nat64(block) })
        }));
        denied.extend(denied6);
    } else {
        rules.push(Rule { prefix: Prefix::any(false), action: Action::Deny, origin: RuleOrigin::Ipv6Disabled });
    }
    for address in &input.host_addresses {
        let prefix = Prefix::host(*address);
        if policed(&prefix) {
            rules.push(Rule { prefix, action: Action::Deny, origin: RuleOrigin::HostAddress });
        }
    }
    // A LAN inside a special-purpose block (192.168.1.0/24) is denied by
    // that block already, and stays open to an explicit allow of the block.
    for prefix in input.host_networks.iter().filter(|p| policed(p) && p.prefix_len() > 0) {
        if !denied.iter().any(|(block, _)| block.covers(prefix)) {
            rules.push(Rule { prefix: *prefix, action: Action::Deny, origin: RuleOrigin::HostNetwork });
        }
    }
    for prefix in input.own_addresses.iter().filter(|p| policed(p)) {
        rules.push(Rule { prefix: *prefix, action: Action::Deny, origin: RuleOrigin::DomainTransit });
    }
    for prefix in input.other_domains.iter().filter(|p| policed(p)) {
        rules.push(Rule { prefix: *prefix, action: Action::Deny, origin: RuleOrigin::OtherDomain });
    }
    rules
}

/// The longest rule in `table` that covers `prefix` (itself excluded) and
/// that `eligible` accepts.
fn longest_covering<'t>(table: &'t BTreeMap<Prefix, Rule>, prefix: &Prefix, eligible: impl Fn(&Rule) -> bool) -> Option<&'t Rule> {
    table
        .values()
        .filter(|rule| rule.prefix != *prefix && rule.prefix.covers(prefix) && eligible(rule))
        .max_by_key(|rule| rule.prefix.prefix_len())
}

/// Compiles configuration and defaults into a table; reports every problem at once.
pub fn compile(input: &PolicyInput) -> Result<CompiledPolicy, PolicyError> {
    let mut problems = Vec::new();

    // Config rules: at most one per prefix; allow+deny is a conflict.
    let mut config: BTreeMap<Prefix, (Action, String)> = BTreeMap::new();
    let lists = [(Action::Allow, "allow_egress", &input.allow), (Action::Deny, "deny_egress", &input.deny)];
    for (action, list, entries) in lists {
        for (prefix, location) in entries.iter() {
            if action == Action::Allow && !input.ipv6 && !prefix.is_v4() {
                problems.push(PolicyProblem::FamilyDisabled { prefix: *prefix, location: location.clone() });
                continue;
            }
            match config.get(prefix) {
                None => {
                    config.insert(*prefix, (action, location.clone()));
                }
                Some((existing, first)) if *existing == action => problems.push(PolicyProblem::Duplicate {
                    prefix: *prefix,
                    list,
                    first_location: first.clone(),
                    second_location: location.clone(),
                }),
                Some((_, allow_location)) => problems.push(PolicyProblem::Conflict {
                    prefix: *prefix,
                    allow_location: allow_location.clone(),
                    deny_location: location.clone(),
                }),
            }
        }
    }

    // Name rules: locked mode only, each (pattern, port) once.
    let mut names: Vec<NameRule> = Vec::new();
    for rule in &input.names {
        if !input.locked {
            problems.push(PolicyProblem::NameNeedsLocked { rule: rule.to_string(), location: rule.origin.clone() });
        } else if let Some(first) = names.iter().find(|n| n.pattern == rule.pattern && n.port == rule.port) {
            problems.push(PolicyProblem::DuplicateName {
                rule: rule.to_string(),
                first_location: first.origin.clone(),
                second_location: rule.origin.clone(),
            });
        } else {
            names.push(rule.clone());
        }
    }

    // DNS resolvers: host routes, allowed.
    let mut resolvers: Vec<IpAddr> = Vec::new();
    for resolver in &input.dns {
        let unusable = |reason| PolicyProblem::ResolverUnusable { resolver: *resolver, reason };
        if resolver.is_loopback() {
            problems.push(unusable("a loopback address is the sandbox's own, not the host's; set `dns` to the upstream resolvers"));
        } else if resolver.is_unspecified() || resolver.is_multicast() {
            problems.push(unusable("not a unicast address"));
        } else if resolver.is_ipv6() && !input.ipv6 {
            problems.push(unusable("IPv6 is disabled for this Domain (ipv6 = false); use IPv4 resolvers in `dns` or set ipv6 = true"));
        } else if let Some((Action::Deny, location)) = config.get(&Prefix::host(*resolver)) {
            problems.push(PolicyProblem::ResolverDenied { resolver: *resolver, deny_location: location.clone() });
        } else if !resolvers.contains(resolver) {
            resolvers.push(*resolver);
        }
    }
    if !problems.is_empty() {
        return Err(PolicyError { problems });
    }

    // Precedence on an equal prefix: config > DNS > defaults (deny first among defaults).
    let mut table: BTreeMap<Prefix, Rule> = BTreeMap::new();
    for rule in default_rules(input) {
        match table.get(&rule.prefix) {
            Some(existing) if existing.action == Action::Deny || rule.action == Action::Allow => {}
            _ => {
                table.insert(rule.prefix, rule);
            }
        }
    }
    for resolver in &resolvers {
        let prefix = Prefix::host(*resolver);
        table.insert(prefix, Rule { prefix, action: Action::Allow, origin: RuleOrigin::Dns });
    }
    for (prefix, (action, location)) in config {
        table.insert(prefix, Rule { prefix, action, origin: RuleOrigin::Config(location) });
    }
    // Globally reachable rows inside denied blocks: the verdict of the rules
    // around the special-purpose blocks (config ones included).
    let families: &[bool] = if input.ipv6 { &[true, false] } else { &[true] };
    for v4 in families {
        for (prefix, block) in special::reachable_inside_denied(*v4) {
            if table.contains_key(&prefix) {
                continue;
            }
            let outside = |rule: &Rule| !matches!(rule.origin, RuleOrigin::Special(_) | RuleOrigin::Nat64(_));
            let action = longest_covering(&table, &prefix, outside).map_or(Action::Deny, |rule| rule.action);
            table.insert(prefix, Rule { prefix, action, origin: RuleOrigin::SpecialReachable(block) });
        }
    }
    // A resolver that only its DNS rule opens gets port 53 only (in the sidecar's filter).
    for resolver in &resolvers {
        let prefix = Prefix::host(*resolver);
        let without_dns = longest_covering(&table, &prefix, |_| true).map_or(Action::Deny, |rule| rule.action);
        if let Some(rule) = table.get_mut(&prefix) {
            if rule.origin == RuleOrigin::Dns && without_dns == Action::Deny {
                rule.origin = RuleOrigin::DnsPort53;
            }
        }
    }

    let mut rules: Vec<Rule> = table.into_values().collect();
    rules.sort_by(|a, b| {
        (!a.prefix.is_v4(), std::cmp::Reverse(a.prefix.prefix_len()), a.prefix.network()).cmp(&(
            !b.prefix.is_v4(),
            std::cmp::Reverse(b.prefix.prefix_len()),
            b.prefix.network(),
        ))
    });
    Ok(CompiledPolicy { rules, resolvers, ipv6: input.ipv6, locked: input.locked, names: NamePolicy::new(names) })
}

/// How the sidecar routes one prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteKind {
    /// Via the uplink gateway.
    Uplink,
    /// An `unreachable` route (no output interface).
    Unreachable,
}

/// One route the sidecar must carry in its main table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyRoute {
    /// Destination.
    pub prefix: Prefix,
    /// Where it goes.
    pub kind: RouteKind,
}

impl CompiledPolicy {
    /// All rules, IPv4 first, longest prefix first.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The resolvers the sandbox may use, in order, without duplicates.
    pub fn resolvers(&self) -> &[IpAddr] {
        &self.resolvers
    }

    /// The resolvers the policy would deny but for their DNS rule: the
    /// sidecar's filter lets only UDP and TCP port 53 through to them.
    pub fn port53_only_resolvers(&self) -> Vec<IpAddr> {
        self.rules.iter().filter(|rule| rule.origin == RuleOrigin::DnsPort53).map(|rule| rule.prefix.network()).collect()
    }

    /// Whether IPv6 is policed (true) or disabled entirely (false).
    pub fn ipv6_enabled(&self) -> bool {
        self.ipv6
    }

    /// The longest-prefix verdict for `address`.
    pub fn decide(&self, address: IpAddr) -> Verdict {
        // Rules are sorted longest first per family, so the first hit is the longest.
        let rule = self.rules.iter().find(|rule| rule.prefix.contains(address)).cloned().unwrap_or_else(|| {
            // Unreachable by construction (each family has a /0 rule); fail closed anyway.
            Rule { prefix: Prefix::any(address.is_ipv4()), action: Action::Deny, origin: RuleOrigin::Default("no rule") }
        });
        if self.locked && rule.action == Action::Allow && !matches!(rule.origin, RuleOrigin::Config(_)) {
            let rule = Rule { prefix: rule.prefix, action: Action::Deny, origin: RuleOrigin::Locked };
            return Verdict { action: Action::Deny, rule };
        }
        Verdict { action: rule.action, rule }
    }

    /// Whether the Domain is locked down (`egress = "locked"`).
    pub fn locked(&self) -> bool {
        self.locked
    }

    /// The name rules (empty in open mode).
    pub fn names(&self) -> &NamePolicy {
        &self.names
    }

    /// The `allow_egress` prefixes: in locked mode the only destinations
    /// open without a name (the routes still decide inside them).
    pub fn allowed_prefixes(&self) -> Vec<Prefix> {
        self.rules
            .iter()
            .filter(|rule| rule.action == Action::Allow && matches!(rule.origin, RuleOrigin::Config(_)))
            .map(|rule| rule.prefix)
            .collect()
    }

    /// The routes the sidecar needs, one per rule, sorted.
    pub fn routes(&self) -> Vec<PolicyRoute> {
        let mut routes: Vec<PolicyRoute> = self
            .rules
            .iter()
            .map(|rule| PolicyRoute {
                prefix: rule.prefix,
                kind: match rule.action {
                    Action::Allow => RouteKind::Uplink,
                    Action::Deny => RouteKind::Unreachable,
                },
            })
            .collect();
        routes.sort();
        routes
    }

    /// A human-readable table for `lazaret policy show`.
    pub fn render_table(&self) -> String {
        let width = self.rules.iter().map(|r| r.prefix.to_string().len()).max().unwrap_or(6).max(6);
        let mut out = format!("{:<width$}  {:<6}  ORIGIN\n", "PREFIX", "ACTION");
        for rule in &self.rules {
            // Locked: what the routes allow is open only to resolved names' addresses.
            let action = if self.locked && rule.action == Action::Allow && !matches!(rule.origin, RuleOrigin::Config(_)) {
                "names".to_string()
            } else {
                rule.action.to_string()
            };
            out.push_str(&format!("{:<width$}  {:<6}  {}\n", rule.prefix.to_string(), action, rule.origin));
        }
        let resolvers: Vec<String> = self.resolvers.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "DNS resolvers: {}\nIPv6: {}\n",
            if resolvers.is_empty() { "(none)".to_string() } else { resolvers.join(", ") },
            if self.ipv6 { "policed" } else { "disabled (all of ::/0 denied)" }
        ));
        if self.locked {
            out.push_str("Egress: locked (rows marked `names` are reachable only at the addresses the names below resolve to, while their answers last; the sandbox's resolver is Lazaret's, in the sidecar)\n");
            if self.names.rules().is_empty() {
                out.push_str("Names: (none: no name resolves)\n");
            } else {
                let width = self.names.rules().iter().map(|r| r.to_string().len()).max().unwrap_or(4).max(4);
                out.push_str(&format!("{:<width$}  ORIGIN\n", "NAME"));
                for rule in self.names.rules() {
                    out.push_str(&format!("{:<width$}  config: {}\n", rule.to_string(), rule.origin));
                }
            }
        } else {
            out.push_str("Egress: open (public addresses allowed, private and special-purpose ranges denied)\n");
        }
        out
    }

    /// A one-line explanation for `lazaret policy explain`.
    pub fn explain(&self, address: IpAddr) -> String {
        let verdict = self.decide(address);
        format!("{address}: {verdict}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Prefix {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }
    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }
    fn entries(list: &[(&str, &str)]) -> Vec<(Prefix, String)> {
        list.iter().map(|(prefix, location)| (p(prefix), location.to_string())).collect()
    }
    fn base() -> PolicyInput {
        PolicyInput { dns: vec![ip("10.0.2.3")], ..PolicyInput::default() }
    }
    fn verdict(policy: &CompiledPolicy, address: &str) -> (Action, RuleOrigin, Prefix) {
        let v = policy.decide(ip(address));
        assert_eq!(v.action, v.rule.action);
        (v.action, v.rule.origin, v.rule.prefix)
    }
    fn compile_ok(input: &PolicyInput) -> CompiledPolicy {
        compile(input).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn ipv4_defaults() {
        let policy = compile_ok(&base());
        assert_eq!(verdict(&policy, "11.0.0.1"), (Action::Allow, RuleOrigin::Default("public IPv4"), p("0.0.0.0/0")));
        for (address, prefix) in [("10.1.1.1", "10.0.0.0/8"), ("172.20.0.1", "172.16.0.0/12"), ("192.168.1.1", "192.168.0.0/16")] {
            let (action, origin, found) = verdict(&policy, address);
            assert_eq!((action, found), (Action::Deny, p(prefix)));
            assert!(matches!(origin, RuleOrigin::Special(block) if block.rfc == "RFC 1918"), "{origin:?}");
        }
        assert_eq!(verdict(&policy, "169.254.169.254").0, Action::Deny);
        assert_eq!(verdict(&policy, "172.32.0.1").0, Action::Allow);
        assert_eq!(verdict(&policy, "11.0.0.1").0, Action::Allow);
    }

    #[test]
    fn special_purpose_blocks_are_denied_by_default() {
        let mut input = base();
        input.ipv6 = true;
        let policy = compile_ok(&input);
        for (address, block, rfc) in [
            ("0.1.2.3", "0.0.0.0/8", "RFC 791"),
            ("100.64.0.1", "100.64.0.0/10", "RFC 6598"),
            ("100.127.255.254", "100.64.0.0/10", "RFC 6598"),
            ("127.0.0.1", "127.0.0.0/8", "RFC 1122"),
            ("192.0.0.8", "192.0.0.0/24", "RFC 6890"),
            ("192.0.2.1", "192.0.2.0/24", "RFC 5737"),
            ("192.88.99.2", "192.88.99.0/24", "RFC 7526"),
            ("198.18.0.1", "198.18.0.0/15", "RFC 2544"),
            ("198.19.255.1", "198.18.0.0/15", "RFC 2544"),
            ("198.51.100.1", "198.51.100.0/24", "RFC 5737"),
            ("203.0.113.1", "203.0.113.0/24", "RFC 5737"),
            ("224.0.0.251", "224.0.0.0/4", "RFC 5771"),
            ("239.255.255.250", "224.0.0.0/4", "RFC 5771"),
            ("240.0.0.1", "240.0.0.0/4", "RFC 1112"),
            ("255.255.255.255", "240.0.0.0/4", "RFC 1112"),
            ("::", "::/128", "RFC 4291"),
            ("::1", "::1/128", "RFC 4291"),
            ("64:ff9b:1::1", "64:ff9b:1::/48", "RFC 8215"),
            ("100::1", "100::/64", "RFC 6666"),
            ("2001::1", "2001::/23", "RFC 2928"),
            ("2001:2::1", "2001::/23", "RFC 2928"),
            ("2001:1::4", "2001::/23", "RFC 2928"),
            ("2001:db8::1", "2001:db8::/32", "RFC 3849"),
            ("2002:a00:1::1", "2002::/16", "RFC 3056"),
            ("3fff::1", "3fff::/20", "RFC 9637"),
            ("5f00::1", "5f00::/16", "RFC 9602"),
            ("fd00::1", "fc00::/7", "RFC 4193"),
            ("fe80::1", "fe80::/10", "RFC 4291"),
            ("fec0::1", "fec0::/10", "RFC 3879"),
            ("ff02::1", "ff00::/8", "RFC 4291"),
        ] {
            let (action, origin, prefix) = verdict(&policy, address);
            assert_eq!((action, prefix), (Action::Deny, p(block)), "{address}");
            assert!(matches!(origin, RuleOrigin::Special(row) if row.rfc == rfc), "{address}: {origin:?}");
        }
        // Just outside the blocks, and the globally reachable special blocks.
        for address in [
            "100.63.255.255",
            "100.128.0.0",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "192.31.196.1",
            "192.175.48.1",
            "2620:4f:8000::1",
            "2001:200::1",
            "3fff:1000::1",
            "2a00:1450::1",
            "64:ff9b::808:808",
        ] {
            assert_eq!(verdict(&policy, address).0, Action::Allow, "{address}");
        }
        assert_eq!(
            policy.decide(ip("100.64.0.1")).rule.origin.to_string(),
            "default: RFC 6598 shared address space: carrier-grade NAT, Tailscale (IANA special-purpose)"
        );
    }

    #[test]
    fn nat64_embeddings_of_denied_ipv4_blocks_are_denied() {
        let mut input = base();
        input.ipv6 = true;
        let policy = compile_ok(&input);
        for (address, block) in [
            ("64:ff9b::a00:1", "64:ff9b::a00:0/104"),
            ("64:ff9b::a9fe:a9fe", "64:ff9b::a9fe:0/112"),
            ("64:ff9b::6440:1", "64:ff9b::6440:0/106"),
        ] {
            let (action, origin, prefix) = verdict(&policy, address);
            assert_eq!((action, prefix), (Action::Deny, p(block)), "{address}");
            assert!(matches!(origin, RuleOrigin::Nat64(_)), "{address}: {origin:?}");
        }
        assert!(policy.explain(ip("64:ff9b::a00:1")).contains("RFC 1918 private-use inside the NAT64 prefix 64:ff9b::/96 (RFC 6052)"));
        // Without IPv6 there is nothing to embed into.
        assert!(!compile_ok(&base()).rules().iter().any(|rule| matches!(rule.origin, RuleOrigin::Nat64(_))));
    }

    #[test]
    fn globally_reachable_rows_inside_denied_blocks_follow_the_public_verdict() {
        let mut input = base();
        input.ipv6 = true;
        let policy = compile_ok(&input);
        for address in ["192.0.0.9", "192.0.0.10", "2001:1::1", "2001:1::3", "2001:3::1", "2001:4:112::1", "2001:20::1", "2001:3f::1"] {
            let (action, origin, _) = verdict(&policy, address);
            assert_eq!(action, Action::Allow, "{address}");
            assert!(matches!(origin, RuleOrigin::SpecialReachable(_)), "{address}: {origin:?}");
        }
        assert!(
            policy.explain(ip("192.0.0.9")).contains("RFC 7723 Port Control Protocol anycast, globally reachable inside a denied block")
        );
        // Allow-list mode covers them too: they inherit the config's deny, not an allow of their own.
        let mut allow_list = input.clone();
        allow_list.deny = entries(&[("0.0.0.0/0", "c:1:1"), ("::/0", "c:1:2")]);
        let policy = compile_ok(&allow_list);
        for address in ["192.0.0.9", "2001:1::1", "2001:20::1"] {
            assert_eq!(verdict(&policy, address).0, Action::Deny, "{address}");
        }
        // A config rule between the block and the row is what they inherit.
        let mut denied_around = input.clone();
        denied_around.allow = entries(&[("192.0.0.0/24", "c:1:1")]);
        denied_around.deny = entries(&[("2001::/16", "c:2:1")]);
        let policy = compile_ok(&denied_around);
        assert_eq!(verdict(&policy, "192.0.0.9").0, Action::Allow);
        assert_eq!(verdict(&policy, "192.0.0.200"), (Action::Allow, RuleOrigin::Config("c:1:1".into()), p("192.0.0.0/24")));
        assert_eq!(verdict(&policy, "2001:1::1").0, Action::Deny);
    }

    #[test]
    fn explicit_allow_opens_special_purpose_blocks() {
        let mut input = base();
        input.ipv6 = true;
        for (allowed, probe) in [
            ("100.64.0.0/10", "100.100.1.1"),
            ("100.100.0.0/16", "100.100.1.1"),
            ("198.18.0.0/15", "198.18.7.7"),
            ("240.0.0.0/4", "240.1.1.1"),
            ("192.0.0.0/24", "192.0.0.8"),
            ("224.0.0.251/32", "224.0.0.251"),
            ("fd7a:115c:a1e0::/48", "fd7a:115c:a1e0::1"),
            ("2001:db8::/32", "2001:db8::1"),
            ("64:ff9b::a00:0/104", "64:ff9b::a00:1"),
        ] {
            assert_eq!(compile_ok(&input).decide(ip(probe)).action, Action::Deny, "{probe} denied by default");
            let mut with_allow = input.clone();
            with_allow.allow = entries(&[(allowed, "c.toml:1:1")]);
            let after = compile_ok(&with_allow);
            let v = after.decide(ip(probe));
            assert_eq!((v.action, v.rule.origin), (Action::Allow, RuleOrigin::Config("c.toml:1:1".into())), "{allowed}");
            assert_eq!(after.rules().iter().filter(|r| r.prefix == p(allowed)).count(), 1, "{allowed} replaced, not duplicated");
        }
    }

    #[test]
    fn host_networks_are_denied_like_rfc_1918() {
        let mut input = base();
        input.ipv6 = true;
        input.host_networks = vec![p("2a02:8070:1:2::/64"), p("192.168.1.0/24"), p("11.22.33.0/24"), p("fe80::/64"), p("::/0")];
        let policy = compile_ok(&input);
        assert_eq!(verdict(&policy, "2a02:8070:1:2::77"), (Action::Deny, RuleOrigin::HostNetwork, p("2a02:8070:1:2::/64")));
        assert_eq!(verdict(&policy, "2a02:8070:1:3::77").0, Action::Allow);
        assert_eq!(verdict(&policy, "11.22.33.44"), (Action::Deny, RuleOrigin::HostNetwork, p("11.22.33.0/24")));
        // Inside a special-purpose block the block decides (and stays open to an allow of it);
        // a default route is no network.
        assert!(
            !policy
                .rules()
                .iter()
                .any(|r| [p("192.168.1.0/24"), p("fe80::/64"), p("::/0")].contains(&r.prefix) && r.origin == RuleOrigin::HostNetwork)
        );
        let mut opened = input.clone();
        opened.allow = entries(&[("192.168.0.0/16", "c:1:1"), ("2a02:8070:1:2::/64", "c:2:1")]);
        let policy = compile_ok(&opened);
        assert_eq!(verdict(&policy, "192.168.1.5").0, Action::Allow);
        assert_eq!(verdict(&policy, "2a02:8070:1:2::77"), (Action::Allow, RuleOrigin::Config("c:2:1".into()), p("2a02:8070:1:2::/64")));
        assert_eq!(policy.decide(ip("2a02:8070:1:2::1")).rule.origin.to_string(), "config: c:2:1");
        // IPv6 disabled: only the IPv4 network counts.
        input.ipv6 = false;
        let policy = compile_ok(&input);
        assert!(policy.rules().iter().filter(|r| r.origin == RuleOrigin::HostNetwork).all(|r| r.prefix.is_v4()));
    }

    #[test]
    fn resolvers_are_port_53_only_unless_the_policy_allows_them_anyway() {
        let mut input = base();
        input.dns = vec![ip("192.168.1.1"), ip("9.9.9.9"), ip("10.0.2.3")];
        input.allow = entries(&[("10.0.2.0/24", "c:1:1")]);
        let policy = compile_ok(&input);
        assert_eq!(policy.port53_only_resolvers(), vec![ip("192.168.1.1")]);
        assert_eq!(verdict(&policy, "9.9.9.9").1, RuleOrigin::Dns);
        assert_eq!(verdict(&policy, "10.0.2.3").1, RuleOrigin::Dns);
        // An allow of exactly the resolver replaces the DNS rule: fully open.
        input.allow = entries(&[("192.168.1.1/32", "c:1:1")]);
        let policy = compile_ok(&input);
        assert_eq!(verdict(&policy, "192.168.1.1"), (Action::Allow, RuleOrigin::Config("c:1:1".into()), p("192.168.1.1/32")));
        assert!(policy.port53_only_resolvers().contains(&ip("10.0.2.3")) && !policy.port53_only_resolvers().contains(&ip("192.168.1.1")));
        // A public resolver in allow-list mode is otherwise denied too.
        input.allow = vec![];
        input.deny = entries(&[("0.0.0.0/0", "c:3:1")]);
        assert!(compile_ok(&input).port53_only_resolvers().contains(&ip("9.9.9.9")));
        assert!(compile_ok(&input).render_table().contains("DNS resolver, UDP/TCP port 53 only"));
    }

    #[test]
    fn longest_prefix_decides_through_nested_rules() {
        let mut input = base();
        input.allow = entries(&[("10.222.0.0/16", "c.toml:3:17"), ("10.222.5.7/32", "c.toml:3:34")]);
        input.deny = entries(&[("10.222.5.0/24", "c.toml:4:16"), ("203.0.113.0/24", "c.toml:4:33")]);
        let policy = compile_ok(&input);
        assert_eq!(verdict(&policy, "10.9.0.1").0, Action::Deny);
        assert_eq!(verdict(&policy, "10.222.4.1"), (Action::Allow, RuleOrigin::Config("c.toml:3:17".into()), p("10.222.0.0/16")));
        assert_eq!(verdict(&policy, "10.222.5.8"), (Action::Deny, RuleOrigin::Config("c.toml:4:16".into()), p("10.222.5.0/24")));
        assert_eq!(verdict(&policy, "10.222.5.7"), (Action::Allow, RuleOrigin::Config("c.toml:3:34".into()), p("10.222.5.7/32")));
        assert_eq!(verdict(&policy, "203.0.113.9").0, Action::Deny);
        assert_eq!(verdict(&policy, "203.0.114.9").0, Action::Allow);
    }

    #[test]
    fn explicit_allow_overrides_each_default() {
        let mut input = base();
        input.host_addresses = vec![ip("198.51.100.7")];
        input.own_addresses = vec![p("100.96.0.3/32")];
        input.other_domains = vec![p("100.96.0.0/16")];
        let before = compile_ok(&input);
        let cases = [
            ("10.0.0.0/8", "10.4.4.4"),
            ("169.254.169.254/32", "169.254.169.254"),
            ("198.51.100.7/32", "198.51.100.7"),
            ("100.96.0.3/32", "100.96.0.3"),
            ("100.96.0.0/16", "100.96.9.9"),
            ("172.16.0.0/12", "172.16.0.1"),
        ];
        for (allowed, probe) in cases {
            assert_eq!(before.decide(ip(probe)).action, Action::Deny, "{probe} denied by default");
            let mut with_allow = input.clone();
            with_allow.allow = entries(&[(allowed, "c.toml:1:1")]);
            let after = compile_ok(&with_allow);
            let v = after.decide(ip(probe));
            assert_eq!((v.action, v.rule.origin), (Action::Allow, RuleOrigin::Config("c.toml:1:1".into())), "{allowed}");
            // The equal-prefix default is replaced, not duplicated.
            assert_eq!(after.rules().iter().filter(|r| r.prefix == p(allowed)).count(), 1);
        }
    }

    #[test]
    fn config_deny_of_default_allow_is_fine() {
        let mut input = base();
        input.deny = entries(&[("0.0.0.0/0", "c.toml:2:1")]);
        input.allow = entries(&[("198.51.100.0/24", "c.toml:1:1")]);
        let policy = compile_ok(&input);
        assert_eq!(verdict(&policy, "8.8.8.8"), (Action::Deny, RuleOrigin::Config("c.toml:2:1".into()), p("0.0.0.0/0")));
        assert_eq!(verdict(&policy, "198.51.100.4").0, Action::Allow);
        // DNS still reachable in allow-list mode.
        assert_eq!(verdict(&policy, "10.0.2.3"), (Action::Allow, RuleOrigin::DnsPort53, p("10.0.2.3/32")));
    }

    #[test]
    fn host_transit_and_other_domains_denied() {
        let mut input = base();
        input.host_addresses = vec![ip("11.0.113.5"), ip("2a01:db8::5")];
        input.own_addresses = vec![p("100.96.0.3/32")];
        input.other_domains = vec![p("100.96.0.0/16")];
        let policy = compile_ok(&input);
        assert_eq!(verdict(&policy, "11.0.113.5"), (Action::Deny, RuleOrigin::HostAddress, p("11.0.113.5/32")));
        assert_eq!(verdict(&policy, "11.0.113.6").0, Action::Allow);
        assert_eq!(verdict(&policy, "100.96.0.3"), (Action::Deny, RuleOrigin::DomainTransit, p("100.96.0.3/32")));
        assert_eq!(verdict(&policy, "100.96.7.1"), (Action::Deny, RuleOrigin::OtherDomain, p("100.96.0.0/16")));
        // IPv6 disabled: the v6 host address adds nothing, ::/0 is denied.
        assert_eq!(verdict(&policy, "2a01:db8::5"), (Action::Deny, RuleOrigin::Ipv6Disabled, p("::/0")));
    }

    #[test]
    fn conflicts_name_both_locations_and_all_are_reported() {
        let mut input = base();
        input.allow = entries(&[
            ("10.1.0.0/16", "a.toml:3:10"),
            ("10.2.0.0/16", "a.toml:3:30"),
            ("10.3.0.0/16", "a.toml:3:50"),
            ("10.3.0.0/16", "a.toml:3:70"),
        ]);
        input.deny = entries(&[("10.1.0.0/16", "a.toml:4:10"), ("10.2.0.0/16", "a.toml:4:30")]);
        let error = compile(&input).expect_err("must be rejected");
        assert_eq!(error.problems.len(), 3, "{error}");
        assert_eq!(
            error.problems[1],
            PolicyProblem::Conflict { prefix: p("10.1.0.0/16"), allow_location: "a.toml:3:10".into(), deny_location: "a.toml:4:10".into() }
        );
        let message = error.to_string();
        for needle in [
            "10.1.0.0/16",
            "a.toml:3:10",
            "a.toml:4:10",
            "10.2.0.0/16",
            "a.toml:3:30",
            "a.toml:4:30",
            "listed twice",
            "a.toml:3:50",
            "a.toml:3:70",
        ] {
            assert!(message.contains(needle), "missing {needle} in {message}");
        }
    }

    #[test]
    fn duplicate_deny_is_an_error() {
        let mut input = base();
        input.deny = entries(&[("203.0.113.0/24", "a:1:1"), ("203.0.113.0/24", "a:1:20")]);
        let error = compile(&input).expect_err("must be rejected");
        assert!(matches!(&error.problems[..], [PolicyProblem::Duplicate { list: "deny_egress", .. }]), "{error}");
    }

    #[test]
    fn parse_prefixes_reports_every_bad_entry_with_location() {
        let error = parse_prefixes(&[
            ("10.0.0.1/8", "c.toml:5:3"),
            ("10.0.0.0/8", "c.toml:5:20"),
            ("nonsense", "c.toml:5:35"),
            ("10.0.0.0/40", "c.toml:5:50"),
        ])
        .expect_err("must be rejected");
        assert_eq!(error.problems.len(), 3);
        let message = error.to_string();
        for needle in ["c.toml:5:3: `10.0.0.1/8` has host bits set; did you mean `10.0.0.0/8`?", "c.toml:5:35", "c.toml:5:50"] {
            assert!(message.contains(needle), "missing {needle} in {message}");
        }
        let ok = parse_prefixes(&[("fd00::/8", "c:1:1")]).expect("valid test input");
        assert_eq!(ok, vec![(p("fd00::/8"), "c:1:1".to_string())]);
    }

    #[test]
    fn dns_reachable_inside_denied_ranges() {
        let mut input = base();
        input.dns = vec![ip("10.0.2.3"), ip("192.168.1.1"), ip("10.0.2.3")];
        input.host_addresses = vec![ip("192.168.1.1")];
        let policy = compile_ok(&input);
        assert_eq!(policy.resolvers(), &[ip("10.0.2.3"), ip("192.168.1.1")]);
        assert_eq!(verdict(&policy, "10.0.2.3"), (Action::Allow, RuleOrigin::DnsPort53, p("10.0.2.3/32")));
        assert_eq!(verdict(&policy, "10.0.2.4").0, Action::Deny);
        // A resolver that is also a host address: DNS wins over the default.
        assert_eq!(verdict(&policy, "192.168.1.1"), (Action::Allow, RuleOrigin::DnsPort53, p("192.168.1.1/32")));
        assert_eq!(policy.port53_only_resolvers(), vec![ip("10.0.2.3"), ip("192.168.1.1")]);
    }

    #[test]
    fn dns_problems() {
        let mut input = base();
        input.dns = vec![ip("127.0.0.53"), ip("2001:db8::53"), ip("10.0.2.3")];
        input.deny = entries(&[("10.0.2.3/32", "c:9:9")]);
        let error = compile(&input).expect_err("must be rejected");
        assert_eq!(error.problems.len(), 3, "{error}");
        assert!(matches!(error.problems[0], PolicyProblem::ResolverUnusable { .. }));
        assert!(matches!(error.problems[1], PolicyProblem::ResolverUnusable { .. }));
        assert_eq!(error.problems[2], PolicyProblem::ResolverDenied { resolver: ip("10.0.2.3"), deny_location: "c:9:9".into() });
        // A wider deny around the resolver is fine: the host route wins.
        input.dns = vec![ip("10.0.2.3")];
        input.deny = entries(&[("10.0.2.0/24", "c:9:9")]);
        assert_eq!(compile_ok(&input).decide(ip("10.0.2.3")).action, Action::Allow);
    }

    #[test]
    fn ipv6_disabled_denies_everything_v6() {
        let policy = compile_ok(&base());
        assert!(!policy.ipv6_enabled());
        let v6: Vec<&Rule> = policy.rules().iter().filter(|r| !r.prefix.is_v4()).collect();
        assert_eq!(v6.len(), 1);
        assert_eq!((v6[0].prefix, v6[0].action), (p("::/0"), Action::Deny));
        for address in ["2001:db8::1", "2606:4700::1111", "fd00::1", "::ffff:8.8.8.8"] {
            assert_eq!(policy.decide(ip(address)).action, Action::Deny, "{address}");
        }
        let mut input = base();
        input.allow = entries(&[("2001:db8::/32", "c:1:1")]);
        let error = compile(&input).expect_err("must be rejected");
        assert!(matches!(&error.problems[..], [PolicyProblem::FamilyDisabled { .. }]), "{error}");
        // A v6 deny while disabled is redundant but harmless.
        let mut input = base();
        input.deny = entries(&[("2001:db8::/32", "c:1:1")]);
        assert_eq!(compile_ok(&input).decide(ip("2001:db8::1")).action, Action::Deny);
    }

    #[test]
    fn ipv6_enabled_is_equivalent_to_ipv4() {
        let mut input = base();
        input.ipv6 = true;
        input.dns.push(ip("fd00::53"));
        input.host_addresses = vec![ip("2001:db8::5")];
        input.allow = entries(&[("fd12:3456::/32", "c:1:1")]);
        let policy = compile_ok(&input);
        assert_eq!(verdict(&policy, "2606:4700::1111").0, Action::Allow);
        let (action, origin, prefix) = verdict(&policy, "fd00::1");
        assert_eq!((action, prefix), (Action::Deny, p("fc00::/7")));
        assert_eq!(origin.to_string(), "default: RFC 4193 unique local, ULA (IANA special-purpose)");
        assert_eq!(verdict(&policy, "fe80::1").0, Action::Deny);
        assert_eq!(verdict(&policy, "::ffff:10.0.0.1").0, Action::Deny);
        assert_eq!(verdict(&policy, "2001:db8::5"), (Action::Deny, RuleOrigin::HostAddress, p("2001:db8::5/128")));
        assert_eq!(verdict(&policy, "fd12:3456::1").0, Action::Allow);
        assert_eq!(verdict(&policy, "fd00::53"), (Action::Allow, RuleOrigin::DnsPort53, p("fd00::53/128")));
    }

    #[test]
    fn routes_match_rules() {
        let mut input = base();
        input.allow = entries(&[("10.222.0.0/16", "c:1:1")]);
        let policy = compile_ok(&input);
        let routes = policy.routes();
        assert_eq!(routes.len(), policy.rules().len());
        assert!(routes.contains(&PolicyRoute { prefix: p("10.222.0.0/16"), kind: RouteKind::Uplink }));
        assert!(routes.contains(&PolicyRoute { prefix: p("10.0.0.0/8"), kind: RouteKind::Unreachable }));
        assert!(routes.contains(&PolicyRoute { prefix: p("0.0.0.0/0"), kind: RouteKind::Uplink }));
        assert!(routes.contains(&PolicyRoute { prefix: p("::/0"), kind: RouteKind::Unreachable }));
        assert!(routes.contains(&PolicyRoute { prefix: p("10.0.2.3/32"), kind: RouteKind::Uplink }));
    }

    #[test]
    fn renders_table_and_explanation() {
        let mut input = base();
        input.allow = entries(&[("10.222.0.0/16", "lazaret.toml:12:17")]);
        let policy = compile_ok(&input);
        let table = policy.render_table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("PREFIX"), "{table}");
        // IPv4 longest first: the /32 DNS route leads, 0.0.0.0/0 is the last IPv4 row.
        assert!(
            lines[1].starts_with("10.0.2.3/32") && lines[1].contains("allow") && lines[1].contains("DNS resolver, UDP/TCP port 53 only"),
            "{table}"
        );
        assert!(lines.iter().any(|l| l.starts_with("10.222.0.0/16") && l.contains("allow") && l.contains("config: lazaret.toml:12:17")));
        assert!(lines.iter().any(|l| l.starts_with("::/0") && l.contains("deny")));
        assert!(table.contains("DNS resolvers: 10.0.2.3"));
        assert!(table.contains("IPv6: disabled"));
        let explanation = policy.explain(ip("10.222.1.1"));
        assert_eq!(explanation, "10.222.1.1: allow (rule allow 10.222.0.0/16, config: lazaret.toml:12:17)");
        assert!(
            policy.explain(ip("10.3.3.3")).contains("deny (rule deny 10.0.0.0/8, default: RFC 1918 private-use (IANA special-purpose))")
        );
        assert_eq!(
            policy.explain(ip("100.100.100.100")),
            "100.100.100.100: deny (rule deny 100.64.0.0/10, default: RFC 6598 shared address space: carrier-grade NAT, Tailscale (IANA special-purpose))"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("224.0.0.0/4") && l.contains("deny") && l.contains("RFC 5771 multicast (IANA IPv4 multicast)")),
            "{table}"
        );
    }

    fn name(text: &str, origin: &str) -> NameRule {
        let (pattern, port) = crate::names::parse_name_rule(text).unwrap_or_else(|e| panic!("{e}"));
        NameRule { pattern, port, origin: origin.into() }
    }

    #[test]
    fn names_need_locked_mode_and_are_listed_once() {
        let mut input = base();
        input.names = vec![name("api.anthropic.com", "c:1:2")];
        let error = compile(&input).expect_err("names in open mode");
        let message = error.to_string();
        assert!(
            message.contains("c:1:2: api.anthropic.com is a DNS name, but names are only allowed with egress = \"locked\""),
            "{message}"
        );
        input.locked = true;
        input.names.push(name("API.anthropic.com.", "c:1:30"));
        input.names.push(name("api.anthropic.com:443", "c:1:50"));
        let error = compile(&input).expect_err("duplicate");
        assert_eq!(error.problems.len(), 1, "{error}");
        assert!(error.to_string().contains("api.anthropic.com is listed twice in allow_egress (at c:1:2 and c:1:30)"), "{error}");
    }

    #[test]
    fn locked_mode_denies_all_but_config_prefixes() {
        let mut input = base();
        input.locked = true;
        input.allow = entries(&[("198.51.100.0/24", "c:1:1"), ("11.0.0.0/8", "c:1:20")]);
        input.names = vec![name("*.npmjs.org", "c:2:1"), name("github.com:22", "c:2:20")];
        let policy = compile_ok(&input);
        assert!(policy.locked());
        assert_eq!(verdict(&policy, "8.8.8.8"), (Action::Deny, RuleOrigin::Locked, p("0.0.0.0/0")));
        assert_eq!(verdict(&policy, "11.1.1.1"), (Action::Allow, RuleOrigin::Config("c:1:20".into()), p("11.0.0.0/8")));
        // The resolvers are the sidecar's business now: the sandbox cannot reach them.
        assert_eq!(verdict(&policy, "10.0.2.3").0, Action::Deny);
        assert_eq!(verdict(&policy, "10.1.1.1").1.to_string(), "default: RFC 1918 private-use (IANA special-purpose)");
        assert_eq!(policy.allowed_prefixes(), vec![p("198.51.100.0/24"), p("11.0.0.0/8")]);
        // Routes are those of open mode: the sidecar's filter does the locking.
        let mut open = input.clone();
        open.locked = false;
        open.names.clear();
        assert_eq!(policy.routes(), compile_ok(&open).routes());
        let table = policy.render_table();
        assert!(table.contains("Egress: locked"), "{table}");
        assert!(table.contains("\n*.npmjs.org    config: c:2:1\n"), "{table}");
        assert!(table.contains("\ngithub.com:22  config: c:2:20\n"), "{table}");
        assert!(table.contains("0.0.0.0/0        names   default: public IPv4"), "{table}");
        assert!(table.contains("11.0.0.0/8       allow   config: c:1:20"), "{table}");
        assert!(compile_ok(&open).render_table().contains("Egress: open"));
        assert!(policy.explain(ip("8.8.8.8")).contains("locked mode: reachable only as an address an allowed name resolved to"));
    }
}
