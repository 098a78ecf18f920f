//! Upstream retries with full jitter and a budget, end to end: a
//! flaky upstream is retried for idempotent requests only, `Retry-After` is
//! honoured within the upstream's timeout, and a dead upstream gets no more
//! retries than the budget allows. The gateway in process; the wait for a
//! `Retry-After` on paused time.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::openmetrics::parse;
use common::{InProcess, get, send, tollgate};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// An upstream whose answers depend on how often a path was asked:
/// `/flaky/N/...` is 503 the first N times, then 200; `.../later` is 503
/// with `Retry-After: 1` the first time, then 200.
struct Flaky {
    addr: SocketAddr,
    counts: Arc<Mutex<HashMap<String, usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Flaky {
    async fn start() -> Flaky {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let shared = counts.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counts = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let counts = counts.clone();
                        async move { Ok::<_, hyper::Error>(answer(&request, &counts)) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Flaky { addr, counts, task }
    }

    fn seen(&self, path: &str) -> usize {
        self.counts.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

impl Drop for Flaky {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(
    request: &Request<Incoming>,
    counts: &Mutex<HashMap<String, usize>>,
) -> Response<Full<Bytes>> {
    let path = request.uri().path().to_owned();
    let seen = {
        let mut counts = counts.lock().unwrap();
        let n = counts.entry(path.clone()).or_default();
        *n += 1;
        *n
    };
    let failures = if path.ends_with("/later") {
        1
    } else {
        path.split('/')
            .nth(2)
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0)
    };
    let mut response = Response::new(Full::new(Bytes::from(format!("attempt {seen}\n"))));
    if seen <= failures {
        *response.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
        if path.ends_with("/later") {
            response
                .headers_mut()
                .insert("retry-after", "1".parse().unwrap());
        }
    }
    response
}

fn config(upstream: SocketAddr) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[upstreams.api]
url = "http://{upstream}"
timeout = "10s"

[upstreams.short]
url = "http://{upstream}"
timeout = "500ms"

[upstreams.dead]
url = "http://127.0.0.1:1"
connect_timeout = "200ms"

[[routes]]
name = "short"
match = {{ path_prefix = "/short" }}
upstream = "short"
retry = {{ attempts = 2, on = ["503"], base = "1ms", cap = "5ms" }}

[[routes]]
name = "dead"
match = {{ path_prefix = "/dead" }}
upstream = "dead"
retry = {{ attempts = 3, on = ["connect"], base = "1ms", cap = "2ms", budget = "20%" }}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
retry = {{ attempts = 2, on = ["connect", "502", "503", "504", "429"], base = "1ms", cap = "10ms" }}
"#
    )
}

async fn retries(gateway: &InProcess, upstream: &str, reason: &str) -> f64 {
    let reply = get(gateway.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    parse(&text).unwrap().count(
        "tollgate_upstream_retries_total",
        &[("upstream", upstream), ("reason", reason)],
    )
}

fn post(path: &str, key: Option<&str>) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method("POST")
        .uri(path)
        .header("host", "x");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder
        .body(Full::new(Bytes::from_static(b"{\"a\":1}")))
        .unwrap()
}

#[tokio::test]
async fn a_flaky_upstream_is_retried_for_idempotent_requests() {
    let upstream = Flaky::start().await;
    let log = common::log::capture_json();
    let gateway = InProcess::start(&config(upstream.addr)).await;
    let reply = get(gateway.addr, "/flaky/2/a", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, "attempt 3\n");
    assert_eq!(upstream.seen("/flaky/2/a"), 3);
    assert_eq!(retries(&gateway, "api", "503").await, 2.0);
    // More failures than attempts: the last answer is relayed.
    let reply = get(gateway.addr, "/flaky/5/b", &[]).await;
    assert_eq!(reply.status, 503);
    assert_eq!(upstream.seen("/flaky/5/b"), 3, "one try and two retries");
    // The access log marks the retried request.
    let log = log.when(|s| s.contains("/flaky/5/b")).await;
    let line = log.lines().find(|l| l.contains("/flaky/2/a")).unwrap();
    assert!(line.contains("\"retries\":2"), "{line}");
}

#[tokio::test]
async fn a_post_is_retried_only_with_an_idempotency_key() {
    let upstream = Flaky::start().await;
    let gateway = InProcess::start(&config(upstream.addr)).await;
    let reply = send(gateway.addr, post("/flaky/1/post", None)).await;
    assert_eq!(reply.status, 503);
    assert_eq!(upstream.seen("/flaky/1/post"), 1);
    let reply = send(gateway.addr, post("/flaky/1/keyed", Some("order-42"))).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        upstream.seen("/flaky/1/keyed"),
        2,
        "the body was sent again"
    );
}

// Paused time: the gateway's wait and this test's clock are tokio's.
#[tokio::test(start_paused = true)]
async fn retry_after_is_honoured_when_it_fits_the_timeout() {
    let upstream = Flaky::start().await;
    let gateway = InProcess::start(&config(upstream.addr)).await;
    // 10 s of timeout: the upstream's 1 s Retry-After is waited out.
    let started = tokio::time::Instant::now();
    let reply = get(gateway.addr, "/api/later", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.seen("/api/later"), 2);
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "waited for Retry-After"
    );
    // 500 ms of timeout: a 1 s Retry-After does not fit, so no retry.
    let reply = get(gateway.addr, "/short/later", &[]).await;
    assert_eq!(reply.status, 503);
    assert_eq!(upstream.seen("/short/later"), 1);
}

#[tokio::test]
async fn the_budget_bounds_retries_against_a_dead_upstream() {
    let upstream = Flaky::start().await;
    let gateway = InProcess::start(&config(upstream.addr)).await;
    let requests = 50;
    for i in 0..requests {
        let reply = get(gateway.addr, &format!("/dead/{i}"), &[]).await;
        assert_eq!(reply.status, 502);
    }
    let spent = retries(&gateway, "dead", "connect").await;
    eprintln!("dead upstream: {requests} requests, {spent} retries (3 attempts each allowed)");
    // 3 attempts each would be 150 retries; the budget allows 20 % of the
    // requests plus one a second over 10 s: at most 10 + 10.
    assert!(spent <= 20.0, "{spent} retries");
    assert!(spent >= 10.0, "the floor allows ten: {spent}");
}

#[test]
fn bad_retry_tables_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        r#"
[upstreams.api]
url = "http://127.0.0.1:9000"

[[routes]]
name = "a"
match = { path_prefix = "/" }
upstream = "api"
retry = { attempts = 11, on = ["connect", "404"], base = "1s", cap = "10ms", budget = "120%" }
"#,
    )
    .unwrap();
    let (code, _, stderr) = tollgate(&["check", "-c", path.to_str().unwrap()]);
    assert_eq!(code, 1);
    for wanted in [
        "`routes[0].retry.attempts`: at most 10 retries",
        "`routes[0].retry.on[1]`: `404` is not a retry condition",
        "`routes[0].retry.cap`: must be at least `base`",
        "`routes[0].retry.budget`: `120%` is not a share",
    ] {
        assert!(stderr.contains(wanted), "{wanted}\n{stderr}");
    }
}
