//! Ignored Workspace State: Domain-scoped storage presented at the
//! workspace's top-most git-ignored paths instead of the host's content.
//!
//! Storage lives in `DOMAIN_ROOT/ignored/<escaped relative path>` (a
//! directory for a directory, a file for a file), created on first use with
//! the owner and mode of the host mount point so that a non-root sandbox
//! user can write there. It starts empty: the host's content is never copied
//! in or shown. A symlink or special file at an ignored path cannot be
//! covered by a bind and is reported (not mounted) instead.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

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
