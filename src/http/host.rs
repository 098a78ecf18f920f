//! The one rule for a request's host: the `Host` field (RFC 9110 §7.2), the
//! authority of an absolute-form or authority-form target (RFC 9112 §3.2.2,
//! §3.2.3) and HTTP/2's `:authority` (RFC 9113 §8.3.1) are all
//! `uri-host [ ":" port ]` (RFC 3986 §3.2.2, §3.2.3), read here the same way.
//!
//! A value is accepted when it is, exactly:
//!
//! - a **reg-name** of unreserved and sub-delims bytes (`A-Z a-z 0-9 - . _ ~
//!   ! $ & ' ( ) * + , ; =`), at most [`MAX_NAME`] bytes, with no empty label
//!   (`a..b`, `.a`, `.`) but one trailing dot allowed (`example.com.`, a
//!   fully qualified name);
//! - or an **IPv4address**, dotted-decimal of four octets 0–255 without
//!   leading zeros (`10.0.0.1`): a name whose last label is a number
//!   (`1.2.3.256`, `127.1`, `0x7f.1`, `a.123`) must be one, because other
//!   platforms read such names as addresses in other ways (RFC 3986 §7.4);
//! - or an **IP-literal** holding an IPv6 address, `[::1]`;
//! - each optionally followed by `:` and a port of digits whose value is at
//!   most 65535 (leading zeros are the same number, as hyper reads them).
//!
//! Refused, though RFC 3986's grammar has them, so that the gateway never
//! accepts a host the next hop could read as another one:
//!
//! - **pct-encoded** bytes (`ex%41mple.com`): `http::uri::Authority`, which
//!   hyper and h2 read targets and `:authority` with, refuses them, and
//!   routes compare hosts as bytes, so `ex%41mple.com` would be a second
//!   spelling of `example.com` that a `host` route does not match;
//! - an **empty port** (`example.com:`): RFC 3986 allows `port = *DIGIT` but
//!   tells producers to omit the colon; no client sends one, and it is
//!   another spelling of the same host (hyper accepts it);
//! - **IPvFuture** (`[v1.x]`): no such version is defined, and no next hop
//!   could tell what it names; an IPv6 zone (`[fe80::1%25eth0]`, RFC 6874)
//!   has no meaning beyond the client's own link;
//! - an **empty** value: RFC 9112 §3.2 has it for a target URI without an
//!   authority, which an `http` or `https` URI never is (RFC 9110 §4.2.1: a
//!   recipient must reject an empty host).
//!
//! Everything else — userinfo (`a@b`), `/`, `?`, `#`, spaces, control bytes,
//! obs-text and UTF-8, a second colon, an unclosed bracket — is not in the
//! grammar at all. Every request pays the check, so the shapes nearly all
//! hosts have (a name, an IPv4 address, a port) are read in one pass with
//! no allocation; anything else — an IP literal, a trailing dot, a value
//! refused — is read again by the rule as written above, which alone says
//! why a value is refused.

use std::net::Ipv6Addr;

/// The longest reg-name accepted: RFC 3986 §3.2.2 asks URI producers to
/// keep names to 255 bytes, as DNS does.
pub(crate) const MAX_NAME: usize = 255;

/// A host value the rule accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPort<'a> {
    /// The host as sent: a reg-name, an IPv4 address, or an IPv6 literal
    /// with its brackets.
    pub host: &'a [u8],
    /// The port, if one was given.
    pub port: Option<u16>,
}

/// Why a host value is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Nothing before the port (or at all): `""`, `:80`, `::1`.
    #[error("the host is empty")]
    Empty,
    /// A byte no reg-name holds: `@`, `/`, `?`, `#`, a space, a control
    /// byte, obs-text (UTF-8 too), `[` or `]` out of place.
    #[error("the host has a byte no host name holds")]
    Byte,
    /// `%`: pct-encoding is refused (see the module doc).
    #[error("the host is percent-encoded")]
    PercentEncoded,
    /// `a..b`, `.a`, `.`: a label with nothing in it.
    #[error("the host has an empty label")]
    EmptyLabel,
    /// Longer than [`MAX_NAME`].
    #[error("the host name is longer than 255 bytes")]
    TooLong,
    /// The last label is a number, but the name is no dotted-decimal IPv4
    /// address: `1.2.3.256`, `127.1`, `0x7f.1`, `01.2.3.4`.
    #[error("the host looks like an IPv4 address but is not one")]
    NotIpv4,
    /// `[...]` that is no IPv6 address: unclosed, IPvFuture, a zone, a
    /// byte after `]` other than `:`.
    #[error("the host's IP literal is not an IPv6 address in brackets")]
    IpLiteral,
    /// `host:` with nothing after the colon.
    #[error("the port is empty")]
    EmptyPort,
    /// A port that is not all digits: `a:abc`, `a:+80`, `a:b:c`.
    #[error("the port is not a number")]
    PortNotDigits,
    /// A port over 65535.
    #[error("the port is larger than 65535")]
    PortTooLarge,
}

/// Byte classes of a reg-name, one table lookup per byte.
const NAME: u8 = 1;
const DIGIT: u8 = 2;
const HEX: u8 = 4;
const NOT_NUMBER: u8 = 8;
const STOP: u8 = 16;

/// [`NAME`]: unreserved and sub-delims (RFC 3986 §2.2, §2.3); [`DIGIT`];
/// [`HEX`]: hex digits; [`NOT_NUMBER`]: a name byte that is neither a
/// digit nor the dot (a label with one is no decimal number); [`STOP`]:
/// the dot and every byte no name holds, where the one pass of `common`
/// has more to do than note the byte.
static CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        let mut class = 0;
        if c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            )
        {
            class |= NAME;
        }
        if c.is_ascii_digit() {
            class |= DIGIT;
        }
        if c.is_ascii_hexdigit() {
            class |= HEX;
        }
        if class & NAME != 0 && !c.is_ascii_digit() && c != b'.' {
            class |= NOT_NUMBER;
        }
        if class & NAME == 0 || c == b'.' {
            class |= STOP;
        }
        table[b] = class;
        b += 1;
    }
    table
};

/// Reads `value` as `uri-host [ ":" port ]` by the rule of the module doc.
pub fn parse(value: &[u8]) -> Result<HostPort<'_>, HostError> {
    match common(value) {
        Some(host) => Ok(host),
        None => by_rule(value),
    }
}

/// The shapes nearly every host has, each read in one pass: a
/// dotted-decimal IPv4 address, or a reg-name whose last label is no
/// number, with an optional port. `None` for everything else (an IP
/// literal, a trailing dot, a last label that may be hex, any value
/// refused), which [`by_rule`] reads; what comes out is what `by_rule`
/// makes of the value (a test compares them over every short value of the
/// bytes that matter). The rule's several passes and iterator adapters
/// cost ~550 instructions on `127.0.0.1:8080`, which every request sends.
#[inline]
fn common(value: &[u8]) -> Option<HostPort<'_>> {
    let end = match value.first() {
        Some(b'0'..=b'9') => ipv4_prefix(value).or_else(|| name_prefix(value))?,
        _ => name_prefix(value)?,
    };
    let (host, rest) = value.split_at(end);
    let port = match rest {
        [] => None,
        [b':', digits @ ..] => Some(short_port(digits)?),
        _ => return None,
    };
    Some(HostPort { host, port })
}

/// The length of the dotted-decimal IPv4 address `value` starts with.
fn ipv4_prefix(value: &[u8]) -> Option<usize> {
    let mut end = dec_octet(value)?;
    for _ in 0..3 {
        if value.get(end) != Some(&b'.') {
            return None;
        }
        end += 1 + dec_octet(&value[end + 1..])?;
    }
    Some(end)
}

/// The length of the `dec-octet` (RFC 3986 §3.2.2: 0–255, no leading
/// zero) `bytes` starts with, the longest one.
fn dec_octet(bytes: &[u8]) -> Option<usize> {
    match *bytes {
        [b'1', b'0'..=b'9', b'0'..=b'9', ..]
        | [b'2', b'0'..=b'4', b'0'..=b'9', ..]
        | [b'2', b'5', b'0'..=b'5', ..] => Some(3),
        [b'1'..=b'9', b'0'..=b'9', ..] => Some(2),
        [b'0'..=b'9', ..] => Some(1),
        _ => None,
    }
}

/// The length of the reg-name `value` starts with, if its labels are not
/// empty, it has no trailing dot, and its last label is no number.
fn name_prefix(value: &[u8]) -> Option<usize> {
    // The current label: where it starts, and its bytes' classes or-ed.
    let mut label = 0;
    let mut classes = 0;
    let mut end = 0;
    while let Some(&b) = value.get(end) {
        let class = CLASS[usize::from(b)];
        if class & STOP == 0 {
            classes |= class;
        } else if b == b'.' && end != label {
            label = end + 1;
            classes = 0;
        } else {
            break;
        }
        end += 1;
    }
    // Empty, a trailing dot (or an empty label: the loop stopped at it),
    // too long, or a last label that is (or may be) a number.
    if label == end
        || end > MAX_NAME
        || classes & NOT_NUMBER == 0
        || matches!(value[label..end], [b'0', b'x' | b'X', ..])
    {
        return None;
    }
    Some(end)
}

/// A port of one to five digits, at most 65535: [`parse_port`] without
/// the saturating arithmetic a longer one needs.
fn short_port(digits: &[u8]) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 {
        return None;
    }
    let mut value = 0u32;
    for &b in digits {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        value = value * 10 + u32::from(digit);
    }
    u16::try_from(value).ok()
}

/// [`parse`] by the rule as the module doc writes it, step by step. Out of
/// line: [`parse`] stays small for the common shapes.
#[cold]
#[inline(never)]
fn by_rule(value: &[u8]) -> Result<HostPort<'_>, HostError> {
    let (host, port) = if value.first() == Some(&b'[') {
        let end = value
            .iter()
            .position(|&b| b == b']')
            .ok_or(HostError::IpLiteral)?;
        ipv6_literal(&value[1..end])?;
        match &value[end + 1..] {
            [] => (&value[..=end], None),
            [b':', port @ ..] => (&value[..=end], Some(port)),
            _ => return Err(HostError::IpLiteral),
        }
    } else {
        let (host, port) = match value.iter().position(|&b| b == b':') {
            Some(colon) => (&value[..colon], Some(&value[colon + 1..])),
            None => (value, None),
        };
        reg_name(host)?;
        (host, port)
    };
    let port = match port {
        None => None,
        Some(digits) => Some(parse_port(digits)?),
    };
    Ok(HostPort { host, port })
}

/// Whether `value` is a host the rule accepts.
pub(crate) fn is_valid(value: &[u8]) -> bool {
    parse(value).is_ok()
}

impl HostPort<'_> {
    /// Whether two hosts name the same origin after the scheme-based
    /// normalisation RFC 9113 §8.3.1 asks of a proxy (RFC 3986 §6.2.3): the
    /// host compared without letter case, a port equal to the scheme's
    /// `default_port` the same as none.
    pub(crate) fn same_as(&self, other: &HostPort<'_>, default_port: Option<u16>) -> bool {
        self.host.eq_ignore_ascii_case(other.host)
            && self.port.or(default_port) == other.port.or(default_port)
    }
}

/// The host rule of an HTTP/2 request (RFC 9113 §8.3.1, RFC 9110 §7.2),
/// given its URI (`:scheme`, `:authority`, `:path`) and fields: an
/// `:authority`, when there is one, is a valid host; at most one `Host`,
/// valid, and naming the same origin as `:authority` when both are there;
/// and one of the two at all. h2 has already refused an `:authority` that
/// `http::uri::Authority` cannot read (a stream error), so this sees only
/// what that parser lets through: userinfo, a port that is no number.
/// `Err` is the reason, for a 400.
pub(crate) fn check_http2_request(
    uri: &http::Uri,
    headers: &http::HeaderMap,
) -> Result<(), &'static str> {
    let authority = match uri.authority() {
        Some(authority) => Some(
            parse(authority.as_str().as_bytes())
                .map_err(|_| "the :authority is not a valid host")?,
        ),
        None => None,
    };
    let mut fields = headers.get_all(http::header::HOST).iter();
    let field = fields.next();
    if fields.next().is_some() {
        return Err("the request has more than one Host header");
    }
    let Some(field) = field else {
        return match authority {
            Some(_) => Ok(()),
            None => Err("the request has neither :authority nor Host"),
        };
    };
    let host = parse(field.as_bytes()).map_err(|_| "the Host header is not a valid host")?;
    let default_port = match uri.scheme_str() {
        Some("http") => Some(80),
        Some("https") => Some(443),
        _ => None,
    };
    match authority {
        Some(authority) if !authority.same_as(&host, default_port) => {
            Err("the Host header names another host than :authority")
        }
        _ => Ok(()),
    }
}

/// A reg-name or IPv4 address (they share the grammar; the last label
/// decides which it must be).
fn reg_name(name: &[u8]) -> Result<(), HostError> {
    if name.is_empty() {
        return Err(HostError::Empty);
    }
    if name.len() > MAX_NAME {
        return Err(HostError::TooLong);
    }
    // One pass: every byte's class, and where the last label starts. A
    // label is empty where a dot follows a dot or starts the name.
    let mut previous = b'.';
    let mut last_label = 0;
    for (i, &b) in name.iter().enumerate() {
        if CLASS[usize::from(b)] & NAME == 0 {
            return Err(if b == b'%' {
                HostError::PercentEncoded
            } else {
                HostError::Byte
            });
        }
        if b == b'.' {
            if previous == b'.' {
                return Err(HostError::EmptyLabel);
            }
            last_label = i + 1;
        }
        previous = b;
    }
    let last = if last_label == name.len() {
        // One trailing dot: the root of a fully qualified name.
        let labels = &name[..name.len() - 1];
        &labels[labels.iter().rposition(|&b| b == b'.').map_or(0, |i| i + 1)..]
    } else {
        &name[last_label..]
    };
    if is_numeric_label(last) && !is_ipv4(name) {
        return Err(HostError::NotIpv4);
    }
    Ok(())
}

/// A label some platform reads as a number (RFC 3986 §7.4, and the WHATWG
/// URL standard's "ends in a number"): decimal digits, or `0x` and hex.
fn is_numeric_label(label: &[u8]) -> bool {
    let all = |bytes: &[u8], class: u8| bytes.iter().all(|&b| CLASS[usize::from(b)] & class != 0);
    match label {
        [b'0', b'x' | b'X', hex @ ..] => all(hex, HEX),
        _ => !label.is_empty() && all(label, DIGIT),
    }
}

/// `IPv4address = dec-octet "." dec-octet "." dec-octet "." dec-octet`,
/// a dec-octet 0–255 without leading zeros (RFC 3986 §3.2.2).
fn is_ipv4(name: &[u8]) -> bool {
    let mut octets = 0;
    let decimal = |octet: &[u8]| match octet {
        [b'0'] => true,
        [b'1'..=b'9', ..] if octet.len() <= 3 && octet.iter().all(u8::is_ascii_digit) => {
            octet
                .iter()
                .fold(0u16, |n, &d| n * 10 + u16::from(d - b'0'))
                <= 255
        }
        _ => false,
    };
    name.split(|&b| b == b'.').all(|octet| {
        octets += 1;
        decimal(octet)
    }) && octets == 4
}

/// The inside of `[...]`: an IPv6 address (RFC 3986's `IPv6address`, which
/// the standard library's parser reads: hex groups, one `::`, an IPv4 tail).
fn ipv6_literal(inside: &[u8]) -> Result<(), HostError> {
    std::str::from_utf8(inside)
        .ok()
        .and_then(|text| text.parse::<Ipv6Addr>().ok())
        .map(|_| ())
        .ok_or(HostError::IpLiteral)
}

/// `port = *DIGIT`, but not empty, and at most 65535.
fn parse_port(digits: &[u8]) -> Result<u16, HostError> {
    if digits.is_empty() {
        return Err(HostError::EmptyPort);
    }
    let mut value: u32 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return Err(HostError::PortNotDigits);
        }
        // Saturating: a long run of digits stays over the limit.
        value = value.saturating_mul(10).saturating_add(u32::from(b - b'0'));
    }
    u16::try_from(value).map_err(|_| HostError::PortTooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value of the table, with why it is accepted or refused.
    #[test]
    fn hosts_accepted_and_refused() {
        let long_name = format!("{}.com", "a".repeat(MAX_NAME - 4));
        let too_long = format!("{}.com", "a".repeat(MAX_NAME - 3));
        let accepted: &[(&str, &str)] = &[
            ("example.com", "a reg-name"),
            ("EXAMPLE.com", "letter case is the client's"),
            ("localhost", "one label"),
            ("a", "one byte"),
            ("example.com.", "one trailing dot: a fully qualified name"),
            ("a-b_c~d", "unreserved bytes"),
            ("a!$&'()*+,;=b", "sub-delims are reg-name bytes"),
            ("example.com:0", "port 0 is a number up to 65535"),
            ("example.com:80", "a port"),
            ("example.com:65535", "the largest port"),
            ("example.com:080", "leading zeros are the same number"),
            ("10.0.0.1", "an IPv4 address"),
            ("0.0.0.0:8080", "an IPv4 address and a port"),
            ("255.255.255.255", "the largest IPv4 address"),
            ("[::1]", "an IPv6 literal"),
            ("[::1]:80", "an IPv6 literal and a port"),
            ("[2001:DB8::1]", "IPv6 hex in upper case"),
            ("[::ffff:192.0.2.1]", "IPv6 with an IPv4 tail"),
            ("[1:2:3:4:5:6:7:8]", "eight groups"),
            ("1a.example", "a label may start with a digit"),
            (
                "0x.example",
                "a label that is not the last may look like hex",
            ),
            (&long_name, "255 bytes"),
        ];
        for (value, why) in accepted {
            assert!(
                parse(value.as_bytes()).is_ok(),
                "{value:?} ({why}): {:?}",
                parse(value.as_bytes())
            );
        }
        use HostError::*;
        let refused: &[(&[u8], HostError, &str)] = &[
            (b"", Empty, "nothing"),
            (b":80", Empty, "a port without a host"),
            (b"::1", Empty, "IPv6 without brackets"),
            (
                b"example.com:",
                EmptyPort,
                "an empty port: another spelling",
            ),
            (b"example.com:65536", PortTooLarge, "over 65535"),
            (b"example.com:99999", PortTooLarge, "over 65535"),
            (
                b"example.com:99999999999999999999999",
                PortTooLarge,
                "far over",
            ),
            (b"example.com:abc", PortNotDigits, "not digits"),
            (
                b"example.com:+80",
                PortNotDigits,
                "a sign (u16::from_str takes it)",
            ),
            (b"example.com:-1", PortNotDigits, "a sign"),
            (b"example.com:8 0", PortNotDigits, "a space"),
            (b"a:b:c", PortNotDigits, "a second colon"),
            (b"example.com::80", PortNotDigits, "two colons"),
            (b":", Empty, "a colon alone"),
            (b"[::1", IpLiteral, "an unclosed bracket"),
            (b"[::1]x", IpLiteral, "a byte after the bracket"),
            (b"[::1]]", IpLiteral, "two closing brackets"),
            (b"[]", IpLiteral, "an empty literal"),
            (b"[v1.x]", IpLiteral, "IPvFuture"),
            (b"[127.0.0.1]", IpLiteral, "IPv4 in brackets"),
            (b"[fe80::1%25eth0]", IpLiteral, "an IPv6 zone"),
            (b"[1:2:3:4:5:6:7:8:9]", IpLiteral, "nine groups"),
            (b"[::g]", IpLiteral, "not hex"),
            (b"example]", Byte, "a bracket in a name"),
            (b"a[::1]", Byte, "a bracket in a name"),
            (b"ex%41mple.com", PercentEncoded, "pct-encoding"),
            (b"ex%4", PercentEncoded, "a broken pct-encoding"),
            (b"exa mple", Byte, "a space"),
            (b" example.com", Byte, "a leading space"),
            (b"a@b", Byte, "userinfo"),
            (b"user:pass@b", PortNotDigits, "userinfo with a password"),
            (b"a/b", Byte, "a path"),
            (b"a?b", Byte, "a query"),
            (b"a#b", Byte, "a fragment"),
            (b"a\\b", Byte, "a backslash"),
            (b"a\"b", Byte, "a quote"),
            (b"a<b", Byte, "not a URI byte"),
            (b"a\x00b", Byte, "NUL"),
            (b"a\tb", Byte, "a control byte"),
            (b"a\x7fb", Byte, "DEL"),
            (
                "bücher.example".as_bytes(),
                Byte,
                "UTF-8 (IDNs go as punycode)",
            ),
            (b"a\xffb", Byte, "obs-text"),
            (b"a..b", EmptyLabel, "an empty label"),
            (b".a", EmptyLabel, "a leading dot"),
            (b".", EmptyLabel, "a dot alone"),
            (b"a..", EmptyLabel, "two trailing dots"),
            (too_long.as_bytes(), TooLong, "256 bytes"),
            (b"1.2.3.256", NotIpv4, "an octet over 255"),
            (b"127.1", NotIpv4, "a short IPv4 form"),
            (b"1.2.3.4.5", NotIpv4, "five octets"),
            (b"01.2.3.4", NotIpv4, "a leading zero (octal elsewhere)"),
            (b"0x7f.0.0.1", NotIpv4, "hex octets"),
            (b"0x7f000001", NotIpv4, "one hex number"),
            (b"2130706433", NotIpv4, "one decimal number"),
            (b"a.123", NotIpv4, "a numeric last label"),
            (b"1.2.3.4.", NotIpv4, "an IPv4 address with a dot after it"),
        ];
        for (value, error, why) in refused {
            assert_eq!(
                parse(value),
                Err(*error),
                "{:?} ({why})",
                String::from_utf8_lossy(value)
            );
        }
    }

    /// The one pass reads what the rule reads, for every value of up to
    /// six bytes of those that decide a host's shape, and for IPv4-like
    /// values of four labels with and without a port; and it does read
    /// the common shapes (else it would be no faster).
    #[test]
    fn the_one_pass_agrees_with_the_rule() {
        fn agrees(value: &[u8]) -> bool {
            match common(value) {
                Some(read) => {
                    assert_eq!(
                        by_rule(value),
                        Ok(read),
                        "{:?}",
                        String::from_utf8_lossy(value)
                    );
                    true
                }
                None => false,
            }
        }
        let bytes = b"a0125x.:%[]-";
        let mut read = 0;
        let mut value = Vec::new();
        for len in 0..=6u32 {
            for mut n in 0..bytes.len().pow(len) {
                value.clear();
                for _ in 0..len {
                    value.push(bytes[n % bytes.len()]);
                    n /= bytes.len();
                }
                read += usize::from(agrees(&value));
            }
        }
        let labels = [
            "0", "1", "9", "10", "25", "99", "100", "199", "200", "249", "250", "255", "256",
            "260", "300", "01", "001", "1000", "a",
        ];
        for a in labels {
            for b in labels {
                for c in labels {
                    for d in labels {
                        for port in ["", ":80", ":65536", ":", ":00080", ":000080", ":8a"] {
                            read +=
                                usize::from(agrees(format!("{a}.{b}.{c}.{d}{port}").as_bytes()));
                        }
                    }
                }
            }
        }
        assert!(read > 100_000, "{read}");
        for common_shape in [
            &b"127.0.0.1:8080"[..],
            b"10.0.0.1",
            b"example.com",
            b"api.example.com:443",
            b"localhost:8080",
            b"0x.example",
        ] {
            assert!(agrees(common_shape), "{common_shape:?}");
        }
    }

    #[test]
    fn the_host_and_port_are_split() {
        assert_eq!(
            parse(b"Example.com:8080"),
            Ok(HostPort {
                host: b"Example.com",
                port: Some(8080)
            })
        );
        assert_eq!(
            parse(b"[::1]:0"),
            Ok(HostPort {
                host: b"[::1]",
                port: Some(0)
            })
        );
        assert_eq!(
            parse(b"a"),
            Ok(HostPort {
                host: b"a",
                port: None
            })
        );
    }

    /// Every value `http::uri::Authority` refuses (what hyper reads
    /// absolute-form targets and h2 reads `:authority` with) is refused
    /// here too, and every value accepted here it reads with the same host
    /// and port.
    #[test]
    fn never_more_lenient_than_http_authority() {
        let mut values: Vec<Vec<u8>> = Vec::new();
        let seeds: &[&[u8]] = &[
            b"example.com:80",
            b"[::1]:8080",
            b"10.0.0.1",
            b"a.b.",
            b"[v1.x]",
        ];
        for seed in seeds {
            values.push(seed.to_vec());
            for at in 0..=seed.len() {
                for b in 0..=255u8 {
                    let mut inserted = seed.to_vec();
                    inserted.insert(at, b);
                    values.push(inserted);
                    if at < seed.len() {
                        let mut replaced = seed.to_vec();
                        replaced[at] = b;
                        values.push(replaced);
                    }
                }
            }
        }
        let mut checked = 0;
        for value in &values {
            let Ok(ours) = parse(value) else {
                continue;
            };
            checked += 1;
            let theirs = http::uri::Authority::try_from(value.as_slice()).unwrap_or_else(|e| {
                panic!(
                    "{:?}: accepted, Authority refuses: {e}",
                    String::from_utf8_lossy(value)
                )
            });
            assert_eq!(theirs.host().as_bytes(), ours.host, "{theirs}");
            assert_eq!(theirs.port_u16(), ours.port, "{theirs}");
        }
        assert!(checked > 1000, "{checked}");
    }

    fn http2(uri: &str, hosts: &[&str]) -> Result<(), &'static str> {
        let uri: http::Uri = uri.parse().unwrap();
        let mut headers = http::HeaderMap::new();
        for host in hosts {
            headers.append(http::header::HOST, host.parse().unwrap());
        }
        check_http2_request(&uri, &headers)
    }

    #[test]
    fn http2_authority_and_host() {
        assert_eq!(http2("https://example.com/", &[]), Ok(()));
        assert_eq!(http2("https://example.com:8443/", &[]), Ok(()));
        assert_eq!(http2("/", &["example.com"]), Ok(()), "Host alone");
        assert_eq!(
            http2("https://example.com/", &["EXAMPLE.com"]),
            Ok(()),
            "letter case"
        );
        assert_eq!(
            http2("https://example.com/", &["example.com:443"]),
            Ok(()),
            "the scheme's default port"
        );
        assert_eq!(http2("http://example.com:80/", &["example.com"]), Ok(()));
        for (uri, hosts) in [
            ("https://example.com/", &["other.com"][..]),
            ("https://example.com/", &["example.com:80"]),
            ("http://example.com/", &["example.com:443"]),
            ("https://example.com/", &["example.com", "example.com"]),
            ("/", &[]),
            ("/", &["example.com:abc"]),
            ("/", &["a@b"]),
            ("https://example.com:abc/", &[]),
            ("https://example.com:99999/", &[]),
            ("https://user@example.com/", &[]),
            ("https://example.com:/", &[]),
        ] {
            assert!(http2(uri, hosts).is_err(), "{uri} {hosts:?}");
        }
    }
}
