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
        let image = serde_json::to_value(Image { name: "test", digest: "sha256:ab", size: 3, created: "2026-01-01T00:00:00Z" }).expect("json");
        assert_eq!(image, serde_json::json!({"name": "test", "digest": "sha256:ab", "size": 3, "created": "2026-01-01T00:00:00Z"}));
        let check = serde_json::to_value(Check { name: "runsc", ok: false, detail: "missing", fix: Some("install it") }).expect("json");
        assert_eq!(check, serde_json::json!({"name": "runsc", "ok": false, "detail": "missing", "fix": "install it"}));
        let rule = Rule { prefix: "0.0.0.0/0".into(), action: "allow".into(), origin: "public IPv4".into() };
        let verdict = serde_json::to_value(Verdict { address: "1.1.1.1".into(), action: "allow".into(), rule }).expect("json");
        assert_eq!(verdict["rule"]["prefix"], "0.0.0.0/0");
        assert_eq!(verdict["action"], "allow");
    }

    #[test]
    fn a_journal_is_an_array_of_its_lines_and_a_bad_line_is_named() {
        let entries = parse_journal("{\"a\":1}\n\n{\"b\":2}\n").expect("parses");
        assert_eq!(entries, [serde_json::json!({"a": 1}), serde_json::json!({"b": 2})]);
        let err = parse_journal("{\"a\":1}\nnot json\n").expect_err("line 2 is bad");
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }
}
