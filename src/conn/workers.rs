//! The worker threads and the [`Server`] that runs them: which worker
//! accepts on which socket, reloads that move the listeners, and the drain.
//!
//! - **Threads** (`[server] workers`, see [`crate::worker`]): with one worker
//!   everything runs on the main thread's single-threaded runtime. With N > 1,
//!   N threads each run their own single-threaded runtime and their own accept
//!   loop per listener; a connection is accepted, served and closed on one
//!   thread, with no work stealing and no cross-thread wakeups. The main
//!   thread keeps signals, the admin listener and the reload bookkeeping,
//!   and tells the workers which sockets to serve ([`Command`]).
//! - **The hand-off**: each worker's accept loop ([`super::accept`]) hands
//!   an accepted connection to the TLS handshake ([`super::tls`]) or the
//!   HTTP/1.1 path ([`super::serve`]) in a task of its own. One
//!   `max_connections` cap covers the whole process (a semaphore every
//!   worker shares), and at the cap an idle connection of any worker can be
//!   asked to close ([`super::evict`]).
//! - **Side listeners** ([`Server::serve_side`]): the decision service's
//!   listener is served by every worker the same way, one `SO_REUSEPORT`
//!   socket each, so its gRPC and `/auth` decisions spread over the workers
//!   as the traffic does; the front that owns it gives the accept loop.
//!   Bound at start, not moved by reloads.
//! - **Reloads**: a new `listen` list is applied as soon as the generation
//!   changes ([`super::reconcile`] says what changes): new addresses are
//!   bound (on every worker), removed ones stop accepting on every worker
//!   (their open connections carry on).
//! - **Drain**: on shutdown every worker closes its listeners (new connections
//!   are refused) and starts the `Drain` the connections watch (an atomic
//!   load per poll, where the shutdown `watch` channel would lock a list every
//!   connection shares), open connections finish their in-flight request with
//!   `Connection: close`, and the drain waits at most `shutdown_timeout` for
//!   the connections of all workers. Worker runtimes stay up until the whole
//!   drain is over: a request draining on one worker may be using an upstream
//!   connection whose task runs on another.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use crate::app::App;
use crate::conn::accept::{Holding, accept_and_serve};
use crate::conn::drain::{Drain, DrainWatch};
use crate::conn::evict::Registry;
use crate::conn::listener::{Listener, bind_one};
use crate::conn::reconcile::{self, Endpoint, Plan};
use crate::conn::serve::serve_connection;
use crate::conn::tls;
use crate::worker::worker_count;

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

impl Shared {
    /// What a connection's task holds: the app, its worker's drain watch
    /// and an `alive` sender (the drain waits for it).
    fn for_connection(&self) -> (Arc<App>, DrainWatch, mpsc::Sender<()>) {
        (
            self.app.clone(),
            self.drain.watch(crate::worker::worker_index()),
            self.alive.clone(),
        )
    }
}

/// How a worker serves its socket of a side listener
/// ([`Server::serve_side`]): the front's accept loop on it, which returns
/// once the shutdown signal turns true and it has stopped accepting.
pub(crate) type SideServe = Arc<
    dyn Fn(TcpListener, watch::Receiver<bool>) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send
        + Sync,
>;

/// What the main thread asks of a worker.
enum Command {
    /// Serve this socket (the worker's own) of a side listener with `serve`
    /// until the shutdown.
    Side {
        address: SocketAddr,
        socket: std::net::TcpListener,
        serve: SideServe,
    },
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

/// Starts [`worker_count`] workers serving `listeners` (from [`super::bind`]) until
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

    /// Serves `listener` (one socket per worker, [`super::bind_side`]) on
    /// every worker with `serve` until the shutdown: the decision service's
    /// listener, whose connections the kernel then spreads over the workers
    /// as it does the traffic's. Reloads do not move it.
    pub(crate) fn serve_side(&mut self, listener: Listener, serve: SideServe) {
        let address = listener.address;
        for (index, (worker, socket)) in self.workers.iter().zip(listener.sockets).enumerate() {
            let command = Command::Side {
                address,
                socket,
                serve: serve.clone(),
            };
            if worker.commands.send(command).is_err() {
                tracing::error!(%address, worker = index, "worker has stopped; it does not serve this address");
            }
        }
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
        let wanted = reconcile::wanted(&self.app.snapshot().config.server);
        let plan = Plan::new(&self.served, &wanted);
        for endpoint in plan.flipped {
            self.stop_listener(endpoint).await;
        }
        for (address, tls) in plan.bind {
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
        for endpoint in plan.close {
            self.stop_listener(endpoint).await;
            tracing::info!(address = %endpoint.0, "stopped listening (removed by reload)");
        }
    }
}

/// One worker: runs the accept loops the main thread asks for until the
/// shutdown signal, then closes them. Its connections drain on their own.
async fn run_worker(shared: Shared, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut shutdown = shared.shutdown.clone();
    // The deadlines of this worker's connections. Once the drain starts
    // they are no longer watched (each is asked to close), so the sweep
    // ends with the accepting.
    let sweeping = tokio::spawn(crate::conn::sweep::sweep(
        shared.connections.clone(),
        crate::worker::worker_index(),
    ));
    let mut accepting = Accepting {
        shared,
        loops: HashMap::new(),
        sides: Vec::new(),
    };
    while !*shutdown.borrow() {
        tokio::select! {
            changed = shutdown.changed() => if changed.is_err() { break },
            command = commands.recv() => match command {
                Some(Command::Start { address, tls, socket }) => accepting.start(address, tls, socket),
                Some(Command::Side { address, socket, serve }) => accepting.side(address, socket, &serve),
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
    // The side listeners' loops saw the same signal and stop accepting.
    for side in std::mem::take(&mut accepting.sides) {
        let _ = side.await;
    }
    sweeping.abort();
    // Dropping `accepting` drops this worker's `alive` sender.
}

/// A worker's running accept loops, by endpoint.
struct Accepting {
    shared: Shared,
    /// Per listener: its stop switch and its accept loop.
    loops: HashMap<Endpoint, (watch::Sender<bool>, tokio::task::JoinHandle<()>)>,
    /// The side listeners' accept loops, which stop on the shutdown signal.
    sides: Vec<tokio::task::JoinHandle<()>>,
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

    /// Registers a side listener's `socket` with this worker's runtime and
    /// runs `serve` on it.
    fn side(&mut self, address: SocketAddr, socket: std::net::TcpListener, serve: &SideServe) {
        match TcpListener::from_std(socket) {
            Ok(listener) => {
                let serving = serve(listener, self.shared.shutdown.clone());
                self.sides.push(tokio::spawn(serving));
            }
            Err(error) => {
                tracing::error!(%address, %error, worker = crate::worker::worker_index(), "cannot accept on this worker");
            }
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

/// A worker's accept loop on its socket of one listener: each connection
/// is handed to the TLS handshake or the HTTP/1.1 path in its own task,
/// with a slot of the process's cap.
async fn accept_loop(
    shared: Shared,
    listener: TcpListener,
    tls: bool,
    stop: watch::Receiver<bool>,
) {
    let permits = shared.permits.clone();
    let evict = Some(shared.connections.clone());
    // One loop per kind, not one closure choosing per connection: the task
    // of a plain connection then carries only the plain path's future.
    if tls {
        accept_and_serve(listener, permits, evict, stop, |stream, peer| {
            shared.tls_connection(stream, peer)
        })
        .await;
    } else {
        accept_and_serve(listener, permits, evict, stop, |stream, peer| {
            shared.plain_connection(stream, peer)
        })
        .await;
    }
}

impl Shared {
    /// The future of a plain connection's task (the accept loop adds its
    /// slot): served by the HTTP/1.1 path, holding `alive` to its end.
    /// Not an `async move` block: see `Holding`.
    fn plain_connection(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> Holding<impl Future<Output = ()> + Send + 'static, mpsc::Sender<()>> {
        let _ = stream.set_nodelay(true);
        let (app, drain, alive) = self.for_connection();
        Holding::new(
            serve_connection(app, stream, peer, false, drain, &self.connections),
            alive,
        )
    }

    /// The future of a TLS listener's connection's task: its handshake (in
    /// the connection's own task, so a slow one holds up nobody else),
    /// then the same serving as a plain one.
    fn tls_connection(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
    ) -> Holding<impl Future<Output = ()> + Send + 'static, mpsc::Sender<()>> {
        let _ = stream.set_nodelay(true);
        let (app, drain, alive) = self.for_connection();
        let connections = self.connections.clone();
        Holding::new(tls::serve(app, stream, peer, drain, connections), alive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// What every idle keep-alive connection's task holds: the accept
    /// loop's future of a plain connection, its slot and liveness
    /// included: 256 bytes. tokio's task cell adds 104 bytes (header,
    /// scheduler, task id, stage, trailer) and rounds up to 128: at 280
    /// bytes or less the cell takes 384 bytes, one more byte and 512. An
    /// `async` block around a connection's future once stored it twice
    /// (5.7 KB an idle connection, 3.2 KB before); the `async fn`s that
    /// kept their arguments twice took 768 bytes (a cell of 896); a timer
    /// per connection (tokio's `Sleep`, now the worker's sweep) 520 (a
    /// cell of 640); the connection's parts borrowed one by one, the fast
    /// path's result in scope across the hand-off's `.await`s and the
    /// busy spell's slot awaited by reference 408 (a cell of 512). Release
    /// builds lay futures out as this build does (the layout is fixed
    /// before MIR's optimisations); raise the bound only knowingly.
    #[tokio::test]
    async fn an_idle_connection_s_task_stays_small() {
        let config = Config::from_bytes(
            std::path::Path::new("gateway.toml"),
            b"[server]\nlisten = \"127.0.0.1:0\"\n[upstreams.api]\nurl = \"http://127.0.0.1:9\"\n\
              [[routes]]\nname = \"all\"\nmatch = { path_prefix = \"/\" }\nupstream = \"api\"\n",
        )
        .unwrap();
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let (alive, _alive_rx) = mpsc::channel(1);
        let shared = Shared {
            app: App::new(config),
            permits: Arc::new(Semaphore::new(2)),
            shutdown,
            drain: Drain::new(1),
            alive,
            connections: Registry::new(1),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let _client = TcpStream::connect(address).await.unwrap();
        let (stream, peer) = listener.accept().await.unwrap();
        let permit = shared.permits.clone().try_acquire_owned().unwrap();
        let task = Holding::new(shared.plain_connection(stream, peer), permit);
        let size = std::mem::size_of_val(&task);
        println!("a plain connection's task future: {size} bytes");
        // 408 before `ConnParts`; 520 with a timer of its own; 768 while
        // `serve_connection` and `http1::server::serve` were `async fn`s
        // (each argument kept twice); 4,872 bytes (heaptrack) when an
        // async block wrapped it twice.
        assert!(
            size <= 280,
            "a plain connection's task future is {size} bytes (over 280, tokio's cell grows by 128)"
        );
    }
}
