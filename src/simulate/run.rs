//! The run: every record through the configuration's routes and stacks on a
//! virtual clock, counted per route and limit.
//!
//! [`route()`], [`identify()`] and [`limit`] are the gateway's request path
//! up to and including the limit step, minus the network, and they run the
//! gateway's own code: the [`Router`](crate::routing::Router), then
//! [`admission::decide_request`] in its two halves, the admission the
//! proxy and `/auth` run too (without a store) — the caller (its token
//! checked at the record's time), the body's fields for `body:FIELD` keys
//! (capped at `max_key_body`), the client IP behind trusted proxies (the
//! record's `ip` as the TCP peer), each limit's key with its
//! `on_missing_key`, the caller's plan, the stack all or nothing on the
//! limiters of an [`App`] built from the configuration — with the record's
//! time as `now`. A record is routed and identified once, on the first
//! variant, and decided on each (`--compare`): the variants differ only in
//! their limits' algorithms, which neither step reads.
//!
//! A token route's request reserves what the gateway reserves: read whole
//! within `max_key_body` (and declaring no more), the body's budget and
//! prompt; over it, the default plus a quarter of its length (the record's
//! `Content-Length`, else its body's length: a trace's body is taken as
//! sent with its length). An admitted request is then settled at once, as
//! its response's end would settle it (its bill), on the record's `tokens`
//! — a refund or a debt that later records meet — or, without `tokens`,
//! its reservation stands.
//!
//! Not modelled: a request head over `max_header_bytes` (431) and an
//! upstream's `cost_header` settlement. Without `--backend` there is no
//! upstream and every simulated request gives its concurrency slots back at
//! once (a trace has no durations), so a `concurrency` limit never denies.
//! With `--backend` each variant has a modelled upstream ([`Flight`]): an
//! admitted request is sent to it when its stack's delay has passed and
//! holds its permits until its modelled response ends; the responses due
//! by a record's time end before the record is decided.
//!
//! Records are taken in trace order; one earlier than the record before it
//! is run at that record's time (the clock never goes back) and counted as
//! out of order.

use std::io::Write;
use std::sync::Arc;

use smallvec::SmallVec;
use std::collections::HashMap;

use super::Error;
use super::backend::{Backend, Schedule, Spec as BackendSpec};
use super::compare::{self, Kind, algorithm_name};
use super::flight::{Flight, Shed};
use super::trace::{Item, Record};
use super::tracker::{Judgement, LimitTracker, Timeline};
use crate::admission::{
    self, Client, Identified, Refused, RequestAdmission, RequestBody, Routed, Ticket,
};
use crate::app::{App, Snapshot};
use crate::config::Config;
use crate::config::tokens::Unit;
use crate::http::content_length;
use crate::identity::keys::shadow_missing_key;
use crate::limit::stack::INLINE;
use crate::limit::{
    Algorithm, Clock, LimitKey, ManualClock, Nanos, Outcome, Priority, StackDecision,
};

/// Bad records printed one by one; beyond this they are only counted.
const SHOWN_PROBLEMS: u64 = 20;

/// What the gateway would have done with one request, up to its limit step.
// Made and consumed once per record and variant, never stored: boxing the
// decision would be an allocation per record for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Decided {
    /// No route matched: 404.
    NoRoute,
    /// Answered before the limits: 401 (unknown or missing API key), 400
    /// (a limit's key is missing and it says `on_missing_key = "deny"`), 413
    /// (a body over `max_body` on a route that reads it for a key).
    Rejected { route: usize, rejection: Rejection },
    /// The stack decided.
    Limited {
        route: usize,
        decision: StackDecision,
        keys: SmallVec<[Option<LimitKey>; INLINE]>,
        /// The algorithm of each limiter charged (the caller's plan's).
        algorithms: SmallVec<[Algorithm; INLINE]>,
        /// A token route's reservation and usage.
        tokens: Option<TokenUse>,
        /// The same in micro-dollars, on a stack with a usd limit.
        usd: Option<TokenUse>,
        /// The request's priority (`Identity::priority`): what a
        /// shed request is counted under.
        priority: Priority,
    },
}

/// What a request of a token route reserved and, admitted with a record's
/// `tokens`, settled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TokenUse {
    pub(crate) reserved: u64,
    /// `None`: denied, or no `tokens` in the record (the reservation stood).
    pub(crate) used: Option<u64>,
}

/// Why a request was answered before its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    Unauthorized,
    /// The index in `config.limits` of the limit whose key was missing.
    MissingKey(usize),
    TooLarge,
}

/// The route step, as the gateway runs it: the first matching route, in
/// file order. Once per record for every variant: variants of one
/// configuration differ only in their algorithms.
pub(crate) fn route(snapshot: &Snapshot, record: &Record) -> Option<usize> {
    snapshot.router.find(&record.parts)
}

/// A record routed to `route`, identified once for every variant
/// ([`identify`]): variants of one configuration differ only in their
/// limits' algorithms, and the caller, the client, the body's fields and
/// the reservation do not depend on them.
pub(crate) struct Identification<'s> {
    route: usize,
    /// The record's `Content-Length`.
    declared: Option<u64>,
    identified: Result<Identified<'s>, Refused>,
}

/// The identification step on `snapshot` at `now`: the gateway's own
/// ([`admission::identify_request`]) — the caller, the body against
/// `max_body` and its fields (the record's body, capped at
/// `max_key_body`), the reservation, the client behind the trusted
/// proxies (the record's `ip` as the TCP peer).
pub(crate) fn identify<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    record: &Record,
    route: usize,
    now: Nanos,
) -> Identification<'s> {
    let declared = content_length::parse(
        record
            .parts
            .headers
            .get_all(http::header::CONTENT_LENGTH)
            .iter()
            .map(|value| value.as_bytes()),
    )
    .ok()
    .flatten();
    let routed = routed(snapshot, record, route, declared, now);
    Identification {
        route,
        declared,
        identified: admission::identify_request(app, snapshot, &routed),
    }
}

/// `record` as admission takes it, routed to `snapshot`'s `route`.
fn routed<'r, 's>(
    snapshot: &'s Snapshot,
    record: &'r Record,
    route: usize,
    declared: Option<u64>,
    now: Nanos,
) -> Routed<'r, 's> {
    Routed {
        route: &snapshot.config.routes[route],
        plan: &snapshot.routes[route],
        parts: &record.parts,
        client: Client::Peer(record.peer),
        body: RequestBody::Held {
            bytes: record.body.as_deref().unwrap_or_default(),
            declared,
        },
        now,
    }
}

/// The admission step on `app`'s limiters at `now` for a record
/// identified by [`identify`] (on this variant or another): the gateway's
/// own ([`admission::decide_identified`]; with [`identify`], exactly
/// [`admission::decide_request`]) — each limit's key and the stack all or
/// nothing. An admitted token request is settled at once on the record's
/// `tokens`.
pub(crate) fn limit(
    app: &App,
    snapshot: &Snapshot,
    record: &Record,
    identification: &Identification<'_>,
    now: Nanos,
) -> Decided {
    let route = identification.route;
    let rejected = |rejection| Decided::Rejected { route, rejection };
    let identified = match &identification.identified {
        Ok(identified) => identified,
        Err(Refused::Unidentified(_)) => return rejected(Rejection::Unauthorized),
        Err(Refused::Body(_)) => return rejected(Rejection::TooLarge),
    };
    let routed = routed(snapshot, record, route, identification.declared, now);
    let mut ticket = Ticket::default();
    let answer = admission::decide_identified(app, snapshot, &routed, identified, &mut ticket);
    let used = match answer {
        RequestAdmission::Unidentified(_) => return rejected(Rejection::Unauthorized),
        RequestAdmission::BodyRefused(_) => return rejected(Rejection::TooLarge),
        RequestAdmission::MissingKey { position } => {
            let limit = snapshot.routes[route].stack[position].index();
            return rejected(Rejection::MissingKey(limit));
        }
        RequestAdmission::Admitted { bill } => {
            // As its response's end settles it on the gateway: on the
            // record's `tokens`, or without them its reservation standing;
            // on the record's clock (`app`'s, moved by [`Variant::at`]).
            if let Some(bill) = bill {
                bill.settle(record.tokens);
            }
            record.tokens
        }
        RequestAdmission::Denied { .. } | RequestAdmission::StoreDown => None,
    };
    let tokens = ticket
        .reserved()
        .map(|reserved| TokenUse { reserved, used });
    let usd = ticket.reserved_usd().map(|(reserved, cost)| TokenUse {
        reserved,
        used: used.map(cost),
    });
    let priority = ticket.priority();
    let admission::ticket::TicketParts {
        decision,
        keys,
        algorithms,
    } = ticket.into_parts();
    Decided::Limited {
        route,
        decision,
        keys,
        algorithms,
        tokens,
        usd,
        priority,
    }
}

/// One limit of one route's stack, over the run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct EntryStats {
    /// Requests of the route this limit applied to (it had a key).
    pub(crate) applied: u64,
    /// Of those, admitted by the whole stack (and so charged here).
    pub(crate) admitted: u64,
    /// Denied by this limit (whatever the others said).
    pub(crate) denied: u64,
    /// A shadow limit's would-be denials.
    pub(crate) shadow_denied: u64,
    /// This limit admitted where an exact sliding log of its window form,
    /// holding the same admissions, would have denied; and the converse
    /// (each free unit counted once, see `LimitTracker::judge`).
    pub(crate) false_allows: u64,
    pub(crate) false_denies: u64,
    /// A token limit's tokens: see [`TokenStats`].
    pub(crate) tokens: TokenStats,
}

/// A token limit's tokens over the requests it admitted (all zero for a
/// request limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TokenStats {
    /// Reserved (charged at admission).
    pub(crate) reserved: u64,
    /// Used, by the requests whose record said (`tokens`): what they were
    /// settled on.
    pub(crate) used: u64,
    /// Requests settled on their `tokens`.
    pub(crate) settled: u64,
    /// Requests without `tokens`, whose reservation stood.
    pub(crate) unsettled: u64,
    /// What those requests reserved.
    pub(crate) unsettled_reserved: u64,
}

impl TokenStats {
    /// One admitted request's reservation and usage.
    fn count(&mut self, tokens: TokenUse) {
        self.reserved = self.reserved.saturating_add(tokens.reserved);
        match tokens.used {
            Some(used) => {
                self.used = self.used.saturating_add(used);
                self.settled += 1;
            }
            None => {
                self.unsettled += 1;
                self.unsettled_reserved = self.unsettled_reserved.saturating_add(tokens.reserved);
            }
        }
    }
}

/// One route over the run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RouteStats {
    pub(crate) requests: u64,
    pub(crate) admitted: u64,
    /// Denied by a limit of the stack.
    pub(crate) denied: u64,
    pub(crate) unauthorized: u64,
    pub(crate) missing_key: u64,
    pub(crate) too_large: u64,
    /// The stack admitted where some limit's exact sliding log would have
    /// denied; the stack denied where every one would have admitted.
    pub(crate) false_allows: u64,
    pub(crate) false_denies: u64,
    /// Per limit of the stack, in stack order.
    pub(crate) entries: Vec<EntryStats>,
}

/// The configuration as run: as written, or with its limits mapped to one
/// algorithm.
pub(crate) struct Variant {
    /// `None`: as configured.
    pub(crate) kind: Option<Kind>,
    /// What admission decides on (its limiters and metrics).
    pub(crate) app: Arc<App>,
    /// `app`'s clock, moved to each record's time (a settlement reads it).
    clock: Arc<ManualClock>,
    pub(crate) snapshot: Arc<Snapshot>,
    pub(crate) routes: Vec<RouteStats>,
    /// Per limit of `config.limits`.
    pub(crate) trackers: Vec<LimitTracker>,
    pub(crate) no_route: u64,
    /// The modelled upstream and the requests in flight to it (`--backend`).
    pub(crate) flight: Option<Flight>,
    /// Per limit of `config.limits`: a spend budget's micro-dollars per
    /// key, as its admitted requests held them (empty for the others).
    pub(crate) spend: Vec<HashMap<LimitKey, u64>>,
}

impl Variant {
    fn new(config: Config, kind: Option<Kind>) -> Variant {
        let routes = config
            .routes
            .iter()
            .map(|r| RouteStats {
                entries: vec![EntryStats::default(); r.limits.len()],
                ..RouteStats::default()
            })
            .collect();
        let trackers = config
            .limits
            .iter()
            .map(|_| LimitTracker::default())
            .collect();
        let spend = config.limits.iter().map(|_| HashMap::new()).collect();
        let clock = Arc::new(ManualClock::new(0));
        let app = App::with_clock(config, clock.clone());
        Variant {
            kind,
            snapshot: app.snapshot(),
            app,
            clock,
            routes,
            trackers,
            no_route: 0,
            flight: None,
            spend,
        }
    }

    /// Moves the variant's clock to `now` (it never goes back).
    fn at(&self, now: Nanos) {
        advance(&self.clock, now);
    }

    /// The name the chart and the JSON give this variant.
    pub(crate) fn label(&self, chart_limit: Option<usize>) -> String {
        match (self.kind, chart_limit) {
            (Some(kind), _) => kind.name(),
            (None, Some(i)) => algorithm_name(&self.snapshot.config.limits[i].algorithm).to_owned(),
            (None, None) => "as configured".to_owned(),
        }
    }
}

/// A whole run: the variants, the totals and the chart's series.
pub(crate) struct Simulation {
    pub(crate) variants: Vec<Variant>,
    /// The route generated traffic goes to and the chart shows.
    pub(crate) focus: Option<usize>,
    /// The limit the chart shows: the focus route's first.
    pub(crate) chart_limit: Option<usize>,
    pub(crate) timeline: Timeline,
    pub(crate) records: u64,
    pub(crate) bad_records: u64,
    pub(crate) out_of_order: u64,
    /// First and last record time.
    pub(crate) span: Option<(Nanos, Nanos)>,
}

/// The route `name` (its index), or without a name the first route with
/// limits.
pub(crate) fn focus_route(config: &Config, name: Option<&str>) -> Result<Option<usize>, Error> {
    let Some(name) = name else {
        return Ok(config.routes.iter().position(|r| !r.limits.is_empty()));
    };
    if let Some(i) = config.routes.iter().position(|r| r.name == name) {
        return Ok(Some(i));
    }
    let names: Vec<&str> = config.routes.iter().map(|r| r.name.as_str()).collect();
    let hint = names
        .iter()
        .find(|n| strsim::levenshtein(n, name) <= 2)
        .map(|n| format!(" (did you mean `{n}`?)"))
        .unwrap_or_default();
    Err(Error::Usage(format!(
        "--route: unknown route `{name}`, expected one of {}{hint}",
        names.join(", ")
    )))
}

impl Simulation {
    /// The configuration as written (no `kinds`) or one variant per kind,
    pub(crate) fn new(config: &Config, kinds: &[Kind], focus: Option<usize>) -> Simulation {
        let variants: Vec<Variant> = if kinds.is_empty() {
            vec![Variant::new(config.clone(), None)]
        } else {
            kinds
                .iter()
                .map(|&kind| Variant::new(compare::variant(config, kind), Some(kind)))
                .collect()
        };
        let chart_limit = focus.and_then(|r| config.routes[r].limits.first().copied());
        Simulation {
            timeline: Timeline::new(variants.len()),
            variants,
            focus,
            chart_limit,
            records: 0,
            bad_records: 0,
            out_of_order: 0,
            span: None,
        }
    }

    /// Gives every variant its own modelled upstream of `spec`, its
    /// capacity following `schedule` (`--backend`).
    pub(crate) fn with_backend(mut self, spec: BackendSpec, schedule: Schedule) -> Simulation {
        for variant in &mut self.variants {
            variant.flight = Some(Flight::new(Backend::new(spec, schedule.clone())));
        }
        self
    }

    /// Runs `records` through every variant. Bad records are reported to
    /// `err` (the first few by line, then a count); with `decisions`, one
    /// JSON line per request and variant is written there.
    pub(crate) fn run(
        &mut self,
        records: impl Iterator<Item = Item>,
        err: &mut dyn Write,
        mut decisions: Option<&mut dyn Write>,
    ) -> Result<(), Error> {
        let mut last: Nanos = 0;
        let write_failed = |e: std::io::Error| Error::Failed(format!("cannot write: {e}"));
        // The first variant's, on which records are routed and identified
        // for all; held apart from `self`, which the accounting changes.
        let first_app = Arc::clone(&self.variants[0].app);
        let first = Arc::clone(&self.variants[0].snapshot);
        for item in records {
            let record = match item {
                Ok(record) => record,
                Err(problem) if problem.fatal => {
                    return Err(Error::Failed(format!(
                        "line {}: {}",
                        problem.line, problem.message
                    )));
                }
                Err(problem) => {
                    self.bad_records += 1;
                    if self.bad_records <= SHOWN_PROBLEMS {
                        writeln!(err, "line {}: {}; skipped", problem.line, problem.message)
                            .map_err(write_failed)?;
                    }
                    continue;
                }
            };
            let now = if record.time < last {
                self.out_of_order += 1;
                last
            } else {
                record.time
            };
            last = now;
            self.records += 1;
            self.span = Some(self.span.map_or((now, now), |(first, _)| (first, now)));
            let compared = self.variants.len() > 1;
            // Routing and identification do not depend on the algorithms:
            // once for all, on the first variant.
            let identified = route(&first, &record)
                .map(|index| identify(&first_app, &first, &record, index, now));
            for v in 0..self.variants.len() {
                let variant = &mut self.variants[v];
                if let Some(flight) = &mut variant.flight {
                    let clock = &variant.clock;
                    flight.complete_until(now, |end| advance(clock, end));
                }
                variant.at(now);
                let mut decided = match &identified {
                    Some(identified) => {
                        limit(&variant.app, &variant.snapshot, &record, identified, now)
                    }
                    None => Decided::NoRoute,
                };
                self.account(v, &decided, now);
                self.send(v, &record, &mut decided, now);
                if let Some(out) = decisions.as_deref_mut() {
                    let variant = &self.variants[v];
                    let label = compared.then(|| variant.label(None));
                    write_decision(out, &variant.snapshot, &record, &decided, label)
                        .map_err(write_failed)?;
                }
            }
        }
        for variant in &mut self.variants {
            if let Some(flight) = &mut variant.flight {
                let clock = &variant.clock;
                flight.finish(|end| advance(clock, end));
            }
        }
        if self.bad_records > SHOWN_PROBLEMS {
            writeln!(
                err,
                "... and {} more bad records",
                self.bad_records - SHOWN_PROBLEMS
            )
            .map_err(write_failed)?;
        }
        if self.bad_records > 0 {
            writeln!(err, "skipped {} bad records", self.bad_records).map_err(write_failed)?;
        }
        if self.out_of_order > 0 {
            writeln!(
                err,
                "{} records were earlier than the record before them and ran at its time; sort the trace by time",
                self.out_of_order
            )
            .map_err(write_failed)?;
        }
        Ok(())
    }

    /// With a modelled upstream: sends an admitted request to it (after its
    /// stack's delay) with its permits, or counts a refused one as shed;
    /// then charts the requests in flight.
    fn send(&mut self, v: usize, record: &Record, decided: &mut Decided, now: Nanos) {
        let variant = &mut self.variants[v];
        let Some(flight) = &mut variant.flight else {
            return;
        };
        if let Decided::Limited {
            route,
            decision,
            priority,
            ..
        } = decided
        {
            if decision.allowed {
                let permits = decision.take_permits();
                flight.send(now.saturating_add(decision.delay), record.line, permits);
            } else if let Some(position) = decision.denied_by {
                let config = &variant.snapshot.config;
                let limit = config.routes[*route].limits[position];
                flight.shed(Shed {
                    priority: priority.label(),
                    route: *route,
                    status: config.limits[limit].status.as_u16(),
                });
            }
        }
        let in_flight = flight.in_flight();
        let variant = &self.variants[v];
        let limit = self.chart_limit.and_then(|i| current_limit(variant, i));
        self.timeline.flight(v, now, in_flight, limit);
    }

    /// Counts one variant's decision, and checks it against the exact rule.
    fn account(&mut self, v: usize, decided: &Decided, now: Nanos) {
        let chart = (self.focus, self.chart_limit);
        let variant = &mut self.variants[v];
        let (route, decision, keys, algorithms, (tokens, usd)) = match decided {
            Decided::NoRoute => {
                variant.no_route += 1;
                return;
            }
            Decided::Rejected { route, rejection } => {
                let stats = &mut variant.routes[*route];
                stats.requests += 1;
                match rejection {
                    Rejection::Unauthorized => stats.unauthorized += 1,
                    Rejection::MissingKey(_) => stats.missing_key += 1,
                    Rejection::TooLarge => stats.too_large += 1,
                }
                return;
            }
            Decided::Limited {
                route,
                decision,
                keys,
                algorithms,
                tokens,
                usd,
                ..
            } => (*route, decision, keys, algorithms, (*tokens, *usd)),
        };
        let plan = &variant.snapshot.config.routes[route];
        let cost = plan.cost;
        let stats = &mut variant.routes[route];
        stats.requests += 1;
        if decision.allowed {
            stats.admitted += 1;
        } else {
            stats.denied += 1;
        }
        let charted = chart.0 == Some(route);
        // Whether an exact sliding log holding what this limit admitted so
        // far would admit the request: all non-shadow applied limits (for
        // the stack), and each limit.
        let mut exact_all = true;
        for (position, entry) in decision.entries.iter().enumerate() {
            if entry.outcome == Outcome::Skipped {
                // A shadow limit that lacked its key under "deny": the 400 it
                // would have been, counted as the gateway counts it.
                let limit = &variant.snapshot.config.limits[plan.limits[position]];
                if shadow_missing_key(limit, keys[position]) {
                    stats.entries[position].applied += 1;
                    stats.entries[position].shadow_denied += 1;
                }
                continue;
            }
            let counts = &mut stats.entries[position];
            counts.applied += 1;
            match entry.outcome {
                Outcome::Denied => counts.denied += 1,
                Outcome::ShadowDenied => counts.shadow_denied += 1,
                Outcome::Allowed | Outcome::Skipped | Outcome::DeniedByOther => {}
            }
            let limit = plan.limits[position];
            let (Some(key), algorithm) = (keys[position], &algorithms[position]) else {
                continue;
            };
            // A token (or usd) limit is charged the reservation and, once
            // settled, holds what the request used (debt included).
            let token_use = match variant.snapshot.config.limits[limit].unit {
                Unit::Tokens => tokens,
                Unit::Usd => usd,
                Unit::Requests => None,
            };
            let (asked, held) = match token_use {
                Some(t) => (t.reserved, t.used.unwrap_or(t.reserved)),
                None => (cost, cost),
            };
            let tracker = &mut variant.trackers[limit];
            // What this limit itself said: one that would have admitted a
            // request another limit denied said yes.
            let says_yes = matches!(entry.outcome, Outcome::Allowed | Outcome::DeniedByOther);
            let judged = tracker.judge(key, algorithm, now, asked, says_yes);
            if judged.is_none()
                && entry.outcome == Outcome::Denied
                && !variant.snapshot.config.limits[limit].shadow
            {
                // A limit with no exact rule (concurrency) is its own rule:
                // its denial is no false one.
                exact_all = false;
            }
            if let Some(judgement) = judged {
                let exact = match judgement {
                    Judgement::Right => says_yes,
                    Judgement::FalseAllow => {
                        counts.false_allows += 1;
                        false
                    }
                    Judgement::FalseDeny => {
                        counts.false_denies += 1;
                        true
                    }
                };
                if !variant.snapshot.config.limits[limit].shadow {
                    exact_all &= exact;
                }
            }
            if decision.allowed && says_yes {
                counts.admitted += 1;
                if let Some(t) = token_use {
                    counts.tokens.count(t);
                }
                let in_window = tracker.admit(key, algorithm, now, held);
                if token_use.is_some() && variant.snapshot.config.limits[limit].unit == Unit::Usd {
                    *variant.spend[limit].entry(key).or_default() += held;
                }
                if charted && position == 0 {
                    self.timeline.admitted(v, now, in_window);
                }
            }
        }
        match (decision.allowed, exact_all) {
            (true, false) => stats.false_allows += 1,
            (false, true) => stats.false_denies += 1,
            _ => {}
        }
        if charted && !decision.allowed {
            self.timeline.denied(v, now);
        }
    }
}

/// Moves a variant's `clock` to `now` (it never goes back).
fn advance(clock: &ManualClock, now: Nanos) {
    clock.advance(now.saturating_sub(clock.now()));
}

/// What the chart draws beside the requests in flight for limit `limit`
/// (an index in `config.limits`) of `variant`: a `concurrency` limit's
/// `max`; an `adaptive` limit's current limit (its limiter's, in
/// `variant.app`) joins here. `None` for a rate limit, which bounds no
/// requests in flight, and for a shadow limit, which refuses nothing.
pub(crate) fn current_limit(variant: &Variant, index: usize) -> Option<u64> {
    let limit = &variant.snapshot.config.limits[index];
    if limit.shadow {
        return None;
    }
    match limit.algorithm {
        Algorithm::Concurrency { max } => Some(max),
        Algorithm::Adaptive { .. } => {
            let id = variant.snapshot.limit_ids().nth(index)?;
            let limiters = variant.snapshot.limiters(id).all();
            Some(limiters.map(|l| l.in_flight_totals().limit).sum())
        }
        Algorithm::FixedWindow { .. }
        | Algorithm::SlidingWindow { .. }
        | Algorithm::SlidingLog { .. }
        | Algorithm::TokenBucket { .. }
        | Algorithm::LeakyBucket { .. } => None,
    }
}

/// One line of `--decisions`: the request's line, route and outcome, and the
/// status the gateway would answer for a request it did not pass on.
fn write_decision(
    out: &mut dyn Write,
    snapshot: &Snapshot,
    record: &Record,
    decided: &Decided,
    variant: Option<String>,
) -> std::io::Result<()> {
    let config = &snapshot.config;
    let mut line = serde_json::Map::new();
    line.insert("line".into(), record.line.into());
    if let Some(variant) = variant {
        line.insert("algorithm".into(), variant.into());
    }
    let (route, outcome, status, limit) = match decided {
        Decided::NoRoute => (None, "no_route", Some(404), None),
        Decided::Rejected { route, rejection } => match rejection {
            Rejection::Unauthorized => (Some(*route), "unauthorized", Some(401), None),
            Rejection::MissingKey(limit) => (Some(*route), "missing_key", Some(400), Some(*limit)),
            Rejection::TooLarge => (Some(*route), "too_large", Some(413), None),
        },
        Decided::Limited {
            route, decision, ..
        } => match decision.denied_by {
            None => (Some(*route), "admitted", None, None),
            Some(position) => {
                let limit = config.routes[*route].limits[position];
                let status = config.limits[limit].status.as_u16();
                (Some(*route), "denied", Some(status), Some(limit))
            }
        },
    };
    if let Some(route) = route {
        line.insert("route".into(), config.routes[route].name.clone().into());
    }
    line.insert("outcome".into(), outcome.into());
    if let Some(status) = status {
        line.insert("status".into(), status.into());
    }
    if let Some(limit) = limit {
        line.insert("limit".into(), config.limits[limit].name.clone().into());
    }
    if let Decided::Limited {
        tokens: Some(tokens),
        ..
    } = decided
    {
        // The names contract section 9 gives the access log's fields.
        line.insert("tokens_reserved".into(), tokens.reserved.into());
        if let Some(used) = tokens.used {
            line.insert("tokens_used".into(), used.into());
        }
    }
    serde_json::to_writer(&mut *out, &serde_json::Value::Object(line))?;
    out.write_all(b"\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::trace::TraceReader;
    use std::path::Path;

    const S: Nanos = crate::limit::NANOS_PER_SEC;

    fn config(text: &str) -> Config {
        Config::from_bytes(Path::new("gateway.toml"), text.as_bytes()).unwrap()
    }

    fn simulate(config: &Config, kinds: &[Kind], trace: &str) -> Simulation {
        let focus = focus_route(config, None).unwrap();
        let mut simulation = Simulation::new(config, kinds, focus);
        let reader = TraceReader::new(
            Box::new(std::io::Cursor::new(trace.as_bytes().to_vec())),
            "t",
        )
        .unwrap();
        let mut err = Vec::new();
        simulation.run(reader, &mut err, None).unwrap();
        simulation
    }

    const WINDOW: &str = r#"
[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 2
window = "10s"

[limits.per_user]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 1
refill = "1/m"

[[routes]]
name = "api"
match = { path_prefix = "/api" }
respond = { status = 200 }
limits = ["per_user", "per_ip"]

[[routes]]
name = "open"
match = { path = "/open" }
respond = { status = 200 }
"#;

    #[test]
    fn counts_per_route_and_limit_and_against_the_exact_rule() {
        let config = config(WINDOW);
        // Two before the 10 s boundary, two after, no x-user: the fixed
        // window admits all four; an exact sliding log of 2 per 10 s holding
        // the same admissions would have denied the last two.
        let trace = "time,method,path,ip,header:x-user\n\
            9.5,GET,/api/a,192.0.2.1,\n\
            9.6,GET,/api/a,192.0.2.1,\n\
            10.1,GET,/api/a,192.0.2.1,\n\
            10.2,GET,/api/a,192.0.2.1,\n\
            10.3,GET,/api/a,192.0.2.1,u1\n\
            10.4,GET,/nowhere,,\n\
            10.5,GET,/open,,\n";
        let simulation = simulate(&config, &[], trace);
        let variant = &simulation.variants[0];
        let api = &variant.routes[0];
        assert_eq!((api.requests, api.admitted, api.denied), (5, 4, 1));
        // per_user applies to the one request with x-user, which per_ip
        // denies: the second window already holds its 2.
        assert_eq!(api.entries[0].applied, 1);
        assert_eq!(api.entries[1].applied, 5);
        assert_eq!(api.entries[1].denied, 1);
        assert_eq!(api.entries[1].false_allows, 2);
        assert_eq!(api.false_allows, 2);
        // Trackers follow `config.limits`: per_ip, then per_user.
        assert_eq!(variant.trackers[0].worst.peak, 4);
        assert_eq!(variant.trackers[0].worst.limit, 2);
        assert_eq!(variant.trackers[1].worst.peak, 0, "never charged");
        assert_eq!(variant.no_route, 1);
        assert_eq!(variant.routes[1].requests, 1);
        assert_eq!(simulation.span, Some((9 * S + S / 2, 10 * S + S / 2)));
    }

    #[test]
    fn compare_runs_every_algorithm_on_one_pass() {
        let config = config(WINDOW);
        let mut trace = String::from("time,method,path,ip\n");
        for i in 0..4 {
            trace.push_str(&format!("9.{},GET,/api,192.0.2.1\n", 5 + i));
        }
        for i in 0..4 {
            trace.push_str(&format!("10.{},GET,/api,192.0.2.1\n", 1 + i));
        }
        let simulation = simulate(&config, &Kind::ALL, &trace);
        let admitted: Vec<u64> = simulation
            .variants
            .iter()
            .map(|v| v.routes[0].admitted)
            .collect();
        // fixed 2 + 2, sliding window ~2, log 2, token bucket 2, leaky 2.
        assert_eq!(admitted[0], 4);
        assert_eq!(admitted[2], 2);
        assert!(simulation.variants[2].routes[0].entries[1].false_allows == 0);
        assert_eq!(simulation.variants[0].label(None), "fixed_window");
    }

    /// Every step `--compare` runs once per record for all its variants:
    /// API keys with consumers and plans, a client behind a trusted proxy,
    /// a body key, `max_body`, a route that requires a consumer, and a
    /// token route's reservation.
    const IDENTIFIED: &str = r#"
[server]
max_key_body = "1KiB"

[client_ip]
trusted_hops = 1

[consumers."k-1"]
consumer = "one"
plan = "pro"

[consumers."k-2"]
consumer = "two"

[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 3
refill = "1/s"
plans = { pro = { capacity = 6, refill = "2/s" } }

[limits.per_ip]
key = "ip"
algorithm = "sliding_window"
limit = 5
window = "2s"

[limits.per_user]
key = "body:user"
algorithm = "fixed_window"
limit = 2
window = "1s"
on_missing_key = "deny"

[limits.tpm]
key = "consumer"
algorithm = "token_bucket"
capacity = 500
refill = "500/m"
unit = "tokens"

[[routes]]
name = "api"
match = { path_prefix = "/api" }
respond = { status = 200 }
limits = ["per_key", "per_ip"]

[[routes]]
name = "login"
match = { path = "/login" }
respond = { status = 200 }
limits = ["per_user", "per_ip"]
max_body = 40

[[routes]]
name = "chat"
match = { path = "/v1/chat/completions" }
respond = { status = 200 }
limits = ["tpm"]
require_consumer = true
tokens = { max_tokens_default = 50, prompt = "bytes/4", usage = "auto" }
"#;

    /// A trace of `IDENTIFIED`'s routes: 300 records over 30 s from four
    /// clients behind one proxy, some over their limits.
    fn identified_trace() -> String {
        let mut trace = String::from(
            "time,method,path,ip,header:x-forwarded-for,header:x-api-key,body,tokens\n",
        );
        for i in 0..300u64 {
            let time = format!("{}.{:02}", 100 + i / 10, (i % 10) * 10);
            let client = format!("198.51.100.{}", i % 4);
            let key = ["k-1", "k-2", "k-3", ""][(i % 3) as usize + usize::from(i % 7 == 0)];
            let line = match i % 5 {
                0 | 1 => format!("{time},GET,/api/items,10.0.0.1,{client},{key},,"),
                2 => {
                    let user = ["ann", "bob", ""][(i % 3) as usize];
                    let body = if user.is_empty() {
                        String::new()
                    } else {
                        format!("{{\"\"user\"\":\"\"{user}\"\"}}")
                    };
                    format!("{time},POST,/login,10.0.0.1,{client},,\"{body}\",")
                }
                3 => format!(
                    "{time},POST,/login,10.0.0.1,{client},,\"{{\"\"user\"\":\"\"{}\"\"}}\",",
                    "x".repeat(40)
                ),
                _ => {
                    let body = serde_json::json!({"max_tokens": 40 + i, "messages": []})
                        .to_string()
                        .replace('"', "\"\"");
                    format!(
                        "{time},POST,/v1/chat/completions,10.0.0.1,{client},{key},\"{body}\",{}",
                        i % 90
                    )
                }
            };
            trace.push_str(&line);
            trace.push('\n');
        }
        trace
    }

    /// `simulate` on `config` with `kinds`, its `--decisions` lines as
    /// JSON values (without the variant's name), per variant.
    fn decisions_per_variant(
        config: &Config,
        kinds: &[Kind],
        trace: &str,
    ) -> (Simulation, Vec<Vec<serde_json::Value>>) {
        let focus = focus_route(config, None).unwrap();
        let mut simulation = Simulation::new(config, kinds, focus);
        let reader = TraceReader::new(
            Box::new(std::io::Cursor::new(trace.as_bytes().to_vec())),
            "t",
        )
        .unwrap();
        let mut lines = Vec::new();
        simulation
            .run(reader, &mut Vec::new(), Some(&mut lines))
            .unwrap();
        let mut per_variant = vec![Vec::new(); kinds.len().max(1)];
        for line in String::from_utf8(lines).unwrap().lines() {
            let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
            let name = value
                .as_object_mut()
                .unwrap()
                .remove("algorithm")
                .map(|name| name.as_str().unwrap().to_owned());
            let v = match name {
                Some(name) => kinds.iter().position(|k| k.name() == name).unwrap(),
                None => 0,
            };
            per_variant[v].push(value);
        }
        (simulation, per_variant)
    }

    #[test]
    fn compare_decides_as_five_runs_of_one_algorithm_each() {
        // `--compare` identifies each record once, on its first variant,
        // and decides it on every variant: each variant's results are
        // those of a run of the configuration written in its algorithm.
        let config = config(IDENTIFIED);
        let trace = identified_trace();
        let (compared, compared_lines) = decisions_per_variant(&config, &Kind::ALL, &trace);
        let mut outcomes = std::collections::BTreeSet::new();
        for (v, &kind) in Kind::ALL.iter().enumerate() {
            let single = compare::variant(&config, kind);
            let (alone, alone_lines) = decisions_per_variant(&single, &[], &trace);
            let (with, alone) = (&compared.variants[v], &alone.variants[0]);
            assert_eq!(with.routes, alone.routes, "{}", kind.name());
            assert_eq!(with.no_route, alone.no_route, "{}", kind.name());
            assert_eq!(with.spend, alone.spend, "{}", kind.name());
            let worst = |v: &Variant| v.trackers.iter().map(|t| t.worst).collect::<Vec<_>>();
            assert_eq!(worst(with), worst(alone), "{}", kind.name());
            assert_eq!(compared_lines[v], alone_lines[0], "{}", kind.name());
            assert_eq!(alone_lines[0].len(), 300);
            for line in &alone_lines[0] {
                outcomes.insert(line["outcome"].as_str().unwrap().to_owned());
            }
        }
        // The trace meets every answer the shared identification gives.
        assert_eq!(
            outcomes.into_iter().collect::<Vec<_>>(),
            [
                "admitted",
                "denied",
                "missing_key",
                "too_large",
                "unauthorized"
            ]
        );
        // And the algorithms differ: the comparison is not of one run.
        let admitted: std::collections::BTreeSet<u64> = compared
            .variants
            .iter()
            .map(|v| v.routes.iter().map(|r| r.admitted).sum())
            .collect();
        assert!(admitted.len() > 1, "{admitted:?}");
    }

    const CHAT: &str = r#"
[server]
max_key_body = "1KiB"

[limits.tpm]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 10000
refill = "10000/m"
unit = "tokens"

[[routes]]
name = "chat"
match = { path = "/v1/chat/completions" }
respond = { status = 200 }
limits = ["tpm"]
tokens = { max_tokens_default = 50, prompt = "bytes/4", usage = "auto" }
"#;

    /// The record of `line` in a JSON-lines trace.
    fn record(line: &serde_json::Value) -> Record {
        let text = format!("{line}\n");
        TraceReader::new(Box::new(std::io::Cursor::new(text.into_bytes())), "t")
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
    }

    /// What `record` reserved on the chat route, decided at `now`.
    fn reserved(app: &App, snapshot: &Snapshot, record: &Record) -> Option<u64> {
        let identified = identify(app, snapshot, record, 0, record.time);
        match limit(app, snapshot, record, &identified, record.time) {
            Decided::Limited { tokens, .. } => tokens.map(|t| t.reserved),
            other => panic!("not decided: {other:?}"),
        }
    }

    #[test]
    fn a_record_reserves_what_the_proxy_reserves_for_its_body() {
        let config = config(CHAT);
        let app = App::with_clock(config, Arc::new(ManualClock::new(0)));
        let snapshot = app.snapshot();
        let rule = snapshot.config.routes[0].tokens.clone().unwrap();
        let cap = snapshot.config.server.max_key_body;
        for (time, body) in [
            serde_json::json!({"max_tokens": 64, "messages": [{"role": "user", "content": "hello there"}]}),
            serde_json::json!({"max_completion_tokens": 7, "system": "be brief", "messages": []}),
            serde_json::json!({"prompt": ["one", "two"]}),
        ]
        .into_iter()
        .enumerate()
        {
            let text = body.to_string();
            let record = record(&serde_json::json!({
                "time": time, "method": "POST", "path": "/v1/chat/completions", "body": text,
            }));
            let gateway = admission::reserve::reservation(&rule, Some(text.as_bytes()), None, cap).0;
            assert_eq!(reserved(&app, &snapshot, &record), Some(gateway), "{body}");
        }
        // Over max_key_body: the default plus a quarter of the length, the
        // declared one first.
        let long = format!("{{\"max_tokens\":1,\"prompt\":\"{}\"}}", "x".repeat(2000));
        let length = long.len() as u64;
        let over = record(&serde_json::json!({
            "time": 10, "method": "POST", "path": "/v1/chat/completions", "body": long,
        }));
        assert_eq!(
            reserved(&app, &snapshot, &over),
            Some(50 + length.div_ceil(4))
        );
        let declared = record(&serde_json::json!({
            "time": 20, "method": "POST", "path": "/v1/chat/completions",
            "headers": {"content-length": "4000"},
        }));
        assert_eq!(reserved(&app, &snapshot, &declared), Some(50 + 1000));
    }

    #[test]
    fn a_settlement_runs_on_the_records_clock() {
        // 10,000 a minute. At 100 s: 9,000 reserved, 19,000 used, so the
        // key owes 9,000. At 160 s a minute's refill leaves it 1,000: the
        // second is denied; at 214 s it has 10,000, and the third fits.
        // Settled at another time than the record's, the refill would not
        // be a minute's.
        let config = config(CHAT);
        let body = serde_json::json!({"max_tokens": 9000, "messages": []}).to_string();
        let body = body.replace('"', "\"\"");
        let trace = format!(
            "time,method,path,header:x-user,body,tokens\n\
             100,POST,/v1/chat/completions,u,\"{body}\",19000\n\
             160,POST,/v1/chat/completions,u,\"{body}\",\n\
             214,POST,/v1/chat/completions,u,\"{body}\",\n"
        );
        let simulation = simulate(&config, &[], &trace);
        let chat = &simulation.variants[0].routes[0];
        assert_eq!((chat.admitted, chat.denied), (2, 1));
        assert_eq!(
            chat.entries[0].tokens,
            TokenStats {
                reserved: 18_000,
                used: 19_000,
                settled: 1,
                unsettled: 1,
                unsettled_reserved: 9_000,
            }
        );
    }

    #[test]
    fn a_spend_budget_prices_the_records_by_their_model() {
        let config = config(
            r#"
[prices."gpt-4o"]
input = 2.50
output = 10.00

[limits.spend]
key = "header:x-user"
algorithm = "fixed_window"
limit = 0.03
window = "1h"
unit = "usd"

[[routes]]
name = "chat"
match = { path = "/v1/chat/completions" }
respond = { status = 200 }
limits = ["spend"]
tokens = { max_tokens_default = 50, prompt = "bytes/4", usage = "auto" }
"#,
        );
        // No prompt text: each reserves 1,000 × 10 = 10,000 µ$ and spends
        // its 600 tokens as output, 6,000 µ$. Four fit in $0.03
        // (18,000 + 10,000); the fifth (24,000 + 10,000) does not.
        let body = serde_json::json!({"model": "gpt-4o", "max_tokens": 1000, "messages": []})
            .to_string()
            .replace('"', "\"\"");
        let mut trace = "time,method,path,header:x-user,body,tokens\n".to_owned();
        for time in 1..=5 {
            trace.push_str(&format!(
                "{time},POST,/v1/chat/completions,u,\"{body}\",600\n"
            ));
        }
        let simulation = simulate(&config, &[], &trace);
        let chat = &simulation.variants[0].routes[0];
        assert_eq!((chat.admitted, chat.denied), (4, 1));
        let spend = chat.entries[0].tokens;
        assert_eq!(
            (spend.reserved, spend.used, spend.settled),
            (40_000, 24_000, 4)
        );
        let row = crate::simulate::report::UsdRow::new(spend, &simulation.variants[0].spend[0]);
        assert_eq!(
            (row.spent.as_str(), row.reserved.as_str()),
            ("0.024", "0.04")
        );
        // Per key: its digest and what it spent.
        assert_eq!(row.keys.len(), 1);
        assert_eq!(row.keys[0].spent, "0.024");
        assert_eq!(row.keys[0].digest.len(), 32);
    }

    #[test]
    fn a_concurrency_slot_is_held_until_the_modelled_response_ends() {
        let config = config(
            r#"
[limits.one]
key = "route"
algorithm = "concurrency"
max = 1

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200 }
limits = ["one"]
"#,
        );
        let spec = BackendSpec::parse("capacity=1,latency=100ms").unwrap();
        // A request's service time is drawn from its line; the header is
        // line 1. Line 3 comes 1 ms after line 2, while it is in flight;
        // line 4 the instant line 2's response ends; line 5 just before
        // line 4's ends.
        let service = Backend::new(spec, Schedule::constant(1)).service_time(2);
        let at = |nanos: Nanos| format!("{}.{:09}", nanos / S, nanos % S);
        let third = S + service;
        let third_service = Backend::new(spec, Schedule::constant(1)).service_time(4);
        let trace = format!(
            "time,method,path\n{},GET,/\n{},GET,/\n{},GET,/\n{},GET,/\n",
            at(S),
            at(S + 1_000_000),
            at(third),
            at(third + third_service - 1),
        );
        let focus = focus_route(&config, None).unwrap();
        let mut simulation =
            Simulation::new(&config, &[], focus).with_backend(spec, Schedule::constant(1));
        let reader =
            TraceReader::new(Box::new(std::io::Cursor::new(trace.into_bytes())), "t").unwrap();
        simulation.run(reader, &mut Vec::new(), None).unwrap();
        let variant = &simulation.variants[0];
        let api = &variant.routes[0];
        assert_eq!((api.admitted, api.denied), (2, 2), "{:?}", api);
        let stats = &variant.flight.as_ref().unwrap().stats;
        assert_eq!((stats.sent, stats.peak_in_flight), (2, 1));
        assert_eq!(stats.latencies[0], service);
        // Without a backend the same trace is all admitted: nothing is in
        // flight between records.
        let simulation = simulate(
            &config,
            &[],
            &format!(
                "time,method,path\n{},GET,/\n{},GET,/\n",
                at(S),
                at(S + 1_000_000)
            ),
        );
        assert_eq!(simulation.variants[0].routes[0].admitted, 2);
    }

    #[test]
    fn unknown_route_names_the_known_ones() {
        let config = config(WINDOW);
        let Err(Error::Usage(message)) = focus_route(&config, Some("apo")) else {
            panic!("accepted an unknown route");
        };
        assert!(message.contains("expected one of api, open"), "{message}");
        assert!(message.contains("did you mean `api`"), "{message}");
    }
}
