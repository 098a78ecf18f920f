//! How long a denied connection steps aside before its next request: three
//! passes through the worker's ready tasks (see `serve`'s doc), and the
//! worker's keeper that counts the passes for every connection stepping
//! aside.
//!
//! A pass ends when the worker has run the tasks that were ready and looked
//! for new I/O (tokio's `yield_now` defers a task until its driver was
//! polled): a connection that waits a pass lets the connections whose
//! requests arrived meanwhile go first. Each connection yielding once a pass
//! for itself, and timing its passes (more of them while a pass took 30 µs
//! or more), cost a denial three polls of its task and four clock reads more
//! than a request (~1,700 instructions). Here one task per worker, the
//! keeper, yields once a pass while any connection waits and wakes the
//! connections whose passes are done:
//! a connection stepping aside joins the keeper's line and is polled again
//! once, when the keeper wakes it (woken from the keeper's poll, it goes to
//! the back of the run queue, where its own deferred wake-up would have put
//! it). With the passes that cheap, a connection waits all three whether
//! or not the worker is busy: let go at once after a short pass, as the
//! timed passes did, every connection waiting was let go together, and the
//! flooded p99 of `bench/flood.sh` was worse in 4 of 4 rounds.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use tokio::runtime::{Handle, RuntimeFlavor};

/// The passes through the worker's ready tasks a denied connection waits
/// before its next request (measured, `bench/flood.sh`: three halve a
/// flooded worker's legitimate p99 against one, at the flood's rate).
const PASSES: u32 = 3;

/// Waits [`PASSES`] passes through the worker's ready tasks. Outside a
/// single-threaded runtime (which every worker runs) it yields once.
pub(super) async fn wait_passes() {
    match Keeper::here() {
        Some(keeper) => {
            Waiting {
                keeper,
                ticket: None,
            }
            .await
        }
        None => tokio::task::yield_now().await,
    }
}

/// A connection in its keeper's line, from its first poll (when it joins)
/// until the keeper lets it go.
struct Waiting {
    keeper: Arc<Keeper>,
    /// Its place in the line, once it has joined.
    ticket: Option<u64>,
}

impl Future for Waiting {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let mut line = this.keeper.line();
        match this.ticket {
            None => {
                let (ticket, asleep) = line.join(cx.waker());
                this.ticket = Some(ticket);
                drop(line);
                if let Some(keeper) = asleep {
                    keeper.wake();
                }
                Poll::Pending
            }
            Some(ticket) if line.is_released(ticket) => Poll::Ready(()),
            // Polled before its turn (woken by something else): it waits on.
            Some(ticket) => {
                line.wake_with(ticket, cx.waker());
                Poll::Pending
            }
        }
    }
}

/// A worker's keeper: the line of connections stepping aside on its
/// runtime, which its task ([`keep`]) goes through once a pass.
struct Keeper {
    /// The runtime the keeper's task runs on: a connection of another
    /// runtime on the same thread (one runtime after another, as tests
    /// run) gets a keeper of its own.
    runtime: tokio::runtime::Id,
    line: Mutex<Line>,
}

thread_local! {
    /// The keeper of the runtime last seen stepping aside on this thread.
    static KEEPER: RefCell<Option<Arc<Keeper>>> = const { RefCell::new(None) };
}

impl Keeper {
    /// The keeper of the current runtime, started on its first use; `None`
    /// outside a single-threaded runtime (a multi-threaded one would run
    /// the keeper on any of its threads).
    fn here() -> Option<Arc<Keeper>> {
        let runtime = Handle::try_current().ok()?;
        let id = runtime.id();
        KEEPER
            .try_with(|slot| {
                let mut slot = slot.borrow_mut();
                if let Some(keeper) = slot.as_ref().filter(|keeper| keeper.runtime == id) {
                    return Some(keeper.clone());
                }
                if runtime.runtime_flavor() != RuntimeFlavor::CurrentThread {
                    return None;
                }
                let keeper = Arc::new(Keeper {
                    runtime: id,
                    line: Mutex::new(Line::default()),
                });
                // Lives as long as the runtime (dropped with its tasks).
                drop(runtime.spawn(keep(keeper.clone())));
                *slot = Some(keeper.clone());
                Some(keeper)
            })
            .ok()
            .flatten()
    }

    fn line(&self) -> MutexGuard<'_, Line> {
        // Nothing panics while the line is held.
        self.line.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The keeper's task: while connections wait, one pass at a time, then
/// wakes those it lets go (in the order they joined).
async fn keep(keeper: Arc<Keeper>) {
    let mut released = Vec::new();
    loop {
        // Asleep while the line is empty: an idle worker is not kept awake.
        poll_fn(|cx| keeper.line().wait_for_someone(cx.waker())).await;
        tokio::task::yield_now().await;
        keeper.line().end_pass(&mut released);
        for waker in released.drain(..) {
            waker.wake();
        }
    }
}

/// The connections stepping aside on one worker, in the order they joined,
/// and the passes counted for them: what the keeper decides, apart from
/// the runtime.
#[derive(Default)]
struct Line {
    /// Passes ended since the keeper started (wrapping).
    passes: u32,
    /// The ticket of `waiting`'s first: tickets are handed out in order and
    /// let go in order, so every ticket below it has been let go.
    first: u64,
    /// Each waiting connection: the pass after which it goes on, and its
    /// waker.
    waiting: VecDeque<(u32, Waker)>,
    /// The keeper's waker while it sleeps on an empty line.
    asleep: Option<Waker>,
}

impl Line {
    /// Puts a connection at the end of the line: its ticket, and the
    /// keeper's waker if it slept (to be woken: a pass begins).
    fn join(&mut self, waker: &Waker) -> (u64, Option<Waker>) {
        let ticket = self.first + self.waiting.len() as u64;
        self.waiting
            .push_back((self.passes.wrapping_add(PASSES), waker.clone()));
        (ticket, self.asleep.take())
    }

    /// Whether the keeper has let the connection with `ticket` go.
    fn is_released(&self, ticket: u64) -> bool {
        ticket < self.first
    }

    /// Wakes a connection still in the line with `waker` when it goes.
    fn wake_with(&mut self, ticket: u64, waker: &Waker) {
        if let Some((_, kept)) = self.waiting.get_mut((ticket - self.first) as usize)
            && !kept.will_wake(waker)
        {
            kept.clone_from(waker);
        }
    }

    /// Ready when someone waits; otherwise the keeper sleeps, `waker` kept.
    fn wait_for_someone(&mut self, waker: &Waker) -> Poll<()> {
        if self.waiting.is_empty() {
            self.asleep = Some(waker.clone());
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    }

    /// A pass has ended: lets go, into `released`, every connection that
    /// has waited its passes.
    fn end_pass(&mut self, released: &mut Vec<Waker>) {
        self.passes = self.passes.wrapping_add(1);
        while let Some((goes_after, _)) = self.waiting.front() {
            // Wrapping: due once the count has reached it, within 2^31.
            if (self.passes.wrapping_sub(*goes_after) as i32) < 0 {
                break;
            }
            if let Some((_, waker)) = self.waiting.pop_front() {
                released.push(waker);
            }
            self.first += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::{Duration, Instant};

    /// A waker that counts its wakes.
    struct Counted(AtomicUsize);

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn counted() -> (Arc<Counted>, Waker) {
        let count = Arc::new(Counted(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    #[test]
    fn a_connection_is_kept_aside_for_three_passes() {
        let mut line = Line::default();
        let (_, waker) = counted();
        let (ticket, _) = line.join(&waker);
        let mut released = Vec::new();
        for pass in 1..PASSES {
            line.end_pass(&mut released);
            assert!(released.is_empty(), "let go after {pass} passes");
            assert!(!line.is_released(ticket));
        }
        line.end_pass(&mut released);
        assert_eq!(released.len(), 1);
        assert!(line.is_released(ticket));
    }

    #[test]
    fn connections_go_in_the_order_they_joined_each_after_its_own_passes() {
        let mut line = Line::default();
        let ((early, early_waker), (late, late_waker)) = (counted(), counted());
        let (first, _) = line.join(&early_waker);
        let mut released = Vec::new();
        line.end_pass(&mut released);
        let (second, _) = line.join(&late_waker);
        line.end_pass(&mut released);
        line.end_pass(&mut released);
        assert!(line.is_released(first) && !line.is_released(second));
        line.end_pass(&mut released);
        assert!(line.is_released(second));
        for waker in released.drain(..) {
            waker.wake();
        }
        assert_eq!(early.0.load(Ordering::Relaxed), 1);
        assert_eq!(late.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_pass_count_wraps() {
        let mut line = Line {
            passes: u32::MAX - 1,
            ..Line::default()
        };
        let (_, waker) = counted();
        let (ticket, _) = line.join(&waker);
        let mut released = Vec::new();
        for _ in 1..PASSES {
            line.end_pass(&mut released);
        }
        assert!(!line.is_released(ticket));
        line.end_pass(&mut released);
        assert!(line.is_released(ticket));
    }

    #[test]
    fn the_keeper_sleeps_on_an_empty_line_and_is_woken_by_the_first_to_join() {
        let mut line = Line::default();
        let (keeper, keeper_waker) = counted();
        assert!(line.wait_for_someone(&keeper_waker).is_pending());
        let (_, waker) = counted();
        let (_, asleep) = line.join(&waker);
        asleep.expect("the keeper's waker").wake();
        assert_eq!(keeper.0.load(Ordering::Relaxed), 1);
        assert!(line.wait_for_someone(&keeper_waker).is_ready());
        let (_, asleep) = line.join(&waker);
        assert!(asleep.is_none(), "woken once");
    }

    /// The tasks ready when a connection steps aside run before it goes on:
    /// `first` steps aside, `second` (ready behind it) runs, then `first`.
    #[test]
    fn a_connection_stepping_aside_goes_after_the_tasks_that_were_ready() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let order = runtime.block_on(async {
            let order = Arc::new(Mutex::new(Vec::new()));
            let first = tokio::spawn({
                let order = order.clone();
                async move {
                    wait_passes().await;
                    order.lock().unwrap().push("first");
                }
            });
            let second = tokio::spawn({
                let order = order.clone();
                async move { order.lock().unwrap().push("second") }
            });
            first.await.unwrap();
            second.await.unwrap();
            Arc::try_unwrap(order).unwrap().into_inner().unwrap()
        });
        assert_eq!(order, ["second", "first"]);
    }

    /// A worker, with another task that is busy for `busy_for` each time it
    /// runs and ready again at once (so every pass holds some of its runs)
    /// or with none: how many passes the keeper counted while a task
    /// stepped aside.
    fn passes_stepped_aside(busy_for: Option<Duration>) -> u32 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let done = Arc::new(AtomicBool::new(false));
            let busy = busy_for.map(|busy_for| {
                let done = done.clone();
                tokio::spawn(poll_fn(move |cx| {
                    if done.load(Ordering::Relaxed) {
                        return Poll::Ready(());
                    }
                    let started = Instant::now();
                    while started.elapsed() < busy_for {
                        std::hint::spin_loop();
                    }
                    // To the back of the run queue, not deferred: the
                    // worker stays busy through every pass.
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }))
            });
            // In a task, as a connection steps aside.
            let stepping = tokio::spawn(async {
                // Started with the first step aside; then counted from here.
                wait_passes().await;
                let keeper = Keeper::here().expect("a keeper");
                let before = keeper.line().passes;
                wait_passes().await;
                keeper.line().passes.wrapping_sub(before)
            });
            let passes = stepping.await.unwrap();
            done.store(true, Ordering::Relaxed);
            if let Some(busy) = busy {
                busy.await.unwrap();
            }
            passes
        })
    }

    #[test]
    fn a_busy_worker_steps_a_connection_aside_for_three_passes() {
        assert_eq!(
            passes_stepped_aside(Some(Duration::from_micros(200))),
            PASSES
        );
    }

    #[test]
    fn an_idle_worker_steps_a_connection_aside_for_three_passes_too() {
        assert_eq!(passes_stepped_aside(None), PASSES);
    }

    #[test]
    fn outside_a_runtime_there_is_no_keeper() {
        assert!(Keeper::here().is_none());
    }

    #[test]
    fn each_runtime_on_a_thread_gets_its_own_keeper() {
        for _ in 0..2 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            runtime.block_on(async {
                tokio::spawn(wait_passes()).await.unwrap();
                let keeper = Keeper::here().expect("a keeper");
                assert_eq!(keeper.runtime, Handle::current().id());
            });
        }
    }
}
