//! `[limits.NAME]`: what a limit counts requests by (its key parts), its
//! algorithm and parameters (per plan too), and what it does when denied,
//! keyless, leased from the shared store or aligned to the calendar. The
//! section's serde mirror, validated types and checks; [`references`]
//! resolves the lists of limit names that routes and descriptor rules
//! hold.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, StatusCode};
use serde::Deserialize;

use super::amount::Amount;
use super::checker::Checker;
use super::error::{KeyPath, nearest};
use super::raw::OneOrMany;
use super::server::{HeaderStyles, header_styles};
use super::slots::{self, RawQueue, RawReserve};
use super::tokens;
use super::units::{parse_duration, parse_rate};
use crate::limit::{Algorithm, LeakyMode, Nanos, QueueParams, Reserve, WindowAlign};

/// A `[limits.NAME]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimit {
    /// Absent only for a limit that `[[decision.descriptors]]` rules alone
    /// use: their entries' values are its key.
    #[serde(default)]
    pub(crate) key: OneOrMany<String>,
    pub(crate) algorithm: String,
    /// Exact decimals: dollars for a `unit = "usd"` limit, whole
    /// otherwise.
    pub(crate) limit: Option<Amount>,
    pub(crate) window: Option<String>,
    pub(crate) capacity: Option<Amount>,
    pub(crate) refill: Option<String>,
    pub(crate) rate: Option<String>,
    pub(crate) mode: Option<String>,
    /// A token bucket's `wait`: how long a request may be held instead of
    /// refused.
    pub(crate) wait: Option<String>,
    pub(crate) max: Option<u64>,
    /// `adaptive`: the least and the starting limit (`max` is shared with
    /// `concurrency`).
    pub(crate) min: Option<u64>,
    pub(crate) initial: Option<u64>,
    pub(crate) shadow: Option<bool>,
    pub(crate) status: Option<u16>,
    pub(crate) on_missing_key: Option<String>,
    pub(crate) local: Option<bool>,
    /// Token leasing from a shared (Redis) token bucket.
    pub(crate) lease: Option<u64>,
    pub(crate) headers: Option<Vec<String>>,
    pub(crate) max_keys: Option<u64>,
    pub(crate) plans: Option<BTreeMap<String, RawPlan>>,
    pub(crate) align: Option<String>,
    pub(crate) reset_jitter: Option<String>,
    /// `"requests"` (the default), `"tokens"` or `"usd"`.
    pub(crate) unit: Option<String>,
    /// A usd limit's warning threshold (`warn_at = "80%"`).
    pub(crate) warn_at: Option<String>,
    /// Slot limits: what a sheddable request may not take (`slots.rs`).
    pub(crate) reserve: Option<RawReserve>,
    /// Slot limits: wait for a slot instead of being refused.
    pub(crate) queue: Option<RawQueue>,
}

/// Per-plan values of a limit's algorithm parameters (a per-key
/// override's too, `PUT /limits/NAME/overrides`).
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPlan {
    pub(crate) limit: Option<Amount>,
    pub(crate) window: Option<String>,
    pub(crate) capacity: Option<Amount>,
    pub(crate) refill: Option<String>,
    pub(crate) rate: Option<String>,
    pub(crate) max: Option<u64>,
    /// Not a plan's: a limit's own `min` and `initial`, carried here so that
    /// one check says which algorithm takes them.
    #[serde(skip)]
    pub(crate) min: Option<u64>,
    #[serde(skip)]
    pub(crate) initial: Option<u64>,
}

impl RawPlan {
    /// Each algorithm parameter's key, and whether this plan sets it.
    pub(crate) fn present(&self) -> [(&'static str, bool); 8] {
        [
            ("limit", self.limit.is_some()),
            ("window", self.window.is_some()),
            ("capacity", self.capacity.is_some()),
            ("refill", self.refill.is_some()),
            ("rate", self.rate.is_some()),
            ("max", self.max.is_some()),
            ("min", self.min.is_some()),
            ("initial", self.initial.is_some()),
        ]
    }

    /// The parameter keys this plan sets.
    pub(crate) fn keys(&self) -> Vec<&'static str> {
        self.present()
            .into_iter()
            .filter_map(|(key, present)| present.then_some(key))
            .collect()
    }

    /// `self` over `base`: the plan's values win.
    pub(crate) fn over(&self, base: &RawPlan) -> RawPlan {
        RawPlan {
            limit: self.limit.or(base.limit),
            window: self.window.clone().or_else(|| base.window.clone()),
            capacity: self.capacity.or(base.capacity),
            refill: self.refill.clone().or_else(|| base.refill.clone()),
            rate: self.rate.clone().or_else(|| base.rate.clone()),
            max: self.max.or(base.max),
            min: self.min.or(base.min),
            initial: self.initial.or(base.initial),
        }
    }
}

impl RawLimit {
    /// The algorithm parameters of the limit itself.
    pub(crate) fn params(&self) -> RawPlan {
        RawPlan {
            limit: self.limit,
            window: self.window.clone(),
            capacity: self.capacity,
            refill: self.refill.clone(),
            rate: self.rate.clone(),
            max: self.max,
            min: self.min,
            initial: self.initial,
        }
    }
}

/// What a limit counts requests by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    Ip,
    Header(HeaderName),
    Query(String),
    Cookie(String),
    BodyField(String),
    Consumer,
    Tenant,
    Route,
    /// `jwt:CLAIM`: a claim of the caller's verified token, by its slot in
    /// `JwtConfig::claim_paths` (`config::jwt`) (the path is kept for messages).
    Claim {
        slot: usize,
        path: Arc<str>,
    },
}

/// What a limit does with a request that lacks its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum OnMissingKey {
    Skip,
    Deny,
    Shared,
}

/// A `[limits.NAME]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitConfig {
    pub name: String,
    /// The parts of the key, joined into one composite key.
    pub key: Vec<KeyPart>,
    pub algorithm: Algorithm,
    pub(crate) shadow: bool,
    pub(crate) status: StatusCode,
    pub(crate) on_missing_key: OnMissingKey,
    pub(crate) local: bool,
    pub(crate) headers: Option<HeaderStyles>,
    /// Most keys held in memory for this limit.
    pub(crate) max_keys: usize,
    /// Per-plan parameters (same algorithm kind), chosen by the consumer's plan.
    pub(crate) plans: Vec<(Arc<str>, Algorithm)>,
    /// Fixed windows of a day or longer: where each key's boundaries fall.
    pub(crate) align: WindowAlign,
    /// A shared token bucket: tokens a node takes from Redis at a time and
    /// spends locally (`lease = N`); `None` without leasing.
    pub(crate) lease: Option<u64>,
    /// What it counts: requests (charged `cost`), tokens, or micro-dollars.
    pub(crate) unit: tokens::Unit,
    /// A usd limit's `warn_at`: answers say `X-Budget-Warning` once this
    /// much of it is spent.
    pub(crate) warn_at: Option<tokens::WarnAt>,
    /// Slot limits: the part a sheddable request may not take.
    pub(crate) reserve: Reserve,
    /// Slot limits: the waiting line (`queue = {...}`), if any.
    pub(crate) queue: Option<QueueConfig>,
    /// The algorithm parameters as written, which a per-key override's
    /// values are merged over before the same check ([`check_override`]).
    pub(crate) params: RawPlan,
}

/// Default per-limit cap on live keys; see `limit::memory` for what happens
/// when it is reached.
pub(crate) const DEFAULT_MAX_KEYS: usize = 1_000_000;

const ALGORITHMS: [&str; 7] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "leaky_bucket",
    "concurrency",
    "adaptive",
];

/// Every `[limits.NAME]`, in name order (routes and rules refer to them by
/// index). `shared`: whether a shared store is configured, which leases
/// are taken from.
pub(super) fn check_limits(
    c: &mut Checker,
    path: &KeyPath,
    raw: &BTreeMap<String, RawLimit>,
    shared: bool,
) -> Vec<LimitConfig> {
    let limits: Vec<LimitConfig> = raw
        .iter()
        .map(|(name, l)| check_limit(c, &path.key(name), name, l))
        .collect();
    if !shared {
        // Leases are taken from the shared store: without one, say so
        // rather than ignore the setting.
        for limit in limits.iter().filter(|l| l.lease.is_some()) {
            c.problem(
                path.key(&limit.name).key("lease"),
                "leases are taken from a shared store: set store.backend = \"redis\", or remove `lease`",
            );
        }
    }
    limits
}

pub(super) fn check_key_part(c: &mut Checker, path: KeyPath, text: &str) -> Option<KeyPart> {
    let (kind, name) = match text.split_once(':') {
        Some((kind, name)) => (kind, Some(name)),
        None => (text, None),
    };
    let named = |c: &mut Checker, name: Option<&str>| -> Option<String> {
        match name {
            Some(n) if !n.is_empty() => Some(n.to_owned()),
            _ => {
                c.problem(
                    path.clone(),
                    format!(
                        "`{text}` needs a name after the colon, like \"{kind}:{}\"",
                        if kind == "jwt" { "sub" } else { "x-api-key" }
                    ),
                );
                None
            }
        }
    };
    match kind {
        "jwt" => {
            let name = named(c, name)?;
            if !claim_path_is_valid(&name) {
                c.problem(
                    path,
                    format!("`{name}` is not a claim name or dotted path like \"org.id\""),
                );
                return None;
            }
            let slot = match c.claim_paths.iter().position(|p| **p == *name) {
                Some(slot) => slot,
                None => {
                    c.claim_paths.push(Arc::from(name.as_str()));
                    c.claim_paths.len() - 1
                }
            };
            Some(KeyPart::Claim {
                slot,
                path: c.claim_paths[slot].clone(),
            })
        }
        "ip" | "consumer" | "tenant" | "route" if name.is_some() => {
            c.problem(path, format!("`{kind}` takes no name; write \"{kind}\""));
            None
        }
        "ip" => Some(KeyPart::Ip),
        "consumer" => Some(KeyPart::Consumer),
        "tenant" => Some(KeyPart::Tenant),
        "route" => Some(KeyPart::Route),
        "header" => {
            let name = named(c, name)?;
            c.header_name(path, &name).map(KeyPart::Header)
        }
        "query" => named(c, name).map(KeyPart::Query),
        "cookie" => named(c, name).map(KeyPart::Cookie),
        "body" => named(c, name).map(KeyPart::BodyField),
        _ => {
            let kinds = [
                "ip", "header", "query", "cookie", "body", "consumer", "tenant", "route", "jwt",
            ];
            let mut message = format!(
                "unknown key kind `{kind}`, expected one of ip, header:NAME, query:NAME, cookie:NAME, body:FIELD, jwt:CLAIM, consumer, tenant, route"
            );
            if let Some(best) = nearest(kind, kinds) {
                message.push_str(&format!(" (did you mean `{best}`?)"));
            } else if name.is_none() && HeaderName::from_bytes(text.as_bytes()).is_ok() {
                // `key = "x-api-key"`: a header name without its kind.
                message.push_str(&format!(
                    "; to key on a request header, write \"header:{}\"",
                    text.to_ascii_lowercase()
                ));
            }
            c.problem(path, message);
            None
        }
    }
}

fn check_limit(c: &mut Checker, path: &KeyPath, name: &str, raw: &RawLimit) -> LimitConfig {
    if name.is_empty() || crate::http::structured::check_string(name).is_err() {
        c.problem(
            path.clone(),
            "a limit's name must be printable ASCII: it is sent in RateLimit headers",
        );
    }
    // No key at all: a limit for `[[decision.descriptors]]` only, checked
    // with the rules that use it (`check_keyless`).
    let count = raw.key.0.len();
    let key: Vec<KeyPart> = raw
        .key
        .0
        .iter()
        .enumerate()
        .filter_map(|(i, text)| check_key_part(c, path.element("key", count, i), text))
        .collect();

    let base = raw.params();
    let mode = mode_of(c, path, raw);
    let wait = wait_of(c, path, raw);
    // Its numbers are read in its unit (dollars as micro-dollars).
    let unit = tokens::unit_named(raw.unit.as_deref());
    let algorithm = check_algorithm(c, &raw.algorithm, &base, (mode, wait, unit), &|key| {
        path.key(key)
    });
    let mut plans = Vec::new();
    for (plan, values) in raw.plans.iter().flatten() {
        let plan_path = path.key("plans").key(plan);
        let merged = values.over(&base);
        let set = values.keys();
        let at = |key: &str| {
            if set.contains(&key) {
                plan_path.key(key)
            } else {
                path.key(key)
            }
        };
        plans.push((
            Arc::from(plan.as_str()),
            check_algorithm(c, &raw.algorithm, &merged, (mode, wait, unit), &at),
        ));
    }
    let adaptive = matches!(algorithm, Algorithm::Adaptive { .. });
    if adaptive {
        check_adaptive_extras(c, path, raw);
    }
    // An adaptive limit refuses because the upstream is full, not because
    // the client is too fast: 503 (contract §12).
    let default_status = match adaptive {
        true => StatusCode::SERVICE_UNAVAILABLE,
        false => StatusCode::TOO_MANY_REQUESTS,
    };
    let status = match raw.status {
        None => default_status,
        Some(code) => match StatusCode::from_u16(code) {
            Ok(s) if (400..600).contains(&code) => s,
            _ => {
                c.problem(
                    path.key("status"),
                    format!("`{code}` is not an error status; expected 400-599"),
                );
                default_status
            }
        },
    };
    let on_missing_key = match raw.on_missing_key.as_deref() {
        None => OnMissingKey::Skip,
        Some(text) => match c.one_of(
            path.key("on_missing_key"),
            text,
            &["skip", "deny", "shared"],
        ) {
            Some("deny") => OnMissingKey::Deny,
            Some("shared") => OnMissingKey::Shared,
            _ => OnMissingKey::Skip,
        },
    };
    let headers = raw
        .headers
        .as_ref()
        .map(|names| header_styles(c, path.key("headers"), names));
    let max_keys = match raw.max_keys {
        Some(0) => {
            c.problem(path.key("max_keys"), "must be at least 1");
            DEFAULT_MAX_KEYS
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => DEFAULT_MAX_KEYS,
    };
    LimitConfig {
        name: name.to_owned(),
        key,
        algorithm,
        shadow: raw.shadow.unwrap_or(false),
        status,
        on_missing_key,
        // Adaptive: always node-local, each node measuring its own traffic.
        local: adaptive || raw.local.unwrap_or(false),
        lease: check_lease(c, path, raw, &algorithm),
        unit: tokens::check_unit(c, path, raw.unit.as_deref(), &algorithm),
        warn_at: tokens::check_warn_at(c, path, raw.warn_at.as_deref(), unit),
        headers,
        max_keys,
        reserve: slots::check_reserve(
            c,
            path.key("reserve"),
            raw.reserve.as_ref(),
            &algorithm,
            &plans.iter().map(|(_, a)| *a).collect::<Vec<_>>(),
        ),
        queue: check_queue(c, path.key("queue"), raw.queue.as_ref(), &algorithm),
        plans,
        align: check_align(c, path, raw, &algorithm),
        params: base,
    }
}

/// What an `adaptive` limit cannot have beside its parameters: plans (its
/// limit follows the upstream, not the caller) and `local = false` (it is
/// always node-local).
fn check_adaptive_extras(c: &mut Checker, path: &KeyPath, raw: &RawLimit) {
    if raw.plans.as_ref().is_some_and(|plans| !plans.is_empty()) {
        c.problem(
            path.key("plans"),
            "adaptive follows the upstream's capacity, not the caller's plan: plans do not apply",
        );
    }
    if raw.local == Some(false) {
        c.problem(
            path.key("local"),
            "an adaptive limit is always node-local (each node measures its own traffic): remove `local = false`",
        );
    }
}

/// A slot limit's `queue`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueConfig {
    pub(crate) params: QueueParams,
    /// The key whose distinct values take turns (empty: one FIFO).
    pub(crate) fair_by: Vec<KeyPart>,
}

/// Requests that may wait at once when `size` is not given.
pub(crate) const DEFAULT_QUEUE_SIZE: u64 = 100;

/// The most a request may wait: longer holds a client's connection and
/// the gateway's memory past any useful answer.
const MAX_WAIT_CEILING: Duration = Duration::from_secs(60);

/// `queue`: `max_wait` (required, above zero, at most a minute), `size`
/// (at least 1, default 100), `fair_by` (a key). Only on slot limits.
fn check_queue(
    c: &mut Checker,
    path: KeyPath,
    raw: Option<&RawQueue>,
    algorithm: &Algorithm,
) -> Option<QueueConfig> {
    let raw = raw?;
    if !slots::is_slot_limit(algorithm) {
        c.problem(path, "applies to concurrency and adaptive limits only");
        return None;
    }
    if raw.max_wait.is_none() {
        c.problem(path.clone(), "needs `max_wait`, like max_wait = \"200ms\"");
    }
    let fallback = Duration::from_millis(200);
    let mut max_wait = c.duration(path.key("max_wait"), &raw.max_wait, fallback);
    if max_wait > MAX_WAIT_CEILING {
        c.problem(path.key("max_wait"), "at most \"60s\"");
        max_wait = fallback;
    }
    let size = match raw.size {
        Some(0) => {
            c.problem(path.key("size"), "must be at least 1");
            DEFAULT_QUEUE_SIZE
        }
        Some(n) => n,
        None => DEFAULT_QUEUE_SIZE,
    };
    let parts = raw.fair_by.as_ref().map_or(&[][..], |k| &k.0[..]);
    let fair_by = parts
        .iter()
        .enumerate()
        .filter_map(|(i, text)| check_key_part(c, path.element("fair_by", parts.len(), i), text))
        .collect();
    Some(QueueConfig {
        params: QueueParams {
            max_wait: Nanos::try_from(max_wait.as_nanos()).unwrap_or(Nanos::MAX),
            size: usize::try_from(size).unwrap_or(usize::MAX),
        },
        fair_by,
    })
}

/// A per-key override's parameters (`values`, as `PUT
/// /limits/NAME/overrides` reads them) checked as the file's are: merged
/// over `limit`'s own and run through the same check as a `[limits.NAME]`
/// table or a plan, so each value's error is the file's. Also kept: a
/// lease no larger than the capacity, an aligned window of a day or more.
/// Each problem is `(field, message)`.
pub(crate) fn check_override(
    limit: &LimitConfig,
    values: &RawPlan,
) -> Result<Algorithm, Vec<(String, String)>> {
    let mut c = Checker {
        problems: Vec::new(),
        mistyped: Vec::new(),
        claim_paths: Vec::new(),
    };
    let root = KeyPath(Vec::new());
    let (name, mode) = match limit.algorithm {
        Algorithm::FixedWindow { .. } => ("fixed_window", None),
        Algorithm::SlidingWindow { .. } => ("sliding_window", None),
        Algorithm::SlidingLog { .. } => ("sliding_log", None),
        Algorithm::TokenBucket { .. } => ("token_bucket", None),
        Algorithm::LeakyBucket { mode, .. } => ("leaky_bucket", Some(mode)),
        Algorithm::Concurrency { .. } => ("concurrency", None),
        // Its limit is learned from the upstream, per key: there is no
        // number of the file's to replace.
        Algorithm::Adaptive { .. } => {
            return Err(vec![(
                "algorithm".to_owned(),
                "an adaptive limit learns each key's limit from the upstream: it takes no overrides"
                    .to_owned(),
            )]);
        }
    };
    let merged = values.over(&limit.params);
    // A token bucket's `wait` is the limit's, not a number an override sets.
    let wait = match limit.algorithm {
        Algorithm::TokenBucket { wait, .. } => wait,
        _ => 0,
    };
    let algorithm = check_algorithm(&mut c, name, &merged, (mode, wait, limit.unit), &|key| {
        root.key(key)
    });
    if let (Some(lease), Algorithm::TokenBucket { capacity, .. }) = (limit.lease, algorithm)
        && capacity < lease
    {
        c.problem(
            root.key("capacity"),
            format!(
                "`{capacity}` is below this limit's lease ({lease}); expected at least {lease}"
            ),
        );
    }
    if let (
        WindowAlign::FirstRequest | WindowAlign::Epoch { jitter: 1.. },
        Algorithm::FixedWindow { window, .. },
    ) = (limit.align, algorithm)
        && window < 86_400 * crate::limit::NANOS_PER_SEC
    {
        c.problem(
            root.key("window"),
            "this limit sets `align` or `reset_jitter`, which apply to windows of a day or longer",
        );
    }
    if c.problems.is_empty() {
        return Ok(algorithm);
    }
    Err(c
        .problems
        .into_iter()
        .map(|p| (p.path.to_string(), p.message))
        .collect())
}

/// `lease`: a token bucket's tokens taken from Redis N at a time, `1 <= N <=
/// capacity` (and for every plan's capacity), not with `local = true`.
fn check_lease(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawLimit,
    algorithm: &Algorithm,
) -> Option<u64> {
    let n = raw.lease?;
    let Algorithm::TokenBucket { capacity, .. } = algorithm else {
        c.problem(path.key("lease"), "applies to token_bucket limits only");
        return None;
    };
    if raw.local == Some(true) {
        c.problem(
            path.key("lease"),
            "leases are taken from the shared store: not with `local = true`",
        );
        return None;
    }
    if n == 0 || n > *capacity {
        c.problem(
            path.key("lease"),
            format!("`{n}`: expected 1 to the capacity ({capacity}), like lease = 100"),
        );
        return None;
    }
    Some(n)
}

/// `window = "1mo"`: a fixed window of calendar months in UTC.
const MONTH_WINDOW: &str = "1mo";

/// `align` and `reset_jitter`: only for a fixed window of a day or longer,
/// where keys resetting together would make a thundering herd. A calendar
/// month (`window = "1mo"`) is aligned to the months, shifted per key by
/// `reset_jitter`; it cannot start at a key's first request.
fn check_align(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawLimit,
    algorithm: &Algorithm,
) -> WindowAlign {
    let month = raw.window.as_deref() == Some(MONTH_WINDOW)
        && matches!(algorithm, Algorithm::FixedWindow { .. });
    if month {
        if raw.align.as_deref().is_some_and(|align| align != "epoch") {
            c.problem(
                path.key("align"),
                "a calendar month (window = \"1mo\") starts on the 1st (UTC); use reset_jitter to spread keys",
            );
        }
        let jitter = match &raw.reset_jitter {
            None => 0,
            Some(_) => {
                let jitter =
                    c.duration(path.key("reset_jitter"), &raw.reset_jitter, Duration::ZERO);
                let jitter = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
                // Shorter than the shortest month.
                if jitter >= 28 * 86_400 * crate::limit::NANOS_PER_SEC {
                    c.problem(path.key("reset_jitter"), "must be shorter than 28 days");
                }
                jitter
            }
        };
        return WindowAlign::Month { jitter };
    }
    if raw.align.is_none() && raw.reset_jitter.is_none() {
        return WindowAlign::default();
    }
    const DAY: Nanos = 86_400 * crate::limit::NANOS_PER_SEC;
    // A misplaced setting is reported at the first of the two present.
    let key = if raw.align.is_some() {
        "align"
    } else {
        "reset_jitter"
    };
    let window = match algorithm {
        Algorithm::FixedWindow { window, .. } => *window,
        _ => {
            c.problem(path.key(key), "applies to fixed_window limits only");
            return WindowAlign::default();
        }
    };
    if window < DAY {
        c.problem(path.key(key), "applies to windows of a day or longer");
        return WindowAlign::default();
    }
    let first_request = match raw.align.as_deref() {
        None => false,
        Some(text) => {
            c.one_of(path.key("align"), text, &["epoch", "first_request"]) == Some("first_request")
        }
    };
    let jitter = match &raw.reset_jitter {
        None => 0,
        Some(_) if first_request => {
            c.problem(
                path.key("reset_jitter"),
                "applies to align = \"epoch\"; first_request windows already start at different times",
            );
            0
        }
        Some(_) => {
            let jitter = c.duration(path.key("reset_jitter"), &raw.reset_jitter, Duration::ZERO);
            let jitter = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
            if jitter >= window {
                c.problem(path.key("reset_jitter"), "must be shorter than the window");
            }
            jitter
        }
    };
    if first_request {
        WindowAlign::FirstRequest
    } else {
        WindowAlign::Epoch { jitter }
    }
}

fn mode_of(c: &mut Checker, path: &KeyPath, raw: &RawLimit) -> Option<LeakyMode> {
    let text = raw.mode.as_deref()?;
    if raw.algorithm != "leaky_bucket" {
        c.problem(
            path.key("mode"),
            format!(
                "`mode` is a parameter of leaky_bucket, not of {}",
                raw.algorithm
            ),
        );
        return None;
    }
    match c.one_of(path.key("mode"), text, &["reject", "delay"]) {
        Some("delay") => Some(LeakyMode::Delay),
        _ => Some(LeakyMode::Reject),
    }
}

/// `wait` (a token bucket's, 0 when absent): a duration, `"0s"` allowed
/// (no hold, as without it), kept in whole microseconds so that memory and
/// the Redis script (which counts in µs) hold a request alike.
fn wait_of(c: &mut Checker, path: &KeyPath, raw: &RawLimit) -> Nanos {
    let Some(text) = raw.wait.as_deref() else {
        return 0;
    };
    if raw.algorithm != "token_bucket" {
        c.problem(
            path.key("wait"),
            format!(
                "`wait` is a parameter of token_bucket, not of {} (a leaky_bucket holds requests with mode = \"delay\")",
                raw.algorithm
            ),
        );
        return 0;
    }
    match parse_duration(text) {
        Ok(wait) => {
            let micros = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX / 1_000);
            micros.saturating_mul(1_000)
        }
        Err(message) => {
            c.problem(path.key("wait"), message);
            0
        }
    }
}

/// A claim name or a dotted path of them: non-empty segments (a `jwt:`
/// key part's, or an issuer's `consumer_claim` and the like).
pub(crate) fn claim_path_is_valid(path: &str) -> bool {
    !path.is_empty() && path.split('.').all(|segment| !segment.is_empty())
}

/// Checks the algorithm name and that exactly its parameters are present.
///
/// `at(key)` is where a parameter's problem is reported (a plan's own table
/// for the values it sets).
fn check_algorithm(
    c: &mut Checker,
    algorithm: &str,
    raw: &RawPlan,
    (mode, wait, unit): (Option<LeakyMode>, Nanos, tokens::Unit),
    at: &dyn Fn(&str) -> KeyPath,
) -> Algorithm {
    let fallback = Algorithm::Concurrency { max: 1 };
    let Some(name) = c.one_of(at("algorithm"), algorithm, &ALGORITHMS) else {
        return fallback;
    };
    let wanted: &[&str] = match name {
        "fixed_window" | "sliding_window" | "sliding_log" => &["limit", "window"],
        "token_bucket" => &["capacity", "refill"],
        "leaky_bucket" => &["capacity", "rate"],
        "adaptive" => &["min", "max", "initial"],
        _ => &["max"],
    };
    // Adaptive's parameters all have defaults; the others' are required.
    let optional = name == "adaptive";
    for (key, is_present) in raw.present() {
        if is_present && !wanted.contains(&key) {
            let takes = match wanted.split_last() {
                Some((last, [])) => (*last).to_owned(),
                Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
                None => String::new(),
            };
            let mut message = format!("`{key}` is not a parameter of {name}; it takes {takes}");
            if optional {
                message.push_str(
                    " (it counts requests in flight and follows the upstream: no rate or window)",
                );
            }
            c.problem(at(key), message);
        }
        if !optional && !is_present && wanted.contains(&key) && !c.mistyped.contains(&at(key)) {
            c.problem(at("algorithm"), format!("{name} needs `{key}`"));
        }
    }
    let usd = unit == tokens::Unit::Usd;
    // A quota in the limit's unit: a whole count, or dollars (decimals
    // allowed) as micro-dollars.
    let amount = |c: &mut Checker, key: &str, value: Option<Amount>| -> Option<u64> {
        let value = value?;
        let read = if usd {
            value.millionths()
        } else {
            value.count()
        };
        match read {
            Ok(n) => Some(n),
            Err(message) => {
                c.problem(at(key), message);
                Some(1)
            }
        }
    };
    let positive = |c: &mut Checker, key: &str, value: Option<Amount>| -> u64 {
        match amount(c, key, value) {
            Some(0) => {
                let least = if usd { "above zero" } else { "at least 1" };
                c.problem(at(key), format!("must be {least}"));
                1
            }
            Some(n) => n,
            None => 1,
        }
    };
    let window = |c: &mut Checker| -> Nanos {
        // A calendar month (UTC), a fixed window's only: its boundaries
        // are `align`'s (`check_align`), its nominal length the longest.
        if raw.window.as_deref() == Some(MONTH_WINDOW) {
            if name != "fixed_window" {
                c.problem(
                    at("window"),
                    "\"1mo\" (a calendar month) is a fixed_window's only; use \"30d\"",
                );
            }
            return crate::limit::calendar::MONTH;
        }
        let duration = c.duration(at("window"), &raw.window, Duration::from_secs(1));
        u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
    };
    let rate =
        |c: &mut Checker, key: &str, value: &Option<String>| match value.as_deref().map(parse_rate)
        {
            Some(Ok(rate)) if usd => tokens::usd_rate(rate),
            Some(Ok(rate)) => rate,
            Some(Err(message)) => {
                c.problem(at(key), message);
                crate::limit::Rate { tokens: 1, per: 1 }
            }
            None => crate::limit::Rate { tokens: 1, per: 1 },
        };
    match name {
        "fixed_window" => Algorithm::FixedWindow {
            limit: positive(c, "limit", raw.limit),
            window: window(c),
        },
        "sliding_window" => {
            let limit = positive(c, "limit", raw.limit);
            if limit > crate::limit::sliding_window::MAX_LIMIT {
                let most = crate::limit::sliding_window::MAX_LIMIT;
                let most = match usd {
                    true => format!("${}; use fixed_window", crate::llm::price::dollars(most)),
                    false => most.to_string(),
                };
                c.problem(
                    at("limit"),
                    format!("a sliding_window limit is at most {most}"),
                );
            }
            Algorithm::SlidingWindow {
                limit,
                window: window(c),
            }
        }
        "sliding_log" => Algorithm::SlidingLog {
            limit: positive(c, "limit", raw.limit),
            window: window(c),
        },
        "token_bucket" => Algorithm::TokenBucket {
            capacity: positive(c, "capacity", raw.capacity),
            refill: rate(c, "refill", &raw.refill),
            wait,
        },
        "leaky_bucket" => {
            let mode = mode.unwrap_or(LeakyMode::Reject);
            Algorithm::LeakyBucket {
                capacity: amount(c, "capacity", raw.capacity).unwrap_or(0),
                rate: rate(c, "rate", &raw.rate),
                mode,
            }
        }
        "adaptive" => check_adaptive(c, raw, at).unwrap_or(fallback),
        _ => Algorithm::Concurrency {
            max: positive(c, "max", raw.max.map(Amount::whole)),
        },
    }
}

/// `adaptive`'s `min` (default 1), `max` (default 1000) and `initial`
/// (default `min(20, max)`, raised to `min`), validated together.
fn check_adaptive(
    c: &mut Checker,
    raw: &RawPlan,
    at: &dyn Fn(&str) -> KeyPath,
) -> Option<Algorithm> {
    use crate::limit::adaptive::{MAX_LIMIT, Params, ParamsError};
    let number = |c: &mut Checker, key: &str, value: Option<u64>, default: u32| match value {
        None => Some(default),
        Some(n) => match u32::try_from(n) {
            Ok(n) if n <= MAX_LIMIT => Some(n),
            _ => {
                c.problem(at(key), format!("`{n}`: must not exceed {MAX_LIMIT}"));
                None
            }
        },
    };
    let min = number(c, "min", raw.min, 1);
    let max = number(c, "max", raw.max, 1000);
    let (min, max) = (min?, max?);
    let initial = number(c, "initial", raw.initial, 20.min(max).max(min))?;
    match Params::new(min, max, initial) {
        Ok(params) => Some(Algorithm::Adaptive { params }),
        Err(error) => {
            let key = match error {
                ParamsError::MinZero | ParamsError::MinAboveMax { .. } => "min",
                ParamsError::MaxTooLarge(_) => "max",
                ParamsError::InitialOutside { .. } => "initial",
            };
            c.problem(at(key), error.to_string());
            None
        }
    }
}

/// The limits a list at `path` names (a route's or a descriptor rule's
/// `limits`, a rule's `replaces`), as indexes into `limit_names`; each
/// unknown or repeated name a problem at its element.
pub(super) fn references(
    c: &mut Checker,
    path: &KeyPath,
    names: &[String],
    limit_names: &[&str],
) -> Vec<usize> {
    let mut seen = HashSet::new();
    let mut found = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        if !seen.insert(name.as_str()) {
            c.problem(path.index(i), format!("limit `{name}` is listed twice"));
        }
        if let Some(index) = c.reference(path.index(i), "limit", name, limit_names) {
            found.push(index);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;
    use crate::config::validate::errors;
    use crate::limit::{Algorithm, WindowAlign};

    #[test]
    fn algorithm_parameters_are_checked() {
        let message = errors("[limits.a]\nkey = \"ip\"\nalgorithm = \"token_bukket\"\n");
        assert!(
            message.contains("did you mean `token_bucket`?"),
            "{message}"
        );
        let message = errors(
            "[limits.a]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\ncapacity = 3\n",
        );
        assert!(message.contains("needs `window`"), "{message}");
        assert!(
            message.contains("`capacity` is not a parameter of fixed_window"),
            "{message}"
        );
    }

    #[test]
    fn a_calendar_month_is_a_fixed_window_aligned_to_the_months() {
        let base = "[limits.a]\nkey = \"ip\"\nlimit = 5\nwindow = \"1mo\"\n";
        let text = format!("{base}algorithm = \"fixed_window\"\nreset_jitter = \"6h\"\n");
        let config = Config::from_bytes(Path::new("g.toml"), text.as_bytes()).unwrap();
        let limit = &config.limits[0];
        assert_eq!(
            limit.algorithm,
            Algorithm::FixedWindow {
                limit: 5,
                window: crate::limit::calendar::MONTH
            }
        );
        assert_eq!(
            limit.align,
            WindowAlign::Month {
                jitter: 6 * 3_600 * crate::limit::NANOS_PER_SEC
            }
        );
        let message = errors(&format!("{base}algorithm = \"sliding_window\"\n"));
        assert!(message.contains("a fixed_window's only"), "{message}");
        let message = errors(&format!(
            "{base}algorithm = \"fixed_window\"\nalign = \"first_request\"\n"
        ));
        assert!(message.contains("starts on the 1st"), "{message}");
    }

    #[test]
    fn adaptive_defaults_and_checks() {
        use crate::limit::Algorithm;
        use crate::limit::adaptive::Params;
        let base = "[limits.a]\nkey = \"route\"\nalgorithm = \"adaptive\"\n";
        let config = Config::from_bytes(Path::new("g.toml"), base.as_bytes()).unwrap();
        let limit = &config.limits[0];
        let params = Params::new(1, 1000, 20).unwrap();
        assert_eq!(limit.algorithm, Algorithm::Adaptive { params });
        assert_eq!(limit.status, http::StatusCode::SERVICE_UNAVAILABLE);
        assert!(limit.local, "always node-local");
        // `initial` defaults to min(20, max), and never below `min`.
        let small = format!("{base}max = 8\n");
        let config = Config::from_bytes(Path::new("g.toml"), small.as_bytes()).unwrap();
        let params = Params::new(1, 8, 8).unwrap();
        assert_eq!(config.limits[0].algorithm, Algorithm::Adaptive { params });
        let high = format!("{base}min = 50\nmax = 100\nstatus = 429\n");
        let config = Config::from_bytes(Path::new("g.toml"), high.as_bytes()).unwrap();
        let params = Params::new(50, 100, 50).unwrap();
        assert_eq!(config.limits[0].algorithm, Algorithm::Adaptive { params });
        assert_eq!(config.limits[0].status, http::StatusCode::TOO_MANY_REQUESTS);
        let cases = [
            ("min = 0\n", "`limits.a.min`: min must be at least 1"),
            (
                "min = 5\nmax = 4\n",
                "`limits.a.min`: min (5) must not exceed max (4)",
            ),
            (
                "max = 2000000\n",
                "`limits.a.max`: `2000000`: must not exceed 1000000",
            ),
            (
                "min = 2\nmax = 10\ninitial = 11\n",
                "`limits.a.initial`: initial (11) must lie within min (2) and max (10)",
            ),
            (
                "window = \"1s\"\n",
                "`window` is not a parameter of adaptive; it takes min, max and initial (it counts requests in flight and follows the upstream: no rate or window)",
            ),
            (
                "refill = \"1/s\"\n",
                "`refill` is not a parameter of adaptive",
            ),
            ("local = false\n", "an adaptive limit is always node-local"),
            (
                "unit = \"tokens\"\n",
                "adaptive counts requests in flight, not tokens",
            ),
            ("burst = 3\n", "unknown"),
            ("[limits.a.plans.gold]\nmax = 5\n", "plans do not apply"),
        ];
        for (extra, expected) in cases {
            let message = errors(&format!("{base}{extra}"));
            assert!(message.contains(expected), "{extra}: {message}");
        }
        // `min` and `initial` belong to adaptive only.
        let message =
            errors("[limits.c]\nkey = \"ip\"\nalgorithm = \"concurrency\"\nmax = 5\nmin = 1\n");
        assert!(
            message.contains("`min` is not a parameter of concurrency; it takes max"),
            "{message}"
        );
    }

    #[test]
    fn align_and_jitter_need_a_long_fixed_window() {
        let base = "[limits.a]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\n";
        let ok = format!("{base}window = \"1d\"\nreset_jitter = \"10m\"\n");
        let config = Config::from_bytes(Path::new("g.toml"), ok.as_bytes()).unwrap();
        assert_eq!(
            config.limits[0].align,
            WindowAlign::Epoch {
                jitter: 600 * crate::limit::NANOS_PER_SEC
            }
        );
        let first = format!("{base}window = \"7d\"\nalign = \"first_request\"\n");
        let config = Config::from_bytes(Path::new("g.toml"), first.as_bytes()).unwrap();
        assert_eq!(config.limits[0].align, WindowAlign::FirstRequest);
        let short = format!("{base}window = \"1h\"\nalign = \"first_request\"\n");
        assert!(
            errors(&short).contains(
                "gateway.toml:6:1: `limits.a.align`: applies to windows of a day or longer"
            ),
            "{}",
            errors(&short)
        );
        let long_jitter = format!("{base}window = \"1d\"\nreset_jitter = \"2d\"\n");
        assert!(errors(&long_jitter).contains("shorter than the window"));
    }

    #[test]
    fn wait_is_a_token_bucket_duration() {
        let bucket = "[limits.a]\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 2\nrefill = \"1/s\"\n";
        let wait_of = |extra: &str| {
            let text = format!("{bucket}{extra}");
            let config = Config::from_bytes(Path::new("g.toml"), text.as_bytes()).unwrap();
            match config.limits[0].algorithm {
                Algorithm::TokenBucket { wait, .. } => wait,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(wait_of(""), 0, "absent: refuse at once");
        assert_eq!(wait_of("wait = \"0s\"\n"), 0, "0: the same");
        assert_eq!(wait_of("wait = \"500ms\"\n"), 500_000_000);
        // Whole microseconds, as the Redis script counts.
        assert_eq!(wait_of("wait = \"1500ns\"\n"), 1_000);
        // Plans keep the limit's wait.
        let text = format!("{bucket}wait = \"1s\"\n[limits.a.plans.pro]\ncapacity = 9\n");
        let config = Config::from_bytes(Path::new("g.toml"), text.as_bytes()).unwrap();
        assert!(matches!(
            config.limits[0].plans[0].1,
            Algorithm::TokenBucket {
                capacity: 9,
                wait: 1_000_000_000,
                ..
            }
        ));
        let message = errors(&format!("{bucket}wait = \"soon\"\n"));
        assert!(message.contains("`limits.a.wait`"), "{message}");
        let window = "[limits.a]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\nwait = \"1s\"\n";
        let message = errors(window);
        assert!(
            message.contains(
                "`limits.a.wait`: `wait` is a parameter of token_bucket, not of fixed_window"
            ),
            "{message}"
        );
        let leaky = "[limits.a]\nkey = \"ip\"\nalgorithm = \"leaky_bucket\"\ncapacity = 5\nrate = \"1/s\"\nwait = \"1s\"\n";
        assert!(
            errors(leaky).contains("mode = \"delay\""),
            "{}",
            errors(leaky)
        );
    }
}
