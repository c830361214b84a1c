//! One escalation connection after its TLS handshake: frames of
//! [`lazaret_protocol::escalation`] over rustls, usable from two threads at
//! once — one that waits for the client's `Cancel` (or its going away) and
//! one that sends the host command's output and the result.
//!
//! rustls's connection is not shareable, so the socket is non-blocking and
//! both directions take one lock only while they move bytes; waiting for the
//! socket (`poll`) happens outside the lock, so a reader that waits for the
//! client never delays output.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lazaret_protocol::escalation::{self, ChannelError, ClientFrame, HEADER_LEN, MAX_CONTROL, ServerFrame};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use rustls::ServerConnection;

/// How long a send may wait for a client that does not read.
const SEND_STALL: Duration = Duration::from_secs(30);

/// A verified escalation connection.
pub struct TlsChannel {
    state: Mutex<State>,
}

struct State {
    conn: ServerConnection,
    sock: TcpStream,
    /// Plaintext received and not yet parsed into frames.
    plain: Vec<u8>,
    /// The client closed its side (TLS close_notify or EOF).
    eof: bool,
}

impl TlsChannel {
    /// Wraps a connection whose handshake is complete.
    pub fn new(conn: ServerConnection, sock: TcpStream) -> std::io::Result<TlsChannel> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        Ok(TlsChannel { state: Mutex::new(State { conn, sock, plain: Vec::new(), eof: false }) })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends one frame, waiting (at most [`SEND_STALL`] per stall) for a
    /// client that reads slowly.
    pub fn send(&self, frame: &ServerFrame) -> Result<(), ChannelError> {
        let mut bytes = Vec::new();
        escalation::write_server(&mut bytes, frame)?;
        let mut st = self.lock();
        // rustls buffers a bounded amount of outgoing data: hand it what it
        // takes, write that out, repeat.
        let mut rest = bytes.as_slice();
        while !rest.is_empty() {
            let n = st.conn.writer().write(rest)?;
            rest = &rest[n..];
            st.flush_tls()?;
            if n == 0 && !st.conn.wants_write() {
                return Err(ChannelError::Io(ErrorKind::WriteZero.into()));
            }
        }
        st.flush_tls()
    }

    /// Receives the next client frame, waiting up to `timeout` (None: for
    /// ever). A client that closed its side is [`ChannelError::Closed`].
    pub fn recv(&self, timeout: Option<Duration>) -> Result<ClientFrame, ChannelError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            {
                let mut st = self.lock();
                if let Some(frame) = st.take_frame()? {
                    return Ok(frame);
                }
                if st.eof {
                    return Err(if st.plain.is_empty() { ChannelError::Closed } else { ChannelError::Io(ErrorKind::UnexpectedEof.into()) });
                }
                if st.receive()? {
                    continue;
                }
            }
            let wait = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(ChannelError::Io(ErrorKind::TimedOut.into()));
                    }
                    PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)
                }
            };
            self.wait_for(PollFlags::POLLIN, wait)?;
        }
    }

    /// Ends the connection: a TLS close_notify, then both directions of the
    /// socket, which also wakes a thread waiting in [`TlsChannel::recv`].
    pub fn close(&self) {
        let mut st = self.lock();
        st.conn.send_close_notify();
        let _ = st.flush_tls();
        let _ = st.sock.shutdown(std::net::Shutdown::Both);
    }

    /// Polls the socket (a duplicate, so that the lock is not held).
    fn wait_for(&self, flags: PollFlags, timeout: PollTimeout) -> Result<(), ChannelError> {
        let sock = self.lock().sock.try_clone()?;
        let mut fds = [PollFd::new(sock.as_fd(), flags)];
        match poll(&mut fds, timeout) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
            Err(e) => Err(ChannelError::Io(e.into())),
        }
    }
}

impl State {
    /// Writes out everything rustls holds, polling while the socket is full.
    fn flush_tls(&mut self) -> Result<(), ChannelError> {
        let mut stalled_since: Option<Instant> = None;
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(_) => stalled_since = None,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    let since = *stalled_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > SEND_STALL {
                        return Err(ChannelError::Io(ErrorKind::TimedOut.into()));
                    }
                    let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLOUT)];
                    let _ = poll(&mut fds, PollTimeout::from(100u16));
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Takes what rustls or the socket has; true if anything arrived. The
    /// handshake may already have received plaintext (a client sends its
    /// request right behind its Finished), so rustls's buffer comes first.
    fn receive(&mut self) -> Result<bool, ChannelError> {
        if self.drain_plaintext()? {
            return Ok(true);
        }
        match self.conn.read_tls(&mut self.sock) {
            Ok(0) => {
                self.eof = true;
                Ok(true)
            }
            Ok(_) => {
                let io = self.conn.process_new_packets().map_err(|e| ChannelError::Io(std::io::Error::new(ErrorKind::InvalidData, e)))?;
                if io.peer_has_closed() {
                    self.eof = true;
                }
                self.drain_plaintext()?;
                // Alerts or key updates rustls wants to answer.
                self.flush_tls()?;
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Moves rustls's received plaintext into the frame buffer; true if
    /// there was any (or the peer closed).
    fn drain_plaintext(&mut self) -> Result<bool, ChannelError> {
        let mut buf = [0u8; 16 * 1024];
        let mut got = false;
        loop {
            match self.conn.reader().read(&mut buf) {
                Ok(0) => {
                    self.eof = true;
                    return Ok(true);
                }
                Ok(n) => {
                    got = true;
                    self.plain.extend_from_slice(&buf[..n]);
                    if self.plain.len() > HEADER_LEN + MAX_CONTROL {
                        return Err(ChannelError::TooLarge(self.plain.len()));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(got),
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                    self.eof = true;
                    return Ok(true);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Parses one complete frame off the plaintext buffer, if there is one.
    fn take_frame(&mut self) -> Result<Option<ClientFrame>, ChannelError> {
        let Some(head) = self.plain.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let end = HEADER_LEN + escalation::body_len(*head)?;
        if self.plain.len() < end {
            return Ok(None);
        }
        // The protocol's reader refuses a frame no client may send.
        let frame = escalation::read_client(&mut &self.plain[..end])?;
        self.plain.drain(..end);
        Ok(Some(frame))
    }
}
