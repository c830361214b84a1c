//! A faithful port of git's `wildmatch.c` (the glob matcher behind
//! `.gitignore`), so that "ignored" means exactly what git says.
//!
//! Strings are bytes (git is byte-oriented); character classes and case
//! folding are ASCII-only, as in git.

/// `WM_PATHNAME`: `*` and `?` do not match `/`; `**` is special.
pub const PATHNAME: u32 = 1;
/// `WM_CASEFOLD`: ASCII case-insensitive (`core.ignoreCase`).
pub const CASEFOLD: u32 = 2;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Outcome {
    Match,
    NoMatch,
    AbortAll,
    AbortToStarStar,
}

/// True if `text` matches `pattern` under git's wildmatch rules.
pub fn wildmatch(pattern: &[u8], text: &[u8], flags: u32) -> bool {
    dowild(&mut Seen::default(), pattern, 0, text, 0, flags) == Outcome::Match
}

/// The outcome of every (pattern position, text position) already tried.
/// git's matcher backtracks: each `*` retries the rest of the pattern at
/// every later text position, so `/**/**/**/...` patterns of a hostile
/// `.gitignore` take exponential time (found by fuzz target
/// gitignore_match: a 137-byte line and a 72-byte path ran for minutes;
/// `ignore_eval`'s test `a_hostile_line_of_many_stars_is_evaluated_in_milliseconds`).
/// A call's outcome depends
/// only on the two positions, so remembering it keeps git's answers exactly
/// and bounds the work by pattern length x text length calls.
#[derive(Default)]
struct Seen(std::collections::HashMap<(usize, usize), Outcome>);

/// [`dowild_uncached`], remembered.
fn dowild(seen: &mut Seen, pat: &[u8], p: usize, text: &[u8], t: usize, flags: u32) -> Outcome {
    if let Some(&outcome) = seen.0.get(&(p, t)) {
        return outcome;
    }
    let outcome = dowild_uncached(seen, pat, p, text, t, flags);
    seen.0.insert((p, t), outcome);
    outcome
}

/// Byte at `i`, or 0 past the end (git works on NUL-terminated strings).
fn at(s: &[u8], i: usize) -> u8 {
    s.get(i).copied().unwrap_or(0)
}

fn is_glob_special(c: u8) -> bool {
    matches!(c, b'*' | b'?' | b'[' | b'\\')
}

fn fold(c: u8, flags: u32) -> u8 {
    if flags & CASEFOLD != 0 { c.to_ascii_lowercase() } else { c }
}

fn dowild_uncached(seen: &mut Seen, pat: &[u8], mut p: usize, text: &[u8], mut t: usize, flags: u32) -> Outcome {
    // git compares against the pattern pointer this (recursive) call started at.
    let pattern_start = p;
    loop {
        let mut p_ch = at(pat, p);
        if p_ch == 0 {
            break;
        }
        let mut t_ch = at(text, t);
        if t_ch == 0 && p_ch != b'*' {
            return Outcome::AbortAll;
        }
        t_ch = fold(t_ch, flags);
        p_ch = fold(p_ch, flags);
        match p_ch {
            b'?' => {
                if flags & PATHNAME != 0 && t_ch == b'/' {
                    return Outcome::NoMatch;
                }
            }
            b'*' => {
                let match_slash;
                p += 1;
                if at(pat, p) == b'*' {
                    let prev_is_start_or_slash = p - pattern_start < 2 || at(pat, p - 2) == b'/';
                    while at(pat, p + 1) == b'*' {
                        p += 1;
                    }
                    p += 1;
                    let next = at(pat, p);
                    if flags & PATHNAME == 0 {
                        // Without WM_PATHNAME, '*' == '**'.
                        match_slash = true;
                    } else if prev_is_start_or_slash && (next == 0 || next == b'/' || (next == b'\\' && at(pat, p + 1) == b'/')) {
                        if next == b'/' && dowild(seen, pat, p + 1, text, t, flags) == Outcome::Match {
                            return Outcome::Match;
                        }
                        match_slash = true;
                    } else {
                        match_slash = false;
                    }
                } else {
                    match_slash = flags & PATHNAME == 0;
                }
                if at(pat, p) == 0 {
                    if !match_slash && text[t.min(text.len())..].contains(&b'/') {
                        return Outcome::AbortToStarStar;
                    }
                    return Outcome::Match;
                } else if !match_slash && at(pat, p) == b'/' {
                    match text[t.min(text.len())..].iter().position(|&c| c == b'/') {
                        None => return Outcome::AbortAll,
                        Some(offset) => {
                            // Consume the slash together with the pattern's '/'.
                            t += offset + 1;
                            p += 1;
                            continue;
                        }
                    }
                }
                loop {
                    if t_ch == 0 {
                        break;
                    }
                    if !is_glob_special(at(pat, p)) {
                        let want = fold(at(pat, p), flags);
                        loop {
                            t_ch = fold(at(text, t), flags);
                            if t_ch == 0 || (!match_slash && t_ch == b'/') || t_ch == want {
                                break;
                            }
                            t += 1;
                        }
                        if t_ch != want {
                            return if match_slash { Outcome::AbortAll } else { Outcome::AbortToStarStar };
                        }
                    }
                    let matched = dowild(seen, pat, p, text, t, flags);
                    if matched != Outcome::NoMatch {
                        if !match_slash || matched != Outcome::AbortToStarStar {
                            return matched;
                        }
                    } else if !match_slash && t_ch == b'/' {
                        return Outcome::AbortToStarStar;
                    }
                    t += 1;
                    t_ch = fold(at(text, t), flags);
                }
                return Outcome::AbortAll;
            }
            b'[' => {
                p += 1;
                p_ch = at(pat, p);
                if p_ch == b'^' {
                    p_ch = b'!';
                }
                let negated = p_ch == b'!';
                if negated {
                    p += 1;
                    p_ch = at(pat, p);
                }
                let mut prev_ch: u8 = 0;
                let mut matched = false;
                loop {
                    if p_ch == 0 {
                        return Outcome::AbortAll;
                    }
                    if p_ch == b'\\' {
                        p += 1;
                        p_ch = at(pat, p);
                        if p_ch == 0 {
                            return Outcome::AbortAll;
                        }
                        if t_ch == p_ch {
                            matched = true;
                        }
                    } else if p_ch == b'-' && prev_ch != 0 && at(pat, p + 1) != 0 && at(pat, p + 1) != b']' {
                        p += 1;
                        p_ch = at(pat, p);
                        if p_ch == b'\\' {
                            p += 1;
                            p_ch = at(pat, p);
                            if p_ch == 0 {
                                return Outcome::AbortAll;
                            }
                        }
                        if t_ch <= p_ch && t_ch >= prev_ch {
                            matched = true;
                        } else if flags & CASEFOLD != 0 && t_ch.is_ascii_lowercase() {
                            let upper = t_ch.to_ascii_uppercase();
                            if upper <= p_ch && upper >= prev_ch {
                                matched = true;
                            }
                        }
                        p_ch = 0;
                    } else if p_ch == b'[' && at(pat, p + 1) == b':' {
                        let start = p + 2;
                        p = start;
                        while at(pat, p) != 0 && at(pat, p) != b']' {
                            p += 1;
                        }
                        if at(pat, p) == 0 {
                            return Outcome::AbortAll;
                        }
                        // `p` is at ']'; the class name is start .. p-1 if p[-1] == ':'.
                        if p < start + 1 || at(pat, p - 1) != b':' {
                            // Not "[:name:]": treat the '[' as a literal member.
                            p = start - 2;
                            p_ch = b'[';
                            if t_ch == p_ch {
                                matched = true;
                            }
                            prev_ch = p_ch;
                            p += 1;
                            p_ch = at(pat, p);
                            if p_ch == b']' {
                                break;
                            }
                            continue;
                        }
                        let class = &pat[start..p - 1];
                        let hit = match class {
                            b"alnum" => t_ch.is_ascii_alphanumeric(),
                            b"alpha" => t_ch.is_ascii_alphabetic(),
                            b"blank" => t_ch == b' ' || t_ch == b'\t',
                            b"cntrl" => t_ch.is_ascii_control(),
                            b"digit" => t_ch.is_ascii_digit(),
                            b"graph" => t_ch.is_ascii_graphic(),
                            b"lower" => t_ch.is_ascii_lowercase(),
                            b"print" => t_ch.is_ascii_graphic() || t_ch == b' ',
                            b"punct" => t_ch.is_ascii_punctuation(),
                            b"space" => matches!(t_ch, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c),
                            b"upper" => t_ch.is_ascii_uppercase() || (flags & CASEFOLD != 0 && t_ch.is_ascii_lowercase()),
                            b"xdigit" => t_ch.is_ascii_hexdigit(),
                            _ => return Outcome::AbortAll,
                        };
                        if hit {
                            matched = true;
                        }
                        p_ch = 0;
                    } else if t_ch == p_ch {
                        matched = true;
                    }
                    prev_ch = p_ch;
                    p += 1;
                    p_ch = at(pat, p);
                    if p_ch == b']' {
                        break;
                    }
                }
                if matched == negated || (flags & PATHNAME != 0 && t_ch == b'/') {
                    return Outcome::NoMatch;
                }
            }
            b'\\' => {
                p += 1;
                p_ch = fold(at(pat, p), flags);
                if t_ch != p_ch {
                    return Outcome::NoMatch;
                }
            }
            _ => {
                if t_ch != p_ch {
                    return Outcome::NoMatch;
                }
            }
        }
        p += 1;
        t += 1;
    }
    if at(text, t) != 0 { Outcome::NoMatch } else { Outcome::Match }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cases in the style of git's t/t3070-wildmatch: (matches with
    /// WM_PATHNAME, matches without, pattern, text). The parity tests in
    /// `tests/ignore_parity.rs` check the same semantics against git itself.
    const CASES: &[(bool, bool, &str, &str)] = &[
        (true, true, "foo", "foo"),
        (false, false, "bar", "foo"),
        (true, true, "???", "foo"),
        (false, false, "??", "foo"),
        (true, true, "*", "foo"),
        (true, true, "f*", "foo"),
        (false, false, "*f", "foo"),
        (true, true, "*foo*", "foo"),
        (true, true, "*ob*a*r*", "foobar"),
        (true, true, "*ab", "aaaaaaabababab"),
        (true, true, "foo\\*", "foo*"),
        (false, false, "foo\\*bar", "foobar"),
        (true, true, "f\\\\oo", "f\\oo"),
        (true, true, "*[al]?", "ball"),
        (false, false, "[ten]", "ten"),
        (true, true, "**[!te]", "ten"),
        (false, false, "**[!ten]", "ten"),
        (true, true, "t[a-g]n", "ten"),
        (false, false, "t[!a-g]n", "ten"),
        (true, true, "t[!a-g]n", "ton"),
        (true, true, "t[^a-g]n", "ton"),
        (true, true, "a[]]b", "a]b"),
        (true, true, "a[]-]b", "a-b"),
        (true, true, "a[]-]b", "a]b"),
        (false, false, "a[]-]b", "aab"),
        (true, true, "a[]a-]b", "aab"),
        (true, true, "]", "]"),
        (false, true, "foo*bar", "foo/baz/bar"),
        (false, true, "foo**bar", "foo/baz/bar"),
        (true, true, "foo**bar", "foobazbar"),
        (true, true, "foo/**/bar", "foo/baz/bar"),
        (true, true, "foo/**/**/bar", "foo/baz/bar"),
        (true, true, "foo/**/bar", "foo/b/a/z/bar"),
        (true, true, "foo/**/**/bar", "foo/b/a/z/bar"),
        (true, true, "foo/**/bar", "foo/bar"),
        (true, true, "foo/**/**/bar", "foo/bar"),
        (false, true, "foo?bar", "foo/bar"),
        (false, true, "foo[/]bar", "foo/bar"),
        (false, true, "foo[^a-z]bar", "foo/bar"),
        (false, true, "f[^eiu][^eiu][^eiu][^eiu][^eiu]r", "foo/bar"),
        (true, true, "f[^eiu][^eiu][^eiu][^eiu][^eiu]r", "foo-bar"),
        (true, true, "**/foo", "foo"),
        (true, true, "**/foo", "XXX/foo"),
        (true, true, "**/foo", "bar/baz/foo"),
        (false, true, "*/foo", "bar/baz/foo"),
        (false, true, "**/bar*", "foo/bar/baz"),
        (true, true, "**/bar/*", "deep/foo/bar/baz"),
        (false, true, "**/bar/*", "deep/foo/bar/baz/"),
        (true, true, "**/bar/**", "deep/foo/bar/baz/"),
        (false, false, "**/bar/*", "deep/foo/bar"),
        (true, true, "**/bar/**", "deep/foo/bar/"),
        (false, true, "**/bar**", "foo/bar/baz"),
        (true, true, "*/bar/**", "foo/bar/baz/x"),
        (false, true, "*/bar/**", "deep/foo/bar/baz/x"),
        (true, true, "**/bar/*/*", "deep/foo/bar/baz/x"),
        (true, true, "[[:alpha:]][[:digit:]][[:upper:]]", "a1B"),
        (false, false, "[[:digit:][:upper:][:space:]]", "a"),
        (true, true, "[[:digit:][:upper:][:space:]]", "A"),
        (true, true, "[[:digit:][:upper:][:space:]]", "1"),
        (false, false, "[[:digit:][:upper:][:spaci:]]", "1"),
        (true, true, "[[:xdigit:]]", "5"),
        (true, true, "[[:xdigit:]]", "f"),
        (true, true, "[a-c[:digit:]x-z]", "5"),
        (false, false, "[a-c[:digit:]x-z]", "q"),
        (false, false, "[abc", "abc"),
        (true, true, "\\[ab]", "[ab]"),
        (true, true, "[[]ab]", "[ab]"),
        (true, true, "[[:]ab]", "[ab]"),
        (false, false, "[[::]ab]", "[ab]"),
        (true, true, "[[:digit]ab]", "[ab]"),
        (true, true, "[\\[:]ab]", "[ab]"),
        (true, true, "\\??\\?b", "?a?b"),
        (true, true, "\\a\\b\\c", "abc"),
        (false, false, "", "foo"),
        (true, true, "**/t[o]", "foo/bar/baz/to"),
        (true, true, "XXX/*/*/*/*/*/*/12/*/*/*/m/*/*/*", "XXX/adobe/courier/bold/o/normal//12/120/75/75/m/70/iso8859/1"),
        (false, false, "XXX/*/*/*/*/*/*/12/*/*/*/m/*/*/*", "XXX/adobe/courier/bold/o/normal//12/120/75/75/X/70/iso8859/1"),
        (true, true, "**/*a*b*g*n*t", "abcd/abcdefg/abcdefghijk/abcdefghijklmnop.txt"),
        (false, false, "**/*a*b*g*n*t", "abcd/abcdefg/abcdefghijk/abcdefghijklmnop.txtz"),
        (false, false, "*/*/*", "foo"),
        (false, false, "*/*/*", "foo/bar"),
        (true, true, "*/*/*", "foo/bba/arr"),
        (false, true, "*/*/*", "foo/bb/aa/rr"),
        (true, true, "**/**/**", "foo/bb/aa/rr"),
        (true, true, "*X*i", "abcXdefXghi"),
        (false, true, "*X*i", "ab/cXd/efXg/hi"),
        (true, true, "*/*X*/*/*i", "ab/cXd/efXg/hi"),
        (true, true, "**/*X*/**/*i", "ab/cXd/efXg/hi"),
    ];

    #[test]
    fn git_wildmatch_corpus() {
        for &(pathname, plain, pattern, text) in CASES {
            assert_eq!(wildmatch(pattern.as_bytes(), text.as_bytes(), PATHNAME), pathname, "WM_PATHNAME {pattern:?} vs {text:?}");
            // Without WM_PATHNAME git only ever matches basenames (no '/'),
            // so only those cases are meaningful for parity.
            if !text.contains('/') && !pattern.contains('/') {
                assert_eq!(wildmatch(pattern.as_bytes(), text.as_bytes(), 0), plain, "plain {pattern:?} vs {text:?}");
            }
        }
    }

    #[test]
    fn casefold() {
        assert!(wildmatch(b"[A-Z]OO", b"foo", CASEFOLD));
        assert!(!wildmatch(b"[A-Z]OO", b"foo", 0));
        assert!(wildmatch(b"*.TXT", b"a.txt", CASEFOLD | PATHNAME));
    }
}
