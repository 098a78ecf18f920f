//! A request's shared entries decided: [`RedisStore::decide`], the store's
//! one entry point for a decision, and its steps in the order it runs them.
//!
//! 1. Leased token buckets spend this node's tokens, without a call
//!    (`token_lease`; only a stack with a leased bucket goes there).
//! 2. A denial this thread remembers answers without a call
//!    (`remembered`; only with `remember_denials`).
//! 3. The rest in one `stack.lua` call, or on Redis Cluster one per slot
//!    in stack order, a later slot's denial refunding the earlier ones
//!    (`cluster`); each call goes through the thread's batcher (`batch`).
//! 4. A call's answer read into verdicts and the units each entry took
//!    ([`RedisStore::decide_group`]), and the concurrency slots it took
//!    held (`concurrency`).
//!
//! Whatever a step spent is given back inside `decide` when the stack is
//! denied, so the caller gets verdicts as they stand and nothing to undo.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::cluster::Charged;
use super::probe::Probe;
use super::script::{Verdicts, parse_verdicts};
use super::{
    Lease, OwnedEntry, RedisStore, SharedDecision, SharedEntry, Unavailable, remembered, slot_of,
};
use crate::limit::Algorithm;

impl RedisStore {
    /// Decides `entries`, a request's shared limits in stack order, all or
    /// nothing: each charged its `cost` when all admit (shadow limits
    /// aside), none when one denies. On Redis Cluster, one call per hash
    /// slot in stack order: a slot that denies ends the decision and the
    /// slots before it are refunded before the answer (see docs/src/guides/distributed.md,
    /// "Redis Cluster", for what that can cost).
    ///
    /// A leased token bucket spends this node's tokens first, without a
    /// call. With `remember_denials`, an entry this thread remembers as
    /// denied denies without a call (the others are not decided: `None`,
    /// as after an earlier slot's denial), and the call's denials are
    /// remembered.
    pub(crate) async fn decide(
        self: &Arc<Self>,
        entries: &[SharedEntry<'_>],
    ) -> Result<SharedDecision, Unavailable> {
        if entries.iter().all(|e| e.lease == 0) {
            return Ok(self.decide_remote(entries).await?.decision);
        }
        self.decide_leasing(entries).await
    }

    /// [`RedisStore::decide`] of entries no leased tokens answer: a
    /// remembered denial, else Redis.
    pub(super) async fn decide_remote(
        self: &Arc<Self>,
        entries: &[SharedEntry<'_>],
    ) -> Result<Charged, Unavailable> {
        let most = self.config.remember_denials;
        if most.is_zero() || !entries.iter().any(|e| e.remember) {
            return self.decide_slots(entries).await;
        }
        let epoch = self.epoch.load(Ordering::Relaxed);
        if let Some((i, verdict)) = remembered::recall(epoch, entries) {
            (self.signals.remembered)();
            let mut verdicts = smallvec::smallvec![None; entries.len()];
            verdicts[i] = Some(verdict);
            return Ok(Charged {
                decision: SharedDecision {
                    verdicts,
                    leases: Vec::new(),
                },
                taken: smallvec::smallvec![0; entries.len()],
            });
        }
        let asked = std::time::Instant::now();
        let charged = self.decide_slots(entries).await?;
        remembered::remember(epoch, entries, &charged.decision.verdicts, asked, most);
        Ok(charged)
    }

    /// One script call for entries that share a slot (all of them on one
    /// Redis).
    pub(super) async fn decide_group(
        self: &Arc<Self>,
        entries: &[SharedEntry<'_>],
    ) -> Result<(Verdicts, Option<Lease>), Unavailable> {
        let member = entries
            .iter()
            .any(|e| matches!(e.algorithm, Algorithm::Concurrency { .. }))
            .then(|| {
                let n = self.sequence.fetch_add(1, Ordering::Relaxed);
                format!("{}:{n}", self.node)
            });
        let args = self.args(
            entries,
            |i| i64::try_from(entries[i].cost).unwrap_or(i64::MAX),
            member.as_deref(),
        );
        // On Cluster, batched with the thread's other decisions of the
        // group's slot (a group's keys share one).
        let slot = match self.config.is_cluster() {
            true if args.keys() > 0 => slot_of(args.key(0)),
            _ => 0,
        };
        let limits = entries.iter().map(|e| e.limit);
        let answer = Probe::note("EVALSHA", limits, self.batched(args, slot)).await?;
        let verdicts =
            parse_verdicts(&answer, entries.iter().map(|e| e.cost)).ok_or_else(|| {
                tracing::warn!("unexpected answer from the redis stack script");
                self.failed();
                Unavailable
            })?;
        let admitted = entries
            .iter()
            .zip(&verdicts)
            .all(|(e, (v, _))| v.allowed || e.shadow);
        let lease = match member {
            Some(member) if admitted => {
                let held: Vec<OwnedEntry> = entries
                    .iter()
                    .zip(&verdicts)
                    .filter(|(e, (v, _))| {
                        matches!(e.algorithm, Algorithm::Concurrency { .. }) && v.allowed
                    })
                    .map(|(e, _)| OwnedEntry::from(e))
                    .collect();
                // A concurrency slot is charged in requests: each entry's
                // cost is the request's.
                let cost = entries
                    .iter()
                    .find(|e| matches!(e.algorithm, Algorithm::Concurrency { .. }))
                    .map_or(1, |e| e.cost);
                (!held.is_empty()).then(|| Lease::hold(self.clone(), held, member, cost))
            }
            _ => None,
        };
        Ok((verdicts, lease))
    }
}
