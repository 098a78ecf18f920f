//! `[upstreams.NAME]`: where a route forwards to (its URLs, timeouts, `Host`,
//! TLS and HTTP/2), how requests are spread over the URLs (`balance`,
//! `slow_start`) and when a URL is taken out (passive `eject`, active
//! `health` checks). The section's serde mirror, validated types and checks.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use http::{HeaderValue, Uri};
use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use super::raw::OneOrMany;
use super::tls::ClientTls;
use super::units::parse_percent;

/// An `[upstreams.NAME]` table as written.
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

/// An `[upstreams.NAME]`, checked.
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

/// Every `[upstreams.NAME]`, in name order (routes refer to them by index).
pub(super) fn check_upstreams(
    c: &mut Checker,
    path: &KeyPath,
    raw: &BTreeMap<String, RawUpstream>,
    directory: &Path,
) -> Vec<UpstreamConfig> {
    raw.iter()
        .map(|(name, u)| check_upstream(c, &path.key(name), name, u, directory))
        .collect()
}

fn check_upstream(
    c: &mut Checker,
    path: &KeyPath,
    name: &str,
    raw: &RawUpstream,
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

fn check_balance(c: &mut Checker, path: &KeyPath, raw: &RawUpstream) -> Balance {
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
fn check_eject(c: &mut Checker, path: &KeyPath, raw: &RawEject) -> EjectPolicy {
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
fn check_health(c: &mut Checker, path: &KeyPath, raw: &RawHealth) -> HealthCheck {
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;
    use crate::config::validate::errors;

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
