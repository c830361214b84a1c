//! Running an approved escalation command on the host, as the developer,
//! with nothing of it left behind (NoOrphanHostProcess).
//!
//! [`spawn`] starts the command; [`HostProcess::run`] streams its output to
//! a sink until it ends, is stopped, or times out, and returns only once
//! every process of the command is gone and its cgroup removed.
//! [`prepare`] and [`HeldProcess::start`] are [`spawn`] in two steps: the
//! process is made and set up completely, then waits before `execve` until
//! the caller lets it go (after what must come first, such as an fsync of
//! the journal line recording the command's start), or is killed unrun.
//!
//! ```no_run
//! use lazaret_runtime::hostexec::{self, End, HostCommand, Limits, StopSignal, Stream};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cwd = std::fs::File::open("/home/dev/project")?.into(); // openat2 beneath, really
//! let cmd = HostCommand {
//!     argv: vec!["git".into(), "push".into()],
//!     cwd,
//!     uid: 1000,
//!     gid: 1000,
//!     groups: vec![1000],
//!     env: vec![("PATH".into(), "/usr/bin:/bin".into()), ("HOME".into(), "/home/dev".into())],
//!     cgroup: hostexec::cgroup2_mount()?.join("lazaret/0123abcd/escalation-42"),
//!     mount_ns: None,
//! };
//! let stop = StopSignal::new()?; // a clone goes to whoever cancels
//! let process = hostexec::spawn(cmd)?; // HostExecError::Exec: not found, denied, ...
//! let limits = Limits { deadline: std::time::Instant::now() + std::time::Duration::from_secs(600), output_cap: 16 << 20 };
//! let finished = process.run(limits, &stop, |stream, chunk| {
//!     // Forward the chunk to the client; an error here kills the command.
//!     let _ = (stream == Stream::Stdout, chunk);
//!     Ok(())
//! })?;
//! if let End::Exited(code) = finished.end {
//!     println!("exit {code}, truncated: {}", finished.truncated);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # What the command gets
//!
//! - **Identity:** exactly the given uid, gid and supplementary groups,
//!   never root: [`spawn`] refuses uid 0, gid 0 and supplementary group 0
//!   ([`HostExecError::Root`]), and the child checks after the switch that
//!   no root identity stuck (real, effective and saved IDs, the group list,
//!   and that `setuid(0)` now fails) before it execs. No capability survives
//!   the switch (no `SECBIT_KEEP_CAPS`).
//! - **Environment:** exactly [`HostCommand::env`], nothing inherited. The
//!   caller composes it (the documented minimal set plus what the rule
//!   allows); nothing the agent sent belongs there.
//! - **Program:** `argv[0]` as given if it contains a `/` (relative to the
//!   working directory); otherwise searched in the absolute directories of
//!   the environment's `PATH`, in order, like `execvp` but without its
//!   fallback to a shell (a file without a `#!` line fails with `ENOEXEC`)
//!   and skipping empty and relative `PATH` entries (they would resolve in
//!   the workspace). No shell is involved anywhere: argv is executed as
//!   given.
//! - **Working directory:** the directory of [`HostCommand::cwd`], a
//!   descriptor the caller opened safely (`openat2` beneath the workspace);
//!   the child `fchdir`s to it after switching to the developer, so a
//!   directory the developer may not enter is refused.
//! - **stdin** `/dev/null`; **stdout** and **stderr** two pipes; every other
//!   descriptor is closed at exec. A new session (`setsid`): no controlling
//!   terminal. Default signal dispositions and an empty signal mask (the
//!   coordinator blocks every signal for its signalfd; inherited, the mask
//!   would make the command deaf to SIGINT/SIGTERM). `umask` 022.
//!   `PR_SET_PDEATHSIG(SIGKILL)`: the direct child dies with the thread that
//!   spawned it, so call [`spawn`] on a thread that lives until
//!   [`HostProcess::run`] returns (the same thread, typically).
//! - **Mount namespace:** the given one ([`HostCommand::mount_ns`], the
//!   host's), entered before anything resolves a path. Every other namespace
//!   is the caller's.
//!
//! # Cgroup: the whole tree, and nothing but it
//!
//! The command runs in a cgroup v2 directory of its own,
//! [`HostCommand::cgroup`], which [`spawn`] creates (and its missing
//! parents). The child is created in it (`clone3` with `CLONE_INTO_CGROUP`,
//! Linux >= 5.7; older kernels: `fork`, and the child joins it before it
//! can fork itself). Every descendant is in
//! it too, including those that called `setsid`, daemonized or were
//! reparented: a process cannot leave a cgroup without write access to the
//! common ancestor's `cgroup.procs`, which is root's. When the run ends, in
//! every case (the command exited, [`StopSignal`] fired, the deadline
//! passed, the sink failed), the whole cgroup is killed: `cgroup.kill`
//! (Linux >= 5.14) or, where it is missing, SIGKILL to every PID in
//! `cgroup.procs` (after freezing the cgroup, if possible), repeated until
//! it is empty. **A command that exits leaves nothing running**: a
//! background process it started (an auto-launched agent, an ssh
//! ControlMaster) is killed with it. `run` waits for `cgroup.events` to say
//! `populated 0` (at most [`CGROUP_EMPTY_TIMEOUT`], else
//! [`HostExecError::CgroupNotEmpty`]) and removes the directory. Dropping a
//! [`HostProcess`] without running it does the same, ignoring errors.
//! What the cgroup cannot cover: work a command asks another, already
//! running daemon to do (`systemd-run --user`, an ssh-agent signing).
//!
//! **Prerequisite: cgroup v2** (the unified hierarchy), at `/sys/fs/cgroup`
//! or, on hybrid systems, `/sys/fs/cgroup/unified`; [`cgroup2_mount`]
//! finds it. A cgroup path outside a cgroup v2 file system fails with
//! [`HostExecError::NoCgroupV2`]. If the caller is in a cgroup namespace and
//! cgroup2 is mounted with `nsdelegate` (systemd does this), the command's
//! cgroup must lie below the caller's cgroup namespace root, or joining it
//! fails (`ENOENT`).
//!
//! # Output
//!
//! Chunks of at most [`READ_CHUNK`] bytes go to the sink as they are read,
//! tagged with their [`Stream`]; no line buffering, bytes exactly as
//! written. A sink that blocks holds the command up once the pipes are
//! full (back-pressure), and a stop or the deadline is noticed when it
//! returns. Past [`Limits::output_cap`] bytes (stdout and stderr together)
//! the rest is read and discarded (the command is not blocked and not
//! killed for it) and [`Finished::truncated`] says so.
//!
//! # Errors before exec
//!
//! A failure in the child before the program runs (program not found,
//! permission denied, a working directory the developer cannot enter, a
//! cgroup it cannot join) comes back from [`spawn`] as
//! [`HostExecError::Exec`] with the stage and errno (over a close-on-exec
//! pipe), never as an exit status.

use std::ffi::CString;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, send, socketpair};
use nix::sys::stat::Mode;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::sys;

/// Largest chunk passed to the sink at once.
pub const READ_CHUNK: usize = 64 * 1024;

/// How long the end of a run waits for the command's cgroup to empty after
/// killing it, before it gives up with [`HostExecError::CgroupNotEmpty`].
pub const CGROUP_EMPTY_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the kill is repeated while waiting for the cgroup to empty.
const KILL_REPEAT: Duration = Duration::from_millis(100);

/// Poll interval while the child's exit cannot be polled (no pidfd).
const NO_PIDFD_TICK: Duration = Duration::from_millis(20);

/// A command to run on the host.
#[derive(Debug)]
pub struct HostCommand {
    /// The argument vector, executed as given; `argv[0]` is searched in
    /// the environment's `PATH` if it has no `/` (see the module docs).
    pub argv: Vec<String>,
    /// The working directory: a directory descriptor the caller opened
    /// safely (e.g. `openat2` with `RESOLVE_BENEATH` in the workspace).
    pub cwd: OwnedFd,
    /// User ID to run as; never 0.
    pub uid: u32,
    /// Group ID to run as; never 0.
    pub gid: u32,
    /// Supplementary groups, exactly these; never 0.
    pub groups: Vec<u32>,
    /// The complete environment, in order; nothing is inherited. Names
    /// must be unique, non-empty, without `=`; no NUL anywhere.
    pub env: Vec<(String, String)>,
    /// A cgroup v2 directory for this command alone (e.g.
    /// `/sys/fs/cgroup/lazaret/<domain>/escalation-<id>`). It must not
    /// exist; [`spawn`] creates it (and missing parents, which it leaves),
    /// the end of the run removes it.
    pub cgroup: PathBuf,
    /// A mount namespace (e.g. the host's) to run the command in, if not
    /// the caller's.
    pub mount_ns: Option<OwnedFd>,
}

/// A stage of the child's set-up between fork and exec; says what failed
/// in [`HostExecError::Exec`].
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecStage {
    /// `setsid`.
    Session = 1,
    /// Joining the command's cgroup.
    Cgroup,
    /// `setns` into [`HostCommand::mount_ns`].
    MountNamespace,
    /// `setgroups`.
    Groups,
    /// `setresgid`.
    Gid,
    /// `setresuid`.
    Uid,
    /// Checking that the new identity stuck and root's is gone.
    VerifyIdentity,
    /// `PR_SET_PDEATHSIG`, or the spawning process died meanwhile.
    DeathSignal,
    /// Resetting the signal mask.
    Signals,
    /// Connecting stdin, stdout and stderr.
    Stdio,
    /// Marking inherited descriptors close-on-exec.
    Descriptors,
    /// `fchdir` to the working directory.
    WorkingDirectory,
    /// `execve` of the program.
    Exec,
    /// Waiting for [`HeldProcess::start`]: the caller dropped the
    /// [`HeldProcess`] instead (only seen if the report is read anyway).
    GoAhead,
}

impl ExecStage {
    const ALL: [ExecStage; 14] = [
        ExecStage::Session,
        ExecStage::Cgroup,
        ExecStage::MountNamespace,
        ExecStage::Groups,
        ExecStage::Gid,
        ExecStage::Uid,
        ExecStage::VerifyIdentity,
        ExecStage::DeathSignal,
        ExecStage::Signals,
        ExecStage::Stdio,
        ExecStage::Descriptors,
        ExecStage::WorkingDirectory,
        ExecStage::Exec,
        ExecStage::GoAhead,
    ];

    fn from_code(code: u32) -> Option<ExecStage> {
        ExecStage::ALL.into_iter().find(|s| *s as u32 == code)
    }

    fn describe(self) -> &'static str {
        match self {
            ExecStage::Session => "starting a new session",
            ExecStage::Cgroup => "joining the command's cgroup",
            ExecStage::MountNamespace => "entering the host's mount namespace",
            ExecStage::Groups => "setting the supplementary groups",
            ExecStage::Gid => "setting the group ID",
            ExecStage::Uid => "setting the user ID",
            ExecStage::VerifyIdentity => "checking that root's identity is gone",
            ExecStage::DeathSignal => "tying the command's life to the coordinator's",
            ExecStage::Signals => "resetting signals",
            ExecStage::Stdio => "connecting stdin, stdout and stderr",
            ExecStage::Descriptors => "closing inherited descriptors",
            ExecStage::WorkingDirectory => "entering the working directory",
            ExecStage::Exec => "executing the program",
            ExecStage::GoAhead => "waiting for the go-ahead to run",
        }
    }
}

impl std::fmt::Display for ExecStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// Why a host command could not be run, or its end not be made certain.
#[derive(Debug, thiserror::Error)]
pub enum HostExecError {
    /// The command would run with root's user or group ID.
    #[error("refusing to run a host command as root ({0}): escalations run as the developer")]
    Root(&'static str),
    /// The command is malformed (empty argv, NUL bytes, bad environment).
    #[error("invalid host command: {0}")]
    Invalid(String),
    /// The child failed before the program ran.
    #[error("{}", exec_message(program, *stage, source))]
    Exec {
        /// `argv[0]`.
        program: String,
        /// What failed.
        stage: ExecStage,
        /// The error (an errno).
        source: std::io::Error,
    },
    /// The cgroup path is not on a cgroup v2 file system.
    #[error(
        "{} is not in a cgroup v2 hierarchy: host escalation needs cgroup v2 (the unified hierarchy, \
         Linux >= 5.14 for cgroup.kill) mounted at /sys/fs/cgroup or /sys/fs/cgroup/unified",
        path.display()
    )]
    NoCgroupV2 {
        /// The cgroup path asked for.
        path: PathBuf,
    },
    /// Creating, reading, killing or removing the cgroup failed.
    #[error("{context} {}: {source}", path.display())]
    Cgroup {
        /// What we were doing.
        context: &'static str,
        /// The cgroup directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Processes of the command were still alive after the kill.
    #[error("processes of the host command are still alive in {} {waited:?} after killing them", path.display())]
    CgroupNotEmpty {
        /// The cgroup directory (left in place).
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// Another system call failed.
    #[error("{context}: {source}")]
    Sys {
        /// What we were doing.
        context: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

fn exec_message(program: &str, stage: ExecStage, source: &std::io::Error) -> String {
    let errno = source.raw_os_error().map(Errno::from_raw);
    match (stage, errno) {
        (ExecStage::Exec, Some(Errno::ENOENT)) if !program.contains('/') => format!("{program}: command not found"),
        (ExecStage::Exec, Some(Errno::ENOENT)) => format!("{program}: no such file"),
        (ExecStage::Exec, Some(Errno::EACCES)) => format!("{program}: permission denied"),
        (ExecStage::Exec, Some(Errno::ENOEXEC)) => {
            format!("{program}: not an executable format (a script needs a #! line; no shell is used)")
        }
        (ExecStage::Cgroup, Some(Errno::ENOENT | Errno::EPERM | Errno::EACCES)) => format!(
            "{program}: {stage} failed: {source} (is the cgroup outside the coordinator's cgroup namespace on an nsdelegate mount?)"
        ),
        _ => format!("{program}: {stage} failed: {source}"),
    }
}

fn sys_err(context: &'static str) -> impl FnOnce(nix::Error) -> HostExecError {
    move |e| HostExecError::Sys { context, source: e.into() }
}

/// Which output stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The command's stdout.
    Stdout,
    /// The command's stderr.
    Stderr,
}

/// Bounds of one run.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// When the command is killed and the run ends with [`End::TimedOut`].
    pub deadline: Instant,
    /// Most bytes of output (stdout and stderr together) passed to the sink.
    pub output_cap: u64,
}

/// How a run ended.
#[derive(Debug)]
pub enum End {
    /// The command exited: its exit code, or 128 + N for death by signal N
    /// (as a shell reports it).
    Exited(i32),
    /// The deadline passed; the command was killed.
    TimedOut,
    /// The [`StopSignal`] fired (cancellation, disconnect, Domain stop);
    /// the command was killed.
    Stopped,
    /// The sink returned this error; the command was killed.
    SinkFailed(std::io::Error),
}

/// The result of [`HostProcess::run`].
#[derive(Debug)]
pub struct Finished {
    /// How it ended.
    pub end: End,
    /// Whether output past [`Limits::output_cap`] was discarded.
    pub truncated: bool,
}

/// Stops runs from any thread: cancellation, a session's disconnect, the
/// Domain's stop. Firing is permanent, and one signal may stop several
/// runs (clones share it).
#[derive(Debug, Clone)]
pub struct StopSignal {
    inner: Arc<StopInner>,
}

#[derive(Debug)]
struct StopInner {
    fired: AtomicBool,
    // Never read: once a byte is in, the read end stays readable and every
    // poll on it wakes.
    read: OwnedFd,
    write: OwnedFd,
}

impl StopSignal {
    /// A signal that has not fired.
    pub fn new() -> Result<StopSignal, HostExecError> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(sys_err("creating the stop pipe"))?;
        Ok(StopSignal { inner: Arc::new(StopInner { fired: AtomicBool::new(false), read, write }) })
    }

    /// Fires the signal: every run waiting on it kills its command and
    /// returns [`End::Stopped`].
    pub fn fire(&self) {
        if !self.inner.fired.swap(true, Ordering::SeqCst) {
            // Cannot fail in a way that matters: the pipe is new and empty.
            let _ = nix::unistd::write(self.inner.write.as_fd(), b"!");
        }
    }

    /// Whether [`StopSignal::fire`] was called.
    pub fn is_fired(&self) -> bool {
        self.inner.fired.load(Ordering::SeqCst)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.inner.read.as_fd()
    }
}

/// Kills a command's whole process tree from any thread.
#[derive(Debug, Clone)]
pub struct Killer {
    cgroup: Arc<Cgroup>,
}

impl Killer {
    /// SIGKILLs every process of the command (its cgroup). The run still
    /// ends normally: [`End::Exited`] with 137 (128 + SIGKILL), unless a
    /// stop or the deadline came first. Does nothing once the cgroup is gone.
    pub fn kill_tree(&self) -> std::io::Result<()> {
        self.cgroup.kill()
    }
}

/// A running host command. Dropping it kills the command's tree and
/// removes its cgroup (best effort; [`HostProcess::run`] reports errors).
#[derive(Debug)]
pub struct HostProcess {
    pid: Pid,
    pidfd: Option<OwnedFd>,
    stdout: OwnedFd,
    stderr: OwnedFd,
    cgroup: Arc<Cgroup>,
    /// The exit status once reaped (shell-style).
    status: Option<i32>,
    /// Whether the tree is dead and the cgroup removed.
    done: bool,
}

/// Starts `cmd` (see the module docs for everything it does). Returns once
/// the program runs, or with the error that kept it from running.
/// [`prepare`] and [`HeldProcess::start`] in one.
pub fn spawn(cmd: HostCommand) -> Result<HostProcess, HostExecError> {
    prepare(cmd)?.start()
}

/// Creates the command's cgroup and its process, which sets itself up
/// completely (session, cgroup, identity, signals, descriptors, working
/// directory) and then waits, before `execve`, for [`HeldProcess::start`].
/// Nothing of the command has run until then; dropping the [`HeldProcess`]
/// instead kills the waiting process and removes the cgroup. This lets a
/// caller do what must precede the command (an fsync of the journal line
/// that records its start) while the process is being made.
///
/// The refusals of [`spawn`] ([`HostExecError::Root`],
/// [`HostExecError::Invalid`], cgroup errors) come from here; a failure of
/// the child's set-up ([`HostExecError::Exec`]) from [`HeldProcess::start`].
pub fn prepare(cmd: HostCommand) -> Result<HeldProcess, HostExecError> {
    if cmd.uid == 0 {
        return Err(HostExecError::Root("uid 0"));
    }
    if cmd.gid == 0 {
        return Err(HostExecError::Root("gid 0"));
    }
    if cmd.groups.contains(&0) {
        return Err(HostExecError::Root("supplementary group 0"));
    }
    let prepared = Prepared::new(&cmd.argv, &cmd.env)?;
    let cgroup = Arc::new(Cgroup::create(&cmd.cgroup)?);
    // From here on, an error must not leave the cgroup behind.
    let mut guard = CgroupGuard(Some(cgroup.clone()));

    let open_err = |context| sys_err(context);
    let procs = above_stdio(
        nix::fcntl::openat(cgroup.dir.as_fd(), "cgroup.procs", OFlag::O_WRONLY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| HostExecError::Cgroup { context: "opening cgroup.procs of", path: cgroup.path.clone(), source: e.into() })?,
    )?;
    let stdin = above_stdio(
        nix::fcntl::open("/dev/null", OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).map_err(open_err("opening /dev/null"))?,
    )?;
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(open_err("creating the stdout pipe"))?;
    let (err_r, err_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(open_err("creating the stderr pipe"))?;
    let (report_r, report_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(open_err("creating the error pipe"))?;
    // The go-ahead: a socket pair, so that a byte sent to a child that
    // already failed is an EPIPE error (MSG_NOSIGNAL), never a SIGPIPE.
    let (gate_w, gate_r) = socketpair(AddressFamily::Unix, SockType::Stream, None, SockFlag::SOCK_CLOEXEC)
        .map_err(open_err("creating the go-ahead socket pair"))?;
    let (out_w, err_w, report_w) = (above_stdio(out_w)?, above_stdio(err_w)?, above_stdio(report_w)?);
    let (gate_w, gate_r) = (above_stdio(gate_w)?, above_stdio(gate_r)?);
    let cwd = above_stdio(cmd.cwd)?;
    let mount_ns = cmd.mount_ns.map(above_stdio).transpose()?;
    let argv = prepared.argv_ptrs();
    let envp = prepared.envp_ptrs();
    let plan = sys::HostChildPlan {
        programs: &prepared.programs,
        argv: &argv,
        envp: &envp,
        cgroup_dir: cgroup.dir.as_raw_fd(),
        cgroup_procs: procs.as_raw_fd(),
        mount_ns: mount_ns.as_ref().map(|f| f.as_raw_fd()),
        uid: cmd.uid,
        gid: cmd.gid,
        groups: &cmd.groups,
        stdin: stdin.as_raw_fd(),
        stdout: out_w.as_raw_fd(),
        stderr: err_w.as_raw_fd(),
        cwd: cwd.as_raw_fd(),
        error_pipe: report_w.as_raw_fd(),
        gate: gate_r.as_raw_fd(),
        gate_parent_end: gate_w.as_raw_fd(),
        parent: nix::unistd::getpid().as_raw(),
        // Only read where close_range is missing (a directory read per
        // spawn otherwise).
        fd_limit: if sys::has_close_range_cloexec(stdin.as_fd()) { 0 } else { highest_open_fd() + 1 },
    };
    let child = sys::spawn_host_child(&plan).map_err(|e| match e {
        sys::SpawnError::Cgroup(source) => HostExecError::Exec { program: cmd.argv[0].clone(), stage: ExecStage::Cgroup, source },
        sys::SpawnError::Sys(source) => HostExecError::Sys { context: "creating the host command's process", source },
    })?;
    let pid = Pid::from_raw(child.pid);
    drop((procs, stdin, out_w, err_w, report_w, gate_r, cwd, mount_ns));
    guard.0 = None;
    // Without a pidfd (Linux < 5.3) the run polls waitpid instead.
    let pidfd = child.pidfd.or_else(|| sys::pidfd_open(pid.as_raw()).ok());
    // From here on, dropping the process cleans up (kills, reaps, removes).
    let process = HostProcess { pid, pidfd, stdout: out_r, stderr: err_r, cgroup, status: None, done: false };
    for fd in [&process.stdout, &process.stderr] {
        nix::fcntl::fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(sys_err("making the output pipes non-blocking"))?;
    }
    Ok(HeldProcess { process, report: report_r, gate: gate_w, program: cmd.argv[0].clone() })
}

/// A host command's process, set up and waiting before `execve` for
/// [`HeldProcess::start`] (see [`prepare`]). Dropping it kills the process
/// (it never runs the program) and removes the cgroup.
#[derive(Debug)]
pub struct HeldProcess {
    process: HostProcess,
    /// The read end of the child's close-on-exec error pipe.
    report: OwnedFd,
    /// The parent's end of the go-ahead socket pair.
    gate: OwnedFd,
    /// `argv[0]`, for errors.
    program: String,
}

impl HeldProcess {
    /// The PID of the waiting process, in the caller's PID namespace.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Lets the process exec the program. Returns once the program runs,
    /// or with the error that kept it from running (its set-up failed, or
    /// the program could not be executed); then nothing of it is left.
    pub fn start(self) -> Result<HostProcess, HostExecError> {
        let HeldProcess { process, report, gate, program } = self;
        loop {
            match send(gate.as_raw_fd(), b"!", MsgFlags::MSG_NOSIGNAL) {
                // EPIPE, ECONNRESET: the child already failed (its report says
                // why) or was killed.
                Ok(_) | Err(Errno::EPIPE | Errno::ECONNRESET) => break,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(HostExecError::Sys { context: "letting the host command run", source: e.into() }),
            }
        }
        drop(gate);
        let failure = match read_report(report) {
            Ok(Some((stage, errno))) => Some(HostExecError::Exec {
                program,
                stage: ExecStage::from_code(stage).unwrap_or(ExecStage::Exec),
                source: std::io::Error::from_raw_os_error(errno),
            }),
            Ok(None) => None,
            Err(source) => Some(HostExecError::Sys { context: "reading the host command's start-up report", source }),
        };
        match failure {
            // Dropping the process kills what is left, reaps it and removes
            // the cgroup.
            Some(error) => Err(error),
            None => Ok(process),
        }
    }
}

impl HostProcess {
    /// The PID of the direct child, in the caller's PID namespace.
    pub fn pid(&self) -> u32 {
        self.pid.as_raw().unsigned_abs()
    }

    /// A handle that kills the command's whole tree from another thread.
    pub fn killer(&self) -> Killer {
        Killer { cgroup: self.cgroup.clone() }
    }

    /// Streams the command's output to `sink` until it ends, the deadline
    /// passes, `stop` fires or the sink fails, and kills whatever is left
    /// of the command's tree. Returns only once no process of the command
    /// remains and its cgroup is removed. After the command exited (or
    /// timed out), output still buffered in the pipes goes to the sink
    /// too; after a stop or a sink failure it is discarded.
    pub fn run(
        mut self,
        limits: Limits,
        stop: &StopSignal,
        mut sink: impl FnMut(Stream, &[u8]) -> std::io::Result<()>,
    ) -> Result<Finished, HostExecError> {
        let mut output = Output { cap: limits.output_cap, passed: 0, truncated: false, failed: None };
        let mut buf = vec![0u8; READ_CHUNK];
        let mut open = [true, true];
        let end = loop {
            if self.status.is_none() && self.pidfd.is_none() {
                self.try_reap()?;
            }
            if let Some(code) = self.status {
                break End::Exited(code);
            }
            if stop.is_fired() {
                break End::Stopped;
            }
            if let Some(error) = output.failed.take() {
                break End::SinkFailed(error);
            }
            let now = Instant::now();
            if now >= limits.deadline {
                break End::TimedOut;
            }
            let mut wait = limits.deadline - now;
            if self.pidfd.is_none() {
                wait = wait.min(NO_PIDFD_TICK);
            }
            let timeout = PollTimeout::from(u16::try_from(wait.as_millis() + 1).unwrap_or(u16::MAX));

            let mut fds = vec![PollFd::new(stop.fd(), PollFlags::POLLIN)];
            let child_at = self.pidfd.as_ref().map(|p| {
                fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
                fds.len() - 1
            });
            let mut streams = Vec::with_capacity(2);
            for (i, (fd, stream)) in [(&self.stdout, Stream::Stdout), (&self.stderr, Stream::Stderr)].into_iter().enumerate() {
                if open[i] {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                    streams.push((i, fds.len() - 1, stream));
                }
            }
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(HostExecError::Sys { context: "waiting for the host command", source: e.into() }),
            }
            let ready = |at: usize| fds[at].revents().is_some_and(|r| !r.is_empty());
            let readable: Vec<(usize, Stream)> = streams.iter().filter(|(_, at, _)| ready(*at)).map(|(i, _, s)| (*i, *s)).collect();
            let exited = child_at.is_some_and(ready);
            drop(fds);
            for (i, stream) in readable {
                let fd = if i == 0 { &self.stdout } else { &self.stderr };
                match read_some(fd.as_fd(), &mut buf) {
                    Ok(0) => open[i] = false,
                    Ok(n) => output.pass(stream, &buf[..n], &mut sink),
                    Err(Errno::EAGAIN | Errno::EINTR) => {}
                    Err(e) => return Err(HostExecError::Sys { context: "reading the host command's output", source: e.into() }),
                }
            }
            if exited {
                self.reap()?;
            }
        };
        self.finish()?;
        if matches!(end, End::Exited(_) | End::TimedOut) {
            // Every writer is dead: what is left in the pipes is all there is.
            for (fd, stream) in [(&self.stdout, Stream::Stdout), (&self.stderr, Stream::Stderr)] {
                loop {
                    match read_some(fd.as_fd(), &mut buf) {
                        Ok(0) | Err(Errno::EAGAIN) => break,
                        Ok(n) => output.pass(stream, &buf[..n], &mut sink),
                        Err(Errno::EINTR) => {}
                        Err(e) => return Err(HostExecError::Sys { context: "reading the host command's output", source: e.into() }),
                    }
                }
            }
            if let Some(error) = output.failed.take() {
                return Ok(Finished { end: End::SinkFailed(error), truncated: output.truncated });
            }
        }
        Ok(Finished { end, truncated: output.truncated })
    }

    /// Reaps the child if it has exited, without waiting.
    fn try_reap(&mut self) -> Result<(), HostExecError> {
        self.wait(Some(WaitPidFlag::WNOHANG))
    }

    /// Reaps the child, which has exited (its pidfd is readable).
    fn reap(&mut self) -> Result<(), HostExecError> {
        self.wait(None)
    }

    fn wait(&mut self, flags: Option<WaitPidFlag>) -> Result<(), HostExecError> {
        if self.status.is_some() {
            return Ok(());
        }
        loop {
            match waitpid(self.pid, flags) {
                Ok(WaitStatus::Exited(_, code)) => self.status = Some(code),
                Ok(WaitStatus::Signaled(_, signal, _)) => self.status = Some(128 + signal as i32),
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(HostExecError::Sys { context: "waiting for the host command", source: e.into() }),
            }
            return Ok(());
        }
    }

    /// Kills the tree, waits for the cgroup to empty, reaps the child and
    /// removes the cgroup.
    fn finish(&mut self) -> Result<(), HostExecError> {
        if self.done {
            return Ok(());
        }
        let start = Instant::now();
        let mut last_kill: Option<Instant> = None;
        let mut pause = Duration::from_micros(200);
        // The child is in the cgroup from before exec: once it is empty,
        // the child is dead too (a zombie at most). A command that exited
        // and left nothing running needs no kill (a write to cgroup.kill
        // takes the cgroup core's lock): nothing enters an empty cgroup
        // but through root (its cgroup.procs, or clone3 into it).
        let mut empty = self.status.is_some() && !self.cgroup.populated()?;
        loop {
            let now = Instant::now();
            if !empty {
                if last_kill.is_none_or(|t| now - t >= KILL_REPEAT) {
                    self.cgroup.kill().map_err(|source| HostExecError::Cgroup {
                        context: "killing the processes of",
                        path: self.cgroup.path.clone(),
                        source,
                    })?;
                    last_kill = Some(now);
                }
                empty = !self.cgroup.populated()?;
                if empty {
                    // Dead, so this does not block; an error (someone else
                    // reaped it) leaves only the status unknown.
                    let _ = self.wait(None);
                }
            }
            if empty {
                match std::fs::remove_dir(&self.cgroup.path) {
                    Ok(()) => break,
                    Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                    Err(source) => {
                        return Err(HostExecError::Cgroup { context: "removing", path: self.cgroup.path.clone(), source });
                    }
                }
            }
            if now - start >= CGROUP_EMPTY_TIMEOUT {
                return Err(HostExecError::CgroupNotEmpty { path: self.cgroup.path.clone(), waited: now - start });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
        self.done = true;
        Ok(())
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// What goes to the sink, and what no longer does.
struct Output {
    cap: u64,
    passed: u64,
    truncated: bool,
    /// The sink's error; nothing more is passed once it failed.
    failed: Option<std::io::Error>,
}

impl Output {
    fn pass(&mut self, stream: Stream, data: &[u8], sink: &mut impl FnMut(Stream, &[u8]) -> std::io::Result<()>) {
        if self.failed.is_some() {
            return;
        }
        let room = self.cap.saturating_sub(self.passed);
        let take = usize::try_from(room).unwrap_or(usize::MAX).min(data.len());
        if take < data.len() {
            self.truncated = true;
        }
        if take == 0 {
            return;
        }
        self.passed += take as u64;
        if let Err(e) = sink(stream, &data[..take]) {
            self.failed = Some(e);
        }
    }
}

fn read_some(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    nix::unistd::read(fd, buf)
}

/// Reads the child's start-up report: `None` if it exec'd (EOF, the pipe
/// closed at exec), or the stage and errno it failed with.
fn read_report(pipe: OwnedFd) -> std::io::Result<Option<(u32, i32)>> {
    let mut file = std::fs::File::from(pipe);
    let mut report = Vec::with_capacity(sys::CHILD_REPORT_LEN);
    (&mut file).take(sys::CHILD_REPORT_LEN as u64).read_to_end(&mut report)?;
    if report.len() < sys::CHILD_REPORT_LEN {
        // EOF before a full report: the exec succeeded (or the child was
        // killed first, which the run reports as its exit status).
        return Ok(None);
    }
    let stage = u32::from_ne_bytes([report[0], report[1], report[2], report[3]]);
    let errno = i32::from_ne_bytes([report[4], report[5], report[6], report[7]]);
    Ok(Some((stage, errno)))
}

/// `fd` itself if it is 3 or above, else a duplicate that is (the child
/// puts its stdio on 0, 1 and 2 and must not overwrite a descriptor it
/// still needs).
fn above_stdio(fd: OwnedFd) -> Result<OwnedFd, HostExecError> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // try_clone duplicates with F_DUPFD_CLOEXEC from 3 up.
    fd.try_clone().map_err(|source| HostExecError::Sys { context: "duplicating a descriptor above stdio", source })
}

/// The highest open descriptor number (for the child's fallback when
/// `close_range` is missing).
fn highest_open_fd() -> i32 {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok()).max().unwrap_or(1024))
        .unwrap_or(65536)
}

/// The command's argv, environment and program candidates as C strings,
/// prepared before the fork.
#[derive(Debug)]
struct Prepared {
    programs: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Prepared {
    fn new(argv: &[String], env: &[(String, String)]) -> Result<Prepared, HostExecError> {
        let program = argv.first().ok_or_else(|| HostExecError::Invalid("the argument vector is empty".into()))?;
        if program.is_empty() {
            return Err(HostExecError::Invalid("argv[0] is empty".into()));
        }
        let mut names = std::collections::HashSet::new();
        for (name, _) in env {
            if name.is_empty() || name.contains('=') {
                return Err(HostExecError::Invalid(format!("environment variable name {name:?}")));
            }
            if !names.insert(name.as_str()) {
                return Err(HostExecError::Invalid(format!("environment variable {name} given twice")));
            }
        }
        let c = |s: String, what: &str| CString::new(s).map_err(|_| HostExecError::Invalid(format!("{what} contains a NUL byte")));
        let programs = program_candidates(program, env)?.into_iter().map(|p| c(p, "argv[0]")).collect::<Result<_, _>>()?;
        let argv = argv.iter().map(|a| c(a.clone(), "an argument")).collect::<Result<_, _>>()?;
        let envp = env.iter().map(|(k, v)| c(format!("{k}={v}"), "the environment")).collect::<Result<_, _>>()?;
        Ok(Prepared { programs, argv, envp })
    }

    fn argv_ptrs(&self) -> Vec<*const libc::c_char> {
        self.argv.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
    }

    fn envp_ptrs(&self) -> Vec<*const libc::c_char> {
        self.envp.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
    }
}

/// The paths `execve` tries for `program`: itself if it contains a `/`,
/// else `DIR/program` for each absolute directory of `PATH` in `env`.
fn program_candidates(program: &str, env: &[(String, String)]) -> Result<Vec<String>, HostExecError> {
    if program.contains('/') {
        return Ok(vec![program.to_string()]);
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .ok_or_else(|| HostExecError::Invalid(format!("{program} has no '/' and the environment has no PATH to search")))?;
    let candidates: Vec<String> =
        path.split(':').filter(|dir| dir.starts_with('/')).map(|dir| format!("{}/{program}", dir.trim_end_matches('/'))).collect();
    if candidates.is_empty() {
        return Err(HostExecError::Invalid(format!("{program} has no '/' and PATH has no absolute directory")));
    }
    Ok(candidates)
}

/// The command's cgroup directory.
#[derive(Debug)]
struct Cgroup {
    path: PathBuf,
    /// The directory, so that a kill after removal reaches nothing (not a
    /// new cgroup that got the same path).
    dir: OwnedFd,
}

impl Cgroup {
    fn create(path: &Path) -> Result<Cgroup, HostExecError> {
        if !path.is_absolute() || path.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
            return Err(HostExecError::Invalid(format!("cgroup path {} is not absolute and normal", path.display())));
        }
        let existing = path.ancestors().skip(1).find(|a| a.exists()).unwrap_or(Path::new("/"));
        let is_v2 = |p: &Path| nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
        if !is_v2(existing) {
            return Err(HostExecError::NoCgroupV2 { path: path.to_path_buf() });
        }
        let err = |context| move |source| HostExecError::Cgroup { context, path: path.to_path_buf(), source };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(err("creating the parents of"))?;
        }
        std::fs::create_dir(path).map_err(err("creating"))?;
        let dir = nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| err("opening")(e.into()));
        match dir {
            Ok(dir) => Ok(Cgroup { path: path.to_path_buf(), dir }),
            Err(e) => {
                let _ = std::fs::remove_dir(path);
                Err(e)
            }
        }
    }

    fn open(&self, name: &str, flags: OFlag) -> std::io::Result<OwnedFd> {
        Ok(nix::fcntl::openat(self.dir.as_fd(), name, flags | OFlag::O_CLOEXEC, Mode::empty())?)
    }

    /// Kills every process in the cgroup. Nothing to do once it is removed.
    fn kill(&self) -> std::io::Result<()> {
        match self.open("cgroup.kill", OFlag::O_WRONLY) {
            Ok(fd) => {
                nix::unistd::write(&fd, b"1")?;
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => self.kill_each(),
            Err(e) => Err(e),
        }
    }

    /// The fallback without `cgroup.kill` (Linux < 5.14): freeze, then
    /// SIGKILL each listed process (killed processes die even frozen), a
    /// few rounds in case of forks; the caller repeats until empty.
    fn kill_each(&self) -> std::io::Result<()> {
        if let Ok(fd) = self.open("cgroup.freeze", OFlag::O_WRONLY) {
            let _ = nix::unistd::write(&fd, b"1");
        }
        for _ in 0..10 {
            let procs = match self.read("cgroup.procs") {
                Ok(p) => p,
                // Removed: nothing left to kill.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
                Err(e) => return Err(e),
            };
            let pids: Vec<i32> = procs.split_whitespace().filter_map(|p| p.parse().ok()).filter(|p| *p > 0).collect();
            if pids.is_empty() {
                return Ok(());
            }
            for pid in pids {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        Ok(())
    }

    fn read(&self, name: &str) -> std::io::Result<String> {
        let mut text = String::new();
        std::fs::File::from(self.open(name, OFlag::O_RDONLY)?).read_to_string(&mut text)?;
        Ok(text)
    }

    /// Whether any process is left in the cgroup (`cgroup.events`).
    fn populated(&self) -> Result<bool, HostExecError> {
        let events = self.read("cgroup.events").map_err(|source| HostExecError::Cgroup {
            context: "reading cgroup.events of",
            path: self.path.clone(),
            source,
        })?;
        Ok(parse_populated(&events).unwrap_or(true))
    }
}

/// The `populated` value of a `cgroup.events` file.
fn parse_populated(events: &str) -> Option<bool> {
    events.lines().find_map(|l| match l.split_once(' ') {
        Some(("populated", v)) => Some(v.trim() != "0"),
        _ => None,
    })
}

/// Removes the cgroup unless disarmed (spawn's error paths).
struct CgroupGuard(Option<Arc<Cgroup>>);

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Some(cgroup) = self.0.take() {
            let _ = cgroup.kill();
            let start = Instant::now();
            while std::fs::remove_dir(&cgroup.path).is_err() && start.elapsed() < CGROUP_EMPTY_TIMEOUT {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Where the cgroup v2 hierarchy is mounted in this mount namespace
/// (`/sys/fs/cgroup` on cgroup v2 systems, `/sys/fs/cgroup/unified` on
/// hybrid ones), from `/proc/self/mountinfo`.
pub fn cgroup2_mount() -> Result<PathBuf, HostExecError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|source| HostExecError::Sys { context: "reading /proc/self/mountinfo", source })?;
    find_cgroup2_mount(&mountinfo).ok_or(HostExecError::NoCgroupV2 { path: PathBuf::from("/sys/fs/cgroup") })
}

/// The mount point of the first `cgroup2` file system in a mountinfo text.
fn find_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mount_point = left.split_whitespace().nth(4)?;
        Some(PathBuf::from(unescape_mountinfo(mount_point)))
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            out.push((bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_program_with_a_slash_is_used_as_given() {
        assert_eq!(program_candidates("./run", &[]).expect("test setup"), vec!["./run"]);
        assert_eq!(program_candidates("/usr/bin/git", &env(&[("PATH", "/bin")])).expect("test setup"), vec!["/usr/bin/git"]);
    }

    #[test]
    fn path_search_uses_only_absolute_directories_in_order() {
        let found = program_candidates("git", &env(&[("PATH", "/usr/local/bin/::bin:/usr/bin:.")])).expect("test setup");
        assert_eq!(found, vec!["/usr/local/bin/git", "/usr/bin/git"]);
    }

    #[test]
    fn path_search_needs_a_path() {
        assert!(matches!(program_candidates("git", &[]), Err(HostExecError::Invalid(_))));
        assert!(matches!(program_candidates("git", &env(&[("PATH", "bin:.")])), Err(HostExecError::Invalid(_))));
    }

    #[test]
    fn malformed_commands_are_refused() {
        let ok = env(&[("PATH", "/bin")]);
        assert!(matches!(Prepared::new(&[], &ok), Err(HostExecError::Invalid(_))));
        assert!(matches!(Prepared::new(&["".into()], &ok), Err(HostExecError::Invalid(_))));
        assert!(matches!(Prepared::new(&["a\0b".into()], &ok), Err(HostExecError::Invalid(_))));
        assert!(matches!(Prepared::new(&["true".into(), "x\0".into()], &ok), Err(HostExecError::Invalid(_))));
        assert!(matches!(Prepared::new(&["true".into()], &env(&[("PATH", "/bin"), ("A=B", "c")])), Err(HostExecError::Invalid(_))));
        assert!(matches!(Prepared::new(&["true".into()], &env(&[("PATH", "/bin"), ("PATH", "/usr/bin")])), Err(HostExecError::Invalid(_))));
        assert!(matches!(Prepared::new(&["true".into()], &env(&[("PATH", "/bin"), ("X", "a\0")])), Err(HostExecError::Invalid(_))));
        let p = Prepared::new(&["true".into(), "".into()], &env(&[("PATH", "/bin"), ("X", "")])).expect("test setup");
        assert_eq!(p.argv_ptrs().len(), 3);
        assert!(p.argv_ptrs()[2].is_null() && p.envp_ptrs()[2].is_null());
        assert_eq!(p.envp[1].to_str().expect("test setup"), "X=");
    }

    #[test]
    fn stages_round_trip_through_their_codes() {
        for stage in ExecStage::ALL {
            assert_eq!(ExecStage::from_code(stage as u32), Some(stage));
        }
        assert_eq!(ExecStage::from_code(0), None);
    }

    #[test]
    fn exec_errors_read_like_a_shell_s() {
        let e = |errno, program: &str| {
            HostExecError::Exec { program: program.into(), stage: ExecStage::Exec, source: std::io::Error::from_raw_os_error(errno) }
                .to_string()
        };
        assert_eq!(e(libc::ENOENT, "gti"), "gti: command not found");
        assert_eq!(e(libc::EACCES, "./x"), "./x: permission denied");
        assert!(e(libc::ENOEXEC, "./x").contains("#!"));
    }

    #[test]
    fn output_is_cut_at_the_cap_and_reported() {
        let mut seen = Vec::new();
        let mut sink = |s: Stream, d: &[u8]| {
            seen.push((s, d.to_vec()));
            Ok(())
        };
        let mut out = Output { cap: 5, passed: 0, truncated: false, failed: None };
        out.pass(Stream::Stdout, b"abc", &mut sink);
        assert!(!out.truncated);
        out.pass(Stream::Stderr, b"defg", &mut sink);
        out.pass(Stream::Stdout, b"h", &mut sink);
        assert!(out.truncated);
        assert_eq!(seen, vec![(Stream::Stdout, b"abc".to_vec()), (Stream::Stderr, b"de".to_vec())]);
    }

    #[test]
    fn a_failed_sink_gets_nothing_more() {
        let mut calls = 0;
        let mut sink = |_: Stream, _: &[u8]| {
            calls += 1;
            Err(std::io::Error::other("gone"))
        };
        let mut out = Output { cap: 100, passed: 0, truncated: false, failed: None };
        out.pass(Stream::Stdout, b"a", &mut sink);
        out.pass(Stream::Stdout, b"b", &mut sink);
        assert_eq!(calls, 1);
        assert!(out.failed.is_some());
    }

    #[test]
    fn populated_is_read_from_cgroup_events() {
        assert_eq!(parse_populated("populated 0\nfrozen 0\n"), Some(false));
        assert_eq!(parse_populated("populated 1\nfrozen 0\n"), Some(true));
        assert_eq!(parse_populated("frozen 0\n"), None);
    }

    #[test]
    fn the_cgroup2_mount_is_found_in_mountinfo() {
        let hybrid = "30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate\n\
                      32 30 0:28 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n";
        assert_eq!(find_cgroup2_mount(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let unified = "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(find_cgroup2_mount(unified), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(find_cgroup2_mount("32 30 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"), None);
        let spaced = "35 24 0:30 / /mnt/my\\040cg rw - cgroup2 none rw\n";
        assert_eq!(find_cgroup2_mount(spaced), Some(PathBuf::from("/mnt/my cg")));
    }

    #[test]
    fn handles_cross_threads() {
        fn send<T: Send>() {}
        fn send_sync_clone<T: Send + Sync + Clone>() {}
        send::<HostProcess>();
        send_sync_clone::<Killer>();
        send_sync_clone::<StopSignal>();
    }

    #[test]
    fn root_is_refused_before_anything_happens() {
        let dir = nix::fcntl::open("/", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).expect("test setup");
        let base = |uid, gid, groups: Vec<u32>| HostCommand {
            argv: vec!["true".into()],
            cwd: dir.try_clone().expect("test setup"),
            uid,
            gid,
            groups,
            env: env(&[("PATH", "/bin")]),
            cgroup: PathBuf::from("/nonexistent/never-created"),
            mount_ns: None,
        };
        assert!(matches!(spawn(base(0, 1000, vec![])), Err(HostExecError::Root(_))));
        assert!(matches!(spawn(base(1000, 0, vec![])), Err(HostExecError::Root(_))));
        assert!(matches!(spawn(base(1000, 1000, vec![5, 0])), Err(HostExecError::Root(_))));
        assert!(!Path::new("/nonexistent").exists());
    }
}
