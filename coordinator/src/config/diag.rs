//! Located diagnostics and the configuration error type.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

/// One problem found in a configuration file, with its location and a hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file the problem is in, as given to the loader.
    pub file: String,
    /// 1-based line of the offending text.
    pub line: usize,
    /// 1-based column (in characters) of the offending text.
    pub column: usize,
    /// What is wrong.
    pub message: String,
    /// How to fix it.
    pub hint: Option<String>,
}

impl Diagnostic {
    /// The `FILE:LINE:COLUMN` location of this diagnostic.
    pub fn location(&self) -> String {
        format!("{}:{}:{}", self.file, self.line, self.column)
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location(), self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// Turns byte offsets of one source text into line and column numbers.
#[derive(Debug, Clone)]
pub(crate) struct SourceMap<'a> {
    file: String,
    text: &'a str,
}

impl<'a> SourceMap<'a> {
    pub(crate) fn new(file: String, text: &'a str) -> Self {
        Self { file, text }
    }

    pub(crate) fn file(&self) -> &str {
        &self.file
    }

    /// 1-based (line, column) of a byte offset; offsets past the end clamp.
    pub(crate) fn line_column(&self, offset: usize) -> (usize, usize) {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let before = &self.text[..offset];
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = before[line_start..].chars().count() + 1;
        (line, column)
    }

    /// `FILE:LINE:COLUMN` of a span's start.
    pub(crate) fn origin(&self, span: &Range<usize>) -> String {
        let (line, column) = self.line_column(span.start);
        format!("{}:{}:{}", self.file, line, column)
    }

    pub(crate) fn diagnostic(&self, span: &Range<usize>, message: impl Into<String>, hint: Option<String>) -> Diagnostic {
        let (line, column) = self.line_column(span.start);
        Diagnostic { file: self.file.clone(), line, column, message: message.into(), hint }
    }
}

/// Why a configuration could not be found, read or accepted.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// No file exists at the discovered path.
    #[error(
        "no Lazaret configuration at {path} (found via {source_of_path})\n  hint: copy docs/config.example.toml from the Lazaret sources to {path} and edit it, or pass --config FILE"
    )]
    NotFound {
        /// The path that was tried.
        path: PathBuf,
        /// Which rule chose the path (`--config`, `$LAZARET_CONFIG`, ...).
        source_of_path: String,
    },
    /// The file exists but could not be read.
    #[error("cannot read configuration {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a regular file or may be modified by someone other than
    /// root or the developer.
    #[error("refusing configuration {path}: {reason}\n  hint: {hint}")]
    Insecure {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// How to fix it.
        hint: String,
    },
    /// The file was read but has syntax or validation errors (all of them).
    #[error("{}", render_diagnostics(.diagnostics))]
    Invalid {
        /// Every problem found, in file order.
        diagnostics: Vec<Diagnostic>,
    },
    /// The validated configuration could not be serialised for display.
    #[error("cannot render the configuration: {message}")]
    Render {
        /// The serialiser's message.
        message: String,
    },
    /// No profile was named, there is no `default_profile`, and there is more
    /// than one profile to choose from.
    #[error("no profile selected{}\n  hint: name one on the command line or set default_profile = \"NAME\" in the configuration", known_profiles(.known))]
    NoProfileSelected {
        /// The profiles that exist.
        known: Vec<String>,
    },
    /// A profile name was asked for that the configuration does not define.
    #[error("no profile named {name:?} in the configuration{}", known_profiles(.known))]
    UnknownProfile {
        /// The requested name.
        name: String,
        /// The profiles that do exist.
        known: Vec<String>,
    },
}

fn render_diagnostics(diagnostics: &[Diagnostic]) -> String {
    let mut out = String::new();
    for (index, diagnostic) in diagnostics.iter().enumerate() {
        if index > 0 {
            out.push('\n');
        }
        out.push_str(&diagnostic.to_string());
    }
    if diagnostics.len() > 1 {
        out.push_str(&format!("\n{} errors in configuration", diagnostics.len()));
    }
    out
}

fn known_profiles(known: &[String]) -> String {
    if known.is_empty() {
        "\n  hint: add a [profiles.NAME] table to the configuration".to_string()
    } else {
        format!("\n  known profiles: {}", known.join(", "))
    }
}

/// Suggests the candidate closest to `word` (small edit distance), if any.
pub(crate) fn nearest<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let limit = (word.chars().count() / 3).max(2);
    candidates.iter().map(|c| (edit_distance(word, c), *c)).filter(|(d, _)| *d <= limit).min_by_key(|(d, _)| *d).map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut current = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            let value = (previous[j] + cost).min(previous[j + 1] + 1).min(current[j] + 1);
            current.push(value);
        }
        previous = current;
    }
    previous[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based_and_count_characters() {
        let map = SourceMap::new("f".into(), "ab\nçd = 1\n");
        assert_eq!(map.line_column(0), (1, 1));
        assert_eq!(map.line_column(3), (2, 1));
        // 'ç' is two bytes; 'd' is the second character of line 2.
        assert_eq!(map.line_column(5), (2, 2));
        assert_eq!(map.line_column(1000), (3, 1));
    }

    #[test]
    fn nearest_finds_typos_only() {
        let keys = ["image", "isolate_gitignored", "persistent_dirs"];
        assert_eq!(nearest("imgae", &keys), Some("image"));
        assert_eq!(nearest("persistant_dirs", &keys), Some("persistent_dirs"));
        assert_eq!(nearest("color", &keys), None);
    }
}
