//! Connections to upstreams: an [`Upstream`] of the configuration is a
//! connection pool per URL ([`pool`]), the health of each URL
//! ([`health`]: passive ejection, and the active checks of [`check`]; kept
//! across reloads by [`registry`]) and the choice among the URLs that are
//! up ([`balance`]). A request's wait for its answer is bounded with a
//! reused timer ([`deadline`]). What a request looks like on its way
//! upstream is the pipeline's (`proxy::forward`).
//!
//! # A request's way to a URL
//!
//! [`Upstream::start_connect`] picks a URL by `balance` among those that
//! take requests and reuses an idle connection to it, or
//! [`Upstream::connect_from`] opens one. A connection that
//! could not be opened — refused, unreachable, timed out, a handshake
//! refused: nothing was sent — is recorded against its URL and the next
//! URL is tried at once, whatever the request's method and whether or not
//! its route retries (as nginx's `proxy_next_upstream error`). Only when no
//! URL is left is the request failed: `502` with the last connect error,
//! or `503` when no URL of the list was up to begin with. The pipeline
//! then records how the exchange went ([`Upstream::record_status`],
//! [`Upstream::record_failure`]), which is what ejects a failing URL.
//!
//! A request sent on a connection that then failed before any byte of a
//! response came back (an instance stopping under load closes connections
//! it has accepted, or a keep-alive close races the request) is sent once
//! more, to another URL when the list has one, when that cannot repeat an
//! action: an idempotent method (RFC 9110 §9.2.2: `GET`, `HEAD`, `OPTIONS`,
//! `TRACE`, `PUT`, `DELETE`) and a body that can be sent again (none, or
//! in memory) — nginx's default, `proxy_next_upstream error`, for the same
//! requests. Only once, outside any retry budget, counted as a retry
//! (`reason="reset"`) ([`Upstream::retry_unanswered`]). A route with
//! `retry = {...}` has its policy decide instead, as before
//! ([`Attempt::for_retry_policy`]). (A reused keep-alive connection found
//! closed is replaced within the pool first, `pool`'s doc.)

pub(crate) mod balance;
pub(crate) mod check;
pub(crate) mod deadline;
pub(crate) mod fetch;
pub(crate) mod h2;
pub(crate) mod health;
pub mod pool;
pub(crate) mod registry;
pub(crate) mod retry;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use http::request::Parts;
use http::{Method, Response, Uri};
use parking_lot::Mutex;

use crate::config::{Balance, UpstreamConfig};
use crate::http::field_lines::FieldLines;
use crate::http1::client::exchange::OutgoingBody;
use crate::http1::client::{InterimSink, OwnFields, UpstreamBody, UpstreamConn};
use balance::{Choice, UrlSet};
use h2::{H2Client, H2Sender};
use health::{Failure, LazyNow, Nanos, UrlHealth};
use pool::{BodyErrors, ConnectionPool, PoolError, PoolTls};
use rustls::pki_types::ServerName;
use tokio::time::Instant;
use tokio_util::either::Either;

/// One upstream of a snapshot: its settings, a connection pool per URL,
/// and each URL's health (shared with the other snapshots that list it).
#[derive(Debug)]
pub(crate) struct Upstream {
    pub(crate) config: UpstreamConfig,
    /// Aligned with `config.urls`.
    pools: Vec<Arc<ConnectionPool>>,
    /// With `http2 = true`, the HTTP/2 connection of each URL (aligned with
    /// `config.urls`; empty otherwise).
    h2: Vec<H2Client>,
    /// Aligned with `config.urls`.
    health: Vec<Arc<UrlHealth>>,
    next: AtomicUsize,
    /// Held while an ejection is decided, so that two URLs failing at once
    /// cannot both pass the `max_ejected` count. Taken only by a request
    /// whose failure completes a URL's run of `after`: a cold path.
    ejecting: Mutex<()>,
    /// Requests answered 503 for want of a URL that is up, since the last
    /// summary, and whether that spell was logged.
    unavailable: AtomicU64,
    unavailable_logged: AtomicBool,
    /// Requests sent once more because their URL answered nothing
    /// ([`Upstream::retry_unanswered`]).
    retried_unanswered: prometheus_client::metrics::counter::Counter,
}

/// A connection to one URL, ready for a request.
pub(crate) enum Connection {
    /// From the URL's HTTP/1.1 pool; `reused`: it carried requests before.
    H1 { conn: UpstreamConn, reused: bool },
    /// The URL's HTTP/2 connection.
    H2(H2Sender),
}

/// How a connection starts ([`Upstream::start_connect`]).
pub(crate) enum Start<'a> {
    /// An idle connection of the URL chosen: nothing to wait for.
    Ready(usize, Connection, InFlight<'a>),
    /// The URL chosen has none at hand: [`Upstream::connect_from`].
    Open(usize, InFlight<'a>),
}

/// Why no connection could be had.
#[derive(Debug)]
pub(crate) enum NotConnected {
    /// No URL of the list takes requests (all ejected or down).
    NoHealthy,
    /// Every URL that takes requests refused; the last one's error.
    Connect(PoolError),
}

/// One client request's way through an upstream's URLs, across its
/// retries: where it went, where it could not go.
#[derive(Debug, Default)]
pub(crate) struct Attempt {
    /// URLs the request was sent to: a retry prefers others.
    pub(crate) avoid: UrlSet,
    /// URLs that refused a connection in the current try: not tried again
    /// in it.
    exclude: UrlSet,
    /// The URL of the exchange under way (the one a timeout is charged to).
    pub(crate) current: Option<usize>,
    /// The last URL tried: round robin goes on from the one after it, so
    /// a URL that refuses or fails does not hand its successor a second
    /// turn (the turn counter moves once per client request).
    last: Option<usize>,
    /// The one try more of a request its URL answered nothing is spent
    /// ([`Upstream::retry_unanswered`]), or a route's `retry` decides
    /// instead.
    unanswered_retried: bool,
}

impl Attempt {
    /// The way of a request on a route with `retry = {...}`: its policy
    /// decides what is sent again (and spends its budget), so no request is
    /// sent again for having gone unanswered besides.
    pub(crate) fn for_retry_policy() -> Attempt {
        Attempt {
            unanswered_retried: true,
            ..Attempt::default()
        }
    }

    /// A request of `method` may still go once more if its URL answers
    /// nothing (its body permitting).
    pub(crate) fn may_retry_unanswered(&self, method: &Method) -> bool {
        !self.unanswered_retried && pool::is_idempotent(method)
    }
}

/// A request in flight on a URL, counted for `least_request` while it
/// lives (nothing is counted under `round_robin`).
pub(crate) struct InFlight<'a>(Option<&'a UrlHealth>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(health) = self.0 {
            health.end_request();
        }
    }
}

impl Upstream {
    /// `body_errors` counts response bodies that fail after their head;
    /// `health` is each URL's state (from the registry; a URL without one
    /// gets a fresh state).
    pub(crate) fn new(
        config: UpstreamConfig,
        body_errors: BodyErrors,
        mut health: Vec<Arc<UrlHealth>>,
    ) -> Upstream {
        let pools = config
            .urls
            .iter()
            .map(|url| {
                ConnectionPool::with_tls(
                    socket_address(url),
                    config.connect_timeout,
                    config.read_timeout,
                    body_errors.clone(),
                    pool_tls(&config, url, false),
                )
            })
            .collect();
        let h2 = if config.http2 {
            config
                .urls
                .iter()
                .map(|url| {
                    let scheme = url.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP);
                    H2Client::new(
                        socket_address(url),
                        scheme,
                        config.connect_timeout,
                        config.read_timeout,
                        pool_tls(&config, url, true),
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        health.truncate(config.urls.len());
        for url in &config.urls[health.len()..] {
            health.push(Arc::new(UrlHealth::new(
                Arc::from(config.name.as_str()),
                Arc::from(registry::url_label(url)),
                config.health.as_ref(),
                health::HealthSignals::none(),
            )));
        }
        let retried_unanswered = body_errors.retried_unanswered.clone();
        Upstream {
            config,
            retried_unanswered,
            pools,
            h2,
            health,
            next: AtomicUsize::new(0),
            ejecting: Mutex::new(()),
            unavailable: AtomicU64::new(0),
            unavailable_logged: AtomicBool::new(false),
        }
    }

    /// Closes idle upstream connections that expired or were closed by the
    /// upstream.
    pub(crate) fn prune_idle(&self) {
        for pool in &self.pools {
            pool.prune();
        }
    }

    /// The next URL's index by `balance`, among those that take requests,
    /// never one in `exclude`, one in `avoid` only when no other is left;
    /// `None`: no URL is left. Round robin starts from the URL after
    /// `after` when given, else takes the next turn.
    pub(crate) fn pick(
        &self,
        exclude: UrlSet,
        avoid: UrlSet,
        after: Option<usize>,
    ) -> Option<usize> {
        let mut now = LazyNow::default();
        let urls = &self.health;
        // One URL: no turn to take. The counter is a cache line every
        // worker would otherwise write on every request.
        if urls.len() == 1 {
            return (!exclude.contains(0) && urls[0].is_available(&mut now)).then_some(0);
        }
        let choice = Choice {
            urls,
            exclude,
            avoid,
            slow_start: self.config.slow_start,
        };
        let mut draw = |n: u64| fastrand::u64(0..=n);
        match self.config.balance {
            Balance::RoundRobin => {
                let start = match after {
                    Some(url) => url + 1,
                    None => self.next.fetch_add(1, Ordering::Relaxed),
                };
                choice.round_robin(start % urls.len(), &mut now, &mut draw)
            }
            Balance::LeastRequest => choice.least_request(&mut now, &mut draw),
        }
    }

    /// The start of a connection to a URL that takes requests, for the
    /// next try of `attempt`: the URL chosen (in `attempt.current` and
    /// `attempt.avoid`), with its idle connection if it has one — then
    /// nothing is left to wait for, which is the common case, and no
    /// future is made or polled for it (~150 instructions of state
    /// machines, and of moving the connection through them, per request).
    /// Otherwise [`Upstream::connect_from`] opens one.
    pub(crate) fn start_connect(
        &self,
        attempt: &mut Attempt,
        now: Instant,
    ) -> Result<Start<'_>, NotConnected> {
        attempt.exclude = UrlSet::default();
        let (url, in_flight) = self.choose(attempt, None)?;
        Ok(match self.idle(url, now) {
            Some(connection) => Start::Ready(url, connection, in_flight),
            None => Start::Open(url, in_flight),
        })
    }

    /// A new connection to `url`, chosen by [`Upstream::start_connect`];
    /// when it cannot be opened, the failure is recorded and the next URL
    /// tried at once (see the module doc), until none is left.
    pub(crate) async fn connect_from<'a>(
        &'a self,
        mut url: usize,
        mut in_flight: InFlight<'a>,
        attempt: &mut Attempt,
    ) -> Result<(usize, Connection, InFlight<'a>), NotConnected> {
        loop {
            match self.open(url).await {
                Ok(connection) => return Ok((url, connection, in_flight)),
                Err(error) => {
                    drop(in_flight);
                    attempt.current = None;
                    attempt.exclude.insert(url);
                    self.record_failure(url, Failure::Connect, Some(&error));
                    if self.health.len() > 1 {
                        tracing::debug!(upstream = %self.config.name, url, "connection refused; trying the next URL");
                    }
                    (url, in_flight) = self.choose(attempt, Some(error))?;
                    if let Some(connection) = self.idle(url, Instant::now()) {
                        return Ok((url, connection, in_flight));
                    }
                }
            }
        }
    }

    /// The next URL of `attempt`, noted in it, with the request counted on
    /// it; `refused`, the error of the URL tried before in this try, is
    /// what the request fails with when no URL is left.
    #[inline]
    fn choose(
        &self,
        attempt: &mut Attempt,
        refused: Option<PoolError>,
    ) -> Result<(usize, InFlight<'_>), NotConnected> {
        let Some(url) = self.pick(attempt.exclude, attempt.avoid, attempt.last) else {
            return Err(match refused {
                Some(error) => NotConnected::Connect(error),
                None => {
                    self.note_unavailable();
                    NotConnected::NoHealthy
                }
            });
        };
        attempt.current = Some(url);
        attempt.last = Some(url);
        attempt.avoid.insert(url);
        Ok((url, self.begin(url)))
    }

    fn begin(&self, url: usize) -> InFlight<'_> {
        if self.config.balance != Balance::LeastRequest {
            return InFlight(None);
        }
        let health = &*self.health[url];
        health.begin_request();
        InFlight(Some(health))
    }

    /// A connection to `url` at hand at `now`: an idle one of its HTTP/1.1
    /// pool.
    fn idle(&self, url: usize, now: Instant) -> Option<Connection> {
        if !self.h2.is_empty() {
            return None;
        }
        let conn = self.pools[url].take_idle(now)?;
        Some(Connection::H1 { conn, reused: true })
    }

    /// A connection to `url` to wait for, when none is at hand
    /// ([`Upstream::idle`]): its HTTP/2 connection, or a new one of its
    /// pool.
    async fn open(&self, url: usize) -> Result<Connection, PoolError> {
        match self.h2.get(url) {
            // Boxed: an HTTP/2 connect (its TLS and h2 handshakes) inline
            // would size every request's exchange future, which is copied
            // into its box per request (~9 KB, +11,500 instructions on
            // the HTTP/1.1 path too).
            Some(h2) => Ok(Connection::H2(Box::pin(h2.connection()).await?)),
            None => Ok(Connection::H1 {
                conn: self.pools[url].connect_new().await?,
                reused: false,
            }),
        }
    }

    /// Sends the request (`parts`, `body`, and `own`'s fields) on
    /// `connection` (to `url`) and waits for the response head; the body is
    /// read as the response is polled. `parts`' header map goes back with
    /// the response, emptied. `now`: when the request started (what an
    /// HTTP/1.1 connection freed with its head counts as idle from).
    ///
    /// Not an `async fn`: the HTTP/1.1 exchange is returned as it is, for
    /// the caller to await where it pinned it, with no future of this one's
    /// around it that would hold the arguments once more. The HTTP/2 one is
    /// boxed on its own: inline, both would size the caller's future.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn exchange<'a, B>(
        &'a self,
        url: usize,
        connection: Connection,
        parts: &'a mut Parts,
        body: B,
        own: &'a OwnFields,
        interim: Option<&'a dyn InterimSink>,
        now: Instant,
    ) -> impl Future<Output = Result<(Response<UpstreamBody>, FieldLines), PoolError>> + 'a
    where
        B: OutgoingBody + Send + 'static,
    {
        match connection {
            Connection::H1 { conn, reused } => Either::Left(self.pools[url].send_on(
                (conn, reused),
                parts,
                body,
                own,
                interim,
                now,
            )),
            Connection::H2(sender) => Either::Right(Box::pin(async move {
                match self.h2.get(url) {
                    Some(h2) => h2.send_on(sender, parts, body, own).await,
                    None => Err(PoolError::Request(std::io::Error::other(
                        "an HTTP/2 connection for a URL without one",
                    ))),
                }
            })),
        }
    }

    /// Whether the request whose exchange with `url` failed with `error`
    /// goes once more (see the module doc): nothing of a response came back
    /// (or, the connection it was on found closed, no new one could be
    /// opened) and `attempt` has not had that try yet — the caller has
    /// checked the method ([`Attempt::may_retry_unanswered`]) and holds the
    /// body. If so, the failure is recorded on `url` and the retry counted;
    /// `attempt` avoids `url` from now on when another URL is up.
    pub(crate) fn retry_unanswered(
        &self,
        attempt: &mut Attempt,
        url: usize,
        error: &PoolError,
    ) -> bool {
        if attempt.unanswered_retried || !(error.is_unanswered() || error.is_connect()) {
            return false;
        }
        attempt.unanswered_retried = true;
        let failure = if error.is_connect() {
            Failure::Connect
        } else {
            Failure::Reset
        };
        self.record_failure(url, failure, Some(error));
        self.retried_unanswered.inc();
        tracing::debug!(upstream = %self.config.name, url, %error, "no answer; sending the request once more");
        true
    }

    /// A response head from `url`: a failure if `eject.on` names its
    /// status, else a success.
    pub(crate) fn record_status(&self, url: usize, status: u16) {
        if self.config.eject.fails_on(status) {
            self.record_failure(url, Failure::Status(status), None);
        } else {
            self.health[url].record_success();
        }
    }

    /// A failed request to `url`, with its error for the log. A failure
    /// that completes a run of `eject.after` ejects the URL, unless
    /// `max_ejected` of the list is out already (then every further
    /// `after` failures ask again).
    pub(crate) fn record_failure(
        &self,
        url: usize,
        failure: Failure,
        error: Option<&(dyn std::error::Error + 'static)>,
    ) {
        let policy = &self.config.eject;
        let run = self.health[url].record_failure(failure, policy, error);
        if run >= policy.after && (run - policy.after).is_multiple_of(policy.after) {
            self.eject(url, failure);
        }
    }

    fn eject(&self, url: usize, failure: Failure) {
        let urls = self.health.len();
        let allowed = self.config.eject.max_ejected(urls);
        if allowed == 0 {
            return;
        }
        let _one_at_a_time = self.ejecting.lock();
        let now = health::now();
        let out = self
            .health
            .iter()
            .enumerate()
            .filter(|(i, health)| *i != url && health.is_out(now))
            .count();
        if out >= allowed {
            tracing::debug!(
                upstream = %self.config.name,
                url = %self.health[url].url,
                "not ejected: max_ejected of the list is out already"
            );
            return;
        }
        let ejected = self.health[url].eject(failure, &self.config.eject, now);
        if ejected.is_some() && out + 1 == urls {
            tracing::warn!(
                upstream = %self.config.name,
                "upstream has no healthy instance: its requests are answered 503"
            );
        }
    }

    /// Whether some URL takes requests at `now`.
    pub(crate) fn has_available(&self, now: Nanos) -> bool {
        self.health.iter().any(|health| !health.is_out(now))
    }

    /// A request answered 503 for want of a URL that is up: the first of a
    /// spell is logged, the rest counted for [`Upstream::summarise`].
    fn note_unavailable(&self) {
        self.unavailable.fetch_add(1, Ordering::Relaxed);
        if !self.unavailable_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                upstream = %self.config.name,
                "upstream has no healthy instance: answering 503; further such requests are counted and summarised every {}s",
                health::SUMMARY_SECONDS
            );
        }
    }

    /// The summary tick of the upstream's 503s (its URLs' ticks are the
    /// registry's).
    pub(crate) fn summarise(&self) {
        if !self.unavailable_logged.load(Ordering::Relaxed) {
            return;
        }
        let answered = self.unavailable.swap(0, Ordering::Relaxed);
        if answered == 0 {
            self.unavailable_logged.store(false, Ordering::Relaxed);
            return;
        }
        tracing::warn!(
            upstream = %self.config.name,
            answered,
            "upstream has no healthy instance: {answered} requests answered 503 in the last {}s",
            health::SUMMARY_SECONDS
        );
    }
}

/// The handshake of an `https://` URL: the upstream's trust roots, and its
/// `sni` or else the URL's host as the name; offering ALPN `h2` alone when
/// `h2`.
fn pool_tls(config: &UpstreamConfig, url: &Uri, h2: bool) -> Option<PoolTls> {
    if url.scheme_str() != Some("https") {
        return None;
    }
    let tls = config.tls.as_ref()?;
    let name = match &tls.sni {
        Some(name) => name.clone(),
        None => {
            let host = url.host()?.trim_start_matches('[').trim_end_matches(']');
            ServerName::try_from(host.to_owned()).ok()?
        }
    };
    let client = if h2 {
        let mut client = (*tls.config).clone();
        client.alpn_protocols = vec![b"h2".to_vec()];
        std::sync::Arc::new(client)
    } else {
        tls.config.clone()
    };
    Some(PoolTls {
        connector: tokio_rustls::TlsConnector::from(client),
        name,
    })
}

/// The `host:port` to connect to for an upstream URL. `Uri::host` keeps an
/// IPv6 literal's brackets, so the result is always connectable text.
fn socket_address(url: &Uri) -> String {
    // Validation guarantees an `http://` or `https://` URL with an authority.
    let host = url.host().unwrap_or("127.0.0.1");
    let default_port = if url.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let port = url.port_u16().unwrap_or(default_port);
    format!("{host}:{port}")
}

/// Arc'd upstreams of a snapshot, by index in [`Config::upstreams`](crate::config::Config).
pub(crate) type Upstreams = Vec<Arc<Upstream>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_keep_ipv6_brackets() {
        for (url, address) in [
            ("http://127.0.0.1:8080/api", "127.0.0.1:8080"),
            ("http://backend.internal", "backend.internal:80"),
            ("http://[::1]:9000", "[::1]:9000"),
            ("http://[2001:db8::5]/", "[2001:db8::5]:80"),
        ] {
            assert_eq!(socket_address(&url.parse().unwrap()), address, "{url}");
        }
    }
}
