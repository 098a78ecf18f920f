//! An upstream with a known capacity, for `bench/overload.sh`: it serves at
//! most `SLOTS` requests at once, each for a service time of `SERVICE_MS`
//! (fixed, or exponential of that mean with `--exponential`); the rest wait
//! in arrival order, and a request that finds `QUEUE` already waiting is
//! answered 503 at once, as a backend protecting itself does. A waiting
//! request whose client goes away leaves the queue.
//!
//! ```text
//! cargo build --release --example capacity_upstream
//! target/release/examples/capacity_upstream PORT SLOTS SERVICE_MS QUEUE [--exponential]
//! ```
//!
//! Its own paths, under `/_upstream/`:
//! - `GET /_upstream/stats`: one line, `served=N refused=N slots=N
//!   in_service=N waiting=N max_in_service=N over_capacity=N` (`max_in_service`
//!   the most served at once; `over_capacity` requests that found more in
//!   service than the slots of the moment, which a lowered capacity drains
//!   and otherwise stays 0);
//! - `POST /_upstream/slots?n=N`: the capacity becomes `N` (requests in
//!   service finish; a raised capacity takes waiting requests at once);
//! - `POST /_upstream/reset`: the counters back to 0.
//!
//! On SIGTERM or SIGINT it prints the stats line to stdout and exits. It
//! runs on one thread (the bench pins it to a core of its own).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The slots, the queue and the counters.
#[derive(Default)]
struct Upstream {
    slots: u64,
    in_service: u64,
    /// Waiting requests, first come first: sending hands one a slot.
    waiting: VecDeque<oneshot::Sender<()>>,
    queue: u64,
    served: u64,
    refused: u64,
    max_in_service: u64,
    over_capacity: u64,
}

impl Upstream {
    fn stats(&self) -> String {
        // A waiter whose client went away is still in the queue until a
        // slot reaches it: count only the live ones.
        let waiting = self.waiting.iter().filter(|w| !w.is_closed()).count();
        format!(
            "served={} refused={} slots={} in_service={} waiting={waiting} max_in_service={} over_capacity={}",
            self.served,
            self.refused,
            self.slots,
            self.in_service,
            self.max_in_service,
            self.over_capacity
        )
    }

    fn take_slot(&mut self) {
        self.in_service += 1;
        self.max_in_service = self.max_in_service.max(self.in_service);
    }

    /// Hands free slots to the waiting requests, oldest first.
    fn hand_out(&mut self) {
        while self.in_service < self.slots {
            let Some(waiter) = self.waiting.pop_front() else {
                return;
            };
            // A waiter gone (its client left) takes nothing.
            if waiter.send(()).is_ok() {
                self.take_slot();
            }
        }
    }

    /// The waiting requests whose clients are still there.
    fn live_waiting(&mut self) -> u64 {
        self.waiting.retain(|w| !w.is_closed());
        self.waiting.len() as u64
    }
}

/// Gives its slot back when dropped: a response sent, or a connection
/// closed mid-service.
struct Held(Rc<RefCell<Upstream>>);

impl Drop for Held {
    fn drop(&mut self) {
        let mut upstream = self.0.borrow_mut();
        upstream.in_service -= 1;
        upstream.hand_out();
    }
}

struct Settings {
    service: Duration,
    exponential: bool,
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

async fn serve(
    request: Request<Incoming>,
    upstream: Rc<RefCell<Upstream>>,
    settings: Rc<Settings>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = request.uri().path();
    if let Some(admin) = path.strip_prefix("/_upstream/") {
        let mut state = upstream.borrow_mut();
        return Ok(match admin {
            "stats" => text(StatusCode::OK, state.stats() + "\n"),
            "reset" => {
                (state.served, state.refused, state.over_capacity) = (0, 0, 0);
                state.max_in_service = state.in_service;
                text(StatusCode::OK, "reset\n".into())
            }
            "slots" => {
                let n = request
                    .uri()
                    .query()
                    .and_then(|q| q.strip_prefix("n="))
                    .and_then(|n| n.parse::<u64>().ok())
                    .filter(|&n| n > 0);
                match n {
                    Some(n) => {
                        state.slots = n;
                        state.hand_out();
                        text(StatusCode::OK, format!("slots={n}\n"))
                    }
                    None => text(StatusCode::BAD_REQUEST, "slots?n=N, N > 0\n".into()),
                }
            }
            _ => text(StatusCode::NOT_FOUND, "stats, slots?n=N, reset\n".into()),
        });
    }
    let wait = {
        let mut state = upstream.borrow_mut();
        if state.in_service < state.slots && state.live_waiting() == 0 {
            state.take_slot();
            None
        } else if state.live_waiting() >= state.queue {
            state.refused += 1;
            return Ok(text(StatusCode::SERVICE_UNAVAILABLE, "full\n".into()));
        } else {
            let (tx, rx) = oneshot::channel();
            state.waiting.push_back(tx);
            Some(rx)
        }
    };
    if let Some(rx) = wait {
        // The sender is only dropped unsent by `live_waiting`, for a
        // closed receiver: this one is open, so it is always sent.
        if rx.await.is_err() {
            return Ok(text(StatusCode::SERVICE_UNAVAILABLE, "lost\n".into()));
        }
    }
    let held = Held(upstream.clone());
    {
        let mut state = upstream.borrow_mut();
        if state.in_service > state.slots {
            state.over_capacity += 1;
        }
    }
    let service = if settings.exponential {
        // 1 − U is in (0, 1]: the logarithm is finite.
        settings.service.mul_f64(-(1.0 - fastrand::f64()).ln())
    } else {
        settings.service
    };
    tokio::time::sleep(service).await;
    upstream.borrow_mut().served += 1;
    drop(held);
    Ok(text(StatusCode::OK, "ok\n".into()))
}

fn usage() -> ! {
    eprintln!("usage: capacity_upstream PORT SLOTS SERVICE_MS QUEUE [--exponential]");
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 || args.len() > 5 {
        usage();
    }
    let number = |i: usize| args[i].parse::<u64>().unwrap_or_else(|_| usage());
    let (port, slots, service_ms, queue) = (number(0), number(1), number(2), number(3));
    let exponential = match args.get(4).map(String::as_str) {
        None => false,
        Some("--exponential") => true,
        Some(_) => usage(),
    };
    if slots == 0 || port > u64::from(u16::MAX) {
        usage();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let listener = TcpListener::bind(("127.0.0.1", port as u16))
            .await
            .unwrap_or_else(|e| {
                eprintln!("capacity_upstream: cannot listen on 127.0.0.1:{port}: {e}");
                std::process::exit(1);
            });
        let upstream = Rc::new(RefCell::new(Upstream {
            slots,
            queue,
            ..Upstream::default()
        }));
        let settings = Rc::new(Settings {
            service: Duration::from_millis(service_ms),
            exponential,
        });
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("a SIGTERM handler");
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = terminate.recv() => break,
                _ = tokio::signal::ctrl_c() => break,
            };
            let Ok((stream, _)) = accepted else {
                // Out of descriptors, most likely: back off, keep serving.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (upstream, settings) = (upstream.clone(), settings.clone());
            tokio::task::spawn_local(async move {
                let service =
                    service_fn(move |request| serve(request, upstream.clone(), settings.clone()));
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
        println!("{}", upstream.borrow().stats());
    });
}
