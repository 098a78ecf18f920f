//! What an LLM API request reserves of a token quota at admission
//! (contract section 9): its completion budget plus an estimate of its
//! prompt, read from the JSON body of an OpenAI-compatible (chat,
//! completions, Responses, embeddings) or Anthropic Messages request; and
//! the rewrite that makes an OpenAI stream report its usage.
//!
//! Pure functions of the body's bytes: whatever they are, a reservation
//! comes out (never a panic), the sums saturating. The prompt is measured
//! in bytes (`"bytes/4"`) or in its model's tokens (`"tokenizer"`,
//! [`super::tokenizer`]) over the same text.

use std::io;

use serde_json::{Map, Value};

use super::json::members_named;
use super::tokenizer::{self, Encoding};

/// How the prompt's tokens are estimated. `pub` for the fuzz target
/// (`fuzz/fuzz_targets/llm_usage.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptEstimate {
    /// `"bytes/4"`: a token per 4 bytes of prompt text, rounded up.
    BytesOver4,
    /// `"tokenizer"`: the prompt text's tokens in the encoding of the
    /// body's `model` (as tiktoken maps it; `o200k_base` for a model it
    /// does not know), plus OpenAI's chat formatting of `messages`.
    Tokenizer,
}

/// A route's reservation rule (its `tokens` table). `pub` for the fuzz
/// target (`fuzz/fuzz_targets/llm_usage.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReserveRule {
    /// The completion budget of a request that names none.
    pub max_tokens_default: u64,
    pub prompt: PromptEstimate,
}

/// What one request reserves, and what of its body the proxy needs next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The completion budget: `max_completion_tokens`, else `max_tokens`,
    /// else `max_output_tokens` (the Responses API's), else the rule's
    /// default.
    pub(crate) completion: u64,
    /// The prompt's estimated tokens.
    pub(crate) prompt: u64,
    /// The body asks for a stream (`"stream": true`).
    pub(crate) streamed: bool,
    /// The body's `model`, when it is a string.
    pub(crate) model: Option<String>,
}

impl Reservation {
    /// The tokens to reserve: completion plus prompt, saturating. `pub` for
    /// the fuzz target (`fuzz/fuzz_targets/llm_usage.rs`).
    pub fn total(&self) -> u64 {
        self.completion.saturating_add(self.prompt)
    }
}

/// What a request body reserves: the completion budget
/// (`max_completion_tokens`, else `max_tokens`, else `max_output_tokens`,
/// else the rule's default; a
/// value that is not a non-negative integer counts as absent) plus the
/// prompt estimate of its text ([`prompt_size`]). A body that is not a
/// JSON object reserves the default plus the estimate of the whole body.
/// `pub` for the fuzz target (`fuzz/fuzz_targets/llm_usage.rs`).
pub fn reservation(body: &[u8], rule: &ReserveRule) -> Reservation {
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(body) else {
        return Reservation {
            completion: rule.max_tokens_default,
            prompt: whole_body_estimate(rule.prompt, body),
            streamed: false,
            model: None,
        };
    };
    let completion = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|name| request.get(*name).and_then(Value::as_u64))
        .unwrap_or(rule.max_tokens_default);
    let model = request.get("model").and_then(Value::as_str);
    Reservation {
        completion,
        prompt: prompt_estimate(rule.prompt, &request, model),
        streamed: is_streamed(&request),
        model: model.map(str::to_owned),
    }
}

/// The estimate of a body that is not a JSON object: all of it, as text
/// (invalid UTF-8 replaced) for the tokenizer.
fn whole_body_estimate(rule: PromptEstimate, body: &[u8]) -> u64 {
    match rule {
        PromptEstimate::BytesOver4 => len_u64(body.len()).div_ceil(4),
        PromptEstimate::Tokenizer => tokenizer::FALLBACK.count(&String::from_utf8_lossy(body)),
    }
}

fn prompt_estimate(rule: PromptEstimate, request: &Map<String, Value>, model: Option<&str>) -> u64 {
    match rule {
        PromptEstimate::BytesOver4 => prompt_size(request, &|piece| piece.bytes()).div_ceil(4),
        PromptEstimate::Tokenizer => {
            let encoding = Encoding::of_model(model);
            prompt_size(request, &|piece| piece.tokens(encoding))
                .saturating_add(chat_format_tokens(request, encoding))
        }
    }
}

/// What OpenAI adds around a chat's messages, as its cookbook counts a
/// prompt (`num_tokens_from_messages`, gpt-3.5-turbo-0613 onward, gpt-4,
/// gpt-4o): per message 3 tokens plus its `role`'s, 1 more for a `name`,
/// and 3 priming the reply. Nothing for a body without `messages`; an
/// Anthropic body's `messages` are counted the same, an estimate there.
fn chat_format_tokens(request: &Map<String, Value>, encoding: Encoding) -> u64 {
    const TOKENS_PER_MESSAGE: u64 = 3;
    const TOKENS_PER_NAME: u64 = 1;
    const REPLY_PRIMING: u64 = 3;
    let Some(Value::Array(messages)) = request.get("messages") else {
        return 0;
    };
    messages
        .iter()
        .map(|message| {
            let role = message
                .get("role")
                .and_then(Value::as_str)
                .map_or(0, |role| encoding.count(role));
            let name = match message.get("name") {
                Some(Value::String(_)) => TOKENS_PER_NAME,
                _ => 0,
            };
            TOKENS_PER_MESSAGE.saturating_add(role).saturating_add(name)
        })
        .fold(REPLY_PRIMING, u64::saturating_add)
}

fn is_streamed(request: &Map<String, Value>) -> bool {
    request.get("stream") == Some(&Value::Bool(true))
}

/// One piece of the prompt's text: a string the model reads, or a value
/// it reads as JSON (`tools`).
enum Piece<'a> {
    Text(&'a str),
    Json(&'a Value),
}

impl Piece<'_> {
    /// Its bytes as UTF-8 (a value's compact JSON).
    fn bytes(&self) -> u64 {
        match self {
            Piece::Text(text) => len_u64(text.len()),
            Piece::Json(value) => serialized_bytes(value),
        }
    }

    /// Its tokens in `encoding` (a value's compact JSON).
    fn tokens(&self, encoding: Encoding) -> u64 {
        match self {
            Piece::Text(text) => encoding.count(text),
            // Serializing a `Value` cannot fail.
            Piece::Json(value) => encoding.count(&serde_json::to_string(value).unwrap_or_default()),
        }
    }
}

/// How a [`Piece`] is measured (bytes or tokens).
type Measure<'m> = &'m dyn Fn(Piece<'_>) -> u64;

/// The size, as `measure` counts it, of the text the model reads:
/// - OpenAI chat `messages[]`: `content` (a string, or parts whose `text`
///   counts) and `name`; Anthropic `messages[].content` the same (blocks
///   with `text`, and a `tool_result` block's own `content`);
/// - `tools` and `functions`: their JSON, serialized compactly;
/// - the legacy completions `prompt` (a string or strings);
/// - the Responses API `input` (a string, or items that are strings or
///   have a `content` as above; embeddings' `input` is strings too) and
///   `instructions`;
/// - Anthropic `system` (a string or `text` blocks).
fn prompt_size(request: &Map<String, Value>, measure: Measure) -> u64 {
    let mut size = 0u64;
    let mut add = |n: u64| size = size.saturating_add(n);
    if let Some(Value::Array(messages)) = request.get("messages") {
        for message in messages {
            add(content_size(message.get("content"), measure));
            add(string_size(message.get("name"), measure));
        }
    }
    for tools in ["tools", "functions"] {
        if let Some(value) = request.get(tools) {
            add(measure(Piece::Json(value)));
        }
    }
    add(strings_size(request.get("prompt"), measure));
    add(match request.get("input") {
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| input_item_size(item, measure))
            .fold(0, u64::saturating_add),
        other => string_size(other, measure),
    });
    add(string_size(request.get("instructions"), measure));
    add(content_size(request.get("system"), measure));
    size
}

/// A Responses API (or embeddings) `input` item: a string, or a message
/// with a `content`.
fn input_item_size(item: &Value, measure: Measure) -> u64 {
    match item {
        Value::String(text) => measure(Piece::Text(text)),
        _ => content_size(item.get("content"), measure),
    }
}

/// A `content` (or Anthropic `system`): a string, or blocks whose `text`
/// counts, a `tool_result` block's nested `content` too.
fn content_size(content: Option<&Value>, measure: Measure) -> u64 {
    match content {
        Some(Value::String(text)) => measure(Piece::Text(text)),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .map(|block| block_size(block, measure))
            .fold(0, u64::saturating_add),
        _ => 0,
    }
}

fn block_size(block: &Value, measure: Measure) -> u64 {
    let text = string_size(block.get("text"), measure);
    // A tool result's content is blocks (or a string) itself; one level
    // deep, as the API nests it.
    let nested = match block.get("content") {
        Some(Value::String(text)) => measure(Piece::Text(text)),
        Some(Value::Array(inner)) => inner
            .iter()
            .map(|inner| string_size(inner.get("text"), measure))
            .fold(0, u64::saturating_add),
        _ => 0,
    };
    text.saturating_add(nested)
}

fn string_size(value: Option<&Value>, measure: Measure) -> u64 {
    match value {
        Some(Value::String(text)) => measure(Piece::Text(text)),
        _ => 0,
    }
}

/// A string, or the strings of an array (the legacy `prompt`; token-id
/// arrays count nothing).
fn strings_size(value: Option<&Value>, measure: Measure) -> u64 {
    match value {
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| string_size(Some(item), measure))
            .fold(0, u64::saturating_add),
        other => string_size(other, measure),
    }
}

/// The length of `value`'s compact JSON, counted without building it.
fn serialized_bytes(value: &Value) -> u64 {
    let mut counter = ByteCounter(0);
    // Writing a `Value` to a writer that never fails cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

struct ByteCounter(u64);

impl io::Write for ByteCounter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 = self.0.saturating_add(len_u64(buf.len()));
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn len_u64(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

/// For a streamed OpenAI chat or completions request (`"stream": true`)
/// whose `stream_options.include_usage` is not `true`: the body with it
/// set, so that the stream's last chunk reports the usage. `None` for any
/// other body (not a JSON object, not streamed, already asking).
///
/// The body is edited in place, not re-serialized: every other byte stays
/// as the client wrote it (member order, spacing, numbers `serde_json`
/// would round), since `serde_json` here is built without
/// `preserve_order` and would sort the members. A missing `stream_options`
/// is appended after the last member; one that is an object gets
/// `"include_usage":true` appended (or its `include_usage` values replaced
/// by `true`), its other members kept; one that is not an object is
/// replaced. Duplicate members are all rewritten.
///
/// Only for OpenAI's chat and completions APIs: Anthropic's Messages API
/// and the Responses API refuse an unknown `stream_options` (and report
/// usage in their streams anyway), so the caller decides by route. `pub`
/// for the fuzz target (`fuzz/fuzz_targets/llm_usage.rs`).
pub fn with_include_usage(body: &[u8]) -> Option<Vec<u8>> {
    let Value::Object(request) = serde_json::from_slice::<Value>(body).ok()? else {
        return None;
    };
    let asks = request
        .get("stream_options")
        .and_then(|options| options.get("include_usage"))
        == Some(&Value::Bool(true));
    if !is_streamed(&request) || asks {
        return None;
    }
    set_member(body, "stream_options", &|options| match options {
        Some(object) if object.first() == Some(&b'{') => {
            set_member(object, "include_usage", &|_| b"true".to_vec())
                .unwrap_or_else(|| INCLUDE_USAGE.to_vec())
        }
        _ => INCLUDE_USAGE.to_vec(),
    })
}

const INCLUDE_USAGE: &[u8] = br#"{"include_usage":true}"#;

/// `object` (a JSON object's bytes) with its members named `key` given the
/// value `value` makes of their old one, or with such a member appended
/// when it has none. `key` is written as is: a plain name.
fn set_member(
    object: &[u8],
    key: &str,
    value: &dyn Fn(Option<&[u8]>) -> Vec<u8>,
) -> Option<Vec<u8>> {
    let members = members_named(object, key)?;
    let mut out = Vec::with_capacity(object.len() + key.len() + 32);
    if members.named.is_empty() {
        let (head, tail) = object.split_at_checked(members.insert_at)?;
        out.extend_from_slice(head);
        if !members.empty {
            out.push(b',');
        }
        out.push(b'"');
        out.extend_from_slice(key.as_bytes());
        out.extend_from_slice(b"\":");
        out.extend_from_slice(&value(None));
        out.extend_from_slice(tail);
        return Some(out);
    }
    let mut copied = 0;
    for range in members.named {
        out.extend_from_slice(object.get(copied..range.start)?);
        out.extend_from_slice(&value(Some(object.get(range.clone())?)));
        copied = range.end;
    }
    out.extend_from_slice(object.get(copied..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RULE: ReserveRule = ReserveRule {
        max_tokens_default: 1024,
        prompt: PromptEstimate::BytesOver4,
    };

    fn reserve(body: &str) -> Reservation {
        reservation(body.as_bytes(), &RULE)
    }

    #[test]
    fn openai_chat_counts_contents_names_and_tools() {
        let body = r#"{
  "model": "gpt-4o",
  "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "name": "ann", "content": [
      {"type": "text", "text": "What is in this image?"},
      {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    ]},
    {"role": "assistant", "content": null}
  ],
  "tools": [{"type":"function","function":{"name":"f","parameters":{}}}],
  "max_completion_tokens": 100,
  "max_tokens": 7,
  "stream": true
}"#;
        let tools = r#"[{"function":{"name":"f","parameters":{}},"type":"function"}]"#;
        let text =
            "You are terse.".len() + "ann".len() + "What is in this image?".len() + tools.len();
        let reserved = reserve(body);
        assert_eq!(
            reserved,
            Reservation {
                completion: 100,
                prompt: u64::try_from(text.div_ceil(4)).unwrap_or_default(),
                streamed: true,
                model: Some("gpt-4o".to_owned()),
            }
        );
        assert_eq!(reserved.total(), 100 + reserved.prompt);
    }

    #[test]
    fn the_completion_budget_falls_back_to_max_tokens_then_the_default() {
        assert_eq!(reserve(r#"{"max_tokens":7}"#).completion, 7);
        assert_eq!(
            reserve(r#"{"max_completion_tokens":0,"max_tokens":7}"#).completion,
            0
        );
        assert_eq!(reserve(r#"{}"#).completion, 1024);
        // The Responses API's name, after the other two.
        assert_eq!(reserve(r#"{"max_output_tokens":9}"#).completion, 9);
        assert_eq!(
            reserve(r#"{"max_output_tokens":9,"max_tokens":7}"#).completion,
            7
        );
        for invalid in [
            "-1",
            "1.5",
            "100.0",
            "\"100\"",
            "null",
            "1e3",
            "18446744073709551616",
            "[]",
        ] {
            let body = format!(r#"{{"max_completion_tokens":{invalid},"max_tokens":7}}"#);
            assert_eq!(reserve(&body).completion, 7, "{body}");
            let body = format!(r#"{{"max_tokens":{invalid}}}"#);
            assert_eq!(reserve(&body).completion, 1024, "{body}");
        }
    }

    #[test]
    fn the_prompt_is_a_token_per_four_bytes_rounded_up() {
        for (text, tokens) in [("", 0), ("a", 1), ("abcd", 1), ("abcde", 2), ("héllo", 2)] {
            let body = serde_json::json!({"messages": [{"role": "user", "content": text}]});
            assert_eq!(reserve(&body.to_string()).prompt, tokens, "{text:?}");
        }
    }

    #[test]
    fn anthropic_counts_system_blocks_and_tool_results() {
        let body = r#"{
  "model": "claude-sonnet-4-20250514",
  "max_tokens": 1000,
  "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
  "messages": [
    {"role": "user", "content": "Hello, Claude"},
    {"role": "assistant", "content": [{"type": "text", "text": "Hi."}, {"type": "tool_use", "id": "t1", "name": "get", "input": {"q": 1}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "42"}]},
                                 {"type": "tool_result", "tool_use_id": "t2", "content": "43"}]}
  ]
}"#;
        let text =
            "Be brief.".len() + "Hello, Claude".len() + "Hi.".len() + "42".len() + "43".len();
        let reserved = reserve(body);
        assert_eq!(reserved.completion, 1000);
        assert_eq!(
            reserved.prompt,
            u64::try_from(text.div_ceil(4)).unwrap_or_default()
        );
        assert!(!reserved.streamed);
        let string_system = reserve(r#"{"system":"12345678","messages":[]}"#);
        assert_eq!(string_system.prompt, 2);
    }

    #[test]
    fn legacy_prompt_responses_input_and_embeddings() {
        assert_eq!(reserve(r#"{"prompt":"12345678"}"#).prompt, 2);
        assert_eq!(reserve(r#"{"prompt":["1234","5678",[1,2,3]]}"#).prompt, 2);
        assert_eq!(
            reserve(r#"{"input":"12345678","instructions":"1234"}"#).prompt,
            3
        );
        let responses = r#"{"model":"gpt-4.1","instructions":"Talk like a pirate.","input":[
            {"role":"user","content":"Are semicolons optional?"},
            {"role":"user","content":[{"type":"input_text","text":"And commas?"},{"type":"input_image","image_url":"https://x"}]},
            {"type":"function_call_output","call_id":"c","output":"{}"}
        ]}"#;
        let text =
            "Talk like a pirate.".len() + "Are semicolons optional?".len() + "And commas?".len();
        assert_eq!(
            reserve(responses).prompt,
            u64::try_from(text.div_ceil(4)).unwrap_or_default()
        );
        assert_eq!(reserve(r#"{"input":["1234","5678","9"]}"#).prompt, 3);
        assert_eq!(
            reserve(r#"{"functions":[{"name":"f"}]}"#).prompt,
            u64::try_from(r#"[{"name":"f"}]"#.len().div_ceil(4)).unwrap_or_default()
        );
    }

    #[test]
    fn a_body_that_is_not_an_object_reserves_the_default_and_its_bytes() {
        for body in [
            &b""[..],
            b"[1,2,3]",
            b"not json at all",
            b"\xff\xfe\x00",
            b"\"a string\"",
            b"{\"a\":1",
        ] {
            let reserved = reservation(body, &RULE);
            assert_eq!(
                reserved,
                Reservation {
                    completion: 1024,
                    prompt: u64::try_from(body.len().div_ceil(4)).unwrap_or_default(),
                    streamed: false,
                    model: None,
                },
                "{body:?}"
            );
        }
    }

    #[test]
    fn streamed_and_model_read_exactly() {
        assert!(!reserve(r#"{"stream":"true"}"#).streamed);
        assert!(!reserve(r#"{"stream":1}"#).streamed);
        assert!(!reserve(r#"{"stream":false}"#).streamed);
        assert_eq!(reserve(r#"{"model":5}"#).model, None);
    }

    #[test]
    fn the_total_saturates() {
        let reserved = reserve(r#"{"max_tokens":18446744073709551615,"prompt":"abc"}"#);
        assert_eq!(reserved.completion, u64::MAX);
        assert_eq!(reserved.total(), u64::MAX);
    }

    const TOKENIZER: ReserveRule = ReserveRule {
        max_tokens_default: 1024,
        prompt: PromptEstimate::Tokenizer,
    };

    /// A chat body for `model` with one user message, `text`.
    fn chat(model: Option<&str>, text: &str) -> Vec<u8> {
        let mut body = serde_json::json!({
            "max_tokens": 50,
            "messages": [{"role": "user", "content": text}],
        });
        if let (Some(model), Some(object)) = (model, body.as_object_mut()) {
            object.insert("model".to_owned(), Value::from(model));
        }
        body.to_string().into_bytes()
    }

    // 13 tokens in o200k_base, 12 in cl100k_base.
    const SENTENCE: &str = "Say hello to tollgate, the rate-limiting proxy.";

    #[test]
    fn the_tokenizer_counts_in_the_models_encoding_with_chat_formatting() {
        // 3 for the message, 1 for its role `user`, its text, 3 for the reply.
        for (model, text_tokens) in [
            (Some("gpt-4o"), 13),
            (Some("gpt-4o-mini-2024-07-18"), 13),
            (Some("gpt-4"), 12),
            (Some("gpt-3.5-turbo"), 12),
            (Some("my-local-llama"), 13),
            (None, 13),
        ] {
            let reserved = reservation(&chat(model, SENTENCE), &TOKENIZER);
            assert_eq!(reserved.prompt, 3 + 1 + text_tokens + 3, "{model:?}");
            assert_eq!(reserved.total(), 50 + reserved.prompt, "{model:?}");
        }
    }

    #[test]
    fn the_tokenizer_counts_names_and_every_message() {
        let body = serde_json::json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "hello world"},
                {"role": "user", "name": "ann", "content": [{"type": "text", "text": "hello world"}]},
                {"role": "assistant", "content": null},
                "not a message",
            ],
        });
        let o200k = Encoding::O200kBase;
        let expected = (3 + 1 + 2) // system: role, "hello world"
            + (3 + 1 + 2 + o200k.count("ann") + 1) // user, its name and the name's 1
            + (3 + 1) // assistant, no content
            + 3 // a message that is not an object: its 3 alone
            + 3; // the reply
        assert_eq!(
            reservation(body.to_string().as_bytes(), &TOKENIZER).prompt,
            expected
        );
    }

    #[test]
    fn the_tokenizer_counts_the_same_text_as_bytes_over_4() {
        // No `messages`: no chat formatting, just the text's tokens.
        let tokens = |body: &str| reservation(body.as_bytes(), &TOKENIZER).prompt;
        assert_eq!(tokens(r#"{"model":"gpt-4","prompt":"hello world"}"#), 2);
        assert_eq!(
            tokens(r#"{"model":"gpt-4","prompt":["hello world","hello world",[1,2]]}"#),
            4
        );
        assert_eq!(
            tokens(r#"{"input":"hello world","instructions":"hello world"}"#),
            4
        );
        assert_eq!(
            tokens(r#"{"system":[{"type":"text","text":"hello world"}]}"#),
            2
        );
        let tools = r#"[{"function":{"name":"f","parameters":{}},"type":"function"}]"#;
        assert_eq!(
            tokens(r#"{"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]}"#),
            Encoding::O200kBase.count(tools)
        );
    }

    #[test]
    fn special_tokens_in_user_text_are_counted_as_text() {
        // `<|endoftext|>` as text: 7 tokens, not the special token's 1.
        let reserved = reservation(&chat(Some("gpt-4o"), "<|endoftext|>"), &TOKENIZER);
        assert_eq!(reserved.prompt, 3 + 1 + 7 + 3);
        let reserved = reservation(&chat(Some("gpt-4"), "<|endoftext|>"), &TOKENIZER);
        assert_eq!(reserved.prompt, 3 + 1 + 7 + 3);
    }

    #[test]
    fn a_body_that_is_not_an_object_is_tokenized_whole() {
        for (body, tokens) in [(&b""[..], 0), (b"hello world", 2), (b"[1,2,3]", 7)] {
            let reserved = reservation(body, &TOKENIZER);
            assert_eq!(reserved.completion, 1024, "{body:?}");
            assert_eq!(reserved.prompt, tokens, "{body:?}");
        }
        // Invalid UTF-8 is replaced, not refused.
        assert!(reservation(b"\xff\xfe hello", &TOKENIZER).prompt >= 2);
    }

    fn rewritten(body: &str) -> Option<String> {
        with_include_usage(body.as_bytes()).map(|out| String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn include_usage_is_appended_keeping_the_body_as_written() {
        assert_eq!(
            rewritten(
                r#"{"model":"gpt-4o","stream":true,"messages":[],"seed":12345678901234567890123}"#
            )
            .as_deref(),
            Some(
                r#"{"model":"gpt-4o","stream":true,"messages":[],"seed":12345678901234567890123,"stream_options":{"include_usage":true}}"#
            )
        );
        assert_eq!(
            rewritten("{\n  \"stream\": true,\n  \"model\": \"m\"\n}\n").as_deref(),
            Some(
                "{\n  \"stream\": true,\n  \"model\": \"m\",\"stream_options\":{\"include_usage\":true}\n}\n"
            )
        );
    }

    #[test]
    fn existing_stream_options_keep_their_other_members() {
        for (options, expected) in [
            (r#"{"include_usage":false}"#, r#"{"include_usage":true}"#),
            (
                r#"{"continuous_usage_stats":true}"#,
                r#"{"continuous_usage_stats":true,"include_usage":true}"#,
            ),
            (
                r#"{ "include_usage" : null , "x" : 1 }"#,
                r#"{ "include_usage" : true , "x" : 1 }"#,
            ),
            (r#"{}"#, r#"{"include_usage":true}"#),
            (r#"{ }"#, r#"{"include_usage":true }"#),
            (r#"null"#, r#"{"include_usage":true}"#),
            (r#""yes""#, r#"{"include_usage":true}"#),
        ] {
            let body = format!(r#"{{"stream":true,"stream_options":{options},"n":1}}"#);
            assert_eq!(
                rewritten(&body),
                Some(format!(
                    r#"{{"stream":true,"stream_options":{expected},"n":1}}"#
                )),
                "{body}"
            );
        }
        // Duplicates are all rewritten (JSON readers differ on which wins).
        assert_eq!(
            rewritten(
                r#"{"stream_options":{"include_usage":true},"stream":true,"stream_options":{}}"#
            )
            .as_deref(),
            Some(
                r#"{"stream_options":{"include_usage":true},"stream":true,"stream_options":{"include_usage":true}}"#
            )
        );
    }

    #[test]
    fn no_rewrite_unless_streamed_and_not_asking_already() {
        for body in [
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#,
            r#"{"stream":false}"#,
            r#"{"stream":"true"}"#,
            r#"{"model":"m"}"#,
            r#"[{"stream":true}]"#,
            r#"{"stream":true"#,
            r#"{"stream":true}}"#,
            "",
        ] {
            assert_eq!(rewritten(body), None, "{body}");
        }
    }

    /// JSON values with objects that may carry `stream` and `stream_options`.
    fn request() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            "[a-z\\\\\"\u{e9}]{0,6}".prop_map(Value::String),
        ];
        let value = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-z_]{1,14}", inner, 0..4)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        });
        (
            prop::collection::btree_map("[a-z_]{1,8}", value.clone(), 0..4),
            prop::option::of(value),
            prop::option::of(any::<bool>()),
        )
            .prop_map(|(mut members, options, include)| {
                members.insert("stream".to_owned(), Value::Bool(true));
                match (options, include) {
                    (Some(Value::Object(mut options)), Some(include)) => {
                        options.insert("include_usage".to_owned(), Value::Bool(include));
                        members.insert("stream_options".to_owned(), Value::Object(options));
                    }
                    (Some(options), _) => {
                        members.insert("stream_options".to_owned(), options);
                    }
                    (None, _) => {}
                }
                Value::Object(members.into_iter().collect())
            })
    }

    proptest! {
        #[test]
        fn reservation_never_panics(body in prop::collection::vec(any::<u8>(), 0..256)) {
            let reserved = reservation(&body, &RULE);
            prop_assert!(reserved.total() >= reserved.completion);
            let _ = with_include_usage(&body);
        }

        #[test]
        fn a_rewrite_asks_for_usage_and_changes_nothing_else(request in request(), pretty in any::<bool>()) {
            let body = if pretty {
                serde_json::to_vec_pretty(&request)
            } else {
                serde_json::to_vec(&request)
            };
            let body = body.unwrap_or_default();
            let asks = request.pointer("/stream_options/include_usage") == Some(&Value::Bool(true));
            let out = with_include_usage(&body);
            prop_assert_eq!(out.is_none(), asks);
            if let Some(out) = out {
                let mut rewritten: Value = serde_json::from_slice(&out).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(rewritten.pointer("/stream_options/include_usage"), Some(&Value::Bool(true)));
                let mut expected = request.clone();
                let options = |value: &mut Value| value.as_object_mut().and_then(|o| o.remove("stream_options"));
                let (mut got, old) = (options(&mut rewritten), options(&mut expected));
                prop_assert_eq!(rewritten, expected);
                if let (Some(Value::Object(got)), Some(Value::Object(old))) = (got.as_mut(), old) {
                    got.remove("include_usage");
                    let mut old = old;
                    old.remove("include_usage");
                    prop_assert_eq!(got, &old);
                }
            }
        }
    }

    proptest! {
        // Few cases: encoding is slow unoptimised.
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn the_tokenizer_never_panics(body in prop::collection::vec(any::<u8>(), 0..512)) {
            let reserved = reservation(&body, &TOKENIZER);
            prop_assert!(reserved.total() >= reserved.completion);
        }

        #[test]
        fn the_tokenizer_never_panics_on_any_text(
            text in any::<String>(),
            model in prop::sample::select(vec!["gpt-4o", "gpt-4", "other"]),
        ) {
            let reserved = reservation(&chat(Some(model), &text), &TOKENIZER);
            prop_assert!(reserved.prompt >= 3 + 3);
        }
    }
}
