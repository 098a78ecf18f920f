//! How `simulate` writes durations and rates for people: short forms for
//! the table's cells and the header line, and the tables themselves.

use std::io::Write;

use crate::limit::{NANOS_PER_SEC, Nanos};

/// Writes `cells` (the header row first) as columns two spaces apart, each
/// as wide as its widest cell: the first `left` columns (names) aligned
/// left, the rest (numbers) right; then a blank line.
pub(crate) fn write_columns(
    out: &mut dyn Write,
    cells: &[Vec<String>],
    left: usize,
) -> std::io::Result<()> {
    let columns = cells.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            cells
                .iter()
                .map(|r| r.get(c).map_or(0, |cell| cell.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in cells {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            let pad = " ".repeat(widths[c].saturating_sub(cell.chars().count()));
            if c < left {
                line.push_str(cell);
                line.push_str(&pad);
            } else {
                line.push_str(&pad);
                line.push_str(cell);
            }
            line.push_str("  ");
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    writeln!(out)
}

/// `90ms`, `1.2s`, `60s`, `1h`: short, for a table cell or
/// the header line.
pub(crate) fn duration_text(seconds: f64) -> String {
    if seconds == 0.0 {
        "0s".to_owned()
    } else if seconds < 1.0 {
        format!("{}ms", (seconds * 1000.0).round())
    } else if seconds >= 3600.0 && (seconds / 3600.0).fract() == 0.0 {
        format!("{}h", seconds / 3600.0)
    } else if seconds >= 60.0 && (seconds / 60.0).fract() == 0.0 {
        format!("{}m", seconds / 60.0)
    } else if seconds.fract() == 0.0 {
        format!("{seconds}s")
    } else {
        format!("{seconds:.1}s")
    }
}

/// [`duration_text`] of a span in nanoseconds.
pub(crate) fn nanos_text(nanos: Nanos) -> String {
    duration_text(nanos as f64 / NANOS_PER_SEC as f64)
}

/// `200`, `0.5`, `33.333`: a rate per second, short.
pub(crate) fn rate_text(rate: f64) -> String {
    let rounded = (rate * 1000.0).round() / 1000.0;
    format!("{rounded}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_short() {
        assert_eq!(duration_text(0.25), "250ms");
        assert_eq!(duration_text(60.0), "1m");
        assert_eq!(duration_text(7200.0), "2h");
        assert_eq!(duration_text(2.0), "2s");
        assert_eq!(duration_text(1.21), "1.2s");
        assert_eq!(nanos_text(600_000_000), "600ms");
        assert_eq!(rate_text(200.0), "200");
        assert_eq!(rate_text(1.0 / 3.0), "0.333");
    }
}
