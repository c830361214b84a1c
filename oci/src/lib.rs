//! Images and OCI bundles for Lazaret.
//!
//! * [`ImageStore`]: a content-addressed image store under the Storage Root.
//!   `import` accepts a rootfs directory, a rootfs tarball (plain, gzip or zstd,
//!   detected from the content), an OCI image-layout directory or an
//!   oci-archive tarball.
//! * [`unpack_layer`]: the hardened layer extractor the store uses for every
//!   source (and that a future registry pull will use): OCI whiteouts, opaque
//!   directories, and refusal of hostile archives.
//! * [`registry`] (feature `registry`, on by default): pulling images from
//!   OCI registries into the store.
//! * [`bundle`]: generation of the runsc `config.json` with every
//!   security-relevant field set explicitly.
//!
//! Store layout (all directories mode 0700, owned by the invoking user):
//!
//! ```text
//! <root>/lock                      flock: shared while importing, exclusive for rm/gc/cleanup
//! <root>/blobs/sha256/<hex>        manifests, configs, layers (verified, immutable)
//! <root>/rootfs/sha256/<chain-id>  unpacked root filesystems, keyed by OCI chain ID
//! <root>/refs/<sha256(name)>.json  one record per image name, written last and atomically
//! <root>/tmp/                      in-progress work; cleaned by the next `open`
//! ```

#![forbid(unsafe_code)]

pub mod bundle;
mod dirsource;
mod error;
mod fsutil;
mod layout;
#[cfg(feature = "registry")]
pub mod registry;
mod store;
mod timefmt;
mod unpack;

pub use error::ImageError;

/// The manifest, index and configuration parsers driven from outside the
/// crate, for the fuzz targets in `fuzz/` (docs/fuzzing.md): not part of the
/// API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::layout::{self, Index, Manifest};

    /// What [`read_documents`] made of its input.
    #[derive(Debug, Default)]
    pub struct Documents {
        /// The index parsed, with this many entries.
        pub index_entries: Option<usize>,
        /// The manifest parsed, with this many layers.
        pub manifest_layers: Option<usize>,
        /// The configuration passed every check against the manifest.
        pub config_ok: bool,
        /// Its diff_ids, when it did.
        pub diff_ids: Vec<String>,
        /// The `mediaType` the registry pull reads or infers from `document`.
        #[cfg(feature = "registry")]
        pub media_type: String,
    }

    /// Reads `document` as an index and as a manifest (as a layout import
    /// and a registry pull do), picks an index entry for linux/amd64, and
    /// checks `config` against the manifest for architecture `amd64`.
    pub fn read_documents(document: &[u8], config: &[u8]) -> Documents {
        let mut out = Documents::default();
        #[cfg(feature = "registry")]
        {
            out.media_type = crate::registry::fuzz_document_media_type(document);
        }
        if let Ok(index) = layout::parse_json::<Index>(document, "index") {
            out.index_entries = Some(index.manifests.len());
            for entry in &index.manifests {
                let _ = layout::sha256_hex(&entry.digest);
                let _ = layout::layer_type_supported(&entry.media_type);
            }
        }
        if let Ok(manifest) = layout::parse_json::<Manifest>(document, "manifest") {
            out.manifest_layers = Some(manifest.layers.len());
            for layer in &manifest.layers {
                let _ = layout::layer_type_supported(&layer.media_type);
                let _ = layout::verify_bytes(config, layer);
            }
            if layout::check_config_type(&manifest).is_ok()
                && let Ok(parsed) = layout::parse_config(&manifest, config, "amd64")
            {
                out.config_ok = true;
                out.diff_ids = parsed.rootfs.diff_ids;
            }
        }
        out
    }

    /// Whether `digest` is `sha256:` and 64 lowercase hex digits.
    pub fn is_sha256_digest(digest: &str) -> bool {
        layout::sha256_hex(digest).is_ok()
    }
}
pub use store::{GcStats, ImageConfig, ImageRecord, ImageStore, SourceKind};
pub use unpack::{Compression, UnpackLimits, UnpackStats, unpack_layer};
