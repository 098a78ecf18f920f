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
    NAMES.iter().any(|hop| is_name(name, hop))
}

/// Whether `name`, a field name or a token of a field value, is `lower`
/// in any case, where `lower` is lowercase letters, digits and `-`. A word
/// at a time, with bit 0x20 set in every byte of `name`: that makes an
/// uppercase letter its lowercase one, and makes nothing else a lowercase
/// letter, a digit or `-` but CR (0x0D) and controls 0x10–0x19, none of
/// which a field line can hold (they are refused as it is parsed). The
/// byte loop of `eq_ignore_ascii_case` cost ~50 instructions a name, on
/// every field of every response.
#[inline(always)]
pub(crate) fn is_name(name: &[u8], lower: &[u8]) -> bool {
    debug_assert!(
        lower
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    );
    let n = lower.len();
    if name.len() != n {
        return false;
    }
    // Two overlapping words of `width` bytes cover `n` (width ≤ n ≤ 2 × width).
    fn folded<const W: usize>(bytes: &[u8], at: usize) -> u64 {
        let mut word = [0u8; 8];
        word[..W].copy_from_slice(&bytes[at..at + W]);
        u64::from_le_bytes(word) | u64::from_le_bytes([0x20; 8])
    }
    fn plain<const W: usize>(bytes: &[u8], at: usize) -> u64 {
        let mut word = [0x20u8; 8];
        word[..W].copy_from_slice(&bytes[at..at + W]);
        u64::from_le_bytes(word)
    }
    fn both<const W: usize>(name: &[u8], lower: &[u8], n: usize) -> bool {
        folded::<W>(name, 0) == plain::<W>(lower, 0)
            && folded::<W>(name, n - W) == plain::<W>(lower, n - W)
    }
    match n {
        0 => true,
        1 => name[0] | 0x20 == lower[0],
        2..=3 => both::<2>(name, lower, n),
        4..=7 => both::<4>(name, lower, n),
        8..=16 => both::<8>(name, lower, n),
        _ => name.iter().zip(lower).all(|(&b, &l)| b | 0x20 == l),
    }
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

    /// `is_name` agrees with `eq_ignore_ascii_case` for every byte a
    /// field name or value can hold, at every length and position.
    #[test]
    fn is_name_is_a_case_insensitive_comparison() {
        let allowed: Vec<u8> = (0u8..=255)
            .filter(|&b| b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80)
            .collect();
        for lower in [
            &b"te"[..],
            b"x",
            b"date",
            b"upgrade",
            b"connection",
            b"keep-alive",
            b"content-length",
            b"transfer-encoding",
            b"proxy-connection",
            b"a-much-longer-field-name-0123",
        ] {
            assert!(is_name(lower, lower));
            assert!(is_name(&lower.to_ascii_uppercase(), lower));
            for at in 0..lower.len() {
                for &b in &allowed {
                    let mut name = lower.to_vec();
                    name[at] = b;
                    assert_eq!(
                        is_name(&name, lower),
                        name.eq_ignore_ascii_case(lower),
                        "{:?} against {:?}",
                        String::from_utf8_lossy(&name),
                        String::from_utf8_lossy(lower)
                    );
                }
            }
            assert!(!is_name(&lower[1..], lower));
            assert!(!is_name(&[lower, b"s"].concat(), lower));
        }
    }

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
