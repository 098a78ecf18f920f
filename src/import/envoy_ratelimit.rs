//! `tollgate import envoy-ratelimit FILE...`: envoyproxy/ratelimit's YAML
//! configuration files as the `[limits.*]` and `[[decision.descriptors]]`
//! of `gateway.toml`, for the decision service that replaces it.
//!
//! What maps to what (envoyproxy/ratelimit's `src/config/config_impl.go`
//! is the reference): a descriptor node with a `rate_limit` becomes one rule
//! whose `match` is the path of key/value pairs from the top, and one
//! fixed-window limit (envoyproxy/ratelimit counts in epoch-aligned fixed
//! windows, so the numbers mean what they meant); `unlimited: true` and a
//! leaf without `rate_limit` (envoyproxy/ratelimit's "whitelist") become a
//! rule with `limits = []`. Siblings are written most specific first (exact
//! value, then trailing-`*` prefixes in file order, as envoyproxy/ratelimit
//! tries them, then key only), so tollgate's first match picks what
//! envoyproxy/ratelimit's per-level lookup picks; where its lookup, which
//! never backtracks, could still answer differently, the rule says so in a
//! `# note:`. What cannot be converted (a `*` inside a value, `quota_mode`,
//! `share_threshold`, `requests_per_unit: 0`) is an error naming file and
//! line, as is everything envoyproxy/ratelimit itself refuses.
//!
//! Here: the model both sides share (a domain's descriptor tree) and the
//! steps over it: `read` (the YAML tree into the model, with the problems),
//! `matching` (the order rules are written in, and the notes), `write`
//! (names, `replaces`, the TOML text).

use std::path::PathBuf;

use super::Problem;
use super::toml_text;
use super::yaml;

mod matching;
mod read;
mod write;

/// Converts the files, in order, into one `gateway.toml` fragment; or every
/// problem found in them, in file order.
pub fn convert(paths: &[PathBuf]) -> Result<String, Vec<Problem>> {
    let inputs: Vec<(String, Result<String, String>)> = paths
        .iter()
        .map(|path| {
            let text = match std::fs::read(path) {
                Ok(bytes) => String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned()),
                Err(error) => Err(format!("cannot read: {error}")),
            };
            (path.display().to_string(), text)
        })
        .collect();
    convert_inputs(&inputs)
}

/// [`convert`] on `(name, text)` pairs already read.
#[cfg(test)]
fn convert_texts(files: &[(String, String)]) -> Result<String, Vec<Problem>> {
    let inputs: Vec<(String, Result<String, String>)> = files
        .iter()
        .map(|(name, text)| (name.clone(), Ok(text.clone())))
        .collect();
    convert_inputs(&inputs)
}

/// Each input is a file's name and its text, or why it could not be read.
fn convert_inputs(inputs: &[(String, Result<String, String>)]) -> Result<String, Vec<Problem>> {
    let names: Vec<String> = inputs.iter().map(|(name, _)| name.clone()).collect();
    let mut problems = Vec::new();
    let mut domains: Vec<Domain> = Vec::new();
    for (index, (name, text)) in inputs.iter().enumerate() {
        let text = match text {
            Ok(text) => text,
            Err(message) => {
                problems.push(Problem {
                    file: name.clone(),
                    line: None,
                    message: message.clone(),
                });
                continue;
            }
        };
        let mut reader = read::Reader::default();
        match yaml::parse(text) {
            Ok(document) => {
                reader.problems.extend(document.problems);
                if let Some(domain) = reader.domain(document.root.as_ref(), index) {
                    if let Some(first) = domains.iter().find(|d| d.name == domain.name) {
                        reader.problem(
                            domain.line,
                            format!(
                                "domain {} is already defined at {}:{}; envoyproxy/ratelimit \
                                 refuses a domain in two files too (unless MERGE_DOMAIN_CONFIG \
                                 is set): merge them into one file",
                                toml_text::string(&domain.name),
                                names[first.file],
                                first.line
                            ),
                        );
                    } else {
                        domains.push(domain);
                    }
                }
            }
            Err(problem) => reader.problems.push(problem),
        }
        let mut found = reader.problems;
        found.sort_by_key(|p| p.line);
        problems.extend(found.into_iter().map(|p| Problem {
            file: name.clone(),
            line: Some(p.line),
            message: p.message,
        }));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(write::write(&names, &domains))
}

/// One file's domain.
struct Domain {
    name: String,
    line: usize,
    /// Index of its file in the input.
    file: usize,
    descriptors: Vec<Descriptor>,
}

/// One node of a domain's descriptor tree.
struct Descriptor {
    line: usize,
    key: String,
    value: Matcher,
    rate_limit: Option<RateLimit>,
    shadow: bool,
    /// Comments for fields read and left out (metrics-only ones).
    dropped: Vec<&'static str>,
    children: Vec<Descriptor>,
}

impl Descriptor {
    /// Whether the node has a rule of its own: a `rate_limit`, or none and
    /// no nodes below (envoyproxy/ratelimit lets such a descriptor through).
    fn has_rule(&self) -> bool {
        self.rate_limit.is_some() || self.children.is_empty()
    }
}

/// What a node's `value` matches.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Matcher {
    /// No value: any value.
    Any,
    Exact(String),
    /// `value: "api*"`: values starting with "api".
    Prefix(String),
}

impl Matcher {
    /// The order envoyproxy/ratelimit tries a level's nodes in: exact
    /// values, then wildcards (in file order), then key only.
    fn class(&self) -> u8 {
        match self {
            Matcher::Exact(_) => 0,
            Matcher::Prefix(_) => 1,
            Matcher::Any => 2,
        }
    }

    /// The prefix every matched value starts with ("" for any value), or
    /// `None` for an exact value.
    fn prefix(&self) -> Option<&str> {
        match self {
            Matcher::Any => Some(""),
            Matcher::Prefix(p) => Some(p),
            Matcher::Exact(_) => None,
        }
    }

    /// Whether some value is matched by both.
    fn overlaps(&self, other: &Matcher) -> bool {
        match (self, other) {
            (Matcher::Exact(a), Matcher::Exact(b)) => a == b,
            (Matcher::Exact(v), m) | (m, Matcher::Exact(v)) => {
                m.prefix().is_some_and(|p| v.starts_with(p))
            }
            (a, b) => {
                let (a, b) = (a.prefix().unwrap_or(""), b.prefix().unwrap_or(""));
                a.starts_with(b) || b.starts_with(a)
            }
        }
    }

    /// Whether every value `self` matches, `other` matches too.
    fn within(&self, other: &Matcher) -> bool {
        match (self, other) {
            (_, Matcher::Any) => true,
            (Matcher::Exact(v), Matcher::Exact(w)) => v == w,
            (Matcher::Exact(v), Matcher::Prefix(p)) => v.starts_with(p.as_str()),
            (Matcher::Prefix(p), Matcher::Prefix(q)) => p.starts_with(q.as_str()),
            _ => false,
        }
    }

    /// The value as `match` writes it: `None` for any value.
    fn written(&self) -> Option<String> {
        match self {
            Matcher::Any => None,
            Matcher::Exact(v) => Some(v.clone()),
            Matcher::Prefix(p) => Some(format!("{p}*")),
        }
    }
}

/// A node's `rate_limit` block.
struct RateLimit {
    amount: Amount,
    name: Option<String>,
    replaces: Vec<String>,
}

enum Amount {
    Limited { requests: u32, unit: Unit },
    Unlimited,
}

/// envoyproxy/ratelimit's units and their windows: its `UnitToDivider`
/// (`src/utils/utilities.go`), whose month is 30 days and year 365.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// envoyproxy/ratelimit upper-cases the unit and looks it up among the
    /// proto's names, so `Second` and `SECOND` are units too.
    fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_uppercase().as_str() {
            "SECOND" => Unit::Second,
            "MINUTE" => Unit::Minute,
            "HOUR" => Unit::Hour,
            "DAY" => Unit::Day,
            "WEEK" => Unit::Week,
            "MONTH" => Unit::Month,
            "YEAR" => Unit::Year,
            _ => return None,
        })
    }

    fn window(self) -> &'static str {
        match self {
            Unit::Second => "1s",
            Unit::Minute => "1m",
            Unit::Hour => "1h",
            Unit::Day => "1d",
            Unit::Week => "7d",
            Unit::Month => "30d",
            Unit::Year => "365d",
        }
    }
}

/// One entry of `match`: `{ key = "k", value = "v" }`.
fn match_entry(key: &str, value: &Matcher) -> String {
    match value.written() {
        Some(value) => format!(
            "{{ key = {}, value = {} }}",
            toml_text::string(key),
            toml_text::string(&value)
        ),
        None => format!("{{ key = {} }}", toml_text::string(key)),
    }
}

#[cfg(test)]
mod tests;
