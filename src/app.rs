//! Shared state of a running gateway: the current configuration [`Snapshot`],
//! swapped whole with `arc-swap`, and what lives across snapshots — the
//! limiter registry, so that a reload keeps every client's quota.
//!
//! A request takes the snapshot once ([`App::request_snapshot`]: its
//! worker's own handle on it, see `handle`) and keeps it to its end, so a
//! reload never changes the rules under a request in flight.
//!
//! Outside the snapshot, and so kept across reloads: the [`Metrics`], the
//! last reload error shown by the admin listener's `/config`, the store
//! readiness flag behind `/readyz`, and every upstream URL's health (the
//! upstream layer's `HealthRegistry`, with the active checkers).
//!
//! The idle sweeper that keeps the registry small runs beside it
//! (`sweep`).

pub(crate) mod descriptors;
mod handle;
mod jwks;
pub(crate) mod override_sync;
pub(crate) mod override_writes;
pub(crate) mod overrides;
pub(crate) mod state_file;
pub(crate) mod sweep;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use descriptors::DescriptorTable;
pub(crate) use handle::SnapshotHandle;
use handle::WorkerSnapshots;
use parking_lot::Mutex;

use crate::access_log::DeniedSampler;
use crate::config::{
    Config, DescriptorRule, KeyPart, LimitConfig, LocalFraction, OnFailure, RouteAction,
    RouteConfig,
};
use crate::identity::client_ip::{ClientIpPolicy, ForwardHeader, Trust};
use crate::identity::jwt::Verifier;
use crate::limit::{
    Algorithm, Clock, LimitKey, Limiter, Nanos, QueueParams, Reserve, SystemClock, WindowAlign,
};
use crate::metrics::{Front, LabelNames, Metrics, RouteHandles};
use crate::ratelimit_policy::{StackView, policy_header};
use crate::routing::Router;
use crate::store::{RedisStore, Signals};
use crate::trace::Tracing;
use crate::trace::export::Exporter;
use crate::upstream::health::{self, HealthSignals, UrlHealth};
use crate::upstream::pool::BodyErrors;
use crate::upstream::registry::{HealthMetrics, HealthRegistry};
use crate::upstream::retry::RetryBudget;
use crate::upstream::{Upstream, Upstreams};
use crate::usage::UsageSink;

/// A limit of one configuration generation: which of `config.limits` it
/// is. Typed, so that a limit is never confused with a route or a position
/// in a route's stack; valid for the snapshot that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LimitId(usize);

impl LimitId {
    /// The limit's place in `config.limits` (and in `labels.limits`).
    pub(crate) fn index(self) -> usize {
        self.0
    }
}

/// A limit's request-path state in a snapshot.
#[derive(Debug)]
struct LimitState {
    /// A shared limit's limiters hold its node-local fallback
    /// (`on_failure = "local"`), scaled by `local_fraction`.
    limiters: LimiterSet,
    /// Decided in the shared store (the store is Redis and the limit is not
    /// `local = true`).
    shared: bool,
    /// Shared, and Redis's denial of a key stands until its retry-after
    /// whatever other nodes do: a node may remember it
    /// (`store.remember_denials`, see [`crate::store`]).
    remembers_denials: bool,
    /// Its keys with numbers of their own (`overrides`).
    overrides: overrides::LimitOverrides,
}

/// One named limit's state: the base limiter and one per plan that sets its
/// own numbers (a plan's keys are counted against the plan's parameters).
#[derive(Debug)]
pub(crate) struct LimiterSet {
    pub(crate) base: Arc<Limiter>,
    pub(crate) plans: Vec<(Arc<str>, Arc<Limiter>)>,
}

impl LimiterSet {
    /// The limiter for a consumer on `plan` (the base one without a plan, or
    /// for a plan this limit does not name).
    pub(crate) fn for_plan(&self, plan: Option<&str>) -> &Arc<Limiter> {
        plan.and_then(|p| self.plans.iter().find(|(name, _)| &**name == p))
            .map_or(&self.base, |(_, limiter)| limiter)
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<Limiter>> {
        std::iter::once(&self.base).chain(self.plans.iter().map(|(_, l)| l))
    }
}

impl RoutePlan {
    /// `RateLimit-Policy` for a caller on `plan` (or on none). Inlined:
    /// a caller without a plan reads the route's own (out of line, the
    /// call cost a denial ~28 instructions, `bench/instructions.sh`).
    #[inline(always)]
    pub(crate) fn policy_for(&self, plan: Option<&str>) -> Option<&str> {
        match plan {
            None => self.policy.as_deref(),
            Some(plan) => self.plan_policy(plan),
        }
    }

    /// `RateLimit-Policy` for a caller on `plan`: the plan's own where it
    /// changes some limit of the route, else the route's.
    #[inline(never)]
    fn plan_policy(&self, plan: &str) -> Option<&str> {
        self.plan_policies
            .iter()
            .find(|(name, _)| &**name == plan)
            .map_or(&self.policy, |(_, policy)| policy)
            .as_deref()
    }
}

/// A route compiled for the request path.
#[derive(Debug)]
pub struct RoutePlan {
    /// The route's name, shared cheaply with metrics and logs.
    pub(crate) name: Arc<str>,
    /// The route's limits, narrowest first.
    pub(crate) stack: Vec<LimitId>,
    /// `RateLimit-Policy` for callers without a plan: serialized once here.
    pub(crate) policy: Option<Box<str>>,
    /// `RateLimit-Policy` for callers on each plan that changes some limit's
    /// numbers on this route, serialized once here too.
    pub(crate) plan_policies: Vec<(Arc<str>, Option<Box<str>>)>,
    /// Some limit of the stack keys on a body field: the body is buffered
    /// (up to `max_key_body`) before the limit step.
    pub(crate) needs_body: bool,
    /// Some limit of the stack is decided in the shared store.
    pub(crate) shared: bool,
    /// The route's common metric series, resolved once.
    pub(crate) metrics: RouteHandles,
    /// The route's retry budget, when it retries (`retry = {...}`); a reload
    /// starts it afresh.
    pub(crate) retry_budget: Option<RetryBudget>,
}

/// Everything a request needs from one configuration generation.
#[derive(Debug)]
pub struct Snapshot {
    pub config: Config,
    pub router: Router,
    pub(crate) upstreams: Upstreams,
    /// Each limit's state on the request path, reached by its [`LimitId`]
    /// ([`Snapshot::limiters`]).
    limits: Vec<LimitState>,
    /// Aligned with `config.routes`.
    pub routes: Vec<RoutePlan>,
    /// The same, counted as the decision service's `/auth`
    /// (`front = "auth"`); empty without `[decision]`.
    pub(crate) auth_routes: Vec<RoutePlan>,
    pub(crate) client_ip: ClientIpPolicy,
    /// 1 for the configuration loaded at start, +1 per successful reload.
    pub generation: u64,
    pub(crate) loaded_at: SystemTime,
    /// Route, limit and upstream names as metric labels (indexes as in `config`).
    pub(crate) labels: LabelNames,
    /// `server.log_denied` of this configuration.
    pub(crate) denied_log: DeniedSampler,
    /// `[[decision.descriptors]]`, compiled.
    pub(crate) descriptors: DescriptorTable,
    /// `[jwt]`: the issuers' keys and the verified-token cache.
    pub(crate) jwt: Option<Verifier>,
    /// `[tracing]`: this configuration's sampler and the app's exporter.
    pub(crate) tracing: Option<Tracing>,
}

impl Snapshot {
    fn new(
        config: Config,
        generation: u64,
        limiters: Vec<LimiterSet>,
        health: Vec<Vec<Arc<UrlHealth>>>,
        metrics: &Metrics,
        store: bool,
        jwt: Option<Verifier>,
    ) -> Snapshot {
        let shared: Vec<bool> = config.limits.iter().map(|l| store && !l.local).collect();
        let limits: Vec<LimitState> = limiters
            .into_iter()
            .zip(&shared)
            .enumerate()
            .map(|(i, (limiters, &shared))| LimitState {
                limiters,
                shared,
                remembers_denials: shared && denial_stands(&config, i),
                overrides: overrides::LimitOverrides::default(),
            })
            .collect();
        let labels = LabelNames::new(&config);
        let router = Router::new(&config);
        // Off the request path: the first such request need not build it.
        if crate::config::routes::uses_tokenizer(&config.routes) {
            crate::llm::tokenizer::warm();
        }
        let upstreams = config
            .upstreams
            .iter()
            .zip(&labels.upstreams)
            .zip(health)
            .map(|((u, label), health)| {
                let body_errors = BodyErrors {
                    protocol: metrics.upstream_error_counter(label, "protocol"),
                    timeout: metrics.upstream_error_counter(label, "timeout"),
                    reset: metrics.upstream_error_counter(label, "reset"),
                    retried_unanswered: metrics.upstream_retry_counter(label, "reset"),
                };
                Arc::new(Upstream::new(u.clone(), body_errors, health))
            })
            .collect();
        let route_plans = |front: Front| -> Vec<RoutePlan> {
            config
                .routes
                .iter()
                .zip(&labels.routes)
                .map(|(route, name)| {
                    route_plan(&config, &labels, &shared, metrics, route, name, front)
                })
                .collect()
        };
        let routes = route_plans(Front::Proxy);
        // The same plans counted as the decision service's `/auth`.
        let auth_routes = if config.decision.is_some() {
            route_plans(Front::Auth)
        } else {
            Vec::new()
        };
        let ip = &config.client_ip;
        let client_ip = ClientIpPolicy {
            trust: if ip.trusted_cidrs.is_empty() {
                Trust::Hops(ip.trusted_hops)
            } else {
                Trust::Cidrs(ip.trusted_cidrs.clone())
            },
            header: if ip.forwarded_header {
                ForwardHeader::Forwarded
            } else {
                ForwardHeader::XForwardedFor
            },
            ipv4_prefix: ip.ipv4_prefix,
            ipv6_prefix: ip.ipv6_prefix,
        };
        Snapshot {
            labels,
            descriptors: DescriptorTable::new(&config),
            denied_log: DeniedSampler::new(config.server.log_denied),
            config,
            router,
            upstreams,
            limits,
            routes,
            auth_routes,
            client_ip,
            generation,
            loaded_at: SystemTime::now(),
            jwt,
            tracing: None,
        }
    }

    /// The limit's configuration (of the hot path's accessors, each reads
    /// only what it names).
    #[inline]
    pub(crate) fn limit_config(&self, id: LimitId) -> &LimitConfig {
        &self.config.limits[id.0]
    }

    /// The limit's limiters.
    #[inline]
    pub(crate) fn limiters(&self, id: LimitId) -> &LimiterSet {
        &self.limits[id.0].limiters
    }

    /// `key`'s override of the limit in force at `now`, if it has one: its
    /// numbers (a shared limit's unscaled ones) and the limiter holding its
    /// state. One relaxed load for a limit without overrides.
    #[inline(always)]
    pub(crate) fn overridden(
        &self,
        id: LimitId,
        key: LimitKey,
        now: Nanos,
    ) -> Option<(Algorithm, &Limiter)> {
        self.limits[id.0].overrides.lookup(key, now)
    }

    /// The limit's overrides in this snapshot.
    pub(crate) fn overrides(&self, id: LimitId) -> &overrides::LimitOverrides {
        &self.limits[id.0].overrides
    }

    /// The limit is decided in the shared store.
    #[inline]
    pub(crate) fn is_shared(&self, id: LimitId) -> bool {
        self.limits[id.0].shared
    }

    /// A denial of the shared limit may be remembered by the node
    /// (`store.remember_denials`).
    #[inline]
    pub(crate) fn remembers_denials(&self, id: LimitId) -> bool {
        self.limits[id.0].remembers_denials
    }

    /// The limit's metric label.
    #[inline]
    pub(crate) fn limit_label(&self, id: LimitId) -> &Arc<str> {
        &self.labels.limits[id.0]
    }

    /// The limit named `name`, if the configuration has one.
    pub(crate) fn limit_named(&self, name: &str) -> Option<LimitId> {
        self.config
            .limits
            .iter()
            .position(|l| l.name == name)
            .map(LimitId)
    }

    /// Every limit of the configuration, in file order.
    pub(crate) fn limit_ids(&self) -> impl Iterator<Item = LimitId> + use<> {
        (0..self.limits.len()).map(LimitId)
    }

    /// `[[decision.descriptors]]`, in file order.
    pub(crate) fn descriptor_rules(&self) -> &[DescriptorRule] {
        self.config
            .decision
            .as_ref()
            .map_or(&[], |d| d.descriptors.as_slice())
    }

    /// The upstream a forwarding route sends to.
    pub(crate) fn upstream_of(&self, action: &RouteAction) -> Option<&Arc<Upstream>> {
        match action {
            RouteAction::Forward(index) => self.upstreams.get(*index),
            RouteAction::Respond { .. } | RouteAction::DecideOnly | RouteAction::Quota { .. } => {
                None
            }
        }
    }
}

/// Whether Redis's denial of limit `i` holds until its retry-after whatever
/// any node does meanwhile (other nodes' requests only spend), so that a node
/// may answer the key's next requests from memory. Not for a concurrency
/// limit (a response ending anywhere frees a slot), a leased bucket (nodes
/// give back tokens they did not spend), or a limit a response can refund (a
/// token quota, settled when its response ends; a route's `cost_header`).
fn denial_stands(config: &Config, i: usize) -> bool {
    let limit = &config.limits[i];
    !matches!(limit.algorithm, Algorithm::Concurrency { .. })
        && limit.lease.is_none()
        && matches!(limit.unit, crate::config::tokens::Unit::Requests)
        && !config
            .routes
            .iter()
            .any(|route| route.cost_header.is_some() && route.limits.contains(&i))
}

/// A route compiled for the request path, its decisions counted as `front`'s.
fn route_plan(
    config: &Config,
    labels: &LabelNames,
    shared: &[bool],
    metrics: &Metrics,
    route: &RouteConfig,
    name: &Arc<str>,
    front: Front,
) -> RoutePlan {
    let limits: Vec<&LimitConfig> = route.limits.iter().map(|&i| &config.limits[i]).collect();
    let algorithms: Vec<_> = limits.iter().map(|l| l.algorithm).collect();
    let view = StackView {
        limits: &limits,
        algorithms: &algorithms,
        server: config.server.headers,
    };
    let mut plan_policies: Vec<(Arc<str>, Option<Box<str>>)> = Vec::new();
    for (plan, _) in limits.iter().flat_map(|l| &l.plans) {
        if plan_policies.iter().any(|(seen, _)| seen == plan) {
            continue;
        }
        let plan_algorithms: Vec<_> = limits
            .iter()
            .map(|l| {
                l.plans
                    .iter()
                    .find(|(name, _)| name == plan)
                    .map_or(l.algorithm, |(_, algorithm)| *algorithm)
            })
            .collect();
        if plan_algorithms != algorithms {
            let plan_view = StackView {
                algorithms: &plan_algorithms,
                ..view
            };
            plan_policies.push((plan.clone(), policy_header(plan_view)));
        }
    }
    // The metric label's `Arc`, shared rather than allocated again.
    let name = name.clone();
    let limit_labels: Vec<Arc<str>> = route
        .limits
        .iter()
        .map(|&i| labels.limits[i].clone())
        .collect();
    RoutePlan {
        shared: route.limits.iter().any(|&i| shared[i]),
        metrics: metrics.route_handles(&name, &limit_labels, front),
        name,
        stack: route.limits.iter().map(|&i| LimitId(i)).collect(),
        policy: policy_header(view),
        plan_policies,
        // A token route reads its body for the reservation too.
        needs_body: route.tokens.is_some()
            || limits.iter().any(|l| {
                l.key
                    .iter()
                    .any(|part| matches!(part, KeyPart::BodyField(_)))
            }),
        retry_budget: route
            .retry
            .as_ref()
            .map(|retry| RetryBudget::new(retry.budget_permille)),
    }
}

/// What identifies one limiter's state across reloads.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LimiterSpec {
    key: Vec<KeyPart>,
    algorithm: Algorithm,
    align: WindowAlign,
    max_keys: usize,
    /// Slot limits: the reserve and the queue's numbers (a new waiting line
    /// when they change).
    slots: (Reserve, Option<QueueParams>),
}

/// The limiters of the running configuration, by name (`limit` or
/// `limit` + plan), outside any snapshot.
///
/// Touched only when a configuration is installed (start and reload): a cold
/// path, so a plain mutex is fine. Requests reach limiters through their
/// snapshot's `Arc`s and never lock this.
#[derive(Debug, Default)]
struct LimiterRegistry {
    by_name: Mutex<HashMap<LimiterId, (LimiterSpec, Arc<Limiter>)>>,
}

/// A limit's name and, for per-plan state, the plan.
type LimiterId = (String, Option<Arc<str>>);

impl LimiterRegistry {
    /// Limiters for `limits`, reusing state across reloads:
    /// - same definition (key, algorithm and numbers): the same limiter, state untouched;
    /// - same key and algorithm kind, other numbers: state carried over where the
    ///   algorithm allows (see `limit::memory`);
    /// - otherwise (new limit, other key or algorithm): a fresh limiter.
    ///
    /// With a shared store, a limit that is not `local` is built scaled by
    /// `fraction` (numerator, denominator): its memory state is the node's
    /// fallback.
    fn resolve(
        &self,
        limits: &[LimitConfig],
        now: Nanos,
        fraction: Option<(u64, u64)>,
    ) -> Vec<LimiterSet> {
        let mut by_name = self.by_name.lock();
        let mut next = HashMap::with_capacity(limits.len());
        let mut take = |limit: &LimitConfig, plan: Option<&Arc<str>>, algorithm: Algorithm| {
            let algorithm = match fraction {
                Some((num, den)) if !limit.local => algorithm.scaled(num, den),
                _ => algorithm,
            };
            let spec = LimiterSpec {
                key: limit.key.clone(),
                algorithm,
                align: limit.align,
                max_keys: limit.max_keys,
                slots: (limit.reserve, limit.queue.as_ref().map(|q| q.params)),
            };
            let id = (limit.name.clone(), plan.cloned());
            let limiter = match by_name.get(&id) {
                Some((old, limiter)) if *old == spec => limiter.clone(),
                // Windows aligned differently mean other boundaries: fresh.
                Some((old, limiter)) if old.key == spec.key && old.align == spec.align => Arc::new(
                    Limiter::carry_from(limiter, &limit.name, algorithm, limit.max_keys, now)
                        .with_align(limit.align)
                        .with_slots(spec.slots.0, spec.slots.1),
                ),
                _ => Arc::new(
                    Limiter::new(&limit.name, algorithm, limit.max_keys)
                        .with_align(limit.align)
                        .with_slots(spec.slots.0, spec.slots.1),
                ),
            };
            next.insert(id, (spec, limiter.clone()));
            limiter
        };
        let sets = limits
            .iter()
            .map(|limit| LimiterSet {
                base: take(limit, None, limit.algorithm),
                plans: limit
                    .plans
                    .iter()
                    .map(|(plan, algorithm)| (plan.clone(), take(limit, Some(plan), *algorithm)))
                    .collect(),
            })
            .collect();
        *by_name = next;
        sets
    }
}

/// A URL's health series in the process's [`Metrics`].
/// `config`'s `[tracing]` for a snapshot: the app's exporter (started by
/// the first configuration that has the section, reconfigured by the
/// next ones) under this configuration's sampler. A cold path: start and
/// reloads.
fn tracing_for(
    exporter: &Mutex<Option<Arc<Exporter>>>,
    metrics: &Metrics,
    config: &Config,
) -> Option<Tracing> {
    let settings = config.tracing.as_ref()?;
    let mut exporter = exporter.lock();
    let running = match &*exporter {
        Some(running) => {
            running.reconfigure(settings);
            running.clone()
        }
        None => match Exporter::start(settings, metrics.trace_spans_dropped_counter()) {
            Ok(started) => exporter.insert(Arc::new(started)).clone(),
            Err(error) => {
                tracing::error!(%error, "cannot start the trace exporter; requests are not traced");
                return None;
            }
        },
    };
    Some(Tracing::new(settings, running))
}

struct UpstreamHealthMetrics<'m>(&'m Arc<Metrics>);

impl HealthMetrics for UpstreamHealthMetrics<'_> {
    fn signals(&self, upstream: &str, url: &str) -> HealthSignals {
        let (upstream, url): (Arc<str>, Arc<str>) = (Arc::from(upstream), Arc::from(url));
        let (ejections, checks) = (self.0.clone(), self.0.clone());
        let (u1, l1, u2, l2) = (upstream.clone(), url.clone(), upstream.clone(), url.clone());
        HealthSignals {
            healthy: self.0.upstream_healthy_gauge(&upstream, &url),
            ejected: Box::new(move |reason| ejections.record_upstream_ejection(&u1, &l1, reason)),
            checked: Box::new(move |result| checks.record_upstream_health_check(&u2, &l2, result)),
        }
    }

    fn retire(&self, upstream: &str, url: &str) {
        self.0.retire_upstream_url(upstream, url);
    }
}

/// The gateway's shared state, one per process (shared as `Arc<App>`).
pub struct App {
    snapshot: ArcSwap<Snapshot>,
    /// Each worker's handle on `snapshot`, emptied by every swap.
    worker_snapshots: WorkerSnapshots,
    generation: AtomicU64,
    registry: LimiterRegistry,
    /// Every upstream URL's health, kept across reloads.
    health: HealthRegistry,
    /// Every `jwks_url`'s keys and fetcher, kept across reloads.
    jwks: jwks::JwksRegistry,
    /// The one time source of the limiters.
    pub clock: Arc<dyn Clock>,
    /// Tells the server (listener changes) that a new generation is installed.
    generations: tokio::sync::watch::Sender<u64>,
    metrics: Arc<Metrics>,
    /// The last reload's error, `None` after a successful one. A lock is fine:
    /// written on SIGHUP, read by `/config`, never on the request path.
    last_reload_error: parking_lot::Mutex<Option<ReloadError>>,
    /// The shared store (`backend = "redis"`), chosen at start.
    store: Option<Arc<RedisStore>>,
    /// With a store: `local_fraction` of the fallback limiters, as
    /// (numerator, denominator). Read and written only when installing.
    fraction: Mutex<(u64, u64)>,
    /// Held while a snapshot is built and swapped in (reload, rescale), and
    /// while an override is written.
    install_lock: Mutex<()>,
    /// Per-key overrides, kept across reloads (`overrides`).
    overrides: overrides::Registry,
    /// `server.state_file` as the gateway started: where overrides outlive
    /// a restart.
    state_file: Option<std::path::PathBuf>,
    /// `[usage]` as the gateway started: where settled requests' usage
    /// records go (the exporter is started by `gateway::run`).
    usage: Option<Arc<UsageSink>>,
    /// `[tracing]`'s exporter, started by the first configuration with
    /// the section and kept for the process (a reload reconfigures it).
    exporter: Mutex<Option<Arc<Exporter>>>,
}

/// A failed reload, as `/config` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadError {
    /// The error, naming the file, line and column.
    pub(crate) message: String,
    pub(crate) at: SystemTime,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl App {
    pub fn new(config: Config) -> Arc<App> {
        App::with_clock(config, Arc::new(SystemClock::new()))
    }

    pub fn with_clock(config: Config, clock: Arc<dyn Clock>) -> Arc<App> {
        let metrics = Arc::new(Metrics::new());
        metrics.expose_store_errors(match config.store.backend {
            crate::config::StoreBackend::Memory => "memory",
            crate::config::StoreBackend::Redis(_) => "redis",
        });
        let store = config.store.redis().and_then(|redis| {
            let (errors, fallback, remembered) =
                (metrics.clone(), metrics.clone(), metrics.clone());
            let signals = Signals {
                error: Box::new(move || errors.record_store_error("redis")),
                fallback: Box::new(move |active| fallback.set_store_fallback(active)),
                remembered: Box::new(move || remembered.record_remembered_denial()),
            };
            RedisStore::start(redis.clone(), signals)
                .inspect_err(|error| {
                    tracing::error!(%error, "cannot start the redis store; limits stay node-local");
                })
                .ok()
        });
        let registry = LimiterRegistry::default();
        // "auto" starts at 1 (this node alone) until heartbeats count more.
        let fraction = match config.store.redis().map(|r| r.local_fraction) {
            Some(LocalFraction::Fixed(ppm)) => (u64::from(ppm), 1_000_000),
            _ => (1, 1),
        };
        let auto = config
            .store
            .redis()
            .is_some_and(|r| r.local_fraction == LocalFraction::Auto);
        let limiters = registry.resolve(
            &config.limits,
            clock.now(),
            store.as_ref().map(|_| fraction),
        );
        let shared = store.is_some();
        let state_file = config.server.state_file.clone();
        let usage = config
            .usage
            .clone()
            .map(|usage| UsageSink::new(usage, metrics.usage().clone()));
        let health = HealthRegistry::default();
        let urls = health.resolve(&config.upstreams, &UpstreamHealthMetrics(&metrics));
        let jwks = jwks::JwksRegistry::default();
        let jwt = jwks.verifier(&config, &metrics);
        let exporter = Mutex::new(None);
        let mut first = Snapshot::new(config, 1, limiters, urls, &metrics, shared, jwt);
        first.tracing = tracing_for(&exporter, &metrics, &first.config);
        let app = Arc::new(App {
            snapshot: ArcSwap::from_pointee(first),
            worker_snapshots: WorkerSnapshots::new(),
            generation: AtomicU64::new(1),
            registry,
            health,
            jwks,
            clock,
            generations: tokio::sync::watch::Sender::new(1),
            metrics,
            last_reload_error: parking_lot::Mutex::new(None),
            store,
            fraction: Mutex::new(fraction),
            install_lock: Mutex::new(()),
            overrides: overrides::Registry::default(),
            state_file,
            usage,
            exporter,
        });
        if let (Some(store), true) = (&app.store, auto) {
            let weak = Arc::downgrade(&app);
            store.on_live_nodes(move |nodes| {
                if let Some(app) = weak.upgrade() {
                    app.rescale_fallback(nodes);
                }
            });
        }
        app
    }

    /// `local_fraction = "auto"`: rebuilds the node-local fallback limiters
    /// at 1/`nodes` of each shared limit (their state carried over as on a
    /// reload), keeping the configuration and its generation.
    pub(crate) fn rescale_fallback(&self, nodes: u64) {
        let fraction = (1, nodes.max(1));
        let _installing = self.install_lock.lock();
        if std::mem::replace(&mut *self.fraction.lock(), fraction) == fraction {
            return;
        }
        let current = self.snapshot();
        let limiters =
            self.registry
                .resolve(&current.config.limits, self.clock.now(), Some(fraction));
        let urls = self.health.resolve(
            &current.config.upstreams,
            &UpstreamHealthMetrics(&self.metrics),
        );
        let jwt = self.jwks.verifier(&current.config, &self.metrics);
        let mut next = Snapshot::new(
            current.config.clone(),
            current.generation,
            limiters,
            urls,
            &self.metrics,
            self.store.is_some(),
            jwt,
        );
        next.loaded_at = current.loaded_at;
        next.tracing = tracing_for(&self.exporter, &self.metrics, &next.config);
        self.attach_overrides(&next);
        self.swap_in(next);
        tracing::info!(
            nodes,
            "redis store: {nodes} live gateway nodes; the node-local fallback is 1/{nodes} of each shared limit"
        );
    }

    /// The shared store, if limits are shared through Redis.
    pub fn store(&self) -> Option<&Arc<RedisStore>> {
        self.store.as_ref()
    }

    /// Where usage records go, with `[usage]` (as the gateway started).
    pub(crate) fn usage(&self) -> Option<&Arc<UsageSink>> {
        self.usage.as_ref()
    }

    /// The process's metrics (kept across reloads).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The last reload's error, if the last reload failed.
    pub fn last_reload_error(&self) -> Option<ReloadError> {
        self.last_reload_error.lock().clone()
    }

    /// Records the outcome of a reload attempt for `/config`.
    pub(crate) fn set_reload_error(&self, error: Option<ReloadError>) {
        *self.last_reload_error.lock() = error;
    }

    /// Whether the gateway can serve: false while the store is down with
    /// `on_failure = "deny"` (every limited request would get 503).
    pub fn is_ready(&self) -> bool {
        let store_down = self
            .store
            .as_ref()
            .is_some_and(|s| s.on_failure() == OnFailure::Deny && s.is_down());
        !store_down
    }

    /// A Redis fleet's overrides could not be read lately: the last ones
    /// seen apply (`/readyz` says so).
    pub(crate) fn overrides_stale(&self) -> bool {
        self.overrides.is_stale()
    }

    /// The current snapshot; hold the `Arc` for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// The current snapshot for a request, which holds it to its end:
    /// [`App::snapshot`] through the worker's own handle, so that no count
    /// every worker writes changes per request (`handle`).
    #[inline]
    pub(crate) fn request_snapshot(&self) -> SnapshotHandle {
        self.worker_snapshots.get(&self.snapshot)
    }

    /// Makes `next` the current snapshot: stored, then every worker's
    /// handle on the old one let go (their next requests take `next`).
    fn swap_in(&self, next: Snapshot) {
        self.snapshot.store(Arc::new(next));
        self.worker_snapshots.clear();
    }

    /// Makes `config` current for new requests; returns its generation.
    pub fn install(&self, config: Config) -> u64 {
        let _installing = self.install_lock.lock();
        if let Some(store) = &self.store {
            // Leased tokens go back and remembered denials are forgotten:
            // the new limits may differ.
            store.return_leases();
            store.forget_denials();
        }
        // The store is the one chosen at start (a reload that changes
        // `[store]` is told a restart is needed), and so is its fraction.
        let fraction = *self.fraction.lock();
        let limiters = self.registry.resolve(
            &config.limits,
            self.clock.now(),
            self.store.as_ref().map(|_| fraction),
        );
        let urls = self
            .health
            .resolve(&config.upstreams, &UpstreamHealthMetrics(&self.metrics));
        let jwt = self.jwks.verifier(&config, &self.metrics);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        // Before the swap: the gauge never lags the `/config` generation.
        self.metrics.set_generation(generation);
        let mut next = Snapshot::new(
            config,
            generation,
            limiters,
            urls,
            &self.metrics,
            self.store.is_some(),
            jwt,
        );
        next.tracing = tracing_for(&self.exporter, &self.metrics, &next.config);
        self.attach_overrides(&next);
        self.swap_in(next);
        self.generations.send_replace(generation);
        generation
    }

    /// Changes whenever a new configuration is installed.
    pub(crate) fn subscribe_generations(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generations.subscribe()
    }

    /// Evicts idle keys of every limiter; returns how many keys were
    /// removed. Also closes idle upstream connections that expired or that
    /// their upstream closed. (`tollgate_limiter_keys` is refreshed where it
    /// is read: by each `/metrics` scrape.)
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let snapshot = self.snapshot();
        for upstream in &snapshot.upstreams {
            upstream.prune_idle();
            upstream.summarise();
        }
        // The health log's interval: one line per failing URL.
        self.health.summarise(health::now());
        self.expire_overrides();
        snapshot
            .limit_ids()
            .flat_map(|id| snapshot.limiters(id).all())
            .map(|l| l.sweep(now))
            .sum::<usize>()
            + snapshot.descriptors.sweep(now)
    }

    /// The upstreams none of whose URLs takes requests now (all ejected or
    /// down by their checks), by name, for `/readyz`.
    pub(crate) fn unhealthy_upstreams(&self) -> Vec<String> {
        let now = health::now();
        self.snapshot()
            .upstreams
            .iter()
            .filter(|upstream| !upstream.has_available(now))
            .map(|upstream| upstream.config.name.clone())
            .collect()
    }

    /// Ends the upstream ejections whose time is up, so that
    /// `tollgate_upstream_healthy` is current for a scrape.
    pub(crate) fn refresh_upstream_health(&self) {
        self.health.expire(health::now());
    }

    /// Sets `tollgate_limiter_keys{limit}` to the keys each limit holds now,
    /// and for the limits that count requests in flight
    /// `tollgate_inflight{limit}` and `tollgate_adaptive_limit{limit}`:
    /// read from the tables at scrape time, one shard at a time, so the
    /// request path keeps no counter for them.
    pub(crate) fn refresh_limiter_keys(&self) {
        let snapshot = self.snapshot();
        for id in snapshot.limit_ids() {
            let live: usize = snapshot.limiters(id).all().map(|l| l.live_keys()).sum();
            let label = snapshot.limit_label(id);
            self.metrics.set_limiter_keys(label, live as u64);
            if snapshot.limit_config(id).queue.is_some() {
                let waiting = snapshot.limiters(id).all().filter_map(|l| l.queue());
                let depth: usize = waiting.map(|q| q.depth()).sum();
                self.metrics.set_queue_depth(label, depth as u64);
            }
            let algorithm = snapshot.limit_config(id).algorithm;
            if !matches!(
                algorithm,
                Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. }
            ) {
                continue;
            }
            let (mut in_flight, mut limit) = (0, 0);
            for limiter in snapshot.limiters(id).all() {
                let totals = limiter.in_flight_totals();
                in_flight += totals.in_flight;
                limit += totals.limit;
            }
            self.metrics.set_inflight(label, in_flight);
            if matches!(algorithm, Algorithm::Adaptive { .. }) {
                self.metrics.set_adaptive_limit(label, limit);
            }
        }
    }
}
