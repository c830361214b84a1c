//! Configuration Fingerprint: formatting never changes it, meaning always does.
#![allow(clippy::unwrap_used, missing_docs)]

use std::path::Path;

use lazaret_coordinator::config::{Config, ConfigError, Fingerprint};

fn full_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config/full.toml");
    std::fs::read_to_string(path).unwrap()
}

fn fingerprint_of(text: &str, profile: &str) -> Fingerprint {
    match Config::parse(text, Path::new("x.toml"), Path::new("/home/dev")) {
        Ok(config) => config.fingerprint(profile).unwrap(),
        Err(error) => panic!("{error}\n---\n{text}"),
    }
}

/// `full.toml` with `from` replaced by `to` (which must occur exactly once).
fn edited(from: &str, to: &str) -> String {
    let text = full_text();
    assert_eq!(text.matches(from).count(), 1, "fixture must contain {from:?} once");
    text.replacen(from, to, 1)
}

#[test]
fn fingerprint_is_sha256_hex() {
    let fingerprint = fingerprint_of(&full_text(), "claude");
    assert_eq!(fingerprint.as_str().len(), 64);
    assert!(fingerprint.as_str().bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    assert_eq!(fingerprint.to_string(), fingerprint.as_str());
}

#[test]
fn formatting_comments_order_and_equivalent_forms_do_not_change_it() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config/full_reformatted.toml");
    let reformatted = std::fs::read_to_string(path).unwrap();
    for profile in ["claude", "shell"] {
        assert_eq!(fingerprint_of(&full_text(), profile), fingerprint_of(&reformatted, profile), "{profile}");
    }
    // The same file read from another path, with a different home that does
    // not matter to a profile without `~/` volumes.
    let elsewhere = Config::parse(&full_text(), Path::new("/elsewhere.toml"), Path::new("/root")).unwrap();
    assert_eq!(elsewhere.fingerprint("shell").unwrap(), fingerprint_of(&full_text(), "shell"));
}

#[test]
fn fingerprints_differ_between_profiles() {
    assert_ne!(fingerprint_of(&full_text(), "claude"), fingerprint_of(&full_text(), "shell"));
    // Two profiles with identical settings still differ: the name is part of it.
    let text = "[profiles.a]\nimage = \"i\"\n[profiles.b]\nimage = \"i\"\n";
    assert_ne!(fingerprint_of(text, "a"), fingerprint_of(text, "b"));
}

#[test]
fn other_profiles_and_profile_selection_do_not_matter() {
    let base = fingerprint_of(&full_text(), "claude");
    let other_profile_edited = edited("image = \"debian-bookworm\"", "image = \"debian-trixie\"");
    assert_eq!(fingerprint_of(&other_profile_edited, "claude"), base);
    assert_ne!(fingerprint_of(&other_profile_edited, "shell"), fingerprint_of(&full_text(), "shell"));
    let other_default = edited("default_profile = \"claude\"", "default_profile = \"shell\"");
    assert_eq!(fingerprint_of(&other_default, "claude"), base);
    // claude's own escalation rules are claude's only ...
    let claude_rule_edited = edited("command = [\"npm\", \"test\"]", "command = [\"npm\", \"run\", \"test\"]");
    assert_ne!(fingerprint_of(&claude_rule_edited, "claude"), base);
    assert_eq!(fingerprint_of(&claude_rule_edited, "shell"), fingerprint_of(&full_text(), "shell"));
    // claude sets its own prompt_timeout, so the global one does not apply
    // to it, but does to shell.
    let other_global_prompt = edited("prompt_timeout = 45", "prompt_timeout = 46");
    assert_eq!(fingerprint_of(&other_global_prompt, "claude"), base);
    assert_ne!(fingerprint_of(&other_global_prompt, "shell"), fingerprint_of(&full_text(), "shell"));
    // ... while a global rule is every profile's.
    let global_rule_edited = edited("command = [\"git\", \"push\"]", "command = [\"git\", \"pull\"]");
    assert_ne!(fingerprint_of(&global_rule_edited, "claude"), base);
    assert_ne!(fingerprint_of(&global_rule_edited, "shell"), fingerprint_of(&full_text(), "shell"));
    // claude has its own dns, so the top-level list does not apply to it ...
    let other_global_dns = edited("dns = [\"1.1.1.1\", \"2606:4700:4700::1111\"]", "dns = [\"9.9.9.9\"]");
    assert_eq!(fingerprint_of(&other_global_dns, "claude"), base);
    // ... but it does apply to shell.
    assert_ne!(fingerprint_of(&other_global_dns, "shell"), fingerprint_of(&full_text(), "shell"));
}

#[test]
fn every_change_of_meaning_changes_it() {
    let base = fingerprint_of(&full_text(), "claude");
    let edits: &[(&str, &str)] = &[
        ("storage_root = \"/srv/lazaret\"", "storage_root = \"/srv/lazaret2\""),
        ("runtime_dir = \"/run/lazaret-test/1000\"", "runtime_dir = \"/run/other\""),
        ("path = \"/usr/local/bin/runsc\"", "path = \"/usr/bin/runsc\""),
        ("platform = \"ptrace\"", "platform = \"systrap\""),
        ("debug_log_dir = \"/var/log/lazaret\"", "debug_log_dir = \"/var/log/other\""),
        ("command = [\"git\", \"push\"]", "command = [\"git\", \"push\", \"origin\"]"),
        ("allow_extra_args = false", "allow_extra_args = true"),
        ("cwd = \"src\"", "cwd = \".\""),
        ("timeout = 900", "timeout = 901"),
        ("env = [\"GH_TOKEN\", \"AWS_PROFILE\"]", "env = [\"GH_TOKEN\"]"),
        ("timeout = 300", "timeout = 301"),
        ("output_limit = \"16M\"", "output_limit = \"17M\""),
        // The profile's own escalation settings.
        ("prompt_timeout = 30", "prompt_timeout = 31"),
        ("cwd = \"frontend\"", "cwd = \"frontend/src\""),
        ("name = \"npm-test\"", "name = \"npm-check\""),
        ("name = \"make\"", "name = \"build\""),
        ("image = \"docker.io/library/debian:trixie\"", "image = \"docker.io/library/debian:bookworm\""),
        ("command = [\"claude\", \"--verbose\"]", "command = [\"--verbose\", \"claude\"]"),
        ("command = [\"claude\", \"--verbose\"]", "command = [\"claude\"]"),
        ("isolate_gitignored = false", "isolate_gitignored = true"),
        ("persistent_dirs = [\"/root\", \"/usr\", \"/var\"]", "persistent_dirs = [\"/root\", \"/usr\"]"),
        ("persistent_dirs = [\"/root\", \"/usr\", \"/var\"]", "persistent_dirs = [\"/root\", \"/usr\", \"/var\", \"/opt\"]"),
        ("allow_egress = [\"10.222.0.0/16\", \"fd00:1::/64\"]", "allow_egress = [\"10.222.0.0/17\", \"fd00:1::/64\"]"),
        ("deny_egress = [\"10.222.13.0/24\"]", "deny_egress = []"),
        ("dns = [\"10.222.0.53\"]", "dns = [\"10.222.0.54\"]"),
        ("EDITOR = \"vi\"", "EDITOR = \"vim\""),
        ("EDITOR = \"vi\"", "EDITOR = \"env:vi\""),
        ("ANTHROPIC_API_KEY = \"env:ANTHROPIC_API_KEY\"", "ANTHROPIC_API_KEY = \"env:OTHER_KEY\""),
        ("\"/srv/data:/data:ro\"", "\"/srv/data:/data\""),
        ("\"/srv/data:/data:ro\"", "\"/srv/data:/data2:ro\""),
        // Mount order is meaningful.
        (
            "volumes = [\"~/.claude:/root/.claude\", \"/srv/data:/data:ro\"]",
            "volumes = [\"/srv/data:/data:ro\", \"~/.claude:/root/.claude\"]",
        ),
        ("user = \"1000:1000\"", "user = \"developer\""),
        ("user = \"1000:1000\"", "user = \"1000:1001\""),
        ("hostname = \"claude-box\"", "hostname = \"claude-box2\""),
        ("memory_limit = \"4G\"", "memory_limit = \"5G\""),
        ("pids_limit = 2048", "pids_limit = 2049"),
    ];
    let mut seen = vec![base.clone()];
    let mut texts: Vec<(String, String)> = edits.iter().map(|(from, to)| (format!("{from} -> {to}"), edited(from, to))).collect();
    // Without its IPv6 prefix, with IPv6 on and then off (off with an IPv6
    // prefix would be rejected).
    // Rule order is meaningful (the first matching rule applies).
    let push_rule = "[[escalation.rules]]\nname = \"git-push\"\ncommand = [\"git\", \"push\"]\nallow_extra_args = false\n\n";
    let reordered = edited(push_rule, "").replacen("[profiles.claude]\n", &format!("{push_rule}[profiles.claude]\n"), 1);
    texts.push(("git-push rule after make".into(), reordered));
    let without_v6 = edited(", \"fd00:1::/64\"", "");
    texts.push(("drop fd00:1::/64".into(), without_v6.clone()));
    texts.push(("ipv6 = false".into(), without_v6.replacen("ipv6 = true", "ipv6 = false", 1)));
    texts.push(("ipv6 unset".into(), without_v6.replacen("ipv6 = true", "", 1)));
    for (what, text) in texts {
        let fingerprint = fingerprint_of(&text, "claude");
        assert!(!seen.contains(&fingerprint), "edit {what} did not produce a new fingerprint");
        seen.push(fingerprint);
    }
    // The developer's home changes where `~/.claude` points: a change of meaning.
    let other_home = Config::parse(&full_text(), Path::new("x.toml"), Path::new("/home/other")).unwrap();
    assert_ne!(other_home.fingerprint("claude").unwrap(), base);
}

/// A `~/...` sandbox path is hashed as written (normalised), not resolved:
/// the agent's home depends on `user` (hashed anyway) and the developer,
/// so the same file gives the same fingerprint to every developer whose
/// host paths are the same, and `~/x` differs from `/home/dev/x`, which
/// a root agent would not get at its home.
#[test]
fn a_sandbox_path_below_the_agents_home_is_hashed_as_written() {
    let text = |volume: &str| format!("[profiles.a]\nimage = \"i\"\nvolumes = [\"{volume}\"]\n");
    let with = |volume: &str| fingerprint_of(&text(volume), "a");
    assert_eq!(with("/srv/t:~/.tool"), with("/srv/t:~//./.tool/"));
    assert_ne!(with("/srv/t:~/.tool"), with("/srv/t:/home/dev/.tool"));
    assert_ne!(with("/srv/t:~/.tool"), with("/srv/t:~/.tool2"));
    assert_ne!(with("/srv/t:~/.tool"), with("/srv/t:~/.tool:ro"));
    assert_ne!(with("/srv/t:~"), with("/srv/t:~/.tool"));
    let other_developer = Config::parse(&text("/srv/t:~/.tool"), Path::new("x.toml"), Path::new("/home/other")).unwrap();
    assert_eq!(other_developer.fingerprint("a").unwrap(), with("/srv/t:~/.tool"));
}

#[test]
fn unknown_profile_is_an_error() {
    let config = Config::parse(&full_text(), Path::new("x.toml"), Path::new("/h")).unwrap();
    match config.fingerprint("nope") {
        Err(ConfigError::UnknownProfile { name, known }) => {
            assert_eq!(name, "nope");
            assert_eq!(known, vec!["claude", "shell"]);
        }
        other => panic!("unexpected {other:?}"),
    }
}
