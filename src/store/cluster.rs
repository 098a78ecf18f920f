//! Redis Cluster: a key's slot, and a decision split by slot.
//!
//! A stack's entries are grouped by slot ([`slot_of`]); each group is one
//! decision, in stack order, batched with the thread's other decisions of
//! that slot (a batcher per slot, each as on one Redis). A group that
//! denies ends the decision: the groups before it are refunded with
//! `settle.lua` before the answer (docs/src/guides/distributed.md states the
//! exactness this gives), and their entries' verdicts show the refunded state, as one
//! Redis shows an admitting entry of a denied stack. On one Redis, the
//! whole stack is one group.

use std::sync::Arc;

use smallvec::SmallVec;

use super::{RedisStore, SharedDecision, SharedEntry, Unavailable};
use crate::limit::{Algorithm, Verdict, token_bucket};

/// A decision made in Redis, with the units each entry took: more than its
/// cost for a bucket that took a lease (the rest is the node's to spend).
pub(super) struct Charged {
    pub(super) decision: SharedDecision,
    pub(super) taken: SmallVec<[u64; 4]>,
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the
/// part inside the first `{…}`, when not empty) or of the whole key, mod
/// 16384.
pub(crate) fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    let mut crc: u16 = 0;
    for &byte in tagged.unwrap_or(bytes) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

impl RedisStore {
    /// The decision of `entries` in Redis: one call on one Redis; on
    /// Cluster, one per slot in stack order, a slot that denies ending the
    /// decision. The slots before it are refunded before the answer, and
    /// their entries show their state after the refund ([`uncharged`]), as
    /// one call answers an admitting entry of a stack it denies.
    pub(super) async fn decide_slots(
        self: &Arc<Self>,
        entries: &[SharedEntry<'_>],
    ) -> Result<Charged, Unavailable> {
        let mut charged = Charged {
            decision: SharedDecision {
                verdicts: smallvec::smallvec![None; entries.len()],
                leases: Vec::new(),
            },
            taken: smallvec::smallvec![0; entries.len()],
        };
        let decision = &mut charged.decision;
        if !self.config.is_cluster() {
            let (verdicts, lease) = self.decide_group(entries).await?;
            for (i, (verdict, taken)) in verdicts.into_iter().enumerate() {
                decision.verdicts[i] = Some(verdict);
                charged.taken[i] = taken;
            }
            decision.leases.extend(lease);
            return Ok(charged);
        }
        // Group by slot, groups in the order of their first entry.
        let slots: Vec<u16> = entries.iter().map(|e| slot_of(&self.key_of(e))).collect();
        let mut order: Vec<u16> = Vec::new();
        for slot in &slots {
            if !order.contains(slot) {
                order.push(*slot);
            }
        }
        // The entries the slots so far charged, with the units each took.
        let mut spent: Vec<(usize, u64)> = Vec::new();
        let refund = |spent: &[(usize, u64)]| -> Vec<(SharedEntry<'_>, u64)> {
            spent
                .iter()
                .map(|&(i, taken)| (entries[i], taken))
                .collect()
        };
        for slot in order {
            let at: Vec<usize> = (0..entries.len()).filter(|&i| slots[i] == slot).collect();
            let group: Vec<SharedEntry<'_>> = at.iter().map(|&i| entries[i]).collect();
            let (verdicts, lease) = match self.decide_group(&group).await {
                Ok(answer) => answer,
                Err(error) => {
                    drop(charged);
                    self.refund(&refund(&spent)).await;
                    return Err(error);
                }
            };
            let admitted = group
                .iter()
                .zip(&verdicts)
                .all(|(e, (v, _))| v.allowed || e.shadow);
            for (&i, (verdict, taken)) in at.iter().zip(&verdicts) {
                decision.verdicts[i] = Some(*verdict);
                charged.taken[i] = *taken;
            }
            if !admitted {
                // This slot charged nothing; undo the slots before it.
                decision.leases.clear();
                charged.taken.iter_mut().for_each(|t| *t = 0);
                self.refund(&refund(&spent)).await;
                for &(i, taken) in &spent {
                    decision.verdicts[i] =
                        decision.verdicts[i].map(|v| uncharged(v, entries[i].algorithm, taken));
                }
                return Ok(charged);
            }
            decision.leases.extend(lease);
            spent.extend(
                at.iter()
                    .zip(&verdicts)
                    .filter(|(_, (v, _))| v.allowed)
                    .map(|(&i, (_, taken))| (i, *taken)),
            );
        }
        Ok(charged)
    }

    /// Gives back what every entry took (concurrency leases are
    /// released by dropping them). Awaited, so that a denied request's
    /// refunds are in before its answer.
    pub(super) async fn refund(&self, charged: &[(SharedEntry<'_>, u64)]) {
        let refundable: Vec<(SharedEntry<'_>, u64)> = charged
            .iter()
            .filter(|(e, _)| !matches!(e.algorithm, Algorithm::Concurrency { .. }))
            .copied()
            .collect();
        let entries: Vec<SharedEntry<'_>> = refundable.iter().map(|(e, _)| *e).collect();
        for group in self.by_slot(&entries) {
            // The units each entry took (a lease's included).
            let amounts: Vec<i64> = group
                .iter()
                .map(|g| {
                    let taken = refundable
                        .iter()
                        .find(|(e, _)| self.key_of(e) == self.key_of(g))
                        .map_or(0, |(_, t)| *t);
                    -i64::try_from(taken).unwrap_or(i64::MAX)
                })
                .collect();
            let cmd = self.script_cmd(&self.settle, &group, |i| amounts[i], None);
            let _ = self.call(&self.settle, &cmd).await;
        }
    }

    /// `entries` in groups whose keys share a slot: one group on one Redis.
    pub(super) fn by_slot<'e>(&self, entries: &[SharedEntry<'e>]) -> Vec<Vec<SharedEntry<'e>>> {
        self.group_by_slot(entries, |e| e)
    }

    /// [`RedisStore::by_slot`] for items that each carry an entry (`entry`
    /// finds it): an entry with what goes with it, such as its own delta.
    pub(super) fn group_by_slot<T: Copy>(
        &self,
        items: &[T],
        entry: impl Fn(&T) -> &SharedEntry<'_>,
    ) -> Vec<Vec<T>> {
        if !self.config.is_cluster() {
            return vec![items.to_vec()];
        }
        let mut groups: Vec<(u16, Vec<T>)> = Vec::new();
        for item in items {
            let slot = slot_of(&self.key_of(entry(item)));
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(*item),
                None => groups.push((slot, vec![*item])),
            }
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }
}

/// `verdict`, of an entry that took `taken` units since refunded, as it
/// stands after the refund: what `stack.lua` answers for an admitting
/// entry of a stack it denies (its `decide` at cost 0), without asking
/// Redis again. `r` has the units back, up to the quota as the script
/// counts it (a leaky bucket's capacity + 1). `t` is 0 once nothing is
/// counted (a window without a charge, a full bucket); otherwise it
/// stands: a bucket's next unit comes as soon, a fixed window ends when it
/// did, a log's oldest charge is not this one. Only a sliding window's `t`
/// can differ, when its next unit frees in the next window (that depends
/// on this window's count, which the answer does not give): it is then the
/// charged one's, less than a window off.
///
/// A token bucket's held request (`wait`: its verdict's `delay` is how far
/// the bucket ran past full) is worked out again from that debt less the
/// refund, since `r` was 0 however deep the debt.
fn uncharged(verdict: Verdict, algorithm: Algorithm, taken: u64) -> Verdict {
    if let Algorithm::TokenBucket {
        capacity, refill, ..
    } = algorithm
        && verdict.delay > 0
    {
        // Scaled as token_bucket keeps time (ns × tokens), from `now` = 0.
        let (per, tokens) = (
            u128::from(refill.per.max(1)),
            u128::from(refill.tokens.max(1)),
        );
        let ahead = (u128::from(capacity) * per + u128::from(verdict.delay) * tokens)
            .saturating_sub(u128::from(taken) * per);
        let state = token_bucket::State::at(ahead);
        let (_, v) = token_bucket::decide(state, 0, 0, capacity, refill);
        return Verdict::allow(v.remaining, v.reset_after);
    }
    let full = crate::limit::verdict::quota(&algorithm);
    let remaining = verdict.remaining.saturating_add(taken).min(full);
    Verdict {
        remaining,
        reset_after: if remaining >= full {
            0
        } else {
            verdict.reset_after
        },
        delay: 0,
        ..verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster_keyslot() {
        // `CLUSTER KEYSLOT foo` is 12182; a hash tag takes only its content.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("tollgate:a:{foo}:fw"), 12182);
        assert_eq!(slot_of("tollgate:b:{foo}:tb:pro"), 12182);
        // An empty tag does not count: the whole key is hashed.
        assert_ne!(slot_of("{}foo"), slot_of("{}bar"));
    }

    #[test]
    fn a_refunded_entry_shows_its_units_back() {
        let window = Algorithm::FixedWindow {
            limit: 5,
            window: 60_000_000_000,
        };
        // 2 of 5 charged with this request: 3 left, then 4 once refunded.
        let charged = Verdict::allow(3, 40_000_000_000);
        assert_eq!(
            uncharged(charged, window, 1),
            Verdict::allow(4, 40_000_000_000)
        );
        // Its only charge: the window is empty again, with no `t`.
        assert_eq!(
            uncharged(Verdict::allow(4, 40_000_000_000), window, 1),
            Verdict::allow(5, 0)
        );
        // A leased bucket gives back its whole lease, at most full (a
        // leaky bucket's burst is capacity + 1); the delay goes.
        let bucket = Algorithm::LeakyBucket {
            capacity: 3,
            rate: crate::limit::Rate {
                tokens: 1,
                per: 1_000_000_000,
            },
            mode: crate::limit::LeakyMode::Delay,
        };
        let delayed = Verdict {
            delay: 500_000_000,
            ..Verdict::allow(0, 1_000_000_000)
        };
        assert_eq!(
            uncharged(delayed, bucket, 2),
            Verdict::allow(2, 1_000_000_000)
        );
        assert_eq!(uncharged(delayed, bucket, 9), Verdict::allow(4, 0));
        assert_eq!(
            uncharged(Verdict::allow(1, 0), Algorithm::Concurrency { max: 3 }, 1),
            Verdict::allow(2, 0)
        );
        // A held request of a token bucket with `wait` (2 tokens, 1/s):
        // the bucket was 1.5 s past full after its charge of 1; refunded, it
        // still owes 0.5 s: r 0, the next token in 1.5 s. Refunded 3 (a
        // cost of 3 held 1.5 s), it has 1 token and the next in 0.5 s.
        let waiting = Algorithm::TokenBucket {
            capacity: 2,
            refill: crate::limit::Rate {
                tokens: 1,
                per: 1_000_000_000,
            },
            wait: 2_000_000_000,
        };
        let held = Verdict {
            delay: 1_500_000_000,
            ..Verdict::allow(0, 2_500_000_000)
        };
        assert_eq!(
            uncharged(held, waiting, 1),
            Verdict::allow(0, 1_500_000_000)
        );
        assert_eq!(uncharged(held, waiting, 3), Verdict::allow(1, 500_000_000));
    }
}
