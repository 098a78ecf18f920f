//! A variant's requests at the modelled upstream ([`backend`](super::backend)):
//! each admitted request's permits held until its modelled response ends,
//! and what the responses were.
//!
//! The run sends each admitted request here with its permits
//! ([`Flight::send`]); before deciding a record at `now` it ends every
//! response due by then ([`Flight::complete_until`]), in the order they
//! end, each through [`release`] — the one place a request's permits are
//! given back, knowing its modelled latency and status. So a `concurrency`
//! limit sees the requests still in flight, as on the gateway, where
//! without a backend every permit is given back at once.
//!
//! The counts ([`FlightStats`]): responses by status, goodput (a 2xx within
//! the SLO), the latencies of the 2xx responses, the most in flight, and
//! the requests the gateway shed, by priority, route and status.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};

use super::backend::{Backend, Response};
use crate::limit::{Nanos, Permits, UpstreamAnswer};

/// Gives back a request's permits when its response ends at `end`, with
/// its status (200, or 503 from a full upstream queue).
///
/// The one release point of the simulated request path: a `concurrency`
/// permit only needs dropping; an `adaptive` permit learns the answer and
/// its latency (from its admission to `end`: the upstream's queueing plus
/// its service) when it drops.
pub(crate) fn release(mut permits: Permits, end: Nanos, status: u16) {
    permits.record_outcome_at(UpstreamAnswer::Status(status), end);
    drop(permits);
}

/// A response that has not ended yet, with the permits its request holds.
struct Pending {
    end: Nanos,
    /// Sent order: responses ending at the same instant end in it.
    seq: u64,
    status: u16,
    permits: Permits,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Pending) -> bool {
        (self.end, self.seq) == (other.end, other.seq)
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Pending) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    /// Reversed: the heap's top is the response that ends first.
    fn cmp(&self, other: &Pending) -> Ordering {
        (other.end, other.seq).cmp(&(self.end, self.seq))
    }
}

/// A request the gateway refused, as the report counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Shed {
    /// `critical`, `normal` or `sheddable` (see `run::shed_priority`).
    pub(crate) priority: &'static str,
    /// Its route's index in `config.routes`.
    pub(crate) route: usize,
    /// The status the refusing limit answers.
    pub(crate) status: u16,
}

/// What one variant's requests met at the upstream.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FlightStats {
    /// Requests sent to the upstream (admitted by the gateway).
    pub(crate) sent: u64,
    /// Answered 2xx.
    pub(crate) ok: u64,
    /// Answered 503 by the upstream (its queue full).
    pub(crate) upstream_refused: u64,
    /// 2xx within the SLO.
    pub(crate) good: u64,
    /// Latency of every 2xx response, in sent order.
    pub(crate) latencies: Vec<Nanos>,
    /// The most requests in flight (sent, not yet answered) at once.
    pub(crate) peak_in_flight: u64,
    /// Refused by the gateway's limits.
    pub(crate) shed: BTreeMap<Shed, u64>,
}

/// One variant's upstream and its requests in flight.
#[derive(Debug)]
pub(crate) struct Flight {
    backend: Backend,
    pending: BinaryHeap<Pending>,
    sent: u64,
    pub(crate) stats: FlightStats,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("end", &self.end)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

impl Flight {
    pub(crate) fn new(backend: Backend) -> Flight {
        Flight {
            backend,
            pending: BinaryHeap::new(),
            sent: 0,
            stats: FlightStats::default(),
        }
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Requests sent and not yet answered.
    pub(crate) fn in_flight(&self) -> u64 {
        self.pending.len() as u64
    }

    /// Ends every response due by `now`, in end order: `at` moves the
    /// variant's clock to each end first (it never goes back), then its
    /// permits go through [`release`].
    pub(crate) fn complete_until(&mut self, now: Nanos, mut at: impl FnMut(Nanos)) {
        while self.pending.peek().is_some_and(|p| p.end <= now) {
            if let Some(done) = self.pending.pop() {
                at(done.end);
                release(done.permits, done.end, done.status);
            }
        }
    }

    /// Ends every response still in flight (the run is over).
    pub(crate) fn finish(&mut self, at: impl FnMut(Nanos)) {
        self.complete_until(Nanos::MAX, at);
    }

    /// Sends request `request` (its trace line), arriving at the upstream
    /// at `arrival` and holding `permits` until its response ends.
    pub(crate) fn send(&mut self, arrival: Nanos, request: u64, permits: Permits) -> Response {
        let response = self.backend.serve(arrival, request);
        let slo = self.backend.spec().slo;
        let stats = &mut self.stats;
        stats.sent += 1;
        if response.status == 200 {
            stats.ok += 1;
            let latency = response.latency();
            stats.latencies.push(latency);
            if latency <= slo {
                stats.good += 1;
            }
        } else {
            stats.upstream_refused += 1;
        }
        self.sent += 1;
        self.pending.push(Pending {
            end: response.end,
            seq: self.sent,
            status: response.status,
            permits,
        });
        stats.peak_in_flight = stats.peak_in_flight.max(self.pending.len() as u64);
        response
    }

    /// Counts a request the gateway refused.
    pub(crate) fn shed(&mut self, shed: Shed) {
        *self.stats.shed.entry(shed).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::concurrency::{ConcurrencyPermit, Slot, in_flight};
    use crate::simulate::backend::{DEFAULT_SLO, Schedule, Spec};

    const MS: Nanos = 1_000_000;

    fn flight(capacity: u64) -> Flight {
        let spec = Spec {
            capacity,
            latency: 100 * MS,
            queue: None,
            slo: DEFAULT_SLO,
            seed: 1,
        };
        Flight::new(Backend::new(spec, Schedule::constant(capacity)))
    }

    fn permits(slot: &Slot) -> Permits {
        let mut permits = Permits::default();
        permits.hold(Box::new(ConcurrencyPermit::acquire(slot, 1)));
        permits
    }

    #[test]
    fn permits_are_held_until_the_modelled_response_ends() {
        let slot = Slot::default();
        let mut flight = flight(1);
        let first = flight.send(0, 1, permits(&slot));
        let second = flight.send(0, 2, permits(&slot));
        assert_eq!(second.start, first.end, "queued behind the first");
        assert_eq!((in_flight(&slot), flight.in_flight()), (2, 2));
        let mut ends = Vec::new();
        flight.complete_until(first.end - 1, |t| ends.push(t));
        assert_eq!(in_flight(&slot), 2);
        flight.complete_until(first.end, |t| ends.push(t));
        assert_eq!((in_flight(&slot), ends.clone()), (1, vec![first.end]));
        flight.finish(|t| ends.push(t));
        assert_eq!((in_flight(&slot), ends), (0, vec![first.end, second.end]));
        let stats = &flight.stats;
        assert_eq!((stats.sent, stats.ok, stats.peak_in_flight), (2, 2, 2));
        assert_eq!(stats.latencies, [first.latency(), second.latency()]);
        let good = [first, second]
            .iter()
            .filter(|r| r.latency() <= DEFAULT_SLO)
            .count() as u64;
        assert_eq!(stats.good, good);
    }
}
