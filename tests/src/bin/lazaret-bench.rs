//! Lazaret's benchmarks. Each prints a table; none asserts anything.
//!
//! `lazaret-bench run [RUNS]`: end-to-end `lazaret run test -- true` against
//! a bare `runsc run` of an equivalent bundle (same image overlay, argv,
//! user, flags), median and p90 of each, and their ratio.
//!
//! Run it through `scripts/bench.sh`, which builds release binaries first.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lazaret_oci::bundle::{BundleSpec, CapabilityPolicy};
use lazaret_tests::{lazaret_bin, TestEnv, TEST_IMAGE, TEST_STORAGE};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => bench_run(args.get(1).map(|s| s.parse()).transpose()?.unwrap_or(20)),
        _ => {
            eprintln!("usage: lazaret-bench run [RUNS]");
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
    let env = TestEnv::new();
    // Warm up caches (image files, binaries) once for both.
    let warm = env.run(["run", "test", "--", "true"]);
    anyhow::ensure!(warm.status.success(), "lazaret run failed: {}", String::from_utf8_lossy(&warm.stderr));

    let mut lazaret = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let status = env.lazaret(["run", "test", "--", "true"]).stdout(Stdio::null()).stderr(Stdio::null()).status()?;
        lazaret.push(t.elapsed());
        anyhow::ensure!(status.success(), "lazaret run failed");
    }

    let bare = bare_runsc(runs)?;
    let (lm, lp) = stats(lazaret);
    let (bm, bp) = stats(bare);
    println!("lazaret run vs bare runsc run, `true`, {runs} runs each ({})", lazaret_bin().display());
    println!("{:<28} {:>10} {:>10}", "", "median ms", "p90 ms");
    println!("{:<28} {:>10.1} {:>10.1}", "lazaret run test -- true", lm, lp);
    println!("{:<28} {:>10.1} {:>10.1}", "runsc run (same bundle)", bm, bp);
    println!("{:<28} {:>10.2} {:>10.2}", "ratio", lm / bm, lp / bp);
    Ok(())
}

/// Times `runsc run` of a bundle equivalent to what `lazaret run` writes,
/// in a child process with its own mount namespace for the rootfs overlay.
fn bare_runsc(runs: usize) -> anyhow::Result<Vec<Duration>> {
    let store = lazaret_oci::ImageStore::open(&Path::new(TEST_STORAGE).join("images"))?;
    let image = store.get(TEST_IMAGE)?.ok_or_else(|| anyhow::anyhow!("test image missing"))?;
    let work = tempfile::Builder::new().prefix("lazaret-bench-").tempdir_in("/run")?;
    let dir = work.path();
    for d in ["rootfs", "upper", "work", "bundle", "state"] {
        std::fs::create_dir(dir.join(d))?;
    }
    let spec = BundleSpec {
        args: vec!["true".into()],
        env: vec![("PATH".into(), "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()), ("HOME".into(), "/root".into())],
        cwd: "/".into(),
        uid: 0,
        gid: 0,
        additional_gids: Vec::new(),
        hostname: "bench".into(),
        terminal: false,
        rootfs: dir.join("rootfs"),
        mounts: Vec::new(),
        network_namespace: None,
        cgroups_path: "/lazaret/bench/bare".into(),
        capabilities: CapabilityPolicy::DefaultRoot,
        rlimits: Vec::new(),
        memory_limit: None,
        pids_limit: None,
    };
    lazaret_oci::bundle::write_bundle(&dir.join("bundle"), &spec)?;
    let runsc = Command::new("sh").args(["-c", "command -v runsc"]).output()?;
    let runsc = PathBuf::from(String::from_utf8_lossy(&runsc.stdout).trim());
    // One shell in a private mount namespace mounts the overlay and runs the
    // timed loop, printing one duration (ns) per line.
    let script = format!(
        "set -e; mount --make-rprivate /; mount -t overlay overlay -o lowerdir={lower},upperdir={d}/upper,workdir={d}/work {d}/rootfs; \
         for i in $(seq {runs}); do s=$(date +%s%N); {runsc} --root {d}/state --platform=systrap --overlay2=root:memory --network=none --host-uds=none run --bundle {d}/bundle bare-$i >/dev/null; e=$(date +%s%N); echo $((e-s)); done",
        lower = image.rootfs.display(),
        d = dir.display(),
        runsc = runsc.display(),
    );
    let out = Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script]).output()?;
    anyhow::ensure!(out.status.success(), "bare runsc loop failed: {}", String::from_utf8_lossy(&out.stderr));
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
        let _ = std::fs::remove_dir(hierarchy.path().join("lazaret/bench/bare"));
        let _ = std::fs::remove_dir(hierarchy.path().join("lazaret/bench"));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.trim().parse::<u64>().ok()).map(Duration::from_nanos).collect())
}
