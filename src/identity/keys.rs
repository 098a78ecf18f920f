//! Key extraction: what a limit counts a request under.
//!
//! A limit's key is a list of parts (`ip`, `header:NAME`, `query:NAME`,
//! `cookie:NAME`, `route`, ...). The values are hashed together into a
//! fixed-size [`LimitKey`] digest: the store never holds raw API keys or
//! addresses, memory per key is fixed, and nothing is `format!`ed on the hot
//! path. A part that is absent makes the whole key missing, which the limit's
//! `on_missing_key` then decides.

use std::net::IpAddr;

use http::request::Parts;
use ipnet::IpNet;

use super::body_fields::BodyFields;
use super::jwt::Verified;
use crate::config::{Consumer, KeyPart, LimitConfig, OnMissingKey};
use crate::limit::LimitKey;

/// What key extraction knows about the request beyond its head.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The client's network after trusted-proxy resolution and prefix masking.
    pub client: IpNet,
    /// The matched route's name.
    pub route: &'a str,
    /// The consumer the API key maps to, if any.
    pub consumer: Option<&'a Consumer>,
    /// The body's top-level fields, when a limit keys on them.
    pub body: Option<&'a BodyFields>,
    /// The caller's verified token, when `[jwt]` found one.
    pub token: Option<&'a Verified>,
}

/// The digest of `parts` for this request, or `None` when a part is absent.
pub fn extract(parts: &[KeyPart], request: &Parts, facts: &RequestFacts<'_>) -> Option<LimitKey> {
    // Each part's bytes are borrowed from the request where possible; IP
    // networks are encoded into a small stack buffer.
    let mut ip_buf = [0u8; 17];
    let ip_len = encode_net(facts.client, &mut ip_buf);
    let ip = &ip_buf[..ip_len];
    // One part, the common key (`ip`, one header): no array of values to
    // fill (~40 instructions a request).
    if let [part] = parts {
        return Some(LimitKey::digest(&[part_value(part, ip, request, facts)?]));
    }
    let mut values: [&[u8]; 8] = [&[]; 8];
    if parts.len() > values.len() {
        return None;
    }
    for (slot, part) in values.iter_mut().zip(parts) {
        *slot = part_value(part, ip, request, facts)?;
    }
    Some(LimitKey::digest(&values[..parts.len()]))
}

/// The bytes of one part of a key (`ip`: the encoded client network), or
/// `None` when the request lacks it.
#[inline(always)]
fn part_value<'a>(
    part: &'a KeyPart,
    ip: &'a [u8],
    request: &'a Parts,
    facts: &RequestFacts<'a>,
) -> Option<&'a [u8]> {
    Some(match part {
        KeyPart::Ip => ip,
        KeyPart::Header(name) => request.headers.get(name)?.as_bytes(),
        KeyPart::Query(name) => query_value(request.uri.query()?, name)?,
        KeyPart::Cookie(name) => cookie_value(&request.headers, name)?,
        KeyPart::Route => facts.route.as_bytes(),
        KeyPart::BodyField(name) => facts.body?.get(name)?,
        KeyPart::Consumer => facts.consumer?.consumer.as_bytes(),
        KeyPart::Tenant => facts.consumer?.tenant.as_deref()?.as_bytes(),
        KeyPart::Claim { slot, .. } => facts.token?.claim(*slot)?,
    })
}

/// The key of an Envoy descriptor's limits: its entries' keys and values,
/// in order, each length-prefixed, then `extra` (an override's numbers,
/// so that its state is apart). The decision service charges under it and
/// the explain endpoint reads it.
pub(crate) fn descriptor_digest<'e>(
    entries: impl Iterator<Item = (&'e str, &'e str)>,
    extra: &[&[u8]],
) -> LimitKey {
    let mut parts: smallvec::SmallVec<[&[u8]; 8]> = smallvec::SmallVec::new();
    for (key, value) in entries {
        parts.push(key.as_bytes());
        parts.push(value.as_bytes());
    }
    parts.extend_from_slice(extra);
    LimitKey::digest(&parts)
}

/// The digest a request would be counted under, from the values an operator
/// gives for each part of `parts` (in order): an address for `ip` (masked as
/// the client's would be, by `client`), the consumer or tenant name for
/// `consumer`/`tenant`, the route name for `route`, and the raw header,
/// query, cookie or body value otherwise. Used to explain a key's state
/// (`/limits/NAME` on the admin listener) without the operator computing
/// digests by hand; an `Err` says which value is wrong.
pub(crate) fn digest_values(
    parts: &[KeyPart],
    values: &[&str],
    client: impl Fn(IpAddr) -> IpNet,
) -> Result<LimitKey, String> {
    if values.len() != parts.len() {
        return Err(format!(
            "this limit's key has {} part(s), so give {} `key` value(s) in its order",
            parts.len(),
            parts.len()
        ));
    }
    let mut bufs = [[0u8; 17]; 8];
    let mut lens = [0usize; 8];
    if parts.len() > bufs.len() {
        return Err("a key has at most 8 parts".to_owned());
    }
    for (i, (part, value)) in parts.iter().zip(values).enumerate() {
        if *part == KeyPart::Ip {
            let ip: IpAddr = value
                .trim_matches(|c| c == '[' || c == ']')
                .parse()
                .map_err(|_| format!("`{value}` is not an IP address (the `ip` part)"))?;
            lens[i] = encode_net(client(ip), &mut bufs[i]);
        }
    }
    let mut slices: [&[u8]; 8] = [&[]; 8];
    for (i, (part, value)) in parts.iter().zip(values).enumerate() {
        slices[i] = if *part == KeyPart::Ip {
            &bufs[i][..lens[i]]
        } else {
            value.as_bytes()
        };
    }
    Ok(LimitKey::digest(&slices[..parts.len()]))
}

/// A request lacks the key of a limit with `on_missing_key = "deny"`: the
/// gateway answers 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MissingKey;

/// The key `limit` counts this request under, with its `on_missing_key`
/// applied: `Ok(None)` skips the limit. The one rule the gateway's limit step
/// and `simulate` share. A shadow limit never denies, so `"deny"` skips it
/// too (the gateway counts that `shadow_denied`).
pub(crate) fn limit_key(
    limit: &LimitConfig,
    request: &Parts,
    facts: &RequestFacts<'_>,
) -> Result<Option<LimitKey>, MissingKey> {
    match (extract(&limit.key, request, facts), limit.on_missing_key) {
        (Some(key), _) => Ok(Some(key)),
        (None, OnMissingKey::Skip) => Ok(None),
        (None, OnMissingKey::Shared) => Ok(Some(shared_key())),
        (None, OnMissingKey::Deny) if limit.shadow => Ok(None),
        (None, OnMissingKey::Deny) => Err(MissingKey),
    }
}

/// The request lacked the key of a shadow limit that would have refused it
/// for that (`on_missing_key = "deny"`): given the key `limit_key` returned.
pub(crate) fn shadow_missing_key(limit: &LimitConfig, key: Option<LimitKey>) -> bool {
    key.is_none() && limit.shadow && limit.on_missing_key == OnMissingKey::Deny
}

/// The key every request without its key shares (`on_missing_key = "shared"`).
pub(crate) fn shared_key() -> LimitKey {
    // A NUL byte cannot occur in a header, query or cookie value as received.
    LimitKey::digest(&[b"\0missing"])
}

/// Network address then prefix length: 4+1 or 16+1 bytes.
fn encode_net(net: IpNet, buf: &mut [u8; 17]) -> usize {
    match net.network() {
        IpAddr::V4(v4) => {
            buf[..4].copy_from_slice(&v4.octets());
            buf[4] = net.prefix_len();
            5
        }
        IpAddr::V6(v6) => {
            buf[..16].copy_from_slice(&v6.octets());
            buf[16] = net.prefix_len();
            17
        }
    }
}

/// The raw value of the first `name=value` pair in a query string.
fn query_value<'q>(query: &'q str, name: &str) -> Option<&'q [u8]> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name && !value.is_empty()).then_some(value.as_bytes())
    })
}

/// The value of cookie `name` in any `Cookie` header.
pub(crate) fn cookie_value<'h>(headers: &'h http::HeaderMap, name: &str) -> Option<&'h [u8]> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .flat_map(|header| header.as_bytes().split(|b| *b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            let eq = pair.iter().position(|b| *b == b'=')?;
            let (key, value) = (&pair[..eq], &pair[eq + 1..]);
            (key == name.as_bytes() && !value.is_empty()).then_some(value)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderName;

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut builder = http::Request::get(uri);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        builder.body(()).unwrap().into_parts().0
    }

    fn facts() -> RequestFacts<'static> {
        RequestFacts {
            client: "192.0.2.7/32".parse().unwrap(),
            route: "r",
            consumer: None,
            body: None,
            token: None,
        }
    }

    #[test]
    fn same_values_same_key_different_values_different_key() {
        let key = [KeyPart::Header(HeaderName::from_static("x-api-key"))];
        let a = extract(&key, &parts("/", &[("x-api-key", "k1")]), &facts());
        let b = extract(&key, &parts("/x", &[("x-api-key", "k1")]), &facts());
        let c = extract(&key, &parts("/", &[("x-api-key", "k2")]), &facts());
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(extract(&key, &parts("/", &[]), &facts()), None);
    }

    #[test]
    fn query_and_cookie_values() {
        let query = [KeyPart::Query("user".into())];
        let a = extract(&query, &parts("/?a=1&user=bob", &[]), &facts());
        let b = extract(&query, &parts("/?user=bob", &[]), &facts());
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_eq!(
            extract(&query, &parts("/?username=bob", &[]), &facts()),
            None
        );
        let cookie = [KeyPart::Cookie("sid".into())];
        let a = extract(
            &cookie,
            &parts("/", &[("cookie", "a=1; sid=xyz")]),
            &facts(),
        );
        let b = extract(&cookie, &parts("/", &[("cookie", "sid=xyz")]), &facts());
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_eq!(
            extract(&cookie, &parts("/", &[("cookie", "xsid=1")]), &facts()),
            None
        );
    }

    #[test]
    fn composite_keys_do_not_collide_by_concatenation() {
        let key = [
            KeyPart::Header(HeaderName::from_static("a")),
            KeyPart::Header(HeaderName::from_static("b")),
        ];
        let one = extract(&key, &parts("/", &[("a", "xy"), ("b", "z")]), &facts());
        let two = extract(&key, &parts("/", &[("a", "x"), ("b", "yz")]), &facts());
        assert_ne!(one, two);
    }

    #[test]
    fn ip_keys_follow_the_masked_network() {
        let key = [KeyPart::Ip];
        let mut f = facts();
        let a = extract(&key, &parts("/", &[]), &f);
        f.client = "192.0.2.8/32".parse().unwrap();
        assert_ne!(a, extract(&key, &parts("/", &[]), &f));
    }
}
