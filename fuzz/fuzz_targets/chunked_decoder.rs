//! Fuzz target for the upstream chunked decoder
//! (`proxy::client::chunked::ChunkedDecoder`): arbitrary bytes as a chunked
//! response body.
//!
//! Beyond "never panics", it checks what must hold for any input: the body
//! fed in any split (the first byte picks the piece sizes) decodes to the
//! same data, end, error and leftover as fed whole; and a body that decoded
//! to its end, re-encoded with the gateway's own chunk framing, decodes to
//! the same data with nothing left over.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use tollgate::http::chunked::{LAST_CHUNK, size_line};
use tollgate::http1::client::chunked::{ChunkedDecoder, Decoded};

/// What decoding `input` fed in pieces (sizes cycling through `steps`) gave:
/// the data chunks, whether the end came, the error text, and what follows
/// the body.
fn decode(input: &[u8], steps: &[usize]) -> (Vec<Vec<u8>>, bool, Option<String>, Vec<u8>) {
    let mut decoder = ChunkedDecoder::default();
    let mut buf = BytesMut::new();
    let mut chunks = Vec::new();
    let mut fed = 0;
    let mut step = steps.iter().cycle();
    loop {
        match decoder.decode(&mut buf) {
            Ok(Decoded::Data(data)) => {
                assert!(!data.is_empty(), "an empty data piece");
                chunks.push(data.to_vec());
            }
            Ok(Decoded::Done) => {
                // What the decoder left, and what was never fed to it.
                let mut rest = buf.to_vec();
                rest.extend_from_slice(&input[fed..]);
                return (chunks, true, None, rest);
            }
            Ok(Decoded::NeedMore) => {
                if fed == input.len() {
                    return (chunks, false, None, buf.to_vec());
                }
                let next = (fed + step.next().copied().unwrap_or(1).max(1)).min(input.len());
                buf.extend_from_slice(&input[fed..next]);
                fed = next;
            }
            Err(error) => return (chunks, false, Some(error.to_string()), Vec::new()),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let (whole_chunks, whole_done, whole_error, whole_rest) = decode(body, &[body.len()]);
    let steps = [
        usize::from(control & 0x7) + 1,
        usize::from(control >> 3) + 1,
        1,
        usize::from(control) * 3 + 1,
    ];
    let (split_chunks, split_done, split_error, split_rest) = decode(body, &steps);
    let whole_data = whole_chunks.concat();
    assert_eq!(whole_data, split_chunks.concat(), "data differs by split");
    assert_eq!(whole_done, split_done, "end differs by split");
    assert_eq!(whole_error, split_error, "error differs by split");
    assert_eq!(whole_rest, split_rest, "leftover differs by split");
    if whole_done {
        // Re-encoded as the gateway writes chunks: one per decoded piece.
        let mut encoded = Vec::new();
        for chunk in &whole_chunks {
            let mut line = [0u8; 18];
            encoded.extend_from_slice(size_line(chunk.len(), &mut line));
            encoded.extend_from_slice(chunk);
            encoded.extend_from_slice(b"\r\n");
        }
        encoded.extend_from_slice(LAST_CHUNK);
        let (again, done, error, rest) = decode(&encoded, &steps);
        assert_eq!(error, None, "own encoding refused");
        assert!(done && rest.is_empty(), "own encoding not read to its end");
        assert_eq!(again.concat(), whole_data, "re-encoded body differs");
    }
});
