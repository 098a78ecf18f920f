//! Spend budgets (`unit = "usd"`, `[prices]`) end to end through real
//! sockets, in front of the scripted OpenAI- and Anthropic-compatible
//! upstream (`common::llm`): a request reserves its model's price of its
//! prompt estimate (input) and its `max_tokens` (output), in integer
//! micro-dollars; its response's usage settles the difference, its cached
//! prompt tokens at the cached price. Admitted and refused at exactly the
//! request the arithmetic says, with the 429 naming the budget, the most
//! the request would cost and when the budget resets; `X-Budget-Warning`
//! past `warn_at`; an unpriced model refused 400 before the upstream; two
//! gateways on one Redis sharing one budget.

mod common;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use serde_json::{Value, json};

use common::llm::LlmUpstream;
use common::redis::Redis;
use common::{InProcess, Reply, get, send};

/// gpt-4o's prices: a prompt token 2.5 µ$, a cached one 1.25 µ$, a
/// completion token 10 µ$.
const PRICES: &str = r#"
[prices."gpt-4o"]
input = 2.50
output = 10.00
cached_input = 1.25
"#;

/// A gateway in front of `upstream` with a budget of `dollars` per tenant
/// (`x-tenant`) a 30-day window, warning at 80 %; `extra` more config.
fn config(upstream: &LlmUpstream, dollars: &str, extra: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1

[upstreams.llm]
url = "{url}"

[limits.monthly_spend]
key = "header:x-tenant"
algorithm = "fixed_window"
limit = {dollars}
window = "30d"
unit = "usd"
warn_at = "80%"

[[routes]]
name = "chat"
match = {{ path = "/v1/chat/completions", methods = ["POST"] }}
upstream = "llm"
limits = ["monthly_spend"]
tokens = {{ max_tokens_default = 200, prompt = "bytes/4", usage = "auto" }}

{extra}
"#,
        url = upstream.url()
    )
}

/// The usage the upstream reports: `prompt` tokens of which `cached` came
/// from the cache, and `completion`.
#[derive(Clone, Copy)]
struct Used {
    prompt: u64,
    cached: u64,
    completion: u64,
}

/// A chat request of `tenant` for `model` asking for `max_tokens`, its
/// prompt ("hi") one token, answered as `script` with `used`.
async fn chat(
    gateway: &InProcess,
    tenant: &str,
    model: &str,
    max_tokens: u64,
    script: &str,
    used: Used,
) -> Reply {
    let body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hi"}],
    });
    post(
        gateway,
        "/v1/chat/completions",
        tenant,
        body,
        script,
        used,
        0,
    )
    .await
}

/// A request of `tenant` to `path` with `body` (JSON), answered as `script`
/// with `used` of which `creation` prompt tokens were written to the
/// cache.
async fn post(
    gateway: &InProcess,
    path: &str,
    tenant: &str,
    body: Value,
    script: &str,
    used: Used,
    creation: u64,
) -> Reply {
    let request = Request::post(path)
        .header("host", "gateway.test")
        .header("content-type", "application/json")
        .header("x-tenant", tenant)
        .header("x-script", script)
        .header("x-used", (used.prompt + used.completion).to_string())
        .header("x-prompt", used.prompt.to_string())
        .header("x-cached", used.cached.to_string())
        .header("x-cache-creation", creation.to_string())
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    send(gateway.addr, request).await
}

/// The explain endpoint's view of `tenant`'s budget.
async fn budget(gateway: &InProcess, tenant: &str) -> Value {
    let admin = gateway.admin.expect("an admin listener");
    let explained = get(admin, &format!("/limits/monthly_spend?key={tenant}"), &[]).await;
    assert_eq!(explained.status, 200, "{:?}", explained.body);
    explained.json()
}

/// Waits until `tenant` has spent exactly `micros` micro-dollars (a
/// settlement runs when the response body ends, just after the client
/// read it), and nothing is reserved.
async fn spent(gateway: &InProcess, tenant: &str, micros: u64) {
    let mut last = Value::Null;
    let done = common::eventually(async || {
        last = budget(gateway, tenant).await;
        let quota = last["quota"].as_u64().unwrap_or(0);
        let remaining = last["remaining"].as_u64().unwrap_or(u64::MAX);
        quota.checked_sub(remaining) == Some(micros) && last["open_reservations"]["requests"] == 0
    })
    .await;
    assert!(done, "expected {micros} µ$ spent: {last:#}");
}

#[tokio::test]
async fn a_budget_admits_and_refuses_at_exactly_the_request_its_prices_say() {
    let upstream = LlmUpstream::start().await;
    // $0.05 = 50,000 µ$ (5 cents).
    let gateway = InProcess::start(&config(&upstream, "0.05", PRICES)).await;
    // Each request reserves 1 × 2.5 + 1000 × 10 = 10,002.5, rounded up to
    // 10,003 µ$, and uses 1 + 500 tokens: 5,002.5, charged 5,003 µ$.
    let used = Used {
        prompt: 1,
        cached: 0,
        completion: 500,
    };
    // After k requests 5,003·k is spent; the next fits while
    // 5,003·k + 10,003 ≤ 50,000: k ≤ 7. The 9th is refused, by 27 µ$.
    for k in 0..8u64 {
        let reply = chat(&gateway, "acme", "gpt-4o", 1000, "json", used).await;
        assert_eq!(reply.status, 200, "request {k}: {:?}", reply.body);
        // Its fields count whole cents of what is left after its
        // reservation.
        let left = (50_000 - 5_003 * k - 10_003) / 10_000;
        let ratelimit = reply.header("ratelimit").expect("RateLimit");
        assert!(
            ratelimit.contains(&format!("\"monthly_spend\";r={left};")),
            "request {k}: {ratelimit}"
        );
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some("\"monthly_spend\";q=5;w=2592000;qu=\"usd-cents\"")
        );
        // 80 % is 40,000 µ$: passed from the 7th request (k = 6:
        // 30,018 + 10,003 = 40,021), spent rounded down to whole percents.
        let warning = reply.header("x-budget-warning");
        match k {
            0..=5 => assert_eq!(warning, None, "request {k}"),
            6 => assert_eq!(warning, Some("\"monthly_spend\";spent=80;warn_at=80")),
            _ => assert_eq!(warning, Some("\"monthly_spend\";spent=90;warn_at=80")),
        }
        spent(&gateway, "acme", 5_003 * (k + 1)).await;
    }
    let reply = chat(&gateway, "acme", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 429, "{:?}", reply.body);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let problem = reply.json();
    assert_eq!(problem["budget"], "monthly_spend", "{problem:#}");
    assert_eq!(problem["max_cost_usd"], "0.010003", "{problem:#}");
    assert_eq!(
        problem["detail"],
        "limit monthly_spend exceeded: the request may cost up to $0.010003"
    );
    assert_eq!(problem["violated-policies"], json!(["monthly_spend"]));
    // When the 30-day window (aligned to the Unix epoch) ends.
    let reset = problem["budget_reset_seconds"].as_u64().expect("a reset");
    assert!((1..=30 * 86_400).contains(&reset), "{problem:#}");
    let retry_after: u64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(retry_after, reset);
    // OpenAI's own words for a spent quota, for the SDKs.
    assert_eq!(problem["error"]["code"], "insufficient_quota");
    // Nothing was charged by the refusal; a smaller request still fits.
    spent(&gateway, "acme", 40_024).await;
    let reply = chat(&gateway, "acme", "gpt-4o", 900, "json", used).await;
    assert_eq!(reply.status, 200, "9,003 µ$ fit: {:?}", reply.body);
    // Another tenant has its own budget; explain shows it in dollars.
    let reply = chat(&gateway, "globex", "gpt-4o", 10, "json", used).await;
    assert_eq!(reply.status, 200);
    spent(&gateway, "acme", 45_027).await;
    let explained = budget(&gateway, "acme").await;
    assert_eq!(explained["unit"], "usd");
    assert_eq!(
        explained["budget"],
        json!({
            "limit_usd": "0.05",
            "spent_usd": "0.045027",
            "remaining_usd": "0.004973",
            "warn_at_percent": 80.0,
        })
    );
    gateway.stop().await;
}

#[tokio::test]
async fn cached_prompt_tokens_are_priced_apart_in_json_and_streams() {
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "500", PRICES)).await;
    // 200 prompt tokens, 100 of them cached, 100 completion tokens:
    // 100 × 2.5 + 100 × 1.25 + 100 × 10 = 1,375 µ$.
    let cached = Used {
        prompt: 200,
        cached: 100,
        completion: 100,
    };
    let reply = chat(&gateway, "t-json", "gpt-4o", 100, "json", cached).await;
    assert_eq!(reply.status, 200);
    spent(&gateway, "t-json", 1_375).await;
    // The same usage without the cache: 200 × 2.5 + 1,000 = 1,500 µ$.
    let uncached = Used {
        cached: 0,
        ..cached
    };
    let reply = chat(&gateway, "t-plain", "gpt-4o", 100, "json", uncached).await;
    assert_eq!(reply.status, 200);
    spent(&gateway, "t-plain", 1_500).await;
    // An OpenAI stream settles from its last (usage) chunk.
    let reply = chat(&gateway, "t-sse", "gpt-4o", 100, "sse", cached).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    spent(&gateway, "t-sse", 1_375).await;
    // An Anthropic stream: `cache_read_input_tokens` are the cached ones.
    let reply = chat(&gateway, "t-claude", "gpt-4o", 100, "anthropic", cached).await;
    assert_eq!(reply.status, 200);
    spent(&gateway, "t-claude", 1_375).await;
    // A response without usage: the reservation (the prompt "hi" is 1
    // token: 1 × 2.5 + 100 × 10, rounded up) stands.
    let reply = chat(&gateway, "t-none", "gpt-4o", 100, "none", cached).await;
    assert_eq!(reply.status, 200);
    spent(&gateway, "t-none", 1_003).await;
    gateway.stop().await;
}

#[tokio::test]
async fn responses_and_anthropic_cache_writes_are_reserved_and_priced_as_reported() {
    let upstream = LlmUpstream::start().await;
    let routes = r#"
[[routes]]
name = "responses"
match = { path = "/v1/responses", methods = ["POST"] }
upstream = "llm"
limits = ["monthly_spend"]
tokens = { max_tokens_default = 200, prompt = "bytes/4", usage = "auto" }

[[routes]]
name = "messages"
match = { path = "/v1/messages", methods = ["POST"] }
upstream = "llm"
limits = ["monthly_spend"]
tokens = { max_tokens_default = 200, prompt = "bytes/4", usage = "auto" }
"#;
    // $0.015 = 15,000 µ$ per tenant.
    let gateway = InProcess::start(&config(&upstream, "0.015", &format!("{routes}{PRICES}"))).await;
    let used = Used {
        prompt: 200,
        cached: 100,
        completion: 500,
    };
    // The Responses API names the most it writes `max_output_tokens`:
    // 2,000 reserve 1 × 2.5 + 2,000 × 10 = 20,003 µ$, more than the
    // budget (`max_tokens_default`'s 200 would have fit).
    let responses = |max: u64| json!({"model": "gpt-4o", "max_output_tokens": max, "input": "hi"});
    let reply = post(
        &gateway,
        "/v1/responses",
        "r",
        responses(2000),
        "responses",
        used,
        0,
    )
    .await;
    assert_eq!(reply.status, 429, "{:?}", reply.body);
    assert_eq!(reply.json()["max_cost_usd"], "0.020003");
    // 1,000 reserve 10,003; its usage (`input_tokens`, the cached ones in
    // `input_tokens_details`): 100 × 2.5 + 100 × 1.25 + 500 × 10.
    let reply = post(
        &gateway,
        "/v1/responses",
        "r",
        responses(1000),
        "responses",
        used,
        0,
    )
    .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    spent(&gateway, "r", 5_375).await;
    // Anthropic reports the prompt in three parts: 50 plain
    // `input_tokens`, 100 `cache_creation_input_tokens` (written to the
    // cache: priced as input) and 100 `cache_read_input_tokens` (cached):
    // 150 × 2.5 + 100 × 1.25 + 500 × 10 = 5,500 µ$, whole or streamed.
    let used = Used {
        prompt: 250,
        ..used
    };
    let messages = json!({
        "model": "gpt-4o",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "hi"}],
    });
    for (tenant, script) in [("a-json", "anthropic-json"), ("a-sse", "anthropic")] {
        let reply = post(
            &gateway,
            "/v1/messages",
            tenant,
            messages.clone(),
            script,
            used,
            100,
        )
        .await;
        assert_eq!(reply.status, 200, "{script}: {:?}", reply.body);
        spent(&gateway, tenant, 5_500).await;
    }
    gateway.stop().await;
}

#[tokio::test]
async fn a_reload_changes_the_prices_and_keeps_what_was_spent() {
    let upstream = LlmUpstream::start().await;
    let config = config(&upstream, "500", PRICES);
    let gateway = InProcess::start(&config).await;
    // 1 × 2.5 + 500 × 10 = 5,002.5: 5,003 µ$.
    let used = Used {
        prompt: 1,
        cached: 0,
        completion: 500,
    };
    let reply = chat(&gateway, "re", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 200);
    spent(&gateway, "re", 5_003).await;
    // Output at $20 per million: the same usage costs 10,003 µ$, added
    // to what the budget had spent before the reload.
    let before = gateway.app.snapshot().generation;
    let dearer = config.replace("output = 10.00", "output = 20.00");
    assert!(gateway.reload_with(&dearer) > before, "the reload took");
    let reply = chat(&gateway, "re", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 200);
    spent(&gateway, "re", 15_006).await;
    gateway.stop().await;
}

#[tokio::test]
async fn an_unpriced_model_is_refused_400_before_the_upstream() {
    let upstream = LlmUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "500", PRICES)).await;
    let used = Used {
        prompt: 1,
        cached: 0,
        completion: 1,
    };
    let reply = chat(&gateway, "acme", "gpt-unknown", 10, "json", used).await;
    assert_eq!(reply.status, 400, "{:?}", reply.body);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let detail = reply.json()["detail"].as_str().unwrap().to_owned();
    assert!(detail.contains("has no price"), "{detail}");
    assert!(detail.contains("[prices.default]"), "{detail}");
    // Nothing reached the upstream, nothing was charged.
    let explained = budget(&gateway, "acme").await;
    assert_eq!(explained["budget"]["spent_usd"], "0.00", "{explained:#}");
    assert!(!upstream.received(), "the upstream was not asked");
    // With a default price, any model is priced by it.
    let with_default = format!("{PRICES}\n[prices.default]\ninput = 5\noutput = 15\n");
    let gateway = InProcess::start(&config(&upstream, "500", &with_default)).await;
    let reply = chat(&gateway, "acme", "gpt-unknown", 10, "json", used).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    // 1 × 5 + 1 × 15 = 20 µ$.
    spent(&gateway, "acme", 20).await;
    gateway.stop().await;
}

#[tokio::test]
async fn two_gateways_on_redis_share_one_budget() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = LlmUpstream::start().await;
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"usd:\"\n{PRICES}",
        redis.url()
    );
    // $0.03 = 30,000 µ$.
    let config = config(&upstream, "0.03", &store);
    let a = InProcess::start_on_wall_time(&config).await;
    let b = InProcess::start_on_wall_time(&config).await;
    // Reserves 10,003 µ$, uses 200 prompt tokens (100 cached) and 500
    // completion: 250 + 125 + 5,000 = 5,375 µ$.
    let used = Used {
        prompt: 200,
        cached: 100,
        completion: 500,
    };
    assert_eq!(
        chat(&a, "shared", "gpt-4o", 1000, "json", used)
            .await
            .status,
        200
    );
    // The settlement reaches Redis: b sees it.
    spent(&b, "shared", 5_375).await;
    assert_eq!(
        chat(&b, "shared", "gpt-4o", 1000, "sse", used).await.status,
        200
    );
    spent(&a, "shared", 10_750).await;
    // 10,750 + 10,003 ≤ 30,000: a third fits; then 16,125 + 10,003 does
    // too; a fifth (21,500 + 10,003) does not, on either gateway.
    // 10,750 + 10,003 is 69 % of the budget: under `warn_at` (80 %).
    let reply = chat(&a, "shared", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-budget-warning"), None);
    spent(&b, "shared", 16_125).await;
    // 16,125 + 10,003 is 87 %, spent on both gateways as Redis counts it:
    // b warns.
    let reply = chat(&b, "shared", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("x-budget-warning"),
        Some("\"monthly_spend\";spent=87;warn_at=80")
    );
    spent(&a, "shared", 21_500).await;
    for gateway in [&a, &b] {
        let reply = chat(gateway, "shared", "gpt-4o", 1000, "json", used).await;
        assert_eq!(reply.status, 429, "{:?}", reply.body);
        assert_eq!(reply.json()["budget"], "monthly_spend");
    }
    // What still fits: 8,500 µ$ left; 1 × 2.5 + 800 × 10 reserves 8,003
    // (21,500 + 8,003 is 98 %), on a.
    let reply = chat(&a, "shared", "gpt-4o", 800, "json", used).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("x-budget-warning"),
        Some("\"monthly_spend\";spent=98;warn_at=80")
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn in_memory_a_budget_and_a_token_limit_are_all_or_nothing() {
    let upstream = LlmUpstream::start().await;
    // A fixed window of 2,500 tokens an hour per tenant before the $0.02
    // budget; a cheaper model beside gpt-4o.
    let extra = format!(
        "{PRICES}\n[prices.\"mini\"]\ninput = 0.15\noutput = 0.60\n\n\
         [limits.tpm]\nkey = \"header:x-tenant\"\nalgorithm = \"fixed_window\"\n\
         limit = 2500\nwindow = \"1h\"\nunit = \"tokens\"\n"
    );
    let config = config(&upstream, "0.02", &extra).replace(
        "limits = [\"monthly_spend\"]",
        "limits = [\"tpm\", \"monthly_spend\"]",
    );
    let gateway = InProcess::start(&config).await;
    let used = Used {
        prompt: 1,
        cached: 0,
        completion: 500,
    };
    let tokens_left = async || {
        let admin = gateway.admin.expect("an admin listener");
        let explained = get(admin, "/limits/tpm?key=all", &[]).await.json();
        explained["remaining"].as_u64().expect("the window's state")
    };
    // Each gpt-4o request reserves 1,001 tokens and 10,003 µ$, and uses
    // 501 tokens costing 5,003 µ$.
    for k in 1..=2u64 {
        let reply = chat(&gateway, "all", "gpt-4o", 1000, "json", used).await;
        assert_eq!(reply.status, 200, "{:?}", reply.body);
        spent(&gateway, "all", 5_003 * k).await;
    }
    assert_eq!(tokens_left().await, 2_500 - 1_002);
    // The budget refuses (10,006 + 10,003 > 20,000) what the token window
    // would take (1,002 + 1,001 ≤ 2,500): the window is charged nothing.
    let reply = chat(&gateway, "all", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 429, "{:?}", reply.body);
    assert_eq!(reply.json()["violated-policies"], json!(["monthly_spend"]));
    assert_eq!(tokens_left().await, 2_500 - 1_002);
    // The token window refuses (1,002 + 1,501 > 2,500) what the budget
    // would take (mini: 1 × 0.15 + 1,500 × 0.60 = 900.15, 901 µ$): the
    // budget is charged nothing.
    let reply = chat(&gateway, "all", "mini", 1500, "json", used).await;
    assert_eq!(reply.status, 429, "{:?}", reply.body);
    assert_eq!(reply.json()["violated-policies"], json!(["tpm"]));
    spent(&gateway, "all", 10_006).await;
    assert_eq!(tokens_left().await, 2_500 - 1_002);
    // And what both take is charged to both: mini's 1,000 reserve 1,001
    // tokens and 601 µ$, its usage 501 tokens, 0.15 + 300 = 300.15: 301.
    let reply = chat(&gateway, "all", "mini", 1000, "json", used).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    spent(&gateway, "all", 10_307).await;
    assert_eq!(tokens_left().await, 2_500 - 1_503);
    gateway.stop().await;
}

/// A budget of a day or a week: a `fixed_window` of `window` aligned to
/// the Unix epoch (a day from 00:00 UTC, a week from Thursday 00:00 UTC),
/// on the limiter's clock (tokio's: [`jump`] moves it ahead). Started at
/// the in-process epoch (Wednesday 2023-11-15, 00:00 UTC) and moved
/// `ahead` seconds on, it admits and refuses at exactly the request its
/// prices say; the 429's `budget_reset_seconds` and `Retry-After` count to
/// the window's end, `end` seconds after the epoch; five seconds before
/// the end it still refuses, and at the end the budget is whole again.
async fn a_budget_resets_at_its_windows_end(window: &str, seconds: u64, ahead: u64, end: u64) {
    let upstream = LlmUpstream::start().await;
    // $0.02 = 20,000 µ$ a window.
    let config = config(&upstream, "0.02", PRICES)
        .replace("window = \"30d\"", &format!("window = \"{window}\""));
    let gateway = InProcess::start(&config).await;
    let clock = gateway.app.clock.clone();
    jump(ahead * 1_000_000_000).await;
    let used = Used {
        prompt: 1,
        cached: 0,
        completion: 500,
    };
    // The window's end on the limiter's clock.
    let end = common::IN_PROCESS_EPOCH + end * 1_000_000_000;
    // Each request reserves 10,003 µ$ and spends 5,003: the second fits
    // (5,003 + 10,003 ≤ 20,000), the third does not (10,006 + 10,003).
    for k in 0..2u64 {
        let reply = chat(&gateway, "acme", "gpt-4o", 1000, "json", used).await;
        assert_eq!(reply.status, 200, "request {k}: {:?}", reply.body);
        assert_eq!(
            reply.header("ratelimit-policy").map(str::to_owned),
            Some(format!(
                "\"monthly_spend\";q=2;w={seconds};qu=\"usd-cents\""
            ))
        );
        spent(&gateway, "acme", 5_003 * (k + 1)).await;
    }
    // Refused: in whole seconds (rounded up) until the window's end.
    let refused = async || {
        let before = clock.now();
        let reply = chat(&gateway, "acme", "gpt-4o", 1000, "json", used).await;
        let after = clock.now();
        assert_eq!(reply.status, 429, "{:?}", reply.body);
        let problem = reply.json();
        assert_eq!(problem["budget"], "monthly_spend", "{problem:#}");
        assert_eq!(problem["max_cost_usd"], "0.010003", "{problem:#}");
        let reset = problem["budget_reset_seconds"].as_u64().expect("a reset");
        let retry_after: u64 = reply.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(retry_after, reset, "{problem:#}");
        let (latest, earliest) = (
            (end - before).div_ceil(1_000_000_000),
            (end - after).div_ceil(1_000_000_000),
        );
        assert!(
            (earliest..=latest).contains(&reset),
            "reset in {reset} s, the window ends in {earliest}..={latest} s"
        );
    };
    refused().await;
    // Five seconds before the end: still refused, nothing charged.
    jump(end - 5_000_000_000 - clock.now()).await;
    refused().await;
    spent(&gateway, "acme", 10_006).await;
    // The window's end: the budget starts again, whole.
    jump(end.saturating_sub(clock.now())).await;
    let reply = chat(&gateway, "acme", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 200, "a new {window}: {:?}", reply.body);
    spent(&gateway, "acme", 5_003).await;
    gateway.stop().await;
}

/// Moves tokio's clock (the in-process limiter's) `nanos` ahead at once,
/// then lets it run on in real time: no request is in flight meanwhile,
/// so no timeout of one fires early.
async fn jump(nanos: u64) {
    tokio::time::pause();
    tokio::time::advance(std::time::Duration::from_nanos(nanos)).await;
    tokio::time::resume();
}

#[tokio::test]
async fn a_daily_budget_resets_at_midnight_utc() {
    // From Saturday 2023-11-18 12:00 UTC: the day ends in 12 hours.
    a_budget_resets_at_its_windows_end("1d", 86_400, 3 * 86_400 + 43_200, 4 * 86_400).await;
}

#[tokio::test]
async fn a_weekly_budget_resets_on_thursday_at_midnight_utc() {
    // From Saturday 2023-11-18 12:00 UTC: the week (Thursday to Thursday,
    // as the epoch's) ends on Thursday 2023-11-23, in 4.5 days.
    a_budget_resets_at_its_windows_end("1w", 7 * 86_400, 3 * 86_400 + 43_200, 8 * 86_400).await;
    // "7d" is the same window; from Thursday 2023-11-16 00:00 UTC, the
    // week's first instant.
    a_budget_resets_at_its_windows_end("7d", 7 * 86_400, 86_400, 8 * 86_400).await;
}

/// The first instant of the month after the one `secs` (Unix time) falls
/// in, in UTC: Hinnant's `days_from_civil`, written again here so that the
/// gateway's own calendar is checked against a second copy.
fn next_month_start(secs: u64) -> u64 {
    let days = secs / 86_400;
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    let (year, month) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    let y = if month <= 2 { year - 1 } else { year };
    let era = y / 400;
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + (153 * mp + 2) / 5;
    (era * 146_097 + doe - 719_468) * 86_400
}

/// The first instant of the month `secs` (Unix time) falls in, in UTC.
fn month_start(secs: u64) -> u64 {
    let mut start = next_month_start(secs.saturating_sub(62 * 86_400));
    while next_month_start(start) <= secs {
        start = next_month_start(start);
    }
    start
}

/// A `window = "1mo"` budget refused: its reset is the 1st of next month,
/// 00:00 UTC, on the gateway's clock (memory) or on Redis' (`TIME`). With
/// `reset_jitter` (`jitter` seconds, 0: none) a tenant's months start a
/// fixed offset under `jitter` later: the reset is then a month's start
/// plus less than `jitter`, and two tenants reset at different moments.
async fn a_monthly_budget_resets_on_the_first(store: &str, wall_clock: bool, jitter: u64) {
    let upstream = LlmUpstream::start().await;
    let window = match jitter {
        0 => "window = \"1mo\"".to_owned(),
        s => format!("window = \"1mo\"\nreset_jitter = \"{s}s\""),
    };
    let config = config(&upstream, "0.015", &format!("{store}\n{PRICES}"))
        .replace("window = \"30d\"", &window);
    let gateway = if wall_clock {
        InProcess::start_on_wall_time(&config).await
    } else {
        InProcess::start(&config).await
    };
    let used = Used {
        prompt: 1,
        cached: 0,
        completion: 500,
    };
    // 10,003 reserved, 5,003 spent; the next 10,003 does not fit in 15,000.
    let reply = chat(&gateway, "monthly", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    // The longest month in the policy's `w`.
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"monthly_spend\";q=1;w=2678400;qu=\"usd-cents\"")
    );
    spent(&gateway, "monthly", 5_003).await;
    // A tenant refused: in how many seconds its budget resets.
    let refused = async |tenant: &str| {
        if tenant != "monthly" {
            let reply = chat(&gateway, tenant, "gpt-4o", 1000, "json", used).await;
            assert_eq!(reply.status, 200, "{:?}", reply.body);
            spent(&gateway, tenant, 5_003).await;
        }
        let reply = chat(&gateway, tenant, "gpt-4o", 1000, "json", used).await;
        assert_eq!(reply.status, 429, "{:?}", reply.body);
        reply.json()["budget_reset_seconds"]
            .as_u64()
            .expect("a reset")
    };
    let now = || {
        if wall_clock {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        } else {
            gateway.app.clock.now() / 1_000_000_000
        }
    };
    let reset = refused("monthly").await;
    let at = now() + reset;
    if jitter == 0 {
        let expected = next_month_start(now()) - now();
        assert!(
            reset.abs_diff(expected) <= 2,
            "reset in {reset} s, the month ends in {expected} s"
        );
    } else {
        // Whole seconds on both sides: up to 2 s off.
        let offset = |at: u64| (at + 2) - month_start(at + 2);
        assert!(
            offset(at) < jitter + 4,
            "resets {} s after a month's start, the jitter is {jitter} s",
            offset(at)
        );
        let other = now() + refused("monthly-2").await;
        assert!(
            offset(other) < jitter + 4,
            "the second tenant resets {} s after a month's start",
            offset(other)
        );
        assert!(
            at.abs_diff(other) > 2,
            "two tenants reset together ({at}, {other})"
        );
    }
    gateway.stop().await;
}

#[tokio::test]
async fn a_monthly_budget_resets_on_the_first_in_memory() {
    a_monthly_budget_resets_on_the_first("", false, 0).await;
}

#[tokio::test]
async fn a_monthly_budget_with_reset_jitter_resets_a_tenants_offset_later() {
    a_monthly_budget_resets_on_the_first("", false, 6 * 3_600).await;
}

#[tokio::test]
async fn a_monthly_budget_resets_on_the_first_on_redis() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"mo:\"\n",
        redis.url()
    );
    a_monthly_budget_resets_on_the_first(&store, true, 0).await;
    // The same with `reset_jitter`, under another prefix: Redis' windows
    // shifted per tenant as the memory's are.
    a_monthly_budget_resets_on_the_first(&store.replace("mo:", "moj:"), true, 6 * 3_600).await;
}

#[tokio::test]
async fn on_redis_cluster_a_budget_and_a_token_limit_settle_across_slots() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let cluster = common::redis::Cluster::start(3, 0);
    let upstream = LlmUpstream::start().await;
    let urls = cluster.toml_urls();
    // A per-tenant token bucket beside the budget, keyed with the route
    // too: its digest, and so its slot, differs from the budget's.
    let extra = format!(
        "[store]\nbackend = \"redis\"\ncluster = true\nurl = [{urls}]\ntimeout = \"500ms\"\n{PRICES}\n\
         [limits.tpd]\nkey = [\"header:x-tenant\", \"route\"]\nalgorithm = \"token_bucket\"\n\
         capacity = 100000\nrefill = \"100000/d\"\nunit = \"tokens\"\n"
    );
    let config = config(&upstream, "0.02", &extra).replace(
        "limits = [\"monthly_spend\"]",
        "limits = [\"tpd\", \"monthly_spend\"]",
    );
    let a = InProcess::start_on_wall_time(&config).await;
    let b = InProcess::start_on_wall_time(&config).await;
    let used = Used {
        prompt: 1,
        cached: 0,
        completion: 500,
    };
    // 10,003 µ$ reserved, 5,003 spent.
    assert_eq!(
        chat(&a, "c1", "gpt-4o", 1000, "json", used).await.status,
        200
    );
    spent(&b, "c1", 5_003).await;
    // 5,003 + 10,003 ≤ 20,000 fits on b; then 10,006 + 10,003 does not,
    // and its refusal charged the token bucket nothing (all or nothing
    // across the slots).
    assert_eq!(
        chat(&b, "c1", "gpt-4o", 1000, "json", used).await.status,
        200
    );
    spent(&a, "c1", 10_006).await;
    let tokens_left = || async {
        let admin = a.admin.expect("an admin listener");
        get(admin, "/limits/tpd?key=c1&key=chat", &[]).await.json()["remaining"].clone()
    };
    let before = tokens_left().await;
    assert!(before.is_u64(), "the bucket's state: {before}");
    let reply = chat(&a, "c1", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 429, "{:?}", reply.body);
    assert_eq!(reply.json()["budget"], "monthly_spend");
    // Nothing charged: a charge takes the 1,001 reserved tokens, while
    // the bucket's refill (100,000 a day, ~1.2/s) may add one or two
    // between the reads on a slow machine.
    let (before, after) = (before.as_u64().unwrap(), tokens_left().await);
    let after = after.as_u64().expect("the bucket's state");
    assert!(
        (before..=before + 5).contains(&after),
        "nothing charged: {before} before, {after} after"
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn on_redis_a_token_limit_and_a_budget_settle_in_one_call_exactly() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = LlmUpstream::start().await;
    let extra = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"one:\"\n{PRICES}\n\
         [limits.tpd]\nkey = \"header:x-tenant\"\nalgorithm = \"fixed_window\"\n\
         limit = 100000\nwindow = \"1d\"\nunit = \"tokens\"\n",
        redis.url()
    );
    let config = config(&upstream, "0.05", &extra).replace(
        "limits = [\"monthly_spend\"]",
        "limits = [\"tpd\", \"monthly_spend\"]",
    );
    let a = InProcess::start_on_wall_time(&config).await;
    let b = InProcess::start_on_wall_time(&config).await;
    // Reserves 1 + 1,000 tokens and 10,003 µ$; uses 700 tokens, 200 of
    // them prompt (100 cached): 250 + 125 + 5,000 = 5,375 µ$.
    let used = Used {
        prompt: 200,
        cached: 100,
        completion: 500,
    };
    let reply = chat(&a, "t1", "gpt-4o", 1000, "json", used).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    // One decision, then one settlement for both limits (each by its own
    // amount), and no other script call.
    let calls = || script_calls(&redis);
    assert!(
        common::eventually(async || calls() >= 2).await,
        "{} calls",
        calls()
    );
    // What each key counts, read with GET (no script): `window count`.
    let counted = |limit: &str| {
        let key = redis
            .keys()
            .into_iter()
            .find(|k| k.starts_with(&format!("one:{limit}:")))
            .unwrap_or_else(|| panic!("no key of {limit}: {:?}", redis.keys()));
        let value = redis.cli(&["GET", &key]);
        value
            .split_whitespace()
            .nth(1)
            .and_then(|count| count.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{key} = {value:?}"))
    };
    let settled = common::eventually(async || counted("tpd") == 700).await;
    assert!(settled, "tpd counts {}", counted("tpd"));
    assert_eq!(counted("monthly_spend"), 5_375);
    assert_eq!(calls(), 2, "one decision and one settlement");
    // Again, from b, over the settled state: the sums stay exact.
    let reply = chat(&b, "t1", "gpt-4o", 1000, "sse", used).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert!(common::eventually(async || counted("tpd") == 1_400).await);
    assert_eq!(counted("monthly_spend"), 10_750);
    assert_eq!(calls(), 4);
    // A response without usage keeps both reservations, and settles
    // nothing: one more call, the decision.
    let reply = chat(&a, "t1", "gpt-4o", 1000, "none", used).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert!(common::eventually(async || calls() >= 5).await);
    assert_eq!(counted("tpd"), 2_401);
    assert_eq!(counted("monthly_spend"), 20_753);
    spent(&b, "t1", 20_753).await;
    a.stop().await;
    b.stop().await;
}

/// The script calls (`EVALSHA`: decisions and settlements) Redis has run.
fn script_calls(redis: &Redis) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse::<u64>().ok())
        .unwrap_or(0)
}
