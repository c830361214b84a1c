//! Pulling images from OCI registries (feature `registry`).
//!
//! The distribution protocol (token auth, manifests, blobs) is spoken by
//! `oci-client`; this module picks the platform, verifies every manifest and
//! blob against its digest and size, downloads layers in parallel with
//! retries and back-off straight into the store's verified blob area (shared
//! layers are stored once, and a killed pull is resumed blob by blob), then
//! unpacks and registers the image through the store.
//!
//! TLS uses rustls with the ring provider only; [`install_crypto_provider`]
//! makes it the process default (the first call wins, later calls are no-ops).

mod credentials;
mod error;
mod pull;
mod reference;

pub use credentials::{Credentials, credentials_from_file, credentials_from_json, save_credentials};
pub use error::RegistryError;
pub use pull::{LayerInfo, NoProgress, PullOptions, PullProgress, pull};
pub use reference::{ImageReference, Platform};

/// The media type a pull reads or infers from a manifest document (for the
/// fuzz targets through [`crate::fuzzing`]).
pub(crate) fn fuzz_document_media_type(bytes: &[u8]) -> String {
    pull::document_media_type(bytes)
}

/// Installs rustls' ring provider as the process-wide default, unless one
/// is installed already. Call it before any other rustls use in the process
/// (the coordinator's mutual TLS included) so a single provider is used.
pub fn install_crypto_provider() {
    // An Err means a provider is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
