//! The serde mirror of `gateway.toml`: every table rejects unknown keys, values
//! stay as the user wrote them (strings for durations, rates and sizes), and
//! nothing here is validated beyond TOML types. `validate.rs` turns this into the
//! typed [`Config`](super::Config), collecting every problem with its key path.

use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

/// One value or a list of them: `listen = "a"` or `listen = ["a", "b"]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneOrMany<T>(pub Vec<T>);

impl<T> Default for OneOrMany<T> {
    fn default() -> Self {
        OneOrMany(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OneOrManyVisitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrManyVisitor<T> {
            type Value = OneOrMany<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                T::deserialize(de::value::StrDeserializer::new(v)).map(|t| OneOrMany(vec![t]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(OneOrMany(items))
            }
        }
        deserializer.deserialize_any(OneOrManyVisitor(std::marker::PhantomData))
    }
}

/// A size: an integer number of bytes or a string with a unit (`"64KiB"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawSize {
    Bytes(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = RawSize;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a size in bytes or a string like \"64KiB\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawSize, E> {
                Ok(RawSize::Bytes(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawSize, E> {
                Ok(RawSize::Bytes(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawSize, E> {
                Ok(RawSize::Text(v.to_owned()))
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub server: RawServer,
    #[serde(default)]
    pub client_ip: RawClientIp,
    #[serde(default)]
    pub store: RawStore,
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    pub limits: BTreeMap<String, RawLimit>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    #[serde(default)]
    pub consumers: BTreeMap<String, RawConsumer>,
    #[serde(default)]
    pub api_keys: RawApiKeys,
}

/// How API keys are read and what an unknown one means.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApiKeys {
    pub header: Option<String>,
    pub unknown_key: Option<String>,
    pub file: Option<String>,
}

/// A separate consumers file: only `[consumers."KEY"]` tables.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConsumersFile {
    #[serde(default)]
    pub consumers: BTreeMap<String, RawConsumer>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: Option<OneOrMany<String>>,
    pub admin: Option<String>,
    pub shutdown_timeout: Option<String>,
    pub workers: Option<u32>,
    pub header_read_timeout: Option<String>,
    pub body_read_timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub max_header_bytes: Option<RawSize>,
    pub max_connections: Option<u32>,
    pub max_key_body: Option<RawSize>,
    pub headers: Option<Vec<String>>,
    pub log_denied: Option<String>,
    pub path_normalization: Option<bool>,
    pub escaped_slashes: Option<String>,
    pub upgrades: Option<Vec<String>>,
    pub tls: Option<RawTls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub listen: OneOrMany<String>,
    /// The default certificate chain and key: for clients whose SNI names
    /// none of `certs` (or send no SNI).
    pub cert: Option<String>,
    pub key: Option<String>,
    #[serde(default)]
    pub certs: Vec<RawTlsCert>,
}

/// `[[server.tls.certs]]`: a certificate served to clients whose SNI is one
/// of `names`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTlsCert {
    pub names: Vec<String>,
    pub cert: String,
    pub key: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawClientIp {
    pub trusted_hops: Option<u32>,
    pub trusted_cidrs: Option<Vec<String>>,
    pub header: Option<String>,
    pub ipv6_prefix: Option<u8>,
    pub ipv4_prefix: Option<u8>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStore {
    pub backend: Option<String>,
    pub url: Option<OneOrMany<String>>,
    pub cluster: Option<bool>,
    pub prefix: Option<String>,
    pub timeout: Option<String>,
    pub on_failure: Option<String>,
    pub local_fraction: Option<toml::Value>,
    /// `rediss://` only: a PEM file of the CA certificates to trust instead
    /// of the built-in roots.
    pub ca: Option<String>,
    /// `rediss://` only: the name to verify the certificate for, instead of
    /// the host connected to.
    pub sni: Option<String>,
    /// The Redis ACL user.
    pub username: Option<String>,
    /// A file holding the password (one trailing newline ignored).
    pub password_file: Option<String>,
    /// The name of an environment variable holding the password.
    pub password_env: Option<String>,
    /// Sentinel instead of `url`: the sentinels' URLs, and the name of the
    /// master they monitor.
    pub sentinels: Option<Vec<String>>,
    pub master: Option<String>,
    /// The sentinels' own password (their `requirepass`), as for the data
    /// nodes' `password_file` / `password_env`.
    pub sentinel_password_file: Option<String>,
    pub sentinel_password_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub url: OneOrMany<String>,
    pub connect_timeout: Option<String>,
    pub read_timeout: Option<String>,
    pub timeout: Option<String>,
    pub host: Option<String>,
    /// HTTPS only: a PEM file of the CA certificates to trust instead of the
    /// built-in roots.
    pub ca: Option<String>,
    /// HTTPS only: the name to send as SNI and verify the certificate for,
    /// instead of the URL's host.
    pub sni: Option<String>,
    /// Speak HTTP/2 to this upstream (ALPN `h2` over TLS, prior knowledge
    /// over cleartext).
    pub http2: Option<bool>,
    /// `"round_robin"` or `"least_request"`.
    pub balance: Option<String>,
    /// How long a URL that comes back takes to reach its full share.
    pub slow_start: Option<String>,
    /// Passive health: when a failing URL is ejected.
    pub eject: Option<RawEject>,
    /// Active health checks.
    pub health: Option<RawHealth>,
}

/// `eject = { after = 3, on = [...], base = "10s", max = "5m", max_ejected = "50%" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEject {
    pub after: Option<u32>,
    pub on: Option<Vec<String>>,
    pub base: Option<String>,
    pub max: Option<String>,
    pub max_ejected: Option<String>,
}

/// `health = { path = "/healthz", interval = "5s", timeout = "1s", healthy = 2,
/// unhealthy = 3, expect = ["2xx", "3xx"], start = "healthy" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHealth {
    pub path: Option<String>,
    pub interval: Option<String>,
    pub timeout: Option<String>,
    pub healthy: Option<u32>,
    pub unhealthy: Option<u32>,
    /// Statuses (`200`) or classes (`"2xx"`).
    pub expect: Option<Vec<toml::Value>>,
    pub start: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimit {
    pub key: OneOrMany<String>,
    pub algorithm: String,
    pub limit: Option<u64>,
    pub window: Option<String>,
    pub capacity: Option<u64>,
    pub refill: Option<String>,
    pub rate: Option<String>,
    pub mode: Option<String>,
    pub max: Option<u64>,
    pub shadow: Option<bool>,
    pub status: Option<u16>,
    pub on_missing_key: Option<String>,
    pub local: Option<bool>,
    /// Token leasing from a shared (Redis) token bucket.
    pub lease: Option<u64>,
    pub headers: Option<Vec<String>>,
    pub max_keys: Option<u64>,
    pub plans: Option<BTreeMap<String, RawPlan>>,
    pub align: Option<String>,
    pub reset_jitter: Option<String>,
}

/// Per-plan values of a limit's algorithm parameters.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPlan {
    pub limit: Option<u64>,
    pub window: Option<String>,
    pub capacity: Option<u64>,
    pub refill: Option<String>,
    pub rate: Option<String>,
    pub max: Option<u64>,
}

impl RawPlan {
    /// Each algorithm parameter's key, and whether this plan sets it.
    pub fn present(&self) -> [(&'static str, bool); 6] {
        [
            ("limit", self.limit.is_some()),
            ("window", self.window.is_some()),
            ("capacity", self.capacity.is_some()),
            ("refill", self.refill.is_some()),
            ("rate", self.rate.is_some()),
            ("max", self.max.is_some()),
        ]
    }

    /// The parameter keys this plan sets.
    pub fn keys(&self) -> Vec<&'static str> {
        self.present()
            .into_iter()
            .filter_map(|(key, present)| present.then_some(key))
            .collect()
    }

    /// `self` over `base`: the plan's values win.
    pub fn over(&self, base: &RawPlan) -> RawPlan {
        RawPlan {
            limit: self.limit.or(base.limit),
            window: self.window.clone().or_else(|| base.window.clone()),
            capacity: self.capacity.or(base.capacity),
            refill: self.refill.clone().or_else(|| base.refill.clone()),
            rate: self.rate.clone().or_else(|| base.rate.clone()),
            max: self.max.or(base.max),
        }
    }
}

impl RawLimit {
    /// The algorithm parameters of the limit itself.
    pub fn params(&self) -> RawPlan {
        RawPlan {
            limit: self.limit,
            window: self.window.clone(),
            capacity: self.capacity,
            refill: self.refill.clone(),
            rate: self.rate.clone(),
            max: self.max,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: String,
    #[serde(rename = "match", default)]
    pub matcher: RawMatch,
    pub upstream: Option<String>,
    pub respond: Option<RawRespond>,
    #[serde(default)]
    pub limits: Vec<String>,
    pub cost: Option<u64>,
    pub cost_header: Option<String>,
    pub max_body: Option<RawSize>,
    pub require_consumer: Option<bool>,
    pub retry: Option<RawRetry>,
}

/// `retry = { attempts = 2, on = [...], base = "25ms", cap = "1s", budget = "20%" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    pub attempts: Option<u32>,
    pub on: Option<Vec<String>>,
    pub base: Option<String>,
    pub cap: Option<String>,
    pub budget: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMatch {
    pub path: Option<String>,
    pub path_prefix: Option<String>,
    pub methods: Option<Vec<String>>,
    pub host: Option<String>,
    pub header: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRespond {
    pub status: Option<u16>,
    pub body: Option<String>,
    pub content_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConsumer {
    pub consumer: String,
    pub tenant: Option<String>,
    pub plan: Option<String>,
}
