//! A session's I/O: the client never hands its own descriptors to the
//! agent. Each of stdin, stdout and stderr that is a terminal is the agent's
//! PTY (the master comes from the coordinator); each other stream is a fresh
//! pipe whose far end goes to the coordinator, and this relays between the
//! pipe and the client's own descriptor, so file offsets and pipes behave
//! as if the agent wrote there itself. The developer's terminal is in raw
//! mode (restored on every exit path) while stdin is a terminal; signals go
//! to the coordinator as messages, and the agent's exit status comes back.
//!
//! A hangup (the developer's terminal closed or its connection dropped:
//! SIGHUP, or the terminal itself reporting it) is forwarded to the agent as
//! SIGHUP; nothing is read from or written to a terminal that hung up any
//! more (the agent's output is drained and dropped). An agent that has not
//! exited after [`HANGUP_GRACE`] (one that ignores SIGHUP) has its session
//! ended as a second ^C would: SIGKILL, which the coordinator turns into
//! ending the session's whole process tree through its subreaper. The client
//! then exits 129 (128 + SIGHUP).
//!
//! An escalation prompt takes the terminal over (terminal routes Sandbox →
//! Prompt → HostProcess → Sandbox): while it is up the keyboard goes to the
//! [`Prompt`], and the PTY's output is held back and written once it is
//! closed, so the agent's output never interleaves with it. The agent's
//! pipes (streams that are not the terminal) keep flowing.

use std::collections::VecDeque;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;

use lazaret_protocol::escalation::MAX_TIMEOUT_SECS;
use lazaret_protocol::wire::{self, ClientMessage, CoordinatorMessage, PromptDecision, PromptRequest};
use lazaret_runtime::ExitStatus;
use lazaret_runtime::signals::Signals;
use lazaret_runtime::terminal::{RawModeGuard, is_terminal, sync_window_size};

use crate::LAZARET_FAILED;
use crate::layout::DomainDir;

use super::ClientError;
use super::prompt::{Prompt, Step};
use super::vtstate::StreamState;

/// The client's own stdin, stdout and stderr, by number.
struct Std {
    i: std::io::Stdin,
    o: std::io::Stdout,
    e: std::io::Stderr,
}

impl Std {
    fn get() -> Std {
        Std { i: std::io::stdin(), o: std::io::stdout(), e: std::io::stderr() }
    }

    fn fd(&self, n: usize) -> BorrowedFd<'_> {
        match n {
            0 => self.i.as_fd(),
            1 => self.o.as_fd(),
            _ => self.e.as_fd(),
        }
    }
}

/// How a session's three streams reach the agent: which are the PTY, the
/// pipe ends for the agent (sent with the Hello) and the client's ends.
pub(super) struct SessionIo {
    /// Which of stdin, stdout and stderr are terminals (the agent's PTY).
    pub terminal: [bool; 3],
    /// The agent's pipe ends, one per stream that is not a terminal, in
    /// stream order (stdout and stderr may share one pipe).
    agent: Vec<OwnedFd>,
    /// Write end of the agent's stdin pipe.
    stdin: Option<OwnedFd>,
    /// Read ends of the agent's output pipes, with the client stream each
    /// is copied to.
    outputs: Vec<(OwnedFd, usize)>,
}

impl SessionIo {
    /// Looks at the client's stdio and makes a pipe for each stream that is
    /// not a terminal. stdout and stderr on the same file (`2>&1`, one pipe)
    /// share one pipe, which keeps their interleaving.
    pub fn new() -> Result<SessionIo, ClientError> {
        let std = Std::get();
        let terminal = [0, 1, 2].map(|n| is_terminal(std.fd(n)));
        let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(ClientError::errno("creating a pipe for the agent"));
        let mut io = SessionIo { terminal, agent: Vec::new(), stdin: None, outputs: Vec::new() };
        if !terminal[0] {
            let (r, w) = pipe()?;
            io.agent.push(r);
            io.stdin = Some(w);
        }
        let shared = !terminal[1] && !terminal[2] && same_file(std.fd(1), std.fd(2));
        if !terminal[1] {
            let (r, w) = pipe()?;
            if shared {
                io.agent.push(w.try_clone().map_err(ClientError::io("duplicating a pipe"))?);
            }
            io.agent.push(w);
            io.outputs.push((r, 1));
        }
        if !terminal[2] && !shared {
            let (r, w) = pipe()?;
            io.agent.push(w);
            io.outputs.push((r, 2));
        }
        Ok(io)
    }

    /// The size of the client's terminal that sizes the PTY (stdin if it
    /// is one, else stdout, else stderr); (0, 0) when unknown.
    pub fn window_size(&self) -> (u16, u16) {
        let std = Std::get();
        (0..3)
            .find(|&n| self.terminal[n])
            .and_then(|n| lazaret_runtime::terminal::window_size(std.fd(n)).ok())
            .map(|w| (w.rows, w.cols))
            .unwrap_or((0, 0))
    }

    /// The agent's pipe ends, to send with the Hello.
    pub fn agent_ends(&self) -> Vec<BorrowedFd<'_>> {
        self.agent.iter().map(|f| f.as_fd()).collect()
    }
}

/// Whether two descriptors are the same file (device and inode).
fn same_file(a: BorrowedFd<'_>, b: BorrowedFd<'_>) -> bool {
    let meta = |fd: BorrowedFd<'_>| {
        fd.try_clone_to_owned().ok().map(std::fs::File::from).and_then(|f| f.metadata().ok()).map(|m| (m.dev(), m.ino()))
    };
    matches!((meta(a), meta(b)), (Some(x), Some(y)) if x == y)
}

/// Serves the session until the coordinator reports the agent's exit.
pub(super) fn attach(
    stream: &UnixStream,
    master: Option<OwnedFd>,
    io: SessionIo,
    signals: &mut Signals,
    dir: &DomainDir,
) -> Result<ExitStatus, ClientError> {
    let SessionIo { terminal, agent, stdin, outputs } = io;
    // The agent's ends are with the coordinator now: ours must go, or the
    // agent would never see end of file.
    drop(agent);
    if master.is_some() != terminal.iter().any(|t| *t) {
        return Err(ClientError::Unexpected { request: "Hello", answer: "a Welcome without the PTY the session needs".into() });
    }
    let std = Std::get();
    let raw = match (&master, terminal[0]) {
        (Some(_), true) => Some(RawModeGuard::enter(std.fd(0)).map_err(ClientError::errno("setting the terminal to raw mode"))?),
        _ => None,
    };
    let sizing = (0..3).find(|&n| terminal[n]);
    if let (Some(m), Some(n)) = (&master, sizing) {
        sync_window_size(std.fd(n), m.as_fd());
    }
    for fd in master.iter().chain(stdin.iter()).chain(outputs.iter().map(|(f, _)| f)) {
        let _ = fcntl(fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
    }
    let mut relay = Relay {
        stream,
        input_open: master.is_some() && terminal[0] || stdin.is_some(),
        input_to_master: terminal[0],
        master_out: [1, 2, 0].into_iter().find(|&n| terminal[n]).unwrap_or(1),
        sizing,
        master,
        stdin,
        outputs: outputs.into_iter().map(|(fd, to)| Output { fd: Some(fd), to }).collect(),
        raw: raw.is_some(),
        prompt_screen: [1, 2].into_iter().find(|&n| terminal[n]),
        std,
        to_agent: Vec::new(),
        exit: None,
        terminations: 0,
        buf: vec![0u8; 16 * 1024],
        prompt: None,
        queued: VecDeque::new(),
        held: Vec::new(),
        held_notices: Vec::new(),
        terminal,
        terminal_gone: false,
        hangup: None,
        agent_screen: StreamState::default(),
        redraw_at: None,
    };
    let outcome = relay.run(signals, dir);
    // A lost connection leaves a prompt up: close it (no answer can go).
    relay.close_prompt("the connection to the coordinator ended");
    drop(raw);
    outcome?;
    // The coordinator sends the exit before it tears the Domain down; a
    // rerun waits for the Domain lock itself. A session the client ended
    // after a hangup reports the hangup, not the SIGKILL that ended it.
    let status = match (&relay.hangup, relay.exit) {
        (Some(Hangup { ended_at: Some(_), .. }), _) => HANGUP_STATUS,
        (_, Some(status)) => status,
        (_, None) => LAZARET_FAILED,
    };
    Ok(ExitStatus(status))
}

/// Most bytes buffered for the agent before the developer's input waits.
const INPUT_BACKLOG: usize = 64 * 1024;

/// Most bytes of the PTY's output held back while a prompt is up; then the
/// master is not read, and the PTY makes the agent wait.
const HOLD_LIMIT: usize = 4 * 1024 * 1024;

/// Keys typed within this long of a prompt appearing, or of the previous
/// such key, are dropped: they were meant for the agent, not for the prompt
/// that popped up under the developer's fingers (the agent sees the
/// keyboard and could time a request to it).
const PROMPT_ARMING: Duration = Duration::from_millis(300);
/// A key that approves must come at least this long after the terminal's
/// previous input: the rest of an answer the terminal split across reads
/// comes at once, a person's next key press does not.
const KEY_QUIET: Duration = Duration::from_millis(50);

/// How long past a prompt's timeout the client waits for the coordinator's
/// withdrawal before it closes the prompt itself, answering deny.
const WITHDRAWAL_GRACE: Duration = Duration::from_secs(3);

/// How long the agent may take to exit after a hangup was forwarded to it
/// before the client ends its session (an agent that ignores SIGHUP would
/// otherwise hold the Domain up forever, with nobody left to see it).
const HANGUP_GRACE: Duration = Duration::from_secs(3);

/// How long the client waits for the agent's exit once it asked for the
/// session's end after a hangup; then it leaves anyway (the coordinator
/// ends the tree of a session whose client went away, too).
const HANGUP_EXIT_WAIT: Duration = Duration::from_secs(5);

/// The client's status when it ended its session after a hangup: as a
/// process killed by SIGHUP (128 + 1).
pub(super) const HANGUP_STATUS: i32 = 128 + libc::SIGHUP;

/// How long the agent's terminal stays one row smaller after a prompt over
/// its alternate screen (long enough for its program to see the change).
const REDRAW_NUDGE: Duration = Duration::from_millis(150);

/// How often the relay wakes while a prompt is up (the time left, the
/// deadline).
const PROMPT_TICK: u16 = 200;

/// Most prompts queued behind the one shown (the coordinator shows one per
/// session at a time; more are denied).
const PROMPT_QUEUE: usize = 16;

/// The prompt on screen.
struct Showing {
    prompt: Prompt,
    /// When the request times out (the coordinator's clock decides; this
    /// shows it and closes a prompt the coordinator never withdrew).
    deadline: Instant,
    /// Keys before this are dropped ([`PROMPT_ARMING`]).
    armed_at: Instant,
    /// When the terminal last sent anything (see [`KEY_QUIET`]).
    last_input: Option<Instant>,
    /// `/dev/tty`, when neither stdout nor stderr is the terminal.
    tty: Option<OwnedFd>,
    /// Which of the client's streams shows it otherwise.
    screen: usize,
    /// The escape sequence or string the agent's output was in the middle
    /// of when the prompt appeared (the prompt cancelled it): written again
    /// after the prompt, before the output held back, which finishes it.
    unfinished: Vec<u8>,
}

/// A hangup under way: the agent was sent SIGHUP.
struct Hangup {
    /// When the agent's grace ends and its session is ended.
    grace_ends: Instant,
    /// When the client asked for the session's end, if the grace ran out.
    ended_at: Option<Instant>,
}

/// One of the agent's output pipes and the client stream it goes to.
struct Output {
    fd: Option<OwnedFd>,
    to: usize,
}

/// The state of one session's relay.
struct Relay<'a> {
    stream: &'a UnixStream,
    /// The PTY master, while it gives output.
    master: Option<OwnedFd>,
    /// Where the PTY's output goes: the client's first terminal among
    /// stdout, stderr, stdin.
    master_out: usize,
    /// The client's terminal that sizes the PTY.
    sizing: Option<usize>,
    /// Whether the client's stdin is still read.
    input_open: bool,
    /// stdin is a terminal: input goes to the PTY, not to a pipe.
    input_to_master: bool,
    /// The agent's stdin pipe (write end), until the client's stdin ends.
    stdin: Option<OwnedFd>,
    outputs: Vec<Output>,
    /// Whether the developer's terminal is in raw mode (notices need CRLF).
    raw: bool,
    /// Where prompts are shown: stdout or stderr, whichever is a terminal
    /// first; `None`: neither is, /dev/tty is opened.
    prompt_screen: Option<usize>,
    std: Std,
    to_agent: Vec<u8>,
    /// The agent's status, once known.
    exit: Option<i32>,
    terminations: u32,
    buf: Vec<u8>,
    /// The escalation prompt on screen, if any.
    prompt: Option<Showing>,
    /// Prompts waiting behind it.
    queued: VecDeque<PromptRequest>,
    /// The PTY's output held back while a prompt is up.
    held: Vec<u8>,
    /// The coordinator's notices held back while a prompt is up.
    held_notices: Vec<String>,
    /// Which of the client's stdin, stdout and stderr are terminals.
    terminal: [bool; 3],
    /// The developer's terminal hung up: nothing is read from it or
    /// written to it any more.
    terminal_gone: bool,
    /// Set once the client forwarded a hangup to the agent.
    hangup: Option<Hangup>,
    /// What the agent's terminal output left the developer's terminal in.
    agent_screen: StreamState,
    /// When the agent's terminal gets its real size back, after a prompt
    /// drawn over its alternate screen made it one row smaller so that its
    /// program redraws ([`Relay::nudge_redraw`]).
    redraw_at: Option<Instant>,
}

/// What one poll round found ready.
struct Ready {
    signals: bool,
    socket: PollFlags,
    master: PollFlags,
    input: PollFlags,
    stdin_pipe: PollFlags,
    outputs: Vec<PollFlags>,
    /// The developer's terminal, watched for a hangup only.
    watch: PollFlags,
    timed_out: bool,
}

const READABLE: PollFlags = PollFlags::POLLIN.union(PollFlags::POLLHUP).union(PollFlags::POLLERR);

impl Relay<'_> {
    /// Whether any of the agent's output may still come.
    fn output_open(&self) -> bool {
        self.master.is_some() || self.outputs.iter().any(|o| o.fd.is_some())
    }

    /// Relays until the agent's exit is known and its output drained (or
    /// quiet for a moment: something it left behind may hold a pipe).
    fn run(&mut self, signals: &mut Signals, dir: &DomainDir) -> Result<(), ClientError> {
        loop {
            let ready = match self.poll(signals)? {
                Some(r) => r,
                None => continue,
            };
            if self.exit.is_some() && (ready.timed_out || !self.output_open()) {
                return Ok(());
            }
            if ready.watch.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL) {
                self.on_terminal_gone();
            }
            if ready.signals {
                self.on_signals(signals);
            }
            if ready.socket.intersects(READABLE) {
                self.on_message(dir)?;
            }
            self.pump_outputs(&ready);
            if self.prompt.is_some() {
                self.prompt_input(&ready);
                // Keys typed before the prompt appeared still go.
                self.flush_to_agent(&ready);
                self.prompt_tick();
            } else {
                self.pump_input(&ready);
            }
            if self.exit.is_some() && !self.output_open() {
                return Ok(());
            }
            self.redraw_tick();
            if self.hangup_tick() {
                return Ok(());
            }
        }
    }

    /// Waits for the next events; `None` when interrupted.
    fn poll(&self, signals: &Signals) -> Result<Option<Ready>, ClientError> {
        let mut fds = vec![PollFd::new(signals.fd(), PollFlags::POLLIN)];
        fn add<'f>(fds: &mut Vec<PollFd<'f>>, fd: BorrowedFd<'f>, flags: PollFlags) -> Option<usize> {
            fds.push(PollFd::new(fd, flags));
            Some(fds.len() - 1)
        }
        let socket = if self.exit.is_none() { add(&mut fds, self.stream.as_fd(), PollFlags::POLLIN) } else { None };
        let master = match &self.master {
            Some(m) => {
                let mut f = PollFlags::empty();
                // With the hold full, the PTY makes the agent wait.
                if self.prompt.is_none() || self.held.len() < HOLD_LIMIT {
                    f |= PollFlags::POLLIN;
                }
                if self.input_to_master && !self.to_agent.is_empty() {
                    f |= PollFlags::POLLOUT;
                }
                // Not polled at all otherwise: a hung-up master would
                // report POLLHUP on every round.
                if f.is_empty() { None } else { add(&mut fds, m.as_fd(), f) }
            }
            None => None,
        };
        let stdin_pipe = match &self.stdin {
            Some(p) if !self.to_agent.is_empty() => add(&mut fds, p.as_fd(), PollFlags::POLLOUT),
            _ => None,
        };
        let destination = if self.input_to_master { self.master.is_some() } else { self.stdin.is_some() };
        // A prompt takes the keyboard whatever the agent's backlog.
        let wanted = if self.prompt.is_some() { true } else { destination && self.to_agent.len() < INPUT_BACKLOG };
        let input = if self.input_open && wanted { add(&mut fds, self.std.fd(0), PollFlags::POLLIN) } else { None };
        let outputs: Vec<Option<usize>> =
            self.outputs.iter().map(|o| o.fd.as_ref().and_then(|f| add(&mut fds, f.as_fd(), PollFlags::POLLIN))).collect();
        // No events asked: a terminal reports POLLHUP when it hung up, even
        // while nothing is read from it or written to it. Once gone, it is
        // not polled again (it would report POLLHUP on every round).
        let watch = match self.sizing {
            Some(n) if !self.terminal_gone => add(&mut fds, self.std.fd(n), PollFlags::empty()),
            _ => None,
        };
        let mut timeout = if self.exit.is_some() {
            PollTimeout::from(100u16)
        } else if self.prompt.is_some() {
            PollTimeout::from(PROMPT_TICK)
        } else {
            PollTimeout::NONE
        };
        if let Some(next) = self.hangup_deadline().into_iter().chain(self.redraw_at).min() {
            let ms = next.saturating_duration_since(Instant::now()).as_millis().saturating_add(1);
            let ms = PollTimeout::from(u16::try_from(ms).unwrap_or(u16::MAX));
            if timeout == PollTimeout::NONE || ms < timeout {
                timeout = ms;
            }
        }
        let n = match poll(&mut fds, timeout) {
            Err(Errno::EINTR) => return Ok(None),
            Err(e) => return Err(ClientError::errno("waiting for terminal events")(e)),
            Ok(n) => n,
        };
        let revents = |i: Option<usize>| i.and_then(|i| fds.get(i)).and_then(|f| f.revents()).unwrap_or(PollFlags::empty());
        Ok(Some(Ready {
            signals: revents(Some(0)).contains(PollFlags::POLLIN),
            socket: revents(socket),
            master: revents(master),
            input: revents(input),
            stdin_pipe: revents(stdin_pipe),
            outputs: outputs.into_iter().map(revents).collect(),
            watch: revents(watch),
            timed_out: n == 0,
        }))
    }

    /// Window changes go to the PTY; termination signals to the agent (in
    /// raw mode the terminal sends no INT/QUIT; a hangup or a signal from
    /// another process ends the agent too), SIGKILL from the second one on.
    fn on_signals(&mut self, signals: &mut Signals) {
        let mut out = self.stream;
        while let Some(sig) = signals.next_pending() {
            match sig {
                Signal::SIGWINCH => {
                    if let (Some(m), Some(n)) = (&self.master, self.sizing) {
                        sync_window_size(self.std.fd(n), m.as_fd());
                    }
                    let (rows, cols) = self.window_rows_cols();
                    if let Some(showing) = self.prompt.as_mut() {
                        // Drawn anew for the new size (a terminal may
                        // rewrap or cut the rows it had).
                        showing.prompt.set_width(cols);
                        showing.prompt.set_height(rows);
                        let _ = write_all(showing.fd(&self.std), &showing.prompt.redraw());
                    }
                }
                // The agent gets its grace. The kernel's SIGHUP often comes
                // after the terminal itself showed the hangup (POLLHUP): the
                // same hangup, not a second signal that would end it at once.
                Signal::SIGHUP => {
                    self.check_terminal();
                    self.hang_up();
                }
                Signal::SIGINT | Signal::SIGTERM | Signal::SIGQUIT => {
                    self.terminations += 1;
                    let signal = if self.terminations == 1 { sig as i32 } else { libc::SIGKILL };
                    if let (libc::SIGKILL, Some(h)) = (signal, self.hangup.as_mut()) {
                        h.ended_at.get_or_insert_with(Instant::now);
                    }
                    let _ = wire::write_message(&mut out, &ClientMessage::Signal { signal });
                }
                _ => {}
            }
        }
    }

    /// One message from the coordinator: the exit, or a notice to show.
    fn on_message(&mut self, dir: &DomainDir) -> Result<(), ClientError> {
        let mut from = self.stream;
        match wire::read_message::<CoordinatorMessage>(&mut from) {
            Ok(CoordinatorMessage::Exit { status }) => {
                self.exit = Some(status);
                // The session is over: nothing left to answer.
                self.close_prompt("the session ended");
            }
            Ok(CoordinatorMessage::Prompt(request)) => self.on_prompt(request),
            Ok(CoordinatorMessage::PromptWithdrawn { request, reason }) => self.on_withdrawn(&request, &reason),
            Ok(CoordinatorMessage::Notice { text }) if self.prompt.is_some() => self.held_notices.push(text),
            Ok(CoordinatorMessage::Notice { text }) => self.show_notice(&text),
            Ok(_) => {}
            Err(e) => return Err(ClientError::ConnectionLost { cause: e, log: dir.log() }),
        }
        Ok(())
    }

    /// A notice from the coordinator, on stderr (if it is still there:
    /// written, not `eprint!`ed, which would panic on a hung-up terminal).
    fn show_notice(&self, text: &str) {
        if self.terminal_gone && self.terminal[2] {
            return;
        }
        let line = if self.raw { format!("\r\nlazaret: {text}\r\n") } else { format!("lazaret: {text}\n") };
        let _ = write_all(self.std.fd(2), line.as_bytes());
    }

    /// Writes the PTY's output to the developer's terminal; a terminal that
    /// hung up is noticed here too (EIO), and then written to no more.
    fn write_terminal(&mut self, data: &[u8]) {
        self.agent_screen.feed(data);
        if self.terminal_gone {
            return;
        }
        if write_all(self.std.fd(self.master_out), data).is_err() {
            self.check_terminal();
        }
    }

    /// The agent's output (PTY and pipes) to the client's streams.
    fn pump_outputs(&mut self, ready: &Ready) {
        if let Some(m) = &self.master {
            // While a prompt is up, into the hold, never past its limit.
            let holding = self.prompt.is_some();
            let room = if holding { HOLD_LIMIT.saturating_sub(self.held.len()).min(self.buf.len()) } else { self.buf.len() };
            if ready.master.intersects(READABLE) && room > 0 {
                match nix::unistd::read(m.as_fd(), &mut self.buf[..room]) {
                    Ok(0) | Err(Errno::EIO) => self.master = None,
                    Ok(n) if holding => self.held.extend_from_slice(&self.buf[..n]),
                    Ok(n) => {
                        // Still drained once the terminal is gone: an agent
                        // that writes while it exits must not block.
                        let out = std::mem::take(&mut self.buf);
                        self.write_terminal(&out[..n]);
                        self.buf = out;
                    }
                    Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                    Err(_) => self.master = None,
                }
            }
        }
        for (o, events) in self.outputs.iter_mut().zip(&ready.outputs) {
            let Some(fd) = &o.fd else { continue };
            if !events.intersects(READABLE) {
                continue;
            }
            match nix::unistd::read(fd.as_fd(), &mut self.buf) {
                Ok(0) => o.fd = None,
                Ok(n) => {
                    // A stream nobody reads any more (a closed pipe): the
                    // agent gets EPIPE too, as it would writing there itself.
                    if write_all(self.std.fd(o.to), &self.buf[..n]).is_err() {
                        o.fd = None;
                    }
                }
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => o.fd = None,
            }
        }
    }

    /// The client's stdin, buffered for the agent (its PTY or its pipe); at
    /// the end of stdin, the agent's stdin pipe is closed once drained.
    fn pump_input(&mut self, ready: &Ready) {
        if ready.input.intersects(READABLE) {
            match nix::unistd::read(self.std.fd(0), &mut self.buf) {
                Ok(n) if n > 0 => self.to_agent.extend_from_slice(&self.buf[..n]),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                // In raw mode a terminal gives no end of file: it hung up.
                _ => {
                    self.input_open = false;
                    if self.terminal[0] {
                        self.check_terminal();
                    }
                }
            }
        }
        self.flush_to_agent(ready);
    }

    /// What the developer typed for the agent, to its PTY or pipe.
    fn flush_to_agent(&mut self, ready: &Ready) {
        let target = if self.input_to_master { (self.master.as_ref(), ready.master) } else { (self.stdin.as_ref(), ready.stdin_pipe) };
        if let (Some(fd), events) = target {
            if events.contains(PollFlags::POLLOUT) && !self.to_agent.is_empty() {
                match nix::unistd::write(fd, &self.to_agent) {
                    Ok(n) => {
                        self.to_agent.drain(..n);
                    }
                    Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                    Err(_) => {
                        self.to_agent.clear();
                        self.input_open = false;
                        if !self.input_to_master {
                            self.stdin = None;
                        }
                    }
                }
            } else if !self.input_to_master && events.intersects(PollFlags::POLLERR | PollFlags::POLLHUP) {
                // The agent closed its stdin.
                self.to_agent.clear();
                self.input_open = false;
                self.stdin = None;
            }
        }
        if !self.input_to_master && !self.input_open && self.to_agent.is_empty() {
            self.stdin = None;
        }
    }
}

/// Hangups: the developer's terminal closed or its connection dropped.
impl Relay<'_> {
    /// Whether the developer's terminal (the first of the client's streams
    /// that is one) hung up: it then reports POLLHUP, whatever is asked.
    fn terminal_hung_up(&self) -> bool {
        let Some(n) = self.sizing else { return false };
        let mut p = [PollFd::new(self.std.fd(n), PollFlags::empty())];
        matches!(poll(&mut p, PollTimeout::ZERO), Ok(1)) && p[0].revents().is_some_and(|r| r.contains(PollFlags::POLLHUP))
    }

    /// After a sign of a hangup (SIGHUP, POLLHUP, end of file or EIO on
    /// the terminal): if the terminal really is gone, nothing is read from
    /// or written to it any more, and the hangup goes to the agent.
    fn check_terminal(&mut self) {
        if !self.terminal_gone && self.terminal_hung_up() {
            self.on_terminal_gone();
        }
    }

    /// The terminal hung up: see [`Relay::check_terminal`].
    fn on_terminal_gone(&mut self) {
        if self.terminal_gone {
            return;
        }
        self.terminal_gone = true;
        if self.input_to_master {
            self.input_open = false;
        }
        self.held.clear();
        self.hang_up();
    }

    /// Forwards the hangup to the agent (once) and starts its grace. Prompts
    /// are denied: the session is going away.
    fn hang_up(&mut self) {
        if self.hangup.is_some() || self.exit.is_some() {
            return;
        }
        self.hangup = Some(Hangup { grace_ends: Instant::now() + HANGUP_GRACE, ended_at: None });
        // A further termination signal ends the agent at once.
        self.terminations += 1;
        let mut out = self.stream;
        let _ = wire::write_message(&mut out, &ClientMessage::Signal { signal: libc::SIGHUP });
        self.deny_all(if self.terminal_gone { "the terminal hung up" } else { "hangup (SIGHUP): the session ends" });
    }

    /// The next moment [`Relay::hangup_tick`] has something to do.
    fn hangup_deadline(&self) -> Option<Instant> {
        match (&self.hangup, self.exit) {
            (Some(h), None) => Some(match h.ended_at {
                None => h.grace_ends,
                Some(at) => at + HANGUP_EXIT_WAIT,
            }),
            _ => None,
        }
    }

    /// Past the grace, ends the session: SIGKILL, which the coordinator
    /// turns into ending the session's tree (`Domain::kill_session_tree`:
    /// `session::END_SIGNAL` to its subreaper, which kills the agent and
    /// everything it left, double-forked processes too). Returns
    /// true when the agent's exit did not come in time after that: the
    /// client leaves (closing the connection, which makes the coordinator
    /// end the session's tree again).
    fn hangup_tick(&mut self) -> bool {
        let Some(deadline) = self.hangup_deadline() else { return false };
        if Instant::now() < deadline {
            return false;
        }
        let Some(h) = self.hangup.as_mut() else { return false };
        if h.ended_at.is_some() {
            return true;
        }
        h.ended_at = Some(Instant::now());
        let mut out = self.stream;
        let _ = wire::write_message(&mut out, &ClientMessage::Signal { signal: libc::SIGKILL });
        false
    }
}

/// The escalation prompt (see [`super::prompt`] for the screen and keys).
impl Relay<'_> {
    /// A request for the developer: shown now, or queued behind the prompt
    /// on screen. A session whose stdin is not a terminal cannot be asked
    /// (the coordinator does not ask it; this is defensive): denied.
    fn on_prompt(&mut self, request: PromptRequest) {
        if !self.input_to_master || !self.input_open || self.hangup.is_some() {
            self.answer(&request.request, PromptDecision::Deny);
            return;
        }
        let id = request.request.as_str();
        if self.prompt.as_ref().is_some_and(|s| s.prompt.request_id() == id) || self.queued.iter().any(|q| q.request == id) {
            return;
        }
        if self.prompt.is_none() {
            self.show(request);
        } else if self.queued.len() < PROMPT_QUEUE {
            self.queued.push_back(request);
        } else {
            self.answer(&request.request, PromptDecision::Deny);
        }
    }

    /// Puts `request` on screen: stdout if it is the terminal, else stderr,
    /// else /dev/tty (else stdin, a terminal too). Denied if it cannot be
    /// shown.
    fn show(&mut self, request: PromptRequest) {
        let now = Instant::now();
        let timeout = Duration::from_secs(request.timeout_secs.min(MAX_TIMEOUT_SECS));
        let mut prompt = Prompt::new(request).over(&self.agent_screen);
        let (rows, cols) = self.window_rows_cols();
        prompt.set_width(cols);
        prompt.set_height(rows);
        let tty = match self.prompt_screen {
            Some(_) => None,
            None => nix::fcntl::open("/dev/tty", OFlag::O_WRONLY | OFlag::O_NOCTTY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty()).ok(),
        };
        let showing = Showing {
            prompt,
            deadline: now + timeout,
            armed_at: now + PROMPT_ARMING,
            last_input: None,
            tty,
            screen: self.prompt_screen.unwrap_or(0),
            unfinished: self.agent_screen.unfinished().map(<[u8]>::to_vec).unwrap_or_default(),
        };
        if write_all(showing.fd(&self.std), &showing.prompt.render()).is_err() {
            self.answer(showing.prompt.request_id(), PromptDecision::Deny);
            return;
        }
        self.prompt = Some(showing);
    }

    /// The developer's keys, to the prompt (dropped while it arms).
    fn prompt_input(&mut self, ready: &Ready) {
        if !ready.input.intersects(READABLE) {
            return;
        }
        let n = match nix::unistd::read(self.std.fd(0), &mut self.buf) {
            Ok(0) | Err(Errno::EBADF | Errno::EIO) => {
                // The terminal is gone: nobody can answer.
                self.input_open = false;
                self.deny_all("the terminal closed");
                self.check_terminal();
                return;
            }
            Ok(n) => n,
            Err(_) => return,
        };
        let Some(showing) = self.prompt.as_mut() else { return };
        let now = Instant::now();
        let after_quiet = showing.last_input.is_none_or(|last| now.duration_since(last) >= KEY_QUIET);
        showing.last_input = Some(now);
        if now < showing.armed_at {
            showing.armed_at = now + PROMPT_ARMING;
            return;
        }
        match showing.prompt.on_input_after(&self.buf[..n], after_quiet) {
            Step::Nothing => {}
            Step::Redraw(bytes) => {
                let _ = write_all(showing.fd(&self.std), &bytes);
            }
            Step::Answer(decision, text) => {
                let id = showing.prompt.request_id().to_owned();
                self.answer(&id, decision);
                self.finish(&text);
            }
        }
    }

    /// The time left, redrawn; a prompt the coordinator did not withdraw
    /// in time is closed here, denied.
    fn prompt_tick(&mut self) {
        let Some(showing) = self.prompt.as_mut() else { return };
        let now = Instant::now();
        if now > showing.deadline + WITHDRAWAL_GRACE {
            let id = showing.prompt.request_id().to_owned();
            let text = showing.prompt.abandoned("no answer in time, denied");
            self.answer(&id, PromptDecision::Deny);
            self.finish(&text);
            return;
        }
        if let Some(bytes) = showing.prompt.tick(showing.deadline.saturating_duration_since(now)) {
            let _ = write_all(showing.fd(&self.std), &bytes);
        }
    }

    /// The coordinator closed a request: the prompt on screen, or one
    /// waiting.
    fn on_withdrawn(&mut self, request: &str, reason: &str) {
        match &self.prompt {
            Some(showing) if showing.prompt.request_id() == request => {
                let text = showing.prompt.withdrawn(reason);
                self.finish(&text);
            }
            _ => self.queued.retain(|q| q.request != request),
        }
    }

    /// Closes the prompt on screen, and drops the waiting ones, without
    /// answering (the session or the connection ended).
    fn close_prompt(&mut self, why: &str) {
        self.queued.clear();
        if let Some(showing) = &self.prompt {
            let text = showing.prompt.abandoned(why);
            self.finish(&text);
        }
    }

    /// Denies the prompt on screen and the waiting ones.
    fn deny_all(&mut self, why: &str) {
        let ids: Vec<String> =
            self.prompt.iter().map(|s| s.prompt.request_id().to_owned()).chain(self.queued.iter().map(|q| q.request.clone())).collect();
        for id in ids {
            self.answer(&id, PromptDecision::Deny);
        }
        self.close_prompt(why);
    }

    /// Takes the prompt down with its final `text`, then writes what was
    /// held back, then shows the next prompt, if any.
    fn finish(&mut self, text: &[u8]) {
        let Some(showing) = self.prompt.take() else { return };
        if !self.terminal_gone {
            let _ = write_all(showing.fd(&self.std), text);
            if showing.prompt.over_alternate() {
                self.nudge_redraw();
            }
        }
        // Not fed to `agent_screen`: it is still in that sequence.
        if !self.terminal_gone && !showing.unfinished.is_empty() {
            let _ = write_all(self.std.fd(self.master_out), &showing.unfinished);
        }
        drop(showing);
        let held = std::mem::take(&mut self.held);
        self.write_terminal(&held);
        for notice in std::mem::take(&mut self.held_notices) {
            self.show_notice(&notice);
        }
        // A prompt that cannot be shown is denied: on to the next.
        while self.prompt.is_none() {
            let Some(next) = self.queued.pop_front() else { break };
            self.show(next);
        }
    }

    /// Asks the agent's full-screen program to redraw the screen the prompt
    /// was drawn over: its terminal is made one row smaller now and given
    /// its real size back a moment later ([`REDRAW_NUDGE`]), two real size
    /// changes, each a SIGWINCH (a program that redraws only when the size
    /// differs from the last it saw redraws too).
    fn nudge_redraw(&mut self) {
        let (Some(m), Some(n)) = (&self.master, self.sizing) else { return };
        let Ok(size) = lazaret_runtime::terminal::window_size(self.std.fd(n)) else { return };
        let rows = if size.rows > 1 { size.rows - 1 } else { size.rows + 1 };
        if lazaret_runtime::terminal::set_window_size(m.as_fd(), lazaret_runtime::terminal::WindowSize { rows, cols: size.cols }).is_ok() {
            self.redraw_at = Some(Instant::now() + REDRAW_NUDGE);
        }
    }

    /// Gives the agent's terminal its real size back once the nudge's time
    /// is over.
    fn redraw_tick(&mut self) {
        if self.redraw_at.is_some_and(|at| Instant::now() >= at) {
            self.redraw_at = None;
            if let (Some(m), Some(n)) = (&self.master, self.sizing) {
                sync_window_size(self.std.fd(n), m.as_fd());
            }
        }
    }

    /// Sends the developer's decision (a lost connection shows on reading).
    fn answer(&self, request: &str, decision: PromptDecision) {
        let mut out = self.stream;
        let _ = wire::write_message(&mut out, &ClientMessage::PromptAnswer { request: request.to_owned(), decision });
    }

    /// The terminal's height and width (prompts are shown only when stdin
    /// is one); 0 when unknown.
    fn window_rows_cols(&self) -> (u16, u16) {
        lazaret_runtime::terminal::window_size(self.std.fd(0)).map(|w| (w.rows, w.cols)).unwrap_or((0, 0))
    }
}

impl Showing {
    /// The descriptor the prompt is written to.
    fn fd<'s>(&'s self, std: &'s Std) -> BorrowedFd<'s> {
        match &self.tty {
            Some(tty) => tty.as_fd(),
            None => std.fd(self.screen),
        }
    }
}

/// Writes all of `data` to one of the client's own streams (which may be
/// non-blocking: then it waits for room). Fails when the stream is gone.
fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) -> Result<(), Errno> {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(0) => return Err(Errno::EIO),
            Ok(n) => data = &data[n..],
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                let mut p = [PollFd::new(fd, PollFlags::POLLOUT)];
                let _ = poll(&mut p, PollTimeout::from(1000u16));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The relay with a prompt, end to end without a coordinator: the test
    //! binary runs itself as the client (its stdio a PTY standing in for the
    //! developer's terminal), plays the coordinator on a unix socket, and is
    //! the agent on the slave of the agent's PTY.

    use super::*;
    use std::io::Write as _;
    use std::os::unix::net::UnixListener;
    use std::process::{Child, Command, Stdio};

    use lazaret_runtime::terminal::{WindowSize, open_pty, set_window_size};
    use nix::sys::termios;

    use crate::transport;

    /// Set in the child: the coordinator's socket path.
    const CHILD: &str = "LAZARET_TEST_PROMPT_RELAY_SOCKET";
    const TEST: &str = "client::terminal::tests::a_prompt_takes_the_terminal_and_gives_it_back";
    const LIMIT: Duration = Duration::from_secs(20);

    /// The client: joins the "coordinator", takes the PTY master from its
    /// first frame, and relays until the Exit.
    fn client(socket: &std::ffi::OsStr) -> ! {
        let stream = UnixStream::connect(socket).expect("connect");
        let (_, mut fds) = transport::read_frame_with_fds::<CoordinatorMessage>(&stream).expect("the master");
        let io = SessionIo::new().expect("session io");
        let mut signals = Signals::block().expect("signals");
        let dir = DomainDir::new(std::env::temp_dir());
        let status = attach(&stream, fds.pop(), io, &mut signals, &dir);
        std::process::exit(match status {
            Ok(s) => s.0,
            Err(_) => 99,
        })
    }

    /// Kills and reaps the client on every way out of the test.
    struct Reaped(Child);

    impl Drop for Reaped {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// The developer's side of the terminal.
    struct Screen {
        master: OwnedFd,
        seen: String,
    }

    impl Screen {
        /// Reads until `needle` appears after byte `from` of what was seen.
        fn wait_for(&mut self, needle: &str, from: usize) -> usize {
            let deadline = Instant::now() + LIMIT;
            loop {
                if let Some(at) = self.seen.get(from..).and_then(|s| s.find(needle)) {
                    return from + at;
                }
                assert!(Instant::now() < deadline, "{needle:?} never appeared; the screen: {:?}", self.seen);
                self.read_for(Duration::from_millis(100));
            }
        }

        /// Reads whatever comes for `time`.
        fn read_for(&mut self, time: Duration) {
            let end = Instant::now() + time;
            let mut buf = [0u8; 4096];
            while let Some(left) = end.checked_duration_since(Instant::now()) {
                let mut p = [PollFd::new(self.master.as_fd(), PollFlags::POLLIN)];
                let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX).max(1);
                if poll(&mut p, PollTimeout::from(ms)).unwrap_or(0) == 0 {
                    continue;
                }
                match nix::unistd::read(self.master.as_fd(), &mut buf) {
                    Ok(n) if n > 0 => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                    _ => return,
                }
            }
        }

        /// Accepts the client's connection (showing what it printed if it
        /// never comes: it may fail before it connects) and hands it the
        /// agent's PTY master, as the coordinator does.
        fn accept_client(&mut self, listener: &UnixListener, agent_master: OwnedFd) -> UnixStream {
            listener.set_nonblocking(true).expect("nonblocking");
            let deadline = Instant::now() + LIMIT;
            let coordinator = loop {
                match listener.accept() {
                    Ok((stream, _)) => break stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                        self.read_for(Duration::from_millis(20))
                    }
                    Err(e) => panic!("the client did not connect ({e}); its terminal: {:?}", self.seen),
                }
            };
            coordinator.set_nonblocking(false).expect("blocking");
            coordinator.set_read_timeout(Some(LIMIT)).expect("timeout");
            transport::write_frame_with_fds(&coordinator, &CoordinatorMessage::Notice { text: "master".into() }, &[agent_master.as_fd()])
                .expect("send the master");
            coordinator
        }

        fn type_keys(&self, keys: &[u8]) {
            write_all(self.master.as_fd(), keys).expect("typing");
        }
    }

    fn send(coordinator: &UnixStream, msg: &CoordinatorMessage) {
        let mut out = coordinator;
        wire::write_message(&mut out, msg).expect("to the client");
    }

    fn receive(coordinator: &UnixStream) -> ClientMessage {
        let mut from = coordinator;
        wire::read_message::<ClientMessage>(&mut from).expect("from the client")
    }

    fn prompt(id: &str) -> CoordinatorMessage {
        CoordinatorMessage::Prompt(PromptRequest {
            request: id.into(),
            profile: "dev".into(),
            session: "s-1".into(),
            cwd: "/w".into(),
            argv: vec!["git".into(), "push".into()],
            justification: "push it\x1b[2J\u{202e}".into(),
            timeout_secs: 60,
        })
    }

    /// Reads what the agent got on its terminal within `time`.
    fn agent_input(slave: &OwnedFd, time: Duration) -> String {
        let mut got = Vec::new();
        let end = Instant::now() + time;
        let mut buf = [0u8; 256];
        while Instant::now() < end {
            let mut p = [PollFd::new(slave.as_fd(), PollFlags::POLLIN)];
            if poll(&mut p, PollTimeout::from(50u16)).unwrap_or(0) > 0 {
                if let Ok(n) = nix::unistd::read(slave.as_fd(), &mut buf) {
                    got.extend_from_slice(&buf[..n]);
                }
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    /// Longer than the prompt's arming time.
    fn let_it_arm() {
        std::thread::sleep(PROMPT_ARMING + Duration::from_millis(200));
    }

    /// Set in the child of the hangup test: the coordinator's socket path.
    const HANGUP_CHILD: &str = "LAZARET_TEST_HANGUP_RELAY_SOCKET";
    const HANGUP_TEST: &str = "client::terminal::tests::a_hung_up_terminal_is_forwarded_and_the_session_ended_after_the_grace";

    /// The developer's terminal hangs up (its master closed) under a client
    /// that leads its session (`setsid -c`): the client sees it on the
    /// terminal and gets the kernel's SIGHUP (one hangup, forwarded once),
    /// drains the agent's output into nothing (the agent never blocks on a
    /// full PTY), asks for the session's end (SIGKILL) only once the grace
    /// is over, and exits 129.
    #[test]
    fn a_hung_up_terminal_is_forwarded_and_the_session_ended_after_the_grace() {
        if let Some(socket) = std::env::var_os(HANGUP_CHILD) {
            client(&socket);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("socket");
        let listener = UnixListener::bind(&path).expect("bind");
        let developer = open_pty().expect("pty");
        let agent = open_pty().expect("pty");
        let stdio = || Stdio::from(developer.slave.try_clone().expect("dup"));
        let exe = std::env::current_exe().expect("current_exe");
        // The client blocks its signals in its own thread (`lazaret run` is
        // single-threaded then); in the child, libtest's other threads must
        // not take the kernel's SIGHUP and die of it: blocked here, the
        // signal stays blocked through fork and exec, in every thread.
        let mut hup = nix::sys::signal::SigSet::empty();
        hup.add(Signal::SIGHUP);
        let mut mask = nix::sys::signal::SigSet::empty();
        nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, Some(&hup), Some(&mut mask)).expect("blocking SIGHUP");
        let child = Command::new("setsid")
            .arg("-c")
            .arg(exe)
            .args(["--exact", HANGUP_TEST, "--test-threads=1", "--nocapture", "-q"])
            .env(HANGUP_CHILD, &path)
            .stdin(stdio())
            .stdout(stdio())
            .stderr(stdio())
            .spawn()
            .expect("spawn the client (setsid, util-linux)");
        nix::sys::signal::pthread_sigmask(nix::sys::signal::SigmaskHow::SIG_SETMASK, Some(&mask), None).expect("restoring the signal mask");
        let mut child = Reaped(child);
        drop(developer.slave);
        let mut screen = Screen { master: developer.master, seen: String::new() };
        let coordinator = screen.accept_client(&listener, agent.master);
        let mut agent_out = std::fs::File::from(agent.slave.try_clone().expect("dup"));
        agent_out.write_all(b"agent says hi\r\n").expect("agent output");
        screen.wait_for("agent says hi", 0);

        let hung_up = Instant::now();
        drop(screen);
        assert_eq!(receive(&coordinator), ClientMessage::Signal { signal: libc::SIGHUP });
        // The agent ignores it and writes on, far more than a PTY holds:
        // the client drains it into nothing.
        nix::fcntl::fcntl(&agent_out, FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).expect("nonblocking");
        let chunk = [b'x'; 4096];
        let mut written = 0;
        while written < 1024 * 1024 && hung_up.elapsed() < HANGUP_GRACE / 2 {
            match agent_out.write(&chunk) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => panic!("the agent's write: {e}"),
            }
        }
        assert!(written >= 1024 * 1024, "the agent could write only {written} bytes after the hangup: its output was not drained");
        assert_eq!(receive(&coordinator), ClientMessage::Signal { signal: libc::SIGKILL });
        assert!(hung_up.elapsed() >= HANGUP_GRACE, "the session was ended before the agent's grace was over");
        send(&coordinator, &CoordinatorMessage::Exit { status: 137 });
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = child.0.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "the client did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(HANGUP_STATUS));
    }

    #[test]
    fn a_prompt_takes_the_terminal_and_gives_it_back() {
        if let Some(socket) = std::env::var_os(CHILD) {
            client(&socket);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("socket");
        let listener = UnixListener::bind(&path).expect("bind");
        let developer = open_pty().expect("pty");
        set_window_size(developer.master.as_fd(), WindowSize { rows: 30, cols: 120 }).expect("winsize");
        let agent = open_pty().expect("pty");
        let mut raw = termios::tcgetattr(agent.slave.as_fd()).expect("tcgetattr");
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(agent.slave.as_fd(), termios::SetArg::TCSANOW, &raw).expect("raw");
        let stdio = || Stdio::from(developer.slave.try_clone().expect("dup"));
        let exe = std::env::current_exe().expect("current_exe");
        let child = Command::new(exe)
            .args(["--exact", TEST, "--test-threads=1", "--nocapture", "-q"])
            .env(CHILD, &path)
            .stdin(stdio())
            .stdout(stdio())
            .stderr(stdio())
            .spawn()
            .expect("spawn the client");
        let mut child = Reaped(child);
        let cooked = termios::tcgetattr(developer.slave.as_fd()).expect("tcgetattr");
        let mut screen = Screen { master: developer.master, seen: String::new() };
        let coordinator = screen.accept_client(&listener, agent.master);
        let mut agent_out = std::fs::File::from(agent.slave.try_clone().expect("dup"));

        // Before any prompt: the agent's output shows, keys reach it.
        agent_out.write_all(b"agent says hi\r\n").expect("agent output");
        screen.wait_for("agent says hi", 0);
        screen.type_keys(b"ls");
        assert_eq!(agent_input(&agent.slave, Duration::from_millis(500)), "ls");

        // A prompt: shown inert; the agent's output is held back.
        send(&coordinator, &prompt("r1"));
        let shown = screen.wait_for("[n] deny", 0);
        let start = screen.seen[..shown].rfind("── lazaret: the agent asks").expect("the header");
        let block = screen.seen[start..].to_owned();
        assert!(block.contains("  command: git push") && block.contains("push it\\x1b[2J\\u{202e}"), "{block:?}");
        assert!(!block.contains("\x1b[2J") && !block.contains('\u{202e}'), "{block:?}");
        agent_out.write_all(b"HELD-OUTPUT").expect("agent output");
        screen.read_for(Duration::from_millis(400));
        assert!(!screen.seen.contains("HELD-OUTPUT"), "interleaved: {:?}", screen.seen);
        let_it_arm();
        // The keys go to the prompt, not to the agent.
        screen.type_keys(b"y");
        assert_eq!(receive(&coordinator), ClientMessage::PromptAnswer { request: "r1".into(), decision: PromptDecision::Approve });
        let approved = screen.wait_for("approved: runs once", shown);
        let held = screen.wait_for("HELD-OUTPUT", shown);
        assert!(approved < held, "the held output came before the prompt closed");
        screen.type_keys(b"zz");
        assert_eq!(agent_input(&agent.slave, Duration::from_millis(500)), "zz");

        // Two at once: the second waits for the first.
        send(&coordinator, &prompt("r2"));
        send(&coordinator, &prompt("r3"));
        let first = screen.wait_for("[n] deny", held);
        let_it_arm();
        screen.type_keys(b"n");
        assert_eq!(receive(&coordinator), ClientMessage::PromptAnswer { request: "r2".into(), decision: PromptDecision::Deny });
        let denied = screen.wait_for("lazaret: denied", first);
        screen.wait_for("[n] deny", denied);
        send(&coordinator, &CoordinatorMessage::PromptWithdrawn { request: "r3".into(), reason: "timed out after 60 s".into() });
        let withdrawn = screen.wait_for("prompt withdrawn: timed out after 60 s", denied);

        // The session ends with a prompt up: closed, not answered.
        send(&coordinator, &prompt("r4"));
        screen.wait_for("[n] deny", withdrawn);
        send(&coordinator, &CoordinatorMessage::Exit { status: 7 });
        screen.wait_for("prompt closed: the session ended", withdrawn);
        let deadline = Instant::now() + LIMIT;
        let status = loop {
            if let Some(status) = child.0.try_wait().expect("wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "the client did not exit");
            screen.read_for(Duration::from_millis(50));
        };
        assert_eq!(status.code(), Some(7));
        let mut rest = &coordinator;
        match wire::read_message::<ClientMessage>(&mut rest) {
            Err(_) => {}
            Ok(m) => panic!("the client sent {m:?} after the prompt was withdrawn"),
        }
        // The developer's terminal is as it was.
        let after = termios::tcgetattr(developer.slave.as_fd()).expect("tcgetattr");
        assert_eq!(format!("{cooked:?}"), format!("{after:?}"));
    }
}
