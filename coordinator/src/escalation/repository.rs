//! Which repository a host command would run git in, and whether Git Sentry
//! protects it.
//!
//! A host command runs in a workspace directory the agent chose, and git
//! (run by the command, or by anything it starts) takes its configuration
//! and hooks from the nearest `.git` at or above that directory. Git Sentry
//! made the control files of every repository that existed at the Domain's
//! start read-only in the sandbox; a repository the agent made during the
//! run has a configuration the agent can rewrite at any moment, faster than
//! the Workspace Guard can filter it, so the host's git would run what the
//! agent chose (`core.sshCommand` under a rule-approved `git fetch`). Host
//! commands therefore run only where the nearest `.git` is a protected one,
//! and a command that is `git` itself gets that repository pinned
//! (`GIT_DIR`, `GIT_WORK_TREE`): a `.git` the agent creates nearer to the
//! directory after the check is never discovered.
//!
//! Pinning covers the repository git starts in, not the submodules it
//! recurses into (running git again in each, with that one's config):
//! [`recursion_targets`] refuses a command while any repository git could
//! enter is not the developer's, and [`NO_SUBMODULE_RECURSION`] turns
//! git's own recursion off in every host command's environment. Which
//! repositories are the developer's is shared by every Domain on the same
//! files (`crate::git_trust`).

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use lazaret_mounts::guard::git_model::join_inside;

/// What a directory's `.git` entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DotGitEntry {
    /// There is none.
    Missing,
    /// A directory (a repository's git dir).
    Directory,
    /// A `gitdir:` file (a linked worktree or submodule).
    File,
    /// A symlink, special file or unreadable entry.
    Unusable,
}

/// The repository a host command in `cwd` (workspace-relative) would use:
/// the work tree (workspace-relative) of the nearest `.git` at or above
/// `cwd`, which must be one Git Sentry protects (`protected`: its
/// workspace-relative read-only paths; a git dir by its `config`, a
/// `gitdir:` file by itself) and no Domain's agent made (`untrusted`, see
/// `crate::git_trust`). `dot_git` tells what `DIR/.git` is for a
/// workspace-relative DIR. The error is the reason, one line.
pub fn protected_repository(
    cwd: &Path,
    protected: &[PathBuf],
    untrusted: &BTreeSet<PathBuf>,
    dot_git: impl Fn(&Path) -> DotGitEntry,
) -> Result<PathBuf, String> {
    let is_protected = |p: &Path| protected.iter().any(|q| q == p);
    for dir in cwd.ancestors() {
        let entry = dir.join(".git");
        let shown = lazaret_protocol::display::escaped(&entry);
        match dot_git(dir) {
            DotGitEntry::Missing => continue,
            DotGitEntry::Directory | DotGitEntry::File if untrusted.contains(&entry) => {
                return Err(format!(
                    "the working directory is in the repository {shown}, which an agent made in an earlier run or in another profile's Domain on this workspace: its git configuration is the agent's, so Lazaret runs no host command there (run it yourself, or from a repository of your own)"
                ));
            }
            DotGitEntry::Directory if is_protected(&entry.join("config")) => return Ok(dir.to_path_buf()),
            DotGitEntry::File if is_protected(&entry) => return Ok(dir.to_path_buf()),
            DotGitEntry::Directory | DotGitEntry::File => {
                return Err(format!(
                    "the working directory is in the repository {shown}, which was made during this run: its git configuration and hooks are the agent's, so Lazaret runs no host command there (run it yourself, or from a repository that existed when the Domain started)"
                ));
            }
            DotGitEntry::Unusable => {
                return Err(format!(
                    "{shown} above the working directory is a symlink or special file; Lazaret runs no host command below it"
                ));
            }
        }
    }
    Err("no repository holds the working directory".into())
}

/// Where `git` (argv[0]) starts looking for its repository, workspace-
/// relative: `cwd` with each leading `-C DIR` applied, as git does (an
/// absolute DIR must lie in the workspace, whose path is the same inside
/// and on the host). Options that pick the repository some other way
/// (`--git-dir`, `--work-tree`, `--bare`) are refused: Lazaret pins it.
pub fn git_start_dir(argv: &[String], cwd: &Path, workspace: &Path) -> Result<PathBuf, String> {
    // Global options that take the next argument when not written `--opt=VALUE`.
    const WITH_VALUE: &[&str] = &["-C", "-c", "--namespace", "--config-env", "--super-prefix"];
    let mut dir = cwd.to_path_buf();
    let mut args = argv.iter().skip(1);
    while let Some(arg) = args.next() {
        let name = arg.split_once('=').map_or(arg.as_str(), |(n, _)| n);
        match name {
            "--git-dir" | "--work-tree" | "--bare" => {
                return Err(format!(
                    "`{name}` picks the repository itself; Lazaret runs git only in the repository that holds the working directory (drop it, or use --cwd)"
                ));
            }
            "-C" => {
                let Some(value) = args.next() else { return Ok(dir) };
                if value.is_empty() {
                    continue; // git ignores `-C ""`
                }
                let leaves = || format!("`-C {}` leaves the workspace", lazaret_protocol::display::escaped_str(value));
                let next = Path::new(value);
                dir = if next.is_absolute() {
                    let inside = next.strip_prefix(workspace).map_err(|_| leaves())?;
                    join_inside(Path::new(""), inside)
                } else {
                    join_inside(&dir, next)
                }
                .ok_or_else(leaves)?;
            }
            _ if WITH_VALUE.contains(&arg.as_str()) => {
                args.next();
            }
            _ if arg.starts_with('-') => {}
            _ => break, // the subcommand
        }
    }
    Ok(dir)
}

/// Whether `argv` runs git itself (`git`, or a path ending in `/git`): such
/// a command gets its repository pinned.
pub fn runs_git(argv: &[String]) -> bool {
    argv.first().is_some_and(|program| Path::new(program).file_name() == Some(OsStr::new("git")))
}

/// The environment that pins git to the repository whose work tree is
/// `worktree` (absolute): `GIT_DIR` is its `.git` (git reads a `gitdir:`
/// file there itself), `GIT_WORK_TREE` the work tree.
pub fn pinned_git_env(worktree: &Path) -> Vec<(String, String)> {
    vec![
        ("GIT_DIR".into(), worktree.join(".git").to_string_lossy().into_owned()),
        ("GIT_WORK_TREE".into(), worktree.to_string_lossy().into_owned()),
    ]
}

/// Configuration every host command's git gets (`GIT_CONFIG_COUNT`,
/// `GIT_CONFIG_KEY_n`, `GIT_CONFIG_VALUE_n`: command-line scope, above the
/// repository's own config, and passed on by git to the git it runs in a
/// submodule): git does not recurse into submodules by itself. Measured
/// with git 2.47: without them a `.gitmodules` entry the agent writes
/// (`fetchRecurseSubmodules = true`) makes a plain `git fetch` run git in
/// the agent's submodule; with them `git fetch` and `git pull` stay out.
/// They do not stop everything: a `.gitmodules` `ignore = none` overrides
/// `diff.ignoreSubmodules` for `git status` and `git diff`, and the
/// plumbing (`git diff-files`, `git describe --dirty`, `git add -u`) looks
/// into a populated submodule whatever the configuration; that is what
/// [`recursion_targets`] refuses. The environment is inherited, so a
/// program that runs git itself (a shell, `make`) gets the same.
pub const NO_SUBMODULE_RECURSION: &[(&str, &str)] = &[
    ("submodule.recurse", "false"),
    ("fetch.recurseSubmodules", "false"),
    ("push.recurseSubmodules", "no"),
    ("diff.ignoreSubmodules", "all"),
    ("diff.submodule", "short"),
    ("status.submoduleSummary", "false"),
];

/// [`NO_SUBMODULE_RECURSION`] as environment variables.
pub fn no_recursion_env() -> Vec<(String, String)> {
    let mut env = vec![("GIT_CONFIG_COUNT".to_string(), NO_SUBMODULE_RECURSION.len().to_string())];
    for (i, (key, value)) in NO_SUBMODULE_RECURSION.iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), key.to_string()));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), value.to_string()));
    }
    env
}

/// The first git entry among `entries` (workspace-relative: `.git`
/// directories and `gitdir:` files, submodule git directories under a
/// `.git/modules`, as `crate::git_trust::entries_beneath` finds them
/// below the directory a host command's git may recurse from) that is not
/// the developer's, as the reason to refuse. `own` is the repository's own
/// `.git` (already checked by [`protected_repository`]). An entry is the
/// developer's when it existed at this Domain's start (`at_start`) and no
/// Domain's agent made it (`untrusted`).
pub fn recursion_targets(
    entries: &BTreeSet<PathBuf>,
    own: Option<&Path>,
    at_start: &BTreeSet<PathBuf>,
    untrusted: &BTreeSet<PathBuf>,
) -> Result<(), String> {
    let foreign = entries.iter().filter(|e| Some(e.as_path()) != own).find(|e| !at_start.contains(*e) || untrusted.contains(*e));
    match foreign {
        None => Ok(()),
        Some(entry) => Err(format!(
            "git could enter the repository {} below the working directory (a submodule or nested repository), which an agent made{}: its git configuration is the agent's, so Lazaret runs no host command here while it exists (remove it, or run the command yourself)",
            lazaret_protocol::display::escaped(entry),
            if at_start.contains(entry) { " in an earlier run or another profile's Domain on this workspace" } else { " during this run" },
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(list: &[&str]) -> Vec<PathBuf> {
        list.iter().map(PathBuf::from).collect()
    }

    /// A workspace whose `.git` entries are `entries` (dir, kind).
    fn layout(entries: &'static [(&'static str, DotGitEntry)]) -> impl Fn(&Path) -> DotGitEntry {
        move |dir| entries.iter().find(|(d, _)| Path::new(d) == dir).map_or(DotGitEntry::Missing, |(_, k)| *k)
    }

    #[test]
    fn the_nearest_git_decides_and_must_be_protected() {
        let protected = paths(&[".git/config", ".git/hooks", "lib/.git", "old/.git/config"]);
        let ws = layout(&[
            ("", DotGitEntry::Directory),
            ("lib", DotGitEntry::File),
            ("old", DotGitEntry::Directory),
            ("new", DotGitEntry::Directory),
            ("link", DotGitEntry::Unusable),
        ]);
        assert_eq!(protected_repository(Path::new(""), &protected, &BTreeSet::new(), &ws), Ok(PathBuf::new()));
        assert_eq!(protected_repository(Path::new("src/deep"), &protected, &BTreeSet::new(), &ws), Ok(PathBuf::new()));
        assert_eq!(protected_repository(Path::new("lib/src"), &protected, &BTreeSet::new(), &ws), Ok(PathBuf::from("lib")));
        assert_eq!(protected_repository(Path::new("old"), &protected, &BTreeSet::new(), &ws), Ok(PathBuf::from("old")));
        let made = protected_repository(Path::new("new/src"), &protected, &BTreeSet::new(), &ws).expect_err("a repository made in the run");
        assert!(made.contains("new/.git") && made.contains("made during this run"), "{made}");
        assert!(protected_repository(Path::new("link/x"), &protected, &BTreeSet::new(), &ws).expect_err("symlink").contains("symlink"));
    }

    #[test]
    fn a_repository_an_agent_made_in_another_run_is_refused_though_protected() {
        let protected = paths(&[".git/config", "lib/.git", "old/.git/config"]);
        let ws = layout(&[("", DotGitEntry::Directory), ("lib", DotGitEntry::File), ("old", DotGitEntry::Directory)]);
        let untrusted: BTreeSet<PathBuf> = paths(&["old/.git", "lib/.git"]).into_iter().collect();
        for dir in ["old/src", "lib"] {
            let reason = protected_repository(Path::new(dir), &protected, &untrusted, &ws).expect_err("made by an agent");
            assert!(reason.contains("another profile"), "{reason}");
        }
        assert_eq!(protected_repository(Path::new("src"), &protected, &untrusted, &ws), Ok(PathBuf::new()));
    }

    #[test]
    fn git_may_recurse_only_into_repositories_of_the_developer() {
        let set = |l: &[&str]| l.iter().map(PathBuf::from).collect::<BTreeSet<PathBuf>>();
        let at_start = set(&[".git", "lib/.git", ".git/modules/lib"]);
        let own = Some(Path::new(".git"));
        assert_eq!(recursion_targets(&set(&[".git", "lib/.git", ".git/modules/lib"]), own, &at_start, &BTreeSet::new()), Ok(()));
        let made =
            recursion_targets(&set(&[".git", "lib/.git", "sub/.git"]), own, &at_start, &BTreeSet::new()).expect_err("made in the run");
        assert!(made.contains("sub/.git") && made.contains("during this run"), "{made}");
        let module = recursion_targets(&set(&[".git", ".git/modules/evil"]), own, &at_start, &BTreeSet::new())
            .expect_err("a module gitdir made in the run");
        assert!(module.contains(".git/modules/evil"), "{module}");
        let other = recursion_targets(&set(&[".git", "lib/.git"]), own, &at_start, &set(&["lib/.git"]))
            .expect_err("made by another Domain's agent");
        assert!(other.contains("another profile"), "{other}");
        // The repository's own entry is judged by protected_repository.
        assert_eq!(recursion_targets(&set(&["made/.git"]), Some(Path::new("made/.git")), &at_start, &BTreeSet::new()), Ok(()));
    }

    #[test]
    fn the_recursion_settings_reach_git_as_command_line_configuration() {
        let env = no_recursion_env();
        assert_eq!(env[0], ("GIT_CONFIG_COUNT".to_string(), NO_SUBMODULE_RECURSION.len().to_string()));
        assert_eq!(env.len(), 1 + 2 * NO_SUBMODULE_RECURSION.len());
        assert!(env.contains(&("GIT_CONFIG_KEY_1".to_string(), "fetch.recurseSubmodules".to_string())));
        assert!(env.contains(&("GIT_CONFIG_VALUE_1".to_string(), "false".to_string())));
    }

    #[test]
    fn an_unprotected_git_file_or_a_workspace_without_one_is_refused() {
        let ws = layout(&[("", DotGitEntry::Directory), ("wt", DotGitEntry::File)]);
        assert!(
            protected_repository(Path::new("wt"), &paths(&[".git/config"]), &BTreeSet::new(), &ws).is_err(),
            "a gitdir file made in the run"
        );
        assert!(protected_repository(Path::new("a"), &[], &BTreeSet::new(), layout(&[])).is_err());
    }

    #[test]
    fn git_starts_where_its_dash_c_options_lead_and_never_picks_its_own_repository() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ws = Path::new("/home/d/p");
        let start = |a: &[&str], cwd: &str| git_start_dir(&argv(a), Path::new(cwd), ws);
        assert_eq!(start(&["git", "fetch"], "src"), Ok(PathBuf::from("src")));
        assert_eq!(start(&["git", "-C", "made", "push"], ""), Ok(PathBuf::from("made")));
        assert_eq!(start(&["git", "-C", "a", "-C", "../b", "-c", "x.y=z", "--no-pager", "status"], "src"), Ok(PathBuf::from("src/b")));
        assert_eq!(start(&["git", "-C", "/home/d/p/lib", "status"], "src"), Ok(PathBuf::from("lib")));
        assert_eq!(start(&["git", "-C", "", "status"], "src"), Ok(PathBuf::from("src")));
        assert_eq!(start(&["git", "status", "-C", "x"], "src"), Ok(PathBuf::from("src")), "after the subcommand, -C is the subcommand's");
        assert!(start(&["git", "-C", "/etc", "status"], "").is_err());
        assert!(start(&["git", "-C", "../..", "status"], "src").is_err());
        for picks in [
            &["git", "--git-dir=made/.git", "fetch"][..],
            &["git", "--git-dir", "made/.git", "fetch"],
            &["git", "--work-tree=x", "status"],
            &["git", "--bare", "fetch"],
        ] {
            assert!(start(picks, "").expect_err("refused").contains("Lazaret runs git only"), "{picks:?}");
        }
    }

    #[test]
    fn only_git_itself_is_pinned() {
        let argv = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(runs_git(&argv(&["git", "fetch"])));
        assert!(runs_git(&argv(&["/usr/bin/git", "push"])));
        assert!(!runs_git(&argv(&["gitk"])));
        assert!(!runs_git(&argv(&["sh", "-c", "git fetch"])));
        assert!(!runs_git(&[]));
        assert_eq!(
            pinned_git_env(Path::new("/home/d/p/lib")),
            [("GIT_DIR".to_string(), "/home/d/p/lib/.git".to_string()), ("GIT_WORK_TREE".to_string(), "/home/d/p/lib".to_string())]
        );
    }
}
