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
//! * bottom: the route's denied requests per bucket, drawn as steps (one
//!   level per bucket), the bucket's width on the axis (`denied per 1 s`);
//! * with a modelled upstream (`--backend`), a third panel: the requests in
//!   flight to it (the most in each bucket) per variant, the chart limit's
//!   limit dashed in the variant's colour where it has one (a
//!   `concurrency` limit's `max`), and the upstream's capacity in grey
//!   (`capacity-drop` halves it halfway).
//!
//! The buckets are round widths (1, 2, 5, 10, 20, 25, 50 ... ms, 1, 2, 5,
//! 10, 15, 30 s, 1, 2, 5, 10, 15, 30 min, 1, 2, 3, 6, 12 h, 1, 2, 7 d)
//! chosen from the run's duration ([`bucket_width`]): 60 to 120 across the
//! run for the denials, so a count per bucket is a number a reader can take
//! in (a few milliseconds' buckets of a minute's run are noise), and four
//! times finer for the busiest key's line. Each is a whole number of the
//! timeline's own buckets (`tracker::Timeline`), so the counts are exact.

use plotters::prelude::*;

use super::Error;
use super::compare::window_form;
use super::run::Simulation;
use crate::limit::{NANOS_PER_SEC, Nanos};

const MS: Nanos = 1_000_000;
const SEC: Nanos = NANOS_PER_SEC;
const MIN: Nanos = 60 * SEC;
const HOUR: Nanos = 60 * MIN;
const DAY: Nanos = 24 * HOUR;

/// The widths a chart's bucket may take, narrowest first.
const ROUND_WIDTHS: [Nanos; 30] = [
    MS,
    2 * MS,
    5 * MS,
    10 * MS,
    20 * MS,
    25 * MS,
    50 * MS,
    100 * MS,
    250 * MS,
    500 * MS,
    SEC,
    2 * SEC,
    5 * SEC,
    10 * SEC,
    15 * SEC,
    30 * SEC,
    MIN,
    2 * MIN,
    5 * MIN,
    10 * MIN,
    15 * MIN,
    30 * MIN,
    HOUR,
    2 * HOUR,
    3 * HOUR,
    6 * HOUR,
    12 * HOUR,
    DAY,
    2 * DAY,
    7 * DAY,
];

/// Where the legend's column starts, in the 1000-pixel-wide picture.
const LEGEND_X: i32 = 830;

/// Buckets across the run of the denied panel: at least, at most.
const DENIED_BUCKETS: (u64, u64) = (60, 120);
/// And of the busiest key's line, finer: its window count moves smoothly.
const BUSIEST_BUCKETS: (u64, u64) = (240, 480);

/// The chart's bucket width for a run covering `extent`, kept in timeline
/// buckets `stored` wide: of the round widths that are whole numbers of
/// `stored`, the widest that leaves `buckets.0` to `buckets.1` buckets,
/// else the narrowest that leaves at most `buckets.1`. Beyond the widest
/// round width (a run of years), a multiple of `stored`.
pub(crate) fn bucket_width(extent: Nanos, stored: Nanos, buckets: (u64, u64)) -> Nanos {
    let (least, most) = buckets;
    let stored = stored.max(1);
    let count = |width: Nanos| extent.div_ceil(width);
    let fitting = || {
        ROUND_WIDTHS
            .iter()
            .copied()
            .filter(move |w| w % stored == 0 && count(*w) <= most)
    };
    fitting()
        .rfind(|&w| count(w) >= least)
        .or_else(|| fitting().next())
        .unwrap_or_else(|| {
            stored.saturating_mul(extent.div_ceil(stored.saturating_mul(most)).max(1))
        })
}

/// A bucket width for an axis label: `20 ms`, `1 s`, `15 min`, `1 h`, `7 d`.
pub(crate) fn width_text(nanos: Nanos) -> String {
    for (unit, name) in [
        (DAY, "d"),
        (HOUR, "h"),
        (MIN, "min"),
        (SEC, "s"),
        (MS, "ms"),
    ] {
        if nanos >= unit && nanos.is_multiple_of(unit) {
            return format!("{} {name}", nanos / unit);
        }
    }
    format!("{} ms", nanos as f64 / MS as f64)
}

/// An axis's tick label: `20`, `0.25`, not `20.0`.
fn tick(value: f64) -> String {
    let text = format!("{value:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The time axis's unit for a run covering `extent`: seconds up to two
/// minutes, then minutes, hours, days.
fn axis_unit(extent: Nanos) -> (Nanos, &'static str) {
    if extent <= 2 * MIN {
        (SEC, "seconds")
    } else if extent <= 2 * HOUR {
        (MIN, "minutes")
    } else if extent <= 2 * DAY {
        (HOUR, "hours")
    } else {
        (DAY, "days")
    }
}

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
pub(crate) fn render(simulation: &Simulation) -> Result<String, Error> {
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
    let extent = timeline.extent();
    let (unit, unit_name) = axis_unit(extent);
    let at = |nanos: Nanos| nanos as f64 / unit as f64;
    let denied_width = bucket_width(extent, timeline.width, DENIED_BUCKETS);
    let busiest_width = bucket_width(extent, timeline.width, BUSIEST_BUCKETS);
    let (_, denied) = timeline.merged(denied_width);
    let (busiest, _) = timeline.merged(busiest_width);
    let denied_buckets = denied.iter().map(Vec::len).max().unwrap_or(0).max(1);
    let x_end = at(denied_width.saturating_mul(denied_buckets as Nanos)).max(at(extent));
    let x_desc = format!("{unit_name} from the first request");
    let labels: Vec<String> = simulation
        .variants
        .iter()
        .map(|v| v.label(Some(limit)))
        .collect();

    let busiest_max = busiest.iter().flatten().copied().max().unwrap_or(0);
    let top_max = (busiest_max.max(quota) as f64 * 1.15).max(1.0);
    let denied_max = (denied.iter().flatten().copied().max().unwrap_or(0) as f64 * 1.15).max(1.0);
    let per_bucket = width_text(denied_width);
    let denied_ticks = (denied_max.floor() as usize + 1).clamp(2, 10);

    let width_of = |v| stroke(v, labels.len());
    let limit_label = format!("limit: {quota} per {}", window_text(window));
    let modelled = simulation.variants.iter().any(|v| v.flight.is_some());
    let mut text = String::new();
    {
        let height = if modelled { 1000 } else { 680 };
        let root = SVGBackend::with_string(&mut text, (1000, height)).into_drawing_area();
        root.fill(&WHITE).map_err(failed)?;
        // One legend for both panels, beside them: inside a panel it hides
        // whatever the lines do in its corner.
        let (charts, legend) = root.split_horizontally(LEGEND_X);
        let (top, bottom) = charts.split_vertically(400);
        let (bottom, flight_panel) = bottom.split_vertically(280);
        if modelled {
            draw_flight(&flight_panel, simulation, x_end, denied_width)?;
        }

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
            .x_desc(x_desc.as_str())
            .x_label_formatter(&|x| tick(*x))
            .y_label_formatter(&|y| tick(*y))
            .y_desc("admitted in the window")
            .draw()
            .map_err(failed)?;
        for v in 0..labels.len() {
            let colour = COLOURS[v % COLOURS.len()];
            // Buckets without an admission have no point: the window's count
            // is only known when something is admitted. A point stands at
            // the middle of its bucket.
            let points: Vec<(f64, f64)> = busiest[v]
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, n)| {
                    let middle = busiest_width * i as Nanos + busiest_width / 2;
                    (at(middle), *n as f64)
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(width_of(v))))
                .map_err(failed)?;
        }
        chart
            .draw_series(DashedLineSeries::new(
                vec![(0.0, quota as f64), (x_end, quota as f64)],
                8,
                5,
                BLACK.stroke_width(2),
            ))
            .map_err(failed)?;

        let mut chart = ChartBuilder::on(&bottom)
            .caption(
                format!("{route_name}: denied requests per {per_bucket}"),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..x_end, 0f64..denied_max)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .x_desc(x_desc.as_str())
            .x_label_formatter(&|x| tick(*x))
            .y_label_formatter(&|y| tick(*y))
            // Counts: a few whole numbers have a tick each, not halves.
            .y_labels(denied_ticks)
            .y_desc(format!("denied per {per_bucket}"))
            .draw()
            .map_err(failed)?;
        for v in 0..labels.len() {
            let colour = COLOURS[v % COLOURS.len()];
            // A level across each bucket: the count is of the whole bucket.
            let series = &denied[v];
            let points: Vec<(f64, f64)> = (0..denied_buckets)
                .flat_map(|i| {
                    let n = series.get(i).copied().unwrap_or(0) as f64;
                    let from = denied_width * i as Nanos;
                    [(at(from), n), (at(from + denied_width), n)]
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points, colour.stroke_width(width_of(v))))
                .map_err(failed)?;
        }

        let font = ("sans-serif", 14).into_font();
        let entries = labels
            .iter()
            .enumerate()
            .map(|(v, label)| (label.as_str(), COLOURS[v % COLOURS.len()], false))
            .chain([(limit_label.as_str(), BLACK, true)]);
        for (row, (label, colour, dashed)) in entries.enumerate() {
            let y = 60 + 24 * row as i32;
            let sample: Vec<(i32, i32)> = if dashed {
                vec![(8, y), (15, y), (19, y), (26, y)]
            } else {
                vec![(8, y), (30, y)]
            };
            if dashed {
                for pair in sample.chunks(2) {
                    legend
                        .draw(&PathElement::new(pair.to_vec(), colour.stroke_width(2)))
                        .map_err(failed)?;
                }
            } else {
                legend
                    .draw(&PathElement::new(sample, colour.stroke_width(4)))
                    .map_err(failed)?;
            }
            legend
                .draw(&Text::new(label, (38, y - 8), font.clone()))
                .map_err(failed)?;
        }
        root.present().map_err(failed)?;
    }
    Ok(text)
}

/// The third panel (see the module doc): requests in flight, the limit and
/// the upstream's capacity, in buckets `width` wide over `0..x_end`.
fn draw_flight<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    simulation: &Simulation,
    x_end: f64,
    width: Nanos,
) -> Result<(), Error> {
    let timeline = &simulation.timeline;
    let (unit, unit_name) = axis_unit(timeline.extent());
    let at = |nanos: Nanos| nanos as f64 / unit as f64;
    let (in_flight, limits) = timeline.merged_flight(width);
    let start = timeline.start.unwrap_or(0);
    let capacity: Vec<(f64, f64)> = simulation
        .variants
        .iter()
        .find_map(|v| v.flight.as_ref())
        .map(|flight| {
            let steps = flight.backend().schedule().steps();
            let mut points = Vec::new();
            for (i, &(from, servers)) in steps.iter().enumerate() {
                let from = at(from.saturating_sub(start)).min(x_end);
                let to = steps.get(i + 1).map_or(x_end, |&(next, _)| {
                    at(next.saturating_sub(start)).min(x_end)
                });
                points.extend([(from, servers as f64), (to, servers as f64)]);
            }
            points
        })
        .unwrap_or_default();
    let most = in_flight
        .iter()
        .chain(&limits)
        .flatten()
        .copied()
        .max()
        .unwrap_or(0) as f64;
    let top = (most.max(capacity.iter().map(|p| p.1).fold(0.0, f64::max)) * 1.15).max(1.0);
    let mut chart = ChartBuilder::on(area)
        .caption(
            "requests in flight to the modelled upstream (grey: its capacity; dashed: the limit)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_end, 0f64..top)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc(format!("{unit_name} from the first request"))
        .x_label_formatter(&|x| tick(*x))
        .y_label_formatter(&|y| tick(*y))
        .y_desc("in flight")
        .draw()
        .map_err(failed)?;
    chart
        .draw_series(LineSeries::new(
            capacity,
            RGBColor(0x99, 0x99, 0x99).stroke_width(3),
        ))
        .map_err(failed)?;
    let variants = simulation.variants.len();
    // A level across each bucket: the most seen in it.
    let steps = |series: &[u64]| -> Vec<(f64, f64)> {
        series
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| {
                let from = width * i as Nanos;
                [(at(from), n as f64), (at(from + width), n as f64)]
            })
            .collect()
    };
    for v in 0..variants {
        let colour = COLOURS[v % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                steps(&in_flight[v]),
                colour.stroke_width(stroke(v, variants)),
            ))
            .map_err(failed)?;
        if limits[v].iter().any(|&l| l > 0) {
            chart
                .draw_series(DashedLineSeries::new(
                    steps(&limits[v]),
                    8,
                    5,
                    colour.stroke_width(2),
                ))
                .map_err(failed)?;
        }
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::tracker::Timeline;

    #[test]
    fn buckets_are_round_and_between_60_and_120_across_the_run() {
        // The timeline's bucket width for a run of `extent`.
        let stored = |extent: Nanos| {
            let mut timeline = Timeline::new(1);
            timeline.denied(0, 0);
            timeline.denied(0, extent - 1);
            timeline.width
        };
        for (extent, width) in [
            (1_200 * MS, 20 * MS),
            (60 * SEC, SEC),
            (10 * MIN, 10 * SEC),
            (HOUR, MIN),
            (DAY, 15 * MIN),
            (7 * DAY, 2 * HOUR),
        ] {
            assert_eq!(
                bucket_width(extent, stored(extent), DENIED_BUCKETS),
                width,
                "{}",
                width_text(extent)
            );
        }
        // Every run from 1 s to 30 days: a round width, a whole number of
        // the timeline's buckets, and (bar the few gaps of 2.5 between
        // round widths) 60 to 120 buckets; never under 40 or over 120.
        let mut extent = SEC;
        while extent < 30 * DAY {
            let s = stored(extent);
            let w = bucket_width(extent, s, DENIED_BUCKETS);
            let buckets = extent.div_ceil(w);
            assert!(ROUND_WIDTHS.contains(&w), "{extent}: {w}");
            assert_eq!(w % s, 0, "{extent}: {w} of {s}");
            assert!((40..=120).contains(&buckets), "{extent}: {buckets}");
            extent = extent * 21 / 20;
        }
        // A run shorter than 60 ms: 1 ms buckets, however few.
        assert_eq!(bucket_width(7 * MS, MS, DENIED_BUCKETS), MS);
        // Beyond the round widths: a multiple of the stored width.
        let w = bucket_width(3000 * DAY, 10 * DAY, DENIED_BUCKETS);
        assert_eq!(w % (10 * DAY), 0);
        assert!(3000 * DAY / w <= 120);
    }

    #[test]
    fn labels_read_short() {
        assert_eq!(width_text(20 * MS), "20 ms");
        assert_eq!(width_text(SEC), "1 s");
        assert_eq!(width_text(15 * MIN), "15 min");
        assert_eq!(width_text(3 * HOUR), "3 h");
        assert_eq!(width_text(7 * DAY), "7 d");
        assert_eq!(width_text(500 * MS), "500 ms");
        assert_eq!(tick(20.0), "20");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(0.0), "0");
    }
}
