//! Memory per live key: RSS growth while 1,000,000 distinct keys go through
//! one in-process limiter, next to governor's keyed limiter as the peer.
//!
//! Each case runs in a child process of its own (this binary re-executed with
//! `TOLLGATE_MEMORY_CASE` set), so one case's freed tables cannot hide or
//! inflate the next one's growth. A case reads `VmRSS` from
//! `/proc/self/status` before the first key and after every 100,000 keys,
//! then prints the growth and bytes per key. Every key is charged once at the
//! same instant, so none is fresh again (nothing could be swept): all
//! 1,000,000 are live at the end.
//!
//! hashbrown tables double when 7/8 full, so bytes per key is a sawtooth over
//! the key count; the checkpoints show where 1,000,000 falls on it.
//!
//! Run: `cargo bench --bench memory`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::process::Command;

use governor::{Quota, RateLimiter};
use tollgate::limit::{Algorithm, LimitKey, Limiter, NANOS_PER_SEC, Rate, StackEntry, check_stack};

const KEYS: u64 = 1_000_000;
const CHECKPOINT: u64 = 100_000;
const CASES: [&str; 3] = ["token_bucket", "sliding_window", "governor_keyed"];

/// Resident set size of this process, in bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .expect("VmRSS line")
        * 1024
}

/// The key of client `i`: a digest, as the identity layer would make it.
fn key(i: u64) -> LimitKey {
    LimitKey::digest(&[&i.to_le_bytes()])
}

/// Drives `KEYS` distinct keys through `charge`; prints a row per checkpoint.
fn drive(case: &str, mut charge: impl FnMut(u64)) {
    let base = rss_bytes();
    for i in 0..KEYS {
        charge(i);
        let n = i + 1;
        if n % CHECKPOINT == 0 {
            let grown = rss_bytes().saturating_sub(base);
            println!(
                "{case:>16} {n:>9} keys  RSS +{:>7.1} MiB  {:>6.1} B/key",
                grown as f64 / (1024.0 * 1024.0),
                grown as f64 / n as f64
            );
        }
    }
}

fn run_case(case: &str) {
    let now = 1_700_000_000 * NANOS_PER_SEC;
    match case {
        "token_bucket" | "sliding_window" => {
            let algorithm = if case == "token_bucket" {
                Algorithm::TokenBucket {
                    capacity: 100,
                    refill: Rate {
                        tokens: 1,
                        per: 60 * NANOS_PER_SEC,
                    },
                    wait: 0,
                }
            } else {
                Algorithm::SlidingWindow {
                    limit: 100,
                    window: 60 * NANOS_PER_SEC,
                }
            };
            let limiter = Limiter::new(case, algorithm, 2 * KEYS as usize);
            drive(case, |i| {
                let entry = StackEntry {
                    limiter: &limiter,
                    key: Some(key(i)),
                    shadow: false,
                };
                let decision = check_stack(&[entry], 1, now);
                debug_assert!(decision.allowed);
                black_box(decision);
            });
            assert_eq!(limiter.live_keys() as u64, KEYS, "every key is live");
        }
        "governor_keyed" => {
            // The same 100 per minute, keyed by the same 128-bit digests.
            let quota = Quota::per_minute(NonZeroU32::new(100).unwrap());
            let limiter = RateLimiter::<u128, _, _>::keyed(quota);
            drive(case, |i| {
                black_box(limiter.check_key(&key(i).as_u128()).is_ok());
            });
            assert_eq!(limiter.len() as u64, KEYS, "every key is live");
        }
        other => panic!("unknown case {other}"),
    }
}

fn main() {
    if let Ok(case) = std::env::var("TOLLGATE_MEMORY_CASE") {
        run_case(&case);
        return;
    }
    let exe = std::env::current_exe().expect("current exe");
    println!("RSS growth for {KEYS} distinct keys (one child process per case)");
    for case in CASES {
        let status = Command::new(&exe)
            .env("TOLLGATE_MEMORY_CASE", case)
            .status()
            .expect("run case");
        assert!(status.success(), "case {case} failed");
    }
}
