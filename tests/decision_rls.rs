//! Envoy's rate-limit service end to end: a gRPC client generated from the
//! same protos calls `ShouldRateLimit` on the decision listener over a
//! real socket (h2c), and `POST /json` answers the same calls as proto3
//! JSON.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{InProcess, get, send};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tollgate::envoy_proto::rate_limit_descriptor::{Entry, RateLimitOverride};
use tollgate::envoy_proto::rate_limit_response::Code;
use tollgate::envoy_proto::rate_limit_response::rate_limit::Unit;
use tollgate::envoy_proto::{
    RateLimitDescriptor, RateLimitRequest, RateLimitResponse, RateLimitServiceClient, RateLimitUnit,
};
use tonic::transport::{Channel, Endpoint};

const CONFIG: &str = r#"
[server]
admin = "127.0.0.1:0"

[decision]
listen = "127.0.0.1:0"

[limits.per_address]
algorithm = "fixed_window"
limit = 5
window = "1m"

[limits.per_user]
algorithm = "token_bucket"
capacity = 1
refill = "1/h"

[limits.watch]
algorithm = "fixed_window"
limit = 1
window = "1h"
shadow = true

[[decision.descriptors]]
domain = "edge"
match = [{ key = "remote_address" }]
limits = ["per_address"]

[[decision.descriptors]]
domain = "edge"
match = [{ key = "user" }]
limits = ["per_user"]

[[decision.descriptors]]
domain = "edge"
match = [{ key = "path", value = "/watched*" }]
limits = ["watch"]
"#;

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn call(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

/// [`CONFIG`] with `store` (a `[store]` section), for the gateways on the
/// wall clock (Redis's): there the address's limit is a bucket of 5
/// refilled 5/h, not the 1-minute fixed window, since a window aligned to
/// the epoch may roll over between two calls of a test and admit more than
/// it counts (a bucket gives a token back only after 12 minutes).
fn on_redis(store: &str) -> String {
    let window = "algorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"";
    assert!(CONFIG.contains(window));
    CONFIG
        .replace(
            window,
            "algorithm = \"token_bucket\"\ncapacity = 5\nrefill = \"5/h\"",
        )
        .replace("[decision]", &format!("{store}\n[decision]"))
}

async fn client(gateway: &InProcess) -> RateLimitServiceClient<Channel> {
    let url = format!("http://{}", gateway.decision.expect("a decision listener"));
    let channel = Endpoint::from_shared(url)
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    RateLimitServiceClient::new(channel)
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("a decision")
        .into_inner()
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

async fn metrics(gateway: &InProcess) -> String {
    let reply = get(gateway.admin.unwrap(), "/metrics", &[]).await;
    String::from_utf8_lossy(&reply.body).into_owned()
}

#[tokio::test]
async fn one_descriptor_is_counted_and_refused_with_envoys_fields() {
    let gateway = InProcess::start(CONFIG).await;
    let mut rls = client(&gateway).await;
    let by_address = || call("edge", vec![descriptor(&[("remote_address", "10.0.0.1")])]);
    for left in (0..5).rev() {
        let answer = ask(&mut rls, by_address()).await;
        assert_eq!(answer.overall_code, Code::Ok as i32);
        let status = &answer.statuses[0];
        assert_eq!(status.code, Code::Ok as i32);
        assert_eq!(status.limit_remaining, left);
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit, limit.unit),
            ("per_address", 5, Unit::Minute as i32)
        );
        assert_eq!(
            header(&answer, "ratelimit-policy"),
            Some("\"per_address\";q=5;w=60")
        );
        assert!(header(&answer, "retry-after").is_none());
    }
    let over = ask(&mut rls, by_address()).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    assert_eq!(over.statuses[0].code, Code::OverLimit as i32);
    let reset = over.statuses[0].duration_until_reset.unwrap();
    assert!((1..=60).contains(&reset.seconds), "{reset:?}");
    assert_eq!(
        header(&over, "retry-after"),
        Some(reset.seconds.to_string().as_str())
    );
    assert!(
        header(&over, "ratelimit")
            .unwrap()
            .starts_with("\"per_address\";r=0;t=")
    );
    // Another address has its own count.
    let other = ask(
        &mut rls,
        call("edge", vec![descriptor(&[("remote_address", "10.0.0.2")])]),
    )
    .await;
    assert_eq!(other.overall_code, Code::Ok as i32);

    let text = metrics(&gateway).await;
    assert!(
        text.contains(
            r#"tollgate_ratelimit_decisions_total{route="edge",limit="per_address",outcome="allowed",front="rls"} 6"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"tollgate_ratelimit_decisions_total{route="edge",limit="per_address",outcome="denied",front="rls"} 1"#
        ),
        "{text}"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn the_descriptors_of_a_call_are_one_stack_all_or_nothing() {
    let gateway = InProcess::start(CONFIG).await;
    let mut rls = client(&gateway).await;
    let both = |user: &str| {
        call(
            "edge",
            vec![
                descriptor(&[("remote_address", "10.0.0.9")]),
                descriptor(&[("user", user)]),
                descriptor(&[("unmatched", "x")]),
            ],
        )
    };
    let first = ask(&mut rls, both("alice")).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(first.statuses.len(), 3);
    assert_eq!(first.statuses[0].limit_remaining, 4);
    assert_eq!(first.statuses[1].limit_remaining, 0);
    assert!(
        first.statuses[2].current_limit.is_none(),
        "no rule: OK, no limit"
    );
    // alice is out of tokens: the call is refused, and her address is not charged.
    for _ in 0..3 {
        let refused = ask(&mut rls, both("alice")).await;
        assert_eq!(refused.overall_code, Code::OverLimit as i32);
        assert_eq!(refused.statuses[0].code, Code::Ok as i32);
        assert_eq!(refused.statuses[1].code, Code::OverLimit as i32);
        assert_eq!(refused.statuses[2].code, Code::Ok as i32);
    }
    let bob = ask(&mut rls, both("bob")).await;
    assert_eq!(bob.overall_code, Code::Ok as i32);
    assert_eq!(
        bob.statuses[0].limit_remaining, 3,
        "the three refused calls charged the address nothing"
    );
    let user = bob.statuses[1].current_limit.as_ref().unwrap();
    assert_eq!((user.requests_per_unit, user.unit), (1, Unit::Hour as i32));
    gateway.stop().await;
}

#[tokio::test]
async fn hits_addend_overrides_shadow_and_unknown_domains() {
    let gateway = InProcess::start(CONFIG).await;
    let mut rls = client(&gateway).await;
    // The request's hits_addend is the cost; a descriptor's own wins.
    let mut heavy = call("edge", vec![descriptor(&[("remote_address", "10.1.0.1")])]);
    heavy.hits_addend = 3;
    assert_eq!(
        ask(&mut rls, heavy.clone()).await.statuses[0].limit_remaining,
        2
    );
    assert_eq!(
        ask(&mut rls, heavy.clone()).await.overall_code,
        Code::OverLimit as i32
    );
    let mut light = descriptor(&[("remote_address", "10.1.0.1")]);
    light.hits_addend = Some(2u64.into());
    let light = ask(&mut rls, call("edge", vec![light])).await;
    assert_eq!(light.overall_code, Code::Ok as i32);
    assert_eq!(light.statuses[0].limit_remaining, 0);

    // An override: the limit's algorithm with the call's numbers, its own state.
    let mut strict = descriptor(&[("remote_address", "10.2.0.1")]);
    strict.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: RateLimitUnit::Hour as i32,
    });
    let first = ask(&mut rls, call("edge", vec![strict.clone()])).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let limit = first.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour as i32)
    );
    assert_eq!(
        ask(&mut rls, call("edge", vec![strict])).await.overall_code,
        Code::OverLimit as i32
    );
    let plain = ask(
        &mut rls,
        call("edge", vec![descriptor(&[("remote_address", "10.2.0.1")])]),
    )
    .await;
    assert_eq!(
        plain.statuses[0].limit_remaining, 4,
        "the rule's own count is apart"
    );

    // A shadow limit is counted, never refuses.
    for _ in 0..3 {
        let watched = ask(
            &mut rls,
            call("edge", vec![descriptor(&[("path", "/watched/a")])]),
        )
        .await;
        assert_eq!(watched.overall_code, Code::Ok as i32);
    }
    // An unknown domain: OK, one status per descriptor, counted.
    let unknown = ask(
        &mut rls,
        call(
            "nope",
            vec![descriptor(&[("a", "b")]), descriptor(&[("c", "d")])],
        ),
    )
    .await;
    assert_eq!(unknown.overall_code, Code::Ok as i32);
    assert_eq!(unknown.statuses.len(), 2);

    let text = metrics(&gateway).await;
    assert!(
        text.contains("tollgate_rls_unknown_domain_total 1"),
        "{text}"
    );
    assert!(
        text.contains(
            r#"tollgate_ratelimit_decisions_total{route="edge",limit="watch",outcome="shadow_denied",front="rls"} 2"#
        ),
        "{text}"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn calls_that_cannot_be_decided_are_invalid_argument() {
    let gateway = InProcess::start(CONFIG).await;
    let mut rls = client(&gateway).await;
    let no_domain = rls
        .should_rate_limit(call("", vec![descriptor(&[("a", "b")])]))
        .await
        .unwrap_err();
    assert_eq!(no_domain.code(), tonic::Code::InvalidArgument);
    let none = rls
        .should_rate_limit(call("edge", vec![]))
        .await
        .unwrap_err();
    assert_eq!(none.code(), tonic::Code::InvalidArgument);
    let mut mixed_a = descriptor(&[("remote_address", "10.3.0.1")]);
    mixed_a.hits_addend = Some(1u64.into());
    let mut mixed_b = descriptor(&[("user", "carol")]);
    mixed_b.hits_addend = Some(2u64.into());
    let mixed = rls
        .should_rate_limit(call("edge", vec![mixed_a, mixed_b]))
        .await
        .unwrap_err();
    assert_eq!(mixed.code(), tonic::Code::InvalidArgument);
    let mut no_unit = descriptor(&[("remote_address", "10.3.0.2")]);
    no_unit.limit = Some(RateLimitOverride {
        requests_per_unit: 3,
        unit: 0,
    });
    let no_unit = rls
        .should_rate_limit(call("edge", vec![no_unit]))
        .await
        .unwrap_err();
    assert_eq!(no_unit.code(), tonic::Code::InvalidArgument);

    // Bytes that are no RateLimitRequest, framed as gRPC over a raw h2c
    // connection: INVALID_ARGUMENT in the trailers, and the port still serves.
    let stream = tokio::net::TcpStream::connect(gateway.decision.unwrap())
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    let garbage: &[u8] = &[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f];
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(garbage.len() as u32).to_be_bytes());
    framed.extend_from_slice(garbage);
    let request = Request::post(format!(
        "http://{}/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        gateway.decision.unwrap()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(Bytes::from(framed)))
    .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    let collected = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
        .await
        .expect("the answer ends")
        .unwrap();
    let status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .or_else(|| headers.get("grpc-status"))
        .expect("a grpc-status");
    assert_eq!(status, "3", "INVALID_ARGUMENT");
    let after = ask(
        &mut rls,
        call("edge", vec![descriptor(&[("remote_address", "10.3.0.9")])]),
    )
    .await;
    assert_eq!(after.overall_code, Code::Ok as i32);
    gateway.stop().await;
}

/// `POST /json` with a body, on a fresh connection.
async fn json(gateway: &InProcess, body: &str) -> common::Reply {
    let request = Request::post("/json")
        .header("host", "tollgate")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    send(gateway.decision.unwrap(), request).await
}

#[tokio::test]
async fn json_answers_envoyproxy_ratelimits_examples() {
    let config = format!(
        "{CONFIG}\n[limits.one_per_day]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1d\"\n\n[[decision.descriptors]]\ndomain = \"dummy\"\nmatch = [{{ key = \"one_per_day\" }}]\nlimits = [\"one_per_day\"]\n"
    );
    let gateway = InProcess::start(&config).await;
    // envoyproxy/ratelimit's README: the same request twice, one per day.
    let example = r#"{"domain":"dummy","descriptors":[{"entries":[{"key":"one_per_day","value":"something"}]}]}"#;
    let first = json(&gateway, example).await;
    assert_eq!(first.status, 200, "{:?}", first.body);
    let body = first.json();
    assert_eq!(body["overallCode"], "OK");
    assert_eq!(body["statuses"][0]["code"], "OK");
    assert_eq!(body["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    assert_eq!(body["statuses"][0]["currentLimit"]["unit"], "DAY");
    assert_eq!(body["statuses"][0]["currentLimit"]["name"], "one_per_day");
    let second = json(&gateway, example).await;
    assert_eq!(second.status, 429);
    let body = second.json();
    assert_eq!(body["overallCode"], "OVER_LIMIT");
    assert_eq!(body["statuses"][0]["code"], "OVER_LIMIT");
    assert!(
        body["statuses"][0]["durationUntilReset"]
            .as_str()
            .is_some_and(|d| d.ends_with('s')),
        "{body}"
    );
    let mut headers: Vec<&str> = body["responseHeadersToAdd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["key"].as_str().unwrap())
        .collect();
    headers.sort_unstable();
    assert_eq!(headers, ["ratelimit", "ratelimit-policy", "retry-after"]);

    let broken = json(&gateway, r#"{"domain": 3}"#).await;
    assert_eq!(broken.status, 400);
    assert_eq!(
        broken.header("content-type"),
        Some("application/problem+json")
    );
    let get = get(gateway.decision.unwrap(), "/json", &[]).await;
    assert_eq!(get.status, 405);
    gateway.stop().await;
}

#[tokio::test]
async fn two_gateways_on_redis_decide_one_limit_and_one_stack() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = common::redis::Redis::start();
    let config = on_redis(&format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\n",
        redis.url()
    ));
    let a = InProcess::start_on_wall_time(&config).await;
    let b = InProcess::start_on_wall_time(&config).await;
    let (mut ra, mut rb) = (client(&a).await, client(&b).await);
    let by_address = || call("edge", vec![descriptor(&[("remote_address", "10.9.0.1")])]);
    let mut admitted = 0;
    for i in 0..12 {
        let rls = if i % 2 == 0 { &mut ra } else { &mut rb };
        if ask(rls, by_address()).await.overall_code == Code::Ok as i32 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5, "the bucket's capacity, across both gateways");

    // All or nothing in the store too: the user's refusal charges the address nothing.
    let both = |user: &str| {
        call(
            "edge",
            vec![
                descriptor(&[("remote_address", "10.9.0.2")]),
                descriptor(&[("user", user)]),
            ],
        )
    };
    assert_eq!(
        ask(&mut ra, both("dave")).await.overall_code,
        Code::Ok as i32
    );
    for _ in 0..3 {
        assert_eq!(
            ask(&mut rb, both("dave")).await.overall_code,
            Code::OverLimit as i32
        );
    }
    let erin = ask(&mut ra, both("erin")).await;
    assert_eq!(erin.overall_code, Code::Ok as i32);
    assert_eq!(erin.statuses[0].limit_remaining, 3);

    // A gateway that remembers denials: Redis's denial of dave shows both
    // descriptors' limits; the remembered one decides only dave's, and the
    // address's descriptor, not asked, shows no limit rather than numbers
    // it does not have.
    let c = InProcess::start_on_wall_time(
        &config.replace("[decision]", "remember_denials = \"1s\"\n\n[decision]"),
    )
    .await;
    let mut rc = client(&c).await;
    let asked = ask(&mut rc, both("dave")).await;
    assert_eq!(asked.overall_code, Code::OverLimit as i32);
    let address = asked.statuses[0].current_limit.as_ref().expect("decided");
    assert_eq!(address.name, "per_address");
    let remembered = ask(&mut rc, both("dave")).await;
    assert_eq!(remembered.overall_code, Code::OverLimit as i32);
    assert_eq!(remembered.statuses[0].code, Code::Ok as i32);
    assert_eq!(remembered.statuses[0].current_limit, None);
    assert_eq!(remembered.statuses[1].code, Code::OverLimit as i32);
    let user = remembered.statuses[1]
        .current_limit
        .as_ref()
        .expect("dave's");
    assert_eq!(user.name, "per_user");
    a.stop().await;
    b.stop().await;
    c.stop().await;
}

#[tokio::test]
async fn decisions_are_logged_explained_and_reloaded() {
    let log = common::log::capture_json();
    let gateway = InProcess::start(CONFIG).await;
    let mut rls = client(&gateway).await;
    let by_address = || call("edge", vec![descriptor(&[("remote_address", "10.5.0.1")])]);
    ask(&mut rls, by_address()).await;
    let text = log.when(|text| text.contains(r#""front":"rls""#)).await;
    let line = text
        .lines()
        .find(|l| l.contains(r#""front":"rls""#))
        .expect("an access-log line for the call");
    assert!(line.contains(r#""route":"edge""#), "{line}");
    assert!(line.contains(r#""limit":"per_address""#), "{line}");
    assert!(
        !line.contains("10.5.0.1"),
        "no raw descriptor value in the log: {line}"
    );

    // The explain endpoint names a descriptor limit's key by its entries.
    let admin = gateway.admin.unwrap();
    let explained = get(
        admin,
        "/limits/per_address?entry=remote_address:10.5.0.1",
        &[],
    )
    .await;
    assert_eq!(explained.status, 200, "{:?}", explained.body);
    assert_eq!(explained.json()["remaining"], 4);
    let hint = get(admin, "/limits/per_address?key=10.5.0.1", &[]).await;
    assert_eq!(hint.status, 400);

    // A reload changes the rules; the address's count carries over.
    let reloaded = CONFIG.replace("limit = 5", "limit = 6");
    assert_eq!(gateway.reload_with(&reloaded), 2);
    let after = ask(&mut rls, by_address()).await;
    assert_eq!(after.statuses[0].limit_remaining, 4, "6 - the two calls");
    gateway.stop().await;
}

#[tokio::test]
async fn on_redis_cluster_a_call_across_slots_is_still_one_stack() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let cluster = common::redis::Cluster::start(3, 0);
    let urls = cluster.toml_urls();
    let config = on_redis(&format!(
        "[store]\nbackend = \"redis\"\ncluster = true\nurl = [{urls}]\ntimeout = \"500ms\"\n"
    ));
    let a = InProcess::start_on_wall_time(&config).await;
    let b = InProcess::start_on_wall_time(&config).await;
    let (mut ra, mut rb) = (client(&a).await, client(&b).await);
    // Many users, one address: the users' keys fall in other slots than
    // the address's, and each user's single token refuses its second call.
    let call_for = |user: &str| {
        call(
            "edge",
            vec![
                descriptor(&[("remote_address", "10.8.0.1")]),
                descriptor(&[("user", user)]),
            ],
        )
    };
    let mut allowed = 0;
    for user in ["u1", "u2"] {
        for i in 0..3 {
            let rls = if i % 2 == 0 { &mut ra } else { &mut rb };
            if ask(rls, call_for(user)).await.overall_code == Code::Ok as i32 {
                allowed += 1;
            }
        }
    }
    assert_eq!(allowed, 2, "one call per user");
    // The four refused calls gave back what the address's slot charged.
    let next = ask(&mut ra, call_for("u3")).await;
    assert_eq!(next.overall_code, Code::Ok as i32);
    assert_eq!(
        next.statuses[0].limit_remaining, 2,
        "5 - three admitted calls"
    );
    a.stop().await;
    b.stop().await;
}

/// A per-key override set on the admin API decides that descriptor key in
/// Envoy's rate-limit service too: the same numbers as a proxied request.
#[tokio::test]
async fn an_admin_override_decides_its_descriptor_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("admin.token"), "rls-token").expect("token file");
    let config = CONFIG.replace(
        "admin = \"127.0.0.1:0\"",
        "admin = \"127.0.0.1:0\"\nadmin_token_file = \"admin.token\"",
    );
    let gateway = InProcess::start_in(dir, &config).await;
    let mut rls = client(&gateway).await;
    let request = Request::builder()
        .method("PUT")
        .uri("/limits/per_address/overrides?entry=remote_address:10.9.0.1")
        .header("host", "admin.test")
        .header("authorization", "Bearer rls-token")
        .body(Full::new(Bytes::from_static(br#"{"limit": 2}"#)))
        .unwrap();
    let put = send(gateway.admin.unwrap(), request).await;
    assert_eq!(put.status, 200, "{:?}", put.body);
    let by = |address: &str| call("edge", vec![descriptor(&[("remote_address", address)])]);
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(ask(&mut rls, by("10.9.0.1")).await.overall_code);
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, [ok, ok, over], "the override's limit of 2");
    // Another address keeps the file's limit of 5.
    for _ in 0..3 {
        assert_eq!(ask(&mut rls, by("10.9.0.2")).await.overall_code, ok);
    }
    gateway.stop().await;
}
