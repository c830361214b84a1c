//! The coordinator daemon end to end (issue 5): sessions sharing one
//! Domain, configuration refusal, concurrency, crash recovery at every
//! start-up stage, `lazaret stop`, `ls`, and hostile clients.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use lazaret_tests::netlab::NetLab;
use lazaret_tests::*;

/// A `lazaret run` with piped stdio and its stdout as lines.
type Session = PipedSession;

fn ls_json(env: &TestEnv) -> Vec<serde_json::Value> {
    let out = env.run(["ls", "--json"]);
    assert!(out.status.success(), "ls: {}", text(&out.stderr));
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout)
        .unwrap_or_else(|e| panic!("ls --json output {:?}: {e}", text(&out.stdout)))
}

fn actions(env: &TestEnv, name: &str) -> usize {
    env.journal_entries().iter().filter(|e| e["action"] == name).count()
}

#[test]
fn two_sessions_share_one_sandbox_and_the_domain_ends_with_the_last() {
    let env = TestEnv::new();
    let mut a = Session::start(
        &env,
        &["run", "test", "--", "sh", "-c", "echo marker-aaa > /tmp/from-a; echo a-ready; read x; cat /tmp/from-b; echo a-done"],
    );
    assert_eq!(a.next_line(), "a-ready");
    // B sees A's file and A's process (its own command line spells the
    // marker as a pattern that does not match itself; A's subreaper,
    // `lazaret-session-init -- sh -c ...`, is left out).
    let b = env.run([
        "run",
        "test",
        "--",
        "sh",
        "-c",
        "cat /tmp/from-a; echo from-b > /tmp/from-b; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -v '^/usr/local/bin/lazaret-session-init ' | grep -c '[m]arker-aaa > /tmp'",
    ]);
    assert_eq!(b.status.code(), Some(0), "stderr: {}", text(&b.stderr));
    assert_eq!(text(&b.stdout), "marker-aaa\n1\n", "session B's output (its own terminal only)");
    // One coordinator, one Domain, and after B left, A still works.
    assert_eq!(env.coordinator_pids().len(), 1);
    let domains = ls_json(&env);
    assert_eq!(domains.len(), 1, "{domains:?}");
    let d = &domains[0];
    assert_eq!(d["profile"], "test");
    assert_eq!(d["state"], "Ready");
    assert_eq!(d["workspace"], env.workspace.display().to_string());
    assert_eq!(d["sessions"].as_array().map(Vec::len), Some(1), "{d}");
    assert!(d["sandbox"].as_str().is_some_and(|s| s.starts_with("lzr-")), "{d}");
    assert!(d["sidecar"].as_str().is_some_and(|s| !s.is_empty()), "{d}");
    // The coordinator's view of namespaces, routes and mounts.
    let dbg = env.run(["debug", "test"]);
    let shown = text(&dbg.stdout);
    assert!(dbg.status.success(), "debug: {}", text(&dbg.stderr));
    for needle in [
        "sandbox process: PID",
        "sandbox netns: net:[",
        "sidecar netns: net:[",
        "IPv4 routes (all tables):",
        "table main",
        "IPv4 rules:",
        "mounts made by the coordinator",
        "rootfs",
    ] {
        assert!(shown.contains(needle), "debug output lacks {needle:?}: {shown}");
    }
    a.send(b"go\n");
    let (status, rest, err) = a.finish();
    assert_eq!(status, Some(0), "stderr: {err}");
    assert_eq!(rest, vec!["from-b".to_string(), "a-done".to_string()], "session A's output");
    env.assert_nothing_left();
    env.assert_journal_conforms();
    assert_eq!(actions(&env, "AcquireDomainLock"), 1, "one Domain run");
    assert_eq!(actions(&env, "RegisterSession"), 2);
    // The same through the CLI, by profile.
    let check = env.run(["journal", "test", "--check"]);
    assert!(check.status.success(), "journal --check: {}", text(&check.stderr));
    assert!(text(&check.stdout).contains("conforms to the protocol model; run complete"), "{}", text(&check.stdout));
    let printed = env.run(["journal", "test"]);
    assert!(printed.status.success(), "journal: {}", text(&printed.stderr));
    let first: serde_json::Value = serde_json::from_str(text(&printed.stdout).lines().next().unwrap_or_default()).expect("a JSON line");
    assert_eq!(first["action"], "AcquireDomainLock");
    assert!(first["timestamp_ms"].as_u64().is_some_and(|t| t > 0));
    assert_eq!(actions(&env, "ReleaseDomainLock"), 1);
}

#[test]
fn a_killed_client_takes_only_its_own_agent_along() {
    let env = TestEnv::new();
    let mut a = Session::start(&env, &["run", "test", "--", "sh", "-c", "echo up; read x; echo a-alive; ls /proc | grep -c '^[0-9]'"]);
    assert_eq!(a.next_line(), "up");
    let mut c = Session::start(&env, &["run", "test", "--", "sh", "-c", "echo c-up; sleep 1000"]);
    assert_eq!(c.next_line(), "c-up");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.child.id() as i32), nix::sys::signal::Signal::SIGKILL).expect("kill -9 the client");
    let _ = wait_with_limit(&mut c.child);
    // The coordinator ends the dead client's agent and leaves the Domain up.
    let deadline = Instant::now() + COMMAND_LIMIT;
    loop {
        let d = ls_json(&env);
        if d.first().and_then(|d| d["sessions"].as_array().map(Vec::len)) == Some(1) {
            break;
        }
        assert!(Instant::now() < deadline, "the killed client's session never ended: {d:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    a.send(b"x\n");
    let (status, rest, err) = a.finish();
    assert_eq!(status, Some(0), "stderr: {err}");
    assert_eq!(rest.first().map(String::as_str), Some("a-alive"));
    // Left inside: the container's init, A's subreaper, A's shell and its
    // pipeline (no sleep 1000).
    let procs: usize = rest.get(1).and_then(|n| n.trim().parse().ok()).unwrap_or(99);
    assert!(procs <= 6, "processes inside: {procs}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Issue 17: a process the agent double-forked (here `(sleep 1000 &)`,
/// re-parented to the session's subreaper, `lazaret-session-init`) ends
/// with its session.
#[test]
fn a_killed_clients_double_forked_processes_go_too() {
    let env = TestEnv::new();
    let mut a = Session::start(
        &env,
        &[
            "run",
            "test",
            "--",
            "sh",
            "-c",
            "echo up; read x; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -c '^[s]leep 1000'",
        ],
    );
    assert_eq!(a.next_line(), "up");
    let mut c = Session::start(&env, &["run", "test", "--", "sh", "-c", "(sleep 1000 &); echo c-up; sleep 1000"]);
    assert_eq!(c.next_line(), "c-up");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.child.id() as i32), nix::sys::signal::Signal::SIGKILL).expect("kill -9 the client");
    let _ = wait_with_limit(&mut c.child);
    let deadline = Instant::now() + COMMAND_LIMIT;
    while ls_json(&env).first().and_then(|d| d["sessions"].as_array().map(Vec::len)) != Some(1) {
        assert!(Instant::now() < deadline, "the killed client's session never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    a.send(b"x\n");
    let (status, rest, err) = a.finish();
    assert_eq!(rest, vec!["0".to_string()], "processes of the killed session left inside; stderr: {err}");
    assert_eq!(status, Some(1), "grep -c found none (exit 1)");
    env.assert_nothing_left();
}

/// How many processes inside run a command line starting with one of
/// `commands`, as a session's `sh -c` of this text prints it (its own
/// command line spells each as a pattern that does not match itself).
fn count_inside(commands: &[&str]) -> String {
    let pattern: Vec<String> = commands.iter().map(|c| format!("[{}]{}", &c[..1], &c[1..])).collect();
    format!("for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -cE '^({})'", pattern.join("|"))
}

/// Like [`count_inside`] for processes that must be gone: a session's end
/// kills its tree inside asynchronously (after the coordinator has already
/// dropped the session), so the count is repeated for up to five seconds
/// until it is 0, then printed.
fn count_gone_inside(commands: &[&str]) -> String {
    let count = count_inside(commands);
    format!("n=$({count}); i=0; while [ \"$n\" != 0 ] && [ $i -lt 50 ]; do sleep 0.1; n=$({count}); i=$((i+1)); done; echo $n")
}

/// Waits until the Domain has `n` sessions.
fn wait_sessions(env: &TestEnv, n: usize) {
    let deadline = Instant::now() + COMMAND_LIMIT;
    while ls_json(env).first().and_then(|d| d["sessions"].as_array().map(Vec::len)) != Some(n) {
        assert!(Instant::now() < deadline, "the Domain never had {n} sessions: {:?}", ls_json(env));
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An agent that exits normally takes what it daemonised along (a child in
/// the background and a double-forked one in a session of its own), keeps
/// its exit status, and another session of the Domain goes on untouched.
#[test]
fn an_agent_that_exits_takes_its_daemonised_children_along() {
    let env = TestEnv::new();
    let count = count_gone_inside(&["sleep 1001", "sleep 1002"]);
    let mut a = Session::start(
        &env,
        &["run", "test", "--", "sh", "-c", &format!("echo up; sleep 1009 & read x; {count}; read x; echo a-alive; kill $!")],
    );
    assert_eq!(a.next_line(), "up");
    let c = env.run(["run", "test", "--", "sh", "-c", "(setsid sleep 1001 &); sleep 1002 & echo c-done; exit 7"]);
    assert_eq!(c.status.code(), Some(7), "stderr: {}", text(&c.stderr));
    assert_eq!(text(&c.stdout), "c-done\n");
    wait_sessions(&env, 1);
    a.send(b"x\n");
    assert_eq!(a.next_line(), "0", "the finished session's processes are still inside");
    a.send(b"x\n");
    let (status, rest, err) = a.finish();
    assert_eq!(rest, vec!["a-alive".to_string()], "stderr: {err}");
    assert_eq!(status, Some(0), "stderr: {err}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// A client killed (SIGKILL) while its agent's double-forked child holds
/// the session's PTY on all of its stdio: that child goes too, and another
/// session of the Domain keeps running, its own background job included.
#[test]
fn a_killed_terminal_clients_double_forked_pty_holder_goes_too() {
    let env = TestEnv::new();
    let count = count_gone_inside(&["sleep 1003", "sleep 1004"]);
    let mut a = Session::start(
        &env,
        &[
            "run",
            "test",
            "--",
            "sh",
            "-c",
            &format!("echo up; sleep 1008 & read x; {count}; echo a-alive; {}; kill $!", count_inside(&["sleep 1008"])),
        ],
    );
    assert_eq!(a.next_line(), "up");
    let mut pty = lazaret_tests::pty::TestTerminal::new(24, 80);
    let mut c = pty.spawn(&env, &["run", "test", "--", "sh", "-c", "(setsid sh -c 'exec sleep 1003' &); echo c-up; sleep 1004"]);
    pty.expect("c-up");
    wait_sessions(&env, 2);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGKILL).expect("kill -9 the client");
    let _ = wait_with_limit(&mut c);
    wait_sessions(&env, 1);
    a.send(b"x\n");
    let (status, rest, err) = a.finish();
    assert_eq!(rest, vec!["0".to_string(), "a-alive".to_string(), "1".to_string()], "stderr: {err}");
    assert_eq!(status, Some(0), "stderr: {err}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// A session whose `runsc exec` is killed on the host (its process inside
/// would live on): the coordinator ends the session inside, its
/// double-forked child too, and the client gets 137; another session goes
/// on.
#[test]
fn a_killed_runsc_exec_still_ends_its_session_inside() {
    let env = TestEnv::new();
    let count = count_gone_inside(&["sleep 1005", "sleep 1006"]);
    let mut a = Session::start(&env, &["run", "test", "--", "sh", "-c", &format!("echo up; read x; {count}; echo a-alive")]);
    assert_eq!(a.next_line(), "up");
    let before = runsc_execs(&env);
    let mut c = Session::start(&env, &["run", "test", "--", "sh", "-c", "(setsid sleep 1005 &); echo c-up; sleep 1006"]);
    assert_eq!(c.next_line(), "c-up");
    let theirs: Vec<i32> = runsc_execs(&env).into_iter().filter(|p| !before.contains(p)).collect();
    assert_eq!(theirs.len(), 1, "C's runsc exec among {theirs:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(theirs[0]), nix::sys::signal::Signal::SIGKILL).expect("kill -9 C's runsc exec");
    let (status, _, err) = c.finish();
    assert_eq!(status, Some(137), "stderr: {err}");
    wait_sessions(&env, 1);
    a.send(b"x\n");
    let (status, rest, err) = a.finish();
    assert_eq!(rest, vec!["0".to_string(), "a-alive".to_string()], "stderr: {err}");
    assert_eq!(status, Some(0), "stderr: {err}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn sessions_on_terminals_have_their_own_pty() {
    let env = TestEnv::new();
    let mut a = Session::start(&env, &["run", "test", "--", "sh", "-c", "echo up; read x"]);
    assert_eq!(a.next_line(), "up");
    // `script` gives B a terminal: its agent gets a PTY of its own, while
    // A keeps its pipes.
    let out = wait_output(
        env.in_netns()
            .arg("script")
            .args(["-qec"])
            .arg(format!(
                "{} --config {} run test -- sh -c 'test -t 0 && test -t 1 && echo is-a-tty'",
                lazaret_bin().display(),
                env.config.display()
            ))
            .arg("/dev/null")
            .current_dir(&env.workspace)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("script (util-linux)"),
    );
    let shown = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stdout: {shown}, stderr: {}", text(&out.stderr));
    assert!(shown.contains("is-a-tty"), "B has no terminal: {shown:?}");
    a.send(b"x\n");
    let (status, _, err) = a.finish();
    assert_eq!(status, Some(0), "stderr: {err}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn a_changed_config_is_refused_and_another_profile_gets_its_own_domain() {
    let other = "\n[profiles.other]\nimage = \"test\"\ncommand = [\"/bin/sh\"]\nuser = \"root\"\n";
    let env = TestEnv::with_profile(&format!("user = \"root\"\n{other}"));
    let mut a = Session::start(&env, &["run", "test", "--", "sh", "-c", "echo up; read x"]);
    assert_eq!(a.next_line(), "up");
    env.write_config(&format!("user = \"root\"\nhostname = \"edited\"\n{other}"));
    let refused = env.run(["run", "test", "--", "true"]);
    let err = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(125), "stderr: {err}");
    assert!(err.contains("profiles.test.hostname"), "the differing setting is not named: {err}");
    assert!(err.contains("lazaret stop test"), "no way forward offered: {err}");
    // The other profile on the same workspace is another Domain.
    let o = env.run(["run", "other", "--", "sh", "-c", "echo other-ok"]);
    assert_eq!(o.status.code(), Some(0), "stderr: {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "other-ok\n");
    assert_eq!(env.domain_ids().len(), 2);
    a.send(b"x\n");
    let (status, _, err) = a.finish();
    assert_eq!(status, Some(0), "stderr: {err}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
    assert_eq!(actions(&env, "RejectSession"), 1);
}

#[test]
fn sixteen_concurrent_runs_make_one_coordinator_and_sixteen_sessions() {
    let env = TestEnv::new();
    let mut sessions: Vec<Session> =
        (0..16).map(|_| Session::start(&env, &["run", "test", "--", "sh", "-c", "echo up-$$; read x; echo bye"])).collect();
    for s in sessions.iter_mut() {
        let line = s.next_line();
        assert!(line.starts_with("up-"), "a session printed {line:?}");
    }
    assert_eq!(env.coordinator_pids().len(), 1, "coordinators: {:?}", env.coordinator_pids());
    let domains = ls_json(&env);
    assert_eq!(domains.len(), 1);
    assert_eq!(domains[0]["sessions"].as_array().map(Vec::len), Some(16));
    for s in sessions.iter_mut() {
        s.send(b"x\n");
    }
    for s in sessions {
        let (status, rest, err) = s.finish();
        assert_eq!(status, Some(0), "stderr: {err}");
        assert_eq!(rest, vec!["bye".to_string()]);
    }
    env.assert_nothing_left();
    env.assert_journal_conforms();
    assert_eq!(actions(&env, "AcquireDomainLock"), 1, "exactly one coordinator ran");
    assert_eq!(actions(&env, "RegisterSession"), 16);
}

#[test]
fn a_crash_at_every_stage_is_recovered_by_the_next_run() {
    let lab = NetLab::new();
    let mut env = TestEnv::with_profile("user = \"root\"\ndns = [\"192.0.2.53\"]\n");
    env.netns = Some(lab.host.clone());
    let baseline = HostCounts::take(&env, Some(&lab.host));
    // Every start-up stage and teardown, from the coordinator's own list, so
    // a new stage cannot be forgotten here.
    let points = lazaret_coordinator::daemon::crash_points();
    assert!(points.len() >= 11, "{points:?}");
    for stage in points {
        let mut crashing = env.lazaret(["run", "test", "--", "true"]);
        crashing.env("LAZARET_TEST_HOOKS", "1").env("LAZARET_TEST_CRASH_AT", stage);
        let out = wait_output(crashing.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn"));
        // At "teardown" the agent has already exited and its status (0)
        // reached the client: teardown runs behind the Exit.
        let expected = if stage == "teardown" { 0 } else { 125 };
        assert_eq!(out.status.code(), Some(expected), "stage {stage}: stderr: {}", text(&out.stderr));
        assert_eq!(env.wait_no_processes(), Vec::<String>::new(), "stage {stage}: processes outlived the crash");
        let out = env.run(["run", "test", "--", "sh", "-c", "echo recovered"]);
        assert_eq!(out.status.code(), Some(0), "stage {stage}: stderr: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "recovered\n", "stage {stage}");
        assert_eq!(env.wait_no_processes(), Vec::<String>::new());
        assert_eq!(HostCounts::take(&env, Some(&lab.host)), baseline, "stage {stage}: counts differ after recovery");
        env.assert_nothing_left();
        env.assert_journal_conforms();
    }
    let journals = env.domain_dir().map(|_| actions(&env, "AcquireDomainLock")).unwrap_or(0);
    assert!(journals >= 1);
}

#[test]
fn stop_tells_sessions_then_terms_then_kills() {
    let env = TestEnv::new();
    let mut polite =
        Session::start(&env, &["run", "test", "--", "sh", "-c", "trap 'echo got-term; exit 3' TERM; echo up; while :; do sleep 0.2; done"]);
    assert_eq!(polite.next_line(), "up");
    let mut stubborn = Session::start(&env, &["run", "test", "--", "sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.2; done"]);
    assert_eq!(stubborn.next_line(), "up");
    let out = env.run(["stop", "test", "--grace", "1"]);
    assert!(out.status.success(), "stop: {}", text(&out.stderr));
    let (status, rest, err) = polite.finish();
    assert_eq!(status, Some(3), "stderr: {err}");
    assert_eq!(rest, vec!["got-term".to_string()]);
    assert!(err.contains("stopping"), "the session was not told: {err}");
    let (status, _, err) = stubborn.finish();
    assert_eq!(status, Some(137), "stderr: {err}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
    // --all stops every running Domain of the developer (here: of this env).
    let mut again = Session::start(&env, &["run", "test", "--", "sh", "-c", "echo up; while :; do sleep 0.2; done"]);
    assert_eq!(again.next_line(), "up");
    let out = env.run(["stop", "--all", "--grace", "1"]);
    assert!(out.status.success(), "stop --all: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "stopped 1 Domain(s)\n");
    let (status, _, err) = again.finish();
    assert_eq!(status, Some(143), "stderr: {err}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
    let none = env.run(["stop", "test"]);
    assert_eq!(none.status.code(), Some(125), "stopping a stopped Domain: {}", text(&none.stderr));
    assert!(text(&none.stderr).contains("not running"), "{}", text(&none.stderr));
}

/// Sends raw bytes to the Domain's socket and returns what came back
/// before the coordinator closed the connection.
fn poke(socket: &std::path::Path, data: &[u8]) -> Vec<u8> {
    let mut s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    let _ = s.write_all(data);
    let mut back = Vec::new();
    let _ = s.read_to_end(&mut back);
    back
}

fn frame(json: &str) -> Vec<u8> {
    let mut f = (json.len() as u32).to_be_bytes().to_vec();
    f.extend_from_slice(json.as_bytes());
    f
}

#[test]
fn hostile_clients_are_disconnected_and_sessions_carry_on() {
    let env = TestEnv::new();
    let mut a = Session::start(&env, &["run", "test", "--", "sh", "-c", "echo up; read x; echo still-here"]);
    assert_eq!(a.next_line(), "up");
    let socket = env.domain_dir().expect("domain dir").join("coordinator.sock");
    // A well-formed request from root is answered ...
    // (version 2: WIRE_VERSION, since the Hello names its terminal streams)
    let status = poke(&socket, &frame("{\"type\":\"Status\",\"version\":2}"));
    assert!(!status.is_empty(), "root's Status request got no answer");
    // ... garbage, an oversized frame, unknown and malformed messages, a
    // wrong version and a cut-off frame are not.
    for (what, data) in [
        ("garbage", b"GET / HTTP/1.1\r\n\r\n".to_vec()),
        ("oversized", {
            let mut v = (u32::MAX).to_be_bytes().to_vec();
            v.extend_from_slice(&[b'x'; 4096]);
            v
        }),
        ("unknown message", frame("{\"type\":\"Launch\",\"command\":\"rm -rf /\"}")),
        ("malformed json", frame("{\"type\":")),
        ("cut-off frame", {
            let mut v = frame("{\"type\":\"Status\",\"version\":2}");
            v.truncate(9);
            v
        }),
    ] {
        let back = poke(&socket, &data);
        assert!(back.is_empty(), "{what}: the coordinator answered {back:?}");
    }
    let wrong = poke(&socket, &frame("{\"type\":\"Status\",\"version\":99}"));
    assert!(text(&wrong).contains("protocol version"), "{}", text(&wrong));
    // Another uid (allowed through the file permissions by a capability,
    // so only SO_PEERCRED stands in its way) gets nothing.
    let (uid, gid) = test_user();
    let script = "import socket,struct,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\nb=b'{\"type\":\"Status\",\"version\":2}'\ntry:\n  s.sendall(struct.pack('>I',len(b))+b)\n  print(len(s.recv(65536)))\nexcept (BrokenPipeError, ConnectionResetError):\n  print(0)\n";
    let other = std::process::Command::new("setpriv")
        .args([
            format!("--reuid={uid}"),
            format!("--regid={gid}"),
            "--clear-groups".into(),
            "--inh-caps=+dac_override".into(),
            "--ambient-caps=+dac_override".into(),
        ])
        .args(["python3", "-c", script])
        .arg(&socket)
        .output()
        .expect("setpriv + python3");
    assert!(other.status.success(), "the other uid could not even connect: {}", text(&other.stderr));
    assert_eq!(text(&other.stdout).trim(), "0", "another uid got an answer");
    // Too many connections at once in a burst do not hurt either.
    let burst: Vec<UnixStream> = (0..50).filter_map(|_| UnixStream::connect(&socket).ok()).collect();
    drop(burst);
    a.send(b"x\n");
    let (status, rest, err) = a.finish();
    assert_eq!(status, Some(0), "stderr: {err}");
    assert_eq!(rest, vec!["still-here".to_string()]);
    let log = std::fs::read_to_string(env.domain_dir().expect("domain dir").join("coordinator.log")).unwrap_or_default();
    assert!(log.contains(&format!("uid {uid}")), "the refused uid is not logged: {log}");
    assert!(log.contains("disconnected a client"), "hostile clients are not logged: {log}");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Benchmark (not a test of behaviour; run with `--ignored --nocapture`):
/// join latency on a running Domain and the coordinator's idle RSS.
#[test]
#[ignore]
fn bench_join_latency_and_idle_rss() {
    let env = TestEnv::new();
    let mut a = Session::start(&env, &["run", "test", "--", "sh", "-c", "echo up; read x"]);
    assert_eq!(a.next_line(), "up");
    std::thread::sleep(Duration::from_millis(500));
    let mut rss_kib = 0u64;
    let mut rss_main = 0u64;
    for p in processes_mentioning(&env.runtime_dir.display().to_string()).iter().filter(|p| p.contains("__coordinator")) {
        let pid = p.split(':').next().unwrap_or_default();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let kib: u64 = status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        rss_kib += kib;
        rss_main = rss_main.max(kib);
    }
    let mut joins = Vec::new();
    let mut firsts = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let out = env.run(["run", "test", "--", "true"]);
        joins.push(t.elapsed());
        assert_eq!(out.status.code(), Some(0));
        let t = Instant::now();
        let mut s = Session::start(&env, &["run", "test", "--", "echo", "x"]);
        assert_eq!(s.next_line(), "x");
        firsts.push(t.elapsed());
        let _ = s.finish();
    }
    joins.sort();
    firsts.sort();
    println!(
        "join latency, `lazaret run -- true` on a running Domain: median {:?} (min {:?}, max {:?})",
        joins[joins.len() / 2],
        joins[0],
        joins[joins.len() - 1]
    );
    println!("join latency, command to first output of `echo x`: median {:?}", firsts[firsts.len() / 2]);
    println!("coordinator idle RSS: largest process {} KiB, all three processes {} KiB", rss_main, rss_kib);
    a.send(b"x\n");
    let _ = a.finish();
    env.assert_nothing_left();
}
