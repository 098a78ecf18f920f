//! The official `openai` Python SDK as the client of token quotas: its
//! `chat.completions.create`, plain and streamed, through tollgate in front
//! of the scripted upstream (`common::llm`, its `openai` script, which
//! answers as OpenAI does), parses every answer as the upstream sent it,
//! and the gateway settles each from the usage it carried; a `429` of a
//! token limit is one the SDK's own retries wait out from `Retry-After`,
//! or raise as `openai.RateLimitError` when it has none left.
//!
//! The client is `tests/support/openai_client.py`, run by the interpreter
//! `common::needs::python` names (`TOLLGATE_TEST_PYTHON`, else `python3`) with a plan of
//! calls; it prints, as JSON, what the SDK returned or raised for each.
//! The gateway and the upstream run on the test's runtime, unpaused (the
//! SDK waits on the wall clock), while the script runs on a blocking thread.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use common::InProcess;
use common::llm::{self, LlmUpstream, metrics, settled, tokens};

const CLIENT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/support/openai_client.py"
);

const NEEDS: &str = "needs the openai Python package: python3 -m venv DIR && \
     DIR/bin/pip install openai, then TOLLGATE_TEST_PYTHON=DIR/bin/python";

/// A gateway in front of `upstream`: a TPM limit per API key (the SDK
/// sends it as `Authorization: Bearer`) with `capacity` tokens refilled at
/// `refill`, and the route's token rule `tokens`.
fn config(upstream: &LlmUpstream, capacity: u64, refill: &str, tokens: &str) -> String {
    let tpm = format!(
        r#"[limits.tpm]
key = "header:authorization"
algorithm = "token_bucket"
capacity = {capacity}
refill = "{refill}"
unit = "tokens"
"#
    );
    let route = llm::chat_route(r#""tpm""#, tokens);
    llm::gateway_toml(&upstream.url(), "", &format!("{tpm}\n{route}"))
}

const RULE: &str = r#"{ max_tokens_default = 200, prompt = "bytes/4", usage = "auto" }"#;

/// A bucket that only refills in a day: every count is exact.
const SLOW: &str = "1000/d";

/// A call of the plan: `create(**request)` with the upstream's script
/// headers, answered with `used` tokens.
fn call(name: &str, request: Value, script: &str, used: u64) -> Value {
    json!({
        "name": name,
        "request": request,
        "headers": {"x-script": script, "x-used": used.to_string()},
    })
}

/// A chat request of `max_tokens` whose prompt ("hi") is one token.
fn chat(max_tokens: u64) -> Value {
    json!({
        "model": "gpt-test",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hi"}],
    })
}

/// Runs the SDK's client with `calls` against `gateway`, keyed `key`; what
/// it made of each call, in order. The script runs on a blocking thread,
/// so the gateway and the upstream keep serving meanwhile.
async fn sdk(gateway: &InProcess, key: &str, calls: Vec<Value>) -> Vec<Value> {
    let plan = json!({
        "base_url": format!("http://{}/v1", gateway.addr),
        "api_key": key,
        "calls": calls,
    });
    let out = tempfile::tempdir().expect("tempdir");
    let (stdout, stderr) = (out.path().join("stdout"), out.path().join("stderr"));
    let python = common::needs::python();
    let mut child = Command::new(&python)
        .arg(CLIENT)
        .arg(plan.to_string())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|error| panic!("{python}: {error}; {NEEDS}"));
    let status = tokio::task::spawn_blocking(move || {
        let status = common::wait_exit(&mut child, Duration::from_secs(90));
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        status
    })
    .await
    .expect("the waiting thread");
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    let (printed, errors) = (read(&stdout), read(&stderr));
    match status {
        Some(status) if status.success() => {}
        Some(status) if errors.contains("No module named 'openai'") => {
            panic!("{python} cannot import openai ({status}): {NEEDS}")
        }
        Some(status) => panic!("the client failed ({status}): {errors}{printed}"),
        None => panic!("the client did not finish in 90 s: {errors}{printed}"),
    }
    let reports: Value = serde_json::from_str(&printed)
        .unwrap_or_else(|error| panic!("the client printed no JSON ({error}): {printed}{errors}"));
    reports.as_array().expect("a list of reports").clone()
}

/// A decision counter of the `tpm` limit: `allowed` or `denied`.
fn decisions(gateway: &InProcess, outcome: &str) -> f64 {
    metrics(gateway).sum(
        "tollgate_ratelimit_decisions_total",
        &[("route", "chat"), ("limit", "tpm"), ("outcome", outcome)],
    )
}

/// The JSON of each `data:` event of the upstream's last stream but the
/// closing `[DONE]`: the chunks as they were sent.
fn sent_chunks(upstream: &LlmUpstream) -> Vec<Value> {
    upstream
        .last_answer()
        .split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).expect("a JSON chunk"))
        .collect()
}

/// What the SDK made of a call that did not fail.
fn succeeded(report: &Value) -> &Value {
    assert!(report.get("error").is_none(), "the SDK raised: {report:#}");
    &report["typed"]
}

#[tokio::test]
async fn a_completion_reaches_the_sdk_unchanged_and_is_settled() {
    if common::needs::skip(common::needs::OPENAI) {
        return;
    }
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, 1000, SLOW, RULE)).await;
    // Reserves 300 + 1 (the prompt "hi"), uses 40 + 80.
    let reports = sdk(
        &gateway,
        "sk-1",
        vec![call("plain", chat(300), "openai", 120)],
    )
    .await;
    let typed = succeeded(&reports[0]);
    let sent: Value = serde_json::from_str(&upstream.last_answer()).expect("a JSON answer");
    assert_eq!(
        reports[0]["completion"], sent,
        "parsed as the upstream sent it"
    );
    assert_eq!(typed["content"], "Hello");
    assert_eq!(typed["finish_reason"], "stop");
    assert_eq!(typed["model"], "gpt-test");
    assert_eq!(
        typed["usage"],
        json!({"prompt_tokens": 40, "completion_tokens": 80, "total_tokens": 120})
    );
    assert_eq!(tokens(&gateway, "reserved"), 301.0);
    settled(&gateway, "refunded", 181.0).await;
    gateway.stop().await;
}

#[tokio::test]
async fn a_stream_with_include_usage_yields_every_chunk_and_is_settled_from_the_last() {
    if common::needs::skip(common::needs::OPENAI) {
        return;
    }
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, 1000, SLOW, RULE)).await;
    let mut request = chat(100);
    request["stream"] = json!(true);
    request["stream_options"] = json!({"include_usage": true});
    let reports = sdk(
        &gateway,
        "sk-2",
        vec![call("stream", request, "openai", 30)],
    )
    .await;
    let typed = succeeded(&reports[0]);
    assert_eq!(
        reports[0]["chunks"],
        json!(sent_chunks(&upstream)),
        "each chunk as sent"
    );
    assert_eq!(typed["content"], "Hello");
    assert_eq!(typed["finish_reason"], "stop");
    assert_eq!(typed["without_choices"], 1, "the usage chunk");
    assert_eq!(
        typed["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30})
    );
    // 101 reserved, 30 used; the chunks before the last say `"usage": null`.
    settled(&gateway, "refunded", 71.0).await;
    assert_eq!(tokens(&gateway, "unsettled"), 0.0);
    gateway.stop().await;
}

#[tokio::test]
async fn include_usage_on_the_route_settles_a_stream_the_sdk_did_not_ask_usage_for() {
    if common::needs::skip(common::needs::OPENAI) {
        return;
    }
    let mut request = chat(100);
    request["stream"] = json!(true);
    // Without the rule: the upstream sends no usage, the reservation stands.
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, 1000, SLOW, RULE)).await;
    let reports = sdk(
        &gateway,
        "sk-3",
        vec![call("bare", request.clone(), "openai", 30)],
    )
    .await;
    assert_eq!(succeeded(&reports[0])["usage"], Value::Null);
    settled(&gateway, "unsettled", 101.0).await;
    gateway.stop().await;
    // With it: the gateway asks for the usage on the client's behalf.
    let rule = r#"{ max_tokens_default = 200, include_usage = true }"#;
    let gateway = InProcess::start(&config(&upstream, 1000, SLOW, rule)).await;
    let reports = sdk(&gateway, "sk-3", vec![call("asked", request, "openai", 30)]).await;
    let typed = succeeded(&reports[0]);
    let seen = upstream.last_body();
    assert_eq!(
        seen["stream_options"],
        json!({"include_usage": true}),
        "{seen}"
    );
    // What the client sees: the stream OpenAI sends a client that asked —
    // `"usage": null` on each chunk, then one more chunk with
    // `choices: []` and the usage — which the SDK yields like any other,
    // its `chunk.usage` set on that last one only.
    assert_eq!(reports[0]["chunks"], json!(sent_chunks(&upstream)));
    assert_eq!(typed["content"], "Hello");
    assert_eq!(typed["without_choices"], 1);
    assert_eq!(typed["usage"]["total_tokens"], 30);
    settled(&gateway, "refunded", 71.0).await;
    gateway.stop().await;
}

#[tokio::test]
async fn the_sdk_waits_out_a_token_429_by_its_retry_after_or_raises_rate_limit_error() {
    if common::needs::skip(common::needs::OPENAI) {
        return;
    }
    let upstream = LlmUpstream::start().await;
    // 100 tokens, 50 a second: a 91-token reservation on an empty bucket
    // fits in 1.82 s, `Retry-After: 2`.
    let gateway = InProcess::start(&config(&upstream, 100, "50/s", RULE)).await;
    let retried = |name: &str, max_retries: u64| {
        let mut call = call(name, chat(90), "openai", 91);
        call["max_retries"] = json!(max_retries);
        call
    };
    let reports = sdk(
        &gateway,
        "sk-4",
        vec![
            // Reserves 91, uses 100: the bucket is empty.
            call("fill", chat(90), "openai", 100),
            // Denied, then admitted on the SDK's retry 2 s later.
            retried("retried", 2),
            // Denied again, and no retry left.
            retried("raised", 0),
        ],
    )
    .await;
    succeeded(&reports[0]);
    let typed = succeeded(&reports[1]);
    assert_eq!(typed["usage"]["total_tokens"], 91);
    let waited = reports[1]["seconds"].as_f64().expect("seconds");
    // The SDK's own backoff would be at most 0.5 s: it read Retry-After.
    assert!(waited >= 1.5, "the retry came after {waited} s");
    println!("max_retries=2: admitted after {waited:.2} s");
    let error = &reports[2]["error"];
    assert_eq!(error["class"], "RateLimitError", "{:#}", reports[2]);
    assert_eq!(error["status_code"], 429);
    println!("max_retries=0 raised: {error}");
    // The SDK words its message from OpenAI's `error.message`, which a
    // token stack's 429 carries beside its problem details: tollgate's
    // detail, naming the limit and the reservation; the error's `body` is
    // that `error` object.
    let message = error["message"].as_str().expect("a message");
    assert!(
        message.starts_with("Error code: 429 - limit tpm exceeded"),
        "{message}"
    );
    assert!(
        message.contains("91 tokens"),
        "names the reservation: {message}"
    );
    assert_eq!(error["body"]["type"], "tokens", "{error:#}");
    assert_eq!(error["body"]["code"], "rate_limit_exceeded", "{error:#}");
    assert_eq!(decisions(&gateway, "denied"), 2.0);
    assert_eq!(decisions(&gateway, "allowed"), 2.0);
    settled(&gateway, "charged", 9.0).await;
    gateway.stop().await;
}

/// A gateway in front of `upstream` whose route has a spend budget of
/// `dollars` per API key, gpt-4o priced as OpenAI does.
fn budget_config(upstream: &LlmUpstream, dollars: &str) -> String {
    let spend = format!(
        r#"[prices."gpt-4o"]
input = 2.50
output = 10.00
cached_input = 1.25

[limits.spend]
key = "header:authorization"
algorithm = "fixed_window"
limit = {dollars}
window = "30d"
unit = "usd"
"#
    );
    let route = llm::chat_route(r#""spend""#, RULE);
    llm::gateway_toml(
        &upstream.url(),
        "admin = \"127.0.0.1:0\"",
        &format!("{spend}\n{route}"),
    )
}

#[tokio::test]
async fn the_sdk_is_charged_its_priced_usage_and_raises_a_spent_budget() {
    if common::needs::skip(common::needs::OPENAI) {
        return;
    }
    let upstream = LlmUpstream::start().await;
    // $0.03 = 30,000 µ$. A gpt-4o request of max_tokens 1000 reserves
    // 1 × 2.5 + 1000 × 10 → 10,003 µ$.
    let gateway = InProcess::start(&budget_config(&upstream, "0.03")).await;
    let gpt4o = |stream: bool| {
        let mut request = json!({
            "model": "gpt-4o",
            "max_tokens": 1000,
            "messages": [{"role": "user", "content": "hi"}],
        });
        if stream {
            request["stream"] = json!(true);
            request["stream_options"] = json!({"include_usage": true});
        }
        request
    };
    // 1,200 prompt tokens, 1,000 from the cache, and 800 completion:
    // 200 × 2.5 + 1,000 × 1.25 + 800 × 10 = 9,750 µ$ each.
    let cached = |name: &str, stream: bool| {
        let mut call = call(name, gpt4o(stream), "openai", 2_000);
        call["headers"]["x-prompt"] = json!("1200");
        call["headers"]["x-cached"] = json!("1000");
        call
    };
    let reports = sdk(
        &gateway,
        "sk-b",
        vec![
            cached("plain", false),
            cached("streamed", true),
            // 19,500 spent + 10,003 fits; then 29,250 + 10,003 does not.
            cached("third", false),
            cached("refused", false),
        ],
    )
    .await;
    let typed = succeeded(&reports[0]);
    assert_eq!(
        typed["usage"]["prompt_tokens_details"]["cached_tokens"], 1000,
        "the SDK reads the cached count the gateway priced"
    );
    let streamed = succeeded(&reports[1]);
    assert_eq!(streamed["usage"]["total_tokens"], 2000);
    succeeded(&reports[2]);
    let error = &reports[3]["error"];
    assert_eq!(error["class"], "RateLimitError", "{:#}", reports[3]);
    assert_eq!(error["status_code"], 429);
    assert_eq!(error["body"]["code"], "insufficient_quota", "{error:#}");
    let message = error["message"].as_str().expect("a message");
    assert!(
        message.contains("limit spend exceeded: the request may cost up to $0.010003"),
        "{message}"
    );
    // What the budget holds: three settled requests, exactly.
    let admin = gateway.admin.expect("an admin listener");
    let spent = common::eventually(async || {
        let explained = common::get(admin, "/limits/spend?key=Bearer%20sk-b", &[])
            .await
            .json();
        explained["budget"]["spent_usd"] == "0.02925"
    })
    .await;
    assert!(spent, "3 × 9,750 µ$ spent");
    gateway.stop().await;
}
