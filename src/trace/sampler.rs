//! Head sampling, parent-based: a request with a well-formed `traceparent`
//! follows its caller's `sampled` flag; one without (or with a malformed
//! one) starts a trace, recorded with probability `sample`.
//!
//! The draw is the new trace id's low 64 bits, compared with
//! `sample × 2⁶⁴` (OpenTelemetry's `TraceIdRatioBased` idea: the decision
//! is a function of the id). An unsampled new trace costs one random
//! number and one comparison; its other 64 bits are drawn only when it is
//! recorded.

use super::context::{Parent, SpanId, TraceId};

/// The sampling ratio as a threshold on a uniform 64-bit draw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sampler {
    /// A draw below it is recorded; `None`: every draw is (ratio 1).
    threshold: Option<u64>,
}

/// Who a recorded request's server span descends from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start {
    pub(crate) trace_id: TraceId,
    /// The caller's span, when the trace came in with the request.
    pub(crate) parent: Option<SpanId>,
}

impl Sampler {
    /// `ratio` in `0.0..=1.0` (validated by the configuration).
    pub(crate) fn new(ratio: f64) -> Sampler {
        if ratio >= 1.0 {
            return Sampler { threshold: None };
        }
        // 2⁶⁴ × ratio, saturating; NaN (never validated in) records nothing.
        let threshold = (ratio.max(0.0) * 18_446_744_073_709_551_616.0) as u64;
        Sampler {
            threshold: Some(threshold),
        }
    }

    /// Whether the request is recorded, and in which trace. `draw` gives
    /// uniformly random 64-bit numbers (the first is the decision).
    pub(crate) fn decide(
        &self,
        parent: Option<Parent>,
        mut draw: impl FnMut() -> u64,
    ) -> Option<Start> {
        if let Some(parent) = parent {
            return parent.sampled.then_some(Start {
                trace_id: parent.trace_id,
                parent: Some(parent.span_id),
            });
        }
        let low = draw();
        if self.threshold.is_some_and(|threshold| low >= threshold) {
            return None;
        }
        let high = draw();
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&high.to_be_bytes());
        id[8..].copy_from_slice(&low.to_be_bytes());
        if id == [0; 16] {
            // One chance in 2¹²⁸: the all-zero id is invalid.
            id[15] = 1;
        }
        Some(Start {
            trace_id: TraceId(id),
            parent: None,
        })
    }
}

/// A fresh span id from `draw`: never all zeros.
pub(crate) fn span_id(draw: impl FnOnce() -> u64) -> SpanId {
    SpanId(draw().max(1).to_be_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent(sampled: bool) -> Parent {
        Parent {
            trace_id: TraceId([7; 16]),
            span_id: SpanId([9; 8]),
            sampled,
        }
    }

    #[test]
    fn a_sampled_parent_is_continued_whatever_the_ratio() {
        let start = Sampler::new(0.0)
            .decide(Some(parent(true)), || unreachable!("no draw"))
            .unwrap();
        assert_eq!(start.trace_id, TraceId([7; 16]));
        assert_eq!(start.parent, Some(SpanId([9; 8])));
    }

    #[test]
    fn an_unsampled_parent_is_not_recorded_whatever_the_ratio() {
        assert_eq!(
            Sampler::new(1.0).decide(Some(parent(false)), || unreachable!("no draw")),
            None
        );
    }

    #[test]
    fn the_ratio_is_a_threshold_on_the_draw() {
        let tenth = Sampler::new(0.1);
        let just_below = u64::MAX / 10 - 1_000;
        let just_above = u64::MAX / 10 + 1_000;
        assert!(tenth.decide(None, || just_below).is_some());
        assert!(tenth.decide(None, || just_above).is_none());
        assert!(Sampler::new(0.0).decide(None, || 0).is_none());
        assert!(Sampler::new(1.0).decide(None, || u64::MAX).is_some());
    }

    #[test]
    fn a_new_trace_id_holds_both_draws() {
        let mut draws = [1u64, 2].into_iter();
        let start = Sampler::new(1.0)
            .decide(None, || draws.next().unwrap())
            .unwrap();
        assert_eq!(start.parent, None);
        assert_eq!(
            start.trace_id.to_string(),
            "00000000000000020000000000000001"
        );
        let zero = Sampler::new(1.0).decide(None, || 0).unwrap();
        assert_ne!(zero.trace_id.0, [0; 16]);
        assert_ne!(span_id(|| 0).0, [0; 8]);
    }

    #[test]
    fn a_seeded_draw_samples_near_the_ratio() {
        let mut rng = fastrand::Rng::with_seed(48);
        let sampler = Sampler::new(0.1);
        let recorded = (0..100_000)
            .filter(|_| sampler.decide(None, || rng.u64(..)).is_some())
            .count();
        // Binomial(100000, 0.1): σ ≈ 95; ±6σ.
        assert!((9_430..=10_570).contains(&recorded), "{recorded}");
    }
}
