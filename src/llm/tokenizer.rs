//! The `prompt = "tokenizer"` estimate (contract section 9): a prompt's
//! text counted in the BPE encoding of the request's model, with OpenAI's
//! own tables (tiktoken's, through `tiktoken-rs`, which embeds them).
//!
//! The model picks the encoding as tiktoken maps it: `o200k_base` for
//! gpt-4o, gpt-4.1, gpt-5, o1, o3…, `cl100k_base` for gpt-4, gpt-3.5 and
//! the v3 embeddings. A model it does not know, or a body without one, is
//! counted in `o200k_base`, the encoding of OpenAI's current models and a
//! close count for others; so are the retired completion models (davinci,
//! text-davinci-003), whose `p50k_base` and `r50k_base` tables are left
//! out of the binary (1.7 MB for models OpenAI no longer serves).
//!
//! Text is encoded "ordinary": a special token written in user text
//! (`<|endoftext|>`) is counted as the text it is, never as the token. Each
//! encoding's tables are built once, on first use ([`warm`] builds
//! `o200k_base` ahead of the first request), in `tiktoken-rs`'s
//! `LazyLock`s.
//!
//! No text may panic a worker. `tiktoken-rs` (0.12) `unwrap()`s the
//! pre-tokenizer's regex result inside `encode_ordinary`, and `fancy-regex`
//! fails a match whose backtracking stack passes a million entries: one
//! entry per character of a white-space run that `\s+(?!\S)` gives back, so
//! 999,999 spaces (or tabs, or U+3000) followed by a letter panic in both
//! encodings. Two guards: text reaches the encoder in segments of at most
//! [`SEGMENT`] bytes (checked below the bound at compile time), and a
//! segment whose encoding panics anyway, by this or a cause not yet found,
//! is counted as `bytes/4`, the other estimate of contract section 9.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

use tiktoken_rs::CoreBPE;
use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};

/// A BPE encoding, chosen per request from its model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// gpt-4o, gpt-4.1, gpt-5, o1, o3… and every model tiktoken does not map.
    O200kBase,
    /// gpt-4, gpt-3.5 and the v3 embeddings.
    Cl100kBase,
}

/// The encoding of an unknown model (or none).
pub const FALLBACK: Encoding = Encoding::O200kBase;

impl Encoding {
    /// The encoding tiktoken maps `model` to (exact names, then prefixes
    /// such as `gpt-4o-2024-05-13`, and `ft:` fine-tunes by their base) when
    /// it is `cl100k_base`, else [`FALLBACK`].
    pub fn of_model(model: Option<&str>) -> Encoding {
        match model.and_then(get_tokenizer) {
            Some(Tokenizer::Cl100kBase) => Encoding::Cl100kBase,
            // The harmony encoding is o200k_base's tokens with more special
            // ones, which ordinary text never produces.
            Some(Tokenizer::O200kBase | Tokenizer::O200kHarmony) => Encoding::O200kBase,
            Some(
                Tokenizer::P50kBase | Tokenizer::P50kEdit | Tokenizer::R50kBase | Tokenizer::Gpt2,
            )
            | None => FALLBACK,
        }
    }

    /// The encoding's tables, built on first use (~0.1 s and ~45 MB for
    /// `o200k_base` in a release build, half that for `cl100k_base`).
    fn tables(self) -> &'static CoreBPE {
        match self {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        }
    }

    /// The tokens of `text`, special-token text counted as text.
    pub fn count(self, text: &str) -> u64 {
        let tables = self.tables();
        segments(text)
            .map(|segment| count_segment(tables, segment))
            .fold(0, u64::saturating_add)
    }
}

/// The tokens of one segment, or its `bytes/4` when the encoder panics.
/// The default panic hook still logs the panic to stderr, which is wanted:
/// it names an input the guards above missed.
fn count_segment(tables: &CoreBPE, segment: &str) -> u64 {
    // Unwind-safe in fact: encoding only reads the tables, and the regex's
    // scratch space goes back to its pool when the unwind drops its guard.
    let encoded = catch_unwind(AssertUnwindSafe(|| tables.encode_ordinary(segment).len()));
    match encoded {
        Ok(tokens) => len_u64(tokens),
        Err(_) => len_u64(segment.len()).div_ceil(4),
    }
}

fn len_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Builds [`FALLBACK`]'s tables on a thread of their own, once per process,
/// so that the first request of a route that counts with the tokenizer
/// does not wait for them (it waits only for what is left, if it comes
/// sooner). `cl100k_base`'s are built when a request first names one of
/// its models.
pub(crate) fn warm() {
    static WARMED: Once = Once::new();
    WARMED.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("tokenizer-warm".to_owned())
            .spawn(|| {
                FALLBACK.tables();
            });
        // No thread: the first request builds them instead.
        drop(spawned);
    });
}

/// The longest text handed to the BPE at once. Its merge is quadratic in a
/// pre-tokenized piece's length, and a piece may be as long as the text (a
/// run of letters, or of spaces): 64 KiB of `a` take 11 ms in one piece,
/// and 1 MiB would take seconds; cut at 1 KiB, the cost is linear, at most
/// ~0.12 ms a KiB (release build; ~25 µs a KiB for prose). The cut also
/// keeps a segment's white-space runs far below [`ENCODER_PANIC_RUN`].
const SEGMENT: usize = 1024;

/// The shortest run of white space (in characters, each at least a byte)
/// before a non-space that overflows `fancy-regex`'s backtracking stack,
/// which `encode_ordinary` then `unwrap()`s: measured with tiktoken-rs
/// 0.12.1 and fancy-regex 0.19.2, in both encodings.
const ENCODER_PANIC_RUN: usize = 999_999;
const _: () = assert!(SEGMENT < ENCODER_PANIC_RUN);

/// `text` in pieces of at most [`SEGMENT`] bytes, each cut just before a
/// space that follows a non-space: every pre-tokenizer pattern of these
/// encodings ends a piece there (a piece holds a space only at its start,
/// or among other white space), so such cuts change no count. A stretch
/// with no such place (a long word, CJK text, white space) is cut at the
/// last character boundary that fits, which may split one token in two.
fn segments(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        // `cut_point` is a character boundary; were it not, no cut.
        let (segment, tail) = rest.split_at_checked(cut_point(rest)).unwrap_or((rest, ""));
        rest = tail;
        Some(segment)
    })
}

/// Where the first segment of non-empty `text` ends.
fn cut_point(text: &str) -> usize {
    if text.len() <= SEGMENT {
        return text.len();
    }
    // A char is at most 4 bytes, so a boundary is at most 3 bytes back.
    let limit = (SEGMENT - 3..=SEGMENT)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(SEGMENT);
    let Some(window) = text.get(..limit) else {
        return text.len();
    };
    window
        .char_indices()
        .rev()
        .find(|&(i, c)| {
            c == ' '
                && window[..i]
                    .chars()
                    .next_back()
                    .is_some_and(|before| !before.is_whitespace())
        })
        .map_or(limit, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_counts_in_each_encoding() {
        // tiktoken-rs's and tiktoken's own examples.
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            assert_eq!(encoding.count("hello world"), 2, "{encoding:?}");
            assert_eq!(encoding.count(""), 0, "{encoding:?}");
        }
        assert_eq!(
            Encoding::Cl100kBase.count("This is a test         with a lot of spaces"),
            10
        );
    }

    #[test]
    fn models_map_to_their_encodings() {
        for (model, encoding) in [
            (Some("gpt-4o"), Encoding::O200kBase),
            (Some("gpt-4o-2024-05-13"), Encoding::O200kBase),
            (Some("gpt-4.1-mini"), Encoding::O200kBase),
            (Some("o3"), Encoding::O200kBase),
            (Some("gpt-oss-20b"), Encoding::O200kBase),
            (Some("gpt-4"), Encoding::Cl100kBase),
            (Some("gpt-4-0613"), Encoding::Cl100kBase),
            (Some("gpt-3.5-turbo"), Encoding::Cl100kBase),
            (Some("ft:gpt-3.5-turbo:acme::abc"), Encoding::Cl100kBase),
            (Some("text-embedding-3-small"), Encoding::Cl100kBase),
            (Some("text-davinci-003"), FALLBACK),
            (Some("davinci"), FALLBACK),
            (Some("gpt2"), FALLBACK),
            (Some("claude-sonnet-4-20250514"), FALLBACK),
            (Some("meta-llama/Llama-3.1-8B-Instruct"), FALLBACK),
            (Some(""), FALLBACK),
            (None, FALLBACK),
        ] {
            assert_eq!(Encoding::of_model(model), encoding, "{model:?}");
        }
    }

    #[test]
    fn special_tokens_in_text_are_counted_as_text() {
        // As a special token, `<|endoftext|>` is 1; as text, 7 pieces.
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            assert_eq!(encoding.count("<|endoftext|>"), 7, "{encoding:?}");
        }
        assert_eq!(
            Encoding::O200kBase.count("<|endoftext|> and <|endofprompt|>"),
            15
        );
    }

    #[test]
    fn the_encodings_count_differently() {
        let text = "Say hello to tollgate, the rate-limiting proxy.";
        assert_eq!(Encoding::O200kBase.count(text), 13);
        assert_eq!(Encoding::Cl100kBase.count(text), 12);
    }

    #[test]
    fn cuts_before_a_word_change_no_count() {
        let prose = "The quick brown fox jumps over the lazy dog, twice.\n\n  Then:   it rests. "
            .repeat(60);
        assert!(prose.len() > 3 * SEGMENT);
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let whole = encoding.tables().encode_ordinary(&prose).len();
            assert_eq!(
                encoding.count(&prose),
                u64::try_from(whole).unwrap_or_default(),
                "{encoding:?}"
            );
        }
    }

    #[test]
    fn segments_cover_the_text_within_the_bound() {
        for text in [
            "a".repeat(5000),
            " ".repeat(3000),
            "中".repeat(1000),
            "é ".repeat(1500),
            format!("{} x", "y".repeat(2000)),
        ] {
            let pieces: Vec<&str> = segments(&text).collect();
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().all(|p| !p.is_empty() && p.len() <= SEGMENT));
        }
        assert_eq!(segments("").count(), 0);
    }

    #[test]
    fn a_long_word_is_counted_close_to_exactly() {
        let word = "a".repeat(4 * SEGMENT);
        let whole = Encoding::O200kBase.tables().encode_ordinary(&word).len();
        let cut = Encoding::O200kBase.count(&word);
        let whole = u64::try_from(whole).unwrap_or_default();
        assert!(cut >= whole && cut <= whole + 4, "{cut} vs {whole}");
    }

    /// The input that panics `encode_ordinary` (tiktoken-rs 0.12.1): a run
    /// of [`ENCODER_PANIC_RUN`] white-space characters before a letter.
    fn encoder_panic_input(space: &str) -> String {
        format!("{}x", space.repeat(ENCODER_PANIC_RUN))
    }

    #[test]
    fn a_million_spaces_before_a_letter_do_not_panic_the_count() {
        // Regression: tiktoken-rs unwraps fancy-regex's stack overflow.
        for space in [" ", "\t", "\u{3000}"] {
            let text = encoder_panic_input(space);
            for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
                let tokens = encoding.count(&text);
                let segments = len_u64(text.len().div_ceil(SEGMENT));
                assert!(
                    tokens >= segments && tokens <= len_u64(text.len()),
                    "{encoding:?} {space:?}: {tokens} tokens in {segments} segments"
                );
            }
        }
    }

    #[test]
    fn a_segment_that_panics_the_encoder_is_counted_as_bytes_over_4() {
        // The guard's second line, driven by the real panic. Should this fail
        // after an upgrade of tiktoken-rs, the encoder no longer panics on
        // this input: find another for this test, or drop the guard's note.
        let text = encoder_panic_input(" ");
        let tables = Encoding::Cl100kBase.tables();
        let estimate = len_u64(text.len()).div_ceil(4);
        assert_eq!(count_segment(tables, &text), estimate);
        // One below the run: no panic, the encoder's own count.
        let shorter = &text[1..];
        assert!(count_segment(tables, shorter) < len_u64(shorter.len()).div_ceil(4));
    }

    proptest! {
        // Few cases: encoding is slow unoptimised.
        #![proptest_config(ProptestConfig::with_cases(16))]

        #[test]
        fn text_with_a_space_after_each_word_counts_exactly(
            words in prop::collection::vec(("[a-zA-Z0-9.,!'\n\u{e9}\u{4e2d}-]{1,24}", "[ \t\n]{0,3}"), 100..400),
        ) {
            let text: String = words.iter().map(|(word, space)| format!("{word} {space}")).collect();
            for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
                let whole = u64::try_from(encoding.tables().encode_ordinary(&text).len()).unwrap_or_default();
                prop_assert_eq!(encoding.count(&text), whole, "{:?}", encoding);
            }
        }
    }
}
