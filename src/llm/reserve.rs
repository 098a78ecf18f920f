//! What an LLM API request reserves of a token quota at admission
//! (contract section 9): its completion budget plus an estimate of its
//! prompt, read from the JSON body of an OpenAI-compatible (chat,
//! completions, Responses, embeddings) or Anthropic Messages request; and
//! the rewrite that makes an OpenAI stream report its usage.
//!
//! Pure functions of the body's bytes: whatever they are, a reservation
//! comes out (never a panic), the sums saturating.

use std::io;

use serde_json::{Map, Value};

use super::json::members_named;

/// How the prompt's tokens are estimated. `pub` for the fuzz target
/// (`fuzz/fuzz_targets/llm_usage.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptEstimate {
    /// `"bytes/4"`: a token per 4 bytes of prompt text, rounded up.
    BytesOver4,
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
    /// else the rule's default.
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
/// (`max_completion_tokens`, else `max_tokens`, else the rule's default; a
/// value that is not a non-negative integer counts as absent) plus the
/// prompt estimate of its text ([`prompt_bytes`]). A body that is not a
/// JSON object reserves the default plus the estimate of the whole body.
/// `pub` for the fuzz target (`fuzz/fuzz_targets/llm_usage.rs`).
pub fn reservation(body: &[u8], rule: &ReserveRule) -> Reservation {
    let Ok(Value::Object(request)) = serde_json::from_slice::<Value>(body) else {
        return Reservation {
            completion: rule.max_tokens_default,
            prompt: estimate(rule.prompt, len_u64(body.len())),
            streamed: false,
            model: None,
        };
    };
    let completion = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|name| request.get(*name).and_then(Value::as_u64))
        .unwrap_or(rule.max_tokens_default);
    Reservation {
        completion,
        prompt: estimate(rule.prompt, prompt_bytes(&request)),
        streamed: is_streamed(&request),
        model: request
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_owned),
    }
}

fn estimate(rule: PromptEstimate, bytes: u64) -> u64 {
    match rule {
        PromptEstimate::BytesOver4 => bytes.div_ceil(4),
    }
}

fn is_streamed(request: &Map<String, Value>) -> bool {
    request.get("stream") == Some(&Value::Bool(true))
}

/// The bytes of the text the model reads, as UTF-8:
/// - OpenAI chat `messages[]`: `content` (a string, or parts whose `text`
///   counts) and `name`; Anthropic `messages[].content` the same (blocks
///   with `text`, and a `tool_result` block's own `content`);
/// - `tools` and `functions`: their JSON, serialized compactly;
/// - the legacy completions `prompt` (a string or strings);
/// - the Responses API `input` (a string, or items that are strings or
///   have a `content` as above; embeddings' `input` is strings too) and
///   `instructions`;
/// - Anthropic `system` (a string or `text` blocks).
fn prompt_bytes(request: &Map<String, Value>) -> u64 {
    let mut bytes = 0u64;
    let mut add = |n: u64| bytes = bytes.saturating_add(n);
    if let Some(Value::Array(messages)) = request.get("messages") {
        for message in messages {
            add(content_bytes(message.get("content")));
            add(string_bytes(message.get("name")));
        }
    }
    for tools in ["tools", "functions"] {
        if let Some(value) = request.get(tools) {
            add(serialized_bytes(value));
        }
    }
    add(strings_bytes(request.get("prompt")));
    add(match request.get("input") {
        Some(Value::Array(items)) => items
            .iter()
            .map(input_item_bytes)
            .fold(0, u64::saturating_add),
        other => string_bytes(other),
    });
    add(string_bytes(request.get("instructions")));
    add(content_bytes(request.get("system")));
    bytes
}

/// A Responses API (or embeddings) `input` item: a string, or a message
/// with a `content`.
fn input_item_bytes(item: &Value) -> u64 {
    match item {
        Value::String(text) => len_u64(text.len()),
        _ => content_bytes(item.get("content")),
    }
}

/// A `content` (or Anthropic `system`): a string, or blocks whose `text`
/// counts, a `tool_result` block's nested `content` too.
fn content_bytes(content: Option<&Value>) -> u64 {
    match content {
        Some(Value::String(text)) => len_u64(text.len()),
        Some(Value::Array(blocks)) => blocks.iter().map(block_bytes).fold(0, u64::saturating_add),
        _ => 0,
    }
}

fn block_bytes(block: &Value) -> u64 {
    let text = string_bytes(block.get("text"));
    // A tool result's content is blocks (or a string) itself; one level
    // deep, as the API nests it.
    let nested = match block.get("content") {
        Some(Value::String(text)) => len_u64(text.len()),
        Some(Value::Array(inner)) => inner
            .iter()
            .map(|inner| string_bytes(inner.get("text")))
            .fold(0, u64::saturating_add),
        _ => 0,
    };
    text.saturating_add(nested)
}

fn string_bytes(value: Option<&Value>) -> u64 {
    match value {
        Some(Value::String(text)) => len_u64(text.len()),
        _ => 0,
    }
}

/// A string, or the strings of an array (the legacy `prompt`; token-id
/// arrays count nothing).
fn strings_bytes(value: Option<&Value>) -> u64 {
    match value {
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| string_bytes(Some(item)))
            .fold(0, u64::saturating_add),
        other => string_bytes(other),
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
}
