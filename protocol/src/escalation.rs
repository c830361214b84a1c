//! The escalation channel: what `lazaret-escalate` (inside the sandbox) and
//! a Domain's coordinator say to each other over mutual TLS.
//!
//! One TLS connection carries one request. The client sends one
//! [`ClientFrame::Request`], then at most one [`ClientFrame::Cancel`] (or
//! closes the connection, which cancels too). The coordinator answers with
//! any number of [`ServerFrame::Status`], [`ServerFrame::Stdout`] and
//! [`ServerFrame::Stderr`] frames, then exactly one [`ServerFrame::Result`],
//! and closes.
//!
//! A frame is one kind byte, a 4-byte big-endian length and that many bytes:
//! JSON for control frames ([`KIND_CONTROL`]), raw bytes for output
//! ([`KIND_STDOUT`], [`KIND_STDERR`]), so binary output needs no encoding.
//! Control frames are at most [`MAX_CONTROL`] bytes and output chunks at most
//! [`MAX_CHUNK`]: a peer that sends more, an unknown kind, or JSON that does
//! not parse is a protocol error and the connection ends.
//!
//! Everything a request carries is the agent's: the coordinator validates it
//! with [`EscalationRequest::validate`] and never shows it without making it
//! inert ([`crate::display`]).

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

/// Version of this channel; the coordinator refuses any other.
pub const ESCALATION_VERSION: u32 = 1;

/// The TCP port the coordinator listens on, on the sidecar's
/// sandbox-facing address (the sandbox's gateway).
pub const ESCALATION_PORT: u16 = 7418;

/// Environment variable with the coordinator's `ADDRESS:PORT`.
pub const ENV_ADDR: &str = "LAZARET_ESCALATE_ADDR";
/// Environment variable with the Domain CA's certificate (PEM).
pub const ENV_CA: &str = "LAZARET_ESCALATE_CA";
/// Environment variable with the session's client certificate (PEM).
pub const ENV_CERT: &str = "LAZARET_ESCALATE_CERT";
/// Environment variable with the session's client key (PEM, PKCS#8).
pub const ENV_KEY: &str = "LAZARET_ESCALATE_KEY";

/// Frame kind of a JSON control frame.
pub const KIND_CONTROL: u8 = 0;
/// Frame kind of a chunk of the host command's stdout.
pub const KIND_STDOUT: u8 = 1;
/// Frame kind of a chunk of the host command's stderr.
pub const KIND_STDERR: u8 = 2;

/// Largest control frame body.
pub const MAX_CONTROL: usize = 256 * 1024;
/// Largest output chunk.
pub const MAX_CHUNK: usize = 64 * 1024;
/// Most arguments a command may have.
pub const MAX_ARGS: usize = 4096;
/// Most bytes all arguments together may have.
pub const MAX_ARGV_BYTES: usize = 128 * 1024;
/// Longest justification, in bytes.
pub const MAX_JUSTIFICATION: usize = 4096;
/// Longest working directory, in bytes.
pub const MAX_CWD: usize = 4096;
/// Longest timeout a request may ask for, in seconds.
pub const MAX_TIMEOUT_SECS: u64 = 24 * 60 * 60;

/// Exit codes of `lazaret-escalate` when no host command's status is
/// passed on. A host command may exit with the same numbers; the one-line
/// reason on stderr (`lazaret-escalate: denied: ...`) tells them apart.
pub mod exit {
    /// Bad command line.
    pub const USAGE: i32 = 64;
    /// Lazaret is unavailable: no escalation environment, the coordinator
    /// cannot be reached, TLS failed, or it refused the request before
    /// accepting it (unregistered session, replayed request ID).
    pub const UNAVAILABLE: i32 = 69;
    /// A rule or the developer denied the request.
    pub const DENIED: i32 = 77;
    /// The request timed out (waiting for approval or while running).
    pub const TIMED_OUT: i32 = 124;
    /// The host command could not be started or was lost.
    pub const FAILED: i32 = 126;
    /// The client cancelled the request (SIGINT, SIGTERM, SIGHUP).
    pub const CANCELLED: i32 = 130;
}

/// What the client sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ClientFrame {
    /// The request; always the first frame.
    Request(EscalationRequest),
    /// Cancel the request (and kill its host command).
    Cancel,
}

/// One escalation request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscalationRequest {
    /// Must be [`ESCALATION_VERSION`].
    pub version: u32,
    /// The Escalation Request ID: 32 lowercase hex digits, random, never reused.
    pub id: String,
    /// The command, one argument per element; never given to a shell.
    pub argv: Vec<String>,
    /// The working directory inside the sandbox (absolute).
    pub cwd: String,
    /// Why the agent asks, for the developer.
    #[serde(default)]
    pub justification: String,
    /// The longest the client will wait, in seconds (the coordinator may
    /// shorten it, never lengthen it past a rule's).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// Why a request is malformed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRequest {
    /// Another channel version.
    #[error("escalation version {0} is not {ESCALATION_VERSION}")]
    Version(u32),
    /// The ID is not 32 lowercase hex digits.
    #[error("the request ID is not 32 lowercase hex digits")]
    Id,
    /// No command.
    #[error("the command is empty")]
    EmptyCommand,
    /// Too many or too long arguments.
    #[error("the command is too long (at most {MAX_ARGS} arguments and {MAX_ARGV_BYTES} bytes)")]
    CommandTooLong,
    /// An argument holds a NUL byte, which no host command can receive.
    #[error("an argument contains a NUL byte")]
    Nul,
    /// The working directory is not absolute or too long.
    #[error("the working directory must be an absolute path of at most {MAX_CWD} bytes")]
    Cwd,
    /// The justification is too long.
    #[error("the justification is longer than {MAX_JUSTIFICATION} bytes")]
    Justification,
    /// The timeout is zero or too long.
    #[error("the timeout must be between 1 and {MAX_TIMEOUT_SECS} seconds")]
    Timeout,
}

impl EscalationRequest {
    /// Checks every limit of the channel.
    pub fn validate(&self) -> Result<(), InvalidRequest> {
        if self.version != ESCALATION_VERSION {
            return Err(InvalidRequest::Version(self.version));
        }
        if self.id.len() != 32 || !self.id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(InvalidRequest::Id);
        }
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(InvalidRequest::EmptyCommand);
        }
        if self.argv.len() > MAX_ARGS || self.argv.iter().map(String::len).sum::<usize>() > MAX_ARGV_BYTES {
            return Err(InvalidRequest::CommandTooLong);
        }
        if self.argv.iter().any(|a| a.contains('\0')) {
            return Err(InvalidRequest::Nul);
        }
        if !self.cwd.starts_with('/') || self.cwd.len() > MAX_CWD || self.cwd.contains('\0') {
            return Err(InvalidRequest::Cwd);
        }
        if self.justification.len() > MAX_JUSTIFICATION {
            return Err(InvalidRequest::Justification);
        }
        if self.timeout_secs.is_some_and(|t| t == 0 || t > MAX_TIMEOUT_SECS) {
            return Err(InvalidRequest::Timeout);
        }
        Ok(())
    }
}

/// What the coordinator sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerFrame {
    /// Progress for the client's stderr ("waiting for the developer").
    Status(String),
    /// A chunk of the host command's stdout.
    Stdout(Vec<u8>),
    /// A chunk of the host command's stderr.
    Stderr(Vec<u8>),
    /// The Escalation Result; always the last frame.
    Result(EscalationResult),
}

/// The JSON control frames of the coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
enum ServerControl {
    Status { text: String },
    Result(EscalationResult),
}

/// The Escalation Result: how the request ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscalationResult {
    /// The outcome.
    pub outcome: Outcome,
    /// The host command's output went past the cap and was cut.
    #[serde(default)]
    pub truncated: bool,
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome")]
pub enum Outcome {
    /// The host command ran and exited with `exit_status` (128 + N for signal N).
    Completed {
        /// The status, as a shell reports it.
        exit_status: i32,
    },
    /// A rule or the developer denied it.
    Denied {
        /// Why.
        reason: String,
    },
    /// It timed out waiting for approval or while running.
    TimedOut,
    /// The client cancelled it.
    Cancelled,
    /// The host command could not run or was lost.
    Failed {
        /// Why.
        reason: String,
    },
    /// Refused before it was accepted (unknown session, replayed or
    /// malformed request); never journalled.
    Refused {
        /// Why.
        reason: String,
    },
    /// The session's escalation broker could not carry the request to the
    /// coordinator (it cannot reach it, TLS failed); only the broker sends
    /// this, never the coordinator.
    Unavailable {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// The exit code `lazaret-escalate` ends with.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Completed { exit_status } => *exit_status,
            Outcome::Denied { .. } => exit::DENIED,
            Outcome::TimedOut => exit::TIMED_OUT,
            Outcome::Cancelled => exit::CANCELLED,
            Outcome::Failed { .. } => exit::FAILED,
            Outcome::Refused { .. } | Outcome::Unavailable { .. } => exit::UNAVAILABLE,
        }
    }
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The peer closed the connection before a frame started.
    #[error("connection closed")]
    Closed,
    /// A frame longer than its kind allows.
    #[error("a frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// A kind byte this version does not know.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A frame that is not valid in this direction.
    #[error("unexpected frame: {0}")]
    Unexpected(&'static str),
    /// The control frame is not valid JSON of this version.
    #[error("malformed frame: {0}")]
    Malformed(#[from] serde_json::Error),
    /// Reading or writing failed (including a frame cut short).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

fn write_frame(w: &mut impl Write, kind: u8, body: &[u8]) -> Result<(), ChannelError> {
    let len = u32::try_from(body.len()).map_err(|_| ChannelError::TooLarge(body.len()))?;
    let mut head = [0u8; 5];
    head[0] = kind;
    head[1..].copy_from_slice(&len.to_be_bytes());
    w.write_all(&head)?;
    w.write_all(body)?;
    Ok(())
}

/// Length of a frame's header: the kind byte and the 4-byte body length.
pub const HEADER_LEN: usize = 5;

/// The body length a frame header announces, refusing an unknown kind or a
/// body longer than its kind allows (for readers that parse frames off a
/// buffer of their own).
pub fn body_len(head: [u8; HEADER_LEN]) -> Result<usize, ChannelError> {
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let limit = match head[0] {
        KIND_CONTROL => MAX_CONTROL,
        KIND_STDOUT | KIND_STDERR => MAX_CHUNK,
        other => return Err(ChannelError::UnknownKind(other)),
    };
    if len > limit {
        return Err(ChannelError::TooLarge(len));
    }
    Ok(len)
}

/// Reads one frame's kind and body, refusing oversized frames before reading
/// their body.
fn read_frame(r: &mut impl Read) -> Result<(u8, Vec<u8>), ChannelError> {
    let mut head = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(ChannelError::Closed),
            Ok(0) => return Err(ChannelError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = body_len(head)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok((head[0], body))
}

/// Writes a client frame (and flushes).
pub fn write_client(w: &mut impl Write, frame: &ClientFrame) -> Result<(), ChannelError> {
    let body = serde_json::to_vec(frame)?;
    if body.len() > MAX_CONTROL {
        return Err(ChannelError::TooLarge(body.len()));
    }
    write_frame(w, KIND_CONTROL, &body)?;
    w.flush()?;
    Ok(())
}

/// Reads a client frame.
pub fn read_client(r: &mut impl Read) -> Result<ClientFrame, ChannelError> {
    match read_frame(r)? {
        (KIND_CONTROL, body) => Ok(serde_json::from_slice(&body)?),
        _ => Err(ChannelError::Unexpected("output from a client")),
    }
}

/// Writes a coordinator frame (and flushes). Output longer than
/// [`MAX_CHUNK`] goes as several frames.
pub fn write_server(w: &mut impl Write, frame: &ServerFrame) -> Result<(), ChannelError> {
    match frame {
        ServerFrame::Stdout(data) | ServerFrame::Stderr(data) => {
            let kind = if matches!(frame, ServerFrame::Stdout(_)) { KIND_STDOUT } else { KIND_STDERR };
            for chunk in data.chunks(MAX_CHUNK) {
                write_frame(w, kind, chunk)?;
            }
        }
        ServerFrame::Status(text) => write_frame(w, KIND_CONTROL, &serde_json::to_vec(&ServerControl::Status { text: text.clone() })?)?,
        ServerFrame::Result(result) => write_frame(w, KIND_CONTROL, &serde_json::to_vec(&ServerControl::Result(result.clone()))?)?,
    }
    w.flush()?;
    Ok(())
}

/// Reads a coordinator frame.
pub fn read_server(r: &mut impl Read) -> Result<ServerFrame, ChannelError> {
    Ok(match read_frame(r)? {
        (KIND_STDOUT, body) => ServerFrame::Stdout(body),
        (KIND_STDERR, body) => ServerFrame::Stderr(body),
        (_, body) => match serde_json::from_slice(&body)? {
            ServerControl::Status { text } => ServerFrame::Status(text),
            ServerControl::Result(result) => ServerFrame::Result(result),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> EscalationRequest {
        EscalationRequest {
            version: ESCALATION_VERSION,
            id: "0123456789abcdef0123456789abcdef".into(),
            argv: vec!["git".into(), "push".into()],
            cwd: "/work".into(),
            justification: "push the fix".into(),
            timeout_secs: Some(30),
        }
    }

    #[test]
    fn frames_round_trip_in_order() {
        let mut stream = Vec::new();
        write_client(&mut stream, &ClientFrame::Request(request())).expect("write");
        write_client(&mut stream, &ClientFrame::Cancel).expect("write");
        let mut r = stream.as_slice();
        assert_eq!(read_client(&mut r).expect("request"), ClientFrame::Request(request()));
        assert_eq!(read_client(&mut r).expect("cancel"), ClientFrame::Cancel);
        assert!(matches!(read_client(&mut r), Err(ChannelError::Closed)));

        let big: Vec<u8> = (0..MAX_CHUNK * 2 + 7).map(|i| (i % 256) as u8).collect();
        let mut stream = Vec::new();
        let result = EscalationResult { outcome: Outcome::Completed { exit_status: 3 }, truncated: false };
        for frame in [
            ServerFrame::Status("waiting".into()),
            ServerFrame::Stdout(big.clone()),
            ServerFrame::Stderr(vec![0, 255]),
            ServerFrame::Result(result.clone()),
        ] {
            write_server(&mut stream, &frame).expect("write");
        }
        let mut r = stream.as_slice();
        assert_eq!(read_server(&mut r).expect("status"), ServerFrame::Status("waiting".into()));
        let mut out = Vec::new();
        for _ in 0..3 {
            match read_server(&mut r).expect("chunk") {
                ServerFrame::Stdout(chunk) => out.extend(chunk),
                other => panic!("expected stdout, got {other:?}"),
            }
        }
        assert_eq!(out, big);
        assert_eq!(read_server(&mut r).expect("stderr"), ServerFrame::Stderr(vec![0, 255]));
        assert_eq!(read_server(&mut r).expect("result"), ServerFrame::Result(result));
    }

    #[test]
    fn oversized_unknown_and_malformed_frames_are_refused() {
        let mut huge = vec![KIND_CONTROL];
        huge.extend(((MAX_CONTROL + 1) as u32).to_be_bytes());
        assert!(matches!(read_client(&mut huge.as_slice()), Err(ChannelError::TooLarge(_))));
        let mut chunk = vec![KIND_STDOUT];
        chunk.extend(((MAX_CHUNK + 1) as u32).to_be_bytes());
        assert!(matches!(read_server(&mut chunk.as_slice()), Err(ChannelError::TooLarge(_))));
        let unknown = [9u8, 0, 0, 0, 0];
        assert!(matches!(read_client(&mut unknown.as_slice()), Err(ChannelError::UnknownKind(9))));
        let mut output = Vec::new();
        write_frame(&mut output, KIND_STDOUT, b"x").expect("write");
        assert!(matches!(read_client(&mut output.as_slice()), Err(ChannelError::Unexpected(_))));
        let mut garbage = Vec::new();
        write_frame(&mut garbage, KIND_CONTROL, b"{\"type\":\"Run\",\"cmd\":\"sh\"}").expect("write");
        assert!(matches!(read_client(&mut garbage.as_slice()), Err(ChannelError::Malformed(_))));
        let mut cut = Vec::new();
        write_client(&mut cut, &ClientFrame::Request(request())).expect("write");
        cut.truncate(cut.len() - 1);
        assert!(matches!(read_client(&mut cut.as_slice()), Err(ChannelError::Io(_))));
    }

    #[test]
    fn validation_enforces_every_limit() {
        assert_eq!(request().validate(), Ok(()));
        let with = |f: fn(&mut EscalationRequest)| {
            let mut r = request();
            f(&mut r);
            r.validate()
        };
        assert_eq!(with(|r| r.version = 2), Err(InvalidRequest::Version(2)));
        assert_eq!(with(|r| r.id = "0123456789ABCDEF0123456789abcdef".into()), Err(InvalidRequest::Id));
        assert_eq!(with(|r| r.id = "short".into()), Err(InvalidRequest::Id));
        assert_eq!(with(|r| r.argv.clear()), Err(InvalidRequest::EmptyCommand));
        assert_eq!(with(|r| r.argv = vec![String::new()]), Err(InvalidRequest::EmptyCommand));
        assert_eq!(with(|r| r.argv = vec!["x".into(); MAX_ARGS + 1]), Err(InvalidRequest::CommandTooLong));
        assert_eq!(with(|r| r.argv.push("a".repeat(MAX_ARGV_BYTES))), Err(InvalidRequest::CommandTooLong));
        assert_eq!(with(|r| r.argv.push("a\0b".into())), Err(InvalidRequest::Nul));
        assert_eq!(with(|r| r.cwd = "work".into()), Err(InvalidRequest::Cwd));
        assert_eq!(with(|r| r.justification = "j".repeat(MAX_JUSTIFICATION + 1)), Err(InvalidRequest::Justification));
        assert_eq!(with(|r| r.timeout_secs = Some(0)), Err(InvalidRequest::Timeout));
        assert_eq!(with(|r| r.timeout_secs = Some(MAX_TIMEOUT_SECS + 1)), Err(InvalidRequest::Timeout));
    }

    #[test]
    fn every_outcome_has_its_own_exit_code() {
        let outcomes = [
            Outcome::Denied { reason: String::new() },
            Outcome::TimedOut,
            Outcome::Cancelled,
            Outcome::Failed { reason: String::new() },
            Outcome::Refused { reason: String::new() },
        ];
        let mut codes: Vec<i32> = outcomes.iter().map(Outcome::exit_code).collect();
        codes.push(exit::USAGE);
        let n = codes.len();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), n, "exit codes collide: {codes:?}");
        assert_eq!(Outcome::Completed { exit_status: 42 }.exit_code(), 42);
        // The broker's own failure reads as Lazaret being unavailable, like
        // a refusal before acceptance.
        assert_eq!(Outcome::Unavailable { reason: String::new() }.exit_code(), exit::UNAVAILABLE);
    }
}
