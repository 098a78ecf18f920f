//! Per-key overrides (`PUT/GET/DELETE /limits/NAME/overrides?key=`, contract
//! §13) end to end through the admin and traffic sockets: an override
//! changes that key's admissions from the answer on and no other key's;
//! listed, deleted, expired; every invalid body refused naming the problem
//! and changing nothing; kept in `server.state_file` across a restart, a
//! corrupt file refused at start; on a Redis-decided limit, the key's
//! numbers go in the same script call. An expired override stops at its
//! expiry on every node and leaves Redis once (or the state file); a limit
//! removed from the configuration keeps its overrides in Redis until
//! pruned, and finds them again when it comes back.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::redis::Redis;
use common::{Gateway, InProcess, Reply, TestUpstream, get, send};
use http_body_util::Full;
use hyper::Request;

/// A token bucket of 2 per API key (refilled once a minute: nothing comes
/// back during a test), a fixed window of 1 per hour by IP, a route using
/// the bucket, another the window, and a quota route of the bucket.
const LIMITS: &str = r#"
[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 2
refill = "1/m"

[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 1
window = "1h"

[[routes]]
name = "keyed"
match = { path = "/keyed" }
respond = { status = 200, body = "ok" }
limits = ["per_key"]

[[routes]]
name = "by_ip"
match = { path = "/by_ip" }
respond = { status = 200, body = "ok" }
limits = ["per_ip"]

[[routes]]
name = "quota"
match = { path = "/quota" }
respond = { quota = ["per_key"] }
"#;

/// The admin token every test's gateway is configured with (admin writes
/// need one) and its admin requests send.
const TOKEN: &str = "overrides-test-token";

/// [`TOKEN`] as the header an admin read sends.
const AUTH: &[(&str, &str)] = &[("authorization", "Bearer overrides-test-token")];

/// A file holding [`TOKEN`], written once per test process.
fn token_file() -> &'static str {
    static FILE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tollgate-overrides-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("token dir");
        let file = dir.join("admin.token");
        std::fs::write(&file, TOKEN).expect("token file");
        file.to_str().expect("utf-8 temp dir").to_owned()
    })
}

/// `text` without the `per_key` limit (and the quota route naming it).
fn without_per_key(text: &str) -> String {
    let without = text
        .replace("limits = [\"per_key\"]", "limits = []")
        .replace(
            "[[routes]]\nname = \"quota\"\nmatch = { path = \"/quota\" }\nrespond = { quota = [\"per_key\"] }\n",
            "",
        )
        .replace(
            "[limits.per_key]\nkey = \"header:x-api-key\"\nalgorithm = \"token_bucket\"\ncapacity = 2\nrefill = \"1/m\"\n",
            "",
        );
    assert!(!without.contains("per_key"), "{without}");
    without
}

fn config(upstream: &TestUpstream, server: &str) -> String {
    common::gateway_toml(
        upstream,
        &format!(
            "admin = \"127.0.0.1:0\"\nadmin_token_file = \"{}\"\n{server}",
            token_file()
        ),
        LIMITS,
    )
}

/// `PUT` of an override at `path` with `body`, which the admin API takes.
async fn put_override(addr: SocketAddr, path: &str, body: &str) -> Reply {
    let put = admin(addr, "PUT", path, body).await;
    assert_eq!(put.status, 200, "{put:?}");
    put
}

/// A config with a `state_file` in a fresh directory: the directory (the
/// file lives as long as it), the file's path and the config.
fn with_state_file(upstream: &TestUpstream) -> (tempfile::TempDir, std::path::PathBuf, String) {
    let state = tempfile::tempdir().expect("tempdir");
    let file = state.path().join("tollgate-state.json");
    let text = config(upstream, &format!("state_file = \"{}\"", file.display()));
    (state, file, text)
}

/// `method path` on the admin listener with `body` (JSON).
async fn admin(addr: SocketAddr, method: &str, path: &str, body: &str) -> Reply {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "admin.test")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    send(addr, request).await
}

/// The statuses of `n` requests to `/keyed` with API key `key`.
async fn keyed(addr: SocketAddr, key: &str, n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(get(addr, "/keyed", &[("x-api-key", key)]).await.status);
    }
    statuses
}

fn detail(reply: &Reply) -> String {
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json"),
        "{reply:?}"
    );
    reply.json()["detail"].as_str().unwrap_or("").to_owned()
}

#[tokio::test(start_paused = true)]
async fn an_override_decides_its_key_at_once_and_no_other() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let admin_addr = gateway.admin.expect("admin");

    assert_eq!(keyed(gateway.addr, "alice", 3).await, [200, 200, 429]);
    let put = put_override(
        admin_addr,
        "/limits/per_key/overrides?key=alice",
        r#"{"capacity": 5, "reason": "trial"}"#,
    )
    .await;
    let stored = put.json();
    assert_eq!(stored["params"]["capacity"], 5);
    assert_eq!(stored["reason"], "trial");
    assert_eq!(stored["expires"], serde_json::Value::Null);
    let digest = stored["digest"].as_str().expect("a digest").to_owned();
    assert!(
        !put.body.windows(5).any(|w| w == b"alice"),
        "the raw key is never echoed"
    );

    // Carried over as on a reload: 2 of 2 used is 2 of 5 used, 3 left.
    assert_eq!(keyed(gateway.addr, "alice", 4).await, [200, 200, 200, 429]);
    let reply = get(gateway.addr, "/keyed", &[("x-api-key", "alice")]).await;
    assert!(
        reply
            .header("ratelimit-policy")
            .is_some_and(|p| p.contains("q=5")),
        "{:?}",
        reply.header("ratelimit-policy")
    );
    // Another key keeps the limit's numbers.
    assert_eq!(keyed(gateway.addr, "bob", 3).await, [200, 200, 429]);

    let listed = get(admin_addr, "/limits/per_key/overrides", AUTH).await;
    assert_eq!(listed.status, 200);
    let listed = listed.json();
    assert_eq!(listed["overrides"].as_array().map(Vec::len), Some(1));
    assert_eq!(listed["overrides"][0]["digest"], digest.as_str());
    let one = get(admin_addr, "/limits/per_key/overrides?key=alice", AUTH).await;
    assert_eq!(one.json()["digest"], digest.as_str());
    let explained = get(admin_addr, "/limits/per_key?key=alice", AUTH)
        .await
        .json();
    assert_eq!(explained["quota"], 5);
    assert_eq!(explained["override"]["params"]["capacity"], 5);
    assert_eq!(explained["override"]["reason"], "trial");
    assert_eq!(explained["remaining"], 0);

    let deleted = admin(
        admin_addr,
        "DELETE",
        "/limits/per_key/overrides?key=alice",
        "",
    )
    .await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert_eq!(deleted.json()["digest"], digest.as_str());
    // Back on the limit's numbers, its state carried back: still empty.
    assert_eq!(keyed(gateway.addr, "alice", 1).await, [429]);
    let explained = get(admin_addr, "/limits/per_key?key=alice", AUTH)
        .await
        .json();
    assert_eq!(explained["quota"], 2);
    assert!(explained.get("override").is_none(), "{explained}");
    let again = admin(
        admin_addr,
        "DELETE",
        "/limits/per_key/overrides?key=alice",
        "",
    )
    .await;
    assert_eq!(again.status, 404);
    let listed = get(admin_addr, "/limits/per_key/overrides", AUTH)
        .await
        .json();
    assert_eq!(listed["overrides"], serde_json::json!([]));
}

#[tokio::test(start_paused = true)]
async fn an_expired_override_is_gone() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let admin_addr = gateway.admin.expect("admin");

    let put = put_override(
        admin_addr,
        "/limits/per_ip/overrides?key=127.0.0.1",
        r#"{"limit": 3, "ttl": "30s"}"#,
    )
    .await;
    assert_eq!(put.json()["expires_in_seconds"], 30);
    let statuses = |n| async move {
        let mut all = Vec::new();
        for _ in 0..n {
            all.push(get(gateway.addr, "/by_ip", &[]).await.status);
        }
        all
    };
    assert_eq!(statuses(4).await, [200, 200, 200, 429]);
    // Paused time: the limiter's clock moves as far as the test sleeps.
    tokio::time::sleep(Duration::from_secs(31)).await;
    let one = get(admin_addr, "/limits/per_ip/overrides?key=127.0.0.1", AUTH).await;
    assert_eq!(one.status, 404, "{one:?}");
    let listed = get(admin_addr, "/limits/per_ip/overrides", AUTH)
        .await
        .json();
    assert_eq!(listed["overrides"], serde_json::json!([]));
    // The limit's own numbers again: 1 an hour.
    let after = statuses(2).await;
    assert_eq!(after.last(), Some(&429), "{after:?}");
    let explained = get(admin_addr, "/limits/per_ip?key=127.0.0.1", AUTH)
        .await
        .json();
    assert_eq!(explained["quota"], 1);
}

#[tokio::test(start_paused = true)]
async fn invalid_writes_are_refused_naming_the_problem_and_change_nothing() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let admin_addr = gateway.admin.expect("admin");
    let put = |path: &'static str, body: &'static str| admin(admin_addr, "PUT", path, body);
    let alice = "/limits/per_key/overrides?key=alice";

    let cases: [(&str, &str, u16, &str); 18] = [
        (
            alice,
            r#"{"capacity": 0}"#,
            400,
            "`capacity`: must be at least 1",
        ),
        (alice, r#"{"refill": "fast"}"#, 400, "`refill`"),
        (
            alice,
            r#"{"limit": 5}"#,
            400,
            "`limit`: `limit` is not a parameter of token_bucket",
        ),
        (alice, r#"{"capacty": 5}"#, 400, "did you mean `capacity`"),
        (alice, r#"{"capacity": "5"}"#, 400, "`capacity`"),
        (alice, r#"{"capacity": -1}"#, 400, "`capacity`"),
        (alice, r#"{"capacity": 5, "ttl": "soon"}"#, 400, "`ttl`"),
        (
            alice,
            r#"{"capacity": 5, "expires": "2001-01-01T00:00:00Z"}"#,
            400,
            "`expires`",
        ),
        (alice, r#"{"capacity": 5, "reason": 7}"#, 400, "`reason`"),
        (
            alice,
            r#"{"rate": "1/s"}"#,
            400,
            "`rate` is not a parameter",
        ),
        (alice, r#"{"max": 3}"#, 400, "`max` is not a parameter"),
        (
            "/limits/per_ip/overrides?key=127.0.0.1",
            r#"{"window": "soon"}"#,
            400,
            "`window`",
        ),
        (
            "/limits/per_ip/overrides?key=127.0.0.1",
            r#"{"limit": 0}"#,
            400,
            "`limit`",
        ),
        (alice, r#"{"reason": "no numbers"}"#, 400, "at least one"),
        (alice, "not json", 400, "not JSON"),
        (
            "/limits/nope/overrides?key=alice",
            r#"{"capacity": 5}"#,
            404,
            "no limit named `nope`",
        ),
        (
            "/limits/per_key/overrides",
            r#"{"capacity": 5}"#,
            400,
            "name the key",
        ),
        (
            "/limits/per_ip/overrides?key=not-an-ip",
            r#"{"limit": 5}"#,
            400,
            "keyed by ip",
        ),
    ];
    for (path, body, status, needle) in cases {
        let reply = put(path, body).await;
        assert_eq!(reply.status, status, "{path} {body}: {reply:?}");
        let detail = detail(&reply);
        assert!(detail.contains(needle), "{path} {body}: {detail}");
    }
    let listed = get(admin_addr, "/limits/per_key/overrides", AUTH)
        .await
        .json();
    assert_eq!(listed["overrides"], serde_json::json!([]));
    assert_eq!(keyed(gateway.addr, "alice", 3).await, [200, 200, 429]);
    let post = admin(admin_addr, "POST", alice, "{}").await;
    assert_eq!(post.status, 405);
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_overrides_and_a_removed_limit_takes_its_own() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let admin_addr = gateway.admin.expect("admin");
    put_override(
        admin_addr,
        "/limits/per_key/overrides?key=alice",
        r#"{"capacity": 4}"#,
    )
    .await;
    assert_eq!(keyed(gateway.addr, "alice", 2).await, [200, 200]);
    gateway.reload_with(&config(&upstream, ""));
    // Same numbers after the reload, the same state: 2 of 4 left.
    assert_eq!(keyed(gateway.addr, "alice", 3).await, [200, 200, 429]);

    gateway.reload_with(&without_per_key(&config(&upstream, "")));
    let gone = get(admin_addr, "/limits/per_key/overrides", AUTH).await;
    assert_eq!(gone.status, 404);
    gateway.reload_with(&config(&upstream, ""));
    let listed = get(admin_addr, "/limits/per_key/overrides", AUTH)
        .await
        .json();
    assert_eq!(listed["overrides"], serde_json::json!([]));
}

/// The binary with `state_file`: an override outlives a restart; a corrupt
/// file stops the start with an error naming it.
#[tokio::test]
async fn the_state_file_keeps_overrides_across_a_restart() {
    let upstream = TestUpstream::start().await;
    let (_state, file, text) = with_state_file(&upstream);

    let first = Gateway::start(&text);
    let admin_addr = first.admin.expect("admin");
    put_override(
        admin_addr,
        "/limits/per_key/overrides?key=alice",
        r#"{"capacity": 4, "reason": "kept"}"#,
    )
    .await;
    assert!(file.exists());
    drop(first);

    let second = Gateway::start(&text);
    let listed = get(
        second.admin.expect("admin"),
        "/limits/per_key/overrides",
        AUTH,
    )
    .await
    .json();
    assert_eq!(listed["overrides"][0]["reason"], "kept", "{listed}");
    assert_eq!(
        keyed(second.addr, "alice", 5).await,
        [200, 200, 200, 200, 429]
    );
    drop(second);

    std::fs::write(&file, b"{\"version\": 1, \"overrides\": [{\"limit\": 3").unwrap();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, &text).unwrap();
    let (code, _, stderr) = common::tollgate(&["run", "-c", path.to_str().unwrap()]);
    assert_ne!(code, 0);
    assert!(stderr.contains(&file.display().to_string()), "{stderr}");
    assert!(stderr.contains("not a tollgate state file"), "{stderr}");
}

/// A shared limit: the overridden key's numbers go to Redis in the same
/// script call as the key's (one EVALSHA per request, as without).
#[tokio::test]
async fn a_redis_decided_key_is_decided_with_its_override_in_one_call() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let text = format!(
        "{}\n{}timeout = \"500ms\"\n",
        config(&upstream, ""),
        redis.store_toml("tg:")
    );
    let gateway = InProcess::start_on_wall_time(&text).await;
    let admin_addr = gateway.admin.expect("admin");
    assert_eq!(keyed(gateway.addr, "alice", 3).await, [200, 200, 429]);
    put_override(
        admin_addr,
        "/limits/per_key/overrides?key=alice",
        r#"{"capacity": 4}"#,
    )
    .await;
    redis.cli(&["CONFIG", "RESETSTAT"]);
    assert_eq!(keyed(gateway.addr, "alice", 3).await, [200, 200, 429]);
    let calls: u64 = redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert_eq!(calls, 3, "one script call per request");
    let explained = get(admin_addr, "/limits/per_key?key=alice", AUTH)
        .await
        .json();
    assert_eq!(explained["source"], "redis");
    assert_eq!(explained["quota"], 4);
    assert_eq!(explained["remaining"], 0);
}

fn fleet_config(upstream: &TestUpstream, redis: &Redis) -> String {
    store_config(upstream, &format!("url = \"{}\"", redis.url()))
}

/// [`config`] with a Redis store of `servers` (its `url`, `cluster` lines).
fn store_config(upstream: &TestUpstream, servers: &str) -> String {
    format!(
        "{}\n[store]\nbackend = \"redis\"\n{servers}\nprefix = \"tg:\"\ntimeout = \"500ms\"\n",
        config(upstream, ""),
    )
}

/// `per_key`'s quota for alice as `node`'s explain gives it: the numbers
/// its decision of her would use (explain reads the same override map).
async fn quota_on(node: &InProcess) -> Option<u64> {
    let admin_addr = node.admin.expect("admin");
    get(admin_addr, "/limits/per_key?key=alice", AUTH)
        .await
        .json()["quota"]
        .as_u64()
}

/// Two gateways on one Redis: a write on one is in force on the other
/// within a second (the poll is every 250 ms); the figure printed is the
/// p99 of `TOLLGATE_PROPAGATION_WRITES` writes (10 unless set).
#[tokio::test]
async fn a_write_on_one_node_is_in_force_on_the_other() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let text = fleet_config(&upstream, &redis);
    let a = InProcess::start_on_wall_time(&text).await;
    let b = InProcess::start_on_wall_time(&text).await;
    let writes: usize = std::env::var("TOLLGATE_PROPAGATION_WRITES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10);
    let mut delays = Vec::new();
    for i in 0..writes {
        let capacity = 10 + i as u64;
        let started = std::time::Instant::now();
        put_override(
            a.admin.expect("admin"),
            "/limits/per_key/overrides?key=alice",
            &format!("{{\"capacity\": {capacity}}}"),
        )
        .await;
        let seen = common::eventually_within(Duration::from_secs(10), async || {
            quota_on(&b).await == Some(capacity)
        })
        .await;
        assert!(seen, "write {i} not in force on the other node within 10 s");
        delays.push(started.elapsed());
    }
    delays.sort();
    let p99 = delays[(delays.len() * 99).div_ceil(100) - 1];
    let p50 = delays[delays.len() / 2];
    eprintln!("propagation over {writes} writes: p50 {p50:?}, p99 {p99:?}");
    // Generous for a loaded debug build; the report gives the measured p99.
    assert!(p99 < Duration::from_secs(3), "p99 {p99:?}");

    let deleted = admin(
        b.admin.expect("admin"),
        "DELETE",
        "/limits/per_key/overrides?key=alice",
        "",
    )
    .await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert!(
        common::eventually_within(Duration::from_secs(10), async || quota_on(&a).await
            == Some(2))
        .await
    );
    // Decisions on b with a's override: 4 of capacity 4.
    put_override(
        a.admin.expect("admin"),
        "/limits/per_key/overrides?key=carol",
        r#"{"capacity": 4}"#,
    )
    .await;
    let b_admin = b.admin.expect("admin");
    assert!(
        common::eventually_within(Duration::from_secs(10), async || {
            let listed = get(b_admin, "/limits/per_key/overrides", AUTH).await.json();
            listed["overrides"].as_array().is_some_and(|o| o.len() == 1)
        })
        .await
    );
    assert_eq!(keyed(b.addr, "carol", 5).await, [200, 200, 200, 200, 429]);
}

/// Redis down: a write fails with 503 and changes nothing; the node keeps
/// the overrides it had and says so in `/readyz` and the metric.
#[tokio::test]
async fn a_write_while_redis_is_down_fails_and_changes_nothing() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start_on_wall_time(&fleet_config(&upstream, &redis)).await;
    let admin_addr = gateway.admin.expect("admin");
    put_override(
        admin_addr,
        "/limits/per_key/overrides?key=alice",
        r#"{"capacity": 7}"#,
    )
    .await;
    redis.kill();
    let refused = admin(
        admin_addr,
        "PUT",
        "/limits/per_key/overrides?key=bob",
        r#"{"capacity": 9}"#,
    )
    .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(detail(&refused).contains("nothing changed"), "{refused:?}");
    let refused = admin(
        admin_addr,
        "DELETE",
        "/limits/per_key/overrides?key=alice",
        "",
    )
    .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    let listed = get(admin_addr, "/limits/per_key/overrides", AUTH)
        .await
        .json();
    let overrides = listed["overrides"].as_array().expect("a list");
    assert_eq!(overrides.len(), 1, "{listed}");
    assert_eq!(overrides[0]["params"]["capacity"], 7);
    assert!(
        common::eventually_within(Duration::from_secs(10), async || {
            let ready = get(admin_addr, "/readyz", AUTH).await;
            String::from_utf8_lossy(&ready.body).contains("overrides: stale")
        })
        .await
    );
    let metrics = get(admin_addr, "/metrics", AUTH).await;
    assert!(
        String::from_utf8_lossy(&metrics.body).contains("tollgate_overrides_stale 1"),
        "{:?}",
        metrics.body
    );
    redis.restart();
    assert!(
        common::eventually_within(Duration::from_secs(15), async || {
            let ready = get(admin_addr, "/readyz", AUTH).await;
            !String::from_utf8_lossy(&ready.body).contains("stale")
        })
        .await
    );
}

/// A Redis Cluster: the overrides' keys share one slot (their hash tag);
/// a write on one node decides the key on the other and on a node started
/// later; an expired one leaves the Cluster's hash.
#[tokio::test]
async fn a_cluster_fleet_shares_its_overrides() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut cluster = common::redis::Cluster::start(3, 0);
    let upstream = TestUpstream::start().await;
    let servers = format!("cluster = true\nurl = [{}]", cluster.toml_urls());
    let text = store_config(&upstream, &servers);
    let a = InProcess::start_on_wall_time(&text).await;
    let b = InProcess::start_on_wall_time(&text).await;
    put_override(
        a.admin.expect("admin"),
        "/limits/per_key/overrides?key=alice",
        r#"{"capacity": 3, "reason": "cluster"}"#,
    )
    .await;
    assert!(
        common::eventually_within(Duration::from_secs(10), async || quota_on(&b).await
            == Some(3))
        .await
    );
    assert_eq!(keyed(b.addr, "alice", 4).await, [200, 200, 200, 429]);
    assert_eq!(keyed(a.addr, "alice", 1).await, [429]);
    let keys = cluster.keys();
    assert!(
        keys.iter().any(|k| k == "tg:{overrides}:per_key")
            && keys.iter().any(|k| k == "tg:{overrides}:version"),
        "{keys:?}"
    );

    // Stored in the Cluster, not in a node: a node started now applies it.
    let c = InProcess::start_on_wall_time(&text).await;
    assert!(
        common::eventually_within(Duration::from_secs(10), async || quota_on(&c).await
            == Some(3))
        .await
    );
    put_override(
        b.admin.expect("admin"),
        "/limits/per_key/overrides?key=bob",
        r#"{"capacity": 7, "ttl": "2s"}"#,
    )
    .await;
    let hash = "tg:{overrides}:per_key";
    let owner = cluster.primary_of(hash);
    assert_eq!(owner.cli(&["HLEN", hash]), "2");
    assert!(
        common::eventually_within(Duration::from_secs(10), async || owner.cli(&["HLEN", hash])
            == "1")
        .await,
        "the expired override is still in the cluster"
    );
}

/// `per_key`'s entry of `/quota` for API key `key` on `node`: the caller's
/// own state, as a client reads it.
async fn quota_route(node: &InProcess, key: &str) -> serde_json::Value {
    let reply = get(node.addr, "/quota", &[("x-api-key", key)]).await;
    assert_eq!(reply.status, 200, "{reply:?}");
    reply.json()["limits"][0].clone()
}

/// Everything a node shows of alice's `per_key` override: the listing,
/// explain's member, the quota route's member.
async fn shown_on(node: &InProcess) -> (usize, serde_json::Value, serde_json::Value) {
    let admin_addr = node.admin.expect("admin");
    let listed = get(admin_addr, "/limits/per_key/overrides", AUTH)
        .await
        .json();
    let explained = get(admin_addr, "/limits/per_key?key=alice", AUTH)
        .await
        .json();
    (
        listed["overrides"].as_array().map_or(0, Vec::len),
        explained["override"].clone(),
        quota_route(node, "alice").await["override"].clone(),
    )
}

/// The overrides' version in `redis`.
fn version(redis: &Redis) -> u64 {
    redis
        .cli(&["GET", "tg:{overrides}:version"])
        .parse()
        .unwrap_or(0)
}

/// Two nodes on one Redis: an override with a `ttl` stops deciding its key
/// on both at its expiry (no write needed to tell them), vanishes from the
/// listing, explain and the quota route, and is removed from Redis by one
/// node: the version moves once.
#[tokio::test]
async fn an_expired_override_leaves_every_node_and_redis_once() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let text = fleet_config(&upstream, &redis);
    let a = InProcess::start_on_wall_time(&text).await;
    let b = InProcess::start_on_wall_time(&text).await;
    let put = put_override(
        a.admin.expect("admin"),
        "/limits/per_key/overrides?key=alice",
        r#"{"capacity": 5, "ttl": "3s", "reason": "short"}"#,
    )
    .await;
    let written = version(&redis);
    assert!(
        common::eventually_within(Duration::from_secs(10), async || quota_on(&b).await
            == Some(5))
        .await
    );
    let (listed, explained, quota) = shown_on(&b).await;
    assert_eq!(listed, 1);
    assert_eq!(explained["reason"], "short", "{explained}");
    assert_eq!(quota["reason"], "short", "{quota}");
    assert_eq!(quota_route(&b, "alice").await["quota"], 5);
    // Another caller's quota route never shows alice's override.
    let bob = quota_route(&b, "bob").await;
    assert_eq!(
        (bob["quota"].as_u64(), &bob["override"]),
        (Some(2), &serde_json::Value::Null)
    );
    assert_eq!(keyed(b.addr, "alice", 1).await, [200]);

    // Past the expiry: both nodes decide alice with the limit's numbers at
    // once, and show no override.
    let expires = put.json()["expires_in_seconds"].as_u64().unwrap_or(3);
    tokio::time::sleep(Duration::from_millis(expires * 1000 + 200)).await;
    for node in [&a, &b] {
        assert_eq!(quota_on(node).await, Some(2));
        let (listed, explained, quota) = shown_on(node).await;
        assert_eq!(listed, 0);
        assert_eq!(explained, serde_json::Value::Null);
        assert_eq!(quota, serde_json::Value::Null);
        assert_eq!(quota_route(node, "alice").await["quota"], 2);
    }
    // Capacity 2 again: of three more, the last is refused (5 would admit
    // all three).
    assert_eq!(keyed(b.addr, "alice", 3).await.last(), Some(&429));

    // Gone from Redis, by one node's removal.
    assert!(
        common::eventually_within(Duration::from_secs(10), async || redis
            .cli(&["HLEN", "tg:{overrides}:per_key"])
            == "0")
        .await,
        "the expired override is still in redis"
    );
    // Several polls of both nodes later, the version moved once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(version(&redis), written + 1);
}

/// A reload that removes a limit leaves its overrides in Redis (another
/// node may still run a configuration with it), answers 404 for it, and
/// finds them again when it comes back; a prune deletes them for every
/// node, and is refused for a limit still configured.
#[tokio::test]
async fn a_removed_limit_keeps_its_overrides_in_redis_until_pruned() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let text = fleet_config(&upstream, &redis);
    let a = InProcess::start_on_wall_time(&text).await;
    let b = InProcess::start_on_wall_time(&text).await;
    let (a_admin, b_admin) = (a.admin.expect("admin"), b.admin.expect("admin"));
    put_override(
        a_admin,
        "/limits/per_key/overrides?key=alice",
        r#"{"capacity": 5}"#,
    )
    .await;
    assert!(
        common::eventually_within(Duration::from_secs(10), async || quota_on(&b).await
            == Some(5))
        .await
    );
    let refused = admin(a_admin, "DELETE", "/limits/per_key/overrides", "").await;
    assert_eq!(refused.status, 409, "{refused:?}");
    assert!(detail(&refused).contains("one by one"), "{refused:?}");

    let without = without_per_key(&text);
    a.reload_with(&without);
    let gone = get(a_admin, "/limits/per_key/overrides", AUTH).await;
    assert_eq!(gone.status, 404, "{gone:?}");
    assert_eq!(redis.cli(&["HLEN", "tg:{overrides}:per_key"]), "1");
    // The other node, on the old configuration, still applies it.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(quota_on(&b).await, Some(5));

    // Back in the file: the override Redis kept is in force again.
    a.reload_with(&text);
    assert!(
        common::eventually_within(Duration::from_secs(10), async || quota_on(&a).await
            == Some(5))
        .await,
        "a limit added back finds its overrides"
    );

    // Removed again, then pruned: gone from Redis and from every node.
    a.reload_with(&without);
    let pruned = admin(a_admin, "DELETE", "/limits/per_key/overrides", "").await;
    assert_eq!(pruned.status, 200, "{pruned:?}");
    assert_eq!(pruned.json()["pruned"], true);
    assert!(!redis.keys().iter().any(|k| k == "tg:{overrides}:per_key"));
    assert!(
        common::eventually_within(Duration::from_secs(10), async || quota_on(&b).await
            == Some(2))
        .await,
        "the prune reaches the node still configured with the limit"
    );
    let again = admin(a_admin, "DELETE", "/limits/per_key/overrides", "").await;
    assert_eq!(again.status, 404, "{again:?}");
    let listed = get(b_admin, "/limits/per_key/overrides", AUTH).await.json();
    assert_eq!(listed["overrides"], serde_json::json!([]));
}

/// The binary with `state_file`: an override that expired while the
/// gateway was stopped is not brought back by the file, and leaves it.
#[tokio::test]
async fn an_override_expired_while_stopped_does_not_come_back_from_the_state_file() {
    let upstream = TestUpstream::start().await;
    let (_state, file, text) = with_state_file(&upstream);

    let first = Gateway::start(&text);
    let admin_addr = first.admin.expect("admin");
    put_override(
        admin_addr,
        "/limits/per_key/overrides?key=alice",
        r#"{"capacity": 4, "ttl": "2s"}"#,
    )
    .await;
    put_override(
        admin_addr,
        "/limits/per_key/overrides?key=bob",
        r#"{"capacity": 3, "reason": "kept"}"#,
    )
    .await;
    drop(first);
    let stored = std::fs::read_to_string(&file).expect("the state file");
    assert_eq!(stored.matches("\"digest\"").count(), 2, "{stored}");

    tokio::time::sleep(Duration::from_millis(2200)).await;
    let second = Gateway::start(&text);
    // (Listed once the gateway serves, after it read the file.)
    let listed = get(
        second.admin.expect("admin"),
        "/limits/per_key/overrides",
        AUTH,
    )
    .await
    .json();
    let overrides = listed["overrides"].as_array().expect("a list");
    assert_eq!(overrides.len(), 1, "{listed}");
    assert_eq!(overrides[0]["reason"], "kept");
    let stored = std::fs::read_to_string(&file).expect("the state file");
    assert_eq!(stored.matches("\"digest\"").count(), 1, "{stored}");
    assert!(stored.contains("\"kept\""), "{stored}");
    assert_eq!(keyed(second.addr, "alice", 3).await, [200, 200, 429]);
}

/// On Redis, a write this node refuses is not left in Redis for the other
/// nodes: with every slot of the limit's numbers taken, a new set of
/// numbers is `409` and Redis holds nothing more; numbers in use still fit.
#[tokio::test]
async fn a_refused_write_leaves_nothing_in_redis() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start_on_wall_time(&fleet_config(&upstream, &redis)).await;
    let admin_addr = gateway.admin.expect("admin");
    let slots = 256;
    for i in 0..slots {
        let put = admin(
            admin_addr,
            "PUT",
            &format!("/limits/per_key/overrides?key=k{i}"),
            &format!("{{\"capacity\": {}}}", 3 + i),
        )
        .await;
        assert_eq!(put.status, 200, "{i}: {put:?}");
    }
    let written = version(&redis);
    let full = admin(
        admin_addr,
        "PUT",
        "/limits/per_key/overrides?key=late",
        r#"{"capacity": 1000}"#,
    )
    .await;
    assert_eq!(full.status, 409, "{full:?}");
    assert_eq!(
        redis.cli(&["HLEN", "tg:{overrides}:per_key"]),
        slots.to_string()
    );
    assert_eq!(version(&redis), written, "nothing was written");
    let reused = admin(
        admin_addr,
        "PUT",
        "/limits/per_key/overrides?key=late",
        r#"{"capacity": 3}"#,
    )
    .await;
    assert_eq!(reused.status, 200, "{reused:?}");
    assert_eq!(
        redis.cli(&["HLEN", "tg:{overrides}:per_key"]),
        (slots + 1).to_string()
    );
}
