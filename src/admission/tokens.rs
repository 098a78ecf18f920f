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

use std::sync::Arc;

use smallvec::SmallVec;

use super::{Ticket, shared};
use crate::access_log::TokenTally;
use crate::app::{App, RoutePlan, Snapshot};
use crate::config::OnFailure;
use crate::config::tokens::Unit;
use crate::limit::{Clock, LimitKey, Limiter, Outcome};
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
    /// Token limits charged in node memory.
    local: SmallVec<[LocalEntry; 2]>,
    /// Token limits charged in the store, with the numbers bounding a
    /// settlement's charge, and their labels.
    shared: Vec<OwnedEntry>,
    shared_labels: SmallVec<[Arc<str>; 2]>,
    /// The node-local fallback of each shared entry: where the settlement
    /// goes when the store is down and `on_failure = "local"`.
    shared_fallback: SmallVec<[(Arc<Limiter>, LimitKey); 2]>,
    /// Where the reservation shows as open until settled (each entry's
    /// node-local limiter: explain reads it there).
    open: SmallVec<[(Arc<Limiter>, LimitKey); 2]>,
    store: Option<Arc<RedisStore>>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    settled: bool,
}

/// A token limit charged in memory: its limiter, the key, its label.
type LocalEntry = (Arc<Limiter>, LimitKey, Arc<str>);

impl std::fmt::Debug for Bill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bill")
            .field("reserved", &self.reserved)
            .field("route", &self.route)
            .field("local", &self.local.len())
            .field("shared", &self.shared.len())
            .field("settled", &self.settled)
            .finish()
    }
}

/// The bill of a request `ticket` admitted with a reservation
/// ([`super::Candidate::tokens`]) on the token limits of `plan`'s stack,
/// counted as reserved; `None` when no token limit charged it (all
/// skipped, or none in the stack).
pub fn bill(
    app: &App,
    snapshot: &Snapshot,
    plan: &RoutePlan,
    ticket: &Ticket<'_>,
) -> Option<TokenBill> {
    let reserved = ticket.tokens?;
    let mut bill = Bill {
        reserved,
        tally: Arc::new(TokenTally::new(reserved)),
        route: plan.name.clone(),
        local: SmallVec::new(),
        shared: Vec::new(),
        shared_labels: SmallVec::new(),
        shared_fallback: SmallVec::new(),
        open: SmallVec::new(),
        store: app.store().cloned(),
        clock: app.clock.clone(),
        metrics: app.metrics().clone(),
        settled: false,
    };
    for (j, limit) in ticket.stack.iter().enumerate() {
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
        let limiter = snapshot.limiters(id).for_plan(ticket.plan).clone();
        limiter.open.open(key, reserved);
        bill.open.push((limiter.clone(), key));
        if ticket.via_store && snapshot.is_shared(id) {
            let (algorithm, caller_plan) = shared::algorithm(limit, ticket.plan);
            let entry = SharedEntry {
                limit: &limit.name,
                plan: caller_plan,
                algorithm,
                align: limit.align,
                key,
                shadow: limit.shadow,
                lease: 0,
                cost: 0,
            };
            bill.shared
                .push(OwnedEntry::with_ceiling(&entry, algorithm.with_debt()));
            bill.shared_labels.push(label);
            bill.shared_fallback.push((limiter, key));
        } else {
            bill.local.push((limiter, key, label));
        }
    }
    (!bill.local.is_empty() || !bill.shared.is_empty()).then(|| TokenBill {
        inner: Box::new(bill),
    })
}

impl TokenBill {
    /// What the request reserved.
    pub fn reserved(&self) -> u64 {
        self.inner.reserved
    }

    /// The request's reserved and (once settled) used tokens, shared with
    /// its access-log line.
    pub(crate) fn tally(&self) -> Arc<TokenTally> {
        self.inner.tally.clone()
    }

    /// Settles on `used` tokens, the response's usage (`None`: it reported
    /// none, and the reservation stands).
    pub fn settle(mut self, used: Option<u64>) {
        self.inner.settle(used);
    }
}

impl Bill {
    fn settle(&mut self, used: Option<u64>) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        for (limiter, key) in &self.open {
            limiter.open.close(*key, self.reserved);
        }
        let labels = self
            .local
            .iter()
            .map(|(_, _, label)| label)
            .chain(&self.shared_labels);
        if let Some(used) = used {
            self.tally.set_used(used);
            self.metrics
                .record_usage_ratio(&self.route, used, self.reserved);
        }
        let Some(used) = used else {
            for label in labels {
                self.metrics
                    .record_tokens(&self.route, label, "unsettled", self.reserved);
            }
            return;
        };
        let (kind, amount) = if used >= self.reserved {
            ("charged", used - self.reserved)
        } else {
            ("refunded", self.reserved - used)
        };
        if amount == 0 {
            return;
        }
        for label in labels {
            self.metrics.record_tokens(&self.route, label, kind, amount);
        }
        let magnitude = i64::try_from(amount).unwrap_or(i64::MAX);
        let delta = if kind == "charged" {
            magnitude
        } else {
            -magnitude
        };
        let now = self.clock.now();
        for (limiter, key, _) in &self.local {
            limiter.adjust_with_debt(*key, delta, now);
        }
        match &self.store {
            _ if self.shared.is_empty() => {}
            Some(store) if !store.is_down() => store.settle_owned(&self.shared, delta),
            // The store is down: as its decisions would, the settlement
            // goes to the node's own limits under `on_failure = "local"`,
            // and is dropped under "allow" and "deny" (nothing is counted
            // there while the store is away).
            Some(store) if store.on_failure() == OnFailure::Local => {
                for (limiter, key) in &self.shared_fallback {
                    limiter.adjust_with_debt(*key, delta, now);
                }
            }
            _ => {}
        }
    }
}

impl Drop for TokenBill {
    fn drop(&mut self) {
        // A response that ended without its usage (cut, malformed, absent),
        // or a client that went away: the reservation stands.
        self.inner.settle(None);
    }
}
