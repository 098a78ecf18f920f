//! What a proxied request's spans say (`[tracing]`): the server span with
//! OpenTelemetry's HTTP server conventions and the gateway's own
//! `tollgate.route`, `tollgate.limit` and `tollgate.decision`; the client
//! span of the upstream exchange, whose id goes upstream in
//! `traceparent`; a client span per Redis call of its decision, with
//! OpenTelemetry's database conventions (`db.system` `redis`,
//! `db.operation.name` `EVALSHA`, the server) and the limits it decided
//! (`tollgate.limits`).
//!
//! Each step of `proxy::handler` calls one function here, and only for a
//! recorded request (its spans are `Some`): an untraced request never
//! enters this file past [`start`]'s first branch.
//!
//! The server span ends with the response: at its head when the body is
//! whole by then, else when the body's last byte is sent (or the client
//! goes); the client span covers the upstream exchange to its response
//! head, retries included.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderMap, Method, Request, Uri, Version};

use crate::admission::{self, RequestAdmission, Routed, Ticket};
use crate::answer::body::BodyTiming;
use crate::answer::error::GatewayError;
use crate::app::{App, RoutePlan, Snapshot};
use crate::config::store::RedisServers;
use crate::limit::Nanos;
use crate::proxy::body::ClientBody;
use crate::proxy::downstream::Downstream;
use crate::store::probe::{Probe, StoreCall};
use crate::trace::span::{RequestSpans, SpanKind, SpanRecord, Value};
use crate::trace::{self, TRACEPARENT};
use crate::upstream::Upstream;

/// Step 1: the request's spans, when `[tracing]` records it.
#[inline]
pub(crate) fn start(
    snapshot: &Snapshot,
    downstream: Downstream,
    request: &Request<ClientBody>,
    now: Nanos,
) -> Option<Box<RequestSpans>> {
    let tracing = snapshot.tracing.as_ref()?;
    let start = tracing.sample(request.headers())?;
    Some(server_span(start, downstream, request, now))
}

/// The server span of a recorded request, with what its head says.
#[inline(never)]
fn server_span(
    start: trace::sampler::Start,
    downstream: Downstream,
    request: &Request<ClientBody>,
    now: Nanos,
) -> Box<RequestSpans> {
    let mut span = SpanRecord::new(
        start.trace_id,
        trace::new_span_id(),
        start.parent,
        SpanKind::Server,
        now,
        "HTTP",
    );
    span.name.first = method_attributes(&mut span, request.method());
    span.add("url.path", Value::Text(request.uri().path().to_owned()));
    span.add("url.scheme", Value::Static(downstream.proto));
    let default_port = if downstream.proto == "https" { 443 } else { 80 };
    if let Some((host, port)) = server_of(request.uri(), request.headers(), default_port) {
        span.add("server.address", Value::Text(host));
        span.add("server.port", Value::Int(port.into()));
    }
    span.add("network.peer.address", Value::Ip(downstream.peer.ip()));
    span.add(
        "network.peer.port",
        Value::Int(downstream.peer.port().into()),
    );
    span.add(
        "network.protocol.version",
        Value::Static(protocol_version(request.version())),
    );
    if let Some(agent) = request
        .headers()
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
    {
        span.add("user_agent.original", Value::Text(agent.to_owned()));
    }
    Box::new(RequestSpans {
        server: span,
        upstream: None,
        store: Vec::new(),
    })
}

/// `http.request.method`: the method, or `_OTHER` with the method as sent
/// in `http.request.method_original` (the conventions' bounded set). The
/// method as a span's name has it (`HTTP` for another).
fn method_attributes(span: &mut SpanRecord, method: &Method) -> &'static str {
    let known = match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => {
            span.add("http.request.method", Value::Static("_OTHER"));
            span.add(
                "http.request.method_original",
                Value::Text(method.as_str().to_owned()),
            );
            return "HTTP";
        }
    };
    span.add("http.request.method", Value::Static(known));
    known
}

/// `network.protocol.version` of an HTTP version.
fn protocol_version(version: Version) -> &'static str {
    match version {
        Version::HTTP_09 => "0.9",
        Version::HTTP_10 => "1.0",
        Version::HTTP_11 => "1.1",
        Version::HTTP_2 => "2",
        Version::HTTP_3 => "3",
        _ => "1.1",
    }
}

/// The host and port the client addressed: the target's authority, else
/// `Host` (read by the codec's host rule, without copying it first);
/// `None` when neither reads as one.
fn server_of(uri: &Uri, headers: &HeaderMap, default_port: u16) -> Option<(String, u16)> {
    if let Some(authority) = uri.authority() {
        let port = authority.port_u16().unwrap_or(default_port);
        return Some((authority.host().to_owned(), port));
    }
    let value = headers.get(http::header::HOST)?;
    let host = crate::http::host::parse(value.as_bytes()).ok()?;
    let name = std::str::from_utf8(host.host).ok()?;
    Some((name.to_owned(), host.port.unwrap_or(default_port)))
}

/// Step 4's outcome for a request that was admitted: `queued` if it waited
/// its turn first, else `allowed`.
pub(crate) fn admitted(spans: &mut RequestSpans, waited: bool) {
    let decision = if waited { "queued" } else { "allowed" };
    spans
        .server
        .set("tollgate.decision", Value::Static(decision));
}

/// Step 5: refused by a limit, `shed` where overload protection refused it.
pub(crate) fn refused(spans: &mut RequestSpans, shed: bool) {
    let decision = if shed { "shed" } else { "denied" };
    spans
        .server
        .set("tollgate.decision", Value::Static(decision));
}

/// Step 6, before the request goes upstream: the client span starts, and
/// its id replaces the caller's `traceparent` (`tracestate` goes on as
/// the caller sent it). The URL is named when the upstream has one: which
/// of several a try goes to is the balancer's, decided in the exchange.
pub(crate) fn begin_upstream(
    spans: &mut RequestSpans,
    upstream: Option<&Upstream>,
    parts: &mut Parts,
    now: Nanos,
) {
    let server = &spans.server;
    let mut span = SpanRecord::new(
        server.trace_id,
        trace::new_span_id(),
        Some(server.span_id),
        SpanKind::Client,
        now,
        "HTTP",
    );
    span.name.first = method_attributes(&mut span, &parts.method);
    if let Some(upstream) = upstream {
        span.add(
            "tollgate.upstream",
            Value::Text(upstream.config.name.clone()),
        );
        if let [url] = upstream.config.urls.as_slice() {
            url_attributes(&mut span, url, parts.uri.path());
        }
    }
    if let Some(value) = trace::traceparent(span.trace_id, span.span_id) {
        parts.headers.insert(TRACEPARENT, value);
    }
    spans.upstream = Some(span);
}

/// `url.full`, `server.address` and `server.port` of a request for `path`
/// sent to the upstream URL `base`.
fn url_attributes(span: &mut SpanRecord, base: &Uri, path: &str) {
    // What `base.to_string()` writes, without the formatter.
    let scheme = base.scheme_str().unwrap_or("http");
    let authority = base.authority().map_or("", |a| a.as_str());
    let base_path = base.path_and_query().map_or("", |pq| pq.as_str());
    let mut full =
        String::with_capacity(scheme.len() + 3 + authority.len() + base_path.len() + path.len());
    for part in [scheme, "://", authority, base_path] {
        full.push_str(part);
    }
    full.truncate(full.trim_end_matches('/').len());
    full.push_str(path);
    span.add("url.full", Value::Text(full));
    if let Some(host) = base.host() {
        span.add("server.address", Value::Text(host.to_owned()));
    }
    let default_port = if base.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let port = base.port_u16().unwrap_or(default_port);
    span.add("server.port", Value::Int(port.into()));
}

/// Step 6, the upstream's answer (its status) or the failure instead.
pub(crate) fn end_upstream(
    spans: &mut RequestSpans,
    answer: Result<u16, &GatewayError>,
    retries: u32,
    now: Nanos,
) {
    let Some(span) = spans.upstream.as_mut() else {
        return;
    };
    span.end = now;
    if retries > 0 {
        span.set("http.request.resend_count", Value::Int(retries.into()));
    }
    match answer {
        Ok(status) => {
            span.set("http.response.status_code", Value::Int(status.into()));
            if status >= 400 {
                span.error = true;
                span.set("error.type", Value::Text(status.to_string()));
            }
        }
        Err(error) => {
            span.error = true;
            let kind = error.upstream_kind().unwrap_or("gateway");
            span.set("error.type", Value::Static(kind));
        }
    }
}

/// Step 8: the server span ends with the response's status and what the
/// steps learnt; the spans go to the exporter.
pub(crate) struct Ending<'a> {
    pub(crate) status: u16,
    pub(crate) route: Option<&'a RoutePlan>,
    /// The deciding limit's name.
    pub(crate) limit: Option<&'a Arc<str>>,
    /// The client after trusted-proxy resolution, when it was resolved.
    pub(crate) client_ip: Option<IpAddr>,
    pub(crate) now: Nanos,
}

/// Step 8, see [`Ending`]; `until_body_end`: the timing of a body still
/// arriving, which ends the server span when the body ends.
pub(crate) fn finish(
    snapshot: &Snapshot,
    mut spans: Box<RequestSpans>,
    ending: Ending<'_>,
    until_body_end: Option<&mut BodyTiming>,
) {
    let Some(tracing) = snapshot.tracing.as_ref() else {
        return;
    };
    let span = &mut spans.server;
    span.end = ending.now;
    span.set(
        "http.response.status_code",
        Value::Int(ending.status.into()),
    );
    if ending.status >= 500 {
        span.error = true;
        span.set("error.type", Value::Text(ending.status.to_string()));
    }
    let client = ending
        .client_ip
        .or_else(|| match span.get("network.peer.address") {
            Some(Value::Ip(peer)) => Some(*peer),
            _ => None,
        });
    if let Some(client) = client {
        span.set("client.address", Value::Ip(client));
    }
    if let Some(route) = ending.route {
        span.name.then = Some(route.name.clone());
        span.set("tollgate.route", Value::Shared(route.name.clone()));
    }
    if let Some(limit) = ending.limit {
        span.set("tollgate.limit", Value::Shared(limit.clone()));
    }
    match until_body_end {
        Some(timing) => timing.trace_at_end(tracing.pending(spans)),
        None => tracing.export(spans),
    }
}

/// Step 4 for a recorded request on a route with shared limits: the
/// admission, its Redis calls noted ([`Probe`]) and made client spans of
/// the server span. Boxed and out of line: an untraced request's future
/// holds none of it.
#[cold]
#[inline(never)]
pub(crate) fn admit_noting_store_calls<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    routed: Routed<'a, 's>,
    ticket: &'a mut Ticket<'s>,
    spans: &'a mut RequestSpans,
) -> Pin<Box<dyn Future<Output = RequestAdmission> + Send + 'a>> {
    Box::pin(async move {
        let admitting = admission::admit_request(app, snapshot, routed, ticket);
        let (admission, calls) = Probe::around(app.clock.clone(), admitting).await;
        let server = app.store().map(|store| store.servers());
        for call in calls {
            store_span(spans, server, call);
        }
        admission
    })
}

/// A Redis call of the request's decision as a client span of its server
/// span (OpenTelemetry's database conventions for Redis).
fn store_span(spans: &mut RequestSpans, servers: Option<&RedisServers>, call: StoreCall) {
    let server = &spans.server;
    let mut span = SpanRecord::new(
        server.trace_id,
        trace::new_span_id(),
        Some(server.span_id),
        SpanKind::Client,
        call.start,
        call.operation,
    );
    span.end = call.end;
    span.add("db.system", Value::Static("redis"));
    span.add("db.system.name", Value::Static("redis"));
    span.add("db.operation.name", Value::Static(call.operation));
    // The server where it is one; a Cluster's node or a Sentinel's
    // master is not known here.
    if let Some(RedisServers::One(url)) = servers {
        span.add("server.address", Value::Text(url.host.clone()));
        span.add("server.port", Value::Int(url.port.into()));
        span.add("db.namespace", Value::Text(url.db.to_string()));
    }
    span.add("tollgate.limits", Value::Texts(call.limits));
    if call.failed {
        span.error = true;
        span.add("error.type", Value::Static("unavailable"));
    }
    spans.store.push(span);
}
