//! Name rules of locked-down egress (`egress = "locked"`): `allow_egress`
//! entries that are DNS names or wildcards, optionally with a port.
//!
//! # Semantics
//!
//! * `api.anthropic.com` allows exactly that name (case-insensitive, a
//!   trailing dot ignored).
//! * `*.npmjs.org` allows every name with at least one more label below
//!   `npmjs.org` (`registry.npmjs.org`, `a.b.npmjs.org`), not `npmjs.org`
//!   itself: list both when both are wanted. A wildcard must be the whole
//!   first label and cover at least two labels (`*.com` is refused).
//! * `github.com:22` opens the addresses the name resolves to for TCP and
//!   UDP port 22 only; without a port every port is open.
//! * A name is decided by every rule that matches it: the ports are the
//!   union (one rule without a port opens all of them).
//! * The name allowed is the one the sandbox asks: the addresses at the end
//!   of its CNAME chain are opened, whatever the chain's names are, but
//!   only those the Domain's policy routes and none of Lazaret's own (see
//!   [`crate::resolver`]).
//! * A wildcard lets the sandbox choose every label below the suffix: the
//!   name it asks reaches the upstream resolvers and, through them, the
//!   suffix's authoritative servers. Whoever runs those can read what the
//!   sandbox puts in the labels; allow a wildcard only below a suffix whose
//!   servers are trusted with that.

use std::collections::BTreeSet;
use std::fmt;

/// Longest DNS name in presentation form without the trailing dot (RFC 1035).
pub const MAX_NAME_LEN: usize = 253;
/// Longest label (RFC 1035).
pub const MAX_LABEL_LEN: usize = 63;

/// What a name rule matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(tag = "kind", content = "name", rename_all = "lowercase")]
pub enum NamePattern {
    /// Exactly this name (lower case, no trailing dot).
    Exact(String),
    /// Every name strictly below this suffix (lower case, no `*.`).
    Wildcard(String),
}

impl NamePattern {
    /// Whether `name` (normalized, see [`normalize_name`]) matches.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Exact(exact) => name == exact,
            NamePattern::Wildcard(suffix) => {
                name.len() > suffix.len() + 1 && name.ends_with(suffix.as_str()) && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
            }
        }
    }
}

impl fmt::Display for NamePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NamePattern::Exact(name) => f.write_str(name),
            NamePattern::Wildcard(suffix) => write!(f, "*.{suffix}"),
        }
    }
}

/// One name entry of `allow_egress`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NameRule {
    /// The names it matches.
    pub pattern: NamePattern,
    /// The only destination port opened (TCP and UDP), or every port.
    pub port: Option<u16>,
    /// Its config location ("file:line:col").
    pub origin: String,
}

impl fmt::Display for NameRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.pattern),
            None => write!(f, "{}", self.pattern),
        }
    }
}

/// Why a name entry is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not a DNS name.
    #[error("{text:?} is not a valid DNS name: {reason}")]
    BadName {
        /// The entry as written.
        text: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The wildcard is not the whole first label or covers a top-level domain.
    #[error("{text:?}: {reason}")]
    BadWildcard {
        /// The entry as written.
        text: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The port is not 1..=65535.
    #[error("{text:?}: the port must be a number from 1 to 65535")]
    BadPort {
        /// The entry as written.
        text: String,
    },
}

/// Whether an `allow_egress` entry is meant as a name rather than a prefix:
/// it contains a letter or a `*` and is no IPv6 address (`fd00::/8` holds
/// letters too).
pub fn looks_like_name(text: &str) -> bool {
    let head = text.split('/').next().unwrap_or(text);
    if head.parse::<std::net::IpAddr>().is_ok() || text.matches(':').count() > 1 {
        return false;
    }
    text.bytes().any(|b| b.is_ascii_alphabetic() || b == b'*' || b == b'_')
}

/// The name in canonical form (ASCII lower case, no trailing dot), or why
/// it is no name. Labels are letters, digits, `-` and `_` (service labels
/// such as `_sip._tcp`), 1..=63 bytes, not starting or ending with `-`.
pub fn normalize_name(text: &str) -> Result<String, &'static str> {
    let name = text.strip_suffix('.').unwrap_or(text);
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("it is longer than 253 characters");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("it has an empty label");
        }
        if label.len() > MAX_LABEL_LEN {
            return Err("a label is longer than 63 characters");
        }
        if !label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err("labels may only hold letters, digits, `-` and `_` (write internationalized names in their xn-- form)");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with `-`");
        }
    }
    if name.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err("it is all digits, like an address: write addresses as prefixes, e.g. \"192.0.2.1/32\"");
    }
    Ok(name.to_ascii_lowercase())
}

/// Parses `name`, `*.suffix`, either with `:PORT`.
pub fn parse_name_rule(text: &str) -> Result<(NamePattern, Option<u16>), NameError> {
    let (name, port) = match text.rsplit_once(':') {
        Some((name, port)) => {
            let parsed = port
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0 && port.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| NameError::BadPort { text: text.to_string() })?;
            (name, Some(parsed))
        }
        None => (text, None),
    };
    let bad = |reason| NameError::BadName { text: text.to_string(), reason };
    let wildcard = |reason| NameError::BadWildcard { text: text.to_string(), reason };
    let pattern = if let Some(suffix) = name.strip_prefix("*.") {
        if suffix.contains('*') {
            return Err(wildcard("only the whole first label may be `*`, e.g. \"*.npmjs.org\""));
        }
        let suffix = normalize_name(suffix).map_err(bad)?;
        if !suffix.contains('.') {
            return Err(wildcard("a wildcard must cover at least two labels (\"*.com\" would allow a whole top-level domain)"));
        }
        NamePattern::Wildcard(suffix)
    } else if name.contains('*') {
        return Err(wildcard("only the whole first label may be `*`, e.g. \"*.npmjs.org\""));
    } else {
        NamePattern::Exact(normalize_name(name).map_err(bad)?)
    };
    Ok((pattern, port))
}

/// Which ports a name's addresses are opened for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// Every port and protocol.
    All,
    /// TCP and UDP to these ports only.
    Only(BTreeSet<u16>),
}

/// The verdict for one name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameVerdict<'a> {
    /// The rules that match, in config order; empty when the name is refused.
    pub rules: Vec<&'a NameRule>,
    /// The ports opened when allowed.
    pub ports: Ports,
}

impl NameVerdict<'_> {
    /// Whether the name is answered at all.
    pub fn allowed(&self) -> bool {
        !self.rules.is_empty()
    }
}

/// The name rules of a locked Domain.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct NamePolicy {
    rules: Vec<NameRule>,
}

impl NamePolicy {
    /// The policy of these rules (already checked for duplicates).
    pub fn new(rules: Vec<NameRule>) -> NamePolicy {
        NamePolicy { rules }
    }

    /// The rules, in config order.
    pub fn rules(&self) -> &[NameRule] {
        &self.rules
    }

    /// Every port some rule names (each gets its own nftables set).
    pub fn ports(&self) -> BTreeSet<u16> {
        self.rules.iter().filter_map(|rule| rule.port).collect()
    }

    /// The verdict for `name` as the sandbox asked it (any case, trailing
    /// dot or not). A name that is no valid DNS name is refused.
    pub fn decide(&self, name: &str) -> NameVerdict<'_> {
        let Ok(name) = normalize_name(name) else {
            return NameVerdict { rules: Vec::new(), ports: Ports::Only(BTreeSet::new()) };
        };
        let rules: Vec<&NameRule> = self.rules.iter().filter(|rule| rule.pattern.matches(&name)).collect();
        let ports = if rules.iter().any(|rule| rule.port.is_none()) {
            Ports::All
        } else {
            Ports::Only(rules.iter().filter_map(|rule| rule.port).collect())
        };
        NameVerdict { rules, ports }
    }

    /// A one-line explanation for `lazaret policy explain PROFILE NAME`.
    pub fn explain(&self, name: &str) -> String {
        let shown = name.strip_suffix('.').unwrap_or(name);
        if let Err(reason) = normalize_name(name) {
            return format!("{shown}: refused (not a valid DNS name: {reason})");
        }
        let verdict = self.decide(name);
        if !verdict.allowed() {
            return format!("{shown}: refused (no allow_egress name rule matches; the resolver answers REFUSED without asking upstream)");
        }
        let rules: Vec<String> = verdict.rules.iter().map(|rule| format!("allow {rule}, config: {}", rule.origin)).collect();
        let ports = match &verdict.ports {
            Ports::All => "all ports".to_string(),
            Ports::Only(ports) => {
                let list: Vec<String> = ports.iter().map(ToString::to_string).collect();
                format!("TCP/UDP port {} only", list.join(", "))
            }
        };
        format!("{shown}: allow, {ports} (rule {})", rules.join("; rule "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str, origin: &str) -> NameRule {
        let (pattern, port) = parse_name_rule(text).unwrap_or_else(|e| panic!("{e}"));
        NameRule { pattern, port, origin: origin.into() }
    }

    #[test]
    fn tells_names_from_prefixes() {
        for name in ["api.anthropic.com", "*.npmjs.org", "github.com:22", "localhost", "_sip._tcp.example.org"] {
            assert!(looks_like_name(name), "{name}");
        }
        for prefix in ["10.0.0.0/8", "fd00::/8", "fdab::1", "1.2.3.4", "::/0", "10.0.0.1/x"] {
            assert!(!looks_like_name(prefix), "{prefix}");
        }
    }

    #[test]
    fn parses_names_wildcards_and_ports() {
        assert_eq!(parse_name_rule("API.Anthropic.com."), Ok((NamePattern::Exact("api.anthropic.com".into()), None)));
        assert_eq!(parse_name_rule("*.npmjs.org"), Ok((NamePattern::Wildcard("npmjs.org".into()), None)));
        assert_eq!(parse_name_rule("github.com:22"), Ok((NamePattern::Exact("github.com".into()), Some(22))));
        assert_eq!(parse_name_rule("*.example.org:443"), Ok((NamePattern::Wildcard("example.org".into()), Some(443))));
        for bad in [
            "github.com:0",
            "github.com:65536",
            "github.com:+22",
            "github.com:",
            "a..b",
            "-a.b",
            "a_b!.c",
            "*.com",
            "a.*.b",
            "foo*.b",
            "*.*.b",
            "*",
            "1.2.3",
            &"a".repeat(64),
        ] {
            assert!(parse_name_rule(bad).is_err(), "{bad}");
        }
        let long = vec!["a".repeat(63); 4].join(".");
        assert_eq!(long.len(), 255);
        assert!(parse_name_rule(&long).is_err());
        assert!(parse_name_rule("github.com:99999").expect_err("bad port").to_string().contains("1 to 65535"));
    }

    #[test]
    fn wildcards_match_below_their_suffix_only() {
        let pattern = NamePattern::Wildcard("npmjs.org".into());
        assert!(pattern.matches("registry.npmjs.org"));
        assert!(pattern.matches("a.b.npmjs.org"));
        assert!(!pattern.matches("npmjs.org"));
        assert!(!pattern.matches("evilnpmjs.org"));
        assert!(!pattern.matches("npmjs.org.evil.com"));
    }

    #[test]
    fn decides_with_every_matching_rule() {
        let policy = NamePolicy::new(vec![
            rule("github.com:22", "c:1:1"),
            rule("github.com:443", "c:1:20"),
            rule("*.npmjs.org", "c:2:1"),
            rule("api.anthropic.com", "c:3:1"),
        ]);
        let github = policy.decide("GitHub.com.");
        assert_eq!(github.rules.len(), 2);
        assert_eq!(github.ports, Ports::Only([22, 443].into()));
        assert_eq!(policy.decide("registry.npmjs.org").ports, Ports::All);
        assert!(!policy.decide("npmjs.org").allowed());
        assert!(!policy.decide("x.api.anthropic.com").allowed());
        assert!(!policy.decide("bad name.com").allowed());
        assert_eq!(policy.ports(), [22, 443].into());
        assert_eq!(
            policy.explain("github.com"),
            "github.com: allow, TCP/UDP port 22, 443 only (rule allow github.com:22, config: c:1:1; rule allow github.com:443, config: c:1:20)"
        );
        assert_eq!(policy.explain("a.npmjs.org."), "a.npmjs.org: allow, all ports (rule allow *.npmjs.org, config: c:2:1)");
        assert!(policy.explain("evil.com").starts_with("evil.com: refused (no allow_egress name rule matches"));
        assert!(policy.explain("a..b").contains("not a valid DNS name"));
    }
}
