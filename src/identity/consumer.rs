//! Consumers: the API key of a request mapped to a consumer, tenant and plan
//! through `[consumers]` (inline or in `api_keys.file`).
//!
//! The key is read from `x-api-key` by default, another header, or
//! `Authorization: Bearer`. It is used only to look the consumer up: it is
//! never logged, and limits key on the consumer or tenant name it maps to.

use http::HeaderMap;
use http::header::AUTHORIZATION;

use crate::config::{ApiKeyConfig, ApiKeySource, Config, Consumer};

/// What the request's API key says about who is calling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Caller<'c> {
    /// No API key.
    Anonymous,
    /// A key that no consumer has.
    UnknownKey,
    Known(&'c Consumer),
}

/// The API key the request presents, if any.
pub(crate) fn api_key<'h>(headers: &'h HeaderMap, config: &ApiKeyConfig) -> Option<&'h str> {
    match &config.source {
        ApiKeySource::Header(name) => headers.get(name)?.to_str().ok().map(str::trim),
        ApiKeySource::Bearer => bearer(headers),
    }
    .filter(|key| !key.is_empty())
}

/// The credentials of `Authorization: Bearer CREDENTIALS` (the scheme
/// case-insensitive, RFC 9110 §11.1), trimmed.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    // Bytes, not `HeaderValue::to_str`, which checks a byte at a time: for
    // a JWT that was half of what identifying a caller cost. `from_utf8`
    // checks the token a word at a time; a key or token with a byte no
    // credential has is refused where it is read.
    let value = headers.get(AUTHORIZATION)?.as_bytes().trim_ascii();
    let space = value.iter().position(|byte| *byte == b' ')?;
    let (scheme, token) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    std::str::from_utf8(token.trim_ascii()).ok()
}

/// Looks the caller up.
pub(crate) fn identify<'c>(
    headers: &HeaderMap,
    config: &ApiKeyConfig,
    consumers: &'c std::collections::HashMap<String, Consumer>,
) -> Caller<'c> {
    match api_key(headers, config) {
        None => Caller::Anonymous,
        Some(key) => consumers.get(key).map_or(Caller::UnknownKey, Caller::Known),
    }
}

/// The caller's consumer for a route, or why the gateway answers 401: a key
/// no consumer has where unknown keys are refused (`unknown_key = "reject"`
/// or the route's `require_consumer`), or no key on a `require_consumer`
/// route. Shared by the gateway's identify step and `simulate`.
pub(crate) fn admit<'c>(
    headers: &HeaderMap,
    config: &'c Config,
    require_consumer: bool,
) -> Result<Option<&'c Consumer>, &'static str> {
    let api_keys = &config.api_keys;
    // With no consumers and nothing that refuses a request for its key,
    // every answer is "no consumer": the key is not looked for.
    if config.consumers.is_empty() && !api_keys.reject_unknown && !require_consumer {
        return Ok(None);
    }
    match identify(headers, api_keys, &config.consumers) {
        Caller::Known(consumer) => Ok(Some(consumer)),
        Caller::UnknownKey if api_keys.reject_unknown || require_consumer => {
            Err("the API key is not known")
        }
        Caller::Anonymous if require_consumer => Err("this route needs an API key"),
        Caller::UnknownKey | Caller::Anonymous => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use std::collections::HashMap;
    use std::sync::Arc;

    fn consumers() -> HashMap<String, Consumer> {
        let mut map = HashMap::new();
        map.insert(
            "k-1".to_owned(),
            Consumer {
                consumer: Arc::from("acme-web"),
                tenant: Some(Arc::from("acme")),
                plan: Some(Arc::from("free")),
                priority: None,
            },
        );
        map
    }

    #[test]
    fn header_and_bearer_sources() {
        let consumers = consumers();
        let header = ApiKeyConfig {
            source: ApiKeySource::Header(http::HeaderName::from_static("x-api-key")),
            reject_unknown: false,
        };
        let bearer = ApiKeyConfig {
            source: ApiKeySource::Bearer,
            reject_unknown: false,
        };
        let mut headers = HeaderMap::new();
        assert_eq!(identify(&headers, &header, &consumers), Caller::Anonymous);
        headers.insert("x-api-key", HeaderValue::from_static("k-1"));
        assert!(
            matches!(identify(&headers, &header, &consumers), Caller::Known(c) if &*c.consumer == "acme-web")
        );
        headers.insert("x-api-key", HeaderValue::from_static("k-2"));
        assert_eq!(identify(&headers, &header, &consumers), Caller::UnknownKey);
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer k-1"));
        assert!(matches!(
            identify(&headers, &bearer, &consumers),
            Caller::Known(_)
        ));
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Basic k-1"));
        assert_eq!(identify(&headers, &bearer, &consumers), Caller::Anonymous);
    }

    #[test]
    fn bearer_reads_the_credentials_after_the_scheme() {
        let read = |value: &'static [u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(AUTHORIZATION, HeaderValue::from_bytes(value).unwrap());
            bearer(&headers).map(str::to_owned)
        };
        assert_eq!(read(b"Bearer a.b.c").as_deref(), Some("a.b.c"));
        assert_eq!(read(b"bEaReR   a.b.c \t").as_deref(), Some("a.b.c"));
        assert_eq!(read(b"\tBearer a.b.c").as_deref(), Some("a.b.c"));
        assert_eq!(read(b"Bearer").as_deref(), None);
        assert_eq!(read(b"Bearer ").as_deref(), None);
        assert_eq!(read(b"Bearerx a.b.c").as_deref(), None);
        assert_eq!(read(b"Basic a.b.c").as_deref(), None);
        // obs-text: UTF-8 is read (and refused by whoever reads the
        // credential: no key or token has such a byte), anything else is
        // no credential.
        assert_eq!(
            read("Bearer k\u{e9}".as_bytes()).as_deref(),
            Some("k\u{e9}")
        );
        assert_eq!(read(b"Bearer k\xff").as_deref(), None);
    }
}
