//! The life of one request, as plain steps in a fixed order:
//!
//! 1. **snapshot** — load the current configuration once; the request keeps it.
//! 2. **guard** — reject what no route should see (oversized heads → 431, an
//!    HTTP/2 request whose `:authority` or `Host` is no valid host → 400, a
//!    path that cannot be normalised → 400), then normalise the path.
//! 3. **route** — first matching route in file order, else 404.
//! 4. **identify** — the caller's consumer from its API key (401 where one is
//!    required), the client IP behind trusted proxies, then each limit's key
//!    digested from the request (buffering the body only for `body:FIELD`).
//! 5. **limit** — the route's stack decided all or nothing; a denial is
//!    answered here (429 + headers) without touching the upstream.
//! 6. **act** — answer a `respond` route, or forward upstream (body capped by
//!    the route's `max_body` → 413; upstream failures → 502/504; no URL of
//!    the upstream up → 503), after any leaky-bucket delay.
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
use http::{Method, Request, Response, StatusCode, Uri, Version};
use smallvec::SmallVec;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

use crate::access_log::{self, AccessEntry, PendingLine};
use crate::app::{App, RoutePlan, Snapshot};
use crate::config::{Config, Consumer, LimitConfig, OnFailure, RouteAction, RouteConfig};
use crate::http::content_length;
use crate::http::field_lines::{FieldLines, recycle_map};
use crate::http::host;
use crate::http::path::normalize_uri;
use crate::http1::client::InterimSink;
use crate::http1::server::ConnActivity;
use crate::identity::body_fields::BodyFields;
use crate::identity::client_ip::{client_net, resolve_with};
use crate::identity::consumer::admit;
use crate::identity::keys::{RequestFacts, limit_key, shadow_missing_key};
use crate::limit::stack::{SKIPPED, StackDecision, outcome_of};
use crate::limit::{Algorithm, Limiter, Verdict};
use crate::limit::{
    EntryVerdict, LimitKey, Nanos, Outcome, Permits, StackEntry, check_stack, check_stack_into,
    stack::INLINE as INLINE_STACK,
};
use crate::metrics::Metrics;
use crate::proxy::body::{
    BodyCap, BodyTiming, ClientBody, Completion, RequestBody, ResponseBody, Stall,
};
use crate::proxy::error::GatewayError;
use crate::proxy::forward::Prepared;
use crate::proxy::ratelimit;
use crate::proxy::upgrade;
use crate::ratelimit_policy::StackView;
use crate::store::{RedisStore, SharedEntry, Unavailable};
use crate::upstream::pool::PoolError;
use crate::upstream::{Attempt, Upstream};

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
    let mut notes = Notes {
        connection,
        ..Notes::default()
    };
    let response = match route_and_act(app, &snapshot, downstream, request, now, &mut notes).await {
        Ok(response) => response,
        Err(error) => {
            if let Some(kind) = error.upstream_kind() {
                // Not a line per failed request: the URL's health logs the
                // first failure of a spell and then a summary per interval
                // (`upstream::health`).
                tracing::debug!(error = %crate::upstream::health::error_chain(&error), kind, "upstream error");
                if let Some(upstream) = notes.route_index.and_then(|i| upstream_label(&snapshot, i))
                {
                    app.metrics().record_upstream_error(upstream, kind);
                }
            }
            error.to_response()
        }
    };
    let timing = observation.finish(app, &snapshot, &response, &notes);
    let connection = notes.connection.take();
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(connection) = &connection
    {
        // A tunnel takes the client's connection over (`proxy::upgrade`).
        connection.handed_to_tunnel();
    }
    // Moved out, not taken: taking left empty ones for `notes` to drop.
    let Notes {
        permits, fields, ..
    } = notes;
    let completion = Completion {
        connection,
        permits,
    };
    let response = response.map(|body| body.with_completion(completion, timing));
    (response, fields)
}

/// A streamed response's request: counted now, its duration observed when
/// the body ends. Out of line: most bodies come with their head.
#[cold]
#[inline(never)]
fn time_until_end(app: &App, plan: &RoutePlan, status: u16, to_head: Duration) -> BodyTiming {
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
    /// Upstream retries made (for the access log).
    retries: u32,
    /// The client's connection (when the server tracks it): where interim
    /// responses go, and what the response's end tells it is idle.
    connection: Option<Arc<ConnActivity>>,
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
        notes: &Notes,
    ) -> Option<BodyTiming> {
        let status = response.status().as_u16();
        let elapsed = Duration::from_nanos(app.clock.now().saturating_sub(self.started));
        let plan = notes.route_index.and_then(|i| snapshot.routes.get(i));
        let mut timing = None;
        let route = match plan {
            Some(plan) if response.body().still_arriving() => {
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
        // A flood of denials must not become a flood of log I/O.
        if notes.limit.is_some_and(|l| l.denied) && !snapshot.denied_log.should_log_denied() {
            return timing;
        }
        let entry = AccessEntry {
            method: self.method.as_str(),
            // The filter turned the log on during the request: no path.
            path: self.uri.as_ref().map_or("-", Uri::path),
            route,
            status,
            elapsed: Some(elapsed),
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
            retries: notes.retries,
            refused: None,
        };
        match timing {
            // Written when the body ends, with the whole duration.
            Some(mut timing) => {
                if access_log::enabled() {
                    timing.log_at_end(PendingLine::of(&entry));
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
    let (mut parts, body) = request.into_parts();
    let server = &snapshot.config.server;
    let limit = server.max_header_bytes;
    if head_size(&parts) > limit {
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
        let store = app.store().filter(|_| plan.shared);
        match limit_request(
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
            store.is_some(),
        ) {
            Err(mut response) => {
                recycle_map(&mut parts.headers, response.headers_mut());
                return Ok(response);
            }
            Ok(false) => {}
            Ok(true) => {
                if let Some(store) = store {
                    let shared = shared_step(
                        store,
                        snapshot,
                        route,
                        plan,
                        now,
                        app.metrics(),
                        notes,
                        &mut decided,
                    );
                    if let Err(error) = shared.await {
                        return match error {
                            Refused::Response(response) => Ok(response),
                            Refused::Error(error) => Err(error),
                        };
                    }
                }
            }
        }
    }
    let admitted = limited.then_some(&decided);
    if let Some(delay) = admitted.map(|a| a.decision.delay).filter(|d| *d > 0) {
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
            let forwarded = match (&route.retry, &plan.retry_budget) {
                (Some(policy), Some(budget)) => {
                    let retrying = Retrying {
                        app,
                        snapshot,
                        route,
                        policy,
                        budget,
                    };
                    // Boxed: the retry loop's future (a forward inside it,
                    // the request's template) would otherwise make every
                    // request's future larger, retried or not, and each
                    // larger future is copied when it starts.
                    Box::pin(retrying.forward(downstream, parts, body, notes)).await
                }
                _ => {
                    forward(
                        snapshot,
                        route,
                        downstream,
                        parts,
                        body,
                        &mut notes.permits,
                        interim_sink(&notes.connection),
                        &mut Attempt::default(),
                    )
                    .await
                }
            };
            let (response, fields) = match forwarded {
                Ok(answer) => answer,
                Err(error) => {
                    // The request was admitted and charged: the gateway's
                    // error answer tells the client its quota as well.
                    if let Some(admitted) = admitted {
                        notes.fields = failed_request_fields(snapshot, plan, admitted);
                    }
                    return Err(error);
                }
            };
            if let (Some(cost_header), Some(admitted)) = (&route.cost_header, admitted) {
                let reported = fields.relayed_value(cost_header.as_str());
                settle_cost(app, snapshot, index, admitted, reported);
            }
            (response, fields)
        }
    };
    if let Some(admitted) = admitted {
        admitted.push_limit_fields(&mut fields, snapshot, plan);
        // Ours replace an upstream's fields of the same names.
        fields.drop_replaced();
    }
    notes.fields = fields;
    Ok(response)
}

/// The rate-limit fields of an admitted request whose forwarding failed
/// (the 502, 504 or 4xx the gateway answers instead). Out of line: rare.
#[cold]
#[inline(never)]
fn failed_request_fields(
    snapshot: &Snapshot,
    plan: &RoutePlan,
    admitted: &Admitted<'_>,
) -> FieldLines {
    let mut fields = FieldLines::new();
    admitted.push_limit_fields(&mut fields, snapshot, plan);
    fields
}

/// The caller's consumer, or 401 where the route or configuration demands one.
fn identify_caller<'s>(
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    parts: &Parts,
) -> Result<Option<&'s Consumer>, GatewayError> {
    admit(&parts.headers, &snapshot.config, route.require_consumer)
        .map_err(|reason| GatewayError::Unauthorized { reason })
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
    let read = BodyRead::start(config);
    while let Some(data) = read.next(&mut incoming).await? {
        buffer.extend_from_slice(&data);
        if let Some(limit) = route.max_body
            && buffer.len() as u64 > limit
        {
            return Err(GatewayError::BodyTooLarge { limit });
        }
        if buffer.len() > cap {
            return Ok((PendingBody::Partial(buffer.freeze(), incoming), None));
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

/// A client body read before forwarding (for a `body:FIELD` key, or to
/// replay it on a retry). The request is in flight, so the connection
/// watchdog does not guard this read: the whole read is bounded by
/// `body_read_timeout` like a request head, or a slow uploader would hold
/// the connection as long as it likes.
struct BodyRead {
    deadline: tokio::time::Instant,
    timeout: Duration,
}

impl BodyRead {
    fn start(config: &Config) -> Self {
        let timeout = config.server.body_read_timeout;
        BodyRead {
            deadline: tokio::time::Instant::now() + timeout,
            timeout,
        }
    }

    /// The body's next data (trailers are skipped), `None` at its end: 408
    /// past the deadline, 400 when the body cannot be read.
    async fn next(&self, incoming: &mut ClientBody) -> Result<Option<Bytes>, GatewayError> {
        loop {
            let frame = tokio::time::timeout_at(self.deadline, incoming.frame())
                .await
                .map_err(|_| GatewayError::RequestTimeout {
                    timeout: self.timeout,
                })?;
            match frame {
                None => return Ok(None),
                Some(Err(_)) => {
                    return Err(GatewayError::BadRequest {
                        reason: "the request body could not be read",
                    });
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }
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
    /// The stack's decision: each entry's verdict and, for a leaky bucket
    /// in delay mode, how long to wait before forwarding. Decided in place
    /// (`check_stack_into`); its permits go to the request's notes.
    decision: StackDecision,
    /// The caller's plan, if it has one.
    plan: Option<&'s str>,
    /// The entry the legacy headers describe: the least remaining `r / q`.
    focus: Option<usize>,
    /// The shared entries were decided by the store (not a fallback):
    /// their settlement goes there too.
    via_store: bool,
}

impl Admitted<'_> {
    fn view(&self, snapshot: &Snapshot) -> StackView<'_> {
        StackView {
            limits: &self.stack,
            algorithms: &self.algorithms,
            server: snapshot.config.server.headers,
        }
    }

    /// The rate-limit fields of an admitted request, added to `fields`.
    #[inline]
    fn push_limit_fields(&self, fields: &mut FieldLines, snapshot: &Snapshot, plan: &RoutePlan) {
        ratelimit::limit_fields(
            fields,
            self.view(snapshot),
            &self.decision.entries,
            self.policy(plan),
            self.focus,
        );
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
    store: bool,
) -> Result<bool, Response<ResponseBody>> {
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
    for (position, &i) in plan.stack.iter().enumerate() {
        let limit = &snapshot.config.limits[i];
        let Ok(key) = limit_key(limit, parts, &key_facts) else {
            return Err(missing_key(metrics, plan, position, limit));
        };
        // A plan's limiter is built with the plan's numbers.
        let limiter = snapshot.limiters[i].for_plan(caller_plan);
        let algorithm = if store && snapshot.shared[i] {
            // The shared numbers: the limiter holds the scaled fallback.
            shared_algorithm(limit, caller_plan).0
        } else {
            limiter.algorithm()
        };
        admitted.stack.push(limit);
        admitted.algorithms.push(algorithm);
        admitted.limiters.push(limiter);
        admitted.keys.push(key);
    }
    if store {
        return Ok(true);
    }
    // Extended in place: collected, the array was copied out (~60
    // instructions).
    let mut entries: SmallVec<[StackEntry<'_>; INLINE_STACK]> = SmallVec::new();
    entries.extend(
        admitted
            .limiters
            .iter()
            .zip(&admitted.keys)
            .zip(&admitted.stack)
            .map(|((limiter, key), limit)| StackEntry {
                limiter,
                key: *key,
                shadow: limit.shadow,
            }),
    );
    check_stack_into(&entries, route.cost, now, &mut admitted.decision);
    conclude(metrics, snapshot, route, plan, notes, admitted)?;
    Ok(false)
}

/// The limits' outcome (`admitted.decision`) recorded, and the request
/// answered if denied, else its permits moved to the request's notes. Inlined: on the
/// memory path this is the tail of [`limit_request`], as it was before the
/// shared path needed it too.
#[allow(clippy::result_large_err)]
#[inline(always)]
fn conclude(
    metrics: &Metrics,
    snapshot: &Snapshot,
    route: &RouteConfig,
    plan: &RoutePlan,
    notes: &mut Notes,
    admitted: &mut Admitted<'_>,
) -> Result<(), Response<ResponseBody>> {
    let entries = &admitted.decision.entries;
    record_decisions(metrics, snapshot, route, plan, admitted, entries);
    if let Some(denied_by) = admitted.decision.denied_by {
        notes.limit = Some(LimitNote {
            index: plan.stack[denied_by],
            remaining: entries[denied_by].verdict.remaining,
            denied: true,
        });
        let view = admitted.view(snapshot);
        let policy = admitted.policy(plan);
        let (response, lines) =
            ratelimit::deny_response(view, entries, denied_by, policy, route.cost);
        notes.fields = lines;
        return Err(response);
    }
    // Noted now, so the log line has it even if forwarding fails.
    let focus = ratelimit::least_remaining(admitted.view(snapshot), entries);
    notes.limit = focus.map(|i| LimitNote {
        index: plan.stack[i],
        remaining: entries[i].verdict.remaining,
        denied: false,
    });
    admitted.focus = focus;
    admitted.decision.move_permits_into(&mut notes.permits);
    Ok(())
}

/// Why a shared stack did not admit: a denial's response, or an error
/// (the store is down with `on_failure = "deny"`).
enum Refused {
    Response(Response<ResponseBody>),
    Error(GatewayError),
}

/// [`limit_shared`]'s future, boxed: the memory-only path's future stays
/// as small as it was (only a shared stack pays the allocation), and out of
/// line so that none of it is built into [`route_and_act`].
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn shared_step<'a, 's: 'a>(
    store: &'a Arc<RedisStore>,
    snapshot: &'s Snapshot,
    route: &'a RouteConfig,
    plan: &'a RoutePlan,
    now: Nanos,
    metrics: &'a Metrics,
    notes: &'a mut Notes,
    admitted: &'a mut Admitted<'s>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Refused>> + Send + 'a>> {
    Box::pin(limit_shared(
        store, snapshot, route, plan, now, metrics, notes, admitted,
    ))
}

/// A limit's shared numbers for a caller on `plan`, and the plan when it
/// has its own numbers (and so its own state).
fn shared_algorithm<'l>(
    limit: &'l LimitConfig,
    plan: Option<&str>,
) -> (Algorithm, Option<&'l str>) {
    plan.and_then(|p| limit.plans.iter().find(|(name, _)| &**name == p))
        .map_or((limit.algorithm, None), |(name, algorithm)| {
            (*algorithm, Some(&**name))
        })
}

/// The limit step of a stack with shared limits: its `local = true` limits
/// in node memory first (a local denial costs no store call), then the
/// shared ones in one store call, all or nothing together: a shared denial
/// refunds the local charges. When the store is unavailable,
/// `on_failure` decides (see the README's "Distributed limits").
#[allow(clippy::too_many_arguments)]
async fn limit_shared<'s>(
    store: &Arc<RedisStore>,
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    plan: &RoutePlan,
    now: Nanos,
    metrics: &Metrics,
    notes: &mut Notes,
    admitted: &mut Admitted<'s>,
) -> Result<(), Refused> {
    let n = admitted.stack.len();
    let cost = route.cost;
    let entry = |j: usize| StackEntry {
        limiter: admitted.limiters[j],
        key: admitted.keys[j],
        shadow: admitted.stack[j].shadow,
    };
    let is_shared = |j: usize| snapshot.shared[plan.stack[j]];
    let local_at: SmallVec<[usize; INLINE_STACK]> = (0..n).filter(|&j| !is_shared(j)).collect();
    let shared_at: SmallVec<[usize; INLINE_STACK]> = (0..n)
        .filter(|&j| is_shared(j) && admitted.keys[j].is_some())
        .collect();
    let local: SmallVec<[StackEntry<'_>; INLINE_STACK]> =
        local_at.iter().map(|&j| entry(j)).collect();
    let mut local_decision = check_stack(&local, cost, now);
    let mut entries: SmallVec<[EntryVerdict; INLINE_STACK]> = smallvec::smallvec![SKIPPED; n];
    for (&j, verdict) in local_at.iter().zip(&local_decision.entries) {
        entries[j] = *verdict;
    }
    let mut permits = local_decision.take_permits();
    let mut denied_by = local_decision.denied_by.map(|d| local_at[d]);
    if denied_by.is_none() && !shared_at.is_empty() {
        let shared: SmallVec<[SharedEntry<'_>; INLINE_STACK]> = shared_at
            .iter()
            .filter_map(|&j| {
                let limit = admitted.stack[j];
                let (algorithm, plan) = shared_algorithm(limit, admitted.plan);
                Some(SharedEntry {
                    limit: &limit.name,
                    plan,
                    algorithm,
                    align: limit.align,
                    key: admitted.keys[j]?,
                    shadow: limit.shadow,
                    lease: limit.lease.unwrap_or(0),
                })
            })
            .collect();
        // Leased token buckets spend this node's tokens first: no call.
        let mut spent: SmallVec<[usize; INLINE_STACK]> = SmallVec::new();
        for (k, (&j, e)) in shared_at.iter().zip(&shared).enumerate() {
            if e.lease > 0
                && let Some(left) = store.spend_leased(e, cost)
            {
                spent.push(k);
                entries[j] = EntryVerdict {
                    outcome: Outcome::Allowed,
                    verdict: Verdict::allow(left, 0),
                };
            }
        }
        let remote_at: SmallVec<[usize; INLINE_STACK]> =
            (0..shared.len()).filter(|k| !spent.contains(k)).collect();
        let remote: SmallVec<[SharedEntry<'_>; INLINE_STACK]> =
            remote_at.iter().map(|&k| shared[k]).collect();
        let answer = if remote.is_empty() {
            Ok(None)
        } else {
            store.decide(&remote, cost).await.map(Some)
        };
        match answer {
            Ok(None) => admitted.via_store = true,
            Ok(Some(decision)) => {
                admitted.via_store = true;
                let mut all_admitted = true;
                for (&k, verdict) in remote_at.iter().zip(&decision.verdicts) {
                    let (j, e) = (shared_at[k], &shared[k]);
                    if let Some(verdict) = verdict {
                        entries[j] = EntryVerdict {
                            outcome: outcome_of(verdict, e.shadow),
                            verdict: *verdict,
                        };
                        all_admitted &= verdict.allowed || e.shadow;
                    }
                }
                if all_admitted {
                    // A lease took more than the cost: the rest is ours.
                    for (&k, taken) in remote_at.iter().zip(&decision.taken) {
                        if shared[k].lease > 0 && *taken > cost {
                            store.add_lease(&shared[k], taken - cost);
                        }
                    }
                }
                for lease in decision.leases {
                    permits.hold(Box::new(lease));
                }
            }
            Err(Unavailable) => {
                // The fallback decides every shared limit, leased or not.
                for &k in &spent {
                    store.unspend(&shared[k], cost);
                }
                spent.clear();
                match store.on_failure() {
                    OnFailure::Local => {
                        let fallback: SmallVec<[StackEntry<'_>; INLINE_STACK]> =
                            shared_at.iter().map(|&j| entry(j)).collect();
                        let mut decision = check_stack(&fallback, cost, now);
                        for (&j, verdict) in shared_at.iter().zip(&decision.entries) {
                            entries[j] = *verdict;
                        }
                        permits.append(decision.take_permits());
                    }
                    // Not limited by the shared limits (they show as skipped).
                    OnFailure::Allow => {
                        for &j in &shared_at {
                            entries[j] = SKIPPED;
                        }
                    }
                    OnFailure::Deny => {
                        refund_local(admitted, &local_at, &entries, cost, now);
                        return Err(Refused::Error(GatewayError::StoreUnavailable));
                    }
                }
            }
        }
        if (0..n).any(|j| entries[j].outcome == Outcome::Denied) {
            for &k in &spent {
                store.unspend(&shared[k], cost);
            }
        }
        denied_by = (0..n).find(|&j| entries[j].outcome == Outcome::Denied);
        if denied_by.is_some() {
            refund_local(admitted, &local_at, &entries, cost, now);
            permits = Permits::default();
            // As in the memory stack: a limit that would have admitted a
            // request the stack denied was not charged.
            for entry in entries.iter_mut().filter(|e| e.outcome == Outcome::Allowed) {
                entry.outcome = Outcome::DeniedByOther;
            }
        }
    }
    let delay = if denied_by.is_some() {
        0
    } else {
        (0..n)
            .filter(|&j| !admitted.stack[j].shadow)
            .map(|j| entries[j].verdict.delay)
            .max()
            .unwrap_or(0)
    };
    admitted.decision = StackDecision::from_parts(entries, denied_by, delay, permits);
    conclude(metrics, snapshot, route, plan, notes, admitted).map_err(Refused::Response)
}

/// The 400 for a request without the key of `limit` (at `position` in the
/// stack), counted as that limit's denial; the others decided nothing. Out
/// of line: the key loop of every request stays as small as it was.
#[cold]
#[inline(never)]
fn missing_key(
    metrics: &Metrics,
    plan: &RoutePlan,
    position: usize,
    limit: &LimitConfig,
) -> Response<ResponseBody> {
    metrics.record_route_decision(&plan.metrics, position, Outcome::Denied);
    ratelimit::missing_key_response(limit, &crate::summary::key_parts(&limit.key))
}

/// Gives back what the local tier charged when the shared tier refused.
fn refund_local(
    admitted: &Admitted<'_>,
    local_at: &[usize],
    entries: &[EntryVerdict],
    cost: u64,
    now: Nanos,
) {
    let refund = -i64::try_from(cost).unwrap_or(i64::MAX);
    for &j in local_at {
        if let (Some(key), Outcome::Allowed) = (admitted.keys[j], entries[j].outcome) {
            // Concurrency: dropping the permits is the refund.
            admitted.limiters[j].adjust(key, refund, now);
        }
    }
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
        let outcome = match entry.outcome {
            Outcome::Skipped => skipped_outcome(admitted, position),
            outcome => outcome,
        };
        metrics.record_route_decision(&plan.metrics, position, outcome);
        match outcome {
            Outcome::ShadowDenied => shadow_denied(route, limit_label),
            Outcome::Allowed => {
                // Near limit: this request took the key past 80% of its quota.
                let quota = crate::limit::quota(algorithm) as u128;
                let after = entry.verdict.remaining as u128;
                let before = after + route.cost as u128;
                if after * 5 < quota && before * 5 >= quota {
                    near_limit(metrics, route_label, limit_label);
                }
            }
            Outcome::Denied | Outcome::Skipped | Outcome::DeniedByOther => {}
        }
    }
}

/// A skipped limit's outcome: `shadow_denied` where a shadow limit lacked
/// its key under `on_missing_key = "deny"` (it would have answered 400).
#[cold]
#[inline(never)]
fn skipped_outcome(admitted: &Admitted<'_>, position: usize) -> Outcome {
    if shadow_missing_key(admitted.stack[position], admitted.keys[position]) {
        Outcome::ShadowDenied
    } else {
        Outcome::Skipped
    }
}

// The two rare branches of `record_decisions`, out of line: inline, the
// event's and the metric's set-up made every request's frame larger.

#[cold]
#[inline(never)]
fn shadow_denied(route: &RouteConfig, limit_label: &Arc<str>) {
    // Debug, not info: a shadow limit may "deny" every request;
    // `tollgate_ratelimit_decisions_total` counts them all.
    tracing::debug!(route = %route.name, limit = %limit_label, "shadow limit would have denied");
}

#[cold]
#[inline(never)]
fn near_limit(metrics: &Metrics, route_label: &Arc<str>, limit_label: &Arc<str>) {
    metrics.record_near_limit(route_label, limit_label);
}

/// Post-response cost: charges (or refunds) the difference between the
/// upstream's reported cost (`reported`, its cost header's value) and the up-front cost to every limit that charged
/// the request. Never blocks the response; bad values are ignored.
fn settle_cost(
    app: &App,
    snapshot: &Snapshot,
    route_index: usize,
    admitted: &Admitted<'_>,
    reported: Option<&[u8]>,
) {
    let route = &snapshot.config.routes[route_index];
    // Per entry: a shared limit.
    let shared_at: SmallVec<[bool; INLINE_STACK]> =
        route.limits.iter().map(|&i| snapshot.shared[i]).collect();
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
    let mut shared: SmallVec<[SharedEntry<'_>; INLINE_STACK]> = SmallVec::new();
    for (j, ((limiter, key), entry)) in admitted
        .limiters
        .iter()
        .zip(&admitted.keys)
        .zip(&admitted.decision.entries)
        .enumerate()
    {
        // Shadow limits that would have denied were not charged: nothing to settle.
        let (Some(key), Outcome::Allowed) = (key, entry.outcome) else {
            continue;
        };
        let limit = admitted.stack[j];
        if admitted.via_store && shared_at.get(j) == Some(&true) {
            let (algorithm, plan) = shared_algorithm(limit, admitted.plan);
            if !matches!(algorithm, Algorithm::Concurrency { .. }) {
                shared.push(SharedEntry {
                    limit: &limit.name,
                    plan,
                    algorithm,
                    align: limit.align,
                    key: *key,
                    shadow: limit.shadow,
                    lease: 0,
                });
            }
        } else {
            limiter.adjust(*key, delta, now);
        }
    }
    if let (false, Some(store)) = (shared.is_empty(), app.store()) {
        store.settle(&shared, delta);
    }
}

/// Forwards the request upstream and hands back the upstream's response.
///
/// Split in two on purpose: everything before the upstream call is done by
/// [`prepare_forward`], a plain function, so its temporaries (the request's
/// parts in several states) are not kept in this future — which every
/// future above it embeds and copies.
#[allow(clippy::too_many_arguments)]
async fn forward(
    snapshot: &Snapshot,
    route: &RouteConfig,
    downstream: Downstream,
    parts: Parts,
    body: PendingBody,
    permits: &mut Permits,
    interim: Option<&dyn InterimSink>,
    attempt: &mut Attempt,
) -> Result<(Response<ResponseBody>, FieldLines), GatewayError> {
    let Forwarding {
        upstream,
        mut request,
        exceeded,
        client_upgrade,
    } = prepare_forward(snapshot, route, downstream, parts, body)?;
    let (mut response, fields) = upstream
        .send(
            &mut request,
            exceeded,
            route.max_body.unwrap_or(u64::MAX),
            interim,
            attempt,
        )
        .await?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if !upgrade::switched_to_allowed(
            fields.relayed_value("upgrade"),
            &snapshot.config.server.upgrades,
        ) {
            tracing::warn!(upstream = %upstream.config.name, "the upstream switched to a protocol that is not in server.upgrades");
            return Err(GatewayError::UpstreamFailed {
                upstream: upstream.config.name.clone(),
                source: PoolError::Request(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the upstream switched to a protocol that is not in server.upgrades",
                )),
            });
        }
        match (client_upgrade, response.body_mut().take_upgraded()) {
            (Some(client_upgrade), Some(upstream_conn)) => {
                upgrade::spawn_tunnel(client_upgrade, upstream_conn, std::mem::take(permits));
            }
            // A switch nobody asked for cannot be relayed.
            _ => {
                tracing::warn!(upstream = %upstream.config.name, "the upstream switched protocols unasked");
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

/// Request bodies up to this size are read whole on a retrying route, so
/// they can be sent again; larger or unsized ones are sent once.
const MAX_REPLAY_BODY: u64 = 64 * 1024;

/// A route's retries (`retry = {...}`) around [`forward`]: see
/// [`crate::upstream::retry`] for the delays and the budget. A request is
/// retried only when sending it again cannot repeat an action — an
/// idempotent method, or one carrying `Idempotency-Key` — and its body can
/// be sent again (none, or one of known length up to [`MAX_REPLAY_BODY`],
/// read first); never once the client has received a byte (only errors and
/// retried statuses, whose response is dropped unread, are retried); never
/// an upgrade. All attempts together are bounded by the upstream's
/// `timeout` (504). A retry goes to another URL of the list than the tries
/// before it, when there is one. (A connection that could not be opened is
/// not a retry: [`forward`] tries the next URL at once, for any request,
/// outside the budget — `crate::upstream`'s module doc.)
struct Retrying<'s> {
    app: &'s App,
    snapshot: &'s Snapshot,
    route: &'s RouteConfig,
    policy: &'s crate::config::RetryPolicy,
    budget: &'s crate::upstream::retry::RetryBudget,
}

impl Retrying<'_> {
    /// The request sent once, as a route without `retry` sends it: not
    /// retryable (no upstream, not idempotent, an upgrade, a body that
    /// cannot be sent again).
    async fn once(
        &self,
        downstream: Downstream,
        parts: Parts,
        body: PendingBody,
        notes: &mut Notes,
    ) -> Result<(Response<ResponseBody>, FieldLines), GatewayError> {
        forward(
            self.snapshot,
            self.route,
            downstream,
            parts,
            body,
            &mut notes.permits,
            interim_sink(&notes.connection),
            &mut Attempt::default(),
        )
        .await
    }

    async fn forward(
        &self,
        downstream: Downstream,
        parts: Parts,
        body: PendingBody,
        notes: &mut Notes,
    ) -> Result<(Response<ResponseBody>, FieldLines), GatewayError> {
        use crate::upstream::retry;

        let (snapshot, route) = (self.snapshot, self.route);
        self.budget.record_request(self.app.clock.now());
        let Some(upstream) = snapshot.upstream_of(&route.action) else {
            return self.once(downstream, parts, body, notes).await;
        };
        let idempotent = crate::upstream::pool::is_idempotent(&parts.method)
            || parts.headers.contains_key("idempotency-key");
        let upgrade = parts.headers.contains_key(http::header::UPGRADE);
        if !idempotent || upgrade {
            return self.once(downstream, parts, body, notes).await;
        }
        let body = match replayable(body, &parts, &snapshot.config).await? {
            Ok(bytes) => bytes,
            Err(body) => {
                return self.once(downstream, parts, body, notes).await;
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
        let mut parts = Some(parts);
        let mut attempt = 0u32;
        // Where the tries went: a retry goes to another URL if there is one.
        let mut way = Attempt::default();
        loop {
            let this = parts.take().unwrap_or_else(|| {
                let mut request = Request::new(());
                *request.method_mut() = template.0.clone();
                *request.uri_mut() = template.1.clone();
                *request.version_mut() = template.2;
                *request.headers_mut() = template.3.clone();
                request.into_parts().0
            });
            let sent = forward(
                snapshot,
                route,
                downstream,
                this,
                PendingBody::Complete(body.clone()),
                &mut notes.permits,
                interim_sink(&notes.connection),
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
            notes.retries = attempt;
            if let Some(label) = notes.route_index.and_then(|i| upstream_label(snapshot, i)) {
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
            stall: Stall::new(snapshot.config.server.body_read_timeout),
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
                stall: Stall::new(snapshot.config.server.body_read_timeout),
            }
        }
    };
    let mut parts = parts;
    upgrade::allow_only(&mut parts.headers, &snapshot.config.server.upgrades);
    let mut request = upstream.prepare(parts, body, downstream.peer, downstream.proto);
    // hyper hands the client's connection over if we answer 101.
    let client_upgrade = if request.own.upgrade {
        request
            .parts
            .extensions
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
