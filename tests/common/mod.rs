//! Test harness: the gateway on `127.0.0.1:0` with a config written by the
//! test — in this process ([`InProcess`], through `tollgate::run`, where
//! paused tokio time drives the limiter's clock) or as the real binary
//! ([`Gateway`], for the command line, signals and reloads) — a test
//! upstream served by hyper in-process, one config builder
//! ([`gateway_toml`]), and small HTTP clients (hyper for ordinary requests,
//! raw TCP for malformed ones).
#![allow(dead_code)]

pub mod certs;
pub mod jwt;
pub mod llm;
pub mod log;
pub mod needs;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, oneshot};
use tollgate::app::App;
use tollgate::config::Config;
use tollgate::limit::{NANOS_PER_SEC, TokioClock};

/// The limiter's time when an in-process gateway starts: a whole day since
/// the epoch (2023-11-15T00:00:00Z), so epoch-aligned windows start with it.
pub const IN_PROCESS_EPOCH: u64 = 19_676 * 86_400 * NANOS_PER_SEC;

/// A `gateway.toml` for tests: `[server]` on `127.0.0.1:0` with one worker
/// and the `server` lines, upstream `api` at `upstream`, then `rest`
/// (limits, routes, consumers…).
pub fn gateway_toml(upstream: &TestUpstream, server: &str, rest: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\n{server}\n\n\
         [upstreams.api]\nurl = \"{}\"\n\n{rest}",
        upstream.url()
    )
}

/// The gateway running inside the test, on the test's runtime, started by
/// `tollgate::run` on the listeners of `config` (port 0). Its limiter clock
/// is tokio's ([`TokioClock`], from [`IN_PROCESS_EPOCH`]): in a
/// `#[tokio::test(start_paused = true)]` test, `tokio::time::sleep` moves
/// the limiter's time as far as it sleeps, instantly. One worker whatever
/// the config says (the process never fixes `worker::init`). The config is
/// written to `dir` (where the files it names may be, and where
/// [`InProcess::reload`] reads it again, as `SIGHUP` makes the binary do).
/// Drained when [`InProcess::stop`] is awaited; stopped when dropped.
pub struct InProcess {
    pub addr: SocketAddr,
    /// The first `[server.tls]` listener, if the config has one.
    pub tls_addr: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    /// The `[decision]` listener, if the config has one.
    pub decision: Option<SocketAddr>,
    pub app: Arc<App>,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl InProcess {
    pub async fn start(config: &str) -> InProcess {
        InProcess::start_in(tempfile::tempdir().expect("tempdir"), config).await
    }

    /// As [`InProcess::start`], the limiter's clock starting at the wall
    /// clock's time instead of [`IN_PROCESS_EPOCH`]: for a test that
    /// compares with a clock outside the process (Redis `TIME`).
    pub async fn start_on_wall_time(config: &str) -> InProcess {
        InProcess::start_on_wall_time_in(tempfile::tempdir().expect("tempdir"), config).await
    }

    /// As [`InProcess::start_on_wall_time`], with the config written into
    /// `dir` (where the test put the files it names).
    pub async fn start_on_wall_time_in(dir: tempfile::TempDir, config: &str) -> InProcess {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("a clock after 1970");
        let anchor = u64::try_from(now.as_nanos()).expect("before 2554");
        InProcess::start_with(dir, config, Arc::new(TokioClock::starting_at(anchor))).await
    }

    /// As [`InProcess::start`], with the config written into `dir` (where
    /// the test put the files it names, e.g. certificates).
    pub async fn start_in(dir: tempfile::TempDir, config: &str) -> InProcess {
        let clock = Arc::new(TokioClock::starting_at(IN_PROCESS_EPOCH));
        InProcess::start_with(dir, config, clock).await
    }

    async fn start_with(
        dir: tempfile::TempDir,
        config: &str,
        clock: Arc<dyn tollgate::limit::Clock>,
    ) -> InProcess {
        let config_path = dir.path().join("gateway.toml");
        std::fs::write(&config_path, config).expect("write config");
        let config = Config::load(&config_path).unwrap_or_else(|error| panic!("{error}"));
        let listeners = tollgate::Listeners::bind(&config)
            .await
            .expect("bind the listeners");
        let urls = listeners.traffic_urls().expect("addresses");
        let first = |scheme: &str| {
            urls.iter()
                .find_map(|url| url.strip_prefix(scheme))
                .map(|addr| addr.parse::<SocketAddr>().expect("listen address"))
        };
        let tls_addr = first("https://");
        let admin = listeners.admin_addr().expect("admin address");
        let decision = listeners.decision_addr().expect("decision address");
        // A decision service alone has no proxy listener: `addr` is its.
        let addr = first("http://")
            .or(decision)
            .expect("a plain or decision listener");
        let app = App::with_clock(config, clock);
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        // Spawned, not polled yet: a test may reload at once, and the server
        // applies a configuration installed before its first poll
        // (`tests/reload.rs`'s listen-list test reloads so).
        let task = tokio::spawn(tollgate::run(listeners, app.clone(), shutdown));
        InProcess {
            addr,
            tls_addr,
            admin,
            decision,
            app,
            dir,
            config_path,
            stop: Some(stop),
            task,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Reads the config file again and installs it, as the binary does on
    /// `SIGHUP` (the same function): a bad file is counted and kept out.
    /// Returns the generation running afterwards.
    pub fn reload(&self) -> u64 {
        tollgate::reload::reload(&self.app, &self.config_path);
        self.app.snapshot().generation
    }

    /// Writes `config` over the config file and [reloads](InProcess::reload).
    pub fn reload_with(&self, config: &str) -> u64 {
        std::fs::write(&self.config_path, config).expect("write config");
        self.reload()
    }

    /// Signals the shutdown and waits for the drain to finish.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .expect("the gateway task")
            .expect("the gateway ran");
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long [`eventually`] polls: generous, for a debug build on a loaded
/// 2-core machine. Real time, so that it also bounds a wait under paused
/// time for what another thread or process does.
pub const EVENTUALLY: Duration = Duration::from_secs(30);

/// Polls `check` every 10 ms until it holds, for at most [`EVENTUALLY`];
/// returns whether it held, for the caller to assert with its own message.
/// Under paused time each poll moves tokio's clock by 10 ms.
pub async fn eventually(check: impl AsyncFnMut() -> bool) -> bool {
    eventually_within(EVENTUALLY, check).await
}

/// As [`eventually`], blocking, for code that waits off the runtime (a
/// process starting or exiting, a captured stderr): polls `check` every
/// 10 ms for at most `within`.
pub fn eventually_blocking(within: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// As [`eventually`], for at most `within`.
pub async fn eventually_within(within: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How long a started gateway may take to print its listeners: generous,
/// for a debug build on a loaded 2-core machine.
const STARTUP_DEADLINE: Duration = Duration::from_secs(60);

/// A running `tollgate run` process; killed when dropped.
pub struct Gateway {
    child: Child,
    pub addr: SocketAddr,
    /// The first `[server.tls]` listener, if the config has one.
    pub tls_addr: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    stderr: Arc<Mutex<String>>,
}

impl Gateway {
    /// Starts the gateway with `config` (a `gateway.toml` text); `{upstream}`
    /// in it is replaced by `upstream`. The traffic listener must be
    /// `127.0.0.1:0`, which the harness reads back from the startup line.
    pub fn start(config: &str) -> Gateway {
        Gateway::start_with_args(config, &[])
    }

    pub fn start_with_args(config: &str, args: &[&str]) -> Gateway {
        Gateway::start_in(tempfile::tempdir().expect("tempdir"), config, args)
    }

    /// As [`Gateway::start_with_args`], with the config written into `dir`
    /// (where the test put the files it names, e.g. certificates).
    pub fn start_in(dir: tempfile::TempDir, config: &str, args: &[&str]) -> Gateway {
        Gateway::start_in_with_env(dir, config, args, &[])
    }

    /// As [`Gateway::start_in`], with `env` added to the process's
    /// environment (e.g. a variable that `password_env` names).
    pub fn start_in_with_env(
        dir: tempfile::TempDir,
        config: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Gateway {
        let config_path = dir.path().join("gateway.toml");
        std::fs::write(&config_path, config).expect("write config");
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("run")
            .arg("-c")
            .arg(&config_path)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tollgate");
        // Every line goes to the capture; the startup lines also to this
        // thread, which waits for them with a deadline, so a gateway that
        // hangs before listening fails the test instead of hanging it.
        let stderr = child.stderr.take().expect("stderr");
        let stderr_text = Arc::new(Mutex::new(String::new()));
        let sink = stderr_text.clone();
        let (startup, startup_lines) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 0 {
                sink.lock().unwrap().push_str(&line);
                let _ = startup.send(std::mem::take(&mut line));
            }
        });
        let mut addr = None;
        let mut admin = None;
        let mut tls_addr = None;
        let expect_tls = config.contains("[server.tls]");
        // Startup lines come first; the admin line (if any) follows the listeners.
        let expect_admin = config.contains("admin");
        let deadline = std::time::Instant::now() + STARTUP_DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = match startup_lines.recv_timeout(left) {
                Ok(line) => line,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    let _ = child.wait();
                    panic!(
                        "tollgate exited before listening:\n{}",
                        stderr_text.lock().unwrap()
                    );
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "tollgate was not listening after {STARTUP_DEADLINE:?}:\n{}",
                        stderr_text.lock().unwrap()
                    );
                }
            };
            if let Some(rest) = line.trim().strip_prefix("listening on http://") {
                addr.get_or_insert(rest.parse().expect("listen address"));
            } else if let Some(rest) = line.trim().strip_prefix("listening on https://") {
                tls_addr.get_or_insert(rest.parse().expect("TLS listen address"));
            } else if let Some(rest) = line.trim().strip_prefix("admin on http://") {
                admin = Some(rest.parse().expect("admin address"));
            }
            if addr.is_some()
                && (!expect_admin || admin.is_some())
                && (!expect_tls || tls_addr.is_some())
            {
                break;
            }
        }
        Gateway {
            child,
            addr: addr.expect("address"),
            tls_addr,
            admin,
            dir,
            config_path,
            stderr: stderr_text,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Everything the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the captured stderr satisfies `done` (the capture runs on
    /// its own thread, a little behind the process), at most `timeout`;
    /// returns the stderr either way.
    pub fn stderr_when(&self, done: impl Fn(&str) -> bool, timeout: Duration) -> String {
        eventually_blocking(timeout, || done(&self.stderr()));
        self.stderr()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit, at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        wait_exit(&mut self.child, timeout)
    }
}

/// Waits for `child` to exit, at most `timeout` (blocking: call it off the
/// runtime when the test's tasks must run meanwhile).
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let mut exited = None;
    eventually_blocking(timeout, || {
        exited = child.try_wait().ok().flatten();
        exited.is_some()
    });
    exited
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `tollgate ARGS` to completion; returns (exit code, stdout, stderr).
pub fn tollgate(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .expect("run tollgate");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// What the test upstream saw of one request.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An in-process upstream. Paths:
/// - `/stream`: sends `first\n`, waits for [`TestUpstream::release`], sends `last\n`;
/// - `/slow/MS`: answers after MS milliseconds;
/// - `/hop`: answers with hop-by-hop headers that must not reach the client;
/// - `/cost/N`: answers with `x-cost: N`;
/// - `/close`: answers, then closes its keep-alive connection;
/// - `/upgrade`: switches protocols (101, to the one asked for) to an echo of every byte;
/// - anything else: 200 with body `echo`, recording what it saw.
pub struct TestUpstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Requests that arrived, counted before `/slow/MS` waits.
    arrived: Arc<std::sync::atomic::AtomicUsize>,
    release: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl TestUpstream {
    pub async fn start() -> TestUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let arrived = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let release = Arc::new(Notify::new());
        let (seen2, arrived2, release2) = (seen.clone(), arrived.clone(), release.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                // Without it a chunk written behind an unacknowledged head
                // waits for a delayed ACK: real time, which paused time
                // skips as idle.
                let _ = stream.set_nodelay(true);
                let (seen, arrived, release) = (seen2.clone(), arrived2.clone(), release2.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let (seen, release) = (seen.clone(), release.clone());
                        arrived.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        async move {
                            Ok::<_, hyper::Error>(upstream_answer(request, seen, release).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        TestUpstream {
            addr,
            seen,
            arrived,
            release,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Lets a `/stream` response send its last chunk.
    pub fn release(&self) {
        self.release.notify_one();
    }

    pub fn last_seen(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the upstream saw a request")
    }

    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Requests that reached the upstream, answered or not yet.
    pub fn arrived(&self) -> usize {
        self.arrived.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type UpstreamBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

async fn upstream_answer(
    request: Request<Incoming>,
    seen: Arc<Mutex<Vec<Seen>>>,
    release: Arc<Notify>,
) -> Response<UpstreamBody> {
    let path = request.uri().path().to_owned();
    if path == "/stream" {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(2);
        tokio::spawn(async move {
            let _ = tx.send(Bytes::from_static(b"first\n")).await;
            release.notified().await;
            let _ = tx.send(Bytes::from_static(b"last\n")).await;
        });
        return Response::new(BodyExt::boxed(ChannelBody(rx)));
    }
    if path == "/upgrade" {
        // Switch to an echo protocol: every byte sent comes back.
        let mut request = request;
        // Switches to the protocol asked for (the gateway tunnels only the
        // allowed ones), or to `echo` when told to switch unasked.
        let protocol = request
            .headers()
            .get("upgrade")
            .cloned()
            .unwrap_or_else(|| "echo".parse().unwrap());
        let on_upgrade = hyper::upgrade::on(&mut request);
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                let (mut reader, mut writer) = tokio::io::split(TokioIo::new(upgraded));
                let _ = tokio::io::copy(&mut reader, &mut writer).await;
            }
        });
        let mut response = Response::new(BodyExt::boxed(
            Full::new(Bytes::new()).map_err(|e| match e {}),
        ));
        *response.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
        response.headers_mut().insert("upgrade", protocol);
        response
            .headers_mut()
            .insert("connection", "upgrade".parse().unwrap());
        return response;
    }
    if let Some(ms) = path.strip_prefix("/slow/") {
        let ms: u64 = ms.parse().unwrap_or(100);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let method = request.method().to_string();
    let uri = request.uri().to_string();
    let headers = request
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    seen.lock().unwrap().push(Seen {
        method,
        uri,
        headers,
        body: body.clone(),
    });
    let mut response = Response::new(BodyExt::boxed(
        Full::new(Bytes::from_static(b"echo")).map_err(|e| match e {}),
    ));
    response
        .headers_mut()
        .insert("x-upstream", "yes".parse().unwrap());
    if path == "/close" {
        // The upstream ends its keep-alive connection after this response.
        response
            .headers_mut()
            .insert("connection", "close".parse().unwrap());
    }
    if let Some(cost) = path.strip_prefix("/cost/") {
        response
            .headers_mut()
            .insert("x-cost", cost.parse().unwrap());
    }
    if path == "/own-limits" {
        // An upstream that sends rate-limit fields of its own.
        let headers = response.headers_mut();
        headers.insert("ratelimit", "\"upstream\";r=5".parse().unwrap());
        headers.insert("x-ratelimit-remaining", "999".parse().unwrap());
        headers.append("x-ratelimit-remaining", "998".parse().unwrap());
        headers.insert("ratelimit-limit", "7".parse().unwrap());
    }
    if path == "/hop" {
        let headers = response.headers_mut();
        headers.insert("connection", "x-upstream-secret".parse().unwrap());
        headers.insert("x-upstream-secret", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert("x-upstream-kept", "1".parse().unwrap());
    }
    response
}

/// A response body fed chunk by chunk from a channel.
struct ChannelBody(tokio::sync::mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// A response read by [`send`].
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }
}

/// Sends one request on a new connection; its body is read as it comes.
pub async fn send_streaming(
    addr: SocketAddr,
    request: Request<Full<Bytes>>,
) -> hyper::Response<hyper::body::Incoming> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    sender.send_request(request).await.expect("response")
}

/// Sends one request on a new connection and reads the whole response.
pub async fn send(addr: SocketAddr, request: Request<Full<Bytes>>) -> Reply {
    read_reply(send_streaming(addr, request).await).await
}

/// A response read whole.
pub async fn read_reply(response: hyper::Response<hyper::body::Incoming>) -> Reply {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

/// `GET path` with the given headers.
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut builder = Request::get(path).header("host", "gateway.test");
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    send(addr, builder.body(Full::new(Bytes::new())).unwrap()).await
}

/// Writes raw bytes and reads until the server closes the connection,
/// which it must do within `timeout` of the wall clock: a gateway that
/// hangs instead of closing fails the test (with what it had sent).
pub async fn raw(addr: SocketAddr, bytes: &[u8], timeout: Duration) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    let closed = within_wall_clock(timeout, stream.read_to_end(&mut out))
        .await
        .is_some();
    let out = String::from_utf8_lossy(&out).into_owned();
    assert!(
        closed,
        "the connection was still open after {timeout:?}; read so far: {out:?}"
    );
    out
}

/// `future`'s output, or `None` once `limit` has passed on the wall clock:
/// the bound of a guard against a hang, which must hold under paused time
/// too. A paused clock jumps to the next timer whenever the runtime is
/// idle — also while the kernel has yet to hand over a connection or bytes
/// already sent on loopback (a busy machine defers that work) — so a guard
/// on tokio's clock can fire before the gateway has seen the client, let
/// alone run the timer the test is about. Waits whose length is the test's
/// subject stay on tokio's clock.
pub async fn within_wall_clock<F: std::future::Future>(
    limit: Duration,
    future: F,
) -> Option<F::Output> {
    let (expired, expiry) = oneshot::channel::<()>();
    // A thread, not a tokio timer: its sleep is the wall clock's. It outlives
    // a future that finishes first, asleep, and sends to no one.
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        let _ = expired.send(());
    });
    tokio::select! {
        biased;
        output = future => Some(output),
        _ = expiry => None,
    }
}

/// Writes raw bytes and reads what arrives for `wait` (tokio's clock),
/// whether or not the server closes: for answers on a connection that
/// stays open.
pub async fn raw_for(addr: SocketAddr, bytes: &[u8], wait: Duration) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    let _ = tokio::time::timeout(wait, stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Replaces `{upstream}` in a config template.
pub fn config_with(template: &str, vars: &HashMap<&str, String>) -> String {
    let mut text = template.to_owned();
    for (k, v) in vars {
        text = text.replace(&format!("{{{k}}}"), v);
    }
    text
}

pub mod capacity;
pub mod nginx;
pub mod openmetrics;
pub mod redis;

/// What a [`RawUpstream`] received on one connection.
#[derive(Debug, Clone, Default)]
pub struct RawConnection {
    /// Every byte, exactly as it arrived.
    pub bytes: Vec<u8>,
    /// Complete requests found in `bytes` (and answered).
    pub requests: usize,
    /// The gateway closed the connection.
    pub closed: bool,
}

/// An upstream that records the exact bytes of each connection and answers
/// every complete request `200` with body `ok`. It reads request framing
/// itself (a `Content-Length` or a chunked body) and nothing else of HTTP:
/// what the gateway sends is judged by the test from `bytes`.
pub struct RawUpstream {
    pub addr: SocketAddr,
    pub connections: Arc<Mutex<Vec<RawConnection>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RawUpstream {
    pub async fn start() -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(Mutex::new(Vec::<RawConnection>::new()));
        let shared = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let index = {
                    let mut all = shared.lock().unwrap();
                    all.push(RawConnection::default());
                    all.len() - 1
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let mut unparsed = Vec::new();
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = stream.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            shared.lock().unwrap()[index].closed = true;
                            return;
                        }
                        shared.lock().unwrap()[index]
                            .bytes
                            .extend_from_slice(&buf[..n]);
                        unparsed.extend_from_slice(&buf[..n]);
                        while let Some(len) = raw_request_len(&unparsed) {
                            unparsed.drain(..len);
                            shared.lock().unwrap()[index].requests += 1;
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if stream.write_all(answer).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        RawUpstream {
            addr,
            connections,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A copy of what every connection received so far.
    pub fn connections(&self) -> Vec<RawConnection> {
        self.connections.lock().unwrap().clone()
    }

    /// Every byte received, all connections in order.
    pub fn all_bytes(&self) -> Vec<u8> {
        self.connections()
            .into_iter()
            .flat_map(|c| c.bytes)
            .collect()
    }

    /// Complete requests received, all connections.
    pub fn requests(&self) -> usize {
        self.connections().iter().map(|c| c.requests).sum()
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The length of the complete request at the start of `bytes`, framed by
/// `Content-Length` or chunked (as the gateway sends them), if it is there.
pub fn raw_request_len(bytes: &[u8]) -> Option<usize> {
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_ascii_lowercase();
    let field = |name: &str| {
        head.split("\r\n")
            .find_map(|line| line.strip_prefix(name).map(|v| v.trim().to_owned()))
    };
    if field("transfer-encoding:").is_some() {
        let mut at = head_end;
        loop {
            let line_end = at + bytes[at..].windows(2).position(|w| w == b"\r\n")?;
            let line = std::str::from_utf8(&bytes[at..line_end]).ok()?;
            let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                // No trailers from the gateway: the empty line.
                return (bytes.len() >= at + 2 && &bytes[at..at + 2] == b"\r\n").then_some(at + 2);
            }
            at += size + 2;
            if bytes.len() < at {
                return None;
            }
        }
    }
    let length: usize = field("content-length:").map_or(Some(0), |v| v.parse().ok())?;
    (bytes.len() >= head_end + length).then_some(head_end + length)
}
