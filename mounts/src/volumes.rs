//! Profile volumes (`volumes = ["HOST:SANDBOX[:ro]"]`): parsing and the
//! checks that keep them from undoing other protections.
//!
//! A volume may not contain the host configuration file
//! (ConfigurationConfinement), may not overlap a Git Sentry path on the host
//! side (exposing it writable), and may not lie at or inside a Git Sentry
//! path on the sandbox side (shadowing the read-only bind). A volume above
//! one (e.g. a volume whose sandbox path contains the workspace) is fine:
//! the bundle mounts parents before the mounts below them
//! (`lazaret_oci::bundle`), so the Git Sentry binds still cover their paths.
//!
//! `~` means a home on both sides, but not the same one: on the host side
//! the developer's (known when the configuration is parsed), on the sandbox
//! side the agent's HOME inside the sandbox, which depends on the user the
//! agent runs as. The sandbox side therefore stays a [`SandboxPath`] until
//! [`Volume::resolve`] is given that home, and every check of sandbox paths
//! runs on the resolved [`VolumeMount`].

use std::fmt;
use std::path::{Component, Path, PathBuf};

use crate::error::MountError;
use crate::git_sentry::SentryPlan;
use crate::plan::WorkspacePlan;
use crate::repo::GitDirPath;

/// One volume: a host directory or file bound into the sandbox.
///
/// The configuration's `volumes` entries are this type (parsed by
/// [`Volume::parse`], with their location kept by the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Absolute, normalised host path (`~/` replaced by the home given to
    /// [`Volume::parse`]); [`parse_volume`] also canonicalises it.
    pub host: PathBuf,
    /// The sandbox path as parsed: absolute, or below the agent's home.
    pub sandbox: SandboxPath,
    /// `:ro` was given.
    pub readonly: bool,
    /// The entry as written, e.g. `~/.claude:~/.claude` (for messages).
    pub written: String,
}

/// `HOST:SANDBOX` or `HOST:SANDBOX:ro`, with the paths as parsed (a sandbox
/// path below the agent's home as `~/...`: this is the form the
/// Configuration Fingerprint hashes, so it does not change with the
/// developer's name, and an absolute sandbox path hashes as it always did).
impl fmt::Display for Volume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host.display(), self.sandbox)?;
        if self.readonly {
            f.write_str(":ro")?;
        }
        Ok(())
    }
}

/// The sandbox side of a volume as written.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SandboxPath {
    /// An absolute, normalised path (never `/`).
    Absolute(PathBuf),
    /// `~` (empty) or `~/REL`: REL below the agent's home inside the
    /// sandbox, normalised, relative, without `..`.
    AgentHome(PathBuf),
}

impl SandboxPath {
    /// The path inside the sandbox, for an agent whose HOME is `agent_home`.
    pub fn resolve(&self, agent_home: &Path) -> PathBuf {
        match self {
            SandboxPath::Absolute(path) => path.clone(),
            SandboxPath::AgentHome(rel) if rel.as_os_str().is_empty() => agent_home.to_path_buf(),
            SandboxPath::AgentHome(rel) => agent_home.join(rel),
        }
    }
}

/// The path as parsed: `/abs`, `~` or `~/rel`.
impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SandboxPath::Absolute(path) => write!(f, "{}", path.display()),
            SandboxPath::AgentHome(rel) if rel.as_os_str().is_empty() => f.write_str("~"),
            SandboxPath::AgentHome(rel) => write!(f, "~/{}", rel.display()),
        }
    }
}

/// A volume with its sandbox path resolved for one agent
/// ([`Volume::resolve`]): what is checked and bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMount {
    /// The host path, as in [`Volume::host`] (callers may canonicalise it).
    pub host: PathBuf,
    /// The absolute sandbox path.
    pub sandbox: PathBuf,
    /// `:ro` was given.
    pub readonly: bool,
    /// The entry as written (for messages).
    pub written: String,
}

/// `HOST:SANDBOX` or `HOST:SANDBOX:ro`, with both paths absolute.
impl fmt::Display for VolumeMount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host.display(), self.sandbox.display())?;
        if self.readonly {
            f.write_str(":ro")?;
        }
        Ok(())
    }
}

/// Why a path is not an acceptable absolute path (see [`normalise_absolute`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathProblem {
    /// The path is empty.
    Empty,
    /// The path does not start with `/`.
    Relative,
    /// The path contains `..` (refused rather than resolved).
    DotDot,
    /// The path is `/` itself.
    Root,
}

/// Which side of a volume a path is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The host path (before the first `:`).
    Host,
    /// The sandbox path (after the first `:`).
    Sandbox,
}

/// Why a `HOST:SANDBOX[:ro|:rw]` entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    /// A third part other than `ro` or `rw`.
    #[error("volume {spec:?} has unknown option {option:?}")]
    UnknownOption {
        /// The entry as written.
        spec: String,
        /// The option as written.
        option: String,
    },
    /// Not two or three `:`-separated parts.
    #[error("volume {spec:?} is not HOST:SANDBOX[:ro]")]
    NotHostSandbox {
        /// The entry as written.
        spec: String,
    },
    /// A `~/...` path with a `..` component, on either side.
    #[error("volume {} path {path:?} contains `..`", side.name())]
    HomeDotDot {
        /// Which side the path is on.
        side: Side,
        /// The path as written.
        path: String,
    },
    /// `~user/...`: on the host side only the developer's own `~/` is
    /// supported, on the sandbox side only the agent's.
    #[error("volume {} path {path:?}: {}", side.name(), match side { Side::Host => "only ~/ (your home on the host) is supported, not ~user/", Side::Sandbox => "only ~/ (the agent's home inside the sandbox) is supported, not ~user/" })]
    OtherHome {
        /// Which side the path is on.
        side: Side,
        /// The path as written.
        path: String,
    },
    /// A host or sandbox path that is not an acceptable absolute path.
    #[error("volume {spec:?}: {} path {path:?} {}", side.name(), problem.describe())]
    Path {
        /// The entry as written.
        spec: String,
        /// Which side the path is on.
        side: Side,
        /// True when the path was written as `~` or `~/...`.
        from_home: bool,
        /// The path checked (for a `~/` host path, after joining the home).
        path: String,
        /// What is wrong with it.
        problem: PathProblem,
    },
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Host => "host",
            Side::Sandbox => "sandbox",
        }
    }
}

impl PathProblem {
    fn describe(self) -> &'static str {
        match self {
            PathProblem::Empty => "is empty",
            PathProblem::Relative => "is a relative path",
            PathProblem::DotDot => "contains `..`",
            PathProblem::Root => "may not be `/`",
        }
    }
}

/// Absolute path with `.` and repeated `/` removed; `..` is refused rather
/// than resolved (resolving it lexically can be wrong under symlinks), and so
/// is `/` itself. No filesystem access.
pub fn normalise_absolute(text: &str) -> Result<PathBuf, PathProblem> {
    if text.is_empty() {
        return Err(PathProblem::Empty);
    }
    if !text.starts_with('/') {
        return Err(PathProblem::Relative);
    }
    let mut out = PathBuf::from("/");
    for component in Path::new(text).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err(PathProblem::DotDot),
            Component::Normal(part) => out.push(part),
            Component::Prefix(_) => return Err(PathProblem::Relative),
        }
    }
    if out == Path::new("/") {
        return Err(PathProblem::Root);
    }
    Ok(out)
}

/// `~` or `~/...` (the rest, relative, with `.` and repeated `/` removed),
/// `None` for a path not starting with `~`; `~user/...` and `..` refused.
fn home_relative(text: &str, side: Side) -> Result<Option<PathBuf>, VolumeError> {
    let Some(rest) = text.strip_prefix('~') else { return Ok(None) };
    if !rest.is_empty() && !rest.starts_with('/') {
        return Err(VolumeError::OtherHome { side, path: text.to_string() });
    }
    let mut rel = PathBuf::new();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(VolumeError::HomeDotDot { side, path: text.to_string() }),
            part => rel.push(part),
        }
    }
    Ok(Some(rel))
}

impl Volume {
    /// Parses `HOST:SANDBOX[:ro|:rw]`; `~` or `~/...` in HOST means `home`
    /// (the developer's), in SANDBOX the agent's home inside the sandbox
    /// (kept as [`SandboxPath::AgentHome`]: see [`Volume::resolve`]). Paths
    /// must be absolute or start with `~/`, without `..`, and not `/`. No
    /// filesystem access: the host path need not exist yet.
    pub fn parse(spec: &str, home: &Path) -> Result<Volume, VolumeError> {
        let parts: Vec<&str> = spec.split(':').collect();
        let (host, sandbox, readonly) = match parts.as_slice() {
            [host, sandbox] => (*host, *sandbox, false),
            [host, sandbox, "ro"] => (*host, *sandbox, true),
            [host, sandbox, "rw"] => (*host, *sandbox, false),
            [_, _, option] => {
                return Err(VolumeError::UnknownOption { spec: spec.to_string(), option: option.to_string() });
            }
            _ => return Err(VolumeError::NotHostSandbox { spec: spec.to_string() }),
        };
        let path_error = |side, from_home, path: &str, problem| VolumeError::Path {
            spec: spec.to_string(),
            side,
            from_home,
            path: path.to_string(),
            problem,
        };
        let host_path = match home_relative(host, Side::Host)? {
            Some(rest) => {
                let joined = home.join(rest).to_string_lossy().into_owned();
                normalise_absolute(&joined).map_err(|problem| path_error(Side::Host, true, &joined, problem))?
            }
            None => normalise_absolute(host).map_err(|problem| path_error(Side::Host, false, host, problem))?,
        };
        let sandbox_path = match home_relative(sandbox, Side::Sandbox)? {
            Some(rest) => SandboxPath::AgentHome(rest),
            None => {
                SandboxPath::Absolute(normalise_absolute(sandbox).map_err(|problem| path_error(Side::Sandbox, false, sandbox, problem))?)
            }
        };
        Ok(Volume { host: host_path, sandbox: sandbox_path, readonly, written: spec.to_string() })
    }

    /// This volume for an agent whose HOME inside the sandbox is
    /// `agent_home` (absolute): `~/...` on the sandbox side becomes a path
    /// below it. The result still has to pass every check of sandbox paths
    /// ([`validate_volumes`], the caller's own).
    pub fn resolve(&self, agent_home: &Path) -> VolumeMount {
        VolumeMount {
            host: self.host.clone(),
            sandbox: self.sandbox.resolve(agent_home),
            readonly: self.readonly,
            written: self.written.clone(),
        }
    }
}

/// [`Volume::parse`], then canonicalises the host path, which must exist
/// (symlinks of the trusted host configuration are resolved).
pub fn parse_volume(spec: &str, home: &Path) -> Result<Volume, MountError> {
    let mut volume = Volume::parse(spec, home).map_err(|e| MountError::Config(e.to_string()))?;
    volume.host = std::fs::canonicalize(&volume.host)
        .map_err(|e| MountError::Config(format!("volume {spec:?}: host path {}: {e}", volume.host.display())))?;
    Ok(volume)
}

/// True if one path is the other or contains it (component-wise).
pub fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Host and sandbox paths of every Git Sentry protection of a plan.
pub fn sentry_paths(plan: &WorkspacePlan) -> (Vec<PathBuf>, Vec<PathBuf>) {
    sentry_paths_of(&plan.sentry, &plan.workspace, &plan.sandbox_workspace)
}

fn sentry_paths_of(sentry: &SentryPlan, workspace: &Path, sandbox_workspace: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut host = Vec::new();
    let mut sandbox = Vec::new();
    for protected in &sentry.protected {
        match &protected.path {
            GitDirPath::Inside(rel) => {
                host.push(workspace.join(rel));
                sandbox.push(sandbox_workspace.join(rel));
            }
            GitDirPath::Outside(abs) => {
                host.push(abs.clone());
                sandbox.push(abs.clone());
            }
        }
    }
    (host, sandbox)
}

/// Checks volumes against the configuration file (`config_file`, any path:
/// it is canonicalised if it exists) and the Git Sentry paths
/// (`sentry_host`, `sentry_sandbox`, e.g. from [`sentry_paths`]).
/// `other_protected_host` lets the caller add paths no volume may touch
/// (storage root, runtime dir).
pub fn validate_volumes(
    volumes: &[VolumeMount],
    config_file: &Path,
    sentry_host: &[PathBuf],
    sentry_sandbox: &[PathBuf],
    other_protected_host: &[PathBuf],
) -> Result<(), MountError> {
    let config = std::fs::canonicalize(config_file).unwrap_or_else(|_| config_file.to_owned());
    for volume in volumes {
        if config.starts_with(&volume.host) {
            return Err(MountError::Config(format!(
                "volume {} would expose the Lazaret configuration file {} to the sandbox (ConfigurationConfinement); choose a narrower host path",
                volume.host.display(),
                config.display()
            )));
        }
        for protected in sentry_host.iter().chain(other_protected_host) {
            if overlaps(&volume.host, protected) {
                return Err(MountError::Config(format!(
                    "volume {} overlaps protected host path {}; choose a path that neither contains nor lies inside it",
                    volume.host.display(),
                    protected.display()
                )));
            }
        }
        for protected in sentry_sandbox {
            // Above a Git Sentry path is fine: mounted first (parents
            // before children), the Git Sentry bind then covers its path.
            if volume.sandbox.starts_with(protected) {
                return Err(MountError::Config(format!(
                    "volume destination {} overlaps the Git Sentry path {} inside the sandbox",
                    volume.sandbox.display(),
                    protected.display()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_validate() {
        let home = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(home.path().join("cache")).expect("mkdir");
        std::fs::create_dir_all(home.path().join(".config/lazaret")).expect("mkdir");
        let config = home.path().join(".config/lazaret/config.toml");
        std::fs::write(&config, "").expect("write");
        let v = parse_volume("~/cache:/root/.cache:ro", home.path()).expect("parse");
        assert!(v.readonly);
        assert_eq!(v.sandbox, SandboxPath::Absolute(PathBuf::from("/root/.cache")));
        let v = v.resolve(Path::new("/home/dev"));
        assert!(parse_volume("~/cache", home.path()).is_err());
        assert!(parse_volume("~/cache:rel", home.path()).is_err());
        assert!(parse_volume("~/cache:/a/../b", home.path()).is_err());
        assert!(parse_volume("~/missing:/x", home.path()).is_err());
        assert!(parse_volume("~/cache:/x:rx", home.path()).is_err());

        let ws = home.path().join("ws");
        let hooks = ws.join(".git/hooks");
        let sentry_host = vec![hooks.clone()];
        let sentry_sandbox = vec![PathBuf::from("/workspace/.git/hooks")];
        validate_volumes(std::slice::from_ref(&v), &config, &sentry_host, &sentry_sandbox, &[]).expect("fine");
        let whole_home = parse_volume("~:/home/dev", home.path()).expect("parse").resolve(Path::new("/home/dev"));
        let err = validate_volumes(&[whole_home], &config, &sentry_host, &sentry_sandbox, &[]).expect_err("config");
        assert!(err.to_string().contains("ConfigurationConfinement"), "{err}");
        let ws_parent = VolumeMount { host: ws.clone(), sandbox: PathBuf::from("/w2"), readonly: true, written: String::new() };
        assert!(validate_volumes(&[ws_parent], &config, &sentry_host, &sentry_sandbox, &[]).is_err());
        for inside in ["/workspace/.git/hooks", "/workspace/.git/hooks/pre-commit"] {
            let shadow =
                VolumeMount { host: home.path().join("cache"), sandbox: PathBuf::from(inside), readonly: false, written: String::new() };
            let err = validate_volumes(&[shadow], &config, &sentry_host, &sentry_sandbox, &[]).expect_err(inside);
            assert!(err.to_string().contains("overlaps the Git Sentry path"), "{err}");
        }
        // Above a Git Sentry path (here: containing the whole workspace) is
        // fine: the bundle mounts it before the Git Sentry binds.
        for above in ["/workspace/.git", "/workspace"] {
            let parent =
                VolumeMount { host: home.path().join("cache"), sandbox: PathBuf::from(above), readonly: false, written: String::new() };
            validate_volumes(&[parent], &config, &sentry_host, &sentry_sandbox, &[]).expect(above);
        }
        let storage =
            VolumeMount { host: home.path().join("cache"), sandbox: PathBuf::from("/c"), readonly: false, written: String::new() };
        assert!(validate_volumes(&[storage], &config, &[], &[], &[home.path().join("cache/x")]).is_err());
        assert!(!overlaps(Path::new("/a/bc"), Path::new("/a/b")));
    }

    #[test]
    fn parse_is_lexical_and_says_what_is_wrong() {
        let home = Path::new("/home/dev");
        let v = Volume::parse("~/.claude:/root/.claude", home).expect("parse");
        assert_eq!(v.sandbox, SandboxPath::Absolute(PathBuf::from("/root/.claude")));
        assert_eq!(v.host, PathBuf::from("/home/dev/.claude"));
        assert_eq!(v.written, "~/.claude:/root/.claude");
        assert_eq!(v.to_string(), "/home/dev/.claude:/root/.claude");
        let v = Volume::parse("/a/./b//c:/x:rw", home).expect("parse");
        assert_eq!((v.host, v.readonly), (PathBuf::from("/a/b/c"), false));
        assert_eq!(Volume::parse("~:/h:ro", home).expect("parse").to_string(), "/home/dev:/h:ro");
        let error = |spec: &str| Volume::parse(spec, home).expect_err(spec);
        assert_eq!(error("/a:/b:rx").to_string(), "volume \"/a:/b:rx\" has unknown option \"rx\"");
        assert!(matches!(error("/a"), VolumeError::NotHostSandbox { .. }));
        assert!(matches!(error("/a:/b:ro:x"), VolumeError::NotHostSandbox { .. }));
        assert!(matches!(error("~/../etc:/e"), VolumeError::HomeDotDot { side: Side::Host, .. }));
        assert!(matches!(error("~root/x:/e"), VolumeError::OtherHome { side: Side::Host, .. }));
        assert_eq!(
            error("rel:/x"),
            VolumeError::Path {
                spec: "rel:/x".into(),
                side: Side::Host,
                from_home: false,
                path: "rel".into(),
                problem: PathProblem::Relative
            }
        );
        assert_eq!(error("rel:/x").to_string(), "volume \"rel:/x\": host path \"rel\" is a relative path");
        assert!(matches!(error("/:/x"), VolumeError::Path { side: Side::Host, problem: PathProblem::Root, .. }));
        assert!(matches!(error("~/a:/"), VolumeError::Path { side: Side::Sandbox, from_home: false, problem: PathProblem::Root, .. }));
        assert!(matches!(error("/a:"), VolumeError::Path { side: Side::Sandbox, problem: PathProblem::Empty, .. }));
        assert!(matches!(error("/a:/b/../c"), VolumeError::Path { side: Side::Sandbox, problem: PathProblem::DotDot, .. }));
    }

    #[test]
    fn a_sandbox_path_below_tilde_is_the_agents_home_once_resolved() {
        let home = Path::new("/home/dev");
        let v = Volume::parse("~/.claude:~/.claude", home).expect("parse");
        assert_eq!(v.host, PathBuf::from("/home/dev/.claude"));
        assert_eq!(v.sandbox, SandboxPath::AgentHome(PathBuf::from(".claude")));
        // Parsed, the sandbox side is not yet any one path: the fingerprint
        // and `config show` see `~/...`, not the developer's name.
        assert_eq!(v.to_string(), "/home/dev/.claude:~/.claude");
        let for_alice = v.resolve(Path::new("/home/alice"));
        assert_eq!(
            (for_alice.host.as_path(), for_alice.sandbox.as_path()),
            (Path::new("/home/dev/.claude"), Path::new("/home/alice/.claude"))
        );
        assert_eq!(for_alice.to_string(), "/home/dev/.claude:/home/alice/.claude");
        assert_eq!(for_alice.written, "~/.claude:~/.claude");
        assert_eq!(v.resolve(Path::new("/root")).sandbox, PathBuf::from("/root/.claude"));
        // Normalised like an absolute path; `~` alone is the home itself.
        let v = Volume::parse("/srv/x:~//a/./b/:ro", home).expect("parse");
        assert_eq!((v.sandbox.clone(), v.readonly), (SandboxPath::AgentHome(PathBuf::from("a/b")), true));
        assert_eq!(v.to_string(), "/srv/x:~/a/b:ro");
        assert_eq!(v.resolve(Path::new("/root")).sandbox, PathBuf::from("/root/a/b"));
        let whole = Volume::parse("/srv/x:~", home).expect("parse");
        assert_eq!(whole.sandbox.to_string(), "~");
        assert_eq!(whole.resolve(Path::new("/home/alice")).sandbox, PathBuf::from("/home/alice"));
        // An absolute sandbox path resolves to itself, whoever the agent is.
        let v = Volume::parse("~/c:/opt/c", home).expect("parse");
        assert_eq!(v.resolve(Path::new("/root")).sandbox, v.resolve(Path::new("/home/alice")).sandbox);
    }

    #[test]
    fn other_users_homes_and_escapes_are_refused_on_the_sandbox_side() {
        let home = Path::new("/home/dev");
        let error = |spec: &str| Volume::parse(spec, home).expect_err(spec);
        for spec in ["/a:~root/x", "/a:~root", "~/a:~dev/.claude"] {
            let e = error(spec);
            assert!(matches!(e, VolumeError::OtherHome { side: Side::Sandbox, .. }), "{spec}: {e:?}");
            assert!(e.to_string().contains("only ~/ (the agent's home inside the sandbox) is supported, not ~user/"), "{e}");
        }
        assert_eq!(
            error("/a:~root/x").to_string(),
            "volume sandbox path \"~root/x\": only ~/ (the agent's home inside the sandbox) is supported, not ~user/"
        );
        assert_eq!(
            error("~root/x:/x").to_string(),
            "volume host path \"~root/x\": only ~/ (your home on the host) is supported, not ~user/"
        );
        for spec in ["/a:~/..", "/a:~/../etc", "/a:~/x/../../etc", "/a:~/x/.."] {
            let e = error(spec);
            assert!(matches!(e, VolumeError::HomeDotDot { side: Side::Sandbox, .. }), "{spec}: {e:?}");
        }
        assert_eq!(error("/a:~/../etc").to_string(), "volume sandbox path \"~/../etc\" contains `..`");
        assert_eq!(error("~/../etc:/e").to_string(), "volume host path \"~/../etc\" contains `..`");
        // A name that only starts with dots is no escape.
        assert_eq!(Volume::parse("/a:~/..x", home).expect("parse").sandbox, SandboxPath::AgentHome(PathBuf::from("..x")));
    }

    #[test]
    fn a_resolved_home_path_meets_the_git_sentry_check() {
        // A workspace below the agent's home: a `~/...` volume over its
        // hooks is refused once resolved, as the absolute form is.
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("config.toml");
        let v = Volume::parse("/srv/x:~/src/p/.git/hooks", Path::new("/home/dev")).expect("parse");
        let sentry_sandbox = vec![PathBuf::from("/home/alice/src/p/.git/hooks")];
        let err = validate_volumes(&[v.resolve(Path::new("/home/alice"))], &config, &[], &sentry_sandbox, &[]).expect_err("over the hooks");
        assert!(err.to_string().contains("volume destination /home/alice/src/p/.git/hooks overlaps the Git Sentry path"), "{err}");
        validate_volumes(&[v.resolve(Path::new("/root"))], &config, &[], &sentry_sandbox, &[]).expect("elsewhere for root");
    }
}
