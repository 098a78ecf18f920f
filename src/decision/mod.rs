//! The decision service (`[decision] listen`): tollgate's limits for a
//! proxy that is already deployed, on a listener of its own beside the
//! proxy listener (or alone: a configuration with `[decision]` and no
//! `[server] listen` serves decisions only).
//!
//! | request | answer |
//! | --- | --- |
//! | gRPC `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` | Envoy's rate-limit service ([`rls`], [`grpc`]) |
//! | `POST /json` | the same call as proto3 JSON, envoyproxy/ratelimit's HTTP form ([`json`]) |
//! | `/auth` (any method) | forward-auth for nginx, ingress-nginx and Traefik ([`auth`]) |
//!
//! HTTP/1.1 and HTTP/2 (h2c with prior knowledge, as gRPC clients speak)
//! on one port. The decisions use the proxy's limits, stores, metrics
//! (`front = "rls"` or `"auth"`), access log and reloads: each request reads
//! the snapshot serving at the time. The listener is served by every worker
//! (`[server] workers`), each on a `SO_REUSEPORT` socket of its own
//! ([`crate::conn::Server::serve_side`]), so decisions per second scale
//! with the workers as the proxy's requests do; one `max_connections` cap
//! of its own covers all of them. It is bound at start; like the admin
//! listener, a reload does not move it. It closes when the traffic drain
//! starts; open connections finish their request.

pub(crate) mod auth;
pub(crate) mod grpc;
pub(crate) mod json;
pub(crate) mod rls;

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tonic::codegen::Service;

use crate::answer::body::ResponseBody;
use crate::answer::response::problem;
use crate::app::App;
use crate::conn::accept::{accept_and_serve, until_shutdown};
use crate::conn::{Listener, SideServe};

/// Binds the decision listener: one socket per worker.
pub(crate) fn bind(address: SocketAddr) -> io::Result<Listener> {
    crate::conn::bind_side(address, "decision.listen")
}

/// How each worker serves its socket of the decision listener
/// ([`crate::conn::Server::serve_side`]): [`serve`], under one connection
/// cap (`max_connections`) for all the workers.
pub(crate) fn on_every_worker(app: Arc<App>) -> SideServe {
    let permits = Arc::new(Semaphore::new(app.snapshot().config.server.max_connections));
    Arc::new(move |listener, shutdown| {
        Box::pin(serve(app.clone(), listener, permits.clone(), shutdown))
    })
}

/// Serves decisions on `listener` (a worker's socket), each connection with
/// a slot of `permits`, until `shutdown` turns true.
pub(crate) async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    permits: Arc<Semaphore>,
    shutdown: watch::Receiver<bool>,
) {
    let server = app.snapshot().config.server.clone();
    let stop = shutdown.clone();
    accept_and_serve(listener, permits, None, stop, |stream, peer| {
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let shutdown = shutdown.clone();
        let header_read_timeout = server.header_read_timeout;
        async move {
            let rls = grpc::server(app.clone());
            let service = service_fn(move |request: Request<Incoming>| {
                let app = app.clone();
                // gRPC by its content type (any path: tonic answers an
                // unknown method `UNIMPLEMENTED`).
                let grpc = if is_grpc(&request) {
                    Ok(rls.clone().call(request))
                } else {
                    Err(request)
                };
                async move {
                    let response = match grpc {
                        Ok(call) => match call.await {
                            Ok(response) => response.map(Either::Right),
                            Err(never) => match never {},
                        },
                        Err(request) => answer(&app, request, peer).await.map(Either::Left),
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout);
            builder.http2().timer(TokioTimer::new());
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            until_shutdown(connection, shutdown, |c| c.graceful_shutdown(), "decision").await;
        }
    })
    .await;
}

/// A gRPC call: `content-type: application/grpc` (or `application/grpc+proto`).
fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The answer to one HTTP request of the decision listener.
async fn answer(app: &App, request: Request<Incoming>, peer: SocketAddr) -> Response<ResponseBody> {
    match request.uri().path() {
        "/auth" => auth::answer(app, request, peer).await,
        "/json" => json::answer(app, request).await,
        path => {
            let detail = format!(
                "no decision endpoint {path}: /auth, POST /json or gRPC {}",
                rls::PATH
            );
            problem(StatusCode::NOT_FOUND, &detail)
        }
    }
}
