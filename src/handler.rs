//! The life of one request, as plain steps in a fixed order:
//!
//! 1. **snapshot** — load the current configuration once; the request keeps it.
//! 2. **guard** — reject what no route should see (oversized heads → 431).
//! 3. **route** — first matching route in file order, else 404.
//! 4. **identify** — the caller's consumer from its API key (401 where one is
//!    required), the client IP behind trusted proxies, then each limit's key
//!    digested from the request (buffering the body only for `body:FIELD`).
//! 5. **limit** — the route's stack decided all or nothing; a denial is
//!    answered here (429 + headers) without touching the upstream.
//! 6. **act** — answer a `respond` route, or forward upstream (body capped by
//!    the route's `max_body` → 413; upstream failures → 502/504), after any
//!    leaky-bucket delay.
//! 7. **respond** — rate-limit headers on the response; post-response cost
//!    settled from `cost_header`; concurrency slots held until the body ends.
//! 8. **observe** — count the request and its duration under the route's name
//!    ([`crate::metrics`]) and write its access-log line ([`crate::access_log`];
//!    denials sampled by `log_denied`).
//!
//! Every error is a [`GatewayError`] turned into problem+json in one place.

use std::net::IpAddr;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Uri};
use smallvec::SmallVec;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

use crate::access_log::{self, AccessEntry};
use crate::app::{App, RoutePlan, Snapshot};
use crate::config::{Config, Consumer, LimitConfig, OnMissingKey, RouteAction, RouteConfig};
use crate::error::GatewayError;
use crate::http::content_length;
use crate::identity::body_fields::BodyFields;
use crate::identity::client_ip::{client_net, resolve_with};
use crate::identity::consumer::{Caller, identify};
use crate::identity::keys::{RequestFacts, extract, shared_key};
use crate::limit::{Algorithm, Limiter};
use crate::limit::{
    EntryVerdict, LimitKey, Nanos, Outcome, Permits, StackEntry, check_stack,
    stack::INLINE as INLINE_STACK,
};
use crate::metrics::Metrics;
use crate::proxy::body::{BodyCap, ClientBody, Completion, RequestBody, ResponseBody};
use crate::proxy::client::PoolError;
use crate::proxy::field_lines::FieldLines;
use crate::proxy::forward::{Prepared, Upstream};
use crate::proxy::ratelimit;
use crate::proxy::ratelimit::StackView;
use crate::proxy::upgrade;
use crate::server::ConnActivity;

/// What the server knows about the connection a request came on.
#[derive(Debug, Clone, Copy)]
pub struct Downstream {
    pub peer: SocketAddr,
    /// `"http"` or `"https"`, for `X-Forwarded-Proto` and `Forwarded`.
    pub proto: &'static str,
}

/// Handles one request from a downstream client. The response's body ends
/// the request when it ends or is dropped: it then releases the request's
/// concurrency slots and tells `connection` (if given) that it is idle.
/// Returned beside the response: its fields that are not in its header map
/// yet ([`FieldLines`]: an upstream's, relayed, and the rate-limit fields),
/// which the server writes with the head or puts in the map first.
///
/// One future from the server down: the connection awaits this one directly
/// (a wrapper future around it was a 3.5 KB copy per request).
pub async fn handle(
    app: &App,
    downstream: Downstream,
    request: Request<ClientBody>,
    connection: Option<Arc<ConnActivity>>,
) -> (Response<ResponseBody>, FieldLines) {
    let now = app.clock.now();
    let observation = Observation::start(downstream, &request, now);
    let snapshot = app.snapshot();
    let mut notes = Notes::default();
    let response = match route_and_act(app, &snapshot, downstream, request, now, &mut notes).await {
        Ok(response) => response,
        Err(error) => {
            if let Some(kind) = error.upstream_kind() {
                tracing::warn!(error = %error_chain(&error), kind, "upstream error");
                if let Some(upstream) = notes.route_index.and_then(|i| upstream_label(&snapshot, i))
                {
                    app.metrics().record_upstream_error(upstream, kind);
                }
            }
            error.to_response()
        }
    };
    observation.finish(app, &snapshot, response.status().as_u16(), &notes);
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(connection) = &connection
    {
        // A tunnel takes the client's connection over (`proxy::upgrade`).
        connection.handed_to_tunnel();
    }
    let completion = Completion {
        connection,
        permits: std::mem::take(&mut notes.permits),
    };
    let response = response.map(|body| body.with_completion(completion));
    (response, std::mem::take(&mut notes.fields))
}

/// What the steps learn about a request, for metrics and its log line.
#[derive(Debug, Default)]
struct Notes {
    /// Index into the snapshot's routes once a route matched.
    route_index: Option<usize>,
    /// The client after trusted-proxy resolution, once identified.
    client_ip: Option<IpAddr>,
    /// The limit the response's legacy headers describe.
    limit: Option<LimitNote>,
    /// Concurrency slots, handed to the response body.
    permits: Permits,
    /// The response's rate-limit fields, handed to the server with it.
    fields: FieldLines,
}

/// One limit's part in a request's log line.
#[derive(Debug, Clone, Copy)]
struct LimitNote {
    /// Index into the snapshot's limits.
    index: usize,
    remaining: u64,
    denied: bool,
}

/// Step 8's view of a request, taken before the request is consumed.
struct Observation {
    /// When the request reached the handler, on the limiter's clock: the one
    /// clock read of the request, also the limit step's `now`.
    started: Nanos,
    downstream: Downstream,
    /// Cloning shares hyper's parsed bytes; nothing is copied.
    method: Method,
    uri: Uri,
}

impl Observation {
    fn start(downstream: Downstream, request: &Request<ClientBody>, now: Nanos) -> Observation {
        Observation {
            started: now,
            downstream,
            method: request.method().clone(),
            uri: request.uri().clone(),
        }
    }

    /// Step 8: metrics and the access-log line of the answered request.
    fn finish(self, app: &App, snapshot: &Snapshot, status: u16, notes: &Notes) {
        let elapsed = Duration::from_nanos(app.clock.now().saturating_sub(self.started));
        let plan = notes.route_index.and_then(|i| snapshot.routes.get(i));
        let route = match plan {
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
        // A flood of denials must not become a flood of log I/O.
        if notes.limit.is_some_and(|l| l.denied) && !snapshot.denied_log.should_log_denied() {
            return;
        }
        access_log::log(&AccessEntry {
            method: &self.method,
            path: self.uri.path(),
            route,
            status,
            elapsed,
            upstream: notes
                .route_index
                .and_then(|i| upstream_label(snapshot, i))
                .map(|name| &**name),
            client_ip: notes.client_ip.unwrap_or(self.downstream.peer.ip()),
            limit: notes.limit.map(|note| access_log::LimitField {
                name: &snapshot.config.limits[note.index].name,
                remaining: note.remaining,
                denied: note.denied,
            }),
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

/// Steps 1–7; `notes` are filled as the steps learn things (the route as soon
/// as one matched), so metrics and the access log have them also when acting
/// on the request fails.
async fn route_and_act(
    app: &App,
    snapshot: &Snapshot,
    downstream: Downstream,
    request: Request<ClientBody>,
    now: Nanos,
    notes: &mut Notes,
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
    notes.route_index = Some(index);
    let route = &snapshot.config.routes[index];
    let plan = &snapshot.routes[index];

    let consumer = identify_caller(snapshot, route, &parts)?;
    let (body, fields) = if plan.needs_body {
        buffer_for_key(body, &parts, &snapshot.config, route).await?
    } else {
        (PendingBody::Fresh(body), None)
    };

    // Filled in place: returned by value it was copied twice (1.1 KB).
    let mut decided = Admitted::default();
    let limited = !plan.stack.is_empty();
    if limited {
        let facts = Facts {
            consumer,
            body: fields.as_ref(),
        };
        if let Err(response) = limit_request(
            snapshot,
            route,
            plan,
            &parts,
            downstream,
            &facts,
            now,
            app.metrics(),
            notes,
            &mut decided,
        ) {
            return Ok(response);
        }
    }
    let admitted = limited.then_some(&decided);
    if let Some(delay) = admitted.map(|a| a.delay).filter(|d| *d > 0) {
        // Leaky bucket in delay mode: the request waits its turn, like nginx
        // `limit_req` without `nodelay`. A client that gives up drops this
        // future (and its place was already paid for, as in nginx).
        tokio::time::sleep(Duration::from_nanos(delay)).await;
    }

    // The response's fields beyond its header map: an upstream's, relayed
    // as lines, then the rate-limit fields (see `FieldLines`).
    let (response, mut fields) = match &route.action {
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
            (response, FieldLines::new())
        }
        RouteAction::Forward(_) => {
            let (response, fields) =
                forward(snapshot, route, downstream, parts, body, &mut notes.permits).await?;
            if let (Some(cost_header), Some(admitted)) = (&route.cost_header, admitted) {
                let reported = fields.relayed_value(cost_header.as_str());
                settle_cost(app, route, admitted, reported);
            }
            (response, fields)
        }
    };
    if let Some(admitted) = admitted {
        let view = admitted.view(snapshot);
        let policy = admitted.policy(plan);
        ratelimit::limit_fields(
            &mut fields,
            view,
            &admitted.verdicts,
            policy,
            admitted.focus,
        );
        // Ours replace an upstream's fields of the same names.
        fields.drop_replaced();
    }
    notes.fields = fields;
    Ok(response)
}

/// The caller's consumer, or 401 where the route or configuration demands one.
fn identify_caller<'s>(
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    parts: &Parts,
) -> Result<Option<&'s Consumer>, GatewayError> {
    let config = &snapshot.config;
    // With no consumers and nothing that refuses a request for its key,
    // every answer is "no consumer": the key is not looked for.
    if config.consumers.is_empty() && !config.api_keys.reject_unknown && !route.require_consumer {
        return Ok(None);
    }
    match identify(&parts.headers, &config.api_keys, &config.consumers) {
        Caller::Known(consumer) => Ok(Some(consumer)),
        Caller::UnknownKey if config.api_keys.reject_unknown || route.require_consumer => {
            Err(GatewayError::Unauthorized {
                reason: "the API key is not known",
            })
        }
        Caller::Anonymous if route.require_consumer => Err(GatewayError::Unauthorized {
            reason: "this route needs an API key",
        }),
        Caller::UnknownKey | Caller::Anonymous => Ok(None),
    }
}

/// A request body not yet sent upstream.
enum PendingBody {
    /// Untouched.
    Fresh(ClientBody),
    /// Read completely for a `body:FIELD` key.
    Complete(Bytes),
    /// Read up to `max_key_body`; the rest still streams.
    Partial(Bytes, ClientBody),
}

/// Reads the body up to `max_key_body` (and never past the route's
/// `max_body`), and parses its fields when it is complete. The bytes read are
/// forwarded unchanged, followed by the rest of the stream.
async fn buffer_for_key(
    mut incoming: ClientBody,
    parts: &Parts,
    config: &Config,
    route: &RouteConfig,
) -> Result<(PendingBody, Option<BodyFields>), GatewayError> {
    let cap = config.server.max_key_body;
    let declared = declared_length(parts);
    if let Some(limit) = route.max_body
        && declared.is_some_and(|length| length > limit)
    {
        return Err(GatewayError::BodyTooLarge { limit });
    }
    if declared.is_some_and(|length| length > cap as u64) {
        // Over the key cap: not worth reading; the key is missing.
        return Ok((PendingBody::Fresh(incoming), None));
    }
    let mut buffer = BytesMut::new();
    // The request is in flight, so the connection watchdog does not guard
    // this read: bound it like a request head, or a slow uploader on a login
    // route would hold the connection as long as it likes.
    let deadline = tokio::time::Instant::now() + config.server.header_read_timeout;
    loop {
        let frame = tokio::time::timeout_at(deadline, incoming.frame())
            .await
            .map_err(|_| GatewayError::RequestTimeout {
                timeout: config.server.header_read_timeout,
            })?;
        match frame {
            None => break,
            Some(Err(_)) => {
                return Err(GatewayError::BadRequest {
                    reason: "the request body could not be read",
                });
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    buffer.extend_from_slice(&data);
                }
                if let Some(limit) = route.max_body
                    && buffer.len() as u64 > limit
                {
                    return Err(GatewayError::BodyTooLarge { limit });
                }
                if buffer.len() > cap {
                    return Ok((PendingBody::Partial(buffer.freeze(), incoming), None));
                }
            }
        }
    }
    let bytes = buffer.freeze();
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let fields = BodyFields::parse(content_type, &bytes);
    Ok((PendingBody::Complete(bytes), Some(fields)))
}

/// What the limit step knows beyond the request head.
struct Facts<'s> {
    consumer: Option<&'s Consumer>,
    body: Option<&'s BodyFields>,
}

/// The limit step's result for an admitted request.
#[derive(Default)]
struct Admitted<'s> {
    /// The route's limits, in stack order.
    stack: SmallVec<[&'s LimitConfig; INLINE_STACK]>,
    /// The algorithm in force for each (the caller's plan may change it).
    algorithms: SmallVec<[Algorithm; INLINE_STACK]>,
    /// The limiter charged for each.
    limiters: SmallVec<[&'s Limiter; INLINE_STACK]>,
    /// Each limit's key for this request (`None`: skipped).
    keys: SmallVec<[Option<LimitKey>; INLINE_STACK]>,
    verdicts: SmallVec<[EntryVerdict; INLINE_STACK]>,
    /// Leaky bucket in delay mode: wait this long before forwarding.
    delay: Nanos,
    /// The caller's plan, if it has one.
    plan: Option<&'s str>,
    /// The entry the legacy headers describe: the least remaining `r / q`.
    focus: Option<usize>,
}

impl Admitted<'_> {
    fn view(&self, snapshot: &Snapshot) -> StackView<'_> {
        StackView {
            limits: &self.stack,
            algorithms: &self.algorithms,
            server: snapshot.config.server.headers,
        }
    }

    /// `RateLimit-Policy`: precomputed for the route and this caller's plan.
    fn policy<'p>(&self, plan: &'p RoutePlan) -> Option<&'p str> {
        plan.policy_for(self.plan)
    }
}

/// Identifies the request's keys and decides the route's stack into
/// `admitted` (empty on entry). `Err` is the response to send instead of
/// forwarding (a denial, or a missing key).
// The `Err` is the response itself, moved once to the caller; boxing it would
// add an allocation to the deny path for nothing.
#[allow(clippy::too_many_arguments, clippy::result_large_err)]
fn limit_request<'s>(
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    plan: &RoutePlan,
    parts: &Parts,
    downstream: Downstream,
    facts: &Facts<'s>,
    now: Nanos,
    metrics: &Metrics,
    notes: &mut Notes,
    admitted: &mut Admitted<'s>,
) -> Result<(), Response<ResponseBody>> {
    let forward_header = || {
        parts
            .headers
            .get_all(snapshot.client_ip.header.name())
            .iter()
            .map(|v| v.as_bytes())
    };
    let client_ip = resolve_with(downstream.peer.ip(), forward_header, &snapshot.client_ip);
    notes.client_ip = Some(client_ip);
    let key_facts = RequestFacts {
        client: client_net(client_ip, &snapshot.client_ip),
        route: &route.name,
        consumer: facts.consumer,
        body: facts.body,
    };
    let caller_plan = facts.consumer.and_then(|c| c.plan.as_deref());

    admitted.plan = caller_plan;
    for &i in &plan.stack {
        let limit = &snapshot.config.limits[i];
        let key = match (extract(&limit.key, parts, &key_facts), limit.on_missing_key) {
            (Some(key), _) => Some(key),
            (None, OnMissingKey::Skip) => None,
            (None, OnMissingKey::Shared) => Some(shared_key()),
            (None, OnMissingKey::Deny) => {
                return Err(ratelimit::missing_key_response(
                    limit,
                    &crate::summary::key_parts(&limit.key),
                ));
            }
        };
        // A plan's limiter is built with the plan's numbers.
        let limiter = snapshot.limiters[i].for_plan(caller_plan);
        let algorithm = limiter.algorithm();
        admitted.stack.push(limit);
        admitted.algorithms.push(algorithm);
        admitted.limiters.push(limiter);
        admitted.keys.push(key);
    }
    let entries: SmallVec<[StackEntry<'_>; INLINE_STACK]> = admitted
        .limiters
        .iter()
        .zip(&admitted.keys)
        .zip(&admitted.stack)
        .map(|((limiter, key), limit)| StackEntry {
            limiter,
            key: *key,
            shadow: limit.shadow,
        })
        .collect();

    let mut decision = check_stack(&entries, route.cost, now);
    record_decisions(metrics, snapshot, route, plan, admitted, &decision.entries);
    if let Some(denied_by) = decision.denied_by {
        notes.limit = Some(LimitNote {
            index: plan.stack[denied_by],
            remaining: decision.entries[denied_by].verdict.remaining,
            denied: true,
        });
        let view = admitted.view(snapshot);
        let policy = admitted.policy(plan);
        let (response, lines) =
            ratelimit::deny_response(view, &decision.entries, denied_by, policy, route.cost);
        notes.fields = lines;
        return Err(response);
    }
    notes.permits = decision.take_permits();
    // Noted now, so the log line has it even if forwarding fails.
    admitted.focus = ratelimit::least_remaining(admitted.view(snapshot), &decision.entries);
    notes.limit = admitted.focus.map(|i| LimitNote {
        index: plan.stack[i],
        remaining: decision.entries[i].verdict.remaining,
        denied: false,
    });
    admitted.verdicts = std::mem::take(&mut decision.entries);
    admitted.delay = decision.delay;
    Ok(())
}

/// Counts each limit's outcome, and keys that just passed 80% of a quota.
fn record_decisions(
    metrics: &Metrics,
    snapshot: &Snapshot,
    route: &RouteConfig,
    plan: &RoutePlan,
    admitted: &Admitted<'_>,
    entries: &[EntryVerdict],
) {
    let route_label = &plan.name;
    for (position, ((&index, entry), algorithm)) in plan
        .stack
        .iter()
        .zip(entries)
        .zip(&admitted.algorithms)
        .enumerate()
    {
        let limit_label = &snapshot.labels.limits[index];
        metrics.record_route_decision(&plan.metrics, position, entry.outcome);
        match entry.outcome {
            Outcome::ShadowDenied => {
                // Debug, not info: a shadow limit may "deny" every request;
                // `tollgate_ratelimit_decisions_total` counts them all.
                tracing::debug!(route = %route.name, limit = %limit_label, "shadow limit would have denied");
            }
            Outcome::Allowed => {
                // Near limit: this request took the key past 80% of its quota.
                let quota = crate::limit::quota(algorithm) as u128;
                let after = entry.verdict.remaining as u128;
                let before = after + route.cost as u128;
                if after * 5 < quota && before * 5 >= quota {
                    metrics.record_near_limit(route_label, limit_label);
                }
            }
            Outcome::Denied | Outcome::Skipped => {}
        }
    }
}

/// Post-response cost: charges (or refunds) the difference between the
/// upstream's reported cost (`reported`, its cost header's value) and the up-front cost to every limit that charged
/// the request. Never blocks the response; bad values are ignored.
fn settle_cost(app: &App, route: &RouteConfig, admitted: &Admitted<'_>, reported: Option<&[u8]>) {
    let Some(reported) = reported
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
    else {
        return;
    };
    let delta = i64::try_from(reported)
        .unwrap_or(i64::MAX)
        .saturating_sub(i64::try_from(route.cost).unwrap_or(i64::MAX));
    if delta == 0 {
        return;
    }
    let now = app.clock.now();
    for ((limiter, key), entry) in admitted
        .limiters
        .iter()
        .zip(&admitted.keys)
        .zip(&admitted.verdicts)
    {
        // Shadow limits that would have denied were not charged: nothing to settle.
        if let (Some(key), Outcome::Allowed) = (key, entry.outcome) {
            limiter.adjust(*key, delta, now);
        }
    }
}

/// Forwards the request upstream and hands back the upstream's response.
///
/// Split in two on purpose: everything before the upstream call is done by
/// [`prepare_forward`], a plain function, so its temporaries (the request's
/// parts in several states) are not kept in this future — which every
/// future above it embeds and copies.
async fn forward(
    snapshot: &Snapshot,
    route: &RouteConfig,
    downstream: Downstream,
    parts: Parts,
    body: PendingBody,
    permits: &mut Permits,
) -> Result<(Response<ResponseBody>, FieldLines), GatewayError> {
    let Forwarding {
        upstream,
        request,
        exceeded,
        client_upgrade,
    } = prepare_forward(snapshot, route, downstream, parts, body)?;
    let (mut response, fields) = upstream
        .send(request, exceeded, route.max_body.unwrap_or(u64::MAX))
        .await?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        match (client_upgrade, response.body_mut().take_upgraded()) {
            (Some(client_upgrade), Some(upstream_conn)) => {
                upgrade::spawn_tunnel(client_upgrade, upstream_conn, std::mem::take(permits));
            }
            // A switch nobody asked for cannot be relayed.
            _ => {
                return Err(GatewayError::UpstreamFailed {
                    upstream: upstream.config.name.clone(),
                    source: PoolError::Request(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the upstream switched protocols unasked",
                    )),
                });
            }
        }
    }
    Ok((response.map(ResponseBody::upstream), fields))
}

/// A request ready to send, and what the forward step needs afterwards.
struct Forwarding<'s> {
    upstream: &'s Upstream,
    request: Prepared,
    /// Set when the streamed body outgrew `max_body` (413, not 502).
    exceeded: Option<Arc<AtomicBool>>,
    /// The client's side of an upgrade, if it asked for one.
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// The synchronous half of [`forward`]: the upstream, the body (capped at
/// `max_body`), and the upstream request.
fn prepare_forward<'s>(
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    downstream: Downstream,
    parts: Parts,
    body: PendingBody,
) -> Result<Forwarding<'s>, GatewayError> {
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
    let body = match body {
        PendingBody::Fresh(inner) => RequestBody::Streaming {
            replay: None,
            inner,
            cap,
        },
        // Already checked against `max_body` while buffering.
        PendingBody::Complete(bytes) => RequestBody::Buffered(Some(bytes)),
        PendingBody::Partial(bytes, inner) => {
            let cap = cap.map(|cap| BodyCap {
                seen: bytes.len() as u64,
                ..cap
            });
            RequestBody::Streaming {
                replay: Some(bytes),
                inner,
                cap,
            }
        }
    };
    let mut request = upstream.prepare(parts, body, downstream.peer, downstream.proto)?;
    // hyper hands the client's connection over if we answer 101.
    let client_upgrade = if request.own.upgrade {
        request
            .request
            .extensions_mut()
            .remove::<hyper::upgrade::OnUpgrade>()
    } else {
        None
    };
    Ok(Forwarding {
        upstream,
        request,
        exceeded,
        client_upgrade,
    })
}

/// The `Content-Length` the client declared, by the crate's one rule
/// ([`content_length`]). The server side has refused every request whose
/// length does not parse, so `None` is a request without one.
fn declared_length(parts: &Parts) -> Option<u64> {
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
