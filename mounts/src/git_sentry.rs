//! Git Sentry: the read-only protections over everything through which the
//! host's git would run code or change behaviour, for what exists when a
//! Domain starts.
//!
//! Every git directory reachable from the repositories of the workspace is
//! visited: the workspace's own and nested repositories' (`.git`), the
//! directory a `commondir` file names (when it is inside the workspace),
//! every linked-worktree gitdir `worktrees/*` (registered or not), every
//! submodule gitdir `modules/**` (nested modules too), and a linked
//! worktree's real git directory outside the workspace. In each, read-only:
//! `config`, `config.worktree`, `hooks/`, `info/` (`info/exclude` decides
//! the ignored set of the next start; `info/attributes` can only *name*
//! filter/diff drivers, whose programs come from the protected config) and
//! `commondir`. Also read-only: every file that one of these configs (or the
//! developer's system/global config) includes through `include.path` or
//! `includeIf.*.path` (any condition: an `onbranch:` condition can become
//! true during the run) and that lies in the workspace or in an outside git
//! dir bound into the sandbox, followed to git's depth of
//! [`MAX_INCLUDE_DEPTH`]; the `core.hooksPath` directory and the
//! `core.excludesFile` file when in the workspace; a work tree's `.git`
//! *file* (`gitdir:` pointer). Every directory above a protected path is
//! pinned (see [`SentryPlan::pinned`]). Index, HEAD, refs, objects and logs
//! stay writable.
//!
//! When the Workspace Guard runs with its gate (and the agent is not root),
//! each repository's own `config` in the workspace is left writable
//! instead ([`SentryPlan::gate_repository_configs`]): the gate keeps the
//! host's opens of what the sandbox writes there until the guard has
//! filtered it against the version recorded here.
//!
//! Missing `hooks/` and `info/` of a common git dir, a missing
//! `config.worktree` when `extensions.worktreeConfig` is on, a missing
//! in-workspace `core.hooksPath` directory and a missing in-workspace include
//! target are created empty so that the sandbox cannot plant them; a missing
//! `config` of a common dir is refused (git would not work). A
//! `worktrees/<name>/` without `commondir` is not a working linked worktree:
//! it is protected read-only as a whole. A symlink at any of these paths, or
//! on the way to an include target, is refused, naming it (git follows
//! symlinks; Lazaret could not protect what they reach).

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use crate::error::MountError;
use crate::gitconfig::{GitConfig, Include};
use crate::ignore_eval::HostGitSettings;
use crate::repo::{self, GitDirPath, RepoLocation};
use crate::safe_path::{self, FileKind};

/// Largest `.git/modules` nesting followed (module names may contain `/`).
const MAX_MODULE_DEPTH: usize = 8;

/// How deep includes are followed: git's own `MAX_INCLUDE_DEPTH`. A deeper
/// chain makes git refuse the whole configuration (so nothing in it runs).
pub const MAX_INCLUDE_DEPTH: usize = 10;

/// Included files read in one discovery at most: a diamond of includes
/// (each file including the next twice) would otherwise read 2^10 files.
const MAX_INCLUDE_READS: usize = 1000;

/// One path to present read-only in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtectedPath {
    /// Where it lives on the host.
    pub path: GitDirPath,
    /// Directory or regular file (binds are dir-over-dir, file-over-file).
    pub kind: FileKind,
    /// A repository's own `config` (not a file some config includes, nor
    /// the developer's global config): [`SentryPlan::gate_repository_configs`]
    /// can leave it writable for the Workspace Guard's gate to judge.
    pub repository_config: bool,
}

/// A repository's own `config` in the workspace that the sandbox may
/// write (issue 30): instead of a read-only bind, the Workspace Guard's
/// gate keeps the host's opens of the sandbox's versions until the guard
/// has filtered them against `developer` (the developer's entries kept,
/// the sandbox's allowlisted).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GatedConfig {
    /// Workspace-relative path.
    pub path: PathBuf,
    /// Its content when the Domain started: the developer's version.
    pub developer: Vec<u8>,
}

/// Everything Git Sentry needs for one workspace.
#[derive(Debug, Clone, Default)]
pub struct SentryPlan {
    /// Read-only binds, in discovery order.
    pub protected: Vec<ProtectedPath>,
    /// Repository configs left writable for the gate
    /// ([`SentryPlan::gate_repository_configs`]); empty otherwise.
    pub gated_configs: Vec<GatedConfig>,
    /// Git directories outside the workspace (linked worktrees) that must be
    /// bound read-write at the same absolute path for the `gitdir:` file to
    /// work in the sandbox.
    pub outside_git_dirs: Vec<PathBuf>,
    /// Directories bound read-write onto themselves so that they become
    /// mount points, which the sandbox cannot rename or remove: every
    /// ancestor (below the workspace root, or below an outside git dir) of a
    /// protected path. Without this, `mv .git .git-old; mkdir .git` (or the
    /// same with `.git/modules/x` or a submodule's directory) would swap in
    /// an unprotected config that the host's git then runs. Sorted.
    pub pinned: Vec<GitDirPath>,
    /// Repositories found (for diagnostics).
    pub repositories: Vec<RepoLocation>,
    /// Non-fatal findings for the launch log: a protected config whose
    /// includes could not all be read (the file itself is protected), an
    /// include not followed, a placeholder Lazaret created.
    pub warnings: Vec<String>,
}

impl SentryPlan {
    /// Recomputes [`SentryPlan::pinned`] from the protected paths and the
    /// gated configs (a gated config's directory must not be swapped for
    /// another either: the guard judges the file at that path).
    pub fn compute_pins(&mut self) {
        let protected: HashSet<&GitDirPath> = self.protected.iter().map(|p| &p.path).collect();
        let gated: Vec<GitDirPath> = self.gated_configs.iter().map(|c| GitDirPath::Inside(c.path.clone())).collect();
        let mut pins = std::collections::BTreeSet::new();
        for entry_path in self.protected.iter().map(|p| &p.path).chain(&gated) {
            let (path, floor) = match entry_path {
                GitDirPath::Inside(rel) => (rel.clone(), PathBuf::new()),
                GitDirPath::Outside(abs) => {
                    let Some(floor) = self.outside_git_dirs.iter().find(|d| abs.starts_with(d)) else { continue };
                    (abs.clone(), floor.clone())
                }
            };
            for ancestor in path.ancestors().skip(1) {
                if ancestor == floor || !ancestor.starts_with(&floor) || ancestor.as_os_str().is_empty() {
                    break;
                }
                let pin = match entry_path {
                    GitDirPath::Inside(_) => GitDirPath::Inside(ancestor.to_owned()),
                    GitDirPath::Outside(_) => GitDirPath::Outside(ancestor.to_owned()),
                };
                if !protected.contains(&pin) {
                    pins.insert(pin);
                }
            }
        }
        self.pinned = pins.into_iter().collect();
    }

    /// Leaves every repository's own `config` in the workspace writable in
    /// the sandbox, for the Workspace Guard's gate to judge (issue 30): each
    /// moves from [`SentryPlan::protected`] to [`SentryPlan::gated_configs`]
    /// with its content now, the developer's version. Call it only when the
    /// guard runs with its gate. Include targets, `config.worktree` files
    /// and configs in git directories outside the workspace keep their
    /// read-only binds; so does a config too large for the guard to filter
    /// (with a warning). Recomputes the pins.
    pub fn gate_repository_configs(&mut self, workspace: BorrowedFd<'_>) -> Result<(), MountError> {
        let mut kept = Vec::new();
        for entry in std::mem::take(&mut self.protected) {
            let GitDirPath::Inside(rel) = &entry.path else {
                kept.push(entry);
                continue;
            };
            if !entry.repository_config {
                kept.push(entry);
                continue;
            }
            match safe_path::read_beneath(workspace, rel, GATED_CONFIG_LIMIT) {
                Ok(Some(developer)) => self.gated_configs.push(GatedConfig { path: rel.clone(), developer }),
                Ok(None) => return Err(MountError::refused(rel, "disappeared while planning the mounts")),
                Err(MountError::Refused { .. }) => {
                    self.warnings.push(format!(
                        "{} is larger than {GATED_CONFIG_LIMIT} bytes: it stays read-only in the sandbox (git config inside cannot change it)",
                        lazaret_protocol::display::escaped(rel)
                    ));
                    kept.push(entry);
                }
                Err(e) => return Err(e),
            }
        }
        self.protected = kept;
        self.compute_pins();
        Ok(())
    }
}

/// The largest repository config left writable for the gate (the guard
/// filters what it can read whole: `MAX_CONTROL_FILE` in the guard).
const GATED_CONFIG_LIMIT: u64 = 1 << 20;

/// Discovers the Git Sentry paths for the repositories whose work trees are
/// `worktrees` (relative to the workspace; `""` is the workspace root).
/// Creates missing protectable entries as documented in the module docs.
pub fn discover(
    workspace: BorrowedFd<'_>,
    workspace_abs: &Path,
    worktrees: &[PathBuf],
    host: &HostGitSettings,
) -> Result<SentryPlan, MountError> {
    let mut sentry = Sentry {
        workspace,
        workspace_abs,
        host,
        plan: SentryPlan::default(),
        git_dirs: HashMap::new(),
        configs: HashMap::new(),
        include_reads: 0,
        global: GitConfig::default(),
        creating_global: false,
    };
    let mut locations = Vec::new();
    for worktree in worktrees {
        if let Some(location) = repo::locate(workspace, workspace_abs, worktree)? {
            sentry.note_outside_git_dirs(&location);
            locations.push(location);
        }
    }
    sentry.plan.outside_git_dirs.sort();
    sentry.plan.outside_git_dirs.dedup();
    // Outside git dirs are known first: an include target in one of them is
    // writable in the sandbox and must be protected.
    sentry.global = sentry.global_config()?;
    for location in locations {
        sentry.protect_repository(&location)?;
        sentry.plan.repositories.push(location);
    }
    let mut plan = sentry.plan;
    // A repository's config that is also some config's include target is
    // an include target: it stays read-only.
    let included: HashSet<GitDirPath> = plan.protected.iter().filter(|p| !p.repository_config).map(|p| p.path.clone()).collect();
    for entry in &mut plan.protected {
        entry.repository_config &= !included.contains(&entry.path);
    }
    let mut seen = HashSet::new();
    plan.protected.retain(|p| seen.insert(p.path.clone()));
    plan.compute_pins();
    Ok(plan)
}

/// A configuration file, by where it lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum ConfigFile {
    /// Visible in the sandbox (in the workspace, or in an outside git dir
    /// bound read-write): protected.
    Sandbox(GitDirPath),
    /// A host file the sandbox cannot see (the developer's global config, an
    /// include elsewhere): read, for its includes, not protected.
    Host(PathBuf),
}

impl ConfigFile {
    fn display(&self) -> String {
        match self {
            ConfigFile::Sandbox(p) => lazaret_protocol::display::escaped(p.display_path()).to_string(),
            ConfigFile::Host(p) => lazaret_protocol::display::escaped(p).to_string(),
        }
    }
}

/// One discovery's state.
struct Sentry<'a> {
    workspace: BorrowedFd<'a>,
    workspace_abs: &'a Path,
    host: &'a HostGitSettings,
    plan: SentryPlan,
    /// Git dirs visited, with the `extensions.worktreeConfig` of their
    /// common config.
    git_dirs: HashMap<GitDirPath, bool>,
    /// Config files read, with their includes spliced in.
    configs: HashMap<ConfigFile, GitConfig>,
    include_reads: usize,
    /// The developer's system and global config, includes expanded.
    global: GitConfig,
    /// Reading the developer's own config files: a missing one in the
    /// workspace gets a placeholder like a missing include target.
    creating_global: bool,
}

impl Sentry<'_> {
    fn note_outside_git_dirs(&mut self, location: &RepoLocation) {
        self.plan.outside_git_dirs.extend(location.outside_git_dirs());
    }

    fn protect(&mut self, path: GitDirPath, kind: FileKind) {
        self.plan.protected.push(ProtectedPath { path, kind, repository_config: false });
    }

    /// Is this git dir visible in the sandbox (so worth protecting)?
    fn visible(&self, dir: &GitDirPath) -> bool {
        match dir {
            GitDirPath::Inside(_) => true,
            GitDirPath::Outside(abs) => self.plan.outside_git_dirs.iter().any(|d| abs.starts_with(d)),
        }
    }

    fn protect_repository(&mut self, location: &RepoLocation) -> Result<(), MountError> {
        if location.dot_git_is_file {
            // The `gitdir:` pointer itself: rewritten, it would send the host's
            // git to a config of the sandbox's choosing.
            self.protect(GitDirPath::Inside(location.worktree.join(".git")), FileKind::Regular);
        }
        self.visit_common_dir(&location.common_dir, 0)?;
        let worktree_config = self.visit_git_dir(&location.git_dir, None, 0)?;
        // The repository's effective config: global, common, per worktree.
        let mut config = self.global.clone();
        if let Some(common) = self.configs.get(&ConfigFile::Sandbox(location.common_dir.join("config"))) {
            config.merge(common.clone());
        }
        if worktree_config {
            if let Some(own) = self.configs.get(&ConfigFile::Sandbox(location.git_dir.join("config.worktree"))) {
                config.merge(own.clone());
            }
        }
        // Each reading of a path: older git reads an unquoted tab in it as a space.
        for hooks_path in config.get_readings("core", "hooksPath") {
            self.protect_hooks_path(location, hooks_path)?;
        }
        let excludes = config.get_readings("core", "excludesFile");
        if excludes.is_empty() {
            return self.protect_excludes_file(location, None);
        }
        for excludes_file in excludes {
            self.protect_excludes_file(location, Some(excludes_file))?;
        }
        Ok(())
    }

    /// A git dir that git uses as a common dir (a repository's, or the
    /// target of a `commondir`: git reads `commondir` one level only, so the
    /// target is the common dir even if it has a `commondir` of its own).
    fn visit_common_dir(&mut self, dir: &GitDirPath, module_depth: usize) -> Result<bool, MountError> {
        self.visit_git_dir_as(dir, None, module_depth, true)
    }

    fn visit_git_dir(&mut self, dir: &GitDirPath, inherited: Option<bool>, module_depth: usize) -> Result<bool, MountError> {
        self.visit_git_dir_as(dir, inherited, module_depth, false)
    }

    /// Protects one git directory and what it leads to. `inherited` is the
    /// `extensions.worktreeConfig` of the common dir for a linked worktree's
    /// gitdir, `None` for a git dir that is (or names with `commondir`) its
    /// own common dir; `as_common` says git uses it as a common dir.
    /// Returns the common config's `worktreeConfig`.
    fn visit_git_dir_as(
        &mut self,
        dir: &GitDirPath,
        inherited: Option<bool>,
        module_depth: usize,
        as_common: bool,
    ) -> Result<bool, MountError> {
        if let Some(flag) = self.git_dirs.get(dir) {
            return Ok(*flag);
        }
        // Provisional entry: a commondir cycle ends here.
        self.git_dirs.insert(dir.clone(), inherited.unwrap_or(false));
        let fd = dir.open(self.workspace)?;

        let mut common_flag = None;
        let mut has_commondir = false;
        match existing_kind(fd.as_fd(), "commondir", dir)? {
            Some(FileKind::Regular) => {
                has_commondir = true;
                self.protect(dir.join("commondir"), FileKind::Regular);
                let raw = dir.read_file(self.workspace, "commondir")?.unwrap_or_default();
                let target = repo::resolve_commondir(self.workspace_abs, dir, &raw)?;
                // A target outside the sandbox is the host's alone; one that
                // does not exist leaves git without a repository.
                if self.visible(&target) && target.open(self.workspace).is_ok() {
                    common_flag = Some(self.visit_common_dir(&target, module_depth)?);
                }
            }
            Some(_) => return Err(refused(dir, "commondir", "must be a regular file")),
            None => {}
        }
        let is_common = as_common || (!has_commondir && inherited.is_none());

        let mut own_flag = false;
        match existing_kind(fd.as_fd(), "config", dir)? {
            Some(FileKind::Regular) => {
                let file = ConfigFile::Sandbox(dir.join("config"));
                let config = self.config_file(&file, 0, &mut Vec::new())?.unwrap_or_default();
                let mut effective = self.global.clone();
                effective.merge(config);
                own_flag = effective.get_bool("extensions", "worktreeConfig") == Some(true);
            }
            Some(_) => return Err(refused(dir, "config", "must be a regular file")),
            // A repository's own git dir (not one named by a chained
            // `commondir`, which git would not accept as a repository).
            None if !has_commondir && inherited.is_none() => {
                return Err(refused(
                    dir,
                    "config",
                    "is missing; git cannot work without it and Lazaret will not fabricate one (restore it, e.g. with `git init` in the repository)",
                ));
            }
            None => {}
        }
        let flag = common_flag.or(inherited).unwrap_or(own_flag);
        self.git_dirs.insert(dir.clone(), flag);

        for (name, kind) in [("hooks", FileKind::Directory), ("info", FileKind::Directory)] {
            match existing_kind(fd.as_fd(), name, dir)? {
                Some(FileKind::Directory) => self.protect(dir.join(name), FileKind::Directory),
                Some(FileKind::Regular) if name == "info" => self.protect(dir.join(name), FileKind::Regular),
                Some(_) => return Err(refused(dir, name, "must be a directory")),
                None if is_common => {
                    safe_path::ensure_dir_beneath(fd.as_fd(), Path::new(name))
                        .map_err(|e| safe_path::rename_error_path(e, dir.join(name).display_path()))?;
                    self.protect(dir.join(name), kind);
                }
                None => {}
            }
        }
        match existing_kind(fd.as_fd(), "config.worktree", dir)? {
            Some(FileKind::Regular) => {
                self.config_file(&ConfigFile::Sandbox(dir.join("config.worktree")), 0, &mut Vec::new())?;
            }
            Some(_) => return Err(refused(dir, "config.worktree", "must be a regular file")),
            None if flag => {
                safe_path::ensure_file_beneath(fd.as_fd(), Path::new("config.worktree"))?;
                self.config_file(&ConfigFile::Sandbox(dir.join("config.worktree")), 0, &mut Vec::new())?;
            }
            None => {}
        }
        if is_common || inherited.is_none() {
            // A common dir (or one named by `commondir`): its linked
            // worktrees and submodules.
            self.visit_linked_worktrees(dir, flag, module_depth)?;
            self.visit_modules(&dir.join("modules"), module_depth)?;
        }
        Ok(flag)
    }

    /// Every `worktrees/<name>/` of a common dir, registered or not. One
    /// with a `commondir` is a linked worktree's gitdir (possibly for a work
    /// tree outside the workspace); one without is not usable as such and
    /// is protected as a whole.
    fn visit_linked_worktrees(&mut self, common_dir: &GitDirPath, flag: bool, module_depth: usize) -> Result<(), MountError> {
        let worktrees = common_dir.join("worktrees");
        let Some(dir) = open_existing_dir(&worktrees, self.workspace)? else { return Ok(()) };
        for name in subdirectories(dir.as_fd(), &worktrees)? {
            let git_dir = worktrees.join(&name);
            let fd = git_dir.open(self.workspace)?;
            if existing_kind(fd.as_fd(), "commondir", &git_dir)?.is_some() {
                self.visit_git_dir(&git_dir, Some(flag), module_depth)?;
            } else {
                self.plan.warnings.push(format!(
                    "{} has no commondir (not a working linked worktree): protected read-only as a whole",
                    lazaret_protocol::display::escaped(git_dir.display_path())
                ));
                self.protect(git_dir, FileKind::Directory);
            }
        }
        Ok(())
    }

    /// Walks `modules/` for submodule git directories (a directory holding
    /// a `HEAD` file), visiting each (which recurses into its own `modules/`
    /// and `worktrees/`); other directories are module names with `/`.
    fn visit_modules(&mut self, modules: &GitDirPath, depth: usize) -> Result<(), MountError> {
        if depth > MAX_MODULE_DEPTH {
            self.plan.warnings.push(format!(
                "{}: submodules nested deeper than {MAX_MODULE_DEPTH} are not protected",
                lazaret_protocol::display::escaped(modules.display_path())
            ));
            return Ok(());
        }
        let Some(dir) = open_existing_dir(modules, self.workspace)? else { return Ok(()) };
        for name in subdirectories(dir.as_fd(), modules)? {
            let child = modules.join(&name);
            let child_fd = child.open(self.workspace)?;
            if safe_path::open_path_beneath(child_fd.as_fd(), Path::new("HEAD"))?.is_some() {
                self.visit_common_dir(&child, depth + 1)?;
            } else {
                self.visit_modules(&child, depth + 1)?;
            }
        }
        Ok(())
    }

    /// The developer's system, XDG and `~/.gitconfig` files, includes
    /// expanded (an include of theirs may land in the workspace).
    fn global_config(&mut self) -> Result<GitConfig, MountError> {
        let xdg = self.host.xdg_config_home.clone().or_else(|| self.host.home.as_ref().map(|h| h.join(".config")));
        let mut files: Vec<PathBuf> = Vec::new();
        files.extend(self.host.system_config.clone());
        files.extend(xdg.map(|d| d.join("git/config")));
        files.extend(self.host.home.as_ref().map(|h| h.join(".gitconfig")));
        let mut config = GitConfig::default();
        for file in files {
            let Some(file) = repo::normalize(&file).filter(|f| f.is_absolute()) else { continue };
            let located = self.locate_file(&file)?;
            // One of the developer's own config files in the workspace (a
            // workspace that holds their home): created empty if missing.
            self.creating_global = true;
            let read = self.config_file(&located, 0, &mut Vec::new());
            self.creating_global = false;
            if let Some(read) = read? {
                config.merge(read);
            }
        }
        Ok(config)
    }

    /// Reads (and, in the sandbox, protects) one config file and every file
    /// it includes; returns its entries with includes spliced in, `None` if
    /// it could not be read. `depth` counts includes from the first file;
    /// `chain` holds the files being read (cycle detection).
    fn config_file(&mut self, file: &ConfigFile, depth: usize, chain: &mut Vec<ConfigFile>) -> Result<Option<GitConfig>, MountError> {
        if let Some(done) = self.configs.get(file) {
            let done = done.clone();
            // Read again as an include (or as the developer's own config):
            // an include target too, which stays read-only.
            if let (ConfigFile::Sandbox(path), true) = (file, !chain.is_empty() || self.creating_global) {
                self.protect(path.clone(), FileKind::Regular);
            }
            return Ok(Some(done));
        }
        let raw = match file {
            ConfigFile::Sandbox(path) => {
                let Some(fd) = self.open_sandbox(path).map_err(|e| with_context(e, &included_by(chain)))? else {
                    if depth == 0 && chain.is_empty() && !self.creating_global {
                        return Ok(None);
                    }
                    // A missing include target: created empty (and protected),
                    // or the sandbox could write it.
                    self.create_placeholder(path)?;
                    self.plan.warnings.push(format!(
                        "{}{} did not exist: created empty and read-only so that the sandbox cannot plant it",
                        lazaret_protocol::display::escaped(path.display_path()),
                        included_by(chain)
                    ));
                    self.protect(path.clone(), FileKind::Regular);
                    return Ok(None);
                };
                match safe_path::file_kind(fd.as_fd())? {
                    FileKind::Regular => {}
                    FileKind::Directory if depth > 0 => {
                        // git cannot read a directory (it stops with an error).
                        // Not bound read-only: an include naming `.git` or the
                        // workspace would freeze it all.
                        self.plan.warnings.push(format!(
                            "{} (included by {}) is a directory: git cannot read it; not protected",
                            lazaret_protocol::display::escaped(path.display_path()),
                            chain.last().map(ConfigFile::display).unwrap_or_default()
                        ));
                        return Ok(None);
                    }
                    FileKind::Symlink => {
                        return Err(MountError::refused(
                            path.display_path(),
                            format!(
                                "is a symlink{}; git would follow it to a file Lazaret cannot protect (replace it with the real file)",
                                included_by(chain)
                            ),
                        ));
                    }
                    _ => {
                        return Err(MountError::refused(
                            path.display_path(),
                            format!("a git config file must be a regular file{}", included_by(chain)),
                        ));
                    }
                }
                // A git dir's own `config`, read as such (not included).
                let repository_config = depth == 0
                    && chain.is_empty()
                    && !self.creating_global
                    && path.display_path().file_name() == Some(std::ffi::OsStr::new("config"));
                self.plan.protected.push(ProtectedPath { path: path.clone(), kind: FileKind::Regular, repository_config });
                match self.read_sandbox(path) {
                    Ok(raw) => raw,
                    Err(e) => {
                        self.plan.warnings.push(format!(
                            "{e}: the file is protected read-only, but its includes could not be read and are not protected"
                        ));
                        return Ok(None);
                    }
                }
            }
            ConfigFile::Host(path) => match read_host_file(path) {
                Some(raw) => raw,
                None => return Ok(None),
            },
        };
        let parsed = GitConfig::parse(&raw);
        if !parsed.skipped_lines().is_empty() && matches!(file, ConfigFile::Sandbox(_)) {
            self.plan.warnings.push(format!(
                "{}: could not parse line(s) {:?} (git would refuse this file); it is protected read-only, but includes on those lines are not followed",
                file.display(),
                parsed.skipped_lines()
            ));
        }
        chain.push(file.clone());
        let expanded = parsed.expand_includes(|include| self.follow_include(include, depth, chain));
        chain.pop();
        let expanded = expanded?;
        self.configs.insert(file.clone(), expanded.clone());
        Ok(Some(expanded))
    }

    /// Follows one include of the last file of `chain`.
    fn follow_include(&mut self, include: &Include, depth: usize, chain: &mut Vec<ConfigFile>) -> Result<Option<GitConfig>, MountError> {
        let Some(including) = chain.last().cloned() else { return Ok(None) };
        if depth + 1 > MAX_INCLUDE_DEPTH {
            self.plan.warnings.push(format!(
                "{}: includes nest deeper than {MAX_INCLUDE_DEPTH}; git refuses such a configuration, Lazaret stops following them here",
                including.display()
            ));
            return Ok(None);
        }
        if self.include_reads >= MAX_INCLUDE_READS {
            self.plan.warnings.push(format!("{}: more than {MAX_INCLUDE_READS} includes, not followed further", including.display()));
            return Ok(None);
        }
        self.include_reads += 1;
        let value = include.path.as_str();
        let raw = if let Some(rest) = value.strip_prefix("~/") {
            match &self.host.home {
                Some(home) => home.join(rest),
                None => return Ok(None),
            }
        } else if value.starts_with('~') || value.starts_with("%(prefix)/") {
            // `~user/` (unsupported) or git's install prefix (outside).
            self.plan.warnings.push(format!("{}: include {value:?} not followed", including.display()));
            return Ok(None);
        } else if Path::new(value).is_absolute() {
            PathBuf::from(value)
        } else {
            // Relative to the including file's directory, as git resolves it.
            let including_abs = match &including {
                ConfigFile::Sandbox(GitDirPath::Inside(rel)) => self.workspace_abs.join(rel),
                ConfigFile::Sandbox(GitDirPath::Outside(abs)) | ConfigFile::Host(abs) => abs.clone(),
            };
            including_abs.parent().unwrap_or(Path::new("/")).join(value)
        };
        let target = self.locate_file(&raw).map_err(|e| with_context(e, &format!(" (included by {})", including.display())))?;
        if chain.contains(&target) {
            self.plan.warnings.push(format!(
                "{} includes {} again (a cycle): git refuses such a configuration",
                including.display(),
                target.display()
            ));
            return Ok(None);
        }
        self.config_file(&target, depth + 1, chain)
    }

    /// Where an absolute path (as git would open it) lands: in the sandbox
    /// (resolved without following any symlink there) or on the host.
    fn locate_file(&self, raw: &Path) -> Result<ConfigFile, MountError> {
        // `..` is applied lexically, which is what the kernel does only if
        // the directory before it is real: checked for sandbox directories.
        let mut out = PathBuf::from("/");
        for component in raw.components() {
            match component {
                Component::Normal(name) => out.push(name),
                Component::ParentDir => {
                    if let ConfigFile::Sandbox(dir) = self.classify(&out) {
                        self.open_sandbox_dir(&dir)?;
                    }
                    out.pop();
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        match self.classify(&out) {
            ConfigFile::Host(abs) => self.host_path_into_sandbox(&abs),
            sandbox => Ok(sandbox),
        }
    }

    fn classify(&self, abs: &Path) -> ConfigFile {
        if let Ok(rel) = abs.strip_prefix(self.workspace_abs) {
            return ConfigFile::Sandbox(GitDirPath::Inside(rel.to_owned()));
        }
        if self.plan.outside_git_dirs.iter().any(|d| abs.starts_with(d)) {
            return ConfigFile::Sandbox(GitDirPath::Outside(abs.to_owned()));
        }
        ConfigFile::Host(abs.to_owned())
    }

    /// A host path may still reach the workspace through the host's own
    /// symlinks (`/home` → `/usr/home`): the first prefix whose real path is
    /// in the sandbox decides, and the rest is resolved there.
    fn host_path_into_sandbox(&self, abs: &Path) -> Result<ConfigFile, MountError> {
        let components: Vec<Component<'_>> = abs.components().collect();
        let mut prefix = PathBuf::new();
        for (index, component) in components.iter().enumerate() {
            prefix.push(component);
            let Ok(real) = std::fs::canonicalize(&prefix) else { break };
            if let ConfigFile::Sandbox(_) = self.classify(&real) {
                let rest: PathBuf = components[index + 1..].iter().collect();
                return Ok(self.classify(&real.join(rest)));
            }
        }
        Ok(ConfigFile::Host(abs.to_owned()))
    }

    /// `O_PATH` fd of a sandbox path, `None` if it (or its parent) is
    /// missing; no symlink is followed.
    fn open_sandbox(&self, path: &GitDirPath) -> Result<Option<OwnedFd>, MountError> {
        match path {
            GitDirPath::Inside(rel) => safe_path::open_path_beneath(self.workspace, rel),
            GitDirPath::Outside(abs) => {
                let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else { return Ok(None) };
                match repo::open_absolute_dir(parent) {
                    Ok(dir) => safe_path::open_path_beneath(dir.as_fd(), Path::new(name)),
                    Err(MountError::Syscall { errno: nix::errno::Errno::ENOENT, .. }) => Ok(None),
                    Err(e) => Err(e),
                }
            }
        }
    }

    fn open_sandbox_dir(&self, path: &GitDirPath) -> Result<(), MountError> {
        match self.open_sandbox(path)? {
            Some(fd) if safe_path::file_kind(fd.as_fd())? == FileKind::Directory => Ok(()),
            Some(_) => {
                Err(MountError::refused(path.display_path(), "`..` after a symlink or a file; Lazaret cannot resolve it as git would"))
            }
            None => Ok(()),
        }
    }

    fn read_sandbox(&self, path: &GitDirPath) -> Result<Vec<u8>, MountError> {
        let (parent, name) = split(path)?;
        Ok(parent.read_file(self.workspace, &name)?.unwrap_or_default())
    }

    fn create_placeholder(&self, path: &GitDirPath) -> Result<(), MountError> {
        match path {
            GitDirPath::Inside(rel) => {
                if let Some(parent) = rel.parent() {
                    safe_path::ensure_dir_beneath(self.workspace, parent)?;
                }
                safe_path::ensure_file_beneath(self.workspace, rel)?;
            }
            GitDirPath::Outside(abs) => {
                let (parent, name) = split(path)?;
                let GitDirPath::Outside(parent_abs) = parent else { return Ok(()) };
                let dir =
                    repo::open_absolute_dir(&parent_abs).map_err(|e| with_context(e, &format!(" (cannot create {})", abs.display())))?;
                safe_path::ensure_file_beneath(dir.as_fd(), Path::new(&name))?;
            }
        }
        Ok(())
    }

    /// `core.hooksPath`: protected when in the sandbox (created empty if
    /// missing); elsewhere it is not visible in the sandbox.
    fn protect_hooks_path(&mut self, location: &RepoLocation, value: &str) -> Result<(), MountError> {
        let Some(raw) = self.config_path(location, value) else { return Ok(()) };
        let ConfigFile::Sandbox(path) = self.locate_file(&raw)? else { return Ok(()) };
        match self.open_sandbox(&path)? {
            Some(fd) => match safe_path::file_kind(fd.as_fd())? {
                FileKind::Directory => {}
                FileKind::Symlink => {
                    return Err(MountError::refused(
                        path.display_path(),
                        "core.hooksPath points at a symlink; Git Sentry cannot protect it",
                    ));
                }
                _ => return Err(MountError::refused(path.display_path(), "core.hooksPath must be a directory")),
            },
            None => match &path {
                GitDirPath::Inside(rel) => {
                    safe_path::ensure_dir_beneath(self.workspace, rel)?;
                }
                GitDirPath::Outside(_) => return Ok(()),
            },
        }
        self.protect(path, FileKind::Directory);
        Ok(())
    }

    /// `core.excludesFile` (default `$XDG_CONFIG_HOME/git/ignore`) decides
    /// the ignored set of the next start when it lies in the sandbox:
    /// protected if it is a regular file. A missing one is not created: a
    /// new file there can only add ignore rules (it has the lowest
    /// precedence), which isolates more, never less.
    fn protect_excludes_file(&mut self, location: &RepoLocation, value: Option<&str>) -> Result<(), MountError> {
        let raw = match value {
            Some(value) => self.config_path(location, value),
            None => self
                .host
                .xdg_config_home
                .clone()
                .or_else(|| self.host.home.as_ref().map(|h| h.join(".config")))
                .map(|d| d.join("git/ignore")),
        };
        let Some(raw) = raw else { return Ok(()) };
        let ConfigFile::Sandbox(path) = self.locate_file(&raw)? else { return Ok(()) };
        let Some(fd) = self.open_sandbox(&path)? else { return Ok(()) };
        match safe_path::file_kind(fd.as_fd())? {
            FileKind::Regular => self.protect(path, FileKind::Regular),
            // Lazaret's ignore scan does not read it either (it never follows a
            // symlink), so the sandbox changing it changes nothing Lazaret decides.
            _ => self.plan.warnings.push(format!(
                "core.excludesFile {} is not a regular file: not protected (Lazaret does not use it)",
                lazaret_protocol::display::escaped(path.display_path())
            )),
        }
        Ok(())
    }

    /// A path-valued config key as an absolute path: `~/` is the developer's
    /// home, a relative path is relative to the work tree root.
    fn config_path(&self, location: &RepoLocation, value: &str) -> Option<PathBuf> {
        if let Some(rest) = value.strip_prefix("~/") {
            return self.host.home.as_ref().map(|h| h.join(rest));
        }
        if value.starts_with('~') || value.is_empty() {
            return None;
        }
        let raw = Path::new(value);
        Some(if raw.is_absolute() { raw.to_owned() } else { self.workspace_abs.join(&location.worktree).join(raw) })
    }
}

/// A host file read for its includes (trusted; a missing or unreadable one
/// is skipped, as git skips a missing include).
fn read_host_file(path: &Path) -> Option<Vec<u8>> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > repo::SMALL_FILE_LIMIT {
        return None;
    }
    std::fs::read(path).ok()
}

fn split(path: &GitDirPath) -> Result<(GitDirPath, String), MountError> {
    let p = path.display_path();
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(MountError::refused(p, "not a file path"));
    };
    let name = name.to_string_lossy().into_owned();
    Ok((
        match path {
            GitDirPath::Inside(_) => GitDirPath::Inside(parent.to_owned()),
            GitDirPath::Outside(_) => GitDirPath::Outside(parent.to_owned()),
        },
        name,
    ))
}

fn included_by(chain: &[ConfigFile]) -> String {
    chain.last().map(|f| format!(" (included by {})", f.display())).unwrap_or_default()
}

fn with_context(error: MountError, context: &str) -> MountError {
    match error {
        MountError::Refused { path, reason } => MountError::refused(path, format!("{reason}{context}")),
        other => other,
    }
}

fn open_existing_dir(dir: &GitDirPath, workspace: BorrowedFd<'_>) -> Result<Option<OwnedFd>, MountError> {
    match dir.open(workspace) {
        Ok(fd) => Ok(Some(fd)),
        Err(MountError::Syscall { errno: nix::errno::Errno::ENOENT, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The kind of `dir/name` if it exists; a symlink is refused.
fn existing_kind(dir: BorrowedFd<'_>, name: &str, git_dir: &GitDirPath) -> Result<Option<FileKind>, MountError> {
    let Some(fd) = safe_path::open_path_beneath(dir, Path::new(name))? else {
        return Ok(None);
    };
    match safe_path::file_kind(fd.as_fd())? {
        FileKind::Symlink => {
            Err(refused(git_dir, name, "is a symlink; Git Sentry cannot protect it (replace it with the real file or directory)"))
        }
        kind => Ok(Some(kind)),
    }
}

fn refused(git_dir: &GitDirPath, name: &str, reason: &str) -> MountError {
    let path = match git_dir.join(name) {
        GitDirPath::Inside(p) | GitDirPath::Outside(p) => p,
    };
    MountError::refused(path, reason)
}

/// Names of the real (non-symlink) subdirectories of a directory; a symlink
/// among them is refused (a module directory must be real).
fn subdirectories(dir: BorrowedFd<'_>, at: &GitDirPath) -> Result<Vec<PathBuf>, MountError> {
    let label = match at {
        GitDirPath::Inside(p) | GitDirPath::Outside(p) => p.clone(),
    };
    let fd = safe_path::open_beneath(dir, Path::new(""), nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY)?;
    let mut listing = nix::dir::Dir::from_fd(fd).map_err(|e| MountError::sys("opendir", &label, e))?;
    let mut names = Vec::new();
    for entry in listing.iter() {
        let entry = entry.map_err(|e| MountError::sys("readdir", &label, e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = PathBuf::from(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name));
        let child = safe_path::open_path_beneath(dir, &name)?;
        let Some(child) = child else { continue };
        match safe_path::file_kind(child.as_fd())? {
            FileKind::Directory => names.push(name),
            FileKind::Symlink => {
                return Err(MountError::refused(
                    label.join(&name),
                    "a symlink inside a git directory's modules/ or worktrees/ cannot be protected; remove it",
                ));
            }
            _ => {}
        }
    }
    names.sort();
    Ok(names)
}
