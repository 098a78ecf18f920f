//! Keep-alive HTTP/1.1 connections to one upstream address.
//!
//! Replaces hyper-util's general-purpose pooled client on the forwarding path:
//! the profile put the upstream half of a proxied request at twice the user
//! time of the downstream half, and most of that was the general pool (keyed
//! lookups behind a lock on checkout and return, per-request futures and
//! connection bookkeeping). Here a pool serves one address, so checkout is a
//! `Vec::pop` under a lock held for nanoseconds, and a connection goes back
//! when the response body it carried has ended ([`PooledConn`] is dropped
//! with the body).
//!
//! A keep-alive connection the upstream has closed is only found out when it
//! is used: hyper hands an unsent request back (`try_send_request`), and the
//! pool retries it on another connection — never a request that was sent.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;

use super::body::RequestBody;

/// Connections idle longer than this are not reused (upstreams commonly close
/// idle keep-alive connections after a minute or more).
const IDLE_TIMEOUT: Duration = Duration::from_secs(50);
/// Most idle connections kept per address; more are closed when returned.
const MAX_IDLE: usize = 256;

/// Why a request could not be sent or answered.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// No connection could be opened (refused, unreachable, timed out).
    #[error("cannot connect to {address}")]
    Connect {
        address: String,
        #[source]
        source: io::Error,
    },
    /// The connection failed while the request was sent or answered.
    #[error("the upstream connection failed")]
    Request(#[source] hyper::Error),
}

impl PoolError {
    pub fn is_connect(&self) -> bool {
        matches!(self, PoolError::Connect { .. })
    }
}

struct Idle {
    sender: SendRequest<RequestBody>,
    since: Instant,
}

/// The keep-alive connections to one upstream address (`host:port`).
pub struct ConnectionPool {
    address: String,
    connect_timeout: Duration,
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for ConnectionPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionPool")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// A connection lent to one request; back to its pool when dropped (with the
/// response body), unless the connection has closed meanwhile.
pub struct PooledConn {
    sender: Option<SendRequest<RequestBody>>,
    pool: Arc<ConnectionPool>,
}

impl std::fmt::Debug for PooledConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledConn").finish_non_exhaustive()
    }
}

impl Drop for PooledConn {
    fn drop(&mut self) {
        if let Some(sender) = self.sender.take()
            && !sender.is_closed()
        {
            let mut idle = self.pool.idle.lock();
            if idle.len() < MAX_IDLE {
                idle.push(Idle {
                    sender,
                    since: Instant::now(),
                });
            }
        }
    }
}

impl ConnectionPool {
    pub fn new(address: String, connect_timeout: Duration) -> Arc<ConnectionPool> {
        Arc::new(ConnectionPool {
            address,
            connect_timeout,
            idle: Mutex::new(Vec::new()),
        })
    }

    /// The most recently used open connection, if any (LIFO keeps few warm).
    fn take_idle(&self) -> Option<SendRequest<RequestBody>> {
        let mut idle = self.idle.lock();
        while let Some(conn) = idle.pop() {
            if !conn.sender.is_closed() && conn.since.elapsed() < IDLE_TIMEOUT {
                return Some(conn.sender);
            }
        }
        None
    }

    async fn connect(&self) -> Result<SendRequest<RequestBody>, PoolError> {
        let connect_error = |source| PoolError::Connect {
            address: self.address.clone(),
            source,
        };
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.address))
            .await
            .map_err(|_| {
                connect_error(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))
            })?
            .map_err(connect_error)?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(PoolError::Request)?;
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(%error, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// Sends `request` on a pooled connection (or a new one) and waits for
    /// the response head. The returned [`PooledConn`] must live as long as
    /// the response body.
    pub async fn send(
        self: &Arc<Self>,
        mut request: Request<RequestBody>,
    ) -> Result<(Response<Incoming>, PooledConn), PoolError> {
        loop {
            let (mut sender, fresh) = match self.take_idle() {
                Some(sender) => (sender, false),
                None => (self.connect().await?, true),
            };
            if let Err(error) = sender.ready().await {
                if fresh {
                    return Err(PoolError::Request(error));
                }
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => {
                    let conn = PooledConn {
                        sender: Some(sender),
                        pool: self.clone(),
                    };
                    return Ok((response, conn));
                }
                Err(mut error) => match error.take_message() {
                    // Not sent: a stale keep-alive connection. Another one.
                    Some(unsent) if !fresh => request = unsent,
                    _ => return Err(PoolError::Request(error.into_error())),
                },
            }
        }
    }
}
