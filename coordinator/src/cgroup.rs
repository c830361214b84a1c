//! Removing the cgroups runsc creates at a container's `cgroupsPath`.
//! runsc leaves them behind after failed starts (docs/platform.md), so every run
//! removes its own, leaf first, in every mounted hierarchy (v1 controllers
//! and the v2 `unified` tree alike).

use std::path::Path;

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Removes `path` (e.g. `/lazaret/<domain>/<container>`) and then its
/// parents wherever they are empty, down to but not including its first
/// component (`/lazaret`, shared by every Domain): removing that one raced
/// with another Domain's `runsc create`, whose mkdir of
/// `/lazaret/<its domain>` then failed with ENOENT. Missing or busy
/// directories are left alone.
pub fn remove(path: &str) {
    let Some(levels) = removable_levels(path) else { return };
    let Ok(hierarchies) = std::fs::read_dir(CGROUP_ROOT) else { return };
    let mut roots: Vec<std::path::PathBuf> = vec![Path::new(CGROUP_ROOT).to_path_buf()];
    roots.extend(hierarchies.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    // Processes of a PID namespace that was just killed (a crashed run's
    // sandbox) leave their cgroups a moment later: a busy leaf is retried
    // for up to half a second in all, so the Domain's cgroup can go too.
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    for root in roots {
        let leaf = root.join(levels[0]);
        while let Err(e) = std::fs::remove_dir(&leaf) {
            if e.raw_os_error() != Some(libc::EBUSY) || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // rmdir of a cgroup works only when it has no tasks and children.
        for level in &levels[1..] {
            let _ = std::fs::remove_dir(root.join(level));
        }
    }
}

/// `path` relative to a hierarchy root, then each parent that [`remove`]
/// may remove, leaf first; `None` for a path that is not at least two
/// plain components deep.
fn removable_levels(path: &str) -> Option<Vec<&Path>> {
    let rel = path.trim_start_matches('/');
    if rel.split('/').any(|c| c.is_empty() || c == "." || c == "..") || !rel.contains('/') {
        return None;
    }
    let mut levels = vec![Path::new(rel)];
    while let Some(parent) = levels.last().and_then(|level| level.parent()) {
        if parent.parent().is_none_or(|top| top.as_os_str().is_empty()) {
            break;
        }
        levels.push(parent);
    }
    Some(levels)
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

#[cfg(test)]
mod tests {
    use super::removable_levels;
    use std::path::Path;

    #[test]
    fn removal_stops_above_the_shared_lazaret_parent() {
        let levels = removable_levels("/lazaret/d1/lzr-d1-ab").expect("valid path");
        assert_eq!(levels, [Path::new("lazaret/d1/lzr-d1-ab"), Path::new("lazaret/d1")]);
        assert_eq!(removable_levels("/lazaret/d1").expect("valid path"), [Path::new("lazaret/d1")]);
        assert_eq!(removable_levels("/lazaret"), None);
        assert_eq!(removable_levels("/"), None);
        assert_eq!(removable_levels("/lazaret/../etc"), None);
        assert_eq!(removable_levels("/lazaret//x"), None);
    }
}
