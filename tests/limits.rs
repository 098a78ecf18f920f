//! End-to-end tests of rate limiting through real sockets: algorithms, key
//! stacks, cost, shadow limits, missing keys, and every header of the 429
//! contract, with the gateway in process.

mod common;

use std::time::Duration;

use common::{InProcess, TestUpstream, eventually, gateway_toml, get};

/// The gateway in this process: under `start_paused`, a test's sleeps take
/// no real time and move the limiter's clock exactly as far.
async fn gateway(upstream: &TestUpstream, limits_and_routes: &str) -> InProcess {
    InProcess::start(&gateway_toml(upstream, "", limits_and_routes)).await
}

fn json_header_list(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or_default()
        .split(", ")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn token_bucket_denies_with_the_full_429_contract() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 3
refill = "1/m"

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["per_key"]
"#,
    )
    .await;
    for expected_remaining in [2, 1, 0] {
        let reply = get(gw.addr, "/x", &[("x-api-key", "k1")]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some("\"per_key\";q=3;w=180")
        );
        let ratelimit = reply.header("ratelimit").unwrap();
        assert!(
            ratelimit.starts_with(&format!("\"per_key\";r={expected_remaining};t=")),
            "{ratelimit}"
        );
        assert_eq!(reply.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(
            reply.header("x-ratelimit-remaining"),
            Some(expected_remaining.to_string().as_str())
        );
    }
    let reply = get(gw.addr, "/x", &[("x-api-key", "k1")]).await;
    assert_eq!(reply.status, 429);
    assert_eq!(upstream.count(), 3, "the deny path reached the upstream");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    // One token every 60 s: the next one is at most 60 s away.
    let retry_after: u64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"per_key\";q=3;w=180")
    );
    assert_eq!(
        reply.header("ratelimit"),
        Some(format!("\"per_key\";r=0;t={retry_after}").as_str())
    );
    assert_eq!(reply.header("x-ratelimit-limit"), Some("3"));
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        reply.header("x-ratelimit-reset"),
        Some(retry_after.to_string().as_str())
    );
    let body = reply.json();
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["status"], 429);
    assert_eq!(body["detail"], "limit per_key exceeded");
    assert_eq!(body["violated-policies"], serde_json::json!(["per_key"]));
    assert_eq!(body["retry_after"], retry_after);
    // The OpenAI-shaped `error` is for stacks with a token limit only.
    assert!(body.get("error").is_none(), "{body}");
    // Another key has its own bucket; no key at all is not limited (skip).
    assert_eq!(get(gw.addr, "/x", &[("x-api-key", "k2")]).await.status, 200);
    let anonymous = get(gw.addr, "/x", &[]).await;
    assert_eq!(anonymous.status, 200);
    assert_eq!(anonymous.header("ratelimit"), None);
}

const STACK: &str = r#"
[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 5
refill = "1/h"

[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["per_key", "per_ip"]
"#;

#[tokio::test]
async fn a_denied_stack_charges_none_of_its_limits() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, STACK).await;
    for _ in 0..2 {
        assert_eq!(get(gw.addr, "/", &[("x-api-key", "k")]).await.status, 200);
    }
    // per_ip (2/h) is spent; per_key still has 3 of 5.
    for _ in 0..3 {
        let reply = get(gw.addr, "/", &[("x-api-key", "k")]).await;
        assert_eq!(reply.status, 429);
        assert_eq!(
            reply.json()["violated-policies"],
            serde_json::json!(["per_ip"])
        );
        let ratelimit = json_header_list(reply.header("ratelimit"));
        assert!(
            ratelimit[0].starts_with("\"per_key\";r=3;"),
            "{ratelimit:?}"
        );
        assert!(ratelimit[1].starts_with("\"per_ip\";r=0;"), "{ratelimit:?}");
        // Legacy headers describe the limit that denied.
        assert_eq!(reply.header("x-ratelimit-limit"), Some("2"));
    }
    assert_eq!(
        get(gw.addr, "/", &[("x-api-key", "k")])
            .await
            .header("ratelimit-policy"),
        Some("\"per_key\";q=5;w=18000, \"per_ip\";q=2;w=86400")
    );
}

#[tokio::test]
async fn allowed_responses_name_the_limit_with_least_remaining() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, STACK).await;
    let reply = get(gw.addr, "/", &[("x-api-key", "k")]).await;
    // per_key 4/5 = 0.8, per_ip 1/2 = 0.5: per_ip has the least remaining.
    assert_eq!(reply.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("1"));
}

#[tokio::test]
async fn cost_is_charged_to_every_limit_and_can_never_fit() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.budget]
key = "route"
algorithm = "token_bucket"
capacity = 40
refill = "1/h"

[[routes]]
name = "reports"
match = { path = "/reports" }
upstream = "api"
cost = 20
limits = ["budget"]

[[routes]]
name = "huge"
match = { path = "/huge" }
upstream = "api"
cost = 41
limits = ["budget"]
"#,
    )
    .await;
    assert_eq!(get(gw.addr, "/reports", &[]).await.status, 200);
    let reply = get(gw.addr, "/reports", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(get(gw.addr, "/reports", &[]).await.status, 429);
    let reply = get(gw.addr, "/huge", &[]).await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after"), None, "waiting cannot help");
    let body = reply.json();
    assert!(body["detail"].as_str().unwrap().contains("never"), "{body}");
    assert!(body.get("retry_after").is_none(), "{body}");
}

#[tokio::test]
async fn shadow_limits_count_but_never_deny_or_show() {
    let upstream = TestUpstream::start().await;
    let gw = InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[upstreams.api]
url = "{}"

[limits.trial]
key = "ip"
algorithm = "fixed_window"
limit = 1
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"
shadow = true

# A shadow limit never denies, not even for a missing key.
[limits.audit]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 100
window = "1d"
align = "first_request"
shadow = true
on_missing_key = "deny"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["trial", "audit"]
"#,
        upstream.url()
    ))
    .await;
    for _ in 0..3 {
        let reply = get(gw.addr, "/", &[]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit"), None);
        assert_eq!(reply.header("ratelimit-policy"), None);
        assert_eq!(reply.header("x-ratelimit-limit"), None);
    }
    // Counted as the denials they would have been.
    let metrics = get(gw.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(r#"tollgate_ratelimit_decisions_total{route="api",limit="trial",outcome="shadow_denied",front="proxy"} 2"#),
        "{text}"
    );
    // The missing key: the 400 it would have been, counted, not answered.
    assert!(
        text.contains(r#"tollgate_ratelimit_decisions_total{route="api",limit="audit",outcome="shadow_denied",front="proxy"} 3"#),
        "{text}"
    );
    let skipped = r#"tollgate_ratelimit_decisions_total{route="api",limit="audit",outcome="skipped",front="proxy"}"#;
    assert!(
        text.lines()
            .filter(|l| l.starts_with(skipped))
            .all(|l| l.ends_with(" 0")),
        "{text}"
    );
}

#[tokio::test]
async fn missing_keys_follow_on_missing_key() {
    let upstream = TestUpstream::start().await;
    let gw = InProcess::start(&gateway_toml(
        &upstream,
        r#"admin = "127.0.0.1:0""#,
        r#"
[limits.must]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 5
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"
on_missing_key = "deny"

[limits.pooled]
key = "query:user"
algorithm = "fixed_window"
limit = 2
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"
on_missing_key = "shared"

[[routes]]
name = "must"
match = { path = "/must" }
upstream = "api"
limits = ["must"]

[[routes]]
name = "pooled"
match = { path = "/pooled" }
upstream = "api"
limits = ["pooled"]
"#,
    ))
    .await;
    let reply = get(gw.addr, "/must", &[]).await;
    assert_eq!(reply.status, 400);
    // The refusal counts as this limit's denial.
    let metrics = get(gw.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(
            r#"tollgate_ratelimit_decisions_total{route="must",limit="must",outcome="denied",front="proxy"} 1"#
        ),
        "{text}"
    );
    assert!(
        reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("header:x-api-key")
    );
    assert_eq!(
        get(gw.addr, "/must", &[("x-api-key", "a")]).await.status,
        200
    );
    // Requests without ?user= share one key; a named user has their own.
    assert_eq!(get(gw.addr, "/pooled", &[]).await.status, 200);
    assert_eq!(get(gw.addr, "/pooled", &[]).await.status, 200);
    assert_eq!(get(gw.addr, "/pooled", &[]).await.status, 429);
    assert_eq!(get(gw.addr, "/pooled?user=ann", &[]).await.status, 200);
}

#[tokio::test]
async fn header_styles_and_deny_status_are_configurable() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.trio]
key = "route"
algorithm = "sliding_window"
limit = 1
window = "1m"
headers = ["trio"]
status = 503

[limits.quiet]
key = "route"
algorithm = "fixed_window"
limit = 100
window = "1m"
headers = []

[[routes]]
name = "trio"
match = { path = "/trio" }
upstream = "api"
limits = ["trio"]

[[routes]]
name = "quiet"
match = { path = "/quiet" }
upstream = "api"
limits = ["quiet"]
"#,
    )
    .await;
    let reply = get(gw.addr, "/trio", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit-limit"), Some("1"));
    assert_eq!(reply.header("ratelimit-remaining"), Some("0"));
    assert!(reply.header("ratelimit-reset").is_some());
    assert_eq!(reply.header("ratelimit"), None);
    assert_eq!(reply.header("x-ratelimit-limit"), None);
    let reply = get(gw.addr, "/trio", &[]).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json()["status"], 503);
    let reply = get(gw.addr, "/quiet", &[]).await;
    assert_eq!(reply.status, 200);
    for name in [
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-limit",
        "ratelimit-limit",
    ] {
        assert_eq!(reply.header(name), None, "{name}");
    }
}

/// One request at a time on the whole route.
const ONE_AT_A_TIME: &str = r#"
[limits.one_at_a_time]
key = "route"
algorithm = "concurrency"
max = 1

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["one_at_a_time"]
"#;

#[tokio::test(start_paused = true)]
async fn concurrency_slots_are_held_until_the_response_ends() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, ONE_AT_A_TIME).await;
    let addr = gw.addr;
    let slow = tokio::spawn(async move { get(addr, "/slow/800", &[]).await });
    assert!(
        eventually(async || upstream.arrived() == 1).await,
        "the slow request never reached the upstream"
    );
    let reply = get(gw.addr, "/fast", &[]).await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"one_at_a_time\";q=1;qu=\"concurrent-requests\"")
    );
    assert_eq!(reply.header("ratelimit"), Some("\"one_at_a_time\";r=0"));
    assert_eq!(slow.await.unwrap().status, 200);
    assert_eq!(get(gw.addr, "/fast", &[]).await.status, 200);
}

#[tokio::test]
async fn the_gateways_rate_limit_fields_replace_an_upstreams_own() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.per_ip]
key = "ip"
algorithm = "token_bucket"
capacity = 10
refill = "10/s"

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["per_ip"]
"#,
    )
    .await;
    let reply = get(gw.addr, "/own-limits", &[]).await;
    assert_eq!(reply.status, 200);
    let all = |name: &str| -> Vec<&str> {
        reply
            .headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    };
    // The fields the gateway writes (draft and legacy, the default) are its
    // own, once each; the upstream's of those names are gone.
    assert_eq!(all("ratelimit"), ["\"per_ip\";r=9;t=1"]);
    assert_eq!(all("x-ratelimit-remaining"), ["9"]);
    assert_eq!(all("x-ratelimit-limit"), ["10"]);
    // A family the gateway does not write here passes through.
    assert_eq!(all("ratelimit-limit"), ["7"]);
    assert_eq!(reply.header("x-upstream"), Some("yes"));
}

#[tokio::test]
async fn a_denied_upload_gets_its_429_not_a_reset() {
    // The gateway answers before reading the body, then closes; it reads and
    // drops the rest of the upload meanwhile (a lingering close), so the
    // client finishes writing and reads its answer instead of failing on a
    // reset. Five uploads, each on a new connection.
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.once]
key = "route"
algorithm = "fixed_window"
limit = 1
window = "1h"

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["once"]
"#,
    )
    .await;
    assert_eq!(get(gw.addr, "/", &[]).await.status, 200);
    let upload = bytes::Bytes::from(vec![b'u'; 16 * 1024 * 1024]);
    for _ in 0..5 {
        let request = http::Request::builder()
            .method("POST")
            .uri("/upload")
            .header("host", "gateway.test")
            .body(http_body_util::Full::new(upload.clone()))
            .unwrap();
        let reply = common::send(gw.addr, request).await;
        assert_eq!(reply.status, 429);
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
    }
    assert_eq!(upstream.count(), 1, "no upload reached the upstream");
}

#[tokio::test(start_paused = true)]
async fn a_client_that_hangs_up_releases_its_concurrency_slot() {
    // The gateway watches the connection while a request waits for its
    // upstream: a client that closes it cancels the request, and its slot is
    // free long before the slow upstream would have answered.
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, ONE_AT_A_TIME).await;
    let mut client = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut client,
        b"GET /slow/10000 HTTP/1.1\r\nhost: test\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(
        eventually(async || upstream.arrived() == 1).await,
        "the slow request never reached the upstream"
    );
    assert_eq!(
        get(gw.addr, "/fast", &[]).await.status,
        429,
        "slot not taken"
    );
    drop(client);
    // Paused time: the gateway sees the close as soon as the kernel has
    // delivered it, long before the upstream's 10 s are up. On a loaded
    // machine the kernel may deliver it a little later: a few looks, 1 ms
    // of the gateway's time and a real moment apart, 50 ms in all.
    let mut status = 0;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(5));
        tokio::time::sleep(Duration::from_millis(1)).await;
        status = get(gw.addr, "/fast", &[]).await.status;
        if status == 200 {
            break;
        }
    }
    assert_eq!(status, 200, "the slot was still held after the client left");
}

#[tokio::test(start_paused = true)]
async fn leaky_bucket_delay_mode_spaces_requests() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.smooth]
key = "route"
algorithm = "leaky_bucket"
capacity = 2
rate = "4/s"
mode = "delay"

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["smooth"]
"#,
    )
    .await;
    let started = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let addr = gw.addr;
        tasks.push(tokio::spawn(async move {
            let reply = get(addr, "/", &[]).await;
            (reply.status, started.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    let passed: Vec<Duration> = results
        .iter()
        .filter(|(s, _)| *s == 200)
        .map(|(_, t)| *t)
        .collect();
    let denied = results.iter().filter(|(s, _)| *s == 429).count();
    // capacity + 1 = 3 pass (one at once, two queued 250 ms apart), the 4th overflows.
    assert_eq!((passed.len(), denied), (3, 1), "{results:?}");
    // Paused time: the delays are exact. Sent at 0, 10 and 20 ms, they leave
    // one emission interval (250 ms at 4/s) apart from the first.
    let mut passed = passed;
    passed.sort();
    assert_eq!(
        passed,
        [0, 250, 500].map(Duration::from_millis),
        "queued requests were not spaced: {results:?}"
    );
}

#[tokio::test]
async fn reported_cost_is_settled_after_the_response() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.tokens]
key = "route"
algorithm = "fixed_window"
limit = 10
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[[routes]]
name = "llm"
match = { path_prefix = "/cost" }
upstream = "api"
cost = 1
cost_header = "x-cost"
limits = ["tokens"]
"#,
    )
    .await;
    // Charged 1 up front, the upstream reports 6: 5 more are charged.
    let reply = get(gw.addr, "/cost/6", &[]).await;
    assert_eq!(reply.status, 200);
    let reply = get(gw.addr, "/cost/1", &[]).await;
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("3"));
    // A reported 0 refunds the up-front unit.
    get(gw.addr, "/cost/0", &[]).await;
    let reply = get(gw.addr, "/cost/1", &[]).await;
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("2"));
}

#[tokio::test]
async fn spoofed_forwarded_for_cannot_escape_an_ip_limit() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["per_ip"]
"#,
    )
    .await;
    for i in 0..2 {
        let xff = format!("198.51.100.{i}");
        assert_eq!(
            get(gw.addr, "/", &[("x-forwarded-for", &xff)]).await.status,
            200
        );
    }
    let reply = get(gw.addr, "/", &[("x-forwarded-for", "198.51.100.77")]).await;
    assert_eq!(reply.status, 429);
}

/// An admitted request whose upstream fails was still charged: the
/// gateway's 502 tells the client its quota like any allowed response.
#[tokio::test]
async fn an_upstream_failure_still_carries_the_quota() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[upstreams.dead]
url = "http://127.0.0.1:1"
connect_timeout = "500ms"

[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 5
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[[routes]]
name = "dead"
match = { path = "/dead" }
upstream = "dead"
limits = ["per_ip"]
"#,
    )
    .await;
    let reply = get(gw.addr, "/dead", &[]).await;
    assert_eq!(reply.status, 502);
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some(r#""per_ip";q=5;w=86400"#)
    );
    assert!(
        reply
            .header("ratelimit")
            .is_some_and(|v| v.starts_with(r#""per_ip";r=4;t="#)),
        "{:?}",
        reply.header("ratelimit")
    );
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("4"));
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
}
