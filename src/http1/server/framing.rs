//! The framing check of a request head: where its body ends, or why the
//! request is refused before anything reads further.
//!
//! Every request head the gateway receives passes here before it is served
//! (by the fast path, or by hyper after a hand-off, through
//! the gate, `gate.rs`): a proxy that reads the end of a message differently
//! from the server behind it can be made to forward a request hidden inside
//! another (request smuggling). So the rule is to refuse every head whose
//! framing is ambiguous, with `400` and a closed connection, never to guess.
//!
//! RFC 9112 §6.3, for a request:
//!
//! 1. (responses to `HEAD`, 1xx, 204 and 304: not a request's concern)
//! 2. (a `2xx` answer to `CONNECT`: not a request's concern)
//! 3. `Transfer-Encoding` together with `Content-Length`: the message is
//!    refused (the RFC allows a server to; a proxy must, since the next hop
//!    may read the other field). So is `Transfer-Encoding` in HTTP/1.0
//!    (§6.1: faulty framing).
//! 4. `Transfer-Encoding` whose final coding is not `chunked`: refused. The
//!    gateway is stricter: the one accepted value is exactly `chunked` (in
//!    any letter case) on exactly one field line. `chunked, chunked`, a
//!    second line, `gzip, chunked`, `xchunked` and every obfuscation that
//!    some parser still reads as chunked are refused; the gateway decodes
//!    the chunked coding and would drop any other coding unapplied.
//! 5. `Content-Length` that is not valid (see [`content_length`]: `1*DIGIT`,
//!    equal duplicates only): refused.
//! 6. Otherwise a request has no body (length 0).
//! 7. (read until close: responses only)
//!
//! And the rest of the head, which decides where the head itself ends and
//! which request it is:
//!
//! - Lines end with CRLF only. httparse (and hyper) also take a bare LF;
//!   the gateway refuses it, because a next hop that does not would see a
//!   different set of fields. A bare CR, obs-fold (a line starting with SP
//!   or HT), whitespace between a field name and its colon, control bytes
//!   (NUL included) in a field, and malformed method, target or version
//!   tokens are refused by httparse already, with the same answer.
//! - HTTP/1.1 needs exactly one `Host`, and its value must be a valid
//!   `uri-host [":" port]` by the crate's one host rule ([`host`]: RFC 9110
//!   §7.2, RFC 3986 §3.2.2; an empty value is refused too); HTTP/1.0 may
//!   omit it, never repeat it. A target in absolute or authority form must
//!   have a valid authority by the same rule ([`check_target`]); the `Host`
//!   is still required then (RFC 9112 §3.2), though the target's authority
//!   wins over it (§3.2.2).
//!
//! The check is one pass over the fields httparse has already split, with no
//! allocation; the fast path folds it into the loop over the fields it runs
//! anyway, where a field is one comparison of its (already parsed) name for
//! all but the three that frame.

use http::header::{CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use http::{HeaderName, StatusCode};

use super::response::{BodyLength, encode_head};
use crate::http::content_length::{self, ContentLengthError};
use crate::http::host;
use crate::http::problem;

/// At most this many fields, as hyper (`DEFAULT_MAX_HEADERS`); a head with
/// more is refused with 431, as hyper does.
pub(crate) const MAX_FIELDS: usize = 100;

/// hyper's limit on a request target (`MAX_URI_LEN`): longer ones are 414.
pub(crate) const MAX_TARGET: usize = (u16::MAX - 1) as usize;

/// How a request's body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFraming {
    /// No body.
    Empty,
    /// Exactly this many bytes (at least 1).
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
}

/// A request the gateway answers itself, with this status and detail, and
/// then closes the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub(crate) status: StatusCode,
    pub(crate) detail: &'static str,
}

impl Refusal {
    pub(crate) const fn bad(detail: &'static str) -> Refusal {
        Refusal {
            status: StatusCode::BAD_REQUEST,
            detail,
        }
    }

    /// A head longer than `max_header_bytes`, or with more fields than allowed.
    pub(crate) const TOO_LARGE: Refusal = Refusal {
        status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        detail: "request headers are too large",
    };

    /// A target longer than [`MAX_TARGET`].
    pub(crate) const TARGET_TOO_LONG: Refusal = Refusal {
        status: StatusCode::URI_TOO_LONG,
        detail: "the request target is too long",
    };

    /// httparse refused the head (or `Uri` refused the target).
    pub(crate) const MALFORMED: Refusal = Refusal::bad("malformed request head");

    /// A bare LF where a line must end with CRLF.
    pub(crate) const BARE_LF: Refusal =
        Refusal::bad("a line of the request head does not end with CRLF");
}

impl Refusal {
    /// Writes the whole answer: the problem+json body (RFC 9457) the
    /// gateway's other errors have, by the same writer
    /// ([`problem::about_blank`]), and `Connection: close`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let mut body = String::new();
        let title = problem::reason_title(self.status);
        problem::about_blank(&mut body, self.status, title, self.detail);
        let mut fields = http::HeaderMap::with_capacity(2);
        fields.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(problem::CONTENT_TYPE),
        );
        fields.insert(
            http::header::CACHE_CONTROL,
            http::HeaderValue::from_static("no-store"),
        );
        let length = Some(BodyLength::Known(body.len() as u64));
        // A status, two fields and a known length: nothing the encoder refuses.
        if encode_head(out, self.status, &mut fields, &(), length, false, false).is_ok() {
            out.extend_from_slice(body.as_bytes());
        }
    }
}

impl From<httparse::Error> for Refusal {
    fn from(error: httparse::Error) -> Refusal {
        match error {
            httparse::Error::TooManyHeaders => Refusal::TOO_LARGE,
            _ => Refusal::MALFORMED,
        }
    }
}

/// Checks a head httparse has parsed completely from `head` (its bytes,
/// exactly `head.len()` long): line ends, `Host`, and the body's framing.
/// The fast path applies the same pieces inside the one loop over the
/// fields it already runs ([`check_head`], [`line_ends_before`],
/// [`FramingFields`]).
pub(crate) fn check(
    head: &[u8],
    request: &httparse::Request<'_, '_>,
) -> Result<BodyFraming, Refusal> {
    check_head(head, request)?;
    let mut fields = FramingFields::default();
    for field in request.headers.iter() {
        if !line_ends_before(head, field.name.as_bytes()) {
            return Err(Refusal::BARE_LF);
        }
        let name = HeaderName::from_bytes(field.name.as_bytes()).map_err(|_| Refusal::MALFORMED)?;
        fields.field(&name, field.value)?;
    }
    fields.finish(request.version == Some(1))
}

/// The checks of a head as a whole: the target's length, and CRLF at the
/// end of the request line (with no fields) and of the head, and of the
/// empty lines before the request line (RFC 9112 §2.2 lets a server skip
/// them). The line ends between fields are [`line_ends_before`]'s.
pub(crate) fn check_head(head: &[u8], request: &httparse::Request<'_, '_>) -> Result<(), Refusal> {
    let (Some(method), Some(target)) = (request.method, request.path) else {
        // httparse fills both for a complete head.
        return Err(Refusal::MALFORMED);
    };
    if target.len() > MAX_TARGET {
        return Err(Refusal::TARGET_TOO_LONG);
    }
    let start = method.as_ptr() as usize - head.as_ptr() as usize;
    if start > 0 && !head[..start].chunks(2).all(|pair| pair == b"\r\n") {
        return Err(Refusal::BARE_LF);
    }
    if !head.ends_with(b"\r\n\r\n") {
        return Err(Refusal::BARE_LF);
    }
    Ok(())
}

/// Whether the line before the field whose name is `name` (a slice of
/// `head`) ends with CRLF: the two bytes before a name are CR LF.
#[inline]
pub(crate) fn line_ends_before(head: &[u8], name: &[u8]) -> bool {
    let at = name.as_ptr() as usize - head.as_ptr() as usize;
    at >= 2 && head[at - 2] == b'\r'
}

/// The framing fields of one head, gathered a field at a time (§6.3 items
/// 3 to 6 and `Host`), then judged by [`FramingFields::finish`].
#[derive(Debug, Default)]
pub(crate) struct FramingFields {
    hosts: u32,
    length: Option<u64>,
    length_error: Option<ContentLengthError>,
    transfer_encodings: u32,
    chunked: bool,
}

impl FramingFields {
    /// One field line. Names other than the three are one comparison each
    /// (a standard name is an enum inside `HeaderName`). Always inlined: a
    /// plain `#[inline]` was not taken, and the call cost more than the
    /// comparisons.
    #[inline(always)]
    pub(crate) fn field(&mut self, name: &HeaderName, value: &[u8]) -> Result<(), Refusal> {
        if *name == HOST {
            self.hosts += 1;
            if !host::is_valid(value) {
                return Err(Refusal::bad("the Host header is not a valid host"));
            }
        } else if *name == CONTENT_LENGTH {
            match content_length::merge(self.length, value) {
                Ok(merged) => self.length = Some(merged),
                // Decided in `finish`: a Transfer-Encoding makes it moot.
                Err(error) => self.length_error = Some(error),
            }
        } else if *name == TRANSFER_ENCODING {
            self.transfer_encodings += 1;
            self.chunked = value.eq_ignore_ascii_case(b"chunked");
        }
        Ok(())
    }

    /// The body's framing once every field is seen, or the refusal.
    pub(crate) fn finish(self, http_11: bool) -> Result<BodyFraming, Refusal> {
        if self.hosts > 1 {
            return Err(Refusal::bad("the request has more than one Host header"));
        }
        if http_11 && self.hosts == 0 {
            return Err(Refusal::bad("an HTTP/1.1 request needs a Host header"));
        }
        // §6.3 items 3 and 4.
        if self.transfer_encodings > 0 {
            if self.length.is_some() || self.length_error.is_some() {
                return Err(Refusal::bad(
                    "the request has both Content-Length and Transfer-Encoding",
                ));
            }
            if !http_11 {
                return Err(Refusal::bad(
                    "an HTTP/1.0 request cannot have Transfer-Encoding",
                ));
            }
            if self.transfer_encodings > 1 || !self.chunked {
                return Err(Refusal::bad(
                    "the request's Transfer-Encoding is not exactly `chunked`",
                ));
            }
            return Ok(BodyFraming::Chunked);
        }
        // Item 5, then 6.
        match (self.length_error, self.length) {
            (Some(ContentLengthError::Conflicting), _) => Err(Refusal::bad(
                "the request has Content-Length values that differ",
            )),
            (Some(ContentLengthError::Invalid), _) => Err(Refusal::bad(
                "the request's Content-Length is not a decimal number",
            )),
            (None, Some(0) | None) => Ok(BodyFraming::Empty),
            (None, Some(n)) => Ok(BodyFraming::Length(n)),
        }
    }
}

/// The authority of a target in absolute form (`GET http://a:80/ HTTP/1.1`)
/// or authority form (`CONNECT a:443 HTTP/1.1`), as `Uri` read it (and so
/// hyper will): a valid host by the same rule as `Host` ([`host`]). The
/// `Host` field itself must still be there and valid; RFC 9112 §3.2.2 has
/// the target's authority win over it, which is what routing and
/// forwarding use.
pub(crate) fn check_target(target: &http::Uri) -> Result<(), Refusal> {
    match target.authority() {
        Some(authority) if !host::is_valid(authority.as_str().as_bytes()) => Err(Refusal::bad(
            "the request target's authority is not a valid host",
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses and checks `bytes`, a complete head.
    fn checked(bytes: &[u8]) -> Result<BodyFraming, Refusal> {
        let mut fields = [httparse::EMPTY_HEADER; 100];
        let mut request = httparse::Request::new(&mut fields);
        match request.parse(bytes)? {
            httparse::Status::Complete(len) => check(&bytes[..len], &request),
            httparse::Status::Partial => panic!("partial: {:?}", String::from_utf8_lossy(bytes)),
        }
    }

    fn refused(bytes: &[u8]) {
        let verdict = checked(bytes);
        assert!(
            verdict.is_err(),
            "{:?} accepted as {verdict:?}",
            String::from_utf8_lossy(bytes)
        );
    }

    #[test]
    fn plain_framings() {
        assert_eq!(
            checked(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Ok(BodyFraming::Empty)
        );
        assert_eq!(
            checked(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"),
            Ok(BodyFraming::Empty)
        );
        assert_eq!(
            checked(
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n"
            ),
            Ok(BodyFraming::Length(5))
        );
        assert_eq!(
            checked(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n"),
            Ok(BodyFraming::Chunked)
        );
        assert_eq!(
            checked(b"GET / HTTP/1.0\r\n\r\n"),
            Ok(BodyFraming::Empty),
            "HTTP/1.0 may omit Host"
        );
        assert_eq!(
            checked(b"\r\n\r\nGET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"),
            Ok(BodyFraming::Empty),
            "empty lines before the request line"
        );
    }

    #[test]
    fn ambiguous_framings_are_refused() {
        for head in [
            &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n",
        ] {
            refused(head);
        }
    }

    #[test]
    fn bare_line_feeds_are_refused_wherever_they_are() {
        for head in [
            &b"GET / HTTP/1.1\nHost: a\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\n\n",
            b"GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a \nX: b\r\n\r\n",
            b"GET / HTTP/1.1\n\n",
            b"\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            b"\r\n\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            refused(head);
        }
    }

    #[test]
    fn host_must_be_one_valid_host() {
        for head in [
            &b"GET / HTTP/1.1\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost:\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\xff\r\n\r\n",
            // The host rule (`http::host`, whose table has every class).
            b"GET / HTTP/1.1\r\nHost: example.com:abc\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: example.com:65536\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: example.com:\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: ex%41mple.com\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a..b\r\n\r\n",
            b"GET / HTTP/1.0\r\nHost: a:b:c\r\n\r\n",
        ] {
            refused(head);
        }
        for head in [
            &b"GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: example.com.\r\n\r\n",
        ] {
            assert_eq!(checked(head), Ok(BodyFraming::Empty), "{head:?}");
        }
    }

    #[test]
    fn a_target_authority_must_be_a_valid_host() {
        for target in [
            "http://example.com:abc/",
            "http://example.com:99999/",
            "http://example.com:/",
            "http://user@example.com/",
            "http://a..b/",
            "example.com:abc",
            "http:abc",
        ] {
            let uri: http::Uri = target.parse().unwrap();
            assert!(check_target(&uri).is_err(), "{target}");
        }
        for target in ["/", "*", "http://example.com:8080/x", "example.com:443"] {
            let uri: http::Uri = target.parse().unwrap();
            assert_eq!(check_target(&uri), Ok(()), "{target}");
        }
    }

    #[test]
    fn a_too_long_target_is_414() {
        let head = format!(
            "GET /{} HTTP/1.1\r\nHost: a\r\n\r\n",
            "a".repeat(MAX_TARGET)
        );
        assert_eq!(checked(head.as_bytes()), Err(Refusal::TARGET_TOO_LONG));
    }
}
