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

use crate::admission::quota::{Peeked, Reading, peek_request};
use crate::answer::arena::arena_body;
use crate::answer::body::ResponseBody;
use crate::answer::error::GatewayError;
use crate::answer::ratelimit::ceil_secs;
use crate::app::overrides::Override;
use crate::app::{App, Snapshot};
use crate::config::RouteConfig;
use crate::config::tokens::Unit;
use crate::http::field_lines::{FieldLines, OwnLines};
use crate::http::problem::escape_into;
use crate::limit::{Algorithm, Nanos, quota};
use crate::llm::price::dollars;
use crate::ratelimit_policy::{StackView, is_concurrency, policy_header};
use http::Response;
use http::request::Parts;

/// The answer's future, boxed: only quota routes pay for it, and none of
/// it is built into every request's future.
pub(super) type Answering<'a> = Pin<
    Box<
        dyn Future<Output = Result<(Response<ResponseBody>, FieldLines), GatewayError>> + Send + 'a,
    >,
>;

/// The answer's fields, as one copy: written as lines, as a 429's are,
/// rather than inserted into a header map (its allocation and two
/// insertions).
const JSON_NOT_STORED: OwnLines =
    OwnLines::new("content-type: application/json\r\ncache-control: no-store\r\n");

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

fn json_response(
    snapshot: &Snapshot,
    readings: &[Reading<'_>],
) -> (Response<ResponseBody>, FieldLines) {
    let body = arena_body(|out| write_limits(out, snapshot, readings));
    let mut fields = FieldLines::new();
    fields.push_lines(JSON_NOT_STORED);
    (Response::new(ResponseBody::full(body)), fields)
}

/// The answer's JSON, written member by member as `serde_json` wrote it
/// from a `Value` (each object's keys sorted, its escaping): a quota route
/// may be polled as often as a proxied path is, and building the `Value`s
/// and their maps was two thirds of its instructions (`bench/quota_route.sh
/// CALLGRIND=1`).
fn write_limits(out: &mut String, snapshot: &Snapshot, readings: &[Reading<'_>]) {
    out.push_str("{\"limits\":[");
    for (i, reading) in readings.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_limit(out, snapshot, reading);
    }
    out.push_str("]}");
}

/// One limit's entry: `name`, `override`, `policy`, `quota`, `remaining`,
/// `reset_seconds`, `unit`, in `serde_json`'s (sorted) order.
fn write_limit(out: &mut String, snapshot: &Snapshot, reading: &Reading<'_>) {
    let limit = reading.limit;
    out.push_str("{\"name\":\"");
    escape_into(out, &limit.name);
    out.push_str("\",\"override\":");
    match &reading.overridden {
        Some(record) => override_in_force(out, record),
        None => out.push_str("null"),
    }
    out.push_str(",\"policy\":");
    match policy(snapshot, reading) {
        Some(policy) => {
            out.push('"');
            escape_into(out, &policy);
            out.push('"');
        }
        None => out.push_str("null"),
    }
    let mut digits = itoa::Buffer::new();
    let usd = limit.unit == Unit::Usd;
    out.push_str(",\"quota\":");
    out.push_str(digits.format(quota(&reading.algorithm)));
    if usd {
        // `quota` and `remaining` count micro-dollars; also in dollars.
        out.push_str(",\"quota_usd\":\"");
        out.push_str(&dollars(quota(&reading.algorithm)));
        out.push('"');
    }
    out.push_str(",\"remaining\":");
    out.push_str(digits.format(reading.verdict.remaining));
    if usd {
        out.push_str(",\"remaining_usd\":\"");
        out.push_str(&dollars(reading.verdict.remaining));
        out.push('"');
    }
    out.push_str(",\"reset_seconds\":");
    if is_concurrency(limit) {
        // No reset time, as its `RateLimit` item has no `t`.
        out.push_str("null");
    } else {
        out.push_str(digits.format(ceil_secs(reading.verdict.reset_after)));
    }
    out.push_str(match limit.unit {
        Unit::Tokens => ",\"unit\":\"tokens\"}",
        Unit::Requests => ",\"unit\":\"requests\"}",
        Unit::Usd => ",\"unit\":\"usd\"}",
    });
}

/// The limit's `RateLimit-Policy` item under the caller's numbers, as a
/// proxied response would send it (`None` where it sends none: a shadow
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
/// key). The reading's numbers are already the override's. Through
/// `serde_json`, out of line: only an overridden key's answer has one.
#[cold]
#[inline(never)]
fn override_in_force(out: &mut String, record: &Override) {
    let value = serde_json::json!({
        "params": crate::app::state_file::params_json(&record.params),
        "reason": record.reason,
        "expires": record.expires.map(crate::http::rfc3339::format),
    });
    out.push_str(&value.to_string());
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;
    use crate::config::limits::RawPlan;
    use crate::limit::{LimitKey, Verdict};

    const CONFIG: &str = r#"
[server]
listen = "127.0.0.1:0"

[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 100
refill = "10/s"

[limits.slots]
key = "header:x-api-key"
algorithm = "concurrency"
max = 4

[limits.tokens]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 5000
window = "1m"
unit = "tokens"

[limits.watching]
key = "header:x-api-key"
algorithm = "sliding_window"
limit = 10
window = "1s"
shadow = true

[limits.spend]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 50.5
window = "1mo"
unit = "usd"

[[routes]]
name = "quota"
match = { path = "/quota" }
respond = { quota = ["per_key", "slots", "tokens", "watching", "spend"] }
"#;

    /// The answer as it was built before, through `serde_json`'s `Value`:
    /// what the writer must still write, byte for byte.
    fn reference(snapshot: &Snapshot, readings: &[Reading<'_>]) -> String {
        let limits: Vec<Value> = readings
            .iter()
            .map(|reading| {
                let limit = reading.limit;
                let unit = match limit.unit {
                    Unit::Tokens => "tokens",
                    Unit::Requests => "requests",
                    Unit::Usd => "usd",
                };
                let reset =
                    (!is_concurrency(limit)).then(|| ceil_secs(reading.verdict.reset_after));
                let overridden = reading.overridden.as_ref().map(|record| {
                    json!({
                        "params": crate::app::state_file::params_json(&record.params),
                        "reason": record.reason,
                        "expires": record.expires.map(crate::http::rfc3339::format),
                    })
                });
                let mut entry = json!({
                    "name": limit.name,
                    "unit": unit,
                    "quota": quota(&reading.algorithm),
                    "remaining": reading.verdict.remaining,
                    "reset_seconds": reset,
                    "policy": policy(snapshot, reading),
                    "override": overridden,
                });
                if limit.unit == Unit::Usd {
                    entry["quota_usd"] = json!(dollars(quota(&reading.algorithm)));
                    entry["remaining_usd"] = json!(dollars(reading.verdict.remaining));
                }
                entry
            })
            .collect();
        json!({ "limits": limits }).to_string()
    }

    #[test]
    fn the_answer_is_what_serde_json_wrote() {
        let config = crate::config::Config::from_bytes(
            std::path::Path::new("gateway.toml"),
            CONFIG.as_bytes(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let app = App::new(config);
        let snapshot = app.snapshot();
        let record = Arc::new(Override {
            limit: "per_key".into(),
            key: LimitKey::digest(&[b"k"]),
            params: RawPlan {
                capacity: Some(1000.into()),
                refill: Some("100/s".into()),
                ..RawPlan::default()
            },
            expires: Some(1_800_000_000_000_000_000),
            reason: Some("trial \"x\"\n".into()),
            set_at: 0,
            plan: None,
        });
        let readings: Vec<Reading<'_>> = snapshot
            .limit_ids()
            .enumerate()
            .map(|(i, id)| {
                let limiter = snapshot.limiters(id).for_plan(None);
                Reading {
                    limit: snapshot.limit_config(id),
                    algorithm: limiter.algorithm(),
                    verdict: Verdict::allow(97 - i as u64, 1_500_000_001 * i as u64),
                    overridden: (i == 0).then(|| record.clone()),
                }
            })
            .collect();
        assert_eq!(readings.len(), 5);
        for n in 0..=readings.len() {
            let mut written = String::new();
            write_limits(&mut written, &snapshot, &readings[..n]);
            assert_eq!(written, reference(&snapshot, &readings[..n]));
        }
        // The usd limit's members, in dollars beside its micro-dollars.
        let mut written = String::new();
        write_limits(&mut written, &snapshot, &readings);
        assert!(
            written.contains(r#""quota":50500000,"quota_usd":"50.50""#),
            "{written}"
        );
        // An override without expiry or reason.
        let bare = Arc::new(Override {
            expires: None,
            reason: None,
            ..(*record).clone()
        });
        let reading = Reading {
            overridden: Some(bare),
            ..readings[0].clone()
        };
        let mut written = String::new();
        write_limits(&mut written, &snapshot, std::slice::from_ref(&reading));
        assert_eq!(written, reference(&snapshot, &[reading]));
    }
}
