//! The crate's syscall layer: every raw call and every `unsafe` block of the
//! crate is here, each in a small safe function that says why it is sound.
//! The rest of the crate only calls these (the crate root denies
//! `unsafe_code` everywhere else).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::Command;

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

/// How long [`settled_thread_count`] waits for exiting threads to go.
const THREAD_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// [`thread_count`], once threads that are already exiting have gone: a
/// thread that was joined can still be listed in `/proc/self/task` for a
/// moment (join returns when the thread clears its TID, before the kernel
/// has released it). Polls for up to a second while more than one thread is
/// listed; a thread that really lives on is still counted after that.
pub(crate) fn settled_thread_count() -> usize {
    let deadline = std::time::Instant::now() + THREAD_EXIT_WAIT;
    loop {
        let n = thread_count();
        if n <= 1 || std::time::Instant::now() >= deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
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
    let threads = settled_thread_count();
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

/// Makes `cmd`'s child start its program with exactly its stdio and the
/// descriptors `fds` (numbers of this process, close-on-exec here, kept
/// open by the caller until `spawn` returns): between fork and exec, the
/// child marks every descriptor from 3 up close-on-exec
/// (`close_range(CLOSE_RANGE_CLOEXEC)`), whatever this process inherited or
/// a library left open, and then clears the flag on `fds` only. Numbers
/// below 3 are refused (the child's stdio goes there).
pub(crate) fn only_these_in_child(cmd: &mut Command, fds: Vec<RawFd>) -> std::io::Result<()> {
    use std::os::unix::process::CommandExt;
    if fds.iter().any(|&fd| fd < 3) {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "a descriptor to pass is below 3"));
    }
    // SAFETY: the closure runs in the forked child before exec; it only
    // makes raw close_range(2) and fcntl(2) calls, which are
    // async-signal-safe, reads the moved-in vector (no allocation), and
    // builds an io::Error from errno (no allocation).
    unsafe {
        cmd.pre_exec(move || {
            let rc = libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC);
            if rc < 0 {
                // Kernels before 5.11: one descriptor at a time.
                for fd in 3..4096 {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags >= 0 {
                        libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                    }
                }
            }
            for &fd in &fds {
                if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    Ok(())
}
