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
//! The `id` is a UUIDv7 (RFC 9562): the settle time's milliseconds, then
//! 42 bits chosen at random when the exporter starts (the node) and a
//! 32-bit counter of the events it wrote. Two events share an id only if
//! one process wrote 2³² events in one millisecond, or two processes drew
//! the same 42 bits and wrote the same count in the same millisecond.

use serde::Serialize;

use super::{Subject, UsageRecord};

/// The events' `type`.
pub(crate) const TYPE: &str = "tollgate.llm.usage";

/// The ids of one exporter's events, and their `source`.
#[derive(Debug)]
pub(crate) struct Ids {
    node: u64,
    counter: u32,
    source: String,
}

impl Ids {
    /// `node`: the 42 random bits of this process's ids (higher bits are
    /// ignored); `source`: the events' `source`.
    pub(crate) fn new(node: u64, source: String) -> Ids {
        Ids {
            node: node & ((1 << 42) - 1),
            counter: 0,
            source,
        }
    }

    /// The next id, for an event at `unix_ms`.
    fn next(&mut self, unix_ms: u64) -> String {
        self.counter = self.counter.wrapping_add(1);
        // 74 bits after the time and version: 42 of node, 32 of counter.
        let rest = (u128::from(self.node) << 32) | u128::from(self.counter);
        let rand_a = (rest >> 62) as u16 & 0x0fff;
        let rand_b = rest as u64 & ((1 << 62) - 1);
        let high = ((unix_ms & 0xffff_ffff_ffff) << 16) | 0x7000 | u64::from(rand_a);
        let low = (0b10 << 62) | rand_b;
        format!(
            "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
            high >> 32,
            (high >> 16) & 0xffff,
            high & 0xffff,
            low >> 48,
            low & 0xffff_ffff_ffff
        )
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

#[derive(Serialize)]
struct Event<'a> {
    specversion: &'static str,
    id: &'a str,
    source: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    subject: Option<&'a str>,
    time: &'a str,
    datacontenttype: &'static str,
    data: Data<'a>,
}

#[derive(Serialize)]
struct Data<'a> {
    route: &'a str,
    model: Option<&'a str>,
    input_tokens: Option<u64>,
    cached_input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    total_tokens: Option<u64>,
    cost_usd: Option<Dollars>,
    status: Option<u16>,
    duration_ms: u64,
}

/// Micro-dollars written as an exact decimal string (`"0.001234"`, six
/// places): from the integer, with no float in between (a JSON number
/// would be read as a binary float by most collectors; OpenMeter's meters
/// take a number in a string as well).
struct Dollars(u64);

impl Serialize for Dollars {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let text = format!("{}.{:06}", self.0 / 1_000_000, self.0 % 1_000_000);
        serializer.serialize_str(&text)
    }
}

/// Appends `record` as one event line (JSON and `\n`) to `out`.
pub(crate) fn write_line(record: &UsageRecord, ids: &mut Ids, out: &mut Vec<u8>) {
    let unix_ms = record.at / 1_000_000;
    let id = ids.next(unix_ms);
    let time = time_of(record.at);
    let subject = match &record.subject {
        Some(Subject::Name(name)) => Some(name.to_string()),
        Some(Subject::Key(key)) => Some(format!("{:032x}", key.as_u128())),
        None => None,
    };
    let event = Event {
        specversion: "1.0",
        id: &id,
        source: &ids.source,
        kind: TYPE,
        subject: subject.as_deref(),
        time: &time,
        datacontenttype: "application/json",
        data: Data {
            route: &record.route,
            model: record.model.as_deref(),
            input_tokens: record.tokens.input,
            cached_input_tokens: record.tokens.cached_input,
            output_tokens: record.tokens.output,
            total_tokens: record.tokens.total,
            cost_usd: record.cost_usd_micros.map(Dollars),
            status: record.status,
            duration_ms: record.duration / 1_000_000,
        },
    };
    // Serializing plain fields into a Vec cannot fail.
    if serde_json::to_writer(&mut *out, &event).is_ok() {
        out.push(b'\n');
    }
}

/// RFC 3339 in UTC with milliseconds.
fn time_of(nanos: u64) -> String {
    let whole = crate::http::rfc3339::format(nanos);
    let seconds = whole.strip_suffix('Z').unwrap_or(&whole);
    format!("{seconds}.{:03}Z", nanos / 1_000_000 % 1000)
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

    fn event(record: &UsageRecord, ids: &mut Ids) -> Value {
        let mut out = Vec::new();
        write_line(record, ids, &mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn an_event_has_every_attribute_and_its_data() {
        let mut ids = Ids::new(0x2aa_aaaa_aaaa, "tollgate/gw-1".into());
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

    #[test]
    fn unknown_parts_are_null_and_a_key_is_a_digest() {
        let mut ids = Ids::new(1, "tollgate".into());
        let record = UsageRecord {
            model: None,
            subject: Some(Subject::Key(LimitKey::from_u128(0xabc))),
            tokens: Tokens::default(),
            status: None,
            cost_usd_micros: None,
            ..record()
        };
        let event = event(&record, &mut ids);
        assert_eq!(event["subject"], "00000000000000000000000000000abc");
        for field in [
            "model",
            "input_tokens",
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
    fn ids_are_uuid_v7_and_unique() {
        let mut ids = Ids::new(u64::MAX, "s".into());
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let id = ids.next(1_700_006_400_123);
            assert!(seen.insert(id.clone()), "{id} twice");
            assert_eq!(id.len(), 36);
            assert_eq!(&id[..13], "018bd047-107b");
            assert_eq!(&id[14..15], "7", "{id}: version 7");
            assert!(
                matches!(&id[19..20], "8" | "9" | "a" | "b"),
                "{id}: variant"
            );
        }
        // Another node at the same millisecond and count differs.
        let (mut a, mut b) = (Ids::new(1, "s".into()), Ids::new(2, "s".into()));
        assert_ne!(a.next(5), b.next(5));
    }

    #[test]
    fn dollars_are_exact() {
        for (micros, text) in [
            (0, "\"0.000000\""),
            (1, "\"0.000001\""),
            (1_000_000, "\"1.000000\""),
            (12_345_678_901, "\"12345.678901\""),
        ] {
            let json = serde_json::to_string(&Dollars(micros)).unwrap();
            assert_eq!(json, text);
        }
    }
}
