//! The Redis store end to end: real `redis-server` processes started by the
//! tests on free ports, gateways sharing them in process (the binary where
//! a test reads what the store thread logs on its stderr), real sockets, on
//! real time (Redis keeps its own). Waits poll Redis or the metrics for
//! what they wait for.
//! Exactness across gateways, all-or-nothing stacks, expiries, digests,
//! NOSCRIPT, the `local = true` tier, `cost_header` settlement, and every
//! failure mode (killed, restarted on the same port, paused).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::redis::Redis;
use common::{Gateway, InProcess, TestUpstream, eventually, eventually_within, gateway_toml, get};

/// A gateway under test: in process, or the binary.
trait Node {
    fn addr(&self) -> SocketAddr;
    fn admin(&self) -> SocketAddr;
}

impl Node for InProcess {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn admin(&self) -> SocketAddr {
        self.admin.expect("admin")
    }
}

impl Node for Gateway {
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn admin(&self) -> SocketAddr {
        self.admin.expect("admin")
    }
}

/// A gateway in process on `redis` with `store_extra` in `[store]`, an
/// admin listener and the given limits and routes (`{upstream}` is the
/// test upstream).
async fn gateway(
    redis: &Redis,
    store_extra: &str,
    upstream: &TestUpstream,
    body: &str,
) -> InProcess {
    InProcess::start(&config(redis, store_extra, upstream, body)).await
}

/// As [`gateway`], the binary: for the lines its store thread logs.
fn gateway_process(
    redis: &Redis,
    store_extra: &str,
    upstream: &TestUpstream,
    body: &str,
) -> Gateway {
    Gateway::start(&config(redis, store_extra, upstream, body))
}

fn config(redis: &Redis, store_extra: &str, upstream: &TestUpstream, body: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[store]
backend = "redis"
url = "{url}"
prefix = "tg:"
timeout = "500ms"
{store_extra}

[upstreams.api]
url = "{upstream}"

{body}
"#,
        url = redis.url(),
        upstream = upstream.url(),
    )
}

/// Sends `n` requests at once to `path`, alternating between the gateways;
/// returns the statuses.
async fn burst(
    gateways: &[&InProcess],
    path: &str,
    n: usize,
    headers: &[(&str, &str)],
) -> Vec<u16> {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let addr = gateways[i % gateways.len()].addr;
        let path = path.to_owned();
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        set.spawn(async move {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (&**k, &**v)).collect();
            get(addr, &path, &h).await.status
        });
    }
    let mut statuses = Vec::new();
    while let Some(status) = set.join_next().await {
        statuses.push(status.expect("request task"));
    }
    statuses
}

fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

/// The first sample of `name` (`None` before a labelled series is first
/// counted); a failure when the exposition lacks the metric itself.
async fn metric(gateway: &impl Node, name: &str) -> Option<f64> {
    let reply = get(gateway.admin(), "/metrics", &[]).await;
    let exposition = common::openmetrics::parse(&String::from_utf8_lossy(&reply.body)).unwrap();
    assert!(
        exposition.family_of(name).is_some(),
        "no metric {name} in the exposition"
    );
    exposition
        .samples()
        .find(|sample| sample.name == name)
        .map(|sample| sample.value)
}

/// Every key has an expiry, and none holds `secrets` in its name or value.
fn assert_keys_expire_and_hide(redis: &Redis, secrets: &[&str]) {
    let keys = redis.keys();
    assert!(!keys.is_empty(), "the gateways wrote keys");
    for key in &keys {
        let ttl: i64 = redis.cli(&["PTTL", key]).parse().expect("PTTL");
        assert!(ttl > 0, "{key} has no expiry (PTTL {ttl})");
        let value = match redis.cli(&["TYPE", key]).as_str() {
            "string" => redis.cli(&["GET", key]),
            "zset" => redis.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"]),
            other => panic!("{key}: unexpected type {other}"),
        };
        for secret in secrets {
            assert!(!key.contains(secret), "{key} names {secret}");
            assert!(!value.contains(secret), "{key} holds {secret}: {value}");
        }
        assert!(key.starts_with("tg:"), "{key} lacks the prefix");
    }
}

const ALGORITHMS: &str = r#"
[limits.fw]
key = "header:x-user"
algorithm = "fixed_window"
limit = 7
window = "1h"

[limits.sw]
key = "header:x-user"
algorithm = "sliding_window"
limit = 7
window = "1h"

[limits.sl]
key = "header:x-user"
algorithm = "sliding_log"
limit = 7
window = "1h"

[limits.tb]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 7
refill = "1/h"

[limits.lb]
key = "header:x-user"
algorithm = "leaky_bucket"
capacity = 6
rate = "1/h"
mode = "reject"

[[routes]]
name = "fw"
match = { path = "/fw" }
respond = { status = 200, body = "ok" }
limits = ["fw"]

[[routes]]
name = "sw"
match = { path = "/sw" }
respond = { status = 200, body = "ok" }
limits = ["sw"]

[[routes]]
name = "sl"
match = { path = "/sl" }
respond = { status = 200, body = "ok" }
limits = ["sl"]

[[routes]]
name = "tb"
match = { path = "/tb" }
respond = { status = 200, body = "ok" }
limits = ["tb"]

[[routes]]
name = "lb"
match = { path = "/lb" }
respond = { status = 200, body = "ok" }
limits = ["lb"]
"#;

#[tokio::test]
async fn two_gateways_admit_exactly_the_limit_for_every_algorithm() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let a = gateway(&redis, "", &upstream, ALGORITHMS).await;
    let b = gateway(&redis, "", &upstream, ALGORITHMS).await;
    for path in ["/fw", "/sw", "/sl", "/tb", "/lb"] {
        let statuses = burst(&[&a, &b], path, 24, &[("x-user", "alice@example.com")]).await;
        assert_eq!(count(&statuses, 200), 7, "{path}: {statuses:?}");
        assert_eq!(count(&statuses, 429), 17, "{path}: {statuses:?}");
        // A denied request tells the shared numbers.
        let reply = get(a.addr, path, &[("x-user", "alice@example.com")]).await;
        assert_eq!(reply.status, 429, "{path}");
        assert!(reply.header("retry-after").is_some(), "{path}");
    }
    assert_eq!(
        metric(&a, "tollgate_store_fallback_active").await,
        Some(0.0)
    );
    assert_keys_expire_and_hide(&redis, &["alice", "example.com", "127.0.0.1"]);
}

/// `r` and `t` of a `RateLimit` field of one policy (`"name";r=R;t=T`).
fn remaining_and_reset(field: &str) -> (u64, u64) {
    let param = |name: &str| {
        field
            .split(';')
            .find_map(|p| p.trim().strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {field}"))
    };
    (param("r="), param("t="))
}

/// A gateway in process with the memory store, the test upstream, and
/// `body`, its limiter clock on wall time as Redis's is.
async fn memory_gateway(upstream: &TestUpstream, body: &str) -> InProcess {
    InProcess::start_on_wall_time(&gateway_toml(upstream, "", body)).await
}

/// Sends `n` requests for `route` as `user` to both gateways in turn: each
/// pair gets the same status and `r`, and `t` and `Retry-After` within the
/// second that can pass between the two (Redis reads its own clock).
async fn assert_same_answers(
    in_memory: &InProcess,
    on_redis: &InProcess,
    route: &str,
    user: &str,
    n: usize,
) {
    let user = [("x-user", user)];
    for i in 1..=n {
        let memory = get(in_memory.addr, &format!("/{route}"), &user).await;
        let shared = get(on_redis.addr, &format!("/{route}"), &user).await;
        let what = format!("/{route} request {i}");
        assert_eq!(memory.status, shared.status, "{what}: status");
        let field = |reply: &common::Reply| {
            reply
                .header("ratelimit")
                .unwrap_or_else(|| panic!("{what}: no RateLimit field"))
                .to_owned()
        };
        let (memory_r, memory_t) = remaining_and_reset(&field(&memory));
        let (shared_r, shared_t) = remaining_and_reset(&field(&shared));
        assert_eq!(
            memory_r, shared_r,
            "{what}: r, memory {memory:?}, redis {shared:?}"
        );
        assert!(
            memory_t.abs_diff(shared_t) <= 1,
            "{what}: t {memory_t} in memory, {shared_t} on redis"
        );
        let retry = |reply: &common::Reply| -> Option<u64> {
            reply
                .header("retry-after")
                .map(|v| v.parse().expect("Retry-After"))
        };
        match (retry(&memory), retry(&shared)) {
            (None, None) => {}
            (Some(m), Some(r)) => assert!(m.abs_diff(r) <= 1, "{what}: Retry-After {m} / {r}"),
            other => panic!("{what}: Retry-After in memory / on redis: {other:?}"),
        }
    }
}

/// The same requests on the memory store and on Redis get the same answer.
#[tokio::test]
async fn redis_answers_every_algorithm_as_the_memory_store_does() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let on_redis = gateway(&redis, "", &upstream, ALGORITHMS).await;
    let in_memory = memory_gateway(&upstream, ALGORITHMS).await;
    for route in ["fw", "sw", "sl", "tb", "lb"] {
        assert_same_answers(&in_memory, &on_redis, route, route, 9).await;
    }
}

/// The sliding window's previous count, weighted, gives the same `r`, `t`
/// and `Retry-After` on both stores. The second half is sent 3 s into a
/// 10 s window, a second from where the weighted estimate of 5 earlier
/// requests changes (every 2 s), so both requests of a pair see the same.
#[tokio::test]
async fn redis_weights_the_previous_sliding_window_as_the_memory_store_does() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let body = r#"
[limits.sw]
key = "header:x-user"
algorithm = "sliding_window"
limit = 7
window = "10s"

[[routes]]
name = "sw"
match = { path = "/sw" }
respond = { status = 200, body = "ok" }
limits = ["sw"]
"#;
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let on_redis = gateway(&redis, "", &upstream, body).await;
    let in_memory = memory_gateway(&upstream, body).await;
    let into_window = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970");
        Duration::from_nanos((now.as_nanos() % 10_000_000_000) as u64)
    };
    // The first half in a window's first 5 s, with time to spare before it ends.
    let offset = into_window();
    if offset > Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_secs(10) - offset).await;
    }
    assert_same_answers(&in_memory, &on_redis, "sw", "carol", 5).await;
    // Then 3 s into the next window: the estimate is 5 × 7/10 = 3.5.
    let offset = into_window();
    tokio::time::sleep(Duration::from_secs(13) - offset).await;
    assert_same_answers(&in_memory, &on_redis, "sw", "carol", 6).await;
}

#[tokio::test]
async fn concurrency_slots_are_leases_shared_and_released() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.cc]
key = "header:x-user"
algorithm = "concurrency"
max = 3

[[routes]]
name = "slow"
match = { path_prefix = "/slow" }
upstream = "api"
limits = ["cc"]
"#;
    let a = gateway(&redis, "", &upstream, body).await;
    let b = gateway(&redis, "", &upstream, body).await;
    // While held, a lease set has an expiry (a dead gateway's slots lapse).
    let held = {
        let addr = a.addr;
        tokio::spawn(async move { get(addr, "/slow/800", &[("x-user", "u")]).await.status })
    };
    let lease_key = || redis.keys().into_iter().find(|k| k.ends_with(":cc"));
    assert!(
        eventually(async || lease_key().is_some()).await,
        "no lease key"
    );
    let key = lease_key().expect("the lease key");
    let ttl: i64 = redis.cli(&["PTTL", &key]).parse().expect("PTTL");
    assert!(ttl > 0 && ttl <= 30_001, "lease expiry {ttl} ms");
    assert_eq!(held.await.expect("held"), 200);
    // Its release is a store call made when the body ends, just after the
    // client has it: the waves start once it has landed (a burst sent
    // before could find the slot still held, and admit 2).
    assert!(
        eventually(async || !redis.keys().iter().any(|k| k.ends_with(":cc"))).await,
        "the held lease was not released"
    );
    for _wave in 0..2 {
        let statuses = burst(&[&a, &b], "/slow/1500", 8, &[("x-user", "u")]).await;
        assert_eq!(count(&statuses, 200), 3, "{statuses:?}");
        assert_eq!(count(&statuses, 429), 5, "{statuses:?}");
        // Released at body end: the lease set empties (and Redis drops it).
        assert!(
            eventually(async || !redis.keys().iter().any(|k| k.ends_with(":cc"))).await,
            "leases not released"
        );
    }
}

/// The count a fixed window key holds (its value is `window count`).
fn window_count(redis: &Redis, key: &str) -> u64 {
    let value = redis.cli(&["GET", key]);
    value
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_shared_stack_is_all_or_nothing_under_concurrent_requests() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.per_user]
key = "header:x-user"
algorithm = "fixed_window"
limit = 3
window = "1h"

[limits.per_route]
key = "route"
algorithm = "fixed_window"
limit = 10
window = "1h"

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["per_user", "per_route"]
"#;
    let a = gateway(&redis, "", &upstream, body).await;
    let b = gateway(&redis, "", &upstream, body).await;
    let mut set = tokio::task::JoinSet::new();
    for user in 0..8 {
        for i in 0..5 {
            let addr = if (user + i) % 2 == 0 { a.addr } else { b.addr };
            set.spawn(async move {
                let user = format!("user-{user}");
                (
                    user.clone(),
                    get(addr, "/r", &[("x-user", &user)]).await.status,
                )
            });
        }
    }
    let mut admitted = std::collections::HashMap::<String, u64>::new();
    while let Some(result) = set.join_next().await {
        let (user, status) = result.expect("task");
        assert!(status == 200 || status == 429, "{status}");
        if status == 200 {
            *admitted.entry(user).or_default() += 1;
        }
    }
    let total: u64 = admitted.values().sum();
    assert_eq!(total, 10, "{admitted:?}");
    assert!(admitted.values().all(|n| *n <= 3), "{admitted:?}");
    // No partial charge: each counter holds exactly what was admitted.
    let keys = redis.keys();
    let route_key = keys
        .iter()
        .find(|k| k.starts_with("tg:per_route:"))
        .expect("route key");
    assert_eq!(window_count(&redis, route_key), 10);
    let user_sum: u64 = keys
        .iter()
        .filter(|k| k.starts_with("tg:per_user:"))
        .map(|k| window_count(&redis, k))
        .sum();
    assert_eq!(
        user_sum, 10,
        "the per-user counters hold only admitted requests"
    );
    assert_keys_expire_and_hide(&redis, &["user-"]);
}

#[tokio::test]
async fn script_flush_under_load_reloads_the_script() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.fw]
key = "header:x-user"
algorithm = "fixed_window"
limit = 150
window = "1h"

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["fw"]
"#;
    let a = gateway(&redis, "", &upstream, body).await;
    let b = gateway(&redis, "", &upstream, body).await;
    let stop = Arc::new(AtomicBool::new(false));
    let flushes = Arc::new(AtomicUsize::new(0));
    let port = redis.port;
    let flusher = {
        let (stop, flushes) = (stop.clone(), flushes.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let ok = std::process::Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "SCRIPT", "FLUSH"])
                    .output()
                    .is_ok_and(|o| o.status.success());
                flushes.fetch_add(usize::from(ok), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(15));
            }
        })
    };
    let mut statuses = Vec::new();
    let mut flushed_between = 0;
    for _ in 0..10 {
        statuses.extend(burst(&[&a, &b], "/r", 20, &[("x-user", "u")]).await);
        // A burst can finish before the flusher's next `redis-cli` has
        // run (batched calls are quick): wait for one, so that every
        // next burst starts on a flushed script cache.
        let seen = flushes.load(Ordering::Relaxed);
        eventually(async || flushes.load(Ordering::Relaxed) > seen).await;
        flushed_between += usize::from(flushes.load(Ordering::Relaxed) > seen);
    }
    stop.store(true, Ordering::Relaxed);
    flusher.join().expect("flusher");
    assert!(
        flushed_between >= 9,
        "the scripts were flushed between bursts ({flushed_between} of 10)"
    );
    assert_eq!(count(&statuses, 200), 150, "{statuses:?}");
    assert_eq!(count(&statuses, 429), 50, "{statuses:?}");
    assert_eq!(
        metric(&a, "tollgate_store_fallback_active").await,
        Some(0.0)
    );
}

const ONE_LIMIT: &str = r#"
[limits.fw]
key = "header:x-user"
algorithm = "fixed_window"
limit = 100000
window = "1h"

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["fw"]
"#;

/// Waits until `metric` reads `value`, at most `within` (a deadline
/// generous for the store's probes every 250 ms).
async fn until_metric(gateway: &impl Node, name: &str, value: f64, within: Duration) {
    let reached = eventually_within(within, async || {
        // A request drives the breaker (a failed call opens it).
        let _ = get(gateway.addr(), "/r", &[("x-user", "u")]).await;
        metric(gateway, name).await == Some(value)
    })
    .await;
    assert!(reached, "{name} did not reach {value} within {within:?}");
}

#[tokio::test]
async fn local_fallback_serves_through_a_redis_restart_on_the_same_port() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    // The binary: the store thread's lines are read on its stderr.
    let a = gateway_process(&redis, r#"on_failure = "local""#, &upstream, ONE_LIMIT);
    // Load from a background task the whole time.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let load = {
        let (stop, served, addr) = (stop.clone(), served.clone(), a.addr);
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                statuses.push(get(addr, "/r", &[("x-user", "u")]).await.status);
                served.fetch_add(1, Ordering::Relaxed);
            }
            statuses
        })
    };
    let more_served = async |n: usize| {
        let target = served.load(Ordering::Relaxed) + n;
        assert!(
            eventually(async || served.load(Ordering::Relaxed) >= target).await,
            "the load stalled"
        );
    };
    more_served(11).await;
    redis.kill();
    until_metric(
        &a,
        "tollgate_store_fallback_active",
        1.0,
        Duration::from_secs(10),
    )
    .await;
    assert!(
        metric(&a, "tollgate_store_errors_total")
            .await
            .unwrap_or(0.0)
            >= 1.0
    );
    redis.restart();
    // Recovered by the probes (every 250 ms) within 5 s.
    until_metric(
        &a,
        "tollgate_store_fallback_active",
        0.0,
        Duration::from_secs(5),
    )
    .await;
    // And served on after it.
    more_served(10).await;
    stop.store(true, Ordering::Relaxed);
    let statuses = load.await.expect("load");
    assert!(statuses.len() > 20, "{} requests", statuses.len());
    assert!(
        statuses.iter().all(|s| *s == 200),
        "no 5xx, no denial: {statuses:?}"
    );
    // Shared again: the fresh Redis holds the key.
    assert!(redis.keys().iter().any(|k| k.starts_with("tg:fw:")));
    let log = a.stderr();
    assert_eq!(log.matches("redis store unavailable").count(), 1, "{log}");
    assert_eq!(log.matches("shared limits resumed").count(), 1, "{log}");
}

#[tokio::test]
async fn deny_mode_answers_503_and_readyz_503_while_redis_is_down() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let a = gateway(&redis, r#"on_failure = "deny""#, &upstream, ONE_LIMIT).await;
    let admin = a.admin.expect("admin");
    assert_eq!(get(a.addr, "/r", &[("x-user", "u")]).await.status, 200);
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);
    redis.kill();
    until_metric(
        &a,
        "tollgate_store_fallback_active",
        1.0,
        Duration::from_secs(10),
    )
    .await;
    let reply = get(a.addr, "/r", &[("x-user", "u")]).await;
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(reply.json()["status"], 503);
    assert_eq!(get(admin, "/readyz", &[]).await.status, 503);
    redis.restart();
    until_metric(
        &a,
        "tollgate_store_fallback_active",
        0.0,
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(get(a.addr, "/r", &[("x-user", "u")]).await.status, 200);
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);
}

#[tokio::test]
async fn allow_mode_admits_while_redis_is_down() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = ONE_LIMIT.replace("limit = 100000", "limit = 1");
    let a = gateway(&redis, r#"on_failure = "allow""#, &upstream, &body).await;
    assert_eq!(get(a.addr, "/r", &[("x-user", "u")]).await.status, 200);
    assert_eq!(get(a.addr, "/r", &[("x-user", "u")]).await.status, 429);
    redis.kill();
    for _ in 0..10 {
        assert_eq!(get(a.addr, "/r", &[("x-user", "u")]).await.status, 200);
    }
    assert_eq!(
        get(a.admin.expect("admin"), "/readyz", &[]).await.status,
        200
    );
}

#[tokio::test]
async fn a_redis_that_never_answers_costs_no_more_than_the_timeout() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let a = InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[store]
backend = "redis"
url = "{}"
prefix = "tg:"
timeout = "100ms"

{ONE_LIMIT}
"#,
        redis.url()
    ))
    .await;
    drop(upstream);
    assert_eq!(get(a.addr, "/r", &[("x-user", "u")]).await.status, 200);
    redis.pause();
    // Each call gives up at `timeout` (100 ms) and the local fallback
    // answers; a call that waited on the paused server would hang until it
    // resumes, which the 10 s guard turns into a failure.
    for _ in 0..20 {
        let status = tokio::time::timeout(
            Duration::from_secs(10),
            get(a.addr, "/r", &[("x-user", "u")]),
        )
        .await
        .expect("a request waited on the paused Redis")
        .status;
        assert_eq!(status, 200, "the local fallback admits");
    }
    assert_eq!(
        metric(&a, "tollgate_store_fallback_active").await,
        Some(1.0)
    );
    redis.resume();
    until_metric(
        &a,
        "tollgate_store_fallback_active",
        0.0,
        Duration::from_secs(5),
    )
    .await;
}

#[tokio::test]
async fn local_limits_stay_per_node_and_are_refunded_by_a_shared_denial() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.node]
key = "route"
algorithm = "fixed_window"
limit = 4
window = "1h"
local = true

[limits.per_user]
key = "header:x-user"
algorithm = "fixed_window"
limit = 2
window = "1h"

[limits.all]
key = "route"
algorithm = "fixed_window"
limit = 100
window = "1h"

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["node", "per_user"]

[[routes]]
name = "wide"
match = { path = "/wide" }
respond = { status = 200, body = "ok" }
limits = ["node", "all"]
"#;
    let a = gateway(&redis, "", &upstream, body).await;
    let b = gateway(&redis, "", &upstream, body).await;
    // u: 2 pass, 3 denied by the shared per_user limit, which refunds the
    // node limit each time; so v still finds 2 of node's 4 left on `a`.
    for expected in [200, 200, 429, 429, 429] {
        assert_eq!(get(a.addr, "/r", &[("x-user", "u")]).await.status, expected);
    }
    for expected in [200, 200, 429] {
        assert_eq!(get(a.addr, "/r", &[("x-user", "v")]).await.status, expected);
    }
    // `node` is per gateway: 4 on each, whatever the other did; the shared
    // limit was charged only for the admitted ones.
    let statuses = burst(&[&a], "/wide", 6, &[]).await;
    assert_eq!(count(&statuses, 200), 4, "{statuses:?}");
    let statuses = burst(&[&b], "/wide", 6, &[]).await;
    assert_eq!(count(&statuses, 200), 4, "{statuses:?}");
    let keys = redis.keys();
    let all = keys
        .iter()
        .find(|k| k.starts_with("tg:all:"))
        .expect("the shared key");
    assert_eq!(window_count(&redis, all), 8);
    assert!(
        !keys.iter().any(|k| k.starts_with("tg:node:")),
        "local limits stay in memory"
    );
}

#[tokio::test]
async fn cost_header_settles_against_redis() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.budget]
key = "header:x-user"
algorithm = "fixed_window"
limit = 10
window = "1h"

[[routes]]
name = "cost"
match = { path_prefix = "/cost" }
upstream = "api"
cost_header = "x-cost"
limits = ["budget"]
"#;
    let a = gateway(&redis, "", &upstream, body).await;
    let b = gateway(&redis, "", &upstream, body).await;
    assert_eq!(get(a.addr, "/cost/6", &[("x-user", "u")]).await.status, 200);
    let key = redis
        .keys()
        .into_iter()
        .find(|k| k.starts_with("tg:budget:"))
        .expect("key");
    assert!(
        eventually(async || window_count(&redis, &key) == 6).await,
        "settled to {}",
        window_count(&redis, &key)
    );
    // The other gateway sees the settled cost: 4 left, then a refund to 1.
    assert_eq!(get(b.addr, "/cost/0", &[("x-user", "u")]).await.status, 200);
    assert!(
        eventually(async || window_count(&redis, &key) == 6).await,
        "refund: {}",
        window_count(&redis, &key)
    );
    for _ in 0..4 {
        assert_eq!(get(b.addr, "/cost/1", &[("x-user", "u")]).await.status, 200);
    }
    assert_eq!(get(a.addr, "/cost/1", &[("x-user", "u")]).await.status, 429);
}

#[test]
fn check_accepts_redis_and_names_every_bad_store_key() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    let good = r#"
[store]
backend = "redis"
url = "redis://127.0.0.1:6379/0"
prefix = "edge:"
timeout = "20ms"
on_failure = "deny"
local_fraction = 0.5
remember_denials = "1s"

[limits.guard]
key = "route"
algorithm = "concurrency"
max = 10
local = true
"#;
    std::fs::write(&path, good).expect("write");
    let (code, stdout, stderr) = common::tollgate(&["check", "-c", path.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let bad = r#"
[store]
backend = "redis"
url = "http://127.0.0.1:6379"
prefix = "a {b}"
timeout = "20 parsecs"
on_failure = "denny"
local_fraction = 1.5
remember_denials = "soon"

[limits.tb]
key = "ip"
algorithm = "token_bucket"
capacity = 10
refill = "1/s"
lease = 50
"#;
    std::fs::write(&path, bad).expect("write");
    let (code, _, stderr) = common::tollgate(&["check", "-c", path.to_str().expect("utf-8")]);
    assert_eq!(code, 1, "{stderr}");
    for (line, key, says) in [
        (
            4,
            "store.url",
            "is not a Redis URL; expected redis://HOST:PORT",
        ),
        (5, "store.prefix", "cannot hold braces"),
        (6, "store.timeout", ""),
        (7, "store.on_failure", "did you mean `deny`?"),
        (8, "store.local_fraction", "expected a number in (0, 1]"),
        (9, "store.remember_denials", ""),
        (16, "limits.tb.lease", "expected 1 to the capacity (10)"),
    ] {
        let found = stderr.lines().any(|l| {
            l.contains(&format!("gateway.toml:{line}:"))
                && l.contains(&format!("`{key}`"))
                && l.contains(says)
        });
        assert!(found, "no error for {key} at line {line}:\n{stderr}");
    }
    let seeds = "url = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\n";
    let cluster = format!("[store]\nbackend = \"redis\"\ncluster = true\n{seeds}");
    std::fs::write(&path, cluster).expect("write");
    let (code, _, stderr) = common::tollgate(&["check", "-c", path.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "{stderr}");
    std::fs::write(&path, format!("[store]\nbackend = \"redis\"\n{seeds}")).expect("write");
    let (code, _, stderr) = common::tollgate(&["check", "-c", path.to_str().expect("utf-8")]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("gateway.toml:3:")
            && stderr.contains("a list of urls is for Redis Cluster"),
        "{stderr}"
    );
    let memory_lease = "[limits.tb]\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 10\nrefill = \"1/s\"\nlease = 5\n";
    std::fs::write(&path, memory_lease).expect("write");
    let (code, _, stderr) = common::tollgate(&["check", "-c", path.to_str().expect("utf-8")]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("gateway.toml:6:") && stderr.contains("set store.backend = \"redis\""),
        "{stderr}"
    );
    std::fs::write(&path, "[store]\nbackend = \"redis\"\n").expect("write");
    let (code, _, stderr) = common::tollgate(&["check", "-c", path.to_str().expect("utf-8")]);
    assert_eq!(code, 1);
    assert!(stderr.contains("needs a url"), "{stderr}");
}

async fn cluster_gateway(
    cluster: &common::redis::Cluster,
    upstream: &TestUpstream,
    body: &str,
) -> InProcess {
    cluster_gateway_timing_out(cluster, upstream, body, "500ms").await
}

async fn cluster_gateway_timing_out(
    cluster: &common::redis::Cluster,
    upstream: &TestUpstream,
    body: &str,
    timeout: &str,
) -> InProcess {
    let urls = cluster.toml_urls();
    InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[store]
backend = "redis"
cluster = true
url = [{urls}]
prefix = "tg:"
timeout = "{timeout}"

[upstreams.api]
url = "{upstream}"

{body}
"#,
        upstream = upstream.url(),
    ))
    .await
}

const CROSS_SLOT: &str = r#"
[limits.per_user]
key = "header:x-user"
algorithm = "fixed_window"
limit = 3
window = "1h"

[limits.per_route]
key = "route"
algorithm = "fixed_window"
limit = 10
window = "1h"

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["per_user", "per_route"]
"#;

#[tokio::test]
async fn cluster_stacks_across_slots_are_all_or_nothing() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let cluster = common::redis::Cluster::start(3, 0);
    let upstream = TestUpstream::start().await;
    let a = cluster_gateway(&cluster, &upstream, CROSS_SLOT).await;
    let b = cluster_gateway(&cluster, &upstream, CROSS_SLOT).await;
    let mut set = tokio::task::JoinSet::new();
    for user in 0..8 {
        for i in 0..5 {
            let addr = if (user + i) % 2 == 0 { a.addr } else { b.addr };
            set.spawn(async move {
                let user = format!("user-{user}");
                (
                    user.clone(),
                    get(addr, "/r", &[("x-user", &user)]).await.status,
                )
            });
        }
    }
    let mut admitted = std::collections::HashMap::<String, u64>::new();
    while let Some(result) = set.join_next().await {
        let (user, status) = result.expect("task");
        assert!(status == 200 || status == 429, "{status}");
        if status == 200 {
            *admitted.entry(user).or_default() += 1;
        }
    }
    assert_eq!(admitted.values().sum::<u64>(), 10, "{admitted:?}");
    assert!(admitted.values().all(|n| *n <= 3), "{admitted:?}");
    let keys = cluster.keys();
    let node = cluster.any();
    let route_key = keys
        .iter()
        .find(|k| k.starts_with("tg:per_route:"))
        .expect("route key");
    let user_keys: Vec<&String> = keys
        .iter()
        .filter(|k| k.starts_with("tg:per_user:"))
        .collect();
    let slot = |k: &str| node.cli(&["CLUSTER", "KEYSLOT", k]);
    assert!(
        user_keys.iter().all(|k| slot(k) != slot(route_key)),
        "keys in other slots"
    );
    // Refunds are in: the counters hold exactly the admitted requests.
    assert_eq!(window_count(node, route_key), 10);
    let user_sum: u64 = user_keys.iter().map(|k| window_count(node, k)).sum();
    assert_eq!(
        user_sum, 10,
        "a later slot's denial refunded the earlier slot"
    );
    for key in &keys {
        let ttl: i64 = node.cli(&["PTTL", key]).parse().expect("PTTL");
        assert!(ttl > 0, "{key}: PTTL {ttl}");
    }
}

/// The policy item of `name` in a `RateLimit` or `RateLimit-Policy` field.
fn policy<'f>(field: &'f str, name: &str) -> &'f str {
    let quoted = format!("\"{name}\"");
    field
        .split(", ")
        .find(|item| item.starts_with(&quoted))
        .unwrap_or_else(|| panic!("no {name} in {field}"))
}

/// A stack whose first limit admits on one Cluster slot and whose second
/// denies on another.
const REFUNDED_ON_ANOTHER_SLOT: &str = r#"
[limits.per_user]
key = "header:x-user"
algorithm = "fixed_window"
limit = 5
window = "1d"
# No window boundary inside the test.
align = "first_request"

[limits.per_route]
key = "route"
algorithm = "fixed_window"
limit = 2
window = "1d"
align = "first_request"

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["per_user", "per_route"]
"#;

/// Regression: on Cluster, when a later slot denied, the earlier slots were
/// refunded but the 429 gave their `r` as charged (`per_user`'s 2 here,
/// with 3 left in Redis). It gives them as refunded, as one Redis does.
#[tokio::test]
async fn a_later_slots_denial_shows_the_earlier_slots_as_refunded() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let cluster = common::redis::Cluster::start(3, 0);
    let upstream = TestUpstream::start().await;
    let gateway = cluster_gateway(&cluster, &upstream, REFUNDED_ON_ANOTHER_SLOT).await;
    let u = [("x-user", "u")];
    for (user_r, route_r) in [(4, 1), (3, 0)] {
        let reply = get(gateway.addr, "/r", &u).await;
        assert_eq!(reply.status, 200);
        let field = reply.header("ratelimit").expect("RateLimit");
        assert_eq!(remaining_and_reset(policy(field, "per_user")).0, user_r);
        assert_eq!(remaining_and_reset(policy(field, "per_route")).0, route_r);
    }
    let keys = cluster.keys();
    let node = cluster.any();
    let key = |prefix: &str| {
        keys.iter()
            .find(|k| k.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} key in {keys:?}"))
    };
    let (user_key, route_key) = (key("tg:per_user:"), key("tg:per_route:"));
    let slot = |k: &str| node.cli(&["CLUSTER", "KEYSLOT", k]);
    assert_ne!(
        slot(user_key),
        slot(route_key),
        "the limits' keys share a slot"
    );
    let denied = get(gateway.addr, "/r", &u).await;
    assert_eq!(denied.status, 429);
    assert_eq!(
        denied.header("x-ratelimit-limit"),
        Some("2"),
        "per_route denied"
    );
    let field = denied.header("ratelimit").expect("RateLimit");
    assert_eq!(
        remaining_and_reset(policy(field, "per_user")).0,
        3,
        "per_user's r after the refund: {field}"
    );
    assert_eq!(remaining_and_reset(policy(field, "per_route")).0, 0);
    // And Redis holds what the answer says.
    assert_eq!(window_count(node, user_key), 2);
    assert_eq!(window_count(node, route_key), 2);
}

/// Regression: under `on_failure = "local"`, a shared limit decided by its
/// scaled fallback gave the shared `q` (10) beside the fallback's `r` (out
/// of 5). `q`, `r` and the legacy trio are the fallback's, the limit that
/// decided.
#[tokio::test]
async fn the_local_fallback_answers_with_its_own_quota() {
    let upstream = TestUpstream::start().await;
    // Nothing listens there: the breaker is open from the start.
    let dead = format!("redis://127.0.0.1:{}", common::redis::free_port());
    let gateway = InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[store]
backend = "redis"
url = "{dead}"
on_failure = "local"
local_fraction = 0.5

[upstreams.api]
url = "{upstream}"

[limits.per_user]
key = "header:x-user"
algorithm = "fixed_window"
limit = 10
window = "1d"
align = "first_request"

[limits.guard]
key = "ip"
algorithm = "fixed_window"
limit = 100
window = "1h"
local = true

[[routes]]
name = "r"
match = {{ path = "/r" }}
respond = {{ status = 200, body = "ok" }}
limits = ["per_user", "guard"]
"#,
        upstream = upstream.url(),
    ))
    .await;
    let u = [("x-user", "u")];
    for left in (0..5).rev() {
        let reply = get(gateway.addr, "/r", &u).await;
        assert_eq!(reply.status, 200);
        let quota = reply.header("ratelimit-policy").expect("RateLimit-Policy");
        let field = reply.header("ratelimit").expect("RateLimit");
        assert!(
            policy(quota, "per_user").contains(";q=5;"),
            "the fallback's quota: {quota}"
        );
        assert!(policy(quota, "guard").contains(";q=100;"), "{quota}");
        assert_eq!(remaining_and_reset(policy(field, "per_user")).0, left);
        assert_eq!(reply.header("x-ratelimit-limit"), Some("5"));
        assert_eq!(
            reply.header("x-ratelimit-remaining"),
            Some(left.to_string().as_str())
        );
    }
    let denied = get(gateway.addr, "/r", &u).await;
    assert_eq!(denied.status, 429);
    let quota = denied.header("ratelimit-policy").expect("RateLimit-Policy");
    assert!(policy(quota, "per_user").contains(";q=5;"), "{quota}");
    assert_eq!(denied.header("x-ratelimit-limit"), Some("5"));
}

/// On Cluster, decisions of one slot that meet in a worker's queue share
/// script calls, as on one Redis, and admit exactly the limit.
#[tokio::test]
async fn cluster_decisions_of_one_slot_share_script_calls() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut cluster = common::redis::Cluster::start(3, 0);
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.per_route]
key = "route"
algorithm = "fixed_window"
limit = 150
window = "1h"

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["per_route"]
"#;
    let gateway = cluster_gateway_timing_out(&cluster, &upstream, body, "5s").await;
    assert_eq!(get(gateway.addr, "/r", &[]).await.status, 200);
    let key = cluster
        .keys()
        .into_iter()
        .find(|k| k.starts_with("tg:per_route:"))
        .expect("route key");
    let node = cluster.primary_of(&key);
    node.cli(&["CONFIG", "RESETSTAT"]);
    // The requests meet in the workers' queues while the key's shard
    // does not answer.
    let statuses = burst_while_paused(node, &gateway, "/r", 300, |i| format!("user-{i}")).await;
    assert_eq!(count(&statuses, 200), 149, "{statuses:?}");
    assert_eq!(count(&statuses, 429), 151, "{statuses:?}");
    let calls = evalsha_calls(node);
    // Unbatched, this was 300 calls.
    assert!(
        (2..=60).contains(&calls),
        "{calls} script calls for 300 decisions"
    );
    assert_eq!(window_count(node, &key), 150);
    assert_eq!(
        metric(&gateway, "tollgate_store_errors_total")
            .await
            .unwrap_or(0.0),
        0.0
    );
}

#[tokio::test]
async fn cluster_failover_while_serving() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut cluster = common::redis::Cluster::start(3, 1);
    let upstream = TestUpstream::start().await;
    let body = ONE_LIMIT;
    let a = cluster_gateway(&cluster, &upstream, body).await;
    assert_eq!(get(a.addr, "/r", &[("x-user", "u")]).await.status, 200);
    let key = cluster
        .keys()
        .into_iter()
        .find(|k| k.starts_with("tg:fw:"))
        .expect("key");
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let load = {
        let (stop, served, addr) = (stop.clone(), served.clone(), a.addr);
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                statuses.push(get(addr, "/r", &[("x-user", "u")]).await.status);
                served.fetch_add(1, Ordering::Relaxed);
            }
            statuses
        })
    };
    assert!(
        eventually(async || served.load(Ordering::Relaxed) >= 10).await,
        "no load"
    );
    let before = window_count(cluster.any(), &key);
    cluster.primary_of(&key).kill();
    // The replica takes over (node timeout 1 s); the key is counted again.
    let failed_over = async || {
        let now = cluster.any().try_count(&key).unwrap_or(0);
        now > before + 5 && metric(&a, "tollgate_store_fallback_active").await == Some(0.0)
    };
    if !eventually(failed_over).await {
        let node = cluster.any();
        panic!(
            "no failover: {before} -> {} ({:?} from {}; fallback {:?})",
            node.try_count(&key).unwrap_or(0),
            node.try_cli(&["GET", &key]),
            node.port,
            metric(&a, "tollgate_store_fallback_active").await
        );
    }
    stop.store(true, Ordering::Relaxed);
    let statuses = load.await.expect("load");
    assert!(
        statuses.iter().all(|s| *s == 200),
        "no 5xx through the failover"
    );
}

/// Sends `n` requests one by one; how many were admitted.
async fn admitted(gateway: &impl Node, user: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let status = get(gateway.addr(), "/r", &[("x-user", user)]).await.status;
        assert!(status == 200 || status == 429, "{status}");
        ok += usize::from(status == 200);
    }
    ok
}

#[tokio::test]
async fn auto_local_fraction_splits_the_fallback_between_live_nodes() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = ONE_LIMIT.replace("limit = 100000", "limit = 30");
    let store = "on_failure = \"local\"\nlocal_fraction = \"auto\"";
    let nodes = |n: usize| format!("{n} live gateway nodes");
    // The binary: the store thread's lines are read on its stderr.
    let a = gateway_process(&redis, store, &upstream, &body);
    let b = gateway_process(&redis, store, &upstream, &body);
    for g in [&a, &b] {
        let log = g.stderr_when(|log| log.contains(&nodes(2)), Duration::from_secs(10));
        assert!(log.contains(&nodes(2)), "{log}");
    }
    // Heartbeats are one key with an expiry, members by node id only.
    assert_keys_expire_and_hide(&redis, &["127.0.0.1"]);
    redis.kill();
    for g in [&a, &b] {
        until_metric(
            g,
            "tollgate_store_fallback_active",
            1.0,
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(
            admitted(g, "p", 20).await,
            15,
            "half of 30 on each of 2 nodes"
        );
    }
    redis.restart();
    for g in [&a, &b] {
        until_metric(
            g,
            "tollgate_store_fallback_active",
            0.0,
            Duration::from_secs(5),
        )
        .await;
    }
    let c = gateway_process(&redis, store, &upstream, &body);
    for g in [&a, &b, &c] {
        let log = g.stderr_when(|log| log.contains(&nodes(3)), Duration::from_secs(10));
        assert!(log.contains(&nodes(3)), "{log}");
    }
    redis.kill();
    for g in [&a, &b, &c] {
        until_metric(
            g,
            "tollgate_store_fallback_active",
            1.0,
            Duration::from_secs(10),
        )
        .await;
        assert_eq!(
            admitted(g, "q", 15).await,
            10,
            "a third of 30 on each of 3 nodes"
        );
    }
}

/// What a token bucket with `refill = "1/h"` has given out, read from its
/// GCRA `tat` (`now + used × 1 h`, in µs) against Redis TIME.
fn tokens_used(redis: &Redis, key: &str) -> u64 {
    let tat: f64 = redis.cli(&["GET", key]).parse().expect("tat");
    let time = redis.cli(&["TIME"]);
    let mut parts = time
        .split_whitespace()
        .map(|p| p.parse::<f64>().expect("TIME"));
    let now = parts.next().expect("secs") * 1e6 + parts.next().expect("us");
    ((tat - now) / 3.6e9).ceil() as u64
}

fn evalsha_calls(redis: &Redis) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn leased_tokens_cut_redis_calls_and_keep_the_bound() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.tb]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 250
refill = "1/h"
lease = 100

[limits.big]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 100000
refill = "1/h"
lease = 100

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["tb"]

[[routes]]
name = "big"
match = { path = "/big" }
respond = { status = 200, body = "ok" }
limits = ["big"]
"#;
    let a = gateway(&redis, "", &upstream, body).await;
    let b = gateway(&redis, "", &upstream, body).await;
    // At least 10x fewer calls than requests with lease = 100.
    redis.cli(&["CONFIG", "RESETSTAT"]);
    for i in 0..400 {
        let g = if i % 2 == 0 { &a } else { &b };
        assert_eq!(get(g.addr, "/big", &[("x-user", "u")]).await.status, 200);
    }
    let calls = evalsha_calls(&redis);
    assert!(calls <= 40, "{calls} script calls for 400 requests");
    // Two nodes, N = 100, no refill to speak of: never more than the
    // capacity, and a node is denied early by at most (2 - 1) x 100 tokens
    // held by the other.
    let mut total = 0;
    let mut first_denial_at = None;
    for i in 0..300 {
        let g = if i % 2 == 0 { &a } else { &b };
        match get(g.addr, "/r", &[("x-user", "u")]).await.status {
            200 => total += 1,
            429 => {
                first_denial_at.get_or_insert(total);
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!(total, 250, "exactly the capacity");
    let early = first_denial_at.expect("a denial");
    assert!(early >= 250 - 100, "first denial after {early} admissions");
    // Unspent tokens go back when the lease lapses: `a` takes 100 for one
    // request, and after the hold `b` finds the other 249.
    let buckets = || -> Vec<String> {
        redis
            .keys()
            .into_iter()
            .filter(|k| k.ends_with(":tb"))
            .collect()
    };
    let before = buckets();
    assert_eq!(get(a.addr, "/r", &[("x-user", "w")]).await.status, 200);
    let w = buckets()
        .into_iter()
        .find(|k| !before.contains(k))
        .expect("w's bucket");
    assert!(tokens_used(&redis, &w) >= 100, "a took a lease");
    assert!(
        eventually(async || tokens_used(&redis, &w) == 1).await,
        "the lease never lapsed: {} tokens out",
        tokens_used(&redis, &w)
    );
    let mut on_b = 0;
    for _ in 0..260 {
        on_b += usize::from(get(b.addr, "/r", &[("x-user", "w")]).await.status == 200);
    }
    assert_eq!(on_b, 249, "the unspent lease came back");
    assert_keys_expire_and_hide(&redis, &["\"w\"", "\"u\""]);
}

/// One worker, a patient timeout: while Redis is paused every decision
/// queues behind the one in flight, so the batching is certain.
async fn one_worker_gateway(redis: &Redis, upstream: &TestUpstream, body: &str) -> InProcess {
    InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1

[store]
backend = "redis"
url = "{url}"
prefix = "tg:"
timeout = "5s"

[upstreams.api]
url = "{upstream}"

{body}
"#,
        url = redis.url(),
        upstream = upstream.url(),
    ))
    .await
}

/// `burst` of `n` to `path` on `gateway` (headers per request from
/// `header_of(i)`), sent while Redis is paused so that they meet in the
/// worker's queue; returns the statuses by request index.
async fn burst_while_paused(
    redis: &mut Redis,
    gateway: &InProcess,
    path: &str,
    n: usize,
    header_of: impl Fn(usize) -> String,
) -> Vec<u16> {
    redis.pause();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..n {
        let (addr, path, user) = (gateway.addr, path.to_owned(), header_of(i));
        set.spawn(async move { (i, get(addr, &path, &[("x-user", &user)]).await.status) });
    }
    // Long enough for every request to reach the gateway's queue; far
    // below the 5 s timeout.
    tokio::time::sleep(Duration::from_millis(400)).await;
    redis.resume();
    let mut statuses = vec![0; n];
    while let Some(result) = set.join_next().await {
        let (i, status) = result.expect("request task");
        statuses[i] = status;
    }
    statuses
}

#[tokio::test]
async fn concurrent_decisions_share_script_calls_and_admit_exactly_the_limit() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.fw]
key = "header:x-user"
algorithm = "fixed_window"
limit = 150
window = "1h"

[limits.tb]
key = "route"
algorithm = "token_bucket"
capacity = 1000
refill = "1/h"

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["fw", "tb"]
"#;
    let a = one_worker_gateway(&redis, &upstream, body).await;
    assert_eq!(get(a.addr, "/r", &[("x-user", "warm")]).await.status, 200);
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let statuses = burst_while_paused(&mut redis, &a, "/r", 300, |_| "u".into()).await;
    assert_eq!(count(&statuses, 200), 150, "{statuses:?}");
    assert_eq!(count(&statuses, 429), 150, "{statuses:?}");
    let calls = evalsha_calls(&redis);
    // One call in flight while the rest queue: 300 decisions in a handful
    // of calls of at most 64 each (a few more if requests trickle in late).
    assert!(
        (5..=60).contains(&calls),
        "{calls} script calls for 300 decisions"
    );
    // Exactly the admitted ones were charged, on both keys.
    let fw: u64 = redis
        .keys()
        .iter()
        .filter(|k| k.starts_with("tg:fw:"))
        .map(|k| window_count(&redis, k))
        .sum();
    assert_eq!(fw, 151, "150 for u, 1 for the warm-up");
    assert_eq!(
        metric(&a, "tollgate_store_fallback_active").await,
        Some(0.0)
    );
    assert_eq!(
        metric(&a, "tollgate_store_errors_total")
            .await
            .unwrap_or(0.0),
        0.0
    );
    assert_keys_expire_and_hide(&redis, &["\"u\"", "warm"]);
}

/// One response's numbers: status, `r`, `t` and Retry-After.
type Answer = (u16, u64, u64, Option<u64>);

fn answer_of(reply: &common::Reply) -> Answer {
    let field = reply.header("ratelimit").expect("RateLimit field");
    let (r, t) = remaining_and_reset(field);
    let retry = reply
        .header("retry-after")
        .map(|v| v.parse().expect("Retry-After"));
    (reply.status, r, t, retry)
}

/// Many keys of one limit decided in a few batches (the script shares the
/// limit's parameters among them, reads every key with one MGET, and
/// answers plain admissions in short form) answer exactly as single
/// decisions in memory: per key the same statuses and `r`, `t` and
/// Retry-After within the second that can pass between the two. Some keys
/// come several times in one batch, past their limit.
#[tokio::test]
async fn a_batch_of_many_keys_of_one_limit_decides_as_single_decisions() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let on_redis = one_worker_gateway(&redis, &upstream, ALGORITHMS).await;
    let in_memory = memory_gateway(&upstream, ALGORITHMS).await;
    // User j sends j % 10 requests: 0 to 9 against a limit of 7.
    let users: Vec<String> = (0..20)
        .flat_map(|j| std::iter::repeat_n(format!("user-{j}"), j % 10))
        .collect();
    for route in ["fw", "sw", "sl", "tb", "lb"] {
        let path = format!("/{route}");
        redis.cli(&["CONFIG", "RESETSTAT"]);
        let n = users.len();
        redis.pause();
        let mut set = tokio::task::JoinSet::new();
        for (i, user) in users.iter().enumerate() {
            let (addr, path, user) = (on_redis.addr, path.clone(), user.clone());
            set.spawn(async move { (i, get(addr, &path, &[("x-user", &user)]).await) });
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        redis.resume();
        let mut shared: Vec<Option<Answer>> = vec![None; n];
        while let Some(result) = set.join_next().await {
            let (i, reply) = result.expect("request task");
            shared[i] = Some(answer_of(&reply));
        }
        let calls = evalsha_calls(&redis);
        assert!(
            calls < 20,
            "/{route}: {calls} script calls for {n} decisions"
        );
        for j in 0..20 {
            let user = format!("user-{j}");
            let mut memory: Vec<Answer> = Vec::new();
            for _ in 0..j % 10 {
                memory.push(answer_of(
                    &get(in_memory.addr, &path, &[("x-user", &user)]).await,
                ));
            }
            // The order of a user's requests within a batch is the order
            // they arrived in: compare them sorted.
            let mut redis_answers: Vec<Answer> = users
                .iter()
                .zip(&shared)
                .filter(|(u, _)| **u == user)
                .map(|(_, a)| a.expect("answered"))
                .collect();
            memory.sort_unstable();
            redis_answers.sort_unstable();
            let what = format!("/{route} {user}");
            assert_eq!(memory.len(), redis_answers.len(), "{what}");
            for (m, r) in memory.iter().zip(&redis_answers) {
                assert_eq!(
                    (m.0, m.1),
                    (r.0, r.1),
                    "{what}: status and r, {memory:?} / {redis_answers:?}"
                );
                assert!(
                    m.2.abs_diff(r.2) <= 1,
                    "{what}: t {memory:?} / {redis_answers:?}"
                );
                match (m.3, r.3) {
                    (None, None) => {}
                    (Some(a), Some(b)) => {
                        assert!(a.abs_diff(b) <= 1, "{what}: Retry-After {a} / {b}")
                    }
                    other => panic!("{what}: Retry-After in memory / on redis: {other:?}"),
                }
            }
        }
    }
    assert_keys_expire_and_hide(&redis, &["user-"]);
}

#[tokio::test]
async fn a_denied_stack_in_a_batch_charges_nothing_and_spares_the_others() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.per_user]
key = "header:x-user"
algorithm = "fixed_window"
limit = 1
window = "1h"

[limits.per_route]
key = "route"
algorithm = "fixed_window"
limit = 1000
window = "1h"

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["per_route", "per_user"]
"#;
    let a = one_worker_gateway(&redis, &upstream, body).await;
    assert_eq!(get(a.addr, "/r", &[("x-user", "spent")]).await.status, 200);
    redis.cli(&["CONFIG", "RESETSTAT"]);
    // Every third request is from `spent`, whose per_user limit is used up:
    // its stack denies, even though per_route (listed first) would admit.
    let user = |i: usize| {
        if i.is_multiple_of(3) {
            "spent".to_owned()
        } else {
            format!("user-{i}")
        }
    };
    let statuses = burst_while_paused(&mut redis, &a, "/r", 60, user).await;
    for (i, status) in statuses.iter().enumerate() {
        let expected = if i.is_multiple_of(3) { 429 } else { 200 };
        assert_eq!(*status, expected, "request {i} ({}): {statuses:?}", user(i));
    }
    let calls = evalsha_calls(&redis);
    assert!(calls < 20, "{calls} script calls for 60 decisions");
    // per_route holds the first request and the 40 admitted, none of the
    // 20 denied; each new user holds exactly its one.
    let keys = redis.keys();
    let route = keys
        .iter()
        .find(|k| k.starts_with("tg:per_route:"))
        .expect("route key");
    assert_eq!(window_count(&redis, route), 41);
    let users: Vec<u64> = keys
        .iter()
        .filter(|k| k.starts_with("tg:per_user:"))
        .map(|k| window_count(&redis, k))
        .collect();
    assert_eq!(users.len(), 41, "{users:?}");
    assert!(users.iter().all(|n| *n == 1), "{users:?}");
    assert_keys_expire_and_hide(&redis, &["spent", "user-"]);
}

#[tokio::test]
async fn a_node_takes_one_lease_at_a_time_when_its_requests_miss_together() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.tb]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 1000
refill = "1/h"
lease = 100

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["tb"]
"#;
    let a = one_worker_gateway(&redis, &upstream, body).await;
    // 50 requests find no leased tokens at once: the first takes a lease,
    // the others (queued behind it) only their cost. Were each to take a
    // lease, ten would empty the bucket and the other forty be denied.
    let statuses = burst_while_paused(&mut redis, &a, "/r", 50, |_| "u".into()).await;
    assert_eq!(count(&statuses, 200), 50, "{statuses:?}");
    // What the node took from the shared bucket: its GCRA `tat` is `now +
    // used × 1 h` (refill 1/h), read against Redis TIME.
    let key = redis
        .keys()
        .into_iter()
        .find(|k| k.ends_with(":tb"))
        .expect("bucket key");
    let used = tokens_used(&redis, &key);
    assert!(
        (100..=149).contains(&used),
        "the node took {used} tokens for 50 requests: one lease of 100 and the rest's cost"
    );
}

/// `remember_denials`: a node answers a key's repeated denials from Redis's
/// last answer, without a call, until the retry-after Redis gave or
/// `remember_denials`, whichever is first; the answer is the one Redis gave
/// (same fields, the retry-after counted down). Never for a limit a
/// response can refund (`cost_header`); forgotten on reload; off unless set.
#[tokio::test]
async fn remembered_denials_spare_redis_calls_until_their_retry_after() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    // Buckets, not fixed windows: a window's boundary passing during the
    // test would admit what the test expects denied.
    let body = |slow_capacity: u64| {
        format!(
            r#"
[limits.bucket]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 1
refill = "12/m"

[limits.slow]
key = "header:x-user"
algorithm = "token_bucket"
capacity = {slow_capacity}
refill = "1/h"

[limits.settled]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 2
refill = "1/h"

[[routes]]
name = "bucket"
match = {{ path = "/bucket" }}
respond = {{ status = 200, body = "ok" }}
limits = ["bucket"]

[[routes]]
name = "slow"
match = {{ path = "/slow" }}
respond = {{ status = 200, body = "ok" }}
limits = ["slow"]

[[routes]]
name = "settled"
match = {{ path = "/settled" }}
upstream = "api"
cost_header = "x-cost"
limits = ["settled"]
"#
        )
    };
    let store = "remember_denials = \"2s\"";
    let gw = gateway(&redis, store, &upstream, &body(2)).await;
    let user = [("x-user", "u")];
    let remembered = async || {
        metric(&gw, "tollgate_store_remembered_denials_total")
            .await
            .unwrap_or(0.0)
    };

    // The bucket's token, then the first denial asks Redis; the next 10 do
    // not. They are sent within its retry-after, which is the 5 s of the
    // next token less one request (a gateway remembering for 10 s: the
    // retry-after is the shorter), a margin a loaded machine keeps.
    let bucket_gw = gateway(&redis, "remember_denials = \"10s\"", &upstream, &body(2)).await;
    let bucket_remembered = async || {
        metric(&bucket_gw, "tollgate_store_remembered_denials_total")
            .await
            .unwrap_or(0.0)
    };
    assert_eq!(get(bucket_gw.addr, "/bucket", &user).await.status, 200);
    let asked = get(bucket_gw.addr, "/bucket", &user).await;
    let asked_at = std::time::Instant::now();
    assert_eq!(asked.status, 429);
    let retry_after = |reply: &common::Reply| -> u64 {
        reply
            .header("retry-after")
            .and_then(|value| value.parse().ok())
            .expect("a Retry-After")
    };
    let waited = retry_after(&asked);
    assert!((1..=5).contains(&waited), "Retry-After {waited}");
    let calls = evalsha_calls(&redis);
    let mut answers = Vec::new();
    for _ in 0..10 {
        answers.push(get(bucket_gw.addr, "/bucket", &user).await);
    }
    assert!(
        asked_at.elapsed() < Duration::from_secs(waited - 1).max(Duration::from_millis(900)),
        "too slow to show anything: ten requests took {:?}",
        asked_at.elapsed()
    );
    assert_eq!(
        evalsha_calls(&redis),
        calls,
        "a remembered denial made a call"
    );
    assert_eq!(bucket_remembered().await, 10.0);
    // Redis's answer, fields and all, its retry-after counted down.
    let fields = |reply: &common::Reply| -> Vec<String> {
        let mut names: Vec<String> = reply.headers.keys().map(|k| k.to_string()).collect();
        names.retain(|n| n != "date" && n != "content-length");
        names.sort();
        names
    };
    let (asked_r, asked_t) = remaining_and_reset(asked.header("ratelimit").unwrap());
    for reply in &answers {
        assert_eq!(reply.status, 429);
        assert_eq!(fields(reply), fields(&asked));
        assert!((1..=waited).contains(&retry_after(reply)));
        assert_eq!(reply.body, asked.body);
        let (r, t) = remaining_and_reset(reply.header("ratelimit").expect("RateLimit"));
        assert_eq!(r, asked_r);
        assert!(t <= asked_t, "{t} > {asked_t}");
    }
    // No longer than the retry-after: the next token is there once it has
    // gone by, and this node admits it (`remember_denials` is 10 s).
    tokio::time::sleep(
        Duration::from_millis(waited * 1000 + 200).saturating_sub(asked_at.elapsed()),
    )
    .await;
    assert_eq!(get(bucket_gw.addr, "/bucket", &user).await.status, 200);

    // No longer than `remember_denials`: a denial whose retry-after is an
    // hour is asked again after 2 s.
    for _ in 0..2 {
        assert_eq!(get(gw.addr, "/slow", &user).await.status, 200);
    }
    assert_eq!(get(gw.addr, "/slow", &user).await.status, 429);
    let calls = evalsha_calls(&redis);
    assert_eq!(get(gw.addr, "/slow", &user).await.status, 429);
    assert_eq!(evalsha_calls(&redis), calls);
    tokio::time::sleep(Duration::from_millis(2200)).await;
    assert_eq!(get(gw.addr, "/slow", &user).await.status, 429);
    assert_eq!(evalsha_calls(&redis), calls + 1, "asked again after 2 s");
    // A reload forgets (an operator who deleted a key in Redis can make
    // every node ask again), even one that changes nothing...
    let calls = evalsha_calls(&redis);
    assert_eq!(get(gw.addr, "/slow", &user).await.status, 429);
    assert_eq!(evalsha_calls(&redis), calls);
    gw.reload();
    assert_eq!(get(gw.addr, "/slow", &user).await.status, 429);
    assert_eq!(
        evalsha_calls(&redis),
        calls + 1,
        "asked again after a reload"
    );
    // ...and new numbers apply at once.
    let config = std::fs::read_to_string(&gw.config_path).expect("config");
    let raised = config.replace(
        "capacity = 2\nrefill = \"1/h\"\n\n[limits.settled]",
        "capacity = 5\nrefill = \"1/h\"\n\n[limits.settled]",
    );
    assert_ne!(raised, config);
    gw.reload_with(&raised);
    assert_eq!(get(gw.addr, "/slow", &user).await.status, 200);

    // A limit a response can refund is never remembered: each denial asks.
    for _ in 0..2 {
        assert_eq!(get(gw.addr, "/settled", &user).await.status, 200);
    }
    let (calls, before) = (evalsha_calls(&redis), remembered().await);
    for _ in 0..5 {
        assert_eq!(get(gw.addr, "/settled", &user).await.status, 429);
    }
    assert_eq!(evalsha_calls(&redis), calls + 5);
    assert_eq!(remembered().await, before);

    // Off unless set: every denial asks.
    let plain = gateway(&redis, "", &upstream, &body(2)).await;
    let other = [("x-user", "v")];
    for _ in 0..2 {
        assert_eq!(get(plain.addr, "/slow", &other).await.status, 200);
    }
    let calls = evalsha_calls(&redis);
    for _ in 0..5 {
        assert_eq!(get(plain.addr, "/slow", &other).await.status, 429);
    }
    assert_eq!(evalsha_calls(&redis), calls + 5);
    assert_eq!(
        metric(&plain, "tollgate_store_remembered_denials_total").await,
        Some(0.0)
    );

    // Redis gone: a remembered denial still answers for its time (the
    // fallback, `on_failure = "local"` from an empty state, would admit).
    let long = gateway(&redis, "remember_denials = \"30s\"", &upstream, &body(2)).await;
    let third = [("x-user", "w")];
    for _ in 0..2 {
        assert_eq!(get(long.addr, "/slow", &third).await.status, 200);
    }
    assert_eq!(get(long.addr, "/slow", &third).await.status, 429);
    redis.kill();
    assert_eq!(get(long.addr, "/slow", &third).await.status, 429);
    assert_eq!(
        metric(&long, "tollgate_store_remembered_denials_total").await,
        Some(1.0)
    );
    assert_eq!(
        get(long.addr, "/slow", &[("x-user", "z")]).await.status,
        200
    );
}

/// The slots of `alive` (a `concurrency` limit of 1) `user` has free on
/// `gateway`, by its admin.
async fn slots_left(gateway: &InProcess, user: &str) -> u64 {
    let path = format!("/limits/alive?key={user}");
    let reply = get(gateway.admin.expect("admin"), &path, &[]).await;
    reply.json()["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("{path}: {:?}", reply.body))
}

/// A decision sent from its request's own task (nothing else waiting) whose
/// request goes away mid-call — an HTTP/2 stream reset while Redis is
/// paused — gives the worker's call back. After three of them (more than
/// the calls a worker keeps in flight), a decision is still sent and
/// answered at once when Redis resumes, not left queued until `timeout`.
///
/// Each request also holds its user's slot of a node-local `concurrency`
/// limit while its call is out, and the admin's `/limits/alive?key=USER`
/// shows it (`remaining` 0) until the gateway drops the request (1): the
/// test sees each request reach its call, then go, and only then resumes
/// Redis, so what it shows is the give-back.
#[tokio::test]
async fn a_request_gone_mid_call_gives_its_call_back() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let body = r#"
[limits.per_user]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 10
refill = "1/s"

[limits.alive]
key = "header:x-user"
algorithm = "concurrency"
max = 1
local = true

[[routes]]
name = "r"
match = { path = "/r" }
respond = { status = 200, body = "ok" }
limits = ["alive", "per_user"]
"#;
    let gw = one_worker_gateway(&redis, &upstream, body).await;
    assert_eq!(get(gw.addr, "/r", &[("x-user", "warm")]).await.status, 200);
    // h2c with prior knowledge: dropping a response future resets its stream.
    let stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    redis.pause();
    for i in 0..3 {
        let request = hyper::Request::get(format!("http://{}/r", gw.addr))
            .header("x-user", format!("gone-{i}"))
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let response = sender.send_request(request);
        // In the gateway, its call out (its slot taken); dropped here, so
        // its stream reset.
        let user = format!("gone-{i}");
        let response = std::pin::pin!(response);
        let sent = tokio::select! {
            answered = response => panic!("answered while Redis was paused: {answered:?}"),
            held = common::eventually(async || slots_left(&gw, &user).await == 0) => held,
        };
        assert!(sent, "{user}'s request never reached the decision");
    }
    // The resets reach the gateway, which drops the three requests (and
    // their slots), Redis still paused.
    for i in 0..3 {
        let user = format!("gone-{i}");
        let gone = common::eventually(async || slots_left(&gw, &user).await == 1).await;
        assert!(gone, "{user}'s request was not dropped on its reset");
    }
    // Freed by the resets, not answered by the store's `timeout` (an error).
    assert_eq!(
        metric(&gw, "tollgate_store_errors_total").await,
        Some(0.0),
        "the requests ended by timing out, not by their resets"
    );
    redis.resume();
    let reply = tokio::time::timeout(
        Duration::from_secs(3),
        get(gw.addr, "/r", &[("x-user", "after")]),
    )
    .await
    .expect("a decision waited for a call that no longer exists");
    assert_eq!(reply.status, 200);
    assert_eq!(metric(&gw, "tollgate_store_errors_total").await, Some(0.0));
}
