//! The production side of `[store]` with Redis: where the servers are (one
//! URL, a Redis Cluster's seeds, or a master found through Sentinel), the
//! credentials (an ACL user, a password read from a file or an environment
//! variable, or the URL's), and TLS for `rediss://` (`ca`, `sni`, as for
//! HTTPS upstreams).
//!
//! A password is a [`Secret`] from the moment it is read: its `Debug`
//! prints `<redacted>`, and a [`RedisUrl`] prints without it, so no log
//! line, error message, `/config` body or `check` output can carry it. The
//! URL text of an error is redacted the same way ([`redacted`]).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::ServerName;

/// A password, readable only through [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(Arc<str>);

impl Secret {
    pub(crate) fn new(text: &str) -> Secret {
        Secret(text.into())
    }

    /// The password itself, for the AUTH command and nothing else.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"<redacted>\"")
    }
}

/// A `redis://` or `rediss://` URL, parsed; its password kept as a
/// [`Secret`] and never printed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedisUrl {
    /// `rediss://`: the connection is TLS.
    pub(crate) tls: bool,
    /// A name or an IP address (without brackets).
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) db: i64,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Secret>,
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "rediss" } else { "redis" };
        write!(f, "{scheme}://")?;
        match (&self.username, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:<redacted>@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, Some(_)) => f.write_str(":<redacted>@")?,
            (None, None) => {}
        }
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)?;
        } else {
            write!(f, "{}:{}", self.host, self.port)?;
        }
        if self.db != 0 {
            write!(f, "/{}", self.db)?;
        }
        Ok(())
    }
}

impl RedisUrl {
    /// `redis://HOST:PORT`, for the cluster client (credentials are given
    /// to it apart).
    pub(crate) fn address(&self) -> String {
        if self.host.contains(':') {
            format!("redis://[{}]:{}", self.host, self.port)
        } else {
            format!("redis://{}:{}", self.host, self.port)
        }
    }
}

/// Where the Redis that holds the shared limits is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RedisServers {
    /// `url = "..."`: one server.
    One(RedisUrl),
    /// `cluster = true`: the seed nodes of a Redis Cluster.
    Cluster(Vec<RedisUrl>),
    /// `sentinels = [...]`, `master = "..."`: the master the sentinels name,
    /// asked again on every new connection, so a failover is followed.
    Sentinel {
        sentinels: Vec<RedisUrl>,
        master: String,
        /// The sentinels' password (`sentinel_password_file`/`_env`), for
        /// those whose URL has none.
        password: Option<Secret>,
    },
}

impl fmt::Display for RedisServers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |urls: &[RedisUrl]| {
            urls.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            RedisServers::One(url) => write!(f, "{url}"),
            RedisServers::Cluster(urls) => write!(f, "cluster {}", list(urls)),
            RedisServers::Sentinel {
                sentinels, master, ..
            } => {
                write!(f, "master `{master}` of sentinels {}", list(sentinels))
            }
        }
    }
}

/// How `rediss://` connections are made: the rustls client configuration
/// (ring, the `ca` file's roots or Mozilla's) and the name to verify when
/// not the host connected to. Equal when made from the same `ca` bytes and
/// `sni`, so that a reload that re-reads an unchanged `ca` is no change.
#[derive(Clone)]
pub(crate) struct RedisTls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    pub(crate) sni: Option<ServerName<'static>>,
    /// The `ca` file's bytes as read, for equality.
    ca: Option<Vec<u8>>,
}

impl PartialEq for RedisTls {
    fn eq(&self, other: &Self) -> bool {
        self.sni == other.sni && self.ca == other.ca
    }
}

impl Eq for RedisTls {}

impl fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisTls")
            .field("sni", &self.sni)
            .field("ca", &self.ca.is_some())
            .finish_non_exhaustive()
    }
}

impl RedisTls {
    /// Trusts the CA certificates in `ca` (PEM), or the built-in roots
    /// without one; no ALPN (Redis speaks none). The error names the file.
    pub(crate) fn new(
        ca: Option<&Path>,
        sni: Option<ServerName<'static>>,
    ) -> Result<RedisTls, String> {
        let mut config = (*super::tls::client_config(ca)?).clone();
        config.alpn_protocols.clear();
        let ca = match ca {
            Some(file) => Some(
                std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?,
            ),
            None => None,
        };
        Ok(RedisTls {
            config: Arc::new(config),
            sni,
            ca,
        })
    }
}

const URL_FORM: &str = "expected redis://HOST:PORT[/DB] or rediss://HOST:PORT[/DB] (TLS), like \"redis://127.0.0.1:6379/0\"";

/// Parses `redis://[user[:password]@]host:port[/db]` (or `rediss://`).
/// The error shows the URL with its password redacted.
pub(crate) fn parse_url(text: &str) -> Result<RedisUrl, String> {
    let bad = || format!("`{}` is not a Redis URL; {URL_FORM}", redacted(text));
    let (tls, rest) = if let Some(rest) = text.strip_prefix("rediss://") {
        (true, rest)
    } else if let Some(rest) = text.strip_prefix("redis://") {
        (false, rest)
    } else {
        return Err(bad());
    };
    if rest.contains(['?', '#']) {
        return Err(format!(
            "`{}`: a store URL takes no query or fragment; {URL_FORM}",
            redacted(text)
        ));
    }
    let (authority, db) = match rest.split_once('/') {
        Some((authority, "")) => (authority, 0),
        Some((authority, db)) => (authority, db.parse::<i64>().map_err(|_| bad())?),
        None => (rest, 0),
    };
    if db < 0 {
        return Err(bad());
    }
    let (userinfo, host_port) = match authority.rsplit_once('@') {
        Some((userinfo, host_port)) => (Some(userinfo), host_port),
        None => (None, authority),
    };
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (host, port) = v6.split_once("]:").ok_or_else(bad)?;
        (host, port)
    } else {
        host_port.rsplit_once(':').ok_or_else(bad)?
    };
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() || port == 0 {
        return Err(bad());
    }
    let (username, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (user, password) = match info.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (info, None),
            };
            let user = percent_decode(user).ok_or_else(bad)?;
            let password = match password {
                Some(text) => Some(percent_decode(text).ok_or_else(bad)?),
                None => None,
            };
            (
                (!user.is_empty()).then_some(user),
                password
                    .filter(|p| !p.is_empty())
                    .map(|p| Secret::new(p.as_str())),
            )
        }
    };
    Ok(RedisUrl {
        tls,
        host: host.to_owned(),
        port,
        db,
        username,
        password,
    })
}

/// `text` with whatever sits between `user:` and `@` replaced by
/// `<redacted>`: how a URL that may hold a password is shown in a message.
pub(crate) fn redacted(text: &str) -> String {
    let Some((scheme, rest)) = text.split_once("://") else {
        return text.to_owned();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((info, host)) => match info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:<redacted>@{host}{tail}"),
            None => text.to_owned(),
        },
        None => text.to_owned(),
    }
}

/// `%XX` escapes decoded (a password may hold `@`, `:` or `/` so written);
/// `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The password in `file`: its content without one trailing newline
/// (`\n` or `\r\n`, as `echo` and editors leave it). The error names the
/// file, never what it holds.
pub(crate) fn read_password_file(file: &Path) -> Result<Secret, String> {
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", file.display()))?;
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        return Err(format!(
            "{} is empty: write the password into it",
            file.display()
        ));
    }
    Ok(Secret::new(text))
}

/// The password in the environment variable `name`. The error names the
/// variable, never its value.
pub(crate) fn read_password_env(name: &str) -> Result<Secret, String> {
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Ok(Secret::new(&value)),
        Ok(_) => Err(format!("the environment variable `{name}` is empty")),
        Err(std::env::VarError::NotPresent) => Err(format!(
            "the environment variable `{name}` is not set: export it to the gateway's environment, or use `password_file`"
        )),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(format!("the environment variable `{name}` is not UTF-8"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_their_password_apart() {
        let url = parse_url("rediss://tollgate:s%40cret@redis.internal:6380/2").unwrap();
        assert!(url.tls);
        assert_eq!(
            (url.host.as_str(), url.port, url.db),
            ("redis.internal", 6380, 2)
        );
        assert_eq!(url.username.as_deref(), Some("tollgate"));
        assert_eq!(url.password.as_ref().map(Secret::expose), Some("s@cret"));
        assert_eq!(
            url.to_string(),
            "rediss://tollgate:<redacted>@redis.internal:6380/2"
        );
        let v6 = parse_url("redis://:pw@[::1]:6379").unwrap();
        assert_eq!((v6.host.as_str(), v6.username.as_deref()), ("::1", None));
        assert_eq!(v6.to_string(), "redis://:<redacted>@[::1]:6379");
        assert!(!format!("{v6:?}").contains("pw"), "{v6:?}");
    }

    #[test]
    fn bad_urls_are_refused_without_showing_the_password() {
        for text in [
            "http://127.0.0.1:6379",
            "redis://127.0.0.1",
            "redis://:hunter2@127.0.0.1:port",
            "redis://127.0.0.1:6379/x",
            "redis://127.0.0.1:6379?protocol=resp3",
            "redis://:hunter2@127.0.0.1:6379/%",
        ] {
            let message = parse_url(text).expect_err(text);
            assert!(!message.contains("hunter2"), "{message}");
        }
        assert_eq!(
            redacted("redis://u:hunter2@h:1/0"),
            "redis://u:<redacted>@h:1/0"
        );
    }

    #[test]
    fn a_password_file_loses_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\r\n").unwrap();
        assert_eq!(read_password_file(&file).unwrap().expose(), "s3cret");
        std::fs::write(&file, "two\n\n").unwrap();
        assert_eq!(read_password_file(&file).unwrap().expose(), "two\n");
        std::fs::write(&file, "\n").unwrap();
        assert!(read_password_file(&file).unwrap_err().contains("is empty"));
        assert_eq!(format!("{:?}", Secret::new("x")), "\"<redacted>\"");
    }
}
