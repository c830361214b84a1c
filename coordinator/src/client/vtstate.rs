//! What the agent's terminal output has left the developer's terminal in,
//! as far as an escalation prompt needs to know: whether the stream is in
//! the middle of an escape sequence or string, whether it is on the
//! alternate screen, and the modes the prompt resets and gives back
//! afterwards (keyboard, mouse, paste, cursor, margins, default colours).
//!
//! A small VT parser (the states of DEC's ANSI parser that matter: ground,
//! escape, control sequence, string), pure, fed with every byte the relay
//! writes to the terminal. It is a best effort at the agent's state, never
//! what the prompt's safety rests on: the prompt resets the terminal the
//! same way whatever this says (see [`super::prompt`]); a wrong answer here
//! costs the agent's program its screen or a mode, not the prompt.

use std::collections::BTreeMap;

/// DEC private modes the prompt resets and gives back: cursor keys (1),
/// reverse screen (5), origin (6), autowrap (7), cursor shown (25),
/// numeric keypad (66), left/right margins (69), mouse reporting (9,
/// 1000-1003, 1005, 1006, 1015, 1016), focus events (1004), bracketed paste
/// (2004), synchronized output (2026), win32-input-mode (9001: keys sent as
/// sequences).
pub(super) const PROMPT_DEC_MODES: &[u16] =
    &[1, 5, 6, 7, 25, 66, 69, 9, 1000, 1001, 1002, 1003, 1004, 1005, 1006, 1015, 1016, 2004, 2026, 9001];
/// ANSI modes likewise: insert (IRM, 4), send/receive (SRM, 12: local
/// echo), newline (LNM, 20).
pub(super) const PROMPT_ANSI_MODES: &[u16] = &[4, 12, 20];
/// The DEC private modes that switch to the alternate screen.
const ALT_SCREEN_MODES: &[u16] = &[47, 1047, 1049];
/// Longest sequence (parameters and intermediates) or colour kept; a longer
/// one is not tracked (it is passed on all the same).
const SEQ_MAX: usize = 64;
/// Longest unfinished sequence or string kept whole, to be written again
/// after a prompt ([`StreamState::unfinished`]).
const UNFINISHED_MAX: usize = 256;

/// Where the parser is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Parse {
    #[default]
    Ground,
    /// After ESC.
    Escape,
    /// After ESC and intermediates (0x20-0x2f).
    EscapeIntermediate,
    /// Inside a control sequence (`ESC [`).
    Csi,
    /// Inside OSC (`ESC ]`): ends with BEL or ST.
    Osc,
    /// Inside DCS, SOS, PM or APC (`ESC P`, `ESC X`, `ESC ^`, `ESC _`):
    /// ends with ST.
    String,
}

/// The agent's terminal state, as its output stream set it.
#[derive(Debug, Default, Clone)]
pub(super) struct StreamState {
    parse: Parse,
    /// The parameters and intermediates of the sequence under way (or the
    /// OSC's text), up to [`SEQ_MAX`].
    seq: Vec<u8>,
    /// The sequence under way was longer than [`SEQ_MAX`]: not tracked.
    overlong: bool,
    /// Every byte of the sequence or string under way, from its ESC, up to
    /// [`UNFINISHED_MAX`] (then `None`).
    unfinished: Option<Vec<u8>>,
    alternate: bool,
    dec: BTreeMap<u16, bool>,
    ansi: BTreeMap<u16, bool>,
    /// Application keypad (`ESC =`) or numeric (`ESC >`), when set.
    keypad_application: Option<bool>,
    /// The parameters of the agent's last DECSTBM, when it set a region.
    scroll_region: Option<Vec<u8>>,
    /// The parameters of the agent's last `CSI > 4 ... m` (modifyOtherKeys).
    modify_other_keys: Option<Vec<u8>>,
    /// Default foreground and background colours (OSC 10, OSC 11), when
    /// the agent set them.
    colours: [Option<Vec<u8>>; 2],
    /// UTF-8 (`ESC % G`) or not (`ESC % @`: in ISO 8859-1, the bytes of a
    /// UTF-8 character can be C1 controls, a CSI among them), when set.
    utf8: Option<bool>,
}

impl StreamState {
    /// Follows `bytes` written to the terminal.
    pub(super) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.byte(b);
        }
    }

    /// Whether the stream is in the middle of an escape sequence or string
    /// (whatever comes next would be taken as part of it).
    #[cfg(test)]
    fn mid_sequence(&self) -> bool {
        self.parse != Parse::Ground
    }

    /// The bytes of the escape sequence or string the stream is in the
    /// middle of, from its ESC, when there is one and it is short: a prompt
    /// cancels it (CAN), and writing these again after the prompt lets the
    /// rest of the agent's output finish it as the agent meant.
    pub(super) fn unfinished(&self) -> Option<&[u8]> {
        match self.parse {
            Parse::Ground => None,
            _ => self.unfinished.as_deref(),
        }
    }

    /// Whether the agent's program is on the alternate screen.
    pub(super) fn alternate_screen(&self) -> bool {
        self.alternate
    }

    /// The bytes that set again what the agent set of what the prompt
    /// resets: the modes in [`PROMPT_DEC_MODES`] and [`PROMPT_ANSI_MODES`],
    /// the keypad, modifyOtherKeys, the default colours, and last the
    /// scroll region (which also moves the cursor to the top left: the
    /// caller restores the cursor after it). What the agent never set is
    /// left as the prompt left it (the terminal's defaults).
    pub(super) fn restore(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let on_off = |on: bool| if on { 'h' } else { 'l' };
        for (mode, on) in &self.dec {
            out.extend_from_slice(format!("\x1b[?{mode}{}", on_off(*on)).as_bytes());
        }
        for (mode, on) in &self.ansi {
            out.extend_from_slice(format!("\x1b[{mode}{}", on_off(*on)).as_bytes());
        }
        if self.utf8 == Some(false) {
            out.extend_from_slice(b"\x1b%@");
        }
        match self.keypad_application {
            Some(true) => out.extend_from_slice(b"\x1b="),
            Some(false) => out.extend_from_slice(b"\x1b>"),
            None => {}
        }
        if let Some(params) = &self.modify_other_keys {
            out.extend_from_slice(b"\x1b[>");
            out.extend_from_slice(params);
            out.push(b'm');
        }
        for (n, colour) in ["10", "11"].iter().zip(&self.colours) {
            if let Some(colour) = colour {
                out.extend_from_slice(format!("\x1b]{n};").as_bytes());
                out.extend_from_slice(colour);
                out.extend_from_slice(b"\x1b\\");
            }
        }
        if let Some(params) = &self.scroll_region {
            out.extend_from_slice(b"\x1b[");
            out.extend_from_slice(params);
            out.push(b'r');
        }
        out
    }

    fn byte(&mut self, b: u8) {
        if self.parse != Parse::Ground {
            if let Some(kept) = &mut self.unfinished {
                if kept.len() < UNFINISHED_MAX {
                    kept.push(b);
                } else {
                    self.unfinished = None;
                }
            }
        }
        // CAN and SUB end any sequence or string; ESC starts a new one
        // (ending a string: `ESC \` is ST).
        match b {
            0x18 | 0x1a => {
                self.parse = Parse::Ground;
                return;
            }
            0x1b => {
                if self.parse == Parse::Osc {
                    self.osc_end();
                }
                self.start(Parse::Escape);
                self.unfinished = Some(vec![0x1b]);
                return;
            }
            _ => {}
        }
        match self.parse {
            Parse::Ground => {}
            Parse::Escape => match b {
                b'[' => self.start(Parse::Csi),
                b']' => self.start(Parse::Osc),
                b'P' | b'X' | b'^' | b'_' => self.start(Parse::String),
                0x20..=0x2f => {
                    self.collect(b);
                    self.parse = Parse::EscapeIntermediate;
                }
                0x30..=0x7e => {
                    self.parse = Parse::Ground;
                    self.esc_dispatch(b);
                }
                // Controls are executed inside a sequence; DEL is ignored.
                _ => {}
            },
            Parse::EscapeIntermediate => match b {
                0x20..=0x2f => self.collect(b),
                0x30..=0x7e => {
                    self.parse = Parse::Ground;
                    match (self.seq.as_slice(), b) {
                        (b"%", b'G') => self.utf8 = Some(true),
                        (b"%", b'@') => self.utf8 = Some(false),
                        _ => {}
                    }
                }
                _ => {}
            },
            Parse::Csi => match b {
                0x20..=0x3f => self.collect(b),
                0x40..=0x7e => {
                    self.parse = Parse::Ground;
                    self.csi_dispatch(b);
                }
                _ => {}
            },
            Parse::Osc => match b {
                0x07 => {
                    self.osc_end();
                    self.parse = Parse::Ground;
                }
                0x20.. => self.collect(b),
                _ => {}
            },
            Parse::String => {}
        }
    }

    fn start(&mut self, parse: Parse) {
        self.parse = parse;
        self.seq.clear();
        self.overlong = false;
    }

    fn collect(&mut self, b: u8) {
        if self.seq.len() < SEQ_MAX {
            self.seq.push(b);
        } else {
            self.overlong = true;
        }
    }

    fn esc_dispatch(&mut self, b: u8) {
        match b {
            b'=' => self.keypad_application = Some(true),
            b'>' => self.keypad_application = Some(false),
            // RIS: the terminal's full reset.
            b'c' => *self = StreamState::default(),
            _ => {}
        }
    }

    fn osc_end(&mut self) {
        if self.overlong {
            return;
        }
        let text = std::mem::take(&mut self.seq);
        let (number, value) = match text.iter().position(|&c| c == b';') {
            Some(i) => (&text[..i], Some(&text[i + 1..])),
            None => (&text[..], None),
        };
        match (number, value) {
            (b"10", Some(v)) if v != b"?" => self.colours[0] = Some(v.to_vec()),
            (b"11", Some(v)) if v != b"?" => self.colours[1] = Some(v.to_vec()),
            (b"110", _) => self.colours[0] = None,
            (b"111", _) => self.colours[1] = None,
            _ => {}
        }
    }

    fn csi_dispatch(&mut self, fin: u8) {
        if self.overlong {
            return;
        }
        let seq = std::mem::take(&mut self.seq);
        let (private, rest) = match seq.first() {
            Some(&p @ (b'?' | b'>' | b'<' | b'=')) => (Some(p), &seq[1..]),
            _ => (None, &seq[..]),
        };
        // Intermediates (0x20-0x2f) come after the parameters.
        let split = rest.iter().position(|c| (0x20..=0x2f).contains(c)).unwrap_or(rest.len());
        let (params, intermediates) = rest.split_at(split);
        let numbers = || params.split(|&c| c == b';').map(|p| std::str::from_utf8(p).ok().and_then(|p| p.parse::<u16>().ok()));
        match (private, intermediates, fin) {
            (Some(b'?'), [], b'h' | b'l') => {
                let on = fin == b'h';
                for mode in numbers().flatten() {
                    if ALT_SCREEN_MODES.contains(&mode) {
                        self.alternate = on;
                    } else if PROMPT_DEC_MODES.contains(&mode) {
                        self.dec.insert(mode, on);
                    }
                }
            }
            (None, [], b'h' | b'l') => {
                for mode in numbers().flatten() {
                    if PROMPT_ANSI_MODES.contains(&mode) {
                        self.ansi.insert(mode, fin == b'h');
                    }
                }
            }
            (None, [], b'r') => {
                let full = params.iter().all(|&c| c == b';' || c == b'0');
                self.scroll_region = if full { None } else { Some(params.to_vec()) };
            }
            (Some(b'>'), [], b'm') if numbers().next().flatten() == Some(4) => {
                self.modify_other_keys = Some(params.to_vec());
            }
            // DECSTR: a soft reset sets these modes to their defaults.
            (None, [b'!'], b'p') => {
                for mode in [1, 6, 7, 25, 66] {
                    self.dec.remove(&mode);
                }
                self.ansi.remove(&4);
                self.keypad_application = None;
                self.scroll_region = None;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(bytes: &[u8]) -> StreamState {
        let mut s = StreamState::default();
        s.feed(bytes);
        s
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    #[test]
    fn sequences_and_strings_left_open_are_seen() {
        for open in [
            &b"\x1b"[..],
            b"\x1b[",
            b"\x1b[38;5",
            b"\x1b[?",
            b"\x1b(",
            b"\x1b#",
            b"\x1b]0;title",
            b"\x1b]8;;http://x/",
            b"\x1bP1$r",
            b"\x1b_G",
            b"\x1b^pm",
            b"\x1bXsos",
        ] {
            assert!(after(open).mid_sequence(), "{open:?}");
            assert!(!after(&[open, b"\x18"].concat()).mid_sequence(), "{open:?} then CAN");
        }
        for closed in [
            &b"text"[..],
            b"\x1b[1;2H",
            b"\x1b]0;t\x07",
            b"\x1b]0;t\x1b\\",
            b"\x1bP1$r\x1b\\",
            b"\x1b(B",
            b"\x1b#8",
            b"\x1b=",
            b"\x1b[?2004h",
            b"\xe2\x94\x80",
        ] {
            assert!(!after(closed).mid_sequence(), "{closed:?}");
        }
        // A BEL ends an OSC, not a DCS.
        assert!(after(b"\x1bPq\x07").mid_sequence());
    }

    #[test]
    fn the_unfinished_sequence_is_kept_to_be_written_again() {
        assert_eq!(after(b"text\x1b[38;5").unfinished(), Some(&b"\x1b[38;5"[..]));
        assert_eq!(after(b"\x1b[1m\x1b]0;my title").unfinished(), Some(&b"\x1b]0;my title"[..]));
        assert_eq!(after(b"\x1b]0;t\x1b").unfinished(), Some(&b"\x1b"[..]));
        assert_eq!(after(b"\x1b[1m").unfinished(), None);
        assert_eq!(after(b"\x1b]0;t\x18").unfinished(), None);
        assert_eq!(after(&[&b"\x1b_G"[..], &[b'x'; 300]].concat()).unfinished(), None);
        assert!(after(&[&b"\x1b_G"[..], &[b'x'; 300]].concat()).mid_sequence());
    }

    #[test]
    fn split_across_writes() {
        let mut s = StreamState::default();
        for chunk in [&b"\x1b"[..], b"[?10", b"49", b"h", b"\x1b[?200", b"4h"] {
            s.feed(chunk);
        }
        assert!(s.alternate_screen());
        assert!(!s.mid_sequence());
        assert_eq!(text(&s.restore()), "\x1b[?2004h");
    }

    #[test]
    fn the_alternate_screen() {
        assert!(after(b"\x1b[?1049h").alternate_screen());
        assert!(after(b"\x1b[?47h").alternate_screen());
        assert!(after(b"\x1b[?1000;1047h").alternate_screen());
        assert!(!after(b"\x1b[?1049h\x1b[?1049l").alternate_screen());
        assert!(!after(b"\x1b[?1049h\x1bc").alternate_screen());
        // ESC ends a string and starts a sequence (as in DEC's parser).
        assert!(after(b"\x1b]0;\x1b[?1049h").alternate_screen());
        assert!(after(b"\x1bPq\x1b[?1049h").alternate_screen());
        // Other bytes in a string are its text.
        assert!(!after(b"\x1b]0;[?1049h").alternate_screen());
    }

    #[test]
    fn restore_sets_again_what_the_agent_set() {
        let s = after(b"\x1b[?1h\x1b[?25l\x1b[?1000;1006h\x1b[?1006l\x1b[4h\x1b[20h\x1b=\x1b[>4;2m\x1b]10;#101010\x07\x1b]11;rgb:0/0/0\x1b\\\x1b[3;20r\x1b[?999h\x1b[31m");
        assert_eq!(
            text(&s.restore()),
            "\x1b[?1h\x1b[?25l\x1b[?1000h\x1b[?1006l\x1b[4h\x1b[20h\x1b=\x1b[>4;2m\x1b]10;#101010\x1b\\\x1b]11;rgb:0/0/0\x1b\\\x1b[3;20r"
        );
        // Reset again by the agent itself: given back as reset.
        let s = after(b"\x1b[3;20r\x1b[r\x1b]10;red\x07\x1b]110\x07\x1b[?2004h\x1b[!p\x1b[?25l");
        assert_eq!(text(&s.restore()), "\x1b[?25l\x1b[?2004h");
        assert!(after(b"\x1b[?2004h\x1bc").restore().is_empty());
        // Queries are not settings.
        assert!(after(b"\x1b]10;?\x07").restore().is_empty());
        // Another character encoding, given back; UTF-8 again: nothing.
        assert_eq!(text(&after(b"\x1b%@").restore()), "\x1b%@");
        assert!(after(b"\x1b%@\x1b%G").restore().is_empty());
        assert_eq!(text(&after(b"\x1b[?9001h").restore()), "\x1b[?9001h");
    }

    #[test]
    fn an_overlong_sequence_is_not_tracked() {
        let long = [&b"\x1b[?"[..], &b"1;".repeat(100), b"2004h"].concat();
        let s = after(&long);
        assert!(!s.mid_sequence());
        assert!(s.restore().is_empty());
    }
}
