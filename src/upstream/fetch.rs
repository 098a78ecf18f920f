//! One-shot `GET`s of a small document — an issuer's JWKS — spoken as the
//! upstream requests are: a connection pool of its own to the URL's origin,
//! with the origin's TLS settings (trust roots, `ca`), timeouts as
//! configured, the body read whole up to a bound.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderValue, Request, Uri};
use http_body_util::BodyExt;

use super::check::NoBody;
use super::pool::{BodyErrors, ConnectionPool};
use super::{pool_tls, socket_address};
use crate::config::UpstreamConfig;
use crate::http1::client::OwnFields;

/// A fetched document: status, `Cache-Control`, body.
#[derive(Debug)]
pub(crate) struct Fetched {
    pub(crate) status: u16,
    pub(crate) cache_control: Option<String>,
    pub(crate) body: Bytes,
}

/// Fetches one URL again and again.
pub(crate) struct DocumentFetcher {
    pool: Arc<ConnectionPool>,
    target: Uri,
    host: HeaderValue,
    timeout: Duration,
}

impl DocumentFetcher {
    /// A fetcher of `url` through `origin` (a one-URL upstream of its
    /// scheme and authority); `None` when `url` has no authority.
    pub(crate) fn new(origin: &UpstreamConfig, url: &Uri) -> Option<DocumentFetcher> {
        let base = origin.urls.first()?;
        let target: Uri = url
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .parse()
            .ok()?;
        let host = HeaderValue::from_str(url.authority()?.as_str()).ok()?;
        let pool = ConnectionPool::with_tls(
            socket_address(base),
            origin.connect_timeout,
            origin.read_timeout,
            BodyErrors::default(),
            pool_tls(origin, base, false),
        );
        Some(DocumentFetcher {
            pool,
            target,
            host,
            timeout: origin.timeout,
        })
    }

    /// One `GET`, its body read to the end (at most `max_body` bytes);
    /// `Err` says in words why there is no document.
    pub(crate) async fn get(&self, max_body: usize) -> Result<Fetched, String> {
        tokio::time::timeout(self.timeout, self.exchange(max_body))
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {:?}", self.timeout)))
    }

    async fn exchange(&self, max_body: usize) -> Result<Fetched, String> {
        let mut request = Request::new(NoBody);
        *request.uri_mut() = self.target.clone();
        let mut own = OwnFields::default();
        own.push("host", self.host.as_bytes());
        own.push("user-agent", b"tollgate-jwks");
        own.push("accept", b"application/json");
        let (response, lines) = self
            .pool
            .send(request, own, None)
            .await
            .map_err(|error| super::health::error_chain(&error))?;
        let status = response.status().as_u16();
        let cache_control = response
            .headers()
            .get(http::header::CACHE_CONTROL)
            .map(HeaderValue::as_bytes)
            .or_else(|| lines.relayed_value("cache-control"))
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned);
        let mut body = response.into_body();
        let mut read = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|error| super::health::error_chain(&error))?;
            if let Some(data) = frame.data_ref() {
                if read.len() + data.len() > max_body {
                    return Err(format!("the document is larger than {max_body} bytes"));
                }
                read.extend_from_slice(data);
            }
        }
        Ok(Fetched {
            status,
            cache_control,
            body: read.freeze(),
        })
    }
}
