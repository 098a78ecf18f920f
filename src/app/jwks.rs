//! The keys of every `jwks_url`, kept across reloads: one [`RemoteKeys`] per
//! URL and fetch settings (issuers that share both share them) and one
//! task that fetches it — at once, then every `refresh` (or
//! sooner when the document's `Cache-Control: max-age` says so), and early
//! when a token names a `kid` the keys lack (at most once per interval,
//! [`RemoteKeys::ask_early`]).
//!
//! A failed fetch (unreachable, a status other than 200, a document that
//! is no JWKS or holds no usable key) keeps the last keys, is logged and
//! counted (`tollgate_jwks_refreshes_total{result="error"}`), and is
//! retried sooner: after 1 s, doubling up to `refresh`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use parking_lot::Mutex;

use crate::config::jwt::{IssuerConfig, JwksUrl};
use crate::config::{Config, UpstreamConfig};
use crate::identity::jwt::Verifier;
use crate::identity::jwt::jwks::KeySet;
use crate::identity::jwt::remote::RemoteKeys;
use crate::metrics::Metrics;
use crate::upstream::fetch::DocumentFetcher;

/// The largest JWKS document read.
const MAX_DOCUMENT: usize = 1024 * 1024;

/// The shortest wait between two background fetches, whatever
/// `Cache-Control` says.
const MIN_INTERVAL: Duration = Duration::from_secs(10);

/// One URL's keys and the task that keeps them.
struct Fetching {
    keys: Arc<RemoteKeys>,
    task: Option<tokio::task::AbortHandle>,
}

/// A URL and what its task is started with (`refresh`, the origin's
/// `ca`; the rest of the origin follows from the URL): a reload that
/// changes them starts another task. Part of the key, not only compared,
/// so that two issuers of one URL with different settings each keep a
/// task (one entry per URL had the second replace and stop the first's,
/// whose issuer then never had keys).
type FetchId = (Arc<str>, Duration, Option<PathBuf>);

/// Every configured `jwks_url`, by URL and settings.
#[derive(Default)]
pub(crate) struct JwksRegistry {
    urls: Mutex<HashMap<FetchId, Fetching>>,
}

impl JwksRegistry {
    /// The verifier of `config`'s `[jwt]`: a `jwks_url` already fetched for
    /// an earlier configuration keeps its keys and its task; a new one
    /// gets both; one no longer configured is stopped.
    pub(crate) fn verifier(&self, config: &Config, metrics: &Arc<Metrics>) -> Option<Verifier> {
        let jwt = config.jwt.as_ref()?;
        let mut urls = self.urls.lock();
        let mut wanted: Vec<FetchId> = Vec::new();
        let verifier = Verifier::new(config, jwt, |issuer: &IssuerConfig, jwks: &JwksUrl| {
            let JwksUrl {
                url,
                refresh,
                ca,
                upstream,
            } = jwks;
            let id: FetchId = (url.clone(), *refresh, ca.clone());
            wanted.push(id.clone());
            if let Some(known) = urls.get(&id) {
                return known.keys.clone();
            }
            let keys = Arc::new(RemoteKeys::new(url.clone(), *refresh));
            let task = spawn(
                issuer.issuer.clone(),
                upstream,
                *refresh,
                keys.clone(),
                metrics.clone(),
            );
            urls.insert(
                id,
                Fetching {
                    keys: keys.clone(),
                    task,
                },
            );
            keys
        });
        // Settings no longer configured: their tasks stop.
        urls.retain(|id, fetching| {
            let keep = wanted.contains(id);
            if !keep && let Some(task) = &fetching.task {
                task.abort();
            }
            keep
        });
        Some(verifier)
    }
}

impl Drop for JwksRegistry {
    fn drop(&mut self) {
        for fetching in self.urls.get_mut().values() {
            if let Some(task) = &fetching.task {
                task.abort();
            }
        }
    }
}

/// Starts fetching on the current runtime; `None` outside one (offline
/// tools such as `check` and `simulate` fetch nothing).
fn spawn(
    issuer: Arc<str>,
    origin: &UpstreamConfig,
    refresh: Duration,
    keys: Arc<RemoteKeys>,
    metrics: Arc<Metrics>,
) -> Option<tokio::task::AbortHandle> {
    let runtime = tokio::runtime::Handle::try_current().ok()?;
    let uri: Uri = keys.url.parse().ok()?;
    let fetcher = DocumentFetcher::new(origin, &uri)?;
    Some(
        runtime
            .spawn(keep_fresh(fetcher, keys, refresh, issuer, metrics))
            .abort_handle(),
    )
}

async fn keep_fresh(
    fetcher: DocumentFetcher,
    keys: Arc<RemoteKeys>,
    refresh: Duration,
    issuer: Arc<str>,
    metrics: Arc<Metrics>,
) {
    let mut retry = Duration::from_secs(1);
    loop {
        let wait = match fetch_once(&fetcher, &keys).await {
            Ok(max_age) => {
                metrics.record_jwks_refresh(&issuer, "ok");
                retry = Duration::from_secs(1);
                max_age.map_or(refresh, |age| {
                    age.clamp(MIN_INTERVAL, refresh.max(MIN_INTERVAL))
                })
            }
            Err(error) => {
                metrics.record_jwks_refresh(&issuer, "error");
                tracing::warn!(
                    issuer = %issuer,
                    url = %keys.url,
                    %error,
                    "cannot refresh the issuer's JWKS; its last keys stay in use"
                );
                let wait = retry.min(refresh);
                retry = (retry * 2).min(refresh);
                wait
            }
        };
        keys.fetch_done();
        keys.wait_for_refresh(wait).await;
    }
}

/// One fetch: the new keys installed; the document's `max-age`, if any.
async fn fetch_once(
    fetcher: &DocumentFetcher,
    keys: &RemoteKeys,
) -> Result<Option<Duration>, String> {
    let fetched = fetcher.get(MAX_DOCUMENT).await?;
    if fetched.status != 200 {
        return Err(format!("the server answered {}", fetched.status));
    }
    let set = KeySet::from_jwks(&fetched.body)?;
    for skipped in &set.skipped {
        tracing::debug!(url = %keys.url, skipped, "a JWKS key this gateway cannot use");
    }
    keys.install(set);
    Ok(fetched.cache_control.as_deref().and_then(max_age))
}

/// `max-age=N` of a `Cache-Control` value (`no-store`/`no-cache`: none).
fn max_age(value: &str) -> Option<Duration> {
    value.split(',').find_map(|directive| {
        let (name, seconds) = directive.trim().split_once('=')?;
        if !name.trim().eq_ignore_ascii_case("max-age") {
            return None;
        }
        seconds
            .trim()
            .trim_matches('"')
            .parse()
            .ok()
            .map(Duration::from_secs)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_max_age() {
        assert_eq!(
            max_age("public, max-age=600"),
            Some(Duration::from_secs(600))
        );
        assert_eq!(max_age("MAX-AGE=\"60\""), Some(Duration::from_secs(60)));
        assert_eq!(max_age("no-cache"), None);
        assert_eq!(max_age("max-age=x"), None);
    }
}
