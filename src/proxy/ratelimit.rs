//! What a client is told about its limits: the `429` problem body and the
//! `RateLimit` / `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10),
//! `X-RateLimit-*` (legacy), `RateLimit-Limit/-Remaining/-Reset` (trio) and
//! `Retry-After` headers, for denied and allowed responses alike.
//!
//! Header numbers per algorithm come from [`crate::limit::quota`],
//! [`crate::limit::window_secs`] and the limits' verdicts, all in integer
//! arithmetic; seconds are rounded up. `RateLimit-Policy` depends only on the
//! configuration, so it is serialized once per snapshot ([`policy_header`]).
//! Shadow limits never appear in client-facing headers.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use super::body::ResponseBody;
use super::response::PROBLEM_JSON;
use super::structured::ListWriter;
use crate::config::{HeaderStyles, LimitConfig};
use crate::limit::{Algorithm, EntryVerdict, NANOS_PER_SEC, Nanos, Outcome, quota, window_secs};

static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
static X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
static X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
static TRIO_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static TRIO_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static TRIO_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

/// Whole seconds, rounded up.
pub fn ceil_secs(nanos: Nanos) -> u64 {
    nanos.div_ceil(NANOS_PER_SEC)
}

/// A route's stack as the headers see it: each limit with the algorithm in
/// force for this request (a consumer's plan may change the numbers).
#[derive(Debug, Clone, Copy)]
pub struct StackView<'a> {
    pub limits: &'a [&'a LimitConfig],
    pub algorithms: &'a [Algorithm],
    pub server: HeaderStyles,
}

/// The header styles in force for one limit.
fn styles(limit: &LimitConfig, server: HeaderStyles) -> HeaderStyles {
    limit.headers.unwrap_or(server)
}

fn is_concurrency(limit: &LimitConfig) -> bool {
    matches!(limit.algorithm, Algorithm::Concurrency { .. })
}

/// `RateLimit-Policy` for a route's stack: every non-shadow limit whose
/// styles include `draft`. `None` when no limit qualifies (or a name cannot be
/// an sf-string, which validation prevents in practice).
pub fn policy_header(view: StackView<'_>) -> Option<HeaderValue> {
    let mut text = String::with_capacity(32 * view.limits.len());
    let mut list = ListWriter::new(&mut text);
    for (limit, algorithm) in view.limits.iter().zip(view.algorithms) {
        if limit.shadow || !styles(limit, view.server).draft {
            continue;
        }
        let q = i64::try_from(quota(algorithm)).unwrap_or(i64::MAX);
        let params = list.item_string(&limit.name).ok()?.param_int("q", q).ok()?;
        match window_secs(algorithm) {
            Some(w) => {
                params
                    .param_int("w", i64::try_from(w).unwrap_or(i64::MAX))
                    .ok()?;
            }
            None => {
                params.param_string("qu", "concurrent-requests").ok()?;
            }
        }
    }
    if text.is_empty() {
        return None;
    }
    HeaderValue::from_maybe_shared(Bytes::from(text)).ok()
}

/// Writes the per-request rate-limit headers for a decided stack.
///
/// `focus` is the entry the legacy and trio headers describe: the denying
/// limit, or on an allowed response the one with the least remaining (`r / q`).
pub fn write_headers(
    headers: &mut HeaderMap,
    view: StackView<'_>,
    verdicts: &[EntryVerdict],
    policy: Option<&HeaderValue>,
    focus: Option<usize>,
) {
    let server = view.server;
    if let Some(policy) = policy {
        let mut text = String::with_capacity(24 * view.limits.len());
        let mut list = ListWriter::new(&mut text);
        for (limit, entry) in view.limits.iter().zip(verdicts) {
            if limit.shadow || entry.outcome == Outcome::Skipped || !styles(limit, server).draft {
                continue;
            }
            let r = i64::try_from(entry.verdict.remaining).unwrap_or(i64::MAX);
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
        headers.insert(RATELIMIT_POLICY.clone(), policy.clone());
        if !text.is_empty()
            && let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(text))
        {
            headers.insert(RATELIMIT.clone(), value);
        }
    }
    let Some(index) = focus else { return };
    let (limit, entry) = (view.limits[index], &verdicts[index]);
    let style = styles(limit, server);
    let q = quota(&view.algorithms[index]);
    let r = entry.verdict.remaining;
    let reset = (!is_concurrency(limit)).then(|| ceil_secs(entry.verdict.reset_after));
    let families = [
        (style.legacy, &X_LIMIT, &X_REMAINING, &X_RESET),
        (style.trio, &TRIO_LIMIT, &TRIO_REMAINING, &TRIO_RESET),
    ];
    for (enabled, limit_name, remaining_name, reset_name) in families {
        if !enabled {
            continue;
        }
        headers.insert(limit_name.clone(), HeaderValue::from(q));
        headers.insert(remaining_name.clone(), HeaderValue::from(r));
        if let Some(reset) = reset {
            headers.insert(reset_name.clone(), HeaderValue::from(reset));
        }
    }
}

/// The client-visible entry with the least remaining quota (`r / q`), for the
/// legacy headers of an allowed response.
pub fn least_remaining(view: StackView<'_>, verdicts: &[EntryVerdict]) -> Option<usize> {
    let mut best: Option<(usize, u64, u64)> = None;
    for (i, (limit, entry)) in view.limits.iter().zip(verdicts).enumerate() {
        if limit.shadow || entry.outcome == Outcome::Skipped {
            continue;
        }
        let (r, q) = (entry.verdict.remaining, quota(&view.algorithms[i]).max(1));
        // r/q < r'/q'  ⇔  r·q' < r'·q, exact in u128.
        let better = match best {
            None => true,
            Some((_, br, bq)) => (r as u128) * (bq as u128) < (br as u128) * (q as u128),
        };
        if better {
            best = Some((i, r, q));
        }
    }
    best.map(|(i, _, _)| i)
}

/// The deny response: the limit's status, problem+json naming the limit,
/// `Retry-After` unless waiting cannot help, and the rate-limit headers.
pub fn deny_response(
    view: StackView<'_>,
    verdicts: &[EntryVerdict],
    denied_by: usize,
    policy: Option<&HeaderValue>,
    cost: u64,
) -> Response<ResponseBody> {
    let limit = view.limits[denied_by];
    let verdict = &verdicts[denied_by].verdict;
    let status = limit.status;
    let retry_after = (!verdict.never).then(|| {
        let t = ceil_secs(verdict.reset_after);
        let retry = verdict.retry_after.map_or(1, ceil_secs);
        retry.max(t).max(1)
    });
    let detail = if verdict.never {
        format!(
            "request cost {cost} exceeds what limit {} can ever admit ({}); it can never be admitted",
            limit.name,
            quota(&view.algorithms[denied_by])
        )
    } else {
        format!("limit {} exceeded", limit.name)
    };
    let mut body = serde_json::json!({
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": status.canonical_reason().unwrap_or("Too Many Requests"),
        "status": status.as_u16(),
        "detail": detail,
        "violated-policies": [limit.name],
    });
    if let Some(seconds) = retry_after {
        body["retry_after"] = seconds.into();
    }
    let mut response = Response::new(ResponseBody::full(body.to_string()));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, PROBLEM_JSON);
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(seconds) = retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
    }
    write_headers(headers, view, verdicts, policy, Some(denied_by));
    response
}

/// The 400 answer for a limit with `on_missing_key = "deny"`.
pub fn missing_key_response(limit: &LimitConfig, key: &str) -> Response<ResponseBody> {
    super::response::problem(
        StatusCode::BAD_REQUEST,
        &format!(
            "limit {} needs the request key {key}, which is missing",
            limit.name
        ),
    )
}
