//! W3C Trace Context's `traceparent` field: its ids, parsed strictly and
//! written back.
//!
//! ```text
//! traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
//!              │  └ trace-id: 16 bytes            └ parent-id: 8   └ flags
//!              └ version
//! ```
//!
//! Lowercase hex only, each part its exact length, neither id all zeros,
//! version `ff` forbidden (W3C Trace Context §3.2). A version above `00`
//! is read as `00` when its first 55 characters have `00`'s form and what
//! follows starts with `-` (the spec's rule for versions it does not know
//! yet); version `00` itself is exactly 55 characters. Anything else is no
//! parent: the request starts a trace of its own.

use std::fmt;

/// A trace's id: 16 bytes, never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct TraceId(pub(crate) [u8; 16]);

/// A span's id: 8 bytes, never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SpanId(pub(crate) [u8; 8]);

/// What an incoming `traceparent` says: the caller's trace and span, and
/// whether the caller recorded it (the `sampled` flag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parent {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    pub(crate) sampled: bool,
}

/// The length of a version-00 `traceparent`.
pub(crate) const TRACEPARENT_LEN: usize = 55;

/// Parses a `traceparent` value; `None` for anything malformed.
pub(crate) fn parse_traceparent(value: &[u8]) -> Option<Parent> {
    if value.len() < TRACEPARENT_LEN {
        return None;
    }
    let version = hex_byte(&value[0..2])?;
    match version {
        0x00 if value.len() != TRACEPARENT_LEN => return None,
        0xff => return None,
        // A later version: its 00-shaped prefix, then `-` or the end.
        _ if value.len() > TRACEPARENT_LEN && value[TRACEPARENT_LEN] != b'-' => return None,
        _ => {}
    }
    if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
        return None;
    }
    let mut trace_id = [0u8; 16];
    for (i, byte) in trace_id.iter_mut().enumerate() {
        *byte = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
    }
    let mut span_id = [0u8; 8];
    for (i, byte) in span_id.iter_mut().enumerate() {
        *byte = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
    }
    let flags = hex_byte(&value[53..55])?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(Parent {
        trace_id: TraceId(trace_id),
        span_id: SpanId(span_id),
        sampled: flags & 0x01 == 0x01,
    })
}

/// `00-{trace}-{span}-01`: the `traceparent` of a recorded span.
pub(crate) fn format_traceparent(trace_id: TraceId, span_id: SpanId) -> [u8; TRACEPARENT_LEN] {
    let mut out = [b'-'; TRACEPARENT_LEN];
    out[0] = b'0';
    out[1] = b'0';
    write_hex(&trace_id.0, &mut out[3..35]);
    write_hex(&span_id.0, &mut out[36..52]);
    out[53] = b'0';
    out[54] = b'1';
    out
}

/// Two lowercase hex digits as a byte.
fn hex_byte(pair: &[u8]) -> Option<u8> {
    Some(hex_digit(pair[0])? << 4 | hex_digit(pair[1])?)
}

/// A lowercase hex digit's value (uppercase is malformed in `traceparent`).
fn hex_digit(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// `bytes` as lowercase hex into `out` (twice as long).
fn write_hex(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, byte) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(byte >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(byte & 0x0f)];
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0u8; 32];
        write_hex(&self.0, &mut out);
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0u8; 16];
        write_hex(&self.0, &mut out);
        f.write_str(std::str::from_utf8(&out).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specs_example_parses() {
        let parent = parse_traceparent(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(
            parent.trace_id.to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(parent.span_id.to_string(), "00f067aa0ba902b7");
        assert!(parent.sampled);
        let unsampled = parse_traceparent(&EXAMPLE.replace("-01", "-00").into_bytes()).unwrap();
        assert!(!unsampled.sampled);
        // Other flag bits are not the sampled one.
        let other = parse_traceparent(&EXAMPLE.replace("-01", "-02").into_bytes()).unwrap();
        assert!(!other.sampled);
    }

    #[test]
    fn malformed_values_are_refused() {
        let bad = [
            "",
            "00",
            // Uppercase hex.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            // All-zero ids.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Version ff, a version 00 with more after it.
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            // A later version whose extra part does not start with `-`.
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            // Wrong separators or lengths.
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",
        ];
        for value in bad {
            assert_eq!(parse_traceparent(value.as_bytes()), None, "{value:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_version_00_prefix() {
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        let parent = parse_traceparent(later.as_bytes()).unwrap();
        assert_eq!(parent.span_id.to_string(), "00f067aa0ba902b7");
        let exact = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(parse_traceparent(exact.as_bytes()).is_some());
    }

    #[test]
    fn formatting_writes_a_sampled_version_00_value() {
        let parent = parse_traceparent(EXAMPLE.as_bytes()).unwrap();
        let written = format_traceparent(parent.trace_id, parent.span_id);
        assert_eq!(std::str::from_utf8(&written).unwrap(), EXAMPLE);
    }

    proptest! {
        /// Any ids round-trip through the field, and the parser takes
        /// only what the format allows.
        #[test]
        fn ids_round_trip(trace in any::<[u8; 16]>(), span in any::<[u8; 8]>()) {
            prop_assume!(trace != [0; 16] && span != [0; 8]);
            let written = format_traceparent(TraceId(trace), SpanId(span));
            let parent = parse_traceparent(&written).unwrap();
            prop_assert_eq!(parent.trace_id, TraceId(trace));
            prop_assert_eq!(parent.span_id, SpanId(span));
            prop_assert!(parent.sampled);
        }

        /// Changing any one character of a valid value into something that
        /// is not a lowercase hex digit (where a digit stood) or not `-`
        /// (where a separator stood) makes it malformed.
        #[test]
        fn one_bad_character_is_refused(at in 0usize..TRACEPARENT_LEN, byte in any::<u8>()) {
            let mut value = EXAMPLE.as_bytes().to_vec();
            let separator = matches!(at, 2 | 35 | 52);
            let fits = if separator { byte == b'-' } else { hex_digit(byte).is_some() };
            value[at] = byte;
            let parsed = parse_traceparent(&value);
            if !fits {
                prop_assert_eq!(parsed, None);
            }
        }

        /// Arbitrary bytes never panic the parser, and what it accepts
        /// has the field's shape.
        #[test]
        fn arbitrary_bytes_never_panic(value in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Some(parent) = parse_traceparent(&value) {
                prop_assert!(value.len() >= TRACEPARENT_LEN);
                prop_assert!(parent.trace_id.0 != [0; 16]);
                prop_assert!(parent.span_id.0 != [0; 8]);
            }
        }
    }
}
