//! Fuzz target for the upstream chunked decoder
//! (`proxy::client::chunked::ChunkedDecoder`): arbitrary bytes as a chunked
//! response body.
//!
//! Beyond "never panics", it checks what must hold for any input: the body
//! fed in any split (the first byte picks the piece sizes) decodes to the
//! same data, end, error and leftover as fed whole; and a body that decoded
//! to its end, re-encoded with the gateway's own chunk framing, decodes to
//! the same data with nothing left over. A decoder told to keep trailer
//! field `x` (as a token route keeps its usage count) decodes exactly as
//! one that is not, in any split keeps the same values, and keeps them only
//! from a body that ended, each without whitespace at its ends and found
//! in the input.

#![no_main]

use bytes::BytesMut;
use http::HeaderName;
use libfuzzer_sys::fuzz_target;
use tollgate::http::chunked::{LAST_CHUNK, size_line};
use tollgate::http1::client::chunked::{ChunkedDecoder, Decoded};

/// What decoding `input` fed in pieces (sizes cycling through `steps`) gave:
/// the data chunks, whether the end came, the error text, and what follows
/// the body.
type Outcome = (Vec<Vec<u8>>, bool, Option<String>, Vec<u8>);

fn decode(input: &[u8], steps: &[usize]) -> Outcome {
    decode_keeping(input, steps, false).0
}

/// [`decode`], the decoder told to keep trailer field `x` when `keep`:
/// also the values it kept (asked for after every step).
fn decode_keeping(input: &[u8], steps: &[usize], keep: bool) -> (Outcome, Vec<Vec<u8>>) {
    let mut decoder = ChunkedDecoder::default();
    if keep {
        decoder.keep_trailer(HeaderName::from_static("x"));
    }
    let mut kept = Vec::new();
    let mut take = |decoder: &mut ChunkedDecoder| {
        if let Some(trailers) = decoder.take_trailers() {
            assert!(kept.is_empty(), "trailers handed over twice");
            assert!(trailers.keys().all(|name| name == "x"), "another field kept");
            kept.extend(trailers.get_all("x").iter().map(|v| v.as_bytes().to_vec()));
        }
    };
    let outcome = decode_with(&mut decoder, input, steps, &mut take);
    take(&mut decoder);
    (outcome, kept)
}

fn decode_with(
    decoder: &mut ChunkedDecoder,
    input: &[u8],
    steps: &[usize],
    after_step: &mut dyn FnMut(&mut ChunkedDecoder),
) -> Outcome {
    let mut buf = BytesMut::new();
    let mut chunks = Vec::new();
    let mut fed = 0;
    let mut step = steps.iter().cycle();
    loop {
        let decoded = decoder.decode(&mut buf);
        after_step(decoder);
        match decoded {
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
    let whole = (whole_chunks.clone(), whole_done, whole_error.clone(), whole_rest.clone());
    let (kept_whole, values_whole) = decode_keeping(body, &[body.len()], true);
    let (kept_split, values_split) = decode_keeping(body, &steps, true);
    assert_eq!(kept_whole, whole, "keeping a trailer changed the decoding");
    assert_eq!(kept_split.0.concat(), whole_data, "keeping: data differs by split");
    assert_eq!(kept_split.1, whole_done, "keeping: end differs by split");
    assert_eq!(kept_split.2, whole_error, "keeping: error differs by split");
    assert_eq!(kept_split.3, whole_rest, "keeping: leftover differs by split");
    assert_eq!(values_whole, values_split, "kept values differ by split");
    if !whole_done {
        assert!(values_whole.is_empty(), "kept from a body that did not end");
    }
    for value in &values_whole {
        let ows = |b: &u8| *b == b' ' || *b == b'\t';
        assert!(!value.first().is_some_and(ows) && !value.last().is_some_and(ows));
        assert!(body.windows(value.len().max(1)).any(|w| value.is_empty() || w == &value[..]));
    }
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
