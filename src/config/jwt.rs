//! `[jwt]`: the issuers whose bearer tokens identify callers, checked into
//! [`JwtConfig`].
//!
//! Keys are read here, so a reload re-reads every `jwks` file and a bad
//! one fails the reload like any other config error (the old keys stay).
//! A `jwks_url` is only checked here; its keys are fetched by the app
//! layer (`app::jwks`) and survive reloads.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Uri};

use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use super::limits::{KeyPart, LimitConfig, claim_path_is_valid};
use super::routes::RouteConfig;
use super::units::parse_duration;
use super::{Balance, ClientTls, EjectPolicy, UpstreamConfig};
use crate::jose::{Algorithm, KeySet};

/// `[jwt]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawJwt {
    /// Where tokens are read for every issuer without its own source.
    pub(crate) header: Option<String>,
    pub(crate) cookie: Option<String>,
    /// Verified tokens kept (0: verify every request).
    pub(crate) cache_size: Option<u64>,
    #[serde(default)]
    pub(crate) issuers: Vec<RawIssuer>,
}

/// `[[jwt.issuers]]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIssuer {
    pub(crate) issuer: String,
    pub(crate) jwks: Option<String>,
    pub(crate) jwks_url: Option<String>,
    pub(crate) secret_file: Option<String>,
    pub(crate) secret_env: Option<String>,
    /// `jwks_url` over HTTPS: CA certificates to trust instead of the built-in roots.
    pub(crate) ca: Option<String>,
    pub(crate) audiences: Option<Vec<String>>,
    pub(crate) algorithms: Option<Vec<String>>,
    pub(crate) leeway: Option<String>,
    pub(crate) refresh: Option<String>,
    pub(crate) header: Option<String>,
    pub(crate) cookie: Option<String>,
    pub(crate) consumer_claim: Option<String>,
    pub(crate) tenant_claim: Option<String>,
    pub(crate) plan_claim: Option<String>,
    pub(crate) priority_claim: Option<String>,
}

/// The default cache size: tokens of this many clients verified once each.
pub(crate) const DEFAULT_CACHE_SIZE: usize = 100_000;

/// `[jwt]`, checked.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    pub(crate) issuers: Vec<IssuerConfig>,
    pub(crate) cache_size: usize,
    /// Every claim path a limit keys on (`jwt:CLAIM`), in the order of
    /// their slots ([`crate::config::KeyPart::Claim`]).
    pub(crate) claim_paths: Vec<Arc<str>>,
}

/// One trusted issuer.
#[derive(Debug, Clone)]
pub(crate) struct IssuerConfig {
    /// The `iss` its tokens carry, exactly.
    pub(crate) issuer: Arc<str>,
    pub(crate) keys: KeySource,
    /// Accepted `aud` values; empty: `aud` is not checked.
    pub(crate) audiences: Vec<String>,
    pub(crate) algorithms: Vec<Algorithm>,
    /// Tolerance on `exp`, `nbf` and `iat`, in seconds.
    pub(crate) leeway: u64,
    pub(crate) source: TokenSource,
    pub(crate) consumer_claim: Option<Arc<str>>,
    pub(crate) tenant_claim: Option<Arc<str>>,
    pub(crate) plan_claim: Option<Arc<str>>,
    /// The claim naming the request's priority (`critical`, `normal`,
    /// `sheddable`; any other value is ignored).
    pub(crate) priority_claim: Option<Arc<str>>,
}

/// Where an issuer's keys come from.
#[derive(Debug, Clone)]
pub(crate) enum KeySource {
    /// Read with the configuration: a `jwks` file or an HMAC secret.
    Static(Arc<KeySet>),
    /// Fetched and refreshed by the gateway.
    Url(JwksUrl),
}

/// A `jwks_url` and how it is fetched.
#[derive(Debug, Clone)]
pub(crate) struct JwksUrl {
    pub(crate) url: Arc<str>,
    /// Between background refreshes (unless `Cache-Control` says
    /// otherwise), and the least time between two early ones.
    pub(crate) refresh: Duration,
    /// `ca`, resolved against the configuration's directory: with `url`
    /// and `refresh`, all that makes two fetchers differ.
    pub(crate) ca: Option<PathBuf>,
    /// How to reach it: the URL's origin as a one-URL upstream (timeouts,
    /// TLS from `ca`).
    pub(crate) upstream: Box<UpstreamConfig>,
}

/// Where a request carries its token.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum TokenSource {
    /// `Authorization: Bearer TOKEN`.
    Bearer,
    Header(HeaderName),
    Cookie(String),
}

/// Checks `[jwt]`; `claim_paths` are the `jwt:` paths the limits key on.
pub(super) fn check_jwt(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawJwt,
    directory: &Path,
    claim_paths: Vec<Arc<str>>,
) -> JwtConfig {
    if raw.issuers.is_empty() {
        c.problem(
            path.key("issuers"),
            "needs at least one [[jwt.issuers]] table",
        );
    }
    let default_source =
        token_source(c, path, &raw.header, &raw.cookie).unwrap_or(TokenSource::Bearer);
    let mut issuers: Vec<IssuerConfig> = Vec::with_capacity(raw.issuers.len());
    for (i, issuer) in raw.issuers.iter().enumerate() {
        let at = path.key("issuers").index(i);
        if issuers.iter().any(|known| *known.issuer == *issuer.issuer) {
            c.problem(
                at.key("issuer"),
                format!("issuer `{}` is listed twice", issuer.issuer),
            );
        }
        let source = token_source(c, &at, &issuer.header, &issuer.cookie)
            .unwrap_or_else(|| default_source.clone());
        issuers.push(check_issuer(c, &at, issuer, directory, source));
    }
    let cache_size = raw.cache_size.map_or(DEFAULT_CACHE_SIZE, |n| {
        usize::try_from(n).unwrap_or(usize::MAX)
    });
    JwtConfig {
        issuers,
        cache_size,
        claim_paths,
    }
}

fn token_source(
    c: &mut Checker,
    path: &KeyPath,
    header: &Option<String>,
    cookie: &Option<String>,
) -> Option<TokenSource> {
    match (header, cookie) {
        (Some(_), Some(_)) => {
            c.problem(
                path.key("cookie"),
                "`header` and `cookie` are two places for one token: give one",
            );
            None
        }
        (Some(name), None) if name.eq_ignore_ascii_case("authorization") => {
            Some(TokenSource::Bearer)
        }
        (Some(name), None) => c
            .header_name(path.key("header"), name)
            .map(TokenSource::Header),
        (None, Some(name)) if name.is_empty() => {
            c.problem(path.key("cookie"), "must not be empty");
            None
        }
        (None, Some(name)) => Some(TokenSource::Cookie(name.clone())),
        (None, None) => None,
    }
}

fn check_issuer(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawIssuer,
    directory: &Path,
    source: TokenSource,
) -> IssuerConfig {
    if raw.issuer.is_empty() {
        c.problem(
            path.key("issuer"),
            "must not be empty: it is matched against the token's `iss`",
        );
    }
    let given: Vec<&str> = [
        ("jwks", raw.jwks.is_some()),
        ("jwks_url", raw.jwks_url.is_some()),
        ("secret_file", raw.secret_file.is_some()),
        ("secret_env", raw.secret_env.is_some()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect();
    let algorithms = check_algorithms(c, path, raw);
    let keys = match given.as_slice() {
        [] => {
            c.problem(
                path.clone(),
                "an issuer needs its keys: `jwks` (a file), `jwks_url`, or `secret_file`/`secret_env` for HS256",
            );
            None
        }
        [_, second, ..] => {
            c.problem(
                path.key(second),
                format!(
                    "`{}` and `{second}` are two sources of one issuer's keys: give one",
                    given[0]
                ),
            );
            None
        }
        ["jwks"] => {
            let file = directory.join(raw.jwks.as_deref().unwrap_or_default());
            let read = std::fs::read(&file)
                .map_err(|e| format!("cannot read JWKS file {}: {e}", file.display()))
                .and_then(|bytes| {
                    KeySet::from_jwks(&bytes).map_err(|e| format!("{}: {e}", file.display()))
                });
            match read {
                Ok(keys) => Some(KeySource::Static(Arc::new(keys))),
                Err(message) => {
                    c.problem(path.key("jwks"), message);
                    None
                }
            }
        }
        ["jwks_url"] => check_jwks_url(c, path, raw, directory),
        [key] => match read_secret(raw, directory).and_then(|s| KeySet::from_secret(&s)) {
            Ok(keys) => {
                if let Some(alg) = algorithms.iter().find(|a| !a.is_hmac()) {
                    c.problem(
                        path.key("algorithms"),
                        format!("a secret verifies HS256/HS384/HS512 only, not {alg}"),
                    );
                }
                Some(KeySource::Static(Arc::new(keys)))
            }
            Err(message) => {
                c.problem(path.key(key), message);
                None
            }
        },
    };
    if raw.ca.is_some() && raw.jwks_url.is_none() {
        c.problem(path.key("ca"), "`ca` applies to `jwks_url` only");
    }
    if raw.refresh.is_some() && raw.jwks_url.is_none() {
        c.problem(path.key("refresh"), "`refresh` applies to `jwks_url` only");
    }
    let leeway = match raw.leeway.as_deref() {
        None => 30,
        Some(text) => match parse_duration(text) {
            Ok(d) => d.as_secs(),
            Err(message) => {
                c.problem(path.key("leeway"), message);
                30
            }
        },
    };
    let claim = |c: &mut Checker, key: &str, value: &Option<String>| -> Option<Arc<str>> {
        let name = value.as_deref()?;
        if claim_path_is_valid(name) {
            Some(Arc::from(name))
        } else {
            c.problem(
                path.key(key),
                format!("`{name}` is not a claim name or dotted path like \"org.id\""),
            );
            None
        }
    };
    if raw.tenant_claim.is_some() && raw.consumer_claim.is_none() {
        c.problem(
            path.key("tenant_claim"),
            "a tenant is a consumer's: set `consumer_claim` too (e.g. \"sub\")",
        );
    }
    IssuerConfig {
        issuer: Arc::from(raw.issuer.as_str()),
        keys: keys.unwrap_or_else(|| KeySource::Static(Arc::new(KeySet::default()))),
        audiences: raw.audiences.clone().unwrap_or_default(),
        algorithms,
        leeway,
        source,
        consumer_claim: claim(c, "consumer_claim", &raw.consumer_claim),
        tenant_claim: claim(c, "tenant_claim", &raw.tenant_claim),
        plan_claim: claim(c, "plan_claim", &raw.plan_claim),
        priority_claim: claim(c, "priority_claim", &raw.priority_claim),
    }
}

/// `algorithms`, default: every asymmetric one, or HS256 for a secret.
fn check_algorithms(c: &mut Checker, path: &KeyPath, raw: &RawIssuer) -> Vec<Algorithm> {
    let secret = raw.secret_file.is_some() || raw.secret_env.is_some();
    let Some(names) = &raw.algorithms else {
        return if secret {
            vec![Algorithm::HS256]
        } else {
            Algorithm::ALL
                .into_iter()
                .filter(|a| !a.is_hmac())
                .collect()
        };
    };
    if names.is_empty() {
        c.problem(path.key("algorithms"), "needs at least one algorithm");
    }
    let mut algorithms = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        if name.eq_ignore_ascii_case("none") {
            c.problem(
                path.key("algorithms").index(i),
                "`none` is never accepted: an unsigned token is one anybody can write",
            );
            continue;
        }
        let all: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        if let Some(name) = c.one_of(path.key("algorithms").index(i), name, &all) {
            algorithms.extend(Algorithm::from_name(name));
        }
    }
    algorithms
}

fn check_jwks_url(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawIssuer,
    directory: &Path,
) -> Option<KeySource> {
    let text = raw.jwks_url.as_deref().unwrap_or_default();
    let url: Option<Uri> = text.parse().ok().filter(|url: &Uri| {
        matches!(url.scheme_str(), Some("http" | "https"))
            && url.host().is_some_and(|h| !h.is_empty())
    });
    let Some(url) = url else {
        c.problem(
            path.key("jwks_url"),
            format!("`{text}` is not an http:// or https:// URL"),
        );
        return None;
    };
    let refresh = c.duration(path.key("refresh"), &raw.refresh, Duration::from_secs(300));
    let origin = format!(
        "{}://{}",
        url.scheme_str().unwrap_or("http"),
        url.authority().map_or("", |a| a.as_str())
    );
    // The URL's origin as a one-URL upstream: the fetcher connects as the
    // proxy does (TLS with `ca`, the certificate checked for the URL's
    // host), its path goes on the request.
    let ca = raw.ca.as_ref().map(|file| directory.join(file));
    let tls = match url.scheme_str() {
        Some("https") => match super::tls::client_config(ca.as_deref()) {
            Ok(config) => Some(ClientTls { config, sni: None }),
            Err(message) => {
                c.problem(path.key("ca"), message);
                return None;
            }
        },
        _ => None,
    };
    let upstream = UpstreamConfig {
        name: format!("jwks {origin}"),
        urls: vec![origin.parse().ok()?],
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(10),
        timeout: Duration::from_secs(10),
        host: None,
        tls,
        http2: false,
        balance: Balance::RoundRobin,
        slow_start: None,
        eject: EjectPolicy::default(),
        health: None,
    };
    Some(KeySource::Url(JwksUrl {
        url: Arc::from(text),
        refresh,
        ca,
        upstream: Box::new(upstream),
    }))
}

/// The HMAC secret of `secret_file` (its bytes, without one final newline)
/// or `secret_env`. Errors name the file or variable, never the secret.
fn read_secret(raw: &RawIssuer, directory: &Path) -> Result<Vec<u8>, String> {
    if let Some(file) = &raw.secret_file {
        let file = directory.join(file);
        let mut bytes =
            std::fs::read(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        return Ok(bytes);
    }
    let name = raw.secret_env.as_deref().unwrap_or_default();
    match std::env::var(name) {
        Ok(value) if !value.is_empty() => Ok(value.into_bytes()),
        Ok(_) => Err(format!("the environment variable `{name}` is empty")),
        Err(_) => Err(format!(
            "the environment variable `{name}` is not set (or not UTF-8)"
        )),
    }
}

/// `[jwt]`, and every use of it (`jwt:` keys, `require_jwt`) only with it.
pub(super) fn check_jwt_use(
    c: &mut Checker,
    root: &KeyPath,
    raw: Option<&RawJwt>,
    directory: &Path,
    limits: &[LimitConfig],
    routes: &[RouteConfig],
) -> Option<JwtConfig> {
    let claim_paths = std::mem::take(&mut c.claim_paths);
    if let Some(jwt) = raw {
        return Some(check_jwt(c, &root.key("jwt"), jwt, directory, claim_paths));
    }
    for limit in limits {
        if let Some(KeyPart::Claim { path, .. }) = limit
            .key
            .iter()
            .find(|p| matches!(p, KeyPart::Claim { .. }))
        {
            c.problem(
                root.key("limits").key(&limit.name).key("key"),
                format!("`jwt:{path}` reads a verified token's claim: configure its issuer in [[jwt.issuers]]"),
            );
        }
    }
    for (i, route) in routes.iter().enumerate() {
        if route.require_jwt {
            c.problem(
                root.key("routes").index(i).key("require_jwt"),
                "`require_jwt` needs the issuers of [[jwt.issuers]] to verify tokens with",
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::{Config, KeyPart};

    const LIMIT: &str = "[limits.per_user]\nkey = [\"jwt:sub\", \"jwt:org.id\", \"jwt:sub\"]\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1s\"\n\n[[routes]]\nname = \"r\"\nrespond = { status = 200 }\nlimits = [\"per_user\"]\nrequire_jwt = true\n";

    fn load(dir: &Path, text: &str) -> Result<Config, String> {
        let path = dir.join("gateway.toml");
        std::fs::write(&path, text).unwrap();
        Config::from_bytes(&path, text.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn issuers_keys_and_claim_slots() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), format!("{}\n", "s".repeat(32))).unwrap();
        let text = format!(
            "[jwt]\ncookie = \"session\"\n\n[[jwt.issuers]]\nissuer = \"https://a/\"\nsecret_file = \"secret\"\nconsumer_claim = \"sub\"\n\n[[jwt.issuers]]\nissuer = \"https://b/\"\njwks_url = \"https://b.example/jwks\"\nheader = \"authorization\"\nleeway = \"0s\"\n\n{LIMIT}"
        );
        let config = load(dir.path(), &text).unwrap();
        let jwt = config.jwt.as_ref().unwrap();
        // One slot per distinct path, in the order first met.
        let paths: Vec<&str> = jwt.claim_paths.iter().map(|p| &**p).collect();
        assert_eq!(paths, ["sub", "org.id"]);
        let slots: Vec<usize> = config.limits[0]
            .key
            .iter()
            .map(|part| match part {
                KeyPart::Claim { slot, .. } => *slot,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(slots, [0, 1, 0]);
        let [a, b] = &jwt.issuers[..] else { panic!() };
        assert_eq!(a.source, super::TokenSource::Cookie("session".to_owned()));
        assert_eq!(a.algorithms, [super::Algorithm::HS256]);
        assert!(matches!(&a.keys, super::KeySource::Static(keys) if keys.keys.len() == 1));
        assert_eq!(b.source, super::TokenSource::Bearer);
        assert_eq!(b.leeway, 0);
        assert!(!b.algorithms.iter().any(|alg| alg.is_hmac()));
        assert!(config.routes[0].require_jwt);
    }

    #[test]
    fn every_mistake_is_named_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("bad.json"),
            r#"{"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("short"), "short").unwrap();
        let text = format!(
            "[jwt]\nheader = \"x-token\"\ncookie = \"c\"\n\n[[jwt.issuers]]\nissuer = \"a\"\njwks = \"bad.json\"\nalgorithms = [\"none\", \"RS257\"]\nrefresh = \"1m\"\n\n[[jwt.issuers]]\nissuer = \"a\"\nsecret_file = \"short\"\nalgorithms = [\"RS256\"]\n\n[[jwt.issuers]]\nissuer = \"c\"\njwks_url = \"ftp://x\"\n\n[[jwt.issuers]]\nissuer = \"d\"\n\n[[jwt.issuers]]\nissuer = \"e\"\njwks = \"bad.json\"\njwks_url = \"https://e/\"\nconsumer_claim = \"a..b\"\npriority_claim = \".p\"\n\n{LIMIT}"
        );
        let message = load(dir.path(), &text).unwrap_err();
        for expected in [
            "`jwt.cookie`: `header` and `cookie` are two places for one token",
            "`jwt.issuers[0].jwks`: ",
            "an RSA key of 17 bits (at least 2048)",
            "`jwt.issuers[0].algorithms[0]`: `none` is never accepted",
            "`jwt.issuers[0].algorithms[1]`: unknown value `RS257`",
            "(did you mean `RS256`?)",
            "`jwt.issuers[0].refresh`: `refresh` applies to `jwks_url` only",
            "`jwt.issuers[1].issuer`: issuer `a` is listed twice",
            "`jwt.issuers[1].secret_file`: an HMAC secret needs at least 32 bytes, this one has 5",
            "`jwt.issuers[2].jwks_url`: `ftp://x` is not an http:// or https:// URL",
            "`jwt.issuers[3]`: an issuer needs its keys",
            "`jwt.issuers[4].jwks_url`: `jwks` and `jwks_url` are two sources",
            "`jwt.issuers[4].consumer_claim`: `a..b` is not a claim name",
            "`jwt.issuers[4].priority_claim`: `.p` is not a claim name",
        ] {
            assert!(message.contains(expected), "{expected}\n{message}");
        }
        let message = load(dir.path(), LIMIT).unwrap_err();
        assert!(message.contains("`limits.per_user.key`: `jwt:sub` reads a verified token's claim: configure its issuer in [[jwt.issuers]]"), "{message}");
        assert!(
            message.contains("`routes[0].require_jwt`: `require_jwt` needs the issuers"),
            "{message}"
        );
    }
}
