//! End-to-end tests of observability through real sockets: the admin
//! listener (`/metrics` parsed strictly, `/config`, `/healthz`, `/readyz`),
//! reload bookkeeping, and the access log, with the gateway in process; the
//! binary for the JSON access log on stderr (`--log-format json`) and the
//! startup line of the admin listener.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::openmetrics::{Exposition, parse};
use common::{Gateway, InProcess, Reply, TestUpstream, eventually, get, send};
use http_body_util::Full;
use hyper::Request;
use sha2::{Digest, Sha256};

fn config(upstream: &TestUpstream) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
shutdown_timeout = "2s"

[upstreams.api]
url = "{url}"
timeout = "2s"

[upstreams.dead]
url = "http://127.0.0.1:1"
connect_timeout = "500ms"

[[routes]]
name = "health"
match = {{ path = "/health" }}
respond = {{ status = 200, body = "ok\n" }}

[[routes]]
name = "dead"
match = {{ path_prefix = "/dead" }}
upstream = "dead"

[[routes]]
name = "api"
match = {{ path_prefix = "/api" }}
upstream = "api"
"#,
        url = upstream.url()
    )
}

fn admin(gateway: &InProcess) -> SocketAddr {
    gateway.admin.expect("an admin listener")
}

async fn scrape(gateway: &InProcess) -> Exposition {
    let reply = get(admin(gateway), "/metrics", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    parse(&text).unwrap_or_else(|e| panic!("invalid exposition: {e}\n{text}"))
}

async fn config_json(gateway: &InProcess) -> serde_json::Value {
    let reply = get(admin(gateway), "/config", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    reply.json()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn is_rfc3339_utc(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() == 20
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        })
}

#[tokio::test]
async fn request_counts_move_by_exactly_what_was_sent() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let before = scrape(&gateway).await;
    assert_eq!(before.value("tollgate_config_generation", &[]), Some(1.0));
    let api_200 = [("route", "api"), ("status", "200")];
    let base = before.count("tollgate_requests_total", &api_200);
    for i in 0..7 {
        let reply = get(gateway.addr, &format!("/api/items/{i}"), &[]).await;
        assert_eq!(reply.status, 200);
    }
    for _ in 0..2 {
        assert_eq!(get(gateway.addr, "/health", &[]).await.status, 200);
    }
    assert_eq!(get(gateway.addr, "/nowhere", &[]).await.status, 404);
    let after = scrape(&gateway).await;
    assert_eq!(
        after.value("tollgate_requests_total", &api_200),
        Some(base + 7.0)
    );
    assert_eq!(
        after.value(
            "tollgate_requests_total",
            &[("route", "health"), ("status", "200")]
        ),
        Some(2.0)
    );
    assert_eq!(
        after.value(
            "tollgate_requests_total",
            &[("route", "none"), ("status", "404")]
        ),
        Some(1.0)
    );
    assert_eq!(
        after.value(
            "tollgate_request_duration_seconds_count",
            &[("route", "api")]
        ),
        Some(7.0)
    );
    assert_eq!(
        after.value(
            "tollgate_request_duration_seconds_bucket",
            &[("route", "api"), ("le", "+Inf")]
        ),
        Some(7.0)
    );
    // Labels are bounded: no path, key or address ever becomes a label value
    // — but an upstream URL of the configuration, which the upstream health
    // series name (contract §11: `tollgate_upstream_healthy{upstream,url}`).
    for sample in after.samples() {
        for (name, value) in &sample.labels {
            if name == "url" && sample.name.starts_with("tollgate_upstream_") {
                let configured = [upstream.url(), "http://127.0.0.1:1".to_owned()];
                assert!(configured.contains(value), "{value} on {}", sample.name);
                continue;
            }
            assert!(
                !value.contains('/') && !value.contains("127.0.0.1"),
                "unbounded label {name}={value:?} on {}",
                sample.name
            );
        }
    }
}

#[tokio::test]
async fn upstream_errors_are_counted_by_upstream_and_kind() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream)).await;
    assert_eq!(get(gateway.addr, "/dead", &[]).await.status, 502);
    assert_eq!(get(gateway.addr, "/dead/again", &[]).await.status, 502);
    let metrics = scrape(&gateway).await;
    assert_eq!(
        metrics.value(
            "tollgate_upstream_errors_total",
            &[("upstream", "dead"), ("kind", "connect")]
        ),
        Some(2.0)
    );
    assert_eq!(
        metrics.value(
            "tollgate_requests_total",
            &[("route", "dead"), ("status", "502")]
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn health_readiness_and_unknown_admin_requests() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let healthz = get(admin(&gateway), "/healthz", &[]).await;
    assert_eq!(healthz.status, 200);
    let readyz = get(admin(&gateway), "/readyz", &[]).await;
    assert_eq!(readyz.status, 200);
    let missing = get(admin(&gateway), "/metricz", &[]).await;
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(missing.json()["status"], 404);
    let post = Request::post("/metrics")
        .header("host", "admin.test")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let post: Reply = send(admin(&gateway), post).await;
    assert_eq!(post.status, 405);
    assert_eq!(post.header("allow"), Some("GET, HEAD"));
    assert_eq!(
        post.header("content-type"),
        Some("application/problem+json")
    );
    // The admin endpoints are not on the traffic listener.
    assert_eq!(get(gateway.addr, "/metrics", &[]).await.status, 404);
}

#[tokio::test]
async fn config_endpoint_follows_failed_and_successful_reloads() {
    let upstream = TestUpstream::start().await;
    let text = config(&upstream);
    let gateway = InProcess::start(&text).await;
    let initial = config_json(&gateway).await;
    assert_eq!(initial["sha256"], sha256_hex(text.as_bytes()));
    assert_eq!(initial["generation"], 1);
    assert_eq!(initial["last_error"], serde_json::Value::Null);
    assert_eq!(initial["path"], gateway.config_path.display().to_string());
    let loaded_at = initial["loaded_at"].as_str().unwrap_or_default();
    assert!(is_rfc3339_utc(loaded_at), "{loaded_at}");

    // A broken file: the running configuration stays, /config says why.
    let broken_line = text.lines().count() + 1;
    // Reloaded in process, by the function SIGHUP calls in the binary.
    gateway.reload_with(&format!("{text}bogus = 1\n"));
    let failed = config_json(&gateway).await;
    let message = failed["last_error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("gateway.toml:{broken_line}:")),
        "line {broken_line} not named: {message}"
    );
    let at = failed["last_error"]["at"].as_str().unwrap_or_default();
    assert!(is_rfc3339_utc(at), "{at}");
    assert_eq!(failed["generation"], 1);
    assert_eq!(failed["sha256"], initial["sha256"]);
    assert_eq!(failed["loaded_at"], initial["loaded_at"]);
    let metrics = scrape(&gateway).await;
    assert_eq!(
        metrics.value("tollgate_config_reloads_total", &[("result", "error")]),
        Some(1.0)
    );
    assert_eq!(
        metrics.value("tollgate_config_reloads_total", &[("result", "ok")]),
        Some(0.0)
    );
    assert_eq!(metrics.value("tollgate_config_generation", &[]), Some(1.0));
    assert_eq!(get(gateway.addr, "/health", &[]).await.status, 200);

    // A valid change: generation 2, the new file's hash, the error cleared.
    let changed = text.replace("body = \"ok\\n\"", "body = \"fine\\n\"");
    assert_ne!(changed, text);
    gateway.reload_with(&changed);
    let reloaded = config_json(&gateway).await;
    assert_eq!(reloaded["generation"], 2);
    assert_eq!(reloaded["sha256"], sha256_hex(changed.as_bytes()));
    assert_eq!(reloaded["last_error"], serde_json::Value::Null);
    let metrics = scrape(&gateway).await;
    assert_eq!(metrics.value("tollgate_config_generation", &[]), Some(2.0));
    assert_eq!(
        metrics.value("tollgate_config_reloads_total", &[("result", "ok")]),
        Some(1.0)
    );
    assert_eq!(
        metrics.value("tollgate_config_reloads_total", &[("result", "error")]),
        Some(1.0)
    );
    assert_eq!(get(gateway.addr, "/health", &[]).await.body, "fine\n");
    // Counters survive the reload (the /health requests above: one before, one after).
    assert_eq!(
        metrics.value(
            "tollgate_requests_total",
            &[("route", "health"), ("status", "200")]
        ),
        Some(1.0)
    );
}

/// Lines of the JSON access log in `log`.
fn access_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["target"] == "tollgate::access")
        .collect()
}

#[tokio::test]
async fn access_log_has_the_fields_and_no_secrets() {
    let upstream = TestUpstream::start().await;
    let gateway = Gateway::start_with_args(&config(&upstream), &["--log-format", "json"]);
    let reply = get(
        gateway.addr,
        "/api/orders?api_key=QUERYSECRET&user=alice",
        &[
            ("x-api-key", "HEADERSECRET"),
            ("authorization", "Bearer BEARERSECRET"),
        ],
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        get(gateway.addr, "/nowhere?token=QUERYSECRET", &[])
            .await
            .status,
        404
    );
    let stderr = gateway.stderr_when(|log| access_lines(log).len() >= 2, Duration::from_secs(5));
    let lines = access_lines(&stderr);
    assert_eq!(lines.len(), 2, "{stderr}");
    let line = &lines[0];
    assert_eq!(line["method"], "GET");
    assert_eq!(line["path"], "/api/orders");
    assert_eq!(line["route"], "api");
    assert_eq!(line["status"], 200);
    assert_eq!(line["upstream"], "api");
    assert_eq!(line["client_ip"], "127.0.0.1");
    assert!(
        line["duration_ms"].as_f64().is_some_and(|ms| ms >= 0.0),
        "{line}"
    );
    let unmatched = &lines[1];
    assert_eq!(unmatched["route"], "none");
    assert_eq!(unmatched["status"], 404);
    assert_eq!(unmatched["path"], "/nowhere");
    for secret in [
        "QUERYSECRET",
        "HEADERSECRET",
        "BEARERSECRET",
        "alice",
        "api_key=",
    ] {
        assert!(
            !stderr.contains(secret),
            "{secret} leaked into the log:\n{stderr}"
        );
    }
}

#[tokio::test]
async fn no_admin_listener_unless_configured() {
    let upstream = TestUpstream::start().await;
    let text = config(&upstream).replace("admin = \"127.0.0.1:0\"\n", "");
    let gateway = Gateway::start(&text);
    assert!(gateway.admin.is_none());
    assert!(!gateway.stderr().contains("admin on"));
    assert_eq!(get(gateway.addr, "/health", &[]).await.status, 200);
}

#[tokio::test]
async fn limit_decisions_near_limit_and_live_keys_are_counted() {
    let upstream = TestUpstream::start().await;
    let log = common::log::capture_json();
    let gateway = InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
log_denied = "none"

[upstreams.api]
url = "{}"

[limits.per_key]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 5
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[limits.trial]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 1
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"
shadow = true

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["per_key", "trial"]
"#,
        upstream.url()
    ))
    .await;
    for _ in 0..6 {
        get(gateway.addr, "/", &[("x-api-key", "k1")]).await;
    }
    get(gateway.addr, "/", &[("x-api-key", "k2")]).await;
    get(gateway.addr, "/", &[]).await;
    let m = scrape(&gateway).await;
    let decision = |limit: &str, outcome: &str| {
        m.value(
            "tollgate_ratelimit_decisions_total",
            &[
                ("route", "api"),
                ("limit", limit),
                ("outcome", outcome),
                ("front", "proxy"),
            ],
        )
    };
    // k1: 5 allowed, 1 denied; k2: 1 allowed; no key: skipped by both.
    assert_eq!(decision("per_key", "allowed"), Some(6.0));
    assert_eq!(decision("per_key", "denied"), Some(1.0));
    assert_eq!(decision("per_key", "skipped"), Some(1.0));
    // The shadow limit admits each key's first request and would deny k1's
    // 2nd to 6th (it is decided for the request per_key denies, too).
    assert_eq!(decision("trial", "allowed"), Some(2.0));
    assert_eq!(decision("trial", "shadow_denied"), Some(5.0));
    // k1 passed 80% of per_key's quota once (its 5th request: 0 of 5 left).
    assert_eq!(
        m.value(
            "tollgate_ratelimit_near_limit_total",
            &[("route", "api"), ("limit", "per_key")]
        ),
        Some(1.0)
    );
    assert_eq!(
        m.value("tollgate_limiter_keys", &[("limit", "per_key")]),
        Some(2.0)
    );
    // log_denied = "none": the 429 has no access-log line, the others do.
    // Every request's end is timed where its line is written: once all
    // eight are, a line that should not be there would be.
    let ended = async || {
        scrape(&gateway).await.value(
            "tollgate_request_duration_seconds_count",
            &[("route", "api")],
        ) == Some(8.0)
    };
    assert!(eventually(ended).await, "not every request ended");
    let log = log.text();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("tollgate::access"))
        .collect();
    assert_eq!(lines.len(), 7, "{log}");
    assert!(lines.iter().all(|l| !l.contains("\"status\":429")));
    assert!(
        lines.iter().any(|l| l.contains("\"limit\":\"per_key\"")),
        "{lines:?}"
    );
}

/// `tollgate_request_duration_seconds` holds a request's whole time: a body
/// still arriving from the upstream is timed until its last byte, not only
/// until the response head. The request is counted at its head.
#[tokio::test]
async fn the_duration_of_a_streamed_response_runs_to_its_last_byte() {
    let upstream = TestUpstream::start().await;
    let log = common::log::capture();
    let gateway = InProcess::start(&format!(
        "{}\n[[routes]]\nname = \"stream\"\nmatch = {{ path = \"/stream\" }}\nupstream = \"api\"\n",
        config(&upstream)
    ))
    .await;
    let request = Request::get("/stream")
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = common::send_streaming(gateway.addr, request).await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    use http_body_util::BodyExt;
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first chunk")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first\n");
    let series = [("route", "stream")];
    let during = scrape(&gateway).await;
    assert_eq!(
        during.value(
            "tollgate_requests_total",
            &[("route", "stream"), ("status", "200")]
        ),
        Some(1.0),
        "counted at its head"
    );
    assert_eq!(
        during.value("tollgate_request_duration_seconds_count", &series),
        Some(0.0),
        "not timed before its body ends"
    );
    // Real time: the body's duration is measured on the wall clock
    // (`proxy::body::BodyTiming`), which paused time does not move.
    let held = Duration::from_millis(400);
    tokio::time::sleep(held).await;
    let stream_line = |stderr: &str| {
        stderr
            .lines()
            .find(|l| l.contains("tollgate::access") && l.contains(r#"path="/stream""#))
            .map(str::to_owned)
    };
    assert_eq!(
        stream_line(&log.text()),
        None,
        "the access-log line waits for the body's end"
    );
    upstream.release();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last\n");
    // The body's end is observed when the gateway drops it, just after the
    // last byte went out: poll for it.
    eventually(async || {
        scrape(&gateway)
            .await
            .value("tollgate_request_duration_seconds_count", &series)
            == Some(1.0)
    })
    .await;
    let after = scrape(&gateway).await;
    assert_eq!(
        after.value("tollgate_request_duration_seconds_count", &series),
        Some(1.0)
    );
    let sum = after
        .value("tollgate_request_duration_seconds_sum", &series)
        .expect("a sum");
    assert!(
        sum >= held.as_secs_f64(),
        "the duration ({sum} s) includes the {held:?} the body took"
    );
    // The access log's duration is the same whole time.
    let text = log.when(|text| stream_line(text).is_some()).await;
    let line = stream_line(&text).unwrap_or_else(|| panic!("no access-log line: {text}"));
    let duration_ms: f64 = line
        .split("duration_ms=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {line}"));
    assert!(
        duration_ms >= held.as_millis() as f64,
        "the logged duration ({duration_ms} ms) includes the body's {held:?}: {line}"
    );
}
