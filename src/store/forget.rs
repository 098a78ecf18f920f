//! A shared limit's key emptied in Redis, for the admin listener's reset
//! (`POST /limits/NAME/reset?key=`): the key's state is deleted, so the
//! next decision finds no state and starts the key afresh, as a new key.
//!
//! The key is the decision's own (`<prefix><limit>:{<digest>}:<algorithm>
//! [:<plan>]`, one key per entry: every algorithm keeps its state in that
//! one key), so on Redis Cluster the `DEL` goes to the digest's slot like
//! any decision. This node's own memory of the key goes too: its unspent
//! token lease and the denials it remembers. Other nodes keep theirs until
//! they lapse (a lease within a second, a remembered denial within its
//! retry-after).

use super::{RedisStore, SharedEntry, Unavailable};

impl RedisStore {
    /// Deletes `entry`'s state in Redis, through the breaker like every
    /// call; [`Unavailable`] when Redis does not answer in time (then
    /// nothing was deleted, or the delete is unknown: a retry is safe).
    pub(crate) async fn forget(&self, entry: &SharedEntry<'_>) -> Result<(), Unavailable> {
        let key = self.key_of(entry);
        let mut cmd = redis::cmd("DEL");
        cmd.arg(&key);
        self.call(&self.stack, &cmd).await?;
        self.drop_lease(&key);
        self.forget_denials();
        Ok(())
    }
}
