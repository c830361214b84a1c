//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while planning or making Lazaret's mounts.
///
/// Every variant names the path concerned so that the message is actionable;
/// paths are shown escaped (`lazaret_protocol::display::escaped`), since
/// workspace file names may hold terminal control sequences.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A system call failed.
    #[error("{operation} failed for {}: {errno}", lazaret_protocol::display::escaped(path))]
    Syscall {
        /// What was being done (e.g. `mount overlay`, `openat2`).
        operation: &'static str,
        /// The path (or target) the call was about.
        path: PathBuf,
        /// The kernel's error code.
        errno: nix::errno::Errno,
    },
    /// A path in the workspace (or another input) has a shape that cannot be
    /// protected, e.g. a symlink where a directory is required.
    #[error("refusing {}: {reason}", lazaret_protocol::display::escaped(path))]
    Refused {
        /// The offending path.
        path: PathBuf,
        /// Why it was refused, and what to do about it.
        reason: String,
    },
    /// Reading or writing a file failed.
    #[error("{operation} {}: {source}", lazaret_protocol::display::escaped(path))]
    Io {
        /// What was being done.
        operation: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A configuration value (volume, persistent dir, ...) is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl MountError {
    /// Shorthand for [`MountError::Syscall`].
    pub(crate) fn sys(operation: &'static str, path: impl Into<PathBuf>, errno: nix::errno::Errno) -> Self {
        MountError::Syscall { operation, path: path.into(), errno }
    }

    /// Shorthand for [`MountError::Refused`].
    pub(crate) fn refused(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        MountError::Refused { path: path.into(), reason: reason.into() }
    }

    /// Shorthand for [`MountError::Io`].
    pub(crate) fn io(operation: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        MountError::Io { operation, path: path.into(), source }
    }
}
