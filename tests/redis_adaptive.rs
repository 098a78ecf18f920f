//! An adaptive limit with `store.backend = "redis"`: decided in this node's
//! memory (each node measures its own traffic) while the stack's other
//! limits go to a real `redis-server`, all or nothing together: a shared
//! denial releases the adaptive slot without teaching it anything, and an
//! adaptive refusal charges nothing in Redis. Real time (Redis is another
//! process), with a slow upstream's 3 s as the margin.

mod common;

use std::time::Duration;

use common::capacity::CapacityUpstream;
use common::redis::Redis;
use common::{InProcess, eventually, get};

fn config(redis: &Redis, upstream: &CapacityUpstream) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[store]
backend = "redis"
url = "{redis}"
prefix = "tg:"
timeout = "500ms"

[upstreams.api]
url = "{upstream}"

[limits.per_user]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 1
refill = "1/h"

[limits.backend]
key = "route"
algorithm = "adaptive"
min = 1
max = 1
initial = 1

[[routes]]
name = "spend"
match = {{ path = "/spend" }}
respond = {{ status = 200, body = "ok" }}
limits = ["per_user"]

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["per_user", "backend"]
"#,
        redis = redis.url(),
        upstream = upstream.url(),
    )
}

async fn explain(gw: &InProcess, limit: &str, key: &str) -> serde_json::Value {
    let reply = get(
        gw.admin.unwrap(),
        &format!("/limits/{limit}?key={key}"),
        &[],
    )
    .await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply.json()
}

#[tokio::test]
async fn adaptive_is_node_local_and_all_or_nothing_with_redis() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = CapacityUpstream::start(10, Duration::from_secs(3), 100).await;
    let gw = InProcess::start_on_wall_time(&config(&redis, &upstream)).await;

    // Redis denies `spent` (its one token went on /spend): the adaptive
    // slot it took first is released, and no sample is taken.
    assert_eq!(
        get(gw.addr, "/spend", &[("x-user", "spent")]).await.status,
        200
    );
    let reply = get(gw.addr, "/work", &[("x-user", "spent")]).await;
    assert_eq!(reply.status, 429, "denied by the shared token bucket");
    let backend = explain(&gw, "backend", "api").await;
    assert_eq!(backend["source"], "memory");
    let adaptive = &backend["adaptive"];
    assert_eq!(adaptive["in_flight"], 0, "{backend}");
    assert_eq!(
        adaptive["baseline_ms"],
        serde_json::Value::Null,
        "{backend}"
    );

    // One request holds the adaptive limit's one slot for 3 s.
    let addr = gw.addr;
    let slow = tokio::spawn(async move { get(addr, "/work", &[("x-user", "slow")]).await });
    assert!(
        eventually(async || explain(&gw, "backend", "api").await["adaptive"]["in_flight"] == 1)
            .await,
        "the slow request never took the slot"
    );
    // Refused by the adaptive limit: 503, and Redis charged nothing.
    let refused = get(gw.addr, "/work", &[("x-user", "other")]).await;
    assert_eq!(refused.status, 503);
    assert!(
        refused.json()["detail"]
            .as_str()
            .unwrap()
            .contains("backend"),
        "{:?}",
        refused.body
    );
    let other = explain(&gw, "per_user", "other").await;
    assert_eq!(other["source"], "redis");
    assert_eq!(other["remaining"], 1, "uncharged: {other}");

    // The slow request's answer is what the limit learns from.
    assert_eq!(slow.await.unwrap().status, 200);
    let adaptive = explain(&gw, "backend", "api").await["adaptive"].clone();
    assert_eq!(adaptive["in_flight"], 0);
    let baseline = adaptive["baseline_ms"].as_f64().expect("a baseline");
    assert!((3000.0..60_000.0).contains(&baseline), "{adaptive}");

    // Nothing of the adaptive limit is in Redis.
    let keys = redis.keys();
    assert!(!keys.is_empty());
    assert!(
        keys.iter().all(|k| k.starts_with("tg:per_user:")),
        "{keys:?}"
    );
    gw.stop().await;
}
