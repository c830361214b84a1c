//! Finding, checking and driving the `runsc` binary.
//!
//! Every call passes the same global flags (state root, platform, overlay,
//! network), so that `create`, `start`, `kill` and `delete` of one container
//! always agree about where its state lives and how it was built.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The oldest runsc release Lazaret runs with. Debian 12's own package
/// (0.0~20221219) cannot run bookworm's `ls` (statx returns EINVAL) and has a
/// broken netstack; Debian 13's 0.0~20240729 is the one we test against.
pub const MIN_RELEASE: u32 = 20240729;

/// The gVisor platform (how the sandbox intercepts system calls).
///
/// Also the value of the configuration's `[runsc] platform` key: it
/// serialises as its flag name (`"systrap"`, `"ptrace"`, `"kvm"`), which the
/// Configuration Fingerprint hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    /// seccomp-based interception; the default and the fastest without KVM.
    #[default]
    Systrap,
    /// ptrace-based interception; slow but works everywhere.
    Ptrace,
    /// KVM (hangs on nested-virtualisation hosts, see docs/platform.md).
    Kvm,
}

impl Platform {
    /// The name runsc's `--platform` flag takes.
    pub fn as_flag(self) -> &'static str {
        match self {
            Platform::Systrap => "systrap",
            Platform::Ptrace => "ptrace",
            Platform::Kvm => "kvm",
        }
    }

    /// The platform whose [`Platform::as_flag`] name is `name`, if any.
    pub fn from_flag(name: &str) -> Option<Platform> {
        [Platform::Systrap, Platform::Ptrace, Platform::Kvm].into_iter().find(|platform| platform.as_flag() == name)
    }
}

/// How the sandbox gets a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkMode {
    /// Loopback only (`--network=none`).
    #[default]
    None,
    /// gVisor's netstack over the interfaces of the network namespace named in
    /// the bundle (`--network=sandbox`). Never `host`: root inside could then
    /// change the real namespace.
    Sandbox,
}

/// Errors from locating or running runsc.
#[derive(Debug, thiserror::Error)]
pub enum RunscError {
    /// No runsc at the configured path or on PATH.
    #[error(
        "runsc not found (looked {searched}); install it with `scripts/install-runsc.sh` (Debian 13's runsc, which runs on Debian 12) or set `[runsc] path` in the configuration"
    )]
    NotFound {
        /// Where we looked.
        searched: String,
    },
    /// `runsc --version` printed something we cannot read.
    #[error("cannot read the version of {path}: {output:?}; is this really runsc?")]
    UnknownVersion {
        /// The binary.
        path: PathBuf,
        /// What it printed.
        output: String,
    },
    /// The runsc is older than [`MIN_RELEASE`].
    #[error(
        "{path} is runsc release {release}, too old to run modern images (Lazaret needs {min} or newer; Debian 12's own package is 20221219); install Debian 13's runsc with `scripts/install-runsc.sh` or set `[runsc] path`"
    )]
    TooOld {
        /// The binary.
        path: PathBuf,
        /// Its release date.
        release: u32,
        /// The oldest we accept.
        min: u32,
    },
    /// A flag Lazaret relies on is missing from this build.
    #[error("{path} lacks the `--{flag}` flag that Lazaret needs; install a newer runsc with `scripts/install-runsc.sh`")]
    MissingFeature {
        /// The binary.
        path: PathBuf,
        /// The missing flag.
        flag: &'static str,
    },
    /// No cgroup file system where runsc makes each container's cgroup.
    #[error(
        "there is no cgroup file system at {path} in this mount namespace, and runsc needs one to start a sandbox; under `ip netns exec`, which mounts a fresh /sys without it, run Lazaret with `nsenter --net=/run/netns/NAME` instead; otherwise mount the cgroup hierarchy (systemd does this at boot)"
    )]
    NoCgroups {
        /// Where runsc looks.
        path: PathBuf,
    },
    /// A runsc subcommand exited non-zero.
    #[error("`runsc {subcommand} {container}` failed ({status}): {stderr}")]
    Failed {
        /// Which subcommand.
        subcommand: &'static str,
        /// Which container.
        container: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// runsc's own messages: the tail (at most [`MESSAGE_TAIL_BYTES`])
        /// of its stderr or, for `create`, of its log file, made safe to
        /// print; never empty.
        stderr: String,
    },
    /// The debug log directory could be read by someone other than root.
    #[error("runsc debug log directory {}: {problem}; runsc writes every container's spec and every exec'd process (the agent's environment, secrets included) there\n  hint: `sudo chown root: {dir} && sudo chmod 700 {dir}`, or remove `debug_log_dir` from [runsc]", dir.display(), dir = .dir.display())]
    DebugLogDirUnsafe {
        /// The directory.
        dir: PathBuf,
        /// Its owner or mode.
        problem: String,
    },
    /// An I/O error around a runsc call.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Creates the debug log directory (root's, 0700) or checks that it is
/// root's and closed to everyone else: runsc's debug logs hold container
/// specs and exec'd processes, environment included.
/// Where runsc creates each container's cgroup (its `cgroupsPath` below
/// this, v1 and v2 alike).
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Whether `root` holds a cgroup hierarchy runsc can use: the unified (v2)
/// file system itself, or v1 controller directories (a tmpfs with
/// `memory/`). Checked up front because runsc's own failure names a v1
/// directory (`stat /sys/fs/cgroup/blkio`) and says nothing of why.
fn cgroups_mounted(root: &Path) -> bool {
    let unified = nix::sys::statfs::statfs(root).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC);
    unified || root.join("memory").join("cgroup.procs").is_file()
}

fn prepare_debug_log_dir(dir: &Path) -> Result<(), RunscError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(RunscError::Io { context: format!("creating runsc debug log directory {}", dir.display()), source: e }),
    }
    let metadata = std::fs::symlink_metadata(dir).map_err(io_err(format!("inspecting {}", dir.display())))?;
    debug_log_dir_problem(metadata.is_dir(), metadata.uid(), metadata.mode())
        .map_or(Ok(()), |problem| Err(RunscError::DebugLogDirUnsafe { dir: dir.to_path_buf(), problem }))
}

/// What is wrong with a debug log directory of that type, owner and mode.
fn debug_log_dir_problem(is_dir: bool, uid: u32, mode: u32) -> Option<String> {
    if !is_dir {
        Some("not a directory (a symlink is not followed)".into())
    } else if uid != 0 {
        Some(format!("owned by uid {uid}, not root"))
    } else if mode & 0o077 != 0 {
        Some(format!("mode {:o}: open to group or others", mode & 0o7777))
    } else {
        None
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> RunscError {
    let context = context.into();
    move |source| RunscError::Io { context, source }
}

/// How much of runsc's own messages a [`RunscError::Failed`] carries.
pub const MESSAGE_TAIL_BYTES: usize = 4096;

/// The file `runsc create` logs to (`--log`): `runsc-create.log` in the
/// bundle directory. runsc writes its error there as well as on stderr,
/// which for `create` is the coordinator's log, not the developer's terminal.
pub fn create_log_path(bundle: &Path) -> PathBuf {
    bundle.join("runsc-create.log")
}

/// What a runsc binary is and can do.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunscInfo {
    /// The binary.
    pub path: PathBuf,
    /// First line of `runsc --version`.
    pub version: String,
    /// Release date as YYYYMMDD.
    pub release: u32,
    /// Has the systrap platform.
    pub systrap: bool,
    /// Has `--overlay2`.
    pub overlay2: bool,
    /// Has `--host-uds`.
    pub host_uds: bool,
    /// Has `--directfs`.
    pub directfs: bool,
}

impl RunscInfo {
    /// Whether `runsc start`/`run` with `--network=sandbox` must run with a
    /// tmpfs over `/proc/sys/net`: releases up to 20240729 mistake any netns
    /// for the root one on kernels >= 6 (gVisor issue 10704).
    pub fn needs_netns_workaround(&self, kernel_major: u32) -> bool {
        self.release <= 20240729 && kernel_major >= 6
    }
}

/// Reads the release date out of `runsc --version` output. Accepts upstream
/// (`runsc version release-20240729.0`) and Debian (`runsc version
/// 0.0~20240729.0`) spellings.
pub fn parse_release(version_output: &str) -> Option<u32> {
    let line = version_output.lines().next()?;
    let rest = line.strip_prefix("runsc version ")?.trim();
    let rest = rest.strip_prefix("release-").or_else(|| rest.strip_prefix("0.0~")).unwrap_or(rest);
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    if digits.len() != 8 {
        return None;
    }
    digits.parse().ok()
}

/// Settings that are the same for every runsc call of one Domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunscOptions {
    /// The configured binary, if any; otherwise PATH is searched.
    pub path: Option<PathBuf>,
    /// runsc's `--root`: the Domain's container state directory.
    pub state_root: PathBuf,
    /// The platform.
    pub platform: Platform,
    /// The network mode.
    pub network: NetworkMode,
    /// Directory for runsc debug logs, if wanted.
    pub debug_log_dir: Option<PathBuf>,
    /// Where to remember what [`Runsc::probe`] found (a file in a
    /// root-owned directory), so that every start does not run runsc twice
    /// (~50 ms). The entry is keyed by the binary's path, device, inode,
    /// size and modification time, so replacing runsc invalidates it.
    pub probe_cache: Option<PathBuf>,
}

/// A located and checked runsc, with the global flags of one Domain.
#[derive(Debug, Clone)]
pub struct Runsc {
    info: RunscInfo,
    opts: RunscOptions,
}

impl Runsc {
    /// Finds runsc: the configured path, else the first `runsc` on PATH.
    pub fn locate(configured: Option<&Path>) -> Result<PathBuf, RunscError> {
        if let Some(p) = configured {
            return if is_executable(p) {
                Ok(p.to_path_buf())
            } else {
                Err(RunscError::NotFound { searched: format!("at the configured path {}", p.display()) })
            };
        }
        let path_var =
            std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"));
        for dir in std::env::split_paths(&path_var) {
            let candidate = dir.join("runsc");
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
        Err(RunscError::NotFound { searched: format!("on PATH={}", path_var.to_string_lossy()) })
    }

    /// Runs `runsc --version` and `runsc flags` to learn what a binary is.
    pub fn probe(path: &Path) -> Result<RunscInfo, RunscError> {
        let out = Command::new(path)
            .arg("--version")
            .stdin(Stdio::null())
            .output()
            .map_err(io_err(format!("running {} --version", path.display())))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let release = parse_release(&text).ok_or_else(|| RunscError::UnknownVersion { path: path.to_path_buf(), output: text.clone() })?;
        let flags =
            Command::new(path).arg("flags").stdin(Stdio::null()).output().map_err(io_err(format!("running {} flags", path.display())))?;
        let flags = String::from_utf8_lossy(&flags.stdout).into_owned() + &String::from_utf8_lossy(&flags.stderr);
        let has = |f: &str| flags.lines().any(|l| l.trim_start().starts_with(&format!("-{f} ")) || l.trim() == format!("-{f}"));
        Ok(RunscInfo {
            path: path.to_path_buf(),
            version: text.lines().next().unwrap_or_default().to_string(),
            release,
            systrap: flags.contains("systrap"),
            overlay2: has("overlay2"),
            host_uds: has("host-uds"),
            directfs: has("directfs"),
        })
    }

    /// [`Runsc::probe`] through a cache file (see
    /// [`RunscOptions::probe_cache`]). A missing, unreadable or stale entry
    /// means probing again; failing to write the cache is not an error.
    pub fn probe_cached(path: &Path, cache: &Path) -> Result<RunscInfo, RunscError> {
        let key = binary_key(path).map_err(io_err(format!("inspecting {}", path.display())))?;
        if let Ok(text) = std::fs::read_to_string(cache) {
            if let Ok(entry) = serde_json::from_str::<ProbeCacheEntry>(&text) {
                if entry.key == key {
                    return Ok(entry.info);
                }
            }
        }
        let info = Self::probe(path)?;
        let entry = ProbeCacheEntry { key, info: info.clone() };
        if let Ok(text) = serde_json::to_string(&entry) {
            // Written whole, then renamed: a reader never sees half an entry.
            let tmp = cache.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, text).is_ok() && std::fs::rename(&tmp, cache).is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
        }
        Ok(info)
    }

    /// Locates and probes runsc and refuses one that is too old or lacks a
    /// feature Lazaret relies on.
    pub fn new(opts: RunscOptions) -> Result<Runsc, RunscError> {
        if let Some(dir) = &opts.debug_log_dir {
            prepare_debug_log_dir(dir)?;
        }
        let path = Self::locate(opts.path.as_deref())?;
        if !cgroups_mounted(Path::new(CGROUP_ROOT)) {
            return Err(RunscError::NoCgroups { path: PathBuf::from(CGROUP_ROOT) });
        }
        let info = match &opts.probe_cache {
            Some(cache) => Self::probe_cached(&path, cache)?,
            None => Self::probe(&path)?,
        };
        Self::check(&info, &opts)?;
        Ok(Runsc { info, opts })
    }

    /// The acceptance rules, separate from probing so they can be tested.
    pub fn check(info: &RunscInfo, opts: &RunscOptions) -> Result<(), RunscError> {
        if info.release < MIN_RELEASE {
            return Err(RunscError::TooOld { path: info.path.clone(), release: info.release, min: MIN_RELEASE });
        }
        if !info.overlay2 {
            return Err(RunscError::MissingFeature { path: info.path.clone(), flag: "overlay2" });
        }
        if opts.platform == Platform::Systrap && !info.systrap {
            return Err(RunscError::MissingFeature { path: info.path.clone(), flag: "platform=systrap" });
        }
        Ok(())
    }

    /// What was probed.
    pub fn info(&self) -> &RunscInfo {
        &self.info
    }

    /// The global flags, identical on every call.
    pub fn global_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "--root".into(),
            self.opts.state_root.clone().into_os_string(),
            format!("--platform={}", self.opts.platform.as_flag()).into(),
            // Rootfs writes stay in sandbox memory: the rootfs directory we
            // hand over is a per-run overlay anyway, and `root:self` would
            // leave a filestore that `delete` from another mount namespace
            // cannot remove. Never `all:*`: it would swallow workspace writes.
            "--overlay2=root:memory".into(),
            match self.opts.network {
                NetworkMode::None => "--network=none".into(),
                NetworkMode::Sandbox => "--network=sandbox".into(),
            },
        ];
        if self.info.host_uds {
            args.push("--host-uds=none".into());
        }
        if let Some(dir) = &self.opts.debug_log_dir {
            let mut d = dir.clone().into_os_string();
            d.push("/");
            args.push("--debug".into());
            args.push("--debug-log".into());
            args.push(d);
        }
        args
    }

    fn command(&self, subcommand: &str) -> Command {
        let mut cmd = Command::new(&self.info.path);
        cmd.args(self.global_args()).arg(subcommand).stdin(Stdio::null());
        cmd
    }

    /// [`Runsc::command`] that also logs to `log` (`--log`, a global flag
    /// about where runsc writes, not about the container's state).
    fn command_logging_to(&self, subcommand: &str, log: &Path) -> Command {
        let mut cmd = Command::new(&self.info.path);
        cmd.args(self.global_args()).arg("--log").arg(log).arg(subcommand).stdin(Stdio::null());
        cmd
    }

    fn run_quiet(&self, mut cmd: Command, subcommand: &'static str, container: &str) -> Result<String, RunscError> {
        let out = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).output().map_err(io_err(format!("running runsc {subcommand}")))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(RunscError::Failed {
                subcommand,
                container: container.to_string(),
                status: out.status,
                stderr: messages_or_silence(&out.stderr, "on stderr"),
            })
        }
    }

    /// `runsc create`: builds the sandbox, paused before the container's
    /// first process runs, with the caller's stdio. Writes the sandbox PID
    /// to `pid_file`. runsc also logs to [`create_log_path`] of `bundle`; a
    /// failure carries the tail of that log (runsc's own message).
    pub fn create(&self, id: &str, bundle: &Path, pid_file: &Path) -> Result<(), RunscError> {
        let log = create_log_path(bundle);
        // runsc appends; a message left by an earlier attempt must not be
        // taken for this one's.
        match std::fs::remove_file(&log) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(format!("removing {}", log.display()))(e)),
            _ => {}
        }
        let mut cmd = self.command_logging_to("create", &log);
        cmd.arg("--bundle").arg(bundle).arg("--pid-file").arg(pid_file);
        // The sandbox keeps runsc create's stdio as the container's first
        // process's, which the agent (as root) can write through
        // /proc/1/fd: never the caller's (the coordinator's are its log, a
        // host file: tests/tests/escape_fds.rs), never a pipe to ourselves
        // (reading to EOF would hang). runsc's message therefore comes back
        // through its log file only.
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
        let status = cmd.arg(id).status().map_err(io_err("running runsc create"))?;
        if status.success() {
            return Ok(());
        }
        // (No log at all: runsc died before opening it.)
        let where_ = format!("in its log {} (its stderr is /dev/null)", log.display());
        let stderr = match read_tail(&log, 4 * MESSAGE_TAIL_BYTES) {
            Ok(bytes) => messages_or_silence(&bytes, &where_),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => messages_or_silence(b"", &where_),
            Err(e) => format!("runsc's log {} cannot be read ({e})", log.display()),
        };
        Err(RunscError::Failed { subcommand: "create", container: id.to_string(), status, stderr })
    }

    /// `runsc start`. With `netns_workaround`, runs in a private mount
    /// namespace of a dedicated thread with a tmpfs over `/proc/sys/net`.
    pub fn start(&self, id: &str, netns_workaround: bool) -> Result<(), RunscError> {
        let mut cmd = self.command("start");
        cmd.arg(id);
        if !netns_workaround {
            return self.run_quiet(cmd, "start", id).map(|_| ());
        }
        let this = self.clone();
        let id_owned = id.to_string();
        std::thread::scope(|s| {
            s.spawn(move || -> Result<(), RunscError> {
                hide_proc_sys_net_on_this_thread().map_err(io_err("setting up the /proc/sys/net work-around"))?;
                this.run_quiet(cmd, "start", &id_owned).map(|_| ())
            })
            .join()
            .unwrap_or_else(|_| Err(RunscError::Io { context: "runsc start thread".into(), source: std::io::Error::other("panicked") }))
        })
    }

    /// `runsc kill [--all] ID SIGNAL`.
    pub fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), RunscError> {
        let mut cmd = self.command("kill");
        if all {
            cmd.arg("--all");
        }
        cmd.arg(id).arg(signal.to_string());
        self.run_quiet(cmd, "kill", id).map(|_| ())
    }

    /// `runsc delete --force ID`: stops whatever still runs and removes the
    /// container's state. Deleting a container that does not exist is not an
    /// error.
    pub fn delete(&self, id: &str) -> Result<(), RunscError> {
        let mut cmd = self.command("delete");
        cmd.arg("--force").arg(id);
        match self.run_quiet(cmd, "delete", id) {
            Ok(_) => Ok(()),
            Err(RunscError::Failed { ref stderr, .. }) if stderr.contains("does not exist") || stderr.contains("not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// `runsc exec` of the process spec `process_json` (`process.json`'s
    /// text) in container `id`, with `stdio` as its stdin, stdout and
    /// stderr and each of `extra` passed as the given descriptor number
    /// inside (`--pass-fd`). The spec (with the agent's environment,
    /// secrets included) is written to an anonymous memory file (memfd)
    /// that only this child inherits, read by runsc as `--process
    /// /proc/self/fd/N`: it is never on disk or on a command line. The
    /// child starts with exactly its stdio, the memfd and `extra`, whatever
    /// else this process has open.
    ///
    /// With `on_terminal` (stdin is a PTY slave), the child leads a new
    /// session with that PTY as its controlling terminal: the kernel then
    /// signals it when the PTY's window size changes (SIGWINCH), for the
    /// terminal's keys and when the master is closed (SIGHUP), and runsc
    /// forwards each signal to the foreground process group inside.
    pub fn exec(
        &self,
        id: &str,
        process_json: &[u8],
        internal_pid_file: &Path,
        stdio: [std::os::fd::OwnedFd; 3],
        extra: Vec<(std::os::fd::OwnedFd, i32)>,
        on_terminal: bool,
    ) -> Result<std::process::Child, RunscError> {
        use nix::sys::memfd::{MFdFlags, memfd_create};
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let memfd = memfd_create(c"lazaret-process", MFdFlags::MFD_CLOEXEC)
            .map_err(|e| RunscError::Io { context: "creating the process spec's memory file".into(), source: e.into() })?;
        let mut spec = std::fs::File::from(memfd);
        spec.write_all(process_json).map_err(io_err("writing the process spec's memory file"))?;
        // runsc's own failure to start the process is told from the agent's
        // status by its log (crate::execfail); with --debug, the debug log
        // has it and this log would get the process spec, secrets included.
        let mut cmd = match self.opts.debug_log_dir {
            None => {
                let log = crate::execfail::exec_log_path(internal_pid_file);
                let _ = std::fs::remove_file(&log);
                self.command_logging_to("exec", &log)
            }
            Some(_) => self.command("exec"),
        };
        // Duplicates are close-on-exec and numbered 3 or more.
        let mut kept = Vec::new();
        for (fd, guest) in &extra {
            let dup = fd.try_clone().map_err(io_err("duplicating a descriptor for runsc exec"))?;
            cmd.arg("--pass-fd").arg(format!("{}:{guest}", dup.as_raw_fd()));
            kept.push(dup);
        }
        cmd.arg("--process").arg(format!("/proc/self/fd/{}", spec.as_raw_fd())).arg("--internal-pid-file").arg(internal_pid_file).arg(id);
        let [stdin, stdout, stderr] = stdio;
        cmd.stdin(Stdio::from(stdin)).stdout(Stdio::from(stdout)).stderr(Stdio::from(stderr));
        let passed: Vec<_> = kept.iter().map(|f| f.as_raw_fd()).chain([spec.as_raw_fd()]).collect();
        crate::sys::only_these_in_child(&mut cmd, passed).map_err(io_err("passing descriptors to runsc exec"))?;
        if on_terminal {
            crate::sys::controlling_terminal_in_child(&mut cmd);
        }
        let child = cmd.spawn().map_err(io_err("running runsc exec"));
        // The child has its own copies; ours close here.
        drop(kept);
        drop(extra);
        drop(spec);
        child
    }

    /// `runsc kill --pid PID ID SIGNAL`: signals one process of the sandbox
    /// (a PID of the sandbox's root PID namespace, as `exec` writes it).
    pub fn kill_process(&self, id: &str, pid: i32, signal: i32) -> Result<(), RunscError> {
        let mut cmd = self.command("kill");
        cmd.arg("--pid").arg(pid.to_string()).arg(id).arg(signal.to_string());
        self.run_quiet(cmd, "kill", id).map(|_| ())
    }

    /// `runsc ps ID`: (PID, parent PID) of every process in the container,
    /// PIDs of the sandbox's root PID namespace.
    pub fn processes(&self, id: &str) -> Result<Vec<(i32, i32)>, RunscError> {
        let mut cmd = self.command("ps");
        cmd.arg(id);
        let out = self.run_quiet(cmd, "ps", id)?;
        Ok(parse_ps(&out))
    }

    /// IDs of the containers under this state root.
    pub fn list(&self) -> Result<Vec<String>, RunscError> {
        if !self.opts.state_root.exists() {
            return Ok(Vec::new());
        }
        let mut cmd = self.command("list");
        cmd.arg("--quiet");
        let out = self.run_quiet(cmd, "list", "")?;
        Ok(out.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect())
    }
}

/// Parses `runsc ps`'s table (UID PID PPID ...) into (PID, PPID) pairs.
pub fn parse_ps(table: &str) -> Vec<(i32, i32)> {
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut cols = l.split_whitespace().skip(1);
            Some((cols.next()?.parse().ok()?, cols.next()?.parse().ok()?))
        })
        .collect()
}

/// `root` and all its descendants in `processes` ((PID, PPID) pairs).
pub fn descendants(processes: &[(i32, i32)], root: i32) -> Vec<i32> {
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        for &(pid, ppid) in processes {
            if ppid == parent && !found.contains(&pid) {
                found.push(pid);
            }
        }
        i += 1;
    }
    found
}

/// Enters a private mount namespace on the calling thread only and mounts a
/// tmpfs over /proc/sys/net there (docs/platform.md, gVisor issue 10704).
fn hide_proc_sys_net_on_this_thread() -> std::io::Result<()> {
    crate::sys::enter_private_mount_namespace_on_this_thread()?;
    crate::sys::mount_empty_tmpfs("/proc/sys/net")?;
    Ok(())
}

/// What identifies one runsc binary on disk, for the probe cache.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct BinaryKey {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct ProbeCacheEntry {
    key: BinaryKey,
    info: RunscInfo,
}

fn binary_key(path: &Path) -> std::io::Result<BinaryKey> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok(BinaryKey {
        path: path.to_path_buf(),
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false)
}

/// The whole lines among the last `max` bytes of a file (all of it when
/// shorter; a line cut by the limit is dropped). The file lives in a
/// root-only directory; a symlink there is still not followed.
fn read_tail(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(path)?;
    let len = file.metadata()?.len();
    let max = u64::try_from(max).unwrap_or(u64::MAX);
    let start = len.saturating_sub(max);
    file.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::new();
    file.take(max).read_to_end(&mut buf)?;
    if start > 0 {
        let first_line_end = buf.iter().position(|b| *b == b'\n').map_or(buf.len(), |i| i + 1);
        buf.drain(..first_line_end);
    }
    Ok(buf)
}

/// [`runsc_messages`], or a sentence saying that runsc printed nothing
/// `where_` (so an error never ends in an empty or misleading message).
fn messages_or_silence(output: &[u8], where_: &str) -> String {
    let messages = runsc_messages(output);
    if messages.is_empty() { format!("runsc printed no message {where_}") } else { messages }
}

/// runsc's own messages out of what it printed or logged, newest last, at
/// most [`MESSAGE_TAIL_BYTES`] (older lines are dropped first, and a line cut
/// by the limit is dropped whole). `--log` writes JSON records
/// (`{"msg":"…","level":"error","time":"…"}`, one per line or back to back):
/// their `msg` is taken, prefixed with the level unless it is `error`; other
/// text is taken as it is.
/// Control and bidirectional-formatting characters are escaped: a message can
/// quote workspace paths, which the agent names, and it ends up on the
/// developer's terminal.
pub fn runsc_messages(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let mut lines: Vec<String> = Vec::new();
    for raw in text.lines() {
        line_messages(raw, &mut lines);
    }
    let mut kept: Vec<String> = Vec::new();
    let mut size = 0;
    for line in lines.into_iter().rev() {
        let cost = line.len() + usize::from(!kept.is_empty());
        if size + cost > MESSAGE_TAIL_BYTES {
            if kept.is_empty() {
                // A single line longer than the limit: keep its end.
                kept.push(format!("…{}", tail_chars(&line, MESSAGE_TAIL_BYTES - '…'.len_utf8())));
            }
            break;
        }
        size += cost;
        kept.push(line);
    }
    kept.reverse();
    kept.join("\n")
}

/// The messages of one line of runsc output into `out`: JSON log records
/// (runsc's sandbox and gofer write several back to back, without
/// newlines) give their `msg`, one line per line of it; text, and whatever
/// follows the last record that parses, is taken as it is.
fn line_messages(raw: &str, out: &mut Vec<String>) {
    let mut push = |s: &str| {
        let s = s.trim();
        if !s.is_empty() {
            out.push(printable(s));
        }
    };
    let mut records = serde_json::Deserializer::from_str(raw).into_iter::<serde_json::Value>();
    loop {
        let start = records.byte_offset();
        match records.next() {
            None => break,
            Some(Ok(serde_json::Value::Object(fields))) => match fields.get("msg").and_then(|m| m.as_str()) {
                Some(msg) => {
                    let level = fields.get("level").and_then(|l| l.as_str()).filter(|l| *l != "error");
                    for (i, part) in msg.lines().map(str::trim).filter(|p| !p.is_empty()).enumerate() {
                        match level {
                            Some(level) if i == 0 => push(&format!("{level}: {part}")),
                            _ => push(part),
                        }
                    }
                }
                None => push(raw.get(start..records.byte_offset()).unwrap_or_default()),
            },
            Some(_) => {
                push(raw.get(start..).unwrap_or_default());
                break;
            }
        }
    }
}

/// The longest suffix of `s` of at most `max` bytes that starts on a
/// character boundary.
fn tail_chars(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

/// `s` with control characters (tab excepted) and Unicode bidirectional
/// formatting characters replaced by `\u{…}` escapes.
fn printable(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let bidi = matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        if (c.is_control() && c != '\t') || bidi {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// Reads a host PID written by `runsc --pid-file` (a PID of the caller's
/// PID namespace; 0 and 1 are refused).
pub fn read_pid_file(path: &Path) -> std::io::Result<nix::unistd::Pid> {
    let text = std::fs::read_to_string(path)?;
    let pid: i32 = text
        .trim()
        .parse()
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} holds no PID: {text:?}", path.display())))?;
    if pid <= 1 {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{} holds PID {pid}", path.display())));
    }
    Ok(nix::unistd::Pid::from_raw(pid))
}

/// The running kernel's major version, for [`RunscInfo::needs_netns_workaround`].
pub fn kernel_major() -> u32 {
    nix::sys::utsname::uname()
        .ok()
        .and_then(|u| u.release().to_str().and_then(|r| r.split('.').next()).and_then(|m| m.parse().ok()))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_names_round_trip_and_serialise_as_flags() {
        for platform in [Platform::Systrap, Platform::Ptrace, Platform::Kvm] {
            assert_eq!(Platform::from_flag(platform.as_flag()), Some(platform));
            assert_eq!(serde_json::to_string(&platform).expect("serialise"), format!("\"{}\"", platform.as_flag()));
        }
        assert_eq!(Platform::from_flag("firecracker"), None);
        assert_eq!(Platform::from_flag("Systrap"), None);
    }

    #[test]
    fn debug_logs_go_only_to_a_root_only_directory() {
        assert_eq!(debug_log_dir_problem(true, 0, 0o40700), None);
        assert!(debug_log_dir_problem(true, 0, 0o40755).expect("755").contains("mode 755"));
        assert!(debug_log_dir_problem(true, 1000, 0o40700).expect("uid").contains("uid 1000"));
        assert!(debug_log_dir_problem(false, 0, 0o120777).expect("link").contains("not a directory"));
    }

    #[test]
    fn ps_tables_give_process_trees() {
        let table = "UID PID PPID C TTY STIME TIME CMD\n0 1 0 1 ? 10:16 20ms sh\n0 2 1 3 ? 10:16 20ms sleep\n0 3 0 1 ? 10:16 20ms sh\n0 4 3 1 ? 10:16 20ms sleep\n0 6 4 1 ? 10:16 20ms sleep\n";
        let ps = parse_ps(table);
        assert_eq!(ps.len(), 5);
        assert_eq!(descendants(&ps, 3), vec![3, 4, 6]);
        assert_eq!(descendants(&ps, 9), vec![9]);
    }

    #[test]
    fn parses_debian_and_upstream_versions() {
        assert_eq!(parse_release("runsc version 0.0~20240729.0\nspec: 1.2.0\n"), Some(20240729));
        assert_eq!(parse_release("runsc version release-20250310.0\nspec: 1.1.0"), Some(20250310));
        assert_eq!(parse_release("runsc version 0.0~20221219.0"), Some(20221219));
        assert_eq!(parse_release("runc version 1.1.5"), None);
        assert_eq!(parse_release("runsc version 2024"), None);
        assert_eq!(parse_release(""), None);
    }

    fn info(release: u32) -> RunscInfo {
        RunscInfo {
            path: "/x/runsc".into(),
            version: String::new(),
            release,
            systrap: true,
            overlay2: true,
            host_uds: true,
            directfs: true,
        }
    }

    fn opts() -> RunscOptions {
        RunscOptions {
            path: None,
            state_root: "/run/x".into(),
            platform: Platform::Systrap,
            network: NetworkMode::None,
            debug_log_dir: None,
            probe_cache: None,
        }
    }

    #[test]
    fn refuses_debian_12_runsc_with_a_fix() {
        let err = Runsc::check(&info(20221219), &opts()).expect_err("Debian 12's runsc must be refused");
        assert!(matches!(err, RunscError::TooOld { release: 20221219, .. }));
        assert!(err.to_string().contains("install-runsc.sh"), "{err}");
        assert!(Runsc::check(&info(20240729), &opts()).is_ok());
        let mut no_overlay = info(20250101);
        no_overlay.overlay2 = false;
        assert!(matches!(Runsc::check(&no_overlay, &opts()), Err(RunscError::MissingFeature { flag: "overlay2", .. })));
    }

    #[test]
    fn workaround_only_for_old_builds_on_new_kernels() {
        assert!(info(20240729).needs_netns_workaround(6));
        assert!(!info(20240729).needs_netns_workaround(5));
        assert!(!info(20250101).needs_netns_workaround(6));
    }

    #[test]
    fn cgroups_are_found_only_where_a_hierarchy_is_mounted() {
        // A plain directory (what a fresh sysfs shows under `ip netns
        // exec`) is no hierarchy, not even with an empty `memory/`.
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(!cgroups_mounted(dir.path()));
        std::fs::create_dir(dir.path().join("memory")).expect("mkdir");
        assert!(!cgroups_mounted(dir.path()));
        assert!(!cgroups_mounted(&dir.path().join("missing")));
    }

    #[test]
    fn global_flags_are_explicit() {
        let r = Runsc { info: info(20240729), opts: opts() };
        let args: Vec<String> = r.global_args().iter().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["--root", "/run/x", "--platform=systrap", "--overlay2=root:memory", "--network=none", "--host-uds=none"]);
    }

    #[test]
    fn probe_cache_is_used_until_the_binary_changes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("runsc");
        let count = dir.path().join("count");
        let script = |release: &str| {
            format!(
                "#!/bin/sh\necho x >> {}\n[ \"$1\" = --version ] && echo 'runsc version 0.0~{release}.0'\n[ \"$1\" = flags ] && echo '  -overlay2 value'\nexit 0\n",
                count.display()
            )
        };
        std::fs::write(&bin, script("20240729")).expect("write");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let cache = dir.path().join("probe.json");
        let calls = || std::fs::read_to_string(&count).map(|s| s.lines().count()).unwrap_or(0);
        assert_eq!(Runsc::probe_cached(&bin, &cache).expect("probe").release, 20240729);
        assert_eq!(calls(), 2, "first probe runs --version and flags");
        assert_eq!(Runsc::probe_cached(&bin, &cache).expect("cached").release, 20240729);
        assert_eq!(calls(), 2, "a cached probe runs nothing");
        // Replacing the binary (new inode and size) invalidates the entry.
        let replacement = dir.path().join("runsc.new");
        std::fs::write(&replacement, script("20250101") + "\n").expect("write");
        std::fs::set_permissions(&replacement, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::rename(&replacement, &bin).expect("rename");
        assert_eq!(Runsc::probe_cached(&bin, &cache).expect("reprobe").release, 20250101);
        assert_eq!(calls(), 4);
    }

    #[test]
    fn log_lines_become_runsc_messages() {
        let log = b"{\"msg\":\"loading sandbox\",\"level\":\"warning\",\"time\":\"t\"}\n{\"msg\":\"creating container: cannot mount /home/dev/src/project\\n\",\"level\":\"error\",\"time\":\"t\"}\n";
        assert_eq!(runsc_messages(log), "warning: loading sandbox\ncreating container: cannot mount /home/dev/src/project");
        // Plain stderr (and JSON without `msg`) is taken as it is.
        assert_eq!(runsc_messages(b"\n  first\n{\"level\":\"error\"}\nlast  \n\n"), "first\n{\"level\":\"error\"}\nlast");
        assert_eq!(runsc_messages(b""), "");
        assert_eq!(messages_or_silence(b" \n\n", "on stderr"), "runsc printed no message on stderr");
        assert_eq!(messages_or_silence(b"boom\n", "on stderr"), "boom");
    }

    /// What runsc 20240729 really logged when a workspace's mount point was
    /// missing (issue 14): records back to back, one message spanning lines.
    #[test]
    fn concatenated_log_records_are_split() {
        let log = br#"{"msg":"Failure to resolve mounts: no such file or directory","level":"error","time":"2026-12-01T17:56:01.400040677Z"}{"msg":"Error reading mounts file: error unmarshaling mounts: unexpected end of JSON input\nJSON bytes:\n","level":"error","time":"2026-12-01T17:56:01.489183165Z"}{"msg":"creating container: cannot create sandbox: cannot read client sync file: waiting for sandbox to start: EOF","level":"error","time":"2026-12-01T17:56:01.507363788Z"}"#;
        assert_eq!(
            runsc_messages(log),
            "Failure to resolve mounts: no such file or directory\nError reading mounts file: error unmarshaling mounts: unexpected end of JSON input\nJSON bytes:\ncreating container: cannot create sandbox: cannot read client sync file: waiting for sandbox to start: EOF"
        );
        // Text after the last record, and records after text, are kept as text.
        assert_eq!(runsc_messages(br#"{"msg":"a"} trailing words"#), "a\ntrailing words");
        assert_eq!(runsc_messages(br#"12 apples {"msg":"b"}"#), "12 apples {\"msg\":\"b\"}");
    }

    #[test]
    fn messages_keep_the_newest_tail_within_the_limit() {
        let mut out = String::new();
        for i in 0..1000 {
            out.push_str(&format!("{{\"msg\":\"line {i:04}\",\"level\":\"error\"}}\n"));
        }
        let messages = runsc_messages(out.as_bytes());
        assert!(messages.len() <= MESSAGE_TAIL_BYTES, "{}", messages.len());
        assert!(messages.len() > MESSAGE_TAIL_BYTES - 10, "the limit is used: {}", messages.len());
        assert!(messages.ends_with("line 0999"), "newest last");
        assert!(messages.starts_with("line "), "no partial first line: {:?}", &messages[..20]);
        let lines: Vec<&str> = messages.lines().collect();
        assert_eq!(lines.len(), (MESSAGE_TAIL_BYTES + 1) / "line 0000\n".len());
        // One huge (multi-byte) line keeps its end, cut on a character boundary.
        let huge = format!("start {} end", "é".repeat(5000));
        let kept = runsc_messages(huge.as_bytes());
        assert!(kept.len() <= MESSAGE_TAIL_BYTES && kept.starts_with('…') && kept.ends_with("é end"), "{}", kept.len());
    }

    #[test]
    fn messages_cannot_drive_the_terminal() {
        let hostile = "mount /w/\u{1b}]0;pwned\u{7}x\u{202e}gpj.exe: no such file\r";
        let json = serde_json::json!({"msg": hostile, "level": "error"}).to_string();
        let shown = runsc_messages(json.as_bytes());
        assert_eq!(shown, "mount /w/\\u{1b}]0;pwned\\u{7}x\\u{202e}gpj.exe: no such file");
        assert!(!shown.chars().any(|c| c.is_control()), "{shown:?}");
    }

    #[test]
    fn log_tails_are_whole_lines_and_never_followed_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log");
        std::fs::write(&log, "aaaaaaaaaa\nbbbb\ncccc\n").expect("write");
        assert_eq!(read_tail(&log, 100).expect("read"), b"aaaaaaaaaa\nbbbb\ncccc\n");
        assert_eq!(read_tail(&log, 12).expect("read"), b"bbbb\ncccc\n", "the cut first line is dropped");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&log, &link).expect("symlink");
        let err = read_tail(&link, 100).expect_err("a symlink is not followed");
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
    }

    /// A runsc that fails `create` the way the real one does (exit 128, the
    /// error on stderr and as JSON in `--log`): the error carries runsc's
    /// own message, however the caller's stderr is redirected.
    #[test]
    fn failed_create_carries_runscs_message() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("runsc");
        let script = "#!/bin/sh\nlog=\nwhile [ $# -gt 0 ]; do [ \"$1\" = --log ] && { shift; log=$1; }; shift; done\n[ -n \"$log\" ] || exit 3\necho 'creating container: mount submount \"/home/dev/src/project\": no such file' >&2\nprintf '%s\\n' '{\"msg\":\"creating container: mount submount \\\"/home/dev/src/project\\\": no such file\",\"level\":\"error\",\"time\":\"t\"}' >> \"$log\"\nexit 128\n";
        std::fs::write(&bin, script).expect("write");
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let bundle = dir.path().join("bundle");
        std::fs::create_dir(&bundle).expect("bundle");
        // A message of an earlier attempt is not this one's.
        std::fs::write(create_log_path(&bundle), "{\"msg\":\"stale\",\"level\":\"error\"}\n").expect("stale log");
        let mut i = info(20240729);
        i.path = bin;
        let r = Runsc { info: i, opts: opts() };
        let err = r.create("c1", &bundle, &dir.path().join("pid")).expect_err("create fails");
        let RunscError::Failed { subcommand, status, ref stderr, .. } = err else { panic!("{err}") };
        assert_eq!((subcommand, status.code()), ("create", Some(128)));
        assert_eq!(stderr, "creating container: mount submount \"/home/dev/src/project\": no such file");
        let shown = err.to_string();
        assert!(shown.contains("no such file") && !shown.contains("above"), "{shown}");

        // Nothing logged: said so, naming the log.
        std::fs::write(dir.path().join("runsc"), "#!/bin/sh\nexit 1\n").expect("write");
        let err = r.create("c1", &bundle, &dir.path().join("pid")).expect_err("create fails");
        assert!(err.to_string().contains("runsc printed no message in its log") && err.to_string().contains("runsc-create.log"), "{err}");
    }

    #[test]
    fn locate_reports_a_missing_configured_path() {
        let err = Runsc::locate(Some(Path::new("/nonexistent/runsc"))).expect_err("a missing runsc must be reported");
        assert!(err.to_string().contains("/nonexistent/runsc"));
    }
}
