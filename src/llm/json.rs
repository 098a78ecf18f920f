//! A streaming lexer of one JSON object's top level: where each member's key
//! ends and its value begins and ends, fed any split of the bytes, in
//! constant memory.
//!
//! It follows strings (with their escapes) and nesting depth, nothing more:
//! what sits inside a member's value is not checked (bracket kinds are not
//! matched), since whoever reads a value parses it with `serde_json`. What it
//! does check is the top level's shape, so that nothing inside a string or a
//! nested value is ever taken for a top-level key: one object, keys that are
//! strings, a `:` after each, a value, then `,` or `}`, and only whitespace
//! after the object. Anything else kills the lexer for the rest of the input.

use std::ops::Range;

/// Raw key bytes kept for [`TopLevel::key_is`]: longer keys match nothing,
/// which is fine for the short member names the callers look for (even
/// spelled with `\u` escapes).
const KEY_MAX: usize = 64;

/// What a byte meant at the top level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mark {
    /// The closing quote of a top-level key ([`TopLevel::key_is`] names it).
    KeyEnd,
    /// The first byte of a top-level member's value.
    ValueStart,
    /// The `,` or `}` right after a top-level member's value (not part of
    /// the value, which may end in whitespace).
    ValueEnd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before the object: whitespace, then `{`.
    Start,
    /// Before a key; `first` right after `{`, where `}` may close it.
    BeforeKey {
        first: bool,
    },
    Key,
    KeyEscape,
    /// After a key, before its `:`.
    Colon,
    /// After the `:`, before the value.
    BeforeValue,
    /// Inside a value, outside strings, `depth` levels below the member.
    Value,
    ValueString,
    ValueStringEscape,
    /// After the object's `}`: only whitespace may follow.
    Closed,
    /// The input is not one JSON object.
    Dead,
}

/// The lexer's state between chunks.
#[derive(Clone, Debug)]
pub(crate) struct TopLevel {
    state: State,
    depth: u32,
    key: [u8; KEY_MAX],
    /// The current key's raw length, past [`KEY_MAX`] included.
    key_len: usize,
}

impl TopLevel {
    pub(crate) fn new() -> TopLevel {
        TopLevel {
            state: State::Start,
            depth: 0,
            key: [0; KEY_MAX],
            key_len: 0,
        }
    }

    /// Whether the input so far cannot be one JSON object.
    pub(crate) fn is_dead(&self) -> bool {
        self.state == State::Dead
    }

    /// Whether the object's closing `}` has been read (and nothing wrong
    /// since).
    pub(crate) fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    /// Reads `chunk`, calling `on_mark` with the index in `chunk` of each
    /// byte that means something at the top level, and the lexer as it is
    /// after that byte (for [`TopLevel::key_is`]).
    pub(crate) fn feed(&mut self, chunk: &[u8], mut on_mark: impl FnMut(usize, Mark, &TopLevel)) {
        let mut at = 0;
        while at < chunk.len() {
            if matches!(self.state, State::ValueString) {
                // The bulk of a body is string contents: skip to what ends
                // or escapes.
                match chunk[at..].iter().position(|&b| b == b'"' || b == b'\\') {
                    Some(offset) => at += offset,
                    None => return,
                }
            }
            if let Some(mark) = self.step(chunk[at]) {
                on_mark(at, mark, self);
            }
            at += 1;
        }
    }

    /// The most recent top-level key is `name` (compared decoded, so
    /// `"us\u0061ge"` is `usage`).
    pub(crate) fn key_is(&self, name: &str) -> bool {
        let Some(raw) = self.key.get(..self.key_len) else {
            return false;
        };
        if !raw.contains(&b'\\') {
            return raw == name.as_bytes();
        }
        let mut quoted = Vec::with_capacity(raw.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(raw);
        quoted.push(b'"');
        serde_json::from_slice::<String>(&quoted).is_ok_and(|key| key == name)
    }

    fn step(&mut self, byte: u8) -> Option<Mark> {
        let (next, mark) = match self.state {
            State::Start => match byte {
                b'{' => (State::BeforeKey { first: true }, None),
                _ if is_whitespace(byte) => (State::Start, None),
                _ => (State::Dead, None),
            },
            State::BeforeKey { first } => match byte {
                b'"' => {
                    self.key_len = 0;
                    (State::Key, None)
                }
                b'}' if first => (State::Closed, None),
                _ if is_whitespace(byte) => (self.state, None),
                _ => (State::Dead, None),
            },
            State::Key => match byte {
                b'"' => (State::Colon, Some(Mark::KeyEnd)),
                b'\\' => {
                    self.push_key(byte);
                    (State::KeyEscape, None)
                }
                _ => {
                    self.push_key(byte);
                    (State::Key, None)
                }
            },
            State::KeyEscape => {
                self.push_key(byte);
                (State::Key, None)
            }
            State::Colon => match byte {
                b':' => (State::BeforeValue, None),
                _ if is_whitespace(byte) => (State::Colon, None),
                _ => (State::Dead, None),
            },
            State::BeforeValue => match byte {
                _ if is_whitespace(byte) => (State::BeforeValue, None),
                b',' | b':' | b'}' | b']' => (State::Dead, None),
                b'"' => (State::ValueString, Some(Mark::ValueStart)),
                b'{' | b'[' => {
                    self.depth = 1;
                    (State::Value, Some(Mark::ValueStart))
                }
                _ => {
                    self.depth = 0;
                    (State::Value, Some(Mark::ValueStart))
                }
            },
            State::Value => self.value_byte(byte),
            State::ValueString => match byte {
                b'"' => (State::Value, None),
                b'\\' => (State::ValueStringEscape, None),
                _ => (State::ValueString, None),
            },
            State::ValueStringEscape => (State::ValueString, None),
            State::Closed if is_whitespace(byte) => (State::Closed, None),
            State::Closed | State::Dead => (State::Dead, None),
        };
        self.state = next;
        mark
    }

    /// A byte of a member's value outside its strings.
    fn value_byte(&mut self, byte: u8) -> (State, Option<Mark>) {
        match byte {
            b'"' => (State::ValueString, None),
            b'{' | b'[' => match self.depth.checked_add(1) {
                Some(depth) => {
                    self.depth = depth;
                    (State::Value, None)
                }
                None => (State::Dead, None),
            },
            b'}' if self.depth == 0 => (State::Closed, Some(Mark::ValueEnd)),
            b',' if self.depth == 0 => (State::BeforeKey { first: false }, Some(Mark::ValueEnd)),
            b']' if self.depth == 0 => (State::Dead, None),
            b'}' | b']' => {
                self.depth -= 1;
                (State::Value, None)
            }
            _ => (State::Value, None),
        }
    }

    fn push_key(&mut self, byte: u8) {
        if let Some(slot) = self.key.get_mut(self.key_len) {
            *slot = byte;
        }
        self.key_len = self.key_len.saturating_add(1);
    }
}

/// JSON's insignificant whitespace (RFC 8259 section 2).
pub(crate) fn is_whitespace(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// The top-level members of a complete JSON object named `key`, for a
/// rewrite: their values' byte ranges (trailing whitespace trimmed), and
/// where a new member goes: after the last member's value, or after `{`
/// when there is none (`empty`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Members {
    pub(crate) named: Vec<Range<usize>>,
    pub(crate) insert_at: usize,
    pub(crate) empty: bool,
}

/// [`Members`] of `object`; `None` unless it is one JSON object by
/// [`TopLevel`]'s reading.
pub(crate) fn members_named(object: &[u8], key: &str) -> Option<Members> {
    let mut lexer = TopLevel::new();
    let mut named = Vec::new();
    let mut value: Option<(usize, bool)> = None;
    let mut last_end = None;
    lexer.feed(object, |at, mark, lexer| match mark {
        Mark::KeyEnd => {}
        Mark::ValueStart => value = Some((at, lexer.key_is(key))),
        Mark::ValueEnd => {
            if let Some((start, is_named)) = value.take() {
                let end = trim_end(object, start, at);
                if is_named {
                    named.push(start..end);
                }
                last_end = Some(end);
            }
        }
    });
    if !lexer.is_closed() {
        return None;
    }
    // The lexer accepted only whitespace before the object's `{`.
    let open = object.iter().position(|&b| b == b'{')? + 1;
    Some(Members {
        named,
        insert_at: last_end.unwrap_or(open),
        empty: last_end.is_none(),
    })
}

/// `end` moved back over the whitespace before it, not before `start`.
fn trim_end(bytes: &[u8], start: usize, mut end: usize) -> usize {
    while end > start && bytes.get(end - 1).is_some_and(|&b| is_whitespace(b)) {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The marks of `input`, with the key each value belongs to.
    fn marks(input: &[u8]) -> (Vec<(usize, Mark)>, bool) {
        let mut lexer = TopLevel::new();
        let mut marks = Vec::new();
        lexer.feed(input, |at, mark, _| marks.push((at, mark)));
        (marks, lexer.is_closed())
    }

    #[test]
    fn marks_keys_and_values_at_the_top_level_only() {
        let input = br#" {"a" : [1,{"b":2}] , "c":"}\"," }"#;
        let (found, closed) = marks(input);
        assert!(closed);
        assert_eq!(
            found,
            vec![
                (4, Mark::KeyEnd),
                (8, Mark::ValueStart),
                (20, Mark::ValueEnd),
                (24, Mark::KeyEnd),
                (26, Mark::ValueStart),
                (33, Mark::ValueEnd),
            ]
        );
    }

    #[test]
    fn keys_compare_decoded_and_long_ones_match_nothing() {
        let mut lexer = TopLevel::new();
        let mut keys = Vec::new();
        lexer.feed(
            br#"{"us\u0061ge":1,"usage\"":2,"usage":3}"#,
            |_, mark, lexer| {
                if mark == Mark::ValueStart {
                    keys.push(lexer.key_is("usage"));
                }
            },
        );
        assert_eq!(keys, vec![true, false, true]);
        let long = format!(r#"{{"{}usage":1}}"#, "\\u0020".repeat(KEY_MAX));
        let mut lexer = TopLevel::new();
        let mut matched = false;
        lexer.feed(long.as_bytes(), |_, _, lexer| {
            matched |= lexer.key_is("usage")
        });
        assert!(!matched && lexer.is_closed());
    }

    #[test]
    fn only_one_object_is_accepted() {
        for bad in [
            &b"[]"[..],
            b"{} {}",
            b"{,}",
            b"{\"a\"}",
            b"{\"a\":}",
            b"{\"a\":1,}",
            b"{\"a\":1]",
            b"x",
        ] {
            let mut lexer = TopLevel::new();
            lexer.feed(bad, |_, _, _| {});
            assert!(!lexer.is_closed(), "{:?}", String::from_utf8_lossy(bad));
        }
        let mut lexer = TopLevel::new();
        lexer.feed(b"{}", |_, _, _| {});
        assert!(lexer.is_closed());
    }

    #[test]
    fn members_named_gives_trimmed_value_ranges() {
        let object = br#"{ "x" : 1 , "y":{"x":2}, "x":"3"  }"#;
        let members = members_named(object, "x");
        assert_eq!(
            members,
            Some(Members {
                named: vec![8..9, 29..32],
                insert_at: 32,
                empty: false,
            })
        );
        assert_eq!(
            members_named(b" { } ", "x"),
            Some(Members {
                named: vec![],
                insert_at: 2,
                empty: true,
            })
        );
        assert_eq!(members_named(br#"{"x":1"#, "x"), None);
    }
}
