//! Privileged tests of State Anchor overlays (mounted in a private mount
//! namespace on a dedicated thread).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use common::{host_has_mount_under, in_private_mount_ns, require_root};
use lazaret_mounts::anchor::{escape_path, mount_anchor, prepare_anchor};

fn write(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, contents).expect("write");
}

#[test]
fn anchor_overlays_persist_writes_and_stay_inside_the_image() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("image");
    write(&image.join("usr/bin/tool"), "image tool");
    write(&image.join("usr/local/share/x"), "image local");
    write(&image.join("etc/os-release"), "image os");
    std::fs::create_dir_all(image.join("root")).expect("mkdir");
    std::fs::set_permissions(image.join("root"), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // An absolute symlink in the image must resolve inside the image.
    symlink("/etc", image.join("opt")).expect("symlink");
    let domain = dir.path().join("domain");
    let persistent: Vec<PathBuf> = ["/usr", "/usr/local", "/root", "/opt", "/newdir"].iter().map(PathBuf::from).collect();
    let plan = prepare_anchor(&domain, &persistent, "sha256:one", false).expect("prepare");
    let run = dir.path().join("run/anchor");
    in_private_mount_ns(|| {
        let binds = mount_anchor(&plan, &image, &run).expect("mount anchor");
        let destinations: Vec<_> = binds.iter().map(|b| b.destination.clone()).collect();
        assert_eq!(destinations, ["/newdir", "/opt", "/root", "/usr", "/usr/local"].iter().map(PathBuf::from).collect::<Vec<_>>());
        let at = |p: &str| run.join(escape_path(Path::new(p)));
        assert_eq!(std::fs::read_to_string(at("/usr").join("bin/tool")).expect("read"), "image tool");
        assert_eq!(std::fs::read_to_string(at("/usr/local").join("share/x")).expect("read"), "image local");
        assert_eq!(
            std::fs::read_to_string(at("/opt").join("os-release")).expect("read"),
            "image os",
            "the image's /opt -> /etc symlink resolves inside the image, not to the host's /etc"
        );
        assert_eq!(std::fs::read_dir(at("/newdir")).expect("readdir").count(), 0, "missing dir starts empty");
        assert_eq!(std::fs::metadata(at("/root")).expect("stat").mode() & 0o7777, 0o700, "mode copied from image");
        std::fs::write(at("/usr").join("bin/installed"), "persisted").expect("write");
        std::fs::write(at("/usr/local").join("new"), "local persisted").expect("write");
        std::fs::write(at("/newdir").join("f"), "new").expect("write");
        std::fs::write(at("/usr").join("bin/tool"), "modified").expect("copy-up");
        assert!(!host_has_mount_under(dir.path()));
    });
    assert!(!host_has_mount_under(dir.path()));
    assert_eq!(std::fs::read_to_string(image.join("usr/bin/tool")).expect("read"), "image tool", "image untouched");
    assert!(!image.join("usr/bin/installed").exists());
    let upper = |p: &str| domain.join("anchor").join(escape_path(Path::new(p))).join("upper");
    assert_eq!(std::fs::read_to_string(upper("/usr").join("bin/installed")).expect("read"), "persisted");
    assert_eq!(std::fs::read_to_string(upper("/usr/local").join("new")).expect("read"), "local persisted");
    assert_eq!(std::fs::read_to_string(upper("/newdir").join("f")).expect("read"), "new");
    // A later Domain start over a new image keeps (and warns about) the anchor.
    let plan = prepare_anchor(&domain, &persistent, "sha256:two", false).expect("prepare again");
    assert_eq!(plan.warnings.len(), 1, "{:?}", plan.warnings);
    in_private_mount_ns(|| {
        mount_anchor(&plan, &image, &run).expect("mount again");
        let at = |p: &str| run.join(escape_path(Path::new(p)));
        assert_eq!(std::fs::read_to_string(at("/usr").join("bin/installed")).expect("read"), "persisted");
        assert_eq!(std::fs::read_to_string(at("/usr").join("bin/tool")).expect("read"), "modified");
    });
}
