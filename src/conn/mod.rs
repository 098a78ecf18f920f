//! Listeners, worker threads, the accept loops, per-connection protections
//! and graceful drain: everything between a listening socket and the
//! request handler.
//!
//! | file | its job |
//! | --- | --- |
//! | [`listener`] | binding the traffic addresses: one socket per worker (`SO_REUSEPORT`) |
//! | [`workers`] | the worker threads and the [`Server`]: which worker serves which socket (the decision listener's too), reloads, the drain |
//! | [`reconcile`] | what a reload's `listen` list keeps, binds and closes (a pure plan) |
//! | [`accept`] | the accept loop every listener runs (traffic, admin, decision): slots, back-off on accept errors, a task per connection |
//! | [`serve`] | one HTTP/1.1 connection: the fast path, then the hand-off to hyper |
//! | [`service`] | the request handler as the service hyper's servers call |
//! | [`tls`] | the TLS handshake, then the same connection code |
//! | [`h2`] | hyper's HTTP/2 server (ALPN `h2`, or h2c with prior knowledge) |
//! | [`watchdog`] | one connection's deadlines: slow heads, idle time, eviction, polite close |
//! | [`sweep`] | a worker's one timer: wakes its connections whose deadlines are due |
//! | [`evict`] | at `max_connections`, closing the connection idle the longest |
//! | [`drain`] | the shutdown signal connections watch |
//!
//! - **Idle connections are cheap**: one waiting for its next request holds
//!   no buffer (the fast path gives them back and takes a set when bytes
//!   arrive), no handler future and no room for the busy state of serving a
//!   request (each lives in a block of its own, which travels with the
//!   buffers); hyper's and HTTP/2's connections, larger, are boxed at the
//!   hand-off, so the task of every connection does not carry their size;
//!   a task holds its connection's future once ([`accept::Holding`], no
//!   `async` block around it); the connection's future keeps each of its
//!   arguments once (`serve::serve_connection` is no `async fn`, which
//!   would keep them twice) and its watchdog, drain watch and registration
//!   in 32-bit fields; what it holds for its whole life is kept once
//!   ([`watchdog::ConnParts`]) and lent with one pointer; it has no timer of its own (its worker's [`sweep`]
//!   wakes it when its deadlines are due). `workers::tests` bounds the
//!   task's size, under the step where tokio's task cell grows by 128 bytes.
//! - **TLS** (`tls`): a `[server.tls]` listener's connection does its
//!   handshake in its own task, under `header_read_timeout`, with the
//!   snapshot's certificates of the moment it was accepted; then the TLS
//!   stream is served by the same code as a TCP stream (generic over the
//!   stream), or by hyper's HTTP/2 server when ALPN chose `h2`.
//! - **HTTP/2** (`h2`): hyper's server, every stream a request through the
//!   same `proxy::handler::handle`. On cleartext listeners a client that
//!   opens with the HTTP/2 preface (h2c with prior knowledge) is handed to it
//!   by the fast path's hand-off, which sees the preface as a request it does
//!   not serve.
//! - **Slow clients**: a per-connection watchdog closes a connection whose
//!   request head is not complete within `header_read_timeout` (slowloris) and
//!   one idle between requests for `idle_timeout`. hyper's own header timer is
//!   off, because it also runs while a keep-alive connection is idle and would
//!   cap the idle time at the header timeout. Their deadlines are acted on
//!   at the granularity of the worker's sweep (at most a quarter of a second late,
//!   never early). The watchdog (`watchdog`) is
//!   one loop for the fast path, hyper's HTTP/1.1 and HTTP/2 alike, which
//!   also ends an evicted connection and starts the drain's polite close;
//!   each protocol gives only its own way to close.

pub(crate) mod accept;
pub(crate) mod drain;
pub(crate) mod evict;
pub(crate) mod h2;
pub(crate) mod listener;
pub(crate) mod reconcile;
pub(crate) mod serve;
pub(crate) mod service;
pub(crate) mod sweep;
pub(crate) mod tls;
pub(crate) mod watchdog;
pub(crate) mod workers;

pub use listener::{Listener, bind};
pub(crate) use listener::{bind_side, bind_tls};
pub(crate) use workers::SideServe;
pub use workers::{Server, start};
