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
    /// Absolute, normalised sandbox path (never `/`).
    pub sandbox: PathBuf,
    /// `:ro` was given.
    pub readonly: bool,
    /// The entry as written, e.g. `~/.claude:/root/.claude` (for messages).
    pub written: String,
}

/// `HOST:SANDBOX` or `HOST:SANDBOX:ro`, with the paths as parsed.
impl fmt::Display for Volume {
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
    /// A `~/...` host path with a `..` component.
    #[error("volume host path {host:?} contains `..`")]
    HomeDotDot {
        /// The host part as written.
        host: String,
    },
    /// `~user/...` (only the developer's own `~/` is supported).
    #[error("volume host path {host:?}: only ~/ (the developer's home) is supported")]
    OtherHome {
        /// The host part as written.
        host: String,
    },
    /// A host or sandbox path that is not an acceptable absolute path.
    #[error("volume {spec:?}: {} path {path:?} {}", side.name(), problem.describe())]
    Path {
        /// The entry as written.
        spec: String,
        /// Which side the path is on.
        side: Side,
        /// True when the host path was written as `~` or `~/...`.
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

impl Volume {
    /// Parses `HOST:SANDBOX[:ro|:rw]`; `~` or `~/...` in HOST means `home`.
    /// Both paths must be absolute, without `..`, and not `/`. No filesystem
    /// access: the host path need not exist yet.
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
        let host_path = if host == "~" || host.starts_with("~/") {
            let rest = host.trim_start_matches('~').trim_start_matches('/');
            if rest.split('/').any(|part| part == "..") {
                return Err(VolumeError::HomeDotDot { host: host.to_string() });
            }
            let joined = home.join(rest).to_string_lossy().into_owned();
            normalise_absolute(&joined).map_err(|problem| path_error(Side::Host, true, &joined, problem))?
        } else if host.starts_with('~') {
            return Err(VolumeError::OtherHome { host: host.to_string() });
        } else {
            normalise_absolute(host).map_err(|problem| path_error(Side::Host, false, host, problem))?
        };
        let from_home = host.starts_with('~');
        let sandbox_path =
            normalise_absolute(sandbox).map_err(|problem| path_error(Side::Sandbox, from_home, sandbox, problem))?;
        Ok(Volume { host: host_path, sandbox: sandbox_path, readonly, written: spec.to_string() })
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
    volumes: &[Volume],
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
        assert_eq!(v.sandbox, PathBuf::from("/root/.cache"));
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
        let whole_home = parse_volume("~:/home/dev", home.path()).expect("parse");
        let err = validate_volumes(&[whole_home], &config, &sentry_host, &sentry_sandbox, &[]).expect_err("config");
        assert!(err.to_string().contains("ConfigurationConfinement"), "{err}");
        let ws_parent = Volume { host: ws.clone(), sandbox: PathBuf::from("/w2"), readonly: true, written: String::new() };
        assert!(validate_volumes(&[ws_parent], &config, &sentry_host, &sentry_sandbox, &[]).is_err());
        for inside in ["/workspace/.git/hooks", "/workspace/.git/hooks/pre-commit"] {
            let shadow = Volume { host: home.path().join("cache"), sandbox: PathBuf::from(inside), readonly: false, written: String::new() };
            let err = validate_volumes(&[shadow], &config, &sentry_host, &sentry_sandbox, &[]).expect_err(inside);
            assert!(err.to_string().contains("overlaps the Git Sentry path"), "{err}");
        }
        // Above a Git Sentry path (here: containing the whole workspace) is
        // fine: the bundle mounts it before the Git Sentry binds.
        for above in ["/workspace/.git", "/workspace"] {
            let parent = Volume { host: home.path().join("cache"), sandbox: PathBuf::from(above), readonly: false, written: String::new() };
            validate_volumes(&[parent], &config, &sentry_host, &sentry_sandbox, &[]).expect(above);
        }
        let storage = Volume { host: home.path().join("cache"), sandbox: PathBuf::from("/c"), readonly: false, written: String::new() };
        assert!(validate_volumes(&[storage], &config, &[], &[], &[home.path().join("cache/x")]).is_err());
        assert!(!overlaps(Path::new("/a/bc"), Path::new("/a/b")));
    }

    #[test]
    fn parse_is_lexical_and_says_what_is_wrong() {
        let home = Path::new("/home/dev");
        let v = Volume::parse("~/.claude:/root/.claude", home).expect("parse");
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
        assert!(matches!(error("~/../etc:/e"), VolumeError::HomeDotDot { .. }));
        assert!(matches!(error("~root/x:/e"), VolumeError::OtherHome { .. }));
        assert_eq!(
            error("rel:/x"),
            VolumeError::Path { spec: "rel:/x".into(), side: Side::Host, from_home: false, path: "rel".into(), problem: PathProblem::Relative }
        );
        assert_eq!(error("rel:/x").to_string(), "volume \"rel:/x\": host path \"rel\" is a relative path");
        assert!(matches!(error("/:/x"), VolumeError::Path { side: Side::Host, problem: PathProblem::Root, .. }));
        assert!(matches!(error("~/a:/"), VolumeError::Path { side: Side::Sandbox, from_home: true, problem: PathProblem::Root, .. }));
        assert!(matches!(error("/a:"), VolumeError::Path { side: Side::Sandbox, problem: PathProblem::Empty, .. }));
        assert!(matches!(error("/a:/b/../c"), VolumeError::Path { side: Side::Sandbox, problem: PathProblem::DotDot, .. }));
    }
}
