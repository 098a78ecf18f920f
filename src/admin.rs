//! The admin listener (`server.admin`, e.g. `"127.0.0.1:9091"`; omitted =
//! disabled): what an operator and Prometheus read, on its own socket so that
//! it can stay on loopback or a management network while traffic listens
//! publicly, and so that a traffic flood (or `max_connections`) never starves
//! a scrape.
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /metrics` | OpenMetrics text ([`crate::metrics`]) |
//! | `GET /healthz` | 200 while the process runs |
//! | `GET /readyz` | 200, or 503 while the store is down with `on_failure = "deny"` ([`App::is_ready`]) or some upstream has no URL up ([`App::unhealthy_upstreams`]) |
//! | `GET /config` | `{"path","sha256","loaded_at","generation","last_error"}` of the configuration serving |
//! | `GET /limits/NAME?key=VALUE` | one key's state of limit NAME, charging nothing (`explain.rs`) |
//! | `POST /limits/NAME/reset?key=VALUE` | that key emptied; its state before ([`reset`]) |
//! | `PUT`, `GET`, `DELETE /limits/NAME/overrides[?key=VALUE]` | per-key overrides ([`overrides`]) |
//! | `GET /stats` | the gateway at a glance as JSON, from the same counters ([`stats`]) |
//! | `GET /dashboard` | the page that draws `/stats` ([`dashboard`]) |
//!
//! Other paths are 404, other methods 405, both problem+json. HTTP/1.1 only.
//! Every request but `GET /healthz`, `/readyz` and `/metrics` passes
//! [`auth`] first (the admin token; no writes without one), and every
//! accepted write is recorded by [`audit`]. [`client`] is the other end:
//! `tollgate admin ...` sending one request from the command line.
//! The listener closes when the traffic drain starts; open admin connections
//! finish their request and close.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{ALLOW, CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use crate::admission::explain::{ExplainError, explain};
use crate::answer::body::ResponseBody;
use crate::answer::response::problem as problem_response;
use crate::app::App;
use crate::conn::accept::{accept_and_serve, until_shutdown};
use crate::http::problem;

pub(crate) mod audit;
mod auth;
pub mod client;
mod dashboard;
mod exposition;
mod overrides;
mod reset;
mod stats;

/// Admin connections served at once; more wait in the backlog. Scrapers and
/// health checkers need a handful.
const MAX_CONNECTIONS: usize = 64;

/// Binds the admin listener.
pub(crate) async fn bind(address: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(address).await.map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot listen on {address} (server.admin): {e}"),
        )
    })
}

/// Serves the admin endpoints on `listener` until `shutdown` turns true.
pub(crate) async fn serve(app: Arc<App>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let stop = shutdown.clone();
    accept_and_serve(listener, permits, None, stop, |stream, peer| {
        let app = app.clone();
        let shutdown = shutdown.clone();
        async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let app = app.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(handle(&app, request, Some(peer)).await)
                }
            });
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10));
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            until_shutdown(connection, shutdown, |c| c.graceful_shutdown(), "admin").await;
        }
    })
    .await;
}

/// One admin request from `peer`: refused by [`auth`], or a write
/// answered, or a read ([`answer`]). Per-key overrides read a body: their
/// own module takes the request, behind the same check.
async fn handle(
    app: &App,
    request: Request<hyper::body::Incoming>,
    peer: Option<SocketAddr>,
) -> Response<ResponseBody> {
    let method = request.method();
    let target = request.uri().path_and_query().map_or("/", |pq| pq.as_str());
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    {
        let snapshot = app.snapshot();
        let token = snapshot.config.server.admin_token.as_ref();
        if let Some(refused) = auth::refusal(token, method, path, request.headers()) {
            return refused;
        }
    }
    if overrides::claims(path) {
        return overrides::answer(app, request, peer).await;
    }
    let reset = path
        .strip_prefix("/limits/")
        .and_then(|rest| rest.strip_suffix("/reset"))
        .filter(|name| !name.is_empty() && !name.contains('/'));
    match reset {
        Some(limit) if method == Method::POST => {
            reset::answer(app, &decoded(limit), query, peer).await
        }
        _ => answer(app, method, target).await,
    }
}

/// A limit's name as the path spells it, percent-decoded.
pub(super) fn decoded(name: &str) -> String {
    String::from_utf8_lossy(&crate::identity::body_fields::percent_decode(
        name.as_bytes(),
    ))
    .into_owned()
}

/// The answer to one admin read for `target` (path and query).
pub(crate) async fn answer(app: &App, method: &Method, target: &str) -> Response<ResponseBody> {
    let (path, query) = match target.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (target, None),
    };
    let limit = path
        .strip_prefix("/limits/")
        .filter(|name| !name.is_empty());
    let known = matches!(
        path,
        "/metrics" | "/healthz" | "/readyz" | "/config" | "/stats" | "/dashboard"
    ) || limit.is_some();
    if !known {
        return problem_response(StatusCode::NOT_FOUND, &format!("no admin endpoint {path}"));
    }
    if method != Method::GET && method != Method::HEAD {
        let mut response = problem_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &format!("{path} answers GET and HEAD only"),
        );
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    if let Some(limit) = limit {
        return explain_limit(app, limit, query).await;
    }
    match path {
        "/metrics" => {
            // Live keys are counted at scrape time, so the gauge is current;
            // so are ejections whose time is up.
            app.refresh_limiter_keys();
            app.refresh_upstream_health();
            ok(app.metrics().encode(), crate::metrics::CONTENT_TYPE)
        }
        "/healthz" => ok("ok\n".to_owned(), "text/plain; charset=utf-8"),
        "/stats" => ok(stats::stats(app).to_string(), "application/json"),
        "/dashboard" => dashboard::page(),
        "/readyz" if !app.is_ready() => problem_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "the limiter store is down and store.on_failure is \"deny\"",
        ),
        "/readyz" => match app.unhealthy_upstreams() {
            unhealthy if unhealthy.is_empty() && app.overrides_stale() => ok(
                "ready\noverrides: stale, redis does not answer; the last overrides seen apply\n"
                    .to_owned(),
                "text/plain; charset=utf-8",
            ),
            unhealthy if unhealthy.is_empty() => {
                ok("ready\n".to_owned(), "text/plain; charset=utf-8")
            }
            unhealthy => no_healthy_upstream(&unhealthy),
        },
        _ => ok(config_json(app).to_string(), "application/json"),
    }
}

/// `/readyz` while some upstream has no URL that takes requests: 503
/// problem+json naming them (`upstreams`), as their routes answer 503.
fn no_healthy_upstream(upstreams: &[String]) -> Response<ResponseBody> {
    /// The upstreams with no healthy instance, by name.
    const UPSTREAMS: problem::TextListMember = problem::problem_member!(text_list "upstreams");
    let status = StatusCode::SERVICE_UNAVAILABLE;
    let detail = format!(
        "upstreams with no healthy instance: {}",
        upstreams.join(", ")
    );
    let mut body = String::new();
    problem::about_blank_with(
        &mut body,
        status,
        problem::reason_title(status),
        &detail,
        |writer| {
            writer.text_list(&UPSTREAMS, |list| {
                for upstream in upstreams {
                    list.item(|text| text.escaped(upstream));
                }
            })
        },
    );
    let mut response = ok(body, problem::CONTENT_TYPE);
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    response
}

/// `/limits/NAME?key=VALUE`: one key's state, charging nothing ([`explain`]).
async fn explain_limit(app: &App, limit: &str, query: Option<&str>) -> Response<ResponseBody> {
    let limit = decoded(limit);
    match explain(&app.snapshot(), app.store(), &limit, query, app.clock.now()).await {
        Ok(state) => ok(state.to_string(), "application/json"),
        Err(ExplainError::UnknownLimit(message)) => {
            problem_response(StatusCode::NOT_FOUND, &message)
        }
        Err(ExplainError::BadKey(message)) => problem_response(StatusCode::BAD_REQUEST, &message),
    }
}

pub(crate) fn ok(body: String, content_type: &'static str) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(body));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// `/config`: the configuration serving now, and the last failed reload.
pub(crate) fn config_json(app: &App) -> serde_json::Value {
    let snapshot = app.snapshot();
    let last_error = app.last_reload_error().map(|error| {
        serde_json::json!({
            "message": error.message,
            "at": rfc3339(error.at),
        })
    });
    serde_json::json!({
        "path": snapshot.config.path.display().to_string(),
        "sha256": snapshot.config.sha256,
        "loaded_at": rfc3339(snapshot.loaded_at),
        "generation": snapshot.generation,
        "last_error": last_error,
    })
}

/// `time` as RFC 3339 in UTC with whole seconds, e.g. `2026-11-29T23:51:37Z`.
/// Times before 1970 print as the epoch (the gateway never has any).
pub(crate) fn rfc3339(time: SystemTime) -> String {
    let seconds = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`, for non-negative day counts).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(at(0)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(at(951_782_400)), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(at(1_709_251_199)), "2024-02-29T23:59:59Z");
        assert_eq!(rfc3339(at(1_798_761_600)), "2027-01-01T00:00:00Z");
        assert_eq!(rfc3339(at(4_107_542_400)), "2100-03-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(5)),
            "1970-01-01T00:00:00Z"
        );
    }

    fn app() -> Arc<App> {
        let config = crate::config::Config::from_bytes(std::path::Path::new("gateway.toml"), b"")
            .unwrap_or_else(|e| panic!("{e}"));
        App::new(config)
    }

    async fn body(response: Response<ResponseBody>) -> String {
        let bytes = response
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[tokio::test]
    async fn the_unready_upstreams_body_is_the_json_it_always_was() {
        let upstreams = ["api".to_owned(), "a \"quoted\" one".to_owned()];
        let response = no_healthy_upstream(&upstreams);
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        let expected = serde_json::json!({
            "type": "about:blank",
            "title": "Service Unavailable",
            "status": 503,
            "detail": format!("upstreams with no healthy instance: {}", upstreams.join(", ")),
            "upstreams": upstreams,
        });
        assert_eq!(body(response).await, expected.to_string());
    }

    #[tokio::test]
    async fn endpoints_methods_and_unknown_paths() {
        let app = app();
        let metrics = answer(&app, &Method::GET, "/metrics").await;
        assert_eq!(metrics.status(), StatusCode::OK);
        assert_eq!(
            metrics.headers()[CONTENT_TYPE],
            crate::metrics::CONTENT_TYPE
        );
        assert!(body(metrics).await.ends_with("# EOF\n"));
        assert_eq!(
            answer(&app, &Method::GET, "/healthz").await.status(),
            StatusCode::OK
        );
        assert_eq!(
            answer(&app, &Method::GET, "/readyz").await.status(),
            StatusCode::OK
        );
        let missing = answer(&app, &Method::GET, "/nope").await;
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        assert_eq!(missing.headers()[CONTENT_TYPE], "application/problem+json");
        let post = answer(&app, &Method::POST, "/metrics").await;
        assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(post.headers()[ALLOW], "GET, HEAD");
    }

    #[test]
    fn config_json_describes_the_running_config() {
        let app = app();
        let value = config_json(&app);
        assert_eq!(value["path"], "gateway.toml");
        assert_eq!(value["generation"], 1);
        assert_eq!(value["last_error"], serde_json::Value::Null);
        assert_eq!(value["sha256"].as_str().map(str::len), Some(64));
        app.set_reload_error(Some(crate::app::ReloadError {
            message: "gateway.toml:3:1: bad".into(),
            at: at(0),
        }));
        let value = config_json(&app);
        assert_eq!(value["last_error"]["message"], "gateway.toml:3:1: bad");
        assert_eq!(value["last_error"]["at"], "1970-01-01T00:00:00Z");
    }
}
