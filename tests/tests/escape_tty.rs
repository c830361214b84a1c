//! Escape corpus: terminal ioctls (issue 17). The session runs on a real
//! terminal the test drives (as tests/tests/terminal.rs does). A root
//! agent tries to inject input with TIOCSTI (into its stdin, /dev/tty,
//! /dev/console, /dev/tty0), to paste a console selection (TIOCLINUX), to
//! redirect the console (TIOCCONS), to change the line discipline
//! (TIOCSETD), to switch virtual consoles or their mode (VT_ACTIVATE,
//! KDSETMODE), to steal a controlling terminal (TIOCSCTTY), and to write to
//! the host's consoles. Every attempt must fail; injected text must reach
//! neither the agent's own input nor the client's terminal (neither as
//! echoed output nor as input left queued there); resizing its own
//! terminal from inside must not resize the client's.

use lazaret_tests::escape;
use lazaret_tests::pty::TestTerminal;
use lazaret_tests::*;

/// What every injection attempt types: a command line a shell would run.
const INJECTED: &str = "INJECTED-BY-AGENT";

const CASES: &[(&str, &str)] = &[
    ("tiocsti-stdin", "tool sti 0 \"$INJ\""),
    ("tiocsti-stdout", "tool sti 1 \"$INJ\""),
    ("tiocsti-dev-tty", "tool sti /dev/tty \"$INJ\""),
    ("tiocsti-dev-console", "tool sti /dev/console \"$INJ\""),
    ("tiocsti-dev-tty0", "tool sti /dev/tty0 \"$INJ\""),
    ("tiocsti-new-session", "setsid -w perl \"$TOOL\" sti /dev/tty \"$INJ\""),
    // A session leader that made its stdin its controlling terminal first
    // (TIOCSTI needs the caller's own controlling terminal).
    ("tiocsti-after-taking-ctty", "setsid -w -c perl \"$TOOL\" sti 0 \"$INJ\""),
    ("tioclinux-paste-selection", "tool ioctl 0 541c pack:C 3"),
    ("tioclinux-set-selection", "tool ioctl 0 541c pack:Cs5 2,1,1,80,1,0"),
    ("tioclinux-console-dev", "tool ioctl /dev/console 541c pack:C 3"),
    ("tioccons-stdin", "tool ioctl 0 541d none"),
    ("tioccons-dev-tty", "tool ioctl /dev/tty 541d none"),
    ("tiocsetd-slip", "tool ioctl 0 5423 pack:i 1"),
    ("vt-activate", "tool ioctl 0 5606 int 2"),
    ("kdsetmode-graphics", "tool ioctl 0 4b3a int 1"),
    ("tiocsctty-steal-console", "tool ioctl /dev/console 540e int 1"),
    // Without O_CREAT: root may create a plain file in the sandbox's /dev.
    ("write-dev-console", "tool open /dev/console w"),
    ("write-dev-tty0", "tool open /dev/tty0 w"),
    ("write-dev-ttyS0", "tool open /dev/ttyS0 w"),
];

#[test]
fn terminal_ioctls_never_reach_a_host_terminal() {
    let env = TestEnv::new();
    let mut script = format!("INJ='echo {INJECTED}\\r'\n");
    for (name, cmd) in CASES {
        script.push_str(&format!("must_fail {name} {cmd}\n"));
    }
    // Whatever was injected anywhere would arrive as input here (the
    // client relays its terminal's input to the agent).
    script.push_str(&format!(
        "must_fail injected-input-arrives bash -c 'read -r -t 2 l; case \"$l\" in *{INJECTED}*) exit 0;; esac; exit 1'\n"
    ));
    // Its own terminal the agent may resize; the client's stays as it is.
    script.push_str("tool ioctl 0 5414 pack:S4 99,199,0,0 >/dev/null; echo \"case own-resize: $(stty size)\"\n");
    let path = escape::install(&env, "tty", &script);
    let mut pty = TestTerminal::new(24, 80);
    let before = pty.modes();
    let mut child = pty.spawn(&env, &["run", "test", "--", "sh", &path.to_string_lossy()]);
    pty.expect("case script-finished: done");
    let status = wait_with_limit(&mut child);
    let shown = String::from_utf8_lossy(pty.received()).replace('\r', "\n").replace("\x1b[2K", "");
    println!("{shown}");
    assert_eq!(status.code(), Some(0), "{shown}");
    let results = escape::cases(&shown);
    let names: Vec<&str> = CASES.iter().map(|(n, _)| *n).chain(["injected-input-arrives"]).collect();
    escape::assert_refused(&results, &names, &shown);
    assert!(!shown.contains(INJECTED), "injected text reached the client's terminal as output (echoed):\n{shown}");
    assert_eq!(pty.window_size(), (24, 80), "the agent's resize reached the client's terminal");
    assert_eq!(pty.modes(), before, "the client's terminal modes changed");
    let pending = pty.pending_input();
    assert!(
        !String::from_utf8_lossy(&pending).contains(INJECTED),
        "injected input is queued on the client's terminal: {:?}",
        String::from_utf8_lossy(&pending)
    );
    env.assert_nothing_left();
}
