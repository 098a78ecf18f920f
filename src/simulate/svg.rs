//! `--svg OUT`: the run as a picture, drawn with plotters' SVG backend.
//!
//! Two panels over the same time axis, one line per algorithm (each
//! `--compare` variant, or the configured one), for the chart's limit (the
//! first of the `--route` route's stack):
//!
//! * top: the busiest key's admitted units in the window ending in each time
//!   bucket (the most seen in the bucket), with the limit `L` as a dashed
//!   line — a line above it is traffic the limit let through beyond `L` per
//!   window (a fixed window's boundary burst reaches `2 × L`);
//! * bottom: the route's denied requests per bucket.
//!
//! Buckets start about 1 ms wide and double until the trace fits the chart
//! (see `tracker::Timeline`).

use plotters::prelude::*;

use super::Error;
use super::compare::window_form;
use super::run::Simulation;
use crate::limit::NANOS_PER_SEC;

/// Line colours, one per variant, told apart in print and by most colour-blind readers.
const COLOURS: [RGBColor; 6] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// Line widths, widest first: where variants coincide, each shows as a band
/// around the next one's line instead of hiding it.
fn stroke(variant: usize, variants: usize) -> u32 {
    2 + 2 * (variants - 1 - variant) as u32
}

fn failed<E: std::fmt::Display>(e: E) -> Error {
    Error::Failed(format!("--svg: cannot draw the chart: {e}"))
}

/// The chart as SVG text.
pub fn render(simulation: &Simulation) -> Result<String, Error> {
    let (Some(route), Some(limit)) = (simulation.focus, simulation.chart_limit) else {
        return Err(Error::Usage(
            "--svg: no route with limits to draw (name one with --route)".into(),
        ));
    };
    let timeline = &simulation.timeline;
    if timeline.is_empty() {
        return Err(Error::Failed(
            "--svg: no request of the route was decided by its limits; nothing to draw".into(),
        ));
    }
    let config = &simulation.variants[0].snapshot.config;
    let route_name = &config.routes[route].name;
    let limit_config = &config.limits[limit];
    let (quota, window) = window_form(&limit_config.algorithm).unwrap_or((0, 0));
    let width = timeline.width as f64 / NANOS_PER_SEC as f64;
    let buckets = timeline.len();
    let x_end = (buckets as f64 * width).max(width);
    let labels: Vec<String> = simulation
        .variants
        .iter()
        .map(|v| v.label(Some(limit)))
        .collect();

    let busiest_max = timeline
        .busiest
        .iter()
        .flatten()
        .copied()
        .max()
        .unwrap_or(0);
    let top_max = (busiest_max.max(quota) as f64 * 1.15).max(1.0);
    let denied_max =
        (timeline.denied.iter().flatten().copied().max().unwrap_or(0) as f64 * 1.15).max(1.0);

    let width_of = |v| stroke(v, labels.len());
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, (960, 680)).into_drawing_area();
        root.fill(&WHITE).map_err(failed)?;
        let (top, bottom) = root.split_vertically(400);

        let mut chart = ChartBuilder::on(&top)
            .caption(
                format!(
                    "{route_name} / {}: the busiest key's admitted requests in one {} window",
                    limit_config.name,
                    window_text(window)
                ),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..x_end, 0f64..top_max)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .x_desc("seconds from the first request")
            .y_desc("admitted in the window")
            .draw()
            .map_err(failed)?;
        for (v, label) in labels.iter().enumerate() {
            let colour = COLOURS[v % COLOURS.len()];
            // Buckets without an admission have no point: the window's count
            // is only known when something is admitted.
            let points: Vec<(f64, f64)> = timeline.busiest[v]
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| (i as f64 * width, *n as f64))
                .collect();
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(width_of(v))))
                .map_err(failed)?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
                });
        }
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, quota as f64), (x_end, quota as f64)],
                8,
                5,
                BLACK.stroke_width(2),
            ))
            .map_err(failed)?
            .label(format!("limit: {quota} per {}", window_text(window)))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(failed)?;

        let mut chart = ChartBuilder::on(&bottom)
            .caption(
                format!(
                    "{route_name}: denied requests per {}",
                    window_text(timeline.width)
                ),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..x_end, 0f64..denied_max)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .x_desc("seconds from the first request")
            .y_desc("denied")
            .draw()
            .map_err(failed)?;
        for (v, label) in labels.iter().enumerate() {
            let colour = COLOURS[v % COLOURS.len()];
            let series = &timeline.denied[v];
            let points: Vec<(f64, f64)> = (0..buckets)
                .map(|i| (i as f64 * width, series.get(i).copied().unwrap_or(0) as f64))
                .collect();
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(width_of(v))))
                .map_err(failed)?
                .label(label.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(failed)?;
        root.present().map_err(failed)?;
    }
    Ok(text)
}

/// A window for a caption: `1m`, `250ms`, `1.5s`.
fn window_text(nanos: u64) -> String {
    let ms = nanos as f64 / 1e6;
    if nanos > 0 && nanos.is_multiple_of(3600 * NANOS_PER_SEC) {
        format!("{}h", nanos / (3600 * NANOS_PER_SEC))
    } else if nanos > 0 && nanos.is_multiple_of(60 * NANOS_PER_SEC) {
        format!("{}m", nanos / (60 * NANOS_PER_SEC))
    } else if nanos > 0 && nanos.is_multiple_of(NANOS_PER_SEC) {
        format!("{}s", nanos / NANOS_PER_SEC)
    } else if ms < 1000.0 {
        format!("{}ms", ms.round())
    } else {
        format!("{:.1}s", ms / 1000.0)
    }
}
