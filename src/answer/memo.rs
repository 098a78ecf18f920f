//! The last rate-limit denial each thread answered, kept beside everything
//! its bytes were made of, so that the next denial made of the same — a
//! client flooding one key gets the same 429 until its next refill — is a
//! copy of it rather than written again (its problem body and fields were
//! ~1,300 instructions of a denial's ~12,600, `bench/instructions.sh`).
//!
//! Exact by construction: the key holds every input the 429
//! (`ratelimit`'s `deny_response_into`) reads for the denials kept here (each
//! limit's name, flags, styles and numbers, the denying one's status and
//! quota, the policy, `Retry-After`), compared by
//! value, never by address, so a reload, an override or another gateway in
//! the same process cannot be answered with a stale copy. Only the common
//! denial is kept: a request-counting stack, a limit the request may yet
//! pass, no slot refusal (the others' bodies also name the request's cost
//! or priority); the others are written each time.
//!
//! A flood of many keys whose refills fall in different seconds misses:
//! keeping each miss's answer (its key and a copy of its fields) cost
//! ~350 instructions more than writing it alone. A run of misses keeps
//! one answer in [`KEEP_EVERY`], so such a flood pays the comparison and
//! an eighth of that, while a flood of one key keeps the first answer
//! of each second.

use std::cell::RefCell;

use bytes::Bytes;

use crate::config::HeaderStyles;
use crate::config::tokens::Unit;
use crate::http::field_lines::FieldLines;
use crate::limit::{EntryVerdict, NANOS_PER_SEC, Outcome, quota_of};
use crate::ratelimit_policy::{StackView, is_concurrency, styles};

/// Stacks of more limits than this are not kept (their key would not fit).
const MOST_LIMITS: usize = 4;

/// In a run of misses, the answer kept: the first, then one in this many.
const KEEP_EVERY: u32 = 8;

/// What one limit of the stack puts into a denial's bytes, but its name.
#[derive(Clone, Copy, PartialEq, Eq)]
struct LimitInputs {
    shadow: bool,
    skipped: bool,
    styles: HeaderStyles,
    concurrency: bool,
    remaining: u64,
    /// `t`, in the whole seconds the fields say.
    reset_secs: u64,
}

impl LimitInputs {
    #[inline(always)]
    fn of(view: StackView<'_>, index: usize, entry: &EntryVerdict) -> LimitInputs {
        let limit = view.limits[index];
        LimitInputs {
            shadow: limit.shadow,
            skipped: entry.outcome == Outcome::Skipped,
            styles: styles(limit, view.server),
            concurrency: is_concurrency(limit),
            remaining: entry.verdict.remaining,
            // As the 429's `ceil_secs` (not imported: that module uses this
            // module).
            reset_secs: entry.verdict.reset_after.div_ceil(NANOS_PER_SEC),
        }
    }
}

/// A denial's inputs, as kept: the stack's limits (their names end to end
/// in `names`, each ending at its `name_ends`), which one denied, its
/// status and quota, `Retry-After` and the policy.
#[derive(Default)]
struct Key {
    count: usize,
    limits: [Option<LimitInputs>; MOST_LIMITS],
    name_ends: [usize; MOST_LIMITS],
    names: String,
    denied_by: usize,
    status: u16,
    quota: u64,
    retry_after: u64,
    policy: Option<String>,
}

/// A denial about to be answered: what its bytes are made of.
pub(super) struct Denial<'a> {
    pub(super) view: StackView<'a>,
    pub(super) verdicts: &'a [EntryVerdict],
    pub(super) denied_by: usize,
    pub(super) policy: Option<&'a str>,
    pub(super) retry_after: u64,
}

impl Denial<'_> {
    /// The denying limit's quota, as its fields say it.
    #[inline(always)]
    fn quota(&self) -> u64 {
        quota_of(
            &self.view.algorithms[self.denied_by],
            &self.verdicts[self.denied_by].verdict,
        )
    }
}

impl Key {
    /// Whether `denial` is made of what this key holds.
    #[inline(always)]
    fn matches(&self, denial: &Denial<'_>) -> bool {
        let view = denial.view;
        if self.count != view.limits.len()
            || self.retry_after != denial.retry_after
            || self.denied_by != denial.denied_by
            || self.status != view.limits[denial.denied_by].status.as_u16()
            || self.quota != denial.quota()
        {
            return false;
        }
        let mut start = 0;
        for (index, (limit, entry)) in view.limits.iter().zip(denial.verdicts).enumerate() {
            let end = self.name_ends[index];
            if self.limits[index] != Some(LimitInputs::of(view, index, entry))
                || self.names.as_bytes()[start..end] != *limit.name.as_bytes()
            {
                return false;
            }
            start = end;
        }
        self.policy.as_deref() == denial.policy
    }

    /// Makes this key hold `denial`'s inputs (its buffers reused).
    fn hold(&mut self, denial: &Denial<'_>) {
        let view = denial.view;
        self.count = view.limits.len();
        self.retry_after = denial.retry_after;
        self.denied_by = denial.denied_by;
        self.status = view.limits[denial.denied_by].status.as_u16();
        self.quota = denial.quota();
        self.names.clear();
        for (index, (limit, entry)) in view.limits.iter().zip(denial.verdicts).enumerate() {
            self.limits[index] = Some(LimitInputs::of(view, index, entry));
            self.names.push_str(&limit.name);
            self.name_ends[index] = self.names.len();
        }
        match (&mut self.policy, denial.policy) {
            (Some(kept), Some(policy)) => {
                kept.clear();
                kept.push_str(policy);
            }
            (kept, policy) => *kept = policy.map(str::to_owned),
        }
    }
}

/// A thread's last kept denial: its key, body and fields, and the misses
/// since the last denial that was its copy.
#[derive(Default)]
struct Last {
    key: Key,
    answer: Option<(Bytes, FieldLines)>,
    misses: u32,
}

thread_local! {
    static LAST: RefCell<Last> = RefCell::new(Last::default());
}

/// Whether a denial is one kept here: its body then depends on the
/// denying limit's status and name and on `Retry-After` alone.
#[inline(always)]
pub(super) fn keeps(
    view: StackView<'_>,
    verdicts: &[EntryVerdict],
    denied_by: usize,
    shed: bool,
) -> bool {
    !shed
        && !verdicts[denied_by].verdict.never
        && view.limits.len() <= MOST_LIMITS
        && view.limits.iter().all(|limit| limit.unit == Unit::Requests)
}

/// The thread's last answer, when `denial` is made of the same inputs.
#[inline(always)]
pub(super) fn recall(denial: &Denial<'_>, out: &mut FieldLines) -> Option<Bytes> {
    LAST.try_with(|last| {
        let mut last = last.try_borrow_mut().ok()?;
        let last = &mut *last;
        match &last.answer {
            Some((body, fields)) if last.key.matches(denial) => {
                last.misses = 0;
                out.clone_from(fields);
                Some(body.clone())
            }
            _ => {
                last.misses = last.misses.wrapping_add(1);
                None
            }
        }
    })
    .ok()
    .flatten()
}

/// Keeps `answer` as the thread's last, made of `denial`'s inputs, when
/// it is the first miss of a run or one in [`KEEP_EVERY`] after it.
pub(super) fn keep(denial: &Denial<'_>, body: &Bytes, fields: &FieldLines) {
    let _ = LAST.try_with(|last| {
        if let Ok(mut last) = last.try_borrow_mut()
            && last.misses % KEEP_EVERY == 1
        {
            last.key.hold(denial);
            last.answer = Some((body.clone(), fields.clone()));
        }
    });
}

/// Forgets the thread's last denial: the next is written afresh.
#[cfg(test)]
pub(super) fn forget() {
    LAST.with(|last| *last.borrow_mut() = Last::default());
}
