//! The coordinator daemon of one Domain (`lazaret __coordinator`, started by
//! the first `lazaret run` of the Domain).
//!
//! Process tree, all detached from the developer's terminal (setsid):
//!
//! - the *outer* process (host PID namespace) takes the Domain lock, an
//!   flock in the host-private runtime directory, and holds it until it
//!   exits; a loser of the lock race exits with [`EXIT_BUSY`];
//! - *PID 1* of a fresh PID and cgroup namespace (`lazaret_runtime::pidns`;
//!   it dies with the outer process) enters a private mount namespace with
//!   its own /proc, forks the real coordinator and then only reaps: every
//!   orphan (runsc's sandbox and gofer) is re-parented to it;
//! - *PID 2*, the coordinator proper ([`domain_main`]): multi-threaded; its
//!   own children (`runsc` commands, one `runsc exec` per session) are
//!   waited for normally.
//!
//! PID 2 drives the protocol model before every real step (see
//! [`crate::journal`]): lock, State Anchor, Trust Anchor, sidecar, sandbox,
//! then publishes `coordinator.sock`. Each session is a `runsc exec` of the
//! agent in the shared sandbox with its own PTY (or the client's own stdio).
//! When the last session leaves, everything transient goes down in reverse
//! order and the process tree exits, which releases the lock.
//!
//! Test hook: with `LAZARET_TEST_HOOKS=1` and `LAZARET_TEST_CRASH_AT=STAGE`
//! in the launcher's environment, the coordinator kills itself with SIGKILL
//! when it reaches STAGE (one of [`CRASH_STAGES`]), to test recovery. Only
//! the developer's own environment reaches these variables; nothing inside
//! the sandbox can set them.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lazaret_oci::bundle::{BindMount, BundleSpec};
use lazaret_oci::ImageRecord;
use lazaret_protocol::journal::Event;
use lazaret_protocol::wire::{self, ClientMessage, CoordinatorMessage, DomainStatus, FrameError, RateLimit, WIRE_VERSION};
use lazaret_runtime::signals::Signals;
use lazaret_runtime::terminal::{set_window_size, WindowSize};
use lazaret_runtime::{pidns, NetworkMode, Runsc, RunscOptions};

use crate::context::Context;
use crate::journal::DomainJournal;
use crate::launch::{random_hex, sys, LaunchError, LAZARET_FAILED};
use crate::lock::{DomainLock, LockError};
use crate::trust::TrustAnchor;
use crate::{cgroup, filesystem, network};

/// Exit status of a coordinator that lost the lock race (another one owns
/// the Domain): the launcher simply connects to that one.
pub const EXIT_BUSY: i32 = 3;
/// The socket a Domain's coordinator publishes in its runtime directory.
pub const SOCKET_NAME: &str = "coordinator.sock";
/// The log a coordinator writes (its stderr) in its runtime directory.
pub const LOG_NAME: &str = "coordinator.log";
/// The Domain CA certificate in the runtime directory.
pub const CA_NAME: &str = "ca.pem";
/// Start-up and teardown stages at which the test hook can crash the
/// coordinator.
pub const CRASH_STAGES: [&str; 8] = ["lock", "state-anchor", "trust-anchor", "sidecar", "sandbox-created", "sandbox", "published", "teardown"];

/// How long a published Domain waits for its first session.
const FIRST_SESSION_WAIT: Duration = Duration::from_secs(30);
/// Most connections served at once.
const MAX_CONNECTIONS: usize = 128;
/// How long a client may take to send its first frame.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The Domain runtime directory the launcher computed (must match ours).
    pub domain_dir: PathBuf,
}

/// Entry point of `lazaret __coordinator`. stdout is the launcher's status
/// pipe (start-up messages and errors go there), stderr the Domain's log.
/// Returns the process's exit status.
pub fn coordinator_main(args: &CoordinatorArgs) -> i32 {
    // Detach from the launcher's terminal and session.
    let _ = nix::unistd::setsid();
    let status_pipe = match take_stdout() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("lazaret coordinator: {e}");
            return LAZARET_FAILED;
        }
    };
    let mut status = StatusPipe(Some(status_pipe));
    let prepared = (|| -> Result<(Context, DomainLock), LaunchError> {
        crate::context::require_root()?;
        let ctx = Context::resolve(args.config.as_deref(), Some(&args.profile), &args.dir)?;
        let domain_dir = ctx.domain_runtime_dir()?;
        if domain_dir != args.domain_dir {
            return Err(LaunchError::Sys {
                context: format!("the launcher's Domain directory {} is not {}", args.domain_dir.display(), domain_dir.display()),
                source: std::io::Error::other("refusing to start"),
            });
        }
        let lock = DomainLock::acquire(&domain_dir.join("lock"), ctx.domain_id.as_str())?;
        Ok((ctx, lock))
    })();
    let (ctx, lock) = match prepared {
        Ok(p) => p,
        Err(LaunchError::Lock(LockError::Busy { owner, .. })) => {
            eprintln!("lazaret coordinator {}: another coordinator (PID {owner}) owns the Domain; exiting", std::process::id());
            return EXIT_BUSY;
        }
        Err(e) => {
            status.say(&format!("lazaret: error: {e}"));
            eprintln!("lazaret coordinator: {e}");
            return LAZARET_FAILED;
        }
    };
    log(&format!("coordinator {} owns Domain {} (profile {}, workspace {})", std::process::id(), ctx.domain_id, ctx.profile.name, ctx.workspace.root().display()));
    let mut signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => {
            status.say(&format!("lazaret: error: blocking signals: {e}"));
            return LAZARET_FAILED;
        }
    };
    let code = match pidns::run_as_namespace_init(&mut signals, |signals| namespace_init(ctx, args, status, signals)) {
        Ok(s) => s.0,
        Err(e) => {
            eprintln!("lazaret coordinator: {e}");
            LAZARET_FAILED
        }
    };
    log(&format!("coordinator exits with {code}"));
    drop(lock);
    code
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
}

fn log(line: &str) {
    eprintln!("[{}] {line}", crate::journal::now_ms());
}

/// PID 1 of the Domain's PID namespace: private mounts and /proc, fork the
/// coordinator, reap everything until it exits.
fn namespace_init(ctx: Context, args: &CoordinatorArgs, status: StatusPipe, signals: &mut Signals) -> i32 {
    if let Err(e) = lazaret_mounts::enter_private_mount_namespace() {
        let mut status = status;
        status.say(&format!("lazaret: error: {e}"));
        return LAZARET_FAILED;
    }
    use nix::mount::{mount, MsFlags};
    if let Err(e) = mount(Some("proc"), "/proc", Some("proc"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None::<&str>) {
        let mut status = status;
        status.say(&format!("lazaret: error: mounting /proc for the Domain's PID namespace: {e}"));
        return LAZARET_FAILED;
    }
    match pidns::fork_single_threaded() {
        Err(e) => {
            let mut status = status;
            status.say(&format!("lazaret: error: forking the coordinator: {e}"));
            LAZARET_FAILED
        }
        Ok(nix::unistd::ForkResult::Child) => {
            let code = domain_main(ctx, args, status, signals);
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
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
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
            if matches!(sig, nix::sys::signal::Signal::SIGTERM | nix::sys::signal::Signal::SIGHUP | nix::sys::signal::Signal::SIGINT) {
                let _ = nix::sys::signal::kill(coordinator, sig);
            }
        }
    }
}

/// Crashes here if the test hook asks for `stage`.
fn crash_point(stage: &str) {
    if std::env::var("LAZARET_TEST_HOOKS").as_deref() == Ok("1") && std::env::var("LAZARET_TEST_CRASH_AT").as_deref() == Ok(stage) {
        log(&format!("test hook: crashing at stage {stage}"));
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// The Domain's transient resources, in start-up order; each is `Some` (or
/// true) once it exists.
#[derive(Default)]
struct Resources {
    run_dir: Option<PathBuf>,
    mounted: Vec<PathBuf>,
    anchor: bool,
    trust: Option<TrustAnchor>,
    network: Option<(lazaret_netpolicy::topology::DomainNetwork, PathBuf)>,
    container: Option<String>,
    cgroups_path: String,
    runsc: Option<Runsc>,
}

/// Everything session threads share.
struct Domain {
    ctx: Context,
    image: ImageRecord,
    runsc: Runsc,
    container: String,
    cgroups_path: String,
    run_dir: PathBuf,
    socket: PathBuf,
    fingerprint: String,
    config_json: String,
    started: Instant,
    sidecar: String,
    debug_paths: DebugPaths,
    live: Mutex<Live>,
    changed: Condvar,
    connections: AtomicUsize,
}

#[derive(Default)]
struct DebugPaths {
    sandbox_netns: Option<(PathBuf, u64)>,
    sidecar_netns: Option<(PathBuf, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Ready,
    Stopping,
    Down,
}

struct Live {
    journal: DomainJournal,
    phase: Phase,
    sessions: BTreeMap<String, SessionEntry>,
    launcher: String,
    launcher_connected: bool,
    ever_joined: bool,
    stop: Option<StopRequest>,
    listener_fd: Option<i32>,
}

struct SessionEntry {
    pid_file: PathBuf,
    notices: Option<UnixStream>,
}

#[derive(Clone, Copy)]
struct StopRequest {
    at: Instant,
    grace: Duration,
    term_sent: bool,
    kill_sent: bool,
}

fn lock_live(d: &Domain) -> MutexGuard<'_, Live> {
    // A panicking session thread must not take the Domain down with it.
    d.live.lock().unwrap_or_else(|p| p.into_inner())
}

/// PID 2: the coordinator proper. Returns the exit status.
fn domain_main(ctx: Context, args: &CoordinatorArgs, mut status: StatusPipe, signals: &mut Signals) -> i32 {
    // Start-up messages (warnings, recovery notes) go to the launcher.
    let log_fd = std::io::stderr().as_fd().try_clone_to_owned().ok();
    if let Some(f) = status.0.as_ref() {
        let _ = nix::unistd::dup2_stderr(f.as_fd());
    }
    let restore_log = |log_fd: &Option<OwnedFd>| {
        if let Some(l) = log_fd {
            let _ = nix::unistd::dup2_stderr(l.as_fd());
        }
    };
    let domain_id = ctx.domain_id.to_string();
    let domain_root = match ctx.paths.ensure_storage().and_then(|_| ctx.paths.ensure_domain_root(&ctx.domain_id)) {
        Ok(r) => r,
        Err(e) => {
            restore_log(&log_fd);
            status.say(&format!("lazaret: error: {e}"));
            return LAZARET_FAILED;
        }
    };
    let (mut journal, notes) = match DomainJournal::open_for_run(&domain_root, &domain_id) {
        Ok(j) => j,
        Err(e) => {
            restore_log(&log_fd);
            status.say(&format!("lazaret: error: {e}"));
            return LAZARET_FAILED;
        }
    };
    for n in notes {
        log(&n);
    }
    let fingerprint = match ctx.config.fingerprint(&ctx.profile.name) {
        Ok(f) => f.to_string(),
        Err(e) => {
            restore_log(&log_fd);
            status.say(&format!("lazaret: error: {e}"));
            return LAZARET_FAILED;
        }
    };
    if let Err(e) = journal.record(Event::AcquireDomainLock { session: args.session.clone(), fingerprint: fingerprint.clone() }) {
        restore_log(&log_fd);
        status.say(&format!("lazaret: error: {e}"));
        return LAZARET_FAILED;
    }
    crash_point("lock");
    let mut res = Resources::default();
    let started = start_up(&ctx, args, &mut journal, &mut res, &log_fd, &restore_log);
    let (image, runsc) = match started {
        Ok(v) => v,
        Err(e) => {
            restore_log(&log_fd);
            log(&format!("start-up failed: {e}"));
            let _ = journal.record(Event::FailDomain { reason: e.to_string() });
            teardown(&mut journal, &mut res, None);
            status.say(&format!("lazaret: error: {e}"));
            return LAZARET_FAILED;
        }
    };
    restore_log(&log_fd);
    let domain_dir = args.domain_dir.clone();
    let socket = domain_dir.join(SOCKET_NAME);
    let config_json = ctx.config.render_json().unwrap_or_default();
    let sidecar = res.network.as_ref().map(|(n, _)| n.sidecar_id().to_string()).unwrap_or_default();
    let debug_paths = DebugPaths {
        sandbox_netns: res.network.as_ref().and_then(|(n, _)| n.sandbox_netns().map(|ns| (ns.proc_path(), ns.inode().unwrap_or(0)))),
        sidecar_netns: res.network.as_ref().and_then(|(n, _)| n.sidecar_netns().map(|ns| (ns.proc_path(), ns.inode().unwrap_or(0)))),
    };
    let run_dir = res.run_dir.clone().unwrap_or_default();
    let container = res.container.clone().unwrap_or_default();

    // Publish: the model first, then the socket.
    let listener = match journal.record(Event::PublishDomain).map_err(|e| e.to_string()).and_then(|_| publish(&socket, ctx.developer.uid).map_err(|e| e.to_string())) {
        Ok(l) => l,
        Err(e) => {
            let _ = journal.record(Event::FailDomain { reason: e.clone() });
            teardown(&mut journal, &mut res, None);
            status.say(&format!("lazaret: error: publishing {}: {e}", socket.display()));
            return LAZARET_FAILED;
        }
    };
    crash_point("published");
    log(&format!("published {} (sandbox {container}, sidecar {sidecar})", socket.display()));
    drop(status);

    let live = Live {
        journal,
        phase: Phase::Ready,
        sessions: BTreeMap::new(),
        launcher: args.session.clone(),
        launcher_connected: false,
        ever_joined: false,
        stop: None,
        listener_fd: Some(listener.as_raw_fd()),
    };
    let domain = Arc::new(Domain {
        ctx,
        image,
        runsc,
        container,
        cgroups_path: res.cgroups_path.clone(),
        run_dir,
        socket,
        fingerprint,
        config_json,
        started: Instant::now(),
        sidecar,
        debug_paths,
        live: Mutex::new(live),
        changed: Condvar::new(),
        connections: AtomicUsize::new(0),
    });
    let acceptor = {
        let d = domain.clone();
        std::thread::spawn(move || accept_loop(d, listener))
    };
    supervise(&domain, signals);

    // Teardown, in reverse order.
    crash_point("teardown");
    {
        let mut live = lock_live(&domain);
        teardown(&mut live.journal, &mut res, Some(&domain.socket));
        live.phase = Phase::Down;
        domain.changed.notify_all();
    }
    let _ = acceptor.join();
    // Let session threads deliver their last Exit.
    let deadline = Instant::now() + Duration::from_secs(10);
    while domain.connections.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    log("Domain down");
    0
}

/// Brings the Domain up to a started sandbox, journalling each step first.
fn start_up(
    ctx: &Context,
    args: &CoordinatorArgs,
    journal: &mut DomainJournal,
    res: &mut Resources,
    log_fd: &Option<OwnedFd>,
    restore_log: &dyn Fn(&Option<OwnedFd>),
) -> Result<(ImageRecord, Runsc), LaunchError> {
    let domain_dir = &args.domain_dir;
    // A registry reference that is not in the store yet is pulled here, in
    // the host's network namespace, before anything of the Domain exists.
    let image = crate::images::ensure_image(&ctx.config, &ctx.profile)?;
    let runsc = Runsc::new(RunscOptions {
        path: ctx.config.runsc.path.clone(),
        state_root: domain_dir.join("runsc"),
        platform: ctx.config.runsc.platform,
        network: NetworkMode::Sandbox,
        debug_log_dir: ctx.config.runsc.debug_log_dir.clone(),
        // The Storage Root is root-only (checked when the image store opened).
        probe_cache: Some(ctx.config.storage_root.join("runsc-probe.json")),
    })?;
    res.runsc = Some(runsc.clone());
    recover_stale_runs(domain_dir, ctx.domain_id.as_str());
    for stale in [SOCKET_NAME, CA_NAME] {
        let _ = fs::remove_file(domain_dir.join(stale));
    }

    let container_id = format!("lzr-{}-{}", ctx.domain_id.short(), random_hex(4));
    let run_dir = domain_dir.join(format!("run-{container_id}"));
    fs::DirBuilder::new().mode(0o700).create(&run_dir).map_err(sys(format!("creating {}", run_dir.display())))?;
    res.run_dir = Some(run_dir.clone());
    res.cgroups_path = format!("/lazaret/{}/{}", ctx.domain_id, container_id);

    // The container's first process only reaps orphans; agents are exec'd.
    let mut spec = ctx.bundle_spec(&image, &init_command(), false)?;

    // State Anchor (and the rest of the host-side filesystem).
    journal.record(Event::MountStateAnchor).map_err(model_refused)?;
    res.anchor = true;
    let rootfs = run_dir.join("rootfs");
    for d in ["rootfs", "upper", "work"] {
        fs::DirBuilder::new().mode(0o755).create(run_dir.join(d)).map_err(sys(format!("creating {}/{d}", run_dir.display())))?;
    }
    lazaret_mounts::mount_overlay(&[image.rootfs.as_path()], &run_dir.join("upper"), &run_dir.join("work"), &rootfs)?;
    res.mounted.push(rootfs.clone());
    spec.mounts = filesystem::assemble(ctx, &image, args.reset_anchor, &run_dir, &mut res.mounted, spec.mounts)?;
    if let Some(home) = ctx.prepare_home(spec.uid, spec.gid)? {
        spec.mounts.push(home);
    }
    crash_point("state-anchor");

    journal.record(Event::CreateTrustAnchor).map_err(model_refused)?;
    res.trust = Some(TrustAnchor::create(ctx.domain_id.as_str(), &domain_dir.join(CA_NAME)).map_err(|e| LaunchError::Sys { context: "creating the Trust Anchor".into(), source: std::io::Error::other(e.to_string()) })?);
    crash_point("trust-anchor");

    // The sidecar's policy is installed and verified before the sandbox
    // exists (OrderedNetworkStartup).
    journal.record(Event::StartSidecar).map_err(model_refused)?;
    let record = domain_dir.join("sidecar-id");
    let net = network::bring_up(&ctx.config, &ctx.profile, &record)?;
    let sandbox_netns = net.sandbox_netns().map(|n| n.proc_path());
    let resolv_conf = run_dir.join("resolv.conf");
    fs::write(&resolv_conf, lazaret_netpolicy::sandbox_resolv_conf(net.policy().resolvers())).map_err(sys("writing the sandbox's resolv.conf"))?;
    res.network = Some((net, record));
    crash_point("sidecar");

    // The sandbox. From here on runsc's messages go to the log only: its
    // long-lived processes must never hold the launcher's pipe.
    restore_log(log_fd);
    spec.rootfs = rootfs;
    spec.cgroups_path = res.cgroups_path.clone();
    spec.network_namespace = sandbox_netns;
    spec.mounts.push(BindMount { source: resolv_conf, destination: "/etc/resolv.conf".into(), readonly: true });
    let bundle = run_dir.join("bundle");
    fs::DirBuilder::new().mode(0o700).create(&bundle).map_err(sys("creating the bundle directory"))?;
    lazaret_oci::bundle::write_bundle(&bundle, &spec)?;
    journal.record(Event::StartSandbox).map_err(model_refused)?;
    res.container = Some(container_id.clone());
    runsc.create(&container_id, &bundle, &run_dir.join("sandbox.pid"))?;
    crash_point("sandbox-created");
    if let Some((net, _)) = &res.network {
        net.readdress_sandbox().map_err(network::NetworkError::from)?;
        net.verify_installed().map_err(network::NetworkError::from)?;
    }
    let workaround = runsc.info().needs_netns_workaround(lazaret_runtime::runsc::kernel_major());
    runsc.start(&container_id, workaround)?;
    crash_point("sandbox");
    Ok((image, runsc))
}

/// The container's first process: a shell that reaps orphans (it is PID 1
/// of the container) and otherwise sleeps. Images need `/bin/sh` and `sleep`.
fn init_command() -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), "trap 'exit 0' TERM HUP INT; while :; do sleep 86400 & wait; done".into()]
}

fn model_refused(e: crate::journal::JournalError) -> LaunchError {
    LaunchError::Sys { context: "the protocol model refused a start-up step".into(), source: std::io::Error::other(e.to_string()) }
}


/// Binds the Domain's socket: mode 0600, owned by the developer.
fn publish(path: &Path, developer_uid: u32) -> std::io::Result<UnixListener> {
    let _ = fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    nix::unistd::chown(path, Some(developer_uid.into()), None).map_err(std::io::Error::from)?;
    Ok(listener)
}

/// Takes down whatever of `res` exists, in reverse start-up order, each
/// step journalled first, and releases the Domain lock in the model (the
/// real lock goes with the process). A step the model refuses is logged and
/// still done: leaving resources behind would be worse.
fn teardown(journal: &mut DomainJournal, res: &mut Resources, socket: Option<&Path>) {
    let step = |journal: &mut DomainJournal, event: Event| {
        if let Err(e) = journal.record(event) {
            log(&format!("teardown: {e}"));
        }
    };
    if let Some(s) = socket {
        let _ = fs::remove_file(s);
    }
    if let Some(id) = res.container.take() {
        step(journal, Event::StopSandbox);
        // From inside the Domain's PID namespace, where runsc's recorded
        // PIDs mean what they say.
        if let Some(r) = &res.runsc {
            // Killing the container's first process before `delete --force`
            // takes ~75 ms instead of ~135 ms (measured with runsc 20240729).
            let _ = r.kill(&id, libc::SIGKILL, false);
            if let Err(e) = r.delete(&id) {
                log(&format!("deleting container {id}: {e}"));
            }
        }
        // Orphans (gofer, sandbox) are reaped by PID 1.
        cgroup::remove(&res.cgroups_path);
    }
    if let Some((net, record)) = res.network.take() {
        step(journal, Event::StopSidecar);
        if let Err(e) = network::tear_down(net, &record) {
            log(&format!("taking down the Domain's network: {e}"));
        }
    }
    if let Some(trust) = res.trust.take() {
        step(journal, Event::DestroyTrustAnchor);
        trust.destroy();
    }
    if res.anchor {
        step(journal, Event::UnmountStateAnchor);
        for m in res.mounted.drain(..).rev() {
            if let Err(e) = lazaret_mounts::unmount(&m, true) {
                log(&format!("unmounting {}: {e}", m.display()));
            }
        }
        res.anchor = false;
    }
    if let Some(run_dir) = res.run_dir.take() {
        if let Err(e) = fs::remove_dir_all(&run_dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log(&format!("removing {}: {e}", run_dir.display()));
            }
        }
    }
    step(journal, Event::ReleaseDomainLock);
}

/// Removes what crashed earlier runs of this Domain left in its runtime
/// directory: run directories, runsc state and the cgroups named after them.
/// The caller holds the Domain lock, so their owner is dead; every process
/// of it died with its PID namespace and its mounts with its mount
/// namespace. (Its network is recovered by `network::bring_up`.)
fn recover_stale_runs(domain_dir: &Path, domain_id: &str) {
    let Ok(entries) = fs::read_dir(domain_dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(container) = name.strip_prefix("run-") {
            cgroup::remove(&format!("/lazaret/{domain_id}/{container}"));
            match fs::remove_dir_all(entry.path()) {
                Ok(()) => eprintln!("lazaret: removed {name} left by a crashed earlier run"),
                Err(e) => eprintln!("lazaret: cannot remove {}: {e}", entry.path().display()),
            }
        }
    }
    let state = domain_dir.join("runsc");
    if state.exists() {
        if let Err(e) = fs::remove_dir_all(&state) {
            eprintln!("lazaret: cannot remove stale runsc state {}: {e}", state.display());
        }
    }
}

/// The main thread after publishing: handles stop requests, signals and the
/// first-session timeout, until teardown begins.
fn supervise(d: &Arc<Domain>, signals: &mut Signals) {
    let published = Instant::now();
    let mut live = lock_live(d);
    loop {
        if live.phase != Phase::Ready {
            return;
        }
        while let Some(sig) = signals.pending_termination() {
            log(&format!("received {sig}: stopping the Domain"));
            live.stop.get_or_insert(StopRequest { at: Instant::now(), grace: Duration::from_secs(5), term_sent: false, kill_sent: false });
        }
        if let Some(mut stop) = live.stop {
            if !stop.term_sent {
                stop.term_sent = true;
                for (id, s) in live.sessions.iter_mut() {
                    if let Some(n) = s.notices.as_mut() {
                        let _ = wire::write_message(n, &CoordinatorMessage::Notice { text: "the Domain is stopping (lazaret stop); the agent gets SIGTERM".into() });
                    }
                    signal_session(d, id, &s.pid_file, libc::SIGTERM);
                }
            } else if !stop.kill_sent && stop.at.elapsed() >= stop.grace {
                stop.kill_sent = true;
                for (id, s) in live.sessions.iter() {
                    kill_session_tree(d, id, &s.pid_file);
                }
            } else if stop.kill_sent && stop.at.elapsed() >= stop.grace * 2 && !live.sessions.is_empty() {
                // Agents that survived SIGKILL by PID: end everything inside.
                let _ = d.runsc.kill(&d.container, libc::SIGKILL, true);
            }
            live.stop = Some(stop);
        }
        let abandoned = !live.ever_joined && published.elapsed() >= FIRST_SESSION_WAIT;
        if live.sessions.is_empty() && (live.stop.is_some() || abandoned) {
            if !live.launcher_connected {
                let launcher = live.launcher.clone();
                let _ = live.journal.record(Event::AbandonLaunch { session: launcher });
            }
            begin_teardown(d, &mut live);
            return;
        }
        live = d.changed.wait_timeout(live, Duration::from_millis(100)).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
    }
}

/// Journals BeginTeardown and withdraws the socket. Called with the state
/// locked and no session connected.
fn begin_teardown(d: &Domain, live: &mut Live) {
    if let Err(e) = live.journal.record(Event::BeginTeardown) {
        log(&format!("{e}"));
    }
    live.phase = Phase::Stopping;
    let _ = fs::remove_file(&d.socket);
    if let Some(fd) = live.listener_fd.take() {
        // `fd` is the listener's descriptor, still owned by the accept
        // thread (which only exits after this shutdown wakes it); shutdown(2)
        // does not close it.
        let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Both);
    }
    d.changed.notify_all();
}

fn signal_session(d: &Domain, session: &str, pid_file: &Path, signal: i32) {
    match read_internal_pid(pid_file) {
        Some(pid) => {
            if let Err(e) = d.runsc.kill_process(&d.container, pid, signal) {
                log(&format!("session {session}: signal {signal}: {e}"));
            }
        }
        None => log(&format!("session {session}: no agent PID yet for signal {signal}")),
    }
}

/// SIGKILLs a session's agent and every process it started (which would
/// otherwise live on, re-parented to the container's init).
fn kill_session_tree(d: &Domain, session: &str, pid_file: &Path) {
    let Some(root) = read_internal_pid(pid_file) else {
        log(&format!("session {session}: no agent PID to kill"));
        return;
    };
    let tree = match d.runsc.processes(&d.container) {
        Ok(ps) => lazaret_runtime::runsc::descendants(&ps, root),
        Err(e) => {
            log(&format!("session {session}: listing processes: {e}"));
            vec![root]
        }
    };
    for pid in tree {
        if let Err(e) = d.runsc.kill_process(&d.container, pid, libc::SIGKILL) {
            log(&format!("session {session}: killing PID {pid}: {e}"));
        }
    }
}

fn read_internal_pid(pid_file: &Path) -> Option<i32> {
    for _ in 0..100 {
        if let Ok(t) = fs::read_to_string(pid_file) {
            if let Ok(p) = t.trim().parse::<i32>() {
                if p > 0 {
                    return Some(p);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

fn accept_loop(d: Arc<Domain>, listener: UnixListener) {
    loop {
        let accepted = listener.accept();
        if lock_live(&d).phase != Phase::Ready {
            return;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                log(&format!("accept: {e}"));
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if d.connections.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            log("refused a connection: too many open connections");
            continue;
        }
        d.connections.fetch_add(1, Ordering::SeqCst);
        let d2 = d.clone();
        let spawned = std::thread::Builder::new().name("session".into()).spawn(move || {
            serve_connection(&d2, stream);
            d2.connections.fetch_sub(1, Ordering::SeqCst);
            d2.changed.notify_all();
        });
        if spawned.is_err() {
            d.connections.fetch_sub(1, Ordering::SeqCst);
            log("refused a connection: cannot start a thread");
        }
    }
}

fn peer_allowed(d: &Domain, stream: &UnixStream) -> Result<(), String> {
    let cred = nix::sys::socket::getsockopt(&stream.as_fd(), nix::sys::socket::sockopt::PeerCredentials).map_err(|e| format!("SO_PEERCRED: {e}"))?;
    let uid = cred.uid();
    if uid == 0 || uid == d.ctx.developer.uid {
        Ok(())
    } else {
        Err(format!("uid {uid} (pid {}) is neither root nor the developer (uid {})", cred.pid(), d.ctx.developer.uid))
    }
}

fn serve_connection(d: &Arc<Domain>, stream: UnixStream) {
    if let Err(why) = peer_allowed(d, &stream) {
        log(&format!("refused a connection: {why}"));
        return;
    }
    let _ = stream.set_read_timeout(Some(HELLO_TIMEOUT));
    let (first, fds) = match crate::client::read_frame_with_fds::<ClientMessage>(&stream) {
        Ok(v) => v,
        Err(FrameError::Closed) => return,
        Err(e) => {
            log(&format!("disconnected a client: {e}"));
            return;
        }
    };
    let mut out = &stream;
    match first {
        ClientMessage::Hello { .. } => run_session(d, stream.try_clone().ok(), &stream, first, fds),
        ClientMessage::Status { version } | ClientMessage::Debug { version } | ClientMessage::Stop { version, .. } if version != WIRE_VERSION => {
            let _ = wire::write_message(&mut out, &version_refusal(version));
        }
        ClientMessage::Status { .. } => {
            let _ = wire::write_message(&mut out, &CoordinatorMessage::Status(status_of(d)));
        }
        ClientMessage::Debug { .. } => {
            let _ = wire::write_message(&mut out, &CoordinatorMessage::Debug { text: debug_report(d) });
        }
        ClientMessage::Stop { grace_ms, .. } => {
            let grace = Duration::from_millis(grace_ms.min(300_000));
            {
                let mut live = lock_live(d);
                log(&format!("stop requested (grace {grace:?})"));
                live.stop.get_or_insert(StopRequest { at: Instant::now(), grace, term_sent: false, kill_sent: false });
                d.changed.notify_all();
            }
            let _ = wire::write_message(&mut out, &CoordinatorMessage::Stopping);
        }
        ClientMessage::Signal { .. } => log("disconnected a client: Signal before Hello"),
    }
}

fn version_refusal(version: u32) -> CoordinatorMessage {
    CoordinatorMessage::Refused {
        reason: format!("this Domain's coordinator speaks protocol version {WIRE_VERSION}, the client {version}: use the same lazaret binary, or stop the Domain (`lazaret stop`) and start it again"),
        retry: false,
    }
}

fn status_of(d: &Domain) -> DomainStatus {
    let live = lock_live(d);
    DomainStatus {
        domain: d.ctx.domain_id.to_string(),
        profile: d.ctx.profile.name.clone(),
        workspace: d.ctx.workspace.root().display().to_string(),
        state: live.journal.phase(),
        sessions: live.sessions.keys().cloned().collect(),
        uptime_secs: d.started.elapsed().as_secs(),
        sandbox: d.container.clone(),
        sidecar: d.sidecar.clone(),
        coordinator_pid: std::process::id(),
    }
}

/// The fine-grained namespace view: namespace inodes of the sandbox process
/// and the sidecar, the sidecar's routes, and the mounts this coordinator
/// made (its private mount namespace).
fn debug_report(d: &Domain) -> String {
    let mut out = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(out, "domain {} (profile {}, workspace {})", d.ctx.domain_id, d.ctx.profile.name, d.ctx.workspace.root().display());
    let _ = writeln!(out, "sandbox container {}", d.container);
    match lazaret_runtime::runsc::read_pid_file(&d.run_dir.join("sandbox.pid")) {
        Ok(pid) => {
            let _ = writeln!(out, "sandbox process: PID {pid} (in the coordinator's PID namespace)");
            for ns in ["pid", "net", "mnt", "ipc", "uts", "cgroup", "user"] {
                let theirs = fs::read_link(format!("/proc/{pid}/ns/{ns}")).map(|p| p.display().to_string()).unwrap_or_else(|e| format!("? ({e})"));
                let ours = fs::read_link(format!("/proc/self/ns/{ns}")).map(|p| p.display().to_string()).unwrap_or_default();
                let _ = writeln!(out, "  {ns:<7} {theirs:<24} coordinator: {ours}");
            }
        }
        Err(e) => {
            let _ = writeln!(out, "sandbox process: unknown ({e})");
        }
    }
    let _ = writeln!(out, "sidecar {}", d.sidecar);
    for (label, ns) in [("sandbox netns", &d.debug_paths.sandbox_netns), ("sidecar netns", &d.debug_paths.sidecar_netns)] {
        match ns {
            Some((path, inode)) => {
                let _ = writeln!(out, "{label}: net:[{inode}]");
                for what in [&["-d", "address", "show"][..], &["route", "show", "table", "all"][..]] {
                    let shown = std::process::Command::new("nsenter")
                        .arg(format!("--net={}", path.display()))
                        .arg("--")
                        .arg("ip")
                        .args(what)
                        .stdin(std::process::Stdio::null())
                        .output();
                    match shown {
                        Ok(o) => {
                            let _ = writeln!(out, "  $ ip {}", what.join(" "));
                            for l in String::from_utf8_lossy(&o.stdout).lines().chain(String::from_utf8_lossy(&o.stderr).lines()) {
                                let _ = writeln!(out, "    {l}");
                            }
                        }
                        Err(e) => {
                            let _ = writeln!(out, "  ip {}: {e}", what.join(" "));
                        }
                    }
                }
            }
            None => {
                let _ = writeln!(out, "{label}: none");
            }
        }
    }
    let _ = writeln!(out, "mounts made by the coordinator (its private mount namespace):");
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let run = d.run_dir.display().to_string();
    let root = d.ctx.paths.domain_root(&d.ctx.domain_id).display().to_string();
    for l in mountinfo.lines().filter(|l| l.contains(&run) || l.contains(&root)) {
        let _ = writeln!(out, "  {l}");
    }
    out
}

/// Names the settings that differ between two rendered configurations, for
/// `profile`: the global keys and that profile's keys.
pub fn config_differences(ours: &str, theirs: &str, profile: &str) -> Vec<String> {
    let parse = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap_or(serde_json::Value::Null);
    let (a, b) = (parse(ours), parse(theirs));
    let mut diffs = Vec::new();
    let keys = |v: &serde_json::Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    let mut top: Vec<String> = keys(&a).into_iter().chain(keys(&b)).collect();
    top.sort();
    top.dedup();
    for k in top {
        if k == "profiles" {
            let pa = a.get("profiles").and_then(|p| p.get(profile)).cloned().unwrap_or(serde_json::Value::Null);
            let pb = b.get("profiles").and_then(|p| p.get(profile)).cloned().unwrap_or(serde_json::Value::Null);
            diff_values(&format!("profiles.{profile}"), &pa, &pb, &mut diffs);
        } else {
            diff_values(&k, a.get(&k).unwrap_or(&serde_json::Value::Null), b.get(&k).unwrap_or(&serde_json::Value::Null), &mut diffs);
        }
    }
    diffs
}

fn diff_values(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    match (a.as_object(), b.as_object()) {
        (Some(oa), Some(ob)) => {
            let mut keys: Vec<&String> = oa.keys().chain(ob.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                diff_values(&format!("{path}.{k}"), oa.get(k).unwrap_or(&serde_json::Value::Null), ob.get(k).unwrap_or(&serde_json::Value::Null), out);
            }
        }
        _ if a != b => out.push(path.to_string()),
        _ => {}
    }
}

fn refusal_for_fingerprint(d: &Domain, theirs_fingerprint: &str, theirs: &str) -> String {
    let diffs = config_differences(&d.config_json, theirs, &d.ctx.profile.name);
    let what = if diffs.is_empty() { "settings outside the rendered configuration".to_string() } else { diffs.join(", ") };
    format!(
        "the configuration of profile {p:?} changed since its Domain started, so this session cannot join it (Configuration Fingerprint {theirs_fingerprint} instead of the running Domain's {old}; settings that differ: {what})\n  hint: stop the running Domain with `lazaret stop {p}` (its sessions end) and run again, or run with the configuration the Domain was started with",
        p = d.ctx.profile.name,
        old = d.fingerprint,
    )
}

/// One session: register it, exec its agent, relay signals, report its exit.
fn run_session(d: &Arc<Domain>, reader: Option<UnixStream>, stream: &UnixStream, hello: ClientMessage, fds: Vec<OwnedFd>) {
    let ClientMessage::Hello { version, session, profile, fingerprint, config_json, tty, term, args, rows, cols, cwd } = hello else { return };
    let mut out = stream;
    let refuse = |out: &mut &UnixStream, reason: String, retry: bool| {
        let _ = wire::write_message(out, &CoordinatorMessage::Refused { reason, retry });
    };
    if version != WIRE_VERSION {
        let _ = wire::write_message(&mut out, &version_refusal(version));
        return;
    }
    if profile != d.ctx.profile.name || session.is_empty() || session.len() > 64 || !session.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        log(&format!("disconnected a client: bad Hello (profile {profile:?}, session {session:?})"));
        refuse(&mut out, "malformed session request".into(), false);
        return;
    }
    if !tty && fds.len() != 3 {
        log(&format!("session {session}: refused: expected 3 stdio descriptors, got {}", fds.len()));
        refuse(&mut out, "a session without a terminal must pass its stdin, stdout and stderr".into(), false);
        return;
    }
    let pid_file = d.run_dir.join(format!("session-{session}.pid"));
    {
        let mut live = lock_live(d);
        if live.phase != Phase::Ready {
            refuse(&mut out, "the Domain is shutting down".into(), true);
            return;
        }
        if live.stop.is_some() {
            refuse(&mut out, "the Domain is being stopped (lazaret stop); run again once it is down".to_string(), false);
            return;
        }
        if let Err(e) = live.journal.record(Event::ConnectSession { session: session.clone() }) {
            log(&format!("session {session}: refused: {e}"));
            refuse(&mut out, format!("session {session} refused: {e}"), false);
            return;
        }
        if session == live.launcher {
            live.launcher_connected = true;
        }
        if fingerprint != d.fingerprint {
            let _ = live.journal.record(Event::RejectSession { session: session.clone(), fingerprint: fingerprint.clone() });
            log(&format!("session {session}: rejected: fingerprint {fingerprint} differs from {}", d.fingerprint));
            drop(live);
            refuse(&mut out, refusal_for_fingerprint(d, &fingerprint, &config_json), false);
            return;
        }
        if let Err(e) = live.journal.record(Event::RegisterSession { session: session.clone(), fingerprint }) {
            log(&format!("session {session}: {e}"));
            let _ = live.journal.record(Event::DisconnectSession { session: session.clone() });
            refuse(&mut out, format!("session {session} refused: {e}"), false);
            return;
        }
        live.ever_joined = true;
        live.sessions.insert(session.clone(), SessionEntry { pid_file: pid_file.clone(), notices: stream.try_clone().ok() });
        log(&format!("session {session} joined ({} connected)", live.sessions.len()));
    }
    let started = start_agent(d, &session, tty, term, args, cwd, rows, cols, fds, &pid_file);
    let (mut child, master) = match started {
        Ok(v) => v,
        Err(e) => {
            log(&format!("session {session}: starting the agent failed: {e}"));
            let _ = wire::write_message(&mut out, &CoordinatorMessage::Notice { text: format!("error: {e}") });
            finish_session(d, stream, &session, LAZARET_FAILED);
            return;
        }
    };
    let welcome = wire::encode(&CoordinatorMessage::Welcome { session: session.clone(), sandbox: d.container.clone(), tty });
    let sent = match (&welcome, &master) {
        (Ok(frame), Some(m)) => lazaret_runtime::fdpass::send_with_fds(stream, frame, &[m.as_fd()]),
        (Ok(frame), None) => std::io::Write::write_all(&mut out, frame),
        (Err(e), _) => Err(std::io::Error::other(e.to_string())),
    };
    drop(master);
    if let Err(e) = sent {
        log(&format!("session {session}: the client went away before its Welcome: {e}"));
    }
    // Client messages: signals for the agent; end of stream: the client is
    // gone, so its agent goes too.
    let exited = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader_thread = reader.map(|r| {
        let d = d.clone();
        let session = session.clone();
        let pid_file = pid_file.clone();
        let exited = exited.clone();
        std::thread::spawn(move || relay_client(&d, r, &session, &pid_file, &exited))
    });
    let status = match child.wait() {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            s.code().or_else(|| s.signal().map(|n| 128 + n)).unwrap_or(LAZARET_FAILED)
        }
        Err(e) => {
            log(&format!("session {session}: waiting for runsc exec: {e}"));
            LAZARET_FAILED
        }
    };
    exited.store(true, Ordering::SeqCst);
    finish_session(d, stream, &session, status);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    if let Some(t) = reader_thread {
        let _ = t.join();
    }
    let _ = fs::remove_file(&pid_file);
    let _ = fs::remove_file(d.run_dir.join(format!("session-{session}.json")));
}

/// Journals the session's end; if it was the last, begins teardown and
/// waits for the Domain to be down before telling the client.
fn finish_session(d: &Domain, stream: &UnixStream, session: &str, status: i32) {
    let mut live = lock_live(d);
    if let Err(e) = live.journal.record(Event::DisconnectSession { session: session.to_string() }) {
        log(&format!("session {session}: {e}"));
    }
    live.sessions.remove(session);
    log(&format!("session {session} left with status {status} ({} connected)", live.sessions.len()));
    let last = live.sessions.is_empty() && live.phase == Phase::Ready;
    if last {
        begin_teardown(d, &mut live);
        let deadline = Instant::now() + Duration::from_secs(120);
        while live.phase != Phase::Down && Instant::now() < deadline {
            live = d.changed.wait_timeout(live, Duration::from_millis(100)).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
    }
    let domain_down = live.phase == Phase::Down;
    drop(live);
    let mut out = stream;
    let _ = wire::write_message(&mut out, &CoordinatorMessage::Exit { status, domain_down });
}

fn relay_client(d: &Domain, stream: UnixStream, session: &str, pid_file: &Path, exited: &std::sync::atomic::AtomicBool) {
    let _ = stream.set_read_timeout(None);
    let mut limit = RateLimit::client_default();
    let mut r = &stream;
    loop {
        let msg = wire::read_message::<ClientMessage>(&mut r).and_then(|m| limit.admit().map(|_| m));
        if exited.load(Ordering::SeqCst) {
            return;
        }
        match msg {
            Ok(ClientMessage::Signal { signal }) if (1..=64).contains(&signal) => signal_session(d, session, pid_file, signal),
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
        kill_session_tree(d, session, pid_file);
    }
}

/// Writes the session's process spec and starts `runsc exec`.
#[allow(clippy::too_many_arguments)]
fn start_agent(
    d: &Domain,
    session: &str,
    tty: bool,
    term: Option<String>,
    args: Vec<String>,
    cwd: Option<String>,
    rows: u16,
    cols: u16,
    fds: Vec<OwnedFd>,
    pid_file: &Path,
) -> Result<(std::process::Child, Option<OwnedFd>), LaunchError> {
    let mut spec: BundleSpec = d.ctx.bundle_spec(&d.image, &args, tty)?;
    if let Some(t) = term.filter(|t| !t.is_empty() && t.len() < 64 && t.chars().all(|c| c.is_ascii_graphic())) {
        spec.env.retain(|(k, _)| k != "TERM");
        spec.env.push(("TERM".into(), t));
    }
    if let Some(c) = cwd {
        let c = PathBuf::from(c);
        let inside = c.starts_with(d.ctx.workspace.root()) && c.components().all(|p| !matches!(p, std::path::Component::ParentDir | std::path::Component::CurDir));
        if inside {
            spec.cwd = c;
        }
    }
    // Only the process part of the spec matters for exec; the rest must
    // still validate.
    spec.rootfs = d.run_dir.join("rootfs");
    spec.cgroups_path = d.cgroups_path.clone();
    let full = lazaret_oci::bundle::build_spec(&spec)?;
    let text = lazaret_oci::bundle::render_spec(&full)?;
    let value: serde_json::Value = serde_json::from_str(&text).map_err(|e| LaunchError::Sys { context: "reading back the process spec".into(), source: e.into() })?;
    let process = value.get("process").cloned().unwrap_or(serde_json::Value::Null);
    let process_file = d.run_dir.join(format!("session-{session}.json"));
    fs::write(&process_file, serde_json::to_vec(&process).unwrap_or_default()).map_err(sys(format!("writing {}", process_file.display())))?;
    let (stdio, master) = if tty {
        let pty = nix::pty::openpty(None, None).map_err(|e| LaunchError::Sys { context: "allocating a PTY".into(), source: e.into() })?;
        if rows > 0 && cols > 0 {
            let _ = set_window_size(pty.master.as_fd(), WindowSize { rows, cols });
        }
        let dup = |f: &OwnedFd| f.try_clone().map_err(sys("duplicating the PTY"));
        ([dup(&pty.slave)?, dup(&pty.slave)?, pty.slave], Some(pty.master))
    } else {
        let mut it = fds.into_iter();
        match (it.next(), it.next(), it.next()) {
            (Some(a), Some(b), Some(c)) => ([a, b, c], None),
            _ => return Err(LaunchError::Sys { context: "the client's stdio".into(), source: std::io::Error::other("missing descriptors") }),
        }
    };
    let child = d.runsc.exec(&d.container, &process_file, pid_file, stdio)?;
    Ok((child, master))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_name_global_and_profile_settings_only() {
        let ours = r#"{"dns":["1.1.1.1"],"profiles":{"a":{"command":["sh"],"env":{"X":"1"}},"b":{"command":["sh"]}}}"#;
        let theirs = r#"{"dns":["9.9.9.9"],"profiles":{"a":{"command":["sh"],"env":{"X":"2"},"hostname":"h"},"b":{"command":["bash"]}}}"#;
        assert_eq!(config_differences(ours, theirs, "a"), vec!["dns", "profiles.a.env.X", "profiles.a.hostname"]);
        assert!(config_differences(ours, ours, "a").is_empty());
    }

    #[test]
    fn the_init_command_only_reaps_and_sleeps() {
        let cmd = init_command();
        assert_eq!(cmd[0], "/bin/sh");
        assert!(cmd[2].contains("wait"));
    }
}
