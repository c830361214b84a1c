//! Each way `lazaret run` can be refused names its cause and fix, exits with
//! 125 (never an agent's status) and leaves nothing behind.

use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use lazaret_coordinator::LAZARET_FAILED;
use lazaret_tests::*;

fn assert_refused(env: &TestEnv, out: &Output, needles: &[&str]) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(LAZARET_FAILED), "stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks {n:?}: {err}");
    }
    assert!(text(&out.stdout).is_empty(), "unexpected stdout: {}", text(&out.stdout));
    env.assert_nothing_left();
}

#[test]
fn outside_a_git_checkout() {
    let env = TestEnv::new();
    let elsewhere = env.scratch.join("not-a-repo");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    let out = env.run(["run".as_ref(), "test".as_ref(), "-C".as_ref(), elsewhere.as_os_str(), "--".as_ref(), "true".as_ref()]);
    assert_refused(&env, &out, &["not inside a git checkout", "-C DIR"]);
}

#[test]
fn unknown_profile() {
    let env = TestEnv::new();
    let out = env.run(["run", "nope", "--", "true"]);
    assert_refused(&env, &out, &["nope", "test"]);
}

#[test]
fn image_not_imported() {
    let env = TestEnv::new();
    std::fs::write(
        &env.config,
        format!(
            "storage_root = \"{TEST_STORAGE}\"\nruntime_dir = \"{}\"\n[profiles.test]\nimage = \"never-imported\"\n",
            env.runtime_dir.display()
        ),
    )
    .expect("config");
    let out = env.run(["run", "test", "--", "true"]);
    assert_refused(&env, &out, &["never-imported", "lazaret image import"]);
}

#[test]
fn runsc_missing() {
    let env = TestEnv::with_profile("user = \"root\"\n");
    let cfg = std::fs::read_to_string(&env.config).expect("read config");
    std::fs::write(&env.config, with_runsc_keys(&cfg, "path = \"/nonexistent/runsc\"\n")).expect("config");
    let out = env.run(["run", "test", "--", "true"]);
    assert_refused(&env, &out, &["runsc not found", "/nonexistent/runsc", "install-runsc.sh"]);
}

#[test]
fn no_cgroup_hierarchy_as_under_ip_netns_exec() {
    // What `ip netns exec` does: a network namespace, a mount namespace and
    // a fresh sysfs over /sys, which has nothing mounted at /sys/fs/cgroup.
    let env = TestEnv::new();
    let out = std::process::Command::new("unshare")
        .args(["--net", "--mount", "--propagation", "slave", "--", "sh", "-c", "mount -t sysfs sysfs /sys && exec \"$@\"", "sh"])
        .arg(lazaret_bin())
        .arg("--config")
        .arg(&env.config)
        .args(["run", "test", "--", "true"])
        .current_dir(&env.workspace)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("unshare");
    assert_refused(&env, &out, &["no cgroup file system at /sys/fs/cgroup", "nsenter --net="]);
}

#[test]
fn runsc_too_old() {
    let env = TestEnv::new();
    let fake = env.scratch.join("old-runsc");
    std::fs::write(&fake, "#!/bin/sh\necho 'runsc version 0.0~20221219.0'\necho 'spec: 1.0.2-dev'\n").expect("fake runsc");
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let cfg = std::fs::read_to_string(&env.config).expect("read config");
    std::fs::write(&env.config, with_runsc_keys(&cfg, &format!("path = \"{}\"\n", fake.display()))).expect("config");
    let out = env.run(["run", "test", "--", "true"]);
    assert_refused(&env, &out, &["too old", "20221219", "install-runsc.sh"]);
}

#[test]
fn not_root() {
    let env = TestEnv::new();
    let (uid, gid) = test_user();
    let out = wait_output(
        std::process::Command::new("setpriv")
            .args([format!("--reuid={uid}"), format!("--regid={gid}"), "--clear-groups".into()])
            .arg(lazaret_bin())
            .arg("--config")
            .arg(&env.config)
            .args(["run", "test", "--", "true"])
            .current_dir("/")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("setpriv (util-linux)"),
    );
    assert_refused(&env, &out, &["must run as root", "sudo"]);
}

#[test]
fn invalid_config_names_file_line_and_column() {
    let env = TestEnv::new();
    let cfg = std::fs::read_to_string(&env.config).expect("read config");
    std::fs::write(&env.config, format!("{cfg}persistent_dirs = [\"relative/dir\"]\nfrobnicate = 1\n")).expect("config");
    let out = env.run(["run", "test", "--", "true"]);
    let cfg_path = env.config.display().to_string();
    let lines = cfg.lines().count();
    assert_refused(&env, &out, &[&format!("{cfg_path}:{}:", lines + 1), &format!("{cfg_path}:{}:", lines + 2), "frobnicate", "hint"]);
}

#[test]
fn config_inside_the_workspace_is_refused() {
    let env = TestEnv::new();
    let inside = env.workspace.join("lazaret.toml");
    std::fs::copy(&env.config, &inside).expect("copy config");
    let out = wait_output(
        env.in_netns()
            .arg(lazaret_bin())
            .arg("--config")
            .arg(&inside)
            .args(["run", "test", "--", "true"])
            .current_dir(&env.workspace)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    assert_refused(&env, &out, &["lies inside the workspace"]);
}

#[test]
fn failures_leave_no_image_half_imported() {
    let env = TestEnv::new();
    let bad = env.scratch.join("evil.tar");
    // A tarball whose member escapes with `..`.
    let mut header = [0u8; 512];
    let name = b"../../escaped";
    header[..name.len()].copy_from_slice(name);
    header[100..108].copy_from_slice(b"0000644\0");
    header[108..116].copy_from_slice(b"0000000\0");
    header[116..124].copy_from_slice(b"0000000\0");
    header[124..136].copy_from_slice(b"00000000005\0");
    header[136..148].copy_from_slice(b"00000000000\0");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|b| *b as u32).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut data = header.to_vec();
    let mut body = [0u8; 512];
    body[..5].copy_from_slice(b"pwned");
    data.extend_from_slice(&body);
    data.extend_from_slice(&[0u8; 1024]);
    std::fs::write(&bad, data).expect("evil.tar");
    let name = format!("evil-{}", std::process::id());
    let out = env.run(["image".as_ref(), "import".as_ref(), name.as_ref(), bad.as_os_str()]);
    assert_eq!(out.status.code(), Some(LAZARET_FAILED), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains(".."), "stderr: {}", text(&out.stderr));
    let ls = env.run(["image", "ls"]);
    assert!(!text(&ls.stdout).contains(&name), "half-imported image listed: {}", text(&ls.stdout));
    for escaped in [
        env.scratch.join("escaped"),
        std::path::PathBuf::from("/var/cache/lazaret/escaped"),
        std::path::PathBuf::from("/var/cache/escaped"),
    ] {
        assert!(!escaped.exists(), "{} was written outside the store", escaped.display());
    }
}

#[test]
fn doctor_reports_every_check_with_ok_or_a_fix() {
    let env = TestEnv::new();
    let out = env.run(["doctor"]);
    let report = text(&out.stdout);
    for name in [
        "root",
        "overlayfs",
        "namespaces",
        "cgroups",
        "config",
        "runsc",
        "runsc --overlay2",
        "netns work-around",
        "storage root",
        "runtime dir",
    ] {
        assert!(report.lines().any(|l| l.starts_with("OK") && l.contains(&format!(" {name}:"))), "doctor: {name} not OK:\n{report}");
    }
    assert_eq!(out.status.code(), Some(0), "{report}");
    // A broken prerequisite is a FAIL line with its fix, and a non-zero exit.
    let cfg = std::fs::read_to_string(&env.config).expect("config");
    std::fs::write(&env.config, with_runsc_keys(&cfg, "path = \"/nonexistent/runsc\"\n")).expect("config");
    let out = env.run(["doctor"]);
    let report = text(&out.stdout);
    assert_ne!(out.status.code(), Some(0), "{report}");
    assert!(report.contains("FAIL runsc:") && report.contains("fix: scripts/install-runsc.sh"), "{report}");
}

#[test]
fn runtime_dir_inside_the_workspace_is_refused() {
    let env = TestEnv::new();
    let inside = env.workspace.join(".lazaret-run");
    let cfg = std::fs::read_to_string(&env.config).expect("config");
    let cfg = cfg.replace(&format!("runtime_dir = \"{}\"", env.runtime_dir.display()), &format!("runtime_dir = \"{}\"", inside.display()));
    std::fs::write(&env.config, cfg).expect("config");
    let out = env.run(["run", "test", "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "stderr: {}", text(&out.stderr));
    assert!(text(&out.stderr).contains("runtime_dir") && text(&out.stderr).contains("workspace"), "stderr: {}", text(&out.stderr));
    assert!(!inside.exists(), "the runtime dir was created inside the workspace");
}

/// A root agent can create root-owned, even setuid-root, files in the
/// workspace; only a root-owned configuration may ask for one.
#[test]
fn root_agent_needs_a_root_owned_configuration() {
    let (uid, gid) = test_user();
    let mut env = TestEnv::new(); // profile `test` has user = "root"
    env.env.push(("SUDO_UID".into(), uid.to_string()));
    env.env.push(("SUDO_GID".into(), gid.to_string()));
    nix::unistd::chown(&env.config, Some(uid.into()), Some(gid.into())).expect("chown config");
    let out = env.run(["run", "test", "--", "true"]);
    assert_refused(&env, &out, &["runs the agent as uid 0", "owned by root", "sudo chown root:"]);
    // The same configuration owned by root is accepted (in a workspace the
    // developer may write: Lazaret mounts it read-write for them).
    nix::unistd::chown(&env.config, Some(0.into()), Some(0.into())).expect("chown config back");
    nix::unistd::chown(&env.workspace, Some(uid.into()), Some(gid.into())).expect("chown workspace");
    let out = env.run(["run", "test", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
}

/// A configuration as the developer (`lazaret-test`) owns it: no
/// `storage_root`/`runtime_dir` (their defaults need no trust), `top` before
/// the profile and `profile` keys in it. Returns the env with `SUDO_UID`
/// set and the workspace the developer's.
fn developer_env(top: &str, profile: &str) -> TestEnv {
    let (uid, gid) = test_user();
    let mut env = TestEnv::new();
    env.env.push(("SUDO_UID".into(), uid.to_string()));
    env.env.push(("SUDO_GID".into(), gid.to_string()));
    std::fs::write(&env.config, format!("{top}[profiles.test]\nimage = \"{TEST_IMAGE}\"\ncommand = [\"/bin/sh\"]\n{profile}"))
        .expect("config");
    nix::unistd::chown(&env.config, Some(uid.into()), Some(gid.into())).expect("chown config");
    nix::unistd::chown(&env.workspace, Some(uid.into()), Some(gid.into())).expect("chown workspace");
    env
}

/// Settings that make root run or expose something of the developer's
/// choosing are refused from the developer's own file, with the key's
/// location, why, and the fix.
#[test]
fn developer_owned_configuration_cannot_use_roots_power() {
    let cases: [(&str, &str, &[&str]); 5] = [
        (
            "[runsc]\npath = \"/usr/local/bin/runsc\"\n",
            "",
            &["config.toml:2:8: `runsc.path`", "execute /usr/local/bin/runsc as root", "sudo chown root:"],
        ),
        (
            "[runsc]\ndebug_log_dir = \"/var/tmp/lazaret-runsc-debug\"\n",
            "",
            &["config.toml:2:17: `runsc.debug_log_dir`", "sudo chown root:"],
        ),
        ("storage_root = \"/etc/lazaret-e2e\"\n", "", &["config.toml:1:16: `storage_root`", "owned by root"]),
        ("", "user = \"0:42\"\n", &["config.toml:4:8: `profiles.test.user`", "ids that are not yours", "use `user = \"developer\"`"]),
        (
            "",
            "volumes = [\"/etc/shadow:/shadow:ro\"]\n",
            &["config.toml:4:12: volume \"/etc/shadow:/shadow:ro\"", "may not read /etc/shadow yourself", "as root, would mount it"],
        ),
    ];
    for (top, profile, needles) in cases {
        let env = developer_env(top, profile);
        let out = env.run(["run", "test", "--", "true"]);
        assert_refused(&env, &out, needles);
        assert!(
            !std::path::Path::new("/var/tmp/lazaret-runsc-debug").exists() && !std::path::Path::new("/etc/lazaret-e2e").exists(),
            "a refused key was acted on"
        );
    }
}

/// Whoever owns the configuration, the workspace must be one the developer
/// may read and write themselves.
#[test]
fn a_workspace_the_developer_cannot_write_is_refused() {
    let env = developer_env("", "");
    nix::unistd::chown(&env.workspace, Some(0.into()), Some(0.into())).expect("chown workspace to root");
    std::fs::set_permissions(&env.workspace, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = env.run(["run", "test", "--", "true"]);
    assert_refused(&env, &out, &["workspace", "may not read and write it yourself", "(uid "]);
}

/// A configuration reached through a symlink that lies inside a volume
/// could be retargeted by the agent: refused.
#[test]
fn a_configuration_symlink_inside_a_volume_is_refused() {
    let env = TestEnv::new();
    let volume = env.scratch.join("vol");
    std::fs::create_dir(&volume).expect("volume");
    let cfg = std::fs::read_to_string(&env.config).expect("config");
    std::fs::write(&env.config, format!("{cfg}volumes = [\"{}:/vol\"]\n", volume.display())).expect("config");
    let link = volume.join("config.toml");
    std::os::unix::fs::symlink(&env.config, &link).expect("symlink");
    let out = env
        .in_netns()
        .arg(lazaret_bin())
        .arg("--config")
        .arg(&link)
        .args(["run", "test", "--", "true"])
        .current_dir(&env.workspace)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("lazaret");
    assert_refused(&env, &out, &["lies inside the volume", "move the configuration"]);
}
