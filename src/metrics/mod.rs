//! Prometheus metrics of the gateway: one [`Metrics`] per process, shared as
//! an `Arc`, encoded as OpenMetrics text by `prometheus-client` for the admin
//! listener's `GET /metrics`.
//!
//! # Why it lives outside the configuration snapshot
//!
//! `App` (`app.rs`, above this module) owns the `Metrics`, not the
//! `Snapshot`: counters must keep counting across
//! `SIGHUP` reloads (a reload that reset `tollgate_requests_total` would look
//! like a process restart to `rate()`).
//!
//! # Bounded labels
//!
//! Label values come only from the configuration (route, limit and upstream
//! names), from small fixed vocabularies (`outcome`, `kind`, `result`,
//! `backend`) or are numbers (`status`). A request that matched no route is
//! counted under route `"none"`. Keys, paths and client addresses are never
//! labels: they are unbounded and some are secrets.
//!
//! # The hot path
//!
//! Recording a request allocates nothing and takes no lock once its series
//! exist. Names are `Arc<str>` built once per configuration snapshot
//! ([`LabelNames`]). A route's frequent series — its `200` counter, its
//! duration histogram, its decision counters and, on first use, its other
//! common statuses — are resolved once per snapshot into [`RouteHandles`],
//! so a request skips `prometheus-client`'s `Family` (a read lock and a hash
//! of the labels); rarer series go through the family. The duration
//! histogram is our own [`DurationHistogram`]: `prometheus-client`'s takes a
//! mutex per observation, which every worker would share. Both the
//! histogram and the request path's counters ([`WorkerCounter`]:
//! `tollgate_requests_total`, `tollgate_ratelimit_decisions_total`) are
//! kept per worker, so that a request writes no cache line another core
//! writes too; a scrape sums the workers.

use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::config::Config;

mod counter;
mod histogram;
pub(crate) use counter::WorkerCounter;
pub(crate) use histogram::DurationHistogram;
pub(crate) mod refused_keys;

/// The `Content-Type` of [`Metrics::encode`]'s output.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The route label of a request that matched no route.
pub(crate) const NO_ROUTE: &str = "none";

/// Upper bounds of the request-duration buckets, in seconds: 0.5 ms to 10 s,
/// roughly ×2–2.5 apart, so both a local `respond` route and a slow upstream
/// land in a bucket that tells them apart.
/// Buckets of `tollgate_tokens_usage_ratio`: a response's tokens over its
/// reservation (below 1: over-reserved; above: the debt side).
const USAGE_RATIO_BUCKETS: [f64; 10] = [0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0, 4.0];

fn usage_ratio_histogram() -> DurationHistogram {
    // The duration histogram's lock-free buckets, counting ratios (a ratio
    // of r is observed as r seconds; the exposition writes the bounds).
    DurationHistogram::new(&USAGE_RATIO_BUCKETS)
}

pub(crate) const DURATION_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// The `outcome` label: what a limit decided for one request, as the limiter
/// engine reports it.
pub use crate::limit::Outcome;

/// The `outcome` label's text.
pub(crate) fn outcome_label(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Allowed => "allowed",
        Outcome::Denied => "denied",
        Outcome::ShadowDenied => "shadow_denied",
        Outcome::Skipped => "skipped",
        Outcome::DeniedByOther => "denied_by_other",
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&outcome_label(*self), encoder)
    }
}

/// The `front` label: which listener's request a decision was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Front {
    /// A request the proxy listener forwards or answers.
    Proxy,
    /// An Envoy rate-limit service call (gRPC or `/json`).
    Rls,
    /// A forward-auth check (`/auth`).
    Auth,
}

impl Front {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Front::Proxy => "proxy",
            Front::Rls => "rls",
            Front::Auth => "auth",
        }
    }
}

impl EncodeLabelValue for Front {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.label(), encoder)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    route: Arc<str>,
    status: u16,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabels {
    route: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DecisionLabels {
    route: Arc<str>,
    limit: Arc<str>,
    outcome: Outcome,
    front: Front,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLimitLabels {
    route: Arc<str>,
    limit: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UpstreamErrorLabels {
    upstream: Arc<str>,
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RetryLabels {
    upstream: Arc<str>,
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UrlLabels {
    upstream: Arc<str>,
    url: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EjectionLabels {
    upstream: Arc<str>,
    url: Arc<str>,
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HealthCheckLabels {
    upstream: Arc<str>,
    url: Arc<str>,
    result: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BackendLabels {
    backend: &'static str,
}

/// An admin API write (`reset`, an override's `set`/`delete`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// A `[jwt]` issuer (its configured `issuer`, or `none` when the token
/// named no configured one) and an outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct IssuerResultLabels {
    issuer: Arc<str>,
    result: &'static str,
}

/// A token limit of a route, and what happened to tokens there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TokenLabels {
    route: Arc<str>,
    limit: Arc<str>,
    kind: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LimitLabels {
    limit: Arc<str>,
}

/// A request refused at a slot limit: the limit, its priority and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ShedLabels {
    limit: Arc<str>,
    priority: &'static str,
    reason: &'static str,
}

type HistogramFamily<S> = Family<S, DurationHistogram, fn() -> DurationHistogram>;

fn duration_histogram() -> DurationHistogram {
    DurationHistogram::new(&DURATION_BUCKETS)
}

/// A route's most frequent series, pre-resolved ([`Metrics::route_handles`]).
/// Clones of prometheus-client metrics share their values.
#[derive(Debug, Clone)]
pub(crate) struct RouteHandles {
    route: Arc<str>,
    /// The listener these handles count for.
    front: Front,
    /// `tollgate_requests_total{route, status="200"}`.
    ok: WorkerCounter,
    duration: DurationHistogram,
    /// `tollgate_requests_total{route, status}` for the other statuses of
    /// [`COMMON_STATUSES`], resolved on first use (a series exists once it
    /// has counted something, as with an unresolved call).
    statuses: [OnceLock<WorkerCounter>; COMMON_STATUSES.len()],
    /// `tollgate_ratelimit_decisions_total{route, limit, outcome, front}` per entry
    /// of the route's stack: `allowed` resolved up front, the other outcomes
    /// on first use.
    decisions: Vec<DecisionHandles>,
}

impl RouteHandles {
    /// `tollgate_request_duration_seconds{route}`.
    pub(crate) fn duration(&self) -> &DurationHistogram {
        &self.duration
    }
}

/// Statuses besides 200 that a route answers often enough to be worth a
/// pre-resolved counter: the gateway's own answers and common upstream ones.
const COMMON_STATUSES: [u16; 12] = [201, 204, 304, 400, 401, 403, 404, 429, 500, 502, 503, 504];

/// The decision counters of one stack entry, indexed by [`Outcome`].
#[derive(Debug, Clone)]
struct DecisionHandles {
    limit: Arc<str>,
    by_outcome: [OnceLock<WorkerCounter>; 5],
}

fn outcome_index(outcome: Outcome) -> usize {
    match outcome {
        Outcome::Allowed => 0,
        Outcome::Denied => 1,
        Outcome::ShadowDenied => 2,
        Outcome::Skipped => 3,
        Outcome::DeniedByOther => 4,
    }
}

/// The process's metrics. Every method takes `&self` and is safe to call from
/// any task; see the module doc for the cost of a call.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, WorkerCounter>,
    request_duration: HistogramFamily<RouteLabels>,
    decisions: Family<DecisionLabels, WorkerCounter>,
    near_limit: Family<RouteLimitLabels, Counter>,
    upstream_errors: Family<UpstreamErrorLabels, Counter>,
    upstream_retries: Family<RetryLabels, Counter>,
    store_errors: Family<BackendLabels, Counter>,
    store_fallback_active: Gauge,
    overrides_stale: Gauge,
    store_remembered_denials: Counter,
    trace_spans_dropped: Counter,
    config_reloads: Family<ResultLabels, Counter>,
    config_generation: Gauge,
    admin_writes: Family<ActionLabels, Counter>,
    limiter_keys: Family<LimitLabels, Gauge>,
    adaptive_limit: Family<LimitLabels, Gauge>,
    inflight: Family<LimitLabels, Gauge>,
    tls_handshake_failures: Family<ReasonLabels, Counter>,
    http2_connection_errors: Family<ReasonLabels, Counter>,
    connections_evicted: Counter,
    rls_unknown_domains: Counter,
    jwt_verifications: Family<IssuerResultLabels, Counter>,
    jwks_refreshes: Family<IssuerResultLabels, Counter>,
    tokens: Family<TokenLabels, Counter>,
    token_usage_ratio: HistogramFamily<RouteLabels>,
    shed: Family<ShedLabels, Counter>,
    queue_depth: Family<LimitLabels, Gauge>,
    /// `tollgate_queue_wait_seconds{limit}`: how long admitted requests
    /// waited before they were forwarded (a `wait` hold, a queue).
    queue_wait: HistogramFamily<LimitLabels>,
    /// The shared `"none"` route label.
    no_route: Arc<str>,
    upstream_health: UpstreamHealthFamilies,
    /// The keys refused most, for `/stats` (not an exposition series:
    /// keys are unbounded).
    refused_keys: refused_keys::RefusedKeys,
    /// `tollgate_usage_events_total{result}` and
    /// `tollgate_usage_spool_events` (the usage exporter).
    usage: UsageMetrics,
}

/// The usage exporter's series, as handles it keeps.
#[derive(Debug, Clone, Default)]
pub(crate) struct UsageMetrics {
    /// Acknowledged by the collector (2xx), or written to the file.
    pub(crate) sent: Counter,
    /// In a POST that failed and will be tried again (so an event may be
    /// counted more than once).
    pub(crate) failed: Counter,
    /// Lost: the exporter's queue full, the spool past `spool_max`
    /// (oldest first), or the disk refusing a write.
    pub(crate) dropped: Counter,
    /// In a batch the collector refused with a 4xx, set aside in the
    /// spool's dead-letter file.
    pub(crate) dead_letter: Counter,
    /// Events in the spool the collector has not acknowledged.
    pub(crate) spool_events: Gauge,
}

/// The families of upstream health, per URL.
#[derive(Debug, Default)]
struct UpstreamHealthFamilies {
    healthy: Family<UrlLabels, Gauge>,
    ejections: Family<EjectionLabels, Counter>,
    checks: Family<HealthCheckLabels, Counter>,
}

impl UpstreamHealthFamilies {
    fn register(registry: &mut Registry) -> UpstreamHealthFamilies {
        let families = UpstreamHealthFamilies::default();
        registry.register(
            "tollgate_upstream_healthy",
            "1 while an upstream URL takes requests, 0 while it is ejected or down by its health checks",
            families.healthy.clone(),
        );
        registry.register(
            "tollgate_upstream_ejections",
            "Upstream URLs taken out of service, by reason (connect, reset, timeout, the status, or health_check)",
            families.ejections.clone(),
        );
        registry.register(
            "tollgate_upstream_health_checks",
            "Active health checks of upstream URLs, by result (pass, fail_status, fail_connect, fail_timeout)",
            families.checks.clone(),
        );
        families
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric of the contract. The generation gauge starts at
    /// 1 and both `config_reloads_total` series at 0, so dashboards and alerts
    /// see them before the first reload.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, WorkerCounter>::default();
        registry.register(
            "tollgate_requests",
            "Requests answered, by route and response status",
            requests.clone(),
        );
        let request_duration =
            HistogramFamily::<RouteLabels>::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "tollgate_request_duration",
            "Gateway-side time from request head to response head, by route",
            Unit::Seconds,
            request_duration.clone(),
        );
        let decisions = Family::<DecisionLabels, WorkerCounter>::default();
        registry.register(
            "tollgate_ratelimit_decisions",
            "Rate-limit decisions per limit of a route's stack, by outcome",
            decisions.clone(),
        );
        let near_limit = Family::<RouteLimitLabels, Counter>::default();
        registry.register(
            "tollgate_ratelimit_near_limit",
            "Admitted requests that took a key past 80% of a limit's quota",
            near_limit.clone(),
        );
        let upstream_errors = Family::<UpstreamErrorLabels, Counter>::default();
        registry.register(
            "tollgate_upstream_errors",
            "Upstream failures (connect, reset, timeout), by upstream",
            upstream_errors.clone(),
        );
        let upstream_retries = Family::<RetryLabels, Counter>::default();
        registry.register(
            "tollgate_upstream_retries",
            "Upstream retries, by upstream and reason (connect or the status retried)",
            upstream_retries.clone(),
        );
        let store_errors = Family::<BackendLabels, Counter>::default();
        registry.register(
            "tollgate_store_errors",
            "Failed limiter-store calls, by backend",
            store_errors.clone(),
        );
        let store_fallback_active = Gauge::default();
        registry.register(
            "tollgate_store_fallback_active",
            "1 while the store is unavailable and on_failure applies, else 0",
            store_fallback_active.clone(),
        );
        let overrides_stale = Gauge::default();
        registry.register(
            "tollgate_overrides_stale",
            "1 while a Redis fleet's per-key overrides cannot be read and this node keeps the last ones seen, else 0",
            overrides_stale.clone(),
        );
        let store_remembered_denials = Counter::default();
        registry.register(
            "tollgate_store_remembered_denials",
            "Denials of shared limits answered from the node's memory of a recent Redis denial, without a call (store.remember_denials)",
            store_remembered_denials.clone(),
        );
        let trace_spans_dropped = Counter::default();
        registry.register(
            "tollgate_trace_spans_dropped",
            "Spans of sampled requests that never reached the OTLP collector: the export queue was full, or the collector did not take their batch ([tracing])",
            trace_spans_dropped.clone(),
        );
        let config_reloads = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tollgate_config_reloads",
            "Configuration reloads, by result (ok, error)",
            config_reloads.clone(),
        );
        let config_generation = Gauge::default();
        registry.register(
            "tollgate_config_generation",
            "Generation of the configuration serving (1 at start, +1 per successful reload)",
            config_generation.clone(),
        );
        let admin_writes = Family::<ActionLabels, Counter>::default();
        registry.register(
            "tollgate_admin_writes",
            "Admin API writes accepted, by action (see the tollgate::audit log)",
            admin_writes.clone(),
        );
        let limiter_keys = Family::<LimitLabels, Gauge>::default();
        registry.register(
            "tollgate_limiter_keys",
            "Live keys held in memory, by limit",
            limiter_keys.clone(),
        );
        let adaptive_limit = Family::<LimitLabels, Gauge>::default();
        registry.register(
            "tollgate_adaptive_limit",
            "An adaptive limit's current limit (summed over its keys), by limit",
            adaptive_limit.clone(),
        );
        let inflight = Family::<LimitLabels, Gauge>::default();
        registry.register(
            "tollgate_inflight",
            "Requests in flight at a concurrency or adaptive limit (over its keys), by limit",
            inflight.clone(),
        );
        let tls_handshake_failures = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "tollgate_tls_handshake_failures",
            "TLS handshakes that failed (error) or did not finish within header_read_timeout (timeout)",
            tls_handshake_failures.clone(),
        );
        let http2_connection_errors = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "tollgate_http2_connection_errors",
            "HTTP/2 client connections the gateway closed with a GOAWAY error code, by code (enhance_your_calm: the rapid-reset bound; protocol_error, frame_size_error, ...)",
            http2_connection_errors.clone(),
        );
        let rls_unknown_domains = Counter::default();
        registry.register(
            "tollgate_rls_unknown_domain",
            "Envoy rate-limit calls for a domain no [[decision.descriptors]] rule names (answered OK)",
            rls_unknown_domains.clone(),
        );
        let jwt_verifications = Family::<IssuerResultLabels, Counter>::default();
        registry.register(
            "tollgate_jwt_verifications",
            "Bearer tokens verified (a cached token is not verified again), by issuer (`none`: the token named no configured issuer) and result (valid, malformed, expired, not_yet_valid, wrong_issuer, wrong_audience, unknown_key, bad_signature)",
            jwt_verifications.clone(),
        );
        let jwks_refreshes = Family::<IssuerResultLabels, Counter>::default();
        registry.register(
            "tollgate_jwks_refreshes",
            "Fetches of an issuer's jwks_url, by issuer and result (ok; error: unreachable, a bad status or a bad document, the last keys kept)",
            jwks_refreshes.clone(),
        );
        let tokens = Family::<TokenLabels, Counter>::default();
        registry.register(
            "tollgate_tokens",
            "LLM tokens on token limits (unit = \"tokens\"), by route, limit and kind: reserved at admission; refunded (the response used fewer) or charged (more) when it ends; unsettled (no usage by its end: the reservation stands)",
            tokens.clone(),
        );
        let token_usage_ratio =
            HistogramFamily::<RouteLabels>::new_with_constructor(usage_ratio_histogram);
        registry.register(
            "tollgate_tokens_usage_ratio",
            "A token route's settled responses by the tokens they used over the tokens they reserved (the reservation's estimate error: 1 is exact)",
            token_usage_ratio.clone(),
        );
        let queue_wait = HistogramFamily::<LimitLabels>::new_with_constructor(duration_histogram);
        registry.register_with_unit(
            "tollgate_queue_wait",
            "Admitted requests that waited before being forwarded (a token bucket's wait, a leaky bucket's delay, a queue), by the limit they waited for, and how long",
            Unit::Seconds,
            queue_wait.clone(),
        );
        let connections_evicted = Counter::default();
        registry.register(
            "tollgate_connections_evicted",
            "Idle keep-alive connections closed, oldest idle first, to serve a new one at max_connections",
            connections_evicted.clone(),
        );
        let shed = Family::<ShedLabels, Counter>::default();
        registry.register(
            "tollgate_shed",
            "Requests refused at a slot limit, by limit, priority and reason (full: no slot, or only the reserve for a sheddable one, and no queue; queue_full; wait_too_long: the recent pace of released slots says the wait would pass max_wait; timeout: waited max_wait)",
            shed.clone(),
        );
        let queue_depth = Family::<LimitLabels, Gauge>::default();
        registry.register(
            "tollgate_queue_depth",
            "Requests waiting for a slot of a limit with a queue",
            queue_depth.clone(),
        );
        let upstream_health = UpstreamHealthFamilies::register(&mut registry);
        let usage_events = Family::<ResultLabels, Counter>::default();
        registry.register(
            "tollgate_usage_events",
            "Usage events by result: sent (acknowledged by the collector, or written to the file), failed (in a POST that will be retried), dropped (queue full, spool past spool_max, disk error), dead_letter (in a batch the collector refused with a 4xx)",
            usage_events.clone(),
        );
        // One series at a time: `get_or_create` returns a read guard, and
        // the next one's insert would wait for it.
        let usage_result = |result: &'static str| -> Counter {
            let counter = usage_events.get_or_create(&ResultLabels { result });
            counter.clone()
        };
        let usage = UsageMetrics {
            sent: usage_result("sent"),
            failed: usage_result("failed"),
            dropped: usage_result("dropped"),
            dead_letter: usage_result("dead_letter"),
            spool_events: Gauge::default(),
        };
        registry.register(
            "tollgate_usage_spool_events",
            "Usage events in the spool that the collector has not acknowledged",
            usage.spool_events.clone(),
        );
        for result in ["ok", "error"] {
            let _ = config_reloads.get_or_create(&ResultLabels { result });
        }
        config_generation.set(1);
        Metrics {
            registry,
            requests,
            request_duration,
            decisions,
            near_limit,
            upstream_errors,
            upstream_retries,
            store_errors,
            store_fallback_active,
            overrides_stale,
            store_remembered_denials,
            trace_spans_dropped,
            config_reloads,
            config_generation,
            admin_writes,
            limiter_keys,
            adaptive_limit,
            inflight,
            tls_handshake_failures,
            http2_connection_errors,
            connections_evicted,
            rls_unknown_domains,
            jwt_verifications,
            jwks_refreshes,
            tokens,
            token_usage_ratio,
            shed,
            queue_depth,
            queue_wait,
            no_route: Arc::from(NO_ROUTE),
            upstream_health,
            refused_keys: refused_keys::RefusedKeys::default(),
            usage,
        }
    }

    /// The route label for a request that matched no route.
    pub fn no_route(&self) -> &Arc<str> {
        &self.no_route
    }

    /// One answered request: `tollgate_requests_total` and the duration histogram.
    pub fn record_request(&self, route: &Arc<str>, status: u16, elapsed: Duration) {
        self.count_request(route, status);
        self.request_duration
            .get_or_create(&RouteLabels {
                route: route.clone(),
            })
            .observe(elapsed);
    }

    /// A request the HTTP/1.1 codec refused before it reached the pipeline
    /// (no route, no duration measured): `tollgate_requests_total` only,
    /// with `route="none"`.
    pub(crate) fn record_refused(&self, status: u16) {
        self.count_request(&self.no_route, status);
    }

    /// `tollgate_requests_total{route,status}` one up.
    fn count_request(&self, route: &Arc<str>, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                route: route.clone(),
                status,
            })
            .inc();
    }

    /// Handles for a route's common series, resolved once per configuration
    /// snapshot so the request path skips the family lookup (a lock and a
    /// hash of the labels) for them.
    pub(crate) fn route_handles(
        &self,
        route: &Arc<str>,
        limits: &[Arc<str>],
        front: Front,
    ) -> RouteHandles {
        let ok = self
            .requests
            .get_or_create(&RequestLabels {
                route: route.clone(),
                status: 200,
            })
            .clone();
        let duration = self
            .request_duration
            .get_or_create(&RouteLabels {
                route: route.clone(),
            })
            .clone();
        let decisions = limits
            .iter()
            .map(|limit| {
                let handles = DecisionHandles {
                    limit: limit.clone(),
                    by_outcome: Default::default(),
                };
                let allowed = self.decision_counter(route, limit, Outcome::Allowed, front);
                let _ = handles.by_outcome[outcome_index(Outcome::Allowed)].set(allowed);
                handles
            })
            .collect();
        RouteHandles {
            route: route.clone(),
            front,
            ok,
            duration,
            statuses: Default::default(),
            decisions,
        }
    }

    fn decision_counter(
        &self,
        route: &Arc<str>,
        limit: &Arc<str>,
        outcome: Outcome,
        front: Front,
    ) -> WorkerCounter {
        self.decisions
            .get_or_create(&DecisionLabels {
                route: route.clone(),
                limit: limit.clone(),
                outcome,
                front,
            })
            .clone()
    }

    /// [`Metrics::record_decision`] for the `position`-th limit of a route's
    /// stack, through its handles.
    pub(crate) fn record_route_decision(
        &self,
        handles: &RouteHandles,
        position: usize,
        outcome: Outcome,
    ) {
        let Some(entry) = handles.decisions.get(position) else {
            debug_assert!(false, "no handles for stack position {position}");
            return;
        };
        entry.by_outcome[outcome_index(outcome)]
            .get_or_init(|| {
                self.decision_counter(&handles.route, &entry.limit, outcome, handles.front)
            })
            .inc();
    }

    /// [`Metrics::record_request`] through a route's handles.
    pub(crate) fn record_route_request(
        &self,
        handles: &RouteHandles,
        status: u16,
        elapsed: Duration,
    ) {
        self.count_route_request(handles, status);
        handles.duration.observe(elapsed);
    }

    /// A routed request's count alone: its duration is observed later, when
    /// its body ends ([`RouteHandles::duration`]).
    #[inline]
    pub(crate) fn count_route_request(&self, handles: &RouteHandles, status: u16) {
        if status == 200 {
            handles.ok.inc();
        } else if let Some(index) = COMMON_STATUSES.iter().position(|&common| common == status) {
            handles.statuses[index]
                .get_or_init(|| {
                    self.requests
                        .get_or_create(&RequestLabels {
                            route: handles.route.clone(),
                            status,
                        })
                        .clone()
                })
                .inc();
        } else {
            self.count_request(&handles.route, status);
        }
    }

    /// One limit's decision for one request of the proxy listener.
    pub fn record_decision(&self, route: &Arc<str>, limit: &Arc<str>, outcome: Outcome) {
        self.decisions
            .get_or_create(&DecisionLabels {
                route: route.clone(),
                limit: limit.clone(),
                outcome,
                front: Front::Proxy,
            })
            .inc();
    }

    /// A key passed 80% of a limit's quota on an admitted request.
    pub fn record_near_limit(&self, route: &Arc<str>, limit: &Arc<str>) {
        self.near_limit
            .get_or_create(&RouteLimitLabels {
                route: route.clone(),
                limit: limit.clone(),
            })
            .inc();
    }

    /// An upstream failure; `kind` is the pipeline's
    /// `GatewayError::upstream_kind` (`connect`, `reset`, `timeout`).
    pub fn record_upstream_error(&self, upstream: &Arc<str>, kind: &'static str) {
        self.upstream_errors
            .get_or_create(&UpstreamErrorLabels {
                upstream: upstream.clone(),
                kind,
            })
            .inc();
    }

    /// One retry of a request to `upstream`; `reason` is `"connect"` or the
    /// status retried (`"503"`).
    pub(crate) fn record_upstream_retry(&self, upstream: &Arc<str>, reason: &'static str) {
        self.upstream_retries
            .get_or_create(&RetryLabels {
                upstream: upstream.clone(),
                reason,
            })
            .inc();
    }

    /// The counter of upstream retries for `reason`, as a handle for code
    /// that counts without the metrics at hand (a request its URL answered
    /// nothing, sent once more). Registers the series at 0.
    pub(crate) fn upstream_retry_counter(
        &self,
        upstream: &Arc<str>,
        reason: &'static str,
    ) -> Counter {
        self.upstream_retries
            .get_or_create(&RetryLabels {
                upstream: upstream.clone(),
                reason,
            })
            .clone()
    }

    /// The counter of upstream failures of one `kind`, as a handle for code
    /// that counts without the metrics at hand (a response body failing
    /// after its head was relayed). Registers the series at 0.
    pub(crate) fn upstream_error_counter(
        &self,
        upstream: &Arc<str>,
        kind: &'static str,
    ) -> Counter {
        self.upstream_errors
            .get_or_create(&UpstreamErrorLabels {
                upstream: upstream.clone(),
                kind,
            })
            .clone()
    }

    /// A failed store call; `backend` is `"memory"` or `"redis"`.
    pub(crate) fn record_store_error(&self, backend: &'static str) {
        self.store_errors
            .get_or_create(&BackendLabels { backend })
            .inc();
    }

    /// Exports `tollgate_store_errors_total{backend}` at 0 before the first
    /// error, so a dashboard's `rate()` has a series from the first scrape.
    pub(crate) fn expose_store_errors(&self, backend: &'static str) {
        drop(self.store_errors.get_or_create(&BackendLabels { backend }));
    }

    /// Whether the store fallback (`on_failure`) is in force.
    pub(crate) fn set_store_fallback(&self, active: bool) {
        self.store_fallback_active.set(i64::from(active));
    }

    /// Whether the per-key overrides are stale (`app::override_sync`).
    pub(crate) fn set_overrides_stale(&self, stale: bool) {
        self.overrides_stale.set(i64::from(stale));
    }

    /// The usage exporter's series.
    pub(crate) fn usage(&self) -> &UsageMetrics {
        &self.usage
    }

    /// A denial answered from a remembered Redis denial
    /// (`store.remember_denials`).
    pub(crate) fn record_remembered_denial(&self) {
        self.store_remembered_denials.inc();
    }

    /// The counter of trace spans dropped, for the exporter (`trace::export`).
    pub(crate) fn trace_spans_dropped_counter(&self) -> Counter {
        self.trace_spans_dropped.clone()
    }

    /// A configuration reload attempt and its result.
    pub(crate) fn record_reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.config_reloads
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// An accepted admin write (`tollgate_admin_writes_total{action}`).
    pub(crate) fn record_admin_write(&self, action: &'static str) {
        self.admin_writes
            .get_or_create(&ActionLabels { action })
            .inc();
    }

    /// A TLS handshake that failed (`"error"`) or stalled (`"timeout"`).
    pub(crate) fn record_tls_handshake_failure(&self, reason: &'static str) {
        self.tls_handshake_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// An HTTP/2 client connection closed with a GOAWAY carrying the error
    /// code `reason` (lower case, as RFC 9113 names it).
    pub(crate) fn record_http2_connection_error(&self, reason: &'static str) {
        self.http2_connection_errors
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// An idle connection closed to make room at `max_connections`.
    pub(crate) fn record_connection_evicted(&self) {
        self.connections_evicted.inc();
    }

    /// A bearer token verified (not from the cache), with its result.
    pub(crate) fn record_jwt_verification(&self, issuer: &Arc<str>, result: &'static str) {
        self.jwt_verifications
            .get_or_create(&IssuerResultLabels {
                issuer: issuer.clone(),
                result,
            })
            .inc();
    }

    /// `n` tokens of `kind` (`reserved`, `refunded`, `charged`,
    /// `unsettled`) on a route's token limit.
    pub(crate) fn record_tokens(
        &self,
        route: &Arc<str>,
        limit: &Arc<str>,
        kind: &'static str,
        n: u64,
    ) {
        self.tokens
            .get_or_create(&TokenLabels {
                route: route.clone(),
                limit: limit.clone(),
                kind,
            })
            .inc_by(n);
    }

    /// A token route's response used `used` of its `reserved` tokens.
    pub(crate) fn record_usage_ratio(&self, route: &Arc<str>, used: u64, reserved: u64) {
        let ratio = used as f64 / reserved.max(1) as f64;
        self.token_usage_ratio
            .get_or_create(&RouteLabels {
                route: route.clone(),
            })
            .observe(Duration::from_secs_f64(ratio.min(1e9)));
    }

    /// An admitted request waited `waited` for `limit` before it was
    /// forwarded (`tollgate_queue_wait_seconds`). Only requests that waited
    /// are observed: the histogram is of waits, not of every request.
    pub(crate) fn record_queue_wait(&self, limit: &Arc<str>, waited: Duration) {
        self.queue_wait
            .get_or_create(&LimitLabels {
                limit: limit.clone(),
            })
            .observe(waited);
    }

    /// A fetch of an issuer's `jwks_url`, `ok` or `error`.
    pub(crate) fn record_jwks_refresh(&self, issuer: &Arc<str>, result: &'static str) {
        self.jwks_refreshes
            .get_or_create(&IssuerResultLabels {
                issuer: issuer.clone(),
                result,
            })
            .inc();
    }

    /// An Envoy rate-limit call for a domain no rule names.
    pub(crate) fn record_rls_unknown_domain(&self) {
        self.rls_unknown_domains.inc();
    }

    /// The generation of the configuration now serving.
    pub(crate) fn set_generation(&self, generation: u64) {
        self.config_generation
            .set(i64::try_from(generation).unwrap_or(i64::MAX));
    }

    /// Live keys a limit holds in memory.
    pub fn set_limiter_keys(&self, limit: &Arc<str>, keys: u64) {
        self.limiter_keys
            .get_or_create(&LimitLabels {
                limit: limit.clone(),
            })
            .set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    /// `tollgate_adaptive_limit{limit}`: an adaptive limit's current limit,
    /// summed over its keys.
    pub(crate) fn set_adaptive_limit(&self, limit: &Arc<str>, sum: u64) {
        self.adaptive_limit
            .get_or_create(&LimitLabels {
                limit: limit.clone(),
            })
            .set(i64::try_from(sum).unwrap_or(i64::MAX));
    }

    /// `tollgate_inflight{limit}`: requests in flight at a concurrency or
    /// adaptive limit.
    pub(crate) fn set_inflight(&self, limit: &Arc<str>, in_flight: u64) {
        self.inflight
            .get_or_create(&LimitLabels {
                limit: limit.clone(),
            })
            .set(i64::try_from(in_flight).unwrap_or(i64::MAX));
    }

    /// One request refused at a slot limit (`tollgate_shed_total`).
    pub(crate) fn record_shed(
        &self,
        limit: &Arc<str>,
        priority: &'static str,
        reason: &'static str,
    ) {
        self.shed
            .get_or_create(&ShedLabels {
                limit: limit.clone(),
                priority,
                reason,
            })
            .inc();
    }

    /// Requests waiting for a limit's slots now (`tollgate_queue_depth`).
    pub(crate) fn set_queue_depth(&self, limit: &Arc<str>, depth: u64) {
        self.queue_depth
            .get_or_create(&LimitLabels {
                limit: limit.clone(),
            })
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
    }

    /// `tollgate_upstream_healthy{upstream,url}`, as a handle the URL's
    /// health sets on each transition.
    pub(crate) fn upstream_healthy_gauge(&self, upstream: &Arc<str>, url: &Arc<str>) -> Gauge {
        self.upstream_health
            .healthy
            .get_or_create(&UrlLabels {
                upstream: upstream.clone(),
                url: url.clone(),
            })
            .clone()
    }

    /// An upstream URL taken out of service; `reason` is what did it
    /// (`connect`, `reset`, `timeout`, a status, `health_check`).
    pub(crate) fn record_upstream_ejection(
        &self,
        upstream: &Arc<str>,
        url: &Arc<str>,
        reason: &'static str,
    ) {
        self.upstream_health
            .ejections
            .get_or_create(&EjectionLabels {
                upstream: upstream.clone(),
                url: url.clone(),
                reason,
            })
            .inc();
    }

    /// One active health check of an upstream URL, by `result`.
    pub(crate) fn record_upstream_health_check(
        &self,
        upstream: &Arc<str>,
        url: &Arc<str>,
        result: &'static str,
    ) {
        self.upstream_health
            .checks
            .get_or_create(&HealthCheckLabels {
                upstream: upstream.clone(),
                url: url.clone(),
                result,
            })
            .inc();
    }

    /// A URL a reload removed: its `tollgate_upstream_healthy` series goes
    /// (its counters stay, as counters do).
    pub(crate) fn retire_upstream_url(&self, upstream: &str, url: &str) {
        self.upstream_health.healthy.remove(&UrlLabels {
            upstream: Arc::from(upstream),
            url: Arc::from(url),
        });
    }

    /// The keys refused most ([`refused_keys`]), recorded on the deny path.
    pub(crate) fn refused_keys(&self) -> &refused_keys::RefusedKeys {
        &self.refused_keys
    }

    /// The OpenMetrics text exposition of every metric, ending in `# EOF`.
    pub fn encode(&self) -> String {
        let mut text = String::with_capacity(4096);
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            // Writing to a String cannot fail; a broken encoder must not take
            // the admin listener down, so answer an empty but valid exposition.
            debug_assert!(false, "encoding metrics failed: {error}");
            text.clear();
            let _ = writeln!(text, "# EOF");
        }
        text
    }
}

/// The label values of one configuration, as shared `Arc<str>`s, built once
/// per snapshot so the request path clones a pointer instead of a `String`.
/// Indexes match [`Config::routes`], [`Config::limits`] and [`Config::upstreams`].
#[derive(Debug, Clone, Default)]
pub(crate) struct LabelNames {
    pub(crate) routes: Vec<Arc<str>>,
    pub(crate) limits: Vec<Arc<str>>,
    pub(crate) upstreams: Vec<Arc<str>>,
}

impl LabelNames {
    pub(crate) fn new(config: &Config) -> LabelNames {
        LabelNames {
            routes: config.routes.iter().map(|r| Arc::from(&*r.name)).collect(),
            limits: config.limits.iter().map(|l| Arc::from(&*l.name)).collect(),
            upstreams: config
                .upstreams
                .iter()
                .map(|u| Arc::from(&*u.name))
                .collect(),
        }
    }
}

// The integration tests' parser, shared: its `pub` items are for them.
#[cfg(test)]
#[path = "../../tests/common/openmetrics.rs"]
#[allow(unreachable_pub)]
mod openmetrics;

/// The text exposition of a registry that `register` fills: the per-worker
/// counter's and histogram's tests hold theirs to prometheus-client's own.
#[cfg(test)]
fn exposition(register: impl FnOnce(&mut prometheus_client::registry::Registry)) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    register(&mut registry);
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
    out
}

#[cfg(test)]
mod tests {
    use super::openmetrics::parse;
    use super::*;

    fn name(text: &str) -> Arc<str> {
        Arc::from(text)
    }

    #[test]
    fn fresh_exposition_parses_and_has_the_startup_series() {
        let metrics = Metrics::new();
        let text = metrics.encode();
        let exposition = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(
            exposition.value("tollgate_config_generation", &[]),
            Some(1.0)
        );
        assert_eq!(
            exposition.value("tollgate_config_reloads_total", &[("result", "ok")]),
            Some(0.0)
        );
        assert_eq!(
            exposition.value("tollgate_config_reloads_total", &[("result", "error")]),
            Some(0.0)
        );
        assert_eq!(
            exposition.value("tollgate_store_fallback_active", &[]),
            Some(0.0)
        );
        // prometheus-client leaves out families without series until one is recorded.
        for family in [
            "tollgate_store_fallback_active",
            "tollgate_config_reloads",
            "tollgate_config_generation",
        ] {
            assert!(
                exposition.family(family).is_some(),
                "{family} missing:\n{text}"
            );
        }
    }

    #[test]
    fn every_metric_of_the_contract_encodes_with_its_labels() {
        let metrics = Metrics::new();
        let (api, per_ip, up) = (name("api"), name("per_ip"), name("backend"));
        metrics.record_request(&api, 200, Duration::from_millis(3));
        metrics.record_request(&api, 200, Duration::from_millis(30));
        metrics.record_request(&api, 429, Duration::from_micros(100));
        metrics.record_request(metrics.no_route(), 404, Duration::from_micros(50));
        metrics.record_decision(&api, &per_ip, Outcome::Allowed);
        metrics.record_decision(&api, &per_ip, Outcome::Denied);
        metrics.record_decision(&api, &per_ip, Outcome::ShadowDenied);
        metrics.record_decision(&api, &per_ip, Outcome::Skipped);
        metrics.record_near_limit(&api, &per_ip);
        metrics.record_upstream_error(&up, "timeout");
        metrics.record_store_error("memory");
        metrics.set_store_fallback(true);
        metrics.record_reload(false);
        metrics.record_reload(true);
        metrics.set_generation(2);
        metrics.set_limiter_keys(&per_ip, 42);
        let text = metrics.encode();
        let e = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let v = |n: &str, l: &[(&str, &str)]| e.value(n, l);
        assert_eq!(
            v(
                "tollgate_requests_total",
                &[("route", "api"), ("status", "200")]
            ),
            Some(2.0)
        );
        assert_eq!(
            v(
                "tollgate_requests_total",
                &[("route", "none"), ("status", "404")]
            ),
            Some(1.0)
        );
        assert_eq!(
            v(
                "tollgate_request_duration_seconds_count",
                &[("route", "api")]
            ),
            Some(3.0)
        );
        assert_eq!(
            v(
                "tollgate_request_duration_seconds_bucket",
                &[("route", "api"), ("le", "0.005")]
            ),
            Some(2.0)
        );
        for outcome in ["allowed", "denied", "shadow_denied", "skipped"] {
            assert_eq!(
                v(
                    "tollgate_ratelimit_decisions_total",
                    &[
                        ("route", "api"),
                        ("limit", "per_ip"),
                        ("outcome", outcome),
                        ("front", "proxy")
                    ]
                ),
                Some(1.0),
                "{outcome}"
            );
        }
        assert_eq!(
            v(
                "tollgate_ratelimit_near_limit_total",
                &[("route", "api"), ("limit", "per_ip")]
            ),
            Some(1.0)
        );
        assert_eq!(
            v(
                "tollgate_upstream_errors_total",
                &[("upstream", "backend"), ("kind", "timeout")]
            ),
            Some(1.0)
        );
        assert_eq!(
            v("tollgate_store_errors_total", &[("backend", "memory")]),
            Some(1.0)
        );
        assert_eq!(v("tollgate_store_fallback_active", &[]), Some(1.0));
        assert_eq!(
            v("tollgate_config_reloads_total", &[("result", "error")]),
            Some(1.0)
        );
        assert_eq!(v("tollgate_config_generation", &[]), Some(2.0));
        assert_eq!(
            v("tollgate_limiter_keys", &[("limit", "per_ip")]),
            Some(42.0)
        );
    }

    #[test]
    fn label_values_with_quotes_are_escaped() {
        let metrics = Metrics::new();
        metrics.record_request(&name("we\"ird\\route"), 200, Duration::ZERO);
        let text = metrics.encode();
        let e = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(
            e.value(
                "tollgate_requests_total",
                &[("route", "we\"ird\\route"), ("status", "200")]
            ),
            Some(1.0)
        );
    }

    #[test]
    fn the_parser_rejects_malformed_expositions() {
        let good = "# TYPE a counter\na_total 1\n# EOF\n";
        assert!(parse(good).is_ok());
        for bad in [
            "# TYPE a counter\na_total 1\n",                         // no EOF
            "# TYPE a counter\na_total{x=\"1} 1\n# EOF\n",           // open quote
            "# TYPE a counter\na_total one\n# EOF\n",                // bad value
            "# TYPE a counter\nb_total 1\n# EOF\n",                  // sample of another family
            "# TYPE a counter\na_total -1\n# EOF\n",                 // negative counter
            "# TYPE a counter\na_total{x=\"1\",x=\"2\"} 1\n# EOF\n", // duplicate label
            "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_count 1\nh_sum 1\n# EOF\n",
            "# TYPE a counter\na_total 1\n# EOF\nextra\n",
        ] {
            assert!(parse(bad).is_err(), "accepted:\n{bad}");
        }
    }

    #[test]
    fn label_names_follow_config_order() {
        let text = "[upstreams.u]\nurl = \"http://127.0.0.1:1\"\n[limits.l]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\n[[routes]]\nname = \"r\"\nmatch = { path = \"/\" }\nupstream = \"u\"\nlimits = [\"l\"]\n";
        let config = Config::from_bytes(std::path::Path::new("gateway.toml"), text.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let names = LabelNames::new(&config);
        assert_eq!(&*names.routes[0], "r");
        assert_eq!(&*names.limits[0], "l");
        assert_eq!(&*names.upstreams[0], "u");
    }
}
