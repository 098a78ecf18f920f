//! Shared state of a running gateway: the current configuration [`Snapshot`],
//! swapped whole with `arc-swap`, and what lives across snapshots — the
//! limiter registry, so that a reload keeps every client's quota.
//!
//! A request loads the snapshot once (`load_full`) and keeps that `Arc` to its
//! end, so a reload never changes the rules under a request in flight.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use http::HeaderValue;
use parking_lot::Mutex;

use crate::config::{Config, LimitConfig, RouteAction};
use crate::identity::client_ip::{ClientIpPolicy, ForwardHeader, Trust};
use crate::limit::{Clock, Limiter, Nanos, SystemClock};
use crate::proxy::forward::{Upstream, Upstreams};
use crate::proxy::ratelimit::policy_header;
use crate::routing::Router;

/// A route compiled for the request path.
#[derive(Debug)]
pub struct RoutePlan {
    /// The route's name, shared cheaply with metrics and logs.
    pub name: Arc<str>,
    /// The route's limits, narrowest first: indexes into [`Snapshot::limiters`].
    pub stack: Vec<usize>,
    /// `RateLimit-Policy`, fixed per configuration: serialized once here.
    pub policy: Option<HeaderValue>,
}

/// Everything a request needs from one configuration generation.
#[derive(Debug)]
pub struct Snapshot {
    pub config: Config,
    pub router: Router,
    pub upstreams: Upstreams,
    /// Aligned with `config.limits`.
    pub limiters: Vec<Arc<Limiter>>,
    /// Aligned with `config.routes`.
    pub routes: Vec<RoutePlan>,
    pub client_ip: ClientIpPolicy,
    /// 1 for the configuration loaded at start, +1 per successful reload.
    pub generation: u64,
    pub loaded_at: SystemTime,
}

impl Snapshot {
    fn new(config: Config, generation: u64, limiters: Vec<Arc<Limiter>>) -> Snapshot {
        let router = Router::new(&config);
        let upstreams = config
            .upstreams
            .iter()
            .map(|u| Arc::new(Upstream::new(u.clone())))
            .collect();
        let routes = config
            .routes
            .iter()
            .map(|route| {
                let stack: Vec<&LimitConfig> =
                    route.limits.iter().map(|&i| &config.limits[i]).collect();
                RoutePlan {
                    name: Arc::from(route.name.as_str()),
                    stack: route.limits.clone(),
                    policy: policy_header(&stack, config.server.headers),
                }
            })
            .collect();
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
            config,
            router,
            upstreams,
            limiters,
            routes,
            client_ip,
            generation,
            loaded_at: SystemTime::now(),
        }
    }

    /// The upstream a forwarding route sends to.
    pub fn upstream_of(&self, action: &RouteAction) -> Option<&Arc<Upstream>> {
        match action {
            RouteAction::Forward(index) => self.upstreams.get(*index),
            RouteAction::Respond { .. } => None,
        }
    }
}

/// The limiters of the running configuration, by name, outside any snapshot.
///
/// Touched only when a configuration is installed (start and reload): a cold
/// path, so a plain mutex is fine. Requests reach limiters through their
/// snapshot's `Arc`s and never lock this.
#[derive(Debug, Default)]
struct LimiterRegistry {
    by_name: Mutex<HashMap<String, (LimitConfig, Arc<Limiter>)>>,
}

impl LimiterRegistry {
    /// Limiters for `limits`, reusing state across reloads:
    /// - same definition (key, algorithm and numbers): the same limiter, state untouched;
    /// - same key and algorithm kind, other numbers: state carried over where the
    ///   algorithm allows (see `limit::memory`);
    /// - otherwise (new limit, other key or algorithm): a fresh limiter.
    fn resolve(&self, limits: &[LimitConfig], now: Nanos) -> Vec<Arc<Limiter>> {
        let mut by_name = self.by_name.lock();
        let mut next = HashMap::with_capacity(limits.len());
        let resolved = limits
            .iter()
            .map(|limit| {
                let limiter = match by_name.get(&limit.name) {
                    Some((old, limiter))
                        if old.key == limit.key
                            && old.algorithm == limit.algorithm
                            && old.max_keys == limit.max_keys =>
                    {
                        limiter.clone()
                    }
                    Some((old, limiter)) if old.key == limit.key => Arc::new(Limiter::carry_from(
                        limiter,
                        &limit.name,
                        limit.algorithm,
                        limit.max_keys,
                        now,
                    )),
                    _ => Arc::new(Limiter::new(&limit.name, limit.algorithm, limit.max_keys)),
                };
                next.insert(limit.name.clone(), (limit.clone(), limiter.clone()));
                limiter
            })
            .collect();
        *by_name = next;
        resolved
    }
}

/// The gateway's shared state, one per process (shared as `Arc<App>`).
pub struct App {
    snapshot: ArcSwap<Snapshot>,
    generation: AtomicU64,
    registry: LimiterRegistry,
    /// The one time source of the limiters.
    pub clock: Arc<dyn Clock>,
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
        let registry = LimiterRegistry::default();
        let limiters = registry.resolve(&config.limits, clock.now());
        Arc::new(App {
            snapshot: ArcSwap::from_pointee(Snapshot::new(config, 1, limiters)),
            generation: AtomicU64::new(1),
            registry,
            clock,
        })
    }

    /// The current snapshot; hold the `Arc` for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Makes `config` current for new requests; returns its generation.
    pub fn install(&self, config: Config) -> u64 {
        let limiters = self.registry.resolve(&config.limits, self.clock.now());
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.snapshot
            .store(Arc::new(Snapshot::new(config, generation, limiters)));
        generation
    }

    /// Evicts idle keys of every limiter; returns how many were removed.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        self.snapshot().limiters.iter().map(|l| l.sweep(now)).sum()
    }
}
