//! The client side: `lazaret run` as a session of its Domain's coordinator
//! (starting the coordinator first when the Domain is not running), and
//! `lazaret stop`, `ls`, `debug`.
//!
//! A session on a terminal gets the PTY master of its agent from the
//! coordinator (SCM_RIGHTS) and copies between it and the developer's
//! terminal itself, in raw mode; window-size changes go straight to that
//! master. A session without a terminal hands its own stdin, stdout and
//! stderr to the coordinator, which gives them to the agent directly. Either
//! way, only signals and the exit status travel as messages.

use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use lazaret_protocol::wire::{self, ClientMessage, CoordinatorMessage, DomainStatus, FrameError, WIRE_VERSION};
use lazaret_runtime::signals::Signals;
use lazaret_runtime::terminal::sync_window_size;
use lazaret_runtime::terminal::{window_size, RawModeGuard};
use lazaret_runtime::ExitStatus;

use crate::context::{load_config, require_root, Context, ContextError};
use crate::daemon::{EXIT_BUSY, LOG_NAME, SOCKET_NAME};
use crate::identity::Developer;
use crate::launch::{random_hex, sys, LaunchError, RunRequest};

/// How long `lazaret run` waits for a coordinator to publish its socket.
const START_LIMIT: Duration = Duration::from_secs(120);
/// How long a client waits for a Domain to finish going down.
const DOWN_LIMIT: Duration = Duration::from_secs(60);


/// `lazaret run`: join the Domain (starting its coordinator if needed),
/// serve the session, and return the agent's exit status.
pub fn run(req: &RunRequest) -> Result<ExitStatus, LaunchError> {
    require_root()?;
    let mut signals = Signals::block().map_err(|e| LaunchError::Sys { context: "blocking signals".into(), source: e.into() })?;
    let ctx = Context::resolve(req.config.as_deref(), req.profile.as_deref(), &req.dir)?;
    let domain_dir = ctx.domain_runtime_dir()?;
    let fingerprint = ctx.config.fingerprint(&ctx.profile.name).map_err(ContextError::from)?.to_string();
    let config_json = ctx.config.render_json().map_err(ContextError::from)?;
    let session = format!("s-{}", random_hex(8));
    let stdin = std::io::stdin();
    let tty = stdin.is_terminal() && std::io::stdout().is_terminal();
    let (rows, cols) = if tty { window_size(stdin.as_fd()).map(|w| (w.rows, w.cols)).unwrap_or((0, 0)) } else { (0, 0) };
    let hello = ClientMessage::Hello {
        version: WIRE_VERSION,
        session: session.clone(),
        profile: ctx.profile.name.clone(),
        fingerprint,
        config_json,
        tty,
        term: std::env::var("TERM").ok(),
        args: req.args.clone(),
        rows,
        cols,
        cwd: Some(ctx.agent_cwd().display().to_string()),
    };
    let socket = domain_dir.join(SOCKET_NAME);
    let deadline = Instant::now() + START_LIMIT;
    let mut launched: Option<Launched> = None;
    loop {
        if let Some(sig) = signals.pending_termination() {
            return Err(LaunchError::Interrupted(sig.to_string()));
        }
        if let Ok(stream) = UnixStream::connect(&socket) {
            if req.reset_anchor && launched.is_none() {
                return Err(LaunchError::Coordinator(format!(
                    "--reset-anchor needs the Domain stopped, and profile {:?} is running on this workspace\n  hint: stop it with `lazaret stop {}` first",
                    ctx.profile.name, ctx.profile.name
                )));
            }
            match handshake(&stream, &hello, tty)? {
                Handshake::Joined(master) => {
                    if let Some(l) = launched.as_mut() {
                        l.relay(false);
                    }
                    return attach(&stream, master, &mut signals, &domain_dir);
                }
                Handshake::Finished(status) => return Ok(ExitStatus(status)),
                Handshake::Retry => std::thread::sleep(Duration::from_millis(20)),
                Handshake::Refused(reason) => return Err(LaunchError::Coordinator(reason)),
            }
        }
        match launched.as_mut() {
            None => launched = Some(spawn_coordinator(req, &ctx, &domain_dir, &session)?),
            Some(l) => {
                l.relay(false);
                if let Some(code) = l.child.try_wait().map_err(sys("waiting for the coordinator"))? {
                    l.relay(true);
                    match code.code() {
                        Some(c) if c == EXIT_BUSY || c == 0 => {
                            // Another coordinator owns the Domain (perhaps
                            // still going down): connect to it, or start
                            // again once it is gone.
                            launched = None;
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        _ => {
                            let reason = l.errors.join("\n");
                            let reason = if reason.is_empty() {
                                format!("the Domain's coordinator failed to start ({code}); see {}", domain_dir.join(LOG_NAME).display())
                            } else {
                                reason
                            };
                            return Err(LaunchError::Coordinator(reason));
                        }
                    }
                }
            }
        }
        if Instant::now() > deadline {
            return Err(LaunchError::Coordinator(format!(
                "no coordinator published {} within {} s; see {}",
                socket.display(),
                START_LIMIT.as_secs(),
                domain_dir.join(LOG_NAME).display()
            )));
        }
        std::thread::sleep(Duration::from_millis(3));
    }
}

/// A coordinator this client started, and its status pipe.
struct Launched {
    child: Child,
    pipe: File,
    pending: Vec<u8>,
    errors: Vec<String>,
}

impl Launched {
    /// Copies start-up messages to stderr; keeps errors for the final
    /// message. With `all`, also an unterminated last line.
    fn relay(&mut self, all: bool) {
        let mut buf = [0u8; 4096];
        loop {
            match self.pipe.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
            }
        }
        while let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=i).collect();
            self.line(String::from_utf8_lossy(&line).trim_end().to_string());
        }
        if all && !self.pending.is_empty() {
            let line = String::from_utf8_lossy(&self.pending).trim_end().to_string();
            self.pending.clear();
            self.line(line);
        }
    }

    fn line(&mut self, line: String) {
        match line.strip_prefix("lazaret: error: ") {
            Some(e) => self.errors.push(e.to_string()),
            None => eprintln!("{line}"),
        }
    }
}

fn spawn_coordinator(req: &RunRequest, ctx: &Context, domain_dir: &Path, session: &str) -> Result<Launched, LaunchError> {
    let exe = std::env::current_exe().map_err(sys("finding the lazaret binary"))?;
    let log_path = domain_dir.join(LOG_NAME);
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&log_path)
        .map_err(sys(format!("opening {}", log_path.display())))?;
    let mut cmd = Command::new(exe);
    if let Some(c) = &req.config {
        cmd.arg("--config").arg(c);
    }
    cmd.arg("__coordinator")
        .arg("--domain-dir")
        .arg(domain_dir)
        .arg("--session")
        .arg(session)
        .arg("--profile")
        .arg(&ctx.profile.name)
        .arg("-C")
        .arg(&req.dir);
    if req.reset_anchor {
        cmd.arg("--reset-anchor");
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::from(log));
    let mut child = cmd.spawn().map_err(sys("starting the Domain's coordinator"))?;
    let pipe = child.stdout.take().map(|p| File::from(OwnedFd::from(p))).ok_or_else(|| LaunchError::Coordinator("no status pipe".into()))?;
    nix::fcntl::fcntl(&pipe, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK)).map_err(|e| LaunchError::Sys { context: "status pipe".into(), source: e.into() })?;
    Ok(Launched { child, pipe, pending: Vec::new(), errors: Vec::new() })
}

enum Handshake {
    Joined(Option<OwnedFd>),
    Finished(i32),
    Retry,
    Refused(String),
}

fn handshake(stream: &UnixStream, hello: &ClientMessage, tty: bool) -> Result<Handshake, LaunchError> {
    let frame = wire::encode(hello)?;
    let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    let fds: Vec<BorrowedFd<'_>> = if tty { Vec::new() } else { vec![i.as_fd(), o.as_fd(), e.as_fd()] };
    if lazaret_runtime::fdpass::send_with_fds(stream, &frame, &fds).is_err() {
        // The coordinator is going away; a new one will publish.
        return Ok(Handshake::Retry);
    }
    loop {
        let (msg, mut fds) = match read_frame_with_fds::<CoordinatorMessage>(stream) {
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
            other => return Err(LaunchError::Coordinator(format!("unexpected answer from the coordinator: {other:?}"))),
        }
    }
}

/// Reads one frame with any descriptors sent along with it.
pub(crate) fn read_frame_with_fds<T: for<'de> serde::Deserialize<'de>>(stream: &UnixStream) -> Result<(T, Vec<OwnedFd>), FrameError> {
    let mut prefix = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < 4 {
        let (n, more) = lazaret_runtime::fdpass::recv_with_fds(stream, &mut prefix[got..])?;
        if n == 0 {
            return Err(if got == 0 { FrameError::Closed } else { FrameError::Io(std::io::ErrorKind::UnexpectedEof.into()) });
        }
        if fds.len() + more.len() > lazaret_runtime::fdpass::MAX_FDS {
            return Err(FrameError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, "too many file descriptors")));
        }
        fds.extend(more);
        got += n;
    }
    let len = wire::body_len(prefix)?;
    let mut body = vec![0u8; len];
    std::io::Read::read_exact(&mut &*stream, &mut body)?;
    Ok((wire::decode(&body)?, fds))
}

/// Serves the session until the coordinator reports the agent's exit.
fn attach(stream: &UnixStream, master: Option<OwnedFd>, signals: &mut Signals, domain_dir: &Path) -> Result<ExitStatus, LaunchError> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    let raw = match &master {
        Some(_) => Some(RawModeGuard::enter(stdin.as_fd()).map_err(|e| LaunchError::Sys { context: "setting the terminal to raw mode".into(), source: e.into() })?),
        None => None,
    };
    if let Some(m) = &master {
        sync_window_size(stdin.as_fd(), m.as_fd());
        let _ = nix::fcntl::fcntl(m, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
    }
    let mut master_open = master.is_some();
    let mut input_open = master.is_some();
    let mut to_master: Vec<u8> = Vec::new();
    let mut exit: Option<(i32, bool)> = None;
    let mut terminations = 0u32;
    let mut buf = vec![0u8; 16 * 1024];
    let mut out = stream;
    loop {
        let mut fds = vec![PollFd::new(signals.fd(), PollFlags::POLLIN)];
        let sock_idx = fds.len();
        if exit.is_none() {
            fds.push(PollFd::new(stream.as_fd(), PollFlags::POLLIN));
        }
        let master_idx = fds.len();
        if let (Some(m), true) = (&master, master_open) {
            let mut f = PollFlags::POLLIN;
            if !to_master.is_empty() {
                f |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(m.as_fd(), f));
        }
        let input_idx = fds.len();
        if input_open && master_open && to_master.len() < 64 * 1024 {
            fds.push(PollFd::new(stdin.as_fd(), PollFlags::POLLIN));
        }
        let timeout = if exit.is_some() { PollTimeout::from(100u16) } else { PollTimeout::NONE };
        let ready = match poll(&mut fds, timeout) {
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(LaunchError::Sys { context: "waiting for terminal events".into(), source: e.into() }),
            Ok(n) => n,
        };
        if exit.is_some() && (ready == 0 || !master_open) {
            break;
        }
        let revents = |i: usize| fds.get(i).and_then(|f| f.revents()).unwrap_or(PollFlags::empty());
        let sig_ready = revents(0).contains(PollFlags::POLLIN);
        let sock_ev = if exit.is_none() { revents(sock_idx) } else { PollFlags::empty() };
        let master_ev = if master_open && master.is_some() { revents(master_idx) } else { PollFlags::empty() };
        let input_ev = if fds.len() > input_idx { revents(input_idx) } else { PollFlags::empty() };
        drop(fds);
        if sig_ready {
            while let Some(sig) = signals.next_pending() {
                match sig {
                    Signal::SIGWINCH => {
                        if let Some(m) = &master {
                            sync_window_size(stdin.as_fd(), m.as_fd());
                        }
                    }
                    // In raw mode the terminal sends no INT/QUIT; a hangup
                    // or a signal from another process ends the agent too.
                    Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP | Signal::SIGQUIT => {
                        terminations += 1;
                        let signal = if terminations == 1 { sig as i32 } else { libc::SIGKILL };
                        let _ = wire::write_message(&mut out, &ClientMessage::Signal { signal });
                    }
                    _ => {}
                }
            }
        }
        if sock_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match wire::read_message::<CoordinatorMessage>(&mut out) {
                Ok(CoordinatorMessage::Exit { status, domain_down }) => {
                    exit = Some((status, domain_down));
                    if !master_open {
                        break;
                    }
                }
                Ok(CoordinatorMessage::Notice { text }) => {
                    if raw.is_some() {
                        eprint!("\r\nlazaret: {text}\r\n");
                    } else {
                        eprintln!("lazaret: {text}");
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    drop(raw);
                    return Err(LaunchError::Coordinator(format!("lost the connection to the Domain's coordinator ({e}); see {}", domain_dir.join(LOG_NAME).display())));
                }
            }
        }
        if let Some(m) = &master {
            if master_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
                match nix::unistd::read(m.as_fd(), &mut buf) {
                    Ok(0) | Err(Errno::EIO) => master_open = false,
                    Ok(n) => write_all(stdout.as_fd(), &buf[..n]),
                    Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                    Err(_) => master_open = false,
                }
            }
            if master_open && master_ev.contains(PollFlags::POLLOUT) && !to_master.is_empty() {
                match nix::unistd::write(m.as_fd(), &to_master) {
                    Ok(n) => {
                        to_master.drain(..n);
                    }
                    Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                    Err(_) => to_master.clear(),
                }
            }
        }
        if input_ev.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR) {
            match nix::unistd::read(stdin.as_fd(), &mut buf) {
                Ok(0) => input_open = false,
                Ok(n) => to_master.extend_from_slice(&buf[..n]),
                Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                Err(_) => input_open = false,
            }
        }
        if exit.is_some() && !master_open {
            break;
        }
    }
    drop(raw);
    let (status, domain_down) = exit.unwrap_or((crate::launch::LAZARET_FAILED, false));
    if domain_down {
        wait_unlocked(&domain_dir.join("lock"), DOWN_LIMIT);
    }
    Ok(ExitStatus(status))
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

/// Waits until nobody holds the Domain lock (its coordinator's processes
/// have all exited), up to `limit`. Returns whether it is free.
pub fn wait_unlocked(lock: &Path, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        let free = match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(lock) {
            Err(_) => true,
            // A shared, non-blocking probe, released when dropped.
            Ok(f) => nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockSharedNonblock).is_ok(),
        };
        if free {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A one-shot request to a Domain's coordinator.
fn request(socket: &Path, msg: &ClientMessage) -> Result<CoordinatorMessage, LaunchError> {
    let stream = UnixStream::connect(socket).map_err(sys(format!("connecting to {}", socket.display())))?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(sys("socket timeout"))?;
    let mut s = &stream;
    wire::write_message(&mut s, msg)?;
    Ok(wire::read_message(&mut s)?)
}

/// The runtime directory of the developer, from the configuration.
fn runtime_dir(config: Option<&Path>) -> Result<PathBuf, LaunchError> {
    let developer = Developer::from_process().map_err(ContextError::from)?;
    let cfg = load_config(config, &developer).map_err(ContextError::from)?;
    Ok(cfg.runtime_dir(&developer))
}

/// Domain runtime directories that have a published socket.
fn running_domain_dirs(runtime: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(runtime)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.join(SOCKET_NAME).exists()).collect())
        .unwrap_or_default();
    dirs.sort();
    dirs
}

/// `lazaret ls`: every running Domain of this developer.
pub fn list(config: Option<&Path>) -> Result<Vec<DomainStatus>, LaunchError> {
    require_root()?;
    let mut out = Vec::new();
    for dir in running_domain_dirs(&runtime_dir(config)?) {
        if let Ok(CoordinatorMessage::Status(s)) = request(&dir.join(SOCKET_NAME), &ClientMessage::Status { version: WIRE_VERSION }) {
            out.push(s);
        }
    }
    Ok(out)
}

/// `lazaret stop PROFILE`: ends the Domain of `profile` on the workspace at
/// `dir` gracefully and waits until it is down. Returns its Domain ID.
pub fn stop(config: Option<&Path>, profile: Option<&str>, dir: &Path, grace: Duration) -> Result<String, LaunchError> {
    require_root()?;
    let ctx = Context::resolve(config, profile, dir)?;
    let domain_dir = ctx.domain_runtime_dir()?;
    let socket = domain_dir.join(SOCKET_NAME);
    if !socket.exists() {
        return Err(LaunchError::Coordinator(format!("profile {:?} is not running on {}", ctx.profile.name, ctx.workspace.root().display())));
    }
    stop_dir(&domain_dir, grace)?;
    Ok(ctx.domain_id.to_string())
}

fn stop_dir(domain_dir: &Path, grace: Duration) -> Result<(), LaunchError> {
    let grace_ms = u64::try_from(grace.as_millis()).unwrap_or(u64::MAX);
    match request(&domain_dir.join(SOCKET_NAME), &ClientMessage::Stop { version: WIRE_VERSION, grace_ms })? {
        CoordinatorMessage::Stopping => {}
        CoordinatorMessage::Refused { reason, .. } => return Err(LaunchError::Coordinator(reason)),
        other => return Err(LaunchError::Coordinator(format!("unexpected answer to stop: {other:?}"))),
    }
    if wait_unlocked(&domain_dir.join("lock"), grace * 2 + DOWN_LIMIT) {
        Ok(())
    } else {
        Err(LaunchError::Coordinator(format!("the Domain in {} did not go down in time; see {}", domain_dir.display(), domain_dir.join(LOG_NAME).display())))
    }
}

/// `lazaret stop --all`: stops every running Domain of this developer;
/// returns the Domain directories stopped.
pub fn stop_all(config: Option<&Path>, grace: Duration) -> Result<Vec<PathBuf>, LaunchError> {
    require_root()?;
    let mut stopped = Vec::new();
    let mut failures = Vec::new();
    for dir in running_domain_dirs(&runtime_dir(config)?) {
        match stop_dir(&dir, grace) {
            Ok(()) => stopped.push(dir),
            Err(e) => failures.push(format!("{}: {e}", dir.display())),
        }
    }
    if failures.is_empty() { Ok(stopped) } else { Err(LaunchError::Coordinator(failures.join("\n"))) }
}

/// `lazaret debug PROFILE`: the coordinator's view of namespaces, routes
/// and mounts.
pub fn debug(config: Option<&Path>, profile: Option<&str>, dir: &Path) -> Result<String, LaunchError> {
    require_root()?;
    let ctx = Context::resolve(config, profile, dir)?;
    let socket = ctx.domain_runtime_dir()?.join(SOCKET_NAME);
    match request(&socket, &ClientMessage::Debug { version: WIRE_VERSION })? {
        CoordinatorMessage::Debug { text } => Ok(text),
        CoordinatorMessage::Refused { reason, .. } => Err(LaunchError::Coordinator(reason)),
        other => Err(LaunchError::Coordinator(format!("unexpected answer to debug: {other:?}"))),
    }
}

/// The journal file of `profile`'s Domain on the workspace at `dir`, and the
/// Domain Root holding it.
pub fn journal_location(config: Option<&Path>, profile: Option<&str>, dir: &Path) -> Result<PathBuf, LaunchError> {
    let ctx = Context::resolve(config, profile, dir)?;
    Ok(ctx.paths.domain_root(&ctx.domain_id))
}
