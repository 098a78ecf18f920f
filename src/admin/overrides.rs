//! The admin listener's per-key overrides (contract §13):
//!
//! | request | answer |
//! | --- | --- |
//! | `PUT /limits/NAME/overrides?key=VALUE` | installs one (JSON body), `200` with it |
//! | `GET /limits/NAME/overrides` | `{"limit", "overrides": [...]}`; with `?key=`, that one (`404` if none) |
//! | `DELETE /limits/NAME/overrides?key=VALUE` | removes one, `200` with it (`404` if none) |
//! | `DELETE /limits/NAME/overrides` | prunes a limit no longer configured: its overrides left in Redis (`404` if none, `409` for a configured limit) |
//!
//! The key is named as `GET /limits/NAME?key=` names it and shown only as
//! its digest. A body holds the limit's own parameters (`limit`, `window`,
//! `capacity`, `refill`, `rate`, `max`: those of its algorithm), optionally
//! `ttl` (`"1h"`) or `expires` (RFC 3339) and `reason`; the values are
//! checked as the file's are (`config::limits::check_override`). Every
//! refusal is problem+json and changes nothing: `400` naming the field, or
//! the key the limit cannot read; `404` for an unknown limit; `409` when the
//! limit uses as many distinct override numbers as a snapshot holds; `503`
//! when the override cannot be stored.
//!
//! This module only translates: the writes are the app's
//! (`app::override_writes`).

use std::net::SocketAddr;

use http::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde_json::{Value, json};

use super::audit::{self, Action};
use crate::admission::explain::{ExplainError, key_of};
use crate::answer::body::ResponseBody;
use crate::answer::response::problem;
use crate::app::App;
use crate::app::override_writes::{NewOverride, OverrideError};
use crate::app::overrides::Override;
use crate::app::state_file::params_json;
use crate::config::limits::RawPlan;
use crate::http::rfc3339;
use crate::limit::{LimitKey, NANOS_PER_SEC, Nanos};

/// Largest request body: an override is a handful of fields.
const MAX_BODY: usize = 16 * 1024;

/// The parameters a body may set, as the file spells them.
const PARAMETERS: [&str; 6] = ["limit", "window", "capacity", "refill", "rate", "max"];

/// Whether `path` is an overrides path (`/limits/NAME/overrides`).
pub(crate) fn claims(path: &str) -> bool {
    limit_of(path).is_some()
}

/// The limit NAME of `/limits/NAME/overrides`, percent-decoded.
fn limit_of(path: &str) -> Option<String> {
    let name = path
        .strip_prefix("/limits/")?
        .strip_suffix("/overrides")
        .filter(|name| !name.is_empty() && !name.contains('/'))?;
    Some(super::decoded(name))
}

/// The answer to one overrides request from `peer` (an accepted write is
/// audited).
pub(crate) async fn answer(
    app: &App,
    request: Request<hyper::body::Incoming>,
    peer: Option<SocketAddr>,
) -> Response<ResponseBody> {
    let Some(limit) = limit_of(request.uri().path()) else {
        return problem(StatusCode::NOT_FOUND, "no admin endpoint here");
    };
    let query = request.uri().query().map(str::to_owned);
    let method = request.method().clone();
    if method == Method::GET || method == Method::HEAD {
        return match query.as_deref().filter(|q| !q.is_empty()) {
            None => list(app, &limit),
            Some(query) => match key(app, &limit, query) {
                Ok(key) => match app.override_of(&limit, key) {
                    Some(record) => ok(shown(&record, app.clock.now())),
                    None => problem(StatusCode::NOT_FOUND, "this key has no override"),
                },
                Err((status, message)) => problem(status, &message),
            },
        };
    }
    if method != Method::PUT && method != Method::DELETE {
        let mut response = problem(
            StatusCode::METHOD_NOT_ALLOWED,
            "/limits/NAME/overrides answers GET, PUT and DELETE",
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD, PUT, DELETE"));
        return response;
    }
    if method == Method::DELETE && query.as_deref().is_none_or(str::is_empty) {
        return prune(app, &limit, peer).await;
    }
    let key = match key(app, &limit, query.as_deref().unwrap_or("")) {
        Ok(key) => key,
        Err((status, message)) => return problem(status, &message),
    };
    if method == Method::DELETE {
        return match app.delete_override(&limit, key).await {
            Ok(Some(record)) => {
                let shown = shown(&record, app.clock.now());
                audited(app, Action::OverrideDelete, &shown, peer);
                ok(shown)
            }
            Ok(None) => problem(StatusCode::NOT_FOUND, "this key has no override"),
            Err(error) => refused(error),
        };
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(error) => {
            return problem(
                StatusCode::BAD_REQUEST,
                &format!("cannot read the body (at most {MAX_BODY} bytes): {error}"),
            );
        }
    };
    let now = app.clock.now();
    let new = match parse_body(&body, now) {
        Ok(new) => new,
        Err(message) => return problem(StatusCode::BAD_REQUEST, &message),
    };
    match app.put_override(&limit, key, new).await {
        Ok(record) => {
            let shown = shown(&record, now);
            audited(app, Action::OverrideSet, &shown, peer);
            ok(shown)
        }
        Err(error) => refused(error),
    }
}

/// `DELETE /limits/NAME/overrides`: the overrides a limit removed from
/// the configuration left in Redis, deleted for every node.
async fn prune(app: &App, limit: &str, peer: Option<SocketAddr>) -> Response<ResponseBody> {
    match app.prune_overrides(limit).await {
        Ok(true) => {
            let shown = json!({"limit": limit, "pruned": true});
            audited(app, Action::OverridePrune, &shown, peer);
            ok(shown)
        }
        Ok(false) => problem(
            StatusCode::NOT_FOUND,
            &format!("no overrides are stored for `{limit}`"),
        ),
        Err(error) => refused(error),
    }
}

/// Records an accepted write of the override `shown` (its JSON answer: the
/// limit, the key's digest, the numbers, expiry and reason) in the audit trail.
fn audited(app: &App, action: Action, shown: &Value, peer: Option<SocketAddr>) {
    audit::record(
        app,
        &audit::Write {
            action,
            limit: shown["limit"].as_str().unwrap_or(""),
            key_digest: shown["digest"].as_str(),
            parameters: shown,
            peer,
        },
    );
}

/// The digest of the key `query` names for `limit`.
fn key(app: &App, limit: &str, query: &str) -> Result<LimitKey, (StatusCode, String)> {
    let snapshot = app.snapshot();
    let query = Some(query).filter(|q| !q.is_empty());
    if query.is_none() && snapshot.limit_named(limit).is_some() {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("name the key: /limits/{limit}/overrides?key=VALUE"),
        ));
    }
    match key_of(&snapshot, limit, query) {
        Ok((_, key)) => Ok(key),
        Err(ExplainError::UnknownLimit(message)) => Err((StatusCode::NOT_FOUND, message)),
        Err(ExplainError::BadKey(message)) => Err((StatusCode::BAD_REQUEST, message)),
    }
}

/// `GET /limits/NAME/overrides`.
fn list(app: &App, limit: &str) -> Response<ResponseBody> {
    let Some(overrides) = app.overrides_of(limit) else {
        return problem(
            StatusCode::NOT_FOUND,
            &format!("no limit named `{limit}` in the running configuration"),
        );
    };
    let now = app.clock.now();
    let items: Vec<Value> = overrides.iter().map(|o| shown(o, now)).collect();
    ok(json!({"limit": limit, "overrides": items}))
}

/// A refused write as problem+json.
fn refused(error: OverrideError) -> Response<ResponseBody> {
    match error {
        OverrideError::UnknownLimit(limit) => problem(
            StatusCode::NOT_FOUND,
            &format!("no limit named `{limit}` in the running configuration"),
        ),
        OverrideError::Invalid(problems) => {
            let detail: Vec<String> = problems
                .iter()
                .map(|(field, message)| format!("`{field}`: {message}"))
                .collect();
            problem(StatusCode::BAD_REQUEST, &detail.join("; "))
        }
        OverrideError::Full => problem(
            StatusCode::CONFLICT,
            &format!(
                "this limit's overrides use {} distinct sets of numbers, as many as it holds until the next reload; reuse one's numbers or reload",
                crate::app::overrides::SLOTS
            ),
        ),
        OverrideError::Configured(limit) => problem(
            StatusCode::CONFLICT,
            &format!(
                "`{limit}` is a limit of the running configuration: delete its overrides one by one (?key=VALUE); a prune is for a limit removed from the configuration"
            ),
        ),
        OverrideError::Storage(message) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("the override was not stored, nothing changed: {message}"),
        ),
    }
}

/// An override as the API shows it.
fn shown(record: &Override, now: Nanos) -> Value {
    let time = rfc3339::format;
    json!({
        "limit": record.limit,
        "digest": format!("{:032x}", record.key.as_u128()),
        "params": params_json(&record.params),
        "reason": record.reason,
        "expires": record.expires.map(time),
        "expires_in_seconds": record.expires.map(|at| at.saturating_sub(now).div_ceil(NANOS_PER_SEC)),
        "set_at": time(record.set_at),
    })
}

fn ok(value: Value) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(value.to_string()));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A `PUT` body: a JSON object of the limit's parameters, `ttl` or
/// `expires`, `reason`. Each problem names its field.
fn parse_body(body: &[u8], now: Nanos) -> Result<NewOverride, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        format!("the body is not JSON: {e}; expected an object like {{\"capacity\": 500}}")
    })?;
    let Value::Object(fields) = value else {
        return Err("the body must be a JSON object, like {\"capacity\": 500}".to_owned());
    };
    let mut params = RawPlan::default();
    let (mut ttl, mut expires, mut reason) = (None, None, None);
    for (name, value) in &fields {
        match name.as_str() {
            "limit" => params.limit = Some(amount(name, value)?),
            "capacity" => params.capacity = Some(amount(name, value)?),
            "max" => params.max = Some(count(name, value)?),
            "window" => params.window = Some(text(name, value)?),
            "refill" => params.refill = Some(text(name, value)?),
            "rate" => params.rate = Some(text(name, value)?),
            "ttl" => ttl = Some(text(name, value)?),
            "expires" => expires = Some(text(name, value)?),
            "reason" => reason = Some(text(name, value)?),
            other => return Err(unknown(other)),
        }
    }
    if fields
        .keys()
        .all(|name| !PARAMETERS.contains(&name.as_str()))
    {
        return Err(format!(
            "give at least one of the limit's parameters ({})",
            PARAMETERS.join(", ")
        ));
    }
    let expires = match (ttl, expires) {
        (Some(_), Some(_)) => return Err("give `ttl` or `expires`, not both".to_owned()),
        (Some(ttl), None) => {
            let ttl = crate::config::units::parse_duration(&ttl)
                .map_err(|message| format!("`ttl`: {message}"))?;
            if ttl.is_zero() {
                return Err("`ttl`: must be greater than zero".to_owned());
            }
            let ttl = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
            Some(now.saturating_add(ttl))
        }
        (None, Some(text)) => {
            let at = rfc3339::parse(&text).ok_or_else(|| {
                format!("`expires`: `{text}` is not an RFC 3339 time like \"2026-12-31T23:59:59Z\"")
            })?;
            if at <= now {
                return Err(format!("`expires`: `{text}` has passed"));
            }
            Some(at)
        }
        (None, None) => None,
    };
    Ok(NewOverride {
        params,
        expires,
        reason,
    })
}

fn count(name: &str, value: &Value) -> Result<u64, String> {
    value.as_u64().ok_or_else(|| {
        format!("`{name}`: `{value}` is not a whole number; expected like {name} = 100")
    })
}

/// A limit's quota: a whole number, or dollars with decimals for a usd
/// limit (which of the two the limit's check says).
fn amount(name: &str, value: &Value) -> Result<crate::config::amount::Amount, String> {
    if !value.is_number() {
        return Err(format!(
            "`{name}`: `{value}` is not a number; expected like {name} = 100"
        ));
    }
    serde_json::from_value(value.clone()).map_err(|e| format!("`{name}`: {e}"))
}

fn text(name: &str, value: &Value) -> Result<String, String> {
    match value {
        Value::String(text) => Ok(text.clone()),
        _ => Err(format!("`{name}`: `{value}` is not a string")),
    }
}

fn unknown(name: &str) -> String {
    let known = PARAMETERS
        .iter()
        .copied()
        .chain(["ttl", "expires", "reason"]);
    let mut message = format!(
        "unknown field `{name}`, expected one of {}, ttl, expires, reason",
        PARAMETERS.join(", ")
    );
    if let Some(best) = crate::config::error::nearest(name, known) {
        message.push_str(&format!(" (did you mean `{best}`?)"));
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_read_field_by_field() {
        let new = parse_body(
            br#"{"capacity": 5, "refill": "1/s", "ttl": "1s", "reason": "r"}"#,
            10,
        )
        .unwrap();
        assert_eq!(new.params.capacity, Some(5.into()));
        assert_eq!(new.expires, Some(10 + NANOS_PER_SEC));
        assert_eq!(new.reason.as_deref(), Some("r"));
        let error = |body: &str| parse_body(body.as_bytes(), 0).err().unwrap();
        assert!(error(r#"{"capacty": 5}"#).contains("did you mean `capacity`"));
        assert!(error(r#"{"capacity": "5"}"#).starts_with("`capacity`"));
        assert!(error(r#"{"capacity": -5}"#).starts_with("`capacity`"));
        assert!(error(r#"{"reason": "r"}"#).contains("at least one"));
        assert!(
            error(r#"{"max": 1, "ttl": "1s", "expires": "2030-01-01T00:00:00Z"}"#)
                .contains("not both")
        );
        assert!(error(r#"{"max": 1, "ttl": "soon"}"#).starts_with("`ttl`"));
        assert!(error(r#"[1]"#).contains("object"));
    }

    #[test]
    fn only_overrides_paths_are_claimed() {
        assert!(claims("/limits/per_key/overrides"));
        assert!(!claims("/limits/per_key"));
        assert!(!claims("/limits//overrides"));
        assert!(!claims("/limits/a/b/overrides"));
    }
}
