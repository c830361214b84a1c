//! Where the configuration file is.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::identity::Developer;

/// Which rule chose the configuration path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigPathSource {
    /// `--config FILE`.
    CommandLine,
    /// `$LAZARET_CONFIG`.
    Environment,
    /// `$XDG_CONFIG_HOME/lazaret/config.toml`.
    XdgConfigHome,
    /// `~/.config/lazaret/config.toml` of the developer.
    DeveloperHome,
}

impl fmt::Display for ConfigPathSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigPathSource::CommandLine => "--config",
            ConfigPathSource::Environment => "$LAZARET_CONFIG",
            ConfigPathSource::XdgConfigHome => "$XDG_CONFIG_HOME",
            ConfigPathSource::DeveloperHome => "the developer's ~/.config",
        })
    }
}

/// The configuration file to read: `cli` (`--config`), else
/// `$LAZARET_CONFIG`, else `$XDG_CONFIG_HOME/lazaret/config.toml` (only if
/// set to an absolute path, as the XDG spec requires), else
/// `~/.config/lazaret/config.toml` with `~` the developer's home from the
/// password database (under sudo that is `SUDO_UID`'s home, not root's).
/// Empty variables count as unset.
pub fn config_path(cli: Option<&Path>, env: &dyn Fn(&str) -> Option<OsString>, developer: &Developer) -> PathBuf {
    config_path_with_source(cli, env, developer).0
}

/// [`config_path`] plus which rule chose it (for error messages).
pub fn config_path_with_source(
    cli: Option<&Path>,
    env: &dyn Fn(&str) -> Option<OsString>,
    developer: &Developer,
) -> (PathBuf, ConfigPathSource) {
    if let Some(path) = cli {
        return (path.to_path_buf(), ConfigPathSource::CommandLine);
    }
    let non_empty = |name: &str| env(name).filter(|value| !value.is_empty());
    if let Some(path) = non_empty("LAZARET_CONFIG") {
        return (PathBuf::from(path), ConfigPathSource::Environment);
    }
    if let Some(xdg) = non_empty("XDG_CONFIG_HOME").map(PathBuf::from)
        && xdg.is_absolute()
    {
        return (xdg.join("lazaret").join("config.toml"), ConfigPathSource::XdgConfigHome);
    }
    (developer.home.join(".config").join("lazaret").join("config.toml"), ConfigPathSource::DeveloperHome)
}

impl super::Config {
    /// Finds the configuration with [`config_path`] and loads it; a missing
    /// file is reported with the path tried and the rule that chose it.
    pub fn discover(
        cli: Option<&Path>,
        env: &dyn Fn(&str) -> Option<OsString>,
        developer: &Developer,
    ) -> Result<super::Config, super::ConfigError> {
        let (path, source) = config_path_with_source(cli, env, developer);
        match super::Config::load(&path, developer) {
            Err(super::ConfigError::NotFound { path, .. }) => {
                Err(super::ConfigError::NotFound { path, source_of_path: source.to_string() })
            }
            other => other,
        }
    }
}
