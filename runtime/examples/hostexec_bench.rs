//! Where a rule-approved escalation's host-side milliseconds go, natively
//! (as root): `cargo run --release -p lazaret-runtime --example
//! hostexec_bench -- [N] [JOURNAL_DIR]` runs `/bin/true` N times (default
//! 300) as `nobody` in a cgroup of its own, the coordinator's way, and
//! prints median and p90 of each phase:
//!
//! - `std::process::Command` running `/bin/true` (the reference);
//! - an fsync (`fdatasync`) of a line appended to a file in JOURNAL_DIR
//!   (default `/var/cache/lazaret`; use the Storage Root's file system);
//! - `hostexec::prepare` (cgroup, `clone3`), `HeldProcess::start` (the
//!   go-ahead until the program runs), `HostProcess::run` (until it exited,
//!   its cgroup checked empty and removed);
//! - journal line + fsync, then spawn, one after the other (before), and
//!   the fsync on a thread while the process is prepared (after), rounds
//!   alternating so both see the same load.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use lazaret_runtime::hostexec::{self, End, HostCommand, Limits, StopSignal};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(300);
    let journal_dir = args.get(1).cloned().unwrap_or_else(|| "/var/cache/lazaret".into());
    let root = hostexec::cgroup2_mount()?;
    let parent = root.join(format!("lazaret-hostexec-bench-{}", std::process::id()));
    let dir = tempfile::tempdir()?;
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534))?;
    let journal_path = std::path::Path::new(&journal_dir).join(format!("hostexec-bench-{}.jsonl", std::process::id()));
    let mut journal = std::fs::OpenOptions::new().create(true).append(true).open(&journal_path)?;
    let line = [b'x'; 200];
    let open_dir = || -> Result<OwnedFd, nix::Error> {
        nix::fcntl::open(dir.path(), OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
    };
    let mut seq = 0usize;
    let mut command = || -> Result<HostCommand, nix::Error> {
        seq += 1;
        Ok(HostCommand {
            argv: vec!["true".into()],
            cwd: open_dir()?,
            uid: 65534,
            gid: 65534,
            groups: vec![65534],
            env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
            cgroup: parent.join(format!("escalation-{seq}")),
            mount_ns: None,
        })
    };
    let stop = StopSignal::new()?;
    let limits = || Limits { deadline: Instant::now() + Duration::from_secs(30), output_cap: 1 << 20 };
    let run = |p: hostexec::HostProcess| -> Result<(), Box<dyn std::error::Error>> {
        let f = p.run(limits(), &stop, |_, _| Ok(()))?;
        if !matches!(f.end, End::Exited(0)) {
            return Err(format!("true ended with {:?}", f.end).into());
        }
        Ok(())
    };

    let (mut reference, mut fsync, mut prepare, mut start, mut finish) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut before, mut after) = (vec![], vec![]);
    for round in 0..n + 10 {
        let warm = round >= 10;
        let t = Instant::now();
        std::process::Command::new("/bin/true").stdin(std::process::Stdio::null()).status()?;
        let d = t.elapsed();
        if warm {
            reference.push(d);
        }

        let t = Instant::now();
        journal.write_all(&line)?;
        journal.sync_data()?;
        if warm {
            fsync.push(t.elapsed());
        }

        let cmd = command()?;
        let t0 = Instant::now();
        let held = hostexec::prepare(cmd)?;
        let t1 = Instant::now();
        let process = held.start()?;
        let t2 = Instant::now();
        run(process)?;
        let t3 = Instant::now();
        if warm {
            prepare.push(t1 - t0);
            start.push(t2 - t1);
            finish.push(t3 - t2);
        }

        // Before/after, in alternating order.
        let sequential = |journal: &mut std::fs::File, cmd: HostCommand| -> Result<Duration, Box<dyn std::error::Error>> {
            let t = Instant::now();
            journal.write_all(&line)?;
            journal.sync_data()?;
            run(hostexec::spawn(cmd)?)?;
            Ok(t.elapsed())
        };
        let overlapped = |journal: &mut std::fs::File, cmd: HostCommand| -> Result<Duration, Box<dyn std::error::Error>> {
            let t = Instant::now();
            journal.write_all(&line)?;
            let sync = journal.try_clone()?;
            let (held, synced) = std::thread::scope(|s| {
                let h = s.spawn(move || sync.sync_data());
                let held = hostexec::prepare(cmd);
                (held, h.join().expect("fsync thread"))
            });
            synced?;
            run(held?.start()?)?;
            Ok(t.elapsed())
        };
        let (c1, c2) = (command()?, command()?);
        let (b, a) = if round % 2 == 0 {
            let b = sequential(&mut journal, c1)?;
            (b, overlapped(&mut journal, c2)?)
        } else {
            let a = overlapped(&mut journal, c1)?;
            (sequential(&mut journal, c2)?, a)
        };
        if warm {
            before.push(b);
            after.push(a);
        }
    }
    let _ = std::fs::remove_file(&journal_path);
    let _ = std::fs::remove_dir(&parent);

    println!("hostexec: /bin/true as nobody, {n} rounds (after 10 warm-up), journal fsyncs in {journal_dir}");
    println!("{:<62} {:>9} {:>9}", "", "median ms", "p90 ms");
    let row = |name: &str, d: &mut Vec<Duration>| {
        d.sort();
        let q = |p: f64| d[((d.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1000.0;
        println!("{:<62} {:>9.3} {:>9.3}", name, q(0.5), q(0.9));
    };
    row("std::process::Command /bin/true (reference)", &mut reference);
    row("fdatasync of one appended journal line", &mut fsync);
    row("hostexec::prepare (cgroup mkdir, pipes, clone3)", &mut prepare);
    row("HeldProcess::start (go-ahead until exec'd)", &mut start);
    row("HostProcess::run (true runs, exits; cgroup empty, rmdir)", &mut finish);
    row("before: line + fsync, then spawn + run", &mut before);
    row("after: line, fsync on a thread while prepare, start + run", &mut after);
    Ok(())
}
