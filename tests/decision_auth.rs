//! The decision service's forward-auth endpoint, `/auth`, end to end
//! through real sockets: the original request as Traefik and nginx describe
//! it, decided by the route's stack, answered with the rate-limit fields;
//! counted with `front = "auth"`.

mod common;

use common::{InProcess, get};

const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[decision]
listen = "127.0.0.1:0"
DENY_STATUS

[client_ip]
trusted_cidrs = ["127.0.0.0/8"]

[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "1m"

[[routes]]
name = "api"
match = { path_prefix = "/api", methods = ["GET"] }
limits = ["per_ip"]
"#;

fn config(deny_status: &str) -> String {
    CONFIG.replace("DENY_STATUS", deny_status)
}

/// Exactly what Traefik's ForwardAuth middleware sends (its
/// `pkg/middlewares/auth/forward.go`, with `trustForwardHeader`): the method,
/// proto, host, URI and port, the client in `X-Forwarded-For`, and the
/// `X-Real-Ip` and `X-Forwarded-Server` its forwarding headers add.
fn traefik<'a>(uri: &'a str, client: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("x-forwarded-method", "GET"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "api.example"),
        ("x-forwarded-uri", uri),
        ("x-forwarded-port", "443"),
        ("x-forwarded-for", client),
        ("x-forwarded-server", "traefik-7d9f"),
        ("x-real-ip", client),
    ]
}

#[tokio::test]
async fn traefik_forward_auth_is_allowed_then_denied_with_the_fields() {
    let gateway = InProcess::start(&config("")).await;
    let auth = gateway.decision.expect("a decision listener");
    let first = get(auth, "/auth", &traefik("/api/items", "203.0.113.5")).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    assert!(first.body.is_empty());
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"per_ip\";q=2;w=60")
    );
    assert!(
        first
            .header("ratelimit")
            .is_some_and(|v| v.starts_with("\"per_ip\";r=1;t=")),
        "{:?}",
        first.headers
    );
    // Another spelling of the same path meets the same limit.
    let second = get(auth, "/auth", &traefik("/api/./items//x/..", "203.0.113.5")).await;
    assert_eq!(second.status, 200);
    let third = get(auth, "/auth", &traefik("/api/items", "203.0.113.5")).await;
    assert_eq!(third.status, 429, "Traefik passes the status on as it is");
    assert!(third.header("retry-after").is_some());
    assert_eq!(third.header("cache-control"), Some("no-store"));
    let body = third.json();
    assert_eq!(body["violated-policies"][0], "per_ip");
    // Another client behind the same trusted proxy has its own budget.
    let other = get(auth, "/auth", &traefik("/api/items", "198.51.100.7")).await;
    assert_eq!(other.status, 200);

    let metrics = get(gateway.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains(
            r#"tollgate_ratelimit_decisions_total{route="api",limit="per_ip",outcome="denied",front="auth"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"tollgate_ratelimit_decisions_total{route="api",limit="per_ip",outcome="allowed",front="auth"} 3"#
        ),
        "{text}"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn nginx_auth_request_gets_the_configured_deny_status() {
    let gateway = InProcess::start(&config("deny_status = 403")).await;
    let auth = gateway.decision.unwrap();
    let nginx = [
        ("x-original-method", "GET"),
        ("x-original-uri", "/api/v1?q=1"),
        ("x-real-ip", "192.0.2.1"),
    ];
    for _ in 0..2 {
        assert_eq!(get(auth, "/auth", &nginx).await.status, 200);
    }
    let denied = get(auth, "/auth", &nginx).await;
    assert_eq!(denied.status, 403);
    assert!(denied.header("retry-after").is_some());
    assert!(denied.header("ratelimit").is_some());
    // X-Real-IP from a trusted peer is the client: another one passes.
    let other = [
        ("x-original-method", "GET"),
        ("x-original-uri", "/api/v1"),
        ("x-real-ip", "192.0.2.2"),
    ];
    assert_eq!(get(auth, "/auth", &other).await.status, 200);
    gateway.stop().await;
}

#[tokio::test]
async fn without_the_original_request_auth_answers_400_and_unrouted_requests_pass() {
    let gateway = InProcess::start(&config("")).await;
    let auth = gateway.decision.unwrap();
    let missing = get(auth, "/auth", &[("x-forwarded-uri", "/api")]).await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    let escaping = get(
        auth,
        "/auth",
        &[
            ("x-original-method", "GET"),
            ("x-original-uri", "/api/../../x"),
        ],
    )
    .await;
    assert_eq!(escaping.status, 400);
    // A method the route does not list: no route, no limit.
    let post = [
        ("x-original-method", "POST"),
        ("x-original-uri", "/api/items"),
    ];
    for _ in 0..4 {
        assert_eq!(get(auth, "/auth", &post).await.status, 200);
    }
    let unknown = get(gateway.decision.unwrap(), "/nothing", &[]).await;
    assert_eq!(unknown.status, 404);
    gateway.stop().await;
}

#[tokio::test]
async fn a_route_for_auth_alone_is_404_on_the_proxy_and_decides_on_auth() {
    let config = config("").replace(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n",
        "",
    );
    // No `[server] listen`: a decision service alone.
    let gateway = InProcess::start(&config).await;
    assert_eq!(Some(gateway.addr), gateway.decision);
    let auth = gateway.decision.unwrap();
    let nginx = [("x-original-method", "GET"), ("x-original-uri", "/api")];
    assert_eq!(get(auth, "/auth", &nginx).await.status, 200);
    gateway.stop().await;

    let both = InProcess::start(&self::config("")).await;
    let proxied = get(both.addr, "/api/items", &[]).await;
    assert_eq!(proxied.status, 404, "nothing to forward to");
    both.stop().await;
}

/// An HS256 token for `sub` valid around the in-process clock's start.
fn token(secret: &[u8], sub: &str) -> String {
    let now = common::IN_PROCESS_EPOCH / tollgate::limit::NANOS_PER_SEC;
    let claims = serde_json::json!({"iss": "https://sso.example/", "sub": sub, "exp": now + 3600});
    common::jwt::hs256(secret, &claims)
}

/// nginx `auth_request` passes the client's `Authorization` on to `/auth`:
/// the token is verified there, its user is the key, and a request without
/// a valid one gets the 401 and challenge nginx relays to the client.
#[tokio::test]
async fn auth_verifies_the_bearer_token_and_keys_on_its_claim() {
    let secret = b"forward-auth-secret-32-bytes-long";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("secret"), secret).unwrap();
    let config = r#"
[server]
admin = "127.0.0.1:0"

[decision]
listen = "127.0.0.1:0"

[[jwt.issuers]]
issuer = "https://sso.example/"
secret_file = "secret"

[limits.per_user]
key = "jwt:sub"
algorithm = "fixed_window"
limit = 1
window = "1m"

[[routes]]
name = "api"
match = { path_prefix = "/api" }
limits = ["per_user"]
require_jwt = true
"#;
    let gateway = InProcess::start_in(dir, config).await;
    let auth = gateway.decision.expect("a decision listener");
    let nginx = |authorization: &str| {
        vec![
            ("x-original-method", "GET".to_owned()),
            ("x-original-uri", "/api/items".to_owned()),
            ("authorization", authorization.to_owned()),
        ]
    };
    let ask = |headers: Vec<(&'static str, String)>| async move {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        get(auth, "/auth", &headers).await
    };
    let alice = format!("Bearer {}", token(secret, "alice"));
    let bob = format!("Bearer {}", token(secret, "bob"));
    assert_eq!(ask(nginx(&alice)).await.status, 200);
    assert_eq!(
        ask(nginx(&alice)).await.status,
        429,
        "alice's one request a minute"
    );
    assert_eq!(ask(nginx(&bob)).await.status, 200, "bob has his own budget");
    let forged = format!(
        "Bearer {}",
        token(b"not-the-secret-not-the-secret-!!", "bob")
    );
    let refused = ask(nginx(&forged)).await;
    assert_eq!(refused.status, 401);
    assert_eq!(
        refused.header("www-authenticate"),
        Some(
            "Bearer error=\"invalid_token\", error_description=\"the token's signature does not verify\""
        )
    );
    let none = ask(nginx("Basic YTpi")).await;
    assert_eq!(none.status, 401);
    assert_eq!(none.header("www-authenticate"), Some("Bearer"));
}
