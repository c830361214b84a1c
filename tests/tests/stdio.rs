//! The agent's stdin, stdout and stderr (issue 17): output to files and
//! pipes is exactly what the same command gives without Lazaret, the
//! developer's terminal never reaches the sandbox (a PTY of its own for the
//! streams that are terminals, fresh pipes for the others), and a session's
//! PTY reaches no `runsc exec` but its own.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lazaret_tests::pty::TestTerminal;
use lazaret_tests::*;

/// Runs `sh -c SCRIPT` in the env's network namespace, in the workspace,
/// with `$LZ` standing for `lazaret --config CONFIG`; returns its output.
fn shell(env: &TestEnv, script: &str) -> std::process::Output {
    let lz = format!("{} --config {}", lazaret_bin().display(), env.config.display());
    let child = env
        .in_netns()
        .args(["sh", "-c", script])
        .env("LZ", lz)
        .current_dir(&env.workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning sh");
    wait_output(child)
}

/// Lines of a file that are not Lazaret's own messages.
fn agent_lines(path: &std::path::Path) -> String {
    let all = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    all.lines().filter(|l| !l.starts_with("lazaret")).map(|l| format!("{l}\n")).collect()
}

#[test]
fn output_to_a_file_opened_without_append_follows_what_the_caller_wrote() {
    let env = TestEnv::new();
    let log = env.scratch.join("log");
    let out = shell(&env, &format!("{{ echo start; $LZ run test -- echo X; echo end; }} > {}", log.display()));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&log).expect("log"), "start\nX\nend\n");
    // The same for stderr, and a second session on the (now running or
    // restarted) Domain.
    let err = env.scratch.join("err");
    let out = shell(&env, &format!("{{ echo one >&2; $LZ run test -- sh -c 'echo two >&2'; echo three >&2; }} 2> {}", err.display()));
    assert!(out.status.success(), "stdout: {}", text(&out.stdout));
    assert_eq!(agent_lines(&err), "one\ntwo\nthree\n");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn stdout_and_stderr_on_one_file_keep_their_order_and_pipes_see_exact_bytes() {
    let env = TestEnv::new();
    let log = env.scratch.join("log");
    let out = shell(
        &env,
        &format!(
            "{{ echo start; $LZ run test -- sh -c 'echo a; echo b >&2; echo c; echo d >&2; printf e'; echo; echo end; }} > {} 2>&1",
            log.display()
        ),
    );
    assert!(out.status.success(), "status {:?}", out.status);
    assert_eq!(agent_lines(&log), "start\na\nb\nc\nd\ne\nend\n");
    // A pipe in and a pipe out: the bytes, exactly, and the exit status.
    let out = shell(&env, "printf 'l1\\nl2\\n' | $LZ run test -- sh -c 'cat; printf tail; exit 3' | od -c");
    let expected = wait_output(
        Command::new("sh")
            .args(["-c", "printf 'l1\\nl2\\n' | sh -c 'cat; printf tail; exit 3' | od -c"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh"),
    );
    assert_eq!(text(&out.stdout), text(&expected.stdout), "stderr: {}", text(&out.stderr));
    let status = shell(&env, "echo in | $LZ run test -- sh -c 'read l; test \"$l\" = in && exit 5'");
    assert_eq!(status.status.code(), Some(5), "stderr: {}", text(&status.stderr));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Waits until the env has `n` `runsc exec` processes; returns them.
fn wait_execs(env: &TestEnv, n: usize) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = runsc_execs(env);
        if found.len() == n {
            return found;
        }
        assert!(Instant::now() < deadline, "expected {n} runsc exec processes, found {found:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Descriptor numbers and link targets of a host process (as root).
fn fds_of(pid: i32) -> Vec<(i32, String)> {
    let dir = format!("/proc/{pid}/fd");
    let mut fds: Vec<(i32, String)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {dir}: {e}"))
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().parse().ok()?;
            Some((n, std::fs::read_link(e.path()).ok()?.to_string_lossy().into_owned()))
        })
        .collect();
    fds.sort();
    fds
}

fn is_pty(link: &str) -> bool {
    link.starts_with("/dev/pts/") || link.ends_with("ptmx")
}

/// `lazaret run -- agent | tee log`: stdin and stderr are the developer's
/// terminal, stdout a pipe. The agent gets a PTY of its own for stdin and
/// stderr and a pipe for stdout; the developer's terminal is in no process
/// of the sandbox's (`runsc exec` holds only the fresh PTY and pipes).
#[test]
fn a_terminal_on_stdin_with_stdout_piped_never_reaches_the_sandbox() {
    let env = TestEnv::new();
    let mut term = TestTerminal::new(24, 80);
    let mut child = term
        .command(&env, &["run", "test", "--", "sh", "-c", "test -t 0 && echo in-tty >&2; test -t 1 || echo out-is-a-pipe; test -t 2 && echo err-tty >&2; echo ready; read line; echo got-$line"])
        .stdin(term.io())
        .stdout(Stdio::piped())
        .stderr(term.io())
        .spawn()
        .expect("spawning setsid -c lazaret");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut next = || lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(next(), "out-is-a-pipe", "terminal showed {:?}", term.seen());
    assert_eq!(next(), "ready");
    let ours = term.slave_path();
    let execs = wait_execs(&env, 1);
    let fds = fds_of(execs[0]);
    assert!(fds.iter().all(|(_, l)| *l != ours), "runsc exec holds the developer's terminal {ours}: {fds:?}");
    assert!(fds.iter().any(|(n, l)| *n == 0 && l.starts_with("/dev/pts/")), "stdin is not a PTY: {fds:?}");
    assert!(fds.iter().all(|(n, l)| !is_pty(l) || *n <= 2), "runsc exec holds more PTY descriptors than its stdio: {fds:?}");
    term.expect("in-tty");
    term.expect("err-tty");
    term.write(b"hello\r");
    assert_eq!(next(), "got-hello");
    assert_eq!(next(), "", "more output than expected");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0), "terminal showed {:?}", term.seen());
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Every descriptor the coordinator makes for a session is close-on-exec
/// but the three it hands to that session's `runsc exec`: a terminal
/// session's `runsc exec` holds its PTY slave on 0, 1 and 2 only, and no
/// master; a session started while it runs holds no PTY at all. The first
/// client leaks its own terminal's descriptors into the coordinator it
/// starts: no `runsc exec` gets those either.
#[test]
fn a_sessions_pty_reaches_only_its_own_runsc_exec() {
    let env = TestEnv::new();
    let mut term = TestTerminal::leaky();
    let mut a = term
        .command(&env, &["run", "test", "--", "sh", "-c", "echo a-up; read x; echo a-done"])
        .stdin(term.io())
        .stdout(term.io())
        .stderr(term.io())
        .spawn()
        .expect("spawning session A");
    term.expect("a-up");
    let a_exec = wait_execs(&env, 1)[0];
    let a_fds = fds_of(a_exec);
    let ptys: Vec<_> = a_fds.iter().filter(|(_, l)| is_pty(l)).collect();
    assert!(
        ptys.iter().all(|(n, l)| *n <= 2 && l.starts_with("/dev/pts/")),
        "A's runsc exec holds PTY descriptors beyond its stdio: {a_fds:?}"
    );
    assert_eq!(ptys.len(), 3, "{a_fds:?}");
    let mut b = env
        .lazaret(["run", "test", "--", "sh", "-c", "echo b-up; read x; echo b-done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning session B");
    let mut b_lines = BufReader::new(b.stdout.take().expect("stdout")).lines();
    assert_eq!(b_lines.next().and_then(Result::ok).as_deref(), Some("b-up"));
    let b_exec = wait_execs(&env, 2).into_iter().find(|p| *p != a_exec).expect("B's runsc exec");
    let b_fds = fds_of(b_exec);
    assert!(b_fds.iter().all(|(_, l)| !is_pty(l)), "B's runsc exec holds a PTY: {b_fds:?}");
    send(b.stdin.as_mut().expect("stdin"), b"x\n");
    drop(b.stdin.take());
    assert_eq!(b_lines.next().and_then(Result::ok).as_deref(), Some("b-done"));
    assert_eq!(wait_with_limit(&mut b).code(), Some(0));
    term.write(b"x\r");
    term.expect("a-done");
    assert_eq!(wait_with_limit(&mut a).code(), Some(0), "terminal showed {:?}", term.seen());
    env.assert_nothing_left();
    env.assert_journal_conforms();
}
