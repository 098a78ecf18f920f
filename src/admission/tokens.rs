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
//! A spend budget (`unit = "usd"`) is billed the same way in micro-dollars:
//! charged the priced reservation at admission, settled on the usage's
//! price ([`crate::llm::price::cost_micros`]: uncached input, cached input
//! and output each at their price). A usage that reports only a total
//! (`usage = "header:NAME"`) is priced as the prompt's estimate of input
//! (at most the total) and the rest output.
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
use crate::llm::price::{Price, cost_micros};
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
    /// A stack with a usd limit: what it reserved in micro-dollars, at
    /// which price, on what prompt estimate.
    usd: Option<UsdReserved>,
    /// The request's tokens for its log line.
    tally: Arc<TokenTally>,
    route: Arc<str>,
    /// Every token limit that charged the request.
    entries: SmallVec<[BillEntry; 2]>,
    /// Of those decided in the store, the store's entries (with the
    /// numbers bounding a settlement's charge), for its one call, each
    /// marked `true` when a usd limit's (settled by another amount).
    shared: Vec<(OwnedEntry, bool)>,
    store: Option<Arc<RedisStore>>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    settled: bool,
    /// The request's usage event, recorded when it settles.
    usage: Option<Box<UsageNote>>,
    /// Its model's price: a usd limit's reservation's, else `[prices]`'
    /// for the usage event (`None`: unpriced, or neither).
    price: Option<Price>,
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
    /// Tokens or micro-dollars.
    usd: bool,
}

/// A usd reservation: micro-dollars and the prompt's estimate (its
/// price is the bill's [`Bill::price`]).
#[derive(Debug, Clone, Copy)]
struct UsdReserved {
    micros: u64,
    prompt: u64,
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
    // request limits: nothing to settle (the bill may still carry a usage
    // event).
    let reserved = ticket.reserved.tokens().unwrap_or(0);
    let mut bill = Bill {
        reserved,
        usd: ticket.reserved.priced().map(|priced| UsdReserved {
            micros: priced.usd,
            prompt: priced.prompt,
        }),
        tally: Arc::new(TokenTally::new(reserved)),
        route: plan.name.clone(),
        entries: SmallVec::new(),
        shared: Vec::new(),
        store: app.store().cloned(),
        clock: app.clock.clone(),
        metrics: app.metrics().clone(),
        settled: false,
        price: match ticket.reserved.priced() {
            Some(priced) => Some(priced.price),
            None => usage
                .as_ref()
                .and_then(|note| snapshot.config.prices.of(note.model())),
        },
        usage,
    };
    let token_limits = ticket.reserved.tokens().map_or(0, |_| ticket.stack.len());
    // One clock read for the stack's overrides, not one per limit.
    let now = if token_limits > 0 { app.clock.now() } else { 0 };
    for (j, limit) in ticket.stack.iter().take(token_limits).enumerate() {
        let usd = limit.unit == Unit::Usd;
        let (Unit::Tokens | Unit::Usd, Some(key), Outcome::Allowed) = (
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
        let amount = ticket.cost_of(j, reserved);
        // `tollgate_tokens_total` counts tokens: a budget's micro-dollars
        // are not among them.
        if !usd {
            bill.metrics
                .record_tokens(&bill.route, &label, "reserved", reserved);
        }
        let limiter = match snapshot.overrides(id).find(key, now) {
            Some((_, own)) => own,
            None => snapshot.limiters(id).for_plan(ticket.plan).clone(),
        };
        limiter.open.open(key, amount);
        let in_store = ticket.via_store && snapshot.is_shared(id);
        if in_store {
            let entry = SharedEntry {
                algorithm: ticket.algorithms[j],
                ..shared::store_entry(limit, ticket.plan, key)
            };
            let ceiling = entry.algorithm.with_debt();
            bill.shared
                .push((OwnedEntry::with_ceiling(&entry, ceiling), usd));
        }
        bill.entries.push(BillEntry {
            limiter,
            key,
            label,
            in_store,
            usd,
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

    /// Settles on `used` tokens, a response's total usage (`None`: it
    /// reported none, and the reservation stands): a usage header or
    /// trailer, a trace's record.
    pub fn settle(mut self, used: Option<u64>) {
        let usage = used.map(|total| self.inner.total_only(total));
        self.inner.settle(usage, false);
    }

    /// Settles on the usage the response's body reported, its input,
    /// cached input and output priced apart (`None`: it reported none).
    pub fn settle_usage(mut self, usage: Option<Usage>) {
        self.inner.settle(usage, true);
    }
}

/// The amount by which a settlement moves a limit: what was used against
/// what was reserved, as a signed delta (0: nothing to move).
fn delta(used: u64, reserved: u64) -> (&'static str, u64, i64) {
    let (kind, amount, sign) = if used >= reserved {
        ("charged", used - reserved, 1)
    } else {
        ("refunded", reserved - used, -1)
    };
    (
        kind,
        amount,
        sign * i64::try_from(amount).unwrap_or(i64::MAX),
    )
}

/// A usage known only by its `total` (a usage header, a trace's
/// `tokens`): as much input as the prompt's estimate `prompt` (at most the
/// total), the rest output.
pub(crate) fn total_only(prompt: u64, total: u64) -> Usage {
    let input = prompt.min(total);
    Usage {
        input,
        cached: 0,
        output: total - input,
        total,
    }
}

impl Bill {
    /// [`total_only`] on this bill's prompt estimate.
    fn total_only(&self, total: u64) -> Usage {
        total_only(self.usd.map_or(0, |usd| usd.prompt), total)
    }

    /// Settles on `usage`; `split`: the response said how it splits into
    /// input, cached input and output (a count from a header has the total
    /// only, and its usage event says so).
    fn settle(&mut self, usage: Option<Usage>, split: bool) {
        if std::mem::replace(&mut self.settled, true) {
            return;
        }
        // The usage priced once, for the event and a usd limit alike; the
        // clock read once, for both.
        let priced = usage.and_then(|usage| Some(cost_micros(&self.price?, &usage)));
        let now = if usage.is_some() || self.usage.is_some() {
            self.clock.now()
        } else {
            0
        };
        if let Some(note) = self.usage.take() {
            // What the request cost: its usage priced, else (no usage
            // reported) what a usd limit kept of its reservation.
            let cost = usage.map_or(self.usd.map(|usd| usd.micros), |_| priced);
            let used = usage.map(|usage| usage.total);
            note.record(&self.route, used, usage.filter(|_| split), now, cost);
        }
        if self.entries.is_empty() {
            return;
        }
        let reserved_usd = self.usd.map_or(0, |usd| usd.micros);
        for entry in &self.entries {
            let reserved = if entry.usd {
                reserved_usd
            } else {
                self.reserved
            };
            entry.limiter.open.close(entry.key, reserved);
        }
        let Some(usage) = usage else {
            for entry in self.entries.iter().filter(|entry| !entry.usd) {
                self.metrics
                    .record_tokens(&self.route, &entry.label, "unsettled", self.reserved);
            }
            return;
        };
        let used = usage.total;
        self.tally.set_used(used);
        self.metrics
            .record_usage_ratio(&self.route, used, self.reserved);
        let (kind, amount, tokens) = delta(used, self.reserved);
        if amount > 0 {
            for entry in self.entries.iter().filter(|entry| !entry.usd) {
                self.metrics
                    .record_tokens(&self.route, &entry.label, kind, amount);
            }
        }
        // A usd reservation comes with its price, so `priced` is there.
        let usd = self
            .usd
            .map_or(0, |usd| delta(priced.unwrap_or(usd.micros), usd.micros).2);
        // The store's entries, tokens and micro-dollars each by its own
        // delta, in one call (one per slot on Cluster) while it is up. Down,
        // as its decisions would, the settlement goes to the node's own
        // limits under `on_failure = "local"`, and is dropped under
        // "allow" and "deny" (nothing is counted there while the store is
        // away).
        let store_takes_shared = match &self.store {
            Some(store) if !store.is_down() => {
                store.settle_owned(
                    self.shared
                        .iter()
                        .map(|(entry, is_usd)| (entry, if *is_usd { usd } else { tokens })),
                );
                true
            }
            Some(store) => store.on_failure() != OnFailure::Local,
            None => false,
        };
        for entry in &self.entries {
            let delta = if entry.usd { usd } else { tokens };
            if delta != 0 && (!entry.in_store || !store_takes_shared) {
                entry.limiter.adjust_with_debt(entry.key, delta, now);
            }
        }
    }
}

impl Drop for TokenBill {
    fn drop(&mut self) {
        // A response that ended without its usage (cut, malformed, absent),
        // or a client that went away: the reservation stands.
        self.inner.settle(None, false);
    }
}

#[cfg(test)]
mod tests {
    use crate::limit::{Algorithm, LimitKey, Limiter, NANOS_PER_SEC};
    use crate::llm::price::{Price, cost_micros, reservation_micros};
    use crate::llm::usage::Usage;

    /// A million requests reserved and settled on a usd fixed window, as a
    /// bill does (reserve at admission, then the difference to the priced
    /// usage): the spend the limit holds is exactly the sum of the
    /// requests' costs, each computed alone in integer micro-dollars.
    #[test]
    fn a_million_settlements_add_up_to_the_exact_sum() {
        // $10,000,000: never full over the run.
        let limit = 10_000_000 * 1_000_000;
        let limiter = Limiter::new(
            "budget",
            Algorithm::FixedWindow {
                limit,
                window: 30 * 86_400 * NANOS_PER_SEC,
            },
            8,
        );
        let key = LimitKey::from_u128(47);
        let now = NANOS_PER_SEC;
        let price = Price {
            input: 2_500_000,
            cached_input: 1_250_000,
            output: 10_000_000,
        };
        let mut rng = fastrand::Rng::with_seed(14);
        let mut expected: u64 = 0;
        for _ in 0..1_000_000 {
            let (prompt, budget) = (rng.u64(1..4_000), rng.u64(1..2_000));
            let reserved = reservation_micros(&price, prompt, budget);
            assert!(limiter.check(key, reserved, now).verdict.allowed);
            let input = rng.u64(0..=prompt);
            let usage = Usage {
                input,
                cached: rng.u64(0..=input),
                output: rng.u64(0..=budget),
                total: 0,
            };
            let cost = cost_micros(&price, &usage);
            let delta = i64::try_from(cost).unwrap() - i64::try_from(reserved).unwrap();
            limiter.adjust_with_debt(key, delta, now);
            expected += cost;
        }
        let left = limiter.peek(key, now).remaining;
        assert_eq!(limit - left, expected);
    }
}
