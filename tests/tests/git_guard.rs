//! Git Sentry's start-time protections end to end (issue 13, first part):
//! from inside a running Domain, the agent (the non-root test developer)
//! tries several routes per class to make the host's git run a command of
//! its choice — through a `commondir`, an included config file, a linked
//! worktree's or a submodule's gitdir, and the files that decide the next
//! start's ignored set. Every write must fail inside, except those to a
//! repository's own `config`, which a developer agent may write (issue 30:
//! the Workspace Guard's gate keeps the host's git from reading them until
//! the guard has filtered them against the developer's version);
//! afterwards the developer's own git on the host (status, log, diff,
//! commit, submodule status) in the workspace, the linked worktree, the
//! submodules and the nested repositories runs nothing. Ordinary git work
//! inside still works, `git submodule update` included.
//!
//! Not covered here (the run-time guard's job, a later piece): control
//! files the agent *creates* during the run, such as a new
//! `.git/modules/<name>/commondir` or a repository made with `git init`.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use lazaret_tests::escalation::chown_tree;
use lazaret_tests::*;

const GIT_ENV: &str = "env = { GIT_AUTHOR_NAME = \"Agent Smith\", GIT_AUTHOR_EMAIL = \"agent@example.invalid\", GIT_COMMITTER_NAME = \"Agent Smith\", GIT_COMMITTER_EMAIL = \"agent@example.invalid\" }\n";

/// The workspace: submodule `sub` with a nested submodule `sub/inner`, a
/// linked worktree `wt`, an unregistered worktree gitdir `stale` and one
/// without commondir `broken`, config includes (one of them missing at
/// start), a nested repository `linked` whose `.git/commondir` names
/// `shared/.git`, `extensions.worktreeConfig`, and `core.excludesFile`.
fn build_workspace(env: &TestEnv) {
    let ws = &env.workspace;
    let up = env.scratch.join("up");
    let (inner, lib) = (up.join("inner"), up.join("lib"));
    for dir in [&inner, &lib] {
        fs::create_dir_all(dir).expect("mkdir");
        setup_git(dir, &["init", "-q", "-b", "main"]);
        commit_file(dir, "first");
    }
    setup_git(&lib, &["submodule", "add", "-q", &inner.to_string_lossy(), "inner"]);
    setup_git(&lib, &["commit", "-qm", "inner"]);
    commit_file(&lib, "second");
    setup_git(ws, &["submodule", "add", "-q", &lib.to_string_lossy(), "sub"]);
    setup_git(ws, &["submodule", "update", "-q", "--init", "--recursive"]);
    setup_git(ws, &["commit", "-qm", "submodule"]);
    setup_git(ws, &["config", "core.repositoryFormatVersion", "1"]);
    setup_git(ws, &["config", "extensions.worktreeConfig", "true"]);
    setup_git(ws, &["worktree", "add", "-q", "-b", "wt-branch", "wt"]);
    let git_dir = ws.join(".git");
    fs::write(git_dir.join("config.worktree"), "").expect("config.worktree");
    fs::write(git_dir.join("worktrees/wt/config.worktree"), "").expect("config.worktree");
    // Unregistered worktree gitdirs.
    fs::create_dir_all(git_dir.join("worktrees/stale")).expect("mkdir");
    fs::write(git_dir.join("worktrees/stale/commondir"), "../..\n").expect("commondir");
    fs::write(git_dir.join("worktrees/stale/HEAD"), "ref: refs/heads/main\n").expect("HEAD");
    fs::write(git_dir.join("worktrees/stale/gitdir"), "/nonexistent/stale/.git\n").expect("gitdir");
    fs::create_dir_all(git_dir.join("worktrees/broken")).expect("mkdir");
    fs::write(git_dir.join("worktrees/broken/HEAD"), "ref: refs/heads/main\n").expect("HEAD");
    // Includes: relative to .git/, conditional and missing, nested.
    setup_git(ws, &["config", "--add", "include.path", "../included.cfg"]);
    setup_git(ws, &["config", "--add", "includeIf.onbranch:main.path", "branch.cfg"]);
    fs::write(ws.join("included.cfg"), "[include]\n\tpath = nested.cfg\n").expect("included");
    fs::write(ws.join("nested.cfg"), "# nested include\n").expect("nested");
    // Ignored set of the next start.
    setup_git(ws, &["config", "core.excludesFile", ".lazaret-excludes"]);
    fs::write(ws.join(".lazaret-excludes"), "*.tmp\n").expect("excludes");
    fs::write(git_dir.join("info/exclude"), "secret-dir/\n").expect("exclude");
    // A repository that takes config and hooks from another via commondir.
    let shared = ws.join("shared");
    fs::create_dir(&shared).expect("mkdir");
    setup_git(&shared, &["init", "-q", "-b", "main"]);
    commit_file(&shared, "shared-file");
    fs::create_dir_all(ws.join("linked/.git")).expect("mkdir");
    fs::write(ws.join("linked/.git/commondir"), "../../shared/.git\n").expect("commondir");
    fs::write(ws.join("linked/.git/HEAD"), "ref: refs/heads/main\n").expect("HEAD");
    setup_git(&ws.join("linked"), &["reset", "-q", "--hard"]);
    setup_git(ws, &["add", ".gitmodules", "included.cfg", "nested.cfg", ".lazaret-excludes"]);
    setup_git(ws, &["commit", "-qm", "setup"]);
}

/// Every route the agent tries: `name`, then a shell command that must
/// fail. `$M` is the host's marker directory (not visible inside: the
/// agent only names it in what it writes), `$W` the workspace.
const ROUTES: &[(&str, &str)] = &[
    // commondir
    ("commondir-wt-rewrite", "echo ../../../evil > $W/.git/worktrees/wt/commondir"),
    ("commondir-wt-remove", "rm -f $W/.git/worktrees/wt/commondir"),
    ("commondir-wt-rename", "mv $W/.git/worktrees/wt/commondir $W/.git/worktrees/wt/commondir.old"),
    ("commondir-nested-rewrite", "echo ../../evil > $W/linked/.git/commondir"),
    (
        "commondir-target-hook",
        "printf \"#!/bin/sh\\ntouch $M/commondir-target-hook\\n\" > $W/shared/.git/hooks/post-commit && chmod +x $W/shared/.git/hooks/post-commit",
    ),
    ("commondir-stale-rewrite", "echo ../../../evil > $W/.git/worktrees/stale/commondir"),
    // includes
    ("include-direct", "printf \"[core]\\n\\tfsmonitor = touch $M/include-direct\\n\" >> $W/included.cfg"),
    ("include-nested", "printf \"[core]\\n\\tfsmonitor = touch $M/include-nested\\n\" >> $W/nested.cfg"),
    ("include-missing-at-start", "printf \"[core]\\n\\tfsmonitor = touch $M/include-missing-at-start\\n\" > $W/.git/branch.cfg"),
    ("include-swap", "mv $W/included.cfg $W/included.old && printf \"[core]\\n\\tfsmonitor = touch $M/include-swap\\n\" > $W/included.cfg"),
    ("include-truncate", ": > $W/nested.cfg"),
    // linked worktree gitdirs
    ("worktree-config", "printf \"[core]\\n\\tfsmonitor = touch $M/worktree-config\\n\" >> $W/.git/worktrees/wt/config.worktree"),
    ("worktree-main-config", "printf \"[core]\\n\\tfsmonitor = touch $M/worktree-main-config\\n\" >> $W/.git/config.worktree"),
    ("worktree-gitdir-file", "echo 'gitdir: ../evil' > $W/wt/.git"),
    ("worktree-broken-commondir", "echo ../../../evil > $W/.git/worktrees/broken/commondir"),
    ("worktree-swap-dir", "mv $W/.git/worktrees/wt $W/.git/worktrees/wt-old"),
    // submodule gitdirs
    (
        "module-hook",
        "printf \"#!/bin/sh\\ntouch $M/module-hook\\n\" > $W/.git/modules/sub/hooks/post-commit && chmod +x $W/.git/modules/sub/hooks/post-commit",
    ),
    ("module-nested-hook", "printf \"#!/bin/sh\\ntouch $M/module-nested-hook\\n\" > $W/.git/modules/sub/modules/inner/hooks/pre-commit"),
    ("module-swap-dir", "mv $W/.git/modules/sub $W/.git/modules/sub-old"),
    // the next start's ignored set
    ("exclude-rewrite", "echo '!secret-dir/' > $W/.git/info/exclude"),
    ("exclude-attributes", "echo '* filter=evil' > $W/.git/info/attributes"),
    ("excludes-file-rewrite", ": > $W/.lazaret-excludes"),
    ("module-exclude", "echo x > $W/.git/modules/sub/info/exclude"),
];

/// Routes to a repository's own config, which a developer agent may
/// write: each must be written, and then run nothing on the host.
const GATED_ROUTES: &[(&str, &str)] = &[
    ("commondir-target-config", "printf \"[core]\\n\\tfsmonitor = touch $M/commondir-target-config\\n\" >> $W/shared/.git/config"),
    ("module-config", "printf \"[core]\\n\\tfsmonitor = touch $M/module-config\\n\" >> $W/.git/modules/sub/config"),
    (
        "module-nested-config",
        "printf \"[core]\\n\\tfsmonitor = touch $M/module-nested-config\\n\" >> $W/.git/modules/sub/modules/inner/config",
    ),
    ("main-config", "git -C $W config core.fsmonitor \"touch $M/main-config\""),
];

#[test]
fn start_time_git_control_files_are_read_only_and_the_hosts_git_runs_nothing() {
    let (uid, gid) = test_user();
    let mut env = TestEnv::with_profile(GIT_ENV);
    env.env.push(("SUDO_UID".into(), uid.to_string()));
    env.env.push(("SUDO_GID".into(), gid.to_string()));
    build_workspace(&env);
    let ws = env.workspace.clone();
    let marker_dir = env.scratch.join("markers");
    fs::create_dir(&marker_dir).expect("markers");
    fs::set_permissions(&marker_dir, fs::Permissions::from_mode(0o777)).expect("chmod markers");
    chown_tree(&ws, uid, gid);

    // The detector works: a config fsmonitor does run with this git.
    let probe = format!("core.fsmonitor=touch {}/self-test; true", marker_dir.display());
    dev_git_ok(&ws, &["-c", &probe, "status", "--short"]);
    assert_eq!(markers(&marker_dir), ["self-test"], "core.fsmonitor does not run: the test could not see an attack");
    fs::remove_file(marker_dir.join("self-test")).expect("rm self-test");
    let recorded_sub = dev_git_ok(&ws, &["rev-parse", "HEAD:sub"]);

    let mut script = format!(
        "M={}; W={}; mkdir -p $W/evil/hooks; printf \"[core]\\n\\tfsmonitor = touch $M/evil-dir\\n\" > $W/evil/config; ",
        marker_dir.display(),
        ws.display()
    );
    for (name, command) in ROUTES.iter().chain(GATED_ROUTES) {
        script.push_str(&format!("if ( {command} ) 2>/dev/null; then echo 'route {name}=written'; else echo 'route {name}=refused'; fi; "));
    }
    // Ordinary work inside: the agent can write the workspace, commit,
    // branch, commit in the linked worktree, add a new worktree (not
    // protected until the next start), check out a submodule's commit and
    // update the submodule (git rewrites its `core.worktree`, to the same
    // value, by renaming a new config over the old one: possible now that
    // the guard's gate judges repository configs instead of a read-only
    // bind).
    // A control: a write the agent may make is seen as written.
    script.push_str(
        "if ( echo x > $W/evil/control ) 2>/dev/null; then echo 'route control=written'; else echo 'route control=refused'; fi; ",
    );
    script.push_str(
        "set -e; echo plain > $W/agent-file; cd $W; echo a > a.txt; git add a.txt; git commit -qm agent-commit; \
         git branch agent-branch; cd $W/wt; echo b > b.txt; git add b.txt; git commit -qm wt-commit; cd $W; \
         git worktree add -q new-wt; git -C sub checkout -q --detach HEAD~1; \
         if git submodule update -q 2>$W/evil/update.err; then echo submodule-update=ok; else echo submodule-update=failed; fi; \
         sed 's/^/update: /' $W/evil/update.err; git -C sub checkout -q --detach $(git rev-parse HEAD:sub); \
         echo sub-head=$(git -C sub rev-parse HEAD); echo done=yes",
    );
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    println!("inside:\n{stdout}\nstderr:\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "stdout: {stdout}\nstderr: {stderr}");
    // Checked after the host's git has run, so that a failure shows both
    // what could be written and what then ran.
    let result = |name: &str| {
        let line = format!("route {name}=");
        stdout.lines().find_map(|l| l.strip_prefix(line.as_str())).unwrap_or_else(|| panic!("no result for {name}:\n{stdout}"))
    };
    let written: Vec<&str> = ROUTES.iter().map(|(name, _)| *name).filter(|name| result(name) != "refused").collect();
    let not_written: Vec<&str> = GATED_ROUTES.iter().map(|(name, _)| *name).filter(|name| result(name) != "written").collect();
    assert!(not_written.is_empty(), "a developer agent could not write these repository configs: {not_written:?}\n{stdout}");
    assert!(stdout.contains("route control=written"), "the route check cannot tell a write: {stdout}");
    assert!(stdout.contains("done=yes"), "{stdout}");
    assert_eq!(
        stdout.lines().find_map(|l| l.strip_prefix("sub-head=")).map(str::trim),
        Some(recorded_sub.trim()),
        "checking out the submodule inside"
    );
    assert!(stdout.contains("submodule-update=ok"), "git submodule update inside: {stdout}");
    assert!(stderr.contains("branch.cfg"), "the placeholder for the missing include is reported: {stderr}");
    assert_eq!(fs::read_to_string(ws.join("agent-file")).expect("agent-file"), "plain\n");

    // The developer's git on the host, everywhere below the workspace.
    let dirs = ["", "wt", "sub", "sub/inner", "linked", "shared", "new-wt"];
    for dir in dirs {
        let dir = ws.join(dir);
        for args in [&["status"][..], &["log", "-1"], &["diff"], &["diff", "--cached"]] {
            dev_git_ok(&dir, args);
        }
    }
    for dir in ["", "wt", "sub", "sub/inner", "shared"] {
        dev_git_ok(&ws.join(dir), &["commit", "-q", "--allow-empty", "-m", "host commit"]);
    }
    dev_git_ok(&ws, &["submodule", "status", "--recursive"]);
    let ran = markers(&marker_dir);
    assert!(
        ran.is_empty() && written.is_empty(),
        "the host's git ran what the agent planted: {ran:?}; routes that could write: {written:?}"
    );

    // What the agent did by ordinary means is there.
    assert_eq!(dev_git_ok(&ws, &["log", "-1", "--format=%s", "HEAD~1"]).trim(), "agent-commit");
    dev_git_ok(&ws, &["rev-parse", "--verify", "-q", "agent-branch"]);
    assert_eq!(dev_git_ok(&ws.join("wt"), &["log", "-1", "--format=%s", "HEAD~1"]).trim(), "wt-commit");
    assert!(dev_git_ok(&ws, &["worktree", "list"]).contains(&ws.join("new-wt").display().to_string()));
    assert_eq!(fs::read_to_string(ws.join("nested.cfg")).expect("nested.cfg"), "# nested include\n");
    assert_eq!(fs::read_to_string(ws.join(".git/info/exclude")).expect("exclude"), "secret-dir/\n");
    assert!(!ws.join(".git/info/attributes").exists());
    env.assert_nothing_left();
    env.assert_journal_conforms();
}
