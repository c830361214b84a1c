//! Provisioning: a profile's `setup` steps, run as root inside gVisor before
//! the Domain's agent sandbox exists, with their results kept in the State
//! Anchor.
//!
//! When: the [`super::stages::Stage::Provision`] stage, after the sidecar
//! (the steps get the profile's egress policy and DNS) and before the
//! agent's sandbox is created, so no session can start before setup ended
//! (the Domain's socket is published later still; a second terminal waits
//! for it, longer while [`crate::layout::DomainDir::setup_marker`] exists).
//!
//! Where: a sandbox of its own (container `<container>-setup`) over the
//! same rootfs overlay and the same State Anchor overlays as the agent's,
//! in the Domain's sandbox network namespace, as uid 0 with the default
//! root capabilities. It has **no workspace, no volumes, no home and no
//! `env` of the profile**: the steps run code from the internet as root,
//! and a root process could leave setuid-root files in a host directory
//! bound into it (see the README's root-agent risk), or read secrets. What
//! it writes outside `persistent_dirs` is lost with it (rootfs writes stay
//! in the sandbox's memory), so `setup` requires `persistent_dirs`.
//!
//! Whether: the steps run when the [`fingerprint`] of (steps, image digest,
//! persistent dirs) differs from the one recorded after the last complete
//! run ([`RECORD_FILE`] in the State Anchor's directory of the Domain Root,
//! so `--reset-anchor` forgets it with the layers it describes), or with
//! `--reprovision`; never with `--no-setup`. The record is removed before
//! the first step and written only after the last one succeeded: a failed
//! or interrupted setup runs again at the next start.
//!
//! Progress goes to the launching terminal as status-pipe lines
//! ([`Progress`]), made inert (setup output comes from the network); the
//! whole output also goes to the Domain's log. A failing step fails the
//! start ([`SetupError`]: its number, argv, status and last
//! [`TAIL_LINES`] lines).

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lazaret_oci::ImageRecord;
use lazaret_oci::bundle::{BindMount, BundleSpec, CapabilityPolicy};
use lazaret_protocol::display::inert;
use lazaret_protocol::shell::quote_argv;
use lazaret_runtime::Runsc;
use sha2::{Digest, Sha256};

use crate::context::Context;
use crate::layout::{DomainDir, RunDir};
use crate::startup::{Progress, SetupMode};

use super::{StartError, log};

/// The record of the last complete setup, in `DOMAIN_ROOT/anchor/`. The `%`
/// keeps it apart from the persistent directories' layers there: their
/// names are escaped paths, in which `%` is always followed by two hex
/// digits (`lazaret_mounts::anchor::escape_path`).
pub const RECORD_FILE: &str = "%setup.json";
/// Version tag hashed into every setup fingerprint.
const FINGERPRINT_FORMAT: &str = "lazaret-setup-fingerprint-v1";
/// How long one step may run before it is killed and setup fails.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(3600);
/// Lines of a failed step's output quoted in the error.
pub const TAIL_LINES: usize = 20;
/// Longest output line passed on (longer ones are cut, marked).
const LINE_LIMIT: usize = 1000;
/// How long output is still collected after a step exited (a background
/// process it left may hold the pipe open for good).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(300);

/// What provisioning does at this start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// The profile has no `setup`.
    NoSteps,
    /// `--no-setup`, and the recorded setup is not the current one.
    Skipped,
    /// The recorded setup is the current one.
    UpToDate,
    /// Run every step, because of this.
    Run(RunReason),
}

/// Why the steps run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunReason {
    /// Nothing is recorded: the first start, or the last setup did not finish.
    NotDone,
    /// The steps, the image or the persistent directories changed.
    Changed,
    /// `--reprovision`.
    Requested,
}

impl std::fmt::Display for RunReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RunReason::NotDone => "not done yet",
            RunReason::Changed => "the steps, the image or persistent_dirs changed",
            RunReason::Requested => "--reprovision",
        })
    }
}

/// Decides what provisioning does: `recorded` is the fingerprint of the last
/// complete setup (if any), `current` this configuration's.
pub fn plan(mode: SetupMode, has_steps: bool, recorded: Option<&str>, current: &str) -> Plan {
    if !has_steps {
        return Plan::NoSteps;
    }
    let up_to_date = recorded == Some(current);
    match mode {
        SetupMode::Skip if up_to_date => Plan::UpToDate,
        SetupMode::Skip => Plan::Skipped,
        SetupMode::Rerun => Plan::Run(RunReason::Requested),
        SetupMode::Normal if up_to_date => Plan::UpToDate,
        SetupMode::Normal if recorded.is_none() => Plan::Run(RunReason::NotDone),
        SetupMode::Normal => Plan::Run(RunReason::Changed),
    }
}

/// The setup fingerprint: SHA-256 over the steps (in order), the image's
/// digest (a new image may need the packages again) and the persistent
/// directories (a change may drop what was installed), as lowercase hex.
pub fn fingerprint(steps: &[Vec<String>], image_digest: &str, persistent_dirs: &[PathBuf]) -> String {
    let mut dirs: Vec<&PathBuf> = persistent_dirs.iter().collect();
    dirs.sort();
    let canonical = serde_json::json!({
        "format": FINGERPRINT_FORMAT,
        "image": image_digest,
        "persistent_dirs": dirs,
        "steps": steps,
    });
    hex::encode(Sha256::digest(canonical.to_string().as_bytes()))
}

/// Where the record of the last complete setup of a Domain is.
pub fn record_path(domain_root: &Path) -> PathBuf {
    domain_root.join("anchor").join(RECORD_FILE)
}

/// The record's content.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    fingerprint: String,
    steps: usize,
    completed_ms: u128,
}

/// The fingerprint of the last complete setup, if one is recorded (an
/// unreadable record counts as none: setup runs again).
pub fn recorded(domain_root: &Path) -> Option<String> {
    let text = std::fs::read_to_string(record_path(domain_root)).ok()?;
    serde_json::from_str::<Record>(&text).ok().map(|r| r.fingerprint)
}

/// Forgets the record (before the first step runs).
pub fn forget(domain_root: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(record_path(domain_root)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Records a complete setup, durably (written aside, synced, renamed).
pub fn write_record(domain_root: &Path, fingerprint: &str, steps: usize) -> std::io::Result<()> {
    let path = record_path(domain_root);
    let dir = path.parent().unwrap_or(domain_root);
    std::fs::create_dir_all(dir)?;
    let record = Record { fingerprint: fingerprint.to_string(), steps, completed_ms: crate::journal::now_ms() };
    let text = serde_json::to_string(&record).map_err(std::io::Error::other)?;
    let tmp = dir.join(format!("{RECORD_FILE}.tmp"));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// The last lines of a step's output.
#[derive(Debug, Default)]
pub struct Tail {
    lines: VecDeque<String>,
}

impl Tail {
    /// Keeps `line`, dropping the oldest beyond [`TAIL_LINES`].
    pub fn push(&mut self, line: String) {
        if self.lines.len() == TAIL_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
    }

    /// The kept lines, oldest first.
    pub fn lines(&self) -> Vec<String> {
        self.lines.iter().cloned().collect()
    }
}

/// Splits `bytes` (appended to `pending`) into complete lines, each made
/// inert and cut at [`LINE_LIMIT`]; a `\r` inside a line (progress bars)
/// keeps what follows it. With `all`, an unterminated rest counts too.
pub fn split_lines(pending: &mut Vec<u8>, bytes: &[u8], all: bool) -> Vec<String> {
    pending.extend_from_slice(bytes);
    let mut out = Vec::new();
    let mut take = |raw: &[u8]| {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let shown = match raw.iter().rposition(|b| *b == b'\r') {
            Some(i) => &raw[i + 1..],
            None => raw,
        };
        out.push(inert(&String::from_utf8_lossy(shown), LINE_LIMIT));
    };
    while let Some(i) = pending.iter().position(|b| *b == b'\n') {
        let line: Vec<u8> = pending.drain(..=i).collect();
        take(&line[..line.len() - 1]);
    }
    if all && !pending.is_empty() {
        let rest = std::mem::take(pending);
        take(&rest);
    }
    out
}

/// Why the setup failed.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A step exited unsuccessfully (or could not start, or timed out).
    #[error("setup step {number}/{total} of profile {profile:?} failed ({how}): {command}{}\n  hint: fix the step ({origin}) and run again, or start the Domain without setup for a fix-up shell: `lazaret run {profile} --no-setup -- /bin/sh`; the whole output is in {log}", tail_text(.tail))]
    Step {
        /// The profile.
        profile: String,
        /// Where the profile is written.
        origin: String,
        /// 1-based.
        number: usize,
        /// How many steps.
        total: usize,
        /// The step's argv, shell-quoted and inert.
        command: String,
        /// "exit status 100", "timed out after 3600 s", "not found: ...".
        how: String,
        /// Its last lines of output (inert).
        tail: Vec<String>,
        /// The Domain's log.
        log: PathBuf,
    },
}

fn tail_text(tail: &[String]) -> String {
    if tail.is_empty() {
        return "\n  (it printed nothing)".to_string();
    }
    let mut text = format!("\n  its last {} line(s) of output:", tail.len());
    for line in tail {
        text.push_str("\n  | ");
        text.push_str(line);
    }
    text
}

/// What the setup sandbox is made of.
pub(super) struct SetupSandbox<'a> {
    /// The Domain.
    pub ctx: &'a Context,
    /// The Domain's runtime directory.
    pub dir: &'a DomainDir,
    /// runsc with the Domain's flags.
    pub runsc: &'a Runsc,
    /// The image (its environment).
    pub image: &'a ImageRecord,
    /// The init process's bundle (the agent sandbox's base).
    pub base: &'a BundleSpec,
    /// The run directory (rootfs overlay, bundle).
    pub run: &'a RunDir,
    /// The State Anchor binds only.
    pub anchor_binds: Vec<BindMount>,
    /// The sidecar network.
    pub network: &'a lazaret_netpolicy::topology::DomainNetwork,
    /// The setup sandbox's container ID.
    pub container: String,
    /// Its cgroups path.
    pub cgroups_path: String,
}

/// Runs the profile's setup if [`plan`] says so. `say` writes a line to the
/// launching terminal's status pipe.
pub(super) fn provision(
    sandbox: &SetupSandbox<'_>,
    mode: SetupMode,
    reset_anchor: bool,
    say: &mut dyn FnMut(&str),
) -> Result<(), StartError> {
    let ctx = sandbox.ctx;
    let steps = &ctx.profile.setup;
    let domain_root = ctx.paths.domain_root(&ctx.domain_id);
    let current = fingerprint(steps, &sandbox.image.digest, &ctx.profile.persistent_dirs);
    // --reset-anchor removed the record with the layers already; belt and braces.
    let recorded = if reset_anchor { None } else { recorded(&domain_root) };
    match plan(mode, !steps.is_empty(), recorded.as_deref(), &current) {
        Plan::NoSteps => return Ok(()),
        Plan::UpToDate => {
            log(&format!("setup: up to date ({} step(s), fingerprint {current})", steps.len()));
            return Ok(());
        }
        Plan::Skipped => {
            log("setup: skipped (--no-setup)");
            say(&format!(
                "lazaret: note: setup of profile {} skipped (--no-setup); the next start without --no-setup runs it",
                ctx.profile.name
            ));
            return Ok(());
        }
        Plan::Run(reason) => log(&format!("setup: running {} step(s) ({reason})", steps.len())),
    }
    forget(&domain_root).map_err(StartError::io("removing the setup record"))?;
    let marker = Marker::create(sandbox.dir.setup_marker());
    let started = Instant::now();
    let result = with_setup_sandbox(sandbox, |spec| {
        for (index, argv) in steps.iter().enumerate() {
            run_step(sandbox, spec, index, argv, &marker, say)?;
        }
        Ok(())
    });
    drop(marker);
    result?;
    write_record(&domain_root, &current, steps.len()).map_err(StartError::io("recording the completed setup"))?;
    let done = format!("{}: {} step(s) in {:.1}s", crate::startup::DONE_PREFIX, steps.len(), started.elapsed().as_secs_f64());
    log(&done);
    say(&Progress::Done(done).line());
    Ok(())
}

/// The marker waiting clients look for; removed on drop.
struct Marker(PathBuf);

impl Marker {
    fn create(path: PathBuf) -> Marker {
        if let Err(e) = std::fs::write(&path, "starting\n") {
            log(&format!("setup: cannot write {}: {e}", path.display()));
        }
        Marker(path)
    }

    fn step(&self, text: &str) {
        let _ = std::fs::write(&self.0, format!("{text}\n"));
    }
}

impl Drop for Marker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The setup sandbox's environment: the image's, then root's identity and
/// non-interactive package managers. Nothing of the profile's `env`.
fn setup_env(image: &ImageRecord, profile: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| {
        env.retain(|(key, _)| key != k);
        env.push((k.to_string(), v.to_string()));
    };
    for kv in &image.config.env {
        if let Some((k, v)) = kv.split_once('=') {
            set(k, v);
        }
    }
    if !image.config.env.iter().any(|kv| kv.starts_with("PATH=")) {
        set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    }
    for (k, v) in [
        ("HOME", "/root"),
        ("USER", "root"),
        ("LOGNAME", "root"),
        ("DEBIAN_FRONTEND", "noninteractive"),
        ("LAZARET_PROFILE", profile),
        ("LAZARET_SETUP", "1"),
    ] {
        set(k, v);
    }
    env
}

/// Creates and starts the setup sandbox, runs `body` with its process
/// spec, and deletes the sandbox whatever happened.
fn with_setup_sandbox(sandbox: &SetupSandbox<'_>, body: impl FnOnce(&BundleSpec) -> Result<(), StartError>) -> Result<(), StartError> {
    let run = sandbox.run;
    let resolv_conf = run.resolv_conf();
    std::fs::write(&resolv_conf, lazaret_netpolicy::sandbox_resolv_conf(&sandbox.network.sandbox_resolvers()))
        .map_err(StartError::io("writing the sandbox's resolv.conf"))?;
    let mut spec = sandbox.base.clone();
    spec.uid = 0;
    spec.gid = 0;
    spec.additional_gids = Vec::new();
    spec.capabilities = CapabilityPolicy::DefaultRoot;
    spec.cwd = PathBuf::from("/");
    spec.env = setup_env(sandbox.image, &sandbox.ctx.profile.name);
    spec.terminal = false;
    spec.rootfs = run.rootfs();
    spec.cgroups_path = sandbox.cgroups_path.clone();
    spec.network_namespace = sandbox.network.sandbox_netns().map(|n| n.proc_path());
    spec.mounts = sandbox.anchor_binds.clone();
    spec.mounts.push(BindMount { source: resolv_conf, destination: "/etc/resolv.conf".into(), readonly: true });
    let bundle = run.setup_bundle();
    lazaret_oci::bundle::write_bundle(&bundle, &spec)?;
    let delete = || {
        let _ = sandbox.runsc.kill(&sandbox.container, libc::SIGKILL, true);
        if let Err(e) = sandbox.runsc.delete(&sandbox.container) {
            log(&format!("setup: deleting the setup sandbox: {e}"));
        }
        crate::cgroup::remove(&sandbox.cgroups_path);
    };
    if let Err(e) = sandbox.runsc.create(&sandbox.container, &bundle, &run.setup_sandbox_pid()) {
        delete();
        return Err(e.into());
    }
    let result = (|| {
        sandbox.network.readdress_sandbox().map_err(crate::network::NetworkError::from)?;
        sandbox.network.verify_installed().map_err(crate::network::NetworkError::from)?;
        let workaround = sandbox.runsc.info().needs_netns_workaround(lazaret_runtime::runsc::kernel_major());
        sandbox.runsc.start(&sandbox.container, workaround)?;
        body(&spec)
    })();
    delete();
    result
}

/// Runs one step to its end, relaying its output; a failure is the step's
/// [`SetupError`].
fn run_step(
    sandbox: &SetupSandbox<'_>,
    base: &BundleSpec,
    index: usize,
    argv: &[String],
    marker: &Marker,
    say: &mut dyn FnMut(&str),
) -> Result<(), StartError> {
    let ctx = sandbox.ctx;
    let total = ctx.profile.setup.len();
    let number = index + 1;
    let command = inert(&quote_argv(argv), 400);
    let header = format!("{number}/{total}: {command}");
    log(&format!("setup: step {header}"));
    marker.step(&header);
    say(&Progress::Step(header).line());
    let mut spec = base.clone();
    spec.args = argv.to_vec();
    let process = lazaret_oci::bundle::render_process(&lazaret_oci::bundle::build_process(&spec)?)?;
    let (read_end, write_end) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(StartError::errno("creating the setup output pipe"))?;
    let null: OwnedFd = std::fs::File::open("/dev/null").map_err(StartError::io("opening /dev/null"))?.into();
    let err_end = write_end.try_clone().map_err(StartError::io("duplicating the setup output pipe"))?;
    let pid_file = sandbox.run.setup_step_pid();
    let _ = std::fs::remove_file(&pid_file);
    let mut child = sandbox.runsc.exec(&sandbox.container, process.as_bytes(), &pid_file, [null, write_end, err_end], Vec::new(), false)?;
    // The reader ends when every write end is closed, which a process the
    // step left behind may delay until the sandbox is deleted.
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut pipe = std::fs::File::from(read_end);
        let mut buf = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + STEP_TIMEOUT;
    let mut tail = Tail::default();
    let mut pending = Vec::new();
    let mut timed_out = false;
    let mut exited: Option<(std::process::ExitStatus, Instant)> = None;
    let mut relay = |bytes: &[u8], all: bool, tail: &mut Tail, pending: &mut Vec<u8>| {
        for line in split_lines(pending, bytes, all) {
            log(&format!("setup {number}/{total}| {line}"));
            say(&Progress::Output(line.clone()).line());
            tail.push(line);
        }
    };
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(bytes) => relay(&bytes, false, &mut tail, &mut pending),
            Err(mpsc::RecvTimeoutError::Disconnected) if exited.is_some() => break,
            Err(_) => {}
        }
        match exited {
            Some((_, at)) if at.elapsed() >= DRAIN_AFTER_EXIT => break,
            Some(_) => continue,
            None => {}
        }
        if let Some(status) = child.try_wait().map_err(StartError::io("waiting for a setup step"))? {
            exited = Some((status, Instant::now()));
        } else if !timed_out && Instant::now() >= deadline {
            timed_out = true;
            log(&format!("setup: step {number}/{total} timed out; killing it"));
            let _ = sandbox.runsc.kill(&sandbox.container, libc::SIGKILL, true);
        }
    }
    relay(&[], true, &mut tail, &mut pending);
    let status = exited.map(|(s, _)| s);
    let code = status.and_then(|s| {
        use std::os::unix::process::ExitStatusExt;
        s.code().or_else(|| s.signal().map(|n| 128 + n))
    });
    let failure = code.and_then(|c| lazaret_runtime::execfail::classify_exec(c, &pid_file));
    let _ = std::fs::remove_file(lazaret_runtime::execfail::exec_log_path(&pid_file));
    let how = match (timed_out, code, failure) {
        (true, _, _) => format!("timed out after {} s", STEP_TIMEOUT.as_secs()),
        (false, _, Some(f)) => format!("runsc could not start it: {}", inert(f.message(), 300)),
        (false, Some(0), None) => {
            log(&format!("setup: step {number}/{total} done"));
            return Ok(());
        }
        (false, Some(c), None) => format!("exit status {c}"),
        (false, None, None) => "its status is unknown".to_string(),
    };
    log(&format!("setup: step {number}/{total} failed: {how}"));
    Err(SetupError::Step {
        profile: ctx.profile.name.clone(),
        origin: ctx.profile.origin.clone(),
        number,
        total,
        command,
        how,
        tail: tail.lines(),
        log: sandbox.dir.log(),
    }
    .into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(list: &[&[&str]]) -> Vec<Vec<String>> {
        list.iter().map(|s| s.iter().map(|a| a.to_string()).collect()).collect()
    }

    #[test]
    fn the_fingerprint_follows_steps_their_order_image_and_persistent_dirs() {
        let a = steps(&[&["apt-get", "update"], &["npm", "install", "-g", "x"]]);
        let dirs = [PathBuf::from("/usr"), PathBuf::from("/var")];
        let base = fingerprint(&a, "sha256:1", &dirs);
        assert_eq!(base.len(), 64);
        assert_eq!(base, fingerprint(&a, "sha256:1", &[PathBuf::from("/var"), PathBuf::from("/usr")]), "persistent_dirs are a set");
        let reordered = steps(&[&["npm", "install", "-g", "x"], &["apt-get", "update"]]);
        assert_ne!(base, fingerprint(&reordered, "sha256:1", &dirs), "step order matters");
        let joined = steps(&[&["apt-get", "update", "npm"], &["install", "-g", "x"]]);
        assert_ne!(base, fingerprint(&joined, "sha256:1", &dirs), "argv boundaries matter");
        assert_ne!(base, fingerprint(&a, "sha256:2", &dirs), "a new image reruns setup");
        assert_ne!(base, fingerprint(&a, "sha256:1", &dirs[..1]), "fewer persistent dirs rerun setup");
    }

    #[test]
    fn the_plan_runs_first_on_change_and_on_request_and_never_with_no_setup() {
        use SetupMode::*;
        assert_eq!(plan(Normal, false, None, "f"), Plan::NoSteps);
        assert_eq!(plan(Rerun, false, Some("f"), "f"), Plan::NoSteps);
        assert_eq!(plan(Normal, true, None, "f"), Plan::Run(RunReason::NotDone));
        assert_eq!(plan(Normal, true, Some("f"), "f"), Plan::UpToDate);
        assert_eq!(plan(Normal, true, Some("old"), "f"), Plan::Run(RunReason::Changed));
        assert_eq!(plan(Rerun, true, Some("f"), "f"), Plan::Run(RunReason::Requested));
        assert_eq!(plan(Skip, true, None, "f"), Plan::Skipped);
        assert_eq!(plan(Skip, true, Some("f"), "f"), Plan::UpToDate);
    }

    #[test]
    fn the_record_is_written_whole_read_back_and_forgotten() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(recorded(dir.path()), None);
        write_record(dir.path(), "abc", 2).expect("write");
        assert_eq!(recorded(dir.path()).as_deref(), Some("abc"));
        assert!(record_path(dir.path()).starts_with(dir.path().join("anchor")));
        std::fs::write(record_path(dir.path()), "{not json").expect("corrupt");
        assert_eq!(recorded(dir.path()), None, "an unreadable record means setup runs again");
        forget(dir.path()).expect("forget");
        forget(dir.path()).expect("forgetting nothing is fine");
        assert!(!record_path(dir.path()).exists());
        // A persistent directory's layer name can never be the record's.
        for p in ["/%setup.json", "/setup.json", "/%"] {
            assert_ne!(lazaret_mounts::anchor::escape_path(Path::new(p)), RECORD_FILE, "{p}");
        }
    }

    #[test]
    fn progress_lines_round_trip() {
        for p in [
            Progress::Step("1/2: apt-get update".into()),
            Progress::Output("Reading package lists...".into()),
            Progress::Done("lazaret: setup: done: 2 step(s) in 1.0s".into()),
        ] {
            assert_eq!(Progress::parse(&p.line()), Some(p.clone()));
        }
        assert_eq!(Progress::parse("lazaret: warning: x"), None);
    }

    #[test]
    fn output_lines_are_split_made_inert_and_progress_bars_keep_their_last_state() {
        let mut pending = Vec::new();
        assert_eq!(split_lines(&mut pending, b"one\ntw", false), ["one"]);
        assert_eq!(split_lines(&mut pending, b"o\r\n10%\r50%\r100%\n\x1b[31mred\x1b[0m\n", false), ["two", "100%", "\\x1b[31mred\\x1b[0m"]);
        assert_eq!(split_lines(&mut pending, b"last", false), Vec::<String>::new());
        assert_eq!(split_lines(&mut pending, b"", true), ["last"]);
        let long = vec![b'x'; 5000];
        let cut = split_lines(&mut pending, &long, true);
        assert!(cut[0].len() <= LINE_LIMIT, "{}", cut[0].len());
    }

    #[test]
    fn the_tail_keeps_the_last_lines_and_the_error_names_the_step() {
        let mut tail = Tail::default();
        for i in 0..30 {
            tail.push(format!("line {i}"));
        }
        let lines = tail.lines();
        assert_eq!(lines.len(), TAIL_LINES);
        assert_eq!(lines[0], "line 10");
        let e = SetupError::Step {
            profile: "claude".into(),
            origin: "/c.toml:3:1".into(),
            number: 2,
            total: 3,
            command: "npm install -g x".into(),
            how: "exit status 1".into(),
            tail: lines,
            log: PathBuf::from("/run/x/coordinator.log"),
        };
        let text = e.to_string();
        assert!(text.starts_with("setup step 2/3 of profile \"claude\" failed (exit status 1): npm install -g x\n"), "{text}");
        assert!(text.contains("\n  | line 29\n"), "{text}");
        assert!(text.contains("lazaret run claude --no-setup"), "{text}");
        assert!(text.contains("/c.toml:3:1"), "{text}");
    }

    #[test]
    fn setup_gets_roots_identity_and_none_of_the_profiles_env() {
        let image = ImageRecord {
            name: "i".into(),
            digest: "sha256:00".into(),
            rootfs: PathBuf::from("/nonexistent"),
            size: 0,
            created: String::new(),
            config: lazaret_oci::ImageConfig { env: vec!["HOME=/nowhere".into(), "LANG=C.UTF-8".into()], ..Default::default() },
            source_kind: lazaret_oci::SourceKind::RootfsDir,
            diff_ids: Vec::new(),
            blobs: Vec::new(),
        };
        let env = setup_env(&image, "claude");
        let get = |k: &str| env.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str());
        assert_eq!((get("HOME"), get("USER"), get("LANG")), (Some("/root"), Some("root"), Some("C.UTF-8")));
        assert_eq!(get("DEBIAN_FRONTEND"), Some("noninteractive"));
        assert!(get("PATH").is_some_and(|p| p.contains("/usr/local/bin")));
        assert_eq!(env.iter().filter(|(k, _)| k == "HOME").count(), 1);
    }
}
