//! "Start this customer afresh": one key of a named limit emptied, for
//! `POST /limits/NAME/reset?key=VALUE` on the admin listener.
//!
//! The key is named as `GET /limits/NAME?key=` names it (`explain`: the
//! raw value(s), `plan=`, or a descriptor's `entry=`), and the answer is
//! its state just before, as `explain` gives it. A limit decided in node
//! memory forgets the key in this node's limiter; a shared limit deletes
//! it in Redis (`store::forget`, on Cluster at the key's slot) and then
//! forgets this node's fallback state of it too. Either way the key's next
//! request is decided as a new key's.

use std::sync::Arc;

use serde_json::Value;

use super::explain::{ExplainError, explain, target};
use super::shared::store_entry;
use crate::app::Snapshot;
use crate::limit::Nanos;
use crate::store::RedisStore;

/// Why a reset did not happen.
#[derive(Debug, PartialEq, Eq)]
pub enum ResetError {
    /// The limit or the key is not one of this configuration's
    /// (`explain`'s 404 and 400).
    Explain(ExplainError),
    /// Redis did not answer: the shared state may be as it was.
    StoreDown,
}

/// Empties `limit`'s key named by `query`; its state before, as JSON.
pub async fn reset(
    snapshot: &Snapshot,
    store: Option<&Arc<RedisStore>>,
    limit: &str,
    query: Option<&str>,
    now: Nanos,
) -> Result<Value, ResetError> {
    let before = explain(snapshot, store, limit, query, now)
        .await
        .map_err(ResetError::Explain)?;
    let target = target(snapshot, limit, query).map_err(ResetError::Explain)?;
    if let Some(store) = store.filter(|_| snapshot.is_shared(target.id)) {
        let config = snapshot.limit_config(target.id);
        let entry = store_entry(config, target.plan.as_deref(), target.digest);
        store
            .forget(&entry)
            .await
            .map_err(|_| ResetError::StoreDown)?;
    }
    snapshot
        .limiters(target.id)
        .for_plan(target.plan.as_deref())
        .forget(target.digest);
    Ok(before)
}
