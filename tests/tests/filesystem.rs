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

fn ok(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(0), "stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
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
        "run".to_string(), "test".into(), "--".into(), probe.display().to_string(), "cannot-write".into(),
        format!("{w}/.git/hooks/pre-commit"), format!("{w}/.git/hooks/post-commit"), format!("{w}/.git/config"),
        format!("{w}/.git/config.worktree"), format!("{w}/.githooks/pre-commit"), format!("{w}/.githooks/new-hook"),
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
    let env = TestEnv::with_profile("user = \"root\"\npersistent_dirs = [\"/root\"]\n\n[profiles.other]\nimage = \"test\"\ncommand = [\"/bin/sh\"]\nuser = \"root\"\npersistent_dirs = [\"/root\"]\n");
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
