//! The health of one upstream URL: passive (outlier detection from the
//! requests it serves), active (the checks the `check` module runs), and what
//! the log says about it.
//!
//! # Passive: ejection
//!
//! Each outcome of a request is recorded on its URL: a success clears the
//! run of failures; a failure of a kind in `eject.on` (a connection that
//! could not be opened or failed before its answer, a configured 5xx, no
//! head within `timeout` for `504`) lengthens it. After `after` failures in
//! a row the URL is ejected — it gets no new requests — for `base × n`,
//! capped at `max`, where n counts its ejections: the first for `base`, the
//! next for twice as long, and so on. Each `base` of service without an
//! ejection takes one off n, so a URL that failed once long ago starts over
//! at `base` (Envoy's outlier detection works the same way). When its time
//! is up the URL takes requests again, the run of failures starts from
//! zero, and a `slow_start` window ramps its share up. The upstream
//! ([`super::Upstream::record_failure`], [`super::Upstream::record_status`]) decides whether an ejection may happen at
//! all: never more than `max_ejected` of its list at once.
//!
//! # Active: checks
//!
//! With `health = {...}`, `unhealthy` failed checks in a row take the URL
//! down and `healthy` passed ones bring it back; a passed run also ends a
//! passive ejection early (the check says the URL answers again). A URL
//! starts up, or down with `start = "unhealthy"`.
//!
//! # Concurrency
//!
//! Every field is an atomic: a request reads two words to know whether the
//! URL takes requests and writes nothing on success unless a run of
//! failures was under way. Transitions (ejected, back, down, up) are
//! compare-and-swaps, so exactly one thread logs each.
//!
//! # The log
//!
//! A failing URL must not write a line per failed request (a dead
//! instance under load wrote 92,118 WARN lines in 30 s). The first failure
//! after a quiet spell is logged with its error, then each summary tick
//! ([`UrlHealth::summarise`], every 10 s) writes one line with the count,
//! and a quiet interval ends the spell with one line. Ejections, returns
//! and check transitions are one line each.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;

use crate::config::{EjectPolicy, HealthCheck};

/// Nanoseconds on the health clock ([`now`]).
pub(crate) type Nanos = u64;

/// The health clock: nanoseconds since its first reading in the process,
/// on tokio's clock (so a test's paused time moves it, as it moves the
/// upstream deadlines), never 0. The one place health reads the time;
/// everything else is handed `now`.
pub(crate) fn now() -> Nanos {
    static EPOCH: OnceLock<tokio::time::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(tokio::time::Instant::now);
    let elapsed = tokio::time::Instant::now().saturating_duration_since(epoch);
    u64::try_from(elapsed.as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

/// `now`, read at most once and only if needed (a request to URLs that are
/// all up never reads the clock).
#[derive(Debug, Default)]
pub(crate) struct LazyNow(Option<Nanos>);

impl LazyNow {
    pub(crate) fn at(now: Nanos) -> LazyNow {
        LazyNow(Some(now))
    }

    pub(crate) fn get(&mut self) -> Nanos {
        *self.0.get_or_insert_with(now)
    }
}

fn nanos(duration: Duration) -> Nanos {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// What went wrong with one request on a URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// No connection could be opened (refused, unreachable, connect timeout,
    /// failed TLS handshake): nothing was sent.
    Connect,
    /// The connection failed before the response head, or the head broke
    /// HTTP/1.1.
    Reset,
    /// No response head within the upstream's `timeout`.
    Timeout,
    /// The upstream answered this status (one of `eject.on`).
    Status(u16),
}

impl Failure {
    /// Whether `policy` counts this failure towards an ejection.
    pub(crate) fn counts(self, policy: &EjectPolicy) -> bool {
        match self {
            Failure::Connect | Failure::Reset => policy.on_connect,
            Failure::Timeout => policy.fails_on(504),
            Failure::Status(status) => policy.fails_on(status),
        }
    }

    /// What happened, for a log line without an error to show.
    fn describe(self) -> String {
        match self {
            Failure::Connect => "no connection could be opened".to_owned(),
            Failure::Reset => "the connection failed before an answer".to_owned(),
            Failure::Timeout => "no response head within the upstream's timeout".to_owned(),
            Failure::Status(status) => format!("the URL answered {status}"),
        }
    }

    /// The `reason` label of an ejection, and the log's word for it.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Failure::Connect => "connect",
            Failure::Reset => "reset",
            Failure::Timeout => "timeout",
            Failure::Status(status) => status_text(status),
        }
    }
}

/// A 5xx status as a `&'static str` label (the statuses `eject.on` takes).
fn status_text(status: u16) -> &'static str {
    const TEXT: [&str; 12] = [
        "500", "501", "502", "503", "504", "505", "506", "507", "508", "509", "510", "511",
    ];
    status
        .checked_sub(500)
        .and_then(|i| TEXT.get(usize::from(i)))
        .copied()
        .unwrap_or("5xx")
}

/// The result of one active check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CheckResult {
    Pass,
    /// Answered, with a status not in `expect`.
    Status(u16),
    /// No connection, or it failed before an answer.
    Connect,
    /// No answer within the check's `timeout`.
    Timeout,
}

impl CheckResult {
    /// The `result` label of `tollgate_upstream_health_checks_total`.
    pub(crate) fn label(self) -> &'static str {
        match self {
            CheckResult::Pass => "pass",
            CheckResult::Status(_) => "fail_status",
            CheckResult::Connect => "fail_connect",
            CheckResult::Timeout => "fail_timeout",
        }
    }
}

/// Where a URL's health shows outside the upstream layer: its metric
/// series, made by the layer that owns the metrics.
pub(crate) struct HealthSignals {
    /// `tollgate_upstream_healthy{upstream,url}`: 1 while the URL takes
    /// requests.
    pub(crate) healthy: Gauge,
    /// Counts an ejection (or a URL taken down by its checks) by reason.
    pub(crate) ejected: Box<dyn Fn(&'static str) + Send + Sync>,
    /// Counts a check's result by label ([`CheckResult::label`]).
    pub(crate) checked: Box<dyn Fn(&'static str) + Send + Sync>,
}

impl HealthSignals {
    /// Signals that go nowhere (tools and unit tests without metrics).
    pub(crate) fn none() -> HealthSignals {
        HealthSignals {
            healthy: Gauge::default(),
            ejected: Box::new(|_| {}),
            checked: Box::new(|_| {}),
        }
    }
}

impl std::fmt::Debug for HealthSignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthSignals").finish_non_exhaustive()
    }
}

/// The state of one URL of one upstream, shared by every snapshot whose
/// configuration lists it (so kept across reloads).
#[derive(Debug)]
pub(crate) struct UrlHealth {
    /// The upstream's name and the URL, for the log.
    pub(crate) upstream: Arc<str>,
    pub(crate) url: Arc<str>,
    /// Failures in a row of the kinds `eject.on` names.
    consecutive: AtomicU32,
    /// Ejected until this time; 0 when not ejected.
    ejected_until: AtomicU64,
    /// Ejections so far, less one per `base` served since (the `n` of
    /// `base × n`).
    ejections: AtomicU32,
    /// When the URL last came back (from an ejection or a failed check);
    /// 0 if it never left. Ejections decay from here.
    returned_at: AtomicU64,
    /// When its slow start began; 0 when it has its full share.
    ramp_from: AtomicU64,
    /// Down by its active checks.
    checked_down: AtomicBool,
    /// Passed and failed checks in a row (one of them is always 0).
    check_passes: AtomicU32,
    check_failures: AtomicU32,
    /// Requests in flight (for `least_request`; untouched otherwise).
    in_flight: AtomicU32,
    /// A spell of failures is being logged: the first failure was written,
    /// the summary tick writes the rest.
    failing: AtomicBool,
    /// Failures since the last summary.
    failures: AtomicU64,
    signals: HealthSignals,
}

impl UrlHealth {
    /// A URL's state as configured: up, unless its checks start it down.
    pub(crate) fn new(
        upstream: Arc<str>,
        url: Arc<str>,
        health: Option<&HealthCheck>,
        signals: HealthSignals,
    ) -> UrlHealth {
        let down = health.is_some_and(|check| !check.start_healthy);
        signals.healthy.set(i64::from(!down));
        UrlHealth {
            upstream,
            url,
            consecutive: AtomicU32::new(0),
            ejected_until: AtomicU64::new(0),
            ejections: AtomicU32::new(0),
            returned_at: AtomicU64::new(0),
            ramp_from: AtomicU64::new(0),
            checked_down: AtomicBool::new(down),
            check_passes: AtomicU32::new(0),
            check_failures: AtomicU32::new(0),
            in_flight: AtomicU32::new(0),
            failing: AtomicBool::new(false),
            failures: AtomicU64::new(0),
            signals,
        }
    }

    /// Whether the URL takes new requests. An ejection whose time is up
    /// ends here (the URL comes back).
    pub(crate) fn is_available(&self, now: &mut LazyNow) -> bool {
        if self.checked_down.load(Ordering::Relaxed) {
            return false;
        }
        let until = self.ejected_until.load(Ordering::Relaxed);
        if until == 0 {
            return true;
        }
        let now = now.get();
        if now < until {
            return false;
        }
        self.end_ejection(until, now, "its ejection is over");
        true
    }

    /// Out of service now: down by its checks, or ejected (an ejection that
    /// is over is ended).
    pub(crate) fn is_out(&self, now: Nanos) -> bool {
        !self.is_available(&mut LazyNow::at(now))
    }

    /// Whether the URL is ejected (passively) at `now`.
    pub(crate) fn is_ejected(&self, now: Nanos) -> bool {
        let until = self.ejected_until.load(Ordering::Relaxed);
        until != 0 && now < until
    }

    /// The share of requests the URL takes now, in thousandths: 1000, or
    /// less during its slow start (linear from 10 %).
    pub(crate) fn weight(&self, slow_start: Option<Duration>, now: &mut LazyNow) -> u64 {
        let Some(window) = slow_start else {
            return 1000;
        };
        let from = self.ramp_from.load(Ordering::Relaxed);
        if from == 0 {
            return 1000;
        }
        let elapsed = now.get().saturating_sub(from);
        let window = nanos(window).max(1);
        if elapsed >= window {
            let _ = self
                .ramp_from
                .compare_exchange(from, 0, Ordering::Relaxed, Ordering::Relaxed);
            return 1000;
        }
        (u128::from(elapsed) * 1000 / u128::from(window)).max(100) as u64
    }

    /// Requests in flight (`least_request`).
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn begin_request(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn end_request(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// A request that did not fail: the run of failures, if any, ends.
    /// Writes nothing in the common case (no run under way).
    pub(crate) fn record_success(&self) {
        if self.consecutive.load(Ordering::Relaxed) != 0 {
            self.consecutive.store(0, Ordering::Relaxed);
        }
    }

    /// A failed request, with its error if there is one (for the log).
    /// Returns the run of failures that count towards an ejection under
    /// `policy` (0 if this one does not count).
    pub(crate) fn record_failure(
        &self,
        failure: Failure,
        policy: &EjectPolicy,
        error: Option<&(dyn std::error::Error + 'static)>,
    ) -> u32 {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::Relaxed) {
            // The first failure of a spell: logged whole, once.
            match error {
                Some(error) => tracing::warn!(
                    upstream = %self.upstream,
                    url = %self.url,
                    kind = failure.reason(),
                    error = %error_chain(error),
                    "upstream error; further failures of this URL are counted and summarised every {}s",
                    SUMMARY_SECONDS
                ),
                None => tracing::warn!(
                    upstream = %self.upstream,
                    url = %self.url,
                    kind = failure.reason(),
                    "upstream error: {}; further failures of this URL are counted and summarised every {}s",
                    failure.describe(),
                    SUMMARY_SECONDS
                ),
            }
        }
        if !failure.counts(policy) {
            return 0;
        }
        self.consecutive.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Ejects the URL at `now` under `policy` for `failure`; the caller has
    /// checked `max_ejected`. Returns how long, or `None` if it already was
    /// ejected (another request got there first).
    pub(crate) fn eject(
        &self,
        failure: Failure,
        policy: &EjectPolicy,
        now: Nanos,
    ) -> Option<Duration> {
        let base = nanos(policy.base).max(1);
        let returned = self.returned_at.load(Ordering::Relaxed);
        let served = if returned == 0 {
            0
        } else {
            now.saturating_sub(returned)
        };
        let previous = self.ejections.load(Ordering::Relaxed);
        let decayed = u64::from(previous).saturating_sub(served / base);
        let n = decayed.saturating_add(1).min(u64::from(u32::MAX));
        let length = ejection_length(policy, n);
        let current = self.ejected_until.load(Ordering::Relaxed);
        if current != 0 && now < current {
            return None;
        }
        let until = now.saturating_add(nanos(length)).max(1);
        if self
            .ejected_until
            .compare_exchange(current, until, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        self.ejections.store(n as u32, Ordering::Relaxed);
        self.consecutive.store(0, Ordering::Relaxed);
        self.signals.healthy.set(0);
        (self.signals.ejected)(failure.reason());
        tracing::warn!(
            upstream = %self.upstream,
            url = %self.url,
            reason = failure.reason(),
            seconds = length.as_secs_f64(),
            ejections = n,
            "upstream URL ejected: no requests for {:?} (failures in a row: {}, the last: {})",
            length,
            policy.after,
            failure.reason()
        );
        Some(length)
    }

    /// Ends the ejection that was to last `until`, if nobody else did;
    /// `why` for the log.
    fn end_ejection(&self, until: Nanos, now: Nanos, why: &str) {
        if self
            .ejected_until
            .compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        self.come_back(now);
        tracing::info!(
            upstream = %self.upstream,
            url = %self.url,
            "upstream URL back in service: {why}"
        );
    }

    /// The URL takes requests again: a fresh run, a slow start.
    fn come_back(&self, now: Nanos) {
        self.consecutive.store(0, Ordering::Relaxed);
        self.returned_at.store(now, Ordering::Relaxed);
        self.ramp_from.store(now, Ordering::Relaxed);
        let up = !self.checked_down.load(Ordering::Relaxed) && !self.is_ejected(now);
        self.signals.healthy.set(i64::from(up));
    }

    /// Records one active check's result under `check`.
    pub(crate) fn record_check(&self, result: CheckResult, check: &HealthCheck, now: Nanos) {
        (self.signals.checked)(result.label());
        if result == CheckResult::Pass {
            self.check_failures.store(0, Ordering::Relaxed);
            let passes = self.check_passes.fetch_add(1, Ordering::Relaxed) + 1;
            if passes < check.healthy {
                return;
            }
            if self.checked_down.swap(false, Ordering::Relaxed) {
                self.come_back(now);
                tracing::info!(
                    upstream = %self.upstream,
                    url = %self.url,
                    "upstream URL up: {} health checks in a row passed",
                    check.healthy
                );
            }
            let until = self.ejected_until.load(Ordering::Relaxed);
            if until != 0 && now < until {
                // The checks say it answers again: the ejection ends early.
                self.end_ejection(until, now, "its health checks pass");
            }
            return;
        }
        self.check_passes.store(0, Ordering::Relaxed);
        let failures = self.check_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= check.unhealthy && !self.checked_down.swap(true, Ordering::Relaxed) {
            self.signals.healthy.set(0);
            (self.signals.ejected)("health_check");
            let detail = match result {
                CheckResult::Status(status) => format!("answered {status}"),
                CheckResult::Connect => "no connection".to_owned(),
                CheckResult::Timeout => format!("no answer within {:?}", check.timeout),
                CheckResult::Pass => String::new(),
            };
            tracing::warn!(
                upstream = %self.upstream,
                url = %self.url,
                result = result.label(),
                "upstream URL down: {} health checks in a row failed (last: {detail})",
                check.unhealthy
            );
        }
    }

    /// The URL is no longer checked (its `health` was removed by a
    /// reload): what the checks said no longer holds.
    pub(crate) fn forget_checks(&self, now: Nanos) {
        self.check_passes.store(0, Ordering::Relaxed);
        self.check_failures.store(0, Ordering::Relaxed);
        if self.checked_down.swap(false, Ordering::Relaxed) {
            self.come_back(now);
        }
    }

    /// The summary tick: ends an ejection whose time is up (so the gauge
    /// and the log do not wait for a request), and writes the spell's line
    /// — the count of failures since the last tick, or that there were none
    /// (which ends the spell).
    pub(crate) fn summarise(&self, now: Nanos) {
        let _ = self.is_out(now);
        if !self.failing.load(Ordering::Relaxed) {
            return;
        }
        let failures = self.failures.swap(0, Ordering::Relaxed);
        if failures == 0 {
            self.failing.store(false, Ordering::Relaxed);
            tracing::info!(
                upstream = %self.upstream,
                url = %self.url,
                "upstream URL: no failed requests in the last {}s",
                SUMMARY_SECONDS
            );
            return;
        }
        tracing::warn!(
            upstream = %self.upstream,
            url = %self.url,
            failures,
            ejected = self.is_ejected(now),
            "upstream URL failing: {failures} failed requests in the last {}s",
            SUMMARY_SECONDS
        );
    }
}

/// Seconds between summary lines: the gateway's sweep interval, which runs
/// the summary (the gateway's sweeper, `app::sweep`, calls `App::sweep`).
pub(crate) const SUMMARY_SECONDS: u64 = 10;

/// How long the `n`-th ejection lasts: `base × n`, at most `max`.
pub(crate) fn ejection_length(policy: &EjectPolicy, n: u64) -> Duration {
    let factor = u32::try_from(n).unwrap_or(u32::MAX);
    policy.base.saturating_mul(factor).min(policy.max)
}

/// `error: cause: cause` for logs, keeping the whole source chain.
pub(crate) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = 1_000_000_000;

    fn policy() -> EjectPolicy {
        EjectPolicy {
            after: 3,
            base: Duration::from_secs(10),
            max: Duration::from_secs(35),
            ..EjectPolicy::default()
        }
    }

    fn url() -> UrlHealth {
        UrlHealth::new("api".into(), "http://a".into(), None, HealthSignals::none())
    }

    fn check() -> HealthCheck {
        HealthCheck {
            path: http::uri::PathAndQuery::from_static("/healthz"),
            interval: Duration::from_secs(5),
            timeout: Duration::from_secs(1),
            healthy: 2,
            unhealthy: 3,
            expect: vec![(200, 399)],
            start_healthy: true,
        }
    }

    #[test]
    fn ejections_grow_by_base_and_stop_at_max() {
        let p = policy();
        assert_eq!(ejection_length(&p, 1), Duration::from_secs(10));
        assert_eq!(ejection_length(&p, 3), Duration::from_secs(30));
        assert_eq!(ejection_length(&p, 4), Duration::from_secs(35));
        assert_eq!(ejection_length(&p, u64::MAX), Duration::from_secs(35));
    }

    #[test]
    fn a_run_of_counted_failures_ejects_and_a_success_breaks_it() {
        let (p, h) = (policy(), url());
        assert_eq!(h.record_failure(Failure::Connect, &p, None), 1);
        assert_eq!(h.record_failure(Failure::Status(503), &p, None), 2);
        h.record_success();
        assert_eq!(h.record_failure(Failure::Timeout, &p, None), 1);
        // 500 is not in the default `on`: logged, not counted.
        assert_eq!(h.record_failure(Failure::Status(500), &p, None), 0);
        assert_eq!(h.record_failure(Failure::Reset, &p, None), 2);
        let t0 = 100 * S;
        assert!(h.is_available(&mut LazyNow::at(t0)));
        assert_eq!(
            h.eject(Failure::Reset, &p, t0),
            Some(Duration::from_secs(10))
        );
        assert_eq!(h.eject(Failure::Reset, &p, t0 + 1), None, "already ejected");
        assert!(!h.is_available(&mut LazyNow::at(t0 + 10 * S - 1)));
        assert!(h.is_available(&mut LazyNow::at(t0 + 10 * S)));
        assert!(!h.is_ejected(t0 + 10 * S));
    }

    #[test]
    fn a_url_that_fails_again_soon_is_ejected_longer_and_decays_back() {
        let (p, h) = (policy(), url());
        let mut t = 100 * S;
        assert_eq!(
            h.eject(Failure::Connect, &p, t),
            Some(Duration::from_secs(10))
        );
        t += 10 * S;
        assert!(h.is_available(&mut LazyNow::at(t)));
        t += S;
        assert_eq!(
            h.eject(Failure::Connect, &p, t),
            Some(Duration::from_secs(20))
        );
        t += 20 * S;
        assert!(h.is_available(&mut LazyNow::at(t)));
        assert_eq!(
            h.eject(Failure::Connect, &p, t),
            Some(Duration::from_secs(30))
        );
        t += 30 * S;
        assert!(h.is_available(&mut LazyNow::at(t)));
        // Capped at `max`.
        assert_eq!(
            h.eject(Failure::Connect, &p, t),
            Some(Duration::from_secs(35))
        );
        t += 35 * S;
        assert!(h.is_available(&mut LazyNow::at(t)));
        // 25 s of service take two ejections off n (4 → 2): the next is 30 s.
        t += 25 * S;
        assert_eq!(
            h.eject(Failure::Connect, &p, t),
            Some(Duration::from_secs(30))
        );
        t += 30 * S;
        assert!(h.is_available(&mut LazyNow::at(t)));
        // A long healthy spell: back to `base`.
        t += 1000 * S;
        assert_eq!(
            h.eject(Failure::Connect, &p, t),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn checks_take_a_url_down_and_bring_it_back_and_end_an_ejection() {
        let (c, h) = (check(), url());
        let t = 100 * S;
        h.record_check(CheckResult::Timeout, &c, t);
        h.record_check(CheckResult::Connect, &c, t);
        h.record_check(CheckResult::Pass, &c, t);
        assert!(!h.is_out(t), "a pass breaks the run of failures");
        for _ in 0..3 {
            h.record_check(CheckResult::Status(500), &c, t);
        }
        assert!(h.is_out(t));
        h.record_check(CheckResult::Pass, &c, t);
        assert!(h.is_out(t), "one pass of two");
        h.record_check(CheckResult::Pass, &c, t);
        assert!(!h.is_out(t));
        // Passing checks end a passive ejection early.
        h.eject(Failure::Status(503), &policy(), t);
        assert!(h.is_out(t + S));
        h.record_check(CheckResult::Pass, &c, t + S);
        h.record_check(CheckResult::Pass, &c, t + 2 * S);
        assert!(!h.is_out(t + 2 * S));
        // Starting down: out until `healthy` passes.
        let start_down = HealthCheck {
            start_healthy: false,
            ..check()
        };
        let h = UrlHealth::new(
            "api".into(),
            "u".into(),
            Some(&start_down),
            HealthSignals::none(),
        );
        assert!(h.is_out(t));
        h.record_check(CheckResult::Pass, &start_down, t);
        h.record_check(CheckResult::Pass, &start_down, t);
        assert!(!h.is_out(t));
    }

    #[test]
    fn slow_start_ramps_from_a_tenth_to_the_full_share() {
        let h = url();
        let window = Some(Duration::from_secs(10));
        let t = 100 * S;
        assert_eq!(h.weight(window, &mut LazyNow::at(t)), 1000, "never left");
        h.eject(Failure::Connect, &policy(), t);
        let back = t + 10 * S;
        assert!(h.is_available(&mut LazyNow::at(back)));
        assert_eq!(h.weight(window, &mut LazyNow::at(back)), 100);
        assert_eq!(h.weight(window, &mut LazyNow::at(back + 5 * S)), 500);
        assert_eq!(h.weight(window, &mut LazyNow::at(back + 10 * S)), 1000);
        assert_eq!(h.weight(None, &mut LazyNow::at(back)), 1000);
    }
}
