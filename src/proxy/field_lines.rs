//! Header fields the gateway adds to a response, kept as the lines they will
//! be on the wire (`name: value\r\n`) until the response head is written.
//!
//! The rate-limit fields (five to eight per response) used to go into the
//! response's `HeaderMap`, where every insert hashes the name and probes the
//! table: about a tenth of a request's user-space instructions, for fields
//! nobody reads before they are written out. The HTTP/1.1 fast path
//! ([`crate::h1`]) copies these lines into the head as they are. Where a map
//! is needed (hyper's path), [`FieldLines::apply`] inserts them.
//!
//! Names are the gateway's own constants; values are numbers or text the
//! gateway serialized (structured fields, a policy built at load time), so a
//! line never needs escaping or checking here.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::structured::ListWriter;

/// Fields to add to a response head, in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FieldLines {
    text: String,
    /// Bit `len % 64` is set for every name pushed: a cheap first test of
    /// whether a name could be one of ours.
    name_lengths: u64,
}

impl FieldLines {
    /// No fields, and no allocation until one is added.
    pub fn new() -> Self {
        FieldLines::default()
    }

    /// Room for about `bytes` of lines, allocated once.
    pub fn with_capacity(bytes: usize) -> Self {
        FieldLines {
            text: String::with_capacity(bytes),
            name_lengths: 0,
        }
    }

    /// Adds `name: value`. `value` must be a valid field value (the
    /// gateway's own text).
    pub fn push(&mut self, name: &HeaderName, value: &str) {
        self.note_name(name);
        self.text.push_str(name.as_str());
        self.text.push_str(": ");
        self.text.push_str(value);
        self.text.push_str("\r\n");
    }

    /// Adds `name: value` for an existing header value, if it is text.
    pub fn push_value(&mut self, name: &HeaderName, value: &HeaderValue) {
        if let Ok(value) = value.to_str() {
            self.push(name, value);
        }
    }

    /// Adds `name: n`.
    pub fn push_number(&mut self, name: &HeaderName, n: u64) {
        self.push(name, itoa::Buffer::new().format(n));
    }

    /// Adds `name: ` followed by a structured-field List that `write` fills;
    /// a list left empty adds nothing (RFC 9651: omit the field).
    pub fn push_list(&mut self, name: &HeaderName, write: impl FnOnce(&mut ListWriter<'_>)) {
        let start = self.text.len();
        self.note_name(name);
        self.text.push_str(name.as_str());
        self.text.push_str(": ");
        let mut list = ListWriter::new(&mut self.text);
        write(&mut list);
        if list.is_empty() {
            self.text.truncate(start);
        } else {
            self.text.push_str("\r\n");
        }
    }

    fn note_name(&mut self, name: &HeaderName) {
        self.name_lengths |= 1 << (name.as_str().len() % 64);
    }

    /// The lines, each ending in CRLF.
    pub fn as_bytes(&self) -> &[u8] {
        self.text.as_bytes()
    }

    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// The fields as (name, value) pairs.
    fn fields(&self) -> impl Iterator<Item = (&str, &str)> {
        self.text
            .split_terminator("\r\n")
            .filter_map(|line| line.split_once(": "))
    }

    /// Inserts the fields into `headers`, each replacing any field of its
    /// name (what the response would have had, had they been inserted one by
    /// one).
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in self.fields() {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.insert(name, value);
            }
        }
    }

    /// Removes from `headers` the fields these lines will set (an upstream's
    /// own rate-limit fields, which the gateway's replace). A scan of the
    /// names' lengths first: usually nothing matches and nothing is hashed.
    pub fn remove_replaced(&self, headers: &mut HeaderMap) {
        let maybe_ours = |name: &HeaderName| {
            let name = name.as_str();
            self.name_lengths & (1 << (name.len() % 64)) != 0 && self.sets(name)
        };
        if self.is_empty() || !headers.keys().any(maybe_ours) {
            return;
        }
        for (name, _) in self.fields() {
            headers.remove(name);
        }
    }

    /// Whether a line sets `name` (lower case, as header names are).
    fn sets(&self, name: &str) -> bool {
        self.fields().any(|(line_name, _)| line_name == name)
    }
}

impl AsRef<[u8]> for FieldLines {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
    static REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");

    #[test]
    fn lines_are_written_as_on_the_wire() {
        let mut lines = FieldLines::new();
        assert!(lines.is_empty());
        lines.push_number(&REMAINING, 42);
        lines.push(&http::header::CACHE_CONTROL, "no-store");
        assert_eq!(
            lines.as_bytes(),
            b"x-ratelimit-remaining: 42\r\ncache-control: no-store\r\n"
        );
    }

    #[test]
    fn an_empty_list_adds_no_line() {
        let mut lines = FieldLines::new();
        lines.push_list(&RATELIMIT, |_| {});
        assert!(lines.is_empty());
        lines.push_list(&RATELIMIT, |list| {
            let _ = list.item_string("a").and_then(|p| p.param_int("r", 1));
        });
        assert_eq!(lines.as_bytes(), b"ratelimit: \"a\";r=1\r\n");
    }

    #[test]
    fn apply_replaces_and_remove_replaced_clears_same_names() {
        let mut lines = FieldLines::new();
        lines.push_number(&REMAINING, 7);
        let mut headers = HeaderMap::new();
        headers.insert(&REMAINING, HeaderValue::from_static("99"));
        headers.append(&REMAINING, HeaderValue::from_static("98"));
        headers.insert("x-other", HeaderValue::from_static("kept"));
        let mut applied = headers.clone();
        lines.apply(&mut applied);
        assert_eq!(
            applied.get_all(&REMAINING).iter().collect::<Vec<_>>(),
            ["7"]
        );
        assert_eq!(applied["x-other"], "kept");
        lines.remove_replaced(&mut headers);
        assert!(!headers.contains_key(&REMAINING));
        assert_eq!(headers["x-other"], "kept");
        // Nothing of ours in the map: it is left alone.
        let mut untouched = HeaderMap::new();
        untouched.insert("x-other", HeaderValue::from_static("kept"));
        lines.remove_replaced(&mut untouched);
        assert_eq!(untouched.len(), 1);
    }
}
