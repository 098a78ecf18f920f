//! The chunked transfer coding (RFC 9112 §7.1) of upstream responses: an
//! incremental decoder for their bodies. (The framing written around bodies
//! of unknown length is shared with the server side: `http::chunked`.)
//!
//! The decoder works on the connection's read buffer in place: chunk data is
//! split off as shared [`Bytes`] (no copy), and everything else — sizes,
//! extensions, line ends, trailers — is consumed and dropped. Trailer fields
//! are not forwarded (the response head has gone by then; RFC 9110 §6.5.1
//! lets a recipient discard them).

use std::io;

use bytes::{Buf, Bytes, BytesMut};

use super::head::invalid;

/// Longest chunk-size line (size, extensions) or trailer line accepted; a
/// longer one is a broken or hostile upstream.
const MAX_LINE: usize = 4096;
/// Most trailer bytes accepted in all.
const MAX_TRAILERS: usize = 16 * 1024;

/// What one step of decoding found in the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Chunk data, in order.
    Data(Bytes),
    /// The buffer holds no complete next piece: read more.
    NeedMore,
    /// The last chunk and the trailer section have been consumed.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// At the start of a chunk-size line.
    Size,
    /// Inside chunk data, this many bytes left.
    Data(u64),
    /// After chunk data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines up to an empty one.
    Trailers {
        seen: usize,
    },
    Done,
}

/// Decodes one chunked body across as many reads as it takes.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        ChunkedDecoder { state: State::Size }
    }
}

/// The position just past the next LF in `buf`, if one is there.
fn line_end(buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&b| b == b'\n').map(|i| i + 1)
}

impl ChunkedDecoder {
    /// Takes the next piece of the body out of `buf`.
    pub fn decode(&mut self, buf: &mut BytesMut) -> io::Result<Decoded> {
        loop {
            match self.state {
                State::Done => return Ok(Decoded::Done),
                State::Size => {
                    let Some(end) = line_end(buf) else {
                        if buf.len() > MAX_LINE {
                            return Err(invalid("chunk size line too long"));
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    if end > MAX_LINE {
                        return Err(invalid("chunk size line too long"));
                    }
                    let size = parse_size(&buf[..end])?;
                    buf.advance(end);
                    self.state = if size == 0 {
                        State::Trailers { seen: 0 }
                    } else {
                        State::Data(size)
                    };
                }
                State::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(take).freeze();
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        State::DataEnd
                    } else {
                        State::Data(left)
                    };
                    return Ok(Decoded::Data(data));
                }
                State::DataEnd => {
                    if buf.len() < 2 {
                        // A lone LF is tolerated as a line end (RFC 9112 §2.2).
                        if buf.first() == Some(&b'\n') {
                            buf.advance(1);
                            self.state = State::Size;
                            continue;
                        }
                        return Ok(Decoded::NeedMore);
                    }
                    match &buf[..2] {
                        b"\r\n" => buf.advance(2),
                        [b'\n', _] => buf.advance(1),
                        _ => return Err(invalid("chunk data not followed by CRLF")),
                    }
                    self.state = State::Size;
                }
                State::Trailers { seen } => {
                    let Some(end) = line_end(buf) else {
                        if buf.len() > MAX_LINE {
                            return Err(invalid("trailer line too long"));
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    let seen = seen + end;
                    if end > MAX_LINE || seen > MAX_TRAILERS {
                        return Err(invalid("trailer section too long"));
                    }
                    let empty = matches!(&buf[..end], b"\r\n" | b"\n");
                    buf.advance(end);
                    self.state = if empty {
                        State::Done
                    } else {
                        State::Trailers { seen }
                    };
                }
            }
        }
    }
}

/// The chunk size of a chunk-size line (`1a;ext=1\r\n`): hex digits, then
/// optional whitespace and extensions, which are ignored.
fn parse_size(line: &[u8]) -> io::Result<u64> {
    let mut size: u64 = 0;
    let mut digits = 0;
    for &b in line {
        let value = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            b';' | b' ' | b'\t' | b'\r' | b'\n' => break,
            _ => return Err(invalid("invalid chunk size")),
        };
        digits += 1;
        if digits > 15 {
            return Err(invalid("chunk size too large"));
        }
        size = size * 16 + u64::from(value);
    }
    if digits == 0 {
        return Err(invalid("missing chunk size"));
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `input` fed in pieces of `step` bytes; the data and whether
    /// the end was reached.
    fn decode_in_steps(input: &[u8], step: usize) -> io::Result<(Vec<u8>, bool, BytesMut)> {
        let mut decoder = ChunkedDecoder::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            match decoder.decode(&mut buf)? {
                Decoded::Data(data) => out.extend_from_slice(&data),
                Decoded::Done => return Ok((out, true, buf)),
                Decoded::NeedMore => {
                    if fed == input.len() {
                        return Ok((out, false, buf));
                    }
                    let next = (fed + step).min(input.len());
                    buf.extend_from_slice(&input[fed..next]);
                    fed = next;
                }
            }
        }
    }

    #[test]
    fn decodes_whole_and_byte_by_byte() {
        let body = b"4\r\nWiki\r\n5;name=value\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\n\r\n";
        for step in [1, 2, 3, 7, body.len()] {
            let (data, done, rest) = decode_in_steps(body, step).unwrap();
            assert_eq!(data, b"Wikipedia in\r\n\r\nchunks.", "step {step}");
            assert!(done);
            assert!(rest.is_empty());
        }
    }

    #[test]
    fn trailers_are_consumed_and_what_follows_is_left() {
        let body = b"3\r\nabc\r\n0\r\nExpires: never\r\nX-A: 1\r\n\r\nHTTP/1.1";
        let (data, done, rest) = decode_in_steps(body, body.len()).unwrap();
        assert_eq!(data, b"abc");
        assert!(done);
        assert_eq!(&rest[..], b"HTTP/1.1");
    }

    #[test]
    fn bare_lf_line_ends_are_tolerated() {
        let (data, done, _) = decode_in_steps(b"3\nabc\n0\n\n", 1).unwrap();
        assert_eq!(data, b"abc");
        assert!(done);
    }

    #[test]
    fn an_unfinished_body_needs_more() {
        let (data, done, _) = decode_in_steps(b"5\r\nab", 64).unwrap();
        assert_eq!(data, b"ab");
        assert!(!done);
    }

    #[test]
    fn malformed_bodies_are_errors() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"3\r\nabcX\r\n",
            b"ffffffffffffffff1\r\n",
            b"-1\r\n",
        ] {
            assert!(decode_in_steps(bad, 64).is_err(), "{bad:?}");
        }
        let long = vec![b'1'; MAX_LINE + 10];
        assert!(decode_in_steps(&long, 64).is_err());
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..2000 {
            trailers.extend_from_slice(b"X-Trailer: 1234567\r\n");
        }
        assert!(decode_in_steps(&trailers, 512).is_err());
    }
}
