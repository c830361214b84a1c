//! The Lazaret protocol model.
//!
//! `protocol/Lazaret.tla` specifies the application protocol (Domain start-up
//! and teardown, Client Sessions, host escalation, result delivery, terminal
//! routing). This crate is the same state machine in Rust and the one place
//! where its transitions are defined:
//!
//! - [`model`]: constants ([`Config`]), variables ([`State`]), actions
//!   ([`Action`]) with [`step`] / [`enabled`], invariants and liveness
//!   properties, all named as in the TLA+ text;
//! - [`checker`]: an explicit-state checker that explores every reachable
//!   state of a configuration and checks invariants and, under the weak
//!   fairness the specification assumes, liveness;
//! - [`journal`]: the [`Machine`] a coordinator drives before each real
//!   transition, the JSON-lines [`JournalEntry`] it writes, and [`replay`],
//!   which checks a journal against the model (its documentation lists the
//!   exact events a coordinator journals for each outcome of an escalation
//!   request);
//! - [`digest_set`]: identifiers used once, kept as 128-bit digests so
//!   that a long-lived Domain can refuse them again in little memory;
//! - [`display`]: untrusted text (file names, agent-controlled prompt
//!   fields) in messages and prompts, escaped ([`display::inert`]);
//! - [`shell`]: an argv quoted for display and parsed back after the
//!   developer edits it, with no shell and no expansion;
//! - [`session`]: what the coordinator and `lazaret-session-init`, the
//!   per-session subreaper inside the sandbox, agree on;
//! - [`mount`]: vocabulary shared by crates that must not depend on each
//!   other ([`mount::BindMount`], used by `mounts` and `oci`);
//! - `client` (feature `client`): the Escalation Client's request path,
//!   used by `lazaret-escalate` and the benchmark probe.

// Denied, not forbidden: the client's signalfd and poll wrapper
// (`client/sys.rs`, feature `client`) is the one place allowed unsafe code.
#![deny(unsafe_code)]

pub mod checker;
#[cfg(feature = "client")]
pub mod client;
pub mod digest_set;
pub mod display;
pub mod escalation;
pub mod journal;
pub mod model;
pub mod mount;
pub mod session;
pub mod shell;
pub mod utc;
pub mod wire;

pub use checker::{CheckOptions, CheckReport, Trace, Violation, check};
pub use journal::{
    ConformanceError, Event, JournalEntry, Machine, TransitionError, replay, replay_into, replay_reader, replay_reader_into,
};
pub use model::{Action, Config, Invariant, LivenessProperty, Mutation, Refused, State, check_invariants, enabled, step};
