//! Pull errors: each a one-line reason plus what to do.

use std::path::PathBuf;

use crate::ImageError;

/// Everything that can make a pull or a login fail.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The reference does not parse.
    #[error(
        "invalid image reference {reference:?}: {reason}; write it like debian:trixie or registry.example:5000/team/app@sha256:<digest>"
    )]
    InvalidReference {
        /// What the user wrote.
        reference: String,
        /// Why it is refused.
        reason: String,
    },
    /// `--platform` does not parse.
    #[error("invalid platform {0:?}: write it as os/architecture[/variant], e.g. linux/arm64")]
    InvalidPlatform(String),
    /// The registry cannot be reached.
    #[error("cannot reach registry {registry} ({detail}); check the network connection and the registry address")]
    Offline {
        /// The registry, `host[:port]`.
        registry: String,
        /// The transport error.
        detail: String,
    },
    /// TLS failed (untrusted certificate, plain-HTTP server, ...).
    #[error(
        "TLS connection to {registry} failed ({detail}); install the registry's CA certificate, or use --insecure if it serves plain HTTP"
    )]
    Tls {
        /// The registry, `host[:port]`.
        registry: String,
        /// The TLS error.
        detail: String,
    },
    /// The registry refused the credentials, or asked for some.
    #[error(
        "registry {registry} refused access to {reference} (unauthorised); run `lazaret image login {registry}` or add credentials to ~/.docker/config.json"
    )]
    Unauthorized {
        /// The registry, `host[:port]`.
        registry: String,
        /// The image.
        reference: String,
    },
    /// Too many requests.
    #[error("registry {registry} is rate-limiting pulls (HTTP 429); wait and retry, or log in to get a higher limit")]
    RateLimited {
        /// The registry, `host[:port]`.
        registry: String,
    },
    /// The manifest (tag, digest or repository) does not exist.
    #[error("image {reference} not found in registry {registry}; check the name and tag")]
    NotFound {
        /// The image.
        reference: String,
        /// The registry, `host[:port]`.
        registry: String,
    },
    /// A blob the manifest lists is missing from the registry.
    #[error("registry {registry} has no blob {digest} that image {reference} needs; the image is broken on the registry, push it again")]
    BlobMissing {
        /// The image.
        reference: String,
        /// The registry, `host[:port]`.
        registry: String,
        /// The blob.
        digest: String,
    },
    /// No manifest for the requested platform.
    #[error("image {reference} has no manifest for {wanted} (available: {available}); pick one with --platform")]
    WrongPlatform {
        /// The image.
        reference: String,
        /// What was asked for.
        wanted: String,
        /// What the index offers.
        available: String,
    },
    /// Content did not match its digest or size.
    #[error(
        "{what} from {registry} does not match its digest (expected {expected}, got {actual}); the image was not registered: the registry or something between is corrupting data"
    )]
    DigestMismatch {
        /// The registry, `host[:port]`.
        registry: String,
        /// Which object.
        what: String,
        /// Announced digest or size.
        expected: String,
        /// Computed digest or size.
        actual: String,
    },
    /// The registry answered something we cannot use.
    #[error("registry {registry} sent an unusable answer for {reference}: {detail}")]
    Protocol {
        /// The registry, `host[:port]`.
        registry: String,
        /// The image.
        reference: String,
        /// What was wrong.
        detail: String,
    },
    /// A credentials file is unreadable or malformed.
    #[error("credentials file {path}: {reason}; fix or remove it")]
    CredentialsFile {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The image store refused the image (bad layer, limits, disk, ...).
    #[error(transparent)]
    Store(#[from] ImageError),
}

impl RegistryError {
    /// Whether retrying the same request may succeed.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(self, RegistryError::Offline { .. } | RegistryError::RateLimited { .. })
            || matches!(self, RegistryError::Protocol { detail, .. } if detail.starts_with("HTTP 5") || detail.starts_with("transfer"))
    }
}
