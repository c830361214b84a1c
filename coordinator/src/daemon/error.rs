//! Why a Domain could not start (or a step of its teardown failed): one
//! variant per source, each keeping the typed error it came from.

use std::path::PathBuf;

use crate::context::ContextError;
use crate::journal::JournalError;

/// Why a coordinator step failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Resolving configuration, workspace or state directories failed.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// The launcher and this coordinator disagree on the Domain directory.
    #[error("the launcher's Domain directory {launcher} is not {ours}; refusing to start")]
    DomainDirMismatch {
        /// What the launcher passed.
        launcher: PathBuf,
        /// What this coordinator computed.
        ours: PathBuf,
    },
    /// The Domain lock.
    #[error(transparent)]
    Lock(#[from] crate::lock::LockError),
    /// The journal refused a step or could not be written.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The profile's image is missing and cannot be pulled.
    #[error(transparent)]
    Image(#[from] crate::images::ImagesError),
    /// The Domain's network.
    #[error(transparent)]
    Network(#[from] crate::network::NetworkError),
    /// A mount.
    #[error(transparent)]
    Mount(#[from] lazaret_mounts::MountError),
    /// The sandbox's filesystem.
    #[error(transparent)]
    Filesystem(#[from] crate::filesystem::FilesystemError),
    /// The sandbox's /etc/passwd or /etc/group.
    #[error(transparent)]
    Passwd(#[from] crate::passwd::PasswdError),
    /// The OCI bundle.
    #[error(transparent)]
    Bundle(#[from] lazaret_oci::bundle::BundleError),
    /// runsc.
    #[error(transparent)]
    Runsc(#[from] lazaret_runtime::RunscError),
    /// The Trust Anchor.
    #[error(transparent)]
    Trust(#[from] crate::trust::TrustError),
    /// The PID namespace of the Domain.
    #[error(transparent)]
    PidNamespace(#[from] lazaret_runtime::pidns::PidNsError),
    /// A step of the profile's `setup` failed.
    #[error(transparent)]
    Setup(Box<super::provision::SetupError>),
    /// A file or system call.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl From<super::provision::SetupError> for StartError {
    fn from(error: super::provision::SetupError) -> Self {
        StartError::Setup(Box::new(error))
    }
}

impl StartError {
    /// Maps an I/O error to [`StartError::Io`] with what was being done.
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StartError {
        let context = context.into();
        move |source| StartError::Io { context, source }
    }

    /// Maps an errno to [`StartError::Io`] with what was being done.
    pub(crate) fn errno(context: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> StartError {
        let context = context.into();
        move |e| StartError::Io { context, source: e.into() }
    }
}
