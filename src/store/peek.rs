//! A read-only look at one shared limit's state in Redis, for the explain
//! endpoint (`admission::explain`): what the key has left and when more
//! comes back, as every node sees it, charging nothing.
//!
//! The look is `stack.lua` deciding a cost of 0 for the entry. A decision
//! writes a key only when it charges it, and it charges only a cost above
//! 0 (its fast path and its general loop both test `cost > 0` before
//! keeping a state; a concurrency slot adds a lease member only for a cost
//! above 0), so the call reads the key (`MGET`, `ZRANGE`) and writes
//! nothing: no window opened (not even a `first_request` one), no expiry
//! moved, no lease taken. And the numbers are the ones a request's decision
//! computes, by the same arithmetic on the same Redis `TIME`, rather than a
//! second reading of the key layout that could drift from it. The key is
//! the decision's own (`<prefix><limit>:{<digest>}:<algorithm>[:<plan>]`),
//! so on Redis Cluster the call goes to the digest's slot like any other.
//!
//! The call is not batched (explain is rare) but goes through the breaker
//! like every other: while the breaker is open it fails at once, and a
//! failed look counts as a failed call.

use redis::Value;

use super::script::{batch_cmd, parse_verdicts, take_answer};
use super::{RedisStore, SharedEntry, Unavailable};
use crate::limit::Verdict;

impl RedisStore {
    /// `entry`'s state in Redis as it stands (its `cost` and `lease` are
    /// ignored: nothing is charged), or [`Unavailable`] when Redis does not
    /// answer in time, the breaker is open, or the answer is not one entry's.
    pub(crate) async fn peek(&self, entry: &SharedEntry<'_>) -> Result<Verdict, Unavailable> {
        let entry = SharedEntry {
            cost: 0,
            lease: 0,
            ..*entry
        };
        let args = self.args(std::slice::from_ref(&entry), |_| 0, None);
        let cmd = batch_cmd(self.stack.get_hash(), std::iter::once(&args));
        let answer = self.call(&self.stack, &cmd).await?;
        let Value::Array(items) = answer else {
            return Err(Unavailable);
        };
        let mut items = items.iter();
        let answer = take_answer(&mut items, 1).filter(|_| items.next().is_none());
        let verdicts = answer.and_then(|answer| parse_verdicts(&answer, std::iter::once(0)));
        match verdicts.as_deref() {
            Some([(verdict, _)]) => Ok(*verdict),
            _ => Err(Unavailable),
        }
    }
}
