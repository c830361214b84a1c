//! A pseudo-terminal the test drives, standing in for the developer's
//! terminal: its slave is given to `lazaret`, the test reads and writes the
//! master.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use lazaret_runtime::terminal::{WindowSize, open_pty, set_window_size};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::termios;

use crate::screen::Screen;
use crate::{TestEnv, lazaret_bin};

/// The test's terminal.
pub struct TestTerminal {
    master: OwnedFd,
    slave: OwnedFd,
    seen: String,
    /// Every byte read from the master, in order (never consumed).
    raw: Vec<u8>,
    /// The window size (rows, columns) the test gave it.
    size: std::cell::Cell<(u16, u16)>,
}

impl TestTerminal {
    /// A terminal of `rows` × `cols`, both ends close-on-exec, so that only
    /// the processes given its slave as stdio hold it.
    pub fn new(rows: u16, cols: u16) -> TestTerminal {
        let p = open_pty().expect("open_pty");
        set_window_size(p.master.as_fd(), WindowSize { rows, cols }).expect("TIOCSWINSZ");
        TestTerminal { master: p.master, slave: p.slave, seen: String::new(), raw: Vec::new(), size: std::cell::Cell::new((rows, cols)) }
    }

    /// Like [`TestTerminal::new`] (24 × 80), but both ends are inherited by
    /// every child the test starts (plain `openpty`), as a careless
    /// caller's terminal descriptors would be: Lazaret must not hand them on.
    pub fn leaky() -> TestTerminal {
        let ws = nix::pty::Winsize { ws_row: 24, ws_col: 80, ws_xpixel: 0, ws_ypixel: 0 };
        let p = nix::pty::openpty(Some(&ws), None).expect("openpty");
        TestTerminal { master: p.master, slave: p.slave, seen: String::new(), raw: Vec::new(), size: std::cell::Cell::new((24, 80)) }
    }

    /// The slave's path, as /proc shows it.
    pub fn slave_path(&self) -> String {
        std::fs::read_link(format!("/proc/self/fd/{}", self.slave.as_raw_fd())).expect("slave path").to_string_lossy().into_owned()
    }

    /// The slave, for one of a child's stdio streams.
    pub fn io(&self) -> Stdio {
        Stdio::from(self.slave.try_clone().expect("dup slave"))
    }

    /// `lazaret ARGS` with this terminal as its controlling terminal
    /// (`setsid -c`, so that resizes reach it as SIGWINCH), in a fresh
    /// network namespace (`unshare --net`, which execs in place), with
    /// the env's extra variables ([`TestEnv::env`]). The caller chooses its
    /// stdio.
    pub fn command(&self, env: &TestEnv, args: &[&str]) -> Command {
        let mut cmd = Command::new("setsid");
        cmd.arg("-c")
            .args(["unshare", "--net", "--"])
            .arg(lazaret_bin())
            .arg("--config")
            .arg(&env.config)
            .args(args)
            .current_dir(&env.workspace);
        for (k, v) in &env.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// [`TestTerminal::command`] with all three streams on the terminal.
    pub fn spawn(&self, env: &TestEnv, args: &[&str]) -> Child {
        self.command(env, args)
            .stdin(self.io())
            .stdout(self.io())
            .stderr(self.io())
            .spawn()
            .expect("spawning setsid -c lazaret (util-linux)")
    }

    /// Reads the master until `needle` has been seen (fails after 60 s),
    /// then consumes the output up to it, so the next call sees only what
    /// came after.
    pub fn expect(&mut self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.seen.contains(needle) {
            assert!(Instant::now() < deadline, "never saw {needle:?}; terminal showed {:?}", self.seen);
            self.read_some(Duration::from_millis(200));
        }
        if let Some(i) = self.seen.find(needle) {
            self.seen.drain(..i + needle.len());
        }
    }

    /// Like [`TestTerminal::expect`] (60 s), and returns what the terminal
    /// showed before `needle` (since the last match).
    pub fn expect_text(&mut self, needle: &str) -> String {
        self.expect_within(needle, Duration::from_secs(60))
    }

    /// Like [`TestTerminal::expect_text`], failing after `limit`.
    pub fn expect_within(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        while !self.seen.contains(needle) {
            assert!(Instant::now() < deadline, "never saw {needle:?} within {limit:?}; terminal showed {:?}", self.seen);
            self.read_some(Duration::from_millis(200));
        }
        let i = self.seen.find(needle).unwrap_or(0);
        let before = self.seen[..i].to_string();
        self.seen.drain(..i + needle.len());
        before
    }

    /// Reads what the terminal shows for `period` (without consuming it).
    pub fn settle(&mut self, period: Duration) -> &str {
        let deadline = Instant::now() + period;
        while Instant::now() < deadline {
            self.read_some(deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(200)));
        }
        &self.seen
    }

    /// Reads what arrived within `wait` onto `seen`.
    fn read_some(&mut self, wait: Duration) {
        let ms = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(self.master.as_fd(), PollFlags::POLLIN)];
        if poll(&mut fds, PollTimeout::from(ms)).unwrap_or(0) == 0 {
            return;
        }
        let mut buf = [0u8; 4096];
        match nix::unistd::read(self.master.as_fd(), &mut buf) {
            Ok(n) if n > 0 => {
                self.raw.extend_from_slice(&buf[..n]);
                self.seen.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }

    /// Every byte the terminal received so far (what
    /// [`TestTerminal::expect`] consumed included).
    pub fn received(&self) -> &[u8] {
        &self.raw
    }

    /// What the terminal showed since the last match of [`TestTerminal::expect`].
    pub fn seen(&self) -> &str {
        &self.seen
    }

    /// Types `data` (all of it, as one write where the terminal takes it).
    pub fn write(&self, data: &[u8]) {
        let mut rest = data;
        while !rest.is_empty() {
            let n = nix::unistd::write(self.master.as_fd(), rest).expect("write to master");
            rest = &rest[n..];
        }
    }

    /// Resizes the terminal through its master, as a terminal emulator
    /// does; the kernel then signals the foreground group.
    pub fn resize(&self, rows: u16, cols: u16) {
        set_window_size(self.master.as_fd(), WindowSize { rows, cols }).expect("TIOCSWINSZ");
        self.size.set((rows, cols));
    }

    /// What the developer sees now: everything the terminal received,
    /// rendered by a terminal emulator of the terminal's size (a resize
    /// is applied as if from the start).
    pub fn screen(&self) -> Screen {
        let (rows, cols) = self.size.get();
        Screen::of(rows, cols, &self.raw)
    }

    /// Reads what arrives for `period`, then renders the screen.
    pub fn screen_after(&mut self, period: Duration) -> Screen {
        self.settle(period);
        self.screen()
    }

    /// Closes the terminal, as a terminal emulator's window closing or a
    /// dropped ssh connection does: the kernel hangs up its slave (SIGHUP
    /// to the session leader; end of file, EIO and POLLHUP on every
    /// descriptor of it, whoever holds it).
    pub fn hang_up(self) {
        drop(self.master);
        drop(self.slave);
    }

    /// Input queued on the terminal that no process read (what a TIOCSTI
    /// into it would leave once its readers are gone): the slave is put in
    /// raw mode, so that a partial line shows too, and read without
    /// blocking. Call it after the processes on the terminal exited.
    pub fn pending_input(&self) -> Vec<u8> {
        let mut raw = termios::tcgetattr(self.slave.as_fd()).expect("tcgetattr");
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(self.slave.as_fd(), termios::SetArg::TCSANOW, &raw).expect("tcsetattr");
        let mut pending = Vec::new();
        let mut fds = [PollFd::new(self.slave.as_fd(), PollFlags::POLLIN)];
        while poll(&mut fds, PollTimeout::from(100u16)).unwrap_or(0) > 0 {
            let mut buf = [0u8; 4096];
            match nix::unistd::read(self.slave.as_fd(), &mut buf) {
                Ok(n) if n > 0 => pending.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
        pending
    }

    /// The terminal's window size as its slave reports it (rows, columns).
    pub fn window_size(&self) -> (u16, u16) {
        let out = Command::new("stty").arg("size").stdin(self.io()).output().expect("stty size (coreutils)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut it = text.split_whitespace().map(|n| n.parse().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    }

    /// The terminal's modes, for comparing before and after.
    pub fn modes(&self) -> String {
        format!("{:?}", termios::tcgetattr(self.slave.as_fd()).expect("tcgetattr"))
    }
}
