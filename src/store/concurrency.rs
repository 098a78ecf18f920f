//! Concurrency slots held in Redis. A `concurrency` limit's slot is a
//! sorted-set member whose score is its expiry ([`LEASE`] from Redis
//! `TIME`), added by `stack.lua` when the stack admits. The request holds
//! a [`Lease`] until its response body ends; dropping it removes the
//! member (`settle.lua` with a negative delta). While held it is renewed
//! every third of [`LEASE`], so a long response keeps its slot and a
//! gateway that dies holds it at most [`LEASE`] longer.

use std::sync::Arc;
use std::time::Duration;

use redis::Cmd;

use super::{OwnedEntry, RedisStore, SharedEntry};

/// How long a concurrency slot outlives the last renewal of its holder.
pub(crate) const LEASE: Duration = Duration::from_secs(30);

/// Concurrency slots held in Redis by one admitted request: renewed while
/// held, removed when dropped (the response body ended).
#[derive(Debug)]
pub(crate) struct Lease {
    renew: tokio::task::JoinHandle<()>,
    release: Option<(Arc<RedisStore>, Cmd)>,
}

impl Lease {
    pub(super) fn hold(
        store: Arc<RedisStore>,
        held: Vec<OwnedEntry>,
        member: String,
        cost: u64,
    ) -> Lease {
        let views: Vec<SharedEntry<'_>> = held.iter().map(OwnedEntry::view).collect();
        // A positive delta renews a lease, a negative one removes it
        // (`settle.lua`).
        let renew_cmd = store.script_cmd(&store.settle, &views, |_| cost as i64, Some(&member));
        let release_cmd =
            store.script_cmd(&store.settle, &views, |_| -(cost as i64), Some(&member));
        drop(views);
        let renewer = store.clone();
        let renew = store.runtime.spawn(async move {
            let period = LEASE / 3;
            loop {
                tokio::time::sleep(period).await;
                let _ = renewer.call(&renewer.settle, &renew_cmd).await;
            }
        });
        Lease {
            renew,
            release: Some((store, release_cmd)),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.renew.abort();
        if let Some((store, cmd)) = self.release.take() {
            let runtime = store.runtime.clone();
            runtime.spawn(async move {
                let _ = store.call(&store.settle, &cmd).await;
            });
        }
    }
}
