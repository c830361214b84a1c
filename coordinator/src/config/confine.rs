//! ConfigurationConfinement: the host configuration must never be visible
//! inside the sandbox.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why the configuration is not confined, or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum ConfinementError {
    /// The configuration file lies inside a host path that would be mounted
    /// into the sandbox.
    #[error(
        "configuration {config_file} lies inside the {mount} mounted into the sandbox (host path {mount_path}); the agent could read or change it\n  hint: move the configuration outside {mount_path} (e.g. to ~/.config/lazaret/config.toml) or remove that mount from the profile"
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
    #[error("cannot check configuration confinement: {path}: {source}")]
    Io {
        /// The path that failed.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Refuses when `config_file` lies inside (or is) any host path in `mounts`
/// (`(label, host path)` pairs, e.g. from `Profile::host_mounts`).
///
/// Paths are compared after resolving symlinks, and also by device and inode
/// of every directory above the configuration file, so a bind-mounted alias
/// of a parent directory is caught too. A mount whose host path does not
/// exist cannot contain the (existing) configuration file and is skipped.
/// Hard links to the configuration file elsewhere are not detected.
pub fn check_confinement(
    config_file: &Path,
    mounts: &[(String, PathBuf)],
) -> Result<(), ConfinementError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConfinementError::Io { path, source }
    };
    let config_file = std::fs::canonicalize(config_file).map_err(io(config_file))?;
    // (device, inode) of the file and every directory above it.
    let mut enclosing: HashSet<(u64, u64)> = HashSet::new();
    for ancestor in config_file.ancestors() {
        let metadata = std::fs::metadata(ancestor).map_err(io(ancestor))?;
        enclosing.insert((metadata.dev(), metadata.ino()));
    }
    for (label, host_path) in mounts {
        let canonical = match std::fs::canonicalize(host_path) {
            Ok(path) => path,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(ConfinementError::Io {
                    path: host_path.clone(),
                    source,
                });
            }
        };
        let metadata = std::fs::metadata(&canonical).map_err(io(&canonical))?;
        if config_file.starts_with(&canonical)
            || enclosing.contains(&(metadata.dev(), metadata.ino()))
        {
            return Err(ConfinementError::Inside {
                config_file,
                mount: label.clone(),
                mount_path: canonical,
            });
        }
    }
    Ok(())
}
