//! `POST /json`: envoyproxy/ratelimit's HTTP form of `ShouldRateLimit` —
//! the request as proto3 JSON in, `200` (`OK`) or `429` (`OVER_LIMIT`)
//! with the response as proto3 JSON out. A body that is not such a
//! request is `400`, a store down under `on_failure = "deny"` `503`, both
//! problem+json.

use std::time::Duration;

use http::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};

use super::rls::{RlsError, should_rate_limit};
use crate::answer::body::ResponseBody;
use crate::answer::response::problem;
use crate::app::{App, Snapshot};
use crate::envoy_proto::envoy::service::ratelimit::v3::RateLimitRequest;
use crate::envoy_proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// Largest request body read: a call is a few descriptors.
const MAX_BODY: usize = 1 << 20;

/// The answer to one `/json` request, counted in `tollgate_requests_total`
/// under its domain (`none` for a domain no rule names: a client's text is
/// no metric label).
pub(crate) async fn answer<B>(app: &App, request: Request<B>) -> Response<ResponseBody>
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let started = app.clock.now();
    let snapshot = app.request_snapshot();
    let (response, domain) = decide(app, &snapshot, request).await;
    let metrics = app.metrics();
    let label = domain
        .as_deref()
        .and_then(|d| snapshot.descriptors.domain_label(d))
        .unwrap_or(metrics.no_route());
    let elapsed = Duration::from_nanos(app.clock.now().saturating_sub(started));
    metrics.record_request(label, response.status().as_u16(), elapsed);
    response
}

/// The answer, and the call's domain once it parsed.
async fn decide<B>(
    app: &App,
    snapshot: &Snapshot,
    request: Request<B>,
) -> (Response<ResponseBody>, Option<String>)
where
    B: hyper::body::Body,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if request.method() != Method::POST {
        let mut response = problem(StatusCode::METHOD_NOT_ALLOWED, "/json answers POST only");
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("POST"));
        return (response, None);
    }
    let body = match Limited::new(request.into_body(), MAX_BODY).collect().await {
        Ok(body) => body.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return (
                problem(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "a rate-limit request body is at most 1 MiB",
                ),
                None,
            );
        }
        Err(_) => {
            return (
                problem(StatusCode::BAD_REQUEST, "the request body was cut short"),
                None,
            );
        }
    };
    let call: RateLimitRequest = match serde_json::from_slice(&body) {
        Ok(call) => call,
        Err(error) => {
            return (
                problem(
                    StatusCode::BAD_REQUEST,
                    &format!("not a RateLimitRequest in proto3 JSON: {error}"),
                ),
                None,
            );
        }
    };
    let response = match should_rate_limit(app, snapshot, &call).await {
        Ok(decided) => {
            let status = if decided.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            let text = serde_json::to_vec(&decided).unwrap_or_default();
            let mut response = Response::new(ResponseBody::full(text));
            *response.status_mut() = status;
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(RlsError::Invalid(message)) => problem(StatusCode::BAD_REQUEST, &message),
        Err(RlsError::StoreDown) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the limiter store is unavailable and store.on_failure is \"deny\"",
        ),
    };
    (response, Some(call.domain))
}
