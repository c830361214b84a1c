//! Host execution of escalation commands (`lazaret_runtime::hostexec`), as
//! root: identity, exact output, streaming, exit and signal status, the
//! deadline, stop and kill of the whole tree (setsid'd daemons included),
//! the output cap, the environment, the working directory, the mount
//! namespace, errors before exec, and that no cgroup is left behind.
//!
//! The commands run as `nobody` (65534) with an extra group 4242, in a
//! temporary directory chowned to it, in cgroups below the cgroup v2 mount
//! (`hostexec::cgroup2_mount`) named after this test process.

use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lazaret_runtime::hostexec::{self, End, ExecStage, Finished, HostCommand, HostExecError, Limits, StopSignal, Stream};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

const UID: u32 = 65534;
const GID: u32 = 65534;
const EXTRA_GROUP: u32 = 4242;
const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (it creates cgroups and runs commands as another user): run it as root, with \
         `sudo scripts/test.sh` or `cargo test -p lazaret-runtime --test hostexec` in a root shell"
    );
}

/// A temporary directory owned by the command's user, and a parent cgroup
/// of this test's own (removed on drop).
struct Fixture {
    dir: tempfile::TempDir,
    cgroup_parent: PathBuf,
    cgroup: PathBuf,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

fn fixture() -> Fixture {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    chown(dir.path());
    let root = hostexec::cgroup2_mount().expect("this test needs cgroup v2 mounted");
    let n = NEXT.fetch_add(1, Ordering::SeqCst);
    let cgroup_parent = root.join(format!("lazaret-hostexec-test-{}-{n}", std::process::id()));
    let cgroup = cgroup_parent.join("escalation-1");
    Fixture { dir, cgroup_parent, cgroup }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.cgroup);
        let _ = std::fs::remove_dir(&self.cgroup_parent);
    }
}

fn chown(path: &Path) {
    std::os::unix::fs::chown(path, Some(UID), Some(GID)).expect("chown");
}

fn open_dir(path: &Path) -> OwnedFd {
    nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).expect("open dir")
}

impl Fixture {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, argv: &[&str]) -> HostCommand {
        HostCommand {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            cwd: open_dir(self.path()),
            uid: UID,
            gid: GID,
            groups: vec![GID, EXTRA_GROUP],
            env: vec![("PATH".into(), PATH.into()), ("LANG".into(), "C".into())],
            cgroup: self.cgroup.clone(),
            mount_ns: None,
        }
    }

    fn assert_no_cgroup(&self) {
        assert!(!self.cgroup.exists(), "the command's cgroup {} was left behind", self.cgroup.display());
    }
}

/// What a run produced.
struct Ran {
    finished: Finished,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    /// When the first chunk arrived, from just before spawn.
    first_chunk: Option<Duration>,
    elapsed: Duration,
}

fn limits(timeout: Duration, output_cap: u64) -> Limits {
    Limits { deadline: Instant::now() + timeout, output_cap }
}

fn run_with(cmd: HostCommand, limits: Limits, stop: &StopSignal) -> Ran {
    let start = Instant::now();
    let process = hostexec::spawn(cmd).expect("spawn");
    let (mut stdout, mut stderr, mut first_chunk) = (Vec::new(), Vec::new(), None);
    let finished = process
        .run(limits, stop, |stream, data| {
            first_chunk.get_or_insert_with(|| start.elapsed());
            match stream {
                Stream::Stdout => stdout.extend_from_slice(data),
                Stream::Stderr => stderr.extend_from_slice(data),
            }
            Ok(())
        })
        .expect("run");
    Ran { finished, stdout, stderr, first_chunk, elapsed: start.elapsed() }
}

fn run(cmd: HostCommand) -> Ran {
    run_with(cmd, limits(Duration::from_secs(60), 64 << 20), &StopSignal::new().expect("stop signal"))
}

fn exit_code(ran: &Ran) -> i32 {
    match ran.finished.end {
        End::Exited(code) => code,
        ref other => panic!("expected an exit, got {other:?}; stderr: {}", String::from_utf8_lossy(&ran.stderr)),
    }
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).unwrap_or("X");
            !matches!(state, "Z" | "X" | "x")
        }
    }
}

fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {name} in /proc/self/status:\n{status}"))
}

#[test]
fn runs_as_the_given_user_with_clean_signals_and_no_capabilities() {
    let f = fixture();
    // The coordinator blocks every signal it handles; the command must not
    // inherit that (nor std's ignored SIGPIPE).
    let mut blocked = nix::sys::signal::SigSet::empty();
    for s in [nix::sys::signal::Signal::SIGINT, nix::sys::signal::Signal::SIGTERM, nix::sys::signal::Signal::SIGCHLD] {
        blocked.add(s);
    }
    let ran = std::thread::spawn({
        let cmd = f.command(&["cat", "/proc/self/status"]);
        move || {
            nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, Some(&blocked), None).expect("block");
            run(cmd)
        }
    })
    .join()
    .expect("thread");
    assert_eq!(exit_code(&ran), 0);
    let status = String::from_utf8(ran.stdout).expect("utf-8");
    assert_eq!(status_field(&status, "Uid").split_whitespace().collect::<Vec<_>>(), ["65534"; 4]);
    assert_eq!(status_field(&status, "Gid").split_whitespace().collect::<Vec<_>>(), ["65534"; 4]);
    let mut groups: Vec<&str> = status_field(&status, "Groups").split_whitespace().collect();
    groups.sort();
    assert_eq!(groups, ["4242", "65534"]);
    for field in ["CapInh", "CapPrm", "CapEff", "CapAmb", "SigBlk", "SigIgn"] {
        assert_eq!(status_field(&status, field), "0000000000000000", "{field}");
    }
    f.assert_no_cgroup();

    let cgroup = String::from_utf8(run(f.command(&["cat", "/proc/self/cgroup"])).stdout).expect("utf-8");
    let unified = cgroup.lines().find_map(|l| l.strip_prefix("0::")).expect("a cgroup v2 line");
    let relative = f.cgroup.strip_prefix(hostexec::cgroup2_mount().expect("cgroup2")).expect("below the mount");
    assert_eq!(unified, format!("/{}", relative.display()), "the command is not in its own cgroup");

    let id = String::from_utf8(run(f.command(&["id"])).stdout).expect("utf-8");
    assert!(id.starts_with("uid=65534(") && id.contains(" gid=65534(") && id.contains("4242"), "id says {id}");
    f.assert_no_cgroup();
}

/// Bytes that are not text: every value, in a pseudo-random order.
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    (0..len)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 24) as u8
        })
        .collect()
}

#[test]
fn binary_multi_megabyte_output_comes_back_exactly_on_both_streams() {
    let f = fixture();
    let out = noise(8 << 20, 0x9e3779b97f4a7c15);
    let err = noise(3 << 20, 0x2545f4914f6cdd1d);
    std::fs::write(f.path().join("out.bin"), &out).expect("write");
    std::fs::write(f.path().join("err.bin"), &err).expect("write");
    // Both at once, so that neither pipe may block the other.
    let ran = run(f.command(&["sh", "-c", "cat out.bin & cat err.bin >&2; wait"]));
    assert_eq!(exit_code(&ran), 0);
    assert!(!ran.finished.truncated);
    assert_eq!(ran.stdout.len(), out.len());
    assert!(ran.stdout == out, "stdout differs");
    assert_eq!(ran.stderr.len(), err.len());
    assert!(ran.stderr == err, "stderr differs");
    f.assert_no_cgroup();
}

#[test]
fn output_arrives_while_the_command_still_runs() {
    let f = fixture();
    let ran = run(f.command(&["sh", "-c", "printf first; sleep 2; printf second"]));
    assert_eq!(exit_code(&ran), 0);
    assert_eq!(ran.stdout, b"firstsecond");
    let first = ran.first_chunk.expect("a chunk");
    assert!(first < Duration::from_secs(1), "the first chunk took {first:?}");
    assert!(ran.elapsed >= Duration::from_secs(2), "the run took only {:?}", ran.elapsed);
    f.assert_no_cgroup();
}

#[test]
fn exit_and_signal_statuses_come_back_shell_style() {
    let f = fixture();
    assert_eq!(exit_code(&run(f.command(&["sh", "-c", "echo oops >&2; exit 7"]))), 7);
    // SIGTERM and SIGINT take effect: neither blocked nor ignored.
    assert_eq!(exit_code(&run(f.command(&["sh", "-c", "kill -TERM $$; sleep 5"]))), 128 + libc::SIGTERM);
    assert_eq!(exit_code(&run(f.command(&["sh", "-c", "kill -INT $$; sleep 5"]))), 128 + libc::SIGINT);
    f.assert_no_cgroup();
}

#[test]
fn the_deadline_kills_the_command() {
    let f = fixture();
    let stop = StopSignal::new().expect("stop");
    let ran = run_with(f.command(&["sleep", "1000"]), limits(Duration::from_millis(300), 1024), &stop);
    assert!(matches!(ran.finished.end, End::TimedOut), "{:?}", ran.finished.end);
    assert!(ran.elapsed < Duration::from_secs(5), "took {:?}", ran.elapsed);
    f.assert_no_cgroup();
}

/// A command whose grandchild leaves the session (`setsid`) and prints its
/// PID; `then` is what the direct child does afterwards.
fn with_daemon(then: &str) -> String {
    format!("setsid sh -c 'echo $$; exec sleep 1000' & {then}")
}

/// Runs `cmd`, passing the daemon's PID (the first stdout line) to
/// `on_pid` from the sink; returns the run and the PID.
fn run_watching_pid(cmd: HostCommand, stop: &StopSignal, on_pid: impl Fn(i32)) -> (Finished, i32) {
    let process = hostexec::spawn(cmd).expect("spawn");
    let mut line = Vec::new();
    let mut pid = None;
    let finished = process
        .run(limits(Duration::from_secs(30), 1 << 20), stop, |stream, data| {
            if stream == Stream::Stdout && pid.is_none() {
                line.extend_from_slice(data);
                if let Some(end) = line.iter().position(|b| *b == b'\n') {
                    let p: i32 = std::str::from_utf8(&line[..end]).expect("utf-8").trim().parse().expect("a pid");
                    pid = Some(p);
                    on_pid(p);
                }
            }
            Ok(())
        })
        .expect("run");
    (finished, pid.expect("the daemon printed its pid"))
}

#[test]
fn stop_kills_the_whole_tree_including_a_setsid_daemon() {
    let f = fixture();
    let stop = StopSignal::new().expect("stop");
    let (tx, rx) = mpsc::channel::<i32>();
    // Another thread fires the stop, as a disconnect or Domain stop would.
    let firing = std::thread::spawn({
        let stop = stop.clone();
        move || {
            let pid = rx.recv().expect("pid");
            let was_alive = alive(pid);
            stop.fire();
            was_alive
        }
    });
    let start = Instant::now();
    let (finished, pid) = run_watching_pid(f.command(&["sh", "-c", &with_daemon("wait")]), &stop, |p| {
        let _ = tx.send(p);
    });
    assert!(firing.join().expect("thread"), "the daemon {pid} was not running before the stop");
    assert!(matches!(finished.end, End::Stopped), "{:?}", finished.end);
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(!alive(pid), "the setsid daemon {pid} survived the stop");
    f.assert_no_cgroup();
}

#[test]
fn completion_kills_what_the_command_left_running() {
    let f = fixture();
    let stop = StopSignal::new().expect("stop");
    let (finished, pid) = run_watching_pid(f.command(&["sh", "-c", &with_daemon("sleep 1; exit 3")]), &stop, |_| {});
    assert!(matches!(finished.end, End::Exited(3)), "{:?}", finished.end);
    assert!(!alive(pid), "the setsid daemon {pid} survived its parent's exit");
    f.assert_no_cgroup();
}

#[test]
fn the_killer_kills_from_another_thread() {
    let f = fixture();
    let process = hostexec::spawn(f.command(&["sh", "-c", &with_daemon("wait")])).expect("spawn");
    let killer = process.killer();
    let killing = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        killer.kill_tree().map(|()| killer)
    });
    let start = Instant::now();
    let finished = process.run(limits(Duration::from_secs(30), 1024), &StopSignal::new().expect("stop"), |_, _| Ok(())).expect("run");
    let killer = killing.join().expect("thread").expect("kill_tree");
    assert!(matches!(finished.end, End::Exited(137)), "{:?}", finished.end);
    assert!(start.elapsed() < Duration::from_secs(10));
    f.assert_no_cgroup();
    // Once the cgroup is gone there is nothing to kill, and no error.
    killer.kill_tree().expect("kill_tree after the end");
    f.assert_no_cgroup();
}

#[test]
fn a_failing_sink_ends_the_run_and_kills_the_command() {
    let f = fixture();
    let process = hostexec::spawn(f.command(&["sh", "-c", "echo hello; exec sleep 1000"])).expect("spawn");
    let start = Instant::now();
    let finished = process
        .run(limits(Duration::from_secs(30), 1024), &StopSignal::new().expect("stop"), |_, _| {
            Err(std::io::Error::new(std::io::ErrorKind::BrokenPipe, "client gone"))
        })
        .expect("run");
    assert!(matches!(finished.end, End::SinkFailed(ref e) if e.kind() == std::io::ErrorKind::BrokenPipe), "{:?}", finished.end);
    assert!(start.elapsed() < Duration::from_secs(10));
    f.assert_no_cgroup();
}

#[test]
fn dropping_a_process_kills_its_tree() {
    let f = fixture();
    let process = hostexec::spawn(f.command(&["sh", "-c", &with_daemon("wait")])).expect("spawn");
    let pid = process.pid() as i32;
    std::thread::sleep(Duration::from_millis(200));
    assert!(alive(pid));
    drop(process);
    assert!(!alive(pid));
    f.assert_no_cgroup();
}

#[test]
fn output_past_the_cap_is_cut_and_reported_while_the_command_completes() {
    let f = fixture();
    let stop = StopSignal::new().expect("stop");
    let ran = run_with(
        f.command(&["sh", "-c", "head -c 1000000 /dev/zero; echo done >&2; exit 4"]),
        limits(Duration::from_secs(30), 1000),
        &stop,
    );
    assert_eq!(exit_code(&ran), 4, "the command was not left to complete");
    assert!(ran.finished.truncated);
    assert_eq!(ran.stdout.len() + ran.stderr.len(), 1000);
    assert!(ran.stdout.iter().all(|b| *b == 0));

    let ran = run_with(f.command(&["head", "-c", "1000", "/dev/zero"]), limits(Duration::from_secs(30), 1000), &stop);
    assert_eq!(exit_code(&ran), 0);
    assert!(!ran.finished.truncated, "exactly the cap is not truncated");
    assert_eq!(ran.stdout.len(), 1000);
    f.assert_no_cgroup();
}

#[test]
fn the_environment_is_exactly_the_given_one() {
    let f = fixture();
    let mut cmd = f.command(&["env"]);
    cmd.env = vec![("PATH".into(), PATH.into()), ("FOO".into(), "bar baz".into()), ("EMPTY".into(), String::new())];
    let ran = run(cmd);
    assert_eq!(exit_code(&ran), 0);
    assert_eq!(String::from_utf8_lossy(&ran.stdout), format!("PATH={PATH}\nFOO=bar baz\nEMPTY=\n"));
    f.assert_no_cgroup();
}

#[test]
fn the_working_directory_is_the_descriptor_s() {
    let f = fixture();
    let sub = f.path().join("sub dir");
    std::fs::create_dir(&sub).expect("mkdir");
    chown(&sub);
    let mut cmd = f.command(&["pwd", "-P"]);
    cmd.cwd = open_dir(&sub);
    // Entering the caller's own mount namespace exercises setns too.
    cmd.mount_ns = Some(nix::fcntl::open("/proc/self/ns/mnt", OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).expect("ns"));
    let ran = run(cmd);
    assert_eq!(exit_code(&ran), 0, "{}", String::from_utf8_lossy(&ran.stderr));
    let expected = format!("{}\n", sub.canonicalize().expect("canonicalize").display());
    assert_eq!(String::from_utf8_lossy(&ran.stdout), expected);
    f.assert_no_cgroup();
}

#[test]
fn the_command_runs_in_the_given_mount_namespace() {
    let f = fixture();
    let mnt = f.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    // A namespace where a tmpfs with a marker covers `mnt`; only its fd
    // leaves the thread that made it.
    let ns: OwnedFd = std::thread::spawn({
        let mnt = mnt.clone();
        move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare");
            nix::mount::mount(None::<&str>, "/", None::<&str>, nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE, None::<&str>)
                .expect("make private");
            nix::mount::mount(Some("tmpfs"), &mnt, Some("tmpfs"), nix::mount::MsFlags::empty(), Some("mode=0755")).expect("tmpfs");
            std::fs::write(mnt.join("marker"), "in the other namespace\n").expect("marker");
            nix::fcntl::open("/proc/thread-self/ns/mnt", OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).expect("ns fd")
        }
    })
    .join()
    .expect("thread");
    let marker = mnt.join("marker");
    assert!(!marker.exists(), "the tmpfs leaked into the test's namespace");
    let marker = marker.to_str().expect("utf-8");
    let mut cmd = f.command(&["cat", marker]);
    cmd.mount_ns = Some(ns);
    let ran = run(cmd);
    assert_eq!(exit_code(&ran), 0, "{}", String::from_utf8_lossy(&ran.stderr));
    assert_eq!(ran.stdout, b"in the other namespace\n");
    // Without it, the file is not there.
    let ran = run(f.command(&["cat", marker]));
    assert_eq!(exit_code(&ran), 1);
    f.assert_no_cgroup();
}

#[test]
fn a_held_process_runs_nothing_until_started_and_dropping_it_runs_nothing_at_all() {
    let f = fixture();
    let marker = f.path().join("ran");
    let script = format!("echo ran > {}; echo out", marker.display());
    // Held: set up as the user, in its cgroup, but the program has not run.
    let held = hostexec::prepare(f.command(&["sh", "-c", &script])).expect("prepare");
    let pid = held.pid() as i32;
    std::thread::sleep(Duration::from_millis(300));
    assert!(alive(pid), "the held process waits");
    assert!(!marker.exists(), "nothing of the command ran before start");
    assert!(f.cgroup.exists(), "the held process is in its cgroup");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    assert_eq!(status_field(&status, "Uid").split_whitespace().collect::<Vec<_>>(), ["65534"; 4], "already the user");
    let process = held.start().expect("start");
    let mut stdout = Vec::new();
    let finished = process
        .run(limits(Duration::from_secs(60), 1 << 20), &StopSignal::new().expect("stop"), |_, d| {
            stdout.extend_from_slice(d);
            Ok(())
        })
        .expect("run");
    assert!(matches!(finished.end, End::Exited(0)), "{:?}", finished.end);
    assert_eq!(stdout, b"out\n");
    assert!(marker.exists(), "the command ran after start");
    f.assert_no_cgroup();

    // Dropped instead of started: killed, nothing ran, no cgroup left.
    std::fs::remove_file(&marker).expect("rm");
    let held = hostexec::prepare(f.command(&["sh", "-c", &script])).expect("prepare");
    let pid = held.pid() as i32;
    drop(held);
    assert!(!alive(pid), "the dropped held process is gone");
    std::thread::sleep(Duration::from_millis(100));
    assert!(!marker.exists(), "a dropped held process never runs the command");
    f.assert_no_cgroup();
}

#[test]
fn a_held_process_whose_setup_failed_reports_it_on_start() {
    let f = fixture();
    let private = f.path().join("root-only");
    std::fs::create_dir(&private).expect("mkdir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let mut cmd = f.command(&["true"]);
    cmd.cwd = open_dir(&private);
    let held = hostexec::prepare(cmd).expect("prepare");
    // Let the child fail (and close its end) before the go-ahead is sent.
    std::thread::sleep(Duration::from_millis(200));
    match held.start() {
        Ok(p) => panic!("start succeeded (pid {})", p.pid()),
        Err(e) => assert_exec_error(e, ExecStage::WorkingDirectory, libc::EACCES),
    }
    f.assert_no_cgroup();
}

fn spawn_error(cmd: HostCommand) -> HostExecError {
    match hostexec::spawn(cmd) {
        Ok(p) => panic!("spawn succeeded (pid {})", p.pid()),
        Err(e) => e,
    }
}

fn assert_exec_error(error: HostExecError, stage: ExecStage, errno: i32) {
    match error {
        HostExecError::Exec { stage: s, ref source, .. } if s == stage && source.raw_os_error() == Some(errno) => {
            eprintln!("as expected: {error}");
        }
        other => panic!("expected {stage:?} failing with errno {errno}, got {other:?}"),
    }
}

#[test]
fn failures_before_exec_are_errors_not_exit_statuses() {
    let f = fixture();
    let error = spawn_error(f.command(&["lazaret-no-such-command", "x"]));
    assert_eq!(error.to_string(), "lazaret-no-such-command: command not found");
    assert_exec_error(error, ExecStage::Exec, libc::ENOENT);
    f.assert_no_cgroup();
    assert_exec_error(spawn_error(f.command(&["/nonexistent/bin/x"])), ExecStage::Exec, libc::ENOENT);

    let data = f.path().join("data");
    std::fs::write(&data, "echo hi\n").expect("write");
    assert_exec_error(spawn_error(f.command(&["./data"])), ExecStage::Exec, libc::EACCES);
    // Executable but no #!: no shell runs it.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    assert_exec_error(spawn_error(f.command(&["./data"])), ExecStage::Exec, libc::ENOEXEC);
    f.assert_no_cgroup();

    // A directory the developer may not enter.
    let private = f.path().join("root-only");
    std::fs::create_dir(&private).expect("mkdir");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let mut cmd = f.command(&["true"]);
    cmd.cwd = open_dir(&private);
    assert_exec_error(spawn_error(cmd), ExecStage::WorkingDirectory, libc::EACCES);
    f.assert_no_cgroup();
}

#[test]
fn root_is_refused() {
    let f = fixture();
    let mut cmd = f.command(&["true"]);
    cmd.uid = 0;
    assert!(matches!(spawn_error(cmd), HostExecError::Root(_)));
    let mut cmd = f.command(&["true"]);
    cmd.gid = 0;
    assert!(matches!(spawn_error(cmd), HostExecError::Root(_)));
    assert!(!f.cgroup_parent.exists(), "a refused command created a cgroup");
}

#[test]
fn a_cgroup_outside_cgroup_v2_is_refused_with_a_clear_error() {
    let f = fixture();
    let mut cmd = f.command(&["true"]);
    cmd.cgroup = f.path().join("not-a-cgroup");
    let error = spawn_error(cmd);
    assert!(matches!(error, HostExecError::NoCgroupV2 { .. }), "{error:?}");
    assert!(error.to_string().contains("needs cgroup v2"), "{error}");
    assert!(!f.path().join("not-a-cgroup").exists());
}

#[test]
fn an_existing_cgroup_is_not_reused() {
    let f = fixture();
    std::fs::create_dir_all(&f.cgroup).expect("mkdir");
    let error = spawn_error(f.command(&["true"]));
    assert!(matches!(error, HostExecError::Cgroup { .. }), "{error:?}");
    assert!(f.cgroup.exists(), "someone else's cgroup was removed");
    std::fs::remove_dir(&f.cgroup).expect("rmdir");
}

#[test]
fn a_stop_that_fired_before_the_run_ends_it_at_once() {
    let f = fixture();
    let stop = StopSignal::new().expect("stop");
    stop.fire();
    assert!(stop.is_fired());
    let ran = run_with(f.command(&["sleep", "1000"]), limits(Duration::from_secs(30), 1024), &stop);
    assert!(matches!(ran.finished.end, End::Stopped), "{:?}", ran.finished.end);
    assert!(ran.elapsed < Duration::from_secs(5));
    f.assert_no_cgroup();
}

#[test]
fn the_command_gets_dev_null_two_pipes_and_no_other_descriptor() {
    let f = fixture();
    // Inheritable on purpose: the child must close it all the same.
    let leak = nix::fcntl::open("/etc/hostname", OFlag::O_RDONLY, Mode::empty()).expect("open");
    let ran = run(f.command(&["ls", "/proc/self/fd"]));
    drop(leak);
    assert_eq!(exit_code(&ran), 0);
    // 3 is ls's own handle on the directory it lists.
    assert_eq!(String::from_utf8_lossy(&ran.stdout), "0\n1\n2\n3\n");
    let ran = run(f.command(&["sh", "-c", "readlink /proc/self/fd/0; readlink /proc/self/fd/1; readlink /proc/self/fd/2"]));
    let links = String::from_utf8(ran.stdout).expect("utf-8");
    let links: Vec<&str> = links.lines().collect();
    assert_eq!(links[0], "/dev/null");
    assert!(links[1].starts_with("pipe:") && links[2].starts_with("pipe:") && links[1] != links[2], "{links:?}");
    f.assert_no_cgroup();
}

#[test]
fn works_from_a_cgroup_namespace_of_its_own_like_the_coordinator_s() {
    let f = fixture();
    let cmd = f.command(&["sh", "-c", &with_daemon("wait")]);
    let (end, pid) = std::thread::spawn(move || {
        // A thread's namespaces are its own: this leaves the test's alone.
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP).expect("unshare");
        let stop = StopSignal::new().expect("stop");
        let (finished, pid) = run_watching_pid(cmd, &stop, |_| stop.fire());
        (finished.end, pid)
    })
    .join()
    .expect("thread");
    assert!(matches!(end, End::Stopped), "{end:?}");
    assert!(!alive(pid), "the daemon {pid} survived");
    f.assert_no_cgroup();
}
