//! `GET /limits/NAME?key=` on a shared limit (`store.backend = "redis"`),
//! against real `redis-server` processes: the state is Redis's, the one
//! every node decides against (not the node's fallback limiter), read
//! without charging or writing anything; on Redis Cluster from the key's
//! slot; and while Redis is down, the node's fallback state, labelled so.

mod common;

use common::redis::Redis;
use common::{InProcess, TestUpstream, eventually, get};

/// Every algorithm, keyed by `x-user`, in one stack. Windows of a day
/// (the fixed one opened by the first request) and buckets refilling once
/// an hour: no boundary or refill moves a count during the test.
const STACK: &str = r#"
[limits.fw]
key = "header:x-user"
algorithm = "fixed_window"
limit = 10
window = "1d"
align = "first_request"

[limits.sw]
key = "header:x-user"
algorithm = "sliding_window"
limit = 10
window = "1d"

[limits.sl]
key = "header:x-user"
algorithm = "sliding_log"
limit = 10
window = "1d"

[limits.tb]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 10
refill = "1/h"

[limits.lb]
key = "header:x-user"
algorithm = "leaky_bucket"
capacity = 10
rate = "1/h"
mode = "reject"

[limits.cc]
key = "header:x-user"
algorithm = "concurrency"
max = 4

[[routes]]
name = "all"
match = { path = "/all" }
respond = { status = 200, body = "ok" }
limits = ["fw", "sw", "sl", "tb", "lb", "cc"]
"#;

/// The limits of [`STACK`] whose state a finished request leaves charged.
const CHARGED: [&str; 5] = ["fw", "sw", "sl", "tb", "lb"];

fn config(store: &str, upstream: &TestUpstream, body: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[store]
backend = "redis"
prefix = "tg:"
timeout = "500ms"
{store}

[upstreams.api]
url = "{upstream}"

{body}
"#,
        upstream = upstream.url(),
    )
}

/// The explain answer of `limit` for user `user` on `gateway`'s admin.
async fn explain(gateway: &InProcess, limit: &str, user: &str) -> serde_json::Value {
    let admin = gateway.admin.expect("an admin listener");
    let reply = get(admin, &format!("/limits/{limit}?key={user}"), &[]).await;
    assert_eq!(reply.status, 200, "{limit}: {:?}", reply.body);
    reply.json()
}

/// `r` of `policy` in a `RateLimit` header (`"fw";r=7;t=86400, …`).
fn remaining_in(header: &str, policy: &str) -> u64 {
    param_in(header, policy, "r=")
}

/// The parameter `name` (`"r="`, `"q="`) of `policy` in a structured
/// `RateLimit` or `RateLimit-Policy` header.
fn param_in(header: &str, policy: &str, name: &str) -> u64 {
    header
        .split(',')
        .find(|item| item.trim().starts_with(&format!("\"{policy}\"")))
        .and_then(|item| item.split(';').find_map(|p| p.trim().strip_prefix(name)))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no {name} for {policy} in {header}"))
}

/// Redis's count of writes since it started (`rdb_changes_since_last_save`,
/// the tests' servers never save): a script call that writes moves it.
fn writes(redis: &Redis) -> u64 {
    let info = redis.cli(&["INFO", "persistence"]);
    info.lines()
        .find_map(|line| line.strip_prefix("rdb_changes_since_last_save:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no write count in {info}"))
}

#[tokio::test]
async fn explain_shows_redis_state_for_a_shared_limit_and_writes_nothing() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let store = format!("url = \"{}\"", redis.url());
    let a = InProcess::start(&config(&store, &upstream, STACK)).await;
    let b = InProcess::start(&config(&store, &upstream, STACK)).await;

    // Three requests through a; b decided none, so its fallback limiters
    // are full: b's explain can only show 7 by reading Redis.
    let mut last = None;
    for _ in 0..3 {
        let reply = get(a.addr, "/all", &[("x-user", "alice")]).await;
        assert_eq!(reply.status, 200);
        last = Some(reply);
    }
    let last = last.expect("a reply");
    let header = last.header("ratelimit").expect("a RateLimit header");
    let policy = last
        .header("ratelimit-policy")
        .expect("a RateLimit-Policy header");
    for limit in CHARGED {
        let explained = explain(&b, limit, "alice").await;
        assert_eq!(explained["source"], "redis", "{limit}: {explained}");
        // The shared numbers, and what a's last decision said was left.
        assert_eq!(explained["quota"], param_in(policy, limit, "q="), "{limit}");
        assert_eq!(
            explained["remaining"],
            remaining_in(header, limit),
            "{limit}: {explained}"
        );
        let quota = explained["quota"].as_u64();
        assert_eq!(
            explained["remaining"].as_u64(),
            quota.map(|q| q - 3),
            "{limit}"
        );
    }
    // The concurrency slots are given back when the responses end.
    let released = eventually(async || explain(&b, "cc", "alice").await["remaining"] == 4).await;
    assert!(released, "{}", explain(&b, "cc", "alice").await);

    // A look writes nothing: not for a charged key, nor for a key Redis has
    // never seen (a decision would open its `first_request` window).
    let keys = redis.keys().len();
    let before = writes(&redis);
    for _ in 0..2 {
        for limit in CHARGED.iter().chain(&["cc"]) {
            let alice = explain(&b, limit, "alice").await;
            let bob = explain(&a, limit, "bob").await;
            assert_eq!(alice["source"], "redis");
            assert_eq!(bob["source"], "redis");
            assert_eq!(bob["remaining"], bob["quota"], "{limit}: {bob}");
            let left = alice["quota"].as_u64().map(|q| q - 3);
            let left = if *limit == "cc" { Some(4) } else { left };
            assert_eq!(alice["remaining"].as_u64(), left, "{limit}: {alice}");
        }
    }
    assert_eq!(writes(&redis), before, "an explain wrote to Redis");
    assert_eq!(redis.keys().len(), keys, "an explain made a key");
    // The next request is still the fourth.
    let reply = get(b.addr, "/all", &[("x-user", "alice")]).await;
    let header = reply.header("ratelimit").expect("a RateLimit header");
    assert_eq!(remaining_in(header, "fw"), 6, "{header}");
}

#[tokio::test]
async fn explain_shows_the_fallback_state_labelled_while_redis_is_down() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let store = format!("url = \"{}\"", redis.url());
    let a = InProcess::start(&config(&store, &upstream, STACK)).await;
    for _ in 0..3 {
        assert_eq!(
            get(a.addr, "/all", &[("x-user", "alice")]).await.status,
            200
        );
    }
    assert_eq!(explain(&a, "fw", "alice").await["remaining"], 7);

    redis.kill();
    // Redis decided those three: the node's fallback limiter is untouched.
    let explained = explain(&a, "fw", "alice").await;
    assert_eq!(explained["source"], "fallback", "{explained}");
    assert_eq!(explained["on_failure"], "local", "{explained}");
    assert_eq!(explained["remaining"], 10, "{explained}");
    let note = explained["note"].as_str().unwrap_or_default();
    assert!(note.contains("redis did not answer"), "{explained}");
    // What the fallback decides meanwhile is what explain shows.
    let charged = eventually(async || {
        get(a.addr, "/all", &[("x-user", "alice")]).await.status == 200
            && explain(&a, "fw", "alice").await["remaining"] != 10
    })
    .await;
    assert!(charged, "no request charged the fallback limiter");
    let explained = explain(&a, "fw", "alice").await;
    assert_eq!(explained["source"], "fallback", "{explained}");
    let left = explained["remaining"].as_u64().unwrap_or(10);
    assert!(left < 10, "{explained}");
    let header = get(a.addr, "/all", &[("x-user", "alice")]).await;
    let header = header.header("ratelimit").expect("a RateLimit header");
    assert_eq!(remaining_in(header, "fw"), left - 1, "{header}");
}

const CLUSTER_STACK: &str = r#"
[limits.fw]
key = "header:x-user"
algorithm = "fixed_window"
limit = 10
window = "1d"
align = "first_request"

[limits.tb]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 10
refill = "1/h"

[[routes]]
name = "all"
match = { path = "/all" }
respond = { status = 200, body = "ok" }
limits = ["fw", "tb"]
"#;

#[tokio::test]
async fn explain_reads_a_cluster_key_from_its_slot() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let cluster = common::redis::Cluster::start(3, 0);
    let upstream = TestUpstream::start().await;
    let urls = cluster.toml_urls();
    let store = format!("cluster = true\nurl = [{urls}]");
    let a = InProcess::start(&config(&store, &upstream, CLUSTER_STACK)).await;
    let b = InProcess::start(&config(&store, &upstream, CLUSTER_STACK)).await;
    // Six users: their digests (the hash tags) spread them over the primaries.
    let users: Vec<String> = (0..6).map(|i| format!("user-{i}")).collect();
    for (i, user) in users.iter().enumerate() {
        for _ in 0..=i {
            assert_eq!(get(a.addr, "/all", &[("x-user", user)]).await.status, 200);
        }
    }
    for (i, user) in users.iter().enumerate() {
        for limit in ["fw", "tb"] {
            let explained = explain(&b, limit, user).await;
            assert_eq!(explained["source"], "redis", "{user} {limit}: {explained}");
            assert_eq!(
                explained["remaining"],
                9 - i as u64,
                "{user} {limit}: {explained}"
            );
        }
    }
}
