//! An open-loop HTTP/1.1 load generator for `bench/flood.sh`: requests
//! start on a fixed schedule (`RATE` per second), whether or not earlier
//! ones have been answered, and each one's latency is measured from the
//! moment it was scheduled to start. A closed-loop client (wrk) waits for
//! an answer before it sends again, so a stall of the server delays the
//! next requests instead of showing in their latency (coordinated
//! omission); here a stall shows in every request scheduled during it.
//!
//! Keep-alive connections are reused when one is idle and opened when none
//! is (their count is printed). The requests run on one thread (the
//! client is light, and its own delays count in the latency as they would
//! for any client); a second thread keeps the schedule.
//!
//! ```text
//! cargo build --release --example open_loop
//! target/release/examples/open_loop URL RATE SECONDS [NAME:VALUE]...
//! ```
//!
//! Prints one line: `requests=N ok=N refused=N failed=N connections=N
//! p50_us=… p99_us=… p999_us=… max_us=… s429=N s503=N other=N good=N
//! ok_p50_us=… ok_p99_us=…` (`ok` are 2xx, `refused` other statuses, of
//! them `s429` and `s503` the two refusals and `other` the rest, `failed`
//! requests with no answer; `good` the 2xx answered within the SLO,
//! `OPEN_LOOP_SLO_MS` in the environment, default 500; `ok_p50_us` and
//! `ok_p99_us` the latencies of the 2xx alone, for `bench/overload.sh`).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// What one request came to.
#[derive(Clone, Copy)]
enum Outcome {
    /// A status, and the time from its scheduled start to its body's end.
    Answered(u16, Duration),
    Failed,
}

/// The idle connections, and how many were opened.
#[derive(Default)]
struct Connections {
    idle: Vec<SendRequest<Empty<Bytes>>>,
    opened: usize,
}

struct Target {
    address: String,
    uri: Uri,
    host: String,
    headers: Vec<(String, String)>,
}

fn usage() -> ! {
    eprintln!("usage: open_loop URL RATE SECONDS [NAME:VALUE]...");
    std::process::exit(2);
}

fn parse_args() -> (Target, f64, f64) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        usage();
    }
    let uri: Uri = args[0].parse().unwrap_or_else(|_| usage());
    let authority = uri.authority().unwrap_or_else(|| usage()).to_string();
    let rate: f64 = args[1].parse().unwrap_or_else(|_| usage());
    let seconds: f64 = args[2].parse().unwrap_or_else(|_| usage());
    if rate <= 0.0 || seconds <= 0.0 {
        usage();
    }
    let headers = args[3..]
        .iter()
        .map(|field| {
            let (name, value) = field.split_once(':').unwrap_or_else(|| usage());
            (name.trim().to_owned(), value.trim().to_owned())
        })
        .collect();
    let target = Target {
        address: authority.clone(),
        uri: uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .parse()
            .unwrap(),
        host: authority,
        headers,
    };
    (target, rate, seconds)
}

/// An idle connection, or a new one.
async fn connection(
    target: &Target,
    pool: &RefCell<Connections>,
) -> Option<SendRequest<Empty<Bytes>>> {
    while let Some(sender) = pool.borrow_mut().idle.pop() {
        if sender.is_ready() {
            return Some(sender);
        }
    }
    let stream = TcpStream::connect(&target.address).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::task::spawn_local(conn);
    pool.borrow_mut().opened += 1;
    Some(sender)
}

/// One request, scheduled to start at `due`.
async fn request(target: &Target, pool: &RefCell<Connections>, due: Instant) -> Outcome {
    let Some(mut sender) = connection(target, pool).await else {
        return Outcome::Failed;
    };
    let mut builder = Request::get(target.uri.clone()).header("host", &target.host);
    for (name, value) in &target.headers {
        builder = builder.header(name, value);
    }
    let Ok(request) = builder.body(Empty::new()) else {
        return Outcome::Failed;
    };
    let Ok(response) = sender.send_request(request).await else {
        return Outcome::Failed;
    };
    let status = response.status().as_u16();
    if response.into_body().collect().await.is_err() {
        return Outcome::Failed;
    }
    let elapsed = due.elapsed();
    pool.borrow_mut().idle.push(sender);
    Outcome::Answered(status, elapsed)
}

/// The `q` quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> u128 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_micros()
}

fn main() {
    let (target, rate, seconds) = parse_args();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let local = tokio::task::LocalSet::new();
    let outcomes = local.block_on(&runtime, async move {
        let target = Rc::new(target);
        let pool = Rc::new(RefCell::new(Connections::default()));
        let total = (rate * seconds).round() as usize;
        let interval = Duration::from_secs_f64(1.0 / rate);
        let start = Instant::now() + Duration::from_millis(50);
        // The schedule is kept by a thread of its own: tokio's timer
        // fires on whole milliseconds, which would add up to one to every
        // latency; a thread's sleep ends within tens of microseconds.
        let (due_tx, mut due_rx) = tokio::sync::mpsc::unbounded_channel();
        let pacer = std::thread::spawn(move || {
            for i in 0..total {
                let due = start + interval.mul_f64(i as f64);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                if due_tx.send(due).is_err() {
                    return;
                }
            }
        });
        let mut tasks = Vec::with_capacity(total);
        while let Some(due) = due_rx.recv().await {
            let (target, pool) = (target.clone(), pool.clone());
            tasks.push(tokio::task::spawn_local(async move {
                // Past this, a request counts as failed: a run ends.
                tokio::time::timeout(Duration::from_secs(10), request(&target, &pool, due))
                    .await
                    .unwrap_or(Outcome::Failed)
            }));
        }
        pacer.join().expect("the pacer");
        let mut outcomes = Vec::with_capacity(total);
        for task in tasks {
            outcomes.push(task.await.unwrap_or(Outcome::Failed));
        }
        let opened = pool.borrow().opened;
        (outcomes, opened)
    });
    let (outcomes, opened) = outcomes;
    let slo = std::env::var("OPEN_LOOP_SLO_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .map_or(Duration::from_millis(500), Duration::from_millis);
    let (mut ok, mut refused, mut failed) = (0, 0, 0);
    let (mut s429, mut s503, mut other, mut good) = (0, 0, 0, 0);
    let mut latencies = Vec::with_capacity(outcomes.len());
    let mut ok_latencies = Vec::with_capacity(outcomes.len());
    for outcome in &outcomes {
        match *outcome {
            Outcome::Answered(status, elapsed) => {
                if (200..300).contains(&status) {
                    ok += 1;
                    ok_latencies.push(elapsed);
                    if elapsed <= slo {
                        good += 1;
                    }
                } else {
                    refused += 1;
                    match status {
                        429 => s429 += 1,
                        503 => s503 += 1,
                        _ => other += 1,
                    }
                }
                latencies.push(elapsed);
            }
            Outcome::Failed => failed += 1,
        }
    }
    latencies.sort_unstable();
    ok_latencies.sort_unstable();
    println!(
        "requests={} ok={ok} refused={refused} failed={failed} connections={opened} \
         p50_us={} p99_us={} p999_us={} max_us={} s429={s429} s503={s503} other={other} \
         good={good} ok_p50_us={} ok_p99_us={}",
        outcomes.len(),
        quantile(&latencies, 0.50),
        quantile(&latencies, 0.99),
        quantile(&latencies, 0.999),
        latencies.last().map_or(0, Duration::as_micros),
        quantile(&ok_latencies, 0.50),
        quantile(&ok_latencies, 0.99),
    );
}
