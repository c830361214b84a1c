//! The developer's terminal: raw mode behind a guard, and window sizes.
//!
//! Raw mode is undone on every way out: the guard's `Drop` (normal return,
//! error, and signals, which Lazaret turns into ordinary events with a
//! signalfd) and a panic hook. Only SIGKILL of Lazaret itself can leave the
//! terminal raw, and nothing can help that.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use nix::sys::termios::{self, SetArg, Termios};

/// The saved modes, for the panic hook. One terminal at a time.
static SAVED: Mutex<Option<(Arc<OwnedFd>, Termios)>> = Mutex::new(None);

/// Puts a terminal into raw mode and restores its exact previous modes when
/// dropped.
///
/// The guard (and the panic hook) hold their own close-on-exec duplicate of
/// the terminal descriptor: terminal modes belong to the terminal, not to a
/// descriptor, so restoring through the duplicate restores the terminal
/// `enter` was given, even if the caller's descriptor is closed first.
pub struct RawModeGuard {
    fd: Arc<OwnedFd>,
    saved: Termios,
}

impl RawModeGuard {
    /// Saves the modes of `fd` and switches it to raw mode.
    pub fn enter(fd: BorrowedFd<'_>) -> nix::Result<RawModeGuard> {
        let saved = termios::tcgetattr(fd)?;
        let own = Arc::new(fd.try_clone_to_owned().map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EBADF)))?);
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        install_panic_restore();
        if let Ok(mut slot) = SAVED.lock() {
            *slot = Some((Arc::clone(&own), saved.clone()));
        }
        termios::tcsetattr(fd, SetArg::TCSADRAIN, &raw)?;
        Ok(RawModeGuard { fd: own, saved })
    }
}

impl Drop for RawModeGuard {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(self.fd.as_fd(), SetArg::TCSADRAIN, &self.saved);
        if let Ok(mut slot) = SAVED.lock() {
            *slot = None;
        }
    }
}

fn install_panic_restore() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Ok(slot) = SAVED.lock() {
                if let Some((fd, saved)) = slot.as_ref() {
                    let _ = termios::tcsetattr(fd.as_fd(), SetArg::TCSADRAIN, saved);
                }
            }
            previous(info);
        }));
    });
}

/// A PTY pair, both ends close-on-exec.
#[derive(Debug)]
pub struct Pty {
    /// The master (the client's side).
    pub master: OwnedFd,
    /// The slave (the agent's terminal).
    pub slave: OwnedFd,
}

/// Allocates a PTY whose master and slave are both close-on-exec from the
/// moment they exist (`posix_openpt(O_CLOEXEC)`, then the slave opened by
/// name with `O_CLOEXEC`), so that no process another thread starts at the
/// same time inherits either end. Neither becomes a controlling terminal of
/// the caller (`O_NOCTTY`).
pub fn open_pty() -> nix::Result<Pty> {
    use nix::fcntl::OFlag;
    let flags = OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let master = nix::pty::posix_openpt(flags)?;
    nix::pty::grantpt(&master)?;
    nix::pty::unlockpt(&master)?;
    let name = nix::pty::ptsname_r(&master)?;
    let slave = nix::fcntl::open(name.as_str(), flags, nix::sys::stat::Mode::empty())?;
    Ok(Pty { master: OwnedFd::from(master), slave })
}

/// Whether `fd` is a terminal.
pub fn is_terminal(fd: impl AsFd) -> bool {
    nix::unistd::isatty(fd).unwrap_or(false)
}

/// A terminal window size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSize {
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// Reads the window size of a terminal.
pub fn window_size(fd: BorrowedFd<'_>) -> std::io::Result<WindowSize> {
    let ws = crate::sys::get_winsize(fd)?;
    Ok(WindowSize { rows: ws.ws_row, cols: ws.ws_col })
}

/// Sets the window size of a terminal (a PTY master).
pub fn set_window_size(fd: BorrowedFd<'_>, size: WindowSize) -> std::io::Result<()> {
    let ws = libc::winsize { ws_row: size.rows, ws_col: size.cols, ws_xpixel: 0, ws_ypixel: 0 };
    crate::sys::set_winsize(fd, &ws)
}

/// Copies the window size of `input` (the developer's terminal) to `master`
/// (a PTY master); errors are ignored (a terminal that went away).
pub fn sync_window_size(input: BorrowedFd<'_>, master: BorrowedFd<'_>) {
    if let Ok(size) = window_size(input) {
        let _ = set_window_size(master, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::pty::openpty;

    #[test]
    fn raw_mode_is_restored_exactly() {
        let pty = openpty(None, None).expect("openpty");
        let before = termios::tcgetattr(pty.slave.as_fd()).expect("tcgetattr");
        {
            let _guard = RawModeGuard::enter(pty.slave.as_fd()).expect("raw");
            let during = termios::tcgetattr(pty.slave.as_fd()).expect("tcgetattr");
            assert!(!during.local_flags.contains(termios::LocalFlags::ECHO));
            assert!(!during.local_flags.contains(termios::LocalFlags::ICANON));
        }
        let after = termios::tcgetattr(pty.slave.as_fd()).expect("tcgetattr");
        assert_eq!(format!("{before:?}"), format!("{after:?}"));
    }

    #[test]
    fn raw_mode_is_restored_after_the_callers_descriptor_is_closed() {
        let pty = openpty(None, None).expect("openpty");
        let before = termios::tcgetattr(pty.slave.as_fd()).expect("tcgetattr");
        let callers = pty.slave.try_clone().expect("dup");
        let guard = RawModeGuard::enter(callers.as_fd()).expect("raw");
        drop(callers);
        let during = termios::tcgetattr(pty.slave.as_fd()).expect("tcgetattr");
        assert!(!during.local_flags.contains(termios::LocalFlags::ICANON));
        drop(guard);
        let after = termios::tcgetattr(pty.slave.as_fd()).expect("tcgetattr");
        assert_eq!(format!("{before:?}"), format!("{after:?}"));
    }

    #[test]
    fn both_ends_of_a_new_pty_are_close_on_exec() {
        use nix::fcntl::{FcntlArg, FdFlag, fcntl};
        let pty = open_pty().expect("open_pty");
        for fd in [&pty.master, &pty.slave] {
            let flags = FdFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFD).expect("F_GETFD"));
            assert!(flags.contains(FdFlag::FD_CLOEXEC), "a PTY end without FD_CLOEXEC");
        }
        assert!(is_terminal(pty.slave.as_fd()));
        set_window_size(pty.master.as_fd(), WindowSize { rows: 5, cols: 6 }).expect("set");
        assert_eq!(window_size(pty.slave.as_fd()).expect("get"), WindowSize { rows: 5, cols: 6 });
    }

    #[test]
    fn window_size_round_trips_through_a_pty() {
        let pty = openpty(None, None).expect("openpty");
        set_window_size(pty.master.as_fd(), WindowSize { rows: 37, cols: 101 }).expect("set");
        assert_eq!(window_size(pty.slave.as_fd()).expect("get"), WindowSize { rows: 37, cols: 101 });
        assert!(is_terminal(pty.slave.as_fd()));
    }
}
