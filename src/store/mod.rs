//! The Redis store: shared limits decided by one server-side script per
//! request's stack (contract §7), concurrent requests batched into one call.
//!
//! [`RedisStore::decide`] sends a request's shared entries (the limits of its
//! stack without `local = true`) to Redis as one decision of `stack.lua`,
//! which decides them all or nothing against Redis `TIME`, writes every
//! charge with its expiry and returns each entry's numbers. `settle.lua`
//! charges or refunds afterwards ([`RedisStore::settle`], `cost_header`).
//! What a decision spends and gives back (leased tokens, a Cluster slot's
//! charges when a later slot denies) is settled inside `decide`: the caller
//! gets the verdicts as they stand and the concurrency slots to hold.
//!
//! Keys are `<prefix><limit>:{<digest>}:<algorithm>[:<plan>]`: the
//! 128-bit [`LimitKey`] in hex, never the identity it came from. The braces
//! are a Redis Cluster hash tag: a key's slot depends on the digest only.
//!
//! This file is the store's face: the types its callers use, the store
//! itself, starting it and settling. Each job has its own file, in the
//! order a decision meets them:
//! - `decide`: the decision's steps in order, and one call's answer read;
//! - `token_lease`: leased token-bucket tokens spent without a call, a
//!   lease's rest kept, what lapsed given back;
//! - `remembered`: denials a node answers from memory
//!   (`remember_denials`);
//! - `cluster`: Redis Cluster slots, a decision split by slot, the refund
//!   of earlier slots when a later one denies;
//! - `batch`: one connection per worker thread, decisions batched on it;
//! - `script`: the scripts' text, keys and arguments encoded, answers
//!   parsed (`msgpack`: a batch's argument);
//! - `concurrency`: concurrency slots held in Redis, renewed and released;
//! - `breaker`: failures counted, the breaker opened and probed, the store
//!   thread and this node's heartbeat;
//! - `connect`: a connection made (TCP or TLS, `AUTH`, Sentinel, Cluster);
//! - `forget`: a key emptied (the admin listener's reset);
//! - `probe`: a traced request's calls noted for its spans.
//!
//! # Failure
//!
//! Every call is bounded by `timeout`; a call that fails, or is not made
//! because the breaker is open, is [`Unavailable`], and the caller applies
//! `on_failure` (see `breaker`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::sync::Notify;

use crate::config::{OnFailure, RedisConfig};
use crate::limit::{Algorithm, LimitKey, Verdict, WindowAlign};

mod batch;
mod breaker;
mod cluster;
mod concurrency;
mod connect;
mod decide;
mod forget;
mod msgpack;
mod overrides;
mod peek;
pub(crate) mod probe;
mod remembered;
mod script;
mod token_lease;

use cluster::slot_of;
use concurrency::LEASE;
pub(crate) use concurrency::Lease;

/// Told the live node count when it changes.
type NodesListener = Box<dyn Fn(u64) + Send + Sync>;

/// What the store tells the metrics (kept as callbacks so that the store
/// depends on no module above the limiter): a failed call, and the breaker
/// opening (`true`) or closing.
pub(crate) struct Signals {
    pub(crate) error: Box<dyn Fn() + Send + Sync>,
    pub(crate) fallback: Box<dyn Fn(bool) + Send + Sync>,
    /// A denial answered from the node's memory, without a call.
    pub(crate) remembered: Box<dyn Fn() + Send + Sync>,
}

/// A call that failed (timeout, connection, Redis error) or was not made
/// because the breaker is open: the caller applies `on_failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unavailable;

/// One shared limit of a request's stack.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SharedEntry<'a> {
    /// The limit's name (a key's second part).
    pub(crate) limit: &'a str,
    /// The caller's plan when it changes this limit's numbers (its state is
    /// its own, as in memory).
    pub(crate) plan: Option<&'a str>,
    /// The shared (unscaled) numbers.
    pub(crate) algorithm: Algorithm,
    pub(crate) align: WindowAlign,
    pub(crate) key: LimitKey,
    pub(crate) shadow: bool,
    /// A token bucket's `lease`: units to take at a time (0: no leasing).
    pub(crate) lease: u64,
    /// What the request charges it, in its unit (a settlement's entries:
    /// unused).
    pub(crate) cost: u64,
    /// Redis's denial of it may be answered from this node's memory for a
    /// while (`store.remember_denials`; see `remembered`).
    pub(crate) remember: bool,
}

/// The store's answer for a request's shared entries.
#[derive(Debug, Default)]
pub(crate) struct SharedDecision {
    /// One per entry, in order; `None` for an entry not decided because an
    /// earlier Cluster slot denied or a remembered denial answered (it is
    /// reported as skipped). A denied stack charged nothing, and its
    /// admitting entries' numbers are as they stand uncharged.
    pub(crate) verdicts: SmallVec<[Option<Verdict>; 4]>,
    /// The concurrency slots taken, when admitted; hold until the body ends.
    pub(crate) leases: Vec<Lease>,
}

/// The Redis store of one process. Shared as `Arc<RedisStore>`.
pub struct RedisStore {
    config: RedisConfig,
    /// Bumped each time the breaker closes: every thread's connection of an
    /// older generation is replaced (see [`RedisStore::thread_state`]).
    generation: AtomicU64,
    open: AtomicBool,
    failures: AtomicU32,
    /// Wakes the store thread to probe when the breaker opens.
    wake: Notify,
    signals: Signals,
    stack: redis::Script,
    settle: redis::Script,
    heartbeat: redis::Script,
    /// `local_fraction = "auto"`: told the live node count when it changes.
    nodes_listener: std::sync::OnceLock<NodesListener>,
    /// Leased token-bucket tokens, by Redis key, sharded.
    pool: token_lease::Pool,
    /// Lease members: `<node>:<sequence>`, unique across gateways.
    node: String,
    sequence: AtomicU64,
    /// With Sentinel: the sentinel that answered last, asked first.
    sentinel: std::sync::atomic::AtomicUsize,
    runtime: tokio::runtime::Handle,
    /// Whose denials the threads remember (`remembered`): a new one forgets
    /// them all.
    epoch: AtomicU64,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("servers", &self.config.servers.to_string())
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Starts the store thread and connects (waiting at most about a second:
    /// a Redis that is down at start leaves the breaker open, and the store
    /// thread keeps probing). Fails only when the thread cannot start.
    pub(crate) fn start(config: RedisConfig, signals: Signals) -> std::io::Result<Arc<RedisStore>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let node = node_id();
        let store = Arc::new(RedisStore {
            config,
            generation: AtomicU64::new(0),
            open: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            wake: Notify::new(),
            signals,
            stack: redis::Script::new(&script::STACK_LUA),
            settle: redis::Script::new(script::SETTLE_LUA),
            heartbeat: redis::Script::new(script::HEARTBEAT_LUA),
            nodes_listener: std::sync::OnceLock::new(),
            pool: token_lease::Pool::default(),
            node,
            sequence: AtomicU64::new(0),
            sentinel: std::sync::atomic::AtomicUsize::new(0),
            runtime: runtime.handle().clone(),
            epoch: AtomicU64::new(remembered::new_epoch()),
        });
        let (ready, first) = std::sync::mpsc::channel();
        let weak = Arc::downgrade(&store);
        std::thread::Builder::new()
            .name("tollgate-store".into())
            .spawn(move || runtime.block_on(breaker::supervise(weak, ready)))?;
        if first.recv_timeout(Duration::from_secs(2)) != Ok(true) {
            tracing::warn!(
                redis = %store.config.servers,
                on_failure = ?store.config.on_failure,
                "redis store unavailable at start; on_failure applies until it answers"
            );
            (store.signals.fallback)(true);
        }
        Ok(store)
    }

    /// With `local_fraction = "auto"`: `listener` is told the number of live
    /// gateway nodes whenever it changes (on the store thread). Set once.
    pub(crate) fn on_live_nodes(&self, listener: impl Fn(u64) + Send + Sync + 'static) {
        let _ = self.nodes_listener.set(Box::new(listener));
    }

    /// Where the store's Redis is (a traced call's span names it).
    pub(crate) fn servers(&self) -> &crate::config::store::RedisServers {
        &self.config.servers
    }

    pub(crate) fn on_failure(&self) -> OnFailure {
        self.config.on_failure
    }

    /// The breaker is open: calls fail at once and `on_failure` applies.
    pub fn is_down(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Every thread forgets the denials it remembers (a reload changes the
    /// limits).
    pub(crate) fn forget_denials(&self) {
        self.epoch.store(remembered::new_epoch(), Ordering::Relaxed);
    }

    /// Post-response settlement: `delta` more units (or a refund) on every
    /// entry. Runs on the store thread; the response does not wait.
    pub(crate) fn settle(self: &Arc<Self>, entries: &[SharedEntry<'_>], delta: i64) {
        let each: SmallVec<[(SharedEntry<'_>, i64); 4]> =
            entries.iter().map(|&e| (e, delta)).collect();
        self.settle_each(&each);
    }

    /// Post-response settlement of each entry by its own delta (a token
    /// limit's tokens and a usd limit's micro-dollars together), in one
    /// call per slot: one call on a single Redis. An entry whose delta is
    /// 0 is left out.
    pub(crate) fn settle_each(self: &Arc<Self>, entries: &[(SharedEntry<'_>, i64)]) {
        if self.is_down() {
            return;
        }
        let moving: SmallVec<[(SharedEntry<'_>, i64); 4]> = entries
            .iter()
            .filter(|(_, delta)| *delta != 0)
            .copied()
            .collect();
        if moving.is_empty() {
            return;
        }
        let cmds: Vec<redis::Cmd> = self
            .group_by_slot(&moving, |(e, _)| e)
            .iter()
            .map(|group| {
                let views: SmallVec<[SharedEntry<'_>; 4]> = group.iter().map(|(e, _)| *e).collect();
                self.script_cmd(&self.settle, &views, |i| group[i].1, None)
            })
            .collect();
        let store = self.clone();
        self.runtime.spawn(async move {
            for cmd in &cmds {
                let _ = store.call(&store.settle, cmd).await;
            }
        });
    }

    /// [`RedisStore::settle_each`] for entries kept past their request (a
    /// token or usd limit's settlement when its response ends).
    pub(crate) fn settle_owned<'e>(
        self: &Arc<Self>,
        entries: impl IntoIterator<Item = (&'e OwnedEntry, i64)>,
    ) {
        let views: SmallVec<[(SharedEntry<'_>, i64); 4]> = entries
            .into_iter()
            .map(|(e, delta)| (e.view(), delta))
            .collect();
        self.settle_each(&views);
    }
}

/// A unique id for this process's lease members: pid and start time.
fn node_id() -> String {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let digest = LimitKey::digest(&[&std::process::id().to_le_bytes(), &started.to_le_bytes()]);
    format!("{:016x}", digest.as_u128() as u64)
}

/// An entry without borrows, for a lease that outlives the request's view.
#[derive(Debug, Clone)]
pub(crate) struct OwnedEntry {
    limit: Box<str>,
    plan: Option<Box<str>>,
    algorithm: Algorithm,
    align: WindowAlign,
    key: LimitKey,
}

impl From<&SharedEntry<'_>> for OwnedEntry {
    fn from(e: &SharedEntry<'_>) -> Self {
        OwnedEntry {
            limit: e.limit.into(),
            plan: e.plan.map(Into::into),
            algorithm: e.algorithm,
            align: e.align,
            key: e.key,
        }
    }
}

impl OwnedEntry {
    /// `e` kept, with `ceiling`'s numbers (the limit's own, or
    /// [`Algorithm::with_debt`]'s) bounding what a settlement charges.
    pub(crate) fn with_ceiling(e: &SharedEntry<'_>, ceiling: Algorithm) -> OwnedEntry {
        OwnedEntry {
            algorithm: ceiling,
            ..OwnedEntry::from(e)
        }
    }

    fn view(&self) -> SharedEntry<'_> {
        SharedEntry {
            limit: &self.limit,
            plan: self.plan.as_deref(),
            algorithm: self.algorithm,
            align: self.align,
            key: self.key,
            shadow: false,
            lease: 0,
            cost: 0,
            remember: false,
        }
    }

    /// The same limit, plan, numbers and key as `e`.
    fn is(&self, e: &SharedEntry<'_>) -> bool {
        self.key == e.key
            && *self.limit == *e.limit
            && self.plan.as_deref() == e.plan
            && self.algorithm == e.algorithm
            && self.align == e.align
    }
}
