//! TLS termination and HTTP/2 from clients, end to end through the
//! gateway in process (the binary for two workers): HTTPS (h1 and h2 by ALPN) to a plaintext upstream, SNI choosing
//! the certificate, rotation by a reload under load, bad files as config
//! errors, a stalled handshake cut off without holding up others, h2c with
//! prior knowledge, per-stream rate limiting, rapid reset, an idle h2
//! connection closed and an oversized h2 header list refused, two workers
//! sharing one limit, a TLS listener removed and added by a reload, HTTPS
//! upstreams (WebSocket tunnels included), and `curl` as users run it.
//! Certificates are made by each test (`common::certs`).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::certs::{Ca, connect};
use common::{Gateway, InProcess, TestUpstream, eventually, get, tollgate};
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// A config with a plain and a TLS listener, upstream `api`, and `rest`.
fn config(upstream: &TestUpstream, tls: &str, rest: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
workers = 1
admin = "127.0.0.1:0"
header_read_timeout = "1s"

[server.tls]
listen = "127.0.0.1:0"
cert = "gateway.crt"
key = "gateway.key"
{tls}

[upstreams.api]
url = "{url}"

{rest}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#,
        url = upstream.url()
    )
}

/// A temporary directory holding `gateway.crt`/`gateway.key` for `names`.
fn dir_with_cert(ca: &Ca, names: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    ca.leaf(names).write(dir.path(), "gateway");
    dir
}

/// One HTTP/1.1 `GET path` over TLS (SNI `name`): status, headers, body.
async fn https_get(
    connector: &TlsConnector,
    addr: SocketAddr,
    name: &str,
    path: &str,
) -> Result<(u16, http::HeaderMap, Bytes), String> {
    let stream = connect(connector, addr, name)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    get_on(stream, name, path).await
}

/// One HTTP/1.1 `GET path` (`Host: name`) on the TLS connection `stream`,
/// read to the end: status, headers, body.
async fn get_on(
    stream: tokio_rustls::client::TlsStream<TcpStream>,
    name: &str,
    path: &str,
) -> Result<(u16, http::HeaderMap, Bytes), String> {
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("http1: {e}"))?;
    tokio::spawn(connection);
    let request = Request::get(path)
        .header("host", name)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("request: {e}"))?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    Ok((status, headers, body))
}

/// `connector` without session resumption: every connection a full
/// handshake, with the server's certificate (a resumed session presents
/// none; the client reports the one it was first given).
fn full_handshakes(connector: &TlsConnector) -> TlsConnector {
    let mut config = (**connector.config()).clone();
    config.resumption = rustls::client::Resumption::disabled();
    TlsConnector::from(Arc::new(config))
}

/// The certificate the server presents for SNI `name` in a full handshake.
async fn presented(connector: &TlsConnector, addr: SocketAddr, name: &str) -> Vec<u8> {
    let stream = connect(&full_handshakes(connector), addr, name)
        .await
        .expect("handshake");
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test]
async fn https_request_reaches_a_plain_upstream_with_forwarded_proto() {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let gw = InProcess::start_in(dir, &config(&upstream, "", "")).await;
    let tls = gw.tls_addr.expect("TLS listener");
    let connector = ca.client(&[b"http/1.1"]);
    let (status, _, body) = https_get(&connector, tls, "gateway.test", "/hello")
        .await
        .unwrap();
    assert_eq!((status, &body[..]), (200, &b"echo"[..]));
    let seen = upstream.last_seen();
    assert_eq!(seen.header("x-forwarded-proto"), Some("https"));
    let forwarded = seen.header("forwarded").unwrap();
    assert!(forwarded.contains("proto=https"), "{forwarded}");
    // The cleartext listener still says http.
    assert_eq!(get(gw.addr, "/plain", &[]).await.status, 200);
    assert_eq!(
        upstream.last_seen().header("x-forwarded-proto"),
        Some("http")
    );
}

#[tokio::test]
async fn sni_chooses_the_certificate_and_others_get_the_default() {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["default.test"]);
    let api = ca.leaf(&["api.test"]);
    api.write(dir.path(), "api");
    let wild = ca.leaf(&["*.wild.test"]);
    wild.write(dir.path(), "wild");
    let tls = r#"
[[server.tls.certs]]
names = ["api.test"]
cert = "api.crt"
key = "api.key"

[[server.tls.certs]]
names = ["*.wild.test"]
cert = "wild.crt"
key = "wild.key"
"#;
    let default = std::fs::read_to_string(dir.path().join("gateway.crt")).unwrap();
    let gw = InProcess::start_in(dir, &config(&upstream, tls, "")).await;
    let addr = gw.tls_addr.unwrap();
    let connector = ca.client(&[b"http/1.1"]);
    assert_eq!(
        presented(&connector, addr, "api.test").await,
        api.der.to_vec()
    );
    assert_eq!(
        presented(&connector, addr, "a.wild.test").await,
        wild.der.to_vec()
    );
    let default_der = rustls::pki_types::CertificateDer::from_pem_slice(default.as_bytes())
        .unwrap()
        .to_vec();
    assert_eq!(
        presented(&connector, addr, "default.test").await,
        default_der
    );
    // And the request itself goes through on the chosen certificate.
    let (status, _, _) = https_get(&connector, addr, "api.test", "/x").await.unwrap();
    assert_eq!(status, 200);
}

use rustls::pki_types::pem::PemObject;

/// Rewrites the gateway's certificate files and reloads (as SIGHUP does);
/// checks that the reload was counted (`result` ok or error).
async fn rotate(gw: &InProcess, cert: &str, key: &str, result: &str) {
    let before = reloads(gw, result).await;
    std::fs::write(gw.dir.path().join("gateway.crt"), cert).unwrap();
    std::fs::write(gw.dir.path().join("gateway.key"), key).unwrap();
    gw.reload();
    assert_ne!(reloads(gw, result).await, before, "no reload");
}

async fn metrics(gw: &InProcess) -> String {
    let reply = get(gw.admin.unwrap(), "/metrics", &[]).await;
    String::from_utf8_lossy(&reply.body).into_owned()
}

async fn reloads(gw: &InProcess, result: &str) -> u64 {
    metric(
        &metrics(gw).await,
        "tollgate_config_reloads_total",
        ("result", result),
    )
}

/// A counter's value for one label: 0 when it has not been counted yet, a
/// failure when the exposition lacks the metric itself.
fn metric(text: &str, name: &str, label: (&str, &str)) -> u64 {
    common::openmetrics::parse(text)
        .unwrap()
        .count(name, &[label]) as u64
}

#[tokio::test]
async fn a_reload_rotates_the_certificate_under_load_without_a_failed_request() {
    let log = common::log::capture();
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let old = std::fs::read(dir.path().join("gateway.crt")).unwrap();
    let gw = InProcess::start_in(dir, &config(&upstream, "", "")).await;
    let addr = gw.tls_addr.unwrap();
    let connector = full_handshakes(&ca.client(&[b"http/1.1"]));

    // A keep-alive connection opened before the rotation.
    let stream = connect(&connector, addr, "gateway.test").await.unwrap();
    let (mut kept, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);

    // Load: new connections (so new handshakes) one after another.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (stop, ok, failed, connector) =
            (stop.clone(), ok.clone(), failed.clone(), connector.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match https_get(&connector, addr, "gateway.test", "/load").await {
                    Ok((200, _, _)) => ok.fetch_add(1, Ordering::Relaxed),
                    other => {
                        eprintln!("failed: {other:?}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    // New handshakes before, between and after the rotations.
    let served = async |more: usize| {
        let target = ok.load(Ordering::Relaxed) + more;
        assert!(
            eventually(async || ok.load(Ordering::Relaxed) >= target).await,
            "the load stalled"
        );
    };
    served(6).await;
    let mut last = Vec::new();
    for _ in 0..3 {
        let next = ca.leaf(&["gateway.test"]);
        rotate(&gw, &next.cert_pem, &next.key_pem, "ok").await;
        served(6).await;
        last = next.der.to_vec();
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "{}", log.text());
    assert!(ok.load(Ordering::Relaxed) > 20, "too little load");
    // New handshakes present the new certificate…
    assert_eq!(presented(&connector, addr, "gateway.test").await, last);
    assert_ne!(last, old);
    // …and the connection from before the rotations still serves.
    let response = kept
        .send_request(
            Request::get("/kept")
                .header("host", "gateway.test")
                .body(Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_bad_pair_on_reload_keeps_the_old_one_and_fails_the_reload() {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let cert = std::fs::read(dir.path().join("gateway.crt")).unwrap();
    let log = common::log::capture();
    let gw = InProcess::start_in(dir, &config(&upstream, "", "")).await;
    let addr = gw.tls_addr.unwrap();
    let connector = ca.client(&[b"http/1.1"]);
    let before = presented(&connector, addr, "gateway.test").await;
    // A new certificate with a key that is not its own.
    let next = ca.leaf(&["gateway.test"]);
    let other = ca.leaf(&["gateway.test"]);
    rotate(&gw, &next.cert_pem, &other.key_pem, "error").await;
    let stderr = log.when(|s| s.contains("does not match")).await;
    assert!(stderr.contains("gateway.toml:"), "{stderr}");
    assert!(stderr.contains("`server.tls.key`"), "{stderr}");
    assert!(
        stderr.contains("does not match the certificate"),
        "{stderr}"
    );
    assert_eq!(presented(&connector, addr, "gateway.test").await, before);
    let (status, _, _) = https_get(&connector, addr, "gateway.test", "/x")
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(!cert.is_empty());
}

/// `tollgate check` on a config in `dir`: (exit code, stderr).
fn check(dir: &Path, config: &str) -> (i32, String) {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, config).unwrap();
    let (code, _, stderr) = tollgate(&["check", "-c", path.to_str().unwrap()]);
    (code, stderr)
}

const TLS_ONLY: &str = r#"[server]
listen = "127.0.0.1:0"

[server.tls]
listen = "127.0.0.1:0"
cert = "gateway.crt"
key = "gateway.key"
"#;

#[test]
fn bad_certificate_and_key_files_are_config_errors_with_file_and_line() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    // Missing files.
    let (code, stderr) = check(dir.path(), TLS_ONLY);
    assert_eq!(code, 1);
    assert!(stderr.contains("gateway.toml:6:"), "{stderr}");
    assert!(
        stderr.contains("`server.tls.cert`: cannot read"),
        "{stderr}"
    );
    assert!(stderr.contains("gateway.crt"), "{stderr}");
    // Not PEM.
    std::fs::write(dir.path().join("gateway.crt"), "hello\n").unwrap();
    std::fs::write(dir.path().join("gateway.key"), "hello\n").unwrap();
    let (code, stderr) = check(dir.path(), TLS_ONLY);
    assert_eq!(code, 1);
    assert!(stderr.contains("holds no PEM certificate"), "{stderr}");
    // A certificate, and a key that is no key.
    ca.leaf(&["a.test"]).write(dir.path(), "gateway");
    std::fs::write(dir.path().join("gateway.key"), ca.pem()).unwrap();
    let (code, stderr) = check(dir.path(), TLS_ONLY);
    assert_eq!(code, 1);
    assert!(stderr.contains("gateway.toml:7:"), "{stderr}");
    assert!(stderr.contains("holds no PEM private key"), "{stderr}");
    // A key that belongs to another certificate.
    let other = ca.leaf(&["a.test"]);
    std::fs::write(dir.path().join("gateway.key"), other.key_pem).unwrap();
    let (code, stderr) = check(dir.path(), TLS_ONLY);
    assert_eq!(code, 1);
    assert!(stderr.contains("`server.tls.key`"), "{stderr}");
    assert!(
        stderr.contains("does not match the certificate"),
        "{stderr}"
    );
    // A good pair passes.
    ca.leaf(&["a.test"]).write(dir.path(), "gateway");
    let (code, stderr) = check(dir.path(), TLS_ONLY);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
}

#[test]
fn expired_and_expiring_certificates_are_warned_about() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    ca.leaf_with(&["a.test"], |p| {
        p.not_before = rcgen::date_time_ymd(2019, 1, 1);
        p.not_after = rcgen::date_time_ymd(2020, 1, 1);
    })
    .write(dir.path(), "gateway");
    let (code, stderr) = check(dir.path(), TLS_ONLY);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("warning: `server.tls.cert`"), "{stderr}");
    assert!(stderr.contains("has expired"), "{stderr}");
    // One that ends in about five days.
    let soon = std::time::SystemTime::now() + Duration::from_secs(6 * 86_400);
    let (year, month, day) = civil(soon);
    ca.leaf_with(&["a.test"], |p| {
        p.not_after = rcgen::date_time_ymd(year, month, day)
    })
    .write(dir.path(), "gateway");
    let (code, stderr) = check(dir.path(), TLS_ONLY);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("expires in 5 days"), "{stderr}");
    // A year ahead: quiet.
    let later = std::time::SystemTime::now() + Duration::from_secs(365 * 86_400);
    let (year, month, day) = civil(later);
    ca.leaf_with(&["a.test"], |p| {
        p.not_after = rcgen::date_time_ymd(year, month, day)
    })
    .write(dir.path(), "gateway");
    let (_, stderr) = check(dir.path(), TLS_ONLY);
    assert!(!stderr.contains("warning"), "{stderr}");
}

/// The UTC date of `time` (Howard Hinnant's `civil_from_days`).
fn civil(time: std::time::SystemTime) -> (i32, u8, u8) {
    let days = (time
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year as i32, month as u8, day as u8)
}

#[tokio::test]
async fn a_stalled_handshake_is_cut_off_and_does_not_stop_others() {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let gw = InProcess::start_in(dir, &config(&upstream, "", "")).await;
    let addr = gw.tls_addr.unwrap();
    let connector = ca.client(&[b"http/1.1"]);
    // One client opens a connection and sends half a ClientHello; another
    // sends nothing at all.
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    let silent = TcpStream::connect(addr).await.unwrap();
    for _ in 0..5 {
        let (status, _, _) = https_get(&connector, addr, "gateway.test", "/x")
            .await
            .unwrap();
        assert_eq!(status, 200);
    }
    // They were served while both stalled connections were still open: the
    // stalls did not hold them up until header_read_timeout closed them.
    for stream in [&half, &silent] {
        let mut byte = [0u8; 1];
        assert!(
            matches!(stream.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a stalled connection was closed before the others were served"
        );
    }
    // header_read_timeout is 1s: both are closed by then, and counted.
    for stream in [half, silent] {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(3), async {
            stream.readable().await.unwrap();
            stream.try_read(&mut buf)
        })
        .await
        .expect("closed within the timeout");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
    let text = metrics(&gw).await;
    assert_eq!(
        metric(
            &text,
            "tollgate_tls_handshake_failures_total",
            ("reason", "timeout")
        ),
        2,
        "{text}"
    );
    // A client that does not trust the certificate fails its handshake.
    let stranger = Ca::new().client(&[b"http/1.1"]);
    assert!(connect(&stranger, addr, "gateway.test").await.is_err());
    let failed = async || {
        let text = metrics(&gw).await;
        let failures = metric(
            &text,
            "tollgate_tls_handshake_failures_total",
            ("reason", "error"),
        );
        (failures, text)
    };
    let counted = eventually(async || failed().await.0 == 1).await;
    assert!(counted, "{}", failed().await.1);
}

/// `n` concurrent `GET path`s on one HTTP/2 connection over `io`: statuses
/// and the last 429's headers.
async fn h2_burst<T>(io: T, n: usize, path: &str) -> (Vec<u16>, Option<http::HeaderMap>)
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .expect("h2 handshake");
    tokio::spawn(connection);
    let mut tasks = Vec::new();
    for _ in 0..n {
        let mut sender = sender.clone();
        let request = Request::get(format!("https://gateway.test{path}"))
            .body(Empty::<Bytes>::new())
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let response = sender.send_request(request).await.expect("h2 response");
            assert_eq!(response.version(), http::Version::HTTP_2);
            let status = response.status().as_u16();
            let headers = response.headers().clone();
            let _ = response.into_body().collect().await;
            (status, headers)
        }))
    }
    let mut statuses = Vec::new();
    let mut denied = None;
    for task in tasks {
        let (status, headers) = task.await.unwrap();
        if status == 429 {
            denied = Some(headers);
        }
        statuses.push(status);
    }
    (statuses, denied)
}

const PER_IP: &str = r#"[limits.per_ip]
key = "ip"
algorithm = "token_bucket"
capacity = 10
refill = "1/h"

[[routes]]
name = "limited"
match = { path_prefix = "/limited" }
upstream = "api"
limits = ["per_ip"]
"#;

/// Field names and values of a 429, without the ones that vary (`date`).
fn shape(headers: &http::HeaderMap) -> Vec<(String, String)> {
    let mut fields: Vec<(String, String)> = headers
        .iter()
        .filter(|(name, _)| *name != "date")
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    fields.sort();
    fields
}

#[tokio::test]
async fn h2_by_alpn_counts_every_stream_against_the_limit() {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let gw = InProcess::start_in(dir, &config(&upstream, "", PER_IP)).await;
    let addr = gw.tls_addr.unwrap();
    let connector = ca.client(&[b"h2", b"http/1.1"]);
    let stream = connect(&connector, addr, "gateway.test").await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (statuses, denied) = h2_burst(stream, 20, "/limited").await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        10,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 429).count(),
        10,
        "{statuses:?}"
    );
    // The Host the upstream saw came from `:authority`, and the 429 over h2
    // carries what a 429 over HTTP/1.1 does.
    assert_eq!(upstream.last_seen().header("host"), Some("gateway.test"));
    assert_eq!(
        upstream.last_seen().header("x-forwarded-proto"),
        Some("https")
    );
    let connector = ca.client(&[b"http/1.1"]);
    let (status, h1_headers, _) = https_get(&connector, addr, "gateway.test", "/limited")
        .await
        .unwrap();
    assert_eq!(status, 429);
    let mut h1 = shape(&h1_headers);
    // HTTP/2 has no connection-specific fields (RFC 9113 §8.2.2).
    h1.retain(|(name, _)| name != "connection" && name != "keep-alive");
    assert_eq!(shape(&denied.unwrap()), h1);
}

#[tokio::test]
async fn h2c_with_prior_knowledge_on_the_cleartext_listener() {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let gw = InProcess::start_in(dir, &config(&upstream, "", PER_IP)).await;
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (statuses, denied) = h2_burst(stream, 20, "/limited").await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        10,
        "{statuses:?}"
    );
    assert!(denied.unwrap().contains_key("retry-after"));
    assert_eq!(
        upstream.last_seen().header("x-forwarded-proto"),
        Some("http")
    );
}

#[tokio::test]
async fn rapid_reset_disconnects_the_client() {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let gw = InProcess::start_in(dir, &config(&upstream, "", "")).await;
    let stream = TcpStream::connect(gw.addr).await.unwrap();
    let (client, connection) = h2::client::handshake(stream).await.expect("h2 handshake");
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    // Open streams and reset each at once, as fast as the client can.
    let mut sent = 0;
    let started = Instant::now();
    while sent < 10_000 && started.elapsed() < Duration::from_secs(5) {
        let request = Request::get("http://gateway.test/slow/200")
            .body(())
            .unwrap();
        match client.send_request(request, true) {
            Ok((_response, mut stream)) => {
                stream.send_reset(h2::Reason::CANCEL);
                sent += 1;
                // Let the connection task write the frames out.
                tokio::task::yield_now().await;
            }
            Err(_) => break,
        }
        client = match client.ready().await {
            Ok(client) => client,
            Err(_) => break,
        };
    }
    // The server sent GOAWAY (ENHANCE_YOUR_CALM) and closed: the client's
    // connection ends with an error. Without the bound it would stay open
    // and this would time out.
    let ended = tokio::time::timeout(Duration::from_secs(5), connection)
        .await
        .expect("the server closed the connection")
        .unwrap();
    let error = ended.expect_err("GOAWAY");
    // Either the client read the GOAWAY, or its next write found the
    // connection closed after it.
    assert!(
        error.reason() == Some(h2::Reason::ENHANCE_YOUR_CALM) || error.is_io(),
        "{error}"
    );
    // (How many went out before the close depends on scheduling: the bound
    // is on resets the server has not taken up yet, not on the total.)
    eprintln!("{sent} streams opened and reset before the close");
    // Other clients are served.
    assert_eq!(get(gw.addr, "/after", &[]).await.status, 200);
    // And the operator sees it, once the gateway's side of the connection
    // has ended (the client may see the GOAWAY first).
    let series = (
        "tollgate_http2_connection_errors_total",
        ("reason", "enhance_your_calm"),
    );
    eventually(async || metric(&metrics(&gw).await, series.0, series.1) != 0).await;
    assert_eq!(metric(&metrics(&gw).await, series.0, series.1), 1);
}

#[tokio::test]
async fn curl_http2_and_prior_knowledge() {
    if common::needs::skip(common::needs::CURL) {
        return;
    }
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let gw = InProcess::start_in(dir, &config(&upstream, "", "")).await;
    let tls = gw.tls_addr.unwrap();
    // Off the runtime: the test upstream runs on it.
    let curl = |args: &[&str]| {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        tokio::task::spawn_blocking(move || {
            let output = std::process::Command::new("curl")
                .args([
                    "-sS",
                    "-o",
                    "/dev/null",
                    "-w",
                    "%{http_version} %{http_code}",
                ])
                .args(&args)
                .output()
                .unwrap_or_else(|e| {
                    panic!("cannot run curl ({e}); install it: apt-get install -y curl")
                });
            (
                String::from_utf8_lossy(&output.stdout).into_owned(),
                String::from_utf8_lossy(&output.stderr).into_owned(),
            )
        })
    };
    let resolve = format!("gateway.test:{}:127.0.0.1", tls.port());
    let url = format!("https://gateway.test:{}/curl", tls.port());
    let (out, err) = curl(&[
        "--http2",
        "--cacert",
        ca_file.to_str().unwrap(),
        "--resolve",
        &resolve,
        &url,
    ])
    .await
    .unwrap();
    assert_eq!(out, "2 200", "{err}");
    let (out, err) = curl(&[
        "--http1.1",
        "--cacert",
        ca_file.to_str().unwrap(),
        "--resolve",
        &resolve,
        &url,
    ])
    .await
    .unwrap();
    assert_eq!(out, "1.1 200", "{err}");
    let (out, err) = curl(&[
        "--http2-prior-knowledge",
        &format!("http://{}/curl", gw.addr),
    ])
    .await
    .unwrap();
    assert_eq!(out, "2 200", "{err}");
    assert_eq!(
        upstream.last_seen().header("x-forwarded-proto"),
        Some("http")
    );
}

/// An HTTPS upstream: hyper's HTTP/1.1 server behind rustls with `leaf`,
/// answering `upstream saw PATH`, or tunnelling a WebSocket upgrade as an
/// echo. Counts the TLS connections it accepted.
struct TlsUpstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl TlsUpstream {
    async fn start(leaf: &common::certs::Leaf) -> TlsUpstream {
        let chain = vec![leaf.der.clone()];
        let key =
            rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    counted.fetch_add(1, Ordering::Relaxed);
                    let service = hyper::service::service_fn(
                        |mut request: Request<hyper::body::Incoming>| async move {
                            if request.headers().contains_key("upgrade") {
                                return Ok(echo_upgrade(&mut request));
                            }
                            let body = format!(
                                "upstream saw {} proto={}",
                                request.uri().path(),
                                request
                                    .headers()
                                    .get("x-forwarded-proto")
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or("-")
                            );
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(Bytes::from(body)),
                            ))
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        TlsUpstream { addr, connections }
    }
}

/// Accepts a WebSocket handshake (`101`, the accept value of
/// [`upgrade_over`]'s key) and echoes what the tunnel carries.
fn echo_upgrade(
    request: &mut Request<hyper::body::Incoming>,
) -> hyper::Response<http_body_util::Full<Bytes>> {
    let upgrade = hyper::upgrade::on(request);
    tokio::spawn(async move {
        if let Ok(upgraded) = upgrade.await {
            let (mut from, mut to) = tokio::io::split(TokioIo::new(upgraded));
            let _ = tokio::io::copy(&mut from, &mut to).await;
        }
    });
    hyper::Response::builder()
        .status(101)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
        .body(http_body_util::Full::new(Bytes::new()))
        .unwrap()
}

/// A gateway whose upstream `api` is `url` with the `extra` upstream keys;
/// `ca.pem` in its directory holds `ca`.
async fn https_upstream_gateway(ca: &Ca, url: &str, extra: &str) -> InProcess {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    let config = format!(
        r#"[server]
listen = "127.0.0.1:0"
workers = 1

[upstreams.api]
url = "{url}"
{extra}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#
    );
    InProcess::start_in(dir, &config).await
}

#[tokio::test]
async fn https_upstream_verified_with_its_ca_and_pooled() {
    let ca = Ca::new();
    let upstream = TlsUpstream::start(&ca.leaf(&["upstream.test", "localhost"])).await;
    // The name from `sni`.
    let url = format!("https://127.0.0.1:{}", upstream.addr.port());
    let log = common::log::capture();
    let gw = https_upstream_gateway(&ca, &url, "ca = \"ca.pem\"\nsni = \"upstream.test\"").await;
    for i in 0..5 {
        let reply = get(gw.addr, &format!("/r{i}"), &[]).await;
        assert_eq!(reply.status, 200, "{}", log.text());
        assert_eq!(
            reply.body,
            format!("upstream saw /r{i} proto=http").as_bytes()
        );
    }
    // Keep-alive: one TLS connection carried all five.
    assert_eq!(upstream.connections.load(Ordering::Relaxed), 1);
    // The name from the URL's host.
    let url = format!("https://localhost:{}", upstream.addr.port());
    let gw = https_upstream_gateway(&ca, &url, "ca = \"ca.pem\"").await;
    assert_eq!(
        get(gw.addr, "/by-host", &[]).await.status,
        200,
        "{}",
        log.text()
    );
}

#[tokio::test]
async fn https_upstream_with_a_wrong_ca_or_name_is_a_502_with_a_clear_log_line() {
    let ca = Ca::new();
    let upstream = TlsUpstream::start(&ca.leaf(&["upstream.test"])).await;
    let url = format!("https://127.0.0.1:{}", upstream.addr.port());
    // Trusting another CA only.
    let stranger = Ca::new();
    let capture = common::log::capture();
    let gw =
        https_upstream_gateway(&stranger, &url, "ca = \"ca.pem\"\nsni = \"upstream.test\"").await;
    let reply = get(gw.addr, "/x", &[]).await;
    assert_eq!(reply.status, 502);
    let log = capture.when(|s| s.contains("upstream error")).await;
    assert!(
        log.contains("TLS handshake as upstream.test failed"),
        "{log}"
    );
    assert!(log.contains("invalid peer certificate"), "{log}");
    // The built-in roots do not know the test CA either.
    let gw = https_upstream_gateway(&ca, &url, "sni = \"upstream.test\"").await;
    assert_eq!(get(gw.addr, "/x", &[]).await.status, 502);
    // The right CA, the wrong name (its own log, as a new process's).
    let capture = common::log::capture();
    let gw = https_upstream_gateway(&ca, &url, "ca = \"ca.pem\"\nsni = \"other.test\"").await;
    assert_eq!(get(gw.addr, "/x", &[]).await.status, 502);
    let log = capture.when(|s| s.contains("upstream error")).await;
    assert!(log.contains("TLS handshake as other.test failed"), "{log}");
    assert!(
        log.contains("certificate not valid for name \"other.test\""),
        "{log}"
    );
    assert_eq!(upstream.connections.load(Ordering::Relaxed), 0);
}

#[test]
fn https_upstream_options_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let config = |upstream: &str| {
        format!(
            "[upstreams.api]\n{upstream}\n\n[[routes]]\nname = \"r\"\nmatch = {{ path_prefix = \"/\" }}\nupstream = \"api\"\n"
        )
    };
    let (code, stderr) = check(
        dir.path(),
        &config("url = \"http://127.0.0.1:9000\"\nsni = \"a.test\""),
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("`upstreams.api.sni`: `sni` applies to https:// URLs only"),
        "{stderr}"
    );
    let (code, stderr) = check(
        dir.path(),
        &config("url = \"https://127.0.0.1:9443\"\nca = \"missing.pem\""),
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("`upstreams.api.ca`: cannot read"),
        "{stderr}"
    );
    let (code, stderr) = check(dir.path(), &config("url = \"https://api.example.com\""));
    assert_eq!(code, 0, "{stderr}");
}

/// Sends a websocket handshake over `stream` and reads the response head.
async fn upgrade_over<S>(stream: &mut S) -> String
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncReadExt;
    stream
        .write_all(b"GET /upgrade HTTP/1.1\r\nhost: gateway.test\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

#[tokio::test]
async fn websocket_upgrades_over_tls_are_tunnelled_and_limited_at_the_handshake() {
    use tokio::io::AsyncReadExt;
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let limit = r#"[limits.one_socket]
key = "ip"
algorithm = "token_bucket"
capacity = 1
refill = "1/h"

[[routes]]
name = "ws"
match = { path = "/upgrade" }
upstream = "api"
limits = ["one_socket"]
"#;
    let gw = InProcess::start_in(dir, &config(&upstream, "", limit)).await;
    let addr = gw.tls_addr.unwrap();
    let connector = ca.client(&[b"http/1.1"]);
    let mut first = connect(&connector, addr, "gateway.test").await.unwrap();
    let head = upgrade_over(&mut first).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // The tunnel echoes through TLS both ways.
    first.write_all(b"ping over tls").await.unwrap();
    let mut echoed = [0u8; 13];
    tokio::time::timeout(Duration::from_secs(5), first.read_exact(&mut echoed))
        .await
        .expect("echo")
        .unwrap();
    assert_eq!(&echoed, b"ping over tls");
    // The second handshake is over the limit.
    let mut second = connect(&connector, addr, "gateway.test").await.unwrap();
    let head = upgrade_over(&mut second).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(head.to_ascii_lowercase().contains("retry-after:"), "{head}");
}

/// `n` new TLS connections to `addr`, one `GET path` each, concurrently:
/// the statuses (or the error text).
async fn https_gets(
    connector: &TlsConnector,
    addr: SocketAddr,
    path: &str,
    n: usize,
) -> Vec<Result<u16, String>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (connector, path) = (connector.clone(), path.to_owned());
        tasks.push(tokio::spawn(async move {
            https_get(&connector, addr, "gateway.test", &path)
                .await
                .map(|(status, _, _)| status)
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    statuses
}

/// A gateway with two workers and a TLS listener (a certificate for
/// `gateway.test` from a new CA), with the `PER_IP` routes, in front of a
/// new test upstream (kept alive by the caller).
async fn two_worker_tls_gateway() -> (TestUpstream, Ca, Gateway) {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let text = config(&upstream, "", PER_IP).replace("workers = 1", "workers = 2");
    let gw = Gateway::start_in(dir, &text, &[]);
    (upstream, ca, gw)
}

#[tokio::test]
async fn tls_with_two_workers_serves_h1_and_h2_and_shares_one_limit() {
    let (_upstream, ca, gw) = two_worker_tls_gateway().await;
    let addr = gw.tls_addr.unwrap();
    let connector = ca.client(&[b"http/1.1"]);
    // Many connections, spread by the kernel over both workers' sockets.
    let statuses = https_gets(&connector, addr, "/open", 16).await;
    assert!(
        statuses.iter().all(|s| s == &Ok(200)),
        "{statuses:?}\n{}",
        gw.stderr()
    );
    // One bucket for the process, whichever worker a connection landed on.
    let statuses = https_gets(&connector, addr, "/limited", 16).await;
    let count = |code| statuses.iter().filter(|s| **s == Ok(code)).count();
    assert_eq!((count(200), count(429)), (10, 6), "{statuses:?}");
    let connector = ca.client(&[b"h2", b"http/1.1"]);
    let stream = connect(&connector, addr, "gateway.test").await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (statuses, _) = h2_burst(stream, 8, "/h2").await;
    assert_eq!(statuses, vec![200; 8]);
}

#[tokio::test]
async fn sessions_resume_from_tickets_on_any_worker() {
    // Stateless tickets (no session cache shared by the workers behind a
    // lock): a client resumes its session on every later connection,
    // whichever of the two workers' sockets the kernel hands it to.
    let (_upstream, ca, gw) = two_worker_tls_gateway().await;
    let addr = gw.tls_addr.unwrap();
    // One client configuration: its session store keeps the tickets.
    let connector = ca.client(&[b"http/1.1"]);
    let mut kinds = Vec::new();
    for _ in 0..12 {
        let stream = connect(&connector, addr, "gateway.test").await.unwrap();
        kinds.push(stream.get_ref().1.handshake_kind());
        // The tickets arrive after the handshake: read to the end.
        let (status, _, _) = get_on(stream, "gateway.test", "/open").await.unwrap();
        assert_eq!(status, 200);
    }
    use rustls::HandshakeKind::{Full, Resumed};
    assert_eq!(kinds[0], Some(Full), "{kinds:?}");
    assert!(
        kinds[1..].iter().all(|kind| *kind == Some(Resumed)),
        "{kinds:?}\n{}",
        gw.stderr()
    );
}

/// Writes `text` as the gateway's configuration and reloads it (as SIGHUP
/// does); checks that the reload was counted as `ok`.
async fn reload_with(gw: &InProcess, text: &str) {
    let before = reloads(gw, "ok").await;
    gw.reload_with(text);
    assert_ne!(reloads(gw, "ok").await, before, "no reload");
}

#[tokio::test]
async fn a_reload_removes_and_adds_the_tls_listener() {
    let capture = common::log::capture();
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let with_tls = config(&upstream, "", "");
    let gw = InProcess::start_in(dir, &with_tls).await;
    let first = gw.tls_addr.unwrap();
    let connector = ca.client(&[b"http/1.1"]);
    assert_eq!(https_gets(&connector, first, "/", 1).await, vec![Ok(200)]);

    // Removed: the TLS address refuses connections; cleartext carries on.
    let tls_table =
        "[server.tls]\nlisten = \"127.0.0.1:0\"\ncert = \"gateway.crt\"\nkey = \"gateway.key\"\n";
    assert!(with_tls.contains(tls_table));
    reload_with(&gw, &with_tls.replace(tls_table, "")).await;
    assert!(
        eventually(async || TcpStream::connect(first).await.is_err()).await,
        "still listening on {first}"
    );
    assert_eq!(get(gw.addr, "/plain", &[]).await.status, 200);

    // Added back (port 0: a new address, which the reload logs).
    let before = capture.text().matches("listening on https://").count();
    reload_with(&gw, &with_tls).await;
    let log = capture
        .when(|s| s.matches("listening on https://").count() > before)
        .await;
    let added: SocketAddr = log
        .lines()
        .filter_map(|line| line.split("listening on https://").nth(1))
        .next_back()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no added TLS listener in:\n{log}"));
    assert!(log.contains("(added by reload)"), "{log}");
    assert_eq!(https_gets(&connector, added, "/", 1).await, vec![Ok(200)]);
    assert_eq!(get(gw.addr, "/plain", &[]).await.status, 200);
}

// Paused time: the gateway's timers and this test's clock are tokio's.
#[tokio::test(start_paused = true)]
async fn an_idle_h2_connection_is_closed_after_idle_timeout() {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let text = config(&upstream, "", "").replace(
        "header_read_timeout = \"1s\"",
        "header_read_timeout = \"1s\"\nidle_timeout = \"2s\"",
    );
    let gw = InProcess::start_in(dir, &text).await;
    let connector = ca.client(&[b"h2"]);
    let stream = connect(&connector, gw.tls_addr.unwrap(), "gateway.test")
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(stream).await.expect("h2 handshake");
    let connection = tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let request = Request::get("https://gateway.test/once").body(()).unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    assert_eq!(response.await.unwrap().status(), 200);
    let answered = tokio::time::Instant::now();
    // The server says GOAWAY and closes; the client's connection ends. A
    // connection kept open would time out here.
    let ended = common::within_wall_clock(Duration::from_secs(15), connection)
        .await
        .expect("the idle connection was closed")
        .unwrap();
    // A graceful GOAWAY, or the client's answer to it finding the socket
    // already closed (which of the two depends on scheduling).
    if let Err(error) = ended {
        assert!(error.is_io(), "neither a GOAWAY nor a close: {error}");
    }
    // By idle_timeout (2 s), not before, and not by header_read_timeout
    // (1 s), which is for a request head begun and not finished.
    let idle = answered.elapsed();
    assert!(idle >= Duration::from_millis(1500), "closed after {idle:?}");
    drop(client);
}

#[tokio::test]
async fn an_oversized_h2_header_list_is_refused_and_the_connection_serves_on() {
    let upstream = TestUpstream::start().await;
    let ca = Ca::new();
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    let text = config(&upstream, "", "").replace(
        "header_read_timeout = \"1s\"",
        "header_read_timeout = \"1s\"\nmax_header_bytes = \"4KiB\"",
    );
    let gw = InProcess::start_in(dir, &text).await;
    let connector = ca.client(&[b"h2"]);
    let stream = connect(&connector, gw.tls_addr.unwrap(), "gateway.test")
        .await
        .unwrap();
    let (client, connection) = h2::client::handshake(stream).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let big = "x".repeat(8 * 1024);
    let request = Request::get("https://gateway.test/big")
        .header("x-big", big.as_str())
        .body(())
        .unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    // RFC 9113 §10.5.1: a 431 (h2 sends one, then resets the stream), or
    // the reset alone if it arrives first.
    match response.await {
        Ok(response) => assert_eq!(response.status(), 431),
        Err(error) => assert_eq!(error.reason(), Some(h2::Reason::REFUSED_STREAM), "{error}"),
    }
    assert_eq!(upstream.count(), 0, "the oversized request was forwarded");
    // The same connection serves a request of ordinary size.
    let mut client = client.ready().await.unwrap();
    let request = Request::get("https://gateway.test/small").body(()).unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    assert_eq!(response.await.unwrap().status(), 200);
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn websocket_over_tls_to_an_https_upstream_is_tunnelled_and_limited() {
    use tokio::io::AsyncReadExt;
    let ca = Ca::new();
    let upstream = TlsUpstream::start(&ca.leaf(&["upstream.test"])).await;
    let dir = dir_with_cert(&ca, &["gateway.test"]);
    std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
    let text = format!(
        r#"[server]
listen = "127.0.0.1:0"
workers = 1

[server.tls]
listen = "127.0.0.1:0"
cert = "gateway.crt"
key = "gateway.key"

[upstreams.api]
url = "https://127.0.0.1:{port}"
ca = "ca.pem"
sni = "upstream.test"

[limits.one_socket]
key = "ip"
algorithm = "token_bucket"
capacity = 1
refill = "1/h"

[[routes]]
name = "ws"
match = {{ path = "/upgrade" }}
upstream = "api"
limits = ["one_socket"]
"#,
        port = upstream.addr.port()
    );
    let log = common::log::capture();
    let gw = InProcess::start_in(dir, &text).await;
    let connector = ca.client(&[b"http/1.1"]);
    let addr = gw.tls_addr.unwrap();
    let mut first = connect(&connector, addr, "gateway.test").await.unwrap();
    let head = upgrade_over(&mut first).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}\n{}", log.text());
    // TLS on both sides of the tunnel: client -> gateway -> upstream, and back.
    for message in [&b"ping over tls"[..], &b"and again"[..]] {
        first.write_all(message).await.unwrap();
        let mut echoed = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(5), first.read_exact(&mut echoed))
            .await
            .expect("echo")
            .unwrap();
        assert_eq!(echoed, message);
    }
    assert_eq!(upstream.connections.load(Ordering::Relaxed), 1);
    // Limited at the handshake: the second is a 429 that never reaches
    // the upstream.
    let mut second = connect(&connector, addr, "gateway.test").await.unwrap();
    let head = upgrade_over(&mut second).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert_eq!(upstream.connections.load(Ordering::Relaxed), 1);
}

/// An HTTP/2 upstream: hyper's HTTP/2 server, behind rustls offering ALPN
/// `h2` only when `leaf` is given, else h2c with prior knowledge. It answers
/// what it saw: version, method, path, `:authority`, the forwarding fields
/// and the body's length, with a field of its own and a `connection` field
/// (which HTTP/2 has none of: hyper refuses to send it, so it is not set).
/// Counts the connections it accepted.
struct H2Upstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl H2Upstream {
    async fn start(leaf: Option<&common::certs::Leaf>) -> H2Upstream {
        let acceptor = leaf.map(|leaf| {
            let key =
                rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
            let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der.clone()], key)
            .unwrap();
            config.alpn_protocols = vec![b"h2".to_vec()];
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (acceptor, counted) = (acceptor.clone(), counted.clone());
                tokio::spawn(async move {
                    counted.fetch_add(1, Ordering::Relaxed);
                    let service = hyper::service::service_fn(
                        |request: Request<hyper::body::Incoming>| async move {
                            let field = |name: &str| {
                                request
                                    .headers()
                                    .get(name)
                                    .and_then(|v| v.to_str().ok())
                                    .unwrap_or("-")
                                    .to_owned()
                            };
                            let seen = format!(
                                "{:?} {} {} authority={} xff={} proto={} te={}",
                                request.version(),
                                request.method(),
                                request.uri().path(),
                                request.uri().authority().map_or("-", |a| a.as_str()),
                                field("x-forwarded-for"),
                                field("x-forwarded-proto"),
                                field("te"),
                            );
                            let body = request.into_body().collect().await.unwrap().to_bytes();
                            let answer = format!("{seen} body={}", body.len());
                            Ok::<_, std::convert::Infallible>(
                                hyper::Response::builder()
                                    .header("x-upstream", "h2")
                                    .body(http_body_util::Full::new(Bytes::from(answer)))
                                    .unwrap(),
                            )
                        },
                    );
                    let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    match acceptor {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                let _ = builder
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        H2Upstream { addr, connections }
    }
}

#[tokio::test]
async fn http2_upstreams_over_tls_and_h2c_carry_every_request_on_one_connection() {
    let ca = Ca::new();
    let tls = H2Upstream::start(Some(&ca.leaf(&["upstream.test"]))).await;
    let h2c = H2Upstream::start(None).await;
    for (url, proto_seen) in [
        (format!("https://127.0.0.1:{}", tls.addr.port()), "https"),
        (format!("http://127.0.0.1:{}", h2c.addr.port()), "http"),
    ] {
        let extra = if proto_seen == "https" {
            "http2 = true\nca = \"ca.pem\"\nsni = \"upstream.test\""
        } else {
            "http2 = true"
        };
        let log = common::log::capture();
        let gw = https_upstream_gateway(&ca, &url, extra).await;
        for i in 0..5 {
            let reply = get(gw.addr, &format!("/r{i}"), &[]).await;
            assert_eq!(reply.status, 200, "{url}: {}", log.text());
            let body = String::from_utf8_lossy(&reply.body).into_owned();
            assert!(
                body.starts_with(&format!("HTTP/2.0 GET /r{i} authority=gateway.test")),
                "{url}: {body}"
            );
            // The forwarding fields as over HTTP/1.1.
            assert!(
                body.contains("xff=127.0.0.1 proto=http te=- body=0"),
                "{url}: {body}"
            );
            assert_eq!(reply.header("x-upstream"), Some("h2"), "{url}");
        }
        // A body goes up whole.
        let request = http::Request::builder()
            .method("POST")
            .uri("/upload")
            .header("host", "gateway.test")
            .body(http_body_util::Full::new(Bytes::from(vec![b'x'; 100_000])))
            .unwrap();
        let reply = common::send(gw.addr, request).await;
        let body = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(
            body.starts_with("HTTP/2.0 POST /upload") && body.ends_with("body=100000"),
            "{url}: {body}"
        );
    }
    // An upgrade reaches an HTTP/2 upstream as a plain request, and its
    // answer (no 101) is the client's.
    let gw = https_upstream_gateway(
        &ca,
        &format!("http://127.0.0.1:{}", h2c.addr.port()),
        "http2 = true",
    )
    .await;
    let answer = common::raw_for(
        gw.addr,
        b"GET /ws HTTP/1.1\r\nHost: gateway.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        Duration::from_secs(2),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("HTTP/2.0 GET /ws"), "{answer}");
    // One multiplexed connection per gateway carried all its requests.
    assert_eq!(tls.connections.load(Ordering::Relaxed), 1);
    assert_eq!(h2c.connections.load(Ordering::Relaxed), 2);
}

/// A TCP relay to `target` that can go silent: once frozen, the
/// connections it carries at that moment forward nothing either way (their
/// sockets stay open, as with an upstream host that vanished without a
/// FIN), while later ones relay as before. It notes when the gateway closes
/// a frozen connection.
struct Relay {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    /// Connections numbered below this are frozen.
    frozen_below: Arc<AtomicUsize>,
    /// Frozen connections the gateway closed.
    closed_frozen: Arc<AtomicUsize>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let frozen_below = Arc::new(AtomicUsize::new(0));
        let closed_frozen = Arc::new(AtomicUsize::new(0));
        let (count, frozen, closed) = (
            accepted.clone(),
            frozen_below.clone(),
            closed_frozen.clone(),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let id = count.fetch_add(1, Ordering::SeqCst);
                let upstream = TcpStream::connect(target).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut upstream_read, mut upstream_write) = upstream.into_split();
                let (frozen_up, frozen_down) = (frozen.clone(), frozen.clone());
                let closed = closed.clone();
                // Gateway to upstream: dropped once frozen; the end is noted.
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        match client_read.read(&mut buf).await {
                            Ok(0) | Err(_) => {
                                if id < frozen_up.load(Ordering::SeqCst) {
                                    closed.fetch_add(1, Ordering::SeqCst);
                                }
                                return;
                            }
                            Ok(n) if id >= frozen_up.load(Ordering::SeqCst) => {
                                if upstream_write.write_all(&buf[..n]).await.is_err() {
                                    return;
                                }
                            }
                            Ok(_) => {}
                        }
                    }
                });
                // Upstream to gateway: dropped once frozen.
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n) = upstream_read.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        if id >= frozen_down.load(Ordering::SeqCst)
                            && client_write.write_all(&buf[..n]).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        Relay {
            addr,
            accepted,
            frozen_below,
            closed_frozen,
        }
    }

    /// Freezes every connection accepted so far.
    fn freeze(&self) {
        self.frozen_below
            .store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// An HTTP/2 upstream connection that goes silent (its host gone, no FIN)
/// is found out by PING: quiet for `read_timeout`, it is pinged, and with no
/// answer within `connect_timeout` it is closed, so the next request opens
/// a new connection instead of waiting on the dead one until `timeout`.
#[tokio::test]
async fn a_silent_http2_upstream_connection_is_pinged_and_replaced() {
    let ca = Ca::new();
    let h2c = H2Upstream::start(None).await;
    let relay = Relay::start(h2c.addr).await;
    let log = common::log::capture();
    let gw = https_upstream_gateway(
        &ca,
        &format!("http://127.0.0.1:{}", relay.addr.port()),
        "http2 = true\nread_timeout = \"500ms\"\nconnect_timeout = \"500ms\"\ntimeout = \"10s\"",
    )
    .await;
    assert_eq!(get(gw.addr, "/before", &[]).await.status, 200);
    assert_eq!(relay.accepted.load(Ordering::SeqCst), 1);
    relay.freeze();
    // Closed after read_timeout + connect_timeout (1 s).
    eventually(async || relay.closed_frozen.load(Ordering::SeqCst) != 0).await;
    assert_eq!(
        relay.closed_frozen.load(Ordering::SeqCst),
        1,
        "the gateway kept the silent connection: {}",
        log.text()
    );
    // A request that waited on the dead connection would end in a 504 at
    // `timeout`; this one is answered on a new connection.
    let reply = get(gw.addr, "/after", &[]).await;
    assert_eq!(reply.status, 200, "{}", log.text());
    assert_eq!(relay.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn an_http2_upstream_that_only_speaks_http_1_1_is_a_502_saying_so() {
    let ca = Ca::new();
    // ALPN offers nothing: the server never agrees to h2.
    let upstream = TlsUpstream::start(&ca.leaf(&["upstream.test"])).await;
    let url = format!("https://127.0.0.1:{}", upstream.addr.port());
    let capture = common::log::capture();
    let gw = https_upstream_gateway(
        &ca,
        &url,
        "http2 = true\nca = \"ca.pem\"\nsni = \"upstream.test\"",
    )
    .await;
    let reply = get(gw.addr, "/", &[]).await;
    assert_eq!(reply.status, 502, "{}", capture.text());
    let log = capture
        .when(|log| log.contains("did not agree to HTTP/2"))
        .await;
    assert!(log.contains("did not agree to HTTP/2 (ALPN h2)"), "{log}");
    // Nobody listening: a 502 too, and the next request tries again (a
    // 502, a connection refused; not the 503 of an upstream given up on).
    // The log says so once, not once per request: the URL's failures are
    // summarised (`upstream::health`).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Its own log, as a new process's.
    let capture = common::log::capture();
    let gw = https_upstream_gateway(&ca, &format!("http://127.0.0.1:{port}"), "http2 = true").await;
    for _ in 0..2 {
        assert_eq!(
            get(gw.addr, "/", &[]).await.status,
            502,
            "{}",
            capture.text()
        );
    }
    let log = capture.when(|log| log.contains("cannot connect")).await;
    assert_eq!(log.matches("cannot connect").count(), 1, "{log}");
}
