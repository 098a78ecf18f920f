//! One connection per worker thread, and the decisions batched on it.
//!
//! One multiplexed connection per worker thread (with `cluster = true`, the
//! cluster client's, one per node), made lazily on the worker's own runtime
//! so that its driver runs beside the requests that use it, and no other
//! thread is woken for a call. A worker keeps at most [`MAX_IN_FLIGHT`]
//! decision calls in flight (per Cluster slot): a decision that finds fewer
//! (and none waiting) is sent at once, alone, from its own task; decisions
//! that arrive meanwhile queue (`ThreadState`) and go together, up to
//! [`MAX_BATCH`], as one `EVALSHA` from a sender task when a call returns
//! (`stack.lua` decides them one after the other, each all or nothing).
//! Under load one script run and one reply serve many requests; idle,
//! nothing waits. Other calls (settlements, lease renewals) are pipelined on
//! the same connection. A connection belongs to a generation, bumped each
//! time the breaker closes: after an outage every thread connects afresh.
//!
//! A decision's wait in a batch is bounded by `timeout` from the moment it
//! queues; a failed batch is one failure per decision in it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use redis::{Cmd, Value};
use smallvec::SmallVec;

use super::connect::Connection;
use super::script::{Answer, Args, batch_cmd, take_answer};
use super::{RedisStore, Unavailable};

thread_local! {
    /// Per thread: (store address, generation, connection and batcher).
    static THREAD_STATE: std::cell::RefCell<Option<(usize, u64, Arc<ThreadState>)>> =
        const { std::cell::RefCell::new(None) };
}

/// Most decisions one script call carries: bounds the call's size and how
/// long Redis runs it.
pub(crate) const MAX_BATCH: usize = 64;

/// Decision calls a worker keeps in flight at most, per Cluster slot (on
/// one Redis, in all). Two, not one: while one call's reply waits for the
/// worker to be scheduled, the next batch is already on its way, so
/// requests do not wait a whole round trip idle (measured: more req/s at
/// a few more calls per request).
pub(crate) const MAX_IN_FLIGHT: usize = 2;

/// One thread's connection (made on first use) and the decisions waiting
/// for it.
#[derive(Default)]
pub(super) struct ThreadState {
    connection: tokio::sync::OnceCell<Connection>,
    /// Per thread, so never contended by another worker.
    queues: parking_lot::Mutex<Queues>,
}

/// A thread's decisions waiting, one queue per Redis Cluster slot with
/// decisions waiting or in flight (a call's keys must share a slot); on
/// one Redis, one queue. Few at a time: a linear search.
#[derive(Default)]
struct Queues(SmallVec<[(u16, Queue); 1]>);

impl Queues {
    /// The queue of `slot`, made when there is none.
    fn of(&mut self, slot: u16) -> &mut Queue {
        let at = match self.0.iter().position(|(s, _)| *s == slot) {
            Some(at) => at,
            None => {
                self.0.push((slot, Queue::default()));
                self.0.len() - 1
            }
        };
        &mut self.0[at].1
    }

    /// Forgets the queue of `slot`: nothing waits and nothing is in flight.
    fn remove(&mut self, slot: u16) {
        if let Some(at) = self.0.iter().position(|(s, _)| *s == slot) {
            self.0.swap_remove(at);
        }
    }
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Pending>,
    /// Tasks sending batches, at most [`MAX_IN_FLIGHT`]: at the cap, a
    /// decision that arrives waits for a call in flight to return, then
    /// goes in the next batch.
    senders: usize,
}

/// A decision waiting to be sent.
struct Pending {
    args: Args,
    reply: tokio::sync::oneshot::Sender<Result<Answer, Unavailable>>,
}

impl RedisStore {
    /// `cmd` on `state`'s connection, bounded by `timeout`; re-loads the
    /// script on `NOSCRIPT`. The caller counts the failure.
    pub(super) async fn query(
        &self,
        state: &ThreadState,
        script: &redis::Script,
        cmd: &Cmd,
    ) -> Result<Value, Unavailable> {
        let result = tokio::time::timeout(self.config.timeout, async {
            let mut connection = state
                .connection
                .get_or_try_init(|| self.open())
                .await?
                .clone();
            let mut answer = connection.query(cmd).await;
            // NOSCRIPT: load and retry; a second flush may land between the
            // two (a test does that), so a few times, all within `timeout`.
            for _ in 0..3 {
                match &answer {
                    Err(e)
                        if e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                    {
                        connection.load(script).await?;
                        answer = connection.query(cmd).await;
                    }
                    _ => break,
                }
            }
            answer
        })
        .await;
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => {
                tracing::debug!(%error, "redis store call failed");
                Err(Unavailable)
            }
            Err(_) => {
                tracing::debug!(timeout = ?self.config.timeout, "redis store call timed out");
                Err(Unavailable)
            }
        }
    }

    /// One decision through this thread's batcher: sent at once when
    /// fewer than [`MAX_IN_FLIGHT`] calls for its `slot` are in flight on
    /// the thread's connection, else with every other decision of that
    /// slot that arrives meanwhile in the next call. Waits at most
    /// `timeout` in all; a failed batch fails each of its decisions, and
    /// each counts for the breaker as its own call would have.
    ///
    /// A decision that finds nothing waiting and a call free is sent from
    /// its own task: no sender task to start and no answer to pass on, two
    /// trips fewer through the worker's run queue, which a busy worker
    /// (a flood) makes long.
    pub(super) async fn batched(
        self: &Arc<Self>,
        args: Args,
        slot: u16,
    ) -> Result<Answer, Unavailable> {
        if self.is_down() {
            return Err(Unavailable);
        }
        let state = self.thread_state();
        let alone = {
            let mut queues = state.queues.lock();
            let queue = queues.of(slot);
            let alone = queue.waiting.is_empty() && queue.senders < MAX_IN_FLIGHT;
            queue.senders += usize::from(alone);
            alone
        };
        if alone {
            let _sending = Sending {
                store: self,
                state: &state,
                slot,
            };
            return match self.call_batch(&state, std::iter::once(&args)).await {
                Some(mut answers) => Ok(answers.swap_remove(0)),
                None => {
                    self.failed();
                    Err(Unavailable)
                }
            };
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let start = {
            let mut queues = state.queues.lock();
            let queue = queues.of(slot);
            queue.waiting.push(Pending { args, reply });
            let start = queue.senders < MAX_IN_FLIGHT;
            queue.senders += usize::from(start);
            start
        };
        if start {
            tokio::spawn(send_batches(self.clone(), state, slot));
        }
        match tokio::time::timeout(self.config.timeout, answer).await {
            Ok(Ok(Ok(answer))) => Ok(answer),
            Ok(_) => {
                self.failed();
                Err(Unavailable)
            }
            Err(_) => {
                tracing::debug!(timeout = ?self.config.timeout, "redis store call timed out");
                self.failed();
                Err(Unavailable)
            }
        }
    }

    /// `batch` as one `stack.lua` call, each decision's answer sent back.
    async fn send_batch(&self, state: &ThreadState, batch: &mut Vec<Pending>) {
        match self.call_batch(state, batch.iter().map(|p| &p.args)).await {
            Some(answers) => {
                for (pending, answer) in batch.drain(..).zip(answers) {
                    // A caller that gave up (timeout, client gone) is not told.
                    let _ = pending.reply.send(Ok(answer));
                }
            }
            None => {
                for pending in batch.drain(..) {
                    let _ = pending.reply.send(Err(Unavailable));
                }
            }
        }
    }

    /// One `stack.lua` call for `batch`, each decision's answer in order;
    /// `None` when the call failed or its answer does not split exactly
    /// into the decisions' entries (2 or 4 integers each, see `stack.lua`).
    async fn call_batch<'a>(
        &self,
        state: &ThreadState,
        batch: impl Iterator<Item = &'a Args> + Clone,
    ) -> Option<Vec<Answer>> {
        if self.is_down() {
            return None;
        }
        let cmd = batch_cmd(self.stack.get_hash(), batch.clone());
        let answer = self.query(state, &self.stack, &cmd).await.ok()?;
        let answers: Option<Vec<Answer>> = match &answer {
            Value::Array(items) => {
                let mut items = items.iter();
                let answers: Option<Vec<Answer>> = batch
                    .map(|args| take_answer(&mut items, args.keys()))
                    .collect();
                answers.filter(|_| items.next().is_none())
            }
            _ => None,
        };
        match answers {
            Some(_) => self.failures.store(0, Ordering::Relaxed),
            None => tracing::warn!("unexpected answer from the redis stack script"),
        }
        answers
    }

    /// This thread's connection and batcher, of the current generation.
    /// The connection is made on first use on this thread's runtime: its
    /// driver then runs beside the requests that use it, and a call costs
    /// no wake-up of another thread. All requests of the thread share it:
    /// a decision goes through the batcher, other calls are pipelined.
    pub(super) fn thread_state(&self) -> Arc<ThreadState> {
        let id = self as *const RedisStore as usize;
        let generation = self.generation.load(Ordering::Acquire);
        THREAD_STATE.with(|held| {
            let mut held = held.borrow_mut();
            match &*held {
                Some((i, g, state)) if *i == id && *g == generation => state.clone(),
                // The probe that closed the breaker loaded the scripts
                // (NOSCRIPT reloads them otherwise): a plain connection
                // will do.
                _ => {
                    let state = Arc::new(ThreadState::default());
                    *held = Some((id, generation, state.clone()));
                    state
                }
            }
        })
    }
}

/// Sends the decisions queued on `state` for `slot`, [`MAX_BATCH`] at a
/// time, one call in flight per sender, until none is left; the next
/// decision then starts a new sender.
async fn send_batches(store: Arc<RedisStore>, state: Arc<ThreadState>, slot: u16) {
    let mut batch: Vec<Pending> = Vec::new();
    loop {
        {
            let mut queues = state.queues.lock();
            let queue = queues.of(slot);
            // Callers that gave up are not decided: they were told
            // `Unavailable`, and a charge for them would be lost.
            queue.waiting.retain(|p| !p.reply.is_closed());
            if queue.waiting.is_empty() {
                queue.senders -= 1;
                if queue.senders == 0 {
                    queues.remove(slot);
                }
                return;
            }
            std::mem::swap(&mut queue.waiting, &mut batch);
            if batch.len() > MAX_BATCH {
                queue.waiting.extend(batch.drain(MAX_BATCH..));
            }
        }
        store.send_batch(&state, &mut batch).await;
    }
}

/// A call sent from a decision's own task ([`RedisStore::batched`]) holds
/// one of its slot's [`MAX_IN_FLIGHT`] calls; when it ends — answered, or
/// the request gone mid-call — the decisions that queued behind it go on in
/// a sender task, as behind any other call.
struct Sending<'a> {
    store: &'a Arc<RedisStore>,
    state: &'a Arc<ThreadState>,
    slot: u16,
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        let mut queues = self.state.queues.lock();
        let queue = queues.of(self.slot);
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            // The sender takes this call's place among those in flight.
            Ok(runtime) if !queue.waiting.is_empty() => {
                drop(queues);
                runtime.spawn(send_batches(
                    self.store.clone(),
                    self.state.clone(),
                    self.slot,
                ));
            }
            // Nothing waits, or the runtime is gone (nothing will run).
            _ => {
                queue.senders -= 1;
                if queue.senders == 0 && queue.waiting.is_empty() {
                    queues.remove(self.slot);
                }
            }
        }
    }
}
