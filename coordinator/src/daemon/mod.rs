//! The coordinator daemon of one Domain (`lazaret __coordinator`, started by
//! the first `lazaret run` of the Domain).
//!
//! Process tree, all detached from the developer's terminal (setsid):
//!
//! - the *outer* process (host PID namespace) takes the Domain lock, an
//!   flock in the host-private runtime directory, and holds it until it
//!   exits; a loser of the lock race exits with [`crate::EXIT_BUSY`];
//! - *PID 1* of a fresh PID and cgroup namespace (`lazaret_runtime::pidns`;
//!   it dies with the outer process) enters a private mount namespace with
//!   its own /proc, forks the real coordinator and then only reaps: every
//!   orphan (runsc's sandbox and gofer) is re-parented to it;
//! - *PID 2*, the coordinator proper ([`domain_main`]): multi-threaded; its
//!   own children (`runsc` commands, one `runsc exec` per session) are
//!   waited for normally.
//!
//! PID 2 runs the start-up [`stages`] (each journalled first, see
//! [`crate::journal`]) with the host's effects ([`host`]), serves sessions
//! until the last one leaves ([`domain`], [`session`]), then pops the
//! start-up stack.
//!
//! Test hook: with `LAZARET_TEST_HOOKS=1` and `LAZARET_TEST_CRASH_AT=POINT`
//! in the launcher's environment, the coordinator kills itself with SIGKILL
//! when it reaches POINT (one of [`crash_points`]), to test recovery. Only
//! the developer's own environment reaches these variables; nothing inside
//! the sandbox can set them.

mod domain;
mod error;
mod escalation;
mod guard;
mod health;
mod host;
pub mod provision;
mod report;
mod session;
pub mod stages;

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;

use lazaret_runtime::pidns;
use lazaret_runtime::signals::Signals;

use crate::context::Context;
use crate::journal::DomainJournal;
use crate::layout::DomainDir;
use crate::lock::{DomainLock, LockError};
use crate::{EXIT_BUSY, LAZARET_FAILED};

pub use error::StartError;
pub use report::config_differences;

use domain::Domain;
use host::{HostEffects, StderrRoute};
use stages::{Launch, Stage};

/// The crash point reached just before teardown.
const TEARDOWN: &str = "teardown";

/// Every point at which the test hook can crash the coordinator: after each
/// start-up stage, and before teardown.
pub fn crash_points() -> Vec<&'static str> {
    Stage::ALL.iter().map(|s| s.name()).chain([TEARDOWN]).collect()
}

/// What the launcher passes to `lazaret __coordinator`.
#[derive(Debug, Clone)]
pub struct CoordinatorArgs {
    /// `--config`, if the launcher had one.
    pub config: Option<PathBuf>,
    /// The profile the launcher selected.
    pub profile: String,
    /// The launcher's directory (`-C`).
    pub dir: PathBuf,
    /// The launcher's Session ID (it becomes the `AcquireDomainLock` session).
    pub session: String,
    /// `--reset-anchor`.
    pub reset_anchor: bool,
    /// `--no-setup` or `--reprovision`.
    pub setup: crate::startup::SetupMode,
    /// The Domain runtime directory the launcher computed (must match ours).
    pub domain_dir: PathBuf,
}

/// Entry point of `lazaret __coordinator`. stdout is the launcher's status
/// pipe (start-up messages and errors go there), stderr the Domain's log.
/// Returns the process's exit status.
pub fn coordinator_main(args: &CoordinatorArgs) -> i32 {
    // Detach from the launcher's terminal and session.
    let _ = nix::unistd::setsid();
    let mut status = match take_stdout() {
        Ok(f) => StatusPipe(Some(f)),
        Err(e) => {
            eprintln!("lazaret coordinator: {e}");
            return LAZARET_FAILED;
        }
    };
    let (ctx, dir, lock) = match prepare(args) {
        Ok(p) => p,
        Err(StartError::Lock(LockError::Busy { owner, .. })) => {
            eprintln!("lazaret coordinator {}: another coordinator (PID {owner}) owns the Domain; exiting", std::process::id());
            return EXIT_BUSY;
        }
        Err(e) => return status.fail(&e),
    };
    log(&format!(
        "coordinator {} owns Domain {} (profile {}, workspace {})",
        std::process::id(),
        ctx.domain_id,
        ctx.profile.name,
        ctx.workspace.root().display()
    ));
    let mut signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => return status.fail(&format!("blocking signals: {e}")),
    };
    // The status pipe goes to PID 1 of the new namespace; if that never
    // starts, the launcher still hears why.
    let mut status = Some(status);
    let code = match pidns::run_as_namespace_init(&mut signals, |signals| match status.take() {
        Some(status) => namespace_init(ctx, dir, args, status, signals),
        None => LAZARET_FAILED,
    }) {
        Ok(s) => s.0,
        Err(e) => match status.take() {
            Some(mut status) => status.fail(&e),
            None => {
                eprintln!("lazaret coordinator: {e}");
                LAZARET_FAILED
            }
        },
    };
    log(&format!("coordinator exits with {code}"));
    drop(lock);
    code
}

/// Resolves the Domain, checks it is the launcher's, and takes its lock.
fn prepare(args: &CoordinatorArgs) -> Result<(Context, DomainDir, DomainLock), StartError> {
    crate::context::require_root()?;
    let ctx = Context::resolve(args.config.as_deref(), Some(&args.profile), &args.dir)?;
    let dir = DomainDir::new(ctx.domain_runtime_dir()?);
    if dir.path() != args.domain_dir {
        return Err(StartError::DomainDirMismatch { launcher: args.domain_dir.clone(), ours: dir.path().to_path_buf() });
    }
    let lock = DomainLock::acquire(&dir.lock(), ctx.domain_id.as_str())?;
    Ok((ctx, dir, lock))
}

/// Moves stdout (the status pipe) to a close-on-exec descriptor and points
/// stdout at stderr (the log), so that no child process ever holds the
/// launcher's pipe.
fn take_stdout() -> std::io::Result<File> {
    let stdout = std::io::stdout();
    let dup = stdout.as_fd().try_clone_to_owned()?;
    nix::unistd::dup2_stdout(std::io::stderr().as_fd()).map_err(std::io::Error::from)?;
    Ok(File::from(dup))
}

/// The launcher's pipe: start-up messages and the final error.
struct StatusPipe(Option<File>);

impl StatusPipe {
    fn say(&mut self, line: &str) {
        if let Some(f) = self.0.as_mut() {
            // The launcher may be gone: ignore EPIPE.
            let _ = writeln!(f, "{line}");
        }
    }

    /// Reports a failure to the launcher and the log; returns the exit
    /// status. Every line is marked as the error's, so that a hint or an
    /// undo failure on its own line stays with it.
    fn fail(&mut self, error: &dyn std::fmt::Display) -> i32 {
        for line in error.to_string().lines() {
            self.say(&format!("lazaret: error: {line}"));
        }
        log(&format!("failed: {error}"));
        LAZARET_FAILED
    }
}

/// A line in the Domain's log (the coordinator's stderr), timestamped.
fn log(line: &str) {
    eprintln!("[{}] {line}", crate::journal::now_ms());
}

/// Crashes here if the test hook asks for `point`.
fn crash_point(point: &str) {
    if std::env::var("LAZARET_TEST_HOOKS").as_deref() == Ok("1") && std::env::var("LAZARET_TEST_CRASH_AT").as_deref() == Ok(point) {
        log(&format!("test hook: crashing at {point}"));
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// PID 1 of the Domain's PID namespace: private mounts and /proc, fork the
/// coordinator, reap everything until it exits.
fn namespace_init(ctx: Context, dir: DomainDir, args: &CoordinatorArgs, mut status: StatusPipe, signals: &mut Signals) -> i32 {
    // The gate marks the developer's mounts, not this namespace's copies.
    if let Err(e) = guard::keep_host_root() {
        return status.fail(&format!("opening / for the Workspace Guard's gate: {e}"));
    }
    if let Err(e) = lazaret_mounts::enter_private_mount_namespace() {
        return status.fail(&e);
    }
    if let Err(e) = lazaret_mounts::mount_proc() {
        return status.fail(&format!("mounting /proc for the Domain's PID namespace: {e}"));
    }
    match pidns::fork_single_threaded() {
        Err(e) => status.fail(&format!("forking the coordinator: {e}")),
        Ok(nix::unistd::ForkResult::Child) => {
            let code = domain_main(ctx, dir, args, status, signals);
            let _ = std::io::stderr().flush();
            std::process::exit(code);
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(status);
            drop(ctx);
            reap_until(child, signals)
        }
    }
}

/// PID 1's loop: reap every child; pass termination signals to the
/// coordinator; return the coordinator's exit status when it exits.
fn reap_until(coordinator: nix::unistd::Pid, signals: &mut Signals) -> i32 {
    use nix::sys::signal::Signal;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    loop {
        loop {
            match waitpid(nix::unistd::Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(s) if s.pid() == Some(coordinator) => {
                    if let Some(code) = lazaret_runtime::ExitStatus::from_wait(s) {
                        return code.0;
                    }
                }
                Ok(_) => {}
            }
        }
        if let Some((sig, _)) = signals.wait_next() {
            if matches!(sig, Signal::SIGTERM | Signal::SIGHUP | Signal::SIGINT) {
                let _ = nix::sys::signal::kill(coordinator, sig);
            }
        }
    }
}

/// The escalation service: the server certificate for the listener's
/// address, and the cgroup (the sandbox's parent, `/lazaret/<domain>`, in
/// the unified hierarchy) under which each host command gets its own. Without it the Domain runs,
/// and `lazaret-escalate` reports Lazaret unavailable; the log says why.
fn escalation_service(
    ctx: &Context,
    trust: &crate::trust::TrustAnchor,
    network: &host::Network,
    cgroups_path: &str,
    protected: Vec<PathBuf>,
    git_trust: Result<crate::git_trust::WorkspaceTrust, String>,
) -> Option<escalation::Escalations> {
    let address = match network.escalation.local_addr() {
        Ok(a) => a,
        Err(e) => {
            log(&format!("escalation is unavailable: the listener has no address: {e}"));
            return None;
        }
    };
    let server = match trust.server_config(address.ip()) {
        Ok(s) => s,
        Err(e) => {
            log(&format!("escalation is unavailable: {e}"));
            return None;
        }
    };
    let unified = match lazaret_runtime::hostexec::cgroup2_mount() {
        Ok(u) => u,
        Err(e) => {
            log(&format!("escalation is unavailable: host commands need a cgroup of their own: {e}"));
            return None;
        }
    };
    let parent = std::path::Path::new(cgroups_path).parent().unwrap_or(std::path::Path::new("/lazaret"));
    let cgroup_parent = unified.join(parent.strip_prefix("/").unwrap_or(parent));
    log(&format!("escalation: listening on {address} for the profile {}", ctx.profile.name));
    Some(escalation::Escalations::new(address, server, cgroup_parent, protected, git_trust))
}

/// Registers this run in the workspace's git trust record
/// (`crate::git_trust`); a failure leaves escalation refusing every host
/// command ([`log_git_trust`] says so once the log is the Domain's).
fn begin_git_trust(ctx: &Context) -> Result<crate::git_trust::WorkspaceTrust, String> {
    // The crashed run's agent may have left hooks at this developer's own
    // relative core.hooksPath too.
    let hooks_paths = crate::workspace_guard::developer_hooks_paths(ctx);
    crate::git_trust::begin_run(ctx, |run| guard::sweep_other_crashed_run(run, &hooks_paths)).map_err(|e| e.to_string())
}

/// The coordinator's log lines for what [`begin_git_trust`] found.
fn log_git_trust(trust: &Result<crate::git_trust::WorkspaceTrust, String>) {
    match trust {
        Ok(trust) => {
            for entry in &trust.untrusted {
                log(&format!(
                    "git trust: {} was made by an agent (in an earlier run, or in another profile's Domain on this workspace): host commands do not run in it",
                    lazaret_protocol::display::escaped(entry)
                ));
            }
        }
        Err(e) => log(&format!("git trust: {e}: no host command will run in this Domain")),
    }
}

/// Records this run's end in the workspace's git trust record; a failure
/// is logged (the registration stays, as after a crash: what it covers
/// stays untrusted).
fn end_git_trust(ctx: &Context) {
    match crate::git_trust::end_run(ctx) {
        Ok(made) => {
            for entry in made {
                log(&format!(
                    "git trust: {} appeared during this run: recorded as the agent's",
                    lazaret_protocol::display::escaped(&entry)
                ));
            }
        }
        Err(e) => log(&format!("git trust: recording the run's end: {e}")),
    }
}

/// Opens the Domain's journal for this run and computes the fingerprint the
/// Domain starts with.
fn open_journal(ctx: &Context) -> Result<(DomainJournal, String), StartError> {
    ctx.paths.ensure_storage().map_err(crate::context::ContextError::from)?;
    let domain_root = ctx.paths.ensure_domain_root(&ctx.domain_id).map_err(crate::context::ContextError::from)?;
    let (journal, notes) = DomainJournal::open_for_run(&domain_root, ctx.domain_id.as_str())?;
    for n in notes {
        log(&n);
    }
    let fingerprint = ctx.config.fingerprint(&ctx.profile.name).map_err(crate::context::ContextError::from)?.to_string();
    Ok((journal, fingerprint))
}

/// PID 2: the coordinator proper. Start-up messages (warnings, recovery
/// notes) go to the launcher until the sandbox is created. Returns the
/// exit status.
fn domain_main(ctx: Context, dir: DomainDir, args: &CoordinatorArgs, mut status: StatusPipe, signals: &mut Signals) -> i32 {
    let begun = std::time::SystemTime::now();
    let stderr = StderrRoute::to_launcher(status.0.as_ref());
    let opened = open_journal(&ctx).and_then(|(journal, fingerprint)| {
        let id = crate::random::hex(4).map_err(StartError::io("reading randomness for the container ID"))?;
        Ok((journal, fingerprint, format!("lzr-{}-{id}", ctx.domain_id.short())))
    });
    let (mut journal, fingerprint, container) = match opened {
        Ok(v) => v,
        Err(e) => {
            drop(stderr);
            return status.fail(&e);
        }
    };
    // A crashed run's leftovers, before Git Sentry looks at the workspace.
    let recovered = guard::recover_crashed_run(&ctx);
    // The workspace's git trust state, shared by every Domain: this run is
    // registered with the git entries it finds, before its sandbox exists.
    let git_trust = begin_git_trust(&ctx);
    let ctx = Arc::new(ctx);
    let mut fx = HostEffects::new(ctx.clone(), dir.clone(), args.reset_anchor, container, stderr);
    // Setup progress goes to the launcher (a close-on-exec duplicate of its
    // status pipe, dropped when setup is over).
    fx.set_setup(args.setup, status.0.as_ref().and_then(|f| f.try_clone().ok()));
    let launch = Launch { session: args.session.clone(), fingerprint: fingerprint.clone() };
    let started = match stages::start_up(&mut fx, &mut journal, &launch) {
        Ok(s) => s,
        Err(failed) => {
            fx.stderr_to_log();
            log(&format!("start-up failed at stage {}", failed.stage));
            end_git_trust(&ctx);
            return status.fail(&failed);
        }
    };
    fx.stderr_to_log();
    log_git_trust(&git_trust);
    // The Workspace Guard, before any session runs: without it the Domain
    // does not run.
    let mut workspace_guard = match guard::DomainGuard::start(
        &ctx,
        &started.sandbox.cgroups_path,
        &started.run_dir.sandbox_pid(),
        fx.guarded_paths(),
        begun,
        recovered,
    ) {
        Ok((g, warnings)) => {
            for w in warnings {
                status.say(&format!("lazaret: warning: {w}"));
            }
            g
        }
        Err(e) => {
            let e = format!("starting the Workspace Guard: {e}");
            if let Err(j) = journal.record(lazaret_protocol::journal::Event::FailDomain { reason: e.clone() }) {
                log(&format!("{j}"));
            }
            let stages::Started { stack, image, run_dir, trust, network, sandbox, listener } = started;
            drop((image, run_dir, trust, network, sandbox, listener));
            for failure in stack.unwind(&mut fx, &mut journal) {
                log(&format!("teardown: {failure}"));
            }
            end_git_trust(&ctx);
            return status.fail(&e);
        }
    };
    log(&format!("published {} (sandbox {})", dir.socket().display(), fx.container()));
    drop(status);

    let stages::Started { stack, image, run_dir, trust, network, sandbox, listener } = started;
    // Git Sentry's workspace-relative read-only paths and the configs the
    // gate judges: host commands run only in repositories they protect.
    let guarded = fx.guarded_paths();
    let protected =
        guarded.protected.into_iter().filter(|p| p.is_relative()).chain(guarded.gated_configs.into_iter().map(|c| c.path)).collect();
    let escalations = escalation_service(&ctx, &trust, &network, &sandbox.cgroups_path, protected, git_trust);
    let escalation_listener = escalations.as_ref().map(|_| network.escalation.clone());
    let guard_link = workspace_guard.link();
    let domain = Arc::new(Domain::new(
        ctx,
        dir,
        run_dir,
        image,
        sandbox,
        &network,
        trust,
        escalations,
        fingerprint,
        journal,
        args.session.clone(),
        guard_link,
    ));
    workspace_guard.attach(&domain);
    // Live host addresses; stopped (thread joined, its Weak gone) before teardown.
    let host_watch =
        crate::network::watch_host(&network.topology, log).map_err(|e| log(&format!("not following host address changes: {e}"))).ok();
    // The stack's handle must be the network's last one at teardown.
    drop(network);
    domain::serve(&domain, listener, escalation_listener, signals);
    drop(host_watch);
    // The final sweep, with nothing left running in the sandbox.
    workspace_guard.finish();

    crash_point(TEARDOWN);
    domain.tear_down(|journal| stack.unwind(&mut fx, journal));
    // With the sandbox gone, what it made is recorded for every Domain on
    // its roots.
    end_git_trust(&domain.ctx);
    log("Domain down");
    0
}
