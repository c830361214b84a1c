//! Host configuration: discovery, parsing, validation, fingerprint and
//! confinement.
//!
//! The configuration is a TOML file read only by host Lazaret processes. It is
//! found at `--config FILE`, else `$LAZARET_CONFIG`, else
//! `$XDG_CONFIG_HOME/lazaret/config.toml` of the developer (default
//! `~/.config/lazaret/config.toml`); see [`config_path`]. [`Config::load`]
//! parses and validates it, reporting every problem as
//! `FILE:LINE:COLUMN: message` plus a `hint:` line. `docs/config.example.toml`
//! documents every key.
//!
//! Order of list elements: `command`, `volumes` and `dns` keep their order
//! (argv order, mount order and resolver preference mean something);
//! `persistent_dirs`, `profile_state`, `allow_egress` and `deny_egress` are sets (duplicates are
//! rejected, order does not change the [`Fingerprint`]). Escalation rules keep
//! their order (the first matching rule applies); a rule's `env` is a set.
//! `setup` steps keep their order (they run in it).

mod confine;
mod diag;
mod discover;
mod fingerprint;
mod located;
mod net;
mod parse;
pub mod trust;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::io::Read;
use std::net::IpAddr;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use lazaret_netpolicy::Prefix;
use serde::{Serialize, Serializer};

use crate::escalation::rules::LAUNCHING_SESSION_ENV;
pub use crate::escalation::rules::Rule;
use crate::identity::Developer;

pub use confine::{ConfinementError, check_confinement};
pub use diag::{ConfigError, Diagnostic};
pub use discover::{ConfigPathSource, config_path, config_path_with_source};
pub use fingerprint::Fingerprint;
/// One `profile_state` entry: a directory of the agent's home kept per
/// (developer, profile).
pub use lazaret_mounts::profile_state::StateEntry;
/// One `volumes` entry (the mounts crate's type and parser), its sandbox
/// side as written, and the entry resolved for one agent.
pub use lazaret_mounts::volumes::{SandboxPath, Volume, VolumeMount};
/// The gVisor platform of `[runsc] platform` (runsc's own type).
pub use lazaret_runtime::Platform;
pub use located::Located;

/// Default Storage Root when the configuration does not set `storage_root`.
pub const DEFAULT_STORAGE_ROOT: &str = "/var/lib/lazaret";

/// Parent of the default per-developer runtime directories
/// (`/run/lazaret/<uid>`).
pub const DEFAULT_RUNTIME_PARENT: &str = "/run/lazaret";

/// The agent command of a profile that does not set `command`: a login shell.
pub const DEFAULT_COMMAND: [&str; 2] = ["/bin/bash", "-l"];

/// The validated, resolved host configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Config {
    /// The file the configuration was read from (as given to the loader).
    #[serde(skip)]
    pub file: PathBuf,
    /// Trusted directory holding Domain Roots and images.
    pub storage_root: PathBuf,
    /// Override of the developer's runtime directory (see
    /// [`Config::runtime_dir`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_dir: Option<PathBuf>,
    /// How to run `runsc`.
    pub runsc: RunscSettings,
    /// DNS resolvers of every profile that does not set its own `dns`.
    pub dns: Vec<IpAddr>,
    /// The global `[escalation]` settings (each profile's effective ones
    /// are [`Profile::escalation`]).
    pub escalation: EscalationSettings,
    /// The Domain network's address pools.
    pub network: NetworkSettings,
    /// Profile used when none is named on the command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_profile: Option<String>,
    /// The Agent Profiles by name.
    pub profiles: BTreeMap<String, Profile>,
    /// Where some keys were written, `FILE:LINE:COLUMN`, by dotted key:
    /// `storage_root`, `runtime_dir`, `runsc.path`, `runsc.debug_log_dir`,
    /// `profiles.NAME.user` (for the trust checks of [`trust`]).
    #[serde(skip)]
    pub origins: BTreeMap<String, String>,
    /// The owner of the file as read by [`Config::load`] (`None` when
    /// parsed from text: then it is not trusted like root's).
    #[serde(skip)]
    pub file_owner: Option<u32>,
}

/// The `[runsc]` table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunscSettings {
    /// Absolute path of the runsc binary; `None` means search `PATH`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// The gVisor platform.
    pub platform: Platform,
    /// Directory for runsc debug logs; `None` disables them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debug_log_dir: Option<PathBuf>,
}

impl Default for RunscSettings {
    fn default() -> Self {
        Self { path: None, platform: Platform::Systrap, debug_log_dir: None }
    }
}

/// The `[network]` table: where Domains take their transit addresses from.
/// `None` keeps Lazaret's default pool.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NetworkSettings {
    /// IPv4 pool (/30 or shorter), default 100.96.0.0/16; each Domain takes a /30.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<Located<Prefix>>,
    /// IPv6 pool (/96 or shorter), default fd6c:617a:6172::/96; a Domain's
    /// IPv6 addresses are this prefix with its IPv4 addresses as the last 32 bits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool6: Option<Located<Prefix>>,
}

/// Default of `escalation.prompt_timeout`: how long a prompt waits for the
/// developer before the request times out (and nothing runs).
pub const DEFAULT_PROMPT_TIMEOUT: Duration = Duration::from_secs(120);
/// Default of `escalation.timeout`: how long a host command may run.
pub const DEFAULT_ESCALATION_TIMEOUT: Duration = Duration::from_secs(600);
/// Default of `escalation.output_limit`: bytes of stdout and stderr together
/// passed back before the rest is cut (64 MiB).
pub const DEFAULT_OUTPUT_LIMIT: u64 = 64 << 20;
/// Bounds of `prompt_timeout`, in seconds.
pub const PROMPT_TIMEOUT_RANGE: std::ops::RangeInclusive<u64> = 1..=3600;
/// Bounds of `timeout` (of `[escalation]` and of a rule), in seconds.
pub const ESCALATION_TIMEOUT_RANGE: std::ops::RangeInclusive<u64> = 1..=86400;
/// Bounds of `output_limit`, in bytes (1 MiB to 1 GiB).
pub const OUTPUT_LIMIT_RANGE: std::ops::RangeInclusive<u64> = (1 << 20)..=(1 << 30);

/// Host escalation settings: the global `[escalation]` table
/// ([`Config::escalation`]), or the effective settings of one profile
/// ([`Profile::escalation`]): the global rules followed by the profile's
/// own, and the profile's values where it sets them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EscalationSettings {
    /// Auto-approval rules, in order (see [`crate::escalation::rules::matching_rule`]).
    pub rules: Vec<Rule>,
    /// How long a prompt waits for an answer; unanswered, the request times
    /// out and nothing runs.
    #[serde(serialize_with = "crate::escalation::rules::seconds")]
    pub prompt_timeout: Duration,
    /// How long a host command may run unless its rule sets `timeout`.
    #[serde(serialize_with = "crate::escalation::rules::seconds")]
    pub timeout: Duration,
    /// Bytes of output (stdout and stderr together) passed back; the rest is
    /// cut and the truncation reported.
    pub output_limit: u64,
}

impl Default for EscalationSettings {
    fn default() -> Self {
        Self {
            rules: Vec::new(),
            prompt_timeout: DEFAULT_PROMPT_TIMEOUT,
            timeout: DEFAULT_ESCALATION_TIMEOUT,
            output_limit: DEFAULT_OUTPUT_LIMIT,
        }
    }
}

impl EscalationSettings {
    /// The first rule approving `argv` in the workspace-relative directory
    /// `cwd_rel` (see [`crate::escalation::rules::matching_rule`]).
    pub fn matching_rule(&self, argv: &[String], cwd_rel: &Path) -> Option<&Rule> {
        crate::escalation::rules::matching_rule(&self.rules, argv, cwd_rel)
    }

    /// How long a command approved by `rule` (or by the developer: `None`)
    /// may run: the rule's `timeout`, else [`EscalationSettings::timeout`].
    pub fn timeout_for(&self, rule: Option<&Rule>) -> Duration {
        rule.and_then(|rule| rule.timeout).unwrap_or(self.timeout)
    }

    /// The names of the variables the launching client sends in its Hello's
    /// `host_env` (those it has set): [`LAUNCHING_SESSION_ENV`] followed by
    /// every rule's `env`, each once, in that order.
    pub fn host_env_names(&self) -> Vec<String> {
        let mut names: Vec<String> = LAUNCHING_SESSION_ENV.iter().map(|name| name.to_string()).collect();
        for name in self.rules.iter().flat_map(|rule| &rule.env) {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    }
}

/// What a `[profiles.NAME.escalation]` table writes, before merging with the
/// global `[escalation]` (shown by `lazaret config show`; the merged result is
/// [`Profile::escalation`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EscalationOverrides {
    /// The profile's own rules, in file order (after the global ones).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// Replaces the global `prompt_timeout`.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "crate::escalation::rules::optional_seconds")]
    pub prompt_timeout: Option<Duration>,
    /// Replaces the global `timeout`.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "crate::escalation::rules::optional_seconds")]
    pub timeout: Option<Duration>,
    /// Replaces the global `output_limit`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_limit: Option<u64>,
}

impl EscalationOverrides {
    /// Whether the profile has no `escalation` settings of its own.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// `global` with these overrides applied and these rules appended.
    pub fn apply_to(&self, global: &EscalationSettings) -> EscalationSettings {
        let mut rules = global.rules.clone();
        rules.extend(self.rules.iter().cloned());
        EscalationSettings {
            rules,
            prompt_timeout: self.prompt_timeout.unwrap_or(global.prompt_timeout),
            timeout: self.timeout.unwrap_or(global.timeout),
            output_limit: self.output_limit.unwrap_or(global.output_limit),
        }
    }
}

/// One `[profiles.NAME]` table: an Agent Profile with defaults applied.
///
/// `==` also compares source locations (`origin`s); compare
/// [`Config::fingerprint`]s to compare meaning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// The profile's name (the `NAME` of `[profiles.NAME]`).
    #[serde(skip)]
    pub name: String,
    /// Image name (as in `lazaret image import NAME`) or registry reference.
    pub image: String,
    /// The agent's argv; default [`DEFAULT_COMMAND`].
    pub command: Vec<String>,
    /// Whether git-ignored workspace paths get Ignored Workspace State
    /// (default true; FR-9).
    pub isolate_gitignored: bool,
    /// Sandbox paths kept in the State Anchor across restarts (default none).
    pub persistent_dirs: Vec<PathBuf>,
    /// Destination prefixes opened in addition to the defaults.
    pub allow_egress: Vec<Located<Prefix>>,
    /// Destination prefixes closed in addition to the defaults.
    pub deny_egress: Vec<Located<Prefix>>,
    /// `egress`: open (default: the public internet) or locked (only what
    /// `allow_egress` names).
    #[serde(skip_serializing_if = "EgressMode::is_open")]
    pub egress: EgressMode,
    /// The name entries of `allow_egress` (`api.anthropic.com`,
    /// `*.npmjs.org`, `github.com:22`); only with `egress = "locked"`.
    /// `config show` writes them back into `allow_egress` (so its output
    /// parses); `--json` keeps them apart, as `allow_egress_names`.
    #[serde(rename = "allow_egress_names", skip_serializing_if = "Vec::is_empty")]
    pub allow_names: Vec<Located<AllowName>>,
    /// IPv6 on or off; `None` leaves the choice to the network policy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<bool>,
    /// Per-profile DNS resolvers; `None` uses the top-level `dns`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns: Option<Vec<IpAddr>>,
    /// Environment variables of the agent.
    pub env: BTreeMap<String, EnvValue>,
    /// Extra host directories bound into the sandbox, in mount order.
    pub volumes: Vec<Located<Volume>>,
    /// Directories of the agent's home kept per (developer, profile) in the
    /// Storage Root and bound into every Domain of the profile (a set).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub profile_state: Vec<Located<StateEntry>>,
    /// Which user the agent runs as.
    pub user: UserChoice,
    /// Sandbox hostname; `None` lets the launcher choose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Memory limit in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<u64>,
    /// Maximum number of processes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<u64>,
    /// The effective escalation settings of this profile: the global
    /// `[escalation]` merged with [`Profile::escalation_overrides`].
    #[serde(skip)]
    pub escalation: EscalationSettings,
    /// What `[profiles.NAME.escalation]` writes itself.
    #[serde(rename = "escalation", skip_serializing_if = "EscalationOverrides::is_empty")]
    pub escalation_overrides: EscalationOverrides,
    /// Provisioning: argument vectors run in order, as root inside the
    /// sandbox (without the workspace), on the Domain's first start and
    /// whenever they (or the image, or `persistent_dirs`) change; their
    /// results persist in the State Anchor. See `daemon::provision`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub setup: Vec<Vec<String>>,
    /// Where the profile table starts, `FILE:LINE:COLUMN`.
    #[serde(skip)]
    pub origin: String,
}

/// Bounds of a profile's `setup` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupLimits {
    /// Most steps in one profile.
    pub steps: usize,
    /// Most elements in one step's argv.
    pub args: usize,
    /// Most bytes in one step's argv (each element plus one).
    pub step_bytes: usize,
}

/// The limits of `setup`: generous for real installs, small enough that a
/// typo (a whole file pasted in) is caught.
pub const SETUP_LIMITS: SetupLimits = SetupLimits { steps: 64, args: 1024, step_bytes: 64 * 1024 };

/// The value of one `env` entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum EnvValue {
    /// A value written in the configuration.
    Literal(String),
    /// `"env:NAME"`: taken from the launching session's environment.
    FromHost(String),
}

impl EnvValue {
    /// The value for the sandbox, looking `FromHost` names up with `lookup`;
    /// `None` when the host variable is unset.
    pub fn resolve(&self, lookup: &dyn Fn(&str) -> Option<OsString>) -> Option<OsString> {
        match self {
            EnvValue::Literal(value) => Some(OsString::from(value)),
            EnvValue::FromHost(name) => lookup(name),
        }
    }
}

impl fmt::Display for EnvValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvValue::Literal(value) => f.write_str(value),
            EnvValue::FromHost(name) => write!(f, "env:{name}"),
        }
    }
}

impl Serialize for EnvValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A profile's `egress` key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EgressMode {
    /// The public internet is reachable; private and special ranges are not.
    #[default]
    Open,
    /// Only the `allow_egress` prefixes and names are reachable.
    Locked,
}

impl EgressMode {
    /// Whether this is the default, open mode.
    pub fn is_open(&self) -> bool {
        *self == EgressMode::Open
    }
}

/// One name entry of `allow_egress`: a name or `*.` wildcard, maybe a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AllowName {
    /// The names matched.
    pub pattern: lazaret_netpolicy::NamePattern,
    /// The only port opened, if any.
    pub port: Option<u16>,
}

impl fmt::Display for AllowName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.pattern),
            None => write!(f, "{}", self.pattern),
        }
    }
}

impl Serialize for AllowName {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The `user` key: which uid/gid the agent runs as inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserChoice {
    /// The developer's own uid/gid (default), so workspace files keep their
    /// owner.
    Developer,
    /// uid 0 inside the sandbox.
    Root,
    /// An explicit `"UID:GID"`.
    Id {
        /// User id.
        uid: u32,
        /// Group id.
        gid: u32,
    },
}

impl UserChoice {
    /// The numeric uid/gid for `developer`.
    pub fn ids(self, developer: &Developer) -> (u32, u32) {
        match self {
            UserChoice::Developer => (developer.uid, developer.gid),
            UserChoice::Root => (0, 0),
            UserChoice::Id { uid, gid } => (uid, gid),
        }
    }
}

impl fmt::Display for UserChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserChoice::Developer => f.write_str("developer"),
            UserChoice::Root => f.write_str("root"),
            UserChoice::Id { uid, gid } => write!(f, "{uid}:{gid}"),
        }
    }
}

impl Serialize for UserChoice {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Profile {
    /// DNS resolvers of this profile: its own `dns`, else the top-level one.
    pub fn effective_dns<'a>(&'a self, config: &'a Config) -> &'a [IpAddr] {
        self.dns.as_deref().unwrap_or(&config.dns)
    }

    /// Every host path this profile mounts into the sandbox, labelled for
    /// error messages: the workspace first, then each volume. Feed this to
    /// [`check_confinement`].
    pub fn host_mounts(&self, workspace: &Path) -> Vec<(String, PathBuf)> {
        let mut mounts = vec![("workspace".to_string(), workspace.to_path_buf())];
        for volume in &self.volumes {
            mounts.push((format!("volume {} ({})", volume.written, volume.origin), volume.host.clone()));
        }
        mounts
    }
}

/// Refuses a configuration whose real location (of the opened file, after
/// every symlink) has a directory above it that someone other than root or
/// the developer could change: owned by another user, or writable by group
/// or others without the sticky bit. Such a user could replace the file (or
/// a directory on its way) between runs.
fn check_directories(file: &std::fs::File, path: &Path, developer: &Developer) -> Result<(), ConfigError> {
    use std::os::fd::AsRawFd;
    let read_error = |source| ConfigError::Read { path: path.to_path_buf(), source };
    let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).map_err(read_error)?;
    for dir in real.ancestors().skip(1) {
        let metadata = std::fs::metadata(dir).map_err(read_error)?;
        let owner_ok = metadata.uid() == 0 || metadata.uid() == developer.uid;
        let others_may_write = metadata.mode() & 0o022 != 0 && metadata.mode() & 0o1000 == 0;
        if !owner_ok || others_may_write {
            let reason = if owner_ok {
                format!(
                    "its directory {} is writable by group or others (mode {:o}), who could replace the file",
                    dir.display(),
                    metadata.mode() & 0o7777
                )
            } else {
                format!(
                    "its directory {} is owned by uid {}, neither root nor the developer (uid {}), who could replace the file",
                    dir.display(),
                    metadata.uid(),
                    developer.uid
                )
            };
            let hint = if real.as_path() != path {
                format!(
                    "{} is where {} points; keep the configuration in a directory only you (or root) may change",
                    real.display(),
                    path.display()
                )
            } else {
                format!("keep the configuration in a directory only you (or root) may change, e.g. `chmod go-w {}`", dir.display())
            };
            return Err(ConfigError::Insecure { path: path.to_path_buf(), reason, hint });
        }
    }
    Ok(())
}

impl Config {
    /// Reads and validates the configuration at `path`. `~/` in volumes is
    /// the developer's home.
    ///
    /// Refuses a file that is not a regular file, or that someone other than
    /// root or the developer could modify (it decides what gets mounted into
    /// a sandbox started by root), directly or by changing a directory above
    /// its real location (see [`check_directories`]). Records the owner
    /// ([`Config::file_owner`]) for [`trust`].
    pub fn load(path: &Path, developer: &Developer) -> Result<Config, ConfigError> {
        // Root reads it on the developer's behalf: not a file they could not
        // read themselves (its errors would leak a root-only file's text).
        if developer.uid != 0 {
            let groups: Vec<u32> = developer.groups.iter().map(|g| g.gid).collect();
            match lazaret_mounts::access_as(path, developer.uid, developer.gid, &groups, libc::R_OK) {
                Ok(Err(errno @ (nix::errno::Errno::EACCES | nix::errno::Errno::EPERM))) => {
                    return Err(ConfigError::Insecure {
                        path: path.to_path_buf(),
                        reason: format!(
                            "you (uid {}) may not read it yourself ({errno}), and Lazaret reads it as root only on your behalf",
                            developer.uid
                        ),
                        hint: "point --config (or $LAZARET_CONFIG) at a configuration you may read".to_string(),
                    });
                }
                Ok(_) => {}
                Err(source) => return Err(ConfigError::Read { path: path.to_path_buf(), source }),
            }
        }
        // One open, then fstat: the checked file is the file that is read.
        // O_NONBLOCK: opening a FIFO planted at the path must not hang.
        let opened = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path);
        let mut file = match opened {
            Ok(file) => file,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(ConfigError::NotFound { path: path.to_path_buf(), source_of_path: "the given path".to_string() });
            }
            Err(source) => {
                return Err(ConfigError::Read { path: path.to_path_buf(), source });
            }
        };
        let read_error = |source| ConfigError::Read { path: path.to_path_buf(), source };
        let metadata = file.metadata().map_err(read_error)?;
        if !metadata.is_file() {
            return Err(ConfigError::Insecure {
                path: path.to_path_buf(),
                reason: "not a regular file".to_string(),
                hint: "point --config or $LAZARET_CONFIG at a TOML file".to_string(),
            });
        }
        if metadata.uid() != 0 && metadata.uid() != developer.uid {
            return Err(ConfigError::Insecure {
                path: path.to_path_buf(),
                reason: format!("owned by uid {}, neither root nor the developer (uid {})", metadata.uid(), developer.uid),
                hint: format!("chown {} {}", developer.uid, path.display()),
            });
        }
        if metadata.mode() & 0o022 != 0 {
            return Err(ConfigError::Insecure {
                path: path.to_path_buf(),
                reason: format!("writable by group or others (mode {:o})", metadata.mode() & 0o7777),
                hint: format!("chmod go-w {}", path.display()),
            });
        }
        check_directories(&file, path, developer)?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(read_error)?;
        let mut config = Config::parse(&text, path, &developer.home)?;
        config.file_owner = Some(metadata.uid());
        Ok(config)
    }

    /// Parses and validates configuration text. `file` is used in error
    /// locations and kept in [`Config::file`]; `home` replaces `~/` in volumes.
    pub fn parse(text: &str, file: &Path, home: &Path) -> Result<Config, ConfigError> {
        parse::parse(text, file, home)
    }

    /// The profile called `name`.
    pub fn profile(&self, name: &str) -> Result<&Profile, ConfigError> {
        self.profiles
            .get(name)
            .ok_or_else(|| ConfigError::UnknownProfile { name: name.to_string(), known: self.profiles.keys().cloned().collect() })
    }

    /// The profile named on the command line, else `default_profile`, else
    /// the only profile if there is exactly one.
    pub fn select_profile(&self, requested: Option<&str>) -> Result<&Profile, ConfigError> {
        if let Some(name) = requested.or(self.default_profile.as_deref()) {
            return self.profile(name);
        }
        match self.profiles.values().next() {
            Some(only) if self.profiles.len() == 1 => Ok(only),
            _ => Err(ConfigError::NoProfileSelected { known: self.profiles.keys().cloned().collect() }),
        }
    }

    /// The developer's host-private runtime directory: `runtime_dir` if
    /// configured, else `/run/lazaret/<uid>`.
    pub fn runtime_dir(&self, developer: &Developer) -> PathBuf {
        self.runtime_dir.clone().unwrap_or_else(|| Path::new(DEFAULT_RUNTIME_PARENT).join(developer.uid.to_string()))
    }

    /// The Configuration Fingerprint of a Domain using `profile`: SHA-256 over
    /// the canonical form of the global settings plus that profile only.
    pub fn fingerprint(&self, profile: &str) -> Result<Fingerprint, ConfigError> {
        fingerprint::fingerprint(self, self.profile(profile)?)
    }

    /// The validated configuration as TOML, defaults filled in (for
    /// `lazaret config show`). `env:` references are shown as references.
    pub fn render_toml(&self) -> Result<String, ConfigError> {
        fingerprint::render_toml(self)
    }

    /// The validated configuration as pretty JSON (for
    /// `lazaret config show --json`).
    pub fn render_json(&self) -> Result<String, ConfigError> {
        fingerprint::render_json(self)
    }
}
