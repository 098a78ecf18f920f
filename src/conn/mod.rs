//! Listeners, worker threads, the accept loops, per-connection protections
//! and graceful drain.
//!
//! - **Threads** (`[server] workers`, see [`crate::worker`]): with one worker
//!   everything runs on the main thread's single-threaded runtime. With N > 1,
//!   N threads each run their own single-threaded runtime and their own accept
//!   loop per listener; a connection is accepted, served and closed on one
//!   thread, with no work stealing and no cross-thread wakeups. The main
//!   thread keeps signals, the admin listener and the reload bookkeeping,
//!   and tells the workers which sockets to serve.
//! - **Sockets**: with N > 1 workers every address gets N `SO_REUSEPORT`
//!   sockets, one per worker, and the kernel spreads incoming connections over
//!   them by a hash of the peer. One shared socket (`try_clone`d per worker)
//!   would also work, but every connection would wake every worker's epoll and
//!   a burst of connects lands mostly on whichever worker wakes first — the
//!   same imbalance nginx's `reuseport` exists to fix. Before binding them, a
//!   plain socket probes the address, so "address in use" is still an error
//!   when the holder is another process that also uses `SO_REUSEPORT` (e.g. a
//!   second tollgate), instead of silently sharing its traffic.
//! - **Connection cap**: `max_connections` is one cap for the whole process (a
//!   semaphore shared by all workers). A connection takes its slot right after
//!   `accept`; at the cap each accept loop holds at most one accepted
//!   connection waiting for a slot, and further ones wait in the kernel
//!   backlog. (Taking the slot *before* `accept` would let an idle worker's
//!   loop sit on a slot while connections queue on another worker's socket.)
//!   A loop holding a connection at the cap asks the keep-alive connection
//!   idle the longest, of any worker, to close and make room (`evict`).
//! - **Idle connections are cheap**: one waiting for its next request holds
//!   no buffer (the fast path gives them back and takes a set when bytes
//!   arrive) and no handler future (it lives in a block of its own while a
//!   request does); hyper's and HTTP/2's connections, larger, are boxed at
//!   the hand-off, so the task of every connection does not carry their size.
//! - **Accept errors** (e.g. out of file descriptors) back off and retry instead
//!   of ending the loop (as in mini-redis).
//! - **TLS** (`tls`): a `[server.tls]` listener's connection does its
//!   handshake in its own task, under `header_read_timeout`, with the
//!   snapshot's certificates of the moment it was accepted; then the TLS
//!   stream is served by the same code as a TCP stream below (generic over
//!   the stream), or by hyper's HTTP/2 server when ALPN chose `h2`.
//! - **HTTP/2** (`h2`): hyper's server, every stream a request through the
//!   same `proxy::handler::handle`. On cleartext listeners a client that
//!   opens with the HTTP/2 preface (h2c with prior knowledge) is handed to it
//!   by the fast path's hand-off, which sees the preface as a request it does
//!   not serve.
//! - **HTTP/1.1**: a connection is served by [`crate::http1::server`] (the gateway's own
//!   path for plain requests) until a request needs hyper; from then on hyper
//!   serves it, starting from the bytes `h1` had read ([`h1::Rewind`]),
//!   through [`h1::Gate`], which checks every later request by the same
//!   framing rule before hyper reads it. The watchdog and the drain below
//!   apply to both.
//! - **Slow clients**: a per-connection watchdog closes a connection whose
//!   request head is not complete within `header_read_timeout` (slowloris) and
//!   one idle between requests for `idle_timeout`. hyper's own header timer is
//!   off, because it also runs while a keep-alive connection is idle and would
//!   cap the idle time at the header timeout. The watchdog (`watchdog`) is
//!   one loop for the fast path, hyper's HTTP/1.1 and HTTP/2 alike, which
//!   also ends an evicted connection and starts the drain's polite close;
//!   each protocol gives only its own way to close.
//! - **Reloads**: a new `listen` list is applied as soon as the generation
//!   changes: new addresses are bound (on every worker), removed ones stop
//!   accepting on every worker (their open connections carry on).
//! - **Drain**: on shutdown every worker closes its listeners (new connections
//!   are refused) and starts the `Drain` the connections watch (an atomic
//!   load per poll, where the shutdown `watch` channel would lock a list every
//!   connection shares), open connections finish their in-flight request with
//!   `Connection: close`, and the drain waits at most `shutdown_timeout` for
//!   the connections of all workers. Worker runtimes stay up until the whole
//!   drain is over: a request draining on one worker may be using an upstream
//!   connection whose task runs on another.

pub(crate) mod drain;
pub(crate) mod evict;
pub(crate) mod h2;
pub(crate) mod tls;
pub(crate) mod watchdog;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use crate::app::App;
use crate::config::ServerConfig;
use crate::conn::drain::{Drain, DrainWatch};
use crate::conn::evict::Registry;
use crate::conn::watchdog::{Closing, Shutdown, Watchdog, register_task};
use crate::http1::server::ActivityAnswered;
use crate::http1::server::ConnActivity;
use crate::http1::server::linger::{LingerSwitch, Lingering};
use crate::http1::server::{self as h1, Gate, Rewind};
use crate::proxy::body::ClientBody;
use crate::proxy::handler::{Downstream, handle};
use crate::worker::worker_count;

/// The listen backlog of each socket, as `tokio::net::TcpListener::bind` (and
/// std) use. With N workers an address has N sockets, so N such queues.
const BACKLOG: i32 = 128;

/// One configured traffic address, bound: one listening socket per worker.
#[derive(Debug)]
pub struct Listener {
    /// As configured (the key for reloads; may have port 0).
    address: SocketAddr,
    /// A `[server.tls]` listener: connections start with a TLS handshake.
    tls: bool,
    /// Listening, non-blocking, one per worker (at least one).
    sockets: Vec<std::net::TcpListener>,
}

impl Listener {
    /// The address actually bound (the port chosen when the configured one is 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self.sockets.first() {
            Some(socket) => socket.local_addr(),
            None => Ok(self.address),
        }
    }

    /// Whether this is a `[server.tls]` listener.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls
    }
}

/// Binds every traffic listener of the configuration, one socket per worker
/// ([`worker_count`]). Errors name the address.
pub fn bind(addresses: &[SocketAddr]) -> io::Result<Vec<Listener>> {
    addresses
        .iter()
        .map(|address| bind_one(*address, false, worker_count()))
        .collect()
}

/// Binds every `[server.tls]` listener, as [`bind`] does the plain ones.
pub(crate) fn bind_tls(addresses: &[SocketAddr]) -> io::Result<Vec<Listener>> {
    addresses
        .iter()
        .map(|address| bind_one(*address, true, worker_count()))
        .collect()
}

fn bind_one(address: SocketAddr, tls: bool, workers: usize) -> io::Result<Listener> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("cannot listen on {address}: {e}"));
    if workers <= 1 {
        return Ok(Listener {
            address,
            tls,
            sockets: vec![listen(address, false).map_err(named)?],
        });
    }
    // The probe: a socket without SO_REUSEPORT cannot bind where anything
    // listens, even SO_REUSEPORT sockets of another process, which ours would
    // otherwise join. It also fixes the port to share when `address` has
    // port 0. Bound only, never listening: nothing queues on it.
    let probe = socket_for(address, false).map_err(named)?;
    probe.bind(&address.into()).map_err(named)?;
    let local = probe
        .local_addr()
        .map_err(named)?
        .as_socket()
        .unwrap_or(address);
    drop(probe);
    let sockets = (0..workers)
        .map(|_| listen(local, true))
        .collect::<io::Result<Vec<_>>>()
        .map_err(named)?;
    Ok(Listener {
        address,
        tls,
        sockets,
    })
}

fn socket_for(address: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    // As std and tokio do: a restart can bind while old connections linger in
    // TIME_WAIT.
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    Ok(socket)
}

/// A listening, non-blocking socket on `address`, ready for
/// `tokio::net::TcpListener::from_std` on the runtime that will accept.
fn listen(address: SocketAddr, reuse_port: bool) -> io::Result<std::net::TcpListener> {
    let socket = socket_for(address, reuse_port)?;
    socket.bind(&address.into())?;
    socket.listen(BACKLOG)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

/// A configured listener: its address (as configured, perhaps port 0) and
/// whether it is a `[server.tls]` one. Two listeners on port 0 of one
/// address are two endpoints.
type Endpoint = (SocketAddr, bool);

/// What every worker shares: the one connection cap, the drain signal and the
/// drain's count of live connections.
#[derive(Clone)]
struct Shared {
    app: Arc<App>,
    permits: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
    /// What connections watch for the drain: set by the workers when
    /// `shutdown` turns true (cheaper to poll than `shutdown` itself).
    drain: Arc<Drain>,
    /// Held by each worker until it stops accepting and by each connection
    /// task: the drain ends when all are gone.
    alive: mpsc::Sender<()>,
    /// Every live connection, for closing the oldest idle one at the cap.
    connections: Arc<Registry>,
}

/// What the main thread asks of a worker.
enum Command {
    /// Accept on this socket (the worker's own) for the configured `address`.
    Start {
        address: SocketAddr,
        tls: bool,
        socket: std::net::TcpListener,
    },
    /// Stop accepting for `endpoint` and close the socket; then answer `done`.
    Stop {
        endpoint: Endpoint,
        done: oneshot::Sender<()>,
    },
}

/// A worker as the main thread sees it.
struct Worker {
    commands: mpsc::UnboundedSender<Command>,
    /// Thread workers only: dropping it lets the worker's runtime end; the
    /// thread answers on `finished` once it has.
    exit: Option<oneshot::Sender<()>>,
    finished: Option<oneshot::Receiver<()>>,
}

/// A started server: workers accepting on the bound listeners. [`Server::run`]
/// applies reloads and drains.
pub struct Server {
    app: Arc<App>,
    shutdown: watch::Receiver<bool>,
    alive: mpsc::Receiver<()>,
    workers: Vec<Worker>,
    /// The addresses served, as configured, and whether each is TLS.
    served: Vec<Endpoint>,
    /// Configuration generations, subscribed when the server starts: a
    /// configuration installed before [`Server::run`] is first polled still
    /// moves the listeners (subscribing in `run` missed it).
    generations: watch::Receiver<u64>,
}

/// Starts [`worker_count`] workers serving `listeners` (from [`bind`]) until
/// `shutdown` turns true. With one worker it runs on the calling runtime, so
/// call it from within one. Fails when a worker thread or its runtime cannot
/// be created.
pub fn start(
    app: Arc<App>,
    listeners: Vec<Listener>,
    shutdown: watch::Receiver<bool>,
) -> io::Result<Server> {
    // Before the snapshot is read: a reload after this point is seen.
    let generations = app.subscribe_generations();
    let limits = app.snapshot().config.server.clone();
    let (alive_tx, alive_rx) = mpsc::channel::<()>(1);
    let shared = Shared {
        app: app.clone(),
        permits: Arc::new(Semaphore::new(limits.max_connections)),
        shutdown: shutdown.clone(),
        drain: Drain::new(worker_count()),
        alive: alive_tx,
        connections: Registry::new(worker_count()),
    };
    let count = worker_count();
    let mut workers = Vec::with_capacity(count);
    if count <= 1 {
        let (commands, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run_worker(shared, receiver));
        workers.push(Worker {
            commands,
            exit: None,
            finished: None,
        });
    } else {
        for index in 0..count {
            workers.push(spawn_worker(index, shared.clone())?);
        }
        // `shared` drops here: only workers and connections hold `alive`.
    }
    let mut server = Server {
        app,
        shutdown,
        alive: alive_rx,
        workers,
        served: Vec::new(),
        generations,
    };
    for listener in listeners {
        server.start_listener(listener);
    }
    Ok(server)
}

/// Starts worker thread `index` with its own single-threaded runtime.
fn spawn_worker(index: usize, shared: Shared) -> io::Result<Worker> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot start the runtime of worker {index}: {e}"),
            )
        })?;
    let (commands, receiver) = mpsc::unbounded_channel();
    let (exit_tx, exit_rx) = oneshot::channel::<()>();
    let (finished_tx, finished_rx) = oneshot::channel::<()>();
    std::thread::Builder::new()
        // Linux keeps 15 bytes of a thread name: short enough to keep the
        // index visible in `top -H` and `ps -L`.
        .name(format!("tollgate-wrk-{index}"))
        .spawn(move || {
            crate::worker::enter(index);
            runtime.block_on(async move {
                run_worker(shared, receiver).await;
                // Drained here, but keep running what this runtime holds
                // (upstream connections that requests draining on other
                // workers may be using) until the whole drain is over.
                let _ = exit_rx.await;
            });
            // Whatever is left (idle upstream connections, tunnels past the
            // drain) is dropped; a stuck blocking task does not hold us up.
            runtime.shutdown_timeout(Duration::from_millis(100));
            let _ = finished_tx.send(());
        })
        .map_err(|e| {
            io::Error::new(e.kind(), format!("cannot start worker thread {index}: {e}"))
        })?;
    Ok(Worker {
        commands,
        exit: Some(exit_tx),
        finished: Some(finished_rx),
    })
}

impl Server {
    /// Applies listener changes of reloads until the shutdown signal, then
    /// drains: returns when every connection of every worker has closed or
    /// `shutdown_timeout` has passed.
    pub async fn run(mut self) {
        let mut generations = self.generations.clone();
        let mut shutdown = self.shutdown.clone();
        // The listeners were bound for the configuration of their day: one
        // installed since (before this first poll) is applied now.
        self.reconcile().await;
        while !*shutdown.borrow() {
            tokio::select! {
                changed = shutdown.changed() => if changed.is_err() { break },
                changed = generations.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    self.reconcile().await;
                }
            }
        }
        // The workers see the same signal: each closes its listeners and
        // drops its `alive` sender; their connections hold the rest.
        let timeout = self.app.snapshot().config.server.shutdown_timeout;
        if tokio::time::timeout(timeout, self.alive.recv())
            .await
            .is_err()
        {
            tracing::warn!(
                ?timeout,
                "shutdown timeout reached with connections still open"
            );
        }
        // Let the worker threads end, briefly: the process exits anyway.
        let mut finished = Vec::new();
        for worker in &mut self.workers {
            worker.exit.take();
            finished.extend(worker.finished.take());
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            for done in finished {
                let _ = done.await;
            }
        })
        .await;
    }

    /// Hands each worker its socket of `listener`.
    fn start_listener(&mut self, listener: Listener) {
        let (address, tls) = (listener.address, listener.tls);
        for (index, (worker, socket)) in self.workers.iter().zip(listener.sockets).enumerate() {
            if worker
                .commands
                .send(Command::Start {
                    address,
                    tls,
                    socket,
                })
                .is_err()
            {
                // Its socket is closed with the command: the kernel spreads
                // connections over the remaining ones.
                tracing::error!(%address, worker = index, "worker has stopped; it does not serve this address");
            }
        }
        self.served.push((address, tls));
    }

    /// Stops `endpoint` on every worker; returns once all have closed it.
    async fn stop_listener(&mut self, endpoint: Endpoint) {
        let mut acks = Vec::with_capacity(self.workers.len());
        for worker in &self.workers {
            let (done, ack) = oneshot::channel();
            if worker
                .commands
                .send(Command::Stop { endpoint, done })
                .is_ok()
            {
                acks.push(ack);
            }
        }
        for ack in acks {
            let _ = ack.await;
        }
        self.served.retain(|served| *served != endpoint);
    }

    /// Applies a reloaded `listen` list: binds the new addresses, then closes
    /// the ones no longer listed (open connections on them carry on). A new
    /// address that cannot be bound is logged and skipped; nothing else changes.
    async fn reconcile(&mut self) {
        let server = self.app.snapshot().config.server.clone();
        let mut wanted: Vec<Endpoint> = server
            .listen
            .iter()
            .map(|address| (*address, false))
            .collect();
        if let Some(tls) = &server.tls {
            wanted.extend(tls.listen.iter().map(|address| (*address, true)));
        }
        let gone: Vec<Endpoint> = self
            .served
            .iter()
            .filter(|served| !wanted.contains(served))
            .copied()
            .collect();
        // An address that turned from plain to TLS or back is closed first,
        // so it can be bound again.
        for &(address, tls) in &gone {
            if wanted.contains(&(address, !tls)) {
                self.stop_listener((address, tls)).await;
            }
        }
        for &(address, tls) in &wanted {
            if self.served.contains(&(address, tls)) {
                continue;
            }
            match bind_one(address, tls, self.workers.len()) {
                Ok(listener) => {
                    let bound = listener.local_addr().unwrap_or(address);
                    let scheme = if tls { "https" } else { "http" };
                    tracing::info!(%bound, "listening on {scheme}://{bound} (added by reload)");
                    self.start_listener(listener);
                }
                Err(error) => {
                    tracing::error!(%address, %error, "reload: cannot listen on the new address; it is not served");
                }
            }
        }
        for (address, tls) in gone {
            if wanted.contains(&(address, !tls)) {
                continue;
            }
            self.stop_listener((address, tls)).await;
            tracing::info!(%address, "stopped listening (removed by reload)");
        }
    }
}

/// One worker: runs the accept loops the main thread asks for until the
/// shutdown signal, then closes them. Its connections drain on their own.
async fn run_worker(shared: Shared, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut shutdown = shared.shutdown.clone();
    let mut accepting = Accepting {
        shared,
        loops: HashMap::new(),
    };
    while !*shutdown.borrow() {
        tokio::select! {
            changed = shutdown.changed() => if changed.is_err() { break },
            command = commands.recv() => match command {
                Some(Command::Start { address, tls, socket }) => accepting.start(address, tls, socket),
                Some(Command::Stop { endpoint, done }) => {
                    accepting.stop(endpoint).await;
                    let _ = done.send(());
                }
                // The server is gone: stop as on shutdown.
                None => break,
            },
        }
    }
    // Every worker starts it; the first one to get here wakes them all.
    accepting.shared.drain.start();
    let endpoints: Vec<Endpoint> = accepting.loops.keys().copied().collect();
    for endpoint in endpoints {
        accepting.stop(endpoint).await;
    }
    // Dropping `accepting` drops this worker's `alive` sender.
}

/// A worker's running accept loops, by endpoint.
struct Accepting {
    shared: Shared,
    /// Per listener: its stop switch and its accept loop.
    loops: HashMap<Endpoint, (watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
}

impl Accepting {
    /// Registers `socket` with this worker's runtime and accepts on it.
    fn start(&mut self, address: SocketAddr, tls: bool, socket: std::net::TcpListener) {
        let listener = match TcpListener::from_std(socket) {
            Ok(listener) => listener,
            Err(error) => {
                // The socket is closed on return, so the kernel stops sending
                // this worker's share of connections to it.
                tracing::error!(%address, %error, worker = crate::worker::worker_index(), "cannot accept on this worker");
                return;
            }
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(self.shared.clone(), listener, tls, stop_rx));
        if let Some((old_stop, _)) = self.loops.insert((address, tls), (stop_tx, task)) {
            let _ = old_stop.send(true);
        }
    }

    /// Stops accepting for `endpoint` and closes its socket.
    async fn stop(&mut self, endpoint: Endpoint) {
        if let Some((stop, task)) = self.loops.remove(&endpoint) {
            let _ = stop.send(true);
            let _ = task.await;
        }
    }
}

/// How long an accept loop at the cap waits for the connection it asked to
/// close before it asks another (the first may have turned busy), or looks
/// again for an idle one when none was.
const EVICT_RETRY: Duration = Duration::from_millis(100);

/// An accepted connection and its connection slot, or `None` once `stop`
/// fires. The slot is taken after `accept` (see the module doc); at the cap,
/// the connection idle the longest among `evict`'s is asked to close to make
/// room (see [`evict`]). Accept errors (EMFILE and friends) back off and
/// retry rather than end the loop; `backoff` carries the current delay
/// between calls.
pub(crate) async fn accept_next(
    listener: &TcpListener,
    permits: &Arc<Semaphore>,
    evict: Option<&Registry>,
    stop: &mut watch::Receiver<bool>,
    backoff: &mut Duration,
) -> Option<(TcpStream, SocketAddr, OwnedSemaphorePermit)> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.changed() => return None,
        };
        match accepted {
            Ok((stream, peer)) => {
                *backoff = Duration::from_millis(5);
                let permit = match permits.clone().try_acquire_owned() {
                    Ok(permit) => permit,
                    // At the cap: make room by closing an idle connection,
                    // and wait for a slot.
                    Err(_) => {
                        let acquire = permits.clone().acquire_owned();
                        tokio::pin!(acquire);
                        loop {
                            if let Some(registry) = evict {
                                registry.evict_oldest_idle();
                            }
                            tokio::select! {
                                permit = &mut acquire => break permit.ok()?,
                                _ = tokio::time::sleep(EVICT_RETRY), if evict.is_some() => {}
                                _ = stop.changed() => return None,
                            }
                        }
                    }
                };
                return Some((stream, peer, permit));
            }
            Err(error) => {
                tracing::warn!(%error, "accept failed; backing off");
                tokio::time::sleep(*backoff).await;
                *backoff = (*backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

async fn accept_loop(
    shared: Shared,
    listener: TcpListener,
    tls: bool,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(5);
    while let Some((stream, peer, permit)) = accept_next(
        &listener,
        &shared.permits,
        Some(&shared.connections),
        &mut stop,
        &mut backoff,
    )
    .await
    {
        let _ = stream.set_nodelay(true);
        let app = shared.app.clone();
        let drain = shared.drain.watch(crate::worker::worker_index());
        let alive = shared.alive.clone();
        let connections = shared.connections.clone();
        if tls {
            // The handshake runs in the connection's own task: a slow one
            // holds up nobody else.
            tokio::spawn(async move {
                tls::serve(app, stream, peer, drain, connections).await;
                drop(permit);
                drop(alive);
            });
        } else {
            tokio::spawn(async move {
                let downstream = Downstream {
                    peer,
                    proto: "http",
                };
                serve_connection(app, stream, downstream, drain, connections).await;
                drop(permit);
                drop(alive);
            });
        }
    }
}

/// Serves one HTTP/1.1 connection (the fast path, then hyper) over a TCP
/// stream or, after its handshake, a TLS one, from `downstream` (its proto
/// is `"http"` or `"https"`, for the forwarding fields).
pub(crate) async fn serve_connection<S>(
    app: Arc<App>,
    stream: S,
    downstream: Downstream,
    mut drain: DrainWatch,
    connections: Arc<Registry>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(ConnActivity::new());
    let _registered = connections.register(crate::worker::worker_index(), activity.clone());
    register_task(&activity).await;
    // Only what the connection reads of its settings: a copy of the whole
    // server section would be kept (with its allocations) as long as the
    // connection, idle or not.
    let limits = ConnLimits::of(&app.snapshot().config.server);
    let mut io = ActivityIo {
        inner: stream,
        activity: activity.clone(),
    };
    let check = tokio::time::sleep(limits.header_read_timeout.min(limits.idle_timeout));
    tokio::pin!(check);
    let mut watchdog = Watchdog::new(
        &activity,
        app.metrics(),
        limits,
        &downstream.peer,
        &mut drain,
        false,
        check.as_mut(),
    );

    // Plain requests first, served by our own HTTP/1.1 path (`crate::http1::server`).
    let handed_over = {
        let respond = |request| {
            activity.request_started();
            // The handler's future itself, not wrapped: it attaches the
            // request's completion to the body, and its field lines go into
            // the head as they are (`h1` writes them).
            handle(&app, downstream, request, Some(activity.clone()))
        };
        // The fast path relays interim (1xx) responses; hyper's servers,
        // which take over at a hand-off, have no way to send them.
        activity.relay_interim(true);
        let fast = h1::serve(&mut io, &*activity, limits.max_header_bytes, respond);
        tokio::pin!(fast);
        // The fast path closes by itself once the request in flight is
        // answered, or at once when there is none.
        let served = watchdog.serve(fast.as_mut(), |_, why| match why {
            Closing::SlowHead => Shutdown::Now,
            Closing::Politely if activity.begin_closing() => Shutdown::Now,
            Closing::Politely => Shutdown::Begun,
        });
        match served.await {
            Some(ended) => ended,
            None => return,
        }
    };
    activity.relay_interim(false);
    let prefix = match handed_over {
        // h2c with prior knowledge: the connection preface is no HTTP/1.1
        // request, so the fast path handed it over; hyper's HTTP/2 server
        // takes it from the bytes read so far.
        Ok(h1::Ended::HandOff(prefix)) if prefix.starts_with(h2::PREFACE) => {
            let io = Rewind::new(prefix, io);
            let closing = watchdog.is_closing();
            // Boxed, as hyper's HTTP/1.1 connection below.
            Box::pin(h2::serve(app, io, activity, downstream, drain, closing)).await;
            return;
        }
        Ok(h1::Ended::HandOff(prefix)) => prefix,
        Ok(h1::Ended::Closed) => {
            refused(&app, downstream.peer, &activity);
            return;
        }
        Err(error) => {
            tracing::debug!(peer = %downstream.peer, %error, "connection ended with an error");
            // A refusal whose answer could not be written still counts.
            refused(&app, downstream.peer, &activity);
            return;
        }
    };

    // Everything else, from the first request that is not plain: hyper.
    // Boxed, once per handed-off connection: hyper's connection (with the
    // handler's future in it) is larger than the fast path's state, and the
    // task of every connection would otherwise carry its size, idle or not.
    let io = Rewind::new(prefix, io);
    Box::pin(serve_handed_off(
        app.clone(),
        io,
        activity.clone(),
        downstream,
        watchdog,
    ))
    .await;
    refused(&app, downstream.peer, &activity);
}

/// The request the codec refused on `activity`'s connection, if it refused
/// one (malformed, framed ambiguously, a head too large): counted as
/// `tollgate_requests_total{route="none"}` with its status, and given an
/// access-log line, so a flood of them (a smuggling scan, a broken client)
/// shows where every other answer does.
fn refused(app: &App, peer: SocketAddr, activity: &ConnActivity) {
    let Some(refusal) = activity.refusal() else {
        return;
    };
    let status = refusal.status.as_u16();
    app.metrics().record_refused(status);
    crate::access_log::log(&crate::access_log::AccessEntry {
        method: "-",
        path: "-",
        route: crate::metrics::NO_ROUTE,
        status,
        elapsed: None,
        upstream: None,
        client_ip: peer.ip(),
        limit: None,
        retries: 0,
        refused: Some(refusal.detail),
        front: "proxy",
        tokens: None,
    });
}

/// Serves a connection with hyper's HTTP/1.1 server from the first request
/// the fast path handed over (its bytes replayed by `io`), under the watch
/// the fast path was served under.
async fn serve_handed_off<S>(
    app: Arc<App>,
    io: Rewind<ActivityIo<S>>,
    activity: Arc<ConnActivity>,
    downstream: Downstream,
    mut watchdog: Watchdog<'_>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let max_header_bytes = watchdog.limits().max_header_bytes;
    let service = hyper_service(app, activity.clone(), downstream);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(None)
        .keep_alive(true)
        // Room for the largest allowed head: the gate refuses longer ones
        // (431 problem+json) before hyper could.
        .max_buf_size((max_header_bytes + 16 * 1024).max(8 * 1024));
    // Lingering: hyper answers some requests before reading their bodies
    // (denied, too large, an upstream's early answer); see `crate::http1::server::linger`.
    // The gate checks every later request before hyper reads it (`h1::gate`).
    let io = TokioIo::new(Lingering::new(
        Gate::new(io, max_header_bytes, ActivityAnswered(activity.clone())),
        ActivityLinger(activity),
    ));
    let connection = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(connection);
    let served = watchdog.serve(connection.as_mut(), |connection, why| match why {
        Closing::SlowHead => Shutdown::Now,
        Closing::Politely => {
            connection.graceful_shutdown();
            Shutdown::Begun
        }
    });
    if let Some(Err(error)) = served.await {
        tracing::debug!(peer = %downstream.peer, %error, "connection ended with an error");
    }
}

/// The service hyper's servers (HTTP/1.1 after the hand-off, HTTP/2) call
/// for each request: the same handler as the fast path's.
pub(crate) fn hyper_service(
    app: Arc<App>,
    activity: Arc<ConnActivity>,
    downstream: Downstream,
) -> impl hyper::service::Service<
    http::Request<hyper::body::Incoming>,
    Response = http::Response<crate::answer::body::ResponseBody>,
    Error = std::convert::Infallible,
    Future = impl Future<
        Output = Result<
            http::Response<crate::answer::body::ResponseBody>,
            std::convert::Infallible,
        >,
    > + Send,
> + Clone {
    service_fn(move |request: http::Request<hyper::body::Incoming>| {
        let app = app.clone();
        let activity = activity.clone();
        activity.request_started();
        async move {
            // Not boxed: the handler's future is kept small (the
            // upstream exchange is boxed where it starts), so hyper's one
            // move of it into its dispatcher costs less than a per-request
            // allocation of it did (user time 5.4 -> 4.8 us/request; see
            // BENCHMARKS.md).
            let (mut response, fields) = handle(
                &app,
                downstream,
                request.map(ClientBody::hyper),
                Some(activity),
            )
            .await;
            fields.apply(response.headers_mut());
            Ok::<_, std::convert::Infallible>(response)
        }
    })
}

/// The settings a connection reads, copied at accept (a reload applies to
/// connections accepted after it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_header_bytes: usize,
}

impl ConnLimits {
    pub(crate) fn of(server: &ServerConfig) -> ConnLimits {
        ConnLimits {
            header_read_timeout: server.header_read_timeout,
            idle_timeout: server.idle_timeout,
            max_header_bytes: server.max_header_bytes,
        }
    }
}

/// A connection's linger switch, reached through its activity.
struct ActivityLinger(Arc<ConnActivity>);

impl std::ops::Deref for ActivityLinger {
    type Target = LingerSwitch;

    fn deref(&self) -> &LingerSwitch {
        &self.0.linger
    }
}

/// A stream (TCP, or TLS over TCP) that tells its [`ConnActivity`] when
/// bytes arrive.
pub(crate) struct ActivityIo<S> {
    pub(crate) inner: S,
    pub(crate) activity: Arc<ConnActivity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for ActivityIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.bytes_read();
        }
        result
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ActivityIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
