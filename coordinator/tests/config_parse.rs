//! Parsing valid configurations into typed values.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lazaret_coordinator::config::{Config, ConfigError, EnvValue, Platform, UserChoice};
use lazaret_coordinator::identity::Developer;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/config").join(name)
}

fn parse_file(path: &Path) -> Config {
    let text = std::fs::read_to_string(path).unwrap();
    match Config::parse(&text, path, Path::new("/home/dev")) {
        Ok(config) => config,
        Err(error) => panic!("{error}"),
    }
}

fn parse(text: &str) -> Config {
    match Config::parse(text, Path::new("test.toml"), Path::new("/home/dev")) {
        Ok(config) => config,
        Err(error) => panic!("{error}"),
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn full_fixture_parses_into_typed_values() {
    let config = parse_file(&fixture("full.toml"));
    assert_eq!(config.storage_root, PathBuf::from("/srv/lazaret"));
    assert_eq!(config.runtime_dir, Some(PathBuf::from("/run/lazaret-test/1000")));
    assert_eq!(config.default_profile.as_deref(), Some("claude"));
    assert_eq!(config.dns, vec![ip("1.1.1.1"), ip("2606:4700:4700::1111")]);
    assert_eq!(config.runsc.path, Some(PathBuf::from("/usr/local/bin/runsc")));
    assert_eq!(config.runsc.platform, Platform::Ptrace);
    assert_eq!(config.runsc.debug_log_dir, Some(PathBuf::from("/var/log/lazaret")));

    let global = &config.escalation;
    assert_eq!(global.prompt_timeout, Duration::from_secs(45));
    assert_eq!(global.timeout, Duration::from_secs(300));
    assert_eq!(global.output_limit, 16 << 20);
    let rules = &global.rules;
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].name, "git-push");
    assert_eq!(rules[0].command, vec!["git", "push"]);
    assert!(!rules[0].allow_extra_args);
    assert_eq!(rules[0].cwd, None);
    assert_eq!(rules[0].timeout, None);
    assert!(rules[0].env.is_empty());
    assert!(rules[0].origin.ends_with("full.toml:17:1"), "{}", rules[0].origin);
    assert!(rules[1].allow_extra_args);
    assert_eq!(rules[1].cwd, Some(PathBuf::from("src")));
    assert_eq!(rules[1].timeout, Some(Duration::from_secs(900)));
    // A set: sorted.
    assert_eq!(rules[1].env, vec!["AWS_PROFILE", "GH_TOKEN"]);

    // claude: the global rules, then its own; its own prompt_timeout.
    let claude = &config.profile("claude").unwrap().escalation;
    let names: Vec<&str> = claude.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["git-push", "make", "npm-test"]);
    assert_eq!(claude.rules[2].cwd, Some(PathBuf::from("frontend")));
    assert_eq!(claude.prompt_timeout, Duration::from_secs(30));
    assert_eq!(claude.timeout, Duration::from_secs(300));
    assert_eq!(claude.output_limit, 16 << 20);
    assert_eq!(claude.host_env_names(), vec!["SSH_AUTH_SOCK", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "AWS_PROFILE", "GH_TOKEN"]);
    // shell: the global settings as they are.
    assert_eq!(&config.profile("shell").unwrap().escalation, global);

    let claude = config.profile("claude").unwrap();
    assert_eq!(claude.name, "claude");
    assert_eq!(claude.image, "docker.io/library/debian:trixie");
    assert_eq!(claude.command, vec!["claude", "--verbose"]);
    assert!(!claude.isolate_gitignored);
    assert_eq!(claude.persistent_dirs, vec![PathBuf::from("/root"), PathBuf::from("/usr"), PathBuf::from("/var")]);
    let allow: Vec<String> = claude.allow_egress.iter().map(ToString::to_string).collect();
    assert_eq!(allow, vec!["10.222.0.0/16", "fd00:1::/64"]);
    assert_eq!(claude.allow_egress[0].prefix_len(), 16);
    assert_eq!(claude.allow_egress[0].network(), ip("10.222.0.0"));
    assert!(claude.allow_egress[0].origin.ends_with("full.toml:35:17"), "{}", claude.allow_egress[0].origin);
    assert_eq!(claude.deny_egress[0].to_string(), "10.222.13.0/24");
    assert_eq!(claude.ipv6, Some(true));
    assert_eq!(claude.dns, Some(vec![ip("10.222.0.53")]));
    assert_eq!(claude.effective_dns(&config), &[ip("10.222.0.53")]);
    let mut env = BTreeMap::new();
    env.insert("ANTHROPIC_API_KEY".to_string(), EnvValue::FromHost("ANTHROPIC_API_KEY".into()));
    env.insert("EDITOR".to_string(), EnvValue::Literal("vi".into()));
    assert_eq!(claude.env, env);
    assert_eq!(claude.volumes.len(), 2);
    assert_eq!(claude.volumes[0].host, PathBuf::from("/home/dev/.claude"));
    assert_eq!(claude.volumes[0].sandbox, lazaret_coordinator::config::SandboxPath::Absolute(PathBuf::from("/root/.claude")));
    assert!(!claude.volumes[0].readonly);
    assert_eq!(claude.volumes[0].written, "~/.claude:/root/.claude");
    assert_eq!(claude.volumes[1].host, PathBuf::from("/srv/data"));
    assert!(claude.volumes[1].readonly);
    assert_eq!(claude.user, UserChoice::Id { uid: 1000, gid: 1000 });
    assert_eq!(claude.hostname.as_deref(), Some("claude-box"));
    assert_eq!(claude.memory_limit, Some(4 << 30));
    assert_eq!(claude.pids_limit, Some(2048));
}

#[test]
fn defaults_are_filled_in() {
    let config = parse("[profiles.shell]\nimage = \"debian-bookworm\"\n");
    assert_eq!(config.storage_root, PathBuf::from("/var/lib/lazaret"));
    assert_eq!(config.runtime_dir, None);
    assert_eq!(config.runsc.platform, Platform::Systrap);
    assert_eq!(config.runsc.path, None);
    assert!(config.dns.is_empty());
    assert!(config.escalation.rules.is_empty());
    assert_eq!(config.escalation.prompt_timeout, Duration::from_secs(120));
    assert_eq!(config.escalation.timeout, Duration::from_secs(600));
    assert_eq!(config.escalation.output_limit, 64 << 20);
    assert_eq!(config.default_profile, None);
    let shell = config.profile("shell").unwrap();
    assert_eq!(shell.command, vec!["/bin/bash", "-l"]);
    assert!(shell.isolate_gitignored);
    assert!(shell.persistent_dirs.is_empty());
    assert!(shell.allow_egress.is_empty() && shell.deny_egress.is_empty());
    assert_eq!(shell.ipv6, None);
    assert_eq!(shell.dns, None);
    assert!(shell.env.is_empty() && shell.volumes.is_empty());
    assert_eq!(shell.user, UserChoice::Developer);
    assert_eq!(shell.hostname, None);
    assert_eq!(shell.memory_limit, None);
    assert_eq!(shell.pids_limit, None);
    assert_eq!(shell.escalation, config.escalation);
    assert!(shell.escalation_overrides.is_empty());
    assert_eq!(shell.escalation.host_env_names(), vec!["SSH_AUTH_SOCK", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES"]);
    assert!(shell.origin.ends_with("test.toml:1:1"), "{}", shell.origin);
}

#[test]
fn example_config_in_docs_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.example.toml");
    let config = parse_file(&path);
    let names: Vec<&str> = config.profiles.keys().map(String::as_str).collect();
    assert_eq!(names, vec!["claude", "codex", "gemini", "grok", "opencode", "shell"]);
    for agent in ["claude", "codex", "gemini", "grok", "opencode"] {
        let profile = config.profile(agent).unwrap();
        assert_eq!(profile.command[0], agent, "{agent} starts its own CLI");
        assert!(!profile.setup.is_empty(), "{agent} installs its CLI through setup");
        assert_eq!(profile.persistent_dirs.len(), 5);
        assert_eq!(profile.allow_egress[0].to_string(), "10.222.0.0/16");
        assert!(profile.volumes.is_empty(), "{agent}: the host's state directory is shared only by a commented line");
    }
    assert_eq!(config.profile("shell").unwrap().image, "debian-bookworm");
    // opencode needs one provider key; an unset `env:` variable is an error.
    assert_eq!(config.profile("opencode").unwrap().env.len(), 1);
    assert_eq!(config.profile("claude").unwrap().env.get("ANTHROPIC_API_KEY"), Some(&EnvValue::FromHost("ANTHROPIC_API_KEY".into())));
    assert_eq!(config.default_profile.as_deref(), Some("claude"));
    let global: Vec<&str> = config.escalation.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(global, vec!["git-fetch", "git-push-origin"]);
    let claude = &config.profile("claude").unwrap().escalation;
    let names: Vec<&str> = claude.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["git-fetch", "git-push-origin", "gh-pr-view"]);
    assert_eq!(claude.prompt_timeout, Duration::from_secs(60));
    assert!(claude.host_env_names().contains(&"GH_TOKEN".to_string()));
    let push = ["git", "push", "origin", "fix-123"].map(String::from);
    assert_eq!(claude.matching_rule(&push, Path::new(".")).map(|r| r.name.as_str()), Some("git-push-origin"));
    assert_eq!(claude.timeout_for(claude.matching_rule(&push, Path::new("."))), Duration::from_secs(300));
    assert_eq!(claude.timeout_for(None), Duration::from_secs(600));
    let shell = &config.profile("shell").unwrap().escalation;
    assert_eq!(shell.rules.len(), 2);
    assert_eq!(shell.prompt_timeout, Duration::from_secs(120));
}

#[test]
fn commented_example_rule_and_the_escalation_guide_are_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.example.toml");
    let example = std::fs::read_to_string(&path).unwrap();
    let commented = "# [[escalation.rules]]\n# name = \"make-test\"\n# command = [\"make\", \"test\"]\n# cwd = \".\"\n# timeout = 1800\n";
    assert_eq!(example.matches(commented).count(), 1, "the commented make-test rule moved");
    let enabled = example.replacen(commented, &commented.replace("# ", ""), 1);
    let config = parse(&enabled);
    let make = config.escalation.rules.iter().find(|r| r.name == "make-test").unwrap();
    assert_eq!(make.cwd, Some(PathBuf::from(".")));
    assert_eq!(make.timeout, Some(Duration::from_secs(1800)));

    // The TOML block of docs/escalation.md.
    let guide = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/escalation.md")).unwrap();
    let block = guide.split("```toml\n").nth(1).and_then(|rest| rest.split("```").next()).unwrap();
    let config = parse(block);
    let claude = &config.profile("claude").unwrap().escalation;
    let names: Vec<&str> = claude.rules.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, vec!["git-fetch", "git-push-origin", "make-test", "gh-pr-view"]);
    assert_eq!(config.escalation.output_limit, 64 << 20);
    let test = ["make", "test"].map(String::from);
    assert!(claude.matching_rule(&test, Path::new(".")).is_some());
    assert!(claude.matching_rule(&test, Path::new("sub")).is_none());
}

#[test]
fn rendered_toml_parses_back_to_the_same_configuration() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/config.example.toml");
    for path in [fixture("full.toml"), fixture("full_reformatted.toml"), example] {
        let config = parse_file(&path);
        let rendered = config.render_toml().unwrap();
        let again = parse(&rendered);
        // The JSON rendering leaves out locations; compare everything else.
        let json = |c: &Config| {
            let mut value: serde_json::Value = serde_json::from_str(&c.render_json().unwrap()).unwrap();
            value.as_object_mut().unwrap().remove("file");
            value
        };
        assert_eq!(json(&again), json(&config));
        for profile in config.profiles.keys() {
            assert_eq!(again.fingerprint(profile).unwrap(), config.fingerprint(profile).unwrap());
        }
    }
}

#[test]
fn a_locked_profile_renders_its_names_in_allow_egress_and_parses_back() {
    let config = parse(
        "[profiles.locked]\nimage = \"i\"\negress = \"locked\"\n\
         allow_egress = [\"api.example.com\", \"10.1.0.0/16\", \"*.npm.example:443\"]\n",
    );
    let rendered = config.render_toml().unwrap();
    assert!(!rendered.contains("allow_egress_names"), "one key, as in the file:\n{rendered}");
    let again = parse(&rendered);
    assert_eq!(again.render_json().unwrap(), config.render_json().unwrap());
    assert_eq!(again.fingerprint("locked").unwrap(), config.fingerprint("locked").unwrap());
}

#[test]
fn json_shows_env_references_not_host_values() {
    let config = parse_file(&fixture("full.toml"));
    let json: serde_json::Value = serde_json::from_str(&config.render_json().unwrap()).unwrap();
    let env = &json["profiles"]["claude"]["env"];
    assert_eq!(env["ANTHROPIC_API_KEY"], "env:ANTHROPIC_API_KEY");
    assert_eq!(env["EDITOR"], "vi");
    assert_eq!(json["profiles"]["claude"]["user"], "1000:1000");
    assert_eq!(json["profiles"]["claude"]["volumes"][1], "/srv/data:/data:ro");
    assert_eq!(json["runsc"]["platform"], "ptrace");
    assert!(json["file"].as_str().unwrap().ends_with("full.toml"));
    let toml = config.render_toml().unwrap();
    assert!(toml.contains("ANTHROPIC_API_KEY = \"env:ANTHROPIC_API_KEY\""), "{toml}");
}

#[test]
fn env_values_resolve_from_the_launching_environment() {
    let lookup = |name: &str| (name == "KEY").then(|| OsString::from("secret"));
    assert_eq!(EnvValue::FromHost("KEY".into()).resolve(&lookup), Some(OsString::from("secret")));
    assert_eq!(EnvValue::FromHost("OTHER".into()).resolve(&lookup), None);
    assert_eq!(EnvValue::Literal("x".into()).resolve(&lookup), Some(OsString::from("x")));
}

#[test]
fn profile_selection() {
    let two = parse("default_profile = \"b\"\n[profiles.a]\nimage = \"i\"\n[profiles.b]\nimage = \"i\"\n");
    assert_eq!(two.select_profile(None).unwrap().name, "b");
    assert_eq!(two.select_profile(Some("a")).unwrap().name, "a");
    let error = two.select_profile(Some("c")).unwrap_err().to_string();
    assert!(error.contains("\"c\"") && error.contains("a, b"), "{error}");

    let one = parse("[profiles.only]\nimage = \"i\"\n");
    assert_eq!(one.select_profile(None).unwrap().name, "only");
    let none_chosen = parse("[profiles.a]\nimage = \"i\"\n[profiles.b]\nimage = \"i\"\n");
    let error = none_chosen.select_profile(None).unwrap_err();
    assert!(matches!(error, ConfigError::NoProfileSelected { .. }));
    assert!(error.to_string().contains("default_profile"), "{error}");
}

#[test]
fn runtime_dir_defaults_to_run_lazaret_uid() {
    let developer = Developer {
        uid: 1234,
        gid: 1234,
        name: "dev".into(),
        home: "/home/dev".into(),
        shell: "/bin/sh".into(),
        group_name: Some("dev".into()),
        groups: Vec::new(),
    };
    let config = parse("[profiles.a]\nimage = \"i\"\n");
    assert_eq!(config.runtime_dir(&developer), PathBuf::from("/run/lazaret/1234"));
    let config = parse("runtime_dir = \"/run/x\"\n[profiles.a]\nimage = \"i\"\n");
    assert_eq!(config.runtime_dir(&developer), PathBuf::from("/run/x"));
}

#[test]
fn accepted_value_forms() {
    let config = parse(
        r#"
[profiles.a]
image = "registry.example.com:5000/team/img@sha256:0123abcd"
volumes = ["~:/home/me", "/a/./b//c:/x:rw"]
memory_limit = 1_048_576
pids_limit = 0x100
user = "root"
hostname = "a-b.example"
allow_egress = ["0.0.0.0/0", "::/0", "192.168.1.7/32"]
env = { EMPTY = "", WITH_COLON = "a:b", NOT_A_REF = "ENV:X" }
"#,
    );
    let a = config.profile("a").unwrap();
    assert_eq!(a.volumes[0].host, PathBuf::from("/home/dev"));
    assert_eq!(a.volumes[1].host, PathBuf::from("/a/b/c"));
    assert_eq!(a.memory_limit, Some(1 << 20));
    assert_eq!(a.pids_limit, Some(256));
    assert_eq!(a.user, UserChoice::Root);
    assert_eq!(a.allow_egress.len(), 3);
    assert_eq!(a.env["WITH_COLON"], EnvValue::Literal("a:b".into()));
    // Only the exact lowercase `env:` prefix is a reference.
    assert_eq!(a.env["NOT_A_REF"], EnvValue::Literal("ENV:X".into()));
}
