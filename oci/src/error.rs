//! Errors of the image store and the layer extractor.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong while importing, listing or removing images.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// An I/O operation failed; `context` says which one and on what.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// An archive entry tried to escape the destination or use a symlinked
    /// parent, or is otherwise unsafe; the whole archive is refused.
    #[error("refusing archive entry {path:?}: {reason}")]
    UnsafeEntry {
        /// The entry path as written in the archive (lossily decoded).
        path: String,
        /// Why it is refused.
        reason: String,
    },
    /// An archive exceeded one of the [`crate::UnpackLimits`].
    #[error("archive exceeds a safety limit: {0}")]
    LimitExceeded(String),
    /// The archive or its entries are malformed or use an unsupported feature.
    #[error("invalid archive: {0}")]
    InvalidArchive(String),
    /// The image name is not acceptable.
    #[error("invalid image name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why.
        reason: String,
    },
    /// No image with this name is in the store.
    #[error("no image named {0:?} in the store")]
    NotFound(String),
    /// The import source does not exist or is of a kind we cannot import.
    #[error("cannot import {path}: {reason}")]
    BadSource {
        /// The source path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An OCI image layout or its manifests/configs are invalid.
    #[error("invalid OCI image: {0}")]
    InvalidImage(String),
    /// Content did not match the digest (or size) that names it.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// Which object.
        what: String,
        /// The digest (or size) announced.
        expected: String,
        /// The digest (or size) computed.
        actual: String,
    },
    /// The store on disk is inconsistent (e.g. a ref whose rootfs is missing).
    #[error("image store is inconsistent: {0}")]
    Corrupt(String),
}

impl ImageError {
    /// Wraps an I/O error with a short description of the failed operation.
    pub(crate) fn io(context: impl Into<String>, source: impl Into<io::Error>) -> Self {
        ImageError::Io { context: context.into(), source: source.into() }
    }
}
