//! Who may use the admin listener: the bearer token of `[server]
//! admin_token_file` / `admin_token_env` on every request but the three
//! that monitoring reads (`/healthz`, `/readyz`, `/metrics`), and no
//! writes at all without one.
//!
//! | token configured | request | answer |
//! | --- | --- | --- |
//! | any | `GET /healthz`, `/readyz`, `/metrics` | served (other methods there: 405) |
//! | any | `GET /dashboard` | served: the page holds no data, and asks for the token to read `/stats` |
//! | yes | `Authorization: Bearer TOKEN`, the token | served |
//! | yes | no `Authorization`, another scheme or token | 401 problem+json, `WWW-Authenticate: Bearer` |
//! | no | a read (`GET`, `HEAD`) | served, as before tokens existed |
//! | no | a write (any other method) | 403 problem+json saying how to enable writes |
//!
//! The token exists beside network controls (a private network, mTLS in
//! front): those decide who can reach the listener, the token decides who
//! may change limits, and it makes the decision visible in the audit log.
//!
//! The comparison is constant-time: both tokens are hashed with SHA-256
//! and the digests compared with `subtle` (an audited crate whose
//! comparison the optimiser cannot turn into an early exit). Hashing first
//! also hides the token's length, which a byte-wise comparison of unequal
//! lengths would give away.

use http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::answer::body::ResponseBody;
use crate::answer::response::problem;
use crate::config::Secret;

/// The paths anyone who can reach the listener may read: health checkers
/// and Prometheus carry no token. They change nothing whatever the method
/// (another method than `GET` or `HEAD` is `405` there, as it always was).
fn is_open(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// The dashboard page: a browser opening it cannot send a bearer header, and
/// it carries no data (it reads `/stats`, which needs the token, and asks for
/// it on a 401). Only its reads are open.
fn is_open_page(method: &Method, path: &str) -> bool {
    path == "/dashboard" && !is_write(method)
}

/// Whether `method` changes something (a read is `GET` or `HEAD`).
fn is_write(method: &Method) -> bool {
    method != Method::GET && method != Method::HEAD
}

/// The refusal to send, or `None` when the request may go on.
pub(super) fn refusal(
    token: Option<&Secret>,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Option<Response<ResponseBody>> {
    if is_open(path) || is_open_page(method, path) {
        return None;
    }
    let Some(token) = token else {
        if is_write(method) {
            return Some(problem(
                StatusCode::FORBIDDEN,
                "admin writes are disabled: set `admin_token_file` or `admin_token_env` in [server] and send the token as `Authorization: Bearer TOKEN`",
            ));
        }
        return None;
    };
    match bearer(headers) {
        None => Some(unauthorized(
            "this admin endpoint needs `Authorization: Bearer TOKEN` (server.admin_token_file or admin_token_env)",
            "Bearer realm=\"tollgate admin\"",
        )),
        Some(presented) if same(presented, token.expose().as_bytes()) => None,
        Some(_) => Some(unauthorized(
            "the bearer token is not the admin token",
            "Bearer realm=\"tollgate admin\", error=\"invalid_token\"",
        )),
    }
}

/// The credentials of `Authorization: Bearer ...` (the scheme in any case,
/// RFC 9110 §11.1), if the request has exactly one such field.
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let mut values = headers.get_all(AUTHORIZATION).iter();
    let value = values.next().filter(|_| values.next().is_none())?;
    let value = value.as_bytes();
    let (scheme, rest) = value.split_at(value.iter().position(|&b| b == b' ')?);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let credentials = rest.trim_ascii();
    (!credentials.is_empty()).then_some(credentials)
}

/// `a == b`, in time independent of where they differ and of their lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    let (a, b) = (Sha256::digest(a), Sha256::digest(b));
    a.as_slice().ct_eq(b.as_slice()).into()
}

fn unauthorized(detail: &str, challenge: &'static str) -> Response<ResponseBody> {
    let mut response = problem(StatusCode::UNAUTHORIZED, detail);
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(authorization: &[&str]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for value in authorization {
            map.append(
                AUTHORIZATION,
                HeaderValue::from_str(value).unwrap_or_else(|e| panic!("{e}")),
            );
        }
        map
    }

    fn status(token: Option<&Secret>, method: Method, path: &str, auth: &[&str]) -> u16 {
        refusal(token, &method, path, &headers(auth)).map_or(200, |r| r.status().as_u16())
    }

    #[test]
    fn with_a_token_only_the_open_paths_need_none() {
        let token = Secret::new("t0ken");
        let token = Some(&token);
        for path in ["/healthz", "/readyz", "/metrics"] {
            assert_eq!(status(token, Method::GET, path, &[]), 200, "{path}");
        }
        // Open whatever the method: the listener answers a POST there 405.
        assert_eq!(status(token, Method::POST, "/metrics", &[]), 200);
        assert_eq!(status(None, Method::POST, "/metrics", &[]), 200);
        assert_eq!(status(token, Method::GET, "/config", &[]), 401);
        assert_eq!(
            status(token, Method::GET, "/config", &["Bearer t0ken"]),
            200
        );
        assert_eq!(
            status(token, Method::GET, "/config", &["bearer   t0ken "]),
            200
        );
        assert_eq!(status(token, Method::GET, "/config", &["Bearer t0ke"]), 401);
        assert_eq!(
            status(token, Method::GET, "/config", &["Bearer t0ken0"]),
            401
        );
        assert_eq!(status(token, Method::GET, "/config", &["Basic t0ken"]), 401);
        assert_eq!(status(token, Method::GET, "/config", &["Bearer"]), 401);
        assert_eq!(
            status(
                token,
                Method::GET,
                "/config",
                &["Bearer t0ken", "Bearer t0ken"]
            ),
            401
        );
        assert_eq!(
            status(
                token,
                Method::POST,
                "/limits/a/reset?key=k",
                &["Bearer t0ken"]
            ),
            200
        );
    }

    #[test]
    fn without_a_token_reads_stay_open_and_writes_are_forbidden() {
        assert_eq!(status(None, Method::GET, "/config", &[]), 200);
        assert_eq!(status(None, Method::GET, "/limits/a?key=k", &[]), 200);
        for method in [Method::POST, Method::PUT, Method::DELETE] {
            assert_eq!(status(None, method, "/limits/a/reset?key=k", &[]), 403);
        }
    }

    #[test]
    fn a_refusal_challenges_and_never_echoes_the_token() {
        let token = Secret::new("t0ken");
        let Some(refused) = refusal(
            Some(&token),
            &Method::GET,
            "/config",
            &headers(&["Bearer wrong"]),
        ) else {
            panic!("a wrong token was accepted");
        };
        let challenge = refused.headers()[WWW_AUTHENTICATE].to_str().unwrap_or("");
        assert!(challenge.starts_with("Bearer "), "{challenge}");
        assert!(challenge.contains("invalid_token"), "{challenge}");
    }
}
