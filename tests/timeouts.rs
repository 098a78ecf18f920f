//! Time limits on bodies: an upstream that stops sending its
//! response body mid-way cannot hold the client's and its own connection
//! for ever — past `read_timeout` the client's stream is cut, the upstream
//! connection is dropped, and the failure is counted as `kind="timeout"`;
//! a client that stops sending its request body gets 408 past
//! `body_read_timeout`, not counted as an upstream error. The gateway in
//! process on paused time: every timeout fires when its time comes, with
//! no real wait.

mod common;

use std::time::Duration;

use common::openmetrics::parse;
use common::{InProcess, get};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test(start_paused = true)]
async fn a_stalled_upstream_body_is_cut_after_read_timeout() {
    // A raw upstream: the head and 10 of 100 body bytes, then silence; it
    // reports when the gateway drops the connection.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let (dropped_tx, dropped_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut head = vec![0u8; 4096];
        let _ = stream.read(&mut head).await;
        stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789")
            .await
            .unwrap();
        let mut rest = [0u8; 64];
        // Wait (up to a minute) for the gateway to close its end.
        let _ = common::within_wall_clock(Duration::from_secs(60), stream.read(&mut rest)).await;
        let _ = dropped_tx.send(());
    });
    let gateway = InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"

[upstreams.api]
url = "http://{upstream}"
read_timeout = "300ms"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#
    ))
    .await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client
        .write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut received = Vec::new();
    // The gateway cuts the stream: the read ends (EOF or reset) long before
    // this generous bound.
    common::within_wall_clock(Duration::from_secs(20), async {
        let mut buf = [0u8; 1024];
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the client's stream was cut, not left open");
    let text = String::from_utf8_lossy(&received);
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    assert!(
        text.ends_with("0123456789"),
        "the body stops where the upstream stopped: {text}"
    );
    common::within_wall_clock(Duration::from_secs(20), dropped_rx)
        .await
        .expect("the upstream connection is dropped")
        .unwrap();
    let reply = get(gateway.admin.unwrap(), "/metrics", &[]).await;
    let metrics = parse(&String::from_utf8_lossy(&reply.body)).unwrap();
    assert_eq!(
        metrics.value(
            "tollgate_upstream_errors_total",
            &[("upstream", "api"), ("kind", "timeout")]
        ),
        Some(1.0)
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stalls_mid_body_gets_408_and_no_upstream_error() {
    let upstream = common::TestUpstream::start().await;
    let gateway = InProcess::start(&format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
body_read_timeout = "300ms"

[upstreams.api]
url = "{}"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#,
        upstream.url()
    ))
    .await;
    for head in [
        // Declared 100 bytes, sends 10.
        "POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789",
        // Chunked: one chunk, then silence.
        "POST /upload HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\na\r\n0123456789\r\n",
    ] {
        let mut client = TcpStream::connect(gateway.addr).await.unwrap();
        client.write_all(head.as_bytes()).await.unwrap();
        let mut received = Vec::new();
        let _ =
            common::within_wall_clock(Duration::from_secs(20), client.read_to_end(&mut received))
                .await;
        let text = String::from_utf8_lossy(&received);
        assert!(text.starts_with("HTTP/1.1 408"), "{head:?}: {text}");
        assert!(text.contains("application/problem+json"), "{text}");
    }
    let reply = get(gateway.admin.unwrap(), "/metrics", &[]).await;
    let metrics = parse(&String::from_utf8_lossy(&reply.body)).unwrap();
    assert_eq!(
        metrics.sum("tollgate_upstream_errors_total", &[("upstream", "api")]),
        0.0,
        "the client's stall is not an upstream error"
    );
}
