//! Messages between `lazaret` clients and a Domain's coordinator, and their
//! framing on the coordinator's unix socket.
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of
//! JSON (one [`ClientMessage`] or [`CoordinatorMessage`]). Every message
//! carries nothing that needs trust beyond the peer's credentials, which the
//! coordinator checks with SO_PEERCRED before reading a byte. Hard limits:
//! a frame is at most [`MAX_FRAME`] bytes, and a client may send at most
//! [`RateLimit`]'s budget of messages; a peer that breaks either, or sends
//! something that does not parse, is disconnected.
//!
//! The first client frame is always [`ClientMessage::Hello`] (or one of the
//! one-shot requests [`ClientMessage::Stop`], [`ClientMessage::Status`],
//! [`ClientMessage::Debug`], [`ClientMessage::RefusedDestinations`]) and must name [`WIRE_VERSION`]; a coordinator
//! refuses any other version with a message saying so.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Version of this message set; both sides must agree.
/// Version 2: the Hello says which streams are terminals ([`ClientMessage::Hello`]'s
/// `terminal`), and the client passes fresh pipes, never its own stdio.
/// Version 3: escalation. The Hello carries the host environment a host
/// command of the session may see ([`ClientMessage::Hello`]'s `host_env`);
/// the coordinator shows prompts through the client
/// ([`CoordinatorMessage::Prompt`], [`ClientMessage::PromptAnswer`]).
pub const WIRE_VERSION: u32 = 3;

/// The variables of the client's environment the agent gets, so that it
/// draws and formats like the developer's terminal: the terminal type and
/// colour support, the locale (`LANG` and every `LC_*` category) and the
/// time zone (`TZ`, carried as it is: an
/// image without `/usr/share/zoneinfo` falls back to UTC).
pub const AGENT_TERMINAL_ENV: &[&str] = &[
    "TERM",
    "COLORTERM",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LC_NUMERIC",
    "LC_TIME",
    "LC_COLLATE",
    "LC_MONETARY",
    "LC_MESSAGES",
    "LC_PAPER",
    "LC_NAME",
    "LC_ADDRESS",
    "LC_TELEPHONE",
    "LC_MEASUREMENT",
    "LC_IDENTIFICATION",
    "TZ",
];

/// Longest value of an [`AGENT_TERMINAL_ENV`] variable, in bytes.
pub const MAX_TERMINAL_VALUE: usize = 256;

/// Whether `value` may be carried for one of [`AGENT_TERMINAL_ENV`]: not
/// empty, at most [`MAX_TERMINAL_VALUE`] bytes, no control characters
/// (C0, DEL or C1), so that no value can drive a terminal or split a line.
pub fn acceptable_terminal_value(value: &str) -> bool {
    !value.is_empty() && value.len() <= MAX_TERMINAL_VALUE && !value.chars().any(char::is_control)
}

/// The variables of `sent` the agent may get: names of
/// [`AGENT_TERMINAL_ENV`], each once, with acceptable values, and the
/// terminal ones (TERM, COLORTERM) only when `tty`.
pub fn agent_terminal_env(sent: &[(String, String)], tty: bool) -> Vec<(String, String)> {
    let mut kept: Vec<(String, String)> = Vec::new();
    for (name, value) in sent {
        let terminal_only = name == "TERM" || name == "COLORTERM";
        if AGENT_TERMINAL_ENV.contains(&name.as_str())
            && (tty || !terminal_only)
            && acceptable_terminal_value(value)
            && !kept.iter().any(|(k, _)| k == name)
        {
            kept.push((name.clone(), value.clone()));
        }
    }
    kept
}

/// Largest frame either side accepts (the body, without the length prefix).
/// A Hello carries the client's rendered configuration, so this is generous
/// for that and tiny for anything hostile.
pub const MAX_FRAME: usize = 1 << 20;

/// What a client asks of a coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ClientMessage {
    /// Join the Domain as a new session.
    Hello {
        /// Must be [`WIRE_VERSION`].
        version: u32,
        /// The Session ID the client chose (unique, never reused).
        session: String,
        /// The profile name.
        profile: String,
        /// The client's Configuration Fingerprint of that profile.
        fingerprint: String,
        /// The client's configuration rendered as canonical JSON, so a
        /// mismatch can be explained setting by setting.
        config_json: String,
        /// Which of stdin, stdout and stderr are the agent's PTY (the
        /// client's own stream is a terminal; the agent gets a PTY when any
        /// is). Every other stream is a
        /// fresh pipe whose agent end travels with this frame (SCM_RIGHTS),
        /// in stream order; the client relays between it and its own fd.
        /// A host terminal, or any other descriptor of the client's, never
        /// reaches the agent.
        #[serde(default)]
        terminal: [bool; 3],
        /// The client's TERM, for the agent's environment.
        #[serde(default)]
        term: Option<String>,
        /// The command instead of the profile's (empty: the profile's).
        #[serde(default)]
        args: Vec<String>,
        /// The client's terminal height (0: unknown), set before the agent starts.
        #[serde(default)]
        rows: u16,
        /// The client's terminal width (0: unknown).
        #[serde(default)]
        cols: u16,
        /// The client's working directory (the agent's, if inside the workspace).
        #[serde(default)]
        cwd: Option<String>,
        /// The variables of the client's environment that a host command of
        /// this session may be given: `SSH_AUTH_SOCK`, `LANG`, the `LC_*`
        /// variables, and the ones the profile's escalation rules name. The
        /// coordinator never takes anything else from the client's
        /// environment, and nothing from the agent's.
        #[serde(default)]
        host_env: Vec<(String, String)>,
        /// The developer's terminal and locale settings for the agent's
        /// environment: variables named in [`AGENT_TERMINAL_ENV`] only, each
        /// value [`acceptable_terminal_value`] (the coordinator checks both
        /// again). TERM and COLORTERM are used only for a session with a PTY.
        #[serde(default)]
        agent_env: Vec<(String, String)>,
    },
    /// The developer's answer to a [`CoordinatorMessage::Prompt`].
    PromptAnswer {
        /// The Escalation Request ID the prompt showed.
        request: String,
        /// What the developer decided.
        decision: PromptDecision,
    },
    /// Forward a signal to this session's agent (non-terminal sessions; a
    /// terminal's ^C travels through the PTY).
    Signal {
        /// The signal number.
        signal: i32,
    },
    /// End the Domain gracefully: sessions are told, agents get SIGTERM,
    /// then SIGKILL after `grace_ms`.
    Stop {
        /// Must be [`WIRE_VERSION`].
        version: u32,
        /// Grace period before SIGKILL, in milliseconds.
        grace_ms: u64,
    },
    /// Ask for the Domain's status.
    Status {
        /// Must be [`WIRE_VERSION`].
        version: u32,
    },
    /// Ask for namespace, route and mount details as the coordinator sees them.
    Debug {
        /// Must be [`WIRE_VERSION`].
        version: u32,
    },
    /// Ask for the destinations the Domain's sidecar refused recently
    /// (`lazaret policy log`).
    RefusedDestinations {
        /// Must be [`WIRE_VERSION`].
        version: u32,
    },
}

/// What a coordinator tells a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum CoordinatorMessage {
    /// The session is registered; with `tty`, the PTY master of the agent's
    /// terminal travels with this frame (SCM_RIGHTS).
    Welcome {
        /// The session's ID.
        session: String,
        /// The sandbox's container ID.
        sandbox: String,
        /// Whether a PTY master is attached.
        tty: bool,
    },
    /// The session was refused.
    Refused {
        /// Why, for the developer.
        reason: String,
        /// The Domain is going down: try again (a new coordinator starts).
        retry: bool,
    },
    /// Something the developer should see (e.g. the Domain is stopping).
    Notice {
        /// The text.
        text: String,
    },
    /// The session's agent exited.
    Exit {
        /// Its status as a shell reports it (128 + N for signal N).
        status: i32,
    },
    /// The answer to [`ClientMessage::Status`].
    Status(DomainStatus),
    /// The answer to [`ClientMessage::Debug`].
    Debug {
        /// Human-readable report.
        text: String,
    },
    /// The answer to [`ClientMessage::RefusedDestinations`], most refused first.
    RefusedDestinations {
        /// The destinations.
        destinations: Vec<RefusedDestination>,
    },
    /// The answer to [`ClientMessage::Stop`]: the stop is under way.
    Stopping,
    /// An escalation request of this session that no rule approves: the
    /// client shows it on the developer's terminal, holding the agent's
    /// output back, and answers with [`ClientMessage::PromptAnswer`]. Only
    /// sent to a session whose stdin is a terminal. Every text field is
    /// what the agent sent: the client must make it inert before display.
    Prompt(PromptRequest),
    /// The prompt for `request` is over without an answer (it timed out, or
    /// the agent cancelled it): the client closes it.
    PromptWithdrawn {
        /// The Escalation Request ID.
        request: String,
        /// Why, for the developer (e.g. "timed out after 60 s").
        reason: String,
    },
}

/// A destination the sidecar refused the sandbox, as `lazaret policy log` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedDestination {
    /// The address the sandbox tried to reach.
    pub address: String,
    /// `tcp`, `udp`, `icmp`, ... or the IP protocol number.
    pub protocol: String,
    /// The destination port (TCP, UDP and SCTP only).
    pub port: Option<u16>,
    /// Packets refused.
    pub packets: u64,
    /// Seconds since the last one.
    pub last_secs: u64,
}

/// What a prompt shows the developer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptRequest {
    /// The Escalation Request ID (random, chosen by the coordinator's peer).
    pub request: String,
    /// The Domain's profile.
    pub profile: String,
    /// The requesting session (the verified Session ID).
    pub session: String,
    /// The working directory on the host the command would run in.
    pub cwd: String,
    /// The command, one argument per element.
    pub argv: Vec<String>,
    /// The agent's justification.
    pub justification: String,
    /// Seconds until the prompt times out and the request is denied.
    pub timeout_secs: u64,
}

/// A developer's decision on a prompt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "decision")]
pub enum PromptDecision {
    /// Run the command as requested, once.
    Approve,
    /// Run the command as requested, and approve this exact argument vector
    /// (and working directory) for the rest of the Domain's life.
    ApproveForDomain,
    /// Run this edited argument vector instead, once.
    Edit {
        /// The edited command, one argument per element.
        argv: Vec<String>,
    },
    /// Do not run it.
    Deny,
}

/// An escalation request that is not finished, as `lazaret ls` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRequest {
    /// The requesting session.
    pub session: String,
    /// The Escalation Request ID.
    pub request: String,
    /// The command, one argument per element (agent-controlled: make it
    /// inert before display).
    pub argv: Vec<String>,
    /// `queued`, `awaiting-approval` or `running`.
    pub state: String,
    /// Seconds since the request arrived.
    pub age_secs: u64,
}

/// A Domain as `lazaret ls` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainStatus {
    /// The Domain ID.
    pub domain: String,
    /// The profile.
    pub profile: String,
    /// The workspace root.
    pub workspace: String,
    /// The protocol state (`Starting`, `Ready`, `Stopping`, ...).
    pub state: String,
    /// Session IDs of the connected sessions.
    pub sessions: Vec<String>,
    /// Seconds since the coordinator started.
    pub uptime_secs: u64,
    /// The sandbox's container ID.
    pub sandbox: String,
    /// The Sidecar ID.
    pub sidecar: String,
    /// The coordinator's PID on the host.
    pub coordinator_pid: u32,
    /// Escalation requests not yet finished, oldest first.
    #[serde(default)]
    pub pending: Vec<PendingRequest>,
}

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The peer closed the connection before a frame started.
    #[error("connection closed")]
    Closed,
    /// The length prefix exceeds [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    /// The body is not a message of this version.
    #[error("malformed message: {0}")]
    Malformed(#[from] serde_json::Error),
    /// The peer sent more messages than its budget allows.
    #[error("too many messages ({0} in the current window)")]
    RateExceeded(u32),
    /// Reading or writing failed (including a frame cut short).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Encodes `message` as one frame (length prefix and JSON body).
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let body = serde_json::to_vec(message)?;
    if body.len() > MAX_FRAME {
        return Err(FrameError::TooLarge(body.len()));
    }
    let len = u32::try_from(body.len()).map_err(|_| FrameError::TooLarge(body.len()))?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes `message` as one frame.
pub fn write_message<T: Serialize>(w: &mut impl Write, message: &T) -> Result<(), FrameError> {
    w.write_all(&encode(message)?)?;
    w.flush()?;
    Ok(())
}

/// Parses the length prefix, refusing oversized frames before any body is
/// read.
pub fn body_len(prefix: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_be_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    Ok(len)
}

/// Parses a frame body.
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, FrameError> {
    Ok(serde_json::from_slice(body)?)
}

/// Reads one frame and parses it. A clean end of stream before the first
/// byte is [`FrameError::Closed`]; one inside a frame is an I/O error.
pub fn read_message<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<T, FrameError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(std::io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = body_len(prefix)?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    decode(&body)
}

/// A budget of messages per time window for one peer (a token bucket
/// refilled once per window).
#[derive(Debug, Clone)]
pub struct RateLimit {
    per_window: u32,
    window: Duration,
    started: Instant,
    used: u32,
}

impl RateLimit {
    /// At most `per_window` messages in each `window`.
    pub fn new(per_window: u32, window: Duration) -> Self {
        Self { per_window, window, started: Instant::now(), used: 0 }
    }

    /// The default client budget: 64 messages per second.
    pub fn client_default() -> Self {
        Self::new(64, Duration::from_secs(1))
    }

    /// Counts one message at `now`; refuses it when the budget is spent.
    pub fn admit_at(&mut self, now: Instant) -> Result<(), FrameError> {
        if now.duration_since(self.started) >= self.window {
            self.started = now;
            self.used = 0;
        }
        if self.used >= self.per_window {
            return Err(FrameError::RateExceeded(self.used));
        }
        self.used += 1;
        Ok(())
    }

    /// Counts one message now.
    pub fn admit(&mut self) -> Result<(), FrameError> {
        self.admit_at(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> ClientMessage {
        ClientMessage::Hello {
            version: WIRE_VERSION,
            session: "s-1".into(),
            profile: "dev".into(),
            fingerprint: "sha256:ab".into(),
            config_json: "{}".into(),
            terminal: [false; 3],
            term: None,
            args: vec!["sh".into()],
            rows: 24,
            cols: 80,
            cwd: None,
            host_env: vec![("SSH_AUTH_SOCK".into(), "/tmp/ssh-x/agent.1".into())],
            agent_env: vec![("TERM".into(), "xterm-256color".into()), ("TZ".into(), "Europe/Berlin".into())],
        }
    }

    #[test]
    fn a_hello_without_the_agent_env_still_parses() {
        let mut old = serde_json::to_value(hello()).expect("json");
        old.as_object_mut().expect("object").remove("agent_env");
        let back: ClientMessage = serde_json::from_value(old).expect("parse");
        assert!(matches!(back, ClientMessage::Hello { agent_env, .. } if agent_env.is_empty()));
    }

    #[test]
    fn only_named_well_formed_terminal_variables_reach_the_agent() {
        let v = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let sent = v(&[
            ("TERM", "xterm-256color"),
            ("COLORTERM", "truecolor"),
            ("LANG", "de_DE.UTF-8"),
            ("LC_TIME", "en_GB.UTF-8"),
            ("TZ", "Europe/Berlin"),
            ("LD_PRELOAD", "/x.so"),
            ("PATH", "/evil"),
            ("LANG", "second"),
            ("LC_ALL", "C\u{1b}]0;title\u{7}"),
            ("LC_CTYPE", "a\nb"),
            ("LC_NAME", "\u{9b}31m"),
            ("LC_PAPER", ""),
            ("LC_ADDRESS", &"x".repeat(MAX_TERMINAL_VALUE + 1)),
        ]);
        assert_eq!(
            agent_terminal_env(&sent, true),
            v(&[
                ("TERM", "xterm-256color"),
                ("COLORTERM", "truecolor"),
                ("LANG", "de_DE.UTF-8"),
                ("LC_TIME", "en_GB.UTF-8"),
                ("TZ", "Europe/Berlin")
            ])
        );
        assert_eq!(agent_terminal_env(&sent, false), v(&[("LANG", "de_DE.UTF-8"), ("LC_TIME", "en_GB.UTF-8"), ("TZ", "Europe/Berlin")]));
        assert!(acceptable_terminal_value(&"x".repeat(MAX_TERMINAL_VALUE)));
        assert!(acceptable_terminal_value(":/usr/share/zoneinfo/Asia/Kolkata"));
    }

    #[test]
    fn a_message_round_trips_through_a_frame() {
        let frame = encode(&hello()).expect("encode");
        assert_eq!(u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize, frame.len() - 4);
        let back: ClientMessage = read_message(&mut frame.as_slice()).expect("decode");
        assert_eq!(back, hello());
    }

    #[test]
    fn two_frames_in_one_stream_are_read_in_order() {
        let mut stream = encode(&CoordinatorMessage::Stopping).expect("encode");
        stream.extend(encode(&CoordinatorMessage::Exit { status: 143 }).expect("encode"));
        let mut r = stream.as_slice();
        assert_eq!(read_message::<CoordinatorMessage>(&mut r).expect("first"), CoordinatorMessage::Stopping);
        assert_eq!(read_message::<CoordinatorMessage>(&mut r).expect("second"), CoordinatorMessage::Exit { status: 143 });
        assert!(matches!(read_message::<CoordinatorMessage>(&mut r), Err(FrameError::Closed)));
    }

    #[test]
    fn an_oversized_length_is_refused_before_reading_the_body() {
        let mut data = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
        data.extend_from_slice(b"{}");
        assert!(matches!(read_message::<ClientMessage>(&mut data.as_slice()), Err(FrameError::TooLarge(n)) if n == MAX_FRAME + 1));
        assert!(matches!(body_len(u32::MAX.to_be_bytes()), Err(FrameError::TooLarge(_))));
    }

    #[test]
    fn garbage_and_truncated_frames_are_errors() {
        let mut garbage = 5u32.to_be_bytes().to_vec();
        garbage.extend_from_slice(b"hello");
        assert!(matches!(read_message::<ClientMessage>(&mut garbage.as_slice()), Err(FrameError::Malformed(_))));
        let unknown = encode(&serde_json::json!({"type": "Launch", "what": "rm -rf /"})).expect("encode");
        assert!(matches!(read_message::<ClientMessage>(&mut unknown.as_slice()), Err(FrameError::Malformed(_))));
        let mut cut = encode(&hello()).expect("encode");
        cut.truncate(cut.len() - 3);
        assert!(matches!(read_message::<ClientMessage>(&mut cut.as_slice()), Err(FrameError::Io(_))));
        let half_prefix = [0u8, 0];
        assert!(matches!(read_message::<ClientMessage>(&mut half_prefix.as_slice()), Err(FrameError::Io(_))));
    }

    #[test]
    fn prompts_and_answers_round_trip() {
        let prompt = CoordinatorMessage::Prompt(PromptRequest {
            request: "r1".into(),
            profile: "dev".into(),
            session: "s-1".into(),
            cwd: "/home/u/src/p".into(),
            argv: vec!["git".into(), "push".into(), "\u{1b}[2J".into()],
            justification: "push\r\nfix".into(),
            timeout_secs: 60,
        });
        let back: CoordinatorMessage = read_message(&mut encode(&prompt).expect("encode").as_slice()).expect("decode");
        assert_eq!(back, prompt);
        for decision in [
            PromptDecision::Approve,
            PromptDecision::ApproveForDomain,
            PromptDecision::Deny,
            PromptDecision::Edit { argv: vec!["git".into()] },
        ] {
            let answer = ClientMessage::PromptAnswer { request: "r1".into(), decision };
            let back: ClientMessage = read_message(&mut encode(&answer).expect("encode").as_slice()).expect("decode");
            assert_eq!(back, answer);
        }
    }

    #[test]
    fn the_rate_limit_refuses_past_the_budget_and_refills() {
        let start = Instant::now();
        let mut limit = RateLimit::new(3, Duration::from_secs(1));
        for _ in 0..3 {
            limit.admit_at(start).expect("within budget");
        }
        assert!(matches!(limit.admit_at(start + Duration::from_millis(500)), Err(FrameError::RateExceeded(3))));
        limit.admit_at(start + Duration::from_secs(2)).expect("refilled");
    }
}
