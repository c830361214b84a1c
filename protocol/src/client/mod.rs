//! The Escalation Client's side of a request (feature `client`): what
//! `lazaret-escalate` does once its command line is parsed, as a library,
//! so that the benchmark probe can time the very same path many times in
//! one process; and the session's escalation broker ([`relay`]) that
//! `lazaret-session-init` runs.
//!
//! [`escalate`] connects to the session's broker (named by
//! [`crate::session::ENV_BROKER`]), sends one [`EscalationRequest`], streams
//! the host command's output to this process's stdout and stderr as it
//! arrives and returns the exit code `lazaret-escalate` exits with (see
//! [`crate::escalation::exit`]). A cancelling signal ([`Signals`]) cancels
//! the request. The broker holds the session's credentials ([`config`]
//! builds its TLS configuration: TLS 1.3 only, the ring provider, the
//! Domain CA as the only trust root, the session certificate as client
//! authentication, no resumption) and makes a full handshake per request.
//!
//! ```no_run
//! use lazaret_protocol::client::{self, Signals};
//! use lazaret_protocol::escalation::{EscalationRequest, ESCALATION_VERSION};
//! # fn main() -> Result<(), String> {
//! let signals = Signals::block().map_err(|e| e.to_string())?;
//! let request = EscalationRequest {
//!     version: ESCALATION_VERSION,
//!     id: client::request_id()?,
//!     argv: vec!["git".into(), "fetch".into()],
//!     cwd: "/home/dev/project".into(),
//!     justification: String::new(),
//!     timeout_secs: None,
//! };
//! let code = client::escalate("@lazaret-escalate/0123", &signals, request);
//! std::process::exit(code);
//! # }
//! ```

pub mod relay;
mod session;
mod sys;
mod tls;

use std::os::fd::OwnedFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::time::Duration;

use crate::escalation::EscalationRequest;

pub use session::BROKEN_PIPE;
pub use tls::{Credentials, config, request_id};

/// How long the broker waits for the TCP connection to the coordinator.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Prints `lazaret-escalate: LINE` on stderr.
pub fn say(line: &str) {
    eprintln!("lazaret-escalate: {line}");
}

/// Prints `unavailable: REASON` and returns its exit code
/// ([`crate::escalation::exit::UNAVAILABLE`]).
pub fn unavailable(reason: &str) -> i32 {
    session::unavailable(reason)
}

/// The cancelling signals (SIGINT, SIGTERM, SIGHUP), blocked for the
/// calling thread and delivered through a signalfd that [`escalate`] waits
/// on with the connection: from then on a signal cancels the request, it
/// never kills the client with a request in flight.
pub struct Signals(OwnedFd);

impl Signals {
    /// Blocks the cancelling signals (call it on the only thread).
    pub fn block() -> std::io::Result<Signals> {
        sys::block_into_signalfd(&[libc::SIGINT, libc::SIGTERM, libc::SIGHUP]).map(Signals)
    }
}

/// Runs `request` through the session's broker `broker` (`@NAME`, the
/// value of [`crate::session::ENV_BROKER`]), streaming the host command's
/// output to stdout and stderr, and returns the exit code; every ending
/// other than the host command's own status has printed its one line on
/// stderr.
pub fn escalate(broker: &str, signals: &Signals, request: EscalationRequest) -> i32 {
    let Some(name) = broker.strip_prefix('@') else {
        return unavailable(&format!("{} is not an abstract socket name (@NAME)", crate::session::ENV_BROKER));
    };
    let sock = match UnixAddr::from_abstract_name(name.as_bytes()).and_then(|a| UnixStream::connect_addr(&a)) {
        Ok(sock) => sock,
        Err(e) => return unavailable(&format!("cannot reach this session's escalation broker: {e}")),
    };
    // The broker serves only its own session's processes, by the
    // credentials the kernel attaches to what this process sends.
    if let Err(e) = sys::pass_credentials(&sock).and_then(|()| sock.set_nonblocking(true)) {
        return unavailable(&format!("cannot set up the connection: {e}"));
    }
    session::run(sock, &signals.0, request)
}
