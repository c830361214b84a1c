//! Escalation requests, from the TLS connection to the one result.
//!
//! A request arrives over mutual TLS on the sidecar's sandbox-facing
//! address. Before anything is journalled or run: the client certificate
//! chains to this Domain's CA (rustls), names a Session ID of this Domain
//! (`TrustAnchor::session_of`) that is registered and connected here, and
//! the request is well-formed, its working directory lies in the
//! workspace, and its ID was never seen in this Domain. Anything else is
//! refused unjournalled (the model's requests all have valid
//! certificates).
//!
//! A session has at most one accepted request (the model's
//! `activeRequest`): further requests of the same session wait before
//! `VerifyRequest`; other sessions are never held up. An accepted request
//! is approved by a rule, by an earlier "approve for this Domain", or by the
//! developer through a prompt on the session's own terminal; it then runs
//! on the host as the developer (`lazaret_runtime::hostexec`), its output
//! streamed back as it comes. Every accepted request ends with exactly one
//! result (`DeliverResult`) unless its session disconnects first, which
//! kills its host command before `DisconnectSession` is journalled.
//!
//! A waiting thread (`watch_client`) reads the connection for the client's
//! `Cancel` or its going away, which cancels the request wherever it is.
//!
//! # Which journal lines are on the disk before what
//!
//! Every step is applied to the model and written to the journal before
//! the real thing it stands for, in order, as always. What differs is when
//! a line is fsynced (see `crate::journal`): a line the next real action
//! depends on is fsynced before that action (`record`), outside the
//! Domain's lock so that other sessions' steps are not queued behind the
//! disk; a line that only records what has been decided or has happened is
//! written and reaches the disk with the next fsynced line (`note`):
//!
//! - `VerifyRequest`, `AutoApprove`: a decision, no action of its own. The
//!   action it leads to is preceded by an fsynced line that carries it
//!   along: `StartHostExecution` before the command runs, `PromptDeveloper`
//!   before a prompt is shown, `DeveloperDeny` before a denial is sent.
//! - `StartHostExecution`: fsynced before the host command is started, so
//!   the journal on the disk shows every host command that may have run.
//!   The fsync runs on a thread of its own while the command's process is
//!   made (`hostexec::prepare`: its cgroup, `clone3`, the child's set-up as
//!   the developer); that process waits before `execve` and is let go
//!   (`HeldProcess::start`) only after the fsync returned. If the fsync
//!   fails it is killed without having run anything.
//!   Prompt steps (`PromptDeveloper`, the developer's answer, time-outs),
//!   cancellations, failures: fsynced too (not on the fast path).
//! - `CompleteHostExecution`: the command has exited; nothing waits for it
//!   but the result. `DeliverResult`: journalled after the result was
//!   handed to the transport (the result never waited for its line), so
//!   its fsync can only be evidence, not an ordering: both reach the disk
//!   with the next fsynced line of the Domain, at the latest the session's
//!   `DisconnectSession`.
//!
//! A written line survives a crash of the coordinator (it is in the page
//! cache); a crash of the machine can lose the lines after the last fsync,
//! and leaves a journal that is a conformant prefix, as any crash does. A
//! rule-approved request thus waits for one fsync, not five.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lazaret_protocol::digest_set::IdDigestSet;
use lazaret_protocol::escalation::{ClientFrame, EscalationRequest, EscalationResult, MAX_ARGS, MAX_ARGV_BYTES, Outcome, ServerFrame};
use lazaret_protocol::journal::{DOMAIN_APPROVAL_RULE, Event};
use lazaret_protocol::wire::{self, CoordinatorMessage, PendingRequest, PromptDecision, PromptRequest};
use lazaret_runtime::hostexec::{self, End, HostCommand, Limits, StopSignal, Stream};

use crate::escalation::channel::TlsChannel;
use crate::escalation::environment::{HostUser, host_environment};
use crate::escalation::repository;
use crate::escalation::rules::{DomainApprovals, Rule};
use crate::git_trust::WorkspaceTrust;
use crate::journal::{JournalError, JournalSync};
use crate::trust;

use super::domain::Domain;
use super::log;

/// How long a client may take for its TLS handshake: long enough for
/// hundreds of clients starting at once on a loaded machine (the client
/// waits as long); a client that holds a connection idle holds only one of
/// [`MAX_CONNECTIONS`] and only its own Domain's.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client may take to send its request after the handshake.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Most escalation connections served at once (8 sessions × 100 requests
/// fit; each waits in a thread of its own).
const MAX_CONNECTIONS: usize = 1024;
/// How long a disconnecting session waits for its active request to end.
const DISCONNECT_WAIT: Duration = Duration::from_secs(10);
/// How long a frame for a session waits for its Welcome to be out.
const ATTACH_WAIT: Duration = Duration::from_secs(5);
/// The [`IdDigestSet`] kind of the request IDs [`Escalations`] has seen.
const SEEN_REQUEST: &str = "escalation-request";
/// Longest field a prompt carries (the client cuts it further for display).
const PROMPT_FIELD: usize = 16 * 1024;

/// The Domain's escalation service: the TLS configuration, the request IDs
/// seen, the developer's approvals for this Domain.
pub(super) struct Escalations {
    /// Where sandbox clients connect (the sidecar's sandbox-facing address).
    pub address: SocketAddr,
    server: Arc<rustls::ServerConfig>,
    /// Every request ID that reached the ID check, refused or not: as
    /// digests (16 bytes each, see [`IdDigestSet`]), since the set lives as
    /// long as the Domain.
    seen: Mutex<IdDigestSet>,
    approvals: Mutex<DomainApprovals>,
    /// The cgroup under which each host command gets its own.
    cgroup_parent: PathBuf,
    /// Git Sentry's read-only paths, workspace-relative: a host command
    /// runs only in a repository they protect.
    protected: Vec<PathBuf>,
    /// The workspace's git entries at this run's start and those an agent
    /// made (`crate::git_trust`), or why they are unknown (then no host
    /// command runs).
    trust: Result<WorkspaceTrust, String>,
}

impl Escalations {
    /// The service for a Domain whose sandbox reaches it at `address`;
    /// `protected` are Git Sentry's workspace-relative read-only paths,
    /// `trust` what this run trusts of the workspace's git entries.
    pub fn new(
        address: SocketAddr,
        server: Arc<rustls::ServerConfig>,
        cgroup_parent: PathBuf,
        protected: Vec<PathBuf>,
        trust: Result<WorkspaceTrust, String>,
    ) -> Escalations {
        Escalations {
            address,
            server,
            seen: Mutex::new(IdDigestSet::new()),
            approvals: Mutex::new(DomainApprovals::new()),
            cgroup_parent,
            protected,
            trust,
        }
    }
}

/// What a session's requests need of the session: its client (for
/// prompts), whether it can be asked, its host environment, and the slot
/// that admits one request at a time.
pub(super) struct SessionLink {
    session: String,
    client: Mutex<Option<UnixStream>>,
    can_prompt: bool,
    host_env: Vec<(String, String)>,
    slot: Mutex<Slot>,
    changed: Condvar,
}

#[derive(Default)]
struct Slot {
    active: Option<Active>,
    queued: Vec<Waiting>,
    answer: Option<(String, PromptDecision)>,
    gone: bool,
}

struct Active {
    id: String,
    argv: Vec<String>,
    since: Instant,
    state: &'static str,
    cancel: Arc<Cancel>,
}

struct Waiting {
    id: String,
    argv: Vec<String>,
    since: Instant,
}

/// A request's cancellation: by its client, or by its session's end.
struct Cancel {
    fired: AtomicBool,
    stop: StopSignal,
}

impl Cancel {
    fn fire(&self, link: &SessionLink) {
        self.fired.store(true, Ordering::SeqCst);
        self.stop.fire();
        // Under the slot's lock, so that a waiter that just checked the flag
        // is already waiting when the notification comes.
        let _slot = link.lock();
        link.changed.notify_all();
    }

    fn fired(&self) -> bool {
        self.fired.load(Ordering::SeqCst)
    }
}

/// Why a session's request could not take its slot.
enum Entry {
    Entered,
    SessionGone,
    Cancelled,
}

/// How a prompt ended.
enum Answer {
    Decided(PromptDecision),
    TimedOut,
    Cancelled,
    SessionGone,
}

impl SessionLink {
    /// The link of a session whose client is `client`, that can be asked
    /// when its stdin is a terminal, with the host environment its Hello
    /// carried.
    pub fn new(session: &str, can_prompt: bool, host_env: Vec<(String, String)>) -> SessionLink {
        SessionLink {
            session: session.into(),
            client: Mutex::new(None),
            can_prompt,
            host_env,
            slot: Mutex::new(Slot::default()),
            changed: Condvar::new(),
        }
    }

    /// Gives the link the client's stream, once the session's Welcome is
    /// out (nothing may overtake it).
    pub fn attach(&self, client: Option<UnixStream>) {
        *self.client.lock().unwrap_or_else(|p| p.into_inner()) = client;
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends a frame to the session's client; frames from several threads
    /// never interleave.
    /// Waits up to [`ATTACH_WAIT`] for [`SessionLink::attach`]; false if the
    /// frame could not be written.
    pub fn send(&self, message: &CoordinatorMessage) -> bool {
        let deadline = Instant::now() + ATTACH_WAIT;
        loop {
            let client = self.client.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(mut stream) = client.as_ref() {
                return wire::write_message(&mut stream, message).is_ok();
            }
            drop(client);
            if Instant::now() >= deadline || self.gone() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The developer's answer to the prompt of `request`, from the client.
    pub fn answer(&self, request: &str, decision: PromptDecision) {
        let mut slot = self.lock();
        let prompting = slot.active.as_ref().is_some_and(|a| a.id == request && a.state == "awaiting-approval");
        if prompting {
            slot.answer = Some((request.to_string(), decision));
            self.changed.notify_all();
        } else {
            log(&format!("session {}: an answer for {request:?}, which is not being asked; ignored", self.session));
        }
    }

    /// The session is ending: cancels its active request (killing its host
    /// command) and refuses its queued ones; returns once the active request
    /// has let go of its slot, or after [`DISCONNECT_WAIT`].
    pub fn disconnect(&self) {
        let mut slot = self.lock();
        slot.gone = true;
        if let Some(active) = &slot.active {
            active.cancel.fired.store(true, Ordering::SeqCst);
            active.cancel.stop.fire();
        }
        self.changed.notify_all();
        let deadline = Instant::now() + DISCONNECT_WAIT;
        while slot.active.is_some() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log(&format!("session {}: its escalation request did not end in {DISCONNECT_WAIT:?}", self.session));
                break;
            }
            slot = self.changed.wait_timeout(slot, left).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
    }

    fn gone(&self) -> bool {
        self.lock().gone
    }

    /// Waits for the session's slot (one accepted request at a time).
    fn enter(&self, id: &str, argv: &[String], cancel: &Arc<Cancel>) -> Entry {
        let mut slot = self.lock();
        slot.queued.push(Waiting { id: id.into(), argv: argv.to_vec(), since: Instant::now() });
        let entry = loop {
            if slot.gone {
                break Entry::SessionGone;
            }
            if cancel.fired() {
                break Entry::Cancelled;
            }
            if slot.active.is_none() {
                slot.active =
                    Some(Active { id: id.into(), argv: argv.to_vec(), since: Instant::now(), state: "deciding", cancel: cancel.clone() });
                break Entry::Entered;
            }
            slot = self.changed.wait(slot).unwrap_or_else(|p| p.into_inner());
        };
        slot.queued.retain(|w| w.id != id);
        entry
    }

    /// Lets the next request of the session in.
    fn leave(&self) {
        let mut slot = self.lock();
        slot.active = None;
        slot.answer = None;
        self.changed.notify_all();
    }

    fn set_state(&self, state: &'static str) {
        if let Some(active) = self.lock().active.as_mut() {
            active.state = state;
        }
    }

    /// Waits for the developer's answer to `id` until `deadline`.
    fn wait_answer(&self, id: &str, cancel: &Cancel, deadline: Instant) -> Answer {
        let mut slot = self.lock();
        loop {
            if slot.gone {
                return Answer::SessionGone;
            }
            if cancel.fired() {
                return Answer::Cancelled;
            }
            if let Some((_, decision)) = slot.answer.take_if(|(r, _)| r == id) {
                return Answer::Decided(decision);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Answer::TimedOut;
            }
            slot = self.changed.wait_timeout(slot, left).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// The session's unfinished requests, for `lazaret ls`.
    pub fn pending(&self) -> Vec<PendingRequest> {
        let slot = self.lock();
        let active = slot.active.iter().map(|a| (a.id.as_str(), &a.argv, a.since, a.state));
        let queued = slot.queued.iter().map(|w| (w.id.as_str(), &w.argv, w.since, "queued"));
        let mut pending: Vec<PendingRequest> = active
            .chain(queued)
            .map(|(id, argv, since, state)| PendingRequest {
                session: self.session.clone(),
                request: id.into(),
                argv: argv.clone(),
                state: state.into(),
                age_secs: since.elapsed().as_secs(),
            })
            .collect();
        pending.sort_by_key(|p| std::cmp::Reverse(p.age_secs));
        pending
    }
}

/// Accepts escalation connections until teardown shuts the listener down.
pub(super) fn accept_loop(d: &Arc<Domain>, listener: Arc<TcpListener>) {
    let accept = || listener.accept().map(|(tcp, _)| tcp);
    super::domain::accept_until_teardown(d, "escalation", MAX_CONNECTIONS, |d| &d.escalation_connections, accept, serve_connection);
}

/// One connection: handshake, identify the session, read the request,
/// serve it.
fn serve_connection(d: &Arc<Domain>, tcp: TcpStream) {
    let Some(esc) = d.escalations.as_ref() else { return };
    // From the first flight on: the handshake's records are small and each
    // one waits for the peer's answer, so Nagle only delays them.
    let _ = tcp.set_nodelay(true);
    let tls = match trust::accept(&esc.server, tcp, HANDSHAKE_TIMEOUT) {
        Ok(tls) => tls,
        Err(e) => {
            log(&format!("escalation: refused a connection: {e}"));
            return;
        }
    };
    let session = match d.trust.session_of(tls.conn.peer_certificates().unwrap_or(&[])) {
        Ok(s) => s,
        Err(e) => {
            log(&format!("escalation: refused a certificate: {e}"));
            return;
        }
    };
    let rustls::StreamOwned { conn, sock } = tls;
    let chan = match TlsChannel::new(conn, sock) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            log(&format!("escalation: {e}"));
            return;
        }
    };
    match chan.recv(Some(REQUEST_TIMEOUT)) {
        Ok(ClientFrame::Request(req)) => serve_request(d, esc, &chan, &session, req),
        Ok(ClientFrame::Cancel) => {}
        Err(e) => log(&format!("escalation: session {session}: no request: {e}")),
    }
    chan.close();
}

/// How a request ended: a result to deliver (and journal as delivered), a
/// result outside the model (a refusal before acceptance, or after the
/// session left), or nothing to say.
enum Ending {
    Deliver(EscalationResult),
    Unjournalled(EscalationResult),
}

fn result(outcome: Outcome) -> EscalationResult {
    EscalationResult { outcome, truncated: false }
}

fn refused(reason: impl Into<String>) -> Ending {
    Ending::Unjournalled(result(Outcome::Refused { reason: reason.into() }))
}

fn serve_request(d: &Arc<Domain>, esc: &Escalations, chan: &Arc<TlsChannel>, session: &str, req: EscalationRequest) {
    if let Some(ending) = admit_and_run(d, esc, chan, session, &req) {
        deliver(d, chan, session, &req, ending);
    }
}

/// Sends the request's one result and, for an accepted request, journals
/// its delivery — before the session's next request may be verified (the
/// model's `activeRequest` is cleared by `DeliverResult`).
fn deliver(d: &Domain, chan: &TlsChannel, session: &str, req: &EscalationRequest, ending: Ending) {
    let (result, journal) = match ending {
        Ending::Deliver(r) => (r, true),
        Ending::Unjournalled(r) => (r, false),
    };
    let sent = chan.send(&ServerFrame::Result(result.clone()));
    if let Err(e) = &sent {
        log(&format!("escalation {}: the result did not reach the client: {e}", req.id));
    }
    if journal {
        // Handed to the transport. A client that vanished after its request
        // was accepted cannot get it, yet the request must still end for its
        // session: the model knows one connection per session, not per
        // request.
        note(d, Event::DeliverResult { request: req.id.clone() });
    }
    log(&format!(
        "escalation {} (session {session}): {:?}{}",
        req.id,
        result.outcome,
        if result.truncated { ", output truncated" } else { "" }
    ));
}

/// Journals `event` and fsyncs it, after letting go of the Domain's lock
/// (group commit); false if the model refused it (a race lost to the
/// session's end) or it could not be made durable, in which case the
/// caller must not act on it.
fn record(d: &Domain, event: Event) -> bool {
    let name = event.name();
    // The guard is a temporary: the lock ends with this statement.
    let written = d.live().journal.record_unsynced(event);
    match written.and_then(|sync| sync.sync()) {
        Ok(()) => true,
        Err(e) => {
            log(&format!("escalation: {name} not journalled: {e}"));
            false
        }
    }
}

/// Journals `event` without waiting for the disk and returns what makes it
/// durable: the caller fsyncs it before the action it stands for. None if
/// the model refused it.
fn write(d: &Domain, event: Event) -> Option<JournalSync> {
    let name = event.name();
    let written = d.live().journal.record_unsynced(event);
    match written {
        Ok(sync) => Some(sync),
        Err(e) => {
            log(&format!("escalation: {name} not journalled: {e}"));
            None
        }
    }
}

/// Journals `event`, a record of what has been decided or has happened
/// that no real action waits for: written now, on the disk with the next
/// fsynced line (see the module docs for which lines these are). False if
/// the model refused it.
fn note(d: &Domain, event: Event) -> bool {
    let name = event.name();
    let written = d.live().journal.record_unsynced(event);
    match written {
        Ok(_) => true,
        Err(e) => {
            log(&format!("escalation: {name} not journalled: {e}"));
            false
        }
    }
}

/// The path of `cwd` (a sandbox path) relative to the workspace root,
/// which the sandbox sees at the same path as the host; `None` outside it
/// or for a path with `.` or `..` components.
fn workspace_relative(root: &Path, cwd: &str) -> Option<PathBuf> {
    // On the text: `Path::components` drops inner `.` components.
    if cwd.split('/').any(|c| c == "." || c == "..") {
        return None;
    }
    Path::new(cwd).strip_prefix(root).ok().map(Path::to_path_buf)
}

/// Admits the request and, once it holds its session's slot, decides, runs
/// and delivers it (None: delivered); or the ending of a request that never
/// got the slot.
fn admit_and_run(d: &Arc<Domain>, esc: &Escalations, chan: &Arc<TlsChannel>, session: &str, req: &EscalationRequest) -> Option<Ending> {
    if let Err(e) = req.validate() {
        return Some(refused(format!("malformed request: {e}")));
    }
    let link = match d.live().sessions.get(session) {
        Some(entry) => entry.link.clone(),
        None => return Some(refused(format!("session {session} is not connected to this Domain"))),
    };
    let root = d.ctx.workspace.root();
    let Some(rel) = workspace_relative(root, &req.cwd) else {
        return Some(refused(format!(
            "the working directory {} is outside the workspace {}",
            lazaret_protocol::display::inert(&req.cwd, 512),
            root.display()
        )));
    };
    let fresh = esc.seen.lock().unwrap_or_else(|p| p.into_inner()).insert(SEEN_REQUEST, &req.id);
    if !fresh {
        return Some(refused(format!("request ID {} was used before", req.id)));
    }
    let stop = match StopSignal::new() {
        Ok(s) => s,
        Err(e) => return Some(Ending::Unjournalled(result(Outcome::Failed { reason: format!("cannot prepare the request: {e}") }))),
    };
    let cancel = Arc::new(Cancel { fired: AtomicBool::new(false), stop });
    {
        let (chan, cancel, link) = (chan.clone(), cancel.clone(), link.clone());
        let watcher = std::thread::Builder::new().name("escalation-client".into()).spawn(move || watch_client(&chan, &cancel, &link));
        if watcher.is_err() {
            return Some(Ending::Unjournalled(result(Outcome::Failed { reason: "cannot start a thread".into() })));
        }
    }
    match link.enter(&req.id, &req.argv, &cancel) {
        Entry::Entered => {}
        Entry::SessionGone => return Some(refused(format!("session {session} ended"))),
        Entry::Cancelled => return Some(Ending::Unjournalled(result(Outcome::Cancelled))),
    }
    let ending = decide_and_run(d, esc, &link, chan, session, req, &rel, &cancel);
    deliver(d, chan, session, req, ending);
    link.leave();
    None
}

/// Reads the client until it cancels or goes away; either cancels the
/// request. Ends when the connection is closed after the result.
fn watch_client(chan: &TlsChannel, cancel: &Cancel, link: &SessionLink) {
    match chan.recv(None) {
        Ok(ClientFrame::Cancel) => cancel.fire(link),
        Ok(ClientFrame::Request(_)) => {
            log("escalation: a second request on one connection; cancelling the first");
            cancel.fire(link);
        }
        Err(_) => cancel.fire(link),
    }
}

/// What was approved: the argument vector and the rule (if a rule did).
struct Approved<'r> {
    argv: Vec<String>,
    rule: Option<&'r Rule>,
}

#[allow(clippy::too_many_arguments)]
fn decide_and_run(
    d: &Domain,
    esc: &Escalations,
    link: &SessionLink,
    chan: &TlsChannel,
    session: &str,
    req: &EscalationRequest,
    rel: &Path,
    cancel: &Cancel,
) -> Ending {
    let settings = &d.ctx.profile.escalation;
    let rule = settings.matching_rule(&req.argv, rel);
    let for_domain = rule.is_none() && esc.approvals.lock().unwrap_or_else(|p| p.into_inner()).is_approved(&req.argv, rel);
    let verified = Event::verify_request(session, &req.id, &req.argv, &req.cwd, &req.justification, rule.is_some() || for_domain);
    if !note(d, verified) {
        return refused(format!("session {session} cannot make a request now"));
    }
    let approved = if let Some(rule) = rule {
        if !note(d, Event::AutoApprove { request: req.id.clone(), rule: rule.name.clone() }) {
            return lost(link);
        }
        Approved { argv: req.argv.clone(), rule: Some(rule) }
    } else if for_domain {
        if !note(d, Event::AutoApprove { request: req.id.clone(), rule: DOMAIN_APPROVAL_RULE.into() }) {
            return lost(link);
        }
        Approved { argv: req.argv.clone(), rule: None }
    } else {
        match ask_developer(d, esc, link, chan, session, req, rel, cancel) {
            Ok(argv) => Approved { argv, rule: None },
            Err(ending) => return ending,
        }
    };
    run_on_host(d, esc, link, chan, req, rel, cancel, approved)
}

/// The model refused a step: the session left meanwhile (its request is
/// closed), or something is badly wrong.
fn lost(link: &SessionLink) -> Ending {
    if link.gone() {
        refused("the session ended")
    } else {
        Ending::Unjournalled(result(Outcome::Failed {
            reason: "the coordinator's protocol state refused the request (see coordinator.log)".into(),
        }))
    }
}

/// Shows the prompt on the session's terminal and waits for the
/// developer; the approved argument vector, or how the request ended.
#[allow(clippy::too_many_arguments)]
fn ask_developer(
    d: &Domain,
    esc: &Escalations,
    link: &SessionLink,
    chan: &TlsChannel,
    session: &str,
    req: &EscalationRequest,
    rel: &Path,
    cancel: &Cancel,
) -> Result<Vec<String>, Ending> {
    let id = req.id.clone();
    if !record(d, Event::PromptDeveloper { request: id.clone() }) {
        return Err(lost(link));
    }
    if !link.can_prompt {
        let reason = "no rule approves this command, and the session has no terminal to ask the developer on (add an [[escalation.rules]] entry, or run the agent from a terminal)";
        if !record(d, Event::DeveloperDeny { request: id, reason: reason.into() }) {
            return Err(lost(link));
        }
        return Err(Ending::Deliver(result(Outcome::Denied { reason: reason.into() })));
    }
    let timeout = d.ctx.profile.escalation.prompt_timeout;
    link.set_state("awaiting-approval");
    // The session's terminal holds the agent's output back while the prompt
    // is up, so this line usually shows after the developer answered, but
    // it can also win the race and show just before the prompt: it reads
    // true in both orders.
    let _ = chan.send(&ServerFrame::Status("no rule approves this command: the developer decides on their terminal".into()));
    let cut = |s: &str| {
        s.chars()
            .scan(0usize, |n, c| {
                *n += c.len_utf8();
                (*n <= PROMPT_FIELD).then_some(c)
            })
            .collect::<String>()
    };
    let prompt = PromptRequest {
        request: id.clone(),
        profile: d.ctx.profile.name.clone(),
        session: session.into(),
        cwd: host_dir(d.ctx.workspace.root(), rel).display().to_string(),
        argv: req.argv.clone(),
        justification: cut(&req.justification),
        timeout_secs: timeout.as_secs(),
    };
    if !link.send(&CoordinatorMessage::Prompt(prompt)) {
        let reason = "the session's terminal could not be reached";
        record(d, Event::DeveloperDeny { request: id, reason: reason.into() });
        return Err(Ending::Deliver(result(Outcome::Denied { reason: reason.into() })));
    }
    let withdraw = |reason: String| {
        link.send(&CoordinatorMessage::PromptWithdrawn { request: req.id.clone(), reason });
    };
    match link.wait_answer(&id, cancel, Instant::now() + timeout) {
        Answer::SessionGone => Err(refused("the session ended")),
        Answer::TimedOut => {
            withdraw(format!("no answer in {} s; denied", timeout.as_secs()));
            if !record(d, Event::TimeoutRequest { request: id }) {
                return Err(lost(link));
            }
            Err(Ending::Deliver(result(Outcome::TimedOut)))
        }
        Answer::Cancelled => {
            withdraw("the agent cancelled the request".into());
            if !record(d, Event::CancelRequest { request: id }) {
                return Err(lost(link));
            }
            Err(Ending::Deliver(result(Outcome::Cancelled)))
        }
        Answer::Decided(decision) => {
            let (event, argv) = match decision {
                PromptDecision::Approve => (Event::DeveloperApprove { request: id.clone(), for_domain: false }, req.argv.clone()),
                PromptDecision::ApproveForDomain => {
                    esc.approvals.lock().unwrap_or_else(|p| p.into_inner()).approve(&req.argv, rel);
                    (Event::DeveloperApprove { request: id.clone(), for_domain: true }, req.argv.clone())
                }
                PromptDecision::Edit { argv } if argv == req.argv => {
                    (Event::DeveloperApprove { request: id.clone(), for_domain: false }, argv)
                }
                PromptDecision::Edit { argv } if edited_argv_ok(&argv) => (Event::developer_edit_approve(&id, &argv), argv),
                PromptDecision::Edit { .. } | PromptDecision::Deny => {
                    let reason = "the developer denied it";
                    if !record(d, Event::DeveloperDeny { request: id, reason: reason.into() }) {
                        return Err(lost(link));
                    }
                    return Err(Ending::Deliver(result(Outcome::Denied { reason: reason.into() })));
                }
            };
            if !record(d, event) {
                return Err(lost(link));
            }
            Ok(argv)
        }
    }
}

/// An edited command the developer typed obeys the channel's limits too.
fn edited_argv_ok(argv: &[String]) -> bool {
    !argv.is_empty()
        && !argv[0].is_empty()
        && argv.len() <= MAX_ARGS
        && argv.iter().map(String::len).sum::<usize>() <= MAX_ARGV_BYTES
        && !argv.iter().any(|a| a.contains('\0'))
}

/// Runs the approved command on the host and streams its output.
#[allow(clippy::too_many_arguments)]
fn run_on_host(
    d: &Domain,
    esc: &Escalations,
    link: &SessionLink,
    chan: &TlsChannel,
    req: &EscalationRequest,
    rel: &Path,
    cancel: &Cancel,
    approved: Approved<'_>,
) -> Ending {
    let id = req.id.clone();
    let settings = &d.ctx.profile.escalation;
    let mut timeout = settings.timeout_for(approved.rule);
    if let Some(asked) = req.timeout_secs {
        timeout = timeout.min(Duration::from_secs(asked));
    }
    // Written now, fsynced below while the command's process is being made
    // (it waits before exec until the line is on the disk).
    let Some(start_line) = write(d, Event::StartHostExecution { request: id.clone() }) else {
        return lost(link);
    };
    link.set_state("running");
    let fail = |reason: String| {
        if record(d, Event::FailHostExecution { request: id.clone(), reason: reason.clone() }) {
            Ending::Deliver(result(Outcome::Failed { reason }))
        } else {
            lost(link)
        }
    };
    // The workspace root, opened once: the working directory, git's
    // directory and each `.git` on the way are resolved beneath it.
    let root = match lazaret_mounts::safe_path::open_root_dir(d.ctx.workspace.root()) {
        Ok(fd) => fd,
        Err(e) => return fail(format!("the workspace {}: {e}", d.ctx.workspace.root().display())),
    };
    let cwd = match open_workspace_dir(root.as_fd(), rel) {
        Ok(fd) => fd,
        Err(e) => return fail(format!("the working directory {}: {e}", host_dir(d.ctx.workspace.root(), rel).display())),
    };
    // Git run directly starts where its `-C` options lead; that directory
    // too must be reachable without a symlink.
    let runs_git = repository::runs_git(&approved.argv);
    let git_dir = if runs_git {
        match repository::git_start_dir(&approved.argv, rel, d.ctx.workspace.root()) {
            Ok(dir) => dir,
            Err(reason) => return fail(reason),
        }
    } else {
        rel.to_path_buf()
    };
    if git_dir != rel {
        if let Err(e) = open_workspace_dir(root.as_fd(), &git_dir) {
            return fail(format!("git's directory {}: {e}", host_dir(d.ctx.workspace.root(), &git_dir).display()));
        }
    }
    let trust = match &esc.trust {
        Ok(trust) => trust,
        Err(e) => return fail(format!("which repositories of the workspace an agent made is unknown ({e}); Lazaret runs no host command")),
    };
    let repository = match protected_repository(root.as_fd(), &git_dir, &esc.protected, &trust.untrusted) {
        Ok(worktree) => worktree,
        Err(reason) => return fail(reason),
    };
    // Git recurses into submodules (running git with each one's own
    // config) below its repository; a program that runs git itself may
    // run it anywhere in the workspace. No repository there may be the
    // agent's: not made during this run, nor by any Domain's agent as the
    // shared record says now (another profile's Domain may have started,
    // or ended, since this one did).
    let scope = if runs_git { repository.clone() } else { PathBuf::new() };
    let mut entries = match crate::git_trust::entries_beneath(root.as_fd(), &scope) {
        Ok(entries) => entries,
        Err(e) => return fail(format!("looking for repositories below {}: {e}", host_dir(d.ctx.workspace.root(), &scope).display())),
    };
    let own = repository.join(".git");
    entries.insert(own.clone());
    let trust_record = match crate::git_trust::load(&d.ctx.paths.storage_root) {
        Ok(r) => r,
        Err(e) => return fail(format!("which repositories of the workspace an agent made is unknown ({e}); Lazaret runs no host command")),
    };
    let workspace = d.ctx.workspace.root();
    let absolute = entries.iter().map(|e| workspace.join(e)).collect();
    let mut untrusted = trust.untrusted.clone();
    untrusted.extend(
        trust_record
            .untrusted(d.ctx.domain_id.as_str(), &absolute)
            .into_iter()
            .filter_map(|e| e.strip_prefix(workspace).ok().map(Path::to_path_buf)),
    );
    if untrusted.contains(&own) {
        if let Err(reason) = protected_repository(root.as_fd(), &git_dir, &esc.protected, &untrusted) {
            return fail(reason);
        }
    }
    if let Err(reason) = repository::recursion_targets(&entries, Some(&own), &trust.at_start, &untrusted) {
        return fail(reason);
    }
    let developer = &d.ctx.developer;
    let user = HostUser { name: &developer.name, home: &developer.home, shell: &developer.shell };
    let rule_env = approved.rule.map(|r| r.env.as_slice()).unwrap_or(&[]);
    let mut env = host_environment(&user, &link.host_env, rule_env);
    // Every command: the git it runs, or that runs inside it, does not
    // recurse into submodules by itself (a rule's env never names GIT_*).
    env.extend(repository::no_recursion_env());
    if runs_git {
        let pinned = repository::pinned_git_env(&host_dir(d.ctx.workspace.root(), &repository));
        env.retain(|(k, _)| !pinned.iter().any(|(p, _)| p == k));
        env.extend(pinned);
    }
    let command = HostCommand {
        argv: approved.argv,
        cwd,
        uid: developer.uid,
        gid: developer.gid,
        groups: developer.groups.iter().map(|g| g.gid).collect(),
        env,
        cgroup: esc.cgroup_parent.join(format!("escalation-{}", &id[..16])),
        mount_ns: None,
    };
    // The fsync of StartHostExecution and the making of the process (its
    // cgroup, clone3, the child's set-up) overlap; the program is exec'd
    // only once the line is durable. An fsync that failed: the waiting
    // process is killed (dropped) and nothing ran, as before.
    let (held, synced) = std::thread::scope(|s| {
        let fsync = std::thread::Builder::new().name("escalation-fsync".into()).spawn_scoped(s, || start_line.sync());
        let held = hostexec::prepare(command);
        let synced = match fsync {
            Ok(handle) => handle.join().unwrap_or_else(|_| {
                Err(JournalError::Io { path: PathBuf::from("journal"), source: std::io::Error::other("the fsync thread panicked") })
            }),
            // No thread: fsync here, after the process is made.
            Err(_) => start_line.sync(),
        };
        (held, synced)
    });
    if let Err(e) = synced {
        log(&format!("escalation: StartHostExecution not journalled: {e}"));
        drop(held);
        return lost(link);
    }
    let process = match held.and_then(hostexec::HeldProcess::start) {
        Ok(p) => p,
        Err(e) => return fail(e.to_string()),
    };
    let limits = Limits { deadline: Instant::now() + timeout, output_cap: settings.output_limit };
    let sink = |stream: Stream, data: &[u8]| {
        let frame = match stream {
            Stream::Stdout => ServerFrame::Stdout(data.to_vec()),
            Stream::Stderr => ServerFrame::Stderr(data.to_vec()),
        };
        chan.send(&frame).map_err(std::io::Error::other)
    };
    let finished = match process.run(limits, &cancel.stop, sink) {
        Ok(f) => f,
        Err(e) => return fail(e.to_string()),
    };
    let truncated = finished.truncated;
    let with = |outcome| EscalationResult { outcome, truncated };
    match finished.end {
        End::Exited(status) => {
            if !note(d, Event::CompleteHostExecution { request: id, exit_status: Some(status) }) {
                return lost(link);
            }
            Ending::Deliver(with(Outcome::Completed { exit_status: status }))
        }
        End::TimedOut => {
            if !record(d, Event::TimeoutRequest { request: id }) {
                return lost(link);
            }
            Ending::Deliver(with(Outcome::TimedOut))
        }
        End::Stopped | End::SinkFailed(_) => {
            if link.gone() {
                return refused("the session ended");
            }
            if !record(d, Event::CancelRequest { request: id }) {
                return lost(link);
            }
            Ending::Deliver(with(Outcome::Cancelled))
        }
    }
}

/// The host directory of a workspace-relative path (no trailing `/` for the root).
fn host_dir(root: &Path, rel: &Path) -> PathBuf {
    if rel.as_os_str().is_empty() { root.to_path_buf() } else { root.join(rel) }
}

/// The repository (its workspace-relative work tree) a host command in
/// `rel` would run git in, if Git Sentry protects it
/// ([`repository::protected_repository`]); each `.git` on the way is
/// looked at fd-relatively, never through a symlink.
fn protected_repository(
    root: BorrowedFd<'_>,
    rel: &Path,
    protected: &[PathBuf],
    untrusted: &std::collections::BTreeSet<PathBuf>,
) -> Result<PathBuf, String> {
    use lazaret_mounts::repo::DotGit;
    use repository::DotGitEntry;
    repository::protected_repository(rel, protected, untrusted, |dir| match lazaret_mounts::repo::read_dot_git(root, dir) {
        Ok(DotGit::Missing) => DotGitEntry::Missing,
        Ok(DotGit::Directory(_)) => DotGitEntry::Directory,
        Ok(DotGit::GitdirFile(_)) => DotGitEntry::File,
        Ok(DotGit::Invalid(_)) | Err(_) => DotGitEntry::Unusable,
    })
}

/// Opens the request's directory beneath the workspace root (`root`)
/// without following any symlink (the workspace is the agent's).
fn open_workspace_dir(root: BorrowedFd<'_>, rel: &Path) -> Result<std::os::fd::OwnedFd, String> {
    if rel.as_os_str().is_empty() {
        return root.try_clone_to_owned().map_err(|e| e.to_string());
    }
    lazaret_mounts::safe_path::open_dir_beneath(root, rel).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_inside_the_workspace_map_to_the_host() {
        let root = Path::new("/home/dev/src/p");
        assert_eq!(workspace_relative(root, "/home/dev/src/p"), Some(PathBuf::new()));
        assert_eq!(workspace_relative(root, "/home/dev/src/p/web/app"), Some(PathBuf::from("web/app")));
        assert_eq!(workspace_relative(root, "/home/dev/src/p/../q"), None);
        assert_eq!(workspace_relative(root, "/home/dev/src/p/./x"), None);
        assert_eq!(workspace_relative(root, "/home/dev/src/pq"), None);
        assert_eq!(workspace_relative(root, "/etc"), None);
    }

    #[test]
    fn an_edited_command_obeys_the_channel_limits() {
        assert!(edited_argv_ok(&["git".into(), "push".into()]));
        assert!(!edited_argv_ok(&[]));
        assert!(!edited_argv_ok(&[String::new()]));
        assert!(!edited_argv_ok(&["a\0b".into()]));
        assert!(!edited_argv_ok(&vec!["x".into(); MAX_ARGS + 1]));
    }

    #[test]
    fn a_session_admits_one_request_at_a_time_and_its_end_refuses_the_queue() {
        let link = Arc::new(SessionLink::new("s-1", false, Vec::new()));
        let cancel = |l: &SessionLink| {
            let _ = l;
            Arc::new(Cancel { fired: AtomicBool::new(false), stop: StopSignal::new().expect("stop signal") })
        };
        let first = cancel(&link);
        assert!(matches!(link.enter("r1", &["true".into()], &first), Entry::Entered));
        let second = std::thread::spawn({
            let link = link.clone();
            let c = cancel(&link);
            move || matches!(link.enter("r2", &["true".into()], &c), Entry::Entered)
        });
        // r2 waits behind r1 and shows as queued.
        let deadline = Instant::now() + Duration::from_secs(5);
        while link.pending().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let states: Vec<String> = link.pending().into_iter().map(|p| p.state).collect();
        assert_eq!(states, ["deciding", "queued"]);
        link.leave();
        assert!(second.join().expect("join"), "r2 entered once r1 left");
        let third = std::thread::spawn({
            let link = link.clone();
            let c = cancel(&link);
            move || matches!(link.enter("r3", &["true".into()], &c), Entry::SessionGone)
        });
        while link.pending().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        // The session ends while r2 is active: r2 is cancelled, r3 refused.
        let link2 = link.clone();
        let ender = std::thread::spawn(move || link2.disconnect());
        std::thread::sleep(Duration::from_millis(50));
        link.leave();
        ender.join().expect("join");
        assert!(third.join().expect("join"), "r3 was refused because the session ended");
    }

    #[test]
    fn a_prompt_answer_reaches_only_the_request_being_asked() {
        let link = SessionLink::new("s-1", true, Vec::new());
        let c = Arc::new(Cancel { fired: AtomicBool::new(false), stop: StopSignal::new().expect("stop signal") });
        assert!(matches!(link.enter("r1", &["git".into()], &c), Entry::Entered));
        link.answer("r1", PromptDecision::Approve); // not yet asking: ignored
        assert!(matches!(link.wait_answer("r1", &c, Instant::now() + Duration::from_millis(20)), Answer::TimedOut));
        link.set_state("awaiting-approval");
        link.answer("r0", PromptDecision::Approve); // another request: ignored
        link.answer("r1", PromptDecision::Deny);
        assert!(matches!(link.wait_answer("r1", &c, Instant::now() + Duration::from_secs(5)), Answer::Decided(PromptDecision::Deny)));
        c.fire(&link);
        assert!(matches!(link.wait_answer("r1", &c, Instant::now() + Duration::from_secs(5)), Answer::Cancelled));
    }
}
