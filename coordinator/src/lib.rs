#![forbid(unsafe_code)]
//! Lazaret's coordinator: owns a Domain's host configuration, identity and
//! resources, and drives them through their lifecycle.
//!
//! - [`config`]: the host configuration file, its validation, fingerprint and
//!   ConfigurationConfinement.
//! - [`identity`]: the developer, the workspace, Domain IDs and state paths.
//! - [`context`]: resolving all of the above for one invocation.
//! - [`layout`]: every file name in a Domain's runtime directory.
//! - [`client`]: `lazaret run` as a session, `stop`, `ls`, `debug`.
//! - [`daemon`]: the per-Domain coordinator daemon and its start-up stages.
//! - [`startup`]: what a start looks like to both sides: its stages, the
//!   setup mode, the setup progress lines.
//! - [`transport`]: frames (with file descriptors) over the Domain socket.
//! - [`journal`]: the Domain's journal, driven by the protocol model.
//! - [`trust`]: the Domain's Trust Anchor (ephemeral CA).
//! - [`network`]: the Domain's egress policy and sidecar network.
//! - [`passwd`]: the developer's passwd and group entries inside the sandbox.
//! - [`filesystem`]: State Anchor, Ignored Workspace State, Git Sentry, volumes.
//! - [`images`]: `lazaret image ...`.
//! - [`doctor`]: `lazaret doctor`.
//! - [`escalation`]: host escalation requests, their rules and approvals.
//! - [`workspace_guard`]: the Workspace Guard's configuration and `lazaret audit`.
//!
//! Module dependencies point one way: `client` and `daemon` both use
//! `layout`, `startup` and `transport` but never each other; `daemon` uses `context`,
//! `filesystem`, `network`, `trust`, `journal`, `lock` and `cgroup`.

pub mod cgroup;
pub mod client;
pub mod config;
pub mod context;
pub mod daemon;
pub mod doctor;
pub mod escalation;
pub mod filesystem;
pub mod git_trust;
pub mod identity;
pub mod images;
pub mod journal;
pub mod layout;
pub mod lock;
pub mod network;
pub mod passwd;
pub mod random;
pub mod startup;
pub mod transport;
pub mod trust;
pub mod workspace_guard;

/// Exit status of `lazaret` for its own failures, distinct from the agent's.
pub const LAZARET_FAILED: i32 = lazaret_protocol::session::EXIT_FAILED;

/// Exit status of a coordinator that lost the lock race (another one owns
/// the Domain): the launcher simply connects to that one.
pub const EXIT_BUSY: i32 = 3;
