//! The JWS compact serialisation of a JWT, parsed strictly and without
//! trusting anything in it yet: `BASE64URL(header) . BASE64URL(claims) .
//! BASE64URL(signature)`.
//!
//! Strict where a lenient parser would let two readers disagree about one
//! token: exactly three parts; unpadded base64url with canonical trailing
//! bits (RFC 7515 §2); header and claims JSON objects, UTF-8, with no
//! member name twice at any depth (RFC 7515 §5.2 and RFC 7519 §4 allow a
//! parser to refuse these, and "last one wins" is how claims get
//! smuggled past a different reader); no `crit` header (no extension is
//! understood, RFC 7515 §4.1.11); `alg = "none"` and unknown algorithms
//! refused here, before a key is looked for.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::Failure;
pub use crate::jose::Algorithm;

/// The longest token read, in bytes: beyond it the token is malformed
/// without being decoded. Real access tokens are 0.5–2 KB.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// A token split and decoded, not yet verified.
#[derive(Debug)]
pub struct Token<'t> {
    pub alg: Algorithm,
    /// The header's `kid`, naming the key that signed it.
    pub kid: Option<String>,
    pub claims: Map<String, Value>,
    /// `header . claims` as received: what the signature covers.
    pub signing_input: &'t [u8],
    pub signature: Vec<u8>,
}

/// Splits and decodes `token`; `Err` says why it is no JWT we read.
pub fn parse(token: &str) -> Result<Token<'_>, Failure> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Failure::Malformed("the token is too large"));
    }
    let mut parts = token.split('.');
    let (Some(header), Some(claims), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Failure::Malformed("a token has three dot-separated parts"));
    };
    let header = decode_part(header)?;
    let header = object(&header)?;
    if header.contains_key("crit") {
        return Err(Failure::Malformed(
            "the token names critical header extensions",
        ));
    }
    let alg = match header.get("alg") {
        Some(Value::String(name)) if name == "none" => {
            return Err(Failure::BadSignature("unsigned tokens are not accepted"));
        }
        Some(Value::String(name)) => Algorithm::from_name(name).ok_or(Failure::BadSignature(
            "the token's algorithm is not supported",
        ))?,
        _ => return Err(Failure::Malformed("the token's header names no algorithm")),
    };
    let kid = match header.get("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid.clone()),
        Some(_) => return Err(Failure::Malformed("the token's key id is not a string")),
    };
    let claims = object(&decode_part(claims)?)?;
    if signature.is_empty() {
        return Err(Failure::BadSignature("the token has no signature"));
    }
    let signature = decode_part(signature)?;
    // The first two parts and the dot between them.
    let signed_len = token.len() - token.rsplit('.').next().map_or(0, str::len) - 1;
    Ok(Token {
        alg,
        kid,
        claims,
        signing_input: &token.as_bytes()[..signed_len],
        signature,
    })
}

/// One part's bytes: unpadded base64url, canonical (no stray bits).
fn decode_part(part: &str) -> Result<Vec<u8>, Failure> {
    if part.is_empty() {
        return Err(Failure::Malformed("a part of the token is empty"));
    }
    URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| Failure::Malformed("a part of the token is not base64url"))
}

/// A JSON object with no member name twice, at any depth.
fn object(bytes: &[u8]) -> Result<Map<String, Value>, Failure> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| Failure::Malformed("a part of the token is not UTF-8"))?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = StrictValue::deserialize(&mut deserializer)
        .and_then(|v| deserializer.end().map(|()| v))
        .map_err(|_| Failure::Malformed("a part of the token is not a JSON object"))?;
    match value.0 {
        Value::Object(map) => Ok(map),
        _ => Err(Failure::Malformed(
            "a part of the token is not a JSON object",
        )),
    }
}

/// A JSON value whose objects have unique member names.
struct StrictValue(Value);

impl<'de> serde::Deserialize<'de> for StrictValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(StrictVisitor).map(StrictValue)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(StrictValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            let StrictValue(value) = map.next_value()?;
            if members.insert(name, value).is_some() {
                return Err(de::Error::custom("a member name appears twice"));
            }
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(text: &str) -> String {
        URL_SAFE_NO_PAD.encode(text)
    }

    fn token(header: &str, claims: &str) -> String {
        format!("{}.{}.{}", b64(header), b64(claims), b64("sig"))
    }

    #[test]
    fn reads_a_well_formed_token() {
        let text = token(r#"{"alg":"RS256","kid":"k1"}"#, r#"{"sub":"u1","exp":5}"#);
        let parsed = parse(&text).unwrap();
        assert_eq!(parsed.alg, Algorithm::RS256);
        assert_eq!(parsed.kid.as_deref(), Some("k1"));
        assert_eq!(parsed.claims["sub"], "u1");
        assert_eq!(parsed.signature, b"sig");
        let dot = text.rfind('.').unwrap();
        assert_eq!(parsed.signing_input, &text.as_bytes()[..dot]);
    }

    #[test]
    fn refuses_what_two_readers_could_read_differently() {
        let cases = [
            token(r#"{"alg":"none"}"#, r#"{"sub":"u"}"#),
            token(r#"{"alg":"RS256","crit":["b64"]}"#, r#"{"sub":"u"}"#),
            token(r#"{"alg":"RS256"}"#, r#"{"sub":"a","sub":"b"}"#),
            token(r#"{"alg":"RS256"}"#, r#"{"o":{"id":1,"id":2}}"#),
            token(r#"{"alg":"RS256","alg":"HS256"}"#, r#"{"sub":"u"}"#),
            token(r#"{"alg":"rs256"}"#, r#"{"sub":"u"}"#),
            token(r#"{}"#, r#"{"sub":"u"}"#),
            token(r#"{"alg":"RS256"}"#, r#"["sub"]"#),
            token(r#"{"alg":"RS256"}"#, r#"{"sub":"u"} x"#),
            token(r#"{"alg":"RS256","kid":7}"#, r#"{"sub":"u"}"#),
            format!("{}.{}.", b64(r#"{"alg":"RS256"}"#), b64("{}")),
            format!("{}.{}", b64(r#"{"alg":"RS256"}"#), b64("{}")),
            format!("{}..{}", b64(r#"{"alg":"RS256"}"#), b64("s")),
            format!("{}.{}.{}.x", b64(r#"{"alg":"RS256"}"#), b64("{}"), b64("s")),
            // Padding, and a non-canonical last character ("e30" is `{}`).
            format!("{}.e30=.{}", b64(r#"{"alg":"RS256"}"#), b64("s")),
            format!("{}.e31.{}", b64(r#"{"alg":"RS256"}"#), b64("s")),
            format!("{}.e3+.{}", b64(r#"{"alg":"RS256"}"#), b64("s")),
            "x".repeat(MAX_TOKEN_BYTES + 1),
        ];
        for case in &cases {
            assert!(parse(case).is_err(), "accepted {case}");
        }
    }
}
