//! Ignored Workspace State: Domain-scoped storage presented at the
//! workspace's top-most git-ignored paths instead of the host's content.
//!
//! Storage lives in `DOMAIN_ROOT/ignored/<escaped relative path>` (a
//! directory for a directory, a file for a file), created on first use with
//! the owner and mode of the host mount point so that a non-root sandbox
//! user can write there. It starts empty: the host's content is never copied
//! in or shown. A symlink or special file at an ignored path cannot be
//! covered by a bind and is reported (not mounted) instead.
//!
//! Isolation is sticky ([`IsolationRecord`]): every path isolated once is
//! recorded in `DOMAIN_ROOT/isolated-paths.json` (root-only, never in the
//! workspace) and stays isolated at every later start of the Domain
//! ([`merge_recorded`]), whatever the agent did meanwhile to `.gitignore`,
//! `info/exclude`, `core.excludesFile` or nested repositories, until the
//! developer runs `lazaret reset-isolation PROFILE` ([`reset_isolation`]).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;

use crate::anchor::escape_path;
use crate::error::MountError;
use crate::ignore_eval::IgnoreScan;
use crate::safe_path::{self, FileKind};

/// One ignored path to cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredMount {
    /// Path relative to the workspace root.
    pub workspace_rel: PathBuf,
    /// Storage in the Domain Root (trusted host path).
    pub storage: PathBuf,
    /// [`FileKind::Directory`] or [`FileKind::Regular`].
    pub kind: FileKind,
    /// True if the path did not exist and its mount point must be created.
    pub anticipated: bool,
}

/// Turns a scan into mounts; returns them and warnings for ignored paths
/// that cannot be covered (symlinks, special files).
pub fn plan_ignored(scan: &IgnoreScan, domain_root: &Path) -> (Vec<IgnoredMount>, Vec<String>) {
    let storage_root = domain_root.join("ignored");
    let mut mounts = Vec::new();
    let mut warnings = Vec::new();
    for entry in &scan.present {
        match entry.kind {
            FileKind::Directory | FileKind::Regular => mounts.push(IgnoredMount {
                workspace_rel: entry.path.clone(),
                storage: storage_root.join(escape_path(&entry.path)),
                kind: entry.kind,
                anticipated: false,
            }),
            FileKind::Symlink | FileKind::Other => warnings.push(format!(
                "{}: ignored but a {}; it is not isolated (the sandbox sees the link itself and can replace it)",
                lazaret_protocol::display::escaped(&entry.path),
                if entry.kind == FileKind::Symlink { "symlink" } else { "special file" }
            )),
        }
    }
    for dir in &scan.anticipated_dirs {
        mounts.push(IgnoredMount {
            workspace_rel: dir.clone(),
            storage: storage_root.join(escape_path(dir)),
            kind: FileKind::Directory,
            anticipated: true,
        });
    }
    mounts.sort_by(|a, b| a.workspace_rel.cmp(&b.workspace_rel));
    (mounts, warnings)
}

/// Makes sure the host mount point (in the workspace, fd-relative, no
/// symlinks) and the storage exist with matching kinds. Storage of the
/// other kind (the path changed from file to directory) is moved aside to
/// `<storage>.stale` rather than deleted.
pub fn prepare(mount: &IgnoredMount, workspace: BorrowedFd<'_>) -> Result<(), MountError> {
    let point = if mount.anticipated && mount.kind == FileKind::Directory {
        safe_path::ensure_dir_beneath(workspace, &mount.workspace_rel)?
    } else {
        safe_path::open_path_beneath(workspace, &mount.workspace_rel)?
            .ok_or_else(|| MountError::refused(&mount.workspace_rel, "ignored path disappeared while preparing mounts"))?
    };
    let st = safe_path::stat(point.as_fd())?;
    let found = safe_path::kind_of(&st);
    if found != mount.kind {
        return Err(MountError::refused(
            &mount.workspace_rel,
            format!("changed from {:?} to {found:?} while preparing mounts; start again", mount.kind),
        ));
    }
    let parent = mount.storage.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(parent).map_err(|e| MountError::io("create", parent, e))?;
    let existing = std::fs::symlink_metadata(&mount.storage);
    let matches = match &existing {
        Ok(meta) => match mount.kind {
            FileKind::Directory => meta.file_type().is_dir(),
            _ => meta.file_type().is_file(),
        },
        Err(_) => false,
    };
    if existing.is_ok() && !matches {
        let stale = PathBuf::from(format!("{}.stale", mount.storage.display()));
        let _ = std::fs::remove_dir_all(&stale);
        let _ = std::fs::remove_file(&stale);
        std::fs::rename(&mount.storage, &stale).map_err(|e| MountError::io("move aside", &mount.storage, e))?;
    }
    if !matches {
        match mount.kind {
            FileKind::Directory => std::fs::create_dir(&mount.storage),
            _ => std::fs::File::create_new(&mount.storage).map(drop),
        }
        .map_err(|e| MountError::io("create", &mount.storage, e))?;
        std::os::unix::fs::chown(&mount.storage, Some(st.st_uid), Some(st.st_gid))
            .map_err(|e| MountError::io("chown", &mount.storage, e))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&mount.storage, std::fs::Permissions::from_mode(st.st_mode & 0o7777))
            .map_err(|e| MountError::io("chmod", &mount.storage, e))?;
    }
    Ok(())
}

/// Name of the record of isolated paths in the Domain Root.
pub const RECORD_FILE: &str = "isolated-paths.json";

/// Format version written in [`RECORD_FILE`]; another version is refused.
pub const RECORD_VERSION: u32 = 1;

/// Most paths a record may hold (each one is a bind mount at every start,
/// so a real workspace stays far below).
pub const MAX_RECORDED_PATHS: usize = 65_536;

/// Largest record file that is read.
pub const MAX_RECORD_BYTES: u64 = 16 * 1024 * 1024;

/// Longest recorded path, in bytes (Linux's `PATH_MAX`).
const MAX_PATH_BYTES: usize = 4096;

/// What a recorded path was when it was last isolated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RecordedKind {
    /// A directory (recreated empty as a mount point when missing).
    Directory,
    /// A regular file (not recreated when missing).
    File,
}

impl RecordedKind {
    fn of(kind: FileKind) -> RecordedKind {
        if kind == FileKind::Directory { RecordedKind::Directory } else { RecordedKind::File }
    }
}

/// The file's layout: `{"version": 1, "paths": [{"path": ..., "kind": ...}]}`.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordFile {
    version: u32,
    paths: Vec<RecordEntry>,
}

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordEntry {
    path: String,
    kind: RecordedKind,
}

/// The workspace paths a Domain has isolated so far (sticky isolation).
///
/// Stored as [`RECORD_FILE`] in the Domain Root: JSON, paths relative to the
/// workspace root with `%`, control characters and bytes that are not
/// UTF-8 written as `%XX`. Written atomically (temporary file, fsync,
/// rename, fsync of the directory); an unreadable record is an error, never
/// treated as empty, because forgetting it would expose what it lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IsolationRecord {
    /// Sorted component-wise: a parent comes before its children.
    paths: BTreeMap<PathBuf, RecordedKind>,
}

impl IsolationRecord {
    /// The record's file in `domain_root`.
    pub fn file(domain_root: &Path) -> PathBuf {
        domain_root.join(RECORD_FILE)
    }

    /// Reads the record of `domain_root`; a missing file is an empty record.
    pub fn load(domain_root: &Path) -> Result<IsolationRecord, MountError> {
        let file = Self::file(domain_root);
        let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC).open(&file);
        let handle = match opened {
            Ok(handle) => handle,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(IsolationRecord::default()),
            Err(e) => return Err(corrupt(&file, format!("cannot be opened ({e})"))),
        };
        let meta = handle.metadata().map_err(|e| MountError::io("stat", &file, e))?;
        if !meta.file_type().is_file() {
            return Err(corrupt(&file, "is not a regular file".into()));
        }
        let mut bytes = Vec::new();
        handle.take(MAX_RECORD_BYTES + 1).read_to_end(&mut bytes).map_err(|e| MountError::io("read", &file, e))?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(corrupt(&file, format!("is larger than {MAX_RECORD_BYTES} bytes")));
        }
        Self::parse(&bytes, &file)
    }

    /// Parses a record's content (`file` names it in errors).
    pub fn parse(bytes: &[u8], file: &Path) -> Result<IsolationRecord, MountError> {
        let parsed: RecordFile = serde_json::from_slice(bytes).map_err(|e| corrupt(file, format!("is not valid ({e})")))?;
        if parsed.version != RECORD_VERSION {
            return Err(corrupt(file, format!("has format version {}, this Lazaret reads version {RECORD_VERSION}", parsed.version)));
        }
        if parsed.paths.len() > MAX_RECORDED_PATHS {
            return Err(corrupt(file, format!("lists more than {MAX_RECORDED_PATHS} paths")));
        }
        let mut record = IsolationRecord::default();
        for entry in parsed.paths {
            let path = decode_path(&entry.path)
                .filter(|p| valid_recorded_path(p))
                .ok_or_else(|| corrupt(file, format!("lists an invalid path {:?}", entry.path)))?;
            record.paths.insert(path, entry.kind);
        }
        Ok(record)
    }

    /// The record as written to its file (one path per line, sorted).
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = format!("{{\"version\": {RECORD_VERSION}, \"paths\": [");
        for (index, (path, kind)) in self.paths.iter().enumerate() {
            let entry = RecordEntry { path: encode_path(path), kind: *kind };
            // Serialising a struct of a string and an enum cannot fail.
            let line = serde_json::to_string(&entry).unwrap_or_default();
            out.push_str(if index == 0 { "\n  " } else { ",\n  " });
            out.push_str(&line);
        }
        out.push_str("\n]}\n");
        out.into_bytes()
    }

    /// Writes the record into `domain_root` atomically and durably.
    pub fn save(&self, domain_root: &Path) -> Result<(), MountError> {
        let file = Self::file(domain_root);
        if self.paths.len() > MAX_RECORDED_PATHS {
            return Err(MountError::refused(
                &file,
                format!(
                    "more than {MAX_RECORDED_PATHS} workspace paths would be isolated; ignore whole directories rather than many single files, then run `lazaret reset-isolation PROFILE`"
                ),
            ));
        }
        let temporary = domain_root.join(format!("{RECORD_FILE}.tmp"));
        let _ = std::fs::remove_file(&temporary);
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&temporary)
            .map_err(|e| MountError::io("create", &temporary, e))?;
        out.write_all(&self.to_json()).map_err(|e| MountError::io("write", &temporary, e))?;
        out.sync_all().map_err(|e| MountError::io("fsync", &temporary, e))?;
        drop(out);
        std::fs::rename(&temporary, &file).map_err(|e| MountError::io("rename", &file, e))?;
        std::fs::File::open(domain_root).and_then(|dir| dir.sync_all()).map_err(|e| MountError::io("fsync", domain_root, e))
    }

    /// How many paths are recorded.
    pub fn len(&self) -> usize {
        self.paths.len()
    }

    /// True if nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.paths.is_empty()
    }

    /// The recorded paths, parents before children.
    pub fn paths(&self) -> impl Iterator<Item = (&Path, RecordedKind)> {
        self.paths.iter().map(|(p, k)| (p.as_path(), *k))
    }

    /// Records `path` (replacing the kind recorded for it). Paths that could
    /// never be isolated (empty, absolute, `..`, `.git`) are not recorded.
    pub fn insert(&mut self, path: &Path, kind: RecordedKind) {
        if valid_recorded_path(path) {
            self.paths.insert(path.to_path_buf(), kind);
        }
    }
}

fn corrupt(file: &Path, problem: String) -> MountError {
    MountError::refused(
        file,
        format!(
            "this record of the workspace paths the Domain isolates {problem}; the Domain does not start without it, since the paths it lists would be exposed. \
             Restore it if you know its content, or run `lazaret reset-isolation PROFILE` to delete it (only the current ignore rules then decide what is isolated)"
        ),
    )
}

/// A workspace-relative path that Ignored Workspace State could have covered.
fn valid_recorded_path(path: &Path) -> bool {
    let bytes = path.as_os_str().as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_PATH_BYTES
        && !bytes.contains(&0)
        && bytes.split(|&c| c == b'/').all(|c| !c.is_empty() && c != b"." && c != b".." && c != b".git")
}

fn encode_path(path: &Path) -> String {
    let mut out = String::new();
    for chunk in path.as_os_str().as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '%' || c.is_control() {
                for b in c.encode_utf8(&mut [0; 4]).bytes() {
                    let _ = write!(out, "%{b:02X}");
                }
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn decode_path(text: &str) -> Option<PathBuf> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(OsString::from_vec(out)))
}

/// What the host workspace has at a recorded path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    /// Something of this kind is there.
    Present(FileKind),
    /// Nothing is there; its parent is a real directory.
    Missing,
    /// Nothing is there, nor at its parent.
    ParentMissing,
    /// A parent is a symlink or not a directory (the reason says which): the
    /// path cannot be reached without following it, so it is left alone.
    Unreachable(String),
}

/// Looks `rel` up beneath the workspace fd with the symlink-refusing
/// resolution of [`safe_path`] (never following anything).
pub fn look_up(workspace: BorrowedFd<'_>, rel: &Path) -> HostEntry {
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return HostEntry::Unreachable("not a workspace path".into());
    };
    let dir = match safe_path::open_dir_beneath(workspace, parent) {
        Ok(dir) => dir,
        Err(MountError::Syscall { errno: Errno::ENOENT, .. }) => return HostEntry::ParentMissing,
        Err(e) => return HostEntry::Unreachable(e.to_string()),
    };
    match safe_path::open_path_beneath(dir.as_fd(), Path::new(name)) {
        Ok(None) => HostEntry::Missing,
        Ok(Some(fd)) => match safe_path::file_kind(fd.as_fd()) {
            Ok(kind) => HostEntry::Present(kind),
            Err(e) => HostEntry::Unreachable(e.to_string()),
        },
        Err(e) => HostEntry::Unreachable(e.to_string()),
    }
}

/// What sticky isolation changed at this start, for the coordinator's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StickyReport {
    /// The record's file.
    pub record_file: PathBuf,
    /// Paths isolated only because they are recorded (the current ignore
    /// rules no longer isolate them).
    pub isolated: Vec<PathBuf>,
    /// Recorded paths with nothing to cover on the host now (kept recorded).
    pub absent: Vec<PathBuf>,
    /// How many paths were added to the record at this start.
    pub newly_recorded: usize,
}

/// Result of [`merge_recorded`].
#[derive(Debug, Clone, Default)]
pub struct StickyMerge {
    /// The mounts to make: the current ones and the recorded ones, top-most
    /// only, sorted.
    pub mounts: Vec<IgnoredMount>,
    /// The record to save: the old one plus every path isolated now.
    pub record: IsolationRecord,
    /// What changed, for the log.
    pub report: StickyReport,
    /// Recorded paths that cannot be covered (symlink, special file,
    /// unreachable parent), for the launch log.
    pub warnings: Vec<String>,
}

/// Sticky isolation: the union of `current` (from [`plan_ignored`]) and
/// the recorded paths of `record`, looked up on the host with `look_up`
/// (see [`look_up`]).
///
/// A recorded path already covered by a current mount (itself or an
/// ancestor) needs nothing; one that covers current mounts replaces them
/// (top-most wins, as in the scan). A recorded directory that is missing is
/// recreated as an empty mount point when its parent exists, as an
/// anticipated directory is; a missing file is not. A recorded path now a
/// symlink or special file, or behind a symlinked or non-directory parent,
/// is not mounted (a warning says why) and stays recorded.
pub fn merge_recorded(
    current: Vec<IgnoredMount>,
    record: &IsolationRecord,
    domain_root: &Path,
    mut look_up: impl FnMut(&Path) -> HostEntry,
) -> StickyMerge {
    let storage_root = domain_root.join("ignored");
    let covered = |mounts: &[IgnoredMount], path: &Path| mounts.iter().any(|m| path.starts_with(&m.workspace_rel));
    let mount = |path: &Path, kind: FileKind, anticipated: bool| IgnoredMount {
        workspace_rel: path.to_path_buf(),
        storage: storage_root.join(escape_path(path)),
        kind,
        anticipated,
    };
    let mut added: Vec<IgnoredMount> = Vec::new();
    let mut report = StickyReport { record_file: IsolationRecord::file(domain_root), ..StickyReport::default() };
    let mut warnings = Vec::new();
    let shown = |p: &Path| lazaret_protocol::display::escaped(p).to_string();
    for (path, kind) in record.paths() {
        if covered(&current, path) || covered(&added, path) {
            continue;
        }
        match look_up(path) {
            HostEntry::Present(found @ (FileKind::Directory | FileKind::Regular)) => added.push(mount(path, found, false)),
            HostEntry::Present(other) => warnings.push(format!(
                "{}: isolated in earlier runs of this Domain but now a {}; it is not isolated (the sandbox sees the link itself) and stays recorded",
                shown(path),
                if other == FileKind::Symlink { "symlink" } else { "special file" }
            )),
            HostEntry::Missing if kind == RecordedKind::Directory => added.push(mount(path, FileKind::Directory, true)),
            HostEntry::Missing | HostEntry::ParentMissing => report.absent.push(path.to_path_buf()),
            HostEntry::Unreachable(reason) => warnings.push(format!(
                "{}: isolated in earlier runs of this Domain but not reachable without following a symlink ({reason}); nothing is mounted there and it stays recorded",
                shown(path)
            )),
        }
    }
    let mut updated = record.clone();
    for m in current.iter().chain(added.iter()) {
        updated.insert(&m.workspace_rel, RecordedKind::of(m.kind));
    }
    report.newly_recorded = updated.len() - record.len();
    report.isolated = added.iter().map(|m| m.workspace_rel.clone()).collect();
    let mut mounts: Vec<IgnoredMount> = current.into_iter().filter(|m| !covered(&added, &m.workspace_rel)).collect();
    mounts.extend(added);
    mounts.sort_by(|a, b| a.workspace_rel.cmp(&b.workspace_rel));
    StickyMerge { mounts, record: updated, report, warnings }
}

/// What [`reset_isolation`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordReset {
    /// There was no record.
    Absent,
    /// The record listed this many paths; it is deleted.
    Forgotten(usize),
    /// The record could not be read; it is deleted all the same.
    Unreadable,
}

/// Deletes the record of `domain_root` (`lazaret reset-isolation`): from
/// the next start on, only the current ignore rules decide what is
/// isolated. Domain storage of formerly isolated paths is kept. Call it
/// only while the Domain is stopped (holding its lock).
pub fn reset_isolation(domain_root: &Path) -> Result<RecordReset, MountError> {
    let file = IsolationRecord::file(domain_root);
    let outcome = match IsolationRecord::load(domain_root) {
        Ok(record) => RecordReset::Forgotten(record.len()),
        Err(_) => RecordReset::Unreadable,
    };
    match std::fs::remove_file(&file) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RecordReset::Absent),
        Err(e) => return Err(MountError::io("remove", &file, e)),
    }
    let _ = std::fs::remove_file(domain_root.join(format!("{RECORD_FILE}.tmp")));
    std::fs::File::open(domain_root).and_then(|dir| dir.sync_all()).map_err(|e| MountError::io("fsync", domain_root, e))?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn current(paths: &[(&str, FileKind)]) -> Vec<IgnoredMount> {
        paths
            .iter()
            .map(|(path, kind)| IgnoredMount {
                workspace_rel: p(path),
                storage: Path::new("/d/ignored").join(escape_path(Path::new(path))),
                kind: *kind,
                anticipated: false,
            })
            .collect()
    }

    fn record(paths: &[(&str, RecordedKind)]) -> IsolationRecord {
        let mut record = IsolationRecord::default();
        for (path, kind) in paths {
            record.insert(Path::new(path), *kind);
        }
        record
    }

    fn mounted(merge: &StickyMerge) -> Vec<PathBuf> {
        merge.mounts.iter().map(|m| m.workspace_rel.clone()).collect()
    }

    #[test]
    fn record_round_trips_odd_names_and_is_sorted() {
        let odd = PathBuf::from(OsString::from_vec(b"dir/we\xffird%\nname \xc3\xa9".to_vec()));
        let original = record(&[("node_modules", RecordedKind::Directory), (".env", RecordedKind::File)]);
        let mut original = original;
        original.insert(&odd, RecordedKind::File);
        let json = original.to_json();
        let text = String::from_utf8(json.clone()).expect("the record is UTF-8");
        assert!(text.contains(r#"{"path":".env","kind":"file"}"#), "{text}");
        assert!(text.contains("we%FFird%25%0Aname é"), "{text}");
        assert!(text.find(".env").expect(".env") < text.find("node_modules").expect("node_modules"));
        let parsed = IsolationRecord::parse(&json, Path::new("/d/isolated-paths.json")).expect("parse");
        assert_eq!(parsed, original);
        assert_eq!(
            IsolationRecord::parse(&IsolationRecord::default().to_json(), Path::new("f")).expect("empty"),
            IsolationRecord::default()
        );
    }

    #[test]
    fn a_damaged_record_is_an_error_that_names_the_file_and_the_fix() {
        let file = Path::new("/d/isolated-paths.json");
        for bad in [
            "",
            "{",
            r#"{"version": 2, "paths": []}"#,
            r#"{"version": 1}"#,
            r#"{"version": 1, "paths": [], "extra": 1}"#,
            r#"{"version": 1, "paths": [{"path": "a", "kind": "fifo"}]}"#,
            r#"{"version": 1, "paths": [{"path": "", "kind": "file"}]}"#,
            r#"{"version": 1, "paths": [{"path": "/etc/passwd", "kind": "file"}]}"#,
            r#"{"version": 1, "paths": [{"path": "a/../../b", "kind": "file"}]}"#,
            r#"{"version": 1, "paths": [{"path": "sub/.git", "kind": "directory"}]}"#,
            r#"{"version": 1, "paths": [{"path": "a//b", "kind": "file"}]}"#,
            r#"{"version": 1, "paths": [{"path": "a%0", "kind": "file"}]}"#,
            r#"{"version": 1, "paths": [{"path": "a%00b", "kind": "file"}]}"#,
        ] {
            let error = IsolationRecord::parse(bad.as_bytes(), file).expect_err(bad).to_string();
            assert!(error.contains("/d/isolated-paths.json") && error.contains("lazaret reset-isolation"), "{bad}: {error}");
        }
    }

    #[test]
    fn save_is_atomic_private_and_load_reads_it_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(IsolationRecord::load(dir.path()).expect("missing is empty").is_empty());
        let saved = record(&[(".env", RecordedKind::File), ("a/node_modules", RecordedKind::Directory)]);
        saved.save(dir.path()).expect("save");
        saved.save(dir.path()).expect("save again");
        assert_eq!(IsolationRecord::load(dir.path()).expect("load"), saved);
        let meta = std::fs::metadata(IsolationRecord::file(dir.path())).expect("record");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path()).expect("list").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, [RECORD_FILE], "a temporary file was left");
        std::fs::write(IsolationRecord::file(dir.path()), "{\"version\": 1, \"paths\": [").expect("truncate");
        assert!(IsolationRecord::load(dir.path()).is_err(), "a truncated record must not read as empty");
    }

    #[test]
    fn a_recorded_path_the_rules_dropped_stays_isolated() {
        let old = record(&[(".env", RecordedKind::File), ("node_modules", RecordedKind::Directory)]);
        let merge = merge_recorded(current(&[("node_modules", FileKind::Directory)]), &old, Path::new("/d"), |path| {
            assert_eq!(path, Path::new(".env"), "only paths the current rules miss are looked up");
            HostEntry::Present(FileKind::Regular)
        });
        assert_eq!(mounted(&merge), [p(".env"), p("node_modules")]);
        let env = &merge.mounts[0];
        assert_eq!((env.kind, env.anticipated, env.storage.clone()), (FileKind::Regular, false, p("/d/ignored/.env")));
        assert_eq!(merge.report.isolated, [p(".env")]);
        assert_eq!(merge.record, old);
        assert_eq!(merge.report.newly_recorded, 0);
        assert!(merge.warnings.is_empty());
    }

    #[test]
    fn newly_ignored_paths_are_recorded() {
        let merge = merge_recorded(
            current(&[("build", FileKind::Directory), ("x.log", FileKind::Regular)]),
            &IsolationRecord::default(),
            Path::new("/d"),
            |_| panic!("nothing recorded to look up"),
        );
        assert_eq!(mounted(&merge), [p("build"), p("x.log")]);
        assert_eq!(merge.record, record(&[("build", RecordedKind::Directory), ("x.log", RecordedKind::File)]));
        assert_eq!(merge.report.newly_recorded, 2);
        assert!(merge.report.isolated.is_empty());
    }

    #[test]
    fn nesting_keeps_only_top_most_mounts() {
        // A recorded path under a currently ignored one needs nothing.
        let merge =
            merge_recorded(current(&[("a", FileKind::Directory)]), &record(&[("a/b", RecordedKind::File)]), Path::new("/d"), |_| {
                panic!("covered paths are not looked up")
            });
        assert_eq!(mounted(&merge), [p("a")]);
        assert!(merge.report.isolated.is_empty());
        // A recorded directory above currently ignored paths replaces them,
        // and a recorded path under another recorded one is covered by it.
        let old = record(&[("a", RecordedKind::Directory), ("a/b/c", RecordedKind::File)]);
        let merge = merge_recorded(current(&[("a/x", FileKind::Regular), ("ab", FileKind::Directory)]), &old, Path::new("/d"), |path| {
            assert_eq!(path, Path::new("a"));
            HostEntry::Present(FileKind::Directory)
        });
        assert_eq!(mounted(&merge), [p("a"), p("ab")]);
        assert_eq!(merge.report.isolated, [p("a")]);
        assert!(merge.record.paths().any(|(path, _)| path == Path::new("a/x")), "covered current paths are recorded too");
    }

    #[test]
    fn missing_symlinked_and_unreachable_recorded_paths() {
        let old = record(&[
            ("cache", RecordedKind::Directory),
            ("gone/deep", RecordedKind::Directory),
            ("link", RecordedKind::Directory),
            ("old.env", RecordedKind::File),
            ("via-link/.env", RecordedKind::File),
        ]);
        let merge = merge_recorded(Vec::new(), &old, Path::new("/d"), |path| match path.to_str().unwrap_or_default() {
            "cache" | "old.env" => HostEntry::Missing,
            "gone/deep" => HostEntry::ParentMissing,
            "link" => HostEntry::Present(FileKind::Symlink),
            _ => HostEntry::Unreachable("a component is a symlink".into()),
        });
        // A missing directory is recreated as a mount point; a file is not.
        assert_eq!(mounted(&merge), [p("cache")]);
        assert!(merge.mounts[0].anticipated);
        assert_eq!(merge.report.absent, [p("gone/deep"), p("old.env")]);
        assert_eq!(merge.warnings.len(), 2, "{:?}", merge.warnings);
        assert!(merge.warnings[0].starts_with("link: ") && merge.warnings[0].contains("symlink"), "{:?}", merge.warnings);
        assert!(merge.warnings[1].starts_with("via-link/.env: "), "{:?}", merge.warnings);
        assert_eq!(merge.record, old, "nothing is forgotten");
    }

    #[test]
    fn a_path_that_changed_kind_is_recorded_with_its_new_kind() {
        let merge = merge_recorded(Vec::new(), &record(&[("out", RecordedKind::File)]), Path::new("/d"), |_| {
            HostEntry::Present(FileKind::Directory)
        });
        assert_eq!(merge.mounts[0].kind, FileKind::Directory);
        assert_eq!(merge.record, record(&[("out", RecordedKind::Directory)]));
    }

    #[test]
    fn look_up_never_follows_a_symlink() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(ws.join("real")).expect("real");
        std::fs::write(ws.join("real/.env"), "secret").expect(".env");
        std::fs::write(ws.join("file"), "").expect("file");
        std::os::unix::fs::symlink("real", ws.join("link")).expect("link");
        std::os::unix::fs::symlink("real/.env", ws.join("env-link")).expect("env link");
        let root = safe_path::open_root_dir(&ws).expect("open");
        let at = |rel: &str| look_up(root.as_fd(), Path::new(rel));
        assert_eq!(at("real/.env"), HostEntry::Present(FileKind::Regular));
        assert_eq!(at("real"), HostEntry::Present(FileKind::Directory));
        assert_eq!(at("env-link"), HostEntry::Present(FileKind::Symlink));
        assert_eq!(at("real/none"), HostEntry::Missing);
        assert_eq!(at("none/none"), HostEntry::ParentMissing);
        assert!(matches!(at("link/.env"), HostEntry::Unreachable(r) if r.contains("link")), "{:?}", at("link/.env"));
        assert!(matches!(at("link/sub/.env"), HostEntry::Unreachable(r) if r.contains("symlink")), "{:?}", at("link/sub/.env"));
        assert!(matches!(at("file/.env"), HostEntry::Unreachable(_)));
    }

    #[test]
    fn reset_deletes_the_record_even_a_damaged_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(reset_isolation(dir.path()).expect("reset"), RecordReset::Absent);
        record(&[(".env", RecordedKind::File), ("a", RecordedKind::Directory)]).save(dir.path()).expect("save");
        assert_eq!(reset_isolation(dir.path()).expect("reset"), RecordReset::Forgotten(2));
        assert!(!IsolationRecord::file(dir.path()).exists());
        std::fs::write(IsolationRecord::file(dir.path()), "garbage").expect("damage");
        assert_eq!(reset_isolation(dir.path()).expect("reset"), RecordReset::Unreadable);
        assert!(IsolationRecord::load(dir.path()).expect("load").is_empty());
    }
}
