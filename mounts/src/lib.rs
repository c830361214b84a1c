//! lazaret-mounts: the filesystem layer of a Lazaret Domain.
//!
//! * [`sys`]: the syscall wrappers (private mount namespace, overlay, binds
//!   from paths and from fds, unmount). All `unsafe` of the crate is there.

pub mod anchor;
pub mod error;
pub mod git_sentry;
pub mod gitconfig;
pub mod ignore_eval;
pub mod ignored_state;
pub mod plan;
pub mod repo;
pub mod safe_path;
pub mod sys;
pub mod volumes;
pub mod wildmatch;

pub use error::MountError;
pub use sys::{bind_mount, bind_mount_fd, enter_private_mount_namespace, mount_overlay, unmount};
