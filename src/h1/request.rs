//! Reading a request head for the fast path, and deciding whether it is one
//! the fast path serves.
//!
//! The decision is a short allow-list, not a re-implementation of HTTP/1.1:
//! an HTTP/1.1 request in origin form, no `CONNECT`, none of the fields that
//! change how the connection carries messages (`Transfer-Encoding`,
//! `Upgrade`, `Expect`, `TE`), and at most one `Connection` field that says
//! just `keep-alive` or `close`. A body is taken only when it has one valid
//! `Content-Length` and is already in the buffer. Everything else,
//! including every head httparse rejects, is [`Parsed::HandOff`]: hyper
//! reads it again from the same bytes and answers exactly as it always did.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::header::{CONNECTION, CONTENT_LENGTH, EXPECT, TE, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};

use crate::proxy::body::ClientBody;

/// At most this many fields, as hyper (`DEFAULT_MAX_HEADERS`); a head with
/// more is hyper's to refuse.
const MAX_FIELDS: usize = 100;

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
}

/// Parses the request at the start of `buffer`. `fields` is a map to reuse
/// (cleared; its capacity is what is kept).
pub fn parse(buffer: &mut BytesMut, fields: &mut HeaderMap) -> Parsed {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
    let mut request = httparse::Request::new(&mut []);
    let head_len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        buffer,
        &mut slots,
    ) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::HandOff,
    };
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
    let mut content_length: Option<u64> = None;
    let mut close: Option<bool> = None;
    for field in request.headers.iter() {
        let Ok(name) = HeaderName::from_bytes(field.name.as_bytes()) else {
            return Parsed::HandOff;
        };
        if name == CONNECTION {
            match (close, connection_option(field.value)) {
                (None, Some(option)) => close = Some(option),
                _ => return Parsed::HandOff,
            }
        }
        if name == TRANSFER_ENCODING || name == UPGRADE || name == EXPECT || name == TE {
            return Parsed::HandOff;
        }
        if name == CONTENT_LENGTH {
            match (content_length, super::response::digits(field.value)) {
                (None, Some(length)) => content_length = Some(length),
                _ => return Parsed::HandOff,
            }
        }
        let start = offset(field.value);
        names.push((name, start, start + field.value.len()));
    }
    let body_len = match content_length {
        None => 0,
        Some(length) => match usize::try_from(length) {
            Ok(length) if length <= buffer.len() - head_len => length,
            _ => return Parsed::HandOff,
        },
    };

    let head = buffer.split_to(head_len).freeze();
    let Ok(uri) = Uri::from_maybe_shared(head.slice(path_range)) else {
        // Rare (httparse lets through targets `Uri` refuses): put the head
        // back for hyper, which answers 400.
        let mut restored = BytesMut::with_capacity(head.len() + buffer.len());
        restored.extend_from_slice(&head);
        restored.extend_from_slice(buffer);
        *buffer = restored;
        return Parsed::HandOff;
    };
    let body = (body_len > 0).then(|| buffer.split_to(body_len).freeze());
    let mut map = std::mem::take(fields);
    map.clear();
    map.reserve(names.len());
    for (name, start, end) in names {
        // httparse has checked the value's bytes, which HeaderValue accepts.
        if let Ok(value) = HeaderValue::from_maybe_shared(head.slice(start..end)) {
            map.append(name, value);
        }
    }
    let mut built = Request::new(ClientBody::Complete(body));
    *built.method_mut() = method;
    *built.uri_mut() = uri;
    *built.version_mut() = Version::HTTP_11;
    *built.headers_mut() = map;
    Parsed::Request {
        request: built,
        close: close.unwrap_or(false),
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
