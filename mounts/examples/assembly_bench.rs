//! Mount-assembly time for workspaces with 10, 100 and 1000 top-level
//! ignored paths (median of several runs), in a private mount namespace.
//!
//! Run as root: `cargo run -p lazaret-mounts --example assembly_bench`.

#![forbid(unsafe_code)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lazaret_mounts::ignore_eval::HostGitSettings;
use lazaret_mounts::plan::{WorkspaceOptions, assemble, plan_workspace};

const RUNS: usize = 7;

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    lazaret_mounts::enter_private_mount_namespace()?;
    println!("{:>8} {:>12} {:>12} {:>8}", "ignored", "plan (ms)", "assemble (ms)", "binds");
    for count in [10usize, 100, 1000] {
        let dir = tempfile::tempdir()?;
        let ws = dir.path().join("ws");
        std::fs::create_dir_all(&ws)?;
        let status = Command::new("git").current_dir(&ws).env("GIT_CONFIG_NOSYSTEM", "1").args(["init", "-q"]).status()?;
        if !status.success() {
            return Err("git init failed".into());
        }
        let mut gitignore = String::from("*.cache\n");
        for i in 0..count {
            if i % 2 == 0 {
                std::fs::create_dir_all(ws.join(format!("dep-{i}.cache")))?;
                std::fs::write(ws.join(format!("dep-{i}.cache/file")), "x")?;
            } else {
                gitignore.push_str(&format!("/out-{i}/\n"));
            }
        }
        std::fs::write(ws.join(".gitignore"), gitignore)?;
        let options = WorkspaceOptions {
            isolate_gitignored: true,
            host_git: HostGitSettings { home: Some(dir.path().join("home")), xdg_config_home: None, system_config: None },
            sandbox_workspace: "/workspace".into(),
            gate_repository_configs: false,
        };
        let domain = dir.path().join("domain");
        let (mut plan_times, mut assemble_times) = (Vec::new(), Vec::new());
        let mut binds = 0;
        for run in 0..RUNS {
            let start = Instant::now();
            let plan = plan_workspace(&ws, &domain, &options)?;
            plan_times.push(start.elapsed());
            let staging = dir.path().join(format!("run-{run}"));
            let start = Instant::now();
            let assembled = assemble(&plan, Path::new(&staging))?;
            assemble_times.push(start.elapsed());
            binds = assembled.binds.len();
            let _ = assembled.release();
        }
        println!(
            "{count:>8} {:>12.2} {:>12.2} {binds:>8}",
            median(plan_times).as_secs_f64() * 1e3,
            median(assemble_times).as_secs_f64() * 1e3
        );
    }
    Ok(())
}
