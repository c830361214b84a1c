//! A small reader for git's config file syntax, enough to find the few keys
//! Lazaret needs (`core.excludesFile`, `core.hooksPath`, `core.ignoreCase`,
//! `extensions.worktreeConfig`) without ever running `git` on a workspace
//! (a hostile repository config can make git execute code).
//!
//! `[include]` and `[includeIf "…"]` `path` entries are exposed by
//! [`GitConfig::includes`] and spliced in place by
//! [`GitConfig::expand_includes`] (the caller decides how a path is found and
//! read: Git Sentry follows them to protect every included file). Lines git
//! would reject are skipped and counted ([`GitConfig::skipped_lines`]), so a
//! caller can tell an exact reading from a partial one.
//!
//! Not supported: `~user/` paths.

/// One parsed config file (or several merged in precedence order).
#[derive(Debug, Default, Clone)]
pub struct GitConfig {
    /// `(section, subsection, key, value)`; section and key lower-cased.
    entries: Vec<(String, Option<String>, String, String)>,
    /// 1-based numbers of the lines that were skipped as malformed.
    skipped: Vec<usize>,
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
    /// Parses config text leniently: malformed lines are skipped, as a
    /// hostile file must not stop a launch (git itself would refuse it).
    pub fn parse(text: &[u8]) -> GitConfig {
        let text = String::from_utf8_lossy(text);
        let mut entries = Vec::new();
        let mut skipped = Vec::new();
        let mut section = String::new();
        let mut subsection: Option<String> = None;
        let mut lines = text.lines().enumerate();
        while let Some((index, raw)) = lines.next() {
            let line_number = index + 1;
            let mut line = raw.trim_start().to_owned();
            // Join continuation lines (a trailing unescaped backslash).
            while line.ends_with('\\') && !line.ends_with("\\\\") {
                line.pop();
                match lines.next() {
                    Some((_, next)) => line.push_str(next),
                    None => break,
                }
            }
            if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
                continue;
            }
            let mut rest = line.as_str();
            if rest.starts_with('[') {
                let Some(end) = rest.find(']') else {
                    skipped.push(line_number);
                    continue;
                };
                let header = &rest[1..end];
                if let Some(quote) = header.find('"') {
                    section = header[..quote].trim().to_ascii_lowercase();
                    let sub = header[quote + 1..].trim_end().trim_end_matches('"');
                    subsection = Some(sub.replace("\\\"", "\"").replace("\\\\", "\\"));
                } else if let Some((sec, sub)) = header.split_once('.') {
                    section = sec.trim().to_ascii_lowercase();
                    subsection = Some(sub.trim().to_ascii_lowercase());
                } else {
                    section = header.trim().to_ascii_lowercase();
                    subsection = None;
                }
                rest = rest[end + 1..].trim_start();
                if rest.is_empty() || rest.starts_with('#') || rest.starts_with(';') {
                    continue;
                }
            }
            let (key, value) = match rest.find('=') {
                Some(eq) => (rest[..eq].trim(), parse_value(&rest[eq + 1..])),
                None => (strip_comment(rest).trim(), "true".to_owned()),
            };
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
                skipped.push(line_number);
                continue;
            }
            entries.push((section.clone(), subsection.clone(), key.to_ascii_lowercase(), value));
        }
        GitConfig { entries, skipped }
    }

    /// Numbers (1-based) of the lines skipped as malformed: git itself would
    /// refuse such a file, and anything on those lines (an include among
    /// them) was not read. Empty for an exact reading.
    pub fn skipped_lines(&self) -> &[usize] {
        &self.skipped
    }

    /// The file's `include.path` and `includeIf.<condition>.path` entries,
    /// in file order, whatever the condition (callers that protect files
    /// must assume every condition can become true).
    pub fn includes(&self) -> Vec<Include> {
        self.entries.iter().filter_map(include_of).collect()
    }

    /// This config with every include replaced by what `load` returns for
    /// it, spliced right after the include entry (git reads an included
    /// file at the point of inclusion, so later keys still win). `load`
    /// returns `Ok(None)` for an include it does not follow.
    pub fn expand_includes<E>(
        &self,
        mut load: impl FnMut(&Include) -> Result<Option<GitConfig>, E>,
    ) -> Result<GitConfig, E> {
        let mut out = GitConfig { entries: Vec::with_capacity(self.entries.len()), skipped: self.skipped.clone() };
        for entry in &self.entries {
            out.entries.push(entry.clone());
            if let Some(include) = include_of(entry) {
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

    /// The last value of `section.key` (no subsection), if any.
    pub fn get(&self, section: &str, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .rev()
            .find(|(s, sub, k, _)| sub.is_none() && s.eq_ignore_ascii_case(section) && k.eq_ignore_ascii_case(key))
            .map(|(_, _, _, v)| v.as_str())
    }

    /// `section.key` as a git boolean (`true/yes/on/1` and a bare key).
    pub fn get_bool(&self, section: &str, key: &str) -> Option<bool> {
        self.get(section, key).map(|v| {
            matches!(v.to_ascii_lowercase().as_str(), "true" | "yes" | "on" | "1")
        })
    }
}

/// The include an entry stands for, if it is one (empty paths are ignored,
/// as git ignores them).
fn include_of((section, subsection, key, value): &(String, Option<String>, String, String)) -> Option<Include> {
    if key != "path" || value.is_empty() {
        return None;
    }
    match (section.as_str(), subsection) {
        ("include", None) => Some(Include { path: value.clone(), condition: None }),
        ("includeif", Some(condition)) => Some(Include { path: value.clone(), condition: Some(condition.clone()) }),
        _ => None,
    }
}

/// Removes a `#`/`;` comment outside quotes.
fn strip_comment(s: &str) -> &str {
    let mut in_quotes = false;
    for (i, c) in s.char_indices() {
        match c {
            '"' => in_quotes = !in_quotes,
            '#' | ';' if !in_quotes => return &s[..i],
            _ => {}
        }
    }
    s
}

/// Decodes a value: quotes, escapes, comments, whitespace trimming.
fn parse_value(raw: &str) -> String {
    let mut out = String::new();
    let mut in_quotes = false;
    let mut pending_space = String::new();
    let mut chars = raw.trim_start().chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => in_quotes = !in_quotes,
            '#' | ';' if !in_quotes => break,
            '\\' => {
                out.push_str(&pending_space);
                pending_space.clear();
                match chars.next() {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('b') => {
                        out.pop();
                    }
                    Some(other) => out.push(other),
                    None => {}
                }
            }
            c if c.is_whitespace() && !in_quotes => pending_space.push(c),
            c => {
                out.push_str(&pending_space);
                pending_space.clear();
                out.push(c);
            }
        }
    }
    out
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
}
