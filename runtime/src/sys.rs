//! The crate's syscall layer: every raw call and every `unsafe` block of the
//! crate is here, each in a small safe function that says why it is sound.
//! The rest of the crate only calls these (the crate root denies
//! `unsafe_code` everywhere else).

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::process::Command;

use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
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

/// Makes the child of `cmd` the leader of a new session whose controlling
/// terminal is the terminal on its descriptor 0 (after stdio is set up), so
/// that the kernel sends it that terminal's signals: SIGWINCH when the
/// master's window size changes, SIGINT/SIGQUIT/SIGTSTP for the keys, and
/// SIGHUP when the master is closed.
pub(crate) fn controlling_terminal_in_child(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the forked child before exec and only
    // makes raw setsid(2) and ioctl(2) calls, which are async-signal-safe,
    // and builds an io::Error from errno (no allocation).
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

// ---------------------------------------------------------------------------
// The host command's child (`hostexec`)
// ---------------------------------------------------------------------------

use crate::hostexec::ExecStage;

/// Everything the host command's child does between its creation and exec,
/// prepared in full before: the child of a multi-threaded process may only
/// make async-signal-safe calls, so it allocates nothing and builds no path.
/// Every descriptor here is 3 or above (the child's stdio goes below).
pub(crate) struct HostChildPlan<'a> {
    /// Paths to try with `execve`, in order (argv[0] resolved against PATH).
    pub(crate) programs: &'a [std::ffi::CString],
    /// The argument vector, null-terminated; its strings live in the caller.
    pub(crate) argv: &'a [*const libc::c_char],
    /// The environment, null-terminated; its strings live in the caller.
    pub(crate) envp: &'a [*const libc::c_char],
    /// The command's cgroup directory, which the child is created in
    /// (`clone3` with `CLONE_INTO_CGROUP`).
    pub(crate) cgroup_dir: RawFd,
    /// `cgroup.procs` of the command's cgroup, open for writing: where a
    /// child created by plain `fork` (kernels without `CLONE_INTO_CGROUP`)
    /// moves itself first.
    pub(crate) cgroup_procs: RawFd,
    /// A mount namespace to enter first, if any.
    pub(crate) mount_ns: Option<RawFd>,
    /// The user, group and supplementary groups to run as (never 0).
    pub(crate) uid: libc::uid_t,
    /// See `uid`.
    pub(crate) gid: libc::gid_t,
    /// See `uid`.
    pub(crate) groups: &'a [libc::gid_t],
    /// `/dev/null`, read-only.
    pub(crate) stdin: RawFd,
    /// The write end of the stdout pipe.
    pub(crate) stdout: RawFd,
    /// The write end of the stderr pipe.
    pub(crate) stderr: RawFd,
    /// The working directory.
    pub(crate) cwd: RawFd,
    /// The write end of the close-on-exec error pipe: the child writes
    /// (stage, errno) there if anything fails before exec.
    pub(crate) error_pipe: RawFd,
    /// The child's end of the go-ahead socket pair: once set up, the child
    /// waits for one byte on it before `execve`; end of file (the parent
    /// let go of its end) or an error ends the child instead.
    pub(crate) gate: RawFd,
    /// The parent's end of the go-ahead socket pair, which the child closes
    /// first (so that the parent's close is an end of file to it).
    pub(crate) gate_parent_end: RawFd,
    /// The PID of the creating process, to notice that it died before the
    /// child armed its parent-death signal.
    pub(crate) parent: libc::pid_t,
    /// Highest descriptor number + 1 to close if `close_range` is missing (0
    /// where it is known to work).
    pub(crate) fd_limit: libc::c_int,
}

/// One more than the highest signal number on Linux.
const NSIG: libc::c_int = 65;

/// Length of the error report the child writes: stage (u32), errno (i32).
pub(crate) const CHILD_REPORT_LEN: usize = 8;

/// `clone3(2)`'s argument (`struct clone_args`, version 2: with `cgroup`).
#[repr(C, align(8))]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_INTO_CGROUP` (Linux >= 5.7; not in every libc yet).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The host command's child, created and not yet reaped.
pub(crate) struct HostChild {
    /// Its PID.
    pub(crate) pid: libc::pid_t,
    /// Its pidfd, if the kernel gave one with the child (`CLONE_PIDFD`).
    pub(crate) pidfd: Option<OwnedFd>,
}

/// Why [`spawn_host_child`] made no child.
#[derive(Debug)]
pub(crate) enum SpawnError {
    /// The kernel refused to create the child in the command's cgroup
    /// (permissions, an `nsdelegate` boundary, a cgroup that cannot take
    /// processes): the error the child's own join would have met.
    Cgroup(std::io::Error),
    /// `clone3`/`fork` failed otherwise (no memory, too many processes).
    Sys(std::io::Error),
}

/// Creates the host command's child, which sets itself up as `plan` says
/// and execs the program.
///
/// The child is created directly in the command's cgroup: `clone3` with
/// `CLONE_INTO_CGROUP` (and `CLONE_PIDFD`). That is atomic, and it is
/// fast: moving a process by a write to `cgroup.procs` takes the cgroup
/// core's thread-group lock for writing, which waits for an RCU grace
/// period (milliseconds, the bulk of a short command's cost). On kernels
/// without it (`ENOSYS`, `E2BIG`, `EINVAL` before Linux 5.7) it falls back
/// to `fork` and the child writes itself into `cgroup.procs` before it does
/// anything else. If the child fails before exec, it writes `(stage,
/// errno)` to `plan.error_pipe` and exits with 127.
pub(crate) fn spawn_host_child(plan: &HostChildPlan<'_>) -> Result<HostChild, SpawnError> {
    if plan.argv.last().is_none_or(|p| !p.is_null()) || plan.envp.last().is_none_or(|p| !p.is_null()) {
        return Err(SpawnError::Sys(std::io::Error::new(std::io::ErrorKind::InvalidInput, "argv and envp must be null-terminated")));
    }
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: plan.cgroup_dir as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without CLONE_VM (nor CLONE_VFORK, CLONE_THREAD or a
    // new stack) is fork(2) with more options: the child gets a copy of the
    // address space and continues on its copy of this stack. That is sound
    // as long as the child only makes async-signal-safe calls until it
    // execs or exits: `host_child` makes raw system calls only, on data
    // prepared before (no allocation, no locks, no panics, none of glibc's
    // thread-aware wrappers such as setuid, which would talk to threads the
    // child does not have), and the child ends with `_exit`, never
    // returning into Rust code of the parent's state. `args` and `pidfd`
    // are live locals of the size the call is given.
    let rc = unsafe { libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>()) };
    if rc == 0 {
        // SAFETY: we are the new child, in its cgroup already; see above.
        unsafe { child_main(plan, true) }
    }
    if rc > 0 {
        // SAFETY: CLONE_PIDFD stored a new descriptor (close-on-exec) that
        // nothing else owns; the kernel writes it whenever the call succeeds.
        let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
        return Ok(HostChild { pid: rc as libc::pid_t, pidfd });
    }
    let error = std::io::Error::last_os_error();
    match error.raw_os_error() {
        Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL) => {}
        Some(libc::EAGAIN | libc::ENOMEM | libc::EINTR) => return Err(SpawnError::Sys(error)),
        _ => return Err(SpawnError::Cgroup(error)),
    }
    // SAFETY: fork(2) in a multi-threaded process is sound as long as the
    // child only makes async-signal-safe calls until it execs or exits;
    // see `host_child`, as above.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SpawnError::Sys(std::io::Error::last_os_error()));
    }
    if pid == 0 {
        // SAFETY: we are the freshly forked child; see above.
        unsafe { child_main(plan, false) }
    }
    Ok(HostChild { pid, pidfd: None })
}

/// The child's whole life: set up, exec, or report the failure and exit.
///
/// # Safety
///
/// Call only in a new child (fork or clone3 without `CLONE_VM`), before exec.
unsafe fn child_main(plan: &HostChildPlan<'_>, in_cgroup: bool) -> ! {
    // SAFETY: we are that child (the caller's contract).
    let (stage, errno) = unsafe { host_child(plan, in_cgroup) };
    let mut report = [0u8; CHILD_REPORT_LEN];
    report[..4].copy_from_slice(&(stage as u32).to_ne_bytes());
    report[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is a
    // live local.
    unsafe {
        libc::write(plan.error_pipe, report.as_ptr().cast(), report.len());
        libc::_exit(127)
    }
}

fn errno() -> i32 {
    nix::errno::Errno::last_raw()
}

/// The child's side of [`spawn_host_child`]. Returns only on failure, with
/// the stage that failed and its errno. `in_cgroup`: the child was created
/// in the command's cgroup; otherwise it joins it first.
///
/// The credential calls are raw system calls, not glibc's wrappers: those
/// apply the change to every thread glibc knows of, and a child made by a
/// raw `clone3` still believes in its parent's threads. In the child, the
/// calling thread is the whole process, so the raw calls change it all.
///
/// # Safety
///
/// Call only in the child of a fork, before exec: it changes the process's
/// credentials, namespaces, signals and descriptors.
unsafe fn host_child(plan: &HostChildPlan<'_>, in_cgroup: bool) -> (ExecStage, i32) {
    macro_rules! check {
        ($stage:expr, $rc:expr) => {
            if $rc < 0 {
                return ($stage, errno());
            }
        };
    }
    // SAFETY: (for the whole block) every call is a raw, async-signal-safe
    // system call on descriptors and memory prepared before the fork that
    // stay valid in the child (its own copy of the address space).
    unsafe {
        // The parent's end of the go-ahead is the parent's alone.
        libc::close(plan.gate_parent_end);
        // No controlling terminal, a session and process group of its own.
        check!(ExecStage::Session, libc::setsid());
        if !in_cgroup {
            // Into the command's cgroup before anything else can fork.
            let zero = b"0";
            let n = libc::write(plan.cgroup_procs, zero.as_ptr().cast(), zero.len());
            if n != 1 {
                return (ExecStage::Cgroup, if n < 0 { errno() } else { libc::EIO });
            }
        }
        if let Some(ns) = plan.mount_ns {
            check!(ExecStage::MountNamespace, libc::setns(ns, libc::CLONE_NEWNS));
        }
        check!(ExecStage::Groups, libc::syscall(libc::SYS_setgroups, plan.groups.len(), plan.groups.as_ptr()));
        check!(ExecStage::Gid, libc::syscall(libc::SYS_setresgid, plan.gid, plan.gid, plan.gid));
        check!(ExecStage::Uid, libc::syscall(libc::SYS_setresuid, plan.uid, plan.uid, plan.uid));
        // Never exec with any identity of root left: check what stuck.
        let (mut r, mut e, mut s) = (0, 0, 0);
        check!(ExecStage::VerifyIdentity, libc::getresuid(&mut r, &mut e, &mut s));
        if r != plan.uid || e != plan.uid || s != plan.uid {
            return (ExecStage::VerifyIdentity, libc::EPERM);
        }
        let (mut r, mut e, mut s) = (0, 0, 0);
        check!(ExecStage::VerifyIdentity, libc::getresgid(&mut r, &mut e, &mut s));
        if r != plan.gid || e != plan.gid || s != plan.gid {
            return (ExecStage::VerifyIdentity, libc::EPERM);
        }
        let n = libc::getgroups(0, std::ptr::null_mut());
        if n < 0 || n as usize != plan.groups.len() {
            return (ExecStage::VerifyIdentity, libc::EPERM);
        }
        // Had any capability survived, this would succeed.
        if libc::syscall(libc::SYS_setuid, 0 as libc::uid_t) == 0 {
            return (ExecStage::VerifyIdentity, libc::EPERM);
        }
        libc::umask(0o022);
        // After the credential change, which clears it. The parent check
        // closes the race with a parent that died before the prctl.
        check!(ExecStage::DeathSignal, libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0));
        if libc::getppid() != plan.parent {
            return (ExecStage::DeathSignal, libc::ESRCH);
        }
        // Default dispositions (ignored signals would stay ignored across
        // exec; handlers are reset by exec anyway), then an empty mask: the
        // caller blocks everything for its signalfd. The raw system call,
        // because glibc refuses its two internal signals, which a parent
        // may have left ignored too. SIG_DFL with no flags and an empty
        // mask is an all-zero kernel `sigaction` whatever its layout.
        let default = [0u64; 4];
        for sig in 1..NSIG {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(libc::SYS_rt_sigaction, sig, default.as_ptr(), std::ptr::null_mut::<u64>(), 8usize);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        check!(ExecStage::Signals, libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()));
        check!(ExecStage::Stdio, libc::dup2(plan.stdin, 0));
        check!(ExecStage::Stdio, libc::dup2(plan.stdout, 1));
        check!(ExecStage::Stdio, libc::dup2(plan.stderr, 2));
        // Every other descriptor closes at exec; the error pipe and the
        // working directory are still needed until then.
        if libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC) < 0 {
            for fd in 3..plan.fd_limit {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                    check!(ExecStage::Descriptors, libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC));
                }
            }
        }
        // As the developer: a directory they may not enter is refused.
        check!(ExecStage::WorkingDirectory, libc::fchdir(plan.cwd));
        // Everything is set up: nothing of the command runs before the
        // parent says so (after what must precede it, e.g. an fsync).
        let mut go = 0u8;
        loop {
            let n = libc::read(plan.gate, (&mut go as *mut u8).cast(), 1);
            if n == 1 {
                break;
            }
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            return (ExecStage::GoAhead, if n < 0 { errno() } else { libc::ECANCELED });
        }
        // Like execvp's search, without its fallback to a shell.
        let mut last = libc::ENOENT;
        let mut denied = false;
        for program in plan.programs {
            libc::execve(program.as_ptr(), plan.argv.as_ptr(), plan.envp.as_ptr());
            last = errno();
            match last {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return (ExecStage::Exec, last),
            }
        }
        (ExecStage::Exec, if denied { libc::EACCES } else { last })
    }
}

/// Whether `close_range(2)` with `CLOSE_RANGE_CLOEXEC` works here (since
/// Linux 5.11), tried once on `probe`, a descriptor that is close-on-exec
/// already (so the call changes nothing).
pub(crate) fn has_close_range_cloexec(probe: BorrowedFd<'_>) -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let fd = probe.as_raw_fd() as libc::c_uint;
        // SAFETY: close_range with CLOSE_RANGE_CLOEXEC closes nothing; it
        // only sets FD_CLOEXEC on `fd`, which has it already.
        unsafe { libc::syscall(libc::SYS_close_range, fd, fd, libc::CLOSE_RANGE_CLOEXEC) == 0 }
    })
}

/// `pidfd_open(2)`: a descriptor that becomes readable when the process
/// `pid` (a child of ours, not yet reaped) exits. `ENOSYS` before Linux 5.3.
pub(crate) fn pidfd_open(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes two integers and returns a new descriptor
    // or -1; no memory is involved.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just installed this descriptor (close-on-exec)
    // and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}
