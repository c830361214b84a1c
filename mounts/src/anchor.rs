//! State Anchor: a Domain's persistent writable layer over selected paths of
//! the base image (`persistent_dirs`).
//!
//! For each persistent dir `P`, an overlay is mounted on the host (in the
//! coordinator's private mount namespace) with the image's `P` as lower
//! layer and `DOMAIN_ROOT/anchor/<escaped P>/{upper,work}` as upper and work
//! directories; runsc ignores OCI overlay mounts, so the overlay mountpoint
//! is handed to runsc as a plain bind at `P`. Nested entries (`/usr` and
//! `/usr/local`) get one overlay each, parents first, so a write lands in
//! the innermost anchor. A dir the image lacks gets an empty lower layer (it
//! is created in the upper). Nothing from the host is ever copied in.
//!
//! `anchor/image-digest` records the image the anchor was last used with.
//! When the image changes, the anchor is kept, a warning is returned once
//! (files in the old upper shadow the new image's), and the record is
//! updated; `reset` discards the anchor (`lazaret run --reset-anchor`).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag};

use crate::error::MountError;
use crate::plan::BindMount;
use crate::safe_path::{self, FileKind};
use crate::sys;

/// Name of the digest record inside `DOMAIN_ROOT/anchor`.
pub const DIGEST_FILE: &str = "image-digest";

/// Sandbox paths that can never be persistent (kernel-provided or the root).
const FORBIDDEN: &[&str] = &["/", "/proc", "/sys", "/dev"];

/// What happened to the anchor relative to the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DigestStatus {
    /// No anchor existed; a new one starts empty.
    New,
    /// The anchor was made over this same image.
    Unchanged,
    /// The anchor was made over another image and was kept.
    Changed {
        /// The digest the anchor was made over.
        previous: String,
    },
    /// The anchor was discarded on request and starts empty.
    Reset,
}

/// One persistent directory's storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnchorDir {
    /// Absolute path inside the sandbox (normalised).
    pub sandbox_path: PathBuf,
    /// Overlay upper directory in the Domain Root.
    pub upper: PathBuf,
    /// Overlay work directory in the Domain Root.
    pub work: PathBuf,
}

/// The prepared State Anchor of a Domain.
#[derive(Debug, Clone)]
pub struct AnchorPlan {
    /// Persistent dirs, parents before children.
    pub dirs: Vec<AnchorDir>,
    /// Relation of the anchor to the image.
    pub digest: DigestStatus,
    /// Human-readable warnings (e.g. digest changed).
    pub warnings: Vec<String>,
}

/// Validates and normalises one `persistent_dirs` entry.
pub fn validate_persistent_dir(raw: &Path) -> Result<PathBuf, MountError> {
    if !raw.is_absolute() {
        return Err(MountError::Config(format!("persistent dir {} must be an absolute path", raw.display())));
    }
    let mut out = PathBuf::from("/");
    for component in raw.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(MountError::Config(format!("persistent dir {} may not contain '..'", raw.display())));
            }
        }
    }
    if FORBIDDEN.iter().any(|f| out == Path::new(f) || (*f != "/" && out.starts_with(f))) {
        return Err(MountError::Config(format!(
            "persistent dir {} is not allowed (/, /proc, /sys and /dev are provided by the sandbox)",
            raw.display()
        )));
    }
    Ok(out)
}

/// Escapes a sandbox path into one directory name: `/usr/local` becomes
/// `usr%2Flocal`. Reversible; the result has no `/`, `,`, `:` or `\`.
pub fn escape_path(path: &Path) -> String {
    let text = path.to_string_lossy();
    let mut out = String::new();
    for c in text.trim_start_matches('/').chars() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            ',' => out.push_str("%2C"),
            ':' => out.push_str("%3A"),
            '\\' => out.push_str("%5C"),
            c => out.push(c),
        }
    }
    out
}

/// Prepares the anchor storage of a Domain: validates `persistent_dirs`,
/// checks the image digest record (`reset` discards an existing anchor
/// first), creates the upper/work directories and records the digest.
pub fn prepare_anchor(domain_root: &Path, persistent_dirs: &[PathBuf], image_digest: &str, reset: bool) -> Result<AnchorPlan, MountError> {
    if image_digest.is_empty() || image_digest.contains('\n') {
        return Err(MountError::Config(format!("invalid image digest {image_digest:?}")));
    }
    let anchor_root = domain_root.join("anchor");
    let mut warnings = Vec::new();
    let mut digest = DigestStatus::New;
    if reset && anchor_root.exists() {
        reset_anchor(domain_root)?;
        digest = DigestStatus::Reset;
    }
    let record = anchor_root.join(DIGEST_FILE);
    match std::fs::read_to_string(&record) {
        Ok(previous) if previous.trim() == image_digest => digest = DigestStatus::Unchanged,
        Ok(previous) => {
            let previous = previous.trim().to_owned();
            warnings.push(format!(
                "the State Anchor in {} was made over image {previous}, now {image_digest}; keeping it (files it holds shadow the new image's); run with --reset-anchor to discard it",
                anchor_root.display()
            ));
            digest = DigestStatus::Changed { previous };
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(MountError::io("read", &record, e)),
    }
    let mut dirs = Vec::new();
    for raw in persistent_dirs {
        let sandbox_path = validate_persistent_dir(raw)?;
        let base = anchor_root.join(escape_path(&sandbox_path));
        dirs.push(AnchorDir { sandbox_path, upper: base.join("upper"), work: base.join("work") });
    }
    dirs.sort_by(|a, b| a.sandbox_path.cmp(&b.sandbox_path));
    dirs.dedup_by(|a, b| a.sandbox_path == b.sandbox_path);
    for dir in &dirs {
        for path in [&dir.upper, &dir.work] {
            std::fs::create_dir_all(path).map_err(|e| MountError::io("create", path, e))?;
        }
    }
    if digest != DigestStatus::Unchanged {
        let tmp = anchor_root.join(format!("{DIGEST_FILE}.tmp"));
        std::fs::create_dir_all(&anchor_root).map_err(|e| MountError::io("create", &anchor_root, e))?;
        std::fs::write(&tmp, format!("{image_digest}\n")).map_err(|e| MountError::io("write", &tmp, e))?;
        std::fs::rename(&tmp, &record).map_err(|e| MountError::io("rename", &record, e))?;
    }
    Ok(AnchorPlan { dirs, digest, warnings })
}

/// Discards a Domain's State Anchor (all persistent-dir layers and the
/// digest record). Must not be called while the anchor is mounted.
pub fn reset_anchor(domain_root: &Path) -> Result<(), MountError> {
    let anchor_root = domain_root.join("anchor");
    match std::fs::remove_dir_all(&anchor_root) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(MountError::io("remove", &anchor_root, e)),
    }
}

/// Mounts the anchor overlays under `mount_dir` (a trusted per-run
/// directory, in the private mount namespace) over the unpacked image at
/// `image_rootfs`, and returns the binds to give runsc (parents first).
///
/// Image paths are resolved inside the image (`RESOLVE_IN_ROOT`): a symlink
/// in the image such as `/opt -> /etc` means the image's `/etc`, never the
/// host's. The lower layer is passed to overlayfs as `/proc/self/fd/N`.
pub fn mount_anchor(plan: &AnchorPlan, image_rootfs: &Path, mount_dir: &Path) -> Result<Vec<BindMount>, MountError> {
    std::fs::create_dir_all(mount_dir).map_err(|e| MountError::io("create", mount_dir, e))?;
    let image = safe_path::open_root_dir(image_rootfs)?;
    let empty = mount_dir.join(".empty-lower");
    std::fs::create_dir_all(&empty).map_err(|e| MountError::io("create", &empty, e))?;
    let mut binds = Vec::new();
    for dir in &plan.dirs {
        let rel = dir.sandbox_path.strip_prefix("/").unwrap_or(&dir.sandbox_path);
        let lower = open_in_image(image.as_fd(), rel)?;
        if let Some(lower) = &lower {
            copy_root_attributes(lower, &dir.upper)?;
        }
        let lower_path = match &lower {
            Some(fd) => PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
            None => empty.clone(),
        };
        let target = mount_dir.join(escape_path(&dir.sandbox_path));
        std::fs::create_dir_all(&target).map_err(|e| MountError::io("create", &target, e))?;
        sys::mount_overlay(&[&lower_path], &dir.upper, &dir.work, &target)?;
        binds.push(BindMount { source: target, destination: dir.sandbox_path.clone(), readonly: false });
    }
    Ok(binds)
}

/// Opens `rel` inside the image as a directory, resolving symlinks as if
/// the image were `/`. `None` if it does not exist or is not a directory.
fn open_in_image(image: std::os::fd::BorrowedFd<'_>, rel: &Path) -> Result<Option<OwnedFd>, MountError> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    match nix::fcntl::openat2(image, rel, how) {
        Ok(fd) => Ok(Some(fd)),
        Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => Ok(None),
        Err(errno) => Err(MountError::sys("openat2 (image)", rel, errno)),
    }
}

/// A fresh upper dir gives the merged root its mode and owner: copy them
/// from the image's directory so that e.g. `/root` stays 0700 and `/tmp`
/// 1777. Only done while the upper is still empty.
fn copy_root_attributes(lower: &OwnedFd, upper: &Path) -> Result<(), MountError> {
    let is_empty = std::fs::read_dir(upper).map_err(|e| MountError::io("read", upper, e))?.next().is_none();
    if !is_empty {
        return Ok(());
    }
    let st = safe_path::stat(lower.as_fd())?;
    if safe_path::kind_of(&st) != FileKind::Directory {
        return Ok(());
    }
    std::os::unix::fs::chown(upper, Some(st.st_uid), Some(st.st_gid)).map_err(|e| MountError::io("chown", upper, e))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(upper, std::fs::Permissions::from_mode(st.st_mode & 0o7777)).map_err(|e| MountError::io("chmod", upper, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_is_flat_and_overlay_safe() {
        assert_eq!(escape_path(Path::new("/usr/local")), "usr%2Flocal");
        assert_eq!(escape_path(Path::new("/a%2Fb")), "a%252Fb");
        assert_eq!(escape_path(Path::new("/x,y:z\\w")), "x%2Cy%3Az%5Cw");
        assert_ne!(escape_path(Path::new("/usr/local")), escape_path(Path::new("/usr%2Flocal")));
    }

    #[test]
    fn validation() {
        assert_eq!(validate_persistent_dir(Path::new("/usr//local/")).expect("ok"), PathBuf::from("/usr/local"));
        for bad in ["usr", "/", "/proc", "/proc/x", "/dev", "/sys/fs", "/usr/../etc"] {
            assert!(validate_persistent_dir(Path::new(bad)).is_err(), "{bad}");
        }
        assert!(validate_persistent_dir(Path::new("/devices")).is_ok());
    }

    #[test]
    fn digest_keep_warn_and_reset() {
        let root = tempfile::tempdir().expect("tempdir");
        let dirs = [PathBuf::from("/usr/local"), PathBuf::from("/usr"), PathBuf::from("/root")];
        let plan = prepare_anchor(root.path(), &dirs, "sha256:aaa", false).expect("prepare");
        assert_eq!(plan.digest, DigestStatus::New);
        let order: Vec<_> = plan.dirs.iter().map(|d| d.sandbox_path.clone()).collect();
        assert_eq!(order, vec![PathBuf::from("/root"), PathBuf::from("/usr"), PathBuf::from("/usr/local")]);
        std::fs::write(plan.dirs[1].upper.join("tool"), "installed").expect("write");
        let again = prepare_anchor(root.path(), &dirs, "sha256:aaa", false).expect("prepare");
        assert_eq!(again.digest, DigestStatus::Unchanged);
        let changed = prepare_anchor(root.path(), &dirs, "sha256:bbb", false).expect("prepare");
        assert_eq!(changed.digest, DigestStatus::Changed { previous: "sha256:aaa".into() });
        assert_eq!(changed.warnings.len(), 1);
        assert!(changed.dirs[1].upper.join("tool").exists(), "kept");
        let warned_once = prepare_anchor(root.path(), &dirs, "sha256:bbb", false).expect("prepare");
        assert_eq!(warned_once.digest, DigestStatus::Unchanged);
        let reset = prepare_anchor(root.path(), &dirs, "sha256:bbb", true).expect("prepare");
        assert_eq!(reset.digest, DigestStatus::Reset);
        assert!(!reset.dirs[1].upper.join("tool").exists(), "discarded");
        let after = prepare_anchor(root.path(), &dirs, "sha256:bbb", false).expect("prepare");
        assert_eq!(after.digest, DigestStatus::Unchanged);
    }
}
