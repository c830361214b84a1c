//! `lazaret run` under a pseudo-terminal that the test drives (FR-8, DX-5):
//! the window size inside follows the outer one, and the outer terminal's
//! modes are exactly restored after exit, also when the agent is killed;
//! the developer's TERM, locale and time zone, resizes as SIGWINCH,
//! bracketed paste, mouse reporting and the alternate screen (issue 14).

use std::time::{Duration, Instant};

use lazaret_tests::pty::TestTerminal;
use lazaret_tests::*;

#[test]
fn window_size_follows_the_outer_terminal_and_modes_are_restored() {
    let env = TestEnv::new();
    let mut pty = TestTerminal::new(33, 111);
    let before = pty.modes();
    let mut child = pty.spawn(&env, &["run", "test", "--", "sh", "-c", "stty size; read line; stty size; echo done-$((6*7))"]);
    pty.expect("33 111");
    pty.resize(44, 122);
    pty.write(b"\r");
    pty.expect("44 122");
    pty.expect("done-42");
    let status = wait_with_limit(&mut child);
    assert_eq!(status.code(), Some(0), "terminal showed {:?}", pty.seen());
    assert_eq!(pty.modes(), before, "outer terminal modes changed");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn modes_are_restored_when_the_agent_is_killed() {
    let env = TestEnv::new();
    let mut pty = TestTerminal::new(24, 80);
    let before = pty.modes();
    let mut child = pty.spawn(&env, &["run", "test", "--", "sh", "-c", "echo started; kill -KILL $$"]);
    pty.expect("started");
    let status = wait_with_limit(&mut child);
    assert_eq!(status.code(), Some(137), "terminal showed {:?}", pty.seen());
    assert_eq!(pty.modes(), before, "outer terminal modes changed");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

#[test]
fn input_reaches_the_agent_on_a_terminal() {
    let env = TestEnv::new();
    let mut pty = TestTerminal::new(24, 80);
    let mut child = pty.spawn(&env, &["run", "test", "--", "sh", "-c", "test -t 0 && test -t 1 && echo is-a-tty; read a; echo got-$a"]);
    pty.expect("is-a-tty");
    pty.write(b"hello\r");
    pty.expect("got-hello");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// The developer's terminal settings that `env` passes to `lazaret`.
fn with_terminal_settings(env: &mut TestEnv) {
    for (k, v) in
        [("TERM", "xterm-256color"), ("COLORTERM", "truecolor"), ("LANG", "C.UTF-8"), ("LC_TIME", "C.UTF-8"), ("TZ", "Europe/Berlin")]
    {
        env.env.push((k.into(), v.into()));
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// A full-screen program (bash with escape sequences, `stty` and `head`):
/// TERM, COLORTERM, LANG, LC_* and TZ come from the developer (and the time
/// zone works inside), it switches to the alternate screen with bracketed
/// paste and mouse reporting on (those bytes reach the outer terminal
/// exactly), sees its initial size and a resize as SIGWINCH with the new
/// `stty size`, and a paste and a mouse click reach it byte for byte.
#[test]
fn a_full_screen_program_gets_the_developer_s_terminal_byte_for_byte() {
    let mut env = TestEnv::new();
    with_terminal_settings(&mut env);
    let paste = "\x1b[200~héllo wörld\t$(x)\x1b[201~".as_bytes();
    let mouse = b"\x1b[M !!";
    let input = [paste, mouse.as_slice()].concat();
    let script = format!(
        r#"printf 'env[%s|%s|%s|%s|%s|%s]\n' "$TERM" "$COLORTERM" "$LANG" "$LC_TIME" "$TZ" "$(date -d @0 +%Z%z)"
resized=
trap 'resized=1; printf "winch[%s]\r\n" "$(stty size)"' WINCH
printf '\033[?1049h\033[?2004h\033[?1000h'
stty raw -echo
printf 'ready[%s]\r\n' "$(stty size)"
while [ -z "$resized" ]; do sleep 0.05; done
printf 'paste now\r\n'
got=$(head -c {} | od -An -tx1 | tr -d ' \n')
printf '\033[?1000l\033[?2004l\033[?1049l'
stty sane
printf 'got[%s]\n' "$got""#,
        input.len()
    );
    let mut pty = TestTerminal::new(33, 111);
    let before = pty.modes();
    let mut child = pty.spawn(&env, &["run", "test", "--", "bash", "-c", &script]);
    pty.expect("env[xterm-256color|truecolor|C.UTF-8|C.UTF-8|Europe/Berlin|CET+0100]");
    pty.expect("ready[33 111]");
    pty.resize(44, 122);
    pty.expect("winch[44 122]");
    pty.expect("paste now");
    pty.write(&input);
    pty.expect(&format!("got[{}]", hex(&input)));
    let status = wait_with_limit(&mut child);
    assert_eq!(status.code(), Some(0), "terminal showed {:?}", pty.seen());
    let received = pty.received();
    assert!(
        contains(received, b"\x1b[?1049h\x1b[?2004h\x1b[?1000h"),
        "the modes did not reach the terminal as sent: {:?}",
        String::from_utf8_lossy(received)
    );
    assert!(
        contains(received, b"\x1b[?1000l\x1b[?2004l\x1b[?1049l"),
        "the modes were not switched off as sent: {:?}",
        String::from_utf8_lossy(received)
    );
    assert_eq!(pty.modes(), before, "outer terminal modes changed");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Widths of the reverse-video lines (`top`'s column header, padded to the
/// terminal's width) in what the terminal received.
fn header_widths(received: &[u8]) -> Vec<usize> {
    let text = String::from_utf8_lossy(received);
    text.split("\x1b[7m")
        .skip(1)
        .filter_map(|rest| rest.split('\x1b').next())
        .filter(|h| h.contains("COMMAND"))
        .map(|h| h.chars().count())
        .collect()
}

/// `top`, the image's full-screen program, draws for the terminal's size,
/// redraws for the new one when the outer terminal is resized (it asks for
/// the size only on SIGWINCH), and quits on `q`.
#[test]
fn top_redraws_for_a_resize_and_quits() {
    let mut env = TestEnv::new();
    with_terminal_settings(&mut env);
    let mut pty = TestTerminal::new(30, 100);
    let mut child = pty.spawn(&env, &["run", "test", "--", "top", "-d", "0.3"]);
    pty.expect("Tasks:");
    pty.expect("COMMAND");
    assert_eq!(header_widths(pty.received()).first(), Some(&100), "top's first screen: {:?}", String::from_utf8_lossy(pty.received()));
    pty.resize(40, 120);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !header_widths(pty.received()).contains(&120) {
        assert!(Instant::now() < deadline, "top never redrew 120 columns wide: {:?}", header_widths(pty.received()));
        pty.settle(Duration::from_millis(200));
    }
    pty.write(b"q");
    let status = wait_with_limit(&mut child);
    assert_eq!(status.code(), Some(0), "terminal showed {:?}", pty.seen());
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// Ctrl-C on the terminal interrupts the agent's foreground job (the
/// terminal's own signal, through runsc to the foreground process group).
#[test]
fn ctrl_c_interrupts_the_agent() {
    let env = TestEnv::new();
    let mut pty = TestTerminal::new(24, 80);
    let mut child =
        pty.spawn(&env, &["run", "test", "--", "sh", "-c", "trap 'echo got-int; exit 3' INT; echo armed; while :; do sleep 0.1; done"]);
    pty.expect("armed");
    pty.write(b"\x03");
    pty.expect("got-int");
    assert_eq!(wait_with_limit(&mut child).code(), Some(3), "terminal showed {:?}", pty.seen());
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// A `lazaret run` with piped stdio, its stdout read line by line.
struct Piped {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Piped {
    fn start(env: &TestEnv, args: &[&str]) -> Piped {
        use std::io::BufRead as _;
        use std::process::Stdio;
        let mut child =
            env.lazaret(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn lazaret");
        let lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        Piped { child, lines }
    }

    fn next_line(&mut self) -> String {
        self.lines.next().and_then(Result::ok).unwrap_or_default()
    }

    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    /// Sends `data` to stdin, then closes it and reads the rest of stdout,
    /// and waits.
    fn finish(mut self, data: &[u8]) -> (Option<i32>, Vec<String>) {
        send(self.child.stdin.as_mut().expect("stdin"), data);
        drop(self.child.stdin.take());
        let rest: Vec<String> = self.lines.by_ref().map_while(Result::ok).collect();
        (wait_with_limit(&mut self.child).code(), rest)
    }
}

/// A `sh -c` text that prints how many processes inside run a command line
/// starting with one of `commands` (spelled as patterns that do not match
/// the shell's own command line).
fn count_inside(commands: &[&str]) -> String {
    let pattern: Vec<String> = commands.iter().map(|c| format!("[{}]{}", &c[..1], &c[1..])).collect();
    format!("for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -cE '^({})'", pattern.join("|"))
}

/// How long a hung-up client may take to be gone: the client's grace for
/// its agent (3 s) and the session's end, with a wide margin. Without the
/// hangup handling it never exits; this turns that into a failure.
const HANGUP_LIMIT: Duration = Duration::from_secs(15);

/// Waits for a hung-up client up to [`HANGUP_LIMIT`]; past it, fails with
/// the env's processes and the client's kernel state (for the diagnosis),
/// having killed the client by its PID.
fn wait_hung_up(child: &mut std::process::Child, env: &TestEnv) -> std::process::ExitStatus {
    let deadline = Instant::now() + HANGUP_LIMIT;
    loop {
        if let Some(status) = child.try_wait().expect("waiting for lazaret") {
            return status;
        }
        if Instant::now() > deadline {
            let pid = child.id();
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
            let left = processes_mentioning(&env.runtime_dir.to_string_lossy());
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the hung-up client (pid {pid}) was still running after {HANGUP_LIMIT:?}: stat {state:?}, wchan {wchan:?}; the env's processes: {left:#?}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CPU time (user + system, in clock ticks) `pid` used so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rfind(')').map(|i| &stat[i + 1..]).unwrap_or("");
    // After the command name: state is field 3, utime 14 and stime 15.
    rest.split_whitespace().skip(11).take(2).filter_map(|t| t.parse::<u64>().ok()).sum()
}

/// The developer's terminal hangs up (its window closed, its ssh connection
/// dropped: the test closes the master) while the agent ignores SIGHUP, as
/// the `gemini` CLI does. The client forwards the hangup, stops relaying to
/// the dead terminal (it does not spin on it), ends the session after its
/// grace, the agent and a process it double-forked (ignoring SIGHUP too)
/// with it, and exits 129; another session of the Domain goes on and finds
/// none of them inside, and the Domain ends with it.
#[test]
fn a_hung_up_terminal_ends_an_agent_that_ignores_sighup() {
    let env = TestEnv::new();
    let count = count_inside(&["sleep 1021", "sleep 1022"]);
    let mut a = Piped::start(&env, &["run", "test", "--", "sh", "-c", &format!("echo up; read x; {count}; echo a-alive")]);
    assert_eq!(a.next_line(), "up");
    let mut pty = TestTerminal::new(24, 80);
    let mut c =
        pty.spawn(&env, &["run", "test", "--", "sh", "-c", "trap '' HUP; (setsid sleep 1021 &); echo c-up; while :; do sleep 1022; done"]);
    pty.expect("c-up");
    let started = Instant::now();
    pty.hang_up();
    // Well inside the grace (3 s): the client waits for its agent (only
    // an early end could fail this, never a slow machine).
    std::thread::sleep(Duration::from_secs(2));
    assert!(c.try_wait().expect("waiting for lazaret").is_none(), "the client gave its agent no grace after the hangup");
    let busy = cpu_ticks(c.id());
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_ticks(c.id()).saturating_sub(busy);
    let status = wait_hung_up(&mut c, &env);
    eprintln!("the hung-up client exited {:?} after the hangup", started.elapsed());
    assert_eq!(status.code(), Some(129), "the client's status after the hangup");
    // A relay that spun on the dead terminal would have used about a
    // second of CPU in that second (100 ticks).
    assert!(spent < 30, "the client used {spent} ticks of CPU in one second of its grace");
    let (status, rest) = a.finish(b"x\n");
    assert_eq!(rest, ["0", "a-alive"], "processes of the hung-up session left inside");
    assert_eq!(status, Some(0));
    env.assert_nothing_left();
    env.assert_journal_conforms();
}

/// SIGHUP to clients whose streams are pipes (no terminal; say the shell
/// that started them hung up): an agent that exits on SIGHUP does so with
/// its own status and output, one that ignores it is ended after the grace
/// (the client exits 129), and the Domain goes down with its last session.
#[test]
fn sighup_without_a_terminal_ends_an_agent_that_ignores_it() {
    let env = TestEnv::new();
    let mut stubborn =
        Piped::start(&env, &["run", "test", "--", "sh", "-c", "trap '' HUP; (setsid sleep 1023 &); echo up; while :; do sleep 1024; done"]);
    assert_eq!(stubborn.next_line(), "up");
    let mut polite =
        Piped::start(&env, &["run", "test", "--", "sh", "-c", "trap 'echo got-hup; exit 5' HUP; echo up; while :; do sleep 0.1; done"]);
    assert_eq!(polite.next_line(), "up");
    for client in [&stubborn, &polite] {
        nix::sys::signal::kill(client.pid(), nix::sys::signal::Signal::SIGHUP).expect("SIGHUP to the client");
    }
    // Each waited for first, so that reading their output cannot hang.
    assert_eq!(wait_hung_up(&mut polite.child, &env).code(), Some(5), "an agent that exits on SIGHUP keeps its status");
    assert_eq!(polite.next_line(), "got-hup");
    assert_eq!(wait_hung_up(&mut stubborn.child, &env).code(), Some(129), "the client's status after the hangup");
    assert_eq!(stubborn.next_line(), "", "the agent's stdout ends with it");
    env.assert_nothing_left();
    env.assert_journal_conforms();
}
