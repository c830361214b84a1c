//! `lazaret init` (issue 14): the configuration it writes passes `lazaret
//! config check`, is the developer's (under sudo too) with mode 0644, is
//! never overwritten without `--force`, and `--force` keeps the old file.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use lazaret_tests::*;

/// A scratch directory removed on drop, with a "home" below it owned by
/// `owner`.
struct Scratch {
    root: PathBuf,
    home: PathBuf,
}

impl Scratch {
    fn new(owner: (u32, u32)) -> Scratch {
        require_root();
        let root = std::env::temp_dir().join(format!("lazaret-init-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir(&root).expect("scratch");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod scratch");
        let home = root.join("home");
        std::fs::create_dir(&home).expect("home");
        std::os::unix::fs::chown(&home, Some(owner.0), Some(owner.1)).expect("chown home");
        Scratch { root, home }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// `lazaret ARGS` as root, as if started with sudo by `sudo_user` (if any).
fn lazaret(args: &[&str], sudo_user: Option<(u32, u32)>) -> Output {
    let mut cmd = Command::new(lazaret_bin());
    cmd.args(args).stdin(Stdio::null()).env_remove("LAZARET_CONFIG").env_remove("XDG_CONFIG_HOME");
    if let Some((uid, gid)) = sudo_user {
        cmd.env("SUDO_UID", uid.to_string()).env("SUDO_GID", gid.to_string()).env("SUDO_USER", TEST_USER);
    }
    wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning lazaret"))
}

/// The agents' state directories below `home` that do not exist yet.
fn missing_state_dirs(home: &Path) -> Vec<PathBuf> {
    [".claude", ".codex", ".gemini", ".grok", ".config/opencode", ".local/share/opencode"]
        .iter()
        .map(|d| home.join(d))
        .filter(|d| !d.exists())
        .collect()
}

#[test]
fn init_writes_a_configuration_that_config_check_accepts_as_the_developer_and_never_overwrites_without_force() {
    let user = test_user();
    let scratch = Scratch::new(user);
    let target = scratch.home.join(".config/lazaret/config.toml");
    let target_text = target.to_string_lossy().into_owned();
    // The agents' state directories in the developer's real home (from the
    // password database) are not init's to create: they are not shared.
    let dev_home = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(user.0)).ok().flatten().expect("test user").dir;
    let missing_before = missing_state_dirs(&dev_home);

    let out = lazaret(&["init", &target_text], Some(user));
    assert!(out.status.success(), "init failed: {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("profiles: claude, codex, gemini, grok, opencode, shell"), "{}", text(&out.stdout));
    let meta = std::fs::metadata(&target).expect("written");
    assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777), (user.0, user.1, 0o644), "the developer's file, 0644");
    for dir in [scratch.home.join(".config"), scratch.home.join(".config/lazaret")] {
        let m = std::fs::metadata(&dir).expect("parent created");
        assert_eq!((m.uid(), m.mode() & 0o022), (user.0, 0), "{} is the developer's and not writable by others", dir.display());
    }
    assert_eq!(missing_state_dirs(&dev_home), missing_before, "init made an agent's state directory");
    let text_written = std::fs::read_to_string(&target).expect("read");
    // The host state directories are shared only by a commented line,
    // which names the agent's home as `~/`, not any user's path.
    assert!(text_written.contains("# volumes = [\"~/.claude:~/.claude\"]"), "{text_written}");
    assert!(!text_written.lines().any(|l| l.trim_start().starts_with("volumes")), "a volume shared by default: {text_written}");
    assert!(!text_written.lines().any(|l| !l.trim_start().starts_with('#') && l.contains(&format!("/home/{TEST_USER}"))), "{text_written}");

    // `lazaret config check` (as the developer would run it, under sudo) accepts it.
    let check = lazaret(&["--config", &target_text, "config", "check"], Some(user));
    assert!(check.status.success(), "config check refused init's output: {}", text(&check.stderr));
    for profile in ["claude", "codex", "gemini", "grok", "opencode", "shell"] {
        assert!(text(&check.stdout).contains(&format!("profile {profile}: fingerprint ")), "{}", text(&check.stdout));
    }
    assert!(text(&check.stdout).contains("setup 3/3: npm install -g @anthropic-ai/claude-code"), "{}", text(&check.stdout));

    // Never overwritten without --force.
    std::fs::write(&target, "# mine\n").expect("edit");
    let again = lazaret(&["init", &target_text], Some(user));
    assert_eq!(again.status.code(), Some(125), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("exists; not overwriting it"), "{}", text(&again.stderr));
    assert_eq!(std::fs::read_to_string(&target).expect("read"), "# mine\n");
    // A symlink there is refused too (not followed).
    let elsewhere = scratch.root.join("elsewhere.toml");
    let link = scratch.home.join("link.toml");
    std::os::unix::fs::symlink(&elsewhere, &link).expect("symlink");
    let via_link = lazaret(&["init", &link.to_string_lossy()], Some(user));
    assert_eq!(via_link.status.code(), Some(125), "{}", text(&via_link.stderr));
    assert!(!elsewhere.exists(), "init wrote through a symlink");

    // --force replaces it and keeps the old one.
    let forced = lazaret(&["init", "--force", &target_text], Some(user));
    assert!(forced.status.success(), "{}", text(&forced.stderr));
    let mut backup = target.clone().into_os_string();
    backup.push(".bak");
    assert_eq!(std::fs::read_to_string(&backup).expect("backup"), "# mine\n");
    assert_eq!(std::fs::read_to_string(&target).expect("read"), text_written);

    // The developer may not have init write where they could not write
    // themselves: a root-owned directory is refused.
    let root_dir = scratch.root.join("root-owned");
    std::fs::create_dir(&root_dir).expect("dir");
    let refused = lazaret(&["init", &root_dir.join("c.toml").to_string_lossy()], Some(user));
    assert_eq!(refused.status.code(), Some(125), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("ermission denied"), "{}", text(&refused.stderr));
}
