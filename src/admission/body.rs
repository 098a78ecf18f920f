//! The client's request body before it goes upstream: untouched, or read
//! (within `max_key_body`, never past the route's `max_body`) so that a
//! `body:FIELD` key can be taken from it and a token route's reservation
//! counted, the bytes read then forwarded unchanged ahead of the rest of
//! the stream. Every read is bounded by `body_read_timeout`.
//!
//! Read by admission ([`super::admit_request`]) after the caller is known,
//! so an unidentified request is refused before its body is read.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http_body_util::BodyExt;

use crate::config::{Config, RouteConfig};
use crate::http::content_length;
use crate::http1::server::ClientBody;

/// Why a body could not be read, or priced; each the client's doing (the
/// proxy answers 413, 408 and 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Over the route's `max_body`.
    #[error("request body is larger than the route's limit of {limit} bytes")]
    TooLarge { limit: u64 },
    /// Not received within `body_read_timeout`.
    #[error("the request body was not received within {timeout:?}")]
    Timeout { timeout: Duration },
    /// The client's framing failed, or it went away mid-body.
    #[error("the request body could not be read")]
    Unreadable,
    /// A route with a spend budget (`unit = "usd"`) cannot price the
    /// body's `model`: no `[prices."MODEL"]` and no `[prices.default]`.
    #[error("the request's model has no price and there is no default price")]
    Unpriced,
}

/// A request body not yet sent upstream.
pub enum PendingBody {
    /// Untouched.
    Fresh(ClientBody),
    /// Read completely for a `body:FIELD` key.
    Complete(Bytes),
    /// Read up to `max_key_body`; the rest still streams.
    Partial(Bytes, ClientBody),
}

/// Reads the body up to `max_key_body` (and never past the route's
/// `max_body`). The bytes read are forwarded unchanged, followed by the
/// rest of the stream.
pub(crate) async fn buffer_for_key(
    mut incoming: ClientBody,
    parts: &Parts,
    config: &Config,
    route: &RouteConfig,
) -> Result<PendingBody, BodyError> {
    let cap = config.server.max_key_body;
    let declared = declared_length(parts);
    if let Some(limit) = route.max_body
        && declared.is_some_and(|length| length > limit)
    {
        return Err(BodyError::TooLarge { limit });
    }
    if declared.is_some_and(|length| length > cap as u64) {
        // Over the key cap: not worth reading; the key is missing.
        return Ok(PendingBody::Fresh(incoming));
    }
    let mut buffer = BytesMut::new();
    let read = BodyRead::start(config);
    while let Some(data) = read.next(&mut incoming).await? {
        buffer.extend_from_slice(&data);
        if let Some(limit) = route.max_body
            && buffer.len() as u64 > limit
        {
            return Err(BodyError::TooLarge { limit });
        }
        if buffer.len() > cap {
            return Ok(PendingBody::Partial(buffer.freeze(), incoming));
        }
    }
    Ok(PendingBody::Complete(buffer.freeze()))
}

/// A client body read before forwarding (for a `body:FIELD` key, or to
/// replay it on a retry). The request is in flight, so the connection
/// watchdog does not guard this read: the whole read is bounded by
/// `body_read_timeout` like a request head, or a slow uploader would hold
/// the connection as long as it likes.
pub(crate) struct BodyRead {
    deadline: tokio::time::Instant,
    timeout: Duration,
}

impl BodyRead {
    pub(crate) fn start(config: &Config) -> Self {
        let timeout = config.server.body_read_timeout;
        BodyRead {
            deadline: tokio::time::Instant::now() + timeout,
            timeout,
        }
    }

    /// The body's next data (trailers are skipped), `None` at its end;
    /// [`BodyError::Timeout`] past the deadline.
    pub(crate) async fn next(&self, incoming: &mut ClientBody) -> Result<Option<Bytes>, BodyError> {
        loop {
            let frame = tokio::time::timeout_at(self.deadline, incoming.frame())
                .await
                .map_err(|_| BodyError::Timeout {
                    timeout: self.timeout,
                })?;
            match frame {
                None => return Ok(None),
                Some(Err(_)) => return Err(BodyError::Unreadable),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }
}

/// The `Content-Length` the client declared, by the crate's one rule
/// ([`content_length`]). The server side has refused every request whose
/// length does not parse, so `None` is a request without one.
pub(crate) fn declared_length(parts: &Parts) -> Option<u64> {
    content_length::parse(
        parts
            .headers
            .get_all(CONTENT_LENGTH)
            .iter()
            .map(|value| value.as_bytes()),
    )
    .ok()
    .flatten()
}
