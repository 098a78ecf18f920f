//! The modelled upstream's part of the report (`--backend`): one row per
//! variant.
//!
//! | column | meaning |
//! | --- | --- |
//! | `sent` | requests the gateway admitted and sent to the upstream |
//! | `2xx` / `503 upstream` | what the upstream answered (503: its queue was full) |
//! | `shed` | requests the gateway's limits refused (JSON: by priority, route and status) |
//! | `goodput` | 2xx answered within the SLO (default 500 ms), per second of the run |
//! | `of capacity` | goodput as a share of what the upstream can serve: its mean capacity over the run divided by the mean service time |
//! | `p50` / `p99` | latency of the 2xx responses, the upstream's queueing plus its service |
//! | `peak in flight` | most requests sent and not yet answered at once |
//!
//! A run's seconds are those between its first and last record.

use std::io::Write;

use serde::Serialize;

use super::run::Simulation;
use super::text::{duration_text, nanos_text};
use crate::limit::{NANOS_PER_SEC, Nanos};

/// Requests of one priority, route and status the gateway refused.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ShedRow {
    pub(crate) priority: &'static str,
    pub(crate) route: String,
    pub(crate) status: u16,
    pub(crate) requests: u64,
}

/// The upstream's capacity from `from_seconds` after the first record.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct CapacityStep {
    pub(crate) from_seconds: f64,
    pub(crate) capacity: u64,
}

/// One variant at the modelled upstream.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BackendRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) variant: Option<String>,
    /// The upstream's capacity over the run, in steps.
    pub(crate) capacity: Vec<CapacityStep>,
    pub(crate) mean_service_ms: f64,
    pub(crate) slo_ms: f64,
    /// What it can serve per second, over the run.
    pub(crate) capacity_per_second: f64,
    pub(crate) sent: u64,
    pub(crate) ok: u64,
    pub(crate) upstream_refused: u64,
    pub(crate) shed: u64,
    pub(crate) shed_by: Vec<ShedRow>,
    /// 2xx within the SLO.
    pub(crate) good: u64,
    pub(crate) goodput_per_second: f64,
    pub(crate) goodput_share: f64,
    /// Of the 2xx responses; `None` without any.
    pub(crate) latency_p50_ms: Option<f64>,
    pub(crate) latency_p99_ms: Option<f64>,
    pub(crate) peak_in_flight: u64,
}

fn millis(nanos: Nanos) -> f64 {
    nanos as f64 / 1e6
}

/// The `q`-quantile (nearest rank) of `sorted`.
pub(crate) fn quantile(sorted: &[Nanos], q: f64) -> Option<Nanos> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// The rows of `simulation`'s variants (none without `--backend`).
pub(crate) fn rows(simulation: &Simulation) -> Vec<BackendRow> {
    let compared = simulation.variants.len() > 1;
    let (first, last) = simulation.span.unwrap_or((0, 0));
    let seconds = (last - first) as f64 / NANOS_PER_SEC as f64;
    let per_second = |n: u64| {
        if seconds > 0.0 {
            n as f64 / seconds
        } else {
            0.0
        }
    };
    let mut rows = Vec::new();
    for variant in &simulation.variants {
        let Some(flight) = &variant.flight else {
            continue;
        };
        let backend = flight.backend();
        let spec = backend.spec();
        let stats = &flight.stats;
        let config = &variant.snapshot.config;
        let capacity_per_second = backend.capacity_per_second(first, last);
        let goodput_per_second = per_second(stats.good);
        let mut latencies = stats.latencies.clone();
        latencies.sort_unstable();
        let capacity = backend
            .schedule()
            .steps()
            .iter()
            .map(|&(from, servers)| {
                let from = from.saturating_sub(first) as f64 / NANOS_PER_SEC as f64;
                CapacityStep {
                    from_seconds: from,
                    capacity: servers,
                }
            })
            .collect();
        rows.push(BackendRow {
            variant: compared.then(|| variant.label(None)),
            capacity,
            mean_service_ms: millis(spec.latency),
            slo_ms: millis(spec.slo),
            capacity_per_second,
            sent: stats.sent,
            ok: stats.ok,
            upstream_refused: stats.upstream_refused,
            shed: stats.shed.values().sum(),
            shed_by: stats
                .shed
                .iter()
                .map(|(shed, &requests)| ShedRow {
                    priority: shed.priority,
                    route: config.routes[shed.route].name.clone(),
                    status: shed.status,
                    requests,
                })
                .collect(),
            good: stats.good,
            goodput_per_second,
            goodput_share: if capacity_per_second > 0.0 {
                goodput_per_second / capacity_per_second
            } else {
                0.0
            },
            latency_p50_ms: quantile(&latencies, 0.5).map(millis),
            latency_p99_ms: quantile(&latencies, 0.99).map(millis),
            peak_in_flight: stats.peak_in_flight,
        });
    }
    rows
}

/// The rows as a table under a line describing the upstream.
pub(crate) fn write_table(rows: &[BackendRow], out: &mut dyn Write) -> std::io::Result<()> {
    let Some(first) = rows.first() else {
        return Ok(());
    };
    let steps: Vec<String> = first
        .capacity
        .iter()
        .map(|step| {
            if step.from_seconds <= 0.0 {
                step.capacity.to_string()
            } else {
                format!(
                    "{} from {}",
                    step.capacity,
                    duration_text(step.from_seconds)
                )
            }
        })
        .collect();
    writeln!(
        out,
        "modelled upstream: capacity {}, mean service {} ({:.1}/s over the run), goodput = 2xx within {}",
        steps.join(", then "),
        nanos_text((first.mean_service_ms * 1e6) as Nanos),
        first.capacity_per_second,
        nanos_text((first.slo_ms * 1e6) as Nanos),
    )?;
    writeln!(out)?;
    let header = [
        "variant",
        "sent",
        "2xx",
        "503 upstream",
        "shed",
        "goodput/s",
        "of capacity",
        "p50",
        "p99",
        "peak in flight",
    ];
    let latency = |ms: Option<f64>| ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.0}ms"));
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    for row in rows {
        cells.push(vec![
            row.variant
                .clone()
                .unwrap_or_else(|| "as configured".into()),
            row.sent.to_string(),
            row.ok.to_string(),
            row.upstream_refused.to_string(),
            row.shed.to_string(),
            format!("{:.1}", row.goodput_per_second),
            format!("{:.1}%", row.goodput_share * 100.0),
            latency(row.latency_p50_ms),
            latency(row.latency_p99_ms),
            row.peak_in_flight.to_string(),
        ]);
    }
    // The variant to the left, numbers to the right.
    super::text::write_columns(out, &cells, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let sorted: Vec<Nanos> = (1..=100).collect();
        assert_eq!(quantile(&sorted, 0.5), Some(50));
        assert_eq!(quantile(&sorted, 0.99), Some(99));
        assert_eq!(quantile(&sorted, 0.0), Some(1));
        assert_eq!(quantile(&[7], 0.99), Some(7));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
