//! The decision service on every worker (`workers = 2`), end to end through
//! real sockets: the `[decision]` listener has one `SO_REUSEPORT` socket per
//! worker, like the traffic's; gRPC calls and `/auth` requests from many
//! connections at once are all answered (a worker that did not serve its
//! socket would leave the connections the kernel gave it unanswered), and
//! they decide one limit for the process. The binary: only a process fixes
//! the worker count.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::redis::free_port;
use common::{Gateway, get};
use tollgate::envoy_proto::rate_limit_descriptor::Entry;
use tollgate::envoy_proto::rate_limit_response::Code;
use tollgate::envoy_proto::{RateLimitDescriptor, RateLimitRequest, RateLimitServiceClient};
use tonic::transport::Endpoint;

/// Enough connections that both workers' sockets get some (the kernel hashes
/// each connection to one; all 16 on one side has odds of 1 in 32768).
const CONNECTIONS: usize = 16;

/// How long all the calls may take, generously (a debug build on a loaded
/// machine): a worker that does not serve its socket fails the test here
/// instead of hanging it.
const WITHIN: Duration = Duration::from_secs(120);

fn config(decision: u16) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 2

[decision]
listen = "127.0.0.1:{decision}"

[client_ip]
trusted_cidrs = ["127.0.0.0/8"]

[limits.per_user]
algorithm = "token_bucket"
capacity = 50
refill = "1/h"

[limits.per_ip]
key = "ip"
algorithm = "token_bucket"
capacity = 20
refill = "1/h"

[[decision.descriptors]]
domain = "edge"
match = [{{ key = "user" }}]
limits = ["per_user"]

[[routes]]
name = "api"
match = {{ path_prefix = "/api" }}
limits = ["per_ip"]
"#
    )
}

/// The process's listening sockets on `port` (Linux: `/proc/PID/net/tcp`
/// lists the network namespace's; state `0A` is LISTEN).
fn listening_sockets(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let local = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[1].ends_with(&local) && fields[3] == "0A"
        })
        .count()
}

/// `calls` gRPC decisions for user `u` on a connection of its own.
async fn grpc_calls(decision: SocketAddr, calls: usize) -> Vec<Code> {
    let channel = Endpoint::from_shared(format!("http://{decision}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = RateLimitServiceClient::new(channel);
    let mut codes = Vec::with_capacity(calls);
    for _ in 0..calls {
        let request = RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".to_owned(),
                    value: "u".to_owned(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        };
        let response = client
            .should_rate_limit(request)
            .await
            .expect("a decision")
            .into_inner();
        codes.push(Code::try_from(response.overall_code).expect("a code"));
    }
    codes
}

#[tokio::test]
async fn decisions_on_two_workers_are_all_answered_and_share_one_limit() {
    let port = free_port();
    let gw = Gateway::start(&config(port));
    let decision: SocketAddr = ([127, 0, 0, 1], port).into();
    if cfg!(target_os = "linux") {
        assert_eq!(listening_sockets(port), 2, "one decision socket per worker");
    }

    // gRPC: 16 connections of 10 calls at once, one user with a bucket of
    // 50: every call answered, exactly 50 of them OK.
    let calls = async {
        let clients: Vec<_> = (0..CONNECTIONS)
            .map(|_| tokio::spawn(grpc_calls(decision, 10)))
            .collect();
        let mut codes = Vec::new();
        for client in clients {
            codes.extend(client.await.expect("client task"));
        }
        codes
    };
    let codes = tokio::time::timeout(WITHIN, calls)
        .await
        .expect("every gRPC call answered");
    assert_eq!(codes.len(), CONNECTIONS * 10);
    let ok = codes.iter().filter(|&&c| c == Code::Ok).count();
    let over = codes.iter().filter(|&&c| c == Code::OverLimit).count();
    assert_eq!((ok, over), (50, CONNECTIONS * 10 - 50), "{codes:?}");

    // `/auth`: 32 requests, each on a connection of its own, for one
    // client address with a bucket of 20.
    let auths = async {
        let requests: Vec<_> = (0..2 * CONNECTIONS)
            .map(|_| {
                tokio::spawn(async move {
                    // As Traefik's ForwardAuth sends them.
                    let headers = [
                        ("x-forwarded-method", "GET"),
                        ("x-forwarded-proto", "https"),
                        ("x-forwarded-host", "api.example"),
                        ("x-forwarded-uri", "/api/items"),
                        ("x-forwarded-port", "443"),
                        ("x-forwarded-for", "203.0.113.5"),
                        ("x-real-ip", "203.0.113.5"),
                    ];
                    get(decision, "/auth", &headers).await.status
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for request in requests {
            statuses.push(request.await.expect("request task"));
        }
        statuses
    };
    let statuses = tokio::time::timeout(WITHIN, auths)
        .await
        .expect("every /auth request answered");
    let allowed = statuses.iter().filter(|&&s| s == 200).count();
    let denied = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(
        (allowed, denied),
        (20, 2 * CONNECTIONS - 20),
        "{statuses:?}"
    );

    // Both workers count into the same series.
    let metrics = get(gw.admin.expect("an admin listener"), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    for line in [
        r#"tollgate_ratelimit_decisions_total{route="api",limit="per_ip",outcome="allowed",front="auth"} 20"#,
        r#"tollgate_ratelimit_decisions_total{route="api",limit="per_ip",outcome="denied",front="auth"} 12"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
}
