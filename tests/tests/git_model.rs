//! The guard's model of git end to end (issue 32): the agent (the test
//! developer inside a Domain) builds what makes the host's git run a
//! command of its choice or read from / connect to a place it named, the
//! way git itself reads a repository rather than the way a repository
//! usually looks; afterwards the developer runs their everyday git on the
//! host (status, log, commit, fetch, pull, push, reset, resumed
//! operations). Every planted program runs `touch MARKERS/<route>` in a
//! host-only directory; a place the agent named is a host repository
//! outside the workspace whose commit must never reach the workspace.
//!
//! Property 1: git state is judged the way git reads it (git dirs by git's
//! own discovery, in-progress operations, hooks through the developer's
//! own configuration). Property 2: the developer's git never reaches out
//! where the agent chose.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use lazaret_tests::escalation::chown_tree;
use lazaret_tests::netlab;
use lazaret_tests::*;

const GIT_ENV: &str = "env = { GIT_AUTHOR_NAME = \"Agent Smith\", GIT_AUTHOR_EMAIL = \"agent@example.invalid\", GIT_COMMITTER_NAME = \"Agent Smith\", GIT_COMMITTER_EMAIL = \"agent@example.invalid\" }\n";

/// A Domain whose agent is the test developer, the workspace theirs.
fn developer_env() -> TestEnv {
    let (uid, gid) = test_user();
    let mut env = TestEnv::with_profile(GIT_ENV);
    env.env.push(("SUDO_UID".into(), uid.to_string()));
    env.env.push(("SUDO_GID".into(), gid.to_string()));
    chown_tree(&env.workspace, uid, gid);
    env
}

/// The developer's git with extra environment (their XDG config).
fn developer_git_with(dir: &Path, env: &[(&str, &Path)], args: &[&str]) -> Output {
    let home = nix::unistd::User::from_name(TEST_USER).ok().flatten().map(|u| u.dir).unwrap_or_else(|| PathBuf::from("/"));
    let mut cmd = std::process::Command::new("runuser");
    cmd.args(["-u", TEST_USER, "--", "env"]).arg(format!("HOME={}", home.display()));
    for (k, v) in env {
        cmd.arg(format!("{k}={}", v.display()));
    }
    cmd.args(["git", "-c", "user.name=Dev", "-c", "user.email=dev@example.invalid", "-C"])
        .arg(dir)
        .args(args)
        .output()
        .expect("running the developer's git")
}

/// The developer's private repository on the host, outside the workspace
/// (the sandbox never sees it): one commit of `secret.txt`. Its path and
/// that commit's id.
fn private_repository(env: &TestEnv) -> (PathBuf, String) {
    let (uid, gid) = test_user();
    let private = env.scratch.join("private");
    fs::create_dir_all(&private).expect("private");
    setup_git(&private, &["init", "-q", "-b", "main"]);
    fs::write(private.join("secret.txt"), "host secret\n").expect("secret");
    setup_git(&private, &["add", "secret.txt"]);
    setup_git(&private, &["commit", "-qm", "private"]);
    let secret = setup_git(&private, &["rev-parse", "HEAD"]).trim().to_owned();
    chown_tree(&private, uid, gid);
    (private, secret)
}

/// Runs the agent's script in one session; it must print `done=yes`.
fn agent(env: &TestEnv, script: &str) -> String {
    let out = env.run(["run", "test", "--", "sh", "-c", script]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    println!("inside:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("done=yes"), "the agent's script did not finish: {stdout}\n{stderr}");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");
    stdout
}

/// The paths of the Domain's journalled neutralisations, each with its kind.
fn journalled(env: &TestEnv) -> Vec<(String, String)> {
    env.journal_entries()
        .into_iter()
        .filter(|e| e["action"] == "NeutraliseSandboxWrite")
        .map(|e| (e["path"].as_str().unwrap_or_default().to_owned(), e["kind"].as_str().unwrap_or_default().to_owned()))
        .collect()
}

/// Asserts that each of `paths` was neutralised (journalled).
fn assert_neutralised(env: &TestEnv, paths: &[&str]) {
    let done = journalled(env);
    let missing: Vec<&&str> = paths.iter().filter(|p| !done.iter().any(|(path, _)| path == *p)).collect();
    assert!(missing.is_empty(), "not neutralised: {missing:?}; journalled: {done:#?}");
}

/// Lines `route NAME=ok` the script printed for each of `routes`.
fn assert_planted(stdout: &str, routes: &[&str]) {
    let missing: Vec<&&str> = routes.iter().filter(|r| !stdout.contains(&format!("route {r}=ok"))).collect();
    assert!(missing.is_empty(), "routes that could not even be planted (the test would test nothing): {missing:?}\n{stdout}");
}

/// Property 1: directories git accepts as git directories that do not look
/// like `.git` or like `git init`'s layout. (a) a common directory without
/// `HEAD`, reached through a linked worktree's gitdir (`commondir = ../..`)
/// and a `.git` file: git reads the common dir's config and hooks; (b) a
/// bare repository whose `objects` and `refs` are symlinks (git only needs
/// them to be searchable), with a work tree set in its config, which git
/// discovers from any directory below it.
// Each directory becomes a git dir only with its last step (objects and
// refs, HEAD and commondir), so the guard, which acts within milliseconds,
// cannot take a file away before the plant is complete.
#[test]
fn git_dirs_git_would_discover_are_guarded_however_they_are_built() {
    let env = developer_env();
    let ws = env.workspace.clone();
    let m = marker_dir(&env);
    let script = format!(
        "set -u; M={m}; W={w}; \
         (set -e; mkdir -p $W/c1/common/hooks $W/c1/wt; \
          printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = touch %s/c1-config; false\\n' $M > $W/c1/common/config; \
          printf '#!/bin/sh\\ntouch %s/c1-hook\\n' $M > $W/c1/common/hooks/pre-commit; chmod +x $W/c1/common/hooks/pre-commit 2>/dev/null || true; \
          mkdir -p $W/c1/common/worktrees/w $W/c1/common/objects $W/c1/common/refs/heads; \
          echo 'ref: refs/heads/main' > $W/c1/common/worktrees/w/HEAD; echo ../.. > $W/c1/common/worktrees/w/commondir; \
          echo \"gitdir: $W/c1/common/worktrees/w\" > $W/c1/wt/.git; \
          echo 'route c1=ok'); \
         (set -e; mkdir -p $W/b1/store/objects $W/b1/store/refs/heads $W/b1/bare/sub; \
          printf '[core]\\n\\trepositoryformatversion = 0\\n\\tbare = false\\n\\tworktree = ..\\n\\tfsmonitor = touch %s/b1-config; false\\n' $M > $W/b1/bare/config; \
          echo 'ref: refs/heads/main' > $W/b1/bare/HEAD; \
          ln -s ../store/objects $W/b1/bare/objects; ln -s ../store/refs $W/b1/bare/refs; echo 'route b1=ok'); \
         echo done=yes",
        m = m.display(),
        w = ws.display()
    );
    let stdout = agent(&env, &script);
    assert_planted(&stdout, &["c1", "b1"]);

    for (dir, args) in [
        ("c1/wt", &["status"][..]),
        ("c1/wt", &["commit", "-q", "--allow-empty", "-m", "host commit"]),
        ("b1/bare/sub", &["status"]),
        ("b1/bare/sub", &["log", "-1"]),
        ("b1", &["-C", "bare", "status"]),
    ] {
        let out = developer_git(&ws.join(dir), args);
        println!("host git {args:?} in {dir}: {}{}", text(&out.stdout), text(&out.stderr));
    }
    let ran = markers(&m);
    assert!(ran.is_empty(), "the host's git ran what the agent planted in a git dir of its own making: {ran:?}");
    assert_neutralised(&env, &["c1/common/config", "c1/common/hooks/pre-commit", "b1/bare/config"]);
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Property 1: in-progress operations the agent leaves, resumed by the
/// developer. Beyond a rebase todo's `exec` lines, git reads a merge
/// strategy on `--continue` (`rebase-merge/strategy`,
/// `sequencer/opts` `options.strategy`) and runs `git merge-<strategy>`:
/// a value with `../` makes that a path in the work tree
/// (`git-merge-../../x` through a directory `git-merge-..`).
#[test]
fn operation_state_the_agent_leaves_runs_nothing_when_the_developer_resumes_it() {
    let env = developer_env();
    let ws = env.workspace.clone();
    let m = marker_dir(&env);
    let script = format!(
        "set -u; M={m}; W={w}; \
         (set -e; cd $W; echo base > f; git add f; git commit -qm base; git checkout -q -b side; echo one > f; git commit -qam one; echo two > g; git add g; git commit -qm two; \
          git checkout -q main; echo other > f; git commit -qam other; git checkout -q -b picking; \
          git cherry-pick side~1 side >/dev/null 2>&1 || true; test -d .git/sequencer; echo resolved > f; git add f; \
          printf '[options]\\n\\tstrategy = ../../pick-x\\n' > .git/sequencer/opts; \
          mkdir -p git-merge-..; printf '#!/bin/sh\\ntouch %s/cherry-pick-strategy\\n' $M > pick-x; chmod +x pick-x; echo 'route cherry-pick=ok'); \
         (set -e; git init -q -b main $W/r; cd $W/r; echo a > f; git add f; git commit -qm a; echo b > f; git commit -qam b; \
          git checkout -q -b topic HEAD~1; echo c > g; git add g; git commit -qm c; echo d > h; git add h; git commit -qm d; \
          GIT_SEQUENCE_EDITOR=\"sed -i '1i break'\" git rebase -q -i main >/dev/null 2>&1; test -d .git/rebase-merge; \
          echo ../../rebase-x > .git/rebase-merge/strategy; \
          mkdir -p git-merge-..; printf '#!/bin/sh\\ntouch %s/rebase-strategy\\n' $M > rebase-x; chmod +x rebase-x; echo 'route rebase=ok'); \
         echo done=yes",
        m = m.display(),
        w = ws.display()
    );
    let stdout = agent(&env, &script);
    assert_planted(&stdout, &["cherry-pick", "rebase"]);

    assert!(dev_git_ok(&ws, &["status"]).contains("cherry-pick"), "git status does not show the cherry-pick in progress");
    let out = developer_git(&ws, &["cherry-pick", "--continue"]);
    println!("cherry-pick --continue: {}{}", text(&out.stdout), text(&out.stderr));
    assert!(dev_git_ok(&ws.join("r"), &["status"]).contains("rebase"), "git status does not show the rebase in progress");
    let out = developer_git(&ws.join("r"), &["rebase", "--continue"]);
    println!("rebase --continue: {}{}", text(&out.stdout), text(&out.stderr));
    let ran = markers(&m);
    assert!(ran.is_empty(), "resuming the agent's operation ran what it chose: {ran:?}");
    assert_neutralised(&env, &[".git/sequencer/opts", "r/.git/rebase-merge/strategy"]);
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Property 1: hooks found through the developer's own configuration. The
/// developer's global `core.hooksPath` is relative (`.githooks`): git
/// takes it relative to each repository's work tree, so in a repository
/// the agent makes, hooks are wherever the agent writes `.githooks/`.
#[test]
fn hooks_found_through_the_developers_global_hooks_path_run_nothing() {
    let env = developer_env();
    let ws = env.workspace.clone();
    let m = marker_dir(&env);
    let (uid, gid) = test_user();
    let xdg = env.scratch.join("xdg");
    fs::create_dir_all(xdg.join("git")).expect("xdg");
    fs::write(xdg.join("git/config"), "[core]\n\thooksPath = .githooks\n").expect("global config");
    chown_tree(&xdg, uid, gid);
    let mut env = env;
    env.env.push(("XDG_CONFIG_HOME".into(), xdg.to_string_lossy().into_owned()));
    let script = format!(
        "set -u; M={m}; W={w}; \
         (set -e; git init -q -b main $W/n; mkdir -p $W/n/.githooks $W/n/deep/er; echo 'route n=ok'); \
         for h in pre-commit post-commit post-checkout; do printf '#!/bin/sh\\ntouch %s/%s\\n' $M $h > $W/n/.githooks/$h; chmod +x $W/n/.githooks/$h 2>/dev/null; done; \
         echo done=yes",
        m = m.display(),
        w = ws.display()
    );
    let stdout = agent(&env, &script);
    assert_planted(&stdout, &["n"]);

    let xdg_env = [("XDG_CONFIG_HOME", xdg.as_path())];
    // The detector: the developer's hooksPath does run hooks in a
    // repository of theirs.
    let own = env.scratch.join("own");
    fs::create_dir_all(own.join(".githooks")).expect("own");
    setup_git(&own, &["init", "-q", "-b", "main"]);
    fs::write(own.join(".githooks/post-commit"), format!("#!/bin/sh\ntouch {}/self-test\n", m.display())).expect("hook");
    fs::set_permissions(own.join(".githooks/post-commit"), fs::Permissions::from_mode(0o755)).expect("chmod");
    chown_tree(&own, uid, gid);
    let _ = developer_git_with(&own, &xdg_env, &["commit", "-q", "--allow-empty", "-m", "x"]);
    assert_eq!(markers(&m), ["self-test"], "the developer's global core.hooksPath does not run hooks: the test could not see an attack");
    fs::remove_file(m.join("self-test")).expect("rm self-test");

    for (dir, args) in [
        ("n", &["commit", "-q", "--allow-empty", "-m", "host commit"][..]),
        ("n/deep/er", &["commit", "-q", "--allow-empty", "-m", "host commit 2"]),
        ("n", &["checkout", "-q", "-b", "other"]),
    ] {
        let out = developer_git_with(&ws.join(dir), &xdg_env, args);
        println!("host git {args:?} in {dir}: {}{}", text(&out.stdout), text(&out.stderr));
    }
    let ran = markers(&m);
    assert!(ran.is_empty(), "the developer's own hooksPath ran hooks the agent planted: {ran:?}");
    assert_neutralised(&env, &["n/.githooks/pre-commit", "n/.githooks/post-commit", "n/.githooks/post-checkout"]);
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Property 2: places the agent names in repositories it makes. A host
/// repository outside the workspace (the developer's private one, never
/// visible in the sandbox) is named (a) as the promisor remote of a
/// partial clone (`git status` fetches the missing commit by itself),
/// (b) as a `file://` remote (`git fetch`, and `git push` sending the
/// developer's commit there), (c) as `branch.main.remote` (a path, not a
/// remote's name: `git pull`), (d) in `objects/info/alternates` (its
/// objects become the repository's: `git reset --hard` checks the private
/// file out into the workspace). Found by a review (2026-12-06): (e) in a
/// `branches/origin` file, with `branch.main.remote = origin` and no
/// remote URL in the config (git reads the URL from the file); (f) as a
/// URL that reads as inside but climbs out of a symlink the agent made
/// (`sub/l/../..`, `sub/l -> private/.git/refs`); (g) as a `file://` URL
/// with `%2e%2e` (git decodes it to `..`).
#[test]
fn places_the_agent_names_are_never_read_or_contacted_by_the_developers_git() {
    let env = developer_env();
    let ws = env.workspace.clone();
    let (private, secret) = private_repository(&env);
    let p = private.display();
    // Files the guard takes away at once are renamed into place: created
    // there, the guard could take one away between the host's create and
    // gVisor's next look at it, and the agent's write then fails with
    // ENOENT (CI: "cannot create .git/branches/origin: Directory
    // nonexistent", the file quarantined all the same).
    let script = format!(
        "set -u; W={w}; P={p}; S={secret}; \
         (set -e; git init -q -b main $W/p1; cd $W/p1; git config core.repositoryformatversion 1; git config extensions.partialclone origin; \
          git config remote.origin.url $P; git config remote.origin.promisor true; echo $S > .git/refs/heads/main; echo 'route promisor=ok'); \
         (set -e; git init -q -b main $W/p2; cd $W/p2; echo x > x; git add x; git commit -qm x; git remote add origin file://$P; echo 'route file-url=ok'); \
         (set -e; git init -q -b main $W/p3; cd $W/p3; echo y > y; git add y; git commit -qm y; git config branch.main.remote $P; git config branch.main.merge refs/heads/main; echo 'route branch-remote=ok'); \
         (set -e; git init -q -b main $W/p4; cd $W/p4; echo $P/.git/objects > .git/alt.new; mv .git/alt.new .git/objects/info/alternates; echo $S > .git/refs/heads/main; echo 'route alternates=ok'); \
         (set -e; git init -q -b main $W/p6; cd $W/p6; echo y > y; git add y; git commit -qm y; mkdir -p .git/branches; echo \"$P#main\" > .git/origin.new; mv .git/origin.new .git/branches/origin; \
          git config branch.main.remote origin; git config branch.main.merge refs/heads/main; echo 'route branches-file=ok'); \
         (set -e; git init -q -b main $W/p7; cd $W/p7; echo z > z; git add z; git commit -qm z; mkdir sub; ln -s $P/.git/refs sub/l; \
          git remote add origin $W/p7/sub/l/../..; echo 'route dotdot-through-symlink=ok'); \
         (set -e; git init -q -b main $W/p8; cd $W/p8; echo w > w; git add w; git commit -qm w; git remote add origin \"file://$W/%2e%2e/private\"; \
          echo 'route percent-escaped-url=ok'); \
         echo done=yes",
        w = ws.display(),
    );
    let stdout = agent(&env, &script);
    assert_planted(
        &stdout,
        &["promisor", "file-url", "branch-remote", "alternates", "branches-file", "dotdot-through-symlink", "percent-escaped-url"],
    );
    // The percent-escaped URL names the private repository only from where it is.
    assert_eq!(private.parent(), ws.parent(), "p8's URL assumes the private repository beside the workspace");

    for (dir, args) in [
        ("p1", &["status"][..]),
        ("p1", &["log", "-1"]),
        ("p2", &["fetch", "-q"]),
        ("p2", &["commit", "-q", "--allow-empty", "-m", "developer's work"]),
        ("p2", &["push", "-q", "origin", "HEAD:refs/heads/pushed"]),
        ("p3", &["pull", "-q", "--no-rebase", "--allow-unrelated-histories"]),
        ("p4", &["reset", "-q", "--hard"]),
        ("p4", &["status"]),
        ("p6", &["fetch", "-q"]),
        ("p6", &["pull", "-q", "--no-rebase", "--allow-unrelated-histories"]),
        ("p7", &["fetch", "-q", "origin"]),
        ("p8", &["fetch", "-q", "origin"]),
    ] {
        let out = developer_git(&ws.join(dir), args);
        println!("host git {args:?} in {dir}: {}{}", text(&out.stdout), text(&out.stderr));
    }
    let mut reached = Vec::new();
    for repo in ["p1", "p2", "p3", "p6", "p7", "p8"] {
        // Whether the private commit is now in the agent's repository
        // (read without fetching anything).
        let out = developer_git(&ws.join(repo), &["--no-lazy-fetch", "cat-file", "-e", &secret]);
        if out.status.success() {
            reached.push(format!("{repo}: the private commit was copied into the workspace"));
        }
    }
    if ws.join("p4/secret.txt").exists() {
        reached.push("p4: the private file was checked out into the workspace".into());
    }
    if text(&developer_git(&private, &["for-each-ref", "refs/heads/pushed"]).stdout).contains("pushed") {
        reached.push("p2: the developer's push went to the agent's place".into());
    }
    assert!(reached.is_empty(), "the developer's git reached where the agent chose: {reached:#?}");
    assert_neutralised(
        &env,
        &[
            "p1/.git/config",
            "p2/.git/config",
            "p3/.git/config",
            "p4/.git/objects/info/alternates",
            "p6/.git/branches/origin",
            "p7/.git/config",
            "p8/.git/config",
        ],
    );
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Property 2, a route nobody listed: a git dir's `objects` replaced by a
/// symlink to the developer's private repository's objects (git follows
/// it, as it would an alternate). Shown first with the guard off (the
/// coordinator's test hook): `git reset --hard` checks the private file
/// out into the workspace; with the guard on, the symlink is quarantined.
#[test]
fn a_git_dir_symlinked_to_a_host_repository_reads_nothing_of_it() {
    let env = developer_env();
    let ws = env.workspace.clone();
    let (private, secret) = private_repository(&env);
    // A fresh repository each run: the one of the first run is the
    // developer's (Git Sentry's) at the second start.
    for (guard_on, repo) in [(false, "p5-off"), (true, "p5")] {
        let script = format!(
            "set -u; W={w}; P={p}; \
             (set -e; git init -q -b main $W/{repo}; cd $W/{repo}; rm -rf .git/objects; ln -s $P/.git/objects .git/objects; echo {secret} > .git/refs/heads/main; echo 'route objects-symlink=ok'); \
             echo done=yes",
            w = ws.display(),
            p = private.display(),
        );
        let mut run = env.lazaret(["run", "test", "--", "sh", "-c", &script]);
        if !guard_on {
            run.env("LAZARET_TEST_HOOKS", "1").env("LAZARET_TEST_GUARD", "off");
        }
        let out = run.output().expect("lazaret run");
        let stdout = text(&out.stdout);
        println!("guard {guard_on}: {stdout}{}", text(&out.stderr));
        assert_planted(&stdout, &["objects-symlink"]);
        assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");
        let out = developer_git(&ws.join(repo), &["reset", "-q", "--hard"]);
        println!("host git reset --hard: {}{}", text(&out.stdout), text(&out.stderr));
        let leaked = ws.join(repo).join("secret.txt").exists();
        if guard_on {
            assert!(!leaked, "the developer's git read the host repository the agent's symlink named");
        } else {
            assert!(leaked, "with the guard off the private file was not checked out: the test could not see an attack");
        }
    }
    assert_neutralised(&env, &["p5/.git/objects"]);
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Counts TCP connections to `addr` in the namespace `netns` (a thread
/// that enters it alone) until dropped.
struct Listener {
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Listener {
    fn start(netns: &Path, addr: &str) -> Listener {
        use std::sync::atomic::Ordering;
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let ns = fs::File::open(netns).expect("open the lab namespace");
        let addr = addr.to_owned();
        let (count, halt) = (connections.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            // Only this thread enters the lab's world.
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns into the lab world");
            let listener = std::net::TcpListener::bind(&addr).expect("bind in the lab world");
            listener.set_nonblocking(true).expect("nonblocking");
            ready_tx.send(()).expect("ready");
            while !halt.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok(_) => {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
        });
        ready_rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the listener did not start");
        Listener { connections, stop, thread: Some(thread) }
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Property 2 with a network URL: a repository the agent made names a
/// server of its choosing as `origin` (`http://`, and a `pushurl` in
/// scp-like SSH form would be judged the same). The developer's `git
/// fetch` and `git push` run on the host, outside any egress policy of
/// the Domain. Everything runs in a lab the test made (the server is a
/// listener in the lab's world namespace, the developer's git in the lab's
/// host namespace). Shown first with the guard off: the developer's git
/// connects; with the guard on, the URL is dropped and nothing connects.
#[test]
fn the_developers_git_never_connects_to_a_network_url_the_agent_named() {
    let lab = netlab::NetLab::new();
    let mut env = developer_env();
    env.netns = Some(lab.host.clone());
    let ws = env.workspace.clone();
    let server = format!("{}:9418", netlab::PUBLIC);
    let listener = Listener::start(&lab.world, &server);
    let developer_git_in_lab = |dir: &Path, args: &[&str]| {
        let home = nix::unistd::User::from_name(TEST_USER).ok().flatten().map(|u| u.dir).unwrap_or_else(|| PathBuf::from("/"));
        std::process::Command::new("nsenter")
            .arg(format!("--net={}", lab.host.display()))
            .args(["--", "runuser", "-u", TEST_USER, "--", "env"])
            .arg(format!("HOME={}", home.display()))
            .args(["timeout", "20", "git", "-c", "user.name=Dev", "-c", "user.email=dev@example.invalid", "-C"])
            .arg(dir)
            .args(args)
            .output()
            .expect("running the developer's git in the lab")
    };
    for (guard_on, repo) in [(false, "p6-off"), (true, "p6")] {
        let script = format!(
            "set -u; W={w}; (set -e; git init -q -b main $W/{repo}; cd $W/{repo}; echo x > x; git add x; git commit -qm x; \
             git remote add origin http://{server}/x.git; echo 'route network-url=ok'); echo done=yes",
            w = ws.display()
        );
        let mut run = env.lazaret(["run", "test", "--", "sh", "-c", &script]);
        if !guard_on {
            run.env("LAZARET_TEST_HOOKS", "1").env("LAZARET_TEST_GUARD", "off");
        }
        let out = run.output().expect("lazaret run");
        let stdout = text(&out.stdout);
        println!("guard {guard_on}: {stdout}{}", text(&out.stderr));
        assert_planted(&stdout, &["network-url"]);
        assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new(), "the Domain did not go down");
        let before = listener.connections();
        for args in [&["fetch", "-q"][..], &["push", "-q", "origin", "HEAD:refs/heads/main"]] {
            let out = developer_git_in_lab(&ws.join(repo), args);
            println!("host git {args:?} in {repo}: {}{}", text(&out.stdout), text(&out.stderr));
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let contacted = listener.connections() - before;
        if guard_on {
            assert_eq!(contacted, 0, "the developer's git connected to the server the agent named");
        } else {
            assert!(contacted > 0, "with the guard off the developer's git did not connect: the test could not see an attack");
        }
    }
    assert_neutralised(&env, &["p6/.git/config"]);
    drop(listener);
    env.assert_nothing_left();
    env.assert_journal_conforms();
}
