//! Reads back the samples of the OpenMetrics text that
//! [`crate::metrics::Metrics::encode`] writes, so that `/stats` reports the
//! very counters `/metrics` exposes: `prometheus-client` offers no other
//! way to read a family's series, and a second set of counters on the
//! request path is what this avoids.
//!
//! Only sample lines are read (`name{label="value",...} value`); comments
//! (`# HELP`, `# TYPE`, `# EOF`), exemplars and timestamps are skipped. A
//! line that does not parse is skipped too: `/stats` shows what it can.

use std::borrow::Cow;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample<'t> {
    /// The sample's name, suffix included (`tollgate_requests_total`).
    pub(crate) name: &'t str,
    /// Its labels in the order written, values unescaped.
    pub(crate) labels: Vec<(&'t str, Cow<'t, str>)>,
    pub(crate) value: f64,
}

impl Sample<'_> {
    /// The value of label `name`, if the sample has it.
    pub(crate) fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(label, _)| *label == name)
            .map(|(_, value)| &**value)
    }
}

/// The samples of `text`, in order.
pub(crate) fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(sample)
}

fn sample(line: &str) -> Option<Sample<'_>> {
    let name_end = line.find(['{', ' '])?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (label, after) = rest.split_once("=\"")?;
            let (value, after) = quoted(after)?;
            labels.push((label, value));
            rest = after.strip_prefix(',').unwrap_or(after);
        }
    }
    let value = rest.trim_start().split(' ').next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}

/// A label value up to its closing quote (escapes `\\`, `\"`, `\n`
/// undone), and the text after that quote.
fn quoted(text: &str) -> Option<(Cow<'_, str>, &str)> {
    let mut escaped = false;
    let mut owned: Option<String> = None;
    for (at, c) in text.char_indices() {
        if escaped {
            let value = owned.get_or_insert_with(|| text[..at - 1].to_owned());
            value.push(if c == 'n' { '\n' } else { c });
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '"' => {
                let value = owned.map_or(Cow::Borrowed(&text[..at]), Cow::Owned);
                return Some((value, &text[at + 1..]));
            }
            c => {
                if let Some(value) = &mut owned {
                    value.push(c);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_samples_and_skips_the_rest() {
        let text = "# HELP tollgate_requests Requests answered.\n\
                    # TYPE tollgate_requests counter\n\
                    tollgate_requests_total{route=\"api\",status=\"200\"} 12\n\
                    tollgate_config_generation 3\n\
                    tollgate_request_duration_seconds_bucket{le=\"+Inf\",route=\"a\\\"b\\\\c\\nd\"} 4\n\
                    tollgate_request_duration_seconds_sum{route=\"x\"} 0.25 # {trace=\"t\"} 1\n\
                    broken{route=\"x} 1\n\
                    # EOF\n";
        let samples: Vec<Sample<'_>> = samples(text).collect();
        assert_eq!(samples.len(), 4, "{samples:?}");
        assert_eq!(samples[0].name, "tollgate_requests_total");
        assert_eq!(samples[0].label("route"), Some("api"));
        assert_eq!(samples[0].label("status"), Some("200"));
        assert_eq!(samples[0].value, 12.0);
        assert_eq!(samples[1].name, "tollgate_config_generation");
        assert!(samples[1].labels.is_empty());
        assert_eq!(samples[1].value, 3.0);
        assert_eq!(samples[2].label("le"), Some("+Inf"));
        assert_eq!(samples[2].label("route"), Some("a\"b\\c\nd"));
        assert_eq!(samples[3].value, 0.25);
        assert_eq!(samples[3].label("nope"), None);
    }

    #[test]
    fn reads_what_the_metrics_encode() {
        let metrics = crate::metrics::Metrics::new();
        let api: std::sync::Arc<str> = std::sync::Arc::from("api");
        metrics.record_request(&api, 429, std::time::Duration::from_millis(2));
        let text = metrics.encode();
        let found = samples(&text).find(|s| {
            s.name == "tollgate_requests_total"
                && s.label("route") == Some("api")
                && s.label("status") == Some("429")
        });
        assert_eq!(found.map(|s| s.value), Some(1.0), "{text}");
    }
}
