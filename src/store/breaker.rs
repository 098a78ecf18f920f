//! The breaker, and the store thread that probes and beats.
//!
//! Every call is bounded by `timeout`. [`FAILURES_TO_OPEN`] failures in a
//! row open the breaker: calls then fail at once (the caller applies
//! `on_failure`) and the store thread probes every [`PROBE_INTERVAL`] with
//! a fresh connection (`PING` + `SCRIPT LOAD`), each probe itself bounded;
//! the first that succeeds closes the breaker and moves the connections'
//! generation. Opening and closing are each logged once (the first failed
//! probe of an outage says why) and shown by
//! `tollgate_store_fallback_active`; every failed call, probes included,
//! counts in `tollgate_store_errors_total{backend="redis"}`.
//!
//! A connection is made the same way whatever the servers are (`connect`),
//! so the breaker, `on_failure` and the generations behave alike on each:
//! after a Sentinel failover, the probe's fresh connection is to the new
//! master.
//!
//! # Heartbeats
//!
//! While the breaker is closed, the store thread gives back lapsed token
//! leases and, with `local_fraction = "auto"`, renews this node's heartbeat
//! (`heartbeat.lua`) every [`HEARTBEAT_EVERY`]; each answer is the live
//! node count, and a change is passed to the listener the app set
//! ([`RedisStore::on_live_nodes`]), which rescales the fallback limiters.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{Cmd, Value};

use super::{RedisStore, Unavailable};

/// Failed calls in a row that open the breaker.
pub(crate) const FAILURES_TO_OPEN: u32 = 3;

/// How often an open breaker tries Redis again.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(250);

/// How often a node renews its heartbeat (`local_fraction = "auto"`), and
/// how long one counts.
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
pub(crate) const HEARTBEAT_TTL: Duration = Duration::from_secs(3);

impl RedisStore {
    /// One call, bounded by `timeout`, through the breaker; re-loads the
    /// script on `NOSCRIPT`.
    pub(super) async fn call(
        &self,
        script: &redis::Script,
        cmd: &Cmd,
    ) -> Result<Value, Unavailable> {
        if self.is_down() {
            return Err(Unavailable);
        }
        match self.query(&self.thread_state(), script, cmd).await {
            Ok(value) => {
                self.failures.store(0, Ordering::Relaxed);
                Ok(value)
            }
            Err(Unavailable) => {
                self.failed();
                Err(Unavailable)
            }
        }
    }

    /// Counts a failed call; the [`FAILURES_TO_OPEN`]th in a row opens the
    /// breaker and wakes the store thread to probe.
    pub(super) fn failed(&self) {
        (self.signals.error)();
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= FAILURES_TO_OPEN && !self.open.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                on_failure = ?self.config.on_failure,
                "redis store unavailable; on_failure applies until it answers again"
            );
            (self.signals.fallback)(true);
            self.wake.notify_one();
        }
    }

    /// Renews this node's heartbeat; the live node count.
    async fn beat(&self) -> Result<u64, Unavailable> {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.heartbeat.get_hash())
            .arg(1)
            .arg(format!("{}nodes", self.config.prefix))
            .arg(&self.node)
            .arg(HEARTBEAT_TTL.as_millis() as u64);
        match self.call(&self.heartbeat, &cmd).await? {
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(1).max(1)),
            _ => Err(Unavailable),
        }
    }
}

/// The store thread: connects, and reconnects whenever the breaker opens.
pub(super) async fn supervise(
    store: std::sync::Weak<RedisStore>,
    ready: std::sync::mpsc::Sender<bool>,
) {
    let mut ready = Some(ready);
    let mut logged_down = false;
    // As last told to the nodes listener; 1 until a heartbeat says more.
    let mut live_nodes = 1;
    loop {
        let Some(s) = store.upgrade() else { return };
        if s.is_down() {
            let attempt = tokio::time::timeout(Duration::from_secs(2), s.connect()).await;
            match attempt {
                Ok(Ok(_probe)) => {
                    // Threads connect again, lazily, on their own runtimes.
                    s.generation.fetch_add(1, Ordering::AcqRel);
                    s.failures.store(0, Ordering::Relaxed);
                    s.open.store(false, Ordering::Relaxed);
                    (s.signals.fallback)(false);
                    if ready.take().is_some_and(|r| r.send(true).is_ok()) {
                        tracing::info!(redis = %s.config.servers, "redis store connected");
                    } else {
                        tracing::info!("redis store answers again; shared limits resumed");
                    }
                    logged_down = false;
                }
                // A failed probe is a failed call: a gateway that never
                // connects (a wrong CA or password) shows in the errors.
                failed => {
                    (s.signals.error)();
                    // Why, once per outage; the URLs print redacted.
                    if !logged_down {
                        let error = match failed {
                            Ok(Err(error)) => error.to_string(),
                            _ => "no answer within 2s".to_owned(),
                        };
                        tracing::warn!(redis = %s.config.servers, %error, "redis store cannot connect");
                        logged_down = true;
                    }
                }
            }
            if let Some(r) = ready.take_if(|_| s.is_down()) {
                let _ = r.send(false);
            }
            drop(s);
            tokio::time::sleep(PROBE_INTERVAL).await;
        } else {
            s.return_expired(false).await;
            if let Some(listener) = s.nodes_listener.get()
                && let Ok(nodes) = s.beat().await
                && nodes != live_nodes
            {
                live_nodes = nodes;
                listener(nodes);
            }
            // Also re-checked every second, so a dropped store ends the thread.
            let _ = tokio::time::timeout(HEARTBEAT_EVERY, s.wake.notified()).await;
        }
    }
}
