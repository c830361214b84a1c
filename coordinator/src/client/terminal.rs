//! A session's terminal side: copies between the developer's terminal (in
//! raw mode, restored on every exit path) and the agent's PTY master,
//! forwards signals as messages, and returns the agent's exit status.
//! Without a terminal the agent has the client's own stdio and this only
//! waits for the exit.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use lazaret_protocol::wire::{self, ClientMessage, CoordinatorMessage};
use lazaret_runtime::signals::Signals;
use lazaret_runtime::terminal::{sync_window_size, RawModeGuard};
use lazaret_runtime::ExitStatus;

use crate::layout::DomainDir;
use crate::LAZARET_FAILED;

use super::control::wait_unlocked;
use super::ClientError;

/// How long a client waits for a Domain to finish going down.
const DOWN_LIMIT: Duration = Duration::from_secs(60);

/// Serves the session until the coordinator reports the agent's exit.
pub(super) fn attach(stream: &UnixStream, master: Option<OwnedFd>, signals: &mut Signals, dir: &DomainDir) -> Result<ExitStatus, ClientError> {
    let stdin = std::io::stdin();
    let raw = match &master {
        Some(_) => Some(RawModeGuard::enter(stdin.as_fd()).map_err(ClientError::errno("setting the terminal to raw mode"))?),
        None => None,
    };
    if let Some(m) = &master {
        sync_window_size(stdin.as_fd(), m.as_fd());
        let _ = nix::fcntl::fcntl(m, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
    }
    let mut relay = Relay { stream, master_open: master.is_some(), input_open: master.is_some(), master, raw: raw.is_some(), ..Relay::new(stream) };
    let outcome = relay.run(signals, dir);
    drop(raw);
    outcome?;
    let (status, domain_down) = relay.exit.unwrap_or((LAZARET_FAILED, false));
    if domain_down {
        wait_unlocked(&dir.lock(), DOWN_LIMIT);
    }
    Ok(ExitStatus(status))
}

/// Most bytes buffered for the agent before the developer's input waits.
const INPUT_BACKLOG: usize = 64 * 1024;

/// The state of one session's relay.
struct Relay<'a> {
    stream: &'a UnixStream,
    master: Option<OwnedFd>,
    master_open: bool,
    input_open: bool,
    /// Whether the developer's terminal is in raw mode (notices need CRLF).
    raw: bool,
    to_master: Vec<u8>,
    /// The agent's status and whether the Domain went down, once known.
    exit: Option<(i32, bool)>,
    terminations: u32,
    buf: Vec<u8>,
}

/// What one poll round found ready.
struct Ready {
    signals: bool,
    socket: PollFlags,
    master: PollFlags,
    input: PollFlags,
    timed_out: bool,
}

impl<'a> Relay<'a> {
    fn new(stream: &'a UnixStream) -> Relay<'a> {
        Relay { stream, master: None, master_open: false, input_open: false, raw: false, to_master: Vec::new(), exit: None, terminations: 0, buf: vec![0u8; 16 * 1024] }
    }

    /// Relays until the agent's exit is known and its output drained.
    fn run(&mut self, signals: &mut Signals, dir: &DomainDir) -> Result<(), ClientError> {
        loop {
            let ready = match self.poll(signals)? {
                Some(r) => r,
                None => continue,
            };
            if self.exit.is_some() && (ready.timed_out || !self.master_open) {
                return Ok(());
            }
            if ready.signals {
                self.on_signals(signals);
            }
            if ready.socket.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                self.on_message(dir)?;
                if self.exit.is_some() && !self.master_open {
                    return Ok(());
                }
            }
            self.pump_master(ready.master);
            self.pump_input(ready.input);
            if self.exit.is_some() && !self.master_open {
                return Ok(());
            }
        }
    }

    /// Waits for the next events; `None` when interrupted.
    fn poll(&self, signals: &Signals) -> Result<Option<Ready>, ClientError> {
        let stdin = std::io::stdin();
        let mut fds = vec![PollFd::new(signals.fd(), PollFlags::POLLIN)];
        let socket = self.exit.is_none().then(|| {
            fds.push(PollFd::new(self.stream.as_fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
        let master = match (&self.master, self.master_open) {
            (Some(m), true) => {
                let mut f = PollFlags::POLLIN;
                if !self.to_master.is_empty() {
                    f |= PollFlags::POLLOUT;
                }
                fds.push(PollFd::new(m.as_fd(), f));
                Some(fds.len() - 1)
            }
            _ => None,
        };
        let input = (self.input_open && self.master_open && self.to_master.len() < INPUT_BACKLOG).then(|| {
            fds.push(PollFd::new(stdin.as_fd(), PollFlags::POLLIN));
            fds.len() - 1
        });
        let timeout = if self.exit.is_some() { PollTimeout::from(100u16) } else { PollTimeout::NONE };
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
            timed_out: n == 0,
        }))
    }

    /// Window changes go to the PTY; termination signals to the agent (in
    /// raw mode the terminal sends no INT/QUIT; a hangup or a signal from
    /// another process ends the agent too), SIGKILL from the second one on.
    fn on_signals(&mut self, signals: &mut Signals) {
        let stdin = std::io::stdin();
        let mut out = self.stream;
        while let Some(sig) = signals.next_pending() {
            match sig {
                Signal::SIGWINCH => {
                    if let Some(m) = &self.master {
                        sync_window_size(stdin.as_fd(), m.as_fd());
                    }
                }
                Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT => {
                    self.terminations += 1;
                    let signal = if self.terminations == 1 { sig as i32 } else { libc::SIGKILL };
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
            Ok(CoordinatorMessage::Exit { status, domain_down }) => self.exit = Some((status, domain_down)),
            Ok(CoordinatorMessage::Notice { text }) => {
                if self.raw {
                    eprint!("\r\nlazaret: {text}\r\n");
                } else {
                    eprintln!("lazaret: {text}");
                }
            }
            Ok(_) => {}
            Err(e) => return Err(ClientError::ConnectionLost { source: e, log: dir.log() }),
        }
        Ok(())
    }

    /// Agent output to the terminal; buffered input to the agent.
    fn pump_master(&mut self, events: PollFlags) {
        let Some(m) = &self.master else { return };
        if !self.master_open {
            return;
        }
        if events.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match nix::unistd::read(m.as_fd(), &mut self.buf) {
                Ok(0) | Err(Errno::EIO) => self.master_open = false,
                Ok(n) => write_all(std::io::stdout().as_fd(), &self.buf[..n]),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => self.master_open = false,
            }
        }
        if self.master_open && events.contains(PollFlags::POLLOUT) && !self.to_master.is_empty() {
            match nix::unistd::write(m.as_fd(), &self.to_master) {
                Ok(n) => {
                    self.to_master.drain(..n);
                }
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => self.to_master.clear(),
            }
        }
    }

    /// The developer's keystrokes, buffered for the agent.
    fn pump_input(&mut self, events: PollFlags) {
        if events.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match nix::unistd::read(std::io::stdin().as_fd(), &mut self.buf) {
                Ok(0) => self.input_open = false,
                Ok(n) => self.to_master.extend_from_slice(&self.buf[..n]),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => self.input_open = false,
            }
        }
    }
}

fn write_all(fd: BorrowedFd<'_>, mut data: &[u8]) {
    while !data.is_empty() {
        match nix::unistd::write(fd, data) {
            Ok(0) => return,
            Ok(n) => data = &data[n..],
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                let mut p = [PollFd::new(fd, PollFlags::POLLOUT)];
                let _ = poll(&mut p, PollTimeout::from(1000u16));
            }
            Err(_) => return,
        }
    }
}

