//! A quota route's answer (`respond = { quota = [...] }`): the caller's own
//! state of the route's limits ([`crate::admission::quota`]) as JSON,
//! charging nothing.
//!
//! ```json
//! {"limits": [{"name": "per_key", "unit": "requests", "quota": 100,
//!   "remaining": 97, "reset_seconds": 42,
//!   "policy": "\"per_key\";q=100;w=60", "override": null}]}
//! ```
//!
//! The numbers are those of the caller's next proxied request before it
//! is charged: its `RateLimit` field then says `r` = `remaining` less what
//! it costs, `t` = `reset_seconds` (or less, as time passes), and
//! `RateLimit-Policy` says `policy`. `reset_seconds` is `null` for a
//! concurrency limit (no reset time, as its `RateLimit` item has no `t`).
//! Refusals are the proxied request's: 401 for an unidentified caller, the
//! limit's missing-key 400, 503 while the store is down with
//! `on_failure = "deny"`.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderValue, Response};
use serde_json::{Value, json};

use crate::admission::quota::{Peeked, Reading, peek_request};
use crate::answer::body::ResponseBody;
use crate::answer::error::GatewayError;
use crate::answer::ratelimit::ceil_secs;
use crate::app::{App, Snapshot};
use crate::config::RouteConfig;
use crate::config::tokens::Unit;
use crate::limit::{Algorithm, Nanos, quota};
use crate::llm::price::dollars;
use crate::ratelimit_policy::{StackView, is_concurrency, policy_header};

/// The answer's future, boxed: only quota routes pay for it, and none of
/// it is built into every request's future.
pub(super) type Answering<'a> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, GatewayError>> + Send + 'a>>;

/// The quota route's answer to `parts` from `peer`, for `limits`.
pub(super) fn answer<'a>(
    app: &'a App,
    snapshot: &'a Snapshot,
    route: &'a RouteConfig,
    parts: &'a Parts,
    peer: IpAddr,
    limits: &'a [usize],
    now: Nanos,
) -> Answering<'a> {
    Box::pin(async move {
        match peek_request(app, snapshot, route, parts, peer, limits, now).await {
            Peeked::Read(readings) => Ok(json_response(snapshot, &readings)),
            Peeked::MissingKey(limit) => Err(GatewayError::missing_key(limit)),
            Peeked::Unidentified(refused) => Err(GatewayError::unidentified(refused)),
            Peeked::StoreDown => Err(GatewayError::StoreUnavailable),
        }
    })
}

fn json_response(snapshot: &Snapshot, readings: &[Reading<'_>]) -> Response<ResponseBody> {
    let limits: Vec<Value> = readings
        .iter()
        .map(|reading| limit_json(snapshot, reading))
        .collect();
    let body = json!({ "limits": limits }).to_string();
    let mut response = Response::new(ResponseBody::full(body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// One limit's entry.
fn limit_json(snapshot: &Snapshot, reading: &Reading<'_>) -> Value {
    let limit = reading.limit;
    let reset = (!is_concurrency(limit)).then(|| ceil_secs(reading.verdict.reset_after));
    let mut entry = json!({
        "name": limit.name,
        "unit": limit.unit.name(),
        "quota": quota(&reading.algorithm),
        "remaining": reading.verdict.remaining,
        "reset_seconds": reset,
        "policy": policy(snapshot, reading),
        "override": override_in_force(reading),
    });
    if limit.unit == Unit::Usd {
        // `quota` and `remaining` count micro-dollars; also in dollars.
        entry["quota_usd"] = json!(dollars(quota(&reading.algorithm)));
        entry["remaining_usd"] = json!(dollars(reading.verdict.remaining));
    }
    entry
}

/// The limit's `RateLimit-Policy` item under the caller's numbers, as a
/// proxied response would send it (`null` where it sends none: a shadow
/// limit, or one whose `headers` leave out the draft fields).
fn policy(snapshot: &Snapshot, reading: &Reading<'_>) -> Option<Box<str>> {
    let limits = [reading.limit];
    let algorithms: [Algorithm; 1] = [reading.algorithm];
    policy_header(StackView {
        limits: &limits,
        algorithms: &algorithms,
        server: snapshot.config.server.headers,
    })
}

/// The override in force for the caller's key of this limit (its numbers,
/// expiry and reason, as `GET /limits/NAME/overrides` shows them; never the
/// key), else `null`. The reading's numbers are already the override's.
fn override_in_force(reading: &Reading<'_>) -> Value {
    let Some(record) = &reading.overridden else {
        return Value::Null;
    };
    serde_json::json!({
        "params": crate::app::state_file::params_json(&record.params),
        "reason": record.reason,
        "expires": record.expires.map(crate::http::rfc3339::format),
    })
}
