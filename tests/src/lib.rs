//! Harness for Lazaret's privileged end-to-end tests.
//!
//! Each test builds a [`TestEnv`]: its own git workspace, configuration file
//! (outside the workspace), runtime directory and Domain, sharing one cached
//! image store (`/var/cache/lazaret/test-storage`, with the test image
//! imported once). Dropping the env removes everything the test created,
//! also when the test failed: runsc containers under its runtime directory,
//! its directories and its Domain Roots. [`TestEnv::assert_nothing_left`]
//! checks the host for leftovers explicitly.
//!
//! Prerequisites are never skipped silently: a missing one fails the test
//! with a message naming it and the script that installs it.

#![forbid(unsafe_code)]

pub mod escalation;
pub mod escape;
pub mod images;
pub mod netlab;
pub mod pty;
pub mod registry;
pub mod screen;

use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where the shared test image store lives (outside the repository).
pub const TEST_STORAGE: &str = "/var/cache/lazaret/test-storage";
/// The name of the test image in that store.
pub const TEST_IMAGE: &str = "test";
/// Parent of every test's runtime directory, unless
/// [`RUNTIME_PARENT_VAR`] names another.
pub const TEST_RUNTIME_PARENT: &str = "/run/lazaret-test";
/// The environment variable naming another parent for the tests' runtime
/// directories (scripts/matrix.sh gives each cell its own, to find
/// anything a cell left behind by the command lines naming it).
pub const RUNTIME_PARENT_VAR: &str = "LAZARET_TEST_RUNTIME_PARENT";

/// Parent of this process's test runtime directories: `$LAZARET_TEST_RUNTIME_PARENT`, else [`TEST_RUNTIME_PARENT`].
pub fn runtime_parent() -> PathBuf {
    std::env::var_os(RUNTIME_PARENT_VAR).filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(TEST_RUNTIME_PARENT))
}
/// The non-root developer the ownership tests use (created by scripts/test.sh).
pub const TEST_USER: &str = "lazaret-test";
/// Exit code of the in-sandbox probe when every assertion held.
pub const PROBE_PASS: i32 = 42;
/// How long any single lazaret invocation may take before the test kills it.
pub const COMMAND_LIMIT: Duration = Duration::from_secs(120);

/// Fails the test (never skips it) unless it runs as root.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (namespaces, mounts, runsc): run it as root, with `sudo scripts/test.sh` (which also installs runsc and builds the test image)"
    );
}

/// The `lazaret` binary under test: `$LAZARET_BIN`, else target/debug.
pub fn lazaret_bin() -> PathBuf {
    let p = std::env::var_os("LAZARET_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/lazaret"));
    assert!(p.is_file(), "lazaret binary missing at {}: build it with `cargo build -p lazaret-cli` (scripts/test.sh does)", p.display());
    p
}

/// The probe binary, built next to the test executables (cargo builds a
/// package's binaries before its integration tests).
pub fn probe_bin() -> PathBuf {
    sibling_bin("lazaret-probe")
}

/// A binary of this package next to the running executable: tests run
/// from `target/<profile>/deps`, the bench from `target/<profile>`.
pub fn sibling_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let candidates = [dir.join(name), dir.parent().map(|d| d.join(name)).unwrap_or_default()];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| panic!("{name} missing next to {}: cargo builds it with this package's tests", exe.display()))
}

/// The cached test rootfs tarball built by scripts/build-image.sh.
pub fn test_image_tarball() -> PathBuf {
    let p = std::env::var_os("LAZARET_TEST_IMAGE_TARBALL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/lazaret/images/bookworm-minbase-git.tar.zst"));
    assert!(p.is_file(), "test image {} missing: build it with scripts/build-image.sh (scripts/test.sh does)", p.display());
    p
}

/// A host-only directory for the markers an attack's command would leave
/// (`touch MARKERS/NAME`), in the test's scratch directory (which the
/// sandbox never sees), writable by the developer.
pub fn marker_dir(env: &TestEnv) -> PathBuf {
    let dir = env.scratch.join("markers");
    fs::create_dir(&dir).expect("markers");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).expect("chmod markers");
    dir
}

/// The markers in `dir`, sorted: what ran that must not have.
pub fn markers(dir: &Path) -> Vec<String> {
    let mut m: Vec<String> =
        fs::read_dir(dir).expect("markers dir").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    m.sort();
    m
}

/// The host's kernel release (to tell gVisor's apart).
pub fn host_kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// uid and gid of [`TEST_USER`]; fails naming the fix when it is missing.
pub fn test_user() -> (u32, u32) {
    let user = nix::unistd::User::from_name(TEST_USER)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("user {TEST_USER} missing: scripts/test.sh creates it (useradd --system --create-home {TEST_USER})"));
    (user.uid.as_raw(), user.gid.as_raw())
}

pub(crate) fn random_suffix() -> String {
    let mut b = [0u8; 6];
    if let Ok(mut f) = fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Imports the test image into the shared store once per machine (a flock
/// serialises test processes).
fn ensure_test_image() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let tarball = test_image_tarball();
        fs::create_dir_all("/var/cache/lazaret").expect("creating /var/cache/lazaret");
        let lock = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open("/var/cache/lazaret/test-storage.lock")
            .expect("lock file");
        let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e).expect("flock");
        let cfg = Path::new("/var/cache/lazaret/test-storage.toml");
        write_config(cfg, &format!("storage_root = \"{TEST_STORAGE}\"\n[profiles.test]\nimage = \"{TEST_IMAGE}\"\n"));
        let ls = Command::new(lazaret_bin()).arg("--config").arg(cfg).args(["image", "ls"]).output().expect("lazaret image ls");
        assert!(ls.status.success(), "lazaret image ls failed: {}", String::from_utf8_lossy(&ls.stderr));
        let listed = String::from_utf8_lossy(&ls.stdout).lines().skip(1).any(|l| l.split_whitespace().next() == Some(TEST_IMAGE));
        if !listed {
            let out = Command::new(lazaret_bin())
                .arg("--config")
                .arg(cfg)
                .args(["image", "import", TEST_IMAGE])
                .arg(&tarball)
                .output()
                .expect("lazaret image import");
            assert!(out.status.success(), "importing the test image failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    });
}

fn write_config(path: &Path, text: &str) {
    fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).expect("chmod config");
}

/// The environment variable naming the runsc platform (`systrap`,
/// `ptrace`, `kvm`) that [`TestEnv`]'s configurations ask for in
/// `[runsc] platform`; unset, they leave the default (scripts/matrix.sh
/// sets it per cell).
pub const RUNSC_PLATFORM_VAR: &str = "LAZARET_TEST_RUNSC_PLATFORM";

/// The platform [`RUNSC_PLATFORM_VAR`] asks for, if set; fails the test on
/// a value runsc has no platform for.
pub fn runsc_platform() -> Option<String> {
    let value = std::env::var(RUNSC_PLATFORM_VAR).ok().filter(|v| !v.is_empty())?;
    assert!(["systrap", "ptrace", "kvm"].contains(&value.as_str()), "{RUNSC_PLATFORM_VAR}={value:?}: expected systrap, ptrace or kvm");
    Some(value)
}

fn has_runsc_table(config: &str) -> bool {
    config.lines().any(|l| l.trim() == "[runsc]")
}

/// `config` with `keys` (TOML lines) in its `[runsc]` table: inserted
/// after the table's header when it has one (a TOML table may not appear
/// twice, and [`TestEnv::write_config`] may have written one for the
/// platform), else appended as a new table.
pub fn with_runsc_keys(config: &str, keys: &str) -> String {
    if !has_runsc_table(config) {
        return format!("{config}\n[runsc]\n{keys}");
    }
    let mut out = String::new();
    let mut done = false;
    for line in config.split_inclusive('\n') {
        out.push_str(line);
        if !done && line.trim() == "[runsc]" {
            if !line.ends_with('\n') {
                out.push('\n');
            }
            out.push_str(keys);
            done = true;
        }
    }
    out
}

/// One test's world: a git workspace, a configuration, a runtime directory.
pub struct TestEnv {
    /// Scratch directory holding everything below (removed on drop).
    pub scratch: PathBuf,
    /// The git workspace (canonical path).
    pub workspace: PathBuf,
    /// The configuration file (outside the workspace).
    pub config: PathBuf,
    /// This test's runtime directory.
    pub runtime_dir: PathBuf,
    /// Environment variables added to every lazaret invocation.
    pub env: Vec<(String, String)>,
    /// The network namespace lazaret runs in (a [`NetLab`]'s host), else
    /// each invocation gets a fresh, empty one: no test ever builds a
    /// sidecar in this machine's real network namespace.
    pub netns: Option<PathBuf>,
    /// The Storage Root the configuration names ([`TEST_STORAGE`] unless a
    /// test points it elsewhere, then rewrites the configuration).
    pub storage: PathBuf,
}

impl TestEnv {
    /// A workspace with one commit and a configuration with profile `test`
    /// (the test image, `/bin/sh`, as root).
    pub fn new() -> TestEnv {
        Self::with_profile("user = \"root\"\n")
    }

    /// Like [`TestEnv::new`], with extra keys for `[profiles.test]`.
    pub fn with_profile(extra: &str) -> TestEnv {
        Self::below(Path::new("/tmp"), "ws", extra)
    }

    /// Like [`TestEnv::with_profile`], with the scratch directory (which
    /// holds the configuration, and the workspace at `scratch/WS_REL`)
    /// created in `parent` instead of /tmp: `parent` must exist, and the
    /// scratch directory is removed on drop like any other.
    pub fn below(parent: &Path, ws_rel: &str, extra: &str) -> TestEnv {
        require_root();
        ensure_test_image();
        assert!(parent.is_dir(), "{} is not a directory", parent.display());
        assert!(
            Path::new(ws_rel).is_relative() && !ws_rel.split('/').any(|c| c.is_empty() || c == "." || c == ".."),
            "bad workspace path {ws_rel:?}"
        );
        let scratch = parent.join(format!("lazaret-e2e-{}", random_suffix()));
        fs::create_dir(&scratch).unwrap_or_else(|e| panic!("creating {}: {e}", scratch.display()));
        // Owned by the env from here on: removed even if the rest fails.
        let mut env = TestEnv {
            workspace: PathBuf::new(),
            config: scratch.join("config.toml"),
            runtime_dir: runtime_parent().join(random_suffix()),
            scratch,
            env: Vec::new(),
            netns: None,
            storage: PathBuf::from(TEST_STORAGE),
        };
        let scratch = env.scratch.clone();
        fs::create_dir_all(scratch.join(ws_rel)).expect("scratch");
        fs::set_permissions(&scratch, fs::Permissions::from_mode(0o755)).expect("chmod scratch");
        let workspace = fs::canonicalize(scratch.join(ws_rel)).expect("canonical workspace");
        env.workspace = workspace.clone();
        git(&workspace, &["init", "-q", "-b", "main"]);
        fs::write(workspace.join("README"), "test workspace\n").expect("README");
        git(&workspace, &["add", "README"]);
        git(&workspace, &["-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "init"]);
        fs::create_dir_all(runtime_parent()).expect("runtime parent");
        env.write_config(extra);
        env
    }

    /// Rewrites the configuration with `extra` keys for `[profiles.test]`
    /// (and `[runsc] platform` when [`RUNSC_PLATFORM_VAR`] is set).
    pub fn write_config(&self, extra: &str) {
        let (runsc, extra) = match runsc_platform() {
            Some(platform) if has_runsc_table(extra) => (String::new(), with_runsc_keys(extra, &format!("platform = \"{platform}\"\n"))),
            Some(platform) => (format!("[runsc]\nplatform = \"{platform}\"\n\n"), extra.to_string()),
            None => (String::new(), extra.to_string()),
        };
        let text = format!(
            "storage_root = \"{}\"\nruntime_dir = \"{}\"\n\n{runsc}[profiles.test]\nimage = \"{TEST_IMAGE}\"\ncommand = [\"/bin/sh\"]\n{extra}",
            self.storage.display(),
            self.runtime_dir.display()
        );
        write_config(&self.config, &text);
    }

    /// A `lazaret` command with this env's configuration, run in the workspace.
    pub fn lazaret<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = self.in_netns();
        cmd.arg(lazaret_bin()).arg("--config").arg(&self.config).args(args).current_dir(&self.workspace).stdin(Stdio::null());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// A command prefix that runs its arguments in this env's network
    /// namespace: `nsenter --net=PATH` into a lab's host, else `unshare
    /// --net` (neither remounts /sys, which would break runsc's cgroups).
    pub fn in_netns(&self) -> Command {
        match &self.netns {
            Some(path) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", path.display())).arg("--");
                c
            }
            None => {
                let mut c = Command::new("unshare");
                c.arg("--net").arg("--");
                c
            }
        }
    }

    /// Runs `lazaret ARGS` to completion (killing it after
    /// [`COMMAND_LIMIT`]) and returns its output.
    pub fn run<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let child = self.lazaret(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning lazaret");
        wait_output(child)
    }

    /// Copies the probe into the workspace (so the sandbox sees it at the
    /// same path) and returns that path.
    pub fn install_probe(&self) -> PathBuf {
        let dest = self.workspace.join(".probe");
        fs::copy(probe_bin(), &dest).expect("copying the probe");
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o755)).expect("chmod probe");
        dest
    }

    /// runsc containers still known under this env's runtime directory.
    pub fn leftover_containers(&self) -> Vec<String> {
        let mut found = Vec::new();
        for state in self.runsc_state_roots() {
            if let Ok(out) = Command::new("runsc").arg("--root").arg(&state).args(["list", "-quiet"]).output() {
                found.extend(String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.trim().is_empty()).map(String::from));
            }
        }
        found
    }

    fn runsc_state_roots(&self) -> Vec<PathBuf> {
        let mut roots = Vec::new();
        if let Ok(entries) = fs::read_dir(&self.runtime_dir) {
            for e in entries.flatten() {
                let r = e.path().join("runsc");
                if r.is_dir() {
                    roots.push(r);
                }
            }
        }
        roots
    }

    /// Domain IDs that have a directory under this env's runtime directory.
    pub fn domain_ids(&self) -> Vec<String> {
        fs::read_dir(&self.runtime_dir)
            .map(|rd| rd.flatten().filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    }

    /// Waits (up to [`COMMAND_LIMIT`] in all) until no coordinator holds the
    /// lock of any of this env's Domains: `lazaret run` returns as soon as
    /// its agent exited, and the Domain goes down behind it, its lock held
    /// until everything is gone. Returns the Domains still locked when the
    /// wait ran out.
    pub fn wait_domains_unlocked(&self) -> Vec<String> {
        let deadline = Instant::now() + COMMAND_LIMIT;
        self.domain_ids()
            .into_iter()
            .filter(|id| {
                let lock = lazaret_coordinator::layout::DomainDir::new(self.runtime_dir.join(id)).lock();
                !lazaret_coordinator::client::wait_unlocked(&lock, deadline.saturating_duration_since(Instant::now()))
            })
            .collect()
    }

    /// Asserts that every Domain of this env went down (its lock released)
    /// and that no runsc container, run directory, cgroup, host mount or
    /// process of this env is left.
    pub fn assert_nothing_left(&self) {
        let locked = self.wait_domains_unlocked();
        assert_eq!(locked, Vec::<String>::new(), "Domains still locked (not down) after {COMMAND_LIMIT:?}");
        assert_eq!(self.leftover_containers(), Vec::<String>::new(), "runsc containers left behind");
        for id in self.domain_ids() {
            let dir = self.runtime_dir.join(&id);
            let runs: Vec<_> = fs::read_dir(&dir)
                .map(|rd| rd.flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().starts_with("run-")).collect())
                .unwrap_or_default();
            assert!(runs.is_empty(), "run directories left in {}: {runs:?}", dir.display());
            for hierarchy in fs::read_dir("/sys/fs/cgroup").map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>()).unwrap_or_default()
            {
                let cg = hierarchy.join("lazaret").join(&id);
                assert!(!cg.exists(), "cgroup left behind: {}", cg.display());
            }
        }
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let needle = self.runtime_dir.to_string_lossy().into_owned();
        assert!(!mountinfo.contains(&needle), "host mount table mentions {needle}");
        assert!(!mountinfo.contains(&*self.workspace.to_string_lossy()), "host mount table mentions the workspace");
        let procs = processes_mentioning(&needle);
        assert!(procs.is_empty(), "processes left behind: {procs:?}");
    }
}

impl TestEnv {
    /// Asserts that every journal of this env's Domains replays against the
    /// protocol model (`lazaret journal --check --file`), that at least one
    /// exists, and that each Domain's current journal records a finished run
    /// (the Domain is down). Call it after the last session left: it first
    /// waits for the Domains' locks ([`TestEnv::wait_domains_unlocked`]).
    pub fn assert_journal_conforms(&self) {
        let locked = self.wait_domains_unlocked();
        assert_eq!(locked, Vec::<String>::new(), "Domains still locked (not down) after {COMMAND_LIMIT:?}");
        let mut journals = Vec::new();
        for id in self.domain_ids() {
            let root = self.storage.join("domains").join(&id);
            for e in fs::read_dir(&root).map(|rd| rd.flatten().collect::<Vec<_>>()).unwrap_or_default() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name == "journal.jsonl" || (name.starts_with("journal-") && name.ends_with(".crashed.jsonl")) {
                    journals.push(e.path());
                }
            }
        }
        assert!(!journals.is_empty(), "no Domain journal found for {}", self.runtime_dir.display());
        for j in journals {
            let out = self.run(["journal".as_ref(), "--check".as_ref(), "--file".as_ref(), j.as_os_str()]);
            let report = text(&out.stdout);
            assert!(out.status.success(), "journal {} does not conform: {}{}", j.display(), report, text(&out.stderr));
            assert!(report.contains("conforms to the protocol model"), "{report}");
            if j.file_name().is_some_and(|n| n == "journal.jsonl") {
                assert!(report.contains("run complete"), "the Domain's run is not finished: {report}");
            }
        }
    }

    /// The journal lines of this env's Domain for `profile`'s workspace, parsed.
    pub fn journal_entries(&self) -> Vec<serde_json::Value> {
        let mut entries = Vec::new();
        for id in self.domain_ids() {
            let path = self.storage.join("domains").join(&id).join("journal.jsonl");
            for line in fs::read_to_string(&path).unwrap_or_default().lines() {
                if let Ok(v) = serde_json::from_str(line) {
                    entries.push(v);
                }
            }
        }
        entries
    }

    /// Host PIDs of this env's coordinator daemons (the outer process of
    /// each, whose command line names its Domain directory).
    pub fn coordinator_pids(&self) -> Vec<i32> {
        let all: Vec<i32> = processes_mentioning(&self.runtime_dir.to_string_lossy())
            .into_iter()
            .filter(|p| p.contains("__coordinator"))
            .filter_map(|p| p.split(':').next().and_then(|n| n.parse().ok()))
            .collect();
        // A coordinator forks its PID-namespace init and the coordinator
        // proper (same command line): keep the outermost of each tree.
        all.iter().copied().filter(|pid| parent_pid(*pid).is_none_or(|pp| !all.contains(&pp))).collect()
    }

    /// Waits (up to [`COMMAND_LIMIT`]) until every Domain lock of this env is
    /// free and no process mentions this env's runtime directory; returns
    /// what is left if the wait ran out.
    pub fn wait_no_processes(&self) -> Vec<String> {
        let _ = self.wait_domains_unlocked();
        let needle = self.runtime_dir.to_string_lossy().into_owned();
        let deadline = Instant::now() + COMMAND_LIMIT;
        loop {
            let left = processes_mentioning(&needle);
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The Domain runtime directory of this env's (single) Domain, once it exists.
    pub fn domain_dir(&self) -> Option<PathBuf> {
        self.domain_ids().first().map(|id| self.runtime_dir.join(id))
    }
}

/// What a Domain can leave on the host, counted; two counts taken before
/// and after a crash and recovery must be equal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCounts {
    /// runsc containers under the env's state roots.
    pub containers: usize,
    /// Network namespaces: distinct ones of the env's processes, and
    /// Lazaret's pinned under /run/netns.
    pub netns: usize,
    /// veth links in the env's network namespace (`ip -o link`).
    pub veths: usize,
    /// Host mounts naming the env's runtime directory, workspace or Domains.
    pub mounts: usize,
    /// cgroup directories of the env's Domains, in every hierarchy.
    pub cgroups: usize,
    /// Processes whose command line names the env's runtime directory.
    pub processes: usize,
}

impl HostCounts {
    /// Counts now, for `env` (veths seen from `netns`, a path for
    /// `nsenter --net=`, or this process's namespace).
    ///
    /// Every Domain of `env` is waited for first: call it when no session
    /// is running (a Domain goes down behind its last session's Exit).
    pub fn take(env: &TestEnv, netns: Option<&Path>) -> HostCounts {
        let _ = env.wait_domains_unlocked();
        let needle = env.runtime_dir.to_string_lossy().into_owned();
        let procs = processes_mentioning(&needle);
        // Network namespaces: those of this env's processes, plus any pinned
        // under /run/netns by Lazaret (names starting with "lz").
        let mut inodes = std::collections::BTreeSet::new();
        for p in &procs {
            if let Some(pid) = p.split(':').next() {
                if let Ok(l) = fs::read_link(format!("/proc/{pid}/ns/net")) {
                    inodes.insert(l.to_string_lossy().into_owned());
                }
            }
        }
        let pinned = fs::read_dir("/run/netns")
            .map(|d| d.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("lz")).count())
            .unwrap_or(0);
        let mut ip = match netns {
            Some(p) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", p.display())).args(["--", "ip"]);
                c
            }
            None => Command::new("ip"),
        };
        let links = ip.args(["-o", "link", "show", "type", "veth"]).output().map(|o| text(&o.stdout)).unwrap_or_default();
        // Mounts and cgroups that name this env's runtime directory, its
        // workspace or its Domains (other tests may run at the same time).
        let mut mount_needles = vec![needle.clone(), env.workspace.to_string_lossy().into_owned()];
        let mut cgroups = 0;
        for id in env.domain_ids() {
            mount_needles.push(env.storage.join("domains").join(&id).to_string_lossy().into_owned());
            for h in fs::read_dir("/sys/fs/cgroup").map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>()).unwrap_or_default() {
                let d = h.join("lazaret").join(&id);
                if d.is_dir() {
                    cgroups += 1 + count_dirs(&d);
                }
            }
        }
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        HostCounts {
            containers: env.leftover_containers().len(),
            netns: inodes.len() + pinned,
            veths: links.lines().filter(|l| !l.trim().is_empty()).count(),
            mounts: mountinfo.lines().filter(|l| mount_needles.iter().any(|n| l.contains(n.as_str()))).count(),
            cgroups,
            processes: procs.len(),
        }
    }
}

/// The parent PID of `pid` (from /proc/PID/stat).
pub fn parent_pid(pid: i32) -> Option<i32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn count_dirs(dir: &Path) -> usize {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.flatten().filter(|e| e.path().is_dir()).map(|e| 1 + count_dirs(&e.path())).sum()
}

impl Default for TestEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        // Guards, not hope: whatever the test did, take down what it made.
        // runsc's state holds PIDs of the sandbox's own PID namespace, so it
        // is never asked to delete from here: the processes this test
        // started (found by their command line naming its runtime
        // directory) are killed by host PID, and the state removed with the
        // directory.
        let needle = self.runtime_dir.to_string_lossy().into_owned();
        for p in processes_mentioning(&needle) {
            if let Some(pid) = p.split(':').next().and_then(|n| n.parse::<i32>().ok()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        for id in self.domain_ids() {
            let _ = fs::remove_dir_all(self.storage.join("domains").join(&id));
            for hierarchy in fs::read_dir("/sys/fs/cgroup").map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>()).unwrap_or_default()
            {
                remove_cgroup_tree(&hierarchy.join("lazaret").join(&id));
            }
        }
        let _ = fs::remove_dir_all(&self.runtime_dir);
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

/// Removes a cgroup directory and the cgroups below it, leaf first (a
/// killed runsc leaves its containers' `lzr-*` cgroups under the Domain's in
/// every v1 hierarchy). Processes just sent SIGKILL take a moment to leave
/// their cgroup, so a busy one is retried for up to a second.
fn remove_cgroup_tree(dir: &Path) {
    let children: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| rd.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect())
        .unwrap_or_default();
    for child in &children {
        remove_cgroup_tree(child);
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    loop {
        match fs::remove_dir(dir) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => return,
        }
    }
}

/// PIDs (with command lines) of processes whose command line contains `needle`.
pub fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").map(|rd| rd.flatten().collect::<Vec<_>>()).unwrap_or_default() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(format!("{name}: {cmd}"));
            }
        }
    }
    found
}

/// Host PIDs of this env's `runsc exec` processes.
pub fn runsc_execs(env: &TestEnv) -> Vec<i32> {
    processes_mentioning(&env.runtime_dir.to_string_lossy())
        .into_iter()
        .filter(|p| p.contains(" exec ") && p.contains("--process"))
        .filter_map(|p| p.split(':').next().and_then(|n| n.parse().ok()))
        .collect()
}

/// The developer's git on the host: as [`TEST_USER`], with their home and
/// an identity for commits, in `dir`. Returns the output, whatever the
/// status.
pub fn developer_git(dir: &Path, args: &[&str]) -> Output {
    let home = nix::unistd::User::from_name(TEST_USER).ok().flatten().map(|u| u.dir).unwrap_or_else(|| PathBuf::from("/"));
    Command::new("runuser")
        .args(["-u", TEST_USER, "--", "env"])
        .arg(format!("HOME={}", home.display()))
        .args(["git", "-c", "user.name=Dev", "-c", "user.email=dev@example.invalid", "-C"])
        .arg(dir)
        .args(args)
        .output()
        .expect("running the developer's git")
}

/// Runs git in `dir` and fails the test if it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().expect("running git");
    assert!(out.status.success(), "git {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Root's git for a test's set-up (before the tree is handed to the
/// developer), with an identity and local file transport allowed.
pub fn setup_git(dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "protocol.file.allow=always"];
    all.extend_from_slice(args);
    git(dir, &all)
}

/// Writes `name` (its own name as content) in `dir` and commits it with
/// [`setup_git`].
pub fn commit_file(dir: &Path, name: &str) {
    std::fs::write(dir.join(name), name).expect("write");
    setup_git(dir, &["add", name]);
    setup_git(dir, &["commit", "-qm", name]);
}

/// [`developer_git`] that must succeed; its stdout.
pub fn dev_git_ok(dir: &Path, args: &[&str]) -> String {
    let out = developer_git(dir, args);
    assert!(out.status.success(), "developer's git {args:?} in {} failed: {}", dir.display(), text(&out.stderr));
    text(&out.stdout)
}

/// Waits for a child with [`COMMAND_LIMIT`], killing it (by its PID) if it
/// runs over, and collects its output.
pub fn wait_output(mut child: Child) -> Output {
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_end(&mut buf);
        }
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_end(&mut buf);
        }
        buf
    });
    let status = wait_with_limit(&mut child);
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Output { status, stdout, stderr }
}

/// Waits for `child` up to [`COMMAND_LIMIT`]; kills it by PID and fails the
/// test if it takes longer.
pub fn wait_with_limit(child: &mut Child) -> ExitStatus {
    let deadline = Instant::now() + COMMAND_LIMIT;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for lazaret") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lazaret (pid {}) did not finish within {COMMAND_LIMIT:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Text of an output stream, for assertions and failure messages.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The stdout of a command that must have exited 0 (its status and both
/// streams in the failure message).
pub fn ok(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(0), "status {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// Writes `data` to a writer and flushes, failing the test on error.
pub fn send(w: &mut impl Write, data: &[u8]) {
    w.write_all(data).and_then(|_| w.flush()).expect("writing to lazaret");
}

/// A `lazaret` invocation with piped stdio, its stdout read line by line
/// (a session a test talks to while it runs).
pub struct PipedSession {
    /// The `lazaret` process.
    pub child: Child,
    /// Its stdout, as lines.
    pub lines: std::io::Lines<BufReader<ChildStdout>>,
}

impl PipedSession {
    /// `lazaret ARGS` in `env`.
    pub fn start(env: &TestEnv, args: &[&str]) -> PipedSession {
        let mut child =
            env.lazaret(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn lazaret");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        PipedSession { child, lines }
    }

    /// `lazaret run test -- sh -c SCRIPT` in `env`.
    pub fn script(env: &TestEnv, script: &str) -> PipedSession {
        PipedSession::start(env, &["run", "test", "--", "sh", "-c", script])
    }

    /// The next line of stdout (empty at its end).
    pub fn next_line(&mut self) -> String {
        self.lines.next().and_then(Result::ok).unwrap_or_default()
    }

    /// Writes `data` to the session's stdin.
    pub fn send(&mut self, data: &[u8]) {
        send(self.child.stdin.as_mut().expect("stdin"), data);
    }

    /// Closes stdin, reads the rest of stdout and stderr, and waits (within
    /// [`wait_with_limit`]'s limit): the exit code, the remaining lines and
    /// stderr.
    pub fn finish(mut self) -> (Option<i32>, Vec<String>, String) {
        self.finish_in_place()
    }

    /// Reads the next line of stdout; when it is not `want`, finishes the
    /// session and panics with `what`, its exit code and its stderr (a
    /// session that ended early says why).
    pub fn expect_line(&mut self, want: &str, what: &str) {
        let line = self.next_line();
        if line != want {
            let (status, rest, err) = self.finish_in_place();
            panic!("{what}: read {line:?}, not {want:?}; exit code {status:?}; the rest of stdout {rest:?}; stderr:\n{err}");
        }
    }

    fn finish_in_place(&mut self) -> (Option<i32>, Vec<String>, String) {
        drop(self.child.stdin.take());
        let mut err = String::new();
        let Some(mut stderr) = self.child.stderr.take() else {
            return (wait_with_limit(&mut self.child).code(), Vec::new(), "(already read)".to_string());
        };
        let reader = std::thread::spawn(move || {
            let _ = stderr.read_to_string(&mut err);
            err
        });
        let rest: Vec<String> = self.lines.by_ref().map_while(Result::ok).collect();
        let status = wait_with_limit(&mut self.child);
        (status.code(), rest, reader.join().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::with_runsc_keys;

    #[test]
    fn runsc_keys_join_an_existing_runsc_table_or_start_one() {
        assert_eq!(with_runsc_keys("a = 1\n", "path = \"x\"\n"), "a = 1\n\n[runsc]\npath = \"x\"\n");
        let config = "a = 1\n[runsc]\nplatform = \"ptrace\"\n\n[profiles.test]\nb = 2\n";
        assert_eq!(
            with_runsc_keys(config, "path = \"x\"\n"),
            "a = 1\n[runsc]\npath = \"x\"\nplatform = \"ptrace\"\n\n[profiles.test]\nb = 2\n"
        );
        assert_eq!(with_runsc_keys("[runsc]", "path = \"x\"\n"), "[runsc]\npath = \"x\"\n");
    }
}
