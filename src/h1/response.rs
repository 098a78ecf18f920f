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

use super::date;

/// What the body says about its length before the head is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// Exactly this many bytes.
    Known(u64),
    /// Not known until it ends.
    Unknown,
}

/// How the body follows the head on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes; 0 also means the body is not sent at all.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// A written head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub framing: Framing,
    /// The connection closes after this response.
    pub last: bool,
}

/// A head hyper would not write either.
#[derive(Debug, thiserror::Error)]
pub enum InvalidHead {
    #[error("the response has a Content-Length that contradicts its body or another one")]
    ContentLength,
    #[error("the response has a length field after its framing was decided")]
    LengthAfterFraming,
}

/// Writes the head of a response to `out`. `body` is `None` for a body that
/// has already ended. `keep_alive` is false when the connection closes after
/// this response (the client asked, or the server is draining).
///
/// `headers` is left as it was, except for the `Connection: close` added when
/// `keep_alive` is false. A 1xx status is answered with an empty 500 that
/// closes the connection (hyper's answer: a response cannot be
/// informational).
pub fn encode_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &mut HeaderMap,
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
                if !entry.iter().any(|v| has_token(v, b"close")) {
                    entry.append(HeaderValue::from_static("close"));
                }
            }
            http::header::Entry::Vacant(entry) => {
                entry.insert(HeaderValue::from_static("close"));
            }
        }
    }
    let start = out.len();
    let result = encode(out, status, headers, body, is_head, !keep_alive);
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
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
    let mut previous: Option<&HeaderName> = None;
    let mut first_length: Option<u64> = None;

    for (name, value) in headers.iter() {
        if previous != Some(name) {
            if line_open {
                out.extend_from_slice(b"\r\n");
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
                    let length = digits(value.as_bytes()).ok_or(InvalidHead::ContentLength)?;
                    match first_length {
                        Some(first) if first != length => return Err(InvalidHead::ContentLength),
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
            if line_open {
                join_value(out, value);
            } else {
                framing = Framing::Chunked;
                open_line(out, name, value);
                line_open = true;
            }
            continue;
        } else if *name == CONNECTION || *name == TRAILER {
            if *name == CONNECTION && has_token(value, b"close") {
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
        out.extend_from_slice(b"\r\n");
    }

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

fn join_value(out: &mut Vec<u8>, value: &HeaderValue) {
    out.extend_from_slice(b", ");
    out.extend_from_slice(value.as_bytes());
}

/// Whether a comma-separated value lists `token` (ASCII case-insensitive).
fn has_token(value: &HeaderValue, token: &[u8]) -> bool {
    value
        .as_bytes()
        .split(|b| *b == b',')
        .any(|item| item.trim_ascii().eq_ignore_ascii_case(token))
}

/// A length field's value: ASCII digits only, no overflow (hyper's rule).
pub(crate) fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Appends the size line of a chunk of `len` bytes.
pub fn chunk_size_line(out: &mut Vec<u8>, len: usize) {
    let mut digits = [0u8; 16];
    let mut at = digits.len();
    let mut rest = len;
    loop {
        at -= 1;
        digits[at] = b"0123456789abcdef"[rest & 0xf];
        rest >>= 4;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
    out.extend_from_slice(b"\r\n");
}
