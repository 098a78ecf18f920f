//! Parsing one entry of a forwarding header into an IP address.
//!
//! This module owns the byte-level grammar of `X-Forwarded-For` entries and
//! RFC 7239 `Forwarded` elements; `client_ip` (which uses it) owns the *trust* walk
//! over them. Keeping the two apart lets the walk be read (and reviewed for
//! spoofing) without the parsing noise, and lets the fuzz target hammer the
//! parser through the public walk.
//!
//! Everything here is allocation-free: entries are borrowed slices of the
//! header value, and the one place that must rewrite bytes (unescaping an
//! RFC 7239 quoted-string) uses a fixed stack buffer.
//!
//! # What parses
//!
//! After trimming optional whitespace (SP / HTAB), a *node* is one of
//! `1.2.3.4`, `1.2.3.4:5678`, `2001:db8::1`, `[2001:db8::1]`, `[2001:db8::1]:443`.
//! A port must be 1–5 digits no larger than 65535; in `Forwarded` an
//! obfuscated port (`_abc`, RFC 7239 §6.3) is also accepted, since the address
//! in front of it is still real. Anything else — hostnames, `unknown`,
//! obfuscated identifiers such as `_hidden`, zone ids (`fe80::1%eth0`), bytes
//! that are not UTF-8 — does not parse, and the caller treats it as the end of
//! the trustworthy part of the list.

use std::net::{IpAddr, Ipv6Addr};

/// Longest quoted `for=` value we unescape. The longest real node,
/// `[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:65535`, is 53 bytes;
/// anything longer cannot be an address we would accept anyway.
const MAX_QUOTED_NODE: usize = 64;

/// Optional whitespace per RFC 9110 §5.6.3.
fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

/// `raw` without leading and trailing SP / HTAB.
pub(crate) fn trim_ows(raw: &[u8]) -> &[u8] {
    let start = raw.iter().position(|&b| !is_ows(b)).unwrap_or(raw.len());
    let end = raw
        .iter()
        .rposition(|&b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &raw[start..end]
}

/// IPv4-mapped IPv6 (`::ffff:1.2.3.4`) as the IPv4 address it carries, so that
/// a dual-stack listener and an IPv4 proxy name the same client the same way.
#[inline]
pub(crate) fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// A port: 1–5 ASCII digits whose value fits in 16 bits, or — only where
/// `allow_obfuscated` (RFC 7239 `obfport`) — `_` followed by at least one of
/// ALPHA / DIGIT / `.` / `_` / `-`.
fn is_port(raw: &[u8], allow_obfuscated: bool) -> bool {
    match raw {
        [b'_', rest @ ..] if allow_obfuscated => {
            !rest.is_empty()
                && rest
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        _ => {
            (1..=5).contains(&raw.len())
                && raw.iter().all(u8::is_ascii_digit)
                && raw
                    .iter()
                    .fold(0u32, |acc, &d| acc * 10 + u32::from(d - b'0'))
                    <= u32::from(u16::MAX)
        }
    }
}

/// A node as described in the module doc, normalised; `None` if it is not
/// an IP address.
pub(crate) fn parse_node(raw: &[u8], allow_obfuscated_port: bool) -> Option<IpAddr> {
    let raw = trim_ows(raw);
    if let [b'[', rest @ ..] = raw {
        // Bracketed IPv6, optionally followed by `:port`.
        let close = rest.iter().position(|&b| b == b']')?;
        let inner = std::str::from_utf8(&rest[..close]).ok()?;
        let after = &rest[close + 1..];
        let port_ok = match after {
            [] => true,
            [b':', port @ ..] => is_port(port, allow_obfuscated_port),
            _ => false,
        };
        if !port_ok {
            return None;
        }
        return inner
            .parse::<Ipv6Addr>()
            .ok()
            .map(|v6| normalize(v6.into()));
    }
    let text = std::str::from_utf8(raw).ok()?;
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(normalize(ip));
    }
    // `1.2.3.4:port`. A bare IPv6 address cannot carry a port without
    // brackets (the last group would be ambiguous), so only IPv4 is tried.
    let (host, port) = text.rsplit_once(':')?;
    if !is_port(port.as_bytes(), allow_obfuscated_port) {
        return None;
    }
    host.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

/// One `X-Forwarded-For` entry (already split at commas).
pub(crate) fn parse_xff_entry(entry: &[u8]) -> Option<IpAddr> {
    parse_node(entry, false)
}

/// The address in the `for=` parameter of one RFC 7239 forwarded-element
/// (already split at commas).
///
/// The element does not parse when it has no `for` parameter, more than one
/// (RFC 7239 §4 forbids repeats, and picking one would let whoever wrote the
/// element choose), a quoted value that is unterminated or followed by junk,
/// or a value that is not a node. Parameters other than `for` are skipped
/// without validating them: a proxy's odd `host=` or `proto=` spelling should
/// not cost us the address it recorded.
pub(crate) fn parse_forwarded_element(element: &[u8]) -> Option<IpAddr> {
    let mut found: Option<IpAddr> = None;
    let mut seen_for = false;
    let mut rest = element;
    loop {
        rest = trim_ows(rest);
        if rest.is_empty() {
            break;
        }
        // Empty pairs (`;;`) are allowed by the grammar.
        if let [b';', tail @ ..] = rest {
            rest = tail;
            continue;
        }
        let name_end = rest
            .iter()
            .position(|&b| b == b'=' || b == b';')
            .unwrap_or(rest.len());
        let name = trim_ows(&rest[..name_end]);
        let is_for = name.eq_ignore_ascii_case(b"for");
        if rest.get(name_end) != Some(&b'=') {
            // A pair without a value. A bare `for` is a malformed `for`.
            if is_for {
                return None;
            }
            rest = &rest[name_end..];
            continue;
        }
        let value_start = trim_ows(&rest[name_end + 1..]);
        let (value, after) = split_value(value_start)?;
        if is_for {
            if seen_for {
                return None;
            }
            seen_for = true;
            found = match value {
                Value::Plain(v) => parse_node(v, true),
                Value::Quoted(v) => unescape_and_parse(v),
            };
            // Keep scanning: a second `for` must still invalidate the element.
            found?;
        }
        rest = after;
    }
    found
}

/// A parameter value as it appears on the wire.
enum Value<'a> {
    /// Unquoted; the bytes up to the next `;` (lenient: RFC 7239 wants a
    /// token, but proxies commonly write `host=example.com:8080` unquoted).
    Plain(&'a [u8]),
    /// The inside of a quoted-string, still escaped.
    Quoted(&'a [u8]),
}

/// Splits a value off the front of `raw`, returning it and what follows it
/// (starting at the next `;` or the end). `None` for an unterminated quoted
/// string or junk between a closing quote and the next `;`.
fn split_value(raw: &[u8]) -> Option<(Value<'_>, &[u8])> {
    if let [b'"', inner @ ..] = raw {
        let mut i = 0;
        while i < inner.len() {
            match inner[i] {
                b'\\' => i += 2,
                b'"' => {
                    let after = trim_ows(&inner[i + 1..]);
                    if !after.is_empty() && after[0] != b';' {
                        return None;
                    }
                    return Some((Value::Quoted(&inner[..i]), after));
                }
                _ => i += 1,
            }
        }
        None
    } else {
        let end = raw.iter().position(|&b| b == b';').unwrap_or(raw.len());
        Some((Value::Plain(&raw[..end]), &raw[end..]))
    }
}

/// Removes quoted-pair escapes into a stack buffer and parses the node.
fn unescape_and_parse(escaped: &[u8]) -> Option<IpAddr> {
    let mut buf = [0u8; MAX_QUOTED_NODE];
    let mut len = 0;
    let mut bytes = escaped.iter();
    while let Some(&b) = bytes.next() {
        let b = if b == b'\\' { *bytes.next()? } else { b };
        *buf.get_mut(len)? = b;
        len += 1;
    }
    parse_node(&buf[..len], true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().expect("test literal"))
    }

    #[test]
    fn nodes() {
        let cases: &[(&str, Option<IpAddr>)] = &[
            ("1.2.3.4", ip("1.2.3.4")),
            ("  1.2.3.4\t", ip("1.2.3.4")),
            ("1.2.3.4:5678", ip("1.2.3.4")),
            ("1.2.3.4:65535", ip("1.2.3.4")),
            ("1.2.3.4:65536", None),
            ("1.2.3.4:", None),
            ("1.2.3.4:123456", None),
            ("1.2.3.4:_obf", None), // obfuscated ports only in Forwarded
            ("2001:db8::1", ip("2001:db8::1")),
            ("[2001:db8::1]", ip("2001:db8::1")),
            ("[2001:db8::1]:443", ip("2001:db8::1")),
            ("[2001:db8::1]443", None),
            ("[2001:db8::1", None),
            ("[1.2.3.4]", None),
            ("::ffff:1.2.3.4", ip("1.2.3.4")),
            ("[::ffff:1.2.3.4]:80", ip("1.2.3.4")),
            ("fe80::1%eth0", None),
            ("unknown", None),
            ("_hidden", None),
            ("example.com", None),
            ("example.com:80", None),
            ("", None),
            ("1.2.3", None),
            ("01.2.3.4", None),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_xff_entry(raw.as_bytes()), *want, "entry {raw:?}");
        }
        assert_eq!(parse_xff_entry(b"1.2.3.\xff"), None);
    }

    #[test]
    fn forwarded_elements() {
        let cases: &[(&str, Option<IpAddr>)] = &[
            ("for=192.0.2.60", ip("192.0.2.60")),
            ("For=192.0.2.60", ip("192.0.2.60")),
            ("for = 192.0.2.60", ip("192.0.2.60")),
            ("for=\"192.0.2.60\"", ip("192.0.2.60")),
            ("for=\"[2001:db8:cafe::17]:4711\"", ip("2001:db8:cafe::17")),
            ("for=\"[2001:db8:cafe::17]:_port\"", ip("2001:db8:cafe::17")),
            (
                "for=192.0.2.60;proto=http;by=203.0.113.43",
                ip("192.0.2.60"),
            ),
            ("proto=https;for=192.0.2.60", ip("192.0.2.60")),
            ("for=1.2.3.4;host=example.com:8080", ip("1.2.3.4")),
            ("for=1.2.3.4;secure", ip("1.2.3.4")),
            ("host=\"a;for=9.9.9.9\";for=1.2.3.4", ip("1.2.3.4")),
            ("for=\"\\1.2.3.4\"", ip("1.2.3.4")),
            (";;for=1.2.3.4;", ip("1.2.3.4")),
            ("for=unknown", None),
            ("for=_hidden", None),
            ("for=\"_gazonk\"", None),
            ("for=\"1.2.3.4", None),
            ("for=\"1.2.3.4\"x", None),
            ("for=1.2.3.4;for=5.6.7.8", None),
            ("for", None),
            ("by=1.2.3.4", None),
            ("proto=https", None),
            ("1.2.3.4", None),
            ("for=", None),
            ("for=\"\"", None),
        ];
        for (raw, want) in cases {
            assert_eq!(
                parse_forwarded_element(raw.as_bytes()),
                *want,
                "element {raw:?}"
            );
        }
        let long = format!("for=\"[::1]:_{}\"", "a".repeat(80));
        assert_eq!(parse_forwarded_element(long.as_bytes()), None);
    }

    #[test]
    fn trims_only_ows() {
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
        assert_eq!(trim_ows(b"   "), b"");
        assert_eq!(trim_ows(b""), b"");
    }
}
