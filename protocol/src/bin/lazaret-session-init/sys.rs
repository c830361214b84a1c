//! The system calls `lazaret-session-init` needs that std does not wrap:
//! the subreaper flag, a signalfd, a vfork-style spawn, waitpid, kill,
//! process groups and descriptor hygiene. Everything unsafe in the program is here.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Makes this process the child subreaper of its descendants: an orphan
/// among them is re-parented to it, not to the container's init.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag; no pointers.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A signal set.
pub struct SigSet(libc::sigset_t);

impl SigSet {
    /// The empty set.
    pub fn empty() -> SigSet {
        // SAFETY: sigset_t is plain data; sigemptyset initialises it.
        let mut set: libc::sigset_t = unsafe { zeroed() };
        // SAFETY: `set` is a live sigset_t owned by this frame.
        unsafe { libc::sigemptyset(&mut set) };
        SigSet(set)
    }

    /// Adds `signal` (numbers glibc reserves for itself are refused and
    /// skipped).
    pub fn add(&mut self, signal: libc::c_int) {
        // SAFETY: the set is initialised; sigaddset validates the number.
        unsafe { libc::sigaddset(&mut self.0, signal) };
    }
}

/// Blocks `set` for this single-threaded process, returning the previous
/// mask, and a blocking signalfd that reads the blocked signals.
pub fn block_into_signalfd(set: &SigSet) -> io::Result<(OwnedFd, SigSet)> {
    let mut old = SigSet::empty();
    // SAFETY: both sets are initialised sigset_t values owned by the caller
    // and this frame.
    let rc = unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set.0, &mut old.0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: -1 asks for a new descriptor; `set` is initialised.
    let fd = unsafe { libc::signalfd(-1, &set.0, libc::SFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: signalfd just returned this descriptor; nothing else owns it.
    Ok((unsafe { OwnedFd::from_raw_fd(fd) }, old))
}

/// The next signal from a blocking signalfd.
pub fn read_signal(signalfd: &OwnedFd) -> io::Result<i32> {
    loop {
        // SAFETY: signalfd_siginfo is plain data; all-zero is a valid value.
        let mut info: libc::signalfd_siginfo = unsafe { zeroed() };
        let want = size_of::<libc::signalfd_siginfo>();
        // SAFETY: the buffer is `info`, exactly `want` writable bytes, and
        // the descriptor is open for the borrow's duration.
        let n = unsafe { libc::read(signalfd.as_raw_fd(), (&raw mut info).cast(), want) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n as usize != want {
            return Err(io::Error::other("short read from the signalfd"));
        }
        return Ok(info.ssi_signo as i32);
    }
}

/// The identity the agent takes before it execs (see
/// `lazaret_protocol::session::USER_OPTION`).
pub struct Identity<'a> {
    /// uid.
    pub uid: libc::uid_t,
    /// Primary gid.
    pub gid: libc::gid_t,
    /// Supplementary groups.
    pub groups: &'a [libc::gid_t],
}

/// Why the child of [`spawn`] did not exec, besides a failed exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Taking the agent's identity failed (setgroups, the bounding set,
    /// setresgid, setresuid, capset, or the ids read back wrong).
    Identity,
    /// Entering the working directory failed.
    Directory,
    /// Executing the command failed.
    Exec,
}

/// How to start the agent: what [`spawn`] needs, all prepared before the
/// child exists (the child may not allocate).
pub struct Spawn<'a> {
    /// The paths to try, in order.
    pub candidates: &'a [CString],
    /// The agent's argv.
    pub argv: &'a [CString],
    /// The agent's environment (`NAME=VALUE`).
    pub envp: &'a [CString],
    /// The identity to take first, if any.
    pub identity: Option<&'a Identity<'a>>,
    /// The directory to enter after that, if any.
    pub cwd: Option<&'a CString>,
    /// Whether `candidates` came from a PATH search (a missing or denied
    /// candidate then lets the search go on, as execvp).
    pub searched: bool,
    /// Whether the agent's group becomes the terminal's foreground one.
    pub terminal: bool,
    /// The signal mask the agent gets.
    pub mask: &'a SigSet,
    /// The child's exit status when no candidate exists.
    pub not_found: i32,
    /// The child's exit status when a candidate could not be executed.
    pub not_executable: i32,
    /// The child's exit status when the identity or directory failed.
    pub failed: i32,
}

/// What the child and this process share until the child execs: the
/// child only reads the pointers and writes `errno`.
#[repr(C)]
struct Shared {
    candidates: *const *const libc::c_char,
    candidate_count: usize,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    change_identity: bool,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: *const libc::gid_t,
    group_count: usize,
    /// Null when the working directory stays.
    cwd: *const libc::c_char,
    /// 0: exec failed (or nothing failed); 1: identity; 2: directory.
    stage: libc::c_int,
    searched: bool,
    terminal: bool,
    mask: *const libc::sigset_t,
    not_found: libc::c_int,
    not_executable: libc::c_int,
    failed: libc::c_int,
    /// 0 while the exec has not failed; else the errno that ended the search.
    errno: libc::c_int,
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit data words per set.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// capset(2)'s header (`struct __user_cap_header_struct`; the libc crate
/// does not define it).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// capset(2)'s data (`struct __user_cap_data_struct`).
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Takes the agent's identity in the child of [`spawn`]: groups, an empty
/// capability bounding set (while CAP_SETPCAP is still held), gid, uid
/// (all three of each, so nothing can switch back), then no capabilities
/// in any set; the ids are read back. Raw system calls, not glibc's
/// wrappers: those would try to signal the parent's other threads, and
/// this child shares the parent's memory. Returns false on any failure.
///
/// # Safety
/// `s.groups` points to `s.group_count` gids that stay alive.
unsafe fn take_identity(s: &Shared) -> bool {
    // SAFETY: the caller guarantees `groups`; the rest are integers.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, s.group_count, s.groups) != 0 {
            return false;
        }
        let mut cap: libc::c_ulong = 0;
        loop {
            if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                // EINVAL: past the last capability this kernel knows.
                if *libc::__errno_location() == libc::EINVAL && cap > 0 {
                    break;
                }
                return false;
            }
            cap += 1;
        }
        if libc::syscall(libc::SYS_setresgid, s.gid, s.gid, s.gid) != 0 || libc::syscall(libc::SYS_setresuid, s.uid, s.uid, s.uid) != 0 {
            return false;
        }
        let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
        let data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
        if libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) != 0 {
            return false;
        }
        libc::getuid() == s.uid && libc::geteuid() == s.uid && libc::getgid() == s.gid && libc::getegid() == s.gid
    }
}

/// The child of [`spawn`]: its own process group (the foreground one on a
/// terminal), the agent's identity and working directory, the agent's
/// signal mask, then exec. It shares this process's memory and runs on a
/// stack of its own while the parent waits, so it makes plain system calls
/// only (no allocation, no locks).
extern "C" fn spawn_child(arg: *mut libc::c_void) -> libc::c_int {
    let shared = arg.cast::<Shared>();
    // SAFETY: `arg` is the `Shared` of the suspended parent (CLONE_VFORK),
    // valid until this child execs or exits; every pointer in it points to
    // memory the parent keeps alive for as long.
    unsafe {
        let s = &*shared;
        libc::setpgid(0, 0);
        if s.terminal {
            // SIGTTOU is still blocked, so a background group may do this.
            libc::tcsetpgrp(0, libc::getpid());
        }
        let stage_failed = |stage: libc::c_int| {
            let errno = *libc::__errno_location();
            std::ptr::write_volatile(&raw mut (*shared).stage, stage);
            std::ptr::write_volatile(&raw mut (*shared).errno, if errno == 0 { libc::EPERM } else { errno });
            libc::_exit(s.failed)
        };
        if s.change_identity && !take_identity(s) {
            stage_failed(1);
        }
        if !s.cwd.is_null() && libc::chdir(s.cwd) != 0 {
            stage_failed(2);
        }
        libc::sigprocmask(libc::SIG_SETMASK, s.mask, std::ptr::null_mut());
        let (mut denied, mut failure) = (false, 0);
        for i in 0..s.candidate_count {
            libc::execve(*s.candidates.add(i), s.argv, s.envp);
            match *libc::__errno_location() {
                libc::EACCES if s.searched => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG | libc::ELOOP if s.searched => {}
                errno => {
                    failure = errno;
                    break;
                }
            }
        }
        let errno = if failure != 0 {
            failure
        } else if denied {
            libc::EACCES
        } else {
            libc::ENOENT
        };
        std::ptr::write_volatile(&raw mut (*shared).errno, errno);
        libc::_exit(if matches!(errno, libc::ENOENT | libc::ENOTDIR) { s.not_found } else { s.not_executable })
    }
}

/// Starts the agent the way posix_spawn does: `clone(CLONE_VM |
/// CLONE_VFORK)`, so that no copy of this process's address space is made
/// (in gVisor a fork followed by exec costs two new address spaces, a
/// vfork one; measured inside runsc: fork+exec of /bin/true 23-40 ms,
/// vfork+exec 8-15 ms on a loaded 2-core host). Returns the child's PID and,
/// when nothing could be executed, the stage and errno that ended it (the
/// child has then exited with `not_found`, `not_executable` or `failed`).
pub fn spawn(plan: &Spawn<'_>) -> io::Result<(libc::pid_t, Option<(Stage, i32)>)> {
    let candidates: Vec<*const libc::c_char> = plan.candidates.iter().map(|c| c.as_ptr()).collect();
    let mut argv: Vec<*const libc::c_char> = plan.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = plan.envp.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    let no_groups: [libc::gid_t; 0] = [];
    let groups = plan.identity.map_or(&no_groups[..], |i| i.groups);
    let mut shared = Shared {
        candidates: candidates.as_ptr(),
        candidate_count: candidates.len(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        change_identity: plan.identity.is_some(),
        uid: plan.identity.map_or(0, |i| i.uid),
        gid: plan.identity.map_or(0, |i| i.gid),
        groups: groups.as_ptr(),
        group_count: groups.len(),
        cwd: plan.cwd.map_or(std::ptr::null(), |c| c.as_ptr()),
        stage: 0,
        searched: plan.searched,
        terminal: plan.terminal,
        mask: &plan.mask.0,
        not_found: plan.not_found,
        not_executable: plan.not_executable,
        failed: plan.failed,
        errno: 0,
    };
    const STACK: usize = 128 * 1024;
    let mut stack = vec![0u8; STACK];
    // The stack grows down on every Linux target Lazaret builds for; the
    // top is 16-byte aligned as the ABI wants.
    let top = ((stack.as_mut_ptr() as usize + STACK) & !15) as *mut libc::c_void;
    // SAFETY: `spawn_child` only makes system calls, on its own stack
    // `stack`, reading `shared` and the arrays it points to, which all
    // outlive the call: CLONE_VFORK suspends this thread until the child
    // has exec'd or exited. The process is single-threaded.
    let pid = unsafe { libc::clone(spawn_child, top, libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, (&raw mut shared).cast()) };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the child has written `errno` and `stage`, if at all, before
    // it exited.
    let (errno, stage) = unsafe { (std::ptr::read_volatile(&raw const shared.errno), std::ptr::read_volatile(&raw const shared.stage)) };
    drop(stack);
    let stage = match stage {
        1 => Stage::Identity,
        2 => Stage::Directory,
        _ => Stage::Exec,
    };
    Ok((pid, (errno != 0).then_some((stage, errno))))
}

/// Whether descriptor 0 is a terminal.
pub fn stdin_is_terminal() -> bool {
    // SAFETY: isatty only inspects the descriptor number.
    unsafe { libc::isatty(0) == 1 }
}

/// Reads descriptor `fd` to its end and closes it; `None` when it is not
/// open (the coordinator passed no credentials). At most 1 MiB is read.
pub fn take_credentials(fd: RawFd) -> Option<io::Result<Vec<u8>>> {
    // SAFETY: F_GETFD only inspects the descriptor number.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the descriptor is open (checked above) and nothing else in
    // this process owns it: the coordinator passed it for this reading.
    let file = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut blob = Vec::new();
    use std::io::Read;
    Some(file.take(1 << 20).read_to_end(&mut blob).map(|_| blob))
}

/// This process's effective uid.
pub fn effective_uid() -> libc::uid_t {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// This process's PID.
pub fn own_pid() -> libc::pid_t {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() }
}

/// How a child changed.
pub enum Reaped {
    /// Child `pid` ended: its exit code, or the signal that killed it.
    Ended { pid: libc::pid_t, code: Option<i32>, signal: Option<i32> },
    /// Children exist, none has ended yet.
    Running,
    /// No children are left.
    None,
}

/// Reaps one ended child without waiting.
pub fn reap_one() -> io::Result<Reaped> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a live int this call writes.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            let (code, signal) = if libc::WIFEXITED(status) {
                (Some(libc::WEXITSTATUS(status)), None)
            } else if libc::WIFSIGNALED(status) {
                (None, Some(libc::WTERMSIG(status)))
            } else {
                (None, None)
            };
            return Ok(Reaped::Ended { pid, code, signal });
        }
        if pid == 0 {
            return Ok(Reaped::Running);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ECHILD) => return Ok(Reaped::None),
            _ => return Err(err),
        }
    }
}

/// Sends `signal` to process `pid` (errors, e.g. a process already gone,
/// are the caller's to ignore).
pub fn kill(pid: libc::pid_t, signal: i32) -> io::Result<()> {
    // SAFETY: plain integer arguments.
    if unsafe { libc::kill(pid, signal) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Points descriptors 0, 1 and 2 at /dev/null and closes every other
/// descriptor but `keep`: this process then holds none of the agent's
/// streams, so a reader sees their end when the agent's side closes them.
pub fn drop_stdio_except(keep: &[RawFd]) {
    let null = c"/dev/null";
    // Not close-on-exec: with 0, 1 or 2 closed, the open itself lands
    // there, and dup2 onto itself would leave that flag set.
    // SAFETY: a NUL-terminated literal path; the result is checked.
    let fd = unsafe { libc::open(null.as_ptr(), libc::O_RDWR) };
    if fd >= 0 {
        for target in 0..3 {
            // SAFETY: both are descriptor numbers; dup2 onto 0-2 replaces them.
            unsafe { libc::dup2(fd, target) };
        }
        if fd > 2 {
            // SAFETY: `fd` was opened above and is not used after this.
            unsafe { libc::close(fd) };
        }
    }
    let mut open: Vec<RawFd> = match std::fs::read_dir("/proc/self/fd") {
        Ok(entries) => entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        Err(_) => return,
    };
    open.retain(|&n| n > 2 && !keep.contains(&n));
    for n in open {
        // SAFETY: closing descriptor numbers this process does not use any
        // more (the directory listing's own descriptor is gone by now or
        // fails harmlessly with EBADF).
        unsafe { libc::close(n) };
    }
}
