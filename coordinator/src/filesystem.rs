//! The sandbox's filesystem beyond the rootfs: State Anchor overlays,
//! Ignored Workspace State, Git Sentry and volumes (`lazaret_mounts`),
//! assembled in this process's private mount namespace into the ordered
//! bind list of the OCI bundle.

use std::path::PathBuf;

use lazaret_mounts::ignore_eval::HostGitSettings;
use lazaret_mounts::{anchor, plan, volumes, WorkspaceOptions};
use lazaret_oci::bundle::BindMount;
use lazaret_oci::ImageRecord;

use crate::context::{Context, ContextError};
use crate::layout::RunDir;

/// Why the sandbox's filesystem could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum FilesystemError {
    /// The Domain Root could not be prepared.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// A mount, or a check of the workspace or volumes, failed.
    #[error(transparent)]
    Mount(#[from] lazaret_mounts::MountError),
    /// A directory for mountpoints could not be made.
    #[error("creating {path}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn make_dir(path: PathBuf) -> Result<PathBuf, FilesystemError> {
    match std::fs::create_dir(&path) {
        Ok(()) => Ok(path),
        Err(source) => Err(FilesystemError::Io { path, source }),
    }
}

/// Mounts what the sandbox needs on the host side and returns the binds for
/// the bundle, in order: State Anchor overlays (parents first), then
/// `base` (the workspace and volumes, from [`Context::bundle_spec`]) with
/// the workspace's Ignored Workspace State and Git Sentry binds right after
/// the workspace. Host mountpoints made are appended to `mounted` (for the
/// caller's clean-up). Warnings go to stderr.
pub fn assemble(
    ctx: &Context,
    image: &ImageRecord,
    reset_anchor: bool,
    run_dir: &RunDir,
    mounted: &mut Vec<PathBuf>,
    base: Vec<BindMount>,
) -> Result<Vec<BindMount>, FilesystemError> {
    ctx.paths.ensure_storage().map_err(ContextError::from)?;
    let domain_root = ctx.paths.ensure_domain_root(&ctx.domain_id).map_err(ContextError::from)?;

    let anchor_plan = anchor::prepare_anchor(&domain_root, &ctx.profile.persistent_dirs, &image.digest, reset_anchor)?;
    for w in &anchor_plan.warnings {
        eprintln!("lazaret: warning: {w}");
    }
    let anchor_dir = make_dir(run_dir.anchor())?;
    let anchor_binds = anchor::mount_anchor(&anchor_plan, &image.rootfs, &anchor_dir)?;
    mounted.extend(anchor_binds.iter().map(|b| b.source.clone()));

    let workspace = ctx.workspace.root().to_path_buf();
    let opts = WorkspaceOptions {
        isolate_gitignored: ctx.profile.isolate_gitignored,
        host_git: HostGitSettings::for_home(Some(ctx.developer.home.clone())),
        sandbox_workspace: workspace.clone(),
    };
    let workspace_plan = plan::plan_workspace(&workspace, &domain_root, &opts)?;
    for w in workspace_plan.warnings.iter().chain(&workspace_plan.sentry.warnings) {
        eprintln!("lazaret: warning: {w}");
    }
    let (sentry_host, sentry_sandbox) = volumes::sentry_paths(&workspace_plan);
    let vols: Vec<volumes::Volume> = ctx
        .profile
        .volumes
        .iter()
        .map(|v| volumes::Volume { host: std::fs::canonicalize(&v.host).unwrap_or_else(|_| v.host.clone()), ..v.value.clone() })
        .collect();
    let protected = [ctx.config.storage_root.clone(), ctx.paths.runtime_dir.clone()];
    volumes::validate_volumes(&vols, &ctx.config.file, &sentry_host, &sentry_sandbox, &protected)?;
    let staging = make_dir(run_dir.staging())?;
    let assembled = plan::assemble(&workspace_plan, &staging)?;
    mounted.extend(assembled.staged.iter().cloned());

    let mut binds: Vec<BindMount> = anchor_binds;
    for b in base {
        let is_workspace = b.destination == workspace;
        binds.push(b);
        if is_workspace {
            binds.extend(assembled.binds.iter().cloned());
        }
    }
    Ok(binds)
}
