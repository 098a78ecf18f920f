//! A traced request's Redis calls, noted for its spans: when each call of
//! its decision was made and answered, which limits it carried, whether
//! it failed.
//!
//! The request's front puts a [`Probe`] in a task-local for the length of
//! its admission ([`Probe::around`]); a call looks for it
//! ([`Probe::note`]) and finds none on an untraced request, one
//! thread-local read per Redis call. The store threads nothing through
//! its steps for it, and knows nothing of spans: the front turns the
//! calls into spans (`proxy::traced`). A call batched with others'
//! decisions is each request's own here: from its decision joining the
//! batch to the batch's answer.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;

use crate::limit::{Clock, Nanos};

tokio::task_local! {
    static PROBE: Probe;
}

/// One Redis call a request's decision made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoreCall {
    /// The Redis command (`EVALSHA`: the stack script).
    pub(crate) operation: &'static str,
    /// On the gateway's clock, as the request's spans.
    pub(crate) start: Nanos,
    pub(crate) end: Nanos,
    /// The limits it decided, in stack order.
    pub(crate) limits: Vec<String>,
    /// No answer (timeout, connection, error), or the breaker was open.
    pub(crate) failed: bool,
}

/// Where a request's calls are noted while its admission runs.
pub(crate) struct Probe {
    clock: Arc<dyn Clock>,
    calls: RefCell<Vec<StoreCall>>,
}

impl Probe {
    /// `admission` run with a probe whose times are read from `clock`; its
    /// answer, and the Redis calls it made.
    pub(crate) async fn around<F: Future>(
        clock: Arc<dyn Clock>,
        admission: F,
    ) -> (F::Output, Vec<StoreCall>) {
        let probe = Probe {
            clock,
            calls: RefCell::new(Vec::new()),
        };
        PROBE
            .scope(probe, async {
                let output = admission.await;
                let calls = PROBE.with(|probe| probe.calls.take());
                (output, calls)
            })
            .await
    }

    /// A call of `operation` on `limits`, made by `call`: noted when the
    /// task has a probe, else only made.
    pub(crate) async fn note<T, E>(
        operation: &'static str,
        limits: impl Iterator<Item = &str>,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let Ok(start) = PROBE.try_with(|probe| probe.clock.now()) else {
            return call.await;
        };
        let answer = call.await;
        let _ = PROBE.try_with(|probe| {
            probe.calls.borrow_mut().push(StoreCall {
                operation,
                start,
                end: probe.clock.now(),
                limits: limits.map(str::to_owned).collect(),
                failed: answer.is_err(),
            });
        });
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::ManualClock;

    #[tokio::test]
    async fn calls_are_noted_only_inside_a_probe() {
        let call = || async { Ok::<u8, ()>(7) };
        // Outside: made, not noted (nothing to note it in).
        assert_eq!(
            Probe::note("EVALSHA", ["a"].into_iter(), call()).await,
            Ok(7)
        );
        let clock = Arc::new(ManualClock::new(1_000));
        let (answer, calls) = Probe::around(clock.clone(), async {
            let first = Probe::note("EVALSHA", ["a", "b"].into_iter(), call()).await;
            let failed =
                Probe::note("EVALSHA", ["c"].into_iter(), async { Err::<u8, ()>(()) }).await;
            (first, failed)
        })
        .await;
        assert_eq!(answer, (Ok(7), Err(())));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].limits.as_slice(), ["a", "b"]);
        assert_eq!((calls[0].start, calls[0].end), (1_000, 1_000));
        assert!(!calls[0].failed);
        assert!(calls[1].failed);
    }
}
