//! The few system calls std does not wrap: blocking the cancelling signals
//! into a signalfd, reading it, and poll(2). Everything unsafe in
//! `lazaret-escalate` is here.
#![allow(unsafe_code)]

use std::io;
use std::mem::{size_of, size_of_val, zeroed};
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

/// Turns on `SO_PASSCRED` on `sock`: the kernel then attaches the sending
/// process's verified credentials to what this side sends (when the peer
/// asks for them) and to what it receives.
pub(crate) fn pass_credentials(sock: &std::os::unix::net::UnixStream) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a live int of the size passed; the descriptor is open.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Descriptors that fit next to one ucred in [`receive_with_sender`]'s
/// control buffer (none is wanted: they are closed, the room only lets
/// the kernel hand them over rather than keep the message whole).
const RIGHTS_ROOM: usize = 16;

/// Receives into `buf` with the sender's credentials: the byte count and
/// the PID the kernel verified for the process that sent them (`None`
/// when none came: the sender did not turn `SO_PASSCRED` on, or the
/// kernel attached none, or the control data did not fit, so what came
/// cannot be trusted). Requires [`pass_credentials`] on `sock`.
///
/// Every descriptor the sender attached (`SCM_RIGHTS`) is closed: the
/// broker runs as root and serves other sessions' connections only to
/// refuse them, which must not leave it their descriptors.
pub(crate) fn receive_with_sender(sock: &std::os::unix::net::UnixStream, buf: &mut [u8]) -> io::Result<(usize, Option<i32>)> {
    // Room for one SCM_CREDENTIALS message and one SCM_RIGHTS message of
    // RIGHTS_ROOM descriptors (CMSG_SPACE of each, at most 16 + 16 and
    // 16 + 4 * RIGHTS_ROOM bytes), 8-byte aligned as cmsghdr needs.
    let mut control = [0u64; (32 + 16 + 4 * RIGHTS_ROOM) / 8];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control) as _;
    let n = loop {
        // SAFETY: `msg` points to `iov` (over `buf`) and `control`, all
        // live and exclusively borrowed for the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &raw mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    let mut sender = None;
    // SAFETY: the CMSG_* macros walk the control buffer the kernel filled,
    // within `msg_controllen`; a ucred is read only from a message of
    // SCM_CREDENTIALS type whose length holds one, and descriptors only
    // from within an SCM_RIGHTS message's length (both read unaligned).
    // The descriptors were just installed in this process for this call
    // and nothing else knows them: each is closed exactly once.
    unsafe {
        let end = msg.msg_control.cast::<u8>().add((msg.msg_controllen as usize).min(size_of_val(&control)));
        let mut header = libc::CMSG_FIRSTHDR(&raw const msg);
        while !header.is_null() {
            let h = &*header;
            // Never past what the kernel filled, whatever the header says.
            let len = (h.cmsg_len as usize).min(end.offset_from(header.cast::<u8>()).max(0) as usize);
            if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(header);
                let count = len.saturating_sub(data.offset_from(header.cast::<u8>()) as usize) / size_of::<libc::c_int>();
                for i in 0..count {
                    let fd: libc::c_int = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                    libc::close(fd);
                }
            } else if h.cmsg_level == libc::SOL_SOCKET
                && h.cmsg_type == libc::SCM_CREDENTIALS
                && len >= libc::CMSG_LEN(size_of::<libc::ucred>() as u32) as usize
            {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(header).cast());
                sender = Some(cred.pid);
            }
            header = libc::CMSG_NXTHDR(&raw const msg, header);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        // Something did not fit: refuse rather than trust part of it.
        sender = None;
    }
    Ok((n, sender))
}
