//! `respond = { quota = [...] }` through real sockets (contract §13,
//! "Self-service quota"): the caller's own state of each limit, for a
//! caller known by an API key, a consumer, a JWT and an IP; agreeing with
//! the `RateLimit` fields of its next proxied request; charging nothing;
//! never another caller's state; refused as a proxied request would be.

mod common;

use common::{InProcess, Reply, TestUpstream, get};

const SECRET: &[u8] = b"quota-route-test-secret-32-bytes";

fn config(upstream: &TestUpstream) -> String {
    common::gateway_toml(
        upstream,
        "admin = \"127.0.0.1:0\"",
        r#"
[client_ip]
trusted_cidrs = ["127.0.0.1/32"]

[api_keys]
header = "x-consumer-key"

[consumers."ck-alice"]
consumer = "alice-co"

[consumers."ck-bob"]
consumer = "bob-co"

[[jwt.issuers]]
issuer = "https://sso.example/"
secret_file = "secret"

[limits.per_key]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 5
window = "1h"
on_missing_key = "deny"

[limits.per_consumer]
key = "consumer"
algorithm = "token_bucket"
capacity = 4
refill = "1/h"

[limits.per_user]
key = "jwt:sub"
algorithm = "fixed_window"
limit = 3
window = "1h"

[limits.per_ip]
key = "ip"
algorithm = "sliding_window"
limit = 10
window = "1h"

[limits.in_flight]
key = "header:x-api-key"
algorithm = "concurrency"
max = 2

[[routes]]
name = "quota_key"
match = { path = "/quota/key" }
respond = { quota = ["per_key", "in_flight"] }

[[routes]]
name = "quota_consumer"
match = { path = "/quota/consumer" }
respond = { quota = ["per_consumer"] }

[[routes]]
name = "quota_user"
match = { path = "/quota/user" }
respond = { quota = ["per_user"] }
require_jwt = true

[[routes]]
name = "quota_ip"
match = { path = "/quota/ip" }
respond = { quota = ["per_ip"] }

[[routes]]
name = "by_key"
match = { path = "/api/key" }
respond = { status = 200, body = "ok" }
limits = ["per_key", "in_flight"]

[[routes]]
name = "by_consumer"
match = { path = "/api/consumer" }
respond = { status = 200, body = "ok" }
limits = ["per_consumer"]

[[routes]]
name = "by_user"
match = { path = "/api/user" }
respond = { status = 200, body = "ok" }
limits = ["per_user"]
require_jwt = true

[[routes]]
name = "by_ip"
match = { path = "/api/ip" }
respond = { status = 200, body = "ok" }
limits = ["per_ip"]
"#,
    )
}

async fn start() -> (TestUpstream, InProcess) {
    let upstream = TestUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), SECRET).expect("secret");
    let gateway = InProcess::start_in(dir, &config(&upstream)).await;
    (upstream, gateway)
}

/// A token for `sub`, valid around the in-process clock's start.
fn token(sub: &str) -> String {
    let now = common::IN_PROCESS_EPOCH / tollgate::limit::NANOS_PER_SEC;
    let claims = serde_json::json!({"iss": "https://sso.example/", "sub": sub, "exp": now + 3600});
    format!("Bearer {}", common::jwt::hs256(SECRET, &claims))
}

/// The entry of `limit` in a quota answer.
fn entry(reply: &Reply, limit: &str) -> serde_json::Value {
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(reply.header("cache-control"), Some("no-store"));
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let body = reply.json();
    body["limits"]
        .as_array()
        .and_then(|limits| limits.iter().find(|l| l["name"] == limit).cloned())
        .unwrap_or_else(|| panic!("no {limit} in {body}"))
}

/// The parameter `name` (`"r="`, `"t="`, `"q="`) of `policy`'s item in a
/// structured `RateLimit` or `RateLimit-Policy` field.
fn param(field: &str, policy: &str, name: &str) -> u64 {
    field
        .split(',')
        .find(|item| item.trim().starts_with(&format!("\"{policy}\"")))
        .and_then(|item| item.split(';').find_map(|p| p.trim().strip_prefix(name)))
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no {name} for {policy} in {field}"))
}

/// Spends `n` requests on `path` as `headers`, then checks that the quota
/// route `quota` agrees with the next proxied request: same quota and
/// policy, `r` one below `remaining`, `t` within `reset_seconds`; and
/// that asking twice charged nothing.
async fn agrees(
    gateway: &InProcess,
    (path, quota, limit): (&str, &str, &str),
    headers: &[(&str, &str)],
    n: u64,
) -> serde_json::Value {
    for _ in 0..n {
        assert_eq!(get(gateway.addr, path, headers).await.status, 200);
    }
    let first = entry(&get(gateway.addr, quota, headers).await, limit);
    let asked = entry(&get(gateway.addr, quota, headers).await, limit);
    assert_eq!(first["remaining"], asked["remaining"], "asking charged");
    let next = get(gateway.addr, path, headers).await;
    assert_eq!(next.status, 200);
    let ratelimit = next.header("ratelimit").expect("a RateLimit field");
    let policy = next
        .header("ratelimit-policy")
        .expect("a RateLimit-Policy field");
    assert_eq!(first["quota"], param(policy, limit, "q="), "{first}");
    // The limit's item of the stack's `RateLimit-Policy`.
    let item = first["policy"].as_str().unwrap_or("");
    assert!(policy.split(", ").any(|i| i == item), "{first} vs {policy}");
    let remaining = first["remaining"].as_u64().unwrap_or(0);
    assert_eq!(
        param(ratelimit, limit, "r="),
        remaining - 1,
        "{first} vs {ratelimit}"
    );
    assert!(param(ratelimit, limit, "t=") <= first["reset_seconds"].as_u64().unwrap_or(0));
    assert_eq!(first["override"], serde_json::Value::Null);
    first
}

#[tokio::test(start_paused = true)]
async fn an_api_key_reads_its_own_state_and_never_another_keys() {
    let (_upstream, gateway) = start().await;
    let alice = [("x-api-key", "key-alice")];
    let state = agrees(&gateway, ("/api/key", "/quota/key", "per_key"), &alice, 2).await;
    assert_eq!(state["remaining"], 3, "{state}");
    assert_eq!(state["unit"], "requests");
    // A concurrency limit has no reset time.
    let reply = get(gateway.addr, "/quota/key", &alice).await;
    let in_flight = entry(&reply, "in_flight");
    assert_eq!(in_flight["remaining"], 2, "{in_flight}");
    assert_eq!(in_flight["reset_seconds"], serde_json::Value::Null);
    // Bob sees his own, fresh state; naming alice's key in the query
    // changes nothing.
    let bob = [("x-api-key", "key-bob")];
    let reply = get(gateway.addr, "/quota/key?key=key-alice", &bob).await;
    assert_eq!(entry(&reply, "per_key")["remaining"], 5);
    // Without the key: the limit's missing-key answer, as proxied.
    let keyless = get(gateway.addr, "/quota/key", &[]).await;
    assert_eq!(keyless.status, 400);
    assert_eq!(get(gateway.addr, "/api/key", &[]).await.status, 400);
}

#[tokio::test(start_paused = true)]
async fn a_consumer_reads_its_own_state() {
    let (_upstream, gateway) = start().await;
    let alice = [("x-consumer-key", "ck-alice")];
    let state = agrees(
        &gateway,
        ("/api/consumer", "/quota/consumer", "per_consumer"),
        &alice,
        1,
    )
    .await;
    assert_eq!(state["remaining"], 3, "{state}");
    let bob = [("x-consumer-key", "ck-bob")];
    assert_eq!(
        entry(
            &get(gateway.addr, "/quota/consumer", &bob).await,
            "per_consumer"
        )["remaining"],
        4
    );
    // Without a consumer the limit is skipped (`on_missing_key = "skip"`),
    // for the quota route as for the proxied request.
    let anonymous = get(gateway.addr, "/quota/consumer", &[]).await;
    assert_eq!(anonymous.status, 200);
    assert_eq!(anonymous.json(), serde_json::json!({"limits": []}));
    assert_eq!(get(gateway.addr, "/api/consumer", &[]).await.status, 200);
}

#[tokio::test(start_paused = true)]
async fn a_jwt_identity_reads_its_own_state_and_needs_its_token() {
    let (_upstream, gateway) = start().await;
    let alice = token("alice");
    let headers = [("authorization", alice.as_str())];
    let state = agrees(
        &gateway,
        ("/api/user", "/quota/user", "per_user"),
        &headers,
        1,
    )
    .await;
    assert_eq!(state["remaining"], 2, "{state}");
    let bob = token("bob");
    let reply = get(
        gateway.addr,
        "/quota/user",
        &[("authorization", bob.as_str())],
    )
    .await;
    assert_eq!(entry(&reply, "per_user")["remaining"], 3);
    // No token, or a forged one: 401 on a require_jwt route, as proxied.
    let anonymous = get(gateway.addr, "/quota/user", &[]).await;
    assert_eq!(anonymous.status, 401);
    assert!(anonymous.header("www-authenticate").is_some());
    let forged = format!("{}x", alice);
    let forged = get(
        gateway.addr,
        "/quota/user",
        &[("authorization", forged.as_str())],
    )
    .await;
    assert_eq!(forged.status, 401);
}

#[tokio::test(start_paused = true)]
async fn an_ip_reads_its_own_state_behind_trusted_proxies() {
    let (_upstream, gateway) = start().await;
    let alice = [("x-forwarded-for", "203.0.113.7")];
    let state = agrees(&gateway, ("/api/ip", "/quota/ip", "per_ip"), &alice, 4).await;
    assert_eq!(state["remaining"], 6, "{state}");
    let bob = [("x-forwarded-for", "198.51.100.9")];
    assert_eq!(
        entry(&get(gateway.addr, "/quota/ip", &bob).await, "per_ip")["remaining"],
        10
    );
}
