//! `--generate SPEC`: workloads that show the lessons of rate limiting
//! without a trace file, deterministic (a seeded RNG, `seed=` to change it).
//!
//! A spec is a name and optional `key=value` parameters after a colon:
//!
//! | spec | traffic |
//! | --- | --- |
//! | `boundary-burst` (`n`, `window`, `spread`, `at`, `keys`) | `n` requests in the `spread` just before a window edge and `n` in the `spread` just after; defaults: `n` and `window` from the route's first limit (its window form), `spread` = window / 100, the edge the first multiple of the window from 2026-01-01 |
//! | `poisson:rate=R,keys=K,duration=D` (`seed`, `start`) | arrivals at `R` (`"50/s"` or a number per second) spread uniformly over `K` keys (default 1), for `D` (default `60s`) |
//! | `page-loads:users=U,burst=8` (`think`, `spread`, `duration`, `seed`, `start`) | each of `U` users (default 10) loads a page of `burst` requests within `spread` (default `50ms`), then waits an exponential time of mean `think` (default `5s`), for `duration` (default `60s`) |
//! | `capacity-drop` (`capacity`, `latency`, `load`, `keys`, `duration`, `seed`, `start`) | Poisson arrivals at `load` (default 0.8) of what a modelled upstream of `capacity` servers (default `--backend`'s, else 20) with mean service `latency` (default `--backend`'s, else `100ms`) serves, over `keys` keys, for `duration` (default `60s`); the upstream's capacity halves halfway, so the load becomes 2 × `load` of it ([`Spec::backend`]) |
//!
//! Every spec also takes `vary=KIND,...` (the kinds, comma-separated, up to
//! the next `key=value`): which key kinds differ per client, e.g.
//! `poisson:rate=50/s,keys=10,vary=ip,header:x-api-key`; by default every
//! kind the route's limits read. The requests go to the route of `--route`
//! (else the first route with limits), as [`Clients`] makes them: client N
//! is one key of each limit. [`Generated`] says what was made, for the
//! report's header line.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use super::Error;
use super::backend::{DEFAULT_SLO, MAX_CAPACITY, Schedule, Spec as BackendSpec};
use super::clients::{Clients, Variation};
use super::compare::window_form;
use super::text::{nanos_text, rate_text};
use super::trace::Item;
use crate::config::Config;
use crate::config::units::{parse_duration, parse_rate};
use crate::limit::{NANOS_PER_SEC, Nanos};

/// 2026-01-01T00:00:00Z: where generated traffic starts by default.
const DEFAULT_START: Nanos = 1_767_225_600 * NANOS_PER_SEC;

/// The most requests (or users) a generator makes: a bound on a typo.
const MAX_COUNT: u64 = 100_000_000;

/// A parsed `--generate` spec.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spec {
    pub(crate) traffic: Traffic,
    /// `vary=`: the key kinds that differ per client, as limits spell them;
    /// `None`: every kind the route's limits read.
    pub(crate) vary: Option<Vec<String>>,
}

/// When requests arrive, and from which client.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Traffic {
    BoundaryBurst {
        n: Option<u64>,
        window: Option<Nanos>,
        spread: Option<Nanos>,
        at: Option<Nanos>,
        keys: u64,
    },
    Poisson {
        /// Requests per second.
        rate: f64,
        keys: u64,
        duration: Nanos,
        start: Nanos,
        seed: u64,
    },
    PageLoads {
        users: u64,
        burst: u64,
        think: Nanos,
        spread: Nanos,
        duration: Nanos,
        start: Nanos,
        seed: u64,
    },
    /// Poisson arrivals at `load` of a modelled upstream's capacity, which
    /// halves halfway. `None`: `--backend`'s, else the defaults.
    CapacityDrop {
        capacity: Option<u64>,
        latency: Option<Nanos>,
        load: f64,
        keys: u64,
        duration: Nanos,
        start: Nanos,
        seed: u64,
    },
}

const GENERATORS: &str =
    "boundary-burst, poisson:rate=R,keys=K,duration=D, page-loads:users=U,burst=8, capacity-drop";

/// `capacity-drop`'s upstream without `capacity=` or `--backend`.
const DROP_CAPACITY: u64 = 20;
/// And its mean service time.
const DROP_LATENCY: Nanos = 100_000_000;

fn usage(message: String) -> Error {
    Error::Usage(format!("--generate: {message}"))
}

/// The parameters of a spec, each taken once.
struct Params<'a> {
    name: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Params<'a> {
    fn take(&mut self, key: &str) -> Option<&'a str> {
        let i = self.pairs.iter().position(|(k, _)| *k == key)?;
        Some(self.pairs.remove(i).1)
    }

    fn count(&mut self, key: &str, min: u64) -> Result<Option<u64>, Error> {
        let Some(text) = self.take(key) else {
            return Ok(None);
        };
        match text.parse::<u64>() {
            Ok(n) if (min..=MAX_COUNT).contains(&n) => Ok(Some(n)),
            _ => Err(usage(format!(
                "{}: `{key}={text}` must be a whole number from {min} to {MAX_COUNT}",
                self.name
            ))),
        }
    }

    fn duration(&mut self, key: &str) -> Result<Option<Nanos>, Error> {
        let Some(text) = self.take(key) else {
            return Ok(None);
        };
        let duration = parse_duration(text)
            .map_err(|m| usage(format!("{}: `{key}={text}`: {m}", self.name)))?;
        Ok(Some(u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)))
    }

    fn time(&mut self, key: &str) -> Result<Option<Nanos>, Error> {
        let Some(text) = self.take(key) else {
            return Ok(None);
        };
        super::trace::parse_time(text)
            .map(Some)
            .map_err(|m| usage(format!("{}: `{key}`: {m}", self.name)))
    }

    fn seed(&mut self) -> Result<u64, Error> {
        let Some(text) = self.take("seed") else {
            return Ok(1);
        };
        text.parse().map_err(|_| {
            usage(format!(
                "{}: `seed={text}` must be a whole number",
                self.name
            ))
        })
    }

    /// Every parameter was used.
    fn finish(self, expected: &str) -> Result<(), Error> {
        match self.pairs.first() {
            None => Ok(()),
            Some((key, _)) => Err(usage(format!(
                "{}: unknown parameter `{key}`, expected {expected}",
                self.name
            ))),
        }
    }
}

impl Spec {
    /// Parses `name[:key=value,...]`.
    pub(crate) fn parse(text: &str) -> Result<Spec, Error> {
        let (name, rest) = text.trim().split_once(':').unwrap_or((text.trim(), ""));
        let mut pairs = Vec::new();
        // `vary=` is a list: the items after it without `=` are its own.
        let mut vary: Option<Vec<String>> = None;
        let mut in_vary = false;
        for pair in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = pair.split_once('=') else {
                if let (true, Some(vary)) = (in_vary, vary.as_mut()) {
                    vary.push(pair.to_owned());
                    continue;
                }
                return Err(usage(format!("{name}: `{pair}` is not key=value")));
            };
            let (key, value) = (key.trim(), value.trim());
            if pairs.iter().any(|(k, _)| *k == key) || (key == "vary" && vary.is_some()) {
                return Err(usage(format!("{name}: `{key}` is given twice")));
            }
            in_vary = key == "vary";
            if in_vary {
                if value.is_empty() {
                    return Err(usage(format!(
                        "{name}: `vary=` needs key kinds, e.g. vary=ip,header:x-api-key"
                    )));
                }
                vary = Some(vec![value.to_owned()]);
            } else {
                pairs.push((key, value));
            }
        }
        if let Some(items) = &vary
            && let Some(twice) = items
                .iter()
                .enumerate()
                .find_map(|(i, item)| items[..i].contains(item).then_some(item))
        {
            return Err(usage(format!("{name}: vary: `{twice}` is given twice")));
        }
        let mut p = Params { name, pairs };
        let traffic = match name {
            "boundary-burst" => {
                let traffic = Traffic::BoundaryBurst {
                    n: p.count("n", 1)?,
                    window: p.duration("window")?,
                    spread: p.duration("spread")?,
                    at: p.time("at")?,
                    keys: p.count("keys", 1)?.unwrap_or(1),
                };
                p.finish("n, window, spread, at, keys, vary")?;
                traffic
            }
            "poisson" => {
                let rate = match p.take("rate") {
                    None => return Err(usage("poisson needs `rate=R` (e.g. rate=50/s)".into())),
                    Some(text) => per_second(text).ok_or_else(|| {
                        usage(format!(
                            "poisson: `rate={text}` is not a rate like 50/s or 0.5"
                        ))
                    })?,
                };
                let traffic = Traffic::Poisson {
                    rate,
                    keys: p.count("keys", 1)?.unwrap_or(1),
                    duration: p.duration("duration")?.unwrap_or(60 * NANOS_PER_SEC),
                    start: p.time("start")?.unwrap_or(DEFAULT_START),
                    seed: p.seed()?,
                };
                p.finish("rate, keys, duration, seed, start, vary")?;
                traffic
            }
            "page-loads" => {
                let traffic = Traffic::PageLoads {
                    users: p.count("users", 1)?.unwrap_or(10),
                    burst: p.count("burst", 1)?.unwrap_or(8),
                    think: p.duration("think")?.unwrap_or(5 * NANOS_PER_SEC),
                    spread: p.duration("spread")?.unwrap_or(50_000_000),
                    duration: p.duration("duration")?.unwrap_or(60 * NANOS_PER_SEC),
                    start: p.time("start")?.unwrap_or(DEFAULT_START),
                    seed: p.seed()?,
                };
                p.finish("users, burst, think, spread, duration, seed, start, vary")?;
                traffic
            }
            "capacity-drop" => {
                let capacity = p.count("capacity", 2)?;
                if capacity.is_some_and(|c| c > MAX_CAPACITY) {
                    return Err(usage(format!(
                        "capacity-drop: `capacity` must be at most {MAX_CAPACITY}"
                    )));
                }
                let latency = p.duration("latency")?;
                if latency == Some(0) {
                    return Err(usage("capacity-drop: `latency` must be above 0".into()));
                }
                let load = match p.take("load") {
                    None => 0.8,
                    Some(text) => text
                        .parse::<f64>()
                        .ok()
                        .filter(|l| l.is_finite() && *l > 0.0 && *l <= 100.0)
                        .ok_or_else(|| {
                            usage(format!(
                                "capacity-drop: `load={text}` must be a number above 0 (1 = the upstream's capacity), at most 100"
                            ))
                        })?,
                };
                let traffic = Traffic::CapacityDrop {
                    capacity,
                    latency,
                    load,
                    keys: p.count("keys", 1)?.unwrap_or(1),
                    duration: p.duration("duration")?.unwrap_or(60 * NANOS_PER_SEC),
                    start: p.time("start")?.unwrap_or(DEFAULT_START),
                    seed: p.seed()?,
                };
                p.finish("capacity, latency, load, keys, duration, seed, start, vary")?;
                traffic
            }
            other => {
                return Err(usage(format!(
                    "unknown generator `{other}`, expected one of {GENERATORS}"
                )));
            }
        };
        // Expected requests, so a typo cannot ask for a run of days.
        let expected = match traffic {
            Traffic::Poisson { rate, duration, .. } => {
                rate * (duration as f64 / NANOS_PER_SEC as f64)
            }
            Traffic::PageLoads {
                users,
                burst,
                think,
                duration,
                ..
            } => users as f64 * burst as f64 * (duration as f64 / think.max(1) as f64 + 1.0),
            Traffic::CapacityDrop { .. } => {
                drop_rate(&traffic) * (duration_of(&traffic) as f64 / NANOS_PER_SEC as f64)
            }
            Traffic::BoundaryBurst { .. } => 0.0,
        };
        if expected > MAX_COUNT as f64 {
            return Err(usage(format!(
                "{name}: these parameters make about {expected:.0} requests, more than {MAX_COUNT}"
            )));
        }
        Ok(Spec { traffic, vary })
    }

    /// Takes `capacity-drop`'s upstream from `--backend` where the spec does
    /// not give it.
    pub(crate) fn inherit(mut self, given: Option<&BackendSpec>) -> Spec {
        if let (
            Traffic::CapacityDrop {
                capacity, latency, ..
            },
            Some(given),
        ) = (&mut self.traffic, given)
        {
            capacity.get_or_insert(given.capacity);
            latency.get_or_insert(given.latency);
        }
        self
    }

    /// The modelled upstream this traffic is meant for: `capacity-drop`'s,
    /// whose capacity halves halfway (`--backend`'s queue, SLO and seed
    /// kept); for the others `given`, at a constant capacity.
    pub(crate) fn backend(&self, given: Option<BackendSpec>) -> Option<(BackendSpec, Schedule)> {
        match self.traffic {
            Traffic::CapacityDrop {
                capacity,
                latency,
                duration,
                start,
                ..
            } => {
                let capacity = capacity.unwrap_or(DROP_CAPACITY);
                let spec = BackendSpec {
                    capacity,
                    latency: latency.unwrap_or(DROP_LATENCY),
                    queue: given.and_then(|g| g.queue),
                    slo: given.map_or(DEFAULT_SLO, |g| g.slo),
                    seed: given.map_or(1, |g| g.seed),
                };
                let halfway = start.saturating_add(duration / 2);
                Some((spec, Schedule::step(capacity, halfway, capacity / 2)))
            }
            Traffic::BoundaryBurst { .. } | Traffic::Poisson { .. } | Traffic::PageLoads { .. } => {
                given.map(|g| (g, Schedule::constant(g.capacity)))
            }
        }
    }
}

/// `capacity-drop`'s arrivals per second: `load` of its upstream's
/// capacity before the drop.
fn drop_rate(traffic: &Traffic) -> f64 {
    match *traffic {
        Traffic::CapacityDrop {
            capacity,
            latency,
            load,
            ..
        } => {
            let capacity = capacity.unwrap_or(DROP_CAPACITY) as f64;
            let latency = latency.unwrap_or(DROP_LATENCY) as f64;
            load * capacity * NANOS_PER_SEC as f64 / latency
        }
        _ => 0.0,
    }
}

fn duration_of(traffic: &Traffic) -> Nanos {
    match *traffic {
        Traffic::Poisson { duration, .. }
        | Traffic::PageLoads { duration, .. }
        | Traffic::CapacityDrop { duration, .. } => duration,
        Traffic::BoundaryBurst { .. } => 0,
    }
}

/// `"50/s"` (any `gateway.toml` rate) or a plain number, per second.
fn per_second(text: &str) -> Option<f64> {
    let rate = match text.parse::<f64>() {
        Ok(n) => n,
        Err(_) => {
            let rate = parse_rate(text).ok()?;
            rate.tokens as f64 * NANOS_PER_SEC as f64 / rate.per as f64
        }
    };
    (rate.is_finite() && rate > 0.0).then_some(rate)
}

/// What a spec generated, for the report's header line and its JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Generated {
    pub(crate) generator: &'static str,
    /// `poisson 200/s for 1m, 50 keys varying ip, header:x-api-key (2
    /// consumers, then unknown keys)`.
    pub(crate) summary: String,
    /// Clients (users for `page-loads`): the keys of each varied kind.
    pub(crate) keys: u64,
    #[serde(flatten)]
    pub(crate) variation: Variation,
}

/// The records of `spec`, aimed at route `focus` of `config`, in time
/// order, and what they are.
pub(crate) fn records(
    spec: &Spec,
    config: &Config,
    focus: Option<usize>,
) -> Result<(impl Iterator<Item = Item> + use<>, Generated), Error> {
    let (generator, traffic, keys, events): (_, _, _, Box<dyn Iterator<Item = (Nanos, u64)>>) =
        match spec.traffic {
            Traffic::BoundaryBurst {
                n,
                window,
                spread,
                at,
                keys,
            } => {
                // The route's first limit sets the defaults.
                let form = focus
                    .and_then(|r| config.routes[r].limits.first())
                    .and_then(|&i| window_form(&config.limits[i].algorithm));
                let n = n.or(form.map(|(l, _)| l)).unwrap_or(100);
                let window = window
                    .or(form.map(|(_, w)| w))
                    .unwrap_or(60 * NANOS_PER_SEC)
                    .max(1);
                let spread = spread.unwrap_or(window / 100).max(1);
                let edge =
                    at.unwrap_or_else(|| DEFAULT_START.div_ceil(window).saturating_mul(window));
                let before = edge.saturating_sub(spread);
                let traffic = format!(
                    "{n} + {n} requests {} either side of a {} window edge",
                    nanos_text(spread),
                    nanos_text(window)
                );
                let events = (0..2 * n).map(move |i| {
                    let (base, j) = if i < n { (before, i) } else { (edge, i - n) };
                    let offset = (u128::from(spread) * u128::from(j) / u128::from(n)) as Nanos;
                    (base.saturating_add(offset), i % keys)
                });
                ("boundary-burst", traffic, keys, Box::new(events))
            }
            Traffic::Poisson {
                rate,
                keys,
                duration,
                start,
                seed,
            } => {
                let traffic = format!("{}/s for {}", rate_text(rate), nanos_text(duration));
                let events = poisson(rate, keys, start, duration, seed);
                ("poisson", traffic, keys, Box::new(events))
            }
            Traffic::CapacityDrop {
                capacity,
                latency,
                load,
                keys,
                duration,
                start,
                seed,
            } => {
                let rate = drop_rate(&spec.traffic);
                let capacity = capacity.unwrap_or(DROP_CAPACITY);
                let traffic = format!(
                    "{}/s for {} ({} of an upstream of {capacity} × {} that halves to {} halfway)",
                    rate_text(rate),
                    nanos_text(duration),
                    rate_text(load),
                    nanos_text(latency.unwrap_or(DROP_LATENCY)),
                    (capacity / 2).max(1),
                );
                let events = poisson(rate, keys, start, duration, seed);
                ("capacity-drop", traffic, keys, Box::new(events))
            }
            Traffic::PageLoads {
                users,
                burst,
                think,
                spread,
                duration,
                start,
                seed,
            } => {
                let traffic = format!(
                    "{users} users, pages of {burst} in {}, think {}, for {}",
                    nanos_text(spread),
                    nanos_text(think),
                    nanos_text(duration)
                );
                let events = PageLoads::new(users, burst, think, spread, start, duration, seed);
                ("page-loads", traffic, users, Box::new(events))
            }
        };
    let clients = Clients::new(config, focus, keys, spec.vary.as_deref())?;
    let variation = clients.variation();
    let generated = Generated {
        generator,
        summary: format!("{generator} {traffic}, {}", variation.text),
        keys,
        variation,
    };
    let records = events
        .enumerate()
        .map(move |(i, (time, client))| Ok(clients.record(i as u64 + 1, time, client)));
    Ok((records, generated))
}

/// Poisson arrivals at `rate` per second from `start` for `duration`, each
/// from one of `keys` clients at random.
fn poisson(
    rate: f64,
    keys: u64,
    start: Nanos,
    duration: Nanos,
    seed: u64,
) -> impl Iterator<Item = (Nanos, u64)> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let end = start.saturating_add(duration);
    let mean_gap = NANOS_PER_SEC as f64 / rate;
    let mut now = start as f64;
    std::iter::from_fn(move || {
        now += exponential(&mut rng, mean_gap);
        let t = now as Nanos;
        (t < end).then(|| (t, rng.u64(0..keys)))
    })
}

/// An exponential gap of mean `mean` (ns).
fn exponential(rng: &mut fastrand::Rng, mean: f64) -> f64 {
    // 1 − U is in (0, 1]: the logarithm is finite.
    -(1.0 - rng.f64()).ln() * mean
}

/// Users loading pages: each load a burst, then a think time.
struct PageLoads {
    rng: fastrand::Rng,
    /// (time, user, request of the burst): the next requests, earliest first.
    pending: BinaryHeap<Reverse<(Nanos, u64, u64)>>,
    burst: u64,
    think: f64,
    spread: Nanos,
    end: Nanos,
}

impl PageLoads {
    fn new(
        users: u64,
        burst: u64,
        think: Nanos,
        spread: Nanos,
        start: Nanos,
        duration: Nanos,
        seed: u64,
    ) -> PageLoads {
        let mut rng = fastrand::Rng::with_seed(seed);
        let pending = (0..users)
            .map(|user| Reverse((start.saturating_add(rng.u64(0..think.max(1))), user, 0)))
            .collect();
        PageLoads {
            rng,
            pending,
            burst,
            think: think as f64,
            spread,
            end: start.saturating_add(duration),
        }
    }
}

impl Iterator for PageLoads {
    type Item = (Nanos, u64);

    fn next(&mut self) -> Option<(Nanos, u64)> {
        loop {
            let Reverse((time, user, request)) = self.pending.pop()?;
            if time >= self.end {
                // Later loads of this user are later still.
                continue;
            }
            if request == 0 {
                let step = self.spread / self.burst;
                for k in 1..self.burst {
                    self.pending.push(Reverse((
                        time.saturating_add(k.saturating_mul(step)),
                        user,
                        k,
                    )));
                }
                let gap = exponential(&mut self.rng, self.think) as Nanos;
                self.pending
                    .push(Reverse((time.saturating_add(gap.max(1)), user, 0)));
            }
            return Some((time, user));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::trace::Record;
    use http::Method;
    use std::net::{IpAddr, Ipv4Addr};
    use std::path::Path;

    fn config() -> Config {
        let text = r#"
[limits.per_key]
key = ["header:x-api-key", "query:page", "cookie:sid", "ip"]
algorithm = "fixed_window"
limit = 50
window = "10s"

[[routes]]
name = "api"
match = { path_prefix = "/api", methods = ["POST"], host = "api.example.com" }
respond = { status = 200 }
limits = ["per_key"]
"#;
        Config::from_bytes(Path::new("gateway.toml"), text.as_bytes()).unwrap()
    }

    fn collect(spec: &str) -> Vec<Record> {
        let spec = Spec::parse(spec).unwrap();
        records(&spec, &config(), Some(0))
            .unwrap()
            .0
            .map(|r| r.unwrap())
            .collect()
    }

    #[test]
    fn boundary_burst_straddles_a_window_edge() {
        let records = collect("boundary-burst");
        assert_eq!(records.len(), 100, "n = the limit, on each side");
        let edge = DEFAULT_START.div_ceil(10 * NANOS_PER_SEC) * 10 * NANOS_PER_SEC;
        assert!(
            records[..50]
                .iter()
                .all(|r| r.time < edge && r.time >= edge - 100_000_000)
        );
        assert!(
            records[50..]
                .iter()
                .all(|r| r.time >= edge && r.time < edge + 100_000_000)
        );
        let r = &records[0];
        assert_eq!(r.parts.method, Method::POST);
        assert_eq!(r.parts.uri, "/api?page=client-0");
        assert_eq!(r.parts.headers["host"], "api.example.com");
        assert_eq!(r.parts.headers["x-api-key"], "client-0");
        assert_eq!(r.parts.headers["cookie"], "sid=client-0");
        assert_eq!(r.peer, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 0)));
    }

    #[test]
    fn poisson_is_deterministic_and_near_its_rate() {
        let a = collect("poisson:rate=100/s,keys=5,duration=10s");
        let b = collect("poisson:rate=100,keys=5,duration=10s,seed=1");
        let c = collect("poisson:rate=100/s,keys=5,duration=10s,seed=2");
        let times = |v: &[Record]| v.iter().map(|r| r.time).collect::<Vec<_>>();
        assert_eq!(times(&a), times(&b));
        assert_ne!(times(&a), times(&c));
        // 1000 expected; a Poisson count's sd is ~32.
        assert!((800..1200).contains(&a.len()), "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].time <= w[1].time));
        let keys: std::collections::HashSet<_> = a
            .iter()
            .map(|r| r.parts.headers["x-api-key"].clone())
            .collect();
        assert_eq!(keys.len(), 5);
    }

    #[test]
    fn capacity_drop_halves_its_upstream_halfway() {
        let text = "capacity-drop:capacity=10,latency=50ms,duration=20s";
        let spec = Spec::parse(text).unwrap();
        let (backend, schedule) = spec.backend(None).unwrap();
        assert_eq!((backend.capacity, backend.latency), (10, 50_000_000));
        let halfway = DEFAULT_START + 10 * NANOS_PER_SEC;
        assert_eq!(schedule.steps(), [(0, 10), (halfway, 5)]);
        // 0.8 of 10 / 50 ms = 160/s for 20 s: 3200 expected, sd ~57.
        let records = collect(text);
        assert!((2900..3500).contains(&records.len()), "{}", records.len());
        // --backend gives what the spec does not, and its queue, SLO and
        // seed; the spec's own values win.
        let given = BackendSpec::parse("capacity=40,latency=1s,queue=7,seed=3").unwrap();
        let (inherited, schedule) = Spec::parse("capacity-drop:latency=20ms")
            .unwrap()
            .inherit(Some(&given))
            .backend(Some(given))
            .unwrap();
        assert_eq!(
            (
                inherited.capacity,
                inherited.latency,
                inherited.queue,
                inherited.seed
            ),
            (40, 20_000_000, Some(7), 3)
        );
        assert_eq!(schedule.at(u64::MAX), 20);
        // Other traffic meets --backend as given, at a constant capacity.
        let poisson = Spec::parse("poisson:rate=5").unwrap();
        assert_eq!(poisson.backend(None), None);
        assert_eq!(poisson.backend(Some(given)).unwrap().1.steps(), [(0, 40)]);
    }

    #[test]
    fn page_loads_come_in_bursts() {
        let records = collect("page-loads:users=3,burst=8,think=2s,duration=20s");
        assert!(records.windows(2).all(|w| w[0].time <= w[1].time));
        assert!(records.len() >= 8 * 3, "{}", records.len());
        // The first eight of one user are within the 50 ms spread.
        let first_user: Vec<Nanos> = records
            .iter()
            .filter(|r| r.parts.headers["x-api-key"] == "client-0")
            .map(|r| r.time)
            .take(8)
            .collect();
        assert!(first_user[7] - first_user[0] < 50_000_000);
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (spec, needle) in [
            ("burst", "unknown generator `burst`"),
            ("poisson:keys=3", "needs `rate=R`"),
            ("poisson:rate=fast", "`rate=fast`"),
            ("poisson:rate=1/s,colour=red", "unknown parameter `colour`"),
            ("page-loads:users=0", "`users=0`"),
            ("boundary-burst:window=soon", "`window=soon`"),
            ("boundary-burst:n", "is not key=value"),
            ("poisson:rate=1000000/s,duration=1d", "more than"),
            ("page-loads:users=1000,think=1ms,duration=1d", "more than"),
            ("poisson:rate=1/s,vary=", "`vary=` needs key kinds"),
            ("poisson:rate=1/s,vary=ip,ip", "vary: `ip` is given twice"),
            (
                "poisson:rate=1/s,vary=ip,keys=2,vary=ip",
                "`vary` is given twice",
            ),
            ("poisson:rate=1/s,keys=2,ip", "`ip` is not key=value"),
        ] {
            let Err(Error::Usage(message)) = Spec::parse(spec) else {
                panic!("accepted {spec}");
            };
            assert!(message.contains(needle), "{spec}: {message}");
        }
    }

    #[test]
    fn vary_takes_the_items_up_to_the_next_parameter() {
        let spec = Spec::parse("poisson:rate=5/s,vary=ip,header:x-api-key,keys=3").unwrap();
        assert_eq!(
            spec.vary.as_deref(),
            Some(&["ip".to_owned(), "header:x-api-key".to_owned()][..])
        );
        assert!(matches!(spec.traffic, Traffic::Poisson { keys: 3, .. }));
        assert_eq!(Spec::parse("poisson:rate=5/s").unwrap().vary, None);
    }

    #[test]
    fn generated_says_what_varied() {
        let spec = Spec::parse("poisson:rate=200/s,keys=50,vary=ip,query:page").unwrap();
        let (made, generated) = records(&spec, &config(), Some(0)).unwrap();
        assert_eq!(generated.generator, "poisson");
        assert_eq!(generated.keys, 50);
        assert_eq!(
            generated.summary,
            "poisson 200/s for 1m, 50 keys varying query:page, ip; \
             fixed: header:x-api-key (one unknown key), cookie:sid"
        );
        let cookies: std::collections::HashSet<_> = made
            .take(500)
            .map(|r| r.unwrap().parts.headers["cookie"].clone())
            .collect();
        assert_eq!(cookies.len(), 1, "cookie:sid is fixed");
        let spec = Spec::parse("boundary-burst:keys=1").unwrap();
        let (_, generated) = records(&spec, &config(), Some(0)).unwrap();
        assert_eq!(
            generated.summary,
            "boundary-burst 50 + 50 requests 100ms either side of a 10s window edge, \
             1 key: header:x-api-key (one unknown key), query:page, cookie:sid, ip"
        );
    }
}
