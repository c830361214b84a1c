//! What a fanotify permission gate would cost the host's own processes:
//! the measurement behind issue 30 ("the Workspace Guard as a gate"). This
//! is not the gate (the product's guard still acts after a write, see
//! docs/workspace-guard.md); it is the mechanism the gate would rest on,
//! with a decision as cheap as the real one would be, so that its price is
//! known before it is built.
//!
//! The mechanism: a `FAN_CLASS_CONTENT` group with a *mount* mark for
//! `FAN_OPEN_PERM | FAN_OPEN_EXEC_PERM` on the host mount that holds the
//! workspace (a mount mark because a repository the agent creates, by
//! `mkdir` or by renaming a prepared directory, must be covered the moment
//! it exists; per-directory marks would be added only after the fact). Every
//! open through that mount then waits until the gate thread has answered.
//! The gate thread reads the opened file's path and `fstat`s it (what a
//! real decision needs: its place, and (dev, ino, ctime) to compare with
//! what the guard decided) and allows it. Opens outside the roots can be
//! taken off the gate's path with lazy ignore marks: the first open in a
//! directory outside the roots adds an ignore mark (`FAN_MARK_IGNORE`,
//! `FAN_EVENT_ON_CHILD`, Linux >= 6.0) on that directory, so its other
//! files never wake the gate again. Inside the roots nothing can be
//! ignored: the agent can rename any directory into a `.git`.
//!
//! The bench makes everything in a private mount namespace: a bind mount
//! of a scratch directory under the current directory (`gate-bench.*`,
//! removed afterwards) stands in for the host mount, so only the processes
//! this bench starts, through that bind, are gated; nothing else on the
//! machine is. It holds a git repository of FILES files (directories of
//! 200; the workspace) and as many files outside it (the rest of the host
//! mount). Workloads, each run with no gate and with the gate, alternating,
//! ROUNDS times: the developer's `git status` in the workspace, `grep -r`
//! over every workspace file (a build or an indexer: the worst case, one
//! wait per file), and `grep -r` outside the workspace without and with
//! ignore marks (first pass, which adds them, and a second pass).
//!
//! Run as root (fanotify permission events need CAP_SYS_ADMIN):
//! `cargo run --release -p lazaret-mounts --example gate_bench -- [FILES] [ROUNDS]`
//! (`scripts/bench.sh gate`).

#![forbid(unsafe_code)]

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Instant;

use lazaret_mounts::sys;

type Error = Box<dyn std::error::Error>;

const PERM_EVENTS: u64 = libc::FAN_OPEN_PERM | libc::FAN_OPEN_EXEC_PERM;
/// `struct fanotify_event_metadata`: event_len u32, vers u8, reserved u8,
/// metadata_len u16, mask u64, fd i32, pid i32.
const METADATA_LEN: usize = 24;
const GATE_THREAD: &str = "gate";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// CPU time (ns) of this process's thread named `name` (from schedstat).
fn thread_cpu_ns(name: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            return stat.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0);
        }
    }
    0
}

/// What the gate saw, for the table.
#[derive(Default)]
struct Counters {
    events: AtomicU64,
}

/// A running gate: its group, and the thread that answers every
/// permission event.
struct Gate {
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl Gate {
    /// Marks the mount at `mount` and starts answering. With
    /// `ignore_outside`, directories outside `roots` get lazy ignore marks.
    fn start(mount: &Path, roots: Vec<PathBuf>, ignore_outside: bool, slash: Arc<OwnedFd>) -> Result<Gate, Error> {
        let group = sys::fanotify_init(
            libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
            (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as libc::c_uint,
        )?;
        sys::fanotify_mark(group.as_fd(), libc::FAN_MARK_ADD | libc::FAN_MARK_MOUNT, PERM_EVENTS, slash.as_fd(), Some(&relative(mount)?))?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let (s, c) = (stop.clone(), counters.clone());
        let thread = std::thread::Builder::new()
            .name(GATE_THREAD.into())
            .spawn(move || answer(&group, &roots, ignore_outside.then_some(&*slash), &s, &c))?;
        Ok(Gate { stop, counters, thread: Some(thread) })
    }

    fn events(&self) -> u64 {
        self.counters.events.load(Ordering::Relaxed)
    }

    fn stop(mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(Ok(()))) | None => Ok(()),
            Some(Ok(Err(e))) => Err(e.into()),
            Some(Err(_)) => Err("the gate thread panicked".into()),
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `path` without its leading `/`, for a lookup relative to an fd of `/`
/// (a lookup opens nothing, so the gate never waits on itself).
fn relative(path: &Path) -> Result<CString, Error> {
    let bytes = path.as_os_str().as_bytes();
    let rel = bytes.strip_prefix(b"/").ok_or("an absolute path is needed")?;
    Ok(CString::new(if rel.is_empty() { b".".as_slice() } else { rel })?)
}

/// The gate thread: answers every permission event until told to stop.
/// It never opens a file on the gated mount (that would wait on itself).
fn answer(group: &OwnedFd, roots: &[PathBuf], ignore_with: Option<&OwnedFd>, stop: &AtomicBool, counters: &Counters) -> Result<(), String> {
    let mut buffer = vec![0u8; 64 * 1024];
    let mut fds = [nix::poll::PollFd::new(group.as_fd(), nix::poll::PollFlags::POLLIN)];
    while !stop.load(Ordering::Relaxed) {
        match nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(20u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(format!("poll: {e}")),
        }
        let n = match nix::unistd::read(group.as_fd(), &mut buffer) {
            Ok(n) => n,
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("reading events: {e}")),
        };
        let mut at = 0;
        while at + METADATA_LEN <= n {
            let field = |o: usize, w: usize| &buffer[at + o..at + o + w];
            let event_len = u32::from_ne_bytes(field(0, 4).try_into().map_err(|_| "short event")?) as usize;
            let fd = i32::from_ne_bytes(field(16, 4).try_into().map_err(|_| "short event")?);
            if event_len < METADATA_LEN {
                return Err(format!("bad event length {event_len}"));
            }
            at += event_len;
            if fd < 0 {
                continue; // FAN_NOFD: a queue overflow (no permission event is ever dropped)
            }
            counters.events.fetch_add(1, Ordering::Relaxed);
            let decided = decide(group, fd, roots, ignore_with);
            let mut response = [0u8; 8];
            response[..4].copy_from_slice(&fd.to_ne_bytes());
            response[4..].copy_from_slice(&libc::FAN_ALLOW.to_ne_bytes());
            let written = nix::unistd::write(group.as_fd(), &response);
            sys::close_raw_fd(fd);
            written.map_err(|e| format!("answering: {e}"))?;
            decided?;
        }
    }
    Ok(())
}

/// As much work as the real decision: where the file is, and its identity.
/// An ignore mark that cannot be added is an error: the second pass's
/// figure would not mean what its row says.
fn decide(group: &OwnedFd, fd: i32, roots: &[PathBuf], ignore_with: Option<&OwnedFd>) -> Result<(), String> {
    let path = std::fs::read_link(format!("/proc/self/fd/{fd}")).map_err(|e| format!("the path of an opened file: {e}"))?;
    if roots.iter().any(|r| path.starts_with(r)) {
        // The real gate would compare (dev, ino, ctime) with the guard's
        // decisions for a control file.
        let identity = std::fs::metadata(format!("/proc/self/fd/{fd}")).map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()));
        return identity.map(drop).map_err(|e| format!("fstat: {e}"));
    }
    let (Some(slash), Some(parent)) = (ignore_with, path.parent()) else { return Ok(()) };
    let parent = relative(parent).map_err(|e| e.to_string())?;
    let flags = libc::FAN_MARK_ADD | libc::FAN_MARK_IGNORE_SURV;
    sys::fanotify_mark(group.as_fd(), flags, PERM_EVENTS | libc::FAN_EVENT_ON_CHILD, slash.as_fd(), Some(&parent))
        .map_err(|e| format!("ignore mark on {}: {e} (FAN_MARK_IGNORE needs Linux >= 6.0)", path.display()))
}

/// Writes `files` files in directories of 200 under `dir`.
fn tree(dir: &Path, files: usize) -> Result<(), Error> {
    for i in 0..files {
        let d = dir.join(format!("d{:03}", i / 200));
        if i % 200 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        std::fs::write(d.join(format!("f{i}.txt")), format!("line {i}\n"))?;
    }
    Ok(())
}

fn git(dir: &Path, args: &[&str]) -> Result<(), Error> {
    let ok = Command::new("git")
        .args(["-c", "user.name=bench", "-c", "user.email=bench@invalid"])
        .args(args)
        .current_dir(dir)
        .status()?
        .success();
    if ok { Ok(()) } else { Err(format!("git {args:?} failed").into()) }
}

/// Wall time of `program args` in `dir`, in ms; its output is discarded.
/// `grep` exits 1 when nothing matches, which is what is asked of it here.
fn timed(dir: &Path, program: &str, args: &[&str]) -> Result<f64, Error> {
    let t = Instant::now();
    let status = Command::new(program).args(args).current_dir(dir).stdout(Stdio::null()).status()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    match status.code() {
        Some(0 | 1) => Ok(ms),
        _ => Err(format!("{program} {args:?} in {}: {status}", dir.display()).into()),
    }
}

#[derive(Clone, Copy)]
enum Workload {
    GitStatus,
    GrepWorkspace,
    GrepOutside,
}

const WORKLOADS: [(Workload, &str); 3] = [
    (Workload::GitStatus, "git status in the workspace"),
    (Workload::GrepWorkspace, "grep -r over every workspace file"),
    (Workload::GrepOutside, "grep -r over as many files outside it"),
];

/// One measured run: wall ms, gate events, gate thread CPU ms.
#[derive(Default, Clone, Copy)]
struct Sample {
    wall_ms: f64,
    events: f64,
    gate_cpu_ms: f64,
}

struct Lab {
    mount: PathBuf,
    ws: PathBuf,
    outside: PathBuf,
    slash: Arc<OwnedFd>,
}

impl Lab {
    fn run(&self, workload: Workload) -> Result<f64, Error> {
        match workload {
            Workload::GitStatus => timed(&self.ws, "git", &["status", "--porcelain"]),
            Workload::GrepWorkspace => timed(&self.ws, "grep", &["-r", "-q", "no such text", "."]),
            Workload::GrepOutside => timed(&self.outside, "grep", &["-r", "-q", "no such text", "."]),
        }
    }

    /// `passes` runs of `workload` under one gate (or none), each sampled.
    fn sample(&self, workload: Workload, gate: Option<bool>, passes: usize) -> Result<(Vec<Sample>, f64), Error> {
        let t = Instant::now();
        let gate = gate.map(|ignore| Gate::start(&self.mount, vec![self.ws.clone()], ignore, self.slash.clone())).transpose()?;
        let start_ms = t.elapsed().as_secs_f64() * 1e3;
        let mut samples = Vec::new();
        for _ in 0..passes {
            let (events0, cpu0) = (gate.as_ref().map_or(0, Gate::events), thread_cpu_ns(GATE_THREAD));
            let wall_ms = self.run(workload)?;
            let events = gate.as_ref().map_or(0, Gate::events) - events0;
            let gate_cpu_ms = if gate.is_some() { (thread_cpu_ns(GATE_THREAD).saturating_sub(cpu0)) as f64 / 1e6 } else { 0.0 };
            samples.push(Sample { wall_ms, events: events as f64, gate_cpu_ms });
        }
        if let Some(g) = gate {
            g.stop()?;
        }
        Ok((samples, start_ms))
    }
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let files: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(20_000);
    let rounds: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(5).max(1);
    if !nix::unistd::geteuid().is_root() {
        return Err("gate_bench needs root (fanotify permission events need CAP_SYS_ADMIN)".into());
    }
    // Before any thread: the bind below exists only in this namespace and
    // goes away with this process.
    sys::enter_private_mount_namespace()?;
    let base = tempfile::Builder::new().prefix("gate-bench.").tempdir_in(".")?;
    let mount = base.path().canonicalize()?;
    let (ws, outside) = (mount.join("ws"), mount.join("outside"));
    tree(&ws, files)?;
    tree(&outside, files)?;
    git(&ws, &["init", "-q"])?;
    git(&ws, &["add", "-A"])?;
    git(&ws, &["commit", "-q", "-m", "tree"])?;
    sys::bind_mount(&mount, &mount, false)?;
    let slash = Arc::new(OwnedFd::from(std::fs::File::open("/")?));
    let lab = Lab { mount: mount.clone(), ws, outside, slash };
    let result = measure(&lab, files, rounds);
    sys::unmount(&mount, true)?;
    result
}

fn measure(lab: &Lab, files: usize, rounds: usize) -> Result<(), Error> {
    for (w, _) in WORKLOADS {
        lab.run(w)?; // warm caches and git's index
    }
    let mut starts = Vec::new();
    println!(
        "fanotify permission gate (mount mark, FAN_OPEN_PERM|FAN_OPEN_EXEC_PERM): the host's cost; {files} files, {rounds} rounds, medians"
    );
    println!(
        "{:<44} {:>9} {:>9} {:>7} {:>9} {:>11} {:>12}",
        "host workload", "off ms", "gate ms", "ratio", "events", "gate CPU ms", "µs per event"
    );
    for (workload, label) in WORKLOADS {
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            off.push(lab.sample(workload, None, 1)?.0[0]);
            let (s, start) = lab.sample(workload, Some(false), 1)?;
            on.push(s[0]);
            starts.push(start);
        }
        row(label, &off, &on);
        if matches!(workload, Workload::GrepOutside) {
            let (mut first, mut second) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                let (s, start) = lab.sample(workload, Some(true), 2)?;
                first.push(s[0]);
                second.push(s[1]);
                starts.push(start);
            }
            row("  with ignore marks, first pass", &off, &first);
            row("  with ignore marks, second pass", &off, &second);
        }
    }
    println!("gate start (fanotify_init + mount mark + thread), median ms: {:.2}", median(starts));
    Ok(())
}

fn row(label: &str, off: &[Sample], on: &[Sample]) {
    let m = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
    let (off_ms, on_ms, events) = (m(off, |s| s.wall_ms), m(on, |s| s.wall_ms), m(on, |s| s.events));
    // With few events the difference is within the noise, either way.
    let per_event = match (events > 0.0, on_ms > off_ms) {
        (true, true) => format!("{:.1}", (on_ms - off_ms) * 1e3 / events),
        (true, false) => "noise".into(),
        (false, _) => "-".into(),
    };
    println!(
        "{:<44} {:>9.1} {:>9.1} {:>6.2}x {:>9.0} {:>11.1} {:>12}",
        label,
        off_ms,
        on_ms,
        on_ms / off_ms,
        events,
        m(on, |s| s.gate_cpu_ms),
        per_event
    );
}
