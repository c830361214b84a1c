//! Helpers of the host escalation tests (issue 12) and `lazaret-bench
//! escalate`: rules written into a test's configuration, the non-root
//! developer, host directories only the host sees, host processes by
//! command line, and `lazaret ls --json`.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::pty::TestTerminal;
use crate::{TEST_USER, TestEnv, lazaret_bin, random_suffix, sibling_bin, test_user, text, wait_with_limit};

/// The static `lazaret-escalate` in `../lib/lazaret/` of the `lazaret`
/// under test (where Lazaret looks for it); fails naming the command that
/// installs it.
pub fn escalate_bin() -> PathBuf {
    let bin_dir = lazaret_bin().parent().map(Path::to_path_buf).unwrap_or_default();
    let p = bin_dir.parent().unwrap_or(Path::new("/")).join("lib/lazaret/lazaret-escalate");
    assert!(
        p.is_file(),
        "{} missing: build and install it with `install -D -m 0755 \"$(bash scripts/build-escalate.sh)\" {}`",
        p.display(),
        p.display()
    );
    p
}

/// The in-sandbox helper (hostile clients, timing and concurrency loops).
pub fn escprobe_bin() -> PathBuf {
    sibling_bin("lazaret-escprobe")
}

/// Copies `lazaret-escprobe` into the workspace (so the sandbox sees it at
/// the same path) and returns that path.
pub fn install_escprobe(env: &TestEnv) -> PathBuf {
    let dest = env.workspace.join(".escprobe");
    fs::copy(escprobe_bin(), &dest).expect("copying lazaret-escprobe");
    fs::set_permissions(&dest, fs::Permissions::from_mode(0o755)).expect("chmod escprobe");
    dest
}

/// A TOML basic string holding `s` exactly (JSON's escapes are TOML's).
pub fn toml_str(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

/// One `[[escalation.rules]]` entry.
#[derive(Debug, Clone)]
pub struct Rule {
    /// `name`.
    pub name: String,
    /// `command`, the exact argv.
    pub command: Vec<String>,
    /// `allow_extra_args`.
    pub allow_extra_args: bool,
    /// `cwd`, workspace-relative.
    pub cwd: Option<String>,
    /// `timeout`, seconds.
    pub timeout: Option<u64>,
    /// `env`, host variable names.
    pub env: Vec<String>,
}

impl Rule {
    /// A rule approving exactly `command`.
    pub fn new(name: &str, command: &[&str]) -> Rule {
        Rule {
            name: name.into(),
            command: command.iter().map(|s| s.to_string()).collect(),
            allow_extra_args: false,
            cwd: None,
            timeout: None,
            env: Vec::new(),
        }
    }

    /// The same rule with `allow_extra_args = true`.
    pub fn extra_args(mut self) -> Rule {
        self.allow_extra_args = true;
        self
    }

    /// The same rule with `cwd = CWD`.
    pub fn in_dir(mut self, cwd: &str) -> Rule {
        self.cwd = Some(cwd.into());
        self
    }

    /// The entry as TOML, under the array-of-tables `table`
    /// (`escalation.rules` or `profiles.NAME.escalation.rules`).
    pub fn toml(&self, table: &str) -> String {
        let list = |items: &[String]| items.iter().map(|s| toml_str(s)).collect::<Vec<_>>().join(", ");
        let mut s = format!(
            "\n[[{table}]]\nname = {}\ncommand = [{}]\nallow_extra_args = {}\n",
            toml_str(&self.name),
            list(&self.command),
            self.allow_extra_args
        );
        if let Some(cwd) = &self.cwd {
            s.push_str(&format!("cwd = {}\n", toml_str(cwd)));
        }
        if let Some(t) = self.timeout {
            s.push_str(&format!("timeout = {t}\n"));
        }
        if !self.env.is_empty() {
            s.push_str(&format!("env = [{}]\n", list(&self.env)));
        }
        s
    }
}

/// Global rules (`[[escalation.rules]]`), to append after a profile's keys.
pub fn rules_toml(rules: &[Rule]) -> String {
    rules.iter().map(|r| r.toml("escalation.rules")).collect()
}

/// The `[escalation]` table with `keys` (`prompt_timeout = 2` ...); put it
/// before [`rules_toml`]'s output or after, TOML does not mind.
pub fn settings_toml(keys: &str) -> String {
    format!("\n[escalation]\n{keys}\n")
}

/// Makes [`TEST_USER`] the developer of `env` (`SUDO_UID`, `SUDO_GID`,
/// `SUDO_USER`, as `sudo` sets them) and gives them the workspace.
pub fn make_developer(env: &mut TestEnv) {
    let (uid, gid) = test_user();
    for (k, v) in [("SUDO_UID", uid.to_string()), ("SUDO_GID", gid.to_string()), ("SUDO_USER", TEST_USER.to_string())] {
        env.env.retain(|(key, _)| key != k);
        env.env.push((k.into(), v));
    }
    chown_tree(&env.workspace, uid, gid);
}

/// A [`TestEnv`] whose developer is [`TEST_USER`] (never root: a host
/// command must run as the developer), with `extra` keys for
/// `[profiles.test]` (and anything after them). `lazaret-escalate` must be
/// installed.
pub fn developer_env(extra: &str) -> TestEnv {
    let _ = escalate_bin();
    let mut env = TestEnv::with_profile(extra);
    make_developer(&mut env);
    env
}

/// `chown -R` without following symlinks.
pub fn chown_tree(path: &Path, uid: u32, gid: u32) {
    nix::unistd::fchownat(nix::fcntl::AT_FDCWD, path, Some(uid.into()), Some(gid.into()), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
        .expect("chown");
    if fs::symlink_metadata(path).expect("stat").is_dir() {
        for e in fs::read_dir(path).expect("read_dir").flatten() {
            chown_tree(&e.path(), uid, gid);
        }
    }
}

/// A directory on the host, outside every workspace (so the sandbox never
/// sees it), owned by [`TEST_USER`]; removed on drop.
pub struct HostDir {
    /// Its path.
    pub path: PathBuf,
}

impl HostDir {
    /// A fresh one under /tmp.
    pub fn new() -> HostDir {
        let path = PathBuf::from(format!("/tmp/lazaret-esc-host-{}", random_suffix()));
        fs::create_dir(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        let dir = HostDir { path };
        let (uid, gid) = test_user();
        chown_tree(&dir.path, uid, gid);
        fs::set_permissions(&dir.path, fs::Permissions::from_mode(0o755)).expect("chmod host dir");
        dir
    }

    /// The path of `name` in it.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The path of `name` in it, as a string for a command line.
    pub fn arg(&self, name: &str) -> String {
        self.file(name).display().to_string()
    }

    /// Writes `data` to `name` (owned by the developer, 0644).
    pub fn write(&self, name: &str, data: &[u8]) -> PathBuf {
        let p = self.file(name);
        fs::write(&p, data).unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
        let (uid, gid) = test_user();
        chown_tree(&p, uid, gid);
        p
    }
}

impl Default for HostDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.path);
    }
}

/// `lazaret ARGS` on `pty` (all three streams), with `env`'s extra
/// environment (the developer's `SUDO_*`).
pub fn tty_spawn(pty: &TestTerminal, env: &TestEnv, args: &[&str]) -> Child {
    let mut cmd = pty.command(env, args);
    for (k, v) in &env.env {
        cmd.env(k, v);
    }
    cmd.stdin(pty.io()).stdout(pty.io()).stderr(pty.io()).spawn().expect("spawning setsid -c lazaret (util-linux)")
}

/// `lazaret ARGS` with piped stdout and stderr and stdin from /dev/null, spawned.
pub fn spawn_piped<S: AsRef<std::ffi::OsStr>>(env: &TestEnv, args: &[S]) -> Child {
    env.lazaret(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning lazaret")
}

/// A host process: PID, real uid and command line (arguments joined by spaces).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostProcess {
    /// PID on the host.
    pub pid: i32,
    /// Real uid.
    pub uid: u32,
    /// Command line, arguments joined by single spaces.
    pub cmdline: String,
}

/// Host processes whose command line is exactly `cmdline` (arguments joined
/// by single spaces). Processes inside a gVisor sandbox are not host
/// processes, so whatever this finds runs on the host.
pub fn host_processes(cmdline: &str) -> Vec<HostProcess> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").map(|rd| rd.flatten().collect::<Vec<_>>()).unwrap_or_default() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(raw) = fs::read(e.path().join("cmdline")) else { continue };
        let args: Vec<String> = raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        if args.join(" ") != cmdline {
            continue;
        }
        let status = fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|u| u.parse().ok())
            .unwrap_or(u32::MAX);
        found.push(HostProcess { pid, uid, cmdline: args.join(" ") });
    }
    found
}

/// A `sleep` duration no other test uses, so that [`host_processes`] finds
/// only this test's (GNU and busybox sleep take fractions).
pub fn unique_sleep() -> String {
    let n = u64::from_str_radix(&random_suffix()[..8], 16).unwrap_or(1);
    format!("{}.{}", 1000 + n % 9000, n % 1_000_000 + 1)
}

/// Polls `f` every 20 ms until it returns `Some`, failing the test after
/// `limit` with `what`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `lazaret ls --json`, parsed (a list of Domains).
pub fn ls_json(env: &TestEnv) -> serde_json::Value {
    let out = env.run(["ls", "--json"]);
    assert_eq!(out.status.code(), Some(0), "lazaret ls --json: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("lazaret ls --json is not JSON ({e}): {}", text(&out.stdout)))
}

/// The Session IDs `lazaret ls --json` lists for `env`'s Domains.
pub fn sessions(env: &TestEnv) -> Vec<String> {
    let ls = ls_json(env);
    ls.as_array()
        .into_iter()
        .flatten()
        .flat_map(|d| d["sessions"].as_array().cloned().unwrap_or_default())
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

/// The pending requests `lazaret ls --json` lists for `env`'s Domains.
pub fn pending(env: &TestEnv) -> Vec<serde_json::Value> {
    let ls = ls_json(env);
    ls.as_array().into_iter().flatten().flat_map(|d| d["pending"].as_array().cloned().unwrap_or_default()).collect()
}

/// The journal entries of `env` with action `action`.
pub fn journal_with(env: &TestEnv, action: &str) -> Vec<serde_json::Value> {
    env.journal_entries().into_iter().filter(|e| e["action"] == action).collect()
}

/// The actions of `env`'s journal that concern escalation request `request`, in order.
pub fn request_actions(env: &TestEnv, request: &str) -> Vec<String> {
    env.journal_entries().into_iter().filter(|e| e["request"] == request).filter_map(|e| e["action"].as_str().map(String::from)).collect()
}

/// The request IDs of `env`'s `VerifyRequest` entries whose argv is `argv`.
pub fn requests_for(env: &TestEnv, argv: &[&str]) -> Vec<String> {
    journal_with(env, "VerifyRequest")
        .into_iter()
        .filter(|e| e["argv"].as_array().is_some_and(|a| a.iter().map(|v| v.as_str().unwrap_or("\u{0}")).eq(argv.iter().copied())))
        .filter_map(|e| e["request"].as_str().map(String::from))
        .collect()
}

/// Runs `cmd` with a watchdog: the test must not hang when the product does.
pub fn command_output(mut cmd: Command) -> std::process::Output {
    crate::wait_output(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning"))
}

/// The coordinator logs of `env`'s Domains, for failure messages.
pub fn coordinator_logs(env: &TestEnv) -> String {
    env.domain_ids()
        .iter()
        .map(|id| fs::read_to_string(env.runtime_dir.join(id).join("coordinator.log")).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n---\n")
}

/// A `lazaret run PROFILE` session that holds its Domain open (it waits
/// for a line on stdin) until [`Holder::release`].
pub struct Holder {
    child: Child,
    /// What its script printed before it was up.
    pub printed: String,
}

impl Holder {
    /// Runs `script` in a session of `profile` with `extra_env` in the
    /// launcher's environment, then waits: returns once the session
    /// printed `up`.
    pub fn start(env: &TestEnv, profile: &str, script: &str, extra_env: &[(&str, &str)]) -> Holder {
        let mut cmd = env.lazaret(["run", profile, "--", "sh", "-c", &format!("{script}; echo; echo up; read line")]);
        cmd.envs(extra_env.iter().copied()).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawning the holder");
        let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
        let mut printed = String::new();
        loop {
            let mut line = String::new();
            let n = reader.read_line(&mut line).expect("holder output");
            assert!(n > 0, "the holder session ended before it was up; it printed {printed:?}\n{}", coordinator_logs(env));
            if line == "up\n" {
                break;
            }
            printed.push_str(&line);
        }
        Holder { child, printed }
    }

    /// Waits for the session to end by itself (its Domain was killed), without
    /// a line on stdin; its status.
    pub fn wait_ended(mut self) -> std::process::ExitStatus {
        wait_with_limit(&mut self.child)
    }

    /// Lets the session end; it must exit 0.
    pub fn release(mut self) {
        let _ = self.child.stdin.take().expect("stdin").write_all(b"\n");
        assert_eq!(wait_with_limit(&mut self.child).code(), Some(0), "the holder session failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_written_as_toml_with_every_byte_escaped() {
        let rule = Rule::new("r", &["sh", "-c", "echo \"a\\b\"\n\u{1b}"]).extra_args().in_dir("sub/dir");
        assert_eq!(
            rule.toml("escalation.rules"),
            "\n[[escalation.rules]]\nname = \"r\"\ncommand = [\"sh\", \"-c\", \"echo \\\"a\\\\b\\\"\\n\\u001b\"]\nallow_extra_args = true\ncwd = \"sub/dir\"\n"
        );
        let mut timed = Rule::new("t", &["true"]);
        timed.timeout = Some(5);
        timed.env = vec!["GH_TOKEN".into()];
        assert_eq!(
            rules_toml(&[timed]),
            "\n[[escalation.rules]]\nname = \"t\"\ncommand = [\"true\"]\nallow_extra_args = false\ntimeout = 5\nenv = [\"GH_TOKEN\"]\n"
        );
    }

    #[test]
    fn unique_sleeps_differ_and_parse_as_numbers() {
        let (a, b) = (unique_sleep(), unique_sleep());
        assert_ne!(a, b);
        for s in [a, b] {
            assert!(s.parse::<f64>().is_ok_and(|v| v >= 1000.0), "{s}");
        }
    }
}
