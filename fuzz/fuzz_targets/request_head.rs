//! Fuzz target for the request side's parser and framing check: arbitrary
//! bytes as what a client sends on a connection, through the fast path's
//! `h1::parse` and through the gate's `Scanner` (the check of every request
//! after a hand-off to hyper), delivered in pieces.
//!
//! Beyond "never panics", it checks what must hold for any input:
//! - a head either parser accepts has exactly one framing: no
//!   `Transfer-Encoding` with a `Content-Length`, `Transfer-Encoding` only as
//!   one `chunked` line, every `Content-Length` line the same `1*DIGIT`;
//!   exactly one `Host` for HTTP/1.1, and every `Host` and a target's
//!   authority a host by an independent reading of the rule (what
//!   `http::uri::Authority`, hyper's parser, reads, narrowed: no userinfo,
//!   no `%`, a port of digits up to 65535, an IPv6 literal the standard
//!   library parses, no empty label); every line ended by CRLF;
//! - the host rule (`http::host::parse`) on every line of the input: what it
//!   accepts, `http::uri::Authority` accepts with the same host and port
//!   (every host hyper refuses, tollgate refuses), and the same reading;
//! - a `Content-Length` the crate accepts round-trips: its value is its
//!   digits, leading zeros aside;
//! - the fast path's map holds exactly the head's fields, every value one
//!   `HeaderValue::from_bytes` accepts (the parser builds them without that
//!   check, relying on httparse's value rule);
//! - the fast path's body is exactly the declared length, and a hand-off
//!   leaves the buffer as it was;
//! - the scanner never passes more bytes than it was shown, and the bytes it
//!   passes do not depend on how the input was split (nor does where it
//!   stops, but for a malformed head that arrived in pieces still waiting
//!   for its end).

#![no_main]

use bytes::BytesMut;
use http::{HeaderMap, HeaderValue};
use http_body::Body;
use libfuzzer_sys::fuzz_target;
use tollgate::http1::server::gate::{Scanner, Step};
use tollgate::http1::server::{Parsed, parse};
use tollgate::http::{content_length, host};

const MAX_HEAD: usize = 4 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    fast_path(input);
    let whole = scan(input, input.len().max(1));
    let split = scan(input, usize::from(control % 16) + 1);
    assert_eq!(whole.0, split.0, "the split changed what passed");
    // A partial head is parsed again only once it may have ended, so a
    // malformed head arriving in pieces may still be waiting (`More`)
    // where the whole one is refused at once; every other stop is the same.
    let waiting_or_refused = |stop: &str| stop == "More" || stop.starts_with("RefuseHead");
    assert!(
        whole.1 == split.1 || (waiting_or_refused(&whole.1) && waiting_or_refused(&split.1)),
        "the split changed the stop: {whole:?} / {split:?}"
    );
    for value in input.split(|&b| b == b'\n') {
        round_trips(value);
        host_rule(value.strip_suffix(b"\r").unwrap_or(value));
    }
});

/// `h1::parse` on the whole input.
fn fast_path(input: &[u8]) {
    let mut buffer = BytesMut::from(input);
    match parse(&mut buffer, &mut HeaderMap::new(), MAX_HEAD) {
        Parsed::Request { request, .. } => {
            let consumed = input.len() - buffer.len();
            assert!(input[..consumed].ends_with(b"\r\n\r\n") || body_len(&request) > 0);
            let head_len = consumed - body_len(&request);
            assert_one_framing(&input[..head_len]);
            let headers = request.headers();
            assert!(headers.get("transfer-encoding").is_none());
            let declared = content_length::parse(
                headers
                    .get_all("content-length")
                    .iter()
                    .map(|v| v.as_bytes()),
            )
            .expect("an accepted request's Content-Length parses");
            assert_eq!(declared.unwrap_or(0), body_len(&request) as u64);
            assert_eq!(headers.get_all("host").iter().count(), 1);
            assert_fields_as_sent(&input[..head_len], headers);
        }
        Parsed::HandOff => assert_eq!(&buffer[..], input, "a hand-off moved bytes"),
        Parsed::Partial => assert_eq!(&buffer[..], input),
        Parsed::Refused(_) => {}
    }
}

/// The fast path's map holds exactly the head's fields, each value as sent
/// and one `HeaderValue` takes (the parser builds them without its check).
fn assert_fields_as_sent(head: &[u8], map: &HeaderMap) {
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut request = httparse::Request::new(&mut fields);
    assert!(matches!(request.parse(head), Ok(httparse::Status::Complete(_))));
    assert_eq!(map.len(), request.headers.len());
    for field in request.headers.iter() {
        assert!(
            map.get_all(field.name)
                .iter()
                .any(|value| value.as_bytes() == field.value),
            "{:?} is not in the map",
            field.name
        );
    }
    for value in map.values() {
        assert!(HeaderValue::from_bytes(value.as_bytes()).is_ok(), "{value:?}");
    }
}

fn body_len(request: &http::Request<tollgate::http1::server::ClientBody>) -> usize {
    request.body().size_hint().exact().unwrap_or(0) as usize
}

/// Runs the scanner over `input` arriving `step` bytes at a time; returns
/// the bytes passed and how it stopped. Upgrades are answered "not
/// upgraded" at once, so heads after them are scanned too.
fn scan(input: &[u8], step: usize) -> (usize, String) {
    let mut scanner = Scanner::new(MAX_HEAD);
    let mut available = 0;
    let mut passed = 0;
    loop {
        let shown = &input[passed..available];
        let at_head = scanner.at_head();
        match scanner.scan(shown) {
            Step::Pass(n) => {
                assert!(n > 0 && n <= shown.len(), "passed {n} of {}", shown.len());
                if at_head {
                    assert_one_framing(&shown[..n]);
                }
                passed += n;
            }
            Step::More if available < input.len() => {
                available = (available + step).min(input.len());
            }
            Step::AwaitIdle => {
                let len = scanner.release_upgrade();
                assert_one_framing(&shown[..len]);
                passed += len;
            }
            Step::AwaitAnswer => scanner.answered(b"HTTP/1.1 404 Not Found\r\n"),
            stop => return (passed, format!("{stop:?}")),
        }
    }
}

/// The invariant of every accepted head, checked independently of the
/// framing module: one framing, one Host for HTTP/1.1, CRLF line ends.
fn assert_one_framing(head: &[u8]) {
    let mut fields = [httparse::EMPTY_HEADER; 100];
    let mut request = httparse::Request::new(&mut fields);
    let Ok(httparse::Status::Complete(len)) = request.parse(head) else {
        panic!("an accepted head does not parse: {:?}", String::from_utf8_lossy(head));
    };
    assert_eq!(len, head.len());
    let headers: &[httparse::Header<'_>] = request.headers;
    let named = |name: &'static str| {
        headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
    };
    let te: Vec<_> = named("transfer-encoding").collect();
    let cl: Vec<_> = named("content-length").map(|h| h.value).collect();
    assert!(te.is_empty() || cl.is_empty(), "both framings accepted");
    assert!(te.len() <= 1, "two Transfer-Encoding lines accepted");
    if let Some(te) = te.first() {
        assert!(te.value.eq_ignore_ascii_case(b"chunked"), "a TE other than chunked");
    }
    assert!(content_length::parse(cl).is_ok(), "a bad Content-Length accepted");
    if request.version == Some(1) {
        assert_eq!(named("host").count(), 1, "HTTP/1.1 without exactly one Host");
    }
    for host in named("host") {
        assert_plausible_host(host.value);
    }
    let target = request.path.expect("a complete head has a target");
    if !target.starts_with('/') {
        let uri: http::Uri = target.parse().expect("an accepted target is a Uri");
        if let Some(authority) = uri.authority() {
            assert_plausible_host(authority.as_str().as_bytes());
        }
    }
    for (i, &b) in head.iter().enumerate() {
        if b == b'\n' {
            assert!(i > 0 && head[i - 1] == b'\r', "a bare LF accepted");
        }
    }
}

/// A value the crate's Content-Length rule accepts is its own digits.
fn round_trips(value: &[u8]) {
    if let Ok(n) = content_length::digits(value) {
        let trimmed = match value.iter().position(|&b| b != b'0') {
            Some(first) => &value[first..],
            None => &b"0"[..],
        };
        assert_eq!(trimmed, n.to_string().as_bytes(), "{value:?} is not {n}");
        assert_eq!(content_length::parse([value, value]), Ok(Some(n)));
    }
}

/// A host the gateway accepted, checked without its code: what
/// `http::uri::Authority` reads (as hyper does), without userinfo or `%`,
/// a port of digits at most 65535, an IPv6 literal `Ipv6Addr` parses, a
/// reg-name of at most 255 bytes with no empty label.
fn assert_plausible_host(value: &[u8]) {
    let lossy = String::from_utf8_lossy(value);
    let authority = http::uri::Authority::try_from(value)
        .unwrap_or_else(|e| panic!("host {lossy:?} accepted, Authority refuses it: {e}"));
    assert!(!value.contains(&b'@') && !value.contains(&b'%'), "{lossy:?}");
    let host = authority.host();
    assert!(!host.is_empty(), "{lossy:?}");
    match &value[host.len()..] {
        [] => {}
        [b':', port @ ..] => {
            assert!(!port.is_empty() && port.iter().all(u8::is_ascii_digit), "{lossy:?}");
            assert!(authority.port_u16().is_some(), "{lossy:?}: port over 65535");
        }
        _ => panic!("{lossy:?}: bytes after the host"),
    }
    if let Some(inside) = host.strip_prefix('[') {
        let inside = inside.strip_suffix(']').expect("a closed literal");
        assert!(inside.parse::<std::net::Ipv6Addr>().is_ok(), "{lossy:?}");
    } else {
        let name = host.strip_suffix('.').unwrap_or(host);
        assert!(host.len() <= 255, "{lossy:?}");
        assert!(name.split('.').all(|label| !label.is_empty()), "{lossy:?}");
    }
}

/// The host rule on any bytes: what it accepts is a plausible host
/// ([`assert_plausible_host`]) that `Authority` splits the same way.
fn host_rule(value: &[u8]) {
    let Ok(parsed) = host::parse(value) else {
        return;
    };
    assert_plausible_host(value);
    let authority = http::uri::Authority::try_from(value).expect("checked above");
    assert_eq!(authority.host().as_bytes(), parsed.host);
    assert_eq!(authority.port_u16(), parsed.port);
}
