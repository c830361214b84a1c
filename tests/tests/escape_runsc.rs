//! Escape corpus: runsc, its state and the host's /proc and PID namespace
//! (issue 17). A root agent looks for runsc's binary (by its host path,
//! anywhere in the file system, behind every /proc/PID/exe), runsc's state
//! directory and the rest of the runtime directory, the storage root, the
//! host's root through /proc/PID/root and a chroot, and host processes (by
//! the test's own host PID: signals, ptrace, process_vm_readv); and tries
//! to write the host's kernel settings through /proc (core_pattern, sysrq,
//! uevent_helper). Every attempt must fail, and the host's settings must
//! be unchanged.

use std::fs;

use lazaret_tests::escape;
use lazaret_tests::*;

fn runsc_on_host() -> String {
    let out = std::process::Command::new("sh").args(["-c", "readlink -f \"$(command -v runsc)\""]).output().expect("sh");
    let path = text(&out.stdout).trim().to_string();
    assert!(!path.is_empty(), "runsc not found on the host's PATH: scripts/install-runsc.sh installs it");
    path
}

#[test]
fn runsc_its_state_and_the_hosts_proc_are_out_of_reach() {
    let env = TestEnv::new();
    let runsc = runsc_on_host();
    let test_pid = std::process::id();
    // A file only the host has, in a directory only the host has.
    let marker = env.scratch.join("host-only-marker");
    fs::write(&marker, "host\n").expect("marker");
    let sysctls = [
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/kernel/sysrq",
        "/proc/sys/kernel/hostname",
        "/sys/kernel/uevent_helper",
        "/proc/sys/kernel/modprobe",
    ];
    let before: Vec<String> = sysctls.iter().map(|p| fs::read_to_string(p).unwrap_or_else(|e| format!("unreadable: {e}"))).collect();

    let script = format!(
        r#"RUNSC={runsc}; RUNTIME={runtime}; STORAGE={storage}; MARKER={marker}; HOSTPID={test_pid}; HOST1COMM='{host1}'
must_fail runsc-binary-at-host-path test -e "$RUNSC"
must_fail runsc-binary-runs "$RUNSC" --version
must_fail runsc-binary-anywhere sh -c 'find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -name "runsc*" -print 2>/dev/null | grep .'
must_fail runsc-behind-a-proc-exe sh -c 'for e in /proc/[0-9]*/exe; do readlink "$e"; done | grep runsc'
must_fail runsc-state-dir-visible sh -c 'ls -d "$1" "$1"/*/runsc' - "$RUNTIME"
must_fail storage-root-visible sh -c 'ls -d "$1" "$1"/domains' - "$STORAGE"
must_fail host-file-through-proc-1-root test -e "/proc/1/root$MARKER"
must_fail host-file-through-any-proc-root sh -c 'for r in /proc/[0-9]*/root; do test -e "$r$1" && exit 0; done; exit 1' - "$MARKER"
must_fail host-file-through-proc-cwd sh -c 'for r in /proc/[0-9]*/cwd; do test -e "$r/../host-only-marker" && exit 0; done; exit 1'
must_fail host-file-by-chroot-breakout perl -e 'mkdir "/tmp/jail"; chroot "/tmp/jail" or die "chroot: $!\n"; chdir ".." for 1..64; chroot "." or die; exit(-e $ARGV[0] ? 0 : 1)' "$MARKER"
must_fail host-pid-visible test -e "/proc/$HOSTPID"
must_fail host-pid-signal kill -0 "$HOSTPID"
must_fail host-pid-ptrace tool ptrace "$HOSTPID"
must_fail host-pid-process-vm-readv tool vmread "$HOSTPID"
must_fail host-processes-listed sh -c 'cat /proc/[0-9]*/comm 2>/dev/null | grep -xE "runsc.*|exe|lazaret|systemd|init|cargo|sshd|containerd.*|dockerd|escape_runsc.*|$1"' - "$HOST1COMM"
must_fail host-sized-pid-namespace sh -c '[ $(ls -d /proc/[0-9]* | wc -l) -ge 30 ]'
must_fail write-core-pattern sh -c 'echo "|$1/evil %p" > /proc/sys/kernel/core_pattern' - "$W"
must_fail write-sysrq-trigger sh -c 'echo h > /proc/sysrq-trigger'
must_fail write-sysrq-setting sh -c 'echo 1 > /proc/sys/kernel/sysrq'
must_fail write-uevent-helper sh -c 'echo "$1/evil" > /sys/kernel/uevent_helper' - "$W"
must_fail write-modprobe-path sh -c 'echo "$1/evil" > /proc/sys/kernel/modprobe' - "$W"
must_fail read-kcore head -c 16 /proc/kcore
"#,
        runtime = env.runtime_dir.display(),
        storage = TEST_STORAGE,
        marker = marker.display(),
        // The host's PID 1, by its command name (whatever init it is).
        host1 = fs::read_to_string("/proc/1/comm").expect("/proc/1/comm").trim(),
    );
    let path = escape::install(&env, "runsc", &script);
    let out = env.run(["run".as_ref(), "test".as_ref(), "--".as_ref(), "sh".as_ref(), path.as_os_str()]);
    let stdout = text(&out.stdout);
    println!("{stdout}\nstderr:\n{}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    let after: Vec<String> = sysctls.iter().map(|p| fs::read_to_string(p).unwrap_or_else(|e| format!("unreadable: {e}"))).collect();
    escape::assert_refused(
        &escape::cases(&stdout),
        &[
            "runsc-binary-at-host-path",
            "runsc-binary-runs",
            "runsc-binary-anywhere",
            "runsc-behind-a-proc-exe",
            "runsc-state-dir-visible",
            "storage-root-visible",
            "host-file-through-proc-1-root",
            "host-file-through-any-proc-root",
            "host-file-through-proc-cwd",
            "host-file-by-chroot-breakout",
            "host-pid-visible",
            "host-pid-signal",
            "host-pid-ptrace",
            "host-pid-process-vm-readv",
            "host-processes-listed",
            "host-sized-pid-namespace",
            "write-core-pattern",
            "write-sysrq-trigger",
            "write-sysrq-setting",
            "write-uevent-helper",
            "write-modprobe-path",
            "read-kcore",
        ],
        &stdout,
    );
    assert_eq!(before, after, "host kernel settings changed: {sysctls:?}");
    env.assert_nothing_left();
}
