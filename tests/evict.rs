//! Oldest-idle eviction at `max_connections`: when the process
//! is at its cap, the keep-alive connection idle the longest is closed so a
//! new client is served instead of waiting in the accept backlog; a
//! connection in the middle of a request is never closed for it. Real
//! sockets against the gateway in process, on paused time. What must not
//! happen is shown by what did, never by a wait (paused time runs ahead
//! while the gateway's worker is still busy): the connection kept answers
//! a request afterwards, and the eviction counter says the new client was
//! let in through an eviction, not past the cap.

mod common;

use std::time::Duration;

use common::{InProcess, TestUpstream, get};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config(upstream: &TestUpstream, max_connections: usize) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1
max_connections = {max_connections}
idle_timeout = "60s"

[upstreams.api]
url = "{}"

[[routes]]
name = "api"
match = {{ path_prefix = "/" }}
upstream = "api"
"#,
        upstream.url()
    )
}

/// A keep-alive connection that has made one request and read its whole
/// response (`echo`, 4 bytes).
async fn idle_connection(gateway: &InProcess) -> TcpStream {
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(b"GET /idle HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let response = read_until(&mut stream, b"echo").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    stream
}

/// Reads until `end` has arrived (at most 10 s).
async fn read_until(stream: &mut TcpStream, end: &[u8]) -> String {
    let mut got = Vec::new();
    let read = common::within_wall_clock(Duration::from_secs(10), async {
        let mut buf = [0u8; 1024];
        while !got.windows(end.len()).any(|w| w == end) {
            let n = stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(
        read.is_some(),
        "timed out: {:?}",
        String::from_utf8_lossy(&got)
    );
    String::from_utf8_lossy(&got).into_owned()
}

/// Whether the gateway closed `stream` (EOF or reset) within `wait`.
async fn closed_within(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 64];
    match tokio::time::timeout(wait, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(n)) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&buf[..n])),
        Err(_) => false,
    }
}

/// The connections waiting in the accept backlog of the listener on
/// 127.0.0.1:`port` (Linux's `/proc/net/tcp`: a listening socket's
/// `rx_queue`), `None` when there is no such listener.
fn accept_backlog(port: u16) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // sl, local_address, rem_address, st (0A: listening), tx:rx queues
        if fields.get(1) != Some(&local.as_str()) || fields.get(3) != Some(&"0A") {
            return None;
        }
        let rx = fields.get(4)?.split(':').nth(1)?;
        u32::from_str_radix(rx, 16).ok()
    })
}

async fn evictions(gateway: &InProcess) -> String {
    let metrics = get(gateway.admin.unwrap(), "/metrics", &[]).await;
    String::from_utf8_lossy(&metrics.body)
        .lines()
        .find(|line| line.starts_with("tollgate_connections_evicted_total"))
        .unwrap_or("(missing)")
        .to_owned()
}

#[tokio::test(start_paused = true)]
async fn at_the_cap_the_oldest_idle_connection_makes_room_and_a_busy_one_is_kept() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, 3)).await;
    assert_eq!(
        evictions(&gateway).await,
        "tollgate_connections_evicted_total 0"
    );

    // Three connections fill the cap: the oldest idle, one in the middle of
    // a response (the upstream holds its last chunk), a newer idle one.
    let mut oldest = idle_connection(&gateway).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut busy = TcpStream::connect(gateway.addr).await.unwrap();
    busy.write_all(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    read_until(&mut busy, b"first\n").await;
    let mut newer = idle_connection(&gateway).await;

    // One more client: served, well before anything else would free a slot.
    let reply = tokio::time::timeout(Duration::from_secs(5), get(gateway.addr, "/new", &[]))
        .await
        .expect("the new client was left waiting at the cap");
    assert_eq!(reply.status, 200);

    assert!(
        closed_within(&mut oldest, Duration::from_secs(5)).await,
        "the oldest idle connection was not closed"
    );
    // One eviction made the room (counted as its connection ended), and
    // the newer idle connection still serves.
    assert_eq!(
        evictions(&gateway).await,
        "tollgate_connections_evicted_total 1"
    );
    newer
        .write_all(b"GET /again HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let again = read_until(&mut newer, b"echo").await;
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    // The busy one finishes its response, whole.
    upstream.release();
    let rest = read_until(&mut busy, b"0\r\n\r\n").await;
    assert!(rest.contains("last\n"), "{rest}");
    assert_eq!(
        evictions(&gateway).await,
        "tollgate_connections_evicted_total 1"
    );
}

#[tokio::test(start_paused = true)]
async fn a_connection_in_the_middle_of_a_request_is_never_evicted() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, 1)).await;
    // The only slot: a connection whose response is not finished.
    let mut busy = TcpStream::connect(gateway.addr).await.unwrap();
    busy.write_all(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    read_until(&mut busy, b"first\n").await;

    // A new client waits: there is nothing idle to close. Its connection
    // left the listen backlog (the kernel's count, 0): the gateway
    // accepted it and holds it at the cap while the busy one is open.
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    client
        .write_all(b"GET /new HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let port = gateway.addr.port();
    assert!(
        common::eventually(async || accept_backlog(port) == Some(0)).await,
        "the gateway never accepted the new client: backlog {:?}",
        accept_backlog(port)
    );
    let waiting = tokio::spawn(async move { read_until(&mut client, b"echo").await });

    // The busy connection's response completes, whole; once it is idle, it
    // is the one to go, and the waiting client is served.
    upstream.release();
    let rest = read_until(&mut busy, b"0\r\n\r\n").await;
    assert!(rest.contains("last\n"), "{rest}");
    let reply = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting client was not served once a connection was idle")
        .unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // It was let in by the busy connection's eviction, so not beyond the
    // cap: a client served past it would have evicted nothing (an accept
    // loop evicts only while it holds a connection at the cap), and the
    // busy one would still be open.
    assert!(closed_within(&mut busy, Duration::from_secs(5)).await);
    assert_eq!(
        evictions(&gateway).await,
        "tollgate_connections_evicted_total 1"
    );
}
