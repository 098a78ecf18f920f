//! A Redis fleet's overrides kept current on this node: every
//! [`POLL_EVERY`], off the request path, the overrides' version is read
//! (one `GET`); when it moved, every limit's hash is read and the set put
//! in force in place of this node's (`store::overrides` holds them). A node
//! that cannot reach Redis keeps the last overrides it saw and says so:
//! `tollgate_overrides_stale` is 1 and `/readyz` names it, until a poll
//! succeeds again. An expired override a poll reads is removed from Redis.

use std::sync::Arc;
use std::time::Duration;

use super::App;
use super::overrides::Override;
use super::state_file::entry;
use crate::store::Unavailable;

/// How often the version is read: a write reaches every node within about
/// this plus one read of the hashes (the contract's bound is 1 s).
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(250);

/// Polls `app`'s store until the task is aborted; returns at once without
/// a store.
pub(crate) async fn poll(app: Arc<App>) {
    if app.store.is_none() {
        return;
    }
    let mut seen = None;
    let mut interval = tokio::time::interval(POLL_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let stale = match refresh(&app, seen).await {
            Ok(version) => {
                seen = Some(version);
                false
            }
            Err(Unavailable) => true,
        };
        if app.overrides.set_stale(stale) != stale {
            app.metrics.set_overrides_stale(stale);
            if stale {
                tracing::warn!(
                    "overrides: redis does not answer; this node keeps the last overrides it saw"
                );
            } else {
                tracing::info!("overrides: read from redis again");
            }
        }
    }
}

/// Reads the version and, when it is not `seen`, every limit's overrides,
/// putting them in force; the version read.
async fn refresh(app: &App, seen: Option<u64>) -> Result<u64, Unavailable> {
    let Some(store) = &app.store else {
        return Ok(0);
    };
    let version = store.overrides_version().await?;
    // Version 0: no override was ever written to this Redis, so there is
    // nothing to read (and a store whose ACL has no override commands, as
    // before overrides existed, is not asked for them).
    if seen == Some(version) || (version == 0 && seen.is_none()) {
        return Ok(version);
    }
    let limits: Vec<String> = app
        .snapshot()
        .config
        .limits
        .iter()
        .map(|l| l.name.clone())
        .collect();
    let mut records: Vec<Override> = Vec::new();
    let now = app.clock.now();
    for limit in &limits {
        for (digest, value) in store.overrides_of(limit).await? {
            let parsed = serde_json::from_str(&value)
                .map_err(|e| e.to_string())
                .and_then(|value| entry(&value));
            match parsed {
                // Expired: gone from Redis too (whichever node sees it first).
                Ok(record) if record.expires.is_some_and(|at| at <= now) => {
                    store.write_override(limit, &digest, None).await?;
                }
                Ok(record) if record.limit == *limit => records.push(record),
                Ok(_) | Err(_) => {
                    tracing::warn!(limit = %limit, digest = %digest, "overrides: an unreadable override in redis is ignored");
                }
            }
        }
    }
    app.replace_overrides(records);
    Ok(version)
}
