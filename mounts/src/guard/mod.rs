//! The run-time Workspace Guard: observes what the sandbox creates, renames,
//! writes or chmods in the workspace (and in the extra roots: Ignored
//! Workspace State directories, volumes) while a Domain runs, and neutralises
//! within milliseconds whatever could make the host run something the agent
//! chose or carry privileges:
//!
//! * privilege bits: setuid/setgid cleared on regular files, the
//!   `security.capability` xattr removed (directories keep their setgid bit:
//!   it only selects the group of new entries, which is the developer's once
//!   ownership is fixed, and it is normal in shared trees);
//! * ownership: a file not owned by the developer is chowned to them (never
//!   following a symlink); the bit strip runs after, as chown may change bits;
//! * git control: a repository that appears (a `.git` directory or `gitdir:`
//!   file, created or renamed in) gets its config reduced to an allowlist
//!   ([`config_filter`]), its hooks and unexpected control files moved into
//!   the quarantine ([`classify`] decides what is unexpected);
//! * an operation left in progress (rebase, am, cherry-pick, revert): a
//!   sweep neutralises what continuing it on the host would run
//!   ([`git_model::operation_verdict`]);
//! * places: remote URLs, alternates and symlinks of a git dir that lead
//!   out of the workspace are dropped or quarantined ([`git_model`]).
//!
//! What a git directory is and which of its files matter is one model,
//! [`git_model`], checked against git's source.
//! * quarantine: [`quarantine`] keeps what was removed, with a JSON record,
//!   under the Domain Root, and puts it back on explicit request.
//!
//! [`Guard::start`] runs the event loop on its own thread (fanotify with a
//! filesystem mark and directory-handle events, so each event names the
//! writer's pid and only the sandbox's writes are acted on). [`sweep`] walks
//! the roots and applies the same neutralisation to everything (session end,
//! Domain stop, queue overflow, guard restart), without pids.
//!
//! Every path is handled fd-relatively with `O_NOFOLLOW`/`openat2`
//! (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) from a held root fd: the agent
//! races the guard, and no symlink it plants makes the guard act outside a
//! root. Every action is reported as a [`Neutralisation`].

pub mod classify;
pub mod config_filter;
pub mod gate;
pub mod git_model;
mod neutralise;
pub mod quarantine;
mod sweep;
mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use gate::Refusal;
pub use quarantine::{QuarantineLimits, QuarantineRecord, RestoredFile};
pub use sweep::sweep;
pub use watch::{Backend, Guard, probe_backend};

/// What kind of tree a root is; git control checks run where the host's
/// git runs (the workspace, volumes, outside git directories), privilege
/// and ownership checks in every root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RootKind {
    /// The workspace itself.
    Workspace,
    /// An Ignored Workspace State directory in Domain storage.
    IgnoredState,
    /// A volume (`HOST:SANDBOX`). Git Sentry protects nothing in it, so a
    /// sweep (which cannot tell writers apart) checks only the git control
    /// files that changed during the run: the developer's older ones are
    /// theirs.
    Volume,
    /// A git directory outside the workspace that Git Sentry binds
    /// read-write (the common directory of a workspace that is a linked
    /// worktree): the host's git reads it in the developer's other work
    /// trees of that repository (the main checkout, other worktrees, its
    /// submodules), so git control checks run here too, with the root
    /// itself a git directory. Its own `config`, `hooks/` and `info/` are
    /// the developer's and never touched (Git Sentry keeps them read-only);
    /// `gitdir` back-links in it are the developer's worktrees' and name
    /// their work trees anywhere (kept when of the form git writes).
    GitDir,
}

impl RootKind {
    /// Whether the host's git reads this tree (git control checks apply).
    pub fn has_git_control(self) -> bool {
        matches!(self, RootKind::Workspace | RootKind::GitDir | RootKind::Volume)
    }
}

/// One tree the guard watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardRoot {
    /// A short stable name for records and messages (`workspace`,
    /// `ignored:node_modules`, `volume:/data`, ...); unique in a config.
    pub label: String,
    /// Canonical absolute host path of the root (a real directory: a
    /// symlink is refused when the root is opened).
    pub path: PathBuf,
    /// What the tree is.
    pub kind: RootKind,
}

/// The owner files must have on the host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    /// The developer's uid.
    pub uid: u32,
    /// The developer's primary gid.
    pub gid: u32,
}

/// Everything the guard needs for one Domain. Build it with
/// `GuardConfig { roots, developer, quarantine_dir, ..Default::default() }`
/// so that fields added later keep compiling.
#[derive(Debug, Clone, Default)]
pub struct GuardConfig {
    /// The watched trees. Exactly one [`RootKind::Workspace`] root is
    /// expected (git control checks need it); the others are optional.
    pub roots: Vec<GuardRoot>,
    /// Who must own what the sandbox creates.
    pub developer: Owner,
    /// The quarantine directory (under the Domain Root; created if missing,
    /// mode 0700). Trusted path, opened once.
    pub quarantine_dir: PathBuf,
    /// How much the quarantine keeps before it drops the oldest copies
    /// (their records stay).
    pub quarantine_limits: QuarantineLimits,
    /// The paths Git Sentry binds read-only (its `SentryPlan::protected`):
    /// workspace-relative below the workspace, absolute below a
    /// [`RootKind::GitDir`] root. The guard never modifies them or anything
    /// below them (they are the developer's own and the sandbox cannot
    /// write them anyway).
    pub protected: Vec<PathBuf>,
    /// When the Domain started: [`sweep`] fixes privilege bits and
    /// ownership only on files whose ctime is at or after this (so the
    /// developer's own older setuid files are left alone); `None` means
    /// everything. Git control files are always checked.
    pub changed_since: Option<SystemTime>,
    /// Git directories outside the workspace that Git Sentry binds
    /// read-write (its `SentryPlan::outside_git_dirs`, linked worktrees of
    /// an outside repository): a new `gitdir:` file pointing below one of
    /// them is accepted. They are not watched themselves.
    pub outside_git_dirs: Vec<PathBuf>,
    /// The `core.hooksPath` values of the developer's own (system and
    /// global) git configuration, as written. A relative one names a
    /// hooks directory in every repository, including those the sandbox
    /// makes: hooks there are quarantined
    /// ([`git_model::host_hook_dirs`]).
    pub host_hooks_paths: Vec<String>,
    /// Gate host opens of git control files until the guard has decided
    /// on them ([`gate`]); `None`: the guard acts after the fact only.
    pub gate: Option<GateConfig>,
    /// Repository configs in the workspace that the sandbox may write (Git
    /// Sentry's `gated_configs`; only with a gate, which keeps host opens
    /// of the sandbox's versions until the guard has judged them). Each
    /// version the sandbox writes is filtered against the developer's
    /// (their entries kept, the sandbox's allowlisted); a sweep leaves one
    /// that is unchanged since the start, the guard's sealed copy or the
    /// developer's own write, and puts the developer's version back where
    /// the config is missing.
    pub developer_configs: Vec<crate::git_sentry::GatedConfig>,
}

/// How the gate reaches the host's mounts.
#[derive(Debug, Clone, Default)]
pub struct GateConfig {
    /// An fd of `/` in the mount namespace whose processes are gated (the
    /// developer's), opened before the caller entered a private one;
    /// `None`: this process's own `/`.
    pub host_root: Option<Arc<std::os::fd::OwnedFd>>,
    /// With `host_root`, gate this process's own mount namespace as well:
    /// the processes the caller starts there (the coordinator's escalated
    /// host commands) reach the roots through its own copies of the mounts,
    /// which the marks through `host_root` do not cover. This process's own
    /// opens are allowed at once all the same.
    pub this_namespace_too: bool,
}

/// Decides whether a pid belongs to the sandbox (for the coordinator: "is
/// in this Domain's runsc cgroup"; runsc's gofer or, with directfs, the
/// sandbox process does the host-side file operations). Called from the
/// guard thread for every event of the watched filesystems, so keep it
/// cheap; a pid that has already exited may be passed.
pub type PidFilter = Arc<dyn Fn(u32) -> bool + Send + Sync>;

/// Receives what the guard thread does, in order.
pub type EventSink = Box<dyn FnMut(GuardEvent) + Send>;

/// What the guard thread reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardEvent {
    /// Something was neutralised.
    Neutralised(Neutralisation),
    /// The kernel's event queue overflowed; the guard ran a full sweep
    /// (its neutralisations are reported before this event).
    Overflow {
        /// How long that sweep took.
        sweep_time: Duration,
    },
    /// The gate refused a host process's open (see [`gate`]).
    Refused(Refusal),
    /// The guard's thread failed (it panicked, with this message) and
    /// stopped: nothing the sandbox writes is judged any more, and the gate
    /// refuses what waits for it. The caller must stop the sandbox; the
    /// final sweep of [`Guard::stop`] still runs.
    Failed(String),
    /// An event could not be handled (the path was not neutralised; the
    /// next sweep retries it). Shown, not fatal.
    Error(String),
}

/// One thing the guard did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Neutralisation {
    /// The [`GuardRoot::label`] of the tree.
    pub root: String,
    /// Path relative to that root.
    pub path: PathBuf,
    /// What was done.
    pub action: Action,
    /// Why, in words, for the journal and the terminal line.
    pub reason: String,
    /// The quarantine entry holding the removed content, if any.
    pub quarantine_id: Option<String>,
    /// The writer's pid when the action followed an event; `None` for a sweep.
    pub pid: Option<u32>,
}

/// The typed part of a [`Neutralisation`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Action {
    /// setuid/setgid bits cleared (modes are `st_mode & 0o7777`).
    ClearedPrivilegeBits {
        /// Mode before.
        old_mode: u32,
        /// Mode after.
        new_mode: u32,
    },
    /// The `security.capability` xattr was removed.
    RemovedFileCapabilities,
    /// Ownership changed to the developer.
    ChangedOwner {
        /// Previous uid.
        old_uid: u32,
        /// Previous gid.
        old_gid: u32,
    },
    /// A git config was rewritten to the allowlist; the original is in the
    /// quarantine.
    FilteredGitConfig {
        /// `section[.subsection].key` of every dropped entry.
        dropped_keys: Vec<String>,
    },
    /// The file (or symlink) was moved into the quarantine.
    Quarantined,
    /// A gated repository config was missing (the sandbox removed it or
    /// moved it away): the developer's version was put back.
    RestoredDeveloperConfig,
    /// The `exec` steps of a rebase todo list were turned into comments;
    /// the original is in the quarantine.
    DisabledRebaseExec {
        /// The commands of those steps.
        commands: Vec<String>,
    },
}

impl Neutralisation {
    /// One line for a session terminal (no newline; the path escaped).
    pub fn summary(&self) -> String {
        let path = lazaret_protocol::display::escaped(&self.path);
        let what = match &self.action {
            Action::ClearedPrivilegeBits { old_mode, new_mode } => {
                format!("cleared setuid/setgid ({old_mode:o} -> {new_mode:o})")
            }
            Action::RemovedFileCapabilities => "removed file capabilities".to_owned(),
            Action::ChangedOwner { old_uid, old_gid } => format!("changed owner from {old_uid}:{old_gid} to the developer"),
            Action::FilteredGitConfig { dropped_keys } if dropped_keys.is_empty() => "rewrote git config (nothing dropped)".to_owned(),
            Action::FilteredGitConfig { dropped_keys } => {
                format!("filtered git config (dropped {})", dropped_keys.join(", "))
            }
            Action::Quarantined => "quarantined".to_owned(),
            Action::RestoredDeveloperConfig => "put the developer's git config back".to_owned(),
            Action::DisabledRebaseExec { commands } => format!("disabled {} exec step(s) of a rebase in progress", commands.len()),
        };
        let id = self.quarantine_id.as_deref().map(|id| format!(" [quarantine {id}]")).unwrap_or_default();
        format!("workspace guard: {}:{path}: {what}: {}{id}", self.root, self.reason)
    }
}

/// What [`sweep`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Every neutralisation, in walk order.
    pub neutralised: Vec<Neutralisation>,
    /// Paths that could not be handled (message per path); the sweep goes on.
    pub errors: Vec<String>,
    /// Directory entries examined.
    pub entries_seen: u64,
    /// Wall time of the sweep.
    pub duration: Duration,
}

/// The guard's errors.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// A filesystem operation failed.
    #[error(transparent)]
    Mount(#[from] crate::error::MountError),
    /// The filesystem of a root cannot be watched the way the guard needs.
    #[error("cannot watch {}: {reason}", lazaret_protocol::display::escaped(path))]
    Unsupported {
        /// The root.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The configuration is unusable (no workspace root, duplicate labels, ...).
    #[error("workspace guard configuration: {0}")]
    Config(String),
    /// A quarantine entry is missing, malformed or cannot be restored.
    #[error("quarantine {id}: {reason}")]
    Quarantine {
        /// The entry's id.
        id: String,
        /// Why.
        reason: String,
    },
    /// Not implemented yet (skeleton).
    #[error("workspace guard: {0} is not implemented yet")]
    NotYet(&'static str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_one_escaped_line() {
        let n = Neutralisation {
            root: "workspace".into(),
            path: PathBuf::from("a/\x1b[31mevil\nname"),
            action: Action::Quarantined,
            reason: "a git hook the sandbox planted".into(),
            quarantine_id: Some("20261201T000000Z-000000001-0".into()),
            pid: Some(7),
        };
        let line = n.summary();
        assert!(!line.contains('\n') && !line.contains('\x1b'), "{line:?}");
        assert!(line.contains("quarantined") && line.contains("[quarantine 20261201T000000Z-000000001-0]"), "{line}");
        let json = serde_json::to_string(&n.action).expect("json");
        assert_eq!(json, r#"{"kind":"quarantined"}"#);
    }
}
