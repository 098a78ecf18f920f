//! Decision cost of the limiter engine, next to governor's keyed limiter.
//!
//! Split as governor's own benches are: per algorithm, one key and 100k keys,
//! mostly-allow (a quota far above the request rate) and mostly-deny (a spent
//! quota), one thread and two threads contending on one key. Our decisions
//! read `SystemClock::now()` per call, since governor's `check_key` reads its
//! clock too. Two-thread benches time both threads doing `iters` decisions
//! each, so their figure is wall time per decision *per thread* under
//! contention (compare with the one-thread figure of the same limiter).
//!
//! Before the benches run, a counting global allocator checks the decision
//! path (known keys, stacks of 1, 2 and 8 entries, every algorithm) and prints
//! the allocations per decision; `tests/limit_alloc.rs` asserts it is zero.
//!
//! Run: `cargo bench --bench limiter -- --warm-up-time 1 --measurement-time 2`

use std::hint::black_box;
use std::num::NonZeroU32;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use governor::{Quota, RateLimiter};
use tollgate::limit::{
    Algorithm, Clock, LeakyMode, LimitKey, Limiter, NANOS_PER_SEC, Rate, StackEntry, SystemClock,
    check_stack,
};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

const S: u64 = NANOS_PER_SEC;
const KEYS: usize = 100_000;

/// Mostly-allow and mostly-deny parameters for each algorithm.
fn algorithms(allow: bool) -> Vec<(&'static str, Algorithm)> {
    let big = if allow { 1_000_000_000 } else { 1 };
    let rate = Rate {
        tokens: if allow { 100_000_000 } else { 1 },
        per: if allow { S } else { 3600 * S },
    };
    vec![
        (
            "fixed_window",
            Algorithm::FixedWindow {
                limit: big,
                window: 3600 * S,
            },
        ),
        (
            "sliding_window",
            Algorithm::SlidingWindow {
                limit: big,
                window: 3600 * S,
            },
        ),
        (
            "sliding_log",
            Algorithm::SlidingLog {
                // A log holds one run per distinct timestamp: keep it small.
                limit: if allow { 1_000 } else { 1 },
                window: if allow { 1_000 } else { 3600 * S },
            },
        ),
        (
            "token_bucket",
            Algorithm::TokenBucket {
                capacity: big,
                refill: rate,
                wait: 0,
            },
        ),
        (
            "leaky_bucket",
            Algorithm::LeakyBucket {
                capacity: big,
                rate,
                mode: LeakyMode::Delay,
            },
        ),
        (
            "concurrency",
            Algorithm::Concurrency {
                max: if allow { 1_000_000 } else { 0 },
            },
        ),
    ]
}

fn governor_quota(allow: bool) -> Quota {
    let n = |v| NonZeroU32::new(v).unwrap_or(NonZeroU32::MIN);
    if allow {
        Quota::per_second(n(100_000_000)).allow_burst(n(1_000_000_000))
    } else {
        Quota::per_hour(n(1))
    }
}

fn keys() -> Vec<LimitKey> {
    (0..KEYS as u64)
        .map(|i| LimitKey::digest(&[&i.to_le_bytes()]))
        .collect()
}

fn spend(limiter: &Limiter, key: LimitKey, clock: &SystemClock) {
    for _ in 0..4 {
        drop(limiter.check(key, 1, clock.now()));
    }
}

fn single_thread(c: &mut Criterion) {
    let clock = SystemClock::new();
    c.bench_function("clock/system_clock_now", |b| {
        b.iter(|| black_box(clock.now()))
    });
    let quanta = governor::clock::DefaultClock::default();
    c.bench_function("clock/governor_default_clock_now", |b| {
        b.iter(|| black_box(governor::clock::Clock::now(&quanta)))
    });
    let key = LimitKey::digest(&[b"client"]);
    let gkey = key.as_u128();
    for allow in [true, false] {
        let mode = if allow { "allow" } else { "deny" };
        let mut g = c.benchmark_group(format!("one_key/{mode}"));
        g.throughput(Throughput::Elements(1));
        for (name, alg) in algorithms(allow) {
            let limiter = Limiter::new(name, alg, 1_000_000);
            spend(&limiter, key, &clock);
            g.bench_function(name, |b| {
                b.iter(|| {
                    black_box(
                        limiter
                            .check(black_box(key), 1, clock.now())
                            .verdict
                            .allowed,
                    )
                })
            });
            if name == "token_bucket" {
                // The decision alone, `now` advanced by hand (1 µs a call).
                let mut now = clock.now();
                g.bench_function("token_bucket_given_now", |b| {
                    b.iter(|| {
                        now += 1_000;
                        black_box(limiter.check(black_box(key), 1, now).verdict.allowed)
                    })
                });
            }
        }
        let gov = RateLimiter::keyed(governor_quota(allow));
        for _ in 0..4 {
            let _ = gov.check_key(&gkey);
        }
        g.bench_function("governor_keyed", |b| {
            b.iter(|| black_box(gov.check_key(black_box(&gkey)).is_ok()))
        });
        g.finish();
    }
}

fn many_keys(c: &mut Criterion) {
    let clock = SystemClock::new();
    let keys = keys();
    let mut g = c.benchmark_group("100k_keys/allow");
    g.throughput(Throughput::Elements(1));
    for (name, alg) in algorithms(true)
        .into_iter()
        .filter(|(n, _)| matches!(*n, "token_bucket" | "sliding_window"))
    {
        let limiter = Limiter::new(name, alg, 1_000_000);
        for k in &keys {
            drop(limiter.check(*k, 1, clock.now()));
        }
        let mut i = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % KEYS;
                black_box(limiter.check(keys[i], 1, clock.now()).verdict.allowed)
            })
        });
    }
    let gov = RateLimiter::keyed(governor_quota(true));
    for k in &keys {
        let _ = gov.check_key(&k.as_u128());
    }
    let mut i = 0;
    g.bench_function("governor_keyed", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            black_box(gov.check_key(&keys[i].as_u128()).is_ok())
        })
    });
    g.finish();
}

/// Two threads each doing `iters` decisions on one key; wall time.
fn contended(iters: u64, op: impl Fn() + Sync) -> Duration {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let run = || {
            barrier.wait();
            let start = Instant::now();
            for _ in 0..iters {
                op();
            }
            start.elapsed()
        };
        let other = s.spawn(run);
        let mine = run();
        mine.max(other.join().unwrap_or(mine))
    })
}

fn two_threads(c: &mut Criterion) {
    let clock = SystemClock::new();
    let key = LimitKey::digest(&[b"client"]);
    for allow in [true, false] {
        let mode = if allow { "allow" } else { "deny" };
        let mut g = c.benchmark_group(format!("one_key_2_threads/{mode}"));
        g.throughput(Throughput::Elements(1));
        let (_, alg) = algorithms(allow)
            .into_iter()
            .find(|(n, _)| *n == "token_bucket")
            .unwrap_or(("token_bucket", Algorithm::Concurrency { max: 1 }));
        let limiter = Arc::new(Limiter::new("token_bucket", alg, 1_000));
        spend(&limiter, key, &clock);
        g.bench_function("token_bucket", |b| {
            b.iter_custom(|iters| {
                contended(iters, || {
                    black_box(limiter.check(key, 1, clock.now()).verdict.allowed);
                })
            })
        });
        let gov = RateLimiter::keyed(governor_quota(allow));
        let gkey = key.as_u128();
        for _ in 0..4 {
            let _ = gov.check_key(&gkey);
        }
        g.bench_function("governor_keyed", |b| {
            b.iter_custom(|iters| {
                contended(iters, || {
                    black_box(gov.check_key(&gkey).is_ok());
                })
            })
        });
        g.finish();
    }
}

fn stacks(c: &mut Criterion) {
    let clock = SystemClock::new();
    let key = LimitKey::digest(&[b"client"]);
    let algs = algorithms(true);
    let limiters: Vec<Limiter> = algs
        .iter()
        .filter(|(n, _)| *n != "sliding_log")
        .map(|(n, a)| Limiter::new(n, *a, 1_000))
        .collect();
    let mut g = c.benchmark_group("stack/allow");
    for n in [2usize, 5] {
        let stack: Vec<StackEntry<'_>> = limiters[..n]
            .iter()
            .map(|l| StackEntry {
                limiter: l,
                key: Some(key),
                shadow: false,
            })
            .collect();
        g.bench_with_input(BenchmarkId::from_parameter(n), &stack, |b, stack| {
            b.iter(|| black_box(check_stack(stack, 1, clock.now()).allowed))
        });
    }
    g.finish();
}

/// Allocations per decision on known keys, printed before the benches.
fn report_allocations() {
    let clock = SystemClock::new();
    let key = LimitKey::digest(&[b"client"]);
    const N: u64 = 10_000;
    for allow in [true, false] {
        for (name, alg) in algorithms(allow) {
            let limiter = Limiter::new(name, alg, 1_000);
            spend(&limiter, key, &clock);
            let before = counting_alloc::allocations();
            for _ in 0..N {
                black_box(limiter.check(key, 1, clock.now()).verdict.allowed);
            }
            let after = counting_alloc::allocations();
            println!(
                "allocations per decision: {name} ({}): {}",
                if allow { "allow" } else { "deny" },
                (after - before) as f64 / N as f64
            );
        }
    }
    let ls: Vec<Limiter> = (0..8)
        .map(|i| Limiter::new("s", algorithms(true)[i % 5].1, 1_000))
        .collect();
    let stack: Vec<StackEntry<'_>> = ls
        .iter()
        .map(|l| StackEntry {
            limiter: l,
            key: Some(key),
            shadow: false,
        })
        .collect();
    drop(check_stack(&stack, 1, clock.now()));
    let before = counting_alloc::allocations();
    for _ in 0..N {
        black_box(check_stack(&stack, 1, clock.now()));
    }
    let after = counting_alloc::allocations();
    println!(
        "allocations per decision: stack of 8: {}",
        (after - before) as f64 / N as f64
    );
}

/// The adaptive limit's per-request work: take a slot, then release it with
/// a 10 ms latency (a window closes every ten), `now` advanced by hand.
fn adaptive(c: &mut Criterion) {
    use tollgate::limit::adaptive::{Adaptive, Outcome, Params};
    let Ok(params) = Params::new(1, 1000, 100) else {
        return;
    };
    let mut state = Adaptive::new(params, 0);
    let mut now = 0;
    c.bench_function("adaptive/acquire_complete", |b| {
        b.iter(|| {
            now += 1_000;
            let admitted = state.try_acquire();
            state.on_complete(params, now, 10_000_000, Outcome::Success);
            black_box(admitted)
        })
    });
}

fn main() {
    report_allocations();
    let mut c = Criterion::default().configure_from_args();
    single_thread(&mut c);
    many_keys(&mut c);
    two_threads(&mut c);
    stacks(&mut c);
    adaptive(&mut c);
    c.final_summary();
}
