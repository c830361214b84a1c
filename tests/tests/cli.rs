//! CLI conventions end to end (issue 14, item 7): `lazaret` alone runs the
//! default profile, exit codes 125/126/127, `--json` on every listing
//! command, completions and the man page, NO_COLOR, the start-up status
//! line only on a terminal, `--quiet` and `--verbose`.

use std::fs;
use std::process::{Command, Output, Stdio};

use lazaret_tests::*;

/// `lazaret ARGS` with a terminal as stdin, stdout and stderr (`script`,
/// util-linux), in a fresh network namespace; returns what the terminal
/// showed and the exit status.
fn on_terminal(env: &TestEnv, args: &str, extra_env: &[(&str, &str)]) -> (String, Option<i32>) {
    let line = format!("unshare --net -- {} --config {} {args}", lazaret_bin().display(), env.config.display());
    let mut cmd = Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"])
        .current_dir(&env.workspace)
        .env("TERM", "xterm-256color")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning script (util-linux)");
    let out = wait_output(child);
    (text(&out.stdout), out.status.code())
}

fn json_of(out: &Output, what: &str) -> serde_json::Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {}\nstderr: {}", text(&out.stdout), text(&out.stderr)))
}

#[test]
fn no_arguments_run_the_default_profile() {
    let env = TestEnv::new();
    // The only profile is the default; its own command, not a shell.
    let config = format!(
        "storage_root = \"{TEST_STORAGE}\"\nruntime_dir = \"{}\"\n\n[profiles.hello]\nimage = \"{TEST_IMAGE}\"\nuser = \"root\"\ncommand = [\"sh\", \"-c\", \"echo hi from $0; exit 3\"]\n",
        env.runtime_dir.display()
    );
    fs::write(&env.config, config).expect("config");
    let out = env.run(Vec::<&str>::new());
    assert_eq!(text(&out.stdout), "hi from sh\n", "stderr: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    // Global options before the (absent) command still count.
    let out = env.run(["--quiet"]);
    assert_eq!((text(&out.stdout).as_str(), out.status.code()), ("hi from sh\n", Some(3)), "stderr: {}", text(&out.stderr));
    let help = env.run(["--help"]);
    assert!(help.status.success() && text(&help.stdout).contains("Usage: lazaret"), "{}", text(&help.stdout));
    env.assert_nothing_left();
}

#[test]
fn exit_codes_tell_not_found_not_executable_and_lazaret_s_failure() {
    let env = TestEnv::new();
    let out = env.run(["run", "test", "--", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(127), "stderr: {}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line says what was not found: {err}");
    assert!(err.contains("/nonexistent") && err.contains("no such file"), "{err}");

    let out = env.run(["run", "test", "--", "no-such-command-here"]);
    assert_eq!(out.status.code(), Some(127), "stderr: {}", text(&out.stderr));

    let out = env.run(["run", "test", "--", "/etc/passwd"]);
    assert_eq!(out.status.code(), Some(126), "stderr: {}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/etc/passwd") && err.contains("permission denied"), "{err}");

    // The agent's own 126, 127 and 128 are its own.
    for code in [126, 127, 128] {
        let out = env.run(["run", "test", "--", "sh", "-c", &format!("exit {code}")]);
        assert_eq!(out.status.code(), Some(code), "stderr: {}", text(&out.stderr));
    }

    let out = env.run(["run", "no-such-profile"]);
    assert_eq!(out.status.code(), Some(125), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).starts_with("lazaret: error: "), "{}", text(&out.stderr));
    env.assert_nothing_left();
}

#[test]
fn every_listing_command_speaks_json() {
    let env = TestEnv::new();
    let run = env.run(["run", "test", "--", "true"]);
    assert_eq!(run.status.code(), Some(0), "stderr: {}", text(&run.stderr));
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());

    let ls = json_of(&env.run(["ls", "--json"]), "ls");
    assert!(ls.is_array(), "{ls}");
    let images = json_of(&env.run(["image", "ls", "--json"]), "image ls");
    let test =
        images.as_array().and_then(|a| a.iter().find(|i| i["name"] == TEST_IMAGE)).unwrap_or_else(|| panic!("no {TEST_IMAGE} in {images}"));
    assert!(
        test["digest"].as_str().is_some_and(|d| d.starts_with("sha256:")) && test["size"].is_u64() && test["created"].is_string(),
        "{test}"
    );
    let inspect = json_of(&env.run(["image", "inspect", TEST_IMAGE, "--json"]), "image inspect");
    assert!(inspect.is_object(), "{inspect}");
    let policy = json_of(&env.run(["policy", "show", "test", "--json"]), "policy show");
    let rules = policy["rules"].as_array().unwrap_or_else(|| panic!("no rules in {policy}"));
    assert!(rules.iter().any(|r| r["prefix"] == "10.0.0.0/8" && r["action"] == "deny" && r["origin"].is_string()), "{policy}");
    assert!(policy["resolvers"].is_array() && policy["ipv6"].is_boolean(), "{policy}");
    let verdict = json_of(&env.run(["policy", "explain", "test", "10.1.2.3", "--json"]), "policy explain");
    assert_eq!(
        (&verdict["address"], &verdict["action"], &verdict["rule"]["prefix"]),
        (&"10.1.2.3".into(), &"deny".into(), &"10.0.0.0/8".into()),
        "{verdict}"
    );
    let journal = json_of(&env.run(["journal", "test", "--json"]), "journal");
    let entries = journal.as_array().unwrap_or_else(|| panic!("{journal}"));
    assert!(entries.iter().any(|e| e["event"] == "PublishDomain" || e.to_string().contains("PublishDomain")), "{journal}");
    let checked = json_of(&env.run(["journal", "test", "--check", "--json"]), "journal --check");
    assert!(
        checked.as_array().is_some_and(|a| !a.is_empty() && a.iter().all(|c| c["entries"].is_u64() && c["complete"].is_boolean())),
        "{checked}"
    );
    // doctor may find a failing check on this machine (exit 1); its JSON holds either way.
    let doctor = json_of(&env.run(["doctor", "--json"]), "doctor");
    assert!(
        doctor.as_array().is_some_and(|a| !a.is_empty() && a.iter().all(|c| c["name"].is_string() && c["ok"].is_boolean())),
        "{doctor}"
    );
    let show = json_of(&env.run(["config", "show", "--json"]), "config show");
    assert!(show.is_object(), "{show}");
    let check = json_of(&env.run(["config", "check", "--json"]), "config check");
    assert_eq!(check["file"], env.config.display().to_string(), "{check}");
    assert!(check["profiles"].as_array().is_some_and(|p| p.iter().any(|p| p["name"] == "test" && p["fingerprint"].is_string())), "{check}");
    env.assert_nothing_left();
}

#[test]
fn completions_and_the_man_page_come_from_the_command_definition() {
    let env = TestEnv::new();
    for shell in ["bash", "zsh", "fish"] {
        let out = env.run(["completions", shell]);
        let script = text(&out.stdout);
        assert!(out.status.success() && !script.is_empty(), "{shell}: {}", text(&out.stderr));
        for word in ["run", "journal", "json", "quiet"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
        assert!(!script.contains("__coordinator"), "{shell} completion offers the internal subcommand");
    }
    let out = env.run(["man"]);
    let page = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // clap_mangen defines a quote string before the title: .TH is the first macro that prints.
    let first_macro = page.lines().find(|l| l.starts_with('.') && !l.starts_with(".ie") && !l.starts_with(".el")).unwrap_or_default();
    assert!(first_macro.starts_with(".TH lazaret 1"), "{}", &page[..page.len().min(300)]);
    for needle in [".SH SYNOPSIS", "Exit status", "127", "NO_COLOR"] {
        assert!(page.contains(needle), "the man page lacks {needle}");
    }
}

#[test]
fn help_is_colored_only_on_a_terminal_without_no_color() {
    let env = TestEnv::new();
    let (colored, code) = on_terminal(&env, "--help", &[]);
    assert_eq!(code, Some(0), "{colored}");
    assert!(colored.contains("Usage:") && colored.contains("\x1b["), "clap colors help on a terminal: {colored:?}");
    let (plain, code) = on_terminal(&env, "--help", &[("NO_COLOR", "1")]);
    assert_eq!(code, Some(0), "{plain}");
    assert!(plain.contains("Usage:") && !plain.contains('\x1b'), "NO_COLOR=1 still colored: {plain:?}");
    // An empty NO_COLOR does not count.
    let (empty, _) = on_terminal(&env, "--help", &[("NO_COLOR", "")]);
    assert!(empty.contains("\x1b["), "{empty:?}");
    let piped = env.run(["--help"]);
    assert!(!text(&piped.stdout).contains('\x1b'), "colored into a pipe");
}

#[test]
fn the_status_line_is_drawn_on_a_terminal_and_erased_before_the_agent_s_output() {
    let env = TestEnv::new();
    let (shown, code) = on_terminal(&env, "run test -- sh -c 'echo agent-speaks'", &[]);
    assert_eq!(code, Some(0), "{shown:?}");
    let status = shown.rfind("lazaret: starting Domain test").unwrap_or_else(|| panic!("no status line: {shown:?}"));
    let erased =
        shown[status..].find("\r\x1b[2K").map(|i| status + i).unwrap_or_else(|| panic!("the status line is never erased: {shown:?}"));
    let agent = shown.find("agent-speaks").unwrap_or_else(|| panic!("{shown:?}"));
    assert!(erased < agent, "the agent's output starts before the status line is erased: {shown:?}");
    assert!(!shown[agent..].contains("lazaret: starting"), "status drawn over the agent's screen: {shown:?}");
    env.assert_nothing_left();
}

#[test]
fn nothing_extra_reaches_stderr_when_it_is_not_a_terminal() {
    let env = TestEnv::new();
    let err_path = env.scratch.join("stderr.txt");
    let err_file = fs::File::create(&err_path).expect("stderr file");
    let child = env
        .lazaret(["run", "test", "--", "sh", "-c", "echo to-stdout; echo to-stderr >&2; echo more >&2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::from(err_file))
        .spawn()
        .expect("spawn");
    let out = wait_output(child);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "to-stdout\n");
    assert_eq!(fs::read_to_string(&err_path).expect("stderr file"), "to-stderr\nmore\n", "exactly what the agent wrote");
    env.assert_nothing_left();
}

#[test]
fn quiet_hides_warnings_and_verbose_shows_the_stages() {
    // An ignored symlink cannot be isolated: start-up warns about it.
    let env = TestEnv::with_profile("user = \"root\"\nisolate_gitignored = true\n");
    fs::write(env.workspace.join(".gitignore"), "link\n").expect(".gitignore");
    std::os::unix::fs::symlink("README", env.workspace.join("link")).expect("symlink");
    let out = env.run(["run", "test", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("lazaret: warning: link: ignored but a symlink"),
        "the warning this test relies on: {}",
        text(&out.stderr)
    );
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());

    let out = env.run(["--quiet", "run", "test", "--", "sh", "-c", "echo agent-err >&2"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "agent-err\n", "--quiet leaves only the agent's stderr");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());

    let out = env.run(["run", "-v", "test", "--", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {err}");
    for needle in ["coordinator.log", "s stage lock", "s stage sandbox-created", "s stage published", "Domain test started"] {
        assert!(err.contains(needle), "--verbose lacks {needle:?}: {err}");
    }
    let errors = env.run(["--quiet", "run", "no-such-profile"]);
    assert!(text(&errors.stderr).starts_with("lazaret: error: "), "--quiet keeps errors: {}", text(&errors.stderr));
    env.assert_nothing_left();
}
