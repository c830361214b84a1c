//! `lazaret-escalate`, the Escalation Client: runs inside the sandbox and
//! asks the Domain's coordinator, over mutual TLS 1.3, to run one exact
//! command on the host, streaming its stdout and stderr here and exiting
//! with its status. See `--help` for the exit codes.
//!
//! It is built statically (scripts/build-escalate.sh) so that it runs in any
//! image, even one without a C library: it resolves no names (the address
//! is `IP:PORT`) and reads no system files.

#![forbid(unsafe_code)]

mod args;

use std::net::SocketAddr;

use lazaret_protocol::client::{self, say, unavailable, Credentials, Signals};
use lazaret_protocol::escalation::{
    ENV_ADDR, ENV_CA, ENV_CERT, ENV_KEY, ESCALATION_VERSION, EscalationRequest, exit,
};

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

    let env = |name: &str| match std::env::var(name) {
        Ok(value) if !value.is_empty() => Ok(value),
        Ok(_) | Err(std::env::VarError::NotPresent) => Err(format!("not inside a Lazaret session ({name} is not set)")),
        Err(std::env::VarError::NotUnicode(_)) => Err(format!("{name} is not valid UTF-8")),
    };
    let (addr, creds) = match (|| {
        let addr = env(ENV_ADDR)?;
        let creds = Credentials { ca: env(ENV_CA)?, cert: env(ENV_CERT)?, key: env(ENV_KEY)? };
        Ok::<_, String>((addr, creds))
    })() {
        Ok(found) => found,
        Err(reason) => return unavailable(&reason),
    };
    let Ok(addr) = addr.parse::<SocketAddr>() else {
        return unavailable(&format!(
            "{ENV_ADDR} is not IP:PORT: {}",
            lazaret_protocol::display::escaped_str(&addr)
        ));
    };
    let config = match client::config(&creds) {
        Ok(config) => config,
        Err(reason) => return unavailable(&reason),
    };
    // Blocked from here on, so a signal can only cancel, never kill the
    // client with a request in flight.
    let signals = match Signals::block() {
        Ok(signals) => signals,
        Err(e) => return unavailable(&format!("cannot watch for signals: {e}")),
    };
    client::escalate(addr, config, &signals, request)
}

fn usage(message: &str) -> i32 {
    say(message);
    exit::USAGE
}
