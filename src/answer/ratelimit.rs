//! What a client is told about its limits: the `429` problem body and the
//! `RateLimit` / `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10),
//! `X-RateLimit-*` (legacy), `RateLimit-Limit/-Remaining/-Reset` (trio) and
//! `Retry-After` headers, for denied and allowed responses alike.
//!
//! Header numbers per algorithm come from [`crate::limit::quota`],
//! [`crate::limit::window_secs`] and the limits' verdicts, all in integer
//! arithmetic; seconds are rounded up. `RateLimit-Policy` depends only on the
//! configuration, so it is serialized once per snapshot
//! ([`policy_header`](crate::ratelimit_policy::policy_header)).
//! Shadow limits never appear in client-facing headers.

use bytes::Bytes;
use http::{Response, StatusCode};

use super::arena::arena_body;
use super::body::ResponseBody;
use super::memo::{self, Denial};
use crate::admission::Ticket;
use crate::app::{RoutePlan, Snapshot};
use crate::config::LimitConfig;
use crate::config::tokens::{MICROS_PER_CENT, Unit, WarnAt};
use crate::http::field_lines::{FieldLines, OWN_ROOM, OwnLines, OwnName, own_name};
use crate::http::problem::{
    DETAIL, NumberMember, ObjectMember, ProblemWriter, STATUS, TITLE, TYPE, TextListMember,
    TextMember, TextWriter, Written, problem_member,
};
use crate::limit::{
    Algorithm, EntryVerdict, NANOS_PER_SEC, Nanos, Outcome, Priority, Shed, Verdict, quota,
    quota_of,
};
use crate::llm::price::dollars;
use crate::ratelimit_policy::{StackView, is_concurrency, styles};

const RATELIMIT: OwnName = own_name!("ratelimit");
const RATELIMIT_POLICY: OwnName = own_name!("ratelimit-policy");
const RETRY_AFTER: OwnName = own_name!("retry-after");
/// A denial's fields that never change, as one copy.
const PROBLEM_NOT_STORED: OwnLines =
    OwnLines::new("content-type: application/problem+json\r\ncache-control: no-store\r\n");

/// One family of the three focus fields (limit, remaining, reset).
struct FocusNames {
    limit: OwnName,
    remaining: OwnName,
    reset: OwnName,
}

const LEGACY: FocusNames = FocusNames {
    limit: own_name!("x-ratelimit-limit"),
    remaining: own_name!("x-ratelimit-remaining"),
    reset: own_name!("x-ratelimit-reset"),
};
const TRIO: FocusNames = FocusNames {
    limit: own_name!("ratelimit-limit"),
    remaining: own_name!("ratelimit-remaining"),
    reset: own_name!("ratelimit-reset"),
};

/// Whole seconds, rounded up.
pub(crate) fn ceil_secs(nanos: Nanos) -> u64 {
    nanos.div_ceil(NANOS_PER_SEC)
}

/// Writes the per-request rate-limit fields for a decided stack to `lines`
/// (see [`FieldLines`] for why lines and not a header map).
///
/// `focus` is the entry the legacy and trio headers describe: the denying
/// limit, or on an allowed response the one with the least remaining (`r / q`).
pub(crate) fn limit_fields(
    lines: &mut FieldLines,
    view: StackView<'_>,
    verdicts: &[EntryVerdict],
    policy: Option<&str>,
    focus: Option<usize>,
) {
    let server = view.server;
    if let Some(policy) = policy {
        lines.push(RATELIMIT_POLICY, policy);
        lines.push_list(RATELIMIT, |list| {
            for (limit, entry) in view.limits.iter().zip(verdicts) {
                if limit.shadow || entry.outcome == Outcome::Skipped || !styles(limit, server).draft
                {
                    continue;
                }
                let r = in_cents(limit.unit, entry.verdict.remaining);
                let r = i64::try_from(r).unwrap_or(i64::MAX);
                let Ok(params) = list.item_string(&limit.name) else {
                    continue;
                };
                let Ok(params) = params.param_int("r", r) else {
                    continue;
                };
                if !is_concurrency(limit) {
                    let t = i64::try_from(ceil_secs(entry.verdict.reset_after)).unwrap_or(i64::MAX);
                    let _ = params.param_int("t", t);
                }
            }
        });
    }
    let Some(index) = focus else { return };
    let (limit, entry) = (view.limits[index], &verdicts[index]);
    let style = styles(limit, server);
    let q = in_cents(
        limit.unit,
        quota_of(&view.algorithms[index], &entry.verdict),
    );
    let r = in_cents(limit.unit, entry.verdict.remaining);
    let reset = (!is_concurrency(limit)).then(|| ceil_secs(entry.verdict.reset_after));
    // Both families say the same three numbers: formatted once.
    let (mut q_digits, mut r_digits, mut reset_digits) = (
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
    );
    let (q, r) = (q_digits.format(q), r_digits.format(r));
    let reset = reset.map(|reset| reset_digits.format(reset));
    // Spelled out per family, not a loop over a table of names: each
    // push then copies a constant name.
    if style.legacy {
        push_focus(lines, &LEGACY, q, r, reset);
    }
    if style.trio {
        push_focus(lines, &TRIO, q, r, reset);
    }
}

/// A usd limit's number (micro-dollars) in whole cents, rounded down, as
/// its fields count (`qu="usd-cents"`); any other limit's as it is.
#[inline(always)]
pub(crate) fn in_cents(unit: Unit, n: u64) -> u64 {
    match unit {
        Unit::Usd => n / MICROS_PER_CENT,
        Unit::Requests | Unit::Tokens => n,
    }
}

/// One family's focus fields: inlined, so the names are constants.
#[inline(always)]
fn push_focus(lines: &mut FieldLines, names: &FocusNames, q: &str, r: &str, reset: Option<&str>) {
    lines.push(names.limit, q);
    lines.push(names.remaining, r);
    if let Some(reset) = reset {
        lines.push(names.reset, reset);
    }
}

/// [`limit_fields`] of an admitted request: its ticket's stack, the
/// route's `RateLimit-Policy` for the caller's plan, the ticket's focus.
/// Always inlined, as [`denied_response`]: out of line in the proxy's
/// handler, it cost the allowed path ~70 instructions per request
/// (`bench/instructions.sh`).
#[inline(always)]
pub(crate) fn admitted_fields(
    lines: &mut FieldLines,
    snapshot: &Snapshot,
    plan: &RoutePlan,
    ticket: &Ticket<'_>,
) {
    let view = ticket.view(snapshot.config.server.headers);
    limit_fields(
        lines,
        view,
        ticket.entries(),
        ticket
            .policy(plan, snapshot.config.server.headers)
            .as_deref(),
        ticket.focus(),
    );
    // The list only when a limit has reached its threshold: most answers
    // have none to give, and starting the field to take it back cost them.
    let entries = ticket.entries();
    let due = view.limits.iter().zip(view.algorithms).zip(entries);
    if due
        .into_iter()
        .any(|((limit, algorithm), entry)| warning_due(limit, algorithm, entry).is_some())
    {
        budget_warning(lines, view, entries);
    }
}

/// The whole percent spent of `limit`'s quota when its spend (this
/// request's reservation included) has reached its `warn_at`, with that
/// threshold; `None` when it has no `warn_at`, has not reached it, or
/// skipped the key.
#[inline(always)]
fn warning_due(
    limit: &LimitConfig,
    algorithm: &Algorithm,
    entry: &EntryVerdict,
) -> Option<(i64, WarnAt)> {
    let warn_at = limit.warn_at?;
    if entry.outcome == Outcome::Skipped {
        return None;
    }
    let q = quota_of(algorithm, &entry.verdict);
    let spent = q.saturating_sub(entry.verdict.remaining);
    if q == 0 || !warn_at.reached(spent, q) {
        return None;
    }
    let percent = u128::from(spent) * 100 / u128::from(q);
    Some((i64::try_from(percent).unwrap_or(i64::MAX), warn_at))
}

const BUDGET_WARNING: OwnName = own_name!("x-budget-warning");

/// `X-Budget-Warning` on an admitted request's answer: each usd limit
/// with a `warn_at` whose spend (its reservation for this request
/// included) has reached it, as an RFC 9651 list item naming the limit
/// with the whole percent spent and the threshold:
/// `"monthly_spend";spent=82;warn_at=80`. Shadow limits too (a budget
/// tried in shadow still warns); skipped keys never.
#[cold]
#[inline(never)]
fn budget_warning(lines: &mut FieldLines, view: StackView<'_>, verdicts: &[EntryVerdict]) {
    lines.push_list(BUDGET_WARNING, |list| {
        for ((limit, algorithm), entry) in view.limits.iter().zip(view.algorithms).zip(verdicts) {
            let Some((percent, warn_at)) = warning_due(limit, algorithm, entry) else {
                continue;
            };
            let Ok(params) = list.item_string(&limit.name) else {
                continue;
            };
            let _ = params
                .param_int("spent", percent)
                .and_then(|p| p.param_int("warn_at", i64::from(warn_at.basis_points / 100)));
        }
    });
}

/// [`deny_response_into`] of a denied request: its ticket's stack, denied by
/// the entry at `denied_by`, with the route's `RateLimit-Policy` for the
/// caller's plan, as the proxy and `/auth` answer it (`cost`: what the
/// denying limit was asked for). Always inlined, as `denial`: the deny
/// path's instructions are counted.
#[inline(always)]
pub(crate) fn denied_response(
    snapshot: &Snapshot,
    plan: &RoutePlan,
    ticket: &Ticket<'_>,
    denied_by: usize,
    cost: u64,
) -> (Response<ResponseBody>, FieldLines) {
    let mut fields = FieldLines::new();
    let response = denied_response_into(snapshot, plan, ticket, denied_by, cost, &mut fields);
    (response, fields)
}

/// [`denied_response`] with its fields written into `fields` (empty), where
/// the caller keeps them: returned beside the response, they were moved
/// once more on every denial.
#[inline(always)]
pub(crate) fn denied_response_into(
    snapshot: &Snapshot,
    plan: &RoutePlan,
    ticket: &Ticket<'_>,
    denied_by: usize,
    cost: u64,
    fields: &mut FieldLines,
) -> Response<ResponseBody> {
    deny_response_into(
        ticket.view(snapshot.config.server.headers),
        ticket.entries(),
        denied_by,
        ticket
            .policy(plan, snapshot.config.server.headers)
            .as_deref(),
        (cost, ticket.shed()),
        fields,
    )
}

/// The problem type of a denial, from IANA's HTTP Problem Types registry.
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";
/// The quota-exceeded type's member naming the limits that denied.
const VIOLATED_POLICIES_MEMBER: TextListMember = problem_member!(text_list "violated-policies");
/// The seconds `Retry-After` says, for clients that read only the body.
const RETRY_AFTER_MEMBER: NumberMember = problem_member!(number "retry_after");
/// A request refused at a slot limit (shed): its priority and why
/// (`full`, `queue_full`, `wait_too_long`, `timeout`).
const PRIORITY_MEMBER: TextMember = problem_member!(text "priority");
const SHED_REASON_MEMBER: TextMember = problem_member!(text "shed_reason");
/// On a stack with a token limit (an LLM API), the error as OpenAI writes
/// its own 429s, which the OpenAI-compatible SDKs show their users
/// (`error.message`): `{"message", "type": "tokens" | "requests", "code":
/// "rate_limit_exceeded"}`.
const OPENAI_ERROR_MEMBER: ObjectMember = problem_member!(object "error");
const OPENAI_MESSAGE: TextMember = problem_member!(text "message");
const OPENAI_TYPE: TextMember = problem_member!(text "type");
const OPENAI_CODE: TextMember = problem_member!(text "code");
/// A spend budget's denial: the budget's name, the most the request would
/// have cost (dollars, exact, as a string) and the seconds until the
/// budget frees what it needs (its window's end for a fixed window).
const BUDGET_MEMBER: TextMember = problem_member!(text "budget");
const MAX_COST_MEMBER: TextMember = problem_member!(text "max_cost_usd");
const BUDGET_RESET_MEMBER: NumberMember = problem_member!(number "budget_reset_seconds");

/// The fields a client is told of a denial by the entry at `denied_by`
/// of the stack `view`, with the route's `RateLimit-Policy` (`policy`):
/// content type, `Cache-Control: no-store`, `Retry-After` (unless waiting
/// cannot help) and the rate-limit fields, as a value. The Envoy service
/// keeps these; the proxy and `/auth` write the same beside their 429
/// ([`deny_response_into`]).
#[inline(always)]
pub(crate) fn denial_fields(
    view: StackView<'_>,
    verdicts: &[EntryVerdict],
    denied_by: usize,
    policy: Option<&str>,
) -> FieldLines {
    let retry_after = retry_after(&verdicts[denied_by].verdict);
    denial_lines(view, verdicts, denied_by, policy, retry_after)
}

/// The seconds `Retry-After` says of a denying verdict (`None` when
/// waiting cannot help): never earlier than its reset, at least one.
#[inline(always)]
fn retry_after(verdict: &Verdict) -> Option<u64> {
    (!verdict.never).then(|| {
        let t = ceil_secs(verdict.reset_after);
        let retry = verdict.retry_after.map_or(1, ceil_secs);
        retry.max(t).max(1)
    })
}

/// [`denial_fields`], with the seconds `Retry-After` says. Always
/// inlined: fat LTO kept a call in `deny_response_into` (~18 instructions per
/// denial, `bench/instructions.sh`).
#[inline(always)]
fn denial_lines(
    view: StackView<'_>,
    verdicts: &[EntryVerdict],
    denied_by: usize,
    policy: Option<&str>,
    retry_after: Option<u64>,
) -> FieldLines {
    let mut lines = FieldLines::new();
    lines.mark_rate_denial();
    // Room for the policy beside the rest: one allocation.
    lines.reserve_own(OWN_ROOM + policy.map_or(0, str::len));
    lines.push_lines(PROBLEM_NOT_STORED);
    if let Some(seconds) = retry_after {
        lines.push_number(RETRY_AFTER, seconds);
    }
    limit_fields(&mut lines, view, verdicts, policy, Some(denied_by));
    lines
}

/// The deny response: the limit's status and problem+json naming the limit
/// (`cost`: what the request asked for, named when it can never fit; `shed`:
/// the priority and reason of a request refused at a slot limit); and
/// its [`denial_fields`]. The body is written before the fields are
/// built: built first, they were held across the body's writing (~46
/// instructions per denial, `bench/instructions.sh`).
/// Its fields go into `out` (empty), where the caller keeps them.
pub(crate) fn deny_response_into(
    view: StackView<'_>,
    verdicts: &[EntryVerdict],
    denied_by: usize,
    policy: Option<&str>,
    (cost, shed): (u64, Option<(Priority, Shed)>),
    out: &mut FieldLines,
) -> Response<ResponseBody> {
    let limit = view.limits[denied_by];
    let verdict = &verdicts[denied_by].verdict;
    let status = limit.status;
    let retry_after = retry_after(verdict);
    // A flood of one key is answered the same until its next refill: the
    // thread's last such answer is copied when this one is made of the
    // same (`memo`).
    let kept = match retry_after {
        Some(seconds) if memo::keeps(view, verdicts, denied_by, shed.is_some()) => {
            let denial = Denial {
                view,
                verdicts,
                denied_by,
                policy,
                retry_after: seconds,
            };
            if let Some(body) = memo::recall(&denial, out) {
                return answer(body, status);
            }
            Some(denial)
        }
        _ => None,
    };
    let body = arena_body(|body| {
        // Member by member into the thread's buffer rather than through
        // `serde_json::Value`: the deny path runs at flood rates, and this
        // allocates nothing (a dozen allocations there), each member one
        // copy of its joined literal (see `http::problem`); digits by itoa
        // rather than `write!`: `fmt` was a tenth of the path.
        let mut problem = ProblemWriter::new(body);
        problem.literal(&TYPE, QUOTA_EXCEEDED);
        problem.literal(
            &TITLE,
            status.canonical_reason().unwrap_or("Too Many Requests"),
        );
        problem.number(&STATUS, status.as_u16());
        let detail = |detail: &mut TextWriter<'_>| -> Written {
            if verdict.never && limit.unit == Unit::Usd {
                return never_affordable(detail, &limit.name, cost, &view.algorithms[denied_by]);
            }
            if verdict.never {
                detail.literal("request cost ");
                detail.number(cost);
                detail.literal(" exceeds what limit ");
                let name = detail.escaped(&limit.name);
                detail.literal(" can ever admit (");
                detail.number(quota(&view.algorithms[denied_by]));
                detail.literal("); it can never be admitted");
                name
            } else {
                detail.literal("limit ");
                let name = detail.escaped(&limit.name);
                detail.literal(" exceeded");
                if limit.unit == Unit::Tokens {
                    // What did not fit: the request's reservation.
                    detail.literal(": the request reserves ");
                    detail.number(cost);
                    detail.literal(" tokens");
                }
                if limit.unit == Unit::Usd {
                    detail.literal(": the request may cost up to $");
                    detail.escaped(&dollars(cost));
                }
                name
            }
        };
        let name = problem.text_with(&DETAIL, detail);
        // The name as escaped above: copied, not checked and escaped again.
        problem.text_list(&VIOLATED_POLICIES_MEMBER, |names| {
            names.item(|text| text.copy(&name))
        });
        if let Some(seconds) = retry_after {
            problem.number(&RETRY_AFTER_MEMBER, seconds);
        }
        if let Some((priority, reason)) = shed {
            problem.literal(&PRIORITY_MEMBER, priority.label());
            problem.literal(&SHED_REASON_MEMBER, reason.label());
        }
        if limit.unit == Unit::Usd {
            budget_members(&mut problem, &limit.name, cost, verdict);
        }
        if view.limits.iter().any(|l| l.unit != Unit::Requests) {
            openai_error(&mut problem, limit.unit, detail);
        }
        problem.finish();
    });
    *out = denial_lines(view, verdicts, denied_by, policy, retry_after);
    if let Some(denial) = kept {
        memo::keep(&denial, &body, out);
    }
    answer(body, status)
}

/// [`deny_response_into`], the fields returned beside the response.
#[cfg(test)]
pub(crate) fn deny_response(
    view: StackView<'_>,
    verdicts: &[EntryVerdict],
    denied_by: usize,
    policy: Option<&str>,
    cost_and_shed: (u64, Option<(Priority, Shed)>),
) -> (Response<ResponseBody>, FieldLines) {
    let mut fields = FieldLines::new();
    let response = deny_response_into(
        view,
        verdicts,
        denied_by,
        policy,
        cost_and_shed,
        &mut fields,
    );
    (response, fields)
}

/// A denial's response: `status` with `body`.
#[inline(always)]
fn answer(body: Bytes, status: StatusCode) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() = status;
    response
}

/// The OpenAI-shaped `error` member of a token stack's denial, its
/// message the problem's `detail` written again by `detail`. Out of line:
/// the other denials do not carry it.
#[cold]
#[inline(never)]
fn openai_error(
    problem: &mut ProblemWriter<'_>,
    unit: Unit,
    detail: impl FnOnce(&mut TextWriter<'_>) -> Written,
) {
    problem.object(&OPENAI_ERROR_MEMBER, |error| {
        error.text_with(&OPENAI_MESSAGE, detail);
        // OpenAI's own answer to a spent quota: `insufficient_quota`.
        let (kind, code) = match unit {
            Unit::Tokens => ("tokens", "rate_limit_exceeded"),
            Unit::Requests => ("requests", "rate_limit_exceeded"),
            Unit::Usd => ("insufficient_quota", "insufficient_quota"),
        };
        error.literal(&OPENAI_TYPE, kind);
        error.literal(&OPENAI_CODE, code);
    });
}

/// The detail of a request whose most possible cost is above what a usd
/// limit holds at all: no wait helps.
#[cold]
#[inline(never)]
fn never_affordable(
    detail: &mut TextWriter<'_>,
    name: &str,
    cost: u64,
    algorithm: &crate::limit::Algorithm,
) -> Written {
    detail.literal("the request may cost up to $");
    detail.escaped(&dollars(cost));
    detail.literal(", more than budget ");
    let name = detail.escaped(name);
    detail.literal(" holds ($");
    detail.escaped(&dollars(quota(algorithm)));
    detail.literal("); it can never be admitted");
    name
}

/// A usd limit's denial members ([`BUDGET_MEMBER`] and the rest). Out of
/// line: other denials do not carry them.
#[cold]
#[inline(never)]
fn budget_members(
    problem: &mut ProblemWriter<'_>,
    name: &str,
    cost: u64,
    verdict: &crate::limit::Verdict,
) {
    problem.text(&BUDGET_MEMBER, name);
    problem.text(&MAX_COST_MEMBER, &dollars(cost));
    if !verdict.never {
        problem.number(&BUDGET_RESET_MEMBER, ceil_secs(verdict.reset_after).max(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HeaderStyles;
    use crate::config::{LimitConfig, OnMissingKey};
    use crate::limit::{Algorithm, Rate, Verdict};
    use crate::ratelimit_policy::{least_remaining, policy_header};
    use http::StatusCode;

    const S: Nanos = NANOS_PER_SEC;

    fn limit(name: &str, algorithm: Algorithm) -> LimitConfig {
        LimitConfig {
            name: name.into(),
            key: vec![crate::config::KeyPart::Ip],
            algorithm,
            shadow: false,
            status: StatusCode::TOO_MANY_REQUESTS,
            on_missing_key: OnMissingKey::Skip,
            local: false,
            headers: None,
            max_keys: 10,
            plans: Vec::new(),
            align: Default::default(),
            lease: None,
            unit: Default::default(),
            reserve: Default::default(),
            queue: None,
            params: Default::default(),
            warn_at: None,
        }
    }

    fn entry(outcome: Outcome, remaining: u64, reset_after: Nanos) -> EntryVerdict {
        EntryVerdict {
            outcome,
            verdict: Verdict {
                allowed: outcome != Outcome::Denied,
                remaining,
                reset_after,
                retry_after: (outcome == Outcome::Denied).then_some(reset_after),
                ..Verdict::default()
            },
        }
    }

    /// The borrowed halves of a [`StackView`] over `limits`.
    fn view_parts(limits: &[LimitConfig]) -> (Vec<&LimitConfig>, Vec<Algorithm>) {
        (
            limits.iter().collect(),
            limits.iter().map(|l| l.algorithm).collect(),
        )
    }

    /// The stack as the headers see it, with the server's default styles.
    fn default_view<'a>(refs: &'a [&'a LimitConfig], algorithms: &'a [Algorithm]) -> StackView<'a> {
        StackView {
            limits: refs,
            algorithms,
            server: HeaderStyles::default(),
        }
    }

    /// The deny response with its field lines put into its header map.
    fn deny_with_fields(
        view: StackView<'_>,
        verdicts: &[EntryVerdict],
        denied_by: usize,
        policy: Option<&str>,
        cost: u64,
    ) -> Response<ResponseBody> {
        let (mut response, lines) = deny_response(view, verdicts, denied_by, policy, (cost, None));
        lines.apply(response.headers_mut());
        response
    }

    fn stack() -> Vec<LimitConfig> {
        vec![
            limit(
                "per_key",
                Algorithm::TokenBucket {
                    capacity: 20,
                    refill: Rate { tokens: 10, per: S },
                    wait: 0,
                },
            ),
            limit(
                "per_ip",
                Algorithm::SlidingWindow {
                    limit: 100,
                    window: 60 * S,
                },
            ),
        ]
    }

    /// A denial's bytes: its status, its fields as written and its body.
    fn answer_bytes(
        view: StackView<'_>,
        verdicts: &[EntryVerdict],
        policy: Option<&str>,
    ) -> (u16, Vec<u8>, String) {
        let (response, lines) = deny_response(view, verdicts, 1, policy, (1, None));
        let mut fields = Vec::new();
        lines.write_to(&mut fields);
        (response.status().as_u16(), fields, futures_body(response))
    }

    #[test]
    fn a_denial_like_the_last_is_its_copy_and_any_other_is_written_afresh() {
        let limits = stack();
        let (refs, algorithms) = view_parts(&limits);
        let view = default_view(&refs, &algorithms);
        let policy = policy_header(view).unwrap();
        let verdicts = [
            entry(Outcome::Allowed, 14, 100_000_000),
            entry(Outcome::Denied, 0, 11 * S + 1),
        ];
        memo::forget();
        let first = answer_bytes(view, &verdicts, Some(&*policy));
        let again = answer_bytes(view, &verdicts, Some(&*policy));
        assert_eq!(first, again);
        // Kept: the next such denial is a copy.
        let denial = Denial {
            view,
            verdicts: &verdicts,
            denied_by: 1,
            policy: Some(&*policy),
            retry_after: 12,
        };
        assert!(memo::recall(&denial, &mut FieldLines::new()).is_some());

        // Each input changed alone, after the first denial was kept: the
        // answer is what a thread that kept nothing writes.
        let mut renamed = stack();
        renamed[1].name = "per_ipx".into();
        let mut teapot = stack();
        teapot[1].status = StatusCode::IM_A_TEAPOT;
        let mut legacy_only = stack();
        legacy_only[0].headers = Some(HeaderStyles {
            draft: false,
            legacy: true,
            trio: false,
        });
        let mut shadowed = stack();
        shadowed[0].shadow = true;
        let mut bigger = stack();
        bigger[1].algorithm = Algorithm::SlidingWindow {
            limit: 101,
            window: 60 * S,
        };
        let numbers: [[EntryVerdict; 2]; 4] = [
            [entry(Outcome::Allowed, 13, 100_000_000), verdicts[1]],
            [entry(Outcome::Allowed, 14, 2 * S), verdicts[1]],
            [verdicts[0], entry(Outcome::Denied, 0, 12 * S + 1)],
            [entry(Outcome::Skipped, 0, 0), verdicts[1]],
        ];
        let check = |limits: &[LimitConfig], verdicts: &[EntryVerdict], policy: Option<&str>| {
            let (refs, algorithms) = view_parts(limits);
            let view = default_view(&refs, &algorithms);
            let original = stack();
            let (original_refs, original_algorithms) = view_parts(&original);
            let original_view = default_view(&original_refs, &original_algorithms);
            let original_policy = policy_header(original_view).unwrap();
            let original_verdicts = [
                entry(Outcome::Allowed, 14, 100_000_000),
                entry(Outcome::Denied, 0, 11 * S + 1),
            ];
            memo::forget();
            let afresh = answer_bytes(view, verdicts, policy);
            // The original kept, then the changed denial answered.
            memo::forget();
            let _ = answer_bytes(original_view, &original_verdicts, Some(&*original_policy));
            let kept = Denial {
                view: original_view,
                verdicts: &original_verdicts,
                denied_by: 1,
                policy: Some(&*original_policy),
                retry_after: 12,
            };
            assert!(memo::recall(&kept, &mut FieldLines::new()).is_some());
            assert_eq!(answer_bytes(view, verdicts, policy), afresh);
            afresh
        };
        for changed in [&renamed, &teapot, &legacy_only, &shadowed, &bigger] {
            let (refs, algorithms) = view_parts(changed);
            let policy = policy_header(default_view(&refs, &algorithms));
            assert_ne!(check(changed, &verdicts, policy.as_deref()), first);
        }
        for verdicts in &numbers {
            assert_ne!(check(&limits, verdicts, Some(&*policy)), first);
        }
        assert_ne!(check(&limits, &verdicts, None), first);
        assert_ne!(check(&limits, &verdicts, Some("\"other\";q=1;w=1")), first);
    }

    #[test]
    fn a_run_of_misses_keeps_one_answer_in_eight() {
        let limits = stack();
        let (refs, algorithms) = view_parts(&limits);
        let view = default_view(&refs, &algorithms);
        let policy = policy_header(view).unwrap();
        // Denials whose `Retry-After` differs each time: all misses.
        let denial_at = |seconds: u64| {
            [
                entry(Outcome::Allowed, 14, 100_000_000),
                entry(Outcome::Denied, 0, seconds * S),
            ]
        };
        let kept_at = |verdicts: &[EntryVerdict; 2], seconds: u64| {
            memo::recall(
                &Denial {
                    view,
                    verdicts,
                    denied_by: 1,
                    policy: Some(&*policy),
                    retry_after: seconds,
                },
                &mut FieldLines::new(),
            )
            .is_some()
        };
        memo::forget();
        let mut kept = Vec::new();
        for seconds in 1..=17 {
            let verdicts = denial_at(seconds);
            let _ = answer_bytes(view, &verdicts, Some(&*policy));
            // Asked again at once: a hit when this one was kept (and the
            // run of misses starts again).
            if kept_at(&verdicts, seconds) {
                kept.push(seconds);
            }
        }
        // Each hit ends the run: every miss after it is a first again.
        assert_eq!(kept, (1..=17).collect::<Vec<_>>());

        memo::forget();
        let mut kept = Vec::new();
        for seconds in 1..=17 {
            let _ = answer_bytes(view, &denial_at(seconds), Some(&*policy));
        }
        for seconds in 1..=17 {
            if kept_at(&denial_at(seconds), seconds) {
                kept.push(seconds);
            }
        }
        // Misses 1, 9 and 17 of the run were kept; the last is the one left.
        assert_eq!(kept, [17]);
    }

    #[test]
    fn the_contract_example_serializes_exactly() {
        let limits = stack();
        let (refs, algorithms) = view_parts(&limits);
        let view = default_view(&refs, &algorithms);
        let policy = policy_header(view).unwrap();
        assert_eq!(&*policy, "\"per_key\";q=20;w=2, \"per_ip\";q=100;w=60");
        let verdicts = [
            entry(Outcome::Allowed, 14, 100_000_000),
            entry(Outcome::Denied, 0, 11 * S + 1),
        ];
        let response = deny_with_fields(view, &verdicts, 1, Some(&*policy), 1);
        let headers = response.headers();
        assert_eq!(
            headers["ratelimit"],
            "\"per_key\";r=14;t=1, \"per_ip\";r=0;t=12"
        );
        assert_eq!(headers["retry-after"], "12");
        assert_eq!(headers["x-ratelimit-limit"], "100");
        assert_eq!(headers["x-ratelimit-remaining"], "0");
        assert_eq!(headers["x-ratelimit-reset"], "12");
        assert_eq!(headers["cache-control"], "no-store");
        assert!(
            !headers.contains_key("ratelimit-limit"),
            "trio is off by default"
        );
        assert_eq!(headers["content-type"], "application/problem+json");
        assert_eq!(
            futures_body(response),
            concat!(
                r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
                r#""title":"Too Many Requests","status":429,"#,
                r#""detail":"limit per_ip exceeded","violated-policies":["per_ip"],"retry_after":12}"#
            )
        );
    }

    #[test]
    fn retry_after_is_never_earlier_than_t_and_at_least_one() {
        let limits = stack();
        let (refs, algorithms) = view_parts(&limits);
        let view = default_view(&refs, &algorithms);
        let mut denied = entry(Outcome::Denied, 0, 5 * S);
        denied.verdict.retry_after = Some(1);
        let verdicts = [entry(Outcome::Allowed, 20, 0), denied];
        let response = deny_with_fields(view, &verdicts, 1, None, 1);
        assert_eq!(response.headers()["retry-after"], "5");
        // Cost that can never fit: no Retry-After at all.
        let mut never = entry(Outcome::Denied, 20, 0);
        never.verdict.never = true;
        never.verdict.retry_after = None;
        let verdicts = [never, entry(Outcome::Allowed, 100, 0)];
        let response = deny_with_fields(view, &verdicts, 0, None, 50);
        assert!(!response.headers().contains_key("retry-after"));
        // …nor a `retry_after` member.
        assert_eq!(
            futures_body(response),
            concat!(
                r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","#,
                r#""title":"Too Many Requests","status":429,"#,
                r#""detail":"request cost 50 exceeds what limit per_key can ever admit (20); "#,
                r#"it can never be admitted","violated-policies":["per_key"]}"#
            )
        );
    }

    #[test]
    fn deny_bodies_are_valid_json_for_any_limit_name() {
        let mut limits = stack();
        limits[1].name = "odd \"name\" \\ with\ttab".into();
        let (refs, algorithms) = view_parts(&limits);
        let view = default_view(&refs, &algorithms);
        let verdicts = [
            entry(Outcome::Allowed, 14, 0),
            entry(Outcome::Denied, 0, 3 * S),
        ];
        let response = deny_with_fields(view, &verdicts, 1, None, 1);
        let body = futures_body(response);
        let value: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(value["violated-policies"][0], limits[1].name.as_str());
        assert_eq!(
            value["detail"],
            format!("limit {} exceeded", limits[1].name)
        );
        assert_eq!(value["retry_after"], 3);
        assert_eq!(value["status"], 429);
    }

    /// The full body of a gateway response (always in memory).
    fn futures_body(response: Response<ResponseBody>) -> String {
        use http_body_util::BodyExt;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = runtime
            .block_on(response.into_body().collect())
            .unwrap()
            .to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[test]
    fn least_remaining_compares_fractions_exactly() {
        let limits = stack();
        let (refs, algorithms) = view_parts(&limits);
        let view = default_view(&refs, &algorithms);
        // 10/20 = 0.5 against 49/100 = 0.49: per_ip has less left.
        let verdicts = [
            entry(Outcome::Allowed, 10, 0),
            entry(Outcome::Allowed, 49, 0),
        ];
        assert_eq!(least_remaining(view, &verdicts), Some(1));
        let verdicts = [
            entry(Outcome::Allowed, 9, 0),
            entry(Outcome::Allowed, 49, 0),
        ];
        assert_eq!(least_remaining(view, &verdicts), Some(0));
        // Skipped limits are not candidates.
        let verdicts = [
            entry(Outcome::Skipped, 0, 0),
            entry(Outcome::Allowed, 49, 0),
        ];
        assert_eq!(least_remaining(view, &verdicts), Some(1));
    }

    #[test]
    fn shadow_limits_are_not_shown() {
        let mut limits = stack();
        limits[1].shadow = true;
        let (refs, algorithms) = view_parts(&limits);
        let view = default_view(&refs, &algorithms);
        assert_eq!(&*policy_header(view).unwrap(), "\"per_key\";q=20;w=2");
    }
}
