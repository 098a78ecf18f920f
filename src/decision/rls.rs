//! Envoy's `ShouldRateLimit`, decided by tollgate's limits: the one place
//! a `RateLimitRequest` becomes a stack and the stack's outcome a
//! `RateLimitResponse`, for the gRPC service (`grpc.rs`) and its JSON form
//! (`json.rs`) alike.
//!
//! - Each descriptor is matched against its domain's
//!   `[[decision.descriptors]]` rules (the first that fits decides it);
//!   its entries — keys and values — are the key of the rule's limits.
//! - Every matched descriptor of the call is decided together, one stack,
//!   **all or nothing**: a call that one limit refuses charges none of the
//!   others. (envoyproxy/ratelimit increments every descriptor's counter,
//!   also when another one is over the limit, so a refused request still
//!   spends its other quotas.)
//! - The cost is `hits_addend`, the descriptor's or else the request's; 0
//!   or absent is 1. One stack has one cost, so a call whose matched
//!   descriptors ask for different costs is refused as invalid.
//! - A descriptor's `limit` override decides that call with the override's
//!   numbers, in a state of its own (see `app::descriptors`).
//! - Answer: one status per descriptor in order — the limit of the
//!   descriptor that denied, or else its limit with the least remaining
//!   (`r / q`); a descriptor no rule matches is `OK` with no limit — and the
//!   contract's `RateLimit`, `RateLimit-Policy` and, when over the limit,
//!   `Retry-After` in `response_headers_to_add`. An unknown domain is `OK`
//!   and counted (`tollgate_rls_unknown_domain_total`).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::access_log::{self, AccessEntry, LimitField};
use crate::admission::{self, Admission, Charge, Ticket};
use crate::answer::ratelimit;
use crate::app::descriptors::{OverrideId, OverrideLimit};
use crate::app::{App, Snapshot};
use crate::envoy_proto::envoy::config::core::v3::HeaderValue;
use crate::envoy_proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use crate::envoy_proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use crate::envoy_proto::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use crate::envoy_proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use crate::envoy_proto::envoy::r#type::v3::RateLimitUnit;
use crate::identity::keys::descriptor_digest;
use crate::limit::{Algorithm, EntryVerdict, LimitKey, NANOS_PER_SEC, Nanos, Outcome, quota};
use crate::metrics::Front;
use crate::ratelimit_policy::{is_concurrency, least_remaining_of, policy_header};

/// The method's path, as gRPC clients send it.
pub(crate) const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Why a call cannot be decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RlsError {
    /// The request is not one the service can decide (gRPC
    /// `INVALID_ARGUMENT`, HTTP 400).
    Invalid(String),
    /// The store is down and `on_failure = "deny"` (gRPC `UNAVAILABLE`,
    /// HTTP 503).
    StoreDown,
}

/// Most descriptors in one call: Envoy sends a handful per route.
const MAX_DESCRIPTORS: usize = 64;

/// Decides `request` on `snapshot` (the one serving, loaded once by the
/// caller).
pub(crate) async fn should_rate_limit(
    app: &App,
    snapshot: &Snapshot,
    request: &RateLimitRequest,
) -> Result<RateLimitResponse, RlsError> {
    let started = app.clock.now();
    let answer = decide(app, snapshot, request, started).await;
    log(app, request, &answer, started);
    answer.map(|(response, _)| response)
}

/// The decided call and its access-log limit field: the limit that
/// denied, or the one with the least remaining.
type Decided<'s> = (RateLimitResponse, Option<LimitField<'s>>);

async fn decide<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    request: &RateLimitRequest,
    now: Nanos,
) -> Result<Decided<'s>, RlsError> {
    if request.domain.is_empty() {
        return Err(RlsError::Invalid("domain must not be empty".into()));
    }
    if request.descriptors.is_empty() {
        return Err(RlsError::Invalid("descriptors must not be empty".into()));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(RlsError::Invalid(format!(
            "at most {MAX_DESCRIPTORS} descriptors per call"
        )));
    }
    let table = &snapshot.descriptors;
    if !table.knows(&request.domain) {
        app.metrics().record_rls_unknown_domain();
        tracing::debug!(domain = %request.domain, "rate-limit call for an unknown domain");
        return Ok((unlimited(request.descriptors.len()), None));
    }
    let rules = snapshot.descriptor_rules();
    let matched: SmallVec<[Option<u32>; 4]> = request
        .descriptors
        .iter()
        .map(|d| {
            let entries = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
            table.rule_for(rules, &request.domain, entries)
        })
        .collect();
    if matched.iter().all(Option::is_none) {
        return Ok((unlimited(request.descriptors.len()), None));
    }
    let cost = call_cost(request, &matched)?;
    let stack = table.stack(snapshot, app.metrics(), &request.domain, &matched);
    let plan = &stack.plan;

    // Overrides first, kept alive beside the ticket that borrows them.
    let mut overrides: SmallVec<[Arc<OverrideLimit>; 2]> = SmallVec::new();
    let mut override_at: SmallVec<[Option<usize>; 4]> = SmallVec::new();
    for (&id, &descriptor) in plan.stack.iter().zip(&stack.origin) {
        let Some(numbers) = request.descriptors[descriptor].limit.as_ref() else {
            override_at.push(None);
            continue;
        };
        let unit = unit_nanos(numbers.unit).ok_or_else(|| {
            RlsError::Invalid(format!(
                "descriptor {descriptor}: limit override has no unit"
            ))
        })?;
        let id = OverrideId {
            limit: id,
            requests_per_unit: u64::from(numbers.requests_per_unit),
            unit,
        };
        let made = table.override_limit(snapshot, id).map_err(|_| {
            RlsError::Invalid("too many distinct limit overrides in this configuration".into())
        })?;
        override_at.push(Some(overrides.len()));
        overrides.push(made);
    }

    let shared_store = app.store().is_some();
    let mut ticket = Ticket::default();
    for (position, (&id, &descriptor)) in plan.stack.iter().zip(&stack.origin).enumerate() {
        let (limit, limiter) = match override_at[position] {
            Some(index) => (&overrides[index].config, &*overrides[index].limiters.base),
            None => (
                snapshot.limit_config(id),
                &**snapshot.limiters(id).for_plan(None),
            ),
        };
        let key = descriptor_key(
            &request.descriptors[descriptor],
            override_at[position].map(|i| &overrides[i]),
        );
        let shared = shared_store && snapshot.is_shared(id);
        // A per-key override set on the admin API (not a descriptor's own
        // `limit`, above): the key's numbers and state, as for a proxied
        // request.
        if override_at[position].is_none()
            && let Some((numbers, own)) = snapshot.overridden(id, key, now)
        {
            let algorithm = if shared { numbers } else { own.algorithm() };
            ticket.push_overridden(limit, algorithm, own, key);
            continue;
        }
        ticket.push_keyed(limit, limiter, Some(key), shared);
    }
    let charge = Charge {
        plan,
        cost,
        tokens: None,
        now,
    };
    let admission = admission::admit_keyed(app, snapshot, charge, &mut ticket).await;
    let denied_by = match admission {
        Admission::Allowed => None,
        Admission::Denied { by } => Some(by),
        Admission::StoreDown => return Err(RlsError::StoreDown),
        // Every entry has its key (the descriptor's entries); a limit
        // that still found none is a request that cannot be decided.
        Admission::MissingKey { .. } => {
            return Err(RlsError::Invalid("a descriptor without entries".into()));
        }
    };
    let response = respond(
        snapshot,
        &ticket,
        &stack.origin,
        request.descriptors.len(),
        denied_by,
    );
    // Named from the snapshot (an override's copy shares the name and
    // lives only as long as this call).
    let focus = denied_by.or(ticket.focus()).map(|i| LimitField {
        name: &snapshot.limit_config(plan.stack[i]).name,
        remaining: ticket.entries()[i].verdict.remaining,
        denied: denied_by.is_some(),
    });
    Ok((response, focus))
}

/// Every descriptor `OK` with no limit.
fn unlimited(descriptors: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: vec![ok_status(); descriptors],
        ..RateLimitResponse::default()
    }
}

fn ok_status() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        ..DescriptorStatus::default()
    }
}

/// The cost of the call: the matched descriptors' `hits_addend`, or the
/// request's; 0 or absent is 1.
fn call_cost(request: &RateLimitRequest, matched: &[Option<u32>]) -> Result<u64, RlsError> {
    let request_cost = u64::from(request.hits_addend).max(1);
    let mut cost = None;
    for (descriptor, _) in request
        .descriptors
        .iter()
        .zip(matched)
        .filter(|(_, m)| m.is_some())
    {
        let this = descriptor
            .hits_addend
            .as_ref()
            .map_or(request_cost, |h| h.value.max(1));
        match cost {
            None => cost = Some(this),
            Some(seen) if seen == this => {}
            Some(_) => {
                return Err(RlsError::Invalid(
                    "descriptors with different hits_addend in one call: tollgate decides a call as one stack with one cost".into(),
                ));
            }
        }
    }
    Ok(cost.unwrap_or(request_cost))
}

/// A descriptor's key: its entries, keys and values; an override's
/// numbers besides, so its state is apart in the store too.
fn descriptor_key(
    descriptor: &RateLimitDescriptor,
    overridden: Option<&Arc<OverrideLimit>>,
) -> LimitKey {
    let entries = descriptor
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()));
    let Some(overridden) = overridden else {
        return descriptor_digest(entries, &[]);
    };
    let algorithm = &overridden.config.algorithm;
    let numbers = format!(
        "\0override:{}/{}",
        quota(algorithm),
        crate::limit::window_secs(algorithm).unwrap_or(0)
    );
    descriptor_digest(entries, &[numbers.as_bytes()])
}

/// A `RateLimitOverride.unit` in nanoseconds (envoyproxy/ratelimit's
/// dividers: a month is 30 days, a year 365).
fn unit_nanos(unit: i32) -> Option<Nanos> {
    const DAY: Nanos = 86_400 * NANOS_PER_SEC;
    // WEEK (7) is newer than the vendored `RateLimitUnit`; the response's
    // `Unit` has it.
    if unit == Unit::Week as i32 {
        return Some(7 * DAY);
    }
    Some(match RateLimitUnit::try_from(unit).ok()? {
        RateLimitUnit::Unknown => return None,
        RateLimitUnit::Second => NANOS_PER_SEC,
        RateLimitUnit::Minute => 60 * NANOS_PER_SEC,
        RateLimitUnit::Hour => 3_600 * NANOS_PER_SEC,
        RateLimitUnit::Day => DAY,
        RateLimitUnit::Month => 30 * DAY,
        RateLimitUnit::Year => 365 * DAY,
    })
}

/// The response of a decided stack.
fn respond(
    snapshot: &Snapshot,
    ticket: &Ticket<'_>,
    origin: &[usize],
    descriptors: usize,
    denied_by: Option<usize>,
) -> RateLimitResponse {
    let entries = ticket.entries();
    let mut statuses = Vec::with_capacity(descriptors);
    for descriptor in 0..descriptors {
        let positions = origin
            .iter()
            .enumerate()
            .filter(|(_, d)| **d == descriptor)
            .map(|(p, _)| p);
        statuses.push(descriptor_status(ticket, positions, entries));
    }
    let server = snapshot.config.server.headers;
    let view = ticket.view(server);
    let policy = policy_header(view);
    let fields = match denied_by {
        Some(by) => ratelimit::denial_fields(view, entries, by, policy.as_deref()),
        None => {
            let mut fields = crate::http::field_lines::FieldLines::new();
            ratelimit::limit_fields(
                &mut fields,
                view,
                entries,
                policy.as_deref(),
                ticket.focus(),
            );
            fields
        }
    };
    // Read off the lines as written: through a header map they were
    // parsed and checked again (~5,300 instructions a call).
    let response_headers_to_add = fields
        .own_fields()
        .filter(|(name, _)| matches!(*name, b"ratelimit-policy" | b"ratelimit" | b"retry-after"))
        .filter_map(|(name, value)| {
            Some(HeaderValue {
                key: std::str::from_utf8(name).ok()?.to_owned(),
                value: std::str::from_utf8(value).ok()?.to_owned(),
                ..HeaderValue::default()
            })
        })
        .collect();
    RateLimitResponse {
        overall_code: if denied_by.is_some() {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        statuses,
        response_headers_to_add,
        ..RateLimitResponse::default()
    }
}

/// One descriptor's status from its limits' entries (`positions` in the
/// stack): over the limit when one of them denied (a shadow limit never
/// does); the limit shown is that one, or the one with the least
/// remaining, client-visible limits before shadow ones, of those decided.
fn descriptor_status(
    ticket: &Ticket<'_>,
    positions: impl Iterator<Item = usize>,
    entries: &[EntryVerdict],
) -> DescriptorStatus {
    let (limits, algorithms) = (ticket.limits(), ticket.algorithms());
    let positions: SmallVec<[usize; 4]> = positions.collect();
    let denied = positions
        .iter()
        .copied()
        .find(|&p| entries[p].outcome == Outcome::Denied);
    // A limit not decided (skipped: a local or remembered denial ended the
    // stack first) has no numbers to show.
    let among = |shadow: bool| {
        let candidates = positions
            .iter()
            .copied()
            .filter(|&p| limits[p].shadow == shadow && entries[p].outcome != Outcome::Skipped);
        least_remaining_of(algorithms, entries, candidates)
    };
    // The limit that denied, else the visible one with the least left,
    // else (a descriptor of shadow limits only) the shadow one.
    let Some(p) = denied.or_else(|| among(false)).or_else(|| among(true)) else {
        return ok_status();
    };
    let verdict = &entries[p].verdict;
    let (requests_per_unit, unit) = per_unit(&algorithms[p]);
    let reset = (!is_concurrency(limits[p])).then(|| {
        let secs = verdict.reset_after.div_ceil(NANOS_PER_SEC);
        pbjson_types::Duration {
            seconds: i64::try_from(secs).unwrap_or(i64::MAX),
            nanos: 0,
        }
    });
    DescriptorStatus {
        code: if denied.is_some() {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        current_limit: Some(RateLimit {
            name: limits[p].name.clone(),
            requests_per_unit,
            unit: unit as i32,
        }),
        limit_remaining: u32::try_from(verdict.remaining).unwrap_or(u32::MAX),
        duration_until_reset: reset,
        ..DescriptorStatus::default()
    }
}

/// A limit's numbers as Envoy's "N per unit": the largest unit in which
/// the rate is a whole number (a window's limit per window, a bucket's
/// refill rate), else per second rounded down (at least 1).
fn per_unit(algorithm: &Algorithm) -> (u32, Unit) {
    // Cost units per `per` nanoseconds.
    let (tokens, per) = match *algorithm {
        Algorithm::FixedWindow { limit, window }
        | Algorithm::SlidingWindow { limit, window }
        | Algorithm::SlidingLog { limit, window } => (limit, window),
        Algorithm::TokenBucket { refill, .. } => (refill.tokens, refill.per),
        Algorithm::LeakyBucket { rate, .. } => (rate.tokens, rate.per),
        Algorithm::Concurrency { max } => {
            return (u32::try_from(max).unwrap_or(u32::MAX), Unit::Unknown);
        }
        Algorithm::Adaptive { params } => return (params.max(), Unit::Unknown),
    };
    const DAY: u128 = 86_400 * NANOS_PER_SEC as u128;
    let units = [
        (Unit::Year, 365 * DAY),
        (Unit::Month, 30 * DAY),
        (Unit::Week, 7 * DAY),
        (Unit::Day, DAY),
        (Unit::Hour, 3_600 * NANOS_PER_SEC as u128),
        (Unit::Minute, 60 * NANOS_PER_SEC as u128),
        (Unit::Second, NANOS_PER_SEC as u128),
    ];
    let (tokens, per) = (u128::from(tokens), u128::from(per.max(1)));
    for (unit, nanos) in units {
        if nanos <= per.max(NANOS_PER_SEC as u128) && (tokens * nanos) % per == 0 {
            let n = tokens * nanos / per;
            return (u32::try_from(n).unwrap_or(u32::MAX), unit);
        }
    }
    let n = (tokens * NANOS_PER_SEC as u128 / per).max(1);
    (u32::try_from(n).unwrap_or(u32::MAX), Unit::Second)
}

/// The call's access-log line: method `POST`, the gRPC path, the domain as
/// the route, `front = "rls"`.
fn log(
    app: &App,
    request: &RateLimitRequest,
    answer: &Result<Decided<'_>, RlsError>,
    started: Nanos,
) {
    if !access_log::enabled() {
        return;
    }
    let elapsed = Duration::from_nanos(app.clock.now().saturating_sub(started));
    let (status, focus) = match answer {
        Ok((response, focus)) if response.overall_code == Code::OverLimit as i32 => (429, *focus),
        Ok((_, focus)) => (200, *focus),
        Err(RlsError::Invalid(_)) => (400, None),
        Err(RlsError::StoreDown) => (503, None),
    };
    access_log::log(&AccessEntry {
        method: "POST",
        path: PATH,
        route: &request.domain,
        status,
        elapsed: Some(elapsed),
        upstream: None,
        client_ip: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        limit: focus,
        retries: 0,
        refused: None,
        front: Front::Rls.label(),
        tokens: None,
        queued: None,
        trace: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Rate;

    #[test]
    fn a_limit_reads_as_n_per_the_largest_whole_unit() {
        let minute = 60 * NANOS_PER_SEC;
        let window = Algorithm::FixedWindow {
            limit: 100,
            window: minute,
        };
        assert_eq!(per_unit(&window), (100, Unit::Minute));
        let ninety = Algorithm::SlidingWindow {
            limit: 30,
            window: 90 * NANOS_PER_SEC,
        };
        assert_eq!(per_unit(&ninety), (20, Unit::Minute));
        let bucket = Algorithm::TokenBucket {
            capacity: 20,
            refill: Rate {
                tokens: 10,
                per: NANOS_PER_SEC,
            },
            wait: 0,
        };
        assert_eq!(per_unit(&bucket), (10, Unit::Second));
        let slow = Algorithm::TokenBucket {
            capacity: 5,
            refill: Rate {
                tokens: 1,
                per: 3 * NANOS_PER_SEC,
            },
            wait: 0,
        };
        assert_eq!(
            per_unit(&slow),
            (1, Unit::Second),
            "a third per second rounds up to 1"
        );
    }

    #[test]
    fn envoys_units_are_envoyproxy_ratelimits_dividers() {
        assert_eq!(
            unit_nanos(RateLimitUnit::Second as i32),
            Some(NANOS_PER_SEC)
        );
        assert_eq!(
            unit_nanos(RateLimitUnit::Month as i32),
            Some(30 * 86_400 * NANOS_PER_SEC)
        );
        assert_eq!(unit_nanos(RateLimitUnit::Unknown as i32), None);
        assert_eq!(unit_nanos(99), None);
    }
}
