//! What the Workspace Guard's gate (issue 30, `lazaret_mounts::guard::gate`)
//! costs the host's own processes: every open through a gated mount waits
//! for the gate thread's answer.
//!
//! The bench makes everything in a private mount namespace: a bind mount
//! of a scratch directory under the current directory (`gate-bench.*`,
//! removed afterwards) stands in for the host mount, so only the processes
//! this bench starts, through that bind, are gated; nothing else on the
//! machine is. It holds a git repository of FILES files (directories of
//! 200; the workspace, the guard's root) and as many files outside it (the
//! rest of the host mount). Workloads, each run with no guard and with the
//! guard and its gate, alternating, ROUNDS times: the developer's `git
//! status` in the workspace, `grep -r` over every workspace file (a build
//! or an indexer: the worst case, one wait per file), the same over files
//! changed since the guard started, and `grep -r` outside the workspace
//! (first pass, which adds the gate's ignore marks, and a second pass).
//! Nothing is the sandbox here (the guard's pid filter accepts none), so
//! the figures are the gate's alone.
//!
//! Run as root (fanotify permission events need CAP_SYS_ADMIN):
//! `cargo run --release -p lazaret-mounts --example gate_bench -- [FILES] [ROUNDS]`
//! (`scripts/bench.sh gate`).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use lazaret_mounts::guard::{GateConfig, Guard, GuardConfig, GuardEvent, GuardRoot, Owner, RootKind};
use lazaret_mounts::sys;

type Error = Box<dyn std::error::Error>;

const GATE_THREAD: &str = "workspace-gate";

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

/// The guard with its gate over `ws`, acting on nobody's writes.
fn start_gate(ws: &Path, quarantine: &Path) -> Result<Guard, Error> {
    let config = GuardConfig {
        roots: vec![GuardRoot { label: "workspace".into(), path: ws.to_owned(), kind: RootKind::Workspace }],
        developer: Owner { uid: 0, gid: 0 },
        quarantine_dir: quarantine.to_owned(),
        changed_since: Some(std::time::SystemTime::now()),
        gate: Some(GateConfig::default()),
        ..GuardConfig::default()
    };
    let guard = Guard::start(
        config,
        Arc::new(|_| false),
        Box::new(|event| {
            if let GuardEvent::Refused(r) = event {
                eprintln!("{}", r.summary());
            }
        }),
    )?;
    if !guard.gated() {
        return Err("the guard started without its gate".into());
    }
    Ok(guard)
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
        .args(["-c", "user.name=bench", "-c", "user.email=bench@invalid", "-c", "gc.auto=0", "-c", "maintenance.auto=false"])
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
    GrepChanged,
    GrepOutside,
}

const WORKLOADS: [(Workload, &str); 4] = [
    (Workload::GitStatus, "git status in the workspace"),
    (Workload::GrepWorkspace, "grep -r over every workspace file"),
    (Workload::GrepChanged, "grep -r over files changed in the run"),
    (Workload::GrepOutside, "grep -r over as many files outside it"),
];

/// One measured run: wall ms, gate thread CPU ms.
#[derive(Default, Clone, Copy)]
struct Sample {
    wall_ms: f64,
    gate_cpu_ms: f64,
}

struct Lab {
    ws: PathBuf,
    outside: PathBuf,
    quarantine: PathBuf,
}

impl Lab {
    fn run(&self, workload: Workload) -> Result<f64, Error> {
        match workload {
            Workload::GitStatus => timed(&self.ws, "git", &["status", "--porcelain"]),
            Workload::GrepWorkspace => timed(&self.ws, "grep", &["-r", "-q", "no such text", "."]),
            Workload::GrepChanged => timed(&self.ws.join("changed"), "grep", &["-r", "-q", "no such text", "."]),
            Workload::GrepOutside => timed(&self.outside, "grep", &["-r", "-q", "no such text", "."]),
        }
    }

    /// `passes` runs of `workload` with the gate (or without), each sampled.
    fn sample(&self, workload: Workload, gated: bool, passes: usize) -> Result<(Vec<Sample>, f64), Error> {
        let t = Instant::now();
        let guard = gated.then(|| start_gate(&self.ws, &self.quarantine)).transpose()?;
        let start_ms = t.elapsed().as_secs_f64() * 1e3;
        if matches!(workload, Workload::GrepChanged) {
            // Rewritten now: their ctime is after the guard's start.
            tree(&self.ws.join("changed"), 2_000)?;
        }
        let mut samples = Vec::new();
        for _ in 0..passes {
            let cpu0 = thread_cpu_ns(GATE_THREAD);
            let wall_ms = self.run(workload)?;
            let gate_cpu_ms = if gated { (thread_cpu_ns(GATE_THREAD).saturating_sub(cpu0)) as f64 / 1e6 } else { 0.0 };
            samples.push(Sample { wall_ms, gate_cpu_ms });
        }
        if let Some(guard) = guard {
            guard.stop()?;
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
    let (ws, outside, quarantine) = (mount.join("ws"), mount.join("outside"), mount.join("quarantine"));
    tree(&ws, files)?;
    tree(&outside, files)?;
    git(&ws, &["init", "-q"])?;
    git(&ws, &["add", "-A"])?;
    git(&ws, &["commit", "-q", "-m", "tree"])?;
    tree(&ws.join("changed"), 2_000)?;
    sys::bind_mount(&mount, &mount, false)?;
    let lab = Lab { ws, outside, quarantine };
    let result = measure(&lab, files, rounds);
    sys::unmount(&mount, true)?;
    result
}

fn measure(lab: &Lab, files: usize, rounds: usize) -> Result<(), Error> {
    for (w, _) in WORKLOADS {
        lab.run(w)?; // warm caches and git's index
    }
    let mut starts = Vec::new();
    println!("the Workspace Guard's gate (mount mark, FAN_OPEN_PERM): the host's cost; {files} files, {rounds} rounds, medians");
    println!("{:<44} {:>9} {:>9} {:>7} {:>11}", "host workload", "off ms", "gate ms", "ratio", "gate CPU ms");
    for (workload, label) in WORKLOADS {
        let passes = if matches!(workload, Workload::GrepOutside) { 2 } else { 1 };
        let (mut off, mut first, mut second) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            off.push(lab.sample(workload, false, 1)?.0[0]);
            let (s, start) = lab.sample(workload, true, passes)?;
            first.push(s[0]);
            if let Some(again) = s.get(1) {
                second.push(*again);
            }
            starts.push(start);
        }
        if second.is_empty() {
            row(label, &off, &first);
        } else {
            row(&format!("{label}, first pass"), &off, &first);
            row("  second pass (ignore marks in place)", &off, &second);
        }
    }
    println!("guard start with its gate (engine, two fanotify groups, marks, two threads), median ms: {:.2}", median(starts));
    Ok(())
}

fn row(label: &str, off: &[Sample], on: &[Sample]) {
    let m = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
    let (off_ms, on_ms) = (m(off, |s| s.wall_ms), m(on, |s| s.wall_ms));
    println!("{:<44} {:>9.1} {:>9.1} {:>6.2}x {:>11.1}", label, off_ms, on_ms, on_ms / off_ms, m(on, |s| s.gate_cpu_ms));
}
