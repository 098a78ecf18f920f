//! The admin listener's control plane (contract §13) through real sockets:
//! the admin token (missing, wrong, right; the open paths; no token, no
//! writes), read again on reload; a key's reset in memory; the audit line
//! and counter of every accepted write (reset, override set and delete),
//! never with the token or a raw key; the CLI over all of it.

mod common;

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;

use common::{InProcess, Reply, TestUpstream, get, send};

const TOKEN: &str = "adm1n-t0ken-for-tests";

/// Two requests a minute per `x-api-key`, on a route that answers itself.
const LIMITED: &str = r#"
[limits.per_key]
key = "header:x-api-key"
algorithm = "fixed_window"
limit = 2
window = "1m"

[[routes]]
name = "api"
match = { path_prefix = "/" }
respond = { status = 200, body = "ok" }
limits = ["per_key"]
"#;

fn config(upstream: &TestUpstream, token_line: &str) -> String {
    common::gateway_toml(
        upstream,
        &format!("admin = \"127.0.0.1:0\"\n{token_line}"),
        LIMITED,
    )
}

/// A gateway whose admin token is [`TOKEN`], read from `admin.token`.
async fn with_token(upstream: &TestUpstream) -> InProcess {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("admin.token"), format!("{TOKEN}\n")).expect("token file");
    InProcess::start_in(dir, &config(upstream, "admin_token_file = \"admin.token\"")).await
}

async fn admin(
    gateway: &InProcess,
    method: &str,
    path: &str,
    authorization: Option<&str>,
) -> Reply {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "admin.test");
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let request = request.body(Full::new(Bytes::new())).expect("request");
    send(gateway.admin.expect("an admin listener"), request).await
}

/// `method path` with [`TOKEN`] and a JSON `body`.
async fn admin_json(gateway: &InProcess, method: &str, path: &str, body: &str) -> Reply {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "admin.test")
        .header("authorization", bearer(TOKEN))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .expect("request");
    send(gateway.admin.expect("an admin listener"), request).await
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn is_problem(reply: &Reply) -> bool {
    reply.header("content-type") == Some("application/problem+json")
}

#[tokio::test]
async fn a_token_guards_every_admin_path_but_health_readiness_and_metrics() {
    let upstream = TestUpstream::start().await;
    let gateway = with_token(&upstream).await;
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            admin(&gateway, "GET", path, None).await.status,
            200,
            "{path}"
        );
    }
    for (method, path) in [
        ("GET", "/config"),
        ("GET", "/limits/per_key?key=k"),
        ("POST", "/limits/per_key/reset?key=k"),
        ("GET", "/nope"),
    ] {
        let missing = admin(&gateway, method, path, None).await;
        assert_eq!(missing.status, 401, "{method} {path}");
        assert!(is_problem(&missing), "{method} {path}");
        let challenge = missing.header("www-authenticate").unwrap_or("");
        assert!(challenge.starts_with("Bearer"), "{challenge}");
        let wrong = admin(&gateway, method, path, Some(&bearer("not-the-token"))).await;
        assert_eq!(wrong.status, 401, "{method} {path}");
        assert!(
            wrong
                .header("www-authenticate")
                .is_some_and(|c| c.contains("invalid_token")),
            "{wrong:?}"
        );
        let longer = admin(&gateway, method, path, Some(&bearer(&format!("{TOKEN}x")))).await;
        assert_eq!(longer.status, 401, "{method} {path}");
        let basic = admin(&gateway, method, path, Some(&format!("Basic {TOKEN}"))).await;
        assert_eq!(basic.status, 401, "{method} {path}");
        // No answer names the token.
        for reply in [&missing, &wrong, &longer, &basic] {
            assert!(!String::from_utf8_lossy(&reply.body).contains(TOKEN));
        }
    }
    let right = Some(bearer(TOKEN));
    assert_eq!(
        admin(&gateway, "GET", "/config", right.as_deref())
            .await
            .status,
        200
    );
    assert_eq!(
        admin(&gateway, "GET", "/limits/per_key?key=k", right.as_deref())
            .await
            .status,
        200
    );
    assert_eq!(
        admin(
            &gateway,
            "POST",
            "/limits/per_key/reset?key=k",
            right.as_deref()
        )
        .await
        .status,
        200
    );
    assert_eq!(
        admin(&gateway, "GET", "/nope", right.as_deref())
            .await
            .status,
        404
    );
}

#[tokio::test]
async fn without_a_token_reads_stay_open_and_every_write_is_403() {
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(&upstream, "")).await;
    assert_eq!(admin(&gateway, "GET", "/config", None).await.status, 200);
    assert_eq!(
        admin(&gateway, "GET", "/limits/per_key?key=k", None)
            .await
            .status,
        200
    );
    for method in ["POST", "PUT", "DELETE"] {
        let refused = admin(&gateway, method, "/limits/per_key/reset?key=k", None).await;
        assert_eq!(refused.status, 403, "{method}");
        assert!(is_problem(&refused));
        let detail = refused.json()["detail"].as_str().unwrap_or("").to_owned();
        assert!(detail.contains("admin_token_file"), "{detail}");
        // A token offered anyway changes nothing: there is none to match.
        let offered = admin(
            &gateway,
            method,
            "/limits/per_key/reset?key=k",
            Some("Bearer x"),
        )
        .await;
        assert_eq!(offered.status, 403, "{method}");
    }
}

#[tokio::test]
async fn the_token_file_is_read_again_on_reload_and_a_missing_one_keeps_the_old() {
    let upstream = TestUpstream::start().await;
    let gateway = with_token(&upstream).await;
    let token_file = gateway.dir.path().join("admin.token");
    std::fs::write(&token_file, "the-new-token\n").expect("token file");
    assert_eq!(gateway.reload(), 2);
    let old = Some(bearer(TOKEN));
    let new = Some(bearer("the-new-token"));
    assert_eq!(
        admin(&gateway, "GET", "/config", old.as_deref())
            .await
            .status,
        401
    );
    assert_eq!(
        admin(&gateway, "GET", "/config", new.as_deref())
            .await
            .status,
        200
    );

    // A missing file fails the reload: the running token stays.
    std::fs::remove_file(&token_file).expect("remove the token file");
    assert_eq!(
        gateway.reload(),
        2,
        "a reload without the token file succeeded"
    );
    let config = admin(&gateway, "GET", "/config", new.as_deref()).await;
    assert_eq!(config.status, 200);
    let error = config.json()["last_error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    assert!(error.contains("admin_token_file"), "{error}");
    // So does an empty one.
    std::fs::write(&token_file, "").expect("token file");
    assert_eq!(
        gateway.reload(),
        2,
        "a reload with an empty token file succeeded"
    );
    assert_eq!(
        admin(&gateway, "GET", "/config", new.as_deref())
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn a_token_from_the_environment_is_read_at_start_and_on_reload() {
    // The variable is this test's own: no other test reads it.
    const VARIABLE: &str = "TOLLGATE_TEST_CONTROL_PLANE_ADMIN_TOKEN";
    // SAFETY: set before the gateway starts and changed only below, by this
    // test alone; nothing else reads this variable.
    unsafe { std::env::set_var(VARIABLE, "from-the-env") };
    let upstream = TestUpstream::start().await;
    let gateway = InProcess::start(&config(
        &upstream,
        &format!("admin_token_env = \"{VARIABLE}\""),
    ))
    .await;
    let first = Some(bearer("from-the-env"));
    assert_eq!(
        admin(&gateway, "GET", "/config", first.as_deref())
            .await
            .status,
        200
    );
    // SAFETY: as above.
    unsafe { std::env::set_var(VARIABLE, "changed-in-the-env") };
    assert_eq!(gateway.reload(), 2);
    let second = Some(bearer("changed-in-the-env"));
    assert_eq!(
        admin(&gateway, "GET", "/config", first.as_deref())
            .await
            .status,
        401
    );
    assert_eq!(
        admin(&gateway, "GET", "/config", second.as_deref())
            .await
            .status,
        200
    );
}

#[tokio::test(start_paused = true)]
async fn a_reset_empties_one_key_in_memory_and_answers_its_state_before() {
    let upstream = TestUpstream::start().await;
    let gateway = with_token(&upstream).await;
    let token = Some(bearer(TOKEN));
    for _ in 0..2 {
        assert_eq!(
            get(gateway.addr, "/x", &[("x-api-key", "alice")])
                .await
                .status,
            200
        );
    }
    assert_eq!(
        get(gateway.addr, "/x", &[("x-api-key", "alice")])
            .await
            .status,
        429
    );
    assert_eq!(
        get(gateway.addr, "/x", &[("x-api-key", "bob")])
            .await
            .status,
        200
    );

    let reset = admin(
        &gateway,
        "POST",
        "/limits/per_key/reset?key=alice",
        token.as_deref(),
    )
    .await;
    assert_eq!(reset.status, 200, "{:?}", reset.body);
    let before = reset.json();
    assert_eq!(before["limit"], "per_key");
    assert_eq!(before["remaining"], 0, "{before}");
    assert_eq!(before["quota"], 2, "{before}");

    // Alice starts as a new key; bob keeps his state.
    let next = get(gateway.addr, "/x", &[("x-api-key", "alice")]).await;
    assert_eq!(next.status, 200);
    let ratelimit = next.header("ratelimit").unwrap_or("");
    assert!(ratelimit.contains("r=1"), "{ratelimit}");
    let bob = admin(&gateway, "GET", "/limits/per_key?key=bob", token.as_deref()).await;
    assert_eq!(bob.json()["remaining"], 1);

    // A limit that does not exist; a key missing; a key never seen.
    let unknown = admin(
        &gateway,
        "POST",
        "/limits/nope/reset?key=alice",
        token.as_deref(),
    )
    .await;
    assert_eq!(unknown.status, 404);
    assert!(is_problem(&unknown));
    let keyless = admin(&gateway, "POST", "/limits/per_key/reset", token.as_deref()).await;
    assert_eq!(keyless.status, 400);
    assert!(is_problem(&keyless));
    let fresh = admin(
        &gateway,
        "POST",
        "/limits/per_key/reset?key=carol",
        token.as_deref(),
    )
    .await;
    assert_eq!(fresh.status, 200);
    assert_eq!(fresh.json()["remaining"], 2);
}

#[tokio::test]
async fn every_accepted_write_is_audited_without_the_token_or_the_raw_key() {
    let upstream = TestUpstream::start().await;
    let log = common::log::capture();
    let gateway = with_token(&upstream).await;
    let token = Some(bearer(TOKEN));
    const RAW_KEY: &str = "sk-live-very-secret-api-key";
    assert_eq!(
        get(gateway.addr, "/x", &[("x-api-key", RAW_KEY)])
            .await
            .status,
        200
    );
    let reset = admin(
        &gateway,
        "POST",
        &format!("/limits/per_key/reset?key={RAW_KEY}"),
        token.as_deref(),
    )
    .await;
    assert_eq!(reset.status, 200);
    let digest = reset.json()["digest"].as_str().unwrap_or("").to_owned();
    assert_eq!(digest.len(), 32, "{digest}");
    // A refused write is not audited.
    let refused = admin(
        &gateway,
        "POST",
        "/limits/per_key/reset?key=x",
        Some("Bearer no"),
    )
    .await;
    assert_eq!(refused.status, 401);
    // An override set and deleted for the same raw key; a refused one and
    // a prune that finds nothing are not audited.
    let overrides = format!("/limits/per_key/overrides?key={RAW_KEY}");
    let set = admin_json(
        &gateway,
        "PUT",
        &overrides,
        r#"{"limit": 9, "reason": "r"}"#,
    )
    .await;
    assert_eq!(set.status, 200, "{set:?}");
    let bad = admin_json(&gateway, "PUT", &overrides, r#"{"limit": 0}"#).await;
    assert_eq!(bad.status, 400, "{bad:?}");
    let deleted = admin_json(&gateway, "DELETE", &overrides, "").await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    let pruned = admin_json(&gateway, "DELETE", "/limits/gone/overrides", "").await;
    assert_eq!(pruned.status, 404, "{pruned:?}");

    let text = log
        .when(|text| text.contains("action=\"override_delete\""))
        .await;
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("tollgate::audit"))
        .collect();
    assert_eq!(lines.len(), 3, "{text}");
    for (line, action) in lines
        .iter()
        .zip(["reset", "override_set", "override_delete"])
    {
        assert!(line.contains(&format!("action=\"{action}\"")), "{line}");
        assert!(line.contains("limit=\"per_key\""), "{line}");
        assert!(line.contains(&digest), "{line}");
        assert!(line.contains("peer=127.0.0.1:"), "{line}");
    }
    assert!(lines[1].contains(r#""params":{"limit":9}"#), "{}", lines[1]);
    assert!(!text.contains(RAW_KEY), "the raw key was logged: {text}");
    assert!(!text.contains(TOKEN), "the token was logged: {text}");

    let metrics = admin(&gateway, "GET", "/metrics", None).await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    for action in ["reset", "override_set", "override_delete"] {
        assert!(
            metrics.contains(&format!(
                "tollgate_admin_writes_total{{action=\"{action}\"}} 1"
            )),
            "{metrics}"
        );
    }
    assert!(!metrics.contains("override_prune"), "{metrics}");
}

/// A gateway on `store` (a `[store]` body) with [`LIMITED`]'s limit shared
/// in Redis and the admin token.
async fn on_redis(upstream: &TestUpstream, store: &str) -> InProcess {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("admin.token"), TOKEN).expect("token file");
    let config = format!(
        "{}\n[store]\nbackend = \"redis\"\nprefix = \"tg:\"\ntimeout = \"500ms\"\n{store}\n",
        config(upstream, "admin_token_file = \"admin.token\"")
    );
    InProcess::start_on_wall_time_in(dir, &config).await
}

/// Exhausts `user`'s two requests through `a`, resets it through `b`'s
/// admin listener, and finds the key new on both nodes.
async fn reset_across_nodes(a: &InProcess, b: &InProcess, user: &str) {
    let token = Some(bearer(TOKEN));
    for _ in 0..2 {
        assert_eq!(get(a.addr, "/x", &[("x-api-key", user)]).await.status, 200);
    }
    assert_eq!(get(b.addr, "/x", &[("x-api-key", user)]).await.status, 429);
    let path = format!("/limits/per_key/reset?key={user}");
    let reset = admin(b, "POST", &path, token.as_deref()).await;
    assert_eq!(reset.status, 200, "{:?}", reset.body);
    let before = reset.json();
    assert_eq!(before["source"], "redis", "{before}");
    assert_eq!(before["remaining"], 0, "{before}");
    let explained = admin(
        a,
        "GET",
        &format!("/limits/per_key?key={user}"),
        token.as_deref(),
    )
    .await;
    assert_eq!(explained.json()["remaining"], 2, "{:?}", explained.body);
    let next = get(a.addr, "/x", &[("x-api-key", user)]).await;
    assert_eq!(next.status, 200);
    let ratelimit = next.header("ratelimit").unwrap_or("");
    assert!(ratelimit.contains("r=1"), "{ratelimit}");
}

#[tokio::test]
async fn a_reset_empties_a_shared_key_in_redis_for_every_node() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = common::redis::Redis::start();
    let upstream = TestUpstream::start().await;
    let store = format!("url = \"{}\"", redis.url());
    let a = on_redis(&upstream, &store).await;
    let b = on_redis(&upstream, &store).await;
    reset_across_nodes(&a, &b, "alice").await;
    // Only alice's key went: another key's state stays in Redis.
    assert_eq!(get(a.addr, "/x", &[("x-api-key", "bob")]).await.status, 200);
    let keys: Vec<String> = redis
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("tg:per_key:"))
        .collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
}

#[tokio::test]
async fn a_reset_empties_a_cluster_key_at_its_slot() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let cluster = common::redis::Cluster::start(3, 0);
    let upstream = TestUpstream::start().await;
    let store = format!("cluster = true\nurl = [{}]", cluster.toml_urls());
    let a = on_redis(&upstream, &store).await;
    let b = on_redis(&upstream, &store).await;
    // Users whose digests spread over the primaries.
    for i in 0..4 {
        reset_across_nodes(&a, &b, &format!("user-{i}")).await;
    }
}

#[tokio::test]
async fn a_reset_while_redis_is_down_fails_clearly_and_is_not_audited() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let mut redis = common::redis::Redis::start();
    let upstream = TestUpstream::start().await;
    let store = format!("url = \"{}\"\non_failure = \"local\"", redis.url());
    let gateway = on_redis(&upstream, &store).await;
    assert_eq!(
        get(gateway.addr, "/x", &[("x-api-key", "alice")])
            .await
            .status,
        200
    );
    redis.kill();
    let token = Some(bearer(TOKEN));
    let reset = admin(
        &gateway,
        "POST",
        "/limits/per_key/reset?key=alice",
        token.as_deref(),
    )
    .await;
    assert_eq!(reset.status, 503, "{:?}", reset.body);
    assert!(is_problem(&reset));
    let metrics = admin(&gateway, "GET", "/metrics", None).await;
    let metrics = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        !metrics.contains("tollgate_admin_writes_total{action=\"reset\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_cli_resets_a_key_through_the_running_gateways_admin_api() {
    let upstream = TestUpstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("admin.token"), TOKEN).expect("token file");
    // The command line reads the admin address from the file: a fixed port.
    let port = common::redis::free_port();
    let config = common::gateway_toml(
        &upstream,
        &format!("admin = \"127.0.0.1:{port}\"\nadmin_token_file = \"admin.token\""),
        LIMITED,
    );
    let gateway = InProcess::start_in(dir, &config).await;
    for _ in 0..2 {
        assert_eq!(
            get(gateway.addr, "/x", &[("x-api-key", "a b&c")])
                .await
                .status,
            200
        );
    }
    assert_eq!(
        get(gateway.addr, "/x", &[("x-api-key", "a b&c")])
            .await
            .status,
        429
    );
    // Off the runtime: the gateway serves on this thread meanwhile.
    let path = gateway.config_path.display().to_string();
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            common::tollgate(&args)
        })
    };
    let words = |text: &str| -> Vec<String> {
        text.split(' ')
            .map(str::to_owned)
            .chain(["-c".to_owned(), path.clone()])
            .collect()
    };
    let mut reset = words("admin reset per_key");
    reset.insert(3, "a b&c".to_owned());
    let (code, stdout, stderr) = run(reset).await.expect("the command ran");
    assert_eq!(code, 0, "{stderr}");
    let before: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_default();
    assert_eq!(before["limit"], "per_key", "{stdout}");
    assert_eq!(before["remaining"], 0, "{stdout}");
    assert_eq!(
        get(gateway.addr, "/x", &[("x-api-key", "a b&c")])
            .await
            .status,
        200
    );

    // Overrides: set (name=value pairs), list, delete, each through the API.
    let mut set = words("admin overrides set per_key limit=4 reason=trial");
    set.insert(4, "a b&c".to_owned());
    let (code, stdout, stderr) = run(set).await.expect("the command ran");
    assert_eq!(code, 0, "{stderr}");
    let stored: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_default();
    assert_eq!(stored["params"]["limit"], 4, "{stdout}");
    assert_eq!(stored["reason"], "trial", "{stdout}");
    let statuses = {
        let mut statuses = Vec::new();
        for _ in 0..5 {
            let reply = get(gateway.addr, "/x", &[("x-api-key", "a b&c")]).await;
            statuses.push(reply.status);
        }
        statuses
    };
    // One of the key's requests was spent after the reset: 3 more of 4.
    assert_eq!(
        statuses,
        [200, 200, 200, 429, 429],
        "the override decides the key"
    );
    let (code, stdout, stderr) = run(words("admin overrides list per_key"))
        .await
        .expect("the command ran");
    assert_eq!(code, 0, "{stderr}");
    let listed: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_default();
    assert_eq!(
        listed["overrides"].as_array().map(Vec::len),
        Some(1),
        "{stdout}"
    );
    assert!(!stdout.contains("a b&c"), "a raw key in the list: {stdout}");
    let mut delete = words("admin overrides delete per_key");
    delete.insert(4, "a b&c".to_owned());
    let (code, _, stderr) = run(delete.clone()).await.expect("the command ran");
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = run(delete).await.expect("the command ran");
    assert_eq!(code, 1, "a second delete finds none");
    let problem: serde_json::Value = serde_json::from_str(&stderr).unwrap_or_default();
    assert_eq!(problem["status"], 404, "{stderr}");

    // A prune: refused for a limit the configuration has; a limit removed
    // from a memory store's configuration left nothing to prune.
    let (code, _, stderr) = run(words("admin overrides prune per_key"))
        .await
        .expect("the command ran");
    assert_eq!(code, 1, "{stderr}");
    let problem: serde_json::Value = serde_json::from_str(&stderr).unwrap_or_default();
    assert_eq!(problem["status"], 409, "{stderr}");
    let (code, _, stderr) = run(words("admin overrides prune gone"))
        .await
        .expect("the command ran");
    assert_eq!(code, 1, "{stderr}");
    let problem: serde_json::Value = serde_json::from_str(&stderr).unwrap_or_default();
    assert_eq!(problem["status"], 404, "{stderr}");

    // An API error is printed as the API gives it, with a non-zero exit.
    let (code, stdout, stderr) = run(words("admin reset nope k"))
        .await
        .expect("the command ran");
    assert_eq!(code, 1, "{stdout}");
    let problem: serde_json::Value = serde_json::from_str(&stderr).unwrap_or_default();
    assert_eq!(problem["status"], 404, "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn the_cli_says_when_the_configuration_has_no_admin_listener() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("gateway.toml");
    std::fs::write(
        &path,
        "[upstreams.api]\nurl = \"http://127.0.0.1:9\"\n[[routes]]\nname = \"a\"\nupstream = \"api\"\n",
    )
    .expect("config");
    let path = path.display().to_string();
    let (code, _, stderr) = common::tollgate(&["admin", "reset", "l", "k", "-c", &path]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("no admin listener"), "{stderr}");
}
