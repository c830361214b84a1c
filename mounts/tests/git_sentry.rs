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
    std::fs::remove_dir_all(f.ws().join(".git/info")).expect("rm info");
    let plan = f.discover(&[""]).expect("discover");
    assert_eq!(
        inside(&plan),
        vec![
            (PathBuf::from(".git/config"), FileKind::Regular),
            (PathBuf::from(".git/hooks"), FileKind::Directory),
            (PathBuf::from(".git/info"), FileKind::Directory)
        ]
    );
    assert!(f.ws().join(".git/hooks").is_dir(), "missing hooks dir is created so it cannot be planted");
    assert!(f.ws().join(".git/info").is_dir(), "missing info dir is created so that info/exclude cannot be planted");
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
            // Outside the workspace: neither visible nor protectable.
            std::fs::write(ws.join(".git/commondir"), "../../evil\n").expect("write");
        }),
        (".git/commondir", |ws| {
            std::fs::write(ws.join(".git/commondir"), "../missing\n").expect("write");
        }),
        (".git/commondir", |ws| {
            std::fs::create_dir_all(ws.join("a")).expect("mkdir");
            std::fs::write(ws.join(".git/commondir"), "../a/../.git\n").expect("write");
        }),
        (".git/info", |ws| {
            std::fs::remove_dir_all(ws.join(".git/info")).expect("rm");
            symlink("/tmp", ws.join(".git/info")).expect("symlink");
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
    for expected in [
        ".git/modules/libs/sub/config",
        ".git/modules/libs/sub/hooks",
        ".git/modules/libs/sub/info",
        ".git/config",
        ".git/hooks",
        ".git/info",
        "libs/sub/.git",
    ] {
        assert!(paths.iter().any(|(p, _)| p == Path::new(expected)), "{expected} in {paths:?}");
    }
    assert_eq!(paths.len(), 7, "no duplicates: {paths:?}");
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
    let main_plan =
        discover(main_root.as_fd(), &std::fs::canonicalize(&main).expect("canon"), &[PathBuf::new()], &host).expect("discover main");
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

fn has(plan: &SentryPlan, path: &str, kind: FileKind) -> bool {
    inside(plan).contains(&(PathBuf::from(path), kind))
}

fn assert_has(plan: &SentryPlan, paths: &[(&str, FileKind)]) {
    for (path, kind) in paths {
        assert!(has(plan, path, *kind), "{path} ({kind:?}) protected; got {:?}", inside(plan));
    }
}

fn commit(dir: &Path, home: &Path, file: &str) {
    std::fs::write(dir.join(file), file).expect("write");
    git(dir, home, &["add", file]);
    git(dir, home, &["commit", "-qm", file]);
}

#[test]
fn commondir_inside_the_workspace_is_followed_and_protected() {
    let f = Fixture::new();
    f.init();
    // A repository whose `.git` names another git dir with `commondir`, as
    // git honours it: config and hooks come from `shared/.git`.
    let shared = f.ws().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    git(&shared, &f.home(), &["init", "-q"]);
    commit(&shared, &f.home(), "s");
    std::fs::create_dir_all(f.ws().join("nested/.git")).expect("mkdir");
    std::fs::write(f.ws().join("nested/.git/commondir"), "../../shared/.git\n").expect("commondir");
    std::fs::write(f.ws().join("nested/.git/HEAD"), "ref: refs/heads/main\n").expect("HEAD");
    git(&f.ws().join("nested"), &f.home(), &["status", "--short"]); // git accepts the layout
    std::fs::remove_dir_all(shared.join(".git/hooks")).expect("rm hooks");
    // Only the nested work tree is named: the shared dir is found through commondir.
    let plan = f.discover(&["nested"]).expect("discover");
    assert_has(
        &plan,
        &[
            ("nested/.git/commondir", FileKind::Regular),
            ("shared/.git/config", FileKind::Regular),
            ("shared/.git/hooks", FileKind::Directory),
            ("shared/.git/info", FileKind::Directory),
        ],
    );
    assert!(shared.join(".git/hooks").is_dir(), "the common dir's missing hooks/ is created");
    assert!(!f.ws().join("nested/.git/hooks").exists(), "a per-worktree git dir gets no placeholder hooks/");

    // A linked worktree gitdir whose commondir names another in-workspace
    // repository: that one's config and hooks are protected too.
    let other = f.ws().join("other");
    std::fs::create_dir(&other).expect("mkdir");
    git(&other, &f.home(), &["init", "-q"]);
    std::fs::create_dir_all(f.ws().join(".git/worktrees/odd")).expect("mkdir");
    std::fs::write(f.ws().join(".git/worktrees/odd/commondir"), "../../../other/.git\n").expect("commondir");
    std::fs::write(f.ws().join(".git/worktrees/odd/HEAD"), "ref: refs/heads/main\n").expect("HEAD");
    let plan = f.discover(&[""]).expect("discover");
    assert_has(
        &plan,
        &[
            (".git/worktrees/odd/commondir", FileKind::Regular),
            ("other/.git/config", FileKind::Regular),
            ("other/.git/hooks", FileKind::Directory),
        ],
    );
    // A commondir cycle ends.
    std::fs::write(shared.join(".git/commondir"), "../../nested/.git\n").expect("cycle");
    let plan = f.discover(&["nested"]).expect("cycle is not followed forever");
    assert!(has(&plan, "shared/.git/commondir", FileKind::Regular));
}

#[test]
fn include_targets_in_the_workspace_are_protected() {
    let f = Fixture::new();
    f.init();
    let ws = f.ws();
    let cfg = |key: &str, value: &str| git(&ws, &f.home(), &["config", "--add", key, value]);
    cfg("include.path", "../shared.cfg"); // relative to .git/
    cfg("includeIf.onbranch:main.path", "config.d/branch.cfg"); // missing: created
    cfg("includeIf.gitdir:/nowhere/.path", &ws.join("abs.cfg").to_string_lossy());
    cfg("include.path", "~/home.cfg"); // the developer's home: outside
    cfg("include.path", "/etc/hostname"); // outside
    std::fs::write(ws.join("shared.cfg"), "[include]\n\tpath = sub/nested.cfg\n").expect("write");
    std::fs::create_dir(ws.join("sub")).expect("mkdir");
    // Includes of includes: relative to the including file; a cycle back.
    std::fs::write(ws.join("sub/nested.cfg"), "[core]\n\thooksPath = tools/hooks\n[include]\n\tpath = ../shared.cfg\n").expect("write");
    std::fs::write(ws.join("abs.cfg"), "").expect("write");
    std::fs::write(f.home().join("home.cfg"), "[include]\n\tpath = ~/../ws/from-home.cfg\n").expect("write");
    std::fs::write(ws.join("from-home.cfg"), "").expect("write");
    let plan = f.discover(&[""]).expect("discover");
    assert_has(
        &plan,
        &[
            (".git/config", FileKind::Regular),
            ("shared.cfg", FileKind::Regular),
            ("sub/nested.cfg", FileKind::Regular),
            (".git/config.d/branch.cfg", FileKind::Regular),
            ("abs.cfg", FileKind::Regular),
            ("from-home.cfg", FileKind::Regular),
            // core.hooksPath set in an included file.
            ("tools/hooks", FileKind::Directory),
        ],
    );
    assert!(ws.join(".git/config.d/branch.cfg").is_file(), "missing include target created");
    assert!(plan.warnings.iter().any(|w| w.contains("cycle")), "{:?}", plan.warnings);
    assert!(!plan.protected.iter().any(|p| matches!(&p.path, GitDirPath::Outside(_))), "nothing outside: {:?}", plan.protected);

    // The developer's global config including a workspace file.
    std::fs::write(f.home().join(".gitconfig"), format!("[include]\n\tpath = {}\n", ws.join("global-inc.cfg").display())).expect("write");
    std::fs::write(ws.join("global-inc.cfg"), "").expect("write");
    let plan = f.discover(&[""]).expect("discover");
    assert!(has(&plan, "global-inc.cfg", FileKind::Regular), "{:?}", inside(&plan));

    // An unparsable config is protected anyway, with a warning.
    std::fs::write(ws.join("abs.cfg"), "this is not [ git config\n[include]\npath = later.cfg\n").expect("write");
    let plan = f.discover(&[""]).expect("discover");
    assert!(has(&plan, "abs.cfg", FileKind::Regular));
    assert!(has(&plan, "later.cfg", FileKind::Regular), "lines after the bad one are still read");
    assert!(plan.warnings.iter().any(|w| w.contains("abs.cfg") && w.contains("could not parse")), "{:?}", plan.warnings);
    // So is one too large to read (git's own files are tiny).
    std::fs::write(ws.join("abs.cfg"), vec![b'#'; 2 << 20]).expect("write");
    let plan = f.discover(&[""]).expect("discover");
    assert!(has(&plan, "abs.cfg", FileKind::Regular));
    assert!(plan.warnings.iter().any(|w| w.contains("abs.cfg") && w.contains("includes could not be read")), "{:?}", plan.warnings);
}

#[test]
fn include_chains_stop_at_gits_depth() {
    let f = Fixture::new();
    f.init();
    git(&f.ws(), &f.home(), &["config", "include.path", "../c1.cfg"]);
    for n in 1..=12 {
        std::fs::write(f.ws().join(format!("c{n}.cfg")), format!("[include]\n\tpath = c{}.cfg\n", n + 1)).expect("write");
    }
    let plan = f.discover(&[""]).expect("discover");
    for n in 1..=10 {
        assert!(has(&plan, &format!("c{n}.cfg"), FileKind::Regular), "c{n}.cfg: {:?}", inside(&plan));
    }
    assert!(!has(&plan, "c11.cfg", FileKind::Regular), "git stops (and refuses) beyond depth 10");
    assert!(plan.warnings.iter().any(|w| w.contains("deeper than 10")), "{:?}", plan.warnings);
}

#[test]
fn include_through_a_symlink_is_refused() {
    type Breaker = fn(&Path);
    let cases: &[(&str, &str, Breaker)] = &[
        // A symlinked directory on the way.
        ("../link/x.cfg", "link/x.cfg", |ws| {
            std::fs::create_dir(ws.join("real")).expect("mkdir");
            std::fs::write(ws.join("real/x.cfg"), "").expect("write");
            symlink("real", ws.join("link")).expect("symlink");
        }),
        // The target itself.
        ("../x.cfg", "x.cfg", |ws| {
            symlink("/etc/hostname", ws.join("x.cfg")).expect("symlink");
        }),
        // `..` after a symlink: git would resolve it at the link's target.
        ("../link/../x.cfg", "link", |ws| {
            std::fs::create_dir_all(ws.join("real/deep")).expect("mkdir");
            symlink("real/deep", ws.join("link")).expect("symlink");
        }),
    ];
    for (include, named, make) in cases {
        let f = Fixture::new();
        f.init();
        make(&f.ws());
        git(&f.ws(), &f.home(), &["config", "include.path", include]);
        let err = f.discover(&[""]).expect_err(include);
        assert!(matches!(err, MountError::Refused { .. }), "{include}: {err}");
        assert!(err.to_string().contains(named), "{include}: error names {named}: {err}");
    }
}

#[test]
fn worktree_and_module_git_dirs_are_protected_registered_or_not() {
    let f = Fixture::new();
    let home = f.home();
    // Upstreams: `lib` with its own submodule `inner` (nested modules).
    let inner = f.dir.path().join("inner");
    let lib = f.dir.path().join("lib");
    for dir in [&inner, &lib] {
        std::fs::create_dir(dir).expect("mkdir");
        git(dir, &home, &["init", "-q"]);
        commit(dir, &home, "f");
    }
    git(&lib, &home, &["-c", "protocol.file.allow=always", "submodule", "add", "-q", &inner.to_string_lossy(), "inner"]);
    git(&lib, &home, &["commit", "-qm", "inner"]);
    f.init();
    commit(&f.ws(), &home, "top");
    git(&f.ws(), &home, &["-c", "protocol.file.allow=always", "submodule", "add", "-q", &lib.to_string_lossy(), "libs/lib"]);
    git(&f.ws(), &home, &["-c", "protocol.file.allow=always", "submodule", "update", "-q", "--init", "--recursive"]);
    git(&f.ws(), &home, &["config", "extensions.worktreeConfig", "true"]);
    // Linked worktrees: one in the workspace, one outside it.
    git(&f.ws(), &home, &["worktree", "add", "-q", "wt"]);
    git(&f.ws(), &home, &["worktree", "add", "-q", &f.dir.path().join("outside-wt").to_string_lossy()]);
    // Unregistered: a leftover worktree gitdir, one without commondir, an
    // old module gitdir.
    let git_dir = f.ws().join(".git");
    std::fs::create_dir_all(git_dir.join("worktrees/stale/hooks")).expect("mkdir");
    std::fs::write(git_dir.join("worktrees/stale/commondir"), "../..\n").expect("write");
    std::fs::write(git_dir.join("worktrees/stale/HEAD"), "ref: refs/heads/main\n").expect("write");
    std::fs::create_dir_all(git_dir.join("worktrees/broken")).expect("mkdir");
    std::fs::write(git_dir.join("worktrees/broken/HEAD"), "ref: refs/heads/main\n").expect("write");
    std::fs::create_dir_all(git_dir.join("modules/old/hooks")).expect("mkdir");
    std::fs::write(git_dir.join("modules/old/HEAD"), "ref: refs/heads/main\n").expect("write");
    std::fs::write(git_dir.join("modules/old/config"), "[core]\n\tbare = false\n").expect("write");
    // A worktree of the submodule.
    let module = ".git/modules/libs/lib";
    git(&f.ws().join("libs/lib"), &home, &["worktree", "add", "-q", &f.dir.path().join("lib-wt").to_string_lossy()]);
    let lib_wt =
        std::fs::read_dir(git_dir.join("modules/libs/lib/worktrees")).expect("readdir").next().expect("one").expect("entry").file_name();
    let lib_wt = format!("{module}/worktrees/{}", lib_wt.to_string_lossy());

    // Only the workspace root is named: everything is found from its .git.
    let plan = f.discover(&[""]).expect("discover");
    use FileKind::{Directory as D, Regular as R};
    let expected: Vec<(String, FileKind)> = [
        (".git/config".to_string(), R),
        (".git/config.worktree".into(), R),
        (".git/info".into(), D),
        (".git/worktrees/wt/commondir".into(), R),
        (".git/worktrees/wt/config.worktree".into(), R),
        (".git/worktrees/outside-wt/commondir".into(), R),
        (".git/worktrees/outside-wt/config.worktree".into(), R),
        (".git/worktrees/stale/commondir".into(), R),
        (".git/worktrees/stale/hooks".into(), D),
        (".git/worktrees/broken".into(), D),
        (format!("{module}/config"), R),
        (format!("{module}/hooks"), D),
        (format!("{module}/info"), D),
        (format!("{lib_wt}/commondir"), R),
        (format!("{module}/modules/inner/config"), R),
        (format!("{module}/modules/inner/hooks"), D),
        (format!("{module}/modules/inner/info"), D),
        (".git/modules/old/config".into(), R),
        (".git/modules/old/hooks".into(), D),
        (".git/modules/old/info".into(), D),
    ]
    .into_iter()
    .collect();
    for (path, kind) in &expected {
        assert!(has(&plan, path, *kind), "{path} ({kind:?}) protected; got {:#?}", inside(&plan));
    }
    assert!(plan.warnings.iter().any(|w| w.contains("worktrees/broken")), "{:?}", plan.warnings);
    assert!(git_dir.join("modules/old/info").is_dir(), "created");
    // Nothing is protected twice.
    let all = inside(&plan);
    let unique: std::collections::HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), all.len(), "{all:?}");
    // The module's and the linked worktree's directories are pinned.
    for pin in [".git/worktrees/wt", ".git/worktrees/stale", ".git/modules/libs/lib/modules/inner"] {
        assert!(plan.pinned.contains(&GitDirPath::Inside(PathBuf::from(pin))), "{pin} pinned: {:?}", plan.pinned);
    }
    // A planted config.worktree is read for includes too.
    std::fs::write(git_dir.join("worktrees/wt/config.worktree"), "[include]\n\tpath = ../../../wt-extra.cfg\n").expect("write");
    std::fs::write(f.ws().join("wt-extra.cfg"), "").expect("write");
    let plan = f.discover(&["", "wt", "libs/lib"]).expect("discover");
    assert!(has(&plan, "wt-extra.cfg", R), "{:?}", inside(&plan));
    assert!(has(&plan, "wt/.git", R));
    assert!(plan.pinned.contains(&GitDirPath::Inside(PathBuf::from("libs/lib"))), "{:?}", plan.pinned);
}

#[test]
fn excludes_decide_the_next_ignored_set_and_are_protected() {
    let f = Fixture::new();
    f.init();
    std::fs::write(f.ws().join(".git/info/exclude"), "secret/\n").expect("write");
    git(&f.ws(), &f.home(), &["config", "core.excludesFile", ".lazaret-excludes"]);
    let plan = f.discover(&[""]).expect("discover");
    assert!(has(&plan, ".git/info", FileKind::Directory), "info/ (with info/exclude) protected");
    assert!(!has(&plan, ".lazaret-excludes", FileKind::Regular), "a missing excludes file is not created");
    assert!(!f.ws().join(".lazaret-excludes").exists());
    std::fs::write(f.ws().join(".lazaret-excludes"), "*.log\n").expect("write");
    let plan = f.discover(&[""]).expect("discover");
    assert!(has(&plan, ".lazaret-excludes", FileKind::Regular), "{:?}", inside(&plan));
    // `~/` is the developer's home: outside, not protected; an absolute path
    // in the workspace is.
    git(&f.ws(), &f.home(), &["config", "core.excludesFile", "~/ignore"]);
    let plan = f.discover(&[""]).expect("discover");
    assert!(!inside(&plan).iter().any(|(p, _)| p.ends_with("ignore")));
    git(&f.ws(), &f.home(), &["config", "core.excludesFile", &f.ws().join(".lazaret-excludes").to_string_lossy()]);
    let plan = f.discover(&[""]).expect("discover");
    assert!(has(&plan, ".lazaret-excludes", FileKind::Regular));
    // The .gitignore files stay writable: they are project files.
    std::fs::write(f.ws().join(".gitignore"), "x\n").expect("write");
    let plan = f.discover(&[""]).expect("discover");
    assert!(!has(&plan, ".gitignore", FileKind::Regular));
}

/// 50 linked worktrees and 20 submodules (nested two deep): the plan stays
/// fast and small. Prints the time (see the report); fails above 2 s.
#[test]
fn plan_time_for_50_worktrees_and_20_modules() {
    let f = Fixture::new();
    f.init();
    commit(&f.ws(), &f.home(), "top");
    let git_dir = f.ws().join(".git");
    for n in 0..50 {
        // What `git worktree add` writes, without 50 checkouts.
        let wt = git_dir.join(format!("worktrees/wt{n}"));
        std::fs::create_dir_all(&wt).expect("mkdir");
        std::fs::write(wt.join("commondir"), "../..\n").expect("write");
        std::fs::write(wt.join("HEAD"), "ref: refs/heads/main\n").expect("write");
        std::fs::write(wt.join("gitdir"), format!("/elsewhere/wt{n}/.git\n")).expect("write");
    }
    for n in 0..20 {
        let module =
            if n % 2 == 0 { git_dir.join(format!("modules/m{n}")) } else { git_dir.join(format!("modules/m{}/modules/inner{n}", n - 1)) };
        std::fs::create_dir_all(module.join("hooks")).expect("mkdir");
        std::fs::create_dir_all(module.join("info")).expect("mkdir");
        std::fs::write(module.join("HEAD"), "ref: refs/heads/main\n").expect("write");
        std::fs::write(module.join("config"), "[core]\n\tbare = false\n[include]\n\tpath = ../shared-module.cfg\n").expect("write");
    }
    let start = std::time::Instant::now();
    let plan = f.discover(&[""]).expect("discover");
    let elapsed = start.elapsed();
    let binds = plan.protected.len() + plan.pinned.len();
    println!(
        "plan time for 50 worktrees + 20 modules: {elapsed:?}; {} protected + {} pinned = {binds} binds",
        plan.protected.len(),
        plan.pinned.len()
    );
    assert_eq!(inside(&plan).iter().filter(|(p, _)| p.ends_with("commondir")).count(), 50);
    assert_eq!(inside(&plan).iter().filter(|(p, _)| p.ends_with("config") && p.starts_with(".git/modules")).count(), 20);
    assert!(elapsed < std::time::Duration::from_secs(2), "discovery took {elapsed:?}");
    assert!(binds < 250, "{binds} binds");
}

/// Issue 30: with the gate, every repository's own `config` in the
/// workspace leaves the read-only binds for the guard to judge, with the
/// developer's version as it is now; include targets (a nested
/// repository's config included by the main one), `config.worktree` and
/// hooks stay read-only, and the git dirs stay pinned.
#[test]
fn with_the_gate_repository_configs_are_left_writable_and_include_targets_are_not() {
    let f = Fixture::new();
    f.init();
    let ws = f.ws();
    git(&ws, &f.home(), &["config", "alias.st", "status"]);
    for nested in ["lib", "inc"] {
        std::fs::create_dir(ws.join(nested)).expect("mkdir");
        git(&ws.join(nested), &f.home(), &["init", "-q"]);
    }
    // inc's config is also the main repository's include target.
    git(&ws, &f.home(), &["config", "include.path", "../inc/.git/config"]);
    git(&ws, &f.home(), &["config", "extensions.worktreeConfig", "true"]);
    let mut plan = f.discover(&["", "lib", "inc"]).expect("discover");
    assert!(plan.gated_configs.is_empty(), "nothing is gated unless asked");
    let root = open_root_dir(&ws).expect("open ws");
    plan.gate_repository_configs(root.as_fd()).expect("gate");
    let gated: Vec<&Path> = plan.gated_configs.iter().map(|c| c.path.as_path()).collect();
    assert_eq!(gated, [Path::new(".git/config"), Path::new("lib/.git/config")]);
    let main = &plan.gated_configs[0];
    assert_eq!(main.developer, std::fs::read(ws.join(".git/config")).expect("read"), "the developer's version, byte for byte");
    assert!(String::from_utf8_lossy(&main.developer).contains("st = status"));
    assert!(!has(&plan, ".git/config", FileKind::Regular) && !has(&plan, "lib/.git/config", FileKind::Regular), "{:?}", inside(&plan));
    assert_has(
        &plan,
        &[
            ("inc/.git/config", FileKind::Regular),
            (".git/config.worktree", FileKind::Regular),
            (".git/hooks", FileKind::Directory),
            ("lib/.git/hooks", FileKind::Directory),
        ],
    );
    for pin in [".git", "lib/.git"] {
        assert!(plan.pinned.contains(&GitDirPath::Inside(PathBuf::from(pin))), "{pin} pinned: {:?}", plan.pinned);
    }
}
