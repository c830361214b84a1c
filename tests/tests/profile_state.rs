//! Profile state (issue 31, part 1): `profile_state = ["~/.fakecli"]` keeps
//! that directory of the agent's home per (developer, profile) in the
//! Storage Root, so what one checkout's Domain writes there (a login) is in
//! every other checkout's Domain of the profile, and never in the host's
//! own `~/.fakecli`. Two Domains of the profile run at once;
//! `lazaret reset-profile-state` forgets it, refusing while one runs.
//! Whatever the agent leaves there (symlinks to host paths, setuid files)
//! is followed by nothing on the host and loses its privilege bits.
//!
//! Every test here uses the profile `test` of the shared test Storage
//! Root, so they take turns ([`serial`]) and start from a reset.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use lazaret_tests::escalation::{make_developer, wait_for};
use lazaret_tests::*;

const STATE: &str = "profile_state = [\"~/.fakecli\"]\n";

/// One test at a time: they share the state of (developer, `test`).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A checkout whose developer is [`TEST_USER`], with `extra` profile keys.
fn checkout(extra: &str) -> TestEnv {
    let mut env = TestEnv::with_profile(&format!("{STATE}{extra}"));
    make_developer(&mut env);
    env
}

/// The host directory of the test user's `test` profile state.
fn store(env: &TestEnv) -> PathBuf {
    env.storage.join("profiles").join(test_user().0.to_string()).join("test")
}

fn run_sh(env: &TestEnv, script: &str) -> (i32, String, String) {
    let out = env.run(["run", "test", "--", "sh", "-c", script]);
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

fn ok_sh(env: &TestEnv, script: &str) -> String {
    let (code, stdout, stderr) = run_sh(env, script);
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    stdout
}

fn reset(env: &TestEnv) -> (i32, String, String) {
    let out = env.run(["reset-profile-state", "test", "--json"]);
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// The test user's own home on the host.
fn host_home() -> PathBuf {
    nix::unistd::User::from_name(TEST_USER).ok().flatten().expect("test user").dir
}

#[test]
fn a_login_written_in_one_checkout_is_in_the_others_and_not_in_the_hosts_home() {
    let _turn = serial();
    let (a, b) = (checkout(""), checkout(""));
    assert_eq!(reset(&a).0, 0, "starting from a reset");
    let host_own = host_home().join(".fakecli");
    assert!(!host_own.exists(), "{} exists before the test: remove it", host_own.display());

    // Written as CLIs write their files: a temporary file renamed over it.
    let out = ok_sh(
        &a,
        "echo token-of-a > ~/.fakecli/token.tmp && mv ~/.fakecli/token.tmp ~/.fakecli/token && stat -c 'owner=%U mode=%a' ~/.fakecli",
    );
    assert!(out.contains("owner=lazaret-test mode=700") || out.contains(&format!("owner={TEST_USER} mode=700")), "{out}");
    assert_eq!(a.wait_domains_unlocked(), Vec::<String>::new());
    // Another checkout: another Domain (another persistent home), same state.
    let out = ok_sh(&b, "cat ~/.fakecli/token; ls -a ~ | grep -c lazaret-e2e-mark || true; touch ~/lazaret-e2e-mark");
    assert!(out.starts_with("token-of-a\n"), "{out}");
    assert_eq!(b.wait_domains_unlocked(), Vec::<String>::new());
    // ...but only that directory: the rest of B's home is B's own.
    let out = ok_sh(&a, "test -e ~/lazaret-e2e-mark && echo shared-home || echo own-home");
    assert_eq!(out.trim(), "own-home");
    assert_eq!(a.wait_domains_unlocked(), Vec::<String>::new());

    // On the host: in the Storage Root, the developer's; never the host's own ~/.fakecli.
    let token = store(&a).join("home/.fakecli/token");
    assert_eq!(fs::read_to_string(&token).expect("token in the store"), "token-of-a\n");
    assert_eq!(fs::metadata(&token).expect("stat").uid(), test_user().0);
    let parent = fs::metadata(store(&a)).expect("store");
    assert_eq!((parent.uid(), parent.mode() & 0o777), (0, 0o700), "the store itself is root's");
    assert!(!host_own.exists(), "the host's own {} was created", host_own.display());

    // Forgotten by a reset: the next Domain starts empty.
    let (code, stdout, stderr) = reset(&a);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let json: serde_json::Value = serde_json::from_str(&stdout).expect("reset --json");
    assert_eq!((json["profile"].as_str(), json["removed"].as_bool()), (Some("test"), Some(true)), "{json}");
    assert!(!store(&a).exists());
    let out = ok_sh(&b, "ls -A ~/.fakecli | wc -l");
    assert_eq!(out.trim(), "0", "state left after the reset");
    assert_eq!(b.wait_domains_unlocked(), Vec::<String>::new());
    assert_eq!(reset(&b).0, 0);
    a.assert_nothing_left();
    b.assert_nothing_left();
}

#[test]
fn two_domains_of_a_profile_run_at_once_and_a_reset_waits_for_both_to_stop() {
    let _turn = serial();
    let (a, b) = (checkout(""), checkout(""));
    assert_eq!(reset(&a).0, 0, "starting from a reset");
    // A stays up until B tells it to stop, through the shared state.
    let long = a
        .lazaret([
            "run",
            "test",
            "--",
            "sh",
            "-c",
            "echo from-a > ~/.fakecli/from-a; while [ ! -e ~/.fakecli/stop ]; do sleep 0.2; done; cat ~/.fakecli/from-b",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning A");
    let from_a = store(&a).join("home/.fakecli/from-a");
    wait_for("A's first write", Duration::from_secs(60), || from_a.exists().then_some(()));

    let out = ok_sh(&b, "cat ~/.fakecli/from-a; echo from-b > ~/.fakecli/from-b");
    assert_eq!(out, "from-a\n");
    assert_eq!(b.wait_domains_unlocked(), Vec::<String>::new());
    // A runs: the reset is refused, naming the fix, and removes nothing.
    let (code, stdout, stderr) = reset(&b);
    assert_ne!(code, 0, "reset while a Domain runs: {stdout}");
    assert!(stderr.contains("a Domain of profile \"test\" is running") && stderr.contains("lazaret stop test"), "{stderr}");
    assert!(from_a.exists(), "the refused reset removed state");

    // A session of A's checkout with other profile_state cannot join A.
    a.write_config("profile_state = [\"~/.fakecli\", \"~/.other\"]\n");
    let (code, _, stderr) = run_sh(&a, "true");
    assert_ne!(code, 0, "joined with other settings: {stderr}");
    assert!(stderr.contains("settings that differ: profiles.test.profile_state"), "{stderr}");
    a.write_config(STATE);

    ok_sh(&b, "touch ~/.fakecli/stop");
    let out = wait_output(long);
    assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), "from-b\n".to_string()), "A: {}", text(&out.stderr));
    assert_eq!(a.wait_domains_unlocked(), Vec::<String>::new());
    assert_eq!(b.wait_domains_unlocked(), Vec::<String>::new());
    let (code, stdout, stderr) = reset(&a);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(!store(&a).exists());
    a.assert_nothing_left();
    b.assert_nothing_left();
    a.assert_journal_conforms();
}

#[test]
fn what_a_root_agent_leaves_in_the_state_is_followed_by_nothing_on_the_host_and_carries_no_privileges() {
    let _turn = serial();
    let (uid, gid) = test_user();
    let env = checkout("user = \"root\"\n");
    assert_eq!(reset(&env).0, 0, "starting from a reset");
    // A host directory the agent cannot see, with something to lose. The
    // links point only there: were the host ever to follow them, the test
    // loses its own scratch files, never the machine's.
    let host = env.scratch.join("host-precious");
    fs::create_dir(&host).expect("host dir");
    fs::write(host.join("keep"), "keep").expect("host file");
    let host_s = host.display().to_string();
    let script = format!(
        "set -e; cd ~/.fakecli; cp /bin/true suid; chmod 4755 suid; echo x > sgid; chmod 2755 sgid; \
         ln -s {host_s} to-host; ln -s {host_s}/keep to-host-file; mkdir -p deep/er; ln -s {host_s} deep/er/to-host; \
         sleep 1; stat -c '%n %a' suid"
    );
    let out = ok_sh(&env, &script);
    println!("inside:\n{out}");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    let home = store(&env).join("home/.fakecli");
    for name in ["suid", "sgid"] {
        let meta = fs::symlink_metadata(home.join(name)).expect(name);
        assert_eq!(meta.mode() & 0o6000, 0, "{name} keeps its privilege bits on the host (mode {:o})", meta.mode() & 0o7777);
        assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{name}: a root agent's file is the developer's");
    }
    let journal = env.journal_entries();
    let neutralised: Vec<&serde_json::Value> = journal.iter().filter(|e| e["action"] == "NeutraliseSandboxWrite").collect();
    assert!(neutralised.iter().any(|e| e["root"] == "profile-state:/root/.fakecli" && e["path"] == "suid"), "{neutralised:#?}");

    // The next start prepares the state again and follows nothing.
    let out = ok_sh(&env, "ls ~/.fakecli | sort | tr '\\n' ' '; cat ~/.fakecli/to-host-file 2>/dev/null || echo unreachable");
    assert!(out.contains("unreachable"), "the host file is visible inside: {out}");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    // The reset removes the links, never what they point to.
    let (code, stdout, stderr) = reset(&env);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(!store(&env).exists());
    assert_eq!(fs::read_to_string(host.join("keep")).expect("the host file survives"), "keep");
    assert!(PathBuf::from("/bin/true").exists());
    env.assert_nothing_left();
}

#[test]
fn profile_state_over_the_workspace_or_a_volume_is_refused_with_its_place() {
    let _turn = serial();
    let env = checkout("volumes = [\"/usr/share:~/.fakecli/share:ro\"]\n");
    let (code, stdout, stderr) = run_sh(&env, "echo started");
    assert_ne!(code, 0, "{stdout}");
    assert!(
        stderr.contains("profile state ~/.fakecli is /home/") && stderr.contains("where volume \"/usr/share:~/.fakecli/share:ro\""),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("{}:", env.config.display())), "no FILE:LINE:COL: {stderr}");
    env.assert_nothing_left();

    // A workspace below the developer's home, inside a state directory.
    let mut env = TestEnv::below(&host_home(), "src/project", "");
    make_developer(&mut env);
    let scratch = env.scratch.file_name().expect("name").to_string_lossy().into_owned();
    env.write_config(&format!("profile_state = [\"~/{scratch}/src\"]\n"));
    let (code, stdout, stderr) = run_sh(&env, "echo started");
    assert_ne!(code, 0, "{stdout}");
    assert!(
        stderr.contains(&format!(
            "profile state ~/{scratch}/src is /home/{TEST_USER}/{scratch}/src, and the workspace is {}",
            env.workspace.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("hint: keep the workspace out of the agent's state directories"), "{stderr}");
    env.assert_nothing_left();
}

#[test]
fn a_symlink_the_agent_left_where_the_state_appears_is_removed_and_leads_nowhere_on_the_host() {
    let _turn = serial();
    let mut env = TestEnv::with_profile("");
    make_developer(&mut env);
    assert_eq!(reset(&env).0, 0, "starting from a reset");
    // Without profile_state, the agent leaves ~/.fakecli in its Domain's
    // home as a symlink to a host path (the test's own scratch directory).
    let host = env.scratch.join("host-target");
    fs::create_dir(&host).expect("host dir");
    let (uid, gid) = test_user();
    nix::unistd::chown(&host, Some(uid.into()), Some(gid.into())).expect("chown");
    ok_sh(&env, &format!("ln -s {} ~/.fakecli", host.display()));
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    // With it, the state is bound there: the link is removed, not followed
    // (runsc would otherwise mount the state at its target inside).
    env.write_config(STATE);
    let out = ok_sh(&env, "echo t > ~/.fakecli/token && test ! -L ~/.fakecli && echo bound");
    assert_eq!(out.trim(), "bound");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    assert_eq!(fs::read_dir(&host).expect("host dir").count(), 0, "written through the agent's link on the host");
    assert_eq!(fs::read_to_string(store(&env).join("home/.fakecli/token")).expect("in the store"), "t\n");
    assert_eq!(reset(&env).0, 0);
    env.assert_nothing_left();
}
