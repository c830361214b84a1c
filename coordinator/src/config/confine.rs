//! ConfigurationConfinement: the host configuration must never be visible
//! inside the sandbox.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use lazaret_protocol::display::escaped;

/// Why the configuration is not confined, or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum ConfinementError {
    /// The configuration file lies inside a host path that would be mounted
    /// into the sandbox.
    #[error(
        "configuration {} lies inside the {mount} mounted into the sandbox (host path {mp}); the agent could read or change it\n  hint: move the configuration outside {mp} (e.g. to ~/.config/lazaret/config.toml) or remove that mount from the profile",
        escaped(.config_file), mp = escaped(.mount_path)
    )]
    Inside {
        /// The configuration file (canonical).
        config_file: PathBuf,
        /// The label of the offending mount (e.g. `workspace`).
        mount: String,
        /// The mount's host path (canonical).
        mount_path: PathBuf,
    },
    /// A path could not be resolved or inspected.
    #[error("cannot check configuration confinement: {}: {source}", escaped(.path))]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Refuses when `config_file` lies inside (or is) any host path in `mounts`
/// (`(label, host path)` pairs, e.g. from `Profile::host_mounts`), or when
/// any symlink on the way to it (each link of a chain) lies inside one: an
/// agent able to write there could retarget the link between runs.
///
/// Paths are compared after resolving symlinks, and also by device and inode
/// of every directory above the configuration file, so a bind-mounted alias
/// of a parent directory is caught too. A mount whose host path does not
/// exist cannot contain the (existing) configuration file and is skipped.
/// Hard links to the configuration file elsewhere are not detected.
pub fn check_confinement(config_file: &Path, mounts: &[(String, PathBuf)]) -> Result<(), ConfinementError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConfinementError::Io { path, source }
    };
    // The file itself, and (when the path names a symlink) the symlink: an
    // agent that could write where the link lies could swap its target.
    let target = std::fs::canonicalize(config_file).map_err(io(config_file))?;
    check_one(&target, mounts)?;
    // Every link of a chain, not only the last one.
    let mut current = config_file.to_path_buf();
    for _ in 0..40 {
        if !std::fs::symlink_metadata(&current).map_err(io(&current))?.file_type().is_symlink() {
            break;
        }
        let parent = current.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let name = current
            .file_name()
            .ok_or_else(|| ConfinementError::Io { path: current.clone(), source: std::io::Error::other("the path has no file name") })?;
        let link = std::fs::canonicalize(parent).map_err(io(parent))?.join(name);
        check_one(&link, mounts)?;
        let next = std::fs::read_link(&current).map_err(io(&current))?;
        current = match link.parent() {
            Some(dir) if next.is_relative() => dir.join(next),
            _ => next,
        };
    }
    Ok(())
}

/// [`check_confinement`] of one canonical path (whose parent exists).
fn check_one(config_file: &Path, mounts: &[(String, PathBuf)]) -> Result<(), ConfinementError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConfinementError::Io { path, source }
    };
    let config_file = config_file.to_path_buf();
    // (device, inode) of the file and every directory above it.
    let mut enclosing: HashSet<(u64, u64)> = HashSet::new();
    for ancestor in config_file.ancestors() {
        let metadata = std::fs::symlink_metadata(ancestor).map_err(io(ancestor))?;
        enclosing.insert((metadata.dev(), metadata.ino()));
    }
    for (label, host_path) in mounts {
        let canonical = match std::fs::canonicalize(host_path) {
            Ok(path) => path,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(ConfinementError::Io { path: host_path.clone(), source });
            }
        };
        let metadata = std::fs::metadata(&canonical).map_err(io(&canonical))?;
        if config_file.starts_with(&canonical) || enclosing.contains(&(metadata.dev(), metadata.ino())) {
            return Err(ConfinementError::Inside { config_file, mount: label.clone(), mount_path: canonical });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlinked_configuration_is_refused_when_the_link_or_its_target_is_mounted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let volume = dir.path().join("volume");
        let safe = dir.path().join("safe");
        std::fs::create_dir_all(&volume).expect("volume");
        std::fs::create_dir_all(&safe).expect("safe");
        std::fs::write(safe.join("config.toml"), "").expect("config");
        std::os::unix::fs::symlink(safe.join("config.toml"), volume.join("link.toml")).expect("link");
        std::os::unix::fs::symlink(volume.join("link.toml"), dir.path().join("outer.toml")).expect("outer link");
        let mounts = vec![("volume v".to_string(), volume.clone())];
        // The link lies in the volume (the agent could retarget it).
        let err = check_confinement(&volume.join("link.toml"), &mounts).expect_err("link inside");
        assert!(err.to_string().contains("volume v"), "{err}");
        // ... also as the middle link of a chain.
        check_confinement(&dir.path().join("outer.toml"), &mounts).expect_err("middle link inside");
        // The real file is outside; a link to it from outside is fine.
        check_confinement(&safe.join("config.toml"), &mounts).expect("plain");
        std::os::unix::fs::symlink(safe.join("config.toml"), dir.path().join("ok.toml")).expect("ok link");
        check_confinement(&dir.path().join("ok.toml"), &mounts).expect("link outside to outside");
        // A target inside the volume is refused through a link from outside.
        std::fs::write(volume.join("real.toml"), "").expect("real");
        std::os::unix::fs::symlink(volume.join("real.toml"), dir.path().join("in.toml")).expect("in link");
        check_confinement(&dir.path().join("in.toml"), &mounts).expect_err("target inside");
    }
}
