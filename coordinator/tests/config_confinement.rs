//! ConfigurationConfinement: the configuration must not be reachable through
//! any host path mounted into the sandbox.
#![allow(clippy::unwrap_used, missing_docs)]

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use lazaret_coordinator::config::{Config, ConfinementError, check_confinement};

struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

/// root/workspace/{src/, lazaret.toml}, root/home/.config/lazaret/config.toml, root/data/
fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir_all(root.join("workspace/src")).unwrap();
    std::fs::create_dir_all(root.join("home/.config/lazaret")).unwrap();
    std::fs::create_dir_all(root.join("data")).unwrap();
    std::fs::write(root.join("workspace/lazaret.toml"), "").unwrap();
    std::fs::write(root.join("home/.config/lazaret/config.toml"), "").unwrap();
    Tree { _dir: dir, root }
}

fn labelled(label: &str, path: PathBuf) -> (String, PathBuf) {
    (label.to_string(), path)
}

fn inside(result: Result<(), ConfinementError>) -> (String, PathBuf) {
    match result {
        Err(ConfinementError::Inside { mount, mount_path, .. }) => (mount, mount_path),
        other => panic!("expected Inside, got {other:?}"),
    }
}

#[test]
fn config_outside_every_mount_is_accepted() {
    let t = tree();
    let mounts = [
        labelled("workspace", t.root.join("workspace")),
        labelled("volume ~/.claude", t.root.join("home/.claude-missing")),
        labelled("volume /data", t.root.join("data")),
        // A sibling whose name is a prefix of the config directory's name.
        labelled("volume ~/.conf", t.root.join("home/.conf")),
    ];
    std::fs::create_dir(t.root.join("home/.conf")).unwrap();
    check_confinement(&t.root.join("home/.config/lazaret/config.toml"), &mounts).unwrap();
}

#[test]
fn config_inside_the_workspace_is_refused_naming_the_mount() {
    let t = tree();
    let mounts = [labelled("volume /data", t.root.join("data")), labelled("workspace", t.root.join("workspace"))];
    let error = check_confinement(&t.root.join("workspace/lazaret.toml"), &mounts).unwrap_err();
    let text = error.to_string();
    let (label, path) = inside(Err(error));
    assert_eq!(label, "workspace");
    assert_eq!(path, t.root.join("workspace"));
    assert!(text.contains("inside the workspace mounted into the sandbox"), "{text}");
    assert!(text.contains("hint: move the configuration"), "{text}");
}

#[test]
fn a_volume_of_the_home_or_of_the_file_itself_is_refused() {
    let t = tree();
    let config = t.root.join("home/.config/lazaret/config.toml");
    let (label, _) = inside(check_confinement(&config, &[labelled("volume ~:/home/me", t.root.join("home"))]));
    assert_eq!(label, "volume ~:/home/me");
    let (label, _) = inside(check_confinement(&config, &[labelled("volume cfg", config.clone())]));
    assert_eq!(label, "volume cfg");
}

#[test]
fn symlinks_are_resolved_on_both_sides() {
    let t = tree();
    // The workspace reached through a symlink.
    symlink(t.root.join("workspace"), t.root.join("ws-link")).unwrap();
    let (label, path) = inside(check_confinement(&t.root.join("workspace/lazaret.toml"), &[labelled("workspace", t.root.join("ws-link"))]));
    assert_eq!(label, "workspace");
    assert_eq!(path, t.root.join("workspace"));
    // The configuration file named through a symlink that points into the workspace.
    symlink(t.root.join("workspace/lazaret.toml"), t.root.join("home/cfg-link.toml")).unwrap();
    inside(check_confinement(&t.root.join("home/cfg-link.toml"), &[labelled("workspace", t.root.join("workspace"))]));
    // A symlinked directory on the configuration's path.
    symlink(t.root.join("workspace/src"), t.root.join("home/src-link")).unwrap();
    std::fs::write(t.root.join("workspace/src/c.toml"), "").unwrap();
    inside(check_confinement(&t.root.join("home/src-link/c.toml"), &[labelled("workspace", t.root.join("workspace"))]));
}

#[test]
fn a_bind_mounted_alias_of_a_parent_directory_is_refused() {
    let t = tree();
    let config = t.root.join("home/.config/lazaret/config.toml");
    let alias = t.root.join("data");
    let home = t.root.join("home");
    // Mount in a private mount namespace of a dedicated thread: nothing leaks
    // to the host, and the namespace goes away with the thread.
    let result = std::thread::spawn(move || {
        use nix::mount::{MsFlags, mount};
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).unwrap();
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>).unwrap();
        mount(Some(&home), &alias, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
        check_confinement(&config, &[labelled("volume /data", alias.clone())])
    })
    .join()
    .unwrap();
    let (label, _) = inside(result);
    assert_eq!(label, "volume /data");
}

#[test]
fn missing_config_file_is_an_io_error() {
    let t = tree();
    let result = check_confinement(&t.root.join("nope.toml"), &[]);
    assert!(matches!(result, Err(ConfinementError::Io { .. })), "{result:?}");
}

#[test]
fn profile_host_mounts_feed_the_check() {
    let t = tree();
    let text = "[profiles.a]\nimage = \"i\"\nvolumes = [\"~/.config:/root/.config:ro\"]\n";
    let config = Config::parse(text, Path::new("c.toml"), &t.root.join("home")).unwrap();
    let mounts = config.profile("a").unwrap().host_mounts(&t.root.join("workspace"));
    assert_eq!(mounts[0], ("workspace".to_string(), t.root.join("workspace")));
    assert_eq!(mounts[1].1, t.root.join("home/.config"));
    assert!(mounts[1].0.starts_with("volume ~/.config:/root/.config:ro (c.toml:3:12)"), "{}", mounts[1].0);
    let (label, _) = inside(check_confinement(&t.root.join("home/.config/lazaret/config.toml"), &mounts));
    assert_eq!(label, mounts[1].0);
}
