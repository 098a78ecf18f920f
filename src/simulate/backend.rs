//! `--backend capacity=N,latency=DUR`: a modelled upstream, so a trace is
//! replayed with real completions instead of every response ending at once.
//!
//! The model is a FIFO queue in front of `N` servers (an M/M/N queue when
//! the arrivals are Poisson): a request is served by the server that can
//! start it first, for an exponential service time of mean `DUR`; when all
//! `N` are busy it waits at the upstream, in arrival order. Its response
//! ends at `start + service`, so its latency as the gateway sees it is the
//! upstream's queueing plus its service. With `queue=Q`, a request that
//! finds `Q` already waiting is answered 503 at once (the upstream's own
//! overload answer), as the bench's capacity upstream does.
//!
//! The capacity may follow a [`Schedule`] (`--generate capacity-drop` halves
//! it halfway): server `i` takes a new request only while the capacity is
//! above `i`; a request already in service when the capacity falls is
//! finished, not cut short, as a real server finishing its work would.
//!
//! Service times are drawn from the request's number (its trace line) and
//! the seed, not from a stream: the same request takes the same time in
//! every `--compare` variant whichever requests the others admitted, so
//! the variants differ only in what their limits did (common random
//! numbers), and a run is exactly repeatable.
//!
//! Worked example, `capacity=1,latency=100ms`, requests at 0 and 10 ms with
//! service times 100 and 50 ms: the first is served 0–100 ms (latency
//! 100 ms), the second waits 90 ms and is served 100–150 ms (latency
//! 140 ms). With `queue=0` the second is refused with 503 instead.
//!
//! This module is the pure model: no clock, no permits. What holds a
//! request's permits until its modelled response ends is `flight`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::Serialize;

use super::Error;
use crate::config::units::parse_duration;
use crate::limit::{NANOS_PER_SEC, Nanos};

/// The most servers a modelled upstream may have: a bound on a typo (each
/// is an entry of a heap).
pub(crate) const MAX_CAPACITY: u64 = 1_000_000;

/// The latency a response must beat to count as goodput, by default.
pub(crate) const DEFAULT_SLO: Nanos = 500 * 1_000_000;

/// A parsed `--backend` spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spec {
    /// `capacity=N`: requests served at once.
    pub(crate) capacity: u64,
    /// `latency=DUR`: the mean service time.
    pub(crate) latency: Nanos,
    /// `queue=Q`: the most requests that may wait at the upstream; `None`:
    /// unbounded.
    pub(crate) queue: Option<u64>,
    /// `slo=DUR`: a 2xx within it is goodput (default 500 ms).
    pub(crate) slo: Nanos,
    /// `seed=S`: of the service times.
    pub(crate) seed: u64,
}

const KEYS: &str = "capacity, latency, queue, slo, seed";

fn usage(message: String) -> Error {
    Error::Usage(format!("--backend: {message}"))
}

impl Spec {
    /// Parses `capacity=N,latency=DUR[,queue=Q][,slo=DUR][,seed=S]`.
    pub(crate) fn parse(text: &str) -> Result<Spec, Error> {
        let (mut capacity, mut latency, mut queue, mut slo, mut seed) =
            (None, None, None, None, None);
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                return Err(usage(format!(
                    "`{pair}` is not key=value (e.g. capacity=20,latency=100ms)"
                )));
            };
            let (key, value) = (key.trim(), value.trim());
            let count = |min: u64| {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|n| (min..=MAX_CAPACITY).contains(n))
                    .ok_or_else(|| {
                        usage(format!(
                            "`{key}={value}` is not a whole number from {min} to {MAX_CAPACITY}"
                        ))
                    })
            };
            let duration = || {
                parse_duration(value)
                    .ok()
                    .and_then(|d| u64::try_from(d.as_nanos()).ok())
                    .filter(|&n| n > 0)
                    .ok_or_else(|| {
                        usage(format!(
                            "`{key}={value}` is not a duration like 100ms or 2s"
                        ))
                    })
            };
            let slot = match key {
                "capacity" => capacity.replace(count(1)?).is_some(),
                "latency" => latency.replace(duration()?).is_some(),
                "queue" => queue.replace(count(0)?).is_some(),
                "slo" => slo.replace(duration()?).is_some(),
                "seed" => seed
                    .replace(
                        value
                            .parse::<u64>()
                            .map_err(|_| usage(format!("`seed={value}` is not a whole number")))?,
                    )
                    .is_some(),
                other => {
                    return Err(usage(format!("unknown `{other}`, expected one of {KEYS}")));
                }
            };
            if slot {
                return Err(usage(format!("`{key}` is given twice")));
            }
        }
        let (Some(capacity), Some(latency)) = (capacity, latency) else {
            return Err(usage(
                "needs capacity=N and latency=DUR (e.g. capacity=20,latency=100ms)".into(),
            ));
        };
        Ok(Spec {
            capacity,
            latency,
            queue,
            slo: slo.unwrap_or(DEFAULT_SLO),
            seed: seed.unwrap_or(1),
        })
    }
}

/// The upstream's capacity over time: `(from, capacity)` steps, the first
/// from time 0, each at least 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Schedule {
    steps: Vec<(Nanos, u64)>,
}

impl Schedule {
    /// `capacity` throughout.
    pub(crate) fn constant(capacity: u64) -> Schedule {
        Schedule {
            steps: vec![(0, capacity.max(1))],
        }
    }

    /// `before` until `at`, then `after`.
    pub(crate) fn step(before: u64, at: Nanos, after: u64) -> Schedule {
        Schedule {
            steps: vec![(0, before.max(1)), (at, after.max(1))],
        }
    }

    /// The capacity at `t`.
    pub(crate) fn at(&self, t: Nanos) -> u64 {
        self.steps
            .iter()
            .rev()
            .find(|(from, _)| *from <= t)
            .map_or(1, |&(_, capacity)| capacity)
    }

    /// The most it ever is: the servers the model keeps.
    pub(crate) fn peak(&self) -> u64 {
        self.steps.iter().map(|&(_, c)| c).max().unwrap_or(1)
    }

    /// Its steps, `(from, capacity)`.
    pub(crate) fn steps(&self) -> &[(Nanos, u64)] {
        &self.steps
    }

    /// The first time at or after `t` when server `server` may take a
    /// request (the capacity is above it); `None` if never again.
    fn open_from(&self, server: u64, t: Nanos) -> Option<Nanos> {
        if self.at(t) > server {
            return Some(t);
        }
        self.steps
            .iter()
            .find(|&&(from, capacity)| from > t && capacity > server)
            .map(|&(from, _)| from)
    }

    /// The mean capacity over `[from, to)` (the capacity at `from` for an
    /// empty span), time-weighted.
    pub(crate) fn mean(&self, from: Nanos, to: Nanos) -> f64 {
        if to <= from {
            return self.at(from) as f64;
        }
        let mut sum = 0.0;
        let mut t = from;
        while t < to {
            let capacity = self.at(t);
            let next = self
                .steps
                .iter()
                .map(|&(s, _)| s)
                .find(|&s| s > t)
                .unwrap_or(to)
                .min(to);
            sum += capacity as f64 * (next - t) as f64;
            t = next;
        }
        sum / (to - from) as f64
    }
}

/// What the upstream did with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Response {
    /// When it reached the upstream.
    pub(crate) arrival: Nanos,
    /// When a server took it (`arrival` for a refused one).
    pub(crate) start: Nanos,
    /// When its response ended (`arrival` for a refused one).
    pub(crate) end: Nanos,
    /// 200, or 503 when the upstream's queue was full.
    pub(crate) status: u16,
    /// The server that served it (`None`: refused).
    pub(crate) server: Option<u64>,
}

impl Response {
    /// What the gateway sees: the upstream's queueing plus its service.
    pub(crate) fn latency(&self) -> Nanos {
        self.end - self.arrival
    }
}

/// A modelled upstream: its servers and the requests waiting for them.
#[derive(Debug)]
pub(crate) struct Backend {
    spec: Spec,
    schedule: Schedule,
    /// Per server, a time before which it cannot start a request: when its
    /// current request ends, or later when the schedule has it closed then
    /// (re-keyed lazily in [`Backend::serve`]). A server the schedule
    /// never opens again is dropped.
    free: BinaryHeap<Reverse<(Nanos, u64)>>,
    /// Start times of the requests waiting now, in arrival (and start)
    /// order: FIFO starts never go back.
    waiting: VecDeque<Nanos>,
}

impl Backend {
    /// The upstream `spec` describes, its capacity following `schedule`.
    pub(crate) fn new(spec: Spec, schedule: Schedule) -> Backend {
        let free = (0..schedule.peak()).map(|i| Reverse((0, i))).collect();
        Backend {
            spec,
            schedule,
            free,
            waiting: VecDeque::new(),
        }
    }

    pub(crate) fn spec(&self) -> &Spec {
        &self.spec
    }

    pub(crate) fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The service time of request `request` (its trace line): exponential
    /// of mean `latency`, from the request and the seed alone.
    pub(crate) fn service_time(&self, request: u64) -> Nanos {
        // splitmix64: a well-mixed 64-bit value for each (seed, request).
        let mut z = self
            .spec
            .seed
            .wrapping_add(request.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // 53 bits as a uniform in (0, 1]: the logarithm is finite.
        let u = ((z >> 11) + 1) as f64 / (1u64 << 53) as f64;
        let t = -u.ln() * self.spec.latency as f64;
        (t as Nanos).max(1)
    }

    /// The requests still waiting at `at` (those that started by then have
    /// left the queue).
    fn waiting_at(&mut self, at: Nanos) -> usize {
        while self.waiting.front().is_some_and(|&start| start <= at) {
            self.waiting.pop_front();
        }
        self.waiting.len()
    }

    /// Serves request `request` arriving at `arrival`: the server that can
    /// start it first takes it (FIFO: arrivals in time order start in
    /// order), or with the queue full it is refused.
    pub(crate) fn serve(&mut self, arrival: Nanos, request: u64) -> Response {
        let waiting = self.waiting_at(arrival);
        // The server that can start first. A popped server's key is a lower
        // bound; its real start (the schedule may have it closed) is found
        // and, if another's key is earlier, it goes back re-keyed.
        let (start, server) = loop {
            let Some(Reverse((key, server))) = self.free.pop() else {
                // Unreachable: the schedule's last step has a capacity of
                // at least 1, so server 0 always opens again.
                return self.refused(arrival);
            };
            let Some(start) = self.schedule.open_from(server, key.max(arrival)) else {
                continue;
            };
            match self.free.peek() {
                Some(Reverse((next, _))) if *next < start => {
                    self.free.push(Reverse((start, server)));
                }
                _ => break (start, server),
            }
        };
        if start > arrival && self.spec.queue.is_some_and(|bound| waiting as u64 >= bound) {
            self.free.push(Reverse((start, server)));
            return self.refused(arrival);
        }
        let end = start.saturating_add(self.service_time(request));
        self.free.push(Reverse((end, server)));
        if start > arrival {
            self.waiting.push_back(start);
        }
        Response {
            arrival,
            start,
            end,
            status: 200,
            server: Some(server),
        }
    }

    fn refused(&self, arrival: Nanos) -> Response {
        Response {
            arrival,
            start: arrival,
            end: arrival,
            status: 503,
            server: None,
        }
    }

    /// Requests per second the upstream can serve over `[from, to)`: its
    /// mean capacity over the mean service time.
    pub(crate) fn capacity_per_second(&self, from: Nanos, to: Nanos) -> f64 {
        self.schedule.mean(from, to) * NANOS_PER_SEC as f64 / self.spec.latency as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const S: Nanos = NANOS_PER_SEC;

    fn spec(capacity: u64, latency: Nanos) -> Spec {
        Spec {
            capacity,
            latency,
            queue: None,
            slo: DEFAULT_SLO,
            seed: 7,
        }
    }

    /// Poisson arrivals at `rate` per second for `n` requests, from a
    /// seeded stream.
    fn poisson(rate: f64, n: u64, seed: u64) -> Vec<Nanos> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut t = 0.0;
        (0..n)
            .map(|_| {
                t += -(1.0 - rng.f64()).ln() * S as f64 / rate;
                t as Nanos
            })
            .collect()
    }

    fn run(backend: &mut Backend, arrivals: &[Nanos]) -> Vec<Response> {
        arrivals
            .iter()
            .enumerate()
            .map(|(i, &t)| backend.serve(t, i as u64 + 1))
            .collect()
    }

    /// Most requests in service at once, by a sweep over starts and ends.
    fn most_in_service(responses: &[Response]) -> u64 {
        let mut events: Vec<(Nanos, i64)> = responses
            .iter()
            .filter(|r| r.status == 200)
            .flat_map(|r| [(r.start, 1), (r.end, -1)])
            .collect();
        // An end before a start at the same instant: the server is free.
        events.sort();
        let (mut now, mut most) = (0i64, 0i64);
        for (_, delta) in events {
            now += delta;
            most = most.max(now);
        }
        most as u64
    }

    #[test]
    fn worked_example() {
        let mut backend = Backend::new(spec(1, 100 * MS), Schedule::constant(1));
        let a = backend.serve(0, 1);
        let b = backend.serve(10 * MS, 2);
        assert_eq!((a.start, a.end), (0, backend.service_time(1)));
        assert_eq!(b.start, a.end);
        assert_eq!(b.latency(), a.end - 10 * MS + backend.service_time(2));
        let mut bounded = Backend::new(
            Spec {
                queue: Some(0),
                ..spec(1, 100 * MS)
            },
            Schedule::constant(1),
        );
        assert_eq!(bounded.serve(0, 1).status, 200);
        let refused = bounded.serve(10 * MS, 2);
        assert_eq!((refused.status, refused.latency()), (503, 0));
        // The refusal took no server: one arriving after the first ends is
        // served at once.
        let after = bounded.serve(S * 100, 3);
        assert_eq!((after.status, after.start), (200, S * 100));
    }

    #[test]
    fn service_times_are_exponential_of_the_mean_and_seeded() {
        let backend = Backend::new(spec(1, 100 * MS), Schedule::constant(1));
        let n = 50_000;
        let times: Vec<Nanos> = (1..=n).map(|r| backend.service_time(r)).collect();
        let mean = times.iter().sum::<Nanos>() as f64 / n as f64;
        assert!((mean / (100 * MS) as f64 - 1.0).abs() < 0.02, "mean {mean}");
        // Exponential: the median is ln 2 of the mean.
        let mut sorted = times.clone();
        sorted.sort_unstable();
        let median = sorted[sorted.len() / 2] as f64 / (100 * MS) as f64;
        assert!((median - std::f64::consts::LN_2).abs() < 0.02, "{median}");
        // The same request, the same time; another seed, other times.
        assert_eq!(backend.service_time(17), times[16]);
        let other = Backend::new(
            Spec {
                seed: 8,
                ..spec(1, 100 * MS)
            },
            Schedule::constant(1),
        );
        assert_ne!(other.service_time(17), times[16]);
    }

    #[test]
    fn an_mm1_queue_meets_littles_law_and_its_mean_latency() {
        // λ = 5/s, mean service 100 ms: ρ = 0.5, so M/M/1 gives W = 1/(μ−λ)
        // = 200 ms and, by Little's law, L = λW = 1 request in the system.
        let mut backend = Backend::new(spec(1, 100 * MS), Schedule::constant(1));
        let arrivals = poisson(5.0, 40_000, 3);
        let responses = run(&mut backend, &arrivals);
        let n = responses.len() as f64;
        let w = responses.iter().map(|r| r.latency() as f64).sum::<f64>() / n;
        assert!((w / (200 * MS) as f64 - 1.0).abs() < 0.08, "W {w}");
        // L as the time-average of requests in the system over the run.
        let span = responses.iter().map(|r| r.end).max().unwrap() as f64;
        let l = responses.iter().map(|r| r.latency() as f64).sum::<f64>() / span;
        let lambda = n / span;
        assert!(
            (l / (lambda * w) - 1.0).abs() < 0.01,
            "L {l} λW {}",
            lambda * w
        );
        assert!((l - 1.0).abs() < 0.1, "L {l}");
    }

    #[test]
    fn requests_start_in_arrival_order_and_never_beyond_capacity() {
        let mut backend = Backend::new(spec(4, 50 * MS), Schedule::constant(4));
        // 1.5× the capacity of 80/s: a growing queue.
        let arrivals = poisson(120.0, 5_000, 5);
        let responses = run(&mut backend, &arrivals);
        assert!(
            responses.windows(2).all(|p| p[0].start <= p[1].start),
            "FIFO"
        );
        assert_eq!(most_in_service(&responses), 4);
        assert!(responses.iter().all(|r| r.start >= r.arrival));
        // Overloaded, the upstream serves at its capacity: 80/s.
        let last = responses.last().unwrap();
        let rate = responses.len() as f64 * S as f64 / last.end as f64;
        assert!((rate / 80.0 - 1.0).abs() < 0.05, "{rate}/s");
    }

    #[test]
    fn a_queue_bound_refuses_what_would_wait_beyond_it() {
        let mut backend = Backend::new(
            Spec {
                queue: Some(3),
                ..spec(2, 100 * MS)
            },
            Schedule::constant(2),
        );
        // Ten at once: two served, three wait, five refused.
        let responses = run(&mut backend, &[0; 10]);
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [200, 200, 200, 200, 200, 503, 503, 503, 503, 503]);
        assert_eq!(most_in_service(&responses), 2);
    }

    #[test]
    fn a_capacity_drop_is_followed_without_cutting_work_short() {
        let drop = 60 * S;
        let schedule = Schedule::step(8, drop, 4);
        let mut backend = Backend::new(spec(8, 100 * MS), schedule);
        // 60/s: under 80/s before, over 40/s after.
        let arrivals = poisson(60.0, 7_200, 9);
        let responses = run(&mut backend, &arrivals);
        let before: Vec<Response> = responses
            .iter()
            .copied()
            .filter(|r| r.start < drop)
            .collect();
        let after: Vec<Response> = responses
            .iter()
            .copied()
            .filter(|r| r.start >= drop)
            .collect();
        assert!(most_in_service(&before) <= 8);
        // Started after the drop: only servers 0..4.
        assert_eq!(most_in_service(&after), 4);
        assert!(after.iter().all(|r| r.server.is_some_and(|s| s < 4)));
        // After the drop the upstream serves at 40/s, the queue grows.
        let late: Vec<&Response> = responses.iter().filter(|r| r.start > drop + S).collect();
        let served = late.len() as f64;
        let span = (late.last().unwrap().end - late[0].start) as f64 / S as f64;
        assert!(
            (served / span / 40.0 - 1.0).abs() < 0.05,
            "{}",
            served / span
        );
        assert!((backend.capacity_per_second(0, 2 * drop) - 60.0).abs() < 1e-9);
    }

    #[test]
    fn specs_parse_and_say_what_is_wrong() {
        assert_eq!(
            Spec::parse("capacity=20,latency=100ms").unwrap(),
            Spec {
                capacity: 20,
                latency: 100 * MS,
                queue: None,
                slo: DEFAULT_SLO,
                seed: 1
            }
        );
        let full = Spec::parse("capacity=2, latency=1s, queue=0, slo=250ms, seed=9").unwrap();
        assert_eq!((full.queue, full.slo, full.seed), (Some(0), 250 * MS, 9));
        for (bad, says) in [
            ("capacity=20", "needs capacity=N and latency=DUR"),
            ("capacity=0,latency=1s", "not a whole number from 1"),
            ("capacity=2,latency=fast", "not a duration"),
            ("capacity=2,latency=0ms", "not a duration"),
            ("capacity=2,latency=1s,speed=3", "unknown `speed`"),
            ("capacity=2,capacity=3,latency=1s", "given twice"),
            ("capacity", "not key=value"),
        ] {
            let Err(Error::Usage(message)) = Spec::parse(bad) else {
                panic!("accepted {bad}");
            };
            assert!(message.contains(says), "{bad}: {message}");
            assert!(message.starts_with("--backend: "), "{message}");
        }
    }
}
