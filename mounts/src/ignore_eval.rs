//! Deciding which workspace paths are git-ignored, exactly as git does.
//!
//! This is a port of git's `dir.c` exclude logic (pattern parsing,
//! `match_basename`, `match_pathname`, precedence) on top of the
//! [`wildmatch`](crate::wildmatch) port. Sources, highest precedence first:
//! the `.gitignore` of the deepest directory up to the work tree root, then
//! `$GIT_COMMON_DIR/info/exclude`, then `core.excludesFile` (default
//! `$XDG_CONFIG_HOME/git/ignore`). Nested repositories and submodules are
//! evaluated with their own rules. Git itself is never run.
//!
//! Everything is read fd-relative with [`safe_path`](crate::safe_path): a
//! symlinked `.gitignore` is skipped (git >= 2.32 does the same), a
//! symlinked directory is never descended into.

use std::collections::BTreeSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::fcntl::OFlag;

use crate::error::MountError;
use crate::gitconfig::GitConfig;
use crate::repo::{self, RepoLocation, SMALL_FILE_LIMIT};
use crate::safe_path::{self, FileKind};
use crate::wildmatch::{CASEFOLD, PATHNAME, wildmatch};

/// Directory names that are treated as directories even when a `.gitignore`
/// names them without a trailing `/` (e.g. cargo's `/target`), so that they
/// are isolated before they exist.
pub const WELL_KNOWN_DIRS: &[&str] = &[
    "node_modules",
    "target",
    ".venv",
    "venv",
    "__pycache__",
    ".tox",
    ".mypy_cache",
    ".pytest_cache",
    ".gradle",
    ".next",
    ".nuxt",
    "dist",
    "build",
    ".cache",
    "vendor",
    "bower_components",
    ".terraform",
    "_build",
    "deps",
    ".bundle",
];

/// One `.gitignore`-style pattern, parsed as git's `parse_path_pattern`.
#[derive(Debug, Clone)]
struct Pattern {
    /// Pattern text without the `!` and trailing `/`.
    text: Vec<u8>,
    negative: bool,
    must_be_dir: bool,
    /// No `/` in the pattern (other than a trailing one): match basenames.
    no_dir: bool,
    /// `*literal`: suffix comparison of the basename.
    ends_with: bool,
    /// Length of the leading part without wildcards.
    no_wildcard_len: usize,
    /// Directory of the file the pattern came from, relative to the work
    /// tree root, without trailing slash ("" for the root).
    base: Vec<u8>,
}

fn is_glob_special(c: u8) -> bool {
    matches!(c, b'*' | b'?' | b'[' | b'\\')
}

fn simple_length(s: &[u8]) -> usize {
    s.iter().position(|&c| is_glob_special(c)).unwrap_or(s.len())
}

/// git's `trim_trailing_spaces`: unescaped trailing spaces go.
fn trim_trailing_spaces(line: &[u8]) -> &[u8] {
    let mut last_space: Option<usize> = None;
    let mut i = 0;
    while i < line.len() {
        match line[i] {
            b' ' => {
                if last_space.is_none() {
                    last_space = Some(i);
                }
            }
            b'\\' => {
                i += 1;
                if i >= line.len() {
                    return line;
                }
                last_space = None;
            }
            _ => last_space = None,
        }
        i += 1;
    }
    match last_space {
        Some(end) => &line[..end],
        None => line,
    }
}

/// Parses a whole ignore file (git's `add_patterns_from_buffer`).
fn parse_patterns(buf: &[u8], base: &[u8]) -> Vec<Pattern> {
    let buf = buf.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(buf);
    let mut patterns = Vec::new();
    for raw in buf.split(|&c| c == b'\n') {
        if raw.is_empty() || raw[0] == b'#' {
            continue;
        }
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = trim_trailing_spaces(line);
        let (negative, mut text) = match line.strip_prefix(b"!") {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let mut must_be_dir = false;
        if let Some(stripped) = text.strip_suffix(b"/") {
            must_be_dir = true;
            text = stripped;
        }
        let no_dir = !text.contains(&b'/');
        let ends_with = text.first() == Some(&b'*') && simple_length(&text[1..]) == text.len() - 1;
        patterns.push(Pattern {
            text: text.to_vec(),
            negative,
            must_be_dir,
            no_dir,
            ends_with,
            no_wildcard_len: simple_length(text),
            base: base.to_vec(),
        });
    }
    patterns
}

fn bytes_eq(a: &[u8], b: &[u8], casefold: bool) -> bool {
    if casefold { a.eq_ignore_ascii_case(b) } else { a == b }
}

impl Pattern {
    /// git's `match_basename` / `match_pathname` for one path (relative to
    /// the work tree root, no trailing slash).
    fn matches(&self, path: &[u8], basename: &[u8], is_dir: bool, casefold: bool) -> bool {
        if self.must_be_dir && !is_dir {
            return false;
        }
        let fold = if casefold { CASEFOLD } else { 0 };
        if self.no_dir {
            let pattern = &self.text;
            if self.no_wildcard_len == pattern.len() {
                return bytes_eq(pattern, basename, casefold);
            }
            if self.ends_with {
                let suffix = &pattern[1..];
                return suffix.len() <= basename.len() && bytes_eq(suffix, &basename[basename.len() - suffix.len()..], casefold);
            }
            return wildmatch(pattern, basename, fold);
        }
        // match_pathname
        let mut pattern: &[u8] = &self.text;
        let mut prefix = self.no_wildcard_len;
        if pattern.first() == Some(&b'/') {
            pattern = &pattern[1..];
            prefix = prefix.saturating_sub(1);
        }
        let base = &self.base;
        if path.len() < base.len() + 1 || (!base.is_empty() && path[base.len()] != b'/') || !bytes_eq(&path[..base.len()], base, casefold) {
            return false;
        }
        let mut name = if base.is_empty() { path } else { &path[base.len() + 1..] };
        if prefix > 0 {
            if prefix > name.len() || !bytes_eq(&pattern[..prefix], &name[..prefix], casefold) {
                return false;
            }
            pattern = &pattern[prefix..];
            name = &name[prefix..];
            if pattern.is_empty() && name.is_empty() {
                return true;
            }
        }
        wildmatch(pattern, name, PATHNAME | fold)
    }
}

/// The developer's (trusted) git settings that influence ignore rules.
#[derive(Debug, Clone, Default)]
pub struct HostGitSettings {
    /// The developer's home directory (for `~/.gitconfig`, `~/` expansion).
    pub home: Option<PathBuf>,
    /// `$XDG_CONFIG_HOME` (default `$HOME/.config`).
    pub xdg_config_home: Option<PathBuf>,
    /// The system config file, normally `/etc/gitconfig`.
    pub system_config: Option<PathBuf>,
}

impl HostGitSettings {
    /// Settings for a developer whose home is `home` (system config
    /// `/etc/gitconfig`, `$XDG_CONFIG_HOME` from the environment if set).
    pub fn for_home(home: Option<PathBuf>) -> Self {
        HostGitSettings {
            xdg_config_home: std::env::var_os("XDG_CONFIG_HOME").map(PathBuf::from).filter(|p| p.is_absolute()),
            home,
            system_config: Some(PathBuf::from("/etc/gitconfig")),
        }
    }

    fn xdg_dir(&self) -> Option<PathBuf> {
        self.xdg_config_home.clone().or_else(|| self.home.as_ref().map(|h| h.join(".config")))
    }

    /// The developer's merged system + global config (trusted host files).
    pub fn global_config(&self) -> GitConfig {
        let mut config = GitConfig::default();
        let mut files: Vec<PathBuf> = Vec::new();
        files.extend(self.system_config.clone());
        files.extend(self.xdg_dir().map(|d| d.join("git/config")));
        files.extend(self.home.as_ref().map(|h| h.join(".gitconfig")));
        for file in files {
            if let Ok(text) = std::fs::read(&file) {
                config.merge(GitConfig::parse(&text));
            }
        }
        config
    }

    /// Expands `~/` in a config path value.
    fn expand(&self, value: &str) -> Option<PathBuf> {
        if let Some(rest) = value.strip_prefix("~/") {
            return self.home.as_ref().map(|h| h.join(rest));
        }
        if value.starts_with('~') {
            return None;
        }
        Some(PathBuf::from(value))
    }
}

/// A path that is ignored and present, top-most (its parent is not ignored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredEntry {
    /// Relative to the workspace root.
    pub path: PathBuf,
    /// What is there on the host.
    pub kind: FileKind,
}

/// Result of scanning a workspace.
#[derive(Debug, Clone, Default)]
pub struct IgnoreScan {
    /// Top-most ignored paths present at scan time, sorted.
    pub present: Vec<IgnoredEntry>,
    /// Directories named literally in an ignore file (trailing `/`, or a
    /// [`WELL_KNOWN_DIRS`] name) that do not exist yet and would be ignored:
    /// the caller creates them as mount points. Sorted, workspace-relative.
    pub anticipated_dirs: Vec<PathBuf>,
    /// Work trees of the repositories met (the workspace's own as `""`,
    /// nested repositories and submodules outside ignored paths).
    pub repositories: Vec<PathBuf>,
    /// Non-fatal oddities (skipped symlinked `.gitignore`, unreadable
    /// excludes file, ...), for the launch log.
    pub warnings: Vec<String>,
}

/// Rules shared by a whole repository (not per directory).
struct RepoRules {
    /// `[core.excludesFile, info/exclude]`: later entries win.
    global: Vec<Vec<Pattern>>,
    casefold: bool,
}

/// Scans the workspace (whose canonical absolute path is `workspace_abs`,
/// opened as `workspace`) and returns its top-most ignored paths.
///
/// If the workspace root is not a git work tree, nothing is ignored.
pub fn scan_ignored(workspace: BorrowedFd<'_>, workspace_abs: &Path, host: &HostGitSettings) -> Result<IgnoreScan, MountError> {
    let mut scan = IgnoreScan::default();
    let global_config = host.global_config();
    if let Some(location) = repo::locate(workspace, workspace_abs, Path::new(""))? {
        scan_repo(workspace, workspace_abs, &location, host, &global_config, &mut scan)?;
    }
    scan.present.sort_by(|a, b| a.path.cmp(&b.path));
    scan.present.dedup();
    let anticipated: BTreeSet<PathBuf> = scan.anticipated_dirs.drain(..).collect();
    scan.anticipated_dirs = anticipated.into_iter().collect();
    Ok(scan)
}

fn scan_repo(
    workspace: BorrowedFd<'_>,
    workspace_abs: &Path,
    location: &RepoLocation,
    host: &HostGitSettings,
    global_config: &GitConfig,
    scan: &mut IgnoreScan,
) -> Result<(), MountError> {
    scan.repositories.push(location.worktree.clone());
    let mut config = global_config.clone();
    config.merge(repo::read_repo_config(workspace, location)?);
    let casefold = config.get_bool("core", "ignoreCase").unwrap_or(false);
    let mut global = Vec::new();
    let excludes_file = match config.get("core", "excludesFile") {
        Some(value) => host.expand(value),
        None => host.xdg_dir().map(|d| d.join("git/ignore")),
    };
    if let Some(path) = excludes_file {
        match read_excludes_file(workspace, workspace_abs, &location.worktree, &path) {
            Ok(Some(text)) => global.push(parse_patterns(&text, b"")),
            Ok(None) => {}
            Err(e) => scan.warnings.push(format!("core.excludesFile not used: {e}")),
        }
    }
    match location.common_dir.read_file(workspace, "info/exclude") {
        Ok(Some(text)) => global.push(parse_patterns(&text, b"")),
        Ok(None) => {}
        Err(e) => scan.warnings.push(format!("info/exclude not used: {e}")),
    }
    let rules = RepoRules { global, casefold };
    let root = safe_path::open_dir_beneath(workspace, &location.worktree)?;
    let mut stack: Vec<Vec<Pattern>> = Vec::new();
    let mut walker = Walker { workspace, workspace_abs, host, global_config, location, rules: &rules, scan };
    walker.walk_dir(root, Vec::new(), &mut stack)
}

/// Reads `core.excludesFile` as git would (it may come from the repository's
/// own config, so it is attacker-chosen): a path inside the workspace is read
/// fd-relative; a path outside is opened from `/` refusing symlinks, and in
/// both cases only a regular file of at most 1 MiB is read (never a fifo or
/// device). Its content only decides which paths get isolated.
fn read_excludes_file(
    workspace: BorrowedFd<'_>,
    workspace_abs: &Path,
    worktree: &Path,
    path: &Path,
) -> Result<Option<Vec<u8>>, MountError> {
    let absolute = if path.is_absolute() { repo::normalize(path) } else { repo::normalize(&workspace_abs.join(worktree).join(path)) }
        .ok_or_else(|| MountError::refused(path, "invalid path"))?;
    if let Ok(rel) = absolute.strip_prefix(workspace_abs) {
        return safe_path::read_beneath(workspace, rel, SMALL_FILE_LIMIT);
    }
    let root = safe_path::open_root_dir(Path::new("/"))?;
    let rel = absolute.strip_prefix("/").map_err(|_| MountError::refused(&absolute, "expected an absolute path"))?;
    safe_path::read_beneath(root.as_fd(), rel, SMALL_FILE_LIMIT)
}

/// Is `path` (relative to the work tree root) ignored, given the stack of
/// per-directory pattern lists (outermost first)?
fn is_ignored(path: &[u8], is_dir: bool, stack: &[Vec<Pattern>], rules: &RepoRules) -> bool {
    let basename = path.rsplit(|&c| c == b'/').next().unwrap_or(path);
    for list in stack.iter().rev().chain(rules.global.iter().rev()) {
        for pattern in list.iter().rev() {
            if pattern.matches(path, basename, is_dir, rules.casefold) {
                return !pattern.negative;
            }
        }
    }
    false
}

/// Whether `path` (relative to the work tree root, no trailing slash) is
/// ignored by the patterns of a root `.gitignore` holding `gitignore`, as
/// git decides it for a path whose parent directories are not ignored. For
/// the fuzz targets in `fuzz/` (docs/fuzzing.md): not part of the API.
#[doc(hidden)]
pub fn fuzz_is_ignored(gitignore: &[u8], path: &[u8], is_dir: bool, casefold: bool) -> bool {
    let stack = vec![parse_patterns(gitignore, b"")];
    let rules = RepoRules { global: Vec::new(), casefold };
    is_ignored(path, is_dir, &stack, &rules)
}

/// Adds literal directory patterns of `list` that do not exist yet under
/// `dir` (relative to the work tree) and would be ignored there.
fn collect_anticipated(
    list: &[Pattern],
    dir: &[u8],
    rules: &RepoRules,
    stack: &[Vec<Pattern>],
    location: &RepoLocation,
    workspace: BorrowedFd<'_>,
    scan: &mut IgnoreScan,
) -> Result<(), MountError> {
    for pattern in list {
        if pattern.negative || pattern.no_wildcard_len != pattern.text.len() {
            continue;
        }
        let text = pattern.text.strip_prefix(b"/").unwrap_or(&pattern.text);
        if text.is_empty() || text.split(|&c| c == b'/').any(|c| c.is_empty() || c == b"." || c == b"..") {
            continue;
        }
        let last = text.rsplit(|&c| c == b'/').next().unwrap_or(text);
        let well_known = WELL_KNOWN_DIRS.iter().any(|name| name.as_bytes() == last);
        if !pattern.must_be_dir && !well_known {
            continue;
        }
        if last == b".git" {
            continue;
        }
        let mut rel = dir.to_vec();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(text);
        // Must be ignored as a directory, with no ignored ancestor (then the
        // ancestor is the top-most ignored path and already handled).
        if !is_ignored(&rel, true, stack, rules) {
            continue;
        }
        let components: Vec<&[u8]> = rel.split(|&c| c == b'/').collect();
        let mut ancestor_ignored = false;
        for depth in 1..components.len() {
            let ancestor = components[..depth].join(&b'/');
            if is_ignored(&ancestor, true, stack, rules) {
                ancestor_ignored = true;
                break;
            }
        }
        if ancestor_ignored {
            continue;
        }
        let rel_path = location.worktree.join(Path::new(std::ffi::OsStr::from_bytes(&rel)));
        let parent = rel_path.parent().unwrap_or(Path::new(""));
        // Only when the parent exists as a real directory and the entry does not.
        let Ok(parent_fd) = safe_path::open_dir_beneath(workspace, parent) else { continue };
        let name = rel_path.file_name().unwrap_or_default();
        if safe_path::open_path_beneath(parent_fd.as_fd(), Path::new(name))?.is_none() {
            scan.anticipated_dirs.push(rel_path);
        }
    }
    Ok(())
}

struct Walker<'a, 'fd> {
    workspace: BorrowedFd<'fd>,
    workspace_abs: &'a Path,
    host: &'a HostGitSettings,
    global_config: &'a GitConfig,
    location: &'a RepoLocation,
    rules: &'a RepoRules,
    scan: &'a mut IgnoreScan,
}

impl Walker<'_, '_> {
    /// Walks one directory (`dir` is its O_PATH fd, `rel` its path relative
    /// to the work tree root).
    fn walk_dir(&mut self, dir: OwnedFd, rel: Vec<u8>, stack: &mut Vec<Vec<Pattern>>) -> Result<(), MountError> {
        let rel_path = self.location.worktree.join(Path::new(std::ffi::OsStr::from_bytes(&rel)));
        let list = match safe_path::read_beneath(dir.as_fd(), Path::new(".gitignore"), SMALL_FILE_LIMIT) {
            Ok(Some(text)) => parse_patterns(&text, &rel),
            Ok(None) => Vec::new(),
            Err(e) => {
                self.scan
                    .warnings
                    .push(format!("{} skipped (git skips it too): {e}", lazaret_protocol::display::escaped(&rel_path.join(".gitignore"))));
                Vec::new()
            }
        };
        stack.push(list);
        let result = self.walk_entries(&dir, &rel, &rel_path, stack);
        stack.pop();
        result
    }

    fn walk_entries(&mut self, dir: &OwnedFd, rel: &[u8], rel_path: &Path, stack: &mut Vec<Vec<Pattern>>) -> Result<(), MountError> {
        if let Some(list) = stack.last() {
            let list = list.clone();
            collect_anticipated(&list, rel, self.rules, stack, self.location, self.workspace, self.scan)?;
        }
        if rel.is_empty() {
            // info/exclude and core.excludesFile name paths from the work tree
            // root; evaluated with the root .gitignore already on the stack.
            for list in &self.rules.global {
                collect_anticipated(list, rel, self.rules, stack, self.location, self.workspace, self.scan)?;
            }
        }
        for (name, kind) in list_dir(dir.as_fd(), rel_path)? {
            if name == b".git" {
                continue;
            }
            let mut child = rel.to_vec();
            if !child.is_empty() {
                child.push(b'/');
            }
            child.extend_from_slice(&name);
            let child_path = rel_path.join(std::ffi::OsStr::from_bytes(&name));
            let is_dir = kind == FileKind::Directory;
            if is_ignored(&child, is_dir, stack, self.rules) {
                self.scan.present.push(IgnoredEntry { path: child_path, kind });
                continue;
            }
            if !is_dir {
                continue;
            }
            let child_fd = safe_path::open_dir_beneath(dir.as_fd(), Path::new(std::ffi::OsStr::from_bytes(&name)))?;
            if let Some(nested) = repo::locate(self.workspace, self.workspace_abs, &child_path)? {
                // A nested repository or submodule: its own rules apply.
                let nested = RepoLocation { worktree: child_path.clone(), ..nested };
                scan_repo(self.workspace, self.workspace_abs, &nested, self.host, self.global_config, self.scan)?;
                continue;
            }
            self.walk_dir(child_fd, child, stack)?;
        }
        Ok(())
    }
}

/// Finds every repository work tree in the workspace (directories holding a
/// `.git` entry), ignored or not, without following symlinks or entering
/// `.git` directories. Used when ignored-path isolation is off, so that
/// nested repositories in ignored directories still get Git Sentry.
pub fn find_repositories(workspace: BorrowedFd<'_>) -> Result<Vec<PathBuf>, MountError> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(rel) = pending.pop() {
        let dir = safe_path::open_dir_beneath(workspace, &rel)?;
        for (name, kind) in list_dir(dir.as_fd(), &rel)? {
            if name == b".git" {
                found.push(rel.clone());
                continue;
            }
            if kind == FileKind::Directory {
                pending.push(rel.join(std::ffi::OsStr::from_bytes(&name)));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Lists a directory (sorted by name) without following anything.
fn list_dir(dir: BorrowedFd<'_>, rel_path: &Path) -> Result<Vec<(Vec<u8>, FileKind)>, MountError> {
    let fd = safe_path::open_beneath(dir, Path::new(""), OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
    let mut listing = Dir::from_fd(fd).map_err(|e| MountError::sys("opendir", rel_path, e))?;
    let mut entries = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| MountError::sys("readdir", rel_path, e))?;
        let name = entry.file_name().to_bytes().to_vec();
        if name == b"." || name == b".." {
            continue;
        }
        let kind = match entry.file_type() {
            Some(Type::Directory) => FileKind::Directory,
            Some(Type::File) => FileKind::Regular,
            Some(Type::Symlink) => FileKind::Symlink,
            Some(_) => FileKind::Other,
            None => {
                let st = nix::sys::stat::fstatat(dir, name.as_slice(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                    .map_err(|e| MountError::sys("fstatat", rel_path.join(std::ffi::OsStr::from_bytes(&name)), e))?;
                safe_path::kind_of(&st)
            }
        };
        entries.push((name, kind));
    }
    entries.sort();
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_line_of_many_stars_is_evaluated_in_milliseconds() {
        // Found by fuzz target gitignore_match (a libFuzzer timeout): git's
        // matcher retries the rest of the line at every position after each
        // `*`; without wildmatch's remembered outcomes this took minutes.
        let line: &[u8] = b"/******/***/*******/****/******/**/***/***/**/****/******/**/****/**/********/**/****/*******/****/******/**/***/***/***/**/********[;pht";
        let path: &[u8] = b"\xff\xff\xff\xff**/****/******/**/**aabc[**/*****/***\xff\xff\xff\xff/**\xff\xff*/****/*a/***/**/*/***";
        for casefold in [false, true] {
            for is_dir in [false, true] {
                assert!(!fuzz_is_ignored(line, path, is_dir, casefold), "an unclosed `[` matches nothing");
            }
        }
    }

    fn ignored(gitignore: &str, path: &str, is_dir: bool) -> bool {
        let rules = RepoRules { global: Vec::new(), casefold: false };
        let stack = vec![parse_patterns(gitignore.as_bytes(), b"")];
        is_ignored(path.as_bytes(), is_dir, &stack, &rules)
    }

    #[test]
    fn basics() {
        assert!(ignored("target/\n", "target", true));
        assert!(!ignored("target/\n", "target", false));
        assert!(ignored("target/\n", "a/b/target", true));
        assert!(!ignored("/target\n", "a/target", true));
        assert!(ignored("*.o\n!keep.o\n", "x.o", false));
        assert!(!ignored("*.o\n!keep.o\n", "keep.o", false));
        assert!(ignored("a/**/z\n", "a/z", true));
        assert!(ignored("a/**/z\n", "a/b/c/z", false));
        assert!(ignored("foo\\ \n", "foo ", false));
        assert!(ignored("foo   \n", "foo", false));
        assert!(ignored("\\#x\n", "#x", false));
        assert!(!ignored("#x\n", "#x", false));
        assert!(ignored("\\!x\n", "!x", false));
    }

    #[test]
    fn trailing_space_rules() {
        assert_eq!(trim_trailing_spaces(b"a  "), b"a");
        assert_eq!(trim_trailing_spaces(b"a\\ "), b"a\\ ");
        assert_eq!(trim_trailing_spaces(b"a\\  "), b"a\\ ");
        assert_eq!(trim_trailing_spaces(b"a\t"), b"a\t");
    }
}
