//! Binding the traffic listeners: one listening socket per worker for each
//! configured address (`[server] listen`, `[server.tls] listen`), and the
//! decision service's the same way ([`bind_side`]).
//!
//! With N > 1 workers every address gets N `SO_REUSEPORT` sockets, one per
//! worker, and the kernel spreads incoming connections over them by a hash
//! of the peer. One shared socket (`try_clone`d per worker) would also work,
//! but every connection would wake every worker's epoll and a burst of
//! connects lands mostly on whichever worker wakes first — the same
//! imbalance nginx's `reuseport` exists to fix. Before binding them, a plain
//! socket probes the address, so "address in use" is still an error when
//! the holder is another process that also uses `SO_REUSEPORT` (e.g. a
//! second tollgate), instead of silently sharing its traffic.

use std::io;
use std::net::SocketAddr;

use socket2::{Domain, Protocol, Socket, Type};

use crate::worker::worker_count;

/// The listen backlog of each socket, as `tokio::net::TcpListener::bind` (and
/// std) use. With N workers an address has N sockets, so N such queues.
const BACKLOG: i32 = 128;

/// One configured traffic address, bound: one listening socket per worker.
#[derive(Debug)]
pub struct Listener {
    /// As configured (the key for reloads; may have port 0).
    pub(super) address: SocketAddr,
    /// A `[server.tls]` listener: connections start with a TLS handshake.
    pub(super) tls: bool,
    /// Listening, non-blocking, one per worker (at least one).
    pub(super) sockets: Vec<std::net::TcpListener>,
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

/// Binds a side listener (the decision service's, `what` its key for
/// errors) as [`bind`] does a traffic one: one socket per worker.
pub(crate) fn bind_side(address: SocketAddr, what: &str) -> io::Result<Listener> {
    bind_one(address, false, worker_count())
        .map_err(|e| io::Error::new(e.kind(), format!("{e} ({what})")))
}

/// Binds `address` with one socket for each of `workers` (a plain socket
/// when there is one worker, `SO_REUSEPORT` ones behind a probe otherwise).
pub(super) fn bind_one(address: SocketAddr, tls: bool, workers: usize) -> io::Result<Listener> {
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
