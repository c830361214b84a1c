//! Running all of a sandbox's host processes (runsc's sandbox and gofer, and
//! every `runsc` command) inside a PID and cgroup namespace of their own.
//!
//! runsc leaves its sandbox process in the caller's PID and cgroup
//! namespaces. To keep SR-12 on the host side too, Lazaret forks a child that
//! is PID 1 of fresh PID and cgroup namespaces and does all the work from
//! there. Two properties follow:
//!
//! - no runsc process can see or signal host processes by PID;
//! - when that child dies, however it dies, the kernel kills every process
//!   left in its namespace: a crashed run cannot strand a sandbox; and the
//!   child dies with its parent (PR_SET_PDEATHSIG), so `kill -9` of
//!   `lazaret` takes the whole sandbox down too.
//!
//! The PIDs runsc records in its state directory are then PIDs of that
//! namespace. They mean nothing (or something else) outside it, so runsc
//! must never be asked to `kill`/`delete` such a container from outside:
//! stale state is removed by deleting the state directory instead.
//!
//! The parent only waits: it forwards SIGTERM and SIGHUP sent to it by
//! another process (terminal-generated signals already reach the child,
//! which is in the same process group), and restores the terminal's modes
//! if the child died without doing so.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use nix::sys::signal::Signal;
use nix::sys::termios;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use lazaret_protocol::session::EXIT_FAILED;

use crate::ExitStatus;
use crate::signals::Signals;

/// Why the namespace init could not be started.
#[derive(Debug, thiserror::Error)]
pub enum PidNsError {
    /// The process has more than one thread; forking would be unsound.
    #[error("internal error: the PID namespace must be created while lazaret is single-threaded ({0} threads)")]
    Threaded(usize),
    /// A system call failed.
    #[error("{context}: {source}")]
    Sys {
        /// What we were doing.
        context: &'static str,
        /// The error.
        source: nix::Error,
    },
}

/// Forks a child that is PID 1 of new PID and cgroup namespaces and runs
/// `init` there; `init`'s return value is the child's exit code. In the
/// parent, waits for the child and returns its exit status. Call it while the
/// process is single-threaded, after [`Signals::block`].
pub fn run_as_namespace_init(signals: &mut Signals, init: impl FnOnce(&mut Signals) -> i32) -> Result<ExitStatus, PidNsError> {
    let threads = crate::sys::settled_thread_count();
    if threads != 1 {
        return Err(PidNsError::Threaded(threads));
    }
    let stdin = std::io::stdin();
    let saved_modes = if stdin.is_terminal() { termios::tcgetattr(stdin.as_fd()).ok() } else { None };
    crate::sys::unshare_pid_and_cgroup().map_err(|source| PidNsError::Sys { context: "creating PID and cgroup namespaces", source })?;
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    let (alive_r, alive_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
        .map_err(|source| PidNsError::Sys { context: "creating the parent-alive pipe", source })?;
    match fork_single_threaded() {
        Err(e) => Err(e),
        Ok(ForkResult::Child) => {
            // If the parent dies (even by SIGKILL), so does this init, and
            // with it every process of the namespace.
            // (getppid() is 0 across the namespace boundary, so the race
            // with a parent dying before prctl is closed with a pipe: the
            // parent holds the write end; EOF means it is gone.)
            drop(alive_w);
            if nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).is_err() || parent_gone(&alive_r) {
                std::process::exit(EXIT_FAILED);
            }
            drop(alive_r);
            let code = init(signals);
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().flush();
            std::process::exit(code);
        }
        Ok(ForkResult::Parent { child }) => {
            drop(alive_r);
            let status = wait_forwarding(signals, child);
            if let Some(modes) = saved_modes {
                // The child restores the terminal itself; this covers a child
                // that was killed before it could.
                let _ = termios::tcsetattr(stdin.as_fd(), termios::SetArg::TCSADRAIN, &modes);
            }
            drop(alive_w);
            Ok(status)
        }
    }
}

/// Whether every write end of the parent-alive pipe is closed.
fn parent_gone(alive: &std::os::fd::OwnedFd) -> bool {
    let mut b = [0u8; 1];
    matches!(nix::unistd::read(alive.as_fd(), &mut b), Ok(0))
}

fn wait_forwarding(signals: &mut Signals, child: Pid) -> ExitStatus {
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(s) => {
                if let Some(status) = ExitStatus::from_wait(s) {
                    return status;
                }
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return ExitStatus(EXIT_FAILED),
        }
        if let Some((sig, from_process)) = signals.wait_next() {
            if from_process && matches!(sig, Signal::SIGTERM | Signal::SIGHUP) {
                let _ = nix::sys::signal::kill(child, sig);
            }
        }
    }
}

/// `fork()` for a process that has exactly one thread (checked), so that
/// the child is a complete copy and may run any code, allocation included.
pub fn fork_single_threaded() -> Result<ForkResult, PidNsError> {
    crate::sys::fork_single_threaded().map_err(|error| match error {
        crate::sys::ForkError::Threaded(threads) => PidNsError::Threaded(threads),
        crate::sys::ForkError::Sys(source) => PidNsError::Sys { context: "forking", source },
    })
}
