//! `lazaret run` under a pseudo-terminal that the test drives (FR-8, DX-5):
//! the window size inside follows the outer one, and the outer terminal's
//! modes are exactly restored after exit, also when the agent is killed.

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
