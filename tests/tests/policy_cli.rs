//! `lazaret policy show|explain` and egress configuration errors (issue 3).

use lazaret_tests::*;

#[test]
fn show_and_explain_name_the_deciding_rule() {
    let env = TestEnv::with_profile("allow_egress = [\"10.222.0.0/16\"]\ndeny_egress = [\"198.51.100.0/24\"]\ndns = [\"10.53.0.53\"]\n");
    let show = env.run(["policy", "show", "test"]);
    assert!(show.status.success(), "stderr: {}", text(&show.stderr));
    let table = text(&show.stdout);
    let cfg = env.config.display().to_string();
    for line in [
        "10.222.0.0/16    allow",
        "10.0.0.0/8       deny",
        "169.254.0.0/16   deny",
        "0.0.0.0/0        allow",
        "10.53.0.53/32    allow",
        "::/0             deny",
    ] {
        assert!(table.contains(line), "policy show lacks {line:?}:\n{table}");
    }
    assert!(table.contains(&format!("config: {cfg}:")), "no config location in:\n{table}");
    let explain = env.run(["policy", "explain", "test", "10.222.9.9"]);
    assert!(text(&explain.stdout).starts_with("10.222.9.9: allow (rule allow 10.222.0.0/16, config:"), "{}", text(&explain.stdout));
    let explain = env.run(["policy", "explain", "test", "10.223.9.9"]);
    assert!(text(&explain.stdout).starts_with("10.223.9.9: deny (rule deny 10.0.0.0/8, default: RFC 1918"), "{}", text(&explain.stdout));
    let explain = env.run(["policy", "explain", "test", "198.51.100.7"]);
    assert!(text(&explain.stdout).starts_with("198.51.100.7: deny (rule deny 198.51.100.0/24, config:"), "{}", text(&explain.stdout));
}

fn check_error(extra: &str, needles: &[&str]) {
    let env = TestEnv::with_profile(extra);
    let out = env.run(["config", "check"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "config check accepted {extra:?}: {err}");
    let cfg = env.config.display().to_string();
    assert!(err.contains(&format!("{cfg}:")), "no location in: {err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} missing from: {err}");
    }
}

#[test]
fn equal_prefix_conflict_names_both_entries() {
    check_error(
        "allow_egress = [\"10.1.0.0/16\"]\ndeny_egress = [\"10.1.0.0/16\"]\n",
        &["10.1.0.0/16", ":8:", "line 7", "allowed", "denied"],
    );
}

#[test]
fn bad_cidr_is_located() {
    check_error("allow_egress = [\"10.1.0.0/33\"]\n", &[":7:", "33"]);
    check_error("allow_egress = [\"not-an-address/8\"]\n", &[":7:"]);
}

#[test]
fn host_bits_set_is_located_with_the_network_form() {
    check_error("allow_egress = [\"10.1.2.3/16\"]\n", &["10.1.2.3/16", "10.1.0.0/16"]);
}

#[test]
fn locked_show_and_explain_cover_names() {
    let env = TestEnv::with_profile(
        "egress = \"locked\"\nallow_egress = [\"api.anthropic.com\", \"*.npmjs.org\", \"github.com:22\", \"10.222.0.0/16\"]\ndns = [\"10.53.0.53\"]\n",
    );
    let cfg = env.config.display().to_string();
    let show = env.run(["policy", "show", "test"]);
    assert!(show.status.success(), "stderr: {}", text(&show.stderr));
    let table = text(&show.stdout);
    for line in [
        "Egress: locked",
        "0.0.0.0/0        names",
        "10.222.0.0/16    allow",
        &format!("*.npmjs.org        config: {cfg}:8:"),
        &format!("github.com:22      config: {cfg}:8:"),
    ] {
        assert!(table.contains(line), "policy show lacks {line:?}:\n{table}");
    }
    let explain = env.run(["policy", "explain", "test", "registry.npmjs.org"]);
    assert!(
        text(&explain.stdout).starts_with(&format!("registry.npmjs.org: allow, all ports (rule allow *.npmjs.org, config: {cfg}:8:")),
        "{}",
        text(&explain.stdout)
    );
    let explain = env.run(["policy", "explain", "test", "github.com"]);
    assert!(
        text(&explain.stdout).starts_with("github.com: allow, TCP/UDP port 22 only (rule allow github.com:22"),
        "{}",
        text(&explain.stdout)
    );
    let explain = env.run(["policy", "explain", "test", "evil.example"]);
    assert!(text(&explain.stdout).starts_with("evil.example: refused (no allow_egress name rule matches"), "{}", text(&explain.stdout));
    let explain = env.run(["policy", "explain", "test", "11.1.1.1"]);
    assert!(text(&explain.stdout).starts_with("11.1.1.1: deny (rule deny 0.0.0.0/0, locked mode:"), "{}", text(&explain.stdout));
    let json = env.run(["policy", "show", "test", "--json"]);
    let json = text(&json.stdout);
    assert!(json.contains("\"egress\": \"locked\"") && json.contains("\"rule\": \"github.com:22\""), "{json}");
}

#[test]
fn names_in_open_mode_are_an_error_naming_the_fix() {
    check_error("allow_egress = [\"api.anthropic.com\"]\n", &[":7:", "is a DNS name, but names are only allowed with egress = \"locked\""]);
}
