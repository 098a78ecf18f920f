//! How the store connects: [`RedisStore::open`] to the one server, the
//! cluster (the redis crate's cluster client, one connection per node) or
//! the master the sentinels name; [`RedisStore::connect`] with the scripts
//! loaded as well (the breaker's probe).
//!
//! How the store reaches one Redis node: TCP, then TLS for `rediss://`
//! (rustls with the ring provider, the `ca` roots or Mozilla's, `sni`),
//! then the redis crate's handshake on that stream (`AUTH` with the ACL
//! user and password, `SELECT`); and, with Sentinel, which node is the
//! master now.
//!
//! The crate is not asked to make TLS connections itself: its rustls
//! support takes PEM roots only, verifies the host it connects to (no
//! other SNI), and builds its configuration on rustls's process-wide
//! provider. Making the stream here keeps one TLS setup in the gateway
//! (the one HTTPS upstreams use, `config::tls`); the multiplexed connection
//! over it is the crate's own, so scripts, batching and timeouts are the
//! same over every kind of connection.
//!
//! # Sentinel
//!
//! [`master`] asks the sentinels in turn, starting with the one that
//! answered last, `SENTINEL GET-MASTER-ADDR-BY-NAME`, connects to the
//! address the first one names and checks with `ROLE` that it is a master
//! (a sentinel that has not seen a failover yet may name the old one, now
//! a replica). Each new connection asks again: the breaker's probe after a
//! failure, and every worker's connection of the generation it opens, so a
//! failover is followed as soon as a sentinel names the new master.
//! Sentinels are reached like the master (TLS when their URLs are
//! `rediss://`), with the user and password of their own URLs, or
//! `sentinel_password_file`'s.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, RedisConnectionInfo, RedisError, RedisResult, Value,
};
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

use super::RedisStore;
use crate::config::{RedisServers, RedisTls, RedisUrl, Secret};

/// Who the gateway is to a node: its ACL user, password and database.
pub(crate) struct Login<'a> {
    pub(crate) username: Option<&'a str>,
    pub(crate) password: Option<&'a Secret>,
    pub(crate) db: i64,
}

impl Login<'_> {
    fn settings(&self) -> RedisConnectionInfo {
        let mut settings = RedisConnectionInfo::default().set_db(self.db);
        if let Some(user) = self.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = self.password {
            settings = settings.set_password(password.expose());
        }
        settings
    }
}

/// A connection to `host:port`, TLS with `tls`, logged in as `login`,
/// each call bounded by `response_timeout`; the whole of it (TCP, TLS,
/// handshake) bounded by `bound`. The connection's driver runs on the
/// caller's runtime and ends when the last clone of the connection is
/// dropped.
pub(crate) async fn node(
    host: &str,
    port: u16,
    tls: Option<&RedisTls>,
    login: &Login<'_>,
    response_timeout: Duration,
    bound: Duration,
) -> RedisResult<MultiplexedConnection> {
    let settings = login.settings();
    let config = AsyncConnectionConfig::new().set_response_timeout(Some(response_timeout));
    let connecting = async {
        let tcp = TcpStream::connect((host, port))
            .await
            .map_err(|e| failure(format!("cannot connect to {host}:{port}"), e))?;
        // Two stream types, so two calls; the driver is spawned in each.
        let connection = match tls {
            None => {
                let (connection, driver) =
                    MultiplexedConnection::new_with_config(&settings, tcp, config).await?;
                tokio::spawn(driver);
                connection
            }
            Some(tls) => {
                let name = match &tls.sni {
                    Some(name) => name.clone(),
                    None => ServerName::try_from(host.to_owned()).map_err(|_| {
                        failure(
                            format!("`{host}` is no name to verify a certificate for"),
                            "set `sni`",
                        )
                    })?,
                };
                let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
                let stream = connector.connect(name.clone(), tcp).await.map_err(|e| {
                    failure(
                        format!(
                            "TLS handshake with {host}:{port} (verifying `{}`) failed",
                            name.to_str()
                        ),
                        e,
                    )
                })?;
                let (connection, driver) =
                    MultiplexedConnection::new_with_config(&settings, stream, config).await?;
                tokio::spawn(driver);
                connection
            }
        };
        Ok(connection)
    };
    match tokio::time::timeout(bound, connecting).await {
        Ok(result) => result,
        Err(_) => Err(failure(
            format!("connecting to {host}:{port} timed out"),
            format!("after {bound:?}"),
        )),
    }
}

/// A connection to the master that `sentinels` name `name` now (each
/// sentinel logged in with its URL's password, else `password`); `last`
/// remembers which sentinel answered, to ask it first next time.
pub(crate) async fn master(
    (sentinels, password): (&[RedisUrl], Option<&Secret>),
    name: &str,
    last: &AtomicUsize,
    tls: Option<&RedisTls>,
    login: &Login<'_>,
    response_timeout: Duration,
    bound: Duration,
) -> RedisResult<MultiplexedConnection> {
    let first = last.load(Ordering::Relaxed);
    let mut why: Vec<String> = Vec::new();
    for i in 0..sentinels.len() {
        let at = (first + i) % sentinels.len();
        let sentinel = &sentinels[at];
        let asked = ask(sentinel, password, name, tls, response_timeout, bound).await;
        let (host, port) = match asked {
            Ok(address) => address,
            Err(error) => {
                why.push(format!("{sentinel}: {error}"));
                continue;
            }
        };
        let mut connection = match node(&host, port, tls, login, response_timeout, bound).await {
            Ok(connection) => connection,
            Err(error) => {
                why.push(format!("{sentinel} names {host}:{port}: {error}"));
                continue;
            }
        };
        match role(&mut connection).await {
            // A user without `ROLE` cannot check: the sentinel is believed.
            Some(role) if role != "master" => {
                why.push(format!(
                    "{sentinel} names {host}:{port}, which is a {role} (a failover under way)"
                ));
                continue;
            }
            _ => {}
        }
        last.store(at, Ordering::Relaxed);
        return Ok(connection);
    }
    Err(RedisError::from((
        ErrorKind::MasterNameNotFoundBySentinel,
        "no sentinel named a reachable master",
        format!("master `{name}`: {}", why.join("; ")),
    )))
}

/// `SENTINEL GET-MASTER-ADDR-BY-NAME name` of one sentinel.
async fn ask(
    sentinel: &RedisUrl,
    password: Option<&Secret>,
    name: &str,
    tls: Option<&RedisTls>,
    response_timeout: Duration,
    bound: Duration,
) -> RedisResult<(String, u16)> {
    let login = Login {
        username: sentinel.username.as_deref(),
        password: sentinel.password.as_ref().or(password),
        db: 0,
    };
    let tls = tls.filter(|_| sentinel.tls);
    let mut connection = node(
        &sentinel.host,
        sentinel.port,
        tls,
        &login,
        response_timeout,
        bound,
    )
    .await?;
    let answer: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(name)
        .query_async(&mut connection)
        .await?;
    answer.ok_or_else(|| {
        RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "the sentinel monitors no master of that name",
            name.to_owned(),
        ))
    })
}

/// The node's role (`master`, `slave`), or `None` when it cannot be asked.
async fn role(connection: &mut MultiplexedConnection) -> Option<String> {
    match redis::cmd("ROLE").query_async(connection).await {
        Ok(Value::Array(items)) => match items.first() {
            Some(Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Some(Value::SimpleString(text)) => Some(text.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// A connection failure with what was being done and why.
fn failure(doing: String, cause: impl std::fmt::Display) -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "connection failed",
        format!("{doing}: {cause}"),
    ))
}

/// One Redis or a Redis Cluster; clones share the connection.
#[derive(Clone)]
pub(super) enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connection {
    pub(super) async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Single(c) => cmd.query_async(c).await,
            Connection::Cluster(c) => cmd.query_async(c).await,
        }
    }

    /// `SCRIPT LOAD` (on a cluster, on every primary).
    pub(super) async fn load(&mut self, script: &redis::Script) -> RedisResult<()> {
        match self {
            Connection::Single(c) => script.load_async(c).await.map(drop),
            Connection::Cluster(c) => script.load_async(c).await.map(drop),
        }
    }
}

impl RedisStore {
    /// A fresh connection with the scripts loaded, or why not.
    pub(super) async fn connect(&self) -> RedisResult<Connection> {
        let mut connection = self.open().await?;
        connection.query(&redis::cmd("PING")).await?;
        connection.load(&self.stack).await?;
        connection.load(&self.settle).await?;
        connection.load(&self.heartbeat).await?;
        Ok(connection)
    }

    /// A fresh connection: to the one server, the cluster, or the master
    /// the sentinels name now (asked again each time, see `connect`).
    pub(super) async fn open(&self) -> RedisResult<Connection> {
        let bound = self.config.timeout.max(Duration::from_millis(500));
        let config = &self.config;
        let login = |db| Login {
            username: config.username.as_deref(),
            password: config.password.as_ref(),
            db,
        };
        let tls = config.tls.as_ref();
        let connection = match &config.servers {
            RedisServers::Cluster(urls) => {
                let mut builder =
                    redis::cluster::ClusterClient::builder(urls.iter().map(|u| u.address()))
                        .connection_timeout(bound)
                        .response_timeout(bound);
                if let Some(user) = &config.username {
                    builder = builder.username(user);
                }
                if let Some(password) = &config.password {
                    builder = builder.password(password.expose());
                }
                Connection::Cluster(builder.build()?.get_async_connection().await?)
            }
            RedisServers::One(url) => Connection::Single(
                node(&url.host, url.port, tls, &login(url.db), bound, bound).await?,
            ),
            RedisServers::Sentinel {
                sentinels,
                master,
                password,
            } => Connection::Single(
                self::master(
                    (sentinels, password.as_ref()),
                    master,
                    &self.sentinel,
                    tls,
                    &login(0),
                    bound,
                    bound,
                )
                .await?,
            ),
        };
        Ok(connection)
    }
}
