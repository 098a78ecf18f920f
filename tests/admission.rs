//! The admission layer on its own, without a socket: a configuration
//! loaded into an [`App`] on a [`ManualClock`], request heads built with
//! `http::Request::builder`, and `admission::admit_request` (or
//! `decide_request`, or `settle`) called directly. Each test reads what was decided from the
//! ticket (every entry's outcome and remaining, the limit that denied, the
//! focus) and what was charged from a later decision, from `explain` (a
//! memory limiter's state, charging nothing), from the metrics, or from
//! the real `redis-server` the shared tier runs on.
//!
//! Covered: the memory tier all or nothing, shadow limits, each
//! `on_missing_key`, plans, the two tiers on Redis (a shared denial refunds
//! the local charge), leases, `cost_header` settlement in memory and in
//! Redis, and each `on_failure` with a store nobody answers or one the test
//! kills and restarts.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use http::request::Parts;
use tollgate::admission::body::{BodyError, PendingBody};
use tollgate::admission::explain::explain;
use tollgate::admission::{self, Admission, Client, RequestAdmission, RequestBody, Routed, Ticket};
use tollgate::app::{App, Snapshot};
use tollgate::config::Config;
use tollgate::http1::server::ClientBody;
use tollgate::limit::{ManualClock, NANOS_PER_SEC, Nanos, Outcome};

use common::redis::{Redis, free_port};

use Outcome::{Allowed, Denied, DeniedByOther, ShadowDenied, Skipped};

/// The limiters' time at start: not on an hour's boundary, so that a
/// `1h` window ends only when a test moves the clock past it.
const START: Nanos = 1_700_000_000 * NANOS_PER_SEC;

const HOUR: Nanos = 3_600 * NANOS_PER_SEC;

/// The TCP peer of every request (no proxy is trusted: it is the client).
const PEER: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 7));

/// `explain`'s key for [`PEER`] on an `ip` limit.
const PEER_KEY: &str = "key=192.0.2.7";

/// A gateway's state without its listeners, on a clock the test moves.
struct Gate {
    app: Arc<App>,
    clock: Arc<ManualClock>,
}

/// `store` (a `[store]` table or nothing) and `body` (limits, routes,
/// consumers) with a server and an upstream `api` that is never called.
fn gate(store: &str, body: &str) -> Gate {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n{store}\n\n\
         [upstreams.api]\nurl = \"http://127.0.0.1:9\"\n\n{body}"
    );
    let config = Config::from_bytes(Path::new("gateway.toml"), text.as_bytes())
        .unwrap_or_else(|error| panic!("{error}"));
    let clock = Arc::new(ManualClock::new(START));
    let app = App::with_clock(config, clock.clone());
    Gate { app, clock }
}

/// `[store]` on the Redis at `url`, with `extra` keys. A patient
/// `timeout`: on a loaded machine a slow answer must not read as an
/// outage.
fn redis_store(url: &str, extra: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{url}\"\nprefix = \"tg:\"\ntimeout = \"1s\"\n{extra}"
    )
}

/// `[store]` on a port nobody listens on: the breaker is open from the
/// start (the store's first connection is refused), so every call fails
/// at once and `on_failure` applies.
fn dead_store(extra: &str) -> String {
    redis_store(&format!("redis://127.0.0.1:{}", free_port()), extra)
}

/// A request head for `path` with `headers`.
fn head(path: &str, headers: &[(&str, &str)]) -> Parts {
    let mut request = http::Request::builder().uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(()).expect("a request head").into_parts().0
}

/// `parts` routed as the proxy routes it: its route, [`PEER`] as the TCP
/// peer, no body, the clock's now.
fn routed<'r, 's>(app: &App, snapshot: &'s Snapshot, parts: &'r Parts) -> Routed<'r, 's> {
    let route = snapshot.router.find(parts).expect("a route matches");
    Routed {
        route: &snapshot.config.routes[route],
        plan: &snapshot.routes[route],
        parts,
        client: Client::Peer(PEER),
        body: RequestBody::Absent,
        now: app.clock.now(),
    }
}

/// The stack's part of a request's answer; a caller or body refused is a
/// test's mistake here.
fn decided(answer: RequestAdmission) -> Admission {
    match answer {
        RequestAdmission::Admitted { .. } => Admission::Allowed,
        RequestAdmission::Denied { by } => Admission::Denied { by },
        RequestAdmission::MissingKey { position } => Admission::MissingKey { position },
        RequestAdmission::StoreDown => Admission::StoreDown,
        refused => panic!("refused before the limits: {refused:?}"),
    }
}

/// What one decision left in its ticket, owned.
#[derive(Debug)]
struct Seen {
    admission: Admission,
    /// Each limit's outcome and remaining, in stack order.
    entries: Vec<(Outcome, u64)>,
    focus: Option<usize>,
    plan: Option<String>,
}

fn seen(admission: Admission, ticket: &Ticket<'_>) -> Seen {
    Seen {
        admission,
        entries: ticket
            .entries()
            .iter()
            .map(|e| (e.outcome, e.verdict.remaining))
            .collect(),
        focus: ticket.focus(),
        plan: ticket.plan().map(str::to_owned),
    }
}

/// `admit_request` on a stack the memory tier decides: its future must be
/// ready at its first poll, without the store.
fn at_once(app: &App, path: &str, headers: &[(&str, &str)]) -> Seen {
    let snapshot = app.snapshot();
    let parts = head(path, headers);
    let mut ticket = Ticket::default();
    // In a block: the future borrows the ticket until it is dropped.
    let decided = {
        let admitting =
            admission::admit_request(app, &snapshot, routed(app, &snapshot, &parts), &mut ticket);
        let mut context = Context::from_waker(Waker::noop());
        match pin!(admitting).poll(&mut context) {
            Poll::Ready(answer) => Some(decided(answer)),
            Poll::Pending => None,
        }
    };
    let admission =
        decided.unwrap_or_else(|| panic!("{path}: a memory-only stack waits for the store"));
    seen(admission, &ticket)
}

/// `admit_request` awaited: the shared tier's path.
async fn ask(app: &App, path: &str, headers: &[(&str, &str)]) -> Seen {
    let snapshot = app.snapshot();
    let parts = head(path, headers);
    let mut ticket = Ticket::default();
    let answer =
        admission::admit_request(app, &snapshot, routed(app, &snapshot, &parts), &mut ticket).await;
    seen(decided(answer), &ticket)
}

/// An admitted request to `path` settled with `reported` as its
/// `cost_header` value; what admission said.
async fn admit_and_settle(
    app: &App,
    path: &str,
    headers: &[(&str, &str)],
    reported: Option<&[u8]>,
) -> Seen {
    let snapshot = app.snapshot();
    let parts = head(path, headers);
    let mut ticket = Ticket::default();
    let routed = routed(app, &snapshot, &parts);
    let route = snapshot.router.find(&parts).expect("a route");
    let cost = routed.route.cost;
    let admission = decided(admission::admit_request(app, &snapshot, routed, &mut ticket).await);
    assert_eq!(admission, Admission::Allowed, "{path}");
    admission::settle(app, &snapshot, route, cost, &ticket, reported);
    seen(admission, &ticket)
}

/// `limit`'s remaining for the key `query` names (`key=V[&plan=P]`), as
/// `GET /limits/NAME` on the admin listener answers it: nothing charged.
fn remaining(app: &App, limit: &str, query: &str) -> u64 {
    explain_field(app, limit, query, "remaining")
        .as_u64()
        .expect("remaining is a number")
}

fn explain_field(app: &App, limit: &str, query: &str, field: &str) -> serde_json::Value {
    let snapshot = app.snapshot();
    // Without a store every state is in memory: the answer is ready at once.
    let explained = std::pin::pin!(explain(
        &snapshot,
        None,
        limit,
        Some(query),
        app.clock.now()
    ));
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    let std::task::Poll::Ready(answer) = explained.poll(&mut context) else {
        panic!("explain {limit}?{query} waited without a store");
    };
    let answer = answer.unwrap_or_else(|error| panic!("explain {limit}?{query}: {error:?}"));
    answer[field].clone()
}

/// `tollgate_ratelimit_decisions_total{route, limit, outcome}`.
fn decisions(app: &App, route: &str, limit: &str, outcome: &str) -> f64 {
    metrics(app).count(
        "tollgate_ratelimit_decisions_total",
        &[
            ("route", route),
            ("limit", limit),
            ("outcome", outcome),
            ("front", "proxy"),
        ],
    )
}

fn metrics(app: &App) -> common::openmetrics::Exposition {
    common::openmetrics::parse(&app.metrics().encode()).expect("a valid exposition")
}

/// How many `EVALSHA` calls Redis ran since the last `CONFIG RESETSTAT`.
fn evalsha_calls(redis: &Redis) -> u64 {
    redis
        .cli(&["INFO", "commandstats"])
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The Redis key of a shared fixed window `limit` for the key `query`
/// names: the digest `explain` reports is the one Redis stores it under.
fn window_key(app: &App, limit: &str, query: &str) -> String {
    let digest = explain_field(app, limit, query, "digest");
    format!("tg:{limit}:{{{}}}:fw", digest.as_str().expect("a digest"))
}

/// Waits (polling, with a generous deadline) until the fixed window `key`
/// counts `count`: settlements go to Redis after the response.
async fn wait_for_count(redis: &Redis, key: &str, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.try_count(key) != Some(count) {
        assert!(
            Instant::now() < deadline,
            "{key} counts {:?}, not {count}",
            redis.try_count(key)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

const PER_KEY_AND_IP: &str = r#"
[limits.per_key]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 2
window = "1h"

[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 5
window = "1h"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200, body = "ok" }
limits = ["per_key", "per_ip"]
"#;

#[test]
fn a_stack_is_denied_by_its_first_refusing_limit_and_charges_none() {
    let Gate { app, clock } = gate("", PER_KEY_AND_IP);
    let a = [("x-api-key", "a")];
    let first = at_once(&app, "/", &a);
    assert_eq!(first.admission, Admission::Allowed);
    assert_eq!(first.entries, [(Allowed, 1), (Allowed, 4)]);
    // 1/2 left of per_key against 4/5 of per_ip.
    assert_eq!(first.focus, Some(0));
    assert_eq!(at_once(&app, "/", &a).entries, [(Allowed, 0), (Allowed, 3)]);

    // per_key refuses: per_ip would have admitted and shows its state
    // uncharged.
    let denied = at_once(&app, "/", &a);
    assert_eq!(denied.admission, Admission::Denied { by: 0 });
    assert_eq!(denied.entries, [(Denied, 0), (DeniedByOther, 3)]);
    assert_eq!(denied.focus, None);
    assert_eq!(remaining(&app, "per_ip", PEER_KEY), 3);

    // Other keys: per_ip runs out first, and the focus follows the least r/q.
    let b = at_once(&app, "/", &[("x-api-key", "b")]);
    assert_eq!(b.entries, [(Allowed, 1), (Allowed, 2)]);
    assert_eq!(b.focus, Some(1), "2/5 < 1/2");
    assert_eq!(
        at_once(&app, "/", &[("x-api-key", "c")]).entries,
        [(Allowed, 1), (Allowed, 1)]
    );
    assert_eq!(
        at_once(&app, "/", &[("x-api-key", "d")]).entries,
        [(Allowed, 1), (Allowed, 0)]
    );
    let e = at_once(&app, "/", &[("x-api-key", "e")]);
    assert_eq!(e.admission, Admission::Denied { by: 1 });
    assert_eq!(e.entries, [(DeniedByOther, 2), (Denied, 0)]);
    assert_eq!(remaining(&app, "per_key", "key=e"), 2, "e was not charged");

    for limit in ["per_key", "per_ip"] {
        assert_eq!(decisions(&app, "api", limit, "allowed"), 5.0, "{limit}");
        assert_eq!(decisions(&app, "api", limit, "denied"), 1.0, "{limit}");
        assert_eq!(
            decisions(&app, "api", limit, "denied_by_other"),
            1.0,
            "{limit}"
        );
    }

    // The next window: both limits whole again.
    clock.advance(HOUR);
    assert_eq!(at_once(&app, "/", &a).entries, [(Allowed, 1), (Allowed, 4)]);
}

#[test]
fn a_shadow_limit_that_would_deny_lets_the_request_through() {
    let Gate { app, .. } = gate(
        "",
        r#"
[limits.trial]
key = "ip"
algorithm = "fixed_window"
limit = 1
window = "1h"
shadow = true

[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 3
window = "1h"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200, body = "ok" }
limits = ["trial", "per_ip"]
"#,
    );
    // `decide_request`, the memory-only entry point `simulate` uses: the
    // same answers as `admit_request`.
    let decide = || {
        let snapshot = app.snapshot();
        let parts = head("/", &[]);
        let mut ticket = Ticket::default();
        let answer = admission::decide_request(
            &app,
            &snapshot,
            routed(&app, &snapshot, &parts),
            &mut ticket,
        );
        seen(decided(answer), &ticket)
    };
    let first = decide();
    assert_eq!(first.admission, Admission::Allowed);
    assert_eq!(first.entries, [(Allowed, 0), (Allowed, 2)]);
    // A shadow limit is not client-visible: never the focus, at 0 left.
    assert_eq!(first.focus, Some(1));
    for left in [1, 0] {
        let next = decide();
        assert_eq!(next.admission, Admission::Allowed);
        assert_eq!(next.entries, [(ShadowDenied, 0), (Allowed, left)]);
        assert_eq!(next.focus, Some(1));
    }
    let fourth = at_once(&app, "/", &[]);
    assert_eq!(fourth.admission, Admission::Denied { by: 1 });
    assert_eq!(fourth.entries, [(ShadowDenied, 0), (Denied, 0)]);
    assert_eq!(decisions(&app, "api", "trial", "shadow_denied"), 3.0);
    assert_eq!(decisions(&app, "api", "trial", "allowed"), 1.0);
    assert_eq!(decisions(&app, "api", "per_ip", "allowed"), 3.0);
    assert_eq!(decisions(&app, "api", "per_ip", "denied"), 1.0);
}

#[test]
fn a_missing_key_under_deny_names_its_position_and_charges_nothing() {
    let Gate { app, .. } = gate(
        "",
        r#"
[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 5
window = "1h"

[limits.must]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 5
window = "1h"
on_missing_key = "deny"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200, body = "ok" }
limits = ["per_ip", "must"]
"#,
    );
    let keyed = at_once(&app, "/", &[("x-api-key", "a")]);
    assert_eq!(keyed.entries, [(Allowed, 4), (Allowed, 4)]);
    let missing = at_once(&app, "/", &[]);
    assert_eq!(missing.admission, Admission::MissingKey { position: 1 });
    assert_eq!(missing.entries, [], "no limit decided");
    assert_eq!(remaining(&app, "per_ip", PEER_KEY), 4, "per_ip not charged");
    // Counted as the limit's denial; the others decided nothing.
    assert_eq!(decisions(&app, "api", "must", "denied"), 1.0);
    assert_eq!(decisions(&app, "api", "per_ip", "allowed"), 1.0);
    assert_eq!(decisions(&app, "api", "per_ip", "denied"), 0.0);
    assert_eq!(decisions(&app, "api", "per_ip", "skipped"), 0.0);
}

#[test]
fn a_missing_key_under_skip_leaves_that_limit_out() {
    let Gate { app, .. } = gate(
        "",
        r#"
[limits.per_user]
key = "header:x-user"
algorithm = "fixed_window"
limit = 2
window = "1h"

[limits.strict_trial]
key = "header:x-user"
algorithm = "fixed_window"
limit = 2
window = "1h"
shadow = true
on_missing_key = "deny"

[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 5
window = "1h"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200, body = "ok" }
limits = ["per_user", "strict_trial", "per_ip"]
"#,
    );
    let anonymous = at_once(&app, "/", &[]);
    assert_eq!(anonymous.admission, Admission::Allowed);
    assert_eq!(
        anonymous.entries,
        [(Skipped, 0), (Skipped, 0), (Allowed, 4)]
    );
    assert_eq!(anonymous.focus, Some(2), "a skipped limit is not the focus");
    assert_eq!(decisions(&app, "api", "per_user", "skipped"), 1.0);
    // A shadow limit under "deny" would have refused: counted so.
    assert_eq!(decisions(&app, "api", "strict_trial", "shadow_denied"), 1.0);
    let user = at_once(&app, "/", &[("x-user", "u")]);
    assert_eq!(user.entries, [(Allowed, 1), (Allowed, 1), (Allowed, 3)]);
    assert_eq!(user.focus, Some(0), "1/2 < 3/5");
}

#[test]
fn a_missing_key_under_shared_pools_every_such_request() {
    let Gate { app, .. } = gate(
        "",
        r#"
[limits.pooled]
key = "query:user"
algorithm = "fixed_window"
limit = 2
window = "1h"
on_missing_key = "shared"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200, body = "ok" }
limits = ["pooled"]
"#,
    );
    assert_eq!(at_once(&app, "/a", &[]).entries, [(Allowed, 1)]);
    assert_eq!(at_once(&app, "/b", &[]).entries, [(Allowed, 0)]);
    let third = at_once(&app, "/c", &[]);
    assert_eq!(third.admission, Admission::Denied { by: 0 });
    assert_eq!(third.entries, [(Denied, 0)]);
    // A request with the key has its own state.
    assert_eq!(at_once(&app, "/a?user=ann", &[]).entries, [(Allowed, 1)]);
}

#[test]
fn a_consumer_on_a_plan_is_counted_against_the_plans_limiter() {
    let Gate { app, .. } = gate(
        "",
        r#"
[api_keys]
header = "x-api-key"

[consumers."k-pro"]
consumer = "pro-co"
plan = "pro"

[consumers."k-free"]
consumer = "free-co"
plan = "free"

[limits.per_consumer]
key = "consumer"
algorithm = "fixed_window"
limit = 10
window = "1h"
plans = { pro = { limit = 3 } }

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200, body = "ok" }
limits = ["per_consumer"]
"#,
    );
    let pro = [("x-api-key", "k-pro")];
    for left in [2, 1, 0] {
        let next = at_once(&app, "/", &pro);
        assert_eq!(next.admission, Admission::Allowed);
        assert_eq!(next.entries, [(Allowed, left)]);
        assert_eq!(next.plan.as_deref(), Some("pro"));
    }
    let denied = at_once(&app, "/", &pro);
    assert_eq!(denied.admission, Admission::Denied { by: 0 });
    assert_eq!(denied.entries, [(Denied, 0)]);
    // A plan the limit does not name: the base numbers.
    let free = at_once(&app, "/", &[("x-api-key", "k-free")]);
    assert_eq!(free.entries, [(Allowed, 9)]);
    assert_eq!(free.plan.as_deref(), Some("free"));
    // The charges went to the plan's limiter; the base one never saw pro-co.
    assert_eq!(remaining(&app, "per_consumer", "key=pro-co&plan=pro"), 0);
    assert_eq!(remaining(&app, "per_consumer", "key=pro-co"), 10);
    assert_eq!(remaining(&app, "per_consumer", "key=free-co"), 9);
}

#[tokio::test]
async fn cost_header_settles_in_memory_on_every_charged_limit() {
    let Gate { app, .. } = gate(
        "",
        r#"
[limits.guard]
key = "ip"
algorithm = "fixed_window"
limit = 10
window = "1h"

[limits.tokens]
key = "header:x-user"
algorithm = "fixed_window"
limit = 20
window = "1h"

[[routes]]
name = "llm"
match = { path_prefix = "/llm" }
upstream = "api"
cost = 1
cost_header = "x-cost"
limits = ["guard", "tokens"]
"#,
    );
    let user = [("x-user", "u")];
    let first = admit_and_settle(&app, "/llm", &user, Some(b"6")).await;
    assert_eq!(first.entries, [(Allowed, 9), (Allowed, 19)]);
    // Charged 1 up front, 6 reported: 5 more on each.
    assert_eq!(remaining(&app, "guard", PEER_KEY), 4);
    assert_eq!(remaining(&app, "tokens", "key=u"), 14);
    // Not a whole number, or no header: nothing settled.
    admit_and_settle(&app, "/llm", &user, Some(b"6 tokens")).await;
    admit_and_settle(&app, "/llm", &user, None).await;
    assert_eq!(remaining(&app, "guard", PEER_KEY), 2);
    assert_eq!(remaining(&app, "tokens", "key=u"), 12);
    // 0 reported: the up-front unit refunded.
    let refunded = admit_and_settle(&app, "/llm", &user, Some(b"0")).await;
    assert_eq!(refunded.entries, [(Allowed, 1), (Allowed, 11)]);
    assert_eq!(remaining(&app, "guard", PEER_KEY), 2);
    assert_eq!(remaining(&app, "tokens", "key=u"), 12);
    // More than is left: each limit empties, no further.
    admit_and_settle(&app, "/llm", &user, Some(b"50")).await;
    assert_eq!(remaining(&app, "guard", PEER_KEY), 0);
    assert_eq!(remaining(&app, "tokens", "key=u"), 0);
    let denied = ask(&app, "/llm", &user).await;
    assert_eq!(denied.admission, Admission::Denied { by: 0 });
}

const TWO_TIERS: &str = r#"
[limits.guard]
key = "ip"
algorithm = "fixed_window"
limit = 10
window = "1h"
local = true

[limits.per_user]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 2
refill = "1/h"

[[routes]]
name = "api"
match = { path = "/api" }
respond = { status = 200, body = "ok" }
limits = ["guard", "per_user"]

[[routes]]
name = "local"
match = { path = "/local" }
respond = { status = 200, body = "ok" }
limits = ["guard"]
"#;

#[tokio::test]
async fn a_shared_denial_refunds_the_local_tier() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let Gate { app, clock } = gate(&redis_store(&redis.url(), ""), TWO_TIERS);
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let u = [("x-user", "u")];
    let first = ask(&app, "/api", &u).await;
    assert_eq!(first.admission, Admission::Allowed);
    assert_eq!(first.entries, [(Allowed, 9), (Allowed, 1)]);
    assert_eq!(first.focus, Some(1), "1/2 < 9/10");
    assert_eq!(
        ask(&app, "/api", &u).await.entries,
        [(Allowed, 8), (Allowed, 0)]
    );
    // Redis refuses: the guard's charge is given back, and the guard is
    // reported as it stands, as the memory tier reports it.
    let denied = ask(&app, "/api", &u).await;
    assert_eq!(denied.admission, Admission::Denied { by: 1 });
    assert_eq!(remaining(&app, "guard", PEER_KEY), 8, "refunded");
    assert_eq!(denied.entries, [(DeniedByOther, 8), (Denied, 0)]);
    assert_eq!(
        ask(&app, "/api", &[("x-user", "v")]).await.entries,
        [(Allowed, 7), (Allowed, 1)]
    );
    assert_eq!(evalsha_calls(&redis), 4, "one script call per decision");
    // Only the shared limit is in Redis.
    let keys = redis.keys();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(
        keys.iter().all(|k| k.starts_with("tg:per_user:")),
        "{keys:?}"
    );

    // A stack of local limits is decided at once, without the store.
    for left in (0..7).rev() {
        assert_eq!(at_once(&app, "/local", &[]).entries, [(Allowed, left)]);
    }
    // A local denial costs no store call, and charges nothing there.
    let w = [("x-user", "w")];
    let local_denial = ask(&app, "/api", &w).await;
    assert_eq!(local_denial.admission, Admission::Denied { by: 0 });
    assert_eq!(local_denial.entries, [(Denied, 0), (Skipped, 0)]);
    assert_eq!(evalsha_calls(&redis), 4);
    clock.advance(HOUR);
    assert_eq!(
        ask(&app, "/api", &w).await.entries,
        [(Allowed, 9), (Allowed, 1)],
        "w's bucket was whole"
    );
}

#[tokio::test]
async fn a_lease_is_spent_locally_and_given_back_when_the_stack_is_denied() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let Gate { app, .. } = gate(
        &redis_store(&redis.url(), ""),
        r#"
[limits.leased]
key = "header:x-user"
algorithm = "token_bucket"
capacity = 10
refill = "1/h"
lease = 4

[limits.once]
key = "header:x-user"
algorithm = "fixed_window"
limit = 1
window = "1d"
align = "first_request"

[[routes]]
name = "lease"
match = { path = "/lease" }
respond = { status = 200, body = "ok" }
limits = ["leased"]

[[routes]]
name = "both"
match = { path = "/both" }
respond = { status = 200, body = "ok" }
limits = ["leased", "once"]
"#,
    );
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let u = [("x-user", "u")];
    // The first decision takes the cost and 3 more: Redis has 6 left.
    assert_eq!(ask(&app, "/lease", &u).await.entries, [(Allowed, 6)]);
    // The next three are the lease's: r is what the node holds.
    for left in [2, 1, 0] {
        let next = ask(&app, "/lease", &u).await;
        assert_eq!(next.admission, Admission::Allowed);
        assert_eq!(next.entries, [(Allowed, left)]);
    }
    assert_eq!(
        evalsha_calls(&redis),
        1,
        "the lease was spent without a call"
    );
    // Spent: the next one asks Redis, for another lease.
    assert_eq!(ask(&app, "/lease", &u).await.entries, [(Allowed, 2)]);
    assert_eq!(evalsha_calls(&redis), 2);
    assert_eq!(decisions(&app, "lease", "leased", "allowed"), 5.0);

    // A stack with a leased bucket and another shared limit: the lease
    // serves the bucket, Redis decides the rest; a denial there puts the
    // leased token back.
    let w = [("x-user", "w")];
    assert_eq!(
        ask(&app, "/both", &w).await.entries,
        [(Allowed, 6), (Allowed, 0)]
    );
    let denied = ask(&app, "/both", &w).await;
    assert_eq!(denied.admission, Admission::Denied { by: 1 });
    assert_eq!(denied.entries, [(DeniedByOther, 3), (Denied, 0)]);
    assert_eq!(evalsha_calls(&redis), 4);
    // The lease still holds 3: the next request is served from it.
    assert_eq!(ask(&app, "/lease", &w).await.entries, [(Allowed, 2)]);
    assert_eq!(evalsha_calls(&redis), 4);
}

#[tokio::test]
async fn cost_header_settles_in_redis_and_in_the_local_tier() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let Gate { app, .. } = gate(
        &redis_store(&redis.url(), ""),
        r#"
[limits.guard]
key = "ip"
algorithm = "fixed_window"
limit = 10
window = "1h"
local = true

[limits.tokens]
key = "header:x-user"
algorithm = "fixed_window"
limit = 20
window = "1d"
# Windows start at the first request: no boundary of Redis time falls inside the test.
align = "first_request"

[[routes]]
name = "llm"
match = { path_prefix = "/llm" }
upstream = "api"
cost = 1
cost_header = "x-cost"
limits = ["guard", "tokens"]
"#,
    );
    let user = [("x-user", "u")];
    let key = window_key(&app, "tokens", "key=u");
    let first = admit_and_settle(&app, "/llm", &user, Some(b"6")).await;
    assert_eq!(first.entries, [(Allowed, 9), (Allowed, 19)]);
    // The local limit at once, the shared one on the store's thread.
    assert_eq!(remaining(&app, "guard", PEER_KEY), 4);
    wait_for_count(&redis, &key, 6).await;
    // 0 reported: the unit is refunded in both tiers.
    let refunded = admit_and_settle(&app, "/llm", &user, Some(b"0")).await;
    assert_eq!(refunded.entries, [(Allowed, 3), (Allowed, 13)]);
    assert_eq!(remaining(&app, "guard", PEER_KEY), 4);
    wait_for_count(&redis, &key, 6).await;
    assert_eq!(
        ask(&app, "/llm", &user).await.entries,
        [(Allowed, 3), (Allowed, 13)]
    );
}

const GUARD_AND_SHARED: &str = r#"
[limits.guard]
key = "ip"
algorithm = "fixed_window"
limit = 5
window = "1h"
local = true

[limits.per_user]
key = "header:x-user"
algorithm = "fixed_window"
limit = 4
window = "1h"

[[routes]]
name = "api"
match = { path = "/api" }
respond = { status = 200, body = "ok" }
limits = ["guard", "per_user"]

[[routes]]
name = "local"
match = { path = "/local" }
respond = { status = 200, body = "ok" }
limits = ["guard"]
"#;

#[tokio::test]
async fn store_down_under_deny_refuses_and_refunds_the_local_tier() {
    let Gate { app, .. } = gate(&dead_store("on_failure = \"deny\""), GUARD_AND_SHARED);
    assert!(app.store().expect("a store").is_down());
    assert!(!app.is_ready(), "/readyz is 503 under deny");
    let down = ask(&app, "/api", &[("x-user", "u")]).await;
    assert_eq!(down.admission, Admission::StoreDown);
    assert_eq!(remaining(&app, "guard", PEER_KEY), 5, "refunded");
    // Local limits apply in every mode.
    assert_eq!(at_once(&app, "/local", &[]).entries, [(Allowed, 4)]);
    assert_eq!(
        metrics(&app).value("tollgate_store_fallback_active", &[]),
        Some(1.0)
    );
}

#[tokio::test]
async fn store_down_under_allow_skips_the_shared_limits() {
    let Gate { app, .. } = gate(&dead_store("on_failure = \"allow\""), GUARD_AND_SHARED);
    let u = [("x-user", "u")];
    for left in (0..5).rev() {
        let next = ask(&app, "/api", &u).await;
        assert_eq!(next.admission, Admission::Allowed);
        assert_eq!(next.entries, [(Allowed, left), (Skipped, 0)]);
        assert_eq!(next.focus, Some(0));
    }
    let denied = ask(&app, "/api", &u).await;
    assert_eq!(denied.admission, Admission::Denied { by: 0 });
    assert_eq!(denied.entries, [(Denied, 0), (Skipped, 0)]);
    assert_eq!(decisions(&app, "api", "per_user", "skipped"), 6.0);
}

#[tokio::test]
async fn store_down_under_local_decides_on_the_scaled_fallback() {
    let Gate { app, .. } = gate(
        &dead_store("on_failure = \"local\"\nlocal_fraction = 0.5"),
        GUARD_AND_SHARED,
    );
    let u = [("x-user", "u")];
    // per_user's 4 an hour × 0.5 on this node; the guard is not scaled.
    assert_eq!(
        ask(&app, "/api", &u).await.entries,
        [(Allowed, 4), (Allowed, 1)]
    );
    assert_eq!(
        ask(&app, "/api", &u).await.entries,
        [(Allowed, 3), (Allowed, 0)]
    );
    let denied = ask(&app, "/api", &u).await;
    assert_eq!(denied.admission, Admission::Denied { by: 1 });
    assert_eq!(remaining(&app, "guard", PEER_KEY), 3, "refunded");
    assert_eq!(denied.entries, [(DeniedByOther, 3), (Denied, 0)]);
    assert_eq!(
        ask(&app, "/api", &[("x-user", "v")]).await.entries,
        [(Allowed, 2), (Allowed, 1)]
    );
}

#[tokio::test]
async fn a_store_that_stops_falls_back_to_local_and_resumes_when_it_answers() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = Redis::start();
    let Gate { app, .. } = gate(
        &redis_store(&redis.url(), "on_failure = \"local\"\nlocal_fraction = 0.5"),
        r#"
[limits.per_user]
key = "header:x-user"
algorithm = "fixed_window"
limit = 4
window = "1d"
# Windows start at the first request: no boundary of Redis time falls inside the test.
align = "first_request"

[[routes]]
name = "api"
match = { path = "/api" }
respond = { status = 200, body = "ok" }
limits = ["per_user"]
"#,
    );
    let u = [("x-user", "u")];
    let store = app.store().expect("a store").clone();
    assert!(!store.is_down());
    assert_eq!(ask(&app, "/api", &u).await.entries, [(Allowed, 3)]);
    assert_eq!(ask(&app, "/api", &u).await.entries, [(Allowed, 2)]);
    redis.kill();
    // The fallback: 4 × 0.5, from empty (Redis's count is not copied).
    assert_eq!(ask(&app, "/api", &u).await.entries, [(Allowed, 1)]);
    assert_eq!(ask(&app, "/api", &u).await.entries, [(Allowed, 0)]);
    let denied = ask(&app, "/api", &u).await;
    assert_eq!(denied.admission, Admission::Denied { by: 0 });
    assert!(store.is_down(), "three failed calls open the breaker");
    assert_eq!(
        metrics(&app).value("tollgate_store_fallback_active", &[]),
        Some(1.0)
    );
    // Back (empty, on the same port): the breaker's probe closes it and
    // Redis decides again, with the shared numbers.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let back = loop {
        let next = ask(&app, "/api", &u).await;
        if next.admission == Admission::Allowed {
            break next;
        }
        assert_eq!(next.entries, [(Denied, 0)], "the fallback, still empty");
        assert!(Instant::now() < deadline, "the store never came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(back.entries, [(Allowed, 3)]);
    assert!(!store.is_down());
    assert_eq!(
        metrics(&app).value("tollgate_store_fallback_active", &[]),
        Some(0.0)
    );
}

/// A gateway whose `/chat` route keys on a body field, reserves tokens and
/// caps its body, behind an API key it requires.
fn chat_gate() -> Gate {
    gate(
        "",
        r#"
[api_keys]
header = "x-api-key"

[consumers."k-1"]
consumer = "one"

[limits.per_user]
key = "body:user"
algorithm = "fixed_window"
limit = 5
window = "1h"

[limits.tpm]
key = "consumer"
algorithm = "token_bucket"
capacity = 1000
refill = "1000/1m"
unit = "tokens"

[[routes]]
name = "chat"
match = { path_prefix = "/chat" }
respond = { status = 200, body = "ok" }
limits = ["per_user", "tpm"]
require_consumer = true
max_body = 64
tokens = { max_tokens_default = 50, prompt = "bytes/4", usage = "auto" }

[[routes]]
name = "open"
match = { path_prefix = "/" }
respond = { status = 200, body = "ok" }
"#,
    )
}

/// A POST of `body` to `path` with `headers`, as `admit_request` takes it
/// from the proxy (the client's body, still to read), and what it answered,
/// with the ticket's reservation and client, and the body handed back.
async fn post(
    app: &App,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static str,
) -> (RequestAdmission, Option<u64>, Option<IpAddr>, PendingBody) {
    let snapshot = app.snapshot();
    let mut parts = head(path, headers);
    parts.method = http::Method::POST;
    parts
        .headers
        .insert("content-type", "application/json".parse().unwrap());
    let mut pending = PendingBody::Fresh(ClientBody::Complete(body.into()));
    let mut ticket = Ticket::default();
    let routed = Routed {
        body: RequestBody::Client(&mut pending),
        ..routed(app, &snapshot, &parts)
    };
    let answer = admission::admit_request(app, &snapshot, routed, &mut ticket).await;
    let (reserved, client) = (ticket.reserved(), ticket.client_ip());
    drop(ticket);
    (answer, reserved, client, pending)
}

#[tokio::test]
async fn admit_request_refuses_the_caller_before_reading_its_body() {
    let Gate { app, .. } = chat_gate();
    // No API key, and a body over `max_body`: 401, not 413, and the body
    // is handed back unread.
    let long =
        r#"{"user":"ann","messages":[{"role":"user","content":"a long, long, long question"}]}"#;
    let (answer, reserved, client, body) = post(&app, "/chat", &[], long).await;
    assert!(
        matches!(answer, RequestAdmission::Unidentified(_)),
        "{answer:?}"
    );
    assert_eq!((reserved, client), (None, None));
    assert!(matches!(body, PendingBody::Fresh(_)), "the body was read");
    // With the key: the body is read, and refused over `max_body`.
    let key = [("x-api-key", "k-1")];
    let (answer, _, _, _) = post(&app, "/chat", &key, long).await;
    assert!(
        matches!(
            answer,
            RequestAdmission::BodyRefused(BodyError::TooLarge { limit: 64 })
        ),
        "{answer:?}"
    );
    assert_eq!(decisions(&app, "chat", "per_user", "allowed"), 0.0);
}

#[tokio::test]
async fn admit_request_keys_reserves_and_bills_a_read_body() {
    let Gate { app, .. } = chat_gate();
    let key = [("x-api-key", "k-1")];
    // 12 bytes of prompt: 3 tokens, plus the body's own budget of 40.
    let body = r#"{"user":"ann","max_tokens":40,"prompt":"abcdefghijkl"}"#;
    let (answer, reserved, client, read) = post(&app, "/chat", &key, body).await;
    let RequestAdmission::Admitted { bill: Some(bill) } = answer else {
        panic!("not admitted with a bill: {answer:?}");
    };
    assert_eq!(reserved, Some(43));
    assert_eq!(
        client,
        Some(PEER),
        "the client is the peer: no proxy is trusted"
    );
    let PendingBody::Complete(bytes) = read else {
        panic!("the body was not read whole");
    };
    assert_eq!(&bytes[..], body.as_bytes(), "handed back as sent");
    // Keyed on the body's `user`: ann's state, not bob's.
    assert_eq!(remaining(&app, "per_user", "key=ann"), 4);
    assert_eq!(remaining(&app, "per_user", "key=bob"), 5);
    assert_eq!(remaining(&app, "tpm", "key=one"), 1000 - 43);
    // Settled on 13 tokens used: 30 given back.
    bill.settle(Some(13));
    assert_eq!(remaining(&app, "tpm", "key=one"), 1000 - 13);
}

#[tokio::test]
async fn admit_request_on_a_route_without_limits_admits_without_keys() {
    let Gate { app, .. } = chat_gate();
    let (answer, reserved, client, _) = post(&app, "/open", &[], "{}").await;
    assert!(
        matches!(answer, RequestAdmission::Admitted { bill: None }),
        "{answer:?}"
    );
    // Nothing keyed: the client was not looked for.
    assert_eq!((reserved, client), (None, None));
}
