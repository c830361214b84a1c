//! The sandbox's exit status without `runsc wait` (which takes ~2 s even for
//! a process that has already exited): Lazaret makes itself a child
//! subreaper, so the sandbox process that `runsc create` leaves behind is
//! re-parented to it and can be `waitpid`ed directly.
//!
//! Reaping uses `waitpid(-1)`, which also collects short-lived `runsc`
//! commands. That is safe only because those are spawned and waited for on
//! the same thread as the reaping loop, never concurrently with it.

use std::path::Path;

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::ExitStatus;

/// Makes the calling process a child subreaper (PR_SET_CHILD_SUBREAPER).
pub fn become_subreaper() -> nix::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// Reads a PID written by `runsc --pid-file`.
pub fn read_pid_file(path: &Path) -> std::io::Result<Pid> {
    let text = std::fs::read_to_string(path)?;
    let pid: i32 = text
        .trim()
        .parse()
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} holds no PID: {text:?}", path.display())))?;
    if pid <= 1 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} holds PID {pid}", path.display())));
    }
    Ok(Pid::from_raw(pid))
}

/// Reaps every child that has exited, without blocking, and returns the exit
/// status of `watched` if it was among them (orphans re-parented to us, such
/// as runsc's gofer, are reaped and forgotten).
pub fn reap_exited(watched: Pid) -> Option<ExitStatus> {
    let mut found = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => break,
            Ok(status) => {
                if status.pid() == Some(watched) {
                    if let Some(s) = ExitStatus::from_wait(status) {
                        found = Some(s);
                    }
                }
            }
        }
    }
    found
}

/// Reaps children until none is left or `limit` has passed; returns whether
/// none is left. Used after the sandbox has exited: runsc's gofer follows it
/// shortly, and `runsc delete` waits (up to 5 s) for a gofer that is still a
/// zombie, so it must be reaped first.
pub fn reap_all(limit: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Err(nix::errno::Errno::ECHILD) => return true,
            Ok(WaitStatus::StillAlive) => {
                if std::time::Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return false,
        }
    }
}
