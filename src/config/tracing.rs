//! `[tracing]`: OpenTelemetry traces exported over OTLP/HTTP (protobuf).
//! The section's serde mirror, its validated type and its check.
//!
//! ```toml
//! [tracing]
//! otlp = "http://127.0.0.1:4318"   # the collector; spans go to /v1/traces
//! sample = 0.1                      # head sampling of new traces, 0..=1
//! service_name = "tollgate"
//! ```
//!
//! The endpoint is OTLP's base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` is:
//! `/v1/traces` is appended to its path, unless the path already ends with
//! it (a signal-specific URL). Plain `http` only: the exporter is a small
//! HTTP/1.1 client of our own, and a collector agent beside the gateway is
//! how OpenTelemetry deployments reach a remote one over TLS.

use std::sync::Arc;

use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use super::http_url::{self, UrlError};

/// The collector's default OTLP/HTTP address (OpenTelemetry's own default).
const DEFAULT_OTLP: &str = "http://127.0.0.1:4318";

/// The path OTLP/HTTP takes trace exports on.
const TRACES_PATH: &str = "/v1/traces";

/// `[tracing]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTracing {
    pub(crate) otlp: Option<String>,
    pub(crate) sample: Option<f64>,
    pub(crate) service_name: Option<String>,
}

/// `[tracing]`, validated: where spans go, which requests are traced, and
/// the `service.name` they carry.
#[derive(Debug, Clone, PartialEq)]
pub struct TracingConfig {
    pub(crate) otlp: OtlpEndpoint,
    /// The share of new traces recorded, in `0.0..=1.0` (a request with a
    /// `traceparent` follows its sampled flag instead).
    pub(crate) sample: f64,
    pub(crate) service_name: Arc<str>,
}

/// An OTLP/HTTP traces URL, split for the exporter's client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OtlpEndpoint {
    /// `host:port` as written (with brackets around an IPv6 address): what
    /// the client connects to and sends as `Host`.
    pub(crate) authority: String,
    /// The request path, ending in `/v1/traces`.
    pub(crate) path: String,
}

impl OtlpEndpoint {
    /// The URL spans are posted to, for messages.
    pub(crate) fn url(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }
}

/// `[tracing]`: the endpoint, the sampling ratio, the service name.
pub(super) fn check_tracing(c: &mut Checker, path: &KeyPath, raw: &RawTracing) -> TracingConfig {
    let otlp_text = raw.otlp.as_deref().unwrap_or(DEFAULT_OTLP);
    let otlp = match parse_endpoint(otlp_text) {
        Ok(endpoint) => endpoint,
        Err(reason) => {
            c.problem(path.key("otlp"), format!("`{otlp_text}`: {reason}"));
            parse_endpoint(DEFAULT_OTLP).unwrap_or(OtlpEndpoint {
                authority: String::new(),
                path: TRACES_PATH.to_owned(),
            })
        }
    };
    let sample = match raw.sample {
        None => 0.1,
        Some(ratio) if (0.0..=1.0).contains(&ratio) => ratio,
        Some(ratio) => {
            c.problem(
                path.key("sample"),
                format!(
                    "{ratio} is not a ratio; expected a number from 0 (only requests whose traceparent is sampled) to 1 (every request)"
                ),
            );
            0.0
        }
    };
    let service_name = match raw.service_name.as_deref() {
        None => "tollgate",
        Some(name) if name.trim().is_empty() => {
            c.problem(path.key("service_name"), "must not be empty");
            "tollgate"
        }
        Some(name) => name,
    };
    TracingConfig {
        otlp,
        sample,
        service_name: Arc::from(service_name),
    }
}

/// `http://host[:port][/base]` → the authority and the traces path: the
/// shared parse ([`http_url`]), no query, `/v1/traces` appended unless the
/// path ends with it.
fn parse_endpoint(text: &str) -> Result<OtlpEndpoint, String> {
    let url = http_url::parse(text).map_err(|error| {
        match error {
            UrlError::NotUrl => "not a URL; expected e.g. \"http://127.0.0.1:4318\"",
            UrlError::Https => {
                "https is not supported; send to a collector agent over http (e.g. \"http://127.0.0.1:4318\")"
            }
            UrlError::NotHttp => "expected an http:// URL, e.g. \"http://127.0.0.1:4318\"",
            UrlError::NoHost => "the URL has no host",
            UrlError::Credentials => "the URL must not carry credentials",
        }
        .to_owned()
    })?;
    if url.query.is_some() {
        return Err("the URL must not have a query".to_owned());
    }
    let base = url.path.trim_end_matches('/');
    let path = if base.ends_with(TRACES_PATH) {
        base.to_owned()
    } else {
        format!("{base}{TRACES_PATH}")
    };
    Ok(OtlpEndpoint {
        authority: url.authority,
        path,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::validate::errors;
    use crate::config::{Config, TracingConfig};

    fn tracing(section: &str) -> TracingConfig {
        let text = format!("[tracing]\n{section}");
        Config::from_bytes(std::path::Path::new("gateway.toml"), text.as_bytes())
            .unwrap()
            .tracing
            .unwrap()
    }

    #[test]
    fn defaults_are_the_collector_on_this_host_a_tenth_and_tollgate() {
        let config = tracing("");
        assert_eq!(config.otlp.authority, "127.0.0.1:4318");
        assert_eq!(config.otlp.path, "/v1/traces");
        assert_eq!(config.sample, 0.1);
        assert_eq!(&*config.service_name, "tollgate");
    }

    #[test]
    fn no_section_is_no_tracing() {
        let config =
            Config::from_bytes(std::path::Path::new("gateway.toml"), b"[server]\n").unwrap();
        assert!(config.tracing.is_none());
    }

    #[test]
    fn the_endpoint_is_a_base_url_unless_it_names_the_traces_path() {
        let cases = [
            ("http://collector:4318", "collector:4318", "/v1/traces"),
            ("http://collector:4318/", "collector:4318", "/v1/traces"),
            ("http://collector", "collector:80", "/v1/traces"),
            ("http://[::1]:4318/otlp", "[::1]:4318", "/otlp/v1/traces"),
            ("http://c:1/v1/traces", "c:1", "/v1/traces"),
        ];
        for (url, authority, path) in cases {
            let config = tracing(&format!("otlp = \"{url}\"\n"));
            assert_eq!(config.otlp.authority, authority, "{url}");
            assert_eq!(config.otlp.path, path, "{url}");
        }
    }

    #[test]
    fn integer_ratios_are_ratios() {
        assert_eq!(tracing("sample = 1\n").sample, 1.0);
        assert_eq!(tracing("sample = 0\n").sample, 0.0);
        assert_eq!(tracing("sample = 0.01\n").sample, 0.01);
    }

    #[test]
    fn bad_values_are_located_and_explained() {
        let cases = [
            ("otlp = \"not a url\"", "`tracing.otlp`", "not a URL"),
            (
                "otlp = \"https://c:4318\"",
                "`tracing.otlp`",
                "https is not supported",
            ),
            (
                "otlp = \"grpc://c:4317\"",
                "`tracing.otlp`",
                "expected an http:// URL",
            ),
            (
                "otlp = \"http://u:p@c:4318\"",
                "`tracing.otlp`",
                "credentials",
            ),
            ("otlp = \"http://c:4318/?a=b\"", "`tracing.otlp`", "query"),
            ("otlp = \"/v1/traces\"", "`tracing.otlp`", "http://"),
            ("sample = 1.5", "`tracing.sample`", "not a ratio"),
            ("sample = -0.1", "`tracing.sample`", "not a ratio"),
            ("sample = nan", "`tracing.sample`", "not a ratio"),
            (
                "service_name = \" \"",
                "`tracing.service_name`",
                "must not be empty",
            ),
            ("sample = \"0.1\"", "`tracing.sample`", ""),
            ("samples = 0.1", "`tracing.samples`", "unknown key"),
        ];
        for (line, key, message) in cases {
            let errors = errors(&format!("[tracing]\n{line}\n"));
            assert!(errors.starts_with("gateway.toml:2:"), "{line}: {errors}");
            assert!(errors.contains(key), "{line}: {errors}");
            assert!(errors.contains(message), "{line}: {errors}");
        }
    }
}
