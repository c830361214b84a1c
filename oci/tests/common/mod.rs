//! Fixture builders shared by the integration tests: raw tar archives written
//! with the `tar` crate's low-level header API (so hostile names are possible),
//! OCI layouts, and snapshots of directory trees.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Fails the test (never skips it) unless it runs as root. Only the tests
/// that check preserved ownership call it; the others run as any user.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (unpacking with the archive's file ownership): run it as root, with `sudo scripts/test.sh` or `cargo test -p lazaret-oci` in a root shell"
    );
}

/// Builds a tar stream entry by entry, with no path validation at all.
#[derive(Default)]
pub struct RawTar {
    buf: Vec<u8>,
}

fn header(kind: tar::EntryType, path: &[u8], size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_700_000_000);
    let name = &mut h.as_old_mut().name;
    assert!(path.len() <= name.len(), "use long_name for long paths");
    name[..path.len()].copy_from_slice(path);
    h
}

impl RawTar {
    pub fn new() -> Self {
        RawTar::default()
    }

    /// Appends a header (checksummed here) and its padded data.
    pub fn raw(&mut self, mut h: tar::Header, data: &[u8]) -> &mut Self {
        h.set_cksum();
        self.buf.extend_from_slice(h.as_bytes());
        self.buf.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.buf.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    pub fn file(&mut self, path: &str, data: &[u8]) -> &mut Self {
        self.file_mode(path, data, 0o644)
    }

    pub fn file_mode(&mut self, path: &str, data: &[u8], mode: u32) -> &mut Self {
        let h = header(tar::EntryType::Regular, path.as_bytes(), data.len() as u64, mode);
        self.raw(h, data)
    }

    pub fn file_owned(&mut self, path: &str, data: &[u8], mode: u32, uid: u64, gid: u64) -> &mut Self {
        let mut h = header(tar::EntryType::Regular, path.as_bytes(), data.len() as u64, mode);
        h.set_uid(uid);
        h.set_gid(gid);
        self.raw(h, data)
    }

    pub fn dir(&mut self, path: &str) -> &mut Self {
        let h = header(tar::EntryType::Directory, path.as_bytes(), 0, 0o755);
        self.raw(h, &[])
    }

    fn link(&mut self, kind: tar::EntryType, path: &str, target: &str) -> &mut Self {
        let mut h = header(kind, path.as_bytes(), 0, 0o777);
        let link = &mut h.as_old_mut().linkname;
        link[..target.len()].copy_from_slice(target.as_bytes());
        self.raw(h, &[])
    }

    pub fn symlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.link(tar::EntryType::Symlink, path, target)
    }

    pub fn hardlink(&mut self, path: &str, target: &str) -> &mut Self {
        self.link(tar::EntryType::Link, path, target)
    }

    pub fn special(&mut self, kind: tar::EntryType, path: &str) -> &mut Self {
        let mut h = header(kind, path.as_bytes(), 0, 0o666);
        h.set_device_major(1).expect("gnu header has device fields");
        h.set_device_minor(3).expect("gnu header has device fields");
        self.raw(h, &[])
    }

    /// A GNU long-name header announcing `declared` bytes but carrying `name`.
    pub fn long_name_declared(&mut self, name: &[u8], declared: u64) -> &mut Self {
        let mut h = header(tar::EntryType::GNULongName, b"././@LongLink", declared, 0o644);
        h.set_size(declared);
        let mut data = name.to_vec();
        data.push(0);
        self.raw(h, &data)
    }

    /// A regular file whose (long) name is carried by a GNU long-name header.
    pub fn long_file(&mut self, name: &[u8], data: &[u8]) -> &mut Self {
        self.long_name_declared(name, name.len() as u64 + 1);
        let h = header(tar::EntryType::Regular, b"placeholder", data.len() as u64, 0o644);
        self.raw(h, data)
    }

    /// A PAX extended header with the given records, then a regular file.
    pub fn pax_file(&mut self, records: &[(&str, &str)], header_path: &str, data: &[u8]) -> &mut Self {
        let mut body = Vec::new();
        for (key, value) in records {
            let content = format!(" {key}={value}\n");
            // The length prefix counts itself.
            let mut len = content.len() + 1;
            while format!("{len}{content}").len() != len {
                len += 1;
            }
            body.extend_from_slice(format!("{len}{content}").as_bytes());
        }
        let h = header(tar::EntryType::XHeader, b"PaxHeader", body.len() as u64, 0o644);
        self.raw(h, &body);
        self.file(header_path, data)
    }

    /// A regular-file header that declares `size` bytes of content but carries none.
    pub fn declared_only(&mut self, path: &str, size: u64) -> &mut Self {
        let mut h = header(tar::EntryType::Regular, path.as_bytes(), 0, 0o644);
        h.set_size(size);
        self.raw(h, &[])
    }

    /// The archive with its end-of-archive marker.
    pub fn finish(&self) -> Vec<u8> {
        let mut out = self.buf.clone();
        out.extend(std::iter::repeat_n(0u8, 1024));
        out
    }
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).expect("in-memory write");
    enc.finish().expect("in-memory gzip")
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).expect("in-memory zstd")
}

pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// What a tree looks like: path -> description (type, mode, size, content
/// hash or link target), without following symlinks.
pub fn snapshot(root: &Path, skip: &[&str]) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable test dir") {
            let entry = entry.expect("readable entry");
            let path = entry.path();
            let rel = path.strip_prefix(root).expect("under root").to_path_buf();
            if skip.iter().any(|s| rel == Path::new(s)) {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let desc = if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {:o}", meta.permissions().mode())
            } else if meta.file_type().is_symlink() {
                format!("symlink {:?}", std::fs::read_link(&path).expect("readlink"))
            } else {
                let data = std::fs::read(&path).expect("read");
                format!("file {:o} {} {}", meta.permissions().mode(), meta.len(), sha256(&data))
            };
            out.insert(rel, desc);
        }
    }
    out
}

/// A scratch area: `store/` (where everything may be written), `canary/`
/// (must never change) and `src/` (test inputs).
pub struct Arena {
    pub dir: tempfile::TempDir,
}

impl Arena {
    pub fn new() -> Arena {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("store")).expect("mkdir store");
        std::fs::create_dir_all(dir.path().join("canary/inner")).expect("mkdir canary");
        std::fs::write(dir.path().join("canary/secret"), b"do not touch").expect("write canary");
        std::fs::write(dir.path().join("canary/inner/file"), b"inner").expect("write canary");
        std::fs::create_dir_all(dir.path().join("src")).expect("mkdir src");
        Arena { dir }
    }
    pub fn store(&self) -> PathBuf {
        self.dir.path().join("store")
    }
    pub fn canary(&self) -> PathBuf {
        self.dir.path().join("canary")
    }
    pub fn src(&self) -> PathBuf {
        self.dir.path().join("src")
    }
    /// Everything outside `store/`.
    pub fn outside(&self) -> BTreeMap<PathBuf, String> {
        snapshot(self.dir.path(), &["store"])
    }
    /// A fresh destination directory inside the store, several levels deep
    /// so that `..` sequences would reach the canary.
    pub fn dest(&self, name: &str) -> PathBuf {
        let dest = self.store().join("work").join(name).join("rootfs");
        std::fs::create_dir_all(&dest).expect("mkdir dest");
        dest
    }
}

/// Inode number of a path (no symlink following).
pub fn ino(path: &Path) -> u64 {
    std::fs::symlink_metadata(path).expect("lstat").ino()
}

/// An OCI image layout under construction.
pub struct Layout {
    pub dir: PathBuf,
}

pub struct BuiltImage {
    pub manifest_digest: String,
    pub config_digest: String,
    pub layer_digests: Vec<String>,
}

impl Layout {
    pub fn new(dir: &Path) -> Layout {
        std::fs::create_dir_all(dir.join("blobs/sha256")).expect("mkdir blobs");
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).expect("write oci-layout");
        Layout { dir: dir.to_path_buf() }
    }

    pub fn blob(&self, data: &[u8]) -> String {
        let digest = sha256(data);
        let hex = digest.trim_start_matches("sha256:");
        std::fs::write(self.dir.join("blobs/sha256").join(hex), data).expect("write blob");
        digest
    }

    /// Writes an image of `layers` (uncompressed tars; stored gzip-compressed)
    /// and returns the manifest descriptor JSON and digests.
    pub fn image(&self, layers: &[Vec<u8>], arch: &str, config_extra: serde_json::Value) -> (serde_json::Value, BuiltImage) {
        let mut layer_descs = Vec::new();
        let mut diff_ids = Vec::new();
        let mut layer_digests = Vec::new();
        for layer in layers {
            let compressed = gzip(layer);
            let digest = self.blob(&compressed);
            diff_ids.push(sha256(layer));
            layer_descs.push(serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                "digest": digest, "size": compressed.len()
            }));
            layer_digests.push(digest);
        }
        let config = serde_json::json!({
            "architecture": arch, "os": "linux",
            "config": config_extra,
            "rootfs": {"type": "layers", "diff_ids": diff_ids}
        });
        let config_bytes = serde_json::to_vec(&config).expect("json");
        let config_digest = self.blob(&config_bytes);
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_bytes.len()},
            "layers": layer_descs
        });
        let manifest_bytes = serde_json::to_vec(&manifest).expect("json");
        let manifest_digest = self.blob(&manifest_bytes);
        let desc = serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest_bytes.len(),
            "platform": {"architecture": arch, "os": "linux"}
        });
        (desc, BuiltImage { manifest_digest, config_digest, layer_digests })
    }

    pub fn index(&self, manifests: &[serde_json::Value]) {
        let index = serde_json::json!({"schemaVersion": 2, "manifests": manifests});
        std::fs::write(self.dir.join("index.json"), serde_json::to_vec(&index).expect("json")).expect("write index");
    }
}

/// Packs a directory tree into a tar (for oci-archive fixtures).
pub fn tar_dir(dir: &Path) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.append_dir_all(".", dir).expect("tar dir");
    builder.into_inner().expect("finish tar")
}

/// The architecture name OCI uses for this machine.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}
