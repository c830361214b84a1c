//! Lazaret's coordinator: owns a Domain's host configuration, identity and
//! resources, and drives them through the protocol state machine.

pub mod config;
pub mod identity;
