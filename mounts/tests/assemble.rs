//! Privileged end-to-end tests of plan_workspace + assemble, including the
//! hostile-layout corpus. Every mount happens on a dedicated thread inside
//! its own private mount namespace; nothing reaches the host's table.

mod common;

use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{host_has_mount_under, in_private_mount_ns, require_root};
use lazaret_mounts::ignore_eval::HostGitSettings;
use lazaret_mounts::plan::{AssembledMounts, BindMount, WorkspaceOptions, WorkspacePlan, assemble, plan_workspace};
use lazaret_mounts::{MountError, bind_mount};

const SANDBOX_WS: &str = "/workspace";

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// A workspace with ignored content, hooks, and a host directory outside
    /// it that must never become visible or writable.
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = Fixture { dir };
        for d in ["home", "ws", "domain", "host-secret"] {
            std::fs::create_dir_all(f.path(d)).expect("mkdir");
        }
        std::fs::write(f.path("host-secret/marker"), "host secret").expect("write");
        let status = Command::new("git")
            .current_dir(f.ws())
            .env("HOME", f.path("home"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .args(["init", "-q"])
            .status()
            .expect("git init");
        assert!(status.success());
        std::fs::write(f.ws().join(".gitignore"), "node_modules/\ntarget/\n*.log\n").expect("write");
        std::fs::create_dir_all(f.ws().join("node_modules/pkg")).expect("mkdir");
        std::fs::write(f.ws().join("node_modules/pkg/index.js"), "host dependency").expect("write");
        std::fs::write(f.ws().join("build.log"), "host log").expect("write");
        std::fs::write(f.ws().join(".git/hooks/pre-commit"), "#!/bin/sh\nexit 0\n").expect("write");
        std::fs::write(f.ws().join("src.txt"), "tracked").expect("write");
        f
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn ws(&self) -> PathBuf {
        self.path("ws")
    }
    fn options(&self) -> WorkspaceOptions {
        WorkspaceOptions {
            isolate_gitignored: true,
            host_git: HostGitSettings { home: Some(self.path("home")), xdg_config_home: None, system_config: None },
            sandbox_workspace: PathBuf::from(SANDBOX_WS),
            gate_repository_configs: false,
        }
    }
    fn plan(&self) -> Result<WorkspacePlan, MountError> {
        plan_workspace(&self.ws(), &self.path("domain"), &self.options())
    }
    fn secret_untouched(&self) {
        let entries: Vec<_> = std::fs::read_dir(self.path("host-secret")).expect("readdir").collect();
        assert_eq!(entries.len(), 1, "nothing was created in the host directory");
        assert_eq!(std::fs::read_to_string(self.path("host-secret/marker")).expect("read"), "host secret");
    }
}

/// Emulates what runsc does with the OCI spec: the workspace bind at the
/// sandbox workspace path, then every bind in order, under `view`.
fn emulate_runtime(ws: &Path, view: &Path, binds: &[BindMount]) {
    let ws_view = view.join(SANDBOX_WS.trim_start_matches('/'));
    std::fs::create_dir_all(&ws_view).expect("mkdir");
    bind_mount(ws, &ws_view, false).expect("workspace bind");
    for bind in binds {
        let dest = view.join(bind.destination.strip_prefix("/").expect("absolute"));
        // Like runsc, create a missing destination outside the workspace view.
        if !dest.exists() {
            if bind.source.is_dir() {
                std::fs::create_dir_all(&dest).expect("mkdir destination");
            } else {
                std::fs::create_dir_all(dest.parent().expect("parent")).expect("mkdir");
                std::fs::write(&dest, "").expect("create destination");
            }
        }
        bind_mount(&bind.source, &dest, bind.readonly).expect("bind");
    }
}

fn find<'a>(binds: &'a [BindMount], destination: &str) -> Option<&'a BindMount> {
    binds.iter().find(|b| b.destination == Path::new(destination))
}

#[test]
fn assembled_layout_isolates_ignored_paths_and_protects_git() {
    require_root();
    let f = Fixture::new();
    let plan = f.plan().expect("plan");
    let staging = f.path("run/staging");
    let view = f.path("run/view");
    let assembled: AssembledMounts = in_private_mount_ns(|| {
        let assembled = assemble(&plan, &staging).expect("assemble");
        emulate_runtime(&f.ws(), &view, &assembled.binds);
        let ws_view = view.join("workspace");
        // Ignored: host content hidden, sandbox writes go to Domain storage.
        assert!(!ws_view.join("node_modules/pkg/index.js").exists(), "host content of an ignored dir is hidden");
        assert_eq!(std::fs::read_to_string(ws_view.join("build.log")).expect("read"), "", "ignored file starts empty");
        std::fs::write(ws_view.join("node_modules/new.js"), "sandbox").expect("write ignored");
        std::fs::write(ws_view.join("target/bin"), "built").expect("write anticipated dir");
        // Git Sentry: hooks and config read-only, the rest of .git writable.
        assert!(ws_view.join(".git/hooks/pre-commit").exists(), "real hooks visible");
        for protected in [".git/hooks/pre-commit", ".git/hooks/post-checkout", ".git/config"] {
            let err = std::fs::write(ws_view.join(protected), "evil").expect_err(protected);
            assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{protected}");
        }
        std::fs::write(ws_view.join(".git/description"), "writable").expect("rest of .git writable");
        // The git directory cannot be swapped for an unprotected one.
        let err = std::fs::rename(ws_view.join(".git"), ws_view.join(".git-old")).expect_err(".git is pinned");
        assert_eq!(err.raw_os_error(), Some(libc::EBUSY));
        let err = std::fs::remove_dir(ws_view.join(".git/hooks")).expect_err("hooks is a mount point");
        assert_eq!(err.raw_os_error(), Some(libc::EBUSY));
        std::fs::write(ws_view.join("src.txt"), "edited").expect("workspace writable");
        assert!(!host_has_mount_under(f.dir.path()), "mounts stay in the private namespace");
        assembled
    });
    assert!(!host_has_mount_under(f.dir.path()));
    // Host side after the namespace is gone.
    assert_eq!(std::fs::read_to_string(f.ws().join("node_modules/pkg/index.js")).expect("read"), "host dependency");
    assert!(!f.ws().join("node_modules/new.js").exists(), "sandbox writes never reach host ignored content");
    assert_eq!(std::fs::read_to_string(f.ws().join("build.log")).expect("read"), "host log");
    assert!(f.ws().join("target").is_dir(), "mount point for the literal dir created on the host");
    assert!(!f.ws().join("target/bin").exists());
    assert_eq!(std::fs::read_to_string(f.path("domain/ignored/node_modules/new.js")).expect("read"), "sandbox");
    assert_eq!(std::fs::read_to_string(f.path("domain/ignored/target/bin")).expect("read"), "built");
    assert_eq!(std::fs::read_to_string(f.ws().join("src.txt")).expect("read"), "edited");
    assert_eq!(std::fs::read_to_string(f.ws().join(".git/description")).expect("read"), "writable");
    assert!(!f.ws().join(".git/hooks/post-checkout").exists());
    // The plan itself.
    let nm = find(&assembled.binds, "/workspace/node_modules").expect("node_modules bind");
    assert_eq!(nm.source, f.path("domain/ignored/node_modules"));
    assert!(!nm.readonly);
    let hooks = find(&assembled.binds, "/workspace/.git/hooks").expect("hooks bind");
    assert!(hooks.readonly && hooks.source.starts_with(&staging), "{hooks:?}");
    let mut sorted = assembled.binds.clone();
    sorted.sort_by(|a, b| a.destination.cmp(&b.destination));
    assert_eq!(sorted, assembled.binds, "binds are ordered parents first");

    // Persistence: a second Domain start sees the sandbox's earlier writes.
    let plan = f.plan().expect("plan again");
    in_private_mount_ns(|| {
        let assembled = assemble(&plan, &staging).expect("assemble");
        emulate_runtime(&f.ws(), &view, &assembled.binds);
        let ws_view = view.join("workspace");
        assert_eq!(std::fs::read_to_string(ws_view.join("node_modules/new.js")).expect("read"), "sandbox");
        assert_eq!(std::fs::read_to_string(ws_view.join("target/bin")).expect("read"), "built");
    });
}

#[test]
fn isolation_off_mounts_only_git_sentry() {
    require_root();
    let f = Fixture::new();
    let mut options = f.options();
    options.isolate_gitignored = false;
    let plan = plan_workspace(&f.ws(), &f.path("domain"), &options).expect("plan");
    assert!(plan.ignored.is_empty());
    in_private_mount_ns(|| {
        let assembled = assemble(&plan, &f.path("run/staging")).expect("assemble");
        let staging = f.path("run/staging");
        assert!(assembled.binds.iter().all(|b| b.source.starts_with(&staging)), "only Git Sentry binds: {:?}", assembled.binds);
        assert!(find(&assembled.binds, "/workspace/.git/config").is_some());
    });
    assert!(!f.ws().join("target").exists(), "no mount points are created when isolation is off");
}

#[test]
fn hostile_layouts_are_refused_or_left_unmounted() {
    require_root();
    // `.git` replaced by a symlink to a host directory.
    let f = Fixture::new();
    std::fs::rename(f.ws().join(".git"), f.path("host-secret/real-git")).expect("mv");
    symlink(f.path("host-secret/real-git"), f.ws().join(".git")).expect("symlink");
    let err = f.plan().expect_err(".git symlink");
    assert!(err.to_string().contains(".git"), "{err}");

    // `.git/hooks` replaced by a symlink to a host directory.
    let f = Fixture::new();
    std::fs::remove_dir_all(f.ws().join(".git/hooks")).expect("rm");
    symlink(f.path("host-secret"), f.ws().join(".git/hooks")).expect("symlink");
    let err = f.plan().expect_err("hooks symlink");
    assert!(err.to_string().contains(".git/hooks"), "{err}");
    f.secret_untouched();

    // An ignored directory replaced by a symlink to a host directory (git no
    // longer calls it ignored: `node_modules/` is dir-only), and an ignored
    // file replaced by a symlink to a host file (reported): nothing is
    // mounted there or from there.
    let f = Fixture::new();
    std::fs::remove_dir_all(f.ws().join("node_modules")).expect("rm");
    symlink(f.path("host-secret"), f.ws().join("node_modules")).expect("symlink");
    std::fs::remove_file(f.ws().join("build.log")).expect("rm");
    symlink(f.path("host-secret/marker"), f.ws().join("build.log")).expect("symlink");
    let plan = f.plan().expect("plan");
    assert!(plan.warnings.iter().any(|w| w.contains("build.log")), "{:?}", plan.warnings);
    assert!(plan.ignored.iter().all(|m| m.workspace_rel != Path::new("node_modules")));
    in_private_mount_ns(|| {
        let assembled = assemble(&plan, &f.path("run/staging")).expect("assemble");
        assert!(find(&assembled.binds, "/workspace/node_modules").is_none());
        assert!(find(&assembled.binds, "/workspace/build.log").is_none());
        assert!(assembled.binds.iter().all(|b| !b.source.starts_with(f.path("host-secret"))));
    });
    f.secret_untouched();

    // A `.gitignore`d literal dir whose parent is a symlink: never created through it.
    let f = Fixture::new();
    std::fs::write(f.ws().join(".gitignore"), "/sub/target/\n").expect("write");
    symlink(f.path("host-secret"), f.ws().join("sub")).expect("symlink");
    let plan = f.plan().expect("plan");
    in_private_mount_ns(|| {
        assemble(&plan, &f.path("run/staging")).expect("assemble");
    });
    f.secret_untouched();

    // The workspace root itself is a symlink.
    let f = Fixture::new();
    let link = f.path("ws-link");
    symlink(f.path("host-secret"), &link).expect("symlink");
    let err = plan_workspace(&link, &f.path("domain"), &f.options()).expect_err("root symlink");
    assert!(err.to_string().contains("ws-link"), "{err}");
    f.secret_untouched();
}

#[test]
fn swapping_hooks_for_a_symlink_during_assembly_never_exposes_the_host() {
    require_root();
    let f = Fixture::new();
    let plan = f.plan().expect("plan");
    let hooks = f.ws().join(".git/hooks");
    let decoy = f.ws().join(".git/hooks-decoy");
    symlink(f.path("host-secret"), &decoy).expect("symlink");
    let real_hooks_inode = std::fs::metadata(&hooks).expect("stat").ino();
    let secret_inode = std::fs::metadata(f.path("host-secret")).expect("stat").ino();
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let stop = Arc::clone(&stop);
        let (hooks, decoy) = (hooks.clone(), decoy.clone());
        std::thread::spawn(move || {
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                nix::fcntl::renameat2(nix::fcntl::AT_FDCWD, &hooks, nix::fcntl::AT_FDCWD, &decoy, nix::fcntl::RenameFlags::RENAME_EXCHANGE)
                    .expect("exchange");
                swaps += 1;
            }
            swaps
        })
    };
    let (successes, refusals) = in_private_mount_ns(|| {
        let (mut successes, mut refusals) = (0, 0);
        for round in 0..300 {
            let staging = f.path(&format!("run/staging-{round}"));
            match assemble(&plan, &staging) {
                Ok(assembled) => {
                    successes += 1;
                    let bind = find(&assembled.binds, "/workspace/.git/hooks").expect("hooks bind");
                    let staged = std::fs::metadata(&bind.source).expect("stat staged");
                    assert_eq!(staged.ino(), real_hooks_inode, "staged hooks are the workspace's own");
                    assert_ne!(staged.ino(), secret_inode);
                    assert!(!bind.source.join("marker").exists(), "host directory never staged");
                    assert!(assembled.release().is_empty());
                }
                Err(MountError::Refused { path, .. }) => {
                    refusals += 1;
                    assert!(path.to_string_lossy().contains("hooks"), "refusal names the path: {path:?}");
                }
                Err(other) => panic!("unexpected error: {other}"),
            }
        }
        (successes, refusals)
    });
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().expect("swapper");
    assert!(swaps > 0);
    assert_eq!(successes + refusals, 300);
    eprintln!("swap test: {successes} assemblies succeeded, {refusals} refused, {swaps} swaps");
    f.secret_untouched();
    assert!(!host_has_mount_under(f.dir.path()));
}

#[test]
fn linked_worktree_git_dir_is_bound_with_its_config_read_only() {
    require_root();
    let f = Fixture::new();
    let git = |cwd: &Path, args: &[&str]| {
        let status = Command::new("git")
            .current_dir(cwd)
            .env("HOME", f.path("home"))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .status()
            .expect("git");
        assert!(status.success(), "git {args:?}");
    };
    // The fixture's ws becomes the main repository; the workspace is a linked worktree.
    git(&f.ws(), &["add", ".gitignore", "src.txt"]);
    git(&f.ws(), &["commit", "-qm", "c"]);
    let linked = f.path("linked");
    git(&f.ws(), &["worktree", "add", "-q", &linked.to_string_lossy()]);
    let main_git = std::fs::canonicalize(f.ws().join(".git")).expect("canon");
    let plan = plan_workspace(&linked, &f.path("domain"), &f.options()).expect("plan");
    let view = f.path("run/view");
    in_private_mount_ns(|| {
        let assembled = assemble(&plan, &f.path("run/staging")).expect("assemble");
        let gitdir = find(&assembled.binds, &main_git.to_string_lossy()).expect("git dir bound at its own path");
        assert!(!gitdir.readonly);
        let config = find(&assembled.binds, &main_git.join("config").to_string_lossy()).expect("config bind");
        assert!(config.readonly);
        emulate_runtime(&linked, &view, &assembled.binds);
        let inner = view.join(main_git.strip_prefix("/").expect("absolute"));
        let err = std::fs::write(inner.join("config"), "evil").expect_err("config read-only");
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        let err = std::fs::write(inner.join("hooks/pre-commit"), "evil").expect_err("hooks read-only");
        assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        std::fs::write(inner.join("description"), "writable").expect("objects/refs side writable");
    });
    assert!(!host_has_mount_under(f.dir.path()));
    assert_eq!(std::fs::read_to_string(main_git.join("description")).expect("read"), "writable");
}
