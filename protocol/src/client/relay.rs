//! The session's escalation broker (run by `lazaret-session-init`): it
//! holds the session's credentials and carries the plain frames of its own
//! session's `lazaret-escalate` processes over mutual TLS to the
//! coordinator.
//!
//! Why a broker: every process of every session runs as the same uid in one
//! sandbox, so anything one agent process holds (its environment, its
//! memory, its descriptors through `/proc/PID/fd`) another session's
//! process can read. The broker runs as root inside the sandbox (see
//! [`crate::session::USER_OPTION`]): the key never reaches a process of the
//! agent's uid, and the broker serves a connection only when the process
//! that sent its first bytes descends from this session's init, so one
//! session can neither use another's certificate nor make a prompt appear
//! on another's terminal.
//!
//! Who sent the bytes is the kernel's word: both sides turn `SO_PASSCRED`
//! on and the broker reads the `SCM_CREDENTIALS` the kernel attached to
//! them (a process cannot claim another's PID without `CAP_SYS_ADMIN`, and
//! gVisor names the sending task itself). Not `SO_PEERCRED`: gVisor
//! 20240729 answers it with the caller's own credentials.
//!
//! The listening socket is abstract (`@lazaret-escalate/<random>`, named to
//! the agent in [`crate::session::ENV_BROKER`]): it needs no file the agent
//! could replace, and the random name keeps another session from taking it
//! first.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

use crate::escalation::{EscalationResult, Outcome, ServerFrame, write_server};
use crate::session::descends_from;

use super::{CONNECT_TIMEOUT, sys};

/// How long the TLS handshake may take once connected (see the client's).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Plain bytes from the client held for TLS before reading pauses.
const MAX_PENDING: usize = 1024 * 1024;
/// How long a client may take to send its first bytes (`lazaret-escalate`
/// sends them as soon as it is connected).
const FIRST_BYTES_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections whose first bytes have not come yet: past this, the oldest
/// is closed for a new one. Anyone in the sandbox can connect, so these
/// are kept apart from (and never count against) the relayed ones.
const MAX_UNCHECKED: usize = 16;
/// Connections relayed at once (each from a process of this session);
/// more are refused (the session could otherwise open connections until
/// this broker runs out of threads).
const MAX_CONNECTIONS: usize = 64;
/// How long the last bytes to the coordinator may wait for its socket.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);
/// The pause after a failed accept (say, out of descriptors), so that a
/// failure that persists does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The broker's listening socket and what it connects with.
pub struct Broker {
    listener: UnixListener,
    coordinator: SocketAddr,
    config: Arc<ClientConfig>,
    /// Connections being relayed.
    active: Arc<AtomicUsize>,
}

impl Broker {
    /// Listens on a new abstract socket; returns the broker and the value
    /// of [`crate::session::ENV_BROKER`] (`@NAME`).
    pub fn bind(coordinator: SocketAddr, config: Arc<ClientConfig>) -> Result<(Broker, String), String> {
        let name = format!("lazaret-escalate/{}", super::request_id()?);
        let addr = UnixAddr::from_abstract_name(name.as_bytes()).map_err(|e| format!("broker socket name: {e}"))?;
        let listener = UnixListener::bind_addr(&addr).map_err(|e| format!("cannot listen for escalation requests: {e}"))?;
        Ok((Broker { listener, coordinator, config, active: Arc::new(AtomicUsize::new(0)) }, format!("@{name}")))
    }

    /// Serves connections until the process ends: each from a descendant
    /// of `session_init` (this process) in a thread of its own, any other
    /// refused with a Result that says why.
    ///
    /// One thread accepts and waits for every connection's first bytes
    /// (at most [`MAX_UNCHECKED`] at a time, for [`FIRST_BYTES_TIMEOUT`]
    /// each), so connections of another session that send nothing hold
    /// neither a thread nor a relay slot.
    pub fn serve(&self, session_init: i32) {
        let active = &self.active;
        // In the order accepted, with the time each must have sent by.
        let mut unchecked: VecDeque<(UnixStream, Instant)> = VecDeque::new();
        // Accepted only when poll says one is there, but it may be gone
        // by then (ECONNABORTED): never block in accept.
        let _ = self.listener.set_nonblocking(true);
        loop {
            let now = Instant::now();
            unchecked.retain(|(_, deadline)| *deadline > now);
            let mut fds = Vec::with_capacity(unchecked.len() + 1);
            fds.push(sys::interest(self.listener.as_raw_fd(), true, false));
            fds.extend(unchecked.iter().map(|(client, _)| sys::interest(client.as_raw_fd(), true, false)));
            let timeout = unchecked.iter().map(|(_, deadline)| deadline.saturating_duration_since(now)).min();
            if sys::poll(&mut fds, timeout).is_err() {
                std::thread::sleep(ACCEPT_BACKOFF);
                continue;
            }
            // The ones with bytes (or closed), newest first so that the
            // indices left to visit stay valid as they are taken out.
            for i in (1..fds.len()).rev() {
                if sys::ready(&fds[i]) {
                    if let Some((client, deadline)) = unchecked.remove(i - 1) {
                        if let Some(client) = self.check(client, session_init, active) {
                            unchecked.push_back((client, deadline));
                        }
                    }
                }
            }
            if !sys::ready(&fds[0]) {
                continue;
            }
            match self.listener.accept() {
                Ok((client, _)) => {
                    let ready = client.set_nonblocking(true).and_then(|()| sys::pass_credentials(&client));
                    if ready.is_err() {
                        continue;
                    }
                    if unchecked.len() >= MAX_UNCHECKED {
                        unchecked.pop_front();
                    }
                    unchecked.push_back((client, Instant::now() + FIRST_BYTES_TIMEOUT));
                }
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted) => {
                }
                Err(_) => std::thread::sleep(ACCEPT_BACKOFF),
            }
        }
    }

    /// Waits (at most `limit`) until no connection is being relayed: when
    /// the session's last process has just asked, given up or been
    /// cancelled, its relay still has to pass that on to the coordinator
    /// before this process (the session's init) exits and takes the relay
    /// thread with it.
    pub fn wait_idle(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Reads the first bytes of `client` (non-blocking, with
    /// `SO_PASSCRED` on) and relays it in a thread of its own when a
    /// descendant of `session_init` sent them, or refuses or closes it.
    /// Returns the client when nothing has come yet after all.
    fn check(&self, client: UnixStream, session_init: i32, active: &Arc<AtomicUsize>) -> Option<UnixStream> {
        let mut first = vec![0u8; 16 * 1024];
        let (n, sender) = match sys::receive_with_sender(&client, &mut first) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(client),
            Err(_) => return None,
        };
        if n == 0 {
            return None;
        }
        if !sender.is_some_and(|pid| descends_from(pid, session_init, parent_pid)) {
            refuse(client, "the escalation broker serves only processes of its own session");
            return None;
        }
        if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::SeqCst);
            refuse(client, "this session's escalation broker is busy");
            return None;
        }
        first.truncate(n);
        let (coordinator, config, count) = (self.coordinator, self.config.clone(), active.clone());
        let spawned = std::thread::Builder::new().name("relay".into()).spawn(move || {
            relay(client, first, coordinator, config);
            count.fetch_sub(1, Ordering::SeqCst);
        });
        if spawned.is_err() {
            // The client sees its connection close: unavailable.
            active.fetch_sub(1, Ordering::SeqCst);
        }
        None
    }
}

impl AsRawFd for Broker {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.listener.as_raw_fd()
    }
}

/// The parent PID of `pid` from `/proc/PID/stat`.
fn parent_pid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    crate::session::parent_from_stat(&stat)
}

/// Answers `client` (non-blocking) with a Refused result and closes it.
/// Without waiting: the accepting thread refuses, and no client may hold
/// it up (a fresh connection has room for one frame).
fn refuse(mut client: UnixStream, reason: &str) {
    write_result(&mut client, Outcome::Refused { reason: reason.into() });
}

/// Sends `client` a Result of its own (nothing from the coordinator has
/// reached it) and closes it.
fn answer(mut client: UnixStream, outcome: Outcome) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_write_timeout(Some(Duration::from_secs(1)));
    write_result(&mut client, outcome);
}

/// A Result frame of the broker's own, on `client` as it is (blocking or
/// not); a client that went away gets nothing.
fn write_result(client: &mut UnixStream, outcome: Outcome) {
    let _ = write_server(client, &ServerFrame::Result(EscalationResult { outcome, truncated: false }));
}

/// Carries one client's plain bytes (`first`, then what follows) to the
/// coordinator over TLS and the answers back, until either side closes
/// (the client closing cancels its request, as closing the TLS connection
/// always has). When it fails before anything of the coordinator's reached
/// the client, the client gets an Unavailable result that says why.
fn relay(client: UnixStream, first: Vec<u8>, coordinator: SocketAddr, config: Arc<ClientConfig>) {
    let fail = |client, reason: String| answer(client, Outcome::Unavailable { reason });
    let server_name = ServerName::IpAddress(coordinator.ip().into());
    let mut tls = match ClientConnection::new(config, server_name) {
        Ok(tls) => tls,
        Err(e) => return fail(client, format!("TLS configuration: {e}")),
    };
    tls.set_buffer_limit(None);
    if let Err(e) = tls.writer().write_all(&first) {
        return fail(client, format!("cannot send the request: {e}"));
    }
    let sock = match TcpStream::connect_timeout(&coordinator, CONNECT_TIMEOUT) {
        Ok(sock) => sock,
        Err(e) => return fail(client, format!("cannot reach Lazaret at {coordinator}: {e}")),
    };
    if let Err(e) = sock.set_nonblocking(true).and_then(|()| client.set_nonblocking(true)) {
        return fail(client, format!("cannot set up the connection: {e}"));
    }
    // Output chunks are small and latency matters more than throughput.
    let _ = sock.set_nodelay(true);
    let mut pump = Pump { client, sock, tls, to_client: Vec::new(), client_done: false, relayed: false };
    if let Err(reason) = pump.run() {
        if !pump.relayed {
            fail(pump.client, reason);
        }
    }
}

struct Pump {
    client: UnixStream,
    sock: TcpStream,
    tls: ClientConnection,
    /// Decrypted bytes not yet written to the client.
    to_client: Vec<u8>,
    /// The client has closed its side.
    client_done: bool,
    /// Something of the coordinator's has been passed to the client.
    relayed: bool,
}

impl Pump {
    /// Pumps until done; the error is a one-line reason for the client.
    fn run(&mut self) -> Result<(), String> {
        let lost = |e: io::Error| format!("lost the connection to Lazaret: {e}");
        let handshake_deadline = Instant::now() + HANDSHAKE_TIMEOUT;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            self.flush_tls().map_err(lost)?;
            if let Err(e) = self.flush_client() {
                // The client went away, maybe after sending more (its
                // Cancel, when its own output closed): that still reaches
                // the coordinator, then the connection closes as on the
                // client's end.
                self.to_client.clear();
                self.forward_rest_of_client(&mut buf);
                self.close_tls();
                return Err(format!("the client went away: {e}"));
            }
            let now = Instant::now();
            let handshaking = self.tls.is_handshaking();
            if handshaking && now >= handshake_deadline {
                return Err("the TLS handshake with Lazaret timed out".into());
            }
            let pending = self.tls.wants_write();
            let mut fds = [
                sys::interest(self.sock.as_raw_fd(), true, pending),
                sys::interest(self.client.as_raw_fd(), !self.client_done && !pending, !self.to_client.is_empty()),
            ];
            let timeout = handshaking.then(|| handshake_deadline.saturating_duration_since(now));
            sys::poll(&mut fds, timeout).map_err(|e| format!("cannot wait for Lazaret: {e}"))?;
            if sys::ready(&fds[1]) && !self.client_done && !pending {
                match self.client.read(&mut buf) {
                    Ok(0) => {
                        // The client left: closing the TLS connection tells
                        // the coordinator to cancel whatever is under way.
                        self.client_done = true;
                        self.close_tls();
                        return Ok(());
                    }
                    Ok(n) => self.tls.writer().write_all(&buf[..n]).map_err(lost)?,
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
                    Err(e) => return Err(format!("the client went away: {e}")),
                }
            }
            if sys::ready(&fds[0]) {
                let closed = match self.tls.read_tls(&mut self.sock) {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => false,
                    Err(e) => return Err(lost(e)),
                };
                if let Err(e) = self.tls.process_new_packets() {
                    // Tell the coordinator why (the alert rustls queued).
                    let _ = self.flush_tls();
                    return Err(format!("TLS with Lazaret failed: {e}"));
                }
                loop {
                    match self.tls.reader().read(&mut buf) {
                        Ok(0) => return self.finish(),
                        Ok(n) => {
                            self.relayed = true;
                            self.to_client.extend_from_slice(&buf[..n]);
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return self.finish(),
                        Err(e) => return Err(lost(e)),
                    }
                }
                if closed {
                    return self.finish();
                }
                if self.to_client.len() > MAX_PENDING {
                    // A client that stopped reading: block on it rather than
                    // buffer without bound.
                    let blocking = |pump: &mut Pump| -> io::Result<()> {
                        pump.client.set_nonblocking(false)?;
                        pump.flush_client()?;
                        pump.client.set_nonblocking(true)
                    };
                    blocking(self).map_err(|e| format!("the client went away: {e}"))?;
                }
            }
        }
    }

    /// The coordinator closed: pass on what came, then close the client
    /// (which tells a closed connection without a Result from a complete
    /// one by its frames).
    fn finish(&mut self) -> Result<(), String> {
        if !self.relayed {
            return Err("lost the connection to Lazaret".into());
        }
        let _ = self.client.set_nonblocking(false);
        let _ = self.client.write_all(&self.to_client);
        self.to_client.clear();
        Ok(())
    }

    /// What the client sent before it went away, to the coordinator.
    fn forward_rest_of_client(&mut self, buf: &mut [u8]) {
        loop {
            match self.client.read(buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if self.tls.writer().write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
    }

    /// Ends the TLS connection: what is queued (a Cancel, say) and the
    /// close_notify go out, waiting for the socket if need be (bounded),
    /// so that the coordinator reads a clean end and not a lost connection.
    fn close_tls(&mut self) {
        self.tls.send_close_notify();
        let _ = self.sock.set_nonblocking(false);
        let _ = self.sock.set_write_timeout(Some(CLOSE_TIMEOUT));
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.sock) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    }

    fn flush_tls(&mut self) -> io::Result<()> {
        while self.tls.wants_write() {
            match self.tls.write_tls(&mut self.sock) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn flush_client(&mut self) -> io::Result<()> {
        while !self.to_client.is_empty() {
            match self.client.write(&self.to_client) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => drop(self.to_client.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
