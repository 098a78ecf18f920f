//! Certificates made at test time with rcgen (none is committed): a CA, leaf
//! certificates it signs for given names, and TLS clients that trust it.

use std::path::Path;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// A certificate authority.
pub struct Ca {
    pub cert: rcgen::Certificate,
    key: KeyPair,
}

/// A leaf certificate and its key, as PEM.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Leaf {
    /// Writes `NAME.crt` and `NAME.key` into `dir`.
    pub fn write(&self, dir: &Path, name: &str) {
        std::fs::write(dir.join(format!("{name}.crt")), &self.cert_pem).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), &self.key_pem).unwrap();
    }
}

impl Ca {
    pub fn new() -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "tollgate test CA");
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A leaf for `names`, signed by this CA.
    pub fn leaf(&self, names: &[&str]) -> Leaf {
        self.leaf_with(names, |_| {})
    }

    /// A leaf for `names` whose parameters `adjust` changes (e.g. `not_after`).
    pub fn leaf_with(&self, names: &[&str], adjust: impl FnOnce(&mut CertificateParams)) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        adjust(&mut params);
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    pub fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A TLS client that trusts this CA only and offers `alpn`.
    pub fn client(&self, alpn: &[&[u8]]) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        TlsConnector::from(Arc::new(config))
    }
}

/// Connects to `addr` and shakes hands as `name` (SNI).
pub async fn connect(
    connector: &TlsConnector,
    addr: std::net::SocketAddr,
    name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let stream = TcpStream::connect(addr).await?;
    // Without it a write behind unacknowledged bytes (the Finished before
    // the first request) waits for a delayed ACK: real time, which paused
    // time skips as idle.
    stream.set_nodelay(true)?;
    let name = ServerName::try_from(name.to_owned()).unwrap();
    connector.connect(name, stream).await
}
