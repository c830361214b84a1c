//! What the developer's terminal shows, emulated: every byte the test's
//! terminal received goes through `avt` (asciinema's VT emulator: screen,
//! scroll region, origin mode, charsets, insert mode, autowrap, alternate
//! screen, colours) and, again, through a `vte` parser that keeps the modes
//! `avt` does not model: concealed text (SGR 8), reverse screen (DECSCNM),
//! left/right margins (DECLRMM), default colours (OSC 10/11), ISO 8859-1
//! instead of UTF-8 (`ESC % @`),
//! synchronized output, local echo (SRM),
//! newline mode, and the keyboard modes that change what a key sends
//! (kitty keyboard flags, modifyOtherKeys). [`Screen::key`] encodes a key
//! as a terminal in those modes sends it.

/// A key the developer presses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// A character key.
    Char(char),
    /// Enter (Return).
    Enter,
    /// Ctrl-C.
    CtrlC,
}

/// The modes `avt` does not model, as the stream left them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Modes {
    /// SGR 8 in effect.
    pub conceal: bool,
    /// DECSCNM: the whole screen in reverse video.
    pub reverse_screen: bool,
    /// DECLRMM (mode 69) on: DECSLRM margins confine text.
    pub lr_margins: bool,
    /// Synchronized output (mode 2026) begun and not ended: the terminal
    /// shows nothing new until it ends.
    pub synchronized: bool,
    /// SRM reset: the terminal echoes typed keys itself.
    pub local_echo: bool,
    /// LNM set: Enter sends CR LF.
    pub newline: bool,
    /// The default foreground and background colours, when set with
    /// OSC 10 and OSC 11 (reset by OSC 110 and OSC 111).
    pub default_fg: Option<String>,
    /// See `default_fg`.
    pub default_bg: Option<String>,
    /// ISO 8859-1 selected (`ESC % @`), not UTF-8 (`ESC % G`): the bytes of
    /// a character that is not ASCII show as other characters, or act as
    /// C1 controls.
    pub latin1: bool,
    /// modifyOtherKeys (`CSI > 4 ; N m`).
    pub modify_other_keys: u16,
    /// The kitty keyboard protocol's stack of pushed flags (top last).
    pub kitty_stack: Vec<u16>,
    /// The kitty keyboard protocol's flags in effect.
    pub kitty_flags: u16,
}

/// One printed character with the modes in effect when it was printed.
#[derive(Debug, Clone, Copy)]
struct Printed {
    c: char,
    hidden: bool,
}

/// The `vte` side: modes, and every printed character.
#[derive(Default)]
struct Tracker {
    modes: Modes,
    printed: Vec<Printed>,
}

impl Tracker {
    fn hidden(&self) -> bool {
        let m = &self.modes;
        m.conceal || m.reverse_screen || m.lr_margins || m.synchronized || (m.default_fg.is_some() && m.default_fg == m.default_bg)
    }
}

impl vte::Perform for Tracker {
    fn print(&mut self, c: char) {
        let hidden = self.hidden() || (self.modes.latin1 && !c.is_ascii());
        self.printed.push(Printed { c, hidden });
    }

    fn execute(&mut self, byte: u8) {
        // A line break separates fields in the print log.
        if byte == b'\n' || byte == b'\r' {
            self.printed.push(Printed { c: '\n', hidden: false });
        }
    }

    fn osc_dispatch(&mut self, params: &[&[u8]], _bell_terminated: bool) {
        let value = |i: usize| params.get(i).map(|v| String::from_utf8_lossy(v).into_owned()).filter(|v| v != "?");
        match params.first().copied() {
            Some(b"10") => self.modes.default_fg = value(1).or(self.modes.default_fg.take()),
            Some(b"11") => self.modes.default_bg = value(1).or(self.modes.default_bg.take()),
            Some(b"110") => self.modes.default_fg = None,
            Some(b"111") => self.modes.default_bg = None,
            _ => {}
        }
    }

    fn csi_dispatch(&mut self, params: &vte::Params, intermediates: &[u8], _ignore: bool, action: char) {
        let p: Vec<u16> = params.iter().map(|s| s.first().copied().unwrap_or(0)).collect();
        let m = &mut self.modes;
        match (intermediates, action) {
            ([], 'm') => {
                if p.is_empty() {
                    m.conceal = false;
                }
                let mut i = 0;
                while i < p.len() {
                    match p[i] {
                        0 => m.conceal = false,
                        8 => m.conceal = true,
                        28 => m.conceal = false,
                        // Extended colours: skip their arguments.
                        38 | 48 | 58 => {
                            i += if p.get(i + 1) == Some(&5) { 2 } else { 4 };
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            ([b'?'], 'h' | 'l') => {
                let on = action == 'h';
                for mode in p {
                    match mode {
                        5 => m.reverse_screen = on,
                        69 => m.lr_margins = on,
                        2026 => m.synchronized = on,
                        _ => {}
                    }
                }
            }
            ([], 'h' | 'l') => {
                let on = action == 'h';
                for mode in p {
                    match mode {
                        12 => m.local_echo = !on,
                        20 => m.newline = on,
                        _ => {}
                    }
                }
            }
            ([b'>'], 'm') if p.first() == Some(&4) => {
                m.modify_other_keys = p.get(1).copied().unwrap_or(0);
            }
            ([b'>'], 'u') => {
                m.kitty_stack.push(m.kitty_flags);
                m.kitty_flags = p.first().copied().unwrap_or(0);
            }
            ([b'<'], 'u') => {
                for _ in 0..p.first().copied().unwrap_or(1).max(1) {
                    m.kitty_flags = m.kitty_stack.pop().unwrap_or(0);
                }
            }
            ([b'='], 'u') => {
                let flags = p.first().copied().unwrap_or(0);
                m.kitty_flags = match p.get(1).copied().unwrap_or(1) {
                    2 => m.kitty_flags | flags,
                    3 => m.kitty_flags & !flags,
                    _ => flags,
                };
            }
            ([b'!'], 'p') => {
                // DECSTR: soft reset (SGR, modes; not the keyboard).
                m.conceal = false;
                m.reverse_screen = false;
            }
            _ => {}
        }
    }

    fn esc_dispatch(&mut self, intermediates: &[u8], _ignore: bool, byte: u8) {
        match (intermediates, byte) {
            // RIS: the terminal's full reset.
            ([], b'c') => self.modes = Modes::default(),
            ([b'%'], b'@') => self.modes.latin1 = true,
            ([b'%'], b'G') => self.modes.latin1 = false,
            _ => {}
        }
    }
}

/// The developer's screen after some bytes.
pub struct Screen {
    vt: avt::Vt,
    parser: vte::Parser,
    tracker: Tracker,
    /// The bytes not yet given to `avt` (an incomplete UTF-8 character).
    partial: Vec<u8>,
}

impl Screen {
    /// An empty screen of `rows` × `cols`.
    pub fn new(rows: u16, cols: u16) -> Screen {
        Screen {
            vt: avt::Vt::new(usize::from(cols), usize::from(rows)),
            parser: vte::Parser::new(),
            tracker: Tracker::default(),
            partial: Vec::new(),
        }
    }

    /// `bytes` rendered on a fresh screen.
    pub fn of(rows: u16, cols: u16, bytes: &[u8]) -> Screen {
        let mut s = Screen::new(rows, cols);
        s.feed(bytes);
        s
    }

    /// The terminal receives `bytes`.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.parser.advance(&mut self.tracker, bytes);
        self.partial.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.partial) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.partial.len(),
        };
        let text = String::from_utf8_lossy(&self.partial[..valid]).into_owned();
        self.vt.feed_str(&text);
        self.partial.drain(..valid);
    }

    /// The screen's rows, as text, trailing blanks removed.
    pub fn rows(&self) -> Vec<String> {
        self.vt.view().map(|l| l.text().trim_end().to_string()).collect()
    }

    /// The rows that are not blank.
    pub fn visible_rows(&self) -> Vec<String> {
        self.rows().into_iter().filter(|r| !r.is_empty()).collect()
    }

    /// The whole screen, for failure messages.
    pub fn dump(&self) -> String {
        self.rows().iter().enumerate().map(|(i, r)| format!("{i:3}|{r}\n")).collect()
    }

    /// Whether every character on row `row` is drawn in the default
    /// colours and attributes (no inverse, no colour, not faint, ...).
    pub fn row_plain(&self, row: usize) -> bool {
        self.vt.view().nth(row).is_some_and(|l| l.cells().iter().all(|c| c.char() == ' ' || c.pen().is_default()))
    }

    /// Whether the cursor is shown.
    pub fn cursor_visible(&self) -> bool {
        self.vt.cursor().visible
    }

    /// The modes `avt` does not model.
    pub fn modes(&self) -> &Modes {
        &self.tracker.modes
    }

    /// Whether the last time `text` was printed (within one line), it was
    /// printed with none of the modes that hide or displace it (concealed,
    /// reverse screen, left/right margins, synchronized output pending).
    /// `None` when it was never printed in one piece.
    pub fn printed_plainly(&self, text: &str) -> Option<bool> {
        let want: Vec<char> = text.chars().collect();
        let log = &self.tracker.printed;
        if want.is_empty() || log.len() < want.len() {
            return None;
        }
        (0..=log.len() - want.len())
            .rev()
            .find(|&i| log[i..i + want.len()].iter().map(|p| p.c).eq(want.iter().copied()))
            .map(|i| log[i..i + want.len()].iter().all(|p| !p.hidden))
    }

    /// What the terminal sends for `key` in its current keyboard modes.
    pub fn key(&self, key: Key) -> Vec<u8> {
        let m = &self.tracker.modes;
        let all_as_escapes = m.kitty_flags & 8 != 0;
        let disambiguate = m.kitty_flags & 1 != 0;
        match key {
            Key::Char(c) if all_as_escapes => format!("\x1b[{}u", u32::from(c)).into_bytes(),
            Key::Char(c) => c.to_string().into_bytes(),
            Key::Enter if all_as_escapes => b"\x1b[13u".to_vec(),
            Key::Enter if m.newline => b"\r\n".to_vec(),
            Key::Enter => b"\r".to_vec(),
            Key::CtrlC if all_as_escapes || disambiguate => b"\x1b[99;5u".to_vec(),
            Key::CtrlC if m.modify_other_keys >= 2 => b"\x1b[27;5;99~".to_vec(),
            Key::CtrlC => b"\x03".to_vec(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unterminated_title_swallows_text_and_can_ends_it() {
        let s = Screen::of(5, 40, b"\x1b]0;title hello");
        assert!(s.visible_rows().is_empty(), "{}", s.dump());
        let s = Screen::of(5, 40, b"\x1b]0;title \x18hello");
        assert_eq!(s.visible_rows(), ["hello"]);
    }

    #[test]
    fn a_scroll_region_confines_lines() {
        let s = Screen::of(6, 40, b"\x1b[1;2r\x1b[1;1Ha\r\nb\r\nc\r\nd");
        assert_eq!(s.visible_rows(), ["c", "d"]);
    }

    #[test]
    fn charsets_and_colours_show() {
        let s = Screen::of(3, 40, b"\x1b(0qqq\x1b(B \x1b[30;40mx\x1b[m");
        assert_eq!(s.rows()[0], "─── x");
        assert!(!s.row_plain(0));
    }

    #[test]
    fn hidden_prints_are_seen() {
        let s = Screen::of(3, 40, b"\x1b[8msecret\x1b[0m shown \x1b[?5hreversed\x1b[?5l");
        assert_eq!(s.printed_plainly("secret"), Some(false));
        assert_eq!(s.printed_plainly("shown"), Some(true));
        assert_eq!(s.printed_plainly("reversed"), Some(false));
        assert_eq!(s.printed_plainly("absent"), None);
        let s = Screen::of(3, 40, b"\x1b]10;#000000\x07\x1b]11;#000000\x1b\\dark\x1b]110\x07light");
        assert_eq!(s.printed_plainly("dark"), Some(false));
        assert_eq!(s.printed_plainly("light"), Some(true));
        let s = Screen::of(3, 40, "\x1b%@── ascii \x1b%G── again".as_bytes());
        assert_eq!(s.printed_plainly("── ascii"), Some(false));
        assert_eq!(s.printed_plainly("ascii"), Some(true));
        assert_eq!(s.printed_plainly("── again"), Some(true));
    }

    #[test]
    fn keys_follow_the_keyboard_modes() {
        let mut s = Screen::new(3, 40);
        assert_eq!(s.key(Key::CtrlC), b"\x03");
        s.feed(b"\x1b[>4;2m");
        assert_eq!(s.key(Key::CtrlC), b"\x1b[27;5;99~");
        s.feed(b"\x1b[>4;0m\x1b[>8u");
        assert_eq!(s.key(Key::Char('y')), b"\x1b[121u");
        s.feed(b"\x1b[>0u");
        assert_eq!(s.key(Key::Char('y')), b"y");
        s.feed(b"\x1b[<u");
        assert_eq!(s.key(Key::Char('y')), b"\x1b[121u");
        s.feed(b"\x1b[<u\x1b[20h");
        assert_eq!(s.key(Key::Enter), b"\r\n");
    }
}
