//! The client side: `lazaret run` as a session of its Domain's coordinator
//! (starting the coordinator first when the Domain is not running), and the
//! one-shot commands `lazaret stop`, `ls`, `debug` ([`control`]).
//!
//! The client never hands its own descriptors to the agent ([`terminal`]):
//! when any of stdin, stdout and stderr is a terminal, the agent gets a PTY
//! for those streams, whose master comes from the coordinator (SCM_RIGHTS)
//! and which the client copies to and from the developer's terminal (raw
//! mode while stdin is a terminal); window-size changes go straight to that
//! master. The agent gets the developer's TERM, COLORTERM, LANG, `LC_*` and
//! TZ (`wire::AGENT_TERMINAL_ENV`). Every other stream is a fresh pipe the client relays. Only
//! signals, the exit status and escalation prompts travel as messages; a
//! prompt ([`prompt`]) takes the terminal over until it is answered.

mod control;
mod error;
mod prompt;
mod spawn;
mod terminal;
mod vtstate;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use lazaret_protocol::wire::{ClientMessage, CoordinatorMessage, FrameError, WIRE_VERSION};
use lazaret_runtime::ExitStatus;
use lazaret_runtime::signals::Signals;

use crate::context::{Context, ContextError, require_root};
use crate::layout::DomainDir;
use crate::{EXIT_BUSY, transport};

pub use control::{debug, journal_location, list, refused_destinations, refused_names, stop, stop_all, wait_unlocked};
pub use error::ClientError;
#[doc(hidden)]
pub use prompt::fuzzing as prompt_fuzzing;
pub use spawn::Verbosity;

/// How long `lazaret run` waits for a coordinator to publish its socket.
const START_LIMIT: Duration = Duration::from_secs(120);

/// What `lazaret run` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// `--config FILE`, if given.
    pub config: Option<PathBuf>,
    /// `--quiet` or `--verbose`: what is shown while the Domain starts.
    pub verbosity: Verbosity,
    /// The profile named on the command line, if any.
    pub profile: Option<String>,
    /// Where to look for the workspace (`-C DIR`, else the current directory).
    pub dir: PathBuf,
    /// Replaces the profile's command when not empty (`-- ARGS...`).
    pub args: Vec<String>,
    /// Discard the State Anchor before starting (`--reset-anchor`).
    pub reset_anchor: bool,
    /// `--no-setup` (skip the profile's setup) or `--reprovision` (rerun it).
    pub setup: crate::startup::SetupMode,
}

/// `lazaret run`: joins the Domain (starting its coordinator if needed),
/// serves the session, and returns the agent's exit status. Call it while
/// the process has a single thread (it blocks the signals Lazaret handles
/// as events).
pub fn run(req: &RunRequest) -> Result<ExitStatus, ClientError> {
    require_root()?;
    let mut signals = Signals::block().map_err(ClientError::errno("blocking signals"))?;
    let ctx = Context::resolve(req.config.as_deref(), req.profile.as_deref(), &req.dir)?;
    let dir = DomainDir::new(ctx.domain_runtime_dir()?);
    let session = format!("s-{}", crate::random::hex(8).map_err(ClientError::io("reading randomness for the Session ID"))?);
    let io = terminal::SessionIo::new()?;
    let (rows, cols) = io.window_size();
    let hello = ClientMessage::Hello {
        version: WIRE_VERSION,
        session: session.clone(),
        profile: ctx.profile.name.clone(),
        fingerprint: ctx.config.fingerprint(&ctx.profile.name).map_err(ContextError::from)?.to_string(),
        config_json: ctx.config.render_json().map_err(ContextError::from)?,
        terminal: io.terminal,
        term: std::env::var("TERM").ok(),
        args: req.args.clone(),
        rows,
        cols,
        cwd: Some(ctx.agent_cwd().display().to_string()),
        // What a host command of this session may see of this environment
        // (SSH_AUTH_SOCK, LANG, and the names the escalation rules allow).
        host_env: ctx.profile.escalation.host_env_names().into_iter().filter_map(|n| std::env::var(&n).ok().map(|v| (n, v))).collect(),
        // The terminal type, locale and time zone, for the agent (the
        // coordinator checks them again).
        agent_env: lazaret_protocol::wire::AGENT_TERMINAL_ENV
            .iter()
            .filter_map(|n| std::env::var(n).ok().map(|v| (n.to_string(), v)))
            .filter(|(_, v)| lazaret_protocol::wire::acceptable_terminal_value(v))
            .collect(),
    };
    let socket = dir.socket();
    let mut deadline = Instant::now() + START_LIMIT;
    let mut launched: Option<spawn::Launched> = None;
    let mut told_waiting = false;
    loop {
        if let Some(sig) = signals.pending_termination() {
            return Err(ClientError::Interrupted(sig.to_string()));
        }
        if let Ok(stream) = UnixStream::connect(&socket) {
            if req.reset_anchor && launched.is_none() {
                return Err(ClientError::ResetWhileRunning { profile: ctx.profile.name.clone() });
            }
            if req.setup == crate::startup::SetupMode::Rerun && launched.is_none() {
                return Err(ClientError::ReprovisionWhileRunning { profile: ctx.profile.name.clone() });
            }
            let answer = handshake(&stream, &hello, &io.agent_ends())?;
            match answer {
                Handshake::Joined(master) => {
                    if let Some(l) = launched.as_mut() {
                        l.finish();
                    }
                    return terminal::attach(&stream, master, io, &mut signals, &dir);
                }
                Handshake::Finished(status) => return Ok(ExitStatus(status)),
                Handshake::Retry => std::thread::sleep(Duration::from_millis(20)),
                Handshake::Refused(reason) => return Err(ClientError::Refused(reason)),
            }
        }
        match launched.as_mut() {
            // The lock is held: a coordinator is starting (its socket will
            // answer) or going down behind its last session's Exit (a new
            // one can start once it released the lock). Wait for either.
            None if !wait_unlocked(&dir.lock(), Duration::ZERO) => {}
            None => launched = Some(spawn::spawn_coordinator(req, &ctx, &dir, &session)?),
            Some(l) => {
                l.relay(false);
                if let Some(code) = l.child.try_wait().map_err(ClientError::io("waiting for the coordinator"))? {
                    l.relay(true);
                    match code.code() {
                        Some(c) if c == EXIT_BUSY || c == 0 => {
                            // Another coordinator owns the Domain (perhaps
                            // still going down): connect to it, or start
                            // again once it released the lock (above).
                            launched = None;
                        }
                        _ => {
                            return Err(match l.status.errors() {
                                Some(reason) => ClientError::StartFailed(reason),
                                None => ClientError::StartFailedSilently { status: code, log: dir.log() },
                            });
                        }
                    }
                }
            }
        }
        // A coordinator running the profile's setup (which may take
        // minutes) is not stuck: wait as long as the marker is there and
        // its lock is held. Another terminal's setup is said once.
        let setup_running = dir.setup_marker().exists() && !wait_unlocked(&dir.lock(), Duration::ZERO);
        if setup_running {
            deadline = Instant::now() + START_LIMIT;
            if launched.is_none() && !told_waiting && req.verbosity != Verbosity::Quiet {
                told_waiting = true;
                eprintln!(
                    "lazaret: note: the Domain of profile {} is running its setup (started by another terminal); waiting for it",
                    ctx.profile.name
                );
            }
        }
        if Instant::now() > deadline {
            return Err(ClientError::StartTimeout { socket, secs: START_LIMIT.as_secs(), log: dir.log() });
        }
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// How a Hello was answered.
enum Handshake {
    /// The session is in; the PTY master when it has a terminal.
    Joined(Option<OwnedFd>),
    /// The agent already finished (it could not start).
    Finished(i32),
    /// The coordinator is going away; try again (a new one will publish).
    Retry,
    /// Refused, with the coordinator's reason.
    Refused(String),
}

/// Sends the Hello with the agent's pipe ends (`fds`) and reads the answer.
fn handshake(stream: &UnixStream, hello: &ClientMessage, fds: &[BorrowedFd<'_>]) -> Result<Handshake, ClientError> {
    match transport::write_frame_with_fds(stream, hello, fds) {
        Ok(()) => {}
        Err(FrameError::Io(_)) => return Ok(Handshake::Retry),
        Err(e) => return Err(e.into()),
    }
    loop {
        let (msg, mut fds) = match transport::read_frame_with_fds::<CoordinatorMessage>(stream) {
            Ok(v) => v,
            Err(FrameError::Closed) | Err(FrameError::Io(_)) => return Ok(Handshake::Retry),
            Err(e) => return Err(e.into()),
        };
        match msg {
            CoordinatorMessage::Welcome { .. } => return Ok(Handshake::Joined(if fds.is_empty() { None } else { Some(fds.remove(0)) })),
            CoordinatorMessage::Refused { retry: true, .. } => return Ok(Handshake::Retry),
            CoordinatorMessage::Refused { reason, .. } => return Ok(Handshake::Refused(reason)),
            CoordinatorMessage::Notice { text } => eprintln!("lazaret: {text}"),
            CoordinatorMessage::Exit { status, .. } => return Ok(Handshake::Finished(status)),
            other => return Err(ClientError::Unexpected { request: "Hello", answer: format!("{other:?}") }),
        }
    }
}
