//! Combining Ignored Workspace State and Git Sentry into the ordered list
//! of binds the coordinator puts in the OCI spec, and making the host-side
//! mounts those binds need.

use std::collections::{BTreeSet, HashSet};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::error::MountError;
use crate::git_sentry::{self, SentryPlan};
use crate::ignore_eval::{self, HostGitSettings};
use crate::ignored_state::{self, IgnoredMount, IsolationRecord, StickyReport};
use crate::repo::{self, GitDirPath};
use crate::safe_path::{self, FileKind};
use crate::sys;

/// One bind mount for the OCI spec (the one type shared with `lazaret_oci`,
/// defined in `lazaret_protocol::mount`). Sources made here are valid in the
/// coordinator's private mount namespace (and so for runsc started from it).
pub use lazaret_protocol::mount::BindMount;

/// Options for [`plan_workspace`].
#[derive(Debug, Clone)]
pub struct WorkspaceOptions {
    /// `isolate_gitignored` of the profile (FR-9): false turns Ignored
    /// Workspace State off entirely. Git Sentry is always on.
    pub isolate_gitignored: bool,
    /// The developer's git settings (home, XDG dir, system config).
    pub host_git: HostGitSettings,
    /// Where the workspace is mounted inside the sandbox.
    pub sandbox_workspace: PathBuf,
    /// Leave the repositories' own `config` files writable in the sandbox
    /// ([`SentryPlan::gate_repository_configs`]): only when the Workspace
    /// Guard runs with its gate, which then judges them.
    pub gate_repository_configs: bool,
}

/// What [`plan_workspace`] decided; consumed by [`assemble`].
#[derive(Debug, Clone)]
pub struct WorkspacePlan {
    /// Canonical host path of the workspace.
    pub workspace: PathBuf,
    /// Where the workspace is mounted inside the sandbox.
    pub sandbox_workspace: PathBuf,
    /// Ignored paths to cover with Domain storage.
    pub ignored: Vec<IgnoredMount>,
    /// Git Sentry paths.
    pub sentry: SentryPlan,
    /// Non-fatal findings for the launch log.
    pub warnings: Vec<String>,
    /// What sticky isolation added (paths isolated only because an earlier
    /// start isolated them), for the coordinator's log.
    pub sticky: StickyReport,
}

/// Result of [`assemble`].
#[derive(Debug, Clone, Default)]
pub struct AssembledMounts {
    /// Binds to list in the OCI spec *after* the workspace bind, in this
    /// order (parents before children).
    pub binds: Vec<BindMount>,
    /// Host mountpoints made under the staging dir (released by
    /// [`AssembledMounts::release`] or when the namespace ends).
    pub staged: Vec<PathBuf>,
}

impl AssembledMounts {
    /// Lazily unmounts every staged mount (teardown without ending the
    /// namespace). Errors are collected, not fatal.
    pub fn release(&self) -> Vec<MountError> {
        self.staged.iter().rev().filter_map(|p| sys::unmount(p, true).err()).collect()
    }
}

/// Plans Ignored Workspace State and Git Sentry for `workspace` (a git work
/// tree root; canonical absolute path) with storage in `domain_root`.
///
/// Reads the workspace fd-relatively, never following symlinks; creates
/// missing protectable entries (`.git/hooks`, ...) but mounts nothing.
/// Refuses (naming the path) a layout Git Sentry cannot protect.
pub fn plan_workspace(workspace: &Path, domain_root: &Path, opts: &WorkspaceOptions) -> Result<WorkspacePlan, MountError> {
    if !workspace.is_absolute() || !opts.sandbox_workspace.is_absolute() {
        return Err(MountError::Config("workspace paths must be absolute".into()));
    }
    let root = safe_path::open_root_dir(workspace)?;
    let mut warnings = Vec::new();
    let (ignored, repositories, sticky) = if opts.isolate_gitignored {
        // The record is read before the workspace: an unreadable one stops
        // the start before anything is created there.
        let record = IsolationRecord::load(domain_root)?;
        let scan = ignore_eval::scan_ignored(root.as_fd(), workspace, &opts.host_git)?;
        let (mounts, ignored_warnings) = ignored_state::plan_ignored(&scan, domain_root);
        warnings.extend(scan.warnings);
        warnings.extend(ignored_warnings);
        let merged = ignored_state::merge_recorded(mounts, &record, domain_root, |rel| ignored_state::look_up(root.as_fd(), rel));
        warnings.extend(merged.warnings);
        // Recorded before anything is mounted: a path isolated by this start
        // stays isolated even if the start fails later.
        if merged.record != record {
            merged.record.save(domain_root)?;
        }
        (merged.mounts, scan.repositories, merged.report)
    } else {
        (Vec::new(), ignore_eval::find_repositories(root.as_fd())?, StickyReport::default())
    };
    if repo::locate(root.as_fd(), workspace, Path::new(""))?.is_none() {
        warnings.push(format!(
            "{} is not a git work tree root: no ignore rules and no Git Sentry apply",
            lazaret_protocol::display::escaped(workspace)
        ));
    }
    let mut sentry = git_sentry::discover(root.as_fd(), workspace, &repositories, &opts.host_git)?;
    // A protected path inside an ignored path is not visible in the sandbox.
    sentry.protected.retain(|p| match &p.path {
        GitDirPath::Inside(rel) => !ignored.iter().any(|i| rel.starts_with(&i.workspace_rel)),
        GitDirPath::Outside(_) => true,
    });
    let mut seen = HashSet::new();
    sentry.protected.retain(|p| seen.insert(p.path.clone()));
    if opts.gate_repository_configs {
        sentry.gate_repository_configs(root.as_fd())?;
    }
    sentry.compute_pins();
    pin_above_isolated(&mut sentry, &ignored);
    Ok(WorkspacePlan {
        workspace: workspace.to_owned(),
        sandbox_workspace: opts.sandbox_workspace.clone(),
        ignored,
        sentry,
        warnings,
        sticky,
    })
}

/// Adds a pin for every directory above an isolated path: renaming a mount
/// point fails (EBUSY), so the sandbox cannot `mv app app2` with `app/.env`
/// isolated and so move the host's `.env` to a path that no rule or record
/// isolates at the next start.
fn pin_above_isolated(sentry: &mut SentryPlan, ignored: &[IgnoredMount]) {
    let protected: HashSet<GitDirPath> = sentry.protected.iter().map(|p| p.path.clone()).collect();
    let mut pins: BTreeSet<GitDirPath> = sentry.pinned.drain(..).collect();
    for mount in ignored {
        for ancestor in mount.workspace_rel.ancestors().skip(1) {
            if ancestor.as_os_str().is_empty() {
                break;
            }
            let pin = GitDirPath::Inside(ancestor.to_owned());
            if !protected.contains(&pin) {
                pins.insert(pin);
            }
        }
    }
    sentry.pinned = pins.into_iter().collect();
}

/// Performs the host-side work of a plan inside the private mount
/// namespace: creates ignored-path mount points and storage, and bind-mounts
/// every Git Sentry source (opened fd-relative, symlinks refused) read-only
/// onto a stable path under `staging_dir` (a trusted, host-private directory
/// such as the run directory). Returns the OCI binds in order.
///
/// Call it after [`crate::enter_private_mount_namespace`] and with fds opened
/// in that namespace (it opens its own). Any layout change since planning
/// that would make a mount unsafe is refused, naming the path.
pub fn assemble(plan: &WorkspacePlan, staging_dir: &Path) -> Result<AssembledMounts, MountError> {
    let root = safe_path::open_root_dir(&plan.workspace)?;
    std::fs::create_dir_all(staging_dir).map_err(|e| MountError::io("create", staging_dir, e))?;
    let staging = safe_path::open_root_dir(staging_dir)?;
    let mut out = AssembledMounts::default();
    if let Err(error) = assemble_into(plan, &root, &staging, staging_dir, &mut out) {
        // Do not leave half an assembly mounted.
        let _ = out.release();
        return Err(error);
    }
    // Path ordering is component-wise: a parent sorts before its children.
    out.binds.sort_by(|a, b| a.destination.cmp(&b.destination));
    Ok(out)
}

fn assemble_into(
    plan: &WorkspacePlan,
    root: &OwnedFd,
    staging: &OwnedFd,
    staging_dir: &Path,
    out: &mut AssembledMounts,
) -> Result<(), MountError> {
    for (index, dir) in plan.sentry.outside_git_dirs.iter().enumerate() {
        let source = repo::open_absolute_dir(dir)?;
        let name = format!("gitdir-{index}");
        let target = safe_path::ensure_dir_beneath(staging.as_fd(), Path::new(&name))?;
        sys::bind_mount_fd(source.as_fd(), target.as_fd(), false)?;
        out.staged.push(staging_dir.join(&name));
        out.binds.push(BindMount { source: staging_dir.join(&name), destination: dir.clone(), readonly: false });
    }
    for (index, pin) in plan.sentry.pinned.iter().enumerate() {
        let (source, destination) = match pin {
            GitDirPath::Inside(rel) => (safe_path::open_dir_beneath(root.as_fd(), rel)?, plan.sandbox_workspace.join(rel)),
            GitDirPath::Outside(abs) => (repo::open_absolute_dir(abs)?, abs.clone()),
        };
        let name = format!("pin-{index}");
        let target = safe_path::ensure_dir_beneath(staging.as_fd(), Path::new(&name))?;
        sys::bind_mount_fd(source.as_fd(), target.as_fd(), false)?;
        out.staged.push(staging_dir.join(&name));
        out.binds.push(BindMount { source: staging_dir.join(&name), destination, readonly: false });
    }
    for mount in &plan.ignored {
        ignored_state::prepare(mount, root.as_fd())?;
        out.binds.push(BindMount {
            source: mount.storage.clone(),
            destination: plan.sandbox_workspace.join(&mount.workspace_rel),
            readonly: false,
        });
    }
    for (index, protected) in plan.sentry.protected.iter().enumerate() {
        let (source, destination) = match &protected.path {
            GitDirPath::Inside(rel) => (
                safe_path::open_path_beneath(root.as_fd(), rel)?
                    .ok_or_else(|| MountError::refused(rel, "disappeared while assembling mounts"))?,
                plan.sandbox_workspace.join(rel),
            ),
            GitDirPath::Outside(abs) => {
                let parent = abs.parent().unwrap_or(Path::new("/"));
                let dir = repo::open_absolute_dir(parent)?;
                let name = abs.file_name().map(Path::new).unwrap_or(Path::new("."));
                let fd = safe_path::open_path_beneath(dir.as_fd(), name)?
                    .ok_or_else(|| MountError::refused(abs, "disappeared while assembling mounts"))?;
                (fd, abs.clone())
            }
        };
        let found = safe_path::file_kind(source.as_fd())?;
        if found != protected.kind {
            return Err(MountError::refused(
                destination,
                format!("expected {:?}, found {found:?} (changed while assembling); refusing to mount it", protected.kind),
            ));
        }
        let name = format!("sentry-{index}");
        let target = match protected.kind {
            FileKind::Directory => safe_path::ensure_dir_beneath(staging.as_fd(), Path::new(&name))?,
            _ => safe_path::ensure_file_beneath(staging.as_fd(), Path::new(&name))?,
        };
        sys::bind_mount_fd(source.as_fd(), target.as_fd(), true)?;
        out.staged.push(staging_dir.join(&name));
        out.binds.push(BindMount { source: staging_dir.join(&name), destination, readonly: true });
    }
    Ok(())
}
