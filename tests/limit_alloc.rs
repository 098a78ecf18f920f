//! The decision path allocates nothing for keys the limiter already holds,
//! for every algorithm and for stacks of up to 8 entries (style: "no
//! allocation on the allowed path", proved with a counting allocator).
//!
//! The count is this thread's: the test harness's own thread allocates
//! now and then while it waits (seen under load), and must not count.

use tollgate::limit::{
    Algorithm, LeakyMode, LimitKey, Limiter, NANOS_PER_SEC, Nanos, Rate, StackEntry, check_stack,
};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

const S: Nanos = NANOS_PER_SEC;
const T0: Nanos = 1_700_000_000 * S;

#[test]
fn known_keys_decide_without_allocating() {
    let rate = Rate { tokens: 10, per: S };
    let algorithms = [
        Algorithm::FixedWindow {
            limit: 50,
            window: S,
        },
        Algorithm::SlidingWindow {
            limit: 50,
            window: S,
        },
        Algorithm::SlidingLog {
            limit: 50,
            window: S,
        },
        Algorithm::TokenBucket {
            capacity: 50,
            refill: rate,
            wait: 0,
        },
        Algorithm::LeakyBucket {
            capacity: 50,
            rate,
            mode: LeakyMode::Delay,
        },
        Algorithm::Concurrency { max: 50 },
        Algorithm::TokenBucket {
            capacity: 5,
            refill: rate,
            wait: 0,
        },
        Algorithm::FixedWindow {
            limit: 1_000,
            window: S,
        },
    ];
    let limiters: Vec<Limiter> = algorithms
        .iter()
        .map(|a| Limiter::new("l", *a, 100))
        .collect();
    let key = LimitKey::digest(&[b"client"]);
    let stack: Vec<StackEntry<'_>> = limiters
        .iter()
        .map(|l| StackEntry {
            limiter: l,
            key: Some(key),
            shadow: false,
        })
        .collect();
    // Warm up: create every key's state and let the sliding log's deque
    // reach its working capacity (one run per admitted timestamp).
    for i in 0..200 {
        drop(check_stack(&stack, 1, T0 + i * S / 100));
        for l in &limiters {
            drop(l.check(key, 1, T0 + i * S / 100));
        }
    }
    let before = counting_alloc::this_thread_allocations();
    let (mut allowed, mut denied) = (0, 0);
    for i in 200..1_200 {
        let now = T0 + i * S / 100;
        // Stack of 8 (admits and denies both happen: the 5-token bucket).
        let d = check_stack(&stack, 1, now);
        if d.allowed {
            allowed += 1;
        } else {
            denied += 1;
        }
        // And each limit alone.
        for l in &limiters {
            drop(l.check(key, 1, now));
        }
    }
    let after = counting_alloc::this_thread_allocations();
    assert!(allowed > 0 && denied > 0, "{allowed} {denied}");
    assert_eq!(after - before, 0, "allocations on the decision path");
}
