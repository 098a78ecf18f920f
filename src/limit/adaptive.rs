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
//! Completions are gathered into *windows*: a window closes on a success once
//! it holds at least `max(WINDOW_SAMPLES, limit)` successes (a round of the
//! limit: the window spans about one round trip at any load, and its mean
//! gets steadier as the limit grows) and has lasted at least one unqueued
//! round trip (the baseline). Its mean latency `avg` and standard error `se`
//! are compared with the key's long-run `baseline`, `r = avg / baseline`:
//!
//! * `r > TOLERANCE` (1.25) **and** `avg − CONFIDENCE × se > baseline`
//!   (3 standard errors): requests are queueing at the upstream. Both are
//!   needed because one upstream's latencies are noisy by nature: with
//!   exponential service times the mean of 10 samples is ±30 % by chance,
//!   and a test on `r` alone cut the limit on noise until it sat at `min`.
//!   The limit becomes `limit × max(½, DRAIN / r′)`, where
//!   `r′ = max(1, (avg − se) / baseline)` is the ratio discounted by one
//!   standard error (the window that passed the test is likely a high
//!   draw): `limit / r′` is about the concurrency at which the window would
//!   have seen the baseline, and [`DRAIN`] (0.85) lands a little below it so
//!   the upstream's queue empties. Requests sent before a cut complete
//!   afterwards without counting: they describe the limit just paid for.
//! * otherwise, if `r ≤ TOLERANCE` and the window used the limit (the most
//!   in flight at an admission ≥ half the limit), the limit grows by
//!   `½ √limit`; an app-limited window leaves it where it is.
//!
//! The window that begins when the limit moves is a *settling* window: it
//! holds the requests sent since that completed first — the short ones —
//! so it may show queueing (and cut) but neither grows the limit nor
//! teaches the baseline. Without this, growing every window biased the
//! windows towards short latencies and the limit grew into a queue.
//!
//! Independently, an overload outcome (503, 504, 429, an upstream timeout)
//! multiplies the limit by [`BACKOFF`] (0.8) at once — at most once per round
//! trip, since an overload of a request sent before the last cut does not cut
//! again (as TCP reduces once per window of loss, not once per lost packet).
//! An [`Outcome::Ignored`] completion (a client error, a cancelled request)
//! only releases its slot.
//!
//! ## The baseline
//!
//! The baseline is the mean latency of windows known to be unqueued, as a
//! sample-weighted average of about [`BASELINE_SAMPLES`] requests (a window
//! of `n` moves it `n / 64` of the gap, at most half), symmetric: up as fast
//! as down, so it is neither the luckiest windows' latency (the old
//! fast-down tracker sat near the low windows of a noisy upstream and took
//! most windows for queued) nor the queue's. *Known unqueued* is decided by
//! concurrency, not by latency (selecting windows by their latency biases
//! the average): a window counts if its peak in flight is at most the limit
//! the last cut landed on (`initial` before the first cut), where the queue
//! had been drained, whatever its latency (a window there that shows
//! queueing means the baseline is too low, and teaches it). At `min` every window counts (nothing is left to shed, so the
//! latency is the upstream's own). The first [`BOOTSTRAP_SAMPLES`] (20)
//! answers bootstrap it.
//!
//! Under a sustained overload the limit saw-tooths between the drained level
//! and the first level whose windows show queueing with confidence; the
//! baseline learns only at the drained level, so it does not creep up with
//! the queue it measures, and a baseline that starts too high (a start far
//! above capacity) is pulled down by each drain (the drained level is 0.85 ×
//! what the high baseline allowed). The price: an upstream that becomes
//! slower for good while fully loaded is first taken for an overloaded one,
//! and the limit falls until windows at the drained level (or at `min`)
//! teach the baseline the new latency; a start 10× above capacity takes
//! about 5 s of cuts to forget its first, queued windows.
//!
//! The limit is an `f64` estimate, clamped into `[min, max]` after every
//! update (a NaN, which finite integer inputs cannot produce, would land on
//! `min`); [`Adaptive::limit`] is its integer part.
//!
//! # What was taken, and what was avoided
//!
//! * **Netflix concurrency-limits, `Gradient2Limit`**: the gradient between
//!   current latency and a long-run baseline (not a windowed minimum: its doc
//!   warns that the minimum biases towards an impractically low baseline and
//!   excessive shedding — exactly what a fast-down baseline did here), a
//!   gradient clamped at ½ so one bad window at most halves the limit, and
//!   "don't grow the limit if we are app limited" (`inflight < limit / 2`).
//!   Avoided: updating on every sample (a round of `L` queueing samples
//!   multiplies the limit by about `0.95^L`), and a long-run average that
//!   takes in every sample, which its class doc says "grows … but lags"
//!   under load: with no drop signal the limit then drifts upward with its
//!   own queue. Here the average takes in drained windows only.
//! * **`VegasLimit`**: the queue estimate `limit × (1 − baseline / avg)`,
//!   here as the cut to `limit / r′`. Avoided: its per-sample additive
//!   steps, which on a noisy upstream follow the noise.
//! * **`ExpAvgMeasurement`**: the exponentially smoothed baseline, weighted
//!   by samples.
//! * **`AIMDLimit`**: the multiplicative decrease on a drop, and growth only
//!   while `inflight × 2 ≥ limit`. Its per-drop backoff is limited here to
//!   once per round trip, so a burst of fifty 503s is one decrease, not
//!   `0.9^50`.
//! * **Envoy `adaptive_concurrency` (`gradient_controller.cc`)**: per-window
//!   updates (its `concurrency_update_interval`), a gradient
//!   `baseline / sample` aiming at the queue-free concurrency, a tolerance
//!   above the baseline (its `buffer`, 25 %), and `√limit` as the scale of
//!   the growth step (its burst headroom). Avoided: measuring minRTT by
//!   pinning the limit to `min_concurrency` every interval. That probe
//!   refuses requests an upstream with spare capacity would have served
//!   (envoyproxy/envoy#18152: 503s while the gradient is 1; #8337: "leading
//!   to a drop in success rate"). Here the baseline is learned from traffic
//!   as it comes, and the limit only falls after a window showed queueing
//!   beyond its noise or the upstream said it is full, so an upstream kept
//!   below its capacity never sees a refusal caused by the limiter's own
//!   measurement.
//!
//! # Worked example
//!
//! `min = 1`, `max = 1000`, `initial = 20`; an upstream with 40 slots and a
//! 10 ms service time, more demand than that. The first 20 answers set the
//! baseline to 10 ms. While `limit ≤ 40` windows see 10 ms (`r = 1`) and the
//! limit grows every other window (a settling window between):
//! 20 → 22 → 24 → 27 → … → 47 → 51. At 51 in flight 11 queue: a window sees
//! 12.5 ms, `r = 1.25`, still tolerated, so it grows to 54; there a window
//! sees 13.5 ms (`se = 0`: the service time is exact), `r = 1.35`, and the
//! limit is cut to `54.9 × 0.85 / 1.35 ≈ 34`, the queue drains, and it climbs
//! again: a sawtooth between about 0.8× and 1.4× the 40 slots that keeps the
//! upstream busy with a short queue. A 503 then makes 34 into 27 at once.
//! With exponential service times the same upstream shows `se ≈ avg / √n`,
//! and a window needs `avg` about `1 + 3 / √n` times the baseline before it
//! cuts (1.6× for a window of 40).
//!
//! State: 64 bytes per key; [`Params`] live in the configuration.

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

/// The growth step of a window that used its limit without queueing, as a
/// multiple of `√limit` (Envoy's burst headroom is one `√limit`).
pub const GROWTH: f64 = 0.5;

/// How far below the queue-free concurrency a cut lands, so the upstream's
/// queue drains and the next window sees its unqueued latency (BBR's drain
/// phase does the same after probing up). Only a window that showed queueing
/// is cut: an upstream below its capacity never sees this.
pub const DRAIN: f64 = 0.85;

/// Successful samples a window needs before it may move the limit (a
/// window also holds at least `limit` of them).
pub const WINDOW_SAMPLES: u32 = 10;

/// Standard errors by which a window's mean must exceed the baseline before
/// it counts as queueing: the test that keeps noise from cutting the limit.
/// 3 (rather than 2) because a cut is costly (it refuses) and windows are
/// many: at 2, half-loaded exponential upstreams still saw cuts.
pub const CONFIDENCE: f64 = 3.0;

/// The answers that set the first baseline.
pub const BOOTSTRAP_SAMPLES: u32 = 2 * WINDOW_SAMPLES;

/// About how many samples the baseline averages over: a window of `n`
/// moves it `n / BASELINE_SAMPLES` of the gap (at most half).
pub const BASELINE_SAMPLES: f64 = 64.0;

/// The largest `max` accepted: in-flight counts are `u32`.
pub const MAX_LIMIT: u32 = 1_000_000;

/// A limit's numbers (`min`, `max`, `initial` in `gateway.toml`), validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
/// window being gathered. The fields that need no more are `f32` (a
/// latency in ns to 7 digits), so a key stays at 64 bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adaptive {
    /// The limit, within `[min, max]`; admission uses its integer part.
    estimate: f64,
    /// Sum of the window's successful latencies (ns).
    window_sum: f64,
    /// When the limit was last cut; a sample sent earlier describes the
    /// higher limit before it and is not counted.
    cut_at: Nanos,
    /// When the current window began.
    window_start: Nanos,
    /// Long-run latency (ns) of an unqueued request; 0 until bootstrapped.
    baseline: f32,
    /// The limit the last cut landed on (`initial` before one): a window
    /// whose peak in flight stayed within it teaches the baseline.
    drained: f32,
    /// Sum of the squares of the window's successful latencies (ns²).
    window_squares: f32,
    /// Mean latency (ns) of the last closed window, for the admin view.
    recent: f32,
    window_samples: u32,
    /// The most requests in flight at an admission during the window.
    window_peak: u32,
    in_flight: u32,
    /// The window began when the limit moved (see the module doc).
    settling: bool,
}

impl Adaptive {
    /// A fresh key at `params.initial`, its first window beginning at `now`.
    pub fn new(params: Params, now: Nanos) -> Adaptive {
        Adaptive {
            estimate: f64::from(params.initial),
            window_sum: 0.0,
            cut_at: now,
            window_start: now,
            baseline: 0.0,
            drained: params.initial as f32,
            window_squares: 0.0,
            recent: 0.0,
            window_samples: 0,
            window_peak: 0,
            in_flight: 0,
            settling: true,
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

    /// The learned unqueued latency, once a request has been answered
    /// (until the bootstrap's answers are in, their mean so far).
    pub fn baseline(&self) -> Option<Nanos> {
        if self.baseline > 0.0 {
            Some(self.baseline as Nanos)
        } else {
            (self.window_samples > 0)
                .then(|| (self.window_sum / f64::from(self.window_samples)) as Nanos)
        }
    }

    /// The mean latency of the last closed window, once one has.
    pub fn recent(&self) -> Option<Nanos> {
        (self.recent >= 1.0).then_some(self.recent as Nanos)
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
        self.acquire_units(1);
    }

    /// Take `units` slots at once (a request of cost `units`; the caller has
    /// decided they fit). Its completion releases one through
    /// [`Self::on_complete`] and the rest through [`Self::release_units`].
    pub fn acquire_units(&mut self, units: u32) {
        self.in_flight = self.in_flight.saturating_add(units);
        self.window_peak = self.window_peak.max(self.in_flight);
    }

    /// Release `units` slots without a sample (a request's slots beyond the
    /// one [`Self::on_complete`] releases).
    pub fn release_units(&mut self, units: u32) {
        self.in_flight = self.in_flight.saturating_sub(units);
    }

    /// Release the slot of a request that took `latency` and ended in
    /// `outcome` at `now`, and let the limit learn from it.
    pub fn on_complete(&mut self, params: Params, now: Nanos, latency: Nanos, outcome: Outcome) {
        self.in_flight = self.in_flight.saturating_sub(1);
        // Sent before the last cut: it describes the higher limit before it,
        // which has already been paid for.
        if now.saturating_sub(latency) < self.cut_at {
            return;
        }
        match outcome {
            Outcome::Ignored => {}
            Outcome::Overload => {
                self.estimate = params.bound(self.estimate * BACKOFF);
                self.cut_at = now;
                self.start_window(now, true);
            }
            Outcome::Success => {
                let x = latency as f64;
                self.window_sum += x;
                self.window_squares += (x * x) as f32;
                self.window_samples = self.window_samples.saturating_add(1);
                if self.baseline <= 0.0 {
                    // The bootstrap: the first answers, however many in
                    // flight (a later drain corrects a queued start). Not
                    // fewer: with exponential service times the mean of 10
                    // is ±30 %, and a low bootstrap takes the rest for a
                    // queue and cuts at once.
                    let mean = self.window_sum / f64::from(self.window_samples);
                    if self.window_samples >= BOOTSTRAP_SAMPLES {
                        self.baseline = mean.max(1.0) as f32;
                        self.recent = self.baseline;
                        self.start_window(now, false);
                    }
                    return;
                }
                // A round of the limit and at least one unqueued round trip:
                // not the window's own mean, which would close a window of
                // short samples early.
                let enough = self.window_samples >= WINDOW_SAMPLES.max(self.limit());
                if enough
                    && now.saturating_sub(self.window_start) as f64 >= f64::from(self.baseline)
                {
                    self.close_window(params, now);
                }
            }
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

    fn start_window(&mut self, now: Nanos, settling: bool) {
        self.window_start = now;
        self.window_sum = 0.0;
        self.window_squares = 0.0;
        self.window_samples = 0;
        self.window_peak = 0;
        self.settling = settling;
    }

    fn close_window(&mut self, params: Params, now: Nanos) {
        let n = f64::from(self.window_samples);
        // At least 1 ns: a zero latency (a coarse clock) must not divide by 0.
        let avg = (self.window_sum / n).max(1.0);
        let variance = (f64::from(self.window_squares) / n - avg * avg).max(0.0) * n / (n - 1.0);
        let se = (variance / n).sqrt();
        let baseline = f64::from(self.baseline).max(1.0);
        let ratio = avg / baseline;
        let queueing = ratio > TOLERANCE && avg - CONFIDENCE * se > baseline;
        let drained = f64::from(self.window_peak) <= f64::from(self.drained);
        if (drained && !self.settling) || self.limit() <= params.min {
            let gain = (n / BASELINE_SAMPLES).min(0.5);
            self.baseline = (baseline + (avg - baseline) * gain) as f32;
        }
        let mut moved = false;
        if queueing {
            let evident = ((avg - se) / baseline).max(1.0);
            self.estimate = params.bound(self.estimate * (DRAIN / evident).max(MIN_GRADIENT));
            self.drained = self.estimate as f32;
            self.cut_at = now;
            moved = true;
        } else if !self.settling
            && ratio <= TOLERANCE
            && f64::from(self.window_peak) * 2.0 >= self.estimate
        {
            let step = (self.estimate.sqrt() * GROWTH).max(1.0);
            self.estimate = params.bound(self.estimate + step);
            moved = true;
        }
        self.recent = avg as f32;
        self.start_window(now, moved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn params() -> Params {
        Params::new(1, 1000, 20).unwrap()
    }

    /// Complete a window's worth of successes (`max(WINDOW_SAMPLES,
    /// limit)`) at `latency`, with `load` in flight, starting at `now`;
    /// returns the time after it.
    fn window(a: &mut Adaptive, p: Params, now: Nanos, load: u32, latency: Nanos) -> Nanos {
        for _ in 0..load {
            a.acquire();
        }
        let end = now + latency;
        for _ in 0..WINDOW_SAMPLES.max(a.limit()) {
            a.on_complete(p, end, latency, Outcome::Success);
            a.acquire();
        }
        for _ in 0..load {
            a.on_complete(p, end, latency, Outcome::Ignored);
        }
        end
    }

    #[test]
    fn state_is_small() {
        assert_eq!(std::mem::size_of::<Adaptive>(), 64);
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
        while a.limit() < 50 {
            let load = a.limit();
            now = window(&mut a, p, now, load, 10 * MS);
            seen.push(a.limit());
        }
        // The first call bootstraps the baseline; after that the limit grows
        // every other window (a settling window follows each move).
        assert_eq!(
            seen,
            [
                20, 20, 22, 22, 24, 24, 27, 27, 29, 29, 32, 32, 35, 35, 38, 38, 41, 41, 44, 44, 47,
                47, 51
            ]
        );
        assert_eq!(a.baseline(), Some(10 * MS));
        // 51 in flight on 40 slots: windows see 12.5 ms, r = 1.25, still
        // within the tolerance: a settling window, then one more step.
        now = window(&mut a, p, now, 51, 12_500_000);
        assert_eq!(a.limit(), 51);
        now = window(&mut a, p, now, 51, 12_500_000);
        assert_eq!(a.limit(), 54);
        // 54 in flight: 13.5 ms, r = 1.35 with no spread: cut to
        // 54.x × 0.85 / 1.35.
        now = window(&mut a, p, now, 54, 13_500_000);
        assert_eq!(a.limit(), 34);
        assert_eq!(a.recent(), Some(13_500_000));
        // A 503 for a request sent after that cut: × 0.8, once.
        a.acquire();
        a.acquire();
        a.on_complete(p, now + 5 * MS, MS, Outcome::Overload);
        assert_eq!(a.limit(), 27);
        // The second was sent before this backoff: no second decrease.
        a.on_complete(p, now + 6 * MS, 5 * MS, Outcome::Overload);
        assert_eq!(a.limit(), 27);
        assert_eq!(a.in_flight(), 0);
    }

    #[test]
    fn a_noisy_window_is_not_queueing_a_steady_one_is() {
        let p = params();
        let mut a = Adaptive::new(p, 0);
        for _ in 0..20 {
            a.acquire();
        }
        let mut now = 10 * MS;
        for _ in 0..BOOTSTRAP_SAMPLES {
            a.on_complete(p, now, 10 * MS, Outcome::Success);
            a.acquire();
        }
        assert_eq!(a.baseline(), Some(10 * MS));
        // 20 samples averaging 15 ms (r = 1.5) but spread 1–29 ms: the
        // standard error is 3.2 ms, and 15 − 3 × 3.2 < 10: noise, no cut
        // (and no growth: r is above the tolerance).
        now += 30 * MS;
        for i in 0..20 {
            let latency = if i % 2 == 0 { MS } else { 29 * MS };
            a.on_complete(p, now, latency, Outcome::Success);
            a.acquire();
        }
        assert_eq!(a.limit(), 20);
        assert_eq!(a.recent(), Some(15 * MS));
        // The same mean with no spread is queueing: cut.
        now += 30 * MS;
        for _ in 0..20 {
            a.on_complete(p, now, 15 * MS, Outcome::Success);
            a.acquire();
        }
        assert!(a.limit() < 20, "{}", a.limit());
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
        let now = window(&mut a, p, 0, 20, MS);
        window(&mut a, p, now, 20, MS);
        assert_eq!(a.limit(), 22);
        a.rescale(Params::new(1, 1000, 5).unwrap());
        assert_eq!(a.limit(), 22);
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
