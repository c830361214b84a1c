//! Small fd-relative filesystem helpers that never follow symlinks.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};

/// Flags for opening an existing directory without following a symlink.
const DIR_FLAGS: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_NOFOLLOW).union(OFlag::O_CLOEXEC);

/// Opens directory `name` inside `parent`; fails with ELOOP/ENOTDIR if it is a
/// symlink or not a directory.
pub(crate) fn open_dir_at(parent: BorrowedFd<'_>, name: &OsStr) -> nix::Result<OwnedFd> {
    openat(parent, name, DIR_FLAGS, Mode::empty())
}

/// Opens `path` as a directory; the last component must not be a symlink.
pub(crate) fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)?;
    Ok(OwnedFd::from(file))
}

/// Removes `name` inside `parent`, recursively if it is a directory, without
/// ever following a symlink. A missing `name` is not an error.
pub(crate) fn remove_tree_at(parent: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    match unlinkat(parent, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => return Ok(()),
        // Linux reports EISDIR for unlink(2) on a directory.
        Err(Errno::EISDIR) | Err(Errno::EPERM) => {}
        Err(e) => return Err(e.into()),
    }
    let dir_fd = match open_dir_at(parent, name) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    clear_dir(dir_fd.as_fd(), |_| true)?;
    match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Removes every child of the directory `dir` for which `select(name)` is true.
pub(crate) fn clear_dir(dir: BorrowedFd<'_>, mut select: impl FnMut(&OsStr) -> bool) -> io::Result<()> {
    for name in list_dir(dir)? {
        if select(&name) {
            remove_tree_at(dir, &name)?;
        }
    }
    Ok(())
}

/// Lists the names in directory `dir` (without `.` and `..`).
pub(crate) fn list_dir(dir: BorrowedFd<'_>) -> io::Result<Vec<std::ffi::OsString>> {
    let dup = dir.try_clone_to_owned()?;
    let mut handle = nix::dir::Dir::from_fd(dup)?;
    let mut names = Vec::new();
    for entry in handle.iter() {
        let entry = entry?;
        let bytes = entry.file_name().to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        names.push(OsStr::from_bytes(bytes).to_os_string());
    }
    Ok(names)
}

/// Fsyncs a directory so a rename inside it is durable.
pub(crate) fn fsync_dir(path: &Path) -> io::Result<()> {
    File::open(path)?.sync_all()
}

/// Writes `bytes` to `dir/name` atomically: temp file, fsync, rename, fsync dir.
pub(crate) fn atomic_write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
    let tmp_name = format!(".{name}.tmp-{}", std::process::id());
    let tmp_path = dir.join(&tmp_name);
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp_path)?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp_path, dir.join(name))?;
        fsync_dir(dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp_path);
    }
    result
}

/// Creates `path` (and missing parents) with `mode`, or sets `mode` on an
/// existing directory; refuses a symlink or a non-directory at `path`.
pub(crate) fn ensure_private_dir(path: &Path, mode: u32) -> io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)),
        Ok(_) => {
            Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("{} exists and is not a directory (or is a symlink)", path.display())))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().recursive(true).mode(mode).create(path)?;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        }
        Err(e) => Err(e),
    }
}

use std::os::unix::fs::DirBuilderExt;
