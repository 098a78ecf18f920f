//! `tollgate::run` in the test's own process: it serves listeners bound on
//! port 0, applies a configuration installed while it runs, and on its
//! shutdown future drains the request in flight and returns.

mod common;

use std::time::Duration;

use common::{InProcess, TestUpstream, gateway_toml, get};

/// A `respond` route with `health_limits`, and everything else upstream.
fn routes(health_limits: &str) -> String {
    format!(
        r#"
[[routes]]
name = "health"
match = {{ path = "/health" }}
respond = {{ status = 200, body = "ok\n" }}
limits = [{health_limits}]

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#
    )
}

#[tokio::test(start_paused = true)]
async fn run_drains_the_request_in_flight_when_its_shutdown_completes() {
    let upstream = TestUpstream::start().await;
    let gw = InProcess::start(&gateway_toml(&upstream, "", &routes(""))).await;
    let addr = gw.addr;
    assert_eq!(get(addr, "/health", &[]).await.status, 200);
    let in_flight = tokio::spawn(async move { get(addr, "/slow/800", &[]).await });
    // Paused time: the upstream holds the request for 800 ms of it.
    assert!(
        common::eventually(async || upstream.arrived() == 1).await,
        "the request never reached the upstream"
    );
    assert!(!in_flight.is_finished());
    gw.stop().await;
    let reply = in_flight.await.expect("the request task");
    assert_eq!(reply.status, 200, "the request in flight was cut short");
    assert_eq!(&reply.body[..], b"echo");
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is still open after run returned"
    );
}

#[tokio::test(start_paused = true)]
async fn a_configuration_installed_while_running_takes_effect() {
    let upstream = TestUpstream::start().await;
    let gw = InProcess::start(&gateway_toml(&upstream, "", &routes(""))).await;
    assert_eq!(get(gw.addr, "/health", &[]).await.status, 200);
    let once = "[limits.once]\nkey = \"route\"\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1m\"\n";
    let limited = gateway_toml(&upstream, "", &format!("{once}{}", routes("\"once\"")));
    let config = tollgate::config::Config::from_bytes(
        std::path::Path::new("gateway.toml"),
        limited.as_bytes(),
    )
    .unwrap_or_else(|error| panic!("{error}"));
    gw.app.install(config);
    assert_eq!(get(gw.addr, "/health", &[]).await.status, 200);
    assert_eq!(get(gw.addr, "/health", &[]).await.status, 429);
    // A minute of paused time later, the window has passed.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(get(gw.addr, "/health", &[]).await.status, 200);
}
