//! The usage an LLM API response reports (contract section 9, `usage =
//! "auto"`), read as the body's bytes go by, in constant memory, the same
//! whatever the chunks:
//!
//! - a JSON body (OpenAI chat and completions, the Responses API,
//!   Anthropic Messages): its top-level `usage` object, captured by a
//!   streaming lexer ([`super::json::TopLevel`]) up to [`USAGE_MAX`] bytes
//!   and parsed with `serde_json`; a `usage` inside a string or a nested
//!   object never counts, and the body must be one JSON object to the end;
//! - an event stream (`text/event-stream`): OpenAI chunks (the last one
//!   with a non-null top-level `usage` wins: with
//!   `stream_options.include_usage` the final one, whose `choices` is
//!   empty), the Responses API's terminal `response.completed` (or
//!   `response.incomplete`, `response.failed`) event's `response.usage`,
//!   and Anthropic's `message_start` (`message.usage`) with the cumulative
//!   `usage` of each `message_delta`.
//!
//! How a `usage` object counts ([`Counts`]): input is `prompt_tokens`, else
//! `input_tokens`, plus Anthropic's `cache_creation_input_tokens` and
//! `cache_read_input_tokens` when present (Anthropic's `input_tokens`
//! leaves out the tokens read from or written to the prompt cache, which
//! are billed; OpenAI's counts of cached tokens are details inside its
//! totals, not added); output is `completion_tokens`, else
//! `output_tokens`; total is `total_tokens`, else input + output. Of the
//! input, `cached` is the part read from the provider's prompt cache,
//! priced apart (by the `price` module): OpenAI chat's
//! `prompt_tokens_details.cached_tokens`, the Responses API's
//! `input_tokens_details.cached_tokens`, Anthropic's
//! `cache_read_input_tokens` (its cache-creation tokens are not cached
//! reads: they count as plain input). A count
//! that is not a non-negative integer that fits in a u64 (negative,
//! fractional, overflowing, a string) makes that usage absent, as does
//! malformed JSON: the gateway's reservation then stands.

use std::sync::LazyLock;

use memchr::memmem;
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::event_stream::{Event, EventStream};
use super::json::{Mark, TopLevel};

/// The most bytes of a JSON body's `usage` value captured: a longer one
/// (no API sends one) is ignored, so the usage is absent.
pub(crate) const USAGE_MAX: usize = 4 * 1024;

/// The tokens a response reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub(crate) input: u64,
    /// Of `input`, those read from the provider's prompt cache.
    pub(crate) cached: u64,
    pub(crate) output: u64,
    pub(crate) total: u64,
}

/// How a response body is framed, from its `Content-Type`. `pub` for the
/// fuzz target (`fuzz/fuzz_targets/llm_usage.rs`), which scans its input
/// both ways.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    EventStream,
}

impl Format {
    /// `application/json` and any `*/*+json` (parameters allowed, case
    /// ignored) are [`Format::Json`]; `text/event-stream` is
    /// [`Format::EventStream`]; anything else carries no usage this reads.
    pub fn of_content_type(value: &[u8]) -> Option<Format> {
        let essence = value.split(|&b| b == b';').next().unwrap_or_default();
        let essence = essence.trim_ascii().to_ascii_lowercase();
        if essence == b"text/event-stream" {
            return Some(Format::EventStream);
        }
        let (kind, subtype) = essence.split_at(essence.iter().position(|&b| b == b'/')?);
        let subtype = &subtype[1..];
        let is_json = (kind == b"application" && subtype == b"json")
            || (!kind.is_empty() && subtype.len() > b"+json".len() && subtype.ends_with(b"+json"));
        is_json.then_some(Format::Json)
    }
}

/// A response body's usage, read chunk by chunk. `pub` for the fuzz target
/// (`fuzz/fuzz_targets/llm_usage.rs`), which checks that the split of the
/// body never changes it.
#[derive(Debug)]
pub struct UsageScanner {
    scan: Scan,
}

#[derive(Debug)]
enum Scan {
    Json(JsonBody),
    EventStream(Events),
}

impl UsageScanner {
    pub fn new(format: Format) -> UsageScanner {
        let scan = match format {
            Format::Json => Scan::Json(JsonBody::new()),
            Format::EventStream => Scan::EventStream(Events::new()),
        };
        UsageScanner { scan }
    }

    /// The body's next bytes, wherever it was split.
    pub fn feed(&mut self, chunk: &[u8]) {
        match &mut self.scan {
            Scan::Json(body) => body.feed(chunk),
            Scan::EventStream(events) => events.feed(chunk),
        }
    }

    /// The usage reported so far: for a JSON body, its `usage` member once
    /// that value ended (the rest of the body may still break it); for a
    /// stream, the usage its events reported up to the last complete one.
    pub fn usage(&self) -> Option<Usage> {
        match &self.scan {
            Scan::Json(body) => body.usage(),
            Scan::EventStream(events) => events.usage,
        }
    }

    /// The usage of the whole body, at its end: a JSON body's only if the
    /// body was one complete JSON object; a stream's including a last
    /// event cut before its blank line, if its data parses.
    pub fn finish(self) -> Option<Usage> {
        match self.scan {
            Scan::Json(body) => body.finish(),
            Scan::EventStream(mut events) => events.finish(),
        }
    }
}

/// A JSON body's top-level `usage` member, captured as it goes by.
#[derive(Debug)]
struct JsonBody {
    lexer: TopLevel,
    /// The `usage` value's bytes so far, while `capturing`.
    capture: Vec<u8>,
    capturing: bool,
    /// The value went past [`USAGE_MAX`]: ignored.
    oversized: bool,
    /// The last complete `usage` member's (JSON keeps the last of
    /// duplicate members).
    usage: Option<Usage>,
}

impl JsonBody {
    fn new() -> JsonBody {
        JsonBody {
            lexer: TopLevel::new(),
            capture: Vec::new(),
            capturing: false,
            oversized: false,
            usage: None,
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        let JsonBody {
            lexer,
            capture,
            capturing,
            oversized,
            usage,
        } = self;
        // Where in `chunk` the `usage` value being captured starts.
        let mut from = capturing.then_some(0);
        lexer.feed(chunk, |at, mark, lexer| match mark {
            Mark::ValueStart if lexer.key_is("usage") => {
                capture.clear();
                *oversized = false;
                from = Some(at);
            }
            Mark::ValueEnd => {
                if let Some(start) = from.take() {
                    push_capped(capture, oversized, chunk.get(start..at).unwrap_or_default());
                    *usage = if *oversized {
                        None
                    } else {
                        serde_json::from_slice::<Value>(capture)
                            .ok()
                            .as_ref()
                            .and_then(read_usage)
                    };
                    capture.clear();
                }
            }
            Mark::ValueStart | Mark::KeyEnd => {}
        });
        *capturing = from.is_some();
        if let Some(start) = from {
            push_capped(capture, oversized, chunk.get(start..).unwrap_or_default());
        }
        if lexer.is_dead() {
            capture.clear();
            *capturing = false;
        }
    }

    fn usage(&self) -> Option<Usage> {
        if self.lexer.is_dead() {
            return None;
        }
        self.usage
    }

    fn finish(self) -> Option<Usage> {
        if !self.lexer.is_closed() {
            return None;
        }
        self.usage
    }
}

/// `bytes` added to `capture`, unless that passes [`USAGE_MAX`]: then the
/// capture is dropped and `oversized` set.
fn push_capped(capture: &mut Vec<u8>, oversized: &mut bool, bytes: &[u8]) {
    if *oversized {
        return;
    }
    if capture.len().saturating_add(bytes.len()) > USAGE_MAX {
        *oversized = true;
        capture.clear();
        return;
    }
    capture.extend_from_slice(bytes);
}

/// An event stream's usage, event by event.
#[derive(Debug)]
struct Events {
    stream: EventStream,
    /// What the last event that reported usage said (`None` after one
    /// whose usage was malformed).
    usage: Option<Usage>,
    anthropic: Anthropic,
}

impl Events {
    fn new() -> Events {
        Events {
            stream: EventStream::new(),
            usage: None,
            anthropic: Anthropic::default(),
        }
    }

    fn feed(&mut self, chunk: &[u8]) {
        let Events {
            stream,
            usage,
            anthropic,
        } = self;
        // Only events that name `usage` take part: the others are passed
        // over by a search, not framed byte by byte.
        stream.feed_skipping(
            chunk,
            &mut |event| on_event(&event, usage, anthropic),
            &USAGE,
        );
    }

    fn finish(&mut self) -> Option<Usage> {
        let Events {
            stream,
            usage,
            anthropic,
        } = self;
        stream.finish(&mut |event| on_event(&event, usage, anthropic));
        *usage
    }
}

/// One event's part in the usage: only events whose data is a JSON object
/// that names `usage` take part (`[DONE]`, text deltas and pings do not).
/// What kind of event it is comes from the data's `type`, else the event's
/// name (Anthropic and the Responses API send both, the same).
fn on_event(event: &Event<'_>, usage: &mut Option<Usage>, anthropic: &mut Anthropic) {
    if !may_name_usage(event.data) {
        return;
    }
    let Ok(data) = serde_json::from_slice::<EventData>(event.data) else {
        return;
    };
    let name = std::str::from_utf8(event.name).unwrap_or_default();
    match data.kind.as_deref().unwrap_or(name) {
        "message_start" => {
            if let Some(reported) = data.message_usage {
                anthropic.start(&reported);
                *usage = anthropic.usage();
            }
        }
        "message_delta" => {
            if let Some(reported) = data.usage {
                anthropic.delta(&reported);
                *usage = anthropic.usage();
            }
        }
        "response.completed" | "response.incomplete" | "response.failed" => {
            if let Some(reported) = data.response_usage {
                *usage = read_usage(&reported);
            }
        }
        _ => {
            if let Some(reported) = data.usage {
                *usage = read_usage(&reported);
            }
        }
    }
}

/// Finds `usage`: in a stream, only events whose data says it take part.
/// A SIMD search: every byte of a stream passes it.
static USAGE: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new("usage"));

/// Whether `data` may hold a member named `usage`: it says so. Most events
/// of a stream are text deltas that do not, and skip the parse. (A member
/// name spelled with `\u` escapes is not looked for: no API writes one,
/// and its response would settle as one without usage.)
fn may_name_usage(data: &[u8]) -> bool {
    USAGE.find(data).is_some()
}

/// An Anthropic stream's counts so far: `message_start` sets them all, each
/// `message_delta` replaces those its (cumulative) `usage` has.
#[derive(Debug, Default)]
struct Anthropic {
    input: Option<u64>,
    cache_creation: u64,
    cache_read: u64,
    output: Option<u64>,
}

impl Anthropic {
    fn start(&mut self, reported: &Value) {
        *self = match Counts::read(reported) {
            Some(counts) => Anthropic {
                input: counts.input,
                cache_creation: counts.cache_creation.unwrap_or(0),
                cache_read: counts.cache_read.unwrap_or(0),
                output: counts.output,
            },
            None => Anthropic::default(),
        };
    }

    fn delta(&mut self, reported: &Value) {
        let Some(counts) = Counts::read(reported) else {
            // Absent until a later delta (cumulative) says it again.
            self.output = None;
            return;
        };
        self.input = counts.input.or(self.input);
        self.cache_creation = counts.cache_creation.unwrap_or(self.cache_creation);
        self.cache_read = counts.cache_read.unwrap_or(self.cache_read);
        self.output = counts.output.or(self.output);
    }

    fn usage(&self) -> Option<Usage> {
        let input = self
            .input?
            .saturating_add(self.cache_creation)
            .saturating_add(self.cache_read);
        let output = self.output?;
        Some(Usage {
            input,
            cached: self.cache_read,
            output,
            total: input.saturating_add(output),
        })
    }
}

/// The counts of a `usage` object, each absent when missing or `null`.
/// `input` is `prompt_tokens`, else `input_tokens`; `output`
/// `completion_tokens`, else `output_tokens`.
#[derive(Debug, Default)]
struct Counts {
    input: Option<u64>,
    output: Option<u64>,
    total: Option<u64>,
    cache_creation: Option<u64>,
    cache_read: Option<u64>,
    /// OpenAI's cached prompt tokens (`prompt_tokens_details` or
    /// `input_tokens_details`' `cached_tokens`), part of `input`.
    cached_details: Option<u64>,
}

impl Counts {
    /// `None` when `reported` is not an object or a count in it is not a
    /// non-negative integer within a u64.
    fn read(reported: &Value) -> Option<Counts> {
        let object = reported.as_object()?;
        let count = |name: &str| -> Result<Option<u64>, ()> {
            match object.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(value) => value.as_u64().map(Some).ok_or(()),
            }
        };
        let read = || -> Result<Counts, ()> {
            Ok(Counts {
                input: count("prompt_tokens")?.or(count("input_tokens")?),
                output: count("completion_tokens")?.or(count("output_tokens")?),
                total: count("total_tokens")?,
                cache_creation: count("cache_creation_input_tokens")?,
                cache_read: count("cache_read_input_tokens")?,
                cached_details: cached_details(object)?,
            })
        };
        read().ok()
    }
}

/// `cached_tokens` of OpenAI's `prompt_tokens_details` (chat), else of
/// `input_tokens_details` (Responses): absent when neither has it (or they
/// are not objects: details are optional), `Err` when it is not a count.
fn cached_details(usage: &serde_json::Map<String, Value>) -> Result<Option<u64>, ()> {
    let cached = |details: &str| match usage.get(details).and_then(|d| d.get("cached_tokens")) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value.as_u64().map(Some).ok_or(()),
    };
    Ok(cached("prompt_tokens_details")?.or(cached("input_tokens_details")?))
}

/// The usage a `usage` object reports: input (cache tokens added), output,
/// and `total_tokens` or their sum. `None` when malformed, or when it has
/// neither a total nor both an input and an output.
fn read_usage(reported: &Value) -> Option<Usage> {
    let counts = Counts::read(reported)?;
    let cache = counts
        .cache_creation
        .unwrap_or(0)
        .saturating_add(counts.cache_read.unwrap_or(0));
    let input = counts.input.map(|input| input.saturating_add(cache));
    let total = match (counts.total, input, counts.output) {
        (Some(total), _, _) => total,
        (None, Some(input), Some(output)) => input.saturating_add(output),
        _ => return None,
    };
    let input = input.unwrap_or(0);
    let cached = counts
        .cache_read
        .or(counts.cached_details)
        .unwrap_or(0)
        .min(input);
    Some(Usage {
        input,
        cached,
        output: counts.output.unwrap_or(0),
        total,
    })
}

/// What an event's data says about usage: its `type`, its top-level
/// `usage`, and the `usage` of its `message` (Anthropic's `message_start`)
/// and of its `response` (the Responses API's terminal events). Everything
/// else is skipped without being built; `null` reads as absent.
#[derive(Debug, Default)]
struct EventData {
    kind: Option<String>,
    usage: Option<Value>,
    message_usage: Option<Value>,
    response_usage: Option<Value>,
}

/// The members of an event's data [`EventData`] reads.
enum Member {
    Type,
    Usage,
    Message,
    Response,
    Other,
}

impl<'de> Deserialize<'de> for Member {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Member, D::Error> {
        struct MemberName;
        impl Visitor<'_> for MemberName {
            type Value = Member;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<Member, E> {
                Ok(match name {
                    "type" => Member::Type,
                    "usage" => Member::Usage,
                    "message" => Member::Message,
                    "response" => Member::Response,
                    _ => Member::Other,
                })
            }
        }
        deserializer.deserialize_identifier(MemberName)
    }
}

/// `null` as absent.
fn non_null(value: Value) -> Option<Value> {
    (!value.is_null()).then_some(value)
}

impl<'de> Deserialize<'de> for EventData {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<EventData, D::Error> {
        struct EventObject;
        impl<'de> Visitor<'de> for EventObject {
            type Value = EventData;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an event object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EventData, A::Error> {
                let mut data = EventData::default();
                while let Some(member) = map.next_key::<Member>()? {
                    match member {
                        Member::Type => {
                            data.kind = match map.next_value::<Value>()? {
                                Value::String(kind) => Some(kind),
                                _ => None,
                            }
                        }
                        Member::Usage => data.usage = non_null(map.next_value()?),
                        Member::Message => data.message_usage = map.next_value::<UsageOf>()?.0,
                        Member::Response => data.response_usage = map.next_value::<UsageOf>()?.0,
                        Member::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(data)
            }
        }
        deserializer.deserialize_map(EventObject)
    }
}

/// Any JSON value, read for the non-null `usage` member it has if it is an
/// object (and skipped otherwise).
struct UsageOf(Option<Value>);

impl<'de> Deserialize<'de> for UsageOf {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<UsageOf, D::Error> {
        struct AnyValue;
        impl<'de> Visitor<'de> for AnyValue {
            type Value = UsageOf;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UsageOf, A::Error> {
                let mut usage = None;
                while let Some(member) = map.next_key::<Member>()? {
                    match member {
                        Member::Usage => usage = non_null(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(UsageOf(usage))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UsageOf, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(UsageOf(None))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<UsageOf, E> {
                Ok(UsageOf(None))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<UsageOf, E> {
                Ok(UsageOf(None))
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<UsageOf, E> {
                Ok(UsageOf(None))
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<UsageOf, E> {
                Ok(UsageOf(None))
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<UsageOf, E> {
                Ok(UsageOf(None))
            }
            fn visit_unit<E: de::Error>(self) -> Result<UsageOf, E> {
                Ok(UsageOf(None))
            }
        }
        deserializer.deserialize_any(AnyValue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn usage(input: u64, output: u64, total: u64) -> Option<Usage> {
        cached_usage(input, 0, output, total)
    }

    fn cached_usage(input: u64, cached: u64, output: u64, total: u64) -> Option<Usage> {
        Some(Usage {
            input,
            cached,
            output,
            total,
        })
    }

    fn whole(format: Format, body: &[u8]) -> Option<Usage> {
        let mut scanner = UsageScanner::new(format);
        scanner.feed(body);
        scanner.finish()
    }

    fn json(body: &str) -> Option<Usage> {
        whole(Format::Json, body.as_bytes())
    }

    fn stream(body: &str) -> Option<Usage> {
        whole(Format::EventStream, body.as_bytes())
    }

    /// `body` fed a byte at a time.
    fn bytewise(format: Format, body: &[u8]) -> Option<Usage> {
        let mut scanner = UsageScanner::new(format);
        for byte in body {
            scanner.feed(std::slice::from_ref(byte));
        }
        scanner.finish()
    }

    const OPENAI_CHAT: &str = r#"{
  "id": "chatcmpl-B9MBs8CjcvOU2jLn4n570S5qMJKcT",
  "object": "chat.completion",
  "created": 1741569952,
  "model": "gpt-4.1-2025-04-14",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "Hello! How can I assist you today? (\"usage\": {\"total_tokens\": 1})",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 19,
    "completion_tokens": 10,
    "total_tokens": 29,
    "prompt_tokens_details": {
      "cached_tokens": 0,
      "audio_tokens": 0
    },
    "completion_tokens_details": {
      "reasoning_tokens": 0,
      "audio_tokens": 0,
      "accepted_prediction_tokens": 0,
      "rejected_prediction_tokens": 0
    }
  },
  "service_tier": "default"
}"#;

    const ANTHROPIC_MESSAGE: &str = r#"{
  "id": "msg_013Zva2CMHLNnXjNJJKqJ2EF",
  "type": "message",
  "role": "assistant",
  "model": "claude-sonnet-4-20250514",
  "content": [{"type": "text", "text": "Hi! My name is Claude."}],
  "stop_reason": "end_turn",
  "stop_sequence": null,
  "usage": {"input_tokens": 2095, "output_tokens": 503, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 50}
}"#;

    const RESPONSES_JSON: &str = r#"{
  "id": "resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45c1d41",
  "object": "response",
  "created_at": 1741476777,
  "status": "completed",
  "model": "gpt-4o-2024-08-06",
  "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
    "content": [{"type": "output_text", "text": "The image depicts a scenic landscape.", "annotations": []}]}],
  "usage": {
    "input_tokens": 328,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 52,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 380
  }
}"#;

    const OPENAI_STREAM: &str = concat!(
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"system_fingerprint\":\"fp_44709d6fcb\",\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );

    const OPENAI_STREAM_WITH_USAGE: &str = concat!(
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"chatcmpl-123\",\"object\":\"chat.completion.chunk\",\"created\":1694268190,\"model\":\"gpt-4o-mini\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21,\"prompt_tokens_details\":{\"cached_tokens\":0},\"completion_tokens_details\":{\"reasoning_tokens\":0}}}\n\n",
        "data: [DONE]\n\n",
    );

    const ANTHROPIC_STREAM: &str = concat!(
        "event: message_start\n",
        "data: {\"type\": \"message_start\", \"message\": {\"id\": \"msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY\", \"type\": \"message\", \"role\": \"assistant\", \"content\": [], \"model\": \"claude-opus-4-20250514\", \"stop_reason\": null, \"stop_sequence\": null, \"usage\": {\"input_tokens\": 25, \"output_tokens\": 1}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\": \"content_block_start\", \"index\": 0, \"content_block\": {\"type\": \"text\", \"text\": \"\"}}\n\n",
        "event: ping\n",
        "data: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"Hello\"}}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"! usage\"}}\n\n",
        "event: content_block_stop\n",
        "data: {\"type\": \"content_block_stop\", \"index\": 0}\n\n",
        "event: message_delta\n",
        "data: {\"type\": \"message_delta\", \"delta\": {\"stop_reason\": \"end_turn\", \"stop_sequence\":null}, \"usage\": {\"output_tokens\": 15}}\n\n",
        "event: message_stop\n",
        "data: {\"type\": \"message_stop\"}\n\n",
    );

    const RESPONSES_STREAM: &str = concat!(
        "event: response.created\n",
        "data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n",
        "event: response.output_text.delta\n",
        "data: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"Hi\"}\n\n",
        "event: response.completed\n",
        "data: {\"type\":\"response.completed\",\"sequence_number\":9,\"response\":{\"id\":\"resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654\",\"object\":\"response\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\"}]}],\"usage\":{\"input_tokens\":37,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":11,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":48}}}\n\n",
    );

    #[test]
    fn content_types() {
        assert_eq!(
            Format::of_content_type(b"application/json"),
            Some(Format::Json)
        );
        assert_eq!(
            Format::of_content_type(b" Application/JSON ; charset=utf-8"),
            Some(Format::Json)
        );
        assert_eq!(
            Format::of_content_type(b"application/problem+json"),
            Some(Format::Json)
        );
        assert_eq!(
            Format::of_content_type(b"text/event-stream; charset=utf-8"),
            Some(Format::EventStream)
        );
        assert_eq!(
            Format::of_content_type(b"TEXT/EVENT-STREAM"),
            Some(Format::EventStream)
        );
        for other in [
            &b"text/plain"[..],
            b"application/jsonl",
            b"application/x-ndjson",
            b"application/+json",
            b"json",
            b"",
            b"\xff/json",
        ] {
            assert_eq!(Format::of_content_type(other), None, "{other:?}");
        }
    }

    #[test]
    fn openai_chat_json_reads_total_tokens_not_the_usage_in_its_text() {
        assert_eq!(json(OPENAI_CHAT), usage(19, 10, 29));
    }

    #[test]
    fn openai_without_total_adds_prompt_and_completion() {
        assert_eq!(
            json(r#"{"usage":{"prompt_tokens":7,"completion_tokens":5}}"#),
            usage(7, 5, 12)
        );
        // Embeddings: a total and a prompt, no completion.
        assert_eq!(
            json(r#"{"object":"list","data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}"#),
            usage(8, 0, 8)
        );
        // The total as reported, even if it is not the sum.
        assert_eq!(
            json(r#"{"usage":{"prompt_tokens":7,"completion_tokens":5,"total_tokens":20}}"#),
            usage(7, 5, 20)
        );
    }

    #[test]
    fn anthropic_json_adds_cache_tokens_to_input() {
        assert_eq!(json(ANTHROPIC_MESSAGE), cached_usage(2245, 50, 503, 2748));
        assert_eq!(
            json(
                r#"{"type":"message","usage":{"input_tokens":3,"output_tokens":4,"cache_creation_input_tokens":null}}"#
            ),
            usage(3, 4, 7)
        );
    }

    #[test]
    fn openai_cached_prompt_tokens_are_reported_apart() {
        // Chat: `prompt_tokens_details.cached_tokens`, inside the prompt.
        assert_eq!(
            json(
                r#"{"usage":{"prompt_tokens":2006,"completion_tokens":300,"total_tokens":2306,"prompt_tokens_details":{"cached_tokens":1920}}}"#
            ),
            cached_usage(2006, 1920, 300, 2306)
        );
        // Responses: `input_tokens_details.cached_tokens`.
        assert_eq!(
            json(
                r#"{"usage":{"input_tokens":328,"input_tokens_details":{"cached_tokens":128},"output_tokens":52,"total_tokens":380}}"#
            ),
            cached_usage(328, 128, 52, 380)
        );
        // In a stream's last chunk too.
        let chunk = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":12,\"total_tokens\":21,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n";
        assert_eq!(stream(chunk), cached_usage(9, 4, 12, 21));
        // Never more than the prompt; null or absent details are none.
        assert_eq!(
            json(
                r#"{"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":9}}}"#
            ),
            cached_usage(3, 3, 1, 4)
        );
        assert_eq!(
            json(
                r#"{"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":null}}"#
            ),
            usage(3, 1, 4)
        );
        // A cached count that is not a count spoils the usage.
        assert_eq!(
            json(
                r#"{"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":-1}}}"#
            ),
            None
        );
    }

    #[test]
    fn responses_api_json() {
        assert_eq!(json(RESPONSES_JSON), usage(328, 52, 380));
        assert_eq!(
            json(r#"{"usage":{"input_tokens":3,"output_tokens":4}}"#),
            usage(3, 4, 7)
        );
    }

    #[test]
    fn usage_that_is_not_top_level_does_not_count() {
        assert_eq!(json(r#"{"choices":[{"usage":{"total_tokens":5}}]}"#), None);
        assert_eq!(json(r#"{"a":{"usage":{"total_tokens":5}}}"#), None);
        assert_eq!(json(r#"{"text":"\"usage\":{\"total_tokens\":5}"}"#), None);
        assert_eq!(json(r#"{"text":"\\","usage2":{"total_tokens":5}}"#), None);
        assert_eq!(json(r#"[{"usage":{"total_tokens":5}}]"#), None);
        // A key that is "usage" once decoded counts.
        assert_eq!(json(r#"{"us\u0061ge":{"total_tokens":5}}"#), usage(0, 0, 5));
        // A value that is the string "usage" is not a key.
        assert_eq!(json(r#"{"name":"usage","n":{"total_tokens":5}}"#), None);
    }

    #[test]
    fn the_last_of_duplicate_usage_members_decides() {
        assert_eq!(
            json(r#"{"usage":{"total_tokens":5},"usage":{"total_tokens":6}}"#),
            usage(0, 0, 6)
        );
        assert_eq!(json(r#"{"usage":{"total_tokens":5},"usage":null}"#), None);
    }

    #[test]
    fn malformed_counts_make_the_usage_absent() {
        for counts in [
            r#"{"total_tokens":-1}"#,
            r#"{"total_tokens":1.5}"#,
            r#"{"total_tokens":1e3}"#,
            r#"{"total_tokens":18446744073709551616}"#,
            r#"{"total_tokens":"5"}"#,
            r#"{"prompt_tokens":5,"completion_tokens":-2,"total_tokens":3}"#,
            r#"{"input_tokens":5,"output_tokens":2,"cache_read_input_tokens":-1}"#,
            r#"{"prompt_tokens":5}"#,
            r#"{}"#,
            r#"null"#,
            r#"[1,2]"#,
            r#"5"#,
            r#"{"total_tokens":5,}"#,
            r#"{"total_tokens":5]"#,
        ] {
            let body = format!(r#"{{"id":"x","usage":{counts},"model":"m"}}"#);
            assert_eq!(json(&body), None, "{body}");
        }
        assert_eq!(
            json(r#"{"usage":{"total_tokens":18446744073709551615}}"#),
            usage(0, 0, u64::MAX)
        );
        assert_eq!(
            json(r#"{"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":2}}"#),
            usage(u64::MAX, 2, u64::MAX)
        );
    }

    #[test]
    fn a_body_that_is_not_one_complete_object_has_no_usage() {
        let good = r#"{"usage":{"total_tokens":5}}"#;
        assert_eq!(json(good), usage(0, 0, 5));
        assert_eq!(json(&format!("  \r\n{good}\n ")), usage(0, 0, 5));
        // Cut after the usage member: known so far, not at the end.
        let mut scanner = UsageScanner::new(Format::Json);
        scanner.feed(br#"{"usage":{"total_tokens":5},"model":"#);
        assert_eq!(scanner.usage(), usage(0, 0, 5));
        assert_eq!(scanner.finish(), None);
        for bad in [
            format!("{good}{good}"),
            format!("{good} x"),
            format!("x{good}"),
            r#"{"usage":{"total_tokens":5}"#.to_owned(),
            r#"{"usage":{"total_tokens":5},}"#.to_owned(),
            r#"{"a" 1,"usage":{"total_tokens":5}}"#.to_owned(),
            r#"{"a":,"usage":{"total_tokens":5}}"#.to_owned(),
            r#"{"a":1]"usage":{"total_tokens":5}}"#.to_owned(),
            r#"{5:1,"usage":{"total_tokens":5}}"#.to_owned(),
            String::new(),
        ] {
            assert_eq!(json(&bad), None, "{bad}");
        }
        // A break after the usage also loses what was known.
        let mut scanner = UsageScanner::new(Format::Json);
        scanner.feed(br#"{"usage":{"total_tokens":5}}}"#);
        assert_eq!(scanner.usage(), None);
    }

    #[test]
    fn oversized_usage_is_ignored() {
        let padding = |n: usize| "x".repeat(n);
        // `{"total_tokens":5,"pad":""}` is 27 bytes around the padding.
        let fits = format!(
            r#"{{"usage":{{"total_tokens":5,"pad":"{}"}}}}"#,
            padding(USAGE_MAX - 27)
        );
        assert_eq!(json(&fits), usage(0, 0, 5));
        assert_eq!(bytewise(Format::Json, fits.as_bytes()), usage(0, 0, 5));
        let over = format!(
            r#"{{"usage":{{"total_tokens":5,"pad":"{}"}}}}"#,
            padding(USAGE_MAX - 26)
        );
        assert_eq!(json(&over), None);
        assert_eq!(bytewise(Format::Json, over.as_bytes()), None);
        // A big body around a small usage is fine.
        let big = format!(
            r#"{{"text":"{}","usage":{{"total_tokens":5}}}}"#,
            padding(1 << 20)
        );
        assert_eq!(json(&big), usage(0, 0, 5));
    }

    #[test]
    fn openai_stream_without_include_usage_has_none() {
        assert_eq!(stream(OPENAI_STREAM), None);
    }

    #[test]
    fn openai_stream_with_include_usage_reads_the_final_chunk() {
        assert_eq!(stream(OPENAI_STREAM_WITH_USAGE), usage(9, 12, 21));
        // Known as soon as that chunk's event ends.
        let mut scanner = UsageScanner::new(Format::EventStream);
        let cut = OPENAI_STREAM_WITH_USAGE
            .find("data: [DONE]")
            .unwrap_or_default();
        scanner.feed(&OPENAI_STREAM_WITH_USAGE.as_bytes()[..cut]);
        assert_eq!(scanner.usage(), usage(9, 12, 21));
    }

    #[test]
    fn the_last_chunk_with_usage_wins() {
        let body = concat!(
            "data: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\n",
            "data: {\"choices\":[],\"usage\":{\"total_tokens\":4}}\n\n",
            "data: {\"choices\":[],\"usage\":null}\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(stream(body), usage(0, 0, 4));
        let spoiled = concat!(
            "data: {\"choices\":[],\"usage\":{\"total_tokens\":3}}\n\n",
            "data: {\"choices\":[],\"usage\":{\"total_tokens\":-4}}\n\n",
        );
        assert_eq!(stream(spoiled), None);
    }

    #[test]
    fn anthropic_stream_reads_start_and_deltas() {
        assert_eq!(stream(ANTHROPIC_STREAM), usage(25, 15, 40));
        // Before the delta: what message_start said.
        let mut scanner = UsageScanner::new(Format::EventStream);
        let cut = ANTHROPIC_STREAM
            .find("event: message_delta")
            .unwrap_or_default();
        scanner.feed(&ANTHROPIC_STREAM.as_bytes()[..cut]);
        assert_eq!(scanner.usage(), usage(25, 1, 26));
    }

    #[test]
    fn anthropic_deltas_are_cumulative_and_may_replace_the_input() {
        let body = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"cache_creation_input_tokens\":5,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":7}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n",
        );
        assert_eq!(stream(body), cached_usage(115, 100, 9, 124));
        let with_input = format!(
            "{body}event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"input_tokens\":12,\"cache_read_input_tokens\":90,\"output_tokens\":20}}}}\n\n"
        );
        assert_eq!(stream(&with_input), cached_usage(107, 90, 20, 127));
        // A delta without message_start: the input is unknown.
        assert_eq!(
            stream(
                "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":9}}\n\n"
            ),
            None
        );
        // A malformed delta makes the usage absent until the next.
        let spoiled = format!(
            "{body}event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":-1}}}}\n\n"
        );
        assert_eq!(stream(&spoiled), None);
        let restored = format!(
            "{spoiled}event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":30}}}}\n\n"
        );
        assert_eq!(stream(&restored), cached_usage(115, 100, 30, 145));
    }

    #[test]
    fn the_event_name_stands_in_for_a_missing_type() {
        let body = concat!(
            "event: message_start\n",
            "data: {\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
            "event: message_delta\n",
            "data: {\"usage\":{\"output_tokens\":4}}\n\n",
        );
        assert_eq!(stream(body), usage(10, 4, 14));
    }

    #[test]
    fn responses_stream_reads_the_terminal_event() {
        assert_eq!(stream(RESPONSES_STREAM), usage(37, 11, 48));
        let incomplete = RESPONSES_STREAM.replace("response.completed", "response.incomplete");
        assert_eq!(stream(&incomplete), usage(37, 11, 48));
        // Another event's `response.usage` is not the final count.
        let created_only = RESPONSES_STREAM.replace("response.completed", "response.in_progress");
        assert_eq!(stream(&created_only), None);
    }

    #[test]
    fn line_ends_comments_and_fields_per_the_html_spec() {
        let event = "data: {\"usage\":{\"total_tokens\":5}}";
        for body in [
            format!("{event}\r\n\r\n"),
            format!("{event}\r\rdata: [DONE]\r\r"),
            format!(": keep-alive\n\n{event}\n\n: done\n\n"),
            format!(":{event}\n\ndata:{{\"usage\":{{\"total_tokens\":5}}}}\n\n"),
            format!("\u{feff}{event}\n\n"),
            format!("id: 1\nretry: 100\nevent: x\n{event}\n\n"),
            // Data lines joined with `\n`.
            "data: {\"usage\":\ndata: {\"total_tokens\":5}}\n\n".to_owned(),
            // A field line without a colon is an empty value.
            format!("data\n{event}\n\n"),
        ] {
            assert_eq!(stream(&body), usage(0, 0, 5), "{body:?}");
            assert_eq!(
                bytewise(Format::EventStream, body.as_bytes()),
                usage(0, 0, 5),
                "{body:?}"
            );
        }
        for body in [
            format!(": {event}\n\n"),
            // Two spaces: the value starts with one, still JSON.
            format!("dat: {event}\n\n"),
            // A BOM only at the very start.
            format!("data: [DONE]\n\n\u{feff}{event}\n\n"),
        ] {
            assert_eq!(stream(&body), None, "{body:?}");
        }
        assert_eq!(
            stream("data:  {\"usage\":{\"total_tokens\":5}}\n\n"),
            usage(0, 0, 5)
        );
    }

    #[test]
    fn a_cut_last_event_counts_if_its_data_parses() {
        let event = "data: {\"usage\":{\"total_tokens\":5}}";
        assert_eq!(stream(event), usage(0, 0, 5));
        assert_eq!(stream(&format!("{event}\n")), usage(0, 0, 5));
        assert_eq!(stream(&format!("{event}\r")), usage(0, 0, 5));
        let mut scanner = UsageScanner::new(Format::EventStream);
        scanner.feed(event.as_bytes());
        assert_eq!(
            scanner.usage(),
            None,
            "not dispatched before its blank line"
        );
        assert_eq!(scanner.finish(), usage(0, 0, 5));
        assert_eq!(stream("data: {\"usage\":{\"total_tok"), None);
        assert_eq!(
            stream(&format!("{event}\n\ndata: {{\"usage\":{{\"tot")),
            usage(0, 0, 5)
        );
    }

    #[test]
    fn an_oversized_event_is_skipped() {
        let pad = "x".repeat(super::super::event_stream::DATA_MAX);
        let big = format!("data: {{\"usage\":{{\"total_tokens\":5}},\"pad\":\"{pad}\"}}\n\n");
        assert_eq!(stream(&big), None);
        let after = format!("{big}data: {{\"usage\":{{\"total_tokens\":6}}}}\n\n");
        assert_eq!(stream(&after), usage(0, 0, 6));
        // The limit counts the data, joining newlines included.
        let fits = format!(
            "data: {{\"usage\":{{\"total_tokens\":5}},\"pad\":\"{}\"}}\n\n",
            "x".repeat(super::super::event_stream::DATA_MAX - 37)
        );
        assert_eq!(stream(&fits), usage(0, 0, 5));
        let split = fits.replacen(",\"pad\"", "\ndata: ,\"pad\"", 1);
        assert_eq!(stream(&split), None, "one more byte: the joining newline");
    }

    #[test]
    fn non_json_and_malformed_events_are_ignored() {
        let body = concat!(
            "data: {\"usage\":{\"total_tokens\":5}}\n\n",
            "data: [DONE]\n\n",
            "data: {\"usage\":\n\n",
            "data: \"usage\"\n\n",
            "data: [{\"usage\":{\"total_tokens\":6}}]\n\n",
            "data: {\"choices\":[{\"usage\":{\"total_tokens\":7}}]}\n\n",
            "data: {\"type\":\"error\",\"message\":\"usage limit\",\"response\":\"x\"}\n\n",
        );
        assert_eq!(stream(body), usage(0, 0, 5));
    }

    #[test]
    fn the_formats_do_not_read_each_other() {
        assert_eq!(
            whole(Format::Json, OPENAI_STREAM_WITH_USAGE.as_bytes()),
            None
        );
        assert_eq!(whole(Format::EventStream, OPENAI_CHAT.as_bytes()), None);
    }

    /// Bodies for the split property: the payloads above and edge cases of
    /// each rule.
    fn samples() -> Vec<(Format, String)> {
        let mut samples = vec![
            (Format::Json, OPENAI_CHAT.to_owned()),
            (Format::Json, ANTHROPIC_MESSAGE.to_owned()),
            (Format::Json, RESPONSES_JSON.to_owned()),
            (
                Format::Json,
                r#"{"us\u0061ge":{"total_tokens":5}}"#.to_owned(),
            ),
            (
                Format::Json,
                r#"{"a":"\\\"","usage":{"total_tokens":5}}"#.to_owned(),
            ),
            (Format::EventStream, OPENAI_STREAM.to_owned()),
            (Format::EventStream, OPENAI_STREAM_WITH_USAGE.to_owned()),
            (Format::EventStream, ANTHROPIC_STREAM.to_owned()),
            (Format::EventStream, RESPONSES_STREAM.to_owned()),
            (
                Format::EventStream,
                OPENAI_STREAM_WITH_USAGE.replace('\n', "\r\n"),
            ),
            (Format::EventStream, ANTHROPIC_STREAM.replace('\n', "\r")),
            (Format::EventStream, format!("\u{feff}{ANTHROPIC_STREAM}")),
        ];
        let cut = OPENAI_STREAM_WITH_USAGE
            .trim_end_matches("data: [DONE]\n\n")
            .trim_end();
        samples.push((Format::EventStream, cut.to_owned()));
        samples
    }

    fn feed_split(format: Format, body: &[u8], cuts: &[usize]) -> (Option<Usage>, Option<Usage>) {
        let mut scanner = UsageScanner::new(format);
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut % (body.len() + 1)).collect();
        cuts.sort_unstable();
        let mut from = 0;
        for cut in cuts {
            scanner.feed(&body[from..cut]);
            from = cut;
        }
        scanner.feed(&body[from..]);
        (scanner.usage(), scanner.finish())
    }

    fn feed_whole(format: Format, body: &[u8]) -> (Option<Usage>, Option<Usage>) {
        let mut scanner = UsageScanner::new(format);
        scanner.feed(body);
        (scanner.usage(), scanner.finish())
    }

    proptest! {
        #[test]
        fn samples_split_anywhere_read_the_same(
            index in 0usize..13,
            cuts in prop::collection::vec(any::<usize>(), 0..8),
        ) {
            let samples = samples();
            let (format, body) = &samples[index % samples.len()];
            prop_assert_eq!(
                feed_split(*format, body.as_bytes(), &cuts),
                feed_whole(*format, body.as_bytes())
            );
        }

        #[test]
        fn arbitrary_bytes_split_anywhere_read_the_same(
            body in prop::collection::vec(
                prop_oneof![
                    Just(b'{'), Just(b'}'), Just(b'"'), Just(b'\\'), Just(b':'), Just(b','),
                    Just(b'\n'), Just(b'\r'), Just(b' '), Just(b'['), Just(b']'),
                    any::<u8>(),
                ],
                0..200,
            ),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
            event_stream in any::<bool>(),
        ) {
            let format = if event_stream { Format::EventStream } else { Format::Json };
            prop_assert_eq!(feed_split(format, &body, &cuts), feed_whole(format, &body));
        }

        #[test]
        fn usage_fragments_split_anywhere_read_the_same(
            parts in prop::collection::vec(
                prop_oneof![
                    Just("data: "), Just("data:"), Just("event: message_delta"), Just("\n"), Just("\r"),
                    Just("\r\n"), Just(": c"), Just("{\"usage\":"), Just("{\"total_tokens\":5}"),
                    Just("{\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":1,\"output_tokens\":2}}}"),
                    Just("{\"type\":\"message_delta\",\"usage\":{\"output_tokens\":3}}"),
                    Just("}"), Just(","), Just("\"x\":\"\\\"usage\\\"\""), Just("[DONE]"), Just("\u{feff}"),
                ],
                0..24,
            ),
            cuts in prop::collection::vec(any::<usize>(), 0..8),
            event_stream in any::<bool>(),
        ) {
            let body = parts.concat();
            let format = if event_stream { Format::EventStream } else { Format::Json };
            prop_assert_eq!(
                feed_split(format, body.as_bytes(), &cuts),
                feed_whole(format, body.as_bytes())
            );
        }
    }
}
