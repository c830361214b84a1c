//! Parity of `ignore_eval::scan_ignored` with `git check-ignore` on
//! repositories these tests create (git is only ever run on them, never on a
//! real workspace).

use std::collections::BTreeSet;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use lazaret_mounts::ignore_eval::{HostGitSettings, scan_ignored};
use lazaret_mounts::safe_path::open_root_dir;

/// A scratch home so that no developer config influences git or us.
struct Sandbox {
    dir: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("home")).expect("home");
        std::fs::create_dir(dir.path().join("repo")).expect("repo");
        Sandbox { dir }
    }
    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }
    fn repo(&self) -> PathBuf {
        self.dir.path().join("repo")
    }
    fn git(&self, cwd: &Path) -> Command {
        let mut cmd = Command::new("git");
        cmd.current_dir(cwd)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.home())
            .env("GIT_CONFIG_NOSYSTEM", "1");
        cmd
    }
    fn init(&self, path: &Path) {
        let status = self.git(path).args(["init", "-q"]).status().expect("git init");
        assert!(status.success());
    }
    fn settings(&self) -> HostGitSettings {
        HostGitSettings { home: Some(self.home()), xdg_config_home: None, system_config: None }
    }
}

fn write(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, contents).expect("write");
}

/// Every path under `root` (files, dirs, symlinks), relative, skipping `.git`
/// and the given nested repositories.
fn all_paths(root: &Path, rel: &Path, skip: &[PathBuf], out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(root.join(rel)).expect("readdir").map(|e| e.expect("entry")).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        if entry.file_name() == ".git" {
            continue;
        }
        let child = rel.join(entry.file_name());
        if skip.contains(&child) {
            continue;
        }
        out.push(child.clone());
        if entry.file_type().expect("type").is_dir() {
            all_paths(root, &child, skip, out);
        }
    }
}

/// The subset of `paths` that `git check-ignore` (run in `cwd`) says is ignored.
fn git_ignored(sandbox: &Sandbox, cwd: &Path, paths: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut child = sandbox
        .git(cwd)
        .args(["check-ignore", "--stdin", "-z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("git check-ignore");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        for p in paths {
            stdin.write_all(p.as_os_str().as_encoded_bytes()).expect("write");
            stdin.write_all(b"\0").expect("write");
        }
    }
    let output = child.wait_with_output().expect("wait");
    assert!(matches!(output.status.code(), Some(0) | Some(1)), "git check-ignore failed: {output:?}");
    output.stdout.split(|&c| c == 0).filter(|s| !s.is_empty()).map(|s| PathBuf::from(String::from_utf8_lossy(s).into_owned())).collect()
}

/// Our answer for every path: ignored iff it or an ancestor is a top-most
/// ignored entry of the scan.
fn our_ignored(sandbox: &Sandbox, prefix: &Path, paths: &[PathBuf]) -> BTreeSet<PathBuf> {
    let root = open_root_dir(&sandbox.repo()).expect("open");
    let scan = scan_ignored(root.as_fd(), &sandbox.repo(), &sandbox.settings()).expect("scan");
    let present: BTreeSet<PathBuf> = scan.present.iter().map(|e| e.path.clone()).collect();
    paths
        .iter()
        .filter(|p| {
            let full = prefix.join(p);
            full.ancestors().any(|a| present.contains(a))
        })
        .cloned()
        .collect()
}

fn assert_parity(sandbox: &Sandbox, label: &str) {
    let mut paths = Vec::new();
    all_paths(&sandbox.repo(), Path::new(""), &[], &mut paths);
    let git = git_ignored(sandbox, &sandbox.repo(), &paths);
    let ours = our_ignored(sandbox, Path::new(""), &paths);
    let only_git: Vec<_> = git.difference(&ours).collect();
    let only_ours: Vec<_> = ours.difference(&git).collect();
    assert!(only_git.is_empty() && only_ours.is_empty(), "{label}: ignored only by git: {only_git:?}; only by us: {only_ours:?}");
}

const ROOT_GITIGNORE: &str = "\
# a comment
*.log
!important.log
/build
docs/*.html
!docs/keep.html
**/cache/
out/
logs/**
!logs/keep/
abc/**/def
*.tmp   \n\
trailing\\ \n\
two\\  \n\
\\#hash
\\!bang
[Tt]emp*
sub/**/deep.txt
foo**/bar
a?c
node_modules/
*.[oa]
[[:digit:]]*.num
!/keepme.o
dironly/
mid/*/end
\\[lit]
\x20leading
";

const FILE_NAMES: &[&str] = &[
    "a.log",
    "important.log",
    "x.html",
    "keep.html",
    "t.tmp",
    "trailing ",
    "trailing",
    "two ",
    "two  ",
    "#hash",
    "!bang",
    "Temp1",
    "temp2",
    "deep.txt",
    "bar",
    "abc",
    "a.c",
    "abc.c",
    "x.o",
    "y.a",
    "keepme.o",
    "1.num",
    "a.num",
    "dironly",
    "end",
    "[lit]",
    " leading",
    "plain.txt",
    "anchored.txt",
    "y.gen",
    "keep.gen",
    "z.bak",
    "w.swp",
];

const DIR_NAMES: &[&str] = &[
    "docs",
    "sub",
    "sub/inner",
    "sub/inner/deeper",
    "logs",
    "logs/keep",
    "logs/other",
    "abc/x/def",
    "abc/def",
    "cache",
    "a/cache",
    "foo1/bar",
    "fooX/y/bar",
    "foo/bar",
    "build",
    "x/build",
    "out",
    "x/out",
    "sub/local",
    "node_modules/pkg",
    "excluded_by_info",
    "from_global",
    "Temp9",
    "dironly",
    "x/dironly",
    "mid/q/end",
    "mid/q/r/end",
    "a?c",
];

#[test]
fn parity_on_tricky_corpus() {
    let sandbox = Sandbox::new();
    let repo = sandbox.repo();
    sandbox.init(&repo);
    write(&repo.join(".gitignore"), ROOT_GITIGNORE);
    write(&repo.join("sub/.gitignore"), "!*.log\nlocal/\n/anchored.txt\n*.gen\n");
    write(&repo.join("sub/inner/.gitignore"), "!keep.gen\n*.txt\n!deep.txt\n");
    write(&repo.join(".git/info/exclude"), "excluded_by_info/\n*.bak\n");
    let global = sandbox.home().join("global-ignore");
    write(&global, "*.swp\nfrom_global/\n");
    let status = sandbox.git(&repo).args(["config", "core.excludesFile", &global.to_string_lossy()]).status().expect("git config");
    assert!(status.success());
    for dir in DIR_NAMES {
        std::fs::create_dir_all(repo.join(dir)).expect("mkdir");
    }
    for dir in std::iter::once("").chain(DIR_NAMES.iter().copied()) {
        for name in FILE_NAMES {
            let path = repo.join(dir).join(name);
            if !path.exists() {
                write(&path, "x");
            }
        }
    }
    // A symlink named like a dir-only pattern is not a directory for git.
    std::os::unix::fs::symlink("/etc", repo.join("x/link_dironly")).expect("symlink");
    std::os::unix::fs::symlink("/etc", repo.join("out2")).expect("symlink");
    assert_parity(&sandbox, "tricky corpus");
}

#[test]
fn parity_with_default_global_excludes_file() {
    let sandbox = Sandbox::new();
    let repo = sandbox.repo();
    sandbox.init(&repo);
    // No core.excludesFile: git falls back to $HOME/.config/git/ignore.
    write(&sandbox.home().join(".config/git/ignore"), "*.swp\n");
    write(&repo.join("a.swp"), "x");
    write(&repo.join("b.txt"), "x");
    write(&repo.join("d/c.swp"), "x");
    assert_parity(&sandbox, "default excludes file");
    let mut paths = Vec::new();
    all_paths(&repo, Path::new(""), &[], &mut paths);
    assert!(our_ignored(&sandbox, Path::new(""), &paths).contains(Path::new("a.swp")));
}

#[test]
fn nested_repository_uses_its_own_rules() {
    let sandbox = Sandbox::new();
    let repo = sandbox.repo();
    sandbox.init(&repo);
    write(&repo.join(".gitignore"), "*.c\n");
    let nested = repo.join("vendor/lib");
    std::fs::create_dir_all(&nested).expect("mkdir");
    sandbox.init(&nested);
    write(&nested.join(".gitignore"), "*.h\nbuild/\n");
    write(&nested.join(".git/info/exclude"), "*.tmp\n");
    for f in ["x.c", "x.h", "x.tmp", "build/o", "src/y.h", "src/y.c"] {
        write(&nested.join(f), "x");
        write(&repo.join(f), "x");
    }
    // Outer repository, excluding the nested one.
    let mut outer_paths = Vec::new();
    all_paths(&repo, Path::new(""), &[PathBuf::from("vendor/lib")], &mut outer_paths);
    let git = git_ignored(&sandbox, &repo, &outer_paths);
    let ours = our_ignored(&sandbox, Path::new(""), &outer_paths);
    assert_eq!(git, ours, "outer repository");
    // Nested repository, with its own rules.
    let mut inner_paths = Vec::new();
    all_paths(&nested, Path::new(""), &[], &mut inner_paths);
    let git = git_ignored(&sandbox, &nested, &inner_paths);
    let ours = our_ignored(&sandbox, Path::new("vendor/lib"), &inner_paths);
    assert_eq!(git, ours, "nested repository");
    assert!(ours.contains(Path::new("x.h")) && !ours.contains(Path::new("x.c")));
}

/// A tiny deterministic generator (no external crate needed).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) as usize) % n
    }
}

#[test]
fn parity_on_generated_patterns() {
    const SEGMENTS: &[&str] = &["a", "b", "ab", "*", "?", "**", "a*", "*b", "[ab]", "[!a]", "\\*", "a?", "[a-b]b", "*.x"];
    const NAMES: &[&str] = &["a", "b", "ab", "ba", "aa", "bb", "a.x", "*", "ab.x"];
    let mut rng = Lcg(0x5eed);
    for round in 0..25 {
        let sandbox = Sandbox::new();
        let repo = sandbox.repo();
        sandbox.init(&repo);
        let mut gitignore = String::new();
        for _ in 0..6 {
            let mut pattern = String::new();
            if rng.next(4) == 0 {
                pattern.push('!');
            }
            if rng.next(4) == 0 {
                pattern.push('/');
            }
            let segments = 1 + rng.next(3);
            for s in 0..segments {
                if s > 0 {
                    pattern.push('/');
                }
                pattern.push_str(SEGMENTS[rng.next(SEGMENTS.len())]);
            }
            if rng.next(3) == 0 {
                pattern.push('/');
            }
            gitignore.push_str(&pattern);
            gitignore.push('\n');
        }
        let nested_gitignore = format!("{}\n!{}\n", SEGMENTS[rng.next(SEGMENTS.len())], NAMES[rng.next(NAMES.len())]);
        write(&repo.join(".gitignore"), &gitignore);
        write(&repo.join("a/.gitignore"), &nested_gitignore);
        for d1 in ["a", "b", "ab"] {
            for d2 in ["a", "b"] {
                std::fs::create_dir_all(repo.join(d1).join(d2)).expect("mkdir");
            }
        }
        for d1 in ["", "a", "b", "ab"] {
            for d2 in ["", "a", "b"] {
                for name in NAMES {
                    let path = repo.join(d1).join(d2).join(name);
                    if !path.exists() {
                        write(&path, "x");
                    }
                }
            }
        }
        assert_parity(&sandbox, &format!("round {round}: .gitignore {gitignore:?}, a/.gitignore {nested_gitignore:?}"));
    }
}

#[test]
fn anticipated_literal_dirs() {
    let sandbox = Sandbox::new();
    let repo = sandbox.repo();
    sandbox.init(&repo);
    write(&repo.join("web/.gitignore"), ".venv/\n");
    // From info/exclude; the root .gitignore re-includes one of them.
    write(&repo.join(".git/info/exclude"), "excluded-dir/\nreincluded/\n");
    write(&repo.join(".gitignore"), "node_modules/\n/target\n*.pyc\nbuild-*/\n!node_modules/\nnode_modules/\n!reincluded/\n");
    write(&repo.join("src/main.rs"), "fn main() {}");
    let root = open_root_dir(&repo).expect("open");
    let scan = scan_ignored(root.as_fd(), &repo, &sandbox.settings()).expect("scan");
    assert_eq!(
        scan.anticipated_dirs,
        vec![PathBuf::from("excluded-dir"), PathBuf::from("node_modules"), PathBuf::from("target"), PathBuf::from("web/.venv")]
    );
    assert!(scan.present.is_empty(), "{:?}", scan.present);
}
