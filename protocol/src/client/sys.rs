//! The few system calls std does not wrap: blocking the cancelling signals
//! into a signalfd, reading it, and poll(2). Everything unsafe in
//! `lazaret-escalate` is here.
#![allow(unsafe_code)]

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Blocks `signals` for this (single-threaded) process and returns a
/// non-blocking signalfd that becomes readable when one of them arrives, so
/// the I/O loop sees a signal as one more descriptor in its poll.
pub(crate) fn block_into_signalfd(signals: &[libc::c_int]) -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; an all-zero value is a valid starting
    // point that sigemptyset then initialises properly.
    let mut set: libc::sigset_t = unsafe { zeroed() };
    // SAFETY: `set` is a live sigset_t owned by this frame.
    if unsafe { libc::sigemptyset(&mut set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    for &signal in signals {
        // SAFETY: as above; sigaddset validates the signal number.
        if unsafe { libc::sigaddset(&mut set, signal) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    // SAFETY: -1 asks for a new descriptor; `set` is initialised.
    let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The number of the next pending signal on `signalfd`, or `None` when none
/// is pending.
pub(crate) fn read_signal(signalfd: &OwnedFd) -> io::Result<Option<u32>> {
    // SAFETY: signalfd_siginfo is plain data; all-zero is a valid value.
    let mut info: libc::signalfd_siginfo = unsafe { zeroed() };
    let want = size_of::<libc::signalfd_siginfo>();
    // SAFETY: the buffer is `info`, exactly `want` writable bytes, and the
    // descriptor is open for the borrow's duration.
    let n = unsafe { libc::read(signalfd.as_raw_fd(), (&raw mut info).cast(), want) };
    if n < 0 {
        let err = io::Error::last_os_error();
        return match err.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
            _ => Err(err),
        };
    }
    if n as usize != want {
        return Err(io::Error::other("short read from the signalfd"));
    }
    Ok(Some(info.ssi_signo))
}

/// Interest in one descriptor for [`poll`].
pub(crate) fn interest(fd: RawFd, readable: bool, writable: bool) -> libc::pollfd {
    let mut events = 0;
    if readable {
        events |= libc::POLLIN;
    }
    if writable {
        events |= libc::POLLOUT;
    }
    libc::pollfd { fd, events, revents: 0 }
}

/// Whether poll reported `fd` ready (readable, writable, hung up or in error).
pub(crate) fn ready(fd: &libc::pollfd) -> bool {
    fd.revents != 0
}

/// Waits until one of `fds` is ready or `timeout` passes (`None`: forever).
/// A signal that interrupts the wait returns normally; callers check their
/// deadlines against the clock, not against the return value.
pub(crate) fn poll(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> io::Result<()> {
    // Round up so a deadline a fraction of a millisecond away does not spin.
    let millis = timeout.map_or(-1, |t| i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX));
    let count = libc::nfds_t::try_from(fds.len()).map_err(|_| io::Error::other("too many descriptors"))?;
    // SAFETY: `fds` is a live, exclusively borrowed slice of `count` pollfds.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), count, millis) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    Ok(())
}
