//! mounts/src/wildmatch.rs and ignore_eval.rs: git's glob matcher and
//! `.gitignore` evaluation on any pattern and path. A pattern with every
//! special character escaped matches exactly its own text, a pattern without
//! special characters is a plain comparison, `*` is any text (without `/`
//! under PATHNAME), and a `.gitignore` naming a path literally ignores it
//! until a later `!` line names it again. Exponential matching shows up as a
//! libFuzzer timeout. (The differential check against git is
//! `gitignore_git`.)
#![no_main]

use lazaret_mounts::ignore_eval::fuzz_is_ignored;
use lazaret_mounts::wildmatch::{CASEFOLD, PATHNAME, wildmatch};
use libfuzzer_sys::fuzz_target;

fn escape_all(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() * 2);
    for &b in text {
        if matches!(b, b'*' | b'?' | b'[' | b'\\' | b'!' | b'#' | b' ') {
            out.push(b'\\');
        }
        out.push(b);
    }
    out
}

fuzz_target!(|data: &[u8]| {
    // pattern NUL text (no NUL inside either: git's strings end there)
    let mut parts = data.splitn(2, |&b| b == 0);
    let pattern = parts.next().unwrap_or_default();
    let Some(text) = parts.next() else { return };
    if text.contains(&0) {
        return;
    }
    for flags in [0, PATHNAME, CASEFOLD, PATHNAME | CASEFOLD] {
        let _ = wildmatch(pattern, text, flags);
        assert!(wildmatch(&escape_all(text), text, flags), "escaped {text:?} (flags {flags})");
        if !pattern.iter().any(|b| matches!(b, b'*' | b'?' | b'[' | b'\\')) {
            let equal = if flags & CASEFOLD != 0 { pattern.eq_ignore_ascii_case(text) } else { pattern == text };
            assert_eq!(wildmatch(pattern, text, flags), equal, "{pattern:?} {text:?} (flags {flags})");
        }
        let star = flags & PATHNAME == 0 || !text.contains(&b'/');
        assert_eq!(wildmatch(b"*", text, flags), star, "* on {text:?} (flags {flags})");
        assert!(wildmatch(b"**", text, flags), "** on {text:?} (flags {flags})");
    }
    // The text as a work-tree path with the pattern as a .gitignore.
    if text.is_empty() || text.contains(&b'\n') || text.contains(&b'\r') || text.starts_with(b"/") || text.ends_with(b"/") || text.windows(2).any(|w| w == b"//") {
        return;
    }
    for casefold in [false, true] {
        for is_dir in [false, true] {
            let _ = fuzz_is_ignored(pattern, text, is_dir, casefold);
            let mut literal = b"/".to_vec();
            literal.extend(escape_all(text));
            assert!(fuzz_is_ignored(&literal, text, is_dir, casefold), "{literal:?} does not ignore {text:?}");
            let mut both = pattern.to_vec();
            both.push(b'\n');
            both.extend(&literal);
            assert!(fuzz_is_ignored(&both, text, is_dir, casefold), "a later literal line must win");
            both.extend(b"\n!");
            both.extend(&literal);
            assert!(!fuzz_is_ignored(&both, text, is_dir, casefold), "a later negation must win");
        }
    }
});
