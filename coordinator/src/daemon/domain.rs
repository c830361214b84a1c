//! A running Domain: what its session threads share, the accept loop, the
//! supervisor (stop requests, signals, the first-session timeout, health
//! checks), and the end of its life.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lazaret_netpolicy::topology::Netns;
use lazaret_oci::ImageRecord;
use lazaret_protocol::journal::Event;
use lazaret_protocol::wire::CoordinatorMessage;
use lazaret_runtime::Runsc;
use lazaret_runtime::signals::Signals;

use crate::context::Context;
use crate::journal::DomainJournal;
use crate::layout::{DomainDir, RunDir};
use crate::trust::TrustAnchor;

use super::host::{Network, Prepared, Sandbox};
use super::log;
use super::stages::UndoFailure;

/// How long a published Domain waits for its first session.
const FIRST_SESSION_WAIT: Duration = Duration::from_secs(30);
/// Most connections served at once.
const MAX_CONNECTIONS: usize = 128;
/// How long teardown waits for session threads to deliver their last Exit.
const FAREWELL_WAIT: Duration = Duration::from_secs(10);

/// The Domain's network as sessions and `lazaret debug` see it.
pub(super) struct NetworkView {
    /// The Sidecar ID.
    pub sidecar: String,
    /// The sandbox's network namespace.
    pub sandbox_ns: Option<Netns>,
    /// The sidecar's network namespace.
    pub sidecar_ns: Option<Netns>,
    /// The host's network namespace (the coordinator's), where the Domain's
    /// nftables table lives.
    pub host_ns: Option<Netns>,
    /// The Sidecar ID, parsed (None for a Domain without a network).
    pub sidecar_id: Option<lazaret_netpolicy::topology::SidecarId>,
}

/// Everything session threads share.
pub(super) struct Domain {
    pub ctx: Arc<Context>,
    pub dir: DomainDir,
    pub run: RunDir,
    pub image: ImageRecord,
    pub runsc: Runsc,
    pub container: String,
    pub cgroups_path: String,
    pub fingerprint: String,
    pub config_json: String,
    pub started: Instant,
    pub network: NetworkView,
    /// The Trust Anchor: issues session certificates, identifies escalation clients.
    pub trust: Arc<TrustAnchor>,
    /// The escalation service (None only in a Domain whose listener could not be made).
    pub escalations: Option<super::escalation::Escalations>,
    pub live: Mutex<Live>,
    pub changed: Condvar,
    pub connections: AtomicUsize,
    /// Open escalation connections (the escalation listener's own count).
    pub escalation_connections: AtomicUsize,
    /// The Workspace Guard (sessions ask it for a sweep when they end).
    pub guard: super::guard::GuardLink,
}

/// Where the Domain is in its life, as sessions see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Ready,
    Stopping,
}

/// The Domain's mutable state, behind one lock.
pub(super) struct Live {
    pub journal: DomainJournal,
    pub phase: Phase,
    pub sessions: BTreeMap<String, SessionEntry>,
    pub launcher: String,
    pub launcher_connected: bool,
    pub ever_joined: bool,
    pub stop: Option<StopRequest>,
    /// The session listeners' descriptors (the published one, and one
    /// per republication after the socket was removed), each owned by its
    /// accept thread.
    pub listener_fds: Vec<i32>,
    /// Accept threads of republished sockets (joined after supervision).
    pub acceptors: Vec<std::thread::JoinHandle<()>>,
    /// The inode of the published socket (None until it is published).
    pub socket_ino: Option<u64>,
    /// Sessions already told why the Domain stops (each hears it once).
    pub notified: std::collections::BTreeSet<String>,
    /// The escalation listener's descriptor, owned by its accept thread.
    pub escalation_listener_fd: Option<i32>,
}

/// A connected session.
pub(super) struct SessionEntry {
    /// Where runsc writes the agent's PID (inside the sandbox).
    pub pid_file: PathBuf,
    /// The session's client (every frame to it goes through here, so none
    /// interleave) and what its escalation requests need of it.
    pub link: Arc<super::escalation::SessionLink>,
}

/// A `lazaret stop` (or a termination signal, or a fault) in progress.
#[derive(Clone)]
pub(super) struct StopRequest {
    pub at: Instant,
    pub grace: Duration,
    pub term_sent: bool,
    pub kill_sent: bool,
    /// The one line each session is told (without the `lazaret: ` the client adds).
    pub notice: String,
}

/// What a session hears of a `lazaret stop` or a termination signal.
const STOP_NOTICE: &str = "the Domain is stopping (lazaret stop); the agent gets SIGTERM";

impl StopRequest {
    pub fn new(grace: Duration) -> StopRequest {
        StopRequest::because(grace, STOP_NOTICE.into())
    }

    /// A stop the coordinator decided on itself, with the line sessions see.
    pub fn because(grace: Duration, notice: String) -> StopRequest {
        StopRequest { at: Instant::now(), grace, term_sent: false, kill_sent: false, notice }
    }
}

impl Domain {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        ctx: Arc<Context>,
        dir: DomainDir,
        run: RunDir,
        prepared: Prepared,
        sandbox: Sandbox,
        network: &Network,
        trust: Arc<TrustAnchor>,
        escalations: Option<super::escalation::Escalations>,
        fingerprint: String,
        journal: DomainJournal,
        launcher: String,
        guard: super::guard::GuardLink,
    ) -> Domain {
        let topology = &network.topology;
        let view = NetworkView {
            sidecar: topology.sidecar_id().to_string(),
            sandbox_ns: topology.sandbox_netns().and_then(|n| n.try_clone().ok()),
            sidecar_ns: topology.sidecar_netns().and_then(|n| n.try_clone().ok()),
            host_ns: Netns::of_current_thread().ok(),
            sidecar_id: topology.sidecar_netns().map(|_| topology.sidecar_id()),
        };
        let config_json = ctx.config.render_json().unwrap_or_default();
        Domain {
            ctx,
            dir,
            run,
            image: prepared.image,
            runsc: prepared.runsc,
            container: sandbox.container,
            cgroups_path: sandbox.cgroups_path,
            fingerprint,
            config_json,
            started: Instant::now(),
            network: view,
            trust,
            escalations,
            live: Mutex::new(Live {
                journal,
                phase: Phase::Ready,
                sessions: BTreeMap::new(),
                launcher,
                launcher_connected: false,
                ever_joined: false,
                stop: None,
                listener_fds: Vec::new(),
                acceptors: Vec::new(),
                socket_ino: None,
                notified: Default::default(),
                escalation_listener_fd: None,
            }),
            changed: Condvar::new(),
            connections: AtomicUsize::new(0),
            escalation_connections: AtomicUsize::new(0),
            guard,
        }
    }

    /// The live state; a panicking session thread must not take the Domain
    /// down with it.
    pub fn live(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits up to `timeout` for a change of the live state.
    pub fn wait<'a>(&self, live: MutexGuard<'a, Live>, timeout: Duration) -> MutexGuard<'a, Live> {
        self.changed.wait_timeout(live, timeout).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0)
    }

    /// Journals BeginTeardown and withdraws the socket. Called with the
    /// state locked and no session connected.
    pub fn begin_teardown(&self, live: &mut Live) {
        if let Err(e) = live.journal.record(Event::BeginTeardown) {
            log(&format!("{e}"));
        }
        live.phase = Phase::Stopping;
        let _ = std::fs::remove_file(self.dir.socket());
        for fd in live.listener_fds.drain(..) {
            // `fd` is a listener's descriptor, still owned by its accept
            // thread (which only exits after this shutdown wakes it);
            // shutdown(2) does not close it.
            let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Both);
        }
        if let Some(fd) = live.escalation_listener_fd.take() {
            // The same for the escalation listener's accept thread.
            let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Both);
        }
        self.changed.notify_all();
    }

    /// Runs `unwind` (the start-up stack's) under the state lock, then lets
    /// session threads finish (they have sent their Exit already).
    pub fn tear_down(&self, unwind: impl FnOnce(&mut DomainJournal) -> Vec<UndoFailure>) {
        {
            let mut live = self.live();
            for failure in unwind(&mut live.journal) {
                log(&format!("teardown: {failure}"));
            }
        }
        let deadline = Instant::now() + FAREWELL_WAIT;
        while self.connections.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// After a session left: if it was the last, begins teardown (which
    /// the main thread finishes behind the session's Exit: the client gets
    /// its status as soon as its agent exited, and the Domain lock, held
    /// until everything is down, makes a new run wait for it).
    pub fn last_session_left(&self, live: &mut Live) {
        if live.sessions.is_empty() && live.phase == Phase::Ready {
            self.begin_teardown(live);
        }
    }

    /// Sends `signal` to a session's agent.
    pub fn signal_session(&self, session: &str, pid_file: &Path, signal: i32) {
        match read_internal_pid(pid_file) {
            Some(pid) => {
                if let Err(e) = self.runsc.kill_process(&self.container, pid, signal) {
                    log(&format!("session {session}: signal {signal}: {e}"));
                }
            }
            None => log(&format!("session {session}: no agent PID yet for signal {signal}")),
        }
    }

    /// Ends a session: its `lazaret-session-init` (the PID runsc wrote)
    /// gets `session::END_SIGNAL` and SIGKILLs the agent and every process
    /// the session left, double-forked ones too (they are re-parented to
    /// it). Should that signal fail, the tree `runsc ps` shows is killed
    /// from here.
    pub fn kill_session_tree(&self, session: &str, pid_file: &Path) {
        let Some(root) = read_internal_pid(pid_file) else {
            log(&format!("session {session}: no agent PID to kill"));
            return;
        };
        match self.runsc.kill_process(&self.container, root, lazaret_protocol::session::END_SIGNAL) {
            Ok(()) => return,
            Err(e) => log(&format!("session {session}: ending it through its subreaper: {e}; killing its tree from here")),
        }
        let tree = match self.runsc.processes(&self.container) {
            Ok(ps) => lazaret_runtime::runsc::descendants(&ps, root),
            Err(e) => {
                log(&format!("session {session}: listing processes: {e}"));
                vec![root]
            }
        };
        for pid in tree.into_iter().rev() {
            if let Err(e) = self.runsc.kill_process(&self.container, pid, libc::SIGKILL) {
                log(&format!("session {session}: killing PID {pid}: {e}"));
            }
        }
    }
}

/// The agent's PID inside the sandbox, once runsc has written it (waits up
/// to a second).
fn read_internal_pid(pid_file: &Path) -> Option<i32> {
    // The agent is never PID 1 (that is the container's reaper), which
    // read_pid_file refuses anyway.
    for _ in 0..100 {
        if let Ok(pid) = lazaret_runtime::runsc::read_pid_file(pid_file) {
            return Some(pid.as_raw());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Serves the published Domain until teardown begins: an accept thread
/// hands each connection to a thread of its own; this thread supervises.
pub(super) fn serve(d: &Arc<Domain>, listener: UnixListener, escalation: Option<Arc<std::net::TcpListener>>, signals: &mut Signals) {
    {
        let mut live = d.live();
        live.listener_fds.push(listener.as_raw_fd());
        live.socket_ino = std::fs::symlink_metadata(d.dir.socket()).ok().map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    }
    let acceptor = {
        let d = d.clone();
        std::thread::spawn(move || accept_sessions(&d, listener))
    };
    if let Some(l) = &escalation {
        d.live().escalation_listener_fd = Some(l.as_raw_fd());
    }
    let escalation_acceptor = escalation.map(|l| {
        let d = d.clone();
        std::thread::spawn(move || super::escalation::accept_loop(&d, l))
    });
    supervise(d, signals);
    let _ = acceptor.join();
    let republished = std::mem::take(&mut d.live().acceptors);
    for a in republished {
        let _ = a.join();
    }
    if let Some(a) = escalation_acceptor {
        let _ = a.join();
    }
}

/// Serves a session listener until teardown.
pub(super) fn accept_sessions(d: &Arc<Domain>, listener: UnixListener) {
    let accept = || listener.accept().map(|(stream, _)| stream);
    accept_until_teardown(d, "session", MAX_CONNECTIONS, |d| &d.connections, accept, super::session::serve_connection);
}

/// Accepts connections with `accept` until teardown begins (its shutdown of
/// the listener wakes `accept`), serving each in a thread named `kind` of
/// its own while fewer than `limit` of that kind are open, counted in
/// `count(d)`. Shared by the session socket and the escalation listener.
pub(super) fn accept_until_teardown<S: Send + 'static>(
    d: &Arc<Domain>,
    kind: &'static str,
    limit: usize,
    count: fn(&Domain) -> &AtomicUsize,
    mut accept: impl FnMut() -> std::io::Result<S>,
    serve: fn(&Arc<Domain>, S),
) {
    loop {
        let accepted = accept();
        if d.live().phase != Phase::Ready {
            return;
        }
        let conn = match accepted {
            Ok(c) => c,
            Err(e) => {
                log(&format!("{kind} accept: {e}"));
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if count(d).load(Ordering::SeqCst) >= limit {
            log(&format!("refused a {kind} connection: too many open connections"));
            continue;
        }
        count(d).fetch_add(1, Ordering::SeqCst);
        let d2 = d.clone();
        let spawned = std::thread::Builder::new().name(kind.into()).spawn(move || {
            serve(&d2, conn);
            count(&d2).fetch_sub(1, Ordering::SeqCst);
            d2.changed.notify_all();
        });
        if spawned.is_err() {
            count(d).fetch_sub(1, Ordering::SeqCst);
            log(&format!("refused a {kind} connection: cannot start a thread"));
        }
    }
}

/// The main thread after publishing: handles stop requests, signals, the
/// first-session timeout and the health checks ([`super::health`]), until
/// teardown begins.
fn supervise(d: &Arc<Domain>, signals: &mut Signals) {
    let published = Instant::now();
    let mut last_check = Instant::now();
    let mut live = d.live();
    loop {
        if live.phase != Phase::Ready {
            return;
        }
        while let Some(sig) = signals.pending_termination() {
            log(&format!("received {sig}: stopping the Domain"));
            live.stop.get_or_insert(StopRequest::new(Duration::from_secs(5)));
        }
        if last_check.elapsed() >= super::health::INTERVAL {
            // Without the lock: the checks talk to the kernel (netlink).
            drop(live);
            let findings = super::health::check(d);
            last_check = Instant::now();
            live = d.live();
            super::health::act(d, &mut live, findings);
        }
        if let Some(stop) = live.stop.take() {
            live.stop = Some(escalate_stop(d, &mut live, stop));
        }
        let abandoned = !live.ever_joined && published.elapsed() >= FIRST_SESSION_WAIT;
        if live.sessions.is_empty() && (live.stop.is_some() || abandoned) {
            if !live.launcher_connected {
                let launcher = live.launcher.clone();
                let _ = live.journal.record(Event::AbandonLaunch { session: launcher });
            }
            d.begin_teardown(&mut live);
            return;
        }
        live = d.wait(live, Duration::from_millis(100));
    }
}

/// One supervision round of a stop: notice and SIGTERM, then SIGKILL of each
/// session's tree after the grace period, then of everything inside.
fn escalate_stop(d: &Domain, live: &mut Live, mut stop: StopRequest) -> StopRequest {
    if !stop.term_sent {
        stop.term_sent = true;
        for (id, s) in live.sessions.iter() {
            if !live.notified.contains(id) {
                s.link.send(&CoordinatorMessage::Notice { text: stop.notice.clone() });
            }
            d.signal_session(id, &s.pid_file, libc::SIGTERM);
        }
        live.notified.extend(live.sessions.keys().cloned());
    } else if !stop.kill_sent && stop.at.elapsed() >= stop.grace {
        stop.kill_sent = true;
        for (id, s) in live.sessions.iter() {
            d.kill_session_tree(id, &s.pid_file);
        }
    } else if stop.kill_sent && stop.at.elapsed() >= stop.grace * 2 && !live.sessions.is_empty() {
        // Agents that survived SIGKILL by PID: end everything inside.
        let _ = d.runsc.kill(&d.container, libc::SIGKILL, true);
    }
    stop
}
