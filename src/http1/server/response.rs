//! Writing a response head, and how its body is framed.
//!
//! This follows hyper's server encoder (`proto::h1::role`) rule for rule, for
//! the requests the fast path takes (HTTP/1.1, never `CONNECT`, never asking
//! for trailers), so a client cannot tell which of the two answered:
//! lower-case names in the map's order; `Content-Length` taken from the body
//! when it knows its size, else chunked; no body (and no chunking) for `HEAD`,
//! 204 and 304; a `Date` unless the response has one; `Connection: close`
//! added when the connection will close. Heads hyper refuses to write (a
//! `Content-Length` that contradicts another) are refused here too, and the
//! connection closes without an answer, as with hyper.

use http::header::{CONNECTION, CONTENT_LENGTH, DATE, TRAILER, TRANSFER_ENCODING};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::ExtraFields;
use crate::http::chunked::{UPPER_HEX, size_line_with};
use crate::http::content_length;
use crate::http::date;
use crate::http::hop_by_hop::{ConnectionToken, connection_tokens, ends_in_chunked};

/// What the body says about its length before the head is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyLength {
    /// Exactly this many bytes.
    Known(u64),
    /// Not known until it ends.
    Unknown,
}

/// How the body follows the head on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// Exactly this many bytes; 0 also means the body is not sent at all.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// A written head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) framing: Framing,
    /// The connection closes after this response.
    pub(crate) last: bool,
}

/// A head hyper would not write either.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InvalidHead {
    #[error("the response has a Content-Length that contradicts its body or another one")]
    ContentLength,
    #[error("the response has a length field after its framing was decided")]
    LengthAfterFraming,
}

/// Writes the head of a response to `out`: the fields of `headers`, then
/// `extra_fields` (see [`ExtraFields`]). `body` is `None` for a body that has already ended. `keep_alive` is false when the connection closes after
/// this response (the client asked, or the server is draining).
///
/// `headers` is left as it was, except for the `Connection: close` added when
/// `keep_alive` is false. A 1xx status is answered with an empty 500 that
/// closes the connection (hyper's answer: a response cannot be
/// informational).
pub(crate) fn encode_head<E: ExtraFields + ?Sized>(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &mut HeaderMap,
    extra_fields: &E,
    body: Option<BodyLength>,
    is_head: bool,
    keep_alive: bool,
) -> Result<Head, InvalidHead> {
    if status.is_informational() {
        out.extend_from_slice(b"HTTP/1.1 500 Internal Server Error\r\n");
        if !is_head {
            out.extend_from_slice(b"content-length: 0\r\n");
        }
        out.extend_from_slice(b"date: ");
        date::extend(out);
        out.extend_from_slice(b"\r\n\r\n");
        return Ok(Head {
            framing: Framing::Length(0),
            last: true,
        });
    }
    if !keep_alive {
        let entry = headers.entry(CONNECTION);
        match entry {
            http::header::Entry::Occupied(mut entry) => {
                if !entry.iter().any(asks_to_close) {
                    entry.append(HeaderValue::from_static("close"));
                }
            }
            http::header::Entry::Vacant(entry) => {
                entry.insert(HeaderValue::from_static("close"));
            }
        }
    }
    let start = out.len();
    let result = encode(
        out,
        status,
        headers,
        extra_fields,
        body,
        is_head,
        !keep_alive,
    );
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode<E: ExtraFields + ?Sized>(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    extra_fields: &E,
    body: Option<BodyLength>,
    is_head: bool,
    mut last: bool,
) -> Result<Head, InvalidHead> {
    out.reserve(30 + headers.len() * 32);
    if status == StatusCode::OK {
        out.extend_from_slice(b"HTTP/1.1 200 OK\r\n");
    } else {
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        // A reason must be written: many parsers expect one.
        out.extend_from_slice(status.canonical_reason().unwrap_or("<none>").as_bytes());
        out.extend_from_slice(b"\r\n");
    }

    let can_chunk =
        !is_head && !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);
    let can_have_length = !matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED);

    let mut framing = Framing::Length(0);
    let mut wrote_len = false;
    let mut wrote_date = false;
    // A field whose values are joined on one line (`a, b`) is still open.
    let mut line_open = false;
    // The open line is `Transfer-Encoding` and its last coding so far is not
    // `chunked`: hyper adds `, chunked` when the line ends, because the body
    // is sent chunked either way.
    let mut add_chunked = false;
    let mut previous: Option<&HeaderName> = None;
    let mut first_length: Option<u64> = None;

    for (name, value) in headers.iter() {
        if previous != Some(name) {
            if line_open {
                end_line(out, &mut add_chunked);
            }
            line_open = false;
            previous = Some(name);
        }
        if *name == CONTENT_LENGTH {
            if wrote_len && !line_open {
                return Err(InvalidHead::LengthAfterFraming);
            }
            match body {
                Some(BodyLength::Known(known)) => {
                    // As hyper: the body's own length wins; the first field
                    // is written, further ones dropped.
                    if !line_open {
                        framing = Framing::Length(known);
                        open_line(out, name, value);
                        wrote_len = true;
                        line_open = true;
                    }
                    continue;
                }
                Some(BodyLength::Unknown) => {
                    // The crate's one rule: digits only, duplicates equal.
                    let length = content_length::merge(first_length, value.as_bytes())
                        .map_err(|_| InvalidHead::ContentLength)?;
                    match first_length {
                        Some(_) => {}
                        None => {
                            framing = Framing::Length(length);
                            open_line(out, name, value);
                            wrote_len = true;
                            line_open = true;
                            first_length = Some(length);
                        }
                    }
                    continue;
                }
                None if !is_head => continue,
                // HEAD: the field describes the body a GET would have had.
                None => wrote_len = true,
            }
        } else if *name == TRANSFER_ENCODING {
            if wrote_len && !line_open {
                return Err(InvalidHead::LengthAfterFraming);
            }
            if !can_chunk {
                continue;
            }
            wrote_len = true;
            add_chunked = !ends_in_chunked(value.as_bytes());
            if line_open {
                join_value(out, value);
            } else {
                framing = Framing::Chunked;
                open_line(out, name, value);
                line_open = true;
            }
            continue;
        } else if *name == CONNECTION || *name == TRAILER {
            if *name == CONNECTION && asks_to_close(value) {
                last = true;
            }
            if *name == TRAILER && !can_chunk {
                continue;
            }
            if line_open {
                join_value(out, value);
            } else {
                open_line(out, name, value);
                line_open = true;
            }
            continue;
        } else if *name == DATE {
            wrote_date = true;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if line_open {
        end_line(out, &mut add_chunked);
    }
    // The fields kept as lines (relayed and the gateway's own); never
    // framing fields.
    extra_fields.write_to(out);
    wrote_date |= extra_fields.has_date();

    if !wrote_len {
        framing = match body {
            Some(BodyLength::Unknown) if can_chunk => {
                out.extend_from_slice(b"transfer-encoding: chunked\r\n");
                Framing::Chunked
            }
            Some(BodyLength::Unknown) => Framing::Length(0),
            None | Some(BodyLength::Known(0)) => {
                if can_have_length && !is_head {
                    out.extend_from_slice(b"content-length: 0\r\n");
                }
                Framing::Length(0)
            }
            Some(BodyLength::Known(length)) => {
                if can_have_length {
                    out.extend_from_slice(b"content-length: ");
                    out.extend_from_slice(itoa::Buffer::new().format(length).as_bytes());
                    out.extend_from_slice(b"\r\n");
                    Framing::Length(length)
                } else {
                    Framing::Length(0)
                }
            }
        };
    }
    if !can_chunk {
        // HEAD, 204, 304: whatever the fields say, no body follows.
        framing = Framing::Length(0);
    }
    if !wrote_date {
        out.extend_from_slice(b"date: ");
        date::extend(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Head { framing, last })
}

/// Starts a field line whose later values are joined to it.
fn open_line(out: &mut Vec<u8>, name: &HeaderName, value: &HeaderValue) {
    out.extend_from_slice(name.as_str().as_bytes());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value.as_bytes());
}

/// Ends a joined line, adding `, chunked` to a `Transfer-Encoding` line that
/// does not end in it.
fn end_line(out: &mut Vec<u8>, add_chunked: &mut bool) {
    if std::mem::take(add_chunked) {
        out.extend_from_slice(b", chunked\r\n");
    } else {
        out.extend_from_slice(b"\r\n");
    }
}

/// Whether a `Connection` value lists `close`.
fn asks_to_close(value: &HeaderValue) -> bool {
    connection_tokens(value.as_bytes()).any(|token| token == ConnectionToken::Close)
}

fn join_value(out: &mut Vec<u8>, value: &HeaderValue) {
    out.extend_from_slice(b", ");
    out.extend_from_slice(value.as_bytes());
}

/// Appends the size line of a chunk of `len` bytes (upper-case hex, as
/// hyper writes it).
pub(super) fn chunk_size_line(out: &mut Vec<u8>, len: usize) {
    let mut line = [0u8; 18];
    out.extend_from_slice(size_line_with(len, UPPER_HEX, &mut line));
}

#[cfg(test)]
mod tests {
    //! The pieces of the response writer: chunk size lines and the framing `encode_head` decides. Whether the bytes match hyper's
    //! is checked against hyper itself, end to end, in `tests/h1.rs`.

    use super::*;

    fn size_line(len: usize) -> String {
        let mut out = Vec::new();
        chunk_size_line(&mut out, len);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn chunk_size_line_is_the_length_in_hex() {
        for len in [0, 1, 9, 10, 15, 16, 255, 256, 4096, 0xdead_beef, usize::MAX] {
            let line = size_line(len);
            let digits = line
                .strip_suffix("\r\n")
                .unwrap_or_else(|| panic!("{line:?} does not end the line"));
            assert_eq!(
                usize::from_str_radix(digits, 16),
                Ok(len),
                "{line:?} is not {len}"
            );
            // No leading zeros (hyper writes none).
            assert!(digits == "0" || !digits.starts_with('0'), "{line:?}");
        }
    }

    #[test]
    fn chunk_size_line_matches_hyper_letter_case() {
        // hyper writes chunk sizes with `{len:X}` (proto/h1/encode.rs); the
        // fast path promises a client the same bytes from either.
        for len in [0, 1, 15, 16, 255, 4096, 0xdead_beef, usize::MAX] {
            assert_eq!(size_line(len), format!("{len:X}\r\n"), "size {len}");
        }
    }

    /// Encodes a head; returns its text and what was decided.
    fn encode_text(
        status: u16,
        fields: &[(&str, &str)],
        body: Option<BodyLength>,
        is_head: bool,
        keep_alive: bool,
    ) -> (String, Head) {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let mut out = Vec::new();
        let head = encode_head(
            &mut out,
            StatusCode::from_u16(status).unwrap(),
            &mut headers,
            &(),
            body,
            is_head,
            keep_alive,
        )
        .unwrap_or_else(|e| panic!("{status} {fields:?} {body:?}: {e}"));
        (String::from_utf8(out).unwrap(), head)
    }

    /// The head's lines, without the status line, the date's value and the
    /// empty line; checks there is exactly one date line and the head ends.
    fn lines(text: &str) -> Vec<&str> {
        let body = text
            .strip_suffix("\r\n\r\n")
            .unwrap_or_else(|| panic!("head not ended: {text:?}"));
        let mut lines: Vec<&str> = body.split("\r\n").skip(1).collect();
        let dates = lines.iter().filter(|l| l.starts_with("date: ")).count();
        assert_eq!(dates, 1, "{text:?}");
        for line in &mut lines {
            if line.starts_with("date: ") {
                *line = "date: *";
            }
        }
        lines
    }

    #[test]
    fn known_length_writes_content_length() {
        let (text, head) = encode_text(
            200,
            &[("x-a", "1")],
            Some(BodyLength::Known(42)),
            false,
            true,
        );
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text:?}");
        assert_eq!(lines(&text), ["x-a: 1", "content-length: 42", "date: *"]);
        assert_eq!(
            head,
            Head {
                framing: Framing::Length(42),
                last: false
            }
        );
    }

    #[test]
    fn known_length_keeps_the_fields_content_length_line() {
        let (text, head) = encode_text(
            200,
            &[("content-length", "3")],
            Some(BodyLength::Known(3)),
            false,
            true,
        );
        assert_eq!(lines(&text), ["content-length: 3", "date: *"]);
        assert_eq!(head.framing, Framing::Length(3));
    }

    #[test]
    fn unknown_length_is_chunked() {
        let (text, head) = encode_text(201, &[], Some(BodyLength::Unknown), false, true);
        assert!(text.starts_with("HTTP/1.1 201 Created\r\n"), "{text:?}");
        assert_eq!(lines(&text), ["transfer-encoding: chunked", "date: *"]);
        assert_eq!(head.framing, Framing::Chunked);
        assert!(!head.last);
    }

    #[test]
    fn unknown_length_with_a_content_length_field_uses_it() {
        let (text, head) = encode_text(
            200,
            &[("content-length", "7")],
            Some(BodyLength::Unknown),
            false,
            true,
        );
        assert_eq!(lines(&text), ["content-length: 7", "date: *"]);
        assert_eq!(head.framing, Framing::Length(7));
    }

    #[test]
    fn no_body_is_content_length_zero() {
        let (text, head) = encode_text(404, &[], None, false, true);
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"), "{text:?}");
        assert_eq!(lines(&text), ["content-length: 0", "date: *"]);
        assert_eq!(head.framing, Framing::Length(0));
        // A stale length field is dropped (hyper drops it too).
        let (text, _) = encode_text(404, &[("content-length", "9")], None, false, true);
        assert_eq!(lines(&text), ["content-length: 0", "date: *"]);
    }

    #[test]
    fn head_writes_the_length_but_sends_no_body() {
        let (text, head) = encode_text(200, &[], Some(BodyLength::Known(42)), true, true);
        assert_eq!(lines(&text), ["content-length: 42", "date: *"]);
        assert_eq!(head.framing, Framing::Length(0));
        // No body at all: no implied zero length for HEAD.
        let (text, head) = encode_text(200, &[], None, true, true);
        assert_eq!(lines(&text), ["date: *"]);
        assert_eq!(head.framing, Framing::Length(0));
        // A length field describes the GET's body and is kept.
        let (text, _) = encode_text(200, &[("content-length", "42")], None, true, true);
        assert_eq!(lines(&text), ["content-length: 42", "date: *"]);
        // Unknown: neither chunked nor a length.
        let (text, head) = encode_text(200, &[], Some(BodyLength::Unknown), true, true);
        assert_eq!(lines(&text), ["date: *"]);
        assert_eq!(head.framing, Framing::Length(0));
    }

    #[test]
    fn no_content_and_not_modified_have_no_length_and_no_body() {
        for status in [204, 304] {
            for body in [
                None,
                Some(BodyLength::Known(0)),
                Some(BodyLength::Known(5)),
                Some(BodyLength::Unknown),
            ] {
                let (text, head) = encode_text(status, &[], body, false, true);
                assert_eq!(lines(&text), ["date: *"], "{status} {body:?}");
                assert_eq!(head.framing, Framing::Length(0), "{status} {body:?}");
                assert!(!head.last);
            }
            // A transfer-encoding field is dropped: no body to chunk.
            let (text, head) = encode_text(
                status,
                &[("transfer-encoding", "chunked")],
                Some(BodyLength::Unknown),
                false,
                true,
            );
            assert_eq!(lines(&text), ["date: *"], "{status}");
            assert_eq!(head.framing, Framing::Length(0));
        }
    }

    #[test]
    fn closing_adds_connection_close() {
        let (text, head) = encode_text(200, &[], None, false, false);
        assert_eq!(
            lines(&text),
            ["connection: close", "content-length: 0", "date: *"]
        );
        assert!(head.last);
        // Another connection value: `close` is joined to it.
        let (text, head) = encode_text(200, &[("connection", "x-hop")], None, false, false);
        assert_eq!(
            lines(&text),
            ["connection: x-hop, close", "content-length: 0", "date: *"]
        );
        assert!(head.last);
        // Already `close`: not repeated.
        let (text, _) = encode_text(200, &[("connection", "Close")], None, false, false);
        assert_eq!(
            lines(&text),
            ["connection: Close", "content-length: 0", "date: *"]
        );
    }

    #[test]
    fn a_response_connection_close_makes_it_the_last() {
        let (text, head) = encode_text(
            200,
            &[("connection", "close")],
            Some(BodyLength::Known(2)),
            false,
            true,
        );
        assert_eq!(
            lines(&text),
            ["connection: close", "content-length: 2", "date: *"]
        );
        assert!(head.last);
        // Among other tokens, or in a second value.
        let (_, head) = encode_text(200, &[("connection", "x-a ,CLOSE")], None, false, true);
        assert!(head.last);
        let (text, head) = encode_text(
            200,
            &[("connection", "x-a"), ("connection", "close")],
            None,
            false,
            true,
        );
        assert!(head.last);
        assert_eq!(
            lines(&text),
            ["connection: x-a, close", "content-length: 0", "date: *"]
        );
        // `closed` is not `close`.
        let (_, head) = encode_text(200, &[("connection", "closed")], None, false, true);
        assert!(!head.last);
    }

    #[test]
    fn a_date_field_is_not_duplicated() {
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        let (text, _) = encode_text(200, &[("date", date)], None, false, true);
        assert_eq!(text.matches("date: ").count(), 1, "{text:?}");
        assert!(text.contains(&format!("date: {date}\r\n")), "{text:?}");
    }

    #[test]
    fn informational_status_is_a_closing_500() {
        for status in [100, 103] {
            let (text, head) = encode_text(
                status,
                &[("x-a", "1")],
                Some(BodyLength::Known(3)),
                false,
                true,
            );
            assert!(
                text.starts_with("HTTP/1.1 500 Internal Server Error\r\n"),
                "{text:?}"
            );
            assert_eq!(lines(&text), ["content-length: 0", "date: *"]);
            assert_eq!(
                head,
                Head {
                    framing: Framing::Length(0),
                    last: true
                }
            );
        }
    }

    #[test]
    fn status_without_a_reason_gets_a_placeholder() {
        let (text, _) = encode_text(599, &[], None, false, true);
        assert!(text.starts_with("HTTP/1.1 599 <none>\r\n"), "{text:?}");
    }

    #[test]
    fn contradicting_content_lengths_are_refused_and_nothing_written() {
        let mut headers = HeaderMap::new();
        headers.append(CONTENT_LENGTH, HeaderValue::from_static("5"));
        headers.append(CONTENT_LENGTH, HeaderValue::from_static("6"));
        let mut out = b"before".to_vec();
        let result = encode_head(
            &mut out,
            StatusCode::OK,
            &mut headers,
            &(),
            Some(BodyLength::Unknown),
            false,
            true,
        );
        assert!(
            matches!(result, Err(InvalidHead::ContentLength)),
            "{result:?}"
        );
        assert_eq!(out, b"before", "a refused head leaves no bytes");
        // Equal ones are one length.
        let (text, head) = encode_text(
            200,
            &[("content-length", "5"), ("content-length", "5")],
            Some(BodyLength::Unknown),
            false,
            true,
        );
        assert_eq!(lines(&text), ["content-length: 5", "date: *"]);
        assert_eq!(head.framing, Framing::Length(5));
    }

    /// Extra fields given as fixed lines, with or without a `Date`.
    struct Lines(&'static [u8], bool);

    impl ExtraFields for Lines {
        fn write_to(&self, out: &mut Vec<u8>) {
            out.extend_from_slice(self.0);
        }

        fn has_date(&self) -> bool {
            self.1
        }
    }

    #[test]
    fn extra_fields_with_a_date_replace_the_heads_own() {
        let mut out = Vec::new();
        encode_head(
            &mut out,
            StatusCode::OK,
            &mut HeaderMap::new(),
            &Lines(b"date: Sun, 06 Nov 1994 08:49:37 GMT\r\n", true),
            None,
            false,
            true,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "HTTP/1.1 200 OK\r\ndate: Sun, 06 Nov 1994 08:49:37 GMT\r\ncontent-length: 0\r\n\r\n"
        );
    }

    #[test]
    fn extra_fields_follow_the_map_and_precede_length_and_date() {
        let mut headers = HeaderMap::new();
        headers.append("x-upstream", HeaderValue::from_static("1"));
        let mut out = Vec::new();
        let head = encode_head(
            &mut out,
            StatusCode::OK,
            &mut headers,
            &Lines(
                b"ratelimit: \"a\";r=1\r\nx-ratelimit-remaining: 1\r\n",
                false,
            ),
            Some(BodyLength::Known(2)),
            false,
            true,
        )
        .unwrap();
        assert_eq!(head.framing, Framing::Length(2));
        let text = String::from_utf8(out).unwrap();
        let expected = "HTTP/1.1 200 OK\r\nx-upstream: 1\r\nratelimit: \"a\";r=1\r\n\
                        x-ratelimit-remaining: 1\r\ncontent-length: 2\r\ndate: ";
        assert!(text.starts_with(expected), "{text:?}");
    }

    #[test]
    fn a_content_length_that_is_not_digits_with_unknown_body_is_refused() {
        let mut headers = HeaderMap::new();
        headers.append(CONTENT_LENGTH, HeaderValue::from_static("+5"));
        let result = encode_head(
            &mut Vec::new(),
            StatusCode::OK,
            &mut headers,
            &(),
            Some(BodyLength::Unknown),
            false,
            true,
        );
        assert!(
            matches!(result, Err(InvalidHead::ContentLength)),
            "{result:?}"
        );
    }

    #[test]
    fn framing_field_after_a_length_is_refused() {
        // A transfer-encoding after the length was written contradicts it.
        let mut headers = HeaderMap::new();
        headers.append(CONTENT_LENGTH, HeaderValue::from_static("5"));
        headers.append(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        let mut out = Vec::new();
        let result = encode_head(
            &mut out,
            StatusCode::OK,
            &mut headers,
            &(),
            Some(BodyLength::Known(5)),
            false,
            true,
        );
        assert!(
            matches!(result, Err(InvalidHead::LengthAfterFraming)),
            "{result:?}"
        );
        assert!(out.is_empty());
    }

    #[test]
    fn a_transfer_encoding_field_frames_the_body_as_chunked() {
        let (text, head) = encode_text(
            200,
            &[("transfer-encoding", "chunked")],
            Some(BodyLength::Known(5)),
            false,
            true,
        );
        assert_eq!(lines(&text), ["transfer-encoding: chunked", "date: *"]);
        assert_eq!(head.framing, Framing::Chunked);
    }

    #[test]
    fn transfer_encoding_without_chunked_gets_chunked_added() {
        // The body is chunked on the wire, so the field must end in
        // `chunked` or a client reads it until the connection closes; hyper
        // appends `, chunked` (role.rs, `must_write_chunked`).
        let (text, head) = encode_text(
            200,
            &[("transfer-encoding", "gzip")],
            Some(BodyLength::Unknown),
            false,
            true,
        );
        assert_eq!(head.framing, Framing::Chunked);
        assert_eq!(
            lines(&text),
            ["transfer-encoding: gzip, chunked", "date: *"]
        );
    }

    #[test]
    fn fields_keep_their_order_and_repeated_ones_their_lines() {
        let (text, _) = encode_text(
            200,
            &[("x-b", "1"), ("x-a", "2"), ("x-b", "3")],
            Some(BodyLength::Known(1)),
            false,
            true,
        );
        // HeaderMap groups a name's values at its first position.
        assert_eq!(
            lines(&text),
            ["x-b: 1", "x-b: 3", "x-a: 2", "content-length: 1", "date: *"]
        );
    }
}
