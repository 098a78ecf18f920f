//! The driver of validation: turns the bytes of `gateway.toml` into a typed
//! [`Config`], checking the file as a whole. Syntax first, then the serde
//! mirror (every type error and unknown key, not only the first), then each
//! section's check in order (its file, e.g. [`super::server`], holds its
//! mirror, its type and its check); problems are collected, not returned
//! at the first, and each is located in the file.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use toml::de::DeTable;

use super::checker::Checker;
use super::client_ip::RawClientIp;
use super::consumers::{RawApiKeys, RawConsumer};
use super::decision::RawDecision;
use super::error::{explain_serde_message, explain_type_error, line_column, path_at, span_of};
use super::jwt::RawJwt;
use super::limits::RawLimit;
use super::plans::RawPlanSettings;
use super::routes::RawRoute;
use super::server::RawServer;
use super::store::RawStore;
use super::tracing::RawTracing;
use super::upstreams::RawUpstream;
use super::usage::RawUsage;
use super::{
    Config, ConfigError, KeyPath, Problem, admin_token, client_ip, consumers, decision, jwt,
    limits, plans, prices, quota_route, routes, server, store, tls, tracing, upstreams, usage,
};

/// The top of the serde mirror: one field per section, each section's
/// tables in its own file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub(crate) server: RawServer,
    #[serde(default)]
    pub(crate) client_ip: RawClientIp,
    #[serde(default)]
    pub(crate) store: RawStore,
    #[serde(default)]
    pub(crate) upstreams: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    pub(crate) limits: BTreeMap<String, RawLimit>,
    #[serde(default)]
    pub(crate) routes: Vec<RawRoute>,
    #[serde(default)]
    pub(crate) consumers: BTreeMap<String, RawConsumer>,
    #[serde(default)]
    pub(crate) api_keys: RawApiKeys,
    #[serde(default)]
    pub(crate) plans: BTreeMap<String, RawPlanSettings>,
    pub(crate) decision: Option<RawDecision>,
    pub(crate) jwt: Option<RawJwt>,
    pub(crate) usage: Option<RawUsage>,
    #[serde(default)]
    pub(crate) prices: BTreeMap<String, super::prices::RawPrice>,
    pub(crate) tracing: Option<RawTracing>,
}

/// Validates the bytes of a configuration file.
pub(crate) fn validate(path: &Path, bytes: &[u8]) -> Result<Config, ConfigError> {
    let fail = |problems: Vec<Problem>| ConfigError {
        file: path.to_owned(),
        problems,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let mut problem = Problem::new(KeyPath::default(), "the file is not valid UTF-8");
        problem.position = Some(line_column(
            &String::from_utf8_lossy(bytes),
            e.valid_up_to(),
        ));
        fail(vec![problem])
    })?;

    // Syntax first: a document that does not parse has no key paths to speak of.
    let document = DeTable::parse(text).map_err(|e| {
        let mut problem = Problem::new(KeyPath::default(), e.message().to_owned());
        problem.position = e.span().map(|s| line_column(text, s.start));
        fail(vec![problem])
    })?;

    let (raw, mut problems) = deserialize(text, document.get_ref());
    let Some(raw) = raw else {
        return Err(fail(problems));
    };

    let mut checker = Checker {
        problems: Vec::new(),
        // A key whose value had the wrong type was blanked out before the
        // retry: it is there, only mistyped, so "needs `capacity`" would
        // mislead. Its own problem already says what to write.
        mistyped: problems.iter().map(|p| p.path.clone()).collect(),
        claim_paths: Vec::new(),
    };
    let config = check(&mut checker, path, bytes, &raw);
    for problem in &mut checker.problems {
        if problem.file.is_none() {
            problem.position = span_of(document.get_ref(), &problem.path)
                .map(|span| line_column(text, span.start));
        }
    }
    problems.append(&mut checker.problems);
    if problems.is_empty() {
        return Ok(config);
    }
    problems.sort_by_key(|p| p.position.unwrap_or((usize::MAX, 0)));
    problems.dedup();
    Err(fail(problems))
}

/// Most serde problems to collect before giving up on a file.
const MAX_SERDE_PROBLEMS: usize = 20;

/// Deserializes the raw config, collecting every type error and unknown key,
/// not only the first: serde stops at the first, so each offending line is
/// blanked out (offsets kept, so positions stay true) and the text tried
/// again. Returns the raw config of what remained, if it deserialized.
fn deserialize(text: &str, document: &DeTable<'_>) -> (Option<RawConfig>, Vec<Problem>) {
    let mut problems = Vec::new();
    let mut text = text.to_owned();
    for _ in 0..MAX_SERDE_PROBLEMS {
        let error = match toml::from_str::<RawConfig>(&text) {
            Ok(raw) => return (Some(raw), problems),
            Err(error) => error,
        };
        let mut problem = Problem::new(KeyPath::default(), explain_serde_message(error.message()));
        let Some(span) = error.span() else {
            problems.push(problem);
            return (None, problems);
        };
        problem.position = Some(line_column(&text, span.start));
        problem.path = path_at(document, span.start);
        if let Some(better) = explain_type_error(&problem.path, error.message()) {
            problem.message = better;
        }
        let repeated = problems.last() == Some(&problem);
        if !repeated {
            problems.push(problem);
        }
        // Blank the offending line; a span at a table header (e.g. a missing
        // field) or a blanking that breaks the syntax ends the search.
        let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = text[span.start..]
            .find('\n')
            .map_or(text.len(), |i| span.start + i);
        let line = &text[line_start..line_end];
        if repeated || line.trim_start().starts_with('[') || line.trim().is_empty() {
            return (None, problems);
        }
        let blank = " ".repeat(line.len());
        text.replace_range(line_start..line_end, &blank);
        if DeTable::parse(&text).is_err() {
            return (None, problems);
        }
    }
    (None, problems)
}

/// Each section's check, in the order its problems were always reported
/// (the sort by position keeps this order for problems on one line). Limits
/// come before `[jwt]`, which is given the claim paths their keys name.
fn check(c: &mut Checker, path: &Path, bytes: &[u8], raw: &RawConfig) -> Config {
    let root = KeyPath::default();
    let directory = path.parent().unwrap_or(Path::new("."));
    let has_decision = raw.decision.is_some();
    let mut server = server::check_server(c, &root.key("server"), &raw.server, has_decision);
    server.tls = raw
        .server
        .tls
        .as_ref()
        .and_then(|tls| tls::check_tls(c, &root.key("server").key("tls"), directory, tls));
    server.admin_token =
        admin_token::check_admin_token(c, &root.key("server"), &raw.server, directory);
    server.state_file = raw
        .server
        .state_file
        .as_ref()
        .filter(|file| !file.is_empty())
        .map(|file| directory.join(file));
    let client_ip = client_ip::check_client_ip(c, &root.key("client_ip"), &raw.client_ip);
    let store = store::check_store(c, &root.key("store"), &raw.store, directory);
    let upstreams =
        upstreams::check_upstreams(c, &root.key("upstreams"), &raw.upstreams, directory);
    let limits = limits::check_limits(c, &root.key("limits"), &raw.limits, store.redis().is_some());

    let upstream_names: Vec<&str> = raw.upstreams.keys().map(String::as_str).collect();
    let limit_names: Vec<&str> = raw.limits.keys().map(String::as_str).collect();
    let routes = routes::check_routes(
        c,
        &root.key("routes"),
        &raw.routes,
        &upstream_names,
        &limit_names,
        has_decision,
    );
    let decision = raw
        .decision
        .as_ref()
        .map(|d| decision::check_decision(c, &root.key("decision"), d, &limit_names));
    decision::check_keyless(c, &root, &raw.limits, &limits, &routes, decision.as_ref());
    routes::check_token_routes(c, &root, &limits, &routes);
    for (i, route) in routes.iter().enumerate() {
        if let super::RouteAction::Quota { limits: shown } = &route.action {
            quota_route::check_quota_keys(c, &root, &limits, i, shown);
        }
    }
    let (api_keys, consumers) =
        consumers::check_consumers(c, &root, &raw.api_keys, &raw.consumers, directory);
    let plans = plans::check_plans(c, &root.key("plans"), &raw.plans);
    let jwt = jwt::check_jwt_use(c, &root, raw.jwt.as_ref(), directory, &limits, &routes);
    let usage = raw
        .usage
        .as_ref()
        .map(|u| usage::check_usage(c, &root.key("usage"), u, directory));
    if usage.is_none() {
        let asked = raw.routes.iter().enumerate();
        for (i, _) in asked.filter(|(_, r)| r.usage_events == Some(true)) {
            c.problem(
                root.key("routes").index(i).key("usage_events"),
                "needs a [usage] section: where the events go",
            );
        }
    }
    let prices = prices::check_prices(c, &root.key("prices"), &raw.prices);
    routes::check_usd_routes(c, &root, &limits, &routes, &prices);
    let tracing = raw
        .tracing
        .as_ref()
        .map(|t| tracing::check_tracing(c, &root.key("tracing"), t));

    Config {
        path: path.to_owned(),
        sha256: hex_digest(bytes),
        server,
        client_ip,
        store,
        upstreams,
        limits,
        routes,
        api_keys,
        consumers: Arc::new(consumers),
        plans,
        decision,
        jwt,
        usage,
        prices,
        tracing,
    }
}

fn hex_digest(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// The problems of a configuration text, as `check` prints them (empty
/// when it is valid): what the sections' tests compare messages with.
#[cfg(test)]
pub(super) fn errors(text: &str) -> String {
    match Config::from_bytes(Path::new("gateway.toml"), text.as_bytes()) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::errors;

    #[test]
    fn misspelt_key_is_located_and_suggested() {
        let message = errors("[server]\nlistn = \"127.0.0.1:1\"\n");
        assert!(
            message.starts_with("gateway.toml:2:1: `server.listn`: unknown key `listn`"),
            "{message}"
        );
        assert!(message.contains("did you mean `listen`?"), "{message}");
    }

    #[test]
    fn every_problem_is_reported() {
        let text = "[server]\nshutdown_timeout = \"10\"\nidle_timeout = \"5 weeks\"\n\n[limits.a]\nkey = \"ip\"\nalgorithm = \"token_bucket\"\ncapacity = 0\nrefill = \"x\"\n";
        let message = errors(text);
        assert_eq!(message.lines().count(), 4, "{message}");
        assert!(
            message.contains("gateway.toml:2:1: `server.shutdown_timeout`"),
            "{message}"
        );
        assert!(
            message.contains("gateway.toml:9:1: `limits.a.refill`"),
            "{message}"
        );
    }

    #[test]
    fn every_unknown_key_and_type_error_is_reported_with_validation_problems() {
        let text = "[server]\nlistn = \"x\"\nworkers = \"four\"\nidle_timeout = \"5\"\n\n[[routes]]\nname = \"a\"\nupstrem = \"b\"\nrespond = { status = 200 }\n";
        let message = errors(text);
        assert!(
            message.contains("gateway.toml:2:1: `server.listn`: unknown key"),
            "{message}"
        );
        assert!(
            message.contains("gateway.toml:3:11: `server.workers`"),
            "{message}"
        );
        assert!(
            message.contains("gateway.toml:4:1: `server.idle_timeout`"),
            "{message}"
        );
        assert!(
            message.contains("gateway.toml:8:1: `routes[0].upstrem`: unknown key"),
            "{message}"
        );
        assert!(message.contains("did you mean `upstream`?"), "{message}");
        assert_eq!(message.lines().count(), 4, "{message}");
    }

    #[test]
    fn type_errors_carry_their_position() {
        let message = errors("[server]\nworkers = \"four\"\n");
        assert!(
            message.starts_with("gateway.toml:2:11: `server.workers`"),
            "{message}"
        );
    }

    #[test]
    fn syntax_errors_carry_their_position() {
        let message = errors("[server\n");
        assert!(message.starts_with("gateway.toml:1:"), "{message}");
    }
}
