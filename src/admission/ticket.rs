//! The ticket: everything admission learnt and decided about one request,
//! filled in place (returned by value it was copied twice, 1.1 KB) and
//! kept until the response: the stack, each limit's key, limiter and
//! algorithm, the verdicts, the permits, the caller's plan.

use std::borrow::Cow;
use std::net::IpAddr;

use smallvec::SmallVec;

use crate::app::RoutePlan;
use crate::config::tokens::Unit;
use crate::config::{HeaderStyles, LimitConfig};
use crate::limit::stack::INLINE;
use crate::limit::{
    Algorithm, EntryVerdict, LimitKey, Limiter, Nanos, Permits, Priority, Shed, StackDecision,
};
use crate::ratelimit_policy::{StackView, least_remaining, policy_header};

/// A request's `fair_by` values: (position in the stack, the value's digest half).
pub(super) type FairValues = SmallVec<[(usize, u64); 2]>;

/// One request's admission record, in stack order.
pub struct Ticket<'s> {
    /// The route's limits.
    pub(super) stack: SmallVec<[&'s LimitConfig; INLINE]>,
    /// The algorithm in force for each (the caller's plan may change it).
    pub(super) algorithms: SmallVec<[Algorithm; INLINE]>,
    /// The limiter charged for each.
    pub(super) limiters: SmallVec<[&'s Limiter; INLINE]>,
    /// Each limit's key for this request (`None`: skipped).
    pub(super) keys: SmallVec<[Option<LimitKey>; INLINE]>,
    /// Each entry's verdict and, for a leaky bucket in delay mode or a token
    /// bucket's `wait`, how long to hold the request before forwarding; the
    /// permits of an admitted request.
    pub(super) decision: StackDecision,
    /// The caller's plan, if it has one.
    pub(super) plan: Option<&'s str>,
    /// The client-visible entry closest to its limit (least `r / q`), of
    /// an admitted request: the one its legacy headers describe.
    pub(super) focus: Option<usize>,
    /// The shared entries were decided by the store (not a fallback):
    /// their settlement goes there too.
    pub(super) via_store: bool,
    /// The `on_failure = "local"` fallback decided the shared entries:
    /// `algorithms` holds its scaled numbers for them (what their `r` is
    /// of), not the route's policy's.
    pub(super) fallback: bool,
    /// Some key of the stack has a per-key override: `algorithms` holds its
    /// numbers, which the route's serialized policy does not.
    pub(super) overridden: bool,
    /// What the request reserved on the stack's token (and usd) limits
    /// ([`Charge::tokens`](super::Charge::tokens)); none: every entry is
    /// charged the request's cost. A number, not a cost per entry: the
    /// ticket is moved with every request's future.
    pub(super) reserved: Reservation,
    /// The client behind the trusted proxies, once a limited request's
    /// keys were taken ([`super::admit_request`]).
    pub(super) client_ip: Option<IpAddr>,
    /// The request's priority: its consumer's, else its route's.
    pub(super) priority: Priority,
    /// Slot limits with a `queue` and a `fair_by`: (position, the
    /// request's `fair_by` value's digest half; 0 when it has none). Boxed:
    /// one pointer in the ticket, which every request's future carries, and
    /// an allocation only on a route with such a queue.
    pub(super) fair: Option<Box<FairValues>>,
    /// Refused at a slot limit: why.
    pub(super) shed: Option<Shed>,
    /// How long the admitted request has waited so far, in µs (saturating
    /// at 71 minutes): its hold (what the front waited out) and any other
    /// wait before it goes on. The front logs it as `queued_ms`. A `u32`
    /// beside the flags above, in their padding: the ticket is moved with
    /// every request's future.
    pub(super) waited_us: u32,
}

impl Default for Ticket<'_> {
    /// Empty, field by field and always inlined: derived, it was a call
    /// that built the 1.1 KB ticket and copied it out (~100 instructions
    /// a request, `bench/instructions.sh`); here only the lengths and
    /// flags are written, in the ticket's place.
    #[inline(always)]
    fn default() -> Self {
        Ticket {
            stack: SmallVec::new(),
            algorithms: SmallVec::new(),
            limiters: SmallVec::new(),
            keys: SmallVec::new(),
            decision: StackDecision::default(),
            plan: None,
            focus: None,
            via_store: false,
            fallback: false,
            overridden: false,
            reserved: Reservation::None,
            client_ip: None,
            priority: Priority::Normal,
            fair: None,
            shed: None,
            waited_us: 0,
        }
    }
}

/// What a request reserved on its token and usd limits: as small as an
/// `Option<u64>` (the ticket is moved with every request's future), the
/// priced reservation of a stack with a usd limit boxed.
#[derive(Debug, Default)]
pub(super) enum Reservation {
    /// Nothing: every entry is charged the request's cost.
    #[default]
    None,
    /// Tokens, on a stack without a usd limit.
    Tokens(u64),
    /// Tokens, and their price: what each usd entry is charged
    /// ([`Ticket::cost_of`]) and what the bill prices the usage at.
    Priced(Box<super::reserve::Priced>),
}

impl Reservation {
    /// The tokens reserved.
    #[inline(always)]
    pub(super) fn tokens(&self) -> Option<u64> {
        match self {
            Reservation::None => None,
            Reservation::Tokens(tokens) => Some(*tokens),
            Reservation::Priced(priced) => Some(priced.tokens),
        }
    }

    /// The priced reservation, on a stack with a usd limit.
    pub(super) fn priced(&self) -> Option<&super::reserve::Priced> {
        match self {
            Reservation::Priced(priced) => Some(priced),
            _ => None,
        }
    }
}

/// The wait an admitted request's stack decided: the limit it waits for
/// longest (its position in the stack) and how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Hold {
    pub(crate) position: usize,
    pub(crate) wait: Nanos,
}

/// A ticket's decision, keys and algorithms, owned ([`Ticket::into_parts`]).
pub(crate) struct TicketParts {
    pub(crate) decision: StackDecision,
    pub(crate) keys: SmallVec<[Option<LimitKey>; INLINE]>,
    pub(crate) algorithms: SmallVec<[Algorithm; INLINE]>,
}

impl<'s> Ticket<'s> {
    /// One limit of a stack whose key the caller has ([`super::admit_keyed`]):
    /// `limit` charged on `limiter` under `key`, with `shared` limits' numbers
    /// the configuration's (their limiter holds the scaled fallback).
    pub(crate) fn push_keyed(
        &mut self,
        limit: &'s LimitConfig,
        limiter: &'s Limiter,
        key: Option<LimitKey>,
        shared: bool,
    ) {
        let algorithm = if shared {
            limit.algorithm
        } else {
            limiter.algorithm()
        };
        self.push(limit, algorithm, limiter, key);
    }

    /// A keyed limit whose key has a per-key override: `own` is the
    /// override's limiter, `algorithm` its numbers in force.
    pub(crate) fn push_overridden(
        &mut self,
        limit: &'s LimitConfig,
        algorithm: Algorithm,
        own: &'s Limiter,
        key: LimitKey,
    ) {
        self.overridden = true;
        self.push(limit, algorithm, own, Some(key));
    }

    /// One limit of the stack, in order: its config, algorithm in force,
    /// limiter and key.
    #[inline(always)]
    pub(super) fn push(
        &mut self,
        limit: &'s LimitConfig,
        algorithm: Algorithm,
        limiter: &'s Limiter,
        key: Option<LimitKey>,
    ) {
        self.stack.push(limit);
        self.algorithms.push(algorithm);
        self.limiters.push(limiter);
        self.keys.push(key);
    }

    /// What entry `j` was charged, given the request's `cost`.
    #[inline(always)]
    pub(crate) fn cost_of(&self, j: usize, cost: u64) -> u64 {
        let Some(tokens) = self.reserved.tokens() else {
            return cost;
        };
        match self.stack.get(j).map(|l| l.unit) {
            Some(Unit::Tokens) => tokens,
            Some(Unit::Usd) => self.reserved.priced().map_or(cost, |priced| priced.usd),
            _ => cost,
        }
    }

    /// The stack's limits, in order.
    pub(crate) fn limits(&self) -> &[&'s LimitConfig] {
        &self.stack
    }

    /// Each limit's algorithm in force, in order.
    pub(crate) fn algorithms(&self) -> &[Algorithm] {
        &self.algorithms
    }

    /// The stack as the rate-limit fields describe it.
    pub(crate) fn view(&self, server: HeaderStyles) -> StackView<'_> {
        StackView {
            limits: &self.stack,
            algorithms: &self.algorithms,
            server,
        }
    }

    /// The stack's `RateLimit-Policy`: the route's for the caller's plan,
    /// serialized once per snapshot; when the fallback decided the shared
    /// limits or a key has an override, serialized for this answer from
    /// the numbers that decided.
    #[inline(always)]
    pub(crate) fn policy<'p>(
        &self,
        plan: &'p RoutePlan,
        server: HeaderStyles,
    ) -> Option<Cow<'p, str>> {
        if self.fallback || self.overridden {
            return self.policy_of_numbers(server);
        }
        plan.policy_for(self.plan).map(Cow::Borrowed)
    }

    /// The `RateLimit-Policy` of the numbers that decided. Out of line: a
    /// key with an override, or the fallback's answer (inline, the call of
    /// every other answer cost ~40 instructions).
    #[cold]
    #[inline(never)]
    fn policy_of_numbers<'p>(&self, server: HeaderStyles) -> Option<Cow<'p, str>> {
        policy_header(self.view(server)).map(|p| Cow::Owned(p.into()))
    }

    /// Each limit's verdict, in stack order.
    pub fn entries(&self) -> &[EntryVerdict] {
        &self.decision.entries
    }

    /// The caller's plan.
    pub fn plan(&self) -> Option<&'s str> {
        self.plan
    }

    /// What the request reserved on the stack's token limits, when its
    /// route has a `tokens` rule and a body.
    pub fn reserved(&self) -> Option<u64> {
        self.reserved.tokens()
    }

    /// On a stack with a usd limit: what the request reserved there in
    /// micro-dollars, and what a usage of `total` tokens costs (priced as
    /// a bill prices a total: the prompt's estimate as input, the rest
    /// output).
    pub(crate) fn reserved_usd(&self) -> Option<(u64, impl Fn(u64) -> u64 + use<>)> {
        let priced = *self.reserved.priced()?;
        let cost = move |total| {
            let usage = super::tokens::total_only(priced.prompt, total);
            crate::llm::price::cost_micros(&priced.price, &usage)
        };
        Some((priced.usd, cost))
    }

    /// The client behind the trusted proxies, as a limited request's keys
    /// saw it; `None` for a request of an unlimited route.
    pub fn client_ip(&self) -> Option<IpAddr> {
        self.client_ip
    }

    /// The request's priority (its consumer's, else its route's).
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// A request refused at a slot limit: its priority and why (the
    /// problem's `priority` and `shed_reason`).
    pub fn shed(&self) -> Option<(Priority, Shed)> {
        self.shed.map(|reason| (self.priority, reason))
    }

    /// The `fair_by` value of the request at the slot limit at `position`
    /// (0: none, one lane).
    pub(super) fn fair_at(&self, position: usize) -> u64 {
        self.fair
            .iter()
            .flat_map(|fair| fair.iter())
            .find(|(at, _)| *at == position)
            .map_or(0, |(_, fair)| *fair)
    }

    /// An admitted request's entry its legacy headers describe.
    pub fn focus(&self) -> Option<usize> {
        self.focus
    }

    /// The hold the stack decided for the admitted request — a leaky
    /// bucket in delay mode, a token bucket's `wait`: the longest of its
    /// non-shadow entries, and which. `None`: forwarded at once.
    pub(crate) fn hold(&self) -> Option<Hold> {
        if self.decision.delay == 0 {
            return None;
        }
        let position = self
            .decision
            .entries
            .iter()
            .zip(&self.stack)
            .position(|(e, limit)| !limit.shadow && e.verdict.delay == self.decision.delay)?;
        Some(Hold {
            position,
            wait: self.decision.delay,
        })
    }

    /// How long the admitted request waited before it went on (`None`: not
    /// at all): `queued_ms` in its log line.
    pub fn waited(&self) -> Option<std::time::Duration> {
        (self.waited_us > 0).then(|| std::time::Duration::from_micros(self.waited_us.into()))
    }

    /// An admitted request's concurrency permits, moved into `into` (which
    /// keeps them until the response ends).
    pub(crate) fn move_permits_into(&mut self, into: &mut Permits) {
        self.decision.move_permits_into(into);
    }

    /// The decision, the keys and the algorithms, taken out (`simulate`
    /// keeps them past the snapshot's borrow).
    pub(crate) fn into_parts(self) -> TicketParts {
        TicketParts {
            decision: self.decision,
            keys: self.keys,
            algorithms: self.algorithms,
        }
    }

    /// The client-visible entry with the least remaining quota (`r / q`).
    pub(super) fn least_remaining(&self, server: HeaderStyles) -> Option<usize> {
        least_remaining(self.view(server), &self.decision.entries)
    }
}
