//! A real nginx in front of a test upstream, asking tollgate's `/auth`
//! with `auth_request` before it forwards anything: the snippets the README
//! gives for nginx (README, "Forward-auth"), run as they are written, with
//! only the addresses filled in.
//!
//! What is shown: an allowed request reaches the upstream with the
//! rate-limit fields; a denied one (tollgate's 403, which nginx accepts
//! from an auth server, unlike 429) becomes the client's 429 with
//! `Retry-After` and never reaches the upstream; another spelling of a path
//! meets its route; forged forwarding headers change nothing; and with
//! tollgate down nginx answers 500 (the default) or, with the fail-open
//! variant, forwards the request.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::nginx::Nginx;
use common::redis::free_port;
use common::{InProcess, Reply, TestUpstream};
use http_body_util::Full;
use hyper::Request;
use hyper_util::rt::TokioIo;

/// The README's snippet: `{tollgate}` is the decision listener, `{app}` the
/// upstream, `{listen}` nginx's address. nginx sends the client's own
/// headers along with the auth subrequest, so the ones tollgate reads for
/// the client and the original request are overwritten or removed there.
const SNIPPET: &str = r#"upstream tollgate {
    server {tollgate};
    keepalive 16;
}

server {
    listen {listen};

    location / {
        auth_request /_tollgate;
        auth_request_set $tollgate_ratelimit   $upstream_http_ratelimit;
        auth_request_set $tollgate_policy      $upstream_http_ratelimit_policy;
        auth_request_set $tollgate_retry_after $upstream_http_retry_after;
        add_header RateLimit        $tollgate_ratelimit always;
        add_header RateLimit-Policy $tollgate_policy always;
        error_page 403 = @tollgate_throttled;
        proxy_pass {app};
    }

    location = /_tollgate {
        internal;
        proxy_pass http://tollgate/auth;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_pass_request_body off;
        proxy_set_header Content-Length "";
        proxy_set_header X-Original-Method $request_method;
        proxy_set_header X-Original-URI    $request_uri;
        # Overwrite what the client may have sent under these names.
        proxy_set_header X-Forwarded-For    $remote_addr;
        proxy_set_header X-Forwarded-Host   $host;
        proxy_set_header X-Forwarded-Method "";
        proxy_set_header X-Forwarded-Uri    "";
    }

    location @tollgate_throttled {
        default_type application/problem+json;
        add_header Retry-After      $tollgate_retry_after always;
        add_header RateLimit        $tollgate_ratelimit always;
        add_header RateLimit-Policy $tollgate_policy always;
        add_header Cache-Control    no-store always;
        return 429 '{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429}';
    }
}"#;

/// The last line of the snippet's `/_tollgate` location, after which the
/// fail-open variant adds its lines.
const AUTH_LOCATION_LAST: &str = "        proxy_set_header X-Forwarded-Uri    \"\";\n";

/// The fail-open variant's lines in `/_tollgate`: short timeouts, and
/// nginx's own 502 (tollgate refuses or drops the connection) and 504
/// (tollgate does not answer in time) become an allowing 204.
const FAIL_OPEN_LINES: &str = "        proxy_connect_timeout 1s;
        proxy_read_timeout 1s;
        error_page 502 504 = @tollgate_down;
";

/// The fail-open variant's location, beside the others.
const FAIL_OPEN_LOCATION: &str = "
    location @tollgate_down {
        return 204;
    }
";

/// Every request limited per client (`all`), except `OPTIONS`, the
/// `public` paths and the host `partner.example`: somewhere for a forged
/// method, path or host to escape to, if the snippet let it.
const TOLLGATE: &str = r#"
[decision]
listen = "LISTEN"
deny_status = 403

[client_ip]
trusted_cidrs = ["127.0.0.0/8"]

[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 3
window = "1h"

[[routes]]
name = "preflight"
match = { methods = ["OPTIONS"] }

[[routes]]
name = "partner"
match = { host = "partner.example" }

[[routes]]
name = "public"
match = { path_prefix = "/public" }

[[routes]]
name = "all"
match = { path_prefix = "/" }
limits = ["per_ip"]
"#;

/// tollgate's config with its decision listener on `listen`.
fn tollgate(listen: &str) -> String {
    TOLLGATE.replace("LISTEN", listen)
}

/// `snippet` with the addresses filled in.
fn nginx_conf(snippet: &str, tollgate: SocketAddr, upstream: &TestUpstream) -> String {
    snippet
        .replace("{tollgate}", &tollgate.to_string())
        .replace("{app}", &upstream.url())
}

/// The snippet with the fail-open variant's lines and location.
fn fail_open() -> String {
    assert!(SNIPPET.contains(AUTH_LOCATION_LAST) && SNIPPET.ends_with("\n}"));
    let snippet = SNIPPET.replace(
        AUTH_LOCATION_LAST,
        &format!("{AUTH_LOCATION_LAST}{FAIL_OPEN_LINES}"),
    );
    // Inside the server block, before its closing brace.
    format!("{}{FAIL_OPEN_LOCATION}}}", &snippet[..snippet.len() - 1])
}

/// A client of nginx: the address it connects from (any of 127.0.0.0/8
/// on Linux) and its `Host`.
#[derive(Clone, Copy)]
struct Client {
    from: Ipv4Addr,
    host: &'static str,
}

const ALICE: Client = Client {
    from: Ipv4Addr::new(127, 0, 0, 1),
    host: "gateway.test",
};

const BOB: Client = Client {
    from: Ipv4Addr::new(127, 0, 0, 2),
    host: "gateway.test",
};

/// `GET path` from `client` to nginx, on a new connection.
async fn get(nginx: &Nginx, client: Client, path: &str, headers: &[(&str, &str)]) -> Reply {
    request(nginx, client, "GET", path, headers).await
}

/// `METHOD path` from `client` to nginx, on a new connection.
async fn request(
    nginx: &Nginx,
    client: Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", client.host);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let request = builder.body(Full::new(Bytes::new())).expect("request");
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::new(IpAddr::V4(client.from), 0))
        .expect("bind the client's address");
    let stream = socket.connect(nginx.addr).await.expect("connect to nginx");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    common::read_reply(sender.send_request(request).await.expect("response")).await
}

/// The `r` (remaining) parameter of a `RateLimit` field.
fn remaining(reply: &Reply) -> Option<u64> {
    let field = reply.header("ratelimit")?;
    let r = field.split(';').find_map(|p| p.trim().strip_prefix("r="))?;
    r.parse().ok()
}

/// Asserts `reply` is the upstream's answer, allowed with `left` remaining.
fn assert_allowed(reply: &Reply, left: u64, what: &str) {
    assert_eq!(reply.status, 200, "{what}: {reply:?}");
    assert_eq!(reply.header("x-upstream"), Some("yes"), "{what}");
    assert_eq!(remaining(reply), Some(left), "{what}: {:?}", reply.headers);
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"per_ip\";q=3;w=3600"),
        "{what}"
    );
}

/// Asserts `reply` is nginx's 429 made of tollgate's 403.
fn assert_throttled(reply: &Reply, what: &str) {
    assert_eq!(reply.status, 429, "{what}: {reply:?}");
    let retry_after: u64 = reply
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{what}: no Retry-After in {:?}", reply.headers));
    assert!((1..=3600).contains(&retry_after), "{what}: {retry_after}");
    assert_eq!(remaining(reply), Some(0), "{what}: {:?}", reply.headers);
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"per_ip\";q=3;w=3600"),
        "{what}"
    );
    assert_eq!(reply.header("cache-control"), Some("no-store"), "{what}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json"),
        "{what}"
    );
    assert_eq!(reply.json()["status"], 429, "{what}");
    assert_eq!(reply.header("x-upstream"), None, "{what}");
}

#[tokio::test]
async fn nginx_forwards_what_tollgate_allows_and_answers_429_for_what_it_denies() {
    if common::needs::skip(common::needs::NGINX) {
        return;
    }
    let gateway = InProcess::start(&tollgate("127.0.0.1:0")).await;
    let upstream = TestUpstream::start().await;
    let decision = gateway.decision.expect("a decision listener");
    let nginx = Nginx::start(&nginx_conf(SNIPPET, decision, &upstream));

    // Three spellings of /items, none of them the `public` route's path
    // once normalised: each spends alice's budget, and reaches the upstream.
    let spellings = [
        "/public/../items",
        "/public//..//items",
        "/public/%2e%2e/items",
    ];
    for (n, path) in spellings.into_iter().enumerate() {
        let reply = get(&nginx, ALICE, path, &[]).await;
        assert_allowed(&reply, 2 - n as u64, path);
        assert_eq!(upstream.count(), n + 1, "{path}");
        assert_eq!(
            upstream.last_seen().uri,
            path,
            "nginx forwards it as it came"
        );
    }
    let denied = get(&nginx, ALICE, "/items", &[]).await;
    assert_throttled(&denied, "over the limit");
    assert_eq!(
        upstream.count(),
        3,
        "a denied request never reaches the upstream"
    );

    // Forged forwarding headers: another client address, another original
    // path, method or host. nginx overwrites each before tollgate reads it.
    for forged in [
        ("x-forwarded-for", "203.0.113.9"),
        ("x-real-ip", "203.0.113.9"),
        ("x-forwarded-uri", "/public/x"),
        ("x-forwarded-method", "OPTIONS"),
        ("x-forwarded-host", "partner.example"),
        ("x-original-uri", "/public/x"),
    ] {
        let reply = get(&nginx, ALICE, "/items", &[forged]).await;
        assert_throttled(&reply, &format!("forged {forged:?}"));
    }
    assert_eq!(upstream.count(), 3);

    // The routes a forgery would have escaped to are really unlimited
    // (no fields: no limit applies); the real host reaches tollgate.
    let public = get(&nginx, ALICE, "/public/x", &[]).await;
    assert_eq!((public.status, public.header("ratelimit")), (200, None));
    let partner = Client {
        host: "partner.example",
        ..ALICE
    };
    let hosted = get(&nginx, partner, "/items", &[]).await;
    assert_eq!((hosted.status, hosted.header("ratelimit")), (200, None));
    let preflight = request(&nginx, ALICE, "OPTIONS", "/items", &[]).await;
    assert_eq!(
        (preflight.status, preflight.header("ratelimit")),
        (200, None)
    );
    assert_eq!(upstream.count(), 6);

    // The client is nginx's peer, not nginx: bob has a budget of his own.
    let bob = get(&nginx, BOB, "/items", &[]).await;
    assert_allowed(&bob, 2, "another client");
    assert_eq!(upstream.count(), 7);
    drop(nginx);
    gateway.stop().await;
}

#[tokio::test]
async fn passed_on_unchanged_the_clients_headers_choose_its_key_but_not_its_route() {
    if common::needs::skip(common::needs::NGINX) {
        return;
    }
    // Why the snippet overwrites them: without those lines (and only
    // X-Real-IP set, as many auth_request examples do) the client's own
    // X-Forwarded-For is the key. Its X-Forwarded-Uri beside nginx's
    // X-Original-URI is refused by tollgate (two descriptions that
    // disagree: 400, which nginx turns into a 500), so it cannot pick its
    // route; it only hurts itself.
    let naive = SNIPPET.replace(
        "        # Overwrite what the client may have sent under these names.
        proxy_set_header X-Forwarded-For    $remote_addr;
        proxy_set_header X-Forwarded-Host   $host;
        proxy_set_header X-Forwarded-Method \"\";
        proxy_set_header X-Forwarded-Uri    \"\";
",
        "        proxy_set_header X-Real-IP $remote_addr;\n",
    );
    assert_ne!(naive, SNIPPET);
    let gateway = InProcess::start(&tollgate("127.0.0.1:0")).await;
    let upstream = TestUpstream::start().await;
    let nginx = Nginx::start(&nginx_conf(&naive, gateway.decision.unwrap(), &upstream));
    for _ in 0..3 {
        assert_eq!(get(&nginx, ALICE, "/items", &[]).await.status, 200);
    }
    assert_eq!(get(&nginx, ALICE, "/items", &[]).await.status, 429);
    let forged_client = get(
        &nginx,
        ALICE,
        "/items",
        &[("x-forwarded-for", "203.0.113.9")],
    )
    .await;
    assert_allowed(
        &forged_client,
        2,
        "a forged X-Forwarded-For is a fresh budget",
    );
    let forged_path = [
        ("x-forwarded-method", "GET"),
        ("x-forwarded-uri", "/public/x"),
    ];
    let refused = get(&nginx, ALICE, "/items", &forged_path).await;
    assert_eq!(
        refused.status, 500,
        "a forged X-Forwarded-Uri is refused, not decided as that path"
    );
    assert_eq!(upstream.count(), 4);
    drop(nginx);
    gateway.stop().await;
}

#[tokio::test]
async fn with_tollgate_down_nginx_answers_500_and_forwards_nothing() {
    if common::needs::skip(common::needs::NGINX) {
        return;
    }
    let gateway = InProcess::start(&tollgate("127.0.0.1:0")).await;
    let upstream = TestUpstream::start().await;
    let nginx = Nginx::start(&nginx_conf(SNIPPET, gateway.decision.unwrap(), &upstream));
    assert_allowed(&get(&nginx, ALICE, "/items", &[]).await, 2, "tollgate up");
    gateway.stop().await;
    let down = get(&nginx, ALICE, "/items", &[]).await;
    assert_eq!(
        down.status,
        500,
        "auth_request fails closed: {down:?}\n{}",
        nginx.error_log()
    );
    assert_eq!(down.header("ratelimit"), None);
    assert_eq!(
        upstream.count(),
        1,
        "nothing forwarded while tollgate is down"
    );
    assert!(
        nginx.error_log().contains("while connecting to upstream"),
        "{}",
        nginx.error_log()
    );
}

#[tokio::test]
async fn the_fail_open_variant_forwards_while_tollgate_is_down_or_hangs_and_limits_once_it_is_back()
{
    if common::needs::skip(common::needs::NGINX) {
        return;
    }
    // A fixed port, so that tollgate can come back where nginx looks.
    let listen = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = tollgate(&listen.to_string());
    let upstream = TestUpstream::start().await;
    let nginx = Nginx::start(&nginx_conf(&fail_open(), listen, &upstream));

    let gateway = InProcess::start(&config).await;
    for left in [2, 1, 0] {
        assert_allowed(&get(&nginx, ALICE, "/items", &[]).await, left, "up");
    }
    assert_throttled(&get(&nginx, ALICE, "/items", &[]).await, "up, over");
    assert_eq!(upstream.count(), 3);

    // Down (the port refuses): nginx's 502 for the subrequest is the 204.
    gateway.stop().await;
    for n in 1..=2 {
        let open = get(&nginx, ALICE, "/items", &[]).await;
        assert_eq!(open.status, 200, "down: {open:?}\n{}", nginx.error_log());
        assert_eq!(open.header("x-upstream"), Some("yes"));
        assert_eq!(open.header("ratelimit"), None, "no decision, no fields");
        assert_eq!(upstream.count(), 3 + n);
    }

    // Back on its port (its counts were in its memory): limited at once.
    let gateway = InProcess::start(&config).await;
    assert_allowed(&get(&nginx, ALICE, "/items", &[]).await, 2, "back");
    gateway.stop().await;

    // Hung: the port accepts (the kernel does) and nothing answers; after
    // proxy_read_timeout nginx's 504 for the subrequest is the 204.
    let hung = std::net::TcpListener::bind(listen).expect("bind tollgate's port");
    let started = Instant::now();
    let open = get(&nginx, ALICE, "/items", &[]).await;
    let waited = started.elapsed();
    assert_eq!(open.status, 200, "hung: {open:?}\n{}", nginx.error_log());
    assert_eq!(upstream.count(), 7);
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(20),
        "forwarded after the 1 s read timeout, not nginx's default 60 s: {waited:?}"
    );
    assert!(
        nginx.error_log().contains("upstream timed out"),
        "{}",
        nginx.error_log()
    );
    drop(hung);
}

/// The nginx snippets of the decision service guide are the ones these
/// tests run (with the guide's addresses), so the documentation cannot drift from what works.
#[test]
fn the_readme_gives_the_snippets_these_tests_run() {
    let readme = include_str!("../docs/src/guides/decision-service.md");
    let snippet = SNIPPET
        .replace("{tollgate}", "127.0.0.1:8081")
        .replace("{listen}", "80")
        .replace("{app}", "http://app");
    assert!(
        readme.contains(&snippet),
        "the decision service guide lacks the nginx snippet:\n{snippet}"
    );
    assert!(
        readme.contains(FAIL_OPEN_LINES),
        "the decision service guide lacks the fail-open lines"
    );
    assert!(
        readme.contains(FAIL_OPEN_LOCATION.trim_start_matches('\n')),
        "the decision service guide lacks the fail-open location"
    );
}
