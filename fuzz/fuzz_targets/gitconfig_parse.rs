//! mounts/src/gitconfig.rs: any bytes as a repository's git config (a
//! hostile repository writes it). Parsing never fails; includes are the
//! non-empty `include.path` / `includeIf.*.path` entries; expanding no
//! include changes nothing; merging a file after itself changes no value,
//! and a merged file's values win. (The differential check against git is
//! `gitconfig_git`.)
#![no_main]

use lazaret_mounts::gitconfig::GitConfig;
use libfuzzer_sys::fuzz_target;

/// The keys Lazaret reads.
const KEYS: [(&str, &str); 6] = [
    ("core", "excludesFile"),
    ("core", "hooksPath"),
    ("core", "ignoreCase"),
    ("core", "worktree"),
    ("extensions", "worktreeConfig"),
    ("include", "path"),
];

fuzz_target!(|data: &[u8]| {
    let config = GitConfig::parse(data);
    let lines = data.split(|&b| b == b'\n').count();
    for &line in config.skipped_lines() {
        assert!(line >= 1 && line <= lines, "skipped line {line} of {lines}");
    }
    for include in config.includes() {
        assert!(!include.path.is_empty());
    }
    let expanded = config.expand_includes(|_| Ok::<_, ()>(None)).expect("no error");
    let mut doubled = config.clone();
    doubled.merge(config.clone());
    let mut overridden = config.clone();
    overridden.merge(GitConfig::parse(b"[core]\nhooksPath = /fuzz/hooks\n"));
    assert_eq!(overridden.get("core", "hooksPath"), Some("/fuzz/hooks"));
    for (section, key) in KEYS {
        let value = config.get(section, key);
        assert_eq!(expanded.get(section, key), value);
        assert_eq!(doubled.get(section, key), value);
        assert_eq!(config.get(&section.to_ascii_uppercase(), &key.to_ascii_uppercase()), value, "names are case-insensitive");
        let _ = config.get_bool(section, key);
    }
});
