//! The actions on one entry, fd-relative: every path is resolved from a
//! held root fd with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`, and
//! the entry itself is opened `O_NOFOLLOW` relative to its verified parent
//! before anything is changed through that fd (chown, chmod, xattr), so a
//! symlink or rename race the agent plays never makes the guard act
//! outside a root.

// The handlers take the verified fds, names and stat explicitly (no
// re-resolution by path), hence their long parameter lists.
#![allow(clippy::too_many_arguments)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::{Gid, Uid};

use super::classify::{self, ControlFile};
use super::config_filter::{self, ConfigLocation};
use super::git_model::{self, GitDirMarks, OperationFile, Verdict};
use super::quarantine::{Quarantine, RestoredMark};
use super::{Action, GuardConfig, GuardError, Neutralisation, RootKind};
use crate::error::MountError;
use crate::safe_path::{self, FileKind};

/// The xattr that carries file capabilities.
const CAPABILITY_XATTR: &std::ffi::CStr = c"security.capability";

/// Largest git control file read (a larger config is quarantined whole).
const MAX_CONTROL_FILE: u64 = 1 << 20;

/// One opened root.
pub(crate) struct OpenRoot {
    pub(crate) label: String,
    pub(crate) kind: RootKind,
    pub(crate) path: PathBuf,
    pub(crate) fd: OwnedFd,
}

/// Where the results go.
#[derive(Default)]
pub(crate) struct Out {
    pub(crate) neutralised: Vec<Neutralisation>,
    pub(crate) errors: Vec<String>,
    /// Something appeared where a kept git value leads through
    /// ([`Engine::is_depended_on`]): a sweep judges those values again.
    pub(crate) sweep: bool,
}

/// One tick of the kernel's coarse clock at its slowest (HZ=100), which
/// file timestamps use ([`Engine::changed_in_run`]).
const COARSE_CLOCK_SLACK: std::time::Duration = std::time::Duration::from_millis(10);

/// At most this many paths are remembered as ones kept git values go
/// through; past it, anything that appears anywhere asks for a sweep.
const MAX_DEPENDED_PATHS: usize = 65_536;

/// The root-relative paths (and their ancestors) that git values the guard
/// kept go through ([`Engine::path_ok`]). A value was judged with the
/// paths as they were then; if the agent later puts a symlink (or anything
/// else) at one of them (`rm -r sub; ln -s /home/dev sub` under `url =
/// sub/repo`), git would follow it.
#[derive(Default)]
struct DependedPaths {
    paths: std::collections::HashSet<(usize, PathBuf)>,
    full: bool,
}

/// The roots, the quarantine and the rules.
pub(crate) struct Engine {
    pub(crate) config: GuardConfig,
    pub(crate) roots: Vec<OpenRoot>,
    quarantine: Quarantine,
    restored: Vec<RestoredMark>,
    /// Where the developer's own `core.hooksPath` puts hooks in any
    /// repository ([`git_model::host_hook_dirs`]).
    host_hook_dirs: Vec<PathBuf>,
    depended: std::sync::Mutex<DependedPaths>,
    /// Where a symlink at a name git reads was taken away (or such a name
    /// vanished) since the last [`Engine::take_taint`]: the gate refuses
    /// opens that may have gone through it.
    taint: std::sync::Mutex<Option<String>>,
    /// With a gate: the control files the guard kept are replaced by sealed
    /// copies ([`Seals`]).
    pub(crate) seals: Option<Arc<Seals>>,
}

/// Owner and mode of a sealed copy: root's, read-only, so that a developer
/// agent cannot write it in place after the gate let a host process open
/// it (it can only replace it, which the gate sees as a new file).
const SEALED: (super::Owner, u32) = (super::Owner { uid: 0, gid: 0 }, 0o444);

/// The control files the guard sealed in this run, by (device, inode),
/// with their root and path: the gate allows host opens of these, and
/// the guard's stop gives them back to the developer.
///
/// Also the files the guard took away or replaced (by device and inode):
/// a host open of one that was waiting for the gate is refused, whatever
/// its name (the opener holds the old file).
///
/// And the control files the developer (not the sandbox) wrote last, as
/// the notification group saw them: the gate allows host opens of these,
/// and a sweep leaves a gated repository config so written.
#[derive(Default)]
pub(crate) struct Seals {
    files: std::sync::Mutex<HashMap<(u64, u64), (usize, PathBuf)>>,
    taken: std::sync::Mutex<std::collections::HashSet<(u64, u64)>>,
    /// (device, inode) to ctime.
    developer: std::sync::Mutex<HashMap<(u64, u64), (i64, i64)>>,
}

/// Most control files remembered as the developer's own writes.
const MAX_DEVELOPER_FILES: usize = 65_536;

/// Most taken files remembered (an open waits at most the gate's deadline,
/// so only recent ones matter; past it the set starts over).
const MAX_TAKEN: usize = 65_536;

impl Seals {
    fn insert(&self, file: FileVersion, root: usize, rel: &Path) {
        self.lock().insert((file.dev, file.ino), (root, rel.to_owned()));
    }

    /// Whether `st` is a file the guard sealed at `rel` of `root`, still
    /// sealed and still there (a sealed `commondir` moved elsewhere means
    /// something else, and is judged again).
    pub(crate) fn holds(&self, st: &FileStat, root: usize, rel: &Path) -> bool {
        st.st_uid == SEALED.0.uid
            && st.st_mode & 0o7777 == SEALED.1
            && self.lock().get(&(st.st_dev, st.st_ino)).is_some_and(|(r, p)| *r == root && p == rel)
    }

    fn note_taken(&self, dev: u64, ino: u64) {
        let mut taken = self.taken.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if taken.len() >= MAX_TAKEN {
            taken.clear();
        }
        taken.insert((dev, ino));
    }

    /// Whether the guard took the file (device, inode) away or replaced it.
    pub(crate) fn was_taken(&self, dev: u64, ino: u64) -> bool {
        self.taken.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&(dev, ino))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), (usize, PathBuf)>> {
        self.files.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn developer_table(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64), (i64, i64)>> {
        self.developer.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The developer wrote the control file `st` (as it is now).
    pub(crate) fn developer_wrote(&self, st: &FileStat) {
        let mut table = self.developer_table();
        if table.len() >= MAX_DEVELOPER_FILES {
            table.clear(); // their older writes are then refused once more
        }
        table.insert((st.st_dev, st.st_ino), (st.st_ctime, st.st_ctime_nsec));
    }

    /// The sandbox touched the file `st`: it is no longer the developer's write.
    pub(crate) fn sandbox_touched(&self, st: &FileStat) {
        self.developer_table().remove(&(st.st_dev, st.st_ino));
    }

    /// Whether `st`, as it is, is the developer's last write.
    pub(crate) fn developer_wrote_last(&self, st: &FileStat) -> bool {
        self.developer_wrote_version(st.st_dev, st.st_ino, (st.st_ctime, st.st_ctime_nsec))
    }

    /// Whether the file (device, inode) with this ctime is the developer's last write.
    pub(crate) fn developer_wrote_version(&self, dev: u64, ino: u64, ctime: (i64, i64)) -> bool {
        self.developer_table().get(&(dev, ino)) == Some(&ctime)
    }

    /// Gives every sealed file still in place back to the developer (mode
    /// 0644); returns what could not be.
    pub(crate) fn unseal_all(&self, config: &GuardConfig) -> Vec<String> {
        let mut errors = Vec::new();
        let files: Vec<_> = self.lock().drain().collect();
        for ((dev, ino), (root, rel)) in files {
            let Some(root_cfg) = config.roots.get(root) else { continue };
            let result = (|| -> Result<(), MountError> {
                let root_fd = safe_path::open_root_dir(&root_cfg.path)?;
                let Some(name) = rel.file_name() else { return Ok(()) };
                let parent =
                    safe_path::open_beneath(root_fd.as_fd(), rel.parent().unwrap_or(Path::new("")), OFlag::O_PATH | OFlag::O_DIRECTORY)?;
                let Ok(st) = nix::sys::stat::fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) else { return Ok(()) };
                if (st.st_dev, st.st_ino) != (dev, ino) || safe_path::kind_of(&st) != FileKind::Regular {
                    return Ok(()); // replaced since: not the guard's any more
                }
                let developer = config.developer;
                nix::unistd::fchownat(
                    &parent,
                    name,
                    Some(Uid::from_raw(developer.uid)),
                    Some(Gid::from_raw(developer.gid)),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(|e| MountError::sys("chown", &rel, e))?;
                nix::sys::stat::fchmodat(&parent, name, Mode::from_bits_truncate(0o644), nix::sys::stat::FchmodatFlags::FollowSymlink)
                    .map_err(|e| MountError::sys("chmod", &rel, e))
            })();
            if let Err(e) = result {
                errors.push(format!("{}:{}: giving a sealed file back: {e}", root_cfg.label, lazaret_protocol::display::escaped(&rel)));
            }
        }
        errors
    }
}

/// Who caused what is being handled: an event's pid, or a sweep.
#[derive(Clone, Copy)]
pub(crate) struct Cause {
    pub(crate) pid: Option<u32>,
    /// A walk of a directory renamed in: its entries keep the ctimes they
    /// had, so "changed during the run" says nothing about them.
    pub(crate) every_file: bool,
    /// The file (device, inode) the event's writer has not closed yet
    /// (created or written, no `FAN_CLOSE_WRITE` so far): it is not sealed
    /// now, since a seal would swap it out under the writer and lose the
    /// rest of its writes; its close's event seals it.
    pub(crate) still_open: Option<(u64, u64)>,
}

impl Engine {
    /// Opens every root and the quarantine.
    pub(crate) fn open(config: GuardConfig) -> Result<Engine, GuardError> {
        let mut labels = std::collections::HashSet::new();
        let mut workspaces = 0;
        for root in &config.roots {
            if !labels.insert(root.label.as_str()) {
                return Err(GuardError::Config(format!("duplicate root label {:?}", root.label)));
            }
            workspaces += usize::from(root.kind == RootKind::Workspace);
        }
        if workspaces > 1 {
            return Err(GuardError::Config("more than one workspace root".into()));
        }
        let mut roots = Vec::new();
        for root in &config.roots {
            let fd = safe_path::open_root_dir(&root.path)?;
            roots.push(OpenRoot { label: root.label.clone(), kind: root.kind, path: root.path.clone(), fd });
        }
        let quarantine = Quarantine::open(&config.quarantine_dir, config.quarantine_limits)?;
        let restored = quarantine.restored_marks();
        let host_hook_dirs = git_model::host_hook_dirs(config.host_hooks_paths.iter().map(String::as_str));
        Ok(Engine {
            config,
            roots,
            quarantine,
            restored,
            host_hook_dirs,
            depended: Default::default(),
            taint: Default::default(),
            seals: None,
        })
    }

    /// Where a symlink at a name git reads was taken away (or such a name
    /// vanished) since the last call, if anywhere.
    pub(crate) fn take_taint(&self) -> Option<String> {
        self.taint.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    /// Owner and mode of a file the guard writes in place of a control file.
    fn replacement(&self) -> (super::Owner, u32) {
        if self.seals.is_some() { SEALED } else { (self.config.developer, 0o644) }
    }

    /// With a gate, replaces a control file the guard keeps as it is by a
    /// sealed copy of the same bytes (unless it is one already), so that
    /// what the gate lets the host read cannot change in place afterwards.
    #[allow(clippy::too_many_arguments)] // verified fds and names, passed explicitly
    fn seal(
        &self,
        root: usize,
        rel: &Path,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        st: &FileStat,
        contents: &[u8],
        version: &FileVersion,
        cause: Cause,
        out: &mut Out,
    ) {
        let Some(seals) = &self.seals else { return };
        if seals.holds(st, root, rel) || self.protected(root, rel) || cause.still_open == Some((version.dev, version.ino)) {
            return;
        }
        // Noted before the exchange: a host open of it, waiting at the
        // gate, must not find it under the temporary name as an ordinary
        // file (it stays a judged file if the exchange is undone).
        self.note_taken((version.dev, version.ino));
        match replace_with(SEALED, rel, parent, name, &temp_name(), contents, Some(version)) {
            Ok(Replaced::Placed(sealed)) => seals.insert(sealed, root, rel),
            // Gone, or a newer version came: its own event seals it.
            Ok(Replaced::Gone | Replaced::Newer) => {}
            Err(e) => self.error(root, rel, format!("sealing: {e}"), out),
        }
    }

    /// [`Engine::seal`] of what is at `name` now.
    fn seal_current(&self, root: usize, rel: &Path, parent: BorrowedFd<'_>, name: &OsStr, cause: Cause, out: &mut Out) {
        if self.seals.is_none() {
            return;
        }
        match (read_regular_versioned(parent, name, MAX_CONTROL_FILE), nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW))
        {
            (Ok(Some((contents, version))), Ok(st)) => self.seal(root, rel, parent, name, &st, &contents, &version, cause, out),
            (Err(e), _) => self.error(root, rel, format!("sealing: {e}"), out),
            _ => {}
        }
    }

    /// Notes that a host open may have gone through a symlink of the
    /// sandbox at `rel` (a name git reads, in a git dir).
    pub(crate) fn note_taint(&self, root: usize, rel: &Path) {
        let at = format!("{}:{}", self.roots[root].label, lazaret_protocol::display::escaped(rel));
        *self.taint.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(at);
    }

    /// Notes, with a gate, that the file `st` is no longer at its path
    /// because the guard took it away or replaced it: a host open of it
    /// that was waiting is refused.
    fn note_taken(&self, (dev, ino): (u64, u64)) {
        if let Some(seals) = &self.seals {
            seals.note_taken(dev, ino);
        }
    }

    /// Re-reads the restore log (after a restore while the guard runs).
    pub(crate) fn reload_restored(&mut self) {
        self.restored = self.quarantine.restored_marks();
    }

    /// Whether files of `st` count as changed during the run (sweep rule).
    pub(crate) fn changed_in_run(&self, st: &FileStat) -> bool {
        let Some(since) = self.config.changed_since else { return true };
        // A file's ctime comes from the kernel's coarse clock, up to a tick
        // behind the clock `since` was read from: a file written just after
        // `since` can carry a ctime just before it. Those few milliseconds
        // are judged too (the safe side).
        let since = since.duration_since(UNIX_EPOCH).unwrap_or_default().saturating_sub(COARSE_CLOCK_SLACK);
        let ctime = (st.st_ctime, st.st_ctime_nsec);
        ctime >= (since.as_secs() as i64, i64::from(since.subsec_nanos()))
    }

    /// Whether an entry judged by name (a host hook, alternates, a symlink)
    /// is judged now: after an event, in a walk of a directory renamed in,
    /// or in a sweep when it changed during the run (older ones are the
    /// developer's, or were judged by the run that wrote them).
    fn judged_now(&self, st: &FileStat, cause: Cause) -> bool {
        cause.pid.is_some() || cause.every_file || self.changed_in_run(st)
    }

    fn record(
        &self,
        root: usize,
        rel: &Path,
        action: Action,
        reason: impl Into<String>,
        quarantine_id: Option<String>,
        cause: Cause,
        out: &mut Out,
    ) {
        out.neutralised.push(Neutralisation {
            root: self.roots[root].label.clone(),
            path: rel.to_owned(),
            action,
            reason: reason.into(),
            quarantine_id,
            pid: cause.pid,
        });
    }

    fn error(&self, root: usize, rel: &Path, error: impl std::fmt::Display, out: &mut Out) {
        out.errors.push(format!("{}:{}: {error}", self.roots[root].label, lazaret_protocol::display::escaped(rel)));
    }

    /// The developer's version of `rel` if it is a gated repository config
    /// of the workspace ([`GuardConfig::developer_configs`]).
    pub(crate) fn developer_config(&self, root: usize, rel: &Path) -> Option<&[u8]> {
        if self.roots[root].kind != RootKind::Workspace {
            return None;
        }
        self.config.developer_configs.iter().find(|c| c.path == rel).map(|c| c.developer.as_slice())
    }

    /// Puts the developer's version back where a gated repository config
    /// is missing (the sandbox removed it or moved it away; no event says
    /// so, so sweeps look) or is a directory the sandbox made (moved aside
    /// first: git would fail on it, and the guard takes no directory into
    /// the quarantine): as the guard's sealed copy, which the gate lets the
    /// host read. (A symlink there is quarantined by the walk before.)
    pub(crate) fn restore_missing_developer_configs(&self, out: &mut Out) {
        for root in (0..self.roots.len()).filter(|&r| self.roots[r].kind == RootKind::Workspace) {
            for config in &self.config.developer_configs {
                let rel = config.path.as_path();
                let Some(name) = rel.file_name() else { continue };
                // Its git dir is pinned (a mount point): it is there.
                let Ok(parent) = self.open_dir(root, rel.parent().unwrap_or(Path::new(""))) else { continue };
                let reason = match nix::sys::stat::fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Err(Errno::ENOENT) => "the developer's git config was missing (removed or moved away in the sandbox)".to_owned(),
                    Ok(st) if safe_path::kind_of(&st) == FileKind::Directory => {
                        let aside = format!("{}.lazaret-aside-{}", name.to_string_lossy(), &temp_name()[TEMP_PREFIX.len()..]);
                        match nix::fcntl::renameat2(&parent, name, &parent, aside.as_str(), nix::fcntl::RenameFlags::RENAME_NOREPLACE) {
                            Ok(()) => format!("the developer's git config was a directory the sandbox made (moved aside to {aside})"),
                            Err(errno) => {
                                self.error(
                                    root,
                                    rel,
                                    format!("moving aside the directory made at the developer's git config: {errno}"),
                                    out,
                                );
                                continue;
                            }
                        }
                    }
                    _ => continue,
                };
                match replace_with(self.replacement(), rel, parent.as_fd(), name, &temp_name(), &config.developer, None) {
                    Ok(Replaced::Placed(placed)) => {
                        if let Some(seals) = &self.seals {
                            seals.insert(placed, root, rel);
                        }
                        self.record(
                            root,
                            rel,
                            Action::RestoredDeveloperConfig,
                            reason,
                            None,
                            Cause { pid: None, every_file: false, still_open: None },
                            out,
                        );
                    }
                    Ok(Replaced::Gone | Replaced::Newer) => {}
                    Err(e) => self.error(root, rel, format!("putting the developer's git config back: {e}"), out),
                }
            }
        }
    }

    /// Whether a sweep leaves the gated repository config `st` at `rel` as
    /// it is: unchanged since the start, the guard's sealed copy, or the
    /// developer's own write during the run. After an event of the
    /// sandbox, and in the walk of a directory renamed in, it is judged.
    fn developers_config_stands(&self, root: usize, rel: &Path, st: &FileStat, cause: Cause) -> bool {
        if cause.pid.is_some() || cause.every_file {
            return false;
        }
        !self.changed_in_run(st) || self.seals.as_ref().is_some_and(|s| s.holds(st, root, rel) || s.developer_wrote_last(st))
    }

    /// Whether the root-relative `rel` is Git Sentry's. In a git directory
    /// outside the workspace, its own `config`, `hooks` and `info` count as
    /// protected even when the list lacks them (a crash-recovery sweep whose
    /// record was lost): they are the developer's main repository's.
    pub(crate) fn protected(&self, root: usize, rel: &Path) -> bool {
        match self.roots[root].kind {
            RootKind::Workspace => classify::is_protected(rel, &self.config.protected),
            RootKind::GitDir => {
                ["config", "hooks", "info"].iter().any(|own| rel.starts_with(own))
                    || classify::is_protected(&self.roots[root].path.join(rel), &self.config.protected)
            }
            RootKind::IgnoredState | RootKind::Volume => false,
        }
    }

    /// Ownership and privilege bits of the entry `name` of the verified
    /// directory `parent` (`rel` is its root-relative path, `st` its lstat).
    pub(crate) fn fix_entry(
        &self,
        root: usize,
        rel: &Path,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        st: &FileStat,
        cause: Cause,
        out: &mut Out,
    ) {
        if let Err(e) = self.try_fix_entry(root, rel, parent, name, st, cause, out) {
            self.error(root, rel, e, out);
        }
    }

    fn try_fix_entry(
        &self,
        root: usize,
        rel: &Path,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        st: &FileStat,
        cause: Cause,
        out: &mut Out,
    ) -> Result<(), MountError> {
        let kind = safe_path::kind_of(st);
        if self.seals.as_ref().is_some_and(|s| s.holds(st, root, rel)) {
            return Ok(()); // the guard's own sealed copy
        }
        let developer = self.config.developer;
        let foreign_uid = st.st_uid != developer.uid;
        // A group inherited from a setgid parent is normal: only a gid that
        // is neither the developer's nor the parent's is foreign.
        let foreign_gid = st.st_gid != developer.gid && {
            let parent_gid = nix::sys::stat::fstat(parent).map(|p| p.st_gid).ok();
            parent_gid != Some(st.st_gid)
        };
        if kind != FileKind::Regular && !(foreign_uid || foreign_gid) {
            return Ok(());
        }
        // The common case, every file a developer agent writes: a regular
        // file of the developer's without setuid/setgid. Only file
        // capabilities could be wrong, and one getxattrat by name (no file
        // opened) tells. Deciding by name is enough: if the name was
        // replaced since `st` was taken, the replacement made its own event
        // (create or rename) and is judged by it (and by the sweep); a
        // capability found is removed below, through a verified fd.
        if kind == FileKind::Regular && !(foreign_uid || foreign_gid) && st.st_mode & (libc::S_ISUID | libc::S_ISGID) == 0 {
            match crate::sys::has_xattr_at(parent, name, CAPABILITY_XATTR) {
                Ok(false) | Err(Errno::ENOENT) => return Ok(()),
                Ok(true) | Err(Errno::ENOSYS) => {}
                Err(errno) => return Err(MountError::sys("getxattr", rel, errno)),
            }
        }
        // Open the entry itself, never through a symlink.
        let fd = match nix::fcntl::openat(parent, name, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(()),
            Err(errno) => return Err(MountError::sys("open", rel, errno)),
        };
        let now = nix::sys::stat::fstat(&fd).map_err(|e| MountError::sys("fstat", rel, e))?;
        if now.st_ino != st.st_ino || now.st_dev != st.st_dev {
            // Replaced between the stat and the open: the replacement made
            // its own event (create or rename), and a sweep sees it too.
            return Ok(());
        }
        // The bits as they are now, not when the event was queued: a chmod
        // that landed since then is cleared by the chown below (the kernel
        // drops setuid/setgid on chown) and must still be reported.
        let privileged_bits = kind == FileKind::Regular && now.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0;
        // A real fd on the same inode (through the O_PATH fd, not the name),
        // for chmod and removexattr, and for the capability check where
        // getxattrat is missing.
        let reopen = || {
            nix::fcntl::open(
                format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)).as_str(),
                OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| MountError::sys("reopen", rel, e))
        };
        // Capabilities, checked before a chown (which drops them itself and
        // would hide that there were any), by name as above (getxattrat
        // refuses an O_PATH fd), the inode having been verified just now.
        let mut file = None;
        let capabilities = if kind == FileKind::Regular {
            match crate::sys::has_xattr_at(parent, name, CAPABILITY_XATTR) {
                Ok(found) => found,
                Err(Errno::ENOENT) => return Ok(()),
                // Before Linux 6.13.
                Err(Errno::ENOSYS) => {
                    let opened = reopen()?;
                    let found = crate::sys::has_xattr(opened.as_fd(), CAPABILITY_XATTR).map_err(|e| MountError::sys("getxattr", rel, e))?;
                    file = Some(opened);
                    found
                }
                Err(errno) => return Err(MountError::sys("getxattr", rel, errno)),
            }
        } else {
            false
        };
        // Ownership: not for a hard-linked file (the other names may be
        // anyone's; the bits are still stripped below).
        if (foreign_uid || foreign_gid) && (now.st_nlink <= 1 || kind == FileKind::Directory) {
            let uid = foreign_uid.then(|| Uid::from_raw(developer.uid));
            let gid = foreign_gid.then(|| Gid::from_raw(developer.gid));
            nix::unistd::fchownat(&fd, "", uid, gid, AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| MountError::sys("chown", rel, e))?;
            self.record(
                root,
                rel,
                Action::ChangedOwner { old_uid: st.st_uid, old_gid: st.st_gid },
                "made by the sandbox with an owner other than the developer",
                None,
                cause,
                out,
            );
        }
        if !(privileged_bits || capabilities) {
            return Ok(());
        }
        let file = match file {
            Some(file) => file,
            None => reopen()?,
        };
        // After the chown (which may have cleared bits itself): strip what
        // is left, and report what the file carried.
        if privileged_bits {
            let current = nix::sys::stat::fstat(&file).map_err(|e| MountError::sys("fstat", rel, e))?;
            let new_mode = current.st_mode & 0o7777 & !(libc::S_ISUID | libc::S_ISGID);
            if current.st_mode & 0o7777 != new_mode {
                nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(new_mode)).map_err(|e| MountError::sys("chmod", rel, e))?;
            }
            self.record(
                root,
                rel,
                Action::ClearedPrivilegeBits { old_mode: now.st_mode & 0o7777, new_mode },
                "setuid/setgid on a file the sandbox made or changed",
                None,
                cause,
                out,
            );
        }
        if capabilities {
            crate::sys::remove_xattr(file.as_fd(), CAPABILITY_XATTR).map_err(|e| MountError::sys("removexattr", rel, e))?;
            self.record(
                root,
                rel,
                Action::RemovedFileCapabilities,
                "file capabilities on a file the sandbox made or changed",
                None,
                cause,
                out,
            );
        }
        Ok(())
    }

    /// Opens the directory `rel` beneath root `root` (no symlinks).
    fn open_dir(&self, root: usize, rel: &Path) -> Result<OwnedFd, MountError> {
        safe_path::open_beneath(self.roots[root].fd.as_fd(), rel, OFlag::O_PATH | OFlag::O_DIRECTORY)
    }

    /// Whether `rel` (in a root with git control) is a git directory by the
    /// model ([`GitDirMarks`]: named `.git`, or `HEAD` and `commondir`, or
    /// `objects` and `refs`, entries of any type).
    pub(crate) fn is_git_dir(&self, root: usize, rel: &Path) -> bool {
        is_git_dir_at(self.roots[root].fd.as_fd(), rel)
    }

    /// Whether the directory holding `rel`, or the one above it (`hooks/`,
    /// `info/`), is a git directory by the model.
    pub(crate) fn in_git_dir(&self, root: usize, rel: &Path) -> bool {
        let parent = rel.parent();
        parent.into_iter().chain(parent.and_then(Path::parent)).any(|dir| self.is_git_dir(root, dir))
    }

    /// Whether a sweep leaves this git control entry alone: in a volume
    /// (where Git Sentry protects nothing, so the developer's own control
    /// files are there from before), what did not change during the run.
    /// A directory is always looked into: writing a hook does not change
    /// its directory's ctime.
    fn sweep_leaves(&self, root: usize, st: &FileStat, cause: Cause) -> bool {
        cause.pid.is_none()
            && self.roots[root].kind == RootKind::Volume
            && safe_path::kind_of(st) != FileKind::Directory
            && !self.changed_in_run(st)
    }

    /// Checks every control file of the git directory `git_dir`
    /// ([`git_model::control_files`]), its symlinks, and the common
    /// directory its `commondir` names (git reads config and hooks there,
    /// whether or not that directory has a `HEAD` of its own).
    pub(crate) fn check_git_dir(&self, root: usize, git_dir: &Path, cause: Cause, out: &mut Out) {
        self.check_git_dir_once(root, git_dir, cause, out);
        let commondir = git_dir.join("commondir");
        let Some((parent, name, _)) = self.lstat(root, &commondir, out) else { return };
        let Ok(Some(contents)) = read_regular(parent.as_fd(), name, MAX_CONTROL_FILE) else { return };
        let value = String::from_utf8_lossy(&contents);
        // A commondir the check kept is a linked worktree's `../..`; git
        // reads it one level only.
        if classify::commondir_ok(git_dir, &value) {
            if let Some(common) = git_model::join_inside(git_dir, Path::new(value.trim_end_matches(['\n', '\r']))) {
                self.check_git_dir_once(root, &common, cause, out);
            }
        }
    }

    fn check_git_dir_once(&self, root: usize, git_dir: &Path, cause: Cause, out: &mut Out) {
        for (name, kind) in git_model::control_files() {
            self.check_control(root, git_dir, &git_dir.join(name), kind, cause, out);
        }
        // Symlinks in the git dir itself and in `objects/` (an `objects`
        // or `objects/pack` leading to a host repository makes git read
        // its objects, as an alternate would).
        for dir in [git_dir.to_path_buf(), git_dir.join("objects")] {
            if self.protected(root, &dir) {
                continue;
            }
            let Ok(fd) = safe_path::open_beneath(self.roots[root].fd.as_fd(), &dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY) else { continue };
            let Ok(listing) = nix::fcntl::openat(&fd, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()) else {
                continue;
            };
            for name in list_names(listing) {
                let symlink = nix::sys::stat::fstatat(&fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| safe_path::kind_of(&st) == FileKind::Symlink);
                if symlink {
                    self.check_symlink_in_git_dir(root, &dir.join(name), cause, out);
                }
            }
        }
    }

    /// Checks made by name, wherever the entry is (it need not be in a
    /// recognised git dir): a hook at the developer's own relative
    /// `core.hooksPath`, an `info/alternates` list (`objects` may be a
    /// symlink, so the objects directory can have any name). A sweep
    /// judges host hooks only when they changed during the run.
    pub(crate) fn check_by_name(&self, root: usize, rel: &Path, cause: Cause, out: &mut Out) {
        if self.protected(root, rel) {
            return;
        }
        let host_hook = git_model::host_hook(rel, &self.host_hook_dirs);
        let alternates = rel.parent().is_some_and(|p| p.file_name() == Some(OsStr::new("info")))
            && matches!(rel.file_name().map(OsStr::as_bytes), Some(b"alternates" | b"http-alternates"));
        if host_hook {
            let Some((parent, name, st)) = self.lstat(root, rel, out) else { return };
            if safe_path::kind_of(&st) == FileKind::Directory
                || !self.judged_now(&st, cause)
                || self.restored.iter().any(|m| m.matches(&self.roots[root].label, rel, &st))
            {
                return;
            }
            return self.quarantine(
                root,
                rel,
                parent.as_fd(),
                name,
                &st,
                "a hook where the developer's own core.hooksPath makes git look for hooks",
                cause,
                out,
            );
        }
        if alternates {
            let objects_dir = rel.parent().and_then(Path::parent).unwrap_or(Path::new(""));
            let kind =
                if rel.file_name() == Some(OsStr::new("alternates")) { ControlFile::Alternates } else { ControlFile::HttpAlternates };
            self.check_control(root, objects_dir, rel, kind, cause, out);
        }
    }

    /// A symlink whose parent (or the parent's parent: `objects/pack`) is
    /// a git dir, made or changed during the run, leading out of the root
    /// or through another symlink: git would read (objects, refs, packs)
    /// from the place it names. Quarantined.
    pub(crate) fn check_symlink_in_git_dir(&self, root: usize, rel: &Path, cause: Cause, out: &mut Out) {
        let Some(parent_rel) = rel.parent() else { return };
        if self.protected(root, rel) {
            return;
        }
        let Some((parent, name, st)) = self.lstat(root, rel, out) else { return };
        if safe_path::kind_of(&st) != FileKind::Symlink || !self.judged_now(&st, cause) {
            return;
        }
        let in_git_dir = self.is_git_dir(root, parent_rel) || parent_rel.parent().is_some_and(|g| self.is_git_dir(root, g));
        if !in_git_dir {
            return;
        }
        // Kept only when its text leads inside and on to there without
        // another symlink: a target inside can itself go through a symlink
        // of the agent's (`objects -> ../../lnk`, `lnk -> /home/dev/private/.git/objects`).
        // git itself makes one briefly (`git init` probes `core.symlinks`
        // with a link to `testing`), which stays.
        let Ok(target) = nix::fcntl::readlinkat(parent.as_fd(), name) else { return };
        let inside = git_model::local_place_inside(&target.to_string_lossy(), &self.roots[root].path, &[parent_rel]);
        let plain = |p: &PathBuf| match safe_path::open_path_beneath(self.roots[root].fd.as_fd(), p) {
            Ok(None) => true,
            Ok(Some(fd)) => safe_path::file_kind(fd.as_fd()).is_ok_and(|kind| kind != FileKind::Symlink),
            Err(_) => false,
        };
        // At a name git reads (`config`, `hooks`, `info`, a hook), git would
        // read the target under another name, which the gate does not
        // judge: never kept, wherever it leads.
        let redirecting = super::gate::is_redirecting_name(rel);
        if !redirecting && inside.is_some_and(|paths| paths.iter().all(|p| plain(p) && self.path_ok(root, p))) {
            return;
        }
        self.quarantine(
            root,
            rel,
            parent.as_fd(),
            name,
            &st,
            if redirecting {
                "a symlink in a git dir at a name git reads (git would read what it names as its config, hooks or attributes)"
            } else {
                "a symlink in a git dir leading out of the workspace or through another symlink (git would read what it names)"
            },
            cause,
            out,
        )
    }

    /// For an event on `rel` in a root with git control: the repository it makes (a
    /// `.git`, or an entry that completes a git directory) and the control
    /// file it may be.
    pub(crate) fn check_git_event(&self, root: usize, rel: &Path, cause: Cause, out: &mut Out) {
        if classify::is_dot_git(rel) {
            self.check_dot_git(root, rel, cause, out);
        }
        let name = rel.file_name().map(OsStr::as_bytes).unwrap_or_default();
        if GitDirMarks::is_mark(name) {
            let parent = rel.parent().unwrap_or(Path::new(""));
            if !classify::is_dot_git(parent) && self.is_git_dir(root, parent) {
                self.check_git_dir(root, parent, cause, out);
            }
        }
        for candidate in classify::control_candidates(rel) {
            if matches!(candidate.kind, ControlFile::Alternates | ControlFile::HttpAlternates) {
                continue; // judged by name below, git dir or not
            }
            if self.is_git_dir(root, &candidate.git_dir) {
                self.check_control(root, &candidate.git_dir, rel, candidate.kind, cause, out);
            }
        }
        self.check_by_name(root, rel, cause, out);
    }

    /// A `.git` entry: a directory is checked as a git directory, a
    /// symlink quarantined (git would follow it), a `gitdir:` file accepted
    /// only if it leads inside the workspace (or into one of Git Sentry's
    /// outside git directories), its target then checked.
    pub(crate) fn check_dot_git(&self, root: usize, rel: &Path, cause: Cause, out: &mut Out) {
        if self.protected(root, rel) {
            return;
        }
        let Some((parent, name, st)) = self.lstat(root, rel, out) else { return };
        if self.sweep_leaves(root, &st, cause) {
            return;
        }
        match safe_path::kind_of(&st) {
            FileKind::Directory => self.check_git_dir(root, rel, cause, out),
            FileKind::Regular => {
                let contents = match read_regular(parent.as_fd(), name, MAX_CONTROL_FILE) {
                    Ok(Some(c)) => c,
                    Ok(None) => return,
                    Err(e) => return self.error(root, rel, e, out),
                };
                if !contents.starts_with(b"gitdir: ") {
                    return; // git refuses such a file: nothing is loaded through it
                }
                let Some(target) = crate::repo::gitfile_target(&contents) else {
                    return self.quarantine(
                        root,
                        rel,
                        parent.as_fd(),
                        name,
                        &st,
                        "a gitdir: file whose path holds a control character (git would take a second line as part of it)",
                        cause,
                        out,
                    );
                };
                let base = rel.parent().unwrap_or(Path::new(""));
                let location = ConfigLocation { workspace_abs: &self.roots[root].path, git_dir: base };
                match config_filter::workspace_relative(target, location) {
                    Some(target_rel) if self.path_ok(root, &target_rel) => {
                        if self.is_git_dir(root, &target_rel) {
                            self.check_git_dir(root, &target_rel, cause, out);
                        }
                    }
                    _ if Path::new(target).is_absolute()
                        && self.config.outside_git_dirs.iter().any(|d| Path::new(target).starts_with(d)) => {}
                    _ => self.quarantine(
                        root,
                        rel,
                        parent.as_fd(),
                        name,
                        &st,
                        "a gitdir: file leading outside the workspace or through a symlink",
                        cause,
                        out,
                    ),
                }
            }
            _ => self.quarantine(
                root,
                rel,
                parent.as_fd(),
                name,
                &st,
                "a .git that is a symlink or special file (git would follow it)",
                cause,
                out,
            ),
        }
    }

    /// Handles one control file `rel` of `git_dir`.
    fn check_control(&self, root: usize, git_dir: &Path, rel: &Path, kind: ControlFile, cause: Cause, out: &mut Out) {
        if self.protected(root, rel) {
            return;
        }
        let Some((parent, name, st)) = self.lstat(root, rel, out) else { return };
        if self.restored.iter().any(|m| m.matches(&self.roots[root].label, rel, &st)) {
            return;
        }
        if self.sweep_leaves(root, &st, cause) {
            return;
        }
        let file_kind = safe_path::kind_of(&st);
        let parent = parent.as_fd();
        match (kind, file_kind) {
            (_, FileKind::Symlink)
            | (ControlFile::Config | ControlFile::ConfigWorktree | ControlFile::Commondir | ControlFile::Gitdir, FileKind::Other) => {
                self.quarantine(root, rel, parent, name, &st, "a git control file that is a symlink or special file", cause, out)
            }
            (ControlFile::HooksDir | ControlFile::InfoDir | ControlFile::RemotesDir, FileKind::Regular | FileKind::Other) => {
                self.quarantine(root, rel, parent, name, &st, "a git hooks/info/remotes/branches entry that is not a directory", cause, out)
            }
            (ControlFile::RemotesDir, FileKind::Directory) => {
                let Ok(dir) = safe_path::open_beneath(self.roots[root].fd.as_fd(), rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY) else {
                    return;
                };
                for remote in list_names(dir) {
                    self.check_control(root, git_dir, &rel.join(&remote), ControlFile::RemoteFile, cause, out);
                }
            }
            (ControlFile::HooksDir, FileKind::Directory) => {
                let Ok(dir) = safe_path::open_beneath(self.roots[root].fd.as_fd(), rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY) else {
                    return;
                };
                for hook in list_names(dir) {
                    if !classify::hook_is_inert(hook.as_bytes()) {
                        self.check_control(root, git_dir, &rel.join(&hook), ControlFile::Hook, cause, out);
                    }
                }
            }
            (ControlFile::InfoDir, FileKind::Directory) => {
                self.check_control(root, git_dir, &rel.join("attributes"), ControlFile::InfoAttributes, cause, out)
            }
            (_, FileKind::Directory) => {}
            (ControlFile::Hook, _) => self.quarantine(root, rel, parent, name, &st, "a git hook the sandbox planted", cause, out),
            (ControlFile::RemoteFile, _) => self.quarantine(
                root,
                rel,
                parent,
                name,
                &st,
                "a remote defined by a file (git would fetch from the URL it names)",
                cause,
                out,
            ),
            // Alternates are judged wherever they are (by name), so a sweep
            // judges only those changed during the run: the developer's own
            // (`git clone --reference /elsewhere`) stay.
            (ControlFile::Alternates | ControlFile::HttpAlternates, _) if !self.judged_now(&st, cause) => {}
            (ControlFile::HttpAlternates, _) => {
                self.quarantine(root, rel, parent, name, &st, "objects/info/http-alternates: URLs git would fetch objects from", cause, out)
            }
            (ControlFile::Alternates, FileKind::Other) => {
                self.quarantine(root, rel, parent, name, &st, "an alternates list that is a special file", cause, out)
            }
            (ControlFile::Alternates, _) => match read_regular(parent, name, MAX_CONTROL_FILE) {
                Ok(Some(contents)) => {
                    // `git_dir` is the objects directory's parent; entries
                    // are relative to the objects directory.
                    let objects_dir = rel.parent().and_then(Path::parent).unwrap_or(Path::new(""));
                    let inside = git_model::alternates_inside(&contents, &self.roots[root].path, objects_dir);
                    if inside.is_some_and(|paths| paths.iter().all(|p| self.path_ok(root, p))) {
                        self.seal_current(root, rel, parent, name, cause, out)
                    } else {
                        self.quarantine(
                            root,
                            rel,
                            parent,
                            name,
                            &st,
                            "an alternates list naming objects outside the workspace (git would read them)",
                            cause,
                            out,
                        )
                    }
                }
                Ok(None) => {}
                Err(e) => self.error(root, rel, e, out),
            },
            (ControlFile::InfoAttributes, _) => {
                self.quarantine(root, rel, parent, name, &st, "info/attributes in a repository the sandbox made or changed", cause, out)
            }
            (ControlFile::Config | ControlFile::ConfigWorktree, _) => match self.developer_config(root, rel) {
                Some(_) if self.developers_config_stands(root, rel, &st, cause) => {}
                developer => self.filter_config_file(root, git_dir, rel, parent, name, &st, developer, cause, out),
            },
            (ControlFile::OperationState(_), FileKind::Other) => {
                self.quarantine(root, rel, parent, name, &st, "operation state that is a special file", cause, out)
            }
            (ControlFile::OperationState(file), _) => self.neutralise_operation_file(root, rel, file, parent, name, &st, cause, out),
            // An empty commondir or gitdir is one git has created and not
            // yet written (git's write_file: create, then one write): judged
            // by the write's own event, or by the next sweep. Empty, neither
            // redirects anything (git reads an empty commondir as the git
            // dir itself).
            (ControlFile::Commondir | ControlFile::Gitdir, _) if st.st_size == 0 => {}
            (ControlFile::Commondir, _) => match read_regular(parent, name, MAX_CONTROL_FILE) {
                Ok(Some(contents)) if contents.iter().all(u8::is_ascii_whitespace) => {
                    self.seal_current(root, rel, parent, name, cause, out)
                }
                Ok(Some(contents)) if classify::commondir_ok(git_dir, &String::from_utf8_lossy(&contents)) => {
                    self.seal_current(root, rel, parent, name, cause, out)
                }
                Ok(None) => {}
                Ok(Some(_)) => {
                    self.quarantine(root, rel, parent, name, &st, "a commondir that redirects git to another git directory", cause, out)
                }
                Err(e) => self.error(root, rel, e, out),
            },
            // A linked worktree's back-link names its work tree's `.git`
            // file, wherever that is (git writes `/work/tree/.git`); nothing
            // is loaded through it. Another value would only steer `git
            // worktree repair` or `prune`.
            (ControlFile::Gitdir, _) => match read_regular(parent, name, MAX_CONTROL_FILE) {
                Ok(Some(contents)) if contents.iter().all(u8::is_ascii_whitespace) => {
                    self.seal_current(root, rel, parent, name, cause, out)
                }
                Ok(Some(contents)) => {
                    let text = String::from_utf8_lossy(&contents);
                    let value = text.trim_end_matches(['\n', '\r']);
                    let location = ConfigLocation { workspace_abs: &self.roots[root].path, git_dir };
                    if !classify::back_link_ok(&text) && config_filter::workspace_relative(value, location).is_none() {
                        self.quarantine(root, rel, parent, name, &st, "a gitdir back-link that names no work tree's .git", cause, out)
                    } else {
                        self.seal_current(root, rel, parent, name, cause, out)
                    }
                }
                Ok(None) => {}
                Err(e) => self.error(root, rel, e, out),
            },
        }
    }

    /// Rewrites a config to the allowlist (the original goes to the
    /// quarantine), atomically and without losing a concurrent update: the
    /// filtered file is exchanged with the current one (`RENAME_EXCHANGE`),
    /// and if what came out is not the version that was read (git replaced
    /// the file meanwhile: `git clone` and `git config` write config.lock and
    /// rename it), the exchange is undone and the newer version filtered in
    /// turn. Every version that lands at the name is filtered, so a race
    /// the agent plays on purpose only loses the agent's own update.
    ///
    /// `developer`: the developer's own version of a gated repository
    /// config ([`GuardConfig::developer_configs`]); their entries are kept
    /// and the ones the sandbox removed put back.
    #[allow(clippy::too_many_arguments)] // verified fds and names, passed explicitly
    fn filter_config_file(
        &self,
        root: usize,
        git_dir: &Path,
        rel: &Path,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        st: &FileStat,
        developer: Option<&[u8]>,
        cause: Cause,
        out: &mut Out,
    ) {
        const ATTEMPTS: usize = 4;
        for attempt in 1..=ATTEMPTS {
            let (contents, version) = match read_regular_versioned(parent, name, MAX_CONTROL_FILE) {
                Ok(Some(read)) => read,
                Ok(None) => return,
                Err(MountError::Refused { .. }) => {
                    return self.quarantine(root, rel, parent, name, st, "a git config too large to filter", cause, out);
                }
                Err(e) => return self.error(root, rel, e, out),
            };
            let location = ConfigLocation { workspace_abs: &self.roots[root].path, git_dir };
            let filtered =
                config_filter::filter_config_against(&contents, developer.unwrap_or_default(), location, &|p| self.path_ok(root, p));
            if !filtered.changes(&contents) {
                return self.seal(root, rel, parent, name, st, &contents, &version, cause, out);
            }
            // The last attempt replaces whatever is there: filtered wins over
            // an update that keeps racing.
            let exchange = attempt < ATTEMPTS;
            self.note_taken((version.dev, version.ino));
            match replace_with(self.replacement(), rel, parent, name, &temp_name(), &filtered.text, exchange.then_some(&version)) {
                Ok(Replaced::Placed(filtered_version)) => {
                    if let Some(seals) = &self.seals {
                        seals.insert(filtered_version, root, rel);
                    }
                }
                Ok(Replaced::Gone) => return,
                Ok(Replaced::Newer) => continue,
                // Never left as the agent wrote it: the original goes (the
                // developer's version is put back by the next sweep).
                Err(e) => {
                    let reason = format!("a git config the guard could not filter ({e}): taken away whole");
                    return self.quarantine(root, rel, parent, name, st, &reason, cause, out);
                }
            }
            let reason = match (developer, filtered.restored.is_empty()) {
                (None, _) => "git config of a repository the sandbox made or changed: only allowlisted keys kept".to_owned(),
                (Some(_), true) => {
                    "the sandbox changed the developer's git config: their entries kept, the sandbox's allowlisted".to_owned()
                }
                (Some(_), false) => format!(
                    "the sandbox changed the developer's git config: their entries kept (put back: {}), the sandbox's allowlisted",
                    filtered.restored.join(", ")
                ),
            };
            let reason = reason.as_str();
            let id = match self.quarantine.keep_copy(&self.roots[root].label, rel, st, &contents, reason) {
                Ok(id) => id,
                Err(e) => return self.error(root, rel, format!("filtered, but the original could not be kept: {e}"), out),
            };
            let mut dropped = filtered.dropped;
            if filtered.skipped_lines > 0 {
                dropped.push(format!("{} unreadable line(s)", filtered.skipped_lines));
            }
            return self.record(root, rel, Action::FilteredGitConfig { dropped_keys: dropped }, reason, Some(id), cause, out);
        }
    }

    /// A sweep judges a file of an operation git resumes
    /// ([`git_model::operation_verdict`]) when it changed during the run:
    /// `exec` steps become comments, a strategy or signing key that is not
    /// harmless goes to the quarantine, `sequencer/opts` is filtered (the
    /// original kept in the quarantine). Events leave it alone: the
    /// sandbox's own operation runs inside, and the state only matters
    /// once the host's git resumes it.
    fn neutralise_operation_file(
        &self,
        root: usize,
        rel: &Path,
        file: OperationFile,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        st: &FileStat,
        cause: Cause,
        out: &mut Out,
    ) {
        if cause.pid.is_some() || !self.changed_in_run(st) {
            return;
        }
        let (contents, version) = match read_regular_versioned(parent, name, MAX_CONTROL_FILE) {
            Ok(Some(read)) => read,
            Ok(None) => return,
            Err(MountError::Refused { .. }) => {
                return self.quarantine(root, rel, parent, name, st, "operation state too large to check", cause, out);
            }
            Err(e) => return self.error(root, rel, e, out),
        };
        let (text, removed) = match git_model::operation_verdict(file, &contents) {
            Verdict::Keep => return,
            Verdict::Quarantine(reason) => return self.quarantine(root, rel, parent, name, st, reason, cause, out),
            Verdict::Rewrite { text, removed } => (text, removed),
        };
        self.note_taken((version.dev, version.ino));
        match replace_with((self.config.developer, 0o644), rel, parent, name, &temp_name(), &text, Some(&version)) {
            Ok(Replaced::Placed(_)) => {}
            Ok(Replaced::Gone) => return,
            Ok(Replaced::Newer) => return self.error(root, rel, "changed while it was checked; the next sweep checks it again", out),
            Err(e) => {
                let reason = format!("operation state the guard could not rewrite ({e}): taken away whole");
                return self.quarantine(root, rel, parent, name, st, &reason, cause, out);
            }
        }
        let (action, reason) = match file {
            OperationFile::Todo => (
                Action::DisabledRebaseExec { commands: removed },
                "exec steps of a rebase the sandbox left in progress: continuing it on the host would run them",
            ),
            _ => (
                Action::FilteredGitConfig { dropped_keys: removed },
                "options of a cherry-pick/revert the sandbox left in progress: continuing it on the host would run them",
            ),
        };
        match self.quarantine.keep_copy(&self.roots[root].label, rel, st, &contents, reason) {
            Ok(id) => self.record(root, rel, action, reason, Some(id), cause, out),
            Err(e) => self.error(root, rel, format!("neutralised, but the original could not be kept: {e}"), out),
        }
    }

    /// Moves an entry into the quarantine and records it.
    fn quarantine(
        &self,
        root: usize,
        rel: &Path,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        st: &FileStat,
        reason: &str,
        cause: Cause,
        out: &mut Out,
    ) {
        if safe_path::kind_of(st) == FileKind::Symlink && super::gate::is_redirecting_name(rel) && self.in_git_dir(root, rel) {
            self.note_taint(root, rel);
        }
        self.note_taken((st.st_dev, st.st_ino));
        match self.quarantine.take(&self.roots[root].label, rel, parent, name, st, reason) {
            Ok(id) => self.record(root, rel, Action::Quarantined, reason, Some(id), cause, out),
            // The quarantine cannot keep it (the Domain Root is full, say):
            // the property comes before the agent's file, which goes.
            Err(e) => match nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(now) if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) => {
                    match nix::unistd::unlinkat(parent, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
                        Ok(()) | Err(Errno::ENOENT) => {
                            let reason = format!("{reason} (deleted: the quarantine could not keep it: {e})");
                            self.record(root, rel, Action::Quarantined, reason, None, cause, out)
                        }
                        Err(errno) => self.error(root, rel, format!("{e}; and deleting it failed: {errno}"), out),
                    }
                }
                // Gone or replaced meanwhile: the new one has its own event.
                _ => self.error(root, rel, e, out),
            },
        }
    }

    /// Whether a workspace-relative path reached from a git value can be
    /// resolved without a symlink (missing paths are fine). The path and
    /// its ancestors are remembered when it can: the value is judged again
    /// if anything appears at one of them later.
    fn path_ok(&self, root: usize, rel: &Path) -> bool {
        let ok = !matches!(safe_path::open_path_beneath(self.roots[root].fd.as_fd(), rel), Err(MountError::Refused { .. }));
        if ok {
            let mut depended = self.depended.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for path in rel.ancestors().filter(|p| !p.as_os_str().is_empty()) {
                if depended.paths.len() >= MAX_DEPENDED_PATHS {
                    depended.full = true;
                    break;
                }
                depended.paths.insert((root, path.to_owned()));
            }
        }
        ok
    }

    /// Whether a kept git value goes through `rel` (see [`DependedPaths`]).
    pub(crate) fn is_depended_on(&self, root: usize, rel: &Path) -> bool {
        let depended = self.depended.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        depended.full || depended.paths.contains(&(root, rel.to_owned()))
    }

    /// The verified parent directory, name and lstat of `rel`; `None` if it
    /// does not exist (errors are recorded).
    fn lstat<'a>(&self, root: usize, rel: &'a Path, out: &mut Out) -> Option<(OwnedFd, &'a OsStr, FileStat)> {
        let name = rel.file_name()?;
        let parent = match self.open_dir(root, rel.parent().unwrap_or(Path::new(""))) {
            Ok(fd) => fd,
            Err(MountError::Syscall { errno: Errno::ENOENT | Errno::ENOTDIR, .. }) => return None,
            // A symlink on the way (`objects -> ../store/objects`): what git
            // reaches through it is judged at its own path in the root, and
            // a symlink in a git dir leading out of the root is quarantined
            // itself; the guard never follows one.
            Err(MountError::Refused { .. }) => return None,
            Err(e) => {
                self.error(root, rel, e, out);
                return None;
            }
        };
        match nix::sys::stat::fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Some((parent, name, st)),
            Err(Errno::ENOENT) => None,
            Err(errno) => {
                self.error(root, rel, MountError::sys("stat", rel, errno), out);
                None
            }
        }
    }
}

/// A name for the guard's temporary file beside a file it replaces that
/// the agent, who can create files in that directory, cannot guess and
/// create first (which would make the replacement fail): a serial hashed
/// with `RandomState`, whose keys come from the system's random source.
fn temp_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    format!("{TEMP_PREFIX}{:016x}", hasher.finish())
}

/// How the guard's temporary files are named: a replacement before it is
/// renamed into place, or what an exchange took out of place.
pub(crate) const TEMP_PREFIX: &str = ".lazaret-guard-";

/// Puts `text` at `name` through the new file `temp`. With `expected`,
/// the two are exchanged and the exchange is undone (returning false)
/// unless what came out is still that version; a filesystem without
/// `RENAME_EXCHANGE` gets a plain rename.
fn replace_with(
    (owner, mode): (super::Owner, u32),
    rel: &Path,
    parent: BorrowedFd<'_>,
    name: &OsStr,
    temp: &str,
    text: &[u8],
    expected: Option<&FileVersion>,
) -> Result<Replaced, MountError> {
    let unlink_temp = || {
        let _ = nix::unistd::unlinkat(parent, temp, nix::unistd::UnlinkatFlags::NoRemoveDir);
    };
    // A name that exists is someone else's file: not ours to remove.
    let fd = nix::fcntl::openat(
        parent,
        temp,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map_err(|e| MountError::sys("create", rel, e))?;
    let _ = nix::unistd::fchown(&fd, Some(Uid::from_raw(owner.uid)), Some(Gid::from_raw(owner.gid)));
    // The umask may have narrowed it; a sealed file must have exactly this.
    let _ = nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(mode));
    // Which file is ours, from the fd: what is at `name` after the rename
    // may already be someone else's.
    let placed = match nix::sys::stat::fstat(&fd) {
        Ok(st) => Replaced::Placed(FileVersion::of(&st)),
        Err(e) => {
            unlink_temp();
            return Err(MountError::sys("fstat", rel, e));
        }
    };
    if let Err(e) = std::io::Write::write_all(&mut std::fs::File::from(fd), text) {
        unlink_temp();
        return Err(MountError::io("write", rel, e));
    }
    let exchange = |from: &str| nix::fcntl::renameat2(parent, from, parent, name, nix::fcntl::RenameFlags::RENAME_EXCHANGE);
    let plain_rename = || {
        nix::fcntl::renameat(parent, temp, parent, name).map(|()| placed).map_err(|e| {
            unlink_temp();
            MountError::sys("rename", rel, e)
        })
    };
    let Some(expected) = expected else { return plain_rename() };
    match exchange(temp) {
        Ok(()) => {}
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => return plain_rename(),
        Err(Errno::ENOENT) => {
            // The file went away meanwhile: nothing to replace.
            unlink_temp();
            return Ok(Replaced::Gone);
        }
        Err(e) => {
            unlink_temp();
            return Err(MountError::sys("rename", rel, e));
        }
    }
    let swapped_out = nix::sys::stat::fstatat(parent, temp, AtFlags::AT_SYMLINK_NOFOLLOW).ok();
    if swapped_out.is_some_and(|st| FileVersion::of(&st) == *expected) {
        unlink_temp();
        return Ok(placed);
    }
    // A newer version came out: put it back and filter that instead.
    let undone = exchange(temp);
    unlink_temp();
    undone.map(|()| Replaced::Newer).map_err(|e| MountError::sys("rename", rel, e))
}

/// What [`replace_with`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replaced {
    /// The new file (this version of it) is at the name.
    Placed(FileVersion),
    /// Nothing was at the name any more: nothing placed.
    Gone,
    /// Another version than the expected one was there: left in place.
    Newer,
}

/// Reads the regular file `name` of `dir` (never through a symlink; at
/// most `limit` bytes, more is a `Refused` error). `None` if it is gone or
/// not a regular file.
pub(crate) fn read_regular(dir: BorrowedFd<'_>, name: &OsStr, limit: u64) -> Result<Option<Vec<u8>>, MountError> {
    Ok(read_regular_versioned(dir, name, limit)?.map(|(contents, _)| contents))
}

/// Which version of a file was read: its inode, size and modification
/// time (not its ctime, which a rename changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileVersion {
    dev: u64,
    ino: u64,
    size: i64,
    mtime: (i64, i64),
}

impl FileVersion {
    fn of(st: &FileStat) -> FileVersion {
        FileVersion { dev: st.st_dev, ino: st.st_ino, size: st.st_size, mtime: (st.st_mtime, st.st_mtime_nsec) }
    }
}

/// [`read_regular`], with the version of the file the bytes came from.
fn read_regular_versioned(dir: BorrowedFd<'_>, name: &OsStr, limit: u64) -> Result<Option<(Vec<u8>, FileVersion)>, MountError> {
    let fd = match nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ELOOP) => return Ok(None),
        Err(errno) => return Err(MountError::sys("open", Path::new(name), errno)),
    };
    let st = nix::sys::stat::fstat(&fd).map_err(|e| MountError::sys("fstat", Path::new(name), e))?;
    if st.st_mode & SFlag::S_IFMT.bits() != SFlag::S_IFREG.bits() {
        return Ok(None);
    }
    let mut contents = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::from(fd), limit + 1), &mut contents)
        .map_err(|e| MountError::io("read", Path::new(name), e))?;
    if contents.len() as u64 > limit {
        return Err(MountError::refused(Path::new(name), "too large"));
    }
    Ok(Some((contents, FileVersion::of(&st))))
}

/// The names in a directory (without `.` and `..`); empty on error.
pub(crate) fn list_names(dir: OwnedFd) -> Vec<std::ffi::OsString> {
    let Ok(dir) = nix::dir::Dir::from_fd(dir) else { return Vec::new() };
    dir.into_iter()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_bytes();
            (name != b"." && name != b"..").then(|| OsStr::from_bytes(name).to_owned())
        })
        .collect()
}

/// Whether the directory `rel` beneath `root` is a git directory by the
/// model ([`GitDirMarks`]: named `.git`, or `HEAD` and `commondir`, or
/// `objects` and `refs`, entries of any type); no symlink is followed.
pub(crate) fn is_git_dir_at(root: BorrowedFd<'_>, rel: &Path) -> bool {
    let Ok(dir) = safe_path::open_beneath(root, rel, OFlag::O_PATH | OFlag::O_DIRECTORY) else { return false };
    if classify::is_dot_git(rel) {
        return true;
    }
    let mut marks = GitDirMarks::default();
    for name in ["HEAD", "commondir", "objects", "refs"] {
        if nix::sys::stat::fstatat(&dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
            marks.note(name.as_bytes());
        }
    }
    marks.is_git_dir()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> super::super::Owner {
        super::super::Owner { uid: nix::unistd::geteuid().as_raw(), gid: nix::unistd::getegid().as_raw() }
    }

    #[test]
    fn a_config_replaced_while_it_was_filtered_is_not_overwritten() {
        // What `git clone` does: config written, read by the guard, then
        // replaced by git's next config.lock rename before the guard writes.
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("config"), b"[core]\n\tfsmonitor = x\n").expect("write");
        let parent = nix::fcntl::open(dir.path(), OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()).expect("open");
        let name = OsStr::new("config");
        let (_, first) = read_regular_versioned(parent.as_fd(), name, 1 << 20).expect("read").expect("regular");
        std::fs::write(dir.path().join("config.lock"), b"[core]\n\tfsmonitor = x\n[remote \"origin\"]\n\turl = /src\n").expect("write");
        std::fs::rename(dir.path().join("config.lock"), dir.path().join("config")).expect("rename");
        let replaced =
            replace_with((owner(), 0o644), Path::new("config"), parent.as_fd(), name, ".t1", b"[core]\n", Some(&first)).expect("replace");
        assert_eq!(replaced, Replaced::Newer, "the exchange is undone");
        let now = std::fs::read_to_string(dir.path().join("config")).expect("read");
        assert!(now.contains("url = /src"), "git's update is still there: {now}");
        // The version now there is filtered in turn.
        let (_, second) = read_regular_versioned(parent.as_fd(), name, 1 << 20).expect("read").expect("regular");
        let placed =
            replace_with((owner(), 0o644), Path::new("config"), parent.as_fd(), name, ".t2", b"[core]\n", Some(&second)).expect("replace");
        let Replaced::Placed(new_file) = placed else { panic!("not placed: {placed:?}") };
        let now = nix::sys::stat::stat(&dir.path().join("config")).expect("stat");
        assert_eq!((new_file.dev, new_file.ino), (now.st_dev, now.st_ino), "the placed file is the one now at the name");
        assert_eq!(std::fs::read(dir.path().join("config")).expect("read"), b"[core]\n");
        let names: Vec<_> = std::fs::read_dir(dir.path()).expect("list").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, ["config"], "no temporary file left");
    }
}
