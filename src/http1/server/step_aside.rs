//! How long a denied connection steps aside before its next request: one
//! pass through the worker's ready tasks, and more while the worker is
//! busy (see `serve`'s doc).

use std::time::{Duration, Instant};

/// The most passes through the worker's ready tasks a denied connection
/// waits before its next request (measured, `bench/flood.sh`: three halve a
/// flooded worker's legitimate p99 against one, at the flood's rate).
const PASSES: u32 = 3;

/// A pass through the worker's ready tasks at least this long says it is
/// busy: a few answers' work. An idle worker's pass is this task alone.
const BUSY_PASS: Duration = Duration::from_micros(30);

/// Yields to the worker's other ready tasks, once, then again while each
/// pass took [`BUSY_PASS`] or more, up to [`PASSES`] in all.
pub(super) async fn while_busy() {
    for _ in 1..PASSES {
        let yielded = Instant::now();
        tokio::task::yield_now().await;
        if yielded.elapsed() < BUSY_PASS {
            return;
        }
    }
    tokio::task::yield_now().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    /// A worker with another task that is busy for longer than
    /// [`BUSY_PASS`] each time it runs: how many times it ran while
    /// `while_busy` stepped aside.
    fn passes_beside_a_busy_task(busy_for: Duration) -> u32 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let (runs, done) = (
                Arc::new(AtomicU32::new(0)),
                Arc::new(AtomicBool::new(false)),
            );
            let busy = tokio::spawn({
                let (runs, done) = (runs.clone(), done.clone());
                async move {
                    while !done.load(Ordering::Relaxed) {
                        let started = Instant::now();
                        while started.elapsed() < busy_for {
                            std::hint::spin_loop();
                        }
                        runs.fetch_add(1, Ordering::Relaxed);
                        tokio::task::yield_now().await;
                    }
                }
            });
            while_busy().await;
            let ran = runs.load(Ordering::Relaxed);
            done.store(true, Ordering::Relaxed);
            busy.await.unwrap();
            ran
        })
    }

    #[test]
    fn a_busy_worker_is_stepped_aside_for_up_to_three_passes() {
        // Each pass holds the other task's 200 µs: busy every time.
        assert_eq!(
            passes_beside_a_busy_task(Duration::from_micros(200)),
            PASSES
        );
    }
}
