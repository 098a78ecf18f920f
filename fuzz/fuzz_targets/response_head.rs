//! Fuzz target for the upstream response-head parser
//! (`proxy::client::head::parse_response`): arbitrary bytes as what an
//! upstream answers, to a GET, a HEAD or a POST (the first byte picks).
//!
//! Beyond "never panics", it checks what must hold for any input:
//! - a prefix of an accepted head is `Partial`, never accepted or refused
//!   differently (the head may arrive in any split);
//! - an accepted head's lines all end in CRLF, it has not both
//!   `Transfer-Encoding` and `Content-Length`, and no `Transfer-Encoding` if
//!   it is HTTP/1.0;
//! - the framing follows RFC 9112 §6.3: no body for HEAD, 1xx, 204 and 304;
//!   a connection kept alive only when the body's end is known;
//! - the fields relayed to the client hold no hop-by-hop field, no CR, LF
//!   or NUL.

#![no_main]

use bytes::BytesMut;
use http::{Method, StatusCode};
use libfuzzer_sys::fuzz_target;
use tollgate::http1::client::head::{Framing, Parsed, parse_response};

/// The named fields of a head already accepted, counted by a plain parse.
fn count_fields(head: &[u8], name: &str) -> usize {
    let mut fields = [httparse::EMPTY_HEADER; 128];
    let mut response = httparse::Response::new(&mut fields);
    match response.parse(head) {
        Ok(httparse::Status::Complete(_)) => response
            .headers
            .iter()
            .filter(|field| field.name.eq_ignore_ascii_case(name))
            .count(),
        other => panic!("an accepted head does not parse again: {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, input)) = data.split_first() else {
        return;
    };
    let method = match control % 3 {
        0 => Method::GET,
        1 => Method::HEAD,
        _ => Method::POST,
    };
    let mut buf = BytesMut::from(input);
    let parsed = parse_response(&mut buf, &method);
    let consumed = input.len() - buf.len();
    match &parsed {
        Ok(Parsed::Partial) => assert_eq!(consumed, 0, "a partial head consumed bytes"),
        Ok(Parsed::Interim(_)) | Ok(Parsed::Head(_)) => {
            assert!(consumed > 0);
            // Any shorter prefix is only partial.
            for cut in [consumed - 1, consumed / 2, usize::from(control) % consumed] {
                let mut prefix = BytesMut::from(&input[..cut]);
                match parse_response(&mut prefix, &method) {
                    Ok(Parsed::Partial) => {}
                    other => panic!("prefix of {cut} bytes: {other:?}"),
                }
            }
            let head = &input[..consumed];
            for (i, &b) in head.iter().enumerate() {
                if b == b'\n' {
                    assert!(i > 0 && head[i - 1] == b'\r', "a bare LF accepted");
                }
            }
        }
        Err(_) => {}
    }
    let Ok(Parsed::Head(head)) = parsed else {
        return;
    };
    let text = &input[..consumed];
    let te = count_fields(text, "transfer-encoding");
    let cl = count_fields(text, "content-length");
    assert!(
        te == 0 || cl == 0,
        "Transfer-Encoding and Content-Length accepted"
    );
    if head.parts.version == http::Version::HTTP_10 {
        assert_eq!(te, 0, "Transfer-Encoding in HTTP/1.0 accepted");
    }
    let status = head.parts.status;
    if method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        assert_eq!(head.framing, Framing::Empty, "a body where none may be");
    }
    if head.keep_alive {
        assert_ne!(
            head.framing,
            Framing::UntilClose,
            "kept alive without an end"
        );
    }
    let mut relayed = Vec::new();
    head.fields.write_to(&mut relayed);
    for line in relayed
        .split(|&b| b == b'\n')
        .filter(|line| !line.is_empty())
    {
        let line = line
            .strip_suffix(b"\r")
            .expect("a relayed line ends in CRLF");
        assert!(
            !line.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0),
            "a control byte relayed: {line:?}"
        );
        let name = line.split(|&b| b == b':').next().unwrap_or_default();
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        assert!(
            ![
                "transfer-encoding",
                "keep-alive",
                "te",
                "trailer",
                "proxy-connection"
            ]
            .contains(&name.as_str()),
            "hop-by-hop field relayed: {name}"
        );
        if name == "connection" {
            assert_eq!(status, StatusCode::SWITCHING_PROTOCOLS);
        }
    }
});
