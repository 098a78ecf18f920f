//! The audit trail of the admin API: every accepted write is one log line
//! on target `tollgate::audit` and one count in
//! `tollgate_admin_writes_total{action}`.
//!
//! A line names the action, the limit, the key by its digest (the 128-bit
//! key the state is stored under, as `GET /limits/NAME?key=` shows it:
//! enough to match lines to each other and to `explain`, never the API key
//! or address itself), the action's parameters and the peer address. The
//! admin token never reaches this module.
//!
//! ```text
//! INFO tollgate::audit: admin write action="reset" limit="per_key" key_digest="5f0c…" parameters={"plan":null} peer=127.0.0.1:50412
//! ```

use std::net::SocketAddr;

use crate::app::App;

/// What an accepted admin write did (the metric's `action` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// `POST /limits/NAME/reset?key=`.
    Reset,
    /// `PUT /limits/NAME/overrides?key=`.
    OverrideSet,
    /// `DELETE /limits/NAME/overrides?key=`.
    OverrideDelete,
    /// `DELETE /limits/NAME/overrides` of a limit no longer configured.
    OverridePrune,
}

impl Action {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Action::Reset => "reset",
            Action::OverrideSet => "override_set",
            Action::OverrideDelete => "override_delete",
            Action::OverridePrune => "override_prune",
        }
    }
}

/// One accepted write, as the audit line and the counter record it.
pub(crate) struct Write<'a> {
    pub(crate) action: Action,
    pub(crate) limit: &'a str,
    /// The key's digest, lowercase hex (never the raw key).
    pub(crate) key_digest: Option<&'a str>,
    /// The write's parameters, as JSON (an override's numbers, a plan).
    pub(crate) parameters: &'a serde_json::Value,
    pub(crate) peer: Option<SocketAddr>,
}

/// Logs `write` on `tollgate::audit` and counts it.
pub(crate) fn record(app: &App, write: &Write<'_>) {
    let action = write.action.label();
    app.metrics().record_admin_write(action);
    let peer = write
        .peer
        .map_or_else(|| "unknown".to_owned(), |peer| peer.to_string());
    tracing::info!(
        target: "tollgate::audit",
        action,
        limit = write.limit,
        key_digest = write.key_digest.unwrap_or(""),
        parameters = %write.parameters,
        peer = %peer,
        "admin write"
    );
}
