//! One request sent upstream: the body capped at the route's `max_body`,
//! the upstream request prepared (`proxy::forward`), the exchange, and an
//! upstream's `101 Switching Protocols` turned into a tunnel when the
//! client asked for that protocol.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use http::request::Parts;
use http::{Response, StatusCode};

use crate::admission::body::{PendingBody, declared_length};
use crate::answer::body::ResponseBody;
use crate::answer::error::GatewayError;
use crate::app::Snapshot;
use crate::config::RouteConfig;
use crate::http::field_lines::FieldLines;
use crate::http1::client::InterimSink;
use crate::limit::Permits;
use crate::proxy::body::{BodyCap, RequestBody, Stall};
use crate::proxy::downstream::Downstream;
use crate::proxy::forward;
use crate::proxy::tokens;
use crate::proxy::upgrade;
use crate::upstream::pool::PoolError;
use crate::upstream::{Attempt, Upstream};

/// Forwards the request upstream and hands back the upstream's response.
///
/// What comes before the upstream call that needs no `.await` is done by
/// plain functions ([`upstream_body`], [`forward::prepare`]), so their
/// temporaries are not kept in this future — which every future above it
/// embeds. The request's head is lent (`parts`: it stays where the handler
/// made it), and the request sent is made where it stays, in this future:
/// a request built by a function and handed back through a `Result` was
/// copied three times (584 bytes each).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn send_upstream(
    snapshot: &Snapshot,
    route: &RouteConfig,
    downstream: Downstream,
    parts: &mut Parts,
    body: PendingBody,
    permits: &mut Permits,
    interim: Option<&dyn InterimSink>,
    attempt: &mut Attempt,
) -> Result<(Response<ResponseBody>, FieldLines), GatewayError> {
    let (upstream, body, exceeded) = upstream_body(snapshot, route, parts, body)?;
    upgrade::allow_only(&mut parts.headers, &snapshot.config.server.upgrades);
    let mut request = forward::Prepared::new(parts, body);
    forward::prepare(upstream, &mut request, downstream.peer, downstream.proto);
    if let Some(rule) = &route.tokens {
        tokens::accept_usage_trailer(rule, &mut request.own);
    }
    // hyper hands the client's connection over if we answer 101.
    let client_upgrade = if request.own.upgrade {
        request
            .parts
            .extensions
            .remove::<hyper::upgrade::OnUpgrade>()
    } else {
        None
    };
    let cap = forward::BodyCapped {
        exceeded: exceeded.as_deref(),
        limit: route.max_body.unwrap_or(u64::MAX),
    };
    let (mut response, fields) =
        forward::exchange(upstream, &mut request, cap, interim, attempt).await?;
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if !upgrade::switched_to_allowed(
            fields.relayed_value("upgrade"),
            &snapshot.config.server.upgrades,
        ) {
            tracing::warn!(upstream = %upstream.config.name, "the upstream switched to a protocol that is not in server.upgrades");
            return Err(GatewayError::UpstreamFailed {
                upstream: upstream.config.name.clone(),
                source: PoolError::Request(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the upstream switched to a protocol that is not in server.upgrades",
                )),
            });
        }
        match (client_upgrade, response.body_mut().take_upgraded()) {
            (Some(client_upgrade), Some(upstream_conn)) => {
                upgrade::spawn_tunnel(client_upgrade, upstream_conn, std::mem::take(permits));
            }
            // A switch nobody asked for cannot be relayed.
            _ => {
                tracing::warn!(upstream = %upstream.config.name, "the upstream switched protocols unasked");
                return Err(GatewayError::UpstreamFailed {
                    upstream: upstream.config.name.clone(),
                    source: PoolError::Request(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "the upstream switched protocols unasked",
                    )),
                });
            }
        }
    }
    Ok((response.map(ResponseBody::upstream), fields))
}

/// The upstream of the route, and the body to send it (capped at
/// `max_body`, with the flag it sets when a streamed body outgrows it).
fn upstream_body<'s>(
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    parts: &Parts,
    body: PendingBody,
) -> Result<(&'s Upstream, RequestBody, Option<Arc<AtomicBool>>), GatewayError> {
    let Some(upstream) = snapshot.upstream_of(&route.action) else {
        // Validation resolves every upstream reference; reaching this is a bug.
        debug_assert!(false, "route {} has no upstream", route.name);
        return Err(GatewayError::BadRequest {
            reason: "route has no upstream",
        });
    };
    let (cap, exceeded) = match route.max_body {
        None => (None, None),
        Some(limit) => {
            if declared_length(parts).is_some_and(|length| length > limit) {
                return Err(GatewayError::BodyTooLarge { limit });
            }
            let exceeded = Arc::new(AtomicBool::new(false));
            let cap = BodyCap {
                limit,
                seen: 0,
                exceeded: exceeded.clone(),
            };
            (Some(cap), Some(exceeded))
        }
    };
    let body = match body {
        PendingBody::Fresh(inner) => RequestBody::Streaming {
            replay: None,
            inner,
            cap,
            stall: Stall::new(snapshot.config.server.body_read_timeout),
        },
        // Already checked against `max_body` while buffering.
        PendingBody::Complete(bytes) => RequestBody::Buffered(Some(bytes)),
        PendingBody::Partial(bytes, inner) => {
            let cap = cap.map(|cap| BodyCap {
                seen: bytes.len() as u64,
                ..cap
            });
            RequestBody::Streaming {
                replay: Some(bytes),
                inner,
                cap,
                stall: Stall::new(snapshot.config.server.body_read_timeout),
            }
        }
    };
    Ok((upstream, body, exceeded))
}
