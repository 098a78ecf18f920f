//! The shared tier: a stack with limits in the store. Its `local = true`
//! limits are decided in node memory first (a local denial costs no store
//! call), then the shared ones in one store call, all or nothing together:
//! a shared denial refunds the local charges. Leased token buckets spend
//! this node's tokens first, without a call. When the store is unavailable,
//! `on_failure` decides (see the README's "Distributed limits").

use std::future::Future;
use std::pin::Pin;

use smallvec::SmallVec;

use super::{Admission, Charge, Store, Ticket, answer};
use crate::app::{App, Snapshot};
use crate::config::{LimitConfig, OnFailure};
use crate::limit::stack::{Costs, check_stack_costed};
use crate::limit::stack::{INLINE, SKIPPED, outcome_of};
use crate::limit::{
    Algorithm, EntryVerdict, LimitKey, Nanos, Outcome, Permits, StackDecision, StackEntry, Verdict,
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

/// `entries` (the stack's entries at `at`) checked on this node, each
/// charged in its limit's unit: `cost` for all when the request reserves
/// no tokens, with no per-entry list to build.
fn check_charged(
    entries: &[StackEntry<'_>],
    at: &[usize],
    ticket: &Ticket<'_>,
    cost: u64,
    now: Nanos,
) -> StackDecision {
    if ticket.tokens.is_none() {
        return check_stack_costed(entries, Costs::Uniform(cost), now);
    }
    let costs: SmallVec<[u64; INLINE]> = at.iter().map(|&j| ticket.cost_of(j, cost)).collect();
    check_stack_costed(entries, Costs::PerEntry(&costs), now)
}

/// The stack decided across the local tier and the store, into `ticket`.
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
    // Each entry's charge, in its limit's unit.
    let cost_of = |j: usize| ticket.cost_of(j, cost);
    let entry = |j: usize| StackEntry {
        limiter: ticket.limiters[j],
        key: ticket.keys[j],
        shadow: ticket.stack[j].shadow,
    };
    let is_shared = |j: usize| snapshot.is_shared(plan.stack[j]);
    let local_at: SmallVec<[usize; INLINE]> = (0..n).filter(|&j| !is_shared(j)).collect();
    let shared_at: SmallVec<[usize; INLINE]> = (0..n)
        .filter(|&j| is_shared(j) && ticket.keys[j].is_some())
        .collect();
    let local: SmallVec<[StackEntry<'_>; INLINE]> = local_at.iter().map(|&j| entry(j)).collect();
    let mut local_decision = check_charged(&local, &local_at, ticket, cost, now);
    let mut entries: SmallVec<[EntryVerdict; INLINE]> = smallvec::smallvec![SKIPPED; n];
    for (&j, verdict) in local_at.iter().zip(&local_decision.entries) {
        entries[j] = *verdict;
    }
    let mut permits = local_decision.take_permits();
    let mut denied_by = local_decision.denied_by.map(|d| local_at[d]);
    let mut via_store = false;
    if denied_by.is_none() && !shared_at.is_empty() {
        let shared: SmallVec<[SharedEntry<'_>; INLINE]> = shared_at
            .iter()
            .filter_map(|&j| {
                let limit = ticket.stack[j];
                Some(SharedEntry {
                    lease: limit.lease.unwrap_or(0),
                    cost: cost_of(j),
                    remember: snapshot.remembers_denials(plan.stack[j]),
                    ..store_entry(limit, ticket.plan, ticket.keys[j]?)
                })
            })
            .collect();
        // Leased token buckets spend this node's tokens first: no call.
        let mut spent: SmallVec<[usize; INLINE]> = SmallVec::new();
        for (k, (&j, e)) in shared_at.iter().zip(&shared).enumerate() {
            if e.lease > 0
                && let Some(left) = store.spend_leased(e, e.cost)
            {
                spent.push(k);
                entries[j] = EntryVerdict {
                    outcome: Outcome::Allowed,
                    verdict: Verdict::allow(left, 0),
                };
            }
        }
        let remote_at: SmallVec<[usize; INLINE]> =
            (0..shared.len()).filter(|k| !spent.contains(k)).collect();
        let remote: SmallVec<[SharedEntry<'_>; INLINE]> =
            remote_at.iter().map(|&k| shared[k]).collect();
        let answer = if remote.is_empty() {
            Ok(None)
        } else {
            store.decide(&remote).await.map(Some)
        };
        match answer {
            Ok(None) => via_store = true,
            Ok(Some(decision)) => {
                via_store = true;
                let mut all_admitted = true;
                for (&k, verdict) in remote_at.iter().zip(&decision.verdicts) {
                    let (j, e) = (shared_at[k], &shared[k]);
                    if let Some(verdict) = verdict {
                        entries[j] = EntryVerdict {
                            outcome: outcome_of(verdict, e.shadow),
                            verdict: *verdict,
                        };
                        all_admitted &= verdict.allowed || e.shadow;
                    }
                }
                if all_admitted {
                    // A lease took more than the cost: the rest is ours.
                    for (&k, taken) in remote_at.iter().zip(&decision.taken) {
                        if shared[k].lease > 0 && *taken > shared[k].cost {
                            store.add_lease(&shared[k], taken - shared[k].cost);
                        }
                    }
                }
                for lease in decision.leases {
                    permits.hold(Box::new(lease));
                }
            }
            Err(Unavailable) => {
                // The fallback decides every shared limit, leased or not.
                for &k in &spent {
                    store.unspend(&shared[k], shared[k].cost);
                }
                spent.clear();
                match store.on_failure() {
                    OnFailure::Local => {
                        let fallback: SmallVec<[StackEntry<'_>; INLINE]> =
                            shared_at.iter().map(|&j| entry(j)).collect();
                        let mut decision = check_charged(&fallback, &shared_at, ticket, cost, now);
                        for (&j, verdict) in shared_at.iter().zip(&decision.entries) {
                            entries[j] = *verdict;
                        }
                        permits.append(decision.take_permits());
                    }
                    // Not limited by the shared limits (they show as skipped).
                    OnFailure::Allow => {
                        for &j in &shared_at {
                            entries[j] = SKIPPED;
                        }
                    }
                    OnFailure::Deny => {
                        refund_local(ticket, &local_at, &entries, cost, now);
                        return Admission::StoreDown;
                    }
                }
            }
        }
        if (0..n).any(|j| entries[j].outcome == Outcome::Denied) {
            for &k in &spent {
                store.unspend(&shared[k], shared[k].cost);
            }
        }
        denied_by = (0..n).find(|&j| entries[j].outcome == Outcome::Denied);
        if denied_by.is_some() {
            refund_local(ticket, &local_at, &entries, cost, now);
            permits = Permits::default();
            // As in the memory stack: a limit that would have admitted a
            // request the stack denied was not charged, and shows its state
            // as it stands (its `r` in the 429): the local tier's after the
            // refund, a lease's with the tokens put back.
            for &j in &local_at {
                if let (Some(key), Outcome::Allowed) = (ticket.keys[j], entries[j].outcome) {
                    entries[j].verdict = ticket.limiters[j].peek(key, now);
                }
            }
            for &k in &spent {
                let remaining = &mut entries[shared_at[k]].verdict.remaining;
                *remaining = remaining.saturating_add(shared[k].cost);
            }
            for entry in entries.iter_mut().filter(|e| e.outcome == Outcome::Allowed) {
                entry.outcome = Outcome::DeniedByOther;
            }
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
