//! lazaret-mounts: the filesystem layer of a Lazaret Domain.
//!
//! * [`sys`]: syscall wrappers (private mount namespace, overlay, binds from
//!   paths and from fds, unmount). All `unsafe` of the crate is there.
//! * [`safe_path`]: fd-relative, symlink-refusing resolution (`openat2`
//!   with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) for the hostile workspace.
//! * [`ignore_eval`] (with [`wildmatch`] and [`gitconfig`]): which paths git
//!   ignores, decided exactly as git does, without running git.
//! * [`repo`]: locating git directories (`.git` dirs, `gitdir:` files,
//!   linked worktrees validated by their back-link).
//! * [`git_sentry`]: read-only protection of hooks and configuration.
//! * [`guard`]: the run-time Workspace Guard (events + sweep + quarantine).
//! * [`ignored_state`]: Domain storage for ignored paths.
//! * [`anchor`]: State Anchor overlays for `persistent_dirs`.
//! * [`profile_state`]: agent state kept per (developer, profile).
//! * [`plan`]: [`plan::plan_workspace`] and [`plan::assemble`], which produce
//!   the ordered OCI bind list.
//! * [`volumes`]: `HOST:SANDBOX[:ro]` parsing and confinement checks.
//!
//! Call [`enter_private_mount_namespace`] first; open every fd afterwards
//! (the new mount API refuses to clone mounts of another namespace).

#![deny(unsafe_code)]

pub mod anchor;
pub mod error;
pub mod git_sentry;
pub mod gitconfig;
pub mod guard;
pub mod ignore_eval;
pub mod ignored_state;
pub mod plan;
pub mod profile_state;
pub mod repo;
pub mod safe_path;
#[allow(unsafe_code)]
pub mod sys;
pub mod volumes;
pub mod wildmatch;

pub use error::MountError;
pub use plan::{AssembledMounts, BindMount, WorkspaceOptions, WorkspacePlan, assemble, plan_workspace};
pub use sys::{access_as, bind_mount, bind_mount_fd, enter_private_mount_namespace, mount_overlay, mount_proc, unmount};
