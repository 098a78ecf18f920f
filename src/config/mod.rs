//! `gateway.toml`: loading, validation and the typed configuration.
//!
//! Two layers, as in rust-rpxy: [`raw`] mirrors the file with serde (unknown
//! keys rejected), [`validate`] turns it into [`Config`], whose types make bad
//! states unrepresentable (socket addresses, durations, exact rates, resolved
//! references by index). Every problem carries its key path and is located in
//! the file by line and column ([`error`]).

pub(crate) mod checker;
pub(crate) mod error;
pub(crate) mod jwt;
pub(crate) mod raw;
pub(crate) mod store;
pub(crate) mod tls;
pub(crate) mod tokens;
pub(crate) mod units;
pub(crate) mod validate;
pub mod warnings;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use ipnet::IpNet;

pub(crate) use error::{ConfigError, KeyPath, Problem};
pub(crate) use store::{RedisServers, RedisTls, RedisUrl, Secret};
pub(crate) use tls::{CertificateFile, ClientTls, TlsConfig};

use crate::access_log::LogDenied;
pub(crate) use crate::http::path::EscapedSlashes;
use crate::limit::{Algorithm, WindowAlign};

/// A validated configuration, with the bytes it came from.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was loaded from.
    pub path: PathBuf,
    /// SHA-256 of the file's bytes, lowercase hex.
    pub(crate) sha256: String,
    pub server: ServerConfig,
    pub(crate) client_ip: ClientIpConfig,
    pub(crate) store: StoreConfig,
    pub(crate) upstreams: Vec<UpstreamConfig>,
    pub limits: Vec<LimitConfig>,
    pub routes: Vec<RouteConfig>,
    pub(crate) api_keys: ApiKeyConfig,
    /// API key → consumer; shared, as it may hold many keys.
    pub consumers: Arc<HashMap<String, Consumer>>,
    /// `[decision]`: the decision service, when configured.
    pub decision: Option<DecisionConfig>,
    /// `[jwt]`: the issuers whose tokens identify callers, when configured.
    pub jwt: Option<jwt::JwtConfig>,
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
    /// Indexes into [`Config::limits`]: the limits a matching descriptor is
    /// charged on, keyed by its entries' values.
    pub(crate) limits: Vec<usize>,
    /// Indexes into [`Config::limits`]: limits of other descriptors of the
    /// same call that this rule's limits replace (envoyproxy/ratelimit's
    /// `replaces`).
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

/// Where the API key is read and what an unknown one means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiKeyConfig {
    pub(crate) source: ApiKeySource,
    /// A presented key not in `[consumers]`: 401 everywhere (`true`), or
    /// anonymous except on routes with `require_consumer` (`false`, default).
    pub(crate) reject_unknown: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiKeySource {
    /// The whole value of this header (default `x-api-key`).
    Header(HeaderName),
    /// `Authorization: Bearer <key>`.
    Bearer,
}

/// Who an API key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    pub(crate) consumer: Arc<str>,
    pub(crate) tenant: Option<Arc<str>>,
    pub(crate) plan: Option<Arc<str>>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: Vec<SocketAddr>,
    pub(crate) admin: Option<SocketAddr>,
    pub(crate) shutdown_timeout: Duration,
    /// Worker threads (thread-per-core, see `crate::worker`); 0 means one per
    /// CPU core.
    pub workers: usize,
    pub(crate) header_read_timeout: Duration,
    /// Longest wait for the next bytes of a request body (408 past it).
    pub(crate) body_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_header_bytes: usize,
    pub max_connections: usize,
    pub(crate) max_key_body: usize,
    /// Which rate-limit header families responses carry, unless a limit overrides.
    pub(crate) headers: HeaderStyles,
    /// Which denied requests get an access-log line (`"all"`, `"sample:N"`, `"none"`).
    pub(crate) log_denied: LogDenied,
    /// Route, key and forward on the normalised path (`crate::http::path`);
    /// `false` uses the raw path.
    pub(crate) path_normalization: bool,
    /// What an encoded `/` or `\` in a path means.
    pub(crate) escaped_slashes: EscapedSlashes,
    /// The `Upgrade` protocols that are tunnelled (lower case, e.g.
    /// `websocket`); any other `Upgrade` is dropped before forwarding.
    pub(crate) upgrades: Vec<Box<str>>,
    /// `[server.tls]`: TLS listeners and their certificates, read from their
    /// files when this configuration was loaded.
    pub(crate) tls: Option<TlsConfig>,
}

/// Which families of rate-limit headers to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct HeaderStyles {
    /// `RateLimit` / `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
    pub(crate) draft: bool,
    /// `X-RateLimit-Limit` / `-Remaining` / `-Reset`.
    pub(crate) legacy: bool,
    /// `RateLimit-Limit` / `-Remaining` / `-Reset` (the older draft).
    pub(crate) trio: bool,
}

impl Default for HeaderStyles {
    fn default() -> Self {
        HeaderStyles {
            draft: true,
            legacy: true,
            trio: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ClientIpConfig {
    pub(crate) trusted_hops: u32,
    pub(crate) trusted_cidrs: Vec<IpNet>,
    /// Read RFC 7239 `Forwarded` instead of `X-Forwarded-For`.
    pub(crate) forwarded_header: bool,
    pub(crate) ipv4_prefix: u8,
    pub(crate) ipv6_prefix: u8,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreBackend {
    Memory,
    /// Boxed: the Redis settings are large and read once at start.
    Redis(Box<RedisConfig>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoreConfig {
    pub(crate) backend: StoreBackend,
}

impl StoreConfig {
    /// The Redis settings, when limits are shared through Redis.
    pub(crate) fn redis(&self) -> Option<&RedisConfig> {
        match &self.backend {
            StoreBackend::Redis(redis) => Some(redis),
            StoreBackend::Memory => None,
        }
    }
}

/// `[store]` with `backend = "redis"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedisConfig {
    /// One server, a Redis Cluster's seed nodes, or a Sentinel master.
    pub(crate) servers: RedisServers,
    /// The ACL user of the data nodes (`username`, or the URL's).
    pub(crate) username: Option<String>,
    /// Their password (`password_file`, `password_env`, or the URL's).
    pub(crate) password: Option<Secret>,
    /// How `rediss://` connections are made; `None` over plain TCP.
    pub(crate) tls: Option<RedisTls>,
    /// Prepended to every key the gateway writes.
    pub(crate) prefix: String,
    /// The most one store call may take before it counts as a failure.
    pub(crate) timeout: Duration,
    pub(crate) on_failure: OnFailure,
    /// Node-local fallback limits are the shared ones times this.
    pub(crate) local_fraction: LocalFraction,
    /// The longest a node answers a key's repeated denials from memory
    /// (`remember_denials`; zero: every decision asks Redis).
    pub(crate) remember_denials: Duration,
}

impl RedisConfig {
    /// Redis Cluster: keys are grouped by slot.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.servers, RedisServers::Cluster(_))
    }
}

/// `store.local_fraction`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LocalFraction {
    /// In millionths (1.0 = 1_000_000).
    Fixed(u32),
    /// 1/N, N the live gateway nodes counted by heartbeats in Redis.
    Auto,
}

/// What a limited request gets while the store is unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnFailure {
    /// The same limits in node memory, scaled by `local_fraction`.
    Local,
    /// Admitted, unlimited by the shared limits.
    Allow,
    /// 503 problem+json; `/readyz` is 503.
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UpstreamConfig {
    pub(crate) name: String,
    /// Base URIs (scheme + authority + optional path prefix), tried round robin.
    pub(crate) urls: Vec<Uri>,
    pub(crate) connect_timeout: Duration,
    /// Longest wait for the next bytes of a response body: a stalled
    /// upstream's body is cut and its connection dropped.
    pub(crate) read_timeout: Duration,
    /// Deadline for the whole upstream response head.
    pub(crate) timeout: Duration,
    /// Host header to send instead of the client's.
    pub(crate) host: Option<HeaderValue>,
    /// How `https://` URLs are connected to (trust roots, SNI); `None` when
    /// every URL is `http://`.
    pub(crate) tls: Option<ClientTls>,
    /// HTTP/2 to the upstream (`http2 = true`): hyper's client, one
    /// multiplexed connection per URL, instead of the HTTP/1.1 pool.
    pub(crate) http2: bool,
    /// How requests are spread over `urls` (`balance`).
    pub(crate) balance: Balance,
    /// A URL that comes back (from an ejection or a failed health check)
    /// ramps up to its full share over this long (`slow_start`); `None`:
    /// at once.
    pub(crate) slow_start: Option<Duration>,
    /// Passive health: when a failing URL is ejected (`eject = {...}`).
    pub(crate) eject: EjectPolicy,
    /// Active health checks (`health = {...}`), off when `None`.
    pub(crate) health: Option<HealthCheck>,
}

/// What a limit counts requests by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyPart {
    Ip,
    Header(HeaderName),
    Query(String),
    Cookie(String),
    BodyField(String),
    Consumer,
    Tenant,
    Route,
    /// `jwt:CLAIM`: a claim of the caller's verified token, by its slot in
    /// [`jwt::JwtConfig::claim_paths`] (the path is kept for messages).
    Claim {
        slot: usize,
        path: Arc<str>,
    },
}

/// What a limit does with a request that lacks its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum OnMissingKey {
    Skip,
    Deny,
    Shared,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitConfig {
    pub name: String,
    /// The parts of the key, joined into one composite key.
    pub key: Vec<KeyPart>,
    pub algorithm: Algorithm,
    pub(crate) shadow: bool,
    pub(crate) status: StatusCode,
    pub(crate) on_missing_key: OnMissingKey,
    pub(crate) local: bool,
    pub(crate) headers: Option<HeaderStyles>,
    /// Most keys held in memory for this limit.
    pub(crate) max_keys: usize,
    /// Per-plan parameters (same algorithm kind), chosen by the consumer's plan.
    pub(crate) plans: Vec<(Arc<str>, Algorithm)>,
    /// Fixed windows of a day or longer: where each key's boundaries fall.
    pub(crate) align: WindowAlign,
    /// A shared token bucket: tokens a node takes from Redis at a time and
    /// spends locally (`lease = N`); `None` without leasing.
    pub(crate) lease: Option<u64>,
    /// What it counts: requests (charged `cost`) or tokens.
    pub(crate) unit: tokens::Unit,
}

#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub(crate) name: String,
    pub(crate) matcher: RouteMatch,
    pub(crate) action: RouteAction,
    /// Indexes into [`Config::limits`], narrowest first.
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

#[derive(Debug, Clone, Default)]
pub(crate) struct RouteMatch {
    pub(crate) path: Option<String>,
    pub(crate) path_prefix: Option<String>,
    pub(crate) methods: Option<Vec<Method>>,
    /// Lowercased, without port.
    pub(crate) host: Option<String>,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
}

#[derive(Debug, Clone)]
pub(crate) enum RouteAction {
    /// Forward to [`Config::upstreams`]`[index]`.
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
}

impl Config {
    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let bytes = std::fs::read(path).map_err(|e| ConfigError::io(path, &e))?;
        Config::from_bytes(path, &bytes)
    }

    /// Validates `bytes` as the contents of `path` (used for messages and for
    /// resolving relative paths).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Config, ConfigError> {
        validate::validate(path, bytes)
    }

    /// A problem found after validation (e.g. `server.listen` cannot be
    /// bound) located in this configuration's file like a validation error:
    /// the file is read again for the key's line (a cold path).
    pub fn problem_at(&self, key: &[&str], message: impl Into<String>) -> ConfigError {
        let path = KeyPath(
            key.iter()
                .map(|k| error::PathSegment::Key((*k).to_owned()))
                .collect(),
        );
        let mut problem = Problem::new(path, message);
        if let Ok(text) = std::fs::read_to_string(&self.path)
            && let Ok(document) = toml::de::DeTable::parse(&text)
        {
            problem.position = error::span_of(document.get_ref(), &problem.path)
                .map(|span| error::line_column(&text, span.start));
        }
        ConfigError {
            file: self.path.clone(),
            problems: vec![problem],
        }
    }
}

/// How an upstream spreads requests over its URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Balance {
    /// Each URL in turn.
    RoundRobin,
    /// The power of two choices: of two URLs drawn at random, the one with
    /// fewer requests in flight.
    LeastRequest,
}

/// Passive health (outlier detection), `eject = {...}`: a URL failing
/// `after` times in a row is ejected for `base × n` (n: its ejections so
/// far), at most `max`, while no more than `max_ejected` of the list is out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EjectPolicy {
    /// Consecutive failures that eject a URL (at least 1).
    pub(crate) after: u32,
    /// A connection that could not be opened, or that failed before an
    /// answer, is a failure (`"connect"`).
    pub(crate) on_connect: bool,
    /// Response statuses that are failures (5xx); `504` also counts a
    /// response head that did not come within `timeout`.
    pub(crate) on_status: Vec<u16>,
    pub(crate) base: Duration,
    pub(crate) max: Duration,
    /// The largest share of the list ejected at once, in thousandths
    /// (`"50%"` is 500; `"0%"` never ejects).
    pub(crate) max_ejected_permille: u64,
}

impl EjectPolicy {
    /// Whether a response of `status` counts as a failure.
    pub(crate) fn fails_on(&self, status: u16) -> bool {
        // `on_status` holds 5xx only (validation): every response below 500
        // is decided without a look at the list (~30 instructions each).
        status >= 500 && self.on_status.contains(&status)
    }

    /// Most URLs of a list of `urls` ejected at once: the share, rounded down.
    pub(crate) fn max_ejected(&self, urls: usize) -> usize {
        (urls as u64 * self.max_ejected_permille / 1000) as usize
    }
}

impl Default for EjectPolicy {
    /// `eject = { after = 3, on = ["connect", "502", "503", "504"], base =
    /// "10s", max = "5m", max_ejected = "50%" }`.
    fn default() -> Self {
        EjectPolicy {
            after: 3,
            on_connect: true,
            on_status: vec![502, 503, 504],
            base: Duration::from_secs(10),
            max: Duration::from_secs(300),
            max_ejected_permille: 500,
        }
    }
}

/// Active health checks, `health = {...}`: `GET path` on every URL each
/// `interval`, spoken as the upstream is (HTTPS, HTTP/2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HealthCheck {
    /// Path and query of the check, after the URL's own path prefix.
    pub(crate) path: http::uri::PathAndQuery,
    pub(crate) interval: Duration,
    /// No response head within this is a failed check.
    pub(crate) timeout: Duration,
    /// Passed checks in a row that bring a URL that is down back.
    pub(crate) healthy: u32,
    /// Failed checks in a row that take a URL down.
    pub(crate) unhealthy: u32,
    /// The statuses that pass, as inclusive ranges.
    pub(crate) expect: Vec<(u16, u16)>,
    /// A URL is up before its first check (`start = "healthy"`, the
    /// default), or down until it has passed `healthy` checks.
    pub(crate) start_healthy: bool,
}

impl HealthCheck {
    /// Whether a check answered `status` passed.
    pub(crate) fn passes(&self, status: u16) -> bool {
        self.expect
            .iter()
            .any(|&(low, high)| (low..=high).contains(&status))
    }
}
