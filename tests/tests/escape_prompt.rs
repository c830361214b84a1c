//! The escalation prompt is what it says (issue 32, property 6): whatever
//! the agent printed before its request, and whatever mode it left the
//! terminal in, the developer sees the real request and only it, and the
//! developer's keys do what the prompt says.
//!
//! The agent here does what a hostile agent would: it writes bytes to its
//! terminal (from a file in the workspace, so that every byte is exactly
//! the test's), then runs `lazaret-escalate`. The test renders everything
//! the developer's terminal received with a terminal emulator
//! ([`lazaret_tests::screen`]) and looks at the screen: the prompt's rows,
//! and nothing else, in default colours and attributes, with nothing hiding
//! or displacing them; and the keys are typed as a terminal in the modes
//! the stream left it in would send them.

use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use lazaret_tests::escalation::*;
use lazaret_tests::pty::TestTerminal;
use lazaret_tests::screen::{Key, Screen};
use lazaret_tests::*;

const ROWS: u16 = 30;
const COLS: u16 = 160;
/// The end of a prompt's first screen (its keys).
const PROMPT_KEYS: &str = "[n] deny";
/// The key line, up to the time left.
const KEY_LINE: &str = "[y] run once  [a] always in this Domain  [e] edit  [n] deny  (";
const HEADER: &str = "── lazaret: the agent asks to run a command on the host ──";
const DENIED: i32 = 77;
/// Longer than the client's prompt arming time (300 ms).
const ARMING: Duration = Duration::from_millis(700);

/// A developer env whose agent is root inside.
fn env() -> TestEnv {
    developer_env("user = \"root\"\n")
}

/// One request the agent makes: `before` written to its terminal first,
/// `after` written 1.5 s after the request (while the prompt is up), and
/// the command it asks for, `sh -c 'echo host-ran-NAME'`.
struct Attack {
    name: &'static str,
    before: Vec<u8>,
    after: Vec<u8>,
}

impl Attack {
    fn new(name: &'static str, before: &[u8]) -> Attack {
        Attack { name, before: before.to_vec(), after: Vec::new() }
    }

    fn command(&self) -> String {
        format!("sh -c 'echo host-ran-{}'", self.name)
    }

    fn why(&self) -> String {
        format!("attack {}", self.name)
    }
}

/// The agent's script: for each attack, its bytes, then the request (the
/// bytes after it from a background job), then `rc-NAME=STATUS`. A `WINCH`
/// trap redraws a "full-screen program" when `tui` is set.
fn install(env: &TestEnv, attacks: &[Attack], tui: bool) -> PathBuf {
    let mut script = String::from("set -u\n");
    if tui {
        script.push_str("trap 'printf \"\\033[H\\033[2JTUI-REDRAWN\\r\\n\"' WINCH\n");
    }
    for a in attacks {
        let before = env.workspace.join(format!(".attack-{}-before", a.name));
        let after = env.workspace.join(format!(".attack-{}-after", a.name));
        fs::write(&before, &a.before).expect("writing the attack");
        fs::write(&after, &a.after).expect("writing the attack");
        script.push_str(&format!(
            "cat {before}\nsleep 0.5\n(sleep 1.5; cat {after}) &\nlazaret-escalate --justification '{why}' -- sh -c 'echo host-ran-{name}' &\n\
             pid=$!\nwhile kill -0 $pid 2>/dev/null; do sleep 0.05; done\nwait $pid; echo \"rc-{name}=$?\"\nsleep 0.2\n",
            before = before.display(),
            after = after.display(),
            why = a.why(),
            name = a.name,
        ));
    }
    script.push_str("echo script-done\n");
    let path = env.workspace.join(".attack.sh");
    fs::write(&path, script).expect("writing the script");
    path
}

/// Waits for the prompt (and `settle` more, for anything else to
/// arrive), and renders the screen.
fn prompt_screen(pty: &mut TestTerminal, settle: Duration) -> Screen {
    pty.expect(PROMPT_KEYS);
    pty.screen_after(settle)
}

/// How long a prompt is watched before its screen is checked: past the
/// moment the agent writes its `after` bytes, if it has any.
fn watch_time(attack: &Attack) -> Duration {
    Duration::from_millis(if attack.after.is_empty() { 400 } else { 2500 })
}

/// The rows the prompt for `attack` must show, and nothing else.
fn expected_rows(env: &TestEnv, session: &str, attack: &Attack) -> Vec<String> {
    vec![
        HEADER.to_string(),
        "  profile: test".to_string(),
        format!("  session: {session}"),
        format!("  cwd:     {}", env.workspace.display()),
        format!("  command: {}", attack.command()),
        format!("  why:     {}", attack.why()),
    ]
}

/// What is wrong with the screen, if anything: the developer must see the
/// request's rows, the key line and nothing else, all in default colours
/// and attributes, printed with nothing that hides or displaces them, and
/// the cursor.
fn problems(screen: &Screen, want: &[String]) -> Vec<String> {
    let mut bad = Vec::new();
    let rows = screen.rows();
    let visible: Vec<(usize, &String)> = rows.iter().enumerate().filter(|(_, r)| !r.is_empty()).collect();
    let texts: Vec<&str> = visible.iter().map(|(_, r)| r.as_str()).collect();
    let mut expected: Vec<&str> = want.iter().map(String::as_str).collect();
    let key_line_ok = texts.last().is_some_and(|l| l.starts_with(KEY_LINE));
    if !key_line_ok {
        bad.push(format!("the last row shown is not the key line: {:?}", texts.last()));
    }
    let shown = if key_line_ok { &texts[..texts.len() - 1] } else { &texts[..] };
    if shown != expected.as_slice() {
        bad.push(format!("the rows shown are not exactly the request's: got {shown:#?}, want {expected:#?}"));
    }
    expected.push(KEY_LINE);
    for (i, row) in &visible {
        if !screen.row_plain(*i) {
            bad.push(format!("row {i} ({row:?}) is not in default colours and attributes"));
        }
    }
    for field in want {
        match screen.printed_plainly(field) {
            Some(true) => {}
            Some(false) => bad.push(format!("{field:?} was printed hidden or displaced ({:?})", screen.modes())),
            None => bad.push(format!("{field:?} was never printed in one piece")),
        }
    }
    if !screen.cursor_visible() {
        bad.push("the cursor is hidden".into());
    }
    bad
}

/// Runs `attacks` in one session; on each prompt, checks the screen and
/// answers with `keys` (typed as the emulated terminal sends them), then
/// expects `rc-NAME=STATUS`. Returns the failures, by attack.
fn run_attacks(attacks: &[Attack], keys: &[Key], status: i32) -> Vec<String> {
    let env = env();
    let script = install(&env, attacks, false);
    let mut pty = TestTerminal::new(ROWS, COLS);
    let path = script.display().to_string();
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "sh", &path]);
    let mut failures = Vec::new();
    for a in attacks {
        let screen = prompt_screen(&mut pty, watch_time(a));
        let session = sessions(&env).first().cloned().unwrap_or_default();
        let bad = problems(&screen, &expected_rows(&env, &session, a));
        if !bad.is_empty() {
            failures.push(format!("{}: {}\nscreen:\n{}", a.name, bad.join("\n  "), screen.dump()));
        }
        std::thread::sleep(ARMING);
        for &k in keys {
            pty.write(&pty.screen().key(k));
        }
        let rc = format!("rc-{}=", a.name);
        let before = pty.expect_within(&rc, Duration::from_secs(30));
        let got: String = pty.settle(Duration::from_millis(300)).chars().take_while(char::is_ascii_digit).collect();
        if got != status.to_string() {
            failures.push(format!("{}: the request ended with {got:?}, want {status} (output before: {before:?})", a.name));
        }
    }
    pty.expect("script-done");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0), "terminal showed {:?}", pty.seen());
    env.assert_nothing_left();
    env.assert_journal_conforms();
    failures
}

fn assert_none(failures: Vec<String>) {
    assert!(failures.is_empty(), "{} attack(s) succeeded:\n\n{}", failures.len(), failures.join("\n\n"));
}

/// Something on the screen first, as an agent's session would have.
const NOISE: &[u8] = b"agent: working on it\r\nagent: $ make test\r\nok\r\n";
/// A full reset (RIS), so that what an earlier attack in the same session
/// left behind does not count for the next one.
const RESET: &[u8] = b"\x1bc";

/// `attack` after a reset and some ordinary output.
fn with_noise(attack: &[u8]) -> Vec<u8> {
    [RESET, NOISE, attack].concat()
}

/// Escape sequences and strings left open: the prompt's text would be
/// swallowed into a title, a device control string, or the sequence's
/// parameters.
#[test]
fn an_escape_sequence_or_string_left_open_does_not_swallow_the_prompt() {
    let attacks = [
        Attack::new("osc", &with_noise(b"\x1b]0;title ")),
        Attack::new("osc8", &with_noise(b"\x1b]8;;https://example.invalid/\x1b\\link")),
        Attack::new("dcs", &with_noise(b"\x1bP1$r")),
        Attack::new("apc", &with_noise(b"\x1b_Gf=100;")),
        Attack::new("pm", &with_noise(b"\x1b^privacy ")),
        Attack::new("sos", &with_noise(b"\x1bXstart of string ")),
        Attack::new("csi", &with_noise(b"\x1b[38;5")),
        Attack::new("esc", &with_noise(b"\x1b")),
        Attack::new("charset", &with_noise(b"\x1b(")),
    ];
    assert_none(run_attacks(&attacks, &[Key::Char('n')], DENIED));
}

/// Modes that hide, recolour, confine, move or garble text.
#[test]
fn a_terminal_mode_left_behind_does_not_hide_or_move_the_prompt() {
    let attacks = [
        Attack::new("scroll-region", &with_noise(b"\x1b[1;2r\x1b[1;1H")),
        Attack::new("origin-mode", &with_noise(b"\x1b[20;21r\x1b[?6h\x1b[1;1H")),
        Attack::new("lr-margins", &with_noise(b"\x1b[?69h\x1b[1;12s")),
        Attack::new("insert-mode", &with_noise(b"\x1b[4h")),
        Attack::new("dec-graphics-g0", &with_noise(b"\x1b(0")),
        Attack::new("dec-graphics-so", &with_noise(b"\x1b)0\x0e")),
        Attack::new("conceal", &with_noise(b"\x1b[8m")),
        Attack::new("same-colours", &with_noise(b"\x1b[30;40m")),
        Attack::new("default-colours", &with_noise(b"\x1b]10;#000000\x07\x1b]11;#000000\x07")),
        Attack::new("reverse-video", &with_noise(b"\x1b[7m")),
        Attack::new("reverse-screen", &with_noise(b"\x1b[?5h")),
        Attack::new("no-autowrap", &with_noise(b"\x1b[?7l")),
        Attack::new("hidden-cursor", &with_noise(b"\x1b[?25l")),
        Attack::new("synchronized-output", &with_noise(b"\x1b[?2026h")),
        Attack::new("alternate-screen", &with_noise(b"\x1b[?1049h\x1b[H\x1b[2Jfull screen program")),
        Attack::new("newline-mode", &with_noise(b"\x1b[20h")),
        Attack::new("latin1", &with_noise(b"\x1b%@")),
    ];
    assert_none(run_attacks(&attacks, &[Key::Char('n')], DENIED));
}

/// A fake prompt drawn by the agent, above where the real one appears,
/// beside it, or where the cursor is left to overwrite it.
#[test]
fn a_fake_prompt_drawn_by_the_agent_is_not_shown_with_the_real_one() {
    let fake = "── lazaret: the agent asks to run a command on the host ──\r\n  profile: test\r\n  session: s-0000\r\n  cwd:     /home/dev/project\r\n  command: git status\r\n  why:     just looking\r\n";
    let attacks = [
        Attack::new("fake-above", &with_noise(fake.as_bytes())),
        Attack::new("fake-at-bottom", &[RESET, b"\x1b[H\x1b[2J\x1b[23;1H", fake.as_bytes()].concat()),
        Attack::new("fake-right", &with_noise(b"\x1b[5;100Hcommand: git status\x1b[6;100Hwhy: just looking\x1b[1;1H")),
    ];
    assert_none(run_attacks(&attacks, &[Key::Char('n')], DENIED));
}

/// What the agent writes while the prompt is up (here a fake prompt over
/// the real one) is held back until the prompt is closed.
#[test]
fn output_after_the_request_is_held_back_while_the_prompt_is_up() {
    let mut a = Attack::new("after", &with_noise(b""));
    a.after = b"\x1b[H\x1b[2J\x1b[?25l\x1b[8m  command: FAKE-LATE git status\x1b[m\r\n".to_vec();
    assert_none(run_attacks(&[a], &[Key::Char('y')], 0));
}

/// Keyboard modes the agent set (kitty keyboard flags, modifyOtherKeys,
/// newline mode, application cursor and keypad, bracketed paste): the
/// developer's keys still mean what the prompt says, and the agent gets
/// its modes back afterwards.
#[test]
fn keyboard_modes_do_not_change_what_the_developer_s_keys_do() {
    let modes: &[u8] = b"\x1b[>4;2m\x1b[=15;1u\x1b[20h\x1b[?1h\x1b=\x1b[?2004h";
    let deny = Attack::new("ctrl-c", &with_noise(modes));
    let approve = Attack::new("y-key", &with_noise(modes));
    let mut failures = run_attacks(&[deny], &[Key::CtrlC], DENIED);
    failures.extend(run_attacks(&[approve], &[Key::Char('y')], 0));
    assert_none(failures);
}

/// Enter in the editor, with newline mode on (Enter sends CR LF), checks
/// the edit once: it does not also answer the confirmation.
#[test]
fn newline_mode_does_not_make_enter_answer_twice() {
    let env = env();
    let a = Attack::new("lnm-edit", &with_noise(b"\x1b[20h"));
    let script = install(&env, std::slice::from_ref(&a), false);
    let mut pty = TestTerminal::new(ROWS, COLS);
    let path = script.display().to_string();
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "sh", &path]);
    prompt_screen(&mut pty, watch_time(&a));
    std::thread::sleep(ARMING);
    pty.write(&pty.screen().key(Key::Char('e')));
    pty.expect("edit (");
    pty.settle(Duration::from_millis(300));
    pty.write(&pty.screen().key(Key::Enter));
    pty.expect("run this?");
    let later = pty.settle(Duration::from_millis(800)).to_string();
    assert!(!later.contains("not run; the command is still"), "one Enter checked the edit and answered the confirmation: {later:?}");
    pty.write(&pty.screen().key(Key::Char('y')));
    pty.expect("rc-lnm-edit=0");
    pty.expect("script-done");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0), "terminal showed {:?}", pty.seen());
    env.assert_nothing_left();
}

/// A full-screen program (on the alternate screen) gets its screen back:
/// after the prompt the terminal is still on the alternate screen, the
/// program is told to redraw (SIGWINCH), and its keyboard modes are its
/// own again.
#[test]
fn a_full_screen_program_is_redrawn_after_the_prompt() {
    let env = env();
    let a = Attack::new("tui", b"MAIN-SCREEN-TEXT\r\n\x1b[?1049h\x1b[H\x1b[2J\x1b[>4;2m\x1b[?2004hTUI-FRAME\r\n");
    let script = install(&env, std::slice::from_ref(&a), true);
    let mut pty = TestTerminal::new(ROWS, COLS);
    let path = script.display().to_string();
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "sh", &path]);
    let screen = prompt_screen(&mut pty, watch_time(&a));
    let session = sessions(&env).first().cloned().unwrap_or_default();
    let bad = problems(&screen, &expected_rows(&env, &session, &a));
    assert!(bad.is_empty(), "{}\nscreen:\n{}", bad.join("\n"), screen.dump());
    std::thread::sleep(ARMING);
    pty.write(&pty.screen().key(Key::Char('y')));
    pty.expect("rc-tui=0");
    pty.expect("TUI-REDRAWN");
    let screen = pty.screen_after(Duration::from_millis(300));
    let rows = screen.visible_rows();
    assert_eq!(rows.first().map(String::as_str), Some("TUI-REDRAWN"), "the program's redraw is not on top:\n{}", screen.dump());
    assert!(!rows.iter().any(|r| r.contains("MAIN-SCREEN-TEXT")), "the terminal left the program's alternate screen:\n{}", screen.dump());
    assert_eq!(screen.modes().modify_other_keys, 2, "the program's modifyOtherKeys was not given back");
    pty.expect("script-done");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0), "terminal showed {:?}", pty.seen());
    env.assert_nothing_left();
}

/// A request longer than the screen: the header and the start of the
/// command stay on the screen (the fields are cut to fit, with the
/// marker), so what the command does first cannot be scrolled away by
/// padding after it.
#[test]
fn a_long_request_does_not_push_the_start_of_the_command_off_the_screen() {
    let env = env();
    let padding = "x".repeat(3000);
    let why = "because ".repeat(120);
    let script = env.workspace.join(".long.sh");
    fs::write(&script, format!("lazaret-escalate --justification '{why}' -- sh -c 'echo DANGER-START; : {padding}'\necho \"rc=$?\"\n"))
        .expect("writing the script");
    let mut pty = TestTerminal::new(24, 80);
    let path = script.display().to_string();
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "sh", &path]);
    let screen = prompt_screen(&mut pty, Duration::from_millis(400));
    let rows = screen.visible_rows();
    assert_eq!(rows.first().map(String::as_str), Some(HEADER), "the header is not on the screen:\n{}", screen.dump());
    assert!(
        rows.iter().any(|r| r.starts_with("  command: sh -c 'echo DANGER-START; : xxx")),
        "the start of the command is not on the screen:\n{}",
        screen.dump()
    );
    assert!(rows.iter().any(|r| r.contains("…[+")), "nothing says the request was cut:\n{}", screen.dump());
    assert!(rows.last().is_some_and(|r| r.starts_with(KEY_LINE)), "the key line is not last:\n{}", screen.dump());
    std::thread::sleep(ARMING);
    pty.write(b"n");
    pty.expect(&format!("rc={DENIED}"));
    assert_eq!(wait_with_limit(&mut child).code(), Some(0), "terminal showed {:?}", pty.seen());
    env.assert_nothing_left();
}

/// An escape sequence the agent's output was in the middle of when the
/// prompt appeared (the prompt ends it) is written again afterwards, so
/// that the agent's next output finishes it as meant: `ESC [3` + `1mRED`
/// is red text, not the text `1mRED`. (`lazaret-escalate`'s own status
/// line goes to /dev/null: its first letter would end the sequence.)
#[test]
fn a_sequence_cut_by_the_prompt_is_finished_by_the_agent_afterwards() {
    let env = env();
    let script = env.workspace.join(".cut.sh");
    fs::write(&script, "printf 'before\\r\\n\\033[3'\nlazaret-escalate -- true 2>/dev/null\nprintf '1mRED\\033[m after\\r\\n'\n")
        .expect("writing the script");
    let mut pty = TestTerminal::new(ROWS, COLS);
    let path = script.display().to_string();
    let mut child = tty_spawn(&pty, &env, &["run", "test", "--", "sh", &path]);
    prompt_screen(&mut pty, Duration::from_millis(400));
    std::thread::sleep(ARMING);
    pty.write(b"y");
    pty.expect("after");
    assert_eq!(wait_with_limit(&mut child).code(), Some(0), "terminal showed {:?}", pty.seen());
    let screen = pty.screen();
    let rows = screen.rows();
    let row = rows.iter().position(|r| r.contains("RED")).unwrap_or_else(|| panic!("no RED on the screen:\n{}", screen.dump()));
    assert!(!rows[row].contains("1mRED"), "the rest of the agent's sequence was shown as text:\n{}", screen.dump());
    assert!(!screen.row_plain(row), "RED is not coloured:\n{}", screen.dump());
    assert!(rows.iter().any(|r| r == "before"), "the agent's main screen did not come back:\n{}", screen.dump());
    env.assert_nothing_left();
}
