//! A small reader for git's config file syntax, enough to find the few keys
//! Lazaret needs (`core.excludesFile`, `core.hooksPath`, `core.ignoreCase`,
//! `extensions.worktreeConfig`) without ever running `git` on a workspace
//! (a hostile repository config can make git execute code).
//!
//! `[include]` and `[includeIf "…"]` `path` entries are exposed by
//! [`GitConfig::includes`] and spliced in place by
//! [`GitConfig::expand_includes`] (the caller decides how a path is found and
//! read: Git Sentry follows them to protect every included file). The reader
//! follows git's own (config.c) byte for byte; where git would refuse the
//! file, the line is recorded ([`GitConfig::skipped_lines`]) and reading goes
//! on, so a caller can tell an exact reading from a partial one. The
//! differential fuzz target `gitconfig_git` holds it to the installed git.
//!
//! Not supported: `~user/` paths.

/// One parsed config file (or several merged in precedence order).
#[derive(Debug, Default, Clone)]
pub struct GitConfig {
    entries: Vec<Entry>,
    /// 1-based numbers of the lines where git would refuse the file.
    skipped: Vec<usize>,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Lower-cased.
    section: String,
    subsection: Option<String>,
    /// Lower-cased.
    key: String,
    /// `key` as the file spells it (git keeps the case a key was set with).
    key_as_written: String,
    /// As git 2.46 and later read it; `true` for a key without a value.
    value: String,
    /// How git before 2.46 reads the value, where that differs: it turned
    /// every whitespace character inside an unquoted value into a space.
    older_git_value: Option<String>,
}

/// One entry of a config, as [`GitConfig::entries`] gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigEntry<'a> {
    /// Lower-cased.
    pub section: &'a str,
    /// As written (lower-cased in the `[section.sub]` spelling, as git reads it).
    pub subsection: Option<&'a str>,
    /// Lower-cased.
    pub key: &'a str,
    /// The key as the file spells it (for writing it back as git would).
    pub key_as_written: &'a str,
    /// The value as current git reads it.
    pub value: &'a str,
    /// The value as git before 2.46 reads it, where that differs (an
    /// unquoted tab or CR inside it): such an entry means two things.
    pub older_git_value: Option<&'a str>,
}

/// One `include.path` or `includeIf.<condition>.path` entry of a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Include {
    /// The path as written (after value decoding), not resolved.
    pub path: String,
    /// The `includeIf` condition (`gitdir:…`, `onbranch:…`, …), `None` for
    /// a plain `[include]`.
    pub condition: Option<String>,
}

impl GitConfig {
    /// Parses config text as git's own reader does (config.c reads it byte
    /// by byte: headers, keys and values may share lines or span them).
    /// Git refuses a file at its first malformed place; this reader records
    /// that line in [`GitConfig::skipped_lines`] and reads on from the next
    /// line, so a hostile file cannot stop a launch and a caller still sees
    /// every entry a more lenient reading could find.
    pub fn parse(text: &[u8]) -> GitConfig {
        let mut reader = Reader { text, pos: 0, line: 1, char_line: 1, last: 0, eof: false };
        let mut config = GitConfig::default();
        // The section header as git keeps it: `section` or `section.subsection`.
        let mut header = String::new();
        let mut comment = false;
        // A UTF-8 byte order mark is skipped; part of one is an error.
        if text.starts_with(UTF8_BOM) {
            reader.pos = UTF8_BOM.len();
        } else if text.first() == Some(&UTF8_BOM[0]) {
            config.skipped.push(1);
            reader.skip_line();
        }
        while !reader.eof {
            let c = reader.next();
            if c == b'\n' {
                comment = false;
                continue;
            }
            if comment || is_git_space(c) {
                continue;
            }
            let read = match c {
                b'#' | b';' => {
                    comment = true;
                    continue;
                }
                b'[' => read_header(&mut reader).map(|name| header = name),
                c if c.is_ascii_alphabetic() => {
                    read_entry(&mut reader, c).map(|(key, spelled, value)| config.push(&header, &key, &spelled, value))
                }
                _ => Err(Malformed),
            };
            if read.is_err() {
                config.skipped.push(reader.char_line);
                if reader.last != b'\n' {
                    reader.skip_line();
                }
            }
        }
        config
    }

    /// Stores `header.key = value` under the name git gives it: the section
    /// up to the first dot, the key after the last. A NUL ends a C string:
    /// git sees a name or value only up to the first one. Entries before
    /// any header have no name git looks up and are left out.
    fn push(&mut self, header: &str, key: &str, spelled: &str, value: Option<Value>) {
        if header.is_empty() {
            return;
        }
        let mut name = format!("{header}.{key}");
        if let Some(nul) = name.find('\0') {
            name.truncate(nul);
        }
        let (Some(first), Some(last)) = (name.find('.'), name.rfind('.')) else { return };
        let (value, older_git_value) = match value {
            None => ("true".to_owned(), None),
            Some(Value { current, older }) => (current, older),
        };
        let key = name[last + 1..].to_owned();
        // (A NUL in the header can cut the name short of the key read.)
        let key_as_written = if spelled.eq_ignore_ascii_case(&key) { spelled.to_owned() } else { key.clone() };
        self.entries.push(Entry {
            section: name[..first].to_owned(),
            subsection: (last > first).then(|| name[first + 1..last].to_owned()),
            key,
            key_as_written,
            value,
            older_git_value,
        });
    }

    /// Every entry in file order (the Workspace Guard re-writes a config
    /// from these).
    pub fn entries(&self) -> impl Iterator<Item = ConfigEntry<'_>> {
        self.entries.iter().map(|e| ConfigEntry {
            section: &e.section,
            subsection: e.subsection.as_deref(),
            key: &e.key,
            key_as_written: &e.key_as_written,
            value: &e.value,
            older_git_value: e.older_git_value.as_deref(),
        })
    }

    /// Numbers (1-based) of the lines where git would refuse the file
    /// (anything on them, an include among them, was not read). Empty for
    /// an exact reading.
    pub fn skipped_lines(&self) -> &[usize] {
        &self.skipped
    }

    /// The file's `include.path` and `includeIf.<condition>.path` entries,
    /// in file order, whatever the condition (callers that protect files
    /// must assume every condition can become true). A path that older git
    /// reads otherwise comes twice, once for each reading.
    pub fn includes(&self) -> Vec<Include> {
        self.entries.iter().flat_map(includes_of).collect()
    }

    /// This config with every include replaced by what `load` returns for
    /// it, spliced right after the include entry (git reads an included
    /// file at the point of inclusion, so later keys still win). `load`
    /// returns `Ok(None)` for an include it does not follow.
    pub fn expand_includes<E>(&self, mut load: impl FnMut(&Include) -> Result<Option<GitConfig>, E>) -> Result<GitConfig, E> {
        let mut out = GitConfig { entries: Vec::with_capacity(self.entries.len()), skipped: self.skipped.clone() };
        for entry in &self.entries {
            out.entries.push(entry.clone());
            for include in includes_of(entry) {
                if let Some(included) = load(&include)? {
                    out.entries.extend(included.entries);
                }
            }
        }
        Ok(out)
    }

    /// Appends `other`'s entries, which then take precedence (git's "last
    /// one wins" across system, global, repository and worktree files).
    pub fn merge(&mut self, other: GitConfig) {
        self.entries.extend(other.entries);
    }

    /// The last value of `section.key` (no subsection), if any, as current
    /// git reads it.
    pub fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.last(section, key).map(|e| e.value.as_str())
    }

    /// Every reading of the last value of `section.key`: current git's,
    /// then older git's where that differs. A caller that protects a path
    /// protects each.
    pub fn get_readings(&self, section: &str, key: &str) -> Vec<&str> {
        self.last(section, key).map(|e| std::iter::once(e.value.as_str()).chain(e.older_git_value.as_deref()).collect()).unwrap_or_default()
    }

    /// `section.key` as a git boolean (`true/yes/on/1` and a bare key).
    pub fn get_bool(&self, section: &str, key: &str) -> Option<bool> {
        self.get(section, key).map(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "yes" | "on" | "1"))
    }

    fn last(&self, section: &str, key: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .rev()
            .find(|e| e.subsection.is_none() && e.section.eq_ignore_ascii_case(section) && e.key.eq_ignore_ascii_case(key))
    }
}

/// The includes an entry stands for, if it is one: one per reading of its
/// path (empty paths are ignored, as git ignores them).
fn includes_of(entry: &Entry) -> Vec<Include> {
    if entry.key != "path" {
        return Vec::new();
    }
    let condition = match (entry.section.as_str(), &entry.subsection) {
        ("include", None) => None,
        ("includeif", Some(condition)) => Some(condition.clone()),
        _ => return Vec::new(),
    };
    std::iter::once(&entry.value)
        .chain(&entry.older_git_value)
        .filter(|path| !path.is_empty())
        .map(|path| Include { path: path.clone(), condition: condition.clone() })
        .collect()
}

/// Where git stops reading a file.
#[derive(Debug)]
struct Malformed;

/// A decoded value, in both readings.
struct Value {
    current: String,
    older: Option<String>,
}

const UTF8_BOM: &[u8] = b"\xef\xbb\xbf";

/// git's own `isspace()`: space, tab, LF and CR only (a vertical tab or form
/// feed is an ordinary character to git: trimming more would pin another path).
fn is_git_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | b'\r')
}

/// git's `iskeychar()`.
fn is_key_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

/// The bytes as git's `get_next_char()` gives them: CR LF reads as LF, and
/// the end of the text as LF with `eof` set.
struct Reader<'a> {
    text: &'a [u8],
    pos: usize,
    /// The line the next byte is on.
    line: usize,
    /// The line of the byte last returned.
    char_line: usize,
    /// The byte last returned.
    last: u8,
    eof: bool,
}

impl Reader<'_> {
    fn next(&mut self) -> u8 {
        self.char_line = self.line;
        let Some(&byte) = self.text.get(self.pos) else {
            self.eof = true;
            self.last = b'\n';
            return b'\n';
        };
        self.pos += 1;
        let c = if byte == b'\r' && self.text.get(self.pos) == Some(&b'\n') {
            self.pos += 1;
            b'\n'
        } else {
            byte
        };
        if c == b'\n' {
            self.line += 1;
        }
        self.last = c;
        c
    }

    fn skip_line(&mut self) {
        while self.next() != b'\n' {}
    }
}

/// After `[`: `section]`, `section.sub]` (all lower-cased) or
/// `section "sub"]` (the subsection as written, `\` escaping any byte):
/// the header as git names it, `section` or `section.sub`.
fn read_header(reader: &mut Reader<'_>) -> Result<String, Malformed> {
    let mut name = Vec::new();
    loop {
        let c = reader.next();
        if reader.eof {
            return Err(Malformed);
        }
        if c == b']' {
            break;
        }
        if is_git_space(c) {
            read_quoted_subsection(reader, &mut name, c)?;
            break;
        }
        if !is_key_char(c) && c != b'.' {
            return Err(Malformed);
        }
        name.push(c.to_ascii_lowercase());
    }
    if name.is_empty() {
        return Err(Malformed);
    }
    Ok(String::from_utf8_lossy(&name).into_owned())
}

/// ` "sub"]` after a section name; `c` is the space that ended the name.
fn read_quoted_subsection(reader: &mut Reader<'_>, name: &mut Vec<u8>, mut c: u8) -> Result<(), Malformed> {
    while is_git_space(c) {
        if c == b'\n' {
            return Err(Malformed);
        }
        c = reader.next();
    }
    if c != b'"' {
        return Err(Malformed);
    }
    name.push(b'.');
    loop {
        let mut c = reader.next();
        if c == b'\n' {
            return Err(Malformed);
        }
        if c == b'"' {
            break;
        }
        if c == b'\\' {
            c = reader.next();
            if c == b'\n' {
                return Err(Malformed);
            }
        }
        name.push(c);
    }
    if reader.next() != b']' {
        return Err(Malformed);
    }
    Ok(())
}

/// A key starting with `first` (a letter), then nothing (a key without a
/// value) or `=` and a value: the key lower-cased (git's name for it), as
/// spelled, and the value.
fn read_entry(reader: &mut Reader<'_>, first: u8) -> Result<(String, String, Option<Value>), Malformed> {
    let mut spelled = String::from(first as char);
    let mut c = reader.next();
    while !reader.eof && is_key_char(c) {
        spelled.push(c as char);
        c = reader.next();
    }
    let key = spelled.to_ascii_lowercase();
    while c == b' ' || c == b'\t' {
        c = reader.next();
    }
    match c {
        b'\n' => Ok((key, spelled, None)),
        b'=' => Ok((key, spelled, Some(read_value(reader)?))),
        _ => Err(Malformed),
    }
}

/// A value up to the end of its (last continued) line: leading and
/// trailing whitespace dropped, `"` toggling quoting, `#`/`;` starting a
/// comment outside quotes, `\` escaping `\`, `"`, `n`, `t`, `b` and the end
/// of a line (any other escape is an error). Unquoted whitespace inside the
/// value is kept as it is (git 2.46 and later) or as spaces (older git).
fn read_value(reader: &mut Reader<'_>) -> Result<Value, Malformed> {
    let mut current = Vec::new();
    let mut older = Vec::new();
    let mut quoted = false;
    let mut comment = false;
    // Where a run of trailing whitespace begins in `current` (0: none).
    let mut trim_at = 0;
    // Unquoted whitespace not yet written to `older`.
    let mut older_spaces = 0;
    loop {
        let c = reader.next();
        if c == b'\n' {
            if quoted {
                return Err(Malformed);
            }
            if trim_at > 0 {
                current.truncate(trim_at);
            }
            break;
        }
        if comment {
            continue;
        }
        if is_git_space(c) && !quoted {
            if trim_at == 0 {
                trim_at = current.len();
            }
            if !current.is_empty() {
                current.push(c);
                older_spaces += 1;
            }
            continue;
        }
        if !quoted && (c == b';' || c == b'#') {
            comment = true;
            continue;
        }
        trim_at = 0;
        older.extend(std::iter::repeat_n(b' ', older_spaces));
        older_spaces = 0;
        let byte = match c {
            b'\\' => match reader.next() {
                b'\n' => continue,
                b't' => b'\t',
                // The character U+0008, not an erase: `hooksX\b` is a path
                // git uses as it stands.
                b'b' => 0x08,
                b'n' => b'\n',
                escaped @ (b'\\' | b'"') => escaped,
                _ => return Err(Malformed),
            },
            b'"' => {
                quoted = !quoted;
                continue;
            }
            c => c,
        };
        current.push(byte);
        older.push(byte);
    }
    let text = |mut bytes: Vec<u8>| {
        if let Some(nul) = bytes.iter().position(|&b| b == 0) {
            bytes.truncate(nul);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    };
    let (current, older) = (text(current), text(older));
    let older = (older != current).then_some(older);
    Ok(Value { current, older })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_core_keys_last_wins() {
        let cfg = GitConfig::parse(
            b"[core]\n\trepositoryformatversion = 0\n\tExcludesFile = \"~/my ignore\" # comment\n\
              [Core]\n\thooksPath = hooks ; trailing\n\tignorecase\n[remote \"origin\"]\n\turl = x\n",
        );
        assert_eq!(cfg.get("core", "excludesfile"), Some("~/my ignore"));
        assert_eq!(cfg.get("core", "hooksPath"), Some("hooks"));
        assert_eq!(cfg.get_bool("core", "ignoreCase"), Some(true));
        assert_eq!(cfg.get("core", "url"), None, "subsection keys are not core keys");
        let mut merged = cfg.clone();
        merged.merge(GitConfig::parse(b"[core]\nhookspath=/abs/hooks\n"));
        assert_eq!(merged.get("core", "hookspath"), Some("/abs/hooks"));
    }

    #[test]
    fn backslash_b_is_a_backspace_character_as_in_git() {
        // Found by fuzz target gitconfig_git: git's `\b` is the character
        // U+0008, so a hooks path written `hooksX\b` is not `hooks`.
        let cfg = GitConfig::parse(b"[core]\n\thooksPath = hooksX\\b\n\texcludesFile = a\\bb\n");
        assert_eq!(cfg.get("core", "hooksPath"), Some("hooksX\u{8}"));
        assert_eq!(cfg.get("core", "excludesFile"), Some("a\u{8}b"));
    }

    #[test]
    fn several_section_headers_on_one_line_are_all_read() {
        // Found by fuzz target gitconfig_git: git reads `[a][core] k = v`
        // as core.k; skipping it would hide a hooksPath from Git Sentry.
        let cfg = GitConfig::parse(b"[c][c]\n[x][core] hooksPath = h\n[core][include]\npath = inc\n");
        assert!(cfg.skipped_lines().is_empty(), "{:?}", cfg.skipped_lines());
        assert_eq!(cfg.get("core", "hooksPath"), Some("h"));
        assert_eq!(cfg.includes(), vec![Include { path: "inc".into(), condition: None }]);
    }

    #[test]
    fn spaces_before_a_line_continuation_are_kept_as_in_git() {
        // Found by fuzz target gitconfig_git: git reads `hooks \` + newline
        // as `hooks ` (and `a \` + `  b  ` as `a   b`).
        let cfg = GitConfig::parse(b"[core]\n\thooksPath = hooks \\\n\n\texcludesFile = a \\\n  b  \n\tx = one\\\ntwo\n");
        assert!(cfg.skipped_lines().is_empty());
        assert_eq!(cfg.get("core", "hooksPath"), Some("hooks "));
        assert_eq!(cfg.get("core", "excludesFile"), Some("a   b"));
        assert_eq!(cfg.get("core", "x"), Some("onetwo"));
    }

    #[test]
    fn escapes_and_garbage() {
        let cfg = GitConfig::parse(b"garbage line\n[core\n[core] excludesfile = a\\\\b\\\"c\n[x.y]\nk=1\n");
        assert_eq!(cfg.get("core", "excludesfile"), Some("a\\b\"c"));
        assert_eq!(cfg.get("x", "k"), None);
        assert_eq!(cfg.skipped_lines(), &[1, 2], "the garbage line and the unterminated header");
    }

    #[test]
    fn includes_in_order_and_spliced_in_place() {
        let cfg = GitConfig::parse(
            b"[core]\n\thooksPath = a\n[include]\n\tpath = one.cfg\n[includeIf \"onbranch:main\"]\n\tpath = \"two words.cfg\"\n\
              [includeIf \"gitdir:~/src/\"]\npath=\n[include \"x\"]\npath = not-an-include\n[core]\n\thooksPath = c\n",
        );
        assert!(cfg.skipped_lines().is_empty());
        assert_eq!(
            cfg.includes(),
            vec![
                Include { path: "one.cfg".into(), condition: None },
                Include { path: "two words.cfg".into(), condition: Some("onbranch:main".into()) },
            ]
        );
        let expanded = cfg
            .expand_includes(|inc| {
                Ok::<_, ()>(match inc.path.as_str() {
                    "one.cfg" => Some(GitConfig::parse(b"[core]\nhooksPath = b\nexcludesFile = e\n")),
                    _ => None,
                })
            })
            .expect("expand");
        // The include sits between hooksPath = a and hooksPath = c: c wins.
        assert_eq!(expanded.get("core", "hooksPath"), Some("c"));
        assert_eq!(expanded.get("core", "excludesFile"), Some("e"));
        let only_first = GitConfig::parse(b"[include]\npath = one.cfg\n[core]\nx = 1\n")
            .expand_includes(|_| Ok::<_, ()>(Some(GitConfig::parse(b"[core]\nx = 2\n"))))
            .expect("expand");
        assert_eq!(only_first.get("core", "x"), Some("1"), "keys after the include win");
    }

    #[test]
    fn a_backslash_in_a_comment_continues_nothing() {
        // Found by fuzz target gitconfig_git: after `;` git skips to the end
        // of the line, a trailing backslash included, so ` two` is a key.
        let config = GitConfig::parse(b"[c]\n\tx = one ; note \\\n two\n\ty = \"a\"\n");
        assert!(config.skipped_lines().is_empty(), "{:?}", config.skipped_lines());
        assert_eq!(config.get("c", "x"), Some("one"));
        assert_eq!(config.get_bool("c", "two"), Some(true));
        assert_eq!(config.get("c", "y"), Some("a"));
    }

    #[test]
    fn what_git_refuses_is_recorded_and_reading_goes_on() {
        // A comment after a key without a value, an unknown escape, a quote
        // left open: git refuses each file; the keys after are still read.
        let config = GitConfig::parse(b"[core]\n\tbare ; c\n\ta = x\\q\n\tb = \"open\n\thooksPath = h\n");
        assert_eq!(config.skipped_lines(), &[2, 3, 4]);
        assert_eq!(config.get("core", "hooksPath"), Some("h"));
        assert_eq!(config.get("core", "a"), None);
        // A key must start with a letter.
        assert_eq!(GitConfig::parse(b"[core]\n\t1x = 1\n").skipped_lines(), &[2]);
        // A byte order mark is skipped; half of one is refused.
        assert_eq!(GitConfig::parse(b"\xef\xbb\xbf[core]\nx = 1\n").get("core", "x"), Some("1"));
        assert_eq!(GitConfig::parse(b"\xef\xbb[core]\nx = 1\n").skipped_lines(), &[1]);
    }

    #[test]
    fn a_tab_inside_a_value_has_two_readings() {
        // git 2.46 keeps it; older git (Debian 12's 2.39) reads a space.
        let config = GitConfig::parse(b"[core]\n\thooksPath = a\tb \t\n\texcludesFile = \"c\td\"\n[include]\n\tpath = e\tf\n");
        assert_eq!(config.get_readings("core", "hooksPath"), ["a\tb", "a b"]);
        assert_eq!(config.get_readings("core", "excludesFile"), ["c\td"], "quoted: one reading");
        let paths: Vec<_> = config.includes().into_iter().map(|i| i.path).collect();
        assert_eq!(paths, ["e\tf", "e f"]);
    }

    #[test]
    fn names_split_at_the_first_and_last_dot_as_in_git() {
        let config = GitConfig::parse(b"[a.B \"C\"]\n\tk = 1\n[x \"y\\\"z\"]\nk = 2\nk2\n");
        let entries: Vec<_> = config.entries().map(|e| (e.section, e.subsection, e.key, e.value)).collect();
        assert_eq!(entries, [("a", Some("b.C"), "k", "1"), ("x", Some("y\"z"), "k", "2"), ("x", Some("y\"z"), "k2", "true")]);
    }

    #[test]
    fn a_vertical_tab_ends_no_value_as_in_git() {
        // Found by the gitconfig_git fuzz target: git keeps "hook\u{b}".
        let config = GitConfig::parse(b"[core]\n\thooksPath = hook\x0b ; trailing\n");
        assert_eq!(config.get("core", "hooksPath"), Some("hook\u{b}"));
    }
}
