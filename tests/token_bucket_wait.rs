//! `wait = "..."` on a token bucket end to end, through real sockets: a
//! burst past the capacity is held and reaches the upstream at the refill
//! rate, past `wait` it is refused at once with `Retry-After`; the held
//! requests' headers, log lines, metric and `explain`; a client that leaves
//! during its hold; and the memory store and a real `redis-server` holding
//! alike. Paused time where the gateway's clock is all that matters (the
//! holds are then exact); real time, with generous margins, where the
//! kernel or Redis keeps its own.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use common::openmetrics::parse;
use common::redis::Redis;
use common::{InProcess, Reply, get};

/// An upstream that notes when each request arrives, on tokio's clock
/// (exact under paused time), and answers 200 at once.
struct ClockedUpstream {
    addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ClockedUpstream {
    async fn start() -> ClockedUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let noted = arrivals.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let noted = noted.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                        noted.lock().unwrap().push(Instant::now());
                        async { Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::new()))) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        ClockedUpstream {
            addr,
            arrivals,
            task,
        }
    }

    /// When the requests arrived, in ms after `start`, in order.
    fn arrived_ms(&self, start: Instant) -> Vec<u128> {
        let mut ms: Vec<u128> = self
            .arrivals
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.duration_since(start).as_millis())
            .collect();
        ms.sort();
        ms
    }

    fn count(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }
}

impl Drop for ClockedUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A gateway (one worker, an admin listener) forwarding `/` to `upstream`
/// under limit `smooth`: `key = x-api-key`, the given bucket, and
/// `store` lines (empty: memory).
fn config(upstream: SocketAddr, bucket: &str, store: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1

{store}

[upstreams.api]
url = "http://{upstream}"

[limits.smooth]
key = "header:x-api-key"
algorithm = "token_bucket"
{bucket}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["smooth"]
"#
    )
}

/// `n` requests as `key` at once (each sent 1 ms after the one before, so
/// that they are decided in order); each reply with how long it took.
async fn burst(addr: SocketAddr, key: &str, n: usize) -> Vec<(Reply, Duration)> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let key = key.to_owned();
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let reply = get(addr, "/", &[("x-api-key", &key)]).await;
            (reply, sent.elapsed())
        }));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("request task"));
    }
    replies
}

async fn scrape(gateway: &InProcess) -> common::openmetrics::Exposition {
    let reply = get(gateway.admin.expect("admin"), "/metrics", &[]).await;
    parse(&String::from_utf8_lossy(&reply.body)).expect("exposition")
}

#[tokio::test(start_paused = true)]
async fn a_burst_is_held_and_reaches_the_upstream_at_the_refill_rate() {
    let upstream = ClockedUpstream::start().await;
    let log = common::log::capture_json();
    let bucket = "capacity = 2\nrefill = \"10/s\"\nwait = \"500ms\"";
    let gw = InProcess::start(&config(upstream.addr, bucket, "")).await;
    let start = Instant::now();
    let replies = burst(gw.addr, "k1", 8).await;
    // Sent at 0, 1, … 7 ms. Two pass at once; five are held until their
    // tokens, 100 ms apart (T at 10/s): the third sent at 2 ms waits 98 ms,
    // the seventh 494 ms; the eighth would wait 593 ms > 500 ms: refused at
    // once.
    let statuses: Vec<u16> = replies.iter().map(|(r, _)| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 200, 429]);
    assert_eq!(
        upstream.arrived_ms(start),
        [0, 1, 100, 200, 300, 400, 500],
        "the upstream sees the held requests at the refill rate"
    );
    let (refused, took) = &replies[7];
    assert_eq!(*took, Duration::ZERO, "refused at once, not held");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(
        refused
            .header("ratelimit")
            .is_some_and(|f| f.starts_with("\"smooth\";r=0;")),
        "{:?}",
        refused.header("ratelimit")
    );
    // A held request's fields are those of an admitted one: r = 0, and t
    // until the next token after the debt its hold left.
    let (held, took) = &replies[2];
    assert_eq!(*took, Duration::from_millis(98));
    assert_eq!(held.header("ratelimit"), Some("\"smooth\";r=0;t=1"));
    assert_eq!(held.header("retry-after"), None);
    // Five waits, 98 + 197 + 296 + 395 + 494 ms (each sent 1 ms later).
    let m = scrape(&gw).await;
    let labels = [("limit", "smooth")];
    assert_eq!(m.count("tollgate_queue_wait_seconds_count", &labels), 5.0);
    let sum = m.count("tollgate_queue_wait_seconds_sum", &labels);
    assert!((sum - 1.480).abs() < 1e-6, "{sum}");
    // queued_ms in the lines of the held requests only.
    let text = log
        .when(|t| t.matches("\"route\":\"api\"").count() >= 8)
        .await;
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|l: &serde_json::Value| l["route"] == "api")
        .collect();
    let mut queued: Vec<f64> = lines
        .iter()
        .filter_map(|l| l["queued_ms"].as_f64())
        .collect();
    queued.sort_by(f64::total_cmp);
    assert_eq!(queued, [98.0, 197.0, 296.0, 395.0, 494.0], "{text}");
    assert_eq!(lines.len(), 8);
}

#[tokio::test(start_paused = true)]
async fn explain_shows_the_debt_and_what_the_next_request_gets() {
    let upstream = ClockedUpstream::start().await;
    let bucket = "capacity = 2\nrefill = \"10/s\"\nwait = \"500ms\"";
    let gw = InProcess::start(&config(upstream.addr, bucket, "")).await;
    let admin = gw.admin.expect("admin");
    let explain = async || {
        get(admin, "/limits/smooth?key=k1", &[])
            .await
            .json()
            .get("wait")
            .cloned()
            .expect("a wait section")
    };
    let whole = get(admin, "/limits/smooth?key=k1", &[]).await.json();
    assert_eq!(
        whole["policy"],
        "token_bucket capacity 2, refill 10/s, wait 500ms"
    );
    let fresh = explain().await;
    assert_eq!(fresh["max_ms"], 500.0);
    assert_eq!(fresh["debt_ms"], 0.0);
    assert_eq!(fresh["next_request"], "admitted");
    // Five at once (held up to 300 ms): 300 ms of debt, the next held 400 ms.
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let addr = gw.addr;
        tasks.push(tokio::spawn(async move {
            get(addr, "/", &[("x-api-key", "k1")]).await.status
        }));
    }
    // The holds have started once the upstream saw the two that pass
    // (the debt then shrinks as time goes: it is 300 ms less the time since).
    common::eventually(async || upstream.count() == 2).await;
    let owed = explain().await;
    assert_eq!(owed["next_request"], "held", "{owed}");
    let debt = owed["debt_ms"].as_f64().unwrap();
    let next = owed["next_admitted_in_ms"].as_f64().unwrap();
    assert!(debt > 0.0 && debt <= 300.0, "{owed}");
    // Its token comes one interval (100 ms) after the debt is paid.
    assert!((next - debt - 100.0).abs() < 1e-9, "{owed}");
    for task in tasks {
        assert_eq!(task.await.unwrap(), 200);
    }
}

/// A client that goes away during its hold: its request never reaches
/// the upstream, and its token stays taken (the next request is held for
/// it). Real time: the gateway must see the close, which the kernel
/// delivers when it does.
#[tokio::test]
async fn a_client_gone_during_its_hold_is_not_forwarded_and_its_token_stays_taken() {
    let upstream = ClockedUpstream::start().await;
    let bucket = "capacity = 1\nrefill = \"1/s\"\nwait = \"3s\"";
    let gw = InProcess::start(&config(upstream.addr, bucket, "")).await;
    let start = Instant::now();
    assert_eq!(get(gw.addr, "/", &[("x-api-key", "k")]).await.status, 200);
    // The second is held ~1 s; its client leaves after 200 ms.
    let mut client = TcpStream::connect(gw.addr).await.unwrap();
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: gateway.test\r\nx-api-key: k\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(client);
    // Well past its hold: it never reached the upstream.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(upstream.count(), 1, "a request whose client left went on");
    // Its token was taken: at ~1.7 s the bucket owes until ~2 s, so the
    // third is held (refunded, it would pass at once with a token to spare).
    let sent = start.elapsed();
    let third = Instant::now();
    let reply = get(gw.addr, "/", &[("x-api-key", "k")]).await;
    let held = third.elapsed();
    assert_eq!(reply.status, 200);
    let expected = Duration::from_secs(2).saturating_sub(sent);
    assert!(
        held + Duration::from_millis(150) >= expected && held <= expected + Duration::from_secs(1),
        "held {held:?}, expected about {expected:?}"
    );
    assert_eq!(upstream.count(), 2);
}

/// The same burst against the memory store and a real `redis-server`:
/// the same answers, holds and `Retry-After`.
#[tokio::test]
async fn redis_holds_as_the_memory_store_does() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = ClockedUpstream::start().await;
    // T = 250 ms: holds of 0, 0, 250, 500 ms; the fifth (750 ms) refused.
    let bucket = "capacity = 2\nrefill = \"4/s\"\nwait = \"600ms\"";
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"tg:\"\ntimeout = \"500ms\"",
        redis.url()
    );
    let in_memory = InProcess::start_on_wall_time(&config(upstream.addr, bucket, "")).await;
    let on_redis = InProcess::start_on_wall_time(&config(upstream.addr, bucket, &store)).await;
    let mut answers = Vec::new();
    for gateway in [&in_memory, &on_redis] {
        let replies = burst(gateway.addr, "alice", 6).await;
        let statuses: Vec<u16> = replies.iter().map(|(r, _)| r.status).collect();
        let mut holds: Vec<Duration> = replies
            .iter()
            .filter(|(r, _)| r.status == 200)
            .map(|(_, took)| *took)
            .collect();
        holds.sort();
        let fields: Vec<Option<String>> = replies
            .iter()
            .map(|(r, _)| {
                let field = r.header("ratelimit")?;
                Some(field.split(";t=").next()?.to_owned())
            })
            .collect();
        let retry: Vec<Option<String>> = replies
            .iter()
            .map(|(r, _)| r.header("retry-after").map(str::to_owned))
            .collect();
        let waits = scrape(gateway)
            .await
            .count("tollgate_queue_wait_seconds_count", &[("limit", "smooth")]);
        answers.push((statuses, holds, fields, retry, waits));
    }
    let (memory, shared) = (&answers[0], &answers[1]);
    assert_eq!(memory.0, [200, 200, 200, 200, 429, 429], "memory");
    assert_eq!(memory.0, shared.0, "statuses");
    assert_eq!(memory.2, shared.2, "RateLimit r");
    assert_eq!(memory.3, shared.3, "Retry-After");
    assert_eq!((memory.4, shared.4), (2.0, 2.0), "waits counted");
    // Each hold near its token's time (the n-th sent n ms late), on both.
    for (holds, name) in [(&memory.1, "memory"), (&shared.1, "redis")] {
        for (held, due) in holds.iter().zip([0, 0, 248, 497]) {
            let due = Duration::from_millis(due);
            assert!(
                *held + Duration::from_millis(60) >= due
                    && *held <= due + Duration::from_millis(400),
                "{name}: holds {holds:?}"
            );
        }
    }
    // explain reads the shared bucket's debt from Redis.
    let explained = get(
        on_redis.admin.expect("admin"),
        "/limits/smooth?key=alice",
        &[],
    )
    .await
    .json();
    assert_eq!(explained["source"], "redis");
    assert_eq!(explained["wait"]["max_ms"], 600.0);
}

/// On a Redis Cluster, a stack whose limits live in different slots: a
/// request the bucket holds but a later slot's limit refuses is refunded
/// in the bucket's slot and not held; the requests the whole stack admits
/// are held as on one Redis.
#[tokio::test]
async fn a_cluster_refunds_a_hold_that_a_later_slot_refuses() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let cluster = common::redis::Cluster::start(3, 0);
    let upstream = ClockedUpstream::start().await;
    let gw = InProcess::start_on_wall_time(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1

[store]
backend = "redis"
cluster = true
url = [{urls}]
prefix = "tg:"
timeout = "500ms"

[upstreams.api]
url = "http://{upstream}"

[limits.smooth]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 1
refill = "4/s"
wait = "1s"

[limits.per_route]
key = "route"
algorithm = "fixed_window"
limit = 3
window = "1d"
align = "first_request"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["smooth", "per_route"]
"#,
        urls = cluster.toml_urls(),
        upstream = upstream.addr,
    ))
    .await;
    let start = Instant::now();
    // T = 250 ms. Three pass the window: held 0, ~250, ~500 ms. The fourth
    // and fifth fit the bucket's wait (~750 ms) but not the window:
    // refused at once, their tokens given back.
    let replies = burst(gw.addr, "bob", 5).await;
    // Sent 1 ms apart, they may reach the cluster in another order on a
    // loaded machine: which three pass is the order of arrival, how many
    // is not.
    let mut statuses: Vec<u16> = replies.iter().map(|(r, _)| r.status).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    for (reply, took) in replies.iter().filter(|(r, _)| r.status == 429) {
        assert!(*took < Duration::from_millis(200), "held: {took:?}");
        assert_eq!(reply.header("retry-after").map(|_| ()), Some(()));
    }
    let waits = scrape(&gw)
        .await
        .count("tollgate_queue_wait_seconds_count", &[("limit", "smooth")]);
    assert_eq!(waits, 2.0);
    // Three tokens taken in all: the bucket's next is due ~750 ms after
    // the first (~1.25 s had the refused two kept theirs).
    let explained = get(gw.admin.expect("admin"), "/limits/smooth?key=bob", &[])
        .await
        .json();
    let next = explained["wait"]["next_admitted_in_ms"].as_f64().unwrap();
    let since = start.elapsed().as_secs_f64() * 1000.0;
    assert!(next <= 750.0 - since + 150.0, "{explained} at {since} ms");
}

/// `/auth` answers a held request `200` after its hold, so that the
/// asking proxy forwards the original when the gateway's own proxy would
/// have; past `wait` it refuses at once.
#[tokio::test(start_paused = true)]
async fn auth_answers_a_held_request_after_its_hold() {
    let gw = InProcess::start(
        r#"
[server]
listen = "127.0.0.1:0"

[decision]
listen = "127.0.0.1:0"

[limits.smooth]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 1
refill = "10/s"
wait = "150ms"

[[routes]]
name = "api"
match = { path_prefix = "/api" }
limits = ["smooth"]
"#,
    )
    .await;
    let auth = gw.decision.expect("a decision listener");
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let reply = get(
                auth,
                "/auth",
                &[
                    ("x-original-method", "GET"),
                    ("x-original-uri", "/api/v1"),
                    ("x-api-key", "k"),
                ],
            )
            .await;
            (reply.status, sent.elapsed().as_millis())
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers.sort();
    // One at once, one held 100 ms (its token); the other two would wait
    // 200 ms > 150 ms: refused at once.
    assert_eq!(answers, [(200, 0), (200, 100), (429, 0), (429, 0)]);
}
