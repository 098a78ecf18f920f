//! The one-screen summary `tollgate check` prints for a valid configuration.

use std::fmt::Write as _;

use crate::config::jwt::{IssuerConfig, JwksUrl, KeySource};
use crate::config::{Config, KeyPart, RouteAction};
use crate::limit::{Algorithm, LeakyMode, NANOS_PER_SEC, Rate};

/// Renders the listeners, upstreams, limits and routes of `config`.
pub fn render(config: &Config) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: ok (sha256 {})",
        config.path.display(),
        &config.sha256[..12]
    );
    let mut listen: Vec<String> = config
        .server
        .listen
        .iter()
        .map(|a| format!("http://{a}"))
        .collect();
    if let Some(tls) = &config.server.tls {
        listen.extend(tls.listen.iter().map(|a| format!("https://{a}")));
    }
    let _ = writeln!(out, "listeners: {}", listen.join(", "));
    match config.server.admin {
        Some(admin) => _ = writeln!(out, "admin:     http://{admin}"),
        None => _ = writeln!(out, "admin:     off"),
    }
    if let Some(decision) = &config.decision {
        let _ = writeln!(
            out,
            "decisions: http://{} (gRPC ShouldRateLimit, POST /json, /auth denying {})",
            decision.listen,
            decision.deny_status.as_u16()
        );
    }
    if config.server.path_normalization {
        let slashes = match config.server.escaped_slashes {
            crate::config::EscapedSlashes::Reject => "rejected",
            crate::config::EscapedSlashes::Keep => "kept",
        };
        let _ = writeln!(out, "paths:     normalised (encoded slashes {slashes})");
    } else {
        let _ = writeln!(
            out,
            "paths:     raw (path_normalization = false): routes match the path as written, so \
             `/x/../login`, `//login` or `/%6cogin` reach an upstream that resolves them to \
             `/login` without meeting the `/login` route's limits"
        );
    }
    let _ = writeln!(out, "upstreams: {}", config.upstreams.len());
    for upstream in &config.upstreams {
        let urls: Vec<String> = upstream.urls.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "  {:<16} {}", upstream.name, urls.join(", "));
    }
    let _ = writeln!(out, "limits:    {}", config.limits.len());
    for limit in &config.limits {
        let key = if limit.key.is_empty() {
            "descriptor entries".to_owned()
        } else {
            key_parts(&limit.key)
        };
        let shadow = if limit.shadow { " (shadow)" } else { "" };
        let _ = writeln!(
            out,
            "  {:<16} {} by {}{shadow}",
            limit.name,
            algorithm(&limit.algorithm),
            key
        );
    }
    let _ = writeln!(out, "consumers: {} API keys", config.consumers.len());
    if let Some(jwt) = &config.jwt {
        let _ = writeln!(out, "jwt:       {} issuer(s)", jwt.issuers.len());
        for issuer in &jwt.issuers {
            let _ = writeln!(out, "  {}", jwt_issuer(issuer));
        }
    }
    let _ = writeln!(out, "routes:    {}", config.routes.len());
    for route in &config.routes {
        let target = match &route.action {
            RouteAction::Forward(i) => format!("-> {}", config.upstreams[*i].name),
            RouteAction::Respond { status, .. } => format!("respond {}", status.as_u16()),
            RouteAction::DecideOnly => "decided by /auth only".to_owned(),
            RouteAction::Quota { limits } => {
                let names: Vec<&str> = limits
                    .iter()
                    .filter_map(|&i| config.limits.get(i))
                    .map(|l| l.name.as_str())
                    .collect();
                format!("quota of {}", names.join(", "))
            }
        };
        let limits: Vec<&str> = route
            .limits
            .iter()
            .map(|i| config.limits[*i].name.as_str())
            .collect();
        let mut limits = if limits.is_empty() {
            String::new()
        } else {
            format!(" [{}]", limits.join(", "))
        };
        if route.require_jwt {
            limits.push_str(" (require_jwt)");
        }
        let _ = writeln!(
            out,
            "  {:<16} {}{target}{limits}",
            route.name,
            describe_match(route)
        );
    }
    let rules = config.decision.iter().flat_map(|d| &d.descriptors);
    let count = rules.clone().count();
    if count > 0 {
        let _ = writeln!(out, "descriptor rules: {count}");
    }
    for rule in rules {
        let entries: Vec<String> = rule
            .entries
            .iter()
            .map(|entry| match &entry.value {
                crate::config::ValueMatch::Any => entry.key.clone(),
                crate::config::ValueMatch::Exact(value) => format!("{}={value}", entry.key),
                crate::config::ValueMatch::Prefix(prefix) => format!("{}={prefix}*", entry.key),
            })
            .collect();
        let limits: Vec<&str> = rule
            .limits
            .iter()
            .map(|i| config.limits[*i].name.as_str())
            .collect();
        let _ = writeln!(
            out,
            "  {:<16} [{}] -> [{}]",
            rule.domain,
            entries.join(", "),
            limits.join(", ")
        );
    }
    out
}

/// An issuer in one line: `iss`, where its keys come from (a file's key
/// count, never a secret), its algorithms and audiences.
fn jwt_issuer(issuer: &IssuerConfig) -> String {
    let keys = match &issuer.keys {
        KeySource::Static(keys) => format!("{} key(s)", keys.keys.len()),
        KeySource::Url(JwksUrl { url, refresh, .. }) => {
            format!(
                "keys from {url} every {}",
                seconds(refresh.as_nanos() as u64)
            )
        }
    };
    let algorithms: Vec<&str> = issuer.algorithms.iter().map(|a| a.name()).collect();
    let mut line = format!("{} ({keys}; {})", issuer.issuer, algorithms.join(", "));
    if !issuer.audiences.is_empty() {
        line.push_str(&format!(" aud {}", issuer.audiences.join(", ")));
    }
    line
}

fn describe_match(route: &crate::config::RouteConfig) -> String {
    let m = &route.matcher;
    let mut parts = Vec::new();
    if let Some(methods) = &m.methods {
        parts.push(
            methods
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join("|"),
        );
    }
    if let Some(host) = &m.host {
        parts.push(format!("host={host}"));
    }
    match (&m.path, &m.path_prefix) {
        (Some(p), _) => parts.push(p.clone()),
        (None, Some(p)) => parts.push(format!("{p}*")),
        (None, None) => parts.push("*".to_owned()),
    }
    for (name, value) in &m.headers {
        parts.push(format!("{name}={}", value.to_str().unwrap_or("?")));
    }
    parts.push(String::new());
    parts.join(" ")
}

/// A limit's key as the config spells it, parts joined by `+`.
pub(crate) fn key_parts(parts: &[KeyPart]) -> String {
    parts.iter().map(key_part).collect::<Vec<_>>().join("+")
}

fn key_part(part: &KeyPart) -> String {
    match part {
        KeyPart::Ip => "ip".into(),
        KeyPart::Header(h) => format!("header:{h}"),
        KeyPart::Query(q) => format!("query:{q}"),
        KeyPart::Cookie(c) => format!("cookie:{c}"),
        KeyPart::BodyField(f) => format!("body:{f}"),
        KeyPart::Consumer => "consumer".into(),
        KeyPart::Tenant => "tenant".into(),
        KeyPart::Route => "route".into(),
        KeyPart::Claim { path, .. } => format!("jwt:{path}"),
    }
}

fn seconds(nanos: u64) -> String {
    if nanos.is_multiple_of(NANOS_PER_SEC) {
        format!("{}s", nanos / NANOS_PER_SEC)
    } else {
        format!("{}ms", nanos / 1_000_000)
    }
}

fn rate(rate: &Rate) -> String {
    // Prefer the units users write: "10/s", "600/m", "1000/h".
    for (unit, nanos) in [("s", 1), ("m", 60), ("h", 3600), ("d", 86_400)] {
        let scaled = rate.tokens as u128 * nanos as u128 * NANOS_PER_SEC as u128;
        if scaled.is_multiple_of(rate.per as u128) {
            return format!("{}/{unit}", scaled / rate.per as u128);
        }
    }
    format!("{}/{}", rate.tokens, seconds(rate.per))
}

/// One line for a limit's algorithm and numbers: `token_bucket capacity 20, refill 10/s`.
pub(crate) fn algorithm(algorithm: &Algorithm) -> String {
    match algorithm {
        Algorithm::FixedWindow { limit, window } => {
            format!("fixed_window {limit}/{}", seconds(*window))
        }
        Algorithm::SlidingWindow { limit, window } => {
            format!("sliding_window {limit}/{}", seconds(*window))
        }
        Algorithm::SlidingLog { limit, window } => {
            format!("sliding_log {limit}/{}", seconds(*window))
        }
        Algorithm::TokenBucket {
            capacity,
            refill,
            wait,
        } => {
            let wait = match wait {
                0 => String::new(),
                w => format!(", wait {}", seconds(*w)),
            };
            format!(
                "token_bucket capacity {capacity}, refill {}{wait}",
                rate(refill)
            )
        }
        Algorithm::LeakyBucket {
            capacity,
            rate: r,
            mode,
        } => {
            let mode = match mode {
                LeakyMode::Reject => "reject",
                LeakyMode::Delay => "delay",
            };
            format!("leaky_bucket capacity {capacity}, rate {}, {mode}", rate(r))
        }
        Algorithm::Concurrency { max } => format!("concurrency max {max}"),
        Algorithm::Adaptive { params } => format!(
            "adaptive min {}, max {}, initial {}",
            params.min(),
            params.max(),
            params.initial()
        ),
    }
}
