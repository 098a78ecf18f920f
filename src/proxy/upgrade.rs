//! Upgraded connections (WebSocket and other `Upgrade:` protocols).
//!
//! Only the protocols of `[server] upgrades` (default `["websocket"]`) are
//! tunnelled: a tunnel carries bytes past routing and limits, so an `h2c`
//! upgrade would let every later request on the connection walk around
//! them. Others are dropped from the request before forwarding
//! ([`allow_only`]), and a `101` to a protocol the client could not ask for
//! is refused ([`switched_to_allowed`]).
//!
//! `Upgrade` and `Connection` are hop-by-hop, so forwarding leaves them out;
//! for a request that asks to upgrade, the gateway writes them again on the
//! way up (`forward.rs`) and, when the upstream answers `101 Switching
//! Protocols`, on the way down (`client/head.rs`). Then the client's
//! connection is handed over by hyper, the upstream's by the gateway's own
//! client, and a tunnel task copies bytes both ways until either side
//! closes. Whatever the request held — its
//! concurrency slots — is held by the tunnel for its whole life (contract:
//! "for an upgraded connection, for the life of the tunnel").

use http::header::UPGRADE;
use http::{HeaderMap, HeaderValue};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

use crate::http1::client::UpstreamConn;
use crate::limit::Permits;

/// Joins the client's upgraded connection to the upstream's, holding
/// `permits` until the tunnel closes. Bytes the upstream sent right after
/// its `101` (already read with the head) go to the client first.
pub(crate) fn spawn_tunnel(downstream: OnUpgrade, upstream: UpstreamConn, permits: Permits) {
    tokio::spawn(async move {
        let _held = permits;
        let downstream = match downstream.await {
            Ok(upgraded) => upgraded,
            Err(error) => {
                tracing::debug!(%error, "upgrade failed");
                return;
            }
        };
        let mut downstream = TokioIo::new(downstream);
        let (mut upstream, early) = upstream.into_parts();
        if !early.is_empty()
            && let Err(error) = downstream.write_all(&early).await
        {
            tracing::debug!(%error, "tunnel ended with an error");
            return;
        }
        match tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await {
            Ok((up, down)) => tracing::debug!(up, down, "tunnel closed"),
            Err(error) => tracing::debug!(%error, "tunnel ended with an error"),
        }
    });
}

/// The protocol name of one `Upgrade` list element (`websocket`,
/// `foo/1.1` → `foo`), compared case-insensitively.
fn protocol_name(element: &str) -> &str {
    element.split('/').next().unwrap_or("").trim()
}

fn allowed(element: &str, protocols: &[Box<str>]) -> bool {
    let name = protocol_name(element);
    protocols.iter().any(|p| p.eq_ignore_ascii_case(name))
}

/// Keeps only the allowed protocols in the request's `Upgrade` (removing the
/// field when none is left, so the request is forwarded as a plain one).
pub(crate) fn allow_only(headers: &mut HeaderMap, protocols: &[Box<str>]) {
    // A scan of the names first: most requests have no `Upgrade`, and a
    // hashed lookup of one cost more than comparing a few standard names.
    if !headers.keys().any(|name| name == UPGRADE) {
        return;
    }
    let Some(value) = headers.get(UPGRADE) else {
        return;
    };
    let offered = value.to_str().unwrap_or("");
    let elements: Vec<&str> = offered.split(',').map(str::trim).collect();
    if headers.get_all(UPGRADE).iter().count() == 1
        && elements.iter().all(|e| allowed(e, protocols))
    {
        return;
    }
    let kept: Vec<&str> = headers
        .get_all(UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|e| allowed(e, protocols))
        .collect();
    let kept = kept.join(", ");
    headers.remove(UPGRADE);
    if !kept.is_empty()
        && let Ok(value) = HeaderValue::from_str(&kept)
    {
        headers.insert(UPGRADE, value);
    }
}

/// Whether an upstream's `101` switched to an allowed protocol (its
/// `Upgrade` value, as relayed).
pub(crate) fn switched_to_allowed(upgrade: Option<&[u8]>, protocols: &[Box<str>]) -> bool {
    let Some(value) = upgrade.and_then(|v| std::str::from_utf8(v).ok()) else {
        return false;
    };
    let mut elements = value.split(',').map(str::trim);
    // A server switches to exactly one protocol (RFC 9110 §7.8).
    matches!((elements.next(), elements.next()), (Some(one), None) if allowed(one, protocols))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn websocket() -> Vec<Box<str>> {
        vec!["websocket".into()]
    }

    fn upgrade_after(values: &[&str]) -> Option<String> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(UPGRADE, HeaderValue::from_str(v).unwrap());
        }
        allow_only(&mut headers, &websocket());
        let kept: Vec<&str> = headers
            .get_all(UPGRADE)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        (!kept.is_empty()).then(|| kept.join(" | "))
    }

    #[test]
    fn only_allowed_protocols_are_kept() {
        assert_eq!(upgrade_after(&["websocket"]).as_deref(), Some("websocket"));
        assert_eq!(upgrade_after(&["WebSocket"]).as_deref(), Some("WebSocket"));
        assert_eq!(upgrade_after(&["h2c"]), None);
        assert_eq!(
            upgrade_after(&["h2c, websocket"]).as_deref(),
            Some("websocket")
        );
        assert_eq!(
            upgrade_after(&["h2c", "websocket"]).as_deref(),
            Some("websocket")
        );
        assert_eq!(upgrade_after(&["TLS/1.2"]), None);
        assert_eq!(upgrade_after(&[]), None);
    }

    #[test]
    fn a_switch_is_checked_against_the_list() {
        assert!(switched_to_allowed(Some(b"websocket"), &websocket()));
        assert!(!switched_to_allowed(Some(b"h2c"), &websocket()));
        assert!(!switched_to_allowed(Some(b"websocket, h2c"), &websocket()));
        assert!(!switched_to_allowed(None, &websocket()));
    }
}
