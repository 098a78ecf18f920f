//! Admission: whether a request may pass, decided as a value.
//!
//! The one place that decides. Its callers — the proxy (`proxy::handler`),
//! `simulate` and, for one key's state, the admin listener's explain
//! endpoint ([`explain`]) — tell it what is known of a request (a
//! [`Candidate`]: the route, who is calling, the cost, the time) and get an
//! [`Admission`] back; what they need to answer it (the limit that fired,
//! the verdicts behind the rate-limit fields, the permits to hold, what a
//! later settlement charges) is in the request's [`Ticket`].
//!
//! Inside, in the order a request meets them:
//! - [`identify`]: the caller's consumer (`[api_keys]`), the client IP
//!   behind trusted proxies, the body's fields — the single copy of a
//!   route's keys;
//! - the limits' keys and the memory tier, all or nothing
//!   ([`crate::limit::check_stack_into`]);
//! - `shared`: with a store, the `local = true` limits in memory, then the
//!   shared ones in one store call (leases spent first), `on_failure` when
//!   the store is down;
//! - `record`: each limit's outcome counted, near-limit keys;
//! - `settle`: after the response, `cost_header`'s difference charged or
//!   refunded where the request was charged;
//! - `reserve`: what a request reserves on its token limits, from its
//!   body (the proxy's and `simulate`'s one computation);
//! - [`tokens`]: a token limit's reservation, settled from the response's
//!   usage when its body ends.
//!
//! Below the pipeline: it names no HTTP response, no connection and no
//! upstream; the proxy turns an [`Admission`] into a response
//! (`proxy::ratelimit`).

pub mod explain;
pub mod identify;
mod record;
pub(crate) mod reserve;
mod settle;
mod shared;
pub(crate) mod ticket;
pub mod tokens;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use smallvec::SmallVec;

use crate::app::{App, RoutePlan, Snapshot};
use crate::identity::keys::{RequestFacts, limit_key};
use crate::limit::stack::{Costs, INLINE};
use crate::limit::{Nanos, StackEntry, check_stack_into};
use crate::store::RedisStore;

pub use identify::Identity;
pub(crate) use settle::reported_count;
pub use settle::settle;
pub use ticket::Ticket;

/// What admission answered for a request.
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

/// A request as admission sees it.
#[derive(Clone, Copy)]
pub struct Candidate<'r, 's> {
    /// The matched route's plan (`snapshot.routes[index]`, or a stack the
    /// decision service compiled), looked up once by the caller.
    pub plan: &'s RoutePlan,
    /// The request's head, for header, query and path keys.
    pub parts: &'r Parts,
    pub identity: Identity<'r, 's>,
    /// What the request charges each request limit of its stack.
    pub cost: u64,
    /// What it reserves on each token limit (`unit = "tokens"`), when its
    /// route has a `tokens` rule; `None` charges token limits `cost`.
    pub tokens: Option<u64>,
    /// The request's time on the limiters' clock.
    pub now: Nanos,
}

/// Decides `candidate` on `snapshot`'s limits into `ticket` (empty on
/// entry): the stack's keys, then its limits in memory or, when the route
/// has shared limits and the gateway a store, in the store as well.
///
/// The one entry point of the request path. Everything up to the store
/// call runs before this returns: a route without shared limits gets a
/// future that is ready at once, and a store's is boxed, so the request
/// future stays as small as without a store (an `async fn` here made it
/// larger). Inlined: with `/auth` a second caller, LLVM kept it out of
/// line, and the request path paid the call and the moves (callgrind:
/// +110 instructions a denied request).
#[inline(always)]
pub fn admit<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    candidate: Candidate<'a, 's>,
    ticket: &'a mut Ticket<'s>,
) -> Admitting<'a> {
    let store = app.store().filter(|_| candidate.plan.shared);
    if let Err(missing) = key_stack(app, snapshot, &candidate, store.is_some(), ticket) {
        return Admitting::Decided(missing);
    }
    decide_keyed(store, app, snapshot, candidate, ticket)
}

/// [`admit`] for a stack whose keys the caller found itself — the decision
/// service's descriptors, whose entries are the key — pushed into `ticket`
/// with [`Ticket::push_keyed`]: the memory tier or, when some limit is
/// shared and the gateway has a store, the store.
pub fn admit_keyed<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    candidate: Candidate<'a, 's>,
    ticket: &'a mut Ticket<'s>,
) -> Admitting<'a> {
    let store = app.store().filter(|_| candidate.plan.shared);
    decide_keyed(store, app, snapshot, candidate, ticket)
}

/// A keyed stack decided in memory, or with `store` when given.
#[inline(always)]
fn decide_keyed<'a, 's: 'a>(
    store: Option<&'a Store>,
    app: &'a App,
    snapshot: &'s Snapshot,
    candidate: Candidate<'a, 's>,
    ticket: &'a mut Ticket<'s>,
) -> Admitting<'a> {
    match store {
        None => Admitting::Decided(decide_in_memory(app, snapshot, &candidate, ticket)),
        Some(store) => Admitting::Asking(shared::decide_boxed(
            store, app, snapshot, candidate, ticket,
        )),
    }
}

/// [`admit`]'s answer: decided already, or waiting for the store.
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

/// [`admit`] without a store: every limit in memory. What `simulate` runs,
/// which has no store; the same code as the request path's memory tier.
pub fn decide<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    candidate: &Candidate<'_, 's>,
    ticket: &mut Ticket<'s>,
) -> Admission {
    if let Err(missing) = key_stack(app, snapshot, candidate, false, ticket) {
        return missing;
    }
    decide_in_memory(app, snapshot, candidate, ticket)
}

/// Each limit of the route's stack with this request's key, the limiter it
/// is charged on (the caller's plan's) and the algorithm in force, into
/// `ticket`. `shared`: the store decides the shared limits, whose numbers
/// are then the plan's unscaled ones (their limiters hold the fallback).
#[inline(always)]
fn key_stack<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    candidate: &Candidate<'_, 's>,
    shared: bool,
    ticket: &mut Ticket<'s>,
) -> Result<(), Admission> {
    let plan = candidate.plan;
    let identity = &candidate.identity;
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
        let Ok(key) = limit_key(limit, candidate.parts, &facts) else {
            record::missing_key(app.metrics(), plan, position);
            return Err(Admission::MissingKey { position });
        };
        // A plan's limiter is built with the plan's numbers.
        let limiter = snapshot.limiters(id).for_plan(caller_plan);
        let algorithm = if shared && snapshot.is_shared(id) {
            // The shared numbers: the limiter holds the scaled fallback.
            shared::algorithm(limit, caller_plan).0
        } else {
            limiter.algorithm()
        };
        ticket.push(limit, algorithm, limiter, key);
    }
    ticket.tokens = candidate.tokens;
    Ok(())
}

/// The stack decided with each entry charged in its limit's unit: the
/// reservation on a token limit, the cost on the others. Out of line: only
/// token routes come here.
#[inline(never)]
fn check_in_units(
    entries: &[StackEntry<'_>],
    candidate: &Candidate<'_, '_>,
    ticket: &mut Ticket<'_>,
) {
    let charges: SmallVec<[u64; INLINE]> = (0..entries.len())
        .map(|j| ticket.cost_of(j, candidate.cost))
        .collect();
    check_stack_into(
        entries,
        Costs::PerEntry(&charges),
        candidate.now,
        &mut ticket.decision,
    );
}

/// The memory tier: the whole stack decided here, all or nothing.
#[inline(always)]
fn decide_in_memory<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    candidate: &Candidate<'_, 's>,
    ticket: &mut Ticket<'s>,
) -> Admission {
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
    if ticket.tokens.is_some() {
        check_in_units(&entries, candidate, ticket);
    } else {
        check_stack_into(
            &entries,
            Costs::Uniform(candidate.cost),
            candidate.now,
            &mut ticket.decision,
        );
    }
    answer(app, snapshot, candidate, ticket)
}

/// The stack's outcome recorded and turned into an [`Admission`]; for an
/// admitted request, the entry its legacy headers describe noted.
#[inline(always)]
fn answer(
    app: &App,
    snapshot: &Snapshot,
    candidate: &Candidate<'_, '_>,
    ticket: &mut Ticket<'_>,
) -> Admission {
    record::decisions(app.metrics(), snapshot, candidate, ticket);
    if let Some(by) = ticket.decision.denied_by {
        return Admission::Denied { by };
    }
    ticket.focus = ticket.least_remaining(snapshot.config.server.headers);
    Admission::Allowed
}

/// The store a shared stack is decided in, for the shared step's
/// signature.
type Store = Arc<RedisStore>;
