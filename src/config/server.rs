//! `[server]`: the proxy's listeners, timeouts, the bounds on what one
//! connection may hold, the rate-limit header styles, path handling and the
//! tunnelled upgrades; `[server.tls]` is checked in [`super::tls`].
//!
//! The section's serde mirror ([`RawServer`]), its validated type
//! ([`ServerConfig`]) and its check live here: a new `[server]` key is added
//! in this file, `gateway.toml`'s comments and the docs.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::EscapedSlashes;
use super::checker::Checker;
use super::error::KeyPath;
use super::raw::{OneOrMany, RawSize};
use super::tls::{RawTls, TlsConfig};
use crate::access_log::LogDenied;

/// `[server]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub(crate) listen: Option<OneOrMany<String>>,
    pub(crate) admin: Option<String>,
    pub(crate) admin_token_file: Option<String>,
    pub(crate) admin_token_env: Option<String>,
    pub(crate) state_file: Option<String>,
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

/// `[server]`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: Vec<SocketAddr>,
    pub(crate) admin: Option<SocketAddr>,
    /// The admin listener's bearer token (`admin_token_file` / `_env`,
    /// read where the file's directory is known); `None`: admin writes are
    /// refused.
    pub(crate) admin_token: Option<super::Secret>,
    /// Where per-key overrides outlive a restart (memory store), relative
    /// paths from the config file's directory (set with it, in `validate`).
    pub(crate) state_file: Option<std::path::PathBuf>,
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

pub(super) fn check_server(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawServer,
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
        Some(names) => header_styles(c, path.key("headers"), names),
    };
    let log_denied = match &raw.log_denied {
        None => LogDenied::default(),
        Some(text) => LogDenied::parse(text).unwrap_or_else(|message| {
            c.problem(path.key("log_denied"), message);
            LogDenied::default()
        }),
    };
    if raw.state_file.as_deref() == Some("") {
        c.problem(
            path.key("state_file"),
            "needs a file name, like \"tollgate-state.json\"",
        );
    }
    ServerConfig {
        listen,
        admin,
        admin_token: None,
        state_file: None,
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

/// `headers = [...]`: the families named (of `[server]`, or a limit's own).
pub(super) fn header_styles(c: &mut Checker, path: KeyPath, names: &[String]) -> HeaderStyles {
    let mut styles = HeaderStyles {
        draft: false,
        legacy: false,
        trio: false,
    };
    for (i, name) in names.iter().enumerate() {
        match c.one_of(path.index(i), name, &["draft", "legacy", "trio"]) {
            Some("draft") => styles.draft = true,
            Some("legacy") => styles.legacy = true,
            Some("trio") => styles.trio = true,
            _ => {}
        }
    }
    styles
}

/// RFC 9110 `tchar`: what a protocol name in `Upgrade` may hold.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;
    use crate::config::validate::errors;

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
}
