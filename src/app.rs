//! Shared state of a running gateway: the current configuration [`Snapshot`],
//! swapped whole with `arc-swap`, and what lives across snapshots.
//!
//! A request loads the snapshot once (`load_full`) and keeps that `Arc` to its
//! end, so a reload never changes the rules under a request in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use arc_swap::ArcSwap;

use crate::config::{Config, RouteAction};
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
}

impl App {
    pub fn new(config: Config) -> Arc<App> {
        Arc::new(App {
            snapshot: ArcSwap::from_pointee(Snapshot::new(config, 1)),
            generation: AtomicU64::new(1),
        })
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
