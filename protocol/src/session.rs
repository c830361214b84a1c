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
/// from the agent's command.
pub const COMMAND_SEPARATOR: &str = "--";

/// `lazaret-session-init`'s option naming the agent's identity,
/// `UID:GID[:GID,GID...]` (supplementary groups last). With it,
/// `lazaret-session-init` itself runs as root inside the sandbox, holds the
/// session's escalation credentials where the agent's uid cannot read them
/// (in the memory of a process of another uid, received on
/// [`CREDENTIALS_FD`]), and starts the agent with exactly these ids and no
/// capabilities.
pub const USER_OPTION: &str = "--user";

/// `lazaret-session-init`'s option naming the agent's working directory:
/// entered after the agent's identity is taken, so that root without
/// `CAP_DAC_*` does not need to traverse the developer's directories.
pub const CWD_OPTION: &str = "--cwd";

/// The agent's identity as [`USER_OPTION`] carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUser {
    /// The agent's uid (never 0: a root agent needs no change of ids).
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

impl AgentUser {
    /// The option's value: `UID:GID` or `UID:GID:G1,G2`.
    pub fn to_arg(&self) -> String {
        let mut out = format!("{}:{}", self.uid, self.gid);
        if !self.groups.is_empty() {
            let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
            out.push(':');
            out.push_str(&groups.join(","));
        }
        out
    }

    /// Parses [`AgentUser::to_arg`]'s form; uid 0 is refused (the option
    /// exists to leave root).
    pub fn parse(arg: &str) -> Option<AgentUser> {
        let mut parts = arg.splitn(3, ':');
        let uid: u32 = parts.next()?.parse().ok()?;
        let gid: u32 = parts.next()?.parse().ok()?;
        let groups = match parts.next() {
            None => Vec::new(),
            Some(list) => list.split(',').map(|g| g.parse().ok()).collect::<Option<Vec<u32>>>()?,
        };
        (uid != 0 && groups.len() <= 256).then_some(AgentUser { uid, gid, groups })
    }
}

/// `lazaret-session-init`'s option saying that the session's escalation
/// credentials wait on [`CREDENTIALS_FD`] (an open descriptor alone proves
/// nothing: one may be inherited by accident).
pub const CREDENTIALS_OPTION: &str = "--credentials";

/// The descriptor on which `lazaret-session-init` receives the session's
/// escalation credentials ([`SessionCredentials`] as JSON, to its end): a
/// socket, because another process can reopen a pipe or a file through
/// `/proc/PID/fd/N` (gVisor 20240729 lets any process traverse another's
/// `/proc/PID/fd`) but never a socket. Never the environment: gVisor
/// 20240729 makes every process's `/proc/PID/environ` world-readable.
pub const CREDENTIALS_FD: i32 = 10;

/// What the coordinator gives each session's broker.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionCredentials {
    /// The coordinator's escalation listener, `IP:PORT`.
    pub addr: String,
    /// The Domain CA's certificate (PEM).
    pub ca: String,
    /// This session's client certificate (PEM).
    pub cert: String,
    /// This session's client key (PEM, PKCS#8).
    pub key: String,
}

/// Environment variable naming the session's escalation broker, the
/// abstract unix socket `lazaret-session-init` listens on (`@NAME`). It is
/// no secret: the broker serves only processes of its own session.
pub const ENV_BROKER: &str = "LAZARET_ESCALATE_SOCKET";

/// Whether `pid` descends from `ancestor` (is it, its child, grandchild,
/// ...), following `parent_of` (a process's parent PID, `None` when it is
/// gone). A chain that ends at PID 1 or 0, breaks, or loops does not.
pub fn descends_from(pid: i32, ancestor: i32, parent_of: impl Fn(i32) -> Option<i32>) -> bool {
    let mut current = pid;
    // A process tree inside one sandbox is never deeper than its PID
    // limit; the bound only stops a loop in a racy listing.
    for _ in 0..65_536 {
        if current == ancestor {
            return true;
        }
        if current <= 1 {
            return false;
        }
        match parent_of(current) {
            Some(parent) if parent != current => current = parent,
            _ => return false,
        }
    }
    false
}

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
    fn ancestry_is_followed_to_the_session_init_and_no_further() {
        let parents = [(30, 20), (20, 10), (10, 1), (40, 1), (50, 50), (60, 61), (61, 60)];
        let parent_of = |pid: i32| parents.iter().find(|(p, _)| *p == pid).map(|(_, pp)| *pp);
        assert!(descends_from(30, 10, parent_of), "a grandchild");
        assert!(descends_from(10, 10, parent_of), "itself");
        assert!(!descends_from(40, 10, parent_of), "another session's process");
        assert!(!descends_from(10, 30, parent_of), "an ancestor is no descendant");
        assert!(!descends_from(99, 10, parent_of), "a process that is gone");
        assert!(!descends_from(50, 10, parent_of), "its own parent");
        assert!(!descends_from(60, 10, parent_of), "a loop");
    }

    #[test]
    fn the_agent_user_option_round_trips_and_refuses_root_and_junk() {
        let user = AgentUser { uid: 1000, gid: 1000, groups: vec![27, 100] };
        assert_eq!(user.to_arg(), "1000:1000:27,100");
        assert_eq!(AgentUser::parse("1000:1000:27,100"), Some(user));
        assert_eq!(AgentUser::parse("5:6"), Some(AgentUser { uid: 5, gid: 6, groups: vec![] }));
        for bad in ["0:0", "0:5:1", "a:1", "1", "1:2:", "1:2:x", "1:-2", ""] {
            assert_eq!(AgentUser::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn statuses_read_like_a_shell_s() {
        assert_eq!(shell_status(Some(3), None), 3);
        assert_eq!(shell_status(None, Some(9)), 137);
        assert_eq!(shell_status(None, None), EXIT_FAILED);
    }
}
