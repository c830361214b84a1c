//! Helpers shared by the privileged tests: every test that mounts does so on
//! a dedicated thread that first enters its own private mount namespace, so
//! nothing reaches the host's mount table, and the kernel drops the mounts
//! when that thread ends (even if the test panics).

#![allow(dead_code)]

use std::path::Path;

/// Runs `f` on a fresh thread inside a new private mount namespace and
/// returns its result (a panic in `f` is re-raised here). Privileged: fails
/// the test unless it runs as root ([`require_root`]).
pub fn in_private_mount_ns<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    require_root();
    std::thread::scope(|scope| {
        let handle = scope.spawn(|| {
            lazaret_mounts::enter_private_mount_namespace().expect("enter private mount namespace");
            f()
        });
        match handle.join() {
            Ok(value) => value,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// The mount points (field 5) of a mountinfo file.
pub fn mount_points(mountinfo: &str) -> Vec<String> {
    let text = std::fs::read_to_string(mountinfo).expect("read mountinfo");
    text.lines().filter_map(|line| line.split(' ').nth(4).map(str::to_owned)).collect()
}

/// True if any mount point of the *host* namespace (the test process's main
/// thread, which never unshares) lies at or beneath `path`.
pub fn host_has_mount_under(path: &Path) -> bool {
    let prefix = path.to_string_lossy().into_owned();
    mount_points("/proc/self/mountinfo").iter().any(|mp| mp == &prefix || mp.starts_with(&format!("{prefix}/")))
}

/// True if the calling thread's own namespace has a mount exactly at `path`.
pub fn thread_has_mount_at(path: &Path) -> bool {
    let wanted = path.to_string_lossy().into_owned();
    mount_points("/proc/thread-self/mountinfo").iter().any(|mp| mp == &wanted)
}

/// Fails the test (never skips it) unless it runs as root. Only the
/// privileged tests call this; the others run as any user.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test needs root (mount namespaces, overlayfs, bind mounts): run it as root, with `sudo scripts/test.sh` or `cargo test -p lazaret-mounts` in a root shell"
    );
}
