//! Showing untrusted text in messages and prompts.
//!
//! A file name may contain anything but `/` and NUL, and an agent's
//! escalation request anything at all: ESC sequences that recolour or
//! rewrite the terminal, CR that overwrites the line, bidi controls that
//! reorder what the reader sees, invisible characters that hide text. Every
//! error that embeds such a name shows it through [`escaped`], and every
//! prompt field an agent controls goes through [`inert`]; both keep printable
//! text as it is and write everything else as a visible escape. Which
//! characters are escaped is decided in one place, [`needs_escape`].
//!
//! Variation selectors (U+FE00..U+FE0F, U+E0100..U+E01EF, U+180B..U+180F)
//! are escaped too: they are invisible and can carry a hidden payload inside
//! innocent-looking text; the price is that an emoji's presentation
//! selector shows as `\u{fe0f}`. Unassigned and private-use code points are
//! not escaped (a terminal shows them as a replacement glyph, which hides
//! nothing).

use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A [`Display`](fmt::Display) of a path (or any byte string) in which
/// control characters, ESC, CR, bidi and invisible Unicode characters, a
/// backslash and bytes that are not UTF-8 are shown as escapes: `\e`, `\r`,
/// `\n`, `\t`, `\\`, `\xNN` (a raw byte or an ASCII control) and `\u{NNNN}`
/// (any other character that is not shown as itself).
pub struct Escaped<'a>(&'a [u8]);

/// `path` for an error message, escaped as [`Escaped`] describes.
pub fn escaped(path: &Path) -> Escaped<'_> {
    Escaped(path.as_os_str().as_bytes())
}

/// Any text for an error message, escaped as [`Escaped`] describes.
pub fn escaped_str(text: &str) -> Escaped<'_> {
    Escaped(text.as_bytes())
}

/// Whether `c` must not reach a terminal as itself (besides the backslash,
/// which [`escaped`] and [`inert`] double so that escapes cannot be forged):
///
/// - C0 controls (TAB, CR, LF included), DEL, C1 controls (U+0080..U+009F);
/// - every Unicode format character (general category Cf) as of Unicode 15:
///   soft hyphen, Arabic number signs and marks, the Arabic letter mark,
///   the Mongolian vowel separator, zero-width space and joiners, LRM/RLM,
///   bidi embeddings, overrides and isolates, the word joiner and invisible
///   operators, BOM, interlinear annotations, Kaithi, Egyptian hieroglyph,
///   shorthand and musical format controls, and the tag block;
/// - line and paragraph separators (Zl, Zp) and every space other than
///   U+0020 (NBSP, en/em/thin spaces, ideographic space, ...), which look
///   like a plain space but are not one (`rm -rf\u{a0}/` is one argument);
/// - other characters that render as nothing: the combining grapheme
///   joiner, Hangul fillers, Khmer inherent vowels, variation selectors.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || (c.is_whitespace() && c != ' ')
        || matches!(c,
            '\u{00AD}' // soft hyphen
            | '\u{034F}' // combining grapheme joiner
            | '\u{0600}'..='\u{0605}' // Arabic number signs
            | '\u{061C}' // Arabic letter mark
            | '\u{06DD}' // Arabic end of ayah
            | '\u{070F}' // Syriac abbreviation mark
            | '\u{0890}'..='\u{0891}' // Arabic pound/piastre mark above
            | '\u{08E2}' // Arabic disputed end of ayah
            | '\u{115F}'..='\u{1160}' // Hangul choseong/jungseong fillers
            | '\u{17B4}'..='\u{17B5}' // Khmer inherent vowels
            | '\u{180B}'..='\u{180F}' // Mongolian variation selectors, vowel separator
            | '\u{200B}'..='\u{200F}' // zero width space/joiners, LRM, RLM
            | '\u{2028}'..='\u{202E}' // line/paragraph separators, bidi embeddings and overrides
            | '\u{2060}'..='\u{206F}' // word joiner, invisible operators, bidi isolates
            | '\u{3164}' // Hangul filler
            | '\u{FE00}'..='\u{FE0F}' // variation selectors
            | '\u{FEFF}' // BOM / zero width no-break space
            | '\u{FFA0}' // halfwidth Hangul filler
            | '\u{FFF9}'..='\u{FFFB}' // interlinear annotation
            | '\u{110BD}' | '\u{110CD}' // Kaithi number signs
            | '\u{13430}'..='\u{1343F}' // Egyptian hieroglyph format controls
            | '\u{1BCA0}'..='\u{1BCA3}' // shorthand format controls
            | '\u{1D173}'..='\u{1D17A}' // musical symbol beam/tie/slur/phrase
            | '\u{E0000}'..='\u{E007F}' // tags
            | '\u{E0100}'..='\u{E01EF}' // variation selectors supplement
        )
}

/// Writes `c` as itself or as its visible escape. `esc_as_e` picks `\e` for
/// ESC (file names in messages, as before) over the uniform `\x1b`.
fn write_shown(out: &mut impl fmt::Write, c: char, esc_as_e: bool) -> fmt::Result {
    match c {
        '\\' => out.write_str("\\\\"),
        '\x1b' if esc_as_e => out.write_str("\\e"),
        '\r' => out.write_str("\\r"),
        '\n' => out.write_str("\\n"),
        '\t' => out.write_str("\\t"),
        c if (c as u32) < 0x80 && needs_escape(c) => write!(out, "\\x{:02x}", c as u32),
        c if needs_escape(c) => write!(out, "\\u{{{:04x}}}", c as u32),
        c => out.write_char(c),
    }
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                write_shown(f, c, true)?;
            }
            for byte in chunk.invalid() {
                write!(f, "\\x{byte:02x}")?;
            }
        }
        Ok(())
    }
}

/// Agent-controlled `text` made safe to print inside a prompt line: the agent
/// can neither forge nor hide prompt text with it.
///
/// Every character [`needs_escape`] names becomes a visible escape: `\t`,
/// `\r`, `\n` (a prompt field is one line), `\xNN` for the other ASCII
/// controls and DEL (ESC is `\x1b`, so a CSI, OSC, DCS, APC, PM or SOS
/// sequence is never interpreted: what follows the ESC is plain text), and
/// `\u{NNNN}` for C1 controls and invisible or direction-changing Unicode. A
/// backslash becomes `\\`, so no escape can be forged.
///
/// When the escaped text is longer than `max_bytes`, it is cut between two
/// characters' renderings (never inside an escape) and ends with the marker
/// `…[+N bytes]`, N counting the bytes of `text` that were left out; the
/// result, marker included, is at most `max_bytes` long unless `max_bytes`
/// is too small for the marker alone. The marker's text can appear in
/// `text` itself; it only ever claims a cut, it hides nothing.
pub fn inert(text: &str, max_bytes: usize) -> String {
    let mut whole = String::with_capacity(text.len());
    for c in text.chars() {
        // Writing to a String cannot fail.
        let _ = write_shown(&mut whole, c, false);
    }
    if whole.len() <= max_bytes {
        return whole;
    }
    let marker = |left_out: usize| format!("…[+{left_out} bytes]");
    let mut kept = String::new();
    let mut rendering = String::new();
    let mut cut_at = 0;
    for (offset, c) in text.char_indices() {
        rendering.clear();
        let _ = write_shown(&mut rendering, c, false);
        let after = offset + c.len_utf8();
        // The marker after this character fits too, so stopping after it
        // always stays within max_bytes.
        if kept.len() + rendering.len() + marker(text.len() - after).len() > max_bytes {
            break;
        }
        kept.push_str(&rendering);
        cut_at = after;
    }
    kept.push_str(&marker(text.len() - cut_at));
    kept
}

impl fmt::Debug for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{self}\"")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    fn show(bytes: &[u8]) -> String {
        escaped(Path::new(OsStr::from_bytes(bytes))).to_string()
    }

    #[test]
    fn plain_names_are_unchanged() {
        assert_eq!(show(b"/work/src/main.rs"), "/work/src/main.rs");
        assert_eq!(show("/w/caf\u{e9}/\u{65e5}\u{672c}.txt".as_bytes()), "/w/caf\u{e9}/\u{65e5}\u{672c}.txt");
        assert_eq!(show(b"with space"), "with space");
    }

    #[test]
    fn terminal_controls_become_visible() {
        assert_eq!(show(b"a\x1b[2Jb"), "a\\e[2Jb");
        assert_eq!(show(b"ok\rFAKE"), "ok\\rFAKE");
        assert_eq!(show(b"x\ny\tz"), "x\\ny\\tz");
        assert_eq!(show(b"bell\x07del\x7f"), "bell\\x07del\\x7f");
        // C1 control (CSI as a character), not as a raw byte.
        assert_eq!(show("a\u{9b}31m".as_bytes()), "a\\u{009b}31m");
        // A backslash is escaped too, so the output is unambiguous.
        assert_eq!(show(b"a\\e"), "a\\\\e");
    }

    #[test]
    fn bidi_and_invisible_characters_become_visible() {
        assert_eq!(show("evil\u{202e}txt.exe".as_bytes()), "evil\\u{202e}txt.exe");
        assert_eq!(show("a\u{2066}b\u{2069}".as_bytes()), "a\\u{2066}b\\u{2069}");
        assert_eq!(show("zero\u{200b}width".as_bytes()), "zero\\u{200b}width");
        assert_eq!(show("\u{feff}bom".as_bytes()), "\\u{feff}bom");
        assert_eq!(show("tag\u{e0041}".as_bytes()), "tag\\u{e0041}");
    }

    #[test]
    fn bytes_that_are_not_utf8_are_shown_as_hex() {
        assert_eq!(show(b"bad\xff\xfename"), "bad\\xff\\xfename");
        assert_eq!(escaped_str("a\x1bb").to_string(), "a\\eb");
        assert_eq!(format!("{:?}", escaped_str("q")), "\"q\"");
    }

    #[test]
    fn inert_neutralises_terminal_sequences() {
        assert_eq!(inert("push the fix", 100), "push the fix");
        assert_eq!(inert("a\x1b[2Jb", 100), "a\\x1b[2Jb");
        assert_eq!(inert("\x1b]0;title\x07", 100), "\\x1b]0;title\\x07");
        assert_eq!(inert("\x1bP1$r\x1b\\", 100), "\\x1bP1$r\\x1b\\\\");
        assert_eq!(inert("ok\rApprove? [y]\n", 100), "ok\\rApprove? [y]\\n");
        assert_eq!(inert("tab\there\x7f\0", 100), "tab\\there\\x7f\\x00");
        assert_eq!(inert("c1\u{9b}31m\u{85}", 100), "c1\\u{009b}31m\\u{0085}");
        assert_eq!(inert("forged \\u{202e}", 100), "forged \\\\u{202e}");
    }

    #[test]
    fn inert_shows_invisible_and_bidi_characters() {
        for c in [
            '\u{202a}',
            '\u{202e}',
            '\u{2066}',
            '\u{2069}',
            '\u{200e}',
            '\u{200f}',
            '\u{061c}',
            '\u{200b}',
            '\u{200d}',
            '\u{2060}',
            '\u{2064}',
            '\u{feff}',
            '\u{00ad}',
            '\u{180e}',
            '\u{fff9}',
            '\u{fffb}',
            '\u{e0001}',
            '\u{e007f}',
            '\u{fe0f}',
            '\u{e0100}',
            '\u{2028}',
            '\u{2029}',
            '\u{00a0}',
            '\u{3000}',
            '\u{3164}',
            '\u{0600}',
            '\u{1d173}',
        ] {
            let shown = inert(&format!("a{c}b"), 100);
            assert_eq!(shown, format!("a\\u{{{:04x}}}b", c as u32), "{:x}", c as u32);
        }
        // Visible non-ASCII text, unassigned and private-use code points stay.
        assert_eq!(inert("café 日本 \u{e000} \u{10fffd} é", 100), "café 日本 \u{e000} \u{10fffd} é");
    }

    #[test]
    fn inert_output_never_contains_an_escaped_character() {
        let nasty: String = (0u32..0x3000).chain(0xE0000..0xE0200).filter_map(char::from_u32).collect();
        let shown = inert(&nasty, usize::MAX);
        assert!(shown.chars().all(|c| !needs_escape(c)), "raw character survived");
        assert!(!shown.contains('\x1b'));
    }

    #[test]
    fn inert_cuts_long_text_with_a_marker() {
        let text = "x".repeat(100);
        let cut = inert(&text, 30);
        assert!(cut.len() <= 30, "{cut}");
        assert!(cut.starts_with("xxxx"));
        let kept = cut.chars().take_while(|&c| c == 'x').count();
        assert!(cut.ends_with(&format!("…[+{} bytes]", 100 - kept)), "{cut}");
        // Exactly fitting text is not cut.
        assert_eq!(inert(&text, 100), text);
        // Never inside an escape or a multi-byte character.
        let cut = inert(&"\u{202e}é".repeat(20), 25);
        assert!(cut.len() <= 25, "{cut}");
        let body = cut.split('…').next().unwrap_or_default();
        assert_eq!(body.len() % "\\u{202e}é".len(), 0, "{cut}");
        // Too small even for the marker: the marker alone.
        assert_eq!(inert("abcdef", 2), "…[+6 bytes]");
        assert_eq!(inert("", 0), "");
    }
}
