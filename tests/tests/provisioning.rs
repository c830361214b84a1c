//! Provisioning end to end (issue 14): a profile's `setup` steps install a
//! "package" from a server inside a test-made fake internet ([`NetLab`]),
//! as root in a sandbox of their own without the workspace, once; they are
//! skipped while nothing changed, run again when the list changes or with
//! `--reprovision`; a failing step is named with its output's tail, and the
//! Domain still starts with `--no-setup`; a second terminal waits for a
//! running setup and joins after it; setup output never reaches the agent.

use std::process::Stdio;
use std::time::{Duration, Instant};

use lazaret_tests::netlab::*;
use lazaret_tests::*;

/// Fetches the lab server's greeting ("hello from 11.1.1.1", the package)
/// over bash's /dev/tcp and installs it as the `fake-agent` command in
/// /usr/local/bin (persistent), printing a few lines on the way: root's
/// uid, and whether the workspace is visible.
fn install_step(workspace: &std::path::Path) -> String {
    format!(
        "[\"bash\", \"-c\", \"echo SETUP-UID-$(id -u) SETUP-TOKEN=[$LAZARET_TEST_TOKEN]; if [ -e {ws}/README ]; then echo SETUP-SEES-WORKSPACE; else echo SETUP-NO-WORKSPACE; fi; exec 3<>/dev/tcp/{PUBLIC}/{PORT}; read -r line <&3; printf '#!/bin/sh\\\\necho installed: %s\\\\n' \\\"$line\\\" > /usr/local/bin/fake-agent; chmod 755 /usr/local/bin/fake-agent; echo SETUP-INSTALLED\"]",
        ws = workspace.display()
    )
}

/// Counts the runs of the whole setup: its last step appends a line to a
/// file in the persistent /var.
const COUNT_STEP: &str = "[\"sh\", \"-c\", \"echo run >> /var/lib/setup-runs; echo SETUP-COUNTED\"]";

/// What the agent prints: the installed command's output and the count.
const AGENT: [&str; 3] = ["sh", "-c", "fake-agent; echo runs=$(wc -l < /var/lib/setup-runs)"];

/// A value of the profile's `env`, which setup must not see.
const SECRET: &str = "setup-must-not-see-this-4f1c";

fn profile(lab_dns: &str, steps: &[String]) -> String {
    format!(
        "dns = [\"{lab_dns}\"]\npersistent_dirs = [\"/usr\", \"/var\"]\nenv = {{ LAZARET_TEST_TOKEN = \"{SECRET}\" }}\nsetup = [\n  {}\n]\n",
        steps.join(",\n  ")
    )
}

fn lab_env(lab: &NetLab) -> TestEnv {
    let mut env = TestEnv::with_profile("");
    env.netns = Some(lab.host.clone());
    env
}

fn run_agent(env: &TestEnv, flags: &[&str]) -> std::process::Output {
    let mut args: Vec<&str> = vec!["run", "test"];
    args.extend(flags);
    args.push("--");
    args.extend(AGENT);
    env.run(&args)
}

fn assert_agent_ran(out: &std::process::Output, runs: usize) {
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {}", text(&out.stderr));
    assert!(stdout.contains(&format!("installed: hello from {PUBLIC}")), "the installed package runs: {stdout}");
    assert!(stdout.contains(&format!("runs={runs}\n")), "setup ran {runs} time(s): {stdout}");
    // Setup output never reaches the agent's streams.
    assert!(!stdout.contains("SETUP-"), "setup output in the agent's output: {stdout}");
}

fn setup_ran(out: &std::process::Output) -> bool {
    text(&out.stderr).contains("lazaret: setup: step 1/")
}

#[test]
fn setup_installs_once_skips_when_unchanged_and_reruns_on_change_and_on_request() {
    let lab = NetLab::new();
    let env = lab_env(&lab);
    let mut steps = vec![install_step(&env.workspace), COUNT_STEP.to_string()];
    env.write_config(&profile(DNS, &steps));

    // First start: installs. stderr is no terminal, so the steps and their
    // output are printed there (and only there).
    let first = run_agent(&env, &[]);
    assert_agent_ran(&first, 1);
    let stderr = text(&first.stderr);
    assert!(stderr.contains("lazaret: setup: step 1/2: bash -c "), "{stderr}");
    assert!(stderr.contains("lazaret: setup: step 2/2: sh -c "), "{stderr}");
    assert!(stderr.contains("SETUP-UID-0 SETUP-TOKEN=[]"), "setup runs as root, without the profile's env: {stderr}");
    assert!(!stderr.contains(SECRET), "{stderr}");
    assert!(stderr.contains("SETUP-NO-WORKSPACE"), "setup does not see the workspace: {stderr}");
    assert!(stderr.contains("lazaret: setup: done: 2 step(s)"), "{stderr}");

    // Nothing changed: skipped.
    let second = run_agent(&env, &[]);
    assert_agent_ran(&second, 1);
    assert!(!setup_ran(&second), "setup ran again: {}", text(&second.stderr));

    // --quiet hides the progress of a setup that does run (--reprovision).
    let quiet = run_agent(&env, &["-q", "--reprovision"]);
    assert_agent_ran(&quiet, 2);
    assert_eq!(text(&quiet.stderr), "", "--quiet prints nothing of the setup");

    // A changed list runs again, every step.
    steps.insert(1, "[\"sh\", \"-c\", \"echo SETUP-NEW-STEP\"]".to_string());
    env.write_config(&profile(DNS, &steps));
    let changed = run_agent(&env, &[]);
    assert_agent_ran(&changed, 3);
    let stderr = text(&changed.stderr);
    assert!(stderr.contains("lazaret: setup: step 3/3") && stderr.contains("SETUP-NEW-STEP"), "{stderr}");
    assert!(!setup_ran(&run_agent(&env, &[])), "the new list is recorded");

    // config check lists the steps.
    let check = env.run(["config", "check"]);
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(text(&check.stdout).contains("setup 3/3: sh -c "), "{}", text(&check.stdout));

    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn a_failing_step_names_itself_and_its_tail_and_the_domain_still_runs_without_setup() {
    let lab = NetLab::new();
    let env = lab_env(&lab);
    let failing = "[\"sh\", \"-c\", \"for i in $(seq 1 30); do echo fail-line-$i; done; exit 3\"]".to_string();
    env.write_config(&profile(DNS, &[install_step(&env.workspace), failing, COUNT_STEP.to_string()]));

    let failed = env.run(["run", "test", "--", "sh", "-c", "echo agent-ran"]);
    let stderr = text(&failed.stderr);
    assert_eq!(failed.status.code(), Some(125), "Lazaret's own failure: {stderr}");
    assert!(!text(&failed.stdout).contains("agent-ran"), "the agent must not start after a failed setup");
    assert!(stderr.contains("setup step 2/3 of profile \"test\" failed (exit status 3): sh -c "), "{stderr}");
    // The tail: the last 20 lines, quoted in the error.
    assert!(stderr.contains("| fail-line-30\n") && stderr.contains("| fail-line-11\n"), "{stderr}");
    assert!(!stderr.contains("| fail-line-10\n"), "only the last 20 lines: {stderr}");
    assert!(stderr.contains("--no-setup"), "the hint names the fix-up shell: {stderr}");
    assert!(!stderr.contains("SETUP-COUNTED"), "no step after the failing one runs: {stderr}");

    // A fix-up shell: the Domain as setup left it (step 1 installed).
    let fixup = env.run(["run", "test", "--no-setup", "--", "sh", "-c", "echo fixup-shell; fake-agent"]);
    assert_eq!(fixup.status.code(), Some(0), "{}", text(&fixup.stderr));
    assert!(text(&fixup.stdout).contains("fixup-shell\ninstalled: hello from"), "{}", text(&fixup.stdout));
    assert!(!setup_ran(&fixup), "--no-setup runs no step: {}", text(&fixup.stderr));
    assert!(text(&fixup.stderr).contains("setup of profile test skipped (--no-setup)"), "{}", text(&fixup.stderr));

    // Nothing was recorded: the next normal start tries again (and fails
    // again); fixed, it completes.
    let again = env.run(["run", "test", "--", "true"]);
    assert_eq!(again.status.code(), Some(125), "{}", text(&again.stderr));
    assert!(setup_ran(&again));
    env.write_config(&profile(DNS, &[install_step(&env.workspace), COUNT_STEP.to_string()]));
    assert_agent_ran(&run_agent(&env, &[]), 1);

    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn a_second_terminal_waits_for_a_running_setup_and_joins_after_it() {
    let lab = NetLab::new();
    let env = lab_env(&lab);
    let slow = "[\"sh\", \"-c\", \"echo SETUP-SLOW; sleep 4\"]".to_string();
    env.write_config(&profile(DNS, &[install_step(&env.workspace), slow, COUNT_STEP.to_string()]));

    let first = env
        .lazaret(["run", "test", "--", "sh", "-c", "fake-agent; echo runs=$(wc -l < /var/lib/setup-runs); sleep 2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("first lazaret");
    // Wait until the setup runs (its marker is in the Domain directory).
    let deadline = Instant::now() + COMMAND_LIMIT;
    let marker = loop {
        if let Some(dir) = env.domain_dir() {
            let m = dir.join("setup.running");
            if m.exists() {
                break m;
            }
        }
        assert!(Instant::now() < deadline, "the setup never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    let second = env.run(["run", "test", "--", "sh", "-c", "fake-agent; echo runs=$(wc -l < /var/lib/setup-runs)"]);
    let first = wait_output(first);
    for (name, out) in [("first", &first), ("second", &second)] {
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{name}: {stdout}\n{}", text(&out.stderr));
        assert!(
            stdout.contains("installed: hello from") && stdout.contains("runs=1\n"),
            "{name}: the agent starts after the one setup: {stdout}"
        );
    }
    assert!(
        text(&second.stderr).contains("is running its setup (started by another terminal); waiting for it"),
        "{}",
        text(&second.stderr)
    );
    assert!(!setup_ran(&second), "the second terminal ran no setup: {}", text(&second.stderr));
    assert!(!marker.exists(), "the marker is gone after setup");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn a_coordinator_killed_during_setup_is_recovered_and_the_setup_runs_again() {
    let lab = NetLab::new();
    let env = lab_env(&lab);
    let hang = "[\"sh\", \"-c\", \"echo SETUP-HANGING; sleep 1000\"]".to_string();
    env.write_config(&profile(DNS, &[install_step(&env.workspace), hang]));
    let mut child = env.lazaret(["run", "test", "--", "true"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let deadline = Instant::now() + COMMAND_LIMIT;
    while !env.domain_dir().is_some_and(|d| std::fs::read_to_string(d.join("setup.running")).is_ok_and(|m| m.starts_with("2/2"))) {
        assert!(Instant::now() < deadline, "the second step never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let coordinators = env.coordinator_pids();
    assert_eq!(coordinators.len(), 1, "{coordinators:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(coordinators[0]), nix::sys::signal::Signal::SIGKILL).expect("kill -9");
    assert_eq!(wait_with_limit(&mut child).code(), Some(125));
    assert_eq!(env.wait_no_processes(), Vec::<String>::new(), "the setup sandbox died with its coordinator");
    // The record was never written: the next start runs the (fixed) setup.
    env.write_config(&profile(DNS, &[install_step(&env.workspace), COUNT_STEP.to_string()]));
    let out = run_agent(&env, &[]);
    assert_agent_ran(&out, 1);
    assert!(setup_ran(&out), "{}", text(&out.stderr));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn on_a_terminal_the_status_line_names_the_step_and_the_output_stays_off_the_screen() {
    // No network needed: the step only prints and waits, so a fresh empty
    // network namespace (`unshare --net`) does.
    let env = TestEnv::with_profile("persistent_dirs = [\"/usr\"]\nsetup = [[\"sh\", \"-c\", \"echo SETUP-OFF-SCREEN; sleep 1\"]]\n");
    let line =
        format!("unshare --net -- {} --config {} run test -- sh -c 'echo agent-speaks'", lazaret_bin().display(), env.config.display());
    let child = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .current_dir(&env.workspace)
        .env("TERM", "xterm-256color")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning script (util-linux)");
    let out = wait_output(child);
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{shown:?}");
    assert!(
        shown.contains("lazaret: starting Domain test (setup 1/1: sh -c 'echo SETUP-OFF-SCREEN; sleep 1')")
            || shown.contains("lazaret: starting Domain test (setup 1/1: sh -c 'echo SETUP-OFF-SCREEN"),
        "the status line names the step: {shown:?}"
    );
    let agent = shown.find("agent-speaks").unwrap_or_else(|| panic!("{shown:?}"));
    assert!(!shown[agent..].contains("lazaret: starting"), "status drawn over the agent's screen: {shown:?}");
    // Only the status line mentions the step; its output is not shown.
    assert!(!shown.contains("\nSETUP-OFF-SCREEN") && !shown.contains("  SETUP-OFF-SCREEN"), "setup output on the terminal: {shown:?}");
    env.assert_nothing_left();
}
