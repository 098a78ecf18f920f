//! Shared state of a running gateway: the current configuration [`Snapshot`],
//! swapped whole with `arc-swap`, and what lives across snapshots.
//!
//! A request loads the snapshot once (`load_full`) and keeps that `Arc` to its
//! end, so a reload never changes the rules under a request in flight.
//!
//! Outside the snapshot, and so kept across reloads: the [`Metrics`], the
//! last reload error shown by the admin listener's `/config`, and the store
//! readiness flag behind `/readyz`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::SystemTime;

use arc_swap::ArcSwap;

use crate::access_log::DeniedSampler;
use crate::config::{Config, RouteAction};
use crate::metrics::{LabelNames, Metrics};
use crate::proxy::forward::{Upstream, Upstreams};
use crate::routing::Router;

/// Everything a request needs from one configuration generation.
#[derive(Debug)]
pub struct Snapshot {
    pub config: Config,
    pub router: Router,
    pub upstreams: Upstreams,
    /// 1 for the configuration loaded at start, +1 per successful reload.
    pub generation: u64,
    pub loaded_at: SystemTime,
    /// Route, limit and upstream names as metric labels (indexes as in `config`).
    pub labels: LabelNames,
    /// `server.log_denied` of this configuration.
    pub denied_log: DeniedSampler,
}

impl Snapshot {
    pub fn new(config: Config, generation: u64) -> Snapshot {
        let router = Router::new(&config);
        let upstreams = config
            .upstreams
            .iter()
            .map(|u| Arc::new(Upstream::new(u.clone())))
            .collect();
        Snapshot {
            labels: LabelNames::new(&config),
            denied_log: DeniedSampler::new(config.server.log_denied),
            config,
            router,
            upstreams,
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

/// The gateway's shared state, one per process (cheap to clone as `Arc<App>`).
#[derive(Debug)]
pub struct App {
    snapshot: ArcSwap<Snapshot>,
    generation: AtomicU64,
    metrics: Arc<Metrics>,
    /// The last reload's error, `None` after a successful one. A lock is fine:
    /// written on SIGHUP, read by `/config`, never on the request path.
    last_reload_error: parking_lot::Mutex<Option<ReloadError>>,
    /// Set while the store is down with `on_failure = "deny"`: `/readyz` is 503.
    store_unavailable: AtomicBool,
}

/// A failed reload, as `/config` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadError {
    /// The error, naming the file, line and column.
    pub message: String,
    pub at: SystemTime,
}

impl App {
    pub fn new(config: Config) -> Arc<App> {
        Arc::new(App {
            snapshot: ArcSwap::from_pointee(Snapshot::new(config, 1)),
            generation: AtomicU64::new(1),
            metrics: Arc::new(Metrics::new()),
            last_reload_error: parking_lot::Mutex::new(None),
            store_unavailable: AtomicBool::new(false),
        })
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
    pub fn set_reload_error(&self, error: Option<ReloadError>) {
        *self.last_reload_error.lock() = error;
    }

    /// Whether the gateway can serve: false while the store is down with
    /// `on_failure = "deny"` (every limited request would get 503).
    pub fn is_ready(&self) -> bool {
        !self.store_unavailable.load(Ordering::Relaxed)
    }

    /// Called by the store when it goes down / comes back under `on_failure = "deny"`.
    pub fn set_store_unavailable(&self, unavailable: bool) {
        self.store_unavailable.store(unavailable, Ordering::Relaxed);
    }

    /// The current snapshot; hold the `Arc` for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Makes `config` current for new requests.
    pub fn install(&self, config: Config) -> u64 {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        self.snapshot
            .store(Arc::new(Snapshot::new(config, generation)));
        generation
    }
}
