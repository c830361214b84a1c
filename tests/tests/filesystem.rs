//! The sandbox's filesystem end to end (issue 4): Git operations from
//! inside, Git Sentry, Ignored Workspace State, State Anchor persistence,
//! isolation of two profiles, and hostile workspace layouts.

use std::fs;
use std::os::unix::fs::symlink;

use lazaret_tests::*;

const GIT_ENV: &str = "env = { GIT_AUTHOR_NAME = \"Agent Smith\", GIT_AUTHOR_EMAIL = \"agent@example.invalid\", GIT_COMMITTER_NAME = \"Agent Smith\", GIT_COMMITTER_EMAIL = \"agent@example.invalid\" }\n";

fn sh(env: &TestEnv, script: &str) -> std::process::Output {
    env.run(["run", "test", "--", "sh", "-c", script])
}

#[test]
fn git_operations_from_inside_are_visible_on_the_host_at_once() {
    let env = TestEnv::with_profile(&format!("user = \"root\"\n{GIT_ENV}"));
    let out = sh(
        &env,
        "set -e; echo one > a.txt; git status --short; git add a.txt; git commit -qm 'agent commit'; \
         git branch feature; git tag v1; echo two >> a.txt; git stash -q; git stash pop -q; \
         git commit -qam second; git reset -q --hard HEAD~1; git log --format=%s -1",
    );
    let stdout = ok(&out);
    assert!(stdout.contains("?? a.txt"), "git status inside: {stdout}");
    assert!(stdout.ends_with("agent commit\n"), "{stdout}");
    let ws = &env.workspace;
    assert_eq!(git(ws, &["log", "--format=%an <%ae>|%s", "-1"]).trim(), "Agent Smith <agent@example.invalid>|agent commit");
    assert_eq!(git(ws, &["rev-parse", "feature"]), git(ws, &["rev-parse", "HEAD"]));
    assert_eq!(git(ws, &["rev-parse", "v1^{commit}"]), git(ws, &["rev-parse", "HEAD"]));
    assert_eq!(fs::read_to_string(ws.join("a.txt")).expect("a.txt"), "one\n");
    assert!(git(ws, &["status", "--short"]).is_empty(), "host sees a dirty tree");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn git_sentry_keeps_hooks_and_config_read_only_and_host_hooks_still_run() {
    let env = TestEnv::new();
    let ws = &env.workspace;
    fs::create_dir_all(ws.join(".githooks")).expect("hooks path");
    git(ws, &["config", "core.hooksPath", ".githooks"]);
    fs::write(ws.join(".git/config.worktree"), "").expect("config.worktree");
    let marker = env.scratch.join("hook-ran");
    fs::write(ws.join(".githooks/pre-commit"), format!("#!/bin/sh\ntouch {}\n", marker.display())).expect("hook");
    fs::set_permissions(ws.join(".githooks/pre-commit"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    fs::write(ws.join(".git/hooks/post-commit"), "#!/bin/sh\ntrue\n").expect("hook 2");
    let probe = env.install_probe();
    let w = ws.display().to_string();
    let out = env.run([
        "run".to_string(),
        "test".into(),
        "--".into(),
        probe.display().to_string(),
        "cannot-write".into(),
        format!("{w}/.git/hooks/pre-commit"),
        format!("{w}/.git/hooks/post-commit"),
        format!("{w}/.git/config"),
        format!("{w}/.git/config.worktree"),
        format!("{w}/.githooks/pre-commit"),
        format!("{w}/.githooks/new-hook"),
    ]);
    assert_eq!(out.status.code(), Some(PROBE_PASS), "probe stderr: {}", text(&out.stderr));
    assert_eq!(fs::read_to_string(ws.join(".git/hooks/post-commit")).expect("hook"), "#!/bin/sh\ntrue\n");
    // The host's own hook still runs on a host commit.
    fs::write(ws.join("host.txt"), "h").expect("host file");
    git(ws, &["add", "host.txt"]);
    git(ws, &["-c", "user.name=h", "-c", "user.email=h@example.invalid", "commit", "-qm", "host commit"]);
    assert!(marker.exists(), "the host's pre-commit hook did not run");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn ignored_directories_are_domain_state_in_both_directions_and_persist() {
    let env = TestEnv::new();
    let ws = &env.workspace;
    fs::write(ws.join(".gitignore"), "node_modules/\n.venv/\ntarget/\n").expect(".gitignore");
    fs::create_dir_all(ws.join("node_modules")).expect("node_modules");
    fs::write(ws.join("node_modules/host-only"), "host").expect("host file");
    let out = sh(
        &env,
        "set -e; ls -A node_modules; echo --; mkdir -p .venv target; echo s > node_modules/sandbox-only; echo v > .venv/v; echo t > target/t",
    );
    assert_eq!(ok(&out), "--\n", "the sandbox saw the host's node_modules");
    assert!(!ws.join("node_modules/sandbox-only").exists(), "the sandbox's node_modules leaked to the host");
    assert!(!ws.join(".venv/v").exists() && !ws.join("target/t").exists(), "sandbox state leaked to the host");
    assert_eq!(fs::read_to_string(ws.join("node_modules/host-only")).expect("host file"), "host");
    let out = sh(&env, "cat node_modules/sandbox-only .venv/v target/t; ls -A node_modules");
    assert_eq!(ok(&out), "s\nv\nt\nsandbox-only\n", "ignored state did not persist across runs");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn isolation_off_shows_host_content_at_ignored_paths() {
    let env = TestEnv::with_profile("user = \"root\"\nisolate_gitignored = false\n");
    let ws = &env.workspace;
    fs::write(ws.join(".gitignore"), "node_modules/\n").expect(".gitignore");
    fs::create_dir_all(ws.join("node_modules")).expect("node_modules");
    fs::write(ws.join("node_modules/host-only"), "host").expect("host file");
    assert_eq!(ok(&sh(&env, "cat node_modules/host-only")), "host");
}

#[test]
fn persistent_dirs_persist_and_everything_else_is_fresh() {
    let env = TestEnv::with_profile("user = \"root\"\npersistent_dirs = [\"/root\", \"/usr\"]\n");
    ok(&sh(&env, "set -e; echo tool > /usr/local/bin/agent-tool; echo r > /root/keep; echo t > /tmp/gone; echo e > /etc/gone"));
    let out = sh(&env, "cat /usr/local/bin/agent-tool /root/keep; ls /tmp/gone /etc/gone 2>&1 | wc -l");
    assert_eq!(ok(&out), "tool\nr\n2\n");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn two_profiles_on_one_workspace_have_separate_state() {
    let env = TestEnv::with_profile(
        "user = \"root\"\npersistent_dirs = [\"/root\"]\n\n[profiles.other]\nimage = \"test\"\ncommand = [\"/bin/sh\"]\nuser = \"root\"\npersistent_dirs = [\"/root\"]\n",
    );
    fs::write(env.workspace.join(".gitignore"), "node_modules/\n").expect(".gitignore");
    ok(&sh(&env, "set -e; echo mine > /root/keep; mkdir -p node_modules; echo mine > node_modules/x"));
    let out = env.run(["run", "other", "--", "sh", "-c", "ls /root/keep node_modules/x 2>&1 | wc -l"]);
    assert_eq!(ok(&out), "2\n", "profile `other` saw profile `test`'s state");
    assert_eq!(env.domain_ids().len(), 2, "two Domains expected");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn hostile_layouts_never_expose_host_paths() {
    let secret = std::path::PathBuf::from(format!("/root/lazaret-e2e-hostile-{}", std::process::id()));
    fs::create_dir_all(&secret).expect("secret dir");
    fs::write(secret.join("secret"), "s3cret").expect("secret");
    let cleanup = Cleanup(secret.clone());

    // An ignored directory replaced by a symlink to a host path: inside it
    // resolves within the sandbox, never to the host's directory.
    let env = TestEnv::new();
    fs::write(env.workspace.join(".gitignore"), "node_modules/\n").expect(".gitignore");
    symlink(&secret, env.workspace.join("node_modules")).expect("symlink");
    let out = sh(&env, "cat node_modules/secret 2>/dev/null || echo unreadable");
    assert_eq!(ok(&out), "unreadable\n");

    // .git/hooks replaced by a symlink: refused, naming the path.
    let env = TestEnv::new();
    fs::remove_dir_all(env.workspace.join(".git/hooks")).expect("rm hooks");
    symlink(&secret, env.workspace.join(".git/hooks")).expect("symlink hooks");
    let out = sh(&env, "true");
    assert_eq!(out.status.code(), Some(125), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains(".git/hooks"), "stderr: {}", text(&out.stderr));
    env.assert_nothing_left();
    env.assert_journal_conforms();

    // The .git directory replaced by a symlink to another repository.
    let env = TestEnv::new();
    let other = env.scratch.join("other-repo");
    fs::create_dir_all(&other).expect("other");
    git(&other, &["init", "-q"]);
    fs::remove_dir_all(env.workspace.join(".git")).expect("rm .git");
    symlink(other.join(".git"), env.workspace.join(".git")).expect("symlink .git");
    let out = sh(&env, "true");
    assert_eq!(out.status.code(), Some(125), "a symlinked .git was accepted; stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains(".git"), "stderr: {}", text(&out.stderr));

    // The workspace root itself replaced by a symlink to a host directory.
    let env = TestEnv::new();
    let elsewhere = env.scratch.join("ws-link");
    symlink(&secret, &elsewhere).expect("symlink root");
    let out = env.run(["run".as_ref(), "test".as_ref(), "-C".as_ref(), elsewhere.as_os_str(), "--".as_ref(), "true".as_ref()]);
    assert_eq!(out.status.code(), Some(125), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains("not inside a git checkout"), "stderr: {}", text(&out.stderr));
    assert_eq!(fs::read_to_string(secret.join("secret")).expect("secret"), "s3cret");
    drop(cleanup);
}

struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The record of a Domain's isolated paths, in its Domain Root.
fn isolation_record(env: &TestEnv) -> std::path::PathBuf {
    let ids = env.domain_ids();
    assert_eq!(ids.len(), 1, "one Domain expected: {ids:?}");
    std::path::Path::new(TEST_STORAGE).join("domains").join(&ids[0]).join("isolated-paths.json")
}

fn coordinator_log(env: &TestEnv) -> String {
    fs::read_to_string(env.domain_dir().expect("domain dir").join("coordinator.log")).unwrap_or_default()
}

/// Runs `script` in a new Domain start (the previous run's Domain is down first).
fn fresh_start(env: &TestEnv, script: &str) -> std::process::Output {
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the previous run's Domain is still up");
    sh(env, script)
}

/// Sticky isolation (issue 13, item 3): the host's `secret` (ignored by the
/// root `.gitignore`) is isolated in run 1, where the agent `untie`s it from
/// the ignore rules; run 2 still shows the agent its own Domain-scoped copy,
/// never the host's; after `lazaret reset-isolation`, run 3 follows the
/// current rules, which no longer isolate it.
fn isolation_stays_until_reset(secret: &str, untie: &str) {
    use std::os::unix::fs::MetadataExt;
    let env = TestEnv::new();
    let ws = &env.workspace;
    fs::write(ws.join(".gitignore"), ".env\n").expect(".gitignore");
    fs::create_dir_all(ws.join(secret).parent().expect("parent")).expect("secret's directory");
    fs::write(ws.join(secret), "s3cret\n").expect("secret");
    git(ws, &["add", ".gitignore"]);
    git(ws, &["-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "ignore .env"]);

    let out = fresh_start(&env, &format!("set -e; cat {secret}; echo agent > {secret}; {untie}"));
    assert_eq!(ok(&out), "", "run 1 saw the host's {secret}");
    assert!(
        !git(ws, &["status", "--porcelain", "--ignored"]).contains(&format!("!! {secret}")),
        "the agent's change did not un-ignore {secret} on the host"
    );
    let record = isolation_record(&env);
    let meta = fs::symlink_metadata(&record).expect("the record exists in the Domain Root");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600), "the record must be root's alone");
    assert!(fs::read_to_string(&record).expect("record").contains(&format!("{{\"path\":\"{secret}\",\"kind\":\"file\"}}")));

    let out = fresh_start(&env, &format!("cat {secret}; echo again > {secret}"));
    assert_eq!(ok(&out), "agent\n", "run 2 must see the Domain's own {secret}, not the host's");
    assert!(
        text(&out.stderr).contains("lazaret: note: 1 path(s) stay isolated") && text(&out.stderr).contains("lazaret reset-isolation test"),
        "stderr: {}",
        text(&out.stderr)
    );
    assert_eq!(fs::read_to_string(ws.join(secret)).expect("host secret"), "s3cret\n", "the sandbox wrote the host's {secret}");
    let log = coordinator_log(&env);
    assert!(log.contains(&format!("sticky isolation: {secret} stays isolated")), "coordinator.log: {log}");

    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    let out = env.run(["reset-isolation", "test"]);
    assert!(ok(&out).starts_with("forgot 1 recorded isolated path(s)"), "{}", text(&out.stdout));
    assert!(!record.exists(), "the record was not deleted");

    let out = fresh_start(&env, &format!("cat {secret}"));
    assert_eq!(ok(&out), "s3cret\n", "after the reset, the current rules (which no longer ignore {secret}) apply");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn sticky_isolation_survives_a_removed_pattern() {
    isolation_stays_until_reset(".env", ": > .gitignore");
}

#[test]
fn sticky_isolation_survives_a_negation() {
    isolation_stays_until_reset(".env", "printf '.env\\n!.env\\n' > .gitignore");
}

#[test]
fn sticky_isolation_survives_a_nested_repository_above_the_path() {
    isolation_stays_until_reset("app/.env", "git init -q app");
}

#[test]
fn a_newly_ignored_path_is_isolated_from_the_next_start_on_and_stays_so() {
    let env = TestEnv::new();
    let ws = &env.workspace;
    fs::write(ws.join("credentials"), "host\n").expect("credentials");
    assert_eq!(ok(&fresh_start(&env, "cat credentials")), "host\n", "not ignored yet: shared");
    fs::write(ws.join(".gitignore"), "credentials\n").expect("ignore it");
    let out = fresh_start(&env, "cat credentials; echo mine > credentials; rm .gitignore");
    assert_eq!(ok(&out), "", "newly ignored: isolated from this start");
    assert!(!ws.join(".gitignore").exists(), "the agent's removal of .gitignore did not reach the host");
    assert_eq!(ok(&fresh_start(&env, "cat credentials")), "mine\n", "no longer ignored, still isolated");
    assert_eq!(fs::read_to_string(ws.join("credentials")).expect("credentials"), "host\n");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn reset_isolation_is_refused_while_the_domain_runs_and_a_damaged_record_stops_the_start() {
    let env = TestEnv::new();
    fs::write(env.workspace.join(".gitignore"), ".env\n").expect(".gitignore");
    fs::write(env.workspace.join(".env"), "s3cret\n").expect(".env");
    let mut running = env
        .lazaret(["run", "test", "--", "sh", "-c", "cat > /dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = std::time::Instant::now() + COMMAND_LIMIT;
    while env.domain_dir().is_none_or(|d| !lazaret_coordinator::layout::DomainDir::new(d).socket().exists())
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let refused = env.run(["reset-isolation", "test"]);
    drop(running.stdin.take());
    assert_eq!(wait_with_limit(&mut running).code(), Some(0));
    assert_eq!(refused.status.code(), Some(125), "stdout: {}", text(&refused.stdout));
    assert!(text(&refused.stderr).contains("lazaret stop test"), "stderr: {}", text(&refused.stderr));
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    let record = isolation_record(&env);
    assert!(record.exists(), "the refused reset deleted the record");

    fs::write(&record, "{\"version\": 1, \"paths\": [").expect("damage the record");
    let out = fresh_start(&env, "cat .env");
    assert_eq!(out.status.code(), Some(125), "a damaged record must stop the start; stdout: {}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("isolated-paths.json") && text(&out.stderr).contains("reset-isolation"),
        "stderr: {}",
        text(&out.stderr)
    );
    let out = env.run(["reset-isolation", "test"]);
    assert!(ok(&out).starts_with("deleted the unreadable"), "{}", text(&out.stdout));
    assert_eq!(ok(&fresh_start(&env, "cat .env")), "", "still ignored by the current rules: isolated");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// The parents of an isolated path are pinned: the agent cannot rename
/// `app` so as to move the host's `app/.env` to a path no rule isolates.
#[test]
fn renaming_the_parent_of_an_isolated_path_is_refused() {
    let env = TestEnv::new();
    let ws = &env.workspace;
    fs::write(ws.join(".gitignore"), "/app/.env\n").expect(".gitignore");
    fs::create_dir_all(ws.join("app")).expect("app");
    fs::write(ws.join("app/.env"), "s3cret\n").expect("secret");
    let out = fresh_start(
        &env,
        "mv app app2 2>/dev/null && echo moved; mv app/.env app/moved 2>/dev/null && echo moved; : > .gitignore; echo mine > app/.env",
    );
    assert_eq!(ok(&out), "", "an isolated path or its parent was renamed");
    assert!(!ws.join("app2").exists() && !ws.join("app/moved").exists());
    assert_eq!(fs::read_to_string(ws.join("app/.env")).expect("secret"), "s3cret\n");
    assert_eq!(ok(&fresh_start(&env, "cat app/.env; test ! -e app2")), "mine\n", "the host's secret was exposed");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}
