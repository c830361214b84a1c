//! Finding and loading the configuration file.
#![allow(clippy::unwrap_used, missing_docs)]

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use lazaret_coordinator::config::{Config, ConfigError, ConfigPathSource, config_path, config_path_with_source};
use lazaret_coordinator::identity::Developer;

fn developer(home: &Path) -> Developer {
    Developer {
        uid: 4321,
        gid: 4321,
        name: "dev".into(),
        home: home.to_path_buf(),
        shell: "/bin/sh".into(),
        group_name: Some("dev".into()),
        groups: Vec::new(),
    }
}

fn environment(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
    move |name: &str| map.get(name).cloned()
}

#[test]
fn precedence_is_cli_then_env_then_xdg_then_home() {
    let dev = developer(Path::new("/home/dev"));
    let all = environment(&[("LAZARET_CONFIG", "/etc/lazaret.toml"), ("XDG_CONFIG_HOME", "/xdg")]);
    assert_eq!(
        config_path_with_source(Some(Path::new("/cli.toml")), &all, &dev),
        (PathBuf::from("/cli.toml"), ConfigPathSource::CommandLine)
    );
    assert_eq!(config_path_with_source(None, &all, &dev), (PathBuf::from("/etc/lazaret.toml"), ConfigPathSource::Environment));
    let xdg = environment(&[("XDG_CONFIG_HOME", "/xdg")]);
    assert_eq!(config_path_with_source(None, &xdg, &dev), (PathBuf::from("/xdg/lazaret/config.toml"), ConfigPathSource::XdgConfigHome));
    let none = environment(&[]);
    assert_eq!(
        config_path_with_source(None, &none, &dev),
        (PathBuf::from("/home/dev/.config/lazaret/config.toml"), ConfigPathSource::DeveloperHome)
    );
    assert_eq!(config_path(None, &none, &dev), PathBuf::from("/home/dev/.config/lazaret/config.toml"));
}

#[test]
fn empty_and_relative_variables_are_ignored() {
    let dev = developer(Path::new("/home/dev"));
    let env = environment(&[("LAZARET_CONFIG", ""), ("XDG_CONFIG_HOME", "relative/dir")]);
    assert_eq!(config_path(None, &env, &dev), PathBuf::from("/home/dev/.config/lazaret/config.toml"));
    let env = environment(&[("XDG_CONFIG_HOME", "")]);
    assert_eq!(config_path(None, &env, &dev), PathBuf::from("/home/dev/.config/lazaret/config.toml"));
}

#[test]
fn missing_file_names_the_path_and_how_to_create_one() {
    let home = tempfile::tempdir().unwrap();
    let dev = developer(home.path());
    let error = Config::discover(None, &environment(&[]), &dev).unwrap_err();
    assert!(matches!(error, ConfigError::NotFound { .. }));
    let text = error.to_string();
    let expected_path = home.path().join(".config/lazaret/config.toml");
    assert!(text.contains(&expected_path.display().to_string()), "{text}");
    assert!(text.contains("the developer's ~/.config"), "{text}");
    assert!(text.contains("copy docs/config.example.toml"), "{text}");
    let error = Config::discover(None, &environment(&[("LAZARET_CONFIG", "/nonexistent/l.toml")]), &dev).unwrap_err();
    assert!(error.to_string().contains("/nonexistent/l.toml (found via $LAZARET_CONFIG)"), "{error}");
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    // The developer (uid 4321) must be able to read it themselves.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

#[test]
fn loads_a_valid_file_with_home_of_the_developer() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "[profiles.a]\nimage = \"i\"\nvolumes = [\"~/.a:/root/.a\"]\n");
    let dev = developer(Path::new("/home/someone"));
    let config = Config::discover(Some(&path), &environment(&[]), &dev).unwrap();
    assert_eq!(config.file, path);
    assert_eq!(config.profile("a").unwrap().volumes[0].host, PathBuf::from("/home/someone/.a"));
    // Owned by the developer is fine too.
    std::os::unix::fs::chown(&path, Some(dev.uid), Some(dev.gid)).unwrap();
    assert!(Config::load(&path, &dev).is_ok());
}

#[test]
fn refuses_files_others_could_modify() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "[profiles.a]\nimage = \"i\"\n");
    let dev = developer(Path::new("/home/dev"));

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o664)).unwrap();
    let error = Config::load(&path, &dev).unwrap_err();
    assert!(matches!(error, ConfigError::Insecure { .. }), "{error}");
    assert!(error.to_string().contains("chmod go-w"), "{error}");

    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(&path, Some(9999), None).unwrap();
    let error = Config::load(&path, &dev).unwrap_err();
    assert!(error.to_string().contains("owned by uid 9999"), "{error}");

    let error = Config::load(dir.path(), &dev).unwrap_err();
    assert!(error.to_string().contains("not a regular file"), "{error}");

    // A FIFO is refused without blocking on open.
    let fifo = dir.path().join("fifo.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let error = Config::load(&fifo, &dev).unwrap_err();
    assert!(error.to_string().contains("not a regular file"), "{error}");
}

#[test]
fn invalid_file_reports_its_path_in_locations() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "[profiles.a]\nimage = \"i\"\nbogus = 1\n");
    let error = Config::load(&path, &developer(Path::new("/h"))).unwrap_err();
    assert!(error.to_string().starts_with(&format!("{}:3:1: unknown key `bogus`", path.display())), "{error}");
}

#[test]
fn refuses_a_file_the_developer_could_not_read_themselves() {
    if !nix::unistd::geteuid().is_root() {
        return; // dropping to another uid needs root
    }
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), "[profiles.a]\nimage = \"i\"\n");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let dev = developer(Path::new("/home/dev"));
    let error = Config::load(&path, &dev).unwrap_err();
    assert!(error.to_string().contains("you (uid 4321) may not read it yourself"), "{error}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    Config::load(&path, &dev).unwrap();
}
