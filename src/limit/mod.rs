//! The limiter engine: rate-limit algorithms as pure decisions, the in-memory
//! store that applies them per key, and the all-or-nothing key stack.
//!
//! The life of a decision: the HTTP layer reads the [`Clock`] once, digests
//! the request's keys into [`LimitKey`]s, and calls [`check_stack`] with the
//! route's limits ([`Limiter`]s, shared as `Arc<Limiter>` outside the config
//! snapshot so that reloads keep state). The stack locks the keys' shards,
//! runs each limit's algorithm — a pure function of `(state, now, cost,
//! params)` in its own module — and commits all charges or none. The result
//! is a value ([`StackDecision`], one [`Verdict`] per limit): denial is not an
//! error. Header numbers come from [`quota`], [`window_secs`] and the verdicts.
//!
//! | algorithm | module | state per key |
//! | --- | --- | --- |
//! | `fixed_window` | [`fixed_window`] | window index + count |
//! | `sliding_window` | [`sliding_window`] | window index + two counts |
//! | `sliding_log` | [`sliding_log`] | `(timestamp, units)` runs |
//! | `token_bucket` | [`token_bucket`] | GCRA `tat` |
//! | `leaky_bucket` | [`leaky_bucket`] | GCRA `tat` (nginx `limit_req`) |
//! | `concurrency` | [`concurrency`] | in-flight count + permits |
//! | `adaptive` | [`adaptive`] (how the limit moves), [`adaptive_slot`] (per key, permits) | in flight, limit, baseline, window |
//!
//! A slot limit (`concurrency`) also applies the request's [`Priority`]
//! against its [`Reserve`] ([`priority`]) and may keep a waiting line
//! ([`queue`]) that its permits wake on release.
//!
//! Worked example: a token bucket of 20 refilled at 10/s, `now` = T. Twenty
//! requests at T pass (`r` 19 … 0); the 21st gets `allowed = false`,
//! `retry_after = Some(100 ms)`, and nothing is charged anywhere in its
//! stack. Each module doc works its own algorithm through.

pub mod adaptive;
pub(crate) mod adaptive_slot;
pub(crate) mod bucket;
pub(crate) mod calendar;
pub(crate) mod clock;
pub(crate) mod concurrency;
pub(crate) mod digest_hasher;
pub(crate) mod fixed_window;
pub(crate) mod key;
pub(crate) mod leaky_bucket;
pub(crate) mod memory;
pub(crate) mod params;
pub mod priority;
pub mod queue;
pub(crate) mod reservations;
pub mod sliding_log;
pub mod sliding_window;
pub(crate) mod stack;
pub(crate) mod table;
pub mod token_bucket;
pub(crate) mod verdict;

pub(crate) use adaptive_slot::UpstreamAnswer;
pub use clock::{Clock, ManualClock, SystemClock, TokioClock};
pub use key::LimitKey;
pub use memory::Limiter;
pub(crate) use params::WindowAlign;
pub use params::{Algorithm, LeakyMode, NANOS_PER_SEC, Nanos, Rate};
pub use priority::{Priority, Reserve};
pub use queue::{QueueParams, Shed, SlotQueue};
pub(crate) use stack::{EntryVerdict, Permits, StackDecision, check_stack_into};
pub use stack::{Outcome, StackEntry, check_stack};
pub(crate) use verdict::{Verdict, quota, quota_of, window_secs};
