//! Lazaret's runsc driver.
//!
//! Everything that talks to `runsc` lives here: finding it and checking that
//! it is new enough ([`Runsc::locate`]), the container lifecycle with the same
//! global flags on every call ([`Runsc`]), the PID-namespace init that owns
//! every runsc process ([`pidns`]), signals as events ([`signals`]), passing
//! file descriptors over unix sockets ([`fdpass`]), and the developer's
//! terminal in raw mode behind a guard that restores it on every exit path
//! ([`terminal`]), and running an approved escalation command on the host as
//! the developer, in a cgroup of its own ([`hostexec`]).
//!
//! The crate knows nothing about profiles, Domains or images: the coordinator
//! hands it a bundle directory and a container ID.
//!
//! All `unsafe` code and raw system calls of the crate are in the private
//! `sys` module; `unsafe_code` is denied everywhere else.

#![deny(unsafe_code)]

pub mod execfail;
pub mod fdpass;
pub mod hostexec;
pub mod pidns;
pub mod runsc;
pub mod signals;
#[allow(unsafe_code)]
mod sys;
pub mod terminal;

pub use runsc::{NetworkMode, Platform, Runsc, RunscError, RunscInfo, RunscOptions};

/// Exit status of a container's or process's main program, as a shell would
/// report it: the exit code, or 128 + N for death by signal N.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitStatus(pub i32);

impl ExitStatus {
    /// From a `waitpid` result (exit code, or 128 + signal).
    pub fn from_wait(status: nix::sys::wait::WaitStatus) -> Option<ExitStatus> {
        use nix::sys::wait::WaitStatus;
        match status {
            WaitStatus::Exited(_, code) => Some(ExitStatus(code)),
            WaitStatus::Signaled(_, sig, _) => Some(ExitStatus(128 + sig as i32)),
            _ => None,
        }
    }
}
