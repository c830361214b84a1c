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
pub use store::{GcStats, ImageConfig, ImageRecord, ImageStore, SourceKind};
pub use unpack::{Compression, UnpackLimits, UnpackStats, unpack_layer};
