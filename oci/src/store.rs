//! The content-addressed image store.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::ImageError;
use crate::fsutil::{atomic_write, ensure_private_dir, fsync_dir};
use crate::layout::{Descriptor, ImageConfigFile, LayoutDir, Manifest, layer_type_supported, sha256_hex};
use crate::unpack::{UnpackLimits, unpack_layer};

/// Where an image came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// A root filesystem directory.
    RootfsDir,
    /// A root filesystem tarball (plain, gzip or zstd).
    RootfsTar,
    /// An OCI image-layout directory.
    OciLayout,
    /// A tarball of an OCI image layout.
    OciArchive,
    /// Pulled from an OCI registry.
    Registry,
}

/// The runtime defaults an image configuration carries (empty for rootfs imports).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `KEY=value` entries.
    pub env: Vec<String>,
    /// Default arguments (`Cmd`).
    pub cmd: Vec<String>,
    /// Entrypoint.
    pub entrypoint: Vec<String>,
    /// Working directory, if the image sets one.
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group` or `uid:gid`, if the image sets one.
    pub user: Option<String>,
}

/// One named image in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRecord {
    /// The image name (e.g. `debian:bookworm` or `docker.io/library/debian:trixie`).
    pub name: String,
    /// `sha256:...` identifying the image: the manifest digest for OCI
    /// sources, the chain ID of its single layer for rootfs sources.
    pub digest: String,
    /// The unpacked root filesystem. Shared between images: treat as read-only
    /// and never hand it to runsc directly.
    pub rootfs: PathBuf,
    /// Bytes of regular-file content in the rootfs (hard links counted once).
    pub size: u64,
    /// Import time, RFC 3339 UTC.
    pub created: String,
    /// Runtime defaults from the OCI config, if any.
    pub config: ImageConfig,
    /// What kind of source it was imported from.
    pub source_kind: SourceKind,
    /// Uncompressed layer digests (OCI `diff_ids`), bottom first.
    pub diff_ids: Vec<String>,
    /// Digests of the blobs in `blobs/sha256` this image references
    /// (manifest, config, layers; empty for rootfs sources).
    pub blobs: Vec<String>,
}

/// The on-disk ref record (`refs/<sha256(name)>.json`).
#[derive(Debug, Serialize, Deserialize)]
struct RefFile {
    schema: u32,
    name: String,
    digest: String,
    /// Hex chain ID naming `rootfs/sha256/<hex>`.
    rootfs_key: String,
    size: u64,
    created: String,
    config: ImageConfig,
    source_kind: SourceKind,
    diff_ids: Vec<String>,
    blobs: Vec<String>,
}

const REF_SCHEMA: u32 = 1;

/// A content-addressed image store rooted in a trusted directory.
///
/// Concurrent use by several processes is safe: imports hold a shared lock on
/// `<root>/lock`, removal and garbage collection an exclusive one.
#[derive(Debug)]
pub struct ImageStore {
    root: PathBuf,
    limits: UnpackLimits,
}

/// Unique suffix for work directories within one process.
static WORK_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The result of the source-specific part of an import.
struct Prepared {
    digest: String,
    diff_ids: Vec<String>,
    blobs: Vec<String>,
    config: ImageConfig,
    kind: SourceKind,
    /// Unpacked rootfs in the work area, or `None` when the store already has it.
    unpacked: Option<PathBuf>,
}

impl ImageStore {
    /// Opens (creating if needed) the store at `root` with default limits,
    /// and removes work left in `tmp/` by interrupted runs.
    pub fn open(root: &Path) -> Result<ImageStore, ImageError> {
        Self::open_with_limits(root, UnpackLimits::default())
    }

    /// Like [`ImageStore::open`], with explicit per-image unpack limits
    /// (`max_total_bytes` is the budget for all layers of one image).
    pub fn open_with_limits(root: &Path, limits: UnpackLimits) -> Result<ImageStore, ImageError> {
        let store = ImageStore { root: root.to_path_buf(), limits };
        for dir in [
            store.root.clone(),
            store.root.join("blobs"),
            store.blobs_dir(),
            store.root.join("rootfs"),
            store.rootfs_parent(),
            store.refs_dir(),
            store.tmp_dir(),
        ] {
            ensure_private_dir(&dir, 0o700).map_err(|e| ImageError::io(format!("creating store directory {}", dir.display()), e))?;
        }
        // Clean stale work only when nobody else is importing right now.
        if let Ok(_exclusive) = Flock::lock(store.lock_file()?, FlockArg::LockExclusiveNonblock) {
            let entries = std::fs::read_dir(store.tmp_dir()).map_err(|e| ImageError::io("listing the store's tmp directory", e))?;
            for entry in entries {
                let entry = entry.map_err(|e| ImageError::io("listing the store's tmp directory", e))?;
                remove_any(&entry.path()).map_err(|e| ImageError::io(format!("removing stale {}", entry.path().display()), e))?;
            }
        }
        Ok(store)
    }

    /// Imports `source` under `name`, replacing any image of that name.
    ///
    /// `source` may be a rootfs directory, a rootfs tarball (plain, gzip or
    /// zstd, detected from its content), an OCI image-layout directory or an
    /// oci-archive tarball. On failure nothing is registered and the work area
    /// is removed.
    pub fn import(&self, name: &str, source: &Path) -> Result<ImageRecord, ImageError> {
        validate_name(name)?;
        let bad_source = |reason: String| ImageError::BadSource { path: source.to_path_buf(), reason };
        let meta = std::fs::metadata(source).map_err(|e| bad_source(e.to_string()))?;
        let lock = Flock::lock(self.lock_file()?, FlockArg::LockShared).map_err(|(_, e)| ImageError::io("locking the image store", e))?;
        let work = WorkDir::create(&self.tmp_dir())?;
        let prepared = if meta.is_dir() {
            if LayoutDir::is_layout(source) {
                self.prepare_layout(source, &work, SourceKind::OciLayout)?
            } else {
                self.prepare_rootfs_dir(source, &work)?
            }
        } else if meta.is_file() {
            self.prepare_tarball(source, &work)?
        } else {
            return Err(bad_source("not a regular file or directory".into()));
        };
        let previous = self.read_ref(name)?;
        let record = self.commit(name, prepared)?;
        drop(work);
        drop(lock);
        if previous.is_some_and(|p| p.rootfs_key != hex_of(&record.rootfs) || p.blobs != record.blobs) {
            // Reclaim what the replaced image alone used, if no one is busy.
            if let Ok(_exclusive) = Flock::lock(self.lock_file()?, FlockArg::LockExclusiveNonblock) {
                // Best effort: an unreadable ref only postpones collection.
                let _ = self.collect_garbage();
            }
        }
        Ok(record)
    }

    /// The image named `name`, if any.
    pub fn get(&self, name: &str) -> Result<Option<ImageRecord>, ImageError> {
        validate_name(name)?;
        self.read_ref(name)?.map(|r| self.to_record(r)).transpose()
    }

    /// All images, sorted by name.
    pub fn list(&self) -> Result<Vec<ImageRecord>, ImageError> {
        let mut records = Vec::new();
        for ref_file in self.read_all_refs()? {
            records.push(self.to_record(ref_file)?);
        }
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }

    /// Removes the image `name`, then every unpacked rootfs and blob that no
    /// remaining image references.
    pub fn remove(&self, name: &str) -> Result<(), ImageError> {
        validate_name(name)?;
        let _lock =
            Flock::lock(self.lock_file()?, FlockArg::LockExclusive).map_err(|(_, e)| ImageError::io("locking the image store", e))?;
        let path = self.ref_path(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(ImageError::NotFound(name.to_string()));
            }
            Err(e) => return Err(ImageError::io(format!("removing {}", path.display()), e)),
        }
        fsync_dir(&self.refs_dir()).map_err(|e| ImageError::io("syncing refs directory", e))?;
        self.collect_garbage()
    }

    /// Garbage collection: waits for running imports and pulls, then deletes
    /// every blob and rootfs no image references, and the work left in `tmp/`
    /// by interrupted runs. Returns how many blobs and rootfs trees it removed.
    pub fn gc(&self) -> Result<GcStats, ImageError> {
        let _lock =
            Flock::lock(self.lock_file()?, FlockArg::LockExclusive).map_err(|(_, e)| ImageError::io("locking the image store", e))?;
        for name in read_dir_names(&self.tmp_dir())? {
            let path = self.tmp_dir().join(&name);
            remove_any(&path).map_err(|e| ImageError::io(format!("removing stale {}", path.display()), e))?;
        }
        let blobs_before = read_dir_names(&self.blobs_dir())?.len();
        let rootfs_before = read_dir_names(&self.rootfs_parent())?.len();
        self.collect_garbage()?;
        Ok(GcStats {
            blobs_removed: blobs_before.saturating_sub(read_dir_names(&self.blobs_dir())?.len()),
            rootfs_removed: rootfs_before.saturating_sub(read_dir_names(&self.rootfs_parent())?.len()),
        })
    }

    /// The digests (`sha256:...`) of every blob file in the store, sorted.
    pub fn blob_digests(&self) -> Result<Vec<String>, ImageError> {
        let mut names: Vec<String> = read_dir_names(&self.blobs_dir())?.into_iter().map(|hex| format!("sha256:{hex}")).collect();
        names.sort();
        Ok(names)
    }

    /// Starts a pull: holds the shared lock (so no garbage collection removes
    /// blobs fetched but not yet referenced) and a private work directory.
    #[cfg_attr(not(feature = "registry"), allow(dead_code))]
    pub(crate) fn begin_pull(&self) -> Result<PullSession<'_>, ImageError> {
        let lock = Flock::lock(self.lock_file()?, FlockArg::LockShared).map_err(|(_, e)| ImageError::io("locking the image store", e))?;
        let work = WorkDir::create(&self.tmp_dir())?;
        Ok(PullSession { store: self, _lock: lock, work })
    }

    /// Deletes rootfs trees and blobs no ref mentions. Caller holds the
    /// exclusive lock. Refuses to delete anything if a ref is unreadable.
    fn collect_garbage(&self) -> Result<(), ImageError> {
        let refs = self.read_all_refs()?;
        let rootfs_keys: HashSet<String> = refs.iter().map(|r| r.rootfs_key.clone()).collect();
        let mut blobs = HashSet::new();
        for r in &refs {
            for digest in &r.blobs {
                blobs.insert(sha256_hex(digest)?.to_string());
            }
        }
        for entry in read_dir_names(&self.rootfs_parent())? {
            if rootfs_keys.contains(&entry) {
                continue;
            }
            // Move it out of the keyed namespace first, so an interrupted
            // deletion never leaves a partial rootfs under a valid key.
            let doomed = self.tmp_dir().join(format!("gc-{entry}-{}", unique_suffix()));
            let from = self.rootfs_parent().join(&entry);
            std::fs::rename(&from, &doomed).map_err(|e| ImageError::io(format!("moving {} for deletion", from.display()), e))?;
            remove_any(&doomed).map_err(|e| ImageError::io(format!("deleting {}", doomed.display()), e))?;
        }
        for entry in read_dir_names(&self.blobs_dir())? {
            if !blobs.contains(&entry) {
                let path = self.blobs_dir().join(&entry);
                remove_any(&path).map_err(|e| ImageError::io(format!("deleting {}", path.display()), e))?;
            }
        }
        Ok(())
    }

    fn prepare_rootfs_dir(&self, source: &Path, work: &WorkDir) -> Result<Prepared, ImageError> {
        let source = source.canonicalize().map_err(|e| ImageError::io(format!("resolving {}", source.display()), e))?;
        let store_root = self.root.canonicalize().map_err(|e| ImageError::io(format!("resolving {}", self.root.display()), e))?;
        // Walking a tree that contains the store would copy the import into itself.
        if store_root.starts_with(&source) || source.starts_with(&store_root) {
            return Err(ImageError::BadSource { path: source, reason: format!("overlaps the image store at {}", store_root.display()) });
        }
        let rootfs = work.subdir("rootfs", 0o755)?;
        let (reader, producer) =
            crate::dirsource::spawn_tar_of_dir(source.clone()).map_err(|e| ImageError::io("starting directory reader", e))?;
        let unpacked = unpack_layer(reader, &rootfs, &self.limits);
        let produced =
            producer.join().map_err(|_| ImageError::io("reading source directory", io::Error::other("reader thread panicked")))?;
        let stats = match (unpacked, produced) {
            (Ok(stats), Ok(())) => stats,
            // A producer failure other than "reader went away" is the cause.
            (_, Err(e)) if e.kind() != io::ErrorKind::BrokenPipe => {
                return Err(ImageError::io(format!("reading {}", source.display()), e));
            }
            (Err(e), _) => return Err(e),
            (Ok(_), Err(e)) => {
                return Err(ImageError::io(format!("reading {}", source.display()), e));
            }
        };
        Ok(rootfs_prepared(stats.diff_id, SourceKind::RootfsDir, rootfs))
    }

    fn prepare_tarball(&self, source: &Path, work: &WorkDir) -> Result<Prepared, ImageError> {
        let file = File::open(source).map_err(|e| ImageError::BadSource { path: source.to_path_buf(), reason: e.to_string() })?;
        let extract = work.subdir("extract", 0o755)?;
        let stats = unpack_layer(file, &extract, &self.limits).map_err(|e| match e {
            ImageError::Io { context, source: err } if context.starts_with("reading archive") => {
                ImageError::BadSource { path: source.to_path_buf(), reason: format!("not a readable tar archive ({context}: {err})") }
            }
            other => other,
        })?;
        if LayoutDir::is_layout(&extract) {
            return self.prepare_layout(&extract, work, SourceKind::OciArchive);
        }
        if stats.files + stats.directories + stats.symlinks + stats.hardlinks == 0 {
            return Err(ImageError::BadSource { path: source.to_path_buf(), reason: "the archive contains no files".into() });
        }
        Ok(rootfs_prepared(stats.diff_id, SourceKind::RootfsTar, extract))
    }

    fn prepare_layout(&self, path: &Path, work: &WorkDir, kind: SourceKind) -> Result<Prepared, ImageError> {
        let layout = LayoutDir::open(path)?;
        let (manifest_desc, manifest) = layout.select_manifest()?;
        let (config_bytes, config) = layout.read_config(&manifest)?;
        if manifest.layers.is_empty() {
            return Err(ImageError::InvalidImage("the image has no layers".into()));
        }
        for layer in &manifest.layers {
            if !layer_type_supported(&layer.media_type) {
                return Err(ImageError::InvalidImage(format!("unsupported layer media type {:?}", layer.media_type)));
            }
        }
        // Manifest and config were verified when read; store them as blobs.
        let manifest_bytes = layout.read_verified(&manifest_desc, crate::layout::MAX_JSON_BYTES)?;
        self.store_blob_bytes(&manifest_desc.digest, &manifest_bytes, work)?;
        self.store_blob_bytes(&manifest.config.digest, &config_bytes, work)?;
        for layer in &manifest.layers {
            self.ingest_blob(&layout, layer, work)?;
        }
        self.prepare_from_blobs(manifest_desc.digest, &manifest, config, work, kind)
    }

    /// Unpacks (unless the store already has the rootfs) an image whose
    /// manifest, config and layers are all verified blobs in `blobs/`.
    fn prepare_from_blobs(
        &self,
        manifest_digest: String,
        manifest: &Manifest,
        config: ImageConfigFile,
        work: &WorkDir,
        kind: SourceKind,
    ) -> Result<Prepared, ImageError> {
        let diff_ids = config.rootfs.diff_ids.clone();
        let key = chain_id(&diff_ids)?;
        let unpacked = if self.rootfs_parent().join(&key).is_dir() {
            None
        } else {
            let rootfs = work.subdir("rootfs", 0o755)?;
            let mut used = 0u64;
            for (layer, diff_id) in manifest.layers.iter().zip(&diff_ids) {
                let blob = self.blob_path(&layer.digest)?;
                let file = File::open(&blob).map_err(|e| ImageError::io(format!("opening {}", blob.display()), e))?;
                let limits = UnpackLimits { max_total_bytes: self.limits.max_total_bytes.saturating_sub(used), ..self.limits.clone() };
                let stats = unpack_layer(file, &rootfs, &limits)?;
                used += stats.uncompressed_bytes;
                if &stats.diff_id != diff_id {
                    return Err(ImageError::DigestMismatch {
                        what: format!("uncompressed layer {}", layer.digest),
                        expected: diff_id.clone(),
                        actual: stats.diff_id,
                    });
                }
            }
            Some(rootfs)
        };
        let mut blobs = vec![manifest_digest.clone(), manifest.config.digest.clone()];
        blobs.extend(manifest.layers.iter().map(|l| l.digest.clone()));
        let container = config.config.unwrap_or_default();
        Ok(Prepared {
            digest: manifest_digest,
            diff_ids,
            blobs,
            config: ImageConfig {
                env: container.env.unwrap_or_default(),
                cmd: container.cmd.unwrap_or_default(),
                entrypoint: container.entrypoint.unwrap_or_default(),
                working_dir: container.working_dir.filter(|w| !w.is_empty()),
                user: container.user.filter(|u| !u.is_empty()),
            },
            kind,
            unpacked,
        })
    }

    /// Copies a layout blob into `blobs/sha256`, verifying size and digest
    /// on the way; a blob already in the store is reused.
    fn ingest_blob(&self, layout: &LayoutDir, desc: &Descriptor, work: &WorkDir) -> Result<(), ImageError> {
        let target = self.blob_path(&desc.digest)?;
        if target.is_file() {
            return Ok(());
        }
        if desc.size > self.limits.max_total_bytes {
            return Err(ImageError::LimitExceeded(format!(
                "layer {} is {} bytes (limit {})",
                desc.digest, desc.size, self.limits.max_total_bytes
            )));
        }
        let source = layout.open_blob(&desc.digest)?;
        let temp = work.path.join(format!("blob-{}", unique_suffix()));
        let mut out = new_private_file(&temp)?;
        let mut hasher = Sha256::new();
        let mut reader = source.take(desc.size + 1);
        let mut buf = vec![0u8; 256 * 1024];
        let mut copied = 0u64;
        loop {
            let n = reader.read(&mut buf).map_err(|e| ImageError::io(format!("reading blob {}", desc.digest), e))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(|e| ImageError::io(format!("writing {}", temp.display()), e))?;
            copied += n as u64;
        }
        if copied != desc.size {
            return Err(ImageError::DigestMismatch {
                what: format!("size of {}", desc.digest),
                expected: desc.size.to_string(),
                actual: copied.to_string(),
            });
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != desc.digest {
            return Err(ImageError::DigestMismatch { what: "layer blob".into(), expected: desc.digest.clone(), actual });
        }
        self.publish_blob(out, &temp, &target)
    }

    fn store_blob_bytes(&self, digest: &str, bytes: &[u8], work: &WorkDir) -> Result<(), ImageError> {
        let target = self.blob_path(digest)?;
        if target.is_file() {
            return Ok(());
        }
        let temp = work.path.join(format!("blob-{}", unique_suffix()));
        let mut out = new_private_file(&temp)?;
        out.write_all(bytes).map_err(|e| ImageError::io(format!("writing {}", temp.display()), e))?;
        self.publish_blob(out, &temp, &target)
    }

    fn publish_blob(&self, file: File, temp: &Path, target: &Path) -> Result<(), ImageError> {
        file.sync_all().map_err(|e| ImageError::io(format!("syncing {}", temp.display()), e))?;
        std::fs::rename(temp, target).map_err(|e| ImageError::io(format!("storing blob {}", target.display()), e))?;
        fsync_dir(&self.blobs_dir()).map_err(|e| ImageError::io("syncing blobs directory", e))
    }

    /// Moves the unpacked rootfs into place, makes everything durable, then
    /// writes the ref record (the commit point).
    fn commit(&self, name: &str, prepared: Prepared) -> Result<ImageRecord, ImageError> {
        let key = chain_id(&prepared.diff_ids)?;
        let final_path = self.rootfs_parent().join(&key);
        if let Some(unpacked) = &prepared.unpacked {
            match std::fs::rename(unpacked, &final_path) {
                Ok(()) => {}
                // Same content already published by a concurrent import.
                Err(_) if final_path.is_dir() => {}
                Err(e) => {
                    return Err(ImageError::io(format!("publishing rootfs {}", final_path.display()), e));
                }
            }
        }
        if !final_path.is_dir() {
            return Err(ImageError::Corrupt(format!("rootfs {} vanished during import", final_path.display())));
        }
        let size = tree_size(&final_path).map_err(|e| ImageError::io(format!("measuring {}", final_path.display()), e))?;
        let root_dir = File::open(&self.root).map_err(|e| ImageError::io("opening store root", e))?;
        nix::unistd::syncfs(&root_dir).map_err(|e| ImageError::io("syncing the store", e))?;
        let ref_file = RefFile {
            schema: REF_SCHEMA,
            name: name.to_string(),
            digest: prepared.digest,
            rootfs_key: key,
            size,
            created: crate::timefmt::now_rfc3339(),
            config: prepared.config,
            source_kind: prepared.kind,
            diff_ids: prepared.diff_ids,
            blobs: prepared.blobs,
        };
        let json = serde_json::to_vec_pretty(&ref_file).map_err(|e| ImageError::io("encoding ref record", io::Error::other(e)))?;
        atomic_write(&self.refs_dir(), &ref_file_name(name), &json, 0o600).map_err(|e| ImageError::io("writing ref record", e))?;
        self.to_record(ref_file)
    }

    fn to_record(&self, r: RefFile) -> Result<ImageRecord, ImageError> {
        let rootfs = self.rootfs_parent().join(&r.rootfs_key);
        if !rootfs.is_dir() {
            return Err(ImageError::Corrupt(format!("image {:?} has no rootfs at {}; remove and re-import it", r.name, rootfs.display())));
        }
        Ok(ImageRecord {
            name: r.name,
            digest: r.digest,
            rootfs,
            size: r.size,
            created: r.created,
            config: r.config,
            source_kind: r.source_kind,
            diff_ids: r.diff_ids,
            blobs: r.blobs,
        })
    }

    fn read_ref(&self, name: &str) -> Result<Option<RefFile>, ImageError> {
        let path = self.ref_path(name);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ImageError::io(format!("reading {}", path.display()), e)),
        };
        let parsed = parse_ref(&bytes, &path)?;
        if parsed.name != name {
            return Err(ImageError::Corrupt(format!("{} names {:?}, not {name:?}", path.display(), parsed.name)));
        }
        Ok(Some(parsed))
    }

    fn read_all_refs(&self) -> Result<Vec<RefFile>, ImageError> {
        let mut refs = Vec::new();
        for name in read_dir_names(&self.refs_dir())? {
            if name.starts_with('.') || !name.ends_with(".json") {
                continue; // temp files of atomic_write
            }
            let path = self.refs_dir().join(&name);
            let bytes = std::fs::read(&path).map_err(|e| ImageError::io(format!("reading {}", path.display()), e))?;
            refs.push(parse_ref(&bytes, &path)?);
        }
        Ok(refs)
    }

    fn lock_file(&self) -> Result<File, ImageError> {
        let path = self.root.join("lock");
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| ImageError::io(format!("opening {}", path.display()), e))
    }

    fn blobs_dir(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }
    fn rootfs_parent(&self) -> PathBuf {
        self.root.join("rootfs").join("sha256")
    }
    fn refs_dir(&self) -> PathBuf {
        self.root.join("refs")
    }
    fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }
    fn ref_path(&self, name: &str) -> PathBuf {
        self.refs_dir().join(ref_file_name(name))
    }
    fn blob_path(&self, digest: &str) -> Result<PathBuf, ImageError> {
        Ok(self.blobs_dir().join(sha256_hex(digest)?))
    }
}

fn rootfs_prepared(diff_id: String, kind: SourceKind, unpacked: PathBuf) -> Prepared {
    Prepared {
        // One layer: its chain ID is its diff_id.
        digest: diff_id.clone(),
        diff_ids: vec![diff_id],
        blobs: Vec::new(),
        config: ImageConfig::default(),
        kind,
        unpacked: Some(unpacked),
    }
}

fn parse_ref(bytes: &[u8], path: &Path) -> Result<RefFile, ImageError> {
    let parsed: RefFile = serde_json::from_slice(bytes).map_err(|e| ImageError::Corrupt(format!("{}: {e}", path.display())))?;
    if parsed.schema != REF_SCHEMA {
        return Err(ImageError::Corrupt(format!("{}: unknown schema {}", path.display(), parsed.schema)));
    }
    sha256_hex(&format!("sha256:{}", parsed.rootfs_key)).map_err(|_| ImageError::Corrupt(format!("{}: bad rootfs key", path.display())))?;
    Ok(parsed)
}

/// The OCI chain ID (hex) of a list of diff_ids.
fn chain_id(diff_ids: &[String]) -> Result<String, ImageError> {
    let mut chain: Option<String> = None;
    for diff_id in diff_ids {
        sha256_hex(diff_id)?;
        chain = Some(match chain {
            None => diff_id.clone(),
            Some(previous) => format!("sha256:{}", hex::encode(Sha256::digest(format!("{previous} {diff_id}").as_bytes()))),
        });
    }
    let chain = chain.ok_or_else(|| ImageError::InvalidImage("the image has no layers".into()))?;
    Ok(sha256_hex(&chain)?.to_string())
}

fn hex_of(rootfs: &Path) -> String {
    rootfs.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Image names: 1-255 bytes of `[A-Za-z0-9._/:@+-]`, starting alphanumeric.
fn validate_name(name: &str) -> Result<(), ImageError> {
    let invalid = |reason: &str| ImageError::InvalidName { name: name.to_string(), reason: reason.to_string() };
    if name.is_empty() || name.len() > 255 {
        return Err(invalid("must be 1 to 255 characters long"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(invalid("must start with a letter or digit"));
    }
    if let Some(bad) = name.chars().find(|c| !(c.is_ascii_alphanumeric() || "._/:@+-".contains(*c))) {
        return Err(invalid(&format!("character {bad:?} is not allowed (use letters, digits and ._/:@+-)")));
    }
    Ok(())
}

/// Ref files are named by the hash of the image name, so any valid name
/// (slashes, colons) maps to one safe, fixed-length file name.
fn ref_file_name(name: &str) -> String {
    format!("{}.json", hex::encode(Sha256::digest(name.as_bytes())))
}

fn unique_suffix() -> String {
    format!("{}-{}", std::process::id(), WORK_COUNTER.fetch_add(1, Ordering::Relaxed))
}

fn new_private_file(path: &Path) -> Result<File, ImageError> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| ImageError::io(format!("creating {}", path.display()), e))
}

fn read_dir_names(dir: &Path) -> Result<Vec<String>, ImageError> {
    let mut names = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| ImageError::io(format!("listing {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ImageError::io(format!("listing {}", dir.display()), e))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// Removes a file, symlink or directory tree without following symlinks.
fn remove_any(path: &Path) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Sum of regular-file sizes under `root`, hard links counted once, no
/// symlink followed.
fn tree_size(root: &Path) -> io::Result<u64> {
    let mut seen = HashSet::new();
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let meta = entry.metadata()?; // DirEntry::metadata does not follow symlinks
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() && (meta.nlink() == 1 || seen.insert((meta.dev(), meta.ino()))) {
                total += meta.len();
            }
        }
    }
    Ok(total)
}

/// What [`ImageStore::gc`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Blob files deleted.
    pub blobs_removed: usize,
    /// Unpacked root filesystems deleted.
    pub rootfs_removed: usize,
}

/// An in-progress registry pull: blobs are verified into a private temp file
/// and published into `blobs/` one by one (so a killed pull is resumed at blob
/// granularity by the next one); the ref is written only by
/// [`PullSession::commit`].
#[cfg_attr(not(feature = "registry"), allow(dead_code))]
pub(crate) struct PullSession<'a> {
    store: &'a ImageStore,
    _lock: Flock<File>,
    work: WorkDir,
}

#[cfg_attr(not(feature = "registry"), allow(dead_code))]
impl PullSession<'_> {
    /// The largest total of layer bytes the store accepts for one image.
    pub(crate) fn max_image_bytes(&self) -> u64 {
        self.store.limits.max_total_bytes
    }

    /// Whether the store already holds the verified blob `digest`.
    pub(crate) fn has_blob(&self, digest: &str) -> Result<bool, ImageError> {
        Ok(self.store.blob_path(digest)?.is_file())
    }

    /// A fresh path for a temporary download inside the work directory.
    pub(crate) fn temp_path(&self) -> PathBuf {
        self.work.path.join(format!("blob-{}", unique_suffix()))
    }

    /// Creates a private temp file for a download.
    pub(crate) fn create_temp(&self) -> Result<(PathBuf, File), ImageError> {
        let path = self.temp_path();
        let file = new_private_file(&path)?;
        Ok((path, file))
    }

    /// Publishes a downloaded temp file as blob `digest`. The caller has
    /// verified its size and digest while writing it.
    pub(crate) fn publish(&self, file: File, temp: &Path, digest: &str) -> Result<(), ImageError> {
        let target = self.store.blob_path(digest)?;
        self.store.publish_blob(file, temp, &target)
    }

    /// Stores already verified bytes (manifest, config) as blob `digest`.
    pub(crate) fn store_bytes(&self, digest: &str, bytes: &[u8]) -> Result<(), ImageError> {
        self.store.store_blob_bytes(digest, bytes, &self.work)
    }

    /// Opens the stored blob `digest` for reading.
    pub(crate) fn open_blob(&self, digest: &str) -> Result<File, ImageError> {
        let path = self.store.blob_path(digest)?;
        File::open(&path).map_err(|e| ImageError::io(format!("opening {}", path.display()), e))
    }

    /// Unpacks the image whose manifest, config and layer blobs are all in
    /// the store, then registers it under `name` (the commit point).
    pub(crate) fn commit(
        self,
        name: &str,
        manifest_digest: &str,
        manifest: &Manifest,
        config: ImageConfigFile,
    ) -> Result<ImageRecord, ImageError> {
        validate_name(name)?;
        for digest in std::iter::once(manifest_digest)
            .chain(std::iter::once(manifest.config.digest.as_str()))
            .chain(manifest.layers.iter().map(|l| l.digest.as_str()))
        {
            if !self.has_blob(digest)? {
                return Err(ImageError::Corrupt(format!("blob {digest} vanished before the pull was committed")));
            }
        }
        let prepared = self.store.prepare_from_blobs(manifest_digest.to_string(), manifest, config, &self.work, SourceKind::Registry)?;
        let previous = self.store.read_ref(name)?;
        let record = self.store.commit(name, prepared)?;
        let store = self.store;
        drop(self); // releases the shared lock and the work directory
        if previous.is_some_and(|p| p.rootfs_key != hex_of(&record.rootfs) || p.blobs != record.blobs) {
            // As `import` does: reclaim what the replaced image alone used,
            // if no import or pull is running.
            if let Ok(_exclusive) = Flock::lock(store.lock_file()?, FlockArg::LockExclusiveNonblock) {
                let _ = store.collect_garbage();
            }
        }
        Ok(record)
    }
}

/// A private directory in the store's `tmp/`, removed when dropped.
struct WorkDir {
    path: PathBuf,
}

impl WorkDir {
    fn create(tmp: &Path) -> Result<WorkDir, ImageError> {
        let path = tmp.join(format!("import-{}", unique_suffix()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| ImageError::io(format!("creating work directory {}", path.display()), e))?;
        Ok(WorkDir { path })
    }

    fn subdir(&self, name: &str, mode: u32) -> Result<PathBuf, ImageError> {
        let path = self.path.join(name);
        std::fs::DirBuilder::new().mode(mode).create(&path).map_err(|e| ImageError::io(format!("creating {}", path.display()), e))?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| ImageError::io(format!("setting mode of {}", path.display()), e))?;
        Ok(path)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        // Best effort; a later `open` removes anything left behind.
        let _ = remove_any(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(validate_name("docker.io/library/debian:trixie").is_ok());
        assert!(validate_name("bookworm-git").is_ok());
        for bad in ["", "../x", "-x", "a b", "a\0b", ".hidden", &"x".repeat(256)] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn chain_id_follows_the_oci_definition() -> Result<(), ImageError> {
        let a = format!("sha256:{}", "a".repeat(64));
        let b = format!("sha256:{}", "b".repeat(64));
        assert_eq!(chain_id(std::slice::from_ref(&a))?, "a".repeat(64));
        let expected = hex::encode(Sha256::digest(format!("{a} {b}").as_bytes()));
        assert_eq!(chain_id(&[a, b])?, expected);
        assert!(chain_id(&[]).is_err());
        Ok(())
    }
}
