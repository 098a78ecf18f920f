//! `[jwt]` end to end through real sockets: bearer tokens signed by the
//! test itself (RSA RS256/PS256, EC ES256/ES384, Ed25519, HMAC; keys
//! generated at run time, none committed), with the `jsonwebtoken` crate
//! as an independent JOSE encoder, served from a JWKS file (rotated by a
//! reload) and from a JWKS URL on a local server (refreshed early on an
//! unknown `kid`, once per interval). Each refusal is checked for the
//! contract's answer — 401 problem+json with `WWW-Authenticate: Bearer
//! error="invalid_token", error_description="..."` — and for never
//! echoing the token; then claims as limit keys (`jwt:sub`, nested paths,
//! composite keys), plans and consumers from claims, on memory and on
//! Redis, the explain endpoint, and the verification metrics.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{self as ring_sig, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use rsa::pkcs1::EncodeRsaPrivateKey;
use rsa::pkcs8::EncodePublicKey;
use rsa::traits::PublicKeyParts;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use common::openmetrics::{self, Exposition};
use common::redis::Redis;
use common::{IN_PROCESS_EPOCH, InProcess, Reply, eventually, get};
use tollgate::limit::NANOS_PER_SEC;

/// The in-process gateway's clock at start, in Unix seconds: the tokens'
/// times are relative to it.
const NOW: u64 = IN_PROCESS_EPOCH / NANOS_PER_SEC;
const ISSUER: &str = "https://auth.example.test/";
const AUDIENCE: &str = "api";
/// The HMAC issuer's secret (`secret_file`).
const SECRET: &[u8] = b"a-shared-secret-of-more-than-32-bytes";

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

// ---------------------------------------------------------------- keys --

/// An RSA key pair: the private key for signing, its public JWK members.
struct RsaPair {
    /// PKCS#1 `RSAPrivateKey` (what ring and jsonwebtoken sign with).
    der: Vec<u8>,
    /// The public key as SPKI DER, for the alg-confusion secrets.
    public_der: Vec<u8>,
    n: String,
    e: String,
}

/// Two 2048-bit RSA key pairs, generated once per test binary (in
/// parallel: a couple of seconds unoptimised).
fn rsa_pairs() -> &'static [RsaPair; 2] {
    static PAIRS: OnceLock<[RsaPair; 2]> = OnceLock::new();
    PAIRS.get_or_init(|| {
        std::thread::scope(|scope| {
            let a = scope.spawn(rsa_pair);
            let b = scope.spawn(rsa_pair);
            [a.join().expect("keygen"), b.join().expect("keygen")]
        })
    })
}

fn rsa_pair() -> RsaPair {
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).expect("an RSA key");
    RsaPair {
        der: key.to_pkcs1_der().expect("PKCS#1 DER").as_bytes().to_vec(),
        public_der: key
            .to_public_key()
            .to_public_key_der()
            .expect("SPKI DER")
            .as_bytes()
            .to_vec(),
        n: b64(&key.n().to_bytes_be()),
        e: b64(&key.e().to_bytes_be()),
    }
}

/// A key that signs tokens (through jsonwebtoken) and its public JWK.
#[derive(Clone)]
struct Signer {
    kid: String,
    alg: Algorithm,
    encoding: EncodingKey,
    jwk: Value,
}

impl Signer {
    /// RSA key `index` of [`rsa_pairs`], signing with `alg` (RS256 or PS256).
    fn rsa(index: usize, kid: &str, alg: Algorithm) -> Signer {
        let pair = &rsa_pairs()[index];
        Signer {
            kid: kid.to_owned(),
            alg,
            encoding: EncodingKey::from_rsa_der(&pair.der),
            jwk: json!({"kty": "RSA", "kid": kid, "use": "sig", "n": pair.n, "e": pair.e}),
        }
    }

    /// A fresh P-256 (ES256) or P-384 (ES384) key.
    fn ec(kid: &str, alg: Algorithm) -> Signer {
        let (signing, crv, len) = match alg {
            Algorithm::ES256 => (&ring_sig::ECDSA_P256_SHA256_FIXED_SIGNING, "P-256", 32),
            _ => (&ring_sig::ECDSA_P384_SHA384_FIXED_SIGNING, "P-384", 48),
        };
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(signing, &rng).expect("an EC key");
        let pair = EcdsaKeyPair::from_pkcs8(signing, pkcs8.as_ref(), &rng).expect("EC PKCS#8");
        let point = pair.public_key().as_ref();
        let (x, y) = point[1..].split_at(len);
        Signer {
            kid: kid.to_owned(),
            alg,
            encoding: EncodingKey::from_ec_der(pkcs8.as_ref()),
            jwk: json!({"kty": "EC", "kid": kid, "crv": crv, "x": b64(x), "y": b64(y)}),
        }
    }

    /// A fresh Ed25519 (EdDSA) key.
    fn ed25519(kid: &str) -> Signer {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("an Ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("Ed25519 PKCS#8");
        Signer {
            kid: kid.to_owned(),
            alg: Algorithm::EdDSA,
            encoding: EncodingKey::from_ed_der(pkcs8.as_ref()),
            jwk: json!({"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64(pair.public_key().as_ref())}),
        }
    }

    /// The HMAC issuer's secret (no `kid`, as a `secret_file` key has none).
    fn hmac() -> Signer {
        Signer {
            kid: String::new(),
            alg: Algorithm::HS256,
            encoding: EncodingKey::from_secret(SECRET),
            jwk: Value::Null,
        }
    }

    fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, self.alg, claims)
    }

    /// Signed by this key, the header naming `kid` and `alg`.
    fn sign_as(&self, kid: &str, alg: Algorithm, claims: &Value) -> String {
        let mut header = Header::new(alg);
        header.kid = (!kid.is_empty()).then(|| kid.to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("a signed token")
    }
}

/// A JWKS document of `signers`' public keys.
fn jwks(signers: &[&Signer]) -> String {
    json!({"keys": signers.iter().map(|s| s.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

/// `token` with one character in the middle of its signature changed:
/// well-formed, and not signed by anybody.
fn tamper_signature(token: &str) -> String {
    let at = token.rfind('.').expect("a signature") + 5;
    let mut bytes = token.as_bytes().to_vec();
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).expect("ASCII")
}

/// A token with exactly this header and claims text, signed RS256 by RSA
/// key `index` with ring: for what jsonwebtoken would never write
/// (duplicate names, `crit`), validly signed so that only the parse rule
/// can refuse it.
fn rs256_raw(index: usize, header: &str, claims: &str) -> String {
    let pair = ring_sig::RsaKeyPair::from_der(&rsa_pairs()[index].der).expect("RSA key");
    let input = format!("{}.{}", b64(header.as_bytes()), b64(claims.as_bytes()));
    let mut signature = vec![0; pair.public().modulus_len()];
    pair.sign(
        &ring_sig::RSA_PKCS1_SHA256,
        &SystemRandom::new(),
        input.as_bytes(),
        &mut signature,
    )
    .expect("sign");
    format!("{input}.{}", b64(&signature))
}

/// An HS256 token of this header and claims text under `secret`.
fn hs256_raw(secret: &[u8], header: &str, claims: &str) -> String {
    let input = format!("{}.{}", b64(header.as_bytes()), b64(claims.as_bytes()));
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, input.as_bytes());
    format!("{input}.{}", b64(tag.as_ref()))
}

/// Valid claims of `sub` for [`ISSUER`] and [`AUDIENCE`] at [`NOW`].
fn claims(sub: &str) -> Value {
    claims_at(sub, NOW)
}

/// Valid claims of `sub` for a clock that reads `now` (Unix seconds).
fn claims_at(sub: &str, now: u64) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 3600})
}

/// `base` with `extra`'s members set (a `null` member removes one).
fn with(mut base: Value, extra: Value) -> Value {
    let map = base.as_object_mut().expect("claims are an object");
    for (name, value) in extra.as_object().expect("an object").clone() {
        if value.is_null() {
            map.remove(&name);
        } else {
            map.insert(name, value);
        }
    }
    base
}

// ------------------------------------------------------------ gateway --

/// The gateway in process with `config` and the `files` it names.
async fn start(files: &[(&str, &str)], config: &str) -> InProcess {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write a file");
    }
    InProcess::start_in(dir, config).await
}

/// `[server]`, then `rest`.
fn config(rest: &str) -> String {
    format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\nworkers = 1\n\n{rest}")
}

/// One `jwks = "jwks.json"` issuer and a `require_jwt` route `/private`.
fn private_route(issuer_extra: &str) -> String {
    config(&format!(
        r#"
[[jwt.issuers]]
issuer = "{ISSUER}"
jwks = "jwks.json"
audiences = ["{AUDIENCE}"]
{issuer_extra}

[[routes]]
name = "private"
match = {{ path_prefix = "/private" }}
respond = {{ status = 200, body = "ok" }}
require_jwt = true
"#
    ))
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn with_token(gateway: &InProcess, path: &str, token: &str) -> Reply {
    get(gateway.addr, path, &[("authorization", &bearer(token))]).await
}

/// A 401 for `token` saying `description`, as the contract gives it, and
/// nothing of the token in the answer.
#[track_caller]
fn assert_refused(reply: &Reply, token: &str, description: &str) {
    assert_eq!(reply.status, 401, "{description}: {:?}", reply.body);
    assert_eq!(
        reply.header("www-authenticate"),
        Some(
            format!("Bearer error=\"invalid_token\", error_description=\"{description}\"").as_str()
        ),
    );
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let body = reply.json();
    assert_eq!(body["status"], 401);
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains(description)),
        "{body}"
    );
    assert_not_echoed(reply, token);
}

/// Neither `token` nor any of its parts (longer than a few characters)
/// is in the answer's body or headers.
#[track_caller]
fn assert_not_echoed(reply: &Reply, token: &str) {
    let body = String::from_utf8_lossy(&reply.body);
    let headers: String = reply
        .headers
        .iter()
        .map(|(k, v)| format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())))
        .collect();
    let pieces = std::iter::once(token).chain(token.split('.').filter(|p| p.len() >= 8));
    for piece in pieces {
        assert!(!body.contains(piece), "the body echoes the token: {body}");
        assert!(
            !headers.contains(piece),
            "the headers echo the token: {headers}"
        );
    }
}

fn metrics(gateway: &InProcess) -> Exposition {
    openmetrics::parse(&gateway.app.metrics().encode()).expect("a valid exposition")
}

fn verifications(gateway: &InProcess, issuer: &str, result: &str) -> f64 {
    metrics(gateway).count(
        "tollgate_jwt_verifications_total",
        &[("issuer", issuer), ("result", result)],
    )
}

/// `tollgate_jwks_refreshes_total{issuer, result}`; 0 before the family's
/// first series (an empty family is not exposed; every test that reads
/// it also expects a fetch counted, so a renamed metric still fails).
fn refreshes(gateway: &InProcess, result: &str) -> f64 {
    metrics(gateway)
        .value(
            "tollgate_jwks_refreshes_total",
            &[("issuer", ISSUER), ("result", result)],
        )
        .unwrap_or(0.0)
}

// -------------------------------------------------------- JWKS server --

/// A local JWKS server: serves its current document (or a 500), counting
/// the fetches.
struct JwksServer {
    addr: SocketAddr,
    state: Arc<Mutex<Served>>,
    hits: Arc<AtomicUsize>,
    /// Answers wait for it while `Served::held`.
    release: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

struct Served {
    status: u16,
    document: String,
    cache_control: Option<&'static str>,
    /// Answers wait for [`JwksServer::release`].
    held: bool,
    /// What each fetch asked for: path and `Host`.
    asked: Vec<(String, String)>,
    /// When each fetch arrived, on the test's (paused) clock: what did not
    /// happen is read from this timeline after what did, never from a
    /// count after a paused sleep (which ends while the gateway may still
    /// be at work).
    at: Vec<tokio::time::Instant>,
}

impl JwksServer {
    async fn start(document: String) -> JwksServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(Served {
            status: 200,
            document,
            cache_control: None,
            held: false,
            asked: Vec::new(),
            at: Vec::new(),
        }));
        let hits = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::Notify::new());
        let (state2, hits2, release2) = (state.clone(), hits.clone(), release.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let (state, hits, release) = (state2.clone(), hits2.clone(), release2.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                        let (state, release) = (state.clone(), release.clone());
                        hits.fetch_add(1, Ordering::SeqCst);
                        let host = request
                            .headers()
                            .get("host")
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let held = {
                            let mut served = state.lock().unwrap();
                            served.asked.push((request.uri().to_string(), host));
                            served.at.push(tokio::time::Instant::now());
                            served.held
                        };
                        async move {
                            if held {
                                release.notified().await;
                            }
                            let served = state.lock().unwrap();
                            let mut response =
                                Response::new(Full::new(Bytes::from(served.document.clone())));
                            *response.status_mut() =
                                hyper::StatusCode::from_u16(served.status).expect("a status");
                            let headers = response.headers_mut();
                            headers.insert("content-type", "application/json".parse().unwrap());
                            if let Some(value) = served.cache_control {
                                headers.insert("cache-control", value.parse().unwrap());
                            }
                            Ok::<_, Infallible>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        JwksServer {
            addr,
            state,
            hits,
            release,
            task,
        }
    }

    /// Answers from now on wait for [`JwksServer::release`].
    fn hold(&self) {
        self.state.lock().unwrap().held = true;
    }

    /// Lets the waiting answer go, and answers at once from now on.
    fn release(&self) {
        self.state.lock().unwrap().held = false;
        self.release.notify_waiters();
    }

    fn cache_control(&self, value: &'static str) {
        self.state.lock().unwrap().cache_control = Some(value);
    }

    fn url(&self) -> String {
        format!("http://{}/.well-known/jwks.json", self.addr)
    }

    fn publish(&self, document: String) {
        self.state.lock().unwrap().document = document;
    }

    fn answer_status(&self, status: u16) {
        self.state.lock().unwrap().status = status;
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// When fetch `n` (from 0) arrived.
    fn hit_at(&self, n: usize) -> tokio::time::Instant {
        self.state.lock().unwrap().at[n]
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One `jwks_url` issuer refreshed every minute, and `/private`.
fn url_config(server: &JwksServer) -> String {
    private_route(&format!(
        "jwks_url = \"{}\"\nrefresh = \"1m\"",
        server.url()
    ))
    .replace("jwks = \"jwks.json\"\n", "")
}

/// Waits for the fetch at start to be answered.
async fn first_fetch(gateway: &InProcess, server: &JwksServer) {
    assert!(
        eventually(async || refreshes(gateway, "ok") == 1.0).await,
        "the JWKS was not fetched at start"
    );
    assert_eq!(server.hits(), 1);
}

// -------------------------------------------------------------- tests --

#[tokio::test]
async fn every_algorithm_verifies_from_a_jwks_file_and_a_secret() {
    let rs256 = Signer::rsa(0, "rsa-1", Algorithm::RS256);
    let ps256 = Signer::rsa(0, "rsa-1", Algorithm::PS256);
    let es256 = Signer::ec("ec-256", Algorithm::ES256);
    let es384 = Signer::ec("ec-384", Algorithm::ES384);
    let eddsa = Signer::ed25519("ed-1");
    let hs256 = Signer::hmac();
    let document = jwks(&[&rs256, &es256, &es384, &eddsa]);
    let gateway = start(
        &[
            ("jwks.json", &document),
            ("secret", &format!("{}\n", String::from_utf8_lossy(SECRET))),
        ],
        &private_route(
            r#"
[[jwt.issuers]]
issuer = "https://hmac.example.test/"
secret_file = "secret"
audiences = ["api"]"#,
        ),
    )
    .await;
    let hmac_claims = with(claims("h"), json!({"iss": "https://hmac.example.test/"}));
    let cases = [
        ("RS256", rs256.sign(&claims("r"))),
        ("PS256", ps256.sign(&claims("p"))),
        ("ES256", es256.sign(&claims("e"))),
        ("ES384", es384.sign(&claims("f"))),
        ("EdDSA", eddsa.sign(&claims("d"))),
        ("HS256", hs256.sign(&hmac_claims)),
    ];
    for (alg, token) in &cases {
        let reply = with_token(&gateway, "/private", token).await;
        assert_eq!(reply.status, 200, "{alg}: {:?}", reply.body);
        assert_eq!(&reply.body[..], b"ok");
        // The same header and signature over other claims: forged.
        let mut parts: Vec<&str> = token.split('.').collect();
        let other = b64(with(
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap(),
            json!({"sub": "admin"}),
        )
        .to_string()
        .as_bytes());
        parts[1] = &other;
        let forged = parts.join(".");
        assert_refused(
            &with_token(&gateway, "/private", &forged).await,
            &forged,
            "the token's signature does not verify",
        );
    }
    // A key is tried only for the algorithms of its type and curve.
    let p384_as_p256 = es384.sign_as("ec-256", Algorithm::ES384, &claims("x"));
    assert_refused(
        &with_token(&gateway, "/private", &p384_as_p256).await,
        &p384_as_p256,
        "the token's algorithm does not fit its key",
    );
    let ed_as_rsa = eddsa.sign_as("rsa-1", Algorithm::EdDSA, &claims("x"));
    assert_refused(
        &with_token(&gateway, "/private", &ed_as_rsa).await,
        &ed_as_rsa,
        "the token's algorithm does not fit its key",
    );
    // The HMAC issuer takes HS256 only; an RSA token naming it is refused.
    let rsa_for_hmac = rs256.sign(&hmac_claims);
    assert_refused(
        &with_token(&gateway, "/private", &rsa_for_hmac).await,
        &rsa_for_hmac,
        "the token's algorithm is not accepted",
    );
    gateway.stop().await;
}

#[tokio::test(start_paused = true)]
async fn times_issuer_and_audience_are_checked_within_the_leeway() {
    let key = Signer::ec("ec-1", Algorithm::ES256);
    let gateway = start(
        &[("jwks.json", &jwks(&[&key]))],
        &private_route("leeway = \"30s\""),
    )
    .await;
    let accepted = [
        // Expired 10 s ago, within the 30 s leeway.
        with(claims("a"), json!({"exp": NOW - 10})),
        // Valid from 20 s on, within the leeway.
        with(claims("b"), json!({"nbf": NOW + 20, "iat": NOW + 20})),
        // One of several audiences.
        with(claims("c"), json!({"aud": ["other", AUDIENCE]})),
    ];
    for claims in &accepted {
        let reply = with_token(&gateway, "/private", &key.sign(claims)).await;
        assert_eq!(reply.status, 200, "{claims}: {:?}", reply.body);
    }
    let refused = [
        (
            with(claims("a"), json!({"exp": NOW - 31})),
            "the token has expired",
        ),
        (
            with(claims("b"), json!({"nbf": NOW + 31})),
            "the token is not valid yet",
        ),
        (
            with(claims("c"), json!({"iat": NOW + 3000})),
            "the token was issued in the future",
        ),
        (
            with(claims("d"), json!({"iss": "https://evil.example.test/"})),
            "the token's issuer is not accepted",
        ),
        (
            with(claims("e"), json!({"iss": null})),
            "the token's issuer is not accepted",
        ),
        (
            with(claims("f"), json!({"aud": "other"})),
            "the token is not meant for this audience",
        ),
        (
            with(claims("g"), json!({"aud": null})),
            "the token is not meant for this audience",
        ),
        (
            with(claims("h"), json!({"exp": null})),
            "the token has no `exp`: it would never expire",
        ),
        (
            with(claims("i"), json!({"exp": "tomorrow"})),
            "a time claim of the token is not a number",
        ),
    ];
    for (claims, description) in &refused {
        let token = key.sign(claims);
        assert_refused(
            &with_token(&gateway, "/private", &token).await,
            &token,
            description,
        );
    }
    // A token that expires while it is cached stops working then.
    let short = key.sign(&with(claims("s"), json!({"exp": NOW + 60})));
    assert_eq!(with_token(&gateway, "/private", &short).await.status, 200);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_refused(
        &with_token(&gateway, "/private", &short).await,
        &short,
        "the token has expired",
    );
    gateway.stop().await;
}

#[tokio::test]
async fn forged_and_malformed_tokens_are_refused_and_never_echoed() {
    let log = common::log::capture_json();
    let rsa = Signer::rsa(0, "rsa-1", Algorithm::RS256);
    let document = jwks(&[&rsa]);
    // A second issuer over the same keys that also accepts HS256: the
    // alg-confusion attack's best case.
    let gateway = start(
        &[("jwks.json", &document)],
        &private_route(
            r#"
[[jwt.issuers]]
issuer = "https://lenient.example.test/"
jwks = "jwks.json"
algorithms = ["RS256", "HS256"]"#,
        ),
    )
    .await;
    let good = claims("mallory");
    let good_text = good.to_string();
    let lenient = with(
        claims("mallory"),
        json!({"iss": "https://lenient.example.test/"}),
    );
    let pair = &rsa_pairs()[0];
    let mut cases: Vec<(String, &str)> = Vec::new();
    // `alg: none`, with and without a signature.
    for signature in ["", "c2ln"] {
        cases.push((
            format!(
                "{}.{}.{signature}",
                b64(br#"{"alg":"none","typ":"JWT"}"#),
                b64(good_text.as_bytes())
            ),
            "unsigned tokens are not accepted",
        ));
    }
    cases.push((
        format!(
            "{}.{}.c2ln",
            b64(br#"{"alg":"None"}"#),
            b64(good_text.as_bytes())
        ),
        "the token's algorithm is not supported",
    ));
    // Alg confusion: HS256 "signed" with the RSA public key as the secret
    // (its JWK text, its SPKI DER, its modulus), naming the RSA key's kid.
    let secrets: [Vec<u8>; 3] = [
        rsa.jwk.to_string().into_bytes(),
        pair.public_der.clone(),
        URL_SAFE_NO_PAD.decode(&pair.n).unwrap(),
    ];
    for secret in &secrets {
        let header = r#"{"alg":"HS256","typ":"JWT","kid":"rsa-1"}"#;
        cases.push((
            hs256_raw(secret, header, &good_text),
            "the token's algorithm is not accepted",
        ));
        cases.push((
            hs256_raw(secret, header, &lenient.to_string()),
            "the token's algorithm does not fit its key",
        ));
    }
    // Without a kid, no RSA key is ever an HMAC secret either.
    cases.push((
        hs256_raw(&secrets[0], r#"{"alg":"HS256"}"#, &lenient.to_string()),
        "the token's signing key is not known",
    ));
    let signed = rsa.sign(&good);
    let parts: Vec<&str> = signed.split('.').collect();
    // Malformed base64: a character outside base64url, padding, stray bits.
    cases.push((
        format!("{}.{}*.{}", parts[0], parts[1], parts[2]),
        "a part of the token is not base64url",
    ));
    cases.push((
        format!("{}=.{}.{}", parts[0], parts[1], parts[2]),
        "a part of the token is not base64url",
    ));
    cases.push((
        format!("{}.e31.{}", parts[0], parts[2]),
        "a part of the token is not base64url",
    ));
    // Malformed JSON, validly signed: cut short, not an object, trailing
    // bytes, and a claim named twice (the second `sub` would win in a
    // lenient reader).
    let header = r#"{"alg":"RS256","kid":"rsa-1"}"#;
    let duplicate = good_text.replacen('{', r#"{"sub":"admin","#, 1);
    for claims in [
        &good_text[..good_text.len() - 1],
        "[1,2]",
        &format!("{good_text} x"),
        &duplicate,
    ] {
        cases.push((
            rs256_raw(0, header, claims),
            "a part of the token is not a JSON object",
        ));
    }
    cases.push((
        rs256_raw(
            0,
            r#"{"alg":"RS256","alg":"HS256","kid":"rsa-1"}"#,
            &good_text,
        ),
        "a part of the token is not a JSON object",
    ));
    cases.push((
        rs256_raw(0, r#"{"kid":"rsa-1"}"#, &good_text),
        "the token's header names no algorithm",
    ));
    // An extension the gateway cannot honour.
    cases.push((
        rs256_raw(
            0,
            r#"{"alg":"RS256","kid":"rsa-1","crit":["exp"]}"#,
            &good_text,
        ),
        "the token names critical header extensions",
    ));
    // Oversized: a validly signed token above 8 KiB.
    let big = rsa.sign(&with(
        claims("mallory"),
        json!({"pad": "x".repeat(8 * 1024)}),
    ));
    assert!(big.len() > 8 * 1024);
    cases.push((big, "the token is too large"));
    cases.push((
        format!("{}.{}", parts[0], parts[1]),
        "a token has three dot-separated parts",
    ));
    cases.push((
        format!("{signed}.{}", parts[2]),
        "a token has three dot-separated parts",
    ));
    cases.push((
        format!("{}.{}.", parts[0], parts[1]),
        "the token has no signature",
    ));
    cases.push((
        rsa.sign_as("rsa-9", Algorithm::RS256, &good),
        "the token's signing key is not known",
    ));
    for (token, description) in &cases {
        assert_refused(
            &with_token(&gateway, "/private", token).await,
            token,
            description,
        );
    }
    // The real token passes, and the gateway is still serving.
    assert_eq!(with_token(&gateway, "/private", &signed).await.status, 200);
    let text = log.text();
    for (token, _) in &cases {
        assert!(
            !text.contains(token.as_str()),
            "the log has a token: {text}"
        );
    }
    gateway.stop().await;
}

#[tokio::test]
async fn a_request_without_a_token_gets_the_bare_challenge() {
    let key = Signer::ed25519("ed-1");
    let gateway = start(&[("jwks.json", &jwks(&[&key]))], &private_route("")).await;
    for headers in [
        vec![],
        vec![("authorization", "Basic dXNlcjpwYXNz")],
        vec![("authorization", "Bearer ")],
        vec![("x-api-key", "k-1")],
    ] {
        let reply = get(gateway.addr, "/private", &headers).await;
        assert_eq!(reply.status, 401, "{headers:?}");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
        assert_eq!(
            reply.header("content-type"),
            Some("application/problem+json")
        );
    }
    // The scheme is case-insensitive (RFC 9110 §11.1).
    let token = key.sign(&claims("u"));
    let reply = get(
        gateway.addr,
        "/private",
        &[("authorization", &format!("bearer {token}"))],
    )
    .await;
    assert_eq!(reply.status, 200);
    gateway.stop().await;
}

#[tokio::test]
async fn without_require_jwt_an_invalid_token_is_no_token() {
    let key = Signer::ec("ec-1", Algorithm::ES256);
    let gateway = start(
        &[("jwks.json", &jwks(&[&key]))],
        &config(&format!(
            r#"
[[jwt.issuers]]
issuer = "{ISSUER}"
jwks = "jwks.json"

[limits.user_or_deny]
key = "jwt:sub"
algorithm = "token_bucket"
capacity = 5
refill = "1/h"
on_missing_key = "deny"

[limits.user_or_shared]
key = "jwt:sub"
algorithm = "token_bucket"
capacity = 2
refill = "1/h"
on_missing_key = "shared"

[[routes]]
name = "deny"
match = {{ path = "/deny" }}
respond = {{ status = 200, body = "ok" }}
limits = ["user_or_deny"]

[[routes]]
name = "shared"
match = {{ path = "/shared" }}
respond = {{ status = 200, body = "ok" }}
limits = ["user_or_shared"]

[[routes]]
name = "open"
match = {{ path = "/open" }}
respond = {{ status = 200, body = "ok" }}
"#
        )),
    )
    .await;
    let valid = key.sign(&claims("alice"));
    let expired = key.sign(&with(claims("bob"), json!({"exp": NOW - 3600})));
    let forged = tamper_signature(&valid);
    assert_eq!(with_token(&gateway, "/deny", &valid).await.status, 200);
    for token in [&expired, &forged, &"not-a-token".to_owned()] {
        let reply = with_token(&gateway, "/deny", token).await;
        assert_eq!(reply.status, 400, "the limit's on_missing_key decides");
        assert_eq!(reply.header("www-authenticate"), None);
        assert!(
            reply.json()["detail"]
                .as_str()
                .is_some_and(|d| d.contains("user_or_deny")),
            "{:?}",
            reply.body
        );
        assert_not_echoed(&reply, token);
        // A route without limits serves it.
        assert_eq!(with_token(&gateway, "/open", token).await.status, 200);
    }
    // Invalid tokens and no token share the one shared key.
    assert_eq!(with_token(&gateway, "/shared", &expired).await.status, 200);
    assert_eq!(get(gateway.addr, "/shared", &[]).await.status, 200);
    assert_eq!(with_token(&gateway, "/shared", &forged).await.status, 429);
    assert_eq!(with_token(&gateway, "/shared", &valid).await.status, 200);
    gateway.stop().await;
}

const PER_USER: &str = r#"
[limits.per_user]
key = "jwt:sub"
algorithm = "token_bucket"
capacity = 2
refill = "1/h"
on_missing_key = "deny"

[[routes]]
name = "api"
match = { path_prefix = "/api" }
respond = { status = 200, body = "ok" }
limits = ["per_user"]
require_jwt = true
"#;

fn per_user_config() -> String {
    config(&format!(
        "[[jwt.issuers]]\nissuer = \"{ISSUER}\"\njwks = \"jwks.json\"\naudiences = [\"{AUDIENCE}\"]\n{PER_USER}"
    ))
}

#[tokio::test]
async fn per_user_budgets_from_sub_are_explained_on_the_admin_listener() {
    let key = Signer::rsa(1, "rsa-2", Algorithm::PS256);
    let gateway = start(&[("jwks.json", &jwks(&[&key]))], &per_user_config()).await;
    let alice = key.sign(&claims("alice"));
    // Another token of alice's (issued a second later): the same user.
    let alice_again = key.sign(&with(claims("alice"), json!({"iat": NOW - 1, "jti": "2"})));
    assert_ne!(alice, alice_again);
    let bob = key.sign(&claims("bob"));
    let first = with_token(&gateway, "/api", &alice).await;
    assert_eq!(first.status, 200);
    assert!(
        first
            .header("ratelimit")
            .is_some_and(|v| v.starts_with("\"per_user\";r=1;")),
        "{:?}",
        first.headers
    );
    assert_eq!(with_token(&gateway, "/api", &alice_again).await.status, 200);
    let denied = with_token(&gateway, "/api", &alice).await;
    assert_eq!(denied.status, 429, "alice's two tokens share one budget");
    assert_not_echoed(&denied, &alice);
    assert_eq!(with_token(&gateway, "/api", &alice_again).await.status, 429);
    assert_eq!(with_token(&gateway, "/api", &bob).await.status, 200);

    let admin = gateway.admin.expect("an admin listener");
    let explain = async |query: &str| get(admin, &format!("/limits/per_user?{query}"), &[]).await;
    let of_alice = explain("key=alice").await;
    assert_eq!(of_alice.status, 200, "{:?}", of_alice.body);
    let of_alice = of_alice.json();
    assert_eq!(of_alice["key"], "jwt:sub");
    assert_eq!(of_alice["remaining"], 0);
    assert_eq!(explain("key=bob").await.json()["remaining"], 1);
    assert_eq!(explain("key=carol").await.json()["remaining"], 2);
    assert_eq!(explain("").await.status, 400);
    // Explaining charged nothing.
    assert_eq!(with_token(&gateway, "/api", &bob).await.status, 200);
    assert_eq!(with_token(&gateway, "/api", &bob).await.status, 429);
    gateway.stop().await;
}

#[tokio::test]
async fn nested_claims_and_composite_keys() {
    let key = Signer::ec("ec-1", Algorithm::ES384);
    let gateway = start(
        &[("jwks.json", &jwks(&[&key]))],
        &config(&format!(
            r#"
[[jwt.issuers]]
issuer = "{ISSUER}"
jwks = "jwks.json"

[limits.per_org]
key = "jwt:org.id"
algorithm = "fixed_window"
limit = 2
window = "1d"
align = "first_request"
on_missing_key = "deny"

[limits.per_user_device]
key = ["jwt:sub", "header:x-device"]
algorithm = "fixed_window"
limit = 1
window = "1d"
align = "first_request"

[[routes]]
name = "org"
match = {{ path = "/org" }}
respond = {{ status = 200, body = "ok" }}
limits = ["per_org"]

[[routes]]
name = "device"
match = {{ path = "/device" }}
respond = {{ status = 200, body = "ok" }}
limits = ["per_user_device"]
"#
        )),
    )
    .await;
    let member = |sub: &str, org: Value| key.sign(&with(claims(sub), json!({ "org": org })));
    let alice = member("alice", json!({"id": "acme", "name": "Acme"}));
    let bob = member("bob", json!({"id": "acme"}));
    let carol = member("carol", json!({"id": "acme"}));
    let dave = member("dave", json!({"id": 42}));
    assert_eq!(with_token(&gateway, "/org", &alice).await.status, 200);
    assert_eq!(with_token(&gateway, "/org", &bob).await.status, 200);
    assert_eq!(
        with_token(&gateway, "/org", &carol).await.status,
        429,
        "acme's members share its budget"
    );
    assert_eq!(with_token(&gateway, "/org", &dave).await.status, 200);
    // A numeric id is its JSON text: the explain endpoint names it so.
    let admin = gateway.admin.unwrap();
    let explained = get(admin, "/limits/per_org?key=42", &[]).await.json();
    assert_eq!(explained["remaining"], 1, "{explained}");
    // No `org.id`: the limit's on_missing_key (deny) decides.
    for org in [json!("acme"), json!({"name": "Acme"}), json!({"id": null})] {
        let reply = with_token(&gateway, "/org", &member("erin", org)).await;
        assert_eq!(reply.status, 400);
    }
    let one = async |token: &str, device: &str| {
        get(
            gateway.addr,
            "/device",
            &[("authorization", &bearer(token)), ("x-device", device)],
        )
        .await
        .status
    };
    assert_eq!(one(&alice, "phone").await, 200);
    assert_eq!(one(&alice, "phone").await, 429);
    assert_eq!(one(&alice, "laptop").await, 200);
    assert_eq!(one(&bob, "phone").await, 200);
    gateway.stop().await;
}

#[tokio::test]
async fn plans_consumers_and_tenants_come_from_claims() {
    let key = Signer::ed25519("ed-1");
    let gateway = start(
        &[("jwks.json", &jwks(&[&key]))],
        &config(&format!(
            r#"
[[jwt.issuers]]
issuer = "{ISSUER}"
jwks = "jwks.json"
plan_claim = "plan"

[[jwt.issuers]]
issuer = "https://consumers.example.test/"
jwks = "jwks.json"
consumer_claim = "sub"
tenant_claim = "org"
plan_claim = "tier"

[limits.per_user]
key = "jwt:sub"
algorithm = "token_bucket"
capacity = 2
refill = "1/h"
plans = {{ pro = {{ capacity = 4 }} }}

[limits.per_consumer]
key = "consumer"
algorithm = "token_bucket"
capacity = 1
refill = "1/h"
plans = {{ pro = {{ capacity = 3 }} }}

[limits.per_tenant]
key = "tenant"
algorithm = "token_bucket"
capacity = 100
refill = "1/h"

[[routes]]
name = "user"
match = {{ path = "/user" }}
respond = {{ status = 200, body = "ok" }}
limits = ["per_user"]

[[routes]]
name = "consumer"
match = {{ path = "/consumer" }}
respond = {{ status = 200, body = "ok" }}
limits = ["per_consumer", "per_tenant"]
require_consumer = true
"#
        )),
    )
    .await;
    // plan_claim alone (no consumer_claim): the plan still picks the quota.
    let quota_of = async |token: &str, path: &str| {
        let mut admitted = 0;
        for _ in 0..10 {
            let reply = with_token(&gateway, path, token).await;
            if reply.status != 200 {
                assert_eq!(reply.status, 429, "{:?}", reply.body);
                break;
            }
            admitted += 1;
        }
        admitted
    };
    let pro = key.sign(&with(claims("paula"), json!({"plan": "pro"})));
    let policy = with_token(&gateway, "/user", &pro).await;
    assert_eq!(
        policy.header("ratelimit-policy"),
        Some("\"per_user\";q=4;w=14400")
    );
    assert_eq!(
        1 + quota_of(&pro, "/user").await,
        4,
        "the pro plan's capacity"
    );
    let free = key.sign(&with(claims("fred"), json!({"plan": "free"})));
    assert_eq!(
        quota_of(&free, "/user").await,
        2,
        "an unknown plan: the default"
    );
    let none = key.sign(&claims("nina"));
    assert_eq!(quota_of(&none, "/user").await, 2);

    // consumer_claim names the consumer that `key = "consumer"` counts,
    // and satisfies `require_consumer`; tenant and plan follow it.
    let consumer = |sub: &str, org: &str, tier: Option<&str>| {
        let mut claims = with(
            claims(sub),
            json!({"iss": "https://consumers.example.test/", "org": org}),
        );
        if let Some(tier) = tier {
            claims = with(claims, json!({ "tier": tier }));
        }
        key.sign(&claims)
    };
    assert_eq!(
        quota_of(&consumer("c-1", "t-1", None), "/consumer").await,
        1
    );
    assert_eq!(
        quota_of(&consumer("c-1", "t-1", Some("pro")), "/consumer").await,
        3,
        "c-1 on the pro plan: counted in that plan's state, at its capacity"
    );
    assert_eq!(
        quota_of(&consumer("c-2", "t-1", Some("pro")), "/consumer").await,
        3
    );
    // No consumer claim: `require_consumer` refuses as without a key.
    let reply = with_token(&gateway, "/consumer", &none).await;
    assert_eq!(reply.status, 401);
    assert_eq!(
        reply.header("www-authenticate"),
        None,
        "not a token's fault"
    );
    let admin = gateway.admin.unwrap();
    let tenant = get(admin, "/limits/per_tenant?key=t-1", &[]).await.json();
    // 1 + 3 + 3 admitted for t-1's consumers; the denied ones charged nothing.
    assert_eq!(tenant["remaining"], 93, "{tenant}");
    gateway.stop().await;
}

#[tokio::test]
async fn tokens_from_a_configured_header_or_cookie() {
    let key = Signer::rsa(0, "rsa-1", Algorithm::RS256);
    let document = jwks(&[&key]);
    let token = key.sign(&claims("u"));
    let header_config = private_route("").replace(
        "[[jwt.issuers]]",
        "[jwt]\nheader = \"x-token\"\n\n[[jwt.issuers]]",
    );
    let gateway = start(&[("jwks.json", &document)], &header_config).await;
    let reply = get(gateway.addr, "/private", &[("x-token", &token)]).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    // Only the configured place is read.
    let reply = with_token(&gateway, "/private", &token).await;
    assert_eq!(reply.status, 401);
    assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    let expired = key.sign(&with(claims("u"), json!({"exp": NOW - 3600})));
    let reply = get(gateway.addr, "/private", &[("x-token", &expired)]).await;
    assert_refused(&reply, &expired, "the token has expired");
    gateway.stop().await;

    let cookie_config = private_route("cookie = \"session\"");
    let gateway = start(&[("jwks.json", &document)], &cookie_config).await;
    let cookies = format!("theme=dark; session={token}; lang=en");
    let reply = get(gateway.addr, "/private", &[("cookie", &cookies)]).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let reply = get(
        gateway.addr,
        "/private",
        &[("cookie", &format!("session={expired}"))],
    )
    .await;
    assert_refused(&reply, &expired, "the token has expired");
    let reply = get(
        gateway.addr,
        "/private",
        &[("cookie", &format!("other={token}"))],
    )
    .await;
    assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    gateway.stop().await;
}

#[tokio::test]
async fn a_jwks_file_is_rotated_by_a_reload_and_a_bad_one_keeps_the_old_keys() {
    let old = Signer::rsa(0, "rsa-1", Algorithm::RS256);
    let new = Signer::rsa(1, "rsa-2", Algorithm::RS256);
    let gateway = start(&[("jwks.json", &jwks(&[&old]))], &private_route("")).await;
    let jwks_path = gateway.dir.path().join("jwks.json");
    let old_token = old.sign(&claims("u"));
    let new_token = new.sign(&claims("u"));
    assert_eq!(
        with_token(&gateway, "/private", &old_token).await.status,
        200
    );
    assert_refused(
        &with_token(&gateway, "/private", &new_token).await,
        &new_token,
        "the token's signing key is not known",
    );
    std::fs::write(&jwks_path, jwks(&[&new])).unwrap();
    assert_eq!(gateway.reload(), 2);
    assert_eq!(
        with_token(&gateway, "/private", &new_token).await.status,
        200
    );
    assert_refused(
        &with_token(&gateway, "/private", &old_token).await,
        &old_token,
        "the token's signing key is not known",
    );
    // Not JSON, no usable key, no file: the reload fails, the keys stay.
    let small_rsa =
        json!({"keys": [{"kty": "RSA", "kid": "rsa-2", "n": b64(&[0xc5; 128]), "e": "AQAB"}]});
    for bad in [Some("{\"keys\": ["), Some(&small_rsa.to_string()[..]), None] {
        match bad {
            Some(text) => std::fs::write(&jwks_path, text).unwrap(),
            None => std::fs::remove_file(&jwks_path).unwrap(),
        }
        assert_eq!(gateway.reload(), 2, "{bad:?}");
        assert_eq!(
            with_token(&gateway, "/private", &new_token).await.status,
            200
        );
        assert_eq!(
            with_token(&gateway, "/private", &old_token).await.status,
            401
        );
    }
    assert_eq!(
        metrics(&gateway).count("tollgate_config_reloads_total", &[("result", "error")]),
        3.0
    );
    let status = get(gateway.admin.unwrap(), "/config", &[]).await.json();
    assert!(
        status["last_error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("jwks")),
        "{status}"
    );
    gateway.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unknown_kid_refreshes_a_jwks_url_once_per_interval() {
    let key = Signer::ec("ec-1", Algorithm::ES256);
    let stranger = Signer::ec("ghost", Algorithm::ES256);
    let server = JwksServer::start(jwks(&[&key])).await;
    let gateway = start(&[], &url_config(&server)).await;
    first_fetch(&gateway, &server).await;
    {
        let served = server.state.lock().unwrap();
        assert_eq!(served.asked[0].0, "/.well-known/jwks.json");
        assert_eq!(served.asked[0].1, server.addr.to_string());
    }
    let valid = key.sign(&claims("u"));
    assert_eq!(with_token(&gateway, "/private", &valid).await.status, 200);
    assert_eq!(server.hits(), 1);
    // An unknown kid: one early refresh, and still unknown.
    let ghost = stranger.sign(&claims("u"));
    assert_refused(
        &with_token(&gateway, "/private", &ghost).await,
        &ghost,
        "the token's signing key is not known",
    );
    assert_eq!(server.hits(), 2, "one early refresh");
    assert_eq!(refreshes(&gateway, "ok"), 2.0);
    // Within the interval, more unknown kids cost the issuer nothing.
    for kid in ["ghost", "ghost-2", "ghost-3"] {
        let token = stranger.sign_as(kid, Algorithm::ES256, &claims("u"));
        assert_refused(
            &with_token(&gateway, "/private", &token).await,
            &token,
            "the token's signing key is not known",
        );
    }
    assert_eq!(server.hits(), 2);
    // Other refusals never ask for keys.
    let expired = key.sign(&with(claims("u"), json!({"exp": NOW - 3600})));
    assert_eq!(with_token(&gateway, "/private", &expired).await.status, 401);
    assert_eq!(server.hits(), 2);
    // A minute on, the background refresh; then an early one is granted again.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(eventually(async || server.hits() == 3).await);
    assert_refused(
        &with_token(&gateway, "/private", &ghost).await,
        &ghost,
        "the token's signing key is not known",
    );
    assert_eq!(server.hits(), 4);
    assert_eq!(refreshes(&gateway, "ok"), 4.0);
    assert_eq!(refreshes(&gateway, "error"), 0.0);
    assert_eq!(with_token(&gateway, "/private", &valid).await.status, 200);
    gateway.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_key_published_at_the_jwks_url_is_fetched_for_its_first_token() {
    let old = Signer::rsa(0, "rsa-1", Algorithm::RS256);
    let new = Signer::ec("ec-2", Algorithm::ES256);
    let server = JwksServer::start(jwks(&[&old])).await;
    let gateway = start(&[], &url_config(&server)).await;
    first_fetch(&gateway, &server).await;
    let old_token = old.sign(&claims("u"));
    assert_eq!(
        with_token(&gateway, "/private", &old_token).await.status,
        200
    );
    // The issuer rotates: the new key in, the old one out.
    server.publish(jwks(&[&new]));
    let new_token = new.sign(&claims("u"));
    let reply = with_token(&gateway, "/private", &new_token).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(server.hits(), 2);
    // The old key went with the refresh (the cache is only for tokens
    // verified again with the keys as they are: a new token of the old key).
    let old_again = old.sign(&claims("v"));
    assert_refused(
        &with_token(&gateway, "/private", &old_again).await,
        &old_again,
        "the token's signing key is not known",
    );
    assert_eq!(server.hits(), 2);
    // A reload keeps the URL's keys and its fetcher: no fetch, same keys.
    std::fs::write(
        &gateway.config_path,
        url_config(&server).replace("name = \"private\"", "name = \"private2\""),
    )
    .unwrap();
    assert_eq!(gateway.reload(), 2);
    assert_eq!(
        with_token(&gateway, "/private", &new_token).await.status,
        200
    );
    assert_eq!(server.hits(), 2, "the reload fetched nothing");
    // Another `refresh`: a new fetcher (its first fetch), the old one stopped.
    std::fs::write(
        &gateway.config_path,
        url_config(&server).replace("refresh = \"1m\"", "refresh = \"2m\""),
    )
    .unwrap();
    assert_eq!(gateway.reload(), 3);
    let reply = with_token(&gateway, "/private", &new.sign(&claims("w"))).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(server.hits(), 3);
    // The next fetch is the new fetcher's, 2 minutes on: the 1m fetcher,
    // stopped, made none a minute on.
    tokio::time::sleep(Duration::from_secs(125)).await;
    assert!(eventually(async || server.hits() >= 4).await);
    let interval = server.hit_at(3) - server.hit_at(2);
    assert!(
        interval >= Duration::from_secs(120),
        "a fetch {interval:?} after the reload: the 1m fetcher was not stopped"
    );
    gateway.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_jwks_url_keeps_the_last_keys_and_is_counted() {
    let key = Signer::ec("ec-1", Algorithm::ES384);
    let server = JwksServer::start(jwks(&[&key])).await;
    let gateway = start(&[], &url_config(&server)).await;
    first_fetch(&gateway, &server).await;
    let token = key.sign(&claims("u"));
    assert_eq!(with_token(&gateway, "/private", &token).await.status, 200);
    server.answer_status(500);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(eventually(async || refreshes(&gateway, "error") >= 1.0).await);
    server.answer_status(200);
    server.publish("{\"keys\": \"none\"}".to_owned());
    assert!(eventually(async || refreshes(&gateway, "error") >= 2.0).await);
    // A new token of the same key: verified with the last good keys.
    let fresh = key.sign(&claims("v"));
    assert_eq!(with_token(&gateway, "/private", &fresh).await.status, 200);
    // The server comes back: the retries (1 s, doubling) find it.
    server.publish(jwks(&[&key]));
    assert!(eventually(async || refreshes(&gateway, "ok") >= 2.0).await);
    assert_eq!(refreshes(&gateway, "ok"), 2.0);
    gateway.stop().await;
}

#[tokio::test(start_paused = true)]
async fn tokens_that_arrive_before_the_first_fetch_wait_for_it_and_spend_no_early_refresh() {
    let key = Signer::ec("ec-1", Algorithm::ES256);
    let rotated = Signer::ed25519("ed-2");
    let server = JwksServer::start(jwks(&[&key])).await;
    server.hold();
    let gateway = start(&[], &url_config(&server)).await;
    // The fetch at start is at the server, unanswered; a token arrives.
    assert!(eventually(async || server.hits() == 1).await);
    let token = key.sign(&claims("u"));
    let addr = gateway.addr;
    let early =
        tokio::spawn(
            async move { get(addr, "/private", &[("authorization", &bearer(&token))]).await },
        );
    let unknown_key = |gateway: &InProcess| {
        metrics(gateway).value(
            "tollgate_jwt_verifications_total",
            &[("issuer", ISSUER), ("result", "unknown_key")],
        )
    };
    assert!(eventually(async || unknown_key(&gateway) == Some(1.0)).await);
    server.release();
    let reply = early.await.expect("the request");
    assert_eq!(
        reply.status, 200,
        "it waited for the keys: {:?}",
        reply.body
    );
    // The first fetch served it, and this interval's early refresh is
    // still there for a rotation: the second fetch is the rotation's (no
    // fetch came between the first one and the rotated token).
    server.publish(jwks(&[&key, &rotated]));
    let asked = tokio::time::Instant::now();
    let reply = with_token(&gateway, "/private", &rotated.sign(&claims("v"))).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(server.hits(), 2);
    assert!(
        server.hit_at(1) >= asked,
        "a second fetch before the rotated token, {:?} after the first",
        server.hit_at(1) - server.hit_at(0)
    );
    gateway.stop().await;
}

#[tokio::test(start_paused = true)]
async fn two_issuers_of_one_jwks_url_with_different_refreshes_both_verify() {
    let key = Signer::ec("ec-1", Algorithm::ES256);
    let server = JwksServer::start(jwks(&[&key])).await;
    let other = "https://other.example.test/";
    let config = url_config(&server).replace(
        "[[routes]]",
        &format!(
            "[[jwt.issuers]]\nissuer = \"{other}\"\njwks_url = \"{}\"\nrefresh = \"2m\"\n\n[[routes]]",
            server.url()
        ),
    );
    let gateway = start(&[], &config).await;
    let first = key.sign(&claims("u"));
    let second = key.sign(&with(claims("u"), json!({"iss": other, "aud": null})));
    for round in 0..2 {
        for token in [&first, &second] {
            let reply = with_token(&gateway, "/private", token).await;
            assert_eq!(reply.status, 200, "round {round}: {:?}", reply.body);
        }
        // A reload changes nothing: each issuer keeps its keys.
        assert_eq!(gateway.reload(), 2 + round);
    }
    gateway.stop().await;
}

#[tokio::test(start_paused = true)]
async fn cache_control_max_age_shortens_the_refresh_interval() {
    let key = Signer::ec("ec-1", Algorithm::ES256);
    let server = JwksServer::start(jwks(&[&key])).await;
    server.cache_control("public, max-age=20");
    let gateway = start(&[], &url_config(&server)).await;
    first_fetch(&gateway, &server).await;
    // The intervals are read from when the fetches arrived: the next one
    // after max-age (20 s), well before `refresh` (1 m).
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert!(
        eventually(async || server.hits() >= 2).await,
        "refreshed after max-age, before `refresh`"
    );
    let interval = |n: usize| server.hit_at(n) - server.hit_at(n - 1);
    assert!(
        (Duration::from_secs(20)..Duration::from_secs(60)).contains(&interval(1)),
        "{:?}",
        interval(1)
    );
    // Never more often than every 10 s, whatever the issuer says: the
    // second answer still said 20 s, the third says 0.
    server.cache_control("max-age=0");
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert!(eventually(async || server.hits() >= 3).await);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(eventually(async || server.hits() >= 4).await);
    assert!(interval(2) >= Duration::from_secs(20), "{:?}", interval(2));
    assert!(
        (Duration::from_secs(10)..Duration::from_secs(20)).contains(&interval(3)),
        "max-age=0 is 10 s: {:?}",
        interval(3)
    );
    gateway.stop().await;
}

#[tokio::test]
async fn forward_auth_answers_a_require_jwt_route_as_the_proxy_does() {
    let key = Signer::rsa(1, "rsa-2", Algorithm::RS256);
    let gateway = start(
        &[("jwks.json", &jwks(&[&key]))],
        &private_route("").replace(
            "[[jwt.issuers]]",
            "[decision]\nlisten = \"127.0.0.1:0\"\n\n[[jwt.issuers]]",
        ),
    )
    .await;
    let auth = gateway.decision.expect("a decision listener");
    let ask = async |token: &str| {
        get(
            auth,
            "/auth",
            &[
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/private/x"),
                ("x-forwarded-host", "api.example"),
                ("authorization", &bearer(token)),
            ],
        )
        .await
    };
    assert_eq!(ask(&key.sign(&claims("u"))).await.status, 200);
    let expired = key.sign(&with(claims("u"), json!({"exp": NOW - 3600})));
    assert_refused(&ask(&expired).await, &expired, "the token has expired");
    gateway.stop().await;
}

#[tokio::test(start_paused = true)]
async fn verifications_are_counted_once_per_token_and_by_result() {
    let key = Signer::rsa(0, "rsa-1", Algorithm::RS256);
    let gateway = start(&[("jwks.json", &jwks(&[&key]))], &private_route("")).await;
    let valid = key.sign(&claims("u"));
    for _ in 0..3 {
        assert_eq!(with_token(&gateway, "/private", &valid).await.status, 200);
    }
    let other = key.sign(&claims("w"));
    assert_eq!(with_token(&gateway, "/private", &other).await.status, 200);
    let refused = [
        (
            key.sign(&with(claims("u"), json!({"exp": NOW - 3600}))),
            "expired",
        ),
        (
            key.sign(&with(claims("u"), json!({"nbf": NOW + 3600}))),
            "not_yet_valid",
        ),
        (
            key.sign(&with(claims("u"), json!({"aud": "x"}))),
            "wrong_audience",
        ),
        (
            key.sign_as("rsa-9", Algorithm::RS256, &claims("u")),
            "unknown_key",
        ),
        (tamper_signature(&valid), "bad_signature"),
        ("a.b.c".to_owned(), "malformed"),
    ];
    // Each request with these is verified, and counted, except that a
    // signed token refused for claims that will not change (expired,
    // another audience) is kept refused for a minute.
    for (token, _) in &refused {
        for _ in 0..2 {
            assert_eq!(with_token(&gateway, "/private", token).await.status, 401);
        }
    }
    let foreign = key.sign(&with(
        claims("u"),
        json!({"iss": "https://elsewhere.test/"}),
    ));
    assert_eq!(with_token(&gateway, "/private", &foreign).await.status, 401);
    assert_eq!(verifications(&gateway, ISSUER, "valid"), 2.0);
    assert_eq!(verifications(&gateway, ISSUER, "expired"), 1.0);
    assert_eq!(verifications(&gateway, ISSUER, "not_yet_valid"), 2.0);
    assert_eq!(verifications(&gateway, ISSUER, "wrong_audience"), 1.0);
    assert_eq!(verifications(&gateway, ISSUER, "unknown_key"), 2.0);
    assert_eq!(verifications(&gateway, ISSUER, "bad_signature"), 2.0);
    assert_eq!(verifications(&gateway, "none", "malformed"), 2.0);
    assert_eq!(verifications(&gateway, "none", "wrong_issuer"), 1.0);
    // The exposition on the admin listener has them, and no token.
    let text = get(gateway.admin.unwrap(), "/metrics", &[]).await;
    let text = String::from_utf8_lossy(&text.body).into_owned();
    assert!(
        text.contains(&format!(
            "tollgate_jwt_verifications_total{{issuer=\"{ISSUER}\",result=\"valid\"}} 2"
        )),
        "{text}"
    );
    assert!(!text.contains(&valid[..20]));
    // A minute on, the kept refusals are verified again; the valid token
    // is still cached.
    tokio::time::sleep(Duration::from_secs(61)).await;
    for (token, _) in &refused[..3] {
        assert_eq!(with_token(&gateway, "/private", token).await.status, 401);
    }
    assert_eq!(with_token(&gateway, "/private", &valid).await.status, 200);
    assert_eq!(verifications(&gateway, ISSUER, "expired"), 2.0);
    assert_eq!(verifications(&gateway, ISSUER, "not_yet_valid"), 3.0);
    assert_eq!(verifications(&gateway, ISSUER, "wrong_audience"), 2.0);
    assert_eq!(verifications(&gateway, ISSUER, "valid"), 2.0);
    gateway.stop().await;
}

#[tokio::test]
async fn per_user_budgets_are_shared_by_two_gateways_on_redis() {
    if common::needs::skip(common::needs::REDIS) {
        return;
    }
    let redis = Redis::start();
    let key = Signer::ec("ec-1", Algorithm::ES256);
    let document = jwks(&[&key]);
    let config = per_user_config().replace(
        "[[jwt.issuers]]",
        &format!(
            "[store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"tg:\"\n\n[[jwt.issuers]]",
            redis.url()
        ),
    );
    let a = start_redis_gateway(&config, &document).await;
    let b = start_redis_gateway(&config, &document).await;
    // These gateways' clocks are the wall clock's (Redis's time).
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let alice = key.sign(&claims_at("alice", now));
    let alice_again = key.sign(&with(claims_at("alice", now), json!({"jti": "2"})));
    let bob = key.sign(&claims_at("bob", now));
    assert_eq!(with_token(&a, "/api", &alice).await.status, 200);
    assert_eq!(with_token(&b, "/api", &alice_again).await.status, 200);
    assert_eq!(
        with_token(&a, "/api", &alice_again).await.status,
        429,
        "alice's budget is one across both gateways"
    );
    assert_eq!(with_token(&b, "/api", &alice).await.status, 429);
    assert_eq!(with_token(&b, "/api", &bob).await.status, 200);
    assert_eq!(with_token(&a, "/api", &bob).await.status, 200);
    assert_eq!(with_token(&a, "/api", &bob).await.status, 429);
    // No raw user name in Redis.
    let keys = redis.keys();
    assert!(!keys.is_empty());
    assert!(
        keys.iter()
            .all(|k| k.starts_with("tg:per_user:") && !k.contains("alice") && !k.contains("bob")),
        "{keys:?}"
    );
    a.stop().await;
    b.stop().await;
}

/// An in-process gateway on the wall clock (as Redis's) with `config`,
/// its JWKS file written beside it before it loads.
async fn start_redis_gateway(config: &str, document: &str) -> InProcess {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("jwks.json"), document).unwrap();
    InProcess::start_on_wall_time_in(dir, config).await
}
