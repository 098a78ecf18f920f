//! "Why was this customer limited?": one key's state of a named limit, for
//! `GET /limits/NAME?key=VALUE` on the admin listener.
//!
//! The operator gives the key's raw value(s) — an API key, an address, a
//! consumer name; several `key=` for a composite key, in its order — and
//! gets the limit's numbers for that key as they stand, charging nothing:
//! remaining, when more quota comes back, and the digest the key is stored
//! under (the same digest names it in Redis); for a token bucket with
//! `wait`, its debt and what the next request would get (`wait`). The raw value is neither
//! stored nor logged nor echoed: only its digest appears in the answer.
//! `plan=NAME` reads the state a consumer on that plan is counted in. A
//! limit without `key` (the decision service's descriptor rules) is named
//! by the descriptor's entries instead: `entry=KEY:VALUE`, one per entry,
//! in order.
//!
//! A slot limit with a `queue` also shows its line: how many requests
//! wait for its slots now (`queue.depth`), its `size`, `max_wait` and
//! `fair_by`.
//!
//! Where the state is read from, `source` in the answer: a limit decided in
//! node memory (no store, or `local = true`) from this node's limiter
//! (`"memory"`); a shared limit from Redis (`"redis"`: the state every node
//! decides against, read by a call that charges nothing, see
//! `store::peek`), its numbers the shared ones. When Redis does not answer,
//! a shared limit shows this node's fallback limiter instead, labelled
//! `"fallback"` with what `store.on_failure` does meanwhile: its numbers are
//! the fallback's (scaled by `local_fraction`), and only `on_failure =
//! "local"` decides with it.
//!
//! An `adaptive` limit (always in memory) adds `adaptive`: its current
//! `limit` (also `quota`), the requests `in_flight`, and the latencies it
//! learns from, `baseline_ms` (the unqueued latency) and `recent_ms` (the
//! last window's mean), `null` until it has seen answers.

use std::sync::Arc;

use serde_json::{Value, json};

use super::shared::store_entry;
use crate::app::LimitId;
use crate::app::Snapshot;
use crate::config::OnFailure;
use crate::config::tokens::Unit;
use crate::identity::body_fields::percent_decode;
use crate::identity::client_ip::client_net;
use crate::identity::keys::{descriptor_digest, digest_values};
use crate::limit::{Algorithm, LimitKey, Rate, Verdict};
use crate::limit::{Nanos, quota_of, window_secs};
use crate::llm::price::dollars;
use crate::store::RedisStore;
use crate::summary::key_parts;

/// Why a limit's state could not be explained: the admin listener's 404 or
/// 400 with this message.
#[derive(Debug, PartialEq, Eq)]
pub enum ExplainError {
    /// No limit of that name in the running configuration.
    UnknownLimit(String),
    /// The query does not name a key this limit can have.
    BadKey(String),
}

/// One key of one limit, as the query names it.
pub(super) struct Target {
    pub(super) id: LimitId,
    pub(super) digest: LimitKey,
    pub(super) plan: Option<String>,
    /// What the key is made of, for the answer (`key`).
    parts: String,
}

/// Where a key's state was read from (see the module doc).
enum Source {
    Memory,
    Redis,
    Fallback(OnFailure),
}

/// The state of `limit`'s key given by `query` (`key=V[&key=V2…][&plan=P]`),
/// as JSON, at `now` on the limiters' clock. A shared limit's is read from
/// `store` (the gateway's, if it has one); a limit in memory's is ready at
/// once.
pub async fn explain(
    snapshot: &Snapshot,
    store: Option<&Arc<RedisStore>>,
    limit: &str,
    query: Option<&str>,
    now: Nanos,
) -> Result<Value, ExplainError> {
    let target = target(snapshot, limit, query)?;
    // A key with an override is decided on its own limiter and numbers.
    let own = snapshot.overridden(target.id, target.digest, now);
    let limiter = match own {
        Some((_, own)) => own,
        None => snapshot
            .limiters(target.id)
            .for_plan(target.plan.as_deref()),
    };
    let Some(store) = store.filter(|_| snapshot.is_shared(target.id)) else {
        let verdict = limiter.peek(target.digest, now);
        let mut explained = state(
            snapshot,
            &target,
            (limiter.algorithm(), verdict),
            Source::Memory,
            now,
        );
        if let Some(view) = limiter.adaptive_view(target.digest) {
            let ms = |ns: Option<Nanos>| ns.map(|ns| ns as f64 / 1e6);
            explained["adaptive"] = json!({
                "limit": view.limit,
                "in_flight": view.in_flight,
                "baseline_ms": ms(view.baseline),
                "recent_ms": ms(view.recent),
            });
        }
        return Ok(explained);
    };
    let config = snapshot.limit_config(target.id);
    let mut entry = store_entry(config, target.plan.as_deref(), target.digest);
    if let Some((numbers, _)) = own {
        entry.algorithm = numbers;
    }
    Ok(match store.peek(&entry).await {
        Ok(verdict) => state(
            snapshot,
            &target,
            (entry.algorithm, verdict),
            Source::Redis,
            now,
        ),
        Err(_) => {
            let verdict = limiter.peek(target.digest, now);
            let source = Source::Fallback(store.on_failure());
            state(
                snapshot,
                &target,
                (limiter.algorithm(), verdict),
                source,
                now,
            )
        }
    })
}

/// The limit and the digest of the key `query` names (`key=V[&key=V2…]`,
/// or `entry=K:V…` for a descriptor-keyed limit), as [`explain`] reads
/// them: the key of a per-key override.
pub(crate) fn key_of(
    snapshot: &Snapshot,
    limit: &str,
    query: Option<&str>,
) -> Result<(LimitId, LimitKey), ExplainError> {
    target(snapshot, limit, query).map(|target| (target.id, target.digest))
}

/// The limit and key `query` names.
pub(super) fn target(
    snapshot: &Snapshot,
    limit: &str,
    query: Option<&str>,
) -> Result<Target, ExplainError> {
    let Some(id) = snapshot.limit_named(limit) else {
        return Err(ExplainError::UnknownLimit(format!(
            "no limit named `{limit}` in the running configuration"
        )));
    };
    let config = snapshot.limit_config(id);
    let mut values = Vec::new();
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut plan = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = String::from_utf8(percent_decode(value.as_bytes()))
            .map_err(|_| ExplainError::BadKey("a `key` value is not UTF-8".to_owned()))?;
        match name {
            "key" => values.push(value),
            "plan" => plan = Some(value),
            "entry" => match value.split_once(':') {
                Some((key, value)) => entries.push((key.to_owned(), value.to_owned())),
                None => {
                    return Err(ExplainError::BadKey(
                        "an `entry` is KEY:VALUE, one per descriptor entry".to_owned(),
                    ));
                }
            },
            other => {
                return Err(ExplainError::BadKey(format!(
                    "unknown parameter `{other}`; give key=VALUE (one per key part) and optionally plan=NAME"
                )));
            }
        }
    }
    let parts = key_parts(&config.key);
    if config.key.is_empty() {
        // Keyed by Envoy descriptors: the entries are the key.
        if entries.is_empty() {
            return Err(ExplainError::BadKey(format!(
                "this limit is keyed by Envoy descriptors: /limits/{limit}?entry=KEY:VALUE (one per entry, in order)"
            )));
        }
        let digest = descriptor_digest(entries.iter().map(|(k, v)| (k.as_str(), v.as_str())), &[]);
        return Ok(Target {
            id,
            digest,
            plan: None,
            parts: "descriptor entries".to_owned(),
        });
    }
    if values.is_empty() {
        return Err(ExplainError::BadKey(format!(
            "give the key's value: /limits/{limit}?key=VALUE (this limit is keyed by {parts})"
        )));
    }
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    let digest = digest_values(&config.key, &refs, |ip| client_net(ip, &snapshot.client_ip))
        .map_err(|message| ExplainError::BadKey(format!("{message} (keyed by {parts})")))?;
    Ok(Target {
        id,
        digest,
        plan,
        parts,
    })
}

/// A token bucket with `wait`, from its state's `r` and `t`: how far past
/// empty it runs (the time its held requests still owe: `t` beyond one
/// token's), and what a request of cost 1 arriving now would get —
/// `admitted` at once, `held` until its token is there, or `refused` (past
/// `wait`) — and in how long its token is there.
fn wait_state(verdict: &Verdict, refill: Rate, wait: Nanos) -> Value {
    let ms = |nanos: Nanos| (nanos / 1_000) as f64 / 1000.0;
    let interval = refill.per / refill.tokens.max(1);
    let (debt, next, admitted_in) = if verdict.remaining > 0 {
        (0, "admitted", 0)
    } else {
        let until = verdict.reset_after;
        let next = if until <= wait { "held" } else { "refused" };
        (until.saturating_sub(interval), next, until)
    };
    json!({
        "max_ms": ms(wait),
        "debt_ms": ms(debt),
        "next_request": next,
        "next_admitted_in_ms": ms(admitted_in),
    })
}

/// The JSON of `target`'s state, `verdict` under `algorithm`'s numbers,
/// read from `source`.
fn state(
    snapshot: &Snapshot,
    target: &Target,
    (algorithm, verdict): (Algorithm, Verdict),
    source: Source,
    now: Nanos,
) -> Value {
    let config = snapshot.limit_config(target.id);
    let secs = |nanos: Nanos| nanos.div_ceil(crate::limit::NANOS_PER_SEC);
    let mut explained = json!({
        "limit": config.name,
        "key": target.parts,
        "digest": format!("{:032x}", target.digest.as_u128()),
        "plan": target.plan,
        "policy": crate::summary::algorithm(&algorithm),
        "quota": quota_of(&algorithm, &verdict),
        "window_seconds": window_secs(&algorithm),
        "remaining": verdict.remaining,
        "reset_seconds": secs(verdict.reset_after),
        "shadow": config.shadow,
    });
    match source {
        Source::Memory => explained["source"] = json!("memory"),
        Source::Redis => explained["source"] = json!("redis"),
        Source::Fallback(on_failure) => {
            let (name, meanwhile) = match on_failure {
                OnFailure::Local => ("local", "decides with this state"),
                OnFailure::Allow => ("allow", "admits without this limit"),
                OnFailure::Deny => ("deny", "refuses with 503"),
            };
            explained["source"] = json!("fallback");
            explained["on_failure"] = json!(name);
            explained["note"] = json!(format!(
                "redis did not answer: this node's fallback state; meanwhile on_failure = \"{name}\" {meanwhile}"
            ));
        }
    }
    if let Some((found, _)) = snapshot.overrides(target.id).find(target.digest, now) {
        let record = &found.record;
        explained["override"] = json!({
            "params": crate::app::state_file::params_json(&record.params),
            "reason": record.reason,
            "expires_in_seconds": record.expires.map(|at| secs(at.saturating_sub(now))),
        });
    }
    if let Algorithm::TokenBucket { refill, wait, .. } = algorithm
        && wait > 0
    {
        explained["wait"] = wait_state(&verdict, refill, wait);
    }
    if config.unit != Unit::Requests {
        // Charged already, settled when their responses end (this node's).
        let (requests, reserved) = match snapshot.overrides(target.id).find(target.digest, 0) {
            Some((_, own)) => own.open.of(target.digest),
            None => snapshot
                .limiters(target.id)
                .for_plan(target.plan.as_deref())
                .open
                .of(target.digest),
        };
        explained["unit"] = json!(config.unit.name());
        explained["open_reservations"] = match config.unit {
            Unit::Usd => json!({"requests": requests, "usd": dollars(reserved)}),
            _ => json!({"requests": requests, "tokens": reserved}),
        };
    }
    if config.unit == Unit::Usd {
        // `quota` and `remaining` count micro-dollars; the budget in dollars.
        let quota = quota_of(&algorithm, &verdict);
        explained["budget"] = json!({
            "limit_usd": dollars(quota),
            "spent_usd": dollars(quota.saturating_sub(verdict.remaining)),
            "remaining_usd": dollars(verdict.remaining),
            "warn_at_percent": config.warn_at.map(|w| f64::from(w.basis_points) / 100.0),
        });
    }
    if let Some(queue) = &config.queue {
        // The limit's whole line (every key's waiters) and its numbers.
        let limiter = snapshot
            .limiters(target.id)
            .for_plan(target.plan.as_deref());
        let fair_by = key_parts(&queue.fair_by);
        explained["queue"] = json!({
            "depth": limiter.queue().map_or(0, |q| q.depth()),
            "size": queue.params.size,
            "max_wait_ms": queue.params.max_wait / 1_000_000,
            "fair_by": if fair_by.is_empty() { Value::Null } else { json!(fair_by) },
        });
    }
    explained
}
