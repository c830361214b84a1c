//! Which workspace paths are git control files, decided from the path alone
//! (pure logic). A path is only a candidate: the caller confirms that the
//! directory named as its git dir really is one ([`looks_like_git_dir`]'s
//! rule, applied on disk), because a path alone cannot tell
//! `.git/modules/a/b/config` (module `a/b`) from a ref named `config`.
//!
//! What a git directory is and which of its files matter is the model's
//! ([`super::git_model`]); this module only reads paths: the parent as git
//! dir (`config`, `config.worktree`, `commondir`, `gitdir`, `hooks`,
//! `info`), the grandparent (`hooks/<x>` but `*.sample`, `info/attributes`,
//! the operation files `rebase-merge/…`, `rebase-apply/…`, `sequencer/…`)
//! and the great-grandparent (`objects/info/alternates`,
//! `objects/info/http-alternates`).

use std::ffi::OsStr;
use std::path::{Component, Path, PathBuf};

use super::git_model;

pub use super::git_model::{ControlFile, OperationFile};

/// One candidate reading of a path as a control file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The git directory it would belong to (same base as the input path).
    pub git_dir: PathBuf,
    /// What it would be.
    pub kind: ControlFile,
}

/// The ways `rel` can be a control file of some git directory: the parent
/// as git dir (`config`, `config.worktree`, `commondir`, `gitdir`, `hooks`,
/// `info`) and the grandparent (`hooks/<x>`, `info/attributes`).
pub fn control_candidates(rel: &Path) -> Vec<Candidate> {
    let names: Vec<&OsStr> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(name) => Some(name),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    let Some((last, parents)) = names.split_last() else { return out };
    let parent: PathBuf = parents.iter().collect();
    let last = last.as_encoded_bytes();
    let kind = match last {
        b"config" => Some(ControlFile::Config),
        b"config.worktree" => Some(ControlFile::ConfigWorktree),
        b"commondir" => Some(ControlFile::Commondir),
        b"gitdir" => Some(ControlFile::Gitdir),
        b"hooks" => Some(ControlFile::HooksDir),
        b"info" => Some(ControlFile::InfoDir),
        b"remotes" | b"branches" => Some(ControlFile::RemotesDir),
        _ => None,
    };
    if let Some(kind) = kind {
        out.push(Candidate { git_dir: parent, kind });
    }
    if let Some((dir, grandparents)) = parents.split_last() {
        let git_dir: PathBuf = grandparents.iter().collect();
        match dir.as_encoded_bytes() {
            b"hooks" if !hook_is_inert(last) => out.push(Candidate { git_dir: git_dir.clone(), kind: ControlFile::Hook }),
            b"info" if last == b"attributes" => out.push(Candidate { git_dir: git_dir.clone(), kind: ControlFile::InfoAttributes }),
            b"remotes" | b"branches" => out.push(Candidate { git_dir: git_dir.clone(), kind: ControlFile::RemoteFile }),
            _ => {}
        }
        for (state_dir, file, kind) in git_model::OPERATION_FILES {
            if dir.as_encoded_bytes() == state_dir.as_bytes() && last == file.as_bytes() {
                out.push(Candidate { git_dir: git_dir.clone(), kind: ControlFile::OperationState(*kind) });
            }
        }
        if let Some((objects, rest)) = grandparents.split_last() {
            if objects.as_encoded_bytes() == b"objects" && dir.as_encoded_bytes() == b"info" {
                let git_dir: PathBuf = rest.iter().collect();
                match last {
                    b"alternates" => out.push(Candidate { git_dir, kind: ControlFile::Alternates }),
                    b"http-alternates" => out.push(Candidate { git_dir, kind: ControlFile::HttpAlternates }),
                    _ => {}
                }
            }
        }
    }
    out
}

/// A rebase todo list with its `exec` steps turned into comments
/// ([`git_model::disable_exec_steps`]).
pub fn disable_rebase_exec(todo: &[u8]) -> Option<(Vec<u8>, Vec<String>)> {
    git_model::disable_exec_steps(todo)
}

/// Whether a hook file name is one git never runs (`*.sample`, as `git
/// init` writes them).
pub fn hook_is_inert(name: &[u8]) -> bool {
    name.ends_with(b".sample")
}

/// Whether the last component of `rel` is `.git` (a repository appears).
pub fn is_dot_git(rel: &Path) -> bool {
    rel.file_name().is_some_and(|n| n == ".git")
}

/// Whether `rel` is one of `protected` (Git Sentry's read-only paths) or
/// below one.
pub fn is_protected(rel: &Path, protected: &[PathBuf]) -> bool {
    protected.iter().any(|p| rel.starts_with(p))
}

/// Whether a `commondir` file in `git_dir` with contents `value` is the
/// ordinary one of a linked worktree: `git_dir` is `<common>/worktrees/<name>`
/// and the value leads (lexically) to `<common>`. Any other commondir
/// would redirect git to a configuration and hooks of the agent's choosing.
pub fn commondir_ok(git_dir: &Path, value: &str) -> bool {
    let value = value.trim_end_matches(['\n', '\r']);
    let Some(worktrees) = git_dir.parent() else { return false };
    if worktrees.file_name() != Some(OsStr::new("worktrees")) {
        return false;
    }
    let Some(common) = worktrees.parent() else { return false };
    if value.is_empty() || Path::new(value).is_absolute() {
        return false;
    }
    git_model::join_inside(git_dir, Path::new(value)).as_deref() == Some(common)
}

/// Whether a linked worktree's `gitdir` back-link (contents `value`) has
/// the form `git worktree add` writes: one absolute, normal path to a
/// `.git` entry.
pub fn back_link_ok(value: &str) -> bool {
    let value = value.strip_suffix('\n').unwrap_or(value);
    let path = Path::new(value);
    path.is_absolute()
        && !value.contains(['\n', '\r', '\0'])
        && path.file_name() == Some(OsStr::new(".git"))
        && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(rel: &str) -> Vec<(String, ControlFile)> {
        control_candidates(Path::new(rel)).into_iter().map(|c| (c.git_dir.to_string_lossy().into_owned(), c.kind)).collect()
    }

    #[test]
    fn candidates() {
        assert_eq!(kinds(".git/config"), vec![(".git".into(), ControlFile::Config)]);
        assert_eq!(kinds("a/.git/hooks/pre-commit"), vec![("a/.git".into(), ControlFile::Hook)]);
        assert!(kinds("a/.git/hooks/pre-commit.sample").is_empty());
        assert_eq!(kinds(".git/modules/x/y/info/attributes"), vec![(".git/modules/x/y".into(), ControlFile::InfoAttributes)]);
        assert_eq!(kinds(".git/worktrees/w/commondir"), vec![(".git/worktrees/w".into(), ControlFile::Commondir)]);
        assert_eq!(kinds("bare/hooks"), vec![("bare".into(), ControlFile::HooksDir)]);
        assert_eq!(kinds("a/.git/branches/origin"), vec![("a/.git".into(), ControlFile::RemoteFile)]);
        assert_eq!(kinds("a/.git/remotes"), vec![("a/.git".into(), ControlFile::RemotesDir)]);
        assert_eq!(kinds("config"), vec![("".into(), ControlFile::Config)], "the root itself may be a git dir");
        // A hook named `config` is both a hook of x and the config of x/hooks.
        assert_eq!(kinds("x/hooks/config"), vec![("x/hooks".into(), ControlFile::Config), ("x".into(), ControlFile::Hook)]);
        assert!(kinds("src/main.rs").is_empty());
        assert!(kinds(".git/refs/heads/main").is_empty());
        assert!(kinds("").is_empty());
    }

    #[test]
    fn commondir_rules() {
        assert!(commondir_ok(Path::new(".git/worktrees/w"), "../..\n"));
        assert!(commondir_ok(Path::new("sub/.git/worktrees/w"), "../../"));
        assert!(!commondir_ok(Path::new(".git"), "../elsewhere"), "a main gitdir has no commondir");
        assert!(!commondir_ok(Path::new(".git/worktrees/w"), "../../../evil/.git"));
        assert!(!commondir_ok(Path::new(".git/worktrees/w"), "/ws/.git"), "absolute values are not git's own");
        assert!(!commondir_ok(Path::new(".git/modules/m"), "../.."));
    }

    #[test]
    fn rebase_exec_steps_are_commented_out_and_named() {
        assert_eq!(kinds(".git/rebase-merge/git-rebase-todo"), vec![(".git".into(), ControlFile::OperationState(OperationFile::Todo))]);
        assert_eq!(
            kinds(".git/worktrees/w/rebase-merge/git-rebase-todo"),
            vec![(".git/worktrees/w".into(), ControlFile::OperationState(OperationFile::Todo))]
        );
        assert!(kinds(".git/rebase-merge/done").is_empty());
        let todo = b"pick 1234 one\n  exec make test\nx touch /tmp/p\n# exec in a comment\nexecute-not 1\npick 5678 two";
        let (text, commands) = disable_rebase_exec(todo).expect("exec steps");
        assert_eq!(commands, ["make test", "touch /tmp/p"]);
        let text = String::from_utf8(text).expect("utf8");
        assert_eq!(
            text,
            "pick 1234 one\n# disabled by Lazaret (an exec step the sandbox left):   exec make test\n# disabled by Lazaret (an exec step the sandbox left): x touch /tmp/p\n# exec in a comment\nexecute-not 1\npick 5678 two"
        );
        assert_eq!(disable_rebase_exec(b"pick 1 a\n# x b\n"), None);
    }

    #[test]
    fn back_links_of_the_form_git_writes() {
        assert!(back_link_ok("/home/d/src/wt/.git\n"));
        assert!(back_link_ok("/home/d/src/wt/.git"));
        assert!(!back_link_ok("/home/d/.bashrc\n"));
        assert!(!back_link_ok("wt/.git\n"), "relative");
        assert!(!back_link_ok("/home/d/../x/.git"), "not normal");
        assert!(!back_link_ok("/a/.git\n/b/.git\n"), "two lines");
        assert!(!back_link_ok(""));
    }

    #[test]
    fn protection_and_names() {
        let protected = vec![PathBuf::from(".git/config"), PathBuf::from(".git/hooks")];
        assert!(is_protected(Path::new(".git/hooks/pre-commit"), &protected));
        assert!(!is_protected(Path::new(".git/config.worktree"), &protected));
        assert!(is_dot_git(Path::new("a/b/.git")));
        assert!(!is_dot_git(Path::new("a/.gitx")));
    }
}
