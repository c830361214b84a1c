//! Locating a repository's git directories from inside a hostile workspace.
//!
//! A `.git` directory is used in place. A `.git` *file* (`gitdir: PATH`, used
//! by submodules and linked worktrees) is followed only when its target is
//! inside the workspace, or, when it is outside, only if it is a genuine
//! linked worktree: the target's own `gitdir` back-link (written by `git
//! worktree add`, outside the workspace and so out of the agent's reach)
//! names exactly this workspace's `.git` file. Anything else is refused.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use crate::error::MountError;
use crate::gitconfig::GitConfig;
use crate::safe_path::{self, FileKind};

/// Largest config / pointer file Lazaret reads (git's own files are tiny).
pub(crate) const SMALL_FILE_LIMIT: u64 = 1 << 20;

/// Where a git directory lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GitDirPath {
    /// Inside the workspace, relative to the workspace root.
    Inside(PathBuf),
    /// Outside the workspace (a validated linked worktree), absolute.
    Outside(PathBuf),
}

impl GitDirPath {
    /// Opens this directory (`O_PATH`) without following symlinks: relative
    /// to the workspace when inside, relative to `/` when outside.
    pub fn open(&self, workspace: BorrowedFd<'_>) -> Result<OwnedFd, MountError> {
        match self {
            GitDirPath::Inside(rel) => safe_path::open_dir_beneath(workspace, rel),
            GitDirPath::Outside(abs) => open_absolute_dir(abs),
        }
    }

    /// The path itself (workspace-relative or absolute), for messages.
    pub fn display_path(&self) -> &Path {
        match self {
            GitDirPath::Inside(p) | GitDirPath::Outside(p) => p,
        }
    }

    /// Reads the small regular file `name` in this directory (`None` if
    /// missing); errors name the full path.
    pub fn read_file(&self, workspace: BorrowedFd<'_>, name: &str) -> Result<Option<Vec<u8>>, MountError> {
        let dir = self.open(workspace)?;
        safe_path::read_beneath(dir.as_fd(), Path::new(name), SMALL_FILE_LIMIT)
            .map_err(|e| safe_path::rename_error_path(e, &self.display_path().join(name)))
    }

    /// The path of `name` inside this directory (for messages and plans).
    pub fn join(&self, name: impl AsRef<Path>) -> GitDirPath {
        match self {
            GitDirPath::Inside(p) => GitDirPath::Inside(p.join(name)),
            GitDirPath::Outside(p) => GitDirPath::Outside(p.join(name)),
        }
    }
}

/// A repository found at some directory of the workspace.
#[derive(Debug, Clone)]
pub struct RepoLocation {
    /// The work tree root, relative to the workspace root ("" = workspace).
    pub worktree: PathBuf,
    /// The per-worktree git directory (`$GIT_DIR`).
    pub git_dir: GitDirPath,
    /// The common directory (`$GIT_COMMON_DIR`; same as `git_dir` unless
    /// this is a linked worktree).
    pub common_dir: GitDirPath,
    /// True when the work tree's `.git` is a file (`gitdir:` indirection).
    pub dot_git_is_file: bool,
}

impl RepoLocation {
    /// The git directories of this repository outside the workspace (a
    /// linked worktree's common dir, and its gitdir unless that lies in the
    /// common dir): what the sandbox must see at their host paths.
    pub fn outside_git_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = Vec::new();
        if let GitDirPath::Outside(common) = &self.common_dir {
            dirs.push(common.clone());
        }
        if let GitDirPath::Outside(dir) = &self.git_dir {
            if !dirs.iter().any(|common| dir.starts_with(common)) {
                dirs.push(dir.clone());
            }
        }
        dirs
    }
}

/// Opens an absolute host path (outside the workspace) as a directory,
/// refusing symlinks in any component.
pub(crate) fn open_absolute_dir(abs: &Path) -> Result<OwnedFd, MountError> {
    let root = safe_path::open_root_dir(Path::new("/"))?;
    let rel = abs.strip_prefix("/").map_err(|_| MountError::refused(abs, "expected an absolute path"))?;
    safe_path::open_dir_beneath(root.as_fd(), rel).map_err(|e| match e {
        MountError::Refused { reason, .. } => MountError::refused(abs, reason),
        other => other,
    })
}

/// Lexically normalises `path` (no filesystem access): removes `.`, applies
/// `..`. Returns `None` if `..` climbs above the start of a relative path.
pub(crate) fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::RootDir => out.push("/"),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(name) => out.push(name),
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// What a work tree's `.git` entry is, read by [`read_dot_git`].
#[derive(Debug)]
pub enum DotGit {
    /// There is no `.git` entry.
    Missing,
    /// A real directory (an ordinary repository's git dir), opened `O_PATH`.
    Directory(OwnedFd),
    /// A regular file `gitdir: TARGET` (linked worktree or submodule);
    /// TARGET as git reads it ([`gitfile_target`]), not yet resolved or
    /// validated (that is [`locate`]'s job).
    GitdirFile(String),
    /// An entry no caller may use.
    Invalid(DotGitProblem),
}

/// Why a `.git` entry is unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotGitProblem {
    /// A symlink (never followed: the git dir it reaches could not be
    /// protected).
    Symlink,
    /// A regular file that is not `gitdir: PATH` as git reads it (or whose
    /// PATH holds a control character).
    NotGitdirFile,
    /// Neither a directory, a regular file nor a symlink (fifo, socket,
    /// device).
    NotFileOrDirectory,
}

/// The target of a `gitdir:` file, read as git reads it (`setup.c`:
/// `read_gitfile_gently`): the file starts with `gitdir: ` (one space), the
/// trailing `\n`s and `\r`s of the whole file are dropped and the target is
/// the rest up to a NUL, nothing trimmed. So a second line is part of the
/// path git takes (`gitdir: d\n/../../x`), not something after it. `None`
/// when git would refuse the file, and also when the target is not UTF-8 or
/// holds a control character: no git writes such a path, and judging it
/// would mean judging the path git takes, newline included; refusing it is
/// simpler and safe.
pub fn gitfile_target(contents: &[u8]) -> Option<&str> {
    let mut end = contents.len();
    while end > 0 && matches!(contents[end - 1], b'\n' | b'\r') {
        end -= 1;
    }
    let rest = contents[..end].strip_prefix(b"gitdir: ")?;
    let target = rest.split(|&b| b == 0).next().unwrap_or(rest);
    let target = std::str::from_utf8(target).ok()?;
    if target.is_empty() || target.chars().any(char::is_control) {
        return None;
    }
    Some(target)
}

/// Reads the `.git` entry of `worktree` (relative to `dir`) fd-relatively,
/// without following symlinks anywhere: the one place that decides what a
/// `.git` directory or `gitdir:` file is. Callers word the refusal of
/// [`DotGit::Invalid`] for their audience.
pub fn read_dot_git(dir: BorrowedFd<'_>, worktree: &Path) -> Result<DotGit, MountError> {
    let dot_git = worktree.join(".git");
    let Some(fd) = safe_path::open_path_beneath(dir, &dot_git)? else {
        return Ok(DotGit::Missing);
    };
    Ok(match safe_path::file_kind(fd.as_fd())? {
        FileKind::Directory => DotGit::Directory(fd),
        FileKind::Symlink => DotGit::Invalid(DotGitProblem::Symlink),
        FileKind::Regular => {
            let contents = safe_path::read_beneath(dir, &dot_git, SMALL_FILE_LIMIT)?.unwrap_or_default();
            match gitfile_target(&contents) {
                Some(target) => DotGit::GitdirFile(target.to_string()),
                None => DotGit::Invalid(DotGitProblem::NotGitdirFile),
            }
        }
        FileKind::Other => DotGit::Invalid(DotGitProblem::NotFileOrDirectory),
    })
}

/// Finds the repository whose work tree is `worktree` (relative to the
/// workspace), if `worktree/.git` exists. `workspace_abs` is the canonical
/// absolute workspace path (to interpret absolute `gitdir:` values).
pub fn locate(workspace: BorrowedFd<'_>, workspace_abs: &Path, worktree: &Path) -> Result<Option<RepoLocation>, MountError> {
    let dot_git = worktree.join(".git");
    match read_dot_git(workspace, worktree)? {
        DotGit::Missing => Ok(None),
        DotGit::Directory(_) => {
            // git honours `$GIT_DIR/commondir` in any git dir, also in a main
            // repository's `.git` (where `git` never writes one): followed
            // when it stays inside the workspace (Git Sentry then protects
            // the directory it names), refused when it leaves it.
            let git_dir = GitDirPath::Inside(dot_git);
            let common_dir = common_dir_of(workspace, workspace_abs, &git_dir)?;
            Ok(Some(RepoLocation { worktree: worktree.to_owned(), common_dir, git_dir, dot_git_is_file: false }))
        }
        DotGit::GitdirFile(target) => {
            let git_dir = resolve_gitdir_pointer(workspace_abs, worktree, Path::new(&target))
                .ok_or_else(|| MountError::refused(&dot_git, format!("cannot resolve gitdir {target:?}")))?;
            if let GitDirPath::Outside(abs) = &git_dir {
                validate_linked_worktree(abs, &workspace_abs.join(&dot_git))?;
            }
            let common_dir = common_dir_of(workspace, workspace_abs, &git_dir)?;
            Ok(Some(RepoLocation { worktree: worktree.to_owned(), git_dir, common_dir, dot_git_is_file: true }))
        }
        DotGit::Invalid(DotGitProblem::Symlink) => Err(MountError::refused(
            &dot_git,
            "the .git entry is a symlink; Lazaret cannot protect a git directory reached through a symlink (replace it with the real directory or a `gitdir:` file)",
        )),
        DotGit::Invalid(DotGitProblem::NotGitdirFile) => Err(MountError::refused(&dot_git, "a .git file must start with `gitdir: PATH`")),
        DotGit::Invalid(DotGitProblem::NotFileOrDirectory) => {
            Err(MountError::refused(&dot_git, "the .git entry is neither a directory nor a file"))
        }
    }
}

/// Turns a `gitdir:` value into a path inside or outside the workspace.
fn resolve_gitdir_pointer(workspace_abs: &Path, worktree: &Path, target: &Path) -> Option<GitDirPath> {
    let absolute = if target.is_absolute() { normalize(target)? } else { normalize(&workspace_abs.join(worktree).join(target))? };
    match absolute.strip_prefix(workspace_abs) {
        Ok(rel) => Some(GitDirPath::Inside(rel.to_owned())),
        Err(_) => Some(GitDirPath::Outside(absolute)),
    }
}

/// A git directory outside the workspace is accepted only if its `gitdir`
/// back-link names our `.git` file, as `git worktree add` writes it.
fn validate_linked_worktree(git_dir: &Path, dot_git_abs: &Path) -> Result<(), MountError> {
    let dir = open_absolute_dir(git_dir)?;
    let back = safe_path::read_beneath(dir.as_fd(), Path::new("gitdir"), SMALL_FILE_LIMIT)?
        .ok_or_else(|| {
            MountError::refused(
                git_dir,
                "points outside the workspace but is not a linked worktree directory (no `gitdir` back-link); a submodule's git directory lives in its superproject: run Lazaret in the superproject's checkout instead",
            )
        })?;
    let back = String::from_utf8_lossy(&back);
    if normalize(Path::new(back.trim())).as_deref() != Some(dot_git_abs) {
        return Err(MountError::refused(
            git_dir,
            format!(
                "its `gitdir` back-link names {:?}, not this workspace's {}; refusing to mount a git directory the workspace merely points at",
                back.trim(),
                lazaret_protocol::display::escaped(dot_git_abs)
            ),
        ));
    }
    Ok(())
}

/// `$GIT_COMMON_DIR`: the `commondir` file of a git dir (linked worktrees),
/// else the git dir itself.
pub(crate) fn common_dir_of(workspace: BorrowedFd<'_>, workspace_abs: &Path, git_dir: &GitDirPath) -> Result<GitDirPath, MountError> {
    let Some(raw) = git_dir.read_file(workspace, "commondir")? else {
        return Ok(git_dir.clone());
    };
    let combined = resolve_commondir(workspace_abs, git_dir, &raw)?;
    if let (GitDirPath::Inside(rel), GitDirPath::Outside(_)) = (git_dir, &combined) {
        return Err(MountError::refused(
            rel.join("commondir"),
            "commondir escapes the workspace: git would take config and hooks from a directory Lazaret can neither see nor validate; remove it",
        ));
    }
    // It must exist and be a real directory.
    combined.open(workspace).map_err(|e| match git_dir {
        GitDirPath::Inside(rel) => MountError::refused(rel.join("commondir"), format!("names a directory that cannot be used: {e}")),
        GitDirPath::Outside(_) => e,
    })?;
    Ok(combined)
}

/// Where the `commondir` file of `git_dir` (contents `raw`) points, as git
/// reads it (relative to `git_dir`). A git dir inside the workspace may only
/// point inside the workspace to be usable (callers refuse or ignore an
/// [`GitDirPath::Outside`] result for it); an outside one (a validated
/// linked worktree) anywhere.
pub(crate) fn resolve_commondir(workspace_abs: &Path, git_dir: &GitDirPath, raw: &[u8]) -> Result<GitDirPath, MountError> {
    let text = String::from_utf8_lossy(raw);
    let value = Path::new(text.trim_end_matches(['\n', '\r']));
    match git_dir {
        GitDirPath::Inside(rel) => {
            // `a/../b` would be resolved by git through `a` if it is a
            // symlink; only leading `..` (what `git worktree` writes) keeps
            // the lexical reading exact, as the git dir itself is real.
            let mut seen_name = false;
            for component in value.components() {
                match component {
                    Component::Normal(_) => seen_name = true,
                    Component::ParentDir if seen_name => {
                        return Err(MountError::refused(
                            rel.join("commondir"),
                            "commondir has `..` after a directory name; Lazaret cannot resolve it as git would without following symlinks",
                        ));
                    }
                    _ => {}
                }
            }
            let absolute = normalize(&workspace_abs.join(rel).join(value))
                .ok_or_else(|| MountError::refused(rel.join("commondir"), "invalid commondir"))?;
            match absolute.strip_prefix(workspace_abs) {
                Ok(inside) => Ok(GitDirPath::Inside(inside.to_owned())),
                Err(_) => Ok(GitDirPath::Outside(absolute)),
            }
        }
        GitDirPath::Outside(abs) => {
            let joined = normalize(&abs.join(value)).ok_or_else(|| MountError::refused(abs.join("commondir"), "invalid commondir"))?;
            Ok(GitDirPath::Outside(joined))
        }
    }
}

/// Reads the repository's effective config: `common_dir/config`, then
/// `git_dir/config.worktree` when `extensions.worktreeConfig` is set.
pub fn read_repo_config(workspace: BorrowedFd<'_>, repo: &RepoLocation) -> Result<GitConfig, MountError> {
    let mut config = GitConfig::parse(&repo.common_dir.read_file(workspace, "config")?.unwrap_or_default());
    if config.get_bool("extensions", "worktreeConfig") == Some(true) {
        if let Some(raw) = repo.git_dir.read_file(workspace, "config.worktree")? {
            config.merge(GitConfig::parse(&raw));
        }
    }
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gitdir_file_is_read_as_git_reads_it() {
        assert_eq!(gitfile_target(b"gitdir: ../x/.git/worktrees/a\n"), Some("../x/.git/worktrees/a"));
        assert_eq!(gitfile_target(b"gitdir: a b \r\n\n"), Some("a b "), "spaces are part of the path");
        // git takes the second line as part of the path: never judged as `d`.
        assert_eq!(gitfile_target(b"gitdir: d\n/../../../private/.git\n"), None);
        assert_eq!(gitfile_target(b"gitdir: d\0/ignored"), Some("d"), "the path ends at a NUL, as git's C string");
        assert_eq!(gitfile_target(b"gitdir: d\n\0x"), None);
        assert_eq!(gitfile_target(b"gitdir:d"), None, "git needs the space");
        assert_eq!(gitfile_target(b"gitdir: \n"), None);
        assert_eq!(gitfile_target(b" gitdir: d"), None);
    }

    #[test]
    fn read_dot_git_classifies_without_following_anything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let fd = safe_path::open_root_dir(root).expect("open");
        let read = |worktree: &str| read_dot_git(fd.as_fd(), Path::new(worktree)).expect("read");
        for (name, make) in [
            ("dir", (|p: &Path| std::fs::create_dir(p)) as fn(&Path) -> std::io::Result<()>),
            ("file", |p| std::fs::write(p, "gitdir: ../x/.git/worktrees/a\n")),
            ("two-lines", |p| std::fs::write(p, "gitdir: ../x/.git/worktrees/a\nrest\n")),
            ("empty-target", |p| std::fs::write(p, "gitdir:  \n")),
            ("stray", |p| std::fs::write(p, "not a gitdir")),
            ("link", |p| std::os::unix::fs::symlink("/", p)),
            ("fifo", |p| nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).map_err(Into::into)),
        ] {
            std::fs::create_dir(root.join(name)).expect("mkdir");
            make(&root.join(name).join(".git")).expect("make .git");
        }
        std::fs::create_dir(root.join("none")).expect("mkdir");
        assert!(matches!(read("dir"), DotGit::Directory(_)));
        assert!(matches!(read("file"), DotGit::GitdirFile(t) if t == "../x/.git/worktrees/a"));
        // git's path would be "../x/.git/worktrees/a\nrest": refused.
        assert!(matches!(read("two-lines"), DotGit::Invalid(DotGitProblem::NotGitdirFile)));
        // git takes this as the path " " (nothing is trimmed).
        assert!(matches!(read("empty-target"), DotGit::GitdirFile(t) if t == " "));
        assert!(matches!(read("stray"), DotGit::Invalid(DotGitProblem::NotGitdirFile)));
        assert!(matches!(read("link"), DotGit::Invalid(DotGitProblem::Symlink)));
        assert!(matches!(read("fifo"), DotGit::Invalid(DotGitProblem::NotFileOrDirectory)));
        assert!(matches!(read("none"), DotGit::Missing));
        // The work tree itself is resolved beneath `dir` too.
        std::os::unix::fs::symlink(root.join("dir"), root.join("via-link")).expect("symlink");
        assert!(read_dot_git(fd.as_fd(), Path::new("via-link")).is_err());
    }
}
