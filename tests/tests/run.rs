//! `lazaret run` end to end (issue 2): exit status, isolation, workspace
//! propagation and ownership, and nothing left behind.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::MetadataExt;
use std::process::Stdio;

use lazaret_tests::*;

#[test]
fn prints_output_and_returns_the_agent_exit_code() {
    let env = TestEnv::new();
    let out = env.run(["run", "test", "--", "sh", "-c", "echo ok; exit 7"]);
    assert_eq!(text(&out.stdout), "ok\n", "stderr: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(7), "stderr: {}", text(&out.stderr));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn death_by_signal_gives_128_plus_n() {
    let env = TestEnv::new();
    let out = env.run(["run", "test", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(143), "stderr: {}", text(&out.stderr));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn kernel_pids_and_hostname_are_the_sandboxs() {
    let env = TestEnv::new();
    let probe = env.install_probe();
    let me = std::process::id().to_string();
    let host = nix::unistd::gethostname().expect("hostname").to_string_lossy().into_owned();
    let out = env.run([
        "run".as_ref(),
        "test".as_ref(),
        "--".as_ref(),
        probe.as_os_str(),
        "gvisor".as_ref(),
        host_kernel_release().as_ref(),
        "--".as_ref(),
        "no-host-pids".as_ref(),
        me.as_ref(),
        "1".as_ref(),
        "--".as_ref(),
        "hostname-is-not".as_ref(),
        host.as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(PROBE_PASS), "probe stderr: {}", text(&out.stderr));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// SR-12 seen from the host: the sandbox process shares none of our pid,
/// ipc, uts, net, mount or cgroup namespaces.
#[test]
fn sandbox_process_has_its_own_namespaces() {
    let env = TestEnv::new();
    let mut child = env
        .lazaret(["run", "test", "--", "sh", "-c", "echo ready; read line; echo bye"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("ready"));
    // runsc's pid file holds a PID of the sandbox's own PID namespace; find
    // the sandbox process from the host by its command line instead.
    let runtime = env.runtime_dir.display().to_string();
    let sandbox =
        processes_mentioning(&runtime).into_iter().find(|p| p.contains("runsc-sandbox")).expect("the runsc-sandbox process of this test");
    let pid = sandbox.split(':').next().expect("pid").to_string();
    for ns in ["pid", "ipc", "uts", "net", "mnt", "cgroup"] {
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).expect("own ns");
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).expect("sandbox ns");
        assert_ne!(ours, theirs, "the sandbox shares the host's {ns} namespace");
    }
    send(child.stdin.as_mut().expect("stdin"), b"go\n");
    drop(child.stdin.take());
    assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("bye"));
    let status = wait_with_limit(&mut child);
    assert_eq!(status.code(), Some(0));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Workspace writes appear on the host at once, owned by the (non-root)
/// developer, and host edits appear inside at once.
#[test]
fn workspace_is_shared_live_and_owned_by_the_developer() {
    let (uid, gid) = test_user();
    let mut env = TestEnv::with_profile("");
    env.env.push(("SUDO_UID".into(), uid.to_string()));
    env.env.push(("SUDO_GID".into(), gid.to_string()));
    nix::unistd::chown(&env.workspace, Some(uid.into()), Some(gid.into())).expect("chown workspace");
    let ws = env.workspace.display().to_string();
    let script = format!("echo from-inside > {ws}/inside.txt; id -u; id -g; echo written; read line; cat {ws}/host.txt");
    let mut child = env
        .lazaret(["run", "test", "--", "sh", "-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = || lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(next(), uid.to_string(), "agent uid");
    assert_eq!(next(), gid.to_string(), "agent gid");
    assert_eq!(next(), "written");
    // No waiting: the file must already be there.
    let inside = env.workspace.join("inside.txt");
    assert_eq!(std::fs::read_to_string(&inside).expect("inside.txt on the host"), "from-inside\n");
    let meta = std::fs::metadata(&inside).expect("stat");
    assert_eq!((meta.uid(), meta.gid()), (uid, gid), "owner of a file the agent wrote");
    std::fs::write(env.workspace.join("host.txt"), "from-host\n").expect("host write");
    send(child.stdin.as_mut().expect("stdin"), b"go\n");
    drop(child.stdin.take());
    assert_eq!(next(), "from-host");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Host paths outside the workspace are not there inside: another directory
/// under /root, a marker in /etc, the configuration file.
#[test]
fn host_paths_outside_the_workspace_are_invisible() {
    let env = TestEnv::new();
    let probe = env.install_probe();
    let secret_dir = std::path::PathBuf::from(format!("/root/lazaret-e2e-secret-{}", std::process::id()));
    std::fs::create_dir_all(&secret_dir).expect("secret dir");
    let _cleanup = RemoveOnDrop(secret_dir.clone());
    std::fs::write(secret_dir.join("secret"), "s3cret").expect("secret");
    let marker = format!("/etc/lazaret-e2e-marker-{}", std::process::id());
    std::fs::write(&marker, "host").expect("marker");
    let _cleanup2 = RemoveOnDrop(marker.clone().into());
    let shadow_host = std::fs::read("/etc/shadow").expect("host shadow");
    let secret = secret_dir.join("secret").display().to_string();
    let config = env.config.display().to_string();
    let out = env.run(["run", "test", "--", probe.to_str().expect("utf8"), "cannot-read", &secret, &marker, &config]);
    assert_eq!(out.status.code(), Some(PROBE_PASS), "probe stderr: {}", text(&out.stderr));
    // /etc/shadow inside is the image's, never the host's.
    let out = env.run(["run", "test", "--", "cat", "/etc/shadow"]);
    assert_ne!(out.stdout, shadow_host, "the host's /etc/shadow is visible inside");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        let _ = std::fs::remove_file(&self.0);
    }
}
