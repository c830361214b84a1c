//! Differential oracle for mounts/src/gitconfig.rs: the same file read by
//! `git config --file F --list -z`, by each git installed (`git` on PATH,
//! /usr/bin/git, /usr/local/bin/git). Where a git accepts the file, our
//! reading must be exact (no skipped line) and every key without a
//! subsection must have that git's last value: the current reading for git
//! 2.46 and later, the older one before. Slow (one git process per input and
//! git): run it on the corpus (`scripts/fuzz.sh smoke` does) and for long
//! runs on its own.
#![no_main]

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use lazaret_mounts::gitconfig::GitConfig;
use libfuzzer_sys::fuzz_target;

fn scratch() -> &'static tempfile::TempDir {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().expect("tempdir"))
}

/// A git to compare with, and whether it reads whitespace inside a value as
/// it stands (2.46 and later).
struct Git {
    program: String,
    keeps_inner_whitespace: bool,
}

fn gits() -> &'static [Git] {
    static GITS: OnceLock<Vec<Git>> = OnceLock::new();
    GITS.get_or_init(|| {
        let mut seen = Vec::new();
        let mut gits = Vec::new();
        for program in ["git", "/usr/bin/git", "/usr/local/bin/git"] {
            let Ok(out) = Command::new(program).arg("--version").output() else { continue };
            let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if !out.status.success() || seen.contains(&version) {
                continue;
            }
            // "git version 2.39.5"
            let mut numbers = version.trim_start_matches("git version ").split('.').map(|n| n.parse::<u32>().unwrap_or(0));
            let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
            gits.push(Git { program: program.to_owned(), keeps_inner_whitespace: (major, minor) >= (2, 46) });
            seen.push(version);
        }
        assert!(!gits.is_empty(), "git must be installed for gitconfig_git");
        gits
    })
}

fuzz_target!(|data: &[u8]| {
    if data.contains(&0) {
        return;
    }
    let dir = scratch().path();
    let file = dir.join("config");
    std::fs::write(&file, data).expect("write config");
    let ours = GitConfig::parse(data);
    for git in gits() {
        compare(git, &file, data, &ours);
    }
});

fn compare(git: &Git, file: &std::path::Path, data: &[u8], ours: &GitConfig) {
    let dir = scratch().path();
    let output = Command::new(&git.program)
        .arg("config")
        .arg("--file")
        .arg(file)
        .args(["--no-includes", "--list", "-z"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
        .env("HOME", dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("run git");
    if !output.status.success() {
        return;
    }
    let text = String::from_utf8_lossy(data);
    assert!(ours.skipped_lines().is_empty(), "{} accepts the file but lines {:?} were skipped:\n{text}", git.program, ours.skipped_lines());
    // key NL value NUL, or key NUL for a key without a value (true).
    let mut last: BTreeMap<(String, String), String> = BTreeMap::new();
    for record in output.stdout.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        let record = String::from_utf8_lossy(record);
        let (name, value) = record.split_once('\n').unwrap_or((&record, "true"));
        // section.key (no subsection): exactly one dot.
        let Some((section, key)) = name.split_once('.') else { continue };
        if key.contains('.') {
            continue;
        }
        last.insert((section.to_owned(), key.to_owned()), value.to_owned());
    }
    for ((section, key), value) in &last {
        let readings = ours.get_readings(section, key);
        let expected = if git.keeps_inner_whitespace { readings.first() } else { readings.last() };
        assert_eq!(expected.copied(), Some(value.as_str()), "{section}.{key} as {} reads it, in:\n{text}", git.program);
    }
}
