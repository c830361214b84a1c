//! The `--json` output of the listing commands. Each shape is documented in
//! the README ("Using it") and kept stable: fields may be added, never
//! renamed or removed. Lists are JSON arrays, single things objects.

use std::path::Path;

use anyhow::{Context as _, Result};
use serde::Serialize;

/// Prints `value` as pretty JSON on stdout.
pub fn print(value: &impl Serialize) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// One image of `lazaret image ls --json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct Image<'a> {
    /// The name profiles use.
    pub name: &'a str,
    /// `sha256:…`, in full.
    pub digest: &'a str,
    /// Bytes of file content in its root filesystem.
    pub size: u64,
    /// Import time, RFC 3339 UTC.
    pub created: &'a str,
}

/// One check of `lazaret doctor --json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct Check<'a> {
    /// What was checked.
    pub name: &'a str,
    /// Whether it passed.
    pub ok: bool,
    /// What was found.
    pub detail: &'a str,
    /// How to fix it (null when it passed or there is no fix to offer).
    pub fix: Option<&'a str>,
    /// Why it lies outside the supported configurations (null when it
    /// does not): the check passed with a warning.
    pub warning: Option<&'a str>,
}

/// `lazaret config check --json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct ConfigCheck {
    /// The configuration file that was checked.
    pub file: String,
    /// Each profile, in name order.
    pub profiles: Vec<ProfileFingerprint>,
}

/// A profile and its Configuration Fingerprint.
#[derive(Debug, Serialize, PartialEq)]
pub struct ProfileFingerprint {
    /// The profile's name.
    pub name: String,
    /// Its Configuration Fingerprint.
    pub fingerprint: String,
}

/// One journal of `lazaret journal --check --json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct JournalCheck {
    /// The journal file.
    pub path: String,
    /// How many transitions it holds (all conform, or the command fails).
    pub entries: usize,
    /// Whether the run it records ended (false: running, or crashed).
    pub complete: bool,
}

/// `lazaret policy show --json`: the compiled routing table.
#[derive(Debug, Serialize, PartialEq)]
pub struct Policy {
    /// Longest prefix wins; IPv4 first, then by descending prefix length.
    pub rules: Vec<Rule>,
    /// The DNS resolvers the sandbox's resolv.conf names.
    pub resolvers: Vec<String>,
    /// Whether IPv6 is policed (false: all of ::/0 is denied).
    pub ipv6: bool,
    /// `open` or `locked`.
    pub egress: String,
    /// The name rules (locked egress), in config order.
    pub names: Vec<NameRule>,
}

/// One name rule of `allow_egress`.
#[derive(Debug, Serialize, PartialEq)]
pub struct NameRule {
    /// As written in canonical form, e.g. `*.npmjs.org` or `github.com:22`.
    pub rule: String,
    /// Its config location.
    pub origin: String,
}

/// `lazaret policy explain PROFILE NAME --json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct NameVerdict {
    /// The name asked about.
    pub name: String,
    /// `allow` or `refuse`.
    pub action: String,
    /// The rules that allow it (empty when refused).
    pub rules: Vec<NameRule>,
}

/// `lazaret policy log PROFILE --json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct PolicyLog {
    /// `open` or `locked`.
    pub egress: String,
    /// Refused destinations of the last hour, most refused first.
    pub destinations: Vec<RefusedDestination>,
    /// Refused names, most frequent first; `null` with open egress (no resolver of Lazaret's).
    pub names: Option<Vec<lazaret_netpolicy::topology::RefusedName>>,
}

/// One refused destination of [`PolicyLog`].
#[derive(Debug, Serialize, PartialEq)]
pub struct RefusedDestination {
    /// The address the sandbox tried to reach.
    pub address: String,
    /// `tcp`, `udp`, `icmp`, ... or the IP protocol number.
    pub protocol: String,
    /// The destination port (TCP, UDP, SCTP), else `null`.
    pub port: Option<u16>,
    /// Packets refused.
    pub packets: u64,
    /// When the last one was refused, seconds since the Unix epoch.
    pub last_unix: u64,
    /// The rule of the profile's current policy that decides the address
    /// (as `policy explain` gives it), `null` if the policy could not be
    /// computed.
    pub rule: Option<Rule>,
}

/// One rule of a [`Policy`].
#[derive(Debug, Serialize, PartialEq)]
pub struct Rule {
    /// The destination prefix, e.g. `10.0.0.0/8`.
    pub prefix: String,
    /// `allow` or `deny`.
    pub action: String,
    /// Where the rule came from, as the table shows it.
    pub origin: String,
}

impl From<&lazaret_netpolicy::policy::Rule> for Rule {
    fn from(r: &lazaret_netpolicy::policy::Rule) -> Self {
        Rule { prefix: r.prefix.to_string(), action: r.action.to_string(), origin: r.origin.to_string() }
    }
}

/// `lazaret policy explain --json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct Verdict {
    /// The address asked about.
    pub address: String,
    /// `allow` or `deny`.
    pub action: String,
    /// The longest-prefix rule that decided it.
    pub rule: Rule,
}

/// One neutralisation of `lazaret audit --json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct AuditEntry<'a> {
    /// When, RFC 3339 UTC with milliseconds.
    pub time: String,
    /// The guarded tree: `workspace`, `ignored` or `volume:/SANDBOX/PATH`.
    pub root: &'a str,
    /// The path relative to that tree, as recorded (agent-chosen bytes, lossily UTF-8).
    pub path: &'a str,
    /// `quarantined`, `filtered_git_config`, `cleared_privilege_bits` or `removed_file_capabilities`.
    pub kind: &'a str,
    /// The line the session terminals showed.
    pub summary: &'a str,
    /// Why it was neutralised.
    pub reason: &'a str,
    /// `event` or `sweep` (empty when only the quarantine knows the entry).
    pub found_by: &'a str,
    /// The quarantine entry (null when nothing was moved aside).
    pub quarantine_id: Option<&'a str>,
    /// Whether that entry's content is still in the quarantine (false once restored or dropped).
    pub in_quarantine: bool,
    /// The quarantined file's record while it is there: {id, root, path, reason, time, mode, owner: {uid, gid}, symlink_target, size, content_kept, dropped?} (`dropped`: when its content was dropped to keep the quarantine within its limits).
    pub quarantined: Option<&'a lazaret_coordinator::workspace_guard::QuarantineRecord>,
}

impl<'a> From<&'a lazaret_coordinator::workspace_guard::AuditEntry> for AuditEntry<'a> {
    fn from(e: &'a lazaret_coordinator::workspace_guard::AuditEntry) -> Self {
        let ms = e.time_ms % 1000;
        let time = format!("{}.{ms:03}Z", lazaret_coordinator::workspace_guard::format_utc(e.time_ms).replace(' ', "T"));
        AuditEntry {
            time,
            root: &e.root,
            path: &e.path,
            kind: &e.kind,
            summary: &e.summary,
            reason: &e.reason,
            found_by: &e.found_by,
            quarantine_id: e.quarantine_id.as_deref(),
            in_quarantine: e.in_quarantine,
            quarantined: e.quarantined.as_ref(),
        }
    }
}

/// `lazaret audit --restore ID --json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct Restored<'a> {
    /// What was put back.
    pub restored: RestoredFile<'a>,
}

/// A file `lazaret audit --restore` put back.
#[derive(Debug, Serialize, PartialEq)]
pub struct RestoredFile<'a> {
    /// The quarantine entry it came from (now removed).
    pub id: &'a str,
    /// The guarded tree.
    pub root: &'a str,
    /// The path relative to it.
    pub path: &'a str,
}

/// The entries of a journal file as a JSON array (`lazaret journal
/// --json`): each line is one JSON object, kept as it is.
pub fn journal_entries(path: &Path) -> Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {} (has the Domain ever run?)", path.display()))?;
    parse_journal(&text).with_context(|| format!("reading {}", path.display()))
}

fn parse_journal(text: &str) -> Result<Vec<serde_json::Value>> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("line {} is not JSON", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_have_their_documented_field_names() {
        let image =
            serde_json::to_value(Image { name: "test", digest: "sha256:ab", size: 3, created: "2026-01-01T00:00:00Z" }).expect("json");
        assert_eq!(image, serde_json::json!({"name": "test", "digest": "sha256:ab", "size": 3, "created": "2026-01-01T00:00:00Z"}));
        let check = serde_json::to_value(Check { name: "runsc", ok: false, detail: "missing", fix: Some("install it"), warning: None })
            .expect("json");
        assert_eq!(check, serde_json::json!({"name": "runsc", "ok": false, "detail": "missing", "fix": "install it", "warning": null}));
        let rule = Rule { prefix: "0.0.0.0/0".into(), action: "allow".into(), origin: "public IPv4".into() };
        let verdict = serde_json::to_value(Verdict { address: "1.1.1.1".into(), action: "allow".into(), rule }).expect("json");
        assert_eq!(verdict["rule"]["prefix"], "0.0.0.0/0");
        assert_eq!(verdict["action"], "allow");
    }

    #[test]
    fn audit_entries_have_their_documented_field_names() {
        let e = lazaret_coordinator::workspace_guard::AuditEntry {
            time_ms: 1_796_165_040_123,
            root: "workspace".into(),
            path: "x/.git/hooks/pre-commit".into(),
            kind: "quarantined".into(),
            summary: "workspace guard: workspace:x/.git/hooks/pre-commit: quarantined".into(),
            reason: "hook".into(),
            found_by: "event".into(),
            quarantine_id: Some("q1".into()),
            in_quarantine: false,
            quarantined: None,
        };
        let v = serde_json::to_value(AuditEntry::from(&e)).expect("json");
        assert_eq!(v["time"], "2026-12-01T22:44:00.123Z");
        let keys: Vec<&str> = v.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys.len(), 10, "{keys:?}");
        for k in ["time", "root", "path", "kind", "summary", "reason", "found_by", "quarantine_id", "in_quarantine", "quarantined"] {
            assert!(keys.contains(&k), "{k} missing: {keys:?}");
        }
        let r = serde_json::to_value(Restored { restored: RestoredFile { id: "q1", root: "workspace", path: "a" } }).expect("json");
        assert_eq!(r, serde_json::json!({"restored": {"id": "q1", "root": "workspace", "path": "a"}}));
    }

    #[test]
    fn a_journal_is_an_array_of_its_lines_and_a_bad_line_is_named() {
        let entries = parse_journal("{\"a\":1}\n\n{\"b\":2}\n").expect("parses");
        assert_eq!(entries, [serde_json::json!({"a": 1}), serde_json::json!({"b": 2})]);
        let err = parse_journal("{\"a\":1}\nnot json\n").expect_err("line 2 is bad");
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }
}
