//! Per-request deadlines on reused timers.
//!
//! Every proxied request has a deadline (the upstream's `timeout`). A fresh
//! `tokio::time::Sleep` per request registers an entry in the runtime's
//! timer wheel on its first poll and removes it when dropped, each under the
//! driver's lock: about 600 instructions per request (callgrind), for a
//! timer that almost never fires. Here the timers are kept per thread and
//! reused: moving a registered timer's deadline later is tokio's fast path
//! (the entry stays in the wheel and is only re-filed if it comes due
//! first), so a request costs a clock read and a compare-and-swap.
//!
//! A spare timer may fire while nobody waits on it; it then wakes the task
//! that used it last, which finds nothing to do. Spares are bounded
//! (`MAX_SPARE`) and belong to the runtime that made them: a timer polled
//! after its runtime is gone panics, so when a thread runs a new runtime
//! (benchmarks and tests make several in turn) its old spares are dropped,
//! never reused. Each worker has its own current-thread runtime, so its own
//! spares.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::runtime::{Handle, Id};
use tokio::time::{Instant, Sleep};

/// Spare timers kept per thread: more than the requests a worker has in
/// flight at once is waste. Bounded also because an unfired spare holds the
/// waker of the task that used it last, which keeps that task's (finished)
/// allocation alive until the timer is reused or fires.
const MAX_SPARE: usize = 256;

/// A thread's spare timers, and the runtime they belong to.
struct Spares {
    runtime: Option<Id>,
    timers: Vec<Pin<Box<Sleep>>>,
}

thread_local! {
    static SPARE: RefCell<Spares> = const {
        RefCell::new(Spares {
            runtime: None,
            timers: Vec::new(),
        })
    };
}

/// A timer that fires at a deadline; back to the thread's spares when dropped.
#[derive(Debug)]
pub(crate) struct Deadline {
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Deadline {
    /// A timer firing at `at`. Call from within a runtime with time enabled.
    pub(crate) fn at(at: Instant) -> Self {
        let runtime = Handle::try_current().ok().map(|handle| handle.id());
        let spare = SPARE.with(|spare| {
            let mut spare = spare.borrow_mut();
            if spare.runtime != runtime {
                spare.timers.clear();
                spare.runtime = runtime;
            }
            spare.timers.pop()
        });
        let sleep = match spare {
            Some(mut sleep) => {
                sleep.as_mut().reset(at);
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(at)),
        };
        Deadline { sleep: Some(sleep) }
    }

    /// Whether the deadline has passed, registering the task to be woken
    /// when it does.
    ///
    /// Outside tokio's cooperative budget: a guarded future that used the
    /// task's budget up (an upstream flooding `100 Continue` heads, say)
    /// would otherwise make every poll of the timer return `Pending`
    /// unregistered, and the deadline would never come
    /// (`tokio::time::timeout` takes the same care).
    pub(crate) fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.sleep {
            Some(sleep) => std::pin::pin!(tokio::task::unconstrained(sleep.as_mut())).poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        if let Some(sleep) = self.sleep.take() {
            // `try_with`: a thread that is exiting has no spares any more.
            let _ = SPARE.try_with(|spare| {
                if let Ok(mut spare) = spare.try_borrow_mut()
                    && spare.timers.len() < MAX_SPARE
                {
                    spare.timers.push(sleep);
                }
            });
        }
    }
}

impl Deadline {
    /// `future`, or `None` once the deadline has passed; the timer stays for
    /// the next step of the same request. The future is polled where its
    /// caller pinned it: a large one is not moved into this one (a request's
    /// exchange would be copied once more). A plain future, not an `async
    /// fn`: each layer of state machine around an exchange also moves its
    /// answer (~230 bytes) once more.
    pub(crate) fn guard<'a, F: Future>(&'a mut self, future: Pin<&'a mut F>) -> Guarded<'a, F> {
        Guarded {
            deadline: self,
            future,
        }
    }
}

/// A future and the deadline it must meet ([`Deadline::guard`]).
pub(crate) struct Guarded<'a, F> {
    deadline: &'a mut Deadline,
    future: Pin<&'a mut F>,
}

impl<F: Future> Future for Guarded<'_, F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(output) = self.future.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        self.deadline.poll_expired(cx).map(|()| None)
    }
}

/// `future`, or `None` once `deadline` has passed (as `tokio::time::timeout`):
/// the timer's behaviour as the unit tests read it.
#[cfg(test)]
async fn within<F: Future>(deadline: Instant, future: F) -> Option<F::Output> {
    Deadline::at(deadline).guard(std::pin::pin!(future)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_reused_timer_fires_at_its_new_deadline() {
        let start = Instant::now();
        // A long deadline, given back unfired...
        let slow = within(
            start + Duration::from_secs(60),
            std::future::pending::<()>(),
        );
        assert!(
            tokio::time::timeout(Duration::from_secs(1), slow)
                .await
                .is_err()
        );
        // ...then the same timer with an earlier and a later deadline.
        let early = within(start + Duration::from_secs(5), std::future::pending::<()>()).await;
        assert_eq!(early, None);
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
        let later = within(
            Instant::now() + Duration::from_secs(90),
            std::future::pending::<()>(),
        )
        .await;
        assert_eq!(later, None);
        assert_eq!(Instant::now() - start, Duration::from_secs(95));
    }

    #[tokio::test]
    async fn a_future_that_uses_up_the_budget_still_times_out() {
        // Never ready, and spends the task's whole budget on every poll.
        let busy = async {
            loop {
                tokio::task::coop::consume_budget().await;
            }
        };
        let guard = Duration::from_secs(5);
        let within = within(Instant::now() + Duration::from_millis(50), busy);
        let outcome = tokio::time::timeout(guard, within).await;
        assert_eq!(outcome, Ok(None), "the deadline did not fire");
    }

    #[test]
    fn a_new_runtime_on_the_thread_does_not_reuse_the_old_ones_timers() {
        for _ in 0..3 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap();
            runtime.block_on(async {
                let late = within(Instant::now() + Duration::from_secs(60), async { 1 });
                assert_eq!(late.await, Some(1));
                let soon = within(
                    Instant::now() + Duration::from_millis(1),
                    std::future::pending::<()>(),
                );
                assert_eq!(soon.await, None);
            });
            // The runtime is gone; its timers stay in this thread's spares
            // until the next runtime replaces them (polling one would panic).
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_deadline_guards_each_step_of_a_request() {
        let start = Instant::now();
        let mut deadline = Deadline::at(start + Duration::from_secs(10));
        let first = deadline
            .guard(std::pin::pin!(async {
                tokio::time::sleep(Duration::from_secs(4)).await;
                1
            }))
            .await;
        assert_eq!(first, Some(1));
        // The second step has what is left of the ten seconds, not ten more.
        let second = deadline
            .guard(std::pin::pin!(std::future::pending::<()>()))
            .await;
        assert_eq!(second, None);
        assert_eq!(Instant::now() - start, Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_ready_future_wins_and_the_timer_is_kept() {
        let before = SPARE.with(|spare| spare.borrow().timers.len());
        let output = within(Instant::now() + Duration::from_secs(1), async { 7 }).await;
        assert_eq!(output, Some(7));
        let after = SPARE.with(|spare| spare.borrow().timers.len());
        assert_eq!(after, before + 1);
        // The spare is used again, not a new one.
        let output = within(Instant::now() + Duration::from_secs(1), async { 8 }).await;
        assert_eq!(output, Some(8));
        assert_eq!(SPARE.with(|spare| spare.borrow().timers.len()), after);
    }
}
