//! Production Redis for the `[store]`, end to end against real servers:
//! `rediss://` to a TLS-only `redis-server` with a test CA and `sni`,
//! `requirepass` through `password_file` and `password_env`, an ACL user,
//! and a master found through Sentinel, followed across a failover. Each
//! decides a shared limit exactly, and each failure (wrong CA, wrong
//! password, no sentinel answering) is `on_failure`'s. The password shows
//! nowhere: not in `/config`, `/metrics`, the log, `check` or an error.
//! The gateway in process, but where a test reads the store thread's log
//! lines on stderr or gives the process an environment (`password_env`).

mod common;

use std::path::Path;
use std::time::Duration;

use common::certs::Ca;
use common::redis::{Options, Redis, Sentinel, SentinelAuth, TlsFiles, free_port};
use common::{Gateway, InProcess, eventually_blocking, eventually_within, get};

/// A gateway on `store` (the `[store]` keys after `backend`) with an
/// admin listener and one route limited to 3 requests an hour per
/// `x-user`; `on_failure = "deny"`, so a store that cannot be reached
/// answers 503.
fn config(store: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin = "127.0.0.1:0"
workers = 1

[store]
backend = "redis"
prefix = "tg:"
timeout = "500ms"
on_failure = "deny"
{store}

[limits.shared]
key = "header:x-user"
algorithm = "fixed_window"
limit = 3
window = "1h"

[[routes]]
name = "shared"
match = {{ path_prefix = "/" }}
respond = {{ status = 200, body = "ok" }}
limits = ["shared"]
"#
    )
}

/// The statuses of `n` requests, one after the other, as `user`.
async fn statuses(addr: std::net::SocketAddr, user: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(addr, "/", &[("x-user", user)]).await.status);
    }
    out
}

/// The value of a metric without labels, or with them, first line.
async fn metric(admin: std::net::SocketAddr, name: &str) -> Option<f64> {
    let text = admin_text(admin, "/metrics").await;
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn admin_text(admin: std::net::SocketAddr, path: &str) -> String {
    String::from_utf8_lossy(&get(admin, path, &[]).await.body).into_owned()
}

/// Waits until `done` holds, at most `within`.
async fn until(what: &str, within: Duration, done: impl AsyncFnMut() -> bool) {
    assert!(
        eventually_within(within, done).await,
        "{what}: not within {within:?}"
    );
}

/// A TLS-only `redis-server` whose certificate is for `redis.test` only
/// (not for 127.0.0.1: connecting needs `sni`), signed by a test CA
/// written to `dir/ca.pem`.
fn tls_redis(dir: &Path, requirepass: Option<&str>) -> Redis {
    let ca = Ca::new();
    ca.leaf(&["redis.test"]).write(dir, "redis");
    std::fs::write(dir.join("ca.pem"), ca.pem()).expect("write ca");
    // Another CA, that signed nothing the server shows.
    std::fs::write(dir.join("other-ca.pem"), Ca::new().pem()).expect("write ca");
    Redis::with_options(Options {
        tls: Some(TlsFiles {
            cert: dir.join("redis.crt"),
            key: dir.join("redis.key"),
            ca: dir.join("ca.pem"),
        }),
        requirepass: requirepass.map(str::to_owned),
        ..Options::default()
    })
}

#[tokio::test]
async fn rediss_with_a_ca_and_sni_decides_a_shared_limit_exactly() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = tls_redis(dir.path(), None);
    let store = format!(
        "url = \"rediss://127.0.0.1:{}/0\"\nca = \"{}\"\nsni = \"redis.test\"",
        redis.port,
        dir.path().join("ca.pem").display()
    );
    let a = InProcess::start(&config(&store)).await;
    let b = InProcess::start(&config(&store)).await;
    assert_eq!(statuses(a.addr, "u", 4).await, [200, 200, 200, 429]);
    // The other gateway shares the count over its own TLS connection.
    assert_eq!(statuses(b.addr, "u", 1).await, [429]);
    assert_eq!(statuses(b.addr, "v", 2).await, [200, 200]);
    assert_eq!(statuses(a.addr, "v", 2).await, [200, 429]);
    let keys = redis.keys();
    assert!(
        keys.len() == 2 && keys.iter().all(|k| k.starts_with("tg:shared:")),
        "{keys:?}"
    );
    assert_eq!(
        metric(a.admin.expect("admin"), "tollgate_store_errors_total").await,
        Some(0.0)
    );
}

#[tokio::test]
async fn a_certificate_not_trusted_or_not_for_the_name_fails_over_to_on_failure() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = tls_redis(dir.path(), None);
    for (store, why) in [
        // Signed by a CA the gateway does not trust (one of the same name:
        // the signature does not verify).
        (
            format!(
                "url = \"rediss://127.0.0.1:{}\"\nca = \"{}\"\nsni = \"redis.test\"",
                redis.port,
                dir.path().join("other-ca.pem").display()
            ),
            "invalid peer certificate: BadSignature",
        ),
        // Trusted, but not for 127.0.0.1, the name verified without `sni`.
        (
            format!(
                "url = \"rediss://127.0.0.1:{}\"\nca = \"{}\"",
                redis.port,
                dir.path().join("ca.pem").display()
            ),
            "certificate not valid for name \"127.0.0.1\"",
        ),
    ] {
        let gateway = Gateway::start(&config(&store));
        let admin = gateway.admin.expect("admin");
        assert_eq!(statuses(gateway.addr, "u", 2).await, [503, 503]);
        assert_eq!(get(admin, "/readyz", &[]).await.status, 503);
        assert_eq!(
            metric(admin, "tollgate_store_fallback_active").await,
            Some(1.0)
        );
        // Every failed probe counts, so a gateway that never connects shows.
        until("errors counted", Duration::from_secs(10), || async {
            metric(admin, "tollgate_store_errors_total")
                .await
                .is_some_and(|n| n >= 1.0)
        })
        .await;
        let log = gateway.stderr_when(|l| l.contains(why), Duration::from_secs(10));
        let line = log
            .lines()
            .find(|l| l.contains("redis store cannot connect"))
            .unwrap_or_else(|| panic!("no reason logged:\n{log}"));
        assert!(
            line.contains("TLS handshake with 127.0.0.1") && line.contains(why),
            "{line}"
        );
    }
    assert!(redis.keys().is_empty());
}

const PASSWORD: &str = "pw-9f2c7e-never-shown";

/// Asserts that `text` (a log, a body, an output) does not hold the password.
fn assert_hidden(what: &str, text: &str) {
    assert!(
        !text.contains(PASSWORD),
        "{what} shows the password:\n{text}"
    );
}

async fn assert_hidden_in_admin(gateway: &Gateway) {
    let admin = gateway.admin.expect("admin");
    for path in ["/config", "/metrics"] {
        assert_hidden(path, &admin_text(admin, path).await);
    }
}

#[tokio::test]
async fn requirepass_from_a_file_or_the_environment_and_a_wrong_one_is_on_failure() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::with_options(Options {
        requirepass: Some(PASSWORD.to_owned()),
        ..Options::default()
    });
    let url = format!("url = \"redis://127.0.0.1:{}\"", redis.port);
    let debug = [("TOLLGATE_LOG", "debug")];

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("redis.pw"), format!("{PASSWORD}\n")).expect("write");
    let from_file = Gateway::start_in_with_env(
        dir,
        &config(&format!("{url}\npassword_file = \"redis.pw\"")),
        &[],
        &debug,
    );
    assert_eq!(statuses(from_file.addr, "u", 4).await, [200, 200, 200, 429]);

    let env = [
        ("TOLLGATE_LOG", "debug"),
        ("TOLLGATE_TEST_REDIS_PW", PASSWORD),
    ];
    let from_env = Gateway::start_in_with_env(
        tempfile::tempdir().expect("tempdir"),
        &config(&format!("{url}\npassword_env = \"TOLLGATE_TEST_REDIS_PW\"")),
        &[],
        &env,
    );
    // The same Redis: `u` has used up its 3 there.
    assert_eq!(statuses(from_env.addr, "u", 1).await, [429]);
    assert_eq!(statuses(from_env.addr, "v", 1).await, [200]);

    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("redis.pw"), "not-the-password\n").expect("write");
    let wrong = Gateway::start_in_with_env(
        dir,
        &config(&format!("{url}\npassword_file = \"redis.pw\"")),
        &[],
        &debug,
    );
    assert_eq!(statuses(wrong.addr, "w", 2).await, [503, 503]);
    let log = wrong.stderr_when(
        |l| l.contains("redis store cannot connect"),
        Duration::from_secs(10),
    );
    assert!(
        log.lines().any(|l| l.contains("redis store cannot connect")
            && l.contains("Password authentication failed")),
        "{log}"
    );
    assert_hidden("the log", &log);
    assert!(!log.contains("not-the-password"), "{log}");
    // A request that the store decided, and one it could not, are logged
    // (debug) by now: neither shows the password.
    for gateway in [&from_file, &from_env, &wrong] {
        assert_hidden_in_admin(gateway).await;
        assert_hidden("the log", &gateway.stderr());
    }
    let keys = redis.keys();
    assert_eq!(keys.len(), 2, "u and v only: {keys:?}");
}

#[tokio::test]
async fn an_acl_user_with_only_the_commands_the_scripts_use_decides_over_tls() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let redis = tls_redis(dir.path(), Some("admin-only"));
    // The README's ACL: the keys under the prefix, the script commands and
    // what the scripts call, nothing else.
    let acl = "on >user-pw-31b7 resetkeys ~tg:* resetchannels -@all \
               +ping +evalsha +script|load +time +get +mget +set +del +pexpire +pexpireat \
               +zadd +zcard +zrange +zrangebyscore +zrevrange +zrem +zremrangebyscore";
    let mut args = vec!["ACL", "SETUSER", "tollgate"];
    args.extend(acl.split_whitespace());
    assert_eq!(redis.cli(&args), "OK");
    let password_file = dir.path().join("tollgate.pw");
    std::fs::write(&password_file, "user-pw-31b7\n").expect("write");
    let store = |file: &Path| {
        format!(
            "url = \"rediss://127.0.0.1:{}\"\nca = \"{}\"\nsni = \"redis.test\"\n\
             username = \"tollgate\"\npassword_file = \"{}\"",
            redis.port,
            dir.path().join("ca.pem").display(),
            file.display()
        )
    };
    let gateway = InProcess::start(&config(&store(&password_file))).await;
    assert_eq!(statuses(gateway.addr, "u", 4).await, [200, 200, 200, 429]);
    // The default user's password is not the ACL user's.
    let default_pw = dir.path().join("default.pw");
    std::fs::write(&default_pw, "admin-only").expect("write");
    let wrong = InProcess::start(&config(&store(&default_pw))).await;
    assert_eq!(statuses(wrong.addr, "v", 1).await, [503]);
    let keys = redis.keys();
    assert!(
        keys.len() == 1 && keys[0].starts_with("tg:shared:"),
        "{keys:?}"
    );
    assert_eq!(
        metric(gateway.admin.expect("admin"), "tollgate_store_errors_total").await,
        Some(0.0)
    );
    // A user set up before the script read keys with MGET (the README's
    // ACL without +mget) still decides: the script reads a key at a time.
    assert_eq!(redis.cli(&["ACL", "SETUSER", "tollgate", "-mget"]), "OK");
    assert_eq!(statuses(gateway.addr, "w", 4).await, [200, 200, 200, 429]);
    assert_eq!(
        metric(gateway.admin.expect("admin"), "tollgate_store_errors_total").await,
        Some(0.0)
    );
}

/// Waits until the replica has synced with its master.
fn wait_synced(replica: &Redis) {
    let synced = || {
        replica
            .try_cli(&["INFO", "replication"])
            .is_some_and(|info| info.contains("master_link_status:up"))
    };
    assert!(
        eventually_blocking(Duration::from_secs(20), synced),
        "the replica did not sync"
    );
}

#[tokio::test]
async fn sentinel_finds_the_master_and_follows_a_failover() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    // The master and its replica ask for one password, the sentinel for
    // another; the gateway reads both from files.
    let requirepass = Some(PASSWORD.to_owned());
    let mut master = Redis::with_options(Options {
        requirepass: requirepass.clone(),
        ..Options::default()
    });
    let replica = Redis::with_options(Options {
        replica_of: Some(master.port),
        requirepass,
        ..Options::default()
    });
    wait_synced(&replica);
    let dir = tempfile::tempdir().expect("tempdir");
    let (master_pw, sentinel_pw) = (dir.path().join("redis.pw"), dir.path().join("sentinel.pw"));
    std::fs::write(&master_pw, format!("{PASSWORD}\n")).expect("write");
    std::fs::write(&sentinel_pw, "sentinel-pw-5d1\n").expect("write");
    // The first sentinel never runs: any one that answers will do.
    let (silent, port) = (free_port(), free_port());
    let store = format!(
        "sentinels = [\"redis://127.0.0.1:{silent}\", \"redis://127.0.0.1:{port}\"]\nmaster = \"mymaster\"\n\
         password_file = \"{}\"\nsentinel_password_file = \"{}\"",
        master_pw.display(),
        sentinel_pw.display()
    );
    let gateway = InProcess::start(&config(&store)).await;
    let admin = gateway.admin.expect("admin");
    // No sentinel answers: on_failure ("deny") applies.
    assert_eq!(statuses(gateway.addr, "early", 2).await, [503, 503]);
    assert_eq!(get(admin, "/readyz", &[]).await.status, 503);

    let auth = SentinelAuth {
        master: Some(PASSWORD),
        own: Some("sentinel-pw-5d1"),
    };
    let mut sentinel = Sentinel::start(port, "mymaster", master.port, auth);
    sentinel.wait_replicas(1);
    until(
        "decided through the master",
        Duration::from_secs(20),
        || async { get(admin, "/readyz", &[]).await.status == 200 },
    )
    .await;
    assert_eq!(statuses(gateway.addr, "u", 4).await, [200, 200, 200, 429]);
    assert!(master.keys().iter().any(|k| k.starts_with("tg:shared:")));
    // Without the sentinel's password, no sentinel answers.
    let store_without = store.replace(
        &format!("sentinel_password_file = \"{}\"", sentinel_pw.display()),
        "",
    );
    let refused = InProcess::start(&config(&store_without)).await;
    assert_eq!(statuses(refused.addr, "x", 1).await, [503]);
    drop(refused);

    master.kill();
    // Down after 500 ms, then promoted: poll with a new user each time
    // (a 200 is a decision, by whichever node took it).
    let mut n = 0;
    until(
        "decided through the new master",
        Duration::from_secs(60),
        || {
            n += 1;
            let user = format!("poll{n}");
            async move { statuses(gateway.addr, &user, 1).await == [200] }
        },
    )
    .await;
    assert_eq!(sentinel.master_port(), Some(replica.port));
    assert_eq!(statuses(gateway.addr, "v", 4).await, [200, 200, 200, 429]);
    // The replica, now master, holds what was decided on it.
    let keys = replica.keys();
    assert!(keys.len() >= 2, "{keys:?}");
    assert!(
        replica
            .cli(&["INFO", "replication"])
            .contains("role:master")
    );

    // No sentinel answers and the master goes: on_failure again.
    sentinel.kill();
    drop(replica);
    until(
        "on_failure once nothing answers",
        Duration::from_secs(20),
        || async { statuses(gateway.addr, "late", 1).await == [503] },
    )
    .await;
}

/// `tollgate check` on `text` written as `gateway.toml` in `dir`: (code,
/// stderr).
fn check(dir: &Path, text: &str) -> (i32, String) {
    let path = dir.join("gateway.toml");
    std::fs::write(&path, text).expect("write");
    let (code, stdout, stderr) = common::tollgate(&["check", "-c", path.to_str().expect("utf-8")]);
    assert_hidden("check's output", &format!("{stdout}{stderr}"));
    (code, stderr)
}

/// Asserts that `stderr` has an error at `line` for `key` saying `says`.
fn assert_error(stderr: &str, line: usize, key: &str, says: &str) {
    let found = stderr.lines().any(|l| {
        l.contains(&format!("gateway.toml:{line}:"))
            && l.contains(&format!("`{key}`"))
            && l.contains(says)
    });
    assert!(
        found,
        "no error for {key} at line {line} saying {says:?}:\n{stderr}"
    );
}

#[test]
fn bad_production_store_keys_are_located_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let head = "[store]\nbackend = \"redis\"\n";
    let both = format!("url = \"redis://:{PASSWORD}@127.0.0.1:6379\"\npassword_env = \"HOME\"\n");
    let cases: [(&str, usize, &str, &str); 9] = [
        (
            "url = \"redis://127.0.0.1:6379\"\nsentinels = [\"redis://127.0.0.1:26379\"]\nmaster = \"m\"\n",
            4,
            "store.sentinels",
            "`url` and `sentinels` are two ways",
        ),
        (
            "sentinels = [\"redis://127.0.0.1:26379\"]\n",
            3,
            "store.sentinels",
            "needs `master = \"NAME\"`",
        ),
        (
            "sentinels = [\"redis://127.0.0.1:26379\"]\nmaster = \"m\"\ncluster = true\n",
            5,
            "store.cluster",
            "do not go together",
        ),
        (
            "url = \"redis://127.0.0.1:6379\"\npassword_file = \"missing.pw\"\n",
            4,
            "store.password_file",
            "cannot read",
        ),
        (
            "url = \"redis://127.0.0.1:6379\"\npassword_env = \"TOLLGATE_TEST_UNSET_VARIABLE\"\n",
            4,
            "store.password_env",
            "`TOLLGATE_TEST_UNSET_VARIABLE` is not set",
        ),
        (
            "url = \"rediss://127.0.0.1:6380\"\nca = \"not-pem.txt\"\n",
            4,
            "store.ca",
            "holds no PEM certificate",
        ),
        (
            "url = \"redis://127.0.0.1:6379\"\nca = \"ca.pem\"\n",
            4,
            "store.ca",
            "applies to rediss:// (TLS) URLs only",
        ),
        (&both, 3, "store.url", "remove it from the url"),
        (
            "url = \"redis://127.0.0.1:6379\"\nsentinel_password_env = \"HOME\"\n",
            4,
            "store.sentinel_password_env",
            "set `sentinels` too",
        ),
    ];
    std::fs::write(dir.path().join("not-pem.txt"), "hello\n").expect("write");
    for (body, line, key, says) in cases {
        let (code, stderr) = check(dir.path(), &format!("{head}{body}"));
        assert_eq!(code, 1, "{body}: {stderr}");
        assert_error(&stderr, line, key, says);
    }
    // A bad URL is shown without its password.
    let (code, stderr) = check(
        dir.path(),
        &format!("{head}url = \"redis://:{PASSWORD}@127.0.0.1:port\"\n"),
    );
    assert_eq!(code, 1);
    assert_error(
        &stderr,
        3,
        "store.url",
        "redis://:<redacted>@127.0.0.1:port",
    );
}

#[test]
fn check_warns_of_a_password_in_the_url_and_not_of_one_in_a_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (code, stderr) = check(
        dir.path(),
        &format!("[store]\nbackend = \"redis\"\nurl = \"redis://:{PASSWORD}@127.0.0.1:6379/0\"\n"),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("warning: `store.url`: redis://:<redacted>@127.0.0.1:6379 holds a password in the configuration file")
            && stderr.contains("password_file"),
        "{stderr}"
    );
    let (code, stderr) = check(
        dir.path(),
        &format!(
            "[store]\nbackend = \"redis\"\nsentinels = [\"redis://:{PASSWORD}@127.0.0.1:26379\"]\nmaster = \"m\"\n"
        ),
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains(
            "warning: `store.sentinels`: redis://:<redacted>@127.0.0.1:26379 holds a password"
        ) && stderr.contains("sentinel_password_file"),
        "{stderr}"
    );
    std::fs::write(dir.path().join("redis.pw"), PASSWORD).expect("write");
    let (code, stderr) = check(
        dir.path(),
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379/0\"\nusername = \"tollgate\"\npassword_file = \"redis.pw\"\n",
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
}
