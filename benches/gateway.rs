//! Gateway micro-benchmarks: the request path's steps one by one, then whole
//! requests through an in-process gateway.
//!
//! - **identify**: `client_ip::resolve` on a four-entry `X-Forwarded-For` (three
//!   trusted hops, and trusted CIDRs), then `keys::extract` for a
//!   `header:x-api-key` key and for an `ip` key.
//! - **route**: `Router::find` over 50 generated routes (first, middle, last,
//!   and no match — the last two scan every route).
//! - **request**: one keep-alive HTTP/1.1 connection sending requests one at a
//!   time, (a) straight to the in-process hyper upstream (the peer: what a
//!   request costs without a gateway), (b) through tollgate with a token
//!   bucket that never denies, (c) through tollgate denied by a spent token
//!   bucket (429, the upstream untouched). Client, gateway and upstream share
//!   one current-thread runtime, so each figure is the whole CPU cost of a
//!   request on one core, and (b) − (a) is the gateway's share.
//!
//! Before the request benches, a counting global allocator prints the heap
//! allocations per request of each path (client and upstream included, so
//! the gateway's share is the difference to `direct_upstream`). The
//! limiter's own decisions are measured in `benches/limiter.rs`, and
//! `tests/limit_alloc.rs` asserts that the decision path allocates nothing.
//!
//! Run: `cargo bench --bench gateway -- --warm-up-time 1 --measurement-time 3`

use std::fmt::Write as _;
use std::hint::black_box;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, Throughput};
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;

use tollgate::app::App;
use tollgate::config::{Config, KeyPart};
use tollgate::identity::client_ip::{ClientIpPolicy, ForwardHeader, Trust, client_net, resolve};
use tollgate::identity::keys::{RequestFacts, extract};
use tollgate::routing::Router;

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

const XFF: &str = "203.0.113.7, 198.51.100.23, 10.1.2.3, 10.4.5.6";

fn policy(trust: Trust) -> ClientIpPolicy {
    ClientIpPolicy {
        trust,
        header: ForwardHeader::XForwardedFor,
        ipv4_prefix: 32,
        ipv6_prefix: 64,
    }
}

fn identify(c: &mut Criterion) {
    let mut group = c.benchmark_group("identify");
    group.throughput(Throughput::Elements(1));
    let peer: IpAddr = "10.9.9.9".parse().unwrap();
    let hops = policy(Trust::Hops(3));
    let cidrs = policy(Trust::Cidrs(vec!["10.0.0.0/8".parse().unwrap()]));
    let (parts, _) = Request::get("/v1/things?id=7")
        .header("x-forwarded-for", XFF)
        .header("x-api-key", "k-3f9a2c71d0e84b56a1c9")
        .header("user-agent", "bench/1.0")
        .body(())
        .unwrap()
        .into_parts();
    let xff = || {
        parts
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.as_bytes())
    };
    assert_eq!(
        resolve(peer, xff(), &hops),
        "198.51.100.23".parse::<IpAddr>().unwrap()
    );
    assert_eq!(
        resolve(peer, xff(), &cidrs),
        "198.51.100.23".parse::<IpAddr>().unwrap()
    );
    group.bench_function("resolve_xff_4_hops/trusted_hops_3", |b| {
        b.iter(|| resolve(black_box(peer), xff(), black_box(&hops)))
    });
    group.bench_function("resolve_xff_4_hops/trusted_cidrs", |b| {
        b.iter(|| resolve(black_box(peer), xff(), black_box(&cidrs)))
    });

    let facts = RequestFacts {
        client: client_net(resolve(peer, xff(), &hops), &hops),
        route: "api",
        consumer: None,
        body: None,
        token: None,
    };
    let header_key = [KeyPart::Header(HeaderName::from_static("x-api-key"))];
    let ip_key = [KeyPart::Ip];
    assert!(extract(&header_key, &parts, &facts).is_some());
    group.bench_function("extract/header_x_api_key", |b| {
        b.iter(|| extract(black_box(&header_key), black_box(&parts), black_box(&facts)))
    });
    group.bench_function("extract/ip", |b| {
        b.iter(|| extract(black_box(&ip_key), black_box(&parts), black_box(&facts)))
    });
    group.bench_function("resolve_and_extract_ip", |b| {
        b.iter(|| {
            let ip = resolve(black_box(peer), xff(), &hops);
            let facts = RequestFacts {
                client: client_net(ip, &hops),
                route: "api",
                consumer: None,
                body: None,
                token: None,
            };
            extract(black_box(&ip_key), &parts, &facts)
        })
    });
    group.finish();
}

/// 50 routes of the shapes a real file has: prefixes with methods, exact
/// paths, a host match and a header match, each answered by the gateway.
fn fifty_routes() -> String {
    let mut text = String::from("[server]\nlisten = \"127.0.0.1:0\"\n");
    for i in 0..50 {
        let matcher = match i % 4 {
            0 => format!("{{ path_prefix = \"/svc{i:02}/\", methods = [\"GET\", \"POST\"] }}"),
            1 => format!("{{ path = \"/svc{i:02}/item\" }}"),
            2 => format!("{{ path_prefix = \"/svc{i:02}/\", host = \"api{i}.example.com\" }}"),
            _ => format!(
                "{{ path_prefix = \"/svc{i:02}/\", header = {{ \"x-tenant\" = \"t{i}\" }} }}"
            ),
        };
        let _ = write!(
            text,
            "\n[[routes]]\nname = \"r{i:02}\"\nmatch = {matcher}\nrespond = {{ status = 200 }}\n"
        );
    }
    text
}

fn route(c: &mut Criterion) {
    let config = Config::from_bytes(Path::new("bench.toml"), fifty_routes().as_bytes())
        .expect("generated routes are valid");
    let router = Router::new(&config);
    let request = |uri: &str, headers: &[(&str, &str)]| {
        let mut builder = Request::get(uri).header("host", "api49.example.com");
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(()).unwrap().into_parts().0
    };
    let cases = [
        ("first", request("/svc00/users/1", &[]), Some(0)),
        ("middle_25", request("/svc25/item", &[]), Some(25)),
        ("last_49", request("/svc49/item", &[]), Some(49)),
        ("no_match", request("/nothing/here", &[]), None),
    ];
    let mut group = c.benchmark_group("route_50");
    group.throughput(Throughput::Elements(1));
    for (name, parts, expected) in &cases {
        assert_eq!(router.find(parts), *expected, "{name}");
        group.bench_function(*name, |b| b.iter(|| router.find(black_box(parts))));
    }
    group.finish();
}

/// The in-process upstream: `200 ok` for every request, like nginx `return 200`.
async fn start_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_request: Request<Incoming>| async {
                    Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from_static(b"ok\n"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Starts tollgate in-process in front of `upstream`; the limit is a token
/// bucket of `capacity` refilled at `refill`, keyed by client IP.
async fn start_gateway(
    upstream: SocketAddr,
    capacity: u64,
    refill: &str,
) -> (SocketAddr, watch::Sender<bool>) {
    let text = format!(
        r#"
[server]
listen = "127.0.0.1:0"

[upstreams.up]
url = "http://{upstream}"

[limits.per_ip]
key = "ip"
algorithm = "token_bucket"
capacity = {capacity}
refill = "{refill}"

[[routes]]
name = "all"
match = {{ path_prefix = "/" }}
upstream = "up"
limits = ["per_ip"]
"#
    );
    let config = Config::from_bytes(Path::new("bench.toml"), text.as_bytes()).unwrap();
    let listen = config.server.listen.clone();
    let listeners = tollgate::conn::bind(&listen).unwrap();
    let addr = listeners[0].local_addr().unwrap();
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let server = tollgate::conn::start(App::new(config), listeners, shutdown_rx).unwrap();
    tokio::spawn(server.run());
    (addr, shutdown_tx)
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// One keep-alive client connection.
async fn connect(addr: SocketAddr) -> Sender {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    sender
}

/// Sends `n` requests one after another; checks every status.
async fn send_many(sender: &mut Sender, n: u64, expect: StatusCode) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        sender.ready().await.unwrap();
        let request = Request::get("/v1/things")
            .header("host", "bench.local")
            .body(Empty::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), expect);
        let body = response.into_body().collect().await.unwrap();
        black_box(body);
    }
    start.elapsed()
}

fn request(c: &mut Criterion) {
    let runtime = current_thread_runtime();
    let (mut direct, mut allow, mut deny, _guards) = runtime.block_on(async {
        let upstream = start_upstream().await;
        // Allow: a billion-token bucket refilled at a billion per second.
        let allow_gateway = start_gateway(upstream, 1_000_000_000, "1000000000/s").await;
        // Deny: one token per hour, spent by the first request below.
        let deny_gateway = start_gateway(upstream, 1, "1/h").await;
        let direct = connect(upstream).await;
        let allow = connect(allow_gateway.0).await;
        let mut deny = connect(deny_gateway.0).await;
        send_many(&mut deny, 1, StatusCode::OK).await;
        (direct, allow, deny, (allow_gateway.1, deny_gateway.1))
    });
    // Allocations per request, after a warm-up (pools and buffers in place).
    // One thread runs everything, so the counter sees only these requests.
    for (name, sender, status) in [
        ("direct_upstream", &mut direct, StatusCode::OK),
        ("tollgate_allow", &mut allow, StatusCode::OK),
        ("tollgate_deny", &mut deny, StatusCode::TOO_MANY_REQUESTS),
    ] {
        const N: u64 = 1_000;
        runtime.block_on(send_many(sender, N, status));
        let before = counting_alloc::allocations();
        runtime.block_on(send_many(sender, N, status));
        let after = counting_alloc::allocations();
        println!(
            "allocations per request: {name}: {:.1}",
            (after - before) as f64 / N as f64
        );
    }
    let mut group = c.benchmark_group("request");
    group.throughput(Throughput::Elements(1));
    group.bench_function("direct_upstream", |b| {
        b.iter_custom(|n| runtime.block_on(send_many(&mut direct, n, StatusCode::OK)))
    });
    group.bench_function("tollgate_allow", |b| {
        b.iter_custom(|n| runtime.block_on(send_many(&mut allow, n, StatusCode::OK)))
    });
    group.bench_function("tollgate_deny", |b| {
        b.iter_custom(|n| runtime.block_on(send_many(&mut deny, n, StatusCode::TOO_MANY_REQUESTS)))
    });
    group.finish();
}

/// A current-thread runtime: client, gateway and upstream on one core.
fn current_thread_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn main() {
    let mut criterion = Criterion::default().configure_from_args();
    identify(&mut criterion);
    route(&mut criterion);
    request(&mut criterion);
    criterion.final_summary();
}
