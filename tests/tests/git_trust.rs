//! Which git state a host command trusts (issue 32, properties 3 and 4),
//! attacked as a prompt-injected agent would, then used as the developer
//! would: a rule-approved host command, a second profile on the same
//! workspace.
//!
//! - A host command's git must not read the configuration of a repository
//!   the agent made, whatever git recurses into: `git status` and the
//!   low-level diff commands run git in every populated submodule, a
//!   program that runs git itself (a rule for `sh -c 'git status'`) is not
//!   pinned at all.
//! - One Domain's agent never gets another Domain's trust: a repository the
//!   agent of profile `test` made (while its Domain runs, or left behind
//!   after it stopped) is not "protected since the start" for the Domain of
//!   profile `b` on the same workspace.
//!
//! The attacks run with the Workspace Guard off in the attacker's Domain
//! (`LAZARET_TEST_HOOKS=1`, `LAZARET_TEST_GUARD=off`): the guard filters an
//! agent-made repository's config only after each write, a race an agent
//! can win (docs/workspace-guard.md), and these tests show that host
//! commands do not depend on that race.

use std::fs;
use std::process::{Output, Stdio};

use lazaret_tests::escalation::*;
use lazaret_tests::*;

/// `lazaret-escalate`'s exit status when the host command could not be run.
const FAILED: i32 = 126;

const GIT_ENV: &str = "env = { GIT_AUTHOR_NAME = \"Agent Smith\", GIT_AUTHOR_EMAIL = \"agent@example.invalid\", GIT_COMMITTER_NAME = \"Agent Smith\", GIT_COMMITTER_EMAIL = \"agent@example.invalid\" }\n";

fn describe(out: &Output) -> String {
    format!("status {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// `KEY=value` lines of an output.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    out.lines().find_map(|l| l.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("no {key}= in output:\n{out}"))
}

/// The test hook that runs a Domain without the Workspace Guard.
const GUARD_OFF: &[(&str, &str)] = &[("LAZARET_TEST_HOOKS", "1"), ("LAZARET_TEST_GUARD", "off")];

/// `lazaret run PROFILE -- sh -c SCRIPT`, with the Workspace Guard off when
/// `guard_off` (the test hook).
fn run(env: &TestEnv, profile: &str, script: &str, guard_off: bool) -> Output {
    let mut cmd = env.lazaret(["run", profile, "--", "sh", "-c", script]);
    if guard_off {
        cmd.envs(GUARD_OFF.iter().copied());
    }
    wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning lazaret"))
}

/// The agent makes a repository `sub` whose config runs `core.fsmonitor`
/// (a marker on the host), and registers it as a submodule of the
/// workspace's repository: a gitlink in the index and a `.gitmodules`
/// entry whose `ignore = none` overrides any `diff.ignoreSubmodules` of
/// the host.
fn plant_submodule(marker: &str) -> String {
    format!(
        "git init -q -b main sub && git -C sub commit -q --allow-empty -m s && \
         git -C sub config core.fsmonitor 'touch {marker}; false' && \
         git update-index --add --cacheinfo 160000,$(git -C sub rev-parse HEAD),sub && \
         printf '[submodule \"sub\"]\\n\\tpath = sub\\n\\turl = ./sub\\n\\tignore = none\\n' > .gitmodules && echo planted=ok"
    )
}

/// Property 3: host git recurses into the submodules of the repository it
/// is pinned to, and runs git in each with that submodule's own config; a
/// program that runs git itself is not pinned at all. None of them may
/// read the config of a repository the agent made.
#[test]
fn a_host_commands_git_never_enters_a_repository_the_agent_made() {
    let host = HostDir::new();
    let marker = host.arg("fsmonitor-ran");
    let rules = [
        Rule::new("status", &["git", "status", "--short"]),
        Rule::new("diff-files", &["git", "diff-files"]),
        Rule::new("describe", &["git", "describe", "--always", "--dirty"]),
        Rule::new("shell-status", &["sh", "-c", "git status --short"]),
        Rule::new("rev-parse", &["git", "rev-parse", "--show-toplevel"]),
    ];
    let env = developer_env(&format!("{GIT_ENV}{}", rules_toml(&rules)));
    let script = format!(
        "{}; \
         lazaret-escalate -- git status --short; echo status=$?; \
         lazaret-escalate -- git diff-files; echo diff-files=$?; \
         lazaret-escalate -- git describe --always --dirty; echo describe=$?; \
         lazaret-escalate -- sh -c 'git status --short'; echo shell-status=$?",
        plant_submodule(&marker)
    );
    let out = run(&env, "test", &script, true);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    println!("{}", describe(&out));
    assert_eq!(field(&stdout, "planted"), "ok", "the agent could not plant its submodule: {stderr}");
    assert!(
        !host.file("fsmonitor-ran").exists(),
        "a host command's git ran the core.fsmonitor of the agent's submodule\n{}",
        describe(&out)
    );
    for case in ["status", "diff-files", "describe", "shell-status"] {
        assert_eq!(field(&stdout, case), FAILED.to_string(), "{case}: refused, naming the repository\n{stderr}");
    }
    assert!(stderr.contains("sub/.git"), "the reason names the agent's repository: {stderr}");

    // The developer's own workspace, without the agent's repository: the
    // same rules run.
    fs::remove_dir_all(env.workspace.join("sub")).expect("removing the agent's repository");
    dev_git_ok(&env.workspace, &["rm", "-q", "--cached", "sub"]);
    fs::remove_file(env.workspace.join(".gitmodules")).expect(".gitmodules");
    let out = run(
        &env,
        "test",
        "lazaret-escalate -- git status --short; echo status=$?; lazaret-escalate -- git rev-parse --show-toplevel; echo top=$?",
        false,
    );
    let stdout = text(&out.stdout);
    assert_eq!(field(&stdout, "status"), "0", "{}", describe(&out));
    assert_eq!(field(&stdout, "top"), "0", "{}", describe(&out));
    assert!(!host.file("fsmonitor-ran").exists());

    // The same with the submodule's git directory where git keeps its own,
    // in the workspace repository's `.git/modules` (writable inside: only
    // its config, hooks and info are Git Sentry's), and a `gitdir:` file.
    let script = format!(
        "mkdir -p .git/modules && git init -q -b main --separate-git-dir=.git/modules/m m && git -C m commit -q --allow-empty -m m && \
         git -C m config core.fsmonitor 'touch {marker}; false' && \
         git update-index --add --cacheinfo 160000,$(git -C m rev-parse HEAD),m && echo planted=ok; \
         lazaret-escalate -- git status --short; echo status=$?"
    );
    let out = run(&env, "test", &script, true);
    println!("{}", describe(&out));
    let stdout = text(&out.stdout);
    assert_eq!(field(&stdout, "planted"), "ok", "{}", describe(&out));
    assert!(
        !host.file("fsmonitor-ran").exists(),
        "a host command's git ran the core.fsmonitor of the agent's module git directory\n{}",
        describe(&out)
    );
    assert_eq!(field(&stdout, "status"), FAILED.to_string(), "{}", describe(&out));
    assert!(text(&out.stderr).contains(".git/modules/m"), "the reason names the module git directory: {}", describe(&out));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Property 4: the agent of profile `test` makes `n/.git` in the workspace
/// while its Domain runs; the Domain of profile `b`, started on the same
/// workspace, must not take it for the developer's (Git Sentry finds it at
/// b's start), neither while `test` still runs nor after it stopped and
/// left the repository behind. The developer's own nested repository stays
/// usable from both.
#[test]
fn a_repository_one_profiles_agent_made_is_not_trusted_by_another_profile() {
    let host = HostDir::new();
    let marker = host.arg("fsmonitor-ran");
    let rules = [
        Rule::new("status-n", &["git", "-C", "n", "status", "--short"]),
        Rule::new("status-dev", &["git", "-C", "dev", "status", "--short"]),
    ];
    let profile_b = format!("\n[profiles.b]\nimage = \"{TEST_IMAGE}\"\ncommand = [\"/bin/sh\"]\n{GIT_ENV}");
    let env = developer_env(&format!("{GIT_ENV}{profile_b}{}", rules_toml(&rules)));
    // The developer's own nested repository, there before any Domain.
    let dev = env.workspace.join("dev");
    fs::create_dir(&dev).expect("mkdir dev");
    setup_git(&dev, &["init", "-q", "-b", "main"]);
    commit_file(&dev, "dev-file");
    let (uid, gid) = test_user();
    chown_tree(&env.workspace, uid, gid);

    let ask = "lazaret-escalate -- git -C n status --short; echo n=$?; lazaret-escalate -- git -C dev status --short; echo dev=$?";
    // Profile test's agent makes its repository, and its Domain keeps running.
    let holder = Holder::start(
        &env,
        "test",
        &format!("git init -q -b main n && git -C n config core.fsmonitor 'touch {marker}; false' && echo made"),
        GUARD_OFF,
    );
    assert!(env.workspace.join("n/.git/config").is_file(), "the agent's repository was not made");
    let out = run(&env, "b", ask, false);
    println!("while test runs: {}", describe(&out));
    let stdout = text(&out.stdout);
    assert!(
        !host.file("fsmonitor-ran").exists(),
        "profile b's host command ran the config of a repository profile test's agent made\n{}",
        describe(&out)
    );
    assert_eq!(field(&stdout, "n"), FAILED.to_string(), "{}", describe(&out));
    assert!(text(&out.stderr).contains("n/.git"), "the reason names the repository: {}", describe(&out));
    assert_eq!(field(&stdout, "dev"), "0", "the developer's own nested repository: {}\n{}", describe(&out), coordinator_logs(&env));
    holder.release();
    env.wait_domains_unlocked();

    // Profile test stopped; its agent's repository stays.
    assert!(env.workspace.join("n/.git/config").is_file(), "the agent's repository went away with its Domain");
    for profile in ["b", "test"] {
        let out = run(&env, profile, ask, false);
        println!("after test stopped, {profile}: {}", describe(&out));
        let stdout = text(&out.stdout);
        assert!(
            !host.file("fsmonitor-ran").exists(),
            "profile {profile}'s host command ran the config of the agent's leftover repository\n{}",
            describe(&out)
        );
        assert_eq!(field(&stdout, "n"), FAILED.to_string(), "{profile}: {}", describe(&out));
        assert_eq!(field(&stdout, "dev"), "0", "{profile}: {}", describe(&out));
        env.wait_domains_unlocked();
    }
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Property 4, crash: the Domain of profile `test` crashes (its coordinator
/// SIGKILLed) with its agent's repository `n` in the workspace, its config
/// not yet filtered. Its Workspace Guard's crash marker says so, but it is
/// in that Domain's own Domain Root, and only its own next start used to
/// sweep: the Domain of profile `b`, started on the same workspace, adopted
/// `n` as the developer's (read-only inside, untouched by its guard), and
/// the developer's own git in `n` on the host ran the agent's config.
///
/// The attacker's run has its guard off (the test hook) so that the
/// config is as the agent wrote it, as it is when a crash comes in the
/// milliseconds before the guard filters it; the test writes the crash
/// marker that run's guard would have left (its start time, the read-only
/// paths Git Sentry binds for this workspace's repository).
#[test]
fn another_profiles_crashed_run_is_swept_before_a_second_profile_adopts_its_repository() {
    let host = HostDir::new();
    let marker = host.arg("fsmonitor-ran");
    let profile_b = format!("\n[profiles.b]\nimage = \"{TEST_IMAGE}\"\ncommand = [\"/bin/sh\"]\n{GIT_ENV}");
    let env = developer_env(&format!("{GIT_ENV}{profile_b}"));
    let started_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_millis();
    let holder = Holder::start(
        &env,
        "test",
        &format!("git init -q -b main n && git -C n config core.fsmonitor 'touch {marker}; false' && echo made"),
        GUARD_OFF,
    );
    let ids = env.domain_ids();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let coordinators = env.coordinator_pids();
    assert_eq!(coordinators.len(), 1, "{coordinators:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(coordinators[0]), nix::sys::signal::Signal::SIGKILL)
        .expect("kill -9 the coordinator");
    let _ = holder.wait_ended();
    assert!(env.wait_no_processes().is_empty(), "the crashed Domain's processes are gone");
    let domain_root = env.storage.join("domains").join(&ids[0]);
    fs::write(
        domain_root.join("guard-run.json"),
        format!(r#"{{"started_ms":{started_ms},"protected":[".git/config",".git/hooks",".git/info"],"git_dirs":[]}}"#),
    )
    .expect("crash marker");
    assert!(
        fs::read_to_string(env.workspace.join("n/.git/config")).expect("n's config").contains("fsmonitor"),
        "the agent's config as written"
    );

    // Profile b starts on the same workspace.
    let out = run(&env, "b", "echo b-ran", false);
    assert_eq!(text(&out.stdout), "b-ran\n", "{}", describe(&out));
    // The developer, on the host, in the repository left behind.
    let status = developer_git(&env.workspace.join("n"), &["status", "--short"]);
    println!("developer's git status in n: {}", describe(&status));
    assert!(
        !host.file("fsmonitor-ran").exists(),
        "the developer's git in n ran the agent's core.fsmonitor after profile b's Domain adopted it\n{}",
        coordinator_logs(&env)
    );
    assert!(
        !fs::read_to_string(env.workspace.join("n/.git/config")).expect("n's config").contains("fsmonitor"),
        "n's config was not filtered"
    );
    // The crashed Domain starts again and recovers what it left.
    let out = run(&env, "test", "echo recovered", false);
    assert_eq!(text(&out.stdout), "recovered\n", "{}", describe(&out));
    env.assert_nothing_left();
}

/// Property 4, volumes: the Domain of profile `v` has its own workspace and
/// this workspace as a writable volume; its agent makes `n/.git` through
/// the volume. The Domain of profile `test` on this workspace must not
/// take `n` for the developer's: the record covers every root a sandbox
/// can write, not only its workspace.
#[test]
fn a_repository_another_domains_agent_made_through_a_volume_is_not_trusted() {
    let host = HostDir::new();
    let marker = host.arg("fsmonitor-ran");
    let rules = [Rule::new("status-n", &["git", "-C", "n", "status", "--short"])];
    let env = developer_env("");
    let ws = env.workspace.clone();
    let profile_v =
        format!("\n[profiles.v]\nimage = \"{TEST_IMAGE}\"\ncommand = [\"/bin/sh\"]\nvolumes = [\"{}:/vol\"]\n{GIT_ENV}", ws.display());
    env.write_config(&format!("{GIT_ENV}{profile_v}{}", rules_toml(&rules)));
    let ws_v = env.scratch.join("ws-v");
    fs::create_dir(&ws_v).expect("the other workspace");
    setup_git(&ws_v, &["init", "-q", "-b", "main"]);
    commit_file(&ws_v, "v-file");
    let (uid, gid) = test_user();
    chown_tree(&ws_v, uid, gid);

    let script = format!("git init -q -b main /vol/n && git -C /vol/n config core.fsmonitor 'touch {marker}; false' && echo made");
    let out = wait_output(
        env.lazaret(["run", "v", "--", "sh", "-c", &script])
            .current_dir(&ws_v)
            .envs(GUARD_OFF.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning profile v"),
    );
    assert_eq!(text(&out.stdout), "made\n", "{}", describe(&out));
    assert!(ws.join("n/.git/config").is_file(), "the agent's repository is in this workspace");
    env.wait_domains_unlocked();

    let out = run(&env, "test", "lazaret-escalate -- git -C n status --short; echo n=$?", false);
    println!("{}", describe(&out));
    assert!(
        !host.file("fsmonitor-ran").exists(),
        "profile test's host command ran the config of the repository profile v's agent made through its volume\n{}",
        describe(&out)
    );
    assert_eq!(field(&text(&out.stdout), "n"), FAILED.to_string(), "{}", describe(&out));
    env.assert_nothing_left();
}
