//! Limits that cannot be walked around by spelling a path differently or by
//! upgrading the connection, through real sockets to the gateway in
//! process: every
//! encoding of a limited path meets that path's limit, the upstream sees the
//! normalised path, what cannot be normalised is 400, and only the allowed
//! upgrades are tunnelled.

mod common;

use std::time::Duration;

use common::{InProcess, TestUpstream, get, raw, raw_for, tollgate};

fn config(upstream: &TestUpstream, server_extra: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
log_denied = "none"
{server_extra}

[upstreams.api]
url = "{url}"

# One login an hour for everybody: a second one is 429.
[limits.login]
key = "route"
algorithm = "token_bucket"
capacity = 1
refill = "1/h"

[[routes]]
name = "login"
match = {{ path = "/login", methods = ["POST"] }}
upstream = "api"
limits = ["login"]

[[routes]]
name = "rest"
match = {{ path_prefix = "/" }}
upstream = "api"
"#,
        url = upstream.url()
    )
}

async fn post(gateway: &InProcess, target: &str) -> String {
    let request = format!(
        "POST {target} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    raw(gateway.addr, request.as_bytes(), Duration::from_secs(5)).await
}

fn status(reply: &str) -> &str {
    reply.get(9..12).unwrap_or(reply)
}

#[tokio::test]
async fn every_spelling_of_a_limited_path_meets_its_limit() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    assert_eq!(status(&post(&gateway, "/login").await), "200");
    assert_eq!(status(&post(&gateway, "/login").await), "429");
    assert_eq!(upstream.count(), 1);
    for spelling in [
        "/x/../login",
        "//login",
        "///login",
        "/./login",
        "/%6cogin",
        "/%6C%6F%67%69%6E",
        "/a/b/../../login",
        "/x/%2e%2e/login",
        "/x/.%2E/login",
        "/%2e/login",
        "/login?via=query",
    ] {
        let reply = post(&gateway, spelling).await;
        assert_eq!(
            status(&reply),
            "429",
            "{spelling} walked around the limit:\n{reply}"
        );
    }
    assert_eq!(upstream.count(), 1, "no spelling reached the upstream");
    for refused in [
        "/x%2F..%2Flogin",
        "/..%2flogin",
        "/login%00",
        "/../login",
        "/%2e%2e/login",
        "/lo%gin",
        "/a%5Clogin",
    ] {
        let reply = post(&gateway, refused).await;
        assert_eq!(status(&reply), "400", "{refused}:\n{reply}");
        assert!(reply.contains("application/problem+json"), "{reply}");
    }
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn the_upstream_sees_the_normalised_path_and_the_query_as_sent() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    let reply = get(gateway.addr, "/api/./v1//it%65ms/x/..?q=/../a%2fb", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.last_seen().uri, "/api/v1/items/?q=/../a%2fb");
    let reply = get(gateway.addr, "/caf%c3%a9", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.last_seen().uri, "/caf%C3%A9");
}

#[tokio::test]
async fn escaped_slashes_can_be_kept() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, r#"escaped_slashes = "keep""#)).await;
    let reply = get(gateway.addr, "/files/a%2fb/./c", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(upstream.last_seen().uri, "/files/a%2Fb/c");
    // A NUL is refused whatever escaped_slashes says.
    assert_eq!(get(gateway.addr, "/a%00", &[]).await.status, 400);
}

#[tokio::test]
async fn without_normalisation_the_raw_path_is_matched_and_check_says_so() {
    let upstream = TestUpstream::start().await;
    let text = config(&upstream, "path_normalization = false");
    let gateway = InProcess::start(&text).await;
    assert_eq!(status(&post(&gateway, "/login").await), "200");
    assert_eq!(status(&post(&gateway, "/login").await), "429");
    // The raw spelling goes to the catch-all route, unlimited, as written.
    assert_eq!(status(&post(&gateway, "/x/../login").await), "200");
    assert_eq!(upstream.last_seen().uri, "/x/../login");

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, &text).unwrap();
    let (code, stdout, _) = tollgate(&["check", "-c", path.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(stdout.contains("paths:     raw"), "{stdout}");
    assert!(
        stdout.contains("/x/../login"),
        "check says what it opens: {stdout}"
    );
}

// Paused time: `raw_for`'s waits for more bytes take no real time.
#[tokio::test(start_paused = true)]
async fn only_allowed_upgrades_are_tunnelled() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    // h2c would tunnel every later request past routing and limits: the
    // gateway forwards the request as a plain one.
    let reply = raw_for(
        gateway.addr,
        b"GET /plain HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
        Duration::from_secs(2),
    )
    .await;
    assert_eq!(status(&reply), "200", "{reply}");
    let seen = upstream.last_seen();
    assert_eq!(seen.header("upgrade"), None, "{:?}", seen.headers);
    assert_eq!(seen.header("http2-settings"), None);
    // A switch to a protocol the client could not ask for is a 502.
    let reply = raw(
        gateway.addr,
        b"GET /upgrade HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(status(&reply), "502", "{reply}");
    // A websocket upgrade is tunnelled (101).
    let reply = raw_for(
        gateway.addr,
        b"GET /upgrade HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n",
        Duration::from_millis(500),
    )
    .await;
    assert!(reply.starts_with("HTTP/1.1 101"), "{reply}");
}

#[test]
fn h2c_cannot_be_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, "[server]\nupgrades = [\"websocket\", \"h2c\"]\n").unwrap();
    let (code, _, stderr) = tollgate(&["check", "-c", path.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(stderr.contains("`server.upgrades[1]`"), "{stderr}");
    assert!(stderr.contains("h2c cannot be tunnelled"), "{stderr}");
}
