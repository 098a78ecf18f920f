//! `[[routes]]`: which requests a route takes (`match`), what it does with
//! them (forward to an upstream, answer itself, or leave them to `/auth`),
//! the limits it stacks and what a request costs, and its upstream
//! retries. The section's serde mirror, validated types and checks; a
//! quota route's `respond` is checked in `super::quota_route`.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode};
use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use super::limits::{LimitConfig, references};
use super::quota_route::{QuotaRespond, check_quota_respond};
use super::raw::RawSize;
use super::slots::check_priority;
use super::tokens::{self, PromptEstimate, RawTokens, Unit};
use super::units::parse_percent;
use crate::limit::Priority;

/// A `[[routes]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    pub(crate) name: String,
    #[serde(rename = "match", default)]
    pub(crate) matcher: RawMatch,
    pub(crate) upstream: Option<String>,
    pub(crate) respond: Option<RawRespond>,
    #[serde(default)]
    pub(crate) limits: Vec<String>,
    pub(crate) cost: Option<u64>,
    pub(crate) cost_header: Option<String>,
    pub(crate) max_body: Option<RawSize>,
    pub(crate) require_consumer: Option<bool>,
    pub(crate) require_jwt: Option<bool>,
    pub(crate) retry: Option<RawRetry>,
    pub(crate) tokens: Option<RawTokens>,
    pub(crate) priority: Option<String>,
    pub(crate) usage_events: Option<bool>,
}

/// `retry = { attempts = 2, on = [...], base = "25ms", cap = "1s", budget = "20%" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRetry {
    pub(crate) attempts: Option<u32>,
    pub(crate) on: Option<Vec<String>>,
    pub(crate) base: Option<String>,
    pub(crate) cap: Option<String>,
    pub(crate) budget: Option<String>,
}

/// A route's `match = { ... }` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    pub(crate) path: Option<String>,
    pub(crate) path_prefix: Option<String>,
    pub(crate) methods: Option<Vec<String>>,
    pub(crate) host: Option<String>,
    pub(crate) header: Option<BTreeMap<String, String>>,
}

/// A route's `respond = { ... }`: the gateway's own answer.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRespond {
    pub(crate) status: Option<u16>,
    pub(crate) body: Option<String>,
    pub(crate) content_type: Option<String>,
    /// `quota = ["LIMIT", ...]`: the caller's own state of these limits.
    pub(crate) quota: Option<Vec<String>>,
}

/// A `[[routes]]` entry, checked.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub(crate) name: String,
    pub(crate) matcher: RouteMatch,
    pub(crate) action: RouteAction,
    /// Indexes into [`Config::limits`](super::Config::limits), narrowest first.
    pub limits: Vec<usize>,
    pub cost: u64,
    pub(crate) cost_header: Option<HeaderName>,
    pub(crate) max_body: Option<u64>,
    /// Requests without a known API key get 401.
    pub(crate) require_consumer: bool,
    /// Requests without a valid token (`[jwt]`) get 401.
    pub(crate) require_jwt: bool,
    /// Upstream retries (`retry = {...}`), off when `None`.
    pub(crate) retry: Option<RetryPolicy>,
    /// How a request reserves tokens and its response settles them
    /// (`tokens = {...}`), for the stack's token limits.
    pub(crate) tokens: Option<tokens::TokensRule>,
    /// The priority of its requests whose consumer sets none.
    pub(crate) priority: Priority,
    /// Its requests send usage events (`[usage]`): `usage_events`, by
    /// default on for a route with `tokens = {...}`, off for the others.
    pub(crate) usage_events: bool,
}

/// A route's `retry` table, validated (the upstream layer applies it).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RetryPolicy {
    /// Retries after the first try.
    pub(crate) attempts: u32,
    /// Retry when the upstream could not be reached or reset the connection
    /// before answering.
    pub(crate) on_connect: bool,
    /// Retry on these response statuses (e.g. 502, 503, 504, 429).
    pub(crate) on_status: Vec<u16>,
    pub(crate) base: Duration,
    pub(crate) cap: Duration,
    /// Retries allowed per client request over the window, in thousandths
    /// (`"20%"` is 200).
    pub(crate) budget_permille: u64,
}

/// What a route takes: every condition given must hold.
#[derive(Debug, Clone, Default)]
pub(crate) struct RouteMatch {
    pub(crate) path: Option<String>,
    pub(crate) path_prefix: Option<String>,
    pub(crate) methods: Option<Vec<Method>>,
    /// Lowercased, without port.
    pub(crate) host: Option<String>,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
}

/// What a route does with a request it takes.
#[derive(Debug, Clone)]
pub(crate) enum RouteAction {
    /// Forward to [`Config::upstreams`](super::Config::upstreams)`[index]`.
    Forward(usize),
    /// Answer from the gateway itself.
    Respond {
        status: StatusCode,
        body: bytes::Bytes,
        content_type: HeaderValue,
    },
    /// Neither: decided by the decision service's `/auth` only; the proxy
    /// listener answers it 404.
    DecideOnly,
    /// `respond = { quota = [...] }`: the caller's own state of these
    /// limits (indexes into [`Config::limits`](super::Config::limits)), as
    /// JSON, charging nothing.
    Quota { limits: Vec<usize> },
}

/// Every `[[routes]]`, in file order; route names are unique.
pub(super) fn check_routes(
    c: &mut Checker,
    path: &KeyPath,
    raw: &[RawRoute],
    upstream_names: &[&str],
    limit_names: &[&str],
    decision: bool,
) -> Vec<RouteConfig> {
    let mut seen_routes = HashSet::new();
    let mut routes = Vec::with_capacity(raw.len());
    for (i, route) in raw.iter().enumerate() {
        let route_path = path.index(i);
        if !seen_routes.insert(route.name.as_str()) {
            c.problem(
                route_path.key("name"),
                format!(
                    "duplicate route name `{}`; route names must be unique",
                    route.name
                ),
            );
        }
        routes.push(check_route(
            c,
            &route_path,
            route,
            upstream_names,
            limit_names,
            decision,
        ));
    }
    routes
}

fn check_route(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawRoute,
    upstream_names: &[&str],
    limit_names: &[&str],
    decision: bool,
) -> RouteConfig {
    let matcher = check_match(c, &path.key("match"), &raw.matcher);
    let action = match (&raw.upstream, &raw.respond) {
        (None, None) if decision => RouteAction::DecideOnly,
        (Some(_), Some(_)) => {
            c.problem(
                path.key("respond"),
                "a route has either `upstream` or `respond`, not both",
            );
            RouteAction::Forward(0)
        }
        (None, None) => {
            c.problem(
                path.key("name"),
                "the route needs `upstream = \"NAME\"` or `respond = { ... }` (or, decided by /auth only, a [decision] section)",
            );
            RouteAction::Forward(0)
        }
        (Some(name), None) => RouteAction::Forward(
            c.reference(path.key("upstream"), "upstream", name, upstream_names)
                .unwrap_or(0),
        ),
        (None, Some(respond)) if respond.quota.is_some() => {
            let quota = QuotaRespond {
                quota: respond.quota.as_deref().unwrap_or_default(),
                others: [
                    ("status", respond.status.is_some()),
                    ("body", respond.body.is_some()),
                    ("content_type", respond.content_type.is_some()),
                ],
                has_limits: !raw.limits.is_empty(),
            };
            RouteAction::Quota {
                limits: check_quota_respond(c, path, &quota, limit_names),
            }
        }
        (None, Some(respond)) => {
            let status = match respond.status {
                None => StatusCode::OK,
                Some(code) => StatusCode::from_u16(code).unwrap_or_else(|_| {
                    c.problem(
                        path.key("respond").key("status"),
                        format!("`{code}` is not an HTTP status (100-999)"),
                    );
                    StatusCode::OK
                }),
            };
            let content_type = respond
                .content_type
                .as_deref()
                .unwrap_or("text/plain; charset=utf-8");
            let content_type = HeaderValue::from_str(content_type).unwrap_or_else(|_| {
                c.problem(
                    path.key("respond").key("content_type"),
                    "is not a valid header value",
                );
                HeaderValue::from_static("text/plain")
            });
            RouteAction::Respond {
                status,
                body: bytes::Bytes::from(respond.body.clone().unwrap_or_default()),
                content_type,
            }
        }
    };
    let route_limits = references(c, &path.key("limits"), &raw.limits, limit_names);
    const MAX_STACK: usize = 8;
    if raw.limits.len() > MAX_STACK {
        c.problem(
            path.key("limits"),
            format!("a route can stack at most {MAX_STACK} limits"),
        );
    }
    let cost = match raw.cost {
        Some(0) => {
            c.problem(path.key("cost"), "must be at least 1");
            1
        }
        Some(n) => n,
        None => 1,
    };
    let cost_header = raw
        .cost_header
        .as_ref()
        .and_then(|h| c.header_name(path.key("cost_header"), h));
    let max_body = raw
        .max_body
        .as_ref()
        .map(|size| c.size(path.key("max_body"), &Some(size.clone()), u64::MAX));
    let priority = check_priority(c, path.key("priority"), raw.priority.as_deref());
    RouteConfig {
        priority: priority.unwrap_or_default(),
        name: raw.name.clone(),
        matcher,
        action,
        limits: route_limits,
        cost,
        cost_header,
        max_body,
        require_consumer: raw.require_consumer.unwrap_or(false),
        require_jwt: raw.require_jwt.unwrap_or(false),
        usage_events: raw.usage_events.unwrap_or(raw.tokens.is_some()),
        retry: raw.retry.as_ref().map(|retry| {
            if raw.respond.is_some() {
                c.problem(
                    path.key("retry"),
                    "a `respond` route has no upstream to retry",
                );
            }
            check_retry(c, &path.key("retry"), retry)
        }),
        tokens: raw
            .tokens
            .as_ref()
            .map(|tokens| super::tokens::check_tokens_rule(c, &path.key("tokens"), tokens)),
    }
}

/// Most retries a route may ask for: more only multiply an outage.
const MAX_RETRY_ATTEMPTS: u32 = 10;

fn check_retry(c: &mut Checker, path: &KeyPath, raw: &RawRetry) -> RetryPolicy {
    let attempts = raw.attempts.unwrap_or(2);
    if attempts > MAX_RETRY_ATTEMPTS {
        c.problem(
            path.key("attempts"),
            format!(
                "at most {MAX_RETRY_ATTEMPTS} retries (attempts counts retries after the first try)"
            ),
        );
    }
    let mut on_connect = false;
    let mut on_status = Vec::new();
    let on = raw
        .on
        .clone()
        .unwrap_or_else(|| ["connect", "502", "503", "504"].map(String::from).to_vec());
    for (i, token) in on.iter().enumerate() {
        match token.as_str() {
            "connect" => on_connect = true,
            text => match text.parse::<u16>() {
                Ok(status @ (408 | 425 | 429 | 500..=599)) => on_status.push(status),
                _ => c.problem(
                    path.key("on").index(i),
                    format!(
                        "`{text}` is not a retry condition; expected \"connect\" or a status: 408, 425, 429 or 5xx"
                    ),
                ),
            },
        }
    }
    let base = c.duration(path.key("base"), &raw.base, Duration::from_millis(25));
    let cap = c.duration(path.key("cap"), &raw.cap, Duration::from_secs(1));
    if cap < base {
        c.problem(path.key("cap"), "must be at least `base`");
    }
    let budget_permille = match raw.budget.as_deref() {
        None => 200,
        Some(text) => {
            match parse_percent(text) {
                Some(permille) => permille,
                None => {
                    c.problem(
                    path.key("budget"),
                    format!("`{text}` is not a share; expected a percentage like \"20%\" (0% to 100%)"),
                );
                    200
                }
            }
        }
    };
    RetryPolicy {
        attempts: attempts.min(MAX_RETRY_ATTEMPTS),
        on_connect,
        on_status,
        base,
        cap,
        budget_permille,
    }
}

fn check_match(c: &mut Checker, path: &KeyPath, raw: &RawMatch) -> RouteMatch {
    for (key, value) in [("path", &raw.path), ("path_prefix", &raw.path_prefix)] {
        if let Some(p) = value
            && !p.starts_with('/')
        {
            c.problem(path.key(key), format!("`{p}` must start with `/`"));
        }
    }
    let methods = raw.methods.as_ref().map(|methods| {
        methods
            .iter()
            .enumerate()
            .filter_map(
                |(i, m)| match Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
                    Ok(method) => Some(method),
                    Err(_) => {
                        c.problem(
                            path.key("methods").index(i),
                            format!("`{m}` is not an HTTP method"),
                        );
                        None
                    }
                },
            )
            .collect()
    });
    let headers = raw
        .header
        .iter()
        .flat_map(BTreeMap::iter)
        .filter_map(|(name, value)| {
            let header_path = path.key("header").key(name);
            let name = c.header_name(header_path.clone(), name)?;
            match HeaderValue::from_str(value) {
                Ok(value) => Some((name, value)),
                Err(_) => {
                    c.problem(header_path, "is not a valid header value");
                    None
                }
            }
        })
        .collect();
    RouteMatch {
        path: raw.path.clone(),
        path_prefix: raw.path_prefix.clone(),
        methods,
        host: raw
            .host
            .as_ref()
            .map(|h| strip_port(h).to_ascii_lowercase()),
        headers,
    }
}

/// `example.com:8080` → `example.com`; `[::1]:80` → `[::1]`.
pub(crate) fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Some route counts its prompts with the tokenizer (whose tables are
/// then worth building before the first request).
pub(crate) fn uses_tokenizer(routes: &[RouteConfig]) -> bool {
    routes.iter().any(|route| {
        route
            .tokens
            .as_ref()
            .is_some_and(|rule| rule.prompt == PromptEstimate::Tokenizer)
    })
}

/// Every route that stacks a token limit says how a request reserves.
pub(super) fn check_token_routes(
    c: &mut Checker,
    root: &KeyPath,
    limits: &[LimitConfig],
    routes: &[RouteConfig],
) {
    for (i, route) in routes.iter().enumerate() {
        if route.tokens.is_some() {
            continue;
        }
        if let Some(limit) = route
            .limits
            .iter()
            .filter_map(|&id| limits.get(id))
            .find(|limit| limit.unit != Unit::Requests)
        {
            let counts = match limit.unit {
                Unit::Usd => "counts dollars (unit = \"usd\")",
                _ => "counts tokens (unit = \"tokens\")",
            };
            c.problem(
                root.key("routes").index(i).key("limits"),
                format!(
                    "`{}` {counts}: the route needs `tokens = {{ max_tokens_default = 1024, prompt = \"bytes/4\", usage = \"auto\" }}` to say what a request reserves",
                    limit.name
                ),
            );
        }
    }
}

/// A route that stacks a usd limit prices its requests: some `[prices]`
/// must exist (a model without its own price and without a default is
/// refused per request, 400).
pub(super) fn check_usd_routes(
    c: &mut Checker,
    root: &KeyPath,
    limits: &[LimitConfig],
    routes: &[RouteConfig],
    prices: &crate::llm::price::Prices,
) {
    if !prices.is_empty() {
        return;
    }
    for (i, route) in routes.iter().enumerate() {
        if let Some(limit) = route
            .limits
            .iter()
            .filter_map(|&id| limits.get(id))
            .find(|limit| limit.unit == Unit::Usd)
        {
            c.problem(
                root.key("routes").index(i).key("limits"),
                format!(
                    "`{}` counts dollars (unit = \"usd\"): add `[prices.\"MODEL\"]` (input, output, cached_input per million tokens) or `[prices.default]`",
                    limit.name
                ),
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

    #[test]
    fn dangling_references_point_at_the_referencing_key() {
        let text = "[upstreams.api]\nurl = \"http://127.0.0.1:9\"\n\n[[routes]]\nname = \"a\"\nupstream = \"apii\"\nlimits = [\"nope\"]\n";
        let message = errors(text);
        assert!(
            message.contains("gateway.toml:6:1: `routes[0].upstream`: unknown upstream `apii`"),
            "{message}"
        );
        assert!(message.contains("(did you mean `api`?)"), "{message}");
        assert!(
            message.contains("gateway.toml:7:11: `routes[0].limits[0]`: unknown limit `nope`"),
            "{message}"
        );
    }

    #[test]
    fn a_route_without_upstream_is_for_auth_when_there_is_a_decision_section() {
        let route = "[[routes]]\nname = \"r\"\nmatch = { path_prefix = \"/\" }\n";
        assert!(
            errors(route).contains("the route needs `upstream"),
            "{}",
            errors(route)
        );
        let text = format!("[decision]\nlisten = \"127.0.0.1:0\"\n{route}");
        let config = Config::from_bytes(Path::new("g.toml"), text.as_bytes()).unwrap();
        assert!(matches!(config.routes[0].action, RouteAction::DecideOnly));
    }

    #[test]
    fn strip_port_keeps_ipv6_brackets() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("example.com"), "example.com");
    }
}
