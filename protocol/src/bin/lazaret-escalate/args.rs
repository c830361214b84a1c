//! The command line, parsed by hand to keep the binary small.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use lazaret_protocol::escalation::MAX_TIMEOUT_SECS;

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// Run `argv` on the host.
    Run(Invocation),
    /// `--help`.
    Help,
    /// `--version`.
    Version,
}

/// An escalation as the command line gives it.
#[derive(Debug, PartialEq, Eq)]
pub struct Invocation {
    /// `--justification`, empty when not given.
    pub justification: String,
    /// `--timeout`.
    pub timeout_secs: Option<u64>,
    /// `--cwd` as given (resolved later by [`resolve_cwd`]).
    pub cwd: Option<String>,
    /// The command and its arguments.
    pub argv: Vec<String>,
}

/// A usage error, shown as `lazaret-escalate: MESSAGE` on one line.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

fn usage(message: impl Into<String>) -> UsageError {
    UsageError(message.into())
}

/// Parses the arguments after the program name. Options come before `--`
/// or before the first word that is not an option; everything from there on
/// is the command, passed on unchanged.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Parsed, UsageError> {
    let mut words = Vec::new();
    for (i, arg) in args.into_iter().enumerate() {
        match arg.into_string() {
            Ok(word) => words.push(word),
            Err(_) => return Err(usage(format!("argument {} is not valid UTF-8", i + 1))),
        }
    }
    let mut justification = None;
    let mut timeout_secs = None;
    let mut cwd = None;
    let mut rest = words.into_iter();
    let mut argv = Vec::new();
    while let Some(word) = rest.next() {
        if word == "--" {
            break;
        }
        if !word.starts_with('-') || word == "-" {
            argv.push(word);
            break;
        }
        let (name, inline) = match word.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name.to_owned(), Some(value.to_owned())),
            _ => (word.clone(), None),
        };
        let mut value = |name: &str| match inline.clone().or_else(|| rest.next()) {
            Some(v) => Ok(v),
            None => Err(usage(format!("{name} needs a value"))),
        };
        match name.as_str() {
            "-h" | "--help" if inline.is_none() => return Ok(Parsed::Help),
            "-V" | "--version" if inline.is_none() => return Ok(Parsed::Version),
            "--justification" => set_once(&mut justification, value("--justification")?, "--justification")?,
            "--timeout" => {
                let text = value("--timeout")?;
                let secs = text
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=MAX_TIMEOUT_SECS).contains(s))
                    .ok_or_else(|| usage(format!("--timeout must be a whole number of seconds from 1 to {MAX_TIMEOUT_SECS}")))?;
                set_once(&mut timeout_secs, secs, "--timeout")?;
            }
            "--cwd" => {
                let dir = value("--cwd")?;
                if dir.is_empty() {
                    return Err(usage("--cwd needs a directory"));
                }
                set_once(&mut cwd, dir, "--cwd")?;
            }
            _ => return Err(usage(format!("unknown option {} (see --help)", lazaret_protocol::display::escaped_str(&name)))),
        }
    }
    argv.extend(rest);
    if argv.is_empty() {
        return Err(usage("no command given (lazaret-escalate [OPTIONS] -- CMD [ARGS...])"));
    }
    Ok(Parsed::Run(Invocation { justification: justification.unwrap_or_default(), timeout_secs, cwd, argv }))
}

fn set_once<T>(slot: &mut Option<T>, value: T, name: &str) -> Result<(), UsageError> {
    if slot.replace(value).is_some() {
        return Err(usage(format!("{name} is given twice")));
    }
    Ok(())
}

/// The working directory to send: `dir` resolved against `current`
/// (absolute) lexically, without `.`, `..` or repeated slashes. The
/// coordinator decides whether it may be used; this only makes it absolute.
pub fn resolve_cwd(current: &Path, dir: Option<&str>) -> PathBuf {
    let joined = match dir {
        Some(d) => current.join(d),
        None => current.to_path_buf(),
    };
    let mut out = PathBuf::from("/");
    for component in joined.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// `--help`.
pub fn help() -> String {
    use lazaret_protocol::escalation::exit;
    format!(
        "\
lazaret-escalate: ask Lazaret to run one exact command on the host

Usage: lazaret-escalate [--justification TEXT] [--timeout SECONDS] [--cwd DIR] -- CMD [ARGS...]

The command is shown to the developer (or matched by their rules), runs on the
host as the developer in the host directory that corresponds to DIR, and its
stdout and stderr arrive here as it runs. Ctrl-C (SIGINT), SIGTERM or SIGHUP
cancels the request and kills the host command.

Options:
  --justification TEXT  why you ask, shown to the developer
  --timeout SECONDS     the longest to wait, approval and run together (1-{MAX_TIMEOUT_SECS})
  --cwd DIR             the working directory in the sandbox (default: the current one)
  -h, --help            this text
  -V, --version         the version

Exit status:
  N    the host command's own exit status (128+N if signal N killed it)
  {usage}   usage error
  {unavailable}   Lazaret unavailable: not in a Lazaret session, the coordinator cannot
       be reached or refused the request before accepting it
  {denied}   denied by a rule or the developer
  {timed_out}  timed out (waiting for approval or while running)
  {failed}  the host command could not be started or was lost
  {cancelled}  cancelled (SIGINT, SIGTERM, SIGHUP)
  141  stdout was closed (broken pipe); the request was cancelled
A host command may exit with these numbers too: then no line from
lazaret-escalate is on stderr; otherwise one line says which it was
(\"lazaret-escalate: denied: REASON\").
",
        usage = exit::USAGE,
        unavailable = exit::UNAVAILABLE,
        denied = exit::DENIED,
        timed_out = exit::TIMED_OUT,
        failed = exit::FAILED,
        cancelled = exit::CANCELLED,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_words(words: &[&str]) -> Result<Parsed, UsageError> {
        parse(words.iter().map(OsString::from))
    }

    fn run(words: &[&str]) -> Invocation {
        match parse_words(words) {
            Ok(Parsed::Run(inv)) => inv,
            other => panic!("{words:?} gave {other:?}"),
        }
    }

    #[test]
    fn options_end_at_double_dash_or_the_first_word() {
        let inv = run(&["--justification", "push it", "--timeout=30", "--cwd", "sub", "--", "git", "--help", "--", "x"]);
        assert_eq!(inv.justification, "push it");
        assert_eq!(inv.timeout_secs, Some(30));
        assert_eq!(inv.cwd.as_deref(), Some("sub"));
        assert_eq!(inv.argv, ["git", "--help", "--", "x"]);
        let inv = run(&["--timeout", "5", "git", "--timeout", "9"]);
        assert_eq!(inv.timeout_secs, Some(5));
        assert_eq!(inv.argv, ["git", "--timeout", "9"]);
        assert_eq!(run(&["--justification=a=b", "ls"]).justification, "a=b");
        assert_eq!(run(&["-", "x"]).argv, ["-", "x"]);
    }

    #[test]
    fn help_and_version_are_recognised_before_the_command() {
        assert_eq!(parse_words(&["--help"]), Ok(Parsed::Help));
        assert_eq!(parse_words(&["-h", "--", "x"]), Ok(Parsed::Help));
        assert_eq!(parse_words(&["--version"]), Ok(Parsed::Version));
        assert!(help().contains("77   denied"), "{}", help());
    }

    #[test]
    fn bad_command_lines_are_usage_errors() {
        for words in [
            &[][..],
            &["--"],
            &["--timeout"],
            &["--timeout", "0", "ls"],
            &["--timeout", "-3", "ls"],
            &["--timeout", "86401", "ls"],
            &["--timeout", "ten", "ls"],
            &["--cwd", "", "ls"],
            &["--cwd", "a", "--cwd", "b", "ls"],
            &["--bogus", "ls"],
            &["--help=yes"],
            &["-x", "ls"],
        ] {
            assert!(matches!(parse_words(words), Err(UsageError(_))), "{words:?} was accepted");
        }
        use std::os::unix::ffi::OsStringExt;
        let bad = vec![OsString::from("--"), OsString::from_vec(vec![b'l', 0xff])];
        assert_eq!(parse(bad), Err(UsageError("argument 2 is not valid UTF-8".into())));
    }

    #[test]
    fn cwd_is_resolved_lexically_against_the_current_directory() {
        let here = Path::new("/work/src");
        assert_eq!(resolve_cwd(here, None), Path::new("/work/src"));
        assert_eq!(resolve_cwd(here, Some("lib/./x//")), Path::new("/work/src/lib/x"));
        assert_eq!(resolve_cwd(here, Some("../../..")), Path::new("/"));
        assert_eq!(resolve_cwd(here, Some("/etc/../tmp")), Path::new("/tmp"));
    }
}
