//! protocol/src/display.rs: what `escaped` and `inert` print never holds a
//! character `needs_escape` names, reads back to exactly the input (no
//! escape can be forged or lost), and `inert` cuts within its budget at a
//! rendering boundary.
#![no_main]

use lazaret_protocol::display::{escaped_str, inert, needs_escape};
use libfuzzer_sys::fuzz_target;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Reads the escapes back: `\\ \e \r \n \t \xNN \u{N..}`.
fn unescape(shown: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut chars = shown.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            continue;
        }
        match chars.next() {
            Some('\\') => out.push(b'\\'),
            Some('e') => out.push(0x1b),
            Some('r') => out.push(b'\r'),
            Some('n') => out.push(b'\n'),
            Some('t') => out.push(b'\t'),
            Some('x') => {
                let hex: String = (0..2).filter_map(|_| chars.next()).collect();
                out.push(u8::from_str_radix(&hex, 16).unwrap_or_else(|_| panic!("bad \\x escape {hex:?} in {shown:?}")));
            }
            Some('u') => {
                assert_eq!(chars.next(), Some('{'), "bad \\u escape in {shown:?}");
                let hex: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let code = u32::from_str_radix(&hex, 16).unwrap_or_else(|_| panic!("bad \\u escape {hex:?} in {shown:?}"));
                let c = char::from_u32(code).unwrap_or_else(|| panic!("\\u{{{hex}}} is no character"));
                out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
            }
            other => panic!("unknown escape \\{other:?} in {shown:?}"),
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&budget, bytes)) = data.split_first() else { return };
    // Any bytes (a file name): escaped, they read back exactly.
    let shown = lazaret_protocol::display::escaped(Path::new(OsStr::from_bytes(bytes))).to_string();
    assert!(!shown.chars().any(needs_escape), "raw escaped character in {shown:?}");
    assert_eq!(unescape(&shown), bytes, "escaped {shown:?}");

    let text = String::from_utf8_lossy(bytes);
    let shown = escaped_str(&text).to_string();
    assert_eq!(unescape(&shown), text.as_bytes());

    let whole = inert(&text, usize::MAX);
    assert!(!whole.chars().any(needs_escape), "raw escaped character in {whole:?}");
    assert_eq!(unescape(&whole), text.as_bytes(), "inert {whole:?}");

    let max = usize::from(budget) * 4;
    let cut = inert(&text, max);
    assert!(!cut.chars().any(needs_escape), "raw escaped character in {cut:?}");
    if whole.len() <= max {
        assert_eq!(cut, whole);
    } else {
        let marker_at = cut.rfind("…[+").unwrap_or_else(|| panic!("no cut marker in {cut:?}"));
        let kept = &cut[..marker_at];
        assert!(whole.starts_with(kept), "{kept:?} is not a prefix of {whole:?}");
        // The kept part ends between two characters' renderings: it reads
        // back to a prefix of the text, and the marker counts the rest.
        let kept_text = unescape(kept);
        assert!(text.as_bytes().starts_with(&kept_text));
        assert_eq!(&cut[marker_at..], format!("…[+{} bytes]", text.len() - kept_text.len()));
        let longest_marker = format!("…[+{} bytes]", text.len()).len();
        if max >= longest_marker {
            assert!(cut.len() <= max, "{} bytes over a budget of {max}: {cut:?}", cut.len());
        }
    }
});
