//! Removing the cgroups runsc creates at a container's `cgroupsPath`.
//! runsc leaves them behind after failed starts (PLATFORM.md), so every run
//! removes its own, leaf first, in every mounted hierarchy (v1 controllers
//! and the v2 `unified` tree alike).

use std::path::Path;

/// Where the cgroup hierarchies are mounted.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

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
    for root in roots {
        let mut current = Path::new(rel);
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
    let Some(root) = unified_root() else { return };
    let Ok(children) = std::fs::read_dir(root.join(rel)) else { return };
    for child in children.flatten() {
        if child.file_name().to_string_lossy().starts_with(prefix) {
            let _ = std::fs::remove_dir(child.path());
        }
    }
}

/// Where the unified (v2) hierarchy is mounted: `/sys/fs/cgroup` on a
/// unified host, `/sys/fs/cgroup/unified` on a hybrid one; read from this
/// process's mount table.
pub fn unified_root() -> Option<std::path::PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    unified_root_in(&table)
}

/// [`unified_root`] of a mountinfo text.
fn unified_root_in(mountinfo: &str) -> Option<std::path::PathBuf> {
    mountinfo.lines().find_map(|line| {
        // "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER"
        let (mount, fs) = line.split_once(" - ")?;
        let fstype = fs.split(' ').next()?;
        let mountpoint = mount.split(' ').nth(4)?;
        (fstype == "cgroup2" && mountpoint.starts_with(CGROUP_ROOT)).then(|| std::path::PathBuf::from(mountpoint))
    })
}

#[cfg(test)]
mod tests {
    use super::unified_root_in;

    #[test]
    fn the_unified_hierarchy_is_found_on_hybrid_and_unified_hosts() {
        let hybrid = "25 24 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n\
                      27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(unified_root_in(hybrid).as_deref(), Some(std::path::Path::new("/sys/fs/cgroup/unified")));
        let unified = "30 24 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(unified_root_in(unified).as_deref(), Some(std::path::Path::new("/sys/fs/cgroup")));
        assert_eq!(unified_root_in("27 25 0:24 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"), None);
    }
}
