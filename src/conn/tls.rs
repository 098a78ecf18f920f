//! TLS termination: the handshake of a `[server.tls]` listener's connection,
//! then the same connection code as a TCP stream's.
//!
//! The handshake uses the certificates of the snapshot current when it
//! starts, so a reload that re-read them applies to the next handshake while
//! open connections keep theirs. It runs in the connection's own task and
//! must finish within `header_read_timeout` (a client that stalls it is cut
//! off like a slow request head); a failed or stalled handshake is counted
//! in `tollgate_tls_handshake_failures_total{reason}`. ALPN decides the
//! protocol: `h2` goes to hyper's HTTP/2 server ([`super::h2`]), anything
//! else (`http/1.1`, or no ALPN) to the HTTP/1.1 path.

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use crate::app::App;
use crate::conn::drain::DrainWatch;
use crate::conn::evict::Registry;
use crate::conn::h2;
use crate::conn::serve::{ActivityIo, serve_connection};
use crate::conn::watchdog::ConnParts;
use crate::http1::server::ConnActivity;

/// Serves one connection of a TLS listener, from its handshake to its close.
pub(crate) async fn serve(
    app: Arc<App>,
    stream: TcpStream,
    peer: SocketAddr,
    drain: DrainWatch,
    connections: Arc<Registry>,
) {
    let snapshot = app.snapshot();
    let server = &snapshot.config.server;
    // The listener outlived its `[server.tls]` (removed by a reload, and
    // the accept loop not stopped yet): nothing to handshake with.
    let Some(tls) = &server.tls else { return };
    let acceptor = TlsAcceptor::from(tls.server.0.clone());
    let timeout = server.header_read_timeout;
    drop(snapshot);
    let handshake = pin!(tokio::time::timeout(timeout, acceptor.accept(stream)));
    let mut drain = drain;
    let stream = tokio::select! {
        accepted = handshake => match accepted {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::debug!(%peer, %error, "TLS handshake failed");
                app.metrics().record_tls_handshake_failure("error");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, ?timeout, "TLS handshake not complete in time; closing");
                app.metrics().record_tls_handshake_failure("timeout");
                return;
            }
        },
        // Draining: a connection still shaking hands has no request to finish.
        _ = &mut drain => return,
    };
    if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
        let activity = Arc::new(ConnActivity::new());
        let _registered = connections.register(crate::worker::worker_index(), activity.clone());
        let io = ActivityIo {
            inner: stream,
            activity: activity.clone(),
        };
        h2::serve(ConnParts::new(app, activity, peer, true), io, drain, false).await;
    } else {
        serve_connection(app, stream, peer, true, drain, &connections).await;
    }
}
