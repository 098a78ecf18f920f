//! `[server.tls]`: certificate chains and keys read from PEM files into one
//! rustls server configuration, validated like every other value (the
//! table's serde mirror and its check are here too); and the client side
//! of HTTPS upstreams and `jwks_url`s ([`ClientTls`]).
//!
//! The files are read when the configuration is validated — at start and on
//! every reload — so a `SIGHUP` after a certificate rotation re-reads them:
//! the new snapshot carries a new [`ServerTls`], new handshakes use it, and
//! open connections keep the one they were accepted with. A file that is
//! missing, not PEM, or a key that does not match its certificate is a
//! problem of the key that names it, so a bad pair fails the reload and the
//! running one stays.
//!
//! Several certificates: `[[server.tls.certs]]` entries are chosen by the
//! client's SNI (exact names, or `*.example.com` for one label), and the
//! table's own `cert`/`key` are the default for every other client.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use super::raw::OneOrMany;

/// The ALPN protocols offered, in the server's order of preference.
pub(crate) const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A validated `[server.tls]`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TlsConfig {
    /// The TLS listeners.
    pub(crate) listen: Vec<std::net::SocketAddr>,
    /// What handshakes use (shared by every connection of this snapshot).
    pub(crate) server: ServerTls,
    /// Each certificate read, for the expiry warnings.
    pub(crate) certificates: Vec<CertificateFile>,
}

/// A loaded certificate's file and when it expires.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CertificateFile {
    /// The key that named it, e.g. `server.tls.certs[0].cert`.
    pub(crate) key: String,
    pub(crate) file: PathBuf,
    /// The leaf certificate's `notAfter`; `None` when it could not be read
    /// (rustls still checks the certificate at the client).
    pub(crate) not_after: Option<SystemTime>,
}

/// The rustls server configuration of one snapshot. Equal only to itself:
/// two loads of the same files are two configurations.
#[derive(Clone)]
pub(crate) struct ServerTls(pub(crate) Arc<rustls::ServerConfig>);

impl PartialEq for ServerTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ServerTls")
    }
}

/// The provider every TLS configuration of the gateway uses: ring (aws-lc-rs
/// would need cmake and nasm to build).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// One certificate pair as configured: its key path, and both files resolved
/// against the configuration's directory.
pub(crate) struct PairSpec {
    pub(crate) key: KeyPath,
    pub(crate) cert: PathBuf,
    pub(crate) private_key: PathBuf,
}

/// Reads a certificate chain and its key, and checks that they belong
/// together. Errors are `(key path, message)`: the message names the file.
pub(crate) fn load_pair(
    spec: &PairSpec,
    provider: &CryptoProvider,
) -> Result<(Arc<CertifiedKey>, Option<SystemTime>), (KeyPath, String)> {
    let cert_key = spec.key.key("cert");
    let chain = read_chain(&spec.cert).map_err(|m| (cert_key.clone(), m))?;
    let key_key = spec.key.key("key");
    let private_key = read_key(&spec.private_key).map_err(|m| (key_key.clone(), m))?;
    let signing = provider
        .key_provider
        .load_private_key(private_key)
        .map_err(|e| {
            (
                key_key.clone(),
                format!(
                    "{}: unsupported private key: {e}",
                    spec.private_key.display()
                ),
            )
        })?;
    let not_after = chain.first().and_then(|leaf| not_after(leaf));
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => {}
        // Keys that rustls cannot compare (rare algorithms) pass: the
        // handshake would fail at the client, not here.
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(_) => {
            return Err((
                key_key,
                format!(
                    "{} does not match the certificate in {}: write the key that was issued with it",
                    spec.private_key.display(),
                    spec.cert.display()
                ),
            ));
        }
    }
    Ok((Arc::new(certified), not_after))
}

fn read_chain(file: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read(file)?;
    let chain = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| not_pem(file, "certificate", &e))?;
    if chain.is_empty() {
        return Err(format!(
            "{} holds no PEM certificate: write the chain as `-----BEGIN CERTIFICATE-----` blocks, the server's own first",
            file.display()
        ));
    }
    Ok(chain)
}

fn read_key(file: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let bytes = read(file)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        pem::Error::NoItemsFound => format!(
            "{} holds no PEM private key: write a `-----BEGIN PRIVATE KEY-----` (PKCS#8), `RSA PRIVATE KEY` or `EC PRIVATE KEY` block",
            file.display()
        ),
        other => not_pem(file, "private key", &other),
    })
}

fn read(file: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

fn not_pem(file: &Path, what: &str, error: &pem::Error) -> String {
    format!("{} is not a PEM {what} file ({error})", file.display())
}

/// How the gateway connects to an upstream's `https://` URLs: the rustls
/// client configuration (trust roots) and the SNI name, if not the URL's
/// host. Equal only to itself, like [`ServerTls`].
#[derive(Clone)]
pub(crate) struct ClientTls {
    pub(crate) config: Arc<rustls::ClientConfig>,
    pub(crate) sni: Option<ServerName<'static>>,
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.config, &other.config) && self.sni == other.sni
    }
}

impl Eq for ClientTls {}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("sni", &self.sni)
            .finish_non_exhaustive()
    }
}

/// A client configuration that trusts the CA certificates in `ca` (PEM), or
/// the built-in roots (`webpki-roots`, Mozilla's) without one; TLS 1.3 and
/// 1.2, ALPN `http/1.1` (the upstream client speaks HTTP/1.1). The error
/// names the file.
pub(crate) fn client_config(ca: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        Some(file) => {
            for certificate in read_chain(file)? {
                roots.add(certificate).map_err(|e| {
                    format!(
                        "{}: not a CA certificate rustls accepts: {e}",
                        file.display()
                    )
                })?;
            }
        }
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("cannot build the TLS client configuration: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Chooses the certificate of a handshake by its SNI: an exact name, then a
/// wildcard for the first label, then the default.
#[derive(Debug)]
pub(crate) struct SniResolver {
    /// Lower-case names, and wildcards stored as their suffix (`.example.com`).
    by_name: HashMap<String, Arc<CertifiedKey>>,
    default: Arc<CertifiedKey>,
}

impl SniResolver {
    pub(crate) fn new(default: Arc<CertifiedKey>) -> Self {
        SniResolver {
            by_name: HashMap::new(),
            default,
        }
    }

    /// Adds `name` (`host.example.com` or `*.example.com`); false when it was
    /// already taken.
    pub(crate) fn add(&mut self, name: &str, certified: Arc<CertifiedKey>) -> bool {
        let name = name.to_ascii_lowercase();
        let name = match name.strip_prefix('*') {
            Some(suffix) => suffix.to_owned(),
            None => name,
        };
        self.by_name.insert(name, certified).is_none()
    }

    fn choose(&self, sni: Option<&str>) -> Arc<CertifiedKey> {
        if let Some(sni) = sni {
            // rustls hands SNI over lower-cased and without a trailing dot.
            if let Some(found) = self.by_name.get(sni) {
                return found.clone();
            }
            if let Some(dot) = sni.find('.')
                && let Some(found) = self.by_name.get(&sni[dot..])
            {
                return found.clone();
            }
        }
        self.default.clone()
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.choose(hello.server_name()))
    }
}

/// Whether `name` is a DNS name a `names` entry may hold: letters, digits,
/// `-` and dots, optionally behind one leading `*.`.
pub(crate) fn valid_name(name: &str) -> bool {
    let rest = name.strip_prefix("*.").unwrap_or(name);
    !rest.is_empty()
        && rest.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

/// The server configuration over `resolver`: TLS 1.3 and 1.2 only, ALPN
/// `h2` then `http/1.1`, sessions resumed from stateless tickets.
pub(crate) fn server_config(
    provider: Arc<CryptoProvider>,
    resolver: SniResolver,
) -> Result<ServerTls, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    // rustls's default keeps sessions in one in-memory cache behind a mutex
    // that every worker's handshakes take (two puts per full handshake, a
    // take per resumption): a lock shared by all workers on the handshake
    // path. Stateless tickets instead: the session travels, encrypted, with
    // the client, and any worker resumes it (its key behind a read lock,
    // written only when it rotates).
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.ticketer = ticketer()?;
    Ok(ServerTls(Arc::new(config)))
}

/// The process's ticket keys (rustls's rotating `Ticketer`: a new key
/// every 6 hours, tickets valid for 12), made once so that a reload does
/// not end the sessions clients hold.
fn ticketer() -> Result<Arc<dyn rustls::server::ProducesTickets>, rustls::Error> {
    static TICKETER: std::sync::OnceLock<Arc<dyn rustls::server::ProducesTickets>> =
        std::sync::OnceLock::new();
    if let Some(ticketer) = TICKETER.get() {
        return Ok(ticketer.clone());
    }
    let made = rustls::crypto::ring::Ticketer::new()?;
    Ok(TICKETER.get_or_init(|| made).clone())
}

/// The `notAfter` of a DER certificate, read by walking the few DER
/// elements in front of it (RFC 5280 §4.1: `Certificate` → `tbsCertificate`
/// → optional `[0] version`, `serialNumber`, `signature`, `issuer`,
/// `validity`). `None` for anything unexpected.
pub(crate) fn not_after(der: &[u8]) -> Option<SystemTime> {
    let (tag, certificate, _) = element(der)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, mut tbs, _) = element(certificate)?;
    if tag != 0x30 {
        return None;
    }
    let (tag, _, rest) = element(tbs)?;
    if tag == 0xa0 {
        tbs = rest;
    }
    // serialNumber, signature, issuer.
    for _ in 0..3 {
        tbs = element(tbs)?.2;
    }
    let (tag, validity, _) = element(tbs)?;
    if tag != 0x30 {
        return None;
    }
    let after_not_before = element(validity)?.2;
    let (tag, time, _) = element(after_not_before)?;
    let text = std::str::from_utf8(time).ok()?;
    let (year, rest) = match tag {
        // UTCTime: YYMMDDHHMMSSZ, years 1950..2049 (RFC 5280 §4.1.2.5.1).
        0x17 => {
            let yy: i64 = text.get(..2)?.parse().ok()?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, text.get(2..)?)
        }
        // GeneralizedTime: YYYYMMDDHHMMSSZ.
        0x18 => (text.get(..4)?.parse().ok()?, text.get(4..)?),
        _ => return None,
    };
    if rest.len() != 11 || !rest.ends_with('Z') {
        return None;
    }
    let field = |at: usize| -> Option<i64> { rest.get(at..at + 2)?.parse().ok() };
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    let seconds = u64::try_from(seconds).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(seconds))
}

/// One DER element: its tag, its contents and what follows it.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, &b| (n << 8) | usize::from(b))
    };
    if rest.len() < length {
        return None;
    }
    let (contents, after) = rest.split_at(length);
    Some((tag, contents, after))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12;
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTls {
    pub(crate) listen: OneOrMany<String>,
    /// The default certificate chain and key: for clients whose SNI names
    /// none of `certs` (or send no SNI).
    pub(crate) cert: Option<String>,
    pub(crate) key: Option<String>,
    #[serde(default)]
    pub(crate) certs: Vec<RawTlsCert>,
}

/// `[[server.tls.certs]]`: a certificate served to clients whose SNI is one
/// of `names`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTlsCert {
    pub(crate) names: Vec<String>,
    pub(crate) cert: String,
    pub(crate) key: String,
}

/// `[server.tls]`: the listeners, and every certificate pair read and
/// checked now (see [`super::tls`]). `None` when any problem was found.
pub(super) fn check_tls(
    c: &mut Checker,
    path: &KeyPath,
    directory: &Path,
    raw: &RawTls,
) -> Option<TlsConfig> {
    use super::tls::{self, PairSpec, SniResolver};
    let count = raw.listen.0.len();
    if count == 0 {
        c.problem(path.key("listen"), "needs at least one address");
    }
    let listen: Vec<SocketAddr> = raw
        .listen
        .0
        .iter()
        .enumerate()
        .filter_map(|(i, text)| c.socket_addr(path.element("listen", count, i), text))
        .collect();
    let (Some(cert), Some(key)) = (&raw.cert, &raw.key) else {
        let missing = if raw.cert.is_none() { "cert" } else { "key" };
        c.problem(
            path.key(missing),
            format!(
                "`{missing}` is required: the default certificate chain and key, for clients whose SNI names none of [[server.tls.certs]]; write `cert = \"certs/gateway.crt\"` and `key = \"certs/gateway.key\"`"
            ),
        );
        return None;
    };
    let provider = tls::provider();
    let mut specs = vec![PairSpec {
        key: path.clone(),
        cert: directory.join(cert),
        private_key: directory.join(key),
    }];
    for (i, entry) in raw.certs.iter().enumerate() {
        specs.push(PairSpec {
            key: path.key("certs").index(i),
            cert: directory.join(&entry.cert),
            private_key: directory.join(&entry.key),
        });
    }
    let mut loaded = Vec::with_capacity(specs.len());
    let mut certificates = Vec::with_capacity(specs.len());
    for spec in &specs {
        match tls::load_pair(spec, &provider) {
            Ok((certified, not_after)) => {
                certificates.push(CertificateFile {
                    key: spec.key.key("cert").to_string(),
                    file: spec.cert.clone(),
                    not_after,
                });
                loaded.push(Some(certified));
            }
            Err((key, message)) => {
                c.problem(key, message);
                loaded.push(None);
            }
        }
    }
    let mut resolver = SniResolver::new(loaded[0].clone()?);
    for (i, entry) in raw.certs.iter().enumerate() {
        let names = path.key("certs").index(i).key("names");
        if entry.names.is_empty() {
            c.problem(
                names.clone(),
                "needs at least one name, e.g. names = [\"api.example.com\"]",
            );
        }
        for (j, name) in entry.names.iter().enumerate() {
            if !tls::valid_name(name) {
                c.problem(
                    names.index(j),
                    format!("`{name}` is not a DNS name; expected e.g. \"api.example.com\" or \"*.example.com\""),
                );
            } else if let Some(certified) = &loaded[i + 1]
                && !resolver.add(name, certified.clone())
            {
                c.problem(
                    names.index(j),
                    format!("`{name}` is already named by another certificate"),
                );
            }
        }
    }
    if loaded.iter().any(Option::is_none) || listen.len() != raw.listen.0.len() {
        return None;
    }
    match tls::server_config(provider, resolver) {
        Ok(server) => Some(TlsConfig {
            listen,
            server,
            certificates,
        }),
        Err(error) => {
            c.problem(
                path.clone(),
                format!("cannot build the TLS configuration: {error}"),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_days_match_known_dates() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
    }

    #[test]
    fn names_are_dns_names_or_one_wildcard() {
        assert!(valid_name("api.example.com"));
        assert!(valid_name("*.example.com"));
        assert!(!valid_name("*"));
        assert!(!valid_name("a..b"));
        assert!(!valid_name("a.*.b"));
        assert!(!valid_name("exa mple.com"));
    }

    #[test]
    fn not_after_refuses_what_is_not_a_certificate() {
        assert_eq!(not_after(b""), None);
        assert_eq!(not_after(&[0x30, 0x82, 0xff]), None);
        assert_eq!(not_after(&[0x30, 0x00]), None);
    }
}
