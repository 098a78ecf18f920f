//! Interim (1xx) responses from the upstream, other than `101`: what of
//! them goes on to the client, and where.
//!
//! RFC 9110 §15.2: a proxy forwards 1xx responses it did not ask for
//! itself. `103 Early Hints` is the one that matters (a client starts
//! fetching the `Link`ed resources while the upstream still works on the
//! answer). `100 Continue` is not relayed: the gateway's HTTP/1.1 server
//! answers a client's `Expect: 100-continue` itself when it starts reading
//! the body, so an upstream's `100` would be a second one. An interim head
//! is re-encoded (the gateway's `HTTP/1.1`, the canonical reason, its fields
//! without the hop-by-hop ones, RFC 9110 §7.6.1) and handed to an
//! [`InterimSink`], the client's connection, which writes it before the
//! final response. An upstream cannot hold a request with them for ever:
//! past [`MAX_INTERIM`] heads or [`MAX_INTERIM_BYTES`] the exchange fails
//! (a 502).

use http::StatusCode;

use crate::http::hop_by_hop::{ConnectionToken, connection_tokens, is_hop_by_hop};

/// Most interim responses accepted before a final one.
pub(crate) const MAX_INTERIM: usize = 16;
/// Most bytes of interim heads accepted before a final response.
pub(crate) const MAX_INTERIM_BYTES: usize = 64 * 1024;

/// Where the interim responses of a request go: the client's connection.
/// Called from within the request's own task, as the head arrives.
pub trait InterimSink: Sync {
    /// `head` is a complete `HTTP/1.1 1xx` head, ready to write.
    fn relay(&self, head: &[u8]);
}

/// The head to relay for an interim response, `None` for one that is not
/// relayed (`100 Continue`).
pub(super) fn client_head(status: StatusCode, fields: &[httparse::Header<'_>]) -> Option<Vec<u8>> {
    if status == StatusCode::CONTINUE {
        return None;
    }
    let length: usize = fields
        .iter()
        .map(|f| f.name.len() + f.value.len() + 4)
        .sum();
    let mut out = Vec::with_capacity(length + 48);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        status
            .canonical_reason()
            .unwrap_or("Informational")
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    let named = |name: &[u8]| {
        fields
            .iter()
            .filter(|f| f.name.eq_ignore_ascii_case("connection"))
            .flat_map(|f| connection_tokens(f.value))
            .any(|token| matches!(token, ConnectionToken::Names(n) if n.eq_ignore_ascii_case(name)))
    };
    for field in fields {
        let name = field.name.as_bytes();
        if is_hop_by_hop(name) || named(name) {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(field.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: u16, fields: &[(&str, &str)]) -> Option<String> {
        let fields: Vec<_> = fields
            .iter()
            .map(|(name, value)| httparse::Header {
                name,
                value: value.as_bytes(),
            })
            .collect();
        client_head(StatusCode::from_u16(status).unwrap(), &fields)
            .map(|bytes| String::from_utf8(bytes).unwrap())
    }

    #[test]
    fn early_hints_keep_their_fields_and_lose_hop_by_hop_ones() {
        assert_eq!(
            head(
                103,
                &[
                    ("Link", "</a.css>; rel=preload"),
                    ("Connection", "x-hop"),
                    ("X-Hop", "1"),
                    ("Keep-Alive", "timeout=5"),
                    ("link", "</b.js>; rel=preload"),
                ]
            )
            .unwrap(),
            "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\nlink: </b.js>; rel=preload\r\n\r\n"
        );
    }

    #[test]
    fn continue_is_not_relayed_and_unknown_codes_get_a_reason() {
        assert_eq!(head(100, &[]), None);
        assert_eq!(head(102, &[]).unwrap(), "HTTP/1.1 102 Processing\r\n\r\n");
        assert_eq!(
            head(199, &[]).unwrap(),
            "HTTP/1.1 199 Informational\r\n\r\n"
        );
    }
}
