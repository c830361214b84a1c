//! What a Domain's start looks like to both sides: the daemon that runs it
//! and the launcher that shows it. The start-up stages (the daemon's stack
//! runs them, the launcher's status line names them), the setup mode the
//! launcher asks for, and the setup progress lines on the status pipe.
//! Here, so that `client` and `daemon` need not import each other.

use std::fmt;

/// One step of a Domain's start-up, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The Domain lock, in the model (the flock itself is taken by the
    /// outer process before anything else).
    Lock,
    /// Removing what crashed earlier runs left.
    Recovery,
    /// The profile's image (pulled if missing) and a checked runsc.
    Image,
    /// The sandbox's run directory.
    RunDir,
    /// The rootfs overlay, State Anchor overlays, Ignored Workspace State,
    /// Git Sentry, volumes and the agent's home.
    StateAnchor,
    /// The Domain CA.
    TrustAnchor,
    /// The sidecar network, its policy installed and verified.
    Sidecar,
    /// The profile's `setup` steps, in a sandbox of their own, when they
    /// have not run yet or changed ([`super::provision`]).
    Provision,
    /// The bundle written and `runsc create` done.
    SandboxCreated,
    /// The sandbox's network re-verified and `runsc start` done.
    SandboxStarted,
    /// `coordinator.sock` published.
    Published,
}

impl Stage {
    /// Every stage, in start-up order.
    pub const ALL: [Stage; 11] = [
        Stage::Lock,
        Stage::Recovery,
        Stage::Image,
        Stage::RunDir,
        Stage::StateAnchor,
        Stage::TrustAnchor,
        Stage::Sidecar,
        Stage::Provision,
        Stage::SandboxCreated,
        Stage::SandboxStarted,
        Stage::Published,
    ];

    /// The stage's name (also its crash point for the test hook).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Lock => "lock",
            Stage::Recovery => "recovery",
            Stage::Image => "image",
            Stage::RunDir => "run-dir",
            Stage::StateAnchor => "state-anchor",
            Stage::TrustAnchor => "trust-anchor",
            Stage::Sidecar => "sidecar",
            Stage::Provision => "setup",
            Stage::SandboxCreated => "sandbox-created",
            Stage::SandboxStarted => "sandbox",
            Stage::Published => "published",
        }
    }

    /// The stage called `name`.
    pub fn from_name(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `--no-setup` / `--reprovision`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetupMode {
    /// Run the steps when their fingerprint is not the recorded one.
    #[default]
    Normal,
    /// Never run them (`--no-setup`: a fix-up shell after a failure).
    Skip,
    /// Run them whatever is recorded (`--reprovision`).
    Rerun,
}

/// The prefix of a step's header line on the status pipe.
const STEP_PREFIX: &str = "lazaret: setup: step ";
/// The prefix of one line of a step's output on the status pipe.
const OUTPUT_PREFIX: &str = "lazaret: setup| ";
/// The prefix of the line that ends a successful setup.
pub(crate) const DONE_PREFIX: &str = "lazaret: setup: done";

/// A provisioning line on the coordinator's status pipe, as the launcher
/// reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// A step starts: `N/M: ARGV` (inert).
    Step(String),
    /// A line of the running step's output (inert).
    Output(String),
    /// Setup finished: the line to show.
    Done(String),
}

impl Progress {
    /// The status-pipe line.
    pub fn line(&self) -> String {
        match self {
            Progress::Step(s) => format!("{STEP_PREFIX}{s}"),
            Progress::Output(s) => format!("{OUTPUT_PREFIX}{s}"),
            Progress::Done(s) => s.clone(),
        }
    }

    /// The progress a status-pipe line carries, if it is one.
    pub fn parse(line: &str) -> Option<Progress> {
        if let Some(s) = line.strip_prefix(STEP_PREFIX) {
            Some(Progress::Step(s.to_string()))
        } else if let Some(s) = line.strip_prefix(OUTPUT_PREFIX) {
            Some(Progress::Output(s.to_string()))
        } else if line.starts_with(DONE_PREFIX) {
            Some(Progress::Done(line.to_string()))
        } else {
            None
        }
    }
}
