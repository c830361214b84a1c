//! Vocabulary shared across crates: one bind mount from the host into a
//! sandbox.
//!
//! `mounts` produces these (State Anchor overlays, Ignored Workspace State,
//! Git Sentry binds), the coordinator adds its own (workspace, volumes, the
//! agent's home) and `oci` writes them into the bundle. The type lives here,
//! in the crate every other crate may depend on, so that `mounts` and `oci`
//! (which must not depend on each other) speak the same word; both re-export
//! it (`lazaret_mounts::plan::BindMount`, `lazaret_oci::bundle::BindMount`).

use std::path::PathBuf;

/// A bind mount from the host into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    /// Host path (absolute), valid in the mount namespace runsc is started
    /// from. Never a `/proc/self/fd` path.
    pub source: PathBuf,
    /// Path inside the container (absolute, not `/`, not under /proc, /sys,
    /// /dev; `oci::bundle` checks this).
    pub destination: PathBuf,
    /// Mount read-only (`ro` option).
    pub readonly: bool,
}
