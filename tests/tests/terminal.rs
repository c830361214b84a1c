//! `lazaret run` under a pseudo-terminal that the test drives (FR-8, DX-5):
//! the window size inside follows the outer one, and the outer terminal's
//! modes are exactly restored after exit, also when the agent is killed.

use std::os::fd::{AsFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lazaret_runtime::terminal::{set_window_size, WindowSize};
use lazaret_tests::*;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::pty::{openpty, Winsize};
use nix::sys::termios;

struct Pty {
    master: OwnedFd,
    slave: OwnedFd,
    seen: String,
}

impl Pty {
    fn new(rows: u16, cols: u16) -> Pty {
        let ws = Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 };
        let p = openpty(Some(&ws), None).expect("openpty");
        Pty { master: p.master, slave: p.slave, seen: String::new() }
    }

    /// Spawns `lazaret ARGS` with the PTY as its controlling terminal
    /// (`setsid -c`), so that resizes reach it as SIGWINCH, in a fresh
    /// network namespace (`unshare --net`, which execs in place).
    fn spawn(&self, env: &TestEnv, args: &[&str]) -> std::process::Child {
        let mut cmd = Command::new("setsid");
        cmd.arg("-c").args(["unshare", "--net", "--"]).arg(lazaret_bin()).arg("--config").arg(&env.config).args(args).current_dir(&env.workspace);
        let io = |fd: &OwnedFd| Stdio::from(fd.try_clone().expect("dup slave"));
        cmd.stdin(io(&self.slave)).stdout(io(&self.slave)).stderr(io(&self.slave));
        cmd.spawn().expect("spawning setsid -c lazaret (util-linux)")
    }

    /// Reads the master until `needle` has been seen (fails after 60 s).
    fn expect(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.seen.contains(needle) {
            assert!(Instant::now() < deadline, "never saw {needle:?}; terminal showed {:?}", self.seen);
            let mut fds = [PollFd::new(self.master.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, PollTimeout::from(200u16)).unwrap_or(0) == 0 {
                continue;
            }
            let mut buf = [0u8; 4096];
            match nix::unistd::read(self.master.as_fd(), &mut buf) {
                Ok(n) if n > 0 => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        // Consume up to the match so the next expect sees only new output.
        if let Some(i) = self.seen.find(needle) {
            self.seen.drain(..i + needle.len());
        }
    }

    fn write(&self, data: &[u8]) {
        nix::unistd::write(self.master.as_fd(), data).expect("write to master");
    }

    fn resize(&self, rows: u16, cols: u16) {
        // The outer terminal is resized through its master, as a terminal
        // emulator does; the kernel then signals the foreground group.
        set_window_size(self.master.as_fd(), WindowSize { rows, cols }).expect("TIOCSWINSZ");
    }

    fn modes(&self) -> String {
        format!("{:?}", termios::tcgetattr(self.slave.as_fd()).expect("tcgetattr"))
    }
}

#[test]
fn window_size_follows_the_outer_terminal_and_modes_are_restored() {
    let env = TestEnv::new();
    let mut pty = Pty::new(33, 111);
    let before = pty.modes();
    let mut child = pty.spawn(&env, &["run", "test", "--", "sh", "-c", "stty size; read line; stty size; echo done-$((6*7))"]);
    pty.expect("33 111");
    pty.resize(44, 122);
    pty.write(b"\r");
    pty.expect("44 122");
    pty.expect("done-42");
    let status = wait_with_limit(&mut child);
    assert_eq!(status.code(), Some(0), "terminal showed {:?}", pty.seen);
    assert_eq!(pty.modes(), before, "outer terminal modes changed");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn modes_are_restored_when_the_agent_is_killed() {
    let env = TestEnv::new();
    let mut pty = Pty::new(24, 80);
    let before = pty.modes();
    let mut child = pty.spawn(&env, &["run", "test", "--", "sh", "-c", "echo started; kill -KILL $$"]);
    pty.expect("started");
    let status = wait_with_limit(&mut child);
    assert_eq!(status.code(), Some(137), "terminal showed {:?}", pty.seen);
    assert_eq!(pty.modes(), before, "outer terminal modes changed");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn input_reaches_the_agent_on_a_terminal() {
    let env = TestEnv::new();
    let mut pty = Pty::new(24, 80);
    let mut child = pty.spawn(&env, &["run", "test", "--", "sh", "-c", "test -t 0 && test -t 1 && echo is-a-tty; read a; echo got-$a"]);
    pty.expect("is-a-tty");
    pty.write(b"hello\r");
    pty.expect("got-hello");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}
