//! Lazaret's coordinator: owns a Domain's host configuration, identity and
//! resources, and drives them through their lifecycle.
//!
//! - [`config`]: the host configuration file, its validation, fingerprint and
//!   ConfigurationConfinement.
//! - [`identity`]: the developer, the workspace, Domain IDs and state paths.
//! - [`context`]: resolving all of the above for one invocation.
//! - [`launch`]: `lazaret run` (request, errors, entry point).
//! - [`daemon`]: the per-Domain coordinator daemon.
//! - [`client`]: `lazaret run` as a session, `stop`, `ls`, `debug`.
//! - [`journal`]: the Domain's journal, driven by the protocol model.
//! - [`trust`]: the Domain's Trust Anchor (ephemeral CA).
//! - [`network`]: the Domain's egress policy and sidecar network.
//! - [`passwd`]: the developer's passwd and group entries inside the sandbox.
//! - [`filesystem`]: State Anchor, Ignored Workspace State, Git Sentry, volumes.
//! - [`images`]: `lazaret image ...`.
//! - [`doctor`]: `lazaret doctor`.

pub mod cgroup;
pub mod client;
pub mod config;
pub mod context;
pub mod daemon;
pub mod doctor;
pub mod filesystem;
pub mod identity;
pub mod images;
pub mod journal;
pub mod launch;
pub mod lock;
pub mod network;
pub mod passwd;
pub mod trust;
