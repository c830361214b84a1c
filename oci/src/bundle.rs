//! OCI runtime bundles (`config.json`) for runsc.
//!
//! oci-spec's types start from defaults meant for a demo shell (hostname
//! "youki", args `["sh"]`, a default capability set, a read-only root), so
//! [`build_spec`] sets every security-relevant field explicitly instead of
//! relying on any of them.
//!
//! What every generated spec contains:
//! * new pid, ipc, uts, mount and network namespaces (the network one joined
//!   by path when [`BundleSpec::network_namespace`] is set: the sidecar's; a
//!   path that is the host's own network namespace is refused). No user or
//!   cgroup namespace entry: the container's processes run on gVisor's
//!   emulated kernel, and no host namespace path is ever written;
//! * `/proc`, `/dev` (tmpfs), `/dev/pts`, `/dev/shm`, `/dev/mqueue`, `/sys`
//!   (read-only), a tmpfs `/tmp`, then the caller's bind mounts, parents
//!   before the mounts below them and otherwise in the caller's order
//!   (`rbind`, `rprivate`, `nosuid`, `nodev`, plus `ro` when read-only);
//! * all five capability sets, `noNewPrivileges: true`, rlimits (NOFILE
//!   1048576 unless given), runc's masked and read-only paths, a device
//!   cgroup that denies everything, and `cgroupsPath` under [`CGROUP_PARENT`];
//! * `root.readonly: false` (runsc runs with its own overlay; the rootfs given
//!   must never be a pristine image directory).

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxCapabilities, LinuxDeviceCgroup, LinuxMemory, LinuxNamespace, LinuxNamespaceType, LinuxPids, LinuxResources, Mount, PosixRlimit,
    PosixRlimitBuilder, PosixRlimitType, Process, Root, Spec, User,
};

/// Every `cgroupsPath` must lie under this Lazaret-owned parent.
pub const CGROUP_PARENT: &str = "/lazaret";

/// OCI runtime-spec version written into `ociVersion`.
pub const OCI_VERSION: &str = "1.0.2";

/// Default `RLIMIT_NOFILE` (soft and hard) when the caller gives none.
pub const DEFAULT_NOFILE: u64 = 1_048_576;

/// Everything the coordinator decides about one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSpec {
    /// argv of the container's first process; must not be empty.
    pub args: Vec<String>,
    /// Environment, in order; keys must be unique.
    pub env: Vec<(String, String)>,
    /// Working directory inside the container (absolute).
    pub cwd: PathBuf,
    /// uid the process runs as (the developer's by default).
    pub uid: u32,
    /// gid the process runs as.
    pub gid: u32,
    /// Supplementary groups.
    pub additional_gids: Vec<u32>,
    /// The container's hostname.
    pub hostname: String,
    /// Whether the process gets a terminal (console socket).
    pub terminal: bool,
    /// Root filesystem handed to runsc: a writable, non-pristine directory.
    pub rootfs: PathBuf,
    /// Bind mounts (workspace, volumes, anchors), applied after the system
    /// mounts: a mount below another's destination always after that one,
    /// otherwise in this order.
    pub mounts: Vec<BindMount>,
    /// `None`: a new, empty network namespace; `Some(path)`: join that one
    /// (the Domain's sidecar namespace, never the host's).
    pub network_namespace: Option<PathBuf>,
    /// cgroup path, e.g. `/lazaret/<domain-id>/<container-id>`.
    pub cgroups_path: String,
    /// Capabilities of the process.
    pub capabilities: CapabilityPolicy,
    /// Resource limits; `RLIMIT_NOFILE` = [`DEFAULT_NOFILE`] is added when absent.
    pub rlimits: Vec<Rlimit>,
    /// Memory limit in bytes.
    pub memory_limit: Option<i64>,
    /// Maximum number of processes/threads.
    pub pids_limit: Option<i64>,
}

/// A bind mount from the host into the container (the one type shared with
/// `lazaret_mounts`, defined in `lazaret_protocol::mount`).
pub use lazaret_protocol::mount::BindMount;

/// A Linux capability, as [`CapabilityPolicy::Explicit`] lists them.
pub use oci_spec::runtime::Capability;

/// Which capabilities the container process holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CapabilityPolicy {
    /// No capabilities at all (the right choice for a non-root agent).
    None,
    /// [`DEFAULT_ROOT_CAPABILITIES`]: enough for root to run a package
    /// manager, without network or system administration.
    DefaultRoot,
    /// Exactly these; [`FORBIDDEN_CAPABILITIES`] are refused.
    Explicit(Vec<Capability>),
}

/// Capabilities of [`CapabilityPolicy::DefaultRoot`]: Docker's default set
/// without `NET_RAW` and `MKNOD`.
pub const DEFAULT_ROOT_CAPABILITIES: [Capability; 11] = [
    Capability::AuditWrite,
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fowner,
    Capability::Fsetid,
    Capability::Kill,
    Capability::NetBindService,
    Capability::Setfcap,
    Capability::Setgid,
    Capability::Setpcap,
    Capability::Setuid,
];

/// Capabilities a sandbox may never hold (the sidecar alone administers the
/// network; the rest administer the kernel).
pub const FORBIDDEN_CAPABILITIES: [Capability; 7] = [
    Capability::NetAdmin,
    Capability::SysAdmin,
    Capability::SysModule,
    Capability::SysRawio,
    Capability::SysBoot,
    Capability::MacAdmin,
    Capability::MacOverride,
];

/// One POSIX resource limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rlimit {
    /// Which resource.
    pub resource: PosixRlimitType,
    /// Soft limit.
    pub soft: u64,
    /// Hard limit (>= soft).
    pub hard: u64,
}

/// Why a bundle could not be built or written.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A path field is unacceptable.
    #[error("invalid {field} {path:?}: {reason}")]
    InvalidPath {
        /// Which field.
        field: String,
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An environment entry is unacceptable.
    #[error("invalid environment variable {key:?}: {reason}")]
    InvalidEnv {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// Another field is unacceptable.
    #[error("invalid {field}: {reason}")]
    InvalidField {
        /// Which field.
        field: String,
        /// Why.
        reason: String,
    },
    /// A capability that a sandbox may never hold was requested.
    #[error("capability {0} may not be granted to a sandbox")]
    ForbiddenCapability(String),
    /// Writing the bundle failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Serialising the spec failed.
    #[error("serialising config.json: {0}")]
    Serialize(#[from] serde_json::Error),
}

/// The process part of a bundle alone (for `runsc exec --process`),
/// validated like a whole bundle: every security field explicit.
pub fn build_process(spec: &BundleSpec) -> Result<Process, BundleError> {
    validate(spec)?;
    process_of(spec)
}

/// Serialises a process spec as JSON with capability sets sorted.
pub fn render_process(process: &Process) -> Result<String, BundleError> {
    let mut value = serde_json::to_value(process)?;
    sort_capabilities(&mut value);
    Ok(serde_json::to_string(&value)?)
}

fn process_of(spec: &BundleSpec) -> Result<Process, BundleError> {
    let mut user = User::default();
    user.set_uid(spec.uid)
        .set_gid(spec.gid)
        .set_umask(Some(0o022))
        .set_additional_gids((!spec.additional_gids.is_empty()).then(|| spec.additional_gids.clone()))
        .set_username(None);

    let caps: Vec<Capability> = match &spec.capabilities {
        CapabilityPolicy::None => Vec::new(),
        CapabilityPolicy::DefaultRoot => DEFAULT_ROOT_CAPABILITIES.to_vec(),
        CapabilityPolicy::Explicit(list) => list.clone(),
    };
    let held: oci_spec::runtime::Capabilities = caps.into_iter().collect();
    let mut capabilities = LinuxCapabilities::default();
    capabilities
        .set_bounding(Some(held.clone()))
        .set_effective(Some(held.clone()))
        .set_permitted(Some(held))
        .set_inheritable(Some(Default::default()))
        .set_ambient(Some(Default::default()));

    let mut rlimits = spec.rlimits.iter().map(to_posix_rlimit).collect::<Result<Vec<_>, _>>()?;
    if !spec.rlimits.iter().any(|r| r.resource == PosixRlimitType::RlimitNofile) {
        rlimits.push(to_posix_rlimit(&Rlimit { resource: PosixRlimitType::RlimitNofile, soft: DEFAULT_NOFILE, hard: DEFAULT_NOFILE })?);
    }

    let mut process = Process::default();
    process
        .set_terminal(Some(spec.terminal))
        .set_console_size(None)
        .set_user(user)
        .set_args(Some(spec.args.clone()))
        .set_command_line(None)
        .set_env(Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()))
        .set_cwd(spec.cwd.clone())
        .set_capabilities(Some(capabilities))
        .set_rlimits(Some(rlimits))
        .set_no_new_privileges(Some(true))
        .set_apparmor_profile(None)
        .set_oom_score_adj(None)
        .set_selinux_label(None)
        .set_io_priority(None)
        .set_scheduler(None)
        .set_exec_cpu_affinity(None);
    Ok(process)
}

/// Builds the runtime spec for `spec`, validating every input.
pub fn build_spec(spec: &BundleSpec) -> Result<Spec, BundleError> {
    validate(spec)?;
    let process = process_of(spec)?;

    let mut root = Root::default();
    root.set_path(spec.rootfs.clone()).set_readonly(Some(false));

    let mut mounts = system_mounts();
    for bind in nesting_order(&spec.mounts) {
        let mut options = vec!["rbind".to_string(), "rprivate".into(), "nosuid".into(), "nodev".into()];
        if bind.readonly {
            options.push("ro".into());
        }
        mounts.push(mount(&bind.destination, "bind", &bind.source, &options));
    }

    let namespaces =
        [LinuxNamespaceType::Pid, LinuxNamespaceType::Ipc, LinuxNamespaceType::Uts, LinuxNamespaceType::Mount, LinuxNamespaceType::Network]
            .into_iter()
            .map(|kind| {
                let mut ns = LinuxNamespace::default();
                ns.set_typ(kind);
                let path = if kind == LinuxNamespaceType::Network { spec.network_namespace.clone() } else { None };
                ns.set_path(path);
                ns
            })
            .collect::<Vec<_>>();

    let mut deny_all_devices = LinuxDeviceCgroup::default();
    deny_all_devices.set_allow(false).set_typ(None).set_major(None).set_minor(None).set_access(Some("rwm".into()));
    let mut resources = LinuxResources::default();
    resources.set_devices(Some(vec![deny_all_devices]));
    resources.set_memory(spec.memory_limit.map(|limit| {
        let mut memory = LinuxMemory::default();
        memory.set_limit(Some(limit));
        memory
    }));
    resources.set_pids(spec.pids_limit.map(|limit| {
        let mut pids = LinuxPids::default();
        pids.set_limit(limit);
        pids
    }));

    let mut linux = oci_spec::runtime::Linux::default();
    linux
        .set_net_devices(None)
        .set_uid_mappings(None)
        .set_gid_mappings(None)
        .set_sysctl(None)
        .set_resources(Some(resources))
        .set_cgroups_path(Some(PathBuf::from(&spec.cgroups_path)))
        .set_namespaces(Some(namespaces))
        .set_devices(None)
        .set_seccomp(None)
        .set_rootfs_propagation(None)
        .set_masked_paths(Some(to_strings(&MASKED_PATHS)))
        .set_readonly_paths(Some(to_strings(&READONLY_PATHS)))
        .set_mount_label(None)
        .set_intel_rdt(None)
        .set_memory_policy(None)
        .set_personality(None)
        .set_time_offsets(None);

    let mut out = Spec::default();
    out.set_version(OCI_VERSION.to_string())
        .set_root(Some(root))
        .set_mounts(Some(mounts))
        .set_process(Some(process))
        .set_hostname(Some(spec.hostname.clone()))
        .set_domainname(None)
        .set_hooks(None)
        .set_annotations(None)
        .set_linux(Some(linux))
        .set_solaris(None)
        .set_windows(None)
        .set_vm(None)
        .set_zos(None);
    Ok(out)
}

/// Serialises a spec as pretty JSON with capability sets sorted, so the
/// output is byte-for-byte reproducible (oci-spec keeps them in hash sets).
pub fn render_spec(spec: &Spec) -> Result<String, BundleError> {
    let mut value = serde_json::to_value(spec)?;
    if let Some(process) = value.get_mut("process") {
        sort_capabilities(process);
    }
    let mut text = serde_json::to_string_pretty(&value)?;
    text.push('\n');
    Ok(text)
}

/// Writes `dir/config.json` (creating `dir` with mode 0700 if needed)
/// atomically and returns its path.
pub fn write_bundle(dir: &Path, spec: &BundleSpec) -> Result<PathBuf, BundleError> {
    let text = render_spec(&build_spec(spec)?)?;
    let io_err = |context: String| move |source| BundleError::Io { context, source };
    crate::fsutil::ensure_private_dir(dir, 0o700).map_err(io_err(format!("creating bundle directory {}", dir.display())))?;
    crate::fsutil::atomic_write(dir, "config.json", text.as_bytes(), 0o600)
        .map_err(io_err(format!("writing {}/config.json", dir.display())))?;
    Ok(dir.join("config.json"))
}

/// Sorts the capability sets of a serialised process (oci-spec keeps them
/// in hash sets, whose order varies).
fn sort_capabilities(process: &mut serde_json::Value) {
    if let Some(caps) = process.get_mut("capabilities").and_then(|c| c.as_object_mut()) {
        for set in caps.values_mut() {
            if let Some(list) = set.as_array_mut() {
                list.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
            }
        }
    }
}

/// The bind mounts in the order they must be mounted: a mount whose
/// destination lies below another's always comes after it, whatever order
/// the caller collected them in (runsc mounts in spec order, and a parent
/// mounted after its child hides the child or, when the child's mount point
/// exists only in the parent's source, fails `runsc create`).
///
/// A stable sort by the number of destination components is enough:
/// destinations are absolute and free of `.`/`..` (checked), and
/// [`Path::components`] ignores repeated and trailing slashes, so a strict
/// ancestor always has fewer components than its descendant and sorts
/// first. Two different destinations with the same number of components
/// cannot contain one another, so their relative order does not matter, and
/// the stable sort keeps it as collected. Two mounts with the same
/// destination (a deliberate over-mount, whose order would matter) are
/// refused by validation, so none can be swapped.
fn nesting_order(binds: &[BindMount]) -> Vec<&BindMount> {
    let mut ordered: Vec<&BindMount> = binds.iter().collect();
    ordered.sort_by_key(|b| b.destination.components().count());
    ordered
}

/// runc's default masked paths.
const MASKED_PATHS: [&str; 11] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// runc's default read-only paths.
const READONLY_PATHS: [&str; 5] = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// Destinations reserved for the system mounts.
const RESERVED_DESTINATIONS: [&str; 3] = ["/proc", "/sys", "/dev"];

fn to_strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn system_mounts() -> Vec<Mount> {
    let m = |dest: &str, kind: &str, source: &str, options: &[&str]| mount(Path::new(dest), kind, Path::new(source), &to_strings(options));
    vec![
        m("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        m("/dev", "tmpfs", "tmpfs", &["nosuid", "strictatime", "mode=755", "size=65536k"]),
        m("/dev/pts", "devpts", "devpts", &["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]),
        m("/dev/shm", "tmpfs", "shm", &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
        m("/dev/mqueue", "mqueue", "mqueue", &["nosuid", "noexec", "nodev"]),
        m("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", "ro"]),
        m("/tmp", "tmpfs", "tmpfs", &["nosuid", "nodev", "mode=1777"]),
    ]
}

fn mount(destination: &Path, kind: &str, source: &Path, options: &[String]) -> Mount {
    let mut mount = Mount::default();
    mount
        .set_destination(destination.to_path_buf())
        .set_typ(Some(kind.to_string()))
        .set_source(Some(source.to_path_buf()))
        .set_options(Some(options.to_vec()))
        .set_uid_mappings(None)
        .set_gid_mappings(None);
    mount
}

fn to_posix_rlimit(limit: &Rlimit) -> Result<PosixRlimit, BundleError> {
    // Every field is given, so the builder's defaults play no part.
    PosixRlimitBuilder::default()
        .typ(limit.resource)
        .soft(limit.soft)
        .hard(limit.hard)
        .build()
        .map_err(|e| BundleError::InvalidField { field: "rlimits".into(), reason: e.to_string() })
}

fn validate(spec: &BundleSpec) -> Result<(), BundleError> {
    let field = |field: &str, reason: String| BundleError::InvalidField { field: field.to_string(), reason };
    if spec.args.is_empty() || spec.args[0].is_empty() {
        return Err(field("args", "the command must not be empty".into()));
    }
    if spec.args.iter().any(|a| a.contains('\0')) {
        return Err(field("args", "arguments must not contain NUL".into()));
    }
    let mut keys = HashSet::new();
    for (key, value) in &spec.env {
        let env_err = |reason: &str| BundleError::InvalidEnv { key: key.clone(), reason: reason.to_string() };
        let mut chars = key.chars();
        let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
        if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(env_err("keys must match [A-Za-z_][A-Za-z0-9_]*"));
        }
        if value.contains('\0') {
            return Err(env_err("the value contains NUL"));
        }
        if !keys.insert(key.as_str()) {
            return Err(env_err("set more than once"));
        }
    }
    check_path("cwd", &spec.cwd)?;
    check_path("rootfs", &spec.rootfs)?;
    if spec.rootfs == Path::new("/") {
        return Err(path_err("rootfs", &spec.rootfs, "the host root cannot be the container root"));
    }
    if let Some(netns) = &spec.network_namespace {
        check_path("network_namespace", netns)?;
        refuse_host_netns(netns)?;
    }
    validate_hostname(&spec.hostname)?;
    validate_cgroups_path(&spec.cgroups_path)?;
    let mut destinations = HashSet::new();
    for bind in &spec.mounts {
        check_path("mount source", &bind.source)?;
        check_path("mount destination", &bind.destination)?;
        let dest = &bind.destination;
        if dest == Path::new("/") {
            return Err(path_err("mount destination", dest, "cannot mount over the container root"));
        }
        if RESERVED_DESTINATIONS.iter().any(|r| dest.starts_with(r)) {
            return Err(path_err("mount destination", dest, "/proc, /sys and /dev are reserved"));
        }
        if !destinations.insert(dest.clone()) {
            return Err(path_err("mount destination", dest, "mounted more than once"));
        }
    }
    if let CapabilityPolicy::Explicit(list) = &spec.capabilities
        && let Some(bad) = list.iter().find(|c| FORBIDDEN_CAPABILITIES.contains(c))
    {
        return Err(BundleError::ForbiddenCapability(bad.to_string()));
    }
    let mut resources = Vec::new();
    for limit in &spec.rlimits {
        if limit.soft > limit.hard {
            return Err(field("rlimits", format!("{:?}: soft limit above hard limit", limit.resource)));
        }
        if resources.contains(&limit.resource) {
            return Err(field("rlimits", format!("{:?} given more than once", limit.resource)));
        }
        resources.push(limit.resource);
    }
    if spec.memory_limit.is_some_and(|m| m <= 0) {
        return Err(field("memory_limit", "must be positive".into()));
    }
    if spec.pids_limit.is_some_and(|p| p <= 0) {
        return Err(field("pids_limit", "must be positive".into()));
    }
    Ok(())
}

/// SR-12: the sandbox may join the sidecar's network namespace, never the
/// host's. A path that does not exist (yet) cannot be compared and is left to
/// the runtime, which fails on it.
fn refuse_host_netns(netns: &Path) -> Result<(), BundleError> {
    use std::os::unix::fs::MetadataExt;
    let Ok(target) = std::fs::metadata(netns) else {
        return Ok(());
    };
    for host in ["/proc/1/ns/net", "/proc/self/ns/net"] {
        if let Ok(host_meta) = std::fs::metadata(host)
            && (host_meta.dev(), host_meta.ino()) == (target.dev(), target.ino())
        {
            return Err(path_err("network_namespace", netns, &format!("is the host's network namespace (same as {host})")));
        }
    }
    Ok(())
}

fn path_err(field: &str, path: &Path, reason: &str) -> BundleError {
    BundleError::InvalidPath { field: field.to_string(), path: path.to_path_buf(), reason: reason.to_string() }
}

/// Absolute, no NUL, no `.` or `..` components.
fn check_path(field: &str, path: &Path) -> Result<(), BundleError> {
    let bytes = path.as_os_str().as_bytes();
    if !bytes.starts_with(b"/") {
        return Err(path_err(field, path, "must be absolute"));
    }
    if bytes.contains(&0) {
        return Err(path_err(field, path, "contains NUL"));
    }
    if bytes.split(|b| *b == b'/').any(|c| c == b".." || c == b".") {
        return Err(path_err(field, path, "must not contain `.` or `..` components"));
    }
    Ok(())
}

fn validate_hostname(hostname: &str) -> Result<(), BundleError> {
    let bad = |reason: &str| BundleError::InvalidField { field: "hostname".into(), reason: format!("{hostname:?}: {reason}") };
    if hostname.is_empty() || hostname.len() > 64 {
        return Err(bad("must be 1 to 64 characters"));
    }
    for label in hostname.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(bad("labels must be 1 to 63 characters"));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err(bad("labels must not start or end with '-'"));
        }
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(bad("only letters, digits, '-' and '.' are allowed"));
        }
    }
    Ok(())
}

fn validate_cgroups_path(path: &str) -> Result<(), BundleError> {
    let bad = |reason: &str| BundleError::InvalidField { field: "cgroups_path".into(), reason: format!("{path:?}: {reason}") };
    let Some(rest) = path.strip_prefix(CGROUP_PARENT).and_then(|r| r.strip_prefix('/')) else {
        return Err(bad(&format!("must lie under {CGROUP_PARENT}/")));
    };
    if rest.is_empty() {
        return Err(bad("must name a cgroup below the parent"));
    }
    for comp in rest.split('/') {
        if comp.is_empty() || comp == "." || comp == ".." {
            return Err(bad("empty, `.` or `..` component"));
        }
        if !comp.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) {
            return Err(bad("components may only use letters, digits, '_', '.', '-'"));
        }
    }
    Ok(())
}
