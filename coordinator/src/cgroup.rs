//! Removing the cgroups runsc creates at a container's `cgroupsPath`.
//! runsc leaves them behind after failed starts (PLATFORM.md), so every run
//! removes its own, leaf first, in every mounted hierarchy (v1 controllers
//! and the v2 `unified` tree alike).

use std::path::Path;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Removes `path` (e.g. `/lazaret/<domain>/<container>`) and then its
/// parents up to, not including, the hierarchy root, wherever they are
/// empty. Missing or busy directories are left alone.
pub fn remove(path: &str) {
    let rel = path.trim_start_matches('/');
    if rel.is_empty() || rel.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return;
    }
    let Ok(hierarchies) = std::fs::read_dir(CGROUP_ROOT) else { return };
    let mut roots: Vec<std::path::PathBuf> = vec![Path::new(CGROUP_ROOT).to_path_buf()];
    roots.extend(hierarchies.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    // Processes of a PID namespace that was just killed (a crashed run's
    // sandbox) leave their cgroups a moment later: a busy leaf is retried
    // for up to half a second in all, so the Domain's cgroup can go too.
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    for root in roots {
        let mut current = Path::new(rel);
        let leaf = root.join(current);
        while let Err(e) = std::fs::remove_dir(&leaf) {
            if e.raw_os_error() != Some(libc::EBUSY) || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        loop {
            // rmdir of a cgroup works only when it has no tasks and children.
            let _ = std::fs::remove_dir(root.join(current));
            match current.parent() {
                Some(p) if !p.as_os_str().is_empty() => current = p,
                _ => break,
            }
        }
    }
}

/// Removes the (empty) child cgroups of `parent` whose names start with
/// `prefix`, in the unified hierarchy: the host commands' cgroups of
/// escalation requests a crashed run left (their processes died with its
/// PID namespace). Busy or missing ones are left alone.
pub fn remove_children(parent: &str, prefix: &str) {
    let rel = parent.trim_start_matches('/');
    if rel.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return;
    }
    let Ok(root) = lazaret_runtime::hostexec::cgroup2_mount() else { return };
    let Ok(children) = std::fs::read_dir(root.join(rel)) else { return };
    for child in children.flatten() {
        if child.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_dir(child.path());
        }
    }
}

