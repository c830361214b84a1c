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

use std::path::{Component, Path, PathBuf};

use crate::error::MountError;
use crate::git_sentry::SentryPlan;
use crate::plan::WorkspacePlan;
use crate::repo::GitDirPath;

/// One parsed volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Canonical host path (symlinks of the trusted host config resolved).
    pub host: PathBuf,
    /// Absolute, normalised sandbox path.
    pub sandbox: PathBuf,
    /// `:ro` was given.
    pub readonly: bool,
}

/// Parses `HOST:SANDBOX[:ro|:rw]`; `~` or `~/...` in HOST means `home`. The
/// host path must exist (it is canonicalised).
pub fn parse_volume(spec: &str, home: &Path) -> Result<Volume, MountError> {
    let parts: Vec<&str> = spec.split(':').collect();
    let (host, sandbox, readonly) = match parts.as_slice() {
        [host, sandbox] => (*host, *sandbox, false),
        [host, sandbox, "ro"] => (*host, *sandbox, true),
        [host, sandbox, "rw"] => (*host, *sandbox, false),
        _ => {
            return Err(MountError::Config(format!(
                "volume {spec:?} must be HOST:SANDBOX or HOST:SANDBOX:ro (paths containing ':' are not supported)"
            )));
        }
    };
    let host = if host == "~" {
        home.to_owned()
    } else if let Some(rest) = host.strip_prefix("~/") {
        home.join(rest)
    } else {
        PathBuf::from(host)
    };
    if !host.is_absolute() {
        return Err(MountError::Config(format!("volume {spec:?}: host path must be absolute or start with ~/")));
    }
    let host = std::fs::canonicalize(&host)
        .map_err(|e| MountError::Config(format!("volume {spec:?}: host path {}: {e}", host.display())))?;
    let sandbox = normalize_absolute(Path::new(sandbox))
        .ok_or_else(|| MountError::Config(format!("volume {spec:?}: sandbox path must be absolute, without '..'")))?;
    if sandbox == Path::new("/") {
        return Err(MountError::Config(format!("volume {spec:?}: cannot mount over the sandbox root")));
    }
    Ok(Volume { host, sandbox, readonly })
}

fn normalize_absolute(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() {
        return None;
    }
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name),
            _ => return None,
        }
    }
    Some(out)
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
        let ws_parent = Volume { host: ws.clone(), sandbox: PathBuf::from("/w2"), readonly: true };
        assert!(validate_volumes(&[ws_parent], &config, &sentry_host, &sentry_sandbox, &[]).is_err());
        for inside in ["/workspace/.git/hooks", "/workspace/.git/hooks/pre-commit"] {
            let shadow = Volume { host: home.path().join("cache"), sandbox: PathBuf::from(inside), readonly: false };
            let err = validate_volumes(&[shadow], &config, &sentry_host, &sentry_sandbox, &[]).expect_err(inside);
            assert!(err.to_string().contains("overlaps the Git Sentry path"), "{err}");
        }
        // Above a Git Sentry path (here: containing the whole workspace) is
        // fine: the bundle mounts it before the Git Sentry binds.
        for above in ["/workspace/.git", "/workspace"] {
            let parent = Volume { host: home.path().join("cache"), sandbox: PathBuf::from(above), readonly: false };
            validate_volumes(&[parent], &config, &sentry_host, &sentry_sandbox, &[]).expect(above);
        }
        let storage = Volume { host: home.path().join("cache"), sandbox: PathBuf::from("/c"), readonly: false };
        assert!(validate_volumes(&[storage], &config, &[], &[], &[home.path().join("cache/x")]).is_err());
        assert!(!overlaps(Path::new("/a/bc"), Path::new("/a/b")));
    }
}
