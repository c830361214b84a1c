//! The guard's one model of git (pure logic): which directories git takes
//! for git directories, and which files in them make the host's git run a
//! program or read from / connect to a place that the file names. The
//! engine (`neutralise`, `sweep`, `watch`) asks this module and nothing
//! else; each rule names the part of git it follows (git 2.47, `setup.c`,
//! `sequencer.c`, `builtin/am.c`, `merge.c`, `remote.c`, `connect.c`,
//! `object-file.c`, githooks(5), gitrepository-layout(5)).
//!
//! **What is a git directory.** git's discovery (`setup.c`:
//! `setup_git_directory_gently_1`) walks up from the working directory and
//! at each level takes `DIR/.git` (a directory, or a file `gitdir: PATH`,
//! `read_gitfile_gently`) and then `DIR` itself (a bare repository; safe by
//! default: `safe.bareRepository` is `all`) when `is_git_directory` holds:
//! `HEAD` is a valid head reference, and in the *common* directory
//! (`commondir`'s target when that file exists, else the directory itself)
//! `objects` and `refs` pass `access(X_OK)`: they may be symlinks, or even
//! executable files. The guard is at least as generous ([`GitDirMarks`]):
//! a directory is a git directory when it is named `.git`, or has `HEAD`
//! and `commondir` entries, or has `objects` and `refs` entries, of any
//! file type. The last clause needs no `HEAD`: a common directory is read
//! for its `config` and `hooks/` although git never checks it for a
//! `HEAD` of its own, and a `HEAD` can appear at any moment.
//!
//! **What git executes or fetches because of a git directory**
//! ([`ControlFile`]): `config`, `config.worktree` (filtered to an
//! allowlist, `config_filter`), `commondir` (only a linked worktree's own
//! `../..`), `gitdir` (a back-link), `hooks/*` (githooks(5)), `info/attributes`
//! (names filter and diff drivers), `objects/info/alternates` (git reads
//! objects from each path it lists, `object-file.c`:
//! `link_alt_odb_entries`) and `objects/info/http-alternates` (URLs, read by
//! dumb-HTTP fetches), and the state of an operation that git resumes
//! ([`operation_verdict`]): an interactive rebase's todo list (`exec` runs
//! a shell command), the merge strategy of a rebase (`rebase-merge/strategy`,
//! `rebase-apply/strategy`) or of a cherry-pick/revert sequence
//! (`sequencer/opts`, `options.strategy`), which `merge.c`:
//! `try_merge_command` runs as the program `git merge-<strategy>` (a value
//! with `/` or `..` becomes a path relative to the work tree), the signing
//! key of a resumed rebase or sequence (`gpg_sign_opt`,
//! `options.gpg-sign`: with `gpg.format = ssh` it is a key *file* path) and
//! the options of `git am`'s `git apply` (`rebase-apply/apply-opt`). Every
//! other file of the operation state is data (commit ids, messages,
//! author lines parsed in C, refs).
//!
//! **Hooks through the developer's own configuration**: a relative
//! `core.hooksPath` in the developer's global or system config is taken by
//! git relative to the directory hooks run in (the work tree's top, or the
//! git directory of a bare repository), so in every repository the agent
//! makes, a hook is wherever the agent writes that relative path
//! ([`host_hook`]).
//!
//! **Places** ([`UrlPlace`], [`local_place_inside`]): a remote's `url` or
//! `pushurl`, a submodule's `url`, a `branch.*.remote` or
//! `extensions.partialClone` that is not a remote's name (git takes it as
//! a URL, `remote.c`: `valid_remote_nick`), and an alternates entry name a
//! place git reads from or connects to, on its own during `status` or
//! `checkout` too (a promisor remote is fetched lazily for a missing
//! object). Only places inside the root the repository is in are kept:
//! local paths (and `file://`) that stay inside lexically and pass the
//! caller's no-symlink check. Network URLs are dropped whoever wrote them
//! (`transport.c`, `connect.c`: `scp-like host:path`, `scheme://`).

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

/// The entries of a directory that make it a git directory for git's
/// discovery (any file type: git only `access`es them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GitDirMarks {
    /// A `HEAD` entry.
    pub head: bool,
    /// A `commondir` entry.
    pub commondir: bool,
    /// An `objects` entry.
    pub objects: bool,
    /// A `refs` entry.
    pub refs: bool,
}

impl GitDirMarks {
    /// Notes one directory entry by name.
    pub fn note(&mut self, name: &[u8]) {
        match name {
            b"HEAD" => self.head = true,
            b"commondir" => self.commondir = true,
            b"objects" => self.objects = true,
            b"refs" => self.refs = true,
            _ => {}
        }
    }

    /// Whether a directory with these entries counts as a git directory
    /// (see the module documentation: at least git's `is_git_directory`).
    pub fn is_git_dir(&self) -> bool {
        (self.head && self.commondir) || (self.objects && self.refs)
    }

    /// Whether an entry of this name can make its directory a git
    /// directory (the event path re-checks the parent for these).
    pub fn is_mark(name: &[u8]) -> bool {
        matches!(name, b"HEAD" | b"commondir" | b"objects" | b"refs")
    }
}

/// The git control files the guard judges; the engine maps each to an
/// action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlFile {
    /// `config`: filtered to the allowlist.
    Config,
    /// `config.worktree`: filtered to the allowlist.
    ConfigWorktree,
    /// `commondir`: kept only in `worktrees/<name>/` pointing at `../..`.
    Commondir,
    /// `gitdir` (a linked worktree's back-link): kept when inside.
    Gitdir,
    /// An entry of `hooks/` (other than `*.sample`): quarantined.
    Hook,
    /// `info/attributes`: quarantined.
    InfoAttributes,
    /// The `hooks` entry itself: a symlink is quarantined, a directory
    /// has its hooks checked.
    HooksDir,
    /// The `info` entry itself: as `hooks`.
    InfoDir,
    /// The `remotes` or `branches` entry itself: as `hooks` (git still
    /// reads remotes defined by files there).
    RemotesDir,
    /// A file of `remotes/` or `branches/` (`remote.c`: `read_remotes_file`,
    /// `read_branches_file`: git fetches from the URL it names when the
    /// config gives the remote none, or when `branch.*.remote` names it):
    /// quarantined.
    RemoteFile,
    /// `objects/info/alternates`: kept when every entry stays inside.
    Alternates,
    /// `objects/info/http-alternates`: quarantined (URLs).
    HttpAlternates,
    /// A file of an operation git resumes (`rebase-merge/`,
    /// `rebase-apply/`, `sequencer/`) that steers a program: judged by
    /// [`operation_verdict`], by sweeps only (the sandbox's own operation
    /// runs it inside).
    OperationState(OperationFile),
}

/// The operation-state files that steer a program when git resumes the
/// operation (the rest of the state is data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OperationFile {
    /// `rebase-merge/git-rebase-todo`, `sequencer/todo`: `exec` steps.
    Todo,
    /// `rebase-merge/strategy`, `rebase-apply/strategy`.
    Strategy,
    /// `rebase-merge/gpg_sign_opt`, `rebase-apply/gpg_sign_opt`.
    SigningKey,
    /// `rebase-apply/apply-opt`.
    ApplyOptions,
    /// `sequencer/opts` (config syntax).
    SequencerOpts,
}

/// Where each operation-state file lives in a git dir, and what it is.
pub const OPERATION_FILES: &[(&str, &str, OperationFile)] = &[
    ("rebase-merge", "git-rebase-todo", OperationFile::Todo),
    ("sequencer", "todo", OperationFile::Todo),
    ("rebase-merge", "strategy", OperationFile::Strategy),
    ("rebase-apply", "strategy", OperationFile::Strategy),
    ("rebase-merge", "gpg_sign_opt", OperationFile::SigningKey),
    ("rebase-apply", "gpg_sign_opt", OperationFile::SigningKey),
    ("rebase-apply", "apply-opt", OperationFile::ApplyOptions),
    ("sequencer", "opts", OperationFile::SequencerOpts),
];

/// Every control file of a git dir, relative to it, for a full check.
pub fn control_files() -> Vec<(PathBuf, ControlFile)> {
    let mut out: Vec<(PathBuf, ControlFile)> = [
        ("config", ControlFile::Config),
        ("config.worktree", ControlFile::ConfigWorktree),
        ("commondir", ControlFile::Commondir),
        ("gitdir", ControlFile::Gitdir),
        ("hooks", ControlFile::HooksDir),
        ("info", ControlFile::InfoDir),
        ("remotes", ControlFile::RemotesDir),
        ("branches", ControlFile::RemotesDir),
        ("objects/info/alternates", ControlFile::Alternates),
        ("objects/info/http-alternates", ControlFile::HttpAlternates),
    ]
    .into_iter()
    .map(|(p, k)| (PathBuf::from(p), k))
    .collect();
    out.extend(OPERATION_FILES.iter().map(|(dir, name, f)| (Path::new(dir).join(name), ControlFile::OperationState(*f))));
    out
}

/// The builtin merge strategies (`builtin/merge.c`: `all_strategy`): the
/// only ones that run no program outside git's own.
pub const BUILTIN_STRATEGIES: [&str; 6] = ["ort", "recursive", "resolve", "octopus", "ours", "subtree"];

/// What to do with one operation-state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Harmless as it is.
    Keep,
    /// Replace with this text; `removed` names what was taken out.
    Rewrite {
        /// The new contents.
        text: Vec<u8>,
        /// What was removed (commands, keys).
        removed: Vec<String>,
    },
    /// Take the whole file away (the reason, for the record).
    Quarantine(&'static str),
}

/// How git would resume with `contents` as this operation file, and what
/// must change so that it runs nothing the agent chose.
pub fn operation_verdict(file: OperationFile, contents: &[u8]) -> Verdict {
    match file {
        OperationFile::Todo => match disable_exec_steps(contents) {
            Some((text, removed)) => Verdict::Rewrite { text, removed },
            None => Verdict::Keep,
        },
        OperationFile::Strategy => {
            // `read_oneliner` strips the trailing newline; an empty value is
            // no strategy.
            let value = String::from_utf8_lossy(contents);
            let value = value.trim_end_matches(['\n', '\r']);
            if value.is_empty() || BUILTIN_STRATEGIES.contains(&value) {
                Verdict::Keep
            } else {
                Verdict::Quarantine(
                    "a merge strategy that is not one of git's own: resuming the operation would run git merge-<it> as a program",
                )
            }
        }
        OperationFile::SigningKey => {
            if contents.iter().all(u8::is_ascii_whitespace) {
                Verdict::Keep
            } else {
                Verdict::Quarantine("a signing key chosen for a resumed operation (with gpg.format=ssh, a key file git would read)")
            }
        }
        OperationFile::ApplyOptions => {
            if contents.iter().all(u8::is_ascii_whitespace) {
                Verdict::Keep
            } else {
                Verdict::Quarantine("options for the git apply of a resumed git am")
            }
        }
        OperationFile::SequencerOpts => filter_sequencer_opts(contents),
    }
}

/// A todo list with its `exec` steps (`exec CMD`, `x CMD`) turned into
/// comments, and those steps' commands; `None` when it has none. Git reads
/// a todo line's first word as the command, after leading blanks
/// (`sequencer.c`: `parse_insn_line`).
pub fn disable_exec_steps(todo: &[u8]) -> Option<(Vec<u8>, Vec<String>)> {
    let mut out = Vec::with_capacity(todo.len() + 64);
    let mut commands = Vec::new();
    for line in todo.split_inclusive(|b| *b == b'\n') {
        let body = line.trim_ascii_start();
        let word_end = body.iter().position(|b| b.is_ascii_whitespace()).unwrap_or(body.len());
        if matches!(&body[..word_end], b"exec" | b"x") {
            commands.push(String::from_utf8_lossy(body[word_end..].trim_ascii()).into_owned());
            out.extend_from_slice(b"# disabled by Lazaret (an exec step the sandbox left): ");
        }
        out.extend_from_slice(line);
    }
    (!commands.is_empty()).then_some((out, commands))
}

/// `sequencer/opts` (`sequencer.c`: `populate_opts_cb`) reduced to the
/// options that run nothing: `options.strategy` only when builtin,
/// `options.gpg-sign` never, unknown keys never.
fn filter_sequencer_opts(contents: &[u8]) -> Verdict {
    let parsed = crate::gitconfig::GitConfig::parse(contents);
    let mut text = String::new();
    let mut removed = Vec::new();
    let mut header = false;
    for entry in parsed.entries() {
        let name = format!("{}.{}", entry.section, entry.key);
        let keep = entry.subsection.is_none()
            && entry.section == "options"
            && entry.older_git_value.is_none()
            && !entry.value.contains(['\n', '\0', '"', '\\'])
            && match entry.key {
                "strategy" => BUILTIN_STRATEGIES.contains(&entry.value),
                "no-commit"
                | "edit"
                | "allow-empty"
                | "allow-empty-message"
                | "drop-redundant-commits"
                | "keep-redundant-commits"
                | "signoff"
                | "record-origin"
                | "allow-ff"
                | "mainline"
                | "strategy-option"
                | "allow-rerere-auto"
                | "default-msg-cleanup" => true,
                _ => false,
            };
        if !keep {
            removed.push(name);
            continue;
        }
        if !header {
            text.push_str("[options]\n");
            header = true;
        }
        text.push_str(&format!("\t{} = {}\n", entry.key, entry.value));
    }
    if !parsed.skipped_lines().is_empty() {
        removed.push(format!("{} unreadable line(s)", parsed.skipped_lines().len()));
    }
    if removed.is_empty() { Verdict::Keep } else { Verdict::Rewrite { text: text.into_bytes(), removed } }
}

/// The hook names git runs (githooks(5), git 2.47): a file of such a name
/// in a directory the developer's `core.hooksPath` names is a hook.
pub const HOOK_NAMES: [&str; 28] = [
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "sendemail-validate",
    "fsmonitor-watchman",
    "p4-changelist",
    "p4-prepare-changelist",
    "p4-post-changelist",
    "p4-pre-submit",
    "post-index-change",
];

/// The relative `core.hooksPath` values of the developer's own (global or
/// system) configuration, as the directory suffixes they name: `..` at the
/// start is dropped (such a path lands at the same suffix one or more
/// levels up from a work tree, which can be anywhere in the workspace).
/// Absolute values are Git Sentry's (protected when in the workspace).
pub fn host_hook_dirs<'a>(values: impl IntoIterator<Item = &'a str>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for value in values {
        if value.is_empty() || value.starts_with('~') || Path::new(value).is_absolute() {
            continue;
        }
        let mut suffix = PathBuf::new();
        for component in Path::new(value).components() {
            match component {
                Component::Normal(name) => suffix.push(name),
                Component::ParentDir if suffix.as_os_str().is_empty() => {}
                Component::ParentDir => {
                    suffix.pop();
                }
                _ => {}
            }
        }
        if !out.contains(&suffix) {
            out.push(suffix);
        }
    }
    out
}

/// Whether the root-relative `rel` is a hook git would run through one of
/// `dirs` ([`host_hook_dirs`]): its name is a hook's and its directory
/// ends with the suffix (an empty suffix, `core.hooksPath = .`, means any
/// directory).
pub fn host_hook(rel: &Path, dirs: &[PathBuf]) -> bool {
    let Some(name) = rel.file_name().and_then(OsStr::to_str) else { return false };
    if !HOOK_NAMES.contains(&name) {
        return false;
    }
    let parent = rel.parent().unwrap_or(Path::new(""));
    dirs.iter().any(|dir| parent.ends_with(dir))
}

/// Where a remote URL leads, as git's transport decides (`transport.c`:
/// `transport_get`; `connect.c`: `url_is_local_not_ssh`, `parse_connect_url`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UrlPlace {
    /// A transport helper (`<helper>::address`, `ext::`, `fd::`), an option
    /// look-alike, a control character or an empty value: refused.
    Refused,
    /// A network address (`scheme://`, other than `file://`, or
    /// scp-like `host:path`).
    Network,
    /// A path on the host (absolute, or relative to git's working
    /// directory), `file://` stripped.
    Local(String),
}

/// Classifies a URL value.
pub fn url_place(url: &str) -> UrlPlace {
    let url = url.trim();
    if url.is_empty() || url.starts_with('-') || url.chars().any(char::is_control) {
        return UrlPlace::Refused;
    }
    if let Some(at) = url.find("::") {
        let helper = &url[..at];
        if helper.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-')) {
            return UrlPlace::Refused;
        }
    }
    if let Some(at) = url.find("://") {
        let scheme = &url[..at];
        if scheme == "file" {
            // `file://host/path`: git ignores only an empty or `localhost`
            // host; anything else is no local path we can judge. git
            // percent-decodes the path (tried: `file://$W/%2e%2e/private`
            // fetched the repository beside the workspace; the git_model
            // e2e test), so `%2e%2e` is `..`: refused rather than decoded
            // and judged.
            let rest = &url[at + 3..];
            let rest = rest.strip_prefix("localhost").unwrap_or(rest);
            return if rest.starts_with('/') && !rest.contains('%') { UrlPlace::Local(rest.to_owned()) } else { UrlPlace::Refused };
        }
        if scheme.eq_ignore_ascii_case("file") {
            // Only lowercase `file://` is local to git; `FILE://` runs a
            // transport helper `git remote-FILE`.
            return UrlPlace::Refused;
        }
        return UrlPlace::Network;
    }
    // scp-like syntax: a colon before any slash (`url_is_local_not_ssh`).
    if let Some(colon) = url.find(':') {
        if !url[..colon].contains('/') {
            return UrlPlace::Network;
        }
    }
    UrlPlace::Local(url.to_owned())
}

/// Whether the local path `value` leads inside the root at `root_abs`:
/// absolute and below it, or relative and inside from every base git may
/// take it from (`bases`, root-relative: the git dir, its work tree). The
/// root-relative results are returned for the caller's symlink check;
/// `None` means outside.
pub fn local_place_inside(value: &str, root_abs: &Path, bases: &[&Path]) -> Option<Vec<PathBuf>> {
    if value.is_empty() || value.starts_with('~') {
        return None;
    }
    let path = Path::new(value);
    if path.is_absolute() {
        return Some(vec![join_inside(Path::new(""), path.strip_prefix(root_abs).ok()?)?]);
    }
    bases.iter().map(|base| join_inside(base, path)).collect()
}

/// `base/value` with `.` and `..` resolved lexically, if it never climbs
/// above the root. `base` is a root-relative path the guard reached
/// without symlinks (a git dir, a work tree), so climbing out of it is
/// what the kernel does too. A `..` after a component that `value` itself
/// names is refused: the kernel climbs out of that component's *target*,
/// and if the agent made it a symlink (`x/l -> /home/dev/private/.git/objects`),
/// `x/l/../..` is somewhere else entirely than it reads.
pub fn join_inside(base: &Path, value: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in base.components() {
        match component {
            Component::Normal(name) => out.push(name),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    let mut named = false;
    for component in value.components() {
        match component {
            Component::Normal(name) => {
                out.push(name);
                named = true;
            }
            Component::CurDir => {}
            Component::ParentDir if !named => {
                if !out.pop() {
                    return None;
                }
            }
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Whether a value that git takes as a remote's *name* is one
/// (`remote.c`: `valid_remote_nick`); otherwise git takes it as a URL.
pub fn is_remote_name(value: &str) -> bool {
    !value.is_empty() && value != "." && value != ".." && !value.contains('/')
}

/// The entries of an `objects/info/alternates` file (`object-file.c`:
/// `link_alt_odb_entries`: one per line, `#` comments, a line starting
/// with `"` is C-quoted), each as root-relative paths if it leads inside
/// the root (relative entries are relative to the objects directory
/// `objects_dir`, root-relative); `None` if any entry leads outside or is
/// quoted (not judged: refused).
pub fn alternates_inside(contents: &[u8], root_abs: &Path, objects_dir: &Path) -> Option<Vec<PathBuf>> {
    let text = std::str::from_utf8(contents).ok()?;
    let mut out = Vec::new();
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('"') {
            return None;
        }
        out.extend(local_place_inside(line, root_abs, &[objects_dir])?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_dirs_are_judged_at_least_as_generously_as_git() {
        let marks = |names: &[&str]| {
            let mut m = GitDirMarks::default();
            names.iter().for_each(|n| m.note(n.as_bytes()));
            m.is_git_dir()
        };
        assert!(marks(&["HEAD", "objects", "refs", "config"]), "git init's layout");
        assert!(marks(&["HEAD", "commondir"]), "a linked worktree's gitdir");
        assert!(marks(&["objects", "refs", "config", "hooks"]), "a common dir has no HEAD of its own");
        assert!(!marks(&["HEAD", "config"]), "logs/ and refs/remotes/x have a HEAD too");
        assert!(!marks(&["objects"]));
        assert!(GitDirMarks::is_mark(b"refs") && !GitDirMarks::is_mark(b"config"));
    }

    #[test]
    fn a_value_never_climbs_out_of_a_component_it_names() {
        let join = |base: &str, value: &str| join_inside(Path::new(base), Path::new(value));
        assert_eq!(join("a/.git/worktrees/w", "../.."), Some(PathBuf::from("a/.git")), "a linked worktree's commondir");
        assert_eq!(join("sub/.git", "../other"), Some(PathBuf::from("sub/other")));
        assert_eq!(join("a/b", "../../.."), None, "above the root");
        // `x/l` may be the agent's symlink: the kernel climbs out of its target.
        assert_eq!(join("r/.git/worktrees/w", "../../../x/l/../../.git"), None);
        assert_eq!(join("", "p/q/l/../../.."), None);
        assert_eq!(join("", "./p/./q"), Some(PathBuf::from("p/q")));
        assert_eq!(local_place_inside("/ws/p/q/l/../../..", Path::new("/ws"), &[Path::new("")]), None);
        assert_eq!(alternates_inside(b"../../x/l/../../objects\n", Path::new("/ws"), Path::new("r/.git/objects")), None);
    }

    #[test]
    fn file_urls_are_judged_as_git_decodes_them() {
        assert_eq!(url_place("file:///ws/r"), UrlPlace::Local("/ws/r".into()));
        assert_eq!(url_place("file://localhost/ws/r"), UrlPlace::Local("/ws/r".into()));
        // git decodes %2e%2e to `..`.
        assert_eq!(url_place("file:///ws/%2e%2e/%2e%2e/home/dev/private"), UrlPlace::Refused);
        assert_eq!(url_place("FILE:///ws/r"), UrlPlace::Refused, "a helper, git remote-FILE");
        assert_eq!(url_place("https://example.test/r"), UrlPlace::Network);
    }

    #[test]
    fn every_control_file_is_listed_once() {
        let files = control_files();
        let mut paths: Vec<_> = files.iter().map(|(p, _)| p.clone()).collect();
        paths.dedup();
        assert_eq!(paths.len(), files.len());
        assert!(files.contains(&(PathBuf::from("objects/info/alternates"), ControlFile::Alternates)));
        assert!(files.contains(&(PathBuf::from("sequencer/opts"), ControlFile::OperationState(OperationFile::SequencerOpts))));
    }

    #[test]
    fn resumed_operations_run_nothing_the_agent_chose() {
        assert_eq!(operation_verdict(OperationFile::Strategy, b"ort\n"), Verdict::Keep);
        assert_eq!(operation_verdict(OperationFile::Strategy, b""), Verdict::Keep);
        assert!(matches!(operation_verdict(OperationFile::Strategy, b"../../x\n"), Verdict::Quarantine(_)));
        assert!(matches!(operation_verdict(OperationFile::Strategy, b"custom\n"), Verdict::Quarantine(_)), "git merge-custom from PATH");
        assert!(matches!(operation_verdict(OperationFile::SigningKey, b"-S/home/d/key\n"), Verdict::Quarantine(_)));
        assert_eq!(operation_verdict(OperationFile::SigningKey, b"\n"), Verdict::Keep);
        assert!(matches!(operation_verdict(OperationFile::ApplyOptions, b" '--directory=x'\n"), Verdict::Quarantine(_)));
        assert_eq!(operation_verdict(OperationFile::ApplyOptions, b""), Verdict::Keep);
        let Verdict::Rewrite { text, removed } = operation_verdict(OperationFile::Todo, b"pick 1 a\nx touch /p\n") else {
            panic!("exec kept")
        };
        assert_eq!(removed, ["touch /p"]);
        assert!(String::from_utf8_lossy(&text).contains("# disabled by Lazaret"));
        assert_eq!(operation_verdict(OperationFile::Todo, b"pick 1 a\n"), Verdict::Keep);
    }

    #[test]
    fn sequencer_opts_keep_only_what_runs_nothing() {
        let ok = b"[options]\n\tsignoff = true\n\tstrategy = ort\n\tstrategy-option = theirs\n\tmainline = 1\n";
        assert_eq!(operation_verdict(OperationFile::SequencerOpts, ok), Verdict::Keep);
        let bad = b"[options]\n\tsignoff = true\n\tstrategy = ../../x\n\tgpg-sign = /home/d/key\n\tunknown = 1\n[other]\n\tk = v\n";
        let Verdict::Rewrite { text, removed } = operation_verdict(OperationFile::SequencerOpts, bad) else { panic!("kept") };
        assert_eq!(String::from_utf8_lossy(&text), "[options]\n\tsignoff = true\n");
        assert_eq!(removed, ["options.strategy", "options.gpg-sign", "options.unknown", "other.k"]);
    }

    #[test]
    fn exec_steps() {
        let todo = b"pick 1234 one\n  exec make test\nx touch /tmp/p\n# exec in a comment\nexecute-not 1\npick 5678 two";
        let (text, commands) = disable_exec_steps(todo).expect("exec steps");
        assert_eq!(commands, ["make test", "touch /tmp/p"]);
        assert_eq!(
            String::from_utf8(text).expect("utf8"),
            "pick 1234 one\n# disabled by Lazaret (an exec step the sandbox left):   exec make test\n# disabled by Lazaret (an exec step the sandbox left): x touch /tmp/p\n# exec in a comment\nexecute-not 1\npick 5678 two"
        );
        assert_eq!(disable_exec_steps(b"pick 1 a\n# x b\n"), None);
    }

    #[test]
    fn hooks_through_the_developers_hooks_path() {
        let dirs = host_hook_dirs([".githooks", "/abs/hooks", "~/h", "../shared/hooks", "tools/./hooks"]);
        assert_eq!(dirs, [PathBuf::from(".githooks"), PathBuf::from("shared/hooks"), PathBuf::from("tools/hooks")]);
        assert!(host_hook(Path::new("n/.githooks/pre-commit"), &dirs));
        assert!(host_hook(Path::new(".githooks/post-checkout"), &dirs));
        assert!(host_hook(Path::new("a/b/tools/hooks/pre-push"), &dirs));
        assert!(!host_hook(Path::new("n/.githooks/README"), &dirs), "git runs hooks by name only");
        assert!(!host_hook(Path::new("n/src/pre-commit"), &dirs));
        assert!(host_hook(Path::new("x/pre-commit"), &host_hook_dirs(["."])), "hooksPath = . names every directory");
    }

    #[test]
    fn url_places() {
        assert_eq!(url_place("https://h/x.git"), UrlPlace::Network);
        assert_eq!(url_place("git@h:x.git"), UrlPlace::Network);
        assert_eq!(url_place("h:x"), UrlPlace::Network);
        assert_eq!(url_place("ssh://h/x"), UrlPlace::Network);
        assert_eq!(url_place("file:///home/d/p"), UrlPlace::Local("/home/d/p".into()));
        assert_eq!(url_place("file://localhost/x"), UrlPlace::Local("/x".into()));
        assert_eq!(url_place("file://other/x"), UrlPlace::Refused);
        assert_eq!(url_place("./a:b"), UrlPlace::Local("./a:b".into()), "a slash before the colon is a path");
        assert_eq!(url_place("../lib.git"), UrlPlace::Local("../lib.git".into()));
        for refused in ["ext::sh -c x", "fd::3", "-u x", "", "a\nb"] {
            assert_eq!(url_place(refused), UrlPlace::Refused, "{refused}");
        }
        let root = Path::new("/ws");
        assert_eq!(local_place_inside("/ws/a/b", root, &[Path::new("x")]), Some(vec![PathBuf::from("a/b")]));
        assert_eq!(local_place_inside("/home/d/private", root, &[Path::new("x")]), None);
        assert_eq!(local_place_inside("/ws/../etc", root, &[Path::new("x")]), None);
        assert_eq!(
            local_place_inside("../lib", root, &[Path::new("a/.git"), Path::new("a")]),
            Some(vec![PathBuf::from("a/lib"), PathBuf::from("lib")])
        );
        assert_eq!(local_place_inside("../../lib", root, &[Path::new("a/.git"), Path::new("a")]), None, "outside from the work tree");
        assert!(is_remote_name("origin") && !is_remote_name("/home/d/p") && !is_remote_name("..") && !is_remote_name("a/b"));
    }

    #[test]
    fn alternates() {
        let root = Path::new("/ws");
        let objects = Path::new("r/.git/objects");
        assert_eq!(alternates_inside(b"# c\n../../../s/.git/objects\n", root, objects), Some(vec![PathBuf::from("s/.git/objects")]));
        assert_eq!(alternates_inside(b"/ws/s/objects\n", root, objects), Some(vec![PathBuf::from("s/objects")]));
        assert_eq!(alternates_inside(b"/home/d/p/.git/objects\n", root, objects), None);
        assert_eq!(alternates_inside(b"../../../../x\n", root, objects), None);
        assert_eq!(alternates_inside(b"\"/ws/q\"\n", root, objects), None, "quoted entries are not judged");
    }
}
