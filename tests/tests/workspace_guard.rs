//! The run-time Workspace Guard end to end (issue 13): from inside a running
//! Domain the agent (the non-root test developer, or root where it says so)
//! plants what would make the developer's git on the host run a program of
//! its choice, un-isolates what the host keeps isolated, or leaves
//! privileged files; afterwards the developer's own git on the host
//! (status, log, diff, commit, submodule status, in the workspace and in
//! every planted directory) runs nothing, the journal and `lazaret audit`
//! say what was neutralised, and ordinary git work inside and on the host
//! keeps working.
//!
//! Every planted configuration or hook runs `touch MARKERS/<route>`; the
//! marker directory is on the host only (the sandbox never sees it), so a
//! file there means the host ran what the agent chose. A self-test first
//! shows that the detector can see an attack.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lazaret_tests::escalation::chown_tree;
use lazaret_tests::*;

const GIT_ENV: &str = "env = { GIT_AUTHOR_NAME = \"Agent Smith\", GIT_AUTHOR_EMAIL = \"agent@example.invalid\", GIT_COMMITTER_NAME = \"Agent Smith\", GIT_COMMITTER_EMAIL = \"agent@example.invalid\" }\n";

/// A Domain whose developer is the test user; `extra` keys for the profile
/// (without `user`, the agent is the developer).
fn developer_env(extra: &str) -> TestEnv {
    let (uid, gid) = test_user();
    let mut env = TestEnv::with_profile(&format!("{extra}{GIT_ENV}"));
    env.env.push(("SUDO_UID".into(), uid.to_string()));
    env.env.push(("SUDO_GID".into(), gid.to_string()));
    env
}

/// The detector works: a `core.fsmonitor` does run with the developer's git.
fn assert_detector_sees_an_attack(ws: &Path, marker_dir: &Path) {
    let probe = format!("core.fsmonitor=touch {}/self-test; true", marker_dir.display());
    dev_git_ok(ws, &["-c", &probe, "status", "--short"]);
    assert_eq!(markers(marker_dir), ["self-test"], "core.fsmonitor does not run: the test could not see an attack");
    fs::remove_file(marker_dir.join("self-test")).expect("rm self-test");
}

/// The Domain's journalled neutralisations.
fn neutralisations(env: &TestEnv) -> Vec<serde_json::Value> {
    env.journal_entries().into_iter().filter(|e| e["action"] == "NeutraliseSandboxWrite").collect()
}

/// `lazaret audit test --json`.
fn audit_json(env: &TestEnv) -> Vec<serde_json::Value> {
    let out = env.run(["audit", "test", "--json"]);
    assert!(out.status.success(), "lazaret audit --json: {}", text(&out.stderr));
    match serde_json::from_slice(&out.stdout) {
        Ok(serde_json::Value::Array(a)) => a,
        other => panic!("lazaret audit --json is not an array: {other:?}: {}", text(&out.stdout)),
    }
}

/// Whether some neutralisation's path starts with `prefix`.
fn neutralised_below(entries: &[serde_json::Value], prefix: &str) -> bool {
    entries.iter().any(|e| e["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
}

/// Runs the developer's git on the host in each of `dirs` (relative to the
/// workspace): status, log, diff, diff --cached, rev-parse and a commit;
/// then `submodule status` at the top. Their exit status does not matter
/// (a planted repository may have no commit): only what they run does.
fn host_git_everywhere(ws: &Path, dirs: &[&str]) {
    for dir in dirs {
        let dir = ws.join(dir);
        for args in [
            &["status"][..],
            &["status", "--porcelain", "--ignored"],
            &["log", "-1"],
            &["diff"],
            &["diff", "--cached"],
            &["rev-parse", "--show-toplevel"],
            &["commit", "-q", "--allow-empty", "-m", "host commit"],
        ] {
            let _ = developer_git(&dir, args);
        }
    }
    let _ = developer_git(ws, &["submodule", "status", "--recursive"]);
}

/// Per-route result lines of a script made with [`route_script`].
fn route_results(stdout: &str, routes: &[(&str, &str)]) -> Vec<String> {
    let mut not_written = Vec::new();
    for (name, _) in routes {
        let prefix = format!("route {name}=");
        match stdout.lines().find_map(|l| l.strip_prefix(prefix.as_str())) {
            Some("written") => {}
            other => not_written.push(format!("{name}: {other:?}")),
        }
    }
    not_written
}

/// A shell script that runs each route in a subshell and reports whether
/// it could be mounted (`set -e` inside each).
fn route_script(prelude: &str, routes: &[(&str, &str)]) -> String {
    let mut script = format!("{prelude}; ");
    for (name, command) in routes {
        script.push_str(&format!("if ( set -e; {command} ) >/dev/null 2>$W/.route-err; then echo 'route {name}=written'; else echo \"route {name}=failed: $(tr '\\n' ' ' < $W/.route-err)\"; fi; "));
    }
    script.push_str("rm -f $W/.route-err; ");
    script
}

/// A workspace with a submodule `sub` (so `.git/modules/sub` exists and is
/// Git Sentry's), `extensions.worktreeConfig`, handed to the developer.
fn build_workspace(env: &TestEnv) {
    let ws = &env.workspace;
    let lib = env.scratch.join("up/lib");
    fs::create_dir_all(&lib).expect("mkdir");
    setup_git(&lib, &["init", "-q", "-b", "main"]);
    commit_file(&lib, "first");
    setup_git(ws, &["submodule", "add", "-q", &lib.to_string_lossy(), "sub"]);
    setup_git(ws, &["commit", "-qm", "submodule"]);
    setup_git(ws, &["config", "core.repositoryFormatVersion", "1"]);
    setup_git(ws, &["config", "extensions.worktreeConfig", "true"]);
    commit_file(ws, "tracked.txt");
    let (uid, gid) = test_user();
    chown_tree(ws, uid, gid);
    chown_tree(&env.scratch.join("up"), uid, gid);
}

/// A `chmod` right after a hook is written may find it quarantined
/// already: routes tolerate that (the hook was planted all the same).
///
/// Classes "git control files not protected at start" (A) and
/// "repositories created during a run" (B). `$M` is the host's marker
/// directory, `$W` the workspace.
const CONTROL_ROUTES: &[(&str, &str)] = &[
    // A1: a linked worktree added in the run gets its own config.worktree
    // (renamed into place: the guard seals the one git made, root's and
    // read-only, so writing it in place fails).
    (
        "a1-new-worktree-config",
        "git -C $W worktree add -q $W/wt2 -b wt2-branch; printf '[core]\\n\\tfsmonitor = touch %s/a1\\n' $M > $W/.git/worktrees/wt2/cw.tmp; mv -f $W/.git/worktrees/wt2/cw.tmp $W/.git/worktrees/wt2/config.worktree",
    ),
    // A2: a commondir created in Git Sentry's own submodule gitdir points
    // git at a configuration the agent wrote.
    (
        "a2-module-commondir",
        "mkdir -p $W/evil-common; printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch %s/a2\\n' $M > $W/evil-common/config; echo ../../../evil-common > $W/.git/modules/sub/commondir",
    ),
    // A3: a new submodule gitdir under .git/modules, with a hook, reached
    // through a gitdir file.
    (
        "a3-new-module-gitdir",
        "git init -q --separate-git-dir $W/.git/modules/planted $W/planted; printf '[core]\\n\\tfsmonitor = touch %s/a3-config\\n' $M >> $W/.git/modules/planted/config; printf '#!/bin/sh\\ntouch %s/a3-hook\\n' $M > $W/.git/modules/planted/hooks/post-commit; chmod +x $W/.git/modules/planted/hooks/post-commit 2>/dev/null || true",
    ),
    // A4: a worktree gitdir assembled elsewhere (its config.worktree
    // first), renamed into .git/worktrees, and only then given the
    // commondir a real linked worktree has, its work tree pointing at it.
    (
        "a4-renamed-worktree-gitdir",
        "mkdir -p $W/.stage/wt3 $W/wt3; printf '[core]\\n\\tfsmonitor = touch %s/a4\\n' $M > $W/.stage/wt3/config.worktree; echo 'ref: refs/heads/main' > $W/.stage/wt3/HEAD; echo $W/wt3/.git > $W/.stage/wt3/gitdir; echo \"gitdir: $W/.git/worktrees/wt3\" > $W/wt3/.git; mv $W/.stage/wt3 $W/.git/worktrees/wt3; echo ../.. > $W/.git/worktrees/wt3/commondir",
    ),
    // B1: git init, then a config key and a hook.
    (
        "b1-init",
        "git init -q $W/b1; git -C $W/b1 config core.fsmonitor \"touch $M/b1-config\"; printf '#!/bin/sh\\ntouch %s/b1-hook\\n' $M > $W/b1/.git/hooks/pre-commit; chmod +x $W/b1/.git/hooks/pre-commit 2>/dev/null || true",
    ),
    // B2: a repository assembled piece by piece under another name (HEAD
    // last, hooks first), then renamed to .git.
    (
        "b2-assembled-and-renamed",
        "mkdir -p $W/b2/dotgit/hooks $W/b2/dotgit/objects $W/b2/dotgit/refs/heads; printf '#!/bin/sh\\ntouch %s/b2-hook\\n' $M > $W/b2/dotgit/hooks/post-commit; { chmod +x $W/b2/dotgit/hooks/post-commit 2>/dev/null || true; }; printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tfsmonitor = touch %s/b2-config\\n' $M > $W/b2/dotgit/config; echo 'ref: refs/heads/main' > $W/b2/dotgit/HEAD; mv $W/b2/dotgit $W/b2/.git",
    ),
    // B3: a nested repository registered as a gitlink in the workspace's
    // index: the host's `git status` at the top looks inside it.
    (
        "b3-gitlink",
        "git init -q $W/b3; echo x > $W/b3/f; git -C $W/b3 add f; git -C $W/b3 commit -qm x; git -C $W/b3 config core.fsmonitor \"touch $M/b3\"; git -C $W add b3",
    ),
    // B4: a separate gitdir (a `gitdir:` file) whose config points the
    // hooks at a directory in the work tree.
    (
        "b4-gitdir-file-hookspath",
        "git init -q --separate-git-dir $W/.b4-gitdir $W/b4; mkdir $W/b4/.hk; printf '#!/bin/sh\\ntouch %s/b4\\n' $M > $W/b4/.hk/post-commit; chmod +x $W/b4/.hk/post-commit; git -C $W/b4 config core.hooksPath $W/b4/.hk",
    ),
    // B5: a clone of a nested project, configured at clone time.
    ("b5-clone-config", "git clone -q -c core.fsmonitor=\"touch $M/b5\" $W/b3 $W/b5"),
];

#[test]
fn control_files_and_repositories_created_in_a_run_run_nothing_on_the_host() {
    let env = developer_env("");
    build_workspace(&env);
    let ws = env.workspace.clone();
    let marker_dir = marker_dir(&env);
    assert_detector_sees_an_attack(&ws, &marker_dir);

    let mut script = route_script(&format!("M={}; W={}", marker_dir.display(), ws.display()), CONTROL_ROUTES);
    // The event path, before any sweep: inside, within a second, the
    // planted hook is gone and the config key with it.
    script.push_str(
        "for i in $(seq 100); do [ -e $W/b1/.git/hooks/pre-commit ] || break; sleep 0.02; done; \
         if [ -e $W/b1/.git/hooks/pre-commit ]; then echo b1-hook=present; else echo b1-hook=gone; fi; \
         echo b1-fsmonitor=$(git -C $W/b1 config core.fsmonitor || true); echo done=yes",
    );
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    println!("inside:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("done=yes"), "{stdout}");
    let not_written = route_results(&stdout, CONTROL_ROUTES);
    assert!(not_written.is_empty(), "routes that could not even be planted (the test would not test the guard): {not_written:?}");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");

    host_git_everywhere(&ws, &[".", "wt2", "sub", "planted", "wt3", "b1", "b2", "b3", "b4", "b5"]);
    let ran = markers(&marker_dir);
    assert!(ran.is_empty(), "the host's git ran what the agent planted: {ran:?}");
    // The neutralisations that followed the events, seen from inside.
    assert!(stdout.contains("b1-hook=gone"), "the hook planted in a new repository was still there a second later: {stdout}");
    assert!(stdout.contains("b1-fsmonitor=\n"), "the new repository's core.fsmonitor was still set a second later: {stdout}");
    // Shown on the session's terminal (its stderr), one line each.
    assert!(
        stderr.lines().any(|l| l.starts_with("lazaret: workspace guard: ") && l.contains("b1/.git/hooks/pre-commit")),
        "no terminal line for the quarantined hook: {stderr}"
    );

    let journalled = neutralisations(&env);
    for prefix in [
        ".git/worktrees/wt2/",
        ".git/modules/sub/commondir",
        ".git/modules/planted/",
        ".git/worktrees/wt3/",
        "b1/.git/",
        "b2/",
        "b3/.git/",
        ".b4-gitdir/",
        "b5/.git/",
    ] {
        assert!(neutralised_below(&journalled, prefix), "nothing journalled below {prefix}: {journalled:#?}");
    }
    let audited = audit_json(&env);
    assert_eq!(audited.len(), journalled.len(), "lazaret audit lists every journalled neutralisation: {audited:#?}");
    assert!(
        audited.iter().any(|e| e["kind"] == "quarantined" && e["in_quarantine"] == true && e["quarantined"]["id"] == e["quarantine_id"]),
        "{audited:#?}"
    );
    let human = env.run(["audit", "test"]);
    assert!(
        human.status.success() && text(&human.stdout).contains("b1/.git/hooks/pre-commit"),
        "{}{}",
        text(&human.stdout),
        text(&human.stderr)
    );

    // What the agent did by ordinary means is still there.
    assert!(dev_git_ok(&ws, &["worktree", "list"]).contains(&ws.join("wt2").display().to_string()));
    assert!(dev_git_ok(&ws, &["ls-files", "-s", "b3"]).starts_with("160000"), "b3 is a gitlink in the index");
    // The clone's own history is there, below the developer's empty
    // "host commit" of host_git_everywhere.
    let b5_log = dev_git_ok(&ws.join("b5"), &["log", "--format=%s"]);
    assert_eq!(b5_log.lines().collect::<Vec<_>>(), ["host commit", "x"], "b5's history");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// A workspace that is a linked worktree: its repository's common git
/// directory lies outside the workspace, and the sandbox writes it (objects,
/// refs). A `commondir` the agent plants there would make the developer's
/// git in the main checkout take its configuration from a directory the
/// agent filled; the guard watches that directory like the workspace.
#[test]
fn a_linked_worktree_cannot_plant_control_files_in_its_main_repository() {
    let env = developer_env("");
    let main = env.workspace.clone();
    let wt = env.scratch.join("wt");
    setup_git(&main, &["worktree", "add", "-q", "-b", "wt-branch", &wt.to_string_lossy()]);
    let (uid, gid) = test_user();
    chown_tree(&main, uid, gid);
    chown_tree(&wt, uid, gid);
    let wt = fs::canonicalize(&wt).expect("canonical worktree");
    let marker_dir = marker_dir(&env);
    assert_detector_sees_an_attack(&main, &marker_dir);

    // The evil common dir is a copy of the real one (git needs its refs
    // and objects to run at all) whose config runs the marker.
    let routes: &[(&str, &str)] = &[(
        "main-commondir",
        "mkdir $G/evil; cp -r $G/objects $G/refs $G/HEAD $G/evil/; printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch %s/main-commondir\\n' $M > $G/evil/config; echo evil > $G/commondir",
    )];
    let mut script = route_script(&format!("M={}; W={}; G={}", marker_dir.display(), wt.display(), main.join(".git").display()), routes);
    // Ordinary work in the worktree still reaches the shared repository.
    script.push_str("echo w > $W/w.txt; git -C $W add w.txt; git -C $W commit -qm agent-in-worktree; echo done=yes");
    let out = env.lazaret(["run", "test", "--", "sh", "-c", &script]).current_dir(&wt).output().expect("lazaret run");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("done=yes"), "{stdout}");
    let not_written = route_results(&stdout, routes);
    assert!(not_written.is_empty(), "routes that could not even be planted (the test would not test the guard): {not_written:?}");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");

    host_git_everywhere(&main, &["."]);
    host_git_everywhere(&wt, &["."]);
    let ran = markers(&marker_dir);
    assert!(ran.is_empty(), "the host's git ran what the agent planted: {ran:?}");
    assert!(!main.join(".git/commondir").exists(), "the planted commondir is still in the main repository");
    let label = format!("git-dir:{}", main.join(".git").display());
    let journalled = neutralisations(&env);
    assert!(
        journalled.iter().any(|e| e["root"] == label.as_str() && e["path"] == "commondir"),
        "not journalled under {label}: {journalled:#?}"
    );
    let audit = env.lazaret(["audit", "test"]).current_dir(&wt).output().expect("lazaret audit");
    assert!(audit.status.success() && text(&audit.stdout).contains("commondir"), "{}{}", text(&audit.stdout), text(&audit.stderr));
    // The worktree and the agent's commit are intact, seen from the main
    // checkout (below host_git_everywhere's empty "host commit").
    let log = dev_git_ok(&main, &["log", "--format=%s", "wt-branch"]);
    assert_eq!(log.lines().take(2).collect::<Vec<_>>(), ["host commit", "agent-in-worktree"], "{log}");
    assert!(dev_git_ok(&main, &["worktree", "list"]).contains(&wt.display().to_string()));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// A writable volume that holds a repository of the developer's: Git
/// Sentry protects nothing there, and the developer's git on the host runs
/// in it. What the agent plants is neutralised; the developer's own hook,
/// older than the Domain, is left (and runs, as it should).
#[test]
fn a_repository_in_a_volume_runs_nothing_the_agent_planted() {
    let env = developer_env("");
    let shared = env.scratch.join("shared");
    fs::create_dir(&shared).expect("mkdir shared");
    setup_git(&shared, &["init", "-q", "-b", "main"]);
    commit_file(&shared, "lib.txt");
    let marker_dir = marker_dir(&env);
    fs::write(shared.join(".git/hooks/post-commit"), format!("#!/bin/sh\ntouch {}/developer-hook\n", marker_dir.display())).expect("hook");
    fs::set_permissions(shared.join(".git/hooks/post-commit"), fs::Permissions::from_mode(0o755)).expect("chmod");
    let (uid, gid) = test_user();
    chown_tree(&shared, uid, gid);
    chown_tree(&env.workspace, uid, gid);
    let shared = fs::canonicalize(&shared).expect("canonical");
    env.write_config(&format!("{GIT_ENV}volumes = [\"{}:/work/shared\"]\n", shared.display()));
    assert_detector_sees_an_attack(&shared, &marker_dir);

    let routes: &[(&str, &str)] = &[
        (
            "volume-hook",
            "printf '#!/bin/sh\\ntouch %s/volume-hook\\n' $M > $V/.git/hooks/pre-commit; chmod +x $V/.git/hooks/pre-commit 2>/dev/null || true",
        ),
        ("volume-config", "git -C $V config core.fsmonitor \"touch $M/volume-config\""),
    ];
    let mut script = route_script(&format!("M={}; V=/work/shared; W={}", marker_dir.display(), env.workspace.display()), routes);
    // Ordinary work in the volume's repository still lands on the host.
    script.push_str("echo v > $V/v.txt; git -C $V add v.txt; git -C $V commit -qm agent-in-volume; echo done=yes");
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("done=yes"), "{stdout}");
    let not_written = route_results(&stdout, routes);
    assert!(not_written.is_empty(), "routes that could not even be planted (the test would not test the guard): {not_written:?}");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");

    host_git_everywhere(&shared, &["."]);
    assert_eq!(markers(&marker_dir), ["developer-hook"], "only the developer's own hook may run on the host");
    let journalled = neutralisations(&env);
    for path in [".git/hooks/pre-commit", ".git/config"] {
        assert!(
            journalled.iter().any(|e| e["root"] == "volume:/work/shared" && e["path"] == path),
            "{path} not journalled: {journalled:#?}"
        );
    }
    let log = dev_git_ok(&shared, &["log", "--format=%s"]);
    assert!(log.contains("agent-in-volume"), "{log}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// An interactive rebase the agent leaves in progress: `git status` on the
/// host says "use git rebase --continue", and continuing runs the todo
/// list's `exec` steps on the host. Shown first with the guard off (the
/// coordinator's test hook), then with it on: the Domain's final sweep
/// turns the steps into comments.
#[test]
fn a_rebase_left_in_progress_runs_nothing_when_the_developer_continues_it() {
    let env = developer_env("");
    let ws = env.workspace.clone();
    let (uid, gid) = test_user();
    chown_tree(&ws, uid, gid);
    let marker_dir = marker_dir(&env);
    let plant = format!(
        "G={}/.git; mkdir -p $G/rebase-merge; git rev-parse HEAD > $G/rebase-merge/onto; git rev-parse HEAD > $G/rebase-merge/orig-head; \
         echo refs/heads/main > $G/rebase-merge/head-name; touch $G/rebase-merge/interactive; echo 1 > $G/rebase-merge/msgnum; echo 1 > $G/rebase-merge/end; \
         printf 'exec touch {}/rebase-exec\\n' > $G/rebase-merge/git-rebase-todo; echo planted=yes",
        ws.display(),
        marker_dir.display()
    );
    let todo = ws.join(".git/rebase-merge/git-rebase-todo");
    for guard_on in [false, true] {
        let mut run = env.lazaret(["run", "test", "--", "sh", "-c", &plant]);
        if !guard_on {
            run.env("LAZARET_TEST_HOOKS", "1").env("LAZARET_TEST_GUARD", "off");
        }
        let out = run.output().expect("lazaret run");
        assert!(text(&out.stdout).contains("planted=yes"), "{}{}", text(&out.stdout), text(&out.stderr));
        assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");
        assert!(dev_git_ok(&ws, &["status"]).contains("rebase"), "git status does not show the rebase in progress");
        let _ = developer_git(&ws, &["rebase", "--continue"]);
        let ran = markers(&marker_dir);
        if guard_on {
            assert!(ran.is_empty(), "continuing the rebase ran what the agent planted: {ran:?}");
            let kept = fs::read_to_string(&todo).unwrap_or_default();
            assert!(!ws.join(".git/rebase-merge").exists() || kept.contains("disabled by Lazaret"), "{kept}");
        } else {
            assert_eq!(ran, ["rebase-exec"], "the planted rebase did not run with the guard off: the test could not see an attack");
            fs::remove_file(marker_dir.join("rebase-exec")).expect("rm marker");
        }
    }
    let journalled = neutralisations(&env);
    assert!(
        journalled.iter().any(|e| e["kind"] == "disabled_rebase_exec" && e["path"] == ".git/rebase-merge/git-rebase-todo"),
        "{journalled:#?}"
    );
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Class "the ignored set decided by files the agent controls": the host's
/// `.env` and `app/secret.key` are isolated in run 1, where the agent
/// changes what decides the ignored set (routes below; the sticky tests in
/// filesystem.rs cover a removed pattern, a negation in the same file and
/// a nested repository); run 2 still sees the Domain's copies.
fn ignored_set_route(untie: &str) {
    let env = developer_env("");
    let ws = env.workspace.clone();
    fs::write(ws.join(".gitignore"), ".env\n*.key\n").expect(".gitignore");
    fs::create_dir(ws.join("app")).expect("app");
    fs::write(ws.join("app/keep.txt"), "k\n").expect("keep");
    fs::write(ws.join(".env"), "host-env\n").expect(".env");
    fs::write(ws.join("app/secret.key"), "host-key\n").expect("key");
    setup_git(&ws, &["add", ".gitignore", "app/keep.txt"]);
    setup_git(&ws, &["commit", "-qm", "ignores"]);
    let (uid, gid) = test_user();
    chown_tree(&ws, uid, gid);
    let marker_dir = marker_dir(&env);

    let out = env.run([
        "run",
        "test",
        "--",
        "sh",
        "-c",
        &format!("cat .env app/secret.key; echo agent-env > .env; echo agent-key > app/secret.key; {untie}"),
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "run 1: {stdout}{}", text(&out.stderr));
    assert!(!stdout.contains("host-"), "run 1 saw host content: {stdout}");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());

    let out = env.run(["run", "test", "--", "sh", "-c", "cat .env app/secret.key"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "run 2: {stdout}{}", text(&out.stderr));
    assert!(!stdout.contains("host-"), "run 2 exposed the host's isolated content: {stdout}");
    assert_eq!(stdout, "agent-env\nagent-key\n", "run 2 sees the Domain's own copies");
    assert_eq!(fs::read_to_string(ws.join(".env")).expect(".env"), "host-env\n", "the sandbox wrote the host's .env");
    assert_eq!(fs::read_to_string(ws.join("app/secret.key")).expect("key"), "host-key\n", "the sandbox wrote the host's key");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    host_git_everywhere(&ws, &[".", "app"]);
    assert!(markers(&marker_dir).is_empty());
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn ignored_set_a_nested_negation_does_not_expose_host_content() {
    ignored_set_route("printf '!*.key\\n!secret.key\\n' > app/.gitignore");
}

#[test]
fn ignored_set_force_adding_to_the_index_does_not_expose_host_content() {
    ignored_set_route("git add -f .env app/secret.key && git commit -qm 'track them'");
}

#[test]
fn ignored_set_a_symlinked_gitignore_does_not_expose_host_content() {
    ignored_set_route("rm .gitignore && ln -s /dev/null .gitignore");
}

fn assert_unprivileged(path: &Path) {
    let meta = fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(meta.mode() & 0o6000, 0, "{} is setuid/setgid on the host (mode {:o})", path.display(), meta.mode() & 0o7777);
}

/// The Ignored Workspace State storage file of workspace path `rel`.
fn ignored_storage(env: &TestEnv, name: &str) -> PathBuf {
    let ids = env.domain_ids();
    let root = Path::new(TEST_STORAGE).join("domains").join(&ids[0]).join("ignored");
    fn find(dir: &Path, name: &str) -> Option<PathBuf> {
        for e in fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            if e.file_name() == name {
                return Some(p);
            }
            if fs::symlink_metadata(&p).map(|m| m.is_dir()).unwrap_or(false) {
                if let Some(f) = find(&p, name) {
                    return Some(f);
                }
            }
        }
        None
    }
    find(&root, name).unwrap_or_else(|| panic!("no {name} in {}", root.display()))
}

#[test]
fn privilege_bits_a_developer_agent_sets_never_reach_the_host() {
    let vol = tempfile::Builder::new().prefix("lazaret-guard-vol-").tempdir_in("/tmp").expect("volume dir");
    let (uid, gid) = test_user();
    chown_tree(vol.path(), uid, gid);
    let env = developer_env(&format!("volumes = [\"{}:/vol\"]\n", vol.path().display()));
    let ws = env.workspace.clone();
    fs::write(ws.join(".gitignore"), ".venv/\n").expect(".gitignore");
    fs::create_dir(ws.join(".venv")).expect(".venv");
    setup_git(&ws, &["add", ".gitignore"]);
    setup_git(&ws, &["commit", "-qm", "ignore .venv"]);
    chown_tree(&ws, uid, gid);
    let script = "set -e; \
        echo x > p-suid; chmod u+s p-suid; \
        install -m 2755 /dev/null p-sgid; \
        cp README p-both; chmod 6755 p-both; \
        chmod u+s README; \
        mkdir -p sub/dir; echo y > sub/dir/deep; chmod 4711 sub/dir/deep; \
        echo z > staged; chmod 4755 staged; mv staged renamed; \
        mkdir -p .venv/bin; echo t > .venv/bin/tool; chmod 4755 .venv/bin/tool; \
        echo v > /vol/v-suid; chmod 6755 /vol/v-suid; \
        sleep 1; stat -c '%n %a' p-suid p-sgid p-both README renamed";
    let out = env.run(["run", "test", "--", "sh", "-c", script]);
    let stdout = text(&out.stdout);
    println!("inside:\n{stdout}\n{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    // Within a second of the chmod, inside too.
    for line in stdout.lines() {
        let mode = line.rsplit(' ').next().and_then(|m| u32::from_str_radix(m, 8).ok()).unwrap_or(0);
        assert_eq!(mode & 0o6000, 0, "still privileged inside a second later: {line}");
    }
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    for rel in ["p-suid", "p-sgid", "p-both", "README", "sub/dir/deep", "renamed"] {
        assert_unprivileged(&ws.join(rel));
    }
    assert_unprivileged(&vol.path().join("v-suid"));
    assert_unprivileged(&ignored_storage(&env, "tool"));
    let journalled = neutralisations(&env);
    for prefix in ["p-suid", "p-sgid", "p-both", "README", "sub/dir/deep", "v-suid"] {
        assert!(neutralised_below(&journalled, prefix), "nothing journalled for {prefix}: {journalled:#?}");
    }
    // Cleared before or after the rename, whichever the guard saw first.
    assert!(neutralised_below(&journalled, "staged") || neutralised_below(&journalled, "renamed"), "{journalled:#?}");
    assert!(journalled.iter().all(|e| e["kind"] == "cleared_privilege_bits"), "{journalled:#?}");
    assert!(journalled.iter().any(|e| e["root"] == "volume:/vol") && journalled.iter().any(|e| e["root"] == "ignored"), "{journalled:#?}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn a_root_agents_files_belong_to_the_developer_and_carry_no_privileges() {
    let (uid, gid) = test_user();
    let env = developer_env("user = \"root\"\n");
    let ws = env.workspace.clone();
    chown_tree(&ws, uid, gid);
    let probe = env.install_probe();
    let marker_dir = marker_dir(&env);
    // security.capability v2: effective, permitted = CAP_NET_RAW (bit 13).
    let cap = "0100000200200000000000000000000000000000";
    let script = format!(
        "set -e; git config --global safe.directory '*'; cp -a /usr/bin/su r-su; echo x > r-file; chmod u+s,g+s r-file; mkdir -p r-dir/deep; echo y > r-dir/deep/f; \
         ln -s r-file r-link; echo c > r-cap; \
         if {probe} setxattr r-cap security.capability {cap}; then echo setcap=ok; else echo setcap=refused; fi; \
         git init -q r-repo; echo n > r-repo/n; git -C r-repo add n; git -C r-repo commit -qm n; \
         {{ printf '#!/bin/sh\\ntouch {m}/r-hook\\n' > r-repo/.git/hooks/post-commit; }} 2>/dev/null || true; chmod 4755 r-repo/.git/hooks/post-commit 2>/dev/null || true; \
         sleep 1; stat -c '%n %u %a' r-su r-file r-dir/deep/f",
        probe = probe.display(),
        m = marker_dir.display()
    );
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    let stdout = text(&out.stdout);
    println!("inside:\n{stdout}\n{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    // Ownership: everything the agent made is the developer's.
    let mut made = vec![
        ws.join("r-su"),
        ws.join("r-file"),
        ws.join("r-dir"),
        ws.join("r-dir/deep"),
        ws.join("r-dir/deep/f"),
        ws.join("r-link"),
        ws.join("r-cap"),
        ws.join("r-repo/n"),
    ];
    made.extend(walk(&ws.join("r-repo/.git")));
    for p in &made {
        let meta = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{} is not the developer's on the host", p.display());
        if !meta.file_type().is_symlink() {
            assert_unprivileged(p);
        }
    }
    // No file capabilities.
    let getcap = std::process::Command::new("getcap").arg(ws.join("r-cap")).output().expect("getcap (libcap2-bin)");
    assert!(text(&getcap.stdout).trim().is_empty(), "file capabilities on the host: {}", text(&getcap.stdout));
    // The developer's git works in the root agent's repository and runs nothing.
    assert_eq!(dev_git_ok(&ws.join("r-repo"), &["log", "-1", "--format=%s"]).trim(), "n");
    host_git_everywhere(&ws, &[".", "r-repo"]);
    assert!(markers(&marker_dir).is_empty(), "{:?}", markers(&marker_dir));
    let journalled = neutralisations(&env);
    assert!(neutralised_below(&journalled, "r-su") && neutralised_below(&journalled, "r-file"), "{journalled:#?}");
    if stdout.contains("setcap=ok") {
        assert!(journalled.iter().any(|e| e["kind"] == "removed_file_capabilities" && e["path"] == "r-cap"), "{journalled:#?}");
    }
    // Ownership is routine: counted in the log, never journalled per file.
    assert!(!journalled.iter().any(|e| e["kind"] == "changed_owner"), "{journalled:#?}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Every path below `dir` (not following symlinks).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).map(|r| r.flatten().collect::<Vec<_>>()).unwrap_or_default() {
        let p = e.path();
        out.push(p.clone());
        if fs::symlink_metadata(&p).map(|m| m.is_dir()).unwrap_or(false) {
            out.extend(walk(&p));
        }
    }
    out
}

#[test]
fn ordinary_git_work_inside_keeps_working_and_is_seen_on_both_sides() {
    let env = developer_env("");
    build_workspace(&env);
    let ws = env.workspace.clone();
    let marker_dir = marker_dir(&env);
    // The nested project a submodule will come from, inside the workspace
    // (the sandbox sees nothing else of the host).
    let script = format!(
        "set -e; W={w}; cd $W; \
         echo a > a.txt; git add a.txt; git commit -qm agent-a; \
         git branch feature; git checkout -q feature; echo f > f.txt; git add f.txt; git commit -qm agent-f; git checkout -q main; \
         echo b >> a.txt; git commit -qam agent-b; \
         echo wip >> tracked.txt; git stash -q; test \"$(git stash list | wc -l)\" = 1; git stash pop -q; git checkout -q -- tracked.txt; \
         git checkout -q feature; git rebase -q main; git checkout -q main; \
         git worktree add -q $W/wt-new -b wt-branch; echo w > $W/wt-new/w.txt; git -C $W/wt-new add w.txt; git -C $W/wt-new commit -qm agent-wt; \
         git init -q nested; echo n > nested/n.txt; git -C nested add n.txt; git -C nested commit -qm agent-nested; \
         git clone -q $W/nested cloned; echo c > cloned/c.txt; git -C cloned add c.txt; git -C cloned commit -qm agent-cloned; \
         if git -c protocol.file.allow=always submodule add -q $W/nested sub2 2>$W/.sub-add.err; then echo submodule-add=ok; else echo submodule-add=failed; fi; sed 's/^/add: /' $W/.sub-add.err; \
         if git -c protocol.file.allow=always submodule update -q --init 2>$W/.sub-upd.err; then echo submodule-update=ok; else echo submodule-update=failed; fi; sed 's/^/update: /' $W/.sub-upd.err; \
         rm -f $W/.sub-add.err $W/.sub-upd.err; echo done=yes",
        w = ws.display()
    );
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    println!("inside:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("done=yes"), "{stdout}");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());

    // Seen on the host.
    assert_eq!(dev_git_ok(&ws, &["log", "-1", "--format=%s"]).trim(), "agent-b");
    assert_eq!(dev_git_ok(&ws, &["log", "-1", "--format=%s", "feature"]).trim(), "agent-f");
    assert_eq!(
        dev_git_ok(&ws, &["merge-base", "main", "feature"]).trim(),
        dev_git_ok(&ws, &["rev-parse", "main"]).trim(),
        "feature was rebased onto main"
    );
    assert!(dev_git_ok(&ws, &["stash", "list"]).trim().is_empty());
    assert_eq!(dev_git_ok(&ws.join("wt-new"), &["log", "-1", "--format=%s"]).trim(), "agent-wt");
    assert_eq!(dev_git_ok(&ws.join("nested"), &["log", "-1", "--format=%s"]).trim(), "agent-nested");
    assert_eq!(dev_git_ok(&ws.join("cloned"), &["log", "-1", "--format=%s"]).trim(), "agent-cloned");
    // `git submodule add` and `update --init` inside: the submodule is
    // recorded (.gitmodules, the gitlink, .git/modules/sub2) and registered
    // in .git/config, which a developer agent may write (issue 30); the
    // host's git reads the registration as the guard allowed it.
    assert!(stdout.contains("submodule-add=ok"), "git submodule add inside: {stdout}");
    assert!(stdout.contains("submodule-update=ok"), "git submodule update inside: {stdout}");
    assert_eq!(dev_git_ok(&ws, &["config", "--get", "submodule.sub2.url"]).trim(), ws.join("nested").display().to_string());
    assert!(fs::read_to_string(ws.join(".gitmodules")).expect(".gitmodules").contains("path = sub2"));
    assert!(dev_git_ok(&ws, &["ls-files", "-s", "sub2"]).starts_with("160000"), "sub2 is a gitlink");
    dev_git_ok(&ws, &["-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init", "sub2"]);
    assert_eq!(dev_git_ok(&ws.join("sub2"), &["log", "-1", "--format=%s"]).trim(), "agent-nested");
    dev_git_ok(&ws, &["submodule", "status", "--recursive"]);
    // Ordinary work needs no neutralisation: nothing the agent did by
    // ordinary means was quarantined or filtered.
    let journalled = neutralisations(&env);
    assert!(journalled.is_empty(), "ordinary git work was neutralised: {journalled:#?}");

    // The host's work, seen inside in the next run.
    dev_git_ok(&ws, &["commit", "-q", "--allow-empty", "-m", "host-commit"]);
    dev_git_ok(&ws.join("nested"), &["commit", "-q", "--allow-empty", "-m", "host-nested"]);
    let out = env.run([
        "run",
        "test",
        "--",
        "sh",
        "-c",
        "git log -1 --format=%s; git -C nested log -1 --format=%s; git -C wt-new status --short | wc -l",
    ]);
    assert_eq!(text(&out.stdout), "host-commit\nhost-nested\n0\n", "{}", text(&out.stderr));
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    assert!(markers(&marker_dir).is_empty());
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn audit_lists_a_quarantined_hook_and_restore_puts_it_back() {
    let env = developer_env("");
    let ws = env.workspace.clone();
    let (uid, gid) = test_user();
    chown_tree(&ws, uid, gid);
    let marker_dir = marker_dir(&env);
    let hook_body = format!("#!/bin/sh\ntouch {}/restored-hook\n", marker_dir.display());
    // Written elsewhere and renamed in, so the quarantine holds the whole
    // hook (a hook created in place is taken away at its creation, and the
    // shell's write then fails: the guard wins that race by design).
    let script = format!(
        "set -e; git init -q r; printf '{}' > hook.tmp; chmod 755 hook.tmp; mv hook.tmp r/.git/hooks/post-commit; sleep 0.5",
        hook_body.replace('\n', "\\n")
    );
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    let hook = ws.join("r/.git/hooks/post-commit");
    assert!(!hook.exists(), "the hook is still in place");

    let audited = audit_json(&env);
    let entry =
        audited.iter().find(|e| e["path"] == "r/.git/hooks/post-commit").unwrap_or_else(|| panic!("the hook is not audited: {audited:#?}"));
    assert_eq!((entry["kind"].as_str(), entry["in_quarantine"].as_bool()), (Some("quarantined"), Some(true)), "{entry:#}");
    let id = entry["quarantine_id"].as_str().expect("a quarantine id").to_string();
    let human = env.run(["audit", "test"]);
    let listing = text(&human.stdout);
    assert!(human.status.success() && listing.contains(&id) && listing.contains("kept"), "{listing}{}", text(&human.stderr));

    let restored = env.run(["audit", "test", "--restore", &id]);
    assert!(restored.status.success(), "restore: {}{}", text(&restored.stdout), text(&restored.stderr));
    assert!(text(&restored.stdout).contains("r/.git/hooks/post-commit"), "{}", text(&restored.stdout));
    assert_eq!(fs::read_to_string(&hook).expect("the hook is back"), hook_body);
    let meta = fs::metadata(&hook).expect("stat");
    assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o6000), (uid, gid, 0), "restored as the developer's, unprivileged");
    let after = audit_json(&env);
    let entry = after.iter().find(|e| e["quarantine_id"] == id.as_str()).expect("still audited");
    assert_eq!(entry["in_quarantine"], false, "{entry:#}");
    assert!(text(&env.run(["audit", "test"]).stdout).contains("restored"));

    // Once back, it is the developer's own hook again: made executable by
    // them, the host runs it.
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).expect("chmod the restored hook");
    dev_git_ok(&ws.join("r"), &["commit", "-q", "--allow-empty", "-m", "host"]);
    assert_eq!(markers(&marker_dir), ["restored-hook"], "the restored hook did not run on the developer's explicit request");

    for bad in [id.as_str(), "no-such-entry"] {
        let again = env.run(["audit", "test", "--restore", bad]);
        assert_eq!(again.status.code(), Some(125), "restoring {bad}: {}{}", text(&again.stdout), text(&again.stderr));
        assert!(text(&again.stderr).contains("lazaret audit test"), "{}", text(&again.stderr));
    }
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// A developer Domain (with the coordinator's test hooks `hooks`, if any)
/// whose workspace has one commit, `prepare`d as the developer's and then
/// given to them, and the marker directory where an attack that ran on
/// the host leaves a file (the detector checked): (env, workspace,
/// markers).
fn attack_ready(hooks: &[(&str, &str)], prepare: impl FnOnce(&Path)) -> (TestEnv, PathBuf, PathBuf) {
    let mut env = developer_env("");
    if !hooks.is_empty() {
        env.env.push(("LAZARET_TEST_HOOKS".into(), "1".into()));
    }
    env.env.extend(hooks.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    let ws = env.workspace.clone();
    commit_file(&ws, "tracked.txt");
    prepare(&ws);
    let (uid, gid) = test_user();
    chown_tree(&ws, uid, gid);
    let markers = marker_dir(&env);
    assert_detector_sees_an_attack(&ws, &markers);
    (env, ws, markers)
}

/// The developer's `git status` on the host, as a shell prompt or an
/// editor runs it: in `dir` itself, or with `git -C dir` from `from`.
fn host_status(dir: &Path, from: Option<&Path>) -> std::process::Output {
    match from {
        Some(from) => developer_git(from, &["-C", &dir.to_string_lossy(), "status", "--porcelain"]),
        None => developer_git(dir, &["status", "--porcelain"]),
    }
}

/// What [`rewrite_race`] saw: the markers the host's git made (what ran),
/// how many host runs there were, the session's stderr, and the host's
/// `git status` in a repository whose config the agent held open for
/// writing (a file the guard cannot seal yet).
struct RaceOutcome {
    ran: Vec<String>,
    runs: usize,
    stderr: String,
    held_open: std::process::Output,
}

/// Issue 30's race, end to end: while the agent rewrites new
/// repositories' configs with `core.fsmonitor` in loops (in place, with
/// `git config`, and by renaming a prepared directory into place as
/// `.git`), the developer's git runs `git status` in them (from inside and
/// with `git -C`) every few milliseconds for ten seconds.
///
/// Whether the gate refuses anything in the race itself depends on who
/// wins it (a fast guard seals each config before the host looks), so it
/// says nothing about whether the gate was on. What does, every time: the
/// host's `git status` while the agent holds a config open that it wrote
/// (the guard seals a file only once its writer closed it, so the gate
/// must refuse it; without the gate git reads it).
fn rewrite_race(gate_off: bool) -> (RaceOutcome, TestEnv) {
    let hooks: &[(&str, &str)] = if gate_off { &[("LAZARET_TEST_GUARD_GATE", "off")] } else { &[] };
    let (env, ws, marker_dir) = attack_ready(hooks, |_| {});
    let script = format!(
        "M={m}; W={w}; git init -q $W/tools && git init -q $W/t2 && mkdir -p $W/r3 && git init -q $W/held || exit 1; \
         rm -f $W/held/.git/config; exec 3>$W/held/.git/config; printf '[core]\\n\\trepositoryformatversion = 0\\n' >&3; \
         echo held; read go; exec 3>&-; echo ready; \
         end=$(( $(date +%s) + 12 )); \
         ( while [ $(date +%s) -lt $end ]; do {{ printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch %s/in-place\\n' $M > $W/tools/.git/config; }} 2>/dev/null; done ) & \
         ( while [ $(date +%s) -lt $end ]; do git -C $W/t2 config core.fsmonitor \"touch $M/git-config\" 2>/dev/null; done ) & \
         ( while [ $(date +%s) -lt $end ]; do rm -rf $W/.stage; mkdir -p $W/.stage/objects; \
             printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch %s/renamed\\n' $M > $W/.stage/config; \
             echo 'ref: refs/heads/main' > $W/.stage/HEAD; mkdir $W/.stage/refs; mv $W/.stage $W/r3/.git; rm -rf $W/r3/.git; done ) & \
         wait; echo done",
        m = marker_dir.display(),
        w = ws.display()
    );
    let mut session = PipedSession::script(&env, &script);
    session.expect_line("held", "the agent's repositories");
    let held_open = host_status(&ws.join("held"), None);
    session.send(b"go\n");
    session.expect_line("ready", "the agent's repositories");
    let (mut runs, start) = (0, std::time::Instant::now());
    while start.elapsed() < std::time::Duration::from_secs(10) {
        for repo in ["tools", "t2", "r3"] {
            let dir = ws.join(repo);
            let _ = host_status(&dir, None);
            let _ = host_status(&dir, Some(&ws));
            runs += 2;
        }
    }
    // The developer's own repository stays usable meanwhile.
    let own = host_status(&ws, None);
    assert!(own.status.success(), "the developer's git in the workspace failed during the run: {}", text(&own.stderr));
    let (status, rest, stderr) = session.finish();
    assert_eq!(status, Some(0), "stdout: {rest:?}\nstderr: {stderr}");
    assert!(rest.iter().any(|l| l == "done"), "{rest:?}");
    (RaceOutcome { ran: markers(&marker_dir), runs, stderr, held_open }, env)
}

#[test]
fn a_config_rewritten_in_a_loop_is_never_read_by_the_hosts_git() {
    let (RaceOutcome { ran, runs, stderr, held_open }, env) = rewrite_race(false);
    println!("gate on: {runs} host git runs; ran {ran:?}\n{stderr}");
    assert!(ran.is_empty(), "the host's git ran what the agent wrote, in {runs} runs: {ran:?}");
    let refused_held =
        stderr.lines().any(|l| l.starts_with("lazaret: workspace guard: refused ") && l.contains("workspace:held/.git/config"));
    assert!(
        refused_held,
        "the gate did not refuse the config the agent held open (was it on?); the host's git said {:?}: {stderr}",
        text(&held_open.stderr)
    );
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");
    // The sealed copies are the developer's again, and what the host's git
    // now reads of the agent's keys is the filtered version.
    let ws = env.workspace.clone();
    for repo in ["tools", "t2"] {
        let config = ws.join(repo).join(".git/config");
        let st = fs::metadata(&config).expect("config");
        assert_eq!((st.uid(), st.mode() & 0o222 != 0), (test_user().0, true), "{} is the developer's and writable again", config.display());
        let listed = dev_git_ok(&ws.join(repo), &["config", "--list", "--show-origin"]);
        assert!(!listed.contains("fsmonitor"), "{repo}: {listed}");
    }
    host_git_everywhere(&ws, &["tools", "t2", "r3"]);
    assert!(markers(&marker_dir_of(&env)).is_empty());
    env.assert_nothing_left();
}

#[test]
fn without_the_gate_the_same_race_is_won_by_the_agent() {
    let (RaceOutcome { ran, runs, stderr, held_open }, env) = rewrite_race(true);
    println!("gate off: {runs} host git runs; ran {ran:?}\n{stderr}");
    assert!(!ran.is_empty(), "with the gate off the agent never won the race in {runs} runs: the test cannot fail");
    assert!(
        held_open.status.success() && !stderr.contains("refused"),
        "with the gate off the host's git still could not read the config the agent held open: {:?}\n{stderr}",
        text(&held_open.stderr)
    );
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");
    env.assert_nothing_left();
}

/// The marker directory [`marker_dir`] made for `env`.
fn marker_dir_of(env: &TestEnv) -> PathBuf {
    env.scratch.join("markers")
}

/// Issue 30, part 2: a developer agent's `git config`, `remote add`,
/// `push -u` (to a bare repository in the workspace), `branch -u` and
/// `submodule add`/`update --init` (from another) work inside
/// on the workspace's own `.git/config`; the host's git reads only what
/// the guard allowed: the agent's allowlisted keys, every key the
/// developer had (one the agent removed is put back), none of the agent's
/// others (each reported on the terminal), and nothing runs.
#[test]
fn the_agents_git_config_work_inside_reaches_the_host_only_as_allowed() {
    let (env, ws, marker_dir) = attack_ready(&[], |ws| {
        setup_git(ws, &["config", "alias.st", "status"]);
        setup_git(ws, &["config", "core.editor", "vim"]);
        setup_git(ws, &["config", "user.email", "dev@example.invalid"]);
        setup_git(ws, &["remote", "add", "origin", "git@example.invalid:dev/project.git"]);
    });
    let (uid, _) = test_user();
    let script = format!(
        "set -e; M={m}; W={w}; cd $W; \
         git init -q --bare $W/bare.git; git init -q -b main $W/subsrc; echo s > $W/subsrc/s.txt; git -C $W/subsrc add s.txt; git -C $W/subsrc commit -qm sub; git clone -q --bare $W/subsrc $W/sub.git; \
         git config user.name 'Agent Smith'; git config user.email agent@example.invalid; \
         git remote add local $W/bare.git; \
         git push -q -u local HEAD:work; \
         git branch -q other; git branch -q -u local/work other; \
         git -c protocol.file.allow=always submodule add -q $W/sub.git sub; \
         git -c protocol.file.allow=always submodule update -q --init; \
         git config core.fsmonitor \"touch $M/fsmonitor\"; \
         git config core.pager \"touch $M/pager\"; \
         git config --unset alias.st; \
         echo inside-origin=$(git config --get remote.origin.url); echo done=yes",
        m = marker_dir.display(),
        w = ws.display()
    );
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    println!("inside:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("done=yes") && stdout.contains("inside-origin=git@example.invalid:dev/project.git"), "{stdout}");
    for key in ["core.fsmonitor", "core.pager"] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with("lazaret: workspace guard: workspace:.git/config: filtered git config") && l.contains(key)),
            "{key} dropped without a line on the terminal: {stderr}"
        );
    }
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");

    let listed = dev_git_ok(&ws, &["config", "--list", "--show-origin"]);
    println!("host's git config --list --show-origin:\n{listed}");
    for kept in [
        "file:.git/config\tuser.name=Agent Smith",
        // A key of the developer's the agent set to an allowed value.
        "file:.git/config\tuser.email=agent@example.invalid",
        &format!("file:.git/config\tremote.local.url={}/bare.git", ws.display()),
        "file:.git/config\tbranch.main.remote=local",
        "file:.git/config\tbranch.main.merge=refs/heads/work",
        "file:.git/config\tbranch.other.remote=local",
        &format!("file:.git/config\tsubmodule.sub.url={}/sub.git", ws.display()),
        "file:.git/config\tsubmodule.sub.active=true",
        // The developer's own, the one the agent removed included.
        "file:.git/config\talias.st=status",
        "file:.git/config\tcore.editor=vim",
        "file:.git/config\tremote.origin.url=git@example.invalid:dev/project.git",
    ] {
        assert!(listed.lines().any(|l| l == kept), "{kept:?} missing from the host's config:\n{listed}");
    }
    assert!(!listed.contains("fsmonitor") && !listed.contains("pager"), "{listed}");
    assert!(
        !listed.contains("file:.git/config\tuser.email=dev@example.invalid"),
        "the developer's value stayed beside the agent's: {listed}"
    );
    // The developer's file again, writable by them.
    let st = fs::metadata(ws.join(".git/config")).expect("config");
    assert_eq!((st.uid(), st.mode() & 0o777), (uid, 0o644), "the guard's stop gives the config back");
    dev_git_ok(&ws, &["config", "alias.co", "checkout"]);
    // What the agent pushed and checked out is there for the developer.
    assert_eq!(dev_git_ok(&ws.join("bare.git"), &["rev-parse", "work"]), dev_git_ok(&ws, &["rev-parse", "HEAD"]));
    host_git_everywhere(&ws, &[".", "sub"]);
    assert!(markers(&marker_dir).is_empty(), "the host's git ran the agent's: {:?}", markers(&marker_dir));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Issue 30, bad input: the guard's thread fails (the test hook makes it
/// panic 1.5 s after the start) while the agent rewrites a new
/// repository's config with `core.fsmonitor` in a loop. The Domain does
/// not run on unguarded: it stops, telling the session why; the final
/// sweep judges what the failed guard did not, so the host's git runs
/// nothing of the agent's afterwards.
#[test]
fn a_failed_guard_stops_the_domain_with_a_clear_message() {
    let (env, ws, marker_dir) = attack_ready(&[("LAZARET_TEST_GUARD_FAIL_MS", "1500")], |_| {});
    let script = format!(
        "M={m}; W={w}; git init -q $W/late || exit 1; \
         end=$(( $(date +%s) + 30 )); while [ $(date +%s) -lt $end ]; do \
           printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch %s/late\\n' $M > $W/late/.git/c.new 2>/dev/null; \
           mv -f $W/late/.git/c.new $W/late/.git/config 2>/dev/null; done; echo survived",
        m = marker_dir.display(),
        w = ws.display()
    );
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    println!("status {:?}\nstdout: {stdout}\nstderr: {stderr}", out.status.code());
    assert!(!stdout.contains("survived"), "the Domain ran on with a failed guard: {stdout}");
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("lazaret: workspace guard: failed (the guard failed on purpose (test hook)); the Domain stops"),
        "the session was not told why: {stderr}"
    );
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");
    let config = fs::read_to_string(ws.join("late/.git/config")).unwrap_or_default();
    assert!(!config.contains("fsmonitor"), "the final sweep left the agent's key: {config}");
    host_git_everywhere(&ws, &["late"]);
    assert!(markers(&marker_dir).is_empty(), "the host's git ran the agent's: {:?}", markers(&marker_dir));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}
