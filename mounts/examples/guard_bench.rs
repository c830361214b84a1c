//! The Workspace Guard engine's own cost, without a sandbox: a FILES-file
//! tree (directories of 200) unpacked with `tar` into a watched workspace,
//! guard off and on, alternating, ROUNDS times each. Only the `tar`
//! process's writes are the "sandbox's" (the pid filter accepts exactly its
//! pid, known before it writes anything). Prints medians of tar's wall
//! time, tar's CPU (its system time includes the kernel's cost of queueing
//! fanotify events), the guard thread's CPU until every event is handled
//! (`settle`), and the final sweep.
//!
//! `MODE` `developer` (default): the files are the developer's (tar runs as
//! the developer = this process's uid), as for the default profile.
//! `root`: the developer is uid/gid 65534 and tar runs as root, as a root
//! agent: the guard gives every file back.
//!
//! Run as root (fanotify needs CAP_SYS_ADMIN):
//! `cargo run --release -p lazaret-mounts --example guard_bench -- [FILES] [ROUNDS] [MODE]`.
//! The tree is made under the current directory (`guard-bench.*`, removed
//! afterwards), so run it where the workspace would be (the filesystem
//! matters: a fanotify filesystem mark sees every writer on it).

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lazaret_mounts::guard::{Guard, GuardConfig, GuardEvent, GuardRoot, Owner, RootKind};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// CPU time (ns) of this process's thread named `name` (from schedstat).
fn thread_cpu_ns(name: &str) -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            let stat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            return stat.split_whitespace().next()?.parse().ok();
        }
    }
    None
}

/// Children's user+system CPU so far, in ms (from /proc/self/stat: cutime, cstime).
fn children_cpu_ms() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state is field 3 (index 0 here); cutime 16, cstime 17 (1-based in proc(5)).
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(16 - 3) + tick(17 - 3)) * 10.0 // USER_HZ = 100
}

fn make_tarball(dir: &Path, files: usize) -> Result<PathBuf, Box<dyn std::error::Error>> {
    let src = dir.join("src");
    for i in 0..files {
        let d = src.join(format!("d{:03}", i / 200));
        if i % 200 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        std::fs::write(d.join(format!("f{i}.txt")), format!("{i}\n"))?;
    }
    let tar = dir.join("tree.tar");
    let ok = Command::new("tar").arg("-cf").arg(&tar).arg("-C").arg(&src).arg(".").status()?.success();
    if !ok {
        return Err("tar -c failed".into());
    }
    std::fs::remove_dir_all(&src)?;
    Ok(tar)
}

struct Round {
    tar_wall_ms: f64,
    tar_cpu_ms: f64,
    guard_cpu_ms: f64,
    settle_ms: f64,
    sweep_ms: f64,
    neutralised: u64,
    overflows: u64,
}

fn round(ws: &Path, tar: &Path, quarantine: &Path, developer: Owner, on: bool) -> Result<Round, Box<dyn std::error::Error>> {
    let unpacked = ws.join("unpacked");
    if unpacked.exists() {
        std::fs::remove_dir_all(&unpacked)?;
    }
    std::fs::create_dir(&unpacked)?;
    let pid = Arc::new(AtomicU32::new(u32::MAX));
    let neutralised = Arc::new(AtomicU64::new(0));
    let overflows = Arc::new(AtomicU64::new(0));
    let guard = if on {
        let config = GuardConfig {
            roots: vec![GuardRoot { label: "workspace".into(), path: ws.to_owned(), kind: RootKind::Workspace }],
            developer,
            quarantine_dir: quarantine.to_owned(),
            changed_since: Some(std::time::SystemTime::now() - Duration::from_secs(1)),
            ..Default::default()
        };
        let p = pid.clone();
        let (n, o) = (neutralised.clone(), overflows.clone());
        Some(Guard::start(
            config,
            Arc::new(move |x| x == p.load(Ordering::Relaxed)),
            Box::new(move |e| match e {
                GuardEvent::Neutralised(_) => {
                    n.fetch_add(1, Ordering::Relaxed);
                }
                GuardEvent::Overflow { .. } => {
                    o.fetch_add(1, Ordering::Relaxed);
                }
                GuardEvent::Error(e) => eprintln!("guard error: {e}"),
                GuardEvent::Refused(r) => eprintln!("{}", r.summary()),
                GuardEvent::Failed(e) => eprintln!("guard failed: {e}"),
            }),
        )?)
    } else {
        None
    };
    let cpu0 = thread_cpu_ns("workspace-guard").unwrap_or(0);
    let child_cpu0 = children_cpu_ms();
    // The pid is known before tar writes: sh waits for a line, then execs tar.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("read _ && exec tar -xf \"$0\" -C \"$1\"")
        .arg(tar)
        .arg(&unpacked)
        .stdin(Stdio::piped())
        .spawn()?;
    pid.store(child.id(), Ordering::Relaxed);
    let t = Instant::now();
    child.stdin.take().ok_or("no stdin")?.write_all(b"\n")?;
    let status = child.wait()?;
    let tar_wall_ms = t.elapsed().as_secs_f64() * 1e3;
    if !status.success() {
        return Err("tar -x failed".into());
    }
    let tar_cpu_ms = children_cpu_ms() - child_cpu0;
    let (mut guard_cpu_ms, mut settle_ms, mut sweep_ms) = (0.0, 0.0, 0.0);
    if let Some(guard) = guard {
        let s = Instant::now();
        guard.settle()?;
        settle_ms = s.elapsed().as_secs_f64() * 1e3;
        guard_cpu_ms = (thread_cpu_ns("workspace-guard").unwrap_or(0).saturating_sub(cpu0)) as f64 / 1e6;
        let s = Instant::now();
        let report = guard.stop()?;
        sweep_ms = s.elapsed().as_secs_f64() * 1e3;
        if !report.errors.is_empty() {
            eprintln!("final sweep errors: {:?}", &report.errors[..report.errors.len().min(5)]);
        }
    }
    Ok(Round {
        tar_wall_ms,
        tar_cpu_ms,
        guard_cpu_ms,
        settle_ms,
        sweep_ms,
        neutralised: neutralised.load(Ordering::Relaxed),
        overflows: overflows.load(Ordering::Relaxed),
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let files: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(20_000);
    let rounds: usize = args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(5);
    let mode = args.get(2).map(String::as_str).unwrap_or("developer");
    let developer = match mode {
        "developer" => Owner { uid: nix::unistd::geteuid().as_raw(), gid: nix::unistd::getegid().as_raw() },
        "root" => Owner { uid: 65534, gid: 65534 },
        other => return Err(format!("MODE is developer or root, not {other}").into()),
    };
    let base = tempfile::Builder::new().prefix("guard-bench.").tempdir_in(".")?;
    let tar = make_tarball(base.path(), files)?;
    let ws = base.path().join("ws");
    std::fs::create_dir(&ws)?;
    let quarantine = base.path().join("quarantine");
    let mut results: [Vec<Round>; 2] = [Vec::new(), Vec::new()];
    round(&ws, &tar, &quarantine, developer, false)?; // warm-up
    for r in 0..rounds * 2 {
        let on = r % 2 == 1;
        results[usize::from(on)].push(round(&ws, &tar, &quarantine, developer, on)?);
    }
    let col = |i: usize, f: &dyn Fn(&Round) -> f64| median(results[i].iter().map(f).collect());
    println!(
        "guard engine cost: {files} files unpacked by tar into a watched workspace ({mode} mode), {rounds} rounds each, alternating; medians"
    );
    println!("{:<44} {:>10} {:>10}", "", "off", "on");
    println!("{:<44} {:>10.1} {:>10.1}", "tar wall ms", col(0, &|r| r.tar_wall_ms), col(1, &|r| r.tar_wall_ms));
    println!("{:<44} {:>10.1} {:>10.1}", "tar CPU ms (user+sys, 10 ms ticks)", col(0, &|r| r.tar_cpu_ms), col(1, &|r| r.tar_cpu_ms));
    println!("{:<44} {:>10} {:>10.1}", "guard thread CPU ms until settled", "", col(1, &|r| r.guard_cpu_ms));
    println!("{:<44} {:>10} {:>10.1}", "settle after tar exited, ms", "", col(1, &|r| r.settle_ms));
    println!("{:<44} {:>10} {:>10.1}", "final sweep ms", "", col(1, &|r| r.sweep_ms));
    println!("{:<44} {:>10} {:>10.0}", "neutralisations reported", "", col(1, &|r| r.neutralised as f64));
    println!("{:<44} {:>10} {:>10.0}", "queue overflows (each a full sweep)", "", col(1, &|r| r.overflows as f64));
    Ok(())
}
