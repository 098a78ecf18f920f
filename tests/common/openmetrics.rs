//! A small, strict parser of the OpenMetrics text format (the subset
//! `prometheus-client` writes: counters, gauges, histograms, no exemplars or
//! timestamps), for tests. It rejects what a Prometheus scrape would reject
//! and a few things it would only warn about, so a malformed exposition fails
//! the test that scraped it.
//!
//! Shared by the unit tests in `src/metrics.rs` (included with `#[path]`) and
//! the end-to-end tests through `tests/common/mod.rs`.
#![allow(dead_code)]

/// One metric family: its metadata and samples, in exposition order.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricFamily {
    pub name: String,
    pub kind: String,
    pub help: Option<String>,
    pub unit: Option<String>,
    pub samples: Vec<Sample>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Exposition {
    pub families: Vec<MetricFamily>,
}

impl Exposition {
    pub fn family(&self, name: &str) -> Option<&MetricFamily> {
        self.families.iter().find(|f| f.name == name)
    }

    pub fn samples(&self) -> impl Iterator<Item = &Sample> {
        self.families.iter().flat_map(|f| f.samples.iter())
    }

    /// The value of the sample `name` whose label set is exactly `labels`
    /// (in any order).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples()
            .find(|s| {
                s.name == name
                    && s.labels.len() == labels.len()
                    && labels.iter().all(|(k, v)| s.label(k) == Some(*v))
            })
            .map(|s| s.value)
    }

    /// The family a sample named `sample` belongs to (`x_total` is a
    /// sample of the counter `x`, `x_bucket` of the histogram `x`).
    pub fn family_of(&self, sample: &str) -> Option<&MetricFamily> {
        self.families.iter().find(|f| {
            sample == f.name
                || sample.strip_prefix(f.name.as_str()).is_some_and(|suffix| {
                    ["_total", "_bucket", "_count", "_sum", "_created"].contains(&suffix)
                })
        })
    }

    /// A counter's value for exactly `labels`: 0 for a series not counted
    /// yet (a labelled series appears at its first increment), but a
    /// failure when the exposition has no such metric at all, so that a
    /// renamed or unregistered metric never reads as a zero.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        assert!(
            self.family_of(name).is_some(),
            "no metric {name} in the exposition"
        );
        self.value(name, labels).unwrap_or(0.0)
    }

    /// The sum of the samples `name` that carry at least `labels`; a
    /// failure when the exposition has no such metric (as [`Self::count`]).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        assert!(
            self.family_of(name).is_some(),
            "no metric {name} in the exposition"
        );
        self.samples()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
            .map(|s| s.value)
            .sum()
    }
}

const TYPES: [&str; 8] = [
    "counter",
    "gauge",
    "histogram",
    "gaugehistogram",
    "summary",
    "info",
    "stateset",
    "unknown",
];

/// Parses `text` strictly; the error names the line.
///
/// Besides the grammar (names, quoted and escaped label values, numbers, the
/// final `# EOF`), it checks: each family once, its samples contiguous and
/// named after it, a `# TYPE` before them, no duplicate label, non-negative
/// counters, histogram buckets with increasing `le`, cumulative counts and a
/// `+Inf` bucket equal to `_count`.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let Some(body) = text
        .strip_suffix("# EOF\n")
        .or_else(|| text.strip_suffix("# EOF"))
    else {
        return Err("the exposition does not end with `# EOF`".into());
    };
    let mut exposition = Exposition::default();
    let mut seen_names: Vec<String> = Vec::new();
    let mut typed: Vec<String> = Vec::new();
    for (index, line) in body.lines().enumerate() {
        let at = |message: String| format!("line {}: {message}: {line:?}", index + 1);
        if line.is_empty() {
            return Err(at("empty line".into()));
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let (keyword, rest) = rest
                .split_once(' ')
                .ok_or_else(|| at("bad comment".into()))?;
            let (name, value) = match rest.split_once(' ') {
                Some((n, v)) => (n, v),
                None => (rest, ""),
            };
            check_metric_name(name).map_err(&at)?;
            let current = match exposition.families.last_mut() {
                Some(f) if f.name == name && f.samples.is_empty() => f,
                _ => {
                    if seen_names.iter().any(|n| n == name) {
                        return Err(at(format!("family {name} appears twice")));
                    }
                    seen_names.push(name.to_owned());
                    exposition.families.push(MetricFamily {
                        name: name.to_owned(),
                        kind: "unknown".into(),
                        help: None,
                        unit: None,
                        samples: Vec::new(),
                    });
                    exposition.families.last_mut().ok_or("unreachable")?
                }
            };
            match keyword {
                "TYPE" => {
                    if !TYPES.contains(&value) {
                        return Err(at(format!("unknown type {value}")));
                    }
                    if typed.iter().any(|n| n == name) {
                        return Err(at("second TYPE".into()));
                    }
                    typed.push(name.to_owned());
                    current.kind = value.to_owned();
                }
                "HELP" => {
                    if current.help.is_some() {
                        return Err(at("second HELP".into()));
                    }
                    current.help = Some(unescape(value).map_err(&at)?);
                }
                "UNIT" => {
                    if !value.is_empty() && !name.ends_with(&format!("_{value}")) {
                        return Err(at(format!("name does not end with the unit {value}")));
                    }
                    current.unit = Some(value.to_owned());
                }
                other => return Err(at(format!("unknown keyword {other}"))),
            }
            continue;
        }
        if line.starts_with('#') {
            return Err(at("comment without a known keyword".into()));
        }
        let sample = parse_sample(line).map_err(&at)?;
        // Stricter than the format: every family must declare its # TYPE
        // (prometheus-client always does), and its samples are contiguous.
        let in_last = exposition
            .families
            .last()
            .is_some_and(|f| belongs(&sample.name, f));
        if !in_last {
            return Err(
                if exposition.families.iter().any(|f| belongs(&sample.name, f)) {
                    at("samples of a family are not contiguous".into())
                } else {
                    at("a sample of no family declared by # TYPE".into())
                },
            );
        }
        let family = exposition.families.last_mut().ok_or("unreachable")?;
        if !typed.contains(&family.name) {
            return Err(at("a family without # TYPE".into()));
        }
        if family.kind == "counter"
            && sample.name.ends_with("_total")
            && (sample.value.is_nan() || sample.value < 0.0)
        {
            return Err(at("a counter must not be negative".into()));
        }
        if family.kind == "histogram" && sample.name.ends_with("_bucket") {
            let le = sample
                .label("le")
                .ok_or_else(|| at("a bucket without `le`".into()))?;
            parse_value(le).map_err(&at)?;
        }
        family.samples.push(sample);
    }
    for family in &exposition.families {
        if family.kind == "histogram" {
            check_histogram(family)?;
        }
    }
    Ok(exposition)
}

/// Whether a sample named `sample` belongs to `family`.
fn belongs(sample: &str, family: &MetricFamily) -> bool {
    let suffixes: &[&str] = match family.kind.as_str() {
        "counter" => &["_total", "_created"],
        "histogram" | "gaugehistogram" => {
            &["_bucket", "_sum", "_count", "_created", "_gsum", "_gcount"]
        }
        "summary" => &["", "_sum", "_count", "_created"],
        "info" => &["_info"],
        _ => &[""],
    };
    sample
        .strip_prefix(family.name.as_str())
        .is_some_and(|rest| suffixes.contains(&rest))
}

/// Buckets per label set: `le` increasing, counts cumulative, a `+Inf`
/// bucket equal to `_count`.
fn check_histogram(family: &MetricFamily) -> Result<(), String> {
    let key = |s: &Sample| {
        let mut labels: Vec<_> = s
            .labels
            .iter()
            .filter(|(k, _)| k != "le")
            .cloned()
            .collect();
        labels.sort();
        labels
    };
    let mut series: Vec<Vec<(String, String)>> = Vec::new();
    for sample in &family.samples {
        let k = key(sample);
        if !series.contains(&k) {
            series.push(k);
        }
    }
    for labels in series {
        let of = |suffix: &str| {
            family
                .samples
                .iter()
                .filter(|s| s.name == format!("{}{suffix}", family.name) && key(s) == labels)
                .collect::<Vec<_>>()
        };
        let buckets = of("_bucket");
        let count = of("_count");
        let [count] = count.as_slice() else {
            return Err(format!(
                "{} {labels:?}: not exactly one _count",
                family.name
            ));
        };
        let mut previous = (f64::NEG_INFINITY, 0.0);
        for bucket in &buckets {
            let le = parse_value(bucket.label("le").unwrap_or(""))?;
            if le <= previous.0 || bucket.value < previous.1 {
                return Err(format!(
                    "{} {labels:?}: buckets not cumulative",
                    family.name
                ));
            }
            previous = (le, bucket.value);
        }
        if previous.0 != f64::INFINITY || previous.1 != count.value {
            return Err(format!(
                "{} {labels:?}: the +Inf bucket is missing or differs from _count",
                family.name
            ));
        }
    }
    Ok(())
}

fn check_metric_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        Ok(())
    } else {
        Err(format!("bad metric name {name:?}"))
    }
}

fn check_label_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if first_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        Ok(())
    } else {
        Err(format!("bad label name {name:?}"))
    }
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| "a sample without a value".to_owned())?;
    let name = &line[..name_end];
    check_metric_name(name)?;
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = parse_labels(after)?;
        labels = parsed;
        rest = tail;
    }
    let rest = rest
        .strip_prefix(' ')
        .ok_or_else(|| "no space before the value".to_owned())?;
    let mut parts = rest.split(' ');
    let value = parse_value(parts.next().unwrap_or(""))?;
    if let Some(timestamp) = parts.next() {
        if timestamp == "#" {
            return Err("exemplars are not expected".into());
        }
        parse_value(timestamp)?;
    }
    if parts.next().is_some() {
        return Err("trailing text after the sample".into());
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Label name/value pairs in exposition order.
type Labels = Vec<(String, String)>;

/// Parses `name="value",...}` and returns the labels and what follows `}`.
fn parse_labels(mut text: &str) -> Result<(Labels, &str), String> {
    let mut labels: Labels = Vec::new();
    if let Some(rest) = text.strip_prefix('}') {
        return Ok((labels, rest));
    }
    loop {
        let eq = text
            .find('=')
            .ok_or_else(|| "a label without `=`".to_owned())?;
        let name = &text[..eq];
        check_label_name(name)?;
        let after = text[eq + 1..]
            .strip_prefix('"')
            .ok_or_else(|| "a label value must be quoted".to_owned())?;
        let mut end = None;
        let mut escaped = false;
        for (i, c) in after.char_indices() {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i);
                    break;
                }
                (false, '\n') => return Err("a newline inside a label value".into()),
                _ => {}
            }
        }
        let end = end.ok_or_else(|| "an unterminated label value".to_owned())?;
        let value = unescape(&after[..end])?;
        if labels.iter().any(|(k, _)| k == name) {
            return Err(format!("label {name} appears twice"));
        }
        labels.push((name.to_owned(), value));
        text = &after[end + 1..];
        if let Some(rest) = text.strip_prefix('}') {
            return Ok((labels, rest));
        }
        text = text
            .strip_prefix(',')
            .ok_or_else(|| "labels must be separated by `,`".to_owned())?;
    }
}

fn unescape(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('\\') => out.push('\\'),
            Some('n') => out.push('\n'),
            Some('"') => out.push('"'),
            other => return Err(format!("bad escape \\{other:?}")),
        }
    }
    Ok(out)
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "+Inf" | "Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ if text.is_empty()
            || !text
                .chars()
                .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E')) =>
        {
            Err(format!("bad number {text:?}"))
        }
        _ => text.parse().map_err(|_| format!("bad number {text:?}")),
    }
}
