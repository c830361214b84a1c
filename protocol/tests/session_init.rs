//! `lazaret-session-init` on the host (it needs no sandbox and no root: a
//! child subreaper works for any process): the agent's status, streams and
//! signals pass through, a command that cannot be run is 127 or 126 like a
//! shell's, and when the agent exits or the session is ended, every process
//! it left is gone, double-forked ones included.
//!
//! Run: `cargo test -p lazaret-protocol --features client --test session_init`

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lazaret_protocol::session::END_SIGNAL;

const BIN: &str = env!("CARGO_BIN_EXE_lazaret-session-init");
const LIMIT: Duration = Duration::from_secs(30);

/// Kills and reaps the program on every way out of a test.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(script: &str) -> Running {
    let child = Command::new(BIN)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning lazaret-session-init");
    Running(child)
}

/// Waits for the program's exit (failing after [`LIMIT`]); its exit code.
fn wait(r: &mut Running) -> Option<i32> {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(status) = r.0.try_wait().expect("try_wait") {
            return status.code();
        }
        assert!(Instant::now() < deadline, "lazaret-session-init did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` exists (a zombie counts as gone).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or_default().trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// Reads `n` lines of PIDs from the program's stdout.
fn pids(lines: &mut impl Iterator<Item = std::io::Result<String>>, n: usize) -> Vec<i32> {
    (0..n).map(|_| lines.next().and_then(Result::ok).unwrap_or_default().trim().parse().expect("a PID line")).collect()
}

fn signal(r: &Running, signal: i32) {
    let rc = std::process::Command::new("kill").arg(format!("-{signal}")).arg(r.0.id().to_string()).status().expect("kill");
    assert!(rc.success(), "kill -{signal} failed");
}

#[test]
fn the_agent_s_status_is_kept_and_what_it_left_is_killed() {
    // A background child, a double-forked one in its own session, and one
    // that ignores SIGTERM and SIGHUP.
    let mut r = start(
        "sleep 1000 & echo $!; sh -c 'echo $$; exec setsid sleep 1000' & (trap '' TERM HUP; sh -c 'echo $$; exec sleep 1000' &); sleep 0.3; exit 7",
    );
    let mut lines = BufReader::new(r.0.stdout.take().expect("stdout")).lines();
    let left = pids(&mut lines, 3);
    assert_eq!(wait(&mut r), Some(7));
    for pid in left {
        assert!(!alive(pid), "process {pid} the agent left is still alive");
    }
}

#[test]
fn a_signal_is_forwarded_and_a_killed_agent_reads_like_a_shell_s() {
    let mut r = start("trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.05; done");
    let mut lines = BufReader::new(r.0.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    signal(&r, libc::SIGTERM);
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("got-term"));
    assert_eq!(wait(&mut r), Some(9));

    let mut r = start("echo ready; kill -KILL $$");
    assert_eq!(wait(&mut r), Some(128 + libc::SIGKILL));
}

#[test]
fn the_end_signal_ends_the_agent_and_everything_it_started() {
    let mut r = start("(setsid sh -c 'echo $$; exec sleep 1000' &); trap '' TERM INT HUP; echo $$; sleep 1000; echo survived");
    let mut lines = BufReader::new(r.0.stdout.take().expect("stdout")).lines();
    let left = pids(&mut lines, 2);
    signal(&r, END_SIGNAL);
    assert_eq!(wait(&mut r), Some(128 + libc::SIGKILL));
    assert_eq!(lines.next().and_then(Result::ok), None, "the agent went on after the end");
    for pid in left {
        assert!(!alive(pid), "process {pid} survived the end of its session");
    }
}

#[test]
fn commands_that_cannot_run_are_127_and_126_with_one_line() {
    let dir = std::env::temp_dir().join(format!("lazaret-session-init-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let plain = dir.join("not-executable");
    std::fs::write(&plain, "echo no\n").expect("write");
    let run = |args: &[&str], path: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.arg("--").args(args);
        if let Some(p) = path {
            cmd.env("PATH", p);
        }
        cmd.output().expect("run")
    };
    let cases: [(&[&str], Option<&str>, i32, &str); 4] = [
        (&["/nonexistent/command"], None, 127, "no such file or directory"),
        (&["no-such-command-here"], None, 127, "no such file or directory"),
        (&[plain.to_str().expect("utf-8")], None, 126, "permission denied"),
        (&["not-executable"], Some(dir.to_str().expect("utf-8")), 126, "permission denied"),
    ];
    for (args, path, code, why) in cases {
        let out = run(args, path);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(args[0]) && err.contains(why), "{args:?}: {err}");
    }
    // The agent's own 126 and 127 are its own, and its bytes are exact.
    let out = run(&["sh", "-c", "printf 'a\\0b'; printf err >&2; exit 127"], None);
    assert_eq!(out.status.code(), Some(127));
    assert_eq!(out.stdout, b"a\0b");
    assert_eq!(out.stderr, b"err");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn it_holds_none_of_the_agent_s_streams() {
    // The agent closes its stdout and goes on: the reader sees the end at
    // once, not when the session ends.
    let mut r = start("echo hi; exec >/dev/null; sleep 3");
    let mut out = r.0.stdout.take().expect("stdout");
    let mut all = String::new();
    out.read_to_string(&mut all).expect("read");
    assert_eq!(all, "hi\n");
    assert!(r.0.try_wait().expect("try_wait").is_none(), "the end of stdout came only with the exit");
    let _ = wait(&mut r);
}

#[test]
fn usage_without_a_command_is_an_error() {
    for args in [&[][..], &["sh"][..], &["--"][..]] {
        let out = Command::new(BIN).args(args).output().expect("run");
        assert_eq!(out.status.code(), Some(125), "{args:?}");
    }
}
