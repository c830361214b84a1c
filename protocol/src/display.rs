//! Showing untrusted text (workspace file names above all) in messages.
//!
//! A file name may contain anything but `/` and NUL: ESC sequences that
//! recolour or rewrite the terminal, CR that overwrites the line, bidi
//! controls that reorder what the reader sees, invisible characters. Every
//! error that embeds such a name shows it through [`escaped`], which keeps
//! printable text as it is and writes everything else as a visible escape.

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

/// Whether `c` must not reach a terminal as itself: C0/C1 controls, DEL,
/// bidi embeddings/overrides/isolates and marks, zero-width and other
/// invisible format characters, line/paragraph separators, BOM, and the
/// Unicode "tag" block.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00AD}' // soft hyphen
            | '\u{061C}' // Arabic letter mark
            | '\u{180E}' // Mongolian vowel separator
            | '\u{200B}'..='\u{200F}' // zero width space/joiners, LRM, RLM
            | '\u{2028}'..='\u{202E}' // line/paragraph separators, bidi embeddings and overrides
            | '\u{2060}'..='\u{206F}' // word joiner, invisible operators, bidi isolates
            | '\u{FEFF}' // BOM / zero width no-break space
            | '\u{FFF9}'..='\u{FFFB}' // interlinear annotation
            | '\u{E0000}'..='\u{E007F}' // tags
        )
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        for chunk in self.0.utf8_chunks() {
            for c in chunk.valid().chars() {
                match c {
                    '\\' => f.write_str("\\\\")?,
                    '\x1b' => f.write_str("\\e")?,
                    '\r' => f.write_str("\\r")?,
                    '\n' => f.write_str("\\n")?,
                    '\t' => f.write_str("\\t")?,
                    c if (c as u32) < 0x80 && hidden(c) => write!(f, "\\x{:02x}", c as u32)?,
                    c if hidden(c) => write!(f, "\\u{{{:04x}}}", c as u32)?,
                    c => f.write_char(c)?,
                }
            }
            for byte in chunk.invalid() {
                write!(f, "\\x{byte:02x}")?;
            }
        }
        Ok(())
    }
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
}
