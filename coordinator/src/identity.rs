//! Developer, workspace and Domain identity, and the trusted host directories
//! Lazaret keeps state in.
//!
//! Lazaret runs as root (directly or via sudo). The *developer* is the user
//! who invoked it: `SUDO_UID`/`SUDO_GID` when the real uid is root, else the
//! real uid. The *workspace* is the top of the git checkout containing the
//! current directory, found without running `git` (a hostile repository's
//! configuration could run code). The Domain ID (FR-1) is a digest of the
//! profile name and the canonical workspace path.
//!
//! Layout: the Storage Root (default `/var/lib/lazaret`, root-owned) holds
//! `domains/<domain-id>/` (one Domain Root per Domain, 0700, SR-11) and
//! `images/`. The developer's runtime directory (default
//! `/run/lazaret/<uid>/`, owned by the developer, 0700, SR-10) holds sockets,
//! runsc state and locks, one `<domain-id>/` subdirectory per Domain.

use std::ffi::OsString;
use std::fmt;
use std::fs::{DirBuilder, Permissions};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lazaret_mounts::MountError;
use lazaret_mounts::repo::{self, DotGit, DotGitProblem};
use lazaret_mounts::safe_path;
use lazaret_protocol::display::escaped;
use sha2::{Digest, Sha256};

/// Problems establishing who the developer is, where the workspace is, or
/// whether a state directory is safe.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// No `.git` between the start directory and `/`.
    #[error(
        "not inside a git checkout (searched from {} up to /)\n  hint: run lazaret inside a git repository or pass -C DIR",
        escaped(start)
    )]
    NotInGitCheckout {
        /// Where the search started (canonical).
        start: PathBuf,
    },
    /// A `.git` entry exists but is not a directory or a `gitdir:` file.
    #[error("{} is not a git directory or a `gitdir:` file ({problem})\n  hint: {hint}", escaped(path))]
    BadGitMarker {
        /// The `.git` path.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        hint: String,
    },
    /// `SUDO_UID` or `SUDO_GID` is not a number.
    #[error("${variable} = {value:?} is not a numeric id\n  hint: run lazaret through sudo, or unset {variable}")]
    BadSudoId {
        /// `SUDO_UID` or `SUDO_GID`.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// The developer's uid has no password database entry.
    #[error("uid {uid} has no entry in the password database (needed for its home directory)")]
    NoPasswdEntry {
        /// The uid.
        uid: u32,
    },
    /// A state directory exists with the wrong type, owner or mode.
    #[error("unsafe directory {}: {problem}\n  hint: {hint}", escaped(path))]
    UnsafeDirectory {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        problem: String,
        /// What the developer or administrator should do.
        hint: String,
    },
    /// A filesystem operation failed.
    #[error("{}: {source}", escaped(path))]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError {
    let path = path.to_path_buf();
    move |source| IdentityError::Io { path, source }
}

/// The human who invoked Lazaret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Developer {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Login name.
    pub name: String,
    /// Home directory from the password database.
    pub home: PathBuf,
    /// Login shell from the password database (a host command's `SHELL`).
    pub shell: PathBuf,
    /// Name of the primary group ([`Developer::gid`]) in the host's group
    /// database, if it has one.
    pub group_name: Option<String>,
    /// Supplementary groups from the host's group database
    /// (`getgrouplist`), without the primary group, in database order.
    pub groups: Vec<HostGroup>,
}

/// A group of the host's group database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostGroup {
    /// Group id.
    pub gid: u32,
    /// Its name, if the database has one for it.
    pub name: Option<String>,
}

impl Developer {
    /// The developer of this process: `SUDO_UID`/`SUDO_GID` when running as
    /// real uid 0 under sudo, else the real uid/gid.
    pub fn from_process() -> Result<Developer, IdentityError> {
        let lookup = |name: &str| std::env::var_os(name);
        Developer::resolve(&lookup, nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw())
    }

    /// [`Developer::from_process`] with the environment and real ids given.
    /// `SUDO_*` variables are trusted only when `real_uid` is 0 (anyone can
    /// set them; only sudo running as root makes them meaningful).
    pub fn resolve(env: &dyn Fn(&str) -> Option<OsString>, real_uid: u32, real_gid: u32) -> Result<Developer, IdentityError> {
        let numeric = |variable: &'static str| -> Result<Option<u32>, IdentityError> {
            match env(variable) {
                None => Ok(None),
                Some(value) => {
                    let text = value.to_string_lossy().into_owned();
                    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                        return Err(IdentityError::BadSudoId { variable, value: text });
                    }
                    text.parse().map(Some).map_err(|_| IdentityError::BadSudoId { variable, value: text })
                }
            }
        };
        let (uid, explicit_gid) = match (real_uid, numeric("SUDO_UID")?) {
            (0, Some(sudo_uid)) => (sudo_uid, numeric("SUDO_GID")?),
            _ => (real_uid, Some(real_gid)),
        };
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .map_err(|errno| IdentityError::Io { path: PathBuf::from("/etc/passwd"), source: std::io::Error::from(errno) })?
            .ok_or(IdentityError::NoPasswdEntry { uid })?;
        let gid = explicit_gid.unwrap_or(user.gid.as_raw());
        let groups = host_groups(&user.name, gid)?;
        Ok(Developer { uid, gid, group_name: group_name(gid), name: user.name, home: user.dir, shell: user.shell, groups })
    }
}

/// The supplementary groups of `user` (whose primary group is `gid`) in
/// the host's group database, through NSS (`getgrouplist`, no shell).
fn host_groups(user: &str, gid: u32) -> Result<Vec<HostGroup>, IdentityError> {
    let group_db = || PathBuf::from("/etc/group");
    let name = std::ffi::CString::new(user).map_err(|_| IdentityError::Io {
        path: group_db(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, format!("user name {user:?} contains NUL")),
    })?;
    let gids = nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(gid))
        .map_err(|errno| IdentityError::Io { path: group_db(), source: std::io::Error::from(errno) })?;
    let mut groups: Vec<HostGroup> = Vec::new();
    for g in gids.into_iter().map(|g| g.as_raw()) {
        if g != gid && !groups.iter().any(|known| known.gid == g) {
            groups.push(HostGroup { gid: g, name: group_name(g) });
        }
    }
    Ok(groups)
}

/// The host's name for `gid`, if any (a failing lookup counts as none).
fn group_name(gid: u32) -> Option<String> {
    nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)).ok().flatten().map(|g| g.name)
}

/// How a checkout's `.git` was recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitMarker {
    /// `.git` is a directory (an ordinary clone).
    Directory,
    /// `.git` is a `gitdir:` file (linked worktree or submodule).
    GitdirFile,
}

/// The Agent Workspace: the canonical top-level directory of a git checkout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    root: PathBuf,
    subdir: PathBuf,
    marker: GitMarker,
}

impl Workspace {
    /// Canonicalises `start` (resolving symlinks) and walks up to the first
    /// directory containing `.git`. Does not run `git`. Each `.git` is read
    /// by `lazaret_mounts::repo::read_dot_git` (fd-relative, never following
    /// a symlink), the same reader that later locates the git directories to
    /// protect. A `.git` that is a symlink, or a file not starting with
    /// `gitdir: PATH`, is refused rather than skipped, so a planted marker
    /// cannot silently widen the workspace.
    pub fn discover(start: &Path) -> Result<Workspace, IdentityError> {
        let canonical = std::fs::canonicalize(start).map_err(io_error(start))?;
        for directory in canonical.ancestors() {
            let marker_path = directory.join(".git");
            let dot_git = safe_path::open_root_dir(directory)
                .and_then(|dir| repo::read_dot_git(dir.as_fd(), Path::new("")))
                .map_err(|error| marker_error(&marker_path, error))?;
            let marker = match dot_git {
                DotGit::Missing => continue,
                DotGit::Directory(_) => GitMarker::Directory,
                DotGit::GitdirFile(_) => GitMarker::GitdirFile,
                DotGit::Invalid(DotGitProblem::Symlink) => {
                    return Err(IdentityError::BadGitMarker {
                        path: marker_path,
                        problem: "it is a symlink".to_string(),
                        hint: "Lazaret does not follow symlinks in a workspace; replace the symlink with a `gitdir: PATH` file".to_string(),
                    });
                }
                DotGit::Invalid(DotGitProblem::NotGitdirFile | DotGitProblem::NotFileOrDirectory) => {
                    return Err(IdentityError::BadGitMarker {
                        path: marker_path,
                        problem: "it does not start with `gitdir:` followed by a path".to_string(),
                        hint: "remove the stray .git entry or run lazaret from a proper checkout".to_string(),
                    });
                }
            };
            let subdir = canonical.strip_prefix(directory).map(Path::to_path_buf).unwrap_or_default();
            return Ok(Workspace { root: directory.to_path_buf(), subdir, marker });
        }
        Err(IdentityError::NotInGitCheckout { start: canonical })
    }

    /// The canonical top-level directory of the checkout.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where the search started, relative to [`Workspace::root`] (empty at the
    /// top), e.g. to start the agent in the same subdirectory.
    pub fn subdir(&self) -> &Path {
        &self.subdir
    }

    /// How the checkout was recognised.
    pub fn marker(&self) -> GitMarker {
        self.marker
    }
}

/// A `.git` entry that could not be read: system errors stay I/O errors of
/// that path; a refusal (e.g. an oversized `.git` file) is a bad marker.
fn marker_error(marker_path: &Path, error: MountError) -> IdentityError {
    match error {
        MountError::Syscall { errno, .. } => IdentityError::Io { path: marker_path.to_path_buf(), source: std::io::Error::from(errno) },
        MountError::Io { source, .. } => IdentityError::Io { path: marker_path.to_path_buf(), source },
        other => IdentityError::BadGitMarker {
            path: marker_path.to_path_buf(),
            problem: other.to_string(),
            hint: "remove the stray .git entry or run lazaret from a proper checkout".to_string(),
        },
    }
}

/// Stable identifier of a Domain: 32 lowercase hex digits of
/// SHA-256(`"lazaret-domain-v1\0" + profile + "\0" + canonical workspace path`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainId(String);

/// Length of a [`DomainId`] in hex digits.
pub const DOMAIN_ID_LEN: usize = 32;

/// Length of [`DomainId::short`].
pub const DOMAIN_ID_SHORT_LEN: usize = 10;

impl DomainId {
    /// The Domain ID of `profile` in `workspace`.
    pub fn new(profile: &str, workspace: &Workspace) -> DomainId {
        use std::os::unix::ffi::OsStrExt;
        let mut hasher = Sha256::new();
        hasher.update(b"lazaret-domain-v1\0");
        hasher.update(profile.as_bytes());
        hasher.update(b"\0");
        hasher.update(workspace.root().as_os_str().as_bytes());
        let mut id = hex::encode(hasher.finalize());
        id.truncate(DOMAIN_ID_LEN);
        DomainId(id)
    }

    /// Accepts a previously printed ID (32 lowercase hex digits), e.g. a
    /// directory name under `domains/`.
    pub fn parse(text: &str) -> Option<DomainId> {
        (text.len() == DOMAIN_ID_LEN && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then(|| DomainId(text.to_string()))
    }

    /// The full ID.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 10 hex digits, for kernel object names with small limits
    /// (interface names, cgroup and container ids).
    pub fn short(&self) -> &str {
        &self.0[..DOMAIN_ID_SHORT_LEN]
    }
}

impl fmt::Display for DomainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where Lazaret keeps persistent and runtime state for one developer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatePaths {
    /// The Storage Root (persistent, root-owned).
    pub storage_root: PathBuf,
    /// The developer's host-private runtime directory.
    pub runtime_dir: PathBuf,
}

impl StatePaths {
    /// Paths from the configured Storage Root and runtime directory
    /// (`Config::storage_root`, `Config::runtime_dir(developer)`).
    pub fn new(storage_root: PathBuf, runtime_dir: PathBuf) -> StatePaths {
        StatePaths { storage_root, runtime_dir }
    }

    /// `STORAGE_ROOT/domains`.
    pub fn domains_dir(&self) -> PathBuf {
        self.storage_root.join("domains")
    }

    /// `STORAGE_ROOT/domains/<id>`: the Domain Root.
    pub fn domain_root(&self, id: &DomainId) -> PathBuf {
        self.domains_dir().join(id.as_str())
    }

    /// `STORAGE_ROOT/images`.
    pub fn images_dir(&self) -> PathBuf {
        self.storage_root.join("images")
    }

    /// `RUNTIME_DIR/<id>`: sockets, runsc state and locks of one Domain.
    pub fn domain_runtime_dir(&self, id: &DomainId) -> PathBuf {
        self.runtime_dir.join(id.as_str())
    }

    /// Creates (or verifies) the Storage Root with `domains/` and `images/`.
    /// See [`ensure_storage_root`].
    pub fn ensure_storage(&self) -> Result<(), IdentityError> {
        ensure_storage_root(&self.storage_root)
    }

    /// Creates (or verifies) the Domain Root of `id`: root-owned, 0700.
    /// Requires [`StatePaths::ensure_storage`] first.
    pub fn ensure_domain_root(&self, id: &DomainId) -> Result<PathBuf, IdentityError> {
        let path = self.domain_root(id);
        ensure_private_dir(&path, 0, 0)?;
        Ok(path)
    }
}

/// Creates (or verifies) the Storage Root and its `domains/` and `images/`
/// subdirectories. The root must be a real directory (no symlink anywhere in
/// its path), owned by root and not writable by group or others; every
/// directory above it must be root-owned and not writable by others (sticky
/// directories such as /tmp excepted), so no unprivileged user can swap it.
/// `domains/` and `images/` are root-owned 0700. Missing directories are
/// created; nothing existing is chmod-ed or chown-ed.
pub fn ensure_storage_root(path: &Path) -> Result<(), IdentityError> {
    require_absolute(path)?;
    if let Some(parent) = path.parent() {
        create_missing_ancestors(parent)?;
        check_trusted_ancestors(parent, &[0])?;
    }
    create_if_missing(path, 0, 0)?;
    let metadata = lstat_dir(path)?;
    if metadata.uid() != 0 {
        return Err(IdentityError::UnsafeDirectory {
            path: path.to_path_buf(),
            problem: format!("owned by uid {}, not root", metadata.uid()),
            hint: format!("the Storage Root must belong to root: check who created it, then `chown root:root {}`", path.display()),
        });
    }
    if metadata.mode() & 0o022 != 0 {
        return Err(IdentityError::UnsafeDirectory {
            path: path.to_path_buf(),
            problem: format!("writable by group or others (mode {:o})", metadata.mode() & 0o7777),
            hint: format!("chmod 700 {}", path.display()),
        });
    }
    ensure_private_dir(&path.join("domains"), 0, 0)?;
    ensure_private_dir(&path.join("images"), 0, 0)?;
    Ok(())
}

/// Creates (or verifies) the developer's host-private runtime directory
/// (SR-10): owned by the developer, mode 0700, not a symlink. Its parent
/// (e.g. `/run/lazaret`) is created root-owned 0755 when missing and must be
/// owned by root or the developer and not writable by others. An existing
/// directory with the wrong owner or mode is refused, never repaired: it may
/// belong to someone else.
pub fn ensure_runtime_dir(path: &Path, developer: &Developer) -> Result<(), IdentityError> {
    require_absolute(path)?;
    if let Some(parent) = path.parent() {
        create_missing_ancestors(parent)?;
        check_trusted_ancestors(parent, &[0, developer.uid])?;
    }
    ensure_private_dir(path, developer.uid, developer.gid)
}

/// Creates `path` as a directory owned by `uid:gid` with mode 0700, or
/// verifies that the existing entry is exactly that (not a symlink, right
/// owner, mode 0700). The parent must already exist.
pub fn ensure_private_dir(path: &Path, uid: u32, gid: u32) -> Result<(), IdentityError> {
    create_if_missing(path, uid, gid)?;
    let metadata = lstat_dir(path)?;
    if metadata.uid() != uid {
        return Err(IdentityError::UnsafeDirectory {
            path: path.to_path_buf(),
            problem: format!("owned by uid {}, expected uid {uid}", metadata.uid()),
            hint: format!(
                "it may belong to someone else: check who created it; if it is stale, remove it (rm -r {}) and retry",
                path.display()
            ),
        });
    }
    let mode = metadata.mode() & 0o7777;
    if mode != 0o700 {
        return Err(IdentityError::UnsafeDirectory {
            path: path.to_path_buf(),
            problem: format!("mode {mode:o}, expected 700"),
            hint: format!("if you own it: chmod 700 {}", path.display()),
        });
    }
    Ok(())
}

fn require_absolute(path: &Path) -> Result<(), IdentityError> {
    if path.is_absolute() {
        Ok(())
    } else {
        Err(IdentityError::UnsafeDirectory {
            path: path.to_path_buf(),
            problem: "relative path".to_string(),
            hint: "state directories must be absolute paths".to_string(),
        })
    }
}

/// mkdir 0700 then chown; an existing entry is left for the caller to verify.
fn create_if_missing(path: &Path, uid: u32, gid: u32) -> Result<(), IdentityError> {
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {
            std::os::unix::fs::lchown(path, Some(uid), Some(gid)).map_err(io_error(path))?;
            // The umask may have cleared bits of 0700; set it exactly.
            std::fs::set_permissions(path, Permissions::from_mode(0o700)).map_err(io_error(path))
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(IdentityError::Io { path: path.to_path_buf(), source }),
    }
}

/// Creates missing directories down to `path`, root-owned 0755.
fn create_missing_ancestors(path: &Path) -> Result<(), IdentityError> {
    let missing: Vec<&Path> = path.ancestors().take_while(|p| std::fs::symlink_metadata(p).is_err()).collect();
    for directory in missing.into_iter().rev() {
        match DirBuilder::new().mode(0o755).create(directory) {
            Ok(()) => std::fs::set_permissions(directory, Permissions::from_mode(0o755)).map_err(io_error(directory))?,
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(source) => {
                return Err(IdentityError::Io { path: directory.to_path_buf(), source });
            }
        }
    }
    Ok(())
}

fn lstat_dir(path: &Path) -> Result<std::fs::Metadata, IdentityError> {
    let metadata = std::fs::symlink_metadata(path).map_err(io_error(path))?;
    if metadata.file_type().is_symlink() {
        return Err(IdentityError::UnsafeDirectory {
            path: path.to_path_buf(),
            problem: "it is a symlink".to_string(),
            hint: format!("Lazaret does not follow symlinks for its state; remove it (rm {}) or configure the real path", path.display()),
        });
    }
    if !metadata.is_dir() {
        return Err(IdentityError::UnsafeDirectory {
            path: path.to_path_buf(),
            problem: "not a directory".to_string(),
            hint: format!("move {} away", path.display()),
        });
    }
    Ok(metadata)
}

/// Every directory from `/` down to `path` must be a real directory (no
/// symlink), owned by root or one of `owners`, and not writable by group or
/// others unless sticky.
fn check_trusted_ancestors(path: &Path, owners: &[u32]) -> Result<(), IdentityError> {
    for directory in path.ancestors() {
        let metadata = lstat_dir(directory)?;
        if !owners.contains(&metadata.uid()) && metadata.uid() != 0 {
            return Err(IdentityError::UnsafeDirectory {
                path: directory.to_path_buf(),
                problem: format!("owned by uid {}, which could replace what Lazaret keeps below it", metadata.uid()),
                hint: "keep Lazaret's state below root-owned directories (e.g. the defaults /var/lib/lazaret and /run/lazaret)".to_string(),
            });
        }
        let sticky = metadata.mode() & 0o1000 != 0;
        if metadata.mode() & 0o022 != 0 && !sticky {
            return Err(IdentityError::UnsafeDirectory {
                path: directory.to_path_buf(),
                problem: format!("writable by group or others (mode {:o})", metadata.mode() & 0o7777),
                hint: format!("chmod go-w {}", directory.display()),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::os::unix::fs::symlink;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = pairs.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        move |name: &str| map.get(name).cloned()
    }

    #[test]
    fn developer_comes_from_sudo_only_when_root() {
        let sudo = env_of(&[("SUDO_UID", "65534"), ("SUDO_GID", "100")]);
        let developer = Developer::resolve(&sudo, 0, 0).unwrap();
        assert_eq!((developer.uid, developer.gid), (65534, 100));
        assert_eq!(developer.name, "nobody");
        assert_eq!(developer.home, PathBuf::from("/nonexistent"));

        // Without SUDO_GID the passwd entry's primary group is used.
        let developer = Developer::resolve(&env_of(&[("SUDO_UID", "65534")]), 0, 0).unwrap();
        assert_eq!(developer.gid, 65534);

        // A non-root process cannot claim to be someone else via SUDO_UID.
        let developer = Developer::resolve(&sudo, 65534, 65534).unwrap();
        assert_eq!(developer.uid, 65534);
        let developer = Developer::resolve(&env_of(&[("SUDO_UID", "0")]), 65534, 65534).unwrap();
        assert_eq!(developer.uid, 65534);

        let root = Developer::resolve(&env_of(&[]), 0, 0).unwrap();
        assert_eq!((root.uid, root.name.as_str(), root.home.as_path()), (0, "root", Path::new("/root")));
    }

    /// (gid, name, members) of every line of the host's /etc/group.
    fn host_group_file() -> Vec<(u32, String, Vec<String>)> {
        std::fs::read_to_string("/etc/group")
            .unwrap()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split(':').collect();
                let members = f.get(3)?.split(',').filter(|m| !m.is_empty()).map(String::from).collect();
                Some((f.get(2)?.parse().ok()?, f[0].to_string(), members))
            })
            .collect()
    }

    #[test]
    fn groups_come_from_the_host_group_database() {
        let file = host_group_file();
        let name_of = |gid: u32| file.iter().find(|(g, _, _)| *g == gid).map(|(_, n, _)| n.clone());
        for (env, real) in [(env_of(&[]), 0), (env_of(&[("SUDO_UID", "65534"), ("SUDO_GID", "100")]), 0)] {
            let developer = Developer::resolve(&env, real, real).unwrap();
            assert_eq!(developer.group_name, name_of(developer.gid), "primary group of {}", developer.name);
            let mut expected: Vec<u32> = file
                .iter()
                .filter(|(gid, _, members)| *gid != developer.gid && members.contains(&developer.name))
                .map(|(gid, _, _)| *gid)
                .collect();
            expected.dedup();
            let got: Vec<u32> = developer.groups.iter().map(|g| g.gid).collect();
            assert_eq!(got, expected, "supplementary groups of {}", developer.name);
            for g in &developer.groups {
                assert_eq!(g.name, name_of(g.gid));
            }
        }
    }

    #[test]
    fn bad_sudo_ids_and_unknown_users_are_errors() {
        let error = Developer::resolve(&env_of(&[("SUDO_UID", "12x")]), 0, 0).unwrap_err();
        assert!(matches!(error, IdentityError::BadSudoId { variable: "SUDO_UID", .. }), "{error}");
        let error = Developer::resolve(&env_of(&[("SUDO_UID", "0"), ("SUDO_GID", "-1")]), 0, 0).unwrap_err();
        assert!(matches!(error, IdentityError::BadSudoId { variable: "SUDO_GID", .. }), "{error}");
        let error = Developer::resolve(&env_of(&[("SUDO_UID", "3999999")]), 0, 0).unwrap_err();
        assert!(matches!(error, IdentityError::NoPasswdEntry { uid: 3999999 }), "{error}");
    }

    #[test]
    fn from_process_matches_resolve() {
        let lookup = |name: &str| std::env::var_os(name);
        let expected = Developer::resolve(&lookup, nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw()).unwrap();
        assert_eq!(Developer::from_process().unwrap(), expected);
    }

    /// A temp dir with repo/.git/, repo/a/b/, and a symlink link -> repo/a.
    fn repository() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("repo/.git")).unwrap();
        std::fs::create_dir_all(root.join("repo/a/b")).unwrap();
        symlink(root.join("repo/a"), root.join("link")).unwrap();
        (dir, root)
    }

    #[test]
    fn workspace_is_the_same_from_subdirectories_and_symlinks() {
        let (_dir, root) = repository();
        let top = Workspace::discover(&root.join("repo")).unwrap();
        assert_eq!(top.root(), root.join("repo"));
        assert_eq!(top.subdir(), Path::new(""));
        assert_eq!(top.marker(), GitMarker::Directory);
        let deep = Workspace::discover(&root.join("repo/a/b")).unwrap();
        assert_eq!(deep.root(), top.root());
        assert_eq!(deep.subdir(), Path::new("a/b"));
        let via_link = Workspace::discover(&root.join("link/b")).unwrap();
        assert_eq!(via_link.root(), top.root());
        assert_eq!(via_link.subdir(), Path::new("a/b"));
        assert_eq!(DomainId::new("claude", &deep), DomainId::new("claude", &via_link));
        assert_eq!(DomainId::new("claude", &top), DomainId::new("claude", &via_link));
    }

    #[test]
    fn linked_worktrees_and_submodules_use_gitdir_files() {
        let (_dir, root) = repository();
        std::fs::create_dir_all(root.join("repo/sub/x")).unwrap();
        std::fs::write(root.join("repo/sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
        let sub = Workspace::discover(&root.join("repo/sub/x")).unwrap();
        assert_eq!(sub.root(), root.join("repo/sub"));
        assert_eq!(sub.marker(), GitMarker::GitdirFile);
    }

    #[test]
    fn stray_or_symlinked_git_markers_are_refused() {
        let (_dir, root) = repository();
        std::fs::create_dir_all(root.join("repo/bogus")).unwrap();
        std::fs::write(root.join("repo/bogus/.git"), "not a gitdir").unwrap();
        let error = Workspace::discover(&root.join("repo/bogus")).unwrap_err();
        assert!(error.to_string().contains("does not start with `gitdir:`"), "{error}");

        std::fs::create_dir_all(root.join("repo/linked")).unwrap();
        symlink(root.join("repo/.git"), root.join("repo/linked/.git")).unwrap();
        let error = Workspace::discover(&root.join("repo/linked")).unwrap_err();
        assert!(error.to_string().contains("is a symlink"), "{error}");

        // A short file is read safely.
        std::fs::write(root.join("repo/bogus/.git"), "gi").unwrap();
        assert!(Workspace::discover(&root.join("repo/bogus")).is_err());
        // `gitdir:` without a path is as unusable here as when the git
        // directories are located (the same reader decides both).
        std::fs::write(root.join("repo/bogus/.git"), "gitdir: \n").unwrap();
        let error = Workspace::discover(&root.join("repo/bogus")).unwrap_err();
        assert!(error.to_string().contains("does not start with `gitdir:` followed by a path"), "{error}");
        // A fifo is refused without blocking.
        std::fs::remove_file(root.join("repo/bogus/.git")).unwrap();
        nix::unistd::mkfifo(&root.join("repo/bogus/.git"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(Workspace::discover(&root.join("repo/bogus")), Err(IdentityError::BadGitMarker { .. })));
    }

    #[test]
    fn outside_a_checkout_is_an_error_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        let error = Workspace::discover(dir.path()).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, IdentityError::NotInGitCheckout { .. }));
        assert!(text.contains("not inside a git checkout (searched from"), "{text}");
        assert!(text.contains("up to /"), "{text}");
        assert!(text.contains("pass -C DIR"), "{text}");
        let missing = Workspace::discover(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(missing, IdentityError::Io { .. }));
    }

    #[test]
    fn domain_ids_are_stable_digests_of_profile_and_path() {
        let workspace = Workspace { root: PathBuf::from("/home/dev/src/project"), subdir: PathBuf::new(), marker: GitMarker::Directory };
        let id = DomainId::new("claude", &workspace);
        // printf 'lazaret-domain-v1\0claude\0/home/dev/src/project' | sha256sum | cut -c1-32
        assert_eq!(id.as_str(), "a5bb4f5e0dc0d5a8d69acc5e5095acb6");
        assert_eq!(id.as_str().len(), DOMAIN_ID_LEN);
        assert_eq!(id.short(), &id.as_str()[..10]);
        assert_eq!(id.to_string(), id.as_str());
        assert_ne!(DomainId::new("codex", &workspace), id);
        let other = Workspace { root: PathBuf::from("/home/dev/src/project2"), ..workspace };
        assert_ne!(DomainId::new("claude", &other), id);
        assert_eq!(DomainId::parse(id.as_str()), Some(id.clone()));
        assert_eq!(DomainId::parse("A5BB4F5E0DC0D5A8D69ACC5E5095ACB6"), None);
        assert_eq!(DomainId::parse("abc"), None);
    }

    fn developer(uid: u32) -> Developer {
        Developer {
            uid,
            gid: uid,
            name: "dev".into(),
            home: PathBuf::from("/home/dev"),
            shell: "/bin/sh".into(),
            group_name: Some("dev".into()),
            groups: Vec::new(),
        }
    }

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    fn owner(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().uid()
    }

    #[test]
    fn runtime_dir_is_created_private_to_the_developer() {
        let dir = tempfile::tempdir().unwrap();
        let parent = dir.path().join("run/lazaret");
        let runtime = parent.join("4321");
        ensure_runtime_dir(&runtime, &developer(4321)).unwrap();
        assert_eq!((owner(&runtime), mode(&runtime)), (4321, 0o700));
        assert_eq!((owner(&parent), mode(&parent)), (0, 0o755));
        // Idempotent.
        ensure_runtime_dir(&runtime, &developer(4321)).unwrap();
    }

    #[test]
    fn runtime_dir_with_wrong_owner_mode_or_type_is_refused_not_repaired() {
        let dir = tempfile::tempdir().unwrap();
        let parent = dir.path().join("lazaret");
        std::fs::create_dir(&parent).unwrap();

        let stolen = parent.join("4321");
        ensure_private_dir(&stolen, 9999, 9999).unwrap();
        let error = ensure_runtime_dir(&stolen, &developer(4321)).unwrap_err();
        assert!(error.to_string().contains("owned by uid 9999, expected uid 4321"), "{error}");
        assert_eq!(owner(&stolen), 9999, "must not chown someone else's directory");

        let loose = parent.join("5000");
        std::fs::create_dir(&loose).unwrap();
        std::os::unix::fs::lchown(&loose, Some(5000), Some(5000)).unwrap();
        std::fs::set_permissions(&loose, Permissions::from_mode(0o755)).unwrap();
        let error = ensure_runtime_dir(&loose, &developer(5000)).unwrap_err();
        assert!(error.to_string().contains("mode 755, expected 700"), "{error}");
        assert!(error.to_string().contains("chmod 700"), "{error}");
        assert_eq!(mode(&loose), 0o755, "must not chmod");

        let target = dir.path().join("elsewhere");
        ensure_private_dir(&target, 6000, 6000).unwrap();
        let link = parent.join("6000");
        symlink(&target, &link).unwrap();
        let error = ensure_runtime_dir(&link, &developer(6000)).unwrap_err();
        assert!(error.to_string().contains("is a symlink"), "{error}");

        let file = parent.join("7000");
        std::fs::write(&file, "").unwrap();
        let error = ensure_runtime_dir(&file, &developer(7000)).unwrap_err();
        assert!(error.to_string().contains("not a directory"), "{error}");
    }

    #[test]
    fn runtime_dir_under_a_parent_others_control_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let writable = dir.path().join("shared");
        std::fs::create_dir(&writable).unwrap();
        std::fs::set_permissions(&writable, Permissions::from_mode(0o777)).unwrap();
        let error = ensure_runtime_dir(&writable.join("4321"), &developer(4321)).unwrap_err();
        assert!(error.to_string().contains("writable by group or others"), "{error}");

        let foreign = dir.path().join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::os::unix::fs::lchown(&foreign, Some(9999), None).unwrap();
        let error = ensure_runtime_dir(&foreign.join("4321"), &developer(4321)).unwrap_err();
        assert!(error.to_string().contains("owned by uid 9999"), "{error}");

        // The developer's own directory is an acceptable parent.
        let own = dir.path().join("own");
        std::fs::create_dir(&own).unwrap();
        std::os::unix::fs::lchown(&own, Some(4321), None).unwrap();
        ensure_runtime_dir(&own.join("rt"), &developer(4321)).unwrap();
        assert!(ensure_runtime_dir(Path::new("relative/rt"), &developer(4321)).is_err());
    }

    #[test]
    fn storage_root_and_domain_roots() {
        let dir = tempfile::tempdir().unwrap();
        let storage = dir.path().join("var/lib/lazaret");
        let paths = StatePaths::new(storage.clone(), dir.path().join("run/1000"));
        paths.ensure_storage().unwrap();
        for sub in ["domains", "images"] {
            assert_eq!((owner(&storage.join(sub)), mode(&storage.join(sub))), (0, 0o700), "{sub}");
        }
        assert_eq!((owner(&storage), mode(&storage)), (0, 0o700));
        let workspace = Workspace { root: PathBuf::from("/w"), subdir: PathBuf::new(), marker: GitMarker::Directory };
        let id = DomainId::new("a", &workspace);
        let domain_root = paths.ensure_domain_root(&id).unwrap();
        assert_eq!(domain_root, storage.join("domains").join(id.as_str()));
        assert_eq!((owner(&domain_root), mode(&domain_root)), (0, 0o700));
        assert_eq!(paths.images_dir(), storage.join("images"));
        assert_eq!(paths.domain_runtime_dir(&id), dir.path().join("run/1000").join(id.as_str()));
        // Idempotent.
        paths.ensure_storage().unwrap();

        // Refused: storage root owned by someone else, or a symlink.
        std::os::unix::fs::lchown(&storage, Some(9999), None).unwrap();
        let error = ensure_storage_root(&storage).unwrap_err();
        assert!(error.to_string().contains("owned by uid 9999, not root"), "{error}");
        let link = dir.path().join("var/lib/link");
        symlink(&storage, &link).unwrap();
        let error = ensure_storage_root(&link).unwrap_err();
        assert!(error.to_string().contains("is a symlink"), "{error}");
        // A foreign-owned ancestor is refused even when the root itself is fine.
        let foreign = dir.path().join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::os::unix::fs::lchown(&foreign, Some(9999), None).unwrap();
        let error = ensure_storage_root(&foreign.join("store")).unwrap_err();
        assert!(error.to_string().contains("owned by uid 9999"), "{error}");
    }

    #[test]
    fn workspace_paths_in_messages_cannot_drive_the_terminal() {
        use std::os::unix::ffi::OsStrExt;
        let hostile = PathBuf::from(std::ffi::OsStr::from_bytes(b"/w/evil\x1b]0;owned\x07\rname\xe2\x80\xae"));
        let errors: Vec<String> = vec![
            IdentityError::NotInGitCheckout { start: hostile.clone() }.to_string(),
            IdentityError::BadGitMarker { path: hostile.clone(), problem: "p".into(), hint: "h".into() }.to_string(),
            IdentityError::UnsafeDirectory { path: hostile.clone(), problem: "p".into(), hint: "h".into() }.to_string(),
            IdentityError::Io { path: hostile.clone(), source: std::io::Error::other("x") }.to_string(),
            lazaret_mounts::MountError::Refused { path: hostile.clone(), reason: "r".into() }.to_string(),
        ];
        for text in errors {
            assert!(!text.chars().any(|c| c == '\x1b' || c == '\x07' || c == '\r' || c == '\u{202e}'), "{text:?}");
            assert!(text.contains("/w/evil\\e]0;owned\\x07\\rname\\u{202e}"), "{text}");
        }
    }
}
