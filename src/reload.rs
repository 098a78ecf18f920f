//! Configuration reload on `SIGHUP`: re-read, validate in full, swap whole.
//! An invalid file leaves the running configuration untouched.

use std::path::Path;

use crate::app::App;
use crate::config::Config;

/// Reloads `path` into `app`; logs the outcome.
pub fn reload(app: &App, path: &Path) {
    match Config::load(path) {
        Ok(config) => {
            let generation = app.install(config);
            tracing::info!(generation, "configuration reloaded");
        }
        Err(error) => {
            tracing::error!(error = %error, "configuration reload failed; keeping the running configuration");
        }
    }
}
