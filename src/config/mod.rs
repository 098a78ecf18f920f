//! `gateway.toml`: loading, validation and the typed configuration.
//!
//! Two layers, as in rust-rpxy: a serde mirror of the file (unknown keys
//! rejected), then validated types that make bad states unrepresentable
//! (socket addresses, durations, exact rates, resolved references by
//! index). Every problem carries its key path and is located in the file by
//! line and column ([`error`]).
//!
//! One file per section, each holding the section's serde mirror, its
//! validated types and its check: [`server`] (with [`tls`] for
//! `[server.tls]`), [`client_ip`], [`store`], [`upstreams`], [`limits`]
//! (with [`tokens`] for token quotas and spend budgets, [`amount`] for
//! their exact numbers), [`prices`], [`routes`], [`decision`],
//! [`consumers`] (`[api_keys]` and `[consumers]`), [`plans`], [`jwt`],
//! [`usage`] and [`tracing`]. [`validate`]
//! is the driver: it deserializes the file ([`raw`] is the top of the
//! mirror), calls each section's check in order, and places the problems.
//! [`admin_token`] reads `[server]`'s admin token, [`quota_route`] checks
//! `respond = { quota = [...] }`. The shared pieces: [`checker`] (the problem collector and its value
//! readers), [`units`] (durations, rates, sizes, shares) and [`warnings`]
//! (what is valid but likely a mistake).

pub(crate) mod admin_token;
pub(crate) mod amount;
pub(crate) mod checker;
pub(crate) mod client_ip;
pub(crate) mod consumers;
pub(crate) mod decision;
pub(crate) mod error;
pub(crate) mod http_url;
pub(crate) mod jwt;
pub(crate) mod limits;
pub(crate) mod plans;
pub(crate) mod prices;
pub(crate) mod quota_route;
pub(crate) mod raw;
pub(crate) mod routes;
pub(crate) mod server;
pub(crate) mod slots;
pub(crate) mod store;
pub(crate) mod tls;
pub(crate) mod tokens;
pub(crate) mod tracing;
pub(crate) mod units;
pub(crate) mod upstreams;
pub(crate) mod usage;
pub(crate) mod validate;
pub mod warnings;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) use client_ip::ClientIpConfig;
pub use consumers::Consumer;
pub(crate) use consumers::{ApiKeyConfig, ApiKeySource};
pub use decision::DecisionConfig;
pub(crate) use decision::{DescriptorRule, ValueMatch};
pub(crate) use error::{ConfigError, KeyPath, Problem};
pub(crate) use limits::OnMissingKey;
pub use limits::{KeyPart, LimitConfig};
pub use routes::RouteConfig;
pub(crate) use routes::{RetryPolicy, RouteAction, RouteMatch};
pub(crate) use server::HeaderStyles;
pub use server::ServerConfig;
pub(crate) use store::{
    LocalFraction, OnFailure, RedisConfig, RedisServers, RedisTls, RedisUrl, Secret, StoreBackend,
    StoreConfig,
};
pub(crate) use tls::ClientTls;
pub use tracing::TracingConfig;
pub(crate) use upstreams::{Balance, EjectPolicy, HealthCheck, UpstreamConfig};

pub(crate) use crate::http::path::EscapedSlashes;

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
    /// `[plans.NAME]`: what a plan says beside its limits' numbers.
    pub(crate) plans: Vec<plans::PlanConfig>,
    /// `[decision]`: the decision service, when configured.
    pub decision: Option<DecisionConfig>,
    /// `[jwt]`: the issuers whose tokens identify callers, when configured.
    pub jwt: Option<jwt::JwtConfig>,
    /// `[usage]`: where usage events go, when configured.
    pub usage: Option<usage::UsageConfig>,
    /// `[prices]`: what a model's tokens cost, for `unit = "usd"` limits.
    pub prices: crate::llm::price::Prices,
    /// `[tracing]`: OpenTelemetry traces, when configured.
    pub tracing: Option<TracingConfig>,
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
