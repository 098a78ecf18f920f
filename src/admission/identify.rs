//! Who is calling: the steps before the limits that every caller of
//! admission runs the same way (the proxy on a live request, `simulate` on
//! a trace record, the decision service on a described one) — the
//! caller's consumer from its API key, the client IP behind trusted
//! proxies, and the body's fields for `body:FIELD` keys.

use std::net::IpAddr;

use http::HeaderMap;
use http::header::CONTENT_TYPE;
use ipnet::IpNet;

use crate::app::Snapshot;
use crate::config::{Consumer, RouteConfig};
use crate::identity::body_fields::BodyFields;
use crate::identity::client_ip::{client_net, resolve_with};
use crate::identity::consumer;

/// What is known of the caller when its limits decide.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'r, 's> {
    /// The client after trusted-proxy resolution ([`client_ip`]).
    pub client_ip: IpAddr,
    /// The consumer its API key maps to ([`caller`]).
    pub consumer: Option<&'s Consumer>,
    /// The body's top-level fields, when a limit keys on them and the body
    /// was read whole within `max_key_body` ([`body_fields`]).
    pub body: Option<&'r BodyFields>,
}

impl<'s> Identity<'_, 's> {
    /// The client's network as its keys see it (the configured prefix).
    #[inline]
    pub(crate) fn client_net(&self, snapshot: &Snapshot) -> IpNet {
        client_net(self.client_ip, &snapshot.client_ip)
    }

    /// The caller's plan, if its consumer has one.
    #[inline]
    pub(crate) fn plan(&self) -> Option<&'s str> {
        self.consumer.and_then(|c| c.plan.as_deref())
    }
}

/// The caller's consumer; `Err` (with the reason, for a 401) where the route
/// or the configuration demands one the request does not name.
pub fn caller<'s>(
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    headers: &HeaderMap,
) -> Result<Option<&'s Consumer>, &'static str> {
    consumer::admit(headers, &snapshot.config, route.require_consumer)
}

/// The client behind the trusted proxies in front of `peer`, from the
/// configured forwarding header.
#[inline]
pub fn client_ip(snapshot: &Snapshot, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
    let forward_header = || {
        headers
            .get_all(snapshot.client_ip.header.name())
            .iter()
            .map(|v| v.as_bytes())
    };
    resolve_with(peer, forward_header, &snapshot.client_ip)
}

/// A body read whole, parsed by its `Content-Type` for `body:FIELD` keys.
pub(crate) fn body_fields(headers: &HeaderMap, body: &[u8]) -> BodyFields {
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
    BodyFields::parse(content_type, body)
}
