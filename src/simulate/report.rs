//! The numbers of a run, as a table or as JSON.
//!
//! One row per variant, route and limit of the route's stack:
//!
//! | column | meaning |
//! | --- | --- |
//! | `requests` | requests of the route the limit applied to (it had a key) |
//! | `admitted` | of those, admitted by the whole stack (all or nothing) |
//! | `denied` | denied by this limit (a shadow limit: would have denied) |
//! | `peak` | most cost units admitted for one key in any span of the limit's window (the limit's keys, whichever route charged them) |
//! | `limit` / `window` | the limit's window form `L` per `W` (see `compare`) |
//! | `excess` | the worst excess over `capacity + rate × span` |
//! | `false allow` / `false deny` | share of `requests` this limit admitted although `L` units were already admitted for the key in the last `W` (an exact sliding log holding the same admissions would deny), and the share it denied although they fit (each free unit counted once per window) |
//!
//! | `keys` | distinct keys the limit saw (the limit's, whichever route sent them) |
//!
//! A token limit (`unit = "tokens"`) counts tokens where the others count
//! cost units: its `peak`, `limit` and `excess` are tokens (what admitted
//! requests used once settled, their reservation when the trace did not
//! say), and its row adds `tokens` ([`TokenRow`]), also written below the
//! table. A spend budget (`unit = "usd"`) counts micro-dollars the same
//! way: each request priced by its body's `model` (`[prices]`), its
//! trace's `tokens` priced as the gateway prices a usage known only by its
//! total (the prompt's estimate as input, the rest output); its row adds
//! `usd` ([`UsdRow`]: what its admitted requests reserved and spent, in
//! dollars).
//!
//! Above it, the header line: the requests, their span and, for generated
//! traffic, what was generated and which key kinds varied
//! ([`Generated`]). Below the table: with `--backend`, the modelled
//! upstream's rows ([`super::goodput`]); what was not decided by a
//! limit (no route, refused before the limits) and the trace's bad records.

use std::io::Write;

use serde::Serialize;

use super::compare::{algorithm_name, window_form};
use super::generate::Generated;
use super::goodput::{self, BackendRow};
use super::run::{Simulation, TokenStats};
use super::text::duration_text;
use crate::config::tokens::Unit;
use crate::limit::{Algorithm, NANOS_PER_SEC, Nanos};

/// One variant × route × limit.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Row {
    /// The `--compare` algorithm (absent: as configured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) variant: Option<String>,
    pub(crate) route: String,
    pub(crate) limit: String,
    pub(crate) algorithm: &'static str,
    pub(crate) shadow: bool,
    pub(crate) requests: u64,
    pub(crate) admitted: u64,
    pub(crate) denied: u64,
    /// `None` for concurrency, which has no window.
    pub(crate) peak: Option<u64>,
    pub(crate) window_limit: Option<u64>,
    pub(crate) window_seconds: Option<f64>,
    pub(crate) excess: Option<u64>,
    pub(crate) false_allows: Option<u64>,
    pub(crate) false_denies: Option<u64>,
    pub(crate) false_allow_share: Option<f64>,
    pub(crate) false_deny_share: Option<f64>,
    /// Distinct keys the limit saw, over every route that lists it
    /// (`None` for concurrency, which is not tracked).
    pub(crate) keys: Option<u64>,
    /// A token limit's tokens (absent for a request limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tokens: Option<TokenRow>,
    /// A spend budget's dollars (absent for the others).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usd: Option<UsdRow>,
}

/// A spend budget's dollars over the requests it admitted, exact decimal
/// strings (`"12.034561"`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct UsdRow {
    /// Reserved at admission: the most the requests could cost.
    pub(crate) reserved: String,
    /// Spent: the `settled` requests' priced usage, and the `unsettled`
    /// ones' reservation, which stood.
    pub(crate) spent: String,
    pub(crate) settled: u64,
    pub(crate) unsettled: u64,
    /// The keys that spent most (over every route that lists the limit),
    /// most first, at most [`TOP_KEYS`].
    pub(crate) keys: Vec<KeySpend>,
}

/// One key's spend: its digest (as the explain endpoint shows it; the
/// trace's raw values are not kept) and the dollars it spent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct KeySpend {
    pub(crate) digest: String,
    pub(crate) spent: String,
}

/// Keys listed per spend budget.
const TOP_KEYS: usize = 10;

impl UsdRow {
    /// The row of `stats`, with the keys of `spend` (micro-dollars per key)
    /// that spent most.
    pub(crate) fn new(
        stats: TokenStats,
        spend: &std::collections::HashMap<crate::limit::LimitKey, u64>,
    ) -> UsdRow {
        use crate::llm::price::dollars;
        let mut keys: Vec<_> = spend.iter().collect();
        keys.sort_by(|a, b| b.1.cmp(a.1).then(a.0.as_u128().cmp(&b.0.as_u128())));
        UsdRow {
            reserved: dollars(stats.reserved),
            spent: dollars(stats.used.saturating_add(stats.unsettled_reserved)),
            settled: stats.settled,
            unsettled: stats.unsettled,
            keys: keys
                .into_iter()
                .take(TOP_KEYS)
                .map(|(key, micros)| KeySpend {
                    digest: format!("{:032x}", key.as_u128()),
                    spent: dollars(*micros),
                })
                .collect(),
        }
    }
}

/// A token limit's tokens, over the requests of the route it admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct TokenRow {
    /// Reserved at admission.
    pub(crate) reserved: u64,
    /// Used, as the trace's `tokens` said, by the `settled` requests.
    pub(crate) used: u64,
    pub(crate) settled: u64,
    /// Requests without `tokens`: their reservation stood.
    pub(crate) unsettled: u64,
}

impl From<TokenStats> for TokenRow {
    fn from(stats: TokenStats) -> TokenRow {
        TokenRow {
            reserved: stats.reserved,
            used: stats.used,
            settled: stats.settled,
            unsettled: stats.unsettled,
        }
    }
}

/// One variant × route.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RouteRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) variant: Option<String>,
    pub(crate) route: String,
    pub(crate) requests: u64,
    pub(crate) admitted: u64,
    pub(crate) denied: u64,
    pub(crate) unauthorized: u64,
    pub(crate) missing_key: u64,
    pub(crate) too_large: u64,
    pub(crate) false_allows: u64,
    pub(crate) false_denies: u64,
}

/// Everything a run found.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    /// What `--generate` made (absent for a trace).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) generated: Option<Generated>,
    pub(crate) records: u64,
    pub(crate) bad_records: u64,
    pub(crate) out_of_order: u64,
    pub(crate) no_route: u64,
    pub(crate) span_seconds: f64,
    pub(crate) rows: Vec<Row>,
    pub(crate) routes: Vec<RouteRow>,
    /// Per variant at the modelled upstream (`--backend`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) backend: Vec<BackendRow>,
}

fn share(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

fn seconds(nanos: Nanos) -> f64 {
    nanos as f64 / NANOS_PER_SEC as f64
}

impl Report {
    /// The report of `simulation`, for route `only` (all routes when `None`).
    pub(crate) fn new(
        simulation: &Simulation,
        only: Option<&str>,
        generated: Option<Generated>,
    ) -> Report {
        let compared = simulation.variants.len() > 1;
        let mut rows = Vec::new();
        let mut routes = Vec::new();
        for variant in &simulation.variants {
            let config = &variant.snapshot.config;
            let label = compared.then(|| variant.label(None));
            for (route, stats) in config.routes.iter().zip(&variant.routes) {
                if only.is_some_and(|name| name != route.name) {
                    continue;
                }
                if stats.requests == 0 && only.is_none() {
                    continue;
                }
                routes.push(RouteRow {
                    variant: label.clone(),
                    route: route.name.clone(),
                    requests: stats.requests,
                    admitted: stats.admitted,
                    denied: stats.denied,
                    unauthorized: stats.unauthorized,
                    missing_key: stats.missing_key,
                    too_large: stats.too_large,
                    false_allows: stats.false_allows,
                    false_denies: stats.false_denies,
                });
                for (&limit_index, entry) in route.limits.iter().zip(&stats.entries) {
                    let limit = &config.limits[limit_index];
                    let tracker = &variant.trackers[limit_index];
                    let worst = tracker.worst;
                    let rated = !matches!(
                        limit.algorithm,
                        Algorithm::Concurrency { .. } | Algorithm::Adaptive { .. }
                    );
                    // Before any admission the tracker knows no key: the
                    // configured window form stands in.
                    let (window_limit, window) = if worst.limit > 0 {
                        (worst.limit, worst.window)
                    } else {
                        window_form(&limit.algorithm).unwrap_or((0, 0))
                    };
                    let some = |v| rated.then_some(v);
                    rows.push(Row {
                        variant: label.clone(),
                        route: route.name.clone(),
                        limit: limit.name.clone(),
                        algorithm: algorithm_name(&limit.algorithm),
                        shadow: limit.shadow,
                        requests: entry.applied,
                        admitted: entry.admitted,
                        denied: entry.denied + entry.shadow_denied,
                        peak: some(worst.peak),
                        window_limit: some(window_limit),
                        window_seconds: rated.then(|| seconds(window)),
                        excess: some(worst.excess),
                        false_allows: some(entry.false_allows),
                        false_denies: some(entry.false_denies),
                        false_allow_share: rated.then(|| share(entry.false_allows, entry.applied)),
                        false_deny_share: rated.then(|| share(entry.false_denies, entry.applied)),
                        keys: some(tracker.keys() as u64),
                        tokens: (limit.unit == Unit::Tokens).then(|| entry.tokens.into()),
                        usd: (limit.unit == Unit::Usd)
                            .then(|| UsdRow::new(entry.tokens, &variant.spend[limit_index])),
                    });
                }
            }
        }
        Report {
            generated,
            records: simulation.records,
            bad_records: simulation.bad_records,
            out_of_order: simulation.out_of_order,
            no_route: simulation.variants.first().map_or(0, |v| v.no_route),
            span_seconds: simulation.span.map_or(0.0, |(a, b)| seconds(b - a)),
            rows,
            routes,
            backend: goodput::rows(simulation),
        }
    }

    pub(crate) fn write_json(&self, out: &mut dyn Write) -> std::io::Result<()> {
        serde_json::to_writer_pretty(&mut *out, self)?;
        out.write_all(b"\n")
    }

    pub(crate) fn write_table(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let generated = self
            .generated
            .as_ref()
            .map(|g| format!("; generated: {}", g.summary))
            .unwrap_or_default();
        writeln!(
            out,
            "{} requests over {}{generated}",
            self.records,
            duration_text(self.span_seconds)
        )?;
        writeln!(out)?;
        let header = [
            "route",
            "limit",
            "algorithm",
            "requests",
            "admitted",
            "denied",
            "peak",
            "limit",
            "window",
            "excess",
            "false allow",
            "false deny",
            "keys",
        ];
        let dash = || "-".to_owned();
        let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
        for row in &self.rows {
            let algorithm = match (&row.variant, row.shadow) {
                (_, true) => format!("{} (shadow)", row.algorithm),
                _ => row.algorithm.to_owned(),
            };
            cells.push(vec![
                row.route.clone(),
                row.limit.clone(),
                algorithm,
                row.requests.to_string(),
                row.admitted.to_string(),
                row.denied.to_string(),
                row.peak.map_or_else(dash, |v| v.to_string()),
                row.window_limit.map_or_else(dash, |v| v.to_string()),
                row.window_seconds.map_or_else(dash, duration_text),
                row.excess.map_or_else(dash, |v| v.to_string()),
                row.false_allow_share.map_or_else(dash, percent),
                row.false_deny_share.map_or_else(dash, percent),
                row.keys.map_or_else(dash, |v| v.to_string()),
            ]);
        }
        // Names to the left, numbers to the right.
        super::text::write_columns(out, &cells, 3)?;
        goodput::write_table(&self.backend, out)?;
        self.write_tokens(out)?;
        for route in &self.routes {
            let refused = [
                (route.unauthorized, "unauthorized (401)"),
                (route.missing_key, "missing a key (400)"),
                (route.too_large, "body too large (413)"),
            ];
            if refused.iter().all(|(n, _)| *n == 0) {
                continue;
            }
            let what: Vec<String> = refused
                .iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, what)| format!("{n} {what}"))
                .collect();
            let variant = route
                .variant
                .as_ref()
                .map(|v| format!(" ({v})"))
                .unwrap_or_default();
            writeln!(
                out,
                "route {}{variant}: refused before the limits: {}",
                route.route,
                what.join(", ")
            )?;
        }
        if self.no_route > 0 {
            writeln!(out, "no route matched: {} requests (404)", self.no_route)?;
        }
        if self.bad_records > 0 {
            writeln!(out, "skipped {} bad records", self.bad_records)?;
        }
        Ok(())
    }

    /// A line per token limit's row: what its admitted requests reserved
    /// and used.
    fn write_tokens(&self, out: &mut dyn Write) -> std::io::Result<()> {
        let mut any = false;
        for row in &self.rows {
            let variant = row
                .variant
                .as_ref()
                .map(|v| format!(" ({v})"))
                .unwrap_or_default();
            if let Some(usd) = &row.usd {
                any = true;
                writeln!(
                    out,
                    "route {}, limit {}{variant}: spent ${} (reserved ${}); requests settled {}, unsettled {} (kept their reservation); peak, limit and excess in micro-dollars",
                    row.route, row.limit, usd.spent, usd.reserved, usd.settled, usd.unsettled
                )?;
                for key in &usd.keys {
                    writeln!(out, "  key {}: spent ${}", key.digest, key.spent)?;
                }
            }
            let Some(tokens) = row.tokens else {
                continue;
            };
            any = true;
            writeln!(
                out,
                "route {}, limit {}{variant}: tokens reserved {}, used {}; requests settled {}, unsettled {} (kept their reservation); peak, limit and excess in tokens",
                row.route,
                row.limit,
                tokens.reserved,
                tokens.used,
                tokens.settled,
                tokens.unsettled
            )?;
        }
        if any {
            writeln!(out)?;
        }
        Ok(())
    }
}

fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_read_as_percentages() {
        assert_eq!(percent(0.1234), "12.3%");
    }
}
