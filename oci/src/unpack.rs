//! Hardened extraction of one tar layer (plain, gzip or zstd) into a directory.
//!
//! Safety model: every path is normalised component by component (`..` refuses
//! the archive, a leading `/` is made relative), every parent directory is
//! opened fd-relative with `O_NOFOLLOW` (a symlinked parent refuses the
//! archive), and every entry is created fd-relative after removing whatever was
//! there, with `O_EXCL|O_NOFOLLOW` for files. Nothing already on disk is ever
//! followed, so symlinks in the archive (which may point anywhere; they are
//! kept as they are, since they resolve inside the sandbox) are harmless here.
//!
//! Policy decisions:
//! * Device nodes, FIFOs: skipped and counted in [`UnpackStats::skipped_special`]
//!   (the sandbox gets its own `/dev`).
//! * GNU sparse entries and unknown entry types: the archive is refused.
//! * setuid/setgid/sticky bits: kept (images need them, e.g. `su`, `passwd`);
//!   the store keeps rootfs trees under 0700 directories so no host user can
//!   reach such binaries.
//! * Ownership: uid/gid from the archive when running as root, else left as is.
//! * xattrs: ignored. Directory mtimes: not restored.
//! * Whiteouts: `.wh.NAME` removes NAME from lower layers; `.wh..wh..opq`
//!   hides all lower-layer content of its directory. Neither is materialised.

use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, UtimensatFlags, fchmod, fstatat, futimens, mkdirat, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, fchown, fchownat, linkat, symlinkat};
use sha2::{Digest, Sha256};

use crate::error::ImageError;
use crate::fsutil::{list_dir, open_dir_at, open_dir_path, remove_tree_at};

/// Safety limits applied while unpacking one archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpackLimits {
    /// Maximum bytes of the uncompressed tar stream, and of file content written.
    pub max_total_bytes: u64,
    /// Maximum number of archive entries (extension headers included).
    pub max_entries: u64,
    /// Maximum length in bytes of an entry path or link target.
    pub max_path_bytes: usize,
    /// Maximum number of components of an entry path.
    pub max_path_depth: usize,
    /// Maximum ratio of uncompressed to compressed bytes (compressed input only).
    pub max_compression_ratio: u64,
    /// The ratio is enforced only once the uncompressed stream exceeds this size,
    /// so small, highly compressible layers are not refused.
    pub ratio_check_after_bytes: u64,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        UnpackLimits {
            max_total_bytes: 16 << 30,
            max_entries: 2_000_000,
            max_path_bytes: 4096,
            max_path_depth: 128,
            max_compression_ratio: 200,
            ratio_check_after_bytes: 256 << 20,
        }
    }
}

/// Compression detected from the first bytes of the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// A plain tar stream.
    None,
    /// gzip (one or more members).
    Gzip,
    /// zstd (one or more frames).
    Zstd,
}

/// What [`unpack_layer`] read and wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnpackStats {
    /// `sha256:<hex>` of every byte read from the input (the blob digest).
    pub compressed_digest: String,
    /// `sha256:<hex>` of the uncompressed tar stream (the OCI `diff_id`).
    pub diff_id: String,
    /// Detected compression.
    pub compression: Compression,
    /// Bytes read from the input.
    pub compressed_bytes: u64,
    /// Bytes of the uncompressed tar stream.
    pub uncompressed_bytes: u64,
    /// Archive entries seen (extension headers included).
    pub entries: u64,
    /// Regular files written.
    pub files: u64,
    /// Directories created or updated.
    pub directories: u64,
    /// Symlinks created.
    pub symlinks: u64,
    /// Hard links created.
    pub hardlinks: u64,
    /// Whiteout and opaque markers applied.
    pub whiteouts: u64,
    /// Device nodes and FIFOs skipped.
    pub skipped_special: u64,
    /// Bytes of regular-file content written.
    pub file_bytes: u64,
}

/// Unpacks one tar layer from `reader` into the existing directory `dest`,
/// applying OCI whiteouts against what `dest` already holds.
///
/// The compression (none, gzip, zstd) is detected from the content. On error,
/// `dest` may hold part of the layer: callers unpack into a scratch directory
/// and discard it on failure (the store does).
pub fn unpack_layer(reader: impl Read, dest: &Path, limits: &UnpackLimits) -> Result<UnpackStats, ImageError> {
    let root = open_dir_path(dest).map_err(|e| ImageError::io(format!("opening unpack destination {}", dest.display()), e))?;
    let state = Rc::new(RefCell::new(StreamState::default()));
    let mut buffered = BufReader::with_capacity(256 * 1024, RawCounter { inner: reader, state: Rc::clone(&state) });
    let magic = buffered.fill_buf().map_err(|e| ImageError::io("reading archive", e))?;
    let compression = if magic.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    };
    let decoded: Box<dyn Read + '_> = match compression {
        Compression::None => Box::new(buffered),
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(buffered)),
        Compression::Zstd => Box::new(zstd::Decoder::with_buffer(buffered).map_err(|e| ImageError::io("starting zstd decoder", e))?),
    };
    let tar_stream = TarCounter {
        inner: decoded,
        state: Rc::clone(&state),
        max_total_bytes: limits.max_total_bytes,
        max_ratio: (compression != Compression::None).then_some(limits.max_compression_ratio),
        ratio_after: limits.ratio_check_after_bytes,
    };
    let mut archive = tar::Archive::new(tar_stream);
    let euid_is_root = nix::unistd::geteuid().is_root();
    let mut extractor = Extractor {
        root,
        limits,
        stats: UnpackStats {
            compressed_digest: String::new(),
            diff_id: String::new(),
            compression,
            compressed_bytes: 0,
            uncompressed_bytes: 0,
            entries: 0,
            files: 0,
            directories: 0,
            symlinks: 0,
            hardlinks: 0,
            whiteouts: 0,
            skipped_special: 0,
            file_bytes: 0,
        },
        touched: HashSet::new(),
        chown: euid_is_root,
    };
    let outcome = extractor.run(&mut archive).and_then(|()| {
        // Hash the rest of the stream (end-of-archive blocks, padding) so the
        // digests cover every byte, as OCI digests do.
        let mut rest = archive.into_inner();
        io::copy(&mut rest, &mut io::sink()).map(drop).map_err(|e| ImageError::io("reading the end of the archive", e))
    });
    let state = state.borrow();
    if let Some(violation) = &state.violation {
        return Err(ImageError::LimitExceeded(violation.clone()));
    }
    outcome?;
    let mut stats = extractor.stats;
    stats.compressed_digest = format!("sha256:{}", hex::encode(state.raw_hasher.clone().finalize()));
    stats.diff_id = format!("sha256:{}", hex::encode(state.tar_hasher.clone().finalize()));
    stats.compressed_bytes = state.raw_bytes;
    stats.uncompressed_bytes = state.tar_bytes;
    Ok(stats)
}

/// Byte counts and digests shared by the two counting readers.
#[derive(Default)]
struct StreamState {
    raw_hasher: Sha256,
    raw_bytes: u64,
    tar_hasher: Sha256,
    tar_bytes: u64,
    violation: Option<String>,
}

/// Counts and hashes the raw (possibly compressed) input.
struct RawCounter<R> {
    inner: R,
    state: Rc<RefCell<StreamState>>,
}

impl<R: Read> Read for RawCounter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut state = self.state.borrow_mut();
        state.raw_hasher.update(&buf[..n]);
        state.raw_bytes += n as u64;
        Ok(n)
    }
}

/// Counts and hashes the uncompressed tar stream and enforces size and ratio limits.
struct TarCounter<R> {
    inner: R,
    state: Rc<RefCell<StreamState>>,
    max_total_bytes: u64,
    max_ratio: Option<u64>,
    ratio_after: u64,
}

impl<R: Read> Read for TarCounter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut state = self.state.borrow_mut();
        state.tar_hasher.update(&buf[..n]);
        state.tar_bytes += n as u64;
        let violation = if state.tar_bytes > self.max_total_bytes {
            Some(format!("uncompressed archive is larger than {} bytes", self.max_total_bytes))
        } else {
            match self.max_ratio {
                Some(ratio) if state.tar_bytes > self.ratio_after && state.tar_bytes > state.raw_bytes.saturating_mul(ratio) => {
                    Some(format!("decompression ratio exceeds {ratio}:1 ({} bytes from {})", state.tar_bytes, state.raw_bytes))
                }
                _ => None,
            }
        };
        if let Some(message) = violation {
            state.violation = Some(message.clone());
            return Err(io::Error::other(message));
        }
        Ok(n)
    }
}

/// Extension headers (GNU long names, PAX records) waiting for their entry.
#[derive(Default)]
struct PendingExtensions {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

impl PendingExtensions {
    fn is_empty(&self) -> bool {
        self.long_name.is_none() && self.long_link.is_none() && self.pax.is_none()
    }
}

/// Metadata of one real (non-extension) entry.
struct EntryMeta {
    path: Vec<u8>,
    link: Option<Vec<u8>>,
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: i64,
    size: u64,
}

struct Extractor<'a> {
    root: OwnedFd,
    limits: &'a UnpackLimits,
    stats: UnpackStats,
    /// Paths (joined with `/`) created by this layer, and all their ancestors.
    touched: HashSet<Vec<u8>>,
    chown: bool,
}

/// Longest accepted PAX extension header.
const MAX_PAX_BYTES: u64 = 1 << 20;

impl Extractor<'_> {
    fn run<R: Read>(&mut self, archive: &mut tar::Archive<R>) -> Result<(), ImageError> {
        let entries = archive.entries().map_err(|e| ImageError::io("reading archive", e))?.raw(true);
        let mut pending = PendingExtensions::default();
        for entry in entries {
            let mut entry = entry.map_err(|e| ImageError::io("reading archive entry", e))?;
            self.stats.entries += 1;
            if self.stats.entries > self.limits.max_entries {
                return Err(ImageError::LimitExceeded(format!("more than {} entries", self.limits.max_entries)));
            }
            let header = entry.header().clone();
            let kind = header.entry_type().as_byte();
            let declared = header.entry_size().map_err(|e| ImageError::InvalidArchive(format!("bad entry size: {e}")))?;
            match kind {
                b'L' | b'K' => {
                    let limit = self.limits.max_path_bytes as u64 + 1;
                    let data = read_extension(&mut entry, declared, limit, "GNU long name")?;
                    let slot = if kind == b'L' { &mut pending.long_name } else { &mut pending.long_link };
                    if slot.replace(trim_nul(data)).is_some() {
                        return Err(ImageError::InvalidArchive("two GNU long-name headers for one entry".into()));
                    }
                    continue;
                }
                b'x' => {
                    let data = read_extension(&mut entry, declared, MAX_PAX_BYTES, "PAX header")?;
                    if pending.pax.replace(data).is_some() {
                        return Err(ImageError::InvalidArchive("two PAX headers for one entry".into()));
                    }
                    continue;
                }
                // Global PAX headers carry nothing we use; their data is skipped.
                b'g' => continue,
                _ => {}
            }
            let extensions = std::mem::take(&mut pending);
            let meta = entry_meta(&header, extensions, declared)?;
            // Pre-POSIX archives mark directories only by a trailing slash.
            let kind = if matches!(kind, b'0' | b'\0') && meta.path.ends_with(b"/") { b'5' } else { kind };
            self.handle(kind, &meta, &mut entry)?;
        }
        if !pending.is_empty() {
            return Err(ImageError::InvalidArchive("extension header without a following entry".into()));
        }
        Ok(())
    }

    fn handle(&mut self, kind: u8, meta: &EntryMeta, data: &mut impl Read) -> Result<(), ImageError> {
        let shown = || String::from_utf8_lossy(&meta.path).into_owned();
        let comps = self.normalize(&meta.path)?;
        let Some((name, parent_comps)) = comps.split_last() else {
            // The archive root ("./" or "/").
            if kind == b'5' {
                self.set_dir_metadata(self.root.as_fd(), meta, &shown())?;
                self.stats.directories += 1;
                return Ok(());
            }
            return Err(unsafe_entry(&shown(), "a non-directory entry names the root"));
        };
        if let Some(target) = name.strip_prefix(b".wh.") {
            return self.whiteout(parent_comps, target, &shown());
        }
        match kind {
            b'0' | b'\0' | b'7' | b'1' | b'2' | b'5' => {}
            b'3' | b'4' | b'6' => {
                self.stats.skipped_special += 1;
                return Ok(());
            }
            b'S' => {
                return Err(ImageError::InvalidArchive(format!("{}: GNU sparse files are not supported", shown())));
            }
            other => {
                return Err(ImageError::InvalidArchive(format!("{}: unsupported entry type {:?}", shown(), char::from(other))));
            }
        }
        let parent = self
            .open_parent(parent_comps, true, &shown())?
            .ok_or_else(|| unsafe_entry(&shown(), "parent directory could not be created"))?;
        let name = OsStr::from_bytes(name);
        match kind {
            b'5' => self.make_dir(parent.as_fd(), name, meta, &shown())?,
            b'2' => self.make_symlink(parent.as_fd(), name, meta, &shown())?,
            b'1' => self.make_hardlink(parent.as_fd(), name, &comps, meta, &shown())?,
            _ => self.make_file(parent.as_fd(), name, meta, data, &shown())?,
        }
        self.mark_touched(&comps);
        Ok(())
    }

    /// Splits an archive path into safe components.
    fn normalize(&self, raw: &[u8]) -> Result<Vec<Vec<u8>>, ImageError> {
        let shown = || String::from_utf8_lossy(raw).into_owned();
        if raw.len() > self.limits.max_path_bytes {
            return Err(ImageError::LimitExceeded(format!("entry path longer than {} bytes", self.limits.max_path_bytes)));
        }
        if raw.contains(&0) {
            return Err(unsafe_entry(&shown(), "path contains a NUL byte"));
        }
        let mut comps = Vec::new();
        for comp in raw.split(|b| *b == b'/') {
            match comp {
                b"" | b"." => continue,
                b".." => return Err(unsafe_entry(&shown(), "path contains a `..` component")),
                c if c.len() > 255 => {
                    return Err(ImageError::LimitExceeded(format!("path component longer than 255 bytes in {:?}", shown())));
                }
                c => comps.push(c.to_vec()),
            }
        }
        if comps.len() > self.limits.max_path_depth {
            return Err(ImageError::LimitExceeded(format!("path deeper than {} components", self.limits.max_path_depth)));
        }
        Ok(comps)
    }

    /// Opens the directory made of `comps` under the root, creating missing
    /// directories when `create`; never follows a symlink. `None` when a
    /// component is missing and `create` is false.
    fn open_parent(&self, comps: &[Vec<u8>], create: bool, shown: &str) -> Result<Option<OwnedFd>, ImageError> {
        let mut current = self.root.try_clone().map_err(|e| ImageError::io("duplicating directory fd", e))?;
        for (index, comp) in comps.iter().enumerate() {
            let name = OsStr::from_bytes(comp);
            let opened = match open_dir_at(current.as_fd(), name) {
                Err(Errno::ENOENT) if create => {
                    match mkdirat(current.as_fd(), name, Mode::from_bits_truncate(0o755)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => {
                            return Err(ImageError::io(format!("creating parent of {shown}"), e));
                        }
                    }
                    open_dir_at(current.as_fd(), name)
                }
                other => other,
            };
            current = match opened {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => return Ok(None),
                Err(Errno::ELOOP) | Err(Errno::ENOTDIR) => {
                    let prefix = comps[..=index].iter().map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join("/");
                    return Err(unsafe_entry(shown, &format!("parent {prefix:?} is a symlink or not a directory")));
                }
                Err(e) => return Err(ImageError::io(format!("opening parent of {shown}"), e)),
            };
        }
        Ok(Some(current))
    }

    fn mark_touched(&mut self, comps: &[Vec<u8>]) {
        for len in (1..=comps.len()).rev() {
            let key = comps[..len].join(&b'/');
            if !self.touched.insert(key) {
                break;
            }
        }
    }

    fn whiteout(&mut self, parent_comps: &[Vec<u8>], target: &[u8], shown: &str) -> Result<(), ImageError> {
        self.stats.whiteouts += 1;
        let parent_key = parent_comps.join(&b'/');
        if target == b".wh..opq" {
            // Opaque directory: hide every lower-layer child of the parent.
            let dir =
                self.open_parent(parent_comps, true, shown)?.ok_or_else(|| unsafe_entry(shown, "opaque directory could not be created"))?;
            self.clear_lower(dir.as_fd(), &parent_key).map_err(|e| ImageError::io(format!("applying opaque marker {shown}"), e))?;
            self.mark_touched(parent_comps);
            return Ok(());
        }
        if target.starts_with(b".wh.") {
            // Other AUFS metadata (e.g. `.wh..wh.plnk`): meaningless here.
            return Ok(());
        }
        if target.is_empty() || target == b"." || target == b".." {
            return Err(unsafe_entry(shown, "malformed whiteout name"));
        }
        let key = join_key(&parent_key, target);
        if self.touched.contains(&key) {
            // A whiteout hides lower layers only, never this layer's own entries.
            return Ok(());
        }
        if let Some(dir) = self.open_parent(parent_comps, false, shown)? {
            remove_tree_at(dir.as_fd(), OsStr::from_bytes(target)).map_err(|e| ImageError::io(format!("applying whiteout {shown}"), e))?;
        }
        Ok(())
    }

    /// Removes the children of `dir` (key `dir_key`) that this layer did not
    /// create, recursing into directories this layer touched.
    fn clear_lower(&self, dir: BorrowedFd<'_>, dir_key: &[u8]) -> io::Result<()> {
        for name in list_dir(dir)? {
            let key = join_key(dir_key, name.as_bytes());
            if !self.touched.contains(&key) {
                remove_tree_at(dir, &name)?;
                continue;
            }
            match open_dir_at(dir, &name) {
                Ok(child) => self.clear_lower(child.as_fd(), &key)?,
                Err(Errno::ENOTDIR) | Err(Errno::ELOOP) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn make_dir(&mut self, parent: BorrowedFd<'_>, name: &OsStr, meta: &EntryMeta, shown: &str) -> Result<(), ImageError> {
        let existing = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW);
        let is_dir = matches!(&existing, Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR);
        if !is_dir {
            if existing.is_ok() {
                remove_tree_at(parent, name).map_err(|e| ImageError::io(format!("replacing {shown}"), e))?;
            }
            mkdirat(parent, name, Mode::from_bits_truncate(0o700)).map_err(|e| ImageError::io(format!("creating directory {shown}"), e))?;
        }
        let dir = open_dir_at(parent, name).map_err(|e| ImageError::io(format!("opening directory {shown}"), e))?;
        self.set_dir_metadata(dir.as_fd(), meta, shown)?;
        self.stats.directories += 1;
        Ok(())
    }

    fn set_dir_metadata(&self, dir: BorrowedFd<'_>, meta: &EntryMeta, shown: &str) -> Result<(), ImageError> {
        if self.chown {
            fchown(dir, Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)))
                .map_err(|e| ImageError::io(format!("setting owner of {shown}"), e))?;
        }
        fchmod(dir, Mode::from_bits_truncate(meta.mode & 0o7777)).map_err(|e| ImageError::io(format!("setting mode of {shown}"), e))
    }

    fn make_file(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        meta: &EntryMeta,
        data: &mut impl Read,
        shown: &str,
    ) -> Result<(), ImageError> {
        let budget = self.limits.max_total_bytes.saturating_sub(self.stats.file_bytes);
        if meta.size > budget {
            return Err(ImageError::LimitExceeded(format!(
                "file {shown:?} declares {} bytes; total content limit is {} bytes",
                meta.size, self.limits.max_total_bytes
            )));
        }
        remove_tree_at(parent, name).map_err(|e| ImageError::io(format!("replacing {shown}"), e))?;
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(parent, name, flags, Mode::from_bits_truncate(0o600))
            .map_err(|e| ImageError::io(format!("creating file {shown}"), e))?;
        let mut file = File::from(fd);
        let written = io::copy(&mut data.take(meta.size), &mut file).map_err(|e| ImageError::io(format!("writing file {shown}"), e))?;
        if written != meta.size {
            return Err(ImageError::InvalidArchive(format!("{shown}: archive ends inside the file ({written} of {} bytes)", meta.size)));
        }
        self.stats.file_bytes += written;
        if self.chown {
            fchown(&file, Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)))
                .map_err(|e| ImageError::io(format!("setting owner of {shown}"), e))?;
        }
        // After chown, which clears setuid/setgid.
        fchmod(&file, Mode::from_bits_truncate(meta.mode & 0o7777)).map_err(|e| ImageError::io(format!("setting mode of {shown}"), e))?;
        let time = TimeSpec::new(meta.mtime, 0);
        futimens(&file, &time, &time).map_err(|e| ImageError::io(format!("setting mtime of {shown}"), e))?;
        self.stats.files += 1;
        Ok(())
    }

    fn make_symlink(&mut self, parent: BorrowedFd<'_>, name: &OsStr, meta: &EntryMeta, shown: &str) -> Result<(), ImageError> {
        let target = link_target(meta, shown, "symlink")?;
        if target.len() > self.limits.max_path_bytes || target.contains(&0) {
            return Err(unsafe_entry(shown, "symlink target too long or contains NUL"));
        }
        remove_tree_at(parent, name).map_err(|e| ImageError::io(format!("replacing {shown}"), e))?;
        symlinkat(OsStr::from_bytes(target), parent, name).map_err(|e| ImageError::io(format!("creating symlink {shown}"), e))?;
        if self.chown {
            fchownat(parent, name, Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| ImageError::io(format!("setting owner of {shown}"), e))?;
        }
        let time = TimeSpec::new(meta.mtime, 0);
        utimensat(parent, name, &time, &time, UtimensatFlags::NoFollowSymlink)
            .map_err(|e| ImageError::io(format!("setting mtime of {shown}"), e))?;
        self.stats.symlinks += 1;
        Ok(())
    }

    fn make_hardlink(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        comps: &[Vec<u8>],
        meta: &EntryMeta,
        shown: &str,
    ) -> Result<(), ImageError> {
        let target = link_target(meta, shown, "hard link")?;
        let target_comps = self.normalize(target)?;
        let Some((target_name, target_parent)) = target_comps.split_last() else {
            return Err(unsafe_entry(shown, "hard link to the root"));
        };
        if target_comps == comps {
            return Err(unsafe_entry(shown, "hard link to itself"));
        }
        let target_dir = self
            .open_parent(target_parent, false, shown)?
            .ok_or_else(|| unsafe_entry(shown, "hard link target does not exist inside the destination"))?;
        let target_name = OsStr::from_bytes(target_name);
        match fstatat(target_dir.as_fd(), target_name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR => {
                return Err(unsafe_entry(shown, "hard link to a directory"));
            }
            Ok(_) => {}
            Err(Errno::ENOENT) => {
                return Err(unsafe_entry(shown, "hard link target does not exist inside the destination"));
            }
            Err(e) => {
                return Err(ImageError::io(format!("inspecting hard link target of {shown}"), e));
            }
        }
        remove_tree_at(parent, name).map_err(|e| ImageError::io(format!("replacing {shown}"), e))?;
        // Flags empty: a symlink target is linked itself, never followed.
        linkat(target_dir.as_fd(), target_name, parent, name, AtFlags::empty())
            .map_err(|e| ImageError::io(format!("creating hard link {shown}"), e))?;
        self.stats.hardlinks += 1;
        Ok(())
    }
}

/// The target of a link entry (`kind`: "symlink" or "hard link"); an entry
/// without one is an invalid archive.
fn link_target<'m>(meta: &'m EntryMeta, shown: &str, kind: &str) -> Result<&'m [u8], ImageError> {
    meta.link.as_deref().filter(|t| !t.is_empty()).ok_or_else(|| ImageError::InvalidArchive(format!("{shown}: {kind} without a target")))
}

fn unsafe_entry(path: &str, reason: &str) -> ImageError {
    ImageError::UnsafeEntry { path: path.to_string(), reason: reason.to_string() }
}

fn join_key(parent: &[u8], name: &[u8]) -> Vec<u8> {
    if parent.is_empty() {
        return name.to_vec();
    }
    let mut key = Vec::with_capacity(parent.len() + 1 + name.len());
    key.extend_from_slice(parent);
    key.push(b'/');
    key.extend_from_slice(name);
    key
}

fn trim_nul(mut data: Vec<u8>) -> Vec<u8> {
    while data.last() == Some(&0) {
        data.pop();
    }
    data
}

fn read_extension(entry: &mut impl Read, declared: u64, limit: u64, what: &str) -> Result<Vec<u8>, ImageError> {
    if declared > limit {
        return Err(ImageError::LimitExceeded(format!("{what} of {declared} bytes (limit {limit})")));
    }
    let mut data = Vec::with_capacity(declared as usize);
    entry.take(declared).read_to_end(&mut data).map_err(|e| ImageError::io(format!("reading {what}"), e))?;
    if data.len() as u64 != declared {
        return Err(ImageError::InvalidArchive(format!("archive ends inside a {what}")));
    }
    Ok(data)
}

/// Combines a raw header with its extension headers.
fn entry_meta(header: &tar::Header, ext: PendingExtensions, declared: u64) -> Result<EntryMeta, ImageError> {
    let bad = |what: &str, e: io::Error| ImageError::InvalidArchive(format!("bad {what} in entry header: {e}"));
    let mut meta = EntryMeta {
        path: ext.long_name.unwrap_or_else(|| header.path_bytes().into_owned()),
        link: ext.long_link.or_else(|| header.link_name_bytes().map(|l| l.into_owned())),
        mode: header.mode().map_err(|e| bad("mode", e))?,
        uid: id_u32(header.uid().map_err(|e| bad("uid", e))?)?,
        gid: id_u32(header.gid().map_err(|e| bad("gid", e))?)?,
        mtime: i64::try_from(header.mtime().map_err(|e| bad("mtime", e))?).unwrap_or(0),
        size: declared,
    };
    if let Some(pax) = ext.pax {
        for record in tar::PaxExtensions::new(&pax) {
            let record = record.map_err(|e| ImageError::InvalidArchive(format!("bad PAX record: {e}")))?;
            let value = record.value_bytes();
            let number = || -> Result<u64, ImageError> {
                std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.split('.').next())
                    .and_then(|v| v.parse::<u64>().ok())
                    .ok_or_else(|| ImageError::InvalidArchive("bad numeric PAX record".into()))
            };
            match record.key_bytes() {
                b"path" => meta.path = value.to_vec(),
                b"linkpath" => meta.link = Some(value.to_vec()),
                b"uid" => meta.uid = id_u32(number()?)?,
                b"gid" => meta.gid = id_u32(number()?)?,
                b"mtime" => meta.mtime = i64::try_from(number()?).unwrap_or(0),
                // Raw parsing skips entries by the header size: a differing
                // PAX size would make two parsers disagree, so refuse it.
                b"size" if number()? != declared => {
                    return Err(ImageError::InvalidArchive("PAX size differs from the header size".into()));
                }
                _ => {}
            }
        }
    }
    Ok(meta)
}

fn id_u32(id: u64) -> Result<u32, ImageError> {
    u32::try_from(id).map_err(|_| ImageError::InvalidArchive(format!("uid/gid {id} out of range")))
}
