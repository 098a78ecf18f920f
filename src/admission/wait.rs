//! A refused request that may wait for a slot, and one that is shed.
//!
//! After the memory tier refused a request, [`refused`] looks at why:
//!
//! - every non-shadow limit that refused it is a slot limit with a `queue`
//!   (and the request could fit it at all): it waits. [`refused`] returns
//!   the waiting, boxed so that the request future of every other request
//!   stays its size;
//! - the first refusal is a slot limit without a queue: counted shed
//!   (`full`), refused at once;
//! - otherwise a rate limit refused it, and nothing changes.
//!
//! Waiting holds nothing: the refusal charged nothing, the request joins
//! the line of the limit that refused it (`limit::queue`) and sleeps until
//! a release wakes it or its `max_wait` (from its arrival) passes. Woken,
//! it decides its whole stack again at the time it woke, all or nothing as
//! on arrival, so a stack can never end half-charged: admitted, it goes on
//! with what that decision charged; refused by the same limit (another
//! request took the slot first) it goes back to the front of its lane;
//! refused by another slot limit with a queue, it waits there (within the
//! first deadline); refused by anything else, it is answered that refusal.
//! The request's future owns its place in the line: a client that goes
//! away drops it, which leaves the line and hands on a wake-up it did not
//! use.
//!
//! Right after joining it decides once more before sleeping: a slot
//! released between the first decision and the join found nobody to wake,
//! and this second look takes it.
//!
//! Worked example: `concurrency` `max = 2`, `queue = { max_wait = "200ms" }`,
//! two requests in flight. A third is refused, joins the line, decides
//! again (still full) and sleeps. 80 ms later the first response ends: its
//! permit wakes the third, which decides again, is admitted with the freed
//! slot, and its ticket carries the 80 ms waited (`queued_ms` in its log line).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use super::hold::record_wait;
use super::ticket::Hold;
use super::{Charge, Ticket, check_in_memory};
use crate::app::{App, Snapshot};
use crate::limit::queue::Waiter;
use crate::limit::{Algorithm, Limiter, Outcome, Shed, SlotQueue, StackDecision};

/// The waiting a refused request does, when it may wait.
pub(super) type Waiting<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// A request the memory tier refused at `by`: its wait for a slot, or
/// `None` when it is answered at once (counted shed when a slot limit
/// refused it). A rate limit's refusal neither waits nor is shed (the
/// first refusing entry is `by`, and only slot limits have a queue): one
/// branch, the common denial's whole cost here.
#[inline(always)]
pub(super) fn refused<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    charge: &'a Charge<'s>,
    ticket: &'a mut Ticket<'s>,
    by: usize,
) -> Option<Waiting<'a>> {
    if !by_slot_limit(ticket, by) {
        return None;
    }
    refused_at_slot(app, snapshot, charge, ticket, by)
}

/// Whether the refusal at `by` is a slot limit's, which [`refused`] takes
/// up (to queue the request or count it shed); every other refusal is
/// answered at once.
#[inline(always)]
pub(super) fn by_slot_limit(ticket: &Ticket<'_>, by: usize) -> bool {
    matches!(
        ticket.algorithms.get(by),
        Some(Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. })
    )
}

/// [`refused`] by a slot limit.
#[inline(never)]
fn refused_at_slot<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    charge: &'a Charge<'s>,
    ticket: &'a mut Ticket<'s>,
    by: usize,
) -> Option<Waiting<'a>> {
    match queueable(ticket) {
        Some(target) => Some(Box::pin(wait(app, snapshot, charge, ticket, target))),
        None => {
            shed_if_slot(app, snapshot, charge, ticket, by, Shed::Full);
            None
        }
    }
}

/// The position of the first refusing limit when every non-shadow limit
/// that refused the request is a slot limit with a waiting line that the
/// request could fit at all.
fn queueable(ticket: &Ticket<'_>) -> Option<usize> {
    let mut first = None;
    for (j, entry) in ticket.decision.entries.iter().enumerate() {
        if entry.outcome != Outcome::Denied {
            continue;
        }
        let waits = ticket.limiters[j].queue().is_some() && !entry.verdict.never;
        if !waits {
            return None;
        }
        first.get_or_insert(j);
    }
    first
}

/// Counts a refusal at the slot limit at `by` as shed for `reason` (and
/// notes it for the problem's `priority`); a rate limit's refusal is not
/// shedding.
fn shed_if_slot(
    app: &App,
    snapshot: &Snapshot,
    charge: &Charge<'_>,
    ticket: &mut Ticket<'_>,
    by: usize,
    reason: Shed,
) {
    if !matches!(
        ticket.algorithms.get(by),
        Some(Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. })
    ) {
        return;
    }
    let Some(&id) = charge.plan.stack.get(by) else {
        return;
    };
    ticket.shed = Some(reason);
    app.metrics().record_shed(
        snapshot.limit_label(id),
        ticket.priority.label(),
        reason.label(),
    );
}

/// A place in a limit's line; dropped, it leaves the line (see the module
/// doc: a wake-up it did not use goes to the next waiter).
struct Place<'q> {
    queue: &'q SlotQueue,
    waiter: Arc<Waiter>,
    /// Admitted: the wake-up (if any) was used.
    served: bool,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.queue.leave(&self.waiter, !self.served);
    }
}

/// Waits for a slot of the limit at `target` and decides the stack again
/// until admitted or refused (module doc); the ticket ends as that last
/// decision left it.
async fn wait<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    charge: &Charge<'s>,
    ticket: &mut Ticket<'s>,
    mut target: usize,
) {
    let arrival = charge.now;
    let max_wait = |ticket: &Ticket<'s>, at: usize| {
        ticket.limiters[at]
            .queue()
            .map_or(0, |q| q.params().max_wait)
    };
    let mut deadline = arrival.saturating_add(max_wait(ticket, target));
    let mut place: Option<Place<'s>> = None;
    loop {
        // The snapshot's limiter, not the ticket's borrow of it: the place
        // outlives this iteration's look at the ticket.
        let limiter: &'s Limiter = ticket.limiters[target];
        let Some(queue) = limiter.queue().map(|q| &**q) else {
            return;
        };
        let now = app.clock.now();
        match &place {
            Some(held) if std::ptr::eq(held.queue, queue) => {
                if held.waiter.was_woken() {
                    queue.rejoin(&held.waiter);
                }
            }
            _ => {
                drop(place.take());
                let key = ticket.keys[target].map_or(0, |k| k.halves().1);
                let fair = ticket.fair_at(target);
                match queue.join(key, ticket.priority, fair, now) {
                    Ok(waiter) => {
                        place = Some(Place {
                            queue,
                            waiter,
                            served: false,
                        })
                    }
                    Err(reason) => {
                        shed_if_slot(app, snapshot, charge, ticket, target, reason);
                        return;
                    }
                }
            }
        }
        // Counted in the line before looking at the slots again: a
        // release from now on wakes someone (see `ConcurrencyPermit::drop`).
        fence(Ordering::SeqCst);
        let now = app.clock.now();
        ticket.decision = StackDecision::default();
        check_in_memory(charge, now, ticket);
        match ticket.decision.denied_by {
            None => {
                if let Some(held) = place.as_mut() {
                    held.served = true;
                }
                queue.granted(now);
                // Its wait is the request's `queued_ms` and a
                // `tollgate_queue_wait_seconds` observation, as a hold's.
                let waited = Hold {
                    position: target,
                    wait: now.saturating_sub(arrival),
                };
                record_wait(app, snapshot, charge.plan, ticket, waited);
                return;
            }
            Some(by) => match queueable(ticket) {
                None => {
                    drop(place);
                    shed_if_slot(app, snapshot, charge, ticket, by, Shed::Full);
                    return;
                }
                Some(next) if next != target => {
                    target = next;
                    deadline = deadline.min(arrival.saturating_add(max_wait(ticket, next)));
                    continue;
                }
                Some(_) => {}
            },
        }
        let Some(held) = &place else {
            return;
        };
        let left = deadline.saturating_sub(app.clock.now());
        let woken = left > 0
            && tokio::time::timeout(Duration::from_nanos(left), held.waiter.woken())
                .await
                .is_ok();
        if !woken {
            drop(place);
            shed_if_slot(app, snapshot, charge, ticket, target, Shed::Timeout);
            return;
        }
    }
}
