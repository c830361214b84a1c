//! The quarantine: files the guard removed, kept under the Domain Root with
//! a JSON record each (`<dir>/<id>/record.json`; the content, if any, in
//! `<dir>/<id>/content`, mode 0600, owned by whoever owns the quarantine
//! directory, capabilities removed), never executable or privileged there.
//!
//! [`restore`] puts an entry back on the developer's explicit request and
//! remembers it (`<dir>/restored.jsonl`: root, path, inode and ctime), so
//! that a later [`super::sweep`] leaves the restored file alone as long as
//! it is unchanged.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
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
}

/// Source of unique ids within the process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

impl Quarantine {
    /// Opens (creating it, mode 0700) the quarantine directory `path` (a
    /// trusted path under the Domain Root).
    pub(crate) fn open(path: &Path) -> Result<Quarantine, GuardError> {
        match std::fs::create_dir(path) {
            Ok(()) => {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| MountError::io("chmod", path, e))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(MountError::io("mkdir", path, e).into()),
        }
        let dir = nix::fcntl::open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| MountError::sys("open quarantine", path, e))?;
        Ok(Quarantine { dir, path: path.to_owned() })
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
        let (id, entry) = self.new_entry()?;
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
                    record.content_kept = copy_out(parent, name, entry.as_fd()).map_err(|e| MountError::io("copy into quarantine", rel, e))?;
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
        Ok(id)
    }

    /// Stores `contents` (a file the guard replaced) as a new entry.
    pub(crate) fn keep_copy(&self, root: &str, rel: &Path, st: &FileStat, contents: &[u8], reason: &str) -> Result<String, GuardError> {
        let (id, entry) = self.new_entry()?;
        write_new(entry.as_fd(), "content", contents).map_err(|e| MountError::io("write quarantine", rel, e))?;
        let record = QuarantineRecord { size: contents.len() as u64, content_kept: true, ..QuarantineRecord::of(&id, root, rel, reason, st) };
        write_new(entry.as_fd(), "record.json", &serde_json::to_vec_pretty(&record).unwrap_or_default())
            .map_err(|e| MountError::io("write quarantine record", &self.path, e))?;
        Ok(id)
    }

    /// Makes a new, empty entry directory and returns its id and fd.
    fn new_entry(&self) -> Result<(String, OwnedFd), GuardError> {
        for _ in 0..1000 {
            let id = new_id(SystemTime::now());
            match nix::sys::stat::mkdirat(self.dir.as_fd(), id.as_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) => {
                    let fd = nix::fcntl::openat(self.dir.as_fd(), id.as_str(), OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
                        .map_err(|e| MountError::sys("open quarantine entry", &self.path, e))?;
                    return Ok((id, fd));
                }
                Err(Errno::EEXIST) => continue,
                Err(errno) => return Err(MountError::sys("mkdir quarantine entry", &self.path, errno).into()),
            }
        }
        Err(MountError::refused(&self.path, "could not make a unique quarantine entry").into())
    }
}

/// Removes every privilege and execute bit from a quarantined file.
fn disarm(entry: BorrowedFd<'_>, name: &Path) {
    if let Ok(fd) = nix::fcntl::openat(entry, name, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC, Mode::empty()) {
        let _ = nix::unistd::fchown(&fd, Some(nix::unistd::Uid::effective()), Some(nix::unistd::Gid::effective()));
        let _ = nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o600));
        let _ = crate::sys::remove_xattr(fd.as_fd(), c"security.capability");
    }
}

/// Copies the regular file `name` of `parent` into `entry/content`.
/// Returns false if it was not a regular file by the time it was opened.
fn copy_out(parent: BorrowedFd<'_>, name: &OsStr, entry: BorrowedFd<'_>) -> std::io::Result<bool> {
    let source = match nix::fcntl::openat(parent, name, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC, Mode::empty()) {
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
    let fd = nix::fcntl::openat(dir, name, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::from_bits_truncate(0o600))?;
    std::fs::File::from(fd).write_all(contents)
}

/// Every record in the quarantine directory `dir`, oldest first. Entries
/// whose record cannot be read are skipped (a missing directory is empty).
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
        if name.as_bytes() == RESTORED_LOG.as_bytes() {
            continue;
        }
        let record_path = Path::new(&name).join("record.json");
        if let Ok(Some(bytes)) = safe_path::read_beneath(root.as_fd(), &record_path, 1 << 20) {
            if let Ok(record) = serde_json::from_slice::<QuarantineRecord>(&bytes) {
                records.push(record);
            }
        }
    }
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
    let quarantine = Quarantine::open(&config.quarantine_dir)?;
    let entry = safe_path::open_dir_beneath(quarantine.dir.as_fd(), Path::new(id)).map_err(|_| refuse("no such entry"))?;
    let bytes = safe_path::read_beneath(entry.as_fd(), Path::new("record.json"), 1 << 20)?.ok_or_else(|| refuse("the entry has no record"))?;
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
        let contents = safe_path::read_beneath(entry.as_fd(), Path::new("content"), MAX_COPY)?.ok_or_else(|| refuse("the content is missing"))?;
        let fd = nix::fcntl::openat(
            &parent,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(record.mode & 0o777),
        )
        .map_err(|e| MountError::sys("create", &record.path, e))?;
        nix::unistd::fchown(&fd, developer.0, developer.1).map_err(|e| MountError::sys("chown", &record.path, e))?;
        nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(record.mode & 0o777)).map_err(|e| MountError::sys("chmod", &record.path, e))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(&contents).map_err(|e| MountError::io("write", &record.path, e))?;
    } else {
        return Err(refuse("nothing was kept of this file (special file, or too large to copy)"));
    }
    if let Ok(st) = nix::sys::stat::fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        let mark = RestoredMark { root: record.root.clone(), path: record.path.clone(), ino: st.st_ino, ctime: st.st_ctime, ctime_nsec: st.st_ctime_nsec };
        let mut line = serde_json::to_vec(&mark).unwrap_or_default();
        line.push(b'\n');
        let log = nix::fcntl::openat(quarantine.dir.as_fd(), RESTORED_LOG, OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::from_bits_truncate(0o600))
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
    format!(
        "{:04}{:02}{:02}T{:02}{:02}{:02}Z-{:09}-{count}",
        t.year,
        t.month,
        t.day,
        t.hour,
        t.minute,
        t.second,
        since.subsec_nanos()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dated_and_unique() {
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_796_165_040);
        let a = new_id(t);
        let b = new_id(t);
        assert!(a.starts_with("20261201T"), "{a}");
        assert_ne!(a, b);
    }
}
