//! Hop-by-hop fields (RFC 9110 §7.6.1): which fields they are, what a
//! `Connection` field's tokens say, and whether `Transfer-Encoding` ends in
//! `chunked`. One definition for both directions of
//! forwarding — the request side sees fields as header-map entries
//! (`forward.rs`), the response side as raw bytes while parsing
//! (`client/head.rs`) — so both leave out exactly the same fields.

/// The hop-by-hop fields, lowercase.
const NAMES: [&[u8]; 7] = [
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
];

/// Whether a field name (any case) is hop-by-hop.
pub(crate) fn is_hop_by_hop(name: &[u8]) -> bool {
    NAMES.iter().any(|hop| name.eq_ignore_ascii_case(hop))
}

/// One token of a `Connection` field value (RFC 9112 §9.3, RFC 9110 §7.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnectionToken<'a> {
    Close,
    KeepAlive,
    Upgrade,
    /// A field name: that field is hop-by-hop too.
    Names(&'a [u8]),
}

/// The tokens of a `Connection` field value, empty list elements skipped.
pub(crate) fn connection_tokens(value: &[u8]) -> impl Iterator<Item = ConnectionToken<'_>> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|token| !token.is_empty())
        .map(|token| {
            if token.eq_ignore_ascii_case(b"close") {
                ConnectionToken::Close
            } else if token.eq_ignore_ascii_case(b"keep-alive") {
                ConnectionToken::KeepAlive
            } else if token.eq_ignore_ascii_case(b"upgrade") {
                ConnectionToken::Upgrade
            } else {
                ConnectionToken::Names(token)
            }
        })
}

/// Whether the last coding a `Transfer-Encoding` value lists is `chunked`
/// (codings apply in order, so the last decides how the body is framed).
pub(crate) fn ends_in_chunked(value: &[u8]) -> bool {
    value
        .rsplit(|&b| b == b',')
        .next()
        .is_some_and(|coding| coding.trim_ascii().eq_ignore_ascii_case(b"chunked"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_in_any_case() {
        assert!(is_hop_by_hop(b"Transfer-Encoding"));
        assert!(is_hop_by_hop(b"TE"));
        assert!(!is_hop_by_hop(b"content-length"));
    }

    #[test]
    fn tokens_are_classified() {
        let tokens: Vec<_> = connection_tokens(b"Keep-Alive, ,Upgrade ,x-secret,close").collect();
        assert_eq!(
            tokens,
            [
                ConnectionToken::KeepAlive,
                ConnectionToken::Upgrade,
                ConnectionToken::Names(b"x-secret"),
                ConnectionToken::Close,
            ]
        );
    }
}
