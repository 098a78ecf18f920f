//! RFC 9457 problem details (`application/problem+json`): the one writer of
//! the bodies the gateway answers with itself — the codec's refusals
//! (`http1::server::framing`), the fronts' errors (`answer::response`)
//! and their 429s (`answer::ratelimit`).
//!
//! ```text
//! let mut body = String::new();
//! problem::about_blank(&mut body, StatusCode::NOT_FOUND, "Not Found", "no route matches GET /");
//! assert_eq!(body, r#"{"detail":"no route matches GET /","status":404,"title":"Not Found","type":"about:blank"}"#);
//! ```
//!
//! # Members in the caller's order, one copy each
//!
//! A [`ProblemWriter`] writes the members of one object in the order it is
//! given them, into a `String` the caller owns (the 429 path reuses one per
//! thread), and escapes text as RFC 8259 §7 requires, as `serde_json`
//! does. The 429 path runs at flood rates, so a member costs what writing
//! the body out by hand did: its name comes joined at compile time with
//! what precedes it (the object's `{`, or the `,` after a value, with the
//! closing `"` of a string or `"]` of a list of strings) and with what opens
//! its value, so one member is one copy of a literal and one of its value;
//! text is checked for escaping in one pass of a table, and a text written
//! once can be copied where it is needed again without that pass
//! ([`Written`]). Nothing is allocated beyond the buffer's own growth.
//!
//! Members are declared with [`problem_member!`]: RFC 9457's own are here
//! ([`TYPE`], [`TITLE`], [`STATUS`], [`DETAIL`]); a problem type's
//! extension members beside the body that uses them.

use std::fmt::Write as _;
use std::ops::Range;

use http::StatusCode;

/// `application/problem+json`, as text (for field lines, which then need
/// not check a header value's bytes again).
pub(crate) const CONTENT_TYPE: &str = "application/problem+json";

/// The type of a problem that has none beyond its status (RFC 9457 §4.2.1).
pub(crate) const ABOUT_BLANK: &str = "about:blank";

/// Declares a problem member: `text "name"` (a string value), `number
/// "name"` (an integer), `text_list "name"` (a non-empty list of
/// strings), or `object "name"` (an object of members). The name must need
/// no JSON escaping.
macro_rules! problem_member {
    (text $name:literal) => {
        $crate::http::problem::TextMember {
            heads: $crate::http::problem::problem_member!(@heads $name, "\""),
        }
    };
    (number $name:literal) => {
        $crate::http::problem::NumberMember {
            heads: $crate::http::problem::problem_member!(@heads $name, ""),
        }
    };
    (text_list $name:literal) => {
        $crate::http::problem::TextListMember {
            heads: $crate::http::problem::problem_member!(@heads $name, "[\""),
        }
    };
    // The object's `{` is its first member's head.
    (object $name:literal) => {
        $crate::http::problem::ObjectMember {
            heads: $crate::http::problem::problem_member!(@heads $name, ""),
        }
    };
    // One per `After`, in its order.
    (@heads $name:literal, $open:literal) => {
        [
            concat!("{\"", $name, "\":", $open),
            concat!(",\"", $name, "\":", $open),
            concat!("\",\"", $name, "\":", $open),
            concat!("\"],\"", $name, "\":", $open),
        ]
    };
}
pub(crate) use problem_member;

/// A member whose value is a string ([`problem_member!`]).
#[derive(Debug)]
pub(crate) struct TextMember {
    pub(crate) heads: [&'static str; 4],
}

/// A member whose value is an integer ([`problem_member!`]).
#[derive(Debug)]
pub(crate) struct NumberMember {
    pub(crate) heads: [&'static str; 4],
}

/// A member whose value is a non-empty list of strings
/// ([`problem_member!`]).
#[derive(Debug)]
pub(crate) struct TextListMember {
    pub(crate) heads: [&'static str; 4],
}

/// A member whose value is an object ([`problem_member!`]).
#[derive(Debug)]
pub(crate) struct ObjectMember {
    pub(crate) heads: [&'static str; 4],
}

/// A URI reference naming the problem type.
pub(crate) const TYPE: TextMember = problem_member!(text "type");
/// A short summary of the problem type.
pub(crate) const TITLE: TextMember = problem_member!(text "title");
/// The HTTP status of the answer.
pub(crate) const STATUS: NumberMember = problem_member!(number "status");
/// What went wrong with this request.
pub(crate) const DETAIL: TextMember = problem_member!(text "detail");

/// The `title` of an `about:blank` problem: the status's reason phrase
/// (RFC 9457 §4.2.1), or `Error` for a status without one.
pub(crate) fn reason_title(status: StatusCode) -> &'static str {
    status.canonical_reason().unwrap_or("Error")
}

/// Writes an `about:blank` problem to `out`: `detail`, `status`, `title`
/// and `type`, in this order (the order the gateway's bodies have always
/// had, `serde_json`'s sorted one).
pub(crate) fn about_blank(out: &mut String, status: StatusCode, title: &str, detail: &str) {
    about_blank_with(out, status, title, detail, |_| {});
}

/// [`about_blank`] with members of its own after `type` (each name sorting
/// after `type`, so the order stays `serde_json`'s), written by `extend`.
pub(crate) fn about_blank_with(
    out: &mut String,
    status: StatusCode,
    title: &str,
    detail: &str,
    extend: impl FnOnce(&mut ProblemWriter<'_>),
) {
    out.reserve(64 + title.len() + detail.len());
    let mut problem = ProblemWriter::new(out);
    problem.text(&DETAIL, detail);
    problem.number(&STATUS, status.as_u16());
    problem.text(&TITLE, title);
    problem.literal(&TYPE, ABOUT_BLANK);
    extend(&mut problem);
    problem.finish();
}

/// What the last thing written was: which head of the next member follows.
#[derive(Debug, Clone, Copy)]
enum After {
    /// Nothing: the next member opens the object.
    Nothing = 0,
    /// A number.
    Value = 1,
    /// A string, still to be closed by `"`.
    Text = 2,
    /// A list of strings, still to be closed by `"]`.
    TextList = 3,
}

/// Writes one problem object, member by member (see the module doc).
#[derive(Debug)]
pub(crate) struct ProblemWriter<'a> {
    out: &'a mut String,
    after: After,
}

impl<'a> ProblemWriter<'a> {
    /// A writer appending one object to `out`.
    #[inline]
    pub(crate) fn new(out: &'a mut String) -> ProblemWriter<'a> {
        ProblemWriter {
            out,
            after: After::Nothing,
        }
    }

    /// A string member, escaped.
    #[inline]
    pub(crate) fn text(&mut self, member: &TextMember, value: &str) -> Written {
        self.text_with(member, |text| text.escaped(value))
    }

    /// A string member whose value is a constant of the code that needs no
    /// escaping (a type URI, a reason phrase): copied as it is.
    #[inline]
    pub(crate) fn literal(&mut self, member: &TextMember, value: &'static str) {
        self.text_with(member, |text| text.literal(value));
    }

    /// A string member written in pieces by `write`; returns what `write`
    /// returns.
    #[inline]
    pub(crate) fn text_with<R>(
        &mut self,
        member: &TextMember,
        write: impl FnOnce(&mut TextWriter<'_>) -> R,
    ) -> R {
        self.head(&member.heads);
        self.after = After::Text;
        write(&mut TextWriter { out: self.out })
    }

    /// An integer member.
    #[inline]
    pub(crate) fn number(&mut self, member: &NumberMember, value: impl itoa::Integer) {
        self.head(&member.heads);
        self.after = After::Value;
        self.out.push_str(itoa::Buffer::new().format(value));
    }

    /// A list-of-strings member, its items written by `write`.
    #[inline]
    pub(crate) fn text_list(
        &mut self,
        member: &TextListMember,
        write: impl FnOnce(&mut ListWriter<'_>),
    ) {
        self.head(&member.heads);
        let mut list = ListWriter {
            out: self.out,
            items: 0,
        };
        write(&mut list);
        if list.items == 0 {
            // The head opened a first string: an empty list instead.
            self.out.pop();
            self.out.push(']');
            self.after = After::Value;
        } else {
            self.after = After::TextList;
        }
    }

    /// An object member, its members written by `write` (an empty one is
    /// `{}`).
    #[inline]
    pub(crate) fn object(
        &mut self,
        member: &ObjectMember,
        write: impl FnOnce(&mut ProblemWriter<'_>),
    ) {
        self.head(&member.heads);
        let mut inner = ProblemWriter::new(self.out);
        write(&mut inner);
        inner.finish();
        self.after = After::Value;
    }

    /// Closes the object.
    #[inline]
    pub(crate) fn finish(self) {
        self.out.push_str(match self.after {
            After::Nothing => "{}",
            After::Value => "}",
            After::Text => "\"}",
            After::TextList => "\"]}",
        });
    }

    #[inline]
    fn head(&mut self, heads: &[&'static str; 4]) {
        self.out.push_str(heads[self.after as usize]);
    }
}

/// The inside of one JSON string, written in pieces.
#[derive(Debug)]
pub(crate) struct TextWriter<'a> {
    out: &'a mut String,
}

/// Where a piece of text was written (escaped) in the body, to copy it
/// where it is needed again ([`TextWriter::copy`]).
#[derive(Debug, Clone)]
pub(crate) struct Written(Range<usize>);

impl TextWriter<'_> {
    /// `text`, escaped.
    #[inline]
    pub(crate) fn escaped(&mut self, text: &str) -> Written {
        let start = self.out.len();
        escape_into(self.out, text);
        Written(start..self.out.len())
    }

    /// A constant of the code that needs no escaping, as it is.
    #[inline]
    pub(crate) fn literal(&mut self, text: &'static str) {
        debug_assert!(is_plain(text), "{text:?} needs escaping");
        self.out.push_str(text);
    }

    /// An integer's digits.
    #[inline]
    pub(crate) fn number(&mut self, value: impl itoa::Integer) {
        self.out.push_str(itoa::Buffer::new().format(value));
    }

    /// Text written before into the same body, copied as it was written.
    #[inline]
    pub(crate) fn copy(&mut self, written: &Written) {
        self.out.extend_from_within(written.0.clone());
    }
}

/// The strings of a list member.
#[derive(Debug)]
pub(crate) struct ListWriter<'a> {
    out: &'a mut String,
    items: usize,
}

impl ListWriter<'_> {
    /// One more string, written in pieces by `write`.
    #[inline]
    pub(crate) fn item<R>(&mut self, write: impl FnOnce(&mut TextWriter<'_>) -> R) -> R {
        if self.items > 0 {
            self.out.push_str("\",\"");
        }
        self.items += 1;
        write(&mut TextWriter { out: self.out })
    }
}

/// Appends `text` as the inside of a JSON string (RFC 8259 §7), escaped as
/// `serde_json` escapes: `\"`, `\\`, the short forms of `\b`, `\f`, `\n`,
/// `\r` and `\t`, `\u00xx` for the other controls; the rest as it is.
pub(crate) fn escape_into(out: &mut String, text: &str) {
    // Most text needs no escaping: then it goes in whole. The check is a
    // table and no early exit (a limit name is short), a third of what the
    // three comparisons per byte cost.
    if is_plain(text) {
        out.push_str(text);
        return;
    }
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

/// Whether `text` goes into a JSON string as it is.
fn is_plain(text: &str) -> bool {
    text.bytes()
        .fold(true, |plain, b| plain & JSON_PLAIN[usize::from(b)])
}

/// The bytes a JSON string holds as they are: not `"`, `\` or a control
/// (UTF-8's multi-byte sequences are all above them).
pub(crate) static JSON_PLAIN: [bool; 256] = {
    let mut table = [true; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = false;
        b += 1;
    }
    table[b'"' as usize] = false;
    table[b'\\' as usize] = false;
    table
};

#[cfg(test)]
mod tests {
    use super::*;

    const TEXTS: &[&str] = &[
        "per_ip",
        "a\"b",
        "back\\slash",
        "tab\there",
        "line\nfeed\r\u{8}\u{c}",
        "\u{1}x\u{1f}",
        "é ~\u{7f}",
        "no route matches GET /\"x\"",
        "",
    ];

    #[test]
    fn escaping_is_serde_jsons() {
        for text in TEXTS {
            let mut out = String::from("\"");
            escape_into(&mut out, text);
            out.push('"');
            assert_eq!(out, serde_json::to_string(text).unwrap());
        }
        // Every character below 0x80, alone.
        for c in (0u8..0x80).map(char::from) {
            let (text, mut out) = (c.to_string(), String::from("\""));
            escape_into(&mut out, &text);
            out.push('"');
            assert_eq!(out, serde_json::to_string(&text).unwrap(), "{c:?}");
        }
    }

    #[test]
    fn an_about_blank_problem_is_what_serde_json_wrote() {
        for detail in TEXTS {
            for status in [StatusCode::NOT_FOUND, StatusCode::from_u16(599).unwrap()] {
                let mut body = String::new();
                about_blank(&mut body, status, reason_title(status), detail);
                let expected = serde_json::json!({
                    "type": "about:blank",
                    "title": reason_title(status),
                    "status": status.as_u16(),
                    "detail": detail,
                })
                .to_string();
                assert_eq!(body, expected);
            }
        }
    }

    #[test]
    fn members_follow_strings_lists_and_numbers_in_the_order_written() {
        const TAGS: TextListMember = problem_member!(text_list "tags");
        const COUNT: NumberMember = problem_member!(number "count");
        let mut body = String::new();
        let mut problem = ProblemWriter::new(&mut body);
        problem.literal(&TYPE, "https://example.com/p");
        let name = problem.text_with(&DETAIL, |text| {
            text.literal("limit ");
            let name = text.escaped("a\"b");
            text.literal(" of ");
            text.number(3u64);
            name
        });
        problem.text_list(&TAGS, |list| {
            list.item(|text| text.copy(&name));
            list.item(|text| text.escaped("two"));
        });
        problem.number(&COUNT, 7u64);
        problem.text_list(&TAGS, |_| {});
        problem.finish();
        let expected = r#"{"type":"https://example.com/p","detail":"limit a\"b of 3","tags":["a\"b","two"],"count":7,"tags":[]}"#;
        assert_eq!(body, expected);
        serde_json::from_str::<serde_json::Value>(&body).unwrap();
    }

    #[test]
    fn an_object_member_holds_members_and_is_followed_by_others() {
        const ERROR: ObjectMember = problem_member!(object "error");
        const TAGS: TextListMember = problem_member!(text_list "tags");
        let body = written(|p| {
            p.text(&TITLE, "t");
            p.object(&ERROR, |error| {
                error.text(&DETAIL, "d\"");
                error.text_list(&TAGS, |list| {
                    list.item(|text| text.escaped("x"));
                });
            });
            p.number(&STATUS, 429u16);
            p.object(&ERROR, |_| {});
        });
        assert_eq!(
            body,
            r#"{"title":"t","error":{"detail":"d\"","tags":["x"]},"status":429,"error":{}}"#
        );
        serde_json::from_str::<serde_json::Value>(&body).unwrap();
        assert_eq!(written(|p| p.object(&ERROR, |_| {})), r#"{"error":{}}"#);
    }

    /// The object `write` writes.
    fn written(write: impl FnOnce(&mut ProblemWriter<'_>)) -> String {
        let mut body = String::new();
        let mut problem = ProblemWriter::new(&mut body);
        write(&mut problem);
        problem.finish();
        body
    }

    #[test]
    fn every_ending_closes_the_object() {
        const TAGS: TextListMember = problem_member!(text_list "tags");
        assert_eq!(written(|_| {}), "{}");
        assert_eq!(written(|p| p.number(&STATUS, 400u16)), r#"{"status":400}"#);
        let title = written(|p| {
            p.text(&TITLE, "t");
        });
        assert_eq!(title, r#"{"title":"t"}"#);
        let tags = written(|p| {
            p.text_list(&TAGS, |list| {
                list.item(|text| text.escaped("x"));
            })
        });
        assert_eq!(tags, r#"{"tags":["x"]}"#);
    }
}
