//! `[usage]`: where usage events go (contract section 14) — an HTTP
//! collector taking CloudEvents batches (`url`, OpenMeter's ingest API),
//! with the disk spool that holds what it has not acknowledged (`spool`,
//! bounded by `spool_max`), or a JSON-lines file (`file`); how many events
//! a POST carries (`batch`) and how long a partial batch waits
//! (`interval`). The section's serde mirror, validated type and check.
//!
//! Read at start only (the exporter's threads and its spool are opened
//! then): a reload that changes the section says the change needs a
//! restart (`reload::needs_restart`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use super::http_url::{self, UrlError};
use super::raw::RawSize;

/// `[usage]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawUsage {
    pub(crate) url: Option<String>,
    pub(crate) file: Option<String>,
    pub(crate) spool: Option<String>,
    pub(crate) spool_max: Option<RawSize>,
    pub(crate) batch: Option<i64>,
    pub(crate) interval: Option<String>,
}

/// `[usage]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageConfig {
    pub(crate) sink: UsageSinkConfig,
    /// Most events in one POST (or one write and `fsync` of the file).
    pub(crate) batch: usize,
    /// How long a batch smaller than `batch` waits for more before it goes.
    pub(crate) interval: Duration,
}

/// Where the events go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UsageSinkConfig {
    /// POSTed to a collector, spooled on disk until it answers 2xx.
    Collector {
        url: CollectorUrl,
        /// The spool's directory (resolved against the config's).
        spool: PathBuf,
        /// Most bytes the spool's segments hold; past it the oldest go.
        spool_max: u64,
    },
    /// Appended to a file, one JSON line each.
    File(PathBuf),
}

/// A collector's `http://host:port/path`, split for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CollectorUrl {
    /// `host:port` to connect to (port 80 when the URL has none).
    pub(crate) authority: String,
    /// The `Host` field: the URL's authority as written.
    pub(crate) host: String,
    /// Path and query, `/` when the URL has none.
    pub(crate) path: String,
}

/// The default of `spool_max`.
pub(crate) const DEFAULT_SPOOL_MAX: u64 = 1 << 30;
/// The smallest `spool_max`: a few events.
const MIN_SPOOL_MAX: u64 = 1024;
/// The default of `batch` (OpenMeter's examples send 100).
pub(crate) const DEFAULT_BATCH: usize = 100;
/// The largest `batch`: a POST of ~10 MB.
const MAX_BATCH: i64 = 10_000;

/// Checks `[usage]`; `directory` is the config file's, for relative paths.
pub(super) fn check_usage(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawUsage,
    directory: &Path,
) -> UsageConfig {
    let batch = match raw.batch {
        None => DEFAULT_BATCH,
        Some(n) if (1..=MAX_BATCH).contains(&n) => n as usize,
        Some(n) => {
            c.problem(
                path.key("batch"),
                format!("`{n}` is out of range; expected 1 to {MAX_BATCH} events"),
            );
            DEFAULT_BATCH
        }
    };
    let interval = c.duration(path.key("interval"), &raw.interval, Duration::from_secs(1));
    fn non_empty(text: &Option<String>) -> Option<&str> {
        text.as_deref().filter(|t| !t.trim().is_empty())
    }
    let sink = match (non_empty(&raw.url), non_empty(&raw.file)) {
        (Some(_), Some(_)) => {
            c.problem(
                path.key("file"),
                "`url` and `file` exclude each other: events go to a collector or to a file",
            );
            None
        }
        (None, None) => {
            c.problem(
                path.clone(),
                "[usage] needs `url = \"http://HOST:PORT/api/v1/events\"` (a CloudEvents collector) or `file = \"usage.jsonl\"`",
            );
            None
        }
        (None, Some(file)) => {
            for (key, given) in [
                ("spool", raw.spool.is_some()),
                ("spool_max", raw.spool_max.is_some()),
            ] {
                if given {
                    c.problem(
                        path.key(key),
                        format!("`{key}` is for `url`: a file is written directly"),
                    );
                }
            }
            Some(UsageSinkConfig::File(directory.join(file)))
        }
        (Some(url), None) => {
            let url = check_url(c, path.key("url"), url);
            let spool = match non_empty(&raw.spool) {
                Some(dir) => Some(directory.join(dir)),
                None => {
                    c.problem(
                        path.key("spool"),
                        "`url` needs `spool = \"DIR\"`: the directory where events wait until the collector acknowledges them",
                    );
                    None
                }
            };
            let spool_max = c.size(path.key("spool_max"), &raw.spool_max, DEFAULT_SPOOL_MAX);
            if spool_max < MIN_SPOOL_MAX {
                c.problem(
                    path.key("spool_max"),
                    format!("`{spool_max}` bytes is too small; at least {MIN_SPOOL_MAX}"),
                );
            }
            url.zip(spool)
                .map(|(url, spool)| UsageSinkConfig::Collector {
                    url,
                    spool,
                    spool_max,
                })
        }
    };
    UsageConfig {
        sink: sink.unwrap_or(UsageSinkConfig::File(PathBuf::new())),
        batch,
        interval,
    }
}

/// `http://host[:port][/path][?query]`: the shared parse ([`http_url`]),
/// the query kept in the path the events are posted to.
fn check_url(c: &mut Checker, path: KeyPath, text: &str) -> Option<CollectorUrl> {
    let url = match http_url::parse(text) {
        Ok(url) => url,
        Err(error) => {
            let message = match error {
                UrlError::Https => format!(
                    "`{text}`: the usage exporter speaks plain HTTP only; point it at a local collector or a TLS-terminating sidecar"
                ),
                UrlError::NotUrl if text.starts_with("http://") => {
                    format!("`{text}` is not a valid http:// URL")
                }
                UrlError::NotUrl | UrlError::NotHttp => format!(
                    "`{text}` is not an http:// URL, like \"http://127.0.0.1:8888/api/v1/events\""
                ),
                UrlError::NoHost | UrlError::Credentials => {
                    format!("`{text}` is not a valid http:// URL")
                }
            };
            c.problem(path, message);
            return None;
        }
    };
    Some(CollectorUrl {
        authority: url.authority,
        host: url.host,
        path: match url.query {
            Some(query) => format!("{}?{query}", url.path),
            None => url.path,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::super::validate::errors;
    use super::*;

    fn usage(text: &str) -> Result<UsageConfig, String> {
        let full = format!("[server]\nlisten = \"127.0.0.1:1\"\n\n[usage]\n{text}");
        match super::super::Config::from_bytes(
            Path::new("/etc/tollgate/gateway.toml"),
            full.as_bytes(),
        ) {
            Ok(config) => Ok(config.usage.expect("[usage]")),
            Err(error) => Err(error.to_string()),
        }
    }

    #[test]
    fn a_collector_with_its_spool_and_the_defaults() {
        let config =
            usage("url = \"http://127.0.0.1:8888/api/v1/events\"\nspool = \"spool\"\n").unwrap();
        assert_eq!(config.batch, 100);
        assert_eq!(config.interval, Duration::from_secs(1));
        assert_eq!(
            config.sink,
            UsageSinkConfig::Collector {
                url: CollectorUrl {
                    authority: "127.0.0.1:8888".into(),
                    host: "127.0.0.1:8888".into(),
                    path: "/api/v1/events".into(),
                },
                spool: PathBuf::from("/etc/tollgate/spool"),
                spool_max: 1 << 30,
            }
        );
    }

    #[test]
    fn a_url_without_port_or_path() {
        let config = usage("url = \"http://collector\"\nspool = \"s\"\nspool_max = \"2MiB\"\nbatch = 7\ninterval = \"250ms\"\n").unwrap();
        let UsageSinkConfig::Collector { url, spool_max, .. } = config.sink else {
            panic!("a collector");
        };
        assert_eq!(url.authority, "collector:80");
        assert_eq!(url.path, "/");
        assert_eq!(spool_max, 2 << 20);
        assert_eq!(config.batch, 7);
        assert_eq!(config.interval, Duration::from_millis(250));
    }

    #[test]
    fn a_file() {
        let config = usage("file = \"usage.jsonl\"\n").unwrap();
        assert_eq!(
            config.sink,
            UsageSinkConfig::File(PathBuf::from("/etc/tollgate/usage.jsonl"))
        );
    }

    #[test]
    fn each_mistake_is_named() {
        for (text, expected) in [
            ("", "needs `url = "),
            (
                "url = \"http://a:1/\"\nfile = \"f\"\nspool = \"s\"\n",
                "exclude each other",
            ),
            ("url = \"http://a:1/\"\n", "needs `spool = \"DIR\"`"),
            ("url = \"https://a:1/\"\nspool = \"s\"\n", "plain HTTP only"),
            (
                "url = \"ftp://a/\"\nspool = \"s\"\n",
                "is not an http:// URL",
            ),
            (
                "url = \"http:///x\"\nspool = \"s\"\n",
                "is not a valid http:// URL",
            ),
            (
                "url = \"http://a b/\"\nspool = \"s\"\n",
                "is not a valid http:// URL",
            ),
            ("file = \"f\"\nspool = \"s\"\n", "`spool` is for `url`"),
            (
                "url = \"http://a/\"\nspool = \"s\"\nspool_max = 10\n",
                "too small",
            ),
            (
                "url = \"http://a/\"\nspool = \"s\"\nspool_max = \"1 TB\"\n",
                "spool_max",
            ),
            ("file = \"f\"\nbatch = 0\n", "out of range"),
            ("file = \"f\"\ninterval = \"0s\"\n", "greater than zero"),
            (
                "file = \"f\"\nintervl = \"1s\"\n",
                "did you mean `interval`",
            ),
        ] {
            let message = usage(text).expect_err(text);
            assert!(message.contains(expected), "{text:?}: {message}");
            assert!(message.contains("usage"), "{text:?}: {message}");
        }
    }

    #[test]
    fn usage_events_on_a_route_needs_the_section() {
        let message = errors(
            "[server]\nlisten = \"127.0.0.1:1\"\n[[routes]]\nname = \"r\"\nrespond = { status = 200 }\nusage_events = true\n",
        );
        assert!(
            message.contains("`routes[0].usage_events`: needs a [usage] section"),
            "{message}"
        );
        let fine = errors(
            "[server]\nlisten = \"127.0.0.1:1\"\n[usage]\nfile = \"u.jsonl\"\n[[routes]]\nname = \"r\"\nrespond = { status = 200 }\nusage_events = true\n",
        );
        assert_eq!(fine, "");
    }
}
