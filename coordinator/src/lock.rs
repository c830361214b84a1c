//! The exclusive per-Domain lock (OR-1): one owner of a Domain's runtime
//! resources at a time. An flock on a file in the host-private runtime
//! directory; the kernel releases it when the owner dies, so a crashed run
//! never leaves the Domain locked.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another live process holds it.
    #[error("Domain {domain} is already owned by PID {owner}")]
    Busy {
        /// The Domain ID.
        domain: String,
        /// The PID recorded by the owner.
        owner: String,
    },
    /// The lock file could not be opened or written.
    #[error("lock file {path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// Opens (creating, mode 0600) the file `path` to flock: never through a
/// symlink, never truncated (a Domain lock holds its owner's PID).
pub(crate) fn open_lock_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

/// A held Domain lock; released on drop (or by the kernel if we die).
pub struct DomainLock {
    _lock: Flock<File>,
}

impl DomainLock {
    /// Takes the lock without waiting and records our PID in it.
    pub fn acquire(path: &Path, domain: &str) -> Result<DomainLock, LockError> {
        let io = |source| LockError::Io { path: path.to_path_buf(), source };
        let file = open_lock_file(path).map_err(io)?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
                let mut owner = String::new();
                let _ = file.read_to_string(&mut owner);
                return Err(LockError::Busy { domain: domain.to_string(), owner: owner.trim().to_string() });
            }
            Err((_, e)) => return Err(io(e.into())),
        };
        lock.set_len(0).map_err(io)?;
        lock.rewind().map_err(io)?;
        writeln!(lock, "{}", std::process::id()).map_err(io)?;
        Ok(DomainLock { _lock: lock })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_acquire_is_refused_until_release() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("lock");
        let first = DomainLock::acquire(&path, "d1").expect("first");
        let err = DomainLock::acquire(&path, "d1").err().expect("second must fail");
        assert!(matches!(&err, LockError::Busy { owner, .. } if *owner == std::process::id().to_string()), "{err}");
        drop(first);
        assert!(DomainLock::acquire(&path, "d1").is_ok());
    }

    #[test]
    fn refuses_a_symlinked_lock_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "x").expect("write");
        std::os::unix::fs::symlink(&target, dir.path().join("lock")).expect("symlink");
        assert!(matches!(DomainLock::acquire(&dir.path().join("lock"), "d"), Err(LockError::Io { .. })));
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "x");
    }
}
