//! The few raw calls nix does not wrap safely. Each is small and says why it
//! is sound.

use std::os::fd::{AsRawFd, BorrowedFd};

/// Reads the window size of a terminal.
pub(crate) fn get_winsize(fd: BorrowedFd<'_>) -> std::io::Result<libc::winsize> {
    let mut ws = libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the pointer we pass, which
    // points at a live, properly aligned local; the fd is borrowed and open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws as *mut libc::winsize) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(ws) }
}

/// Sets the window size of a terminal (the PTY master: the kernel then sends
/// SIGWINCH to the foreground process group on the slave side).
pub(crate) fn set_winsize(fd: BorrowedFd<'_>, ws: &libc::winsize) -> std::io::Result<()> {
    // SAFETY: TIOCSWINSZ only reads one `winsize` from the pointer, which
    // points at a live value for the duration of the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, ws as *const libc::winsize) };
    if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}
