//! HS256 tokens for tests outside `tests/jwt.rs` (which signs with another
//! encoder): the JOSE compact form written out by hand, signed with ring's
//! HMAC.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// An HS256 token with `claims`, signed with `secret`.
pub fn hs256(secret: &[u8], claims: &serde_json::Value) -> String {
    let signing = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
    let tag = ring::hmac::sign(&key, signing.as_bytes());
    format!("{signing}.{}", URL_SAFE_NO_PAD.encode(tag))
}
