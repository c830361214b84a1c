//! Privileged tests of the syscall layer (`lazaret_mounts::sys`).

mod common;

use std::os::fd::AsFd;
use std::path::Path;

use common::{host_has_mount_under, in_private_mount_ns, require_root, thread_has_mount_at};
use lazaret_mounts::safe_path::{open_beneath, open_root_dir};
use lazaret_mounts::{MountError, bind_mount, bind_mount_fd, mount_overlay, unmount};
use nix::fcntl::OFlag;

fn write(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, contents).expect("write");
}

#[test]
fn overlay_merges_layers_and_stays_out_of_host_table() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path();
    write(&base.join("lower1/only1"), "one");
    write(&base.join("lower1/shared"), "from lower1");
    write(&base.join("lower2/shared"), "from lower2");
    write(&base.join("lower2/only2"), "two");
    for sub in ["upper", "work", "target"] {
        std::fs::create_dir(base.join(sub)).expect("mkdir");
    }
    let target = base.join("target");
    in_private_mount_ns(|| {
        mount_overlay(&[&base.join("lower1"), &base.join("lower2")], &base.join("upper"), &base.join("work"), &target)
            .expect("mount overlay");
        assert!(thread_has_mount_at(&target));
        assert!(!host_has_mount_under(base), "overlay leaked into host table");
        assert_eq!(std::fs::read_to_string(target.join("shared")).expect("read"), "from lower1");
        assert_eq!(std::fs::read_to_string(target.join("only2")).expect("read"), "two");
        std::fs::write(target.join("new"), "written").expect("write through overlay");
        std::fs::write(target.join("only1"), "changed").expect("copy-up");
        unmount(&target, false).expect("unmount");
        assert!(!thread_has_mount_at(&target));
    });
    assert_eq!(std::fs::read_to_string(base.join("upper/new")).expect("upper"), "written");
    assert_eq!(std::fs::read_to_string(base.join("upper/only1")).expect("upper"), "changed");
    assert_eq!(std::fs::read_to_string(base.join("lower1/only1")).expect("lower"), "one");
    assert!(!host_has_mount_under(base));
}

#[test]
fn overlay_refuses_option_separators() {
    let bad = Path::new("/tmp/a,b");
    let err = mount_overlay(&[bad], Path::new("/tmp/u"), Path::new("/tmp/w"), Path::new("/tmp/t")).expect_err("comma must be refused");
    assert!(matches!(err, MountError::Refused { .. }));
    assert!(err.to_string().contains("/tmp/a,b"));
    let err = mount_overlay(&[Path::new("/tmp/l")], Path::new("/tmp/u:x"), Path::new("/tmp/w"), Path::new("/tmp/t"))
        .expect_err("colon must be refused");
    assert!(matches!(err, MountError::Refused { .. }));
}

#[test]
fn readonly_bind_rejects_writes_and_rw_bind_shares_them() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path();
    write(&base.join("src/file"), "original");
    std::fs::create_dir(base.join("ro")).expect("mkdir");
    std::fs::create_dir(base.join("rw")).expect("mkdir");
    in_private_mount_ns(|| {
        bind_mount(&base.join("src"), &base.join("ro"), true).expect("ro bind");
        bind_mount(&base.join("src"), &base.join("rw"), false).expect("rw bind");
        assert!(!host_has_mount_under(base));
        let err = std::fs::write(base.join("ro/file"), "x").expect_err("ro write must fail");
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        std::fs::write(base.join("rw/file"), "via rw").expect("rw write");
        assert_eq!(std::fs::read_to_string(base.join("ro/file")).expect("read"), "via rw");
    });
    assert_eq!(std::fs::read_to_string(base.join("src/file")).expect("read"), "via rw");
    assert!(!base.join("ro/file").exists(), "mount point is empty again after the namespace ended");
    assert!(!host_has_mount_under(base));
}

#[test]
fn fd_bind_of_dir_and_file_readonly_and_writable() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path();
    write(&base.join("src/inner"), "dir content");
    write(&base.join("srcfile"), "file content");
    std::fs::create_dir(base.join("dirtarget")).expect("mkdir");
    write(&base.join("filetarget"), "to be hidden");
    std::fs::create_dir(base.join("rwtarget")).expect("mkdir");
    in_private_mount_ns(|| {
        // fds must be opened inside the namespace where they are mounted:
        // open_tree refuses mounts of another namespace with EINVAL.
        let root = open_root_dir(base).expect("root");
        let open = |p: &str| open_beneath(root.as_fd(), Path::new(p), OFlag::O_PATH).expect("open");
        bind_mount_fd(open("src").as_fd(), open("dirtarget").as_fd(), true).expect("dir ro");
        bind_mount_fd(open("srcfile").as_fd(), open("filetarget").as_fd(), true).expect("file ro");
        bind_mount_fd(open("src").as_fd(), open("rwtarget").as_fd(), false).expect("dir rw");
        assert!(!host_has_mount_under(base));
        assert_eq!(std::fs::read_to_string(base.join("dirtarget/inner")).expect("read"), "dir content");
        assert_eq!(std::fs::read_to_string(base.join("filetarget")).expect("read"), "file content");
        let err = std::fs::write(base.join("dirtarget/inner"), "x").expect_err("ro");
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        let err = std::fs::write(base.join("filetarget"), "x").expect_err("ro");
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        std::fs::write(base.join("rwtarget/new"), "rw").expect("rw write");
        unmount(&base.join("rwtarget"), true).expect("detach");
        assert_eq!(std::fs::read_dir(base.join("rwtarget")).expect("readdir").count(), 0, "unmounted target shows the empty mount point");
    });
    assert_eq!(std::fs::read_to_string(base.join("src/new")).expect("read"), "rw");
    assert_eq!(std::fs::read_to_string(base.join("filetarget")).expect("read"), "to be hidden");
    assert!(!host_has_mount_under(base));
}

#[test]
fn unmount_of_non_mount_reports_path() {
    require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    in_private_mount_ns(|| {
        let err = unmount(dir.path(), false).expect_err("not a mount point");
        assert!(err.to_string().contains(&*dir.path().to_string_lossy()), "{err}");
        assert!(matches!(err, MountError::Syscall { .. }));
    });
}
