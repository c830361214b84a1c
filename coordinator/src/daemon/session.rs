//! One connection to the Domain's socket: a session (`Hello`: register it,
//! exec its agent, relay signals, report its exit) or a one-shot request
//! (status, debug, stop).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lazaret_protocol::journal::Event;
use lazaret_protocol::session::AgentUser;
use lazaret_protocol::wire::{self, ClientMessage, CoordinatorMessage, FrameError, RateLimit, WIRE_VERSION};
use lazaret_runtime::terminal::{WindowSize, open_pty, set_window_size};

use crate::LAZARET_FAILED;
use crate::transport;

use super::domain::{Domain, Phase, SessionEntry, StopRequest};
use super::escalation::SessionLink;
use super::{StartError, log, report};

/// How long a client may take to send its first frame.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest grace period `lazaret stop` may ask for.
const MAX_GRACE: Duration = Duration::from_secs(300);

/// What a session asked for in its Hello.
struct SessionRequest {
    session: String,
    tty: bool,
    /// Which of stdin, stdout and stderr are the PTY (the rest came as pipes).
    terminal: [bool; 3],
    term: Option<String>,
    /// The developer's terminal type, locale and time zone, checked.
    agent_env: Vec<(String, String)>,
    args: Vec<String>,
    cwd: Option<String>,
    size: WindowSize,
    link: Arc<SessionLink>,
}

/// Serves one accepted connection.
pub(super) fn serve_connection(d: &Arc<Domain>, stream: UnixStream) {
    if let Err(why) = peer_allowed(d, &stream) {
        log(&format!("refused a connection: {why}"));
        return;
    }
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let (first, fds) = match transport::read_frame_with_fds::<ClientMessage>(&stream) {
        Ok(v) => v,
        Err(FrameError::Closed) => return,
        Err(e) => {
            log(&format!("disconnected a client: {e}"));
            return;
        }
    };
    let mut out = &stream;
    match first {
        ClientMessage::Hello { .. } => run_session(d, &stream, first, fds),
        ClientMessage::Status { version }
        | ClientMessage::Debug { version }
        | ClientMessage::RefusedDestinations { version }
        | ClientMessage::Stop { version, .. }
            if version != WIRE_VERSION =>
        {
            let _ = wire::write_message(&mut out, &report::version_refusal(version));
        }
        ClientMessage::Status { .. } => {
            let _ = wire::write_message(&mut out, &CoordinatorMessage::Status(report::status_of(d)));
        }
        ClientMessage::Debug { .. } => {
            let _ = wire::write_message(&mut out, &CoordinatorMessage::Debug { text: report::debug_report(d) });
        }
        ClientMessage::RefusedDestinations { .. } => {
            let answer = match report::refused_destinations(d) {
                Ok(destinations) => CoordinatorMessage::RefusedDestinations { destinations },
                Err(reason) => CoordinatorMessage::Refused { reason, retry: false },
            };
            let _ = wire::write_message(&mut out, &answer);
        }
        ClientMessage::Stop { grace_ms, .. } => {
            let grace = Duration::from_millis(grace_ms).min(MAX_GRACE);
            {
                let mut live = d.live();
                log(&format!("stop requested (grace {grace:?})"));
                live.stop.get_or_insert(StopRequest::new(grace));
                d.changed.notify_all();
            }
            let _ = wire::write_message(&mut out, &CoordinatorMessage::Stopping);
        }
        ClientMessage::Signal { .. } | ClientMessage::PromptAnswer { .. } => log("disconnected a client: a session message before Hello"),
    }
}

/// Only the developer (or root) may talk to the Domain.
fn peer_allowed(d: &Domain, stream: &UnixStream) -> Result<(), String> {
    let cred = nix::sys::socket::getsockopt(&stream.as_fd(), nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("SO_PEERCRED: {e}"))?;
    let uid = cred.uid();
    if uid == 0 || uid == d.ctx.developer.uid {
        Ok(())
    } else {
        Err(format!("uid {uid} (pid {}) is neither root nor the developer (uid {})", cred.pid(), d.ctx.developer.uid))
    }
}

/// A refusal to send to the client: the reason, and whether it may retry.
struct Refusal {
    reason: String,
    retry: bool,
}

impl Refusal {
    fn final_(reason: impl Into<String>) -> Refusal {
        Refusal { reason: reason.into(), retry: false }
    }
}

/// Checks a Hello and registers its session (journalled). Returns the
/// session's request, or why it was refused.
fn register(d: &Domain, hello: ClientMessage, fds: usize) -> Result<SessionRequest, Refusal> {
    let ClientMessage::Hello {
        version,
        session,
        profile,
        fingerprint,
        config_json,
        terminal,
        term,
        args,
        rows,
        cols,
        cwd,
        host_env,
        agent_env,
    } = hello
    else {
        return Err(Refusal::final_("expected a Hello"));
    };
    if version != WIRE_VERSION {
        return Err(Refusal::final_(report::version_mismatch(version)));
    }
    if profile != d.ctx.profile.name
        || session.is_empty()
        || session.len() > 64
        || !session.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        log(&format!("disconnected a client: bad Hello (profile {profile:?}, session {session:?})"));
        return Err(Refusal::final_("malformed session request"));
    }
    let pipes = terminal.iter().filter(|t| !**t).count();
    if fds != pipes {
        log(&format!("session {session}: refused: terminal streams {terminal:?} with {fds} descriptors"));
        return Err(Refusal::final_(format!("a session must pass one pipe for each stream that is not a terminal ({pipes}), got {fds}")));
    }
    let mut live = d.live();
    if live.phase != Phase::Ready {
        return Err(Refusal { reason: "the Domain is shutting down".into(), retry: true });
    }
    if live.stop.is_some() {
        return Err(Refusal::final_("the Domain is being stopped (lazaret stop); run again once it is down"));
    }
    if let Err(e) = live.journal.record(Event::ConnectSession { session: session.clone() }) {
        log(&format!("session {session}: refused: {e}"));
        return Err(Refusal::final_(format!("session {session} refused: {e}")));
    }
    if session == live.launcher {
        live.launcher_connected = true;
    }
    if fingerprint != d.fingerprint {
        let _ = live.journal.record(Event::RejectSession { session: session.clone(), fingerprint: fingerprint.clone() });
        log(&format!("session {session}: rejected: fingerprint {fingerprint} differs from {}", d.fingerprint));
        drop(live);
        return Err(Refusal::final_(report::refusal_for_fingerprint(d, &fingerprint, &config_json)));
    }
    if let Err(e) = live.journal.record(Event::RegisterSession { session: session.clone(), fingerprint }) {
        log(&format!("session {session}: {e}"));
        let _ = live.journal.record(Event::DisconnectSession { session: session.clone() });
        return Err(Refusal::final_(format!("session {session} refused: {e}")));
    }
    live.ever_joined = true;
    let allowed = d.ctx.profile.escalation.host_env_names();
    let (host_env, dropped) = crate::escalation::environment::accept_session_env(host_env, &allowed);
    if !dropped.is_empty() {
        log(&format!("session {session}: ignored host variables it may not pass: {}", dropped.join(", ")));
    }
    // Only a session whose keyboard is a terminal can be asked.
    let link = Arc::new(SessionLink::new(&session, terminal[0], host_env));
    live.sessions.insert(session.clone(), SessionEntry { pid_file: d.run.session_pid(&session), link: link.clone() });
    log(&format!("session {session} joined ({} connected)", live.sessions.len()));
    let tty = terminal.iter().any(|t| *t);
    let agent_env = wire::agent_terminal_env(&agent_env, tty);
    Ok(SessionRequest { session, tty, terminal, term, agent_env, args, cwd, size: WindowSize { rows, cols }, link })
}

/// One session: register it, exec its agent, relay signals, report its exit.
fn run_session(d: &Arc<Domain>, stream: &UnixStream, hello: ClientMessage, fds: Vec<OwnedFd>) {
    let mut out = stream;
    let req = match register(d, hello, fds.len()) {
        Ok(r) => r,
        Err(Refusal { reason, retry }) => {
            let _ = wire::write_message(&mut out, &CoordinatorMessage::Refused { reason, retry });
            return;
        }
    };
    let session = req.session.clone();
    let pid_file = d.run.session_pid(&session);
    let (mut child, master) = match start_agent(d, &req, fds, &pid_file) {
        Ok(v) => v,
        Err(e) => {
            log(&format!("session {session}: starting the agent failed: {e}"));
            req.link.attach(stream.try_clone().ok());
            req.link.send(&CoordinatorMessage::Notice { text: format!("error: {e}") });
            finish_session(d, &req.link, &session, LAZARET_FAILED);
            return;
        }
    };
    let welcome = CoordinatorMessage::Welcome { session: session.clone(), sandbox: d.container.clone(), tty: req.tty };
    let fds: Vec<_> = master.iter().map(|m| m.as_fd()).collect();
    if let Err(e) = transport::write_frame_with_fds(stream, &welcome, &fds) {
        log(&format!("session {session}: the client went away before its Welcome: {e}"));
    }
    drop(fds);
    drop(master);
    // From here on every frame to the client goes through the link (prompts
    // may come as soon as the agent runs; they wait for this).
    req.link.attach(stream.try_clone().ok());
    // Client messages: signals for the agent; end of stream: the client is
    // gone, so its agent goes too.
    let exited = Arc::new(AtomicBool::new(false));
    let reader_thread = stream.try_clone().ok().map(|r| {
        let (d, session, pid_file, exited) = (d.clone(), session.clone(), pid_file.clone(), exited.clone());
        let link = req.link.clone();
        std::thread::spawn(move || relay_client(&d, r, &session, &pid_file, &exited, &link))
    });
    let status = match child.wait() {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            // runsc exec reports its process's death by a signal as an exit
            // code; killed itself, it leaves the session running inside.
            if s.signal().is_some() {
                log(&format!("session {session}: runsc exec was killed ({s}); ending the session inside"));
                d.kill_session_tree(&session, &pid_file);
            }
            s.code().or_else(|| s.signal().map(|n| 128 + n)).unwrap_or(LAZARET_FAILED)
        }
        Err(e) => {
            log(&format!("session {session}: waiting for runsc exec: {e}"));
            LAZARET_FAILED
        }
    };
    // runsc's failure to start the command (its one line is already on
    // the agent's stderr): 127 not found, 126 not executable, else 125.
    let status = match lazaret_runtime::execfail::classify_exec(status, &pid_file) {
        Some(failure) => {
            log(&format!("session {session}: runsc exec did not start the agent ({}): {}", failure.exit_code(), failure.message()));
            failure.exit_code()
        }
        None => status,
    };
    let _ = std::fs::remove_file(lazaret_runtime::execfail::exec_log_path(&pid_file));
    super::health::session_ended(d, &session);
    exited.store(true, Ordering::SeqCst);
    finish_session(d, &req.link, &session, status);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    if let Some(t) = reader_thread {
        let _ = t.join();
    }
    let _ = std::fs::remove_file(&pid_file);
}

/// Ends the session's escalation request (killing its host command), then
/// journals the session's end and tells the client its agent's status at
/// once; if it was the last session, begins teardown, which finishes behind
/// the Exit (a client that wants the Domain gone waits for its lock, as
/// `lazaret stop` does).
///
/// The Exit goes before the journal: it is no resource, and the client
/// should not wait for the journal's fsync (the model allows results to
/// connected sessions only, and the session is still connected until
/// `DisconnectSession`).
fn finish_session(d: &Domain, link: &SessionLink, session: &str, status: i32) {
    link.disconnect();
    link.send(&CoordinatorMessage::Exit { status });
    let mut live = d.live();
    if let Err(e) = live.journal.record(Event::DisconnectSession { session: session.to_string() }) {
        log(&format!("session {session}: {e}"));
    }
    live.sessions.remove(session);
    log(&format!("session {session} left with status {status} ({} connected)", live.sessions.len()));
    // The last one's sweep is the Domain's final one.
    if !live.sessions.is_empty() {
        d.guard.sweep("session end");
    }
    d.last_session_left(&mut live);
}

/// Reads the client's messages until the agent exits; a client that goes
/// away or misbehaves takes its agent's process tree with it.
fn relay_client(d: &Domain, stream: UnixStream, session: &str, pid_file: &Path, exited: &AtomicBool, link: &SessionLink) {
    let _ = stream.set_read_timeout(None);
    let mut limit = RateLimit::client_default();
    let mut r = &stream;
    loop {
        let msg = wire::read_message::<ClientMessage>(&mut r).and_then(|m| limit.admit().map(|_| m));
        if exited.load(Ordering::SeqCst) {
            return;
        }
        match msg {
            // SIGKILL would kill the subreaper alone: it ends the session.
            Ok(ClientMessage::Signal { signal: libc::SIGKILL }) => d.kill_session_tree(session, pid_file),
            Ok(ClientMessage::Signal { signal }) if (1..=64).contains(&signal) => d.signal_session(session, pid_file, signal),
            Ok(ClientMessage::PromptAnswer { request, decision }) => link.answer(&request, decision),
            Ok(other) => {
                log(&format!("session {session}: unexpected {other:?}; disconnecting and ending its agent"));
                break;
            }
            Err(FrameError::Closed) => {
                log(&format!("session {session}: the client went away; ending its agent"));
                break;
            }
            Err(e) => {
                log(&format!("session {session}: disconnecting a misbehaving client: {e}"));
                break;
            }
        }
    }
    if !exited.load(Ordering::SeqCst) {
        d.kill_session_tree(session, pid_file);
    }
}

/// The agent's working directory: the client's, when it is inside the
/// workspace and plain (no `.`/`..`), else the profile's default.
fn agent_cwd(d: &Domain, cwd: Option<&str>) -> Option<PathBuf> {
    let c = PathBuf::from(cwd?);
    let plain = c.components().all(|p| !matches!(p, std::path::Component::ParentDir | std::path::Component::CurDir));
    (plain && c.starts_with(d.ctx.workspace.root())).then_some(c)
}

/// Writes the session's process spec and starts `runsc exec` on the
/// client's pipes and, if any stream is a terminal, a PTY whose master is
/// returned (for the client). Every descriptor here is close-on-exec; only
/// this session's `runsc exec` gets them, as its stdio or `--pass-fd`.
fn start_agent(
    d: &Domain,
    req: &SessionRequest,
    fds: Vec<OwnedFd>,
    pid_file: &Path,
) -> Result<(std::process::Child, Option<OwnedFd>), StartError> {
    let mut spec = d.ctx.bundle_spec(&d.image, &req.args, req.tty)?;
    // The developer's terminal type, locale and time zone (a client of an
    // older build sends only TERM), unless the profile sets them itself.
    let mut carried = req.agent_env.clone();
    if let Some(t) = req.term.as_ref().filter(|t| req.tty && !t.is_empty() && t.len() < 64 && t.chars().all(|c| c.is_ascii_graphic())) {
        if !carried.iter().any(|(k, _)| k == "TERM") {
            carried.push(("TERM".into(), t.clone()));
        }
    }
    for (name, value) in carried {
        if !d.ctx.profile.env.contains_key(&name) {
            spec.env.retain(|(k, _)| *k != name);
            spec.env.push((name, value));
        }
    }
    if let Some(c) = agent_cwd(d, req.cwd.as_deref()) {
        spec.cwd = c;
    }
    let credentials = match &d.escalations {
        Some(esc) => Some(escalation_credentials(&mut spec.env, esc.address, &d.trust, &req.session)?),
        None => None,
    };
    // The process part is validated like a whole bundle, with this run's
    // rootfs and cgroups.
    spec.rootfs = d.run.rootfs();
    spec.cgroups_path = d.cgroups_path.clone();
    if req.tty && req.terminal.iter().any(|t| !t) {
        spec.args = stdio_wrapper(&req.terminal, std::mem::take(&mut spec.args));
    }
    // The session's init takes the agent's identity and directory itself:
    // it runs as root, out of the agent's reach, to hold the session's
    // escalation credentials (lazaret_protocol::client::relay).
    let agent_user = (spec.uid != 0).then(|| AgentUser { uid: spec.uid, gid: spec.gid, groups: spec.additional_gids.clone() });
    let cwd = std::mem::replace(&mut spec.cwd, PathBuf::from("/"));
    spec.args = under_session_init(std::mem::take(&mut spec.args), agent_user.as_ref(), &cwd, credentials.is_some());
    if agent_user.is_some() {
        spec.uid = 0;
        spec.gid = 0;
        spec.additional_gids.clear();
        spec.capabilities = lazaret_oci::bundle::CapabilityPolicy::Explicit(SESSION_INIT_CAPABILITIES.to_vec());
    }
    let process = lazaret_oci::bundle::render_process(&lazaret_oci::bundle::build_process(&spec)?)?;
    let missing = || StartError::Io { context: "the client's pipes".into(), source: std::io::Error::other("missing descriptors") };
    let mut pipes = fds.into_iter();
    let (stdio, extra, master) = if req.tty {
        let pty = open_pty().map_err(StartError::errno("allocating a PTY"))?;
        if req.size.rows > 0 && req.size.cols > 0 {
            let _ = set_window_size(pty.master.as_fd(), req.size);
        }
        let dup = |f: &OwnedFd| f.try_clone().map_err(StartError::io("duplicating the PTY"));
        // runsc makes all of 0, 1 and 2 the terminal: a stream that is not
        // one goes in as descriptor 3 + its number, which the wrapper moves.
        let mut extra = Vec::new();
        for (i, on_pty) in req.terminal.iter().enumerate() {
            if !on_pty {
                extra.push((pipes.next().ok_or_else(missing)?, 3 + i as i32));
            }
        }
        ([dup(&pty.slave)?, dup(&pty.slave)?, pty.slave], extra, Some(pty.master))
    } else {
        match (pipes.next(), pipes.next(), pipes.next()) {
            (Some(a), Some(b), Some(c)) => ([a, b, c], Vec::new(), None),
            _ => return Err(missing()),
        }
    };
    // The spec holds the agent's environment (secrets too): never on disk.
    // On a terminal, runsc exec's controlling terminal is the PTY: resizes
    // (SIGWINCH) and the terminal's signals reach the agent through runsc.
    let mut extra = extra;
    if let Some(credentials) = credentials {
        extra.push((credentials, lazaret_protocol::session::CREDENTIALS_FD));
    }
    let child = d.runsc.exec(&d.container, process.as_bytes(), pid_file, stdio, extra, req.tty)?;
    Ok((child, master))
}

/// The test hook (with `LAZARET_TEST_HOOKS=1` in the launcher's
/// environment) that also puts each session's credentials into its agent's
/// environment (`LAZARET_ESCALATE_ADDR`, `_CA`, `_CERT`, `_KEY`), for the
/// tests of what the coordinator does with a stolen, foreign or ended
/// certificate.
pub const CREDENTIALS_HOOK: &str = "LAZARET_TEST_SESSION_CREDENTIALS";

/// The session's escalation credentials (the coordinator's address, the
/// Domain CA's certificate, and a client certificate and key of this
/// session alone, issued now, never stored) on a socket for
/// `lazaret-session-init`, the session's broker, to read on
/// `session::CREDENTIALS_FD`: never in the environment (gVisor makes every
/// process's environment readable by every other). `PATH` gets the
/// client's directory if the image's PATH lacks it.
fn escalation_credentials(
    env: &mut Vec<(String, String)>,
    address: std::net::SocketAddr,
    trust: &crate::trust::TrustAnchor,
    session: &str,
) -> Result<OwnedFd, StartError> {
    use lazaret_protocol::session::SessionCredentials;
    let issued = trust.issue_session(session)?;
    let credentials = SessionCredentials {
        addr: address.to_string(),
        ca: trust.ca_pem().to_string(),
        cert: issued.cert_pem.clone(),
        key: issued.key_pem.clone(),
    };
    if std::env::var("LAZARET_TEST_HOOKS").as_deref() == Ok("1") && std::env::var(CREDENTIALS_HOOK).as_deref() == Ok("env") {
        use lazaret_protocol::escalation::{ENV_ADDR, ENV_CA, ENV_CERT, ENV_KEY};
        log(&format!("session {session}: its escalation credentials are in its agent's environment (test hook {CREDENTIALS_HOOK}=env)"));
        for (name, value) in
            [(ENV_ADDR, &credentials.addr), (ENV_CA, &credentials.ca), (ENV_CERT, &credentials.cert), (ENV_KEY, &credentials.key)]
        {
            env.retain(|(k, _)| k != name);
            env.push((name.to_string(), value.clone()));
        }
    }
    let blob = serde_json::to_vec(&credentials)
        .map_err(|e| StartError::Io { context: "encoding the session's credentials".into(), source: std::io::Error::other(e) })?;
    // A socket, not a pipe or file: another process in the sandbox can
    // reopen those through /proc/PID/fd, never a socket. The whole blob
    // (a few KiB) fits the socket's buffer; this end closes at once.
    let (mut ours, theirs) = UnixStream::pair().map_err(StartError::io("creating the credentials socket"))?;
    std::io::Write::write_all(&mut ours, &blob).map_err(StartError::io("writing the session's credentials"))?;
    drop(ours);
    let dir = super::host::ESCALATE_DIR;
    match env.iter_mut().find(|(k, _)| k == "PATH") {
        Some((_, path)) if !path.split(':').any(|p| p == dir) => path.push_str(&format!(":{dir}")),
        Some(_) => {}
        None => env.push(("PATH".into(), dir.into())),
    }
    Ok(theirs.into())
}

/// What `lazaret-session-init` holds when it runs as root for a non-root
/// agent: changing to the agent's ids, dropping the bounding set first,
/// and killing the session's processes (the agent's uid's) at its end.
const SESSION_INIT_CAPABILITIES: [lazaret_oci::bundle::Capability; 4] = [
    lazaret_oci::bundle::Capability::Kill,
    lazaret_oci::bundle::Capability::Setgid,
    lazaret_oci::bundle::Capability::Setpcap,
    lazaret_oci::bundle::Capability::Setuid,
];

/// The session's command behind `lazaret-session-init`, the session's
/// subreaper: it runs the command as its child (as `user`, when given, in
/// `cwd`), forwards signals to it, and when it exits or the coordinator
/// sends `session::END_SIGNAL` (see `Domain::kill_session_tree`), kills
/// every process the session left, also those that double-forked, before
/// it exits with the command's status. It is also the session's escalation
/// broker. runsc's PID file names it, so signals go through it.
fn under_session_init(args: Vec<String>, user: Option<&AgentUser>, cwd: &Path, credentials: bool) -> Vec<String> {
    use lazaret_protocol::session::{COMMAND_SEPARATOR, CREDENTIALS_OPTION, CWD_OPTION, SESSION_INIT_PATH, USER_OPTION};
    let mut wrapped = vec![SESSION_INIT_PATH.to_string()];
    if let Some(user) = user {
        wrapped.extend([USER_OPTION.to_string(), user.to_arg()]);
    }
    if credentials {
        wrapped.push(CREDENTIALS_OPTION.to_string());
    }
    wrapped.extend([CWD_OPTION.to_string(), cwd.to_string_lossy().into_owned(), COMMAND_SEPARATOR.to_string()]);
    wrapped.extend(args);
    wrapped
}

/// The agent's command behind a `/bin/sh` that moves each stream that is
/// not the terminal from descriptor 3 + N (where runsc put it, see
/// [`start_agent`]) to N, closes the original and execs the command, which
/// keeps the shell's PID and the PTY as its controlling terminal.
fn stdio_wrapper(terminal: &[bool; 3], args: Vec<String>) -> Vec<String> {
    let mut script = String::new();
    for (n, on_pty) in terminal.iter().enumerate() {
        if !on_pty {
            let from = 3 + n;
            let dir = if n == 0 { '<' } else { '>' };
            script.push_str(&format!("exec {n}{dir}&{from} {from}{dir}&-; "));
        }
    }
    script.push_str("exec \"$@\"");
    let mut wrapped = vec!["/bin/sh".to_string(), "-c".to_string(), script, "lazaret-stdio".to_string()];
    wrapped.extend(args);
    wrapped
}

#[cfg(test)]
mod tests {
    use super::{stdio_wrapper, under_session_init};

    #[test]
    fn the_wrapper_moves_only_the_streams_that_are_not_the_terminal() {
        let w = stdio_wrapper(&[true, false, true], vec!["agent".into(), "--flag".into()]);
        assert_eq!(w, ["/bin/sh", "-c", "exec 1>&4 4>&-; exec \"$@\"", "lazaret-stdio", "agent", "--flag"]);
        let w = stdio_wrapper(&[false, true, false], vec!["a b".into()]);
        assert_eq!(w[2], "exec 0<&3 3<&-; exec 2>&5 5>&-; exec \"$@\"");
        assert_eq!(w[4], "a b");
    }

    #[test]
    fn every_session_runs_under_its_subreaper() {
        let ws = std::path::Path::new("/home/d/ws");
        assert_eq!(
            under_session_init(vec!["agent".into(), "--".into()], None, ws, false),
            ["/usr/local/bin/lazaret-session-init", "--cwd", "/home/d/ws", "--", "agent", "--"]
        );
        let user = lazaret_protocol::session::AgentUser { uid: 1000, gid: 1001, groups: vec![27] };
        assert_eq!(
            under_session_init(vec!["agent".into()], Some(&user), ws, true),
            ["/usr/local/bin/lazaret-session-init", "--user", "1000:1001:27", "--credentials", "--cwd", "/home/d/ws", "--", "agent"]
        );
    }

    /// `runsc kill` refuses real-time signals ("unknown signal"): the
    /// session's end must be one of the named ones.
    #[test]
    fn the_end_signal_is_one_runsc_kill_accepts() {
        assert!((1..=31).contains(&lazaret_protocol::session::END_SIGNAL));
        assert!(
            ![libc::SIGKILL, libc::SIGSTOP, libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP]
                .contains(&lazaret_protocol::session::END_SIGNAL)
        );
    }
}
