//! Git Sentry: the read-only protections over everything through which the
//! host's git would run code or change behaviour.
//!
//! For every repository visible in the sandbox (the workspace's own, nested
//! repositories, submodules under `.git/modules`, and the real git directory
//! of a linked worktree), protected read-only: `config`, `hooks/`,
//! `config.worktree` (per-worktree and common), `worktrees/*/commondir` and
//! `worktrees/*/config.worktree` (read by other linked worktrees), a work
//! tree's `.git` *file* (`gitdir:` pointer), and the `core.hooksPath`
//! directory when it lies inside the workspace. Every directory above a
//! protected path is pinned (see [`SentryPlan::pinned`]). Index, HEAD, refs, objects
//! and logs stay writable. Missing `hooks/` (and a missing
//! `config.worktree` when `extensions.worktreeConfig` is on, or a missing
//! in-workspace `core.hooksPath` directory) are created empty so that the
//! sandbox cannot plant them; a missing `config` is refused (git would not
//! work). A symlink at any of these paths is refused, naming it.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use crate::error::MountError;
use crate::gitconfig::GitConfig;
use crate::ignore_eval::HostGitSettings;
use crate::repo::{self, GitDirPath, RepoLocation};
use crate::safe_path::{self, FileKind};

/// Largest `.git/modules` nesting followed (module names may contain `/`).
const MAX_MODULE_DEPTH: usize = 8;

/// One path to present read-only in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtectedPath {
    /// Where it lives on the host.
    pub path: GitDirPath,
    /// Directory or regular file (binds are dir-over-dir, file-over-file).
    pub kind: FileKind,
}

/// Everything Git Sentry needs for one workspace.
#[derive(Debug, Clone, Default)]
pub struct SentryPlan {
    /// Read-only binds, in discovery order.
    pub protected: Vec<ProtectedPath>,
    /// Git directories outside the workspace (linked worktrees) that must be
    /// bound read-write at the same absolute path for the `gitdir:` file to
    /// work in the sandbox.
    pub outside_git_dirs: Vec<PathBuf>,
    /// Directories bound read-write onto themselves so that they become
    /// mount points, which the sandbox cannot rename or remove: every
    /// ancestor (below the workspace root, or below an outside git dir) of a
    /// protected path. Without this, `mv .git .git-old; mkdir .git` (or the
    /// same with `.git/modules/x` or a submodule's directory) would swap in
    /// an unprotected config that the host's git then runs. Sorted.
    pub pinned: Vec<GitDirPath>,
    /// Repositories found (for diagnostics).
    pub repositories: Vec<RepoLocation>,
}

impl SentryPlan {
    /// Recomputes [`SentryPlan::pinned`] from the protected paths.
    pub fn compute_pins(&mut self) {
        let protected: std::collections::HashSet<&GitDirPath> = self.protected.iter().map(|p| &p.path).collect();
        let mut pins = std::collections::BTreeSet::new();
        for entry in &self.protected {
            let (path, floor) = match &entry.path {
                GitDirPath::Inside(rel) => (rel.clone(), PathBuf::new()),
                GitDirPath::Outside(abs) => {
                    let Some(floor) = self.outside_git_dirs.iter().find(|d| abs.starts_with(d)) else { continue };
                    (abs.clone(), floor.clone())
                }
            };
            for ancestor in path.ancestors().skip(1) {
                if ancestor == floor || !ancestor.starts_with(&floor) || ancestor.as_os_str().is_empty() {
                    break;
                }
                let pin = match &entry.path {
                    GitDirPath::Inside(_) => GitDirPath::Inside(ancestor.to_owned()),
                    GitDirPath::Outside(_) => GitDirPath::Outside(ancestor.to_owned()),
                };
                if !protected.contains(&pin) {
                    pins.insert(pin);
                }
            }
        }
        self.pinned = pins.into_iter().collect();
    }
}

/// Discovers the Git Sentry paths for the repositories whose work trees are
/// `worktrees` (relative to the workspace; `""` is the workspace root).
/// Creates missing protectable entries as documented in the module docs.
pub fn discover(
    workspace: BorrowedFd<'_>,
    workspace_abs: &Path,
    worktrees: &[PathBuf],
    host: &HostGitSettings,
) -> Result<SentryPlan, MountError> {
    let mut plan = SentryPlan::default();
    let global = host.global_config();
    for worktree in worktrees {
        let Some(location) = repo::locate(workspace, workspace_abs, worktree)? else {
            continue;
        };
        protect_repository(workspace, workspace_abs, &location, host, &global, &mut plan)?;
        plan.repositories.push(location);
    }
    let mut seen = std::collections::HashSet::new();
    plan.protected.retain(|p| seen.insert(p.path.clone()));
    plan.outside_git_dirs.sort();
    plan.outside_git_dirs.dedup();
    plan.compute_pins();
    Ok(plan)
}

fn protect_repository(
    workspace: BorrowedFd<'_>,
    workspace_abs: &Path,
    location: &RepoLocation,
    host: &HostGitSettings,
    global: &GitConfig,
    plan: &mut SentryPlan,
) -> Result<(), MountError> {
    if let GitDirPath::Outside(dir) = &location.common_dir {
        plan.outside_git_dirs.push(dir.clone());
    }
    if let GitDirPath::Outside(dir) = &location.git_dir {
        if !matches!(&location.common_dir, GitDirPath::Outside(common) if dir.starts_with(common)) {
            plan.outside_git_dirs.push(dir.clone());
        }
    }
    if location.dot_git_is_file {
        // The `gitdir:` pointer itself: rewritten, it would send the host's
        // git to a config of the sandbox's choosing.
        plan.protected.push(ProtectedPath { path: GitDirPath::Inside(location.worktree.join(".git")), kind: FileKind::Regular });
    }
    let mut config = global.clone();
    config.merge(repo::read_repo_config(workspace, location)?);
    protect_git_dir(workspace, &location.common_dir, &config, true, plan)?;
    if location.git_dir != location.common_dir {
        protect_git_dir(workspace, &location.git_dir, &config, false, plan)?;
    }
    if let Some(hooks_path) = config.get("core", "hooksPath") {
        protect_hooks_path(workspace, workspace_abs, location, host, hooks_path, plan)?;
    }
    protect_linked_worktree_dirs(workspace, &location.common_dir, &config, plan)?;
    // Submodules' git directories.
    protect_modules(workspace, &location.common_dir.join("modules"), 0, global, plan)
}

/// Every `worktrees/<name>/` of a common dir belongs to a linked worktree
/// (possibly outside the workspace) whose git reads its `commondir` (which
/// redirects it to another config) and `config.worktree`: both read-only.
fn protect_linked_worktree_dirs(
    workspace: BorrowedFd<'_>,
    common_dir: &GitDirPath,
    config: &GitConfig,
    plan: &mut SentryPlan,
) -> Result<(), MountError> {
    let worktrees = common_dir.join("worktrees");
    let dir = match worktrees.open(workspace) {
        Ok(dir) => dir,
        Err(MountError::Syscall { errno: nix::errno::Errno::ENOENT, .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    for name in subdirectories(dir.as_fd(), &worktrees)? {
        let git_dir = worktrees.join(&name);
        let fd = git_dir.open(workspace)?;
        match existing_kind(fd.as_fd(), "commondir", &git_dir)? {
            Some(FileKind::Regular) => {
                plan.protected.push(ProtectedPath { path: git_dir.join("commondir"), kind: FileKind::Regular });
            }
            Some(_) => return Err(refused(&git_dir, "commondir", "must be a regular file")),
            None => {}
        }
        protect_git_dir(workspace, &git_dir, config, false, plan)?;
    }
    Ok(())
}

/// Protects `config`, `hooks/` and `config.worktree` of one git directory.
/// `is_common` says whether `config` and `hooks` live here.
fn protect_git_dir(
    workspace: BorrowedFd<'_>,
    git_dir: &GitDirPath,
    config: &GitConfig,
    is_common: bool,
    plan: &mut SentryPlan,
) -> Result<(), MountError> {
    let dir = git_dir.open(workspace)?;
    if is_common {
        match existing_kind(dir.as_fd(), "config", git_dir)? {
            Some(FileKind::Regular) => plan.protected.push(ProtectedPath { path: git_dir.join("config"), kind: FileKind::Regular }),
            Some(_) => return Err(refused(git_dir, "config", "must be a regular file")),
            None => {
                return Err(refused(
                    git_dir,
                    "config",
                    "is missing; git cannot work without it and Lazaret will not fabricate one (restore it, e.g. with `git init` in the repository)",
                ));
            }
        }
        match existing_kind(dir.as_fd(), "hooks", git_dir)? {
            Some(FileKind::Directory) => {}
            Some(_) => return Err(refused(git_dir, "hooks", "must be a directory")),
            None => {
                safe_path::ensure_dir_beneath(dir.as_fd(), Path::new("hooks"))?;
            }
        }
        plan.protected.push(ProtectedPath { path: git_dir.join("hooks"), kind: FileKind::Directory });
    }
    match existing_kind(dir.as_fd(), "config.worktree", git_dir)? {
        Some(FileKind::Regular) => {
            plan.protected.push(ProtectedPath { path: git_dir.join("config.worktree"), kind: FileKind::Regular });
        }
        Some(_) => return Err(refused(git_dir, "config.worktree", "must be a regular file")),
        None if config.get_bool("extensions", "worktreeConfig") == Some(true) => {
            safe_path::ensure_file_beneath(dir.as_fd(), Path::new("config.worktree"))?;
            plan.protected.push(ProtectedPath { path: git_dir.join("config.worktree"), kind: FileKind::Regular });
        }
        None => {}
    }
    Ok(())
}

/// The kind of `dir/name` if it exists; a symlink is refused.
fn existing_kind(dir: BorrowedFd<'_>, name: &str, git_dir: &GitDirPath) -> Result<Option<FileKind>, MountError> {
    let Some(fd) = safe_path::open_path_beneath(dir, Path::new(name))? else {
        return Ok(None);
    };
    match safe_path::file_kind(fd.as_fd())? {
        FileKind::Symlink => Err(refused(
            git_dir,
            name,
            "is a symlink; Git Sentry cannot protect it (replace it with the real file or directory)",
        )),
        kind => Ok(Some(kind)),
    }
}

fn refused(git_dir: &GitDirPath, name: &str, reason: &str) -> MountError {
    let path = match git_dir.join(name) {
        GitDirPath::Inside(p) | GitDirPath::Outside(p) => p,
    };
    MountError::refused(path, reason)
}

/// `core.hooksPath`: protected when inside the workspace (created empty if
/// missing); outside the workspace it is not visible in the sandbox.
fn protect_hooks_path(
    workspace: BorrowedFd<'_>,
    workspace_abs: &Path,
    location: &RepoLocation,
    host: &HostGitSettings,
    value: &str,
    plan: &mut SentryPlan,
) -> Result<(), MountError> {
    let raw = Path::new(value);
    let absolute = if let Some(rest) = value.strip_prefix("~/") {
        // Home-relative: outside the workspace unless the workspace is in it.
        host.home.as_ref().map(|h| h.join(rest))
    } else if raw.is_absolute() {
        Some(raw.to_owned())
    } else {
        Some(workspace_abs.join(&location.worktree).join(raw))
    };
    let Some(absolute) = absolute.and_then(|p| repo::normalize(&p)) else {
        return Ok(());
    };
    let Ok(rel) = absolute.strip_prefix(workspace_abs) else {
        return Ok(());
    };
    let rel = rel.to_owned();
    match safe_path::open_path_beneath(workspace, &rel)? {
        Some(fd) => match safe_path::file_kind(fd.as_fd())? {
            FileKind::Directory => {}
            FileKind::Symlink => {
                return Err(MountError::refused(&rel, "core.hooksPath points at a symlink; Git Sentry cannot protect it"));
            }
            _ => return Err(MountError::refused(&rel, "core.hooksPath must be a directory")),
        },
        None => {
            safe_path::ensure_dir_beneath(workspace, &rel)?;
        }
    }
    plan.protected.push(ProtectedPath { path: GitDirPath::Inside(rel), kind: FileKind::Directory });
    Ok(())
}

/// Walks `modules/` for submodule git directories (a directory holding a
/// `HEAD` file), protecting each and recursing into their own `modules/`.
fn protect_modules(
    workspace: BorrowedFd<'_>,
    modules: &GitDirPath,
    depth: usize,
    global: &GitConfig,
    plan: &mut SentryPlan,
) -> Result<(), MountError> {
    if depth > MAX_MODULE_DEPTH {
        return Ok(());
    }
    let dir = match modules.open(workspace) {
        Ok(dir) => dir,
        Err(MountError::Syscall { errno: nix::errno::Errno::ENOENT, .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    for name in subdirectories(dir.as_fd(), modules)? {
        let child = modules.join(&name);
        let child_fd = child.open(workspace)?;
        if safe_path::open_path_beneath(child_fd.as_fd(), Path::new("HEAD"))?.is_some() {
            let mut config = global.clone();
            if let Some(raw) = safe_path::read_beneath(child_fd.as_fd(), Path::new("config"), repo::SMALL_FILE_LIMIT)? {
                config.merge(GitConfig::parse(&raw));
            }
            protect_git_dir(workspace, &child, &config, true, plan)?;
            protect_modules(workspace, &child.join("modules"), depth + 1, global, plan)?;
        } else {
            protect_modules(workspace, &child, depth + 1, global, plan)?;
        }
    }
    Ok(())
}

/// Names of the real (non-symlink) subdirectories of a directory; a symlink
/// among them is refused (a module directory must be real).
fn subdirectories(dir: BorrowedFd<'_>, at: &GitDirPath) -> Result<Vec<PathBuf>, MountError> {
    let label = match at {
        GitDirPath::Inside(p) | GitDirPath::Outside(p) => p.clone(),
    };
    let fd = safe_path::open_beneath(dir, Path::new(""), nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY)?;
    let mut listing = nix::dir::Dir::from_fd(fd).map_err(|e| MountError::sys("opendir", &label, e))?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| MountError::sys("readdir", &label, e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name));
        let child = safe_path::open_path_beneath(dir, &name)?;
        let Some(child) = child else { continue };
        match safe_path::file_kind(child.as_fd())? {
            FileKind::Directory => names.push(name),
            FileKind::Symlink => {
                return Err(MountError::refused(label.join(&name), "a symlink inside .git/modules cannot be protected; remove it"));
            }
            _ => {}
        }
    }
    names.sort();
    Ok(names)
}
