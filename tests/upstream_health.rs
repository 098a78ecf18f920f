//! Upstream health end to end, in process on paused time, against real
//! sockets: a URL that refuses connections is skipped at once and ejected,
//! one that answers 503 or hangs is ejected after its failures and comes
//! back when its time is up (a flapping one for longer each time), never
//! more than `max_ejected` of a list is out, a list with nothing up is a
//! 503 and `/readyz` says which upstream, active checks take URLs down
//! and back (over HTTPS and HTTP/2 as the upstream is spoken to), a reload
//! keeps the state of the URLs it keeps, `least_request` and `slow_start`
//! spread the load as they should, and a failing URL does not write a log
//! line per failed request.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use common::openmetrics::{Exposition, parse};
use common::{InProcess, Reply, get, send};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// What a [`Backend`] does with the requests it gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    /// 200 to everything.
    Ok = 0,
    /// 503 to everything.
    Unavailable = 1,
    /// Never answers.
    Hang = 2,
    /// Requests 200, its health check (`/healthz`) 500.
    SickCheck = 3,
}

/// How a [`Backend`] is spoken to.
#[derive(Clone)]
enum Speaks {
    Http1,
    /// HTTP/2 with prior knowledge only: an HTTP/1.1 request fails.
    H2c,
    /// HTTP/1.1 over TLS with this server configuration.
    Tls(tokio_rustls::TlsAcceptor),
}

/// A test upstream instance that can be told to fail, hang, stop (then
/// connections to it are refused: its listener and every connection are
/// gone) and start again on the same port.
struct Backend {
    addr: SocketAddr,
    speaks: Speaks,
    mode: Arc<AtomicU8>,
    /// Requests other than health checks.
    requests: Arc<AtomicUsize>,
    checks: Arc<AtomicUsize>,
    serving: Mutex<Option<tokio::task::JoinHandle<()>>>,
    connections: Arc<Mutex<JoinSet<()>>>,
}

impl Backend {
    async fn start(speaks: Speaks) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let backend = Backend {
            addr: listener.local_addr().unwrap(),
            speaks,
            mode: Arc::new(AtomicU8::new(Mode::Ok as u8)),
            requests: Arc::new(AtomicUsize::new(0)),
            checks: Arc::new(AtomicUsize::new(0)),
            serving: Mutex::new(None),
            connections: Arc::new(Mutex::new(JoinSet::new())),
        };
        backend.serve(listener);
        backend
    }

    async fn http1() -> Backend {
        Backend::start(Speaks::Http1).await
    }

    /// A backend that refuses connections until [`Backend::resume`]d.
    async fn stopped() -> Backend {
        let backend = Backend::http1().await;
        backend.stop();
        backend
    }

    fn url(&self) -> String {
        match self.speaks {
            Speaks::Tls(_) => format!("https://{}", self.addr),
            _ => format!("http://{}", self.addr),
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }

    /// The instance goes away: its listener closes and its connections
    /// are cut; connecting to it is refused from now on.
    fn stop(&self) {
        if let Some(task) = self.serving.lock().unwrap().take() {
            task.abort();
        }
        self.connections.lock().unwrap().abort_all();
    }

    /// The instance is back, on the same port.
    async fn resume(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }

    fn serve(&self, listener: TcpListener) {
        let (speaks, mode, requests, checks, connections) = (
            self.speaks.clone(),
            self.mode.clone(),
            self.requests.clone(),
            self.checks.clone(),
            self.connections.clone(),
        );
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                // Without it a response written behind unacknowledged bytes
                // (TLS 1.3's session tickets) waits for a delayed ACK, real
                // time that paused time skips as idle: a spurious timeout.
                let _ = stream.set_nodelay(true);
                let (speaks, mode, requests, checks) = (
                    speaks.clone(),
                    mode.clone(),
                    requests.clone(),
                    checks.clone(),
                );
                connections.lock().unwrap().spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let (mode, requests, checks) =
                            (mode.clone(), requests.clone(), checks.clone());
                        async move {
                            Ok::<_, hyper::Error>(answer(request, &mode, &requests, &checks).await)
                        }
                    });
                    match speaks {
                        Speaks::Http1 => {
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        Speaks::H2c => {
                            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        Speaks::Tls(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        *self.serving.lock().unwrap() = Some(task);
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn answer(
    request: Request<Incoming>,
    mode: &AtomicU8,
    requests: &AtomicUsize,
    checks: &AtomicUsize,
) -> Response<Full<Bytes>> {
    let check = request.uri().path() == "/healthz";
    if check {
        checks.fetch_add(1, Ordering::SeqCst);
    } else {
        requests.fetch_add(1, Ordering::SeqCst);
    }
    let status = match mode.load(Ordering::SeqCst) {
        m if m == Mode::Hang as u8 => std::future::pending().await,
        m if m == Mode::Unavailable as u8 => 503,
        m if m == Mode::SickCheck as u8 && check => 500,
        _ => 200,
    };
    let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
    *response.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    response
}

/// A gateway config: upstream `api` with `urls` and `upstream` lines, one
/// catch-all route to it with `route` lines.
fn config(urls: &[String], upstream: &str, route: &str) -> String {
    let urls: Vec<String> = urls.iter().map(|u| format!("\"{u}\"")).collect();
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1

[upstreams.api]
url = [{urls}]
connect_timeout = "1s"
{upstream}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
{route}
"#,
        urls = urls.join(", ")
    )
}

async fn metrics(gw: &InProcess) -> Exposition {
    let reply = get(gw.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&reply.body).into_owned();
    parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// `tollgate_upstream_healthy` of `url` (of upstream `api`).
async fn healthy(gw: &InProcess, url: &str) -> Option<f64> {
    metrics(gw).await.value(
        "tollgate_upstream_healthy",
        &[("upstream", "api"), ("url", url)],
    )
}

async fn ejections(gw: &InProcess, url: &str, reason: &str) -> f64 {
    metrics(gw).await.count(
        "tollgate_upstream_ejections_total",
        &[("upstream", "api"), ("url", url), ("reason", reason)],
    )
}

async fn checks(gw: &InProcess, url: &str, result: &str) -> f64 {
    metrics(gw).await.count(
        "tollgate_upstream_health_checks_total",
        &[("upstream", "api"), ("url", url), ("result", result)],
    )
}

async fn post(addr: SocketAddr, path: &str) -> Reply {
    let request = Request::post(path)
        .header("host", "gateway.test")
        .body(Full::new(Bytes::from_static(b"{\"order\":1}")))
        .unwrap();
    send(addr, request).await
}

/// `n` GETs of `/x` in turn; their statuses.
async fn gets(gw: &InProcess, n: usize) -> Vec<u16> {
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        statuses.push(get(gw.addr, "/x", &[]).await.status);
    }
    statuses
}

fn all_ok(statuses: &[u16]) -> bool {
    statuses.iter().all(|&s| s == 200)
}

/// Lets `seconds` of paused time pass, with no real wait: tokio's clock
/// (and the limiter's, and every timer's) moves that far, each timer due
/// firing in its turn (a paused `tokio::time::sleep`, not `advance`).
async fn elapse(seconds: f64) {
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_goes_to_the_next_url_at_once_and_the_url_is_ejected_until_its_time_is_up()
 {
    let (a, b, dead) = (
        Backend::http1().await,
        Backend::http1().await,
        Backend::stopped().await,
    );
    let gw = InProcess::start(&config(&[a.url(), b.url(), dead.url()], "", "")).await;
    // No `retry` on the route, and POSTs too: a connection that could not
    // be opened sent nothing, so any request goes to the next URL.
    for i in 0..30 {
        let reply = if i % 2 == 0 {
            get(gw.addr, "/x", &[]).await
        } else {
            post(gw.addr, "/order").await
        };
        assert_eq!(reply.status, 200, "request {i}: {:?}", reply.body);
    }
    assert_eq!(a.requests() + b.requests(), 30);
    // Three refusals in a row (`after = 3`, the default) ejected it once.
    assert_eq!(ejections(&gw, &dead.url(), "connect").await, 1.0);
    assert_eq!(healthy(&gw, &dead.url()).await, Some(0.0));
    assert_eq!(healthy(&gw, &a.url()).await, Some(1.0));
    let retries: f64 = metrics(&gw)
        .await
        .samples()
        .filter(|s| s.name == "tollgate_upstream_retries_total")
        .map(|s| s.value)
        .sum();
    assert_eq!(retries, 0.0, "trying the next URL is not a retry");

    // The instance comes back; its ejection (`base`, 10 s) is not over yet.
    dead.resume().await;
    elapse(9.0).await;
    assert!(all_ok(&gets(&gw, 12).await));
    assert_eq!(dead.requests(), 0, "still ejected");
    elapse(1.0).await;
    assert!(all_ok(&gets(&gw, 12).await));
    assert_eq!(dead.requests(), 4, "its turns again, once its time was up");
    assert_eq!(healthy(&gw, &dead.url()).await, Some(1.0));
}

#[tokio::test(start_paused = true)]
async fn a_url_answering_503_is_ejected_and_a_flapping_one_for_longer_each_time() {
    let (a, b) = (Backend::http1().await, Backend::http1().await);
    b.set(Mode::Unavailable);
    let retry = r#"retry = { attempts = 1, on = ["503"], base = "1ms", cap = "1ms" }"#;
    let gw = InProcess::start(&config(&[a.url(), b.url()], "", retry)).await;
    // Each 503 is retried on the other URL: the clients see none.
    assert!(all_ok(&gets(&gw, 20).await));
    assert_eq!(b.requests(), 3, "three 503s in a row, then ejected");
    assert_eq!(ejections(&gw, &b.url(), "503").await, 1.0);

    // It recovers; it is tried again after `base` (10 s), not before.
    b.set(Mode::Ok);
    elapse(9.0).await;
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!(b.requests(), 3);
    elapse(1.0).await;
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!(b.requests(), 8);

    // It fails again at once: its second ejection lasts twice as long.
    b.set(Mode::Unavailable);
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!(b.requests(), 11);
    assert_eq!(ejections(&gw, &b.url(), "503").await, 2.0);
    b.set(Mode::Ok);
    elapse(19.0).await;
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!(b.requests(), 11, "20 s this time");
    elapse(1.0).await;
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!(b.requests(), 16);
}

#[tokio::test(start_paused = true)]
async fn a_retry_goes_to_another_url_than_the_one_that_failed() {
    let (a, b) = (Backend::http1().await, Backend::http1().await);
    b.set(Mode::Unavailable);
    // Never ejected, and drawn at random: only the rule keeps a retry
    // from going back to the URL that answered 503.
    let upstream = "balance = \"least_request\"\neject = { max_ejected = \"0%\" }";
    let retry =
        r#"retry = { attempts = 1, on = ["503"], base = "1ms", cap = "1ms", budget = "100%" }"#;
    let gw = InProcess::start(&config(&[a.url(), b.url()], upstream, retry)).await;
    let statuses = gets(&gw, 40).await;
    assert!(all_ok(&statuses), "{statuses:?}");
    assert!(b.requests() > 5, "b was drawn: {}", b.requests());
    assert_eq!(a.requests(), 40);
}

#[tokio::test(start_paused = true)]
async fn a_hanging_url_is_ejected_after_its_timeouts() {
    let (a, hung) = (Backend::http1().await, Backend::http1().await);
    hung.set(Mode::Hang);
    let gw = InProcess::start(&config(&[a.url(), hung.url()], "timeout = \"1s\"", "")).await;
    let statuses = gets(&gw, 12).await;
    let timeouts = statuses.iter().filter(|&&s| s == 504).count();
    assert_eq!(timeouts, 3, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 9);
    assert_eq!(ejections(&gw, &hung.url(), "timeout").await, 1.0);
    assert_eq!(healthy(&gw, &hung.url()).await, Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn never_more_than_max_ejected_of_a_list_is_out() {
    let (a, dead1, dead2) = (
        Backend::http1().await,
        Backend::stopped().await,
        Backend::stopped().await,
    );
    let gw = InProcess::start(&config(&[a.url(), dead1.url(), dead2.url()], "", "")).await;
    assert!(
        all_ok(&gets(&gw, 30).await),
        "every refusal went to the next URL"
    );
    assert_eq!(a.requests(), 30);
    // 50 % of three URLs is one: the other dead URL stays in the list.
    let m = metrics(&gw).await;
    let ejected: f64 = [&dead1, &dead2]
        .iter()
        .map(|d| {
            m.count(
                "tollgate_upstream_ejections_total",
                &[
                    ("upstream", "api"),
                    ("url", &d.url()),
                    ("reason", "connect"),
                ],
            )
        })
        .sum();
    assert_eq!(ejected, 1.0);
    let up: f64 = [&a, &dead1, &dead2]
        .iter()
        .map(|b| {
            m.value(
                "tollgate_upstream_healthy",
                &[("upstream", "api"), ("url", &b.url())],
            )
            .unwrap()
        })
        .sum();
    assert_eq!(up, 2.0);
}

#[tokio::test(start_paused = true)]
async fn with_every_url_ejected_requests_get_503_and_readyz_names_the_upstream() {
    let (one, two) = (Backend::stopped().await, Backend::stopped().await);
    let eject = r#"eject = { after = 1, max_ejected = "100%" }"#;
    let gw = InProcess::start(&config(&[one.url(), two.url()], eject, "")).await;
    let admin = gw.admin.unwrap();
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);
    // Both refuse: the first request tries both, gets 502, ejects both.
    assert_eq!(get(gw.addr, "/x", &[]).await.status, 502);
    let reply = get(gw.addr, "/x", &[]).await;
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let problem = reply.json();
    assert_eq!(problem["title"], "No Healthy Upstream Instance");
    assert_eq!(problem["detail"], "upstream api has no healthy instance");
    let ready = get(admin, "/readyz", &[]).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.json()["upstreams"], serde_json::json!(["api"]));
    assert_eq!(
        metrics(&gw).await.count(
            "tollgate_upstream_errors_total",
            &[("upstream", "api"), ("kind", "unavailable")]
        ),
        1.0
    );
    // One comes back; once the ejections are over the gateway is ready.
    one.resume().await;
    elapse(10.0).await;
    assert_eq!(get(admin, "/readyz", &[]).await.status, 200);
    assert!(all_ok(&gets(&gw, 4).await));
    assert_eq!(
        one.requests(),
        4,
        "the other still refuses: each went to one"
    );
}

#[tokio::test(start_paused = true)]
async fn health_checks_take_a_url_down_and_bring_it_back() {
    let (a, b) = (Backend::http1().await, Backend::http1().await);
    b.set(Mode::SickCheck);
    let health = r#"health = { path = "/healthz", interval = "1s", timeout = "500ms", healthy = 2, unhealthy = 2 }"#;
    let gw = InProcess::start(&config(&[a.url(), b.url()], health, "")).await;
    // Checks at 0 s and 1 s fail: down.
    elapse(1.5).await;
    assert_eq!(checks(&gw, &b.url(), "fail_status").await, 2.0);
    assert_eq!(checks(&gw, &a.url(), "pass").await, 2.0);
    assert_eq!(healthy(&gw, &b.url()).await, Some(0.0));
    assert_eq!(ejections(&gw, &b.url(), "health_check").await, 1.0);
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!((a.requests(), b.requests()), (10, 0));
    // Its checks pass again (at 2 s and 3 s): up.
    b.set(Mode::Ok);
    elapse(2.0).await;
    assert_eq!(healthy(&gw, &b.url()).await, Some(1.0));
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!(b.requests(), 5);
    // A check that gets no answer within its timeout fails too.
    b.set(Mode::Hang);
    elapse(2.0).await;
    assert_eq!(checks(&gw, &b.url(), "fail_timeout").await, 2.0);
    assert_eq!(healthy(&gw, &b.url()).await, Some(0.0));
    assert!(b.checks() >= 6);
}

/// A TLS acceptor for `upstream.test` and the CA that signed it, written to
/// `dir/ca.pem`.
fn tls_backend_acceptor(dir: &std::path::Path) -> tokio_rustls::TlsAcceptor {
    let ca = common::certs::Ca::new();
    let leaf = ca.leaf(&["upstream.test"]);
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der.clone()], key)
    .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

#[tokio::test(start_paused = true)]
async fn https_and_http2_upstreams_are_checked_as_they_are_spoken_to() {
    let dir = tempfile::tempdir().unwrap();
    let tls = Backend::start(Speaks::Tls(tls_backend_acceptor(dir.path()))).await;
    let h2c = Backend::start(Speaks::H2c).await;
    // Both start down: only a passed check brings them up, and a check
    // spoken otherwise (plaintext to the TLS one, HTTP/1.1 to the h2c
    // one) would fail.
    let health = r#"health = { path = "/healthz", interval = "1s", timeout = "500ms", healthy = 1, start = "unhealthy" }"#;
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1

[upstreams.api]
url = "{tls}"
ca = "{ca}"
sni = "upstream.test"
{health}

[upstreams.h2]
url = "{h2c}"
http2 = true
{health}

[[routes]]
name = "h2"
match = {{ path_prefix = "/h2" }}
upstream = "h2"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#,
        tls = tls.url(),
        h2c = h2c.url(),
        ca = dir.path().join("ca.pem").display(),
    );
    let gw = InProcess::start(&text).await;
    elapse(0.5).await;
    let text =
        String::from_utf8_lossy(&get(gw.admin.unwrap(), "/metrics", &[]).await.body).into_owned();
    assert_eq!(checks(&gw, &tls.url(), "pass").await, 1.0, "{text}");
    let m = metrics(&gw).await;
    assert_eq!(
        m.count(
            "tollgate_upstream_health_checks_total",
            &[("upstream", "h2"), ("url", &h2c.url()), ("result", "pass")]
        ),
        1.0
    );
    assert_eq!(get(gw.addr, "/x", &[]).await.status, 200);
    assert_eq!(get(gw.addr, "/h2/x", &[]).await.status, 200);
    assert_eq!((tls.requests(), h2c.requests()), (1, 1));
    assert_eq!((tls.checks(), h2c.checks()), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_url_that_starts_unhealthy_gets_no_requests_until_its_checks_pass() {
    let (a, b) = (Backend::http1().await, Backend::http1().await);
    b.set(Mode::SickCheck);
    let health = r#"health = { path = "/healthz", interval = "1s", timeout = "500ms", healthy = 2, start = "unhealthy" }"#;
    let gw = InProcess::start(&config(&[a.url(), b.url()], health, "")).await;
    assert_eq!(healthy(&gw, &b.url()).await, Some(0.0));
    elapse(3.5).await;
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!(b.requests(), 0, "its checks fail: never up");
    b.set(Mode::Ok);
    elapse(2.0).await;
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!(b.requests(), 5);
}

#[tokio::test(start_paused = true)]
async fn a_reload_keeps_the_state_of_the_urls_it_keeps() {
    let (a, dead, c, d) = (
        Backend::http1().await,
        Backend::stopped().await,
        Backend::http1().await,
        Backend::http1().await,
    );
    let gw = InProcess::start(&config(&[a.url(), dead.url()], "", "")).await;
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!(healthy(&gw, &dead.url()).await, Some(0.0));
    // It is back (but still ejected) when a reload adds C and drops A.
    dead.resume().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, config(&[dead.url(), c.url()], "", "")).unwrap();
    tollgate::reload::reload(&gw.app, &path);
    assert_eq!(
        gw.app.snapshot().generation,
        2,
        "{:?}",
        gw.app.last_reload_error()
    );
    assert!(all_ok(&gets(&gw, 10).await));
    assert_eq!((dead.requests(), c.requests()), (0, 10), "still ejected");
    assert_eq!(healthy(&gw, &a.url()).await, None, "A's series is gone");
    assert_eq!(healthy(&gw, &c.url()).await, Some(1.0));
    // A URL added by a reload starts as configured (down, with
    // `start = "unhealthy"`); the URLs kept keep their state.
    let health =
        r#"health = { path = "/healthz", interval = "1m", timeout = "1s", start = "unhealthy" }"#;
    std::fs::write(&path, config(&[dead.url(), c.url(), d.url()], health, "")).unwrap();
    tollgate::reload::reload(&gw.app, &path);
    assert_eq!(gw.app.snapshot().generation, 3);
    assert_eq!(healthy(&gw, &d.url()).await, Some(0.0));
    assert_eq!(healthy(&gw, &c.url()).await, Some(1.0));
    assert_eq!(healthy(&gw, &dead.url()).await, Some(0.0));
    // Its ejection ends on time whatever the reloads.
    elapse(10.0).await;
    // Its turns, and D's (down: the turn passes to the next URL).
    assert!(all_ok(&gets(&gw, 9).await));
    assert_eq!((dead.requests(), c.requests()), (6, 13));
    // D passed its first check at once, its second a minute later: up.
    assert_eq!(healthy(&gw, &d.url()).await, Some(0.0));
    elapse(51.0).await;
    assert_eq!(
        healthy(&gw, &d.url()).await,
        Some(1.0),
        "{} checks",
        d.checks()
    );
}

#[tokio::test(start_paused = true)]
async fn least_request_sends_less_to_a_slow_url() {
    let fast = Backend::http1().await;
    // The test upstream answers `/slow/MS/...` after a while (100 ms).
    let slow = common::TestUpstream::start().await;
    let gw = InProcess::start(&config(
        &[fast.url(), format!("{}/slow/100", slow.url())],
        "balance = \"least_request\"\ntimeout = \"10s\"",
        "",
    ))
    .await;
    let addr = gw.addr;
    let clients: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async move {
                for _ in 0..25 {
                    assert_eq!(get(addr, "/x", &[]).await.status, 200);
                }
            })
        })
        .collect();
    for client in clients {
        client.await.unwrap();
    }
    let (to_fast, to_slow) = (fast.requests(), slow.count());
    assert_eq!(to_fast + to_slow, 200);
    // Round robin would split them evenly.
    assert!(to_slow * 3 < to_fast, "fast {to_fast}, slow {to_slow}");
}

#[tokio::test(start_paused = true)]
async fn a_url_back_from_an_ejection_ramps_up_over_slow_start() {
    let (a, b) = (Backend::http1().await, Backend::stopped().await);
    let upstream = "slow_start = \"1m\"\neject = { after = 1 }";
    let gw = InProcess::start(&config(&[a.url(), b.url()], upstream, "")).await;
    assert!(all_ok(&gets(&gw, 4).await));
    assert_eq!(healthy(&gw, &b.url()).await, Some(0.0));
    b.resume().await;
    elapse(10.0).await;
    // Just back: about a tenth of its turns (half the requests) go to it.
    assert!(all_ok(&gets(&gw, 200).await));
    let early = b.requests();
    assert!((1..=30).contains(&early), "{early} of 200");
    // A minute later it has its whole share.
    elapse(60.0).await;
    assert!(all_ok(&gets(&gw, 200).await));
    assert_eq!(b.requests() - early, 100);
}

/// Every log line of the test binary, from the first test that asks.
fn captured_log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || Capture(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        log
    })
    .clone()
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The captured lines that mention `text`.
fn lines_with(log: &Mutex<Vec<u8>>, text: &str) -> Vec<String> {
    String::from_utf8_lossy(&log.lock().unwrap())
        .lines()
        .filter(|line| line.contains(text))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_failing_url_is_logged_when_it_starts_and_then_summarised() {
    let log = captured_log();
    let (a, dead) = (Backend::http1().await, Backend::stopped().await);
    // Never ejected: every other request meets the refusing URL.
    let upstream = "eject = { max_ejected = \"0%\" }";
    let gw = InProcess::start(&config(&[a.url(), dead.url()], upstream, "")).await;
    // The sweeper's first tick (at start, on a blocking thread) is over
    // before the first request: paused time waits for blocking tasks.
    elapse(0.001).await;
    assert!(all_ok(&gets(&gw, 200).await));
    let failing = dead.url();
    let lines = lines_with(&log, &failing);
    assert_eq!(lines.len(), 1, "one line for 100 refusals: {lines:#?}");
    assert!(
        lines[0].contains("WARN") && lines[0].contains("upstream error"),
        "{}",
        lines[0]
    );
    assert!(
        lines[0].contains("cannot connect to"),
        "the error: {}",
        lines[0]
    );
    // The summary tick writes one line with the count...
    gw.app.sweep();
    let lines = lines_with(&log, &failing);
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines[1].contains("100 failed requests"), "{}", lines[1]);
    // ...and, after a quiet interval, one that ends the spell.
    dead.resume().await;
    assert!(all_ok(&gets(&gw, 10).await));
    gw.app.sweep();
    gw.app.sweep();
    let lines = lines_with(&log, &failing);
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(lines[2].contains("no failed requests"), "{}", lines[2]);
}
