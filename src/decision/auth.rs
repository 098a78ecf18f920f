//! Forward-auth (`/auth`): nginx `auth_request`, ingress-nginx `auth-url`
//! and Traefik `ForwardAuth` ask whether a request they hold may pass.
//!
//! The request decided is the *original* one, described by the asking
//! proxy's headers — `X-Forwarded-Method`, `X-Forwarded-Uri`,
//! `X-Forwarded-Host` (Traefik) or `X-Original-Method`, `X-Original-URI`
//! or `X-Original-URL` (nginx, ingress-nginx) — with the original's other
//! headers (both send them along). Both families present and disagreeing
//! is a client's forgery: 400. It is normalised and routed by `[[routes]]` as the proxy
//! would, and decided by the route's stack with `front = "auth"`. The
//! client is the peer unless the peer is a trusted proxy (section 4 of the
//! contract), and then `X-Forwarded-For` or, without one, `X-Real-IP`.
//!
//! Answers: `200` with the rate-limit fields (allowed, or no route: no
//! limit applies); `deny_status` with the fields and the 429's
//! problem+json (denied); `400` without the original method and URI, or
//! for a key the request lacks under `on_missing_key = "deny"`; `401` for
//! an unknown API key where the route requires one; `503` when the store is
//! down under `on_failure = "deny"`. There is no body here, so `body:`
//! keys are missing (`check` says so); a concurrency slot is released as
//! soon as the answer is written, since the proxy never says when the
//! request ends. A request the stack holds (a token bucket's `wait`, a
//! leaky bucket's delay) is answered `200` after its hold: the asking
//! proxy holds the original until it has the answer, so the original
//! leaves when the gateway's own proxy would have forwarded it (refusing
//! it instead would turn every wait into a refusal, and answering at once
//! would let it through early, its tokens owed).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::header::HOST;
use http::request::Parts;
use http::{HeaderMap, HeaderName, Method, Request, Response, StatusCode, Uri};

use crate::access_log::{self, AccessEntry, LimitField};
use crate::admission::{self, Client, RequestAdmission, RequestBody, Routed, Ticket, identify};
use crate::answer::body::ResponseBody;
use crate::answer::error::GatewayError;
use crate::answer::ratelimit;
use crate::answer::response::problem;
use crate::app::{App, Snapshot};
use crate::http::field_lines::FieldLines;
use crate::http::path::normalize_uri;
use crate::identity::client_ip::{parse_address, peer_is_trusted};
use crate::metrics::Front;

static X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
static X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
static X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
static X_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-original-url");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The answer to one `/auth` request from `peer`.
pub(crate) async fn answer<B>(
    app: &App,
    request: Request<B>,
    peer: SocketAddr,
) -> Response<ResponseBody> {
    let started = app.clock.now();
    let snapshot = app.request_snapshot();
    let (head, _body) = request.into_parts();
    let original = match original_request(&snapshot, &head) {
        Ok(original) => original,
        Err(detail) => return problem(StatusCode::BAD_REQUEST, detail),
    };
    let client_ip = client_ip(&snapshot, &head.headers, peer.ip());
    let Some(index) = snapshot.router.find(&original) else {
        // No route, no limit: the asking proxy decides what it forwards.
        let elapsed = Duration::from_nanos(app.clock.now().saturating_sub(started));
        let seen = Seen {
            limit: None,
            client_ip,
            queued: None,
        };
        log_entry(&original, "none", StatusCode::OK, seen, elapsed);
        return Response::new(ResponseBody::full(""));
    };
    let route = &snapshot.config.routes[index];
    let Some(plan) = snapshot.auth_routes.get(index) else {
        // A reload removed `[decision]`; the listener stays until a restart.
        return problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "the configuration serving has no [decision] section",
        );
    };
    let mut ticket = Ticket::default();
    let routed = Routed {
        route,
        plan,
        parts: &original,
        client: Client::Resolved(client_ip),
        body: RequestBody::Absent,
        now: started,
    };
    let admitted = admission::admit_request(app, &snapshot, routed, &mut ticket).await;
    let (response, limit) = match admitted {
        RequestAdmission::Admitted { .. } => {
            // Held as the proxy would hold it, then answered: the asking
            // proxy waits for this answer before it forwards.
            admission::hold::wait_out(app, &snapshot, plan, &mut ticket).await;
            let mut response = Response::new(ResponseBody::full(""));
            let mut fields = FieldLines::new();
            ratelimit::admitted_fields(&mut fields, &snapshot, plan, &ticket);
            fields.apply(response.headers_mut());
            (response, ticket.focus().map(|i| field(&ticket, i, false)))
        }
        RequestAdmission::Denied { by } => {
            let (mut response, fields) =
                ratelimit::denied_response(&snapshot, plan, &ticket, by, route.cost);
            fields.apply(response.headers_mut());
            *response.status_mut() = deny_status(&snapshot);
            (response, Some(field(&ticket, by, true)))
        }
        RequestAdmission::MissingKey { position } => {
            let limit = snapshot.limit_config(plan.stack[position]);
            (GatewayError::missing_key(limit).to_response(), None)
        }
        RequestAdmission::StoreDown => (GatewayError::StoreUnavailable.to_response(), None),
        // No body is read here.
        RequestAdmission::BodyRefused(refused) => (GatewayError::from(refused).to_response(), None),
        RequestAdmission::Unidentified(refused) => {
            (GatewayError::unidentified(refused).to_response(), None)
        }
    };
    let queued = ticket.waited();
    // The decision is the answer: concurrency slots are not held past it.
    drop(ticket);
    let seen = Seen {
        limit,
        client_ip,
        queued,
    };
    finish(app, &snapshot, index, &original, response, seen, started)
}

/// The original request's head, from the asking proxy's headers: method,
/// normalised path and query, `Host`, and the headers it sent along.
///
/// Two families describe it: Traefik's `X-Forwarded-*` and nginx's
/// `X-Original-*` (`X-Original-URL`, the whole URL, from ingress-nginx).
/// An asking proxy sets its own family and passes the client's other
/// headers on, so a client can add the other family: where both are
/// present and disagree, the request is refused rather than decided as the
/// client says.
fn original_request(snapshot: &Snapshot, head: &Parts) -> Result<Parts, &'static str> {
    let headers = &head.headers;
    let text = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    let traefik = (text(&X_FORWARDED_METHOD), text(&X_FORWARDED_URI));
    let nginx = (
        text(&X_ORIGINAL_METHOD),
        text(&X_ORIGINAL_URI).or_else(|| text(&X_ORIGINAL_URL)),
    );
    let method = agree(traefik.0, nginx.0, |m| m.to_owned())
        .map_err(|()| "X-Forwarded-Method and X-Original-Method name different methods")?;
    let uri = agree(traefik.1, nginx.1, |u| {
        target_of(u).map(|t| t.to_string()).unwrap_or_default()
    })
    .map_err(|()| "X-Forwarded-Uri and X-Original-URI name different requests")?;
    let (Some(method), Some(uri)) = (method, uri) else {
        return Err(
            "/auth decides the original request: send its method and URI in X-Forwarded-Method and X-Forwarded-Uri, or X-Original-Method and X-Original-URI",
        );
    };
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| "the original method is not an HTTP method")?;
    let mut uri = target_of(uri)?;
    let server = &snapshot.config.server;
    if server.path_normalization {
        normalize_uri(&mut uri, server.escaped_slashes).map_err(|e| e.reason())?;
    }
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    let (mut parts, ()) = request.into_parts();
    parts.headers = headers.clone();
    if let Some(host) = headers.get(&X_FORWARDED_HOST).cloned() {
        parts.headers.insert(HOST, host);
    }
    Ok(parts)
}

/// One value from two families: either one, or both when they say the
/// same (compared as `key` makes them); `Err` when they differ.
fn agree<'a>(
    one: Option<&'a str>,
    other: Option<&'a str>,
    key: impl Fn(&str) -> String,
) -> Result<Option<&'a str>, ()> {
    match (one, other) {
        (Some(a), Some(b)) if key(a) != key(b) => Err(()),
        (a, b) => Ok(a.or(b)),
    }
}

/// The request target of an original URI: a path and query, or the path
/// and query of an absolute URL (ingress-nginx's `X-Original-URL`).
fn target_of(text: &str) -> Result<Uri, &'static str> {
    let mut uri: Uri = text
        .parse()
        .map_err(|_| "the original URI is not a request target")?;
    if uri.scheme().is_some() || uri.authority().is_some() {
        uri = uri
            .path_and_query()
            .map(|pq| Uri::from(pq.clone()))
            .ok_or("the original URI has no path")?;
    }
    if !uri.path().starts_with('/') {
        return Err("the original URI's path must start with /");
    }
    Ok(uri)
}

/// The client: the peer, or behind a trusted peer the forwarding header's
/// client, or `X-Real-IP` when the trusted peer sent no forwarding header.
fn client_ip(snapshot: &Snapshot, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
    let policy = &snapshot.client_ip;
    if peer_is_trusted(peer, policy) && !headers.contains_key(policy.header.name()) {
        // One address, read as one `X-Forwarded-For` entry is.
        let real = headers
            .get(&X_REAL_IP)
            .and_then(|v| parse_address(v.as_bytes()));
        if let Some(real) = real {
            return real;
        }
    }
    identify::client_ip(snapshot, headers, peer)
}

/// `[decision] deny_status`.
fn deny_status(snapshot: &Snapshot) -> StatusCode {
    snapshot
        .config
        .decision
        .as_ref()
        .map_or(StatusCode::TOO_MANY_REQUESTS, |d| d.deny_status)
}

/// The access log's limit field of the entry at `index`, naming the
/// snapshot's limit (so it outlives the ticket).
fn field<'s>(ticket: &Ticket<'s>, index: usize, denied: bool) -> LimitField<'s> {
    let limit: &'s crate::config::LimitConfig = ticket.limits()[index];
    LimitField {
        name: &limit.name,
        remaining: ticket.entries()[index].verdict.remaining,
        denied,
    }
}

/// What a routed `/auth` request's log line tells beyond its answer.
struct Seen<'s> {
    limit: Option<LimitField<'s>>,
    client_ip: IpAddr,
    /// How long the request was held before the answer.
    queued: Option<Duration>,
}

/// Counts and logs the answer of a routed `/auth` request.
fn finish(
    app: &App,
    snapshot: &Snapshot,
    index: usize,
    original: &Parts,
    response: Response<ResponseBody>,
    seen: Seen<'_>,
    started: u64,
) -> Response<ResponseBody> {
    let Some(plan) = snapshot.auth_routes.get(index) else {
        return response;
    };
    let elapsed = Duration::from_nanos(app.clock.now().saturating_sub(started));
    app.metrics()
        .record_route_request(&plan.metrics, response.status().as_u16(), elapsed);
    log_entry(original, &plan.name, response.status(), seen, elapsed);
    response
}

fn log_entry(original: &Parts, route: &str, status: StatusCode, seen: Seen<'_>, elapsed: Duration) {
    if !access_log::enabled() {
        return;
    }
    access_log::log(&AccessEntry {
        method: original.method.as_str(),
        path: original.uri.path(),
        route,
        status: status.as_u16(),
        elapsed: Some(elapsed),
        upstream: None,
        client_ip: seen.client_ip,
        limit: seen.limit,
        retries: 0,
        refused: None,
        front: Front::Auth.label(),
        tokens: None,
        queued: seen.queued,
        trace: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use http::HeaderValue;
    use std::path::Path;

    fn snapshot(extra: &str) -> std::sync::Arc<Snapshot> {
        let text = format!(
            "[decision]\nlisten = \"127.0.0.1:0\"\n[limits.per_ip]\nkey = \"ip\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1m\"\n[[routes]]\nname = \"api\"\nmatch = {{ path_prefix = \"/api\" }}\nlimits = [\"per_ip\"]\n{extra}"
        );
        let config = Config::from_bytes(Path::new("gateway.toml"), text.as_bytes()).unwrap();
        App::new(config).snapshot()
    }

    fn head(headers: &[(&'static str, &'static str)]) -> Parts {
        let mut request = Request::new(());
        for (name, v) in headers {
            request
                .headers_mut()
                .insert(HeaderName::from_static(name), HeaderValue::from_static(v));
        }
        request.into_parts().0
    }

    #[test]
    fn traefik_and_nginx_headers_both_describe_the_original() {
        let snapshot = snapshot("");
        let traefik = head(&[
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/api/./v1//items?x=1"),
            ("x-forwarded-host", "api.example"),
        ]);
        let original = original_request(&snapshot, &traefik).unwrap();
        assert_eq!(original.method, Method::POST);
        assert_eq!(original.uri.to_string(), "/api/v1/items?x=1");
        assert_eq!(original.headers[HOST], "api.example");
        let nginx = head(&[
            ("x-original-method", "GET"),
            ("x-original-uri", "/api/%7Ea"),
        ]);
        let original = original_request(&snapshot, &nginx).unwrap();
        assert_eq!(original.uri.path(), "/api/~a");
    }

    #[test]
    fn without_the_original_method_and_uri_there_is_nothing_to_decide() {
        let snapshot = snapshot("");
        for headers in [
            &[][..],
            &[("x-original-uri", "/api")][..],
            &[("x-forwarded-method", "GET")][..],
        ] {
            assert!(original_request(&snapshot, &head(headers)).is_err());
        }
        let escaping = head(&[("x-original-method", "GET"), ("x-original-uri", "/../etc")]);
        assert!(original_request(&snapshot, &escaping).is_err());
        let bad_method = head(&[("x-original-method", "G T"), ("x-original-uri", "/api")]);
        assert!(original_request(&snapshot, &bad_method).is_err());
    }

    #[test]
    fn a_second_family_that_disagrees_is_a_forgery() {
        let snapshot = snapshot("");
        // nginx sets X-Original-*; the client added X-Forwarded-Uri.
        let forged = head(&[
            ("x-original-method", "GET"),
            ("x-original-uri", "/api/items"),
            ("x-forwarded-uri", "/public"),
        ]);
        assert!(original_request(&snapshot, &forged).is_err());
        let forged_method = head(&[
            ("x-original-method", "GET"),
            ("x-original-uri", "/api/items"),
            ("x-forwarded-method", "POST"),
        ]);
        assert!(original_request(&snapshot, &forged_method).is_err());
        // Both families saying the same is no conflict.
        let both = head(&[
            ("x-original-method", "GET"),
            ("x-original-uri", "/api/items"),
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "/api/items"),
        ]);
        assert_eq!(
            original_request(&snapshot, &both).unwrap().uri.path(),
            "/api/items"
        );
        // ingress-nginx's X-Original-URL: the whole URL.
        let ingress = head(&[
            ("x-original-method", "GET"),
            ("x-original-url", "https://api.example/api/v2?x=1"),
        ]);
        let original = original_request(&snapshot, &ingress).unwrap();
        assert_eq!(original.uri.to_string(), "/api/v2?x=1");
    }

    #[test]
    fn x_real_ip_counts_only_from_a_trusted_peer() {
        let peer: IpAddr = "10.0.0.2".parse().unwrap();
        let headers = head(&[("x-real-ip", "203.0.113.9")]).headers;
        let untrusted = snapshot("");
        assert_eq!(client_ip(&untrusted, &headers, peer), peer);
        let trusted = snapshot("[client_ip]\ntrusted_cidrs = [\"10.0.0.0/8\"]\n");
        assert_eq!(
            client_ip(&trusted, &headers, peer),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        // An IPv4-mapped peer is the IPv4 address, as for the proxy.
        let mapped: IpAddr = "::ffff:10.0.0.2".parse().unwrap();
        assert_eq!(
            client_ip(&trusted, &headers, mapped),
            "203.0.113.9".parse::<IpAddr>().unwrap()
        );
        let forwarded = head(&[
            ("x-real-ip", "203.0.113.9"),
            ("x-forwarded-for", "198.51.100.7"),
        ])
        .headers;
        assert_eq!(
            client_ip(&trusted, &forwarded, peer),
            "198.51.100.7".parse::<IpAddr>().unwrap()
        );
    }
}
