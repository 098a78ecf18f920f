//! `[tracing]` end to end: the gateway in-process with a test upstream and
//! an OTLP/HTTP receiver in the test (a hyper server decoding each
//! `POST /v1/traces` with `opentelemetry-proto`'s messages), over real
//! sockets and real time (the exporter runs on a thread of its own).
//!
//! What the spans say (names, kinds, attributes, parent and child), an
//! incoming `traceparent` continued and the upstream's `traceparent`
//! naming the client span, a real Redis's calls as client spans, the
//! sampling ratio, and a collector that is down or slow costing dropped
//! spans and never request latency.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{InProcess, TestUpstream, eventually, gateway_toml, get};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use tokio::net::TcpListener;

/// An OTLP/HTTP traces receiver: decodes every export, keeps the spans
/// and the raw bodies, and answers each after `delay`.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    /// `service.name` of the exports' resources.
    services: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start(delay: Duration) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let services = Arc::new(Mutex::new(Vec::new()));
        let kept = (spans.clone(), bodies.clone(), services.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let kept = kept.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let kept = kept.clone();
                        async move {
                            let answer = receive(request, &kept, delay).await;
                            Ok::<_, hyper::Error>(answer)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver {
            addr,
            spans,
            bodies,
            services,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `count` spans arrived (the exporter batches for 1 s).
    async fn wait_for(&self, count: usize) -> Vec<Span> {
        let arrived = eventually(async || self.spans.lock().unwrap().len() >= count).await;
        assert!(arrived, "{} spans of {count}", self.spans().len());
        self.spans()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Kept = (
    Arc<Mutex<Vec<Span>>>,
    Arc<Mutex<Vec<Bytes>>>,
    Arc<Mutex<Vec<String>>>,
);

/// One export: checked as OTLP/HTTP protobuf, decoded, kept.
async fn receive(
    request: Request<Incoming>,
    kept: &Kept,
    delay: Duration,
) -> Response<Full<Bytes>> {
    let (spans, bodies, services) = kept;
    assert_eq!(request.method(), "POST");
    assert_eq!(request.uri().path(), "/v1/traces");
    assert_eq!(
        request.headers()["content-type"].to_str().unwrap(),
        "application/x-protobuf"
    );
    let body = request.into_body().collect().await.unwrap().to_bytes();
    let export = ExportTraceServiceRequest::decode(body.clone()).expect("an OTLP export");
    tokio::time::sleep(delay).await;
    for resource in export.resource_spans {
        let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
        if let Some(name) = attributes.iter().find(|a| a.key == "service.name") {
            services.lock().unwrap().push(text(name.value.as_ref()));
        }
        for scope in resource.scope_spans {
            assert_eq!(scope.scope.unwrap().name, "tollgate");
            spans.lock().unwrap().extend(scope.spans);
        }
    }
    bodies.lock().unwrap().push(body);
    let mut response = Response::new(Full::new(Bytes::new()));
    response
        .headers_mut()
        .insert("content-type", "application/x-protobuf".parse().unwrap());
    response
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(n)) => n.to_string(),
        // A list of texts, as `a,b`.
        Some(Value::ArrayValue(list)) => list
            .values
            .iter()
            .map(|v| text(Some(v)))
            .collect::<Vec<_>>()
            .join(","),
        other => format!("{other:?}"),
    }
}

/// A span's attributes as text.
fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|a| (a.key.clone(), text(a.value.as_ref())))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A gateway forwarding `/api` to the upstream under limit `per_ip` (2 a
/// day per client) and `/open` without a limit, tracing to `otlp` at
/// `sample` (`None`: no `[tracing]`).
fn config_of(upstream: &TestUpstream, tracing: Option<(&str, f64)>) -> String {
    let tracing = tracing.map_or(String::new(), |(otlp, sample)| {
        format!("[tracing]\notlp = \"{otlp}\"\nsample = {sample}\nservice_name = \"edge\"\n\n")
    });
    gateway_toml(
        upstream,
        "",
        &format!(
            "{tracing}[limits.per_ip]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 2\nwindow = \"1d\"\nalign = \"first_request\"\n\n\
             [[routes]]\nname = \"api\"\nmatch = {{ path_prefix = \"/api\" }}\nupstream = \"api\"\nlimits = [\"per_ip\"]\n\n\
             [[routes]]\nname = \"open\"\nmatch = {{ path_prefix = \"/open\" }}\nupstream = \"api\"\n"
        ),
    )
}

fn config(upstream: &TestUpstream, otlp: &str, sample: f64) -> String {
    config_of(upstream, Some((otlp, sample)))
}

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn spans_follow_the_http_conventions_and_continue_the_callers_trace() {
    let upstream = TestUpstream::start().await;
    let receiver = Receiver::start(Duration::ZERO).await;
    let gateway = InProcess::start(&config(&upstream, &receiver.url(), 0.0)).await;
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let log = common::log::capture_json();

    let reply = get(
        gateway.addr,
        "/api/items",
        &[("traceparent", &traceparent), ("user-agent", "probe/1")],
    )
    .await;
    assert_eq!(reply.status, 200);
    let spans = receiver.wait_for(2).await;
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .expect("a server span");
    let client = spans
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .expect("a client span");

    // The caller's trace, continued: the server span is its span's child,
    // the client span the server span's.
    assert_eq!(hex(&server.trace_id), CALLER_TRACE);
    assert_eq!(hex(&server.parent_span_id), CALLER_SPAN);
    assert_eq!(client.trace_id, server.trace_id);
    assert_eq!(client.parent_span_id, server.span_id);
    assert!(server.start_time_unix_nano <= client.start_time_unix_nano);
    assert!(client.end_time_unix_nano <= server.end_time_unix_nano);
    assert!(client.start_time_unix_nano < client.end_time_unix_nano);

    // The upstream was told the client span is its parent.
    let sent = upstream.last_seen();
    assert_eq!(
        sent.header("traceparent"),
        Some(format!("00-{CALLER_TRACE}-{}-01", hex(&client.span_id)).as_str())
    );

    assert_eq!(server.name, "GET api");
    let seen = attributes(server);
    let expected = [
        ("http.request.method", "GET"),
        ("url.path", "/api/items"),
        ("url.scheme", "http"),
        ("http.response.status_code", "200"),
        // The test client's `Host`, without a port.
        ("server.address", "gateway.test"),
        ("server.port", "80"),
        ("client.address", "127.0.0.1"),
        ("network.peer.address", "127.0.0.1"),
        ("network.protocol.version", "1.1"),
        ("user_agent.original", "probe/1"),
        ("tollgate.route", "api"),
        ("tollgate.limit", "per_ip"),
        ("tollgate.decision", "allowed"),
    ];
    for (key, value) in expected {
        assert_eq!(
            seen.get(key).map(String::as_str),
            Some(value),
            "{key}: {seen:?}"
        );
    }
    assert_eq!(client.name, "GET");
    let seen = attributes(client);
    let expected = [
        ("http.request.method", "GET"),
        ("http.response.status_code", "200"),
        ("server.address", "127.0.0.1"),
        ("server.port", &upstream.addr.port().to_string()),
        ("url.full", &format!("{}/api/items", upstream.url())),
        ("tollgate.upstream", "api"),
    ];
    for (key, value) in expected {
        assert_eq!(
            seen.get(key).map(String::as_str),
            Some(value),
            "{key}: {seen:?}"
        );
    }
    assert_eq!(receiver.services.lock().unwrap()[0], "edge");

    // The access log line names the trace and the server span.
    let line = log
        .when(|text| text.contains("\"trace_id\""))
        .await
        .lines()
        .find(|line| line.contains("\"route\":\"api\""))
        .map(str::to_owned)
        .expect("the request's line");
    let line: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(line["trace_id"], CALLER_TRACE);
    assert_eq!(line["span_id"], hex(&server.span_id));
}

#[tokio::test]
async fn a_refused_request_names_its_limit_and_goes_nowhere() {
    let upstream = TestUpstream::start().await;
    let receiver = Receiver::start(Duration::ZERO).await;
    let gateway = InProcess::start(&config(&upstream, &receiver.url(), 1.0)).await;
    for _ in 0..3 {
        get(gateway.addr, "/api/x", &[]).await;
    }
    // Two allowed (server and client span each), one denied (server only).
    let spans = receiver.wait_for(5).await;
    assert_eq!(upstream.count(), 2);
    let denied: Vec<&Span> = spans
        .iter()
        .filter(|s| attributes(s).get("tollgate.decision").map(String::as_str) == Some("denied"))
        .collect();
    assert_eq!(denied.len(), 1, "{spans:#?}");
    let seen = attributes(denied[0]);
    assert_eq!(seen["http.response.status_code"], "429");
    assert_eq!(seen["tollgate.limit"], "per_ip");
    // A 4xx is not a server span's error.
    assert_eq!(denied[0].status.as_ref().unwrap().code, 0);
    // No client span in the denied request's trace.
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.trace_id == denied[0].trace_id)
            .count(),
        1
    );
    // New traces: no parent.
    assert!(
        spans
            .iter()
            .filter(|s| s.kind == SpanKind::Server as i32)
            .all(|s| s.parent_span_id.is_empty())
    );
}

/// A decision made in Redis is a client span of the request's server
/// span, with the database conventions and the limits it decided; a
/// route whose limits stay in node memory has none.
#[tokio::test]
async fn a_redis_decision_is_a_client_span_of_the_server_span() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = common::redis::Redis::start();
    let upstream = TestUpstream::start().await;
    let receiver = Receiver::start(Duration::ZERO).await;
    let config = gateway_toml(
        &upstream,
        "",
        &format!(
            "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"10s\"\n\n\
             [tracing]\notlp = \"{}\"\nsample = 1.0\n\n\
             [limits.per_ip]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\n\n\
             [limits.per_route]\nkey = \"route\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\n\n\
             [limits.node]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 100\nwindow = \"1m\"\nlocal = true\n\n\
             [[routes]]\nname = \"shared\"\nmatch = {{ path_prefix = \"/api\" }}\nupstream = \"api\"\nlimits = [\"per_ip\", \"node\", \"per_route\"]\n\n\
             [[routes]]\nname = \"local\"\nmatch = {{ path_prefix = \"/open\" }}\nupstream = \"api\"\nlimits = [\"node\"]\n",
            redis.url(),
            receiver.url(),
        ),
    );
    // A generous timeout: a loaded machine's call must not fail (and be
    // a failed span).
    let gateway = InProcess::start(&config).await;
    assert_eq!(get(gateway.addr, "/api/a", &[]).await.status, 200);
    assert_eq!(get(gateway.addr, "/open/b", &[]).await.status, 200);
    // Server and upstream spans of both, and the Redis call of the first.
    let spans = receiver.wait_for(5).await;
    let named = |route: &str| {
        spans
            .iter()
            .find(|s| attributes(s).get("tollgate.route").map(String::as_str) == Some(route))
            .unwrap_or_else(|| panic!("no {route} span in {spans:#?}"))
    };
    let shared = named("shared");
    let redis_spans: Vec<&Span> = spans
        .iter()
        .filter(|s| attributes(s).contains_key("db.system"))
        .collect();
    assert_eq!(redis_spans.len(), 1, "{spans:#?}");
    let call = redis_spans[0];
    assert_eq!(call.trace_id, shared.trace_id);
    assert_eq!(call.parent_span_id, shared.span_id);
    assert_eq!(call.kind, SpanKind::Client as i32);
    assert_eq!(call.name, "EVALSHA");
    assert!(shared.start_time_unix_nano <= call.start_time_unix_nano);
    assert!(call.start_time_unix_nano < call.end_time_unix_nano);
    assert!(call.end_time_unix_nano <= shared.end_time_unix_nano);
    assert_eq!(call.status.as_ref().unwrap().code, 0);
    let seen = attributes(call);
    let port = redis.port.to_string();
    let expected = [
        ("db.system", "redis"),
        ("db.system.name", "redis"),
        ("db.operation.name", "EVALSHA"),
        ("db.namespace", "0"),
        ("server.address", "127.0.0.1"),
        ("server.port", port.as_str()),
        // The shared limits, in stack order; not the node's own.
        ("tollgate.limits", "per_ip,per_route"),
    ];
    for (key, value) in expected {
        assert_eq!(
            seen.get(key).map(String::as_str),
            Some(value),
            "{key}: {seen:?}"
        );
    }
    // The route whose limit stays in node memory made no call.
    let local = named("local");
    assert_eq!(
        spans
            .iter()
            .filter(|s| s.trace_id == local.trace_id)
            .count(),
        2,
        "{spans:#?}"
    );
}

/// A response whose body streams after its head: the server span ends
/// with the body, after the upstream's head ended the client span.
#[tokio::test]
async fn a_streamed_responses_server_span_ends_with_its_body() {
    let upstream = TestUpstream::start().await;
    let receiver = Receiver::start(Duration::ZERO).await;
    let gateway = InProcess::start(&format!(
        "{}\n[[routes]]\nname = \"stream\"\nmatch = {{ path = \"/stream\" }}\nupstream = \"api\"\n",
        config(&upstream, &receiver.url(), 1.0)
    ))
    .await;
    let request = Request::get("/stream")
        .header("host", "x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = common::send_streaming(gateway.addr, request).await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("the first chunk")
        .unwrap()
        .unwrap();
    assert_eq!(first.into_data().unwrap(), "first\n");
    // Nothing is exported while the body streams.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.spans().len(), 0, "{:#?}", receiver.spans());
    upstream.release();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last\n");
    let spans = receiver.wait_for(2).await;
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap();
    let client = spans
        .iter()
        .find(|s| s.kind == SpanKind::Client as i32)
        .unwrap();
    assert_eq!(attributes(server)["tollgate.route"], "stream");
    // The body was held at least 1.5 s after the head (a lower bound
    // only: no tight timing).
    assert!(
        server.end_time_unix_nano >= client.end_time_unix_nano + 1_500_000_000,
        "server span ends {} ns after the upstream's head",
        server.end_time_unix_nano as i128 - client.end_time_unix_nano as i128
    );
}

#[tokio::test]
async fn an_unsampled_caller_is_not_recorded_and_its_traceparent_goes_on() {
    let upstream = TestUpstream::start().await;
    let receiver = Receiver::start(Duration::ZERO).await;
    let gateway = InProcess::start(&config(&upstream, &receiver.url(), 1.0)).await;
    let unsampled = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-00");
    get(gateway.addr, "/open/a", &[("traceparent", &unsampled)]).await;
    assert_eq!(
        upstream.last_seen().header("traceparent"),
        Some(unsampled.as_str())
    );
    // A malformed one starts a trace of its own (sample = 1: recorded).
    get(gateway.addr, "/open/b", &[("traceparent", "00-zz-bad-01")]).await;
    let spans = receiver.wait_for(2).await;
    // A moment more for anything the unsampled request might have sent.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let spans_now = receiver.spans();
    assert_eq!(spans_now.len(), 2, "{spans_now:#?}");
    assert!(spans.iter().all(|s| hex(&s.trace_id) != CALLER_TRACE));
    let sent = upstream.last_seen();
    let forwarded = sent.header("traceparent").unwrap();
    assert!(
        forwarded.starts_with("00-") && forwarded.ends_with("-01"),
        "{forwarded}"
    );
    assert_eq!(&forwarded[3..35], hex(&spans[0].trace_id));
}

#[tokio::test]
async fn the_sampling_ratio_holds() {
    let upstream = TestUpstream::start().await;
    let receiver = Receiver::start(Duration::ZERO).await;
    let gateway = InProcess::start(&config(&upstream, &receiver.url(), 0.1)).await;
    for i in 0..1000 {
        let reply = get(gateway.addr, &format!("/open/{i}"), &[]).await;
        assert_eq!(reply.status, 200);
    }
    // Spans of up to a second ago may still be in a batch.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let traces = receiver
        .spans()
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .count();
    // Binomial(1000, 0.1): mean 100, σ ≈ 9.5; ±5σ, so a correct sampler
    // fails once in millions of runs.
    assert!((52..=148).contains(&traces), "{traces} of 1000 traced");
    let metrics = common::llm::metrics(&gateway);
    assert_eq!(
        metrics.count("tollgate_trace_spans_dropped_total", &[]),
        0.0
    );
}

/// `count` requests one after another; how long they took.
async fn timed(gateway: &InProcess, count: usize) -> Duration {
    let started = Instant::now();
    for i in 0..count {
        let reply = get(gateway.addr, &format!("/open/{i}"), &[]).await;
        assert_eq!(reply.status, 200);
    }
    started.elapsed()
}

#[tokio::test]
async fn a_collector_that_is_down_costs_dropped_spans_not_latency() {
    let upstream = TestUpstream::start().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let untraced_config = config_of(&upstream, None);
    let untraced = InProcess::start(&untraced_config).await;
    let traced = InProcess::start(&config(&upstream, &down, 1.0)).await;
    timed(&untraced, 20).await;
    let baseline = timed(&untraced, 200).await;
    let with_tracing = timed(&traced, 200).await;
    // Generous: a debug build on a shared machine.
    assert!(
        with_tracing < baseline * 3 + Duration::from_millis(500),
        "{with_tracing:?} traced against {baseline:?}"
    );
    // Every span of the 200 requests (server and client) is counted.
    let counted = eventually(async || {
        common::llm::metrics(&traced).count("tollgate_trace_spans_dropped_total", &[]) >= 400.0
    })
    .await;
    assert!(
        counted,
        "{}",
        common::llm::metrics(&traced).count("tollgate_trace_spans_dropped_total", &[])
    );
}

#[tokio::test]
async fn a_slow_collector_costs_no_latency_and_gets_the_spans_later() {
    let upstream = TestUpstream::start().await;
    let receiver = Receiver::start(Duration::from_secs(3)).await;
    let traced = InProcess::start(&config(&upstream, &receiver.url(), 1.0)).await;
    // The first batch goes after 1 s and is answered 3 s later; requests
    // meanwhile are as quick as ever.
    get(traced.addr, "/open/first", &[]).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut slowest = Duration::ZERO;
    for i in 0..100 {
        let started = Instant::now();
        get(traced.addr, &format!("/open/{i}"), &[]).await;
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        slowest < Duration::from_secs(1),
        "a request took {slowest:?}"
    );
    // Slow, not lost: all 101 requests' spans arrive.
    receiver.wait_for(202).await;
    let metrics = common::llm::metrics(&traced);
    assert_eq!(
        metrics.count("tollgate_trace_spans_dropped_total", &[]),
        0.0
    );
}

#[tokio::test]
async fn a_reload_moves_the_export_to_the_new_collector() {
    let upstream = TestUpstream::start().await;
    let first = Receiver::start(Duration::ZERO).await;
    let second = Receiver::start(Duration::ZERO).await;
    let gateway = InProcess::start(&config(&upstream, &first.url(), 1.0)).await;
    get(gateway.addr, "/open/1", &[]).await;
    first.wait_for(2).await;
    gateway.reload_with(&config(&upstream, &second.url(), 1.0).replace("\"edge\"", "\"edge2\""));
    get(gateway.addr, "/open/2", &[]).await;
    second.wait_for(2).await;
    assert_eq!(second.services.lock().unwrap()[0], "edge2");
    assert_eq!(first.spans().len(), 2);
}

/// Decodes OTLP export bodies with OpenTelemetry's own Python messages and
/// prints each span as a JSON object.
const PYTHON_DECODER: &str = r#"
import json, sys
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
out = []
for path in sys.argv[1:]:
    request = ExportTraceServiceRequest()
    with open(path, "rb") as body:
        request.ParseFromString(body.read())
    for resource in request.resource_spans:
        service = [a.value.string_value for a in resource.resource.attributes if a.key == "service.name"]
        for scope in resource.scope_spans:
            for span in scope.spans:
                attributes = {}
                for a in span.attributes:
                    v = a.value
                    attributes[a.key] = v.string_value if v.HasField("string_value") else str(v.int_value)
                out.append({
                    "service": service[0], "scope": scope.scope.name, "name": span.name,
                    "kind": span.kind, "trace": span.trace_id.hex(), "span": span.span_id.hex(),
                    "parent": span.parent_span_id.hex(), "start": span.start_time_unix_nano,
                    "end": span.end_time_unix_nano, "status": span.status.code,
                    "attributes": attributes,
                })
print(json.dumps(out))
"#;

/// The exports decoded by another implementation than the gateway's
/// (Python's protobuf runtime with OpenTelemetry's generated messages)
/// say what the Rust decoding says.
#[tokio::test]
async fn opentelemetrys_python_messages_read_the_same_spans() {
    if common::needs::skip(common::needs::OTEL_PROTO) {
        return;
    }
    let upstream = TestUpstream::start().await;
    let receiver = Receiver::start(Duration::ZERO).await;
    let gateway = InProcess::start(&config(&upstream, &receiver.url(), 1.0)).await;
    let traceparent = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    get(gateway.addr, "/api/a", &[("traceparent", &traceparent)]).await;
    get(gateway.addr, "/open/b", &[]).await;
    let spans = receiver.wait_for(4).await;
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for (i, body) in receiver.bodies.lock().unwrap().iter().enumerate() {
        let path = dir.path().join(format!("export-{i}.pb"));
        std::fs::write(&path, body).unwrap();
        paths.push(path);
    }
    let output = std::process::Command::new(common::needs::python())
        .arg("-c")
        .arg(PYTHON_DECODER)
        .args(&paths)
        .output()
        .expect("run python");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let decoded: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(decoded.len(), spans.len());
    for (python, rust) in decoded.iter().zip(&spans) {
        assert_eq!(python["service"], "edge");
        assert_eq!(python["scope"], "tollgate");
        assert_eq!(python["name"], rust.name.as_str());
        assert_eq!(python["kind"], rust.kind);
        assert_eq!(python["trace"], hex(&rust.trace_id));
        assert_eq!(python["span"], hex(&rust.span_id));
        assert_eq!(python["parent"], hex(&rust.parent_span_id));
        assert_eq!(python["start"], rust.start_time_unix_nano);
        assert_eq!(python["end"], rust.end_time_unix_nano);
        let attributes: HashMap<String, String> =
            serde_json::from_value(python["attributes"].clone()).unwrap();
        assert_eq!(attributes, self::attributes(rust));
    }
    // The caller's trace, continued, as Python reads it.
    assert!(
        decoded
            .iter()
            .any(|s| s["parent"] == CALLER_SPAN && s["trace"] == CALLER_TRACE)
    );
}
