//! The waiting line of a slot limit (`queue = { max_wait, size, fair_by }`).
//!
//! A request whose only refusals are slot limits with a queue does not get
//! a 429 at once: admission parks it here, holding nothing, until a slot of
//! its key is released or its `max_wait` passes, and then decides its whole
//! stack again (all or nothing, as on arrival). This module owns the line
//! itself: who waits, in which order they are woken, and when a newcomer is
//! turned away at once. It never decides a limit and never sleeps; the
//! waiting loop is `admission::wait`.
//!
//! # Order
//!
//! Waiters are kept in three classes, `critical`, `normal`, `sheddable`,
//! served in that order. Within a class each distinct `fair_by` value has
//! its own lane (first come first served within it) and the lanes take
//! turns: the lane just served goes to the back of the rotation. So a
//! client with fifty waiters and one with one are served alternately, not
//! fifty then one. Without `fair_by` every waiter shares one lane (FIFO).
//!
//! A release of a slot of key `K` wakes the first waiter in that order that
//! waits for `K` (with `key = "route"`, every waiter). The woken request
//! decides again; if another request took the slot first it goes back to
//! the front of its lane ([`SlotQueue::rejoin`]), keeping its turn. A
//! waiter that goes away after being woken passes the wake-up on, so a
//! released slot is never left unused while others wait.
//!
//! # Cost when nobody waits
//!
//! A release ([`SlotQueue::released`], from the permit's drop) reads one
//! atomic, the number of waiters, and returns when it is 0: the lock and
//! the lanes are touched only while someone waits.
//!
//! # Turning a newcomer away
//!
//! [`SlotQueue::join`] refuses at once when `size` requests already wait
//! ([`Shed::QueueFull`]) or when the recent pace of slots handed to waiters
//! says this one would not get one within `max_wait`
//! ([`Shed::WaitTooLong`]): the waiters ahead of it (its class and those
//! served before it), plus itself, times the mean interval between the last
//! [`GRANT_SAMPLES`] grants. Without recent grants there is no estimate and
//! the request waits (its `max_wait` still bounds it).
//!
//! Worked example: `size = 100`, `max_wait = 200ms`, waiters were granted
//! slots every 10 ms lately. A normal newcomer with 15 normal and critical
//! waiters ahead would wait about 160 ms: it joins. With 25 ahead (260 ms)
//! it is refused `wait_too_long`, while a critical newcomer with 3 critical
//! waiters ahead (40 ms) joins.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::priority::Priority;
use super::{NANOS_PER_SEC, Nanos};

/// Grants remembered for the pace estimate.
pub(crate) const GRANT_SAMPLES: usize = 16;

/// A limit's `queue`, as the limiter needs it (`fair_by` is admission's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueParams {
    /// The longest a request waits for a slot.
    pub max_wait: Nanos,
    /// The most requests waiting at once.
    pub size: usize,
}

/// Why a request was refused at a slot limit (the `reason` label of
/// `tollgate_shed_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shed {
    /// No slot (or only the reserve, for a sheddable request) and no queue.
    Full,
    /// `size` requests already wait.
    QueueFull,
    /// The recent pace of released slots says the wait would exceed
    /// `max_wait`.
    WaitTooLong,
    /// It waited `max_wait` without getting a slot.
    Timeout,
}

impl Shed {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Shed::Full => "full",
            Shed::QueueFull => "queue_full",
            Shed::WaitTooLong => "wait_too_long",
            Shed::Timeout => "timeout",
        }
    }
}

/// A waiter's state, in [`Waiter::state`].
const QUEUED: u8 = 0;
/// Taken out of the line by a release; not yet decided again.
const WOKEN: u8 = 1;
/// Out of the line for good.
const GONE: u8 = 2;

/// One parked request.
#[derive(Debug)]
pub(crate) struct Waiter {
    /// The slot's key it waits for (the limit key's low half).
    key: u64,
    priority: Priority,
    /// Its `fair_by` value's digest half (0: no `fair_by`, or absent).
    fair: u64,
    state: AtomicU8,
    /// Set by the release that wakes it.
    notify: Notify,
}

impl Waiter {
    /// Resolves when a release woke this waiter (at once if one already
    /// did since it last looked).
    pub(crate) async fn woken(&self) {
        self.notify.notified().await;
    }

    /// A release took it out of the line.
    pub(crate) fn was_woken(&self) -> bool {
        self.state.load(Ordering::Acquire) == WOKEN
    }
}

/// One priority's lanes, in rotation order.
#[derive(Debug, Default)]
struct Class {
    lanes: HashMap<u64, VecDeque<Arc<Waiter>>>,
    /// The lanes' `fair` values, next served first.
    turn: VecDeque<u64>,
    len: usize,
}

impl Class {
    fn push(&mut self, waiter: Arc<Waiter>, front: bool) {
        let fair = waiter.fair;
        let lane = self.lanes.entry(fair).or_insert_with(|| {
            self.turn.push_back(fair);
            VecDeque::new()
        });
        if front {
            lane.push_front(waiter);
        } else {
            lane.push_back(waiter);
        }
        self.len += 1;
    }

    /// The first waiter for `key`, in turn order, taken out; its lane goes
    /// to the back of the rotation.
    fn take(&mut self, key: u64) -> Option<Arc<Waiter>> {
        for (turn_at, fair) in self.turn.iter().enumerate() {
            let Some(lane) = self.lanes.get_mut(fair) else {
                continue;
            };
            let Some(at) = lane.iter().position(|w| w.key == key) else {
                continue;
            };
            let fair = *fair;
            let waiter = lane.remove(at)?;
            self.len -= 1;
            self.turn.remove(turn_at);
            if lane.is_empty() {
                self.lanes.remove(&fair);
            } else {
                self.turn.push_back(fair);
            }
            return Some(waiter);
        }
        None
    }

    /// Takes `waiter` out wherever it is; whether it was here.
    fn remove(&mut self, waiter: &Arc<Waiter>) -> bool {
        let Some(lane) = self.lanes.get_mut(&waiter.fair) else {
            return false;
        };
        let Some(at) = lane.iter().position(|w| Arc::ptr_eq(w, waiter)) else {
            return false;
        };
        lane.remove(at);
        self.len -= 1;
        if lane.is_empty() {
            self.lanes.remove(&waiter.fair);
            self.turn.retain(|f| *f != waiter.fair);
        }
        true
    }
}

/// The line behind the lock.
#[derive(Debug, Default)]
struct Line {
    /// By [`Priority::rank`].
    classes: [Class; 3],
    /// When waiters were last granted slots, oldest first.
    grants: VecDeque<Nanos>,
}

/// One slot limit's waiting line (see the module doc). Shared by the
/// limiter and the permits it hands out.
#[derive(Debug)]
pub struct SlotQueue {
    params: QueueParams,
    /// Waiters in the line now: what a release reads before anything else.
    waiting: AtomicUsize,
    /// Cold: locked only while someone waits or joins.
    line: Mutex<Line>,
}

impl SlotQueue {
    pub fn new(params: QueueParams) -> SlotQueue {
        SlotQueue {
            params,
            waiting: AtomicUsize::new(0),
            line: Mutex::new(Line::default()),
        }
    }

    pub(crate) fn params(&self) -> QueueParams {
        self.params
    }

    /// Requests waiting now (`tollgate_queue_depth`, explain).
    pub fn depth(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// A slot of `key` was released: wake the first waiter for it, if any.
    /// Costs one atomic load when nobody waits.
    #[inline]
    pub(crate) fn released(&self, key: u64) {
        if self.waiting.load(Ordering::SeqCst) != 0 {
            self.wake(key);
        }
    }

    #[cold]
    fn wake(&self, key: u64) {
        let mut line = self.line.lock();
        let taken = line.classes.iter_mut().find_map(|class| class.take(key));
        if let Some(waiter) = &taken {
            // Under the lock, so that `leave` sees either a queued waiter
            // or a woken one, never one half taken.
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            waiter.state.store(WOKEN, Ordering::Release);
        }
        drop(line);
        if let Some(waiter) = taken {
            waiter.notify.notify_one();
        }
    }

    /// A newcomer waiting for a slot of `key` at `now`: in the line, or
    /// refused at once (see the module doc).
    pub(crate) fn join(
        &self,
        key: u64,
        priority: Priority,
        fair: u64,
        now: Nanos,
    ) -> Result<Arc<Waiter>, Shed> {
        let mut line = self.line.lock();
        if self.waiting.load(Ordering::Acquire) >= self.params.size {
            return Err(Shed::QueueFull);
        }
        let ahead: usize = line.classes[..=priority.rank()].iter().map(|c| c.len).sum();
        if let Some(pace) = pace(&mut line.grants, now, self.params.max_wait) {
            let wait = pace.saturating_mul(ahead as u64 + 1);
            if wait > self.params.max_wait {
                return Err(Shed::WaitTooLong);
            }
        }
        let waiter = Arc::new(Waiter {
            key,
            priority,
            fair,
            state: AtomicU8::new(QUEUED),
            notify: Notify::new(),
        });
        line.classes[priority.rank()].push(Arc::clone(&waiter), false);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        Ok(waiter)
    }

    /// A woken waiter that lost its slot to another request: back in the
    /// line at the front of its lane (it keeps its turn). `size` is not
    /// checked again: it was counted when it joined.
    pub(crate) fn rejoin(&self, waiter: &Arc<Waiter>) {
        let mut line = self.line.lock();
        if waiter
            .state
            .compare_exchange(WOKEN, QUEUED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            line.classes[waiter.priority.rank()].push(Arc::clone(waiter), true);
            self.waiting.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// `waiter` is done waiting (admitted, refused, timed out or its client
    /// gone): out of the line. A wake-up it received goes to the next
    /// waiter for its key when `pass_on` (it did not take the slot).
    pub(crate) fn leave(&self, waiter: &Arc<Waiter>, pass_on: bool) {
        let mut line = self.line.lock();
        match waiter.state.swap(GONE, Ordering::AcqRel) {
            QUEUED if line.classes[waiter.priority.rank()].remove(waiter) => {
                self.waiting.fetch_sub(1, Ordering::SeqCst);
            }
            WOKEN if pass_on => {
                drop(line);
                self.released(waiter.key);
            }
            _ => {}
        }
    }

    /// A waiter got its slot at `now`: one sample of the pace.
    pub(crate) fn granted(&self, now: Nanos) {
        let mut line = self.line.lock();
        if line.grants.len() == GRANT_SAMPLES {
            line.grants.pop_front();
        }
        line.grants.push_back(now);
    }
}

/// The mean interval between recent grants, from samples no older than
/// `max(1 s, 4 × max_wait)`; `None` with fewer than two.
fn pace(grants: &mut VecDeque<Nanos>, now: Nanos, max_wait: Nanos) -> Option<Nanos> {
    let horizon = NANOS_PER_SEC.max(max_wait.saturating_mul(4));
    while grants
        .front()
        .is_some_and(|&t| now.saturating_sub(t) > horizon)
    {
        grants.pop_front();
    }
    let (&first, &last) = (grants.front()?, grants.back()?);
    let n = grants.len() as u64;
    (n >= 2).then(|| (last.saturating_sub(first) / (n - 1)).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const T0: Nanos = 1_700_000_000 * NANOS_PER_SEC;

    fn queue(size: usize) -> SlotQueue {
        SlotQueue::new(QueueParams {
            max_wait: 200 * MS,
            size,
        })
    }

    /// The order in which releases of `key` wake `waiters`.
    fn served(q: &SlotQueue, key: u64, waiters: &[Arc<Waiter>]) -> Vec<usize> {
        let mut order = Vec::new();
        for _ in 0..waiters.len() {
            q.released(key);
            let woken = (0..waiters.len()).find(|&i| waiters[i].was_woken() && !order.contains(&i));
            order.extend(woken);
        }
        order
    }

    #[test]
    fn critical_first_then_normal_then_sheddable() {
        let q = queue(10);
        let p = [
            Priority::Sheddable,
            Priority::Normal,
            Priority::Critical,
            Priority::Normal,
            Priority::Critical,
        ];
        let waiters: Vec<_> = p
            .iter()
            .map(|&p| q.join(7, p, 0, T0).expect("joins"))
            .collect();
        assert_eq!(q.depth(), 5);
        assert_eq!(served(&q, 7, &waiters), vec![2, 4, 1, 3, 0]);
        assert_eq!(q.depth(), 0);
        // Nobody left: a release is a load and nothing else.
        q.released(7);
    }

    #[test]
    fn fair_lanes_take_turns_within_a_priority() {
        let q = queue(100);
        // Client A (fair 1) queues five, then B (fair 2) two, then C one.
        let mut waiters = Vec::new();
        for fair in [1, 1, 1, 1, 1, 2, 2, 3] {
            waiters.push(q.join(7, Priority::Normal, fair, T0).expect("joins"));
        }
        let fairs: Vec<u64> = served(&q, 7, &waiters)
            .into_iter()
            .map(|i| waiters[i].fair)
            .collect();
        assert_eq!(fairs, vec![1, 2, 3, 1, 2, 1, 1, 1]);
    }

    #[test]
    fn a_release_wakes_only_waiters_for_its_key() {
        let q = queue(10);
        let a = q.join(1, Priority::Normal, 0, T0).expect("joins");
        let b = q.join(2, Priority::Normal, 0, T0).expect("joins");
        q.released(2);
        assert!(!a.was_woken() && b.was_woken());
        q.released(3);
        assert!(!a.was_woken());
        assert_eq!(q.depth(), 1);
    }

    #[test]
    fn size_bounds_the_line() {
        let q = queue(2);
        let a = q.join(1, Priority::Normal, 0, T0).expect("joins");
        let _b = q.join(1, Priority::Normal, 0, T0).expect("joins");
        assert_eq!(
            q.join(1, Priority::Critical, 0, T0).err(),
            Some(Shed::QueueFull)
        );
        q.leave(&a, true);
        assert_eq!(q.depth(), 1);
        assert!(q.join(1, Priority::Critical, 0, T0).is_ok());
    }

    #[test]
    fn the_pace_of_grants_turns_away_a_wait_too_long() {
        let q = queue(100);
        // A grant every 10 ms lately.
        for i in 0..10 {
            q.granted(T0 + i * 10 * MS);
        }
        let now = T0 + 100 * MS;
        let mut held = Vec::new();
        for _ in 0..19 {
            held.push(q.join(1, Priority::Normal, 0, now).expect("joins"));
        }
        // 19 ahead + itself = 200 ms: still within max_wait.
        held.push(q.join(1, Priority::Normal, 0, now).expect("joins"));
        assert_eq!(
            q.join(1, Priority::Normal, 0, now).err(),
            Some(Shed::WaitTooLong)
        );
        assert_eq!(
            q.join(1, Priority::Sheddable, 0, now).err(),
            Some(Shed::WaitTooLong)
        );
        // Critical has nobody ahead.
        assert!(q.join(1, Priority::Critical, 0, now).is_ok());
        // Old samples are forgotten: no estimate, it waits.
        let later = now + 10 * NANOS_PER_SEC;
        assert!(q.join(1, Priority::Normal, 0, later).is_ok());
    }

    #[test]
    fn a_woken_waiter_rejoins_at_the_front_or_passes_its_wake_on() {
        let q = queue(10);
        let a = q.join(1, Priority::Normal, 0, T0).expect("joins");
        let b = q.join(1, Priority::Normal, 0, T0).expect("joins");
        q.released(1);
        assert!(a.was_woken());
        // It lost the race for the slot: back in front of b.
        q.rejoin(&a);
        assert!(!a.was_woken());
        q.released(1);
        assert!(a.was_woken() && !b.was_woken());
        // Woken, then gone before deciding: the wake-up goes to b.
        q.leave(&a, true);
        assert!(b.was_woken());
        assert_eq!(q.depth(), 0);
        // Leaving twice, or after a wake was used, changes nothing.
        let c = q.join(1, Priority::Normal, 0, T0).expect("joins");
        q.leave(&a, true);
        q.leave(&b, false);
        assert!(!c.was_woken());
        assert_eq!(q.depth(), 1);
    }

    #[test]
    fn a_waiter_that_leaves_frees_its_place() {
        let q = queue(10);
        let a = q.join(1, Priority::Normal, 5, T0).expect("joins");
        let b = q.join(1, Priority::Normal, 6, T0).expect("joins");
        q.leave(&a, true);
        assert_eq!(q.depth(), 1);
        q.released(1);
        assert!(b.was_woken() && !a.was_woken());
    }

    #[tokio::test]
    async fn thousands_wait_parked_and_each_release_wakes_one() {
        let q = Arc::new(queue(5_000));
        let tasks: Vec<_> = (0..2_000u64)
            .map(|i| {
                let waiter = q.join(1, Priority::Normal, i % 7, T0).expect("joins");
                tokio::spawn(async move { waiter.woken().await })
            })
            .collect();
        assert_eq!(q.depth(), 2_000);
        for _ in 0..2_000 {
            q.released(1);
        }
        assert_eq!(q.depth(), 0);
        for task in tasks {
            task.await.expect("woken once");
        }
    }
}
