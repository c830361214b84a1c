//! Escape corpus: device nodes (issue 17). A root agent makes device nodes
//! for every block device of the host (by its major:minor, read from the
//! host's /sys/block) and for the kernel's dangerous character devices
//! (memory, kernel log, loop control, consoles, raw input), in /tmp and in
//! the workspace, and tries to read them; it looks for block devices in
//! /dev, /sys/block and /proc/partitions, runs losetup and tries to mount a
//! host disk. Every attempt must fail; /dev holds only the sandbox's
//! harmless devices; no device node appears in the workspace on the host.

use std::fs;
use std::os::unix::fs::FileTypeExt;

use lazaret_tests::escape;
use lazaret_tests::*;

/// The host's block devices: (name, major, minor).
fn host_block_devices() -> Vec<(String, u32, u32)> {
    let mut found = Vec::new();
    for e in fs::read_dir("/sys/block").expect("/sys/block").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let dev = fs::read_to_string(e.path().join("dev")).unwrap_or_default();
        if let Some((maj, min)) = dev.trim().split_once(':') {
            if let (Ok(maj), Ok(min)) = (maj.parse(), min.parse()) {
                found.push((name, maj, min));
            }
        }
    }
    found.sort();
    found
}

/// Character devices that would reach the host kernel: name, major, minor.
const CHAR_DEVICES: &[(&str, u32, u32)] = &[
    ("mem", 1, 1),
    ("kmem", 1, 2),
    ("port", 1, 4),
    ("kmsg", 1, 11),
    ("tty0", 4, 0),
    ("ttyS0", 4, 64),
    ("console", 5, 1),
    ("loop-control", 10, 237),
    ("kvm", 10, 232),
    ("uinput", 10, 223),
    ("input-event0", 13, 64),
    ("vcs", 7, 0),
];

/// Entries /dev may have inside: the sandbox's own, harmless devices.
const DEV_ALLOWED: &[&str] =
    &["null", "zero", "full", "random", "urandom", "tty", "ptmx", "pts", "shm", "fd", "stdin", "stdout", "stderr", "net", "fuse", "mqueue"];

#[test]
fn no_device_node_reaches_a_host_device() {
    let env = TestEnv::new();
    let blocks = host_block_devices();
    assert!(!blocks.is_empty(), "the host has no block device in /sys/block: nothing to try");
    let mut script = String::from("echo \"case dev-listing: $(ls -A /dev | tr '\\n' ' ')\"\n");
    let mut names = Vec::new();
    for (name, maj, min) in &blocks {
        script.push_str(&format!(
            "must_fail block-{name}-in-tmp sh -c 'perl \"$TOOL\" mknod /tmp/b-{name} b {maj} {min}; perl \"$TOOL\" readdev /tmp/b-{name}'\n"
        ));
        script.push_str(&format!("must_fail block-{name}-in-workspace sh -c 'perl \"$TOOL\" mknod \"$W/b-{name}\" b {maj} {min}; perl \"$TOOL\" readdev \"$W/b-{name}\"'\n"));
        script.push_str(&format!("must_fail block-{name}-in-dev test -e /dev/{name}\n"));
        script.push_str(&format!("must_fail mount-host-disk-{name} sh -c 'mkdir -p /tmp/m-{name}; mount -t ext4 /tmp/b-{name} /tmp/m-{name} || mount -t ext4 /dev/{name} /tmp/m-{name}'\n"));
        names.extend([
            format!("block-{name}-in-tmp"),
            format!("block-{name}-in-workspace"),
            format!("block-{name}-in-dev"),
            format!("mount-host-disk-{name}"),
        ]);
    }
    for (name, maj, min) in CHAR_DEVICES {
        script.push_str(&format!(
            "must_fail char-{name}-in-tmp sh -c 'perl \"$TOOL\" mknod /tmp/c-{name} c {maj} {min}; perl \"$TOOL\" readdev /tmp/c-{name}'\n"
        ));
        script.push_str(&format!("must_fail char-{name}-in-workspace sh -c 'perl \"$TOOL\" mknod \"$W/c-{name}\" c {maj} {min}; perl \"$TOOL\" readdev \"$W/c-{name}\"'\n"));
        script.push_str(&format!("must_fail char-{name}-in-dev perl \"$TOOL\" readdev /dev/{name}\n"));
        names.extend([format!("char-{name}-in-tmp"), format!("char-{name}-in-workspace"), format!("char-{name}-in-dev")]);
    }
    script.push_str(
        r#"must_fail sys-block-lists-disks sh -c 'ls /sys/block 2>/dev/null | grep .'
must_fail proc-partitions-lists-disks sh -c 'grep -E "[a-z]+[0-9]* *$" /proc/partitions 2>/dev/null | grep -v name'
must_fail losetup-finds-a-loop-device losetup -f
must_fail loop-mount sh -c 'dd if=/dev/zero of=/tmp/img bs=1k count=64 2>/dev/null && mkdir -p /tmp/lm && mount -o loop /tmp/img /tmp/lm'
must_fail dev-block-dir sh -c 'ls /dev/block /dev/disk 2>/dev/null | grep .'
"#,
    );
    names.extend(
        ["sys-block-lists-disks", "proc-partitions-lists-disks", "losetup-finds-a-loop-device", "loop-mount", "dev-block-dir"]
            .map(String::from),
    );
    let path = escape::install(&env, "devices", &script);
    let out = env.run(["run".as_ref(), "test".as_ref(), "--".as_ref(), "sh".as_ref(), path.as_os_str()]);
    let stdout = text(&out.stdout);
    println!("{stdout}\nstderr:\n{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let results = escape::cases(&stdout);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    escape::assert_refused(&results, &names, &stdout);
    let listing = results.get("dev-listing").expect("the /dev listing");
    let unexpected: Vec<&str> = listing.split_whitespace().filter(|n| !DEV_ALLOWED.contains(n)).collect();
    assert!(unexpected.is_empty(), "/dev inside holds more than the sandbox's own devices: {unexpected:?} (all: {listing})");
    // No device node in the workspace on the host, whatever the calls said.
    let nodes: Vec<String> = fs::read_dir(&env.workspace)
        .expect("workspace")
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_block_device() || t.is_char_device()))
        .map(|e| e.path().display().to_string())
        .collect();
    assert!(nodes.is_empty(), "device nodes the agent made exist on the host: {nodes:?}");
    env.assert_nothing_left();
}
