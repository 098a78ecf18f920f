//! envoyproxy/ratelimit's YAML tree read into the importer's model: the
//! fields where each belongs, yaml.v2's way with scalars, and every problem
//! with its line, including what envoyproxy/ratelimit itself refuses
//! (`config_impl.go`'s `loadDescriptors` and `validateYamlKeys`).

use std::collections::HashMap;
use std::fmt::Write;

use super::super::toml_text;
use super::super::yaml::{self, Entry, Node, Value};
use super::{Amount, Descriptor, Domain, Matcher, RateLimit, Unit};

const UNITS: &str = "second, minute, hour, day, week, month or year";

/// The fields envoyproxy/ratelimit knows, where each belongs.
const ROOT_FIELDS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_FIELDS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
const RATE_LIMIT_FIELDS: &[&str] = &["unit", "requests_per_unit", "unlimited", "name", "replaces"];
const REPLACES_FIELDS: &[&str] = &["name"];

/// Reads one file's tree into a [`Domain`], collecting every problem.
#[derive(Default)]
pub(super) struct Reader {
    pub(super) problems: Vec<yaml::Problem>,
}

impl Reader {
    pub(super) fn problem(&mut self, line: usize, message: impl Into<String>) {
        self.problems.push(yaml::Problem {
            line,
            message: message.into(),
        });
    }

    pub(super) fn domain(&mut self, root: Option<&Node>, file: usize) -> Option<Domain> {
        let Some(root) = root else {
            if self.problems.is_empty() {
                self.problem(1, "no domain: the file holds no YAML document");
            }
            return None;
        };
        let fields = self.fields(root, ROOT_FIELDS, "the file")?;
        let name = match get(fields, "domain") {
            Some(entry) => self.text(entry).unwrap_or_default(),
            None => String::new(),
        };
        let line = get(fields, "domain").map_or(root.line, |e| e.line);
        let descriptors = self.descriptors(get(fields, "descriptors"));
        if name.is_empty() {
            self.problem(
                line,
                "needs a `domain` (envoyproxy/ratelimit refuses an empty one too)",
            );
            return None;
        }
        Some(Domain {
            name,
            line,
            file,
            descriptors,
        })
    }

    /// A `descriptors` list; a duplicate node is left out (and reported).
    fn descriptors(&mut self, entry: Option<&Entry>) -> Vec<Descriptor> {
        let Some(entry) = entry else {
            return Vec::new();
        };
        let items = match &entry.value.value {
            Value::Null => return Vec::new(),
            Value::Seq(items) => items,
            _ => {
                self.problem(
                    entry.value.line,
                    format!(
                        "`descriptors` must be a list of descriptors, not {}",
                        found(&entry.value)
                    ),
                );
                return Vec::new();
            }
        };
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut out = Vec::new();
        for item in items {
            let Some((descriptor, written)) = self.descriptor(item) else {
                continue;
            };
            // envoyproxy/ratelimit keys a level's nodes by key and value
            // joined with "_", and refuses a second node of the same.
            let joined = if written.is_empty() {
                descriptor.key.clone()
            } else {
                format!("{}_{written}", descriptor.key)
            };
            if let Some(first) = seen.get(&joined) {
                self.problem(
                    descriptor.line,
                    format!(
                        "duplicate descriptor {} (key and value joined by \"_\", as \
                         envoyproxy/ratelimit names it; first at line {first}): \
                         envoyproxy/ratelimit refuses it too",
                        toml_text::string(&joined)
                    ),
                );
                continue;
            }
            seen.insert(joined, descriptor.line);
            out.push(descriptor);
        }
        out
    }

    /// One node, and its value as written.
    fn descriptor(&mut self, node: &Node) -> Option<(Descriptor, String)> {
        let fields = self.fields(node, DESCRIPTOR_FIELDS, "a descriptor")?;
        let key = match get(fields, "key") {
            Some(entry) => self.text(entry).unwrap_or_default(),
            None => String::new(),
        };
        if key.is_empty() {
            let line = get(fields, "key").map_or(node.line, |e| e.line);
            self.problem(
                line,
                "a descriptor needs a `key` (envoyproxy/ratelimit refuses an empty one too)",
            );
        }
        let written = get(fields, "value")
            .and_then(|entry| self.text(entry))
            .unwrap_or_default();
        let value = match get(fields, "value") {
            Some(entry) => self.matcher(&written, entry.line),
            None => Some(Matcher::Any),
        };
        let rate_limit = match get(fields, "rate_limit") {
            Some(entry) => match &entry.value.value {
                Value::Null => None,
                _ => self.rate_limit(&entry.value, entry.line),
            },
            None => None,
        };
        let shadow = self.flag(fields, "shadow_mode");
        let mut dropped = Vec::new();
        if self.flag(fields, "quota_mode") {
            let line = get(fields, "quota_mode").map_or(node.line, |e| e.line);
            self.problem(
                line,
                "quota_mode cannot be converted: tollgate has no quota descriptors (over the \
                 limit only when every one of the call is); remove it to import the rest",
            );
        }
        if self.flag(fields, "share_threshold") {
            let line = get(fields, "share_threshold").map_or(node.line, |e| e.line);
            self.problem(
                line,
                "share_threshold cannot be converted: each value a tollgate prefix rule \
                 matches has a counter of its own; remove it to import the rest",
            );
        }
        if self.flag(fields, "detailed_metric") {
            dropped.push("detailed_metric dropped: tollgate always counts per limit");
        }
        if self.flag(fields, "value_to_metric") {
            dropped.push("value_to_metric dropped: tollgate counts per limit, not per value");
        }
        if get(fields, "metadata").is_some_and(|e| !matches!(e.value.value, Value::Null)) {
            dropped.push("metadata dropped: tollgate sends no dynamic metadata");
        }
        let children = self.descriptors(get(fields, "descriptors"));
        if key.is_empty() {
            return None;
        }
        let descriptor = Descriptor {
            line: node.line,
            key,
            value: value?,
            rate_limit,
            shadow,
            dropped,
            children,
        };
        Some((descriptor, written))
    }

    /// A `value`: `None` (reported) for a `*` other than a trailing one.
    fn matcher(&mut self, written: &str, line: usize) -> Option<Matcher> {
        if written.is_empty() {
            return Some(Matcher::Any);
        }
        match written.find('*') {
            None => Some(Matcher::Exact(written.to_owned())),
            Some(at) if at == written.len() - 1 => Some(Matcher::Prefix(written[..at].to_owned())),
            Some(_) => {
                self.problem(
                    line,
                    format!(
                        "value {} cannot be converted: tollgate matches a value exactly or by \
                         its prefix (one `*`, at the end); envoyproxy/ratelimit's `*` inside a \
                         value has no equivalent",
                        toml_text::string(written)
                    ),
                );
                None
            }
        }
    }

    /// A `rate_limit` block (its key at `line`); `None` when something in it
    /// is wrong (reported).
    fn rate_limit(&mut self, node: &Node, line: usize) -> Option<RateLimit> {
        let before = self.problems.len();
        let fields = self.fields(node, RATE_LIMIT_FIELDS, "`rate_limit`")?;
        let unlimited = self.flag(fields, "unlimited");
        let unit = get(fields, "unit").and_then(|entry| Some((self.text(entry)?, entry.line)));
        let requests = get(fields, "requests_per_unit").and_then(|entry| self.count(entry));
        let name = get(fields, "name")
            .and_then(|entry| self.text(entry))
            .filter(|name| !name.is_empty());
        let replaces = self.replaces(get(fields, "replaces"), name.as_deref());
        // A field already wrong says enough: no "needs" on top of it.
        if self.problems.len() > before {
            return None;
        }
        let amount = if unlimited {
            if let Some((text, at)) = unit {
                self.problem(
                    at,
                    format!(
                        "unit {} with `unlimited: true`: envoyproxy/ratelimit refuses a unit \
                         there; remove it",
                        toml_text::string(&text)
                    ),
                );
                return None;
            }
            Amount::Unlimited
        } else {
            let unit = match unit {
                None => {
                    self.problem(
                        line,
                        format!("`rate_limit` needs a `unit`: {UNITS} (or `unlimited: true`)"),
                    );
                    None
                }
                Some((text, at)) => {
                    let unit = Unit::parse(&text);
                    if unit.is_none() {
                        self.problem(
                            at,
                            format!(
                                "unit {} is not a unit: expected {UNITS}",
                                toml_text::string(&text)
                            ),
                        );
                    }
                    unit
                }
            };
            let requests = match requests {
                None => {
                    self.problem(
                        line,
                        "`rate_limit` needs `requests_per_unit` (or `unlimited: true`)",
                    );
                    None
                }
                Some(0) => {
                    let at = get(fields, "requests_per_unit").map_or(line, |e| e.line);
                    self.problem(
                        at,
                        "requests_per_unit: 0 (deny every request) cannot be converted: a \
                         tollgate limit admits at least 1",
                    );
                    None
                }
                requests => requests,
            };
            let (Some(unit), Some(requests)) = (unit, requests) else {
                return None;
            };
            Amount::Limited { requests, unit }
        };
        Some(RateLimit {
            amount,
            name,
            replaces,
        })
    }

    /// `replaces: [{name: X}, ...]`: the names.
    fn replaces(&mut self, entry: Option<&Entry>, own: Option<&str>) -> Vec<String> {
        let items = match entry.map(|e| &e.value) {
            None => return Vec::new(),
            Some(Node {
                value: Value::Null, ..
            }) => return Vec::new(),
            Some(Node {
                value: Value::Seq(items),
                ..
            }) => items,
            Some(other) => {
                self.problem(
                    other.line,
                    format!(
                        "`replaces` must be a list of `- name: NAME`, not {}",
                        found(other)
                    ),
                );
                return Vec::new();
            }
        };
        let mut names = Vec::new();
        for item in items {
            let Some(fields) = self.fields(item, REPLACES_FIELDS, "a `replaces` entry") else {
                continue;
            };
            let name = get(fields, "name")
                .and_then(|e| self.text(e))
                .unwrap_or_default();
            if name.is_empty() {
                self.problem(
                    item.line,
                    "a `replaces` entry needs a `name` (envoyproxy/ratelimit refuses an empty \
                     one too)",
                );
            } else if Some(name.as_str()) == own {
                self.problem(
                    item.line,
                    format!(
                        "replaces its own name {}: envoyproxy/ratelimit refuses it too",
                        toml_text::string(&name)
                    ),
                );
            } else {
                names.push(name);
            }
        }
        names
    }

    /// A mapping's entries, each key checked against `allowed`.
    fn fields<'n>(
        &mut self,
        node: &'n Node,
        allowed: &'static [&'static str],
        what: &str,
    ) -> Option<&'n [Entry]> {
        let Value::Map(entries) = &node.value else {
            self.problem(
                node.line,
                format!("{what} must be a mapping, not {}", found(node)),
            );
            return None;
        };
        for entry in entries {
            if !allowed.contains(&entry.key.as_str()) {
                self.problem(entry.line, unknown_field(&entry.key, allowed));
            }
        }
        Some(entries)
    }

    /// A text field. yaml.v2, which envoyproxy/ratelimit reads with, fills a
    /// string from any scalar as written (`value: 8080` is "8080").
    fn text(&mut self, entry: &Entry) -> Option<String> {
        match &entry.value.value {
            Value::Null => None,
            Value::Scalar { text, .. } => Some(text.clone()),
            _ => {
                self.problem(
                    entry.value.line,
                    format!("`{}` must be text, not {}", entry.key, found(&entry.value)),
                );
                None
            }
        }
    }

    /// A boolean field, false when absent: YAML 1.1's plain booleans
    /// (yaml.v2's: `yes`, `on`, `y` ...), not quoted text.
    fn flag(&mut self, fields: &[Entry], key: &str) -> bool {
        let Some(entry) = get(fields, key) else {
            return false;
        };
        match &entry.value.value {
            Value::Null => false,
            Value::Scalar { text, plain: true } if YAML11_TRUE.contains(&text.as_str()) => true,
            Value::Scalar { text, plain: true } if YAML11_FALSE.contains(&text.as_str()) => false,
            _ => {
                self.problem(
                    entry.value.line,
                    format!("`{key}` must be true or false, not {}", found(&entry.value)),
                );
                false
            }
        }
    }

    /// A `uint32` field, as yaml.v2 reads a plain integer (`_` separators,
    /// `0x`, `0o`, `0b`, and a leading `0` for octal); `None` when null or
    /// wrong (reported).
    fn count(&mut self, entry: &Entry) -> Option<u32> {
        let value = match &entry.value.value {
            Value::Null => return None,
            Value::Scalar { text, plain: true } => yaml11_integer(text),
            _ => None,
        };
        let count = value.and_then(|n| u32::try_from(n).ok());
        if count.is_none() {
            self.problem(
                entry.value.line,
                format!(
                    "`{}` must be a whole number from 0 to {}, not {}",
                    entry.key,
                    u32::MAX,
                    found(&entry.value)
                ),
            );
        }
        count
    }
}

const YAML11_TRUE: &[&str] = &[
    "y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON",
];
const YAML11_FALSE: &[&str] = &[
    "n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF",
];

/// A plain scalar as yaml.v2 reads an integer (Go's `ParseInt(s, 0, 64)`
/// after removing `_`).
fn yaml11_integer(text: &str) -> Option<i128> {
    let digits: String = text.chars().filter(|&c| c != '_').collect();
    let (negative, digits) = match digits.as_bytes().first() {
        Some(b'-') => (true, &digits[1..]),
        Some(b'+') => (false, &digits[1..]),
        _ => (false, &digits[..]),
    };
    let lower = digits.to_ascii_lowercase();
    let (radix, body) = if let Some(hex) = lower.strip_prefix("0x") {
        (16, hex)
    } else if let Some(octal) = lower.strip_prefix("0o") {
        (8, octal)
    } else if let Some(binary) = lower.strip_prefix("0b") {
        (2, binary)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from_str_radix(body, radix).ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

fn get<'n>(fields: &'n [Entry], key: &str) -> Option<&'n Entry> {
    fields.iter().find(|e| e.key == key)
}

/// A node for "must be X, not ...": a scalar as written.
fn found(node: &Node) -> String {
    match &node.value {
        Value::Scalar { text, plain: true } => format!("`{text}`"),
        Value::Scalar { text, plain: false } => format!("the text {}", toml_text::string(text)),
        _ => node.kind().to_owned(),
    }
}

/// "unknown field", what is expected there, and the nearest name, or the
/// place a field of another level belongs.
fn unknown_field(key: &str, allowed: &[&str]) -> String {
    let mut message = format!(
        "unknown field {} (expected one of {})",
        toml_text::string(key),
        allowed.join(", ")
    );
    let home = if RATE_LIMIT_FIELDS.contains(&key) && !allowed.contains(&"unit") {
        Some("it belongs in a `rate_limit`")
    } else if DESCRIPTOR_FIELDS.contains(&key) && !allowed.contains(&"key") {
        Some("it belongs in a descriptor")
    } else if key == "domain" {
        Some("it belongs at the top of the file")
    } else {
        None
    };
    if let Some(home) = home {
        let _ = write!(message, ": {home}");
    } else if let Some(near) = crate::config::error::nearest(key, allowed.iter().copied()) {
        let _ = write!(message, "; did you mean \"{near}\"?");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_read_as_yaml_v2_reads_them() {
        assert_eq!(yaml11_integer("1_000"), Some(1000));
        assert_eq!(yaml11_integer("0x10"), Some(16));
        assert_eq!(yaml11_integer("010"), Some(8));
        assert_eq!(yaml11_integer("0b101"), Some(5));
        assert_eq!(yaml11_integer("0o17"), Some(15));
        assert_eq!(yaml11_integer("+7"), Some(7));
        assert_eq!(yaml11_integer("-1"), Some(-1));
        assert_eq!(yaml11_integer("0"), Some(0));
        assert_eq!(yaml11_integer("08"), None);
        assert_eq!(yaml11_integer("5.0"), None);
        assert_eq!(yaml11_integer("0x"), None);
        assert_eq!(yaml11_integer(""), None);
    }
}
