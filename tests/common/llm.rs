//! A scripted OpenAI- and Anthropic-compatible upstream for the token-quota
//! tests: each request says, in headers, how the answer reports its usage
//! (`x-script`) and how many tokens it used (`x-used`); the answer is a
//! JSON body or a server-sent-event stream sent in pieces, with the usage
//! early, late, absent, malformed or cut off before it arrives. The
//! `openai` script answers as OpenAI's chat completions do, every field
//! the official SDK's types require: JSON or a stream as the request's
//! `stream` says, the stream's usage chunk only when the request asks for
//! it (`stream_options.include_usage`), as tests/openai_sdk.rs needs.
//! `responses` answers as OpenAI's Responses API, `anthropic-json` as
//! Anthropic's Messages API unstreamed (`anthropic` is its stream).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// A `gateway.toml` for a token-quota test: `[server]` on `127.0.0.1:0`
/// with one worker and the `server` lines, upstream `llm` at `url`, then
/// `rest` (prices, limits, [`chat_route`]…), as [`super::gateway_toml`]
/// does for the plain test upstream.
pub fn gateway_toml(url: &str, server: &str, rest: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n{server}\n\n\
         [upstreams.llm]\nurl = \"{url}\"\n\n{rest}"
    )
}

/// The route `chat`, `POST /v1/chat/completions` to `llm`, with `limits`
/// (the items of its TOML array) and the token rule `tokens`.
pub fn chat_route(limits: &str, tokens: &str) -> String {
    format!(
        "[[routes]]\nname = \"chat\"\n\
         match = {{ path = \"/v1/chat/completions\", methods = [\"POST\"] }}\n\
         upstream = \"llm\"\nlimits = [{limits}]\ntokens = {tokens}\n"
    )
}

/// The scripted upstream, serving until dropped.
pub struct LlmUpstream {
    pub addr: SocketAddr,
    /// The body of the last request it received.
    last_body: Arc<Mutex<Option<Bytes>>>,
    /// The whole body of the last answer it sent.
    last_answer: Arc<Mutex<Option<Bytes>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LlmUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LlmUpstream {
    pub async fn start() -> LlmUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let last_body = Arc::new(Mutex::new(None));
        let last_answer = Arc::new(Mutex::new(None));
        let (seen, sent) = (last_body.clone(), last_answer.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (seen, sent) = (seen.clone(), sent.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let (seen, sent) = (seen.clone(), sent.clone());
                        async move { Ok::<_, Infallible>(answer(request, &seen, &sent).await) }
                    });
                    // HTTP/1.1, or HTTP/2 with prior knowledge (an
                    // upstream with `http2 = true`).
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                });
            }
        });
        LlmUpstream {
            addr,
            last_body,
            last_answer,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Whether any request reached it.
    pub fn received(&self) -> bool {
        self.last_body.lock().unwrap().is_some()
    }

    /// The last request's body, as JSON.
    pub fn last_body(&self) -> serde_json::Value {
        let body = self.last_body.lock().unwrap().clone().expect("a request");
        serde_json::from_slice(&body).expect("a JSON request body")
    }

    /// The last answer's body, whole, as it left the upstream.
    pub fn last_answer(&self) -> String {
        let body = self.last_answer.lock().unwrap().clone().expect("an answer");
        String::from_utf8(body.to_vec()).expect("a UTF-8 answer")
    }
}

/// A response body sent in pieces, a pause before each; `cut` ends it
/// with an error, so the connection is closed mid-body. A long body sends
/// `repeat`'s block its count of times first, with no pause, made as it
/// goes (the upstream holds one block, whatever the length).
struct Pieces {
    repeat: Option<(Bytes, u64)>,
    pieces: std::collections::VecDeque<Bytes>,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    /// Before each piece.
    every: Duration,
    cut: bool,
    /// Sent after the last piece (hyper's HTTP/1.1 server sends them only
    /// to a request with `TE: trailers`).
    trailers: Option<hyper::HeaderMap>,
}

impl hyper::body::Body for Pieces {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        let this = self.get_mut();
        if let Some((block, left)) = &mut this.repeat {
            if *left > 0 {
                *left -= 1;
                return Poll::Ready(Some(Ok(Frame::data(block.clone()))));
            }
            this.repeat = None;
        }
        let every = this.every;
        let pause = this
            .pause
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(every)));
        if pause.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        this.pause = None;
        match this.pieces.pop_front() {
            Some(piece) => Poll::Ready(Some(Ok(Frame::data(piece)))),
            None if this.cut => Poll::Ready(Some(Err("cut".into()))),
            None => Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t)))),
        }
    }
}

/// The answer `x-script` asks for, reporting `x-used` tokens.
async fn answer(
    request: Request<Incoming>,
    seen: &Mutex<Option<Bytes>>,
    sent: &Mutex<Option<Bytes>>,
) -> Response<Pieces> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let script = header("x-script").unwrap_or_else(|| "json".into());
    let used: u64 = header("x-used").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mib: u64 = header("x-mib").and_then(|v| v.parse().ok()).unwrap_or(1);
    // `x-prompt`: that many of the `x-used` tokens are the prompt (a
    // third by default); `x-cached`: of those, read from the cache.
    let prompt: u64 = header("x-prompt")
        .and_then(|v| v.parse().ok())
        .unwrap_or(used / 3)
        .min(used);
    let cached: u64 = header("x-cached").and_then(|v| v.parse().ok()).unwrap_or(0);
    // `x-cache-creation`: of the prompt's uncached tokens, written to
    // Anthropic's cache (reported apart; the answers omit it at 0).
    let creation: u64 = header("x-cache-creation")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let anthropic_usage = |output: u64| {
        let written = match creation {
            0 => String::new(),
            n => format!(",\"cache_creation_input_tokens\":{n}"),
        };
        format!(
            "{{\"input_tokens\":{}{written},\"cache_read_input_tokens\":{cached},\"output_tokens\":{output}}}",
            prompt.saturating_sub(cached).saturating_sub(creation)
        )
    };
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let asked: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    *seen.lock().unwrap() = Some(body);
    let completion = used - prompt;
    let chunk = |text: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
        )
    };
    // The cached count only when asked for: the answers stay as they were.
    let details = match cached {
        0 => String::new(),
        cached => format!(",\"prompt_tokens_details\":{{\"cached_tokens\":{cached}}}"),
    };
    let openai_usage = format!(
        "{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion},\"total_tokens\":{used}{details}}}"
    );
    let (content_type, pieces, cut, usage_header): (&str, Vec<String>, bool, bool) =
        match script.as_str() {
            "json" => (
                "application/json",
                vec![format!(
                    "{{\"id\":\"c1\",\"object\":\"chat.completion\",\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"usage: not here\"}}}}],"
                ),
                format!("\"usage\":{openai_usage}}}")],
                false,
                false,
            ),
            "sse" => (
                "text/event-stream",
                vec![
                    chunk("Hel"),
                    chunk("lo"),
                    format!(
                        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{openai_usage}}}\n\n"
                    ),
                    "data: [DONE]\n\n".into(),
                ],
                false,
                false,
            ),
            "anthropic" => (
                "text/event-stream; charset=utf-8",
                vec![
                    format!(
                        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"m1\",\"usage\":{}}}}}\n\n",
                        anthropic_usage(1)
                    ),
                    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n".into(),
                    format!(
                        "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"end_turn\"}},\"usage\":{{\"output_tokens\":{completion}}}}}\n\n"
                    ),
                    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".into(),
                ],
                false,
                false,
            ),
            // Anthropic's Messages API answered whole.
            "anthropic-json" => (
                "application/json",
                vec![format!(
                    "{{\"id\":\"m1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[{{\"type\":\"text\",\"text\":\"Hi\"}}],\"stop_reason\":\"end_turn\",\"usage\":{}}}",
                    anthropic_usage(completion)
                )],
                false,
                false,
            ),
            // OpenAI's Responses API answered whole: its usage names the
            // tokens input and output, the cached ones in
            // `input_tokens_details`.
            "responses" => (
                "application/json",
                vec![format!(
                    "{{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[],\"usage\":{{\"input_tokens\":{prompt},\"input_tokens_details\":{{\"cached_tokens\":{cached}}},\"output_tokens\":{completion},\"output_tokens_details\":{{\"reasoning_tokens\":0}},\"total_tokens\":{used}}}}}"
                )],
                false,
                false,
            ),
            "openai" => openai(&asked, prompt, completion, cached),
            // No usage anywhere.
            "none" => (
                "application/json",
                vec!["{\"id\":\"c1\",\"choices\":[]}".into()],
                false,
                false,
            ),
            // A usage that is not a count.
            "malformed" => (
                "application/json",
                vec!["{\"id\":\"c1\",\"usage\":{\"total_tokens\":\"many\"}}".into()],
                false,
                false,
            ),
            // The stream breaks off before its usage.
            "cut" => (
                "text/event-stream",
                vec![chunk("Hel"), chunk("lo")],
                true,
                false,
            ),
            // The OpenAI stream, each piece a second apart: a response
            // still streaming while the test looks.
            "slow" => (
                "text/event-stream",
                vec![
                    chunk("Hel"),
                    format!(
                        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{openai_usage}}}\n\n"
                    ),
                ],
                false,
                false,
            ),
            // The count in a header, the body plain.
            "header" => ("text/plain", vec!["ok".into()], false, true),
            // The count in a trailer field (and another field beside it),
            // the body plain; the head declares them (`Trailer`).
            "trailer" => ("text/plain", vec!["o".into(), "k".into()], false, false),
            // `x-mib` MiB of text chunks (sent first, see below), then the
            // usage chunk.
            "long" => (
                "text/event-stream",
                vec![
                    format!(
                        "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{openai_usage}}}\n\n"
                    ),
                    "data: [DONE]\n\n".into(),
                ],
                false,
                false,
            ),
            other => panic!("unknown script {other}"),
        };
    let every = Duration::from_millis(if script == "slow" { 1000 } else { 5 });
    *sent.lock().unwrap() = Some(Bytes::from(pieces.concat()));
    let repeat = (script == "long").then(|| (long_block(), mib * 16));
    let trailers = (script == "trailer").then(|| {
        let mut trailers = hyper::HeaderMap::new();
        trailers.insert("x-tokens", used.to_string().parse().unwrap());
        trailers.insert("x-checksum", "abc".parse().unwrap());
        trailers
    });
    let mut response = Response::new(Pieces {
        repeat,
        pieces: pieces.into_iter().map(Bytes::from).collect(),
        pause: None,
        every,
        cut,
        trailers,
    });
    if script == "trailer" {
        response
            .headers_mut()
            .insert("trailer", "x-tokens, x-checksum".parse().unwrap());
    }
    response
        .headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    if usage_header {
        response
            .headers_mut()
            .insert("x-tokens", used.to_string().parse().unwrap());
    }
    response
}

/// The bytes of a long stream, 64 KiB of text chunks at a time (the
/// length of each chunk's text pads the block to exactly that).
pub const LONG_BLOCK: usize = 64 * 1024;

fn long_block() -> Bytes {
    let event = |text: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
        )
    };
    let mut block = String::with_capacity(LONG_BLOCK);
    while LONG_BLOCK - block.len() >= 2 * event("").len() + 64 {
        block.push_str(&event(" a few words"));
    }
    let pad = LONG_BLOCK - block.len() - event("").len();
    block.push_str(&event(&"z".repeat(pad)));
    assert_eq!(block.len(), LONG_BLOCK);
    Bytes::from(block)
}

/// What OpenAI answers the chat completion request `asked`: a
/// `chat.completion` ("Hello"), or, streamed, a role chunk, two content
/// chunks and a `finish_reason` chunk, then, when `include_usage` asked for
/// it, the usage chunk (`choices: []`; the others then carry
/// `"usage": null`, as OpenAI's do), then `[DONE]`.
fn openai(
    asked: &serde_json::Value,
    prompt: u64,
    completion: u64,
    cached: u64,
) -> (&'static str, Vec<String>, bool, bool) {
    use serde_json::{Value, json};
    let model = asked["model"].as_str().unwrap_or("gpt-test");
    let mut usage = json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    });
    if cached > 0 {
        usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
    }
    let head = |object: &str| {
        json!({
            "id": "chatcmpl-1",
            "object": object,
            "created": 1_767_225_600,
            "model": model,
            "system_fingerprint": "fp_test",
        })
    };
    if asked["stream"] != true {
        let mut body = head("chat.completion");
        body["choices"] = json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello", "refusal": null},
            "logprobs": null,
            "finish_reason": "stop",
        }]);
        body["usage"] = usage;
        return ("application/json", vec![body.to_string()], false, false);
    }
    let include_usage = asked["stream_options"]["include_usage"] == true;
    let chunk = |delta: Value, finish_reason: Value| {
        let mut chunk = head("chat.completion.chunk");
        chunk["choices"] =
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason}]);
        if include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    };
    let mut events = vec![
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "Hel"}), Value::Null),
        chunk(json!({"content": "lo"}), Value::Null),
        chunk(json!({}), json!("stop")),
    ];
    if include_usage {
        let mut last = head("chat.completion.chunk");
        last["choices"] = json!([]);
        last["usage"] = usage;
        events.push(last);
    }
    let mut pieces: Vec<String> = events
        .iter()
        .map(|event| format!("data: {event}\n\n"))
        .collect();
    pieces.push("data: [DONE]\n\n".into());
    ("text/event-stream", pieces, false, false)
}

/// The gateway's metrics, parsed.
pub fn metrics(gateway: &super::InProcess) -> super::openmetrics::Exposition {
    super::openmetrics::parse(&gateway.app.metrics().encode()).expect("a valid exposition")
}

/// `tollgate_tokens_total` of route `chat`'s limit `tpm`, of `kind`.
pub fn tokens(gateway: &super::InProcess, kind: &str) -> f64 {
    metrics(gateway).count(
        "tollgate_tokens_total",
        &[("route", "chat"), ("limit", "tpm"), ("kind", kind)],
    )
}

/// Waits until `tokens(kind)` is `expected`: a settlement runs when the
/// response body is dropped, just after the client has read it.
pub async fn settled(gateway: &super::InProcess, kind: &str, expected: f64) {
    let done = super::eventually(async || tokens(gateway, kind) == expected).await;
    assert!(
        done,
        "{kind}: {} (expected {expected})",
        tokens(gateway, kind)
    );
}
