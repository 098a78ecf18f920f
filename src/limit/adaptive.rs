//! `adaptive`: a concurrency limit that follows the upstream's capacity.
//!
//! A key keeps the requests in flight and a limit; a request is admitted
//! while `in_flight < limit` and its slot is released when its response ends
//! ([`Adaptive::on_complete`]). What this module owns is how the limit moves:
//! a pure function of the completions it is shown, their latencies and
//! outcomes, and the injected `now`. Nothing here reads the clock or sleeps.
//!
//! # How the limit moves
//!
//! Completions are gathered into *windows* of at least
//! [`WINDOW_SAMPLES`] successful requests that were all sent after the window
//! began, so a window spans at least one round trip and describes the limit in
//! force during it (a request admitted under an older limit is released but not
//! counted). When a window closes, its mean latency `avg` is compared with the
//! key's long-run `baseline`, `r = avg / baseline`:
//!
//! * `r > TOLERANCE` (1.25): requests are queueing at the upstream. The limit
//!   becomes `limit × max(½, 1/r)`, the concurrency at which the window would
//!   have seen the baseline latency (queueing latency grows with concurrency,
//!   so `limit × baseline/avg` is what the upstream serves without a queue).
//! * otherwise, if the window used the limit (its peak in flight ≥ half the
//!   limit), the limit grows by `√limit`; an app-limited window leaves it
//!   where it is, so a quiet key's limit stays within twice what it uses.
//!
//! Independently, an overload outcome (503, 504, 429, an upstream timeout)
//! multiplies the limit by [`BACKOFF`] (0.8) at once — at most once per round
//! trip: it starts a new window, and an overload of a request sent before that
//! window began does not back off again (as TCP halves once per window of
//! loss, not once per lost packet). An [`Outcome::Ignored`] completion (a
//! client error, a cancelled request) only releases its slot.
//!
//! The baseline follows window means down quickly ([`BASELINE_DOWN`], ¼ of
//! the gap) and up slowly ([`BASELINE_UP`], 1/32), and up only from windows
//! that cannot be queueing caused by this limit: app-limited ones, or ones
//! where the limit already sits at `min` (nothing left to shed, so the latency
//! is the upstream's own). Under a sustained overload the baseline therefore
//! does not creep up with the queue it measures; the dips of the sawtooth
//! (each decrease lands at the queue-free concurrency) keep pulling it back
//! down.
//!
//! The limit is an `f64` estimate, clamped into `[min, max]` after every
//! update (a NaN, which finite integer inputs cannot produce, would land on
//! `min`); [`Adaptive::limit`] is its integer part.
//!
//! # What was taken, and what was avoided
//!
//! * **Netflix concurrency-limits, `Gradient2Limit`**: the gradient between
//!   current latency and a long-run baseline (not the minimum: its doc warns
//!   that the minimum biases towards an impractically low baseline and
//!   excessive shedding), a gradient clamped at ½ so one outlier cannot more
//!   than halve the limit, and "don't grow the limit if we are app limited"
//!   (`inflight < limit / 2`). Avoided: updating on every sample with a fixed
//!   additive queue (per sample, a round of `L` queueing samples multiplies the
//!   limit by `0.95^L`), and a baseline that keeps averaging in queueing
//!   latency, which the class doc itself says "grows … but lags" under load:
//!   with no drop signal, the limit then drifts upward with its own queue.
//! * **`ExpAvgMeasurement`**: the exponentially smoothed baseline; here
//!   asymmetric (fast down, slow and conditional up) for the reason above.
//! * **`AIMDLimit`**: the multiplicative decrease on a drop, and growth only
//!   while `inflight × 2 ≥ limit`. Its per-drop backoff is rate-limited here to
//!   once per round trip, so a burst of fifty 503s is one decrease, not
//!   `0.9^50`.
//! * **Envoy `adaptive_concurrency` (`gradient_controller.cc`)**: per-window
//!   updates (its `concurrency_update_interval`), the gradient
//!   `buffered_minRTT / sampleRTT` aiming at the queue-free concurrency, a
//!   tolerance above the baseline (its `buffer`, 25 %), and `√limit` of
//!   headroom as the growth step. Avoided: measuring minRTT by pinning the
//!   limit to `min_concurrency` every interval. That probe refuses requests an
//!   upstream with spare capacity would have served (envoyproxy/envoy#18152:
//!   503s while the gradient is 1; #8337: "leading to a drop in success
//!   rate"). Here the baseline is learned from the traffic as it comes, so an
//!   upstream kept below its capacity never sees a refusal caused by the
//!   limiter's own measurement.
//!
//! # Worked example
//!
//! `min = 1`, `max = 1000`, `initial = 20`; an upstream with 40 slots and a
//! 10 ms service time, more demand than that. While `limit ≤ 40` windows see
//! 10 ms (`r = 1`): the limit grows 20 → 24 → 29 → 34 → 40 → 47 → 53. At 53
//! in flight, 13 queue: a window sees ~13 ms, `r = 1.3 > 1.25`, and the limit
//! becomes `53.9 × 10/13 ≈ 41`. It then saws between about 40 and 50, keeping
//! the 40 slots busy with a short queue. A 503 at 41 makes it 33 at once.
//!
//! State: 56 bytes per key; [`Params`] live in the configuration.

use super::Nanos;

/// The ratio of a window's mean latency to the baseline above which requests
/// are taken to be queueing (Envoy's default `buffer` is the same 25 %). It is
/// also the queue the limit allows at the upstream: enough to keep every slot
/// busy between one response and the next request, and a margin for noise.
pub const TOLERANCE: f64 = 1.25;

/// The multiplier of the limit on an overload outcome (503, 504, 429,
/// timeout): between `AIMDLimit`'s gentle 0.9 and TCP's 0.5, since the
/// upstream saying "full" is a stronger signal than one slow window.
pub const BACKOFF: f64 = 0.8;

/// The most a window's gradient may cut the limit (as Gradient2 and Envoy):
/// one window of outliers at most halves it.
pub const MIN_GRADIENT: f64 = 0.5;

/// Successful samples a window needs before it may move the limit.
pub const WINDOW_SAMPLES: u32 = 10;

/// How far a window below the baseline pulls it down (of the gap).
pub const BASELINE_DOWN: f64 = 0.25;

/// How far an eligible window above the baseline pulls it up (of the gap).
pub const BASELINE_UP: f64 = 1.0 / 32.0;

/// The largest `max` accepted: in-flight counts are `u32`.
pub const MAX_LIMIT: u32 = 1_000_000;

/// A limit's numbers (`min`, `max`, `initial` in `gateway.toml`), validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    min: u32,
    max: u32,
    initial: u32,
}

/// Why a set of [`Params`] was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamsError {
    /// `min` was 0: a limit of 0 would refuse everything forever, since no
    /// completion could ever raise it.
    MinZero,
    /// `min` above `max`.
    MinAboveMax { min: u32, max: u32 },
    /// `max` above [`MAX_LIMIT`].
    MaxTooLarge(u32),
    /// `initial` outside `[min, max]`.
    InitialOutside { initial: u32, min: u32, max: u32 },
}

impl std::fmt::Display for ParamsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ParamsError::MinZero => write!(f, "min must be at least 1"),
            ParamsError::MinAboveMax { min, max } => {
                write!(f, "min ({min}) must not exceed max ({max})")
            }
            ParamsError::MaxTooLarge(max) => {
                write!(f, "max ({max}) must not exceed {MAX_LIMIT}")
            }
            ParamsError::InitialOutside { initial, min, max } => {
                write!(
                    f,
                    "initial ({initial}) must lie within min ({min}) and max ({max})"
                )
            }
        }
    }
}

impl std::error::Error for ParamsError {}

impl Params {
    /// Validate `min ≤ initial ≤ max`, `1 ≤ min`, `max ≤ MAX_LIMIT`.
    pub fn new(min: u32, max: u32, initial: u32) -> Result<Params, ParamsError> {
        if min == 0 {
            return Err(ParamsError::MinZero);
        }
        if min > max {
            return Err(ParamsError::MinAboveMax { min, max });
        }
        if max > MAX_LIMIT {
            return Err(ParamsError::MaxTooLarge(max));
        }
        if !(min..=max).contains(&initial) {
            return Err(ParamsError::InitialOutside { initial, min, max });
        }
        Ok(Params { min, max, initial })
    }

    pub fn min(self) -> u32 {
        self.min
    }

    pub fn max(self) -> u32 {
        self.max
    }

    pub fn initial(self) -> u32 {
        self.initial
    }

    /// `x` within `[min, max]`; NaN lands on `min` (the safe side).
    fn bound(self, x: f64) -> f64 {
        if x.is_nan() {
            f64::from(self.min)
        } else {
            x.clamp(f64::from(self.min), f64::from(self.max))
        }
    }
}

/// How a completed request ended, as far as the limit is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream answered; its latency is a sample of its load.
    Success,
    /// The upstream said it is full or could not answer in time (503, 504,
    /// 429, an upstream timeout): multiplicative decrease.
    Overload,
    /// Says nothing about the upstream's load (a client error, a request the
    /// client cancelled): the slot is released and the limit does not move.
    Ignored,
}

/// One key's adaptive limit: in flight, the limit, the baseline and the
/// window being gathered.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptive {
    /// The limit, within `[min, max]`; admission uses its integer part.
    estimate: f64,
    /// Long-run latency (ns) of an unqueued request; 0 until the first window.
    baseline: f64,
    /// Mean latency (ns) of the last closed window, for the admin view.
    recent: Nanos,
    /// When the current window began; samples sent earlier are not counted.
    window_start: Nanos,
    /// Sum of the window's successful latencies (ns, saturating).
    window_sum: Nanos,
    window_samples: u32,
    /// The most requests in flight at once during the window.
    window_peak: u32,
    in_flight: u32,
}

impl Adaptive {
    /// A fresh key at `params.initial`, its first window beginning at `now`.
    pub fn new(params: Params, now: Nanos) -> Adaptive {
        Adaptive {
            estimate: f64::from(params.initial),
            baseline: 0.0,
            recent: 0,
            window_start: now,
            window_sum: 0,
            window_samples: 0,
            window_peak: 0,
            in_flight: 0,
        }
    }

    /// The current limit: requests are admitted while fewer are in flight.
    pub fn limit(&self) -> u32 {
        // The estimate is kept within [min, max] ⊂ [1, MAX_LIMIT]: the cast
        // neither saturates nor sees a NaN.
        self.estimate as u32
    }

    /// Requests admitted and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The learned unqueued latency, once a window has closed.
    pub fn baseline(&self) -> Option<Nanos> {
        (self.baseline > 0.0).then_some(self.baseline as Nanos)
    }

    /// The mean latency of the last closed window, once one has.
    pub fn recent(&self) -> Option<Nanos> {
        (self.recent > 0).then_some(self.recent)
    }

    /// Take a slot if one is free. A caller that decides itself (a stack,
    /// priorities reserving part of the limit) reads [`Self::limit`] and
    /// [`Self::in_flight`] and then calls [`Self::acquire`].
    pub fn try_acquire(&mut self) -> bool {
        let free = self.in_flight < self.limit();
        if free {
            self.acquire();
        }
        free
    }

    /// Take a slot unconditionally (the caller has decided it fits).
    pub fn acquire(&mut self) {
        self.in_flight = self.in_flight.saturating_add(1);
        self.window_peak = self.window_peak.max(self.in_flight);
    }

    /// Release the slot of a request that took `latency` and ended in
    /// `outcome` at `now`, and let the limit learn from it.
    pub fn on_complete(&mut self, params: Params, now: Nanos, latency: Nanos, outcome: Outcome) {
        self.in_flight = self.in_flight.saturating_sub(1);
        // Sent before the window began: it describes an older limit.
        let fresh = now.saturating_sub(latency) >= self.window_start;
        match outcome {
            Outcome::Ignored => {}
            Outcome::Overload if fresh => {
                self.estimate = params.bound(self.estimate * BACKOFF);
                self.start_window(now);
            }
            Outcome::Overload => {}
            Outcome::Success if fresh => {
                self.window_sum = self.window_sum.saturating_add(latency);
                self.window_samples += 1;
                if self.window_samples >= WINDOW_SAMPLES {
                    self.close_window(params, now);
                }
            }
            Outcome::Success => {}
        }
    }

    /// Re-bound the limit under new numbers (a reload): the learned limit
    /// and baseline are kept, only clamped.
    pub fn rescale(&mut self, params: Params) {
        self.estimate = params.bound(self.estimate);
    }

    /// Nothing in flight and the limit back at `initial`: the key holds
    /// nothing a fresh one would not, and can be forgotten.
    pub fn is_fresh(&self, params: Params) -> bool {
        self.in_flight == 0 && self.limit() == params.initial
    }

    fn start_window(&mut self, now: Nanos) {
        self.window_start = now;
        self.window_sum = 0;
        self.window_samples = 0;
        self.window_peak = self.in_flight;
    }

    fn close_window(&mut self, params: Params, now: Nanos) {
        // At least 1 ns: a zero latency (a coarse clock) must not divide by 0.
        let avg = (self.window_sum as f64 / f64::from(self.window_samples)).max(1.0);
        if self.baseline <= 0.0 {
            self.baseline = avg;
        }
        let ratio = avg / self.baseline;
        let used = f64::from(self.window_peak) * 2.0 >= self.estimate;
        let at_min = self.limit() <= params.min;
        if ratio > TOLERANCE {
            self.estimate *= (1.0 / ratio).max(MIN_GRADIENT);
        } else if used {
            self.estimate += self.estimate.sqrt().max(1.0);
        }
        self.estimate = params.bound(self.estimate);
        if avg < self.baseline {
            self.baseline += (avg - self.baseline) * BASELINE_DOWN;
        } else if !used || at_min {
            self.baseline += (avg - self.baseline) * BASELINE_UP;
        }
        self.recent = avg as Nanos;
        self.start_window(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn params() -> Params {
        Params::new(1, 1000, 20).unwrap()
    }

    /// Run one window of `WINDOW_SAMPLES` successes at `latency`, with
    /// `load` in flight, starting at `now`; returns the time after it.
    fn window(a: &mut Adaptive, p: Params, now: Nanos, load: u32, latency: Nanos) -> Nanos {
        for _ in 0..load {
            a.acquire();
        }
        let end = now + latency;
        for _ in 0..WINDOW_SAMPLES {
            a.on_complete(p, end, latency, Outcome::Success);
            a.acquire();
        }
        for _ in 0..load {
            a.on_complete(p, end, latency, Outcome::Ignored);
        }
        end
    }

    #[test]
    fn params_are_validated() {
        assert_eq!(Params::new(0, 10, 5), Err(ParamsError::MinZero));
        assert_eq!(
            Params::new(5, 4, 5),
            Err(ParamsError::MinAboveMax { min: 5, max: 4 })
        );
        assert_eq!(
            Params::new(1, MAX_LIMIT + 1, 5),
            Err(ParamsError::MaxTooLarge(MAX_LIMIT + 1))
        );
        assert!(matches!(
            Params::new(2, 10, 11),
            Err(ParamsError::InitialOutside { .. })
        ));
        assert_eq!(
            Params::new(2, 10, 11).unwrap_err().to_string(),
            "initial (11) must lie within min (2) and max (10)"
        );
    }

    #[test]
    fn worked_example_growth_then_cut() {
        let p = params();
        let mut a = Adaptive::new(p, 0);
        let mut now = 0;
        let mut seen = vec![a.limit()];
        for _ in 0..6 {
            let load = a.limit();
            now = window(&mut a, p, now, load, 10 * MS);
            seen.push(a.limit());
        }
        assert_eq!(seen, [20, 24, 29, 34, 40, 47, 53]);
        assert_eq!(a.baseline(), Some(10 * MS));
        // 53 in flight on 40 slots: a window sees ~13 ms and cuts to ≈ 41.
        now = window(&mut a, p, now, 53, 13 * MS);
        assert_eq!(a.limit(), 41);
        // A 503 from a request sent in this window: × 0.8, once.
        a.acquire();
        a.acquire();
        a.on_complete(p, now + 5 * MS, MS, Outcome::Overload);
        assert_eq!(a.limit(), 33);
        // The second was sent before the backoff began a new window: no
        // second decrease.
        a.on_complete(p, now + 6 * MS, 5 * MS, Outcome::Overload);
        assert_eq!(a.limit(), 33);
        assert_eq!(a.in_flight(), 0);
    }

    #[test]
    fn ignored_and_stale_samples_do_not_move_it() {
        let p = params();
        let mut a = Adaptive::new(p, 100 * MS);
        for _ in 0..100 {
            a.acquire();
            a.on_complete(p, 200 * MS, 500 * MS, Outcome::Success); // sent before
            a.acquire();
            a.on_complete(p, 200 * MS, MS, Outcome::Ignored);
        }
        assert_eq!(a.limit(), 20);
        assert_eq!(a.baseline(), None);
        assert!(a.is_fresh(p));
    }

    #[test]
    fn rescale_keeps_the_learned_limit_within_new_bounds() {
        let p = params();
        let mut a = Adaptive::new(p, 0);
        window(&mut a, p, 0, 20, MS);
        assert_eq!(a.limit(), 24);
        a.rescale(Params::new(1, 1000, 5).unwrap());
        assert_eq!(a.limit(), 24);
        a.rescale(Params::new(1, 10, 5).unwrap());
        assert_eq!(a.limit(), 10);
    }

    #[test]
    fn zero_latencies_are_harmless() {
        let p = params();
        let mut a = Adaptive::new(p, 0);
        for _ in 0..10 {
            let load = a.limit();
            window(&mut a, p, 0, load, 0);
        }
        assert!((p.min()..=p.max()).contains(&a.limit()));
    }
}
