//! Lazaret's benchmarks. Each prints a table; none asserts anything.
//!
//! `lazaret-bench run [RUNS]`: end-to-end `lazaret run test -- true`, both
//! starting and tearing down its Domain and joining a running one, against
//! a bare `runsc run` of an equivalent bundle (same image overlay, argv,
//! user, flags) and `podman --runtime runsc run --rm --network none` of the
//! same image (its row says why when podman is missing or fails), one of
//! each per round so that load on the machine hits all alike: median and
//! p90 of each, and the ratios to bare runsc; the teardown that
//! follows a cold run (the client returns first), back-to-back runs (each
//! waits for the previous teardown), and one cold run stage by stage from
//! its journal's and log's timestamps.
//!
//! `lazaret-bench net [RUNS]`: build and teardown time of a Domain's sidecar
//! topology, then TCP connect latency and bulk throughput to a server in a
//! fake internet from (a) a plain network namespace, (b) a sandbox behind
//! the sidecar (`lazaret run`), (c) a runsc sandbox attached directly (no
//! sidecar hop). Everything happens inside namespaces the bench creates.
//! It ends with `net-filter`.
//!
//! `lazaret-bench net-filter [ROUNDS]`: the per-packet cost of the sidecar's
//! nftables filter on bulk TCP (download from the fake internet), on the
//! kernel path alone (a plain sandbox namespace behind a sidecar built by
//! `DomainNetwork`, no runsc, whose netstack would hide it): the sidecar
//! with Lazaret's filter tables deleted after it was built (a bench-only
//! switch, never a config key: today's hop), as installed in open egress,
//! and in locked egress (the server's address in the name set), against
//! the plain lab host; ROUNDS rounds (default 7), the configurations
//! alternating within each, medians; the cost is the median of each
//! round's ratio to the unfiltered sidecar of that round.
//!
//! `lazaret-bench git [FILES]`: `git status` in a repository of FILES files
//! (default 20,000) on the host and inside the sandbox, and the ratio.
//!
//! `lazaret-bench escalate [N]`: the round trip of a rule-approved `true`
//! from inside one sandbox, N times one after the other (default 1,000),
//! against spawning `/bin/true` on the host N times: median and p99 of
//! each and the difference (target: median at most 5 ms beyond the host
//! command). Two ways, both timed inside the sandbox: the whole
//! `lazaret-escalate -- true` process as the agent runs it
//! (`lazaret-escprobe time`), and the request alone, without the client
//! process's start, through the client's own code in one process
//! (`lazaret-escprobe requests`); then the coordinator's share from the
//! journal's timestamps, step by step. Then 8 sessions each starting 100
//! requests at once (`echo TOKEN`, rule-approved): every token must come
//! back exactly once with exit 0; prints the counts and the wall time.
//! The developer is the non-root test user; `lazaret-escalate` must be
//! installed in `../lib/lazaret/` of `lazaret` (scripts/bench.sh does it).
//!
//! `lazaret-bench guard [FILES] [ROUNDS]`: the Workspace Guard's cost (issue
//! 13; targets: at most 5 % on a workspace-heavy run, at most 10 ms on
//! Domain start). A FILES-file tree (default 20,000) unpacked with `tar`
//! inside the workspace, then `git status` inside, timed inside the sandbox,
//! and the whole `lazaret run` until the Domain is down (its final sweep
//! included), with the guard on and off (the coordinator's test hook
//! `LAZARET_TEST_GUARD=off`), ROUNDS times each (default 5), alternating;
//! for the developer as agent and for a root agent (whose every file the
//! guard gives back to the developer). Then Domain start: cold `lazaret run
//! -- true` on and off, and the guard's own start time from the log.
//!
//! Run it through `scripts/bench.sh`, which builds release binaries first.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lazaret_oci::bundle::{BundleSpec, CapabilityPolicy};
use lazaret_tests::{TEST_IMAGE, TEST_STORAGE, TestEnv, lazaret_bin};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => bench_run(args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(20)),
        Some("net") => bench_net(args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(20)),
        Some("net-filter") => bench_net_filter(args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(FILTER_ROUNDS)),
        Some("git") => bench_git(args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(20_000)),
        Some("escalate") => bench_escalate(args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(1000)),
        Some("guard") => bench_guard(
            args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(20_000),
            args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(5),
        ),
        _ => {
            eprintln!(
                "usage: lazaret-bench run [RUNS] | net [RUNS] | net-filter [ROUNDS] | git [FILES] | escalate [N] | guard [FILES] [ROUNDS]"
            );
            std::process::exit(2);
        }
    }
}

fn stats(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let median = ms(samples[samples.len() / 2]);
    let p90 = ms(samples[((samples.len() * 9).div_ceil(10)).saturating_sub(1)]);
    (median, p90)
}

fn bench_run(runs: usize) -> anyhow::Result<()> {
    anyhow::ensure!(runs >= 10, "use at least 10 runs");
    // Every lazaret invocation enters one namespace made here (`nsenter`),
    // rather than a fresh `unshare --net` each (which alone costs ~20 ms
    // more per invocation on the bench VM, and bare runsc pays neither).
    let netns = lazaret_netpolicy::topology::Netns::create()?;
    let mut env = TestEnv::new();
    env.netns = Some(netns.proc_path());
    // Warm up caches (image files, binaries) once for both.
    let warm = env.run(["run", "test", "--", "true"]);
    anyhow::ensure!(warm.status.success(), "lazaret run failed: {}", String::from_utf8_lossy(&warm.stderr));

    let lock = domain_lock(&env)?;

    // The baselines, each run once per round beside a cold `lazaret run` so
    // that the machine's load affects all three alike.
    let bare = BareRunsc::new()?;
    let podman = Podman::new(&netns.proc_path())?;
    // Warm up each baseline once too (not timed).
    bare.run_once(0)?;
    let podman_warm = match &podman {
        Ok(p) => p.run_once().err(),
        Err(_) => None,
    };

    // Cold: the Domain is down (its lock free) before each run. `lazaret
    // run` returns with the agent's status; the Domain goes down behind it,
    // and the time until its lock is free is the teardown tail.
    let mut lazaret = Vec::new();
    let mut tails = Vec::new();
    let mut bare_runs = Vec::new();
    let mut podman_runs = Vec::new();
    let mut podman_failure = match (&podman, podman_warm) {
        (Err(why), _) => Some(why.clone()),
        (_, Some(e)) => Some(e.to_string()),
        _ => None,
    };
    for round in 0..runs {
        anyhow::ensure!(lazaret_coordinator::client::wait_unlocked(&lock, DOWN_LIMIT), "the Domain did not go down");
        let t = Instant::now();
        let status = env.lazaret(["run", "test", "--", "true"]).stdout(Stdio::null()).stderr(Stdio::null()).status()?;
        lazaret.push(t.elapsed());
        anyhow::ensure!(status.success(), "lazaret run failed");
        let t = Instant::now();
        anyhow::ensure!(lazaret_coordinator::client::wait_unlocked(&lock, DOWN_LIMIT), "the Domain did not go down");
        tails.push(t.elapsed());
        bare_runs.push(bare.run_once(round + 1)?);
        if let (Ok(p), None) = (&podman, &podman_failure) {
            match p.run_once() {
                Ok(d) => podman_runs.push(d),
                Err(e) => podman_failure = Some(e.to_string()),
            }
        }
    }

    // Back to back: each run starts as soon as the previous one returned,
    // so it waits for that run's teardown before its own coordinator can
    // take the lock (what a developer re-running at once sees).
    let mut rerun = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let status = env.lazaret(["run", "test", "--", "true"]).stdout(Stdio::null()).stderr(Stdio::null()).status()?;
        rerun.push(t.elapsed());
        anyhow::ensure!(status.success(), "lazaret run (back to back) failed");
    }
    anyhow::ensure!(lazaret_coordinator::client::wait_unlocked(&lock, DOWN_LIMIT), "the Domain did not go down");

    // One more cold run, for the per-stage breakdown from its journal.
    let begun = epoch_ms();
    let status = env.lazaret(["run", "test", "--", "true"]).stdout(Stdio::null()).stderr(Stdio::null()).status()?;
    let returned = epoch_ms();
    anyhow::ensure!(status.success(), "lazaret run failed");
    anyhow::ensure!(lazaret_coordinator::client::wait_unlocked(&lock, DOWN_LIMIT), "the Domain did not go down");
    let unlocked = epoch_ms();
    let breakdown = stage_breakdown(&env, begun, returned, unlocked)?;

    // A session joining a Domain that is already running (another session
    // holds it open), as every terminal after the first does.
    let mut holder = env
        .lazaret(["run", "test", "--", "sh", "-c", "echo up; read line"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut first = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().ok_or_else(|| anyhow::anyhow!("holder stdout"))?),
        &mut first,
    )?;
    anyhow::ensure!(first.trim() == "up", "holder session printed {first:?}");
    let mut joins = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let status = env.lazaret(["run", "test", "--", "true"]).stdout(Stdio::null()).stderr(Stdio::null()).status()?;
        joins.push(t.elapsed());
        anyhow::ensure!(status.success(), "joining lazaret run failed");
    }
    // `runsc exec` alone into the same running sandbox, from the bench
    // (no Lazaret client or coordinator): the floor of every join; and the
    // same exec with runsc's own start-up done ahead (its process spec read
    // from a FIFO written only when timing starts), what a coordinator
    // could save by starting `runsc exec` before it has the spec.
    let exec_alone = runsc_exec_alone(&env, runs);
    drop(holder.stdin.take());
    let _ = holder.wait();

    drop(bare);
    drop(podman);
    let (lm, lp) = stats(lazaret);
    let (tm, tp) = stats(tails);
    let (rm, rp) = stats(rerun);
    let (jm, jp) = stats(joins);
    let (bm, bp) = stats(bare_runs);
    println!("lazaret run vs bare runsc run vs podman, `true`, {runs} rounds, one run of each per round ({})", lazaret_bin().display());
    println!("{:<50} {:>10} {:>10} {:>12}", "", "median ms", "p90 ms", "x runsc run");
    println!("{:<50} {:>10.1} {:>10.1} {:>12.2}", "runsc run (same image, argv, flags)", bm, bp, 1.0);
    match podman_failure {
        None => {
            let (pm, pp) = stats(podman_runs);
            println!("{:<50} {:>10.1} {:>10.1} {:>12.2}", "podman --runtime runsc run --rm --network none", pm, pp, pm / bm);
        }
        Some(why) => println!(
            "{:<50} {:>10} {:>10} {:>12}  ({})",
            "podman --runtime runsc run --rm --network none",
            "-",
            "-",
            "-",
            why.lines().next().unwrap_or("failed")
        ),
    }
    println!("{:<50} {:>10.1} {:>10.1} {:>12.2}", "lazaret run, cold (Domain started, torn down)", lm, lp, lm / bm);
    println!("{:<50} {:>10.1} {:>10.1} {:>12.2}", "lazaret run, joining a running Domain", jm, jp, jm / bm);
    println!(
        "  targets: cold <= 1.30 x runsc run ({}), joining <= 30 ms median ({})",
        if lm / bm <= 1.30 { "met" } else { "missed" },
        if jm <= 30.0 { "met" } else { "missed" }
    );
    println!("{:<50} {:>10.1} {:>10.1}", "cold run's teardown until the lock is free", tm, tp);
    println!("{:<50} {:>10.1} {:>10.1}", "lazaret run, back to back (waits teardown)", rm, rp);
    match exec_alone {
        Ok((plain, ahead, failed)) => {
            let ((em, ep), (am, ap)) = (stats(plain), stats(ahead));
            let failed = if failed > 0 { format!("  ({failed} rounds failed, not timed)") } else { String::new() };
            println!("{:<50} {:>10.1} {:>10.1}{failed}", "runsc exec true alone (running Domain's sandbox)", em, ep);
            println!("{:<50} {:>10.1} {:>10.1}", "  same, runsc started ahead (spec from a FIFO)", am, ap);
        }
        Err(e) => println!("{:<50} {:>10} {:>10}  ({e})", "runsc exec true alone (running Domain's sandbox)", "-", "-"),
    }
    println!();
    println!("one cold run, stage by stage (journal and coordinator log timestamps)");
    println!("{:<60} {:>8}", "from -> to", "ms");
    for (from, to, ms) in breakdown {
        println!("{:<60} {:>8}", format!("{from} -> {to}"), ms);
    }
    Ok(())
}

/// `runsc exec /bin/true` into `env`'s running Domain's sandbox, `runs`
/// times, timed in a shell: plainly, and with runsc started 300 ms ahead,
/// blocked reading its process spec from a FIFO that the shell writes when
/// timing starts. Returns (plain, ahead, rounds that failed).
fn runsc_exec_alone(env: &TestEnv, runs: usize) -> anyhow::Result<(Vec<Duration>, Vec<Duration>, usize)> {
    let dir = env.domain_dir().ok_or_else(|| anyhow::anyhow!("no Domain directory"))?;
    let root = lazaret_coordinator::layout::DomainDir::new(dir).runsc_state();
    let runsc = command_path("runsc")?.ok_or_else(|| anyhow::anyhow!("runsc not on PATH"))?;
    let list = Command::new(&runsc).arg("--root").arg(&root).args(["list", "--quiet"]).output()?;
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    let container = listed
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("lzr-"))
        .ok_or_else(|| anyhow::anyhow!("no running sandbox in {}", root.display()))?;
    let work = tempfile::Builder::new().prefix("lazaret-bench-exec-").tempdir_in("/run")?;
    let spec = work.path().join("process.json");
    std::fs::write(&spec, r#"{"user":{"uid":0,"gid":0},"args":["/bin/true"],"env":["PATH=/usr/bin:/bin"],"cwd":"/"}"#)?;
    let fifo = work.path().join("spec.fifo");
    // The coordinator's global flags, which every runsc call of a container
    // must share.
    // A failed exec is counted, not timed (its last message kept).
    let err = work.path().join("stderr");
    let globals = runsc_globals_sh(&root, lazaret_runtime::NetworkMode::Sandbox)?;
    let script = format!(
        "for i in $(seq {runs}); do \
           s=$(date +%s%N); {runsc} {globals} exec --process {spec} {container} >/dev/null 2>{err} || {{ echo \"failed $(tail -c 200 {err} | tr '\\n' ' ')\"; continue; }}; e=$(date +%s%N); plain=$((e-s)); \
           rm -f {fifo}; mkfifo {fifo}; {runsc} {globals} exec --process {fifo} {container} >/dev/null 2>{err} & pid=$!; sleep 0.3; \
           s=$(date +%s%N); cat {spec} > {fifo}; wait $pid || {{ echo \"failed $(tail -c 200 {err} | tr '\\n' ' ')\"; continue; }}; e=$(date +%s%N); echo \"$plain $((e-s))\"; \
         done",
        runsc = runsc.display(),
        spec = spec.display(),
        fifo = fifo.display(),
        err = err.display(),
    );
    let out = Command::new("sh").args(["-c", &script]).output()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (mut plain, mut ahead) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let mut f = line.split_whitespace().map(str::parse::<u64>);
        if let (Some(Ok(a)), Some(Ok(b))) = (f.next(), f.next()) {
            plain.push(Duration::from_nanos(a));
            ahead.push(Duration::from_nanos(b));
        }
    }
    let failed: Vec<&str> = text.lines().filter(|l| l.starts_with("failed")).collect();
    anyhow::ensure!(
        plain.len() * 2 >= runs,
        "{} of {runs} rounds failed, first: {}",
        failed.len(),
        failed.first().copied().unwrap_or("(no message)")
    );
    Ok((plain, ahead, failed.len()))
}

/// How long the bench waits for a Domain to go down.
const DOWN_LIMIT: Duration = Duration::from_secs(60);

/// The lock file of `env`'s single Domain (it exists after a first run).
fn domain_lock(env: &TestEnv) -> anyhow::Result<PathBuf> {
    let dir = env.domain_dir().ok_or_else(|| anyhow::anyhow!("no Domain directory under {}", env.runtime_dir.display()))?;
    Ok(lazaret_coordinator::layout::DomainDir::new(dir).lock())
}

fn epoch_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Journal events recorded during start-up (each stage's first step); the
/// log's `stage NAME done` lines delimit those stages more exactly.
const START_EVENTS: [&str; 6] =
    ["AcquireDomainLock", "MountStateAnchor", "CreateTrustAnchor", "StartSidecar", "StartSandbox", "PublishDomain"];

/// The last run's milestones, in time order: the client's start, return
/// and the lock's release (measured here); start-up as the coordinator
/// log's `stage NAME done` lines (or, from a coordinator without them, its
/// journal events); then the journal events of the session and teardown
/// (`timestamp_ms`). Returned as consecutive differences.
fn stage_breakdown(env: &TestEnv, begun: u64, returned: u64, unlocked: u64) -> anyhow::Result<Vec<(String, String, u64)>> {
    let mut marks: Vec<(u64, String)> = vec![(begun, "client started".into())];
    for id in env.domain_ids() {
        let log = std::fs::read_to_string(env.runtime_dir.join(&id).join("coordinator.log")).unwrap_or_default();
        let mut stages = 0;
        for line in log.lines() {
            // "[TIMESTAMP_MS] stage NAME done"
            let Some((stamp, rest)) = line.strip_prefix('[').and_then(|l| l.split_once("] ")) else { continue };
            let (Ok(t), Some(stage)) = (stamp.parse::<u64>(), rest.strip_prefix("stage ").and_then(|r| r.strip_suffix(" done"))) else {
                continue;
            };
            if t >= begun {
                marks.push((t, format!("stage {stage} done")));
                stages += 1;
            }
        }
        let path = Path::new(TEST_STORAGE).join("domains").join(&id).join("journal.jsonl");
        let text = std::fs::read_to_string(&path)?;
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line)?;
            let (Some(t), Some(action)) = (v["timestamp_ms"].as_u64(), v["action"].as_str()) else { continue };
            if t >= begun && (stages == 0 || !START_EVENTS.contains(&action)) {
                marks.push((t, format!("journal {action}")));
            }
        }
    }
    marks.push((returned, "client returned".into()));
    marks.push((unlocked, "lock free".into()));
    // Stable: equal timestamps keep their order above.
    marks.sort_by_key(|m| m.0);
    Ok(marks.windows(2).map(|w| (w[0].1.clone(), w[1].1.clone(), w[1].0 - w[0].0)).collect())
}

/// `runsc run` of a bundle equivalent to what `lazaret run` writes (same
/// image overlay, argv, user, global flags), timed one run at a time.
struct BareRunsc {
    work: tempfile::TempDir,
    lower: PathBuf,
    runsc: PathBuf,
    /// [`runsc_globals_sh`], network none.
    globals: String,
}

impl BareRunsc {
    fn new() -> anyhow::Result<BareRunsc> {
        let (work, lower) = bare_bundle(vec!["true".into()], Vec::new(), None, "bare")?;
        let globals = runsc_globals_sh(&work.path().join("state"), lazaret_runtime::NetworkMode::None)?;
        Ok(BareRunsc { work, lower, runsc: command_path("runsc")?.ok_or_else(|| anyhow::anyhow!("runsc not on PATH"))?, globals })
    }

    /// One `runsc run` (container `bare-N`), in a shell with its own mount
    /// namespace for the rootfs overlay; the shell times runsc alone.
    fn run_once(&self, n: usize) -> anyhow::Result<Duration> {
        let script = format!(
            "{}s=$(date +%s%N); {runsc} {globals} run --bundle {d}/bundle bare-{n} >/dev/null; e=$(date +%s%N); echo $((e-s))",
            overlay_script(self.work.path(), &self.lower),
            d = self.work.path().display(),
            runsc = self.runsc.display(),
            globals = self.globals,
        );
        let out = Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script]).output()?;
        anyhow::ensure!(out.status.success(), "bare runsc run failed: {}", String::from_utf8_lossy(&out.stderr));
        Ok(Duration::from_nanos(String::from_utf8_lossy(&out.stdout).trim().parse()?))
    }
}

impl Drop for BareRunsc {
    fn drop(&mut self) {
        remove_bench_cgroup("bare");
    }
}

/// `podman --runtime runsc run --rm --network none` of the same image
/// (its rootfs directory as podman's `--rootfs DIR:O`, an overlay podman
/// makes over it), with runsc's global flags as the bare run's, inside
/// the bench's own network namespace, with podman's storage in a
/// throw-away directory.
struct Podman {
    work: tempfile::TempDir,
    lower: PathBuf,
    runsc: PathBuf,
    netns: PathBuf,
    /// The coordinator's runsc flags but `--root` (podman keeps its own
    /// state), in `--runtime-flag`'s form (`platform=systrap`).
    runtime_flags: Vec<String>,
}

/// The cgroup parent of the podman containers (below /lazaret/bench).
const PODMAN_CGROUP: &str = "podman";

impl Podman {
    /// The podman baseline, or why there is none (podman missing).
    fn new(netns: &Path) -> anyhow::Result<Result<Podman, String>> {
        if command_path("podman")?.is_none() {
            return Ok(Err("podman is not installed; scripts/bench.sh installs it from Debian's archive".into()));
        }
        let store = lazaret_oci::ImageStore::open(&Path::new(TEST_STORAGE).join("images"))?;
        let image = store.get(TEST_IMAGE)?.ok_or_else(|| anyhow::anyhow!("test image missing"))?;
        let work = tempfile::Builder::new().prefix("lazaret-bench-podman-").tempdir_in("/run")?;
        let runsc = command_path("runsc")?.ok_or_else(|| anyhow::anyhow!("runsc not on PATH"))?;
        let mut globals = runsc_globals(&work.path().join("state"), lazaret_runtime::NetworkMode::None)?.into_iter();
        let mut runtime_flags = Vec::new();
        while let Some(flag) = globals.next() {
            if flag == "--root" {
                globals.next();
            } else {
                runtime_flags.push(flag.trim_start_matches("--").to_string());
            }
        }
        Ok(Ok(Podman { work, lower: image.rootfs, runsc, netns: netns.to_path_buf(), runtime_flags }))
    }

    fn run_once(&self) -> anyhow::Result<Duration> {
        let d = self.work.path();
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.netns.display()))
            .args(["--", "podman", "--root"])
            .arg(d.join("storage"))
            .arg("--runroot")
            .arg(d.join("runroot"))
            .args(["--cgroup-manager", "cgroupfs", "--events-backend", "none", "--runtime"])
            .arg(&self.runsc)
            .args(self.runtime_flags.iter().flat_map(|flag| ["--runtime-flag", flag.as_str()]))
            .args(["run", "--rm", "--network", "none", "--cgroup-parent", &format!("/lazaret/bench/{PODMAN_CGROUP}"), "--rootfs"])
            .arg(format!("{}:O", self.lower.display()))
            .arg("true")
            .stdin(Stdio::null());
        let t = Instant::now();
        let out = cmd.output()?;
        let elapsed = t.elapsed();
        anyhow::ensure!(out.status.success(), "podman run failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        Ok(elapsed)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // conmon's cgroups sit below the parent; podman's storage holds no
        // mount once its containers are removed (--rm).
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir(hierarchy.path().join("lazaret/bench").join(PODMAN_CGROUP).join("conmon"));
        }
        remove_bench_cgroup(PODMAN_CGROUP);
    }
}

/// The absolute path of `name` on PATH, if any.
fn command_path(name: &str) -> anyhow::Result<Option<PathBuf>> {
    let out = Command::new("sh").args(["-c", &format!("command -v {name}")]).output()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok((out.status.success() && !path.is_empty()).then(|| PathBuf::from(path)))
}

/// runsc's global flags exactly as the coordinator passes them
/// (`Runsc::global_args`: state root, platform, overlay, network,
/// `--host-uds`), for state root `root`: the baselines run runsc as Lazaret
/// does, and follow when Lazaret's flags change.
fn runsc_globals(root: &Path, network: lazaret_runtime::NetworkMode) -> anyhow::Result<Vec<String>> {
    let runsc = lazaret_runtime::Runsc::new(lazaret_runtime::RunscOptions {
        path: None,
        state_root: root.to_path_buf(),
        platform: lazaret_runtime::Platform::Systrap,
        network,
        debug_log_dir: None,
        probe_cache: None,
    })?;
    Ok(runsc.global_args().into_iter().map(|a| a.to_string_lossy().into_owned()).collect())
}

/// [`runsc_globals`] as one shell word list.
fn runsc_globals_sh(root: &Path, network: lazaret_runtime::NetworkMode) -> anyhow::Result<String> {
    Ok(lazaret_protocol::shell::quote_argv(&runsc_globals(root, network)?))
}

/// A bundle for a bare `runsc run` of the test image (root, no
/// capabilities beyond the default root set), in a fresh directory under
/// /run with `rootfs`, `upper`, `work`, `bundle` and `state`. The caller
/// mounts the overlay (see [`overlay_script`]) in a private mount namespace.
fn bare_bundle(
    args: Vec<String>,
    mounts: Vec<lazaret_oci::bundle::BindMount>,
    network_namespace: Option<PathBuf>,
    cgroup: &str,
) -> anyhow::Result<(tempfile::TempDir, PathBuf)> {
    let store = lazaret_oci::ImageStore::open(&Path::new(TEST_STORAGE).join("images"))?;
    let image = store.get(TEST_IMAGE)?.ok_or_else(|| anyhow::anyhow!("test image missing"))?;
    let work = tempfile::Builder::new().prefix("lazaret-bench-").tempdir_in("/run")?;
    let dir = work.path();
    for d in ["rootfs", "upper", "work", "bundle", "state"] {
        std::fs::create_dir(dir.join(d))?;
    }
    let spec = BundleSpec {
        args,
        env: vec![("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()), ("HOME".into(), "/root".into())],
        cwd: "/".into(),
        uid: 0,
        gid: 0,
        additional_gids: Vec::new(),
        hostname: "bench".into(),
        terminal: false,
        rootfs: dir.join("rootfs"),
        mounts,
        network_namespace,
        cgroups_path: format!("/lazaret/bench/{cgroup}"),
        capabilities: CapabilityPolicy::DefaultRoot,
        rlimits: Vec::new(),
        memory_limit: None,
        pids_limit: None,
    };
    lazaret_oci::bundle::write_bundle(&dir.join("bundle"), &spec)?;
    Ok((work, image.rootfs))
}

/// Shell commands that make `/` private and mount the bundle's rootfs
/// overlay (run them under `unshare --mount`).
fn overlay_script(dir: &Path, lower: &Path) -> String {
    format!(
        "set -e; mount --make-rprivate /; mount -t overlay overlay -o lowerdir={lower},upperdir={d}/upper,workdir={d}/work {d}/rootfs; ",
        lower = lower.display(),
        d = dir.display()
    )
}

/// Removes the cgroups runsc made for a bare bench container.
fn remove_bench_cgroup(cgroup: &str) {
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        let _ = std::fs::remove_dir(hierarchy.path().join("lazaret/bench").join(cgroup));
        let _ = std::fs::remove_dir(hierarchy.path().join("lazaret/bench"));
        // The shared parent too, once empty (busy with a running Domain: kept).
        let _ = std::fs::remove_dir(hierarchy.path().join("lazaret"));
    }
}

const BULK_PORT: u16 = 8081;
const BULK_BYTES: u64 = 200_000_000;
const CONNECTS: usize = 200;

fn bench_net(runs: usize) -> anyhow::Result<()> {
    use lazaret_netpolicy::topology::{DomainNetwork, Netns, TopologyConfig};
    use lazaret_tests::netlab::{NetLab, PORT, PUBLIC};

    // Topology build/teardown in a throw-away "host" namespace.
    let host = Netns::create()?;
    let state = tempfile::tempdir()?;
    let cfg = TopologyConfig::new(state.path().join("forwarding.json"));
    let input = lazaret_netpolicy::PolicyInput { dns: vec!["10.53.0.53".parse()?], ..Default::default() };
    let (mut build, mut teardown) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let net = DomainNetwork::create(&host, &cfg, &input)?;
        build.push(t.elapsed());
        let t = Instant::now();
        net.teardown()?;
        teardown.push(t.elapsed());
    }
    let (bm, bp) = stats(build);
    let (tm, tp) = stats(teardown);

    let mut lab = NetLab::new();
    lab.start_world_server(&["bulk", &BULK_PORT.to_string(), PUBLIC]);
    let probe_args = |probe: &str| -> Vec<String> {
        vec![
            probe.to_string(),
            "bench-tcp".into(),
            PUBLIC.into(),
            PORT.to_string(),
            BULK_PORT.to_string(),
            CONNECTS.to_string(),
            BULK_BYTES.to_string(),
        ]
    };
    let probe = lazaret_tests::probe_bin();

    // (a) plain network namespace (the lab host).
    let out = Command::new("nsenter")
        .arg(format!("--net={}", lab.host.display()))
        .arg("--")
        .args(probe_args(&probe.display().to_string()))
        .output()?;
    let plain = parse_tcp(&out)?;

    // (b) sandbox behind the sidecar.
    let mut env = TestEnv::new();
    env.netns = Some(lab.host.clone());
    let inside = env.install_probe();
    let mut args = vec!["run".to_string(), "test".into(), "--".into()];
    args.extend(probe_args(&inside.display().to_string()));
    let out = env.run(&args);
    let sidecar = parse_tcp(&out)?;

    // (c) runsc attached directly to the world.
    let direct_ns = lab.direct_namespace("192.0.2.2", "192.0.2.1");
    let direct = parse_tcp(&runsc_direct(&direct_ns, &env, &probe_args(&inside.display().to_string()))?)?;

    println!("sidecar topology ({runs} runs)          median ms  p90 ms");
    println!("{:<38} {:>9.1} {:>7.1}", "build (incl. read-back verification)", bm, bp);
    println!("{:<38} {:>9.1} {:>7.1}", "teardown", tm, tp);
    println!();
    println!("TCP to a fake-internet server          connect median us  p90 us   MB/s ({} MB)", BULK_BYTES / 1_000_000);
    for (name, r) in [("plain netns", &plain), ("runsc, no sidecar", &direct), ("runsc behind the sidecar (lazaret)", &sidecar)] {
        println!("{:<38} {:>17} {:>7} {:>7.1}", name, r.0, r.1, r.2);
    }
    println!("{:<38} {:>17} {:>7} {:>7.2}", "sidecar / no sidecar", "", "", sidecar.2 / direct.2);

    // (d) Time to first byte of a name: resolve, connect, first byte; open
    // egress (the lab's resolver directly) vs locked (Lazaret's resolver in
    // the sidecar, which also fills the nftables set before answering).
    println!();
    println!("name to first byte ({CONNECTS} runs)            median us  p90 us");
    for (label, extra) in
        [("open egress", ""), ("locked egress (allow_egress = [\"bench.test\"])", "egress = \"locked\"\nallow_egress = [\"bench.test\"]\n")]
    {
        let mut env = TestEnv::with_profile(&format!("user = \"root\"\ndns = [\"10.53.0.53\"]\n{extra}"));
        env.netns = Some(lab.host.clone());
        let probe = env.install_probe();
        let out = env.run([
            "run".to_string(),
            "test".into(),
            "--".into(),
            probe.display().to_string(),
            "bench-name".into(),
            "bench.test".into(),
            PORT.to_string(),
            CONNECTS.to_string(),
        ]);
        let text = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            out.status.code() == Some(42),
            "name probe failed ({:?}): {} {}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
        let line =
            text.lines().find_map(|l| l.strip_prefix("first_byte_us ")).ok_or_else(|| anyhow::anyhow!("no first_byte_us in {text}"))?;
        let (median, p90) = line.split_once(' ').ok_or_else(|| anyhow::anyhow!("bad line {line}"))?;
        println!("{label:<46} {median:>9} {p90:>7}");
    }
    drop(lab);
    println!();
    bench_net_filter(FILTER_ROUNDS)
}

const FILTER_ROUNDS: usize = 7;
const FILTER_BULK_BYTES: u64 = 1_000_000_000;
const FILTER_CONNECTS: usize = 50;

fn bench_net_filter(rounds: usize) -> anyhow::Result<()> {
    use lazaret_netpolicy::names::{NameRule, parse_name_rule};
    use lazaret_netpolicy::topology::{DomainNetwork, LOCKED_TABLE, Netns, SetElement, TopologyConfig, locked_set_name, put_elements};
    use lazaret_tests::netlab::{NetLab, PORT, PUBLIC};

    let mut lab = NetLab::new();
    lab.start_world_server(&["bulk", &BULK_PORT.to_string(), PUBLIC]);
    let host = Netns::from_fd(std::fs::File::open(&lab.host)?.into());
    let state = tempfile::tempdir()?;
    let cfg = TopologyConfig::new(state.path().join("forwarding.json"));
    let open = lazaret_netpolicy::PolicyInput { dns: vec!["10.53.0.53".parse()?], ..Default::default() };
    let (pattern, port) = parse_name_rule("bench.test")?;
    let locked =
        lazaret_netpolicy::PolicyInput { locked: true, names: vec![NameRule { pattern, port, origin: "bench".into() }], ..open.clone() };
    let bare = DomainNetwork::create(&host, &cfg, &open)?;
    // The bench-only switch: the same sidecar without Lazaret's filter table.
    let sidecar = bare.sidecar_netns().ok_or_else(|| anyhow::anyhow!("no sidecar netns"))?;
    let out = Command::new("nsenter")
        .arg(format!("--net={}", sidecar.proc_path().display()))
        .args(["--", "nft", "delete", "table", "inet", "lazaret-filter"])
        .output()?;
    anyhow::ensure!(out.status.success(), "nft delete table: {}", String::from_utf8_lossy(&out.stderr));
    let listed =
        Command::new("nsenter").arg(format!("--net={}", sidecar.proc_path().display())).args(["--", "nft", "list", "tables"]).output()?;
    anyhow::ensure!(listed.stdout.is_empty(), "tables left: {}", String::from_utf8_lossy(&listed.stdout));
    let filtered = DomainNetwork::create(&host, &cfg, &open)?;
    let locked = DomainNetwork::create(&host, &cfg, &locked)?;
    let named = SetElement { set: locked_set_name(true, None), address: PUBLIC.parse()?, timeout: Duration::from_secs(3600) };
    locked.sidecar_netns().ok_or_else(|| anyhow::anyhow!("no sidecar netns"))?.run(|| put_elements(LOCKED_TABLE, &[named]))?;

    let probe = lazaret_tests::probe_bin();
    let measure = |netns: &Path| -> anyhow::Result<(u64, u64, f64)> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .arg("--")
            .arg(&probe)
            .args([
                "bench-tcp",
                PUBLIC,
                &PORT.to_string(),
                &BULK_PORT.to_string(),
                &FILTER_CONNECTS.to_string(),
                &FILTER_BULK_BYTES.to_string(),
            ])
            .output()?;
        parse_tcp(&out)
    };
    let sandbox_path = |net: &DomainNetwork| -> anyhow::Result<PathBuf> {
        Ok(net.sandbox_netns().ok_or_else(|| anyhow::anyhow!("no sandbox netns"))?.proc_path())
    };
    let configs: Vec<(&str, PathBuf)> = vec![
        ("plain netns (no sidecar)", lab.host.clone()),
        ("sidecar, no Lazaret filter (bench-only)", sandbox_path(&bare)?),
        ("sidecar, filter as installed (open)", sandbox_path(&filtered)?),
        ("sidecar, locked egress (name set)", sandbox_path(&locked)?),
    ];
    let mut results: Vec<Vec<(u64, u64, f64)>> = vec![Vec::new(); configs.len()];
    for round in 0..rounds {
        // Alternate the order too, so no configuration always runs first.
        let mut order: Vec<usize> = (0..configs.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            results[i].push(measure(&configs[i].1)?);
        }
    }
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    // This VM's throughput drifts by more than the effect measured: each
    // configuration is compared with the unfiltered sidecar of the same
    // round, and the median of those paired ratios is the figure.
    println!(
        "sidecar filter cost, bulk TCP download ({} MB x {rounds} rounds, kernel path, no runsc)   MB/s median  min     max     connect median us  vs no filter (paired)",
        FILTER_BULK_BYTES / 1_000_000
    );
    for ((name, _), samples) in configs.iter().zip(&results) {
        let mbps: Vec<f64> = samples.iter().map(|r| r.2).collect();
        let min = mbps.iter().copied().fold(f64::INFINITY, f64::min);
        let max = mbps.iter().copied().fold(0.0, f64::max);
        let paired = median(samples.iter().zip(&results[1]).map(|(r, b)| r.2 / b.2 - 1.0).collect());
        let m = median(mbps);
        let mut connect: Vec<u64> = samples.iter().map(|r| r.0).collect();
        connect.sort();
        println!("{name:<84} {m:>11.1} {min:>7.1} {max:>7.1} {:>20} {:>+20.1} %", connect[connect.len() / 2], paired * 100.0);
    }
    locked.teardown()?;
    filtered.teardown()?;
    bare.teardown()?;
    Ok(())
}

fn parse_tcp(out: &std::process::Output) -> anyhow::Result<(u64, u64, f64)> {
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(out.status.code() == Some(42), "probe failed ({:?}): {} {}", out.status, text, String::from_utf8_lossy(&out.stderr));
    let mut connect = (0, 0);
    let mut mbps = 0.0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["connect_us", m, p] => connect = (m.parse()?, p.parse()?),
            ["mbytes_per_s", x] => mbps = x.parse()?,
            _ => {}
        }
    }
    Ok((connect.0, connect.1, mbps))
}

/// `runsc run` of the probe with the namespace at `netns` as its network
/// (netstack mode, the /proc/sys/net work-around applied), the test image
/// as rootfs and `env`'s workspace bound in.
fn runsc_direct(netns: &Path, env: &TestEnv, argv: &[String]) -> anyhow::Result<std::process::Output> {
    let mounts = vec![lazaret_oci::bundle::BindMount { source: env.workspace.clone(), destination: env.workspace.clone(), readonly: true }];
    let (work, lower) = bare_bundle(argv.to_vec(), mounts, Some(netns.to_path_buf()), "direct")?;
    let script = format!(
        "{}mount -t tmpfs -o size=4k tmpfs /proc/sys/net; \
         runsc {globals} run --bundle {d}/bundle direct",
        overlay_script(work.path(), &lower),
        d = work.path().display(),
        globals = runsc_globals_sh(&work.path().join("state"), lazaret_runtime::NetworkMode::Sandbox)?,
    );
    let out = Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script]).output()?;
    remove_bench_cgroup("direct");
    Ok(out)
}

fn bench_git(files: usize) -> anyhow::Result<()> {
    let env = TestEnv::new();
    let ws = &env.workspace;
    for i in 0..files {
        let d = ws.join(format!("d{:03}", i / 200));
        if i % 200 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        std::fs::write(d.join(format!("f{i}.txt")), format!("{i}\n"))?;
    }
    lazaret_tests::git(ws, &["add", "-A"]);
    lazaret_tests::git(ws, &["-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-qm", "files"]);
    let rounds = 7;
    let mut host = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        let out = Command::new("git").arg("-C").arg(ws).args(["status", "--porcelain"]).output()?;
        host.push(t.elapsed());
        anyhow::ensure!(out.status.success() && out.stdout.is_empty(), "host git status failed or dirty");
    }
    // Timed inside the sandbox, so sandbox start-up is not counted.
    let script =
        format!("for i in $(seq {rounds}); do s=$(date +%s%N); git status --porcelain >/dev/null; e=$(date +%s%N); echo $((e-s)); done");
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    anyhow::ensure!(out.status.success(), "sandbox git status failed: {}", String::from_utf8_lossy(&out.stderr));
    let inside: Vec<Duration> =
        String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse().ok()).map(Duration::from_nanos).collect();
    anyhow::ensure!(inside.len() == rounds, "expected {rounds} timings, got {}", inside.len());
    let (hm, hp) = stats(host);
    let (im, ip) = stats(inside);
    println!("git status --porcelain, {files} tracked files, {rounds} rounds   median ms  p90 ms");
    println!("{:<52} {:>9.1} {:>7.1}", "host", hm, hp);
    println!("{:<52} {:>9.1} {:>7.1}", "inside the sandbox (lazaret run)", im, ip);
    println!("{:<52} {:>9.2} {:>7.2}", "ratio", im / hm, ip / hp);
    Ok(())
}

/// The `q`-quantile (0..=1) of sorted `samples`, in milliseconds.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

/// For every pair of consecutive journal events of the completed
/// escalation requests of `env`, the time between them over all requests
/// (sorted), in the order of the events.
fn request_steps(env: &TestEnv) -> Vec<(String, String, Vec<Duration>)> {
    let mut by_request: std::collections::HashMap<String, Vec<(String, u64)>> = std::collections::HashMap::new();
    for e in env.journal_entries() {
        let (Some(request), Some(action), Some(t)) = (e["request"].as_str(), e["action"].as_str(), e["timestamp_ms"].as_u64()) else {
            continue;
        };
        by_request.entry(request.to_string()).or_default().push((action.to_string(), t));
    }
    let mut steps: Vec<(String, String, Vec<Duration>)> = Vec::new();
    for events in by_request.values() {
        if events.last().is_none_or(|(a, _)| a != "DeliverResult") {
            continue;
        }
        for (i, w) in events.windows(2).enumerate() {
            let d = Duration::from_millis(w[1].1.saturating_sub(w[0].1));
            match steps.get_mut(i) {
                Some(step) if step.0 == w[0].0 && step.1 == w[1].0 => step.2.push(d),
                Some(_) => {}
                None => steps.push((w[0].0.clone(), w[1].0.clone(), vec![d])),
            }
        }
        let total = Duration::from_millis(events[events.len() - 1].1.saturating_sub(events[0].1));
        match steps.iter_mut().find(|s| s.0 == "total") {
            Some(step) => step.2.push(total),
            None => steps.push(("total".into(), "".into(), vec![total])),
        }
    }
    steps.sort_by_key(|s| s.0 == "total");
    for s in &mut steps {
        s.2.sort();
    }
    steps
        .into_iter()
        .map(|(f, t, d)| if f == "total" { ("VerifyRequest".into(), "DeliverResult (total)".into(), d) } else { (f, t, d) })
        .collect()
}

/// Sessions and requests per session of the concurrency part.
const ESC_SESSIONS: usize = 8;
const ESC_CONCURRENT: usize = 100;

fn bench_escalate(n: usize) -> anyhow::Result<()> {
    use lazaret_tests::escalation::{Rule, developer_env, install_escprobe, rules_toml};
    anyhow::ensure!(n >= 10, "use at least 10 requests");
    let netns = lazaret_netpolicy::topology::Netns::create()?;
    let rules = rules_toml(&[Rule::new("true", &["true"]), Rule::new("echo", &["echo"]).extra_args()]);
    let mut env = developer_env(&format!("user = \"root\"\n{rules}"));
    env.netns = Some(netns.proc_path());
    let probe = install_escprobe(&env).display().to_string();

    // Round trips, timed inside one sandbox (its start-up not counted),
    // after a few warm-up requests; in the same session, two baselines:
    // spawning `true` in the sandbox, and `lazaret-escalate --version` (the
    // client's start without a connection).
    let warm = 20;
    let total = (n + warm).to_string();
    // The baselines need fewer runs; all four loops share one `lazaret
    // run`, which the test library gives two minutes.
    let base = (n.min(100) + warm).to_string();
    let script = format!(
        "{probe} time {base} -- true; echo --; {probe} time {base} -- lazaret-escalate --version; echo --; \
         {probe} requests {total} -- true; echo --; {probe} time {total} -- lazaret-escalate -- true"
    );
    let out = env.run(["run", "test", "--", "sh", "-c", &script]);
    anyhow::ensure!(out.status.success(), "the timing loops failed ({:?}): {}", out.status.code(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let sections: Vec<&str> = text.split("--\n").collect();
    anyhow::ensure!(sections.len() == 4, "expected four timing loops, got {}", sections.len());
    // Failed runs are counted, not timed.
    let timings = |section: &str| -> (Vec<Duration>, Vec<String>) {
        let failed = section.lines().filter(|l| l.starts_with("failed ")).map(String::from).collect();
        let mut d: Vec<Duration> =
            section.lines().skip(warm).filter_map(|l| l.trim().parse::<u64>().ok()).map(Duration::from_micros).collect();
        d.sort();
        (d, failed)
    };
    let (spawn, spawn_failed) = timings(sections[0]);
    let (version, version_failed) = timings(sections[1]);
    let (alone, alone_failed) = timings(sections[2]);
    let (inside, failures) = timings(sections[3]);
    anyhow::ensure!(spawn_failed.is_empty() && version_failed.is_empty(), "baselines failed: {spawn_failed:?} {version_failed:?}");
    anyhow::ensure!(inside.len() >= n / 2, "only {} of {n} requests succeeded: {failures:?}", inside.len());
    anyhow::ensure!(alone.len() >= n / 2, "only {} of {n} in-process requests succeeded: {alone_failed:?}", alone.len());
    let mut host = Vec::with_capacity(n);
    for i in 0..n + warm {
        let t = Instant::now();
        let status = Command::new("/bin/true").stdin(Stdio::null()).stdout(Stdio::null()).status()?;
        let d = t.elapsed();
        anyhow::ensure!(status.success(), "/bin/true failed");
        if i >= warm {
            host.push(d);
        }
    }
    host.sort();
    let row = |name: &str, d: &[Duration]| println!("{:<58} {:>10.2} {:>10.2}", name, quantile_ms(d, 0.5), quantile_ms(d, 0.99));
    let (hm, hp) = (quantile_ms(&host, 0.5), quantile_ms(&host, 0.99));
    let beyond = |d: &[Duration]| {
        let (m, p) = (quantile_ms(d, 0.5), quantile_ms(d, 0.99));
        let verdict = if m - hm <= 5.0 { "target met" } else { "target missed" };
        println!("{:<58} {:>10.2} {:>10.2}  {verdict}", "    beyond the host command (target: median <= 5 ms)", m - hm, p - hp);
    };
    println!("rule-approved `true`, {n} requests one after the other ({})", lazaret_bin().display());
    println!("{:<58} {:>10} {:>10}", "", "median ms", "p99 ms");
    row("true on the host (spawned by the bench)", &host);
    row("lazaret-escalate -- true process, inside the sandbox", &inside);
    beyond(&inside);
    row("request round trip alone, inside (no client start)", &alone);
    beyond(&alone);
    let steps = request_steps(&env);
    if let Some((_, _, total)) = steps.iter().find(|(_, to, _)| to.ends_with("(total)")) {
        row("coordinator: VerifyRequest -> DeliverResult (journal)", total);
    }
    println!("{:<58} {:>10}", "  requests that did not exit 0 (not timed)", failures.len() + alone_failed.len());
    if let Some(first) = failures.first().or(alone_failed.first()) {
        println!("    first: {first} ({})", String::from_utf8_lossy(&out.stderr).lines().next().unwrap_or(""));
    }
    println!("baselines inside the same sandbox");
    row("  spawning true", &spawn);
    row("  lazaret-escalate --version (no connection)", &version);
    println!("coordinator steps of the rule-approved requests (journal timestamps, ms resolution)");
    for (from, to, d) in &steps {
        row(&format!("  {from} -> {to}"), d);
    }
    println!();

    // Concurrency: every session starts its requests at once.
    let t = Instant::now();
    let mut sessions = Vec::new();
    for s in 0..ESC_SESSIONS {
        let prefix = format!("s{s}");
        let child = env
            .lazaret([
                "run",
                "test",
                "--",
                &probe,
                "concurrent",
                &ESC_CONCURRENT.to_string(),
                &prefix,
                "--",
                "lazaret-escalate",
                "--",
                "echo",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        sessions.push(child);
    }
    let outputs: Vec<std::process::Output> = sessions.into_iter().map(lazaret_tests::wait_output).collect();
    let wall = t.elapsed();
    use std::collections::{BTreeMap, HashMap};
    // Per client: its exit code and what it printed; per token: how often
    // it was printed by anyone.
    let mut clients: HashMap<String, (String, String)> = HashMap::new();
    let mut printed: HashMap<String, usize> = HashMap::new();
    let mut failed_sessions = 0;
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for out in &outputs {
        if !out.status.success() {
            failed_sessions += 1;
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Some((token, rest)) = line.split_once(" exit=") else { continue };
            let (exit, shown) = rest.split_once(" out=").unwrap_or((rest, ""));
            for p in shown.split("\\n").filter(|l| !l.is_empty()) {
                *printed.entry(p.to_string()).or_default() += 1;
            }
            clients.insert(token.to_string(), (exit.to_string(), shown.to_string()));
        }
        for line in String::from_utf8_lossy(&out.stderr).lines() {
            // "s3-17: lazaret-escalate: REASON": the reasons, Session IDs elided.
            if let Some((_, reason)) = line.split_once(": ") {
                let reason: String = reason
                    .split(' ')
                    .map(|w| if w.starts_with("s-") { "s-…" } else { w })
                    .collect::<Vec<_>>()
                    .join(" ")
                    .chars()
                    .take(100)
                    .collect();
                *reasons.entry(reason).or_default() += 1;
            }
        }
    }
    let expected: Vec<String> = (0..ESC_SESSIONS).flat_map(|s| (0..ESC_CONCURRENT).map(move |i| format!("s{s}-{i}"))).collect();
    let mut exits: BTreeMap<String, usize> = BTreeMap::new();
    let (mut exact, mut wrong_output, mut no_result) = (0, 0, 0);
    for token in &expected {
        match clients.get(token) {
            None => no_result += 1,
            Some((exit, shown)) => {
                *exits.entry(exit.clone()).or_default() += 1;
                if exit == "0" {
                    if *shown == format!("{token}\\n") {
                        exact += 1;
                    } else {
                        wrong_output += 1;
                    }
                }
            }
        }
    }
    let duplicated = printed.values().filter(|c| **c > 1).count();
    let foreign = printed.keys().filter(|t| !expected.contains(t)).count();
    println!("{ESC_SESSIONS} sessions x {ESC_CONCURRENT} concurrent requests (`echo TOKEN`, rule-approved)");
    println!("{:<48} {:>8}", "requests", expected.len());
    println!("{:<48} {:>8}", "exit 0 with exactly their own token", exact);
    println!("{:<48} {:>8}", "exit 0 with other output (lost or mixed)", wrong_output);
    println!("{:<48} {:>8}", "tokens printed more than once (duplicated)", duplicated);
    println!("{:<48} {:>8}", "lines that are no client's token", foreign);
    println!("{:<48} {:>8}", "clients that reported nothing", no_result);
    for (exit, count) in &exits {
        println!("{:<48} {:>8}", format!("clients exiting {exit}"), count);
    }
    println!("{:<48} {:>8}", "sessions that failed", failed_sessions);
    println!("{:<48} {:>8.0}", "wall time, ms", wall.as_secs_f64() * 1000.0);
    let lost = expected.len() - exact;
    println!(
        "summary: {ESC_SESSIONS} x {ESC_CONCURRENT} concurrent: {exact} completed, {lost} lost, {duplicated} duplicated, {:.0} ms wall",
        wall.as_secs_f64() * 1000.0
    );
    for (reason, count) in &reasons {
        println!("  stderr x{count}: {reason}");
    }
    drop(env);
    drop(netns);
    Ok(())
}

/// The guard's cost: see the module documentation.
fn bench_guard(files: usize, rounds: usize) -> anyhow::Result<()> {
    anyhow::ensure!(rounds >= 3, "use at least 3 rounds");
    let netns = lazaret_netpolicy::topology::Netns::create()?;
    let (uid, gid) = lazaret_tests::test_user();
    let mut rows = Vec::new();
    for (name, profile) in [("developer agent", ""), ("root agent, developer = test user", "user = \"root\"\n")] {
        let mut env = TestEnv::with_profile(profile);
        env.netns = Some(netns.proc_path());
        env.env.push(("SUDO_UID".into(), uid.to_string()));
        env.env.push(("SUDO_GID".into(), gid.to_string()));
        env.env.push(("LAZARET_TEST_HOOKS".into(), "1".into()));
        let ws = env.workspace.clone();
        tree_tarball(&ws.join("tree.tar"), files)?;
        lazaret_tests::git(&ws, &["add", "tree.tar"]);
        lazaret_tests::git(&ws, &["-c", "user.name=b", "-c", "user.email=b@example.invalid", "commit", "-qm", "tree"]);
        lazaret_tests::escalation::chown_tree(&ws, uid, gid);
        // Each round: remove the previous tree (untimed), then unpack and
        // `git status` (timed inside).
        let script = "rm -rf unpacked; mkdir unpacked; s=$(date +%s%N); tar -xf tree.tar -C unpacked; git status --porcelain >/dev/null; e=$(date +%s%N); echo $((e-s))";
        let mut inside = [Vec::new(), Vec::new()];
        let mut whole = [Vec::new(), Vec::new()];
        let lock = {
            let warm = env.run(["run", "test", "--", "sh", "-c", script]);
            anyhow::ensure!(warm.status.success(), "warm-up failed: {}", String::from_utf8_lossy(&warm.stderr));
            domain_lock(&env)?
        };
        for round in 0..rounds * 2 {
            let on = round % 2 == 1;
            anyhow::ensure!(lazaret_coordinator::client::wait_unlocked(&lock, DOWN_LIMIT), "the Domain did not go down");
            let mut cmd = env.lazaret(["run", "test", "--", "sh", "-c", script]);
            cmd.env("LAZARET_TEST_GUARD", if on { "on" } else { "off" }).stdout(Stdio::piped()).stderr(Stdio::piped());
            let t = Instant::now();
            let out = lazaret_tests::wait_output(cmd.spawn()?);
            anyhow::ensure!(out.status.success(), "the workspace-heavy run failed: {}", String::from_utf8_lossy(&out.stderr));
            anyhow::ensure!(lazaret_coordinator::client::wait_unlocked(&lock, DOWN_LIMIT), "the Domain did not go down");
            whole[usize::from(on)].push(t.elapsed());
            let ns: u64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
            inside[usize::from(on)].push(Duration::from_nanos(ns));
        }
        let log = std::fs::read_to_string(env.domain_dir().ok_or_else(|| anyhow::anyhow!("no Domain directory"))?.join("coordinator.log"))?;
        let last_sweep = log
            .lines()
            .rev()
            .find(|l| l.contains("workspace guard: sweep (Domain stop)"))
            .map(|l| l.split("] ").nth(1).unwrap_or(l).to_string())
            .unwrap_or_default();
        rows.push((name, inside, whole, last_sweep));
    }

    // Domain start: cold `lazaret run -- true`, alternating, and the
    // guard's own start from the log.
    let mut env = TestEnv::new();
    env.netns = Some(netns.proc_path());
    env.env.push(("LAZARET_TEST_HOOKS".into(), "1".into()));
    let warm = env.run(["run", "test", "--", "true"]);
    anyhow::ensure!(warm.status.success(), "lazaret run failed: {}", String::from_utf8_lossy(&warm.stderr));
    let lock = domain_lock(&env)?;
    let mut start = [Vec::new(), Vec::new()];
    for round in 0..rounds.max(10) * 2 {
        let on = round % 2 == 1;
        anyhow::ensure!(lazaret_coordinator::client::wait_unlocked(&lock, DOWN_LIMIT), "the Domain did not go down");
        let t = Instant::now();
        let status = env
            .lazaret(["run", "test", "--", "true"])
            .env("LAZARET_TEST_GUARD", if on { "on" } else { "off" })
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        start[usize::from(on)].push(t.elapsed());
        anyhow::ensure!(status.success(), "lazaret run failed");
    }
    anyhow::ensure!(lazaret_coordinator::client::wait_unlocked(&lock, DOWN_LIMIT), "the Domain did not go down");
    let log = std::fs::read_to_string(env.domain_dir().ok_or_else(|| anyhow::anyhow!("no Domain directory"))?.join("coordinator.log"))?;
    let mut guard_start: Vec<Duration> = log
        .lines()
        .filter_map(|l| l.split("workspace guard: started in ").nth(1))
        .filter_map(|r| r.trim_end_matches(" us").parse::<u64>().ok())
        .map(Duration::from_micros)
        .collect();
    guard_start.sort();

    println!(
        "Workspace Guard cost ({}): {files} files unpacked with tar inside the workspace, then git status inside; {rounds} rounds each, alternating",
        lazaret_bin().display()
    );
    println!("{:<52} {:>10} {:>10} {:>9}", "", "off ms", "on ms", "on/off");
    for (name, inside, whole, _) in &rows {
        let (off, on) = (stats(inside[0].clone()).0, stats(inside[1].clone()).0);
        println!("{:<52} {:>10.1} {:>10.1} {:>9.3}", format!("{name}: tar + git status (inside)"), off, on, on / off);
        let (off, on) = (stats(whole[0].clone()).0, stats(whole[1].clone()).0);
        println!("{:<52} {:>10.1} {:>10.1} {:>9.3}", format!("{name}: whole run until the Domain is down"), off, on, on / off);
    }
    println!("  (medians; target: on/off at most 1.05)");
    for (name, _, _, sweep) in &rows {
        println!("  {name}, last final sweep: {sweep}");
    }
    println!();
    let (off, on) = (stats(start[0].clone()), stats(start[1].clone()));
    println!("Domain start: cold `lazaret run test -- true`, {} runs each   median ms  p90 ms", start[0].len());
    println!("{:<52} {:>9.1} {:>7.1}", "guard off", off.0, off.1);
    println!("{:<52} {:>9.1} {:>7.1}", "guard on", on.0, on.1);
    println!("{:<52} {:>9.1} {:>7.1}", "  difference (noisy; target at most 10 ms)", on.0 - off.0, on.1 - off.1);
    if !guard_start.is_empty() {
        println!(
            "{:<52} {:>9.2} {:>7.2}",
            "guard start on the start path (coordinator log)",
            quantile_ms(&guard_start, 0.5),
            quantile_ms(&guard_start, 0.9)
        );
    }
    Ok(())
}

/// A tar archive at `path` of `files` small files in directories of 200.
fn tree_tarball(path: &Path, files: usize) -> anyhow::Result<()> {
    let src = tempfile::tempdir()?;
    for i in 0..files {
        let d = src.path().join(format!("d{:03}", i / 200));
        if i % 200 == 0 {
            std::fs::create_dir_all(&d)?;
        }
        std::fs::write(d.join(format!("f{i}.txt")), format!("{i}\n"))?;
    }
    let status = Command::new("tar").arg("-cf").arg(path).arg("-C").arg(src.path()).arg(".").status()?;
    anyhow::ensure!(status.success(), "tar failed");
    Ok(())
}
