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

// Counting. A waiter decides its whole stack several times (on arrival,
// once more after joining the line, at each wake-up); only the last
// decision is its outcome, and each request must count once, in the
// outcome its client saw: in `tollgate_ratelimit_decisions_total`, the
// shed reasons, `tollgate_requests_total`, `/stats` (the dashboard's
// source) and the keys refused most. Pins the suspected double
// count of a waiter's re-decisions (none was found: see the overload
// guide's "Reading the counts" for what does make the numbers differ).

/// The gateway's account of a run, read through its admin listener as a
/// dashboard reader would: `/metrics` and `/stats`.
struct Account {
    metrics: common::openmetrics::Exposition,
    stats: serde_json::Value,
}

impl Account {
    async fn read(gw: &InProcess) -> Account {
        let admin = gw.admin.expect("an admin listener");
        let metrics = get(admin, "/metrics", &[]).await;
        assert_eq!(metrics.status, 200);
        let metrics = common::openmetrics::parse(&String::from_utf8_lossy(&metrics.body))
            .expect("an exposition");
        let stats = get(admin, "/stats", &[]).await;
        assert_eq!(stats.status, 200, "{:?}", stats.body);
        Account {
            metrics,
            stats: stats.json(),
        }
    }

    /// `tollgate_ratelimit_decisions_total` of `limit` for `outcome`, over
    /// routes and fronts.
    fn decisions(&self, limit: &str, outcome: &str) -> u64 {
        self.metrics.sum(
            "tollgate_ratelimit_decisions_total",
            &[("limit", limit), ("outcome", outcome)],
        ) as u64
    }

    /// `tollgate_shed_total` of `limit` (every priority) for `reason`, or
    /// for every reason. The family appears with its first shed request.
    fn shed(&self, limit: &str, reason: Option<&str>) -> u64 {
        let reason_is =
            |s: &common::openmetrics::Sample| reason.is_none_or(|r| s.label("reason") == Some(r));
        self.metrics
            .samples()
            .filter(|s| s.name == "tollgate_shed_total" && s.label("limit") == Some(limit))
            .filter(|s| reason_is(s))
            .map(|s| s.value)
            .sum::<f64>() as u64
    }

    fn requests(&self, status: u16) -> u64 {
        let status = status.to_string();
        self.metrics.sum(
            "tollgate_requests_total",
            &[("route", "api"), ("status", &status)],
        ) as u64
    }

    fn waited(&self, limit: &str) -> u64 {
        self.metrics
            .sum("tollgate_queue_wait_seconds_count", &[("limit", limit)]) as u64
    }

    /// The entry of `/stats` section `section` named `limit`.
    fn stats_of(&self, section: &str, limit: &str) -> &serde_json::Value {
        self.stats[section]
            .as_array()
            .unwrap_or_else(|| panic!("/stats has no {section}"))
            .iter()
            .find(|entry| entry["limit"] == limit)
            .unwrap_or_else(|| panic!("/stats {section} has no {limit}"))
    }

    /// `/stats` `refused_keys`' counts of `limit`, added.
    fn refused_keys(&self, limit: &str) -> u64 {
        self.stats["refused_keys"]["keys"]
            .as_array()
            .expect("refused keys")
            .iter()
            .filter(|k| k["limit"] == limit)
            .map(|k| k["count"].as_u64().expect("a count"))
            .sum()
    }
}

/// One slot (`algorithm`'s lines), a line of 3 waiting up to 250 ms, fair
/// by API key.
fn one_slot_fair(algorithm: &str) -> String {
    format!(
        r#"
[limits.backend]
key = "route"
{algorithm}
queue = {{ max_wait = "250ms", size = 3, fair_by = "header:x-api-key" }}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["backend"]
"#
    )
}

/// Thirty clients on three API keys, one every 17 ms, against the slot
/// limit `backend` of `config`; the upstream holds each request 100 ms.
/// Every request is counted once, as its client saw it.
async fn each_request_counts_once(config: &str, refused_status: u16) {
    const CLIENTS: usize = 30;
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, config).await;
    let keys = ["k1", "k2", "k3"];
    let mut tasks = Vec::new();
    for i in 0..CLIENTS {
        tasks.push(spawn_get(&gw, "/slow/100", &[("x-api-key", keys[i % 3])]));
        tokio::time::sleep(Duration::from_millis(17)).await;
    }
    let statuses = futures_statuses(tasks).await;
    let ok = statuses.iter().filter(|&&s| s == 200).count() as u64;
    let refused = statuses.iter().filter(|&&s| s == refused_status).count() as u64;
    assert_eq!(ok + refused, CLIENTS as u64, "{statuses:?}");
    assert!(ok >= 2 && refused >= 1, "not both outcomes: {statuses:?}");
    assert_eq!(
        upstream.count() as u64,
        ok,
        "each 200 reached the upstream once"
    );
    assert!(eventually(async || depth(&gw, "backend").await == 0).await);

    let account = Account::read(&gw).await;
    let counted = format!(
        "{ok} × 200, {refused} × {refused_status}; exposition: {:?}",
        account.metrics.family("tollgate_ratelimit_decisions")
    );
    // Decisions: one a request, in its final outcome.
    assert_eq!(account.decisions("backend", "allowed"), ok, "{counted}");
    assert_eq!(account.decisions("backend", "denied"), refused, "{counted}");
    for outcome in ["denied_by_other", "shadow_denied", "skipped"] {
        assert_eq!(account.decisions("backend", outcome), 0, "{outcome}");
    }
    // Shed: each refusal once, for one reason.
    let reasons = ["full", "queue_full", "wait_too_long", "timeout"];
    let by_reason: Vec<u64> = reasons
        .iter()
        .map(|r| account.shed("backend", Some(r)))
        .collect();
    assert_eq!(account.shed("backend", None), refused, "{by_reason:?}");
    assert_eq!(by_reason[0], 0, "a limit with a line sheds no `full`");
    // Waits: only admitted requests are observed, and the first took the
    // free slot without waiting.
    let waited = account.waited("backend");
    assert!(
        waited >= 1 && waited < ok,
        "{waited} waits for {ok} admitted"
    );
    assert_eq!(account.requests(200), ok);
    assert_eq!(account.requests(refused_status), refused);
    // `/stats`, the dashboard's numbers, say the same.
    let limit = account.stats_of("limits", "backend");
    assert_eq!(limit["allowed"], ok);
    assert_eq!(limit["denied"], refused);
    let queue = account.stats_of("queues", "backend");
    let shed_fields = [
        "shed_full",
        "shed_queue_full",
        "shed_wait_too_long",
        "shed_timeout",
    ];
    for (field, n) in shed_fields.iter().zip(&by_reason) {
        assert_eq!(queue[field], *n, "{field}");
    }
    assert_eq!(queue["waiting"], 0);
    assert_eq!(queue["in_flight"], 0);
    let route = &account.stats["routes"][0];
    assert_eq!(route["statuses"]["200"], ok);
    assert_eq!(route["statuses"][refused_status.to_string()], refused);
    // The keys refused most: the route's one key, once per refusal.
    assert_eq!(account.refused_keys("backend"), refused);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_counts_once_at_a_concurrency_limit() {
    let config = one_slot_fair("algorithm = \"concurrency\"\nmax = 1");
    each_request_counts_once(&config, 429).await;
}

#[tokio::test(start_paused = true)]
async fn a_waiter_counts_once_at_an_adaptive_limit() {
    let config = one_slot_fair("algorithm = \"adaptive\"\nmin = 1\nmax = 1\ninitial = 1");
    each_request_counts_once(&config, 503).await;
}

/// A per-key token bucket (`capacity`, no refill to speak of) before the
/// backend's one slot with a line.
fn bucket_then_slot(capacity: u64) -> String {
    format!(
        r#"
[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = {capacity}
refill = "1/h"

[limits.backend]
key = "route"
algorithm = "concurrency"
max = 1
queue = {{ max_wait = "10s", size = 20 }}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["per_key", "backend"]
"#
    )
}

/// The tokens `key` has left in `per_key`, as `GET /limits/NAME?key=`
/// shows them.
async fn tokens_left(gw: &InProcess, key: &str) -> u64 {
    let admin = gw.admin.expect("an admin listener");
    let reply = get(admin, &format!("/limits/per_key?key={key}"), &[]).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.json()["remaining"].as_u64().expect("remaining")
}

#[tokio::test(start_paused = true)]
async fn a_waiter_admitted_after_waking_takes_one_token_of_the_rate_limit_before() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, &bucket_then_slot(20)).await;
    let key = [("x-api-key", "k1")];
    let holder = spawn_get(&gw, "/slow/100", &key);
    assert!(eventually(async || upstream.arrived() == 1).await);
    // Seven wait behind it. Each decides its stack at least three times
    // (on arrival, after joining, when woken): the bucket admits each time,
    // and is charged only by the decision that admits the whole stack.
    let waiters: Vec<_> = (0..7).map(|_| spawn_get(&gw, "/slow/100", &key)).collect();
    assert!(eventually(async || depth(&gw, "backend").await == 7).await);
    assert_eq!(
        tokens_left(&gw, "k1").await,
        19,
        "the waiters hold no token"
    );
    let statuses = futures_statuses(waiters.into_iter().chain([holder]).collect()).await;
    assert_eq!(statuses, [200; 8]);
    assert_eq!(tokens_left(&gw, "k1").await, 12, "one token a request");
    let account = Account::read(&gw).await;
    assert_eq!(account.decisions("per_key", "allowed"), 8);
    assert_eq!(account.decisions("backend", "allowed"), 8);
    for limit in ["per_key", "backend"] {
        for outcome in ["denied", "denied_by_other"] {
            assert_eq!(account.decisions(limit, outcome), 0, "{limit} {outcome}");
        }
    }
    assert_eq!(account.waited("backend"), 7);
    assert_eq!(account.shed("backend", None), 0);
}

#[tokio::test(start_paused = true)]
async fn a_rate_limits_refusal_while_the_slots_are_full_counts_at_both_but_not_in_the_line() {
    // What makes a slot limit's refusals outnumber its line's: a request
    // its rate limit refuses first is answered that refusal at once, never
    // waits, and is counted `denied` by every limit that refused it, the
    // full slot limit included (the overload guide, "Reading the counts").
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, &bucket_then_slot(1)).await;
    let holder = spawn_get(&gw, "/slow/500", &[("x-api-key", "k1")]);
    assert!(eventually(async || upstream.arrived() == 1).await);
    // k1's one token is gone and the slot is taken: refused by per_key.
    let refused = get(gw.addr, "/again", &[("x-api-key", "k1")]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json()["violated-policies"][0], "per_key");
    assert_eq!(depth(&gw, "backend").await, 0, "it never waited");
    // k2 has its token: it waits for the slot and is admitted.
    let waiter = spawn_get(&gw, "/slow/10", &[("x-api-key", "k2")]);
    assert!(eventually(async || depth(&gw, "backend").await == 1).await);
    assert_eq!(waiter.await.unwrap().status, 200);
    assert_eq!(holder.await.unwrap().status, 200);
    let account = Account::read(&gw).await;
    assert_eq!(account.decisions("per_key", "denied"), 1);
    assert_eq!(account.decisions("backend", "denied"), 1, "full as well");
    assert_eq!(account.decisions("backend", "allowed"), 2);
    assert_eq!(account.shed("backend", None), 0, "shed nothing");
    assert_eq!(account.waited("backend"), 1);
    let queue = account.stats_of("queues", "backend");
    assert_eq!(account.stats_of("limits", "backend")["denied"], 1);
    for field in [
        "shed_full",
        "shed_queue_full",
        "shed_wait_too_long",
        "shed_timeout",
    ] {
        assert_eq!(queue[field], 0, "{field}");
    }
    // The keys refused most name the limit that answered.
    assert_eq!(account.refused_keys("per_key"), 1);
    assert_eq!(account.refused_keys("backend"), 0);
}
