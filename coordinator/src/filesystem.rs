//! The sandbox's filesystem beyond the rootfs: State Anchor overlays,
//! Ignored Workspace State, Git Sentry and volumes (`lazaret_mounts`),
//! assembled in this process's private mount namespace into the ordered
//! bind list of the OCI bundle.

use std::path::{Path, PathBuf};

use lazaret_mounts::ignore_eval::HostGitSettings;
use lazaret_mounts::ignored_state::{self, IsolationRecord};
use lazaret_mounts::{WorkspaceOptions, anchor, plan, volumes};
use lazaret_oci::ImageRecord;
use lazaret_oci::bundle::BindMount;
use lazaret_protocol::display::escaped;

use crate::context::{Context, ContextError, require_root};
use crate::layout::{DomainDir, RunDir};
use crate::lock::{DomainLock, LockError};

/// Why the sandbox's filesystem could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum FilesystemError {
    /// The Domain Root could not be prepared.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// A mount, or a check of the workspace or volumes, failed.
    #[error(transparent)]
    Mount(#[from] lazaret_mounts::MountError),
    /// `lazaret reset-isolation` while the Domain runs (or starts).
    #[error(
        "profile {profile:?} is running on this workspace; its isolated paths can only be reset while it is stopped\n  hint: stop it with `lazaret stop {profile}` first"
    )]
    ResetWhileRunning {
        /// The profile.
        profile: String,
    },
    /// The Domain lock could not be taken for a reset.
    #[error(transparent)]
    Lock(LockError),
    /// `lazaret reset-profile-state` while a Domain of the profile runs (or starts).
    #[error(
        "a Domain of profile {profile:?} is running (or starting) and uses its profile state; it can only be reset while no Domain of the profile runs\n  hint: `lazaret ls` lists the running Domains; stop each with `lazaret stop {profile}` in its checkout (or `lazaret stop --all`), then run this again"
    )]
    ProfileStateInUse {
        /// The profile.
        profile: String,
    },
    /// The profile state's lock file could not be opened or locked.
    #[error("profile state lock {path}: {source}")]
    ProfileStateLock {
        /// The lock file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
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

/// A Domain's hold on its profile's state: a shared flock on
/// `STORAGE_ROOT/profiles/<uid>/<profile>.lock`, kept while the Domain's
/// filesystem is mounted. Any number of Domains of the profile hold it at
/// once; `lazaret reset-profile-state` needs it exclusively. The kernel
/// drops it when the coordinator dies.
pub struct ProfileStateLock {
    _lock: nix::fcntl::Flock<std::fs::File>,
}

fn profile_state_lock(store: &Path, arg: nix::fcntl::FlockArg) -> Result<Result<ProfileStateLock, ()>, FilesystemError> {
    let mut path = store.as_os_str().to_owned();
    path.push(".lock");
    let path = PathBuf::from(path);
    let file = crate::lock::open_lock_file(&path).map_err(|source| FilesystemError::ProfileStateLock { path: path.clone(), source })?;
    match nix::fcntl::Flock::lock(file, arg) {
        Ok(lock) => Ok(Ok(ProfileStateLock { _lock: lock })),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(Err(())),
        Err((_, errno)) => Err(FilesystemError::ProfileStateLock { path, source: errno.into() }),
    }
}

/// Makes `STORAGE_ROOT/profiles/<uid>` (root's, 0700) if it is missing.
fn ensure_profile_state_parents(ctx_paths: &crate::identity::StatePaths, store: &Path) -> Result<(), FilesystemError> {
    ctx_paths.ensure_storage().map_err(ContextError::from)?;
    let developer_dir = store.parent().unwrap_or(store);
    for dir in [developer_dir.parent().unwrap_or(developer_dir), developer_dir] {
        crate::identity::ensure_private_dir(dir, 0, 0).map_err(ContextError::from)?;
    }
    Ok(())
}

/// The profile's `profile_state` for this Domain: takes the shared lock,
/// makes each entry's directory (the agent's, or for a root agent the
/// developer's; 0700) in the store and
/// returns the binds, one per entry at its place in the agent's home.
/// `None` for a profile without `profile_state`.
pub fn prepare_profile_state(ctx: &Context) -> Result<Option<(ProfileStateLock, Vec<BindMount>)>, FilesystemError> {
    let states = ctx.profile_state();
    if states.is_empty() {
        return Ok(None);
    }
    let store = ctx.profile_state_store();
    ensure_profile_state_parents(&ctx.paths, &store)?;
    // Waits for a reset in progress (it holds the lock for its removal only).
    let Ok(lock) = profile_state_lock(&store, nix::fcntl::FlockArg::LockShared)? else {
        return Err(FilesystemError::ProfileStateInUse { profile: ctx.profile.name.clone() });
    };
    crate::identity::ensure_private_dir(&store, 0, 0).map_err(ContextError::from)?;
    // A root agent's files are the developer's (the Workspace Guard gives
    // them over), so is the directory they are in: its group is what a
    // file made there inherits.
    let (uid, gid) = match ctx.agent_ids() {
        (0, _) => (ctx.developer.uid, ctx.developer.gid),
        ids => ids,
    };
    let entries: Vec<_> = states.iter().map(|s| s.entry.value.clone()).collect();
    let hosts = lazaret_mounts::profile_state::prepare(&store, &entries, uid, gid)?;
    let binds =
        states.into_iter().zip(hosts).map(|(s, host)| BindMount { source: host, destination: s.sandbox, readonly: false }).collect();
    Ok(Some((lock, binds)))
}

/// What [`reset_profile_state`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProfileStateReset {
    /// The profile.
    pub profile: String,
    /// Its state directory (removed, or found absent).
    pub store: PathBuf,
    /// Whether there was anything to remove.
    pub removed: bool,
}

/// `lazaret reset-profile-state PROFILE`: forgets the developer's
/// `profile_state` of `profile` in every checkout (logins, settings). Holds
/// the profile state's lock exclusively meanwhile, so it refuses while any
/// Domain of the profile runs or starts. Nothing the agent left there is
/// followed: the removal never follows a symlink.
pub fn reset_profile_state(config: Option<&Path>, profile: &str) -> Result<ProfileStateReset, FilesystemError> {
    require_root()?;
    let developer = crate::identity::Developer::from_process().map_err(ContextError::from)?;
    let config = crate::context::load_config(config, &developer).map_err(ContextError::from)?;
    let profile = config.profile(profile).map_err(ContextError::from)?.name.clone();
    let paths = crate::identity::StatePaths::new(config.storage_root.clone(), config.runtime_dir(&developer));
    let store = crate::context::profile_state_store(&paths.storage_root, developer.uid, &profile);
    ensure_profile_state_parents(&paths, &store)?;
    let Ok(_lock) = profile_state_lock(&store, nix::fcntl::FlockArg::LockExclusiveNonblock)? else {
        return Err(FilesystemError::ProfileStateInUse { profile });
    };
    let removed = lazaret_mounts::profile_state::remove(&store)?;
    Ok(ProfileStateReset { profile, store, removed })
}

/// Mounts what the sandbox needs on the host side and returns the binds for
/// the bundle, in order: State Anchor overlays (parents first), then
/// `base` (the workspace and volumes, from [`Context::bundle_spec`]) with
/// the workspace's Ignored Workspace State and Git Sentry binds right after
/// the workspace. Host mountpoints made are appended to `mounted` (for the
/// caller's clean-up). Warnings go to stderr; `log_only` writes a line to
/// the Domain's log alone (what sticky isolation kept isolated).
/// `gated_configs`: the repositories' own configs are left writable for
/// the Workspace Guard's gate (only when it runs). Also returns what the
/// Workspace Guard needs of Git Sentry: its git directories outside the
/// workspace, bound read-write (a linked worktree's common directory), and
/// the configs left writable.
#[allow(clippy::too_many_arguments)] // the start-up stage's inputs, each named
pub fn assemble(
    ctx: &Context,
    image: &ImageRecord,
    reset_anchor: bool,
    run_dir: &RunDir,
    mounted: &mut Vec<PathBuf>,
    base: Vec<BindMount>,
    gated_configs: bool,
    log_only: &dyn Fn(&str),
) -> Result<(Vec<BindMount>, SentryForGuard), FilesystemError> {
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
        gate_repository_configs: gated_configs,
    };
    let workspace_plan = plan::plan_workspace(&workspace, &domain_root, &opts)?;
    for w in workspace_plan.warnings.iter().chain(&workspace_plan.sentry.warnings) {
        eprintln!("lazaret: warning: {w}");
    }
    log_sticky(&workspace_plan.sticky, &ctx.profile.name, log_only);
    let (sentry_host, sentry_sandbox) = volumes::sentry_paths(&workspace_plan);
    let vols: Vec<volumes::VolumeMount> = ctx
        .volumes()
        .into_iter()
        .map(|v| volumes::VolumeMount { host: std::fs::canonicalize(&v.host).unwrap_or_else(|_| v.host.clone()), ..v.value })
        .collect();
    let protected = [ctx.config.storage_root.clone(), ctx.paths.runtime_dir.clone()];
    volumes::validate_volumes(&vols, &ctx.config.file, &sentry_host, &sentry_sandbox, &protected)?;
    for v in vols.iter().filter(|v| !v.readonly) {
        if let Some(tool) = agent_state_dir(&v.host, &ctx.developer.home) {
            eprintln!(
                "lazaret: warning: the volume {} shares your own {tool} state read-write: the agent can add hooks, MCP servers or commands there that {tool} then runs on your host, outside any sandbox (make it `:ro` or remove it)",
                lazaret_protocol::display::escaped_str(&v.written)
            );
        }
    }
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
    let sentry = workspace_plan.sentry;
    Ok((binds, SentryForGuard { outside_git_dirs: sentry.outside_git_dirs, gated_configs: sentry.gated_configs }))
}

/// What the Workspace Guard needs of Git Sentry's plan besides the binds.
#[derive(Debug, Clone, Default)]
pub struct SentryForGuard {
    /// Git directories outside the workspace, bound read-write.
    pub outside_git_dirs: Vec<PathBuf>,
    /// Repository configs left writable, with the developer's versions.
    pub gated_configs: Vec<lazaret_mounts::git_sentry::GatedConfig>,
}

/// The agent CLI whose own state directory (where it takes settings that
/// name commands to run: hooks, MCP servers, notify programs) `host` is or
/// lies in, for a developer whose home is `home`.
fn agent_state_dir(host: &Path, home: &Path) -> Option<&'static str> {
    const STATE_DIRS: &[(&str, &str)] = &[
        (".claude", "Claude Code"),
        (".codex", "Codex"),
        (".gemini", "Gemini CLI"),
        (".grok", "Grok CLI"),
        (".config/opencode", "opencode"),
        (".local/share/opencode", "opencode"),
    ];
    let rel = host.strip_prefix(home).ok()?;
    // The volume is in the state directory, is it, or holds it.
    STATE_DIRS.iter().find(|(dir, _)| rel.starts_with(dir) || Path::new(dir).starts_with(rel)).map(|(_, tool)| *tool)
}

/// Tells the developer which paths are isolated only because an earlier
/// start isolated them: each one in the Domain's log, and a one-line
/// summary on the terminal of the session that started the Domain.
fn log_sticky(report: &ignored_state::StickyReport, profile: &str, log_only: &dyn Fn(&str)) {
    let record = report.record_file.display();
    for path in &report.isolated {
        log_only(&format!(
            "sticky isolation: {} stays isolated: the current ignore rules no longer isolate it, but an earlier start did (recorded in {record})",
            escaped(path)
        ));
    }
    for path in &report.absent {
        log_only(&format!(
            "sticky isolation: {} is recorded as isolated but absent from the workspace; it is isolated again at the first start where it exists",
            escaped(path)
        ));
    }
    if report.newly_recorded > 0 {
        log_only(&format!("sticky isolation: {} newly isolated path(s) added to {record}", report.newly_recorded));
    }
    if !report.isolated.is_empty() {
        eprintln!(
            "lazaret: note: {} path(s) stay isolated only because earlier runs isolated them (listed in the Domain's coordinator.log); `lazaret reset-isolation {profile}` forgets them",
            report.isolated.len()
        );
    }
}

/// What the record held when [`reset_isolation`] deleted it.
pub use lazaret_mounts::ignored_state::RecordReset;

/// What [`reset_isolation`] did.
#[derive(Debug, Clone)]
pub struct IsolationReset {
    /// The record file that was deleted (or would have been).
    pub record_file: PathBuf,
    /// What the record held.
    pub outcome: RecordReset,
}

/// `lazaret reset-isolation PROFILE`: forgets which workspace paths the
/// Domain of (profile, workspace of `dir`) isolated in earlier runs, so
/// that from its next start only the current ignore rules apply. Holds the
/// Domain lock meanwhile, so it refuses while the Domain runs or starts.
/// Domain-scoped content of the paths is kept.
pub fn reset_isolation(config: Option<&Path>, profile: Option<&str>, dir: &Path) -> Result<IsolationReset, FilesystemError> {
    require_root()?;
    let ctx = Context::resolve(config, profile, dir)?;
    let domain = DomainDir::new(ctx.domain_runtime_dir()?);
    let _lock = DomainLock::acquire(&domain.lock(), ctx.domain_id.as_str()).map_err(|e| match e {
        LockError::Busy { .. } => FilesystemError::ResetWhileRunning { profile: ctx.profile.name.clone() },
        e => FilesystemError::Lock(e),
    })?;
    let domain_root = ctx.paths.domain_root(&ctx.domain_id);
    let record_file = IsolationRecord::file(&domain_root);
    let outcome = if domain_root.exists() { ignored_state::reset_isolation(&domain_root)? } else { RecordReset::Absent };
    Ok(IsolationReset { record_file, outcome })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_number_of_domains_share_the_profile_state_and_a_reset_waits_for_none() {
        use nix::fcntl::FlockArg::{LockExclusiveNonblock, LockShared};
        let dir = tempfile::tempdir().expect("tempdir");
        let store = dir.path().join("test");
        let first = profile_state_lock(&store, LockShared).expect("lock").expect("shared");
        let second = profile_state_lock(&store, LockShared).expect("lock").expect("shared twice");
        assert!(profile_state_lock(&store, LockExclusiveNonblock).expect("lock").is_err(), "a reset while Domains hold it");
        drop(first);
        assert!(profile_state_lock(&store, LockExclusiveNonblock).expect("lock").is_err(), "one still holds it");
        drop(second);
        let reset = profile_state_lock(&store, LockExclusiveNonblock).expect("lock").expect("free");
        drop(reset);
        assert!(dir.path().join("test.lock").is_file(), "the lock lives beside the store, which a reset removes");
    }

    #[test]
    fn volumes_of_an_agents_own_state_are_named() {
        let home = Path::new("/home/dev");
        let tool = |p: &str| agent_state_dir(Path::new(p), home);
        assert_eq!(tool("/home/dev/.claude"), Some("Claude Code"));
        assert_eq!(tool("/home/dev/.claude/projects"), Some("Claude Code"));
        assert_eq!(tool("/home/dev/.config"), Some("opencode"), "a volume holding the state directory");
        assert_eq!(tool("/home/dev"), Some("Claude Code"), "the whole home holds them all");
        assert_eq!(tool("/home/dev/.codex"), Some("Codex"));
        assert_eq!(tool("/home/dev/.claudex"), None);
        assert_eq!(tool("/home/dev/src/data"), None);
        assert_eq!(tool("/srv/.claude"), None, "not the developer's");
    }
}
