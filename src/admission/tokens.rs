//! Token quotas settled when the response ends: a request admitted on
//! token limits (`unit = "tokens"`) was charged its reservation there; its
//! [`TokenBill`] goes with the response body and, once the body has ended
//! (or the client has gone), charges the difference between the tokens the
//! response reported and the reservation — a refund when it used fewer, a
//! charge that may take the key below empty (by at most its quota) when it
//! used more, so that the tokens admitted over time follow the limit. A
//! response that never reported its usage keeps the whole reservation,
//! counted as `unsettled`.
//!
//! The bill owns what it needs (the limiters, the store entries, the
//! metrics): a response outlives its request's borrow of the snapshot, and
//! a reload meanwhile does not lose the settlement.
//!
//! With `[usage]`, the bill also carries the request's usage event
//! ([`UsageNote`]), recorded when it settles: the seam where the settled
//! usage is known. A route with `usage_events = true` and no token limit
//! gets a bill for that alone (no entries, nothing reserved).

use std::sync::Arc;

use smallvec::SmallVec;

use super::usage::UsageNote;
use super::{Ticket, shared};
use crate::access_log::TokenTally;
use crate::app::{App, RoutePlan, Snapshot};
use crate::config::OnFailure;
use crate::config::tokens::Unit;
use crate::limit::{Clock, LimitKey, Limiter, Outcome};
use crate::llm::usage::Usage;
use crate::metrics::Metrics;
use crate::store::{OwnedEntry, RedisStore, SharedEntry};

/// A request's reservation on its stack's token limits, to settle when its
/// response ends. Dropped unsettled, the reservation stands (and is counted).
#[derive(Debug)]
pub struct TokenBill {
    inner: Box<Bill>,
}

struct Bill {
    reserved: u64,
    /// The request's tokens for its log line.
    tally: Arc<TokenTally>,
    route: Arc<str>,
    /// Every token limit that charged the request.
    entries: SmallVec<[BillEntry; 2]>,
    /// Of those decided in the store, the store's entries (with the
    /// numbers bounding a settlement's charge), for its one call.
    shared: Vec<OwnedEntry>,
    store: Option<Arc<RedisStore>>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    settled: bool,
    /// The request's usage event, recorded when it settles.
    usage: Option<Box<UsageNote>>,
}

/// A token limit that charged the request.
struct BillEntry {
    /// The node's limiter of it: the charge itself when decided in
    /// memory, the fallback when in the store; its open reservations
    /// (explain) either way.
    limiter: Arc<Limiter>,
    key: LimitKey,
    label: Arc<str>,
    /// Decided in the store (its entry is in [`Bill::shared`]).
    in_store: bool,
}

impl std::fmt::Debug for Bill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bill")
            .field("reserved", &self.reserved)
            .field("route", &self.route)
            .field("entries", &self.entries.len())
            .field("shared", &self.shared.len())
            .field("settled", &self.settled)
            .finish()
    }
}

/// The bill of a request `ticket` admitted with a reservation
/// ([`super::Charge::tokens`]) on the token limits of `plan`'s stack,
/// counted as reserved, carrying its `usage` event; `None` when no token
/// limit charged it (all skipped, or none in the stack) and it has no
/// event to carry.
pub(crate) fn bill(
    app: &App,
    snapshot: &Snapshot,
    plan: &RoutePlan,
    ticket: &Ticket<'_>,
    usage: Option<Box<UsageNote>>,
) -> Option<TokenBill> {
    // Without a reservation the token limits were charged the cost, as
    // request limits: nothing to settle.
    let reserved = ticket.tokens.unwrap_or(0);
    let mut bill = Bill {
        reserved,
        tally: Arc::new(TokenTally::new(reserved)),
        route: plan.name.clone(),
        entries: SmallVec::new(),
        shared: Vec::new(),
        store: app.store().cloned(),
        clock: app.clock.clone(),
        metrics: app.metrics().clone(),
        settled: false,
        usage,
    };
    let token_limits = ticket.tokens.map_or(0, |_| ticket.stack.len());
    for (j, limit) in ticket.stack.iter().take(token_limits).enumerate() {
        let (Unit::Tokens, Some(key), Outcome::Allowed) = (
            limit.unit,
            ticket.keys[j],
            ticket
                .decision
                .entries
                .get(j)
                .map_or(Outcome::Skipped, |e| e.outcome),
        ) else {
            continue;
        };
        let Some(&id) = plan.stack.get(j) else {
            continue;
        };
        let label = snapshot.limit_label(id).clone();
        bill.metrics
            .record_tokens(&bill.route, &label, "reserved", reserved);
        let limiter = match snapshot.overrides(id).find(key, app.clock.now()) {
            Some((_, own)) => own,
            None => snapshot.limiters(id).for_plan(ticket.plan).clone(),
        };
        limiter.open.open(key, reserved);
        let in_store = ticket.via_store && snapshot.is_shared(id);
        if in_store {
            let entry = SharedEntry {
                algorithm: ticket.algorithms[j],
                ..shared::store_entry(limit, ticket.plan, key)
            };
            let ceiling = entry.algorithm.with_debt();
            bill.shared.push(OwnedEntry::with_ceiling(&entry, ceiling));
        }
        bill.entries.push(BillEntry {
            limiter,
            key,
            label,
            in_store,
        });
    }
    (!bill.entries.is_empty() || bill.usage.is_some()).then(|| TokenBill {
        inner: Box::new(bill),
    })
}

impl TokenBill {
    /// The request's reserved and (once settled) used tokens, shared with
    /// its access-log line; `None` for a bill that reserved none (it only
    /// carries a usage event).
    pub(crate) fn tally(&self) -> Option<Arc<TokenTally>> {
        (!self.inner.entries.is_empty()).then(|| self.inner.tally.clone())
    }

    /// The response's status, for the usage event.
    pub(crate) fn set_status(&mut self, status: u16) {
        if let Some(usage) = &mut self.inner.usage {
            usage.set_status(status);
        }
    }

    /// Settles on `used` tokens, the response's usage (`None`: it reported
    /// none, and the reservation stands).
    pub fn settle(mut self, used: Option<u64>) {
        self.inner.settle(used, None);
    }

    /// Settles on the usage the response's body reported, split into
    /// input and output (for the usage event).
    pub(crate) fn settle_usage(mut self, usage: Option<Usage>) {
        self.inner.settle(usage.map(|u| u.total), usage);
    }
}

impl Bill {
    fn settle(&mut self, used: Option<u64>, split: Option<Usage>) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        if let Some(usage) = self.usage.take() {
            // Unpriced until `[prices]`: the cost is `None`.
            usage.record(&self.route, used, split, self.clock.now(), None);
        }
        if self.entries.is_empty() {
            return;
        }
        for entry in &self.entries {
            entry.limiter.open.close(entry.key, self.reserved);
        }
        let Some(used) = used else {
            for entry in &self.entries {
                self.metrics
                    .record_tokens(&self.route, &entry.label, "unsettled", self.reserved);
            }
            return;
        };
        self.tally.set_used(used);
        self.metrics
            .record_usage_ratio(&self.route, used, self.reserved);
        let (kind, amount, sign) = if used >= self.reserved {
            ("charged", used - self.reserved, 1)
        } else {
            ("refunded", self.reserved - used, -1)
        };
        if amount == 0 {
            return;
        }
        for entry in &self.entries {
            self.metrics
                .record_tokens(&self.route, &entry.label, kind, amount);
        }
        let delta = sign * i64::try_from(amount).unwrap_or(i64::MAX);
        let now = self.clock.now();
        // The store's entries in one call while it is up. Down, as its
        // decisions would, the settlement goes to the node's own limits
        // under `on_failure = "local"`, and is dropped under "allow" and
        // "deny" (nothing is counted there while the store is away).
        let store_takes_shared = match &self.store {
            Some(store) if !self.shared.is_empty() && !store.is_down() => {
                store.settle_owned(&self.shared, delta);
                true
            }
            Some(store) => store.on_failure() != OnFailure::Local,
            None => false,
        };
        for entry in &self.entries {
            if !entry.in_store || !store_takes_shared {
                entry.limiter.adjust_with_debt(entry.key, delta, now);
            }
        }
    }
}

impl Drop for TokenBill {
    fn drop(&mut self) {
        // A response that ended without its usage (cut, malformed, absent),
        // or a client that went away: the reservation stands.
        self.inner.settle(None, None);
    }
}
