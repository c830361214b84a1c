//! Images other than the test image, imported into the shared test store
//! once per machine.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use crate::{TestEnv, lazaret_bin, text};

/// The name of the image without a C library (see [`ensure_nolibc_image`]).
pub const NOLIBC_IMAGE: &str = "nolibc";

/// Where Debian's busybox-static installs its binary.
const STATIC_BUSYBOX: &str = "/bin/busybox";

/// Imports [`NOLIBC_IMAGE`] into the store of `env` unless it is there: a
/// root filesystem holding nothing but Debian's statically linked busybox
/// and links to it (`sh`, `sleep` for the container's init, and a few
/// tools), so nothing in it has a dynamic loader or a C library. Fails
/// naming the package when the static busybox is missing.
pub fn ensure_nolibc_image(env: &TestEnv) {
    let busybox = Path::new(STATIC_BUSYBOX);
    assert!(
        busybox.is_file(),
        "{STATIC_BUSYBOX} missing: install Debian's busybox-static package (scripts/setup.sh --test-tools, or apt-get install busybox-static)"
    );
    let file = Command::new("file").arg("-L").arg(busybox).output().map(|o| text(&o.stdout)).unwrap_or_default();
    assert!(
        !file.contains("dynamically linked") && !file.contains("interpreter"),
        "{STATIC_BUSYBOX} is not statically linked ({}): install Debian's busybox-static, not busybox",
        file.trim()
    );
    let lock =
        fs::OpenOptions::new().create(true).truncate(false).write(true).open("/var/cache/lazaret/test-storage.lock").expect("lock file");
    let _held = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| e).expect("flock");
    let ls = env.run(["image", "ls"]);
    assert!(ls.status.success(), "lazaret image ls failed: {}", text(&ls.stderr));
    if text(&ls.stdout).lines().skip(1).any(|l| l.split_whitespace().next() == Some(NOLIBC_IMAGE)) {
        return;
    }
    let root = tempfile::Builder::new().prefix("lazaret-nolibc-").tempdir().expect("tempdir");
    let bin = root.path().join("bin");
    fs::create_dir(&bin).expect("bin");
    fs::copy(busybox, bin.join("busybox")).expect("copying busybox");
    fs::set_permissions(bin.join("busybox"), fs::Permissions::from_mode(0o755)).expect("chmod busybox");
    for tool in ["sh", "sleep", "true", "false", "echo", "cat", "ls", "id", "env"] {
        std::os::unix::fs::symlink("busybox", bin.join(tool)).expect("busybox link");
    }
    for dir in ["etc", "tmp", "proc", "dev", "sys", "root"] {
        fs::create_dir(root.path().join(dir)).expect("rootfs dir");
    }
    fs::set_permissions(root.path().join("tmp"), fs::Permissions::from_mode(0o1777)).expect("chmod tmp");
    let out = Command::new(lazaret_bin())
        .arg("--config")
        .arg(&env.config)
        .args(["image", "import", NOLIBC_IMAGE])
        .arg(root.path())
        .output()
        .expect("lazaret image import");
    assert!(out.status.success(), "importing the no-libc image failed: {}", text(&out.stderr));
}
