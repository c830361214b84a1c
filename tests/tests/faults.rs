//! Fault injection (issue 17): what the host, another root process or the
//! developer's machine can break underneath a running Domain. For each
//! fault the coordinator notices, every session hears it in one line
//! (`lazaret: ...` on its stderr), and the Domain either recovers or stops
//! cleanly: nothing is left on the host (processes, mounts, network
//! namespaces, veths, nftables tables, cgroups: [`HostCounts`] back to its
//! baseline) and the journal still replays against the protocol model.
//!
//! Every test runs its Domain in a [`NetLab`]'s host namespace, so that the
//! test can remove the Domain's veths and tables there with `ip` and `nft`
//! (test tools, not the product) and count what is left.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lazaret_tests::escalation::*;
use lazaret_tests::netlab::NetLab;
use lazaret_tests::pty::TestTerminal;
use lazaret_tests::*;

type Session = PipedSession;

/// Starts `script` and waits for its first line, `up`.
fn up(env: &TestEnv, script: &str) -> Session {
    let mut s = Session::script(env, &format!("echo up; {script}"));
    assert_eq!(s.next_line(), "up", "the session did not come up");
    s
}

/// The lines Lazaret itself printed on a session's stderr.
fn lazaret_lines(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.starts_with("lazaret: ")).collect()
}

/// Asserts that `stderr` holds exactly one line from Lazaret and that it
/// contains every one of `needles`; returns it.
fn one_line<'a>(stderr: &'a str, needles: &[&str]) -> &'a str {
    let lines = lazaret_lines(stderr);
    assert_eq!(lines.len(), 1, "expected one line from lazaret, got:\n{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "{:?} does not say {n:?}", lines[0]);
    }
    eprintln!("the session saw: {}", lines[0]);
    lines[0]
}

fn coordinator_log(env: &TestEnv) -> String {
    env.domain_ids()
        .iter()
        .map(|id| fs::read_to_string(env.runtime_dir.join(id).join("coordinator.log")).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// A [`TestEnv`] in `lab`'s host namespace, with `profile` keys.
fn lab_env(lab: &NetLab, profile: &str) -> TestEnv {
    let mut env = TestEnv::with_profile(&format!("user = \"root\"\n{profile}"));
    env.netns = Some(lab.host.clone());
    env
}

/// Runs `cmd` in `lab`'s host namespace; fails naming the tool when it is missing.
fn in_lab(lab: &NetLab, cmd: &[&str]) -> String {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", lab.host.display()))
        .arg("--")
        .args(cmd)
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?} (needs util-linux nsenter and {}): {e}", cmd[0]));
    assert!(out.status.success(), "{cmd:?} failed: {}", text(&out.stderr));
    text(&out.stdout)
}

/// Host PIDs of this env's processes whose command line starts with `argv0`
/// (runsc names its sandbox `runsc-sandbox` and its gofer `runsc-gofer`).
fn runsc_processes(env: &TestEnv, argv0: &str) -> Vec<i32> {
    processes_mentioning(&env.runtime_dir.to_string_lossy())
        .into_iter()
        .filter_map(|p| p.split_once(": ").map(|(pid, cmd)| (pid.to_string(), cmd.to_string())))
        .filter(|(_, cmd)| cmd.split(' ').next() == Some(argv0))
        .filter_map(|(pid, _)| pid.parse().ok())
        .collect()
}

fn kill9(pid: i32) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .unwrap_or_else(|e| panic!("kill -9 {pid}: {e}"));
}

/// The Domain is gone without a trace, its journal conforms, and a new run
/// of the same profile works (the Domain starts afresh).
fn clean_and_restartable(env: &TestEnv, lab: &NetLab, baseline: &HostCounts) {
    env.assert_nothing_left();
    assert_eq!(
        &HostCounts::take(env, Some(&lab.host)),
        baseline,
        "host counts differ after the fault; coordinator log:\n{}",
        coordinator_log(env)
    );
    let out = env.run(["run", "test", "--", "echo", "again"]);
    assert_eq!(out.status.code(), Some(0), "the run after the fault: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "again\n");
    env.assert_nothing_left();
    assert_eq!(&HostCounts::take(env, Some(&lab.host)), baseline, "host counts differ after the run that followed the fault");
    env.assert_journal_conforms();
}

// ---------------------------------------------------------------------------
// (1) runsc's sandbox or gofer killed under running sessions.

fn runsc_process_killed(argv0: &str) {
    let lab = NetLab::new();
    let env = lab_env(&lab, "");
    let baseline = HostCounts::take(&env, Some(&lab.host));
    let a = up(&env, "sleep 1000");
    let b = up(&env, "sleep 1000");
    let pids = runsc_processes(&env, argv0);
    assert_eq!(pids.len(), 1, "{argv0} processes: {pids:?}\n{:?}", processes_mentioning(&env.runtime_dir.to_string_lossy()));
    kill9(pids[0]);
    for s in [a, b] {
        let (status, _, err) = s.finish();
        assert!(status.is_some_and(|s| s != 0), "a session of a dead sandbox exited {status:?}; stderr: {err}");
        eprintln!("a session of the dead sandbox exited {status:?}");
        one_line(&err, &["the sandbox", "died", "stopping the Domain"]);
    }
    clean_and_restartable(&env, &lab, &baseline);
}

#[test]
fn a_killed_sandbox_process_is_reported_and_the_domain_stops_cleanly() {
    runsc_process_killed("runsc-sandbox");
}

#[test]
fn a_killed_gofer_is_reported_and_the_domain_stops_cleanly() {
    runsc_process_killed("runsc-gofer");
}

// ---------------------------------------------------------------------------
// (2) The Domain's network removed underneath it.

/// `lazaret ls --json`'s Sidecar ID of the env's Domain.
fn sidecar_id(env: &TestEnv) -> String {
    let ls = ls_json(env);
    ls[0]["sidecar"].as_str().unwrap_or_else(|| panic!("no sidecar in {ls}")).to_string()
}

fn network_removed(remove: impl FnOnce(&NetLab, &str), what: &str) {
    let lab = NetLab::new();
    let env = lab_env(&lab, "");
    let baseline = HostCounts::take(&env, Some(&lab.host));
    let a = up(&env, "sleep 1000");
    let b = up(&env, "sleep 1000");
    remove(&lab, &sidecar_id(&env));
    for s in [a, b] {
        let (status, _, err) = s.finish();
        assert_eq!(status, Some(143), "the agent gets SIGTERM; stderr: {err}");
        one_line(&err, &["the Domain's network was changed underneath it", what, "stopping the Domain"]);
    }
    clean_and_restartable(&env, &lab, &baseline);
}

#[test]
fn a_removed_sidecar_veth_is_reported_and_the_domain_stops_cleanly() {
    network_removed(
        |lab, id| {
            let link = format!("lzh{id}");
            assert!(in_lab(lab, &["ip", "-o", "link", "show", "type", "veth"]).contains(&link), "no {link} in the lab host");
            // Deleting the host's end deletes its peer, the sidecar's lzup0.
            in_lab(lab, &["ip", "link", "del", &link]);
        },
        "veth lzup0",
    );
}

#[test]
fn a_removed_nftables_table_is_reported_and_the_domain_stops_cleanly() {
    network_removed(
        |lab, id| {
            in_lab(lab, &["nft", "delete", "table", "inet", &format!("lazaret-{id}")]);
        },
        "nftables table inet lazaret-",
    );
}

// ---------------------------------------------------------------------------
// (3) The Domain Root's filesystem full.

/// A small ext4 image, loop-mounted, holding a Storage Root whose `images`
/// is the shared test store's (bind-mounted): Domain Roots live on the
/// image. Unmounted and detached on drop.
struct SmallStorage {
    dir: PathBuf,
    device: String,
}

impl SmallStorage {
    fn new(megabytes: u64) -> SmallStorage {
        for tool in ["mkfs.ext4", "losetup", "mount", "umount"] {
            assert!(
                Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success()),
                "{tool} missing: install e2fsprogs / util-linux"
            );
        }
        let dir = std::env::temp_dir().join(format!("lazaret-small-{}", std::process::id()));
        fs::create_dir_all(dir.join("mnt")).expect("mount point");
        let image = dir.join("fs.img");
        fs::File::create(&image).and_then(|f| f.set_len(megabytes << 20)).expect("image file");
        let run = |cmd: &mut Command| {
            let out = cmd.output().expect("running a setup tool");
            assert!(out.status.success(), "{cmd:?}: {}", text(&out.stderr));
            text(&out.stdout).trim().to_string()
        };
        // No blocks reserved for root: everything here writes as root.
        run(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image));
        let device = run(Command::new("losetup").args(["--find", "--show"]).arg(&image));
        let s = SmallStorage { dir, device };
        run(Command::new("mount").arg(&s.device).arg(s.mnt()));
        let root = s.root();
        fs::create_dir(&root).expect("storage root");
        fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o700)).expect("chmod");
        fs::create_dir(root.join("images")).expect("images");
        run(Command::new("mount").arg("--bind").arg(Path::new(TEST_STORAGE).join("images")).arg(root.join("images")));
        s
    }

    fn mnt(&self) -> PathBuf {
        self.dir.join("mnt")
    }

    /// The Storage Root on the image.
    fn root(&self) -> PathBuf {
        self.mnt().join("storage")
    }
}

impl Drop for SmallStorage {
    fn drop(&mut self) {
        for m in [self.root().join("images"), self.mnt()] {
            let ok = Command::new("umount").arg(&m).status().is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&m).status();
            }
        }
        let _ = Command::new("losetup").arg("-d").arg(&self.device).status();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Files named `name` below `dir` (not following symlinks).
fn find_files(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for e in fs::read_dir(dir).map(|rd| rd.flatten().collect::<Vec<_>>()).unwrap_or_default() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            found.extend(find_files(&e.path(), name));
        } else if e.file_name() == name {
            found.push(e.path());
        }
    }
    found
}

#[test]
fn a_full_domain_root_is_reported_and_the_domain_stops_cleanly() {
    let lab = NetLab::new();
    let storage = SmallStorage::new(48);
    let mut env = lab_env(&lab, "");
    env.storage = storage.root();
    env.write_config("user = \"root\"\npersistent_dirs = [\"/root\"]\n");
    let baseline = HostCounts::take(&env, Some(&lab.host));
    let holder = up(&env, "sleep 1000");
    // The agent fills the State Anchor's upper layer, on the Domain Root.
    let filler = up(&env, "dd if=/dev/zero of=/root/fill bs=1M 2>/dev/null; sleep 1000");
    let (status, rest, err) = holder.finish();
    assert_eq!(status, Some(143), "the agent gets SIGTERM; stderr: {err}\ncoordinator log:\n{}", coordinator_log(&env));
    assert!(rest.is_empty(), "{rest:?}");
    one_line(&err, &["the Domain Root's filesystem is full", "stopping the Domain"]);
    let (status, _, err) = filler.finish();
    assert_eq!(status, Some(143), "stderr: {err}");
    one_line(&err, &["the Domain Root's filesystem is full"]);
    env.assert_nothing_left();
    // The developer frees the space; the next run works.
    let domain_root = storage.root().join("domains").join(&env.domain_ids()[0]);
    let fills = find_files(&domain_root, "fill");
    assert_eq!(fills.len(), 1, "the agent's file in {}: {fills:?}", domain_root.display());
    let size = fs::metadata(&fills[0]).map(|m| m.len()).unwrap_or(0);
    assert!(size > 32 << 20, "the agent's file has {size} bytes: it did not fill the 48 MiB filesystem");
    fs::remove_file(&fills[0]).expect("removing the agent's file");
    clean_and_restartable(&env, &lab, &baseline);
    drop(env);
}

// ---------------------------------------------------------------------------
// (4) The coordinator's socket deleted while the Domain runs.

#[test]
fn a_deleted_socket_is_published_again_and_new_sessions_join() {
    let lab = NetLab::new();
    let env = lab_env(&lab, "");
    let baseline = HostCounts::take(&env, Some(&lab.host));
    let mut a = up(&env, "read x; echo bye");
    let socket = env.domain_dir().expect("a Domain").join("coordinator.sock");
    fs::remove_file(&socket).expect("removing coordinator.sock");
    wait_for("the socket published again", Duration::from_secs(10), || socket.exists().then_some(()));
    // A new session joins the running Domain (no second coordinator).
    let out = env.run(["run", "test", "--", "echo", "joined"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "joined\n");
    assert_eq!(env.coordinator_pids().len(), 1, "coordinators: {:?}", env.coordinator_pids());
    a.send(b"x\n");
    let (status, rest, err) = a.finish();
    assert_eq!(status, Some(0), "stderr: {err}");
    assert_eq!(rest, ["bye"]);
    one_line(&err, &["coordinator.sock was removed", "published it again"]);
    env.assert_nothing_left();
    assert_eq!(HostCounts::take(&env, Some(&lab.host)), baseline);
    env.assert_journal_conforms();
    let starts = env.journal_entries().iter().filter(|e| e["action"] == "AcquireDomainLock").count();
    assert_eq!(starts, 1, "the Domain was started again instead of joined");
}

// ---------------------------------------------------------------------------
// (5) A client killed mid-prompt (mid-execution: escalation.rs,
// `a_session_disconnecting_mid_execution_kills_the_whole_host_tree`).

#[test]
fn a_client_killed_mid_prompt_ends_its_request_and_the_domain_goes_on() {
    let host = HostDir::new();
    let marker = host.arg("never");
    let lab = NetLab::new();
    let mut env = developer_env("user = \"root\"\n");
    env.netns = Some(lab.host.clone());
    let baseline = HostCounts::take(&env, Some(&lab.host));
    let mut holder = up(&env, "read x; echo bye");
    let mut pty = TestTerminal::new(40, 200);
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "lazaret-escalate", "--justification", "j", "--", "touch", &marker]);
    pty.expect_text("[n] deny");
    let waiting = pending(&env);
    assert_eq!(waiting.len(), 1, "{waiting:?}");
    let session = waiting[0]["session"].as_str().expect("the request's session").to_string();
    child.kill().expect("killing the prompting client");
    let _ = child.wait();
    wait_for("the killed client's session to end", Duration::from_secs(30), || {
        (sessions(&env).len() == 1 && pending(&env).is_empty()).then_some(())
    });
    assert!(!host.file("never").exists(), "the request of a killed client ran");
    let log = coordinator_log(&env);
    // The coordinator saw the client go (end of stream), or the agent died
    // first of the PTY's hangup: either way the session was disconnected.
    let disconnected = journal_with(&env, "DisconnectSession").iter().filter(|e| e["session"] == session.as_str()).count();
    assert_eq!(disconnected, 1, "DisconnectSession of {session}; log: {log}");
    if let Some(l) = log.lines().find(|l| l.contains(&format!("session {session}: "))) {
        eprintln!("the coordinator logged: {l}");
    }
    let ids = requests_for(&env, &["touch", &marker]);
    assert_eq!(ids.len(), 1);
    let actions = request_actions(&env, &ids[0]);
    assert!(!actions.iter().any(|a| a == "DeveloperApprove" || a == "StartHostExecution"), "{actions:?}");
    // The Domain goes on: another request, and the holder.
    let out = env.run(["run", "test", "--", "echo", "still-up"]);
    assert_eq!(text(&out.stdout), "still-up\n", "{}", text(&out.stderr));
    holder.send(b"x\n");
    let (status, rest, err) = holder.finish();
    assert_eq!((status, rest), (Some(0), vec!["bye".to_string()]), "stderr: {err}");
    assert!(lazaret_lines(&err).is_empty(), "the holder was told something: {err}");
    env.assert_nothing_left();
    assert_eq!(HostCounts::take(&env, Some(&lab.host)), baseline);
    env.assert_journal_conforms();
}

// ---------------------------------------------------------------------------
// (6) The coordinator killed while a host command of an escalation runs.

#[test]
fn a_killed_coordinator_takes_its_host_commands_along_and_the_next_run_recovers() {
    let (a, b) = (unique_sleep(), unique_sleep());
    let script = format!("sleep {a} & setsid sleep {b} & wait");
    let lab = NetLab::new();
    let mut env = developer_env(&format!("user = \"root\"\n{}", rules_toml(&[Rule::new("tree", &["sh", "-c", &script])])));
    env.netns = Some(lab.host.clone());
    let baseline = HostCounts::take(&env, Some(&lab.host));
    let client = spawn_piped(&env, &["run", "test", "--", "lazaret-escalate", "--", "sh", "-c", &script]);
    let (sa, sb) = (format!("sleep {a}"), format!("sleep {b}"));
    wait_for("both host sleeps", Duration::from_secs(90), || {
        (!host_processes(&sa).is_empty() && !host_processes(&sb).is_empty()).then_some(())
    });
    let coordinators = env.coordinator_pids();
    assert_eq!(coordinators.len(), 1, "{coordinators:?}");
    let started = Instant::now();
    kill9(coordinators[0]);
    let out = wait_output(client);
    let stderr = text(&out.stderr);
    let line = one_line(&stderr, &["lost the connection to the Domain's coordinator", "coordinator.log"]);
    assert!(line.ends_with("coordinator.log"), "the cause is said once, in the parentheses: {line}");
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    wait_for("the host commands to go", Duration::from_secs(15), || {
        (host_processes(&sa).is_empty() && host_processes(&sb).is_empty()).then_some(())
    });
    eprintln!("client and host commands gone {:?} after the kill", started.elapsed());
    assert_eq!(env.wait_no_processes(), Vec::<String>::new());
    // The next run recovers what the dead coordinator left.
    let out = env.run(["run", "test", "--", "echo", "recovered"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "recovered\n");
    env.assert_nothing_left();
    assert_eq!(HostCounts::take(&env, Some(&lab.host)), baseline, "host counts differ after recovery");
    env.assert_journal_conforms();
}
