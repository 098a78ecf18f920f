//! Thread-per-core (`workers = 2`), end to end: connections spread over two
//! worker threads, each accepting on its own socket, must behave as one
//! gateway — every request answered, limits counted once for the process,
//! reloads (listen changes included) applied on every worker, and a SIGTERM
//! drain that waits for the requests of both. The binary: only a process
//! fixes the worker count. Waits poll for what they wait for.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{Gateway, TestUpstream, eventually, get};
use http_body_util::{BodyExt, Full};
use hyper::Request;

/// Enough connections that both workers' sockets get some (the kernel hashes
/// each connection to one; all 16 on one side has odds of 1 in 32768).
const CONNECTIONS: usize = 16;

fn config(upstream: &TestUpstream, listen: &str, version: &str, capacity: u32) -> String {
    format!(
        r#"
[server]
listen = {listen}
admin = "127.0.0.1:0"
workers = 2
shutdown_timeout = "5s"

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

[[routes]]
name = "limited"
match = {{ path_prefix = "/limited" }}
upstream = "api"
limits = ["per_key"]

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#,
        url = upstream.url()
    )
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> Sender {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    sender
}

/// Sends `path` on a keep-alive connection; returns the status (0 = failed).
async fn status_of(sender: &mut Sender, path: &str, key: &str) -> u16 {
    if sender.ready().await.is_err() {
        return 0;
    }
    let request = Request::get(path)
        .header("host", "gateway.test")
        .header("x-api-key", key)
        .body(Full::new(Bytes::new()))
        .expect("request");
    match sender.send_request(request).await {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.into_body().collect().await {
                Ok(_) => status,
                Err(_) => 0,
            }
        }
        Err(_) => 0,
    }
}

/// `per_connection` requests of `path` on each of [`CONNECTIONS`] keep-alive
/// connections at once; returns every status.
async fn hammer(addr: SocketAddr, path: &'static str, per_connection: usize) -> Vec<u16> {
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(tokio::spawn(async move {
            let mut sender = connect(addr).await;
            let mut statuses = Vec::with_capacity(per_connection);
            for _ in 0..per_connection {
                statuses.push(status_of(&mut sender, path, "shared").await);
            }
            statuses
        }));
    }
    let mut all = Vec::new();
    for client in clients {
        all.extend(client.await.expect("client task"));
    }
    all
}

/// The names of the process's threads (Linux: `/proc/PID/task/*/comm`).
fn thread_names(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect()
}

#[tokio::test]
async fn two_workers_answer_every_request_and_share_limits() {
    let upstream = TestUpstream::start().await;
    let gw = Gateway::start(&config(&upstream, "\"127.0.0.1:0\"", "v1", 50));
    if cfg!(target_os = "linux") {
        // Threads name themselves as they start, maybe just after the
        // startup lines.
        let has_workers = |names: &[String]| {
            ["tollgate-wrk-0", "tollgate-wrk-1"]
                .iter()
                .all(|worker| names.iter().any(|n| n == worker))
        };
        eventually(async || has_workers(&thread_names(gw.pid()))).await;
        let names = thread_names(gw.pid());
        assert!(has_workers(&names), "no worker threads: {names:?}");
    }

    // Forwarded requests from 16 connections at once: all answered.
    let statuses = hammer(gw.addr, "/echo", 50).await;
    assert_eq!(statuses.len(), CONNECTIONS * 50);
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(upstream.count(), CONNECTIONS * 50);

    // One key, a capacity of 50, hammered by 16 connections over both
    // workers: exactly 50 pass, because the limiter is one for the process.
    let statuses = hammer(gw.addr, "/limited", 20).await;
    let allowed = statuses.iter().filter(|&&s| s == 200).count();
    let denied = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(allowed, 50, "{statuses:?}");
    assert_eq!(allowed + denied, statuses.len(), "{statuses:?}");

    // Both workers count into the same series: a scrape finds every
    // request of both, exactly.
    let metrics = get(gw.admin.expect("an admin listener"), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    for (series, count) in [
        (r#"tollgate_requests_total{route="api",status="200"}"#, 800),
        (
            r#"tollgate_requests_total{route="limited",status="200"}"#,
            50,
        ),
        (
            r#"tollgate_requests_total{route="limited",status="429"}"#,
            denied,
        ),
        (
            r#"tollgate_ratelimit_decisions_total{route="limited",limit="per_key",outcome="allowed",front="proxy"}"#,
            50,
        ),
        (
            r#"tollgate_ratelimit_decisions_total{route="limited",limit="per_key",outcome="denied",front="proxy"}"#,
            denied,
        ),
        (
            r#"tollgate_request_duration_seconds_count{route="limited"}"#,
            320,
        ),
        (
            r#"tollgate_request_duration_seconds_bucket{le="+Inf",route="limited"}"#,
            320,
        ),
    ] {
        let line = format!("{series} {count}");
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
}

#[tokio::test]
async fn sighup_reloads_and_moves_listeners_on_every_worker() {
    let upstream = TestUpstream::start().await;
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
    };
    let (first, second) = (free_port(), free_port());
    let gw = Gateway::start(&config(&upstream, &format!("\"{first}\""), "v1", 5));
    // A key spends 3 of its 5 tokens before the reload.
    for _ in 0..3 {
        assert_eq!(
            get(first, "/limited", &[("x-api-key", "k")]).await.status,
            200
        );
    }
    // Reload: a new version and a second address.
    let both = format!("[\"{first}\", \"{second}\"]");
    std::fs::write(&gw.config_path, config(&upstream, &both, "v2", 5)).expect("write");
    gw.signal("HUP");
    let applied = eventually(async || {
        tokio::net::TcpStream::connect(second).await.is_ok()
            && get(second, "/version", &[]).await.body == "v2"
    })
    .await;
    assert!(applied, "reload not applied:\n{}", gw.stderr());
    // Every new connection, whichever worker takes it, sees the new
    // configuration on both addresses, and the key kept its state.
    for _ in 0..CONNECTIONS {
        assert_eq!(get(first, "/version", &[]).await.body, "v2");
        assert_eq!(get(second, "/version", &[]).await.body, "v2");
    }
    let statuses = hammer(second, "/limited", 2).await;
    // `hammer` uses key "shared": a fresh key, 5 tokens.
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 5);
    assert_eq!(
        get(second, "/limited", &[("x-api-key", "k")]).await.status,
        200
    );
    assert_eq!(
        get(first, "/limited", &[("x-api-key", "k")]).await.status,
        200
    );
    assert_eq!(
        get(first, "/limited", &[("x-api-key", "k")]).await.status,
        429
    );

    // Drop the first address: closed on both workers, so every connection
    // attempt is refused (one worker's socket left open would take about
    // half of them).
    std::fs::write(
        &gw.config_path,
        config(&upstream, &format!("\"{second}\""), "v3", 5),
    )
    .expect("write");
    gw.signal("HUP");
    let applied = eventually(async || get(second, "/version", &[]).await.body == "v3").await;
    assert!(applied, "{}", gw.stderr());
    let mut open = 0;
    let closed = eventually(async || {
        open = 0;
        for _ in 0..CONNECTIONS {
            if tokio::net::TcpStream::connect(first).await.is_ok() {
                open += 1;
            }
        }
        open == 0
    })
    .await;
    assert!(
        closed,
        "{open} of {CONNECTIONS} connections to the removed address accepted"
    );
    assert_eq!(get(second, "/echo", &[]).await.status, 200);
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_on_both_workers() {
    let upstream = TestUpstream::start().await;
    let mut gw = Gateway::start(&config(&upstream, "\"127.0.0.1:0\"", "v1", 5));
    let addr = gw.addr;
    // Slow requests on many connections: some on each worker.
    let done = Arc::new(AtomicUsize::new(0));
    let mut in_flight = Vec::new();
    for _ in 0..CONNECTIONS {
        let done = done.clone();
        in_flight.push(tokio::spawn(async move {
            let reply = get(addr, "/slow/1000", &[]).await;
            done.fetch_add(1, Ordering::Relaxed);
            reply
        }));
    }
    // Let them all reach the upstream (which answers after 1 s).
    assert!(
        eventually(async || upstream.arrived() == CONNECTIONS).await,
        "{} of {CONNECTIONS} requests reached the upstream",
        upstream.arrived()
    );
    gw.signal("TERM");
    // Every worker closed its socket: new connections are refused.
    let refused = eventually(async || {
        for _ in 0..CONNECTIONS {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return false;
            }
        }
        true
    })
    .await;
    assert!(refused, "a listener is still open");
    assert_eq!(done.load(Ordering::Relaxed), 0, "drained before the answer");
    for request in in_flight {
        let reply = request.await.expect("client task");
        assert_eq!(reply.status, 200, "an in-flight request was not drained");
        assert_eq!(reply.header("connection"), Some("close"));
        assert_eq!(reply.body, "echo");
    }
    let status = tokio::task::spawn_blocking(move || gw.wait_exit(Duration::from_secs(10)))
        .await
        .expect("wait task")
        .expect("gateway exited");
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn a_second_gateway_on_the_same_port_is_refused() {
    let upstream = TestUpstream::start().await;
    let gw = Gateway::start(&config(&upstream, "\"127.0.0.1:0\"", "v1", 5));
    // Same address, also with `workers = 2` (SO_REUSEPORT sockets): it must
    // not join the first one's sockets and take half of its traffic.
    let text = config(&upstream, &format!("\"{}\"", gw.addr), "v1", 5);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).expect("write");
    let mut second = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("run")
        .arg("-c")
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let status = common::wait_exit(&mut second, Duration::from_secs(10));
    if status.is_none() {
        let _ = second.kill();
        let _ = second.wait();
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = second.stderr.take() {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    let status = status.unwrap_or_else(|| panic!("the second gateway kept running:\n{stderr}"));
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {}", gw.addr)),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(get(gw.addr, "/version", &[]).await.body, "v1");
}
