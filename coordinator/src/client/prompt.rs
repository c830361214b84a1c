//! The escalation prompt on the developer's terminal (FR-5, DX-4), as a pure
//! state machine: a [`PromptRequest`] and the developer's keys in, the bytes
//! to show and in the end a [`PromptDecision`] out. No I/O and no clock:
//! [`terminal`](super::terminal) writes what this returns, feeds it the keys
//! and tells it the time left.
//!
//! Everything in the request came from the agent. Every field goes through
//! [`inert`] (escape sequences, CR, controls, invisible and bidi characters
//! become visible escapes; long fields are cut with a marker), so the agent
//! can neither forge nor hide prompt text. Each line the prompt writes ends
//! by erasing the rest of the row, and the block starts by erasing the
//! screen below it, so nothing the agent left on the screen shows beside or
//! under the prompt's own text. The block also starts by cancelling any
//! escape sequence the agent's output left unfinished, resetting colours
//! and character set, and turning mouse reporting off (a mouse report is
//! bytes such as `y` on the keyboard); the final text restores the modes it
//! saved.
//!
//! Keys: `y` runs once, `a` runs and approves this exact argv for the rest
//! of the Domain's life, `e` edits, `n`, Enter, Ctrl-C, Ctrl-D and Esc deny
//! (deny is the safe default). Escape sequences (arrow keys, mouse reports,
//! bracketed-paste markers) and every form of terminal reply (CSI, SS3 and
//! the control strings, 7-bit or C1, raw or UTF-8) are recognised and
//! ignored, also when a read splits them. `y` and `a` decide only when they
//! arrive alone in a read: the agent can make the terminal answer (an
//! answerback, a report), and an answer arrives as one burst.

use std::time::Duration;

use lazaret_protocol::display::{inert, needs_escape};
use lazaret_protocol::shell::{quote, quote_argv, split};
use lazaret_protocol::wire::{PromptDecision, PromptRequest};

use super::vtstate::StreamState;

/// Longest profile or session name shown (bytes, after escaping).
const NAME_MAX: usize = 200;
/// Longest working directory shown.
const CWD_MAX: usize = 1000;
/// Longest command line shown.
const COMMAND_MAX: usize = 4000;
/// Longest justification shown.
const WHY_MAX: usize = 1000;
/// Longest single argument shown when confirming an edit.
const TOKEN_MAX: usize = 1000;
/// Longest parse error or withdrawal reason shown.
const MESSAGE_MAX: usize = 300;
/// Most bytes the editor holds (typing beyond it is ignored); the request's
/// own line is always loaded whole.
const EDITOR_MAX: usize = 256 * 1024;
/// Terminal width assumed until told otherwise.
const DEFAULT_WIDTH: usize = 80;
/// Columns before a field's value (`  command: `).
const LABEL_COLUMNS: usize = 11;
/// The fewest bytes a field is cut to so that the first screen fits the
/// terminal's height.
const FIELD_MIN: usize = 40;

/// Written first: CAN and ST end any escape sequence or string the
/// agent's output left open, which would otherwise swallow the prompt's
/// text (into a title, a device control string, a sequence's parameters);
/// then the modes the prompt resets are saved (XTSAVE: exact where the
/// terminal has it; [`StreamState`] tracks them for the rest).
const CANCEL_AND_SAVE: &[u8] = b"\x18\x1b\\\x1b[?1;5;6;7;25;66;69;9;1000;1001;1002;1003;1004;1005;1006;1015;1016;2004;2026;9001s";
/// The prompt's own screen when the agent is on the main screen: the
/// alternate screen, which saves the main screen and its cursor (with
/// colours, character sets and origin mode) and gives them back unchanged
/// afterwards.
const OWN_SCREEN: &[u8] = b"\x1b[?1049h";
/// Back to the agent's main screen.
const LEAVE_OWN_SCREEN: &[u8] = b"\x1b[?1049l";
/// Everything the agent's output can have set that changes what text looks
/// like, where it goes, or what the developer's keys send, set to the
/// terminal's defaults, one by one (not DECSTR, which also resets the
/// saved cursor the alternate screen gives back in some terminals):
/// colours and attributes, default foreground and background colours (OSC
/// 110, 111), the ASCII character set in G0 to G3 and G0 in use, replace
/// mode, no newline mode, no local echo (SRM), normal cursor keys and
/// keypad, normal screen (not reverse video), absolute cursor addressing,
/// no margins (top/bottom, left/right), autowrap, a visible cursor,
/// synchronized output ended, the main status display and no status line
/// shown (DECSSDT 0: the agent could have written a fake prompt there),
/// UTF-8 (in ISO 8859-1 the bytes of a character in a field could be C1
/// controls), 7-bit replies (S7C1T: the terminal's answers start with ESC,
/// not a C1 byte), no mouse, focus or paste reporting, no modifyOtherKeys,
/// no win32-input-mode, and a kitty keyboard mode with no flags pushed (keys
/// arrive as plain bytes); then the screen is cleared, so that nothing the
/// agent drew shows beside the prompt. The status line and 8-bit replies
/// are not given back afterwards (neither XTSAVE nor [`StreamState`] covers
/// them): both are off by default, and the agent can set them again.
const RESET: &[u8] = b"\x1b F\x1b%G\x1b[0m\x1b]110\x1b\\\x1b]111\x1b\\\x1b(B\x1b)B\x1b*B\x1b+B\x0f\
\x1b[4l\x1b[20l\x1b[12h\x1b[?1l\x1b>\x1b[?66l\x1b[?5l\x1b[?6l\x1b[?69l\x1b[r\x1b[?7h\x1b[?25h\x1b[?2026l\x1b[0$}\x1b[0$~\
\x1b[?9l\x1b[?1000l\x1b[?1001l\x1b[?1002l\x1b[?1003l\x1b[?1004l\x1b[?1005l\x1b[?1006l\x1b[?1015l\x1b[?1016l\x1b[?2004l\x1b[?9001l\
\x1b[>4;0m\x1b[>0u\x1b[H\x1b[2J";
/// Clears the screen, cursor at the top left.
const CLEAR: &[u8] = b"\x1b[H\x1b[2J";
/// Written after the prompt (after the agent's tracked modes): the kitty
/// keyboard mode popped, the saved modes restored (XTRESTORE).
const GIVE_BACK: &[u8] = b"\x1b[<u\x1b[?1;5;6;7;25;66;69;9;1000;1001;1002;1003;1004;1005;1006;1015;1016;2004;2026;9001r";
/// Makes the cursor's row single width and height (DECSWL), at the start
/// of each row the prompt writes: a double-size row would show half of it.
const SINGLE_WIDTH: &str = "\x1b#5";
/// Erases the rest of the row, so no earlier text shows beside a line.
const ERASE_ROW_REST: &str = "\x1b[K";
/// Returns to the start of the row and erases it, to redraw the input line.
const REDRAW_ROW: &str = "\r\x1b[2K\x1b#5";

/// The prompt's first row.
const HEADER: &str = "── lazaret: the agent asks to run a command on the host ──";
/// The keys of the first screen.
const CHOICES: &str = "[y] run once  [a] always in this Domain  [e] edit  [n] deny";
/// The keys of the confirmation after an edit.
const CONFIRM: &str = "run this? [y] yes  [e] edit again  [n] no, back to the prompt";

/// What the terminal should do after some input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Step {
    /// Write these bytes; the prompt stays up.
    Redraw(Vec<u8>),
    /// The developer decided: send the decision, write the final text and
    /// close the prompt.
    Answer(PromptDecision, Vec<u8>),
    /// Nothing to show.
    Nothing,
}

/// Which screen the prompt is on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mode {
    /// The request and the keys.
    Choose,
    /// The one-line editor, with its text.
    Edit(String),
    /// An edited command, parsed, waiting for yes or no.
    Confirm(Vec<String>),
}

/// One escalation prompt on the developer's terminal.
#[derive(Debug)]
pub(super) struct Prompt {
    request: PromptRequest,
    mode: Mode,
    keys: Keys,
    /// The terminal's width in columns.
    width: usize,
    /// Whole seconds until the prompt times out, as last shown.
    secs_left: u64,
    /// The terminal's height in rows (0: unknown).
    height: usize,
    /// The agent's program is on the alternate screen: the prompt draws
    /// there (it cannot be given back; the program is asked to redraw).
    over_alternate: bool,
    /// The bytes that set again the modes the agent set ([`StreamState::restore`]).
    agent_modes: Vec<u8>,
}

impl Prompt {
    /// A prompt for `request`, on its first screen.
    pub(super) fn new(request: PromptRequest) -> Prompt {
        let secs_left = request.timeout_secs;
        Prompt {
            request,
            mode: Mode::Choose,
            keys: Keys::default(),
            width: DEFAULT_WIDTH,
            secs_left,
            height: 0,
            over_alternate: false,
            agent_modes: Vec::new(),
        }
    }

    /// The prompt drawn over a terminal the agent's output left in `state`:
    /// on the agent's alternate screen if it is there, and the agent's
    /// modes given back when it closes.
    pub(super) fn over(mut self, state: &StreamState) -> Prompt {
        self.over_alternate = state.alternate_screen();
        self.agent_modes = state.restore();
        self
    }

    /// Whether the prompt is drawn on the agent's alternate screen, which
    /// its program must redraw afterwards.
    pub(super) fn over_alternate(&self) -> bool {
        self.over_alternate
    }

    /// The Escalation Request ID this prompt answers.
    pub(super) fn request_id(&self) -> &str {
        &self.request.request
    }

    /// Tells the prompt the terminal's width (0: unknown, keep the last).
    pub(super) fn set_width(&mut self, cols: u16) {
        if cols > 0 {
            self.width = usize::from(cols);
        }
    }

    /// Tells the prompt the terminal's height (0: unknown, keep the last).
    pub(super) fn set_height(&mut self, rows: u16) {
        if rows > 0 {
            self.height = usize::from(rows);
        }
    }

    /// The whole prompt as it stands: the bytes to write when it appears.
    pub(super) fn render(&self) -> Vec<u8> {
        let mut out = Out::default();
        out.bytes.extend_from_slice(CANCEL_AND_SAVE);
        if !self.over_alternate {
            out.bytes.extend_from_slice(OWN_SCREEN);
        }
        out.bytes.extend_from_slice(RESET);
        self.screen(&mut out);
        out.bytes
    }

    /// The whole prompt again on its own screen, which it already set up
    /// (after a resize): the screen cleared and drawn anew.
    pub(super) fn redraw(&self) -> Vec<u8> {
        let mut out = Out::default();
        out.bytes.extend_from_slice(CLEAR);
        self.screen(&mut out);
        out.bytes
    }

    /// The rows of the current screen, from the top.
    fn screen(&self, out: &mut Out) {
        let [cwd, command, why] = self.limits();
        out.line(HEADER);
        out.line(&format!("  profile: {}", inert(&self.request.profile, NAME_MAX)));
        out.line(&format!("  session: {}", inert(&self.request.session, NAME_MAX)));
        out.line(&self.cwd_line(cwd));
        out.line(&self.command_line(command));
        out.line(&self.why_line(why));
        match &self.mode {
            Mode::Choose => {}
            Mode::Edit(_) => self.edit_intro(out),
            Mode::Confirm(argv) => self.confirm_intro(out, argv),
        }
        self.input_line(out);
    }

    /// The most bytes of the working directory, the command and the
    /// justification shown, so that the first screen fits the terminal's
    /// height: a field that would push the header (or the start of the
    /// command) off the top is cut, with the marker, the justification
    /// first, then the directory, then the command, each to no fewer than
    /// [`FIELD_MIN`] bytes. Rows are counted high (every character that is
    /// not ASCII as two columns).
    fn limits(&self) -> [usize; 3] {
        let mut max = [CWD_MAX, COMMAND_MAX, WHY_MAX];
        if self.height == 0 {
            return max;
        }
        let width = self.width.max(1);
        let rows = |text: &str| columns(text).div_ceil(width).max(1);
        let fixed = rows(HEADER)
            + rows(&format!("  profile: {}", inert(&self.request.profile, NAME_MAX)))
            + rows(&format!("  session: {}", inert(&self.request.session, NAME_MAX)))
            + rows(&self.input_text());
        let room = self.height.saturating_sub(fixed);
        let field_rows = |max: &[usize; 3]| [rows(&self.cwd_line(max[0])), rows(&self.command_line(max[1])), rows(&self.why_line(max[2]))];
        for field in [2, 0, 1] {
            loop {
                let now = field_rows(&max);
                if now.iter().sum::<usize>() <= room {
                    return max;
                }
                let shorter = ((now[field] - 1) * width).saturating_sub(LABEL_COLUMNS + 1).max(FIELD_MIN);
                if now[field] <= 1 || shorter >= max[field] {
                    break;
                }
                max[field] = shorter;
            }
        }
        max
    }

    /// `  cwd:     ...`, at most `max` bytes of it.
    fn cwd_line(&self, max: usize) -> String {
        format!("  cwd:     {}", inert(&self.request.cwd, max))
    }

    /// `  why:     ...`, at most `max` bytes of it.
    fn why_line(&self, max: usize) -> String {
        format!("  why:     {}", inert(&self.request.justification, max))
    }

    /// The developer's keys (raw bytes from the terminal, in raw mode).
    /// Keys after the one that decides are dropped: they were typed at the
    /// prompt and must reach neither the agent nor a next prompt.
    ///
    /// A key that approves (`y`, `a`) counts only when it is the whole read:
    /// the agent can make the developer's terminal answer (ENQ makes PuTTY
    /// send its answerback `PuTTY`; a report may end in `y`), and such an
    /// answer arrives as one burst of bytes, while a person's key press
    /// arrives alone. In a burst it is ignored and the prompt stays up (the
    /// other keys in it still count: they deny, or edit, which only leads to
    /// a confirmation that again needs a lone `y`).
    pub(super) fn on_input(&mut self, bytes: &[u8]) -> Step {
        self.on_input_after(bytes, true)
    }

    /// [`Prompt::on_input`] for a read that came `after_quiet` or not: with
    /// input just before it (the terminal's clock decides), a lone key is
    /// no key press either: an answer the terminal split across reads ends
    /// so (`PuTT`, then `Y`).
    pub(super) fn on_input_after(&mut self, bytes: &[u8], after_quiet: bool) -> Step {
        let keys = self.keys.decode(bytes);
        let alone = bytes.len() == 1 && after_quiet;
        let mut out = Out::default();
        let mut editor_dirty = false;
        for key in keys {
            if let Some(decision) = self.on_key(key, alone, &mut out, &mut editor_dirty) {
                let mut text = out.bytes;
                text.extend_from_slice(&self.final_text(&decision));
                return Step::Answer(decision, text);
            }
        }
        if editor_dirty {
            self.input_line(&mut out);
        }
        if out.bytes.is_empty() { Step::Nothing } else { Step::Redraw(out.bytes) }
    }

    /// Tells the prompt how long until it times out. Returns the input line
    /// redrawn when the whole seconds shown changed and the line fits on one
    /// row (a wrapped line cannot be redrawn in place).
    pub(super) fn tick(&mut self, left: Duration) -> Option<Vec<u8>> {
        let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        if secs == self.secs_left {
            return None;
        }
        self.secs_left = secs;
        let text = self.input_text();
        if columns(&text) >= self.width {
            return None;
        }
        let mut out = Out::default();
        out.raw(REDRAW_ROW);
        out.raw(&text);
        Some(out.bytes)
    }

    /// The final text when the coordinator withdrew the prompt (`reason`
    /// comes from the coordinator, but may quote the agent: shown inert).
    pub(super) fn withdrawn(&self, reason: &str) -> Vec<u8> {
        self.closing(&format!("prompt withdrawn: {}", inert(reason, MESSAGE_MAX)))
    }

    /// The final text when the prompt ends without an answer for a reason
    /// of the client's own (`why` is Lazaret's text, shown as it is).
    pub(super) fn abandoned(&self, why: &str) -> Vec<u8> {
        self.closing(&format!("prompt closed: {why}"))
    }

    /// The text that closes the prompt after `decision`.
    fn final_text(&self, decision: &PromptDecision) -> Vec<u8> {
        self.closing(match decision {
            PromptDecision::Approve => "approved: runs once",
            PromptDecision::ApproveForDomain => {
                "approved: runs, and this exact command runs without asking for the rest of this Domain's life"
            }
            PromptDecision::Edit { .. } => "approved: the edited command runs once",
            PromptDecision::Deny => "denied",
        })
    }

    /// The last line of a prompt, then the terminal given back: the
    /// prompt cleared away, the agent's modes set again, and the agent's
    /// main screen back as it was (or, on its alternate screen, a clear
    /// one, which its program is asked to redraw).
    fn closing(&self, what: &str) -> Vec<u8> {
        let mut out = Out::default();
        out.raw("\r\n");
        out.line(&format!("── lazaret: {what} ──"));
        out.bytes.extend_from_slice(CLEAR);
        out.bytes.extend_from_slice(&self.agent_modes);
        out.bytes.extend_from_slice(GIVE_BACK);
        if !self.over_alternate {
            out.bytes.extend_from_slice(LEAVE_OWN_SCREEN);
        }
        out.bytes
    }

    /// One key on the current screen; the decision when it decides.
    /// `alone`: the key is the whole read, so it may approve
    /// ([`Prompt::on_input`]).
    fn on_key(&mut self, key: Key, alone: bool, out: &mut Out, editor_dirty: &mut bool) -> Option<PromptDecision> {
        match &mut self.mode {
            Mode::Choose => match key {
                Key::Char('y' | 'Y') if alone => Some(PromptDecision::Approve),
                Key::Char('a' | 'A') if alone => Some(PromptDecision::ApproveForDomain),
                Key::Char('n' | 'N') | Key::Enter | Key::Interrupt | Key::EndOfInput | Key::Escape => Some(PromptDecision::Deny),
                Key::Char('e' | 'E') => {
                    self.mode = Mode::Edit(quote_argv(&self.request.argv));
                    out.raw("\r\n");
                    self.edit_intro(out);
                    self.input_line(out);
                    None
                }
                _ => None,
            },
            Mode::Edit(line) => {
                match key {
                    Key::Char(c) => {
                        if line.len() + c.len_utf8() <= EDITOR_MAX {
                            line.push(c);
                            *editor_dirty = true;
                        }
                    }
                    Key::Backspace => {
                        *editor_dirty |= line.pop().is_some();
                    }
                    Key::ClearLine => {
                        *editor_dirty |= !line.is_empty();
                        line.clear();
                    }
                    Key::Interrupt => {
                        // Abandon the edit; deny stays one key away.
                        self.mode = Mode::Choose;
                        *editor_dirty = false;
                        out.raw("\r\n");
                        out.line("edit abandoned; the command is still:");
                        self.back_to_choose(out);
                    }
                    Key::Enter => {
                        let line = line.clone();
                        if *editor_dirty {
                            self.input_line(out);
                            *editor_dirty = false;
                        }
                        self.submit_edit(&line, out);
                    }
                    // A lone Esc is ignored here: it may be the first half
                    // of an arrow key whose rest arrives in the next read.
                    Key::EndOfInput | Key::Escape | Key::Ignored => {}
                }
                None
            }
            Mode::Confirm(argv) => match key {
                Key::Char('y' | 'Y') if alone => {
                    Some(if *argv == self.request.argv { PromptDecision::Approve } else { PromptDecision::Edit { argv: argv.clone() } })
                }
                Key::Char('e' | 'E') => {
                    self.mode = Mode::Edit(quote_argv(argv));
                    out.raw("\r\n");
                    self.edit_intro(out);
                    self.input_line(out);
                    None
                }
                Key::Char('n' | 'N') | Key::Enter | Key::Interrupt | Key::EndOfInput => {
                    self.mode = Mode::Choose;
                    out.raw("\r\n");
                    out.line("not run; the command is still:");
                    self.back_to_choose(out);
                    None
                }
                _ => None,
            },
        }
    }

    /// Enter in the editor: the line parsed into arguments, shown one per
    /// line for confirmation, or the reason it cannot be.
    fn submit_edit(&mut self, line: &str, out: &mut Out) {
        out.raw("\r\n");
        match split(line) {
            Ok(argv) if argv.is_empty() => {
                out.line("  cannot run that: the command is empty");
                self.input_line(out);
            }
            Err(e) => {
                out.line(&format!("  cannot run that: {}", inert(&e.to_string(), MESSAGE_MAX)));
                self.input_line(out);
            }
            Ok(argv) => {
                self.mode = Mode::Confirm(argv);
                if let Mode::Confirm(argv) = &self.mode {
                    self.confirm_intro(out, argv);
                }
                self.input_line(out);
            }
        }
    }

    /// The requested command again, then the keys.
    fn back_to_choose(&self, out: &mut Out) {
        out.line(&self.command_line(self.limits()[1]));
        self.input_line(out);
    }

    /// The line that introduces the editor.
    fn edit_intro(&self, out: &mut Out) {
        out.line("edit the command (shell quoting, no expansion; Enter checks it, Ctrl-U clears, Ctrl-C goes back):");
    }

    /// The parsed arguments of an edit, one per line.
    fn confirm_intro(&self, out: &mut Out, argv: &[String]) {
        if argv == self.request.argv.as_slice() {
            out.line("the command, unchanged (as requested), one argument per line:");
        } else {
            out.line("the edited command, one argument per line:");
        }
        for (i, arg) in argv.iter().enumerate() {
            out.line(&format!("  [{i}] {}", notation(&quote(arg), TOKEN_MAX)));
        }
    }

    /// `  command: ...`, the argv shell-quoted, at most `max` bytes of it.
    fn command_line(&self, max: usize) -> String {
        format!("  command: {}", notation(&quote_argv(&self.request.argv), max))
    }

    /// Redraws the input line: the keys (or the editor) and the time left.
    fn input_line(&self, out: &mut Out) {
        out.raw(REDRAW_ROW);
        out.raw(&self.input_text());
    }

    /// The input line's text; the cursor stays at its end.
    fn input_text(&self) -> String {
        let left = time_left(self.secs_left);
        match &self.mode {
            Mode::Choose => format!("{CHOICES}  ({left} left) "),
            Mode::Confirm(_) => format!("{CONFIRM}  ({left} left) "),
            Mode::Edit(line) => {
                let prefix = format!("edit ({left} left)> ");
                let room = self.width.saturating_sub(columns(&prefix) + 1);
                format!("{prefix}{}", tail_fitting(line, room))
            }
        }
    }
}

/// Bytes being put together for the terminal.
#[derive(Default)]
struct Out {
    bytes: Vec<u8>,
}

impl Out {
    /// Lazaret's own text or control sequences, as they are.
    fn raw(&mut self, text: &str) {
        self.bytes.extend_from_slice(text.as_bytes());
    }

    /// One whole line (already inert where the agent controls it): the rest
    /// of the row erased, then CR LF (the terminal is in raw mode).
    fn line(&mut self, text: &str) {
        self.raw(SINGLE_WIDTH);
        self.raw(text);
        self.raw(ERASE_ROW_REST);
        self.raw("\r\n");
    }
}

/// `secs` for the developer: "42 s", "3 min 05 s", "2 h 07 min" (seconds
/// up to 99, so a one-minute timeout counts down as seconds).
fn time_left(secs: u64) -> String {
    match secs {
        0..100 => format!("{secs} s"),
        100..3600 => format!("{} min {:02} s", secs / 60, secs % 60),
        _ => format!("{} h {:02} min", secs / 3600, secs % 3600 / 60),
    }
}

/// Shell notation made by [`quote`] or [`quote_argv`], for display, cut to
/// `max` bytes with [`inert`]'s marker. That notation writes every character
/// that needs escaping as a `$'...'` escape already, and its backslashes
/// are part of it (doubling them, as [`inert`] does, would show another
/// command); should it ever contain such a character, [`inert`] is the
/// safety net.
fn notation(text: &str, max: usize) -> String {
    if text.chars().any(needs_escape) {
        return inert(text, max);
    }
    if text.len() <= max {
        return text.to_owned();
    }
    let marker = |left_out: usize| format!("…[+{left_out} bytes]");
    let mut end = max.saturating_sub(marker(text.len()).len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{}", &text[..end], marker(text.len() - end))
}

/// The editor's text for display: each character that needs escaping as
/// its visible escape, everything else (backslashes included) as typed, so
/// the developer sees the notation they edit. (A raw invisible character
/// cannot pass [`split`] anyway, which says how to write it.)
fn editor_visible(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if needs_escape(c) {
            shown.push_str(&inert(c.encode_utf8(&mut [0; 4]), usize::MAX));
        } else {
            shown.push(c);
        }
    }
    shown
}

/// Columns `text` may take: ASCII one, anything else counted as two, so an
/// estimate is never short (a wide character takes two).
fn columns(text: &str) -> usize {
    text.chars().map(|c| if c.is_ascii() { 1 } else { 2 }).sum()
}

/// The end of the editor's `line`, made visible, in at most `room` columns; `…`
/// first when the start is cut off.
fn tail_fitting(line: &str, room: usize) -> String {
    // Every character shows as at least one column: the last `room` of
    // them are all that can be seen, and escaping only those is cheap.
    let start = line.char_indices().rev().nth(room).map(|(i, c)| i + c.len_utf8()).unwrap_or(0);
    let shown = editor_visible(&line[start..]);
    let width = columns(&shown);
    if start == 0 && width <= room {
        return shown;
    }
    let budget = room.saturating_sub(2);
    let mut used = 0;
    let mut from = shown.len();
    for (i, c) in shown.char_indices().rev() {
        let w = if c.is_ascii() { 1 } else { 2 };
        if used + w > budget {
            break;
        }
        used += w;
        from = i;
    }
    format!("…{}", &shown[from..])
}

/// A key the prompt understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    /// A printable character.
    Char(char),
    /// CR or LF.
    Enter,
    /// DEL or BS.
    Backspace,
    /// Ctrl-C.
    Interrupt,
    /// Ctrl-D.
    EndOfInput,
    /// Ctrl-U.
    ClearLine,
    /// Esc on its own (not the start of a sequence, as far as can be seen).
    Escape,
    /// Anything else: other controls, invalid UTF-8.
    Ignored,
}

/// Where the key decoder is inside an escape sequence or a character.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Seq {
    /// Between keys.
    #[default]
    Ground,
    /// After ESC; `announced` once it was reported as a lone Esc (at the
    /// end of a read), so that the rest of a split sequence is still eaten
    /// but Esc is not reported twice.
    Escape { announced: bool },
    /// Inside a CSI (`ESC [` or C1 0x9b): how many parameter bytes so far.
    Csi { params: usize },
    /// After SS3 (`ESC O` or C1 0x8f): one more byte.
    Ss3,
    /// Inside a control string, a terminal reply's form: DCS, OSC, APC, PM
    /// or SOS (`ESC P`, `ESC ]`, `ESC _`, `ESC ^`, `ESC X` or C1 0x90, 0x9d,
    /// 0x9f, 0x9e, 0x98), up to ST (`ESC \`, or 0x9c raw or in UTF-8) or,
    /// for OSC (`osc`), BEL. Its text is never keys, however long it is;
    /// CAN and SUB cancel it, and Ctrl-C, Ctrl-D, CR and LF (which no reply
    /// contains) end it and count as keys, so that a developer whose Alt-]
    /// started one can still deny.
    Str { osc: bool, at: InStr },
    /// After `ESC [ M` with no parameters: an X10 mouse report, whose three
    /// characters (button, column, row) are data, not keys.
    Mouse { left: u8 },
}

/// Where a control string's decoder is inside the string's text.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum InStr {
    /// Between characters.
    #[default]
    Text,
    /// After ESC: `\` makes ST.
    Escape,
    /// After 0xc2: 0x9c makes ST in UTF-8.
    C2,
    /// Inside a UTF-8 character, with this many bytes to come (0x9c there
    /// is part of the character, not ST).
    Rest(u8),
}

/// Longest CSI accepted before the decoder gives up on it.
const CSI_MAX: usize = 32;

/// Turns terminal input bytes into [`Key`]s, across reads.
#[derive(Debug, Default)]
struct Keys {
    seq: Seq,
    /// The start of a UTF-8 character whose rest has not arrived yet.
    partial: Vec<u8>,
}

impl Keys {
    /// The keys in `bytes`. An ESC that ends the read is reported as Esc
    /// (nothing says more is coming), but what follows in the next read is
    /// still treated as the rest of its sequence if it looks like one.
    fn decode(&mut self, bytes: &[u8]) -> Vec<Key> {
        let mut keys = Vec::new();
        for &b in bytes {
            self.byte(b, &mut keys);
        }
        if self.seq == (Seq::Escape { announced: false }) {
            keys.push(Key::Escape);
            self.seq = Seq::Escape { announced: true };
        }
        keys
    }

    fn byte(&mut self, b: u8, keys: &mut Vec<Key>) {
        match self.seq {
            Seq::Ground => self.ground(b, keys),
            Seq::Escape { announced } => match b {
                b'[' => self.seq = Seq::Csi { params: 0 },
                b'O' => self.seq = Seq::Ss3,
                b']' => self.seq = Seq::Str { osc: true, at: InStr::Text },
                b'P' | b'_' | b'^' | b'X' => self.seq = Seq::Str { osc: false, at: InStr::Text },
                // A stray ST: a control, not Esc and a key.
                b'\\' => self.seq = Seq::Ground,
                0x1b => {
                    if !announced {
                        keys.push(Key::Escape);
                    }
                    self.seq = Seq::Escape { announced: false };
                }
                _ => {
                    if !announced {
                        keys.push(Key::Escape);
                    }
                    self.seq = Seq::Ground;
                    self.ground(b, keys);
                }
            },
            Seq::Csi { params } => match b {
                0x20..=0x3f if params < CSI_MAX => self.seq = Seq::Csi { params: params + 1 },
                b'M' if params == 0 => self.seq = Seq::Mouse { left: 3 },
                0x40..=0x7e => self.seq = Seq::Ground,
                0x1b => self.seq = Seq::Escape { announced: false },
                // Malformed or overlong: drop it and what it swallowed.
                _ => {
                    self.seq = Seq::Ground;
                    keys.push(Key::Ignored);
                }
            },
            Seq::Ss3 => self.seq = Seq::Ground,
            Seq::Str { osc, at } => self.in_string(osc, at, b, keys),
            Seq::Mouse { left } => {
                // UTF-8 continuation bytes (the 1005 encoding) belong to the
                // character before them.
                if (0x80..0xc0).contains(&b) {
                    return;
                }
                if left > 0 {
                    self.seq = Seq::Mouse { left: left - 1 };
                } else {
                    self.seq = Seq::Ground;
                    self.ground(b, keys);
                }
            }
        }
    }

    /// Byte `b` of a control string's text, `at` where the text was.
    fn in_string(&mut self, osc: bool, at: InStr, b: u8, keys: &mut Vec<Key>) {
        match (at, b) {
            (InStr::Escape, b'\\') | (InStr::C2, 0x9c) => {
                self.seq = Seq::Ground;
                return;
            }
            // ESC and anything else: the string ended, a new sequence
            // begins (not reported as Esc: the ESC was the terminal's).
            (InStr::Escape, _) => {
                self.seq = Seq::Escape { announced: true };
                self.byte(b, keys);
                return;
            }
            (InStr::C2, 0x80..=0xbf) => {
                self.seq = Seq::Str { osc, at: InStr::Text };
                return;
            }
            (InStr::Rest(n), 0x80..=0xbf) => {
                self.seq = Seq::Str { osc, at: if n > 1 { InStr::Rest(n - 1) } else { InStr::Text } };
                return;
            }
            // Between characters, or a character cut short: `b` starts
            // the next.
            _ => {}
        }
        let at = match b {
            0x1b => InStr::Escape,
            0x9c => {
                self.seq = Seq::Ground;
                return;
            }
            0x07 if osc => {
                self.seq = Seq::Ground;
                return;
            }
            0x18 | 0x1a => {
                self.seq = Seq::Ground;
                keys.push(Key::Ignored);
                return;
            }
            0x03 | 0x04 | b'\r' | b'\n' => {
                self.seq = Seq::Ground;
                self.ground(b, keys);
                return;
            }
            0xc2 => InStr::C2,
            0xc3..=0xf4 => InStr::Rest(u8::try_from(utf8_len(b) - 1).unwrap_or(1)),
            _ => InStr::Text,
        };
        self.seq = Seq::Str { osc, at };
    }

    /// A C1 control (raw, or decoded from UTF-8): the introducers of CSI,
    /// SS3 and the control strings start them; any other is no key.
    fn c1(&mut self, c: u8, keys: &mut Vec<Key>) {
        self.seq = match c {
            0x9b => Seq::Csi { params: 0 },
            0x8f => Seq::Ss3,
            0x9d => Seq::Str { osc: true, at: InStr::Text },
            0x90 | 0x98 | 0x9e | 0x9f => Seq::Str { osc: false, at: InStr::Text },
            _ => {
                keys.push(Key::Ignored);
                return;
            }
        };
    }

    fn ground(&mut self, b: u8, keys: &mut Vec<Key>) {
        if !self.partial.is_empty() {
            if (0x80..0xc0).contains(&b) {
                self.partial.push(b);
                if self.partial.len() == utf8_len(self.partial[0]) {
                    let c = std::str::from_utf8(&self.partial).ok().and_then(|s| s.chars().next());
                    self.partial.clear();
                    match c {
                        // A C1 control in UTF-8 (c2 80 to c2 9f).
                        Some(c @ '\u{80}'..='\u{9f}') => self.c1(u8::try_from(u32::from(c)).unwrap_or(0), keys),
                        _ => keys.push(c.map_or(Key::Ignored, Key::Char)),
                    }
                }
                return;
            }
            // A character cut short: dropped.
            self.partial.clear();
            keys.push(Key::Ignored);
        }
        let key = match b {
            0x1b => {
                self.seq = Seq::Escape { announced: false };
                return;
            }
            b'\r' | b'\n' => Key::Enter,
            0x7f | 0x08 => Key::Backspace,
            0x03 => Key::Interrupt,
            0x04 => Key::EndOfInput,
            0x15 => Key::ClearLine,
            0x20..=0x7e => Key::Char(char::from(b)),
            0x80..=0x9f => {
                self.c1(b, keys);
                return;
            }
            0xc2..=0xf4 => {
                self.partial.push(b);
                return;
            }
            _ => Key::Ignored,
        };
        keys.push(key);
    }
}

/// The length of the UTF-8 character that starts with `lead`.
fn utf8_len(lead: u8) -> usize {
    match lead {
        0xc2..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

/// The prompt driven from outside the client, for the fuzz targets in
/// `fuzz/` (docs/fuzzing.md): not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    use std::time::Duration;

    use lazaret_protocol::wire::{PromptDecision, PromptRequest};

    use super::{
        CANCEL_AND_SAVE, CLEAR, ERASE_ROW_REST, GIVE_BACK, LEAVE_OWN_SCREEN, OWN_SCREEN, Prompt, REDRAW_ROW, RESET, SINGLE_WIDTH, Step,
    };

    /// Something that happens to a prompt.
    #[derive(Debug, Clone)]
    pub enum Event {
        /// Bytes from the developer's terminal.
        Input(Vec<u8>),
        /// The terminal's width changed.
        Width(u16),
        /// Time left until the prompt times out.
        Tick(Duration),
    }

    /// The control sequences the prompt writes of its own (everything else
    /// it writes is text): the start and end blocks, row erasing and
    /// redrawing, single-width rows (a sequence that contains another comes
    /// before it).
    pub const OWN_SEQUENCES: [&[u8]; 9] = [
        CANCEL_AND_SAVE,
        OWN_SCREEN,
        RESET,
        CLEAR,
        GIVE_BACK,
        LEAVE_OWN_SCREEN,
        REDRAW_ROW.as_bytes(),
        ERASE_ROW_REST.as_bytes(),
        SINGLE_WIDTH.as_bytes(),
    ];

    /// Shows a prompt for `request` and feeds it `events` until it decides:
    /// every chunk of bytes it writes, in order, and the decision, if any.
    /// The closing text after a withdrawal with `withdrawn` is written last
    /// when no decision was made.
    pub fn drive_prompt(request: PromptRequest, events: &[Event], withdrawn: &str) -> (Vec<Vec<u8>>, Option<PromptDecision>) {
        let mut prompt = Prompt::new(request);
        let mut written = vec![prompt.render()];
        for event in events {
            match event {
                Event::Input(bytes) => match prompt.on_input(bytes) {
                    Step::Redraw(bytes) => written.push(bytes),
                    Step::Answer(decision, bytes) => {
                        written.push(bytes);
                        return (written, Some(decision));
                    }
                    Step::Nothing => {}
                },
                Event::Width(cols) => {
                    prompt.set_width(*cols);
                    written.push(prompt.render());
                }
                Event::Tick(left) => written.extend(prompt.tick(*left)),
            }
        }
        written.push(prompt.withdrawn(withdrawn));
        (written, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(argv: &[&str], justification: &str) -> PromptRequest {
        PromptRequest {
            request: "r-1".into(),
            profile: "dev".into(),
            session: "s-0123abcd".into(),
            cwd: "/home/me/project".into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            justification: justification.into(),
            timeout_secs: 60,
        }
    }

    fn prompt() -> Prompt {
        Prompt::new(request(&["git", "push", "origin", "fix-123"], "push the fix"))
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// The bytes after the sanitising prefix: what the agent's text could
    /// have influenced, plus the prompt's own erase and redraw sequences.
    fn body(bytes: &[u8]) -> &[u8] {
        bytes.strip_prefix(start().as_slice()).unwrap_or(bytes)
    }

    /// What a prompt over the main screen starts with.
    fn start() -> Vec<u8> {
        [CANCEL_AND_SAVE, OWN_SCREEN, RESET].concat()
    }

    /// What a prompt over the main screen, with no modes of the agent's
    /// to give back, ends with.
    fn end() -> String {
        text(&[CLEAR, GIVE_BACK, LEAVE_OWN_SCREEN].concat())
    }

    /// `bytes` with the prompt's own control sequences removed: what is
    /// left must contain no ESC, no CR that is not a line end, and no
    /// invisible characters.
    fn without_own_controls(bytes: &[u8]) -> String {
        let mut s = text(body(bytes));
        for own in [ERASE_ROW_REST, REDRAW_ROW, SINGLE_WIDTH] {
            s = s.replace(own, "");
        }
        s.strip_suffix(end().as_str()).map(str::to_owned).unwrap_or(s)
    }

    fn answer(step: Step) -> (PromptDecision, String) {
        match step {
            Step::Answer(d, t) => (d, text(&t)),
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    fn redraw(step: Step) -> String {
        match step {
            Step::Redraw(b) => text(&b),
            other => panic!("expected a redraw, got {other:?}"),
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_first_screen_names_everything() {
        let shown = text(&prompt().render());
        assert!(shown.starts_with(&text(&start())));
        for expected in [
            "── lazaret: the agent asks to run a command on the host ──",
            "  profile: dev\x1b[K\r\n",
            "  session: s-0123abcd\x1b[K\r\n",
            "  cwd:     /home/me/project\x1b[K\r\n",
            "  command: git push origin fix-123\x1b[K\r\n",
            "  why:     push the fix\x1b[K\r\n",
            "[y] run once  [a] always in this Domain  [e] edit  [n] deny  (60 s left) ",
        ] {
            assert!(shown.contains(expected), "{expected:?} missing from {shown:?}");
        }
        // The key line is last, with the cursor after it.
        assert!(shown.ends_with("(60 s left) "));
    }

    #[test]
    fn the_prompt_has_a_clean_screen_of_its_own_and_gives_the_main_screen_back() {
        let mut p = prompt();
        let shown = p.render();
        // Open strings ended first, then the alternate screen, then every
        // mode reset and the screen cleared, before any text.
        assert!(shown.starts_with(&start()), "{:?}", text(&shown));
        assert!(RESET.ends_with(CLEAR));
        // Every row single width, from its start.
        let after_start = text(body(&shown));
        let rows: Vec<&str> = after_start.split("\r\n").collect();
        assert!(rows.len() >= 7, "{rows:?}");
        for row in &rows {
            assert!(row.starts_with(SINGLE_WIDTH) || row.starts_with(REDRAW_ROW), "{row:?}");
        }
        let (_, t) = answer(p.on_input(b"n"));
        assert!(t.ends_with(&end()), "{t:?}");
        assert!(!p.over_alternate());
    }

    #[test]
    fn over_the_alternate_screen_the_prompt_stays_there_and_gives_the_modes_back() {
        let mut state = StreamState::default();
        state.feed(b"\x1b[?1049h\x1b[>4;2m\x1b[?2004h\x1b[3;9r");
        let mut p = prompt().over(&state);
        assert!(p.over_alternate());
        let shown = text(&p.render());
        assert!(shown.starts_with(&text(&[CANCEL_AND_SAVE, RESET].concat())), "{shown:?}");
        assert!(!shown.contains("\x1b[?1049h"), "{shown:?}");
        let (_, t) = answer(p.on_input(b"n"));
        let expected = format!("{}\x1b[?2004h\x1b[>4;2m\x1b[3;9r{}", text(CLEAR), text(GIVE_BACK));
        assert!(t.ends_with(&expected), "{t:?}");
        assert!(!t.contains("\x1b[?1049l"), "{t:?}");
        // On the main screen, the same modes are given back before leaving
        // the prompt's screen (the cursor comes back with the main screen).
        let mut state = StreamState::default();
        state.feed(b"\x1b[?2004h\x1b[3;9r");
        let mut p = prompt().over(&state);
        let (_, t) = answer(p.on_input(b"y"));
        assert!(t.ends_with(&format!("\x1b[?2004h\x1b[3;9r{}{}", text(GIVE_BACK), text(LEAVE_OWN_SCREEN))), "{t:?}");
    }

    /// The rows `shown` takes on a terminal `width` columns wide, counted
    /// as the prompt counts them.
    fn rows_taken(shown: &[u8], width: usize) -> usize {
        let mut s = text(body(shown));
        for own in [ERASE_ROW_REST, REDRAW_ROW, SINGLE_WIDTH] {
            s = s.replace(own, "");
        }
        s.split("\r\n").map(|row| columns(row).div_ceil(width).max(1)).sum()
    }

    #[test]
    fn the_first_screen_fits_the_terminal_s_height_with_the_start_of_the_command() {
        let padding = "x".repeat(3000);
        let mut r = request(&["sh", "-c", &format!("DANGER-START; : {padding}")], &"why ".repeat(250));
        r.cwd = format!("/{}", "d".repeat(900));
        for (height, width) in [(24, 80), (30, 120), (12, 60)] {
            let mut p = Prompt::new(r.clone());
            p.set_width(width);
            p.set_height(height);
            let shown = p.render();
            assert!(
                rows_taken(&shown, usize::from(width)) <= usize::from(height),
                "{height}x{width}: {} rows: {:?}",
                rows_taken(&shown, usize::from(width)),
                text(&shown)
            );
            let shown = text(&shown);
            assert!(shown.contains("── lazaret: the agent asks"), "{shown:?}");
            assert!(shown.contains("  command: sh -c 'DANGER-START; : xxxx"), "{shown:?}");
            // The justification and the command are cut, and say so.
            for label in ["  command: ", "  why:     "] {
                let line = shown.split("\r\n").find(|l| l.trim_start_matches(SINGLE_WIDTH).starts_with(label)).unwrap_or_default();
                assert!(line.contains("…[+"), "{label:?} not cut: {line:?}");
            }
            // Redrawn after a resize: the same rows, without the start.
            assert!(text(&p.redraw()).starts_with(&format!("{}{SINGLE_WIDTH}── lazaret", text(CLEAR))));
        }
        // The justification is cut first: a short command stays whole.
        let mut p = Prompt::new(request(&["git", "push"], &"why ".repeat(250)));
        p.set_width(80);
        p.set_height(12);
        let shown = text(&p.render());
        assert!(shown.contains("  command: git push\x1b[K"), "{shown:?}");
        assert!(rows_taken(shown.as_bytes(), 80) <= 12);
        // Room enough: nothing cut.
        let mut p = Prompt::new(r.clone());
        p.set_width(200);
        p.set_height(50);
        let shown = text(&p.render());
        assert!(shown.contains(&format!("{padding}'")) && !shown.contains("…[+"), "{shown:?}");
        // Height unknown: the fixed limits.
        let p = Prompt::new(r);
        assert!(text(&p.render()).contains(&"x".repeat(2900)));
    }

    #[test]
    fn arguments_are_shown_one_token_each_shell_quoted() {
        let p = Prompt::new(request(&["git", "commit", "-m", "fix it; rm -rf ~", "it's"], ""));
        let shown = text(&p.render());
        assert!(shown.contains("  command: git commit -m 'fix it; rm -rf ~' 'it'\\''s'\x1b[K"), "{shown:?}");
    }

    #[test]
    fn a_hostile_justification_is_inert() {
        let evil =
            "ok\x1b[2J\x1b]52;c;ZWNobyBldmls\x07\rFAKE: approved\u{202e}desrever\u{200b}\u{2066}x\u{2069}\x1bP1$r\x1b\\\u{9b}31m\nnext";
        let p = Prompt::new(request(&["true"], evil));
        let shown = p.render();
        // The prompt's own start clears the screen; after it, nothing may.
        let raw = text(body(&shown));
        for forbidden in
            ["\x1b[2J", "\x1b]52", "\x07", "\rFAKE", "\u{202e}", "\u{200b}", "\u{2066}", "\u{2069}", "\x1bP", "\u{9b}", "\nnext"]
        {
            assert!(!raw.contains(forbidden), "{forbidden:?} reached the terminal: {raw:?}");
        }
        let rest = without_own_controls(&shown);
        assert!(!rest.contains('\x1b'), "an ESC of the agent's: {rest:?}");
        assert!(!rest.replace("\r\n", "").contains('\r'), "a bare CR: {rest:?}");
        assert!(!rest.replace("\r\n", "").contains('\n'), "a bare LF: {rest:?}");
        // What it said is still there, visibly.
        assert!(raw.contains("  why:     ok\\x1b[2J\\x1b]52;c;ZWNobyBldmls\\x07\\rFAKE: approved\\u{202e}desrever\\u{200b}"), "{raw:?}");
    }

    #[test]
    fn hostile_text_in_every_field_is_inert() {
        let mut r = request(&["x\x1b[1;1Hy", "\u{202e}gnp.exe"], "j");
        r.profile = "p\x1b]0;title\x07".into();
        r.session = "s\rS".into();
        r.cwd = "/w\x1b[8m/hidden".into();
        let shown = Prompt::new(r).render();
        let rest = without_own_controls(&shown);
        assert!(!rest.contains('\x1b') && !rest.contains('\u{202e}') && !rest.contains('\x07'), "{rest:?}");
        assert!(!rest.replace("\r\n", "").contains('\r'), "{rest:?}");
        let raw = text(&shown);
        assert!(raw.contains("  command: $'x\\x1b[1;1Hy' $'\\u202egnp.exe'"), "{raw:?}");
        assert!(raw.contains("  session: s\\rS"), "{raw:?}");
    }

    #[test]
    fn overlong_fields_are_cut_with_a_marker() {
        let long = "w".repeat(5000);
        let mut r = request(&["echo", &"a".repeat(10_000)], &long);
        r.cwd = format!("/{}", "d".repeat(3000));
        let shown = text(&Prompt::new(r).render());
        let field = |name: &str| {
            shown.lines().map(|l| l.trim_start_matches(SINGLE_WIDTH)).find(|l| l.starts_with(name)).map(str::to_owned).unwrap_or_default()
        };
        let why = field("  why:");
        assert!(why.contains("…[+") && why.len() < WHY_MAX + 40, "{} bytes", why.len());
        let cmd = field("  command:");
        assert!(cmd.contains("…[+") && cmd.len() < COMMAND_MAX + 40, "{} bytes", cmd.len());
        let cwd = field("  cwd:");
        assert!(cwd.contains("…[+") && cwd.len() < CWD_MAX + 40, "{} bytes", cwd.len());
    }

    #[test]
    fn the_answer_keys() {
        for (keys, expected) in [
            (&b"y"[..], PromptDecision::Approve),
            (b"Y", PromptDecision::Approve),
            (b"a", PromptDecision::ApproveForDomain),
            (b"A", PromptDecision::ApproveForDomain),
            (b"n", PromptDecision::Deny),
            (b"N", PromptDecision::Deny),
            (b"\r", PromptDecision::Deny),
            (b"\n", PromptDecision::Deny),
            (b"\x03", PromptDecision::Deny),
            (b"\x04", PromptDecision::Deny),
            (b"\x1b", PromptDecision::Deny),
        ] {
            let (decision, final_text) = answer(prompt().on_input(keys));
            assert_eq!(decision, expected, "keys {keys:?}");
            assert!(final_text.contains("── lazaret: "), "{final_text:?}");
            assert!(final_text.ends_with(&end()));
        }
        let (_, t) = answer(prompt().on_input(b"n"));
        assert!(t.contains("lazaret: denied"), "{t:?}");
        let (_, t) = answer(prompt().on_input(b"y"));
        assert!(t.contains("approved: runs once"), "{t:?}");
    }

    #[test]
    fn other_keys_do_nothing() {
        let mut p = prompt();
        for keys in
            [&b"x"[..], b"q", b" ", b"\t", b"1", "é".as_bytes(), b"\x1b[A", b"\x1bOB", b"\x1b[1;5C", b"\x1b[200~", b"\x1b[<0;89;10M"]
        {
            assert_eq!(p.on_input(keys), Step::Nothing, "keys {keys:?}");
        }
        assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve);
    }

    #[test]
    fn the_first_deciding_key_wins_and_the_rest_is_dropped() {
        // An approving key in a burst is not a key press: `n` decides.
        let mut p = prompt();
        assert_eq!(answer(p.on_input(b"xyn")).0, PromptDecision::Deny);
        let mut p = prompt();
        assert_eq!(answer(p.on_input(b"nya")).0, PromptDecision::Deny);
    }

    #[test]
    fn a_lone_key_right_after_other_input_does_not_approve() {
        let mut p = prompt();
        // The last byte of an answerback the terminal split across reads.
        assert_eq!(p.on_input_after(b"PuTT", true), Step::Nothing);
        assert_eq!(p.on_input_after(b"Y", false), Step::Nothing, "a split answerback approved");
        assert_eq!(answer(p.on_input_after(b"y", true)).0, PromptDecision::Approve);
    }

    #[test]
    fn an_answerback_in_one_read_does_not_approve() {
        // ENQ makes PuTTY answer `PuTTY`: one burst, ending in `Y`.
        let mut p = prompt();
        assert_eq!(p.on_input(b"PuTTY"), Step::Nothing);
        assert_eq!(p.on_input(b"ay"), Step::Nothing);
        assert_eq!(answer(p.on_input(b"\ry")).0, PromptDecision::Deny);
        // On the confirmation too.
        let mut p = prompt();
        p.on_input(b"e");
        p.on_input(b"\r");
        assert!(matches!(p.mode, Mode::Confirm(_)));
        assert_eq!(p.on_input(b"xY"), Step::Nothing);
        assert!(matches!(p.mode, Mode::Confirm(_)));
        // A person's key press, alone in its read, still decides.
        assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve);
        let mut p = prompt();
        assert_eq!(p.on_input(b"PuTTY"), Step::Nothing);
        assert_eq!(answer(p.on_input(b"a")).0, PromptDecision::ApproveForDomain);
    }

    #[test]
    fn an_8_bit_reply_does_not_approve() {
        // xterm's DECRPM reply with 8-bit controls: C1 CSI, raw or UTF-8.
        for reply in [&b"\x9b?1;2$y"[..], b"\xc2\x9b?1;2$y"] {
            let mut p = prompt();
            assert_eq!(p.on_input(reply), Step::Nothing, "{reply:?}");
            assert_eq!(Keys::default().decode(reply), [], "{reply:?}");
            // Split before its final byte, which arrives alone.
            let mut p = prompt();
            assert_eq!(p.on_input(&reply[..reply.len() - 1]), Step::Nothing, "{reply:?}");
            assert_eq!(p.on_input(b"y"), Step::Nothing, "{reply:?}");
            // The decoder is back between keys.
            assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve);
        }
    }

    #[test]
    fn an_osc_reply_neither_approves_nor_denies() {
        for reply in [&b"\x1b]11;rgb:0000/0000/0000\x1b\\"[..], b"\x1b]11;rgb:0000/0000/0000\x07"] {
            let mut p = prompt();
            assert_eq!(p.on_input(reply), Step::Nothing, "{reply:?}");
            assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve);
        }
        // Split anywhere, even between ESC and `\\`.
        let mut p = prompt();
        for part in [&b"\x1b]11;rgb:00"[..], b"y", b"00/a", b"\x1b", b"\\"] {
            assert_eq!(p.on_input(part), Step::Nothing, "{part:?}");
        }
        assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve);
    }

    #[test]
    fn every_reply_form_is_swallowed_to_its_end() {
        for reply in [
            // CSI and SS3, 7-bit and C1 (raw, UTF-8).
            &b"\x1b[?62;22c"[..],
            b"\x9b?62;22c",
            b"\xc2\x9b12;40R",
            b"\x1bOy",
            b"\x8fy",
            b"\xc2\x8fy",
            // DCS, OSC, APC, PM, SOS, each form, each terminator.
            b"\x1bP1$r0;1my\x1b\\",
            b"\x90>|XTerm(390)y\x9c",
            b"\xc2\x90>|XTerm(390)y\xc2\x9c",
            b"\x1b]lay title y\x1b\\",
            b"\x9d10;rgb:ffff/ffff/ffffy\x07",
            b"\xc2\x9dl title y\xc2\x9c",
            b"\x1b_Gi=1;OKy\x1b\\",
            b"\x9fay\x9c",
            b"\x1b^ay\x1b\\",
            b"\x9eay\xc2\x9c",
            b"\x1bXay\x1b\\",
            b"\x98ay\x9c",
            b"\xc2\x98ay\x9c",
            // A character whose UTF-8 holds 0x9c (`\u{dc}`, c3 9c) or 0xc2 does
            // not end the string.
            "\x1b]l \u{dc}y \u{a0}y \u{1f980}y\x1b\\".as_bytes(),
            // Other C1 controls, raw and UTF-8, are no keys.
            b"\x84\x85\x9c\xc2\x85\xc2\x9a",
        ] {
            let keys = Keys::default().decode(reply);
            assert!(keys.iter().all(|k| *k == Key::Ignored), "{reply:?}: {keys:?}");
            let mut p = prompt();
            assert_eq!(p.on_input(reply), Step::Nothing, "{reply:?}");
            assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve, "{reply:?}");
            // One byte per read, after the first two (an ESC that ends a
            // read is Esc, which denies).
            let mut p = prompt();
            assert_eq!(p.on_input(&reply[..2]), Step::Nothing, "{reply:?}");
            for b in &reply[2..] {
                assert_eq!(p.on_input(std::slice::from_ref(b)), Step::Nothing, "{reply:?} at {b:#x}");
            }
            assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve, "{reply:?}");
        }
        // Ctrl-C and Enter end a string (Alt-] typed by mistake) and deny.
        let mut k = Keys::default();
        assert_eq!(k.decode(b"\x1b]abc\x03"), [Key::Interrupt]);
        assert_eq!(k.decode(b"\x1bPabc\r"), [Key::Enter]);
        assert_eq!(k.decode(b"\x1bPabc\x18y"), [Key::Ignored, Key::Char('y')]);
    }

    #[test]
    fn the_reset_asks_for_7_bit_replies_and_hides_the_status_line() {
        let reset = text(RESET);
        assert!(reset.contains("\x1b F"), "{reset:?}");
        assert!(reset.contains("\x1b[0$}\x1b[0$~"), "{reset:?}");
    }

    #[test]
    fn a_mouse_report_is_not_a_key() {
        // X10 mouse report: ESC [ M, then button, column, row as bytes
        // (32 + value): column 89 is 'y', row 65 is 'a'.
        let mut p = prompt();
        assert_eq!(p.on_input(b"\x1b[M yaq"), Step::Nothing);
        // Split across reads, too.
        assert_eq!(p.on_input(b"\x1b[M"), Step::Nothing);
        assert_eq!(p.on_input(b" y"), Step::Nothing);
        assert_eq!(p.on_input(b"a"), Step::Nothing);
        assert_eq!(answer(p.on_input(b"n")).0, PromptDecision::Deny);
    }

    #[test]
    fn an_arrow_key_split_across_reads_is_not_a_key_in_the_editor() {
        let mut p = prompt();
        redraw(p.on_input(b"e"));
        // ESC at the end of a read: ignored in the editor...
        assert_eq!(p.on_input(b"\x1b"), Step::Nothing);
        // ...and its rest ("[A", up) typed nothing.
        assert_eq!(p.on_input(b"[A"), Step::Nothing);
        assert_eq!(p.mode, Mode::Edit("git push origin fix-123".into()));
        // A lone Esc followed by a letter: the letter is typed.
        p.on_input(b"\x1b");
        p.on_input(b"x");
        assert_eq!(p.mode, Mode::Edit("git push origin fix-123x".into()));
    }

    #[test]
    fn edit_then_approve() {
        let mut p = prompt();
        let shown = redraw(p.on_input(b"e"));
        assert!(shown.contains("edit the command"), "{shown:?}");
        assert!(shown.ends_with("edit (60 s left)> git push origin fix-123"), "{shown:?}");
        // Remove "fix-123", type "'main branch'".
        let shown = redraw(p.on_input(&[0x7f; 7]));
        assert!(shown.ends_with("> git push origin "), "{shown:?}");
        let shown = redraw(p.on_input(b"'main branch'"));
        assert!(shown.ends_with("> git push origin 'main branch'"), "{shown:?}");
        let shown = redraw(p.on_input(b"\r"));
        assert!(shown.contains("the edited command, one argument per line:"), "{shown:?}");
        for token in ["  [0] git\x1b[K\r\n", "  [1] push\x1b[K\r\n", "  [2] origin\x1b[K\r\n", "  [3] 'main branch'\x1b[K\r\n"] {
            assert!(shown.contains(token), "{token:?} missing from {shown:?}");
        }
        assert!(shown.contains("run this? [y] yes  [e] edit again  [n] no, back to the prompt"), "{shown:?}");
        let (decision, t) = answer(p.on_input(b"y"));
        assert_eq!(decision, PromptDecision::Edit { argv: strings(&["git", "push", "origin", "main branch"]) });
        assert!(t.contains("the edited command runs once"), "{t:?}");
    }

    #[test]
    fn an_edit_to_the_same_argv_is_a_plain_approve() {
        let mut p = prompt();
        p.on_input(b"e");
        // Retype the last argument with other quoting: same tokens.
        p.on_input(&[0x7f; 7]);
        let shown = redraw(p.on_input(b"\"fix-123\"\r"));
        assert!(shown.contains("unchanged"), "{shown:?}");
        assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve);
    }

    #[test]
    fn a_split_error_keeps_the_editor_open() {
        let mut p = prompt();
        p.on_input(b"e\x15");
        let shown = redraw(p.on_input(b"echo $HOME\r"));
        assert!(shown.contains("cannot run that: "), "{shown:?}");
        assert!(shown.ends_with("> echo $HOME"), "{shown:?}");
        assert_eq!(p.mode, Mode::Edit("echo $HOME".into()));
        let shown = redraw(p.on_input(b"'unterminated\r"));
        assert!(shown.contains("cannot run that: ") && shown.contains("unterminated"), "{shown:?}");
        // Fixed: clear, type, confirm.
        let shown = redraw(p.on_input(b"\x15echo '$HOME'\r"));
        assert!(shown.contains("  [1] '$HOME'\x1b[K"), "{shown:?}");
        assert_eq!(answer(p.on_input(b"Y")).0, PromptDecision::Edit { argv: strings(&["echo", "$HOME"]) });
    }

    #[test]
    fn an_empty_edit_is_refused() {
        let mut p = prompt();
        p.on_input(b"e");
        let shown = redraw(p.on_input(b"\x15\r"));
        assert!(shown.contains("the command is empty"), "{shown:?}");
        assert_eq!(p.mode, Mode::Edit(String::new()));
    }

    #[test]
    fn confirm_no_goes_back_to_the_prompt() {
        let mut p = prompt();
        p.on_input(b"e");
        p.on_input(b" --force\r");
        assert_eq!(p.mode, Mode::Confirm(strings(&["git", "push", "origin", "fix-123", "--force"])));
        let shown = redraw(p.on_input(b"n"));
        assert!(shown.contains("not run; the command is still:"), "{shown:?}");
        assert!(shown.contains("  command: git push origin fix-123\x1b[K"), "{shown:?}");
        assert!(shown.ends_with("[n] deny  (60 s left) "), "{shown:?}");
        assert_eq!(p.mode, Mode::Choose);
        // Enter there denies, as on the first screen.
        assert_eq!(answer(p.on_input(b"\r")).0, PromptDecision::Deny);
    }

    #[test]
    fn confirm_edit_again_reopens_the_editor_with_the_edit() {
        let mut p = prompt();
        p.on_input(b"e");
        p.on_input(b" -n\r");
        let shown = redraw(p.on_input(b"e"));
        assert!(shown.ends_with("> git push origin fix-123 -n"), "{shown:?}");
        p.on_input(b"\x7f\x7f\x7f\r");
        assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve);
    }

    #[test]
    fn ctrl_c_in_the_editor_goes_back_and_does_not_decide() {
        let mut p = prompt();
        p.on_input(b"e");
        let shown = redraw(p.on_input(b"xyz\x03"));
        assert!(shown.contains("edit abandoned"), "{shown:?}");
        assert_eq!(p.mode, Mode::Choose);
        // The keys typed in the editor are not answers.
        assert_eq!(answer(p.on_input(b"n")).0, PromptDecision::Deny);
    }

    #[test]
    fn multibyte_input_in_the_editor() {
        let mut p = Prompt::new(request(&["echo"], ""));
        p.on_input(b"e");
        let word = "café 日本 🦀";
        // One byte per read: characters are put together across reads.
        for b in format!(" '{word}'").as_bytes() {
            p.on_input(std::slice::from_ref(b));
        }
        assert_eq!(p.mode, Mode::Edit(format!("echo '{word}'")));
        // Backspace removes one character, not one byte.
        p.on_input(b"\x7f\x7f");
        assert_eq!(p.mode, Mode::Edit("echo 'café 日本 ".into()));
        p.on_input("🦀'\r".as_bytes());
        assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Edit { argv: strings(&["echo", word]) });
    }

    #[test]
    fn invalid_utf8_and_controls_are_not_typed() {
        let mut p = Prompt::new(request(&["echo"], ""));
        p.on_input(b"e");
        p.on_input(b"\xff\xc3\x28\x01\x02\t\x1b[D\x1bOC\x1b[3~");
        // \xc3 cut short by '(' drops the \xc3; the '(' itself is typed.
        assert_eq!(p.mode, Mode::Edit("echo(".into()));
    }

    #[test]
    fn the_editor_shows_its_text_inert() {
        // A typed invisible character is shown as an escape (and refused by
        // the parser, which says how to write it).
        let mut p = Prompt::new(request(&["echo"], ""));
        p.on_input(b"e");
        let shown = redraw(p.on_input(" a\u{202e}b".as_bytes()));
        assert!(shown.ends_with("> echo a\\u{202e}b"), "{shown:?}");
        assert!(!shown.contains('\u{202e}'));
        let shown = redraw(p.on_input(b"\r"));
        assert!(shown.contains("cannot run that: "), "{shown:?}");
        assert!(!shown.contains('\u{202e}'));
    }

    #[test]
    fn a_long_editor_line_shows_its_end_within_the_width() {
        let mut p = Prompt::new(request(&["echo", &"x".repeat(300)], ""));
        p.set_width(40);
        let shown = redraw(p.on_input(b"e"));
        let last = shown.rsplit(REDRAW_ROW).next().unwrap_or_default().to_owned();
        assert!(last.starts_with("edit (60 s left)> …"), "{last:?}");
        assert!(columns(&last) < 40, "{last:?} is {} columns", columns(&last));
        assert!(last.ends_with("xxxx"), "{last:?}");
        let shown = redraw(p.on_input("日本".as_bytes()));
        let last = shown.rsplit(REDRAW_ROW).next().unwrap_or_default().to_owned();
        assert!(last.ends_with("x日本") && columns(&last) < 40, "{last:?}");
    }

    #[test]
    fn the_time_left_is_redrawn_when_it_changes() {
        let mut p = prompt();
        p.set_width(120);
        assert_eq!(p.tick(Duration::from_secs(60)), None);
        let line = p.tick(Duration::from_millis(58_200)).map(|b| text(&b)).unwrap_or_default();
        assert_eq!(line, "\r\x1b[2K\x1b#5[y] run once  [a] always in this Domain  [e] edit  [n] deny  (59 s left) ");
        assert_eq!(p.tick(Duration::from_millis(58_900)), None);
        // Too narrow for the key line: no redraw in place (it would wrap).
        p.set_width(40);
        assert_eq!(p.tick(Duration::from_secs(30)), None);
        assert!(text(&p.render()).contains("(30 s left)"));
        // The editor line always fits.
        p.on_input(b"e");
        let line = p.tick(Duration::from_secs(5)).map(|b| text(&b)).unwrap_or_default();
        assert!(line.starts_with("\r\x1b[2K\x1b#5edit (5 s left)> "), "{line:?}");
    }

    #[test]
    fn shell_notation_keeps_its_backslashes_and_is_cut_with_a_marker() {
        assert_eq!(notation("$'a\\nb' 'c\\d'", 100), "$'a\\nb' 'c\\d'");
        let cut = notation(&"é".repeat(100), 50);
        assert!(cut.len() <= 50 && cut.ends_with(" bytes]") && cut.contains("…[+"), "{cut:?}");
        // Never the case for quote's output, but should it be: inert.
        assert_eq!(notation("a\x1b[2Jb", 100), "a\\x1b[2Jb");
    }

    #[test]
    fn the_editor_and_the_confirmation_show_escapes_as_written() {
        let mut p = Prompt::new(request(&["printf", "a\nb\u{202e}"], ""));
        let shown = redraw(p.on_input(b"e"));
        assert!(shown.ends_with("> printf $'a\\nb\\u202e'"), "{shown:?}");
        let shown = redraw(p.on_input(b"\r"));
        assert!(shown.contains("the command, unchanged"), "{shown:?}");
        assert!(shown.contains("  [1] $'a\\nb\\u202e'\x1b[K"), "{shown:?}");
        assert!(!shown.contains('\u{202e}'));
        assert_eq!(answer(p.on_input(b"y")).0, PromptDecision::Approve);
    }

    #[test]
    fn time_left_reads_well() {
        assert_eq!(time_left(0), "0 s");
        assert_eq!(time_left(59), "59 s");
        assert_eq!(time_left(65), "65 s");
        assert_eq!(time_left(125), "2 min 05 s");
        assert_eq!(time_left(7260), "2 h 01 min");
    }

    #[test]
    fn withdrawn_and_abandoned() {
        let p = prompt();
        let t = text(&p.withdrawn("timed out after 60 s\x1b[2J"));
        assert!(t.contains("── lazaret: prompt withdrawn: timed out after 60 s\\x1b[2J ──"), "{t:?}");
        assert!(t.ends_with(&end()));
        assert!(!t[..t.len() - end().len()].contains("\x1b[2J"), "{t:?}");
        let t = text(&p.abandoned("the session ended"));
        assert!(t.contains("prompt closed: the session ended"), "{t:?}");
        assert_eq!(p.request_id(), "r-1");
    }

    #[test]
    fn render_shows_the_current_screen() {
        let mut p = prompt();
        p.on_input(b"e");
        assert!(text(&p.render()).ends_with("edit (60 s left)> git push origin fix-123"));
        p.on_input(b"\r");
        let shown = text(&p.render());
        assert!(shown.contains("  [3] fix-123") && shown.ends_with("(60 s left) "), "{shown:?}");
    }
}
