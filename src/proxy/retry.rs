//! A route's retries (`retry = {...}`) around one send upstream
//! ([`send_upstream`]): which requests may be sent again, the replayable body,
//! the attempts within the upstream's `timeout`, the budget and the delays
//! ([`crate::upstream::retry`]).

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::{Request, Response};

use crate::admission::body::{BodyRead, PendingBody, declared_length};
use crate::answer::body::ResponseBody;
use crate::answer::error::GatewayError;
use crate::app::{App, Snapshot};
use crate::config::{Config, RouteConfig};
use crate::http::field_lines::FieldLines;
use crate::http1::client::InterimSink;
use crate::limit::Permits;
use crate::proxy::downstream::Downstream;
use crate::proxy::send::send_upstream;
use crate::upstream::Attempt;

/// Where a retried request's permits, interim responses and retry count go:
/// the request's own, held by the handler.
pub(crate) struct Sender<'n> {
    pub(crate) permits: &'n mut Permits,
    pub(crate) interim: Option<&'n dyn InterimSink>,
    /// Upstream retries made (for the access log).
    pub(crate) retries: &'n mut u32,
    /// The upstream's metric label, for the retries counter.
    pub(crate) upstream_label: Option<&'n Arc<str>>,
}

/// Request bodies up to this size are read whole on a retrying route, so
/// they can be sent again; larger or unsized ones are sent once.
const MAX_REPLAY_BODY: u64 = 64 * 1024;

/// A route's retries (`retry = {...}`) around [`send_upstream`]: see
/// [`crate::upstream::retry`] for the delays and the budget. A request is
/// retried only when sending it again cannot repeat an action — an
/// idempotent method, or one carrying `Idempotency-Key` — and its body can
/// be sent again (none, or one of known length up to [`MAX_REPLAY_BODY`],
/// read first); never once the client has received a byte (only errors and
/// retried statuses, whose response is dropped unread, are retried); never
/// an upgrade. All attempts together are bounded by the upstream's
/// `timeout` (504). A retry goes to another URL of the list than the tries
/// before it, when there is one. (A connection that could not be opened is
/// not a retry: [`send_upstream`] tries the next URL at once, for any request,
/// outside the budget — `crate::upstream`'s module doc. Nor does a request
/// its URL answered nothing go once more on its own, as on a route without
/// `retry`: the policy's `connect` decides that too, within the budget.)
pub(crate) struct Retrying<'s> {
    pub(crate) app: &'s App,
    pub(crate) snapshot: &'s Snapshot,
    pub(crate) route: &'s RouteConfig,
    pub(crate) policy: &'s crate::config::RetryPolicy,
    pub(crate) budget: &'s crate::upstream::retry::RetryBudget,
}

impl Retrying<'_> {
    /// The request sent once, as a route without `retry` sends it: not
    /// retryable (no upstream, not idempotent, an upgrade, a body that
    /// cannot be sent again).
    async fn once(
        &self,
        downstream: Downstream,
        parts: &mut Parts,
        body: PendingBody,
        sender: Sender<'_>,
    ) -> Result<(Response<ResponseBody>, FieldLines), GatewayError> {
        send_upstream(
            self.snapshot,
            self.route,
            downstream,
            parts,
            body,
            sender.permits,
            sender.interim,
            &mut Attempt::for_retry_policy(),
        )
        .await
    }

    pub(crate) async fn forward(
        &self,
        downstream: Downstream,
        parts: &mut Parts,
        body: PendingBody,
        sender: Sender<'_>,
    ) -> Result<(Response<ResponseBody>, FieldLines), GatewayError> {
        use crate::upstream::retry;

        let (snapshot, route) = (self.snapshot, self.route);
        self.budget.record_request(self.app.clock.now());
        let Some(upstream) = snapshot.upstream_of(&route.action) else {
            return self.once(downstream, parts, body, sender).await;
        };
        let idempotent = crate::upstream::pool::is_idempotent(&parts.method)
            || parts.headers.contains_key("idempotency-key");
        let upgrade = parts.headers.contains_key(http::header::UPGRADE);
        if !idempotent || upgrade {
            return self.once(downstream, parts, body, sender).await;
        }
        let body = match replayable(body, parts, &snapshot.config).await? {
            Ok(bytes) => bytes,
            Err(body) => {
                return self.once(downstream, parts, body, sender).await;
            }
        };
        let timeout = upstream.config.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let template = (
            parts.method.clone(),
            parts.uri.clone(),
            parts.version,
            parts.headers.clone(),
        );
        let mut first = Some(parts);
        let mut attempt = 0u32;
        // Where the tries went: a retry goes to another URL if there is one.
        let mut way = Attempt::for_retry_policy();
        loop {
            // The client's head the first time, a copy of it after.
            let mut again;
            let this = match first.take() {
                Some(parts) => parts,
                None => {
                    let mut request = Request::new(());
                    *request.method_mut() = template.0.clone();
                    *request.uri_mut() = template.1.clone();
                    *request.version_mut() = template.2;
                    *request.headers_mut() = template.3.clone();
                    again = request.into_parts().0;
                    &mut again
                }
            };
            let sent = send_upstream(
                snapshot,
                route,
                downstream,
                this,
                PendingBody::Complete(body.clone()),
                sender.permits,
                sender.interim,
                &mut way,
            );
            let result = match tokio::time::timeout_at(deadline, sent).await {
                Ok(result) => result,
                Err(_) => Err(GatewayError::UpstreamTimeout {
                    upstream: upstream.config.name.clone(),
                    timeout,
                }),
            };
            let reason = match &result {
                Err(GatewayError::UpstreamConnect { .. }) if self.policy.on_connect => "connect",
                Err(GatewayError::UpstreamFailed { .. }) if self.policy.on_connect => "reset",
                Ok((response, _)) if self.policy.retries_status(response.status().as_u16()) => {
                    status_label(response.status().as_u16())
                }
                _ => return result,
            };
            let retry_after = match &result {
                Ok((_, fields)) => fields
                    .relayed_value("retry-after")
                    .and_then(|v| retry::parse_retry_after(v, std::time::SystemTime::now())),
                Err(_) => None,
            };
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let jittered = retry::full_jitter(self.policy.bound(attempt), retry::draw);
            let Some(wait) = retry::wait_before(jittered, retry_after, left) else {
                return result;
            };
            if attempt >= self.policy.attempts || !self.budget.try_spend(self.app.clock.now()) {
                return result;
            }
            // The retried response is dropped unread: nothing of it reached
            // the client, and its connection is not reused.
            drop(result);
            attempt += 1;
            *sender.retries = attempt;
            if let Some(label) = sender.upstream_label {
                self.app.metrics().record_upstream_retry(label, reason);
            }
            tracing::debug!(route = %route.name, attempt, reason, wait_ms = wait.as_millis() as u64, "retrying upstream");
            tokio::time::sleep(wait).await;
        }
    }
}

/// The `reason` label of a retried status.
fn status_label(status: u16) -> &'static str {
    match status {
        408 => "408",
        425 => "425",
        429 => "429",
        500 => "500",
        501 => "501",
        502 => "502",
        503 => "503",
        504 => "504",
        _ => "5xx",
    }
}

/// The body as bytes that can be sent again, reading it first when its
/// declared length is at most [`MAX_REPLAY_BODY`]; `Err(body)` (untouched)
/// when it cannot be replayed.
async fn replayable(
    body: PendingBody,
    parts: &Parts,
    config: &Config,
) -> Result<Result<Bytes, PendingBody>, GatewayError> {
    use http_body::Body as _;
    let mut incoming = match body {
        PendingBody::Complete(bytes) => return Ok(Ok(bytes)),
        PendingBody::Partial(..) => return Ok(Err(body)),
        PendingBody::Fresh(incoming) => incoming,
    };
    if incoming.size_hint().exact() == Some(0) {
        return Ok(Ok(Bytes::new()));
    }
    match declared_length(parts) {
        Some(length) if length <= MAX_REPLAY_BODY => {}
        _ => return Ok(Err(PendingBody::Fresh(incoming))),
    }
    let mut buffer = BytesMut::new();
    let read = BodyRead::start(config);
    while let Some(data) = read.next(&mut incoming).await? {
        buffer.extend_from_slice(&data);
    }
    Ok(Ok(buffer.freeze()))
}
