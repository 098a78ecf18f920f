//! Hot reload, end to end: state kept, new values in effect, invalid files
//! ignored, in-flight requests finish on their old route, and listeners
//! follow `listen`, with the gateway in process and reloaded by the
//! function SIGHUP calls (also on a kept-alive connection, whose worker
//! had its own handle on the old configuration); with the real process and real signals, a
//! keep-alive load sees no failure while SIGHUP swaps the configuration ten
//! times, and a SIGHUP right after startup reloads.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{Gateway, InProcess, TestUpstream, eventually, get};
use http_body_util::{BodyExt, Full};
use hyper::Request;

/// A config whose `/version` answers `version`, with `extra` appended.
fn config(
    upstream: &TestUpstream,
    listen: &str,
    version: &str,
    capacity: u32,
    extra: &str,
) -> String {
    format!(
        r#"
[server]
listen = {listen}

[upstreams.api]
url = "{url}"

[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = {capacity}
refill = "1/h"

[[routes]]
name = "version"
match = {{ path = "/version" }}
respond = {{ status = 200, body = "{version}" }}

{extra}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["per_key"]
"#,
        url = upstream.url()
    )
}

/// Rewrites the config, reloads it and checks that `/version` says `version`.
async fn reload_to(gw: &InProcess, text: &str, version: &str) {
    let log = common::log::capture();
    gw.reload_with(text);
    let answered = get(gw.addr, "/version", &[]).await.body;
    assert_eq!(
        answered,
        version.as_bytes(),
        "reload to {version} did not take effect:\n{}",
        log.text()
    );
}

#[tokio::test]
async fn limiter_state_survives_an_unrelated_change_and_new_numbers_apply() {
    let upstream = TestUpstream::start().await;
    let gw = InProcess::start(&config(&upstream, "\"127.0.0.1:0\"", "v1", 3, "")).await;
    let key = [("x-api-key", "k")];
    for _ in 0..2 {
        assert_eq!(get(gw.addr, "/x", &key).await.status, 200);
    }
    // An unrelated change: a new route. The client keeps its 1 token left.
    let unrelated =
        "[[routes]]\nname = \"new\"\nmatch = { path = \"/new\" }\nrespond = { status = 204 }\n";
    reload_to(
        &gw,
        &config(&upstream, "\"127.0.0.1:0\"", "v2", 3, unrelated),
        "v2",
    )
    .await;
    assert_eq!(get(gw.addr, "/new", &[]).await.status, 204);
    let reply = get(gw.addr, "/x", &key).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(get(gw.addr, "/x", &key).await.status, 429);
    // A raised capacity: the used tokens are kept, the headroom is added.
    reload_to(
        &gw,
        &config(&upstream, "\"127.0.0.1:0\"", "v3", 5, ""),
        "v3",
    )
    .await;
    let reply = get(gw.addr, "/x", &key).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"per_key\";q=5;w=18000")
    );
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("1"));
}

#[tokio::test]
async fn an_invalid_file_keeps_the_running_configuration() {
    let upstream = TestUpstream::start().await;
    let gw = InProcess::start(&config(&upstream, "\"127.0.0.1:0\"", "v1", 3, "")).await;
    let capture = common::log::capture();
    gw.reload_with("[server]\nlisten = 12\n");
    let log = capture.text();
    assert!(log.contains("reload failed"), "{log}");
    assert!(
        log.contains("gateway.toml:2:"),
        "the error names the line: {log}"
    );
    assert_eq!(get(gw.addr, "/version", &[]).await.body, "v1");
    assert_eq!(get(gw.addr, "/x", &[]).await.status, 200);
}

// Paused time: the upstream holds the request for a second of it.
#[tokio::test(start_paused = true)]
async fn a_request_in_flight_finishes_on_its_old_route() {
    let upstream = TestUpstream::start().await;
    let gw = InProcess::start(&config(&upstream, "\"127.0.0.1:0\"", "v1", 3, "")).await;
    let addr = gw.addr;
    let in_flight = tokio::spawn(async move { get(addr, "/slow/1000", &[]).await });
    assert!(
        eventually(async || upstream.arrived() == 1).await,
        "the request never reached the upstream"
    );
    // The new configuration answers /slow itself.
    let takeover = "[[routes]]\nname = \"slow\"\nmatch = { path_prefix = \"/slow\" }\nrespond = { status = 200, body = \"new\" }\n";
    reload_to(
        &gw,
        &config(&upstream, "\"127.0.0.1:0\"", "v2", 3, takeover),
        "v2",
    )
    .await;
    assert_eq!(get(gw.addr, "/slow/1000", &[]).await.body, "new");
    let old = in_flight.await.unwrap();
    assert_eq!(old.status, 200);
    assert_eq!(old.body, "echo", "the in-flight request changed route");
}

/// One keep-alive connection's `GET path`: status and body.
async fn ask(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
) -> (u16, Bytes) {
    let request = Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

// A worker keeps its own handle on the snapshot between requests
// (`app::handle`): the reload must reach the next request of a
// connection that worker served before, while a request it is serving
// keeps the old routes. Paused time: the upstream holds that request.
#[tokio::test(start_paused = true)]
async fn a_kept_alive_connection_sees_a_reload_on_its_next_request() {
    let upstream = TestUpstream::start().await;
    let gw = InProcess::start(&config(&upstream, "\"127.0.0.1:0\"", "v1", 3, "")).await;
    let stream = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    assert_eq!(ask(&mut sender, "/version").await, (200, Bytes::from("v1")));
    let addr = gw.addr;
    let in_flight = tokio::spawn(async move { get(addr, "/slow/1000", &[]).await });
    assert!(
        eventually(async || upstream.arrived() == 1).await,
        "the request never reached the upstream"
    );
    let takeover = "[[routes]]\nname = \"slow\"\nmatch = { path_prefix = \"/slow\" }\nrespond = { status = 200, body = \"new\" }\n";
    gw.reload_with(&config(&upstream, "\"127.0.0.1:0\"", "v2", 3, takeover));
    assert_eq!(ask(&mut sender, "/version").await, (200, Bytes::from("v2")));
    assert_eq!(ask(&mut sender, "/slow/1").await, (200, Bytes::from("new")));
    let old = in_flight.await.unwrap();
    assert_eq!(old.status, 200);
    assert_eq!(old.body, "echo", "the in-flight request changed route");
}

#[tokio::test]
async fn listeners_follow_the_listen_list() {
    let upstream = TestUpstream::start().await;
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (first, second) = (free_port(), free_port());
    let gw = InProcess::start(&config(&upstream, &format!("\"{first}\""), "v1", 3, "")).await;
    assert_eq!(gw.addr, first);
    let both = format!("[\"{first}\", \"{second}\"]");
    reload_to(&gw, &config(&upstream, &both, "v2", 3, ""), "v2").await;
    // The new listener is bound right after the swap, by the server task.
    assert!(
        eventually(async || tokio::net::TcpStream::connect(second).await.is_ok()).await,
        "the new address was never bound"
    );
    assert_eq!(get(second, "/version", &[]).await.body, "v2");
    // Drop the first address: served on the second, refused on the first.
    gw.reload_with(&config(&upstream, &format!("\"{second}\""), "v3", 3, ""));
    eventually(async || get(second, "/version", &[]).await.body == "v3").await;
    assert!(
        eventually(async || tokio::net::TcpStream::connect(first).await.is_err()).await,
        "old listener still open"
    );
}

#[tokio::test]
async fn ten_reloads_under_keep_alive_load_fail_no_request() {
    let upstream = TestUpstream::start().await;
    let gw = Gateway::start(&config(&upstream, "\"127.0.0.1:0\"", "v0", 1_000_000, ""));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut clients = Vec::new();
    for client in 0..4 {
        let (stop, ok, failed, addr) = (stop.clone(), ok.clone(), failed.clone(), gw.addr);
        clients.push(tokio::spawn(async move {
            // One keep-alive connection per client for the whole run.
            let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .unwrap();
            tokio::spawn(connection);
            while !stop.load(Ordering::Relaxed) {
                let path = if client % 2 == 0 { "/x" } else { "/version" };
                let request = Request::get(path)
                    .header("host", "x")
                    .header("x-api-key", format!("k{client}"))
                    .body(Full::new(Bytes::new()))
                    .unwrap();
                let outcome = match sender.send_request(request).await {
                    Ok(response) if response.status() == 200 => {
                        response.into_body().collect().await.is_ok()
                    }
                    _ => false,
                };
                if outcome { &ok } else { &failed }.fetch_add(1, Ordering::Relaxed);
                if !outcome {
                    return;
                }
            }
        }));
    }
    // Load between the reloads: `more` requests answered each time.
    let served = async |more: usize| {
        let target = ok.load(Ordering::Relaxed) + more;
        eventually(async || {
            ok.load(Ordering::Relaxed) >= target || failed.load(Ordering::Relaxed) > 0
        })
        .await;
    };
    for i in 1..=10 {
        served(11).await;
        let text = config(
            &upstream,
            "\"127.0.0.1:0\"",
            &format!("v{i}"),
            1_000_000 + i,
            "",
        );
        std::fs::write(&gw.config_path, text).unwrap();
        gw.signal("HUP");
        // Applied before the next (a reload takes milliseconds).
        let version = format!("v{i}");
        assert!(
            eventually(async || get(gw.addr, "/version", &[]).await.body == version.as_bytes())
                .await,
            "SIGHUP {i} did not install {version}"
        );
    }
    served(11).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert_eq!(failed, 0, "{failed} requests failed ({ok} ok)");
    assert!(ok > 100, "too little load to mean anything: {ok}");
    let reloads = |log: &str| log.matches("configuration reloaded").count();
    let log = gw.stderr_when(|log| reloads(log) >= 10, Duration::from_secs(10));
    assert_eq!(reloads(&log), 10, "one reload logged per SIGHUP: {log}");
    assert_eq!(get(gw.addr, "/version", &[]).await.body, "v10");
}

/// Regression: signal handlers used to be installed after the `listening on`
/// line, so a SIGHUP sent as soon as it appeared killed the process.
#[tokio::test]
async fn a_sighup_right_after_startup_reloads_instead_of_killing() {
    let upstream = TestUpstream::start().await;
    let gw = Gateway::start(&config(&upstream, "\"127.0.0.1:0\"", "v1", 3, ""));
    gw.signal("HUP");
    // Reloaded (logged), not killed (the request below answers) and not
    // ignored (the log says so).
    let log = gw.stderr_when(
        |log| log.contains("configuration reloaded"),
        Duration::from_secs(10),
    );
    assert!(
        log.contains("configuration reloaded"),
        "no reload after SIGHUP: {log}"
    );
    assert_eq!(get(gw.addr, "/version", &[]).await.body, "v1");
}
