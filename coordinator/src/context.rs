//! Everything a command needs to know before it touches a sandbox: who the
//! developer is, which configuration and profile, which workspace and Domain,
//! where state lives, which image. Resolving it has no side effects beyond
//! creating Lazaret's own state directories.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use lazaret_oci::bundle::{BindMount, BundleSpec, CapabilityPolicy};
use lazaret_oci::{ImageRecord, ImageStore};

use lazaret_protocol::display::escaped;

use crate::config::{self, Config, ConfigError, ConfinementError, Located, Profile, VolumeMount};
use crate::identity::{self, Developer, DomainId, HostGroup, IdentityError, StatePaths, Workspace};

/// The agent's PATH when the image sets none, and the only variable of the
/// container's first process.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Why the context could not be resolved. Each message names the cause and
/// the fix.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    /// Lazaret is not running as root.
    #[error("lazaret must run as root (it creates namespaces, mounts and gVisor sandboxes); run it with sudo")]
    NotRoot,
    /// Configuration problems.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The configuration would be visible inside the sandbox.
    #[error(transparent)]
    Confinement(#[from] ConfinementError),
    /// Developer, workspace or state directories.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The image store.
    #[error(transparent)]
    Image(#[from] lazaret_oci::ImageError),
    /// Lazaret's own state would be visible inside the sandbox.
    #[error("{setting} {} lies inside the {mount} mounted into the sandbox (host path {}); the agent could reach Lazaret's state there\n  hint: set `{setting}` to a path outside the workspace and volumes", escaped(.path), escaped(.mount_path))]
    StateExposed {
        /// The configuration key.
        setting: &'static str,
        /// Its value.
        path: PathBuf,
        /// The offending mount's label.
        mount: String,
        /// The mount's host path (canonical).
        mount_path: PathBuf,
    },
    /// A setting the configuration's owner may not make (see
    /// [`config::trust`]).
    #[error(transparent)]
    Trust(Box<config::trust::TrustError>),
    /// A volume's sandbox path, resolved for the agent (`~/...` below its
    /// home), lands where another mount already is.
    #[error("{origin}: volume {written:?} mounts at {}, {reason}\n  hint: {hint}", escaped(.sandbox))]
    VolumeTarget {
        /// Where the volume is written, `FILE:LINE:COLUMN`.
        origin: String,
        /// The entry as written.
        written: String,
        /// Its resolved sandbox path.
        sandbox: PathBuf,
        /// What is there already.
        reason: String,
        /// The fix.
        hint: String,
    },
    /// A `profile_state` entry, resolved below the agent's home, lands on
    /// or around another mount.
    #[error("{origin}: profile state {written} is {}, {reason}\n  hint: {hint}", escaped(.sandbox))]
    ProfileStateTarget {
        /// Where the entry is written, `FILE:LINE:COLUMN`.
        origin: String,
        /// The entry as written.
        written: String,
        /// Its sandbox path.
        sandbox: PathBuf,
        /// What it collides with.
        reason: String,
        /// The fix.
        hint: &'static str,
    },
    /// An `env:NAME` value names a variable the launching environment lacks.
    #[error(
        "{origin}: profile {profile:?} sets {name} = \"env:{host}\", but {host} is not set in the environment lazaret was started from\n  hint: set it (`export {host}=...`), and under sudo, which drops most variables, run `sudo --preserve-env={host} lazaret ...`; or remove {name} from the profile's env"
    )]
    MissingHostEnv {
        /// Where the profile is written, `FILE:LINE:COLUMN`.
        origin: String,
        /// The profile.
        profile: String,
        /// The agent's variable.
        name: String,
        /// The host variable it is taken from.
        host: String,
    },
    /// A host directory Lazaret manages could not be prepared.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

impl From<config::trust::TrustError> for ContextError {
    fn from(error: config::trust::TrustError) -> Self {
        ContextError::Trust(Box::new(error))
    }
}

/// Refuses to go on unless the effective uid is 0.
pub fn require_root() -> Result<(), ContextError> {
    if nix::unistd::geteuid().is_root() { Ok(()) } else { Err(ContextError::NotRoot) }
}

/// The resolved facts of one invocation.
pub struct Context {
    /// Who asked.
    pub developer: Developer,
    /// The validated configuration.
    pub config: Config,
    /// The selected profile.
    pub profile: Profile,
    /// The workspace (canonical git top level).
    pub workspace: Workspace,
    /// The Domain of (profile, workspace).
    pub domain_id: DomainId,
    /// Storage Root and runtime directory.
    pub paths: StatePaths,
}

impl Context {
    /// Resolves developer, configuration, profile, workspace and Domain, and
    /// checks ConfigurationConfinement.
    pub fn resolve(config_path: Option<&Path>, profile: Option<&str>, dir: &Path) -> Result<Context, ContextError> {
        let developer = Developer::from_process()?;
        let config = load_config(config_path, &developer)?;
        let profile = config.select_profile(profile)?.clone();
        let workspace = Workspace::discover(dir)?;
        config::check_confinement(&config.file, &profile.host_mounts(workspace.root()))?;
        let domain_id = DomainId::new(&profile.name, &workspace);
        let paths = StatePaths::new(config.storage_root.clone(), config.runtime_dir(&developer));
        config::trust::check_trust(&config, &profile, &developer, workspace.root(), &config::trust::developer_access(&developer))?;
        let mounts = profile.host_mounts(workspace.root());
        for (what, path) in [("storage_root", &paths.storage_root), ("runtime_dir", &paths.runtime_dir)] {
            if let Some((label, mount)) = exposing_mount(path, &mounts) {
                return Err(ContextError::StateExposed { setting: what, path: path.clone(), mount: label, mount_path: mount });
            }
        }
        let ctx = Context { developer, config, profile, workspace, domain_id, paths };
        ctx.check_volume_targets()?;
        ctx.check_profile_state_targets()?;
        Ok(ctx)
    }

    /// The (developer, profile) directory of the profile's state:
    /// `STORAGE_ROOT/profiles/<developer uid>/<profile>`.
    pub fn profile_state_store(&self) -> PathBuf {
        profile_state_store(&self.paths.storage_root, self.developer.uid, &self.profile.name)
    }

    /// The profile's `profile_state` entries as this agent gets them: each
    /// with its sandbox path (below [`Context::agent_home`]) and its host
    /// directory in [`Context::profile_state_store`].
    pub fn profile_state(&self) -> Vec<ProfileStateMount> {
        let home = self.agent_home();
        let store = self.profile_state_store();
        self.profile
            .profile_state
            .iter()
            .map(|e| ProfileStateMount { sandbox: e.in_home(&home), host: e.storage(&store), entry: e.clone() })
            .collect()
    }

    /// A `profile_state` entry may not be the workspace or hold it or lie in
    /// it, nor meet a volume or a `persistent_dirs` entry that way: each of
    /// those is a mount of its own, and a copy kept per Domain (or the
    /// workspace) would take its place or be hidden by it.
    fn check_profile_state_targets(&self) -> Result<(), ContextError> {
        let meets = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
        let volumes = self.volumes();
        for state in self.profile_state() {
            let refuse = |reason: String, hint: &'static str| ContextError::ProfileStateTarget {
                origin: state.entry.origin.clone(),
                written: state.entry.to_string(),
                sandbox: state.sandbox.clone(),
                reason,
                hint,
            };
            if meets(&state.sandbox, self.workspace.root()) {
                return Err(refuse(
                    format!("and the workspace is {}", escaped(self.workspace.root())),
                    "keep the workspace out of the agent's state directories (name a directory beside it)",
                ));
            }
            if let Some(v) = volumes.iter().find(|v| meets(&state.sandbox, &v.sandbox)) {
                return Err(refuse(
                    format!("where volume {:?} ({}) mounts at {}", v.written, v.origin, escaped(&v.sandbox)),
                    "keep a directory either per profile or as a volume, not both",
                ));
            }
            if let Some(dir) = self.profile.persistent_dirs.iter().find(|d| meets(&state.sandbox, d)) {
                return Err(refuse(
                    format!("and persistent_dirs keeps {} per Domain", escaped(dir)),
                    "keep a directory either per profile or in persistent_dirs, not both (a persistent /root holds a root agent's home)",
                ));
            }
        }
        Ok(())
    }

    /// The profile's volumes as this agent gets them, in the profile's
    /// order: a `~/...` sandbox path lies below [`Context::agent_home`].
    /// Everything that binds or checks a volume's sandbox path uses these.
    pub fn volumes(&self) -> Vec<Located<VolumeMount>> {
        let home = self.agent_home();
        self.profile.volumes.iter().map(|v| Located::new(v.resolve(&home), v.origin.clone())).collect()
    }

    /// The checks of sandbox paths that need the agent's home: the parser
    /// refuses two volumes written with the same sandbox path, but `~/x`
    /// and `/home/NAME/x` (or `/root/x` for root) meet only once resolved.
    /// A volume may also not land on the workspace or on the agent's
    /// persistent home, both bound by Lazaret itself.
    fn check_volume_targets(&self) -> Result<(), ContextError> {
        let volumes = self.volumes();
        let refuse = |v: &Located<VolumeMount>, reason: String, hint: String| ContextError::VolumeTarget {
            origin: v.origin.clone(),
            written: v.written.clone(),
            sandbox: v.sandbox.clone(),
            reason,
            hint,
        };
        let home = self.agent_home();
        let home_is_bound = self.agent_ids().0 != 0;
        for (i, v) in volumes.iter().enumerate() {
            if let Some(first) = volumes[..i].iter().find(|f| f.sandbox == v.sandbox) {
                return Err(refuse(
                    v,
                    format!("where volume {:?} ({}) mounts too", first.written, first.origin),
                    format!("give each volume its own sandbox path (~/ is {} for this profile's agent)", escaped(&home)),
                ));
            }
            if v.sandbox == self.workspace.root() {
                return Err(refuse(
                    v,
                    "the workspace, which Lazaret mounts there".into(),
                    "mount the volume at another sandbox path (a path below the workspace is fine)".into(),
                ));
            }
            if home_is_bound && v.sandbox == home {
                return Err(refuse(
                    v,
                    "the agent's home, which Lazaret binds there (the Domain's persistent home)".into(),
                    "mount the volume below the home instead, e.g. \"HOST:~/.tool\"".into(),
                ));
            }
        }
        Ok(())
    }

    /// The image store under the Storage Root.
    pub fn image_store(config: &Config) -> Result<ImageStore, ContextError> {
        identity::ensure_storage_root(&config.storage_root)?;
        Ok(ImageStore::open(&config.storage_root.join("images"))?)
    }

    /// Creates (or verifies) the developer's runtime directory and this
    /// Domain's directory inside it, and returns the latter.
    pub fn domain_runtime_dir(&self) -> Result<PathBuf, ContextError> {
        identity::ensure_runtime_dir(&self.paths.runtime_dir, &self.developer)?;
        let dir = self.paths.domain_runtime_dir(&self.domain_id);
        identity::ensure_private_dir(&dir, 0, 0)?;
        Ok(dir)
    }

    /// The uid and gid the agent runs as.
    pub fn agent_ids(&self) -> (u32, u32) {
        self.profile.user.ids(&self.developer)
    }

    /// The agent's supplementary groups: the developer's (from the host's
    /// group database) when the agent runs as the developer, none otherwise
    /// (root, or an explicit `uid:gid`).
    pub fn agent_groups(&self) -> Vec<HostGroup> {
        let (uid, gid) = self.agent_ids();
        if uid != 0 && (uid, gid) == (self.developer.uid, self.developer.gid) { self.developer.groups.clone() } else { Vec::new() }
    }

    /// The agent's working directory: where the developer stands if that is
    /// inside the workspace, else the workspace root.
    pub fn agent_cwd(&self) -> PathBuf {
        self.workspace.root().join(self.workspace.subdir())
    }

    /// The agent's home directory inside the sandbox.
    pub fn agent_home(&self) -> PathBuf {
        let (uid, _) = self.agent_ids();
        if uid == 0 { PathBuf::from("/root") } else { PathBuf::from("/home").join(&self.developer.name) }
    }

    /// For a non-root agent, a persistent home directory in the Domain Root,
    /// owned by the agent, bound at [`Context::agent_home`]. Root's home is
    /// the image's /root.
    ///
    /// `mount_points` are the other mounts' destinations: the directories
    /// between the home and those below it (`~/src` of a workspace at
    /// `~/src/project`, `~/.local/share` of a volume at
    /// `~/.local/share/opencode`) are made here, owned by the agent.
    /// Otherwise runsc makes them as root, and the agent cannot create
    /// anything else in them (opencode cannot make `~/.local/state`).
    pub fn prepare_home(&self, uid: u32, gid: u32, mount_points: &[PathBuf]) -> Result<Option<BindMount>, ContextError> {
        if uid == 0 {
            return Ok(None);
        }
        self.paths.ensure_storage()?;
        let root = self.paths.ensure_domain_root(&self.domain_id)?;
        let home = root.join("home");
        match std::fs::symlink_metadata(&home) {
            Ok(m) if m.is_dir() && m.uid() == uid => {}
            Ok(_) => {
                return Err(ContextError::Io {
                    context: format!("{} is not a directory owned by uid {uid}", home.display()),
                    source: std::io::Error::other("remove it to get a fresh home"),
                });
            }
            Err(_) => {
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&home)
                    .map_err(|source| ContextError::Io { context: format!("creating {}", home.display()), source })?;
                nix::unistd::chown(&home, Some(uid.into()), Some(gid.into()))
                    .map_err(|e| ContextError::Io { context: format!("chown {}", home.display()), source: e.into() })?;
            }
        }
        let agent_home = self.agent_home();
        let below: Vec<&Path> =
            mount_points.iter().filter_map(|d| d.strip_prefix(&agent_home).ok()).filter(|p| !p.as_os_str().is_empty()).collect();
        let inner: Vec<&Path> = below.iter().filter_map(|p| p.parent()).filter(|p| !p.as_os_str().is_empty()).collect();
        if !inner.is_empty() {
            home_mount_parents(&home, &inner, uid, gid)
                .map_err(|source| ContextError::Io { context: format!("preparing the mount points in {}", home.display()), source })?;
        }
        if !below.is_empty() {
            remove_symlinked_mount_points(&home, &below)
                .map_err(|source| ContextError::Io { context: format!("preparing the mount points in {}", home.display()), source })?;
        }
        Ok(Some(BindMount { source: home, destination: agent_home, readonly: false }))
    }

    /// The environment of the agent: the image's, then Lazaret's defaults,
    /// then the profile's (`env:NAME` values taken from `host_env`; a missing
    /// one is an error naming it; a literal `~/X` is `X` in the agent's home).
    ///
    /// This is where secrets live: the values exist only in the
    /// coordinator's memory and in the agent's environment. The spec that
    /// carries them to runsc is never written to disk (see
    /// `lazaret_runtime::Runsc::exec`), and the container's first
    /// process gets none of them ([`Context::init_bundle_spec`]).
    pub fn agent_env(
        &self,
        image: &ImageRecord,
        host_env: &dyn Fn(&str) -> Option<OsString>,
        tty: bool,
    ) -> Result<Vec<(String, String)>, ContextError> {
        let mut env: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: String| {
            env.retain(|(key, _)| key != k);
            env.push((k.to_string(), v));
        };
        for kv in &image.config.env {
            if let Some((k, v)) = kv.split_once('=') {
                set(k, v.to_string());
            }
        }
        if !image.config.env.iter().any(|kv| kv.starts_with("PATH=")) {
            set("PATH", DEFAULT_PATH.into());
        }
        set("HOME", self.agent_home().to_string_lossy().into_owned());
        let user = if self.agent_ids().0 == 0 { "root".to_string() } else { self.developer.name.clone() };
        set("USER", user.clone());
        set("LOGNAME", user);
        set("LAZARET_PROFILE", self.profile.name.clone());
        set("LAZARET_DOMAIN", self.domain_id.to_string());
        if tty {
            let term = host_env("TERM").map(|t| t.to_string_lossy().into_owned()).unwrap_or_else(|| "xterm".into());
            set("TERM", term);
        }
        let home = self.agent_home();
        for (name, value) in &self.profile.env {
            match value.resolve(host_env) {
                // "~/X" written in the profile is X in the agent's home, as
                // on a volume's sandbox side (CLAUDE_CONFIG_DIR = "~/.claude").
                Some(v) if matches!(value, config::EnvValue::Literal(l) if l.starts_with("~/")) => {
                    let rest = v.to_string_lossy().trim_start_matches("~/").to_string();
                    set(name, home.join(rest).to_string_lossy().into_owned())
                }
                Some(v) => set(name, v.to_string_lossy().into_owned()),
                None => {
                    let host = match value {
                        config::EnvValue::FromHost(host) => host.clone(),
                        config::EnvValue::Literal(_) => name.clone(),
                    };
                    return Err(ContextError::MissingHostEnv {
                        origin: self.profile.origin.clone(),
                        profile: self.profile.name.clone(),
                        name: name.clone(),
                        host,
                    });
                }
            }
        }
        Ok(env)
    }

    /// The bundle of the container's first process, which only reaps
    /// orphans (agents are `runsc exec`'d): the profile's mounts, ids and
    /// limits, but only `PATH` for an environment, so that the bundle's
    /// `config.json` on disk holds no value of the profile's `env`.
    pub fn init_bundle_spec(&self, args: &[String]) -> Result<BundleSpec, ContextError> {
        self.spec_with_env(args, false, vec![("PATH".into(), DEFAULT_PATH.into())])
    }

    /// The OCI bundle description for the agent. The caller fills in the
    /// rootfs and cgroups path of this particular run.
    pub fn bundle_spec(&self, image: &ImageRecord, args: &[String], tty: bool) -> Result<BundleSpec, ContextError> {
        let lookup = |name: &str| std::env::var_os(name);
        let env = self.agent_env(image, &lookup, tty)?;
        self.spec_with_env(args, tty, env)
    }

    fn spec_with_env(&self, args: &[String], tty: bool, env: Vec<(String, String)>) -> Result<BundleSpec, ContextError> {
        let (uid, gid) = self.agent_ids();
        let argv = if args.is_empty() { self.profile.command.clone() } else { args.to_vec() };
        let mut mounts = vec![BindMount {
            source: self.workspace.root().to_path_buf(),
            destination: self.workspace.root().to_path_buf(),
            readonly: false,
        }];
        for v in self.volumes() {
            mounts.push(BindMount { source: v.value.host, destination: v.value.sandbox, readonly: v.value.readonly });
        }
        Ok(BundleSpec {
            args: argv,
            env,
            cwd: self.agent_cwd(),
            uid,
            gid,
            additional_gids: self.agent_groups().iter().map(|g| g.gid).collect(),
            hostname: self.profile.hostname.clone().unwrap_or_else(|| format!("lazaret-{}", self.profile.name)),
            terminal: tty,
            rootfs: PathBuf::new(),
            mounts,
            network_namespace: None,
            cgroups_path: String::new(),
            capabilities: if uid == 0 { CapabilityPolicy::DefaultRoot } else { CapabilityPolicy::None },
            rlimits: Vec::new(),
            memory_limit: self.profile.memory_limit.map(|m| m as i64),
            pids_limit: self.profile.pids_limit.map(|m| m as i64),
        })
    }
}

/// One `profile_state` entry of a Domain.
#[derive(Debug, Clone)]
pub struct ProfileStateMount {
    /// The entry as written, with where.
    pub entry: Located<config::StateEntry>,
    /// Where it appears in the sandbox.
    pub sandbox: PathBuf,
    /// Its directory on the host (in the Storage Root).
    pub host: PathBuf,
}

/// `STORAGE_ROOT/profiles/<uid>/<profile>`: where the `profile_state` of
/// the developer `uid`'s `profile` is kept.
pub fn profile_state_store(storage_root: &Path, uid: u32, profile: &str) -> PathBuf {
    storage_root.join("profiles").join(uid.to_string()).join(profile)
}

/// The mount (label, canonical host path) that would expose `path` (a
/// directory that may not exist yet: its nearest existing ancestor is
/// resolved) inside the sandbox, if any.
fn exposing_mount(path: &Path, mounts: &[(String, PathBuf)]) -> Option<(String, PathBuf)> {
    let mut existing = path.to_path_buf();
    let mut rest = PathBuf::new();
    while !existing.exists() {
        let name = existing.file_name()?.to_os_string();
        rest = Path::new(&name).join(&rest);
        existing = existing.parent()?.to_path_buf();
    }
    let resolved = std::fs::canonicalize(&existing).ok()?.join(rest);
    mounts.iter().find_map(|(label, host)| {
        let host = std::fs::canonicalize(host).ok()?;
        resolved.starts_with(&host).then(|| (label.clone(), host))
    })
}

/// Finds and loads the configuration (`--config`, `$LAZARET_CONFIG`, the
/// developer's XDG config).
pub fn load_config(cli: Option<&Path>, developer: &Developer) -> Result<Config, ConfigError> {
    let lookup = |name: &str| std::env::var_os(name);
    Config::discover(cli, &lookup, developer)
}

/// Makes each of `parents` (relative to the agent's persistent `home`)
/// exist as a directory owned by the agent, component by component, without
/// following a symlink (the home is the agent's to change). A component an
/// earlier run's runsc made as root is given to the agent.
fn home_mount_parents(home: &Path, parents: &[&Path], uid: u32, gid: u32) -> std::io::Result<()> {
    use lazaret_mounts::safe_path;
    let mount_error = |e: lazaret_mounts::MountError| std::io::Error::other(e.to_string());
    let root = safe_path::open_root_dir(home).map_err(mount_error)?;
    for parent in parents {
        let mut walked = PathBuf::new();
        for component in parent.components() {
            let std::path::Component::Normal(name) = component else { continue };
            let above = safe_path::ensure_dir_beneath(root.as_fd(), &walked).map_err(mount_error)?;
            walked.push(name);
            let dir = safe_path::ensure_dir_beneath(root.as_fd(), &walked).map_err(mount_error)?;
            if safe_path::stat(dir.as_fd()).map_err(mount_error)?.st_uid != uid {
                nix::unistd::fchownat(&above, name, Some(uid.into()), Some(gid.into()), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(|errno| std::io::Error::other(format!("chown {}: {errno}", walked.display())))?;
            }
        }
    }
    Ok(())
}

/// Removes each of `points` (relative to the agent's persistent `home`)
/// that is a symlink: one the agent left where a volume or its profile
/// state is bound would make runsc mount there at the link's target inside
/// the sandbox instead. The link itself is unlinked, never followed (its
/// parents were made symlink-free by [`home_mount_parents`]).
fn remove_symlinked_mount_points(home: &Path, points: &[&Path]) -> std::io::Result<()> {
    use lazaret_mounts::safe_path;
    let mount_error = |e: lazaret_mounts::MountError| std::io::Error::other(e.to_string());
    let root = safe_path::open_root_dir(home).map_err(mount_error)?;
    for point in points {
        let (Some(parent), Some(name)) = (point.parent(), point.file_name()) else { continue };
        let dir = match safe_path::open_dir_beneath(root.as_fd(), parent) {
            Ok(dir) => dir,
            // A missing parent holds no link; runsc makes it.
            Err(lazaret_mounts::MountError::Syscall { errno: nix::errno::Errno::ENOENT, .. }) => continue,
            Err(e) => return Err(mount_error(e)),
        };
        match nix::sys::stat::fstatat(&dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                nix::unistd::unlinkat(&dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir)
                    .map_err(|errno| std::io::Error::other(format!("removing the symlink {}: {errno}", point.display())))?;
            }
            Ok(_) | Err(nix::errno::Errno::ENOENT) => {}
            Err(errno) => return Err(std::io::Error::other(format!("stat {}: {errno}", point.display()))),
        }
    }
    Ok(())
}

/// A [`Context`] for unit tests: `developer`, a profile `a` with the
/// `extra` keys, and a workspace `ws` (with a `.git` directory) under `dir`.
/// Touches nothing but `dir`.
#[cfg(test)]
pub(crate) fn test_context(dir: &Path, developer: Developer, extra: &str) -> Context {
    let ws = dir.join("ws");
    std::fs::create_dir_all(ws.join(".git")).expect("workspace");
    let file = dir.join("config.toml");
    let config = Config::parse(&format!("[profiles.a]\nimage = \"i\"\n{extra}"), &file, &developer.home).expect("config");
    let profile = config.select_profile(Some("a")).expect("profile").clone();
    let workspace = Workspace::discover(&ws).expect("workspace");
    let domain_id = DomainId::new(&profile.name, &workspace);
    let paths = StatePaths::new(config.storage_root.clone(), config.runtime_dir(&developer));
    Context { developer, config, profile, workspace, domain_id, paths }
}

/// A developer for unit tests: alice, uid/gid 1000, in `sudo` (27) and
/// `docker` (998).
#[cfg(test)]
pub(crate) fn test_developer() -> Developer {
    Developer {
        uid: 1000,
        gid: 1000,
        name: "alice".into(),
        home: PathBuf::from("/home/alice"),
        shell: "/bin/sh".into(),
        group_name: Some("alice".into()),
        groups: vec![HostGroup { gid: 27, name: Some("sudo".into()) }, HostGroup { gid: 998, name: Some("docker".into()) }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image() -> ImageRecord {
        ImageRecord {
            name: "i".into(),
            digest: "sha256:00".into(),
            rootfs: PathBuf::from("/nonexistent"),
            size: 0,
            created: String::new(),
            config: lazaret_oci::ImageConfig { env: vec!["USER=image".into(), "LOGNAME=image".into()], ..Default::default() },
            source_kind: lazaret_oci::SourceKind::RootfsDir,
            diff_ids: Vec::new(),
            blobs: Vec::new(),
        }
    }

    fn value<'a>(env: &'a [(String, String)], key: &str) -> Option<&'a str> {
        env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn the_agent_has_the_developers_name_and_groups() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ctx = test_context(dir.path(), test_developer(), "");
        let spec = ctx.bundle_spec(&image(), &["sh".into()], false).expect("spec");
        assert_eq!((spec.uid, spec.gid), (1000, 1000));
        assert_eq!(spec.additional_gids, [27, 998]);
        for key in ["USER", "LOGNAME"] {
            assert_eq!(value(&spec.env, key), Some("alice"), "{key}");
            assert_eq!(spec.env.iter().filter(|(k, _)| k == key).count(), 1, "{key} set once");
        }
        assert_eq!(value(&spec.env, "HOME"), Some("/home/alice"));
    }

    #[test]
    fn root_and_explicit_ids_get_no_supplementary_groups() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = test_context(dir.path(), test_developer(), "user = \"root\"\n");
        let spec = root.bundle_spec(&image(), &["sh".into()], false).expect("spec");
        assert_eq!((spec.uid, spec.gid, spec.additional_gids.as_slice()), (0, 0, &[][..]));
        assert_eq!(
            (value(&spec.env, "USER"), value(&spec.env, "LOGNAME"), value(&spec.env, "HOME")),
            (Some("root"), Some("root"), Some("/root"))
        );
        let other = test_context(dir.path(), test_developer(), "user = \"2000:2000\"\n");
        let spec = other.bundle_spec(&image(), &["sh".into()], false).expect("spec");
        assert_eq!((spec.uid, spec.additional_gids.as_slice()), (2000, &[][..]));
    }

    #[test]
    fn a_missing_host_variable_is_an_error_naming_it_and_sudo() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ctx = test_context(dir.path(), test_developer(), "env = { TOKEN = \"env:MY_TOKEN\", MODE = \"x\" }\n");
        let set = |name: &str| (name == "MY_TOKEN").then(|| OsString::from("s3cret"));
        let env = ctx.agent_env(&image(), &set, false).expect("set");
        assert_eq!((value(&env, "TOKEN"), value(&env, "MODE")), (Some("s3cret"), Some("x")));
        let unset = |_: &str| None;
        let text = ctx.agent_env(&image(), &unset, false).expect_err("unset").to_string();
        assert!(text.contains("TOKEN = \"env:MY_TOKEN\", but MY_TOKEN is not set"), "{text}");
        assert!(text.contains("sudo --preserve-env=MY_TOKEN"), "{text}");
        assert!(text.starts_with(&format!("{}:1:1: profile \"a\"", dir.path().join("config.toml").display())), "{text}");
    }

    #[test]
    fn a_literal_below_tilde_is_in_the_agents_home() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = "env = { CLAUDE_CONFIG_DIR = \"~/.claude\", RAW = \"a~/b\", HOSTED = \"env:H\" }\n";
        let host = |name: &str| (name == "H").then(|| OsString::from("~/from-host"));
        let ctx = test_context(dir.path(), test_developer(), env);
        let vars = ctx.agent_env(&image(), &host, false).expect("env");
        assert_eq!(
            (value(&vars, "CLAUDE_CONFIG_DIR"), value(&vars, "RAW"), value(&vars, "HOSTED")),
            (Some("/home/alice/.claude"), Some("a~/b"), Some("~/from-host"))
        );
        let root = test_context(dir.path(), test_developer(), &format!("user = \"root\"\n{env}"));
        assert_eq!(value(&root.agent_env(&image(), &host, false).expect("env"), "CLAUDE_CONFIG_DIR"), Some("/root/.claude"));
    }

    #[test]
    fn the_init_process_gets_no_profile_environment() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ctx = test_context(dir.path(), test_developer(), "env = { TOKEN = \"literal-secret\" }\n");
        let spec = ctx.init_bundle_spec(&["/init".into()]).expect("spec");
        assert_eq!(spec.env, [("PATH".to_string(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string())]);
        assert_eq!((spec.uid, spec.gid, spec.args.as_slice()), (1000, 1000, &["/init".to_string()][..]));
        let agent = ctx.bundle_spec(&image(), &["sh".into()], false).expect("agent");
        assert_eq!(value(&agent.env, "TOKEN"), Some("literal-secret"));
    }

    fn destinations(spec: &BundleSpec) -> Vec<String> {
        spec.mounts.iter().skip(1).map(|m| m.destination.display().to_string()).collect()
    }

    #[test]
    fn a_volume_below_tilde_lands_in_the_agents_home() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volumes = "volumes = [\"/srv/t:~/.tool\", \"~/.claude:~/.claude:ro\", \"/srv/o:/opt/o\"]\n";
        let ctx = test_context(dir.path(), test_developer(), volumes);
        ctx.check_volume_targets().expect("no collision");
        let spec = ctx.bundle_spec(&image(), &["sh".into()], false).expect("spec");
        assert_eq!(destinations(&spec), ["/home/alice/.tool", "/home/alice/.claude", "/opt/o"]);
        assert_eq!(spec.mounts[2].source, PathBuf::from("/home/alice/.claude"), "host ~ is the developer's");
        assert!(spec.mounts[2].readonly && !spec.mounts[1].readonly);
        assert_eq!(destinations(&ctx.init_bundle_spec(&["/init".into()]).expect("init")), destinations(&spec));
        let resolved: Vec<String> = ctx.volumes().iter().map(|v| v.to_string()).collect();
        assert_eq!(resolved, ["/srv/t:/home/alice/.tool", "/home/alice/.claude:/home/alice/.claude:ro", "/srv/o:/opt/o"]);
        // A root agent's home is /root; an explicit uid's is the developer's name.
        let root = test_context(dir.path(), test_developer(), &format!("user = \"root\"\n{volumes}"));
        let spec = root.bundle_spec(&image(), &["sh".into()], false).expect("spec");
        assert_eq!(destinations(&spec), ["/root/.tool", "/root/.claude", "/opt/o"]);
        let other = test_context(dir.path(), test_developer(), &format!("user = \"2000:2000\"\n{volumes}"));
        assert_eq!(destinations(&other.bundle_spec(&image(), &["sh".into()], false).expect("spec"))[0], "/home/alice/.tool");
        // The Workspace Guard labels a writable volume by where it lands.
        let host = dir.path().join("tool");
        std::fs::create_dir(&host).expect("host dir");
        let guarded = test_context(dir.path(), test_developer(), &format!("volumes = [\"{}:~/.tool\"]\n", host.display()));
        let labels: Vec<String> =
            crate::workspace_guard::guard_config(&guarded, &Default::default(), None).roots.iter().map(|r| r.label.clone()).collect();
        assert!(labels.contains(&"volume:/home/alice/.tool".to_string()), "{labels:?}");
    }

    #[test]
    fn a_resolved_volume_may_not_land_on_another_mount() {
        let dir = tempfile::tempdir().expect("tempdir");
        let refused = |user: &str, volumes: &str| {
            let ctx = test_context(dir.path(), test_developer(), &format!("{user}volumes = [{volumes}]\n"));
            ctx.check_volume_targets().expect_err(volumes).to_string()
        };
        // Written differently, the same place once resolved.
        let text = refused("", "\"/srv/a:~/.tool\", \"/srv/b:/home/alice/.tool\"");
        assert!(
            text.contains("volume \"/srv/b:/home/alice/.tool\" mounts at /home/alice/.tool, where volume \"/srv/a:~/.tool\" ("),
            "{text}"
        );
        assert!(text.contains("config.toml:3:"), "{text}");
        assert!(text.contains("hint: give each volume its own sandbox path (~/ is /home/alice"), "{text}");
        let text = refused("user = \"root\"\n", "\"/srv/a:/root/.x\", \"/srv/b:~/.x\"");
        assert!(text.contains("volume \"/srv/b:~/.x\" mounts at /root/.x, where volume \"/srv/a:/root/.x\""), "{text}");
        // The default agent's home is Lazaret's own bind.
        let text = refused("", "\"/srv/a:~\"");
        assert!(text.contains("mounts at /home/alice, the agent's home, which Lazaret binds there"), "{text}");
        assert!(text.contains("hint: mount the volume below the home instead, e.g. \"HOST:~/.tool\""), "{text}");
        // So is the workspace.
        let ws = std::fs::canonicalize(dir.path()).expect("canonical").join("ws");
        let text = refused("", &format!("\"/srv/a:{}\"", ws.display()));
        assert!(text.contains("the workspace, which Lazaret mounts there"), "{text}");
        // A root agent's home is the image's /root: a volume may cover it;
        // different paths for the default agent are fine.
        test_context(dir.path(), test_developer(), "user = \"root\"\nvolumes = [\"/srv/a:~\"]\n")
            .check_volume_targets()
            .expect("root's home");
        test_context(dir.path(), test_developer(), "volumes = [\"/srv/a:/root/.x\", \"/srv/b:~/.x\"]\n")
            .check_volume_targets()
            .expect("different places");
    }

    #[test]
    fn profile_state_lands_in_the_agents_home_and_not_on_another_mount() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ctx = test_context(dir.path(), test_developer(), "profile_state = [\"~/.fakecli\", \"~/.config/tool\"]\n");
        ctx.check_profile_state_targets().expect("no collision");
        let state = ctx.profile_state();
        let store = PathBuf::from(crate::config::DEFAULT_STORAGE_ROOT).join("profiles/1000/a");
        assert_eq!(ctx.profile_state_store(), store);
        assert_eq!(
            (state[0].sandbox.as_path(), state[0].host.as_path()),
            (Path::new("/home/alice/.fakecli"), store.join("home/.fakecli").as_path())
        );
        assert_eq!(state[1].host, store.join("home/.config/tool"));
        let root = test_context(dir.path(), test_developer(), "user = \"root\"\nprofile_state = [\"~/.fakecli\"]\n");
        assert_eq!(root.profile_state()[0].sandbox, PathBuf::from("/root/.fakecli"));
        assert_eq!(root.profile_state_store(), store, "per developer and profile, whoever the agent is");
        let refused =
            |extra: &str| test_context(dir.path(), test_developer(), extra).check_profile_state_targets().expect_err(extra).to_string();
        let text = refused("profile_state = [\"~/.tool\"]\nvolumes = [\"/srv/t:~/.tool/sub\"]\n");
        assert!(text.contains("profile state ~/.tool is /home/alice/.tool, where volume \"/srv/t:~/.tool/sub\""), "{text}");
        assert!(text.contains("config.toml:3:18"), "{text}");
        let text = refused("user = \"root\"\npersistent_dirs = [\"/root\"]\nprofile_state = [\"~/.claude\"]\n");
        assert!(text.contains("and persistent_dirs keeps /root per Domain"), "{text}");
    }

    #[test]
    fn state_inside_a_mount_is_found_even_before_it_exists() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = dir.path().join("ws");
        std::fs::create_dir(&ws).expect("ws");
        let mounts = vec![("workspace".to_string(), ws.clone())];
        let inside = ws.join("not/yet/there");
        let found = exposing_mount(&inside, &mounts).expect("inside the workspace");
        assert_eq!(found.0, "workspace");
        assert!(exposing_mount(&dir.path().join("elsewhere"), &mounts).is_none());
        // Through a symlink into the workspace, too.
        std::os::unix::fs::symlink(&ws, dir.path().join("link")).expect("symlink");
        assert!(exposing_mount(&dir.path().join("link/run"), &mounts).is_some());
    }
}
