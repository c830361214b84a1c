//! `lazaret run`: what it was asked, how it fails, and its entry point.
//!
//! One coordinator daemon per Domain ([`crate::daemon`]) owns the Domain's
//! resources; every `lazaret run` is a client session of it
//! ([`crate::client`]): the first one of a Domain starts the coordinator,
//! later ones join it.

use std::fs::File;
use std::path::PathBuf;

use crate::context::ContextError;
use crate::lock::LockError;
use crate::network;

/// What `lazaret run` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// `--config FILE`, if given.
    pub config: Option<PathBuf>,
    /// The profile named on the command line, if any.
    pub profile: Option<String>,
    /// Where to look for the workspace (`-C DIR`, else the current directory).
    pub dir: PathBuf,
    /// Replaces the profile's command when not empty (`-- ARGS...`).
    pub args: Vec<String>,
    /// Discard the State Anchor before starting (`--reset-anchor`).
    pub reset_anchor: bool,
}

/// Why a run could not start or finish cleanly.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Resolving configuration, workspace, image or runsc failed.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// The profile's image is missing and cannot be pulled.
    #[error(transparent)]
    Image(#[from] crate::images::ImagesError),
    /// Another run owns the Domain.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The Domain's network could not be built.
    #[error(transparent)]
    Network(#[from] network::NetworkError),
    /// A mount could not be made.
    #[error(transparent)]
    Mount(#[from] lazaret_mounts::MountError),
    /// The sandbox's /etc/passwd or /etc/group could not be made.
    #[error(transparent)]
    Passwd(#[from] crate::passwd::PasswdError),
    /// The bundle could not be written.
    #[error(transparent)]
    Bundle(#[from] lazaret_oci::bundle::BundleError),
    /// runsc failed.
    #[error(transparent)]
    Runsc(#[from] lazaret_runtime::RunscError),
    /// A system call failed.
    #[error("{context}: {source}")]
    Sys {
        /// What we were doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// The developer asked us to stop before the sandbox started.
    #[error("interrupted by {0} before the sandbox started; nothing is left behind")]
    Interrupted(String),
    /// The Domain's coordinator refused the session or failed.
    #[error("{0}")]
    Coordinator(String),
    /// A message to or from the coordinator could not be exchanged.
    #[error("talking to the Domain's coordinator: {0}")]
    Wire(#[from] lazaret_protocol::wire::FrameError),
}

/// Maps an I/O error to [`LaunchError::Sys`] with what was being done.
pub(crate) fn sys(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let context = context.into();
    move |source| LaunchError::Sys { context, source }
}

/// Exit status of `lazaret` for its own failures, distinct from the agent's.
pub const LAZARET_FAILED: i32 = 125;

/// Runs `lazaret run` and returns the agent's exit status: joins the
/// Domain's coordinator, starting it first if the Domain is not running.
/// Call it while the process has a single thread (it blocks the signals
/// Lazaret handles as events).
pub fn run_isolated(req: &RunRequest) -> Result<lazaret_runtime::ExitStatus, LaunchError> {
    crate::client::run(req)
}

/// `n` random bytes as hex, from the kernel's CSPRNG.
pub(crate) fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    if let Ok(mut f) = File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut buf);
    }
    hex::encode(buf)
}
