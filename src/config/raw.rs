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
pub(crate) struct OneOrMany<T>(pub(crate) Vec<T>);

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
pub(crate) enum RawSize {
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
    pub(crate) decision: Option<RawDecision>,
    pub(crate) jwt: Option<RawJwt>,
}

/// `[jwt]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwt {
    /// Where tokens are read for every issuer without its own source.
    pub(crate) header: Option<String>,
    pub(crate) cookie: Option<String>,
    /// Verified tokens kept (0: verify every request).
    pub(crate) cache_size: Option<u64>,
    #[serde(default)]
    pub(crate) issuers: Vec<RawIssuer>,
}

/// `[[jwt.issuers]]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIssuer {
    pub(crate) issuer: String,
    pub(crate) jwks: Option<String>,
    pub(crate) jwks_url: Option<String>,
    pub(crate) secret_file: Option<String>,
    pub(crate) secret_env: Option<String>,
    /// `jwks_url` over HTTPS: CA certificates to trust instead of the built-in roots.
    pub(crate) ca: Option<String>,
    pub(crate) audiences: Option<Vec<String>>,
    pub(crate) algorithms: Option<Vec<String>>,
    pub(crate) leeway: Option<String>,
    pub(crate) refresh: Option<String>,
    pub(crate) header: Option<String>,
    pub(crate) cookie: Option<String>,
    pub(crate) consumer_claim: Option<String>,
    pub(crate) tenant_claim: Option<String>,
    pub(crate) plan_claim: Option<String>,
}

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

/// How API keys are read and what an unknown one means.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApiKeys {
    pub(crate) header: Option<String>,
    pub(crate) unknown_key: Option<String>,
    pub(crate) file: Option<String>,
}

/// A separate consumers file: only `[consumers."KEY"]` tables.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConsumersFile {
    #[serde(default)]
    pub(crate) consumers: BTreeMap<String, RawConsumer>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub(crate) listen: Option<OneOrMany<String>>,
    pub(crate) admin: Option<String>,
    pub(crate) shutdown_timeout: Option<String>,
    pub(crate) workers: Option<u32>,
    pub(crate) header_read_timeout: Option<String>,
    pub(crate) body_read_timeout: Option<String>,
    pub(crate) idle_timeout: Option<String>,
    pub(crate) max_header_bytes: Option<RawSize>,
    pub(crate) max_connections: Option<u32>,
    pub(crate) max_key_body: Option<RawSize>,
    pub(crate) headers: Option<Vec<String>>,
    pub(crate) log_denied: Option<String>,
    pub(crate) path_normalization: Option<bool>,
    pub(crate) escaped_slashes: Option<String>,
    pub(crate) upgrades: Option<Vec<String>>,
    pub(crate) tls: Option<RawTls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub(crate) listen: OneOrMany<String>,
    /// The default certificate chain and key: for clients whose SNI names
    /// none of `certs` (or send no SNI).
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
    #[serde(default)]
    pub(crate) certs: Vec<RawTlsCert>,
}

/// `[[server.tls.certs]]`: a certificate served to clients whose SNI is one
/// of `names`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTlsCert {
    pub(crate) names: Vec<String>,
    pub(crate) cert: String,
    pub(crate) key: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawClientIp {
    pub(crate) trusted_hops: Option<u32>,
    pub(crate) trusted_cidrs: Option<Vec<String>>,
    pub(crate) header: Option<String>,
    pub(crate) ipv6_prefix: Option<u8>,
    pub(crate) ipv4_prefix: Option<u8>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStore {
    pub(crate) backend: Option<String>,
    pub(crate) url: Option<OneOrMany<String>>,
    pub(crate) cluster: Option<bool>,
    pub(crate) prefix: Option<String>,
    pub(crate) timeout: Option<String>,
    pub(crate) on_failure: Option<String>,
    pub(crate) local_fraction: Option<toml::Value>,
    pub(crate) remember_denials: Option<String>,
    /// `rediss://` only: a PEM file of the CA certificates to trust instead
    /// of the built-in roots.
    pub(crate) ca: Option<String>,
    /// `rediss://` only: the name to verify the certificate for, instead of
    /// the host connected to.
    pub(crate) sni: Option<String>,
    /// The Redis ACL user.
    pub(crate) username: Option<String>,
    /// A file holding the password (one trailing newline ignored).
    pub(crate) password_file: Option<String>,
    /// The name of an environment variable holding the password.
    pub(crate) password_env: Option<String>,
    /// Sentinel instead of `url`: the sentinels' URLs, and the name of the
    /// master they monitor.
    pub(crate) sentinels: Option<Vec<String>>,
    pub(crate) master: Option<String>,
    /// The sentinels' own password (their `requirepass`), as for the data
    /// nodes' `password_file` / `password_env`.
    pub(crate) sentinel_password_file: Option<String>,
    pub(crate) sentinel_password_env: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUpstream {
    pub(crate) url: OneOrMany<String>,
    pub(crate) connect_timeout: Option<String>,
    pub(crate) read_timeout: Option<String>,
    pub(crate) timeout: Option<String>,
    pub(crate) host: Option<String>,
    /// HTTPS only: a PEM file of the CA certificates to trust instead of the
    /// built-in roots.
    pub(crate) ca: Option<String>,
    /// HTTPS only: the name to send as SNI and verify the certificate for,
    /// instead of the URL's host.
    pub(crate) sni: Option<String>,
    /// Speak HTTP/2 to this upstream (ALPN `h2` over TLS, prior knowledge
    /// over cleartext).
    pub(crate) http2: Option<bool>,
    /// `"round_robin"` or `"least_request"`.
    pub(crate) balance: Option<String>,
    /// How long a URL that comes back takes to reach its full share.
    pub(crate) slow_start: Option<String>,
    /// Passive health: when a failing URL is ejected.
    pub(crate) eject: Option<RawEject>,
    /// Active health checks.
    pub(crate) health: Option<RawHealth>,
}

/// `eject = { after = 3, on = [...], base = "10s", max = "5m", max_ejected = "50%" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEject {
    pub(crate) after: Option<u32>,
    pub(crate) on: Option<Vec<String>>,
    pub(crate) base: Option<String>,
    pub(crate) max: Option<String>,
    pub(crate) max_ejected: Option<String>,
}

/// `health = { path = "/healthz", interval = "5s", timeout = "1s", healthy = 2,
/// unhealthy = 3, expect = ["2xx", "3xx"], start = "healthy" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHealth {
    pub(crate) path: Option<String>,
    pub(crate) interval: Option<String>,
    pub(crate) timeout: Option<String>,
    pub(crate) healthy: Option<u32>,
    pub(crate) unhealthy: Option<u32>,
    /// Statuses (`200`) or classes (`"2xx"`).
    pub(crate) expect: Option<Vec<toml::Value>>,
    pub(crate) start: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimit {
    /// Absent only for a limit that `[[decision.descriptors]]` rules alone
    /// use: their entries' values are its key.
    #[serde(default)]
    pub(crate) key: OneOrMany<String>,
    pub(crate) algorithm: String,
    pub(crate) limit: Option<u64>,
    pub(crate) window: Option<String>,
    pub(crate) capacity: Option<u64>,
    pub(crate) refill: Option<String>,
    pub(crate) rate: Option<String>,
    pub(crate) mode: Option<String>,
    pub(crate) max: Option<u64>,
    pub(crate) shadow: Option<bool>,
    pub(crate) status: Option<u16>,
    pub(crate) on_missing_key: Option<String>,
    pub(crate) local: Option<bool>,
    /// Token leasing from a shared (Redis) token bucket.
    pub(crate) lease: Option<u64>,
    pub(crate) headers: Option<Vec<String>>,
    pub(crate) max_keys: Option<u64>,
    pub(crate) plans: Option<BTreeMap<String, RawPlan>>,
    pub(crate) align: Option<String>,
    pub(crate) reset_jitter: Option<String>,
    /// `"requests"` (the default) or `"tokens"`.
    pub(crate) unit: Option<String>,
}

/// Per-plan values of a limit's algorithm parameters.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPlan {
    pub(crate) limit: Option<u64>,
    pub(crate) window: Option<String>,
    pub(crate) capacity: Option<u64>,
    pub(crate) refill: Option<String>,
    pub(crate) rate: Option<String>,
    pub(crate) max: Option<u64>,
}

impl RawPlan {
    /// Each algorithm parameter's key, and whether this plan sets it.
    pub(crate) fn present(&self) -> [(&'static str, bool); 6] {
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
    pub(crate) fn keys(&self) -> Vec<&'static str> {
        self.present()
            .into_iter()
            .filter_map(|(key, present)| present.then_some(key))
            .collect()
    }

    /// `self` over `base`: the plan's values win.
    pub(crate) fn over(&self, base: &RawPlan) -> RawPlan {
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
    pub(crate) fn params(&self) -> RawPlan {
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
}

/// `tokens = { max_tokens_default = 1024, prompt = "bytes/4", usage = "auto" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTokens {
    pub(crate) max_tokens_default: Option<u64>,
    pub(crate) prompt: Option<String>,
    pub(crate) usage: Option<String>,
    pub(crate) include_usage: Option<bool>,
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMatch {
    pub(crate) path: Option<String>,
    pub(crate) path_prefix: Option<String>,
    pub(crate) methods: Option<Vec<String>>,
    pub(crate) host: Option<String>,
    pub(crate) header: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRespond {
    pub(crate) status: Option<u16>,
    pub(crate) body: Option<String>,
    pub(crate) content_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConsumer {
    pub(crate) consumer: String,
    pub(crate) tenant: Option<String>,
    pub(crate) plan: Option<String>,
}
