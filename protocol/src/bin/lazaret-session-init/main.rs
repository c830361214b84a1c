//! `lazaret-session-init [--user UID:GID[:GIDS]] [--cwd DIR] -- COMMAND
//! [ARGS...]`: the first process of every Lazaret session inside the
//! sandbox (see `lazaret_protocol::session`).
//!
//! With `--user` it runs as root (with only the capabilities to change
//! ids, drop the bounding set and kill the session's processes) and is the session's escalation broker
//! (`lazaret_protocol::client::relay`): it takes the session's escalation
//! credentials from its own environment, which the agent's uid cannot
//! read, gives the agent the broker's name instead, and starts the agent
//! with the agent's ids, no capabilities and an empty bounding set, in
//! `--cwd`.
//!
//! It makes itself the child subreaper of everything the session starts,
//! forks and execs the agent's command (in a process group of its own that
//! is the terminal's foreground group, when there is a terminal), forwards
//! the signals it gets to the agent, and reaps. When the agent exits, or
//! the coordinator sends [`END_SIGNAL`], it SIGKILLs every process left in
//! its tree (double-forked daemons too: they were re-parented to it) until
//! none is left, then exits with the agent's status. A command that cannot
//! be run exits 127 (not found) or 126 (not executable) with one line on
//! stderr, like a shell.
//!
//! It is built statically (scripts/build-escalate.sh) so that it runs in any
//! image, and holds none of the agent's streams while the agent runs.

#![deny(unsafe_code)]

mod sys;

use std::ffi::{CString, OsString};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::sync::Arc;
use std::time::Duration;

use lazaret_protocol::client::relay::Broker;
use lazaret_protocol::client::{Credentials, config as tls_config};
use lazaret_protocol::session::{
    AgentUser, COMMAND_SEPARATOR, CREDENTIALS_FD, CREDENTIALS_OPTION, CWD_OPTION, END_SIGNAL, ENV_BROKER, EXIT_FAILED, EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND, LAST_SIGNAL, SessionCredentials, USER_OPTION, descendants_of, parent_from_stat, shell_status,
};

/// Signals that stop or are synchronous: never blocked, never forwarded.
const UNBLOCKABLE: [libc::c_int; 8] =
    [libc::SIGKILL, libc::SIGSTOP, libc::SIGSEGV, libc::SIGBUS, libc::SIGILL, libc::SIGFPE, libc::SIGTRAP, libc::SIGSYS];

/// Job-control signals meant for the terminal's foreground group (the
/// agent's): blocked here, never forwarded.
const JOB_CONTROL: [libc::c_int; 3] = [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU];

/// The PATH searched when the environment has none (as glibc's execvp).
const DEFAULT_PATH: &str = "/bin:/usr/bin";
/// How long the session's end waits for relays still passing on what its
/// processes last sent.
const RELAYS_DRAIN: Duration = Duration::from_secs(2);

fn say(line: &str) {
    eprintln!("lazaret-session-init: {line}");
}

fn main() {
    std::process::exit(run());
}

/// `lazaret-session-init`'s own options.
#[derive(Default)]
struct Options {
    user: Option<AgentUser>,
    cwd: Option<CString>,
    credentials: bool,
}

/// Parses `[--user U] [--cwd DIR] [--credentials] -- COMMAND...`; the
/// command is returned.
fn parse_args(mut args: impl Iterator<Item = OsString>) -> Result<(Options, Vec<OsString>), String> {
    let mut options = Options::default();
    loop {
        let Some(arg) = args.next() else {
            return Err("usage: lazaret-session-init [--user UID:GID[:GIDS]] [--cwd DIR] [--credentials] -- COMMAND [ARGS...]".into());
        };
        match arg.to_str() {
            Some(COMMAND_SEPARATOR) => break,
            Some(USER_OPTION) => {
                let value = args.next().unwrap_or_default();
                let user = value.to_str().and_then(AgentUser::parse);
                options.user = Some(user.ok_or_else(|| format!("{USER_OPTION} takes UID:GID[:GID,...] with a UID other than 0"))?);
            }
            Some(CREDENTIALS_OPTION) => options.credentials = true,
            Some(CWD_OPTION) => {
                let value = args.next().unwrap_or_default();
                if !value.as_bytes().starts_with(b"/") {
                    return Err(format!("{CWD_OPTION} takes an absolute directory"));
                }
                options.cwd = Some(CString::new(value.into_vec()).map_err(|_| format!("{CWD_OPTION} contains a NUL byte"))?);
            }
            _ => return Err(format!("unknown argument {:?}", arg)),
        }
    }
    Ok((options, args.collect()))
}

/// The session's broker, from the session's credentials on
/// [`CREDENTIALS_FD`] (read to its end and closed here); a warning when
/// they are missing or unusable (the agent then runs, and
/// `lazaret-escalate` says it is not in a session).
fn broker() -> Option<(Broker, String)> {
    let made = (|| {
        let blob = sys::take_credentials(CREDENTIALS_FD).ok_or(format!("descriptor {CREDENTIALS_FD} is not open"))?;
        let creds: SessionCredentials = serde_json::from_slice(&blob.map_err(|e| format!("cannot read the credentials: {e}"))?)
            .map_err(|e| format!("the credentials are malformed: {e}"))?;
        let addr = creds.addr.parse().map_err(|_| "the coordinator's address is not IP:PORT".to_owned())?;
        let config = tls_config(&Credentials { ca: creds.ca, cert: creds.cert, key: creds.key })?;
        Broker::bind(addr, config)
    })();
    match made {
        Ok(broker) => Some(broker),
        Err(reason) => {
            say(&format!("host escalation is unavailable in this session: {reason}"));
            None
        }
    }
}

/// The agent's environment: this process's, with the broker's name (an
/// inherited value is never trusted).
fn agent_environment(broker: Option<&str>) -> Vec<CString> {
    let mut env: Vec<CString> = std::env::vars_os()
        .filter(|(name, _)| name.as_bytes() != ENV_BROKER.as_bytes())
        .filter_map(|(name, value)| {
            let mut entry = name.into_vec();
            entry.push(b'=');
            entry.extend(value.into_vec());
            CString::new(entry).ok()
        })
        .collect();
    if let Some(name) = broker.and_then(|n| CString::new(format!("{ENV_BROKER}={n}")).ok()) {
        env.push(name);
    }
    env
}

fn run() -> i32 {
    let (options, argv) = match parse_args(std::env::args_os().skip(1)) {
        Ok(parsed) => parsed,
        Err(message) => {
            say(&message);
            return EXIT_FAILED;
        }
    };
    let Some(program) = argv.first().cloned() else {
        say("no command given");
        return EXIT_FAILED;
    };
    let Ok(argv) = argv.into_iter().map(|a| CString::new(a.into_vec())).collect::<Result<Vec<_>, _>>() else {
        say("an argument contains a NUL byte");
        return EXIT_FAILED;
    };
    if options.user.is_some() && sys::effective_uid() != 0 {
        say(&format!("{USER_OPTION} needs lazaret-session-init to run as root"));
        return EXIT_FAILED;
    }
    let broker = if options.credentials { broker() } else { None };
    let envp = agent_environment(broker.as_ref().map(|(_, name)| name.as_str()));
    let groups: Vec<libc::gid_t> = options.user.as_ref().map(|u| u.groups.clone()).unwrap_or_default();
    let identity = options.user.as_ref().map(|u| sys::Identity { uid: u.uid, gid: u.gid, groups: &groups });
    let candidates = candidates(&program, std::env::var_os("PATH"));
    if let Err(e) = sys::become_subreaper() {
        say(&format!("cannot become the session's subreaper: {e}"));
        return EXIT_FAILED;
    }
    let mut blocked = sys::SigSet::empty();
    for signal in 1..=LAST_SIGNAL {
        if !UNBLOCKABLE.contains(&signal) {
            blocked.add(signal);
        }
    }
    let (signals, original_mask) = match sys::block_into_signalfd(&blocked) {
        Ok(v) => v,
        Err(e) => {
            say(&format!("cannot watch for signals: {e}"));
            return EXIT_FAILED;
        }
    };
    let terminal = sys::stdin_is_terminal();
    let searched = !program.as_bytes().contains(&b'/');
    let plan = sys::Spawn {
        candidates: &candidates,
        argv: &argv,
        envp: &envp,
        identity: identity.as_ref(),
        cwd: options.cwd.as_ref(),
        searched,
        terminal,
        mask: &original_mask,
        not_found: EXIT_NOT_FOUND,
        not_executable: EXIT_NOT_EXECUTABLE,
        failed: EXIT_FAILED,
    };
    let agent = match sys::spawn(&plan) {
        Ok((pid, None)) => pid,
        Ok((pid, Some((sys::Stage::Identity, errno)))) => {
            say(&format!("cannot take the agent's user and groups: {}", errno_text(errno)));
            pid
        }
        Ok((pid, Some((sys::Stage::Directory, errno)))) => {
            let dir = options.cwd.as_ref().map(|c| String::from_utf8_lossy(c.as_bytes()).into_owned()).unwrap_or_default();
            eprintln!("lazaret: cannot enter the working directory {}: {}", printable(&OsString::from(dir)), errno_text(errno));
            pid
        }
        Ok((pid, Some((sys::Stage::Exec, errno)))) => {
            // The child has exited with its status; say why, as runsc would.
            let name = printable(&program);
            let why = errno_text(errno);
            if searched && errno == libc::ENOENT {
                eprintln!("lazaret: {name}: command not found in PATH: {why}");
            } else {
                eprintln!("lazaret: {name}: {why}");
            }
            pid
        }
        Err(e) => {
            say(&format!("cannot start the agent: {e}"));
            return EXIT_FAILED;
        }
    };
    // Held here until the session ends, served or not: the agent's
    // environment names the socket, and were it closed any process could
    // listen under that name and pose as the broker.
    let broker = broker.map(|(broker, _)| Arc::new(broker));
    match &broker {
        Some(broker) => {
            sys::drop_stdio_except(&[signals.as_raw_fd(), broker.as_raw_fd()]);
            let me = sys::own_pid();
            let serving = broker.clone();
            // The broker's threads keep every signal blocked (they inherit
            // the mask): signals are read here, from the signalfd.
            if let Err(e) = std::thread::Builder::new().name("broker".into()).spawn(move || serving.serve(me)) {
                say(&format!("host escalation is unavailable in this session: cannot start the broker: {e}"));
            }
        }
        None => sys::drop_stdio_except(&[signals.as_raw_fd()]),
    }
    let status = supervise(agent, &signals);
    end_everything_left();
    if let Some(broker) = &broker {
        // What the session's processes last sent (a Cancel, say) still
        // reaches the coordinator.
        broker.wait_idle(RELAYS_DRAIN);
    }
    drop(broker);
    status
}

/// The paths to try for `program`: itself when it names a path, else each
/// directory of `path` (an empty entry is the current directory).
fn candidates(program: &OsString, path: Option<OsString>) -> Vec<CString> {
    let bytes = program.as_bytes();
    if bytes.contains(&b'/') {
        return CString::new(bytes.to_vec()).into_iter().collect();
    }
    let path = path.unwrap_or_else(|| DEFAULT_PATH.into());
    path.as_bytes()
        .split(|&b| b == b':')
        .filter_map(|dir| {
            let mut full = if dir.is_empty() { b".".to_vec() } else { dir.to_vec() };
            full.push(b'/');
            full.extend_from_slice(bytes);
            CString::new(full).ok()
        })
        .collect()
}

/// Forwards signals and reaps until the agent has ended (or the
/// coordinator ended the session); returns the agent's status.
fn supervise(agent: libc::pid_t, signals: &std::os::fd::OwnedFd) -> i32 {
    loop {
        let signal = match sys::read_signal(signals) {
            Ok(s) => s,
            Err(e) => {
                // Without signals nothing can be supervised: end it all.
                say(&format!("reading signals: {e}; ending the session"));
                let _ = sys::kill(agent, libc::SIGKILL);
                return EXIT_FAILED;
            }
        };
        match signal {
            libc::SIGCHLD => loop {
                match sys::reap_one() {
                    Ok(sys::Reaped::Ended { pid, code, signal }) if pid == agent => return shell_status(code, signal),
                    Ok(sys::Reaped::Ended { .. }) => {}
                    Ok(sys::Reaped::Running) => break,
                    Ok(sys::Reaped::None) | Err(_) => return EXIT_FAILED,
                }
            },
            END_SIGNAL => {
                let _ = sys::kill(agent, libc::SIGKILL);
            }
            s if JOB_CONTROL.contains(&s) => {}
            s => {
                let _ = sys::kill(agent, s);
            }
        }
    }
}

/// SIGKILLs every descendant, round after round (a process may fork while
/// its tree is killed; its orphans come to this subreaper), until no child
/// is left.
fn end_everything_left() {
    let me = sys::own_pid();
    loop {
        loop {
            match sys::reap_one() {
                Ok(sys::Reaped::Ended { .. }) => {}
                Ok(sys::Reaped::Running) => break,
                Ok(sys::Reaped::None) | Err(_) => return,
            }
        }
        for pid in descendants_of(&processes(), me) {
            let _ = sys::kill(pid, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// (PID, parent PID) of every process in /proc.
fn processes() -> Vec<(i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|e| {
            let pid: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, parent_from_stat(&stat)?))
        })
        .collect()
}

/// The errno's text as runsc and Go print it (lower case).
fn errno_text(errno: i32) -> String {
    match errno {
        libc::ENOENT => "no such file or directory".into(),
        libc::EACCES => "permission denied".into(),
        libc::ENOEXEC => "exec format error".into(),
        libc::ENOTDIR => "not a directory".into(),
        libc::EISDIR => "is a directory".into(),
        other => std::io::Error::from_raw_os_error(other).to_string().to_lowercase(),
    }
}

/// The command's name with control characters made visible.
fn printable(program: &OsString) -> String {
    program.to_string_lossy().chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}
