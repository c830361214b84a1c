//! One request over one connection to the session's escalation broker:
//! send it, then stream what comes back until its Result, cancelling on a
//! signal.
//!
//! The broker (`lazaret-session-init`, see [`super::relay`]) carries the
//! plain frames over mutual TLS to the coordinator, so this side speaks
//! them over a local socket. The socket is non-blocking, so a single
//! poll(2) waits on it and on the signalfd together: a signal interrupts any
//! wait.

use std::io::{self, IsTerminal, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::display::escaped_str;
use crate::escalation::{
    ChannelError, ClientFrame, EscalationRequest, EscalationResult, Outcome, ServerFrame, exit, read_server, write_client,
};

use super::{say, sys};

/// How long to wait for the Result after sending Cancel.
const CANCEL_GRACE: Duration = Duration::from_secs(5);
/// How long to try to get Cancel out when stdout has gone away.
const EPIPE_GRACE: Duration = Duration::from_secs(1);
/// The exit code when stdout is a closed pipe, as a shell reports a process
/// killed by SIGPIPE (128 + 13). SIGPIPE itself is ignored (Rust's runtime
/// does so before `main`), so the write fails with EPIPE and the request is
/// cancelled rather than the client dying with the host command running.
pub const BROKEN_PIPE: i32 = 141;

struct Connection {
    sock: UnixStream,
    /// Frames not yet written to the socket.
    out: Vec<u8>,
    /// Received bytes not yet parsed into frames.
    plain: Vec<u8>,
    /// The broker closed the connection (or it broke).
    closed: bool,
}

/// Runs `request` over `sock` and returns the exit code; every ending other
/// than the host command's own status has printed its one line on stderr.
pub(crate) fn run(sock: UnixStream, signals: &OwnedFd, request: EscalationRequest) -> i32 {
    // A signal that came while connecting cancels before anything is sent.
    match sys::read_signal(signals) {
        Ok(None) => {}
        Ok(Some(_)) => return cancelled(),
        Err(e) => return unavailable(&format!("cannot read signals: {e}")),
    }
    let mut conn = Connection { sock, out: Vec::new(), plain: Vec::new(), closed: false };
    if let Err(e) = write_client(&mut conn.out, &ClientFrame::Request(request)) {
        return unavailable(&format!("cannot send the request: {e}"));
    }
    let mut cancel_deadline: Option<Instant> = None;
    loop {
        loop {
            match conn.next_frame() {
                Ok(None) => break,
                Ok(Some(ServerFrame::Result(result))) => return finish(&result),
                Ok(Some(frame)) => {
                    if let Some(code) = show(&mut conn, frame) {
                        return code;
                    }
                }
                Err(e) => return unavailable(&format!("Lazaret sent a bad frame: {e}")),
            }
        }
        if conn.closed {
            return unavailable("lost the connection to Lazaret");
        }
        if let Err(e) = conn.send() {
            return unavailable(&format!("lost the connection to Lazaret: {e}"));
        }

        let now = Instant::now();
        if cancel_deadline.is_some_and(|d| now >= d) {
            return cancelled();
        }
        let mut fds = [sys::interest(conn.sock.as_raw_fd(), true, !conn.out.is_empty()), sys::interest(signals.as_raw_fd(), true, false)];
        if let Err(e) = sys::poll(&mut fds, cancel_deadline.map(|d| d.saturating_duration_since(now))) {
            return unavailable(&format!("cannot wait for Lazaret: {e}"));
        }

        if sys::ready(&fds[1]) {
            loop {
                match sys::read_signal(signals) {
                    Ok(None) => break,
                    // A second signal while waiting for the cancellation to
                    // be confirmed: stop waiting.
                    Ok(Some(_)) if cancel_deadline.is_some() => return cancelled(),
                    Ok(Some(_)) => {
                        if let Err(e) = write_client(&mut conn.out, &ClientFrame::Cancel) {
                            return unavailable(&format!("cannot send the cancellation: {e}"));
                        }
                        cancel_deadline = Some(Instant::now() + CANCEL_GRACE);
                    }
                    Err(e) => return unavailable(&format!("cannot read signals: {e}")),
                }
            }
        }
        if sys::ready(&fds[0]) {
            if let Err(reason) = conn.receive() {
                return unavailable(&reason);
            }
        }
    }
}

/// Passes an output or status frame on; `Some(code)` ends the session.
fn show(conn: &mut Connection, frame: ServerFrame) -> Option<i32> {
    match frame {
        ServerFrame::Stdout(data) => {
            let mut out = io::stdout().lock();
            if let Err(e) = out.write_all(&data).and_then(|()| out.flush()) {
                let code = if e.kind() == io::ErrorKind::BrokenPipe {
                    BROKEN_PIPE
                } else {
                    say(&format!("failed: cannot write stdout: {e}"));
                    exit::FAILED
                };
                conn.cancel_and_leave();
                return Some(code);
            }
        }
        // Nothing useful can be done if stderr itself is gone.
        ServerFrame::Stderr(data) => drop(io::stderr().lock().write_all(&data)),
        // Status lines are for a person watching; captured stderr stays the
        // host command's alone.
        ServerFrame::Status(text) => {
            if io::stderr().is_terminal() {
                say(&escaped_str(&text).to_string());
            }
        }
        ServerFrame::Result(_) => {}
    }
    None
}

/// The exit code for `result`, after its one line on stderr.
fn finish(result: &EscalationResult) -> i32 {
    if result.truncated {
        say("output was truncated by Lazaret's limit");
    }
    match &result.outcome {
        Outcome::Completed { exit_status } if (0..=255).contains(exit_status) => {}
        // A status the shell could not see as such (256 would read as 0).
        Outcome::Completed { exit_status } => {
            say(&format!("failed: Lazaret reported exit status {exit_status}, which is not 0-255"));
            return exit::FAILED;
        }
        Outcome::Denied { reason } => say(&format!("denied: {}", escaped_str(reason))),
        Outcome::TimedOut => say("timed out"),
        Outcome::Cancelled => say("cancelled"),
        Outcome::Failed { reason } => say(&format!("failed: {}", escaped_str(reason))),
        Outcome::Refused { reason } => say(&format!("unavailable: refused: {}", escaped_str(reason))),
        Outcome::Unavailable { reason } => say(&format!("unavailable: {}", escaped_str(reason))),
    }
    result.outcome.exit_code()
}

fn cancelled() -> i32 {
    say("cancelled");
    exit::CANCELLED
}

/// Prints `unavailable: REASON` and returns its exit code.
pub(crate) fn unavailable(reason: &str) -> i32 {
    say(&format!("unavailable: {reason}"));
    exit::UNAVAILABLE
}

impl Connection {
    /// The next complete frame in `plain`, if there is one.
    fn next_frame(&mut self) -> Result<Option<ServerFrame>, ChannelError> {
        let mut rest = self.plain.as_slice();
        match read_server(&mut rest) {
            Ok(frame) => {
                let used = self.plain.len() - rest.len();
                self.plain.drain(..used);
                Ok(Some(frame))
            }
            // Not all of it has arrived yet (read_server refuses an oversized
            // or unknown frame from its header alone, so this cannot grow
            // past one frame).
            Err(ChannelError::Closed) => Ok(None),
            Err(ChannelError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes queued frames until done or the socket is full.
    fn send(&mut self) -> io::Result<()> {
        while !self.out.is_empty() {
            match self.sock.write(&self.out) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => drop(self.out.drain(..n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads one batch from the socket into `plain`. One batch, so that
    /// output is passed on as it arrives rather than after the socket has
    /// been drained.
    fn receive(&mut self) -> Result<(), String> {
        let mut buf = [0u8; 16 * 1024];
        match self.sock.read(&mut buf) {
            Ok(0) => self.closed = true,
            Ok(n) => self.plain.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(format!("lost the connection to Lazaret: {e}")),
        }
        Ok(())
    }

    /// Sends Cancel and tries, briefly, to get it out before the process
    /// exits (closing the connection cancels too, so this is best effort).
    fn cancel_and_leave(&mut self) {
        if write_client(&mut self.out, &ClientFrame::Cancel).is_err() {
            return;
        }
        let deadline = Instant::now() + EPIPE_GRACE;
        while !self.out.is_empty() {
            if self.send().is_err() {
                return;
            }
            let now = Instant::now();
            if self.out.is_empty() || now >= deadline {
                return;
            }
            let mut fds = [sys::interest(self.sock.as_raw_fd(), false, true)];
            if sys::poll(&mut fds, Some(deadline - now)).is_err() {
                return;
            }
        }
    }
}
