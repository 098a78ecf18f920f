//! Fuzz target for the token-quota vocabulary: the usage scanner
//! (`llm::usage::UsageScanner`) and a request's reservation and rewrite
//! (`llm::reserve::reservation`, `llm::reserve::with_include_usage`).
//!
//! The first byte picks the piece sizes (and its bit 6 the prompt
//! estimate: `bytes/4` or the tokenizer); the rest is a response body, read
//! as JSON and as an event stream. Beyond "never panics", for each format:
//! the body fed in pieces reads the same usage (so far and at the end) as
//! fed whole; and a JSON body that `serde_json` reads as one object reads
//! the usage an independent reading of its `usage` member gives (so a
//! scanner that finds nothing fails as soon as an input has a usage). The
//! same bytes as a request body: `reservation` never panics,
//! and when `with_include_usage` rewrites them, the rewrite is JSON whose
//! `stream` is true and `stream_options.include_usage` true, it is not
//! rewritten again, and it reserves what the original did.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tollgate::llm::reserve::{PromptEstimate, ReserveRule, reservation, with_include_usage};
use tollgate::llm::usage::{Format, Usage, UsageScanner};

/// The usage known after the last piece and at the end, `body` fed in
/// pieces whose sizes cycle through `steps`.
fn scan(format: Format, body: &[u8], steps: &[usize]) -> (Option<Usage>, Option<Usage>) {
    let mut scanner = UsageScanner::new(format);
    let mut fed = 0;
    let mut step = steps.iter().cycle();
    while fed < body.len() {
        let next = (fed + step.next().copied().unwrap_or(1).max(1)).min(body.len());
        scanner.feed(&body[fed..next]);
        fed = next;
    }
    (scanner.usage(), scanner.finish())
}

/// The usage of a JSON body by the contract's rule (section 9), read with
/// `serde_json` alone, as `Some(Usage { .. })` would print: `None` (the
/// outer one) when the body is not one JSON object whose `usage` the
/// scanner holds (its raw text at most `USAGE_MAX`, 4 KiB: the body is
/// shorter than that); `Some(None)` when it has no usable `usage`.
fn reference(body: &[u8]) -> Option<Option<String>> {
    if body.len() > 4096 {
        return None;
    }
    let Ok(Value::Object(object)) = serde_json::from_slice::<Value>(body) else {
        return None;
    };
    let Some(usage) = object.get("usage").filter(|usage| !usage.is_null()) else {
        return Some(None);
    };
    let Value::Object(usage) = usage else {
        return Some(None);
    };
    // A count: absent (or null), or a non-negative integer within a u64;
    // anything else makes the whole usage absent.
    let count = |name: &str| -> Result<Option<u64>, ()> {
        match usage.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => value.as_u64().map(Some).ok_or(()),
        }
    };
    let counts = (|| -> Result<_, ()> {
        let input = match count("prompt_tokens")? {
            Some(input) => Some(input),
            None => count("input_tokens")?,
        };
        let output = match count("completion_tokens")? {
            Some(output) => Some(output),
            None => count("output_tokens")?,
        };
        let total = count("total_tokens")?;
        let cache_creation = count("cache_creation_input_tokens")?.unwrap_or(0);
        let cache_read = count("cache_read_input_tokens")?;
        // OpenAI's cached prompt tokens: chat's details, else Responses'.
        let detail = |details: &str| -> Result<Option<u64>, ()> {
            match usage.get(details).and_then(|d| d.get("cached_tokens")) {
                None | Some(Value::Null) => Ok(None),
                Some(value) => value.as_u64().map(Some).ok_or(()),
            }
        };
        let details = match detail("prompt_tokens_details")? {
            Some(cached) => Some(cached),
            None => detail("input_tokens_details")?,
        };
        let cache = cache_creation.saturating_add(cache_read.unwrap_or(0));
        Ok((input, output, total, cache, cache_read.or(details).unwrap_or(0)))
    })();
    let Ok((input, output, total, cache, cached)) = counts else {
        return Some(None);
    };
    let input = input.map(|input| input.saturating_add(cache));
    let total = match (total, input, output) {
        (Some(total), _, _) => total,
        (None, Some(input), Some(output)) => input.saturating_add(output),
        _ => return Some(None),
    };
    let input = input.unwrap_or(0);
    Some(Some(format!(
        "Usage {{ input: {input}, cached: {}, output: {}, total: {total} }}",
        cached.min(input),
        output.unwrap_or(0)
    )))
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, body)) = data.split_first() else {
        return;
    };
    let steps = [
        usize::from(control & 0x7) + 1,
        usize::from(control >> 3) + 1,
        1,
        usize::from(control) * 3 + 1,
    ];
    for format in [Format::Json, Format::EventStream] {
        let whole = scan(format, body, &[body.len().max(1)]);
        let split = scan(format, body, &steps);
        assert_eq!(whole, split, "{format:?} usage differs by split");
    }
    if let Some(expected) = reference(body) {
        let found = scan(Format::Json, body, &[body.len().max(1)]).1;
        assert_eq!(
            found.map(|usage| format!("{usage:?}")),
            expected,
            "the JSON body's usage, read by serde_json"
        );
    }

    // Half the inputs count their prompt with the tokenizer.
    let prompt = if control & 0x40 == 0 {
        PromptEstimate::BytesOver4
    } else {
        PromptEstimate::Tokenizer
    };
    let rule = ReserveRule {
        max_tokens_default: u64::from(control),
        prompt,
    };
    let reserved = reservation(body, &rule);
    if let Some(rewritten) = with_include_usage(body) {
        let value: Value = serde_json::from_slice(&rewritten).expect("the rewrite is JSON");
        assert_eq!(
            value.get("stream"),
            Some(&Value::Bool(true)),
            "rewrite of an unstreamed body"
        );
        assert_eq!(
            value.pointer("/stream_options/include_usage"),
            Some(&Value::Bool(true)),
            "the rewrite does not ask for usage"
        );
        assert!(with_include_usage(&rewritten).is_none(), "rewritten twice");
        assert_eq!(
            reservation(&rewritten, &rule),
            reserved,
            "the rewrite reserves differently"
        );
    }
});
