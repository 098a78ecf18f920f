//! Reading a request head for the fast path: refusing it when its framing
//! is ambiguous or it is malformed, and otherwise deciding whether it is one
//! the fast path serves.
//!
//! Every head is parsed here first, whoever serves it: httparse splits it,
//! [`framing::check`] decides where its body ends or refuses it
//! ([`Parsed::Refused`]: the caller answers 400, 414 or 431 and closes the
//! connection), and only then does the short allow-list decide who serves
//! it: an HTTP/1.1 request in origin form, no `CONNECT`, none of the fields
//! that change how the connection carries messages (`Transfer-Encoding`,
//! `Upgrade`, `Expect`, `TE`), and at most one `Connection` field that says
//! just `keep-alive` or `close`. A body is taken only when it has a
//! `Content-Length` and is already in the buffer. Everything else is
//! [`Parsed::HandOff`]: hyper reads it again from the same bytes, behind the
//! gate (`gate.rs`) that checks every later head the same way.

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, EXPECT, HOST, InvalidHeaderName, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};

use super::body::ClientBody;
use super::framing::{self, BodyFraming, FramingFields, MAX_FIELDS, Refusal};

/// What the bytes read so far hold.
// Returned once per request and matched at once; boxing the request to make
// the other variants smaller would cost an allocation per request.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Parsed {
    /// A request the fast path serves; its head (and body) left the buffer.
    /// `close`: the client asked to close the connection after it.
    Request {
        request: Request<ClientBody>,
        close: bool,
    },
    /// The head is not complete yet.
    Partial,
    /// Not the fast path's to serve: hyper takes the connection from these
    /// bytes on. The buffer is untouched.
    HandOff,
    /// Malformed, ambiguous or too large: answered with this refusal, and
    /// the connection closed. Nothing after it is read.
    Refused(Refusal),
}

/// The first line of the HTTP/2 connection preface (RFC 9113 §3.4):
/// enough to tell h2c with prior knowledge from an HTTP/1.1 request.
pub(crate) const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// Parses the request at the start of `buffer`. `fields` is a map to reuse
/// (cleared; its capacity is what is kept). A head longer than `max_head`
/// bytes, complete or not, is refused (431).
pub fn parse(buffer: &mut BytesMut, fields: &mut HeaderMap, max_head: usize) -> Parsed {
    // The HTTP/2 connection preface (h2c with prior knowledge) is no
    // HTTP/1.1 head to refuse: the connection goes to the HTTP/2 server.
    if buffer.first() == Some(&b'P') {
        let known = buffer.len().min(H2_PREFACE.len());
        if buffer[..known] == H2_PREFACE[..known] {
            return if known == H2_PREFACE.len() {
                Parsed::HandOff
            } else {
                Parsed::Partial
            };
        }
    }
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut request = httparse::Request::new(&mut []);
    let head_len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        buffer,
        &mut slots,
    ) {
        Ok(httparse::Status::Complete(len)) if len > max_head => {
            return Parsed::Refused(Refusal::TOO_LARGE);
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buffer.len() > max_head => {
            return Parsed::Refused(Refusal::TOO_LARGE);
        }
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(error) => return Parsed::Refused(error.into()),
    };
    // The framing check (`framing`), folded into the loop over the fields
    // below. A head handed off before the loop ends is checked whole by the
    // gate hyper reads through, and refused there just the same.
    let head = &buffer[..head_len];
    if let Err(refusal) = framing::check_head(head, &request) {
        return Parsed::Refused(refusal);
    }
    if request.version != Some(1) {
        return Parsed::HandOff;
    }
    let (Some(method), Some(path)) = (request.method, request.path) else {
        return Parsed::HandOff;
    };
    if !path.starts_with('/') {
        return Parsed::HandOff;
    }
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::HandOff;
    };
    if method == Method::CONNECT {
        return Parsed::HandOff;
    }
    let base = buffer.as_ptr() as usize;
    let offset = |s: &[u8]| s.as_ptr() as usize - base;
    let path_range = offset(path.as_bytes())..offset(path.as_bytes()) + path.len();

    // Names first: whether the request is ours is known before anything is
    // built. Values are sliced out of the frozen head below.
    let mut names: smallvec::SmallVec<[(HeaderName, usize, usize); 24]> = smallvec::SmallVec::new();
    let mut close: Option<bool> = None;
    let mut framing_fields = FramingFields::default();
    for field in request.headers.iter() {
        let Ok(name) = field_name(field.name) else {
            // httparse checked the token; `HeaderName` would only refuse
            // one longer than it holds.
            return Parsed::Refused(Refusal::MALFORMED);
        };
        if !framing::line_ends_before(head, field.name.as_bytes()) {
            return Parsed::Refused(Refusal::BARE_LF);
        }
        if let Err(refusal) = framing_fields.field(&name, field.value) {
            return Parsed::Refused(refusal);
        }
        if name == CONNECTION {
            match (close, connection_option(field.value)) {
                (None, Some(option)) => close = Some(option),
                _ => return Parsed::HandOff,
            }
        }
        if name == TRANSFER_ENCODING || name == UPGRADE || name == EXPECT || name == TE {
            return Parsed::HandOff;
        }
        let start = offset(field.value);
        names.push((name, start, start + field.value.len()));
    }
    let body_framing = match framing_fields.finish(true) {
        Ok(body_framing) => body_framing,
        Err(refusal) => return Parsed::Refused(refusal),
    };
    let body_len = match body_framing {
        BodyFraming::Empty => 0,
        BodyFraming::Length(length) => match usize::try_from(length) {
            Ok(length) if length <= buffer.len() - head_len => length,
            _ => return Parsed::HandOff,
        },
        BodyFraming::Chunked => return Parsed::HandOff,
    };

    let head = buffer.split_to(head_len).freeze();
    let Ok(uri) = Uri::from_maybe_shared(head.slice(path_range)) else {
        // httparse lets through targets `Uri` refuses (`<`, obs-text), and
        // so would hyper's 400.
        return Parsed::Refused(Refusal::MALFORMED);
    };
    let body = if body_len > 0 {
        buffer.split_to(body_len).freeze()
    } else {
        Bytes::new()
    };
    let mut built = Request::new(ClientBody::Complete(body));
    // The map to reuse goes into the request, and the request's new empty
    // one takes its place: assigning it would drop that empty map, ~60
    // instructions for nothing.
    let map = built.headers_mut();
    std::mem::swap(map, fields);
    // `clear` resets every index slot even of an empty map; the server
    // hands over maps already emptied.
    if !map.is_empty() {
        map.clear();
    }
    if names.len() > map.capacity() {
        map.reserve(names.len());
    }
    // Drained, not consumed: `into_iter` moves the whole inline array
    // (~1.1 KB, +130 instructions of memcpy a request).
    for (name, start, end) in names.drain(..) {
        // SAFETY: `HeaderValue` holds only HTAB, SP..=0x7E and 0x80..=0xFF
        // (`HeaderValue::from_bytes`), and httparse let this value through
        // its field-value rule, which is exactly that set
        // (`is_header_value_token`, and its SWAR and SIMD forms): checking
        // each byte again here cost ~150 instructions a request. Pinned by
        // `every_value_byte_the_parser_takes_header_value_takes` (and the
        // `request_head` fuzz target), and checked again by `http` itself
        // in debug builds.
        let value = unsafe { HeaderValue::from_maybe_shared_unchecked(head.slice(start..end)) };
        map.append(name, value);
    }
    *built.method_mut() = method;
    *built.uri_mut() = uri;
    *built.version_mut() = Version::HTTP_11;
    Parsed::Request {
        request: built,
        close: close.unwrap_or(false),
    }
}

/// The name of a field httparse has split. `Host` is in every HTTP/1.1
/// request: it is told by one comparison of four bytes, without
/// `HeaderName::from_bytes`'s lower-cased copy and its match against every
/// standard name (~80 instructions a request); the result is the same
/// `HOST`.
#[inline(always)]
fn field_name(name: &str) -> Result<HeaderName, InvalidHeaderName> {
    // Setting bit 0x20 lower-cases a letter, and `b | 0x20 == c` holds for
    // a letter `c` only when `b` is `c` in either case.
    if let Ok(four) = <[u8; 4]>::try_from(name.as_bytes())
        && u32::from_le_bytes(four) | 0x2020_2020 == u32::from_le_bytes(*b"host")
    {
        Ok(HOST)
    } else {
        HeaderName::from_bytes(name.as_bytes())
    }
}

/// A `Connection` value the fast path handles: `Some(true)` for `close`,
/// `Some(false)` for `keep-alive` (HTTP/1.1's default anyway).
fn connection_option(value: &[u8]) -> Option<bool> {
    if value.eq_ignore_ascii_case(b"close") {
        Some(true)
    } else if value.eq_ignore_ascii_case(b"keep-alive") {
        Some(false)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    //! `parse` on the requests the fast path serves, and on each kind it must
    //! leave to hyper with the buffer exactly as it was (hyper reads the same
    //! bytes again, so any byte lost or moved here is a corrupted request).

    use super::*;
    use bytes::Bytes;
    use http::HeaderValue;
    use http_body::Body;

    /// Parses `bytes` with a fresh map.
    fn parse_bytes(bytes: &[u8]) -> (Parsed, BytesMut) {
        let mut buffer = BytesMut::from(bytes);
        let parsed = parse(&mut buffer, &mut HeaderMap::new(), 64 * 1024);
        (parsed, buffer)
    }

    /// The request and `close` of a `Parsed::Request`, or a panic naming what
    /// was returned instead.
    fn request(parsed: Parsed) -> (Request<ClientBody>, bool) {
        match parsed {
            Parsed::Request { request, close } => (request, close),
            other => panic!("expected a request, got {other:?}"),
        }
    }

    /// The bytes of a body the fast path read whole (`None` for no body).
    fn body_bytes(request: &Request<ClientBody>) -> Option<Bytes> {
        match request.body() {
            ClientBody::Complete(bytes) => Some(bytes.clone()).filter(|b| !b.is_empty()),
            ClientBody::Hyper(_) => panic!("the fast path built a hyper body"),
        }
    }

    fn assert_hand_off(bytes: &[u8]) {
        let (parsed, buffer) = parse_bytes(bytes);
        assert!(
            matches!(parsed, Parsed::HandOff),
            "{:?}: expected HandOff, got {parsed:?}",
            String::from_utf8_lossy(bytes)
        );
        // hyper must see exactly what the client sent.
        assert_eq!(
            &buffer[..],
            bytes,
            "{:?}: buffer changed",
            String::from_utf8_lossy(bytes)
        );
    }

    fn assert_refused(bytes: &[u8], status: u16) {
        let (parsed, _) = parse_bytes(bytes);
        match parsed {
            Parsed::Refused(refusal) => assert_eq!(
                refusal.status.as_u16(),
                status,
                "{:?}: {}",
                String::from_utf8_lossy(bytes),
                refusal.detail
            ),
            other => panic!(
                "{:?}: expected a refusal, got {other:?}",
                String::from_utf8_lossy(bytes)
            ),
        }
    }

    #[test]
    fn plain_get() {
        let (parsed, buffer) = parse_bytes(
            b"GET /things/1?sort=desc HTTP/1.1\r\nHost: api.test\r\nAccept: */*\r\nX-Two: a\r\nx-two: b\r\n\r\n",
        );
        let (request, close) = request(parsed);
        assert!(!close);
        assert!(buffer.is_empty(), "the head left the buffer");
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri(), "/things/1?sort=desc");
        assert_eq!(request.uri().path(), "/things/1");
        assert_eq!(request.uri().query(), Some("sort=desc"));
        assert_eq!(request.version(), Version::HTTP_11);
        let fields = request.headers();
        assert_eq!(fields.len(), 4);
        assert_eq!(fields["host"], "api.test");
        assert_eq!(fields["accept"], "*/*");
        let two: Vec<_> = fields.get_all("x-two").iter().collect();
        assert_eq!(
            two,
            ["a", "b"],
            "repeated fields keep every value, in order"
        );
        assert_eq!(body_bytes(&request), None);
        assert!(request.body().is_end_stream());
    }

    #[test]
    fn partial_head_is_partial_and_untouched() {
        let whole = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        for cut in 1..whole.len() {
            let (parsed, buffer) = parse_bytes(&whole[..cut]);
            assert!(
                matches!(parsed, Parsed::Partial),
                "cut at {cut}: got {parsed:?}"
            );
            assert_eq!(&buffer[..], &whole[..cut], "cut at {cut}");
        }
    }

    #[test]
    fn connection_close_sets_close() {
        let (parsed, _) = parse_bytes(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let (request, close) = request(parsed);
        assert!(close);
        // The field stays for the handler (which drops hop-by-hop fields).
        assert_eq!(request.headers()["connection"], "close");
        // Case does not matter.
        let (parsed, _) = parse_bytes(b"GET / HTTP/1.1\r\nHost: x\r\nconnection: CLOSE\r\n\r\n");
        assert!(request_close(parsed));
    }

    fn request_close(parsed: Parsed) -> bool {
        request(parsed).1
    }

    #[test]
    fn connection_keep_alive_keeps_alive() {
        let (parsed, _) =
            parse_bytes(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n");
        assert!(!request_close(parsed));
        let (parsed, _) =
            parse_bytes(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(!request_close(parsed));
    }

    #[test]
    fn http_1_0_is_handed_off() {
        assert_hand_off(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n");
    }

    #[test]
    fn transfer_encoding_is_handed_off() {
        assert_hand_off(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        );
    }

    #[test]
    fn upgrade_is_handed_off() {
        assert_hand_off(
            b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        );
        // Upgrade alone (no Connection) still goes: hyper decides what it means.
        assert_hand_off(b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\r\n");
    }

    #[test]
    fn expect_is_handed_off() {
        assert_hand_off(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
        );
        // Even with the body already sent: the 100 is hyper's to answer or not.
        assert_hand_off(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello",
        );
    }

    #[test]
    fn te_is_handed_off() {
        assert_hand_off(b"GET / HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\r\n");
    }

    #[test]
    fn connection_upgrade_is_handed_off() {
        assert_hand_off(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n\r\n");
        // A list, even of options the fast path knows, is hyper's.
        assert_hand_off(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, close\r\n\r\n");
    }

    #[test]
    fn two_connection_fields_are_handed_off() {
        assert_hand_off(
            b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nConnection: keep-alive\r\n\r\n",
        );
        assert_hand_off(
            b"GET / HTTP/1.1\r\nConnection: keep-alive\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
    }

    #[test]
    fn absolute_form_is_handed_off() {
        assert_hand_off(b"GET http://x/ HTTP/1.1\r\nHost: x\r\n\r\n");
    }

    #[test]
    fn connect_is_handed_off() {
        assert_hand_off(b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n");
        // Even in origin form (which hyper refuses with 400).
        assert_hand_off(b"CONNECT / HTTP/1.1\r\nHost: x\r\n\r\n");
    }

    #[test]
    fn asterisk_form_is_handed_off() {
        assert_hand_off(b"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n");
    }

    #[test]
    fn differing_content_lengths_are_refused_and_equal_ones_served() {
        assert_refused(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            400,
        );
        let (parsed, buffer) = parse_bytes(
            b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        );
        let (request, _) = request(parsed);
        assert_eq!(body_bytes(&request).as_deref(), Some(&b"hello"[..]));
        assert!(buffer.is_empty());
    }

    #[test]
    fn content_length_that_is_not_digits_is_refused() {
        // (Trailing spaces are not here: httparse trims them, for hyper too.)
        for value in [
            "+5",
            "-5",
            "0x5",
            "5,5",
            "5 5",
            "",
            "99999999999999999999999",
        ] {
            let bytes =
                format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {value}\r\n\r\nhello");
            assert_refused(bytes.as_bytes(), 400);
        }
    }

    #[test]
    fn malformed_heads_are_refused() {
        for bad in [
            &b"GET / HTTP/1.1\r\nHost : x\r\n\r\n"[..],
            b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nBad\x01Name: x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nNo-Colon\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n",
            b"GET / HTTP/1.1\nHost: x\n\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
        ] {
            assert_refused(bad, 400);
        }
    }

    #[test]
    fn more_fields_than_hyper_allows_are_refused() {
        let mut bytes = b"GET / HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_FIELDS {
            bytes.extend_from_slice(format!("x-f{i}: v\r\n").as_bytes());
        }
        bytes.extend_from_slice(b"\r\n");
        assert_refused(&bytes, 431);
    }

    #[test]
    fn a_head_over_the_limit_is_refused_complete_or_not() {
        let long = format!(
            "GET / HTTP/1.1\r\nHost: x\r\nX: {}\r\n\r\n",
            "a".repeat(70 * 1024)
        );
        assert_refused(long.as_bytes(), 431);
        assert_refused(&long.as_bytes()[..66 * 1024], 431);
    }

    #[test]
    fn a_target_uri_refuses_is_refused() {
        // httparse lets `<` through in a target; `Uri` does not.
        assert_refused(
            b"GET /a<b HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\n\r\n",
            400,
        );
    }

    #[test]
    fn body_not_all_read_is_handed_off() {
        assert_hand_off(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nhello");
        assert_hand_off(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n");
    }

    #[test]
    fn post_with_whole_body_leaves_what_follows() {
        let (parsed, buffer) = parse_bytes(
            b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\n",
        );
        let (request, close) = request(parsed);
        assert!(!close);
        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri(), "/p");
        assert_eq!(request.headers()["content-length"], "5");
        assert_eq!(body_bytes(&request).as_deref(), Some(&b"hello"[..]));
        assert_eq!(request.body().size_hint().exact(), Some(5));
        assert_eq!(&buffer[..], b"GET /next HTTP/1.1\r\n");
    }

    #[test]
    fn content_length_zero_is_no_body() {
        let (parsed, buffer) = parse_bytes(
            b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\nGET / HTTP/1.1\r\n\r\n",
        );
        let (request, _) = request(parsed);
        assert_eq!(body_bytes(&request), None);
        assert_eq!(&buffer[..], b"GET / HTTP/1.1\r\n\r\n");
    }

    #[test]
    fn pipelined_requests_parse_one_after_the_other() {
        let mut buffer = BytesMut::from(
            &b"GET /one HTTP/1.1\r\nHost: x\r\nX-One: 1\r\n\r\n\
               GET /two HTTP/1.1\r\nHost: y\r\n\r\n\
               POST /three HTTP/1.1\r\nHost: z\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc\
               GET /fou"[..],
        );
        let mut fields = HeaderMap::new();
        let (first, close) = request(parse(&mut buffer, &mut fields, 1024));
        assert_eq!(first.uri(), "/one");
        assert_eq!(first.headers()["x-one"], "1");
        assert!(!close);
        let (second, close) = request(parse(&mut buffer, &mut fields, 1024));
        assert_eq!(second.method(), Method::GET);
        assert_eq!(second.uri(), "/two");
        assert_eq!(second.headers()["host"], "y");
        assert!(second.headers().get("x-one").is_none());
        assert!(!close);
        let (third, close) = request(parse(&mut buffer, &mut fields, 1024));
        assert_eq!(third.method(), Method::POST);
        assert_eq!(third.uri(), "/three");
        assert_eq!(body_bytes(&third).as_deref(), Some(&b"abc"[..]));
        assert!(close);
        assert_eq!(third.headers()["host"], "z");
        assert!(matches!(
            parse(&mut buffer, &mut fields, 1024),
            Parsed::Partial
        ));
        assert_eq!(&buffer[..], b"GET /fou");
    }

    #[test]
    fn the_reused_map_starts_empty() {
        let mut fields = HeaderMap::with_capacity(32);
        fields.insert("x-leftover", HeaderValue::from_static("stale"));
        fields.append("host", HeaderValue::from_static("stale.test"));
        let mut buffer = BytesMut::from(&b"GET / HTTP/1.1\r\nHost: fresh.test\r\n\r\n"[..]);
        let (request, _) = request(parse(&mut buffer, &mut fields, 1024));
        assert_eq!(request.headers().len(), 1, "{:?}", request.headers());
        assert!(request.headers().get("x-leftover").is_none());
        let hosts: Vec<_> = request.headers().get_all("host").iter().collect();
        assert_eq!(hosts, ["fresh.test"]);
    }

    /// The values are built without `HeaderValue`'s own check (see
    /// `parse`): every byte, at the start of a value, inside a short one
    /// (httparse's byte and SWAR loops) and deep inside a long one (its
    /// SIMD loop), is taken by the parser exactly when `HeaderValue` takes
    /// it, and what the map holds is what was sent.
    #[test]
    fn every_value_byte_the_parser_takes_header_value_takes() {
        let mut taken = 0;
        for byte in 0..=u8::MAX {
            for (before, after) in [(0, 3), (3, 3), (40, 40)] {
                let mut value = vec![b'a'; before];
                value.push(byte);
                value.extend(std::iter::repeat_n(b'z', after));
                let mut bytes = b"GET / HTTP/1.1\r\nHost: x\r\nX-Byte: ".to_vec();
                bytes.extend_from_slice(&value);
                bytes.extend_from_slice(b"\r\n\r\n");
                let accepted = match parse_bytes(&bytes).0 {
                    Parsed::Request { request, .. } => {
                        let held = request.headers()["x-byte"].as_bytes();
                        assert!(HeaderValue::from_bytes(held).is_ok(), "{byte:#04x}");
                        // httparse skips white space before a value.
                        let sent = if before == 0 && (byte == b' ' || byte == b'\t') {
                            &value[1..]
                        } else {
                            &value[..]
                        };
                        assert_eq!(held, sent, "{byte:#04x} at {before}");
                        true
                    }
                    Parsed::Refused(_) => false,
                    other => panic!("{byte:#04x} at {before}: {other:?}"),
                };
                assert_eq!(
                    accepted,
                    HeaderValue::from_bytes(&value).is_ok(),
                    "{byte:#04x} at {before}"
                );
                taken += usize::from(accepted);
            }
        }
        // HTAB, SP..=0x7E and 0x80..=0xFF, in each of the three places.
        assert_eq!(taken, 3 * (1 + 95 + 128));
    }

    #[test]
    fn host_in_any_letter_case_is_the_host_field() {
        for name in ["Host", "host", "HOST", "hOsT"] {
            let bytes = format!("GET / HTTP/1.1\r\n{name}: a.test\r\nX-Host: b\r\n\r\n");
            let (request, _) = request(parse_bytes(bytes.as_bytes()).0);
            assert_eq!(request.headers().get(HOST).unwrap(), "a.test", "{name}");
            assert_eq!(request.headers().len(), 2, "{name}");
        }
        // Names that only start or end like it are other fields, so the
        // request has no Host.
        for name in ["Hos", "Hostt", "X-Host", "Host-"] {
            let bytes = format!("GET / HTTP/1.1\r\n{name}: a.test\r\n\r\n");
            assert_refused(bytes.as_bytes(), 400);
        }
    }

    /// `field_name`'s shortcut names what `HeaderName::from_bytes` names,
    /// for `host` with any one byte changed to any other (every case of
    /// every letter among them).
    #[test]
    fn field_name_is_header_name_near_host() {
        let mut hosts = 0;
        for at in 0..4 {
            for byte in 0..=u8::MAX {
                for base in [*b"host", *b"HOST"] {
                    let mut name = base;
                    name[at] = byte;
                    let Ok(name) = std::str::from_utf8(&name) else {
                        continue;
                    };
                    let expected = HeaderName::from_bytes(name.as_bytes()).ok();
                    assert_eq!(field_name(name).ok(), expected, "{name:?}");
                    hosts += usize::from(expected == Some(HOST));
                }
            }
        }
        // Per place and base: the byte in two letter cases.
        assert_eq!(hosts, 4 * 2 * 2);
    }

    #[test]
    fn lower_case_and_extension_methods_are_kept_as_sent() {
        // hyper takes any token as a method; so does the fast path, and the
        // router decides.
        let (parsed, _) = parse_bytes(b"PURGE /c HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(request(parsed).0.method().as_str(), "PURGE");
        let (parsed, _) = parse_bytes(b"get /c HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(request(parsed).0.method().as_str(), "get");
    }
}
