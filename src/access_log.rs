//! The access log: one `tracing` event per request on target
//! `tollgate::access` (so `TOLLGATE_LOG=tollgate::access=off` silences it and
//! `--log-format json` makes it one JSON object per line), and the sampler that
//! keeps a flood of denials from becoming a flood of log I/O.
//!
//! # What is logged, and what never is
//!
//! Method, path, route, status, duration (to the response's last byte: a
//! streamed response's line is written when its body ends), upstream and
//! client address; `queued_ms` for a request that waited before it was
//! forwarded (part of its duration); `trace_id` and `span_id` for a request
//! `[tracing]` recorded (its trace and server span). The
//! path is logged **without the query string**, and no header value or body
//! byte is ever logged: query parameters, headers and body fields are where API
//! keys and user names travel (they are limiter keys, see `limits.*.key`).
//!
//! # Denied requests
//!
//! `server.log_denied` decides how many 429s are logged: `"all"`, `"none"`, or
//! `"sample:N"` (one in every N, counted across the whole process). The
//! decision is one relaxed atomic increment, no lock, so the deny path stays
//! cheap under a flood.

use std::net::IpAddr;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::trace::context::{SpanId, TraceId};

/// The `tracing` target of access-log events.
pub(crate) const TARGET: &str = "tollgate::access";

/// `server.log_denied`: which denied requests get an access-log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum LogDenied {
    /// Every denied request (the default).
    #[default]
    All,
    /// One in every N denied requests.
    Sample(NonZeroU64),
    /// No denied request.
    None,
}

impl LogDenied {
    /// Parses `"all"`, `"none"` or `"sample:N"` (N ≥ 1); the error says what
    /// was expected.
    pub(crate) fn parse(text: &str) -> Result<LogDenied, String> {
        match text {
            "all" => Ok(LogDenied::All),
            "none" => Ok(LogDenied::None),
            _ => {
                let expected = "expected \"all\", \"none\" or \"sample:N\" (log one in every N denied requests, N ≥ 1)";
                let Some(n) = text.strip_prefix("sample:") else {
                    return Err(format!("unknown value `{text}`, {expected}"));
                };
                match n.trim().parse::<u64>().ok().and_then(NonZeroU64::new) {
                    Some(n) => Ok(LogDenied::Sample(n)),
                    None => Err(format!(
                        "`{text}`: N must be a whole number of at least 1; {expected}"
                    )),
                }
            }
        }
    }
}

/// Decides, per denied request, whether it gets an access-log line.
#[derive(Debug)]
pub(crate) struct DeniedSampler {
    policy: LogDenied,
    /// Denied requests seen so far (only counted under `Sample`).
    seen: AtomicU64,
}

impl DeniedSampler {
    pub(crate) fn new(policy: LogDenied) -> DeniedSampler {
        DeniedSampler {
            policy,
            seen: AtomicU64::new(0),
        }
    }

    /// Whether to log this denied request. Under `sample:N` the first denied
    /// request is logged, then every N-th after it.
    pub(crate) fn should_log_denied(&self) -> bool {
        match self.policy {
            LogDenied::All => true,
            LogDenied::None => false,
            LogDenied::Sample(n) => self
                .seen
                .fetch_add(1, Ordering::Relaxed)
                .is_multiple_of(n.get()),
        }
    }
}

/// What the access log records of one request.
#[derive(Debug)]
pub(crate) struct AccessEntry<'a> {
    /// `"-"` for a request refused before it was parsed (`refused`).
    pub(crate) method: &'a str,
    /// The path only; the query string is never logged.
    pub(crate) path: &'a str,
    /// The route's name, or `"none"`.
    pub(crate) route: &'a str,
    pub(crate) status: u16,
    /// `None` for a refused request: the codec times nothing.
    pub(crate) elapsed: Option<Duration>,
    /// The upstream a forwarding route sent to; `None` for answers of the
    /// gateway itself.
    pub(crate) upstream: Option<&'a str>,
    pub(crate) client_ip: IpAddr,
    /// The limit decision: the limit that denied, or on an allowed request
    /// the limit with the least remaining quota.
    pub(crate) limit: Option<LimitField<'a>>,
    /// Upstream retries made for the request (`retry` on its route).
    pub(crate) retries: u32,
    /// Why the HTTP/1.1 codec refused the request (a fixed text, never a
    /// byte of the request); `None` for a request the pipeline answered.
    pub(crate) refused: Option<&'a str>,
    /// The listener: `proxy`, or the decision service's `rls` / `auth`
    /// (the `front` label of the decision metrics).
    pub(crate) front: &'static str,
    /// A token route's reserved and used tokens.
    pub(crate) tokens: Option<&'a TokenTally>,
    /// How long an admitted request waited before it went on (a token
    /// bucket's `wait`, a leaky bucket's delay, a queue): `queued_ms`,
    /// only in the line of a request that waited.
    pub(crate) queued: Option<Duration>,
    /// A recorded request's trace and server span (`[tracing]`):
    /// `trace_id` and `span_id`, only in the line of a traced request.
    pub(crate) trace: Option<(TraceId, SpanId)>,
}

/// A token route's tokens, for its log line: what the request reserved,
/// and what its response reported using (set when the response ends,
/// before the line is written).
#[derive(Debug)]
pub(crate) struct TokenTally {
    pub(crate) reserved: u64,
    /// `u64::MAX` until known.
    used: AtomicU64,
}

impl TokenTally {
    pub(crate) fn new(reserved: u64) -> TokenTally {
        TokenTally {
            reserved,
            used: AtomicU64::new(u64::MAX),
        }
    }

    pub(crate) fn set_used(&self, used: u64) {
        self.used.store(used, Ordering::Relaxed);
    }

    pub(crate) fn used(&self) -> Option<u64> {
        Some(self.used.load(Ordering::Relaxed)).filter(|&used| used != u64::MAX)
    }
}

/// The limit part of an access-log line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LimitField<'a> {
    pub(crate) name: &'a str,
    pub(crate) remaining: u64,
    pub(crate) denied: bool,
}

/// The line of a request that is not over yet (its response body still
/// streaming from the upstream): an owned copy of its entry, logged when the
/// body ends with the request's whole duration.
#[derive(Debug)]
pub(crate) struct PendingLine {
    method: Box<str>,
    path: Box<str>,
    route: Box<str>,
    status: u16,
    upstream: Option<Box<str>>,
    client_ip: IpAddr,
    /// The limit's name, remaining and whether it denied.
    limit: Option<(Box<str>, u64, bool)>,
    retries: u32,
    /// Read when the line is written: the response's usage is known then.
    tokens: Option<Arc<TokenTally>>,
    queued: Option<Duration>,
    trace: Option<(TraceId, SpanId)>,
}

impl PendingLine {
    /// `entry` kept for later (its duration is the one `log` is given).
    /// Out of line: rare, and it allocates.
    #[cold]
    #[inline(never)]
    pub(crate) fn of(entry: &AccessEntry<'_>, tokens: Option<Arc<TokenTally>>) -> PendingLine {
        PendingLine {
            method: entry.method.into(),
            path: entry.path.into(),
            route: entry.route.into(),
            status: entry.status,
            upstream: entry.upstream.map(Into::into),
            client_ip: entry.client_ip,
            limit: entry.limit.map(|l| (l.name.into(), l.remaining, l.denied)),
            retries: entry.retries,
            tokens,
            queued: entry.queued,
            trace: entry.trace,
        }
    }

    /// Emits the line, the request having taken `elapsed` in all.
    pub(crate) fn log(&self, elapsed: Duration) {
        log(&AccessEntry {
            method: &self.method,
            path: &self.path,
            route: &self.route,
            status: self.status,
            elapsed: Some(elapsed),
            upstream: self.upstream.as_deref(),
            client_ip: self.client_ip,
            limit: self
                .limit
                .as_ref()
                .map(|(name, remaining, denied)| LimitField {
                    name,
                    remaining: *remaining,
                    denied: *denied,
                }),
            retries: self.retries,
            refused: None,
            front: "proxy",
            tokens: self.tokens.as_deref(),
            queued: self.queued,
            trace: self.trace,
        });
    }
}

/// Whether access-log events are recorded at all (the log filter may turn
/// them off): a request then need not keep what only its line would show.
pub(crate) fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::INFO)
}

/// Emits the access-log event of one request.
pub(crate) fn log(entry: &AccessEntry<'_>) {
    tracing::info!(
        target: TARGET,
        method = entry.method,
        path = entry.path,
        route = entry.route,
        status = entry.status,
        // Whole microseconds, shown in milliseconds: 0.011, not 0.011477000000000001.
        duration_ms = entry.elapsed.map(|e| e.as_micros() as f64 / 1000.0),
        upstream = entry.upstream.unwrap_or("-"),
        client_ip = %entry.client_ip,
        limit = entry.limit.map_or("-", |l| l.name),
        limit_remaining = entry.limit.map(|l| l.remaining),
        limit_denied = entry.limit.map(|l| l.denied),
        retries = entry.retries,
        refused = entry.refused,
        front = entry.front,
        tokens_reserved = entry.tokens.map(|t| t.reserved),
        tokens_used = entry.tokens.and_then(TokenTally::used),
        // Absent (not 0) for a request that did not wait.
        queued_ms = entry.queued.map(|q| q.as_micros() as f64 / 1000.0),
        // Absent for a request `[tracing]` did not record.
        trace_id = entry.trace.map(|(trace, _)| tracing::field::display(trace)),
        span_id = entry.trace.map(|(_, span)| tracing::field::display(span)),
        "request"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_denied_values_parse() {
        assert_eq!(LogDenied::parse("all"), Ok(LogDenied::All));
        assert_eq!(LogDenied::parse("none"), Ok(LogDenied::None));
        assert_eq!(
            LogDenied::parse("sample:100"),
            Ok(LogDenied::Sample(NonZeroU64::new(100).unwrap()))
        );
        for bad in [
            "sample:0",
            "sample:",
            "sample:x",
            "sample:-1",
            "some",
            "ALL",
            "",
        ] {
            let error = LogDenied::parse(bad).unwrap_err();
            assert!(error.contains("sample:N"), "{bad}: {error}");
        }
    }

    #[test]
    fn all_and_none_are_constant() {
        let all = DeniedSampler::new(LogDenied::All);
        let none = DeniedSampler::new(LogDenied::None);
        for _ in 0..10 {
            assert!(all.should_log_denied());
            assert!(!none.should_log_denied());
        }
    }

    #[test]
    fn sample_logs_one_in_n_starting_with_the_first() {
        let sampler = DeniedSampler::new(LogDenied::parse("sample:4").unwrap());
        let logged: Vec<bool> = (0..9).map(|_| sampler.should_log_denied()).collect();
        assert_eq!(
            logged,
            [true, false, false, false, true, false, false, false, true]
        );
        let one = DeniedSampler::new(LogDenied::parse("sample:1").unwrap());
        assert!((0..5).all(|_| one.should_log_denied()));
    }

    #[test]
    fn sample_counts_across_threads_without_losing_any() {
        let sampler =
            std::sync::Arc::new(DeniedSampler::new(LogDenied::parse("sample:10").unwrap()));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let sampler = sampler.clone();
                std::thread::spawn(move || {
                    (0..1000).filter(|_| sampler.should_log_denied()).count()
                })
            })
            .collect();
        let logged: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(logged, 400);
    }
}
