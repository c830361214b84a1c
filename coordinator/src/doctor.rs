//! `lazaret doctor`: one line per prerequisite, with the fix for each that
//! fails, and a warning with its reason for each part of this host's
//! configuration that lies outside the supported matrix (the
//! configurations `scripts/matrix.sh` runs the security suite on; the list
//! is [`TESTED_KERNELS`], [`TESTED_RUNSC_RELEASES`],
//! [`SUPPORTED_PLATFORMS`], [`SUPPORTED_FILESYSTEMS`] and the host network
//! kinds of [`classify_network`], documented in docs/supported.md).

use std::path::Path;

use lazaret_netpolicy::topology::{self, Netns};
use lazaret_runtime::Runsc;
use lazaret_runtime::runsc::{MIN_RELEASE, Platform, kernel_major};

use crate::context::load_config;
use crate::identity::{self, Developer, Workspace};

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
    /// Why what was found lies outside the supported configurations, when
    /// it does but still works (the check passed with a warning).
    pub warning: Option<String>,
}

fn pass(name: &str, detail: impl Into<String>) -> Check {
    Check { name: name.into(), ok: true, detail: detail.into(), fix: None, warning: None }
}

fn fail(name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
    Check { name: name.into(), ok: false, detail: detail.into(), fix: Some(fix.into()), warning: None }
}

/// A passing check, or a warning with its reason when `support` says the
/// configuration is outside the supported list.
fn supported(name: &str, detail: impl Into<String>, support: Support) -> Check {
    let mut check = pass(name, detail);
    match support {
        Support::Supported => {}
        Support::Unsupported(reason) => check.warning = Some(reason),
        Support::Broken { reason, fix } => {
            check.ok = false;
            check.detail = format!("{}: {reason}", check.detail);
            check.fix = Some(fix);
        }
    }
    check
}

/// Where a part of the host's configuration stands against the supported
/// matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// In the supported list: the security suite runs on it.
    Supported,
    /// Outside the list but expected to work: a warning, with the reason.
    Unsupported(String),
    /// Cannot work: a failure, with the reason and the fix.
    Broken {
        /// Why it cannot work.
        reason: String,
        /// What to do about it.
        fix: String,
    },
}

/// Kernel series (major, minor) the security matrix has run on.
pub const TESTED_KERNELS: &[(u32, u32)] = &[(6, 18)];
/// The oldest kernel Lazaret can run on at all: the new mount API
/// (`open_tree`, `mount_setattr`, `move_mount`) arrived in 5.12.
pub const MIN_KERNEL: (u32, u32) = (5, 12);
/// The first kernel with per-interface IPv6 `force_forwarding`, which a
/// Domain's IPv6 needs.
pub const IPV6_KERNEL: (u32, u32) = (6, 17);
/// runsc releases (YYYYMMDD) the security matrix has run on: the one
/// `scripts/install-runsc.sh` installs (Debian 13's package).
pub const TESTED_RUNSC_RELEASES: &[u32] = &[20240729];
/// The runsc platforms the security matrix runs on.
pub const SUPPORTED_PLATFORMS: &[Platform] = &[Platform::Systrap, Platform::Ptrace];
/// Filesystems (statfs magic, name) the security matrix runs the
/// workspace and the Storage Root on. ext2 and ext3 share ext4's magic
/// (and are served by the ext4 driver on current kernels).
pub const SUPPORTED_FILESYSTEMS: &[(i64, &str)] = &[(0xEF53, "ext4"), (0x5846_5342, "xfs"), (0x9123_683E, "btrfs"), (0x0102_1994, "tmpfs")];
/// Names of other filesystems a workspace or Storage Root may be on, for
/// the warning's text.
const OTHER_FILESYSTEMS: &[(i64, &str)] = &[
    (0x794C_7630, "overlayfs"),
    (0x6969, "nfs"),
    (0xFF53_4D42, "cifs"),
    (0xFE53_4D42, "smb2"),
    (0x2FC1_2FC1, "zfs"),
    (0xF2F5_2010, "f2fs"),
    (0x6573_5546, "fuse"),
    (0x5346_544E, "ntfs"),
    (0x4D44, "vfat"),
    (0x7371_7368, "squashfs"),
    (0x8584_58F6, "ramfs"),
    (0x0102_1997, "9p"),
    (0xCA45_1A4E, "bcachefs"),
];

/// (major, minor) of a kernel release string such as `6.18.44-fc-v1045`.
pub fn parse_kernel(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Where the kernel `release` stands.
pub fn classify_kernel(release: &str) -> Support {
    let Some(version) = parse_kernel(release) else {
        return Support::Unsupported(format!("cannot read the kernel version {release:?}; the security suite ran on {}", tested_kernels()));
    };
    if version < MIN_KERNEL {
        return Support::Broken {
            reason: format!(
                "older than {}.{}, which brought the mount API Lazaret uses (open_tree, mount_setattr, move_mount)",
                MIN_KERNEL.0, MIN_KERNEL.1
            ),
            fix: format!("use a kernel of {} (tested) or at least {}.{}", tested_kernels(), MIN_KERNEL.0, MIN_KERNEL.1),
        };
    }
    if TESTED_KERNELS.contains(&version) {
        return Support::Supported;
    }
    let mut reason = format!(
        "Linux {}.{} is not in the tested matrix (the security suite ran on {}); run scripts/matrix.sh on it",
        version.0,
        version.1,
        tested_kernels()
    );
    if version < IPV6_KERNEL {
        reason.push_str(&format!("; before {}.{} sandboxes get no IPv6 (no per-interface force_forwarding)", IPV6_KERNEL.0, IPV6_KERNEL.1));
    }
    Support::Unsupported(reason)
}

fn tested_kernels() -> String {
    TESTED_KERNELS.iter().map(|(major, minor)| format!("{major}.{minor}")).collect::<Vec<_>>().join(", ")
}

/// Where a runsc release (YYYYMMDD, already at least [`MIN_RELEASE`]) stands.
pub fn classify_runsc(release: u32) -> Support {
    if TESTED_RUNSC_RELEASES.contains(&release) {
        return Support::Supported;
    }
    let tested = TESTED_RUNSC_RELEASES.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    Support::Unsupported(format!(
        "runsc release {release} is not in the tested matrix (tested: {tested}, which scripts/install-runsc.sh installs); run scripts/matrix.sh with it"
    ))
}

/// Where the configured platform stands, given whether `/dev/kvm` exists.
pub fn classify_platform(platform: Platform, kvm_device: bool) -> Support {
    if SUPPORTED_PLATFORMS.contains(&platform) {
        return Support::Supported;
    }
    match platform {
        Platform::Kvm if !kvm_device => Support::Broken {
            reason: "runsc's KVM platform needs /dev/kvm, which this host lacks".into(),
            fix: "set `[runsc] platform = \"systrap\"` (the default) or \"ptrace\"".into(),
        },
        _ => Support::Unsupported(format!(
            "platform {} is not in the tested matrix (systrap, ptrace): on the project's machines (nested virtualisation) runsc's KVM sandbox never starts",
            platform.as_flag()
        )),
    }
}

/// The name of a filesystem by its statfs magic, and where it stands as
/// the workspace's or the Storage Root's filesystem.
pub fn classify_filesystem(magic: i64) -> (String, Support) {
    if let Some((_, name)) = SUPPORTED_FILESYSTEMS.iter().find(|(m, _)| *m == magic) {
        return ((*name).to_string(), Support::Supported);
    }
    let name = OTHER_FILESYSTEMS
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| (*name).to_string())
        .unwrap_or_else(|| format!("filesystem 0x{magic:x}"));
    let supported = SUPPORTED_FILESYSTEMS.iter().map(|(_, name)| *name).collect::<Vec<_>>().join(", ");
    let reason = format!(
        "{name} is not in the tested matrix ({supported}): Git Sentry's read-only binds, the overlays of isolated paths and persistent_dirs and the image store are only tested there"
    );
    (name, Support::Unsupported(reason))
}

/// The kind of host network, from whether the host has an IPv4 default
/// route and a global IPv6 route, and where it stands.
pub fn classify_network(ipv4_default: bool, ipv6_global: bool) -> (&'static str, Support) {
    match (ipv4_default, ipv6_global) {
        (true, true) => ("dual-stack", Support::Supported),
        (true, false) => ("IPv4-only", Support::Supported),
        (false, true) => ("IPv6-only", Support::Unsupported("IPv6-only hosts are not in the tested matrix (IPv4-only and dual-stack are); sandboxes get no IPv4 egress".into())),
        (false, false) => ("no default route", Support::Unsupported("a host without a default route is not in the tested matrix (IPv4-only and dual-stack are); sandboxes reach nothing beyond this host".into())),
    }
}

/// Whether `/proc/net/route` text has an IPv4 default route that is up and
/// not a reject route.
pub fn has_ipv4_default_route(proc_net_route: &str) -> bool {
    const RTF_UP: u32 = 0x1;
    const RTF_REJECT: u32 = 0x200;
    proc_net_route.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(destination), Some(flags), Some(mask)) = (fields.get(1), fields.get(3), fields.get(7)) else { return false };
        let flags = u32::from_str_radix(flags, 16).unwrap_or(0);
        *destination == "00000000" && *mask == "00000000" && flags & RTF_UP != 0 && flags & RTF_REJECT == 0
    })
}

/// The statfs magic of the filesystem holding `path`.
fn filesystem_magic(path: &Path) -> Result<i64, nix::Error> {
    // The magic's C type varies by target; every magic fits an i64.
    #[allow(clippy::useless_conversion)]
    nix::sys::statfs::statfs(path).map(|s| i64::from(s.filesystem_type().0))
}

/// The filesystem check of `path` (the workspace or the Storage Root).
fn filesystem_check(name: &str, path: &Path) -> Check {
    match filesystem_magic(path) {
        Ok(magic) => {
            let (fs, support) = classify_filesystem(magic);
            supported(name, format!("{fs} ({})", path.display()), support)
        }
        Err(e) => fail(name, format!("statfs {}: {e}", path.display()), "check that the directory exists and is readable by root"),
    }
}

/// The host network check: its kind, and whether sandboxes get IPv6 by
/// default (the product's own decision).
fn network_check() -> Check {
    let ipv4 = has_ipv4_default_route(&std::fs::read_to_string("/proc/net/route").unwrap_or_default());
    let host = match Netns::of_current_thread() {
        Ok(host) => host,
        Err(e) => return fail("host network", format!("cannot open this network namespace: {e}"), "run lazaret doctor as root"),
    };
    let ipv6 = match topology::host_has_global_ipv6_route(&host) {
        Ok(ipv6) => ipv6,
        Err(e) => return fail("host network", format!("cannot read the routes: {e}"), "run lazaret doctor as root"),
    };
    let (kind, support) = classify_network(ipv4, ipv6);
    let sandbox_ipv6 = ipv6 && topology::host_can_forward_ipv6(&host).unwrap_or(false);
    supported("host network", format!("{kind} (sandbox IPv6 by default: {})", if sandbox_ipv6 { "on" } else { "off" }), support)
}

/// Runs every check for the workspace at or above `dir` (else `dir`
/// itself). Nothing is changed on the host except creating Lazaret's own
/// state directories when they are missing.
pub fn run_checks(config_path: Option<&Path>, dir: &Path) -> Vec<Check> {
    let mut checks = Vec::new();
    checks.push(if nix::unistd::geteuid().is_root() {
        pass("root", "running as root")
    } else {
        fail("root", "not running as root", "run lazaret with sudo")
    });

    let release = nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default();
    checks.push(supported("kernel", format!("Linux {release}"), classify_kernel(&release)));
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
        fail("cgroups", "no memory/pids controllers under /sys/fs/cgroup", "mount the cgroup hierarchies (systemd does this at boot); under `ip netns exec`, which mounts a fresh /sys without them, use `nsenter --net=/run/netns/NAME` instead")
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
                    checks.push(supported("runsc release", info.release.to_string(), classify_runsc(info.release)));
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

    if let Some(cfg) = &config {
        let platform = cfg.runsc.platform;
        checks.push(supported(
            "platform",
            format!("{} (`[runsc] platform`)", platform.as_flag()),
            classify_platform(platform, Path::new("/dev/kvm").exists()),
        ));
    }
    checks.push(network_check());
    match Workspace::discover(dir) {
        Ok(workspace) => checks.push(filesystem_check("workspace fs", workspace.root())),
        Err(_) => checks.push(filesystem_check("workspace fs", dir)),
    }

    if let (Ok(dev), Some(cfg)) = (&developer, &config) {
        checks.push(match identity::ensure_storage_root(&cfg.storage_root) {
            Ok(()) => pass("storage root", format!("{} (root-owned, private)", cfg.storage_root.display())),
            Err(e) => fail("storage root", e.to_string(), "see the hint above"),
        });
        if cfg.storage_root.is_dir() {
            checks.push(filesystem_check("storage root fs", &cfg.storage_root));
        }
        let rt = cfg.runtime_dir(dev);
        checks.push(match identity::ensure_runtime_dir(&rt, dev) {
            Ok(()) => pass("runtime dir", format!("{} (uid {}, mode 0700)", rt.display(), dev.uid)),
            Err(e) => fail("runtime dir", e.to_string(), "see the hint above"),
        });
    }
    checks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warned(support: &Support) -> bool {
        matches!(support, Support::Unsupported(_))
    }

    #[test]
    fn kernel_versions_parse_from_release_strings() {
        assert_eq!(parse_kernel("6.18.44-fc-v1045"), Some((6, 18)));
        assert_eq!(parse_kernel("6.1.0-27-amd64"), Some((6, 1)));
        assert_eq!(parse_kernel("5.15"), Some((5, 15)));
        assert_eq!(parse_kernel("6"), None);
        assert_eq!(parse_kernel(""), None);
        assert_eq!(parse_kernel("linux"), None);
    }

    #[test]
    fn the_tested_kernel_is_supported_others_warn_and_too_old_ones_fail() {
        assert_eq!(classify_kernel("6.18.44-fc-v1045"), Support::Supported);
        assert_eq!(classify_kernel("6.18.0"), Support::Supported);
        let Support::Unsupported(newer) = classify_kernel("6.19.1") else { panic!("6.19 should warn") };
        assert!(newer.contains("6.19") && newer.contains("6.18") && !newer.contains("IPv6"), "{newer}");
        let Support::Unsupported(debian12) = classify_kernel("6.1.0-27-amd64") else { panic!("6.1 should warn") };
        assert!(debian12.contains("no IPv6"), "{debian12}");
        assert!(matches!(classify_kernel("5.10.0-30-amd64"), Support::Broken { .. }));
        assert!(matches!(classify_kernel("4.19.0"), Support::Broken { .. }));
        assert!(warned(&classify_kernel("5.12.0")));
        assert!(warned(&classify_kernel("garbage")));
    }

    #[test]
    fn only_the_tested_runsc_release_is_supported() {
        assert_eq!(classify_runsc(20240729), Support::Supported);
        let Support::Unsupported(reason) = classify_runsc(20250101) else { panic!("a newer runsc should warn") };
        assert!(reason.contains("20250101") && reason.contains("20240729"), "{reason}");
    }

    #[test]
    fn systrap_and_ptrace_are_supported_kvm_warns_or_fails_without_the_device() {
        assert_eq!(classify_platform(Platform::Systrap, false), Support::Supported);
        assert_eq!(classify_platform(Platform::Ptrace, false), Support::Supported);
        let Support::Unsupported(reason) = classify_platform(Platform::Kvm, true) else { panic!("kvm should warn") };
        assert!(reason.contains("kvm") && reason.contains("never starts"), "{reason}");
        assert!(matches!(classify_platform(Platform::Kvm, false), Support::Broken { .. }));
    }

    #[test]
    fn ext4_xfs_btrfs_and_tmpfs_are_supported_and_others_warn_by_name() {
        for (magic, name) in [(0xEF53, "ext4"), (0x5846_5342, "xfs"), (0x9123_683E, "btrfs"), (0x0102_1994, "tmpfs")] {
            assert_eq!(classify_filesystem(magic), (name.to_string(), Support::Supported));
        }
        let (name, support) = classify_filesystem(0x6969);
        assert_eq!(name, "nfs");
        let Support::Unsupported(reason) = support else { panic!("nfs should warn") };
        assert!(reason.contains("nfs") && reason.contains("ext4, xfs, btrfs, tmpfs"), "{reason}");
        let (name, support) = classify_filesystem(0x1234_5678);
        assert_eq!(name, "filesystem 0x12345678");
        assert!(warned(&support));
        assert!(warned(&classify_filesystem(0x794C_7630).1), "overlayfs");
    }

    #[test]
    fn the_filesystem_of_a_real_directory_is_named() {
        let magic = filesystem_magic(Path::new("/")).expect("statfs /");
        let (name, _) = classify_filesystem(magic);
        assert!(!name.is_empty());
    }

    #[test]
    fn ipv4_only_and_dual_stack_hosts_are_supported() {
        assert_eq!(classify_network(true, true), ("dual-stack", Support::Supported));
        assert_eq!(classify_network(true, false), ("IPv4-only", Support::Supported));
        assert!(warned(&classify_network(false, true).1));
        assert!(warned(&classify_network(false, false).1));
    }

    #[test]
    fn the_ipv4_default_route_is_read_from_proc_net_route() {
        let header = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n";
        let default = "eth0\t00000000\t0100A8C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
        let lan = "eth0\t0000A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        let reject = "lo\t00000000\t00000000\t0201\t0\t0\t0\t00000000\t0\t0\t0\n";
        assert!(has_ipv4_default_route(&format!("{header}{lan}{default}")));
        assert!(!has_ipv4_default_route(&format!("{header}{lan}")));
        assert!(!has_ipv4_default_route(&format!("{header}{reject}")));
        assert!(!has_ipv4_default_route(header));
        assert!(!has_ipv4_default_route(""));
        // The header alone never counts, even if it looked like a route.
        assert!(!has_ipv4_default_route("x 00000000 0 1 0 0 0 00000000"));
    }

    #[test]
    fn a_warning_keeps_its_reason_and_a_failure_its_fix() {
        let warning = supported("kernel", "Linux 6.1.0", Support::Unsupported("not tested".into()));
        assert!(warning.ok);
        assert_eq!((warning.warning.as_deref(), warning.fix.as_deref()), (Some("not tested"), None));
        let broken = supported("kernel", "Linux 5.10", Support::Broken { reason: "too old".into(), fix: "upgrade".into() });
        assert!(!broken.ok);
        assert_eq!(
            (broken.detail.as_str(), broken.fix.as_deref(), broken.warning.as_deref()),
            ("Linux 5.10: too old", Some("upgrade"), None)
        );
        let fine = supported("kernel", "Linux 6.18.1", Support::Supported);
        assert!(fine.ok && fine.warning.is_none() && fine.fix.is_none());
    }
}
