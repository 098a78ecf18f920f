//! Token quotas (`unit = "tokens"`, a route's `tokens = {...}`) end to end
//! through real sockets, in front of a scripted OpenAI- and
//! Anthropic-compatible upstream (`common::llm`): a request reserves its
//! `max_tokens` plus a quarter of its prompt's bytes (or, with
//! `prompt = "tokenizer"`, its prompt's tokens), all or nothing with
//! the request limits of its stack; when the response ends, the usage it
//! reported (a JSON body, an OpenAI or Anthropic stream, a header) settles
//! the difference — refunded, or charged as debt that later requests wait
//! out; a response without usage (absent, malformed, cut) keeps the
//! reservation and is counted `unsettled`. On memory and on Redis across
//! two gateways, on the wall clock with buckets refilled 1,000 tokens a
//! day (a token per 86 s), so the counts are exact on a slow machine.

mod common;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use serde_json::{Value, json};

use common::llm::{self, LlmUpstream, metrics, settled, tokens};
use common::redis::Redis;
use common::{InProcess, Reply, get, send, tollgate};

/// A gateway in front of `upstream` with an RPM and a TPM limit per API
/// key; `tokens` is the route's rule, `extra` more config.
fn config(upstream: &LlmUpstream, tokens: &str, extra: &str) -> String {
    config_at(&upstream.url(), tokens, extra)
}

/// [`config`] in front of the upstream at `url`.
fn config_at(url: &str, tokens: &str, extra: &str) -> String {
    let limits = r#"[limits.rpm]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 100
window = "1h"

[limits.tpm]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 1000
refill = "1000/d"
unit = "tokens"
"#;
    let route = llm::chat_route(r#""rpm", "tpm""#, tokens);
    llm::gateway_toml(
        url,
        "admin = \"127.0.0.1:0\"",
        &format!("{limits}\n{route}\n{extra}\n"),
    )
}

const RULE: &str = r#"{ max_tokens_default = 200, prompt = "bytes/4", usage = "auto" }"#;

/// A chat completion request of `key` asking for `max_tokens`, answered as
/// `script` with `used` tokens. Its prompt, "hi", is one token.
async fn chat(gateway: &InProcess, key: &str, max_tokens: u64, script: &str, used: u64) -> Reply {
    let body = json!({
        "model": "gpt-test",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hi"}],
    });
    post(gateway, key, &body, script, used).await
}

async fn post(gateway: &InProcess, key: &str, body: &Value, script: &str, used: u64) -> Reply {
    let request = Request::post("/v1/chat/completions")
        .header("host", "gateway.test")
        .header("content-type", "application/json")
        .header("x-api-key", key)
        .header("x-script", script)
        .header("x-used", used.to_string())
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    send(gateway.addr, request).await
}

/// The tokens `key` has left on `tpm`, from the explain endpoint.
async fn left(gateway: &InProcess, key: &str) -> i64 {
    let admin = gateway.admin.expect("an admin listener");
    let explained = get(admin, &format!("/limits/tpm?key={key}"), &[]).await;
    assert_eq!(explained.status, 200, "{:?}", explained.body);
    explained.json()["remaining"]
        .as_i64()
        .unwrap_or_else(|| panic!("no remaining in {}", explained.json()))
}

#[tokio::test]
async fn a_json_usage_refunds_what_the_reservation_did_not_use() {
    let log = common::log::capture_json();
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, RULE, "")).await;
    // Reserves 300 + 1 (the prompt "hi": 2 bytes, a quarter rounded up).
    let reply = chat(&gateway, "k1", 300, "json", 120).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(
        reply.json()["usage"]["total_tokens"],
        120,
        "the body unchanged"
    );
    assert_eq!(tokens(&gateway, "reserved"), 301.0);
    settled(&gateway, "refunded", 181.0).await;
    assert_eq!(left(&gateway, "k1").await, 1000 - 120);
    // The estimate's error: 120 / 301 is in the 0.5 bucket.
    let ratio = metrics(&gateway);
    let bucket = |le: &str| {
        ratio.value(
            "tollgate_tokens_usage_ratio_bucket",
            &[("route", "chat"), ("le", le)],
        )
    };
    assert_eq!(bucket("0.25"), Some(0.0));
    assert_eq!(bucket("0.5"), Some(1.0));
    // The next request's RateLimit field counts in tokens.
    let reply = chat(&gateway, "k1", 300, "json", 301).await;
    assert_eq!(reply.status, 200);
    let ratelimit = reply.header("ratelimit").expect("a RateLimit field");
    assert!(
        ratelimit.contains("\"tpm\";r=579"),
        "880 - 301 left in tokens: {ratelimit}"
    );
    assert_eq!(left(&gateway, "k1").await, 579, "used what it reserved");
    // The access log has each request's reserved and used tokens.
    // Written when each body ends, just after the client read it.
    let text = log
        .when(|text| text.matches("\"tokens_used\"").count() >= 2)
        .await;
    let lines: Vec<Value> = text
        .lines()
        .filter(|line| line.contains("tollgate::access"))
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .collect();
    let tokens: Vec<(Value, Value)> = lines
        .iter()
        .map(|line| (line["tokens_reserved"].clone(), line["tokens_used"].clone()))
        .collect();
    assert_eq!(
        tokens,
        [(json!(301), json!(120)), (json!(301), json!(301))],
        "{lines:?}"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn the_tokenizer_reserves_the_prompts_exact_count_in_its_models_encoding() {
    let upstream = LlmUpstream::start().await;
    let rule = r#"{ max_tokens_default = 200, prompt = "tokenizer", usage = "auto" }"#;
    let gateway = InProcess::start(&config(&upstream, rule, "")).await;
    // gpt-4o counts in o200k_base: the sentence is 13 tokens; OpenAI's chat
    // formatting adds 3 for the message, 1 for its role and 3 for the reply.
    let body = json!({
        "model": "gpt-4o",
        "max_tokens": 300,
        "messages": [{"role": "user", "content": "Say hello to tollgate, the rate-limiting proxy."}],
    });
    let reply = post(&gateway, "k9", &body, "json", 120).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(tokens(&gateway, "reserved"), (300 + 3 + 1 + 13 + 3) as f64);
    settled(&gateway, "refunded", 200.0).await;
    gateway.stop().await;
}

#[tokio::test]
async fn an_openai_stream_settles_from_its_last_usage_chunk_and_may_leave_debt() {
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, RULE, "")).await;
    let reply = chat(&gateway, "k2", 100, "sse", 1500).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    let text = String::from_utf8(reply.body.to_vec()).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "relayed whole: {text}");
    // Used 1500 of a 101-token reservation: 1399 charged, the balance at
    // -500 (a debt of at most the capacity).
    settled(&gateway, "charged", 1399.0).await;
    assert_eq!(left(&gateway, "k2").await, 0);
    // The next request waits out the debt and its own reservation.
    let reply = chat(&gateway, "k2", 100, "json", 10).await;
    assert_eq!(reply.status, 429, "{:?}", reply.body);
    let detail = reply.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("tpm"), "{detail}");
    assert!(
        detail.contains("101 tokens"),
        "names the reservation: {detail}"
    );
    // And as OpenAI words its own 429s, for the SDKs that show
    // `error.message`.
    let error = &reply.json()["error"];
    assert_eq!(error["message"], detail.as_str(), "{error}");
    assert_eq!(error["type"], "tokens", "{error}");
    assert_eq!(error["code"], "rate_limit_exceeded", "{error}");
    // 500 of debt + 101 tokens at 1000/d: 51,927 s, not one token's 87.
    let retry: u64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert!((51_900..=51_930).contains(&retry), "Retry-After {retry}");
    // A request limit that denied nothing was not charged either.
    gateway.stop().await;
}

#[tokio::test]
async fn an_anthropic_stream_settles_input_plus_output_tokens() {
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, RULE, "")).await;
    // message_start: 30 input; the last message_delta: 60 output.
    let reply = chat(&gateway, "k3", 500, "anthropic", 90).await;
    assert_eq!(reply.status, 200);
    settled(&gateway, "refunded", 411.0).await;
    assert_eq!(left(&gateway, "k3").await, 1000 - 90);
    gateway.stop().await;
}

#[tokio::test]
async fn without_usage_the_reservation_stands_and_is_counted() {
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, RULE, "")).await;
    for (script, key) in [("none", "k4"), ("malformed", "k5")] {
        let reply = chat(&gateway, key, 99, script, 10).await;
        assert_eq!(reply.status, 200);
    }
    settled(&gateway, "unsettled", 200.0).await;
    assert_eq!(left(&gateway, "k4").await, 900);
    assert_eq!(left(&gateway, "k5").await, 900);
    // A stream cut before its usage: the client sees the cut, the
    // reservation stands.
    let body = json!({"max_tokens": 99, "messages": [{"role": "user", "content": "hi"}]});
    let request = Request::post("/v1/chat/completions")
        .header("host", "gateway.test")
        .header("x-api-key", "k6")
        .header("x-script", "cut")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = common::send_streaming(gateway.addr, request).await;
    assert_eq!(response.status(), 200);
    let read = http_body_util::BodyExt::collect(response.into_body()).await;
    assert!(read.is_err(), "the cut reaches the client");
    settled(&gateway, "unsettled", 300.0).await;
    assert_eq!(left(&gateway, "k6").await, 900);
    assert_eq!(tokens(&gateway, "refunded"), 0.0);
    gateway.stop().await;
}

#[tokio::test]
async fn the_explain_endpoint_shows_a_streaming_requests_open_reservation() {
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, RULE, "")).await;
    let admin = gateway.admin.unwrap();
    let body =
        json!({"max_tokens": 99, "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let request = Request::post("/v1/chat/completions")
        .header("host", "gateway.test")
        .header("x-api-key", "k11")
        .header("x-script", "slow")
        .header("x-used", "40")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    // The head arrives at once; the stream takes two seconds.
    let response = common::send_streaming(gateway.addr, request).await;
    assert_eq!(response.status(), 200);
    let explained = get(admin, "/limits/tpm?key=k11", &[]).await.json();
    assert_eq!(explained["unit"], "tokens");
    assert_eq!(
        explained["open_reservations"],
        json!({"requests": 1, "tokens": 100}),
        "{explained}"
    );
    assert_eq!(explained["remaining"], 900, "charged while open");
    let read = http_body_util::BodyExt::collect(response.into_body()).await;
    assert!(read.is_ok());
    settled(&gateway, "refunded", 60.0).await;
    let explained = get(admin, "/limits/tpm?key=k11", &[]).await.json();
    assert_eq!(
        explained["open_reservations"],
        json!({"requests": 0, "tokens": 0})
    );
    assert_eq!(explained["remaining"], 960);
    gateway.stop().await;
}

#[tokio::test]
async fn a_client_that_leaves_mid_stream_is_settled_from_what_the_upstream_sent() {
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, RULE, "")).await;
    let admin = gateway.admin.unwrap();
    let body = json!({"max_tokens": 249, "stream": true, "messages": []});
    let request = Request::post("/v1/chat/completions")
        .header("host", "gateway.test")
        .header("x-api-key", "k14")
        .header("x-script", "slow")
        .header("x-used", "10")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    // The head, then the client goes away before the usage chunk (a second
    // later). The rest of this short stream still fits the socket's
    // buffer, so the gateway relays it to its end, and the scanner reads
    // the usage the upstream reported: the tokens it generated are
    // counted, whoever read them. (A stream whose writes fail first is
    // dropped there: its reservation stands, as for a cut stream.)
    let response = common::send_streaming(gateway.addr, request).await;
    assert_eq!(response.status(), 200);
    drop(response);
    settled(&gateway, "refunded", 239.0).await;
    let explained = get(admin, "/limits/tpm?key=k14", &[]).await.json();
    assert_eq!(explained["remaining"], 990, "{explained}");
    assert_eq!(
        explained["open_reservations"],
        json!({"requests": 0, "tokens": 0}),
        "{explained}"
    );
    assert_eq!(tokens(&gateway, "unsettled"), 0.0);
    gateway.stop().await;
}

#[tokio::test]
async fn a_reload_while_a_stream_is_open_keeps_its_settlement() {
    let upstream = LlmUpstream::start().await;
    let config = config(&upstream, RULE, "");
    let gateway = InProcess::start(&config).await;
    let body = json!({"max_tokens": 199, "stream": true, "messages": []});
    let request = Request::post("/v1/chat/completions")
        .header("host", "gateway.test")
        .header("x-api-key", "k12")
        .header("x-script", "slow")
        .header("x-used", "50")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = common::send_streaming(gateway.addr, request).await;
    assert_eq!(response.status(), 200);
    // A new configuration (another route added) while the stream runs.
    let before = gateway.app.snapshot().generation;
    let reloaded = config.clone()
        + "\n[[routes]]\nname = \"other\"\nmatch = { path = \"/other\" }\nupstream = \"llm\"\n";
    assert!(gateway.reload_with(&reloaded) > before, "the reload took");
    let read = http_body_util::BodyExt::collect(response.into_body()).await;
    assert!(read.is_ok());
    // 199 reserved (no prompt text), 50 used.
    settled(&gateway, "refunded", 149.0).await;
    assert_eq!(
        left(&gateway, "k12").await,
        950,
        "settled on the state the reload kept"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn a_settlement_while_redis_is_down_follows_on_failure() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = LlmUpstream::start().await;
    let store = redis.store_toml("tf:") + "timeout = \"100ms\"\non_failure = \"local\"\n";
    let gateway = InProcess::start_on_wall_time(&config(&upstream, RULE, &store)).await;
    let body = json!({"max_tokens": 299, "stream": true, "messages": []});
    let request = Request::post("/v1/chat/completions")
        .header("host", "gateway.test")
        .header("x-api-key", "k13")
        .header("x-script", "slow")
        .header("x-used", "500")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    // Reserved in Redis; Redis goes away before the stream ends.
    let response = common::send_streaming(gateway.addr, request).await;
    assert_eq!(response.status(), 200);
    redis.kill();
    // The breaker opens on the first failed call.
    let down = common::eventually(async || {
        chat(&gateway, "probe", 1, "json", 2).await;
        gateway.app.store().is_some_and(|store| store.is_down())
    })
    .await;
    assert!(down, "the store never went down");
    let read = http_body_util::BodyExt::collect(response.into_body()).await;
    assert!(read.is_ok());
    // 299 reserved (no prompt text), 500 used.
    settled(&gateway, "charged", 201.0).await;
    // The node's own tpm took the 201 tokens over the reservation (Redis
    // had the reservation, unreachable now): decided locally from here.
    assert_eq!(left(&gateway, "k13").await, 799);
    assert_eq!(chat(&gateway, "k13", 900, "json", 901).await.status, 429);
    assert_eq!(chat(&gateway, "k13", 700, "json", 701).await.status, 200);
    gateway.stop().await;
}

#[tokio::test]
async fn a_reservation_that_does_not_fit_is_denied_and_charges_nothing() {
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, RULE, "")).await;
    // More than the bucket ever holds: never.
    let reply = chat(&gateway, "k7", 5000, "json", 1).await;
    assert_eq!(reply.status, 429);
    assert!(reply.header("retry-after").is_none(), "it can never fit");
    let detail = reply.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("5001"), "{detail}");
    // Fits now, then the next one does not until refilled; the RPM limit
    // stays charged only for what was admitted.
    assert_eq!(chat(&gateway, "k7", 700, "json", 701).await.status, 200);
    let denied = chat(&gateway, "k7", 700, "json", 701).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.json()["violated-policies"], json!(["tpm"]));
    let admin = gateway.admin.unwrap();
    let rpm = get(admin, "/limits/rpm?key=k7", &[]).await.json();
    assert_eq!(rpm["remaining"], 99, "one admitted request: {rpm}");
    assert_eq!(
        tokens(&gateway, "reserved"),
        701.0,
        "denials reserve nothing"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn the_request_limits_of_the_stack_stay_all_or_nothing() {
    let upstream = LlmUpstream::start().await;
    let extra = "";
    let config = config(&upstream, RULE, extra).replace("limit = 100\n", "limit = 2\n");
    let gateway = InProcess::start(&config).await;
    assert_eq!(chat(&gateway, "k8", 10, "json", 11).await.status, 200);
    assert_eq!(chat(&gateway, "k8", 10, "json", 11).await.status, 200);
    let denied = chat(&gateway, "k8", 10, "json", 11).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.json()["violated-policies"], json!(["rpm"]));
    assert_eq!(
        denied.json()["error"]["type"],
        "requests",
        "{:?}",
        denied.body
    );
    assert_eq!(
        left(&gateway, "k8").await,
        1000 - 22,
        "the denial reserved nothing"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn usage_from_a_header_and_the_body_forwarded_unchanged() {
    let upstream = LlmUpstream::start().await;
    let rule = r#"{ max_tokens_default = 50, usage = "header:x-tokens" }"#;
    let gateway = InProcess::start(&config(&upstream, rule, "")).await;
    // No max_tokens: the default; the prompt's text is 40 bytes, 10 tokens.
    let body = json!({"messages": [{"role": "user", "content": "a".repeat(40)}]});
    let reply = post(&gateway, "k9", &body, "header", 25).await;
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.last_body(), body, "forwarded unchanged");
    assert_eq!(tokens(&gateway, "reserved"), 60.0);
    settled(&gateway, "refunded", 35.0).await;
    assert_eq!(left(&gateway, "k9").await, 975);
    gateway.stop().await;
}

/// `POST` of a chat completion request (20 tokens and a one-token
/// prompt: 21 reserved) on a connection of its own, asking for trailers
/// (`TE: trailers`): the answer's raw bytes, read until the gateway
/// closes (`Connection: close`).
async fn chat_raw(gateway: &InProcess, key: &str, script: &str, used: u64) -> String {
    let body = r#"{"max_tokens":20,"messages":[{"role":"user","content":"hi"}]}"#;
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway.test\r\nx-api-key: {key}\r\n\
         x-script: {script}\r\nx-used: {used}\r\nte: trailers\r\nconnection: close, te\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    common::raw(
        gateway.addr,
        request.as_bytes(),
        std::time::Duration::from_secs(10),
    )
    .await
}

#[tokio::test]
async fn usage_from_a_trailer_settles_when_the_body_ends() {
    // hyper's server sends trailers only to a request with `TE: trailers`,
    // which the gateway sends on a route whose usage is a field; over
    // HTTP/2 the stream's trailers frame carries it.
    for http2 in [false, true] {
        let upstream = LlmUpstream::start().await;
        let rule = r#"{ max_tokens_default = 50, usage = "header:x-tokens" }"#;
        let mut text = config(&upstream, rule, "");
        if http2 {
            text = text.replace("[upstreams.llm]\n", "[upstreams.llm]\nhttp2 = true\n");
        }
        let gateway = InProcess::start(&text).await;
        let answer = chat_raw(&gateway, "k1", "trailer", 5).await;
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "http2 {http2}: {answer}"
        );
        // The body as sent, and no trailer section after it: the count is
        // the gateway's, never relayed as a field or trailer.
        assert!(
            answer.ends_with("\r\n\r\n1\r\no\r\n1\r\nk\r\n0\r\n\r\n"),
            "{answer}"
        );
        assert!(
            !answer.to_ascii_lowercase().contains("x-tokens"),
            "{answer}"
        );
        assert_eq!(tokens(&gateway, "reserved"), 21.0);
        settled(&gateway, "refunded", 16.0).await;
        assert_eq!(tokens(&gateway, "unsettled"), 0.0);
        assert_eq!(left(&gateway, "k1").await, 1000 - 5, "http2 {http2}");
        // A header in the head still settles at once, and a body with
        // neither header nor trailer stands unsettled.
        assert_eq!(chat(&gateway, "k1", 20, "header", 9).await.status, 200);
        settled(&gateway, "refunded", 16.0 + 12.0).await;
        assert_eq!(chat(&gateway, "k1", 20, "none", 9).await.status, 200);
        settled(&gateway, "unsettled", 21.0).await;
        assert_eq!(left(&gateway, "k1").await, 1000 - 5 - 9 - 21);
        gateway.stop().await;
    }
}

/// An HTTP/1.1 upstream that answers its `n`th request (all connections)
/// with `answers[n]`'s bytes exactly, and closes a connection after an
/// answer that ends with `close`.
async fn scripted_raw_upstream(
    answers: Vec<Vec<u8>>,
) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (answers, next) = (Arc::new(answers), Arc::new(AtomicUsize::new(0)));
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (answers, next) = (answers.clone(), next.clone());
            tokio::spawn(async move {
                let (mut unparsed, mut buf) = (Vec::new(), vec![0u8; 16 * 1024]);
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    unparsed.extend_from_slice(&buf[..n]);
                    while let Some(len) = common::raw_request_len(&unparsed) {
                        unparsed.drain(..len);
                        let n = next.fetch_add(1, Ordering::SeqCst);
                        let answer = &answers[n.min(answers.len() - 1)];
                        if stream.write_all(answer).await.is_err() || answer.ends_with(b"close") {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, task)
}

#[tokio::test]
async fn a_usage_trailer_is_read_exactly_and_a_hostile_one_settles_nothing() {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n";
    let answer = |trailers: &str| format!("{head}{trailers}").into_bytes();
    let (addr, _task) = scripted_raw_upstream(vec![
        // Read: whitespace around the count, any case of the name, other
        // fields beside it.
        answer("X-Other: 1\r\nX-TOKENS: \t 7 \r\n\r\n"),
        // Two counts: nothing certain, the reservation stands.
        answer("x-tokens: 7\r\nx-tokens: 7\r\n\r\n"),
        // Not a whole number.
        answer("x-tokens: 7 tokens\r\n\r\n"),
        // An obs-folded line: refused, the stream is cut.
        answer("x-tokens: 7\r\n 8\r\n\r\n"),
        // A bare LF in the trailer section: refused.
        answer("x-tokens: 7\n\r\n"),
        // A name with a space before the colon: refused.
        answer("x-tokens : 7\r\n\r\n"),
        // Glued bytes after the body: the count is read, the connection
        // not reused.
        [
            answer("x-tokens: 3\r\n\r\n"),
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_vec(),
        ]
        .concat(),
        answer("x-tokens: 4\r\n\r\n"),
    ])
    .await;
    let rule = r#"{ max_tokens_default = 50, usage = "header:x-tokens" }"#;
    let gateway = InProcess::start(&config_at(&format!("http://{addr}"), rule, "")).await;
    let mut used = 0;
    let mut unsettled = 0.0;
    // The case, what it settles, and whether the client's stream is
    // whole (a refused trailer section cuts it).
    for (case, settles, whole) in [
        ("read", Some(7), true),
        ("two counts", None, true),
        ("not a count", None, true),
        ("folded", None, false),
        ("bare LF", None, false),
        ("space before colon", None, false),
        ("glued bytes", Some(3), true),
        ("the next connection", Some(4), true),
    ] {
        let answer = chat_raw(&gateway, "k2", "any", 0).await;
        let ended = answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok\r\n0\r\n\r\n");
        assert_eq!(ended, whole, "{case}: {answer:?}");
        assert!(
            !answer.to_ascii_lowercase().contains("x-tokens"),
            "{case}: {answer}"
        );
        match settles {
            Some(count) => used += count,
            None => {
                used += 21;
                unsettled += 21.0;
            }
        }
        settled(&gateway, "unsettled", unsettled).await;
        assert_eq!(left(&gateway, "k2").await, 1000 - used, "{case}");
    }
    gateway.stop().await;
}

#[tokio::test]
async fn include_usage_asks_a_streamed_openai_request_for_its_usage() {
    let upstream = LlmUpstream::start().await;
    let rule = r#"{ max_tokens_default = 50, include_usage = true }"#;
    let gateway = InProcess::start(&config(&upstream, rule, "")).await;
    let body = json!({"model": "m", "stream": true, "max_tokens": 20,
                      "messages": [{"role": "user", "content": "hi"}]});
    let reply = post(&gateway, "k10", &body, "sse", 15).await;
    assert_eq!(reply.status, 200);
    let seen = upstream.last_body();
    assert_eq!(seen["stream_options"]["include_usage"], true, "{seen}");
    assert_eq!(seen["messages"], body["messages"]);
    settled(&gateway, "refunded", 6.0).await;
    // A request that is not streamed is forwarded as it is.
    let plain = json!({"max_tokens": 20, "messages": []});
    assert_eq!(post(&gateway, "k10", &plain, "json", 20).await.status, 200);
    assert_eq!(upstream.last_body(), plain);
    gateway.stop().await;
}

#[test]
fn token_limits_need_a_rule_and_an_algorithm_that_counts_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        r#"[server]
listen = "127.0.0.1:0"

[upstreams.llm]
url = "http://127.0.0.1:9"

[limits.tpm]
key = "ip"
algorithm = "token_bucket"
capacity = 10
refill = "10/m"
unit = "tokens"

[limits.log]
key = "ip"
algorithm = "sliding_log"
limit = 10
window = "1m"
unit = "token"

[limits.log_tokens]
key = "ip"
algorithm = "sliding_log"
limit = 10
window = "1m"
unit = "tokens"

[[routes]]
name = "chat"
match = { path_prefix = "/" }
upstream = "llm"
limits = ["tpm"]
"#,
    )
    .unwrap();
    let (code, _, stderr) = tollgate(&["check", "-c", path.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("`tpm` counts tokens") && stderr.contains("tokens = {"),
        "{stderr}"
    );
    assert!(stderr.contains("limits.log.unit"), "{stderr}");
    assert!(stderr.contains("sliding_log keeps every unit"), "{stderr}");
}

#[tokio::test]
async fn two_gateways_on_redis_settle_into_one_budget() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = LlmUpstream::start().await;
    let store = redis.store_toml("tk:");
    let config = config(&upstream, RULE, &store);
    let a = InProcess::start_on_wall_time(&config).await;
    let b = InProcess::start_on_wall_time(&config).await;
    // a reserves 401 and uses 100: 300 refunded in Redis.
    assert_eq!(chat(&a, "r1", 400, "json", 100).await.status, 200);
    settled(&a, "refunded", 301.0).await;
    // The settlement is its own script call, sent after the response.
    script_calls_reach(&redis, 2).await;
    // b sees the settled balance: 900 left; it takes 899 of them.
    let reply = chat(&b, "r1", 898, "sse", 898 + 1).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(tokens(&b, "reserved"), 899.0);
    assert_eq!(
        chat(&a, "r1", 1, "json", 1).await.status,
        429,
        "the budget is one"
    );
    // A charge beyond the reservation reaches Redis too.
    assert_eq!(chat(&a, "r2", 10, "sse", 811).await.status, 200);
    settled(&a, "charged", 800.0).await;
    script_calls_reach(&redis, 6).await;
    let reply = chat(&b, "r2", 200, "json", 1).await;
    assert_eq!(reply.status, 429, "811 used, 200 more do not fit");
    assert_eq!(chat(&b, "r2", 180, "json", 181).await.status, 200);
    a.stop().await;
    b.stop().await;
}

/// Waits until Redis has run `n` script calls (`EVALSHA`: decisions and
/// settlements).
async fn script_calls_reach(redis: &Redis, n: u64) {
    let calls = || {
        redis
            .cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let reached = common::eventually(async || calls() >= n).await;
    assert!(reached, "{} script calls, expected {n}", calls());
}

#[tokio::test]
async fn on_redis_cluster_reservations_and_settlements_cross_slots() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let cluster = common::redis::Cluster::start(3, 0);
    let upstream = LlmUpstream::start().await;
    let urls = cluster.toml_urls();
    let store = format!(
        "[store]\nbackend = \"redis\"\ncluster = true\nurl = [{urls}]\ntimeout = \"500ms\"\n"
    );
    // tpm keyed with the route too: its key's digest, and so its slot,
    // differs from rpm's, and a stack spans two slots.
    let config = config(&upstream, RULE, &store).replacen(
        "key = \"header:x-api-key\"\nalgorithm = \"token_bucket\"",
        "key = [\"header:x-api-key\", \"route\"]\nalgorithm = \"token_bucket\"",
        1,
    );
    assert!(config.contains("[\"header:x-api-key\", \"route\"]"));
    let a = InProcess::start_on_wall_time(&config).await;
    let b = InProcess::start_on_wall_time(&config).await;
    assert_eq!(chat(&a, "c1", 500, "json", 100).await.status, 200);
    settled(&a, "refunded", 401.0).await;
    // b sees the refund once the settlement's call has landed.
    let fits = common::eventually(async || {
        let reply = chat(&b, "c1", 899, "json", 900).await;
        reply.status == 200
    })
    .await;
    assert!(fits, "the refund never reached the cluster");
    assert_eq!(chat(&a, "c1", 1, "json", 2).await.status, 429, "one budget");
    let keys = cluster.keys();
    assert!(keys.iter().any(|k| k.contains(":tpm:")), "{keys:?}");
    a.stop().await;
    b.stop().await;
}

/// A request of `key` for the `long` script (`mib` MiB of text chunks,
/// then the usage chunk reporting `used`), written raw: the client reads
/// the answer itself, as slowly as it likes, or leaves.
fn long_request(key: &str, mib: u64, used: u64) -> Vec<u8> {
    let body = json!({"max_tokens": 249, "stream": true, "messages": []}).to_string();
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway.test\r\ncontent-type: application/json\r\nx-api-key: {key}\r\nx-script: long\r\nx-mib: {mib}\r\nx-used: {used}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The resident memory of process `pid`, in bytes (Linux's `VmRSS`).
fn resident(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

#[tokio::test]
#[cfg_attr(not(target_os = "linux"), ignore = "reads /proc")]
async fn a_long_stream_is_relayed_in_constant_memory_and_settled_at_its_end() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MIB: u64 = 32;
    let upstream = LlmUpstream::start().await;
    let gateway = common::Gateway::start(&config(&upstream, RULE, ""));
    let admin = gateway.admin.expect("admin");
    // Warm: a first stream, so the baseline has the pools and buffers a
    // stream needs.
    let read_all = async |key: &str, mib: u64, pause_after: Option<u64>| {
        let mut stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
        stream
            .write_all(&long_request(key, mib, 100))
            .await
            .unwrap();
        let (mut received, mut peak) = (0u64, 0u64);
        let mut buffer = vec![0u8; 64 * 1024];
        let mut paused = false;
        loop {
            let n = stream.read(&mut buffer).await.expect("read");
            if n == 0 {
                break;
            }
            received += n as u64;
            if received % (1 << 20) < n as u64 {
                peak = peak.max(resident(gateway.pid()));
            }
            if let Some(after) = pause_after
                && !paused
                && received > after
            {
                // The client stops reading for a while: the upstream goes
                // on writing, and the gateway must wait, not buffer.
                paused = true;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                peak = peak.max(resident(gateway.pid()));
            }
        }
        (received, peak)
    };
    let (received, _) = read_all("warm", 1, None).await;
    assert!(received > 1 << 20, "{received}");
    let baseline = resident(gateway.pid());
    let (received, peak) = read_all("k40", MIB, Some(4 << 20)).await;
    assert!(received > MIB << 20, "the whole stream: {received} bytes");
    let grew = peak.saturating_sub(baseline);
    assert!(
        grew < 8 << 20,
        "resident memory grew {grew} bytes while relaying {MIB} MiB (from {baseline})"
    );
    // Its usage, at the end of the stream, settled it: 249 reserved, 100
    // used.
    let done = common::eventually(async || {
        get(admin, "/limits/tpm?key=k40", &[]).await.json()["remaining"] == 900
    })
    .await;
    assert!(
        done,
        "{}",
        get(admin, "/limits/tpm?key=k40", &[]).await.json()
    );
}

#[tokio::test]
async fn a_long_stream_whose_client_leaves_keeps_its_reservation() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, RULE, "")).await;
    let mut stream = tokio::net::TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(&long_request("k41", 64, 100))
        .await
        .unwrap();
    let mut buffer = vec![0u8; 64 * 1024];
    let mut received = 0;
    while received < 256 * 1024 {
        let n = stream.read(&mut buffer).await.expect("read");
        assert!(n > 0, "the stream ended after {received} bytes");
        received += n;
    }
    // The client goes with most of the 64 MiB unread: the gateway's writes
    // fail, the body is dropped before any usage arrived, and the
    // reservation stands, counted.
    drop(stream);
    // (249: max_tokens, and no prompt.)
    settled(&gateway, "unsettled", 249.0).await;
    assert_eq!(tokens(&gateway, "refunded"), 0.0);
    assert_eq!(left(&gateway, "k41").await, 751);
    let admin = gateway.admin.unwrap();
    let explained = get(admin, "/limits/tpm?key=k41", &[]).await.json();
    assert_eq!(
        explained["open_reservations"],
        json!({"requests": 0, "tokens": 0}),
        "{explained}"
    );
    // The gateway and its upstream pool go on.
    assert_eq!(chat(&gateway, "k41", 99, "json", 50).await.status, 200);
    settled(&gateway, "refunded", 50.0).await;
    assert_eq!(left(&gateway, "k41").await, 701);
    gateway.stop().await;
}

/// The run-long bound of token limits: three clients, one after another
/// each (the next request once the last one has ended), ask for 99
/// tokens (a reservation of 100) and use 150, for `run`, through
/// `gateways` in turn, on a bucket of 300 refilled 200 a second. The
/// tokens each key's admitted requests used stay within what the bucket
/// gave (300 + 200 a second of the run) plus one reservation's
/// overshoot (50); without the debt, 1.5 times that would pass.
///
/// Below, bounds that hold however slow the machine (a loaded one serves
/// fewer requests in the run, and a throughput bound would flake): the
/// bucket's capacity went to the first two requests at once (300 of 300:
/// the first two calls, whatever their speed), and after the run, once the
/// bucket has refilled more than any debt and a reservation (1.5 s: 300
/// tokens), the key is admitted again.
async fn admitted_tokens_follow_the_limit(gateways: &[&InProcess]) {
    let run = std::time::Duration::from_secs(3);
    let started = std::time::Instant::now();
    let client = async |k: usize| {
        let key = format!("run{k}");
        let (mut used, mut denied) = (0u64, 0u64);
        let mut first_two = Vec::new();
        let mut turn = k;
        while started.elapsed() < run {
            let gateway = gateways[turn % gateways.len()];
            turn += 1;
            let reply = chat(gateway, &key, 99, "sse", 150).await;
            if first_two.len() < 2 {
                first_two.push(reply.status);
            }
            match reply.status {
                200 => used += 150,
                429 => {
                    denied += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                other => panic!("{other}: {:?}", reply.body),
            }
        }
        assert_eq!(
            first_two,
            [200, 200],
            "{key}: the bucket's capacity, at once"
        );
        (key, used, denied)
    };
    let results = tokio::join!(client(0), client(1), client(2));
    let results = [results.0, results.1, results.2];
    let elapsed = started.elapsed().as_secs_f64();
    let given = 300.0 + 200.0 * elapsed;
    for (key, used, denied) in results {
        let used = used as f64;
        assert!(
            used <= given + 50.0,
            "{key}: {used} tokens admitted in {elapsed:.2} s, the bucket gave {given:.0} (+50)"
        );
        assert!(denied > 0, "{key}: the limit never bound");
    }
    // Refilled past any debt: each key is admitted again.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    for (k, gateway) in (0..3).zip(gateways.iter().cycle()) {
        let reply = chat(gateway, &format!("run{k}"), 99, "sse", 150).await;
        assert_eq!(
            reply.status, 200,
            "run{k} after the refill: {:?}",
            reply.body
        );
    }
}

/// The tpm bucket of [`config`], at 300 refilled 200 a second.
fn refilling(config: String) -> String {
    let refilling = config.replacen(
        "capacity = 1000\nrefill = \"1000/d\"",
        "capacity = 300\nrefill = \"200/s\"",
        1,
    );
    assert_ne!(refilling, config);
    refilling
}

#[tokio::test]
async fn over_a_run_admitted_tokens_stay_within_the_limit_plus_one_overshoot() {
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&refilling(config(&upstream, RULE, ""))).await;
    admitted_tokens_follow_the_limit(&[&gateway]).await;
    gateway.stop().await;
}

#[tokio::test]
async fn over_a_run_two_gateways_on_redis_stay_within_the_same_bound() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = LlmUpstream::start().await;
    let store = redis.store_toml("run:");
    let config = refilling(config(&upstream, RULE, &store));
    let a = InProcess::start_on_wall_time(&config).await;
    let b = InProcess::start_on_wall_time(&config).await;
    admitted_tokens_follow_the_limit(&[&a, &b]).await;
    a.stop().await;
    b.stop().await;
}
