//! Host escalation: requests from inside the sandbox to run a command on the
//! host as the developer.
//!
//! - [`rules`]: auto-approval rules and the approvals held for a Domain's life.
//! - [`environment`]: the small, fixed environment of a host command.
//! - [`channel`]: one escalation connection's frames over rustls, from two
//!   threads at once.
//! - [`repository`]: the repository a host command would run git in, which
//!   must be one Git Sentry protects.
//!
//! The request lifecycle itself (admission, prompt, host execution, result)
//! is the daemon's (`daemon::escalation`).

pub mod channel;
pub mod environment;
pub mod repository;
pub mod rules;
