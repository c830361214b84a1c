//! Signals as events: Lazaret blocks the signals it handles and reads them
//! from a signalfd, so they arrive as ordinary events in a `poll` loop and
//! every exit path runs the same clean-up code.

use std::os::fd::{AsFd, BorrowedFd};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

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
        self.next_pending_with_origin().map(|(s, _)| s)
    }

    /// Waits for the next signal and returns it with whether another process
    /// sent it explicitly (`kill`), as opposed to the kernel (a terminal's
    /// ^C, a child's exit).
    pub fn wait_next(&mut self) -> Option<(Signal, bool)> {
        let mut fds = [PollFd::new(self.fd.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::NONE);
        self.next_pending_with_origin()
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
