//! The shared tier: a stack with limits in the store. Its `local = true`
//! limits are decided in node memory first (a local denial costs no store
//! call), then the shared ones in one store call, all or nothing together:
//! a shared denial refunds the local charges. What the store spends and
//! gives back (leased tokens, a Cluster slot's charges) is its own
//! business: its verdicts come back as they stand. When the store is
//! unavailable, `on_failure` decides (see docs/src/guides/distributed.md,
//! "Failure"); under `"local"` the fallback's scaled numbers, which decided,
//! are the ones the answer gives.

use std::future::Future;
use std::pin::Pin;

use smallvec::SmallVec;

use super::{Admission, Charge, Store, Ticket, answer};
use crate::app::{App, Snapshot};
use crate::config::{LimitConfig, OnFailure};
use crate::limit::stack::{Costs, check_stack_costed};
use crate::limit::stack::{INLINE, SKIPPED, outcome_of};
use crate::limit::{
    Algorithm, EntryVerdict, LimitKey, Nanos, Outcome, Permits, StackDecision, StackEntry,
};
use crate::store::{SharedEntry, Unavailable};

/// [`decide`]'s future, boxed: only a shared stack pays the allocation,
/// and out of line, so that none of it is built into the request future.
#[inline(never)]
pub(super) fn decide_boxed<'a, 's: 'a>(
    store: &'a Store,
    app: &'a App,
    snapshot: &'s Snapshot,
    candidate: Charge<'s>,
    ticket: &'a mut Ticket<'s>,
) -> Pin<Box<dyn Future<Output = Admission> + Send + 'a>> {
    Box::pin(decide(store, app, snapshot, candidate, ticket))
}

/// A limit's shared numbers for a caller on `plan`, and the plan when it
/// has its own numbers (and so its own state).
pub(super) fn algorithm<'l>(
    limit: &'l LimitConfig,
    plan: Option<&str>,
) -> (Algorithm, Option<&'l str>) {
    plan.and_then(|p| limit.plans.iter().find(|(name, _)| &**name == p))
        .map_or((limit.algorithm, None), |(name, algorithm)| {
            (*algorithm, Some(&**name))
        })
}

/// The store's entry of `limit` for a caller on `plan` under `key`, with
/// its shared numbers: no lease, no cost (a decision sets both).
pub(super) fn store_entry<'l>(
    limit: &'l LimitConfig,
    plan: Option<&'l str>,
    key: LimitKey,
) -> SharedEntry<'l> {
    let (algorithm, plan) = algorithm(limit, plan);
    SharedEntry {
        limit: &limit.name,
        plan,
        algorithm,
        align: limit.align,
        key,
        shadow: limit.shadow,
        lease: 0,
        cost: 0,
        remember: false,
    }
}

/// The stack's entries at `at` checked on this node, each charged in its
/// limit's unit: `cost` for all when the request reserves no tokens, with
/// no per-entry list to build.
fn check_tier(ticket: &Ticket<'_>, at: &[usize], cost: u64, now: Nanos) -> StackDecision {
    let entries: SmallVec<[StackEntry<'_>; INLINE]> = at
        .iter()
        .map(|&j| StackEntry {
            limiter: ticket.limiters[j],
            key: ticket.keys[j],
            shadow: ticket.stack[j].shadow,
        })
        .collect();
    if ticket.reserved.tokens().is_none() {
        return check_stack_costed(&entries, (Costs::Uniform(cost), ticket.priority), now);
    }
    let costs: SmallVec<[u64; INLINE]> = at.iter().map(|&j| ticket.cost_of(j, cost)).collect();
    check_stack_costed(&entries, (Costs::PerEntry(&costs), ticket.priority), now)
}

/// The stack decided across the local tier and the store, into `ticket`:
/// the `local = true` limits in memory; when they admit, the shared ones
/// in the store (or, when it is unavailable, as `on_failure` says); a
/// shared denial refunds the local tier. `j` is a position in the stack
/// throughout.
async fn decide<'s>(
    store: &Store,
    app: &App,
    snapshot: &'s Snapshot,
    candidate: Charge<'s>,
    ticket: &mut Ticket<'s>,
) -> Admission {
    let plan = candidate.plan;
    let n = ticket.stack.len();
    let (cost, now) = (candidate.cost, candidate.now);
    // The two tiers' positions (a shared limit without a key is skipped).
    let is_shared = |j: usize| snapshot.is_shared(plan.stack[j]);
    let local_at: SmallVec<[usize; INLINE]> = (0..n).filter(|&j| !is_shared(j)).collect();
    let shared_at: SmallVec<[usize; INLINE]> = (0..n)
        .filter(|&j| is_shared(j) && ticket.keys[j].is_some())
        .collect();
    let mut entries: SmallVec<[EntryVerdict; INLINE]> = smallvec::smallvec![SKIPPED; n];
    let mut local = check_tier(ticket, &local_at, cost, now);
    for (&j, verdict) in local_at.iter().zip(&local.entries) {
        entries[j] = *verdict;
    }
    let mut permits = local.take_permits();
    let mut denied_by = local.denied_by.map(|d| local_at[d]);
    let mut via_store = false;
    if denied_by.is_none() && !shared_at.is_empty() {
        let shared = shared_entries(snapshot, candidate, ticket, &shared_at);
        match store.decide(&shared).await {
            Ok(decision) => {
                via_store = true;
                for ((&j, e), verdict) in shared_at.iter().zip(&shared).zip(&decision.verdicts) {
                    if let Some(verdict) = verdict {
                        entries[j] = EntryVerdict {
                            outcome: outcome_of(verdict, e.shadow),
                            verdict: *verdict,
                        };
                    }
                }
                for lease in decision.leases {
                    permits.hold(Box::new(lease));
                }
            }
            Err(Unavailable) => match store.on_failure() {
                OnFailure::Local => {
                    let mut fallback = fall_back(ticket, &shared_at, cost, now);
                    for (&j, verdict) in shared_at.iter().zip(&fallback.entries) {
                        entries[j] = *verdict;
                    }
                    permits.append(fallback.take_permits());
                }
                // Not limited by the shared limits (they show as skipped).
                OnFailure::Allow => {}
                OnFailure::Deny => {
                    refund_local(ticket, &local_at, &entries, cost, now);
                    return Admission::StoreDown;
                }
            },
        }
        denied_by = (0..n).find(|&j| entries[j].outcome == Outcome::Denied);
        if denied_by.is_some() {
            refund_local(ticket, &local_at, &entries, cost, now);
            permits = Permits::default();
            uncharged(ticket, &local_at, &mut entries, now);
        }
    }
    let delay = if denied_by.is_some() {
        0
    } else {
        (0..n)
            .filter(|&j| !ticket.stack[j].shadow)
            .map(|j| entries[j].verdict.delay)
            .max()
            .unwrap_or(0)
    };
    ticket.via_store = via_store;
    ticket.decision = StackDecision::from_parts(entries, denied_by, delay, permits);
    answer(app, snapshot, &candidate, ticket)
}

/// The store's entries of the stack's shared limits at `at` (each with a
/// key), with what this request charges them.
fn shared_entries<'s>(
    snapshot: &Snapshot,
    candidate: Charge<'_>,
    ticket: &Ticket<'s>,
    at: &[usize],
) -> SmallVec<[SharedEntry<'s>; INLINE]> {
    at.iter()
        .filter_map(|&j| {
            let limit = ticket.stack[j];
            Some(SharedEntry {
                // The numbers in force: a key's override's, if it has one.
                algorithm: ticket.algorithms[j],
                lease: limit.lease.unwrap_or(0),
                cost: ticket.cost_of(j, candidate.cost),
                remember: snapshot.remembers_denials(candidate.plan.stack[j]),
                ..store_entry(limit, ticket.plan, ticket.keys[j]?)
            })
        })
        .collect()
}

/// The shared limits at `at` decided by their node-local fallback
/// (`on_failure = "local"`), whose numbers (scaled by `local_fraction`)
/// then replace the shared ones in `ticket`: the answer gives the quota
/// that decided with its remaining.
fn fall_back(ticket: &mut Ticket<'_>, at: &[usize], cost: u64, now: Nanos) -> StackDecision {
    let decision = check_tier(ticket, at, cost, now);
    for &j in at {
        ticket.algorithms[j] = ticket.limiters[j].algorithm();
    }
    ticket.fallback = true;
    decision
}

/// Gives back what the local tier charged when the shared tier refused.
fn refund_local(
    ticket: &Ticket<'_>,
    local_at: &[usize],
    entries: &[EntryVerdict],
    cost: u64,
    now: Nanos,
) {
    for &j in local_at {
        let refund = -i64::try_from(ticket.cost_of(j, cost)).unwrap_or(i64::MAX);
        if let (Some(key), Outcome::Allowed) = (ticket.keys[j], entries[j].outcome) {
            // Concurrency: dropping the permits is the refund.
            ticket.limiters[j].adjust(key, refund, now);
        }
    }
}

/// A denied stack's admitting entries, which were not charged after all:
/// as in the memory stack, each shows its state as it stands (its `r` in
/// the 429) — the local tier's after its refund, the store's as the store
/// gave it (after its own refunds) — and is denied by another.
fn uncharged(ticket: &Ticket<'_>, local_at: &[usize], entries: &mut [EntryVerdict], now: Nanos) {
    for &j in local_at {
        if let (Some(key), Outcome::Allowed) = (ticket.keys[j], entries[j].outcome) {
            entries[j].verdict = ticket.limiters[j].peek(key, now);
        }
    }
    for entry in entries.iter_mut().filter(|e| e.outcome == Outcome::Allowed) {
        entry.outcome = Outcome::DeniedByOther;
    }
}
