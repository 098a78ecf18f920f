//! End-to-end tests of who the client is: trusted proxies, IPv6 prefixes,
//! body fields, consumers, tenants and plans, with the gateway in process
//! (on paused time where a test waits on the limiter's time).

mod common;

use bytes::Bytes;
use common::{InProcess, TestUpstream, gateway_toml, get, send};
use http_body_util::Full;
use hyper::Request;

const SERVER: &str = "max_key_body = \"1KiB\"";

/// The gateway in this process; under paused time a test's sleeps move
/// the limiter's time, instantly and exactly.
async fn gateway(upstream: &TestUpstream, body: &str) -> InProcess {
    InProcess::start(&gateway_toml(upstream, SERVER, body)).await
}

async fn post(
    gw: &InProcess,
    path: &str,
    content_type: &str,
    body: &'static [u8],
) -> common::Reply {
    let request = Request::post(path)
        .header("host", "x")
        .header("content-type", content_type)
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    send(gw.addr, request).await
}

const LOGIN: &str = r#"
[limits.login_account]
key = "body:username"
algorithm = "fixed_window"
limit = 2
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[limits.login_ip]
key = "ip"
algorithm = "fixed_window"
limit = 4
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[[routes]]
name = "login"
match = { path = "/login", methods = ["POST"] }
upstream = "api"
limits = ["login_account", "login_ip"]
"#;

#[tokio::test]
async fn login_stacks_account_and_ip_limits_and_names_the_one_that_fired() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, LOGIN).await;
    let body: &[u8] = br#"{"username":"ann","password":"x"}"#;
    for _ in 0..2 {
        let reply = post(&gw, "/login", "application/json", body).await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            upstream.last_seen().body,
            body,
            "body reached the upstream changed"
        );
    }
    let reply = post(&gw, "/login", "application/json", body).await;
    assert_eq!(reply.status, 429);
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["login_account"])
    );
    // Another account from the same IP passes until the IP limit fires.
    let reply = post(
        &gw,
        "/login",
        "application/x-www-form-urlencoded",
        b"username=bob&password=y",
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.last_seen().body, "username=bob&password=y");
    let reply = post(
        &gw,
        "/login",
        "application/x-www-form-urlencoded",
        b"username=cy",
    )
    .await;
    assert_eq!(reply.status, 200);
    let reply = post(&gw, "/login", "application/json", br#"{"username":"dee"}"#).await;
    assert_eq!(reply.status, 429);
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["login_ip"])
    );
}

#[tokio::test]
async fn bodies_over_the_key_cap_are_forwarded_whole_without_a_key() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.account]
key = "body:username"
algorithm = "fixed_window"
limit = 1
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[[routes]]
name = "login"
match = { path = "/login" }
upstream = "api"
limits = ["account"]
"#,
    )
    .await;
    // 3 KiB of JSON, over the 1 KiB cap: no key, so not limited (skip), and
    // the upstream still gets every byte.
    let mut big = String::from(r#"{"username":"ann","pad":""#);
    big.push_str(&"p".repeat(3000));
    big.push_str("\"}");
    let big: &'static [u8] = Box::leak(big.into_bytes().into_boxed_slice());
    for _ in 0..3 {
        let reply = post(&gw, "/login", "application/json", big).await;
        assert_eq!(reply.status, 200);
        assert_eq!(upstream.last_seen().body, big);
    }
    // A small body with the key is limited.
    let small: &[u8] = br#"{"username":"ann"}"#;
    assert_eq!(
        post(&gw, "/login", "application/json", small).await.status,
        200
    );
    assert_eq!(
        post(&gw, "/login", "application/json", small).await.status,
        429
    );
}

const TENANTS: &str = r#"
[consumers."k-acme-1"]
consumer = "acme-web"
tenant = "acme"
plan = "free"

[consumers."k-acme-2"]
consumer = "acme-mobile"
tenant = "acme"
plan = "free"

[consumers."k-big-1"]
consumer = "big-web"
tenant = "big"
plan = "pro"

[limits.tenant_quota]
key = "tenant"
algorithm = "fixed_window"
limit = 1000
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"
plans = { free = { limit = 3 }, pro = { limit = 5 } }

[[routes]]
name = "api"
match = { path_prefix = "/api" }
upstream = "api"
limits = ["tenant_quota"]
require_consumer = true

[[routes]]
name = "open"
match = { path_prefix = "/open" }
upstream = "api"
"#;

#[tokio::test]
async fn tenant_quotas_are_shared_by_the_tenants_keys_and_set_by_plan() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, TENANTS).await;
    let keys = ["k-acme-1", "k-acme-2", "k-acme-1"];
    for key in keys {
        let reply = get(gw.addr, "/api/x", &[("x-api-key", key)]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some("\"tenant_quota\";q=3;w=86400")
        );
    }
    let reply = get(gw.addr, "/api/x", &[("x-api-key", "k-acme-2")]).await;
    assert_eq!(reply.status, 429, "the tenant's two keys share one quota");
    // The pro tenant has its plan's quota.
    for _ in 0..5 {
        let reply = get(gw.addr, "/api/x", &[("x-api-key", "k-big-1")]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some("\"tenant_quota\";q=5;w=86400")
        );
    }
    assert_eq!(
        get(gw.addr, "/api/x", &[("x-api-key", "k-big-1")])
            .await
            .status,
        429
    );
}

#[tokio::test]
async fn unknown_and_missing_api_keys() {
    let upstream = TestUpstream::start().await;
    let log = common::log::capture();
    let gw = gateway(&upstream, TENANTS).await;
    let reply = get(gw.addr, "/api/x", &[("x-api-key", "k-nobody")]).await;
    assert_eq!(reply.status, 401);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(get(gw.addr, "/api/x", &[]).await.status, 401);
    // Elsewhere an unknown key is anonymous.
    assert_eq!(
        get(gw.addr, "/open", &[("x-api-key", "k-nobody")])
            .await
            .status,
        200
    );
    assert!(
        !log.text().contains("k-nobody"),
        "an API key reached the logs"
    );

    let strict = gateway(
        &upstream,
        &format!("[api_keys]\nheader = \"authorization\"\nunknown_key = \"reject\"\n{TENANTS}"),
    )
    .await;
    assert_eq!(
        get(
            strict.addr,
            "/open",
            &[("authorization", "Bearer k-nobody")]
        )
        .await
        .status,
        401
    );
    assert_eq!(
        get(
            strict.addr,
            "/api/x",
            &[("authorization", "Bearer k-acme-1")]
        )
        .await
        .status,
        200
    );
}

#[tokio::test]
async fn consumers_can_live_in_their_own_file() {
    let upstream = TestUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("consumers.toml"),
        "[consumers.\"k-file\"]\nconsumer = \"from-file\"\n",
    )
    .unwrap();
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n[api_keys]\nfile = \"{}\"\n[upstreams.api]\nurl = \"{}\"\n[limits.per_consumer]\nkey = \"consumer\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1h\"\n[[routes]]\nname = \"api\"\nmatch = {{ path_prefix = \"/\" }}\nupstream = \"api\"\nlimits = [\"per_consumer\"]\nrequire_consumer = true\n",
        dir.path().join("consumers.toml").display(),
        upstream.url()
    );
    let gw = InProcess::start(&config).await;
    assert_eq!(
        get(gw.addr, "/", &[("x-api-key", "k-file")]).await.status,
        200
    );
    assert_eq!(
        get(gw.addr, "/", &[("x-api-key", "k-file")]).await.status,
        429
    );
}

/// A route allowing each client address one request a day, with `client_ip`
/// as the body of the `[client_ip]` table.
fn one_request_per_client_ip(client_ip: &str) -> String {
    format!(
        r#"
[client_ip]
{client_ip}

[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 1
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["per_ip"]
"#
    )
}

#[tokio::test]
async fn the_client_is_counted_from_the_right_of_x_forwarded_for() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(&upstream, &one_request_per_client_ip("trusted_hops = 1")).await;
    // Our load balancer appended 203.0.113.5; what the client wrote to the
    // left changes nothing.
    let xff = |spoof: &str| format!("{spoof}, 203.0.113.5");
    assert_eq!(
        get(gw.addr, "/", &[("x-forwarded-for", &xff("1.1.1.1"))])
            .await
            .status,
        200
    );
    assert_eq!(
        get(gw.addr, "/", &[("x-forwarded-for", &xff("2.2.2.2"))])
            .await
            .status,
        429
    );
    assert_eq!(
        get(gw.addr, "/", &[("x-forwarded-for", "203.0.113.6")])
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn ipv6_clients_are_grouped_by_prefix() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        &one_request_per_client_ip(
            r#"trusted_cidrs = ["127.0.0.0/8"]
ipv6_prefix = 64"#,
        ),
    )
    .await;
    let get_from = |ip: &'static str| {
        let addr = gw.addr;
        async move { get(addr, "/", &[("x-forwarded-for", ip)]).await.status }
    };
    assert_eq!(get_from("2001:db8:0:0::1").await, 200);
    assert_eq!(get_from("2001:db8:0:0:ffff::2").await, 429, "same /64");
    assert_eq!(get_from("2001:db8:0:1::1").await, 200, "another /64");
    assert_eq!(get_from("::ffff:192.0.2.1").await, 200);
    assert_eq!(
        get_from("192.0.2.1").await,
        429,
        "IPv4-mapped counts as IPv4"
    );
}

#[tokio::test]
async fn forwarded_header_can_carry_the_client() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        &one_request_per_client_ip(
            r#"trusted_hops = 1
header = "forwarded""#,
        ),
    )
    .await;
    let forwarded = |ip: &str| format!("for=1.1.1.1, for=\"{ip}\";proto=https");
    assert_eq!(
        get(gw.addr, "/", &[("forwarded", &forwarded("198.51.100.1"))])
            .await
            .status,
        200
    );
    assert_eq!(
        get(gw.addr, "/", &[("forwarded", &forwarded("198.51.100.1"))])
            .await
            .status,
        429
    );
    assert_eq!(
        get(gw.addr, "/", &[("forwarded", &forwarded("198.51.100.2"))])
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn cookie_and_composite_keys() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[limits.session]
key = ["cookie:sid", "header:user-agent"]
algorithm = "fixed_window"
limit = 1
window = "1d"
# Windows start at the first request: no epoch boundary can fall inside a test.
align = "first_request"

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["session"]
"#,
    )
    .await;
    let h = |sid: &'static str, ua: &'static str| [("cookie", sid), ("user-agent", ua)];
    assert_eq!(get(gw.addr, "/", &h("sid=1", "a")).await.status, 200);
    assert_eq!(
        get(gw.addr, "/", &h("theme=x; sid=1", "a")).await.status,
        429
    );
    assert_eq!(get(gw.addr, "/", &h("sid=1", "b")).await.status, 200);
    assert_eq!(get(gw.addr, "/", &h("sid=2", "a")).await.status, 200);
}

#[tokio::test(start_paused = true)]
async fn a_daily_tenant_quota_stacks_with_a_per_second_burst() {
    let upstream = TestUpstream::start().await;
    let gw = gateway(
        &upstream,
        r#"
[consumers."k-a"]
consumer = "a-web"
tenant = "a"

[consumers."k-b"]
consumer = "b-web"
tenant = "b"

[limits.tenant_burst]
key = "tenant"
algorithm = "token_bucket"
capacity = 2
refill = "2/s"

[limits.tenant_daily]
key = "tenant"
algorithm = "fixed_window"
limit = 3
# A week: the key's jittered boundary (Thursday 00:00 UTC + up to 1 h) is a
# day after the in-process gateway's clock starts (a Wednesday, 00:00 UTC).
window = "7d"
reset_jitter = "1h"

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "api"
limits = ["tenant_burst", "tenant_daily"]
require_consumer = true
"#,
    )
    .await;
    let key = [("x-api-key", "k-a")];
    assert_eq!(get(gw.addr, "/", &key).await.status, 200);
    assert_eq!(get(gw.addr, "/", &key).await.status, 200);
    let reply = get(gw.addr, "/", &key).await;
    assert_eq!(reply.status, 429);
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["tenant_burst"])
    );
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    assert_eq!(get(gw.addr, "/", &key).await.status, 200);
    let reply = get(gw.addr, "/", &key).await;
    assert_eq!(reply.status, 429);
    assert_eq!(
        reply.json()["violated-policies"],
        serde_json::json!(["tenant_daily"])
    );
    // The daily window resets at a per-tenant moment (jittered), not all at once.
    let daily_t = |reply: &common::Reply| -> u64 {
        let header = reply.header("ratelimit").unwrap();
        let item = header
            .split(", ")
            .find(|i| i.starts_with("\"tenant_daily\""))
            .unwrap();
        item.rsplit("t=").next().unwrap().parse().unwrap()
    };
    let a = daily_t(&reply);
    let b = daily_t(&get(gw.addr, "/", &[("x-api-key", "k-b")]).await);
    assert!(a <= 86_400 + 3_600 && b <= 86_400 + 3_600, "{a} {b}");
    assert_ne!(a, b, "two tenants' daily windows reset in the same second");
}

// Paused time: body_read_timeout fires when its time comes.
#[tokio::test(start_paused = true)]
async fn a_slow_body_for_a_body_key_times_out_with_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = TestUpstream::start().await;
    let gw = InProcess::start(&format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nbody_read_timeout = \"500ms\"\n\n[upstreams.api]\nurl = \"{}\"\n\n{LOGIN}",
        upstream.url()
    ))
    .await;
    let mut stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    // The head, then half the declared body, then silence.
    stream
        .write_all(b"POST /login HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{\"username\":")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = common::within_wall_clock(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answer),
    )
    .await;
    assert!(read.is_some(), "the gateway waited for the body forever");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert_eq!(upstream.count(), 0);
}
