//! The full sweep: every root walked fd-relatively (directories opened
//! `O_NOFOLLOW` relative to their parent, so no symlink is ever entered),
//! the same neutralisation applied as for events, without pids.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;

use super::git_model::GitDirMarks;
use super::neutralise::{Cause, Engine, Out, list_names};
use super::{GuardConfig, GuardError, SweepReport};
use crate::safe_path::{self, FileKind};

/// Deepest directory nesting walked (a deeper tree is reported as an error
/// and not walked further).
const MAX_DEPTH: usize = 1024;

/// Walks every root of `config` (symlink-safe: directories are entered
/// fd-relatively and never through a symlink) and neutralises what needs
/// it: privilege bits and foreign ownership on everything changed since
/// [`GuardConfig::changed_since`], and the control files of every
/// repository of the workspace root that Git Sentry does not protect.
/// Does not depend on pids; call it at session end, Domain stop and guard
/// restart.
pub fn sweep(config: &GuardConfig) -> Result<SweepReport, GuardError> {
    sweep_sharing(config, None)
}

/// [`sweep`] with a stopped guard's seals (what it sealed, and the
/// developer's writes it saw).
pub(crate) fn sweep_sharing(
    config: &GuardConfig,
    seals: Option<std::sync::Arc<super::neutralise::Seals>>,
) -> Result<SweepReport, GuardError> {
    let mut engine = Engine::open(config.clone())?;
    engine.seals = seals;
    Ok(sweep_engine(&engine))
}

/// [`sweep`] with an engine already open.
pub(crate) fn sweep_engine(engine: &Engine) -> SweepReport {
    let started = Instant::now();
    let mut out = Out::default();
    let mut seen = 0;
    for root in 0..engine.roots.len() {
        seen += walk(engine, root, Path::new(""), false, &mut out);
    }
    engine.restore_missing_developer_configs(&mut out);
    SweepReport { neutralised: out.neutralised, errors: out.errors, entries_seen: seen, duration: started.elapsed() }
}

/// Walks the subtree `start` (a directory, relative to root `root`):
/// everything below it, and `start`'s own git checks. Returns the number
/// of entries seen. `every_file` ignores [`GuardConfig::changed_since`] (a
/// directory renamed in keeps its entries' old ctimes).
pub(crate) fn walk(engine: &Engine, root: usize, start: &Path, every_file: bool, out: &mut Out) -> u64 {
    let cause = Cause { pid: None, every_file, still_open: None };
    let git_control = engine.roots[root].kind.has_git_control();
    let mut seen = 0;
    // Paths, not fds, wait on the stack (a wide tree would exhaust fds);
    // each is reopened from the root fd, refusing symlinks on the way.
    let mut stack: Vec<(PathBuf, usize)> = vec![(start.to_owned(), 0)];
    while let Some((rel, depth)) = stack.pop() {
        if engine.protected(root, &rel) {
            continue;
        }
        let dir: OwnedFd = match safe_path::open_beneath(engine.roots[root].fd.as_fd(), &rel, OFlag::O_RDONLY | OFlag::O_DIRECTORY) {
            Ok(fd) => fd,
            Err(crate::error::MountError::Syscall { errno: Errno::ENOENT, .. }) => continue,
            Err(e) => {
                out.errors.push(format!("{}:{}: {e}", engine.roots[root].label, lazaret_protocol::display::escaped(&rel)));
                continue;
            }
        };
        let names = match nix::fcntl::openat(&dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()) {
            Ok(listing) => list_names(listing),
            Err(errno) => {
                out.errors.push(format!("{}:{}: list: {errno}", engine.roots[root].label, lazaret_protocol::display::escaped(&rel)));
                continue;
            }
        };
        let mut marks = GitDirMarks::default();
        for name in &names {
            seen += 1;
            let child = rel.join(name);
            // Marks of a git dir by name, of any type (git only `access`es
            // them), count even when Git Sentry protects the entry (a
            // registered worktree's gitdir has its `commondir` protected).
            marks.note(name.as_encoded_bytes());
            if engine.protected(root, &child) {
                continue;
            }
            let st = match nix::sys::stat::fstatat(&dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue,
                Err(errno) => {
                    out.errors.push(format!("{}:{}: stat: {errno}", engine.roots[root].label, lazaret_protocol::display::escaped(&child)));
                    continue;
                }
            };
            let kind = safe_path::kind_of(&st);
            if every_file || engine.changed_in_run(&st) {
                engine.fix_entry(root, &child, dir.as_fd(), name, &st, cause, out);
            }
            if git_control && name.as_encoded_bytes() == b".git" && kind != FileKind::Directory {
                engine.check_dot_git(root, &child, cause, out);
            }
            if git_control && kind != FileKind::Directory {
                engine.check_by_name(root, &child, cause, out);
            }
            if git_control && kind == FileKind::Symlink {
                engine.check_symlink_in_git_dir(root, &child, cause, out);
            }
            if kind == FileKind::Directory {
                if depth + 1 > MAX_DEPTH {
                    out.errors.push(format!(
                        "{}:{}: nested too deeply, not walked",
                        engine.roots[root].label,
                        lazaret_protocol::display::escaped(&child)
                    ));
                    continue;
                }
                stack.push((child, depth + 1));
            }
        }
        if git_control && (crate::guard::classify::is_dot_git(&rel) || marks.is_git_dir()) {
            engine.check_git_dir(root, &rel, cause, out);
        }
    }
    seen
}
