//! The chunked transfer coding's framing (RFC 9112 §7.1), as both sides
//! write it: chunk-size lines and the last chunk. The server side writes
//! hyper's upper-case hex (a client sees the same bytes from the fast path
//! and from hyper); the upstream client writes lower case. Decoding is the
//! reading side's own (`http1::client::chunked`).

/// Hex digits for [`size_line_with`]: ours, as the upstream client writes them.
pub(crate) const LOWER_HEX: &[u8; 16] = b"0123456789abcdef";
/// Hex digits for [`size_line_with`]: hyper's, as the server side writes them.
pub(crate) const UPPER_HEX: &[u8; 16] = b"0123456789ABCDEF";

/// The chunk-size line for a chunk of `len` bytes (`"1a\r\n"`), written into
/// a stack buffer; returns the used part.
pub fn size_line(len: usize, out: &mut [u8; 18]) -> &[u8] {
    size_line_with(len, LOWER_HEX, out)
}

/// [`size_line`] with the given hex digits (their letter case).
pub(crate) fn size_line_with<'o>(len: usize, hex: &[u8; 16], out: &'o mut [u8; 18]) -> &'o [u8] {
    let mut digits = [0u8; 16];
    let mut n = len;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = hex[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    let count = digits.len() - i;
    out[..count].copy_from_slice(&digits[i..]);
    out[count] = b'\r';
    out[count + 1] = b'\n';
    &out[..count + 2]
}

/// What ends a chunked body with no trailers.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_lines_are_lowercase_hex() {
        let mut out = [0u8; 18];
        assert_eq!(size_line(0, &mut out), b"0\r\n");
        assert_eq!(size_line(26, &mut out), b"1a\r\n");
        assert_eq!(size_line(0x10000, &mut out), b"10000\r\n");
        assert_eq!(size_line(usize::MAX, &mut out).len(), 16 + 2);
    }
}
