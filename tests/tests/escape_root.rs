//! Escape corpus: mount and namespace tricks of a root agent (issue 17).
//! A root agent (allowed from a root-owned configuration, as TestEnv's is)
//! tries to lift Git Sentry's read-only binds (umount, lazy umount,
//! remount read-write, in its own mount and user namespaces), to reach the
//! host's file system (open_by_handle_at, a fresh procfs, a devtmpfs, the
//! host's namespaces through /proc/1/ns), to run a program on the host
//! (cgroup v1 release_agent), to load a kernel module and to set the clock.
//! Every attempt must fail; binds and mounts it may make stay inside the
//! sandbox: on the host the protected files, the hostname and the markers
//! a host-side program would leave are as before.

use std::fs;
use std::path::Path;

use lazaret_tests::escape;
use lazaret_tests::*;

#[test]
fn a_root_agent_cannot_lift_protections_or_reach_the_host_with_mounts_and_namespaces() {
    let env = TestEnv::new();
    let ws = env.workspace.clone();
    fs::write(ws.join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n").expect("hook");
    let config_before = fs::read(ws.join(".git/config")).expect("config");
    let hostname_before = fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    let marker = env.scratch.join("host-only-marker");
    fs::write(&marker, "host\n").expect("marker");
    // What a program the agent got the host to run would leave.
    let ran = env.scratch.join("ran-on-host");
    let host_disks: Vec<String> =
        fs::read_dir("/sys/block").expect("/sys/block").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();

    let script = format!(
        r#"MARKER={marker}; RAN={ran}; HOSTPID={pid}; DISKS='{disks}'
printf '#!/bin/sh\ntouch %s\n' "$RAN" > /tmp/evil.sh; chmod +x /tmp/evil.sh
echo "case capabilities: $(grep CapEff /proc/self/status)"
must_fail umount-config-then-write sh -c 'umount "$1/.git/config" && echo evil >> "$1/.git/config"' - "$W"
must_fail lazy-umount-hooks-then-plant sh -c 'umount -l "$1/.git/hooks" && cp /tmp/evil.sh "$1/.git/hooks/post-commit"' - "$W"
must_fail remount-config-rw-then-write sh -c 'mount -o remount,bind,rw "$1/.git/config" && echo evil >> "$1/.git/config"' - "$W"
must_fail remount-workspace-parent-then-write sh -c 'mount -o remount,rw "$1" && echo evil >> "$1/.git/config"' - "$W"
must_fail umount-in-new-mount-ns-then-write unshare -m sh -c 'umount "$1/.git/config" && echo evil >> "$1/.git/config"' - "$W"
must_fail umount-in-new-user-ns-then-write unshare -Urm sh -c 'umount "$1/.git/config" && echo evil >> "$1/.git/config"' - "$W"
must_fail bind-gitdir-elsewhere-then-write sh -c 'mkdir -p /tmp/g && mount --bind "$1/.git" /tmp/g && echo evil >> /tmp/g/config' - "$W"
must_fail move-mount-config-away-then-write sh -c 'mkdir -p /tmp/mv && touch /tmp/mv/c && mount --move "$1/.git/config" /tmp/mv/c && echo evil >> "$1/.git/config"' - "$W"
must_fail open-by-handle-shocker tool handle
must_fail fresh-procfs-shows-host sh -c 'mkdir -p /tmp/p && mount -t proc proc /tmp/p && test -e "/tmp/p/$1"' - "$HOSTPID"
must_fail devtmpfs-shows-host-disks sh -c 'mkdir -p /tmp/d && mount -t devtmpfs none /tmp/d && ls /tmp/d | grep -xE "$1"' - "$DISKS"
must_fail sysfs-shows-host-disks sh -c 'mkdir -p /tmp/s && mount -t sysfs none /tmp/s && ls /tmp/s/block | grep -xE "$1"' - "$DISKS"
must_fail setns-into-pid-1-sees-host nsenter -t 1 -a test -e "$MARKER"
must_fail chroot-into-proc-1-root chroot /proc/1/root test -e "$MARKER"
must_fail pivot-root-breakout sh -c 'mkdir -p /tmp/new/old && mount -t tmpfs none /tmp/new && mkdir -p /tmp/new/old && cd /tmp/new && pivot_root . old && test -e "old$1"' - "$MARKER"
must_fail cgroup-v1-release-agent sh -c 'mkdir -p /tmp/cg && (mount -t cgroup -o memory cgroup /tmp/cg || mount -t cgroup -o rdma cgroup /tmp/cg) && mkdir -p /tmp/cg/x && echo 1 > /tmp/cg/x/notify_on_release && echo /tmp/evil.sh > /tmp/cg/release_agent'
must_fail cgroup-v2-mount-writes-host sh -c 'mkdir -p /tmp/cg2 && mount -t cgroup2 none /tmp/cg2 && test -e /tmp/cg2/lazaret'
must_fail load-kernel-module tool init_module
must_fail set-clock sh -c 'date -s "@$(date +%s)"'
must_fail debugfs-mount sh -c 'mkdir -p /tmp/dbg && mount -t debugfs none /tmp/dbg && ls /tmp/dbg | grep .'
must_fail securityfs-mount sh -c 'mkdir -p /tmp/sec && mount -t securityfs none /tmp/sec && ls /tmp/sec | grep .'
hostname escape-evil-host 2>/dev/null; echo "case own-hostname: $(hostname)"
sleep 1
"#,
        marker = marker.display(),
        ran = ran.display(),
        pid = std::process::id(),
        disks = host_disks.join("|"),
    );
    let names = [
        "umount-config-then-write",
        "lazy-umount-hooks-then-plant",
        "remount-config-rw-then-write",
        "remount-workspace-parent-then-write",
        "umount-in-new-mount-ns-then-write",
        "umount-in-new-user-ns-then-write",
        "bind-gitdir-elsewhere-then-write",
        "move-mount-config-away-then-write",
        "open-by-handle-shocker",
        "fresh-procfs-shows-host",
        "devtmpfs-shows-host-disks",
        "sysfs-shows-host-disks",
        "setns-into-pid-1-sees-host",
        "chroot-into-proc-1-root",
        "pivot-root-breakout",
        "cgroup-v1-release-agent",
        "cgroup-v2-mount-writes-host",
        "load-kernel-module",
        "set-clock",
        "debugfs-mount",
        "securityfs-mount",
    ];
    let path = escape::install(&env, "root", &script);
    let out = env.run(["run".as_ref(), "test".as_ref(), "--".as_ref(), "sh".as_ref(), path.as_os_str()]);
    let stdout = text(&out.stdout);
    println!("{stdout}\nstderr:\n{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let results = escape::cases(&stdout);
    escape::assert_refused(&results, &names, &stdout);
    assert_eq!(fs::read(ws.join(".git/config")).expect("config"), config_before, "the protected config changed on the host");
    let hooks: Vec<String> =
        fs::read_dir(ws.join(".git/hooks")).expect("hooks").flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(!hooks.iter().any(|h| h == "post-commit"), "a hook was planted on the host: {hooks:?}");
    let hostname_after = fs::read_to_string("/proc/sys/kernel/hostname").expect("hostname");
    if hostname_after != hostname_before {
        // Put the machine's name back before failing.
        let _ = fs::write("/proc/sys/kernel/hostname", hostname_before.trim());
    }
    assert_eq!(hostname_after, hostname_before, "the host's hostname changed");
    assert!(!Path::new(&ran).exists(), "a program the agent chose ran on the host");
    env.assert_nothing_left();
}
