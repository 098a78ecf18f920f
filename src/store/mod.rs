//! The Redis store: shared limits decided by one server-side script per
//! request's stack (contract §7), concurrent requests batched into one call.
//!
//! [`RedisStore::decide`] sends a request's shared entries (the limits of its
//! stack without `local = true`) to Redis as one decision of `stack.lua`,
//! which decides them all or nothing against Redis `TIME`, writes every
//! charge with its expiry and returns each entry's numbers. `settle.lua`
//! charges or refunds afterwards (`cost_header`). Both scripts are loaded
//! once with `SCRIPT LOAD` when a connection is made, and again when a call
//! finds them gone (`NOSCRIPT`, after a `SCRIPT FLUSH` or a restart).
//! With `remember_denials`, a key's denial that this thread remembers
//! answers without a call (`remembered`).
//!
//! Keys are `<prefix><limit>:{<digest>}:<algorithm>[:<plan>]`: the
//! 128-bit [`LimitKey`] in hex, never the identity it came from. The braces
//! are a Redis Cluster hash tag: a key's slot depends on the digest only.
//!
//! # Connections and batches
//!
//! One multiplexed connection per worker thread (with `cluster = true`, the
//! cluster client's, one per node), made lazily on the worker's own runtime
//! so that its driver runs beside the requests that use it, and no other
//! thread is woken for a call. A worker keeps at most [`MAX_IN_FLIGHT`]
//! decision calls in flight: a decision that finds fewer (and none waiting)
//! is sent at once, alone, from its own task; decisions that arrive
//! meanwhile queue (`ThreadState`) and go together, up to [`MAX_BATCH`], as
//! one `EVALSHA` from a sender task when a call returns (`stack.lua` decides
//! them one after the other, each all or nothing). Under load one script
//! run and one reply serve many requests; idle, nothing waits. Other calls
//! (settlements, lease renewals) are pipelined on the same connection. The
//! store's own thread (`tollgate-store`, a small runtime) probes, renews
//! heartbeats and leases, and settles, on a connection of its own. A
//! connection belongs to a generation, bumped each time the breaker
//! closes: after an outage every thread connects afresh.
//!
//! # Redis Cluster
//!
//! A stack's entries are grouped by slot ([`slot_of`]); each group is one
//! decision, in stack order, batched with the thread's other decisions of
//! that slot (a batcher per slot, each as on one Redis). A group
//! that denies ends the decision and the groups before it are refunded with
//! `settle.lua` before the answer (the README states the exactness this
//! gives).
//!
//! # Failure
//!
//! Every call is bounded by `timeout`, and so is a decision's wait in a
//! batch from the moment it queues; a failed batch is one failure per
//! decision in it. [`FAILURES_TO_OPEN`] failures in a row open the
//! breaker: calls then fail at once (the caller applies `on_failure`) and
//! the store thread probes every [`PROBE_INTERVAL`] with a fresh connection
//! (`PING` + `SCRIPT LOAD`), each probe itself bounded;
//! the first that succeeds closes the breaker. Opening and closing are each
//! logged once (the first failed probe of an outage says why) and shown by
//! `tollgate_store_fallback_active`; every failed call, probes included,
//! counts in `tollgate_store_errors_total{backend="redis"}`.
//!
//! A connection is made the same way whatever the servers are (`connect`:
//! TCP or TLS, `AUTH`, Sentinel's master found anew each time), so the
//! breaker, `on_failure` and the generations behave alike on each: after a
//! Sentinel failover, the probe's fresh connection is to the new master.
//!
//! # Heartbeats
//!
//! With `local_fraction = "auto"` the store thread renews this node's
//! heartbeat (`heartbeat.lua`) every [`HEARTBEAT_EVERY`]; each answer is the
//! live node count, and a change is passed to the listener the app set
//! ([`RedisStore::on_live_nodes`]), which rescales the fallback limiters.
//!
//! # Token leasing
//!
//! A token bucket with `lease = N`: an admitting call takes up to N tokens
//! (`stack.lua`), the node keeps the rest in its pool ([`RedisStore::add_lease`])
//! and spends them without a call ([`RedisStore::spend_leased`]) for
//! [`LEASE_HOLD`]; the store thread gives back what lapsed unspent.
//!
//! # Concurrency leases
//!
//! A `concurrency` slot on Redis is a sorted-set member whose score is its
//! expiry ([`LEASE`] from Redis `TIME`). The request holds a [`Lease`] until
//! its response body ends; dropping it removes the member. While held it is
//! renewed every third of [`LEASE`], so a long response keeps its slot and a
//! gateway that dies holds it at most [`LEASE`] longer.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisResult, Value};
use smallvec::SmallVec;
use tokio::sync::Notify;

use crate::config::{OnFailure, RedisConfig, RedisServers};

mod connect;
mod peek;
mod remembered;
use crate::limit::{Algorithm, LeakyMode, LimitKey, Nanos, Verdict, WindowAlign};

/// Failed calls in a row that open the breaker.
pub(crate) const FAILURES_TO_OPEN: u32 = 3;

/// How often an open breaker tries Redis again.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How long a concurrency slot outlives the last renewal of its holder.
pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// How long a node keeps the tokens it leased before giving back what it
/// did not spend (`lease = N`).
pub(crate) const LEASE_HOLD: Duration = Duration::from_secs(1);

/// Shards of the lease pool: requests for different keys rarely meet.
const POOL_SHARDS: usize = 16;

/// Tokens leased from one shared token bucket and not spent yet.
#[derive(Debug)]
struct Leased {
    tokens: u64,
    expires: std::time::Instant,
    entry: OwnedEntry,
    /// A call taking a lease for this bucket is under way: the node's
    /// other requests meanwhile take only their cost, so that it never
    /// holds more than one lease of a bucket (see the README's bound).
    fetching: bool,
}

type PoolShard = parking_lot::Mutex<std::collections::HashMap<String, Leased>>;

/// The buckets a decision is taking leases for; their `fetching` mark is
/// cleared when it ends, also when its request goes away mid-call.
struct Fetching<'a> {
    store: &'a RedisStore,
    keys: SmallVec<[String; 2]>,
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        for key in &self.keys {
            if let Some(held) = self.store.pool_shard(key).lock().get_mut(key) {
                held.fetching = false;
            }
        }
    }
}

/// How often a node renews its heartbeat (`local_fraction = "auto"`), and
/// how long one counts.
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
pub(crate) const HEARTBEAT_TTL: Duration = Duration::from_secs(3);

const STACK_LUA: &str = include_str!("stack.lua");
const SETTLE_LUA: &str = include_str!("settle.lua");
const HEARTBEAT_LUA: &str = include_str!("heartbeat.lua");

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
#[derive(Debug)]
pub(crate) struct SharedDecision {
    /// One per entry, in order; `None` for an entry not decided because an
    /// earlier Cluster slot denied (it is reported as skipped).
    pub(crate) verdicts: SmallVec<[Option<Verdict>; 4]>,
    /// The concurrency slots taken, when admitted; hold until the body ends.
    pub(crate) leases: Vec<Lease>,
    /// Per entry, the units taken (more than the cost for a leased token
    /// bucket: the rest is this node's to spend, see [`RedisStore::add_lease`]).
    pub(crate) taken: SmallVec<[u64; 4]>,
}

thread_local! {
    /// Per thread: (store address, generation, connection and batcher).
    static THREAD_STATE: std::cell::RefCell<Option<(usize, u64, Arc<ThreadState>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Most decisions one script call carries: bounds the call's size and how
/// long Redis runs it.
pub(crate) const MAX_BATCH: usize = 64;

/// Decision calls a worker keeps in flight at most, per Cluster slot (on
/// one Redis, in all). Two, not one: while one call's reply waits for the
/// worker to be scheduled, the next batch is already on its way, so
/// requests do not wait a whole round trip idle (measured: more req/s at
/// a few more calls per request).
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// One thread's connection (made on first use) and the decisions waiting
/// for it.
#[derive(Default)]
struct ThreadState {
    connection: tokio::sync::OnceCell<Connection>,
    /// Per thread, so never contended by another worker.
    queues: parking_lot::Mutex<Queues>,
}

/// A thread's decisions waiting, one queue per Redis Cluster slot with
/// decisions waiting or in flight (a call's keys must share a slot); on
/// one Redis, one queue. Few at a time: a linear search.
#[derive(Default)]
struct Queues(SmallVec<[(u16, Queue); 1]>);

impl Queues {
    /// The queue of `slot`, made when there is none.
    fn of(&mut self, slot: u16) -> &mut Queue {
        let at = match self.0.iter().position(|(s, _)| *s == slot) {
            Some(at) => at,
            None => {
                self.0.push((slot, Queue::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[at].1
    }

    /// Forgets the queue of `slot`: nothing waits and nothing is in flight.
    fn remove(&mut self, slot: u16) {
        if let Some(at) = self.0.iter().position(|(s, _)| *s == slot) {
            self.0.swap_remove(at);
        }
    }
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Pending>,
    /// Tasks sending batches, at most [`MAX_IN_FLIGHT`]: at the cap, a
    /// decision that arrives waits for a call in flight to return, then
    /// goes in the next batch.
    senders: usize,
}

/// The numbers of one decision's entries (2 or 4 per entry, see
/// `stack.lua`).
type Answer = SmallVec<[i64; 16]>;

/// Per entry of a decision, its verdict and the units it took.
type Verdicts = SmallVec<[(Verdict, u64); 4]>;

/// A decision waiting to be sent.
struct Pending {
    args: Args,
    reply: tokio::sync::oneshot::Sender<Result<Answer, Unavailable>>,
}

/// The script arguments of one decision or settlement: its keys, then its
/// ARGV values. Keys and text values share one buffer (a request builds no
/// `String` per value); numbers stay numbers until the command is written:
/// as text for `settle.lua` ([`eval_cmd`]), as msgpack numbers for a batch
/// of `stack.lua` ([`batch_cmd`]), never formatted and parsed back.
#[derive(Debug, Default)]
struct Args {
    /// The keys, then the text values, one after the other.
    text: String,
    /// Where each key ends in `text`.
    key_ends: SmallVec<[u32; 4]>,
    /// The ARGV values; inline room for a decision of two entries (8 and
    /// 15 values for one and two).
    values: SmallVec<[Param; 16]>,
}

/// An ARGV value of [`Args`].
#[derive(Debug, Clone, Copy)]
enum Param {
    Int(i64),
    /// An emission interval in picoseconds, which the scripts take in µs
    /// (see [`interval_micros`]).
    Interval(u128),
    /// Text: this range of [`Args::text`] (a lease member).
    Text(u32, u32),
}

/// A [`Param`] with its text resolved: what two decisions' parameter sets
/// are compared by.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ParamValue<'a> {
    Int(i64),
    Interval(u128),
    Text(&'a str),
}

/// An interval of `ps` picoseconds as the scripts read it in text: µs with
/// six decimals.
fn interval_text(ps: u128) -> String {
    format!("{}.{:06}", ps / 1_000_000, ps % 1_000_000)
}

/// An interval of `ps` picoseconds as µs: the double Lua's `tonumber`
/// (`strtod`, correctly rounded) makes of [`interval_text`]. Below 2^53
/// `ps` is an exact double and one IEEE division is correctly rounded too,
/// so the two agree; above, through the text.
fn interval_micros(ps: u128) -> f64 {
    if ps < 1 << 53 {
        ps as f64 / 1e6
    } else {
        interval_text(ps).parse().unwrap_or(f64::MAX)
    }
}

impl Args {
    /// Ends the key written at the end of [`Args::text`] since the last.
    fn end_key(&mut self) {
        self.key_ends
            .push(u32::try_from(self.text.len()).unwrap_or(u32::MAX));
    }

    fn keys(&self) -> usize {
        self.key_ends.len()
    }

    /// Key `i`.
    fn key(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.key_ends[i - 1] };
        &self.text[start as usize..self.key_ends[i] as usize]
    }

    /// An integer value; one past `i64` as `i64::MAX` (a limit no count
    /// reaches either way).
    fn int<E>(&mut self, value: impl TryInto<i64, Error = E>) {
        self.values
            .push(Param::Int(value.try_into().unwrap_or(i64::MAX)));
    }

    fn text_value(&mut self, value: &str) {
        let start = u32::try_from(self.text.len()).unwrap_or(u32::MAX);
        self.text.push_str(value);
        let end = u32::try_from(self.text.len()).unwrap_or(u32::MAX);
        self.values.push(Param::Text(start, end));
    }

    /// ARGV value `i`.
    fn value(&self, i: usize) -> ParamValue<'_> {
        match self.values[i] {
            Param::Int(v) => ParamValue::Int(v),
            Param::Interval(ps) => ParamValue::Interval(ps),
            Param::Text(a, b) => ParamValue::Text(&self.text[a as usize..b as usize]),
        }
    }
}

/// `EVALSHA <hash> <keys> <keys…> <argv…>` of `args`, each value in text
/// (`settle.lua`).
fn eval_cmd(hash: &str, args: &Args) -> Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(hash).arg(args.keys());
    for i in 0..args.keys() {
        cmd.arg(args.key(i));
    }
    for i in 0..args.values.len() {
        match args.value(i) {
            ParamValue::Int(v) => cmd.arg(v),
            ParamValue::Interval(ps) => cmd.arg(interval_text(ps)),
            ParamValue::Text(text) => cmd.arg(text),
        };
    }
    cmd
}

/// Values per entry of a decision's [`Args`] after its entry count:
/// algorithm, p1–p4, shadow (a parameter set of `stack.lua`), cost.
const ENTRY_VALUES: usize = 7;

/// The most values a batch sends as a stream of msgpack values rather than
/// as one array: Lua lets a C function return at most 8,000 (`LUAI_MAXCSTACK`).
const STREAM_MAX: usize = 4_000;

/// One `stack.lua` call deciding `batch` in order (the script's header has
/// the layout): the batch's distinct keys, those of windows and buckets
/// first (the script reads them with one `MGET`), then in msgpack its
/// distinct parameter sets (each sent once), the number of window
/// and bucket keys, and the decisions as key-and-set numbers and costs.
/// Each argument costs Redis about what a `GET` does and each `tonumber`
/// a `strtod`, so a batch sends one argument per distinct key and one
/// msgpack argument for everything else, its numbers as msgpack numbers.
fn batch_cmd<'a>(hash: &str, batch: impl Iterator<Item = &'a Args> + Clone) -> Cmd {
    let entries: usize = batch.clone().map(Args::keys).sum();
    // Distinct keys in first-seen order, with whether their state is a
    // string (window or bucket: algorithms 1, 2 and 4).
    let mut keys: Vec<(&str, bool)> = Vec::with_capacity(entries);
    let mut seen: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(entries);
    let mut sets: SmallVec<[[ParamValue<'_>; ENTRY_VALUES - 1]; 4]> = SmallVec::new();
    // Per entry: its key's and its set's indexes, and its cost.
    let mut list: Vec<(usize, usize, i64)> = Vec::with_capacity(entries);
    for args in batch.clone() {
        for j in 0..args.keys() {
            let base = 1 + j * ENTRY_VALUES;
            let set: [ParamValue<'_>; ENTRY_VALUES - 1] =
                std::array::from_fn(|v| args.value(base + v));
            let key = args.key(j);
            let k = *seen.entry(key).or_insert_with(|| {
                let string_state = matches!(set[0], ParamValue::Int(1 | 2 | 4));
                keys.push((key, string_state));
                keys.len() - 1
            });
            let s = sets.iter().position(|s| *s == set).unwrap_or_else(|| {
                sets.push(set);
                sets.len() - 1
            });
            let cost = match args.value(base + ENTRY_VALUES - 1) {
                ParamValue::Int(cost) => cost,
                _ => i64::MAX,
            };
            list.push((k, s, cost));
        }
    }
    // Key numbers (from 0): string-state keys first, each group in order.
    let mut number = vec![0_i64; keys.len()];
    let mut next = 0;
    for string_state in [true, false] {
        for (k, _) in keys
            .iter()
            .enumerate()
            .filter(|(_, (_, s))| *s == string_state)
        {
            number[k] = next;
            next += 1;
        }
    }
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(hash).arg(keys.len());
    for string_state in [true, false] {
        for (key, _) in keys.iter().filter(|(_, s)| *s == string_state) {
            cmd.arg(*key);
        }
    }
    // A decision of one entry is that entry; of n others, -n and them.
    let np = sets.len() as i64;
    let decisions: usize = batch
        .clone()
        .map(|a| if a.keys() == 1 { 2 } else { 1 + 2 * a.keys() })
        .sum();
    let values = 2 + sets.len() * (ENTRY_VALUES - 1) + decisions;
    let mut packed = Vec::with_capacity(5 + values * 5);
    // The values one after the other, which `cmsgpack.unpack` returns as
    // they are and the script gathers with one `{ … }`: building the table
    // element by element, as for an array, cost Redis as much as the rest
    // of a one-decision call's parsing. Past what a Lua C call may return,
    // one array.
    if values > STREAM_MAX {
        msgpack::array(&mut packed, values);
    }
    msgpack::int(&mut packed, np);
    for set in &sets {
        for value in set {
            msgpack::param(&mut packed, *value);
        }
    }
    let string_keys = keys.iter().filter(|(_, s)| *s).count();
    msgpack::int(&mut packed, string_keys as i64);
    let mut list = list.iter();
    for args in batch {
        if args.keys() != 1 {
            msgpack::int(&mut packed, -(args.keys() as i64));
        }
        for &(k, s, cost) in list.by_ref().take(args.keys()) {
            msgpack::int(&mut packed, number[k] * np + s as i64 + 1);
            msgpack::int(&mut packed, cost);
        }
    }
    cmd.arg(packed);
    cmd
}

/// The msgpack a batch is sent in (`stack.lua` reads it with
/// `cmsgpack.unpack`, no `tonumber` per value): integers, floats and
/// strings one after the other, behind an array header past
/// [`STREAM_MAX`] values.
mod msgpack {
    use super::ParamValue;

    /// A parameter: an integer, an interval as the float64 of its µs (the
    /// number `settle.lua` reads from its text), a string (a lease member).
    pub(super) fn param(out: &mut Vec<u8>, value: ParamValue<'_>) {
        match value {
            ParamValue::Int(v) => int(out, v),
            ParamValue::Interval(ps) => {
                out.push(0xcb);
                let micros = super::interval_micros(ps);
                out.extend_from_slice(&micros.to_bits().to_be_bytes());
            }
            ParamValue::Text(text) => string(out, text),
        }
    }

    /// A string (raw bytes).
    fn string(out: &mut Vec<u8>, text: &str) {
        let n = text.len();
        if n < 32 {
            out.push(0xa0 | n as u8);
        } else if let Ok(n) = u8::try_from(n) {
            out.extend_from_slice(&[0xd9, n]);
        } else if let Ok(n) = u16::try_from(n) {
            out.push(0xda);
            out.extend_from_slice(&n.to_be_bytes());
        } else {
            out.push(0xdb);
            out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
        }
        out.extend_from_slice(text.as_bytes());
    }

    /// An array header for `n` items.
    pub(super) fn array(out: &mut Vec<u8>, n: usize) {
        if n < 16 {
            out.push(0x90 | n as u8);
        } else if let Ok(n) = u16::try_from(n) {
            out.push(0xdc);
            out.extend_from_slice(&n.to_be_bytes());
        } else {
            out.push(0xdd);
            out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
        }
    }

    /// An integer, in its shortest form.
    pub(super) fn int(out: &mut Vec<u8>, v: i64) {
        if (0..128).contains(&v) {
            out.push(v as u8);
        } else if (-32..0).contains(&v) {
            out.push(v as i8 as u8);
        } else if v >= 0 {
            if let Ok(v) = u8::try_from(v) {
                out.extend_from_slice(&[0xcc, v]);
            } else if let Ok(v) = u16::try_from(v) {
                out.push(0xcd);
                out.extend_from_slice(&v.to_be_bytes());
            } else if let Ok(v) = u32::try_from(v) {
                out.push(0xce);
                out.extend_from_slice(&v.to_be_bytes());
            } else {
                out.push(0xcf);
                out.extend_from_slice(&(v as u64).to_be_bytes());
            }
        } else if let Ok(v) = i8::try_from(v) {
            out.extend_from_slice(&[0xd0, v as u8]);
        } else if let Ok(v) = i16::try_from(v) {
            out.push(0xd1);
            out.extend_from_slice(&v.to_be_bytes());
        } else if let Ok(v) = i32::try_from(v) {
            out.push(0xd2);
            out.extend_from_slice(&v.to_be_bytes());
        } else {
            out.push(0xd3);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

/// One Redis or a Redis Cluster; clones share the connection.
#[derive(Clone)]
enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connection {
    async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Single(c) => cmd.query_async(c).await,
            Connection::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// `SCRIPT LOAD` (on a cluster, on every primary).
    async fn load(&mut self, script: &redis::Script) -> RedisResult<()> {
        match self {
            Connection::Single(c) => script.load_async(c).await.map(drop),
            Connection::Cluster(c) => script.load_async(c).await.map(drop),
        }
    }
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
    pool: Box<[PoolShard]>,
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
            stack: redis::Script::new(STACK_LUA),
            settle: redis::Script::new(SETTLE_LUA),
            heartbeat: redis::Script::new(HEARTBEAT_LUA),
            nodes_listener: std::sync::OnceLock::new(),
            pool: (0..POOL_SHARDS).map(|_| PoolShard::default()).collect(),
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
            .spawn(move || runtime.block_on(supervise(weak, ready)))?;
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

    /// Renews this node's heartbeat; the live node count.
    async fn beat(&self) -> Result<u64, Unavailable> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.heartbeat.get_hash())
            .arg(1)
            .arg(format!("{}nodes", self.config.prefix))
            .arg(&self.node)
            .arg(HEARTBEAT_TTL.as_millis() as u64);
        match self.call(&self.heartbeat, &cmd).await? {
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(1).max(1)),
            _ => Err(Unavailable),
        }
    }

    fn pool_shard(&self, key: &str) -> &PoolShard {
        let i = slot_of(key) as usize % POOL_SHARDS;
        &self.pool[i]
    }

    /// Spends `cost` of this node's leased tokens for `e`, if it holds that
    /// many (and the lease has not lapsed); the tokens left.
    pub(crate) fn spend_leased(&self, e: &SharedEntry<'_>, cost: u64) -> Option<u64> {
        let key = self.key_of(e);
        let mut shard = self.pool_shard(&key).lock();
        let held = shard.get_mut(&key)?;
        if held.tokens < cost || held.expires <= std::time::Instant::now() {
            return None;
        }
        held.tokens -= cost;
        Some(held.tokens)
    }

    /// Puts back tokens [`RedisStore::spend_leased`] took for a request
    /// that the rest of its stack denied.
    pub(crate) fn unspend(&self, e: &SharedEntry<'_>, cost: u64) {
        let key = self.key_of(e);
        if let Some(held) = self.pool_shard(&key).lock().get_mut(&key) {
            held.tokens += cost;
        }
    }

    /// Keeps `tokens` leased for `e` for [`LEASE_HOLD`]; what is not spent
    /// by then goes back to the shared bucket.
    pub(crate) fn add_lease(&self, e: &SharedEntry<'_>, tokens: u64) {
        if tokens == 0 {
            return;
        }
        let key = self.key_of(e);
        let expires = std::time::Instant::now() + LEASE_HOLD;
        let mut shard = self.pool_shard(&key).lock();
        let held = shard.entry(key).or_insert_with(|| Leased {
            tokens: 0,
            expires,
            entry: OwnedEntry::from(e),
            fetching: false,
        });
        held.tokens += tokens;
        held.expires = expires;
    }

    /// Gives every unspent leased token back (a reload changes the limits).
    pub(crate) fn return_leases(self: &Arc<Self>) {
        let store = self.clone();
        self.runtime
            .spawn(async move { store.return_expired(true).await });
    }

    /// Gives back the unspent tokens of lapsed leases (of all, with `all`).
    async fn return_expired(&self, all: bool) {
        let now = std::time::Instant::now();
        let mut back: Vec<(OwnedEntry, u64)> = Vec::new();
        for shard in self.pool.iter() {
            shard.lock().retain(|_, held| {
                if all || held.expires <= now {
                    back.push((held.entry.clone(), held.tokens));
                    // Kept while its fetch is under way (the fetch ends it).
                    held.tokens = 0;
                    return held.fetching;
                }
                true
            });
        }
        let back: Vec<(SharedEntry<'_>, u64)> = back
            .iter()
            .filter(|(_, tokens)| *tokens > 0)
            .map(|(e, tokens)| (e.view(), *tokens))
            .collect();
        if !back.is_empty() {
            self.refund(&back).await;
        }
    }

    pub(crate) fn on_failure(&self) -> OnFailure {
        self.config.on_failure
    }

    /// The breaker is open: calls fail at once and `on_failure` applies.
    pub fn is_down(&self) -> bool {
        self.open.load(Ordering::Relaxed)
    }

    /// Decides `cost` against `entries` in one script call, all or nothing.
    /// On Redis Cluster, one call per hash slot, in stack order: a slot
    /// that denies ends the decision and the slots before it are refunded
    /// (see the README's "Distributed limits" for what that can cost).
    ///
    /// With `remember_denials`, an entry this thread remembers as denied
    /// denies without a call (the others are not decided: `None`, as after
    /// an earlier slot's denial), and the call's denials are remembered.
    pub(crate) async fn decide(
        self: &Arc<Self>,
        entries: &[SharedEntry<'_>],
    ) -> Result<SharedDecision, Unavailable> {
        let most = self.config.remember_denials;
        if most.is_zero() || !entries.iter().any(|e| e.remember) {
            return self.decide_leased(entries).await;
        }
        let epoch = self.epoch.load(Ordering::Relaxed);
        if let Some((i, verdict)) = remembered::recall(epoch, entries) {
            (self.signals.remembered)();
            let mut verdicts = smallvec::smallvec![None; entries.len()];
            verdicts[i] = Some(verdict);
            return Ok(SharedDecision {
                verdicts,
                leases: Vec::new(),
                taken: smallvec::smallvec![0; entries.len()],
            });
        }
        let asked = std::time::Instant::now();
        let decision = self.decide_leased(entries).await?;
        remembered::remember(epoch, entries, &decision.verdicts, asked, most);
        Ok(decision)
    }

    /// Every thread forgets the denials it remembers (a reload changes the
    /// limits).
    pub(crate) fn forget_denials(&self) {
        self.epoch.store(remembered::new_epoch(), Ordering::Relaxed);
    }

    /// [`RedisStore::decide`] without remembered denials. A leased token
    /// bucket takes a lease only when no other call of this node is taking
    /// one for it; otherwise this request takes its cost.
    async fn decide_leased(
        self: &Arc<Self>,
        entries: &[SharedEntry<'_>],
    ) -> Result<SharedDecision, Unavailable> {
        if entries.iter().all(|e| e.lease == 0) {
            return self.decide_stack(entries).await;
        }
        let mut entries: SmallVec<[SharedEntry<'_>; 4]> = entries.iter().copied().collect();
        let mut fetching = Fetching {
            store: self,
            keys: SmallVec::new(),
        };
        for e in entries.iter_mut().filter(|e| e.lease > 0) {
            let key = self.key_of(e);
            let mut shard = self.pool_shard(&key).lock();
            let held = shard.entry(key.clone()).or_insert_with(|| Leased {
                tokens: 0,
                expires: std::time::Instant::now() + LEASE_HOLD,
                entry: OwnedEntry::from(&*e),
                fetching: false,
            });
            if held.fetching {
                e.lease = 0;
            } else {
                held.fetching = true;
                fetching.keys.push(key);
            }
        }
        let decision = self.decide_stack(&entries).await;
        drop(fetching);
        decision
    }

    /// [`RedisStore::decide`], leases as given.
    async fn decide_stack(
        self: &Arc<Self>,
        entries: &[SharedEntry<'_>],
    ) -> Result<SharedDecision, Unavailable> {
        let mut decision = SharedDecision {
            verdicts: smallvec::smallvec![None; entries.len()],
            leases: Vec::new(),
            taken: smallvec::smallvec![0; entries.len()],
        };
        if !self.config.is_cluster() {
            let (verdicts, lease) = self.decide_group(entries).await?;
            for (i, (verdict, taken)) in verdicts.into_iter().enumerate() {
                decision.verdicts[i] = Some(verdict);
                decision.taken[i] = taken;
            }
            decision.leases.extend(lease);
            return Ok(decision);
        }
        // Group by slot, groups in the order of their first entry.
        let slots: Vec<u16> = entries.iter().map(|e| slot_of(&self.key_of(e))).collect();
        let mut order: Vec<u16> = Vec::new();
        for slot in &slots {
            if !order.contains(slot) {
                order.push(*slot);
            }
        }
        let mut charged: Vec<(SharedEntry<'_>, u64)> = Vec::new();
        for slot in order {
            let at: Vec<usize> = (0..entries.len()).filter(|&i| slots[i] == slot).collect();
            let group: Vec<SharedEntry<'_>> = at.iter().map(|&i| entries[i]).collect();
            let (verdicts, lease) = match self.decide_group(&group).await {
                Ok(answer) => answer,
                Err(error) => {
                    drop(decision.leases);
                    self.refund(&charged).await;
                    return Err(error);
                }
            };
            let admitted = group
                .iter()
                .zip(&verdicts)
                .all(|(e, (v, _))| v.allowed || e.shadow);
            for (&i, (verdict, taken)) in at.iter().zip(&verdicts) {
                decision.verdicts[i] = Some(*verdict);
                decision.taken[i] = *taken;
            }
            if !admitted {
                // This slot charged nothing; undo the slots before it.
                decision.leases.clear();
                decision.taken.iter_mut().for_each(|t| *t = 0);
                self.refund(&charged).await;
                return Ok(decision);
            }
            decision.leases.extend(lease);
            charged.extend(
                group
                    .iter()
                    .zip(&verdicts)
                    .filter(|(_, (v, _))| v.allowed)
                    .map(|(e, (_, taken))| (*e, *taken)),
            );
        }
        Ok(decision)
    }

    /// Gives back what every entry took (concurrency leases are
    /// released by dropping them). Awaited, so that a denied request's
    /// refunds are in before its answer.
    async fn refund(&self, charged: &[(SharedEntry<'_>, u64)]) {
        let refundable: Vec<(SharedEntry<'_>, u64)> = charged
            .iter()
            .filter(|(e, _)| !matches!(e.algorithm, Algorithm::Concurrency { .. }))
            .copied()
            .collect();
        let entries: Vec<SharedEntry<'_>> = refundable.iter().map(|(e, _)| *e).collect();
        for group in self.by_slot(&entries) {
            // The units each entry took (a lease's included).
            let amounts: Vec<i64> = group
                .iter()
                .map(|g| {
                    let taken = refundable
                        .iter()
                        .find(|(e, _)| self.key_of(e) == self.key_of(g))
                        .map_or(0, |(_, t)| *t);
                    -i64::try_from(taken).unwrap_or(i64::MAX)
                })
                .collect();
            let cmd = self.script_cmd(&self.settle, &group, |i| amounts[i], None);
            let _ = self.call(&self.settle, &cmd).await;
        }
    }

    /// `entries` in groups whose keys share a slot: one group on one Redis.
    fn by_slot<'e>(&self, entries: &[SharedEntry<'e>]) -> Vec<Vec<SharedEntry<'e>>> {
        if !self.config.is_cluster() {
            return vec![entries.to_vec()];
        }
        let mut groups: Vec<(u16, Vec<SharedEntry<'e>>)> = Vec::new();
        for e in entries {
            let slot = slot_of(&self.key_of(e));
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(*e),
                None => groups.push((slot, vec![*e])),
            }
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }

    /// One script call for entries that share a slot (all of them on one
    /// Redis).
    async fn decide_group(
        self: &Arc<Self>,
        entries: &[SharedEntry<'_>],
    ) -> Result<(Verdicts, Option<Lease>), Unavailable> {
        let member = entries
            .iter()
            .any(|e| matches!(e.algorithm, Algorithm::Concurrency { .. }))
            .then(|| {
                let n = self.sequence.fetch_add(1, Ordering::Relaxed);
                format!("{}:{n}", self.node)
            });
        let args = self.args(
            entries,
            |i| i64::try_from(entries[i].cost).unwrap_or(i64::MAX),
            member.as_deref(),
        );
        // On Cluster, batched with the thread's other decisions of the
        // group's slot (a group's keys share one).
        let slot = match self.config.is_cluster() {
            true if args.keys() > 0 => slot_of(args.key(0)),
            _ => 0,
        };
        let answer = self.batched(args, slot).await?;
        let verdicts =
            parse_verdicts(&answer, entries.iter().map(|e| e.cost)).ok_or_else(|| {
                tracing::warn!("unexpected answer from the redis stack script");
                self.failed();
                Unavailable
            })?;
        let admitted = entries
            .iter()
            .zip(&verdicts)
            .all(|(e, (v, _))| v.allowed || e.shadow);
        let lease = match member {
            Some(member) if admitted => {
                let held: Vec<OwnedEntry> = entries
                    .iter()
                    .zip(&verdicts)
                    .filter(|(e, (v, _))| {
                        matches!(e.algorithm, Algorithm::Concurrency { .. }) && v.allowed
                    })
                    .map(|(e, _)| OwnedEntry::from(e))
                    .collect();
                // A concurrency slot is charged in requests: each entry's
                // cost is the request's.
                let cost = entries
                    .iter()
                    .find(|e| matches!(e.algorithm, Algorithm::Concurrency { .. }))
                    .map_or(1, |e| e.cost);
                (!held.is_empty()).then(|| Lease::hold(self.clone(), held, member, cost))
            }
            _ => None,
        };
        Ok((verdicts, lease))
    }

    /// Post-response settlement: `delta` more units (or a refund) on every
    /// entry. Runs on the store thread; the response does not wait.
    pub(crate) fn settle(self: &Arc<Self>, entries: &[SharedEntry<'_>], delta: i64) {
        if delta == 0 || self.is_down() {
            return;
        }
        let cmds: Vec<Cmd> = self
            .by_slot(entries)
            .iter()
            .map(|group| self.script_cmd(&self.settle, group, |_| delta, None))
            .collect();
        let store = self.clone();
        self.runtime.spawn(async move {
            for cmd in &cmds {
                let _ = store.call(&store.settle, cmd).await;
            }
        });
    }

    /// [`RedisStore::settle`] for entries kept past their request (a token
    /// limit's settlement when its response ends).
    pub(crate) fn settle_owned(self: &Arc<Self>, entries: &[OwnedEntry], delta: i64) {
        let views: SmallVec<[SharedEntry<'_>; 4]> = entries.iter().map(OwnedEntry::view).collect();
        self.settle(&views, delta);
    }

    /// `EVALSHA <script> n keys… argv…` for `entries` (`settle.lua`).
    fn script_cmd(
        &self,
        script: &redis::Script,
        entries: &[SharedEntry<'_>],
        amount: impl Fn(usize) -> i64,
        member: Option<&str>,
    ) -> Cmd {
        eval_cmd(script.get_hash(), &self.args(entries, amount, member))
    }

    /// The keys of `entries`, then their number and 7 values each: a
    /// settlement as `settle.lua` takes it, or one decision, which
    /// [`batch_cmd`] lays out for `stack.lua`.
    fn args(
        &self,
        entries: &[SharedEntry<'_>],
        amount: impl Fn(usize) -> i64,
        member: Option<&str>,
    ) -> Args {
        let mut args = Args {
            text: String::with_capacity(entries.len() * 96),
            ..Args::default()
        };
        for e in entries {
            self.write_key(e, &mut args.text);
            args.end_key();
        }
        args.int(entries.len());
        for (i, e) in entries.iter().enumerate() {
            push_params(e, member.unwrap_or(""), &mut args);
            args.int(i64::from(e.shadow));
            args.int(amount(i));
        }
        args
    }

    /// `<prefix><limit>:{<digest>}:<algorithm>[:<plan>]`.
    fn key_of(&self, e: &SharedEntry<'_>) -> String {
        let mut key = String::with_capacity(self.config.prefix.len() + e.limit.len() + 48);
        self.write_key(e, &mut key);
        key
    }

    /// [`RedisStore::key_of`], written at the end of `key`.
    fn write_key(&self, e: &SharedEntry<'_>, key: &mut String) {
        let tag = match e.algorithm {
            Algorithm::FixedWindow { .. } => "fw",
            Algorithm::SlidingWindow { .. } => "sw",
            Algorithm::SlidingLog { .. } => "sl",
            Algorithm::TokenBucket { .. } => "tb",
            Algorithm::LeakyBucket { .. } => "lb",
            Algorithm::Concurrency { .. } => "cc",
        };
        let _ = write!(
            key,
            "{}{}:{{{:032x}}}:{tag}",
            self.config.prefix,
            e.limit,
            e.key.as_u128()
        );
        if let Some(plan) = e.plan {
            key.push(':');
            key.push_str(plan);
        }
    }

    /// One call, bounded by `timeout`, through the breaker; re-loads the
    /// script on `NOSCRIPT`.
    async fn call(&self, script: &redis::Script, cmd: &Cmd) -> Result<Value, Unavailable> {
        if self.is_down() {
            return Err(Unavailable);
        }
        match self.query(&self.thread_state(), script, cmd).await {
            Ok(value) => {
                self.failures.store(0, Ordering::Relaxed);
                Ok(value)
            }
            Err(Unavailable) => {
                self.failed();
                Err(Unavailable)
            }
        }
    }

    /// `cmd` on `state`'s connection, bounded by `timeout`; re-loads the
    /// script on `NOSCRIPT`. The caller counts the failure.
    async fn query(
        &self,
        state: &ThreadState,
        script: &redis::Script,
        cmd: &Cmd,
    ) -> Result<Value, Unavailable> {
        let result = tokio::time::timeout(self.config.timeout, async {
            let mut connection = state
                .connection
                .get_or_try_init(|| self.open())
                .await?
                .clone();
            let mut answer = connection.query(cmd).await;
            // NOSCRIPT: load and retry; a second flush may land between the
            // two (a test does that), so a few times, all within `timeout`.
            for _ in 0..3 {
                match &answer {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        connection.load(script).await?;
                        answer = connection.query(cmd).await;
                    }
                    _ => break,
                }
            }
            answer
        })
        .await;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                tracing::debug!(%error, "redis store call failed");
                Err(Unavailable)
            }
            Err(_) => {
                tracing::debug!(timeout = ?self.config.timeout, "redis store call timed out");
                Err(Unavailable)
            }
        }
    }

    /// One decision through this thread's batcher: sent at once when
    /// fewer than [`MAX_IN_FLIGHT`] calls for its `slot` are in flight on
    /// the thread's connection, else with every other decision of that
    /// slot that arrives meanwhile in the next call. Waits at most
    /// `timeout` in all; a failed batch fails each of its decisions, and
    /// each counts for the breaker as its own call would have.
    ///
    /// A decision that finds nothing waiting and a call free is sent from
    /// its own task: no sender task to start and no answer to pass on, two
    /// trips fewer through the worker's run queue, which a busy worker
    /// (a flood) makes long.
    async fn batched(self: &Arc<Self>, args: Args, slot: u16) -> Result<Answer, Unavailable> {
        if self.is_down() {
            return Err(Unavailable);
        }
        let state = self.thread_state();
        let alone = {
            let mut queues = state.queues.lock();
            let queue = queues.of(slot);
            let alone = queue.waiting.is_empty() && queue.senders < MAX_IN_FLIGHT;
            queue.senders += usize::from(alone);
            alone
        };
        if alone {
            let _sending = Sending {
                store: self,
                state: &state,
                slot,
            };
            return match self.call_batch(&state, std::iter::once(&args)).await {
                Some(mut answers) => Ok(answers.swap_remove(0)),
                None => {
                    self.failed();
                    Err(Unavailable)
                }
            };
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let start = {
            let mut queues = state.queues.lock();
            let queue = queues.of(slot);
            queue.waiting.push(Pending { args, reply });
            let start = queue.senders < MAX_IN_FLIGHT;
            queue.senders += usize::from(start);
            start
        };
        if start {
            tokio::spawn(send_batches(self.clone(), state, slot));
        }
        match tokio::time::timeout(self.config.timeout, answer).await {
            Ok(Ok(Ok(answer))) => Ok(answer),
            Ok(_) => {
                self.failed();
                Err(Unavailable)
            }
            Err(_) => {
                tracing::debug!(timeout = ?self.config.timeout, "redis store call timed out");
                self.failed();
                Err(Unavailable)
            }
        }
    }

    /// `batch` as one `stack.lua` call, each decision's answer sent back.
    async fn send_batch(&self, state: &ThreadState, batch: &mut Vec<Pending>) {
        match self.call_batch(state, batch.iter().map(|p| &p.args)).await {
            Some(answers) => {
                for (pending, answer) in batch.drain(..).zip(answers) {
                    // A caller that gave up (timeout, client gone) is not told.
                    let _ = pending.reply.send(Ok(answer));
                }
            }
            None => {
                for pending in batch.drain(..) {
                    let _ = pending.reply.send(Err(Unavailable));
                }
            }
        }
    }

    /// One `stack.lua` call for `batch`, each decision's answer in order;
    /// `None` when the call failed or its answer does not split exactly
    /// into the decisions' entries (2 or 4 integers each, see `stack.lua`).
    async fn call_batch<'a>(
        &self,
        state: &ThreadState,
        batch: impl Iterator<Item = &'a Args> + Clone,
    ) -> Option<Vec<Answer>> {
        if self.is_down() {
            return None;
        }
        let cmd = batch_cmd(self.stack.get_hash(), batch.clone());
        let answer = self.query(state, &self.stack, &cmd).await.ok()?;
        let answers: Option<Vec<Answer>> = match &answer {
            Value::Array(items) => {
                let mut items = items.iter();
                let answers: Option<Vec<Answer>> = batch
                    .map(|args| take_answer(&mut items, args.keys()))
                    .collect();
                answers.filter(|_| items.next().is_none())
            }
            _ => None,
        };
        match answers {
            Some(_) => self.failures.store(0, Ordering::Relaxed),
            None => tracing::warn!("unexpected answer from the redis stack script"),
        }
        answers
    }

    fn failed(&self) {
        (self.signals.error)();
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= FAILURES_TO_OPEN && !self.open.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                on_failure = ?self.config.on_failure,
                "redis store unavailable; on_failure applies until it answers again"
            );
            (self.signals.fallback)(true);
            self.wake.notify_one();
        }
    }

    /// This thread's connection and batcher, of the current generation.
    /// The connection is made on first use on this thread's runtime: its
    /// driver then runs beside the requests that use it, and a call costs
    /// no wake-up of another thread. All requests of the thread share it:
    /// a decision goes through the batcher, other calls are pipelined.
    fn thread_state(&self) -> Arc<ThreadState> {
        let id = self as *const RedisStore as usize;
        let generation = self.generation.load(Ordering::Acquire);
        THREAD_STATE.with(|held| {
            let mut held = held.borrow_mut();
            match &*held {
                Some((i, g, state)) if *i == id && *g == generation => state.clone(),
                // The probe that closed the breaker loaded the scripts
                // (NOSCRIPT reloads them otherwise): a plain connection
                // will do.
                _ => {
                    let state = Arc::new(ThreadState::default());
                    *held = Some((id, generation, state.clone()));
                    state
                }
            }
        })
    }

    /// A fresh connection with the scripts loaded, or why not.
    async fn connect(&self) -> RedisResult<Connection> {
        let mut connection = self.open().await?;
        connection.query(&redis::cmd("PING")).await?;
        connection.load(&self.stack).await?;
        connection.load(&self.settle).await?;
        connection.load(&self.heartbeat).await?;
        Ok(connection)
    }

    /// A fresh connection: to the one server, the cluster, or the master
    /// the sentinels name now (asked again each time, see `connect`).
    async fn open(&self) -> RedisResult<Connection> {
        let bound = self.config.timeout.max(Duration::from_millis(500));
        let config = &self.config;
        let login = |db| connect::Login {
            username: config.username.as_deref(),
            password: config.password.as_ref(),
            db,
        };
        let tls = config.tls.as_ref();
        let connection = match &config.servers {
            RedisServers::Cluster(urls) => {
                let mut builder =
                    redis::cluster::ClusterClient::builder(urls.iter().map(|u| u.address()))
                        .connection_timeout(bound)
                        .response_timeout(bound);
                if let Some(user) = &config.username {
                    builder = builder.username(user);
                }
                if let Some(password) = &config.password {
                    builder = builder.password(password.expose());
                }
                Connection::Cluster(builder.build()?.get_async_connection().await?)
            }
            RedisServers::One(url) => Connection::Single(
                connect::node(&url.host, url.port, tls, &login(url.db), bound, bound).await?,
            ),
            RedisServers::Sentinel {
                sentinels,
                master,
                password,
            } => Connection::Single(
                connect::master(
                    (sentinels, password.as_ref()),
                    master,
                    &self.sentinel,
                    tls,
                    &login(0),
                    bound,
                    bound,
                )
                .await?,
            ),
        };
        Ok(connection)
    }
}

/// Sends the decisions queued on `state` for `slot`, [`MAX_BATCH`] at a
/// time, one call in flight per sender, until none is left; the next
/// decision then starts a new sender.
async fn send_batches(store: Arc<RedisStore>, state: Arc<ThreadState>, slot: u16) {
    let mut batch: Vec<Pending> = Vec::new();
    loop {
        {
            let mut queues = state.queues.lock();
            let queue = queues.of(slot);
            // Callers that gave up are not decided: they were told
            // `Unavailable`, and a charge for them would be lost.
            queue.waiting.retain(|p| !p.reply.is_closed());
            if queue.waiting.is_empty() {
                queue.senders -= 1;
                if queue.senders == 0 {
                    queues.remove(slot);
                }
                return;
            }
            std::mem::swap(&mut queue.waiting, &mut batch);
            if batch.len() > MAX_BATCH {
                queue.waiting.extend(batch.drain(MAX_BATCH..));
            }
        }
        store.send_batch(&state, &mut batch).await;
    }
}

/// A call sent from a decision's own task ([`RedisStore::batched`]) holds
/// one of its slot's [`MAX_IN_FLIGHT`] calls; when it ends — answered, or
/// the request gone mid-call — the decisions that queued behind it go on in
/// a sender task, as behind any other call.
struct Sending<'a> {
    store: &'a Arc<RedisStore>,
    state: &'a Arc<ThreadState>,
    slot: u16,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        let mut queues = self.state.queues.lock();
        let queue = queues.of(self.slot);
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            // The sender takes this call's place among those in flight.
            Ok(runtime) if !queue.waiting.is_empty() => {
                drop(queues);
                runtime.spawn(send_batches(
                    self.store.clone(),
                    self.state.clone(),
                    self.slot,
                ));
            }
            // Nothing waits, or the runtime is gone (nothing will run).
            _ => {
                queue.senders -= 1;
                if queue.senders == 0 && queue.waiting.is_empty() {
                    queues.remove(self.slot);
                }
            }
        }
    }
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the
/// part inside the first `{…}`, when not empty) or of the whole key, mod
/// 16384.
pub(crate) fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(bytes) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// The store thread: connects, and reconnects whenever the breaker opens.
async fn supervise(store: std::sync::Weak<RedisStore>, ready: std::sync::mpsc::Sender<bool>) {
    let mut ready = Some(ready);
    let mut logged_down = false;
    // As last told to the nodes listener; 1 until a heartbeat says more.
    let mut live_nodes = 1;
    loop {
        let Some(s) = store.upgrade() else { return };
        if s.is_down() {
            let attempt = tokio::time::timeout(Duration::from_secs(2), s.connect()).await;
            match attempt {
                Ok(Ok(_probe)) => {
                    // Threads connect again, lazily, on their own runtimes.
                    s.generation.fetch_add(1, Ordering::AcqRel);
                    s.failures.store(0, Ordering::Relaxed);
                    s.open.store(false, Ordering::Relaxed);
                    (s.signals.fallback)(false);
                    if ready.take().is_some_and(|r| r.send(true).is_ok()) {
                        tracing::info!(redis = %s.config.servers, "redis store connected");
                    } else {
                        tracing::info!("redis store answers again; shared limits resumed");
                    }
                    logged_down = false;
                }
                // A failed probe is a failed call: a gateway that never
                // connects (a wrong CA or password) shows in the errors.
                failed => {
                    (s.signals.error)();
                    // Why, once per outage; the URLs print redacted.
                    if !logged_down {
                        let error = match failed {
                            Ok(Err(error)) => error.to_string(),
                            _ => "no answer within 2s".to_owned(),
                        };
                        tracing::warn!(redis = %s.config.servers, %error, "redis store cannot connect");
                        logged_down = true;
                    }
                }
            }
            if let Some(r) = ready.take_if(|_| s.is_down()) {
                let _ = r.send(false);
            }
            drop(s);
            tokio::time::sleep(PROBE_INTERVAL).await;
        } else {
            s.return_expired(false).await;
            if let Some(listener) = s.nodes_listener.get()
                && let Ok(nodes) = s.beat().await
                && nodes != live_nodes
            {
                live_nodes = nodes;
                listener(nodes);
            }
            // Also re-checked every second, so a dropped store ends the thread.
            let _ = tokio::time::timeout(HEARTBEAT_EVERY, s.wake.notified()).await;
        }
    }
}

/// The five per-entry script parameters (see `stack.lua`), times in µs,
/// pushed onto `args`.
fn push_params(e: &SharedEntry<'_>, member: &str, args: &mut Args) {
    let us = |n: Nanos| (n / 1_000).max(1);
    // The emission interval T = per / tokens, counted in ps and rounded,
    // in integers: the scripts take it in µs with six decimals.
    let interval = |args: &mut Args, per: Nanos, tokens: u64| {
        let tokens = u128::from(tokens.max(1));
        let ps = (u128::from(per) * 1_000 + tokens / 2) / tokens;
        args.values.push(Param::Interval(ps));
    };
    match e.algorithm {
        Algorithm::FixedWindow { limit, window } => {
            let (jitter, first) = match e.align {
                WindowAlign::Epoch { jitter } if jitter > 0 => {
                    // As in memory: the digest's high half picks the offset.
                    let hi = (e.key.as_u128() >> 64) as u64;
                    ((hi % jitter) / 1_000, 0)
                }
                WindowAlign::Epoch { .. } => (0, 0),
                WindowAlign::FirstRequest => (0, 1),
            };
            args.int(1);
            args.int(limit);
            args.int(us(window));
            args.int(jitter);
            args.int(first);
        }
        Algorithm::SlidingWindow { limit, window } | Algorithm::SlidingLog { limit, window } => {
            let code = if matches!(e.algorithm, Algorithm::SlidingWindow { .. }) {
                2
            } else {
                3
            };
            args.int(code);
            args.int(limit);
            args.int(us(window));
            args.int(0);
            args.int(0);
        }
        Algorithm::TokenBucket { capacity, refill } => {
            args.int(4);
            args.int(capacity);
            interval(args, refill.per, refill.tokens);
            args.int(0);
            args.int(e.lease.min(capacity));
        }
        Algorithm::LeakyBucket {
            capacity,
            rate,
            mode,
        } => {
            args.int(4);
            args.int(capacity.saturating_add(1));
            interval(args, rate.per, rate.tokens);
            args.int(u8::from(mode == LeakyMode::Delay));
            args.int(0);
        }
        Algorithm::Concurrency { max } => {
            args.int(5);
            args.int(max);
            args.int(LEASE.as_millis());
            args.text_value(member);
            args.int(0);
        }
    }
}

/// One decision's answer from `items`: per entry of its `entries`, 2
/// integers, or 4 when the first has its `more` bit (see `stack.lua`);
/// `None` when they are not integers or run out.
fn take_answer<'v>(items: &mut impl Iterator<Item = &'v Value>, entries: usize) -> Option<Answer> {
    let mut next = || match items.next() {
        Some(Value::Int(i)) => Some(*i),
        _ => None,
    };
    let mut answer = Answer::new();
    for _ in 0..entries {
        let head = next()?;
        answer.push(head);
        answer.push(next()?);
        if head & 2 != 0 {
            answer.push(next()?);
            answer.push(next()?);
        }
    }
    Some(answer)
}

/// An answer (see `stack.lua`) into verdicts and the units taken, one per
/// entry of the given costs; `None` unless it is exactly that.
fn parse_verdicts(answer: &[i64], costs: impl Iterator<Item = u64>) -> Option<Verdicts> {
    let ns = |us: i64| u64::try_from(us).unwrap_or(0).saturating_mul(1_000);
    let mut at = answer.iter().copied();
    let mut verdicts = Verdicts::new();
    for cost in costs {
        let head = at.next()?;
        let reset = at.next()?;
        let allowed = head & 1 == 1;
        // Without `more`: no retry or delay, and the cost taken if admitted.
        let (third, taken) = if head & 2 != 0 {
            (at.next()?, u64::try_from(at.next()?).unwrap_or(0))
        } else {
            (0, if allowed { cost } else { 0 })
        };
        let remaining = u64::try_from(head >> 2).unwrap_or(0);
        let verdict = if allowed {
            Verdict {
                delay: ns(third),
                ..Verdict::allow(remaining, ns(reset))
            }
        } else {
            Verdict::deny(remaining, ns(reset), ns(third), third < 0)
        };
        verdicts.push((verdict, taken));
    }
    at.next().is_none().then_some(verdicts)
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

/// Concurrency slots held in Redis by one admitted request: renewed while
/// held, removed when dropped (the response body ended).
#[derive(Debug)]
pub(crate) struct Lease {
    renew: tokio::task::JoinHandle<()>,
    release: Option<(Arc<RedisStore>, Cmd)>,
}

impl Lease {
    fn hold(store: Arc<RedisStore>, held: Vec<OwnedEntry>, member: String, cost: u64) -> Lease {
        let views: Vec<SharedEntry<'_>> = held.iter().map(OwnedEntry::view).collect();
        // A positive delta renews a lease, a negative one removes it
        // (`settle.lua`).
        let renew_cmd = store.script_cmd(&store.settle, &views, |_| cost as i64, Some(&member));
        let release_cmd =
            store.script_cmd(&store.settle, &views, |_| -(cost as i64), Some(&member));
        drop(views);
        let renewer = store.clone();
        let renew = store.runtime.spawn(async move {
            let period = LEASE / 3;
            loop {
                tokio::time::sleep(period).await;
                let _ = renewer.call(&renewer.settle, &renew_cmd).await;
            }
        });
        Lease {
            renew,
            release: Some((store, release_cmd)),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renew.abort();
        if let Some((store, cmd)) = self.release.take() {
            let runtime = store.runtime.clone();
            runtime.spawn(async move {
                let _ = store.call(&store.settle, &cmd).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{NANOS_PER_SEC, Rate};

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // `CLUSTER KEYSLOT foo` is 12182; a hash tag takes only its content.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("tollgate:a:{foo}:fw"), 12182);
        assert_eq!(slot_of("tollgate:b:{foo}:tb:pro"), 12182);
        // An empty tag does not count: the whole key is hashed.
        assert_ne!(slot_of("{}foo"), slot_of("{}bar"));
    }

    #[test]
    fn verdicts_parse_two_or_four_integers_per_entry() {
        // Admitted, 4 left, cost taken; denied with a retry (more); admitted
        // with a lease of 7 (more).
        let answer = Value::Array(
            [4 * 4 + 1, 2_000, 2, 9_000, 3_000, 0, 3 * 4 + 3, 1_000, 0, 7]
                .into_iter()
                .map(Value::Int)
                .collect(),
        );
        let Value::Array(items) = &answer else {
            unreachable!()
        };
        let taken = take_answer(&mut items.iter(), 3).expect("three entries");
        assert_eq!(taken.len(), 10);
        let parsed = parse_verdicts(&taken, [5, 2, 1].into_iter()).expect("parses");
        assert_eq!(parsed[0], (Verdict::allow(4, 2_000_000), 5));
        assert_eq!(
            parsed[1],
            (Verdict::deny(0, 9_000_000, 3_000_000, false), 0)
        );
        assert_eq!(parsed[2], (Verdict::allow(3, 1_000_000), 7));
        assert!(
            parse_verdicts(&taken, [1, 1].into_iter()).is_none(),
            "an answer longer than its entries is refused"
        );
        assert!(
            parse_verdicts(&taken, [1, 1, 1, 1].into_iter()).is_none(),
            "a short answer is refused"
        );
        assert!(
            take_answer(&mut items.iter(), 4).is_none(),
            "an answer that runs out is refused"
        );
        let odd = [Value::Int(1), Value::Nil];
        assert!(
            take_answer(&mut odd.iter(), 1).is_none(),
            "a non-integer is refused"
        );
        let never = [2, 0, -1, 0];
        assert!(
            parse_verdicts(&never, [1].into_iter()).expect("parses")[0]
                .0
                .never
        );
    }

    /// The values `push_params` gives `e`, in the text `settle.lua` gets.
    fn params(e: &SharedEntry<'_>) -> Vec<String> {
        let mut args = Args::default();
        push_params(e, "", &mut args);
        (0..args.values.len())
            .map(|i| match args.value(i) {
                ParamValue::Int(v) => v.to_string(),
                ParamValue::Interval(ps) => interval_text(ps),
                ParamValue::Text(text) => text.to_owned(),
            })
            .collect()
    }

    #[test]
    fn script_parameters_are_microseconds_and_exact_intervals() {
        let e = SharedEntry {
            limit: "l",
            plan: None,
            algorithm: Algorithm::TokenBucket {
                capacity: 20,
                refill: Rate {
                    tokens: 3,
                    per: NANOS_PER_SEC,
                },
            },
            align: WindowAlign::default(),
            key: LimitKey::from_u128(7),
            shadow: false,
            lease: 100,
            cost: 1,
            remember: false,
        };
        // T = 1 s / 3; a lease is capped at the capacity.
        assert_eq!(params(&e), ["4", "20", "333333.333333", "0", "20"]);
        // 2 s / 3 = 666666.666666… µs: rounded to the nearest ps.
        let two_thirds = SharedEntry {
            algorithm: Algorithm::TokenBucket {
                capacity: 20,
                refill: Rate {
                    tokens: 3,
                    per: 2 * NANOS_PER_SEC,
                },
            },
            ..e
        };
        assert_eq!(params(&two_thirds)[2], "666666.666667");
        let e = SharedEntry {
            algorithm: Algorithm::FixedWindow {
                limit: 5,
                window: 60 * NANOS_PER_SEC,
            },
            align: WindowAlign::FirstRequest,
            ..e
        };
        assert_eq!(params(&e), ["1", "5", "60000000", "0", "1"]);
    }

    /// A decision's [`Args`]: its keys, then its entries' sets and costs,
    /// each value as its text spells it (an interval has a decimal point).
    fn decision(entries: &[(&str, [&str; 6], i64)]) -> Args {
        let mut args = Args::default();
        for (key, _, _) in entries {
            args.text.push_str(key);
            args.end_key();
        }
        args.int(entries.len());
        for (_, set, cost) in entries {
            for value in set {
                if let Some((us, frac)) = value.split_once('.') {
                    let ps = us.parse::<u128>().unwrap_or(0) * 1_000_000
                        + frac.parse::<u128>().unwrap_or(0);
                    args.values.push(Param::Interval(ps));
                } else if let Ok(v) = value.parse::<i64>() {
                    args.int(v);
                } else {
                    args.text_value(value);
                }
            }
            args.int(*cost);
        }
        args
    }

    fn words(cmd: &Cmd) -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_batch_sends_distinct_keys_sets_once_and_packed_decisions() {
        let bucket = ["4", "10", "1000.000000", "0", "0", "0"];
        let window = ["1", "5", "60000000", "0", "0", "0"];
        let lease = ["5", "3", "30000", "m1", "0", "0"];
        let a = decision(&[("kc", lease, 1), ("kb", bucket, 1)]);
        let b = decision(&[("kw", window, 300)]);
        let c = decision(&[("kb", bucket, 2)]);
        let cmd = batch_cmd("sha", [&a, &b, &c].into_iter());
        let mut expected: Vec<Vec<u8>> = ["EVALSHA", "sha", "3", "kb", "kw", "kc"]
            .iter()
            .map(|w| w.as_bytes().to_vec())
            .collect();
        // 2 + 3 sets * 6 + 9 = 29 msgpack values: 3 sets, each set's
        // values as numbers (the interval a float64, the member a string),
        // two string keys (kb, kw), then the decisions. Key numbers: kb 0,
        // kw 1, kc 2; sets: lease 0, bucket 1, window 2; e = key * 3 + set + 1.
        let mut packed = vec![3];
        packed.extend([5, 3, 0xcd, 0x75, 0x30, 0xa2, b'm', b'1', 0, 0]);
        packed.extend([4, 10, 0xcb]);
        packed.extend(1000.0_f64.to_bits().to_be_bytes());
        packed.extend([0, 0, 0]);
        packed.extend([1, 5, 0xce]);
        packed.extend(60_000_000_u32.to_be_bytes());
        packed.extend([0, 0, 0]);
        packed.extend([
            2,    // string keys
            0xfe, // -2 entries,
            7,    // kc, lease
            1, 2, // kb, bucket
            1, 6, // one entry: kw, window, cost 300 as uint16
            0xcd, 1, 44, 2, // one entry: kb, bucket
            2,
        ]);
        expected.push(packed);
        assert_eq!(words(&cmd), expected);
    }

    #[test]
    fn a_batch_too_long_for_a_lua_stack_is_one_array() {
        let bucket = ["4", "10", "1000.000000", "0", "0", "0"];
        let keys: Vec<String> = (0..2_000).map(|i| format!("k{i}")).collect();
        let entries: Vec<(&str, [&str; 6], i64)> =
            keys.iter().map(|k| (k.as_str(), bucket, 1)).collect();
        let big = decision(&entries);
        let cmd = batch_cmd("sha", std::iter::once(&big));
        let packed = words(&cmd).pop().unwrap_or_default();
        // 2 + 6 + 1 + 2 * 2,000 values: an array16 of 4,009.
        assert_eq!(packed[..3], [0xdc, 0x0f, 0xa9]);
        let small = decision(&entries[..10]);
        let packed = words(&batch_cmd("sha", std::iter::once(&small)))
            .pop()
            .unwrap_or_default();
        assert_eq!(packed[0], 1, "a stream, its first value the set count");
    }

    #[test]
    fn parameters_travel_as_the_numbers_the_scripts_read() {
        let packed = |value: ParamValue<'_>| {
            let mut out = Vec::new();
            msgpack::param(&mut out, value);
            out
        };
        assert_eq!(packed(ParamValue::Int(12)), [12]);
        assert_eq!(packed(ParamValue::Int(-1)), [0xff]);
        let mut half = vec![0xcb];
        half.extend(0.5_f64.to_bits().to_be_bytes());
        assert_eq!(packed(ParamValue::Interval(500_000)), half);
        assert_eq!(
            packed(ParamValue::Text("node-1:7")),
            [0xa8, b'n', b'o', b'd', b'e', b'-', b'1', b':', b'7']
        );
        let long = "m".repeat(40);
        assert_eq!(&packed(ParamValue::Text(&long))[..2], [0xd9, 40]);
        // An interval is the double strtod makes of its text, which
        // settle.lua reads: the same bucket in both scripts. Thirds,
        // sevenths and a day per token (past 2^53 ps) included.
        let day = 86_400 * 1_000_000_000_000_u128;
        for ps in [
            1,
            333_333_333,
            666_666_667,
            142_857_143,
            1 << 53,
            day,
            day / 7 + 1,
        ]
        .into_iter()
        .chain((0..2_000).map(|i| 1_000_003 * i * i + 7 * i))
        .chain((0..200).map(|i| (1 << 53) - 100 + i * 999_999_937))
        {
            let text: f64 = interval_text(ps).parse().expect("a number");
            assert_eq!(interval_micros(ps).to_bits(), text.to_bits(), "{ps} ps");
        }
    }

    #[test]
    fn msgpack_integers_take_their_shortest_form() {
        let packed = |v: i64| {
            let mut out = Vec::new();
            msgpack::int(&mut out, v);
            out
        };
        assert_eq!(packed(0), [0]);
        assert_eq!(packed(127), [0x7f]);
        assert_eq!(packed(128), [0xcc, 0x80]);
        assert_eq!(packed(-1), [0xff]);
        assert_eq!(packed(-32), [0xe0]);
        assert_eq!(packed(-33), [0xd0, 0xdf]);
        assert_eq!(packed(65_536), [0xce, 0, 1, 0, 0]);
        assert_eq!(packed(i64::MAX)[0], 0xcf);
        assert_eq!(packed(i64::MIN)[0], 0xd3);
        let mut out = Vec::new();
        msgpack::array(&mut out, 16);
        assert_eq!(out, [0xdc, 0, 16]);
    }
}
