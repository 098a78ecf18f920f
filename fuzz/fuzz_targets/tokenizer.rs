//! Fuzz target for the `prompt = "tokenizer"` count
//! (`llm::tokenizer::Encoding::count`), which must never panic a worker:
//! tiktoken-rs `unwrap()`s its pre-tokenizer's regex errors, and a run of a
//! million white-space characters before a letter overflows that regex's
//! stack.
//!
//! libFuzzer's inputs are short, so the target grows them: the first byte
//! picks the encoding (bit 0) and a repeat count (`2^((byte >> 1) mod 21)`, up
//! to a million), the second how many of the remaining bytes are repeated;
//! the text is that prefix repeated, then the rest, read as UTF-8 with
//! invalid bytes replaced (as the gateway reads a body), at most 2 MiB.
//! Beyond "never panics": no text counts 0 tokens but the empty one, and
//! none counts more tokens than bytes (a token is at least one byte, and the
//! `bytes/4` fallback less).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate::llm::tokenizer::Encoding;

/// The longest text built: enough for the million-character run.
const MAX_TEXT: usize = 2 << 20;

fuzz_target!(|data: &[u8]| {
    let [control, prefix_len, rest @ ..] = data else {
        return;
    };
    let encoding = if control & 1 == 0 {
        Encoding::O200kBase
    } else {
        Encoding::Cl100kBase
    };
    let repeats = 1usize << ((control >> 1) % 21);
    let (prefix, tail) = rest.split_at(usize::from(*prefix_len).min(rest.len()));
    let repeats = repeats.min(MAX_TEXT / prefix.len().max(1));
    let mut bytes = prefix.repeat(repeats);
    bytes.extend_from_slice(tail);
    let text = String::from_utf8_lossy(&bytes);

    let tokens = encoding.count(&text);
    assert_eq!(tokens == 0, text.is_empty(), "{tokens} tokens");
    let len = u64::try_from(text.len()).unwrap_or(u64::MAX);
    assert!(tokens <= len, "{tokens} tokens in {len} bytes");
});
