//! The idle sweeper: every [`INTERVAL`], [`App::sweep`] on a blocking
//! thread — limiter keys back at full quota are evicted, idle upstream
//! connections pruned, the upstream health summaries written.
//!
//! It lives beside the limiter registry it sweeps, not with the connections:
//! the gateway starts it for as long as it serves (`gateway::run`).

use std::sync::Arc;
use std::time::Duration;

use crate::app::App;

/// How often idle limiter keys are evicted (and idle upstream connections
/// pruned). Keys back at full quota carry no information, so evicting them
/// bounds memory under floods of one-shot keys.
pub(crate) const INTERVAL: Duration = Duration::from_secs(10);

/// Sweeps `app` every [`INTERVAL`], the first time at once, until the task
/// is aborted.
pub(crate) async fn sweep_idle(app: Arc<App>) {
    let mut interval = tokio::time::interval(INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        // Sweeping locks one shard at a time; run it off the runtime.
        let app = app.clone();
        let removed = tokio::task::spawn_blocking(move || app.sweep())
            .await
            .unwrap_or(0);
        if removed > 0 {
            tracing::debug!(removed, "evicted idle limiter keys");
        }
    }
}
