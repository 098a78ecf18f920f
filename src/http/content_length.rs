//! The one `Content-Length` rule of the crate (RFC 9110 §8.6, RFC 9112 §6.3
//! item 5), for requests and responses alike.
//!
//! - A value is `1*DIGIT`: no sign, no `0x`, no inner or surrounding
//!   whitespace (httparse has already trimmed the optional whitespace around
//!   a field value), no comma list, and it fits in a `u64`. `+5`, `-1`, `0x5`,
//!   ` 5`, `5,5`, `` (empty) and `18446744073709551616` are refused.
//! - Several field lines are allowed only when every one says the same
//!   number (RFC 9110 §8.6 lets a recipient accept identical duplicates, as
//!   hyper does on both sides); differing values are refused. A list in one
//!   line (`5, 5`) is refused even when its members agree: no sender needs
//!   one, and a proxy that reads a list differently from the next hop is
//!   exactly how lengths get smuggled.
//!
//! Callers with the values at hand use [`parse`]; a caller already walking a
//! message's fields folds them one at a time with [`merge`], so checking the
//! framing stays one pass without allocation.

/// Why a message's `Content-Length` cannot be used: the message is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ContentLengthError {
    /// A value that is not `1*DIGIT` or does not fit in 64 bits.
    #[error("Content-Length is not a decimal number")]
    Invalid,
    /// Two field lines with different numbers.
    #[error("Content-Length is given twice with different values")]
    Conflicting,
}

/// The length the `Content-Length` field lines `values` declare, in the
/// order they appear in the message; `Ok(None)` when there are none.
pub fn parse<'a, I>(values: I) -> Result<Option<u64>, ContentLengthError>
where
    I: IntoIterator<Item = &'a [u8]>,
{
    values
        .into_iter()
        .try_fold(None, |seen, value| merge(seen, value).map(Some))
}

/// Folds one more field line into the length seen so far (`None`: this is
/// the first line).
pub(crate) fn merge(seen: Option<u64>, value: &[u8]) -> Result<u64, ContentLengthError> {
    let length = digits(value)?;
    match seen {
        Some(earlier) if earlier != length => Err(ContentLengthError::Conflicting),
        _ => Ok(length),
    }
}

/// One field line's value: `1*DIGIT`, without overflow.
pub fn digits(value: &[u8]) -> Result<u64, ContentLengthError> {
    if value.is_empty() {
        return Err(ContentLengthError::Invalid);
    }
    value.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)
                .and_then(|n| n.checked_add(u64::from(b - b'0')))
                .ok_or(ContentLengthError::Invalid)
        } else {
            Err(ContentLengthError::Invalid)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_decimal_is_accepted() {
        assert_eq!(digits(b"0"), Ok(0));
        assert_eq!(digits(b"5"), Ok(5));
        assert_eq!(digits(b"007"), Ok(7));
        assert_eq!(digits(b"18446744073709551615"), Ok(u64::MAX));
    }

    #[test]
    fn everything_else_is_refused() {
        for refused in [
            &b""[..],
            b"+5",
            b"-1",
            b"-0",
            b" 5",
            b"5 ",
            b"5\t",
            b"5,5",
            b"5, 5",
            b"0x5",
            b"0X5",
            b"1e3",
            b"5.0",
            b"\x005",
            b"\xd9\xa5", // ARABIC-INDIC DIGIT FIVE: a digit, not an ASCII one
            b"18446744073709551616",
            b"99999999999999999999999",
        ] {
            assert_eq!(
                digits(refused),
                Err(ContentLengthError::Invalid),
                "{:?}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn lines_are_merged() {
        assert_eq!(parse([]), Ok(None));
        assert_eq!(parse([&b"5"[..]]), Ok(Some(5)));
        assert_eq!(parse([&b"5"[..], b"5"]), Ok(Some(5)));
        assert_eq!(parse([&b"5"[..], b"005"]), Ok(Some(5)), "the same number");
        assert_eq!(
            parse([&b"5"[..], b"6"]),
            Err(ContentLengthError::Conflicting)
        );
        assert_eq!(parse([&b"5"[..], b"x"]), Err(ContentLengthError::Invalid));
        assert_eq!(parse([&b"5, 5"[..]]), Err(ContentLengthError::Invalid));
    }
}
