//! The quarantine: files the guard removed, kept under the Domain Root with
//! a JSON record each (`<dir>/<id>/record.json`; the content, if any, in
//! `<dir>/<id>/content`, mode 0600, owned by whoever owns the quarantine
//! directory, capabilities removed), never executable or privileged there.
//!
//! The quarantine is bounded ([`QuarantineLimits`]: at most 1,000 kept
//! copies and 256 MiB of disk by default): when a new entry takes it over
//! either bound, the oldest copies are dropped until it is within both
//! again (the newest too, if it alone is over). A dropped copy's record is
//! kept, marked with the time it was dropped ([`QuarantineRecord::dropped`]),
//! as one line of `<dir>/dropped.jsonl`, so `lazaret audit` still lists it;
//! only its content is gone and it cannot be restored.
//!
//! [`restore`] puts an entry back on the developer's explicit request and
//! remembers it (`<dir>/restored.jsonl`: root, path, inode and ctime), so
//! that a later [`super::sweep`] leaves the restored file alone as long as
//! it is unchanged.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode};

use super::{GuardConfig, GuardError, Owner};
use crate::error::MountError;
use crate::safe_path::{self, FileKind};

/// Largest content kept when a file must be copied (another filesystem);
/// beyond it only the record is kept (and says so).
const MAX_COPY: u64 = 64 << 20;

/// The name of the restore log in the quarantine directory.
const RESTORED_LOG: &str = "restored.jsonl";

/// The name of the log of dropped entries' records in the quarantine directory.
const DROPPED_LOG: &str = "dropped.jsonl";

/// How much the quarantine keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuarantineLimits {
    /// Most entries whose content is kept.
    pub max_entries: usize,
    /// Most disk space (allocated blocks) their contents may take, in bytes.
    pub max_bytes: u64,
}

impl QuarantineLimits {
    /// The default number of kept copies.
    pub const DEFAULT_ENTRIES: usize = 1_000;
    /// The default disk space of kept copies: 256 MiB.
    pub const DEFAULT_BYTES: u64 = 256 << 20;
}

impl Default for QuarantineLimits {
    fn default() -> Self {
        QuarantineLimits { max_entries: Self::DEFAULT_ENTRIES, max_bytes: Self::DEFAULT_BYTES }
    }
}

/// The JSON record of one quarantine entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuarantineRecord {
    /// The entry's id (also its directory name).
    pub id: String,
    /// The [`super::GuardRoot::label`] of the tree it came from.
    pub root: String,
    /// Its path relative to that root.
    pub path: PathBuf,
    /// Why it was removed.
    pub reason: String,
    /// When (seconds since the Unix epoch).
    pub time: u64,
    /// Its mode then (`st_mode & 0o7777`).
    pub mode: u32,
    /// Its owner then.
    pub owner: Owner,
    /// For a symlink: its target (then there is no content file).
    pub symlink_target: Option<PathBuf>,
    /// Size of the content in bytes.
    pub size: u64,
    /// Whether `content` holds the file (false for symlinks, special files
    /// and files larger than the copy limit on another filesystem).
    #[serde(default)]
    pub content_kept: bool,
    /// When the content was dropped to keep the quarantine within its
    /// [`QuarantineLimits`] (seconds since the Unix epoch); the record stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<u64>,
}

impl QuarantineRecord {
    /// The record of `rel` (in `root`, with stat `st`) taken now for
    /// `reason`: no content kept yet, its size the file's.
    fn of(id: &str, root: &str, rel: &Path, reason: &str, st: &FileStat) -> QuarantineRecord {
        QuarantineRecord {
            id: id.to_owned(),
            root: root.to_owned(),
            path: rel.to_owned(),
            reason: reason.to_owned(),
            time: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            mode: st.st_mode & 0o7777,
            owner: Owner { uid: st.st_uid, gid: st.st_gid },
            symlink_target: None,
            size: u64::try_from(st.st_size).unwrap_or(0),
            content_kept: false,
            dropped: None,
        }
    }
}

/// What [`restore`] put back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredFile {
    /// The root label.
    pub root: String,
    /// The path relative to that root.
    pub path: PathBuf,
}

/// One line of the restore log.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct RestoredMark {
    pub root: String,
    pub path: PathBuf,
    pub ino: u64,
    pub ctime: i64,
    pub ctime_nsec: i64,
}

impl RestoredMark {
    /// Whether `st` is the restored file, unchanged since.
    pub(crate) fn matches(&self, root: &str, path: &Path, st: &FileStat) -> bool {
        self.root == root && self.path == path && self.ino == st.st_ino && self.ctime == st.st_ctime && self.ctime_nsec == st.st_ctime_nsec
    }
}

/// The open quarantine directory.
pub(crate) struct Quarantine {
    dir: OwnedFd,
    path: PathBuf,
    limits: QuarantineLimits,
    kept: Mutex<Kept>,
}

/// The entries, oldest first, with the disk space of their content, as
/// this instance knows them. Other instances (a sweep's engine, a restore)
/// change the directory too: its mtime and link count (one link per entry
/// directory), noted after each change of ours, tell when to look again.
#[derive(Default)]
struct Kept {
    entries: VecDeque<(String, u64)>,
    bytes: u64,
    /// The directory's version when `entries` was last known to be complete.
    seen: Option<DirVersion>,
}

/// A directory's mtime and link count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DirVersion {
    mtime: (i64, i64),
    nlink: u64,
}

/// Source of unique ids within the process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

impl Quarantine {
    /// Opens (creating it, mode 0700) the quarantine directory `path` (a
    /// trusted path under the Domain Root).
    pub(crate) fn open(path: &Path, limits: QuarantineLimits) -> Result<Quarantine, GuardError> {
        match std::fs::create_dir(path) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).map_err(|e| MountError::io("chmod", path, e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(MountError::io("mkdir", path, e).into()),
        }
        let dir = nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| MountError::sys("open quarantine", path, e))?;
        Ok(Quarantine { dir, path: path.to_owned(), limits, kept: Mutex::new(Kept::default()) })
    }

    fn version(&self) -> Option<DirVersion> {
        nix::sys::stat::fstat(&self.dir).ok().map(|st| DirVersion { mtime: (st.st_mtime, st.st_mtime_nsec), nlink: st.st_nlink })
    }

    /// Re-reads the entries and how much disk their contents take.
    fn rescan(&self, kept: &mut Kept) {
        let version = self.version();
        let mut ids: Vec<String> =
            match nix::fcntl::openat(self.dir.as_fd(), ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()) {
                Ok(listing) => super::neutralise::list_names(listing)
                    .into_iter()
                    .filter_map(|n| n.into_string().ok())
                    .filter(|n| is_entry_name(n))
                    .collect(),
                Err(_) => return,
            };
        ids.sort();
        kept.entries.clear();
        kept.bytes = 0;
        for id in ids {
            let content = nix::sys::stat::fstatat(self.dir.as_fd(), Path::new(&id).join("content").as_path(), AtFlags::AT_SYMLINK_NOFOLLOW);
            let bytes = content.map(|st| allocated(&st)).unwrap_or(0);
            kept.bytes += bytes;
            kept.entries.push_back((id, bytes));
        }
        kept.seen = version;
    }

    /// Accounts for the new entry `id` (its content's stat, if any) and drops
    /// the oldest entries' copies while the quarantine is over a limit.
    /// `made` is the directory's version right after this instance made the
    /// entry's directory (see [`Quarantine::new_entry`]).
    fn admit(&self, id: &str, content: Option<&FileStat>, made: Option<DirVersion>) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if made.is_none() || kept.seen != made || kept.seen != self.version() {
            // Someone else changed the directory (or this is the first
            // entry): the new entry is seen by the scan itself.
            self.rescan(&mut kept);
        } else {
            let bytes = content.map(allocated).unwrap_or(0);
            kept.bytes += bytes;
            kept.entries.push_back((id.to_owned(), bytes));
        }
        while kept.entries.len() > self.limits.max_entries || kept.bytes > self.limits.max_bytes {
            let Some((oldest, bytes)) = kept.entries.pop_front() else { break };
            kept.bytes -= bytes;
            self.drop_copy(&oldest);
        }
        kept.seen = self.version();
    }

    /// After this instance made an entry directory: the directory's version
    /// then, if nothing else changed it since `before` (the version just
    /// before the mkdir, which must be the one last seen).
    fn made_entry(&self, before: Option<DirVersion>) -> Option<DirVersion> {
        let after = self.version()?;
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let only_ours = before.is_some_and(|b| kept.seen == Some(b) && after.nlink == b.nlink + 1);
        if only_ours {
            kept.seen = Some(after);
            Some(after)
        } else {
            None
        }
    }

    /// Drops entry `id`'s content, keeping its record (marked dropped) in
    /// the dropped log; the entry's directory goes.
    fn drop_copy(&self, id: &str) {
        let Ok(entry) = safe_path::open_dir_beneath(self.dir.as_fd(), Path::new(id)) else { return };
        let record = safe_path::read_beneath(entry.as_fd(), Path::new("record.json"), 1 << 20)
            .ok()
            .flatten()
            .and_then(|bytes| serde_json::from_slice::<QuarantineRecord>(&bytes).ok());
        if let Some(mut record) = record {
            record.dropped = Some(SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0));
            record.content_kept = false;
            // The record is logged first: a crash before the entry is gone
            // lists it twice at worst (the entry's own record wins).
            let mut line = serde_json::to_vec(&record).unwrap_or_default();
            line.push(b'\n');
            if append(self.dir.as_fd(), DROPPED_LOG, &line).is_err() {
                return;
            }
        }
        for file in ["content", "record.json"] {
            let _ = nix::unistd::unlinkat(&entry, file, nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
        let _ = nix::unistd::unlinkat(self.dir.as_fd(), id, nix::unistd::UnlinkatFlags::RemoveDir);
    }

    /// The restore log's entries (unreadable lines skipped).
    pub(crate) fn restored_marks(&self) -> Vec<RestoredMark> {
        let Ok(Some(text)) = safe_path::read_beneath(self.dir.as_fd(), Path::new(RESTORED_LOG), 16 << 20) else {
            return Vec::new();
        };
        text.split(|b| *b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect()
    }

    /// Moves the entry `name` of the (verified, in-root) directory `parent`
    /// into a new quarantine entry and returns its id. `st` is the entry's
    /// `lstat`. A directory is refused (git runs no directory).
    pub(crate) fn take(
        &self,
        root: &str,
        rel: &Path,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        st: &FileStat,
        reason: &str,
    ) -> Result<String, GuardError> {
        let kind = safe_path::kind_of(st);
        if kind == FileKind::Directory {
            return Err(MountError::refused(rel, "a directory is not quarantined").into());
        }
        let (id, entry, made) = self.new_entry()?;
        let mut record = QuarantineRecord::of(&id, root, rel, reason, st);
        if kind == FileKind::Symlink {
            record.symlink_target = nix::fcntl::readlinkat(parent, name).ok().map(PathBuf::from);
        }
        // Same filesystem: a rename moves the entry itself (never what a
        // symlink points to), atomically.
        match nix::fcntl::renameat(parent, name, entry.as_fd(), "content") {
            Ok(()) => {
                if kind == FileKind::Regular {
                    record.content_kept = true;
                    disarm(entry.as_fd(), Path::new("content"));
                } else if kind == FileKind::Symlink {
                    let _ = nix::unistd::unlinkat(entry.as_fd(), "content", nix::unistd::UnlinkatFlags::NoRemoveDir);
                }
            }
            Err(Errno::EXDEV) => {
                if kind == FileKind::Regular && record.size <= MAX_COPY {
                    record.content_kept =
                        copy_out(parent, name, entry.as_fd()).map_err(|e| MountError::io("copy into quarantine", rel, e))?;
                }
                match nix::unistd::unlinkat(parent, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {}
                    Err(errno) => return Err(MountError::sys("unlink", rel, errno).into()),
                }
            }
            Err(errno) => {
                let _ = nix::unistd::unlinkat(self.dir.as_fd(), id.as_str(), nix::unistd::UnlinkatFlags::RemoveDir);
                return Err(MountError::sys("rename into quarantine", rel, errno).into());
            }
        }
        write_new(entry.as_fd(), "record.json", &serde_json::to_vec_pretty(&record).unwrap_or_default())
            .map_err(|e| MountError::io("write quarantine record", &self.path, e))?;
        self.admit(&id, nix::sys::stat::fstatat(entry.as_fd(), "content", AtFlags::AT_SYMLINK_NOFOLLOW).ok().as_ref(), made);
        Ok(id)
    }

    /// Stores `contents` (a file the guard replaced) as a new entry.
    pub(crate) fn keep_copy(&self, root: &str, rel: &Path, st: &FileStat, contents: &[u8], reason: &str) -> Result<String, GuardError> {
        let (id, entry, made) = self.new_entry()?;
        write_new(entry.as_fd(), "content", contents).map_err(|e| MountError::io("write quarantine", rel, e))?;
        let record =
            QuarantineRecord { size: contents.len() as u64, content_kept: true, ..QuarantineRecord::of(&id, root, rel, reason, st) };
        write_new(entry.as_fd(), "record.json", &serde_json::to_vec_pretty(&record).unwrap_or_default())
            .map_err(|e| MountError::io("write quarantine record", &self.path, e))?;
        self.admit(&id, nix::sys::stat::fstatat(entry.as_fd(), "content", AtFlags::AT_SYMLINK_NOFOLLOW).ok().as_ref(), made);
        Ok(id)
    }

    /// Makes a new, empty entry directory and returns its id, its fd and
    /// the quarantine directory's version after (see [`Quarantine::admit`]).
    fn new_entry(&self) -> Result<(String, OwnedFd, Option<DirVersion>), GuardError> {
        for _ in 0..1000 {
            let id = new_id(SystemTime::now());
            let before = self.version();
            match nix::sys::stat::mkdirat(self.dir.as_fd(), id.as_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) => {
                    let made = self.made_entry(before);
                    let fd = nix::fcntl::openat(
                        self.dir.as_fd(),
                        id.as_str(),
                        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    )
                    .map_err(|e| MountError::sys("open quarantine entry", &self.path, e))?;
                    return Ok((id, fd, made));
                }
                Err(Errno::EEXIST) => continue,
                Err(errno) => return Err(MountError::sys("mkdir quarantine entry", &self.path, errno).into()),
            }
        }
        Err(MountError::refused(&self.path, "could not make a unique quarantine entry").into())
    }
}

/// Whether a name in the quarantine directory is an entry's (not a log).
fn is_entry_name(name: &str) -> bool {
    !name.starts_with('.') && name != RESTORED_LOG && name != DROPPED_LOG
}

/// Disk space a file takes (allocated blocks, so a sparse file counts for
/// what it really uses).
fn allocated(st: &FileStat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}

/// Appends `line` to `name` in `dir` (created mode 0600).
fn append(dir: BorrowedFd<'_>, name: &str, line: &[u8]) -> std::io::Result<()> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    std::fs::File::from(fd).write_all(line)
}

/// The records of dropped entries (unreadable lines skipped).
fn dropped_records(dir: BorrowedFd<'_>) -> Vec<QuarantineRecord> {
    let Ok(Some(text)) = safe_path::read_beneath(dir, Path::new(DROPPED_LOG), 64 << 20) else { return Vec::new() };
    text.split(|b| *b == b'\n').filter_map(|line| serde_json::from_slice(line).ok()).collect()
}

/// Removes every privilege and execute bit from a quarantined file.
fn disarm(entry: BorrowedFd<'_>, name: &Path) {
    if let Ok(fd) =
        nix::fcntl::openat(entry, name, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC, Mode::empty())
    {
        let _ = nix::unistd::fchown(&fd, Some(nix::unistd::Uid::effective()), Some(nix::unistd::Gid::effective()));
        let _ = nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o600));
        let _ = crate::sys::remove_xattr(fd.as_fd(), c"security.capability");
    }
}

/// Copies the regular file `name` of `parent` into `entry/content`.
/// Returns false if it was not a regular file by the time it was opened.
fn copy_out(parent: BorrowedFd<'_>, name: &OsStr, entry: BorrowedFd<'_>) -> std::io::Result<bool> {
    let source = match nix::fcntl::openat(
        parent,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ELOOP) | Err(Errno::ENOENT) => return Ok(false),
        Err(errno) => return Err(errno.into()),
    };
    let st = nix::sys::stat::fstat(&source)?;
    if safe_path::kind_of(&st) != FileKind::Regular {
        return Ok(false);
    }
    let mut contents = Vec::new();
    std::fs::File::from(source).take(MAX_COPY + 1).read_to_end(&mut contents)?;
    if contents.len() as u64 > MAX_COPY {
        return Ok(false);
    }
    write_new(entry, "content", &contents)?;
    Ok(true)
}

/// Creates `name` in `dir` (`O_EXCL`, mode 0600) with `contents`.
fn write_new(dir: BorrowedFd<'_>, name: &str, contents: &[u8]) -> std::io::Result<()> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )?;
    std::fs::File::from(fd).write_all(contents)
}

/// Every record in the quarantine directory `dir`, oldest first, the
/// dropped ones included ([`QuarantineRecord::dropped`] set). Entries whose
/// record cannot be read are skipped (a missing directory is empty).
pub fn list(dir: &Path) -> Result<Vec<QuarantineRecord>, GuardError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(MountError::io("read quarantine", dir, e).into()),
    };
    let root = safe_path::open_root_dir(dir)?;
    let mut records = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(is_entry_name) {
            continue;
        }
        let record_path = Path::new(&name).join("record.json");
        if let Ok(Some(bytes)) = safe_path::read_beneath(root.as_fd(), &record_path, 1 << 20) {
            if let Ok(record) = serde_json::from_slice::<QuarantineRecord>(&bytes) {
                records.push(record);
            }
        }
    }
    // A dropped entry whose directory is still there (a crash while it was
    // dropped) is listed once, as its directory says.
    let present: std::collections::HashSet<String> = records.iter().map(|r| r.id.clone()).collect();
    let mut dropped = dropped_records(root.as_fd());
    dropped.retain(|r| !present.contains(&r.id));
    dropped.sort_by(|a, b| a.id.cmp(&b.id));
    dropped.dedup_by(|a, b| a.id == b.id);
    records.extend(dropped);
    records.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(records)
}

/// Puts entry `id` back at its original path (owned by the developer,
/// permission bits without setuid/setgid), then removes the entry. Refuses
/// if the original path is occupied now, if a directory on the way is
/// missing or is a symlink, or if the root is not in `config`.
pub fn restore(config: &GuardConfig, id: &str) -> Result<RestoredFile, GuardError> {
    let refuse = |reason: &str| GuardError::Quarantine { id: id.to_owned(), reason: reason.to_owned() };
    if id.is_empty() || id.contains('/') || id.starts_with('.') {
        return Err(refuse("not a quarantine id"));
    }
    let quarantine = Quarantine::open(&config.quarantine_dir, config.quarantine_limits)?;
    let Ok(entry) = safe_path::open_dir_beneath(quarantine.dir.as_fd(), Path::new(id)) else {
        if dropped_records(quarantine.dir.as_fd()).iter().any(|r| r.id == id) {
            return Err(refuse("its content was dropped to keep the quarantine within its limits; only the record is left"));
        }
        return Err(refuse("no such entry"));
    };
    let bytes =
        safe_path::read_beneath(entry.as_fd(), Path::new("record.json"), 1 << 20)?.ok_or_else(|| refuse("the entry has no record"))?;
    let record: QuarantineRecord = serde_json::from_slice(&bytes).map_err(|e| refuse(&format!("unreadable record: {e}")))?;
    let root = config.roots.iter().find(|r| r.label == record.root).ok_or_else(|| refuse("its root is not part of this Domain"))?;
    let (Some(parent_rel), Some(name)) = (record.path.parent(), record.path.file_name()) else {
        return Err(refuse("the record has no file name"));
    };
    safe_path::check_relative(&record.path)?;
    let root_fd = safe_path::open_root_dir(&root.path)?;
    let parent = safe_path::open_beneath(root_fd.as_fd(), parent_rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY)
        .map_err(|e| refuse(&format!("cannot reach the original directory: {e}")))?;
    match nix::sys::stat::fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => {}
        Ok(_) => return Err(refuse("the original path is occupied; move that file away first")),
        Err(errno) => return Err(MountError::sys("stat", &record.path, errno).into()),
    }
    let developer = (Some(nix::unistd::Uid::from_raw(config.developer.uid)), Some(nix::unistd::Gid::from_raw(config.developer.gid)));
    if let Some(target) = &record.symlink_target {
        nix::unistd::symlinkat(target.as_path(), &parent, name).map_err(|e| MountError::sys("symlink", &record.path, e))?;
        let _ = nix::unistd::fchownat(&parent, name, developer.0, developer.1, AtFlags::AT_SYMLINK_NOFOLLOW);
    } else if record.content_kept {
        let contents =
            safe_path::read_beneath(entry.as_fd(), Path::new("content"), MAX_COPY)?.ok_or_else(|| refuse("the content is missing"))?;
        let fd = nix::fcntl::openat(
            &parent,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(record.mode & 0o777),
        )
        .map_err(|e| MountError::sys("create", &record.path, e))?;
        nix::unistd::fchown(&fd, developer.0, developer.1).map_err(|e| MountError::sys("chown", &record.path, e))?;
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(record.mode & 0o777))
            .map_err(|e| MountError::sys("chmod", &record.path, e))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(&contents).map_err(|e| MountError::io("write", &record.path, e))?;
    } else {
        return Err(refuse("nothing was kept of this file (special file, or too large to copy)"));
    }
    if let Ok(st) = nix::sys::stat::fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        let mark = RestoredMark {
            root: record.root.clone(),
            path: record.path.clone(),
            ino: st.st_ino,
            ctime: st.st_ctime,
            ctime_nsec: st.st_ctime_nsec,
        };
        let mut line = serde_json::to_vec(&mark).unwrap_or_default();
        line.push(b'\n');
        let log = nix::fcntl::openat(
            quarantine.dir.as_fd(),
            RESTORED_LOG,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| MountError::sys("open restore log", &config.quarantine_dir, e))?;
        std::fs::File::from(log).write_all(&line).map_err(|e| MountError::io("write restore log", &config.quarantine_dir, e))?;
    }
    for file in ["content", "record.json"] {
        let _ = nix::unistd::unlinkat(&entry, file, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
    let _ = nix::unistd::unlinkat(quarantine.dir.as_fd(), id, nix::unistd::UnlinkatFlags::RemoveDir);
    Ok(RestoredFile { root: record.root, path: record.path })
}

/// A new unique entry id: UTC time, nanoseconds and a counter
/// (`20261201T224400Z-123456789-1`; sorts by time).
pub fn new_id(now: SystemTime) -> String {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let t = lazaret_protocol::utc::Utc::from_unix(secs);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{:04}{:02}{:02}T{:02}{:02}{:02}Z-{:09}-{count}", t.year, t.month, t.day, t.hour, t.minute, t.second, since.subsec_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_of(dir: &Path) -> FileStat {
        let file = dir.join("source");
        std::fs::write(&file, b"x").expect("write");
        nix::sys::stat::lstat(&file).expect("stat")
    }

    fn entry_dirs(dir: &Path) -> usize {
        std::fs::read_dir(dir).expect("list").flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).count()
    }

    #[test]
    fn past_its_count_the_oldest_copies_are_dropped_and_their_records_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("quarantine");
        let st = stat_of(tmp.path());
        let q = Quarantine::open(&dir, QuarantineLimits { max_entries: 3, max_bytes: u64::MAX }).expect("open");
        let ids: Vec<String> = (0..5)
            .map(|i| q.keep_copy("workspace", Path::new(&format!("r{i}/.git/config")), &st, b"[core]\n", "test").expect("keep"))
            .collect();
        assert_eq!(entry_dirs(&dir), 3, "three copies kept");
        let records = list(&dir).expect("list");
        assert_eq!(records.iter().map(|r| r.id.clone()).collect::<Vec<_>>(), ids, "every record listed, oldest first");
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.dropped.is_some(), i < 2, "{r:?}");
            assert_eq!(r.content_kept, i >= 2, "{r:?}");
            assert_eq!(r.path, PathBuf::from(format!("r{i}/.git/config")));
        }
        let config = GuardConfig { quarantine_dir: dir.clone(), ..Default::default() };
        let refused = restore(&config, &ids[0]).expect_err("a dropped copy cannot be restored");
        assert!(refused.to_string().contains("dropped"), "{refused}");
        // A symlink's entry (no content) counts as an entry too.
        let link_dir = tmp.path().join("links");
        std::fs::create_dir(&link_dir).expect("mkdir");
        std::os::unix::fs::symlink("/etc/passwd", link_dir.join("hook")).expect("symlink");
        let parent = nix::fcntl::open(&link_dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).expect("open");
        let link_st = nix::sys::stat::lstat(&link_dir.join("hook")).expect("lstat");
        q.take("workspace", Path::new("x/.git/hooks/pre-commit"), parent.as_fd(), OsStr::new("hook"), &link_st, "hook").expect("take");
        assert_eq!(entry_dirs(&dir), 3);
        assert_eq!(list(&dir).expect("list").iter().filter(|r| r.dropped.is_some()).count(), 3);
    }

    #[test]
    fn past_its_bytes_the_oldest_copies_are_dropped_even_the_newest_alone_over() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("quarantine");
        let st = stat_of(tmp.path());
        let chunk = vec![b'x'; 64 << 10];
        // What one copy takes on this filesystem.
        let probe = Quarantine::open(&tmp.path().join("probe"), QuarantineLimits::default()).expect("open");
        let id = probe.keep_copy("workspace", Path::new("p"), &st, &chunk, "probe").expect("keep");
        let one = allocated(&nix::sys::stat::lstat(&tmp.path().join("probe").join(&id).join("content")).expect("stat"));
        assert!(one >= chunk.len() as u64);
        let q = Quarantine::open(&dir, QuarantineLimits { max_entries: 100, max_bytes: 2 * one + one / 2 }).expect("open");
        for i in 0..4 {
            q.keep_copy("workspace", Path::new(&format!("f{i}")), &st, &chunk, "test").expect("keep");
        }
        let records = list(&dir).expect("list");
        assert_eq!(records.iter().map(|r| r.dropped.is_some()).collect::<Vec<_>>(), [true, true, false, false]);
        // One copy bigger than the whole bound: nothing of it stays but its record.
        let big = vec![b'y'; (3 * one) as usize];
        let id = q.keep_copy("workspace", Path::new("big"), &st, &big, "test").expect("keep");
        let records = list(&dir).expect("list");
        assert!(records.iter().all(|r| r.dropped.is_some()), "{records:?}");
        assert!(records.iter().any(|r| r.id == id));
        assert_eq!(entry_dirs(&dir), 0);
    }

    #[test]
    fn two_instances_on_one_directory_keep_the_bound() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("quarantine");
        let st = stat_of(tmp.path());
        let limits = QuarantineLimits { max_entries: 4, max_bytes: u64::MAX };
        let a = Quarantine::open(&dir, limits).expect("open");
        let b = Quarantine::open(&dir, limits).expect("open");
        for i in 0..12 {
            let q = if i % 3 == 0 { &b } else { &a };
            q.keep_copy("workspace", Path::new(&format!("f{i}")), &st, b"x", "test").expect("keep");
            assert!(entry_dirs(&dir) <= 4, "after {i}: {} entries", entry_dirs(&dir));
        }
        let records = list(&dir).expect("list");
        assert_eq!(records.len(), 12, "no record lost");
        assert_eq!(records.iter().filter(|r| r.dropped.is_none()).count(), 4);
        assert!(records[8..].iter().all(|r| r.dropped.is_none()), "the newest are kept");
    }

    #[test]
    fn ids_are_dated_and_unique() {
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_796_165_040);
        let a = new_id(t);
        let b = new_id(t);
        assert!(a.starts_with("20261201T"), "{a}");
        assert_ne!(a, b);
    }
}
