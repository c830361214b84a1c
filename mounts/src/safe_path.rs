//! Symlink-proof, fd-relative path resolution for attacker-controlled trees
//! (the workspace) and for Lazaret's own directories.
//!
//! Every lookup goes through `openat2(2)` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`: the kernel refuses any
//! symlink (in any component) and any escape from the starting directory,
//! atomically, so a tree that is changed concurrently cannot redirect us
//! outside it. Directories that must exist are created component by
//! component with `mkdirat` relative to the fd of their already verified
//! parent.

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

use crate::error::MountError;

/// The kind of file an fd refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FileKind {
    /// A directory.
    Directory,
    /// A regular file.
    Regular,
    /// A symbolic link (only seen when opened with `O_PATH | O_NOFOLLOW`).
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// How many times an `openat2` that failed with `EAGAIN` (a concurrent
/// rename elsewhere on the system) is retried before giving up.
const EAGAIN_RETRIES: usize = 64;

/// Checks that `rel` is a plain relative path: no root, no `..`, no `.` in
/// the middle. Returns it unchanged; an empty path means the root itself.
pub fn check_relative(rel: &Path) -> Result<&Path, MountError> {
    for component in rel.components() {
        match component {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return Err(MountError::refused(rel, "path contains '..'"));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(MountError::refused(rel, "path must be relative"));
            }
        }
    }
    Ok(rel)
}

/// Opens `rel` beneath `root` with `flags` (`O_CLOEXEC | O_NOFOLLOW` are
/// always added), refusing symlinks in every component and any escape from
/// `root`. An empty `rel` (or `.`) reopens `root` itself.
///
/// With `O_PATH`, a symlink as the *last* component is returned as an fd to
/// the link itself (check it with [`file_kind`]); without `O_PATH` it is an
/// error.
pub fn open_beneath(root: BorrowedFd<'_>, rel: &Path, flags: OFlag) -> Result<OwnedFd, MountError> {
    open_beneath_mode(root, rel, flags, Mode::empty())
}

/// [`open_beneath`] with the mode a file created by `O_CREAT` gets.
fn open_beneath_mode(root: BorrowedFd<'_>, rel: &Path, flags: OFlag, mode: Mode) -> Result<OwnedFd, MountError> {
    check_relative(rel)?;
    let target: &Path = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .mode(mode)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let mut attempts = 0;
    loop {
        match nix::fcntl::openat2(root, target, how) {
            Ok(fd) => return Ok(fd),
            Err(Errno::EAGAIN) if attempts < EAGAIN_RETRIES => attempts += 1,
            Err(errno) => return Err(resolution_error(rel, errno)),
        }
    }
}

/// Turns an `openat2` failure into an error that names the path and says why.
fn resolution_error(rel: &Path, errno: Errno) -> MountError {
    match errno {
        Errno::ELOOP => MountError::refused(
            rel,
            "a component is a symlink; Lazaret never follows symlinks inside the workspace (replace it with a real directory or file)",
        ),
        Errno::EXDEV => MountError::refused(rel, "path escapes the directory it must stay beneath"),
        Errno::ENOSYS => MountError::refused(rel, "this kernel lacks openat2(2) (Linux >= 5.6 needed) to resolve workspace paths safely"),
        errno => MountError::sys("openat2", rel, errno),
    }
}

/// Opens `rel` beneath `root` as an `O_PATH` fd without following anything;
/// returns `None` if it does not exist.
pub fn open_path_beneath(root: BorrowedFd<'_>, rel: &Path) -> Result<Option<OwnedFd>, MountError> {
    match open_beneath(root, rel, OFlag::O_PATH) {
        Ok(fd) => Ok(Some(fd)),
        Err(MountError::Syscall { errno: Errno::ENOENT, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens the directory `rel` beneath `root` (`O_PATH | O_DIRECTORY`).
pub fn open_dir_beneath(root: BorrowedFd<'_>, rel: &Path) -> Result<OwnedFd, MountError> {
    open_beneath(root, rel, OFlag::O_PATH | OFlag::O_DIRECTORY).map_err(|e| match e {
        MountError::Syscall { errno: Errno::ENOTDIR, .. } => MountError::refused(rel, "expected a directory"),
        e => e,
    })
}

/// `fstat` of an fd, as a [`FileKind`].
pub fn file_kind(fd: BorrowedFd<'_>) -> Result<FileKind, MountError> {
    Ok(kind_of(&stat(fd)?))
}

/// `fstat` of an fd (works on `O_PATH` fds).
pub fn stat(fd: BorrowedFd<'_>) -> Result<FileStat, MountError> {
    nix::sys::stat::fstat(fd).map_err(|e| MountError::sys("fstat", crate::sys::fd_path(fd), e))
}

/// The [`FileKind`] of a stat result.
pub fn kind_of(st: &FileStat) -> FileKind {
    match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => FileKind::Directory,
        SFlag::S_IFREG => FileKind::Regular,
        SFlag::S_IFLNK => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

/// Ensures the directory `rel` exists beneath `root`, creating missing
/// components with `mkdirat` relative to their verified parent (mode 0755,
/// owned like the parent so that a developer can remove a mount point Lazaret
/// made). Never follows a symlink: an existing symlink component is refused.
/// Returns an `O_PATH` fd of the directory.
pub fn ensure_dir_beneath(root: BorrowedFd<'_>, rel: &Path) -> Result<OwnedFd, MountError> {
    check_relative(rel)?;
    let mut current = open_dir_beneath(root, Path::new(""))?;
    let mut walked = PathBuf::new();
    for component in rel.components() {
        let Component::Normal(name) = component else { continue };
        walked.push(name);
        let next = match open_dir_beneath(current.as_fd(), Path::new(name)) {
            Ok(fd) => fd,
            Err(MountError::Syscall { errno: Errno::ENOENT, .. }) => {
                match nix::sys::stat::mkdirat(current.as_fd(), name, Mode::from_bits_truncate(0o755)) {
                    Ok(()) => {
                        let parent = stat(current.as_fd())?;
                        // Best effort: a root-owned empty dir in the developer's tree is
                        // still removable by them (removal needs rights on the parent).
                        let _ = nix::unistd::fchownat(
                            current.as_fd(),
                            name,
                            Some(nix::unistd::Uid::from_raw(parent.st_uid)),
                            Some(nix::unistd::Gid::from_raw(parent.st_gid)),
                            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                        );
                    }
                    // Lost a race with a concurrent creator: reopen below (which
                    // refuses it if it is a symlink).
                    Err(Errno::EEXIST) => {}
                    Err(errno) => return Err(MountError::sys("mkdirat", &walked, errno)),
                }
                open_dir_beneath(current.as_fd(), Path::new(name)).map_err(|e| rename_error_path(e, &walked))?
            }
            Err(e) => return Err(rename_error_path(e, &walked)),
        };
        current = next;
    }
    Ok(current)
}

/// Ensures an empty regular file exists at `rel` beneath `root` (its parent
/// must exist), created with `O_CREAT | O_EXCL` so nothing is followed, mode
/// 0644 and owned like its parent (as [`ensure_dir_beneath`] does), so that
/// the developer can still read a file Lazaret created in their tree (such
/// as a missing `.git/config.worktree`). Returns an `O_PATH` fd of the file.
pub fn ensure_file_beneath(root: BorrowedFd<'_>, rel: &Path) -> Result<OwnedFd, MountError> {
    match open_beneath_mode(
        root,
        rel,
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NONBLOCK,
        Mode::from_bits_truncate(0o644),
    ) {
        Ok(created) => {
            // Best effort, like ensure_dir_beneath: owned like the parent.
            let parent_rel = rel.parent().unwrap_or(Path::new(""));
            if let Ok(parent) = open_beneath(root, parent_rel, OFlag::O_PATH | OFlag::O_DIRECTORY) {
                if let Ok(st) = stat(parent.as_fd()) {
                    let _ = nix::unistd::fchown(
                        created.as_fd(),
                        Some(nix::unistd::Uid::from_raw(st.st_uid)),
                        Some(nix::unistd::Gid::from_raw(st.st_gid)),
                    );
                }
            }
        }
        Err(MountError::Syscall { errno: Errno::EEXIST, .. }) => {}
        Err(e) => return Err(e),
    }
    let fd = open_beneath(root, rel, OFlag::O_PATH)?;
    match file_kind(fd.as_fd())? {
        FileKind::Regular => Ok(fd),
        _ => Err(MountError::refused(rel, "expected a regular file")),
    }
}

/// Replaces the path in an error from a one-component lookup with the full
/// relative path, so that messages name what the user knows.
pub(crate) fn rename_error_path(error: MountError, full: &Path) -> MountError {
    match error {
        MountError::Refused { reason, .. } => MountError::refused(full, reason),
        MountError::Syscall { operation, errno, .. } => MountError::sys(operation, full, errno),
        other => other,
    }
}

/// Reads the regular file `rel` beneath `root` (at most `limit` bytes, more
/// is an error). Returns `None` if it does not exist. Refuses symlinks and
/// anything that is not a regular file (a fifo would block).
pub fn read_beneath(root: BorrowedFd<'_>, rel: &Path, limit: u64) -> Result<Option<Vec<u8>>, MountError> {
    let fd = match open_beneath(root, rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK) {
        Ok(fd) => fd,
        Err(MountError::Syscall { errno: Errno::ENOENT, .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    if file_kind(fd.as_fd())? != FileKind::Regular {
        return Err(MountError::refused(rel, "expected a regular file"));
    }
    let mut contents = Vec::new();
    std::fs::File::from(fd).take(limit + 1).read_to_end(&mut contents).map_err(|e| MountError::io("read", rel, e))?;
    if contents.len() as u64 > limit {
        return Err(MountError::refused(rel, format!("file is larger than {limit} bytes")));
    }
    Ok(Some(contents))
}

/// Opens a trusted absolute directory (e.g. the workspace root or the Domain
/// Root) as an `O_PATH | O_DIRECTORY` fd, refusing a symlink as its last
/// component (the parents are the host's own and are trusted).
pub fn open_root_dir(path: &Path) -> Result<OwnedFd, MountError> {
    nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty()).map_err(|errno| {
        match errno {
            Errno::ELOOP | Errno::ENOTDIR => {
                MountError::refused(path, "expected a real directory, found a symlink or a non-directory; pass the canonical path")
            }
            errno => MountError::sys("open", path, errno),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("a/b")).expect("mkdir");
        std::fs::write(dir.path().join("a/b/file"), b"hello").expect("write");
        symlink("/etc", dir.path().join("etc_link")).expect("symlink");
        symlink("b", dir.path().join("a/rel_link")).expect("symlink");
        let fd = open_root_dir(dir.path()).expect("open root");
        (dir, fd)
    }

    #[test]
    fn reads_plain_paths() {
        let (_dir, root) = tree();
        let contents = read_beneath(root.as_fd(), Path::new("a/b/file"), 100).expect("read");
        assert_eq!(contents.as_deref(), Some(&b"hello"[..]));
        assert!(read_beneath(root.as_fd(), Path::new("a/missing"), 100).expect("read").is_none());
    }

    #[test]
    fn refuses_symlinks_and_escapes() {
        let (_dir, root) = tree();
        for bad in ["etc_link/passwd", "etc_link", "a/rel_link/file", "a/../../etc/passwd", "/etc/passwd"] {
            let err = read_beneath(root.as_fd(), Path::new(bad), 1 << 20).expect_err(bad);
            assert!(matches!(err, MountError::Refused { .. }), "{bad}: {err}");
            assert!(err.to_string().contains(bad), "error names the path: {err}");
        }
        let err = ensure_dir_beneath(root.as_fd(), Path::new("etc_link/newdir")).expect_err("symlink parent");
        assert!(matches!(err, MountError::Refused { .. }), "{err}");
        assert!(!Path::new("/etc/newdir").exists());
    }

    #[test]
    fn symlink_last_component_with_o_path_is_reported_as_symlink() {
        let (_dir, root) = tree();
        let fd = open_path_beneath(root.as_fd(), Path::new("etc_link")).expect("open").expect("exists");
        assert_eq!(file_kind(fd.as_fd()).expect("kind"), FileKind::Symlink);
    }

    #[test]
    fn ensure_dir_creates_missing_components_and_file() {
        let (dir, root) = tree();
        let fd = ensure_dir_beneath(root.as_fd(), Path::new("a/x/y/z")).expect("mkdir");
        assert_eq!(file_kind(fd.as_fd()).expect("kind"), FileKind::Directory);
        assert!(dir.path().join("a/x/y/z").is_dir());
        let file = ensure_file_beneath(root.as_fd(), Path::new("a/x/f")).expect("file");
        assert_eq!(file_kind(file.as_fd()).expect("kind"), FileKind::Regular);
        // Readable by its owner (it used to be created with mode 0).
        let created = std::fs::metadata(dir.path().join("a/x/f")).expect("metadata");
        assert_ne!(std::os::unix::fs::PermissionsExt::mode(&created.permissions()) & 0o400, 0);
        assert!(std::fs::File::open(dir.path().join("a/x/f")).is_ok());
        // Existing file is accepted, existing symlink is not.
        ensure_file_beneath(root.as_fd(), Path::new("a/x/f")).expect("again");
        assert!(ensure_file_beneath(root.as_fd(), Path::new("etc_link")).is_err());
    }

    #[test]
    fn swapping_a_directory_for_a_symlink_never_resolves_outside() {
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::write(outside.path().join("file"), b"outside").expect("write");
        let (dir, root) = tree();
        std::fs::write(dir.path().join("a/file"), b"inside").expect("write");
        symlink(outside.path(), dir.path().join("decoy")).expect("symlink");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let swapper = {
            let stop = std::sync::Arc::clone(&stop);
            let (a, decoy) = (dir.path().join("a"), dir.path().join("decoy"));
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    nix::fcntl::renameat2(nix::fcntl::AT_FDCWD, &a, nix::fcntl::AT_FDCWD, &decoy, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
                        .expect("exchange");
                }
            })
        };
        let (mut inside, mut refused) = (0, 0);
        for _ in 0..5000 {
            match read_beneath(root.as_fd(), Path::new("a/file"), 100) {
                Ok(Some(contents)) => {
                    assert_eq!(contents, b"inside", "resolution landed outside the root");
                    inside += 1;
                }
                Ok(None) => {}
                Err(MountError::Refused { .. }) => refused += 1,
                Err(other) => panic!("unexpected error: {other}"),
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        swapper.join().expect("swapper");
        assert!(inside + refused > 0);
    }

    #[test]
    fn refuses_special_files() {
        let (dir, root) = tree();
        nix::unistd::mkfifo(&dir.path().join("fifo"), Mode::from_bits_truncate(0o644)).expect("mkfifo");
        let err = read_beneath(root.as_fd(), Path::new("fifo"), 10).expect_err("fifo");
        assert!(matches!(err, MountError::Refused { .. }), "{err}");
    }
}
