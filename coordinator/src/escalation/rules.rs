//! Auto-approval rules and the approvals held for a Domain's life: which
//! escalation requests run without asking the developer.
//!
//! Matching is deliberately dumb: the request's argument vector is compared
//! element by element, byte for byte, with a rule's `command` (no globbing,
//! no prefix matching unless the rule says `allow_extra_args`, no case
//! folding, no Unicode normalisation, no path resolution of the program).
//! Anything a rule does not approve exactly goes to the developer. The
//! agent controls every byte of a request, so any cleverness here would be
//! an approval the developer did not write.
//!
//! The working directory is compared as a workspace-relative path: `.` for
//! the workspace root, otherwise its components joined with `/`
//! ([`workspace_relative`]). The caller passes the directory the command
//! would really run in, relative to the workspace root, after resolving
//! symlinks on the host; a lexically equal path through a symlink is not the
//! same directory.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Serialize, Serializer};

/// The `PATH` of every host command: fixed, never the agent's nor the
/// launching shell's, so a bare program name in a rule always means the same
/// host program.
pub const HOST_COMMAND_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Variables every host command gets without a rule naming them: `PATH`
/// ([`HOST_COMMAND_PATH`]), `HOME`, `USER`, `LOGNAME` and `SHELL` of the
/// developer, and [`LAUNCHING_SESSION_ENV`]. A rule's `env` may not name
/// them.
pub const ALWAYS_GIVEN_ENV: &[&str] =
    &["PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "SSH_AUTH_SOCK"];

/// The variables of [`ALWAYS_GIVEN_ENV`] taken from the launching
/// `lazaret run`'s environment (sent in its Hello's `host_env`), when set
/// there: the ssh-agent socket for `git push` over ssh, and the locale.
pub const LAUNCHING_SESSION_ENV: &[&str] = &["SSH_AUTH_SOCK", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES"];

/// Prefixes of variable names a rule may not pass, with the reason.
const REFUSED_PREFIXES: &[(&str, &str)] = &[
    ("LD_", "it changes which libraries the dynamic loader loads into the host program"),
    (
        "GIT_",
        "it changes which repository, configuration or helper programs git uses (only GIT_AUTHOR_NAME, GIT_AUTHOR_EMAIL, GIT_COMMITTER_NAME and GIT_COMMITTER_EMAIL may be passed)",
    ),
    ("LAZARET_", "the LAZARET_ prefix is reserved for Lazaret"),
];

/// `GIT_` variables that only name the author or committer.
const ALLOWED_GIT: &[&str] = &["GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL"];

const LOADER: &str = "it changes what the C library loads into the host program";
const SHELL_STARTUP: &str = "it makes a shell run code at start-up or while tracing";
const NAMES_A_PROGRAM: &str = "it names a program that the host command may run";
const INTERPRETER: &str = "it changes which code an interpreter loads or runs";

/// Single variable names a rule may not pass, with the reason.
const REFUSED_NAMES: &[(&str, &str)] = &[
    ("GLIBC_TUNABLES", LOADER),
    ("GCONV_PATH", LOADER),
    ("LOCPATH", LOADER),
    ("NLSPATH", LOADER),
    ("BASH_ENV", SHELL_STARTUP),
    ("ENV", SHELL_STARTUP),
    ("SHELLOPTS", SHELL_STARTUP),
    ("BASHOPTS", SHELL_STARTUP),
    ("PS4", SHELL_STARTUP),
    ("PROMPT_COMMAND", SHELL_STARTUP),
    ("EDITOR", NAMES_A_PROGRAM),
    ("VISUAL", NAMES_A_PROGRAM),
    ("PAGER", NAMES_A_PROGRAM),
    ("MANPAGER", NAMES_A_PROGRAM),
    ("LESSOPEN", NAMES_A_PROGRAM),
    ("LESSCLOSE", NAMES_A_PROGRAM),
    ("SSH_ASKPASS", NAMES_A_PROGRAM),
    ("SUDO_ASKPASS", NAMES_A_PROGRAM),
    ("PYTHONPATH", INTERPRETER),
    ("PYTHONHOME", INTERPRETER),
    ("PYTHONSTARTUP", INTERPRETER),
    ("PERL5LIB", INTERPRETER),
    ("PERLLIB", INTERPRETER),
    ("PERL5OPT", INTERPRETER),
    ("RUBYLIB", INTERPRETER),
    ("RUBYOPT", INTERPRETER),
    ("NODE_OPTIONS", INTERPRETER),
    ("NODE_PATH", INTERPRETER),
    ("JAVA_TOOL_OPTIONS", INTERPRETER),
    ("_JAVA_OPTIONS", INTERPRETER),
    ("JDK_JAVA_OPTIONS", INTERPRETER),
];

/// Why a rule's `env` may not name `name`, or `None` when it may.
///
/// Refused: what Lazaret always sets itself ([`ALWAYS_GIVEN_ENV`]), and a
/// small deny-list of variables that change what a host program loads or
/// runs: `LD_*`, `GLIBC_TUNABLES`, `GCONV_PATH`, `LOCPATH`, `NLSPATH`;
/// `GIT_*` except the author and committer names and e-mails; shell start-up
/// (`BASH_ENV`, `ENV`, `SHELLOPTS`, `BASHOPTS`, `PS4`, `PROMPT_COMMAND`);
/// variables naming programs (`EDITOR`, `VISUAL`, `PAGER`, `MANPAGER`,
/// `LESSOPEN`, `LESSCLOSE`, `SSH_ASKPASS`, `SUDO_ASKPASS`); interpreter
/// search paths and options (`PYTHONPATH`, `PYTHONHOME`, `PYTHONSTARTUP`,
/// `PERL5LIB`, `PERLLIB`, `PERL5OPT`, `RUBYLIB`, `RUBYOPT`, `NODE_OPTIONS`,
/// `NODE_PATH`, `JAVA_TOOL_OPTIONS`, `_JAVA_OPTIONS`, `JDK_JAVA_OPTIONS`);
/// and the reserved `LAZARET_*`.
pub fn refused_env(name: &str) -> Option<String> {
    if ALWAYS_GIVEN_ENV.contains(&name) {
        return Some(if name == "PATH" {
            format!("Lazaret always sets PATH={HOST_COMMAND_PATH} for host commands, never another value")
        } else {
            format!("Lazaret always gives {name} to host commands; a rule need not name it")
        });
    }
    if ALLOWED_GIT.contains(&name) {
        return None;
    }
    if let Some((_, reason)) = REFUSED_NAMES.iter().find(|(refused, _)| *refused == name) {
        return Some(format!("{name} is refused: {reason}"));
    }
    REFUSED_PREFIXES.iter().find(|(prefix, _)| name.starts_with(prefix)).map(|(_, reason)| format!("{name} is refused: {reason}"))
}

/// One auto-approval rule (`[[escalation.rules]]`): requests whose argument
/// vector and working directory it matches run without asking.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rule {
    /// Unique name in the profile's effective rule set (shown in the
    /// journal as the approver).
    pub name: String,
    /// The complete argument vector approved; element 0 is the program, a
    /// bare name (looked up on [`HOST_COMMAND_PATH`]) or an absolute path.
    pub command: Vec<String>,
    /// When true, `command` need only be a prefix of the request's argv.
    pub allow_extra_args: bool,
    /// The workspace-relative directory the request must run in (`.` is
    /// the workspace root); `None`: any directory in the workspace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The longest the command may run; `None`: the settings' default.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "optional_seconds")]
    pub timeout: Option<Duration>,
    /// Further variables passed from the launching session's environment,
    /// beyond [`ALWAYS_GIVEN_ENV`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Where the rule was written, `FILE:LINE:COLUMN`.
    #[serde(skip)]
    pub origin: String,
}

impl Rule {
    /// Whether this rule approves `argv` run in `cwd_rel` (workspace-relative,
    /// see the module documentation). A rule with an empty `command`, and a
    /// `cwd_rel` that is absolute or contains `..`, never match.
    pub fn matches(&self, argv: &[String], cwd_rel: &Path) -> bool {
        let Some(cwd) = canonical_relative(cwd_rel) else {
            return false;
        };
        self.matches_canonical(argv, &cwd)
    }

    fn matches_canonical(&self, argv: &[String], cwd: &Path) -> bool {
        if self.command.is_empty() {
            return false;
        }
        let argv_ok = if self.allow_extra_args { argv.starts_with(&self.command) } else { argv == self.command.as_slice() };
        let cwd_ok = match &self.cwd {
            None => true,
            Some(required) => canonical_relative(required).is_some_and(|required| required == cwd),
        };
        argv_ok && cwd_ok
    }
}

/// The first rule, in order, that approves `argv` in `cwd_rel`; `None` when
/// none does (then the developer is asked).
///
/// Order is the configuration's: the global `[[escalation.rules]]` in file
/// order, then the profile's. It decides which rule's `timeout` and `env`
/// apply when several match.
pub fn matching_rule<'r>(rules: &'r [Rule], argv: &[String], cwd_rel: &Path) -> Option<&'r Rule> {
    let cwd = canonical_relative(cwd_rel)?;
    rules.iter().find(|rule| rule.matches_canonical(argv, &cwd))
}

/// What is wrong with a workspace-relative directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RelativeDirProblem {
    /// The empty string.
    #[error("is empty")]
    Empty,
    /// It starts with `/`.
    #[error("is an absolute path")]
    Absolute,
    /// A component is `..`.
    #[error("contains `..`")]
    DotDot,
}

/// `text` as a normalised workspace-relative directory: `.` for the
/// workspace root, otherwise its components joined with `/` (`./a//b/`
/// becomes `a/b`).
pub fn workspace_relative(text: &str) -> Result<PathBuf, RelativeDirProblem> {
    if text.is_empty() {
        return Err(RelativeDirProblem::Empty);
    }
    if text.starts_with('/') {
        return Err(RelativeDirProblem::Absolute);
    }
    if text.split('/').any(|part| part == "..") {
        return Err(RelativeDirProblem::DotDot);
    }
    canonical_relative(Path::new(text)).ok_or(RelativeDirProblem::DotDot)
}

/// The normal form of a relative path (`.` for none), or `None` if it is
/// absolute or climbs out with `..`.
fn canonical_relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Some(out)
}

/// The argument vectors the developer approved "for the rest of this
/// Domain's life", each with its working directory. Held in memory only:
/// never written to the configuration, gone when the Domain stops.
#[derive(Debug, Clone, Default)]
pub struct DomainApprovals {
    approved: HashSet<(Vec<String>, PathBuf)>,
}

impl DomainApprovals {
    /// No approvals.
    pub fn new() -> Self {
        Self::default()
    }

    /// Approves exactly `argv` in exactly `cwd_rel` from now on. Returns
    /// false, recording nothing, for an empty argv or a `cwd_rel` that is
    /// absolute or contains `..`.
    pub fn approve(&mut self, argv: &[String], cwd_rel: &Path) -> bool {
        match canonical_relative(cwd_rel) {
            Some(cwd) if !argv.is_empty() => {
                self.approved.insert((argv.to_vec(), cwd));
                true
            }
            _ => false,
        }
    }

    /// Whether exactly `argv` in `cwd_rel` was approved (byte-exact, no
    /// extra arguments, the same directory).
    pub fn is_approved(&self, argv: &[String], cwd_rel: &Path) -> bool {
        canonical_relative(cwd_rel).is_some_and(|cwd| self.approved.contains(&(argv.to_vec(), cwd)))
    }

    /// How many distinct approvals there are.
    pub fn len(&self) -> usize {
        self.approved.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.approved.is_empty()
    }
}

/// A duration as whole seconds (how the configuration writes them).
pub(crate) fn seconds<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_u64(duration.as_secs())
}

/// An optional duration as whole seconds.
pub(crate) fn optional_seconds<S: Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
    match duration {
        Some(duration) => seconds(duration, serializer),
        None => serializer.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn rule(name: &str, command: &[&str]) -> Rule {
        Rule {
            name: name.into(),
            command: argv(command),
            allow_extra_args: false,
            cwd: None,
            timeout: None,
            env: Vec::new(),
            origin: String::new(),
        }
    }

    fn root() -> &'static Path {
        Path::new(".")
    }

    fn name_of(found: Option<&Rule>) -> Option<&str> {
        found.map(|r| r.name.as_str())
    }

    #[test]
    fn the_exact_argv_matches() {
        let rules = [rule("fetch", &["git", "fetch"])];
        assert_eq!(name_of(matching_rule(&rules, &argv(&["git", "fetch"]), root())), Some("fetch"));
    }

    #[test]
    fn one_extra_argument_matches_only_when_allowed() {
        let mut rules = [rule("fetch", &["git", "fetch"])];
        let longer = argv(&["git", "fetch", "--upload-pack=evil"]);
        assert_eq!(matching_rule(&rules, &longer, root()), None);
        rules[0].allow_extra_args = true;
        assert_eq!(name_of(matching_rule(&rules, &longer, root())), Some("fetch"));
        // A prefix of the rule is never enough, extra arguments or not.
        assert_eq!(matching_rule(&rules, &argv(&["git"]), root()), None);
    }

    #[test]
    fn a_differing_or_reordered_argument_does_not_match() {
        let mut rules = [rule("push", &["git", "push", "origin"])];
        rules[0].allow_extra_args = true;
        for other in [
            &["git", "push", "upstream"][..],
            &["git", "origin", "push"],
            &["git", "push", "Origin"],
            &["git", "push", "origin "],
            &["git", "push", "./origin"],
            &["/usr/bin/git", "push", "origin"],
            &["git", "push", "--", "origin"],
        ] {
            assert_eq!(matching_rule(&rules, &argv(other), root()), None, "{other:?}");
        }
    }

    #[test]
    fn an_empty_argument_is_an_argument() {
        let rules = [rule("status", &["git", "status"])];
        assert_eq!(matching_rule(&rules, &argv(&["git", "status", ""]), root()), None);
        assert_eq!(matching_rule(&rules, &argv(&["git", ""]), root()), None);
        assert_eq!(matching_rule(&rules, &argv(&["git"]), root()), None);
        assert_eq!(matching_rule(&rules, &[], root()), None);
    }

    #[test]
    fn unicode_look_alikes_are_different_arguments() {
        let rules = [rule("push", &["git", "push", "origin"])];
        for look_alike in [
            "\u{043e}rigin",  // Cyrillic о
            "origin\u{200b}", // zero-width space
            "ori\u{0301}gin", // combining accent
            "ｏrigin",        // fullwidth o
            "origin\u{202e}", // right-to-left override
        ] {
            assert_eq!(matching_rule(&rules, &argv(&["git", "push", look_alike]), root()), None, "{look_alike:?}");
        }
        // Precomposed and decomposed forms are not unified either.
        let accented = [rule("e", &["echo", "\u{e9}"])];
        assert_eq!(matching_rule(&accented, &argv(&["echo", "e\u{301}"]), root()), None);
        assert_eq!(name_of(matching_rule(&accented, &argv(&["echo", "\u{e9}"]), root())), Some("e"));
    }

    #[test]
    fn an_empty_rule_never_matches() {
        let mut empty = rule("nothing", &[]);
        empty.allow_extra_args = true;
        assert_eq!(matching_rule(&[empty], &argv(&["rm", "-rf", "/"]), root()), None);
    }

    #[test]
    fn the_cwd_constraint_is_exact() {
        let mut test = rule("test", &["make", "test"]);
        test.cwd = Some(PathBuf::from("."));
        let mut front = rule("front", &["npm", "test"]);
        front.cwd = Some(PathBuf::from("frontend"));
        let rules = [test, front];
        let make = argv(&["make", "test"]);
        for root_form in [".", "./", "", "./."] {
            assert_eq!(name_of(matching_rule(&rules, &make, Path::new(root_form))), Some("test"), "{root_form:?}");
        }
        assert_eq!(matching_rule(&rules, &make, Path::new("frontend")), None);
        let npm = argv(&["npm", "test"]);
        assert_eq!(name_of(matching_rule(&rules, &npm, Path::new("frontend"))), Some("front"));
        assert_eq!(name_of(matching_rule(&rules, &npm, Path::new("./frontend/"))), Some("front"));
        assert_eq!(matching_rule(&rules, &npm, Path::new("frontend/src")), None);
        assert_eq!(matching_rule(&rules, &npm, root()), None);
        assert_eq!(matching_rule(&rules, &npm, Path::new("Frontend")), None);
        assert_eq!(matching_rule(&rules, &npm, Path::new("src/../frontend")), None);
    }

    #[test]
    fn a_cwd_outside_the_workspace_matches_nothing() {
        let rules = [rule("any", &["true"])];
        assert_eq!(name_of(matching_rule(&rules, &argv(&["true"]), Path::new("a/b"))), Some("any"));
        for outside in ["/", "/etc", "..", "a/../../b"] {
            assert_eq!(matching_rule(&rules, &argv(&["true"]), Path::new(outside)), None, "{outside:?}");
        }
    }

    #[test]
    fn the_first_matching_rule_wins() {
        let mut broad = rule("broad", &["git"]);
        broad.allow_extra_args = true;
        let exact = rule("exact", &["git", "fetch"]);
        let both = [broad.clone(), exact.clone()];
        assert_eq!(name_of(matching_rule(&both, &argv(&["git", "fetch"]), root())), Some("broad"));
        let reversed = [exact, broad];
        assert_eq!(name_of(matching_rule(&reversed, &argv(&["git", "fetch"]), root())), Some("exact"));
        assert_eq!(name_of(matching_rule(&reversed, &argv(&["git", "log"]), root())), Some("broad"));
    }

    #[test]
    fn domain_approvals_are_exact() {
        let mut approvals = DomainApprovals::new();
        let push = argv(&["git", "push", "origin", "fix-123"]);
        assert!(!approvals.is_approved(&push, root()));
        assert!(approvals.approve(&push, Path::new("./")));
        assert!(approvals.is_approved(&push, root()));
        assert!(approvals.is_approved(&push, Path::new("")));
        assert!(!approvals.is_approved(&push, Path::new("sub")));
        assert!(!approvals.is_approved(&argv(&["git", "push", "origin"]), root()));
        assert!(!approvals.is_approved(&argv(&["git", "push", "origin", "fix-123", "--force"]), root()));
        assert!(!approvals.is_approved(&argv(&["git", "push", "origin", "fix-124"]), root()));
        assert!(approvals.approve(&push, root()));
        assert_eq!(approvals.len(), 1);
        assert!(!approvals.approve(&[], root()));
        assert!(!approvals.approve(&push, Path::new("/etc")));
        assert!(!approvals.approve(&push, Path::new("../x")));
        assert_eq!(approvals.len(), 1);
    }

    #[test]
    fn workspace_relative_directories_are_normalised() {
        assert_eq!(workspace_relative("."), Ok(PathBuf::from(".")));
        assert_eq!(workspace_relative("./"), Ok(PathBuf::from(".")));
        assert_eq!(workspace_relative("./a//b/"), Ok(PathBuf::from("a/b")));
        assert_eq!(workspace_relative("a/./b"), Ok(PathBuf::from("a/b")));
        assert_eq!(workspace_relative(""), Err(RelativeDirProblem::Empty));
        assert_eq!(workspace_relative("/srv"), Err(RelativeDirProblem::Absolute));
        assert_eq!(workspace_relative(".."), Err(RelativeDirProblem::DotDot));
        assert_eq!(workspace_relative("a/../b"), Err(RelativeDirProblem::DotDot));
        assert_eq!(workspace_relative("a/.."), Err(RelativeDirProblem::DotDot));
        assert_eq!(workspace_relative("...").ok(), Some(PathBuf::from("...")));
    }

    #[test]
    fn refused_variables() {
        for refused in [
            "PATH",
            "HOME",
            "SSH_AUTH_SOCK",
            "LC_ALL",
            "LD_PRELOAD",
            "LD_LIBRARY_PATH",
            "LD_AUDIT",
            "GIT_DIR",
            "GIT_CONFIG",
            "GIT_CONFIG_GLOBAL",
            "GIT_SSH_COMMAND",
            "GIT_EXEC_PATH",
            "BASH_ENV",
            "PYTHONPATH",
            "NODE_OPTIONS",
            "EDITOR",
            "LAZARET_X",
            "GLIBC_TUNABLES",
        ] {
            assert!(refused_env(refused).is_some(), "{refused}");
        }
        for allowed in ["GIT_AUTHOR_NAME", "GIT_COMMITTER_EMAIL", "AWS_PROFILE", "GH_TOKEN", "LC_TIME", "LDFLAGS", "TERM"] {
            assert_eq!(refused_env(allowed), None, "{allowed}");
        }
        assert!(refused_env("PATH").is_some_and(|reason| reason.contains(HOST_COMMAND_PATH)));
    }

    #[test]
    fn rules_serialise_with_seconds_and_without_empty_fields() {
        let mut with_all = rule("t", &["make", "test"]);
        with_all.cwd = Some(PathBuf::from("."));
        with_all.timeout = Some(Duration::from_secs(90));
        with_all.env = vec!["GH_TOKEN".into()];
        let json = serde_json::to_value(&with_all).unwrap_or_default();
        assert_eq!(json["timeout"], 90);
        assert_eq!(json["cwd"], ".");
        assert_eq!(json["env"][0], "GH_TOKEN");
        let json = serde_json::to_value(rule("t", &["true"])).unwrap_or_default();
        let keys: Vec<&String> = json.as_object().map(|o| o.keys().collect()).unwrap_or_default();
        assert_eq!(keys, ["allow_extra_args", "command", "name"]);
    }
}
