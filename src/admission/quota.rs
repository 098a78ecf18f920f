//! "How much have I left?": a caller's own state of some limits, for a
//! route with `respond = { quota = [...] }`, charging nothing.
//!
//! The caller is identified by the same steps as a proxied request
//! (`identify`: its verified token, its API key's consumer, its plan; the
//! client IP behind the trusted proxies) and each limit's key is the one
//! its next proxied request would be charged under (`limit_key`, with the
//! limit's `on_missing_key`). So the route can only ever show the state of
//! the caller's own keys: nothing in the request names a key but the
//! request's own identity.
//!
//! Each state is read as a decision would read it, without charging: a
//! limit in node memory from this node's limiter for the caller's plan, a
//! shared one from Redis (`store::peek`). While Redis does not answer, the
//! limit is shown as `store.on_failure` decides meanwhile: `"local"` shows
//! the fallback state, `"allow"` leaves the limit out (it does not apply),
//! `"deny"` answers like a denied request would ([`Peeked::StoreDown`]).

use std::net::IpAddr;
use std::sync::Arc;

use http::request::Parts;

use super::identify::{self, Unidentified};
use super::shared::store_entry;
use crate::app::overrides::Override;
use crate::app::{App, Snapshot};
use crate::config::{LimitConfig, OnFailure, RouteConfig};
use crate::identity::keys::{RequestFacts, limit_key};
use crate::limit::{Algorithm, Nanos, Verdict};

/// One limit's state for the caller.
#[derive(Debug, Clone)]
pub struct Reading<'s> {
    pub limit: &'s LimitConfig,
    /// The numbers in force for the caller (its override's, else its
    /// plan's; a shared limit's unscaled ones).
    pub algorithm: Algorithm,
    pub verdict: Verdict,
    /// The caller's per-key override of this limit, when one is in force.
    pub(crate) overridden: Option<Arc<Override>>,
}

/// What a quota request finds.
#[derive(Debug)]
pub enum Peeked<'s> {
    /// The caller's state of each limit that applies to it, in the order
    /// the route names them.
    Read(Vec<Reading<'s>>),
    /// The caller lacks the key of this limit (`on_missing_key = "deny"`),
    /// as its proxied request would.
    MissingKey(&'s LimitConfig),
    /// The caller is refused before its limits (401).
    Unidentified(Unidentified),
    /// A shared limit's store is down and `on_failure = "deny"`.
    StoreDown,
}

/// The state of `limits` (indexes into the configuration's limits) for the
/// caller of `parts`, arriving from `peer`, at `now`.
pub async fn peek_request<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    route: &'s RouteConfig,
    parts: &Parts,
    peer: IpAddr,
    limits: &[usize],
    now: Nanos,
) -> Peeked<'s> {
    let headers = &parts.headers;
    let caller = match identify::caller(app, snapshot, route, headers, now) {
        Ok(caller) => caller,
        Err(Unidentified::Refresh { issuer }) => {
            match identify::caller_refreshed(app, snapshot, route, headers, now, issuer).await {
                Ok(caller) => caller,
                Err(refused) => return Peeked::Unidentified(refused),
            }
        }
        Err(refused) => return Peeked::Unidentified(refused),
    };
    let client_ip = identify::client_ip(snapshot, headers, peer);
    let identity = caller.identity(snapshot, client_ip, None);
    let facts = RequestFacts {
        client: identity.client_net(snapshot),
        route: &route.name,
        consumer: identity.consumer,
        body: None,
        token: identity.token,
    };
    let mut readings = Vec::with_capacity(limits.len());
    for &index in limits {
        let Some(id) = snapshot.limit_ids().nth(index) else {
            continue;
        };
        let limit = snapshot.limit_config(id);
        let key = match limit_key(limit, parts, &facts) {
            Ok(Some(key)) => key,
            // Skipped: the limit does not apply to this caller.
            Ok(None) => continue,
            Err(_) => return Peeked::MissingKey(limit),
        };
        // An overridden key is decided on its own limiter and numbers, as
        // `key_stack` and explain read it.
        let found = snapshot.overrides(id).find(key, now);
        let local = match &found {
            Some((in_force, own)) => Reading {
                limit,
                algorithm: in_force.algorithm,
                verdict: own.peek(key, now),
                overridden: Some(in_force.record.clone()),
            },
            None => {
                let limiter = snapshot.limiters(id).for_plan(identity.plan);
                Reading {
                    limit,
                    algorithm: limiter.algorithm(),
                    verdict: limiter.peek(key, now),
                    overridden: None,
                }
            }
        };
        let Some(store) = app.store().filter(|_| snapshot.is_shared(id)) else {
            readings.push(local);
            continue;
        };
        let mut entry = store_entry(limit, identity.plan, key);
        if let Some((in_force, _)) = &found {
            entry.algorithm = in_force.algorithm;
        }
        match store.peek(&entry).await {
            Ok(verdict) => readings.push(Reading {
                limit,
                algorithm: entry.algorithm,
                verdict,
                overridden: local.overridden,
            }),
            Err(_) => match store.on_failure() {
                OnFailure::Local => readings.push(local),
                OnFailure::Allow => {}
                OnFailure::Deny => return Peeked::StoreDown,
            },
        }
    }
    Peeked::Read(readings)
}
