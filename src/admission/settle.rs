//! Post-response cost: a route's `cost_header` reports what the request
//! really cost once the upstream has answered; the difference from the
//! up-front cost is charged (or refunded) to every limit that charged the
//! request — in memory, or in the store for the limits it decided.

use smallvec::SmallVec;

use super::{Ticket, shared};
use crate::app::{App, Snapshot};
use crate::config::tokens::Unit;
use crate::limit::stack::INLINE;
use crate::limit::{Algorithm, Outcome};
use crate::store::SharedEntry;

/// Settles the request of `route` (an index into the snapshot's routes)
/// whose upstream reported `reported` (its cost header's value) against the
/// `cost` charged up front. Never blocks the response; a value that is not
/// a whole number is ignored.
pub fn settle(
    app: &App,
    snapshot: &Snapshot,
    route: usize,
    cost: u64,
    ticket: &Ticket<'_>,
    reported: Option<&[u8]>,
) {
    let Some(reported) = reported.and_then(reported_count) else {
        return;
    };
    let delta = i64::try_from(reported)
        .unwrap_or(i64::MAX)
        .saturating_sub(i64::try_from(cost).unwrap_or(i64::MAX));
    if delta == 0 {
        return;
    }
    let stack = &snapshot.routes[route].stack;
    let now = app.clock.now();
    let mut in_store: SmallVec<[SharedEntry<'_>; INLINE]> = SmallVec::new();
    for (j, ((limiter, key), entry)) in ticket
        .limiters
        .iter()
        .zip(&ticket.keys)
        .zip(&ticket.decision.entries)
        .enumerate()
    {
        // Shadow limits that would have denied were not charged: nothing to settle.
        let (Some(key), Outcome::Allowed) = (key, entry.outcome) else {
            continue;
        };
        let limit = ticket.stack[j];
        // A token or usd limit is settled from the response's usage
        // (`tokens`).
        if limit.unit != Unit::Requests {
            continue;
        }
        if ticket.via_store && stack.get(j).is_some_and(|&id| snapshot.is_shared(id)) {
            let entry = SharedEntry {
                algorithm: ticket.algorithms[j],
                ..shared::store_entry(limit, ticket.plan, *key)
            };
            if !matches!(entry.algorithm, Algorithm::Concurrency { .. }) {
                in_store.push(entry);
            }
        } else {
            limiter.adjust(*key, delta, now);
        }
    }
    if let (false, Some(store)) = (in_store.is_empty(), app.store()) {
        store.settle(&in_store, delta);
    }
}

/// The whole number an upstream reports in a header (`cost_header`, a
/// token route's `usage = "header:NAME"`), surrounding spaces allowed;
/// anything else reports nothing.
pub(crate) fn reported_count(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}
