//! `GET /stats`: the gateway at a glance as one JSON document, the data of
//! `/dashboard` (`docs/src/guides/dashboard.md` documents every field).
//!
//! Every number comes from the counters `/metrics` exposes, read back from
//! their exposition ([`super::exposition`]): no second bookkeeping on the
//! request path, and the two endpoints cannot disagree. The only other
//! source is the sketch of the keys refused most
//! ([`crate::metrics::refused_keys`]), which the deny path alone feeds.
//!
//! Totals, not rates: a reader computes rates from two documents and their
//! `unix_ms`. That keeps `/stats` stateless (no sampler task, no ring of
//! past totals), costs nothing while nobody looks, and gives every viewer
//! exact rates over its own refresh interval, as `rate()` does in
//! Prometheus.

use std::collections::{BTreeMap, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use super::exposition::{Sample, samples};
use crate::app::{App, Snapshot};
use crate::config::{ApiKeySource, KeyPart, LimitConfig, RouteAction, StoreBackend};
use crate::limit::LimitKey;
use crate::metrics::refused_keys::{CAPACITY, Counted};

/// The version of the document's shape: raised when a field changes
/// meaning or goes; new fields do not raise it.
const VERSION: u64 = 1;

/// The outcomes of `tollgate_ratelimit_decisions_total`, each a field of a
/// limit's entry.
const OUTCOMES: [&str; 5] = [
    "allowed",
    "denied",
    "shadow_denied",
    "skipped",
    "denied_by_other",
];

/// The `/stats` document of `app` now.
pub(crate) fn stats(app: &App) -> Value {
    // As for a scrape: ejections whose time is up end, live keys counted.
    app.refresh_upstream_health();
    app.refresh_limiter_keys();
    let text = app.metrics().encode();
    let read = Read::new(&text);
    let snapshot = app.snapshot();
    // The wall clock, as `loaded_at`: a reader's rates are over the time
    // between two documents, which the limiters' clock does not give.
    let unix_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut config = super::config_json(app);
    config["reloads"] = json!({
        "ok": read.total("tollgate_config_reloads_total", &[("result", "ok")]),
        "error": read.total("tollgate_config_reloads_total", &[("result", "error")]),
    });
    json!({
        "version": VERSION,
        "unix_ms": unix_ms,
        "routes": routes(&read, &snapshot),
        "limits": limits(&read, &snapshot),
        "refused_keys": refused_keys(app, &snapshot),
        "upstreams": upstreams(&read, &snapshot),
        "store": store(app, &read, &snapshot),
        "config": config,
        "adaptive": adaptive(&read, &snapshot),
        "queues": queues(&read, &snapshot),
    })
}

// Adaptive limits and queues: each section is an array of flat objects,
// one per limit (its name first, then numbers), read like the rest from the
// metrics they expose. The page shows a section once it is not empty, one
// table row per object and one column per field.

/// `adaptive`: each adaptive limit's current limit (summed over its keys),
/// requests in flight, and requests it shed (`tollgate_shed_total`).
fn adaptive(read: &Read<'_>, snapshot: &Snapshot) -> Value {
    let list: Vec<Value> = snapshot
        .config
        .limits
        .iter()
        .filter(|l| matches!(l.algorithm, crate::limit::Algorithm::Adaptive { .. }))
        .map(|l| {
            let name = l.name.as_str();
            json!({
                "limit": name,
                "current_limit": read.total("tollgate_adaptive_limit", &[("limit", name)]),
                "in_flight": read.total("tollgate_inflight", &[("limit", name)]),
                "shed": read.total("tollgate_shed_total", &[("limit", name)]),
            })
        })
        .collect();
    Value::Array(list)
}

/// `queues`: each slot limit with a `queue`: requests in flight, waiting,
/// the line's size, and requests shed by reason.
fn queues(read: &Read<'_>, snapshot: &Snapshot) -> Value {
    let list: Vec<Value> = snapshot
        .config
        .limits
        .iter()
        .filter_map(|l| l.queue.as_ref().map(|q| (l.name.as_str(), q)))
        .map(|(name, queue)| {
            let shed = |reason| {
                read.total(
                    "tollgate_shed_total",
                    &[("limit", name), ("reason", reason)],
                )
            };
            json!({
                "limit": name,
                "in_flight": read.total("tollgate_inflight", &[("limit", name)]),
                "waiting": read.total("tollgate_queue_depth", &[("limit", name)]),
                "size": queue.params.size,
                "shed_full": shed("full"),
                "shed_queue_full": shed("queue_full"),
                "shed_wait_too_long": shed("wait_too_long"),
                "shed_timeout": shed("timeout"),
            })
        })
        .collect();
    Value::Array(list)
}

/// The exposition's samples, as read, by sample name: each lookup reads
/// one metric's series, not the whole exposition.
struct Read<'t> {
    by_name: HashMap<&'t str, Vec<Sample<'t>>>,
}

impl<'t> Read<'t> {
    fn new(text: &'t str) -> Read<'t> {
        let mut by_name: HashMap<&str, Vec<Sample<'_>>> = HashMap::new();
        for sample in samples(text) {
            by_name.entry(sample.name).or_default().push(sample);
        }
        Read { by_name }
    }

    /// The samples named `name`.
    fn named(&self, name: &str) -> impl Iterator<Item = &Sample<'t>> {
        self.by_name.get(name).into_iter().flatten()
    }

    /// The sum of the samples named `name` that carry every label of
    /// `labels`, as a whole number (counters and gauges here count).
    fn total(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.named(name)
            .filter(|s| labels.iter().all(|(l, v)| s.label(l) == Some(*v)))
            .map(|s| count(s.value))
            .sum()
    }
}

/// A counter's or gauge's value as a whole number (0 for NaN or below).
fn count(value: f64) -> u64 {
    if value.is_finite() && value > 0.0 {
        value as u64
    } else {
        0
    }
}

/// A latency histogram summed over some routes.
#[derive(Default)]
struct Latency {
    count: u64,
    sum_seconds: f64,
    /// Cumulative counts by upper bound, `+Inf` left out (it is `count`).
    buckets: BTreeMap<u64, (f64, u64)>,
}

impl Latency {
    /// `tollgate_request_duration_seconds` of `route`, added.
    fn add_route(&mut self, read: &Read<'_>, route: &str) {
        let of_route = |s: &&Sample<'_>| s.label("route") == Some(route);
        for s in read
            .named("tollgate_request_duration_seconds_bucket")
            .filter(of_route)
        {
            let Some(le) = s.label("le").and_then(|le| le.parse::<f64>().ok()) else {
                continue;
            };
            if !le.is_finite() {
                continue;
            }
            // Keyed by the bound's bits: the bounds are the same for every
            // route, and positive floats order as their bits do.
            let bucket = self.buckets.entry(le.to_bits()).or_insert((le, 0));
            bucket.1 += count(s.value);
        }
        for s in read
            .named("tollgate_request_duration_seconds_count")
            .filter(of_route)
        {
            self.count += count(s.value);
        }
        for s in read
            .named("tollgate_request_duration_seconds_sum")
            .filter(of_route)
        {
            if s.value.is_finite() {
                self.sum_seconds += s.value;
            }
        }
    }

    fn json(&self) -> Value {
        let buckets: Vec<Value> = self
            .buckets
            .values()
            .map(|(le, count)| json!({ "le": le, "count": count }))
            .collect();
        json!({
            "count": self.count,
            "sum_seconds": self.sum_seconds,
            "buckets": buckets,
        })
    }
}

/// Names in configuration order, then the ones a reload removed whose
/// counters remain, sorted.
fn ordered<'n>(
    configured: impl Iterator<Item = &'n str>,
    seen: impl Iterator<Item = &'n str>,
) -> Vec<&'n str> {
    let mut names: Vec<&str> = Vec::new();
    for name in configured {
        if !names.contains(&name) {
            names.push(name);
        }
    }
    let mut gone: Vec<&str> = seen.filter(|name| !names.contains(name)).collect();
    gone.sort_unstable();
    gone.dedup();
    names.extend(gone);
    names
}

/// `routes`: each route's answers by status and its latency.
fn routes(read: &Read<'_>, snapshot: &Snapshot) -> Value {
    let config = &snapshot.config;
    let names = ordered(
        config.routes.iter().map(|r| r.name.as_str()),
        read.named("tollgate_requests_total")
            .filter_map(|s| s.label("route")),
    );
    let list: Vec<Value> = names
        .into_iter()
        .map(|name| {
            let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
            for s in read
                .named("tollgate_requests_total")
                .filter(|s| s.label("route") == Some(name))
            {
                if let Some(status) = s.label("status") {
                    *statuses.entry(status.to_owned()).or_default() += count(s.value);
                }
            }
            let mut latency = Latency::default();
            latency.add_route(read, name);
            let upstream = config
                .routes
                .iter()
                .find(|r| r.name == name)
                .and_then(|r| match r.action {
                    RouteAction::Forward(index) => config.upstreams.get(index),
                    _ => None,
                })
                .map(|u| u.name.as_str());
            json!({
                "route": name,
                "upstream": upstream,
                "total": statuses.values().sum::<u64>(),
                "statuses": statuses,
                "latency": latency.json(),
            })
        })
        .collect();
    Value::Array(list)
}

/// `limits`: each limit's decisions by outcome, over its routes and fronts.
fn limits(read: &Read<'_>, snapshot: &Snapshot) -> Value {
    let config = &snapshot.config;
    let decisions = "tollgate_ratelimit_decisions_total";
    let names = ordered(
        config.limits.iter().map(|l| l.name.as_str()),
        read.named(decisions).filter_map(|s| s.label("limit")),
    );
    let list: Vec<Value> = names
        .into_iter()
        .map(|name| {
            let mut entry = Map::new();
            entry.insert("limit".into(), json!(name));
            for outcome in OUTCOMES {
                let n = read.total(decisions, &[("limit", name), ("outcome", outcome)]);
                entry.insert(outcome.into(), json!(n));
            }
            let routes: Vec<&str> = config
                .limits
                .iter()
                .position(|l| l.name == name)
                .map(|index| {
                    config
                        .routes
                        .iter()
                        .filter(|r| r.limits.contains(&index))
                        .map(|r| r.name.as_str())
                        .collect()
                })
                .unwrap_or_default();
            entry.insert("routes".into(), json!(routes));
            let configured = config.limits.iter().find(|l| l.name == name);
            entry.insert(
                "key".into(),
                json!(configured.map(|l| crate::summary::key_parts(&l.key))),
            );
            entry.insert(
                "policy".into(),
                json!(configured.map(|l| crate::summary::algorithm(&l.algorithm))),
            );
            entry.insert(
                "keys".into(),
                json!(read.total("tollgate_limiter_keys", &[("limit", name)])),
            );
            Value::Object(entry)
        })
        .collect();
    Value::Array(list)
}

/// `refused_keys`: the sketch's top pairs, each named after its consumer
/// or tenant where the limit keys on one (or on the API key of one).
fn refused_keys(app: &App, snapshot: &Snapshot) -> Value {
    let top = app.metrics().refused_keys().top(CAPACITY);
    let mut names: HashMap<&str, HashMap<LimitKey, Named>> = HashMap::new();
    let keys: Vec<Value> = top
        .iter()
        .map(
            |Counted {
                 limit,
                 key,
                 count,
                 error,
             }| {
                let known = names.entry(limit).or_insert_with(|| {
                    snapshot
                        .config
                        .limits
                        .iter()
                        .find(|l| l.name == **limit)
                        .map(|l| known_keys(snapshot, l))
                        .unwrap_or_default()
                });
                let (consumer, tenant) = match known.get(key) {
                    Some(Named::Consumer(name)) => (Some(name.as_str()), None),
                    Some(Named::Tenant(name)) => (None, Some(name.as_str())),
                    None => (None, None),
                };
                json!({
                    "limit": &**limit,
                    "digest": format!("{:032x}", key.as_u128()),
                    "consumer": consumer,
                    "tenant": tenant,
                    "count": count,
                    "error": error,
                })
            },
        )
        .collect();
    json!({ "capacity": CAPACITY, "keys": keys })
}

/// Who a digest is, where the configuration says.
enum Named {
    Consumer(String),
    Tenant(String),
}

/// The digests of `limit` that the configuration can name: its consumers'
/// (keyed on `consumer`, or on the header that carries their API keys) or
/// tenants' (keyed on `tenant`). Computed per `/stats`, off the request
/// path; other keys stay digests.
fn known_keys(snapshot: &Snapshot, limit: &LimitConfig) -> HashMap<LimitKey, Named> {
    let config = &snapshot.config;
    let mut known = HashMap::new();
    match limit.key.as_slice() {
        [KeyPart::Consumer] => {
            for consumer in config.consumers.values() {
                let name = &*consumer.consumer;
                known.insert(
                    LimitKey::digest(&[name.as_bytes()]),
                    Named::Consumer(name.to_owned()),
                );
            }
        }
        [KeyPart::Tenant] => {
            for tenant in config
                .consumers
                .values()
                .filter_map(|c| c.tenant.as_deref())
            {
                known.insert(
                    LimitKey::digest(&[tenant.as_bytes()]),
                    Named::Tenant(tenant.to_owned()),
                );
            }
        }
        [KeyPart::Header(header)] if matches!(&config.api_keys.source, ApiKeySource::Header(source) if source == header) => {
            for (api_key, consumer) in config.consumers.iter() {
                known.insert(
                    LimitKey::digest(&[api_key.as_bytes()]),
                    Named::Consumer(consumer.consumer.to_string()),
                );
            }
        }
        _ => {}
    }
    known
}

/// `upstreams`: each URL's health and ejections, the upstream's failures
/// and retries, and the latency of the routes that forward to it.
fn upstreams(read: &Read<'_>, snapshot: &Snapshot) -> Value {
    let config = &snapshot.config;
    let names = ordered(
        config.upstreams.iter().map(|u| u.name.as_str()),
        read.named("tollgate_upstream_healthy")
            .filter_map(|s| s.label("upstream")),
    );
    let by_label = |name: &str, label: &str| -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        let metric = match label {
            "kind" => "tollgate_upstream_errors_total",
            _ => "tollgate_upstream_retries_total",
        };
        for s in read
            .named(metric)
            .filter(|s| s.label("upstream") == Some(name))
        {
            if let Some(value) = s.label(label) {
                *counts.entry(value.to_owned()).or_default() += count(s.value);
            }
        }
        counts
    };
    let list: Vec<Value> = names
        .into_iter()
        .map(|name| {
            // Sorted by URL: the exposition's order is a hash map's.
            let mut healthy: Vec<&Sample<'_>> = read
                .named("tollgate_upstream_healthy")
                .filter(|s| s.label("upstream") == Some(name))
                .collect();
            healthy.sort_by(|a, b| a.label("url").cmp(&b.label("url")));
            let urls: Vec<Value> = healthy
                .into_iter()
                .filter_map(|s| {
                    let url = s.label("url")?;
                    let mut ejections: BTreeMap<String, u64> = BTreeMap::new();
                    for e in read.named("tollgate_upstream_ejections_total").filter(|e| {
                        e.label("upstream") == Some(name) && e.label("url") == Some(url)
                    }) {
                        if let Some(reason) = e.label("reason") {
                            *ejections.entry(reason.to_owned()).or_default() += count(e.value);
                        }
                    }
                    Some(json!({
                        "url": url,
                        "healthy": s.value >= 1.0,
                        "ejections_total": ejections.values().sum::<u64>(),
                        "ejections": ejections,
                    }))
                })
                .collect();
            let routes: Vec<&str> = config
                .upstreams
                .iter()
                .position(|u| u.name == name)
                .map(|index| {
                    config
                        .routes
                        .iter()
                        .filter(|r| matches!(r.action, RouteAction::Forward(i) if i == index))
                        .map(|r| r.name.as_str())
                        .collect()
                })
                .unwrap_or_default();
            let mut latency = Latency::default();
            for route in &routes {
                latency.add_route(read, route);
            }
            json!({
                "upstream": name,
                "routes": routes,
                "urls": urls,
                "errors": by_label(name, "kind"),
                "retries": by_label(name, "reason"),
                "latency": latency.json(),
            })
        })
        .collect();
    Value::Array(list)
}

/// `store`: the limiter store's backend and state.
fn store(app: &App, read: &Read<'_>, snapshot: &Snapshot) -> Value {
    let fallback = read.total("tollgate_store_fallback_active", &[]) > 0;
    let (backend, state, on_failure) = match (&snapshot.config.store.backend, app.store()) {
        (StoreBackend::Memory, _) => ("memory", "up", None),
        (StoreBackend::Redis(redis), store) => {
            let state = match store {
                // It did not start: limits stay node-local.
                None => "local",
                Some(store) if store.is_down() => "down",
                Some(_) => "up",
            };
            ("redis", state, Some(on_failure_name(redis.on_failure)))
        }
    };
    json!({
        "backend": backend,
        "state": state,
        "fallback_active": fallback,
        "on_failure": on_failure,
        "errors": read.total("tollgate_store_errors_total", &[("backend", backend)]),
        "remembered_denials": read.total("tollgate_store_remembered_denials_total", &[]),
    })
}

fn on_failure_name(on_failure: crate::config::OnFailure) -> &'static str {
    match on_failure {
        crate::config::OnFailure::Local => "local",
        crate::config::OnFailure::Allow => "allow",
        crate::config::OnFailure::Deny => "deny",
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const CONFIG: &str = r#"
[limits.by_consumer]
key = "consumer"
algorithm = "fixed_window"
limit = 1
window = "1h"

[limits.by_ip]
key = "ip"
algorithm = "fixed_window"
limit = 1
window = "1h"

[consumers."sk-secret-1"]
consumer = "acme-web"

[[routes]]
name = "r"
match = { path_prefix = "/" }
respond = { status = 200 }
limits = ["by_consumer", "by_ip"]
"#;

    fn app() -> Arc<App> {
        let config = crate::config::Config::from_bytes(
            std::path::Path::new("gateway.toml"),
            CONFIG.as_bytes(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        App::new(config)
    }

    #[test]
    fn refused_keys_are_named_after_their_consumer_where_the_limit_keys_on_it() {
        let app = app();
        let refused = app.metrics().refused_keys();
        let (by_consumer, by_ip): (Arc<str>, Arc<str>) =
            (Arc::from("by_consumer"), Arc::from("by_ip"));
        let acme = LimitKey::digest(&[b"acme-web"]);
        let address = LimitKey::digest(&[b"\x04\x0a\x00\x00\x01"]);
        for _ in 0..3 {
            refused.record(&by_consumer, acme);
        }
        refused.record(&by_ip, address);
        // A limit a reload removed: its digest stays a digest.
        refused.record(&Arc::from("gone"), acme);
        let stats = stats(&app);
        let keys = stats["refused_keys"]["keys"].as_array().expect("keys");
        assert_eq!(keys.len(), 3, "{keys:#?}");
        assert_eq!(keys[0]["limit"], "by_consumer");
        assert_eq!(keys[0]["consumer"], "acme-web");
        assert_eq!(keys[0]["count"], 3);
        assert_eq!(keys[0]["digest"], format!("{:032x}", acme.as_u128()));
        for named_nothing in &keys[1..] {
            assert_eq!(named_nothing["consumer"], Value::Null);
            assert_eq!(named_nothing["tenant"], Value::Null);
        }
        assert!(!stats.to_string().contains("sk-secret-1"));
    }

    #[test]
    fn a_fresh_gateway_reports_every_configured_name_at_zero() {
        let stats = stats(&app());
        assert_eq!(stats["routes"][0]["route"], "r");
        assert_eq!(stats["routes"][0]["total"], 0);
        let limits: Vec<&str> = stats["limits"]
            .as_array()
            .expect("limits")
            .iter()
            .map(|l| l["limit"].as_str().expect("name"))
            .collect();
        assert_eq!(limits, ["by_consumer", "by_ip"]);
        assert_eq!(stats["limits"][1]["denied"], 0);
        assert_eq!(stats["limits"][1]["key"], "ip");
        assert_eq!(stats["upstreams"], serde_json::json!([]));
        assert_eq!(stats["store"]["backend"], "memory");
        assert_eq!(stats["config"]["generation"], 1);
        assert_eq!(stats["refused_keys"]["keys"], serde_json::json!([]));
    }

    #[test]
    fn names_in_configuration_order_then_the_removed_sorted() {
        let names = ordered(["b", "a"].into_iter(), ["z", "a", "c", "z"].into_iter());
        assert_eq!(names, ["b", "a", "c", "z"]);
    }
}
