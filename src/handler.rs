//! The life of one request, as plain steps in a fixed order:
//!
//! 1. **snapshot** — load the current configuration once; the request keeps it.
//! 2. **guard** — reject what no route should see (oversized heads → 431).
//! 3. **route** — first matching route in file order, else 404.
//! 4. **act** — answer a `respond` route, or forward upstream (body capped by
//!    the route's `max_body` → 413; upstream failures → 502/504).
//! 5. **observe** — count the request and its duration under the route's name
//!    ([`crate::metrics`]) and write its access-log line ([`crate::access_log`]).
//!
//! Every error is a [`GatewayError`] turned into problem+json in one place.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::{Method, Request, Response, Uri};
use hyper::body::Incoming;

use crate::access_log::{self, AccessEntry};
use crate::app::{App, Snapshot};
use crate::config::{RouteAction, RouteConfig};
use crate::error::GatewayError;
use crate::proxy::body::{BodyCap, RequestBody, ResponseBody};
use crate::proxy::forward::prepare_response;

/// What the server knows about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct Downstream {
    pub peer: SocketAddr,
    /// `"http"` or `"https"`, for `X-Forwarded-Proto` and `Forwarded`.
    pub proto: &'static str,
}

/// Handles one request from a downstream client.
pub async fn handle(
    app: &App,
    downstream: Downstream,
    request: Request<Incoming>,
) -> Response<ResponseBody> {
    let mut observation = Observation::start(downstream, &request);
    let snapshot = app.snapshot();
    let response =
        match route_and_act(&snapshot, downstream, request, &mut observation.route_index).await {
            Ok(response) => response,
            Err(error) => {
                if let Some(kind) = error.upstream_kind() {
                    tracing::warn!(error = %error_chain(&error), kind, "upstream error");
                    let index = observation.route_index;
                    if let Some(upstream) = index.and_then(|i| upstream_label(&snapshot, i)) {
                        app.metrics().record_upstream_error(upstream, kind);
                    }
                }
                error.to_response()
            }
        };
    observation.finish(app, &snapshot, response.status().as_u16());
    response
}

/// Step 5's view of a request, taken before the request is consumed.
struct Observation {
    started: Instant,
    downstream: Downstream,
    /// Cloning shares hyper's parsed bytes; nothing is copied.
    method: Method,
    uri: Uri,
    /// Index into the snapshot's routes once a route matched.
    route_index: Option<usize>,
}

impl Observation {
    fn start(downstream: Downstream, request: &Request<Incoming>) -> Observation {
        Observation {
            started: Instant::now(),
            downstream,
            method: request.method().clone(),
            uri: request.uri().clone(),
            route_index: None,
        }
    }

    /// Step 5: metrics and the access-log line of the answered request.
    fn finish(self, app: &App, snapshot: &Snapshot, status: u16) {
        let elapsed = self.started.elapsed();
        let route = self
            .route_index
            .and_then(|i| snapshot.labels.routes.get(i))
            .unwrap_or(app.metrics().no_route());
        app.metrics().record_request(route, status, elapsed);
        access_log::log(&AccessEntry {
            method: &self.method,
            path: self.uri.path(),
            route,
            status,
            elapsed,
            upstream: self
                .route_index
                .and_then(|i| upstream_label(snapshot, i))
                .map(|name| &**name),
            client_ip: self.downstream.peer.ip(),
        });
    }
}

/// The metric label of the upstream route `index` forwards to, if it forwards.
fn upstream_label(snapshot: &Snapshot, index: usize) -> Option<&Arc<str>> {
    match snapshot.config.routes.get(index)?.action {
        RouteAction::Forward(upstream) => snapshot.labels.upstreams.get(upstream),
        RouteAction::Respond { .. } => None,
    }
}

/// Steps 1–4; `route_index` is set as soon as a route matched, so the caller
/// can label metrics and the access log also when acting on it fails.
async fn route_and_act(
    snapshot: &Snapshot,
    downstream: Downstream,
    request: Request<Incoming>,
    route_index: &mut Option<usize>,
) -> Result<Response<ResponseBody>, GatewayError> {
    let (parts, body) = request.into_parts();
    let limit = snapshot.config.server.max_header_bytes;
    if head_size(&parts) > limit {
        return Err(GatewayError::HeadersTooLarge { limit });
    }
    let Some(index) = snapshot.router.find(&parts) else {
        return Err(GatewayError::NoRoute {
            method: parts.method,
            path: parts.uri.path().to_owned(),
        });
    };
    *route_index = Some(index);
    let route = &snapshot.config.routes[index];
    match &route.action {
        RouteAction::Respond {
            status,
            body,
            content_type,
        } => {
            let mut response = Response::new(ResponseBody::full(body.clone()));
            *response.status_mut() = *status;
            response
                .headers_mut()
                .insert(CONTENT_TYPE, content_type.clone());
            Ok(response)
        }
        RouteAction::Forward(_) => forward(snapshot, route, downstream, parts, body).await,
    }
}

async fn forward(
    snapshot: &Snapshot,
    route: &RouteConfig,
    downstream: Downstream,
    parts: Parts,
    body: Incoming,
) -> Result<Response<ResponseBody>, GatewayError> {
    let Some(upstream) = snapshot.upstream_of(&route.action) else {
        // Validation resolves every upstream reference; reaching this is a bug.
        debug_assert!(false, "route {} has no upstream", route.name);
        return Err(GatewayError::BadRequest {
            reason: "route has no upstream",
        });
    };
    let (cap, exceeded) = match route.max_body {
        None => (None, None),
        Some(limit) => {
            if declared_length(&parts).is_some_and(|length| length > limit) {
                return Err(GatewayError::BodyTooLarge { limit });
            }
            let exceeded = Arc::new(AtomicBool::new(false));
            let cap = BodyCap {
                limit,
                seen: 0,
                exceeded: exceeded.clone(),
            };
            (Some(cap), Some(exceeded))
        }
    };
    let body = RequestBody::Streaming { inner: body, cap };
    let request = upstream.prepare(parts, body, downstream.peer, downstream.proto)?;
    let mut response = upstream
        .send(
            request,
            exceeded.as_deref(),
            route.max_body.unwrap_or(u64::MAX),
        )
        .await?;
    prepare_response(&mut response);
    Ok(response.map(ResponseBody::upstream))
}

/// The `Content-Length` the client declared, if one parses.
fn declared_length(parts: &Parts) -> Option<u64> {
    parts
        .headers
        .get(CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Bytes of the request head as the client sent them, near enough: the request
/// line plus `name: value\r\n` per header.
fn head_size(parts: &Parts) -> usize {
    let target = parts.uri.path_and_query().map_or(1, |pq| pq.as_str().len())
        + parts.uri.authority().map_or(0, |a| a.as_str().len());
    let line = parts.method.as_str().len() + target + 12;
    parts.headers.iter().fold(line, |sum, (name, value)| {
        sum + name.as_str().len() + value.len() + 4
    })
}

/// `error: cause: cause` for logs, keeping the whole source chain.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
