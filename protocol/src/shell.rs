//! Argument vectors shown as, and read back from, POSIX-shell-like text.
//!
//! An escalation prompt shows the agent's argv one token per argument
//! ([`quote_argv`]) and lets the developer edit it; [`split`] parses the
//! edited line back. No shell is ever involved: the line is only a notation
//! for a list of strings. Everything a shell would expand or interpret
//! (variables, command substitution, globs, `~`, operators, comments) is
//! therefore refused by [`split`] rather than taken literally, so the
//! developer is never misled into thinking it was interpreted.
//!
//! Round trip: `split(&quote_argv(argv)) == Ok(argv)` for every argv, and
//! [`quote`]'s output never contains a character that
//! [`display::needs_escape`](crate::display::needs_escape) names, so it is
//! inert on a terminal as it stands. The notation is also valid bash with
//! the same meaning (bash's `$'...'` takes the escapes [`quote`] writes).

use crate::display::needs_escape;
use std::fmt::Write as _;

/// Characters an argument may consist of to be written bare.
fn safe_bare(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '@' | '%' | '+' | '=' | ':' | ',' | '.' | '/' | '-')
}

/// `arg` as one shell word: bare when it is non-empty and consists only of
/// `[A-Za-z0-9_@%+=:,./-]`; in `$'...'` (ANSI-C quoting) when it contains a
/// character that [`needs_escape`] names, with `\t`, `\n`, `\r`, `\xNN`
/// (other ASCII controls, DEL), `\uXXXX` and `\UXXXXXXXX` (always full
/// width), `\\` and `\'`; otherwise in single quotes, a `'` written `'\''`.
pub fn quote(arg: &str) -> String {
    if !arg.is_empty() && arg.chars().all(safe_bare) {
        return arg.to_owned();
    }
    if arg.chars().any(needs_escape) {
        let mut out = String::with_capacity(arg.len() + 3);
        out.push_str("$'");
        for c in arg.chars() {
            // Writing to a String cannot fail.
            let _ = match c {
                '\\' => out.write_str("\\\\"),
                '\'' => out.write_str("\\'"),
                '\t' => out.write_str("\\t"),
                '\n' => out.write_str("\\n"),
                '\r' => out.write_str("\\r"),
                c if needs_escape(c) => out.write_str(&ansi_c_escape(c)),
                c => out.write_char(c),
            };
        }
        out.push('\'');
        return out;
    }
    let mut out = String::with_capacity(arg.len() + 2);
    out.push('\'');
    for c in arg.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// `c` as a `$'...'` escape: `\xNN` below U+0080, else `\uXXXX` or
/// `\UXXXXXXXX`, always full width so that no following digit is absorbed.
fn ansi_c_escape(c: char) -> String {
    match c as u32 {
        code @ 0..0x80 => format!("\\x{code:02x}"),
        code @ 0x80..=0xFFFF => format!("\\u{code:04x}"),
        code => format!("\\U{code:08x}"),
    }
}

/// `argv` as one line: each argument [`quote`]d, separated by one space.
pub fn quote_argv(argv: &[String]) -> String {
    let words: Vec<String> = argv.iter().map(|arg| quote(arg)).collect();
    words.join(" ")
}

/// Why [`split`] refused a line, and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset}: {problem}")]
pub struct SplitError {
    /// Byte offset in the line of the character that is refused (for an
    /// unterminated quote: of the opening quote).
    pub offset: usize,
    /// What is wrong there.
    pub problem: SplitProblem,
}

/// What [`split`] refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SplitProblem {
    /// A quote that is never closed.
    #[error("unterminated {0} quote")]
    Unterminated(QuoteKind),
    /// A backslash as the line's last character.
    #[error("a backslash at the end of the line escapes nothing")]
    TrailingBackslash,
    /// An unquoted character a shell would interpret, or `$`/`` ` `` inside
    /// double quotes.
    #[error("'{character}' would be {meaning} in a shell, but no shell runs this: quote it or remove it")]
    ShellSyntax {
        /// The character.
        character: char,
        /// What a shell would make of it.
        meaning: &'static str,
    },
    /// A raw control, invisible or direction-changing character.
    #[error("invisible or control character U+{:04X}: write it as $'{}' if it is meant", *.0 as u32, ansi_c_escape(*.0))]
    Invisible(char),
    /// A `$'...'` escape that is not one of the known ones.
    #[error("unknown escape in $'...': {0}")]
    BadEscape(&'static str),
}

/// The kinds of quoting [`split`] understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuoteKind {
    /// `'...'`
    Single,
    /// `"..."`
    Double,
    /// `$'...'`
    AnsiC,
}

impl std::fmt::Display for QuoteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QuoteKind::Single => "single (')",
            QuoteKind::Double => "double (\")",
            QuoteKind::AnsiC => "$'...'",
        })
    }
}

/// What a shell would make of an unquoted `c`, if anything (`at_word_start`:
/// no character of the current word has been read yet).
fn shell_meaning(c: char, at_word_start: bool) -> Option<&'static str> {
    Some(match c {
        '$' => "a parameter expansion or command substitution",
        '`' => "a command substitution",
        ';' => "a command separator",
        '|' => "a pipe",
        '&' => "a background or and-list operator",
        '<' | '>' => "a redirection",
        '(' | ')' => "a subshell or function syntax",
        '*' | '?' | '[' => "a glob pattern",
        '{' => "a brace expansion",
        '!' => "a history expansion or negation",
        '~' if at_word_start => "a home directory expansion",
        '#' if at_word_start => "the start of a comment",
        _ => return None,
    })
}

fn refuse(offset: usize, problem: SplitProblem) -> SplitError {
    SplitError { offset, problem }
}

/// Parses a developer-edited command line back into arguments: the inverse
/// of [`quote_argv`], for the quoting a developer is likely to type.
///
/// Words are separated by unquoted spaces, tabs and newlines. Understood:
/// `'...'` (literal), `"..."` (with `\"`, `\\`, `\$`, `` \` `` and
/// backslash-newline as escapes; any other backslash is literal), a
/// backslash outside quotes (the next character literally; backslash-newline
/// joins lines), and `$'...'` with `\\ \' \" \? \a \b \e \E \f \n \r \t \v`,
/// `\xH{1,2}`, `\uH{1,4}`, `\UH{1,8}` and octal `\N{1,3}`. Adjacent parts
/// form one word (`'it'\''s'` is `it's`); `''` is an empty argument.
///
/// Refused with a [`SplitError`]: an unterminated quote; a trailing
/// backslash; an unquoted `$` (other than `$'`), `` ` ``, `;`, `|`, `&`,
/// `<`, `>`, `(`, `)`, `*`, `?`, `[`, `{`, `!`, and `~` or `#` at the start of
/// a word; `$` or `` ` `` unescaped inside double quotes; an unknown `$'...'`
/// escape; and any raw character [`needs_escape`] names (other than the
/// separators), so text pasted from an agent cannot smuggle one in.
pub fn split(line: &str) -> Result<Vec<String>, SplitError> {
    let mut words = Vec::new();
    let mut word = String::new();
    // Whether a word has begun (so that `''` yields an empty argument).
    let mut in_word = false;
    let mut chars = line.char_indices().peekable();
    while let Some((offset, c)) = chars.next() {
        match c {
            ' ' | '\t' | '\n' => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '\\' => match chars.next() {
                None => return Err(refuse(offset, SplitProblem::TrailingBackslash)),
                Some((_, '\n')) => {}
                Some((escaped_at, escaped)) => {
                    if needs_escape(escaped) {
                        return Err(refuse(escaped_at, SplitProblem::Invisible(escaped)));
                    }
                    word.push(escaped);
                    in_word = true;
                }
            },
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        None => {
                            return Err(refuse(offset, SplitProblem::Unterminated(QuoteKind::Single)));
                        }
                        Some((_, '\'')) => break,
                        Some((at, c)) if needs_escape(c) => {
                            return Err(refuse(at, SplitProblem::Invisible(c)));
                        }
                        Some((_, c)) => word.push(c),
                    }
                }
            }
            '"' => {
                in_word = true;
                double_quoted(offset, &mut chars, &mut word)?;
            }
            '$' if chars.peek().is_some_and(|&(_, next)| next == '\'') => {
                chars.next();
                in_word = true;
                ansi_c_quoted(offset, &mut chars, &mut word)?;
            }
            c if needs_escape(c) => return Err(refuse(offset, SplitProblem::Invisible(c))),
            c => {
                if let Some(meaning) = shell_meaning(c, !in_word) {
                    return Err(refuse(offset, SplitProblem::ShellSyntax { character: c, meaning }));
                }
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    Ok(words)
}

type Chars<'a> = std::iter::Peekable<std::str::CharIndices<'a>>;

/// The rest of a `"..."` whose opening quote is at `open`.
fn double_quoted(open: usize, chars: &mut Chars<'_>, word: &mut String) -> Result<(), SplitError> {
    loop {
        match chars.next() {
            None => return Err(refuse(open, SplitProblem::Unterminated(QuoteKind::Double))),
            Some((_, '"')) => return Ok(()),
            Some((_, '\\')) => match chars.peek().copied() {
                Some((_, '\n')) => {
                    chars.next();
                }
                Some((_, next @ ('"' | '\\' | '$' | '`'))) => {
                    chars.next();
                    word.push(next);
                }
                // POSIX: before any other character the backslash is literal.
                _ => word.push('\\'),
            },
            Some((at, c @ ('$' | '`'))) => {
                let meaning = shell_meaning(c, false).unwrap_or("an expansion");
                return Err(refuse(at, SplitProblem::ShellSyntax { character: c, meaning }));
            }
            Some((at, c)) if needs_escape(c) => return Err(refuse(at, SplitProblem::Invisible(c))),
            Some((_, c)) => word.push(c),
        }
    }
}

/// Up to `max` hex (radix 16) or octal (radix 8) digits as a number, and
/// how many there were.
fn digits(chars: &mut Chars<'_>, radix: u32, max: usize) -> (u32, usize) {
    let mut value = 0u32;
    let mut count = 0;
    while count < max {
        match chars.peek().and_then(|&(_, c)| c.to_digit(radix)) {
            Some(digit) => {
                value = value * radix + digit;
                count += 1;
                chars.next();
            }
            None => break,
        }
    }
    (value, count)
}

/// The rest of a `$'...'` whose `$` is at `open`.
fn ansi_c_quoted(open: usize, chars: &mut Chars<'_>, word: &mut String) -> Result<(), SplitError> {
    loop {
        let (at, c) = chars.next().ok_or_else(|| refuse(open, SplitProblem::Unterminated(QuoteKind::AnsiC)))?;
        match c {
            '\'' => return Ok(()),
            '\\' => {
                let (_, escape) = chars.next().ok_or_else(|| refuse(open, SplitProblem::Unterminated(QuoteKind::AnsiC)))?;
                let simple = match escape {
                    '\\' => Some('\\'),
                    '\'' => Some('\''),
                    '"' => Some('"'),
                    '?' => Some('?'),
                    'a' => Some('\x07'),
                    'b' => Some('\x08'),
                    'e' | 'E' => Some('\x1b'),
                    'f' => Some('\x0c'),
                    'n' => Some('\n'),
                    'r' => Some('\r'),
                    't' => Some('\t'),
                    'v' => Some('\x0b'),
                    _ => None,
                };
                if let Some(simple) = simple {
                    word.push(simple);
                    continue;
                }
                let (value, count) = match escape {
                    'x' => digits(chars, 16, 2),
                    'u' => digits(chars, 16, 4),
                    'U' => digits(chars, 16, 8),
                    '0'..='7' => {
                        let (rest, count) = digits(chars, 8, 2);
                        let first = escape.to_digit(8).unwrap_or(0);
                        (first * 8u32.pow(count as u32) + rest, count + 1)
                    }
                    _ => {
                        return Err(refuse(at, SplitProblem::BadEscape("a backslash before a character that is not an escape")));
                    }
                };
                if count == 0 {
                    return Err(refuse(at, SplitProblem::BadEscape("\\x, \\u and \\U need hex digits")));
                }
                let decoded = char::from_u32(value).ok_or_else(|| refuse(at, SplitProblem::BadEscape("not a Unicode scalar value")))?;
                word.push(decoded);
            }
            c if needs_escape(c) => return Err(refuse(at, SplitProblem::Invisible(c))),
            c => word.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    #[test]
    fn quote_picks_the_plainest_form() {
        assert_eq!(quote("git"), "git");
        assert_eq!(quote("origin/fix-123"), "origin/fix-123");
        assert_eq!(quote("a=b,c:d@e%f+g."), "a=b,c:d@e%f+g.");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("two words"), "'two words'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote("$HOME"), "'$HOME'");
        assert_eq!(quote("~"), "'~'");
        assert_eq!(quote("a\\b"), "'a\\b'");
        assert_eq!(quote("café"), "'café'");
        assert_eq!(quote("line\nbreak"), "$'line\\nbreak'");
        assert_eq!(quote("esc\x1b[31m"), "$'esc\\x1b[31m'");
        assert_eq!(quote("it's\t\\"), "$'it\\'s\\t\\\\'");
        assert_eq!(quote("evil\u{202e}txt"), "$'evil\\u202etxt'");
        assert_eq!(quote("tag\u{e0041}"), "$'tag\\U000e0041'");
        assert_eq!(quote_argv(&argv(&["git", "commit", "-m", "fix: it's done"])), "git commit -m 'fix: it'\\''s done'");
        assert_eq!(quote_argv(&[]), "");
    }

    #[test]
    fn split_reads_what_a_developer_types() {
        assert_eq!(split("git push origin fix-123"), Ok(argv(&["git", "push", "origin", "fix-123"])));
        assert_eq!(split("  a \t b\n"), Ok(argv(&["a", "b"])));
        assert_eq!(split(""), Ok(vec![]));
        assert_eq!(split("   "), Ok(vec![]));
        assert_eq!(split("'' \"\" $''"), Ok(argv(&["", "", ""])));
        assert_eq!(split("a'b c'd"), Ok(argv(&["ab cd"])));
        assert_eq!(split(r#""say \"hi\" \$5 \`x\` \\ \n""#), Ok(argv(&[r#"say "hi" $5 `x` \ \n"#])));
        assert_eq!(split(r"a\ b \$x \; \*"), Ok(argv(&["a b", "$x", ";", "*"])));
        assert_eq!(split("a\\\nb"), Ok(argv(&["ab"])));
        assert_eq!(split(r#"$'\x41\102\u00e9\U0001F600\e\a\'\"\?'"#), Ok(argv(&["AB\u{e9}\u{1f600}\x1b\x07'\"?"])));
        assert_eq!(split(r"$'\x4g'"), Ok(argv(&["\x04g"])));
        assert_eq!(split("a#b x~ }"), Ok(argv(&["a#b", "x~", "}"])));
        assert_eq!(split("'#' '~'"), Ok(argv(&["#", "~"])));
    }

    #[test]
    fn split_refuses_shell_syntax_with_its_offset() {
        let cases: &[(&str, usize)] = &[
            ("echo $HOME", 5),
            ("echo ${x}", 5),
            ("echo $\"x\"", 5),
            ("echo `id`", 5),
            ("a; b", 1),
            ("a | b", 2),
            ("a && b", 2),
            ("a & ", 2),
            ("a > f", 2),
            ("a <f", 2),
            ("(a)", 0),
            ("ls *.rs", 3),
            ("ls a?", 4),
            ("ls [ab]", 3),
            ("echo {a,b}", 5),
            ("echo !!", 5),
            ("cd ~", 3),
            ("cd ~/x", 3),
            ("a #comment", 2),
            ("echo \"$x\"", 6),
            ("echo \"`id`\"", 6),
        ];
        for &(line, offset) in cases {
            match split(line) {
                Err(SplitError { offset: at, problem: SplitProblem::ShellSyntax { .. } }) => {
                    assert_eq!(at, offset, "{line}");
                }
                other => panic!("{line}: {other:?}"),
            }
        }
    }

    #[test]
    fn split_refuses_malformed_and_invisible_input() {
        let unterminated = |offset, kind| Err(SplitError { offset, problem: SplitProblem::Unterminated(kind) });
        assert_eq!(split("a 'b"), unterminated(2, QuoteKind::Single));
        assert_eq!(split("a \"b\\\""), unterminated(2, QuoteKind::Double));
        assert_eq!(split("a $'b\\'"), unterminated(2, QuoteKind::AnsiC));
        assert_eq!(split("a $'b\\"), unterminated(2, QuoteKind::AnsiC));
        assert_eq!(split("a\\"), Err(SplitError { offset: 1, problem: SplitProblem::TrailingBackslash }));
        assert!(matches!(split("$'\\q'"), Err(SplitError { offset: 2, problem: SplitProblem::BadEscape(_) })));
        assert!(matches!(split("$'\\x'"), Err(SplitError { offset: 2, problem: SplitProblem::BadEscape(_) })));
        assert!(matches!(split("$'\\ud800'"), Err(SplitError { offset: 2, problem: SplitProblem::BadEscape(_) })));
        assert!(matches!(split("$'\\U00110000'"), Err(SplitError { offset: 2, problem: SplitProblem::BadEscape(_) })));
        for line in ["a\u{202e}b", "'a\u{202e}'", "\"\u{200b}\"", "$'\u{feff}'", "\\\u{2066}", "a\rb", "a\x1b[2J"] {
            assert!(matches!(split(line), Err(SplitError { problem: SplitProblem::Invisible(_), .. })), "{line:?}");
        }
        let message = split("x $y").map_err(|e| e.to_string());
        assert_eq!(
            message,
            Err("at byte 2: '$' would be a parameter expansion or command substitution in a shell, but no shell runs this: quote it or remove it".to_owned())
        );
        let message = split("\u{202e}").map_err(|e| e.to_string());
        assert_eq!(message, Err("at byte 0: invisible or control character U+202E: write it as $'\\u202e' if it is meant".to_owned()));
    }

    /// Hand-picked arguments that stress every quoting form.
    const TRICKY: &[&str] = &[
        "",
        " ",
        "'",
        "''",
        "\"",
        "\\",
        "\\\\",
        "$",
        "$'",
        "$'x'",
        "`",
        "a b",
        "it's",
        "\n",
        "\r\n",
        "\t",
        "\x1b[2J",
        "\x1b]0;t\x07",
        "\0",
        "\x7f",
        "\u{85}",
        "\u{9b}",
        "\u{202e}evil",
        "\u{2066}\u{2069}",
        "\u{200b}",
        "\u{feff}",
        "\u{e0041}",
        "\u{fe0f}",
        "\u{a0}",
        "café",
        "日本語",
        "😀",
        "~",
        "~/x",
        "#",
        "#x",
        "a#",
        "*",
        "?",
        "[",
        "{a,b}",
        "!",
        ";",
        "|",
        "&&",
        "<",
        ">",
        "(",
        ")",
        "-",
        "--",
        "=",
        "x=1",
        "\\x41",
        "\\u202e",
        "$'\\n'",
        "'\\''",
        "\"'\"",
        "\\\n",
    ];

    /// A small deterministic pseudo-random generator (xorshift64*), so the
    /// property test needs no dependency and always explores the same cases.
    struct Generator(u64);

    impl Generator {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }

        fn below(&mut self, bound: usize) -> usize {
            (self.next() % bound as u64) as usize
        }

        fn char(&mut self) -> char {
            const INTERESTING: &[char] = &[
                ' ',
                '\'',
                '"',
                '\\',
                '$',
                '`',
                '\n',
                '\t',
                '\r',
                '\x1b',
                '\0',
                '\x7f',
                '#',
                '~',
                '*',
                '!',
                '{',
                ';',
                'a',
                'Z',
                '0',
                '-',
                '/',
                '=',
                '\u{85}',
                '\u{9b}',
                '\u{a0}',
                '\u{ad}',
                '\u{202e}',
                '\u{2066}',
                '\u{200b}',
                '\u{feff}',
                '\u{fe0f}',
                '\u{e0001}',
                '\u{e0100}',
                'é',
                '日',
                '😀',
                '\u{10ffff}',
            ];
            match self.below(4) {
                0 => char::from_u32(self.below(0x11_0000) as u32).unwrap_or('x'),
                1 => char::from_u32(self.below(0x100) as u32).unwrap_or('x'),
                _ => INTERESTING[self.below(INTERESTING.len())],
            }
        }

        fn arg(&mut self) -> String {
            if self.below(5) == 0 {
                return TRICKY[self.below(TRICKY.len())].to_owned();
            }
            let length = self.below(8);
            (0..length).map(|_| self.char()).collect()
        }
    }

    fn assert_round_trip(argv: &[String]) {
        let line = quote_argv(argv);
        assert_eq!(split(&line).as_deref(), Ok(argv), "line {line:?}");
        assert!(!line.chars().any(needs_escape), "raw escaped character in {line:?}");
    }

    #[test]
    fn quoted_argv_splits_back_exactly() {
        for arg in TRICKY {
            assert_round_trip(&[(*arg).to_owned()]);
            assert_round_trip(&[(*arg).to_owned(), (*arg).to_owned(), "x".to_owned()]);
        }
        assert_round_trip(&TRICKY.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>());
        assert_round_trip(&[]);
        let mut generator = Generator(0x9E37_79B9_7F4A_7C15);
        for _ in 0..20_000 {
            let count = generator.below(6);
            let argv: Vec<String> = (0..count).map(|_| generator.arg()).collect();
            assert_round_trip(&argv);
        }
    }

    #[test]
    fn every_hidden_character_round_trips_and_is_escaped() {
        let all: Vec<String> = (0u32..=0x10_FFFF).filter_map(char::from_u32).filter(|&c| needs_escape(c)).map(String::from).collect();
        assert!(all.len() > 300, "{}", all.len());
        for chunk in all.chunks(64) {
            assert_round_trip(chunk);
            assert_round_trip(&[chunk.concat()]);
        }
    }
}
