//! What the coordinator and `lazaret-session-init` (the per-session
//! subreaper inside the sandbox, `protocol/src/bin/lazaret-session-init`)
//! agree on.
//!
//! Every session's `runsc exec` starts `lazaret-session-init -- AGENT...`
//! instead of the agent. It becomes the child subreaper of everything the
//! agent starts (double-forked daemons included, which are re-parented to
//! it rather than to the container's init), forwards signals to the agent,
//! and when the agent exits or the coordinator sends [`END_SIGNAL`], kills
//! every remaining descendant before it exits with the agent's status.

/// The signal (SIGPWR) the coordinator sends `lazaret-session-init`
/// (`runsc kill --pid`) to end the session: SIGKILL the agent and every
/// process it left. Any other signal is forwarded to the agent. Not a
/// real-time signal: `runsc kill` takes only the named signals 1-31 (it
/// refuses 34-64 as "unknown signal"), and SIGPWR means nothing to an agent
/// in a sandbox.
pub const END_SIGNAL: i32 = 30;

/// The highest signal number (Linux's SIGRTMAX): `lazaret-session-init`
/// watches every signal up to it.
pub const LAST_SIGNAL: i32 = 64;

/// The argument that separates `lazaret-session-init`'s own arguments
/// (none yet) from the agent's command.
pub const COMMAND_SEPARATOR: &str = "--";

/// Where `lazaret-session-init` is inside every sandbox (bound read-only,
/// like the Escalation Client).
pub const SESSION_INIT_PATH: &str = "/usr/local/bin/lazaret-session-init";

/// Exit status when the agent's command was not found (as POSIX shells).
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit status when the agent's command exists but cannot be executed.
pub const EXIT_NOT_EXECUTABLE: i32 = 126;
/// Exit status when `lazaret-session-init` itself cannot work (Lazaret's
/// own failure).
pub const EXIT_FAILED: i32 = 125;

/// The exit status a shell reports for a process that exited with `code`
/// or was killed by `signal`.
pub fn shell_status(code: Option<i32>, signal: Option<i32>) -> i32 {
    match (code, signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        (None, None) => EXIT_FAILED,
    }
}

/// The parent PID in the text of a `/proc/PID/stat` file (the field after
/// the command name, which may itself contain spaces and parentheses).
pub fn parent_from_stat(stat: &str) -> Option<i32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

/// `root`'s descendants (not `root` itself) among `processes` ((PID,
/// parent PID) pairs).
pub fn descendants_of(processes: &[(i32, i32)], root: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in processes {
            if ppid == parent && pid != root && !found.contains(&pid) {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_the_parent_even_with_odd_command_names() {
        assert_eq!(parent_from_stat("42 (sleep) S 7 42 42 0 -1"), Some(7));
        assert_eq!(parent_from_stat("43 (a) b) (c) R 1 43 43"), Some(1));
        assert_eq!(parent_from_stat("44 (x y z) S 12"), Some(12));
        assert_eq!(parent_from_stat("garbage"), None);
        assert_eq!(parent_from_stat("45 (x) S"), None);
    }

    #[test]
    fn descendants_follow_every_generation_and_skip_others() {
        let ps = [(1, 0), (10, 1), (11, 10), (12, 11), (13, 10), (20, 1), (21, 20)];
        let mut d = descendants_of(&ps, 10);
        d.sort();
        assert_eq!(d, [11, 12, 13]);
        assert!(descendants_of(&ps, 12).is_empty());
        // A cycle in a hostile or racy listing cannot loop forever.
        let cyclic = [(5, 6), (6, 5)];
        assert_eq!(descendants_of(&cyclic, 5), [6]);
    }

    #[test]
    fn statuses_read_like_a_shell_s() {
        assert_eq!(shell_status(Some(3), None), 3);
        assert_eq!(shell_status(None, Some(9)), 137);
        assert_eq!(shell_status(None, None), EXIT_FAILED);
    }
}
