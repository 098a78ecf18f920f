//! Configuration reload on `SIGHUP`: re-read, validate in full, swap whole.
//! An invalid file leaves the running configuration untouched.
//!
//! Every attempt is counted in `tollgate_config_reloads_total{result}`; a
//! success moves `tollgate_config_generation` and clears the error `/config`
//! shows, a failure keeps it (message with file:line:column, and when).

use std::path::Path;
use std::time::SystemTime;

use crate::app::{App, ReloadError};
use crate::config::Config;

/// Settings read once at start: a reload that changes them says so instead
/// of ignoring the change silently.
fn needs_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changed = Vec::new();
    if old.store != new.store {
        changed.push("store");
    }
    // The usage exporter's threads and spool are opened at start.
    if old.usage != new.usage {
        changed.push("usage");
    }
    // The decision listener is bound at start, as the admin listener is.
    if old.decision.as_ref().map(|d| d.listen) != new.decision.as_ref().map(|d| d.listen) {
        changed.push("decision.listen");
    }
    let (old, new) = (&old.server, &new.server);
    if old.workers != new.workers {
        changed.push("server.workers");
    }
    if old.max_connections != new.max_connections {
        changed.push("server.max_connections");
    }
    if old.admin != new.admin {
        changed.push("server.admin");
    }
    if old.state_file != new.state_file {
        changed.push("server.state_file");
    }
    changed
}

/// Reloads `path` into `app`; logs and records the outcome. Blocking (file
/// I/O, parsing): run it off the async workers.
pub fn reload(app: &App, path: &Path) {
    match Config::load(path) {
        Ok(config) => {
            for key in needs_restart(&app.snapshot().config, &config) {
                tracing::warn!(
                    key,
                    "reload: `{key}` changed; the new value takes effect after a restart"
                );
            }
            for warning in crate::config::warnings::bypass_warnings(&config) {
                tracing::warn!("{warning}");
            }
            for warning in crate::config::warnings::store_warnings(&config) {
                tracing::warn!("{warning}");
            }
            for warning in crate::config::warnings::expiry_warnings(&config, SystemTime::now()) {
                tracing::warn!("{warning}");
            }
            // Bookkeeping first, the swap last: whoever sees the new
            // generation in `/config` also sees the error cleared and the
            // counters and gauge moved.
            // (Installing cannot fail.)
            app.set_reload_error(None);
            app.metrics().record_reload(true);
            let generation = app.install(config);
            tracing::info!(generation, "configuration reloaded");
        }
        Err(error) => {
            app.metrics().record_reload(false);
            app.set_reload_error(Some(ReloadError {
                message: error.to_string(),
                at: SystemTime::now(),
            }));
            tracing::error!(error = %error, "configuration reload failed; keeping the running configuration");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(usage: &str, usage_events: bool) -> Config {
        let text = format!(
            "[server]\nlisten = \"127.0.0.1:1\"\n{usage}\n[[routes]]\nname = \"r\"\n\
             respond = {{ status = 200 }}\nusage_events = {usage_events}\n"
        );
        Config::from_bytes(Path::new("gateway.toml"), text.as_bytes()).unwrap()
    }

    #[test]
    fn usage_needs_a_restart_and_a_routes_usage_events_does_not() {
        let file = "[usage]\nfile = \"a.jsonl\"\n";
        let other = "[usage]\nfile = \"b.jsonl\"\n";
        assert_eq!(
            needs_restart(&config(file, true), &config(other, true)),
            vec!["usage"]
        );
        assert!(needs_restart(&config(file, true), &config(file, false)).is_empty());
    }
}
