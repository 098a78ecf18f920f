//! Errors of the request path, each knowing its source (the client, the
//! upstream, the gateway) and mapped to an HTTP status in one exhaustive `match`.

use http::header::WWW_AUTHENTICATE;
use http::{HeaderValue, Response, StatusCode};

use crate::admission::body::BodyError;
use crate::admission::identify::Unidentified;
use crate::answer::body::ResponseBody;
use crate::answer::response::{problem, problem_titled};
use crate::identity::jwt::Failure;

/// Why the gateway answers a request itself with an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GatewayError {
    #[error("no route matches {method} {path}")]
    NoRoute { method: http::Method, path: String },
    #[error("request headers are larger than {limit} bytes")]
    HeadersTooLarge { limit: usize },
    #[error("request body is larger than the route's limit of {limit} bytes")]
    BodyTooLarge { limit: u64 },
    #[error("the request body was not received within {timeout:?}")]
    RequestTimeout { timeout: std::time::Duration },
    #[error("unauthorized: {reason}")]
    Unauthorized { reason: &'static str },
    /// A `require_jwt` route's request without a valid token (`None`: no
    /// token at all).
    #[error("unauthorized: {}", .failure.map_or("this route needs a bearer token", Failure::description))]
    InvalidToken { failure: Option<Failure> },
    #[error("malformed request: {reason}")]
    BadRequest { reason: &'static str },
    /// A limit with `on_missing_key = "deny"` found no key in the request.
    #[error("limit {limit} needs the request key {key}, which is missing")]
    MissingKey { limit: String, key: String },
    #[error("upstream {upstream} is unreachable")]
    UpstreamConnect {
        upstream: String,
        #[source]
        source: crate::upstream::pool::PoolError,
    },
    #[error("upstream {upstream} failed before answering")]
    UpstreamFailed {
        upstream: String,
        #[source]
        source: crate::upstream::pool::PoolError,
    },
    /// The shared limiter store is down and `on_failure = "deny"`.
    #[error("the rate-limit store is unavailable")]
    StoreUnavailable,
    #[error("upstream {upstream} did not answer within {timeout:?}")]
    UpstreamTimeout {
        upstream: String,
        timeout: std::time::Duration,
    },
    /// Every URL of the upstream is ejected or down by its health checks.
    #[error("upstream {upstream} has no healthy instance")]
    NoHealthyUpstream { upstream: String },
}

/// The `title` of [`GatewayError::NoHealthyUpstream`]'s problem.
pub(crate) const NO_HEALTHY_TITLE: &str = "No Healthy Upstream Instance";

impl GatewayError {
    /// The 400 for a request without the key `limit` needs. Out of line:
    /// rare.
    #[cold]
    #[inline(never)]
    pub(crate) fn missing_key(limit: &crate::config::LimitConfig) -> GatewayError {
        GatewayError::MissingKey {
            limit: limit.name.clone(),
            key: crate::summary::key_parts(&limit.key),
        }
    }

    /// The HTTP status the client gets. Exhaustive on purpose: a new error
    /// kind must decide its status here.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            GatewayError::NoRoute { .. } => StatusCode::NOT_FOUND,
            GatewayError::HeadersTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            GatewayError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::BadRequest { .. } | GatewayError::MissingKey { .. } => {
                StatusCode::BAD_REQUEST
            }
            GatewayError::Unauthorized { .. } | GatewayError::InvalidToken { .. } => {
                StatusCode::UNAUTHORIZED
            }
            GatewayError::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            GatewayError::UpstreamConnect { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamFailed { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::NoHealthyUpstream { .. } => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The `kind` label of `tollgate_upstream_errors_total`, for upstream errors.
    pub(crate) fn upstream_kind(&self) -> Option<&'static str> {
        match self {
            GatewayError::UpstreamConnect { .. } => Some("connect"),
            GatewayError::UpstreamFailed { source, .. } if source.is_protocol() => Some("protocol"),
            GatewayError::UpstreamFailed { .. } => Some("reset"),
            GatewayError::UpstreamTimeout { .. } => Some("timeout"),
            GatewayError::NoHealthyUpstream { .. } => Some("unavailable"),
            GatewayError::NoRoute { .. }
            | GatewayError::HeadersTooLarge { .. }
            | GatewayError::BodyTooLarge { .. }
            | GatewayError::BadRequest { .. }
            | GatewayError::MissingKey { .. }
            | GatewayError::Unauthorized { .. }
            | GatewayError::InvalidToken { .. }
            | GatewayError::RequestTimeout { .. }
            | GatewayError::StoreUnavailable => None,
        }
    }

    /// The problem+json response for this error. The detail is the error's own
    /// message; upstream error chains are logged, not shown to clients.
    pub(crate) fn to_response(&self) -> Response<ResponseBody> {
        match self {
            GatewayError::NoHealthyUpstream { .. } => {
                problem_titled(self.status(), NO_HEALTHY_TITLE, &self.to_string())
            }
            GatewayError::InvalidToken { failure } => {
                let mut response = problem(self.status(), &self.to_string());
                response
                    .headers_mut()
                    .insert(WWW_AUTHENTICATE, www_authenticate(*failure));
                response
            }
            _ => problem(self.status(), &self.to_string()),
        }
    }

    /// The 401 of a request that its caller's identification refused.
    pub(crate) fn unidentified(refused: Unidentified) -> GatewayError {
        match refused {
            Unidentified::ApiKey(reason) => GatewayError::Unauthorized { reason },
            Unidentified::Token(failure) => GatewayError::InvalidToken { failure },
            // Answered only after the refresh; never reaches a response.
            Unidentified::Refresh { .. } => GatewayError::InvalidToken {
                failure: Some(Failure::UnknownKey),
            },
        }
    }
}

/// A body admission could not read: the client's doing.
impl From<BodyError> for GatewayError {
    fn from(error: BodyError) -> GatewayError {
        match error {
            BodyError::TooLarge { limit } => GatewayError::BodyTooLarge { limit },
            BodyError::Timeout { timeout } => GatewayError::RequestTimeout { timeout },
            BodyError::Unreadable => GatewayError::BadRequest {
                reason: "the request body could not be read",
            },
            BodyError::Unpriced => GatewayError::BadRequest {
                reason: "the request's model has no price ([prices.\"MODEL\"]) and there is no [prices.default]; a route with a spend budget forwards only priced models",
            },
        }
    }
}

/// RFC 6750 §3: the challenge, with `error="invalid_token"` and what
/// failed when a token was presented, bare when none was. The
/// descriptions are the gateway's own words (no quote or backslash), never
/// the token.
fn www_authenticate(failure: Option<Failure>) -> HeaderValue {
    match failure {
        None => HeaderValue::from_static("Bearer"),
        Some(failure) => {
            let value = format!(
                "Bearer error=\"invalid_token\", error_description=\"{}\"",
                failure.description()
            );
            HeaderValue::from_str(&value)
                .unwrap_or(HeaderValue::from_static("Bearer error=\"invalid_token\""))
        }
    }
}
