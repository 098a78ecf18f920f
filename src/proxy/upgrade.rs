//! Upgraded connections (WebSocket and other `Upgrade:` protocols).
//!
//! `Upgrade` and `Connection` are hop-by-hop, so forwarding strips them; for
//! a request that asks to upgrade, the gateway re-adds them on the way up and,
//! when the upstream answers `101 Switching Protocols`, on the way down. Then
//! the client's connection is handed over by hyper, the upstream's by the
//! gateway's own client, and a tunnel task copies bytes
//! both ways until either side closes. Whatever the request held — its
//! concurrency slots — is held by the tunnel for its whole life (contract:
//! "for an upgraded connection, for the life of the tunnel").

use http::header::{CONNECTION, HeaderMap, HeaderValue, UPGRADE};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

use super::client::UpstreamConn;
use crate::limit::Permits;

/// The protocol a request asks to upgrade to: its `Upgrade` header, when
/// `Connection` lists the `upgrade` token.
pub fn requested(headers: &HeaderMap) -> Option<HeaderValue> {
    let wants = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    wants.then(|| headers.get(UPGRADE).cloned()).flatten()
}

/// Puts back the upgrade headers that hop-by-hop removal took off.
pub fn restore_headers(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(UPGRADE, protocol);
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
}

/// Joins the client's upgraded connection to the upstream's, holding
/// `permits` until the tunnel closes. Bytes the upstream sent right after
/// its `101` (already read with the head) go to the client first.
pub fn spawn_tunnel(downstream: OnUpgrade, upstream: UpstreamConn, permits: Permits) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_needs_the_connection_token() {
        let mut headers = HeaderMap::new();
        headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(requested(&headers), None);
        headers.insert(CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        assert_eq!(
            requested(&headers),
            Some(HeaderValue::from_static("websocket"))
        );
    }
}
