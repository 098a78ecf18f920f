//! Active health checks (`health = {...}`): one task per checked URL sends
//! `GET path` every `interval` and records the result on the URL's
//! [`UrlHealth`] ([`UrlHealth::record_check`] decides what it means).
//!
//! A check is spoken as the upstream's requests are: through a connection
//! pool of its own to the same address, with the same TLS settings (trust
//! roots, SNI), or over HTTP/2 for an `http2 = true` upstream, so a check
//! passes only where a request could. Its own pool, not the requests':
//! the checker runs on the main thread's runtime, and a request's pool
//! keeps each worker's connections on that worker. The `Host` is the
//! upstream's `host`, else the URL's authority; the response body is read
//! to its end (at most 64 KiB), so the check's connection is reused.
//!
//! A check that gets no response head within `timeout` fails as
//! `fail_timeout`; no connection (refused, TLS refused) as `fail_connect`;
//! a status outside `expect` as `fail_status`.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Uri};
use http_body::{Body, Frame};
use http_body_util::BodyExt;

use super::h2::H2Client;
use super::health::{self, CheckResult, UrlHealth};
use super::pool::{BodyErrors, ConnectionPool, PoolError};
use super::{pool_tls, socket_address};
use crate::config::UpstreamConfig;
use crate::http1::client::OwnFields;
use crate::http1::client::exchange::OutgoingBody;

/// Most of a check's response body read; a longer one is dropped with its
/// connection.
const MAX_BODY: usize = 64 * 1024;

/// Starts checking URL `index` of `config` (which has `health`) on the
/// current runtime; `None` outside one (offline tools: nothing to check).
pub(crate) fn spawn(
    config: &UpstreamConfig,
    index: usize,
    health: Arc<UrlHealth>,
) -> Option<tokio::task::AbortHandle> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let prober = Prober::new(config, index)?;
    let check = config.health.clone()?;
    Some(runtime.spawn(run(prober, check, health)).abort_handle())
}

async fn run(prober: Prober, check: crate::config::HealthCheck, health: Arc<UrlHealth>) {
    let mut ticks = tokio::time::interval(check.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let result = match tokio::time::timeout(check.timeout, prober.probe()).await {
            Err(_) => CheckResult::Timeout,
            Ok(Ok(status)) if check.passes(status) => CheckResult::Pass,
            Ok(Ok(status)) => CheckResult::Status(status),
            Ok(Err(error)) => {
                tracing::debug!(url = %health.url, error = %health::error_chain(&error), "health check failed");
                CheckResult::Connect
            }
        };
        health.record_check(result, &check, health::now());
    }
}

/// How one URL is checked.
struct Prober {
    pool: Arc<ConnectionPool>,
    h2: Option<H2Client>,
    /// The URL's path prefix and the check's path, in origin form.
    target: Uri,
    host: HeaderValue,
}

impl Prober {
    fn new(config: &UpstreamConfig, index: usize) -> Option<Prober> {
        let url = config.urls.get(index)?;
        let check = config.health.as_ref()?;
        let address = socket_address(url);
        let prefix = url.path().trim_end_matches('/');
        let target = format!("{prefix}{}", check.path).parse::<Uri>().ok()?;
        let host = match &config.host {
            Some(host) => host.clone(),
            None => HeaderValue::from_str(url.authority()?.as_str()).ok()?,
        };
        let h2 = config.http2.then(|| {
            H2Client::new(
                address.clone(),
                url.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP),
                config.connect_timeout,
                config.read_timeout,
                pool_tls(config, url, true),
            )
        });
        let pool = ConnectionPool::with_tls(
            address,
            config.connect_timeout,
            config.read_timeout,
            BodyErrors::default(),
            pool_tls(config, url, false),
        );
        Some(Prober {
            pool,
            h2,
            target,
            host,
        })
    }

    /// One check: the response's status, its body read.
    async fn probe(&self) -> Result<u16, PoolError> {
        let mut request = Request::new(NoBody);
        *request.uri_mut() = self.target.clone();
        let mut own = OwnFields::default();
        own.push("host", self.host.as_bytes());
        own.push("user-agent", b"tollgate-health-check");
        let (response, _) = match &self.h2 {
            Some(h2) => h2.send(request, own).await?,
            None => self.pool.send(request, own, None).await?,
        };
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let mut read = 0;
        while read <= MAX_BODY {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                _ => break,
            }
        }
        Ok(status)
    }
}

/// A check's request body: none.
#[derive(Debug)]
pub(crate) struct NoBody;

impl Body for NoBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        true
    }
}

impl OutgoingBody for NoBody {
    fn take_buffered(&mut self) -> Option<Option<Bytes>> {
        Some(None)
    }
}
