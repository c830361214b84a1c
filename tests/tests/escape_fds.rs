//! Escape corpus: host file descriptors (issue 17). The client runs on a
//! real terminal whose master and slave it inherits (a careless caller's
//! `openpty`), and with a host file (holding a secret) and one end of a
//! host socket pair inherited too; it talks to the coordinator over its
//! socket. Inside, every descriptor of every process (the agent's and a
//! background job's) is listed and read, the agent writes a marker to
//! every descriptor it holds beyond stdio, and the host paths of the file,
//! the runtime directory and the coordinator socket are looked up. Nothing
//! inside may refer to a host file, the client's terminal or a socket (but
//! the one each session's broker listens on, `@lazaret-escalate/…`), and
//! on the host the file, the socket and the terminal must have received
//! nothing.

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use lazaret_tests::escape;
use lazaret_tests::pty::TestTerminal;
use lazaret_tests::*;

/// Clears FD_CLOEXEC, so that every child of the test inherits `fd`.
fn inheritable(fd: std::os::fd::BorrowedFd<'_>) {
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty())).expect("clearing FD_CLOEXEC");
}

const MARK: &str = "FDMARK-escape";
const INIT_MARK: &str = "INITMARK-escape";

#[test]
fn no_descriptor_inside_reaches_a_host_file_socket_terminal_or_the_coordinator() {
    let env = TestEnv::new();
    let secret = format!("host-secret-{}", std::process::id());
    let host_file = env.scratch.join("host-secret");
    std::fs::write(&host_file, &secret).expect("host file");
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&host_file).expect("open host file");
    inheritable(file.as_fd());
    let (mut ours, theirs) = UnixStream::pair().expect("socketpair");
    inheritable(theirs.as_fd());
    ours.set_nonblocking(true).expect("nonblocking");
    let term = TestTerminal::leaky();

    let script = format!(
        r#"SECRET="{secret_head}""{secret_tail}"
sleep 300 &
for p in /proc/[0-9]*; do
    pid=${{p#/proc/}}
    for f in $p/fd/*; do [ -L "$f" ] && echo "fd $pid $(cat $p/comm 2>/dev/null) ${{f##*/}} -> $(readlink "$f")"; done
done
must_fail read-every-descriptor-for-the-host-file tool fds "$SECRET"
must_fail write-every-inherited-descriptor tool writefds {MARK}
# The standard streams of processes outside the agent's session (the
# sandbox's init and its children) are what runsc create was given: gVisor
# shows them as host descriptors, and writes to a host /dev/null succeed,
# so the host judges this one (the coordinator's log must not get it).
SID=$(cut -d' ' -f6 /proc/$$/stat)
hit=; for p in /proc/[0-9]*; do
    [ "$(cut -d' ' -f6 $p/stat 2>/dev/null)" = "$SID" ] && continue
    for n in 0 1 2; do printf '%s\n' {INIT_MARK} 2>/dev/null >> $p/fd/$n && hit="$hit ${{p#/proc/}}/$n"; done
done
echo "case write-stdio-outside-the-session: wrote to$hit"
must_fail host-file-path-visible test -e {host}
must_fail runtime-dir-visible test -e {runtime}
must_fail coordinator-socket-findable sh -c 'find /run /var/run /tmp /dev -name coordinator.sock 2>/dev/null | grep -q .'
if test -t 0 && test -t 1 && test -t 2; then echo 'case stdio-on-terminal: yes'; else echo 'case stdio-on-terminal: no'; fi
must_fail client-terminal-master-held sh -c 'for f in /proc/[0-9]*/fd/*; do [ "$(readlink $f)" = /dev/ptmx ] && exit 0; done; exit 1'
must_fail socket-held-inside sh -c 'for f in /proc/[0-9]*/fd/*; do l=$(readlink $f); case "$l" in socket:*) i=${{l#socket:[}}; i=${{i%]}}; grep -q " $i @lazaret-escalate/" /proc/net/unix && continue; echo "$f $l"; exit 0;; esac; done; exit 1'
must_fail terminal-beyond-stdio sh -c 'for f in /proc/[0-9]*/fd/*; do case "${{f##*/}}" in 0|1|2) continue;; esac; case "$(readlink $f)" in /dev/pts/*|/dev/tty*|/dev/console) echo "$f"; exit 0;; esac; done; exit 1'
kill %1
"#,
        // The script itself must not hold the secret: the shell reading it
        // has it open.
        secret_head = &secret[..6],
        secret_tail = &secret[6..],
        host = host_file.display(),
        runtime = env.runtime_dir.display(),
    );
    let path = escape::install(&env, "fds", &script);
    let mut child = term
        .command(&env, &["run", "test", "--", "sh", &path.to_string_lossy()])
        .stdin(term.io())
        .stdout(term.io())
        .stderr(term.io())
        .spawn()
        .expect("spawning lazaret on the leaky terminal");
    let mut term = term;
    term.expect("case script-finished: done");
    let status = wait_with_limit(&mut child);
    let shown = String::from_utf8_lossy(term.received()).replace('\r', "\n").replace("\x1b[2K", "");
    println!("{shown}");
    assert_eq!(status.code(), Some(0), "{shown}");
    drop(file);
    drop(theirs);

    let results = escape::cases(&shown);
    escape::assert_refused(
        &results,
        &[
            "read-every-descriptor-for-the-host-file",
            "write-every-inherited-descriptor",
            "host-file-path-visible",
            "runtime-dir-visible",
            "coordinator-socket-findable",
            "client-terminal-master-held",
            "socket-held-inside",
            "terminal-beyond-stdio",
        ],
        &shown,
    );
    assert_eq!(
        results.get("stdio-on-terminal").map(String::as_str),
        Some("yes"),
        "the agent is not on a terminal: the session does not test the client's terminal\n{shown}"
    );
    // Every descriptor inside names something of the sandbox's own, and no
    // socket but the session broker's. gVisor
    // shows a descriptor donated from the host as `host:[N]`: only the
    // standard streams may be such (the session's PTY, the sandbox init's
    // stdio from runsc), nothing beyond them.
    let fds: Vec<&str> = shown.lines().filter(|l| l.starts_with("fd ")).collect();
    assert!(fds.len() >= 6, "too few descriptors listed inside: {fds:?}");
    let host_names = [host_file.display().to_string(), env.runtime_dir.display().to_string(), "coordinator.sock".into()];
    let bad: Vec<&&str> = fds
        .iter()
        .filter(|l| {
            let mut words = l.split_whitespace().skip(3);
            let fd = words.next().unwrap_or_default();
            let target = l.split(" -> ").nth(1).unwrap_or_default();
            // A socket of the sandbox's own is allowed only as the one the
            // session's init listens on, its escalation broker (the script
            // checked it by its name in /proc/net/unix).
            let broker = l.split_whitespace().nth(2) == Some("lazaret-session");
            host_names.iter().any(|n| target.contains(n.as_str()))
                || (target.starts_with("socket:") && !broker)
                || (target.starts_with("host:") && !["0", "1", "2"].contains(&fd))
        })
        .collect();
    assert!(bad.is_empty(), "descriptors inside refer to host files, sockets or host descriptors beyond stdio: {bad:?}");

    // The host side received nothing.
    assert_eq!(std::fs::read_to_string(&host_file).expect("host file"), secret, "the inherited host file was written");
    let mut buf = [0u8; 256];
    match ours.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("the inherited socket received {:?} from inside", String::from_utf8_lossy(&buf[..n])),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "reading the host socket: {e}"),
    }
    assert!(!shown.contains(MARK), "the marker written to the agent's descriptors reached the client's terminal");
    assert!(!shown.contains(INIT_MARK), "the marker written to the sandbox init's streams reached the client's terminal");
    let log = env.domain_dir().map(|d| d.join("coordinator.log")).expect("the Domain's runtime directory");
    let log = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("reading {}: {e}", log.display()));
    assert!(!log.contains(INIT_MARK), "the agent wrote into the host's coordinator.log through the sandbox init's stdio");
    env.assert_nothing_left();
}
