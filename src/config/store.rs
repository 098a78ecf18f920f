//! `[store]`: where limits are kept (node memory, or shared through Redis)
//! and, with Redis, where the servers are (one URL, a Redis Cluster's
//! seeds, or a master found through Sentinel), the credentials (an ACL
//! user, a password read from a file or an environment variable, or the
//! URL's), TLS for `rediss://` (`ca`, `sni`, as for HTTPS upstreams), the
//! key prefix, the call timeout, what `on_failure` does and how long
//! denials are remembered. The section's serde mirror, validated types
//! and checks.
//!
//! A password is a [`Secret`] from the moment it is read: its `Debug`
//! prints `<redacted>`, and a [`RedisUrl`] prints without it, so no log
//! line, error message, `/config` body or `check` output can carry it. The
//! URL text of an error is redacted the same way ([`redacted`]).

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use super::raw::OneOrMany;
use super::units::parse_duration;

/// A password, readable only through [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(Arc<str>);

impl Secret {
    pub(crate) fn new(text: &str) -> Secret {
        Secret(text.into())
    }

    /// The password itself, for the AUTH command and nothing else.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// A `redis://` or `rediss://` URL, parsed; its password kept as a
/// [`Secret`] and never printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedisUrl {
    /// `rediss://`: the connection is TLS.
    pub(crate) tls: bool,
    /// A name or an IP address (without brackets).
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) db: i64,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Secret>,
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "rediss" } else { "redis" };
        write!(f, "{scheme}://")?;
        match (&self.username, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:<redacted>@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, Some(_)) => f.write_str(":<redacted>@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)?;
        } else {
            write!(f, "{}:{}", self.host, self.port)?;
        }
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

impl RedisUrl {
    /// `redis://HOST:PORT`, for the cluster client (credentials are given
    /// to it apart).
    pub(crate) fn address(&self) -> String {
        if self.host.contains(':') {
            format!("redis://[{}]:{}", self.host, self.port)
        } else {
            format!("redis://{}:{}", self.host, self.port)
        }
    }
}

/// Where the Redis that holds the shared limits is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RedisServers {
    /// `url = "..."`: one server.
    One(RedisUrl),
    /// `cluster = true`: the seed nodes of a Redis Cluster.
    Cluster(Vec<RedisUrl>),
    /// `sentinels = [...]`, `master = "..."`: the master the sentinels name,
    /// asked again on every new connection, so a failover is followed.
    Sentinel {
        sentinels: Vec<RedisUrl>,
        master: String,
        /// The sentinels' password (`sentinel_password_file`/`_env`), for
        /// those whose URL has none.
        password: Option<Secret>,
    },
}

impl fmt::Display for RedisServers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |urls: &[RedisUrl]| {
            urls.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            RedisServers::One(url) => write!(f, "{url}"),
            RedisServers::Cluster(urls) => write!(f, "cluster {}", list(urls)),
            RedisServers::Sentinel {
                sentinels, master, ..
            } => {
                write!(f, "master `{master}` of sentinels {}", list(sentinels))
            }
        }
    }
}

/// How `rediss://` connections are made: the rustls client configuration
/// (ring, the `ca` file's roots or Mozilla's) and the name to verify when
/// not the host connected to. Equal when made from the same `ca` bytes and
/// `sni`, so that a reload that re-reads an unchanged `ca` is no change.
#[derive(Clone)]
pub(crate) struct RedisTls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    pub(crate) sni: Option<ServerName<'static>>,
    /// The `ca` file's bytes as read, for equality.
    ca: Option<Vec<u8>>,
}

impl PartialEq for RedisTls {
    fn eq(&self, other: &Self) -> bool {
        self.sni == other.sni && self.ca == other.ca
    }
}

impl Eq for RedisTls {}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("sni", &self.sni)
            .field("ca", &self.ca.is_some())
            .finish_non_exhaustive()
    }
}

impl RedisTls {
    /// Trusts the CA certificates in `ca` (PEM), or the built-in roots
    /// without one; no ALPN (Redis speaks none). The error names the file.
    pub(crate) fn new(
        ca: Option<&Path>,
        sni: Option<ServerName<'static>>,
    ) -> Result<RedisTls, String> {
        let mut config = (*super::tls::client_config(ca)?).clone();
        config.alpn_protocols.clear();
        let ca = match ca {
            Some(file) => Some(
                std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?,
            ),
            None => None,
        };
        Ok(RedisTls {
            config: Arc::new(config),
            sni,
            ca,
        })
    }
}

const URL_FORM: &str = "expected redis://HOST:PORT[/DB] or rediss://HOST:PORT[/DB] (TLS), like \"redis://127.0.0.1:6379/0\"";

/// Parses `redis://[user[:password]@]host:port[/db]` (or `rediss://`).
/// The error shows the URL with its password redacted.
pub(crate) fn parse_url(text: &str) -> Result<RedisUrl, String> {
    let bad = || format!("`{}` is not a Redis URL; {URL_FORM}", redacted(text));
    let (tls, rest) = if let Some(rest) = text.strip_prefix("rediss://") {
        (true, rest)
    } else if let Some(rest) = text.strip_prefix("redis://") {
        (false, rest)
    } else {
        return Err(bad());
    };
    if rest.contains(['?', '#']) {
        return Err(format!(
            "`{}`: a store URL takes no query or fragment; {URL_FORM}",
            redacted(text)
        ));
    }
    let (authority, db) = match rest.split_once('/') {
        Some((authority, "")) => (authority, 0),
        Some((authority, db)) => (authority, db.parse::<i64>().map_err(|_| bad())?),
        None => (rest, 0),
    };
    if db < 0 {
        return Err(bad());
    }
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((userinfo, host_port)) => (Some(userinfo), host_port),
        None => (None, authority),
    };
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (host, port) = v6.split_once("]:").ok_or_else(bad)?;
        (host, port)
    } else {
        host_port.rsplit_once(':').ok_or_else(bad)?
    };
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    let (username, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (user, password) = match info.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (info, None),
            };
            let user = percent_decode(user).ok_or_else(bad)?;
            let password = match password {
                Some(text) => Some(percent_decode(text).ok_or_else(bad)?),
                None => None,
            };
            (
                (!user.is_empty()).then_some(user),
                password
                    .filter(|p| !p.is_empty())
                    .map(|p| Secret::new(p.as_str())),
            )
        }
    };
    Ok(RedisUrl {
        tls,
        host: host.to_owned(),
        port,
        db,
        username,
        password,
    })
}

/// `text` with whatever sits between `user:` and `@` replaced by
/// `<redacted>`: how a URL that may hold a password is shown in a message.
pub(crate) fn redacted(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((info, host)) => match info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:<redacted>@{host}{tail}"),
            None => text.to_owned(),
        },
        None => text.to_owned(),
    }
}

/// `%XX` escapes decoded (a password may hold `@`, `:` or `/` so written);
/// `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The password in `file`: its content without one trailing newline
/// (`\n` or `\r\n`, as `echo` and editors leave it). The error names the
/// file, never what it holds.
pub(crate) fn read_password_file(file: &Path) -> Result<Secret, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", file.display()))?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        return Err(format!(
            "{} is empty: write the password into it",
            file.display()
        ));
    }
    Ok(Secret::new(text))
}

/// The password in the environment variable `name`. The error names the
/// variable, never its value.
pub(crate) fn read_password_env(name: &str) -> Result<Secret, String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Ok(Secret::new(&value)),
        Ok(_) => Err(format!("the environment variable `{name}` is empty")),
        Err(std::env::VarError::NotPresent) => Err(format!(
            "the environment variable `{name}` is not set: export it to the gateway's environment, or use `password_file`"
        )),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("the environment variable `{name}` is not UTF-8"))
        }
    }
}

/// `[store]` as written.
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

/// Where limits are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoreBackend {
    Memory,
    /// Boxed: the Redis settings are large and read once at start.
    Redis(Box<RedisConfig>),
}

/// `[store]`, checked.
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

pub(super) fn check_store(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawStore,
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
    raw: &RawStore,
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
    raw: &RawStore,
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
    raw: &RawStore,
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;
    use crate::config::validate::errors;

    #[test]
    fn urls_parse_with_their_password_apart() {
        let url = parse_url("rediss://tollgate:s%40cret@redis.internal:6380/2").unwrap();
        assert!(url.tls);
        assert_eq!(
            (url.host.as_str(), url.port, url.db),
            ("redis.internal", 6380, 2)
        );
        assert_eq!(url.username.as_deref(), Some("tollgate"));
        assert_eq!(url.password.as_ref().map(Secret::expose), Some("s@cret"));
        assert_eq!(
            url.to_string(),
            "rediss://tollgate:<redacted>@redis.internal:6380/2"
        );
        let v6 = parse_url("redis://:pw@[::1]:6379").unwrap();
        assert_eq!((v6.host.as_str(), v6.username.as_deref()), ("::1", None));
        assert_eq!(v6.to_string(), "redis://:<redacted>@[::1]:6379");
        assert!(!format!("{v6:?}").contains("pw"), "{v6:?}");
    }

    #[test]
    fn bad_urls_are_refused_without_showing_the_password() {
        for text in [
            "http://127.0.0.1:6379",
            "redis://127.0.0.1",
            "redis://:hunter2@127.0.0.1:port",
            "redis://127.0.0.1:6379/x",
            "redis://127.0.0.1:6379?protocol=resp3",
            "redis://:hunter2@127.0.0.1:6379/%",
        ] {
            let message = parse_url(text).expect_err(text);
            assert!(!message.contains("hunter2"), "{message}");
        }
        assert_eq!(
            redacted("redis://u:hunter2@h:1/0"),
            "redis://u:<redacted>@h:1/0"
        );
    }

    #[test]
    fn a_password_file_loses_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\r\n").unwrap();
        assert_eq!(read_password_file(&file).unwrap().expose(), "s3cret");
        std::fs::write(&file, "two\n\n").unwrap();
        assert_eq!(read_password_file(&file).unwrap().expose(), "two\n");
        std::fs::write(&file, "\n").unwrap();
        assert!(read_password_file(&file).unwrap_err().contains("is empty"));
        assert_eq!(format!("{:?}", Secret::new("x")), "\"<redacted>\"");
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
}
