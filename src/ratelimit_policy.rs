//! A route's rate-limit stack as the response fields see it ([`StackView`])
//! and its `RateLimit-Policy` field (draft-ietf-httpapi-ratelimit-headers-10),
//! which depends only on the configuration and so is serialized once per
//! snapshot (by `app`), below the pipeline that sends it
//! (`answer::ratelimit` writes the per-request fields).

use crate::config::tokens::{MICROS_PER_CENT, Unit};
use crate::config::{HeaderStyles, LimitConfig};
use crate::http::structured::ListWriter;
use crate::limit::{Algorithm, EntryVerdict, Outcome, quota, quota_of, window_secs};

/// A route's stack as the headers see it: each limit with the algorithm in
/// force for this request (a consumer's plan may change the numbers).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StackView<'a> {
    pub(crate) limits: &'a [&'a LimitConfig],
    pub(crate) algorithms: &'a [Algorithm],
    pub(crate) server: HeaderStyles,
}

/// The header styles in force for one limit.
pub(crate) fn styles(limit: &LimitConfig, server: HeaderStyles) -> HeaderStyles {
    limit.headers.unwrap_or(server)
}

/// Counts requests in flight (`concurrency`, `adaptive`): no `t` or `w`.
pub(crate) fn is_concurrency(limit: &LimitConfig) -> bool {
    matches!(
        limit.algorithm,
        Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. }
    )
}

/// `RateLimit-Policy` for a route's stack: every non-shadow limit whose
/// styles include `draft`. `None` when no limit qualifies (or a name cannot be
/// an sf-string, which validation prevents in practice).
pub(crate) fn policy_header(view: StackView<'_>) -> Option<Box<str>> {
    let mut text = String::with_capacity(32 * view.limits.len());
    let mut list = ListWriter::new(&mut text);
    for (limit, algorithm) in view.limits.iter().zip(view.algorithms) {
        if limit.shadow || !styles(limit, view.server).draft {
            continue;
        }
        let usd = limit.unit == Unit::Usd;
        // A usd limit counts micro-dollars; its fields whole cents.
        let q = match usd {
            true => quota(algorithm) / MICROS_PER_CENT,
            false => quota(algorithm),
        };
        let q = i64::try_from(q).unwrap_or(i64::MAX);
        let params = list.item_string(&limit.name).ok()?.param_int("q", q).ok()?;
        match window_secs(algorithm) {
            Some(w) => {
                let params = params
                    .param_int("w", i64::try_from(w).unwrap_or(i64::MAX))
                    .ok()?;
                if usd {
                    params.param_string("qu", "usd-cents").ok()?;
                }
            }
            None => {
                params.param_string("qu", "concurrent-requests").ok()?;
            }
        }
    }
    // The list writer emits only sf-strings, integers and tokens: always a
    // valid field value.
    (!text.is_empty()).then(|| text.into_boxed_str())
}

/// The client-visible entry with the least remaining quota (`r / q`), for the
/// legacy headers of an allowed response.
#[inline]
pub(crate) fn least_remaining(view: StackView<'_>, verdicts: &[EntryVerdict]) -> Option<usize> {
    let visible = (0..verdicts.len())
        .filter(|&i| !view.limits[i].shadow && verdicts[i].outcome != Outcome::Skipped);
    least_remaining_of(view.algorithms, verdicts, visible)
}

/// Of the entries at `candidates`, the one with the least remaining quota
/// (`r / q`, compared exactly); the first of equals.
#[inline]
pub(crate) fn least_remaining_of(
    algorithms: &[Algorithm],
    verdicts: &[EntryVerdict],
    candidates: impl Iterator<Item = usize>,
) -> Option<usize> {
    let mut best: Option<(usize, u64, u64)> = None;
    for i in candidates {
        let verdict = &verdicts[i].verdict;
        let (r, q) = (verdict.remaining, quota_of(&algorithms[i], verdict).max(1));
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
