//! What a slot limit (`concurrency`) does when its slots run short: the
//! `reserve` a sheddable request may not take, and the `queue` a request
//! waits in instead of being refused at once (its serde mirror; its check,
//! which reads keys, is `limits.rs`'s); and the `priority` of routes and
//! consumers that both read. `limits.rs` and `routes.rs` / `consumers.rs`
//! call them.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::checker::Checker;
use super::error::KeyPath;
use super::raw::OneOrMany;
use super::units::parse_percent;
use crate::limit::{Algorithm, Priority, Reserve};

/// `reserve = "20%"` or `reserve = 3`, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawReserve {
    Slots(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawReserve {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ReserveVisitor;
        impl Visitor<'_> for ReserveVisitor {
            type Value = RawReserve;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number of slots or a percentage like \"20%\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawReserve, E> {
                Ok(RawReserve::Slots(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawReserve, E> {
                Ok(RawReserve::Slots(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawReserve, E> {
                Ok(RawReserve::Text(v.to_owned()))
            }
        }
        deserializer.deserialize_any(ReserveVisitor)
    }
}

/// `queue = { max_wait = "200ms", size = 100, fair_by = "consumer" }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQueue {
    pub(crate) max_wait: Option<String>,
    pub(crate) size: Option<u64>,
    /// A key, as `limits.*.key`: round-robin over its values.
    pub(crate) fair_by: Option<OneOrMany<String>>,
}

/// Whether `algorithm` hands out slots (what `reserve` and `queue` apply to).
pub(super) fn is_slot_limit(algorithm: &Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. }
    )
}

/// The smallest slot count of the limit and its plans (what an absolute
/// reserve must stay below).
fn least_max(algorithm: &Algorithm, plans: &[Algorithm]) -> Option<u64> {
    std::iter::once(algorithm)
        .chain(plans)
        .filter_map(|a| match a {
            Algorithm::Concurrency { max } => Some(*max),
            // An absolute reserve must leave the smallest limit it can fall to.
            Algorithm::Adaptive { params } => Some(u64::from(params.min())),
            _ => None,
        })
        .min()
}

/// `reserve`: `"N%"` below 100 % or a count below every `max` of the limit;
/// default `"20%"`. Only on slot limits.
pub(super) fn check_reserve(
    c: &mut Checker,
    path: KeyPath,
    raw: Option<&RawReserve>,
    algorithm: &Algorithm,
    plans: &[Algorithm],
) -> Reserve {
    let Some(raw) = raw else {
        return Reserve::default();
    };
    if !is_slot_limit(algorithm) {
        c.problem(path, "applies to concurrency and adaptive limits only");
        return Reserve::default();
    }
    match raw {
        RawReserve::Text(text) => match parse_percent(text) {
            // Whole percents: a tenth of a slot of a percent is noise.
            Some(permille) if permille % 10 == 0 && permille < 1000 => {
                Reserve::Percent((permille / 10) as u8)
            }
            _ => {
                c.problem(
                    path,
                    format!("`{text}`: expected a whole percentage below 100%, like \"20%\", or a number of slots"),
                );
                Reserve::default()
            }
        },
        RawReserve::Slots(n) => {
            let max = least_max(algorithm, plans).unwrap_or(u64::MAX);
            match u64::try_from(*n) {
                Ok(n) if n < max => Reserve::Slots(n),
                _ => {
                    c.problem(
                        path,
                        format!("`{n}`: expected 0 to {} (below `max`, or no sheddable request could pass)", max.saturating_sub(1)),
                    );
                    Reserve::default()
                }
            }
        }
    }
}

/// `priority = "critical" | "normal" | "sheddable"` of a route or consumer.
pub(super) fn check_priority(
    c: &mut Checker,
    path: KeyPath,
    raw: Option<&str>,
) -> Option<Priority> {
    let text = raw?;
    let labels = Priority::ALL.map(Priority::label);
    c.one_of(path, text, &labels).and_then(Priority::parse)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{Config, KeyPart};

    /// A config with one limit of `algorithm` and `extra` keys, a route
    /// with `route` keys and a consumer with `consumer` keys.
    fn load(algorithm: &str, extra: &str, route: &str, consumer: &str) -> Result<Config, String> {
        let text = format!(
            r#"[upstreams.api]
url = "http://127.0.0.1:9"

[limits.backend]
key = "route"
{algorithm}
{extra}

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
limits = ["backend"]
{route}

[consumers."k-1"]
consumer = "one"
{consumer}
"#
        );
        Config::from_bytes(Path::new("g.toml"), text.as_bytes()).map_err(|e| e.to_string())
    }

    const CONCURRENCY: &str = "algorithm = \"concurrency\"\nmax = 10";

    #[test]
    fn reserve_queue_and_priorities_are_read() {
        let extra = r#"reserve = 3
queue = { max_wait = "250ms", size = 7, fair_by = ["consumer", "ip"] }"#;
        let config = load(
            CONCURRENCY,
            extra,
            "priority = \"sheddable\"",
            "priority = \"critical\"",
        )
        .expect("valid");
        let limit = &config.limits[0];
        assert_eq!(limit.reserve, Reserve::Slots(3));
        let queue = limit.queue.as_ref().expect("a queue");
        assert_eq!(queue.params.max_wait, 250_000_000);
        assert_eq!(queue.params.size, 7);
        assert_eq!(queue.fair_by, [KeyPart::Consumer, KeyPart::Ip]);
        assert_eq!(config.routes[0].priority, Priority::Sheddable);
        assert_eq!(config.consumers["k-1"].priority, Some(Priority::Critical));
        // Defaults: 20 %, no queue, normal, the route's.
        let config = load(CONCURRENCY, "", "", "").expect("valid");
        assert_eq!(config.limits[0].reserve, Reserve::Percent(20));
        assert_eq!(config.limits[0].queue, None);
        assert_eq!(config.routes[0].priority, Priority::Normal);
        assert_eq!(config.consumers["k-1"].priority, None);
        let config = load(
            CONCURRENCY,
            "reserve = \"35%\"\nqueue = { max_wait = \"1s\" }",
            "",
            "",
        )
        .expect("valid");
        assert_eq!(config.limits[0].reserve, Reserve::Percent(35));
        assert_eq!(
            config.limits[0].queue.as_ref().map(|q| q.params.size),
            Some(100)
        );
    }

    #[test]
    fn bad_values_are_reported_with_their_keys() {
        let bucket = "algorithm = \"token_bucket\"\ncapacity = 5\nrefill = \"1/s\"";
        let cases = [
            (
                bucket,
                "reserve = \"20%\"",
                "",
                "",
                "limits.backend.reserve",
                "concurrency and adaptive limits only",
            ),
            (
                bucket,
                "queue = { max_wait = \"1s\" }",
                "",
                "",
                "limits.backend.queue",
                "concurrency and adaptive limits only",
            ),
            (
                CONCURRENCY,
                "reserve = \"100%\"",
                "",
                "",
                "limits.backend.reserve",
                "below 100%",
            ),
            (
                CONCURRENCY,
                "reserve = \"12.5%\"",
                "",
                "",
                "limits.backend.reserve",
                "whole percentage",
            ),
            (
                CONCURRENCY,
                "reserve = 10",
                "",
                "",
                "limits.backend.reserve",
                "expected 0 to 9",
            ),
            (
                CONCURRENCY,
                "reserve = -1",
                "",
                "",
                "limits.backend.reserve",
                "expected 0 to 9",
            ),
            (
                CONCURRENCY,
                "queue = { size = 3 }",
                "",
                "",
                "limits.backend.queue",
                "needs `max_wait`",
            ),
            (
                CONCURRENCY,
                "queue = { max_wait = \"2m\" }",
                "",
                "",
                "limits.backend.queue.max_wait",
                "at most",
            ),
            (
                CONCURRENCY,
                "queue = { max_wait = \"1s\", size = 0 }",
                "",
                "",
                "limits.backend.queue.size",
                "at least 1",
            ),
            (
                CONCURRENCY,
                "queue = { max_wait = \"1s\", fair_by = \"nope\" }",
                "",
                "",
                "limits.backend.queue.fair_by",
                "unknown key kind",
            ),
            (
                CONCURRENCY,
                "queue = { max_wait = \"1s\", wait = 1 }",
                "",
                "",
                "wait",
                "unknown",
            ),
            (
                CONCURRENCY,
                "",
                "priority = \"high\"",
                "",
                "routes[0].priority",
                "critical, normal, sheddable",
            ),
            (
                CONCURRENCY,
                "",
                "",
                "priority = \"urgent\"",
                "priority",
                "critical, normal, sheddable",
            ),
        ];
        for (algorithm, extra, route, consumer, at, says) in cases {
            let error = load(algorithm, extra, route, consumer).expect_err(extra);
            assert!(
                error.contains(at) && error.contains(says),
                "{extra} {route} {consumer}: {error}"
            );
        }
    }
}
