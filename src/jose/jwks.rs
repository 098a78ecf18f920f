//! An issuer's verification keys: a JWKS document (RFC 7517) read into
//! public keys that ring verifies with, or one HMAC secret.
//!
//! A key is tied to the algorithms its type can verify: an RSA key to
//! RS*/PS*, a P-256 key to ES256 and a P-384 key to ES384, an Ed25519
//! key to EdDSA, a secret to HS*. A token whose `alg` does not fit the key
//! it names is refused before any signature is computed, so an RSA public
//! key can never be used as an HMAC secret (the classic "alg confusion").
//! A key that says its own `alg` is used for that one only.
//!
//! A JWKS may hold keys this gateway cannot use (encryption keys, unknown
//! types, RSA below 2048 bits, other curves): they are skipped and listed
//! in [`KeySet::skipped`], so one such key does not discard the others.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::{hmac, signature};
use serde::Deserialize;

use super::Algorithm;

/// The smallest RSA modulus accepted, in bits (ring's own floor).
const MIN_RSA_BITS: usize = 2048;

/// Keys that verify one issuer's tokens.
#[derive(Debug, Default)]
pub struct KeySet {
    pub(crate) keys: Vec<Key>,
    /// Why each unusable key of the document was skipped.
    pub(crate) skipped: Vec<String>,
}

/// One verification key.
#[derive(Debug)]
pub(crate) struct Key {
    pub(crate) kid: Option<String>,
    /// The JWK's own `alg`, when it names one.
    pub(crate) alg: Option<Algorithm>,
    material: Material,
}

enum Material {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// An uncompressed point (`04 || x || y`).
    P256(Vec<u8>),
    P384(Vec<u8>),
    Ed25519(Vec<u8>),
    Secret(Vec<u8>),
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret's bytes.
        f.write_str(match self {
            Material::Rsa { .. } => "RSA",
            Material::P256(_) => "P-256",
            Material::P384(_) => "P-384",
            Material::Ed25519(_) => "Ed25519",
            Material::Secret(_) => "secret",
        })
    }
}

/// The JWK members read; the rest are ignored.
#[derive(Deserialize)]
struct RawJwk {
    kty: Option<String>,
    kid: Option<String>,
    #[serde(rename = "use")]
    usage: Option<String>,
    alg: Option<String>,
    n: Option<String>,
    e: Option<String>,
    crv: Option<String>,
    x: Option<String>,
    y: Option<String>,
    k: Option<String>,
}

#[derive(Deserialize)]
struct RawJwks {
    keys: Vec<serde_json::Value>,
}

impl KeySet {
    /// The keys of a JWKS document. `Err` when it is no JWKS or holds no
    /// key this gateway can use.
    pub fn from_jwks(bytes: &[u8]) -> Result<KeySet, String> {
        // serde reads a struct from an array too (its fields in order):
        // `[[{"kty": ...}]]` is no JWKS, nor `["oct", ...]` a JWK (RFC 7517
        // §4, §5: JSON objects).
        let not_jwks = "not a JWKS document (a JSON object with `keys`)";
        if bytes.trim_ascii_start().first() != Some(&b'{') {
            return Err(not_jwks.to_owned());
        }
        let raw: RawJwks = serde_json::from_slice(bytes).map_err(|e| format!("{not_jwks}: {e}"))?;
        let mut set = KeySet::default();
        for (index, value) in raw.keys.into_iter().enumerate() {
            let described = |why: String| format!("key {index}: {why}");
            if !value.is_object() {
                set.skipped.push(described("not a JSON object".to_owned()));
                continue;
            }
            match serde_json::from_value::<RawJwk>(value)
                .map_err(|e| e.to_string())
                .and_then(Key::from_jwk)
            {
                Ok(Some(key)) => set.keys.push(key),
                Ok(None) => set.skipped.push(described("an encryption key".to_owned())),
                Err(why) => set.skipped.push(described(why)),
            }
        }
        if set.keys.is_empty() {
            let mut message = "the JWKS has no key usable for verifying signatures".to_owned();
            if !set.skipped.is_empty() {
                message.push_str(&format!(" ({})", set.skipped.join("; ")));
            }
            return Err(message);
        }
        Ok(set)
    }

    /// One HMAC secret (`secret_file`, `secret_env`).
    pub fn from_secret(secret: &[u8]) -> Result<KeySet, String> {
        // RFC 7518 §3.2: a key at least as long as the hash; HS256's 32 bytes
        // is the floor for every HS* here.
        if secret.len() < 32 {
            return Err(format!(
                "an HMAC secret needs at least 32 bytes, this one has {}",
                secret.len()
            ));
        }
        Ok(KeySet {
            keys: vec![Key {
                kid: None,
                alg: None,
                material: Material::Secret(secret.to_vec()),
            }],
            skipped: Vec::new(),
        })
    }

    /// How many usable keys it holds. With [`KeySet::skipped`], `pub` for
    /// the fuzz target's accounting: every JWK of a document is one or the
    /// other.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether it holds no key (never, once built).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Why each unusable key of the document was skipped.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// The keys that may verify a token with `alg` and `kid`: the one with
    /// that `kid`, or without a `kid` every key whose type fits `alg`.
    pub(crate) fn candidates<'k>(
        &'k self,
        kid: Option<&'k str>,
    ) -> impl Iterator<Item = &'k Key> + 'k {
        self.keys
            .iter()
            .filter(move |key| kid.is_none() || key.kid.as_deref() == kid)
    }
}

impl Key {
    fn from_jwk(raw: RawJwk) -> Result<Option<Key>, String> {
        if raw.usage.as_deref().is_some_and(|u| u != "sig") {
            return Ok(None);
        }
        let alg = match raw.alg.as_deref() {
            None => None,
            Some(name) => Some(
                Algorithm::from_name(name)
                    .ok_or_else(|| format!("`alg` {name:?} is not a signature algorithm"))?,
            ),
        };
        let field = |value: &Option<String>, name: &str| -> Result<Vec<u8>, String> {
            let text = value.as_deref().ok_or_else(|| format!("no `{name}`"))?;
            URL_SAFE_NO_PAD
                .decode(text)
                .map_err(|_| format!("`{name}` is not base64url"))
        };
        let material = match raw.kty.as_deref() {
            Some("RSA") => {
                let n = field(&raw.n, "n")?;
                let e = field(&raw.e, "e")?;
                let bits = n.iter().position(|b| *b != 0).map_or(0, |first| {
                    (n.len() - first) * 8 - n[first].leading_zeros() as usize
                });
                if bits < MIN_RSA_BITS {
                    return Err(format!(
                        "an RSA key of {bits} bits (at least {MIN_RSA_BITS})"
                    ));
                }
                Material::Rsa { n, e }
            }
            Some("EC") => {
                let (len, p256) = match raw.crv.as_deref() {
                    Some("P-256") => (32, true),
                    Some("P-384") => (48, false),
                    other => return Err(format!("curve {other:?} is not P-256 or P-384")),
                };
                let x = field(&raw.x, "x")?;
                let y = field(&raw.y, "y")?;
                if x.len() != len || y.len() != len {
                    return Err("`x`/`y` do not fit the curve".to_owned());
                }
                let mut point = Vec::with_capacity(1 + 2 * len);
                point.push(4);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                if p256 {
                    Material::P256(point)
                } else {
                    Material::P384(point)
                }
            }
            Some("OKP") => {
                if raw.crv.as_deref() != Some("Ed25519") {
                    return Err(format!("curve {:?} is not Ed25519", raw.crv));
                }
                let x = field(&raw.x, "x")?;
                if x.len() != 32 {
                    return Err("`x` is not an Ed25519 key".to_owned());
                }
                Material::Ed25519(x)
            }
            Some("oct") => Material::Secret(field(&raw.k, "k")?),
            other => return Err(format!("key type {other:?} is not supported")),
        };
        let key = Key {
            kid: raw.kid,
            alg,
            material,
        };
        if let Some(alg) = alg
            && !key.fits(alg)
        {
            return Err(format!("`alg` {alg} does not fit a {:?} key", key.material));
        }
        Ok(Some(key))
    }

    /// Whether this key may verify `alg`.
    pub(crate) fn fits(&self, alg: Algorithm) -> bool {
        use Algorithm::*;
        let by_type = match self.material {
            Material::Rsa { .. } => matches!(alg, RS256 | RS384 | RS512 | PS256 | PS384 | PS512),
            Material::P256(_) => alg == ES256,
            Material::P384(_) => alg == ES384,
            Material::Ed25519(_) => alg == EdDSA,
            Material::Secret(_) => alg.is_hmac(),
        };
        by_type && self.alg.is_none_or(|own| own == alg)
    }

    /// Whether `signature` over `message` verifies under this key with
    /// `alg` (which [`Key::fits`]).
    pub(crate) fn verifies(&self, alg: Algorithm, message: &[u8], sig: &[u8]) -> bool {
        use Algorithm::*;
        if !self.fits(alg) {
            return false;
        }
        match &self.material {
            Material::Rsa { n, e } => {
                let params: &signature::RsaParameters = match alg {
                    RS256 => &signature::RSA_PKCS1_2048_8192_SHA256,
                    RS384 => &signature::RSA_PKCS1_2048_8192_SHA384,
                    RS512 => &signature::RSA_PKCS1_2048_8192_SHA512,
                    PS256 => &signature::RSA_PSS_2048_8192_SHA256,
                    PS384 => &signature::RSA_PSS_2048_8192_SHA384,
                    _ => &signature::RSA_PSS_2048_8192_SHA512,
                };
                signature::RsaPublicKeyComponents { n, e }
                    .verify(params, message, sig)
                    .is_ok()
            }
            Material::P256(point) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, sig)
                    .is_ok()
            }
            Material::P384(point) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                    .verify(message, sig)
                    .is_ok()
            }
            Material::Ed25519(x) => signature::UnparsedPublicKey::new(&signature::ED25519, x)
                .verify(message, sig)
                .is_ok(),
            Material::Secret(secret) => {
                let algorithm = match alg {
                    HS256 => hmac::HMAC_SHA256,
                    HS384 => hmac::HMAC_SHA384,
                    _ => hmac::HMAC_SHA512,
                };
                // Constant-time comparison.
                hmac::verify(&hmac::Key::new(algorithm, secret), message, sig).is_ok()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    #[test]
    fn skips_unusable_keys_and_keeps_the_rest() {
        let small_rsa = b64(&[0xff; 128]);
        let doc = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "small", "n": small_rsa, "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": b64(&[0xff; 256]), "e": "AQAB"},
            {"kty": "EC", "kid": "k", "crv": "P-521", "x": "AA", "y": "AA"},
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": b64(&[7; 32])},
            {"kty": "weird"},
        ]});
        let set = KeySet::from_jwks(doc.to_string().as_bytes()).unwrap();
        assert_eq!(set.keys.len(), 1);
        assert_eq!(set.keys[0].kid.as_deref(), Some("ed"));
        assert_eq!(set.skipped.len(), 4, "{:?}", set.skipped);
        assert!(KeySet::from_jwks(br#"{"keys": []}"#).is_err());
        assert!(KeySet::from_jwks(b"[]").is_err());
    }

    /// Found by the `jwt_token` fuzz target: serde reads a struct from a
    /// JSON array, so an array of keys was a JWKS and an array of members
    /// a JWK.
    #[test]
    fn a_jwks_and_its_keys_are_json_objects() {
        let read = |doc: serde_json::Value| KeySet::from_jwks(doc.to_string().as_bytes());
        let k = b64(&[5; 32]);
        let keys = serde_json::json!([{"kty": "oct", "k": k}]);
        assert!(read(serde_json::json!({ "keys": keys })).is_ok());
        assert!(read(serde_json::json!([keys])).is_err());
        let spaced = format!(" \n{{\"keys\": {keys}}}");
        assert!(KeySet::from_jwks(spaced.as_bytes()).is_ok());
        // kty, kid, use, alg, n, e, crv, x, y, k.
        let positional =
            serde_json::json!(["oct", null, null, null, null, null, null, null, null, k]);
        let ed = serde_json::json!({"kty": "OKP", "crv": "Ed25519", "x": b64(&[7; 32])});
        let set = read(serde_json::json!({ "keys": [positional, ed] })).unwrap();
        assert_eq!(set.len(), 1);
        assert_eq!(set.skipped(), ["key 0: not a JSON object"]);
    }

    #[test]
    fn a_key_verifies_only_the_algorithms_of_its_type() {
        let rsa = Key {
            kid: None,
            alg: None,
            material: Material::Rsa {
                n: vec![0xff; 256],
                e: vec![1, 0, 1],
            },
        };
        assert!(rsa.fits(Algorithm::RS256) && rsa.fits(Algorithm::PS256));
        assert!(!rsa.fits(Algorithm::HS256) && !rsa.fits(Algorithm::ES256));
        let secret = KeySet::from_secret(&[1; 32]).unwrap();
        assert!(secret.keys[0].fits(Algorithm::HS384));
        assert!(!secret.keys[0].fits(Algorithm::RS256));
        assert!(KeySet::from_secret(b"short").is_err());
        let pinned = Key {
            alg: Some(Algorithm::PS256),
            ..rsa
        };
        assert!(pinned.fits(Algorithm::PS256) && !pinned.fits(Algorithm::RS256));
    }

    #[test]
    fn hmac_signatures_verify_and_others_do_not() {
        let set = KeySet::from_secret(&[9; 32]).unwrap();
        let key = &set.keys[0];
        let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &[9; 32]), b"msg");
        assert!(key.verifies(Algorithm::HS256, b"msg", tag.as_ref()));
        assert!(!key.verifies(Algorithm::HS256, b"msh", tag.as_ref()));
        assert!(!key.verifies(Algorithm::HS384, b"msg", tag.as_ref()));
    }
}
