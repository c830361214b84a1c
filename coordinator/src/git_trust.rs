//! Which git directories in a workspace are the developer's, across
//! Domains (issue 32): the trust state every Domain's host escalation
//! consults.
//!
//! Git Sentry takes every repository that exists when a Domain starts for
//! the developer's and protects it read-only in that sandbox. That is
//! right only if no sandbox could have made or changed it: a repository the
//! agent of another profile on the same workspace made (while its Domain
//! runs, or left behind, its config filtered or, after a crash, not), or
//! one made in a volume of another Domain that is this workspace, is the
//! agent's. So the trust state is not kept per Domain but in one record in
//! the Storage Root ([`RECORD_FILE`], under an flock on [`LOCK_FILE`]),
//! by absolute path, shared by every Domain whatever its profile:
//!
//! - each run registers, before its sandbox exists, the roots its sandbox
//!   can write (the workspace and its writable volumes) and the git
//!   entries found in them ([`GitEntries`]: every `.git` directory or
//!   `gitdir:` file, and every submodule git directory below a `.git/modules`);
//! - a run that ends cleanly adds what exists in its roots but was not
//!   there at its start to `made` and removes its registration; a run that
//!   crashed keeps its registration until its own Domain starts again,
//!   which does the same then;
//! - a Domain's untrusted entries ([`TrustRecord::begin`]) are the `made`
//!   ones in its workspace and every entry of its workspace that another
//!   registered run did not find at its own start (that run's sandbox may
//!   have made it, now or before it crashed);
//! - an entry leaves `made` only once it is gone (a repository made again
//!   at that path is judged anew: each run registers as trusted only what
//!   the record did not distrust at its start); a registration leaves when
//!   its run ends, is settled after a crash, or none of its roots exists.
//!   To trust an agent-made repository, delete it and clone or init it
//!   yourself.
//!
//! Conservative by design: a repository the developer makes on the host
//! while a Domain runs is recorded as made too.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use lazaret_mounts::repo::DotGit;
use lazaret_mounts::safe_path::{self, FileKind};
use nix::fcntl::{Flock, FlockArg};

use crate::context::Context;

/// The record, in the Storage Root.
pub const RECORD_FILE: &str = "git-trust.json";
/// The flock that serialises its updates.
pub const LOCK_FILE: &str = "git-trust.lock";
/// Largest `.git/modules` nesting looked at (Git Sentry's own limit).
const MAX_MODULE_DEPTH: usize = 8;

/// Why the trust record could not be read, written or filled.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// The record or its lock.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The record is not what this version writes.
    #[error(
        "{path}: unreadable git trust record ({reason}); remove it only if no Domain runs (every repository then counts as the developer's again)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        reason: String,
    },
    /// A root could not be searched for git entries.
    #[error(transparent)]
    Walk(#[from] lazaret_mounts::MountError),
}

/// One run that began and has not ended cleanly.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunEntry {
    /// Its Domain ID.
    pub domain: String,
    /// The absolute roots its sandbox can write.
    pub roots: Vec<PathBuf>,
    /// The git entries (absolute) in those roots at its start that it
    /// trusted.
    pub found: BTreeSet<PathBuf>,
    /// When it began (ms since the epoch): tells a registration from a
    /// later one of the same Domain.
    #[serde(default)]
    pub started_ms: u64,
    /// Its Domain lock: a run whose lock nobody holds crashed.
    #[serde(default)]
    pub lock: Option<PathBuf>,
    /// Its Domain Root (the crash marker of its Workspace Guard, its
    /// quarantine).
    #[serde(default)]
    pub domain_root: Option<PathBuf>,
    /// The developer it ran for (uid, gid): the owner its guard gives the
    /// sandbox's files.
    #[serde(default)]
    pub developer: Option<(u32, u32)>,
}

/// The record: git entries some sandbox made, and the runs in progress.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrustRecord {
    /// Entries (absolute) that appeared in a run's roots during that run.
    pub made: BTreeSet<PathBuf>,
    /// Runs that began and have not ended cleanly.
    pub runs: Vec<RunEntry>,
}

fn under(entry: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| entry.starts_with(r))
}

impl TrustRecord {
    /// A run of `domain` begins with `found` in its `roots`. A registration
    /// of the same Domain left by a crash is settled first. Returns the
    /// entries of `roots` that are not the developer's.
    pub fn begin(&mut self, domain: &str, roots: &[PathBuf], found: &BTreeSet<PathBuf>) -> BTreeSet<PathBuf> {
        self.begin_run(
            RunEntry {
                domain: domain.into(),
                roots: roots.to_vec(),
                found: found.clone(),
                started_ms: 0,
                lock: None,
                domain_root: None,
                developer: None,
            },
            &[],
        )
    }

    /// [`TrustRecord::begin`] for `run` (its `found` being what it found),
    /// also settling `crashed`, registrations of other Domains found dead
    /// (each only if it is still the same registration).
    pub fn begin_run(&mut self, mut run: RunEntry, crashed: &[RunEntry]) -> BTreeSet<PathBuf> {
        let found = std::mem::take(&mut run.found);
        let (domain, roots) = (run.domain.clone(), run.roots.clone());
        let (roots, found) = (&roots, &found);
        let (crashed, others): (Vec<RunEntry>, Vec<RunEntry>) = std::mem::take(&mut self.runs)
            .into_iter()
            .partition(|r| r.domain == domain || crashed.iter().any(|c| c.domain == r.domain && c.started_ms == r.started_ms));
        self.runs = others;
        for run in crashed {
            self.settle(&run, found);
        }
        // Gone: a repository made at that path later is judged anew (it is
        // in no registered run's entries).
        self.made.retain(|e| !under(e, roots) || found.contains(e));
        let untrusted = self.untrusted(&domain, found);
        // What this run trusts, the baseline against which its own
        // sandbox's work is judged.
        run.found = found.difference(&untrusted).cloned().collect();
        self.runs.push(run);
        untrusted
    }

    /// Which of `entries` (absolute) are not the developer's as far as the
    /// record knows, for a run of `domain`: the `made` ones, and those
    /// below another registered run's roots that that run did not trust at
    /// its start (its sandbox may have made them since).
    pub fn untrusted(&self, domain: &str, entries: &BTreeSet<PathBuf>) -> BTreeSet<PathBuf> {
        entries
            .iter()
            .filter(|e| {
                self.made.contains(*e) || self.runs.iter().any(|r| r.domain != domain && under(e, &r.roots) && !r.found.contains(*e))
            })
            .cloned()
            .collect()
    }

    /// The run of `domain` ended; `found` is what its roots hold now.
    pub fn end(&mut self, domain: &str, found: &BTreeSet<PathBuf>) {
        let (ended, others): (Vec<RunEntry>, Vec<RunEntry>) = std::mem::take(&mut self.runs).into_iter().partition(|r| r.domain == domain);
        self.runs = others;
        for run in ended {
            self.settle(&run, found);
        }
    }

    /// Forgets what no longer exists anywhere (`exists`): `made` entries
    /// that are gone (a repository made at that path later is in no
    /// registered run's trusted entries, so it is judged anew), and runs
    /// none of whose roots exist (a deleted workspace). Keeps the record
    /// as small as what is still on the disk.
    pub fn forget_gone(&mut self, exists: impl Fn(&Path) -> bool) {
        self.made.retain(|e| exists(e));
        self.runs.retain(|r| r.roots.iter().any(|root| exists(root)));
    }

    /// What `run`'s sandbox may have made: entries of its roots found now
    /// that it did not find at its start.
    fn settle(&mut self, run: &RunEntry, now: &BTreeSet<PathBuf>) {
        self.made.extend(now.iter().filter(|e| under(e, &run.roots) && !run.found.contains(*e)).cloned());
    }
}

/// Runs `change` on the record under its lock and saves it (atomically).
pub fn update<T>(storage_root: &Path, change: impl FnOnce(&mut TrustRecord) -> T) -> Result<T, TrustError> {
    let lock_path = storage_root.join(LOCK_FILE);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TrustError::Io { path, source }
    };
    let file = crate::lock::open_lock_file(&lock_path).map_err(io(&lock_path))?;
    let _lock =
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| TrustError::Io { path: lock_path.clone(), source: e.into() })?;
    let path = storage_root.join(RECORD_FILE);
    let mut record = load(storage_root)?;
    let out = change(&mut record);
    let json = serde_json::to_vec_pretty(&record).map_err(|e| io(&path)(std::io::Error::other(e)))?;
    let tmp = storage_root.join(format!("{RECORD_FILE}.tmp"));
    let mut f: File = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(&json).and_then(|()| f.sync_all()).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    Ok(out)
}

/// The record as it is now (read without the lock: it is replaced by a
/// rename, never written in place); an absent one is empty.
pub fn load(storage_root: &Path) -> Result<TrustRecord, TrustError> {
    let path = storage_root.join(RECORD_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| TrustError::Corrupt { path, reason: e.to_string() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TrustRecord::default()),
        Err(source) => Err(TrustError::Io { path, source }),
    }
}

/// Every git entry below `root` (absolute; a directory), absolute: each
/// `.git` (directory or `gitdir:` file) and each submodule git directory
/// below a `.git/modules`. Nothing is followed through a symlink.
pub fn find_entries(root: &Path) -> Result<BTreeSet<PathBuf>, TrustError> {
    let fd = safe_path::open_root_dir(root)?;
    Ok(entries_beneath(fd.as_fd(), Path::new(""))?.into_iter().map(|e| root.join(e)).collect())
}

/// The git entries below `dir` (relative to `root`; `""` is the root
/// itself), relative to `root`: each `.git` below it, `dir/.git` too, and
/// the submodule git directories in each `.git/modules`.
pub fn entries_beneath(root: BorrowedFd<'_>, dir: &Path) -> Result<BTreeSet<PathBuf>, TrustError> {
    let start = safe_path::open_dir_beneath(root, dir)?;
    let mut found = BTreeSet::new();
    for worktree in lazaret_mounts::ignore_eval::find_repositories(start.as_fd())? {
        let worktree = dir.join(worktree);
        let entry = worktree.join(".git");
        if let Ok(DotGit::Directory(_)) = lazaret_mounts::repo::read_dot_git(root, &worktree) {
            modules(root, &entry.join("modules"), 0, &mut found)?;
        }
        found.insert(entry);
    }
    Ok(found)
}

/// Submodule git directories (a directory holding `HEAD`, whose own
/// `modules` are looked at too) below `modules_dir`; other directories
/// are module names with `/`.
fn modules(root: BorrowedFd<'_>, modules_dir: &Path, depth: usize, found: &mut BTreeSet<PathBuf>) -> Result<(), TrustError> {
    if depth > MAX_MODULE_DEPTH {
        return Ok(());
    }
    let Some(fd) = safe_path::open_path_beneath(root, modules_dir)? else { return Ok(()) };
    if safe_path::file_kind(fd.as_fd())? != FileKind::Directory {
        return Ok(());
    }
    let io = |source: nix::errno::Errno| TrustError::Io { path: modules_dir.to_path_buf(), source: source.into() };
    let readable = safe_path::open_beneath(fd.as_fd(), Path::new(""), nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY)?;
    let mut listing = nix::dir::Dir::from_fd(readable).map_err(io)?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name));
        let is_dir = match entry.file_type() {
            Some(kind) => kind == nix::dir::Type::Directory,
            // A filesystem without d_type: look (a symlink is never followed).
            None => match safe_path::open_path_beneath(root, &modules_dir.join(&name))? {
                Some(child) => safe_path::file_kind(child.as_fd())? == FileKind::Directory,
                None => false,
            },
        };
        if is_dir {
            names.push(name);
        }
    }
    for name in names {
        let child = modules_dir.join(&name);
        if safe_path::open_path_beneath(root, &child.join("HEAD"))?.is_some() {
            found.insert(child.clone());
            modules(root, &child.join("modules"), depth + 1, found)?;
        } else {
            modules(root, &child, depth + 1, found)?;
        }
    }
    Ok(())
}

/// What one Domain's run trusts, workspace-relative.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkspaceTrust {
    /// The git entries of the workspace at this run's start.
    pub at_start: BTreeSet<PathBuf>,
    /// Those of them that a sandbox (of any Domain) made or may have made.
    pub untrusted: BTreeSet<PathBuf>,
}

/// The roots `ctx`'s sandbox can write: the workspace and its writable
/// volumes (canonical; a volume that is not a directory has no git entries
/// of its own to record).
fn roots(ctx: &Context) -> Vec<PathBuf> {
    let mut roots = vec![ctx.workspace.root().to_path_buf()];
    for v in ctx.volumes().iter().filter(|v| !v.readonly) {
        if let Ok(path) = std::fs::canonicalize(&v.host) {
            if path.is_dir() && !roots.contains(&path) {
                roots.push(path);
            }
        }
    }
    roots
}

fn found_in(roots: &[PathBuf]) -> Result<BTreeSet<PathBuf>, TrustError> {
    let mut found = BTreeSet::new();
    for root in roots {
        found.extend(find_entries(root)?);
    }
    Ok(found)
}

/// Whether `run`'s Domain is gone: nobody holds its lock (or it has none
/// any more: its runtime directory went, with a reboot).
fn crashed(run: &RunEntry) -> bool {
    let Some(lock) = &run.lock else { return false };
    match OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(lock) {
        Ok(file) => Flock::lock(file, FlockArg::LockExclusiveNonblock).is_ok(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// Registers the start of `ctx`'s run (before its sandbox exists) and
/// returns what it trusts in its workspace. Another Domain's run on the
/// same files that crashed is finished first: `sweep` is given it (its
/// Workspace Guard's restart sweep, which only its own next start would
/// otherwise do: until then Git Sentry would protect, and leave as they
/// are, the files its agent left), then it is settled like a run that
/// ended.
pub fn begin_run(ctx: &Context, sweep: impl Fn(&RunEntry)) -> Result<WorkspaceTrust, TrustError> {
    let roots = roots(ctx);
    let dead: Vec<RunEntry> = load(&ctx.paths.storage_root)?
        .runs
        .into_iter()
        .filter(|r| {
            r.domain != ctx.domain_id.as_str()
                && r.roots.iter().any(|a| roots.iter().any(|b| a.starts_with(b) || b.starts_with(a)))
                && crashed(r)
        })
        .collect();
    for run in &dead {
        sweep(run);
    }
    let found = found_in(&roots)?;
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    let run = RunEntry {
        domain: ctx.domain_id.as_str().into(),
        roots: roots.clone(),
        found,
        started_ms,
        lock: ctx.domain_runtime_dir().ok().map(|d| crate::layout::DomainDir::new(d).lock()),
        domain_root: Some(ctx.paths.domain_root(&ctx.domain_id)),
        developer: Some((ctx.developer.uid, ctx.developer.gid)),
    };
    let found = run.found.clone();
    let untrusted = update(&ctx.paths.storage_root, |record| {
        record.forget_gone(|p| std::fs::symlink_metadata(p).is_ok());
        record.begin_run(run, &dead)
    })?;
    let workspace = ctx.workspace.root();
    let relative = |set: &BTreeSet<PathBuf>| set.iter().filter_map(|e| e.strip_prefix(workspace).ok().map(Path::to_path_buf)).collect();
    Ok(WorkspaceTrust { at_start: relative(&found), untrusted: relative(&untrusted) })
}

/// Records the end of `ctx`'s run: what its roots hold now and did not at
/// its start is the agent's from now on, for every Domain. Returns those
/// entries.
pub fn end_run(ctx: &Context) -> Result<BTreeSet<PathBuf>, TrustError> {
    let found = found_in(&roots(ctx))?;
    update(&ctx.paths.storage_root, |record| {
        let before = record.made.clone();
        record.end(ctx.domain_id.as_str(), &found);
        record.made.difference(&before).cloned().collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(paths: &[&str]) -> BTreeSet<PathBuf> {
        paths.iter().map(PathBuf::from).collect()
    }

    fn roots(paths: &[&str]) -> Vec<PathBuf> {
        paths.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn another_domains_agent_made_repository_is_not_trusted_while_it_runs_or_after() {
        let ws = roots(&["/w"]);
        let mut record = TrustRecord::default();
        // Profile a starts with the developer's repositories.
        assert!(record.begin("a", &ws, &set(&["/w/.git", "/w/dev/.git"])).is_empty());
        // Its agent makes n/.git; profile b starts on the same workspace.
        let now = set(&["/w/.git", "/w/dev/.git", "/w/n/.git"]);
        assert_eq!(record.begin("b", &ws, &now), set(&["/w/n/.git"]));
        // a stops: n/.git is recorded as made, for everyone.
        record.end("a", &now);
        assert_eq!(record.made, set(&["/w/n/.git"]));
        record.end("b", &now);
        assert!(record.runs.is_empty());
        assert_eq!(record.begin("a", &ws, &now), set(&["/w/n/.git"]));
        record.end("a", &now);
        // Gone: forgotten; made again later, it is judged anew.
        let without = set(&["/w/.git", "/w/dev/.git"]);
        assert!(record.begin("b", &ws, &without).is_empty());
        assert!(record.made.is_empty());
        record.end("b", &now);
        assert_eq!(record.made, set(&["/w/n/.git"]), "made during b's run");
    }

    #[test]
    fn a_repository_deleted_and_made_again_by_another_agent_is_not_trusted_by_a_run_that_trusted_it() {
        let ws = roots(&["/w"]);
        let mut record = TrustRecord::default();
        let with_x = set(&["/w/.git", "/w/x/.git"]);
        assert!(record.begin("a", &ws, &with_x).is_empty(), "x is the developer's");
        // x goes away; b starts without it; b's agent makes x again.
        record.begin("b", &ws, &set(&["/w/.git"]));
        assert_eq!(record.untrusted("a", &with_x), set(&["/w/x/.git"]), "a asks again at each request");
        assert!(record.untrusted("b", &with_x).is_empty(), "b judges its own sandbox's work by its own baseline");
        // A run that began distrusting an entry keeps distrusting it for others.
        let mut record = TrustRecord::default();
        record.made.insert(PathBuf::from("/w/n/.git"));
        let with_n = set(&["/w/.git", "/w/n/.git"]);
        assert_eq!(record.begin("a", &ws, &with_n), set(&["/w/n/.git"]));
        record.begin("b", &ws, &set(&["/w/.git"]));
        assert!(record.made.is_empty(), "gone at b's start");
        assert_eq!(record.untrusted("c", &with_n), set(&["/w/n/.git"]), "made again: neither a nor b trusted it at its start");
    }

    #[test]
    fn a_crashed_run_is_settled_by_its_own_next_start_and_distrusted_until_then() {
        let ws = roots(&["/w"]);
        let mut record = TrustRecord::default();
        record.begin("a", &ws, &set(&["/w/.git"]));
        // a crashes (no end) after its agent made m.
        let now = set(&["/w/.git", "/w/.git/modules/m"]);
        assert_eq!(record.begin("b", &ws, &now), set(&["/w/.git/modules/m"]));
        record.end("b", &now);
        assert_eq!(record.runs.len(), 1, "a's registration stays");
        assert_eq!(record.begin("c", &ws, &now), set(&["/w/.git/modules/m"]));
        record.end("c", &now);
        // a starts again: its crashed run is settled.
        assert_eq!(record.begin("a", &ws, &now), set(&["/w/.git/modules/m"]));
        assert_eq!(record.runs.len(), 1);
        assert_eq!(record.made, set(&["/w/.git/modules/m"]));
    }

    #[test]
    fn another_domains_crashed_run_is_settled_once_found_dead() {
        let ws = roots(&["/w"]);
        let mut record = TrustRecord::default();
        record.begin("a", &ws, &set(&["/w/.git"]));
        let a = record.runs[0].clone();
        let now = set(&["/w/.git", "/w/n/.git"]);
        let b = RunEntry {
            domain: "b".into(),
            roots: ws.clone(),
            found: now.clone(),
            started_ms: 5,
            lock: None,
            domain_root: None,
            developer: None,
        };
        assert_eq!(record.begin_run(b, std::slice::from_ref(&a)), set(&["/w/n/.git"]));
        assert_eq!(record.made, set(&["/w/n/.git"]), "a's leftovers are recorded");
        assert_eq!(record.runs.iter().map(|r| r.domain.as_str()).collect::<Vec<_>>(), ["b"]);
        // A later registration of a is not the one found dead.
        record.begin("a", &ws, &now);
        let c = RunEntry { domain: "c".into(), roots: ws, found: now, started_ms: 9, lock: None, domain_root: None, developer: None };
        record.begin_run(c, &[RunEntry { started_ms: 1, ..a }]);
        assert!(record.runs.iter().any(|r| r.domain == "a"), "a runs again: its registration stays");
    }

    #[test]
    fn what_is_gone_is_forgotten() {
        let mut record = TrustRecord::default();
        record.begin("a", &roots(&["/deleted"]), &set(&["/deleted/.git"]));
        record.begin("b", &roots(&["/w", "/gone-volume"]), &set(&["/w/.git"]));
        record.made.extend(set(&["/w/n/.git", "/w/gone/.git"]));
        let on_disk = set(&["/w", "/w/n/.git"]);
        record.forget_gone(|p| on_disk.contains(p));
        assert_eq!(record.made, set(&["/w/n/.git"]));
        assert_eq!(record.runs.iter().map(|r| r.domain.as_str()).collect::<Vec<_>>(), ["b"], "a run with a root still there stays");
    }

    #[test]
    fn a_volume_of_another_domain_that_is_this_workspace_counts() {
        let mut record = TrustRecord::default();
        // Domain v has /w/lib as a writable volume; its workspace is /other.
        record.begin("v", &roots(&["/other", "/w/lib"]), &set(&["/other/.git"]));
        let now = set(&["/w/.git", "/w/lib/x/.git", "/other/.git"]);
        assert_eq!(record.begin("a", &roots(&["/w"]), &now), set(&["/w/lib/x/.git"]));
        // Entries outside a run's roots are not its business.
        assert!(!record.begin("z", &roots(&["/elsewhere"]), &set(&["/elsewhere/.git"])).iter().any(|e| e.starts_with("/w")));
    }

    #[test]
    fn the_record_survives_a_round_trip_under_its_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let untrusted = update(dir.path(), |r| {
            r.begin("a", &roots(&["/w"]), &set(&["/w/.git"]));
            r.begin("b", &roots(&["/w"]), &set(&["/w/.git", "/w/n/.git"]))
        })
        .expect("update");
        assert_eq!(untrusted, set(&["/w/n/.git"]));
        let runs = update(dir.path(), |r| r.runs.iter().map(|r| r.domain.clone()).collect::<Vec<_>>()).expect("read");
        assert_eq!(runs, ["a", "b"]);
        std::fs::write(dir.path().join(RECORD_FILE), "{").expect("write");
        assert!(matches!(update(dir.path(), |_| ()), Err(TrustError::Corrupt { .. })));
    }

    #[test]
    fn entries_are_every_git_dir_gitdir_file_and_module_git_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = dir.path();
        for d in [".git/modules/a/modules/b", ".git/modules/ns/c", ".git/modules/a/logs", "n/.git", "deep/er/x", ".git/objects"] {
            std::fs::create_dir_all(w.join(d)).expect("mkdir");
        }
        for f in
            [".git/modules/a/HEAD", ".git/modules/a/modules/b/HEAD", ".git/modules/ns/c/HEAD", ".git/modules/a/logs/HEAD", "n/.git/HEAD"]
        {
            std::fs::write(w.join(f), "ref: refs/heads/main\n").expect("write");
        }
        std::fs::write(w.join("deep/er/x/.git"), "gitdir: ../../../.git/modules/a\n").expect("write");
        std::os::unix::fs::symlink("/etc", w.join("deep/link")).expect("symlink");
        let found = find_entries(w).expect("walk");
        let want: BTreeSet<PathBuf> =
            [".git", ".git/modules/a", ".git/modules/a/modules/b", ".git/modules/ns/c", "deep/er/x/.git", "n/.git"]
                .iter()
                .map(|p| w.join(p))
                .collect();
        assert_eq!(found, want);
    }
}
