//! What a limit actually let through, measured on its admissions: the peak
//! in any span of its window, and the worst excess over `capacity + rate ×
//! span`; and the time series the chart draws.
//!
//! Both are per key (a limit limits each key) and both use the limit's
//! window and bucket forms ([`super::compare`]), so every algorithm is
//! measured by the same two rulers:
//!
//! * **peak in window**: the most cost units admitted for one key in any
//!   interval `(t − W, t]`, next to `L`. A fixed window reaches `2 × L`
//!   around a boundary; a sliding log never passes `L`.
//! * **excess**: the most, over all intervals `[s, t]` and keys, by which the
//!   units admitted exceed `C + r × (t − s)`. Zero for a token bucket; a
//!   fixed window of `L` per `W` reaches about `L`.
//!
//! The excess needs no log: with `A(t)` the units admitted up to `t`, the
//! excess of `[s, t]` is `(A(t) − r·t) − (A(s⁻) − r·s) − C`, so one running
//! minimum of `A(s⁻) − r·s` per key gives the worst interval ending at each
//! admission in O(1). The peak keeps the admissions of the last window in a
//! deque; the same deque is the exact sliding log that false allows and
//! denies are judged by ([`LimitTracker::judge`]). Everything is
//! exact integer arithmetic (scaled by the rate's `per`).

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;

use super::compare::{bucket_form, window_form};
use crate::limit::digest_hasher::DigestHasher;
use crate::limit::{Algorithm, LimitKey, NANOS_PER_SEC, Nanos};

/// The worst a limit did over the whole trace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Worst {
    /// Most units admitted for one key in one window span.
    pub(crate) peak: u64,
    /// That key's `L` and `W`.
    pub(crate) limit: u64,
    pub(crate) window: Nanos,
    /// Most units over `C + r × span` (0 if never over).
    pub(crate) excess: u64,
}

/// A decision next to the exact rule's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judgement {
    Right,
    FalseAllow,
    FalseDeny,
}

/// One key's admissions.
#[derive(Debug)]
struct KeyTrack {
    window: Nanos,
    limit: u64,
    capacity: u64,
    tokens: u64,
    per: Nanos,
    /// Times are measured from the key's first admission (keeps products small).
    origin: Nanos,
    recent: VecDeque<(Nanos, u64)>,
    in_window: u64,
    /// Units the limit denied although they fit, in the last window: the
    /// room they would have taken is spoken for, so one free unit is one
    /// false denial, not one per request that finds it.
    missed: VecDeque<(Nanos, u64)>,
    missed_in_window: u64,
    admitted: u128,
    /// min over earlier admissions s of `A(s⁻)·per − tokens·s`.
    lowest: i128,
}

impl KeyTrack {
    /// Drops the admissions that left the window `(t − W, t]`; returns `t`
    /// on the key's clock.
    fn evict(&mut self, now: Nanos) -> Nanos {
        let t = now.saturating_sub(self.origin);
        while let Some(&(at, units)) = self.recent.front() {
            if at.saturating_add(self.window) > t {
                break;
            }
            self.recent.pop_front();
            self.in_window = self.in_window.saturating_sub(units);
        }
        while let Some(&(at, units)) = self.missed.front() {
            if at.saturating_add(self.window) > t {
                break;
            }
            self.missed.pop_front();
            self.missed_in_window = self.missed_in_window.saturating_sub(units);
        }
        t
    }
}

/// One limit's admissions, per key.
#[derive(Debug, Default)]
pub(crate) struct LimitTracker {
    /// Keys are digests already: their bits are the hash (as in the store).
    keys: HashMap<LimitKey, KeyTrack, BuildHasherDefault<DigestHasher>>,
    pub(crate) worst: Worst,
}

impl LimitTracker {
    /// Records `cost` units admitted for `key` at `now` under `algorithm`;
    /// returns the key's units in the window ending now (for the chart).
    /// Concurrency is not measured (0).
    pub(crate) fn admit(
        &mut self,
        key: LimitKey,
        algorithm: &Algorithm,
        now: Nanos,
        cost: u64,
    ) -> u64 {
        let Some(track) = self.track(key, algorithm, now) else {
            return 0;
        };
        let t = track.evict(now);
        track.recent.push_back((t, cost));
        track.in_window = track.in_window.saturating_add(cost);
        // Excess: the worst interval ending at this admission.
        // Saturating: a rate of absurd numbers must not overflow (or panic).
        let per = i128::from(track.per);
        let drift = i128::from(track.tokens).saturating_mul(i128::from(t));
        let scaled = |units: u128| {
            i128::try_from(units)
                .unwrap_or(i128::MAX)
                .saturating_mul(per)
                .saturating_sub(drift)
        };
        let before = scaled(track.admitted);
        track.lowest = track.lowest.min(before);
        track.admitted = track.admitted.saturating_add(u128::from(cost));
        let after = scaled(track.admitted);
        let over = after
            .saturating_sub(track.lowest)
            .saturating_sub(i128::from(track.capacity).saturating_mul(per))
            .div_euclid(per.max(1));
        let (in_window, limit, window) = (track.in_window, track.limit, track.window);
        let worst = &mut self.worst;
        if worst.limit == 0 || in_window > worst.peak {
            worst.peak = in_window;
            worst.limit = limit;
            worst.window = window;
        }
        worst.excess = worst.excess.max(u64::try_from(over).unwrap_or(0));
        in_window
    }

    /// Judges one decision of the limit for `key` against an exact sliding
    /// log of its window form holding what the limit admitted so far: a
    /// false allow admits `cost` beyond `L` in the last `W`; a false deny
    /// refuses units that fit (beside earlier false denials' units, so one
    /// free unit is counted once). Call before [`LimitTracker::admit`].
    /// `None` for concurrency.
    pub(crate) fn judge(
        &mut self,
        key: LimitKey,
        algorithm: &Algorithm,
        now: Nanos,
        cost: u64,
        admitted: bool,
    ) -> Option<Judgement> {
        let track = self.track(key, algorithm, now)?;
        let t = track.evict(now);
        let used = track.in_window;
        Some(if admitted {
            if used.saturating_add(cost) > track.limit {
                Judgement::FalseAllow
            } else {
                Judgement::Right
            }
        } else if used
            .saturating_add(track.missed_in_window)
            .saturating_add(cost)
            <= track.limit
        {
            track.missed.push_back((t, cost));
            track.missed_in_window = track.missed_in_window.saturating_add(cost);
            Judgement::FalseDeny
        } else {
            Judgement::Right
        })
    }

    /// Distinct keys judged or admitted so far.
    pub(crate) fn keys(&self) -> usize {
        self.keys.len()
    }

    fn track(&mut self, key: LimitKey, algorithm: &Algorithm, now: Nanos) -> Option<&mut KeyTrack> {
        let (limit, window) = window_form(algorithm)?;
        let (capacity, rate) = bucket_form(algorithm)?;
        Some(self.keys.entry(key).or_insert_with(|| KeyTrack {
            window,
            limit,
            capacity,
            tokens: rate.tokens,
            per: rate.per,
            origin: now,
            recent: VecDeque::new(),
            in_window: 0,
            missed: VecDeque::new(),
            missed_in_window: 0,
            admitted: 0,
            lowest: i128::MAX,
        }))
    }
}

/// Most buckets a series holds before its buckets are made wider.
const MAX_BUCKETS: usize = 3600;

/// The widths the timeline's buckets take, finest first: each a multiple of
/// the one before, and of every divisor the chart's bucket widths need
/// (`svg`: 1, 2, 5 ms ... 15 s, 1 min, 3 h ... 7 d), so the chart's buckets
/// are whole groups of the timeline's and the merged counts are exact. Past
/// the last, ten times wider each time.
const WIDTHS: [Nanos; 9] = [
    1_000_000,
    10_000_000,
    100_000_000,
    NANOS_PER_SEC,
    10 * NANOS_PER_SEC,
    60 * NANOS_PER_SEC,
    600 * NANOS_PER_SEC,
    3600 * NANOS_PER_SEC,
    86_400 * NANOS_PER_SEC,
];

/// Per time bucket and variant: the busiest key's units in its window
/// (the most seen in the bucket) and the requests denied; with a modelled
/// upstream also the requests in flight and the chart limit's current
/// limit (each the most seen in the bucket). Buckets start at
/// the first record, 1 ms wide, and widen along `WIDTHS` whenever the
/// trace outgrows `MAX_BUCKETS` (3600), so a trace of any length fits in a
/// bounded series, fine enough for the chart, which merges them into its
/// own buckets ([`Timeline::merged`]).
#[derive(Debug)]
pub(crate) struct Timeline {
    pub(crate) start: Option<Nanos>,
    pub(crate) width: Nanos,
    pub(crate) busiest: Vec<Vec<u64>>,
    pub(crate) denied: Vec<Vec<u64>>,
    pub(crate) in_flight: Vec<Vec<u64>>,
    pub(crate) limit: Vec<Vec<u64>>,
}

impl Timeline {
    /// For `variants` series.
    pub(crate) fn new(variants: usize) -> Timeline {
        Timeline {
            start: None,
            width: WIDTHS[0],
            busiest: vec![Vec::new(); variants],
            denied: vec![Vec::new(); variants],
            in_flight: vec![Vec::new(); variants],
            limit: vec![Vec::new(); variants],
        }
    }

    fn bucket(&mut self, now: Nanos) -> usize {
        let start = *self.start.get_or_insert(now);
        loop {
            let index =
                usize::try_from(now.saturating_sub(start) / self.width).unwrap_or(usize::MAX);
            if index < MAX_BUCKETS {
                return index;
            }
            self.widen();
        }
    }

    /// The next width of [`WIDTHS`]: neighbours merged.
    fn widen(&mut self) {
        let next = WIDTHS
            .iter()
            .copied()
            .find(|&w| w > self.width)
            .unwrap_or_else(|| self.width.saturating_mul(10));
        let merged = self.merged(next);
        let flight = self.merged_flight(next);
        self.width = next;
        (self.busiest, self.denied) = merged;
        (self.in_flight, self.limit) = flight;
    }

    /// Buckets of [`Timeline::width`] per bucket `width` wide.
    fn group(&self, width: Nanos) -> usize {
        usize::try_from(width.div_ceil(self.width))
            .unwrap_or(usize::MAX)
            .max(1)
    }

    /// The in-flight and limit series in buckets `width` wide, as
    /// [`Timeline::merged`]: the most of the merged buckets.
    pub(crate) fn merged_flight(&self, width: Nanos) -> (Vec<Vec<u64>>, Vec<Vec<u64>>) {
        let group = self.group(width);
        let most = |series: &[Vec<u64>]| -> Vec<Vec<u64>> {
            series
                .iter()
                .map(|s| {
                    s.chunks(group)
                        .map(|c| c.iter().copied().max().unwrap_or(0))
                        .collect()
                })
                .collect()
        };
        (most(&self.in_flight), most(&self.limit))
    }

    /// The series in buckets `width` wide (a multiple of [`Timeline::width`];
    /// a width that is not is rounded up to one): for the busiest key the
    /// most of the merged buckets, for denials their sum.
    pub(crate) fn merged(&self, width: Nanos) -> (Vec<Vec<u64>>, Vec<Vec<u64>>) {
        let group = self.group(width);
        let merge = |series: &[Vec<u64>], combine: fn(u64, u64) -> u64| -> Vec<Vec<u64>> {
            series
                .iter()
                .map(|s| {
                    s.chunks(group)
                        .map(|c| c.iter().copied().fold(0, combine))
                        .collect()
                })
                .collect()
        };
        (
            merge(&self.busiest, u64::max),
            merge(&self.denied, u64::saturating_add),
        )
    }

    fn slot(series: &mut Vec<u64>, index: usize) -> &mut u64 {
        if series.len() <= index {
            series.resize(index + 1, 0);
        }
        &mut series[index]
    }

    pub(crate) fn admitted(&mut self, variant: usize, now: Nanos, in_window: u64) {
        let index = self.bucket(now);
        let slot = Timeline::slot(&mut self.busiest[variant], index);
        *slot = (*slot).max(in_window);
    }

    pub(crate) fn denied(&mut self, variant: usize, now: Nanos) {
        let index = self.bucket(now);
        *Timeline::slot(&mut self.denied[variant], index) += 1;
    }

    /// Requests in flight at the upstream at `now` and, if the chart's
    /// limit has one, its limit then.
    pub(crate) fn flight(
        &mut self,
        variant: usize,
        now: Nanos,
        in_flight: u64,
        limit: Option<u64>,
    ) {
        let index = self.bucket(now);
        let slot = Timeline::slot(&mut self.in_flight[variant], index);
        *slot = (*slot).max(in_flight);
        if let Some(limit) = limit {
            let slot = Timeline::slot(&mut self.limit[variant], index);
            *slot = (*slot).max(limit);
        }
    }

    /// Buckets used so far.
    pub(crate) fn len(&self) -> usize {
        self.busiest
            .iter()
            .chain(&self.denied)
            .chain(&self.in_flight)
            .map(Vec::len)
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The time the buckets used so far cover.
    pub(crate) fn extent(&self) -> Nanos {
        (self.len() as Nanos).saturating_mul(self.width)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{NANOS_PER_SEC as S, Rate};

    fn key() -> LimitKey {
        LimitKey::from_u128(7)
    }

    #[test]
    fn peak_counts_the_window_ending_at_each_admission() {
        let fixed = Algorithm::FixedWindow {
            limit: 10,
            window: 60 * S,
        };
        let mut tracker = LimitTracker::default();
        // 10 just before a boundary and 10 just after: 20 in one span.
        for i in 0..10 {
            tracker.admit(key(), &fixed, 59 * S + i * 10_000_000, 1);
        }
        for i in 0..10 {
            tracker.admit(key(), &fixed, 60 * S + i * 10_000_000, 1);
        }
        assert_eq!(tracker.worst.peak, 20);
        assert_eq!(tracker.worst.limit, 10);
        // Against a bucket of 10 refilled at 10/min, 20 in 1.09 s are
        // 9.8 over (floor 9).
        assert_eq!(tracker.worst.excess, 9);
        // A minute later the window has emptied.
        assert_eq!(tracker.admit(key(), &fixed, 200 * S, 1), 1);
    }

    #[test]
    fn a_free_unit_is_one_false_denial() {
        let log = Algorithm::SlidingLog {
            limit: 2,
            window: 10 * S,
        };
        let mut tracker = LimitTracker::default();
        let judge = |t: &mut LimitTracker, at, admitted| t.judge(key(), &log, at, 1, admitted);
        assert_eq!(judge(&mut tracker, 0, true), Some(Judgement::Right));
        tracker.admit(key(), &log, 0, 1);
        // One unit free: the first denial of it is false, the next is not.
        assert_eq!(judge(&mut tracker, S, false), Some(Judgement::FalseDeny));
        assert_eq!(judge(&mut tracker, S, false), Some(Judgement::Right));
        tracker.admit(key(), &log, S, 1);
        assert_eq!(
            judge(&mut tracker, 2 * S, true),
            Some(Judgement::FalseAllow)
        );
        // Once the window has passed, both units are free again.
        assert_eq!(
            judge(&mut tracker, 12 * S, false),
            Some(Judgement::FalseDeny)
        );
        // Numbers at the edge of u64 saturate instead of overflowing.
        let huge = Algorithm::TokenBucket {
            capacity: u64::MAX,
            refill: Rate {
                tokens: u64::MAX,
                per: 1,
            },
            wait: 0,
        };
        for at in [0, u64::MAX / 2, u64::MAX] {
            tracker.admit(LimitKey::from_u128(9), &huge, at, u64::MAX);
        }
        let conc = Algorithm::Concurrency { max: 1 };
        assert_eq!(tracker.judge(key(), &conc, 0, 1, true), None);
    }

    #[test]
    fn a_token_bucket_never_exceeds_its_own_bound() {
        let bucket = Algorithm::TokenBucket {
            capacity: 5,
            refill: Rate { tokens: 1, per: S },
            wait: 0,
        };
        let mut tracker = LimitTracker::default();
        // 5 at once, then one a second: exactly capacity + refill × span.
        for _ in 0..5 {
            tracker.admit(key(), &bucket, 0, 1);
        }
        for i in 1..=20 {
            tracker.admit(key(), &bucket, i * S, 1);
        }
        assert_eq!(tracker.worst.excess, 0);
        // One more in the same instant is one over.
        tracker.admit(key(), &bucket, 20 * S, 1);
        assert_eq!(tracker.worst.excess, 1);
        assert_eq!(tracker.worst.window, 5 * S);
    }

    #[test]
    fn timeline_widens_its_buckets_and_keeps_the_totals() {
        let mut timeline = Timeline::new(1);
        for i in 0..1000 {
            timeline.denied(0, i * S);
            timeline.admitted(0, i * S, i);
        }
        assert!(timeline.len() <= MAX_BUCKETS);
        // 1000 s in 1 s buckets: 1 ms, 10 ms and 100 ms were too narrow.
        assert_eq!(timeline.width, S);
        assert_eq!(timeline.len(), 1000);
        assert_eq!(timeline.denied[0].iter().sum::<u64>(), 1000);
        assert_eq!(timeline.busiest[0].iter().max(), Some(&999));
        // Merged into 15 s buckets: whole groups, the same totals.
        let (busiest, denied) = timeline.merged(15 * S);
        assert_eq!(denied[0].len(), 67);
        assert_eq!(denied[0][0], 15);
        assert_eq!(denied[0].iter().sum::<u64>(), 1000);
        assert_eq!(busiest[0][1], 29);
        assert_eq!(timeline.extent(), 1000 * S);
        // A day: 8640 ten-second buckets are too many, 1440 minutes fit.
        timeline.denied(0, 86_400 * S);
        assert_eq!(timeline.width, 60 * S);
        assert_eq!(timeline.denied[0].iter().sum::<u64>(), 1001);
    }
}
