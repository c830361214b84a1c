//! Who may configure what.
//!
//! Lazaret runs as root, but it reads the *developer's* configuration. A
//! setting that makes root run, create or expose something chosen freely
//! (beyond what the developer could do with their own rights) is honoured
//! only from a configuration file owned by root; in the developer's own file
//! it is refused with the key's location and the fix. The rules, key by key:
//!
//! | key | in a developer-owned file |
//! | --- | --- |
//! | `runsc.path` | refused: root would execute that program |
//! | `runsc.debug_log_dir` | refused: root would create and write logs there |
//! | `storage_root` | refused unless the default: root creates its state there |
//! | `runtime_dir` | refused unless absent: root creates sockets, state and logs there |
//! | `user = "root"` | refused: a root agent writes root-owned (setuid) files into the workspace |
//! | `user = "UID:GID"` | refused unless the developer's own uid and gid |
//! | `volumes` | each host path must be accessible *to the developer* (read, and write unless `:ro`) |
//!
//! And whoever owns the configuration, the workspace itself (chosen by the
//! directory Lazaret is started in) must be readable and writable by the
//! developer: Lazaret mounts it read-write.
//!
//! Access "as the developer" is decided by the kernel: a short-lived thread
//! takes the developer's uid, gid and groups and calls `access(2)`
//! ([`lazaret_mounts::access_as`]), so permission bits, ACLs, every directory
//! on the way and read-only mounts all count. The path is resolved again
//! when it is mounted; a developer who can replace one of its directories
//! between the check and the mount could still redirect it (within a
//! second), which is left for the mount step to close (open once, bind the
//! fd).

// The error is built once, on the way out, and boxed in `ContextError`.
#![allow(clippy::result_large_err)]

use std::path::{Path, PathBuf};

use lazaret_protocol::display::escaped;

use super::{Config, DEFAULT_STORAGE_ROOT, Profile, UserChoice};
use crate::identity::Developer;

/// A setting the configuration's owner may not make, or a path the
/// developer may not reach.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// A key that gives root's power, in a configuration root does not own.
    #[error("{origin}: `{key}` {why}; only a configuration owned by root may set it, and {file} is owned by uid {owner}\n  hint: {hint}", file = .file.display())]
    NeedsRootConfig {
        /// `FILE:LINE:COLUMN` of the value.
        origin: String,
        /// The key, e.g. `runsc.path` or `profiles.dev.user`.
        key: String,
        /// What root would do because of it.
        why: String,
        /// The configuration file.
        file: PathBuf,
        /// Its owner (`None`: not read from a file).
        owner: OwnerShown,
        /// How to fix it.
        hint: String,
    },
    /// A volume whose host path the developer could not access themselves.
    #[error("{origin}: volume {written:?}: you (uid {uid}) may not {access} {} yourself ({errno}), and Lazaret, running as root, would mount it for you anyway\n  hint: {hint}", escaped(.host))]
    VolumeBeyondDeveloper {
        /// `FILE:LINE:COLUMN` of the volume entry.
        origin: String,
        /// The entry as written.
        written: String,
        /// Its host path.
        host: PathBuf,
        /// The developer's uid.
        uid: u32,
        /// `read` or `read and write`.
        access: &'static str,
        /// The kernel's answer.
        errno: nix::errno::Errno,
        /// How to fix it.
        hint: String,
    },
    /// A workspace the developer could not read and write themselves.
    #[error("workspace {}: you (uid {uid}) may not read and write it yourself ({errno}), and Lazaret, running as root, would mount it read-write for you\n  hint: run lazaret in a checkout you own (or may write), or fix its permissions", escaped(.path))]
    WorkspaceBeyondDeveloper {
        /// The workspace root.
        path: PathBuf,
        /// The developer's uid.
        uid: u32,
        /// The kernel's answer.
        errno: nix::errno::Errno,
    },
    /// The access check itself failed.
    #[error("cannot check whether uid {uid} may access {}: {source}", escaped(.path))]
    Check {
        /// The path.
        path: PathBuf,
        /// The developer's uid.
        uid: u32,
        /// Why.
        source: std::io::Error,
    },
}

/// The owner of a configuration file, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerShown(pub Option<u32>);

impl std::fmt::Display for OwnerShown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(uid) => write!(f, "{uid}"),
            None => f.write_str("unknown (not read from a file)"),
        }
    }
}

/// How to ask "may uid/gid/groups access PATH with MODE?" (the real one is
/// [`lazaret_mounts::access_as`]; tests pass a table).
pub type AccessCheck<'a> = &'a dyn Fn(&Path, libc::c_int) -> std::io::Result<Result<(), nix::errno::Errno>>;

/// The kernel's answer for `developer` (see the module documentation).
pub fn developer_access(developer: &Developer) -> impl Fn(&Path, libc::c_int) -> std::io::Result<Result<(), nix::errno::Errno>> + '_ {
    move |path, mode| {
        let groups: Vec<u32> = developer.groups.iter().map(|g| g.gid).collect();
        lazaret_mounts::access_as(path, developer.uid, developer.gid, &groups, mode)
    }
}

/// Checks every rule of the module documentation for `profile` of
/// `config`, run by `developer` on `workspace`. A developer who is root
/// (no sudo) may do anything.
pub fn check_trust(
    config: &Config,
    profile: &Profile,
    developer: &Developer,
    workspace: &Path,
    access: AccessCheck<'_>,
) -> Result<(), TrustError> {
    if developer.uid == 0 {
        return Ok(());
    }
    let check =
        |path: &Path, mode| access(path, mode).map_err(|source| TrustError::Check { path: path.to_path_buf(), uid: developer.uid, source });
    if config.file_owner != Some(0) {
        check_developer_settings(config, profile, developer, &check)?;
    }
    if let Err(errno) = check(workspace, libc::R_OK | libc::W_OK | libc::X_OK)? {
        return Err(TrustError::WorkspaceBeyondDeveloper { path: workspace.to_path_buf(), uid: developer.uid, errno });
    }
    Ok(())
}

/// An access check's answer, or why it could not be made.
type Checked = Result<Result<(), nix::errno::Errno>, TrustError>;

/// The rules for a configuration root does not own.
fn check_developer_settings(
    config: &Config,
    profile: &Profile,
    developer: &Developer,
    check: &dyn Fn(&Path, libc::c_int) -> Checked,
) -> Result<(), TrustError> {
    let file = config.file.display().to_string();
    let chown = format!("`sudo chown root: {file}` if root means it");
    let refuse = |key: &str, why: String, hint: String| {
        let origin = config.origins.get(key).cloned().unwrap_or_else(|| format!("{file}:1:1"));
        Err(TrustError::NeedsRootConfig {
            origin,
            key: key.to_string(),
            why,
            file: config.file.clone(),
            owner: OwnerShown(config.file_owner),
            hint,
        })
    };
    let user_key = format!("profiles.{}.user", profile.name);
    match profile.user {
        UserChoice::Developer => {}
        UserChoice::Root => {
            return refuse(
                &user_key,
                format!(
                    "= \"root\" runs the agent as uid 0 (profile {:?}), so it can create root-owned files (setuid ones too) in your workspace",
                    profile.name
                ),
                format!("use `user = \"developer\"`, or {chown}"),
            );
        }
        UserChoice::Id { uid, gid } if (uid, gid) == (developer.uid, developer.gid) => {}
        UserChoice::Id { uid, gid } => {
            return refuse(
                &user_key,
                format!(
                    "= \"{uid}:{gid}\" runs the agent of profile {:?} with ids that are not yours ({}:{}), so it may read and write whatever those ids may in the workspace and volumes",
                    profile.name, developer.uid, developer.gid
                ),
                format!("use `user = \"developer\"` (or \"{}:{}\"), or {chown}", developer.uid, developer.gid),
            );
        }
    }
    if let Some(path) = &config.runsc.path {
        return refuse(
            "runsc.path",
            format!("makes Lazaret execute {} as root", escaped(path)),
            format!("remove `path` from [runsc] (runsc is then found on root's PATH), or {chown}"),
        );
    }
    if config.runsc.debug_log_dir.is_some() {
        return refuse(
            "runsc.debug_log_dir",
            "makes Lazaret, as root, create and write runsc's debug logs in that directory".into(),
            format!("remove `debug_log_dir` from [runsc], or {chown}"),
        );
    }
    if config.storage_root != Path::new(DEFAULT_STORAGE_ROOT) {
        return refuse(
            "storage_root",
            "is where Lazaret, as root, creates and changes its images and Domain Roots".into(),
            format!("remove `storage_root` (default {DEFAULT_STORAGE_ROOT}), or {chown}"),
        );
    }
    if config.runtime_dir.is_some() {
        return refuse(
            "runtime_dir",
            "is where Lazaret, as root, creates sockets, runsc state and logs".into(),
            format!("remove `runtime_dir` (default /run/lazaret/<uid>), or {chown}"),
        );
    }
    for volume in &profile.volumes {
        let (mode, what) = if volume.readonly { (libc::R_OK, "read") } else { (libc::R_OK | libc::W_OK, "read and write") };
        let mode = if volume.host.is_dir() { mode | libc::X_OK } else { mode };
        if let Err(errno) = check(&volume.host, mode)? {
            return Err(TrustError::VolumeBeyondDeveloper {
                origin: volume.origin.clone(),
                written: volume.written.clone(),
                host: volume.host.clone(),
                uid: developer.uid,
                access: what,
                errno,
                hint: format!(
                    "mount only paths you may {what} yourself{}, or {chown}",
                    if volume.readonly { "" } else { " (or add `:ro`)" }
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::HostGroup;
    use nix::errno::Errno;

    fn developer() -> Developer {
        Developer {
            uid: 1000,
            gid: 1000,
            name: "alice".into(),
            home: "/home/alice".into(),
            shell: "/bin/sh".into(),
            group_name: None,
            groups: vec![HostGroup { gid: 27, name: None }],
        }
    }

    fn config(text: &str, owner: Option<u32>) -> Config {
        let mut config = Config::parse(
            &format!("{text}\n[profiles.a]\nimage = \"i\"\n"),
            Path::new("/home/alice/.config/lazaret/config.toml"),
            Path::new("/home/alice"),
        )
        .expect("config");
        config.file_owner = owner;
        config
    }

    fn config_with_profile(profile: &str, owner: Option<u32>) -> Config {
        let mut config = Config::parse(&format!("[profiles.a]\nimage = \"i\"\n{profile}"), Path::new("/c.toml"), Path::new("/home/alice"))
            .expect("config");
        config.file_owner = owner;
        config
    }

    /// The developer may access everything but `/etc/shadow` and `/root`.
    fn table(path: &Path, mode: libc::c_int) -> std::io::Result<Result<(), Errno>> {
        let _ = mode;
        Ok(if path.starts_with("/etc/shadow") || path.starts_with("/root") { Err(Errno::EACCES) } else { Ok(()) })
    }

    fn run(config: &Config, workspace: &str) -> Result<(), TrustError> {
        let profile = config.profile("a").expect("profile");
        check_trust(config, profile, &developer(), Path::new(workspace), &table)
    }

    #[test]
    fn root_power_keys_need_a_root_owned_file_and_name_their_location() {
        for (text, key, line) in [
            ("[runsc]\npath = \"/home/alice/runsc\"", "runsc.path", 2),
            ("[runsc]\ndebug_log_dir = \"/var/log/x\"", "runsc.debug_log_dir", 2),
            ("storage_root = \"/etc\"", "storage_root", 1),
            ("runtime_dir = \"/etc/x\"", "runtime_dir", 1),
        ] {
            let refused = run(&config(text, Some(1000)), "/ws").expect_err(key).to_string();
            assert!(refused.starts_with(&format!("/home/alice/.config/lazaret/config.toml:{line}:")), "{key}: {refused}");
            assert!(refused.contains(&format!("`{key}`")) && refused.contains("owned by uid 1000"), "{refused}");
            assert!(refused.contains("sudo chown root: /home/alice/.config/lazaret/config.toml"), "{refused}");
            // A file of unknown owner is not trusted either; root's is.
            assert!(run(&config(text, None), "/ws").is_err(), "{key}");
            run(&config(text, Some(0)), "/ws").expect(key);
        }
        run(&config("storage_root = \"/var/lib/lazaret\"", Some(1000)), "/ws").expect("the default is fine");
    }

    #[test]
    fn other_ids_than_the_developers_need_a_root_owned_file() {
        for (user, refused) in
            [("root", true), ("0:0", true), ("1000:42", true), ("2000:1000", true), ("1000:1000", false), ("developer", false)]
        {
            let config = config_with_profile(&format!("user = \"{user}\"\n"), Some(1000));
            match run(&config, "/ws") {
                Err(e) => {
                    assert!(refused, "{user}: {e}");
                    let text = e.to_string();
                    assert!(text.starts_with("/c.toml:3:8: `profiles.a.user`"), "{text}");
                    assert!(text.contains("hint: use `user = \"developer\"`"), "{text}");
                }
                Ok(()) => assert!(!refused, "{user} accepted"),
            }
            run(&config_with_profile(&format!("user = \"{user}\"\n"), Some(0)), "/ws").expect("root's file");
        }
    }

    #[test]
    fn volumes_must_be_within_the_developers_own_reach() {
        let config = config_with_profile("volumes = [\"/tmp:/t\", \"/etc/shadow:/s:ro\"]\n", Some(1000));
        let text = run(&config, "/ws").expect_err("shadow").to_string();
        assert!(
            text.starts_with("/c.toml:3:23: volume \"/etc/shadow:/s:ro\": you (uid 1000) may not read /etc/shadow yourself (EACCES"),
            "{text}"
        );
        assert!(text.contains("hint: mount only paths you may read yourself"), "{text}");
        run(&config_with_profile("volumes = [\"/etc/shadow:/s:ro\"]\n", Some(0)), "/ws").expect("root's file may");
        run(&config_with_profile("volumes = [\"/tmp:/t\"]\n", Some(1000)), "/ws").expect("reachable");
    }

    #[test]
    fn the_workspace_must_be_the_developers_whoever_owns_the_config() {
        let text = run(&config("", Some(0)), "/root/repo").expect_err("root's repo").to_string();
        assert!(text.starts_with("workspace /root/repo: you (uid 1000) may not read and write it yourself"), "{text}");
        // A developer who is root may do anything.
        let root = Developer { uid: 0, gid: 0, ..developer() };
        let config = config("[runsc]\npath = \"/x\"", Some(1000));
        check_trust(&config, config.profile("a").expect("a"), &root, Path::new("/root/repo"), &table).expect("root");
    }

    #[test]
    fn the_kernel_check_denies_what_the_developer_cannot_read() {
        // Needs root to drop to another uid; as a normal user only our own
        // ids are possible and the check is the ordinary access(2).
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "s").expect("write");
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).expect("chmod");
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
        let nobody = 65534;
        assert_eq!(lazaret_mounts::access_as(&secret, nobody, nobody, &[], libc::R_OK).expect("check"), Err(Errno::EACCES));
        assert_eq!(lazaret_mounts::access_as(dir.path(), nobody, nobody, &[], libc::R_OK | libc::X_OK).expect("check"), Ok(()));
        assert_eq!(lazaret_mounts::access_as(&secret, 0, 0, &[], libc::R_OK).expect("check"), Ok(()));
        // This thread kept its credentials.
        assert!(nix::unistd::geteuid().is_root());
        assert_eq!(std::fs::read_to_string(&secret).expect("still readable"), "s");
    }
}
