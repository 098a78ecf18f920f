//! A new user's first hour: through the binary, `check` warns about
//! limits that a request can walk around (and `run` at start), config
//! errors show the form to write, a port in use names its line; with the
//! gateway in process, the decision metrics say what happened to the
//! request, `/limits/NAME` explains a key's state, and the Grafana
//! dashboard queries only metrics that exist.

mod common;

use std::time::Duration;

use common::openmetrics::parse;
use common::{Gateway, InProcess, TestUpstream, get, tollgate};

fn write(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path.to_string_lossy().into_owned())
}

const PER_KEY: &str = r#"
[upstreams.api]
url = "http://127.0.0.1:9000"

[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 20
refill = "10/s"

[limits.per_ip]
key = "ip"
algorithm = "sliding_window"
limit = 100
window = "1m"
"#;

fn with_route(limits: &str) -> String {
    format!(
        "{PER_KEY}\n[[routes]]\nname = \"api\"\nmatch = {{ path_prefix = \"/\" }}\nupstream = \"api\"\nlimits = {limits}\n"
    )
}

#[test]
fn check_warns_when_a_request_can_pass_every_limit_unlimited() {
    let (_dir, path) = write(&with_route(r#"["per_key"]"#));
    let (code, stdout, stderr) = tollgate(&["check", "-c", &path]);
    assert_eq!(code, 0, "a warning is not an error: {stderr}");
    assert!(stdout.contains("routes:"), "{stdout}");
    assert!(stderr.contains("warning: route `api`"), "{stderr}");
    assert!(stderr.contains("a `x-api-key` header"), "{stderr}");
    assert!(
        stderr.contains(r#"limits = ["per_key", "per_ip"]"#),
        "the fix is shown: {stderr}"
    );

    let (_dir, path) = write(&with_route(r#"["per_key", "per_ip"]"#));
    let (code, _, stderr) = tollgate(&["check", "-c", &path]);
    assert_eq!(code, 0);
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[tokio::test]
async fn run_logs_the_same_warning_at_start() {
    let upstream = TestUpstream::start().await;
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{}",
        with_route(r#"["per_key"]"#).replace("http://127.0.0.1:9000", &upstream.url())
    );
    let gateway = Gateway::start(&config);
    // The startup warning comes with the first log lines.
    let stderr = gateway.stderr_when(|s| s.contains("route `api`"), Duration::from_secs(10));
    assert!(stderr.contains("passes every limit"), "{stderr}");
    // Keyless requests are indeed unlimited: the warning is true.
    assert_eq!(get(gateway.addr, "/", &[]).await.status, 200);
}

#[test]
fn config_errors_show_what_to_write() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "[routes]\nname = \"a\"\nmatch = { path = \"/\" }\nupstream = \"api\"\n",
            "routes as one table",
            &["gateway.toml:", "`routes`", "write `[[routes]]`"],
        ),
        (
            "[[routes]]\nname = \"a\"\nmatch = { path = \"/\" }\nupstream = \"api\"\nlimits = \"per_key\"\n",
            "limits as a string",
            &["`routes[0].limits`", r#"write `limits = ["per_key"]`"#],
        ),
        (
            "[limits.x]\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = \"20\"\nrefill = \"10/s\"\n",
            "capacity as a string",
            &[
                "`limits.x.capacity`",
                "write `capacity = 20` (without quotes)",
            ],
        ),
        (
            "[limits.x]\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 20\nrefill = 10\n",
            "refill as a number",
            &["`limits.x.refill`", r#"write `refill = "10/s"`"#],
        ),
        (
            "[limits.x]\nkey = \"x-api-key\"\nalgorithm = \"token_bucket\"\ncapacity = 20\nrefill = \"10/s\"\n",
            "a header name without its kind",
            &["`limits.x.key`", r#"write "header:x-api-key""#],
        ),
        (
            "[limits.x]\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 20\nrefill = \"10/s\"\nlimit = 5\n",
            "a parameter of another algorithm",
            &["`limits.x.limit`", "not a parameter of token_bucket"],
        ),
    ];
    for (text, what, wanted) in cases {
        let (_dir, path) = write(&format!(
            "[upstreams.api]\nurl = \"http://127.0.0.1:9000\"\n{text}"
        ));
        let (code, stdout, stderr) = tollgate(&["check", "-c", &path]);
        assert_eq!(code, 1, "{what}: {stdout}{stderr}");
        for w in *wanted {
            assert!(stderr.contains(w), "{what}: wanted {w:?} in\n{stderr}");
        }
        assert!(
            !stderr.contains("needs `"),
            "{what}: no misleading 'needs': {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    }
}

#[test]
fn documented_rate_spellings_are_accepted_and_others_refused() {
    for rate in [
        "10/s",
        "10/sec",
        "10/second",
        "600/m",
        "600/min",
        "1/5s",
        "0.5/s",
        "1000/h",
        "1/d",
    ] {
        let text = PER_KEY.replace("\"10/s\"", &format!("\"{rate}\""));
        let (_dir, path) = write(&text);
        let (code, _, stderr) = tollgate(&["check", "-c", &path]);
        assert_eq!(code, 0, "{rate}: {stderr}");
    }
    for rate in ["10/seconds", "10 per second", "10/fortnight", "10"] {
        let text = PER_KEY.replace("\"10/s\"", &format!("\"{rate}\""));
        let (_dir, path) = write(&text);
        let (code, _, stderr) = tollgate(&["check", "-c", &path]);
        assert_eq!(code, 1, "{rate} is refused");
        assert!(
            stderr.contains("`limits.per_key.refill`"),
            "{rate}: {stderr}"
        );
    }
}

#[test]
fn a_port_in_use_names_the_listen_line() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (_dir, path) = write(&format!(
        "[server]\nworkers = 1\nlisten = \"127.0.0.1:{port}\"\n"
    ));
    let (code, _, stderr) = tollgate(&["run", "-c", &path]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("gateway.toml:3:1: `server.listen`"),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
    drop(taken);
}

fn stacked(upstream: &TestUpstream) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
log_denied = "none"

[upstreams.api]
url = "{}"

[limits.per_key]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 100
window = "1d"
align = "first_request"

[limits.per_route]
key = "route"
algorithm = "fixed_window"
limit = 3
window = "1d"
align = "first_request"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["per_key", "per_route"]
"#,
        upstream.url()
    )
}

#[tokio::test]
async fn decisions_count_what_happened_to_the_request() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&stacked(&upstream)).await;
    let mut admitted = 0;
    for _ in 0..10 {
        if get(gateway.addr, "/", &[("x-api-key", "k1")]).await.status == 200 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
    let reply = get(gateway.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let m = parse(&text).unwrap();
    let decision = |limit: &str, outcome: &str| {
        m.count(
            "tollgate_ratelimit_decisions_total",
            &[
                ("route", "api"),
                ("limit", limit),
                ("outcome", outcome),
                ("front", "proxy"),
            ],
        )
    };
    // per_key would have admitted all ten, but only three got through.
    assert_eq!(decision("per_key", "allowed"), 3.0);
    assert_eq!(decision("per_key", "denied_by_other"), 7.0);
    assert_eq!(decision("per_route", "allowed"), 3.0);
    assert_eq!(decision("per_route", "denied"), 7.0);
    assert_eq!(decision("per_route", "denied_by_other"), 0.0);
}

#[tokio::test]
async fn limits_endpoint_explains_a_key_without_charging_it() {
    let upstream = TestUpstream::start().await;
    let log = common::log::capture();
    let gateway = InProcess::start(&stacked(&upstream)).await;
    for _ in 0..2 {
        assert_eq!(
            get(gateway.addr, "/", &[("x-api-key", "secret-key-123")])
                .await
                .status,
            200
        );
    }
    let admin = gateway.admin.unwrap();
    let explain = |path: String| async move { get(admin, &path, &[]).await };
    let reply = explain("/limits/per_key?key=secret-key-123".to_owned()).await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let state = reply.json();
    assert_eq!(state["limit"], "per_key");
    assert_eq!(state["key"], "header:x-api-key");
    assert_eq!(state["quota"], 100);
    assert_eq!(state["remaining"], 98);
    let digest = state["digest"].as_str().unwrap().to_owned();
    assert_eq!(digest.len(), 32);
    assert!(
        !reply.body.windows(6).any(|w| w == b"secret"),
        "the raw key is not echoed"
    );
    // Asking charged nothing; another key is untouched; a route key is the route's name.
    let again = explain("/limits/per_key?key=secret-key-123".to_owned())
        .await
        .json();
    assert_eq!(again["remaining"], 98);
    assert_eq!(again["digest"], digest.as_str());
    let other = explain("/limits/per_key?key=someone-else".to_owned())
        .await
        .json();
    assert_eq!(other["remaining"], 100);
    assert_ne!(other["digest"], digest.as_str());
    let route = explain("/limits/per_route?key=api".to_owned()).await.json();
    assert_eq!(route["remaining"], 1);

    let unknown = explain("/limits/nope?key=x".to_owned()).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.header("content-type"),
        Some("application/problem+json")
    );
    let missing = explain("/limits/per_key".to_owned()).await;
    assert_eq!(missing.status, 400);
    assert!(
        missing.json()["detail"]
            .as_str()
            .unwrap()
            .contains("key=VALUE")
    );
    // The raw key never reaches the logs.
    assert!(!log.text().contains("secret-key-123"), "{}", log.text());
}

#[tokio::test]
async fn the_grafana_dashboard_queries_only_metrics_that_exist() {
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../docs/src/grafana/tollgate.json"))
            .expect("the dashboard is JSON");
    let mut queried = Vec::new();
    let mut exprs = Vec::new();
    fn walk(value: &serde_json::Value, exprs: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    match (key.as_str(), v) {
                        ("expr" | "query", serde_json::Value::String(s)) => exprs.push(s.clone()),
                        _ => walk(v, exprs),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, exprs)),
            _ => {}
        }
    }
    walk(&dashboard, &mut exprs);
    for expr in &exprs {
        let mut rest = expr.as_str();
        while let Some(at) = rest.find("tollgate_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            if !queried.contains(&name) {
                queried.push(name);
            }
        }
    }
    assert!(queried.len() >= 8, "{queried:?}");

    let upstream = TestUpstream::start().await;
    // A route to a dead upstream, so upstream errors have a series.
    let config = stacked(&upstream).replace(
        "[[routes]]",
        "[upstreams.dead]\nurl = \"http://127.0.0.1:1\"\n\n[[routes]]\nname = \"dead\"\nmatch = { path = \"/dead\" }\nupstream = \"dead\"\n\n[[routes]]",
    );
    let gateway = InProcess::start(&config).await;
    for _ in 0..4 {
        get(gateway.addr, "/", &[("x-api-key", "k")]).await;
    }
    assert_eq!(get(gateway.addr, "/dead", &[]).await.status, 502);
    let reply = get(gateway.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    let exposition = parse(&text).unwrap();
    let names: Vec<&str> = exposition.samples().map(|s| s.name.as_str()).collect();
    for name in &queried {
        assert!(
            names.iter().any(|n| n == name),
            "the dashboard queries {name}, which /metrics does not expose:\n{text}"
        );
    }
}
