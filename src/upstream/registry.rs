//! Upstream health across reloads: every URL's [`UrlHealth`], by upstream
//! name and URL, and the active checker of each checked URL.
//!
//! A reload resolves its upstreams here ([`HealthRegistry::resolve`]): a
//! URL the running configuration already lists under the same upstream
//! keeps its state — an ejected URL stays ejected, a URL its checks took
//! down stays down — and its checker, unless the upstream's settings
//! changed (then the checker starts again, with the URL's state kept). A
//! URL the reload adds starts as configured (up, or down with `start =
//! "unhealthy"`); one it removes has its checker stopped and its metric
//! series retired.
//!
//! Touched only when a configuration is installed and by the summary tick:
//! a cold path, so a plain mutex. Requests reach the state through their
//! snapshot's `Arc`s and never lock this.

use std::collections::HashMap;
use std::sync::Arc;

use http::Uri;
use parking_lot::Mutex;

use super::check;
use super::health::{self, HealthSignals, Nanos, UrlHealth};
use crate::config::UpstreamConfig;

/// Where the registry gets a URL's metric series, and retires them.
pub(crate) trait HealthMetrics {
    /// The series of URL `url` of upstream `upstream`.
    fn signals(&self, upstream: &str, url: &str) -> HealthSignals;
    /// The URL left the configuration: its series go.
    fn retire(&self, upstream: &str, url: &str);
}

/// No metrics (offline tools, unit tests).
impl HealthMetrics for () {
    fn signals(&self, _: &str, _: &str) -> HealthSignals {
        HealthSignals::none()
    }

    fn retire(&self, _: &str, _: &str) {}
}

/// One URL of one upstream.
struct Entry {
    health: Arc<UrlHealth>,
    /// Its checker, and the upstream settings it checks with.
    checker: Option<(UpstreamConfig, tokio::task::AbortHandle)>,
}

/// (upstream name, URL label) → its health.
#[derive(Default)]
pub(crate) struct HealthRegistry {
    entries: Mutex<HashMap<(String, String), Entry>>,
}

impl std::fmt::Debug for HealthRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthRegistry").finish_non_exhaustive()
    }
}

impl HealthRegistry {
    /// The health of every URL of `upstreams` (aligned with each one's
    /// `urls`), kept where the running configuration had it (see the
    /// module doc); checkers started or stopped to match.
    pub(crate) fn resolve(
        &self,
        upstreams: &[UpstreamConfig],
        metrics: &dyn HealthMetrics,
    ) -> Vec<Vec<Arc<UrlHealth>>> {
        let mut entries = self.entries.lock();
        let mut next: HashMap<(String, String), Entry> = HashMap::new();
        let now = health::now();
        let lists = upstreams
            .iter()
            .map(|upstream| {
                let name: Arc<str> = Arc::from(upstream.name.as_str());
                upstream
                    .urls
                    .iter()
                    .enumerate()
                    .map(|(index, url)| {
                        let label = url_label(url);
                        let key = (upstream.name.clone(), label);
                        if let Some(entry) = next.get(&key) {
                            // The same URL twice in one list: one state.
                            return entry.health.clone();
                        }
                        let mut entry = entries.remove(&key).unwrap_or_else(|| Entry {
                            health: Arc::new(UrlHealth::new(
                                name.clone(),
                                Arc::from(key.1.as_str()),
                                upstream.health.as_ref(),
                                metrics.signals(&key.0, &key.1),
                            )),
                            checker: None,
                        });
                        entry.checker = match (upstream.health.is_some(), entry.checker.take()) {
                            (false, None) => None,
                            (false, Some((_, task))) => {
                                task.abort();
                                entry.health.forget_checks(now);
                                None
                            }
                            (true, Some((checked, task))) if checked == *upstream => {
                                Some((checked, task))
                            }
                            (true, old) => {
                                if let Some((_, task)) = old {
                                    task.abort();
                                }
                                check::spawn(upstream, index, entry.health.clone())
                                    .map(|task| (upstream.clone(), task))
                            }
                        };
                        let health = entry.health.clone();
                        next.insert(key, entry);
                        health
                    })
                    .collect()
            })
            .collect();
        for ((upstream, url), entry) in entries.drain() {
            if let Some((_, task)) = entry.checker {
                task.abort();
            }
            metrics.retire(&upstream, &url);
        }
        *entries = next;
        lists
    }

    /// Ends the ejections whose time is up, so that the gauges are
    /// current even for URLs no request has asked about since (before a
    /// scrape, a readiness answer).
    pub(crate) fn expire(&self, now: Nanos) {
        for entry in self.entries.lock().values() {
            let _ = entry.health.is_out(now);
        }
    }

    /// The summary tick of every URL ([`UrlHealth::summarise`]).
    pub(crate) fn summarise(&self, now: Nanos) {
        for entry in self.entries.lock().values() {
            entry.health.summarise(now);
        }
    }
}

impl Drop for HealthRegistry {
    fn drop(&mut self) {
        for entry in self.entries.get_mut().values() {
            if let Some((_, task)) = &entry.checker {
                task.abort();
            }
        }
    }
}

/// A URL as logs and the `url` label show it: scheme, authority, and the
/// path prefix if there is one (`http://10.0.0.1:8000`).
pub(crate) fn url_label(url: &Uri) -> String {
    let mut text = format!(
        "{}://{}",
        url.scheme_str().unwrap_or("http"),
        url.authority().map_or("", |a| a.as_str())
    );
    if url.path() != "/" {
        text.push_str(url.path());
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_labels_are_as_written() {
        for (url, label) in [
            ("http://127.0.0.1:9000", "http://127.0.0.1:9000"),
            ("http://127.0.0.1:9000/", "http://127.0.0.1:9000"),
            ("https://api.internal/v1", "https://api.internal/v1"),
            ("http://[::1]:80", "http://[::1]:80"),
        ] {
            assert_eq!(url_label(&url.parse().unwrap()), label);
        }
    }
}
