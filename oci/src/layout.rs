//! Reading an OCI image layout: `oci-layout`, `index.json`, manifests,
//! configs and blobs, all verified against their digests before use.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::ImageError;
use crate::fsutil::{open_dir_at, open_dir_path};

/// Largest manifest, index or config accepted.
pub(crate) const MAX_JSON_BYTES: u64 = 4 << 20;

/// An OCI content descriptor (the fields we use).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Descriptor {
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// The platform of an index entry.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    #[cfg_attr(not(feature = "registry"), allow(dead_code))]
    pub variant: Option<String>,
}

/// An image index or Docker manifest list.
#[derive(Debug, Deserialize)]
pub(crate) struct Index {
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

/// An image manifest.
#[derive(Debug, Deserialize)]
pub(crate) struct Manifest {
    pub config: Descriptor,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
}

/// An image configuration (the fields we use).
#[derive(Debug, Deserialize)]
pub(crate) struct ImageConfigFile {
    #[serde(default)]
    pub architecture: Option<String>,
    #[serde(default)]
    pub os: Option<String>,
    #[serde(default)]
    pub config: Option<ContainerConfig>,
    pub rootfs: RootFs,
}

/// The `config` object of an image configuration.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ContainerConfig {
    #[serde(rename = "Env", default)]
    pub env: Option<Vec<String>>,
    #[serde(rename = "Cmd", default)]
    pub cmd: Option<Vec<String>>,
    #[serde(rename = "Entrypoint", default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "WorkingDir", default)]
    pub working_dir: Option<String>,
    #[serde(rename = "User", default)]
    pub user: Option<String>,
}

/// The `rootfs` object of an image configuration.
#[derive(Debug, Deserialize)]
pub(crate) struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

pub(crate) const INDEX_TYPES: [&str; 2] =
    ["application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"];
pub(crate) const MANIFEST_TYPES: [&str; 2] =
    ["application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"];
const CONFIG_TYPES: [&str; 2] = ["application/vnd.oci.image.config.v1+json", "application/vnd.docker.container.image.v1+json"];

/// Returns the hex part of a `sha256:<64 lowercase hex>` digest.
pub(crate) fn sha256_hex(digest: &str) -> Result<&str, ImageError> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| ImageError::InvalidImage(format!("unsupported digest {digest:?} (only sha256 is supported)")))?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(ImageError::InvalidImage(format!("malformed digest {digest:?}")));
    }
    Ok(hex)
}

/// Whether a layer media type is one we can unpack (plain, gzip or zstd tar).
pub(crate) fn layer_type_supported(media_type: &str) -> bool {
    let known =
        media_type.starts_with("application/vnd.oci.image.layer.") || media_type.starts_with("application/vnd.docker.image.rootfs.");
    known && !media_type.contains("encrypted")
}

/// The OCI name of this machine's architecture.
pub(crate) fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// An opened OCI image-layout directory.
pub(crate) struct LayoutDir {
    dir: OwnedFd,
}

impl LayoutDir {
    /// Whether `path` looks like an OCI layout (has an `oci-layout` file).
    pub(crate) fn is_layout(path: &Path) -> bool {
        std::fs::symlink_metadata(path.join("oci-layout")).is_ok_and(|m| m.is_file())
    }

    /// Opens the layout at `path` and checks its `oci-layout` marker.
    pub(crate) fn open(path: &Path) -> Result<LayoutDir, ImageError> {
        let dir = open_dir_path(path).map_err(|e| ImageError::io(format!("opening OCI layout {}", path.display()), e))?;
        let layout = LayoutDir { dir };
        let marker = layout.read_file("oci-layout", 64 * 1024)?;
        #[derive(Deserialize)]
        struct Marker {
            #[serde(rename = "imageLayoutVersion")]
            version: String,
        }
        let marker: Marker = parse_json(&marker, "oci-layout")?;
        if !marker.version.starts_with("1.") {
            return Err(ImageError::InvalidImage(format!("unsupported imageLayoutVersion {:?}", marker.version)));
        }
        Ok(layout)
    }

    fn read_file(&self, name: &str, max: u64) -> Result<Vec<u8>, ImageError> {
        let file = open_file_at(self.dir.as_fd(), OsStr::new(name))
            .map_err(|e| ImageError::InvalidImage(format!("cannot open {name} in the layout: {e}")))?;
        let mut data = Vec::new();
        file.take(max + 1).read_to_end(&mut data).map_err(|e| ImageError::io(format!("reading {name}"), e))?;
        if data.len() as u64 > max {
            return Err(ImageError::LimitExceeded(format!("{name} is larger than {max} bytes")));
        }
        Ok(data)
    }

    /// Opens the blob named by `digest` (not yet verified), never following
    /// a symlink inside the layout.
    pub(crate) fn open_blob(&self, digest: &str) -> Result<File, ImageError> {
        let hex = sha256_hex(digest)?;
        let open = || -> nix::Result<File> {
            let blobs = open_dir_at(self.dir.as_fd(), OsStr::new("blobs"))?;
            let sha = open_dir_at(blobs.as_fd(), OsStr::new("sha256"))?;
            open_file_at(sha.as_fd(), OsStr::new(hex))
        };
        open().map_err(|e| match e {
            Errno::ENOENT => ImageError::InvalidImage(format!("blob {digest} is missing from the layout")),
            other => ImageError::InvalidImage(format!("cannot open blob {digest}: {other}")),
        })
    }

    /// Reads a small blob completely and verifies its size and digest.
    pub(crate) fn read_verified(&self, desc: &Descriptor, max: u64) -> Result<Vec<u8>, ImageError> {
        if desc.size > max {
            return Err(ImageError::LimitExceeded(format!("{} is {} bytes (limit {max})", desc.digest, desc.size)));
        }
        let file = self.open_blob(&desc.digest)?;
        let mut data = Vec::new();
        file.take(desc.size + 1).read_to_end(&mut data).map_err(|e| ImageError::io(format!("reading blob {}", desc.digest), e))?;
        verify_bytes(&data, desc)?;
        Ok(data)
    }

    /// Picks the image manifest: the only one, else the one for linux and
    /// this machine's architecture, following nested indexes.
    pub(crate) fn select_manifest(&self) -> Result<(Descriptor, Manifest), ImageError> {
        let index_bytes = self.read_file("index.json", MAX_JSON_BYTES)?;
        let mut index: Index = parse_json(&index_bytes, "index.json")?;
        for _depth in 0..4 {
            let chosen = choose_entry(&index.manifests)?;
            if INDEX_TYPES.contains(&chosen.media_type.as_str()) {
                let bytes = self.read_verified(&chosen, MAX_JSON_BYTES)?;
                index = parse_json(&bytes, &chosen.digest)?;
                continue;
            }
            if !MANIFEST_TYPES.contains(&chosen.media_type.as_str()) {
                return Err(ImageError::InvalidImage(format!("unsupported manifest media type {:?}", chosen.media_type)));
            }
            let bytes = self.read_verified(&chosen, MAX_JSON_BYTES)?;
            let manifest: Manifest = parse_json(&bytes, &chosen.digest)?;
            return Ok((chosen, manifest));
        }
        Err(ImageError::InvalidImage("image indexes nested too deeply".into()))
    }

    /// Reads and checks the image configuration of `manifest`.
    pub(crate) fn read_config(&self, manifest: &Manifest) -> Result<(Vec<u8>, ImageConfigFile), ImageError> {
        check_config_type(manifest)?;
        let bytes = self.read_verified(&manifest.config, MAX_JSON_BYTES)?;
        let config = parse_config(manifest, &bytes, host_architecture())?;
        Ok((bytes, config))
    }
}

/// Refuses a config media type we do not understand.
pub(crate) fn check_config_type(manifest: &Manifest) -> Result<(), ImageError> {
    if !CONFIG_TYPES.contains(&manifest.config.media_type.as_str()) {
        return Err(ImageError::InvalidImage(format!("unsupported config media type {:?}", manifest.config.media_type)));
    }
    Ok(())
}

/// Parses verified config bytes and checks them against `manifest`: linux,
/// architecture `arch`, one diff_id per layer.
pub(crate) fn parse_config(manifest: &Manifest, bytes: &[u8], arch: &str) -> Result<ImageConfigFile, ImageError> {
    let config: ImageConfigFile = parse_json(bytes, &manifest.config.digest)?;
    if let Some(os) = &config.os
        && os != "linux"
    {
        return Err(ImageError::InvalidImage(format!("image is for {os:?}, not linux")));
    }
    if let Some(config_arch) = &config.architecture
        && config_arch != arch
    {
        return Err(ImageError::InvalidImage(format!("image is for architecture {config_arch:?}, expected {arch:?}")));
    }
    if config.rootfs.kind != "layers" {
        return Err(ImageError::InvalidImage(format!("unsupported rootfs type {:?}", config.rootfs.kind)));
    }
    if config.rootfs.diff_ids.len() != manifest.layers.len() {
        return Err(ImageError::InvalidImage(format!(
            "config lists {} diff_ids for {} layers",
            config.rootfs.diff_ids.len(),
            manifest.layers.len()
        )));
    }
    for diff_id in &config.rootfs.diff_ids {
        sha256_hex(diff_id)?;
    }
    Ok(config)
}

fn choose_entry(entries: &[Descriptor]) -> Result<Descriptor, ImageError> {
    match entries {
        [] => return Err(ImageError::InvalidImage("index lists no manifests".into())),
        [only] => return Ok(only.clone()),
        _ => {}
    }
    let arch = host_architecture();
    if let Some(found) = entries.iter().find(|d| d.platform.as_ref().is_some_and(|p| p.os == "linux" && p.architecture == arch)) {
        return Ok(found.clone());
    }
    let available: Vec<String> = entries
        .iter()
        .map(|d| match &d.platform {
            Some(p) => format!("{}/{}", p.os, p.architecture),
            None => format!("{} (no platform)", d.digest),
        })
        .collect();
    Err(ImageError::InvalidImage(format!("index lists {} manifests and none is for linux/{arch}: {}", entries.len(), available.join(", "))))
}

/// Checks `data` against the size and digest of `desc`.
pub(crate) fn verify_bytes(data: &[u8], desc: &Descriptor) -> Result<(), ImageError> {
    if data.len() as u64 != desc.size {
        return Err(ImageError::DigestMismatch {
            what: format!("size of {}", desc.digest),
            expected: desc.size.to_string(),
            actual: data.len().to_string(),
        });
    }
    let actual = format!("sha256:{}", hex::encode(Sha256::digest(data)));
    if actual != desc.digest {
        return Err(ImageError::DigestMismatch { what: "blob".into(), expected: desc.digest.clone(), actual });
    }
    Ok(())
}

/// Opens a regular file without following a symlink; O_NONBLOCK so that a
/// FIFO planted in a layout cannot hang the import.
fn open_file_at(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr) -> nix::Result<File> {
    let fd = openat(dir, name, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK, Mode::empty())?;
    let stat = nix::sys::stat::fstat(&fd)?;
    if nix::sys::stat::SFlag::from_bits_truncate(stat.st_mode) & nix::sys::stat::SFlag::S_IFMT != nix::sys::stat::SFlag::S_IFREG {
        return Err(Errno::EINVAL);
    }
    Ok(File::from(fd))
}

/// Parses JSON with an error that names the document.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, ImageError> {
    serde_json::from_slice(bytes).map_err(|e| ImageError::InvalidImage(format!("{what}: {e}")))
}
