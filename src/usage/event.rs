//! A [`UsageRecord`] as a CloudEvents 1.0 event in JSON (the structured
//! mode of the JSON event format), one line:
//!
//! ```json
//! {"specversion":"1.0","id":"018bd0a8-7a00-7c3e-8a41-09d2000000a1",
//!  "source":"tollgate/gw-1","type":"tollgate.llm.usage","subject":"acme",
//!  "time":"2023-11-15T00:00:00.000Z","datacontenttype":"application/json",
//!  "data":{"route":"chat","model":"gpt-4o","input_tokens":12,
//!   "cached_input_tokens":0,"output_tokens":30,"total_tokens":42,
//!   "cost_usd":"0.000420","status":200,"duration_ms":5}}
//! ```
//!
//! Written by hand into the writer's reused buffer (strings escaped as
//! `serde_json` escapes them, [`crate::http::problem::escape_into`]): the
//! writer thread turns every settled request into one, and building
//! `serde_json` structures, the id and the time as `format!`ed strings
//! cost it more than the request path's own work for the event.
//!
//! The `id` is a UUIDv7 (RFC 9562): the settle time's milliseconds, then
//! 42 bits chosen at random when the exporter starts (the node) and a
//! 32-bit counter of the events it wrote. Two events share an id only if
//! one process wrote 2³² events in one millisecond, or two processes drew
//! the same 42 bits and wrote the same count in the same millisecond.

use super::{Subject, UsageRecord};
use crate::http::problem::JSON_PLAIN;
use crate::http::problem::escape_into;

/// The events' `type`.
pub(crate) const TYPE: &str = "tollgate.llm.usage";

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The ids of one exporter's events, the members every event repeats,
/// and the whole second of the last event's `time`, kept formatted.
#[derive(Debug)]
pub(crate) struct Ids {
    node: u64,
    counter: u32,
    /// What follows the id, the same in every event: the `source`
    /// (escaped) and the `type`, `","source":"…","type":"…"`.
    after_id: Vec<u8>,
    /// The last `time`'s whole seconds since the epoch and their RFC 3339
    /// text up to the seconds (`2023-11-15T00:00:00`): events come in
    /// order of time, many in the same second.
    second: Option<(u64, Vec<u8>)>,
}

impl Ids {
    /// `node`: the 42 random bits of this process's ids (higher bits are
    /// ignored); `source`: the events' `source`.
    pub(crate) fn new(node: u64, source: &str) -> Ids {
        let mut after_id = Vec::with_capacity(source.len() + 48);
        after_id.extend_from_slice(b"\",\"source\":\"");
        escape_bytes(&mut after_id, source);
        after_id.extend_from_slice(b"\",\"type\":\"");
        after_id.extend_from_slice(TYPE.as_bytes());
        after_id.push(b'"');
        Ids {
            node: node & ((1 << 42) - 1),
            counter: 0,
            after_id,
            second: None,
        }
    }

    /// Writes the next id, for an event at `unix_ms`, to `out`.
    fn write_next(&mut self, unix_ms: u64, out: &mut Vec<u8>) {
        self.counter = self.counter.wrapping_add(1);
        // 74 bits after the time and version: 42 of node, 32 of counter.
        let rest = (u128::from(self.node) << 32) | u128::from(self.counter);
        let rand_a = (rest >> 62) as u16 & 0x0fff;
        let rand_b = rest as u64 & ((1 << 62) - 1);
        let high = ((unix_ms & 0xffff_ffff_ffff) << 16) | 0x7000 | u64::from(rand_a);
        let low = (0b10 << 62) | rand_b;
        // 8-4-4-4-12 hex digits.
        let mut text = [b'-'; 36];
        hex_into(&mut text[0..8], high >> 32);
        hex_into(&mut text[9..13], high >> 16);
        hex_into(&mut text[14..18], high);
        hex_into(&mut text[19..23], low >> 48);
        hex_into(&mut text[24..36], low);
        out.extend_from_slice(&text);
    }

    /// Writes `nanos` as RFC 3339 in UTC with milliseconds to `out`.
    fn write_time(&mut self, nanos: u64, out: &mut Vec<u8>) {
        let seconds = nanos / 1_000_000_000;
        let whole = match &self.second {
            Some((at, text)) if *at == seconds => text,
            _ => {
                let text = crate::http::rfc3339::format(nanos);
                let text = text.strip_suffix('Z').unwrap_or(&text).as_bytes().to_vec();
                &self.second.insert((seconds, text)).1
            }
        };
        out.extend_from_slice(whole);
        let millis = nanos / 1_000_000 % 1000;
        out.extend_from_slice(&[
            b'.',
            b'0' + (millis / 100) as u8,
            b'0' + (millis / 10 % 10) as u8,
            b'0' + (millis % 10) as u8,
            b'Z',
        ]);
    }
}

/// Fills `slot` with the low `4 × slot.len()` bits of `value` in hex.
fn hex_into(slot: &mut [u8], mut value: u64) {
    for digit in slot.iter_mut().rev() {
        *digit = HEX[(value & 0xf) as usize];
        value >>= 4;
    }
}

/// Appends `text` as the inside of a JSON string, escaped as
/// [`escape_into`] (and `serde_json`) escape it: as it is when it needs
/// none (a route, a model, a tenant: a few bytes, each looked up in a
/// table).
fn escape_bytes(out: &mut Vec<u8>, text: &str) {
    if text.bytes().all(|b| JSON_PLAIN[usize::from(b)]) {
        out.extend_from_slice(text.as_bytes());
    } else {
        let mut escaped = String::with_capacity(text.len() + 8);
        escape_into(&mut escaped, text);
        out.extend_from_slice(escaped.as_bytes());
    }
}

/// The process's `source`: `tollgate/HOSTNAME`.
pub(crate) fn source() -> String {
    let mut buffer = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes.
    let ok = unsafe { libc::gethostname(buffer.as_mut_ptr().cast(), buffer.len()) } == 0;
    let name = buffer.split(|&b| b == 0).next().unwrap_or_default();
    match std::str::from_utf8(name) {
        Ok(name) if ok && !name.is_empty() => format!("tollgate/{name}"),
        _ => "tollgate".to_owned(),
    }
}

/// Appends `record` as one event line (JSON and `\n`, UTF-8) to `out`.
/// Bytes, not a `String`: the pieces are ASCII or escaped `str`s, and a
/// `String` took a check of every ASCII piece (~190 instructions an
/// event).
pub(crate) fn write_line(record: &UsageRecord, ids: &mut Ids, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"specversion\":\"1.0\",\"id\":\"");
    ids.write_next(record.at / 1_000_000, out);
    out.extend_from_slice(&ids.after_id);
    match &record.subject {
        Some(Subject::Name(name)) => {
            out.extend_from_slice(b",\"subject\":\"");
            escape_bytes(out, name);
            out.push(b'"');
        }
        Some(Subject::Key(key)) => {
            let digest = key.as_u128();
            let mut text = [0u8; 32];
            hex_into(&mut text[..16], (digest >> 64) as u64);
            hex_into(&mut text[16..], digest as u64);
            out.extend_from_slice(b",\"subject\":\"");
            out.extend_from_slice(&text);
            out.push(b'"');
        }
        None => {}
    }
    out.extend_from_slice(b",\"time\":\"");
    ids.write_time(record.at, out);
    out.extend_from_slice(b"\",\"datacontenttype\":\"application/json\",\"data\":{\"route\":\"");
    escape_bytes(out, &record.route);
    match &record.model {
        Some(model) => {
            out.extend_from_slice(b"\",\"model\":\"");
            escape_bytes(out, model);
            out.push(b'"');
        }
        None => out.extend_from_slice(b"\",\"model\":null"),
    }
    let tokens = &record.tokens;
    number(out, b",\"input_tokens\":", tokens.input);
    number(out, b",\"cached_input_tokens\":", tokens.cached_input);
    number(out, b",\"output_tokens\":", tokens.output);
    number(out, b",\"total_tokens\":", tokens.total);
    match record.cost_usd_micros {
        Some(micros) => dollars(out, micros),
        None => out.extend_from_slice(b",\"cost_usd\":null"),
    }
    number(out, b",\"status\":", record.status);
    number(out, b",\"duration_ms\":", Some(record.duration / 1_000_000));
    out.extend_from_slice(b"}}\n");
}

/// `name` (the member's `,"name":`) and `value`'s digits, or `null`.
fn number(out: &mut Vec<u8>, name: &[u8], value: Option<impl itoa::Integer>) {
    out.extend_from_slice(name);
    match value {
        Some(value) => out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes()),
        None => out.extend_from_slice(b"null"),
    }
}

/// `,"cost_usd":` and micro-dollars as an exact decimal string
/// (`"0.001234"`, six places): from the integer, with no float in between
/// (a JSON number would be read as a binary float by most collectors;
/// OpenMeter's meters take a number in a string as well).
fn dollars(out: &mut Vec<u8>, micros: u64) {
    out.extend_from_slice(b",\"cost_usd\":\"");
    out.extend_from_slice(itoa::Buffer::new().format(micros / 1_000_000).as_bytes());
    let mut fraction = *b".000000\"";
    decimal_into(&mut fraction[1..7], micros % 1_000_000);
    out.extend_from_slice(&fraction);
}

/// Fills `slot` with `value`'s decimal digits, zero-padded on the left.
fn decimal_into(slot: &mut [u8], mut value: u64) {
    for digit in slot.iter_mut().rev() {
        *digit = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;
    use crate::limit::LimitKey;
    use crate::usage::Tokens;

    fn record() -> UsageRecord {
        UsageRecord {
            route: Arc::from("chat"),
            model: Some("gpt-4o".into()),
            subject: Some(Subject::Name(Arc::from("acme \"inc\""))),
            tokens: Tokens {
                input: Some(12),
                cached_input: Some(0),
                output: Some(30),
                total: Some(42),
            },
            status: Some(200),
            duration: 5_400_000,
            at: 1_700_006_400_123_456_789,
            cost_usd_micros: Some(1_234),
        }
    }

    fn line(record: &UsageRecord, ids: &mut Ids) -> String {
        let mut out = Vec::new();
        write_line(record, ids, &mut out);
        let mut out = String::from_utf8(out).expect("UTF-8");
        assert_eq!(out.pop(), Some('\n'));
        assert!(!out.contains('\n'), "{out}");
        out
    }

    fn event(record: &UsageRecord, ids: &mut Ids) -> Value {
        serde_json::from_str(&line(record, ids)).unwrap()
    }

    fn next_id(ids: &mut Ids, unix_ms: u64) -> String {
        let mut out = Vec::new();
        ids.write_next(unix_ms, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn an_event_has_every_attribute_and_its_data() {
        let mut ids = Ids::new(0x2aa_aaaa_aaaa, "tollgate/gw-1");
        let event = event(&record(), &mut ids);
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(event["source"], "tollgate/gw-1");
        assert_eq!(event["type"], "tollgate.llm.usage");
        assert_eq!(event["subject"], "acme \"inc\"");
        assert_eq!(event["time"], "2023-11-15T00:00:00.123Z");
        assert_eq!(event["datacontenttype"], "application/json");
        assert_eq!(
            event["data"],
            json!({"route": "chat", "model": "gpt-4o", "input_tokens": 12,
                   "cached_input_tokens": 0, "output_tokens": 30, "total_tokens": 42,
                   "cost_usd": "0.001234", "status": 200, "duration_ms": 5})
        );
    }

    /// The hand-written line is, byte for byte, what `serde_json` writes
    /// for the same members in the same order: strings with quotes,
    /// backslashes, controls and non-ASCII text included.
    #[test]
    fn the_line_is_what_serde_json_writes() {
        let mut ids = Ids::new(7, "tollgate/host \"a\"\\b");
        let record = UsageRecord {
            route: Arc::from("ch\u{1}at\ttab\u{7f}"),
            model: Some("gpt-4o \"mini\" \\ é ✓\n".into()),
            subject: Some(Subject::Name(Arc::from("ténant\r\u{1f}"))),
            ..record()
        };
        let written = line(&record, &mut ids);
        let expected = json!({
            "specversion": "1.0",
            "id": serde_json::from_str::<Value>(&written).unwrap()["id"],
            "source": "tollgate/host \"a\"\\b",
            "type": "tollgate.llm.usage",
            "subject": "ténant\r\u{1f}",
            "time": "2023-11-15T00:00:00.123Z",
            "datacontenttype": "application/json",
            "data": {"route": "ch\u{1}at\ttab\u{7f}", "model": "gpt-4o \"mini\" \\ é ✓\n",
                     "input_tokens": 12, "cached_input_tokens": 0, "output_tokens": 30,
                     "total_tokens": 42, "cost_usd": "0.001234", "status": 200,
                     "duration_ms": 5},
        });
        // serde_json's `preserve_order` is off: compare as values, and
        // the member order by the keys' positions in the line.
        assert_eq!(serde_json::from_str::<Value>(&written).unwrap(), expected);
        let positions: Vec<usize> = [
            "\"specversion\"",
            "\"id\"",
            "\"source\"",
            "\"type\"",
            "\"subject\"",
            "\"time\"",
            "\"datacontenttype\"",
            "\"data\"",
            "\"route\"",
            "\"model\"",
            "\"input_tokens\"",
            "\"cached_input_tokens\"",
            "\"output_tokens\"",
            "\"total_tokens\"",
            "\"cost_usd\"",
            "\"status\"",
            "\"duration_ms\"",
        ]
        .iter()
        .map(|key| {
            written
                .find(key)
                .unwrap_or_else(|| panic!("{key} in {written}"))
        })
        .collect();
        assert!(positions.is_sorted(), "{written}");
        // Each string escaped as serde_json escapes it.
        for text in [
            "ch\u{1}at\ttab\u{7f}",
            "gpt-4o \"mini\" \\ é ✓\n",
            "ténant\r\u{1f}",
        ] {
            let escaped = serde_json::to_string(text).unwrap();
            assert!(written.contains(&escaped), "{escaped} in {written}");
        }
    }

    #[test]
    fn unknown_parts_are_null_and_a_key_is_a_digest() {
        let mut ids = Ids::new(1, "tollgate");
        let record = UsageRecord {
            model: None,
            subject: Some(Subject::Key(LimitKey::from_u128(0xabc << 64 | 0xdef))),
            tokens: Tokens::default(),
            status: None,
            cost_usd_micros: None,
            ..record()
        };
        let event = event(&record, &mut ids);
        assert_eq!(event["subject"], "0000000000000abc0000000000000def");
        for field in [
            "model",
            "input_tokens",
            "cached_input_tokens",
            "output_tokens",
            "cost_usd",
            "status",
            "total_tokens",
        ] {
            assert_eq!(event["data"][field], Value::Null, "{field}");
        }
        let anonymous = UsageRecord {
            subject: None,
            ..record
        };
        assert!(self::event(&anonymous, &mut ids).get("subject").is_none());
    }

    #[test]
    fn times_have_milliseconds_across_seconds_and_days() {
        let mut ids = Ids::new(1, "s");
        for (at, time) in [
            (1_700_006_400_123_456_789, "2023-11-15T00:00:00.123Z"),
            (1_700_006_400_999_999_999, "2023-11-15T00:00:00.999Z"),
            (1_700_006_401_000_000_000, "2023-11-15T00:00:01.000Z"),
            (1_700_006_401_007_000_000, "2023-11-15T00:00:01.007Z"),
            (1_700_092_799_050_000_000, "2023-11-15T23:59:59.050Z"),
            (1_700_092_800_000_000_000, "2023-11-16T00:00:00.000Z"),
            // Back in time (another clock's record): formatted afresh.
            (951_782_400_010_000_000, "2000-02-29T00:00:00.010Z"),
        ] {
            let record = UsageRecord { at, ..record() };
            assert_eq!(event(&record, &mut ids)["time"], time, "{at}");
        }
    }

    #[test]
    fn ids_are_uuid_v7_and_unique() {
        let mut ids = Ids::new(u64::MAX, "s");
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let id = next_id(&mut ids, 1_700_006_400_123);
            assert!(seen.insert(id.clone()), "{id} twice");
            assert_eq!(id.len(), 36);
            assert_eq!(&id[..13], "018bd047-107b");
            assert_eq!(&id[14..15], "7", "{id}: version 7");
            assert!(
                matches!(&id[19..20], "8" | "9" | "a" | "b"),
                "{id}: variant"
            );
            // The first 48 bits are the time.
            let ms = u64::from_str_radix(&id[..13].replace('-', ""), 16).unwrap();
            assert_eq!(ms, 1_700_006_400_123);
            assert!(id.bytes().enumerate().all(|(i, b)| match i {
                8 | 13 | 18 | 23 => b == b'-',
                _ => b.is_ascii_hexdigit() && !b.is_ascii_uppercase(),
            }));
        }
        // Another node at the same millisecond and count differs.
        let (mut a, mut b) = (Ids::new(1, "s"), Ids::new(2, "s"));
        assert_ne!(next_id(&mut a, 5), next_id(&mut b, 5));
    }

    #[test]
    fn dollars_are_exact() {
        for (micros, text) in [
            (0, "\"0.000000\""),
            (1, "\"0.000001\""),
            (999_999, "\"0.999999\""),
            (1_000_000, "\"1.000000\""),
            (12_345_678_901, "\"12345.678901\""),
            (u64::MAX, "\"18446744073709.551615\""),
        ] {
            let mut out = Vec::new();
            dollars(&mut out, micros);
            let out = String::from_utf8(out).unwrap();
            assert_eq!(out.strip_prefix(",\"cost_usd\":"), Some(text));
        }
    }
}
