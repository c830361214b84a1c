//! The real [`Effects`] of a Domain's start-up and teardown: images, runsc,
//! mounts, the sidecar network and the Domain's files, on this host.
//!
//! Each act either succeeds or leaves nothing behind (a partial mount set or
//! a half-created container is cleaned up before the error returns), so the
//! start-up stack only ever holds whole resources.

use std::fs;
use std::io::Write as _;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lazaret_netpolicy::topology::DomainNetwork;
use lazaret_oci::ImageRecord;
use lazaret_oci::bundle::{BindMount, BundleSpec};
use lazaret_runtime::{NetworkMode, Runsc, RunscOptions};

use crate::context::Context;
use crate::layout::{DomainDir, RunDir};
use crate::trust::TrustAnchor;
use crate::{cgroup, filesystem, network};

use super::stages::{Effects, Stage};
use super::{StartError, log};

/// The image, a checked runsc, and the bundle of the container's first
/// process (built once; the sandbox stage completes it).
#[derive(Clone)]
pub struct Prepared {
    /// The image record.
    pub image: ImageRecord,
    /// runsc with this Domain's global flags.
    pub runsc: Runsc,
    /// The init process's bundle, without this run's mounts, rootfs,
    /// cgroups path and network namespace.
    pub spec: BundleSpec,
}

/// The host mounts the State Anchor stage made, and the binds they give.
#[derive(Clone)]
pub struct Filesystem(Arc<Mounted>);

struct Mounted {
    /// Host mountpoints, in the order they were mounted.
    mountpoints: Vec<PathBuf>,
    /// The sandbox's binds, in order (nesting order is the bundle's job).
    binds: Vec<BindMount>,
    /// The Domain's shared hold on its profile's state (`profile_state`),
    /// released with the filesystem.
    _profile_state: Option<filesystem::ProfileStateLock>,
}

/// The sidecar network and the file recording its Sidecar ID.
#[derive(Clone)]
pub struct Network {
    /// The topology (shared with the sandbox stage; the stack's copy is
    /// the last one when it is torn down).
    pub topology: Arc<DomainNetwork>,
    record: PathBuf,
    /// The escalation listener, in the sidecar's namespace on the
    /// sandbox-facing address.
    pub escalation: Arc<std::net::TcpListener>,
    /// Locked egress: the Domain's resolver (stopped before the teardown).
    pub resolver: Arc<std::sync::Mutex<Option<lazaret_netpolicy::topology::LockedResolver>>>,
}

/// The created sandbox.
#[derive(Clone)]
pub struct Sandbox {
    /// runsc's container ID.
    pub container: String,
    /// Its cgroups path.
    pub cgroups_path: String,
    /// runsc, for teardown.
    runsc: Runsc,
}

/// Where the coordinator's stderr goes: to the launcher's status pipe
/// while start-up may warn (the developer should see it), to the Domain's
/// log from the sandbox on (runsc's long-lived processes must never hold
/// the launcher's pipe) and whenever this guard is dropped.
pub struct StderrRoute {
    log: Option<OwnedFd>,
}

impl StderrRoute {
    /// Points stderr at `launcher`, remembering the log.
    pub fn to_launcher(launcher: Option<&fs::File>) -> StderrRoute {
        let log = std::io::stderr().as_fd().try_clone_to_owned().ok();
        if let Some(f) = launcher {
            let _ = nix::unistd::dup2_stderr(f.as_fd());
        }
        StderrRoute { log }
    }

    /// A timestamped line in the Domain's log only, never on the
    /// launcher's pipe (stderr may point there during start-up).
    pub fn log_only(&self, line: &str) {
        if let Some(l) = &self.log {
            let _ = nix::unistd::write(l, format!("[{}] {line}\n", crate::journal::now_ms()).as_bytes());
        }
    }

    /// Points stderr back at the log.
    pub fn restore_log(&mut self) {
        if let Some(l) = &self.log {
            let _ = nix::unistd::dup2_stderr(l.as_fd());
        }
    }
}

impl Drop for StderrRoute {
    fn drop(&mut self) {
        self.restore_log();
    }
}

/// The host's effects for one Domain start.
pub struct HostEffects {
    ctx: Arc<Context>,
    dir: DomainDir,
    reset_anchor: bool,
    container: String,
    stderr: StderrRoute,
    setup: crate::startup::SetupMode,
    /// The launcher's status pipe, for setup progress.
    progress: Option<fs::File>,
    /// Git Sentry's read-only binds and outside git directories, for the
    /// Workspace Guard and the escalation service.
    guarded: crate::workspace_guard::GuardedPaths,
}

impl HostEffects {
    /// Effects for starting `ctx`'s Domain in `dir`, with sandbox `container`.
    pub fn new(ctx: Arc<Context>, dir: DomainDir, reset_anchor: bool, container: String, stderr: StderrRoute) -> HostEffects {
        HostEffects {
            ctx,
            dir,
            reset_anchor,
            container,
            stderr,
            setup: crate::startup::SetupMode::Normal,
            progress: None,
            guarded: Default::default(),
        }
    }

    /// `--no-setup` / `--reprovision`, and where setup progress goes (the
    /// launcher's status pipe).
    pub fn set_setup(&mut self, mode: crate::startup::SetupMode, progress: Option<fs::File>) {
        self.setup = mode;
        self.progress = progress;
    }

    /// What the Workspace Guard needs of Git Sentry's binds; known once the
    /// State Anchor stage is done.
    pub fn guarded_paths(&self) -> crate::workspace_guard::GuardedPaths {
        self.guarded.clone()
    }

    /// The sandbox's container ID.
    pub fn container(&self) -> &str {
        &self.container
    }

    fn cgroups_path(&self) -> String {
        format!("/lazaret/{}/{}", self.ctx.domain_id, self.container)
    }

    /// Routes stderr to the log from now on.
    pub fn stderr_to_log(&mut self) {
        self.stderr.restore_log();
    }
}

/// The Escalation Client's file name, in [`ESCALATE_DIR`] inside every
/// sandbox.
pub const ESCALATE_NAME: &str = "lazaret-escalate";
/// Where the Escalation Client is inside the sandbox (on PATH).
pub const ESCALATE_DIR: &str = "/usr/local/bin";

/// The session subreaper's file name; inside every sandbox it is
/// [`lazaret_protocol::session::SESSION_INIT_PATH`].
pub const SESSION_INIT_NAME: &str = "lazaret-session-init";

/// Where the static program `name` Lazaret binds into sandboxes is on the
/// host: `../lib/lazaret/NAME` from the `lazaret` executable
/// (`/usr/local/lib/lazaret/` for an installed `/usr/local/bin/lazaret`;
/// `target/lib/lazaret/` for a build tree, where cargo's own, dynamically
/// linked builds live beside `lazaret`).
fn static_binary_path(name: &str) -> Result<PathBuf, StartError> {
    let exe = std::env::current_exe().map_err(StartError::io("locating the lazaret executable"))?;
    let bin_dir = exe.parent().unwrap_or(Path::new("/"));
    Ok(bin_dir.parent().unwrap_or(Path::new("/")).join("lib/lazaret").join(name))
}

/// The static program `name` (the Escalation Client or the session
/// subreaper) to bind into the sandbox; a missing or dynamically linked one
/// (it must run in images without a C library) is an error that says how
/// to install the right one.
fn static_binary(name: &str, what: &str) -> Result<PathBuf, StartError> {
    let path = static_binary_path(name)?;
    let fix = if name == ESCALATE_NAME {
        format!(
            "scripts/setup.sh installs it; in a build tree: install -D -m 0755 \"$(bash scripts/build-escalate.sh)\" target/lib/lazaret/{name}"
        )
    } else {
        format!(
            "scripts/setup.sh installs it; in a build tree: install -D -m 0755 \"$(bash scripts/build-escalate.sh {name})\" target/lib/lazaret/{name}"
        )
    };
    let problem = match fs::read(&path) {
        Ok(elf) => match interpreter_of(&elf) {
            Ok(false) => return Ok(path),
            Ok(true) => "is dynamically linked (it must run in images without a C library)",
            Err(why) => why,
        },
        Err(_) => "is missing",
    };
    Err(StartError::Io {
        context: format!("{what} {} {problem}; {fix}", path.display()),
        source: std::io::Error::from(std::io::ErrorKind::InvalidData),
    })
}

/// Whether a 64-bit little-endian ELF executable names a program
/// interpreter (`PT_INTERP`), i.e. is dynamically linked.
fn interpreter_of(elf: &[u8]) -> Result<bool, &'static str> {
    const PT_INTERP: u32 = 3;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |o: usize| elf.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let u64_at = |o: usize| elf.get(o..o + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return Err("is not a 64-bit little-endian ELF executable");
    }
    let header = || -> Option<(usize, usize, usize)> { Some((usize::try_from(u64_at(0x20)?).ok()?, u16_at(0x36)?, u16_at(0x38)?)) };
    let (phoff, phentsize, phnum) = header().ok_or("has a truncated ELF header")?;
    for i in 0..phnum {
        let entry = phoff
            .checked_add(i.checked_mul(phentsize).ok_or("has a corrupt program header table")?)
            .ok_or("has a corrupt program header table")?;
        match u32_at(entry) {
            Some(PT_INTERP) => return Ok(true),
            Some(_) => {}
            None => return Err("has a truncated program header table"),
        }
    }
    Ok(false)
}

/// The container's first process: a shell that reaps orphans (it is PID 1
/// of the container) and otherwise sleeps. Images need `/bin/sh` and `sleep`.
pub fn init_command() -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), "trap 'exit 0' TERM HUP INT; while :; do sleep 86400 & wait; done".into()]
}

/// Unmounts `mountpoints` newest first; returns the first failure after
/// trying them all.
fn unmount_all(mountpoints: &[PathBuf]) -> Result<(), StartError> {
    let mut first = None;
    for m in mountpoints.iter().rev() {
        if let Err(e) = lazaret_mounts::unmount(m, true) {
            log(&format!("unmounting {}: {e}", m.display()));
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), |e| Err(e.into()))
}

fn make_dir(path: &Path, mode: u32) -> Result<(), StartError> {
    fs::DirBuilder::new().mode(mode).create(path).map_err(StartError::io(format!("creating {}", path.display())))
}

impl Effects for HostEffects {
    type Image = Prepared;
    type RunDir = RunDir;
    type Filesystem = Filesystem;
    type Trust = Arc<TrustAnchor>;
    type Network = Network;
    type Sandbox = Sandbox;
    type Listener = UnixListener;

    /// Logs the stage's end (timestamped: `lazaret-bench run` reads these
    /// lines for its per-stage breakdown), then passes its crash point.
    fn reached(&mut self, stage: Stage) {
        self.stderr.log_only(&format!("stage {stage} done"));
        super::crash_point(stage.name());
    }

    fn lock(&mut self) -> Result<(), StartError> {
        Ok(())
    }

    /// Removes what crashed earlier runs of this Domain left in its runtime
    /// directory: run directories, runsc state and the cgroups named after
    /// them, a stale socket and CA certificate. The Domain lock proves their
    /// owner dead; every process of it died with its PID namespace and its
    /// mounts with its mount namespace. (Its network is recovered by the
    /// sidecar stage, through the recorded Sidecar ID.) Never `runsc
    /// delete`: the dead run's state holds PIDs of its own PID namespace.
    fn recover(&mut self) -> Result<(), StartError> {
        cgroup::remove_children(&format!("/lazaret/{}", self.ctx.domain_id), "escalation-");
        for (container, run) in self.dir.run_dirs() {
            cgroup::remove(&format!("/lazaret/{}/{container}", self.ctx.domain_id));
            cgroup::remove(&format!("/lazaret/{}/{container}-setup", self.ctx.domain_id));
            match fs::remove_dir_all(run.path()) {
                Ok(()) => eprintln!("lazaret: removed run-{container} left by a crashed earlier run"),
                Err(e) => eprintln!("lazaret: cannot remove {}: {e}", run.path().display()),
            }
        }
        // Stale state under another container ID does not disturb this run.
        let state = self.dir.runsc_state();
        if state.exists() {
            if let Err(e) = fs::remove_dir_all(&state) {
                eprintln!("lazaret: cannot remove stale runsc state {}: {e}", state.display());
            }
        }
        for stale in self.dir.published_files() {
            match fs::remove_file(&stale) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StartError::io(format!("removing stale {}", stale.display()))(e)),
            }
        }
        Ok(())
    }

    /// A registry reference that is not in the store yet is pulled here, in
    /// the host's network namespace, before anything of the Domain exists.
    fn prepare_image(&mut self) -> Result<Prepared, StartError> {
        let ctx = &self.ctx;
        let image = crate::images::ensure_image(&ctx.config, &ctx.profile)?;
        let runsc = Runsc::new(RunscOptions {
            path: ctx.config.runsc.path.clone(),
            state_root: self.dir.runsc_state(),
            platform: ctx.config.runsc.platform,
            network: NetworkMode::Sandbox,
            debug_log_dir: ctx.config.runsc.debug_log_dir.clone(),
            // The Storage Root is root-only (checked when the image store opened).
            probe_cache: Some(ctx.config.storage_root.join("runsc-probe.json")),
        })?;
        // The container's first process only reaps orphans; agents are exec'd.
        let spec = ctx.init_bundle_spec(&init_command())?;
        Ok(Prepared { image, runsc, spec })
    }

    fn create_run_dir(&mut self) -> Result<RunDir, StartError> {
        let run = self.dir.run_dir(&self.container);
        make_dir(run.path(), 0o700)?;
        Ok(run)
    }

    /// The rootfs overlay over the pristine image (runsc writes mount points
    /// into it), then State Anchor, Ignored Workspace State, Git Sentry,
    /// volumes and the agent's home.
    fn mount_filesystem(&mut self, prepared: &Prepared, run: &RunDir) -> Result<Filesystem, StartError> {
        let mut mountpoints = Vec::new();
        let mut profile_state = None;
        // The repositories' configs are writable only behind the guard's
        // gate, and not for a root agent: root needs no write bit, so it
        // could rewrite the guard's sealed copy in place after the gate let
        // a host process open it (docs/workspace-guard.md).
        let gated_configs = prepared.spec.uid != 0 && !super::guard::disabled_by_test_hook() && !super::guard::gate_disabled_by_test_hook();
        let assembled = (|| -> Result<(Vec<BindMount>, filesystem::SentryForGuard), StartError> {
            for d in [run.rootfs(), run.upper(), run.work()] {
                make_dir(&d, 0o755)?;
            }
            lazaret_mounts::mount_overlay(&[prepared.image.rootfs.as_path()], &run.upper(), &run.work(), &run.rootfs())?;
            mountpoints.push(run.rootfs());
            let (mut binds, sentry) = filesystem::assemble(
                &self.ctx,
                &prepared.image,
                self.reset_anchor,
                run,
                &mut mountpoints,
                prepared.spec.mounts.clone(),
                gated_configs,
                &|line| self.stderr.log_only(line),
            )?;
            if let Some((lock, state_binds)) = filesystem::prepare_profile_state(&self.ctx)? {
                profile_state = Some(lock);
                binds.extend(state_binds);
            }
            let mount_points: Vec<PathBuf> = binds.iter().map(|b| b.destination.clone()).collect();
            if let Some(home) = self.ctx.prepare_home(prepared.spec.uid, prepared.spec.gid, &mount_points)? {
                binds.push(home);
            }
            Ok((binds, sentry))
        })();
        match assembled {
            Ok((binds, sentry)) => {
                let mut guarded =
                    crate::workspace_guard::GuardedPaths::from_binds(self.ctx.workspace.root(), &binds, sentry.outside_git_dirs);
                guarded.gated_configs = sentry.gated_configs;
                self.guarded = guarded;
                Ok(Filesystem(Arc::new(Mounted { mountpoints, binds, _profile_state: profile_state })))
            }
            Err(e) => {
                if let Err(u) = unmount_all(&mountpoints) {
                    log(&format!("cleaning up a failed mount assembly: {u}"));
                }
                Err(e)
            }
        }
    }

    fn create_trust_anchor(&mut self) -> Result<Arc<TrustAnchor>, StartError> {
        Ok(Arc::new(TrustAnchor::create(self.ctx.domain_id.as_str(), &self.dir.ca_cert())?))
    }

    fn start_sidecar(&mut self, _run: &RunDir) -> Result<Network, StartError> {
        let record = self.dir.sidecar_record();
        let topology = network::bring_up(&self.ctx.config, &self.ctx.profile, &record)?;
        // Part of this stage: the act cleans up after itself if it fails.
        let escalation = match topology.bind_escalation_listener() {
            Ok(l) => l,
            Err(e) => {
                if let Err(u) = network::tear_down(topology, &record) {
                    log(&format!("tearing down the sidecar after a failed start: {u}"));
                }
                return Err(network::NetworkError::from(e).into());
            }
        };
        let resolver = if topology.policy().locked() {
            match network::start_resolver(&topology, self.dir.refused_names()) {
                Ok(resolver) => Some(resolver),
                Err(e) => {
                    if let Err(u) = network::tear_down(topology, &record) {
                        log(&format!("tearing down the sidecar after a failed start: {u}"));
                    }
                    return Err(e.into());
                }
            }
        } else {
            None
        };
        Ok(Network {
            topology: Arc::new(topology),
            record,
            escalation: Arc::new(escalation),
            resolver: Arc::new(std::sync::Mutex::new(resolver)),
        })
    }

    /// The profile's setup ([`super::provision`]), in a sandbox with the
    /// State Anchor binds alone. runsc's processes never hold the
    /// launcher's pipe: stderr goes to the log from here on, and progress
    /// through the status pipe's duplicate, which is dropped afterwards.
    fn provision(&mut self, prepared: &Prepared, run: &RunDir, fs_: &Filesystem, net: &Network) -> Result<(), StartError> {
        let mut progress = self.progress.take();
        if self.ctx.profile.setup.is_empty() {
            return Ok(());
        }
        self.stderr_to_log();
        let anchor_dir = run.anchor();
        let sandbox = super::provision::SetupSandbox {
            ctx: &self.ctx,
            dir: &self.dir,
            runsc: &prepared.runsc,
            image: &prepared.image,
            base: &prepared.spec,
            run,
            anchor_binds: fs_.0.binds.iter().filter(|b| b.source.starts_with(&anchor_dir)).cloned().collect(),
            network: &net.topology,
            container: format!("{}-setup", self.container),
            cgroups_path: format!("{}-setup", self.cgroups_path()),
        };
        let mut say = |line: &str| {
            if let Some(p) = progress.as_mut() {
                // The launcher may be gone (EPIPE): setup goes on for whoever waits.
                let _ = writeln!(p, "{line}");
            }
        };
        super::provision::provision(&sandbox, self.setup, self.reset_anchor, &mut say)
    }

    /// Writes the bundle and runs `runsc create`. From here on stderr goes
    /// to the log only.
    fn create_sandbox(&mut self, prepared: &Prepared, run: &RunDir, fs_: &Filesystem, net: &Network) -> Result<Sandbox, StartError> {
        self.stderr_to_log();
        let resolv_conf = run.resolv_conf();
        fs::write(&resolv_conf, lazaret_netpolicy::sandbox_resolv_conf(&net.topology.sandbox_resolvers()))
            .map_err(StartError::io("writing the sandbox's resolv.conf"))?;
        let mut spec = prepared.spec.clone();
        spec.rootfs = run.rootfs();
        spec.cgroups_path = self.cgroups_path();
        spec.network_namespace = net.topology.sandbox_netns().map(|n| n.proc_path());
        spec.mounts = fs_.0.binds.clone();
        spec.mounts.push(BindMount { source: resolv_conf, destination: "/etc/resolv.conf".into(), readonly: true });
        spec.mounts.extend(crate::passwd::bind_account_files(&self.ctx, &prepared.image.rootfs, run.path())?);
        spec.mounts.push(BindMount {
            source: static_binary(ESCALATE_NAME, "the Escalation Client")?,
            destination: Path::new(ESCALATE_DIR).join(ESCALATE_NAME),
            readonly: true,
        });
        // Every session's first process (its subreaper, see session.rs).
        spec.mounts.push(BindMount {
            source: static_binary(SESSION_INIT_NAME, "the session subreaper")?,
            destination: lazaret_protocol::session::SESSION_INIT_PATH.into(),
            readonly: true,
        });
        let bundle = run.bundle();
        make_dir(&bundle, 0o700)?;
        lazaret_oci::bundle::write_bundle(&bundle, &spec)?;
        let sandbox = Sandbox { container: self.container.clone(), cgroups_path: spec.cgroups_path.clone(), runsc: prepared.runsc.clone() };
        if let Err(e) = prepared.runsc.create(&self.container, &bundle, &run.sandbox_pid()) {
            // runsc may have left a half-created container and its cgroups.
            if let Err(u) = self.delete_sandbox(sandbox) {
                log(&format!("cleaning up the failed container: {u}"));
            }
            return Err(e.into());
        }
        Ok(sandbox)
    }

    /// runsc's netstack strips the sandbox interface's addresses at every
    /// start: re-address it and verify the whole policy once more before the
    /// sandbox runs anything.
    fn start_sandbox(&mut self, sandbox: &Sandbox, net: &Network) -> Result<(), StartError> {
        net.topology.readdress_sandbox().map_err(network::NetworkError::from)?;
        net.topology.verify_installed().map_err(network::NetworkError::from)?;
        let workaround = sandbox.runsc.info().needs_netns_workaround(lazaret_runtime::runsc::kernel_major());
        sandbox.runsc.start(&sandbox.container, workaround)?;
        Ok(())
    }

    /// Binds the Domain's socket: mode 0600, owned by the developer.
    fn publish(&mut self) -> Result<UnixListener, StartError> {
        let path = self.dir.socket();
        let context = || format!("publishing {}", path.display());
        let _ = fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(StartError::io(context()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).map_err(StartError::io(context()))?;
        nix::unistd::chown(&path, Some(self.ctx.developer.uid.into()), None).map_err(StartError::errno(context()))?;
        Ok(listener)
    }

    fn withdraw(&mut self) -> Result<(), StartError> {
        match fs::remove_file(self.dir.socket()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StartError::io("withdrawing the socket")(e)),
            _ => Ok(()),
        }
    }

    /// From inside the Domain's PID namespace, where runsc's recorded PIDs
    /// mean what they say. Killing the container's first process before
    /// `delete --force` takes ~75 ms instead of ~135 ms (runsc 20240729).
    /// Orphans (gofer, sandbox) are reaped by PID 1.
    fn delete_sandbox(&mut self, sandbox: Sandbox) -> Result<(), StartError> {
        let _ = sandbox.runsc.kill(&sandbox.container, libc::SIGKILL, false);
        let deleted = sandbox.runsc.delete(&sandbox.container);
        cgroup::remove(&sandbox.cgroups_path);
        Ok(deleted?)
    }

    fn stop_sidecar(&mut self, net: Network) -> Result<(), StartError> {
        // The resolver's threads (one inside the sidecar) go first.
        let resolver = net.resolver.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(resolver) = resolver {
            resolver.stop();
        }
        match Arc::try_unwrap(net.topology) {
            Ok(topology) => Ok(network::tear_down(topology, &net.record)?),
            Err(_) => {
                // A bug: something still holds the topology. Its last holder
                // removes the links on drop; the NAT table is recovered by
                // the next start through the record, which stays.
                Err(StartError::Io {
                    context: "tearing down the sidecar".into(),
                    source: std::io::Error::other("its topology is still in use"),
                })
            }
        }
    }

    fn destroy_trust_anchor(&mut self, trust: Arc<TrustAnchor>) -> Result<(), StartError> {
        Ok(trust.destroy()?)
    }

    fn unmount_filesystem(&mut self, fs_: Filesystem) -> Result<(), StartError> {
        unmount_all(&fs_.0.mountpoints)
    }

    fn remove_run_dir(&mut self, run: RunDir) -> Result<(), StartError> {
        match fs::remove_dir_all(run.path()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StartError::io(format!("removing {}", run.path().display()))(e)),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_init_command_only_reaps_and_sleeps() {
        let cmd = super::init_command();
        assert_eq!(cmd[0], "/bin/sh");
        assert!(cmd[2].contains("wait"));
    }

    #[test]
    fn a_program_interpreter_marks_a_dynamic_executable() {
        // The test binary itself is dynamically linked; a static one has
        // no PT_INTERP. Build minimal ELF headers for both cases.
        let me = std::fs::read(std::env::current_exe().expect("exe")).expect("read");
        assert_eq!(super::interpreter_of(&me), Ok(true));
        let elf = |p_type: u32| {
            let mut e = vec![0u8; 0x40 + 0x38];
            e[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
            e[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes());
            e[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes());
            e[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
            e[0x40..0x44].copy_from_slice(&p_type.to_le_bytes());
            e
        };
        assert_eq!(super::interpreter_of(&elf(1)), Ok(false));
        assert_eq!(super::interpreter_of(&elf(3)), Ok(true));
        assert!(super::interpreter_of(b"#!/bin/sh\n").is_err());
        let mut cut = elf(1);
        cut.truncate(0x42);
        assert!(super::interpreter_of(&cut).is_err());
    }
}
