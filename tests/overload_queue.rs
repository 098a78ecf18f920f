//! End-to-end tests of priorities, the reserve and waiting for a slot
//! (contract §12) through real sockets, with the gateway in process and a
//! slow test upstream (`/slow/MS`). Paused tokio time: the gateway's clock,
//! its waiters' deadlines and the upstream's service times move together,
//! and no test waits on the wall clock for them.

mod common;

use std::time::Duration;

use common::{InProcess, Reply, TestUpstream, eventually, gateway_toml, get};
use tokio::io::AsyncWriteExt;

async fn gateway(upstream: &TestUpstream, rest: &str) -> InProcess {
    InProcess::start(&gateway_toml(upstream, "admin = \"127.0.0.1:0\"", rest)).await
}

/// Requests waiting in `limit`'s line, as `GET /limits/NAME?key=` shows it.
async fn depth(gw: &InProcess, limit: &str) -> u64 {
    let admin = gw.admin.expect("an admin listener");
    let reply = get(admin, &format!("/limits/{limit}?key=api"), &[]).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.json()["queue"]["depth"]
        .as_u64()
        .expect("the queue's depth")
}

/// `tollgate_shed_total` for `limit`, `priority` and `reason`.
fn shed(gw: &InProcess, limit: &str, priority: &str, reason: &str) -> u64 {
    let text = gw.app.metrics().encode();
    let series = format!(
        "tollgate_shed_total{{limit=\"{limit}\",priority=\"{priority}\",reason=\"{reason}\"}} "
    );
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

fn spawn_get(
    gw: &InProcess,
    path: &str,
    headers: &[(&str, &str)],
) -> tokio::task::JoinHandle<Reply> {
    let addr = gw.addr;
    let path = path.to_owned();
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::spawn(async move {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        get(addr, &path, &headers).await
    })
}

const PRIORITIES: &str = r#"
[limits.backend]
key = "route"
algorithm = "concurrency"
max = 5
reserve = "40%"

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["backend"]
priority = "sheddable"

[consumers."k-gold"]
consumer = "gold"
priority = "critical"

[consumers."k-plain"]
consumer = "plain"
priority = "normal"
"#;

#[tokio::test(start_paused = true)]
async fn critical_is_served_while_sheddable_is_shed_at_the_reserve() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, PRIORITIES).await;
    // Three sheddable requests take 3 of 5 slots: 2 (40 %) stay free.
    let held: Vec<_> = (0..3).map(|_| spawn_get(&gw, "/slow/5000", &[])).collect();
    assert!(eventually(async || upstream.arrived() == 3).await);
    // A fourth sheddable one would leave only 1 free: shed.
    let refused = get(gw.addr, "/batch", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("1"));
    let problem = refused.json();
    assert_eq!(problem["violated-policies"][0], "backend");
    assert_eq!(problem["priority"], "sheddable");
    assert_eq!(problem["shed_reason"], "full");
    assert_eq!(shed(&gw, "backend", "sheddable", "full"), 1);
    // The consumer's priority wins over the route's: critical and normal
    // callers take the reserve.
    let gold = spawn_get(&gw, "/slow/5000", &[("x-api-key", "k-gold")]);
    assert!(eventually(async || upstream.arrived() == 4).await);
    let plain = spawn_get(&gw, "/slow/5000", &[("x-api-key", "k-plain")]);
    assert!(eventually(async || upstream.arrived() == 5).await);
    // Now full for everyone.
    let full = get(gw.addr, "/more", &[("x-api-key", "k-gold")]).await;
    assert_eq!(full.status, 429);
    assert_eq!(full.json()["priority"], "critical");
    assert_eq!(shed(&gw, "backend", "critical", "full"), 1);
    for task in held.into_iter().chain([gold, plain]) {
        assert_eq!(task.await.unwrap().status, 200);
    }
    // All released: a sheddable request passes again.
    assert_eq!(get(gw.addr, "/batch", &[]).await.status, 200);
}

/// One slot, a line of `size` waiting up to `max_wait`.
fn one_slot(max_wait: &str, size: u64, fair_by: Option<&str>) -> String {
    let fair = fair_by.map_or(String::new(), |k| format!(", fair_by = \"{k}\""));
    format!(
        r#"
[limits.backend]
key = "route"
algorithm = "concurrency"
max = 1
queue = {{ max_wait = "{max_wait}", size = {size}{fair} }}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["backend"]
"#
    )
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_admitted_when_a_slot_frees() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, &one_slot("2s", 10, None)).await;
    let holder = spawn_get(&gw, "/slow/500", &[]);
    assert!(eventually(async || upstream.arrived() == 1).await);
    let started = tokio::time::Instant::now();
    let waiter = spawn_get(&gw, "/waited", &[]);
    assert!(eventually(async || depth(&gw, "backend").await == 1).await);
    let metrics = get(gw.admin.expect("admin"), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.lines()
            .any(|line| line == "tollgate_queue_depth{limit=\"backend\"} 1"),
        "{text}"
    );
    let reply = waiter.await.unwrap();
    assert_eq!(reply.status, 200, "admitted once the slot freed");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it waited for the slot: {:?}",
        started.elapsed()
    );
    assert_eq!(holder.await.unwrap().status, 200);
    assert_eq!(depth(&gw, "backend").await, 0);
    assert_eq!(upstream.count(), 2);
    assert_eq!(shed(&gw, "backend", "normal", "timeout"), 0);
}

#[tokio::test(start_paused = true)]
async fn a_full_line_refuses_at_once() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, &one_slot("5s", 1, None)).await;
    let holder = spawn_get(&gw, "/slow/2000", &[]);
    assert!(eventually(async || upstream.arrived() == 1).await);
    let waiter = spawn_get(&gw, "/waited", &[]);
    assert!(eventually(async || depth(&gw, "backend").await == 1).await);
    let started = tokio::time::Instant::now();
    let refused = get(gw.addr, "/refused", &[]).await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "refused without waiting: {:?}",
        started.elapsed()
    );
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["shed_reason"], "queue_full");
    assert_eq!(shed(&gw, "backend", "normal", "queue_full"), 1);
    assert_eq!(waiter.await.unwrap().status, 200);
    assert_eq!(holder.await.unwrap().status, 200);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_max_wait_passes_is_refused() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, &one_slot("300ms", 10, None)).await;
    let holder = spawn_get(&gw, "/slow/5000", &[]);
    assert!(eventually(async || upstream.arrived() == 1).await);
    let started = tokio::time::Instant::now();
    let refused = get(gw.addr, "/refused", &[]).await;
    let waited = started.elapsed();
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["shed_reason"], "timeout");
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(4000),
        "refused when max_wait passed: {waited:?}"
    );
    assert_eq!(shed(&gw, "backend", "normal", "timeout"), 1);
    assert_eq!(depth(&gw, "backend").await, 0, "it left the line");
    assert_eq!(
        upstream.count(),
        0,
        "nothing but the holder reached the upstream"
    );
    assert_eq!(holder.await.unwrap().status, 200);
}

#[tokio::test(start_paused = true)]
async fn one_clients_burst_does_not_starve_another() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, &one_slot("30s", 100, Some("header:x-client"))).await;
    let a = [("x-client", "a")];
    let holder = spawn_get(&gw, "/slow/200", &a);
    assert!(eventually(async || upstream.arrived() == 1).await);
    // Client a's burst of six waits first...
    let burst: Vec<_> = (0..6).map(|_| spawn_get(&gw, "/slow/200", &a)).collect();
    assert!(eventually(async || depth(&gw, "backend").await == 6).await);
    // ...then client b's one request.
    let b = spawn_get(&gw, "/slow/200", &[("x-client", "b")]);
    assert!(eventually(async || depth(&gw, "backend").await == 7).await);
    for task in burst.into_iter().chain([holder, b]) {
        assert_eq!(task.await.unwrap().status, 200);
    }
    // Served one at a time, in the order they finished: b's turn came
    // right after one of a's, not after all six.
    let order: Vec<String> = upstream
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|seen| seen.header("x-client").unwrap_or_default().to_owned())
        .collect();
    assert_eq!(order.len(), 8);
    let at = order.iter().position(|c| c == "b").expect("b was served");
    assert!(at <= 2, "b waited behind a's burst: {order:?}");
}

#[tokio::test(start_paused = true)]
async fn a_waiting_client_that_disconnects_leaves_the_line() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, &one_slot("30s", 10, None)).await;
    let holder = spawn_get(&gw, "/slow/1000", &[]);
    assert!(eventually(async || upstream.arrived() == 1).await);
    // A client waits on a raw connection, then another behind it.
    let mut gone = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    gone.write_all(b"GET /gone HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    assert!(eventually(async || depth(&gw, "backend").await == 1).await);
    let next = spawn_get(&gw, "/next", &[]);
    assert!(eventually(async || depth(&gw, "backend").await == 2).await);
    drop(gone);
    // The kernel delivers the close in a real moment: look a few times.
    let mut left = false;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(5));
        tokio::time::sleep(Duration::from_millis(1)).await;
        if depth(&gw, "backend").await == 1 {
            left = true;
            break;
        }
    }
    assert!(left, "the disconnected waiter is still in the line");
    // The next waiter gets the slot when the holder's response ends, and
    // the one that left never reached the upstream.
    assert_eq!(next.await.unwrap().status, 200);
    assert_eq!(holder.await.unwrap().status, 200);
    let uris: Vec<String> = upstream
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|seen| seen.uri.clone())
        .collect();
    assert_eq!(uris, ["/slow/1000", "/next"]);
    assert_eq!(
        get(gw.addr, "/after", &[]).await.status,
        200,
        "no slot leaked"
    );
}

#[tokio::test(start_paused = true)]
async fn a_critical_waiter_goes_first() {
    let upstream = TestUpstream::start().await;
    let config = format!(
        "{}\n[consumers.\"k-gold\"]\nconsumer = \"gold\"\npriority = \"critical\"\n",
        one_slot("30s", 10, None)
    );
    let gw = gateway(&upstream, &config).await;
    let holder = spawn_get(&gw, "/slow/200", &[]);
    assert!(eventually(async || upstream.arrived() == 1).await);
    let normal: Vec<_> = (0..3).map(|_| spawn_get(&gw, "/slow/200", &[])).collect();
    assert!(eventually(async || depth(&gw, "backend").await == 3).await);
    let gold = spawn_get(&gw, "/gold", &[("x-api-key", "k-gold")]);
    assert!(eventually(async || depth(&gw, "backend").await == 4).await);
    for task in normal.into_iter().chain([holder, gold]) {
        assert_eq!(task.await.unwrap().status, 200);
    }
    let uris: Vec<String> = upstream
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|seen| seen.uri.clone())
        .collect();
    assert_eq!(
        uris[1], "/gold",
        "the critical waiter was served first: {uris:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_wait_the_recent_pace_cannot_meet_is_refused_at_once() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, &one_slot("250ms", 100, None)).await;
    let holder = spawn_get(&gw, "/slow/100", &[]);
    assert!(eventually(async || upstream.arrived() == 1).await);
    let start = tokio::time::Instant::now();
    // Five wait behind it; each is served 100 ms after the one before.
    let waiting: Vec<_> = (0..5).map(|_| spawn_get(&gw, "/slow/100", &[])).collect();
    assert!(eventually(async || depth(&gw, "backend").await == 5).await);
    // Two of them got their slots, 100 ms apart, and three still wait:
    // a newcomer would wait about 4 × 100 ms, past max_wait.
    tokio::time::sleep_until(start + Duration::from_millis(210)).await;
    assert_eq!(depth(&gw, "backend").await, 3);
    let asked = tokio::time::Instant::now();
    let refused = get(gw.addr, "/refused", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["shed_reason"], "wait_too_long");
    assert!(
        asked.elapsed() < Duration::from_millis(30),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(shed(&gw, "backend", "normal", "wait_too_long"), 1);
    assert_eq!(holder.await.unwrap().status, 200);
    let statuses: Vec<u16> = futures_statuses(waiting).await;
    // Two got their slots within 250 ms (at 100 and 200 ms); the third's
    // would have come at 300 ms: the last three time out.
    assert_eq!(statuses, [200, 200, 429, 429, 429]);
    assert_eq!(shed(&gw, "backend", "normal", "timeout"), 3);
}

async fn futures_statuses(tasks: Vec<tokio::task::JoinHandle<Reply>>) -> Vec<u16> {
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap().status);
    }
    statuses.sort_unstable();
    statuses
}

/// The HS256 secret of [`FROM_TOKENS`]' issuer (its `secret_file`).
const SECRET: &[u8] = b"priority-claims-secret-of-32-bytes";

/// A concurrency limit of 5 with a reserve of 2, and priorities from
/// everywhere a request can take one: a consumer, a token's
/// `priority_claim`, the plan its `plan_claim` names, the route.
const FROM_TOKENS: &str = r#"
[[jwt.issuers]]
issuer = "https://sso.example/"
secret_file = "secret"
plan_claim = "tier"
priority_claim = "prio"

[plans.batch]
priority = "sheddable"

[plans.gold]
priority = "critical"

[limits.backend]
key = "route"
algorithm = "concurrency"
max = 5
reserve = 2

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["backend"]

[consumers."k-ops"]
consumer = "ops"
priority = "critical"
"#;

/// `Authorization` with an HS256 token of these extra claims, valid around
/// the in-process clock's start.
fn token(extra: serde_json::Value) -> String {
    let now = common::IN_PROCESS_EPOCH / tollgate::limit::NANOS_PER_SEC;
    let mut claims =
        serde_json::json!({"iss": "https://sso.example/", "sub": "u", "exp": now + 3600});
    let members = claims.as_object_mut().expect("an object");
    for (name, value) in extra.as_object().expect("an object") {
        members.insert(name.clone(), value.clone());
    }
    format!("Bearer {}", common::jwt::hs256(SECRET, &claims))
}

#[tokio::test(start_paused = true)]
async fn a_priority_comes_from_the_consumer_the_token_its_plan_or_the_route() {
    let upstream = TestUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), SECRET).expect("the secret");
    let config = gateway_toml(&upstream, "admin = \"127.0.0.1:0\"", FROM_TOKENS);
    let gw = InProcess::start_in(dir, &config).await;
    let batch = token(serde_json::json!({"tier": "batch"}));
    // The batch plan is sheddable: three take 3 of 5 slots, 2 stay free.
    let held: Vec<_> = (0..3)
        .map(|_| spawn_get(&gw, "/slow/5000", &[("authorization", &batch)]))
        .collect();
    assert!(eventually(async || upstream.arrived() == 3).await);
    let refused = get(gw.addr, "/batch", &[("authorization", &batch)]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["priority"], "sheddable");
    // A value that names no priority is ignored: the plan's still holds.
    let odd = token(serde_json::json!({"tier": "batch", "prio": "urgent"}));
    let refused = get(gw.addr, "/batch", &[("authorization", &odd)]).await;
    assert_eq!(refused.json()["priority"], "sheddable");
    // The token's own claim wins over its plan's: a critical one takes
    // the reserve.
    let urgent = token(serde_json::json!({"tier": "batch", "prio": "critical"}));
    let first = spawn_get(&gw, "/slow/5000", &[("authorization", &urgent)]);
    assert!(eventually(async || upstream.arrived() == 4).await);
    // Neither a claim nor a plan's priority: the route's (`normal`) takes
    // the last slot.
    let plain = token(serde_json::json!({"tier": "unknown", "prio": "urgent"}));
    let last = spawn_get(&gw, "/slow/5000", &[("authorization", &plain)]);
    assert!(eventually(async || upstream.arrived() == 5).await);
    // Full: each refusal names the priority the request had.
    let priority_of = async |headers: &[(&str, &str)]| {
        let reply = get(gw.addr, "/full", headers).await;
        assert_eq!(reply.status, 429, "{:?}", reply.body);
        reply.json()["priority"]
            .as_str()
            .expect("a priority")
            .to_owned()
    };
    let gold = token(serde_json::json!({"tier": "gold"}));
    let shed_claim = token(serde_json::json!({"tier": "gold", "prio": "sheddable"}));
    assert_eq!(priority_of(&[("authorization", &gold)]).await, "critical");
    assert_eq!(
        priority_of(&[("authorization", &shed_claim)]).await,
        "sheddable"
    );
    assert_eq!(priority_of(&[]).await, "normal");
    // The API key's consumer wins over the token's claim.
    let ops = [("x-api-key", "k-ops"), ("authorization", &*shed_claim)];
    assert_eq!(priority_of(&ops).await, "critical");
    for task in held.into_iter().chain([first, last]) {
        assert_eq!(task.await.unwrap().status, 200);
    }
    assert_eq!(shed(&gw, "backend", "sheddable", "full"), 3);
    assert_eq!(shed(&gw, "backend", "critical", "full"), 2);
    assert_eq!(shed(&gw, "backend", "normal", "full"), 1);
}
