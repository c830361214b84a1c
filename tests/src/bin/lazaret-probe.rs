//! A probe run inside the sandbox by the end-to-end tests. It checks things
//! from within and reports with sentinel exit codes, so that a probe that
//! crashed, was not found or never ran cannot pass by accident:
//!
//! - 42: every assertion held;
//! - 43: an assertion failed (the reason is on stderr);
//! - anything else: the probe did not run properly.
//!
//! Usage: `lazaret-probe CHECK [ARGS...] [-- CHECK [ARGS...]]...`

use std::path::Path;

const PASS: i32 = 42;
const FAIL: i32 = 43;
const USAGE: i32 = 2;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!("usage: lazaret-probe CHECK [ARGS...] [-- CHECK ...]");
        std::process::exit(USAGE);
    }
    for check in args.split(|a| a == "--") {
        if let Err(msg) = run(check) {
            eprintln!("probe: FAILED: {msg}");
            std::process::exit(FAIL);
        }
    }
    std::process::exit(PASS);
}

fn run(check: &[String]) -> Result<(), String> {
    let (name, rest) = check.split_first().ok_or("empty check")?;
    match name.as_str() {
        // The kernel answering is gVisor's, not the host's.
        "gvisor" => {
            let host_release = rest.first().ok_or("gvisor HOST_RELEASE")?;
            let uts = nix::sys::utsname::uname().map_err(|e| format!("uname: {e}"))?;
            let release = uts.release().to_string_lossy().into_owned();
            if release == *host_release {
                return Err(format!("kernel release {release:?} is the host's"));
            }
            let version = std::fs::read_to_string("/proc/version").map_err(|e| format!("/proc/version: {e}"))?;
            if version.contains(host_release.as_str()) {
                return Err(format!("/proc/version {version:?} names the host kernel"));
            }
            Ok(())
        }
        // None of the given host PIDs exists here, and the PID namespace is
        // small (the sandbox's own processes only).
        "no-host-pids" => {
            let mut count = 0;
            for e in std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?.flatten() {
                if e.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()) {
                    count += 1;
                }
            }
            if count > 16 {
                return Err(format!("{count} processes visible"));
            }
            for pid in rest {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                if comm.trim() == "lazaret" || comm.trim().starts_with("e2e") {
                    return Err(format!("host process {pid} ({}) is visible", comm.trim()));
                }
            }
            Ok(())
        }
        // Each path cannot be opened for reading.
        "cannot-read" => {
            for p in rest {
                if std::fs::File::open(p).is_ok() {
                    return Err(format!("{p} is readable"));
                }
            }
            Ok(())
        }
        "write" => {
            let [path, content] = rest else { return Err("write PATH CONTENT".into()) };
            std::fs::write(path, content).map_err(|e| format!("writing {path}: {e}"))
        }
        "read" => {
            let [path, expected] = rest else { return Err("read PATH EXPECTED".into()) };
            let got = std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))?;
            if &got == expected { Ok(()) } else { Err(format!("{path} holds {got:?}, expected {expected:?}")) }
        }
        "cannot-write" => {
            for p in rest {
                if std::fs::write(p, "x").is_ok() {
                    return Err(format!("{p} is writable"));
                }
            }
            Ok(())
        }
        "ids" => {
            let [uid, gid] = rest else { return Err("ids UID GID".into()) };
            let (u, g) = (nix::unistd::getuid().as_raw().to_string(), nix::unistd::getgid().as_raw().to_string());
            if &u == uid && &g == gid { Ok(()) } else { Err(format!("running as {u}:{g}, expected {uid}:{gid}")) }
        }
        "hostname-is-not" => {
            let [host] = rest else { return Err("hostname-is-not NAME".into()) };
            let name = nix::unistd::gethostname().map_err(|e| e.to_string())?;
            if name.to_string_lossy() == host.as_str() { Err(format!("hostname is the host's: {host}")) } else { Ok(()) }
        }
        "exists" => {
            for p in rest {
                if !Path::new(p).exists() {
                    return Err(format!("{p} does not exist"));
                }
            }
            Ok(())
        }
        other => Err(format!("unknown check {other:?}")),
    }
}
