//! `[decision]`: the decision service's listener (Envoy's rate-limit
//! service, its `/json` form and forward-auth), `/auth`'s deny status, and
//! the `[[decision.descriptors]]` rules that map Envoy descriptors to
//! limits; with them, the check that a keyless limit is used by a rule
//! only. The section's serde mirror, validated types and checks.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use http::StatusCode;
use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use super::limits::{LimitConfig, RawLimit, references};
use super::routes::RouteConfig;

/// `[decision]`: the decision service's listener and Envoy descriptor rules.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDecision {
    pub(crate) listen: Option<String>,
    pub(crate) deny_status: Option<u16>,
    #[serde(default)]
    pub(crate) descriptors: Vec<RawDescriptorRule>,
}

/// `[[decision.descriptors]]`: a domain's descriptor entries mapped to limits.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDescriptorRule {
    pub(crate) domain: String,
    #[serde(rename = "match", default)]
    pub(crate) entries: Vec<RawEntryMatch>,
    #[serde(default)]
    pub(crate) limits: Vec<String>,
    #[serde(default)]
    pub(crate) replaces: Vec<String>,
}

/// One entry of a descriptor rule's `match`: `{ key = "K" }`, `{ key = "K",
/// value = "V" }` or `{ key = "K", value = "prefix*" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEntryMatch {
    pub(crate) key: String,
    pub(crate) value: Option<String>,
}

/// `[decision]`: the listener of the decision service (Envoy's rate-limit
/// service, its `/json` form and forward-auth) and the rules that map
/// Envoy descriptors to limits.
#[derive(Debug, Clone)]
pub struct DecisionConfig {
    pub listen: SocketAddr,
    /// `/auth`'s status for a denied request (the limit's own status is
    /// what the proxy answers; a forward-auth caller may need 403).
    pub(crate) deny_status: StatusCode,
    /// In file order: the first rule matching a descriptor decides it.
    pub(crate) descriptors: Vec<DescriptorRule>,
}

/// One `[[decision.descriptors]]` rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DescriptorRule {
    pub(crate) domain: String,
    /// A descriptor matches when it has exactly these entries, in order.
    pub(crate) entries: Vec<EntryMatch>,
    /// Indexes into [`Config::limits`](super::Config::limits): the limits a
    /// matching descriptor is charged on, keyed by its entries' values.
    pub(crate) limits: Vec<usize>,
    /// Indexes into [`Config::limits`](super::Config::limits): limits of
    /// other descriptors of the same call that this rule's limits replace
    /// (envoyproxy/ratelimit's `replaces`).
    pub(crate) replaces: Vec<usize>,
}

/// A descriptor entry as a rule matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryMatch {
    pub(crate) key: String,
    pub(crate) value: ValueMatch,
}

/// What a rule asks of an entry's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ValueMatch {
    Any,
    Exact(String),
    /// `value = "api*"`: the value starts with `api`.
    Prefix(String),
}

impl ValueMatch {
    pub(crate) fn matches(&self, value: &str) -> bool {
        match self {
            ValueMatch::Any => true,
            ValueMatch::Exact(exact) => value == exact,
            ValueMatch::Prefix(prefix) => value.starts_with(prefix.as_str()),
        }
    }
}

/// `[decision]`: the listener, `/auth`'s deny status, the descriptor rules.
pub(super) fn check_decision(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawDecision,
    limit_names: &[&str],
) -> DecisionConfig {
    let listen = raw
        .listen
        .as_ref()
        .and_then(|text| c.socket_addr(path.key("listen"), text))
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8081)));
    let deny_status = match raw.deny_status {
        None => StatusCode::TOO_MANY_REQUESTS,
        Some(code) => match StatusCode::from_u16(code) {
            Ok(status) if (400..600).contains(&code) => status,
            _ => {
                c.problem(
                    path.key("deny_status"),
                    format!("`{code}` is not an error status; expected 400-599 (nginx auth_request needs 401 or 403)"),
                );
                StatusCode::TOO_MANY_REQUESTS
            }
        },
    };
    let descriptors = raw
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, rule)| {
            check_descriptor_rule(c, &path.key("descriptors").index(i), rule, limit_names)
        })
        .collect();
    DecisionConfig {
        listen,
        deny_status,
        descriptors,
    }
}

/// Most limits one descriptor rule charges, as a route's stack.
const MAX_RULE_LIMITS: usize = 8;

fn check_descriptor_rule(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawDescriptorRule,
    limit_names: &[&str],
) -> DescriptorRule {
    if raw.domain.is_empty() {
        c.problem(path.key("domain"), "must not be empty");
    }
    if raw.entries.is_empty() {
        // Absent more often than empty: the rule's first key has a line.
        c.problem(
            path.key("domain"),
            "the rule needs `match` with at least one entry, like [{ key = \"remote_address\" }]",
        );
    }
    let count = raw.entries.len();
    let mut entries = Vec::with_capacity(count);
    for (i, entry) in raw.entries.iter().enumerate() {
        let at = path.key("match").index(i);
        if entry.key.is_empty() {
            c.problem(at.key("key"), "must not be empty");
        }
        let value = match entry.value.as_deref() {
            None => ValueMatch::Any,
            Some(text) => match text.find('*') {
                None => ValueMatch::Exact(text.to_owned()),
                Some(star) if star + 1 == text.len() => ValueMatch::Prefix(text[..star].to_owned()),
                Some(_) => {
                    c.problem(
                        at.key("value"),
                        "`*` may only end a value (`\"api*\"` matches values starting with `api`)",
                    );
                    ValueMatch::Any
                }
            },
        };
        entries.push(EntryMatch {
            key: entry.key.clone(),
            value,
        });
    }
    let limits = references(c, &path.key("limits"), &raw.limits, limit_names);
    if limits.len() > MAX_RULE_LIMITS {
        c.problem(
            path.key("limits"),
            format!("a descriptor rule can charge at most {MAX_RULE_LIMITS} limits"),
        );
    }
    let replaces = references(c, &path.key("replaces"), &raw.replaces, limit_names);
    DescriptorRule {
        domain: raw.domain.clone(),
        entries,
        limits,
        replaces,
    }
}

/// A limit without `key` takes its key from descriptor entries: a route
/// cannot use it (it would have no key), and one no rule uses is a
/// mistake.
pub(super) fn check_keyless(
    c: &mut Checker,
    root: &KeyPath,
    raw_limits: &BTreeMap<String, RawLimit>,
    limits: &[LimitConfig],
    routes: &[RouteConfig],
    decision: Option<&DecisionConfig>,
) {
    for (index, limit) in limits.iter().enumerate() {
        if !raw_limits[&limit.name].key.0.is_empty() {
            continue;
        }
        let mut used = false;
        for (i, route) in routes.iter().enumerate() {
            if let Some(position) = route.limits.iter().position(|&l| l == index) {
                used = true;
                c.problem(
                    root.key("routes").index(i).key("limits").index(position),
                    format!(
                        "limit `{}` has no `key`: only [[decision.descriptors]] rules can use it (their entries are its key); give it a `key` to use it on a route",
                        limit.name
                    ),
                );
            }
        }
        let by_rule =
            decision.is_some_and(|d| d.descriptors.iter().any(|r| r.limits.contains(&index)));
        if !used && !by_rule {
            c.problem(
                root.key("limits").key(&limit.name).key("key"),
                "needs at least one key part",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;
    use crate::config::validate::errors;

    const DESCRIPTOR_LIMIT: &str =
        "[limits.per_user]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n";

    #[test]
    fn a_decision_section_alone_is_a_rate_limit_service() {
        let text = format!(
            "{DESCRIPTOR_LIMIT}[decision]\n\n[[decision.descriptors]]\ndomain = \"edge\"\nmatch = [{{ key = \"user\" }}, {{ key = \"path\", value = \"/api*\" }}]\nlimits = [\"per_user\"]\n"
        );
        let config = Config::from_bytes(Path::new("g.toml"), text.as_bytes()).unwrap();
        assert!(config.server.listen.is_empty(), "no proxy listener");
        let decision = config.decision.unwrap();
        assert_eq!(decision.listen, "127.0.0.1:8081".parse().unwrap());
        assert_eq!(decision.deny_status, StatusCode::TOO_MANY_REQUESTS);
        let rule = &decision.descriptors[0];
        assert_eq!(rule.entries[1].value, ValueMatch::Prefix("/api".into()));
        assert!(rule.entries[1].value.matches("/api/v1"));
        assert!(!rule.entries[1].value.matches("/ap"));
        assert_eq!(rule.limits, vec![0]);
    }

    #[test]
    fn descriptor_rules_are_checked_with_their_lines() {
        let text = format!(
            "{DESCRIPTOR_LIMIT}[decision]\ndeny_status = 200\n\n[[decision.descriptors]]\ndomain = \"\"\nmatch = [{{ key = \"a\", value = \"x*y\" }}]\nlimits = [\"per_usr\"]\nreplaces = [\"nope\"]\n\n[[decision.descriptors]]\ndomain = \"d\"\nlimits = [\"per_user\"]\n"
        );
        let message = errors(&text);
        for expected in [
            "`decision.deny_status`: `200` is not an error status",
            "`decision.descriptors[0].domain`: must not be empty",
            "`decision.descriptors[0].match[0].value`: `*` may only end a value",
            "`decision.descriptors[0].limits[0]`: unknown limit `per_usr`",
            "(did you mean `per_user`?)",
            "`decision.descriptors[0].replaces[0]`: unknown limit `nope`",
            "gateway.toml:15:1: `decision.descriptors[1].domain`: the rule needs `match`",
            "gateway.toml:10:",
            "gateway.toml:11:",
        ] {
            assert!(message.contains(expected), "{expected}\n{message}");
        }
    }

    #[test]
    fn a_limit_without_a_key_is_for_descriptor_rules_only() {
        let on_route = format!(
            "{DESCRIPTOR_LIMIT}[upstreams.api]\nurl = \"http://127.0.0.1:9\"\n[[routes]]\nname = \"r\"\nupstream = \"api\"\nlimits = [\"per_user\"]\n"
        );
        let message = errors(&on_route);
        assert!(
            message.contains("`routes[0].limits[0]`: limit `per_user` has no `key`"),
            "{message}"
        );
        let unused = errors(DESCRIPTOR_LIMIT);
        assert!(
            unused.contains("`limits.per_user.key`: needs at least one key part"),
            "{unused}"
        );
    }
}
