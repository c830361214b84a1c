//! The crate's syscall layer: every raw call and every `unsafe` block of the
//! crate is here, each in a small safe function that says why it is sound.
//! The rest of the crate only calls these (the crate root denies
//! `unsafe_code` everywhere else).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use nix::unistd::ForkResult;

use crate::fdpass::MAX_FDS;

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

/// How many threads this process has (0 if `/proc/self/task` is unreadable,
/// which no caller treats as "one").
pub(crate) fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map(|d| d.count()).unwrap_or(0)
}

/// Why [`fork_single_threaded`] did not fork.
#[derive(Debug)]
pub(crate) enum ForkError {
    /// The process has this many threads (not exactly one).
    Threaded(usize),
    /// `fork(2)` failed.
    Sys(nix::Error),
}

/// `fork(2)`, only while the process has exactly one thread (checked here),
/// so that the child is a complete copy and may run any code, allocation
/// included.
pub(crate) fn fork_single_threaded() -> Result<ForkResult, ForkError> {
    let threads = thread_count();
    if threads != 1 {
        return Err(ForkError::Threaded(threads));
    }
    // SAFETY: the process has one thread (checked just above; only that
    // thread could start another one, and it is here), so no lock or
    // allocator state can be held by another thread at the time of the fork.
    unsafe { nix::unistd::fork() }.map_err(ForkError::Sys)
}

/// `unshare(CLONE_NEWPID | CLONE_NEWCGROUP)`: the next child of this process
/// is PID 1 of a new PID namespace, and the process enters a new cgroup
/// namespace rooted at its current cgroup.
pub(crate) fn unshare_pid_and_cgroup() -> nix::Result<()> {
    nix::sched::unshare(CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWCGROUP)
}

/// Moves the calling thread (only) into a new mount namespace whose mounts
/// are all private: `unshare(CLONE_NEWNS)`, then `mount("", "/",
/// MS_REC|MS_PRIVATE)`.
pub(crate) fn enter_private_mount_namespace_on_this_thread() -> nix::Result<()> {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)?;
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
}

/// Mounts a small, read-only-mode tmpfs (`size=4k,mode=0555`, nosuid, nodev,
/// noexec) over `target`, in the calling thread's mount namespace.
pub(crate) fn mount_empty_tmpfs(target: &str) -> nix::Result<()> {
    nix::mount::mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some("size=4k,mode=0555"),
    )
}

/// One `recvmsg(2)` on a unix stream socket (retried on EINTR) with room
/// for [`MAX_FDS`] descriptors (SCM_RIGHTS, received close-on-exec). Returns
/// the bytes read, the descriptors that came with them, and whether the
/// kernel had to drop descriptors for lack of room (MSG_CTRUNC).
pub(crate) fn recv_with_rights(stream: &UnixStream, buf: &mut [u8]) -> std::io::Result<(usize, Vec<OwnedFd>, bool)> {
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS]);
    let msg = loop {
        match recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other?,
        }
    };
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: SCM_RIGHTS installed `fd` in our table during the
                // `recvmsg` just above; nothing else knows or owns it, and
                // each received number is taken exactly once here.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok((msg.bytes, fds, msg.flags.contains(MsgFlags::MSG_CTRUNC)))
}

/// Makes `fd` (open with `FD_CLOEXEC` in this process) survive the `exec`
/// of `cmd`'s child only: the flag is cleared in the child, between fork
/// and exec, so no other child of this process inherits the descriptor.
pub(crate) fn keep_fd_in_child(cmd: &mut std::process::Command, fd: RawFd) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and calls
    // only fcntl(2), which is async-signal-safe; it allocates nothing and
    // touches no lock. `fd` stays open in the parent until the child has
    // been spawned (the caller keeps its OwnedFd across `spawn`).
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
