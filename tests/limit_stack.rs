//! The key stack under contention: many threads hammering one key through a
//! two-limit stack must never over-admit, and denied requests must charge
//! nothing, so that the admitted count is exactly the capacity.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use tollgate::limit::{
    Algorithm, LimitKey, Limiter, NANOS_PER_SEC, Nanos, Rate, StackEntry, check_stack,
};

const T0: Nanos = 1_700_000_000 * NANOS_PER_SEC;

#[test]
fn racing_threads_admit_exactly_the_capacity() {
    // per_key: token bucket of 500 (no refill within the test: the clock is
    // frozen); per_ip: fixed window of 300. Requests alternate cost 1 and 2.
    // The tighter per_ip decides; if a denial by per_ip charged per_key, or
    // two racing requests both took the last units, the sums would differ.
    let per_key = Arc::new(Limiter::new(
        "per_key",
        Algorithm::TokenBucket {
            capacity: 500,
            refill: Rate {
                tokens: 1,
                per: 3600 * NANOS_PER_SEC,
            },
            wait: 0,
        },
        1_000,
    ));
    let per_ip = Arc::new(Limiter::new(
        "per_ip",
        Algorithm::FixedWindow {
            limit: 300,
            window: 3600 * NANOS_PER_SEC,
        },
        1_000,
    ));
    let admitted_units = Arc::new(AtomicU64::new(0));
    let key = LimitKey::digest(&[b"one client"]);
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (per_key, per_ip, admitted_units) =
                (per_key.clone(), per_ip.clone(), admitted_units.clone());
            thread::spawn(move || {
                for i in 0..400u64 {
                    let cost = 1 + (i + t) % 2;
                    let stack = [
                        StackEntry {
                            limiter: &per_key,
                            key: Some(key),
                            shadow: false,
                        },
                        StackEntry {
                            limiter: &per_ip,
                            key: Some(key),
                            shadow: false,
                        },
                    ];
                    let d = check_stack(&stack, cost, T0 + i);
                    if d.allowed {
                        admitted_units.fetch_add(cost, Ordering::Relaxed);
                    } else {
                        assert_eq!(d.denied_by, Some(1), "per_ip is the tighter limit");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker thread");
    }
    let admitted = admitted_units.load(Ordering::Relaxed);
    // Costs are 1 or 2 and both kinds keep arriving, so per_ip fills exactly.
    assert_eq!(admitted, 300);
    let now = T0 + 400;
    assert_eq!(per_ip.peek(key, now).remaining, 0);
    // per_key was charged exactly what per_ip admitted, nothing for denials.
    assert_eq!(per_key.peek(key, now).remaining, 500 - 300);
}

#[test]
fn racing_concurrency_permits_never_exceed_max() {
    let conc = Arc::new(Limiter::new("conc", Algorithm::Concurrency { max: 3 }, 100));
    let in_flight = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let key = LimitKey::digest(&[b"k"]);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (conc, in_flight, peak) = (conc.clone(), in_flight.clone(), peak.clone());
            thread::spawn(move || {
                for _ in 0..2_000 {
                    let d = conc.check(key, 1, T0);
                    if d.verdict.allowed {
                        let permits = d.permit;
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        drop(permits);
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("worker thread");
    }
    assert!(peak.load(Ordering::SeqCst) <= 3);
    assert_eq!(conc.peek(key, T0).remaining, 3, "every permit released");
    assert_eq!(conc.sweep(T0), 1);
}
