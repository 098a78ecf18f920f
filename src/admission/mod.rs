//! Admission: whether a request may pass, decided as a value.
//!
//! The one place that decides. Its fronts — the proxy (`proxy::handler`),
//! `/auth` (`decision::auth`) and `simulate` — hand it the routed request
//! (a [`Routed`]: the route, the head, the peer, the body, the time) in one
//! call, [`admit_request`] (or, without a store, [`decide_request`], in
//! two halves for `simulate --compare`; the
//! proxy calls its two halves, [`admit_at_once`] and, where that stopped
//! to wait, [`admit_later`]), and
//! get a [`RequestAdmission`] back: admitted with its token bill, denied,
//! a key missing, the store down, the body refused, or the caller
//! unidentified. What they need to answer it (the limit that fired, the
//! verdicts behind the rate-limit fields, the permits to hold, what a later
//! settlement charges, the client IP) is in the request's [`Ticket`]. The
//! Envoy service's descriptors, whose entries are the key, come in keyed
//! ([`admit_keyed`], a [`Charge`]); the admin listener's explain endpoint
//! reads one key's state ([`explain`]), its reset empties it ([`reset`]);
//! a quota route reads the caller's own states ([`quota`]).
//!
//! Inside, in the order a request meets them:
//! - [`identify`]: the caller's verified token and consumer (`[api_keys]`),
//!   refreshing a `jwks_url` issuer's keys once for an unknown `kid`;
//! - [`body`]: the body read within `max_key_body` when a limit keys on it
//!   or the route reserves tokens;
//! - the client IP behind trusted proxies, the body's fields, and
//!   `reserve`: what the request reserves on its token limits;
//! - the limits' keys and the memory tier, all or nothing
//!   ([`crate::limit::check_stack_into`]);
//! - `shared`: with a store, the `local = true` limits in memory, then the
//!   shared ones in one store call (leases spent first), `on_failure` when
//!   the store is down;
//! - `wait`: a request refused only by slot limits with a `queue` waits
//!   for a slot (holding nothing) and is decided again, or is shed;
//! - `record`: each limit's outcome counted, near-limit keys;
//! - [`tokens`]: an admitted request's bill, its reservation settled from
//!   the response's usage when its body ends;
//! - `settle`: after the response, `cost_header`'s difference charged or
//!   refunded where the request was charged;
//! - [`hold`]: what a front awaits between an admission and its next
//!   step when the stack holds the request (a token bucket's `wait`, a
//!   leaky bucket's delay), recorded as a wait.
//!
//! Below the fronts: it names no HTTP response, no connection and no
//! upstream; each front turns a [`RequestAdmission`] into its own answer
//! (`answer::ratelimit` writes the fields and the 429).

pub mod body;
pub mod explain;
pub(crate) mod hold;
pub mod identify;
pub mod quota;
mod record;
mod request;
pub(crate) mod reserve;
pub mod reset;
mod settle;
mod shared;
pub(crate) mod ticket;
pub mod tokens;
pub(crate) mod usage;
mod wait;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use smallvec::SmallVec;

use crate::app::{App, RoutePlan, Snapshot};
use crate::identity::keys::{RequestFacts, extract, limit_key};
use crate::limit::stack::{Costs, INLINE};
use crate::limit::{Nanos, StackEntry, check_stack_into};
use crate::store::RedisStore;

pub use identify::Identity;
pub use request::{
    Client, Identified, Later, Refused, RequestAdmission, RequestBody, Routed, admit_at_once,
    admit_later, admit_request, decide_identified, decide_request, identify_request,
};
pub(crate) use settle::reported_count;
pub use settle::settle;
pub use ticket::Ticket;

/// What the stack's decision answered (inside admission, and for a keyed
/// stack: [`admit_keyed`]). A request's whole answer, its caller and body
/// included, is a [`RequestAdmission`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Every limit of the stack admitted (shadow limits and skipped keys
    /// included): the ticket holds the permits to keep until the response
    /// ends, the entry its legacy headers describe, what to settle.
    Allowed,
    /// The limit at `by` (its position in the route's stack) denied; nothing
    /// was charged.
    Denied { by: usize },
    /// The limit at `position` needs a key the request lacks
    /// (`on_missing_key = "deny"`); counted as its denial.
    MissingKey { position: usize },
    /// The shared store is unavailable and `on_failure = "deny"`; what the
    /// local tier charged was refunded.
    StoreDown,
}

/// What a stack is decided on once its keys are in the ticket: the whole
/// of a keyed stack's candidate (the decision service's descriptors, whose
/// entries are the key), and the part of a request's that the tiers read.
#[derive(Clone, Copy)]
pub struct Charge<'s> {
    /// The matched route's plan (`snapshot.routes[index]`, or a stack the
    /// decision service compiled), looked up once by the caller.
    pub plan: &'s RoutePlan,
    /// What the request charges each request limit of its stack.
    pub cost: u64,
    /// What it reserves on each token limit (`unit = "tokens"`), when its
    /// route has a `tokens` rule; `None` charges token limits `cost`.
    pub tokens: Option<u64>,
    /// The request's time on the limiters' clock.
    pub now: Nanos,
}

/// A keyed stack (its entries pushed into `ticket` with
/// [`Ticket::push_keyed`]) decided: the memory tier or, when some limit is
/// shared and the gateway has a store, the store.
pub fn admit_keyed<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    charge: Charge<'s>,
    ticket: &'a mut Ticket<'s>,
) -> Admitting<'a> {
    let store = app.store().filter(|_| charge.plan.shared);
    match store {
        None => Admitting::Decided(decide_in_memory(app, snapshot, &charge, ticket)),
        Some(store) => {
            Admitting::Asking(shared::decide_boxed(store, app, snapshot, charge, ticket))
        }
    }
}

/// [`admit_keyed`]'s answer: decided already, or waiting for the store.
pub enum Admitting<'a> {
    Decided(Admission),
    Asking(Pin<Box<dyn Future<Output = Admission> + Send + 'a>>),
}

impl Future for Admitting<'_> {
    type Output = Admission;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Admission> {
        match self.get_mut() {
            Admitting::Decided(admission) => Poll::Ready(*admission),
            Admitting::Asking(asking) => asking.as_mut().poll(cx),
        }
    }
}

/// Each limit of the route's stack with this request's key, the limiter it
/// is charged on (the caller's plan's) and the algorithm in force, into
/// `ticket`. `shared`: the store decides the shared limits, whose numbers
/// are then the plan's unscaled ones (their limiters hold the fallback).
#[inline(always)]
fn key_stack<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    (parts, identity): (&Parts, &Identity<'_, 's>),
    charge: &Charge<'s>,
    shared: bool,
    ticket: &mut Ticket<'s>,
) -> Result<(), Admission> {
    let plan = charge.plan;
    let facts = RequestFacts {
        client: identity.client_net(snapshot),
        route: &plan.name,
        consumer: identity.consumer,
        body: identity.body,
        token: identity.token,
    };
    let caller_plan = identity.plan;
    ticket.plan = caller_plan;
    for (position, &id) in plan.stack.iter().enumerate() {
        let limit = snapshot.limit_config(id);
        let Ok(key) = limit_key(limit, parts, &facts) else {
            record::missing_key(app.metrics(), plan, position);
            return Err(Admission::MissingKey { position });
        };
        // A plan's limiter is built with the plan's numbers.
        let mut limiter = &**snapshot.limiters(id).for_plan(caller_plan);
        let in_store = shared && snapshot.is_shared(id);
        let mut algorithm = if in_store {
            // The shared numbers: the limiter holds the scaled fallback.
            shared::algorithm(limit, caller_plan).0
        } else {
            limiter.algorithm()
        };
        // A key with an override of its own: its numbers and state.
        if let Some(key) = key
            && let Some((numbers, own)) = snapshot.overridden(id, key, charge.now)
        {
            limiter = own;
            algorithm = if in_store { numbers } else { own.algorithm() };
            ticket.overridden = true;
        }
        ticket.push(limit, algorithm, limiter, key);
        if let Some(queue) = limit.queue.as_ref().filter(|q| !q.fair_by.is_empty()) {
            let fair = extract(&queue.fair_by, parts, &facts).map_or(0, |k| k.halves().1);
            ticket.fair.get_or_insert_default().push((position, fair));
        }
    }
    ticket.reserved = charge
        .tokens
        .map_or(ticket::Reservation::None, ticket::Reservation::Tokens);
    Ok(())
}

/// The stack decided with each entry charged in its limit's unit: the
/// reservation on a token limit, the cost on the others. Out of line: only
/// token routes come here.
#[inline(never)]
fn check_in_units(
    entries: &[StackEntry<'_>],
    charge: &Charge<'_>,
    now: Nanos,
    ticket: &mut Ticket<'_>,
) {
    let charges: SmallVec<[u64; INLINE]> = (0..entries.len())
        .map(|j| ticket.cost_of(j, charge.cost))
        .collect();
    check_stack_into(
        entries,
        (Costs::PerEntry(&charges), ticket.priority),
        now,
        &mut ticket.decision,
    );
}

/// The memory tier: the whole stack decided here, all or nothing.
#[inline(always)]
fn decide_in_memory<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    charge: &Charge<'s>,
    ticket: &mut Ticket<'s>,
) -> Admission {
    check_in_memory(charge, charge.now, ticket);
    answer(app, snapshot, charge, ticket)
}

/// The whole stack decided in memory at `now` into the ticket's (empty)
/// decision, not yet recorded: [`decide_in_memory`], and a waiting
/// request's decision again when a slot frees.
#[inline(always)]
fn check_in_memory(charge: &Charge<'_>, now: Nanos, ticket: &mut Ticket<'_>) {
    // The one-limit stack, the common one: its entry alone, no array to
    // fill (~25 instructions a request, `bench/instructions.sh`).
    if let ([limiter], [key], [limit], None) = (
        &ticket.limiters[..],
        &ticket.keys[..],
        &ticket.stack[..],
        ticket.reserved.tokens(),
    ) {
        let entry = StackEntry {
            limiter,
            key: *key,
            shadow: limit.shadow,
        };
        check_stack_into(
            std::slice::from_ref(&entry),
            (Costs::Uniform(charge.cost), ticket.priority),
            now,
            &mut ticket.decision,
        );
        return;
    }
    // Pushed in place, one by one: collected, the array was copied out
    // (~60 instructions); `extend` was an out-of-line call (~80).
    let mut entries: SmallVec<[StackEntry<'_>; INLINE]> = SmallVec::new();
    for ((&limiter, &key), limit) in ticket.limiters.iter().zip(&ticket.keys).zip(&ticket.stack) {
        entries.push(StackEntry {
            limiter,
            key,
            shadow: limit.shadow,
        });
    }
    if ticket.reserved.tokens().is_some() {
        check_in_units(&entries, charge, now, ticket);
    } else {
        check_stack_into(
            &entries,
            (Costs::Uniform(charge.cost), ticket.priority),
            now,
            &mut ticket.decision,
        );
    }
}

/// The stack's outcome recorded and turned into an [`Admission`]; for an
/// admitted request, the entry its legacy headers describe noted.
#[inline(always)]
fn answer(
    app: &App,
    snapshot: &Snapshot,
    charge: &Charge<'_>,
    ticket: &mut Ticket<'_>,
) -> Admission {
    record::decisions(app.metrics(), snapshot, charge, ticket);
    if let Some(by) = ticket.decision.denied_by {
        record::refused_key(app.metrics(), snapshot, charge.plan, ticket, by);
        return Admission::Denied { by };
    }
    ticket.focus = ticket.least_remaining(snapshot.config.server.headers);
    Admission::Allowed
}

/// The store a shared stack is decided in, for the shared step's
/// signature.
type Store = Arc<RedisStore>;
