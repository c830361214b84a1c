//! The Workspace Guard of a Domain, outside the daemon: the engine's
//! configuration ([`guard_config`]: which trees, whose ownership, where the
//! quarantine is) and `lazaret audit` ([`audit`], [`restore`]): the
//! neutralisations the Domain's journals record, with the quarantined files
//! they left.
//!
//! The running side (starting the guard with the sandbox, journalling and
//! showing each neutralisation, the sweeps) is `daemon::guard`; the engine
//! itself is `lazaret_mounts::guard`.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use lazaret_mounts::guard::{GuardConfig, GuardError, GuardRoot, Owner, RootKind};
/// A quarantine entry's record and what a restore put back (the engine's).
pub use lazaret_mounts::guard::{QuarantineRecord, RestoredFile};
use lazaret_protocol::journal::{Event, JournalEntry};

use crate::context::{Context, ContextError, require_root};
use crate::layout;

/// The label of the workspace root in guard records.
pub const WORKSPACE_LABEL: &str = "workspace";
/// The label of the Ignored Workspace State root.
pub const IGNORED_LABEL: &str = "ignored";
/// The prefix of a volume root's label (`volume:/sandbox/path`).
pub const VOLUME_LABEL_PREFIX: &str = "volume:";
/// The prefix of a `profile_state` entry's label (`profile-state:/sandbox/path`).
pub const PROFILE_STATE_LABEL_PREFIX: &str = "profile-state:";
/// The prefix of an outside git directory's label (`git-dir:/host/path`).
pub const GIT_DIR_LABEL_PREFIX: &str = "git-dir:";

/// What the guard needs of Git Sentry's binds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GuardedPaths {
    /// The paths the sandbox sees read-only: workspace-relative below the
    /// workspace, absolute below one of `git_dirs`.
    pub protected: Vec<PathBuf>,
    /// Git directories outside the workspace that the sandbox sees
    /// read-write (a linked worktree's common directory): the host's git
    /// reads them in the developer's other work trees, so they are guarded
    /// like the workspace.
    #[serde(default)]
    pub git_dirs: Vec<PathBuf>,
    /// Repository configs in the workspace that the sandbox may write,
    /// judged by the guard's gate, with the developer's versions (kept in
    /// the crash-recovery marker: a crashed run's sweep filters against
    /// them).
    #[serde(default)]
    pub gated_configs: Vec<lazaret_mounts::git_sentry::GatedConfig>,
}

impl GuardedPaths {
    /// From the sandbox's binds (Git Sentry's read-only ones are bound at
    /// their host path) and Git Sentry's outside git directories.
    pub fn from_binds(workspace: &Path, binds: &[lazaret_oci::bundle::BindMount], git_dirs: Vec<PathBuf>) -> GuardedPaths {
        let mut protected = Vec::new();
        for bind in binds.iter().filter(|b| b.readonly) {
            match bind.destination.strip_prefix(workspace) {
                Ok(rel) if !rel.as_os_str().is_empty() => protected.push(rel.to_path_buf()),
                Ok(_) => {}
                Err(_) if git_dirs.iter().any(|d| bind.destination.starts_with(d)) => protected.push(bind.destination.clone()),
                Err(_) => {}
            }
        }
        GuardedPaths { protected, git_dirs, gated_configs: Vec::new() }
    }
}

/// The git directories outside the workspace that a start binds for the
/// workspace's own repository when it is a linked worktree (its gitdir and
/// common dir, as Git Sentry finds them); empty when there are none or the
/// repository cannot be read. For `lazaret audit --restore`, which has no
/// start to ask.
fn workspace_git_dirs(workspace: &Path) -> Vec<PathBuf> {
    use std::os::fd::AsFd;
    let Ok(root) = lazaret_mounts::safe_path::open_root_dir(workspace) else { return Vec::new() };
    match lazaret_mounts::repo::locate(root.as_fd(), workspace, Path::new("")) {
        Ok(Some(location)) => location.outside_git_dirs(),
        Ok(None) | Err(_) => Vec::new(),
    }
}

/// Why `lazaret audit` failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The Domain could not be resolved.
    #[error(transparent)]
    Context(#[from] ContextError),
    /// The quarantine could not be read, or an entry not restored.
    #[error(transparent)]
    Guard(#[from] GuardError),
    /// A journal could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The journal file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// `--restore ID` names no entry in the quarantine.
    #[error("no quarantine entry {id:?} in {dir}\n  hint: `lazaret audit {profile}` lists the entries still in quarantine")]
    NoSuchEntry {
        /// The ID asked for.
        id: String,
        /// The quarantine directory.
        dir: PathBuf,
        /// The profile, for the hint.
        profile: String,
    },
}

/// The guard's configuration for `ctx`'s Domain: the workspace, the Ignored
/// Workspace State storage (when isolation is on and it exists), every
/// writable volume and every `profile_state` directory; the developer as the owner of what the sandbox makes;
/// the quarantine in the Domain Root; and `guarded.git_dirs`, git
/// directories outside the workspace that the sandbox can write.
/// `guarded.protected` are the paths the sandbox sees read-only (Git
/// Sentry's binds), `changed_since` the Domain's start (see
/// [`GuardConfig`]).
pub fn guard_config(ctx: &Context, guarded: &GuardedPaths, changed_since: Option<SystemTime>) -> GuardConfig {
    let domain_root = ctx.paths.domain_root(&ctx.domain_id);
    let mut roots = vec![GuardRoot { label: WORKSPACE_LABEL.into(), path: ctx.workspace.root().to_path_buf(), kind: RootKind::Workspace }];
    for dir in guarded.git_dirs.iter().filter(|d| d.is_dir()) {
        roots.push(GuardRoot { label: format!("{GIT_DIR_LABEL_PREFIX}{}", dir.display()), path: dir.clone(), kind: RootKind::GitDir });
    }
    let ignored = layout::ignored_state_dir(&domain_root);
    if ctx.profile.isolate_gitignored && ignored.is_dir() {
        roots.push(GuardRoot { label: IGNORED_LABEL.into(), path: ignored, kind: RootKind::IgnoredState });
    }
    for v in ctx.volumes().iter().filter(|v| !v.readonly) {
        // The start-up stage bound the canonical path; a volume that does
        // not resolve now was refused there.
        let Ok(path) = std::fs::canonicalize(&v.host) else { continue };
        let label = format!("{VOLUME_LABEL_PREFIX}{}", v.sandbox.display());
        if roots.iter().any(|r| r.label == label) {
            continue;
        }
        roots.push(GuardRoot { label, path, kind: RootKind::Volume });
    }
    // The profile's state: guarded like Ignored Workspace State (privilege
    // bits cleared, a root agent's files given to the developer); nothing
    // on the host reads it, so no git control checks.
    for state in ctx.profile_state().into_iter().filter(|s| s.host.is_dir()) {
        roots.push(GuardRoot {
            label: format!("{PROFILE_STATE_LABEL_PREFIX}{}", state.sandbox.display()),
            path: state.host,
            kind: RootKind::IgnoredState,
        });
    }
    GuardConfig {
        roots,
        developer: Owner { uid: ctx.developer.uid, gid: ctx.developer.gid },
        quarantine_dir: layout::quarantine_dir(&domain_root),
        protected: guarded.protected.clone(),
        developer_configs: guarded.gated_configs.clone(),
        changed_since,
        host_hooks_paths: developer_hooks_paths(ctx),
        ..GuardConfig::default()
    }
}

/// Every `core.hooksPath` value of the developer's system and global git
/// configuration, read as their git reads it (their home, the
/// coordinator's `XDG_CONFIG_HOME`), with every file they include (any
/// `includeIf` condition may hold in some repository), to git's include
/// depth: a relative one makes git look for hooks in every repository
/// the sandbox makes.
pub(crate) fn developer_hooks_paths(ctx: &Context) -> Vec<String> {
    let settings = lazaret_mounts::ignore_eval::HostGitSettings::for_home(Some(ctx.developer.home.clone()));
    let xdg = settings.xdg_config_home.clone().or_else(|| settings.home.as_ref().map(|h| h.join(".config")));
    let mut pending: Vec<(PathBuf, usize)> = Vec::new();
    pending.extend(settings.system_config.iter().map(|f| (f.clone(), 0)));
    pending.extend(xdg.map(|d| (d.join("git/config"), 0)));
    pending.extend(settings.home.as_ref().map(|h| (h.join(".gitconfig"), 0)));
    hooks_paths_in(pending, settings.home.as_deref())
}

/// The `core.hooksPath` values of the config files `pending` (each with
/// its include depth) and of every file they include.
fn hooks_paths_in(mut pending: Vec<(PathBuf, usize)>, home: Option<&Path>) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let mut values = Vec::new();
    while let Some((file, depth)) = pending.pop() {
        if depth > lazaret_mounts::git_sentry::MAX_INCLUDE_DEPTH || !seen.insert(file.clone()) {
            continue;
        }
        let Ok(text) = std::fs::read(&file) else { continue };
        let config = lazaret_mounts::gitconfig::GitConfig::parse(&text);
        for entry in config.entries().filter(|e| e.section == "core" && e.subsection.is_none() && e.key == "hookspath") {
            values.push(entry.value.to_owned());
            values.extend(entry.older_git_value.map(str::to_owned));
        }
        for include in config.includes() {
            let path = match include.path.strip_prefix("~/") {
                Some(rest) => home.map(|h| h.join(rest)),
                None if include.path.starts_with('~') => None,
                None => Some(file.parent().unwrap_or(Path::new("/")).join(&include.path)),
            };
            pending.extend(path.map(|p| (p, depth + 1)));
        }
    }
    values
}

/// One neutralisation as `lazaret audit` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AuditEntry {
    /// When it was journalled (milliseconds since the epoch); for an entry
    /// known only from the quarantine, the quarantine's time.
    pub time_ms: u64,
    /// The guarded root's label.
    pub root: String,
    /// The path relative to that root (agent-chosen: shown escaped).
    pub path: String,
    /// The action kind (`quarantined`, `filtered_git_config`, ...).
    pub kind: String,
    /// The one-line account.
    pub summary: String,
    /// Why.
    pub reason: String,
    /// How it was found (`event`, `sweep`), empty when only the quarantine knows it.
    pub found_by: String,
    /// The quarantine entry, if the file was moved aside.
    pub quarantine_id: Option<String>,
    /// Whether that entry's content is still in the quarantine (false:
    /// restored, dropped to keep the quarantine within its limits, or no
    /// entry).
    pub in_quarantine: bool,
    /// The quarantined file's record, while it is there (also once its
    /// content was dropped: then `dropped` says when).
    pub quarantined: Option<QuarantineRecord>,
}

/// What `lazaret audit PROFILE` reports.
#[derive(Debug, Clone)]
pub struct Audit {
    /// The Domain Root the report comes from.
    pub domain_root: PathBuf,
    /// The quarantine directory.
    pub quarantine_dir: PathBuf,
    /// Every neutralisation, oldest first.
    pub entries: Vec<AuditEntry>,
}

/// `lazaret audit PROFILE`: the neutralisations recorded in every journal of
/// the Domain of (profile, workspace of `dir`), current and crashed, joined
/// with the quarantine; quarantine entries no journal line names (a run
/// that crashed before journalling one) are listed too.
pub fn audit(config: Option<&Path>, profile: Option<&str>, dir: &Path) -> Result<Audit, AuditError> {
    require_root()?;
    let ctx = Context::resolve(config, profile, dir)?;
    let domain_root = ctx.paths.domain_root(&ctx.domain_id);
    let quarantine_dir = layout::quarantine_dir(&domain_root);
    let records = if quarantine_dir.is_dir() { lazaret_mounts::guard::quarantine::list(&quarantine_dir)? } else { Vec::new() };
    let mut entries = Vec::new();
    for journal in journal_files(&domain_root)? {
        entries.extend(neutralisations_in(&journal)?);
    }
    Ok(Audit { domain_root, quarantine_dir, entries: join_quarantine(entries, records) })
}

/// `lazaret audit PROFILE --restore ID`: puts quarantine entry `id` back
/// where it was (owned by the developer, without setuid/setgid), on the
/// developer's explicit request. The engine refuses an occupied path or a
/// symlink on the way.
pub fn restore(config: Option<&Path>, profile: Option<&str>, dir: &Path, id: &str) -> Result<RestoredFile, AuditError> {
    require_root()?;
    let ctx = Context::resolve(config, profile, dir)?;
    let guard = guard_config(&ctx, &GuardedPaths { git_dirs: workspace_git_dirs(ctx.workspace.root()), ..GuardedPaths::default() }, None);
    let known = if guard.quarantine_dir.is_dir() { lazaret_mounts::guard::quarantine::list(&guard.quarantine_dir)? } else { Vec::new() };
    if !known.iter().any(|r| r.id == id) {
        return Err(AuditError::NoSuchEntry { id: id.to_string(), dir: guard.quarantine_dir, profile: ctx.profile.name.clone() });
    }
    Ok(lazaret_mounts::guard::quarantine::restore(&guard, id)?)
}

/// The Domain's journals: crashed runs' (oldest first), then the current one.
fn journal_files(domain_root: &Path) -> Result<Vec<PathBuf>, AuditError> {
    let entries = match std::fs::read_dir(domain_root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(AuditError::Io { path: domain_root.to_path_buf(), source }),
    };
    let mut crashed: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("journal-") && n.ends_with(".crashed.jsonl")))
        .collect();
    crashed.sort();
    let current = domain_root.join(crate::journal::JOURNAL_FILE);
    if current.is_file() {
        crashed.push(current);
    }
    Ok(crashed)
}

/// The neutralisations journalled in `path` (lines that are not journal
/// entries are skipped: `lazaret journal --check` is the judge of those).
fn neutralisations_in(path: &Path) -> Result<Vec<AuditEntry>, AuditError> {
    let file = std::fs::File::open(path).map_err(|source| AuditError::Io { path: path.to_path_buf(), source })?;
    let mut found = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line.map_err(|source| AuditError::Io { path: path.to_path_buf(), source })?;
        if let Some(entry) = audit_entry(&line) {
            found.push(entry);
        }
    }
    Ok(found)
}

/// The audit entry of one journal line, if it records a neutralisation.
fn audit_entry(line: &str) -> Option<AuditEntry> {
    if !line.contains("NeutraliseSandboxWrite") {
        return None;
    }
    let entry: JournalEntry = serde_json::from_str(line).ok()?;
    match entry.event {
        Event::NeutraliseSandboxWrite { root, path, kind, summary, reason, quarantine_id, found_by } => Some(AuditEntry {
            time_ms: entry.timestamp_ms,
            root,
            path,
            kind,
            summary,
            reason,
            found_by,
            quarantine_id,
            in_quarantine: false,
            quarantined: None,
        }),
        _ => None,
    }
}

/// Marks each entry whose quarantine entry is still there, and adds the
/// quarantine entries no journal line names; oldest first.
fn join_quarantine(mut entries: Vec<AuditEntry>, records: Vec<QuarantineRecord>) -> Vec<AuditEntry> {
    for record in records {
        match entries.iter_mut().find(|e| e.quarantine_id.as_deref() == Some(record.id.as_str())) {
            Some(e) => {
                e.in_quarantine = record.dropped.is_none();
                e.quarantined = Some(record);
            }
            None => {
                let path = record.path.to_string_lossy().into_owned();
                entries.push(AuditEntry {
                    time_ms: record.time.saturating_mul(1000),
                    root: record.root.clone(),
                    summary: format!(
                        "{}:{}: quarantined: {}",
                        record.root,
                        lazaret_protocol::display::escaped(&record.path),
                        record.reason
                    ),
                    path,
                    kind: "quarantined".into(),
                    reason: record.reason.clone(),
                    found_by: String::new(),
                    quarantine_id: Some(record.id.clone()),
                    in_quarantine: record.dropped.is_none(),
                    quarantined: Some(record),
                });
            }
        }
    }
    entries.sort_by_key(|e| e.time_ms);
    entries
}

/// Milliseconds since the epoch as `YYYY-MM-DD HH:MM:SS` UTC.
pub fn format_utc(time_ms: u64) -> String {
    lazaret_protocol::utc::Utc::from_unix(time_ms / 1000).readable()
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_developers_hooks_paths_come_from_every_file_they_include() {
        let home = tempfile::tempdir().expect("tempdir");
        let h = home.path();
        std::fs::write(h.join(".gitconfig"), "[core]\n\thooksPath = /abs/hooks\n[includeIf \"gitdir:~/work/\"]\n\tpath = ~/work.inc\n")
            .expect("write");
        std::fs::write(h.join("work.inc"), "[include]\n\tpath = deeper.inc\n[CORE]\n\tHooksPath = .githooks\n").expect("write");
        std::fs::write(h.join("deeper.inc"), "[core]\n\thookspath = ../shared-hooks\n[include]\n\tpath = work.inc\n").expect("write");
        let mut found = hooks_paths_in(vec![(h.join(".gitconfig"), 0), (h.join("missing"), 0)], Some(h));
        found.sort();
        assert_eq!(found, ["../shared-hooks", ".githooks", "/abs/hooks"]);
    }

    use super::*;

    #[test]
    fn guarded_paths_come_from_the_read_only_binds_of_the_workspace_and_the_outside_git_dirs() {
        let bind = |dest: &str, readonly: bool| lazaret_oci::bundle::BindMount {
            source: PathBuf::from(dest),
            destination: PathBuf::from(dest),
            readonly,
        };
        let binds = [
            bind("/home/d/wt", false),
            bind("/home/d/wt/.git", true),
            bind("/home/d/main/.git", false),
            bind("/home/d/main/.git/config", true),
            bind("/home/d/main/.git/worktrees/wt/commondir", true),
            bind("/usr/local/bin/lazaret-escalate", true),
            bind("/home/d/main/.gitx", true),
        ];
        let guarded = GuardedPaths::from_binds(Path::new("/home/d/wt"), &binds, vec![PathBuf::from("/home/d/main/.git")]);
        let expected: Vec<PathBuf> =
            [".git", "/home/d/main/.git/config", "/home/d/main/.git/worktrees/wt/commondir"].iter().map(PathBuf::from).collect();
        assert_eq!(guarded.protected, expected);
        assert_eq!(guarded.git_dirs, [PathBuf::from("/home/d/main/.git")]);
        // A crash-recovery marker of an older build has no git_dirs.
        let old: GuardedPaths = serde_json::from_str(r#"{"protected":[".git/config"]}"#).expect("old marker");
        assert_eq!(old, GuardedPaths { protected: vec![PathBuf::from(".git/config")], ..GuardedPaths::default() });
    }

    fn line(path: &str, id: Option<&str>, t: u64) -> String {
        let event = Event::NeutraliseSandboxWrite {
            root: "workspace".into(),
            path: path.into(),
            kind: if id.is_some() { "quarantined" } else { "cleared_privilege_bits" }.into(),
            summary: format!("workspace:{path}: done"),
            reason: "test".into(),
            quarantine_id: id.map(String::from),
            found_by: "event".into(),
        };
        JournalEntry { timestamp_ms: t, domain: "d".into(), event }.to_json_line().expect("json")
    }

    fn record(id: &str, path: &str, time: u64) -> QuarantineRecord {
        QuarantineRecord {
            id: id.into(),
            root: "workspace".into(),
            path: path.into(),
            reason: "hook".into(),
            time,
            mode: 0o755,
            owner: Owner { uid: 1, gid: 1 },
            symlink_target: None,
            size: 3,
            content_kept: true,
            dropped: None,
        }
    }

    #[test]
    fn journal_lines_become_entries_and_other_lines_are_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let journal = dir.path().join("journal.jsonl");
        let start = JournalEntry { timestamp_ms: 1, domain: "d".into(), event: Event::MountStateAnchor }.to_json_line().expect("json");
        std::fs::write(
            &journal,
            format!(
                "{start}\n{}\nnot json NeutraliseSandboxWrite\n{}\n",
                line("a/.git/hooks/pre-commit", Some("q1"), 5),
                line("tool", None, 7)
            ),
        )
        .expect("write");
        let found = neutralisations_in(&journal).expect("read");
        assert_eq!(found.len(), 2);
        assert_eq!(
            (found[0].path.as_str(), found[0].quarantine_id.as_deref(), found[0].time_ms),
            ("a/.git/hooks/pre-commit", Some("q1"), 5)
        );
        assert_eq!(found[1].kind, "cleared_privilege_bits");
    }

    #[test]
    fn the_quarantine_marks_kept_entries_and_adds_unjournalled_ones_in_time_order() {
        let journalled = vec![
            audit_entry(&line("x/.git/config", Some("q1"), 2_000)).expect("entry"),
            audit_entry(&line("y/.git/hooks/post-checkout", Some("q2"), 4_000)).expect("entry"),
        ];
        // q1 is still there; q2 was restored; q3 was never journalled.
        let joined = join_quarantine(journalled, vec![record("q1", "x/.git/config", 2), record("q3", "z/.git/commondir", 3)]);
        let ids: Vec<_> = joined.iter().map(|e| (e.quarantine_id.clone().unwrap_or_default(), e.in_quarantine)).collect();
        assert_eq!(ids, [("q1".to_string(), true), ("q3".to_string(), true), ("q2".to_string(), false)]);
        assert!(joined[1].summary.contains("z/.git/commondir") && joined[1].found_by.is_empty());
        assert_eq!(joined[0].quarantined.as_ref().map(|r| r.size), Some(3));
        // A dropped copy (the quarantine over its bounds): its record stays, the content is not kept.
        let dropped = QuarantineRecord { dropped: Some(9), content_kept: false, ..record("q1", "x/.git/config", 2) };
        let joined = join_quarantine(
            vec![audit_entry(&line("x/.git/config", Some("q1"), 2_000)).expect("entry")],
            vec![dropped, QuarantineRecord { dropped: Some(9), ..record("q4", "w/.git/config", 1) }],
        );
        assert_eq!(
            joined.iter().map(|e| (e.quarantine_id.as_deref(), e.in_quarantine)).collect::<Vec<_>>(),
            [(Some("q4"), false), (Some("q1"), false)]
        );
        assert!(joined.iter().all(|e| e.quarantined.as_ref().is_some_and(|r| r.dropped == Some(9))));
    }

    #[test]
    fn journals_are_read_crashed_first_then_the_current_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        for name in ["journal.jsonl", "journal-200.crashed.jsonl", "journal-100.crashed.jsonl", "isolated-paths.json"] {
            std::fs::write(dir.path().join(name), "").expect("write");
        }
        let names: Vec<String> = journal_files(dir.path())
            .expect("list")
            .iter()
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        assert_eq!(names, ["journal-100.crashed.jsonl", "journal-200.crashed.jsonl", "journal.jsonl"]);
        assert!(journal_files(&dir.path().join("missing")).expect("absent").is_empty());
    }

    #[test]
    fn times_are_utc() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00");
        assert_eq!(format_utc(1_796_165_040_123), "2026-12-01 22:44:00");
    }
}
