//! Host escalation: requests from inside the sandbox to run a command on the
//! host as the developer.
//!
//! - [`rules`]: auto-approval rules and the approvals held for a Domain's life.

pub mod rules;
