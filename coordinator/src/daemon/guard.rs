//! The Workspace Guard of a running Domain (issue 13): the engine
//! (`lazaret_mounts::guard`) started with the sandbox, and what the
//! coordinator does with what it reports.
//!
//! - **Start** ([`DomainGuard::start`]): after start-up (the sandbox is
//!   created and started, its init only reaps) and before the first session
//!   is served. The predicate that tells the sandbox's writes from everyone
//!   else's is [`SandboxProcesses`]: the processes in the container's
//!   cgroup. Starting takes a millisecond or two. There is no sweep at a
//!   normal start: the previous run ended with its final sweep, and since
//!   then only the host wrote (the crash case is below).
//! - **Report** (the reporter thread): each neutralisation is journalled
//!   ([`Event::NeutraliseSandboxWrite`], an observation of the model) and
//!   shown as one line on every session's terminal
//!   ([`CoordinatorMessage::Notice`], which the client prints on its stderr
//!   on a line of its own), at most [`NOTICE_BURST`] per second, then one
//!   line saying how many more `lazaret audit` lists. Opens the gate
//!   refused have a budget of their own (the gate already reports a path at
//!   most once a second), so a flood of neutralisations cannot hide them;
//!   the ones over it are counted, and all are in `coordinator.log`.
//!   Ownership given back
//!   to the developer is routine, not a neutralisation of anything the
//!   agent planted: it is counted in the log, not journalled file by file.
//! - **Sweeps**: at the end of each session
//!   ([`GuardLink::sweep`]), after an event-queue overflow (the engine
//!   sweeps itself), and at Domain stop ([`DomainGuard::finish`]: the
//!   sandbox's processes are killed first, so nothing writes after the
//!   final sweep; then the start-up stack unwinds and the lock is released).
//! - **Crash recovery** ([`recover_crashed_run`], the sweep at a guard's
//!   restart): a marker in the Domain Root says a guard ran and its final
//!   sweep has not happened. The next start sweeps before anything else,
//!   with the crashed run's protected
//!   paths and start time, because Git Sentry would otherwise adopt a
//!   repository the agent made in that run as the developer's own.
//!
//! Test hook, for the benchmark and the tests that show an attack works
//! without the guard: with `LAZARET_TEST_HOOKS=1` and
//! `LAZARET_TEST_GUARD=off` in the launcher's environment the Domain runs
//! without the guard, and says so in its log and on the launcher's
//! terminal. Nothing inside the sandbox can set these.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lazaret_mounts::guard::{self, Action, Backend, Guard, GuardConfig, GuardEvent, Neutralisation, PidFilter, SweepReport};
use lazaret_protocol::journal::Event;
use lazaret_protocol::wire::CoordinatorMessage;

use crate::context::Context;
use crate::workspace_guard::GuardedPaths;

use super::domain::Domain;
use super::log;

/// The test hook's variable (with `LAZARET_TEST_HOOKS=1`): `off` runs the
/// Domain without the Workspace Guard. Benchmarks only.
pub const GUARD_HOOK: &str = "LAZARET_TEST_GUARD";
/// Most neutralisation lines a session terminal gets in one second; the
/// rest are counted and summarised.
pub const NOTICE_BURST: usize = 8;
/// How many ownership changes of a run the log names one by one (the rest
/// are counted).
const OWNERSHIP_LOG_LINES: usize = 10;
/// The crash-recovery marker in the Domain Root.
const RUN_MARKER: &str = "guard-run.json";
/// How long [`DomainGuard::finish`] waits for the sandbox's processes to die.
const QUIESCE_WAIT: Duration = Duration::from_secs(2);

/// The test hook that turns the gate off (the guard then acts after the
/// fact only), so that a test can show the attack the gate stops.
const GATE_HOOK: &str = "LAZARET_TEST_GUARD_GATE";

/// The test hook that makes the guard's thread fail (panic) this many
/// milliseconds after the Domain is published, so that a test can show
/// that a failed guard stops the Domain.
const FAIL_HOOK: &str = "LAZARET_TEST_GUARD_FAIL_MS";

/// How long the sessions get after a guard failure to end by SIGTERM.
const FAILURE_GRACE: Duration = Duration::from_secs(2);

/// Whether the test hook turns the gate off for this coordinator.
pub fn gate_disabled_by_test_hook() -> bool {
    std::env::var("LAZARET_TEST_HOOKS").as_deref() == Ok("1") && std::env::var(GATE_HOOK).as_deref() == Ok("off")
}

/// An fd of `/` in the developer's mount namespace, opened before the
/// Domain's init entered a private one ([`keep_host_root`]): the gate
/// marks the developer's mounts through it.
static HOST_ROOT: std::sync::OnceLock<Arc<std::os::fd::OwnedFd>> = std::sync::OnceLock::new();

/// Keeps an fd of this process's `/` for the gate; call before leaving the
/// developer's mount namespace.
pub fn keep_host_root() -> std::io::Result<()> {
    let root = std::fs::File::open("/")?;
    let _ = HOST_ROOT.set(Arc::new(root.into()));
    Ok(())
}

/// The delay of the failure the test hook asks for, if any.
fn fail_hook() -> Option<u64> {
    if std::env::var("LAZARET_TEST_HOOKS").as_deref() != Ok("1") {
        return None;
    }
    std::env::var(FAIL_HOOK).ok()?.parse().ok()
}

/// Whether the test hook turns the guard off for this coordinator.
pub fn disabled_by_test_hook() -> bool {
    std::env::var("LAZARET_TEST_HOOKS").as_deref() == Ok("1") && std::env::var(GUARD_HOOK).as_deref() == Ok("off")
}

/// What the reporter thread is asked to do.
enum Report {
    /// Something the engine's thread reported.
    Event(GuardEvent),
    /// A full sweep, for this reason.
    Sweep(&'static str),
    /// The final sweep's result; the reporter ends after it.
    Final(Result<SweepReport, String>),
}

/// How a neutralisation was found, for its journal line.
#[derive(Clone, Copy)]
enum FoundBy {
    Event,
    Sweep,
}

impl FoundBy {
    fn as_str(self) -> &'static str {
        match self {
            FoundBy::Event => "event",
            FoundBy::Sweep => "sweep",
        }
    }
}

/// What sessions hold of the guard: a way to ask for a sweep.
#[derive(Default)]
pub(super) struct GuardLink {
    reports: Mutex<Option<Sender<Report>>>,
}

impl GuardLink {
    /// Asks the reporter thread for a full sweep (returns at once).
    pub fn sweep(&self, why: &'static str) {
        if let Some(tx) = self.reports.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(Report::Sweep(why));
        }
    }
}

/// The running guard of a Domain (or none, with the test hook).
pub(super) struct DomainGuard {
    config: GuardConfig,
    engine: Arc<Mutex<Option<Guard>>>,
    reports: Option<Sender<Report>>,
    pending: Option<Receiver<Report>>,
    reporter: Option<JoinHandle<()>>,
    marker: PathBuf,
    /// Neutralisations of a crashed run's leftovers, journalled first.
    recovered: Vec<Neutralisation>,
    /// The sandbox's host processes (none with the test hook).
    processes: Option<Arc<SandboxProcesses>>,
}

/// The crash-recovery marker's content.
#[derive(serde::Serialize, serde::Deserialize)]
struct RunMarker {
    /// When the run's guard started watching (ms since the epoch).
    started_ms: u64,
    /// Its protected paths and outside git directories (a marker of an
    /// older build has only `protected`).
    #[serde(flatten)]
    guarded: GuardedPaths,
}

fn marker_path(ctx: &Context) -> PathBuf {
    ctx.paths.domain_root(&ctx.domain_id).join(RUN_MARKER)
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// Before start-up: if the previous run's guard never did its final sweep
/// (the coordinator crashed), sweeps now, with that run's protected paths
/// and start time, before Git Sentry looks at the workspace. Returns what
/// it neutralised (journalled once the guard runs); failures are logged.
pub(super) fn recover_crashed_run(ctx: &Context) -> Vec<Neutralisation> {
    let marker = marker_path(ctx);
    let Ok(text) = std::fs::read(&marker) else { return Vec::new() };
    let Ok(run) = serde_json::from_slice::<RunMarker>(&text) else {
        log(&format!("workspace guard: {} is unreadable; sweeping everything changed in the last day", marker.display()));
        return sweep_crashed(ctx, &GuardedPaths::default(), SystemTime::now() - Duration::from_secs(86_400), &marker);
    };
    let since = UNIX_EPOCH + Duration::from_millis(run.started_ms);
    log("workspace guard: the previous run ended without its final sweep (crash); sweeping its changes before start-up");
    sweep_crashed(ctx, &run.guarded, since, &marker)
}

/// Before start-up, for another Domain on the same files whose run crashed
/// (`run`, from the shared git trust record: `crate::git_trust`): its
/// restart sweep, which its own next start would do, with its protected
/// paths, start time, quarantine and developer; Git Sentry would
/// otherwise protect what its agent left, unswept, as the developer's.
/// What it neutralised is logged here and listed by `lazaret audit` of
/// that Domain (its quarantine); its own journal is not written.
pub(super) fn sweep_other_crashed_run(run: &crate::git_trust::RunEntry, host_hooks_paths: &[String]) {
    let (Some(domain_root), Some((uid, gid)), Some(workspace)) = (&run.domain_root, run.developer, run.roots.first()) else { return };
    let marker = domain_root.join(RUN_MARKER);
    let Ok(text) = std::fs::read(&marker) else { return };
    let (guarded, since) = match serde_json::from_slice::<RunMarker>(&text) {
        Ok(m) => (m.guarded, UNIX_EPOCH + Duration::from_millis(m.started_ms)),
        Err(_) => (GuardedPaths::default(), SystemTime::now() - Duration::from_secs(86_400)),
    };
    let mut roots = vec![guard::GuardRoot {
        label: crate::workspace_guard::WORKSPACE_LABEL.into(),
        path: workspace.clone(),
        kind: guard::RootKind::Workspace,
    }];
    for dir in guarded.git_dirs.iter().filter(|d| d.is_dir()) {
        roots.push(guard::GuardRoot {
            label: format!("{}{}", crate::workspace_guard::GIT_DIR_LABEL_PREFIX, dir.display()),
            path: dir.clone(),
            kind: guard::RootKind::GitDir,
        });
    }
    for volume in run.roots.iter().skip(1) {
        roots.push(guard::GuardRoot {
            label: format!("{}{}", crate::workspace_guard::VOLUME_LABEL_PREFIX, volume.display()),
            path: volume.clone(),
            kind: guard::RootKind::Volume,
        });
    }
    let config = GuardConfig {
        roots,
        developer: guard::Owner { uid, gid },
        quarantine_dir: crate::layout::quarantine_dir(domain_root),
        protected: guarded.protected,
        developer_configs: guarded.gated_configs,
        changed_since: Some(since),
        host_hooks_paths: host_hooks_paths.to_vec(),
        ..GuardConfig::default()
    };
    log(&format!("workspace guard: the Domain {} on the same files crashed; sweeping its changes before start-up", run.domain));
    match guard::sweep(&config) {
        Ok(report) => {
            log_sweep(&format!("crash recovery of the Domain {}", run.domain), &report);
            for n in &report.neutralised {
                log(&n.summary());
            }
            let _ = std::fs::remove_file(&marker);
        }
        Err(e) => log(&format!("workspace guard: the crash-recovery sweep of the Domain {} failed: {e}", run.domain)),
    }
}

fn sweep_crashed(ctx: &Context, guarded: &GuardedPaths, since: SystemTime, marker: &Path) -> Vec<Neutralisation> {
    let config = crate::workspace_guard::guard_config(ctx, guarded, Some(since));
    match guard::sweep(&config) {
        Ok(report) => {
            log_sweep("crash recovery", &report);
            let _ = std::fs::remove_file(marker);
            report.neutralised
        }
        Err(e) => {
            log(&format!("workspace guard: the crash-recovery sweep failed: {e}"));
            Vec::new()
        }
    }
}

fn log_sweep(why: &str, report: &SweepReport) {
    let owners = report.neutralised.iter().filter(|n| matches!(n.action, Action::ChangedOwner { .. })).count();
    log(&format!(
        "workspace guard: sweep ({why}): {} entries in {:?}, {} neutralised, {owners} given back to the developer, {} errors",
        report.entries_seen,
        report.duration,
        report.neutralised.len() - owners,
        report.errors.len()
    ));
    for e in &report.errors {
        log(&format!("workspace guard: sweep ({why}): {e}"));
    }
}

impl DomainGuard {
    /// Starts the guard over `ctx`'s workspace, Ignored Workspace State and
    /// volumes, acting on the writes of the processes in the sandbox's
    /// cgroup (`cgroups_path`, whose sandbox process runsc wrote to
    /// `sandbox_pid_file`). `guarded` says what Git Sentry binds (read-only
    /// paths, outside git directories), `started` when this Domain's start
    /// began. Returns the guard and warnings for the launcher's terminal.
    pub fn start(
        ctx: &Context,
        cgroups_path: &str,
        sandbox_pid_file: &Path,
        guarded: GuardedPaths,
        started: SystemTime,
        recovered: Vec<Neutralisation>,
    ) -> Result<(DomainGuard, Vec<String>), guard::GuardError> {
        let mut warnings = Vec::new();
        let begun = Instant::now();
        let mut config = crate::workspace_guard::guard_config(ctx, &guarded, Some(started));
        if gate_disabled_by_test_hook() {
            log("workspace guard: gate OFF (test hook LAZARET_TEST_GUARD_GATE=off): host opens are not gated in this run");
            warnings.push(format!("the Workspace Guard's gate is OFF for this Domain (test hook {GATE_HOOK}=off)"));
        } else {
            let host_root = HOST_ROOT.get().cloned();
            if host_root.is_none() {
                log("workspace guard: no fd of the developer's / was kept; the gate marks this namespace's mounts");
            }
            // Escalated host commands run in this namespace: gated too.
            config.gate = Some(guard::GateConfig { host_root, this_namespace_too: true });
        }
        let marker = marker_path(ctx);
        let (tx, rx) = channel();
        let mut guard = DomainGuard {
            config: config.clone(),
            engine: Arc::new(Mutex::new(None)),
            reports: None,
            pending: None,
            reporter: None,
            marker,
            recovered,
            processes: None,
        };
        if disabled_by_test_hook() {
            log("workspace guard: OFF (test hook LAZARET_TEST_GUARD=off): nothing the sandbox writes is neutralised in this run");
            warnings.push(format!(
                "the Workspace Guard is OFF for this Domain (test hook {GUARD_HOOK}=off): nothing the agent writes is neutralised"
            ));
            return Ok((guard, warnings));
        }
        let processes = Arc::new(SandboxProcesses::new(cgroups_path, sandbox_pid_file));
        log(&format!("workspace guard: sandbox processes {:?} (cgroup {cgroups_path})", processes.known()));
        let filter: PidFilter = {
            let p = processes.clone();
            Arc::new(move |pid| p.accepts(pid))
        };
        let sink_tx = tx.clone();
        let engine = Guard::start(
            config,
            filter,
            Box::new(move |event| {
                let _ = sink_tx.send(Report::Event(event));
            }),
        )?;
        for (root, backend) in guard.config.roots.iter().zip(engine.backends()) {
            match backend {
                Backend::Fanotify => log(&format!("workspace guard: watching {} ({})", root.label, root.path.display())),
                Backend::SweepOnly => {
                    log(&format!(
                        "workspace guard: {} ({}) cannot be watched by events: only sweeps protect it",
                        root.label,
                        root.path.display()
                    ));
                    warnings.push(format!(
                        "{} cannot be watched by the Workspace Guard; it is swept at the end of each session instead",
                        lazaret_protocol::display::escaped(&root.path)
                    ));
                }
            }
        }
        *guard.engine.lock().unwrap_or_else(|p| p.into_inner()) = Some(engine);
        guard.processes = Some(processes);
        let run = RunMarker { started_ms: epoch_ms(started), guarded };
        if let Err(e) = serde_json::to_vec(&run).map_err(std::io::Error::other).and_then(|b| std::fs::write(&guard.marker, b)) {
            log(&format!("workspace guard: cannot write {}: {e} (a crash would not be swept at the next start)", guard.marker.display()));
        }
        // `lazaret-bench guard` reads this line.
        log(&format!("workspace guard: started in {} us", begun.elapsed().as_micros()));
        guard.reports = Some(tx);
        guard.pending = Some(rx);
        Ok((guard, warnings))
    }

    /// The link sessions keep (asks for sweeps).
    pub fn link(&self) -> GuardLink {
        GuardLink { reports: Mutex::new(self.reports.clone()) }
    }

    /// Starts the reporter thread for the running Domain `d` (journal,
    /// terminals); what happened before it ran waits in its queue.
    pub fn attach(&mut self, d: &Arc<Domain>) {
        let Some(rx) = self.pending.take() else { return };
        let (d, engine) = (d.clone(), self.engine.clone());
        let recovered = std::mem::take(&mut self.recovered);
        if let Some(ms) = fail_hook() {
            let engine = self.engine.clone();
            log(&format!("workspace guard: test hook {FAIL_HOOK}: the guard fails in {ms} ms"));
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(ms));
                if let Some(g) = engine.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    let _ = g.fail_for_test();
                }
            });
        }
        self.reporter = Some(std::thread::spawn(move || {
            let mut reporter = Reporter::new(&d);
            for n in recovered {
                reporter.neutralised(&d, n, FoundBy::Sweep);
            }
            reporter.run(&d, &engine, rx);
        }));
    }

    /// Domain stop, before the start-up stack unwinds: kills the sandbox
    /// (nothing may write after the final sweep), stops the
    /// engine (its final sweep), lets the reporter journal the rest, and
    /// removes the crash marker.
    pub fn finish(mut self) {
        let engine = self.engine.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(engine) = engine else { return };
        let t = Instant::now();
        if let Some(p) = &self.processes {
            quiesce_sandbox(p);
        }
        let quiesced = t.elapsed();
        let last = engine.stop().map_err(|e| e.to_string());
        log(&format!("workspace guard: stopped (sandbox quiesced in {quiesced:?}, final sweep done {:?} after)", t.elapsed() - quiesced));
        let complete = last.as_ref().is_ok_and(|r| r.errors.is_empty());
        if let Some(tx) = self.reports.take() {
            let _ = tx.send(Report::Final(last));
        }
        // Sessions' links hold senders too: the Final report ends the reporter.
        if let Some(r) = self.reporter.take() {
            let _ = r.join();
        }
        if complete {
            let _ = std::fs::remove_file(&self.marker);
        }
    }
}

/// SIGKILLs the sandbox's host processes (the sandbox process, which runs
/// every process inside and makes their file operations, its gofer and
/// platform stubs) and waits (up to [`QUIESCE_WAIT`]) until each is dead:
/// nothing writes after that. Much faster than asking runsc to kill every
/// process inside (a few milliseconds against a few hundred); teardown's
/// `runsc delete --force` removes the dead sandbox's state. The pids are
/// children of this PID namespace's init, which reaps them.
fn quiesce_sandbox(processes: &SandboxProcesses) {
    // Only pids that are in the container's cgroup now: a known pid that
    // exited may since belong to another process of this PID namespace
    // (a host command, say), which must not get the SIGKILL.
    let pids: Vec<u32> = processes.known().into_iter().filter(|&pid| processes.in_container_cgroup(pid)).collect();
    for &pid in &pids {
        if let Ok(p) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
        }
    }
    let deadline = Instant::now() + QUIESCE_WAIT;
    while pids.iter().any(|&p| alive(p)) {
        if Instant::now() >= deadline {
            log("workspace guard: the sandbox's processes outlived SIGKILL; sweeping anyway");
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether `pid` runs (exists and is not a zombie).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|state| !matches!(state, "Z" | "X")),
        Err(_) => false,
    }
}

/// The reporter thread's state: notice rate limiting and the ownership count.
struct Reporter {
    window: Instant,
    neutralised: Burst,
    refused: Burst,
    owners: usize,
    profile: String,
}

/// One kind of notice line in the current second: shown, and held back.
#[derive(Default)]
struct Burst {
    shown: usize,
    suppressed: usize,
}

/// Which [`Burst`] a notice counts against.
#[derive(Clone, Copy)]
enum NoticeKind {
    Neutralised,
    Refused,
}

impl Reporter {
    fn new(d: &Domain) -> Reporter {
        Reporter {
            window: Instant::now(),
            neutralised: Burst::default(),
            refused: Burst::default(),
            owners: 0,
            profile: d.ctx.profile.name.clone(),
        }
    }

    fn run(&mut self, d: &Domain, engine: &Mutex<Option<Guard>>, rx: Receiver<Report>) {
        loop {
            // Wake up now and then to flush the count of suppressed lines.
            let report = match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(r) => r,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    self.flush_suppressed(d);
                    continue;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            };
            match report {
                Report::Event(GuardEvent::Neutralised(n)) => self.neutralised(d, n, FoundBy::Event),
                Report::Event(GuardEvent::Overflow { sweep_time }) => {
                    log(&format!("workspace guard: the event queue overflowed; swept everything in {sweep_time:?}"))
                }
                Report::Event(GuardEvent::Error(e)) => log(&format!("workspace guard: {e}")),
                Report::Event(GuardEvent::Refused(r)) => self.refused(d, &r),
                Report::Event(GuardEvent::Failed(why)) => failed(d, &why),
                Report::Sweep(why) => {
                    // By the guard's own thread, after the events already
                    // queued (so both never act on one file), with what it
                    // knows of its seals and the developer's writes.
                    let swept = match engine.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                        Some(g) => g.sweep_now(),
                        None => continue,
                    };
                    match swept {
                        Ok(r) => self.swept(d, why, r),
                        Err(e) => log(&format!("workspace guard: sweep ({why}) failed: {e}")),
                    }
                }
                Report::Final(r) => {
                    match r {
                        Ok(r) => self.swept(d, "Domain stop", r),
                        Err(e) => log(&format!("workspace guard: the final sweep failed: {e}")),
                    }
                    break;
                }
            }
        }
        self.flush_suppressed(d);
        if self.owners > 0 {
            log(&format!("workspace guard: gave {} file(s) the sandbox made back to the developer in this run", self.owners));
        }
    }

    fn swept(&mut self, d: &Domain, why: &str, report: SweepReport) {
        log_sweep(why, &report);
        for n in report.neutralised {
            self.neutralised(d, n, FoundBy::Sweep);
        }
        self.flush_suppressed(d);
    }

    /// Journals `n` and shows it on every session's terminal (ownership
    /// fixes are only counted).
    fn neutralised(&mut self, d: &Domain, n: Neutralisation, found_by: FoundBy) {
        if let Action::ChangedOwner { old_uid, old_gid } = n.action {
            self.owners += 1;
            if self.owners <= OWNERSHIP_LOG_LINES {
                log(&format!(
                    "workspace guard: {}:{} was {old_uid}:{old_gid}, now the developer's ({})",
                    n.root,
                    lazaret_protocol::display::escaped(&n.path),
                    found_by.as_str()
                ));
            }
            return;
        }
        let summary = n.summary();
        log(&format!("{summary} ({})", found_by.as_str()));
        let links: Vec<_> = {
            let mut live = d.live();
            if let Err(e) = live.journal.record(journal_event(&n, &summary, found_by)) {
                log(&format!("workspace guard: journalling a neutralisation: {e}"));
            }
            live.sessions.values().map(|s| s.link.clone()).collect()
        };
        self.notice(&links, summary, NoticeKind::Neutralised);
    }

    /// A host open the gate refused: the log and the terminals (the gate
    /// reports a path at most once a second).
    fn refused(&mut self, d: &Domain, r: &guard::Refusal) {
        let summary = r.summary();
        log(&summary);
        let links: Vec<_> = d.live().sessions.values().map(|s| s.link.clone()).collect();
        self.notice(&links, summary, NoticeKind::Refused);
    }

    /// Shows a line on the terminals, at most [`NOTICE_BURST`] a second of
    /// each kind.
    fn notice(&mut self, links: &[Arc<super::escalation::SessionLink>], summary: String, kind: NoticeKind) {
        if self.window.elapsed() >= Duration::from_secs(1) {
            self.flush_suppressed_to(links);
            self.window = Instant::now();
            self.neutralised.shown = 0;
            self.refused.shown = 0;
        }
        let burst = match kind {
            NoticeKind::Neutralised => &mut self.neutralised,
            NoticeKind::Refused => &mut self.refused,
        };
        if burst.shown < NOTICE_BURST {
            burst.shown += 1;
            for l in links {
                l.send(&CoordinatorMessage::Notice { text: summary.clone() });
            }
        } else {
            burst.suppressed += 1;
        }
    }

    fn flush_suppressed(&mut self, d: &Domain) {
        if self.neutralised.suppressed + self.refused.suppressed == 0 {
            return;
        }
        let links: Vec<_> = d.live().sessions.values().map(|s| s.link.clone()).collect();
        self.flush_suppressed_to(&links);
    }

    fn flush_suppressed_to(&mut self, links: &[Arc<super::escalation::SessionLink>]) {
        let neutralised = std::mem::take(&mut self.neutralised.suppressed);
        let refused = std::mem::take(&mut self.refused.suppressed);
        let mut lines = Vec::new();
        if neutralised > 0 {
            lines.push(format!("workspace guard: and {neutralised} more neutralisation(s); `lazaret audit {}` lists them", self.profile));
        }
        if refused > 0 {
            lines.push(format!("workspace guard: and {refused} more refused open(s); the Domain's coordinator.log lists them"));
        }
        for text in lines {
            for l in links {
                l.send(&CoordinatorMessage::Notice { text: text.clone() });
            }
        }
    }
}

/// The guard's thread failed: nothing the sandbox writes is judged any
/// more, so the Domain stops (its sessions are told, then get SIGTERM;
/// the final sweep judges what the failed guard did not). Until then the
/// gate refuses host opens of what may be the agent's.
fn failed(d: &Domain, why: &str) {
    let notice = format!(
        "workspace guard: failed ({why}); the Domain stops so that nothing the agent writes goes unjudged (coordinator.log has the details)"
    );
    log(&notice);
    let mut live = d.live();
    if live.stop.is_none() && live.phase == super::domain::Phase::Ready {
        live.stop = Some(super::domain::StopRequest::because(FAILURE_GRACE, notice));
        d.changed.notify_all();
    }
}

/// The journal observation of `n`.
fn journal_event(n: &Neutralisation, summary: &str, found_by: FoundBy) -> Event {
    Event::NeutraliseSandboxWrite {
        root: n.root.clone(),
        path: n.path.to_string_lossy().into_owned(),
        kind: action_kind(&n.action).into(),
        summary: summary.to_string(),
        reason: n.reason.clone(),
        quarantine_id: n.quarantine_id.clone(),
        found_by: found_by.as_str().into(),
    }
}

/// The action's kind, as its serde tag spells it.
fn action_kind(a: &Action) -> &'static str {
    match a {
        Action::ClearedPrivilegeBits { .. } => "cleared_privilege_bits",
        Action::RemovedFileCapabilities => "removed_file_capabilities",
        Action::ChangedOwner { .. } => "changed_owner",
        Action::FilteredGitConfig { .. } => "filtered_git_config",
        Action::RestoredDeveloperConfig => "restored_developer_config",
        Action::Quarantined => "quarantined",
        Action::DisabledRebaseExec { .. } => "disabled_rebase_exec",
    }
}

/// Which pids are the sandbox's: the processes runsc put in the
/// container's cgroup (the sandbox process, which does the host file
/// operations itself with directfs, and the gofer), read when the guard
/// starts; a pid not seen then is looked up in `/proc/PID/cgroup` (this
/// PID namespace's /proc: the coordinator's own). Events of processes
/// outside the Domain's PID namespace (the developer's) carry pid 0 and
/// are never the sandbox's; nor are the coordinator's own writes.
pub(super) struct SandboxProcesses {
    /// `/lazaret/<domain>/<container>`: the suffix of the sandbox's line in
    /// `/proc/PID/cgroup` (seen from the coordinator's cgroup namespace the
    /// path may start with `/..`).
    cgroup: String,
    own: u32,
    known: RwLock<KnownPids>,
}

/// Pids found to be the sandbox's. The sandbox's processes come and go
/// (gVisor starts platform stubs and helpers) over a long Domain life, so
/// once the set reaches [`KnownPids::PRUNE_AT`] entries an insertion first
/// drops the pids that have exited; should most be alive, the next prune
/// waits until the set has doubled, so pruning stays amortised O(1).
struct KnownPids {
    pids: HashSet<u32>,
    prune_at: usize,
}

impl KnownPids {
    const PRUNE_AT: usize = 1024;

    fn new(pids: HashSet<u32>) -> KnownPids {
        KnownPids { pids, prune_at: Self::PRUNE_AT }
    }

    /// Adds `pid`, first pruning the pids `alive` says have exited if the
    /// set is at its limit. Only exited pids go: a live one may still be
    /// the sandbox's even when its cgroup cannot be read now.
    fn insert(&mut self, pid: u32, alive: impl Fn(u32) -> bool) {
        if self.pids.len() >= self.prune_at {
            self.pids.retain(|&p| alive(p));
            self.prune_at = (self.pids.len() * 2).max(Self::PRUNE_AT);
        }
        self.pids.insert(pid);
    }
}

impl SandboxProcesses {
    fn new(cgroups_path: &str, sandbox_pid_file: &Path) -> SandboxProcesses {
        let mut known: HashSet<u32> = cgroup_members(cgroups_path).into_iter().collect();
        if let Some(pid) = std::fs::read_to_string(sandbox_pid_file).ok().and_then(|t| t.trim().parse::<u32>().ok()) {
            known.insert(pid);
        }
        SandboxProcesses {
            cgroup: cgroups_path.trim_end_matches('/').to_string(),
            own: std::process::id(),
            known: RwLock::new(KnownPids::new(known)),
        }
    }

    /// Whether `pid` is in the container's cgroup now (false once it exited).
    fn in_container_cgroup(&self, pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|t| in_cgroup(&t, &self.cgroup))
    }

    fn known(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.known.read().unwrap_or_else(|p| p.into_inner()).pids.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// Whether `pid` (as fanotify reports it in this PID namespace) is one
    /// of the sandbox's processes.
    pub fn accepts(&self, pid: u32) -> bool {
        if pid == 0 || pid == 1 || pid == self.own {
            return false;
        }
        if self.known.read().unwrap_or_else(|p| p.into_inner()).pids.contains(&pid) {
            return true;
        }
        let member = self.in_container_cgroup(pid);
        if member {
            self.known.write().unwrap_or_else(|p| p.into_inner()).insert(pid, alive);
        }
        member
    }
}

/// Whether a `/proc/PID/cgroup` text puts the process in `cgroup` (or below
/// it) in any hierarchy.
fn in_cgroup(proc_cgroup: &str, cgroup: &str) -> bool {
    proc_cgroup.lines().filter_map(|l| l.splitn(3, ':').nth(2)).any(|path| {
        let path = path.trim_end_matches('/');
        path.ends_with(cgroup) || path.contains(&format!("{cgroup}/"))
    })
}

/// The pids in `cgroups_path` of any mounted hierarchy (v1 controllers and
/// the unified tree).
fn cgroup_members(cgroups_path: &str) -> Vec<u32> {
    let rel = cgroups_path.trim_start_matches('/');
    let mut pids = Vec::new();
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return pids };
    let mut dirs: Vec<PathBuf> = vec![Path::new("/sys/fs/cgroup").join(rel)];
    dirs.extend(hierarchies.flatten().map(|h| h.path().join(rel)));
    for dir in dirs {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_lines_match_the_container_wherever_the_namespace_root_is() {
        let cg = "/lazaret/d1/lzr-d1-ab";
        assert!(in_cgroup("12:pids:/lazaret/d1/lzr-d1-ab\n0::/user.slice\n", cg));
        assert!(in_cgroup("5:memory:/../../lazaret/d1/lzr-d1-ab\n", cg));
        assert!(in_cgroup("5:memory:/lazaret/d1/lzr-d1-ab/sub\n", cg));
        assert!(!in_cgroup("5:memory:/lazaret/d1/escalation-1\n0::/\n", cg));
        assert!(!in_cgroup("5:memory:/lazaret/d1/lzr-d1-abc\n", cg));
        assert!(!in_cgroup("", cg));
    }

    #[test]
    fn the_developer_the_coordinator_and_init_are_never_the_sandbox() {
        let p = SandboxProcesses {
            cgroup: "/lazaret/none/none".into(),
            own: std::process::id(),
            known: RwLock::new(KnownPids::new([4242].into())),
        };
        assert!(p.accepts(4242));
        assert!(!p.accepts(0), "pid 0: a process outside the Domain's PID namespace");
        assert!(!p.accepts(1));
        assert!(!p.accepts(std::process::id()));
        // This test process is in no such cgroup.
        assert!(!p.accepts(std::process::id() + 1_000_000));
    }

    #[test]
    fn known_pids_drop_the_exited_once_past_the_limit_and_keep_the_live() {
        // Even pids "alive", odd ones exited.
        let even_alive = |p: u32| p % 2 == 0;
        let mut known = KnownPids::new(HashSet::new());
        for pid in 0..KnownPids::PRUNE_AT as u32 {
            known.insert(pid, even_alive);
        }
        assert_eq!(known.pids.len(), KnownPids::PRUNE_AT, "nothing pruned below the limit");
        known.insert(5_000_001, even_alive);
        assert_eq!(known.pids.len(), KnownPids::PRUNE_AT / 2 + 1, "the exited went, the new one stayed");
        assert!(known.pids.iter().all(|&p| p % 2 == 0 || p == 5_000_001));
        // Over a long life with every pid exiting, the set stays bounded.
        for pid in 10_000_000..10_100_000 {
            known.insert(pid * 2 + 1, even_alive);
        }
        assert!(known.pids.len() <= KnownPids::PRUNE_AT, "{} pids kept", known.pids.len());
        // All alive: no prune on every insertion, the limit doubles instead.
        let mut live = KnownPids::new(HashSet::new());
        for pid in 0..3 * KnownPids::PRUNE_AT as u32 {
            live.insert(pid, |_| true);
        }
        assert_eq!(live.pids.len(), 3 * KnownPids::PRUNE_AT);
        assert_eq!(live.prune_at, 4 * KnownPids::PRUNE_AT);
        // The real liveness check: this process is alive, a pid past
        // pid_max is not.
        let mut real = KnownPids::new([std::process::id(), 4_194_305].into());
        real.prune_at = 2;
        real.insert(7, alive);
        assert!(real.pids.contains(&std::process::id()) && !real.pids.contains(&4_194_305));
    }

    #[test]
    fn journal_lines_carry_the_engines_action_kind() {
        let n = Neutralisation {
            root: "workspace".into(),
            path: "a/.git/hooks/x".into(),
            action: Action::Quarantined,
            reason: "hook".into(),
            quarantine_id: Some("q".into()),
            pid: Some(7),
        };
        let Event::NeutraliseSandboxWrite { kind, path, found_by, quarantine_id, .. } = journal_event(&n, "s", FoundBy::Event) else {
            panic!("wrong event")
        };
        assert_eq!(
            (kind.as_str(), path.as_str(), found_by.as_str(), quarantine_id.as_deref()),
            ("quarantined", "a/.git/hooks/x", "event", Some("q"))
        );
        // The kind is the engine's serde tag.
        for a in [
            Action::Quarantined,
            Action::RemovedFileCapabilities,
            Action::ChangedOwner { old_uid: 0, old_gid: 0 },
            Action::FilteredGitConfig { dropped_keys: vec![] },
            Action::ClearedPrivilegeBits { old_mode: 0o4755, new_mode: 0o755 },
            Action::DisabledRebaseExec { commands: vec![] },
        ] {
            let tag = serde_json::to_value(&a).expect("json")["kind"].as_str().map(String::from);
            assert_eq!(tag.as_deref(), Some(action_kind(&a)));
        }
    }
}
