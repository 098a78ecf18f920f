//! The life of one request, as plain steps in a fixed order:
//!
//! 1. **snapshot** — take the current configuration once (the worker's own
//!    handle on it, [`App::request_snapshot`]); the request keeps it.
//! 2. **guard** — reject what no route should see (oversized heads → 431, an
//!    HTTP/2 request whose `:authority` or `Host` is no valid host → 400, a
//!    path that cannot be normalised → 400), then normalise the path.
//! 3. **route** — first matching route in file order, else 404.
//! 4. **admit** — one call, [`admission::admit_request`]: the caller (401
//!    where it is refused), the body read for `body:FIELD` keys and token
//!    reservations (413/408/400), the client IP behind trusted proxies,
//!    each limit's key, the stack decided all or nothing, a token route's
//!    bill.
//! 5. **deny** — a denial is answered here (429 + headers, written by
//!    `answer::ratelimit`) without touching the upstream.
//!    A quota route (`respond = { quota = [...] }`) is answered here
//!    instead, charging nothing (`proxy::quota`).
//! 6. **act** — answer a `respond` route, or forward upstream (body capped by
//!    the route's `max_body` → 413; upstream failures → 502/504; no URL of
//!    the upstream up → 503), after any hold the stack decided (a token
//!    bucket's `wait`, a leaky bucket's delay: `admission::hold`).
//! 7. **respond** — rate-limit headers on the response; post-response cost
//!    settled from `cost_header`; concurrency slots held until the body ends.
//! 8. **observe** — count the request and its duration under the route's name
//!    ([`crate::metrics`]) and write its access-log line ([`crate::access_log`];
//!    denials sampled by `log_denied`).
//!
//! Every error is a [`GatewayError`] turned into problem+json in one place.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Uri, Version};

use crate::access_log::{self, AccessEntry, PendingLine, TokenTally};
use crate::admission::body::PendingBody;
use crate::admission::tokens::TokenBill;
use crate::admission::{self, Client, RequestAdmission, RequestBody, Routed, Ticket};
use crate::answer::body::{BodyTiming, Completion, ResponseBody};
use crate::answer::error::GatewayError;
use crate::answer::ratelimit;
use crate::app::{App, LimitId, RoutePlan, Snapshot};
use crate::config::{RouteAction, RouteConfig};
use crate::http::field_lines::{FieldLines, recycle_map};
use crate::http::host;
use crate::http::path::normalize_uri;
use crate::http1::client::InterimSink;
use crate::http1::server::ConnActivity;
use crate::limit::{Nanos, Permits, UpstreamAnswer};
use crate::proxy::body::ClientBody;
pub(crate) use crate::proxy::downstream::Downstream;
use crate::proxy::quota;
use crate::proxy::retry::{Retrying, Sender};
use crate::proxy::send::send_upstream;
use crate::proxy::tokens;
use crate::proxy::traced;
use crate::trace::span::RequestSpans;
use crate::upstream::Attempt;

/// Handles one request from a downstream client. The response's body ends
/// the request when it ends or is dropped: it then releases the request's
/// concurrency slots and tells `connection` (if given) that it is idle.
/// Returned beside the response: its fields that are not in its header map
/// yet ([`FieldLines`]: an upstream's, relayed, and the rate-limit fields),
/// which the server writes with the head or puts in the map first.
///
/// One future from the server down: the connection awaits this one directly
/// (a wrapper future around it was a 3.5 KB copy per request).
///
/// Not an `async fn`: one moves its arguments into locals of its body as it
/// starts, a copy of the request (256 bytes) per request; the block below
/// uses them where they were captured. The request is taken apart here and
/// its head lent to [`route_and_act`]: moved into that future, the request
/// was copied twice more and its future's arguments twice (304 bytes each),
/// and its head a third time when it was taken apart there
/// (`MEMCPY=1 bench/instructions.sh`).
#[allow(clippy::manual_async_fn)] // an `async fn` is what this avoids (above)
pub(crate) fn handle(
    app: &App,
    downstream: Downstream,
    request: Request<ClientBody>,
    connection: Option<Arc<ConnActivity>>,
) -> impl Future<Output = (Response<ResponseBody>, FieldLines)> {
    async move {
        let now = app.clock.now();
        let observation = Observation::start(downstream, &request, now);
        let snapshot = app.request_snapshot();
        let mut progress = Progress {
            seen: Seen {
                trace: traced::start(&snapshot, downstream, &request, now),
                ..Seen::default()
            },
            answer: Answer {
                connection,
                ..Answer::default()
            },
        };
        let (mut parts, body) = request.into_parts();
        let acted = route_and_act(
            app,
            &snapshot,
            downstream,
            &mut parts,
            body,
            now,
            &mut progress,
        )
        .await;
        let mut response = match acted {
            Ok(response) => response,
            Err(error) => {
                if let Some(kind) = error.upstream_kind() {
                    // Not a line per failed request: the URL's health logs the
                    // first failure of a spell and then a summary per interval
                    // (`upstream::health`).
                    tracing::debug!(error = %crate::upstream::health::error_chain(&error), kind, "upstream error");
                    if let Some(upstream) = progress
                        .seen
                        .route()
                        .and_then(|i| upstream_label(&snapshot, i))
                    {
                        app.metrics().record_upstream_error(upstream, kind);
                    }
                }
                error.to_response()
            }
        };
        let mut timing = observation.finish(app, &snapshot, &response, &progress.seen);
        if let Some(spans) = progress.seen.trace.take() {
            end_trace(
                app,
                &snapshot,
                spans,
                &response,
                &progress.seen,
                timing.as_deref_mut(),
            );
        }
        let connection = progress.answer.connection.take();
        if response.status() == StatusCode::SWITCHING_PROTOCOLS
            && let Some(connection) = &connection
        {
            // A tunnel takes the client's connection over (`proxy::upgrade`).
            connection.handed_to_tunnel();
        }
        // Moved out, not taken: taking left empty ones for `progress` to drop.
        let Answer {
            permits, fields, ..
        } = progress.answer;
        let completion = Completion {
            connection,
            permits,
        };
        response.body_mut().attach_completion(completion, timing);
        (response, fields)
    }
}

/// Step 8 for a recorded request: its spans end and go to the exporter,
/// or, for a body still arriving (`timing`), when the body ends. Out of
/// line: most requests are not recorded.
#[cold]
#[inline(never)]
fn end_trace(
    app: &App,
    snapshot: &Snapshot,
    spans: Box<RequestSpans>,
    response: &Response<ResponseBody>,
    seen: &Seen,
    timing: Option<&mut BodyTiming>,
) {
    let ending = traced::Ending {
        status: response.status().as_u16(),
        route: seen.route().and_then(|i| snapshot.routes.get(i)),
        limit: seen.limit.map(|note| snapshot.limit_label(note.limit)),
        client_ip: seen.client_ip,
        now: app.clock.now(),
    };
    traced::finish(snapshot, spans, ending, timing);
}

/// A streamed response's request: counted now, its duration observed when
/// the body ends. Out of line: most bodies come with their head.
#[cold]
#[inline(never)]
fn time_until_end(app: &App, plan: &RoutePlan, status: u16, to_head: Duration) -> Box<BodyTiming> {
    app.metrics().count_route_request(&plan.metrics, status);
    BodyTiming::new(plan.metrics.duration().clone(), to_head)
}

/// The client's connection as the upstream exchange sees it: where its
/// interim (1xx) responses go.
fn interim_sink(connection: &Option<Arc<ConnActivity>>) -> Option<&dyn InterimSink> {
    connection.as_deref().map(|c| c as &dyn InterimSink)
}

/// Interim responses reach the client through its connection, when the
/// server that serves it relays them (`ConnActivity::queue_interim`).
impl InterimSink for ConnActivity {
    fn relay(&self, head: &[u8]) {
        self.queue_interim(head);
    }
}

/// A request's record while the steps run, filled as they go: what they
/// observe, and what they hand on with the answer.
#[derive(Debug, Default)]
struct Progress {
    seen: Seen,
    answer: Answer,
}

/// What the steps observe about a request, for metrics and its log line.
#[derive(Debug, Default)]
struct Seen {
    /// Index into the snapshot's routes once a route matched (a `u32`:
    /// the room of the trace's pointer in this record, which is part of
    /// every request's future).
    route_index: Option<u32>,
    /// The client after trusted-proxy resolution, once identified.
    client_ip: Option<IpAddr>,
    /// The limit the response's legacy headers describe.
    limit: Option<LimitNote>,
    /// Upstream retries made.
    retries: u32,
    /// A token route's reservation and, once its response ends, usage.
    tokens: Option<Arc<TokenTally>>,
    /// The request's spans, when `[tracing]` records it (`proxy::traced`).
    trace: Option<Box<RequestSpans>>,
}

impl Seen {
    /// The matched route's index into the snapshot's routes.
    fn route(&self) -> Option<usize> {
        self.route_index.map(|i| i as usize)
    }
}

/// What goes with the response, beyond it.
#[derive(Debug, Default)]
struct Answer {
    /// Concurrency slots, held by the response body until it ends.
    permits: Permits,
    /// The response's rate-limit fields, handed to the server with it.
    fields: FieldLines,
    /// The client's connection (when the server tracks it): where interim
    /// responses go, and what the response's end tells it is idle.
    connection: Option<Arc<ConnActivity>>,
}

/// One limit's part in a request's log line.
#[derive(Debug, Clone, Copy)]
struct LimitNote {
    limit: LimitId,
    remaining: u64,
    denied: bool,
    /// How long the admitted request waited before it was forwarded, in µs
    /// (0: not at all; saturating at 71 minutes). Here, in the padding
    /// beside `denied`, rather than in `Seen`: that record is part of every
    /// request's future, and had no room left.
    queued_us: u32,
}

/// Step 8's view of a request, taken before the request is consumed.
struct Observation {
    /// When the request reached the handler, on the limiter's clock: the one
    /// clock read of the request, also the limit step's `now`.
    started: Nanos,
    downstream: Downstream,
    /// Cloning shares hyper's parsed bytes; nothing is copied.
    method: Method,
    /// Kept only while access-log events are on: the clone and its drop
    /// were ~90 instructions per request for a line nobody records.
    uri: Option<Uri>,
}

impl Observation {
    fn start(downstream: Downstream, request: &Request<ClientBody>, now: Nanos) -> Observation {
        Observation {
            started: now,
            downstream,
            method: request.method().clone(),
            uri: access_log::enabled().then(|| request.uri().clone()),
        }
    }

    /// Step 8: metrics and the access-log line of the answered request.
    /// Both hold the request's whole time: for a body still arriving from
    /// the upstream, the returned timing observes the duration and writes
    /// the line when the body ends.
    fn finish(
        self,
        app: &App,
        snapshot: &Snapshot,
        response: &Response<ResponseBody>,
        seen: &Seen,
    ) -> Option<Box<BodyTiming>> {
        let status = response.status().as_u16();
        let elapsed = Duration::from_nanos(app.clock.now().saturating_sub(self.started));
        let plan = seen.route().and_then(|i| snapshot.routes.get(i));
        let mut timing = None;
        let route = match plan {
            // A token route's line waits for its usage, the end of its body.
            Some(plan) if response.body().still_arriving() || seen.tokens.is_some() => {
                timing = Some(time_until_end(app, plan, status, elapsed));
                &plan.name
            }
            Some(plan) => {
                app.metrics()
                    .record_route_request(&plan.metrics, status, elapsed);
                &plan.name
            }
            None => {
                let none = app.metrics().no_route();
                app.metrics().record_request(none, status, elapsed);
                none
            }
        };
        // A flood of denials must not become a flood of log I/O. The log
        // asked first: the sampler's count is a line every worker writes.
        if seen.limit.is_some_and(|l| l.denied)
            && (!access_log::enabled() || !snapshot.denied_log.should_log_denied())
        {
            return timing;
        }
        let entry = AccessEntry {
            method: self.method.as_str(),
            // The filter turned the log on during the request: no path.
            path: self.uri.as_ref().map_or("-", Uri::path),
            route,
            status,
            elapsed: Some(elapsed),
            upstream: seen
                .route()
                .and_then(|i| upstream_label(snapshot, i))
                .map(|name| &**name),
            client_ip: seen.client_ip.unwrap_or(self.downstream.peer.ip()),
            limit: seen.limit.map(|note| access_log::LimitField {
                name: &snapshot.limit_config(note.limit).name,
                remaining: note.remaining,
                denied: note.denied,
            }),
            retries: seen.retries,
            refused: None,
            front: "proxy",
            tokens: seen.tokens.as_deref(),
            queued: seen
                .limit
                .filter(|note| note.queued_us > 0)
                .map(|note| Duration::from_micros(note.queued_us.into())),
            trace: seen
                .trace
                .as_deref()
                .map(|spans| (spans.server.trace_id, spans.server.span_id)),
        };
        match timing {
            // Written when the body ends, with the whole duration.
            Some(mut timing) => {
                if access_log::enabled() {
                    timing.log_at_end(PendingLine::of(&entry, seen.tokens.clone()));
                }
                Some(timing)
            }
            None => {
                access_log::log(&entry);
                None
            }
        }
    }
}

/// The metric label of the upstream route `index` forwards to, if it forwards.
fn upstream_label(snapshot: &Snapshot, index: usize) -> Option<&Arc<str>> {
    match snapshot.config.routes.get(index)?.action {
        RouteAction::Forward(upstream) => snapshot.labels.upstreams.get(upstream),
        RouteAction::Respond { .. } | RouteAction::DecideOnly | RouteAction::Quota { .. } => None,
    }
}

/// Steps 2–7, one call each: guard → route → admit → act (answer or
/// forward) → settle. `progress` is filled as the steps learn things (the
/// route as soon as one matched), so metrics and the access log have them
/// also when acting on the request fails.
///
/// A request ends early one way: an `Err(GatewayError)` (status mapping in
/// `answer::error`), or, for admission's own answer to a denied request,
/// its 429 returned as the response.
async fn route_and_act(
    app: &App,
    snapshot: &Snapshot,
    downstream: Downstream,
    parts: &mut Parts,
    body: ClientBody,
    now: Nanos,
    progress: &mut Progress,
) -> Result<Response<ResponseBody>, GatewayError> {
    guard(snapshot, parts)?;
    let index = route(snapshot, parts)?;
    // Routes are counted in `u32`s (see `Seen::route_index`).
    progress.seen.route_index = u32::try_from(index).ok();
    let route = &snapshot.config.routes[index];
    if let RouteAction::Quota { limits } = &route.action {
        // The caller's own state, charging nothing: no admission.
        let peer = downstream.peer.ip();
        let (response, fields) =
            quota::answer(app, snapshot, route, parts, peer, limits, now).await?;
        progress.answer.fields = fields;
        return Ok(response);
    }
    let plan = &snapshot.routes[index];
    // Filled in place: returned by value it was copied twice (1.1 KB).
    let mut ticket = Ticket::default();
    let mut body = PendingBody::Fresh(body);
    let routed = Routed {
        route,
        plan,
        parts,
        client: Client::Peer(downstream.peer.ip()),
        body: RequestBody::Client(&mut body),
        now,
    };
    let admitted = match progress.seen.trace.as_deref_mut() {
        // A recorded request whose decision may call Redis: its calls
        // become spans.
        Some(spans) if plan.shared && app.store().is_some() => {
            traced::admit_noting_store_calls(app, snapshot, routed, &mut ticket, spans).await
        }
        // Decided at once, but for a body, a store or a queue to wait for
        // (`admission::admit_at_once`: no future of its own to build).
        _ => match admission::admit_at_once(app, snapshot, routed, &mut ticket) {
            Ok(admitted) => admitted,
            // Boxed: its state (a body read, a store call, a wait in a
            // line) would otherwise widen every request's future, and a
            // request that gets here waits for I/O that costs far more
            // than the allocation.
            Err(later) => Box::pin(admission::admit_later(app, snapshot, later, &mut ticket)).await,
        },
    };
    progress.seen.client_ip = ticket.client_ip();
    // A token route's reservation, settled from its response.
    let mut bill = match admitted {
        RequestAdmission::Admitted { bill } => bill,
        RequestAdmission::Denied { by } => {
            let cost = ticket.cost_of(by, route.cost);
            return Ok(deny(snapshot, plan, &ticket, by, cost, parts, progress));
        }
        RequestAdmission::MissingKey { position } => {
            let limit = snapshot.limit_config(plan.stack[position]);
            return Err(GatewayError::missing_key(limit));
        }
        RequestAdmission::StoreDown => return Err(GatewayError::StoreUnavailable),
        RequestAdmission::BodyRefused(refused) => return Err(refused.into()),
        RequestAdmission::Unidentified(refused) => return Err(GatewayError::unidentified(refused)),
    };
    let limited = !plan.stack.is_empty();
    if limited {
        // Noted now, so the log line has it even if forwarding fails.
        // Not `Option::map`: its closure stayed a call (~27 instructions
        // per allowed request, `bench/instructions.sh`).
        if let Some(focus) = ticket.focus() {
            progress.seen.limit = Some(note(plan, &ticket, focus, false));
        }
        progress.seen.tokens = bill.as_ref().and_then(TokenBill::tally);
        ticket.move_permits_into(&mut progress.answer.permits);
        // A token bucket's `wait` or a leaky bucket's delay: the request
        // waits its turn, like nginx `limit_req` without `nodelay` (a client
        // that gives up drops this future; its place was paid for).
        // What `hold::wait_out` does for `/auth`, spelled out in this
        // size-checked future.
        if let Some(hold) = ticket.hold() {
            tokio::time::sleep(Duration::from_nanos(hold.wait)).await;
            admission::hold::record_wait(app, snapshot, plan, &mut ticket, hold);
        }
        if let Some(note) = &mut progress.seen.limit {
            note.queued_us = ticket
                .waited()
                .map_or(0, |w| u32::try_from(w.as_micros()).unwrap_or(u32::MAX));
        }
    }
    if let Some(spans) = progress.seen.trace.as_deref_mut() {
        traced::admitted(spans, ticket.waited().is_some());
    }
    if let Some(rule) = &route.tokens {
        tokens::include_usage(rule, &mut body, parts);
    }
    let admitted = limited.then_some(&ticket);
    // The response's fields beyond its header map: an upstream's, relayed
    // as lines, then the rate-limit fields (see `FieldLines`).
    let (response, mut fields) = match &route.action {
        RouteAction::Respond {
            status,
            body,
            content_type,
        } => {
            // Its usage event (`usage_events = true`) settles now.
            if let Some(mut bill) = bill.take() {
                bill.set_status(status.as_u16());
            }
            (respond(*status, body, content_type), FieldLines::new())
        }
        // `DecideOnly` was answered 404 at routing, `Quota` before admission.
        RouteAction::Forward(_) | RouteAction::DecideOnly | RouteAction::Quota { .. } => {
            if let Some(spans) = progress.seen.trace.as_deref_mut() {
                let upstream = snapshot.upstream_of(&route.action).map(|u| &**u);
                traced::begin_upstream(spans, upstream, parts, app.clock.now());
            }
            let forwarded = match (&route.retry, &plan.retry_budget) {
                (Some(policy), Some(budget)) => {
                    let retrying = Retrying {
                        app,
                        snapshot,
                        route,
                        policy,
                        budget,
                    };
                    retried(retrying, index, downstream, parts, body, progress).await
                }
                _ => {
                    send_upstream(
                        snapshot,
                        route,
                        downstream,
                        parts,
                        body,
                        &mut progress.answer.permits,
                        interim_sink(&progress.answer.connection),
                        &mut Attempt::default(),
                    )
                    .await
                }
            };
            if let Some(spans) = progress.seen.trace.as_deref_mut() {
                end_upstream_span(app, spans, &forwarded, progress.seen.retries);
            }
            // An adaptive limit learns from the upstream's answer (its
            // permit, released when the body ends, carries it there).
            let answer = match &forwarded {
                Ok((response, _)) => Some(UpstreamAnswer::Status(response.status().as_u16())),
                Err(GatewayError::UpstreamTimeout { .. }) => Some(UpstreamAnswer::TimedOut),
                Err(_) => None,
            };
            if let Some(answer) = answer
                && !progress.answer.permits.is_empty()
            {
                progress.answer.permits.record_outcome(answer, &*app.clock);
            }
            match forwarded {
                Ok((mut response, fields)) => {
                    settle(app, snapshot, index, admitted, bill, &mut response, &fields);
                    (response, fields)
                }
                Err(error) => {
                    if let Some(bill) = &mut bill {
                        bill.set_status(error.status().as_u16());
                    }
                    // The request was admitted and charged: the gateway's
                    // error answer tells the client its quota as well.
                    if let Some(admitted) = admitted {
                        progress.answer.fields = failed_request_fields(snapshot, plan, admitted);
                    }
                    return Err(error);
                }
            }
        }
    };
    if let Some(admitted) = admitted {
        ratelimit::admitted_fields(&mut fields, snapshot, plan, admitted);
        // Ours replace an upstream's fields of the same names.
        fields.drop_replaced();
    }
    progress.answer.fields = fields;
    Ok(response)
}

/// Step 6's client span ends with the upstream's answer. Out of line:
/// most requests are not recorded.
#[cold]
#[inline(never)]
fn end_upstream_span(app: &App, spans: &mut RequestSpans, forwarded: &Forwarded, retries: u32) {
    let answer = match forwarded {
        Ok((response, _)) => Ok(response.status().as_u16()),
        Err(error) => Err(error),
    };
    traced::end_upstream(spans, answer, retries, app.clock.now());
}

/// A `respond` route's own answer.
fn respond(status: StatusCode, body: &Bytes, content_type: &HeaderValue) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(body.clone()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, content_type.clone());
    response
}

/// Step 2: what no route should see is refused (oversized heads → 431, an
/// HTTP/2 request whose `:authority` or `Host` is no valid host → 400, a
/// path that cannot be normalised → 400), then the path normalised.
#[inline(always)]
fn guard(snapshot: &Snapshot, parts: &mut Parts) -> Result<(), GatewayError> {
    let server = &snapshot.config.server;
    let limit = server.max_header_bytes;
    if head_size(parts) > limit {
        return Err(GatewayError::HeadersTooLarge { limit });
    }
    // The HTTP/1.1 codec has checked `Host` and the target already; h2
    // checks only what `Uri` cannot read, so the host rule is applied here.
    if parts.version == Version::HTTP_2 {
        host::check_http2_request(&parts.uri, &parts.headers)
            .map_err(|reason| GatewayError::BadRequest { reason })?;
    }
    // Every spelling of a path meets the route of its plain form: from here
    // on (route, keys, forwarding) the path is the normalised one.
    if server.path_normalization {
        normalize_uri(&mut parts.uri, server.escaped_slashes).map_err(|error| {
            GatewayError::BadRequest {
                reason: error.reason(),
            }
        })?;
    }
    Ok(())
}

/// Step 3: the first matching route, in file order; 404 without one, and
/// for a route of the decision service's `/auth` alone (nothing to forward
/// to).
#[inline(always)]
fn route(snapshot: &Snapshot, parts: &Parts) -> Result<usize, GatewayError> {
    match snapshot.router.find(parts) {
        Some(index)
            if !matches!(
                snapshot.config.routes[index].action,
                RouteAction::DecideOnly
            ) =>
        {
            Ok(index)
        }
        _ => Err(GatewayError::NoRoute {
            method: parts.method.clone(),
            path: parts.uri.path().to_owned(),
        }),
    }
}

/// A denied request's 429 (`cost`: what the denying limit was asked for),
/// its fields handed on with it, noted for the log line. Always inlined,
/// as it was in `route_and_act`: a call of the deny path's own.
#[inline(always)]
fn deny(
    snapshot: &Snapshot,
    plan: &RoutePlan,
    ticket: &Ticket<'_>,
    by: usize,
    cost: u64,
    parts: &mut Parts,
    progress: &mut Progress,
) -> Response<ResponseBody> {
    progress.seen.limit = Some(note(plan, ticket, by, true));
    if let Some(spans) = progress.seen.trace.as_deref_mut() {
        traced::refused(spans, ticket.shed().is_some());
    }
    let fields = &mut progress.answer.fields;
    let mut response = ratelimit::denied_response_into(snapshot, plan, ticket, by, cost, fields);
    recycle_map(&mut parts.headers, response.headers_mut());
    response
}

/// Step 6's forwarding with the route's retries, boxed: the retry loop's
/// future (a forward inside it, the request's template) would otherwise
/// make every request's future larger, retried or not, and each larger
/// future is copied when it starts. A plain function, so that nothing but
/// the box is built into the request's future.
fn retried<'a>(
    retrying: Retrying<'a>,
    index: usize,
    downstream: Downstream,
    parts: &'a mut Parts,
    body: PendingBody,
    progress: &'a mut Progress,
) -> Pin<Box<dyn Future<Output = Forwarded> + Send + 'a>> {
    let sender = Sender {
        permits: &mut progress.answer.permits,
        interim: interim_sink(&progress.answer.connection),
        retries: &mut progress.seen.retries,
        upstream_label: upstream_label(retrying.snapshot, index),
    };
    Box::pin(async move { retrying.forward(downstream, parts, body, sender).await })
}

/// An upstream's answer, or why there is none.
type Forwarded = Result<(Response<ResponseBody>, FieldLines), GatewayError>;

/// Step 7's settlement of a forwarded response: `cost_header`'s difference
/// on an admitted request, and a token route's bill from its usage (at once
/// from a header, or as its body is relayed). The response is settled
/// where it is: passed through and returned, it was copied four times
/// (192 bytes each) on every forwarded request.
#[inline(always)]
fn settle(
    app: &App,
    snapshot: &Snapshot,
    index: usize,
    admitted: Option<&Ticket<'_>>,
    bill: Option<TokenBill>,
    response: &mut Response<ResponseBody>,
    fields: &FieldLines,
) {
    let route = &snapshot.config.routes[index];
    if let (Some(cost_header), Some(admitted)) = (&route.cost_header, admitted) {
        let reported = fields.relayed_value(cost_header.as_str());
        admission::settle(app, snapshot, index, route.cost, admitted, reported);
    }
    if let Some(bill) = bill {
        settle_tokens(route, bill, response, fields);
    }
}

/// A token route's bill, or a usage event's, settled from the response
/// (`proxy::tokens`). Out of line: most routes bill nothing.
#[cold]
#[inline(never)]
fn settle_tokens(
    route: &RouteConfig,
    bill: TokenBill,
    response: &mut Response<ResponseBody>,
    fields: &FieldLines,
) {
    let taken = std::mem::replace(response, Response::new(ResponseBody::full(Bytes::new())));
    *response = match &route.tokens {
        Some(rule) => tokens::settle_from(rule, bill, taken, fields),
        None => tokens::settle_at_end(bill, taken),
    };
}

/// The log line's note of the limit at `position` of the route's stack.
/// Always inlined: as the allowed path's `Option::map`, it was a call.
#[inline(always)]
fn note(plan: &RoutePlan, ticket: &Ticket<'_>, position: usize, denied: bool) -> LimitNote {
    LimitNote {
        limit: plan.stack[position],
        remaining: ticket.entries()[position].verdict.remaining,
        denied,
        queued_us: 0,
    }
}

/// The rate-limit fields of an admitted request whose forwarding failed
/// (the 502, 504 or 4xx the gateway answers instead). Out of line: rare.
#[cold]
#[inline(never)]
fn failed_request_fields(snapshot: &Snapshot, plan: &RoutePlan, ticket: &Ticket<'_>) -> FieldLines {
    let mut fields = FieldLines::new();
    ratelimit::admitted_fields(&mut fields, snapshot, plan, ticket);
    fields
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use bytes::Bytes;

    /// Every request's future is built and moved whole: it must not grow
    /// unnoticed (a 9 KB exchange state once cost ~9,000 instructions per
    /// request). Release builds lay futures out like this debug one does
    /// not, so the bound is for this build only: raise it knowingly.
    #[test]
    fn the_request_future_does_not_grow() {
        let config = Config::from_bytes(
            std::path::Path::new("gateway.toml"),
            b"[server]\nlisten = \"127.0.0.1:0\"\n[upstreams.api]\nurl = \"http://127.0.0.1:9\"\n\
              [[routes]]\nname = \"all\"\nmatch = { path_prefix = \"/\" }\nupstream = \"api\"\n",
        )
        .unwrap();
        let app = App::new(config);
        let downstream = Downstream {
            peer: "127.0.0.1:1".parse().unwrap(),
            proto: "http",
        };
        let request = Request::new(ClientBody::Complete(Bytes::new()));
        let future = handle(&app, downstream, request, None);
        let size = std::mem::size_of_val(&future);
        println!("request future: {size} bytes");
        // 4216 until token quotas: +8, a token route's reservation tally
        // for its log line (`Seen::tokens`). 4224 until overload protection
        // and overrides: +16, the ticket's priority, shed reason, override
        // flag, queued µs and (boxed) `fair_by` values. 4240 until the
        // Redis spans and the server span ended with the body: +8. 4248
        // until admission's at-once call: +16, what `admit_later` keeps of
        // where `admit_at_once` stopped; a request decided at once builds
        // none of it (~230 instructions fewer a request). 4264 until the
        // forwarded request's head was lent to `send_upstream` and its
        // upstream request made in place: -424; and `admit_later` boxed
        // (its state had set the size since the at-once call): 3776 until
        // `handle`'s body took its captures in place and lent the head to
        // `route_and_act` (no request kept twice): 3304.
        assert!(size <= 3304, "the request future is {size} bytes");
    }
}
