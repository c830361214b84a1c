//! Telling `runsc exec`'s failure to start the agent from the agent's own
//! exit status, so that `lazaret run` exits like a shell would: 127 when
//! the command was not found, 126 when it exists but cannot be executed.
//!
//! runsc exits with 128 when it cannot start the process (its fatal-error
//! path), after printing one line on its stderr, which is the agent's: the
//! developer sees it as it is. runsc writes `--internal-pid-file` only once
//! the process exists, so 128 without that file is runsc's failure; the
//! same line in runsc's `--log` ([`exec_log_path`]) says which.

use std::path::{Path, PathBuf};

/// runsc's exit status when a command fails before the container process runs.
pub const RUNSC_FATAL: i32 = 128;
/// Exit status when the agent's command was not found (as POSIX shells).
pub const EXIT_NOT_FOUND: i32 = lazaret_protocol::session::EXIT_NOT_FOUND;
/// Exit status when the agent's command exists but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = lazaret_protocol::session::EXIT_NOT_EXECUTABLE;
/// Exit status when runsc failed for any other reason (Lazaret's failure).
pub const EXIT_RUNSC_FAILED: i32 = lazaret_protocol::session::EXIT_FAILED;

/// Why `runsc exec` did not start the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecFailure {
    /// The command (a path, or a name searched in PATH) does not exist.
    NotFound(String),
    /// The command exists but cannot be executed (permissions, a directory,
    /// not an executable format).
    NotExecutable(String),
    /// runsc failed otherwise; its message, if it logged one.
    Other(String),
}

impl ExecFailure {
    /// The exit status `lazaret run` reports for it.
    pub fn exit_code(&self) -> i32 {
        match self {
            ExecFailure::NotFound(_) => EXIT_NOT_FOUND,
            ExecFailure::NotExecutable(_) => EXIT_NOT_EXECUTABLE,
            ExecFailure::Other(_) => EXIT_RUNSC_FAILED,
        }
    }

    /// runsc's message.
    pub fn message(&self) -> &str {
        match self {
            ExecFailure::NotFound(m) | ExecFailure::NotExecutable(m) | ExecFailure::Other(m) => m,
        }
    }
}

/// Where [`crate::runsc::Runsc::exec`] has runsc log for the process whose
/// internal PID file is `pid_file`.
pub fn exec_log_path(pid_file: &Path) -> PathBuf {
    let mut p = pid_file.as_os_str().to_owned();
    p.push(".runsc.log");
    PathBuf::from(p)
}

/// Whether `runsc exec` exiting with `status` failed to start the process:
/// `started` says whether the internal PID file was written; `log` is
/// runsc's log of the exec (lines of text or JSON objects with a `msg`).
/// `None`: the status is the agent's.
pub fn classify(status: i32, started: bool, log: &str) -> Option<ExecFailure> {
    if status != RUNSC_FATAL || started {
        return None;
    }
    let message = log
        .lines()
        .rev()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v.get("msg").and_then(|m| m.as_str()).map(String::from))
                .unwrap_or_else(|| l.to_string())
        })
        .find(|m| m.contains("executing command"));
    let Some(message) = message else {
        return Some(ExecFailure::Other(String::new()));
    };
    // The errno text ends the message ("failed to load X: <errno>",
    // "error finding executable X in PATH [...]: <errno>").
    let errno = message.rsplit(": ").next().unwrap_or_default();
    Some(match errno {
        "no such file or directory" | "not a directory" => ExecFailure::NotFound(message),
        "permission denied" | "exec format error" | "is a directory" => ExecFailure::NotExecutable(message),
        _ => ExecFailure::Other(message),
    })
}

/// [`classify`] from the files: the PID file and [`exec_log_path`] of it.
pub fn classify_exec(status: i32, pid_file: &Path) -> Option<ExecFailure> {
    let log = std::fs::read_to_string(exec_log_path(pid_file)).unwrap_or_default();
    classify(status, pid_file.exists(), &log)
}

#[cfg(test)]
mod tests {
    use super::*;

    // What runsc 20240729 logs (seen with `runsc --log F exec ID CMD`).
    const MISSING: &str = r#"{"msg":"executing processes for container: executing command \"/nonexistent\" in sandbox: failed to load /nonexistent: no such file or directory","level":"error","time":"2026-12-01T21:17:04.510782608Z"}"#;
    const NOT_IN_PATH: &str = "executing processes for container: executing command \"nope\" in sandbox: error finding executable \"nope\" in PATH [/usr/bin /bin]: no such file or directory";
    const DENIED: &str = r#"{"msg":"executing processes for container: executing command \"/etc/passwd\" in sandbox: failed to load /etc/passwd: permission denied","level":"error"}"#;

    #[test]
    fn not_found_and_not_executable_read_like_a_shell_s() {
        assert_eq!(classify(128, false, MISSING).map(|f| f.exit_code()), Some(127));
        assert_eq!(classify(128, false, NOT_IN_PATH).map(|f| f.exit_code()), Some(127));
        assert_eq!(classify(128, false, &format!("some info\n{DENIED}\n")).map(|f| f.exit_code()), Some(126));
        assert!(classify(128, false, MISSING).is_some_and(|f| f.message().contains("/nonexistent")));
    }

    #[test]
    fn the_agent_s_own_128_and_other_statuses_are_kept() {
        assert_eq!(classify(128, true, MISSING), None, "the process ran: 128 is its own");
        assert_eq!(classify(127, false, MISSING), None);
        assert_eq!(classify(0, false, ""), None);
    }

    #[test]
    fn any_other_runsc_failure_is_lazaret_s() {
        assert_eq!(classify(128, false, "").map(|f| f.exit_code()), Some(125));
        let other = "executing processes for container: executing command \"x\" in sandbox: sandbox is not running";
        assert_eq!(classify(128, false, other).map(|f| f.exit_code()), Some(125));
    }

    #[test]
    fn the_log_sits_beside_the_pid_file() {
        assert_eq!(exec_log_path(Path::new("/run/x/s-1.pid")), Path::new("/run/x/s-1.pid.runsc.log"));
    }
}
