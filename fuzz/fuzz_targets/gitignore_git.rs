//! Differential oracle for mounts/src/ignore_eval.rs: the same `.gitignore`
//! and paths given to `git check-ignore` in a scratch repository, which
//! must agree path by path. Slow (one git process per input): run it on the
//! corpus (`scripts/fuzz.sh smoke` does) and for long runs on its own.
//!
//! Input: the `.gitignore` text, a NUL, then up to 8 paths, one a line; a
//! path ending in `/` is a directory. Paths of at most two components are
//! created on disk (so git knows what is a directory); a path inside an
//! ignored directory is ignored, as git reports it.
#![no_main]

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use lazaret_mounts::ignore_eval::fuzz_is_ignored;
use libfuzzer_sys::fuzz_target;

struct Repo {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn git(repo: &Path) -> Command {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(repo)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
        .env("HOME", repo)
        .env("XDG_CONFIG_HOME", repo.join(".git/xdg"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        // The paths are file names, not pathspecs: without this git reads a
        // leading ':' as pathspec magic (":d/z" is "d/z") and answers for
        // another path than the one asked.
        .env("GIT_LITERAL_PATHSPECS", "1");
    command
}

fn repo() -> &'static Repo {
    static REPO: OnceLock<Repo> = OnceLock::new();
    REPO.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("work");
        std::fs::create_dir(&path).expect("mkdir");
        let status = git(&path).args(["init", "-q"]).status().expect("git must be installed for gitignore_git");
        assert!(status.success(), "git init failed");
        Repo { _dir: dir, path }
    })
}

fn clean(work: &Path) {
    for entry in std::fs::read_dir(work).expect("read repo") {
        let entry = entry.expect("entry");
        if entry.file_name() == ".git" {
            continue;
        }
        let path = entry.path();
        if entry.file_type().expect("type").is_dir() {
            std::fs::remove_dir_all(&path).expect("rm dir");
        } else {
            std::fs::remove_file(&path).expect("rm file");
        }
    }
}

fn usable(component: &[u8]) -> bool {
    !component.is_empty() && component != b"." && component != b".." && !component.eq_ignore_ascii_case(b".git") && component != b".gitignore"
}

fuzz_target!(|data: &[u8]| {
    let mut parts = data.splitn(2, |&b| b == 0);
    let gitignore = parts.next().unwrap_or_default();
    let Some(rest) = parts.next() else { return };
    let work = &repo().path;
    clean(work);
    std::fs::write(work.join(".gitignore"), gitignore).expect("write .gitignore");
    // (path, is_dir) of what exists on disk.
    let mut paths: Vec<(Vec<u8>, bool)> = Vec::new();
    for line in rest.split(|&b| b == b'\n').take(8) {
        let (line, is_dir) = match line.strip_suffix(b"/") {
            Some(stripped) => (stripped, true),
            None => (line, false),
        };
        let components: Vec<&[u8]> = line.split(|&b| b == b'/').collect();
        if components.len() > 2 || !components.iter().all(|c| usable(c) && !c.contains(&0)) {
            continue;
        }
        let on_disk = work.join(Path::new(std::ffi::OsStr::from_bytes(line)));
        let made = if components.len() == 2 {
            let parent = work.join(Path::new(std::ffi::OsStr::from_bytes(components[0])));
            std::fs::create_dir_all(&parent).is_ok() && parent.is_dir()
        } else {
            true
        } && if is_dir { std::fs::create_dir(&on_disk).is_ok() } else { std::fs::File::create_new(&on_disk).is_ok() };
        if made {
            paths.push((line.to_vec(), is_dir));
        }
    }
    if paths.is_empty() {
        return;
    }
    // git reads the paths from a file, not a pipe: a git that exits before
    // reading them (it refuses the input) would otherwise get the fuzzer
    // killed by SIGPIPE, which libFuzzer's main leaves at its default (CI
    // saw it once on a loaded machine).
    let mut input = Vec::new();
    for (path, _) in &paths {
        input.extend_from_slice(path);
        input.push(0);
    }
    let input_file = work.parent().expect("the repository's parent").join("check-ignore-input");
    std::fs::write(&input_file, &input).expect("write the paths");
    let output = git(work)
        .args(["check-ignore", "--no-index", "-v", "-n", "-z", "--stdin"])
        .stdin(std::fs::File::open(&input_file).expect("open the paths"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .expect("git check-ignore");
    // 0: some path ignored, 1: none; anything else is git refusing the input.
    if !matches!(output.status.code(), Some(0 | 1)) {
        return;
    }
    let fields: Vec<&[u8]> = output.stdout.split(|&b| b == 0).collect();
    let records: Vec<&[&[u8]]> = fields.chunks_exact(4).collect();
    assert_eq!(records.len(), paths.len(), "git answered {} records for {} paths", records.len(), paths.len());
    for ((path, is_dir), record) in paths.iter().zip(records) {
        assert_eq!(record[3], path.as_slice(), "git's records are out of order");
        let pattern = record[2];
        let git_says = !pattern.is_empty() && !pattern.starts_with(b"!");
        let parent_ignored = match path.iter().position(|&b| b == b'/') {
            Some(slash) => fuzz_is_ignored(gitignore, &path[..slash], true, false),
            None => false,
        };
        let we_say = parent_ignored || fuzz_is_ignored(gitignore, path, *is_dir, false);
        assert_eq!(
            we_say,
            git_says,
            "path {:?} (dir: {is_dir}), .gitignore {:?}: git says {} (pattern {:?}, line {:?})",
            String::from_utf8_lossy(path),
            String::from_utf8_lossy(gitignore),
            if git_says { "ignored" } else { "not ignored" },
            String::from_utf8_lossy(pattern),
            String::from_utf8_lossy(record[1]),
        );
    }
});
