//! The Escalation Client's side of a request (feature `client`): what
//! `lazaret-escalate` does once its command line is parsed, as a library,
//! so that the benchmark probe can time the very same path many times in
//! one process.
//!
//! [`config`] builds the TLS configuration from the session's credentials
//! (TLS 1.3 only, the ring provider, the Domain CA as the only trust root,
//! the session certificate as client authentication, no resumption);
//! [`escalate`] connects, performs a full handshake, sends one
//! [`EscalationRequest`], streams the host command's output to this
//! process's stdout and stderr as it arrives and returns the exit code
//! `lazaret-escalate` exits with (see [`crate::escalation::exit`]). A
//! cancelling signal ([`Signals`]) cancels the request.
//!
//! ```no_run
//! use lazaret_protocol::client::{self, Credentials, Signals};
//! use lazaret_protocol::escalation::{EscalationRequest, ESCALATION_VERSION};
//! # fn main() -> Result<(), String> {
//! let creds = Credentials { ca: "PEM".into(), cert: "PEM".into(), key: "PEM".into() };
//! let config = client::config(&creds)?;
//! let signals = Signals::block().map_err(|e| e.to_string())?;
//! let request = EscalationRequest {
//!     version: ESCALATION_VERSION,
//!     id: client::request_id()?,
//!     argv: vec!["git".into(), "fetch".into()],
//!     cwd: "/home/dev/project".into(),
//!     justification: String::new(),
//!     timeout_secs: None,
//! };
//! let code = client::escalate("10.0.0.1:4000".parse().map_err(|_| "address")?, config, &signals, request);
//! std::process::exit(code);
//! # }
//! ```

mod session;
mod sys;
mod tls;

use std::net::{SocketAddr, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

use crate::escalation::EscalationRequest;

pub use session::BROKEN_PIPE;
pub use tls::{Credentials, config, request_id};

/// How long to wait for the TCP connection to the coordinator.
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

/// Runs `request` through the coordinator at `addr` over a new mutual-TLS
/// connection (a full handshake: `config` from [`config`] resumes
/// nothing), streaming the host command's output to stdout and stderr, and
/// returns the exit code; every ending other than the host command's own
/// status has printed its one line on stderr.
pub fn escalate(addr: SocketAddr, config: Arc<ClientConfig>, signals: &Signals, request: EscalationRequest) -> i32 {
    // The coordinator's certificate names the address it listens on.
    let server_name = ServerName::IpAddress(addr.ip().into());
    let tls = match ClientConnection::new(config, server_name) {
        Ok(tls) => tls,
        Err(e) => return unavailable(&format!("TLS configuration: {e}")),
    };
    let sock = match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
        Ok(sock) => sock,
        Err(e) => return unavailable(&format!("cannot reach Lazaret at {addr}: {e}")),
    };
    if let Err(e) = sock.set_nonblocking(true) {
        return unavailable(&format!("cannot set up the connection: {e}"));
    }
    // Output chunks are small and latency matters more than throughput.
    let _ = sock.set_nodelay(true);
    session::run(sock, tls, &signals.0, request)
}
