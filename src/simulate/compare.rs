//! `--compare`: one limit's parameters re-expressed in another algorithm at
//! the same long-run rate.
//!
//! Every rate algorithm has a *window form* `(L, W)`: `L` cost units per
//! `W`. For the window algorithms it is their `limit` and `window`; a token
//! bucket of `capacity` C refilled at `r` is `(C, C / r)`, the time it takes
//! to refill from empty; a leaky bucket of `capacity` B leaking at `r`
//! admits `B + 1` at once, so it is `(B + 1, (B + 1) / r)`. A limit mapped to
//! another algorithm keeps its window form:
//!
//! | to | parameters |
//! | --- | --- |
//! | `fixed_window`, `sliding_window`, `sliding_log` | `limit = L`, `window = W` |
//! | `token_bucket` | `capacity = L`, `refill = L per W` |
//! | `leaky_bucket` | `capacity = L − 1`, `rate = L per W`, `mode = "reject"` |
//!
//! so each admits `L` at once from rest and `L / W` in the long run. Example:
//! `token_bucket` with `capacity = 20, refill = "10/s"` is `(20, 2 s)`: a
//! `fixed_window` of 20 per 2 s, a `leaky_bucket` of capacity 19 at 10/s.
//! A limit already of the target kind is kept as configured.
//!
//! The exact rule false allows and denies are judged by is the
//! `sliding_log` of the window form (see `tracker`). `concurrency` has no
//! rate: it is never mapped and never judged.
//!
//! Against a modelled upstream (`--backend`) three more variants compare
//! limits on requests in flight (the rate limits as configured): `none`,
//! every limit in shadow (the upstream sees everything); `concurrency=N`,
//! every slot limit static at `max = N` (an `adaptive` one too); and
//! `adaptive`, every `concurrency` limit made `adaptive` with the defaults'
//! `min = 1` and `max = 1000` (or its `max`, if higher), starting at its
//! `max` and node-local, without plans (an adaptive limit has none). So
//! `--compare concurrency=10,adaptive` shows static against adaptive in
//! one table, whichever of the two the configuration is written with.

use std::sync::Arc;

use super::Error;
use crate::config::Config;
use crate::limit::adaptive::{self, Params};
use crate::limit::sliding_window::MAX_LIMIT;
use crate::limit::{Algorithm, LeakyMode, Nanos, Rate};

/// An algorithm `--compare` can map a limit to, or (for a modelled
/// upstream, `--backend`) what to do with the concurrency limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    FixedWindow,
    SlidingWindow,
    SlidingLog,
    TokenBucket,
    LeakyBucket,
    /// `none`: every limit in shadow (counted, refusing nothing), so the
    /// upstream sees all the traffic.
    Unlimited,
    /// `concurrency=N`: every `concurrency` limit (and its plans) with
    /// `max = N`, an `adaptive` one made static at `N`; the rate limits as
    /// configured.
    Concurrency(u64),
    /// `adaptive`: every `concurrency` limit made `adaptive` (module doc);
    /// the rate limits as configured.
    Adaptive,
}

impl Kind {
    pub(crate) const ALL: [Kind; 5] = [
        Kind::FixedWindow,
        Kind::SlidingWindow,
        Kind::SlidingLog,
        Kind::TokenBucket,
        Kind::LeakyBucket,
    ];

    pub(crate) fn name(self) -> String {
        match self {
            Kind::FixedWindow => "fixed_window".into(),
            Kind::SlidingWindow => "sliding_window".into(),
            Kind::SlidingLog => "sliding_log".into(),
            Kind::TokenBucket => "token_bucket".into(),
            Kind::LeakyBucket => "leaky_bucket".into(),
            Kind::Unlimited => "none".into(),
            Kind::Concurrency(max) => format!("concurrency={max}"),
            Kind::Adaptive => "adaptive".into(),
        }
    }

    fn parse(name: &str) -> Result<Kind, Error> {
        if name == "concurrency" {
            return Err(Error::Usage(
                "--compare: concurrency has no rate to compare; use fixed_window, sliding_window, sliding_log, token_bucket or leaky_bucket (or, with --backend, none, concurrency=N and adaptive)".into(),
            ));
        }
        if name == "none" {
            return Ok(Kind::Unlimited);
        }
        if name == "adaptive" {
            return Ok(Kind::Adaptive);
        }
        if let Some(max) = name.strip_prefix("concurrency=") {
            return match max.trim().parse::<u64>() {
                Ok(max) if max > 0 => Ok(Kind::Concurrency(max)),
                _ => Err(Error::Usage(format!(
                    "--compare: `{name}`: concurrency=N needs a whole number above 0"
                ))),
            };
        }
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                let names: Vec<String> = Kind::ALL.iter().map(|k| k.name()).collect();
                let hint = names
                    .iter()
                    .find(|n| strsim::levenshtein(n, name) <= 3)
                    .map(|n| format!(" (did you mean `{n}`?)"))
                    .unwrap_or_default();
                Error::Usage(format!(
                    "--compare: unknown algorithm `{name}`, expected one of {}{hint}",
                    names.join(", ")
                ))
            })
    }
}

/// The algorithm name as `gateway.toml` spells it.
pub(crate) fn algorithm_name(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow { .. } => "fixed_window",
        Algorithm::SlidingWindow { .. } => "sliding_window",
        Algorithm::SlidingLog { .. } => "sliding_log",
        Algorithm::TokenBucket { .. } => "token_bucket",
        Algorithm::LeakyBucket { .. } => "leaky_bucket",
        Algorithm::Concurrency { .. } => "concurrency",
        Algorithm::Adaptive { .. } => "adaptive",
    }
}

/// `--compare a,b,c` (already split at commas), each once, in order.
pub(crate) fn parse_list(names: &[String]) -> Result<Vec<Kind>, Error> {
    let mut kinds = Vec::new();
    for name in names.iter().map(|n| n.trim()).filter(|n| !n.is_empty()) {
        let kind = Kind::parse(name)?;
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    Ok(kinds)
}

/// A `concurrency=N` or `adaptive` variant needs a slot limit to set.
pub(crate) fn check_applies(config: &Config, kinds: &[Kind]) -> Result<(), Error> {
    let has_slots = config.limits.iter().any(|l| {
        std::iter::once(&l.algorithm)
            .chain(l.plans.iter().map(|(_, a)| a))
            .any(|a| {
                matches!(
                    a,
                    Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. }
                )
            })
    });
    match kinds
        .iter()
        .find(|k| matches!(k, Kind::Concurrency(_) | Kind::Adaptive))
    {
        Some(kind) if !has_slots => Err(Error::Usage(format!(
            "--compare: `{}` sets the concurrency limits, and the configuration has none (add one, e.g. key = \"route\", algorithm = \"concurrency\")",
            kind.name()
        ))),
        _ => Ok(()),
    }
}

/// A static `concurrency` limit of `max` as an adaptive one (module doc).
fn adaptive_from(max: u64) -> Algorithm {
    let initial = u32::try_from(max)
        .unwrap_or(u32::MAX)
        .clamp(1, adaptive::MAX_LIMIT);
    let params = Params::new(1, initial.max(1000), initial)
        .expect("1 <= initial <= max <= MAX_LIMIT by construction");
    Algorithm::Adaptive { params }
}

/// `(L, W)`: cost units per window (see the module doc). `None` for
/// concurrency.
pub(crate) fn window_form(algorithm: &Algorithm) -> Option<(u64, Nanos)> {
    match *algorithm {
        Algorithm::FixedWindow { limit, window }
        | Algorithm::SlidingWindow { limit, window }
        | Algorithm::SlidingLog { limit, window } => Some((limit, window)),
        Algorithm::TokenBucket {
            capacity, refill, ..
        } => Some((capacity, time_for(capacity, refill))),
        Algorithm::LeakyBucket { capacity, rate, .. } => {
            let q = capacity.saturating_add(1);
            Some((q, time_for(q, rate)))
        }
        Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. } => None,
    }
}

/// `(capacity, rate)`: the burst and long-run rate a span is measured
/// against (`capacity + rate × span`). Buckets as configured (a leaky
/// bucket's burst is `capacity + 1`), windows as `(L, L per W)`.
pub(crate) fn bucket_form(algorithm: &Algorithm) -> Option<(u64, Rate)> {
    match *algorithm {
        Algorithm::TokenBucket {
            capacity, refill, ..
        } => Some((capacity, refill)),
        Algorithm::LeakyBucket { capacity, rate, .. } => Some((capacity.saturating_add(1), rate)),
        _ => {
            let (limit, window) = window_form(algorithm)?;
            Some((
                limit,
                Rate {
                    tokens: limit,
                    per: window,
                },
            ))
        }
    }
}

/// Nanoseconds `units` take at `rate` (at least 1).
fn time_for(units: u64, rate: Rate) -> Nanos {
    let t = u128::from(units) * u128::from(rate.per) / u128::from(rate.tokens.max(1));
    u64::try_from(t).unwrap_or(u64::MAX).max(1)
}

/// `algorithm` as `kind` at the same long-run rate (a kind that maps no
/// rate, `none` or `concurrency=N`, leaves it as it is).
pub(crate) fn map_to(algorithm: &Algorithm, kind: Kind) -> Algorithm {
    let Some((limit, window)) = window_form(algorithm) else {
        return *algorithm;
    };
    let rate = Rate {
        tokens: limit,
        per: window,
    };
    match (kind, algorithm) {
        (Kind::TokenBucket, Algorithm::TokenBucket { .. })
        | (Kind::LeakyBucket, Algorithm::LeakyBucket { .. }) => *algorithm,
        (Kind::FixedWindow, _) => Algorithm::FixedWindow { limit, window },
        (Kind::SlidingWindow, _) => Algorithm::SlidingWindow {
            limit: limit.min(MAX_LIMIT),
            window,
        },
        (Kind::SlidingLog, _) => Algorithm::SlidingLog { limit, window },
        (Kind::TokenBucket, _) => Algorithm::TokenBucket {
            capacity: limit,
            refill: rate,
            wait: 0,
        },
        (Kind::LeakyBucket, _) => Algorithm::LeakyBucket {
            capacity: limit - 1,
            rate,
            mode: LeakyMode::Reject,
        },
        (Kind::Unlimited | Kind::Concurrency(_) | Kind::Adaptive, _) => *algorithm,
    }
}

/// `config` with every rate limit (and each of its plans) as `kind`; for
/// `none` every limit in shadow, for `concurrency=N` every slot limit
/// static at `N`, for `adaptive` every concurrency limit adaptive.
pub(crate) fn variant(config: &Config, kind: Kind) -> Config {
    let mut config = config.clone();
    for limit in &mut config.limits {
        match kind {
            Kind::Unlimited => limit.shadow = true,
            Kind::Concurrency(max) => {
                let at_max = |algorithm: &mut Algorithm| {
                    if let Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. } = algorithm {
                        *algorithm = Algorithm::Concurrency { max };
                    }
                };
                at_max(&mut limit.algorithm);
                for (_, algorithm) in &mut limit.plans {
                    at_max(algorithm);
                }
            }
            Kind::Adaptive => {
                if let Algorithm::Concurrency { max } = limit.algorithm {
                    limit.algorithm = adaptive_from(max);
                    limit.plans.clear();
                    limit.local = true;
                }
            }
            _ => {
                limit.algorithm = map_to(&limit.algorithm, kind);
                for (_, algorithm) in &mut limit.plans {
                    *algorithm = map_to(algorithm, kind);
                }
            }
        }
    }
    // The consumers table is shared, not copied.
    config.consumers = Arc::clone(&config.consumers);
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::NANOS_PER_SEC as S;

    #[test]
    fn the_documented_example() {
        let bucket = Algorithm::TokenBucket {
            capacity: 20,
            refill: Rate { tokens: 10, per: S },
            wait: 0,
        };
        assert_eq!(window_form(&bucket), Some((20, 2 * S)));
        assert_eq!(
            map_to(&bucket, Kind::FixedWindow),
            Algorithm::FixedWindow {
                limit: 20,
                window: 2 * S
            }
        );
        let leaky = map_to(&bucket, Kind::LeakyBucket);
        assert_eq!(window_form(&leaky), Some((20, 2 * S)));
        assert_eq!(map_to(&bucket, Kind::TokenBucket), bucket);
        let back = map_to(&map_to(&bucket, Kind::SlidingLog), Kind::TokenBucket);
        assert_eq!(
            back,
            Algorithm::TokenBucket {
                capacity: 20,
                refill: Rate {
                    tokens: 20,
                    per: 2 * S
                },
                wait: 0,
            }
        );
        let conc = Algorithm::Concurrency { max: 3 };
        assert_eq!(map_to(&conc, Kind::SlidingLog), conc);
    }

    #[test]
    fn names_are_checked() {
        let list =
            |names: &[&str]| parse_list(&names.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            list(&["sliding_log", "fixed_window", "sliding_log"]).unwrap(),
            [Kind::SlidingLog, Kind::FixedWindow]
        );
        let Err(Error::Usage(message)) = list(&["fixed_windw"]) else {
            panic!("accepted a misspelt name");
        };
        assert!(message.contains("did you mean `fixed_window`"), "{message}");
        assert!(list(&["concurrency"]).is_err());
        assert_eq!(
            list(&["concurrency=10", "adaptive"]).unwrap(),
            [Kind::Concurrency(10), Kind::Adaptive]
        );
    }

    /// One `concurrency` limit of `max = 10` with a plan, and a rate limit.
    fn slots_config(algorithm: &str) -> Config {
        let text = format!(
            "[limits.backend]\nkey = \"route\"\n{algorithm}\n[limits.rate]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n[[routes]]\nname = \"r\"\nmatch = {{ path_prefix = \"/\" }}\nrespond = {{ status = 200 }}\nlimits = [\"rate\", \"backend\"]\n"
        );
        Config::from_bytes(std::path::Path::new("gateway.toml"), text.as_bytes())
            .expect("a valid configuration")
    }

    #[test]
    fn adaptive_and_static_variants_swap_the_slot_limits_only() {
        let written =
            slots_config("algorithm = \"concurrency\"\nmax = 10\nplans = { gold = { max = 20 } }");
        let adaptive = variant(&written, Kind::Adaptive);
        let backend = &adaptive.limits[0];
        assert_eq!(
            backend.algorithm,
            Algorithm::Adaptive {
                params: Params::new(1, 1000, 10).unwrap()
            }
        );
        assert!(backend.plans.is_empty() && backend.local);
        assert_eq!(
            adaptive.limits[1], written.limits[1],
            "the rate limit as written"
        );
        // A static limit above adaptive's default max keeps its own.
        let wide = variant(
            &slots_config("algorithm = \"concurrency\"\nmax = 5000"),
            Kind::Adaptive,
        );
        assert_eq!(
            wide.limits[0].algorithm,
            Algorithm::Adaptive {
                params: Params::new(1, 5000, 5000).unwrap()
            }
        );
        // And back: concurrency=N makes an adaptive limit static.
        let written = slots_config("algorithm = \"adaptive\"\nmin = 2\nmax = 50");
        let fixed = variant(&written, Kind::Concurrency(7));
        assert_eq!(fixed.limits[0].algorithm, Algorithm::Concurrency { max: 7 });
        assert_eq!(fixed.limits[1], written.limits[1]);
        assert!(check_applies(&written, &[Kind::Adaptive, Kind::Concurrency(7)]).is_ok());
        let rates_only = slots_config("algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"");
        let Err(Error::Usage(message)) = check_applies(&rates_only, &[Kind::Adaptive]) else {
            panic!("an adaptive variant of a configuration without slot limits");
        };
        assert!(
            message.contains("`adaptive` sets the concurrency limits"),
            "{message}"
        );
    }
}
