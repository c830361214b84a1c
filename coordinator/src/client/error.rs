//! Why a client command (`lazaret run`, `stop`, `ls`, `debug`) failed.

use std::path::PathBuf;

use lazaret_protocol::wire::FrameError;

use crate::context::ContextError;

/// Why a client command failed. Each message names the cause and, where
/// there is one, the fix or the log to read.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Resolving configuration, workspace or state directories failed.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// A message to or from the coordinator could not be exchanged.
    #[error("talking to the Domain's coordinator: {0}")]
    Wire(#[from] FrameError),
    /// A file or system call.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// The developer asked us to stop before the sandbox started.
    #[error("interrupted by {0} before the sandbox started; nothing is left behind")]
    Interrupted(String),
    /// `--reset-anchor` while the Domain runs.
    #[error(
        "--reset-anchor needs the Domain stopped, and profile {profile:?} is running on this workspace\n  hint: stop it with `lazaret stop {profile}` first"
    )]
    ResetWhileRunning {
        /// The profile.
        profile: String,
    },
    /// `--reprovision` while the Domain runs.
    #[error(
        "--reprovision needs the Domain stopped, and profile {profile:?} is running on this workspace\n  hint: stop it with `lazaret stop {profile}` first"
    )]
    ReprovisionWhileRunning {
        /// The profile.
        profile: String,
    },
    /// The Domain's coordinator refused the session (its reason says why).
    #[error("{0}")]
    Refused(String),
    /// The coordinator failed to start the Domain and said why.
    #[error("{0}")]
    StartFailed(String),
    /// The coordinator exited without saying why.
    #[error("the Domain's coordinator failed to start ({status}); see {log}")]
    StartFailedSilently {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The Domain's log.
        log: PathBuf,
    },
    /// No coordinator published its socket in time.
    #[error("no coordinator published {socket} within {secs} s; see {log}")]
    StartTimeout {
        /// The socket.
        socket: PathBuf,
        /// The limit.
        secs: u64,
        /// The Domain's log.
        log: PathBuf,
    },
    /// The connection broke during a session.
    #[error("lost the connection to the Domain's coordinator ({cause}); see {log}")]
    ConnectionLost {
        /// What broke (shown in the parentheses, so not an error `source`:
        /// the CLI prints sources after the message, which would say it twice).
        cause: FrameError,
        /// The Domain's log.
        log: PathBuf,
    },
    /// The coordinator answered something this client does not expect.
    #[error("unexpected answer from the coordinator to {request}: {answer}")]
    Unexpected {
        /// What we asked.
        request: &'static str,
        /// What came back.
        answer: String,
    },
    /// `lazaret stop` or `debug` of a Domain that is not running.
    #[error("profile {profile:?} is not running on {workspace}")]
    NotRunning {
        /// The profile.
        profile: String,
        /// The workspace.
        workspace: PathBuf,
    },
    /// A stopped Domain did not go down in time.
    #[error("the Domain in {dir} did not go down in time; see {log}")]
    StopTimeout {
        /// The Domain runtime directory.
        dir: PathBuf,
        /// The Domain's log.
        log: PathBuf,
    },
    /// `lazaret stop --all`: the Domains that could not be stopped.
    #[error("{}", .0.iter().map(|(dir, e)| format!("{}: {e}", dir.display())).collect::<Vec<_>>().join("\n"))]
    StopAll(Vec<(PathBuf, ClientError)>),
}

impl ClientError {
    /// Maps an I/O error to [`ClientError::Io`] with what was being done.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClientError {
        let context = context.into();
        move |source| ClientError::Io { context, source }
    }

    /// Maps an errno to [`ClientError::Io`] with what was being done.
    pub(crate) fn errno(context: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> ClientError {
        let context = context.into();
        move |e| ClientError::Io { context, source: e.into() }
    }
}
