//! Fuzz target for the JWT parser and signature check
//! (`identity::jwt::token::parse`, `identity::jwt::verify::signature`) and
//! the JWKS reader (`identity::jwt::jwks::KeySet::from_jwks`).
//!
//! The first byte picks what the rest is:
//! - a token as a client sends it (half the inputs): beyond "never
//!   panics", an accepted token has exactly two dots, its `signing_input`
//!   is the input up to the last dot, each part re-encoded from its
//!   decoded bytes with unpadded base64url is the part received (decoding
//!   is canonical: no two texts are one token), and a lenient JSON reader
//!   reads the same header and claims (the strict reader agrees with it on
//!   whatever it accepts). Then its signature is checked against fixed key
//!   sets, with an oracle: under the HMAC secret it verifies exactly when
//!   it is that secret's tag of the signing input and names no key; under
//!   the Ed25519 key exactly when it is that key's (deterministic)
//!   signature; under the P-256 and RSA keys never (no input is signed by
//!   them: the RSA key's private half is not here, and the P-256 key signs
//!   only inside this target — keep such tokens out of the corpus);
//! - claims to sign (a quarter): the target signs the bytes as claims with
//!   one of the fixed keys (HS256/384/512, EdDSA, ES256), and the token must
//!   verify under that key; the same token with one byte changed or cut
//!   short, with another key set, or signed HS256 with a public key's bytes
//!   as the secret (alg confusion) must not;
//! - a JWKS document (a quarter): `from_jwks` never panics; a set it reads
//!   has a key, and every member of `keys` is a key or a skipped entry; the
//!   set checks tokens of every algorithm without panicking (whatever the
//!   key material), and verifies the HS256 probe only if the document holds
//!   the probe's secret (or that secret padded with zeros, the same HMAC
//!   key).

#![no_main]

use std::sync::LazyLock;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use libfuzzer_sys::fuzz_target;
use ring::hmac;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
use serde_json::{Map, Value, json};
use tollgate::identity::jwt::jwks::KeySet;
use tollgate::identity::jwt::token::{self, Algorithm, MAX_TOKEN_BYTES, Token};
use tollgate::identity::jwt::verify::signature;

/// The HMAC secret of [`HMAC_SET`].
const SECRET: [u8; 32] = *b"tollgate-fuzz-hmac-secret-32-byt";
/// The Ed25519 key's seed.
const ED_SEED: [u8; 32] = [7; 32];
/// A P-256 key (PKCS#8), made for this target with `openssl ecparam` only.
const EC_PKCS8: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgLI4bngBJ+OXg5vejjSSPrfw5Xl3hjz/xn7It+h1Azk+hRANCAASG+LprNEXX1oR4Ba+FfiWInX5fIguF1es7sx77+rdBi9uS0Sj4FoCF68aQvpZu/5XdaR4SCTZTGwvrgJEAgFfe";
/// A 2048-bit RSA modulus whose private key was thrown away.
const RSA_N: &str = "4uEDPQk5MDTx8gqpndCukhedPQaCnMY5RD4BKXN6HWZECQUT_WPVC6sewCANl9zyTx5aRFKZUXo6TqSw0Iad9f0Db7_YNiw1dgnMWKBLyD6MD0WtF49BZpNh7nS59JBP4WCBwIO5qGPnByZdHTwl1YYRwcP6JwQtosexM1n2dTNF2mRrsSkG7vZ8JzyPQppXm6b6eESYfxf63Y6_YA_W15R0jitToQQGcS1yr7mIrgpKZJR_OGON_ajyxVYe8LnntqAzAX1ACHrm8tX_ZmRU0uUTHSAXvoAa1SNVPJaTgE6C1Z4cmS5Dz9Vp7pBssxhncSZNb70vPHnNsORD7nD6kQ";

struct Keys {
    hmac: KeySet,
    /// The P-256 key (`kid` "ec"), the Ed25519 key ("ed") and the RSA key
    /// ("rsa"), from one JWKS document.
    public: KeySet,
    ed: Ed25519KeyPair,
    ec: EcdsaKeyPair,
    rng: SystemRandom,
}

static KEYS: LazyLock<Keys> = LazyLock::new(|| {
    let rng = SystemRandom::new();
    let ed = Ed25519KeyPair::from_seed_unchecked(&ED_SEED).expect("Ed25519 seed");
    let pkcs8 = STANDARD.decode(EC_PKCS8).expect("P-256 key base64");
    let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8, &rng)
        .expect("P-256 key");
    let point = ec.public_key().as_ref();
    let jwks = json!({"keys": [
        {"kty": "EC", "kid": "ec", "crv": "P-256",
         "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])},
        {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": URL_SAFE_NO_PAD.encode(ed.public_key())},
        {"kty": "RSA", "kid": "rsa", "n": RSA_N, "e": "AQAB"},
    ]});
    let public = KeySet::from_jwks(jwks.to_string().as_bytes()).expect("the fixed JWKS");
    assert_eq!(public.len(), 3, "{:?}", public.skipped());
    Keys {
        hmac: KeySet::from_secret(&SECRET).expect("the fixed secret"),
        public,
        ed,
        ec,
        rng,
    }
});

fn hmac_algorithm(alg: Algorithm) -> Option<hmac::Algorithm> {
    match alg {
        Algorithm::HS256 => Some(hmac::HMAC_SHA256),
        Algorithm::HS384 => Some(hmac::HMAC_SHA384),
        Algorithm::HS512 => Some(hmac::HMAC_SHA512),
        _ => None,
    }
}

fn hmac_tag(alg: hmac::Algorithm, secret: &[u8], message: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(alg, secret), message)
        .as_ref()
        .to_vec()
}

/// The compact token of `header` and `claims` (JSON bytes) with the
/// signature `sign` makes over its signing input.
fn compact(header: &Value, claims: &[u8], sign: impl FnOnce(&[u8]) -> Vec<u8>) -> String {
    let mut text = URL_SAFE_NO_PAD.encode(header.to_string());
    text.push('.');
    text.push_str(&URL_SAFE_NO_PAD.encode(claims));
    let sig = sign(text.as_bytes());
    text.push('.');
    text.push_str(&URL_SAFE_NO_PAD.encode(sig));
    text
}

/// What must hold of any token text, accepted or not: its form, and
/// under the fixed keys its signature.
fn check_token(text: &str) {
    if let Some(token) = check_form(text) {
        check_signature(&token);
    }
}

/// The token `text` is, if it is one, after checking what its
/// acceptance implies.
fn check_form(text: &str) -> Option<Token<'_>> {
    let token = token::parse(text).ok()?;
    assert!(text.len() <= MAX_TOKEN_BYTES, "an oversized token accepted");
    assert_eq!(
        text.matches('.').count(),
        2,
        "accepted without exactly two dots"
    );
    let last_dot = text.rfind('.').expect("two dots");
    assert_eq!(
        token.signing_input,
        &text.as_bytes()[..last_dot],
        "signing input is not the text before the last dot"
    );
    let parts: Vec<&str> = text.split('.').collect();
    let header = URL_SAFE_NO_PAD
        .decode(parts[0])
        .expect("an accepted header decodes");
    let claims = URL_SAFE_NO_PAD
        .decode(parts[1])
        .expect("accepted claims decode");
    assert_eq!(
        URL_SAFE_NO_PAD.encode(&header),
        parts[0],
        "header decoded non-canonically"
    );
    assert_eq!(
        URL_SAFE_NO_PAD.encode(&claims),
        parts[1],
        "claims decoded non-canonically"
    );
    assert!(!token.signature.is_empty(), "an empty signature accepted");
    assert_eq!(
        URL_SAFE_NO_PAD.encode(&token.signature),
        parts[2],
        "signature decoded non-canonically"
    );
    // A lenient reader (last member wins) reads what the strict one read.
    let header: Map<String, Value> =
        serde_json::from_slice(&header).expect("an accepted header is a JSON object");
    assert_eq!(
        header.get("alg").and_then(Value::as_str),
        Some(token.alg.name())
    );
    assert_eq!(
        header.get("kid").and_then(Value::as_str),
        token.kid.as_deref()
    );
    assert!(!header.contains_key("crit"), "a crit header accepted");
    let lenient: Map<String, Value> =
        serde_json::from_slice(&claims).expect("accepted claims are a JSON object");
    assert_eq!(
        lenient, token.claims,
        "the strict and a lenient reader differ"
    );
    Some(token)
}

/// Against the fixed keys, a token verifies exactly when their owner
/// signed it.
fn check_signature(token: &Token<'_>) {
    let keys = &*KEYS;
    let hmac_expected = token.kid.is_none()
        && hmac_algorithm(token.alg)
            .is_some_and(|alg| token.signature == hmac_tag(alg, &SECRET, token.signing_input));
    assert_eq!(
        signature(&keys.hmac, token).is_ok(),
        hmac_expected,
        "HMAC verification disagrees with the tag ({:?})",
        token.alg
    );
    let public_expected = token.alg == Algorithm::EdDSA
        && token.kid.as_deref().is_none_or(|kid| kid == "ed")
        && token.signature == keys.ed.sign(token.signing_input).as_ref();
    assert_eq!(
        signature(&keys.public, token).is_ok(),
        public_expected,
        "public-key verification disagrees ({:?}, kid {:?})",
        token.alg,
        token.kid
    );
}

/// A token the target made, read: refused only when it is over
/// [`MAX_TOKEN_BYTES`] (large claims, or a wrapped claim's escapes).
fn signed_token(text: &str) -> Option<Token<'_>> {
    if text.len() > MAX_TOKEN_BYTES {
        assert!(token::parse(text).is_err(), "an oversized token accepted");
        return None;
    }
    Some(token::parse(text).expect("a token the target signed is readable"))
}

/// `claims` signed by the target with the key `control` picks, then
/// changed: only the token as signed verifies.
fn check_signed(control: u8, data: &[u8]) {
    let [a, b, xor, cut, claims @ ..] = data else {
        return;
    };
    let keys = &*KEYS;
    let choice = (control >> 2) % 5;
    let named = control & 0x80 != 0;
    // Claims as given when the strict reader takes them; else the same
    // bytes as one claim's text, so a signed token is always readable.
    let wrapped;
    let claims: &[u8] = match token::parse(&compact(&json!({"alg": "HS256"}), claims, |_| vec![0]))
    {
        Ok(_) => claims,
        Err(_) => {
            wrapped = json!({"sub": String::from_utf8_lossy(claims), "exp": 1}).to_string();
            wrapped.as_bytes()
        }
    };
    let (text, set, other) = match choice {
        0..=2 => {
            let (name, alg) = [
                ("HS256", hmac::HMAC_SHA256),
                ("HS384", hmac::HMAC_SHA384),
                ("HS512", hmac::HMAC_SHA512),
            ][usize::from(choice)];
            let text = compact(&json!({"alg": name}), claims, |input| {
                hmac_tag(alg, &SECRET, input)
            });
            (text, &keys.hmac, &keys.public)
        }
        3 => {
            let header = if named {
                json!({"alg": "EdDSA", "kid": "ed"})
            } else {
                json!({"alg": "EdDSA"})
            };
            let text = compact(&header, claims, |input| {
                keys.ed.sign(input).as_ref().to_vec()
            });
            (text, &keys.public, &keys.hmac)
        }
        _ => {
            let header = if named {
                json!({"alg": "ES256", "kid": "ec", "typ": "JWT"})
            } else {
                json!({"alg": "ES256"})
            };
            let text = compact(&header, claims, |input| {
                keys.ec
                    .sign(&keys.rng, input)
                    .expect("ECDSA signing")
                    .as_ref()
                    .to_vec()
            });
            (text, &keys.public, &keys.hmac)
        }
    };
    let Some(token) = signed_token(&text) else {
        return;
    };
    assert!(
        signature(set, &token).is_ok(),
        "a signed token does not verify"
    );
    assert!(
        signature(other, &token).is_err(),
        "verified under another key set"
    );
    // Its form (not the oracle's signature check: an ES256 token signed
    // here is the one kind the oracle does not expect to verify).
    check_form(&text);

    // One byte changed (within ASCII, as the text is), anywhere.
    let mut changed = text.clone().into_bytes();
    let at = usize::from(u16::from_le_bytes([*a, *b])) % changed.len();
    changed[at] ^= (xor & 0x7f).max(1);
    let changed = String::from_utf8(changed).expect("ASCII stays ASCII");
    if let Ok(token) = token::parse(&changed) {
        assert!(signature(set, &token).is_err(), "a changed token verifies");
    }
    check_token(&changed);
    // Cut short.
    let short = &text[..text.len() - 1 - usize::from(*cut) % text.len()];
    if let Ok(token) = token::parse(short) {
        assert!(
            signature(set, &token).is_err(),
            "a truncated token verifies"
        );
    }

    // Alg confusion: HS256 keyed by a public key's bytes, naming that key.
    let ec_point = keys.ec.public_key().as_ref().to_vec();
    let rsa_n = URL_SAFE_NO_PAD.decode(RSA_N).expect("modulus");
    let (kid, public_bytes) = match choice % 3 {
        0 => ("ec", ec_point),
        1 => ("ed", keys.ed.public_key().as_ref().to_vec()),
        _ => ("rsa", rsa_n),
    };
    let confused = compact(&json!({"alg": "HS256", "kid": kid}), claims, |input| {
        hmac_tag(hmac::HMAC_SHA256, &public_bytes, input)
    });
    let Some(token) = signed_token(&confused) else {
        return;
    };
    assert!(
        signature(&keys.public, &token).is_err(),
        "alg confusion verifies"
    );
    assert!(
        signature(&keys.hmac, &token).is_err(),
        "a named key verifies under a secret"
    );
}

/// Tokens of every algorithm, one of them (HS256) signed with [`SECRET`].
static PROBES: LazyLock<Vec<(Algorithm, String)>> = LazyLock::new(|| {
    let claims = br#"{"sub":"probe","exp":1}"#;
    Algorithm::ALL
        .into_iter()
        .map(|alg| {
            let text = compact(&json!({"alg": alg.name()}), claims, |input| match alg {
                Algorithm::HS256 => hmac_tag(hmac::HMAC_SHA256, &SECRET, input),
                Algorithm::ES256 => vec![1; 64],
                Algorithm::ES384 => vec![1; 96],
                Algorithm::EdDSA => vec![1; 64],
                _ => vec![1; 256],
            });
            (alg, text)
        })
        .collect()
});

/// A JWKS document: read, accounted for, and used.
fn check_jwks(data: &[u8]) {
    let Ok(set) = KeySet::from_jwks(data) else {
        return;
    };
    assert!(!set.is_empty(), "a key set without keys");
    let document: Value = serde_json::from_slice(data).expect("a read JWKS is JSON");
    let members = document["keys"]
        .as_array()
        .expect("a read JWKS has a `keys` array");
    assert_eq!(
        set.len() + set.skipped().len(),
        members.len(),
        "a JWK neither kept nor skipped"
    );
    // HMAC pads a key shorter than the hash's block (64 bytes for SHA-256)
    // with zeros (RFC 2104 §2): the secret followed by zeros is the same
    // key. (The one failure of the first run: the harness compared bytes.)
    let holds_secret = members.iter().any(|jwk| {
        jwk["kty"] == "oct"
            && jwk["k"]
                .as_str()
                .and_then(|k| URL_SAFE_NO_PAD.decode(k).ok())
                .is_some_and(|k| {
                    k.len() <= 64
                        && k.starts_with(&SECRET)
                        && k[SECRET.len()..].iter().all(|b| *b == 0)
                })
    });
    for (alg, text) in PROBES.iter() {
        let token = token::parse(text).expect("a probe is readable");
        let verified = signature(&set, &token).is_ok();
        if verified {
            assert!(
                *alg == Algorithm::HS256 && holds_secret,
                "a probe verifies under a JWKS without its key ({alg:?})"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    match control & 3 {
        0 | 1 => check_token(&String::from_utf8_lossy(rest)),
        2 => check_signed(control, rest),
        _ => check_jwks(rest),
    }
});
