//! The `lazaret` command.
fn main() {}
