//! The Rust model and `Lazaret.tla` / `Lazaret.cfg` use the same names, so the
//! mapping in README.md cannot drift silently.

use lazaret_protocol::model::{Action, Config, Invariant, LivenessProperty};

fn read(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// Whether `spec` defines the operator `name` at the start of a line.
fn defines(spec: &str, name: &str) -> bool {
    spec.lines().any(|line| line.strip_prefix(name).is_some_and(|rest| rest.starts_with('(') || rest.trim_start().starts_with("==")))
}

/// The names listed under a section keyword of the .cfg file.
fn cfg_section(cfg: &str, keyword: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in cfg.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with("\\*") {
            continue;
        }
        if !line.starts_with(' ') {
            inside = trimmed == keyword;
            continue;
        }
        if inside {
            names.push(trimmed.to_owned());
        }
    }
    names
}

#[test]
fn every_rust_action_is_a_tla_action_and_in_next() {
    let spec = read("Lazaret.tla");
    let next_part = spec.split("DomainProgress(d) ==").nth(1).expect("the Next section exists");
    let config = Config::two_domain_fixture();
    for action in Action::all(&config) {
        let name = action.name();
        assert!(defines(&spec, name), "{name} is not defined in Lazaret.tla");
        assert!(next_part.contains(&format!("{name}(")), "{name} is not part of Next in Lazaret.tla");
    }
}

#[test]
fn invariants_match_the_cfg_in_order() {
    let spec = read("Lazaret.tla");
    let cfg = read("Lazaret.cfg");
    let listed = cfg_section(&cfg, "INVARIANTS");
    let rust: Vec<String> = Invariant::ALL.iter().map(|i| format!("{i:?}")).collect();
    assert_eq!(listed, rust, "Lazaret.cfg INVARIANTS and model::Invariant::ALL differ");
    for name in &rust {
        assert!(defines(&spec, name), "{name} is not defined in Lazaret.tla");
    }
}

#[test]
fn liveness_properties_match_the_cfg() {
    let spec = read("Lazaret.tla");
    let cfg = read("Lazaret.cfg");
    let listed = cfg_section(&cfg, "PROPERTIES");
    let config = Config::user_fixture();
    let mut rust: Vec<String> =
        LivenessProperty::all(&config).into_iter().map(|p| p.describe(&config).split('(').next().unwrap_or_default().to_owned()).collect();
    rust.dedup();
    assert_eq!(listed, rust);
    for name in &rust {
        assert!(defines(&spec, name));
    }
}

#[test]
fn the_cfg_fixture_is_the_rust_fixture() {
    let spec = read("Lazaret.tla");
    let config = Config::user_fixture();
    // Names, fingerprints and request bindings as written in the .tla fixture.
    for session in &config.sessions {
        assert!(spec.contains(&format!("({} :> \"{}\")", session.name, session.fingerprint)));
    }
    assert!(spec.contains(&format!("DomainFingerprintFixture == {} :> \"{}\"", config.domains[0].name, config.domains[0].fingerprint)));
    for request in &config.requests {
        let session = &config.sessions[request.session.0].name;
        let command = &config.commands[request.command.0].name;
        let valid = if request.certificate_valid { "TRUE" } else { "FALSE" };
        assert!(spec.contains(&format!("({} :> {session})", request.name)));
        assert!(spec.contains(&format!("({} :> {command})", request.name)));
        assert!(spec.contains(&format!("({} :> {valid})", request.name)));
    }
    let auto: Vec<&str> = config.commands.iter().filter(|c| c.auto_approved).map(|c| c.name.as_str()).collect();
    assert!(spec.contains(&format!("AutoApprovedCommandsFixture == {{{}}}", auto.join(", "))));
}
