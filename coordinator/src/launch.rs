//! `lazaret run`: resolve everything, build the sandbox, attach, and leave
//! nothing behind.
//!
//! In this version one `lazaret run` is one Domain with one session, owned by
//! this process; the exclusive Domain lock refuses a second run of the same
//! Domain (sessions joining a running Domain come with the coordinator
//! daemon). Every host-side mount is made in this process's private mount
//! namespace, so none shows in the host's mount table and all vanish with the
//! process, whatever way it ends.

use std::fs::{self, File};
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::time::Duration;

use lazaret_oci::bundle::BindMount;
use lazaret_runtime::attach::{attach, AttachIo, Signals};
use lazaret_runtime::console::ConsoleSocket;
use lazaret_runtime::runsc::ContainerStdio;
use lazaret_runtime::terminal::RawModeGuard;
use lazaret_runtime::{pidns, reaper, ExitStatus, NetworkMode, Runsc, RunscOptions};

use crate::context::{Context, ContextError};
use crate::cgroup;
use crate::filesystem;
use crate::network;
use crate::lock::{DomainLock, LockError};

/// What `lazaret run` was asked to do.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    /// `--config FILE`, if given.
    pub config: Option<PathBuf>,
    /// The profile named on the command line, if any.
    pub profile: Option<String>,
    /// Where to look for the workspace (`-C DIR`, else the current directory).
    pub dir: PathBuf,
    /// Replaces the profile's command when not empty (`-- ARGS...`).
    pub args: Vec<String>,
    /// Discard the State Anchor before starting (`--reset-anchor`).
    pub reset_anchor: bool,
}

/// Why a run could not start or finish cleanly.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Resolving configuration, workspace, image or runsc failed.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// Another run owns the Domain.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The Domain's network could not be built.
    #[error(transparent)]
    Network(#[from] network::NetworkError),
    /// A mount could not be made.
    #[error(transparent)]
    Mount(#[from] lazaret_mounts::MountError),
    /// The bundle could not be written.
    #[error(transparent)]
    Bundle(#[from] lazaret_oci::bundle::BundleError),
    /// runsc failed.
    #[error(transparent)]
    Runsc(#[from] lazaret_runtime::RunscError),
    /// The terminal could not be handed over.
    #[error(transparent)]
    Console(#[from] lazaret_runtime::console::ConsoleError),
    /// Waiting for the container failed.
    #[error(transparent)]
    Attach(#[from] lazaret_runtime::attach::AttachError),
    /// The sandbox's PID namespace could not be created.
    #[error(transparent)]
    PidNamespace(#[from] lazaret_runtime::pidns::PidNsError),
    /// A system call failed.
    #[error("{context}: {source}")]
    Sys {
        /// What we were doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// The developer asked us to stop before the sandbox started.
    #[error("interrupted by {0} before the sandbox started; nothing is left behind")]
    Interrupted(String),
}

fn sys(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LaunchError {
    let context = context.into();
    move |source| LaunchError::Sys { context, source }
}

/// Runs `lazaret run` and returns the agent's exit status. Call it first
/// thing in `main`, while the process has a single thread: it blocks the
/// signals Lazaret handles as events and forks the child that is PID 1 of the
/// sandbox's own PID namespace (see `lazaret_runtime::pidns`). The child
/// prints its own errors (it exits with [`LAZARET_FAILED`] then).
pub fn run_isolated(req: &RunRequest) -> Result<ExitStatus, LaunchError> {
    crate::context::require_root()?;
    let mut signals = Signals::block().map_err(|e| LaunchError::Sys { context: "blocking signals".into(), source: e.into() })?;
    let status = pidns::run_as_namespace_init(&mut signals, |signals| match enter_and_run(req, signals) {
        Ok(status) => status.0,
        Err(e) => {
            eprintln!("lazaret: error: {e}");
            LAZARET_FAILED
        }
    })?;
    Ok(status)
}

/// Exit status of `lazaret` for its own failures, distinct from the agent's.
pub const LAZARET_FAILED: i32 = 125;

fn enter_and_run(req: &RunRequest, signals: &mut Signals) -> Result<ExitStatus, LaunchError> {
    lazaret_mounts::enter_private_mount_namespace()?;
    // runsc writes /proc/<pid>/uid_map of its gofer by the PID it knows, a
    // PID of our namespace: /proc must show this namespace, not the host's.
    mount_own_proc()?;
    reaper::become_subreaper().map_err(|e| LaunchError::Sys { context: "becoming a child subreaper".into(), source: e.into() })?;
    run(req, signals)
}

/// Runs the profile's agent (or `req.args`) in a fresh sandbox and returns
/// its exit status.
/// Mounts a proc filesystem of the current PID namespace over /proc, in the
/// (private) mount namespace of the calling thread.
fn mount_own_proc() -> Result<(), LaunchError> {
    use nix::mount::{mount, MsFlags};
    mount(Some("proc"), "/proc", Some("proc"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC, None::<&str>)
        .map_err(|e| LaunchError::Sys { context: "mounting /proc for the sandbox's PID namespace".into(), source: e.into() })
}

fn run(req: &RunRequest, signals: &mut Signals) -> Result<ExitStatus, LaunchError> {
    let ctx = Context::resolve(req.config.as_deref(), req.profile.as_deref(), &req.dir)?;
    let image = ctx.image()?;
    let domain_dir = ctx.domain_runtime_dir()?;
    let _lock = DomainLock::acquire(&domain_dir.join("lock"), &ctx.domain_id.to_string())?;

    let runsc = Runsc::new(RunscOptions {
        path: ctx.config.runsc.path.clone(),
        state_root: domain_dir.join("runsc"),
        platform: ctx.runsc_platform(),
        network: NetworkMode::Sandbox,
        debug_log_dir: ctx.config.runsc.debug_log_dir.clone(),
    })?;

    recover_stale_runs(&domain_dir, ctx.domain_id.as_str());
    let container_id = format!("lzr-{}-{}", ctx.domain_id.short(), random_hex(4));
    let run_dir = domain_dir.join(format!("run-{container_id}"));
    fs::DirBuilder::new().mode(0o700).create(&run_dir).map_err(sys(format!("creating {}", run_dir.display())))?;
    let cgroups_path = format!("/lazaret/{}/{}", ctx.domain_id, container_id);
    // From here on, every exit path goes through the guard's Drop.
    let mut guard = RunGuard { runsc: &runsc, container: None, exited: false, cgroups_path: cgroups_path.clone(), network: None, run_dir: run_dir.clone(), mounted: Vec::new() };

    // The sidecar's policy is installed and verified before the sandbox
    // exists (OrderedNetworkStartup).
    let record = domain_dir.join("sidecar-id");
    let net = network::bring_up(&ctx.config, &ctx.profile, &record)?;
    let sandbox_netns = net.sandbox_netns().map(|n| n.proc_path());
    let resolv_conf = run_dir.join("resolv.conf");
    fs::write(&resolv_conf, lazaret_netpolicy::sandbox_resolv_conf(net.policy().resolvers())).map_err(sys("writing the sandbox's resolv.conf"))?;
    guard.network = Some((net, record));

    // The rootfs runsc gets is an overlay over the pristine image, so the
    // mount points runsc creates never touch the image store.
    let rootfs = run_dir.join("rootfs");
    for d in ["rootfs", "upper", "work"] {
        fs::DirBuilder::new().mode(0o755).create(run_dir.join(d)).map_err(sys(format!("creating {}/{d}", run_dir.display())))?;
    }
    lazaret_mounts::mount_overlay(&[image.rootfs.as_path()], &run_dir.join("upper"), &run_dir.join("work"), &rootfs)?;
    guard.mounted.push(rootfs.clone());

    let tty = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    let mut spec = ctx.bundle_spec(&image, &req.args, tty)?;
    spec.rootfs = rootfs;
    spec.cgroups_path = cgroups_path;
    spec.network_namespace = sandbox_netns;
    spec.mounts = filesystem::assemble(&ctx, &image, req.reset_anchor, &run_dir, &mut guard.mounted, spec.mounts)?;
    if let Some(home) = ctx.prepare_home(spec.uid, spec.gid)? {
        spec.mounts.push(home);
    }
    // Last, so it lands on top of an anchored /etc.
    spec.mounts.push(BindMount { source: resolv_conf, destination: "/etc/resolv.conf".into(), readonly: true });
    let bundle = run_dir.join("bundle");
    fs::DirBuilder::new().mode(0o700).create(&bundle).map_err(sys("creating the bundle directory"))?;
    lazaret_oci::bundle::write_bundle(&bundle, &spec)?;

    if let Some(sig) = signals.pending_termination() {
        return Err(LaunchError::Interrupted(sig.to_string()));
    }

    let pid_file = run_dir.join("sandbox.pid");
    let console = if tty { Some(ConsoleSocket::bind(&run_dir.join("console.sock"))?) } else { None };
    let stdio = match &console {
        Some(c) => ContainerStdio::Console { socket: c.path().to_path_buf(), log: run_dir.join("runsc-create.log") },
        None => ContainerStdio::Inherit,
    };
    guard.container = Some(container_id.clone());
    runsc.create(&container_id, &bundle, &pid_file, &stdio)?;
    let sandbox_pid = reaper::read_pid_file(&pid_file).map_err(sys("reading the sandbox PID"))?;
    let master = match &console {
        Some(c) => Some(c.receive_master(Duration::from_secs(10))?),
        None => None,
    };
    if let Some(sig) = signals.pending_termination() {
        return Err(LaunchError::Interrupted(sig.to_string()));
    }

    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    // Raw mode only once the sandbox exists; restored when this guard drops,
    // before the clean-up guard runs (declared later, dropped earlier).
    let raw = match &master {
        Some(_) => Some(RawModeGuard::enter(stdin.as_fd()).map_err(|e| LaunchError::Sys { context: "setting the terminal to raw mode".into(), source: e.into() })?),
        None => None,
    };
    if let Some(m) = &master {
        lazaret_runtime::attach::sync_window_size(stdin.as_fd(), m.as_fd());
    }
    // runsc's netstack takes the namespace's addresses away at every start,
    // so re-address and check the policy right before it.
    if let Some((net, _)) = &guard.network {
        net.readdress_sandbox().map_err(network::NetworkError::from)?;
        net.verify_installed().map_err(network::NetworkError::from)?;
    }
    let workaround = runsc.info().needs_netns_workaround(lazaret_runtime::runsc::kernel_major());
    runsc.start(&container_id, workaround)?;

    let io = match master {
        Some(master) => AttachIo::Terminal { master, input: stdin.as_fd(), output: stdout.as_fd() },
        None => AttachIo::Inherited,
    };
    let status = attach(signals, sandbox_pid, io, |sig, count| {
        // First signal: pass it on; a second one: kill everything inside.
        let (signal, all) = if count == 1 { (sig as i32, false) } else { (libc::SIGKILL, true) };
        if let Err(e) = runsc.kill(&container_id, signal, all) {
            eprintln!("lazaret: forwarding {sig}: {e}");
        }
    })?;
    drop(raw);
    guard.exited = true;
    Ok(status)
}

/// Removes what crashed earlier runs of this Domain left in its runtime
/// directory: run directories, runsc state, and the cgroups named after
/// them. The caller holds the Domain lock, and every process of an earlier
/// run died with its PID namespace, so nothing here is in use. (Its mounts
/// died with its mount namespace; its network is recovered by
/// `network::bring_up`.)
fn recover_stale_runs(domain_dir: &std::path::Path, domain_id: &str) {
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

/// Undoes everything a run set up, in reverse order, whatever way the run
/// ends. Failures are reported and do not stop the rest of the clean-up.
struct RunGuard<'a> {
    runsc: &'a Runsc,
    container: Option<String>,
    /// The container's first process has exited (its gofer follows).
    exited: bool,
    cgroups_path: String,
    /// The Domain's network and the file recording its Sidecar ID.
    network: Option<(lazaret_netpolicy::topology::DomainNetwork, PathBuf)>,
    run_dir: PathBuf,
    mounted: Vec<PathBuf>,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        if self.exited {
            reaper::reap_all(Duration::from_secs(1));
        }
        if let Some(id) = self.container.take() {
            if let Err(e) = self.runsc.delete(&id) {
                eprintln!("lazaret: cleaning up container {id}: {e}");
            }
        }
        // Orphans re-parented to us (runsc's gofer) are reaped here.
        let _ = reaper::reap_exited(nix::unistd::Pid::from_raw(-1));
        cgroup::remove(&self.cgroups_path);
        if let Some((net, record)) = self.network.take() {
            if let Err(e) = network::tear_down(net, &record) {
                eprintln!("lazaret: taking down the Domain's network: {e}");
            }
        }
        // Lazy detach: the staged mounts are nested, and nothing here may fail
        // the rest of the clean-up (all of them die with the namespace anyway).
        for m in self.mounted.drain(..).rev() {
            if let Err(e) = lazaret_mounts::unmount(&m, true) {
                eprintln!("lazaret: unmounting {}: {e}", m.display());
            }
        }
        if let Err(e) = fs::remove_dir_all(&self.run_dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("lazaret: removing {}: {e}", self.run_dir.display());
            }
        }
    }
}

/// `n` random bytes as hex, from the kernel's CSPRNG.
pub(crate) fn random_hex(n: usize) -> String {
    let mut buf = vec![0u8; n];
    if let Ok(mut f) = File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut buf);
    }
    hex::encode(buf)
}
