//! `lazaret doctor`: one line per prerequisite, with the fix for each that
//! fails.

use std::path::Path;

use lazaret_runtime::runsc::{kernel_major, MIN_RELEASE};
use lazaret_runtime::Runsc;

use crate::context::load_config;
use crate::identity::{self, Developer};

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// How to fix it, when it failed.
    pub fix: Option<String>,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:<4} {}: {}", if self.ok { "OK" } else { "FAIL" }, self.name, self.detail)?;
        if let Some(fix) = &self.fix {
            write!(f, "\n     fix: {fix}")?;
        }
        Ok(())
    }
}

fn pass(name: &str, detail: impl Into<String>) -> Check {
    Check { name: name.into(), ok: true, detail: detail.into(), fix: None }
}

fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { name: name.into(), ok: false, detail: detail.into(), fix: Some(fix.into()) }
}

/// Runs every check. Nothing is changed on the host except creating
/// Lazaret's own state directories when they are missing.
pub fn run_checks(config_path: Option<&Path>) -> Vec<Check> {
    let mut checks = Vec::new();
    checks.push(if nix::unistd::geteuid().is_root() {
        pass("root", "running as root")
    } else {
        fail("root", "not running as root", "run lazaret with sudo")
    });

    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    checks.push(pass("kernel", format!("Linux {release}")));
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    checks.push(if filesystems.lines().any(|l| l.trim_end().ends_with("overlay")) {
        pass("overlayfs", "available")
    } else {
        fail("overlayfs", "not in /proc/filesystems", "load it: modprobe overlay")
    });
    let missing: Vec<&str> = ["pid", "ipc", "uts", "net", "mnt", "cgroup", "user"]
        .into_iter()
        .filter(|ns| !Path::new("/proc/self/ns").join(ns).exists())
        .collect();
    checks.push(if missing.is_empty() {
        pass("namespaces", "pid, ipc, uts, net, mnt, cgroup, user")
    } else {
        fail("namespaces", format!("missing: {}", missing.join(", ")), "use a kernel with these namespaces enabled")
    });
    let v1 = Path::new("/sys/fs/cgroup/memory").is_dir() && Path::new("/sys/fs/cgroup/pids").is_dir();
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    checks.push(if v1 || v2 {
        pass("cgroups", if v2 { "cgroup v2" } else { "cgroup v1 (memory, pids)" })
    } else {
        fail("cgroups", "no memory/pids controllers under /sys/fs/cgroup", "mount the cgroup hierarchies (systemd does this at boot)")
    });

    let developer = Developer::from_process();
    let config = match &developer {
        Ok(dev) => match load_config(config_path, dev) {
            Ok(c) => {
                checks.push(pass("config", format!("{} ({} profiles)", c.file.display(), c.profiles.len())));
                Some(c)
            }
            Err(e) => {
                checks.push(fail("config", e.to_string(), "fix the file, or create one from docs/config.example.toml"));
                None
            }
        },
        Err(e) => {
            checks.push(fail("developer", e.to_string(), "run as root directly or through sudo"));
            None
        }
    };

    let configured = config.as_ref().and_then(|c| c.runsc.path.clone());
    match Runsc::locate(configured.as_deref()) {
        Err(e) => checks.push(fail("runsc", e.to_string(), "scripts/install-runsc.sh")),
        Ok(path) => match Runsc::probe(&path) {
            Err(e) => checks.push(fail("runsc", e.to_string(), "scripts/install-runsc.sh")),
            Ok(info) => {
                if info.release < MIN_RELEASE {
                    checks.push(fail(
                        "runsc",
                        format!("{} is release {}, older than {MIN_RELEASE}", path.display(), info.release),
                        "scripts/install-runsc.sh installs Debian 13's runsc into /usr/local/bin",
                    ));
                } else {
                    checks.push(pass("runsc", format!("{} ({})", path.display(), info.version)));
                }
                let platforms = if info.systrap { "systrap, ptrace" } else { "ptrace" };
                checks.push(pass("runsc platforms", platforms));
                checks.push(if info.overlay2 {
                    pass("runsc --overlay2", "supported")
                } else {
                    fail("runsc --overlay2", "not supported", "scripts/install-runsc.sh")
                });
                checks.push(pass("runsc --host-uds", if info.host_uds { "supported" } else { "absent (not needed)" }));
                checks.push(pass("runsc directfs", if info.directfs { "supported" } else { "absent" }));
                let needed = info.needs_netns_workaround(kernel_major());
                checks.push(pass(
                    "netns work-around",
                    if needed { "needed (runsc <= 20240729 on kernel >= 6): applied to `runsc start` automatically" } else { "not needed" },
                ));
            }
        },
    }

    if let (Ok(dev), Some(cfg)) = (&developer, &config) {
        checks.push(match identity::ensure_storage_root(&cfg.storage_root) {
            Ok(()) => pass("storage root", format!("{} (root-owned, private)", cfg.storage_root.display())),
            Err(e) => fail("storage root", e.to_string(), "see the hint above"),
        });
        let rt = cfg.runtime_dir(dev);
        checks.push(match identity::ensure_runtime_dir(&rt, dev) {
            Ok(()) => pass("runtime dir", format!("{} (uid {}, mode 0700)", rt.display(), dev.uid)),
            Err(e) => fail("runtime dir", e.to_string(), "see the hint above"),
        });
    }
    checks
}
