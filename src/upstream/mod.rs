//! Connections to upstreams: an [`Upstream`] of the configuration is a
//! connection pool per URL ([`pool`]) and the round robin over them; a
//! request's wait for its answer is bounded with a reused timer
//! ([`deadline`]). What a request looks like on its way upstream is the
//! pipeline's (`proxy::forward`).

pub mod deadline;
pub mod h2;
pub mod pool;
pub mod retry;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Uri;

use crate::config::UpstreamConfig;
use h2::H2Client;
use pool::{BodyErrors, ConnectionPool, PoolTls};
use rustls::pki_types::ServerName;

/// One upstream of a snapshot: its settings and a connection pool per URL.
#[derive(Debug)]
pub struct Upstream {
    pub config: UpstreamConfig,
    /// Aligned with `config.urls`.
    pools: Vec<Arc<ConnectionPool>>,
    /// With `http2 = true`, the HTTP/2 connection of each URL (aligned with
    /// `config.urls`; empty otherwise).
    h2: Vec<H2Client>,
    next: AtomicUsize,
}

impl Upstream {
    /// `body_errors` counts response bodies that fail after their head.
    pub fn new(config: UpstreamConfig, body_errors: BodyErrors) -> Upstream {
        let pools = config
            .urls
            .iter()
            .map(|url| {
                ConnectionPool::with_tls(
                    socket_address(url),
                    config.connect_timeout,
                    config.read_timeout,
                    body_errors.clone(),
                    pool_tls(&config, url, false),
                )
            })
            .collect();
        let h2 = if config.http2 {
            config
                .urls
                .iter()
                .map(|url| {
                    let scheme = url.scheme().cloned().unwrap_or(http::uri::Scheme::HTTP);
                    H2Client::new(
                        socket_address(url),
                        scheme,
                        config.connect_timeout,
                        config.read_timeout,
                        pool_tls(&config, url, true),
                    )
                })
                .collect()
        } else {
            Vec::new()
        };
        Upstream {
            config,
            pools,
            h2,
            next: AtomicUsize::new(0),
        }
    }

    /// The HTTP/2 connection of base URL `url`, if the upstream speaks
    /// HTTP/2 (`http2 = true`).
    pub(crate) fn h2(&self, url: usize) -> Option<&H2Client> {
        self.h2.get(url)
    }

    /// Closes idle upstream connections that expired or were closed by the
    /// upstream.
    pub fn prune_idle(&self) {
        for pool in &self.pools {
            pool.prune();
        }
    }

    /// The next base URL's index, round robin.
    pub(crate) fn pick(&self) -> usize {
        let urls = self.config.urls.len();
        // One URL: no turn to take. The counter is a cache line every
        // worker would otherwise write on every request.
        if urls == 1 {
            return 0;
        }
        self.next.fetch_add(1, Ordering::Relaxed) % urls
    }

    /// The pool of base URL `url` (an index from [`Upstream::pick`]).
    pub(crate) fn pool(&self, url: usize) -> &Arc<ConnectionPool> {
        &self.pools[url]
    }
}

/// The handshake of an `https://` URL: the upstream's trust roots, and its
/// `sni` or else the URL's host as the name; offering ALPN `h2` alone when
/// `h2`.
fn pool_tls(config: &UpstreamConfig, url: &Uri, h2: bool) -> Option<PoolTls> {
    if url.scheme_str() != Some("https") {
        return None;
    }
    let tls = config.tls.as_ref()?;
    let name = match &tls.sni {
        Some(name) => name.clone(),
        None => {
            let host = url.host()?.trim_start_matches('[').trim_end_matches(']');
            ServerName::try_from(host.to_owned()).ok()?
        }
    };
    let client = if h2 {
        let mut client = (*tls.config).clone();
        client.alpn_protocols = vec![b"h2".to_vec()];
        std::sync::Arc::new(client)
    } else {
        tls.config.clone()
    };
    Some(PoolTls {
        connector: tokio_rustls::TlsConnector::from(client),
        name,
    })
}

/// The `host:port` to connect to for an upstream URL. `Uri::host` keeps an
/// IPv6 literal's brackets, so the result is always connectable text.
fn socket_address(url: &Uri) -> String {
    // Validation guarantees an `http://` or `https://` URL with an authority.
    let host = url.host().unwrap_or("127.0.0.1");
    let default_port = if url.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let port = url.port_u16().unwrap_or(default_port);
    format!("{host}:{port}")
}

/// Arc'd upstreams of a snapshot, by index in [`Config::upstreams`](crate::config::Config).
pub type Upstreams = Vec<Arc<Upstream>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_addresses_keep_ipv6_brackets() {
        for (url, address) in [
            ("http://127.0.0.1:8080/api", "127.0.0.1:8080"),
            ("http://backend.internal", "backend.internal:80"),
            ("http://[::1]:9000", "[::1]:9000"),
            ("http://[2001:db8::5]/", "[2001:db8::5]:80"),
        ] {
            assert_eq!(socket_address(&url.parse().unwrap()), address, "{url}");
        }
    }
}
