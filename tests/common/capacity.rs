//! An upstream with a real capacity, for overload tests: it serves at most
//! `slots` requests at once, each in `service` (tokio time, so a paused test
//! runs it instantly and exactly), queues up to `queue` more in arrival
//! order, and answers 503 at once past that. It counts what a backend's
//! operator would watch: the most requests it held at once (served and
//! queued), and how many it served and refused.
//!
//! The numbers can change while it runs ([`CapacityUpstream::set_slots`]),
//! which is how a test shows a backend losing capacity.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The header of the upstream's own 503, to tell it from the gateway's.
pub const FULL_HEADER: &str = "x-capacity";

struct State {
    /// Free service slots.
    slots: Arc<Semaphore>,
    /// Slots as configured now (a drop forgets permits as they come back).
    capacity: AtomicUsize,
    /// Slots to take out of service as they are released.
    to_forget: AtomicUsize,
    queue: usize,
    service: Duration,
    /// Requests held now: in service or queued.
    held: AtomicUsize,
    max_held: AtomicUsize,
    served: AtomicUsize,
    refused: AtomicUsize,
}

/// See the module doc. Stops when dropped.
pub struct CapacityUpstream {
    pub addr: SocketAddr,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl CapacityUpstream {
    /// `slots` at once, `service` each, up to `queue` waiting.
    pub async fn start(slots: usize, service: Duration, queue: usize) -> CapacityUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(State {
            slots: Arc::new(Semaphore::new(slots)),
            capacity: AtomicUsize::new(slots),
            to_forget: AtomicUsize::new(0),
            queue,
            service,
            held: AtomicUsize::new(0),
            max_held: AtomicUsize::new(0),
            served: AtomicUsize::new(0),
            refused: AtomicUsize::new(0),
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let _ = stream.set_nodelay(true);
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |_: Request<Incoming>| {
                        let state = state.clone();
                        async move { Ok::<_, hyper::Error>(serve(&state).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        CapacityUpstream { addr, state, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The most requests held at once (in service and queued).
    pub fn max_held(&self) -> usize {
        self.state.max_held.load(Ordering::SeqCst)
    }

    /// Forget the high-water mark (a new phase of a test).
    pub fn reset_max_held(&self) {
        let now = self.state.held.load(Ordering::SeqCst);
        self.state.max_held.store(now, Ordering::SeqCst);
    }

    /// Requests answered 200.
    pub fn served(&self) -> usize {
        self.state.served.load(Ordering::SeqCst)
    }

    /// Requests answered 503 (no room in the queue).
    pub fn refused(&self) -> usize {
        self.state.refused.load(Ordering::SeqCst)
    }

    /// Fewer slots from now on (more are not needed by the tests): the
    /// difference leaves service as busy slots are released.
    pub fn set_slots(&self, slots: usize) {
        let before = self.state.capacity.swap(slots, Ordering::SeqCst);
        let fewer = before.saturating_sub(slots);
        let forgotten = self.state.slots.forget_permits(fewer);
        self.state
            .to_forget
            .fetch_add(fewer - forgotten, Ordering::SeqCst);
    }
}

impl Drop for CapacityUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(state: &State) -> Response<Full<Bytes>> {
    let held = state.held.fetch_add(1, Ordering::SeqCst) + 1;
    let capacity = state.capacity.load(Ordering::SeqCst);
    if held > capacity + state.queue {
        state.held.fetch_sub(1, Ordering::SeqCst);
        state.refused.fetch_add(1, Ordering::SeqCst);
        let mut response = Response::new(Full::new(Bytes::from_static(b"full")));
        *response.status_mut() = hyper::StatusCode::SERVICE_UNAVAILABLE;
        response
            .headers_mut()
            .insert(FULL_HEADER, "full".parse().unwrap());
        return response;
    }
    state.max_held.fetch_max(held, Ordering::SeqCst);
    // Released however the request ends (a caller that goes away drops
    // this future while it queues or is served).
    let _held = Held(state);
    let permit = state.slots.acquire().await.expect("never closed");
    tokio::time::sleep(state.service).await;
    // A slot taken out of service by `set_slots` is not given back.
    let forget = state
        .to_forget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if forget {
        permit.forget();
    } else {
        drop(permit);
    }
    state.served.fetch_add(1, Ordering::SeqCst);
    Response::new(Full::new(Bytes::from_static(b"served")))
}

/// One request held by the upstream, until dropped.
struct Held<'s>(&'s State);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::SeqCst);
    }
}
