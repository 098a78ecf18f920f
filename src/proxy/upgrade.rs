//! Upgraded connections (WebSocket and other `Upgrade:` protocols).
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

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::AsyncWriteExt;

use crate::http1::client::UpstreamConn;
use crate::limit::Permits;

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
