//! Usage events (`[usage]`, contract section 14) end to end: the gateway
//! in-process in front of the scripted OpenAI upstream (`common::llm`), its
//! events POSTed to a real HTTP collector served by hyper in the test
//! ([`Collector`]: it records every batch, and can be down, slow, or
//! refuse a batch with a 400). Every event arrives exactly once by `id`
//! after a collector outage, after a gateway restart with events spooled,
//! and with a collector slower than the exporter's interval; requests
//! answered while a collector holds a POST for an hour; a refused
//! batch is set aside in the dead-letter file while the rest arrive; a
//! full spool drops its oldest events and counts them; `file =` writes
//! JSON lines; and the official `cloudevents` Python SDK reads the
//! batches as valid CloudEvents 1.0.
//!
//! Real time (the exporter runs on threads of its own), with a short
//! `interval`; waits are `eventually`'s, generous for a loaded machine.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use common::llm::{LlmUpstream, metrics};
use common::{InProcess, Reply, eventually, send};

/// A CloudEvents collector: records each batch it took (2xx), answering
/// after `delay`; a batch holding an event whose model is `poison` is
/// refused 400. Stopped (connections refused) and started again on the
/// same port.
#[derive(Clone)]
struct Collector {
    addr: SocketAddr,
    state: Arc<CollectorState>,
}

#[derive(Default)]
struct CollectorState {
    /// Bodies taken, as received.
    batches: Mutex<Vec<String>>,
    /// Each POST's `Content-Type`.
    content_types: Mutex<Vec<String>>,
    refused: Mutex<usize>,
    /// POSTs whose body arrived, answered or not yet.
    arrived: Mutex<usize>,
    delay: Mutex<Duration>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Collector {
    async fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let collector = Collector {
            addr: listener.local_addr().expect("address"),
            state: Arc::new(CollectorState::default()),
        };
        collector.serve(listener);
        collector
    }

    /// A collector on a port where nothing listens yet ([`Collector::up`]
    /// starts it).
    async fn down_at_first() -> Collector {
        let collector = Collector::start().await;
        collector.down();
        collector
    }

    fn url(&self) -> String {
        format!("http://{}/api/v1/events", self.addr)
    }

    fn serve(&self, listener: TcpListener) {
        let state = self.state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(take(request, &state).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        *self.state.task.lock().unwrap() = Some(task);
    }

    /// Stops listening (and drops its connections): the collector is down.
    fn down(&self) {
        if let Some(task) = self.state.task.lock().unwrap().take() {
            task.abort();
        }
    }

    /// Listens again on the same port.
    async fn up(&self) {
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                // The aborted task's listener may take a moment to close.
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        self.serve(listener);
    }

    fn set_delay(&self, delay: Duration) {
        *self.state.delay.lock().unwrap() = delay;
    }

    /// Every event of every batch taken, in order of arrival.
    fn events(&self) -> Vec<Value> {
        self.state
            .batches
            .lock()
            .unwrap()
            .iter()
            .flat_map(|body| {
                serde_json::from_str::<Vec<Value>>(body).expect("a JSON array of events")
            })
            .collect()
    }

    /// The events taken, one per `id`: panics on an id whose events differ.
    fn unique(&self) -> BTreeMap<String, Value> {
        let mut unique = BTreeMap::new();
        for event in self.events() {
            let id = event["id"].as_str().expect("an id").to_owned();
            if let Some(seen) = unique.insert(id.clone(), event.clone()) {
                assert_eq!(seen, event, "two events with the id {id}");
            }
        }
        unique
    }
}

async fn take(request: Request<Incoming>, state: &CollectorState) -> Response<Full<Bytes>> {
    let content_type = request
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = request
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    *state.arrived.lock().unwrap() += 1;
    let delay = *state.delay.lock().unwrap();
    tokio::time::sleep(delay).await;
    let text = String::from_utf8(body.to_vec()).expect("UTF-8");
    state.content_types.lock().unwrap().push(content_type);
    let events: Vec<Value> = serde_json::from_str(&text).expect("a JSON array");
    if events.iter().any(|e| e["data"]["model"] == "poison") {
        *state.refused.lock().unwrap() += 1;
        let mut answer = Response::new(Full::new(Bytes::from_static(
            b"{\"title\":\"malformed event\"}",
        )));
        *answer.status_mut() = StatusCode::BAD_REQUEST;
        return answer;
    }
    state.batches.lock().unwrap().push(text);
    let mut answer = Response::new(Full::new(Bytes::new()));
    *answer.status_mut() = StatusCode::NO_CONTENT;
    answer
}

/// A gateway in front of `upstream` with a token route keyed on the API
/// key (two consumers, `acme`'s of tenant `acme-corp`), events going as
/// `usage` says.
fn config(upstream: &LlmUpstream, usage: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1

[upstreams.llm]
url = "{url}"

[limits.tpm]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 1000000
refill = "1000000/m"
unit = "tokens"

[[routes]]
name = "chat"
match = {{ path = "/v1/chat/completions", methods = ["POST"] }}
upstream = "llm"
limits = ["tpm"]
tokens = {{ max_tokens_default = 100, prompt = "bytes/4", usage = "auto" }}

[[routes]]
name = "models"
match = {{ path = "/v1/models" }}
upstream = "llm"
usage_events = true

[consumers."key-acme"]
consumer = "acme"
tenant = "acme-corp"

[usage]
{usage}
"#,
        url = upstream.url()
    )
}

/// `[usage]` for `collector`, spooled in `spool`.
fn to_collector(collector: &Collector, spool: &Path, extra: &str) -> String {
    format!(
        "url = \"{}\"\nspool = \"{}\"\nbatch = 5\ninterval = \"50ms\"\n{extra}",
        collector.url(),
        spool.display()
    )
}

/// A chat completion of `model` for API key `key`, answered with `used`
/// tokens (a third of them prompt) as `script` says.
async fn chat(gateway: &InProcess, key: &str, model: &str, script: &str, used: u64) -> Reply {
    let body = json!({
        "model": model,
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "hi"}],
    });
    let request = Request::post("/v1/chat/completions")
        .header("host", "gateway.test")
        .header("content-type", "application/json")
        .header("x-api-key", key)
        .header("x-script", script)
        .header("x-used", used.to_string())
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let reply = send(gateway.addr, request).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    reply
}

fn counted(gateway: &InProcess, result: &str) -> f64 {
    metrics(gateway)
        .value("tollgate_usage_events_total", &[("result", result)])
        .unwrap_or(0.0)
}

fn spooled(gateway: &InProcess) -> f64 {
    metrics(gateway)
        .value("tollgate_usage_spool_events", &[])
        .unwrap_or(0.0)
}

/// Waits until the collector holds `n` distinct events, and no more.
async fn received(collector: &Collector, n: usize) -> BTreeMap<String, Value> {
    let arrived = eventually(async || collector.unique().len() >= n).await;
    let unique = collector.unique();
    assert!(arrived, "{} of {n} events arrived", unique.len());
    assert_eq!(unique.len(), n, "more events than requests");
    unique
}

/// The requests' numbers, from the `x-used` each asked for.
fn used_counts(events: &BTreeMap<String, Value>) -> Vec<u64> {
    let mut used: Vec<u64> = events
        .values()
        .map(|e| e["data"]["total_tokens"].as_u64().expect("a total"))
        .collect();
    used.sort_unstable();
    used
}

#[tokio::test]
async fn each_settled_request_is_one_event_with_its_usage() {
    let upstream = LlmUpstream::start().await;
    let collector = Collector::start().await;
    let spool = tempfile::tempdir().unwrap();
    let gateway = InProcess::start(&config(
        &upstream,
        &to_collector(&collector, spool.path(), ""),
    ))
    .await;
    chat(&gateway, "key-acme", "gpt-4o", "json", 30).await;
    chat(&gateway, "key-other", "gpt-4o-mini", "sse", 60).await;
    let models = send(
        gateway.addr,
        Request::get("/v1/models")
            .header("host", "gateway.test")
            .header("x-api-key", "key-acme")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(models.status, 200);
    let events = received(&collector, 3).await;
    let by_route = |route: &str, model: &str| {
        events
            .values()
            .find(|e| e["data"]["route"] == route && e["data"]["model"] == model)
            .unwrap_or_else(|| panic!("no {route} event of {model}: {events:?}"))
            .clone()
    };
    let acme = by_route("chat", "gpt-4o");
    assert_eq!(acme["specversion"], "1.0");
    assert_eq!(acme["type"], "tollgate.llm.usage");
    assert_eq!(acme["datacontenttype"], "application/json");
    assert!(acme["source"].as_str().unwrap().starts_with("tollgate"));
    assert_eq!(acme["subject"], "acme", "the consumer names the event");
    assert_eq!(acme["data"]["input_tokens"], 10);
    assert_eq!(acme["data"]["cached_input_tokens"], 0);
    assert_eq!(acme["data"]["output_tokens"], 20);
    assert_eq!(acme["data"]["total_tokens"], 30);
    assert_eq!(acme["data"]["cost_usd"], Value::Null, "unpriced");
    assert_eq!(acme["data"]["status"], 200);
    assert!(acme["data"]["duration_ms"].is_u64());
    assert!(acme["time"].as_str().unwrap().ends_with('Z'));
    // No consumer: the limit key's digest, never the raw key.
    let other = by_route("chat", "gpt-4o-mini");
    let subject = other["subject"].as_str().expect("a subject");
    assert_eq!(subject.len(), 32, "{subject}");
    assert!(!other.to_string().contains("key-other"), "{other}");
    assert_eq!(other["data"]["total_tokens"], 60);
    // A route without tokens, with `usage_events = true`.
    let listed = events
        .values()
        .find(|e| e["data"]["route"] == "models")
        .expect("the models route's event");
    assert_eq!(listed["subject"], "acme");
    assert_eq!(listed["data"]["model"], Value::Null);
    assert_eq!(listed["data"]["total_tokens"], Value::Null);
    assert_eq!(listed["data"]["status"], 200);
    for content_type in collector.state.content_types.lock().unwrap().iter() {
        assert_eq!(content_type, "application/cloudevents-batch+json");
    }
    assert!(eventually(async || counted(&gateway, "sent") == 3.0).await);
    // Counted sent on the collector's answer, then acknowledged in the
    // spool: the gauge follows.
    assert!(eventually(async || spooled(&gateway) == 0.0).await);
    gateway.stop().await;
}

#[tokio::test]
async fn a_collector_outage_loses_nothing_and_duplicates_nothing() {
    let upstream = LlmUpstream::start().await;
    let collector = Collector::down_at_first().await;
    let spool = tempfile::tempdir().unwrap();
    let gateway = InProcess::start(&config(
        &upstream,
        &to_collector(&collector, spool.path(), ""),
    ))
    .await;
    for used in 1..=12 {
        chat(&gateway, "key-acme", "gpt-4o", "json", used).await;
    }
    assert!(
        eventually(async || spooled(&gateway) == 12.0 && counted(&gateway, "failed") > 0.0).await,
        "12 events spooled while the collector is down, and POSTs failed"
    );
    assert!(collector.events().is_empty());
    collector.up().await;
    let events = received(&collector, 12).await;
    assert_eq!(used_counts(&events), (1..=12).collect::<Vec<_>>());
    assert!(eventually(async || spooled(&gateway) == 0.0).await);
    assert_eq!(counted(&gateway, "sent"), 12.0);
    assert_eq!(counted(&gateway, "dropped"), 0.0);
    gateway.stop().await;
}

#[tokio::test]
async fn a_restart_sends_what_the_spool_holds() {
    let upstream = LlmUpstream::start().await;
    let collector = Collector::down_at_first().await;
    let spool = tempfile::tempdir().unwrap();
    let usage = to_collector(&collector, spool.path(), "");
    let first = InProcess::start(&config(&upstream, &usage)).await;
    for used in 1..=7 {
        chat(&first, "key-acme", "gpt-4o", "sse", used).await;
    }
    assert!(eventually(async || spooled(&first) == 7.0).await);
    // Stopped while the collector is down: the events stay on disk.
    first.stop().await;
    collector.up().await;
    // Nothing sends them until a gateway runs on the spool again.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(collector.events().is_empty());
    let second = InProcess::start(&config(&upstream, &usage)).await;
    chat(&second, "key-acme", "gpt-4o", "sse", 8).await;
    let events = received(&collector, 8).await;
    assert_eq!(used_counts(&events), (1..=8).collect::<Vec<_>>());
    // The spooled ones first.
    let order: Vec<u64> = collector
        .events()
        .iter()
        .map(|e| e["data"]["total_tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(order.last(), Some(&8), "{order:?}");
    second.stop().await;
    // A third start finds nothing left to send.
    let third = InProcess::start(&config(&upstream, &usage)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(collector.unique().len(), 8);
    assert_eq!(spooled(&third), 0.0);
    third.stop().await;
}

#[tokio::test]
async fn a_slow_collector_gets_every_event_once_by_id() {
    let upstream = LlmUpstream::start().await;
    let collector = Collector::start().await;
    // Each answer takes 300 ms: six intervals, while requests go on.
    collector.set_delay(Duration::from_millis(300));
    let spool = tempfile::tempdir().unwrap();
    let gateway = InProcess::start(&config(
        &upstream,
        &to_collector(&collector, spool.path(), ""),
    ))
    .await;
    for used in 1..=20 {
        chat(&gateway, "key-acme", "gpt-4o", "json", used).await;
    }
    let events = received(&collector, 20).await;
    assert_eq!(used_counts(&events), (1..=20).collect::<Vec<_>>());
    // Exactly once here: no POST took longer than the exporter's deadline.
    assert_eq!(collector.events().len(), 20);
    gateway.stop().await;
}

#[tokio::test]
async fn a_collector_that_holds_its_posts_never_delays_a_request() {
    let upstream = LlmUpstream::start().await;
    let collector = Collector::start().await;
    // The collector takes a POST's body and answers an hour later.
    collector.set_delay(Duration::from_secs(3_600));
    let spool = tempfile::tempdir().unwrap();
    let gateway = InProcess::start(&config(
        &upstream,
        &to_collector(&collector, spool.path(), ""),
    ))
    .await;
    chat(&gateway, "key-acme", "gpt-4o", "json", 1).await;
    let posted = eventually(async || *collector.state.arrived.lock().unwrap() >= 1).await;
    assert!(posted, "the first event was never POSTed");
    // While that POST waits for its answer, every request is answered: a
    // request that waited for its event's export would wait an hour.
    for used in 2..=30 {
        chat(&gateway, "key-acme", "gpt-4o", "json", used).await;
    }
    assert!(collector.state.batches.lock().unwrap().is_empty());
    // Their events wait in the spool...
    assert!(eventually(async || spooled(&gateway) >= 30.0).await);
    // ...and arrive once the collector answers again (the held POST ends
    // at the exporter's 10 s deadline and its batch goes again).
    collector.set_delay(Duration::ZERO);
    let events = received(&collector, 30).await;
    assert_eq!(used_counts(&events), (1..=30).collect::<Vec<_>>());
    gateway.stop().await;
}

#[tokio::test]
async fn a_refused_batch_is_set_aside_and_the_rest_delivered() {
    let upstream = LlmUpstream::start().await;
    let collector = Collector::start().await;
    let spool = tempfile::tempdir().unwrap();
    let gateway = InProcess::start(&config(
        &upstream,
        &to_collector(&collector, spool.path(), "").replace("batch = 5", "batch = 1"),
    ))
    .await;
    for used in 1..=3 {
        chat(&gateway, "key-acme", "gpt-4o", "json", used).await;
    }
    chat(&gateway, "key-acme", "poison", "json", 4).await;
    for used in 5..=6 {
        chat(&gateway, "key-acme", "gpt-4o", "json", used).await;
    }
    let events = received(&collector, 5).await;
    assert_eq!(used_counts(&events), vec![1, 2, 3, 5, 6]);
    assert!(eventually(async || counted(&gateway, "dead_letter") == 1.0).await);
    assert_eq!(
        *collector.state.refused.lock().unwrap(),
        1,
        "refused once, not retried"
    );
    let dead = std::fs::read_to_string(spool.path().join("dead-letter.jsonl")).unwrap();
    let lines: Vec<Value> = dead
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["data"]["model"], "poison");
    assert!(eventually(async || spooled(&gateway) == 0.0).await);
    gateway.stop().await;
}

#[tokio::test]
async fn a_full_spool_drops_the_oldest_and_counts_them() {
    let upstream = LlmUpstream::start().await;
    let collector = Collector::down_at_first().await;
    let spool = tempfile::tempdir().unwrap();
    // An event is ~430 bytes: the spool holds a handful.
    let gateway = InProcess::start(&config(
        &upstream,
        &to_collector(&collector, spool.path(), "spool_max = 2048"),
    ))
    .await;
    for used in 1..=20 {
        chat(&gateway, "key-acme", "gpt-4o", "json", used).await;
    }
    assert!(
        eventually(async || counted(&gateway, "dropped") + spooled(&gateway) == 20.0).await,
        "every event spooled or dropped"
    );
    let dropped = counted(&gateway, "dropped") as u64;
    assert!(dropped >= 10, "{dropped} dropped");
    let on_disk: u64 = std::fs::read_dir(spool.path())
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(on_disk <= 2048 + 16, "{on_disk} bytes on disk");
    collector.up().await;
    let kept = 20 - dropped as usize;
    let events = received(&collector, kept).await;
    // The newest survive.
    assert_eq!(
        used_counts(&events),
        ((dropped + 1)..=20).collect::<Vec<_>>()
    );
    gateway.stop().await;
}

#[tokio::test]
async fn a_file_gets_one_json_line_per_event() {
    let upstream = LlmUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let gateway = InProcess::start_in(
        dir,
        &config(&upstream, "file = \"usage.jsonl\"\nbatch = 3\n"),
    )
    .await;
    for used in 1..=4 {
        chat(&gateway, "key-acme", "gpt-4o", "sse", used).await;
    }
    let path = gateway.dir.path().join("usage.jsonl");
    let lines = || -> Vec<Value> {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect()
    };
    assert!(eventually(async || lines().len() == 4).await);
    let ids: HashSet<String> = lines().iter().map(|e| e["id"].to_string()).collect();
    assert_eq!(ids.len(), 4);
    // Counted once synced, just after the lines are in the file.
    assert!(eventually(async || counted(&gateway, "sent") == 4.0).await);
    gateway.stop().await;
}

/// The batches the collector took, read by the official SDK.
fn read_with_the_sdk(collector: &Collector) -> Vec<Value> {
    let batches = collector.state.batches.lock().unwrap().join("\n");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/cloudevents_check.py"
    );
    let mut child = Command::new(common::needs::python())
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run python");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(batches.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the SDK refused an event: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the script's JSON")
}

#[tokio::test]
async fn the_cloudevents_sdk_reads_every_event() {
    if common::needs::skip(common::needs::CLOUDEVENTS) {
        return;
    }
    let upstream = LlmUpstream::start().await;
    let collector = Collector::start().await;
    let spool = tempfile::tempdir().unwrap();
    let gateway = InProcess::start(&config(
        &upstream,
        &to_collector(&collector, spool.path(), ""),
    ))
    .await;
    for (i, script) in ["json", "sse", "anthropic"].iter().enumerate() {
        chat(&gateway, "key-acme", "gpt-4o", script, 10 + i as u64).await;
    }
    chat(&gateway, "key-other", "gpt-4o", "json", 13).await;
    let sent = received(&collector, 4).await;
    let read = tokio::task::spawn_blocking({
        let collector = collector.clone();
        move || read_with_the_sdk(&collector)
    })
    .await
    .unwrap();
    assert_eq!(read.len(), collector.events().len());
    for event in &read {
        let id = event["id"].as_str().unwrap();
        // The SDK fills a missing id or time itself: they must be ours.
        let ours = sent
            .get(id)
            .unwrap_or_else(|| panic!("the SDK made up id {id}"));
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(event["type"], "tollgate.llm.usage");
        assert_eq!(event["source"], ours["source"]);
        assert_eq!(event["subject"], ours["subject"]);
        assert_eq!(event["datacontenttype"], "application/json");
        assert_eq!(event["data"], ours["data"]);
        // RFC 3339 with milliseconds, read as UTC.
        let time = event["time"].as_str().unwrap();
        assert!(time.ends_with("+00:00"), "{time}");
        let ours_time = ours["time"].as_str().unwrap();
        assert_eq!(&time[..19], &ours_time[..19], "{time} / {ours_time}");
    }
    gateway.stop().await;
}
