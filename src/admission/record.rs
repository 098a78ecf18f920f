//! What a decision leaves in the metrics: each limit's outcome on the
//! route (`tollgate_ratelimit_decisions_total`), keys that just passed
//! 80 % of a quota, and the refused key in the sketch of the keys refused
//! most (`/stats`).

use super::{Charge, Ticket};
use crate::app::{RoutePlan, Snapshot};
use crate::identity::keys::shadow_missing_key;
use crate::limit::Outcome;
use crate::metrics::Metrics;

/// Counts each limit's outcome of the decided stack.
pub(super) fn decisions(
    metrics: &Metrics,
    snapshot: &Snapshot,
    charge: &Charge<'_>,
    ticket: &Ticket<'_>,
) {
    let plan = charge.plan;
    // The entries alone are walked; the stack's ids and algorithms are
    // looked up only where an outcome needs them (a three-way `zip` cost
    // every request ~30 instructions, `bench/instructions.sh`).
    for (position, entry) in ticket.decision.entries.iter().enumerate() {
        let outcome = match entry.outcome {
            Outcome::Skipped => skipped_outcome(ticket, position),
            outcome => outcome,
        };
        metrics.record_route_decision(&plan.metrics, position, outcome);
        match outcome {
            Outcome::ShadowDenied => shadow_denied(snapshot, plan, position),
            Outcome::Allowed => {
                // Near limit: this request took the key past 80% of its quota.
                let Some(algorithm) = ticket.algorithms.get(position) else {
                    continue;
                };
                let quota = crate::limit::quota(algorithm) as u128;
                let after = entry.verdict.remaining as u128;
                let before = after + charge.cost as u128;
                if after * 5 < quota && before * 5 >= quota {
                    near_limit(metrics, snapshot, plan, position);
                }
            }
            Outcome::Denied | Outcome::Skipped | Outcome::DeniedByOther => {}
        }
    }
}

/// A request without the key of the limit at `position`, counted as that
/// limit's denial; the others decided nothing. Out of line: the key loop of
/// every request stays as small as it was.
#[cold]
#[inline(never)]
pub(super) fn missing_key(metrics: &Metrics, plan: &RoutePlan, position: usize) {
    metrics.record_route_decision(&plan.metrics, position, Outcome::Denied);
}

/// The key the limit at `by` refused, into the keys refused most. Out of
/// line and on the deny path only: an admitted request never comes here.
#[cold]
#[inline(never)]
pub(super) fn refused_key(
    metrics: &Metrics,
    snapshot: &Snapshot,
    plan: &RoutePlan,
    ticket: &Ticket<'_>,
    by: usize,
) {
    if let (Some(&id), Some(Some(key))) = (plan.stack.get(by), ticket.keys.get(by)) {
        metrics
            .refused_keys()
            .record(snapshot.limit_label(id), *key);
    }
}

/// A skipped limit's outcome: `shadow_denied` where a shadow limit lacked
/// its key under `on_missing_key = "deny"` (it would have answered 400).
#[cold]
#[inline(never)]
fn skipped_outcome(ticket: &Ticket<'_>, position: usize) -> Outcome {
    if shadow_missing_key(ticket.stack[position], ticket.keys[position]) {
        Outcome::ShadowDenied
    } else {
        Outcome::Skipped
    }
}

// The two rare branches of `decisions`, out of line: inline, the event's
// and the metric's set-up made every request's frame larger.

#[cold]
#[inline(never)]
fn shadow_denied(snapshot: &Snapshot, plan: &RoutePlan, position: usize) {
    let Some(&id) = plan.stack.get(position) else {
        return;
    };
    // Debug, not info: a shadow limit may "deny" every request;
    // `tollgate_ratelimit_decisions_total` counts them all.
    tracing::debug!(route = %plan.name, limit = %snapshot.limit_label(id), "shadow limit would have denied");
}

#[cold]
#[inline(never)]
fn near_limit(metrics: &Metrics, snapshot: &Snapshot, plan: &RoutePlan, position: usize) {
    if let Some(&id) = plan.stack.get(position) {
        metrics.record_near_limit(&plan.name, snapshot.limit_label(id));
    }
}
