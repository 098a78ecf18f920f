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

/// Reloads `path` into `app`; logs and records the outcome.
pub fn reload(app: &App, path: &Path) {
    match Config::load(path) {
        Ok(config) => {
            let generation = app.install(config);
            app.metrics().record_reload(true);
            app.metrics().set_generation(generation);
            app.set_reload_error(None);
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
