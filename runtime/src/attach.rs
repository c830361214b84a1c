//! Staying attached to a running container until its first process exits:
//! forwarding the terminal (or not, for plain pipes), window-size changes and
//! termination signals, and collecting the exit status.
//!
//! Signals are read from a signalfd, so they are ordinary events in one
//! `poll` loop and every exit path runs the same clean-up code.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::unistd::Pid;

use crate::terminal::{set_window_size, window_size};
use crate::{reaper, ExitStatus};

/// Errors while attached.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// A system call failed.
    #[error("{context}: {source}")]
    Sys {
        /// What we were doing.
        context: &'static str,
        /// The error.
        source: Errno,
    },
}

fn sys(context: &'static str) -> impl FnOnce(Errno) -> AttachError {
    move |source| AttachError::Sys { context, source }
}

/// The signals Lazaret handles as events.
const HANDLED: [Signal; 6] = [Signal::SIGCHLD, Signal::SIGWINCH, Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT];

/// Signals turned into events. Create it first thing, while the process has
/// one thread: the signals are blocked for the calling thread and for threads
/// it spawns later (child processes get a clean mask from std).
pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    /// Blocks SIGCHLD, SIGWINCH, SIGINT, SIGTERM, SIGHUP and SIGQUIT and
    /// opens a signalfd for them.
    pub fn block() -> nix::Result<Signals> {
        let mut set = SigSet::empty();
        for s in HANDLED {
            set.add(s);
        }
        nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(Signals { fd })
    }

    /// The signalfd, for a caller's own `poll` loop (then read the signals
    /// with [`Signals::next_pending`]).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Returns the next pending signal, if any, without waiting.
    pub fn next_pending(&mut self) -> Option<Signal> {
        match self.fd.read_signal() {
            Ok(Some(info)) => Signal::try_from(info.ssi_signo as i32).ok(),
            _ => None,
        }
    }

    /// Waits for the next signal and returns it with whether another process
    /// sent it explicitly (`kill`), as opposed to the kernel (a terminal's
    /// ^C, a child's exit).
    pub fn wait_next(&mut self) -> Option<(Signal, bool)> {
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::NONE);
        match self.fd.read_signal() {
            Ok(Some(info)) => {
                let from_process = matches!(info.ssi_code, libc::SI_USER | libc::SI_QUEUE | libc::SI_TKILL);
                Signal::try_from(info.ssi_signo as i32).ok().map(|s| (s, from_process))
            }
            _ => None,
        }
    }

    /// Returns the next pending signal with whether another process sent
    /// it explicitly, without waiting.
    pub fn next_pending_with_origin(&mut self) -> Option<(Signal, bool)> {
        match self.fd.read_signal() {
            Ok(Some(info)) => {
                let from_process = matches!(info.ssi_code, libc::SI_USER | libc::SI_QUEUE | libc::SI_TKILL);
                Signal::try_from(info.ssi_signo as i32).ok().map(|s| (s, from_process))
            }
            _ => None,
        }
    }

    /// Returns the first pending termination signal (INT, TERM, HUP, QUIT),
    /// discarding others; for checking between start-up steps.
    pub fn pending_termination(&mut self) -> Option<Signal> {
        while let Some(s) = self.next_pending() {
            if is_termination(s) {
                return Some(s);
            }
        }
        None
    }
}

fn is_termination(s: Signal) -> bool {
    matches!(s, Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT)
}

/// How the container's first process is connected to us.
pub enum AttachIo<'a> {
    /// It inherited our stdio directly; we only wait.
    Inherited,
    /// It has a PTY; we copy between the developer's terminal and its master.
    Terminal {
        /// The PTY master from runsc.
        master: OwnedFd,
        /// The developer's terminal (stdin): input and window size.
        input: BorrowedFd<'a>,
        /// Where the container's output goes (stdout).
        output: BorrowedFd<'a>,
    },
}

/// Copies the developer's window size to the PTY master.
pub fn sync_window_size(input: BorrowedFd<'_>, master: BorrowedFd<'_>) {
    if let Ok(size) = window_size(input) {
        let _ = set_window_size(master, size);
    }
}

/// Waits until the process `sandbox` exits, serving the terminal meanwhile.
/// `on_termination(signal, count)` is called for each termination signal
/// Lazaret receives (count starts at 1), so the caller can forward it to the
/// container and escalate. Returns the container's exit status.
pub fn attach(
    signals: &mut Signals,
    sandbox: Pid,
    io: AttachIo<'_>,
    mut on_termination: impl FnMut(Signal, u32),
) -> Result<ExitStatus, AttachError> {
    let mut terminations = 0u32;
    // The sandbox may have exited before the signalfd saw SIGCHLD.
    let mut status = reaper::reap_exited(sandbox);

    let (master, input, output) = match io {
        AttachIo::Inherited => {
            while status.is_none() {
                wait_readable(&[signals.fd.as_fd()], None)?;
                while let Some(sig) = signals.next_pending() {
                    match sig {
                        Signal::SIGCHLD => status = status.or(reaper::reap_exited(sandbox)),
                        s if is_termination(s) => {
                            terminations += 1;
                            on_termination(s, terminations);
                        }
                        _ => {}
                    }
                }
            }
            return Ok(status.unwrap_or(ExitStatus(1)));
        }
        AttachIo::Terminal { master, input, output } => (master, input, output),
    };

    let flags = fcntl(master.as_fd(), FcntlArg::F_GETFL).map_err(sys("reading PTY flags"))?;
    fcntl(master.as_fd(), FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK)).map_err(sys("making the PTY non-blocking"))?;
    sync_window_size(input, master.as_fd());

    let mut to_master: Vec<u8> = Vec::new();
    let mut input_open = true;
    let mut master_open = true;
    let mut exited_at: Option<Instant> = status.map(|_| Instant::now());
    let mut buf = [0u8; 16 * 1024];

    loop {
        if let Some(t) = exited_at {
            // After the sandbox exits, drain what is left of its output, but
            // never wait long for a PTY that some orphan still holds.
            if !master_open || t.elapsed() > Duration::from_millis(300) {
                break;
            }
        }
        let mut fds = vec![PollFd::new(signals.fd.as_fd(), PollFlags::POLLIN)];
        let master_idx = fds.len();
        if master_open {
            let mut f = PollFlags::POLLIN;
            if !to_master.is_empty() {
                f |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(master.as_fd(), f));
        }
        let input_idx = fds.len();
        if input_open && to_master.len() < 64 * 1024 && exited_at.is_none() {
            fds.push(PollFd::new(input, PollFlags::POLLIN));
        }
        let timeout = if exited_at.is_some() { PollTimeout::from(50u16) } else { PollTimeout::NONE };
        match poll(&mut fds, timeout) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(sys("waiting for terminal events")(e)),
            Ok(_) => {}
        }
        let revents = |i: usize| fds.get(i).and_then(|f| f.revents()).unwrap_or(PollFlags::empty());
        let sig_ready = revents(0).contains(PollFlags::POLLIN);
        let master_ev = if master_open { revents(master_idx) } else { PollFlags::empty() };
        let input_ev = if fds.len() > input_idx { revents(input_idx) } else { PollFlags::empty() };
        drop(fds);

        if sig_ready {
            while let Some(sig) = signals.next_pending() {
                match sig {
                    Signal::SIGCHLD => {
                        if status.is_none() {
                            status = reaper::reap_exited(sandbox);
                            if status.is_some() {
                                exited_at = Some(Instant::now());
                            }
                        } else {
                            reaper::reap_exited(sandbox);
                        }
                    }
                    Signal::SIGWINCH => sync_window_size(input, master.as_fd()),
                    s if is_termination(s) => {
                        terminations += 1;
                        on_termination(s, terminations);
                    }
                    _ => {}
                }
            }
        }
        if master_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match nix::unistd::read(master.as_fd(), &mut buf) {
                Ok(0) | Err(Errno::EIO) => master_open = false,
                // If our output is gone (terminal closed), keep serving the
                // container until it exits; its output is dropped.
                Ok(n) => write_all(output, &buf[..n]),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => master_open = false,
            }
        }
        if master_open && master_ev.contains(PollFlags::POLLOUT) && !to_master.is_empty() {
            match nix::unistd::write(master.as_fd(), &to_master) {
                Ok(n) => {
                    to_master.drain(..n);
                }
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => to_master.clear(),
            }
        }
        if input_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match nix::unistd::read(input, &mut buf) {
                Ok(0) => input_open = false,
                Ok(n) => to_master.extend_from_slice(&buf[..n]),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => input_open = false,
            }
        }
        if status.is_none() && !master_open {
            // The PTY closed: the container is ending; wait for its status.
            wait_readable(&[signals.fd.as_fd()], Some(Duration::from_millis(100)))?;
            status = reaper::reap_exited(sandbox);
            if status.is_some() {
                exited_at = Some(Instant::now());
            }
        }
    }
    Ok(status.unwrap_or(ExitStatus(1)))
}

fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Option<Duration>) -> Result<(), AttachError> {
    let mut pfds: Vec<PollFd> = fds.iter().map(|f| PollFd::new(*f, PollFlags::POLLIN)).collect();
    let t = match timeout {
        None => PollTimeout::NONE,
        Some(d) => PollTimeout::try_from(d.as_millis().min(60_000) as i32).unwrap_or(PollTimeout::MAX),
    };
    match poll(&mut pfds, t) {
        Ok(_) | Err(Errno::EINTR) => Ok(()),
        Err(e) => Err(sys("waiting for signals")(e)),
    }
}

fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(0) => return,
            Ok(n) => data = &data[n..],
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                let mut p = [PollFd::new(fd, PollFlags::POLLOUT)];
                let _ = poll(&mut p, PollTimeout::from(1000u16));
            }
            Err(_) => return,
        }
    }
}
