//! `lazaret-escalate`, the Escalation Client: runs inside the sandbox and
//! asks the Domain's coordinator, through its session's escalation broker
//! (`lazaret-session-init`, which holds the session's credentials and
//! speaks mutual TLS 1.3 to the coordinator), to run one exact command on
//! the host, streaming its stdout and stderr here and exiting with its
//! status. See `--help` for the exit codes.
//!
//! It is built statically (scripts/build-escalate.sh) so that it runs in any
//! image, even one without a C library: it resolves no names and reads no
//! system files.

#![forbid(unsafe_code)]

mod args;

use lazaret_protocol::client::{self, Signals, say, unavailable};
use lazaret_protocol::escalation::{ESCALATION_VERSION, EscalationRequest, exit};
use lazaret_protocol::session::ENV_BROKER;

use crate::args::{Parsed, UsageError};

fn main() {
    std::process::exit(run());
}

fn run() -> i32 {
    let invocation = match args::parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(invocation)) => invocation,
        Ok(Parsed::Help) => {
            print!("{}", args::help());
            return 0;
        }
        Ok(Parsed::Version) => {
            println!("lazaret-escalate {}", env!("CARGO_PKG_VERSION"));
            return 0;
        }
        Err(UsageError(message)) => return usage(&message),
    };
    let current = match std::env::current_dir() {
        Ok(dir) => dir,
        Err(e) => return usage(&format!("cannot tell the current directory ({e}); give --cwd DIR as an absolute path")),
    };
    let cwd = args::resolve_cwd(&current, invocation.cwd.as_deref());
    let Some(cwd) = cwd.to_str().map(str::to_owned) else {
        return usage("the working directory is not valid UTF-8");
    };
    let id = match client::request_id() {
        Ok(id) => id,
        Err(reason) => return unavailable(&reason),
    };
    let request = EscalationRequest {
        version: ESCALATION_VERSION,
        id,
        argv: invocation.argv,
        cwd,
        justification: invocation.justification,
        timeout_secs: invocation.timeout_secs,
    };
    if let Err(e) = request.validate() {
        return usage(&e.to_string());
    }

    let broker = match std::env::var(ENV_BROKER) {
        Ok(value) if !value.is_empty() => value,
        Ok(_) | Err(std::env::VarError::NotPresent) => {
            return unavailable(&format!("not inside a Lazaret session ({ENV_BROKER} is not set)"));
        }
        Err(std::env::VarError::NotUnicode(_)) => return unavailable(&format!("{ENV_BROKER} is not valid UTF-8")),
    };
    // Blocked from here on, so a signal can only cancel, never kill the
    // client with a request in flight.
    let signals = match Signals::block() {
        Ok(signals) => signals,
        Err(e) => return unavailable(&format!("cannot watch for signals: {e}")),
    };
    client::escalate(&broker, &signals, request)
}

fn usage(message: &str) -> i32 {
    say(message);
    exit::USAGE
}
