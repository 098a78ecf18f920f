//! The operator's view through real sockets: `GET /stats` after traffic on
//! two routes with refusing limits (its numbers against `/metrics`, the
//! keys refused most named by consumer or tenant, never a raw key), and
//! `GET /dashboard` rendered by a real headless Chromium (Debian's
//! `chromium`; ignored where it is missing, see build.rs), which must name
//! the routes and the limits, under a policy that lets it fetch nothing
//! but its own origin.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::openmetrics::parse;
use common::{InProcess, TestUpstream, get};
use serde_json::Value;

/// The API keys the traffic presents: none may appear in `/stats` or the
/// rendered page.
const ACME_KEY: &str = "sk-live-ACME-0123456789";
const STRANGER_KEY: &str = "sk-live-STRANGER-9876543210";

fn config(upstream: &TestUpstream) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1
shutdown_timeout = "2s"

[upstreams.backend]
url = "{url}"
timeout = "2s"

[limits.orders_per_key]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 2
window = "1h"

[limits.catalog_per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 1
window = "1h"

[limits.tenant_quota]
key = "tenant"
algorithm = "fixed_window"
limit = 1
window = "1h"

[consumers."{ACME_KEY}"]
consumer = "acme-web"
tenant = "acme"

[[routes]]
name = "orders"
match = {{ path_prefix = "/orders" }}
upstream = "backend"
limits = ["orders_per_key"]

[[routes]]
name = "catalog"
match = {{ path_prefix = "/catalog" }}
respond = {{ status = 200, body = "catalog\n" }}
limits = ["catalog_per_ip"]

[[routes]]
name = "reports"
match = {{ path_prefix = "/reports" }}
respond = {{ status = 200, body = "reports\n" }}
limits = ["tenant_quota"]
"#,
        url = upstream.url()
    )
}

/// `n` requests for `path`, each with `headers`; their statuses.
async fn traffic(gateway: &InProcess, path: &str, headers: &[(&str, &str)], n: usize) -> Vec<u16> {
    let mut statuses = Vec::new();
    for _ in 0..n {
        statuses.push(get(gateway.addr, path, headers).await.status);
    }
    statuses
}

/// The traffic of both tests: on `orders`, acme 5 times (2 admitted) and
/// a key no consumer has 3 times (2 admitted); on `catalog` 3 requests (1
/// admitted); on `reports` acme twice (1 admitted).
async fn drive(gateway: &InProcess) {
    let acme = [("x-api-key", ACME_KEY)];
    let stranger = [("x-api-key", STRANGER_KEY)];
    assert_eq!(
        traffic(gateway, "/orders/1", &acme, 5).await,
        [200, 200, 429, 429, 429]
    );
    assert_eq!(
        traffic(gateway, "/orders/2", &stranger, 3).await,
        [200, 200, 429]
    );
    assert_eq!(traffic(gateway, "/catalog", &[], 3).await, [200, 429, 429]);
    assert_eq!(traffic(gateway, "/reports", &acme, 2).await, [200, 429]);
}

fn admin(gateway: &InProcess) -> SocketAddr {
    gateway.admin.expect("an admin listener")
}

async fn read_stats(gateway: &InProcess) -> (Value, String) {
    let reply = get(admin(gateway), "/stats", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    (reply.json(), text)
}

/// The entry of `list` whose `field` is `name`.
fn entry<'v>(list: &'v Value, field: &str, name: &str) -> &'v Value {
    list.as_array()
        .and_then(|items| items.iter().find(|item| item[field] == name))
        .unwrap_or_else(|| panic!("no {field} = {name} in {list:#}"))
}

#[tokio::test]
async fn stats_reports_the_counters_of_metrics_after_real_traffic() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream)).await;
    drive(&gateway).await;
    let (stats, text) = read_stats(&gateway).await;

    assert_eq!(stats["version"], 1);
    assert!(stats["unix_ms"].as_u64().is_some_and(|ms| ms > 0));

    let routes = &stats["routes"];
    let orders = entry(routes, "route", "orders");
    assert_eq!(
        orders["statuses"],
        serde_json::json!({ "200": 4, "429": 4 })
    );
    assert_eq!(orders["total"], 8);
    assert_eq!(orders["upstream"], "backend");
    assert_eq!(orders["latency"]["count"], 8);
    let catalog = entry(routes, "route", "catalog");
    assert_eq!(
        catalog["statuses"],
        serde_json::json!({ "200": 1, "429": 2 })
    );
    assert_eq!(catalog["upstream"], Value::Null);

    let limits = &stats["limits"];
    let per_key = entry(limits, "limit", "orders_per_key");
    assert_eq!(
        (per_key["allowed"].as_u64(), per_key["denied"].as_u64()),
        (Some(4), Some(4))
    );
    assert_eq!(per_key["routes"], serde_json::json!(["orders"]));
    assert_eq!(per_key["key"], "header:x-api-key");
    assert_eq!(per_key["keys"], 2, "two live keys");
    let per_ip = entry(limits, "limit", "catalog_per_ip");
    assert_eq!(
        (per_ip["allowed"].as_u64(), per_ip["denied"].as_u64()),
        (Some(1), Some(2))
    );

    // The same numbers as the exposition.
    let exposition = get(admin(&gateway), "/metrics", &[]).await;
    let exposition = String::from_utf8_lossy(&exposition.body).into_owned();
    let exposition = parse(&exposition).unwrap_or_else(|e| panic!("{e}\n{exposition}"));
    for (route, limit, outcome) in [
        ("orders", "orders_per_key", "denied"),
        ("catalog", "catalog_per_ip", "allowed"),
    ] {
        let labels = [
            ("route", route),
            ("limit", limit),
            ("outcome", outcome),
            ("front", "proxy"),
        ];
        let metric = exposition.value("tollgate_ratelimit_decisions_total", &labels);
        assert_eq!(
            metric,
            entry(limits, "limit", limit)[outcome].as_f64(),
            "{limit} {outcome}"
        );
    }
    assert_eq!(
        exposition.value(
            "tollgate_requests_total",
            &[("route", "orders"), ("status", "429")]
        ),
        Some(4.0)
    );

    // The keys refused most: the consumer by name, the tenant by name,
    // the stranger's key and the address by digest.
    let refused = &stats["refused_keys"];
    assert_eq!(refused["capacity"], 64);
    let keys = refused["keys"].as_array().expect("keys");
    assert_eq!(keys.len(), 4, "{keys:#?}");
    assert_eq!(keys[0]["count"], 3);
    assert_eq!(keys[0]["limit"], "orders_per_key");
    assert_eq!(keys[0]["consumer"], "acme-web");
    let find =
        |limit: &str| -> Vec<&Value> { keys.iter().filter(|k| k["limit"] == limit).collect() };
    let tenant = find("tenant_quota");
    assert_eq!(
        (tenant[0]["tenant"].as_str(), tenant[0]["count"].as_u64()),
        (Some("acme"), Some(1))
    );
    let by_ip = find("catalog_per_ip");
    assert_eq!(
        (by_ip[0]["consumer"].as_str(), by_ip[0]["count"].as_u64()),
        (None, Some(2))
    );
    let stranger = find("orders_per_key")
        .into_iter()
        .find(|k| k["consumer"].is_null())
        .expect("the stranger's key");
    assert_eq!(
        (stranger["count"].as_u64(), stranger["error"].as_u64()),
        (Some(1), Some(0))
    );
    // Its digest is the one the explain endpoint gives for that key.
    let explained = get(
        admin(&gateway),
        &format!("/limits/orders_per_key?key={STRANGER_KEY}"),
        &[],
    )
    .await;
    assert_eq!(explained.status, 200);
    assert_eq!(stranger["digest"], explained.json()["digest"]);

    // Never a raw key.
    for secret in [ACME_KEY, STRANGER_KEY, "ACME-0123", "STRANGER"] {
        assert!(!text.contains(secret), "/stats shows {secret}: {text}");
    }

    let upstreams = &stats["upstreams"];
    let backend = entry(upstreams, "upstream", "backend");
    assert_eq!(backend["routes"], serde_json::json!(["orders"]));
    assert_eq!(backend["urls"][0]["url"], upstream.url());
    assert_eq!(backend["urls"][0]["healthy"], true);
    assert_eq!(backend["urls"][0]["ejections_total"], 0);
    assert_eq!(backend["latency"]["count"], 8);

    assert_eq!(stats["store"]["backend"], "memory");
    assert_eq!(stats["store"]["state"], "up");
    assert_eq!(stats["store"]["fallback_active"], false);
    let config = get(admin(&gateway), "/config", &[]).await.json();
    assert_eq!(stats["config"]["generation"], 1);
    assert_eq!(stats["config"]["sha256"], config["sha256"]);
    assert_eq!(stats["config"]["last_error"], Value::Null);
    assert_eq!(
        stats["config"]["reloads"],
        serde_json::json!({ "ok": 0, "error": 0 })
    );
    assert_eq!(stats["adaptive"], serde_json::json!([]));
    assert_eq!(stats["queues"], serde_json::json!([]));

    // A reload that fails shows in the document, the generation serving kept.
    assert_eq!(gateway.reload_with("[server\n"), 1);
    let (after, _) = read_stats(&gateway).await;
    assert_eq!(after["config"]["generation"], 1);
    assert!(
        after["config"]["last_error"]["message"].is_string(),
        "{:#}",
        after["config"]
    );
    assert_eq!(after["config"]["reloads"]["error"], 1);
    gateway.stop().await;
}

#[tokio::test]
async fn dashboard_is_one_page_that_fetches_only_its_own_origin() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream)).await;
    let reply = get(admin(&gateway), "/dashboard", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let policy = reply.header("content-security-policy").expect("a CSP");
    let directives: Vec<&str> = policy.split(';').map(str::trim).collect();
    assert_eq!(directives[0], "default-src 'none'");
    assert!(directives.contains(&"connect-src 'self'"), "{policy}");
    for directive in &directives {
        let sources = directive.split_whitespace().skip(1);
        for source in sources {
            assert!(
                source.starts_with("'sha256-") || ["'self'", "'none'"].contains(&source),
                "{directive} allows {source}"
            );
        }
    }
    let html = String::from_utf8_lossy(&reply.body);
    assert!(html.starts_with("<!doctype html>"));
    // No other origin named anywhere: no script, style, font or fetch.
    for scheme in ["http://", "https://", "//cdn", "ws://", "wss://"] {
        assert!(!html.contains(scheme), "the page names {scheme}");
    }
    // Each inline element is the one its hash allows.
    for (tag, directive) in [("script", "script-src"), ("style", "style-src")] {
        let open = format!("<{tag}>");
        let start = html.find(&open).expect("inline element") + open.len();
        let end = start + html[start..].find(&format!("</{tag}>")).expect("closed");
        let hash = sha256_base64(&html[start..end]);
        assert!(
            policy.contains(&format!("{directive} 'sha256-{hash}'")),
            "{directive} does not allow the page's {tag}: {policy}"
        );
    }
    gateway.stop().await;
}

fn sha256_base64(text: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(text.as_bytes()))
}

/// Chromium's rendering of `url` after the page ran for `budget` of
/// virtual time (its fetches complete within it), as HTML.
fn rendered_dom(url: &str, budget: Duration) -> String {
    let profile = tempfile::tempdir().expect("a profile directory");
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .arg("--dump-dom")
        .arg(url)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run chromium ({e}); install it: apt-get install -y chromium")
        });
    let dom = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success() && !dom.is_empty(),
        "chromium failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    dom
}

#[tokio::test]
async fn chromium_renders_the_routes_limits_and_refused_keys() {
    if common::needs::skip(common::needs::CHROMIUM) {
        return;
    }
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream)).await;
    drive(&gateway).await;
    let url = format!("http://{}/dashboard", admin(&gateway));
    let dom = tokio::task::spawn_blocking(move || rendered_dom(&url, Duration::from_secs(5)))
        .await
        .expect("chromium's thread");
    // The script ran under the policy and drew /stats: the live mark,
    // both routes in the table, each limit's bar, the consumer refused.
    assert!(
        dom.contains("live ·"),
        "the page did not read /stats:\n{dom}"
    );
    for route in ["orders", "catalog"] {
        assert!(
            dom.contains(&format!("{route}</td>")),
            "route {route} missing:\n{dom}"
        );
    }
    for limit in ["orders_per_key", "catalog_per_ip", "tenant_quota"] {
        assert!(
            dom.contains(&format!(
                "<text x=\"0\" y=\"14\" class=\"name\">{limit}</text>"
            )) || dom.contains(&format!("class=\"name\">{limit}</text>")),
            "limit {limit} has no bar:\n{dom}"
        );
    }
    assert!(
        dom.contains("<span>acme-web</span>"),
        "the consumer refused most:\n{dom}"
    );
    // No token is configured: the token form stays hidden.
    assert!(
        dom.contains("id=\"token-form\" class=\"token\" hidden"),
        "{dom}"
    );
    for secret in [ACME_KEY, STRANGER_KEY] {
        assert!(!dom.contains(secret), "the page shows {secret}");
    }
    gateway.stop().await;
}

/// With an admin token: the page itself opens without one (a browser cannot
/// send a bearer header when it opens a page, and the page holds no data),
/// while `/stats`, what it draws, needs the token like every admin read; the
/// page's script asks for the token on that 401 and sends it as a bearer.
#[tokio::test]
async fn with_a_token_the_page_opens_and_its_data_needs_the_token() {
    const TOKEN: &str = "dashboard-test-token";
    let upstream = TestUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("admin.token"), format!("{TOKEN}\n")).expect("token file");
    let text = config(&upstream).replace(
        "admin = \"127.0.0.1:0\"\n",
        "admin = \"127.0.0.1:0\"\nadmin_token_file = \"admin.token\"\n",
    );
    assert!(
        text.contains("admin_token_file"),
        "the config has no admin line"
    );
    let gateway = InProcess::start_in(dir, &text).await;
    drive(&gateway).await;
    let page = get(admin(&gateway), "/dashboard", &[]).await;
    assert_eq!(page.status, 200, "{page:?}");
    let html = String::from_utf8_lossy(&page.body).into_owned();
    assert!(
        html.contains("Authorization"),
        "the page sends no bearer token"
    );
    assert!(html.contains("sessionStorage"), "the page keeps no token");
    let bare = get(admin(&gateway), "/stats", &[]).await;
    assert_eq!(bare.status, 401, "{bare:?}");
    assert!(
        bare.header("www-authenticate")
            .is_some_and(|v| v.starts_with("Bearer"))
    );
    let wrong = get(
        admin(&gateway),
        "/stats",
        &[("authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(wrong.status, 401, "{wrong:?}");
    let bearer = format!("Bearer {TOKEN}");
    let read = get(admin(&gateway), "/stats", &[("authorization", &bearer)]).await;
    assert_eq!(read.status, 200, "{read:?}");
    let stats: Value = serde_json::from_slice(&read.body).expect("json");
    assert!(stats["routes"].is_array(), "{stats}");
    // Writes to the page are no reads: refused like any admin write.
    let post = common::send(
        admin(&gateway),
        http::Request::builder()
            .method("POST")
            .uri("/dashboard")
            .header("host", "admin.test")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(post.status, 401, "{post:?}");
}
