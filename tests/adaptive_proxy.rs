//! `algorithm = "adaptive"` end to end: the gateway in process, in front of
//! an upstream with a real capacity (`common::capacity`: C slots, S per
//! request, a queue, 503 past it), load offered open-loop (requests start
//! on a schedule, whatever the answers do). Paused tokio time: the service
//! times, the gateway's clock and the schedule are exact, so the numbers
//! below do not depend on the machine's load.
//!
//! What it shows: below the capacity nothing is refused; under 4× the
//! capacity the upstream holds about C requests, not the flood, and every
//! admitted request succeeds; a 503 from the upstream shrinks the limit;
//! a reload keeps the learned limit; `shadow` refuses nothing.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::capacity::{CapacityUpstream, FULL_HEADER};
use common::{InProcess, Reply, get};

const MS: Duration = Duration::from_millis(1);

/// The gateway in front of `upstream` with `[limits.backend]` (adaptive,
/// keyed by route, plus `extra`) on every path.
fn config(upstream: &CapacityUpstream, extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1

[upstreams.api]
url = "{}"

[limits.backend]
key = "route"
algorithm = "adaptive"
{extra}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["backend"]
"#,
        upstream.url()
    )
}

/// What a run of requests got.
#[derive(Debug, Default)]
struct Tally {
    /// 200 from the upstream.
    ok: usize,
    /// Refused by the gateway (its problem+json 503).
    refused: usize,
    /// The upstream's own 503 (it was full).
    upstream_full: usize,
    /// Anything else (status), which no test expects.
    other: Vec<u16>,
}

impl Tally {
    fn add(&mut self, reply: &Reply) {
        let problem = reply
            .header("content-type")
            .is_some_and(|t| t.starts_with("application/problem+json"));
        match reply.status {
            200 => self.ok += 1,
            503 if reply.header(FULL_HEADER).is_some() => self.upstream_full += 1,
            503 if problem => self.refused += 1,
            status => self.other.push(status),
        }
    }
}

/// `per_second` requests a second for `span`, each started on schedule on
/// its own connection (open loop), all awaited.
async fn offer(addr: SocketAddr, per_second: u64, span: Duration) -> Tally {
    let interval = Duration::from_nanos(1_000_000_000 / per_second);
    let start = tokio::time::Instant::now();
    let count = (span.as_nanos() / interval.as_nanos()) as u32;
    let mut tasks = Vec::with_capacity(count as usize);
    for i in 0..count {
        tokio::time::sleep_until(start + interval * i).await;
        tasks.push(tokio::spawn(async move { get(addr, "/work", &[]).await }));
    }
    let mut tally = Tally::default();
    for task in tasks {
        tally.add(&task.await.expect("request task"));
    }
    tally
}

/// `GET /limits/backend?key=api`: the route's adaptive state.
async fn explain(gw: &InProcess) -> serde_json::Value {
    let reply = get(gw.admin.unwrap(), "/limits/backend?key=api", &[]).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.json()["adaptive"].clone()
}

fn limit_of(adaptive: &serde_json::Value) -> u64 {
    adaptive["limit"].as_u64().expect("a limit")
}

#[tokio::test(start_paused = true)]
async fn below_capacity_nothing_is_refused() {
    // 20 slots of 50 ms: 400 requests/s. Half of it, 10 in flight.
    let upstream = CapacityUpstream::start(20, 50 * MS, 1000).await;
    let gw = InProcess::start(&config(&upstream, "")).await;
    let tally = offer(gw.addr, 200, Duration::from_secs(3)).await;
    assert_eq!(tally.ok, 600, "{tally:?}");
    assert_eq!((tally.refused, tally.upstream_full), (0, 0), "{tally:?}");
    assert!(tally.other.is_empty(), "{tally:?}");
    // It never lowered itself to probe: at least where it started.
    let adaptive = explain(&gw).await;
    assert!(limit_of(&adaptive) >= 20, "{adaptive}");
    assert_eq!(adaptive["in_flight"], 0);
    assert_eq!(adaptive["baseline_ms"], 50.0, "{adaptive}");
    gw.stop().await;
}

#[tokio::test(start_paused = true)]
async fn four_times_the_capacity_keeps_the_upstream_near_it() {
    // 10 slots of 50 ms: 200 requests/s; offered 800/s for 3 s. Unlimited,
    // the upstream would hold hundreds (its queue takes 10,000).
    let upstream = CapacityUpstream::start(10, 50 * MS, 10_000).await;
    let gw = InProcess::start(&config(&upstream, "")).await;
    let tally = offer(gw.addr, 800, Duration::from_secs(3)).await;
    assert!(tally.other.is_empty(), "{tally:?}");
    // Every admitted request succeeded; the upstream never had to refuse.
    assert_eq!(tally.upstream_full, 0, "{tally:?}");
    assert_eq!(tally.ok, upstream.served());
    // Goodput: 90 % of the upstream's 600 in 3 s (measured: 594).
    assert!(tally.ok >= 540, "{tally:?}");
    assert!(tally.refused >= 1400, "{tally:?}");
    // Bounded near its capacity, not the 120 requests a second's
    // flood would pile up at it within 50 ms of queueing.
    let held = upstream.max_held();
    eprintln!("4x: {tally:?}, the upstream held at most {held}");
    assert!(held <= 30, "the upstream held {held} at once; {tally:?}");
    let adaptive = explain(&gw).await;
    assert!(limit_of(&adaptive) <= 30, "{adaptive}");
    gw.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_refusal_is_a_503_naming_the_limit_with_the_current_limit() {
    let upstream = CapacityUpstream::start(4, 500 * MS, 100).await;
    let gw = InProcess::start(&config(&upstream, "min = 1\nmax = 10\ninitial = 2\n")).await;
    let addr = gw.addr;
    let held: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { get(addr, "/slow", &[]).await }))
        .collect();
    assert!(
        common::eventually(async || explain(&gw).await["in_flight"] == 2).await,
        "two requests never got in flight"
    );
    let reply = get(gw.addr, "/refused", &[]).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"backend\";q=10;qu=\"concurrent-requests\"")
    );
    assert_eq!(reply.header("ratelimit"), Some("\"backend\";r=0"));
    assert_eq!(
        reply.header("x-ratelimit-limit"),
        Some("2"),
        "q: the current limit"
    );
    let problem = reply.json();
    assert_eq!(problem["status"], 503);
    assert!(
        problem["detail"].as_str().unwrap().contains("backend"),
        "{problem}"
    );
    for task in held {
        assert_eq!(task.await.unwrap().status, 200);
    }
    let adaptive = explain(&gw).await;
    assert_eq!(adaptive["in_flight"], 0, "released when the bodies ended");
    gw.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_upstreams_503s_shrink_the_limit_and_a_reload_keeps_it() {
    // 4 slots, no queue: a fifth request at once gets the upstream's 503.
    let upstream = CapacityUpstream::start(4, 50 * MS, 0).await;
    let text = config(&upstream, "initial = 40\n");
    let gw = InProcess::start(&text).await;
    // 400/s of 50 ms: 20 in flight wanted, 4 served.
    let first = offer(gw.addr, 400, Duration::from_secs(2)).await;
    assert!(first.other.is_empty(), "{first:?}");
    let learned = limit_of(&explain(&gw).await);
    eprintln!("503s: {first:?}, limit {learned}");
    assert!(learned <= 10, "limit {learned} after {first:?}");
    // Once it has shrunk, the gateway refuses instead of the upstream.
    let second = offer(gw.addr, 400, Duration::from_secs(2)).await;
    assert!(
        second.refused > second.upstream_full,
        "first {first:?}, then {second:?}"
    );
    assert!(second.ok >= 100, "{second:?}");
    let learned = limit_of(&explain(&gw).await);
    eprintln!("then: {second:?}, limit {learned}");
    assert!(learned < 40);

    // The same definition: the same limiter.
    gw.reload_with(&text);
    assert_eq!(limit_of(&explain(&gw).await), learned);
    // Other numbers that still contain it: carried as it is.
    gw.reload_with(&config(&upstream, "initial = 40\nmax = 500\n"));
    assert_eq!(limit_of(&explain(&gw).await), learned);
    // A `max` below it: clamped, not reset to `initial`.
    gw.reload_with(&config(&upstream, "initial = 2\nmax = 3\n"));
    assert_eq!(limit_of(&explain(&gw).await), learned.min(3));
    // Another algorithm: fresh.
    let other = config(&upstream, "").replace("\"adaptive\"", "\"concurrency\"\nmax = 7");
    gw.reload_with(&other);
    let reply = get(gw.admin.unwrap(), "/limits/backend?key=api", &[]).await;
    assert_eq!(reply.json()["quota"], 7);
    gw.stop().await;
}

#[tokio::test(start_paused = true)]
async fn shadow_refuses_nothing_and_counts_what_it_would_have() {
    let upstream = CapacityUpstream::start(4, 50 * MS, 0).await;
    let gw = InProcess::start(&config(&upstream, "initial = 4\nshadow = true\n")).await;
    let tally = offer(gw.addr, 400, Duration::from_secs(2)).await;
    assert!(tally.other.is_empty(), "{tally:?}");
    assert_eq!(tally.refused, 0, "{tally:?}");
    assert!(tally.upstream_full > 0, "{tally:?}");
    let metrics = get(gw.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    let exposition = common::openmetrics::parse(&text).expect("OpenMetrics");
    let shadow_denied = exposition.sum(
        "tollgate_ratelimit_decisions_total",
        &[("limit", "backend"), ("outcome", "shadow_denied")],
    );
    assert!(shadow_denied > 0.0, "{text}");
    let limit = exposition.value("tollgate_adaptive_limit", &[("limit", "backend")]);
    // Computed all along: it sits about the upstream's 4 slots (cut by
    // the 503s its own requests got, grown back by their 50 ms answers).
    assert!(limit.is_some_and(|n| (1.0..=8.0).contains(&n)), "{text}");
    let in_flight = exposition.value("tollgate_inflight", &[("limit", "backend")]);
    assert_eq!(in_flight, Some(0.0), "{text}");
    assert_eq!(explain(&gw).await["baseline_ms"], 50.0);
    gw.stop().await;
}
