//! Message heads on the upstream connection: the request head written out,
//! the response head parsed in, and how the response body is delimited
//! (RFC 9112 §6.3).
//!
//! Parsing uses `httparse` (hyper's own parser) over the connection's read
//! buffer. The fields the client will see are copied out as lines
//! ([`FieldLines`], one allocation for the whole head) rather than built into
//! a header map nobody reads.

use std::io;

use bytes::{Buf, BytesMut};
use http::header::{self, HeaderName};
use http::{Method, StatusCode, Version, request, response};
use smallvec::SmallVec;

use crate::http::content_length::{self, ContentLengthError};
use crate::http::field_lines::FieldLines;
use crate::http::hop_by_hop::{
    ConnectionToken, connection_tokens, ends_in_chunked, is_hop_by_hop, is_name,
};

/// Largest response head accepted from an upstream.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Most header fields in a response head (hyper's default too).
const MAX_FIELDS: usize = 100;

/// How a request body goes up, chosen from what is known of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestFraming {
    /// No body: the client's own `Content-Length` (if it sent `0`) is kept.
    Empty,
    /// A body of this exact length.
    Length(u64),
    /// A body of unknown length, chunked.
    Chunked,
}

/// How the response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 1xx, 204, 304, or `Content-Length: 0`).
    Empty,
    Length(u64),
    Chunked,
    /// Everything until the upstream closes the connection.
    UntilClose,
}

/// A parsed response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// Status and version; the header map stays empty.
    pub parts: response::Parts,
    /// The fields the client sees, as lines.
    pub fields: FieldLines,
    pub framing: Framing,
    /// Whether the connection may carry another request after this response.
    pub keep_alive: bool,
}

/// What the read buffer held.
// One per response, matched at once: boxing the head would cost an
// allocation per response to make the other variants smaller.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Parsed {
    Head(ResponseHead),
    /// A 1xx other than 101, consumed, with the head to relay to the client
    /// (`None` for a `100`; see [`super::interim`]); a final response follows.
    Interim(Option<Vec<u8>>),
    /// Not a whole head yet: read more.
    Partial,
}

/// An `InvalidData` error: what the upstream sent breaks HTTP/1.1.
pub(super) fn invalid(what: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// Fields the sender writes into a request head itself: rendered lines,
/// and the request's own fields they replace or that must not go on.
///
/// A proxy rewrites a few fields of every request (`Host`, the forwarding
/// fields, hop-by-hop ones); writing them straight into the head costs a
/// comparison per field, where editing the header map cost a hashed insert
/// or removal and a new value each.
#[derive(Debug, Default, Clone)]
pub struct OwnFields {
    /// `name: value\r\n` lines, written before the request's fields.
    pub(crate) lines: Vec<u8>,
    /// The request's fields left out.
    pub(crate) omit: SmallVec<[HeaderName; 8]>,
    /// The lines ask the upstream to switch protocols (`Upgrade`).
    pub(crate) upgrade: bool,
}

impl OwnFields {
    /// Adds a `name: value` line.
    pub(crate) fn push(&mut self, name: &str, value: &[u8]) {
        self.lines.extend_from_slice(name.as_bytes());
        self.lines.extend_from_slice(b": ");
        self.lines.extend_from_slice(value);
        self.lines.extend_from_slice(b"\r\n");
    }
}

/// Writes the request line and header section into `out`: origin-form
/// target, HTTP/1.1, `own`'s lines, the headers of `parts` but those `own`
/// omits (and with `Content-Length` or `Transfer-Encoding` as `framing`
/// says).
pub(crate) fn encode_request(
    parts: &request::Parts,
    framing: RequestFraming,
    own: &OwnFields,
    out: &mut Vec<u8>,
) {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    out.extend_from_slice(&own.lines);
    let own_length = framing != RequestFraming::Empty;
    for (name, value) in &parts.headers {
        if own_length && (name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING) {
            continue;
        }
        if own.omit.iter().any(|omitted| omitted == name) {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        RequestFraming::Empty => {}
        RequestFraming::Length(length) => {
            out.extend_from_slice(b"content-length: ");
            let mut digits = itoa::Buffer::new();
            out.extend_from_slice(digits.format(length).as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
    }
    out.extend_from_slice(b"\r\n");
}

/// Parses a response head at the start of `buf`; on success its bytes are
/// taken out of `buf`, leaving what follows (the body).
pub fn parse_response(buf: &mut BytesMut, method: &Method) -> io::Result<Parsed> {
    // httparse (and hyper's client) skip empty lines before the status
    // line; a response has no reason to send one, and on a reused
    // connection it is a sign of a framing disagreement.
    if matches!(buf.first(), Some(b'\r' | b'\n')) {
        return Err(invalid("response head does not start with a status line"));
    }
    // Most heads fit the small field array; zeroing the large one on every
    // response was a measurable cost, so it is only for heads that need it.
    match parse_into::<COMMON_FIELDS>(buf, method)? {
        Some(parsed) => Ok(parsed),
        None => parse_into::<MAX_FIELDS>(buf, method)?
            .ok_or_else(|| invalid("too many response headers")),
    }
}

/// Fields a head may have before the parse moves to the large array.
const COMMON_FIELDS: usize = 24;

/// [`parse_response`] with room for `N` fields; `None` for a head with more.
fn parse_into<const N: usize>(buf: &mut BytesMut, method: &Method) -> io::Result<Option<Parsed>> {
    let mut fields = [httparse::EMPTY_HEADER; N];
    let mut response = httparse::Response::new(&mut fields);
    let length = match response.parse(buf) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => {
            if buf.len() > MAX_HEAD {
                return Err(invalid("response head too large"));
            }
            return Ok(Some(Parsed::Partial));
        }
        Err(httparse::Error::TooManyHeaders) => return Ok(None),
        Err(_) => return Err(invalid("malformed response head")),
    };
    if length > MAX_HEAD {
        return Err(invalid("response head too large"));
    }
    // httparse takes a bare LF for a line end (as hyper's client does);
    // here lines end only at CRLF. An LF can only end a line (httparse ends
    // the reason and every value at one, and refuses obs-fold), and every
    // line end is followed by a field name or by the head's last line: so
    // the byte two before each name being a CR, and the head ending in two
    // CRLFs, cover them all — without a pass over the head's bytes.
    let head = &buf[..length];
    if !head.ends_with(b"\r\n\r\n")
        || !response
            .headers
            .iter()
            .all(|field| crlf_before(head, field.name.as_bytes()))
    {
        return Err(invalid("bare LF in the response head"));
    }
    let code = response.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| invalid("invalid response status"))?;
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        let relayed = super::interim::client_head(status, response.headers);
        buf.advance(length);
        return Ok(Some(Parsed::Interim(relayed)));
    }
    let version = match response.version {
        Some(0) => Version::HTTP_10,
        _ => Version::HTTP_11,
    };

    // First what the hop-by-hop and framing fields say; then the fields the
    // client sees, copied as lines (`FieldLines`), without them — the client
    // never sees hop-by-hop fields (RFC 9110 §7.6.1). No header map is built:
    // nothing reads one before the head is written out again.
    let mut hop = HopFields::default();
    for field in response.headers.iter() {
        hop.note(field.name.as_bytes(), field.value)?;
    }
    hop.check_framing(version)?;
    let switching = status == StatusCode::SWITCHING_PROTOCOLS;
    let is_head = method == Method::HEAD;
    // Room for all of them at once: the lines are never longer than the head.
    let mut fields = FieldLines::with_relayed_capacity(length);
    for field in response.headers.iter() {
        let name = field.name.as_bytes();
        if is_name(name, b"content-length") {
            // The body's length is the body's business: the client-side
            // head gets it from the body (RFC 9112 §6.3), except for a HEAD,
            // whose answer describes a body it does not carry.
            if !is_head {
                continue;
            }
        } else if hop.drops(name, switching) {
            continue;
        }
        fields.push_relayed(name, field.value);
    }
    if switching && hop.upgrade_token {
        // The one hop-by-hop field the client must see: what it switches to.
        fields.push_relayed(b"connection", b"upgrade");
    }
    let (framing, reusable) = framing(method, status, &hop);
    let keep_alive = reusable
        && match version {
            Version::HTTP_10 => hop.keep_alive_token,
            _ => !hop.close_token,
        };
    // The fields are copied out: the head's bytes can go.
    drop(hop);
    buf.advance(length);
    let mut parts = response::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    Ok(Some(Parsed::Head(ResponseHead {
        parts,
        fields,
        framing,
        keep_alive,
    })))
}

/// Whether the line before the field whose name is `name` (a slice of
/// `head`) ends with CRLF: the byte before a name is the line's LF, the one
/// before that must be its CR.
#[inline(always)]
fn crlf_before(head: &[u8], name: &[u8]) -> bool {
    let at = name.as_ptr() as usize - head.as_ptr() as usize;
    at >= 2 && head[at - 2] == b'\r'
}

/// What a response head's hop-by-hop and length fields say.
#[derive(Debug, Default)]
struct HopFields<'h> {
    /// `Connection` tokens (RFC 9112 §9.3).
    close_token: bool,
    keep_alive_token: bool,
    upgrade_token: bool,
    /// Other fields `Connection` names: hop-by-hop too.
    named: SmallVec<[&'h [u8]; 2]>,
    transfer_encoding: bool,
    /// The last transfer coding is `chunked`.
    chunked_last: bool,
    /// The `Content-Length`, all its values agreeing.
    content_length: Option<u64>,
}

impl<'h> HopFields<'h> {
    // Inlined (like `drops`): called for every field of every response, and
    // most fields leave at the first comparison; as a call (a plain
    // `#[inline]` was not taken) its frame cost more than that.
    #[inline(always)]
    fn note(&mut self, name: &[u8], value: &'h [u8]) -> io::Result<()> {
        // The three names are 10, 14 and 17 bytes long: most fields stop here.
        if !matches!(name.len(), 10 | 14 | 17) {
            return Ok(());
        }
        if is_name(name, b"connection") {
            for token in connection_tokens(value) {
                match token {
                    ConnectionToken::Close => self.close_token = true,
                    ConnectionToken::KeepAlive => self.keep_alive_token = true,
                    ConnectionToken::Upgrade => self.upgrade_token = true,
                    ConnectionToken::Names(name) => self.named.push(name),
                }
            }
        } else if is_name(name, b"transfer-encoding") {
            self.transfer_encoding = true;
            // The last line's last coding decides (codings are applied in order).
            self.chunked_last = ends_in_chunked(value);
        } else if is_name(name, b"content-length") {
            // The crate's one rule (`http::content_length`), as for requests.
            let length =
                content_length::merge(self.content_length, value).map_err(|error| match error {
                    ContentLengthError::Invalid => {
                        invalid("invalid Content-Length in the response")
                    }
                    ContentLengthError::Conflicting => {
                        invalid("conflicting Content-Length in the response")
                    }
                })?;
            self.content_length = Some(length);
        }
        Ok(())
    }

    /// Refuses the framing ambiguities of RFC 9112 §6.1 and §6.3 item 3,
    /// whatever the status (a `204` or a `HEAD` answer with them is as
    /// broken as any other response).
    fn check_framing(&self, version: Version) -> io::Result<()> {
        if !self.transfer_encoding {
            return Ok(());
        }
        if version == Version::HTTP_10 {
            // §6.1: the framing of such a message is faulty.
            return Err(invalid("Transfer-Encoding in an HTTP/1.0 response"));
        }
        if self.content_length.is_some() {
            // §6.3 item 3: "ought to be handled as an error".
            return Err(invalid(
                "both Transfer-Encoding and Content-Length in the response",
            ));
        }
        Ok(())
    }

    /// Whether a field stays out of the client's response: hop-by-hop ones
    /// (but `Upgrade` on a `101`) and those `Connection` names.
    #[inline(always)]
    fn drops(&self, name: &[u8], switching: bool) -> bool {
        if is_name(name, b"upgrade") {
            return !switching;
        }
        is_hop_by_hop(name)
            || self
                .named
                .iter()
                .any(|named| name.eq_ignore_ascii_case(named))
    }
}

// How a response body is delimited, RFC 9112 §6.3 in its order, and when
// the connection may carry another request. A head that breaks a rule is
// refused before this (`HopFields::note`, `HopFields::check_framing`): the
// client gets a 502 and the connection is closed, never pooled.
//
// 1. An answer to HEAD, and a 1xx, 204 or 304, has no body, whatever its
//    fields say; bytes after its head are not the next response (they keep
//    the connection from the pool).
// 2. (A 2xx to CONNECT: not forwarded by the gateway.)
// 3. `Transfer-Encoding` with `Content-Length` is refused, as is
//    `Transfer-Encoding` in an HTTP/1.0 response (§6.1).
// 4. `Transfer-Encoding` whose last coding is `chunked`: chunked
//    (the decoder in `chunked.rs`). Other codings last: until the upstream closes.
// 5. A `Content-Length` that does not parse, or lines or list items that
//    differ: refused.
// 6. A valid `Content-Length`: that many bytes (none for 0).
// 7. (Requests only.)
// 8. Neither field: until the upstream closes; the connection ends with it.
//
// Keep-alive (§9.3): HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with
// `Connection: keep-alive`; never for a body delimited by the close.

/// The body framing of a response and whether the connection stays usable
/// after it, by the list above.
fn framing(method: &Method, status: StatusCode, hop: &HopFields<'_>) -> (Framing, bool) {
    // Rule 1.
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        return (Framing::Empty, true);
    }
    // Rule 4 (rule 3 held: no `Content-Length` beside it).
    if hop.transfer_encoding {
        return if hop.chunked_last {
            (Framing::Chunked, true)
        } else {
            (Framing::UntilClose, false)
        };
    }
    // Rules 6 and 8.
    match hop.content_length {
        Some(0) => (Framing::Empty, true),
        Some(length) => (Framing::Length(length), true),
        None => (Framing::UntilClose, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, method: Method) -> io::Result<(Parsed, BytesMut)> {
        let mut buf = BytesMut::from(text.as_bytes());
        parse_response(&mut buf, &method).map(|parsed| (parsed, buf))
    }

    fn head(text: &str, method: Method) -> (ResponseHead, BytesMut) {
        match parse(text, method).unwrap() {
            (Parsed::Head(head), rest) => (head, rest),
            (other, _) => panic!("expected a head, got {other:?}"),
        }
    }

    #[test]
    fn a_length_framed_response_leaves_its_body() {
        let (head, rest) = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello",
            Method::GET,
        );
        assert_eq!(head.parts.status, 200);
        assert_eq!(head.framing, Framing::Length(5));
        assert!(head.keep_alive);
        let map = head.fields.to_map();
        let values: Vec<_> = map.get_all("x-a").iter().collect();
        assert_eq!(values, ["1", "2"]);
        // The length is the body's, not a relayed field (the client-side
        // head writes it from the body).
        assert!(!map.contains_key(header::CONTENT_LENGTH));
        assert!(head.parts.headers.is_empty());
        assert_eq!(&rest[..], b"hello");
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let cases = [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                Method::HEAD,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 204 No Content\r\n\r\n",
                Method::GET,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n",
                Method::GET,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                Method::GET,
                Framing::Empty,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 7\r\nContent-Length: 7\r\n\r\n",
                Method::GET,
                Framing::Length(7),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                Method::GET,
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                Method::GET,
                Framing::Chunked,
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                Method::GET,
                Framing::UntilClose,
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\n\r\n",
                Method::GET,
                Framing::UntilClose,
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\n",
                Method::GET,
                Framing::Length(3),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\n",
                Method::GET,
                Framing::Length(3),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\n",
                Method::GET,
                Framing::Length(3),
                true,
            ),
        ];
        for (text, method, framing, keep_alive) in cases {
            let (head, _) = head(text, method);
            assert_eq!(head.framing, framing, "{text:?}");
            assert_eq!(head.keep_alive, keep_alive, "{text:?}");
        }
        // In answer to HEAD the length describes a body that is not sent:
        // it is relayed.
        let (answer, _) = head("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", Method::HEAD);
        assert_eq!(answer.fields.to_map()[header::CONTENT_LENGTH], "5");
    }

    #[test]
    fn hop_by_hop_fields_are_not_relayed() {
        let (parsed, _) = head(
            "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Secret, Date\r\nKeep-Alive: timeout=5\r\nX-Secret: 1\r\nDate: today\r\nUpgrade: h2c\r\nTrailer: X-T\r\nX-Kept: 1\r\nContent-Length: 0\r\n\r\n",
            Method::GET,
        );
        let mut relayed = Vec::new();
        parsed.fields.write_to(&mut relayed);
        assert_eq!(relayed, b"x-kept: 1\r\n");
        assert!(parsed.keep_alive);
        let (switched, _) = head(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
            Method::GET,
        );
        let map = switched.fields.to_map();
        assert_eq!(map["upgrade"], "websocket");
        assert_eq!(map["connection"], "upgrade");
    }

    #[test]
    fn interim_responses_are_consumed_but_101_is_final() {
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"[..],
        );
        assert!(matches!(
            parse_response(&mut buf, &Method::POST),
            Ok(Parsed::Interim(None))
        ));
        match parse_response(&mut buf, &Method::POST) {
            Ok(Parsed::Interim(Some(relayed))) => {
                assert_eq!(relayed, b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n")
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse_response(&mut buf, &Method::POST),
            Ok(Parsed::Head(_))
        ));
        assert!(buf.is_empty());
        let (head, _) = head(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            Method::GET,
        );
        assert_eq!(head.parts.status, 101);
    }

    #[test]
    fn heads_with_many_fields_parse_up_to_the_limit() {
        let head_with = |count: usize| {
            let mut text = String::from("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n");
            for i in 1..count {
                text.push_str(&format!("X-Field-{i}: {i}\r\n"));
            }
            text.push_str("\r\n");
            text
        };
        let (parsed, _) = head(&head_with(COMMON_FIELDS + 10), Method::GET);
        // All but the Content-Length are relayed.
        assert_eq!(parsed.fields.to_map().len(), COMMON_FIELDS + 9);
        let error = parse(&head_with(MAX_FIELDS + 1), Method::GET).unwrap_err();
        assert_eq!(error.to_string(), "too many response headers");
    }

    #[test]
    fn partial_and_malformed_heads() {
        assert!(matches!(
            parse("HTTP/1.1 200 OK\r\nContent-", Method::GET),
            Ok((Parsed::Partial, _))
        ));
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "SMTP ready\r\n\r\n",
        ] {
            assert!(parse(bad, Method::GET).is_err(), "{bad:?}");
        }
        let mut huge = String::from("HTTP/1.1 200 OK\r\n");
        while huge.len() <= MAX_HEAD {
            huge.push_str("X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert!(parse(&huge, Method::GET).is_err());
    }

    /// The error a head is refused with, for every method.
    fn refusal(text: &[u8]) -> String {
        let messages: Vec<String> = [Method::GET, Method::HEAD, Method::POST]
            .iter()
            .map(|method| {
                let mut buf = BytesMut::from(text);
                match parse_response(&mut buf, method) {
                    Err(error) => error.to_string(),
                    Ok(parsed) => panic!("{text:?} accepted for {method}: {parsed:?}"),
                }
            })
            .collect();
        assert!(messages.iter().all(|m| *m == messages[0]), "{messages:?}");
        messages[0].clone()
    }

    #[test]
    fn framing_ambiguities_are_refused_whatever_the_status() {
        for status in [
            "200 OK",
            "204 No Content",
            "304 Not Modified",
            "404 Not Found",
        ] {
            for (fields, why) in [
                (
                    "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n",
                    "both Transfer-Encoding and Content-Length in the response",
                ),
                (
                    "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n",
                    "both Transfer-Encoding and Content-Length in the response",
                ),
                (
                    "Content-Length: 0\r\nTransfer-Encoding: gzip\r\n",
                    "both Transfer-Encoding and Content-Length in the response",
                ),
                (
                    "Content-Length: 3\r\nContent-Length: 4\r\n",
                    "conflicting Content-Length in the response",
                ),
                (
                    "Content-Length: 3, 4\r\n",
                    "invalid Content-Length in the response",
                ),
                (
                    "Content-Length: +5\r\n",
                    "invalid Content-Length in the response",
                ),
                (
                    "Content-Length: -3\r\n",
                    "invalid Content-Length in the response",
                ),
                (
                    "Content-Length: 0x5\r\n",
                    "invalid Content-Length in the response",
                ),
                (
                    "Content-Length: 5 5\r\n",
                    "invalid Content-Length in the response",
                ),
                (
                    "Content-Length: 5,\r\n",
                    "invalid Content-Length in the response",
                ),
                (
                    "Content-Length:\r\n",
                    "invalid Content-Length in the response",
                ),
                (
                    "Content-Length: 5\u{a0}\r\n",
                    "invalid Content-Length in the response",
                ),
                (
                    "Content-Length: 18446744073709551616\r\n",
                    "invalid Content-Length in the response",
                ),
            ] {
                let text = format!("HTTP/1.1 {status}\r\n{fields}\r\n");
                assert_eq!(refusal(text.as_bytes()), why, "{text:?}");
            }
            let text = format!("HTTP/1.0 {status}\r\nTransfer-Encoding: chunked\r\n\r\n");
            assert_eq!(
                refusal(text.as_bytes()),
                "Transfer-Encoding in an HTTP/1.0 response"
            );
        }
        // Equal lines are one length; leading zeros are digits. A list in
        // one line is refused even when its members agree (the crate's one
        // rule, `http::content_length`).
        let (parsed, _) = head(
            "HTTP/1.1 200 OK\r\nContent-Length: 05\r\nContent-Length: 5\r\n\r\n",
            Method::GET,
        );
        assert_eq!(parsed.framing, Framing::Length(5));
        let mut read = BytesMut::from("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n");
        assert!(parse_response(&mut read, &Method::GET).is_err());
    }

    #[test]
    fn malformed_lines_are_refused() {
        for bad in [
            // obs-fold.
            &b"HTTP/1.1 200 OK\r\nX-A: 1\r\n folded\r\nContent-Length: 0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\tfolded\r\n\r\n",
            // A bare CR.
            b"HTTP/1.1 200 OK\rContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: 1\r2\r\nContent-Length: 0\r\n\r\n",
            // NUL and other control bytes.
            b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: a\x01b\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\n\r\n",
            b"HTTP/1.1 200 O\x00K\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX\x00A: 1\r\n\r\n",
            // Not a field line.
            b"HTTP/1.1 200 OK\r\nX-A 1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A : 1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n: 1\r\n\r\n",
            // Invalid status lines.
            b"HTTP/1.1 2000 OK\r\n\r\n",
            b"HTTP/1.1 20 OK\r\n\r\n",
            b"HTTP/1.1 099 OK\r\n\r\n",
            b"HTTP/1.1  200 OK\r\n\r\n",
            b"HTTP/1.1 +20 OK\r\n\r\n",
            b"HTTP/2.0 200 OK\r\n\r\n",
            b"HTTP/1.2 200 OK\r\n\r\n",
            b"http/1.1 200 OK\r\n\r\n",
            b"HTTP/1.1\t200 OK\r\n\r\n",
            b"SMTP ready\r\n\r\n",
            b"\r\nHTTP/1.1 200 OK\r\n\r\n",
        ] {
            refusal(bad);
        }
        // Lines end only at CRLF: httparse (and hyper's client) take a bare
        // LF, the gateway does not.
        for bad in [
            &b"HTTP/1.1 200 OK\nContent-Length: 0\n\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n",
            b"HTTP/1.1 100 Continue\n\n",
        ] {
            assert_eq!(refusal(bad), "bare LF in the response head", "{bad:?}");
        }
    }

    #[test]
    fn request_heads_carry_the_framing_asked_for() {
        let mut request = http::Request::builder()
            .method(Method::POST)
            .uri("/v1/items?x=1")
            .header("host", "example.com")
            .header("content-length", "5")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let encoded = |request: &request::Parts, framing| {
            let mut out = Vec::new();
            encode_request(request, framing, &OwnFields::default(), &mut out);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            encoded(&request, RequestFraming::Length(5)),
            "POST /v1/items?x=1 HTTP/1.1\r\nhost: example.com\r\ncontent-length: 5\r\n\r\n"
        );
        assert_eq!(
            encoded(&request, RequestFraming::Chunked),
            "POST /v1/items?x=1 HTTP/1.1\r\nhost: example.com\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        request.headers.remove("content-length");
        request.method = Method::GET;
        assert_eq!(
            encoded(&request, RequestFraming::Empty),
            "GET /v1/items?x=1 HTTP/1.1\r\nhost: example.com\r\n\r\n"
        );
    }
}
