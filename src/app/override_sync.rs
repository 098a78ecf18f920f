//! A Redis fleet's overrides kept current on this node: every
//! [`POLL_EVERY`], off the request path, the overrides' version is read
//! (one `GET`); when it moved, every limit's hash is read and the set put
//! in force in place of this node's (`store::overrides` holds them). A node
//! that cannot reach Redis keeps the last overrides it saw and says so:
//! `tollgate_overrides_stale` is 1 and `/readyz` names it, until a poll
//! succeeds again.
//!
//! The hashes are read again, the version unmoved, when:
//! - a reload installed another configuration: a limit added back finds
//!   the overrides Redis kept for it, as a node started on that
//!   configuration would;
//! - the earliest expiry of the set in force has passed: the expired
//!   override is removed from Redis by the first node to read it
//!   (`RedisStore::expire_override`, which bumps the version once). The
//!   request path, explain, the listing and the quota route already stop
//!   using it at its expiry (each compares the expiry it holds), so Redis
//!   is only tidied here, with no call per request.

use std::sync::Arc;
use std::time::Duration;

use super::App;
use super::overrides::Override;
use super::state_file::entry;
use crate::limit::Nanos;
use crate::store::Unavailable;

/// How often the version is read: a write reaches every node within about
/// this plus one read of the hashes (the contract's bound is 1 s).
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(250);

/// What a poll last put in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    version: u64,
    /// The configuration generation the hashes were read for.
    generation: u64,
    /// The earliest expiry of the overrides read, when one has one.
    next_expiry: Option<Nanos>,
}

impl Seen {
    /// Whether the hashes need no new read at `now`.
    fn current(&self, version: u64, generation: u64, now: Nanos) -> bool {
        self.version == version
            && self.generation == generation
            && self.next_expiry.is_none_or(|at| now < at)
    }
}

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
            Ok(now_seen) => {
                seen = Some(now_seen);
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

/// Reads the version and, when the set `seen` is not current (see the
/// module doc), every limit's overrides, putting them in force and
/// removing the expired ones from Redis.
async fn refresh(app: &App, seen: Option<Seen>) -> Result<Seen, Unavailable> {
    let snapshot = app.snapshot();
    let generation = snapshot.generation;
    let Some(store) = &app.store else {
        return Ok(Seen {
            version: 0,
            generation,
            next_expiry: None,
        });
    };
    let version = store.overrides_version().await?;
    let now = app.clock.now();
    match seen {
        Some(seen) if seen.current(version, generation, now) => return Ok(seen),
        // Version 0: no override was ever written to this Redis, so there
        // is nothing to read (and a store whose ACL has no override
        // commands, as before overrides existed, is not asked for them).
        None if version == 0 => {
            return Ok(Seen {
                version,
                generation,
                next_expiry: None,
            });
        }
        _ => {}
    }
    let limits: Vec<String> = snapshot
        .config
        .limits
        .iter()
        .map(|l| l.name.clone())
        .collect();
    drop(snapshot);
    let mut records: Vec<Override> = Vec::new();
    for limit in &limits {
        for (digest, value) in store.overrides_of(limit).await? {
            let parsed = serde_json::from_str(&value)
                .map_err(|e| e.to_string())
                .and_then(|value| entry(&value));
            match parsed {
                // Expired: gone from Redis too, by whichever node reads it
                // first (the others' calls find it gone).
                Ok(record) if record.expires.is_some_and(|at| at <= now) => {
                    store.expire_override(limit, &digest, &value).await?;
                }
                Ok(record) if record.limit == *limit => records.push(record),
                Ok(_) | Err(_) => {
                    tracing::warn!(limit = %limit, digest = %digest, "overrides: an unreadable override in redis is ignored");
                }
            }
        }
    }
    let next_expiry = records.iter().filter_map(|o| o.expires).min();
    app.replace_overrides(records);
    Ok(Seen {
        version,
        generation,
        next_expiry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_set_is_current_until_the_version_the_configuration_or_an_expiry_moves() {
        let seen = Seen {
            version: 3,
            generation: 1,
            next_expiry: Some(100),
        };
        assert!(seen.current(3, 1, 99));
        assert!(!seen.current(4, 1, 99), "a write");
        assert!(!seen.current(3, 2, 99), "a reload");
        assert!(!seen.current(3, 1, 100), "an expiry");
        let forever = Seen {
            next_expiry: None,
            ..seen
        };
        assert!(forever.current(3, 1, u64::MAX));
    }
}
