//! Configuration errors that a user can act on: each names the file, the line and
//! column, the key path, what was expected, and for a misspelt key the nearest
//! valid name. All problems of one file are reported together.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};

/// One segment of a key path: `routes[1].match.path` is
/// `[Key("routes"), Index(1), Key("match"), Key("path")]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PathSegment {
    Key(String),
    Index(usize),
}

/// A key path inside `gateway.toml`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(pub(crate) Vec<PathSegment>);

impl KeyPath {
    pub(crate) fn key(&self, key: &str) -> KeyPath {
        let mut segments = self.0.clone();
        segments.push(PathSegment::Key(key.to_owned()));
        KeyPath(segments)
    }

    pub(crate) fn index(&self, index: usize) -> KeyPath {
        let mut segments = self.0.clone();
        segments.push(PathSegment::Index(index));
        KeyPath(segments)
    }

    /// Element `index` of `key`, a value written as one item or a list of
    /// `count` (`listen = "a"` or `listen = ["a", "b"]`): the key itself when
    /// it holds one item, so a problem points where the user wrote it.
    pub(crate) fn element(&self, key: &str, count: usize, index: usize) -> KeyPath {
        if count == 1 {
            self.key(key)
        } else {
            self.key(key).index(index)
        }
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                PathSegment::Key(key) => {
                    let bare = !key.is_empty()
                        && key
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                    match (i, bare) {
                        (0, true) => write!(f, "{key}")?,
                        (_, true) => write!(f, ".{key}")?,
                        (0, false) => write!(f, "\"{key}\"")?,
                        (_, false) => write!(f, ".\"{key}\"")?,
                    }
                }
                PathSegment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// A problem found in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    /// Where the problem is; empty for problems of the whole file.
    pub(crate) path: KeyPath,
    /// What is wrong, and what was expected.
    pub(crate) message: String,
    /// 1-based line and column, when known.
    pub(crate) position: Option<(usize, usize)>,
    /// The file the problem is in, when not the main configuration file
    /// (e.g. a consumers file).
    pub(crate) file: Option<PathBuf>,
}

impl Problem {
    pub(crate) fn new(path: KeyPath, message: impl Into<String>) -> Self {
        Problem {
            path,
            message: message.into(),
            position: None,
            file: None,
        }
    }
}

/// Everything wrong with one configuration file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    pub(crate) file: PathBuf,
    pub(crate) problems: Vec<Problem>,
}

impl ConfigError {
    pub(crate) fn io(file: &Path, error: &std::io::Error) -> Self {
        ConfigError {
            file: file.to_owned(),
            problems: vec![Problem::new(
                KeyPath::default(),
                format!("cannot read the file: {error}"),
            )],
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            let file = problem.file.as_ref().unwrap_or(&self.file).display();
            match problem.position {
                Some((line, column)) => write!(f, "{file}:{line}:{column}: ")?,
                None => write!(f, "{file}: ")?,
            }
            if !problem.path.0.is_empty() {
                write!(f, "`{}`: ", problem.path)?;
            }
            write!(f, "{}", problem.message)?;
        }
        Ok(())
    }
}

/// 1-based (line, column) of a byte offset; the column counts characters.
pub(crate) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..text.floor_char_boundary(offset)];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The span of a key path's key (or, for an array element, of the element), so
/// a validation error points at the line the user must edit.
pub(crate) fn span_of(document: &DeTable<'_>, path: &KeyPath) -> Option<Range<usize>> {
    let mut table = document;
    let mut value: Option<&DeValue<'_>> = None;
    let mut span = None;
    for segment in &path.0 {
        match segment {
            PathSegment::Key(key) => {
                let current = match value {
                    None => table,
                    Some(v) => v.as_table()?,
                };
                let (k, v) = current
                    .iter()
                    .find(|(k, _)| k.get_ref().as_ref() == key.as_str())?;
                span = Some(k.span());
                value = Some(v.get_ref());
                table = current;
            }
            PathSegment::Index(index) => {
                let array = value?.as_array()?;
                let element = array.get(*index)?;
                span = Some(element.span());
                value = Some(element.get_ref());
            }
        }
    }
    span
}

/// The key path whose key or value contains `offset`, as deep as possible: used
/// to name the key of a serde error that only carries a span.
pub(crate) fn path_at(document: &DeTable<'_>, offset: usize) -> KeyPath {
    // Spans of `[table]` and `[[array]]` headers do not cover their bodies, so
    // every container is searched, not only those whose span holds `offset`.
    fn walk_value(value: &DeValue<'_>, offset: usize, path: &mut KeyPath) -> bool {
        if let Some(table) = value.as_table() {
            return walk_table(table, offset, path);
        }
        if let Some(array) = value.as_array() {
            for (i, element) in array.iter().enumerate() {
                path.0.push(PathSegment::Index(i));
                if walk_value(element.get_ref(), offset, path) || element.span().contains(&offset) {
                    return true;
                }
                path.0.pop();
            }
        }
        false
    }
    fn walk_table(table: &DeTable<'_>, offset: usize, path: &mut KeyPath) -> bool {
        for (key, value) in table.iter() {
            path.0.push(PathSegment::Key(key.get_ref().to_string()));
            if key.span().contains(&offset)
                || walk_value(value.get_ref(), offset, path)
                || value.span().contains(&offset)
            {
                return true;
            }
            path.0.pop();
        }
        false
    }
    let mut path = KeyPath::default();
    walk_table(document, offset, &mut path);
    path
}

/// The nearest of `candidates` to a misspelt `word`, if any is close enough to
/// be a plausible typo.
pub(crate) fn nearest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::damerau_levenshtein(word, c), c))
        .filter(|(distance, c)| *distance <= (c.len().max(word.len()) / 3).max(2))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| c)
}

/// Rewrites serde's "unknown field `x`, expected one of `a`, `b`" into a message
/// with a suggestion; other messages pass through.
pub(crate) fn explain_serde_message(message: &str) -> String {
    let message = message.trim();
    for prefix in ["unknown field `", "unknown variant `"] {
        let Some(rest) = message.strip_prefix(prefix) else {
            continue;
        };
        let Some((word, tail)) = rest.split_once('`') else {
            continue;
        };
        let candidates: Vec<&str> = tail.split('`').skip(1).step_by(2).collect();
        let kind = if prefix.contains("field") {
            "key"
        } else {
            "value"
        };
        let mut out = format!("unknown {kind} `{word}`");
        if !candidates.is_empty() {
            out.push_str(&format!(", expected one of {}", candidates.join(", ")));
        }
        if let Some(best) = nearest(word, candidates.iter().copied()) {
            out.push_str(&format!(" (did you mean `{best}`?)"));
        }
        return out;
    }
    message.to_owned()
}

/// Rewrites serde's "invalid type: X, expected Y" into the form the user
/// should have written, for the keys people most often get wrong (found by
/// trying the README as a new user: `[routes]` for `[[routes]]`, a string
/// where a list or a number belongs, a bare number for a rate or duration).
/// `None`: no better words than serde's.
pub(crate) fn explain_type_error(path: &KeyPath, message: &str) -> Option<String> {
    let rest = message.trim().strip_prefix("invalid type: ")?;
    let (found, _) = rest.split_once(", expected ")?;
    let PathSegment::Key(key) = path.0.last()? else {
        return None;
    };
    let key = key.as_str();
    // What the user wrote, without serde's decoration: `10`, "20".
    let literal = found
        .split_once(' ')
        .map(|(_, v)| v.trim_matches(|c| c == '`' || c == '"'))
        .unwrap_or("");
    let top = path.0.len() == 1;
    let is = |kind: &str| found.starts_with(kind);
    let text = match key {
        "routes" if top && is("map") => {
            "routes are a list of tables: write `[[routes]]` (two brackets) above each route, \
             not `[routes]`"
                .to_owned()
        }
        "limits" | "upstreams" | "consumers" if top && is("sequence") => {
            let one = key.trim_end_matches('s');
            format!(
                "each {one} is a named table: write `[{key}.NAME]` (one bracket, with a name), \
                 not `[[{key}]]`"
            )
        }
        "limits" | "methods" | "upgrades" | "trusted_cidrs" | "headers" if is("string") => {
            format!("a list is expected: write `{key} = [\"{literal}\"]`")
        }
        "limit" | "capacity" | "max" | "cost" | "lease" | "trusted_hops" | "workers"
        | "max_connections" | "ipv4_prefix" | "ipv6_prefix" | "status"
            if is("string") =>
        {
            format!("a number is expected: write `{key} = {literal}` (without quotes)")
        }
        "refill" | "rate" if is("integer") || is("float") => {
            format!(
                "a rate is a string with a unit: write `{key} = \"{literal}/s\"` \
                 (or \"/m\", \"/h\", \"/d\")"
            )
        }
        "window"
        | "timeout"
        | "connect_timeout"
        | "read_timeout"
        | "shutdown_timeout"
        | "header_read_timeout"
        | "body_read_timeout"
        | "idle_timeout"
        | "reset_jitter"
        | "remember_denials"
            if is("integer") || is("float") =>
        {
            format!(
                "a duration is a string with a unit: write `{key} = \"{literal}s\"` \
                 (or \"ms\", \"m\", \"h\", \"d\")"
            )
        }
        "match" if is("string") => {
            "a route's match is a table: write `match = { path_prefix = \"/api\" }` \
             (keys: path, path_prefix, methods, host, header)"
                .to_owned()
        }
        _ => return None,
    };
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_one_based() {
        let text = "a = 1\nbb = 2\n";
        assert_eq!(line_column(text, 0), (1, 1));
        assert_eq!(line_column(text, 6), (2, 1));
        assert_eq!(line_column(text, 9), (2, 4));
    }

    #[test]
    fn suggests_the_nearest_key() {
        let message = "unknown field `listn`, expected one of `listen`, `admin`, `workers`";
        assert_eq!(
            explain_serde_message(message),
            "unknown key `listn`, expected one of listen, admin, workers (did you mean `listen`?)"
        );
        assert_eq!(nearest("zzzzzz", ["listen", "admin"]), None);
    }

    #[test]
    fn finds_spans_and_paths() {
        let text = "[server]\nlisten = \"x\"\n\n[[routes]]\nname = \"a\"\n\n[[routes]]\nname = \"b\"\nlimits = [\"q\"]\n";
        let document = DeTable::parse(text).unwrap();
        let path = KeyPath::default().key("routes").index(1).key("limits");
        let span = span_of(document.get_ref(), &path).unwrap();
        assert_eq!(line_column(text, span.start), (9, 1));
        let offset = text.find("\"b\"").unwrap();
        assert_eq!(
            path_at(document.get_ref(), offset).to_string(),
            "routes[1].name"
        );
        assert_eq!(path.to_string(), "routes[1].limits");
    }

    #[test]
    fn type_errors_get_the_right_form() {
        let at = |keys: &[&str]| {
            let mut path = KeyPath::default();
            for key in keys {
                path = path.key(key);
            }
            path
        };
        let cases = [
            (
                at(&["routes"]),
                "invalid type: map, expected a sequence",
                "write `[[routes]]`",
            ),
            (
                at(&["limits", "per_key", "capacity"]),
                "invalid type: string \"20\", expected u64",
                "write `capacity = 20` (without quotes)",
            ),
            (
                at(&["limits", "per_key", "refill"]),
                "invalid type: integer `10`, expected a string",
                "write `refill = \"10/s\"`",
            ),
            (
                at(&["limits", "w", "window"]),
                "invalid type: integer `60`, expected a string",
                "write `window = \"60s\"`",
            ),
            (
                at(&["limits"]),
                "invalid type: sequence, expected a map",
                "write `[limits.NAME]`",
            ),
        ];
        for (path, message, wanted) in cases {
            let text = explain_type_error(&path, message).unwrap_or_default();
            assert!(text.contains(wanted), "{path}: {text}");
        }
        assert_eq!(
            explain_type_error(
                &at(&["name"]),
                "invalid type: integer `1`, expected a string"
            ),
            None
        );
    }
}
