//! Turns the raw serde mirror into a typed [`Config`], checking the file as a
//! whole: values parse, references resolve, names are unique. Problems are
//! collected, not returned at the first, and each is located in the file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use ipnet::IpNet;
use sha2::{Digest, Sha256};
use toml::de::DeTable;

use super::checker::Checker;
use super::error::{
    explain_serde_message, explain_type_error, line_column, nearest, path_at, span_of,
};
use super::raw::{self, RawConfig};
use super::units::{parse_duration, parse_rate};
use super::*;
use crate::limit::{Algorithm, LeakyMode, Nanos, WindowAlign};

/// Default per-limit cap on live keys; see `limit::memory` for what happens
/// when it is reached.
pub(crate) const DEFAULT_MAX_KEYS: usize = 1_000_000;

const ALGORITHMS: [&str; 6] = [
    "fixed_window",
    "sliding_window",
    "sliding_log",
    "token_bucket",
    "leaky_bucket",
    "concurrency",
];

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

fn check(c: &mut Checker, path: &Path, bytes: &[u8], raw: &RawConfig) -> Config {
    let root = KeyPath::default();
    let directory = path.parent().unwrap_or(Path::new("."));
    let mut server = check_server(c, &root.key("server"), &raw.server, raw.decision.is_some());
    server.tls = raw
        .server
        .tls
        .as_ref()
        .and_then(|tls| check_tls(c, &root.key("server").key("tls"), directory, tls));
    let client_ip = check_client_ip(c, &root.key("client_ip"), &raw.client_ip);
    let store = check_store(c, &root.key("store"), &raw.store, directory);

    let upstreams: Vec<UpstreamConfig> = raw
        .upstreams
        .iter()
        .map(|(name, u)| check_upstream(c, &root.key("upstreams").key(name), name, u, directory))
        .collect();
    let limits: Vec<LimitConfig> = raw
        .limits
        .iter()
        .map(|(name, l)| check_limit(c, &root.key("limits").key(name), name, l))
        .collect();
    if store.redis().is_none() {
        // Leases are taken from the shared store: without one, say so
        // rather than ignore the setting.
        for limit in limits.iter().filter(|l| l.lease.is_some()) {
            c.problem(
                root.key("limits").key(&limit.name).key("lease"),
                "leases are taken from a shared store: set store.backend = \"redis\", or remove `lease`",
            );
        }
    }

    let upstream_names: Vec<&str> = raw.upstreams.keys().map(String::as_str).collect();
    let limit_names: Vec<&str> = raw.limits.keys().map(String::as_str).collect();
    let mut seen_routes = HashSet::new();
    let mut routes = Vec::with_capacity(raw.routes.len());
    for (i, route) in raw.routes.iter().enumerate() {
        let route_path = root.key("routes").index(i);
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
            &upstream_names,
            &limit_names,
            raw.decision.is_some(),
        ));
    }
    let decision = raw
        .decision
        .as_ref()
        .map(|decision| check_decision(c, &root.key("decision"), decision, &limit_names));
    check_keyless(c, &root, raw, &limits, &routes, decision.as_ref());
    super::tokens::check_token_routes(c, &root, &limits, &routes);
    let api_keys = check_api_keys(c, &root.key("api_keys"), &raw.api_keys);
    let mut consumers = HashMap::with_capacity(raw.consumers.len());
    for (key, consumer) in &raw.consumers {
        let entry = check_consumer(c, &root.key("consumers").key(key), consumer);
        consumers.insert(key.clone(), entry);
    }
    if let Some(file) = &raw.api_keys.file {
        let file_path = path.parent().unwrap_or(Path::new(".")).join(file);
        load_consumers_file(
            c,
            &root.key("api_keys").key("file"),
            &file_path,
            &mut consumers,
        );
    }

    let jwt = check_jwt_use(c, &root, raw, directory, &limits, &routes);

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
        decision,
        jwt,
    }
}

/// `[jwt]`, and every use of it (`jwt:` keys, `require_jwt`) only with it.
fn check_jwt_use(
    c: &mut Checker,
    root: &KeyPath,
    raw: &RawConfig,
    directory: &Path,
    limits: &[LimitConfig],
    routes: &[RouteConfig],
) -> Option<super::jwt::JwtConfig> {
    let claim_paths = std::mem::take(&mut c.claim_paths);
    if let Some(jwt) = &raw.jwt {
        return Some(super::jwt::check_jwt(
            c,
            &root.key("jwt"),
            jwt,
            directory,
            claim_paths,
        ));
    }
    for limit in limits {
        if let Some(KeyPart::Claim { path, .. }) = limit
            .key
            .iter()
            .find(|p| matches!(p, KeyPart::Claim { .. }))
        {
            c.problem(
                root.key("limits").key(&limit.name).key("key"),
                format!("`jwt:{path}` reads a verified token's claim: configure its issuer in [[jwt.issuers]]"),
            );
        }
    }
    for (i, route) in routes.iter().enumerate() {
        if route.require_jwt {
            c.problem(
                root.key("routes").index(i).key("require_jwt"),
                "`require_jwt` needs the issuers of [[jwt.issuers]] to verify tokens with",
            );
        }
    }
    None
}

/// `[decision]`: the listener, `/auth`'s deny status, the descriptor rules.
fn check_decision(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawDecision,
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

/// The limits a list at `path` names (a route's or a descriptor rule's
/// `limits`, a rule's `replaces`), as indexes into `limit_names`; each
/// unknown or repeated name a problem at its element.
fn limit_references(
    c: &mut Checker,
    path: &KeyPath,
    names: &[String],
    limit_names: &[&str],
) -> Vec<usize> {
    let mut seen = HashSet::new();
    let mut found = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        if !seen.insert(name.as_str()) {
            c.problem(path.index(i), format!("limit `{name}` is listed twice"));
        }
        if let Some(index) = c.reference(path.index(i), "limit", name, limit_names) {
            found.push(index);
        }
    }
    found
}

/// Most limits one descriptor rule charges, as a route's stack.
const MAX_RULE_LIMITS: usize = 8;

fn check_descriptor_rule(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawDescriptorRule,
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
    let limits = limit_references(c, &path.key("limits"), &raw.limits, limit_names);
    if limits.len() > MAX_RULE_LIMITS {
        c.problem(
            path.key("limits"),
            format!("a descriptor rule can charge at most {MAX_RULE_LIMITS} limits"),
        );
    }
    let replaces = limit_references(c, &path.key("replaces"), &raw.replaces, limit_names);
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
fn check_keyless(
    c: &mut Checker,
    root: &KeyPath,
    raw: &RawConfig,
    limits: &[LimitConfig],
    routes: &[RouteConfig],
    decision: Option<&DecisionConfig>,
) {
    for (index, limit) in limits.iter().enumerate() {
        if !raw.limits[&limit.name].key.0.is_empty() {
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

fn check_api_keys(c: &mut Checker, path: &KeyPath, raw: &raw::RawApiKeys) -> ApiKeyConfig {
    let source = match raw.header.as_deref() {
        None => ApiKeySource::Header(HeaderName::from_static("x-api-key")),
        Some(name) if name.eq_ignore_ascii_case("authorization") => ApiKeySource::Bearer,
        Some(name) => c
            .header_name(path.key("header"), name)
            .map_or(ApiKeySource::Bearer, ApiKeySource::Header),
    };
    let reject_unknown = match raw.unknown_key.as_deref() {
        None => false,
        Some(text) => {
            c.one_of(path.key("unknown_key"), text, &["anonymous", "reject"]) == Some("reject")
        }
    };
    ApiKeyConfig {
        source,
        reject_unknown,
    }
}

fn check_consumer(c: &mut Checker, path: &KeyPath, raw: &raw::RawConsumer) -> Consumer {
    if raw.consumer.is_empty() {
        c.problem(path.key("consumer"), "must not be empty");
    }
    consumer_of(raw)
}

/// The typed consumer of a `[consumers."KEY"]` table (inline or from a file).
fn consumer_of(raw: &raw::RawConsumer) -> Consumer {
    Consumer {
        consumer: Arc::from(raw.consumer.as_str()),
        tenant: raw.tenant.as_deref().map(Arc::from),
        plan: raw.plan.as_deref().map(Arc::from),
    }
}

/// Loads a consumers file (only `[consumers."KEY"]` tables) into `consumers`.
/// Its problems are located in that file.
fn load_consumers_file(
    c: &mut Checker,
    key_path: &KeyPath,
    file: &Path,
    consumers: &mut HashMap<String, Consumer>,
) {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            c.problem(
                key_path.clone(),
                format!("cannot read consumers file {}: {e}", file.display()),
            );
            return;
        }
    };
    let mut in_file = |path: KeyPath, message: String, offset: Option<usize>| {
        let mut problem = Problem::new(path, message);
        problem.file = Some(file.to_owned());
        problem.position = offset.map(|o| line_column(&text, o));
        c.problems.push(problem);
    };
    // The syntax tree places problems (line, key path) on either path.
    let document = DeTable::parse(&text).ok();
    let raw: raw::RawConsumersFile = match toml::from_str(&text) {
        Ok(raw) => raw,
        Err(e) => {
            let offset = e.span().map(|s| s.start);
            let path = match (&document, offset) {
                (Some(doc), Some(o)) => path_at(doc.get_ref(), o),
                _ => KeyPath::default(),
            };
            in_file(path, explain_serde_message(e.message()), offset);
            return;
        }
    };
    for (key, consumer) in &raw.consumers {
        let path = KeyPath::default().key("consumers").key(key);
        let offset = document
            .as_ref()
            .and_then(|d| span_of(d.get_ref(), &path))
            .map(|s| s.start);
        if consumers.contains_key(key) {
            in_file(
                path,
                "this API key is also defined in the main configuration".to_owned(),
                offset,
            );
            continue;
        }
        if consumer.consumer.is_empty() {
            in_file(path.key("consumer"), "must not be empty".to_owned(), offset);
            continue;
        }
        consumers.insert(key.clone(), consumer_of(consumer));
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

fn check_server(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawServer,
    decision_only: bool,
) -> ServerConfig {
    let listen = match &raw.listen {
        // A `[decision]` section without `[server] listen` is a decision
        // service alone: no proxy listener.
        None if decision_only => Vec::new(),
        None => vec![SocketAddr::from(([127, 0, 0, 1], 8080))],
        Some(list) => {
            if list.0.is_empty() {
                c.problem(path.key("listen"), "needs at least one address");
            }
            let count = list.0.len();
            list.0
                .iter()
                .enumerate()
                .filter_map(|(i, text)| c.socket_addr(path.element("listen", count, i), text))
                .collect()
        }
    };
    let admin = raw
        .admin
        .as_ref()
        .and_then(|text| c.socket_addr(path.key("admin"), text));
    let max_header_bytes = c.size(
        path.key("max_header_bytes"),
        &raw.max_header_bytes,
        32 * 1024,
    );
    if max_header_bytes < 1024 {
        c.problem(path.key("max_header_bytes"), "must be at least 1KiB");
    }
    // Bounds on what every connection may hold, so a typo cannot make a
    // handful of clients exhaust the machine's memory.
    if max_header_bytes > MAX_HEADER_BYTES {
        c.problem(
            path.key("max_header_bytes"),
            "must be at most 1MiB (each connection may buffer a whole head)",
        );
    }
    if raw.workers.is_some_and(|n| n > MAX_WORKERS) {
        c.problem(
            path.key("workers"),
            format!("must be at most {MAX_WORKERS} (one thread each; 0 = one per CPU core)"),
        );
    }
    if raw.max_connections.is_some_and(|n| n > MAX_CONNECTIONS) {
        c.problem(
            path.key("max_connections"),
            format!("must be at most {MAX_CONNECTIONS}"),
        );
    }
    let headers = match &raw.headers {
        None => HeaderStyles::default(),
        Some(names) => c.header_styles(path.key("headers"), names),
    };
    let log_denied = match &raw.log_denied {
        None => LogDenied::default(),
        Some(text) => LogDenied::parse(text).unwrap_or_else(|message| {
            c.problem(path.key("log_denied"), message);
            LogDenied::default()
        }),
    };
    ServerConfig {
        listen,
        admin,
        shutdown_timeout: c.duration(
            path.key("shutdown_timeout"),
            &raw.shutdown_timeout,
            Duration::from_secs(10),
        ),
        workers: raw.workers.unwrap_or(0) as usize,
        header_read_timeout: c.duration(
            path.key("header_read_timeout"),
            &raw.header_read_timeout,
            Duration::from_secs(10),
        ),
        body_read_timeout: c.duration(
            path.key("body_read_timeout"),
            &raw.body_read_timeout,
            Duration::from_secs(30),
        ),
        idle_timeout: c.duration(
            path.key("idle_timeout"),
            &raw.idle_timeout,
            Duration::from_secs(60),
        ),
        max_header_bytes: usize::try_from(max_header_bytes).unwrap_or(usize::MAX),
        max_connections: match raw.max_connections {
            Some(0) => {
                c.problem(path.key("max_connections"), "must be at least 1");
                1
            }
            Some(n) => n as usize,
            None => 10_000,
        },
        max_key_body: {
            let size = c.size(path.key("max_key_body"), &raw.max_key_body, 64 * 1024);
            if size > MAX_KEY_BODY {
                c.problem(
                    path.key("max_key_body"),
                    "must be at most 16MiB (a body read for a key is held in memory)",
                );
            }
            usize::try_from(size.min(MAX_KEY_BODY)).unwrap_or(usize::MAX)
        },
        headers,
        log_denied,
        path_normalization: raw.path_normalization.unwrap_or(true),
        escaped_slashes: match raw.escaped_slashes.as_deref() {
            None => EscapedSlashes::Reject,
            Some(value) => match c.one_of(path.key("escaped_slashes"), value, &["reject", "keep"]) {
                Some("keep") => EscapedSlashes::Keep,
                _ => EscapedSlashes::Reject,
            },
        },
        upgrades: match &raw.upgrades {
            None => vec!["websocket".into()],
            Some(protocols) => protocols
                .iter()
                .enumerate()
                .filter_map(|(i, protocol)| {
                    let token = protocol.trim();
                    if token.is_empty() || !token.bytes().all(is_token_byte) {
                        c.problem(
                            path.key("upgrades").index(i),
                            format!("`{protocol}` is not a protocol name; expected e.g. \"websocket\""),
                        );
                        return None;
                    }
                    if token.eq_ignore_ascii_case("h2c") {
                        c.problem(
                            path.key("upgrades").index(i),
                            "h2c cannot be tunnelled: every request after the switch would bypass routing and limits",
                        );
                        return None;
                    }
                    Some(token.to_ascii_lowercase().into_boxed_str())
                })
                .collect(),
        },
        tls: None,
    }
}

/// `[server.tls]`: the listeners, and every certificate pair read and
/// checked now (see [`super::tls`]). `None` when any problem was found.
fn check_tls(
    c: &mut Checker,
    path: &KeyPath,
    directory: &Path,
    raw: &raw::RawTls,
) -> Option<TlsConfig> {
    use super::tls::{self, PairSpec, SniResolver};
    let count = raw.listen.0.len();
    if count == 0 {
        c.problem(path.key("listen"), "needs at least one address");
    }
    let listen: Vec<SocketAddr> = raw
        .listen
        .0
        .iter()
        .enumerate()
        .filter_map(|(i, text)| c.socket_addr(path.element("listen", count, i), text))
        .collect();
    let (Some(cert), Some(key)) = (&raw.cert, &raw.key) else {
        let missing = if raw.cert.is_none() { "cert" } else { "key" };
        c.problem(
            path.key(missing),
            format!(
                "`{missing}` is required: the default certificate chain and key, for clients whose SNI names none of [[server.tls.certs]]; write `cert = \"certs/gateway.crt\"` and `key = \"certs/gateway.key\"`"
            ),
        );
        return None;
    };
    let provider = tls::provider();
    let mut specs = vec![PairSpec {
        key: path.clone(),
        cert: directory.join(cert),
        private_key: directory.join(key),
    }];
    for (i, entry) in raw.certs.iter().enumerate() {
        specs.push(PairSpec {
            key: path.key("certs").index(i),
            cert: directory.join(&entry.cert),
            private_key: directory.join(&entry.key),
        });
    }
    let mut loaded = Vec::with_capacity(specs.len());
    let mut certificates = Vec::with_capacity(specs.len());
    for spec in &specs {
        match tls::load_pair(spec, &provider) {
            Ok((certified, not_after)) => {
                certificates.push(CertificateFile {
                    key: spec.key.key("cert").to_string(),
                    file: spec.cert.clone(),
                    not_after,
                });
                loaded.push(Some(certified));
            }
            Err((key, message)) => {
                c.problem(key, message);
                loaded.push(None);
            }
        }
    }
    let mut resolver = SniResolver::new(loaded[0].clone()?);
    for (i, entry) in raw.certs.iter().enumerate() {
        let names = path.key("certs").index(i).key("names");
        if entry.names.is_empty() {
            c.problem(
                names.clone(),
                "needs at least one name, e.g. names = [\"api.example.com\"]",
            );
        }
        for (j, name) in entry.names.iter().enumerate() {
            if !tls::valid_name(name) {
                c.problem(
                    names.index(j),
                    format!("`{name}` is not a DNS name; expected e.g. \"api.example.com\" or \"*.example.com\""),
                );
            } else if let Some(certified) = &loaded[i + 1]
                && !resolver.add(name, certified.clone())
            {
                c.problem(
                    names.index(j),
                    format!("`{name}` is already named by another certificate"),
                );
            }
        }
    }
    if loaded.iter().any(Option::is_none) || listen.len() != raw.listen.0.len() {
        return None;
    }
    match tls::server_config(provider, resolver) {
        Ok(server) => Some(TlsConfig {
            listen,
            server,
            certificates,
        }),
        Err(error) => {
            c.problem(
                path.clone(),
                format!("cannot build the TLS configuration: {error}"),
            );
            None
        }
    }
}

/// RFC 9110 `tchar`: what a protocol name in `Upgrade` may hold.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b)
}

fn check_client_ip(c: &mut Checker, path: &KeyPath, raw: &raw::RawClientIp) -> ClientIpConfig {
    let mut config = ClientIpConfig {
        trusted_hops: raw.trusted_hops.unwrap_or(0),
        ipv4_prefix: raw.ipv4_prefix.unwrap_or(32),
        ipv6_prefix: raw.ipv6_prefix.unwrap_or(64),
        ..ClientIpConfig::default()
    };
    if config.ipv4_prefix > 32 {
        c.problem(path.key("ipv4_prefix"), "must be between 0 and 32");
    }
    if config.ipv6_prefix > 128 {
        c.problem(path.key("ipv6_prefix"), "must be between 0 and 128");
    }
    if let Some(cidrs) = &raw.trusted_cidrs {
        if raw.trusted_hops.is_some() {
            c.problem(
                path.key("trusted_cidrs"),
                "`trusted_hops` and `trusted_cidrs` are exclusive; set one of them",
            );
        }
        for (i, text) in cidrs.iter().enumerate() {
            match text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from))
            {
                Ok(net) => config.trusted_cidrs.push(net.trunc()),
                Err(_) => c.problem(
                    path.key("trusted_cidrs").index(i),
                    format!(
                        "`{text}` is not a network; expected CIDR notation like \"10.0.0.0/8\""
                    ),
                ),
            }
        }
    }
    if let Some(header) = &raw.header {
        config.forwarded_header = c.one_of(
            path.key("header"),
            header,
            &["x-forwarded-for", "forwarded"],
        ) == Some("forwarded");
    }
    config
}

fn check_store(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawStore,
    directory: &Path,
) -> StoreConfig {
    let redis = match raw.backend.as_deref() {
        None => false,
        Some(backend) => {
            c.one_of(path.key("backend"), backend, &["memory", "redis"]) == Some("redis")
        }
    };
    if !redis {
        // The Redis settings are accepted and without effect (contract §2).
        return StoreConfig {
            backend: StoreBackend::Memory,
        };
    }
    let servers = check_redis_servers(c, path, raw, directory);
    let prefix = raw.prefix.clone().unwrap_or_else(|| "tollgate:".to_owned());
    if prefix.contains(['{', '}']) || prefix.chars().any(char::is_whitespace) {
        c.problem(
            path.key("prefix"),
            format!("`{prefix}`: a prefix cannot hold braces or spaces; like \"tollgate:\""),
        );
    }
    let timeout = c.duration(path.key("timeout"), &raw.timeout, Duration::from_millis(50));
    if timeout > Duration::from_secs(10) {
        c.problem(
            path.key("timeout"),
            "a store call is on the request path: at most \"10s\" (tens of ms is usual)",
        );
    }
    let on_failure = match raw.on_failure.as_deref() {
        None => OnFailure::Local,
        Some(text) => match c.one_of(path.key("on_failure"), text, &["local", "allow", "deny"]) {
            Some("allow") => OnFailure::Allow,
            Some("deny") => OnFailure::Deny,
            _ => OnFailure::Local,
        },
    };
    let local_fraction = match &raw.local_fraction {
        None => LocalFraction::Fixed(1_000_000),
        Some(toml::Value::Float(f)) if *f > 0.0 && *f <= 1.0 => {
            LocalFraction::Fixed((f * 1e6).round().max(1.0) as u32)
        }
        Some(toml::Value::Integer(1)) => LocalFraction::Fixed(1_000_000),
        Some(toml::Value::String(s)) if s == "auto" => LocalFraction::Auto,
        Some(other) => {
            c.problem(
                path.key("local_fraction"),
                format!("`{other}`: expected a number in (0, 1], like 0.5, or \"auto\""),
            );
            LocalFraction::Fixed(1_000_000)
        }
    };
    let remember_denials = match raw.remember_denials.as_deref().map(parse_duration) {
        // "0s" says off, as leaving it out does.
        Some(Ok(zero)) if zero.is_zero() => Duration::ZERO,
        _ => c.duration(
            path.key("remember_denials"),
            &raw.remember_denials,
            Duration::ZERO,
        ),
    };
    let (username, password) = check_redis_auth(c, path, raw, &servers, directory);
    let tls = check_redis_tls(c, path, raw, &servers, directory);
    StoreConfig {
        backend: StoreBackend::Redis(Box::new(RedisConfig {
            servers,
            username,
            password,
            tls,
            prefix,
            timeout,
            on_failure,
            local_fraction,
            remember_denials,
        })),
    }
}

/// `url` (one server, or with `cluster` the seeds) or `sentinels` +
/// `master`, each URL parsed.
fn check_redis_servers(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawStore,
    directory: &Path,
) -> RedisServers {
    let cluster = raw.cluster.unwrap_or(false);
    let parse = |c: &mut Checker, key: &str, texts: &[String]| -> Vec<RedisUrl> {
        let urls: Vec<RedisUrl> = texts
            .iter()
            .enumerate()
            .filter_map(|(i, text)| match super::store::parse_url(text) {
                Ok(url) => Some(url),
                Err(message) => {
                    c.problem(path.element(key, texts.len(), i), message);
                    None
                }
            })
            .collect();
        if urls.iter().any(|u| u.tls) && urls.iter().any(|u| !u.tls) {
            c.problem(
                path.key(key),
                "mixes redis:// and rediss:// URLs: every server is reached the same way",
            );
        }
        urls
    };
    if let Some(texts) = &raw.sentinels {
        if raw.url.is_some() {
            c.problem(
                path.key("sentinels"),
                "`url` and `sentinels` are two ways to find the Redis: give `url` for one server, or `sentinels` and `master` for a master found through Sentinel",
            );
        }
        if cluster {
            c.problem(
                path.key("cluster"),
                "Sentinel (`sentinels`) and Redis Cluster (`cluster = true`) do not go together: remove one",
            );
        }
        if texts.is_empty() {
            c.problem(
                path.key("sentinels"),
                "needs at least one sentinel, like [\"redis://10.0.0.1:26379\"]",
            );
        }
        let sentinels = parse(c, "sentinels", texts);
        for (i, url) in sentinels.iter().enumerate() {
            if url.db != 0 {
                c.problem(
                    path.element("sentinels", texts.len(), i),
                    "a sentinel URL takes no database: the master's is 0",
                );
            }
        }
        let master = match raw.master.as_deref() {
            Some(name) if !name.is_empty() && !name.contains(char::is_whitespace) => {
                name.to_owned()
            }
            Some(name) => {
                c.problem(
                    path.key("master"),
                    format!("`{name}` is no master name: write the name the sentinels monitor, like \"mymaster\""),
                );
                String::new()
            }
            None => {
                c.problem(
                    path.key("sentinels"),
                    "Sentinel needs `master = \"NAME\"` too: the name the sentinels monitor (`sentinel monitor NAME ...`)",
                );
                String::new()
            }
        };
        let password = read_password(
            c,
            path,
            ("sentinel_password_file", &raw.sentinel_password_file),
            ("sentinel_password_env", &raw.sentinel_password_env),
            directory,
        );
        if password.is_some() && sentinels.iter().any(|u| u.password.is_some()) {
            c.problem(
                path.key("sentinels"),
                "a sentinel URL holds a password and `sentinel_password_file`/`sentinel_password_env` gives one too: remove it from the URL",
            );
        }
        return RedisServers::Sentinel {
            sentinels,
            master,
            password,
        };
    }
    for key in ["sentinel_password_file", "sentinel_password_env"] {
        let set = match key {
            "sentinel_password_file" => raw.sentinel_password_file.is_some(),
            _ => raw.sentinel_password_env.is_some(),
        };
        if set {
            c.problem(
                path.key(key),
                format!("`{key}` is the sentinels' password: set `sentinels` too, or remove it"),
            );
        }
    }
    if raw.master.is_some() {
        c.problem(
            path.key("master"),
            "`master` names the master of Sentinel: set `sentinels = [...]` too, or remove it",
        );
    }
    let texts = raw.url.as_ref().map(|u| u.0.clone()).unwrap_or_default();
    if texts.is_empty() {
        c.problem(
            path.key("url"),
            "backend = \"redis\" needs a url, like url = \"redis://127.0.0.1:6379/0\" (or `sentinels` and `master`)",
        );
    }
    let urls = parse(c, "url", &texts);
    if cluster {
        if urls.iter().any(|u| u.tls) {
            c.problem(
                path.key("url"),
                "rediss:// (TLS) with cluster = true is not supported: the cluster client connects to the nodes it discovers itself; reach the cluster over a private network or a TLS tunnel",
            );
        }
        return RedisServers::Cluster(urls);
    }
    if texts.len() > 1 {
        c.problem(
            path.key("url"),
            "a list of urls is for Redis Cluster; give one url for one Redis",
        );
    }
    match urls.into_iter().next() {
        Some(url) => RedisServers::One(url),
        None => RedisServers::One(RedisUrl {
            tls: false,
            host: "127.0.0.1".to_owned(),
            port: 6379,
            db: 0,
            username: None,
            password: None,
        }),
    }
}

/// The ACL user and password of the data nodes: `username` and
/// `password_file` / `password_env`, or the URL's own; a value given twice
/// is a problem (which one would win is not obvious to a reader).
fn check_redis_auth(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawStore,
    servers: &RedisServers,
    directory: &Path,
) -> (Option<String>, Option<Secret>) {
    // The URL that carries the data nodes' credentials, if any: a
    // sentinel's are its own.
    let url = match servers {
        RedisServers::One(url) => Some(url),
        RedisServers::Cluster(urls) => urls
            .iter()
            .find(|u| u.password.is_some() || u.username.is_some()),
        RedisServers::Sentinel { .. } => None,
    };
    let mut username = raw.username.clone();
    if let Some(name) = &username
        && (name.is_empty() || name.contains(char::is_whitespace))
    {
        c.problem(
            path.key("username"),
            format!("`{name}` is no Redis user name"),
        );
        username = None;
    }
    match (&username, url.and_then(|u| u.username.clone())) {
        (Some(_), Some(_)) => c.problem(
            path.key("username"),
            "the url names a user too: give the user once, in `username` or in the url",
        ),
        (None, from_url) => username = from_url,
        _ => {}
    }
    let password = read_password(
        c,
        path,
        ("password_file", &raw.password_file),
        ("password_env", &raw.password_env),
        directory,
    );
    let from_url = url.and_then(|u| u.password.clone());
    if from_url.is_some() && (raw.password_file.is_some() || raw.password_env.is_some()) {
        c.problem(
            path.key("url"),
            "the url holds a password and `password_file`/`password_env` gives one too: remove it from the url",
        );
    }
    let password = password.or(from_url);
    let no_source = raw.password_file.is_none() && raw.password_env.is_none();
    if raw.username.is_some() && no_source && password.is_none() {
        c.problem(
            path.key("username"),
            "an ACL user logs in with a password: set `password_file` or `password_env` too",
        );
    }
    (username, password)
}

/// The password named by a `*_file` or a `*_env` key (one of them at most).
fn read_password(
    c: &mut Checker,
    path: &KeyPath,
    (file_key, file): (&str, &Option<String>),
    (env_key, env): (&str, &Option<String>),
    directory: &Path,
) -> Option<Secret> {
    if file.is_some() && env.is_some() {
        c.problem(
            path.key(env_key),
            format!("`{file_key}` and `{env_key}` are two sources of one password: give one"),
        );
    }
    let read = match (file, env) {
        (Some(file), _) => super::store::read_password_file(&directory.join(file))
            .map_err(|message| (file_key, message)),
        (None, Some(name)) => {
            super::store::read_password_env(name).map_err(|message| (env_key, message))
        }
        (None, None) => return None,
    };
    match read {
        Ok(secret) => Some(secret),
        Err((key, message)) => {
            c.problem(path.key(key), message);
            None
        }
    }
}

/// TLS for `rediss://`: `ca` and `sni` read as for HTTPS upstreams.
fn check_redis_tls(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawStore,
    servers: &RedisServers,
    directory: &Path,
) -> Option<RedisTls> {
    let tls = match servers {
        RedisServers::One(url) => url.tls,
        RedisServers::Cluster(urls) => urls.iter().any(|u| u.tls),
        RedisServers::Sentinel { sentinels, .. } => sentinels.iter().any(|u| u.tls),
    };
    if !tls {
        for (key, value) in [("ca", &raw.ca), ("sni", &raw.sni)] {
            if value.is_some() {
                c.problem(
                    path.key(key),
                    format!("`{key}` applies to rediss:// (TLS) URLs only, and the store has none"),
                );
            }
        }
        return None;
    }
    let sni = match &raw.sni {
        None => None,
        Some(name) => {
            match rustls::pki_types::ServerName::try_from(name.clone()) {
                Ok(name) => Some(name),
                Err(_) => {
                    c.problem(
                    path.key("sni"),
                    format!("`{name}` is not a DNS name or IP address; expected e.g. \"redis.internal\""),
                );
                    None
                }
            }
        }
    };
    if let (None, RedisServers::One(url)) = (&sni, servers)
        && rustls::pki_types::ServerName::try_from(url.host.as_str()).is_err()
    {
        c.problem(
            path.key("sni"),
            format!("the host of `{url}` is no name a certificate can be verified for; set `sni = \"NAME\"`"),
        );
    }
    let ca = raw.ca.as_ref().map(|file| directory.join(file));
    match RedisTls::new(ca.as_deref(), sni) {
        Ok(tls) => Some(tls),
        Err(message) => {
            c.problem(path.key("ca"), message);
            None
        }
    }
}

fn check_upstream(
    c: &mut Checker,
    path: &KeyPath,
    name: &str,
    raw: &raw::RawUpstream,
    directory: &Path,
) -> UpstreamConfig {
    if raw.url.0.is_empty() {
        c.problem(path.key("url"), "needs at least one URL");
    }
    let count = raw.url.0.len();
    let mut urls = Vec::new();
    for (i, text) in raw.url.0.iter().enumerate() {
        let key = path.element("url", count, i);
        match text.parse::<Uri>() {
            Ok(uri)
                if matches!(uri.scheme_str(), Some("http" | "https"))
                    && uri.authority().is_some() =>
            {
                if uri.query().is_some() {
                    c.problem(key, format!("`{text}`: an upstream URL cannot have a query string"));
                } else {
                    urls.push(uri);
                }
            }
            _ => c.problem(
                key,
                format!("`{text}` is not an upstream URL; expected http://HOST:PORT or https://HOST:PORT, like \"http://127.0.0.1:9000\""),
            ),
        }
    }
    let host = raw
        .host
        .as_ref()
        .and_then(|h| match HeaderValue::from_str(h) {
            Ok(v) => Some(v),
            Err(_) => {
                c.problem(
                    path.key("host"),
                    format!("`{h}` is not a valid Host header value"),
                );
                None
            }
        });
    let https = urls.iter().any(|url| url.scheme_str() == Some("https"));
    if !https {
        for (key, value) in [("ca", &raw.ca), ("sni", &raw.sni)] {
            if value.is_some() {
                c.problem(
                    path.key(key),
                    format!("`{key}` applies to https:// URLs only, and this upstream has none"),
                );
            }
        }
    }
    let tls = https
        .then(|| {
            let sni = match &raw.sni {
                None => None,
                Some(name) => match rustls::pki_types::ServerName::try_from(name.clone()) {
                    Ok(name) => Some(name),
                    Err(_) => {
                        c.problem(
                            path.key("sni"),
                            format!("`{name}` is not a DNS name or IP address; expected e.g. \"api.internal\""),
                        );
                        None
                    }
                },
            };
            if sni.is_none() {
                // The handshake verifies the certificate for the URL's host.
                for url in urls.iter().filter(|url| url.scheme_str() == Some("https")) {
                    let host = url.host().unwrap_or("");
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    if rustls::pki_types::ServerName::try_from(host).is_err() {
                        c.problem(
                            path.key("sni"),
                            format!("the host of `{url}` is no name a certificate can be verified for; set `sni = \"NAME\"`"),
                        );
                    }
                }
            }
            let ca = raw.ca.as_ref().map(|file| directory.join(file));
            match super::tls::client_config(ca.as_deref()) {
                Ok(config) => Some(ClientTls { config, sni }),
                Err(message) => {
                    c.problem(path.key("ca"), message);
                    None
                }
            }
        })
        .flatten();
    UpstreamConfig {
        name: name.to_owned(),
        urls,
        connect_timeout: c.duration(
            path.key("connect_timeout"),
            &raw.connect_timeout,
            Duration::from_secs(2),
        ),
        read_timeout: c.duration(
            path.key("read_timeout"),
            &raw.read_timeout,
            Duration::from_secs(30),
        ),
        timeout: c.duration(path.key("timeout"), &raw.timeout, Duration::from_secs(30)),
        host,
        tls,
        http2: raw.http2.unwrap_or(false),
        balance: check_balance(c, path, raw),
        slow_start: raw
            .slow_start
            .as_ref()
            .map(|_| c.duration(path.key("slow_start"), &raw.slow_start, Duration::ZERO)),
        eject: raw
            .eject
            .as_ref()
            .map_or_else(EjectPolicy::default, |eject| {
                check_eject(c, &path.key("eject"), eject)
            }),
        health: raw
            .health
            .as_ref()
            .map(|health| check_health(c, &path.key("health"), health)),
    }
}

fn check_balance(c: &mut Checker, path: &KeyPath, raw: &raw::RawUpstream) -> Balance {
    match raw.balance.as_deref() {
        None => Balance::RoundRobin,
        Some(text) => {
            match c.one_of(path.key("balance"), text, &["round_robin", "least_request"]) {
                Some("least_request") => Balance::LeastRequest,
                _ => Balance::RoundRobin,
            }
        }
    }
}

/// `eject = {...}`: the keys left out keep [`EjectPolicy::default`]'s values.
fn check_eject(c: &mut Checker, path: &KeyPath, raw: &raw::RawEject) -> EjectPolicy {
    let default = EjectPolicy::default();
    let after = raw.after.unwrap_or(default.after);
    if after == 0 {
        c.problem(
            path.key("after"),
            "must be at least 1 (to never eject, set `max_ejected = \"0%\"`)",
        );
    }
    let (mut on_connect, mut on_status) = (default.on_connect, default.on_status);
    if let Some(on) = &raw.on {
        on_connect = false;
        on_status = Vec::new();
        for (i, token) in on.iter().enumerate() {
            match token.as_str() {
                "connect" => on_connect = true,
                text => match text.parse::<u16>() {
                    Ok(status @ 500..=599) => on_status.push(status),
                    _ => c.problem(
                        path.key("on").index(i),
                        format!(
                            "`{text}` is not a failure to eject on; expected \"connect\" or a 5xx status like \"503\""
                        ),
                    ),
                },
            }
        }
    }
    let base = c.duration(path.key("base"), &raw.base, default.base);
    let max = c.duration(path.key("max"), &raw.max, default.max.max(base));
    if max < base {
        c.problem(path.key("max"), "must be at least `base`");
    }
    let max_ejected_permille = match raw.max_ejected.as_deref() {
        None => default.max_ejected_permille,
        Some(text) => parse_percent(text).unwrap_or_else(|| {
            c.problem(
                path.key("max_ejected"),
                format!("`{text}` is not a share; expected a percentage like \"50%\" (0% to 100%)"),
            );
            default.max_ejected_permille
        }),
    };
    EjectPolicy {
        after: after.max(1),
        on_connect,
        on_status,
        base,
        max: max.max(base),
        max_ejected_permille,
    }
}

/// `health = {...}`: `path` is required; the rest have defaults.
fn check_health(c: &mut Checker, path: &KeyPath, raw: &raw::RawHealth) -> HealthCheck {
    let check_path = match raw.path.as_deref() {
        None => {
            c.problem(
                path.clone(),
                "a health check needs `path`, like `path = \"/healthz\"`",
            );
            http::uri::PathAndQuery::from_static("/")
        }
        Some(text) => match http::uri::PathAndQuery::try_from(text) {
            Ok(pq) if text.starts_with('/') => pq,
            _ => {
                c.problem(
                    path.key("path"),
                    format!("`{text}` is not a request path; expected one starting with `/`, like \"/healthz\""),
                );
                http::uri::PathAndQuery::from_static("/")
            }
        },
    };
    let interval = c.duration(path.key("interval"), &raw.interval, Duration::from_secs(5));
    let timeout = c.duration(path.key("timeout"), &raw.timeout, Duration::from_secs(1));
    if timeout > interval {
        c.problem(path.key("timeout"), "must not be longer than `interval`");
    }
    let mut count = |key: &str, value: Option<u32>, default: u32| match value {
        None => default,
        Some(0) => {
            c.problem(path.key(key), "must be at least 1");
            default
        }
        Some(n) => n,
    };
    let healthy = count("healthy", raw.healthy, 2);
    let unhealthy = count("unhealthy", raw.unhealthy, 3);
    let expect = match &raw.expect {
        None => vec![(200, 399)],
        Some(list) => {
            if list.is_empty() {
                c.problem(path.key("expect"), "needs at least one status");
            }
            list.iter()
                .enumerate()
                .filter_map(|(i, value)| {
                    let range = expected_status(value);
                    if range.is_none() {
                        c.problem(
                            path.key("expect").index(i),
                            format!("`{value}` is not a status; expected one like 200 or a class like \"2xx\""),
                        );
                    }
                    range
                })
                .collect()
        }
    };
    let start_healthy = match raw.start.as_deref() {
        None => true,
        Some(text) => {
            c.one_of(path.key("start"), text, &["healthy", "unhealthy"]) != Some("unhealthy")
        }
    };
    HealthCheck {
        path: check_path,
        interval,
        timeout: timeout.min(interval),
        healthy,
        unhealthy,
        expect,
        start_healthy,
    }
}

/// A status of `health.expect`: `200` (or `"200"`), or a class `"2xx"`, as
/// an inclusive range.
fn expected_status(value: &toml::Value) -> Option<(u16, u16)> {
    let text = match value {
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::String(text) => text.trim().to_ascii_lowercase(),
        _ => return None,
    };
    if let Some(class) = text.strip_suffix("xx") {
        let digit = class.parse::<u16>().ok().filter(|d| (1..=5).contains(d))?;
        return Some((digit * 100, digit * 100 + 99));
    }
    let status = text
        .parse::<u16>()
        .ok()
        .filter(|s| (100..=599).contains(s))?;
    Some((status, status))
}

fn check_key_part(c: &mut Checker, path: KeyPath, text: &str) -> Option<KeyPart> {
    let (kind, name) = match text.split_once(':') {
        Some((kind, name)) => (kind, Some(name)),
        None => (text, None),
    };
    let named = |c: &mut Checker, name: Option<&str>| -> Option<String> {
        match name {
            Some(n) if !n.is_empty() => Some(n.to_owned()),
            _ => {
                c.problem(
                    path.clone(),
                    format!(
                        "`{text}` needs a name after the colon, like \"{kind}:{}\"",
                        if kind == "jwt" { "sub" } else { "x-api-key" }
                    ),
                );
                None
            }
        }
    };
    match kind {
        "jwt" => {
            let name = named(c, name)?;
            if !super::jwt::claim_path_is_valid(&name) {
                c.problem(
                    path,
                    format!("`{name}` is not a claim name or dotted path like \"org.id\""),
                );
                return None;
            }
            let slot = match c.claim_paths.iter().position(|p| **p == *name) {
                Some(slot) => slot,
                None => {
                    c.claim_paths.push(Arc::from(name.as_str()));
                    c.claim_paths.len() - 1
                }
            };
            Some(KeyPart::Claim {
                slot,
                path: c.claim_paths[slot].clone(),
            })
        }
        "ip" | "consumer" | "tenant" | "route" if name.is_some() => {
            c.problem(path, format!("`{kind}` takes no name; write \"{kind}\""));
            None
        }
        "ip" => Some(KeyPart::Ip),
        "consumer" => Some(KeyPart::Consumer),
        "tenant" => Some(KeyPart::Tenant),
        "route" => Some(KeyPart::Route),
        "header" => {
            let name = named(c, name)?;
            c.header_name(path, &name).map(KeyPart::Header)
        }
        "query" => named(c, name).map(KeyPart::Query),
        "cookie" => named(c, name).map(KeyPart::Cookie),
        "body" => named(c, name).map(KeyPart::BodyField),
        _ => {
            let kinds = [
                "ip", "header", "query", "cookie", "body", "consumer", "tenant", "route", "jwt",
            ];
            let mut message = format!(
                "unknown key kind `{kind}`, expected one of ip, header:NAME, query:NAME, cookie:NAME, body:FIELD, jwt:CLAIM, consumer, tenant, route"
            );
            if let Some(best) = nearest(kind, kinds) {
                message.push_str(&format!(" (did you mean `{best}`?)"));
            } else if name.is_none() && HeaderName::from_bytes(text.as_bytes()).is_ok() {
                // `key = "x-api-key"`: a header name without its kind.
                message.push_str(&format!(
                    "; to key on a request header, write \"header:{}\"",
                    text.to_ascii_lowercase()
                ));
            }
            c.problem(path, message);
            None
        }
    }
}

fn check_limit(c: &mut Checker, path: &KeyPath, name: &str, raw: &raw::RawLimit) -> LimitConfig {
    if name.is_empty() || crate::http::structured::check_string(name).is_err() {
        c.problem(
            path.clone(),
            "a limit's name must be printable ASCII: it is sent in RateLimit headers",
        );
    }
    // No key at all: a limit for `[[decision.descriptors]]` only, checked
    // with the rules that use it (`check_keyless`).
    let count = raw.key.0.len();
    let key: Vec<KeyPart> = raw
        .key
        .0
        .iter()
        .enumerate()
        .filter_map(|(i, text)| check_key_part(c, path.element("key", count, i), text))
        .collect();

    let base = raw.params();
    let mode = mode_of(c, path, raw);
    let algorithm = check_algorithm(c, &raw.algorithm, &base, mode, &|key| path.key(key));
    let mut plans = Vec::new();
    for (plan, values) in raw.plans.iter().flatten() {
        let plan_path = path.key("plans").key(plan);
        let merged = values.over(&base);
        let set = values.keys();
        let at = |key: &str| {
            if set.contains(&key) {
                plan_path.key(key)
            } else {
                path.key(key)
            }
        };
        plans.push((
            Arc::from(plan.as_str()),
            check_algorithm(c, &raw.algorithm, &merged, mode, &at),
        ));
    }
    let status = match raw.status {
        None => StatusCode::TOO_MANY_REQUESTS,
        Some(code) => match StatusCode::from_u16(code) {
            Ok(s) if (400..600).contains(&code) => s,
            _ => {
                c.problem(
                    path.key("status"),
                    format!("`{code}` is not an error status; expected 400-599"),
                );
                StatusCode::TOO_MANY_REQUESTS
            }
        },
    };
    let on_missing_key = match raw.on_missing_key.as_deref() {
        None => OnMissingKey::Skip,
        Some(text) => match c.one_of(
            path.key("on_missing_key"),
            text,
            &["skip", "deny", "shared"],
        ) {
            Some("deny") => OnMissingKey::Deny,
            Some("shared") => OnMissingKey::Shared,
            _ => OnMissingKey::Skip,
        },
    };
    let headers = raw
        .headers
        .as_ref()
        .map(|names| c.header_styles(path.key("headers"), names));
    let max_keys = match raw.max_keys {
        Some(0) => {
            c.problem(path.key("max_keys"), "must be at least 1");
            DEFAULT_MAX_KEYS
        }
        Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        None => DEFAULT_MAX_KEYS,
    };
    LimitConfig {
        name: name.to_owned(),
        key,
        algorithm,
        shadow: raw.shadow.unwrap_or(false),
        status,
        on_missing_key,
        local: raw.local.unwrap_or(false),
        lease: check_lease(c, path, raw, &algorithm),
        unit: super::tokens::check_unit(c, path, raw, &algorithm),
        headers,
        max_keys,
        plans,
        align: check_align(c, path, raw, &algorithm),
    }
}

/// `lease`: a token bucket's tokens taken from Redis N at a time, `1 <= N <=
/// capacity` (and for every plan's capacity), not with `local = true`.
fn check_lease(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawLimit,
    algorithm: &Algorithm,
) -> Option<u64> {
    let n = raw.lease?;
    let Algorithm::TokenBucket { capacity, .. } = algorithm else {
        c.problem(path.key("lease"), "applies to token_bucket limits only");
        return None;
    };
    if raw.local == Some(true) {
        c.problem(
            path.key("lease"),
            "leases are taken from the shared store: not with `local = true`",
        );
        return None;
    }
    if n == 0 || n > *capacity {
        c.problem(
            path.key("lease"),
            format!("`{n}`: expected 1 to the capacity ({capacity}), like lease = 100"),
        );
        return None;
    }
    Some(n)
}

/// `align` and `reset_jitter`: only for a fixed window of a day or longer,
/// where keys resetting together would make a thundering herd.
fn check_align(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawLimit,
    algorithm: &Algorithm,
) -> WindowAlign {
    if raw.align.is_none() && raw.reset_jitter.is_none() {
        return WindowAlign::default();
    }
    const DAY: Nanos = 86_400 * crate::limit::NANOS_PER_SEC;
    // A misplaced setting is reported at the first of the two present.
    let key = if raw.align.is_some() {
        "align"
    } else {
        "reset_jitter"
    };
    let window = match algorithm {
        Algorithm::FixedWindow { window, .. } => *window,
        _ => {
            c.problem(path.key(key), "applies to fixed_window limits only");
            return WindowAlign::default();
        }
    };
    if window < DAY {
        c.problem(path.key(key), "applies to windows of a day or longer");
        return WindowAlign::default();
    }
    let first_request = match raw.align.as_deref() {
        None => false,
        Some(text) => {
            c.one_of(path.key("align"), text, &["epoch", "first_request"]) == Some("first_request")
        }
    };
    let jitter = match &raw.reset_jitter {
        None => 0,
        Some(_) if first_request => {
            c.problem(
                path.key("reset_jitter"),
                "applies to align = \"epoch\"; first_request windows already start at different times",
            );
            0
        }
        Some(_) => {
            let jitter = c.duration(path.key("reset_jitter"), &raw.reset_jitter, Duration::ZERO);
            let jitter = u64::try_from(jitter.as_nanos()).unwrap_or(u64::MAX);
            if jitter >= window {
                c.problem(path.key("reset_jitter"), "must be shorter than the window");
            }
            jitter
        }
    };
    if first_request {
        WindowAlign::FirstRequest
    } else {
        WindowAlign::Epoch { jitter }
    }
}

fn mode_of(c: &mut Checker, path: &KeyPath, raw: &raw::RawLimit) -> Option<LeakyMode> {
    let text = raw.mode.as_deref()?;
    if raw.algorithm != "leaky_bucket" {
        c.problem(
            path.key("mode"),
            format!(
                "`mode` is a parameter of leaky_bucket, not of {}",
                raw.algorithm
            ),
        );
        return None;
    }
    match c.one_of(path.key("mode"), text, &["reject", "delay"]) {
        Some("delay") => Some(LeakyMode::Delay),
        _ => Some(LeakyMode::Reject),
    }
}

/// Checks the algorithm name and that exactly its parameters are present.
///
/// `at(key)` is where a parameter's problem is reported (a plan's own table
/// for the values it sets).
fn check_algorithm(
    c: &mut Checker,
    algorithm: &str,
    raw: &raw::RawPlan,
    mode: Option<LeakyMode>,
    at: &dyn Fn(&str) -> KeyPath,
) -> Algorithm {
    let fallback = Algorithm::Concurrency { max: 1 };
    let Some(name) = c.one_of(at("algorithm"), algorithm, &ALGORITHMS) else {
        return fallback;
    };
    let wanted: &[&str] = match name {
        "fixed_window" | "sliding_window" | "sliding_log" => &["limit", "window"],
        "token_bucket" => &["capacity", "refill"],
        "leaky_bucket" => &["capacity", "rate"],
        _ => &["max"],
    };
    for (key, is_present) in raw.present() {
        if is_present && !wanted.contains(&key) {
            c.problem(
                at(key),
                format!(
                    "`{key}` is not a parameter of {name}; it takes {}",
                    wanted.join(" and ")
                ),
            );
        }
        if !is_present && wanted.contains(&key) && !c.mistyped.contains(&at(key)) {
            c.problem(at("algorithm"), format!("{name} needs `{key}`"));
        }
    }
    let positive = |c: &mut Checker, key: &str, value: Option<u64>| -> u64 {
        match value {
            Some(0) => {
                c.problem(at(key), "must be at least 1");
                1
            }
            Some(n) => n,
            None => 1,
        }
    };
    let window = |c: &mut Checker| -> Nanos {
        let duration = c.duration(at("window"), &raw.window, Duration::from_secs(1));
        u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
    };
    let rate =
        |c: &mut Checker, key: &str, value: &Option<String>| match value.as_deref().map(parse_rate)
        {
            Some(Ok(rate)) => rate,
            Some(Err(message)) => {
                c.problem(at(key), message);
                crate::limit::Rate { tokens: 1, per: 1 }
            }
            None => crate::limit::Rate { tokens: 1, per: 1 },
        };
    match name {
        "fixed_window" => Algorithm::FixedWindow {
            limit: positive(c, "limit", raw.limit),
            window: window(c),
        },
        "sliding_window" => {
            let limit = positive(c, "limit", raw.limit);
            if limit > crate::limit::sliding_window::MAX_LIMIT {
                c.problem(
                    at("limit"),
                    format!(
                        "a sliding_window limit is at most {}",
                        crate::limit::sliding_window::MAX_LIMIT
                    ),
                );
            }
            Algorithm::SlidingWindow {
                limit,
                window: window(c),
            }
        }
        "sliding_log" => Algorithm::SlidingLog {
            limit: positive(c, "limit", raw.limit),
            window: window(c),
        },
        "token_bucket" => Algorithm::TokenBucket {
            capacity: positive(c, "capacity", raw.capacity),
            refill: rate(c, "refill", &raw.refill),
        },
        "leaky_bucket" => {
            let mode = mode.unwrap_or(LeakyMode::Reject);
            Algorithm::LeakyBucket {
                capacity: raw.capacity.unwrap_or(0),
                rate: rate(c, "rate", &raw.rate),
                mode,
            }
        }
        _ => Algorithm::Concurrency {
            max: positive(c, "max", raw.max),
        },
    }
}

fn check_route(
    c: &mut Checker,
    path: &KeyPath,
    raw: &raw::RawRoute,
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
    let route_limits = limit_references(c, &path.key("limits"), &raw.limits, limit_names);
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
    RouteConfig {
        name: raw.name.clone(),
        matcher,
        action,
        limits: route_limits,
        cost,
        cost_header,
        max_body,
        require_consumer: raw.require_consumer.unwrap_or(false),
        require_jwt: raw.require_jwt.unwrap_or(false),
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

/// Largest `max_header_bytes`: hyper's own ceiling is 400 KiB; past a MiB a
/// head is an attack, not an API call.
const MAX_HEADER_BYTES: u64 = 1 << 20;

/// Largest `max_key_body`: the buffered part of every such request is in
/// memory at once.
const MAX_KEY_BODY: u64 = 16 << 20;

/// Most worker threads: each is a thread with its own event loop and
/// per-worker state; more than cores only adds switching.
const MAX_WORKERS: u32 = 1024;

/// Most connections served at once (each holds two file descriptors while
/// proxying, its buffers and a task).
const MAX_CONNECTIONS: u32 = 1_000_000;

/// Most retries a route may ask for: more only multiply an outage.
const MAX_RETRY_ATTEMPTS: u32 = 10;

fn check_retry(c: &mut Checker, path: &KeyPath, raw: &raw::RawRetry) -> RetryPolicy {
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

/// `"20%"` → 200 (thousandths); one decimal at most (`"12.5%"`); 0–100 %.
fn parse_percent(text: &str) -> Option<u64> {
    let number = text.trim().strip_suffix('%')?.trim();
    let (whole, tenths) = match number.split_once('.') {
        Some((whole, tenth)) if tenth.len() == 1 => (whole, tenth.parse::<u64>().ok()?),
        Some(_) => return None,
        None => (number, 0),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let permille = whole.parse::<u64>().ok()?.checked_mul(10)? + tenths;
    (permille <= 1000).then_some(permille)
}

fn check_match(c: &mut Checker, path: &KeyPath, raw: &raw::RawMatch) -> RouteMatch {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(text: &str) -> String {
        match Config::from_bytes(Path::new("gateway.toml"), text.as_bytes()) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

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
    fn empty_file_is_valid_with_defaults() {
        let config = Config::from_bytes(Path::new("g.toml"), b"").unwrap();
        assert_eq!(
            config.server.listen,
            vec!["127.0.0.1:8080".parse().unwrap()]
        );
        assert_eq!(config.server.max_header_bytes, 32 * 1024);
    }

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

    #[test]
    fn log_denied_is_validated_and_located() {
        let message = errors("[server]\nlog_denied = \"sample:0\"\n");
        assert!(
            message.starts_with("gateway.toml:2:1: `server.log_denied`"),
            "{message}"
        );
        assert!(message.contains("sample:N"), "{message}");
        let config = Config::from_bytes(
            Path::new("gateway.toml"),
            b"[server]\nlog_denied = \"sample:50\"\n",
        )
        .unwrap();
        assert_eq!(
            config.server.log_denied,
            LogDenied::Sample(std::num::NonZeroU64::new(50).unwrap())
        );
    }

    #[test]
    fn trusted_hops_and_cidrs_are_exclusive() {
        let message = errors("[client_ip]\ntrusted_hops = 1\ntrusted_cidrs = [\"10.0.0.0/8\"]\n");
        assert!(message.contains("exclusive"), "{message}");
    }

    #[test]
    fn algorithm_parameters_are_checked() {
        let message = errors("[limits.a]\nkey = \"ip\"\nalgorithm = \"token_bukket\"\n");
        assert!(
            message.contains("did you mean `token_bucket`?"),
            "{message}"
        );
        let message = errors(
            "[limits.a]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\ncapacity = 3\n",
        );
        assert!(message.contains("needs `window`"), "{message}");
        assert!(
            message.contains("`capacity` is not a parameter of fixed_window"),
            "{message}"
        );
    }

    #[test]
    fn align_and_jitter_need_a_long_fixed_window() {
        let base = "[limits.a]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 5\n";
        let ok = format!("{base}window = \"1d\"\nreset_jitter = \"10m\"\n");
        let config = Config::from_bytes(Path::new("g.toml"), ok.as_bytes()).unwrap();
        assert_eq!(
            config.limits[0].align,
            WindowAlign::Epoch {
                jitter: 600 * crate::limit::NANOS_PER_SEC
            }
        );
        let first = format!("{base}window = \"7d\"\nalign = \"first_request\"\n");
        let config = Config::from_bytes(Path::new("g.toml"), first.as_bytes()).unwrap();
        assert_eq!(config.limits[0].align, WindowAlign::FirstRequest);
        let short = format!("{base}window = \"1h\"\nalign = \"first_request\"\n");
        assert!(
            errors(&short).contains(
                "gateway.toml:6:1: `limits.a.align`: applies to windows of a day or longer"
            ),
            "{}",
            errors(&short)
        );
        let long_jitter = format!("{base}window = \"1d\"\nreset_jitter = \"2d\"\n");
        assert!(errors(&long_jitter).contains("shorter than the window"));
    }

    #[test]
    fn strip_port_keeps_ipv6_brackets() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        assert_eq!(strip_port("example.com"), "example.com");
    }

    #[test]
    fn a_store_password_shows_in_no_debug_output() {
        let text =
            "[store]\nbackend = \"redis\"\nurl = \"redis://tollgate:hunter2@127.0.0.1:6379/1\"\n";
        let config = Config::from_bytes(Path::new("g.toml"), text.as_bytes()).unwrap();
        let redis = config.store.redis().unwrap();
        assert_eq!(redis.username.as_deref(), Some("tollgate"));
        assert_eq!(redis.password.as_ref().map(Secret::expose), Some("hunter2"));
        assert!(!format!("{config:?}").contains("hunter2"));
        assert_eq!(
            redis.servers.to_string(),
            "redis://tollgate:<redacted>@127.0.0.1:6379/1"
        );
    }

    #[test]
    fn a_user_or_password_given_twice_is_a_problem() {
        let message = errors(
            "[store]\nbackend = \"redis\"\nurl = \"redis://a@127.0.0.1:6379\"\nusername = \"b\"\npassword_file = \"f\"\npassword_env = \"E\"\n",
        );
        assert!(
            message.contains("`store.username`: the url names a user too"),
            "{message}"
        );
        assert!(
            message.contains(
                "`store.password_env`: `password_file` and `password_env` are two sources"
            ),
            "{message}"
        );
        let message =
            errors("[store]\nbackend = \"redis\"\nmaster = \"m\"\nurl = \"redis://h:1\"\n");
        assert!(
            message.contains("`store.master`: `master` names the master of Sentinel"),
            "{message}"
        );
        let message =
            errors("[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\nusername = \"u\"\n");
        assert!(
            message.contains("`store.username`: an ACL user logs in with a password"),
            "{message}"
        );
    }

    #[test]
    fn upstream_health_keys_have_defaults_and_are_checked() {
        let plain = "[upstreams.api]\nurl = [\"http://127.0.0.1:1\", \"http://127.0.0.1:2\"]\n";
        let config = Config::from_bytes(Path::new("gateway.toml"), plain.as_bytes()).unwrap();
        let api = &config.upstreams[0];
        assert_eq!(api.balance, Balance::RoundRobin);
        assert_eq!(api.eject, EjectPolicy::default());
        assert_eq!(api.eject.max_ejected(2), 1);
        assert_eq!(api.eject.max_ejected(1), 0, "a lone URL is never ejected");
        assert_eq!((api.health.clone(), api.slow_start), (None, None));

        let full = format!(
            "{plain}balance = \"least_request\"\nslow_start = \"30s\"\n\
             eject = {{ after = 1, on = [\"connect\", \"500\"], base = \"5s\", max = \"1m\", max_ejected = \"100%\" }}\n\
             health = {{ path = \"/healthz?deep=1\", interval = \"2s\", timeout = \"500ms\", healthy = 1, unhealthy = 2, expect = [204, \"3xx\"], start = \"unhealthy\" }}\n"
        );
        let config = Config::from_bytes(Path::new("gateway.toml"), full.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        let api = &config.upstreams[0];
        assert_eq!(api.balance, Balance::LeastRequest);
        assert_eq!(api.slow_start, Some(Duration::from_secs(30)));
        assert_eq!(
            api.eject,
            EjectPolicy {
                after: 1,
                on_connect: true,
                on_status: vec![500],
                base: Duration::from_secs(5),
                max: Duration::from_secs(60),
                max_ejected_permille: 1000,
            }
        );
        let health = api.health.as_ref().unwrap();
        assert_eq!(health.path.as_str(), "/healthz?deep=1");
        assert_eq!(health.expect, vec![(204, 204), (300, 399)]);
        assert!(health.passes(302) && !health.passes(200));
        assert!(!health.start_healthy);

        let bad = format!(
            "{plain}balance = \"least_requests\"\n\
             eject = {{ after = 0, on = [\"404\"], base = \"10s\", max = \"1s\", max_ejected = \"half\" }}\n\
             health = {{ interval = \"1s\", timeout = \"2s\", healthy = 0, expect = [\"6xx\"], start = \"sick\" }}\n"
        );
        let message = errors(&bad);
        for wanted in [
            "gateway.toml:3:1: `upstreams.api.balance`: unknown value `least_requests`, expected one of round_robin, least_request (did you mean `least_request`?)",
            "`upstreams.api.eject.after`: must be at least 1",
            "`upstreams.api.eject.on[0]`: `404` is not a failure to eject on",
            "`upstreams.api.eject.max`: must be at least `base`",
            "`upstreams.api.eject.max_ejected`: `half` is not a share",
            "`upstreams.api.health`: a health check needs `path`",
            "`upstreams.api.health.timeout`: must not be longer than `interval`",
            "`upstreams.api.health.healthy`: must be at least 1",
            "`upstreams.api.health.expect[0]`: `\"6xx\"` is not a status",
            "`upstreams.api.health.start`: unknown value `sick`",
        ] {
            assert!(message.contains(wanted), "{wanted}\n{message}");
        }
    }
}
