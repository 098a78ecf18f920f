//! Which URL of an upstream's list a request goes to (`balance`), among
//! those that take requests ([`UrlHealth::is_available`]).
//!
//! - `round_robin`: each URL in turn, skipping those that are out.
//! - `least_request`: the power of two choices — two different URLs drawn
//!   at random, the one with fewer requests in flight wins (weighted by
//!   its share, below). Nearly as good as asking every URL and without a
//!   herd: all gateways do not pile onto the same least-loaded URL.
//!
//! A request may also name URLs to leave out: `exclude` (it could not
//! connect there, in this attempt: never again) and `avoid` (it already
//! went there: another is preferred, but a request is not refused for
//! want of one — a retry of a single-URL upstream goes to the same URL).
//!
//! **Slow start.** A URL that comes back takes a share rising linearly from
//! 10 % to all of it over `slow_start` ([`UrlHealth::weight`]), so a cold
//! instance is not handed its whole share at once. Round robin skips it
//! with the probability of the share it has not regained; least-request
//! divides its load by its share.

use std::sync::Arc;
use std::time::Duration;

use super::health::{LazyNow, UrlHealth};

/// Some URLs of a list, by index. Bit `i % 64` stands for URL `i`: in a
/// list longer than 64 URLs some share a bit, which only makes `avoid` and
/// `exclude` cover a little more than asked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct UrlSet(u64);

impl UrlSet {
    pub(crate) fn insert(&mut self, url: usize) {
        self.0 |= 1 << (url % 64);
    }

    pub(crate) fn contains(self, url: usize) -> bool {
        self.0 & (1 << (url % 64)) != 0
    }
}

/// What a choice is made among.
pub(crate) struct Choice<'a> {
    pub(crate) urls: &'a [Arc<UrlHealth>],
    pub(crate) exclude: UrlSet,
    pub(crate) avoid: UrlSet,
    pub(crate) slow_start: Option<Duration>,
}

/// A uniform draw in `[0, n]` (injected, so tests can fix it).
pub(crate) type Draw<'d> = &'d mut dyn FnMut(u64) -> u64;

impl Choice<'_> {
    /// Round robin from `start`: the first URL that is available, not
    /// excluded, not avoided, and not skipped for its slow start; failing
    /// that, the first one skipped for its slow start, then the first
    /// avoided one.
    pub(crate) fn round_robin(
        &self,
        start: usize,
        now: &mut LazyNow,
        draw: Draw<'_>,
    ) -> Option<usize> {
        let n = self.urls.len();
        let (mut ramping, mut avoided) = (None, None);
        for k in 0..n {
            let i = (start + k) % n;
            if self.exclude.contains(i) || !self.urls[i].is_available(now) {
                continue;
            }
            if self.avoid.contains(i) {
                avoided.get_or_insert(i);
                continue;
            }
            let weight = self.urls[i].weight(self.slow_start, now);
            if weight < 1000 && draw(999) >= weight {
                ramping.get_or_insert(i);
                continue;
            }
            return Some(i);
        }
        ramping.or(avoided)
    }

    /// The power of two choices on requests in flight, each divided by its
    /// share; when neither draw is usable, round robin from the first.
    pub(crate) fn least_request(&self, now: &mut LazyNow, draw: Draw<'_>) -> Option<usize> {
        let n = self.urls.len();
        if n < 2 {
            return self.round_robin(0, now, draw);
        }
        let a = draw(n as u64 - 1) as usize % n;
        let mut b = draw(n as u64 - 2) as usize % (n - 1);
        if b >= a {
            b += 1;
        }
        let usable = |i: usize, now: &mut LazyNow| {
            !self.exclude.contains(i) && !self.avoid.contains(i) && self.urls[i].is_available(now)
        };
        match (usable(a, now), usable(b, now)) {
            (true, true) => {
                // (in flight + 1) / weight, compared without dividing.
                let load = |i: usize| u64::from(self.urls[i].in_flight()) + 1;
                let (wa, wb) = (
                    self.urls[a].weight(self.slow_start, now),
                    self.urls[b].weight(self.slow_start, now),
                );
                Some(if load(b) * wa < load(a) * wb { b } else { a })
            }
            (true, false) => Some(a),
            (false, true) => Some(b),
            (false, false) => self.round_robin(a, now, draw),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EjectPolicy;
    use crate::upstream::health::{Failure, HealthSignals};

    fn urls(n: usize) -> Vec<Arc<UrlHealth>> {
        (0..n)
            .map(|i| {
                Arc::new(UrlHealth::new(
                    "api".into(),
                    format!("http://u{i}").into(),
                    None,
                    HealthSignals::none(),
                ))
            })
            .collect()
    }

    fn choice(urls: &[Arc<UrlHealth>]) -> Choice<'_> {
        Choice {
            urls,
            exclude: UrlSet::default(),
            avoid: UrlSet::default(),
            slow_start: None,
        }
    }

    const T: u64 = 1_000_000_000_000;

    #[test]
    fn round_robin_skips_ejected_excluded_and_prefers_not_avoided() {
        let list = urls(3);
        let mut c = choice(&list);
        let mut now = LazyNow::at(T);
        let mut draw = |_| 0;
        assert_eq!(c.round_robin(0, &mut now, &mut draw), Some(0));
        assert_eq!(c.round_robin(4, &mut now, &mut draw), Some(1));
        list[1].eject(Failure::Connect, &EjectPolicy::default(), T);
        assert_eq!(c.round_robin(1, &mut now, &mut draw), Some(2));
        c.exclude.insert(2);
        c.avoid.insert(0);
        // Only the avoided one is left: it is chosen rather than none.
        assert_eq!(c.round_robin(1, &mut now, &mut draw), Some(0));
        c.exclude.insert(0);
        assert_eq!(c.round_robin(1, &mut now, &mut draw), None);
    }

    #[test]
    fn least_request_takes_the_less_loaded_of_two_draws() {
        let list = urls(3);
        let c = choice(&list);
        let mut now = LazyNow::at(T);
        for _ in 0..5 {
            list[0].begin_request();
        }
        list[2].begin_request();
        // Draws 0 and (1 → shifted past 0) 2... first draw a=0, second b=1+1=2.
        let mut draws = [0u64, 1].into_iter();
        let mut draw = |_| draws.next().unwrap();
        assert_eq!(c.least_request(&mut now, &mut draw), Some(2));
        // a=2, b=1: URL 1 has none in flight.
        let mut draws = [2u64, 1].into_iter();
        let mut draw = |_| draws.next().unwrap();
        assert_eq!(c.least_request(&mut now, &mut draw), Some(1));
        // Over many draws the loaded URL gets the least.
        let mut rng = fastrand::Rng::with_seed(3);
        let mut counts = [0; 3];
        for _ in 0..3000 {
            let mut draw = |n: u64| rng.u64(0..=n);
            counts[c.least_request(&mut now, &mut draw).unwrap()] += 1;
        }
        assert!(counts[0] < counts[1] && counts[0] < counts[2], "{counts:?}");
    }

    #[test]
    fn a_url_in_slow_start_gets_its_share() {
        let list = urls(2);
        let mut c = choice(&list);
        c.slow_start = Some(std::time::Duration::from_secs(10));
        list[1].eject(Failure::Connect, &EjectPolicy::default(), T);
        // Back after its 10 s, then 5 s into its slow start: half a share.
        let back = T + 10_000_000_000;
        assert!(list[1].is_available(&mut LazyNow::at(back)));
        let mut now = LazyNow::at(back + 5_000_000_000);
        let mut rng = fastrand::Rng::with_seed(9);
        let mut to_back = 0;
        for turn in 0..4000 {
            let mut draw = |n: u64| rng.u64(0..=n);
            if c.round_robin(turn, &mut now, &mut draw) == Some(1) {
                to_back += 1;
            }
        }
        // Its turns are half the turns; it takes about half of them.
        assert!((800..1200).contains(&to_back), "{to_back} of 4000");
    }
}
