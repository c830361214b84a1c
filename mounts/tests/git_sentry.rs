//! Git Sentry discovery (no mounts, no root needed). Repositories are made
//! with the real git, run only on directories these tests create.

use std::os::fd::AsFd;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use lazaret_mounts::MountError;
use lazaret_mounts::git_sentry::{SentryPlan, discover};
use lazaret_mounts::ignore_eval::HostGitSettings;
use lazaret_mounts::repo::GitDirPath;
use lazaret_mounts::safe_path::{FileKind, open_root_dir};

fn git(cwd: &Path, home: &Path, args: &[&str]) {
    let status = Command::new("git")
        .current_dir(cwd)
        .env("HOME", home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "init.defaultBranch=main"])
        .args(args)
        .status()
        .expect("git");
    assert!(status.success(), "git {args:?}");
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home")).expect("home");
        std::fs::create_dir_all(dir.path().join("ws")).expect("ws");
        Fixture { dir }
    }
    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }
    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }
    fn init(&self) {
        git(&self.ws(), &self.home(), &["init", "-q"]);
    }
    fn discover(&self, worktrees: &[&str]) -> Result<SentryPlan, MountError> {
        let root = open_root_dir(&self.ws()).expect("open ws");
        let worktrees: Vec<PathBuf> = worktrees.iter().map(PathBuf::from).collect();
        let host = HostGitSettings { home: Some(self.home()), xdg_config_home: None, system_config: None };
        discover(root.as_fd(), &self.ws(), &worktrees, &host)
    }
}

fn inside(plan: &SentryPlan) -> Vec<(PathBuf, FileKind)> {
    plan.protected
        .iter()
        .filter_map(|p| match &p.path {
            GitDirPath::Inside(rel) => Some((rel.clone(), p.kind)),
            GitDirPath::Outside(_) => None,
        })
        .collect()
}

#[test]
fn plain_repository_protects_config_and_hooks() {
    let f = Fixture::new();
    f.init();
    std::fs::remove_dir_all(f.ws().join(".git/hooks")).expect("rm hooks");
    let plan = f.discover(&[""]).expect("discover");
    assert_eq!(
        inside(&plan),
        vec![(PathBuf::from(".git/config"), FileKind::Regular), (PathBuf::from(".git/hooks"), FileKind::Directory)]
    );
    assert!(f.ws().join(".git/hooks").is_dir(), "missing hooks dir is created so it cannot be planted");
    assert!(plan.outside_git_dirs.is_empty());
}

#[test]
fn refuses_unprotectable_layouts() {
    type Breaker = fn(&Path);
    let cases: &[(&str, Breaker)] = &[
        (".git", |ws| {
            std::fs::rename(ws.join(".git"), ws.join("real-git")).expect("mv");
            symlink(ws.join("real-git"), ws.join(".git")).expect("symlink");
        }),
        (".git/hooks", |ws| {
            std::fs::remove_dir_all(ws.join(".git/hooks")).expect("rm");
            symlink("/etc", ws.join(".git/hooks")).expect("symlink");
        }),
        (".git/config", |ws| {
            std::fs::rename(ws.join(".git/config"), ws.join("cfg")).expect("mv");
            symlink(ws.join("cfg"), ws.join(".git/config")).expect("symlink");
        }),
        (".git/config", |ws| {
            std::fs::remove_file(ws.join(".git/config")).expect("rm");
        }),
        (".git/commondir", |ws| {
            std::fs::write(ws.join(".git/commondir"), "../evil\n").expect("write");
        }),
    ];
    for (path, break_it) in cases {
        let f = Fixture::new();
        f.init();
        break_it(&f.ws());
        let err = f.discover(&[""]).expect_err(path);
        assert!(matches!(err, MountError::Refused { .. }), "{path}: {err}");
        assert!(err.to_string().contains(path), "error names {path}: {err}");
    }
}

#[test]
fn hooks_path_inside_workspace_and_worktree_config() {
    let f = Fixture::new();
    f.init();
    git(&f.ws(), &f.home(), &["config", "core.hooksPath", "tools/hooks"]);
    git(&f.ws(), &f.home(), &["config", "extensions.worktreeConfig", "true"]);
    let plan = f.discover(&[""]).expect("discover");
    let paths = inside(&plan);
    assert!(paths.contains(&(PathBuf::from("tools/hooks"), FileKind::Directory)), "{paths:?}");
    assert!(paths.contains(&(PathBuf::from(".git/config.worktree"), FileKind::Regular)), "{paths:?}");
    assert!(f.ws().join("tools/hooks").is_dir());
    assert!(f.ws().join(".git/config.worktree").is_file());
    // An absolute hooksPath outside the workspace is not visible inside: not protected.
    git(&f.ws(), &f.home(), &["config", "core.hooksPath", "/usr/share/git-core/templates/hooks"]);
    let plan = f.discover(&[""]).expect("discover");
    assert!(!inside(&plan).iter().any(|(p, _)| p.starts_with("usr")));
}

#[test]
fn submodule_git_dirs_are_protected() {
    let f = Fixture::new();
    // A real submodule, made by git from a local repository.
    let upstream = f.dir.path().join("upstream");
    std::fs::create_dir(&upstream).expect("mkdir");
    git(&upstream, &f.home(), &["init", "-q"]);
    std::fs::write(upstream.join("f"), "x").expect("write");
    git(&upstream, &f.home(), &["add", "f"]);
    git(&upstream, &f.home(), &["commit", "-qm", "c"]);
    f.init();
    git(&f.ws(), &f.home(), &["-c", "protocol.file.allow=always", "submodule", "add", "-q", &upstream.to_string_lossy(), "libs/sub"]);
    let plan = f.discover(&["", "libs/sub"]).expect("discover");
    let paths = inside(&plan);
    for expected in [".git/modules/libs/sub/config", ".git/modules/libs/sub/hooks", ".git/config", ".git/hooks", "libs/sub/.git"] {
        assert!(paths.iter().any(|(p, _)| p == Path::new(expected)), "{expected} in {paths:?}");
    }
    assert_eq!(paths.len(), 5, "no duplicates: {paths:?}");
    // Every directory above a protected path is pinned, so none can be swapped.
    let pins: Vec<PathBuf> = plan
        .pinned
        .iter()
        .filter_map(|p| match p {
            GitDirPath::Inside(rel) => Some(rel.clone()),
            GitDirPath::Outside(_) => None,
        })
        .collect();
    let expected: Vec<PathBuf> =
        [".git", ".git/modules", ".git/modules/libs", ".git/modules/libs/sub", "libs", "libs/sub"].iter().map(PathBuf::from).collect();
    assert_eq!(pins, expected);
}

#[test]
fn linked_worktree_outside_git_dir_validated_by_back_link() {
    let f = Fixture::new();
    let main = f.dir.path().join("main");
    std::fs::create_dir(&main).expect("mkdir");
    git(&main, &f.home(), &["init", "-q"]);
    std::fs::write(main.join("f"), "x").expect("write");
    git(&main, &f.home(), &["add", "f"]);
    git(&main, &f.home(), &["commit", "-qm", "c"]);
    std::fs::remove_dir(f.ws()).expect("rmdir");
    git(&main, &f.home(), &["worktree", "add", "-q", &f.ws().to_string_lossy()]);
    let plan = f.discover(&[""]).expect("discover");
    let main_git = std::fs::canonicalize(main.join(".git")).expect("canon");
    assert_eq!(plan.outside_git_dirs, vec![main_git.clone()]);
    let outside: Vec<PathBuf> = plan
        .protected
        .iter()
        .filter_map(|p| match &p.path {
            GitDirPath::Outside(abs) => Some(abs.clone()),
            GitDirPath::Inside(_) => None,
        })
        .collect();
    assert!(outside.contains(&main_git.join("config")), "{outside:?}");
    assert!(outside.contains(&main_git.join("hooks")), "{outside:?}");
    let wt_name = std::fs::read_dir(main_git.join("worktrees")).expect("readdir").next().expect("one").expect("entry").file_name();
    assert!(outside.contains(&main_git.join("worktrees").join(&wt_name).join("commondir")), "{outside:?}");

    // Seen from the main work tree, the linked worktree's commondir is protected too.
    let main_root = open_root_dir(&main).expect("open main");
    let host = HostGitSettings { home: Some(f.home()), xdg_config_home: None, system_config: None };
    let main_plan = discover(main_root.as_fd(), &std::fs::canonicalize(&main).expect("canon"), &[PathBuf::new()], &host)
        .expect("discover main");
    assert!(
        inside(&main_plan).contains(&(Path::new(".git/worktrees").join(&wt_name).join("commondir"), FileKind::Regular)),
        "{:?}",
        inside(&main_plan)
    );

    // A forged pointer to a directory without the back-link is refused.
    std::fs::write(f.ws().join(".git"), "gitdir: /etc\n").expect("forge");
    let err = f.discover(&[""]).expect_err("forged gitdir");
    assert!(matches!(err, MountError::Refused { .. }), "{err}");
    // So is a pointer to another worktree's dir whose back-link names someone else.
    let other = f.dir.path().join("other");
    git(&main, &f.home(), &["worktree", "add", "-q", &other.to_string_lossy()]);
    let other_gitdir = std::fs::read_to_string(other.join(".git")).expect("read");
    std::fs::write(f.ws().join(".git"), other_gitdir).expect("forge");
    let err = f.discover(&[""]).expect_err("foreign worktree");
    assert!(err.to_string().contains("back-link"), "{err}");
}
