//! The whole gateway as one future: [`run`] serves already-bound
//! [`Listeners`] with an [`App`] until a shutdown future completes, then
//! drains. The binary is a thin shell around it (command line, logging,
//! signals); end-to-end tests call it in-process on port 0, where they can
//! pause tokio's clock and drive the limiter's clock from it (the clock is
//! injected: [`App::with_clock`]), as mini-redis's `server::run` lets its
//! tests do.
//!
//! The gateway owns its background tasks: the connections' server
//! ([`conn::start`]) with the decision listener on its workers, the admin
//! listener, and the idle sweeper of the
//! limiter registry (`app::sweep`), which runs until the
//! shutdown and not through the drain; and, with `[usage]`, the usage
//! exporter's threads (`usage::Exporter`), started before the listeners
//! serve and stopped after the drain, when every request has settled.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::{App, sweep};
use crate::config::Config;
use crate::{admin, conn, decision};

/// The sockets a gateway serves, bound before it runs (so a caller learns the
/// ports chosen for port 0, and a bind error comes before anything starts).
#[derive(Debug)]
pub struct Listeners {
    /// `[server] listen`, then `[server.tls] listen`, one socket per worker
    /// each ([`conn::bind`], [`conn::bind_tls`]).
    pub(crate) traffic: Vec<conn::Listener>,
    /// `[server] admin`, if configured.
    pub(crate) admin: Option<TcpListener>,
    /// `[decision] listen`, if configured: one socket per worker, as the
    /// traffic's ([`decision::bind`]).
    pub(crate) decision: Option<conn::Listener>,
}

impl Listeners {
    /// Binds `server.listen`, `server.tls.listen`, `server.admin` and
    /// `decision.listen`. Errors name the address.
    /// Call it from within a tokio runtime (the admin and decision
    /// listeners register with it).
    pub async fn bind(config: &Config) -> io::Result<Listeners> {
        let server = &config.server;
        let mut traffic = conn::bind(&server.listen)?;
        if let Some(tls) = &server.tls {
            traffic.extend(
                conn::bind_tls(&tls.listen)
                    .map_err(|e| io::Error::new(e.kind(), format!("{e} (server.tls.listen)")))?,
            );
        }
        let admin = match server.admin {
            None => None,
            Some(address) => Some(admin::bind(address).await?),
        };
        let decision = match &config.decision {
            None => None,
            Some(decision) => Some(decision::bind(decision.listen)?),
        };
        Ok(Listeners {
            traffic,
            admin,
            decision,
        })
    }

    /// The decision listener's address actually bound, if there is one.
    pub fn decision_addr(&self) -> io::Result<Option<SocketAddr>> {
        self.decision
            .as_ref()
            .map(conn::Listener::local_addr)
            .transpose()
    }

    /// The traffic addresses actually bound with their scheme (`http` or
    /// `https`), in configuration order.
    pub fn traffic_urls(&self) -> io::Result<Vec<String>> {
        self.traffic
            .iter()
            .map(|listener| {
                let scheme = if listener.is_tls() { "https" } else { "http" };
                Ok(format!("{scheme}://{}", listener.local_addr()?))
            })
            .collect()
    }

    /// The traffic addresses actually bound, in configuration order.
    pub fn traffic_addrs(&self) -> io::Result<Vec<SocketAddr>> {
        self.traffic
            .iter()
            .map(conn::Listener::local_addr)
            .collect()
    }

    /// The admin address actually bound, if there is an admin listener.
    pub fn admin_addr(&self) -> io::Result<Option<SocketAddr>> {
        self.admin.as_ref().map(TcpListener::local_addr).transpose()
    }
}

/// Serves `listeners` with `app` until `shutdown` completes, then drains
/// (in-flight requests finish, at most `shutdown_timeout`) and returns.
/// Reloads are the caller's: [`App::install`] a new configuration and the
/// running gateway applies it, listeners included. Fails when the worker
/// threads cannot be started, or `[usage]`'s spool or file cannot be
/// opened. Call it from within a tokio runtime; with `workers = 1`
/// everything runs on that runtime (the usage exporter on threads of its
/// own).
pub async fn run(
    listeners: Listeners,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let exporter = match app.usage().and_then(|usage| usage.start()) {
        Some(started) => Some(started?),
        None => None,
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut server = match conn::start(app.clone(), listeners.traffic, stop_rx.clone()) {
        Ok(server) => server,
        Err(error) => {
            if let Some(exporter) = exporter {
                exporter.stop();
            }
            return Err(error);
        }
    };
    if let Some(listener) = listeners.decision {
        server.serve_side(listener, decision::on_every_worker(app.clone()));
    }
    let sweeper = tokio::spawn(sweep::sweep_idle(app.clone()));
    let overrides = tokio::spawn(crate::app::override_sync::poll(app.clone()));
    let admin = listeners
        .admin
        .map(|listener| tokio::spawn(admin::serve(app, listener, stop_rx)));
    let serving = server.run();
    tokio::pin!(serving);
    tokio::select! {
        // Not before the shutdown: the server runs until it is signalled.
        () = &mut serving => {}
        () = shutdown => {
            let _ = stop_tx.send(true);
            // Before the drain, as the server stops accepting.
            sweeper.abort();
            overrides.abort();
            serving.await;
        }
    }
    sweeper.abort();
    overrides.abort();
    if let Some(admin) = admin {
        let _ = admin.await;
    }
    if let Some(exporter) = exporter {
        // Blocking: the writer syncs what is queued.
        let _ = tokio::task::spawn_blocking(move || exporter.stop()).await;
    }
    Ok(())
}
