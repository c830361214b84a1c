//! Workspaces below a mount of the sandbox (issue 14): below the non-root
//! developer's home (where the agent's persistent home is bound), below
//! /root for a root developer, and below a volume's sandbox path. Every
//! other test's workspace is under /tmp, which is why the wrong mount order
//! went unnoticed. A volume written `HOST:~/...` lands in the agent's home
//! (the default agent's and a root agent's). Also: the developer has a name inside, and a failing
//! `runsc create` shows runsc's own message.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use lazaret_tests::escalation::chown_tree;
use lazaret_tests::*;

/// `lazaret run test -- sh -c SCRIPT`, with `SUDO_UID`/`SUDO_GID` taken
/// out of the environment unless the env sets them (the suite may itself
/// run under sudo).
fn sh(env: &TestEnv, script: &str) -> Output {
    let mut cmd = env.lazaret(["run", "test", "--", "sh", "-c", script]);
    for var in ["SUDO_UID", "SUDO_GID"] {
        if !env.env.iter().any(|(k, _)| k == var) {
            cmd.env_remove(var);
        }
    }
    wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning lazaret"))
}

/// `KEY=value` lines of the script's output.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}=");
    out.lines().find_map(|l| l.strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("no {key}= in output:\n{out}"))
}

const IDENTITY: &str = "echo whoami=$(whoami); echo id-un=$(id -un); echo id-gn=$(id -gn); echo tilde=$(echo ~); \
                        echo logname=$LOGNAME; echo user=$USER; echo id-Gn=$(id -Gn); echo getent=$(getent passwd $(id -u)); echo pwd=$(pwd)";

/// A host group that exists for one test, with [`TEST_USER`] as a member;
/// deleted (with the membership) on drop.
struct TempGroup {
    name: String,
    gid: u32,
}

impl TempGroup {
    fn with_test_user() -> TempGroup {
        let name = format!("lze2e{}", &std::process::id().to_string());
        let status = Command::new("groupadd").arg(&name).status().expect("running groupadd");
        assert!(status.success(), "groupadd {name} failed");
        let group = TempGroup { gid: nix::unistd::Group::from_name(&name).ok().flatten().expect("the new group").gid.as_raw(), name };
        let status = Command::new("gpasswd").args(["-a", TEST_USER, &group.name]).stdout(Stdio::null()).status().expect("running gpasswd");
        assert!(status.success(), "adding {TEST_USER} to {} failed", group.name);
        group
    }
}

impl Drop for TempGroup {
    fn drop(&mut self) {
        let _ = Command::new("groupdel").arg(&self.name).status();
    }
}

/// The non-root developer's workspace below their own home: the agent's
/// persistent home (from the Domain Root) is bound at /home/<name> and the
/// workspace below it; both work, and inside the developer has a name, a
/// group, their supplementary groups and their home.
#[test]
fn workspace_below_the_developers_home() {
    let (uid, gid) = test_user();
    let user = nix::unistd::User::from_name(TEST_USER).ok().flatten().expect("test user");
    let host_home = user.dir.clone();
    assert!(host_home.is_dir(), "{TEST_USER}'s home {} is missing (useradd --create-home)", host_home.display());
    let group_name = nix::unistd::Group::from_gid(gid.into()).ok().flatten().expect("the test user's group").name;
    let extra = TempGroup::with_test_user();

    let mut env = TestEnv::below(&host_home, "src/project", "");
    env.env.push(("SUDO_UID".into(), uid.to_string()));
    env.env.push(("SUDO_GID".into(), gid.to_string()));
    chown_tree(&env.workspace, uid, gid);
    // A host file next to the workspace: inside, the home is the Domain's.
    fs::write(env.scratch.join("host-only"), "host").expect("host file");
    let ws = env.workspace.display().to_string();
    let scratch = env.scratch.display().to_string();
    let script = format!(
        "{IDENTITY}; echo written=$(echo inside > {ws}/inside.txt && echo yes); echo readme=$(cat {ws}/README); \
         echo host-only=$(test -e {scratch}/host-only && echo visible || echo hidden); \
         echo home-writable=$(touch ~/.lazaret-e2e && echo yes); \
         echo parent-writable=$(mkdir {ws}/../lazaret-e2e-sibling && rmdir {ws}/../lazaret-e2e-sibling && echo yes)"
    );
    let out = ok(&sh(&env, &script));
    println!("inside, as the developer:\n{out}");
    let agent_home = format!("/home/{TEST_USER}");
    assert_eq!(field(&out, "whoami"), TEST_USER, "{out}");
    assert_eq!(field(&out, "id-un"), TEST_USER);
    assert_eq!(field(&out, "id-gn"), group_name);
    assert_eq!(field(&out, "tilde"), agent_home);
    assert_eq!(field(&out, "logname"), TEST_USER);
    assert_eq!(field(&out, "user"), TEST_USER);
    let groups: Vec<&str> = field(&out, "id-Gn").split_whitespace().collect();
    assert_eq!(groups, [group_name.as_str(), extra.name.as_str()], "supplementary groups inside");
    let shell = "/bin/bash"; // the test image (Debian minbase) has bash
    assert_eq!(field(&out, "getent"), format!("{TEST_USER}:x:{uid}:{gid}::{agent_home}:{shell}"));
    assert_eq!(field(&out, "pwd"), ws);
    assert_eq!(field(&out, "written"), "yes");
    assert_eq!(field(&out, "readme"), "test workspace");
    assert_eq!(field(&out, "host-only"), "hidden", "the host's home is visible inside");
    assert_eq!(field(&out, "home-writable"), "yes");
    // The directories between the home and the workspace are the
    // developer's too (not mount points runsc made as root).
    assert_eq!(field(&out, "parent-writable"), "yes", "{out}");
    let inside = env.workspace.join("inside.txt");
    assert_eq!(fs::read_to_string(&inside).expect("inside.txt on the host"), "inside\n");
    let meta = fs::metadata(&inside).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (uid, gid), "owner of a file the agent wrote");
    assert!(!host_home.join(".lazaret-e2e").exists(), "the agent wrote into the host's home");
    // The extra group is in the bundle's additionalGids (not only in the
    // group file): `id -G` shows the process's own groups.
    let out = ok(&sh(&env, "id -G"));
    let gids: Vec<u32> = out.split_whitespace().filter_map(|g| g.parse().ok()).collect();
    assert_eq!(gids, [gid, extra.gid]);
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// A root developer's workspace below /root, with /root a State Anchor
/// overlay: the anchor is mounted before the workspace below it; root is
/// root inside, and the image's password files are left alone.
#[test]
fn workspace_below_root_for_a_root_developer() {
    let env = TestEnv::below(Path::new("/root"), "src/project", "user = \"root\"\npersistent_dirs = [\"/root\"]\n");
    fs::write(env.scratch.join("host-only"), "host").expect("host file");
    let ws = env.workspace.display().to_string();
    let scratch = env.scratch.display().to_string();
    let script = format!(
        "{IDENTITY}; echo written=$(echo inside > {ws}/inside.txt && echo yes); \
         echo host-only=$(test -e {scratch}/host-only && echo visible || echo hidden); \
         echo roots=$(awk -F: '$3 == 0' /etc/passwd | wc -l); echo anchored=$(echo kept > /root/anchored && echo yes)"
    );
    let out = ok(&sh(&env, &script));
    println!("inside, as root:\n{out}");
    for key in ["whoami", "id-un", "id-gn", "logname", "user"] {
        assert_eq!(field(&out, key), "root", "{key}: {out}");
    }
    assert_eq!(field(&out, "tilde"), "/root");
    assert_eq!(field(&out, "getent"), "root:x:0:0:root:/root:/bin/bash", "the image's own root entry");
    assert_eq!(field(&out, "roots"), "1");
    assert_eq!(field(&out, "pwd"), ws);
    assert_eq!(field(&out, "written"), "yes");
    assert_eq!(field(&out, "host-only"), "hidden", "the host's /root is visible inside");
    assert_eq!(field(&out, "anchored"), "yes");
    assert_eq!(fs::read_to_string(env.workspace.join("inside.txt")).expect("inside.txt on the host"), "inside\n");
    assert!(!Path::new("/root/anchored").exists(), "the anchor wrote into the host's /root");
    // The State Anchor kept /root/anchored for the next run; the workspace
    // is still mounted over it.
    let out = ok(&sh(&env, &format!("cat /root/anchored; cat {ws}/README")));
    assert_eq!(out, "kept\ntest workspace\n");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// A workspace below a volume's sandbox path: the volume is mounted first
/// and the workspace (with its Git Sentry binds) on top of it.
#[test]
fn workspace_below_a_volumes_sandbox_path() {
    let env = TestEnv::below(Path::new("/tmp"), "outer/ws", "user = \"root\"\n");
    let volume = env.scratch.join("vol");
    let outer: PathBuf = env.scratch.join("outer");
    fs::create_dir(&volume).expect("volume dir");
    fs::write(volume.join("from-volume"), "volume\n").expect("volume file");
    fs::write(outer.join("host-only"), "host").expect("host file");
    env.write_config(&format!("user = \"root\"\nvolumes = [\"{}:{}\"]\n", volume.display(), outer.display()));
    let (ws, outer_s) = (env.workspace.display().to_string(), outer.display().to_string());
    let script = format!(
        "echo readme=$(cat {ws}/README); echo volume=$(cat {outer_s}/from-volume); \
         echo host-only=$(test -e {outer_s}/host-only && echo visible || echo hidden); \
         echo ws-write=$(echo inside > {ws}/inside.txt && echo yes); echo vol-write=$(echo new > {outer_s}/new && echo yes); \
         echo hook=$(echo x 2>/dev/null > {ws}/.git/hooks/pre-commit && echo writable || echo read-only); \
         echo status=$(git -C {ws} status --short | tr '\\n' ' ')"
    );
    let out = ok(&sh(&env, &script));
    assert_eq!(field(&out, "readme"), "test workspace", "{out}");
    assert_eq!(field(&out, "volume"), "volume");
    assert_eq!(field(&out, "host-only"), "hidden", "the volume does not cover its sandbox path");
    assert_eq!(field(&out, "ws-write"), "yes");
    assert_eq!(field(&out, "vol-write"), "yes");
    assert_eq!(field(&out, "hook"), "read-only", "Git Sentry under a volume");
    assert_eq!(field(&out, "status").trim(), "?? inside.txt");
    assert_eq!(fs::read_to_string(env.workspace.join("inside.txt")).expect("workspace write on the host"), "inside\n");
    assert_eq!(fs::read_to_string(volume.join("new")).expect("volume write on the host"), "new\n");
    assert!(!outer.join("new").exists(), "a volume write reached the host's path below the volume");
    assert!(!env.workspace.join(".git/hooks/pre-commit").exists(), "a hook was written");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// A volume written `HOSTDIR:~/.tool` for `agent_user` (a profile's `user`
/// line, empty for the default agent) with the test user as the developer
/// (`SUDO_UID`): the configuration is root's, as a root agent requires,
/// the workspace and the host directory the developer's. Returns the env
/// and the host directory, which holds `from-host`.
fn home_volume_env(agent_user: &str) -> (TestEnv, PathBuf) {
    let (uid, gid) = test_user();
    let mut env = TestEnv::with_profile(agent_user);
    env.env.push(("SUDO_UID".into(), uid.to_string()));
    env.env.push(("SUDO_GID".into(), gid.to_string()));
    let host_dir = env.scratch.join("tool");
    fs::create_dir(&host_dir).expect("host dir");
    fs::write(host_dir.join("from-host"), "host\n").expect("host file");
    chown_tree(&host_dir, uid, gid);
    chown_tree(&env.workspace, uid, gid);
    env.write_config(&format!("{agent_user}volumes = [\"{}:~/.tool\"]\n", host_dir.display()));
    (env, host_dir)
}

const HOME_VOLUME: &str = "echo home=$HOME; echo seen=$(cat $HOME/.tool/from-host); \
                           echo wrote=$(echo agent > $HOME/.tool/from-agent && echo yes); echo uid=$(id -u)";

/// `~/.tool` on the sandbox side is the default agent's home: the
/// developer's name inside, the Domain's persistent home, with the volume
/// bound below it; what the agent writes there is on the host, the
/// developer's.
#[test]
fn a_home_volume_lands_in_the_default_agents_home() {
    let (uid, gid) = test_user();
    let (env, host_dir) = home_volume_env("");
    let out = ok(&sh(&env, &format!("{HOME_VOLUME}; echo home-owner=$(stat -c %u ~)")));
    println!("inside, as the developer:\n{out}");
    assert_eq!(field(&out, "home"), format!("/home/{TEST_USER}"), "{out}");
    assert_eq!(field(&out, "uid"), uid.to_string());
    assert_eq!(field(&out, "seen"), "host", "the host directory is not at $HOME/.tool");
    assert_eq!(field(&out, "wrote"), "yes");
    // The home around the volume is still the agent's own.
    assert_eq!(field(&out, "home-owner"), uid.to_string());
    let written = host_dir.join("from-agent");
    assert_eq!(fs::read_to_string(&written).expect("the agent's write on the host"), "agent\n");
    let meta = fs::metadata(&written).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (uid, gid), "owner of the agent's write");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// The same volume for a root agent (a root-owned configuration) lands at
/// /root/.tool; its write reaches the host and, once the Domain is down
/// (the Workspace Guard's final sweep), belongs to the developer.
#[test]
fn a_home_volume_lands_in_root_agents_home() {
    let (uid, gid) = test_user();
    let (env, host_dir) = home_volume_env("user = \"root\"\n");
    let on_host_before = Path::new("/root/.tool").exists();
    let out = ok(&sh(&env, &format!("{HOME_VOLUME}; echo root-path=$(cat /root/.tool/from-host)")));
    println!("inside, as root:\n{out}");
    assert_eq!(field(&out, "home"), "/root", "{out}");
    assert_eq!(field(&out, "uid"), "0");
    assert_eq!(field(&out, "seen"), "host", "the host directory is not at $HOME/.tool");
    assert_eq!(field(&out, "root-path"), "host");
    assert_eq!(field(&out, "wrote"), "yes");
    assert_eq!(env.wait_domains_unlocked(), Vec::<String>::new());
    let written = host_dir.join("from-agent");
    assert_eq!(fs::read_to_string(&written).expect("the agent's write on the host"), "agent\n");
    let meta = fs::metadata(&written).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (uid, gid), "a root agent's write in a volume is given to the developer");
    assert_eq!(Path::new("/root/.tool").exists(), on_host_before, "the volume's sandbox path reached the host's /root");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// When `runsc create` fails, the developer sees runsc's own message (issue
/// 14 showed "see runsc's messages above" with nothing above: by then
/// runsc's stderr is the coordinator's log). A file bound over a directory
/// of the image makes runsc fail deterministically.
#[test]
fn a_failing_runsc_create_shows_runscs_message() {
    let env = TestEnv::new();
    let file = env.scratch.join("a-file");
    fs::write(&file, "not a directory\n").expect("volume file");
    env.write_config(&format!("user = \"root\"\nvolumes = [\"{}:/usr/share\"]\n", file.display()));
    let out = sh(&env, "true");
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "stderr: {stderr}");
    let error = stderr.lines().find(|l| l.starts_with("lazaret: error:")).unwrap_or_else(|| panic!("no error line in {stderr}"));
    assert!(error.contains("runsc create"), "{error}");
    assert!(!error.contains("above"), "{error}");
    // runsc's message names the mount it could not make.
    assert!(error.contains(&*file.to_string_lossy()) && error.contains("/usr/share"), "runsc's message is missing: {error}");
    env.assert_nothing_left();
}
