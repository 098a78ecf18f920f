//! A batch of recorded requests as one OTLP `ExportTraceServiceRequest`,
//! protobuf-encoded: the body of a `POST /v1/traces`.
//!
//! Written by hand from the span records, straight into buffers the
//! exporter keeps between batches: building `opentelemetry-proto`'s prost
//! messages first cost two allocations per attribute (its key and its
//! text) and most of a traced request's instructions. The messages and
//! their field numbers are OpenTelemetry's
//! (`opentelemetry/proto/trace/v1/trace.proto`, `common/v1/common.proto`);
//! the tests decode what this writes with `opentelemetry-proto`'s types
//! (and `tests/traces.rs` with OpenTelemetry's Python messages too). One
//! resource (`service.name` and the SDK's name and language) and one
//! instrumentation scope (`tollgate` and its version) hold every span of
//! the batch.
//!
//! A nested message is written after its length, so each span is written
//! into a scratch buffer first and copied after its length; an attribute's
//! lengths are known from its texts, and it is written in place.

use std::io::Write as _;
use std::net::IpAddr;

use prost::encoding::{encode_varint, encoded_len_varint};

use super::span::{Name, RequestSpans, SpanKind, SpanRecord, Value};

/// The instrumentation scope's name: the spans are the gateway's own.
pub(crate) const SCOPE: &str = "tollgate";

/// Protobuf's wire types that the messages use.
const VARINT: u64 = 0;
const FIXED64: u64 = 1;
const LEN: u64 = 2;
const FIXED32: u64 = 5;

/// OTLP's `Span.SpanKind` and `Status.StatusCode` numbers.
const KIND_SERVER: u64 = 2;
const KIND_CLIENT: u64 = 3;
const STATUS_ERROR: u64 = 2;

/// Writes batches; its buffers are kept from one batch to the next.
#[derive(Debug, Default)]
pub(crate) struct Encoder {
    /// Every span of the batch, each as `ScopeSpans.spans`' field.
    spans: Vec<u8>,
    /// One span's fields.
    span: Vec<u8>,
    /// A value's text that is not kept as text (an address).
    text: Vec<u8>,
}

impl Encoder {
    /// `batch` encoded as an `ExportTraceServiceRequest` from
    /// `service_name`: a new buffer, the size of the last batch's to start.
    pub(crate) fn encode<'a>(
        &mut self,
        service_name: &str,
        batch: impl IntoIterator<Item = &'a RequestSpans>,
    ) -> Vec<u8> {
        self.spans.clear();
        for spans in batch {
            for span in spans.iter() {
                self.span.clear();
                write_span(&mut self.span, &mut self.text, span);
                message(&mut self.spans, 2, &self.span);
            }
        }
        let resource_attributes = [
            ("service.name", service_name),
            ("telemetry.sdk.name", SCOPE),
            ("telemetry.sdk.language", "rust"),
        ];
        let resource: usize = resource_attributes
            .iter()
            .map(|(k, v)| field_len(field_len(k.len()) + field_len(string_value_len(v))))
            .sum();
        let scope = field_len(SCOPE.len()) + field_len(env!("CARGO_PKG_VERSION").len());
        let scope_spans = field_len(scope) + self.spans.len();
        let resource_spans = field_len(resource) + field_len(scope_spans);
        let mut out = Vec::with_capacity(field_len(resource_spans));
        // ExportTraceServiceRequest.resource_spans (1)
        header(&mut out, 1, resource_spans);
        // ResourceSpans.resource (1): Resource.attributes (1)
        header(&mut out, 1, resource);
        for (k, v) in resource_attributes {
            string_attribute(&mut out, 1, k, v.as_bytes());
        }
        // ResourceSpans.scope_spans (2): ScopeSpans.scope (1), .spans (2)
        header(&mut out, 2, scope_spans);
        header(&mut out, 1, scope);
        string(&mut out, 1, SCOPE.as_bytes());
        string(&mut out, 2, env!("CARGO_PKG_VERSION").as_bytes());
        out.extend_from_slice(&self.spans);
        out
    }
}

/// One span's fields (OTLP's `Span`), in the order of their numbers (as
/// prost writes them).
fn write_span(out: &mut Vec<u8>, text: &mut Vec<u8>, span: &SpanRecord) {
    string(out, 1, &span.trace_id.0);
    string(out, 2, &span.span_id.0);
    if let Some(parent) = span.parent {
        string(out, 4, &parent.0);
    }
    write_name(out, &span.name);
    let kind = match span.kind {
        SpanKind::Server => KIND_SERVER,
        SpanKind::Client => KIND_CLIENT,
    };
    tag(out, 6, VARINT);
    varint(out, kind);
    tag(out, 7, FIXED64);
    out.extend_from_slice(&span.start.to_le_bytes());
    tag(out, 8, FIXED64);
    out.extend_from_slice(&span.end.max(span.start).to_le_bytes());
    for (key, attribute) in &span.attributes {
        write_attribute(out, text, key, attribute);
    }
    // Status (15): its code (3) when it is an error; else present and
    // empty (unset), as OpenTelemetry's SDKs send it.
    if span.error {
        header(out, 15, 2);
        tag(out, 3, VARINT);
        varint(out, STATUS_ERROR);
    } else {
        header(out, 15, 0);
    }
    // Flags (16): bit 0x01 sampled (every exported span is); 0x100 the
    // parent's remoteness is known, 0x200 it is remote (a caller's span).
    let remote = match (span.kind, span.parent) {
        (SpanKind::Server, Some(_)) => 0x200,
        _ => 0,
    };
    tag(out, 16, FIXED32);
    out.extend_from_slice(&(0x01u32 | 0x100 | remote).to_le_bytes());
}

/// `Span.name` (5): the name's parts joined by a space.
fn write_name(out: &mut Vec<u8>, name: &Name) {
    let len = name.first.len() + name.then.as_ref().map_or(0, |then| 1 + then.len());
    header(out, 5, len);
    out.extend_from_slice(name.first.as_bytes());
    if let Some(then) = &name.then {
        out.push(b' ');
        out.extend_from_slice(then.as_bytes());
    }
}

/// One attribute of a span (`Span.attributes`, 9): a `KeyValue` whose
/// `AnyValue` is a `string_value` (1), an `int_value` (3) or an
/// `array_value` (5) of strings, its lengths known before it is written.
fn write_attribute(out: &mut Vec<u8>, text: &mut Vec<u8>, key: &str, value: &Value) {
    match value {
        Value::Int(n) => {
            // int64: two's complement, ten bytes when negative.
            let n = *n as u64;
            key_value_header(out, 9, key, 1 + encoded_len_varint(n));
            tag(out, 3, VARINT);
            varint(out, n);
        }
        Value::Texts(texts) => {
            // ArrayValue.values (1), each an AnyValue's string_value (1).
            let array: usize = texts.iter().map(|t| field_len(string_value_len(t))).sum();
            key_value_header(out, 9, key, field_len(array));
            header(out, 5, array);
            for t in texts {
                header(out, 1, string_value_len(t));
                string(out, 1, t.as_bytes());
            }
        }
        Value::Ip(ip) => {
            text.clear();
            write_ip(text, *ip);
            string_attribute(out, 9, key, text);
        }
        Value::Static(t) => string_attribute(out, 9, key, t.as_bytes()),
        Value::Shared(t) => string_attribute(out, 9, key, t.as_bytes()),
        Value::Text(t) => string_attribute(out, 9, key, t.as_bytes()),
    }
}

/// A `KeyValue` field `field` of `key` and the string `value`.
fn string_attribute(out: &mut Vec<u8>, field: u64, key: &str, value: &[u8]) {
    key_value_header(out, field, key, field_len(value.len()));
    string(out, 1, value);
}

/// A `KeyValue` field `field` of `key` up to its `AnyValue`'s fields
/// (`any` bytes), which follow.
fn key_value_header(out: &mut Vec<u8>, field: u64, key: &str, any: usize) {
    header(out, field, field_len(key.len()) + field_len(any));
    string(out, 1, key.as_bytes());
    header(out, 2, any);
}

/// An address as text: an IPv4 one by hand (every traced request has
/// one or two), an IPv6 one by its `Display`.
fn write_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        IpAddr::V6(v6) => {
            // Writing to a Vec cannot fail.
            let _ = write!(out, "{v6}");
        }
    }
}

/// A varint; most are one byte (a tag, a short length), pushed as such.
#[inline(always)]
fn varint(out: &mut Vec<u8>, n: u64) {
    if n < 0x80 {
        out.push(n as u8);
    } else {
        encode_varint(n, out);
    }
}

/// A field's key: its number and wire type.
#[inline(always)]
fn tag(out: &mut Vec<u8>, field: u64, wire: u64) {
    varint(out, field << 3 | wire);
}

/// A length-delimited field's key and length; its bytes follow.
#[inline(always)]
fn header(out: &mut Vec<u8>, field: u64, len: usize) {
    tag(out, field, LEN);
    varint(out, len as u64);
}

/// A `string` or `bytes` field.
fn string(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    header(out, field, bytes.len());
    out.extend_from_slice(bytes);
}

/// An embedded message's field, its bytes written already.
fn message(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    string(out, field, bytes);
}

/// The bytes of a length-delimited field of `len` bytes whose number is
/// below 16 (a one-byte key).
fn field_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

/// An `AnyValue` holding the string `text`.
fn string_value_len(text: &str) -> usize {
    field_len(text.len())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value;
    use opentelemetry_proto::tonic::trace::v1::{span, status};
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::trace::context::{SpanId, TraceId};

    fn batch() -> Vec<RequestSpans> {
        let mut server = SpanRecord::new(
            TraceId([1; 16]),
            SpanId([2; 8]),
            Some(SpanId([3; 8])),
            SpanKind::Server,
            10,
            "GET",
        );
        server.name.then = Some(Arc::from("api"));
        server.end = 30;
        server.set("http.response.status_code", Value::Int(200));
        server.set("tollgate.decision", Value::Static("allowed"));
        server.set("network.peer.address", Value::Ip([10, 0, 100, 7].into()));
        server.set("client.address", Value::Ip("2001:db8::1".parse().unwrap()));
        server.set("tollgate.route", Value::Shared(Arc::from("api")));
        server.set("url.path", Value::Text("/api/é".to_owned()));
        server.set("negative", Value::Int(-5));
        let mut client = SpanRecord::new(
            TraceId([1; 16]),
            SpanId([4; 8]),
            Some(SpanId([2; 8])),
            SpanKind::Client,
            15,
            "GET",
        );
        client.error = true;
        client.end = 25;
        let mut redis = SpanRecord::new(
            TraceId([1; 16]),
            SpanId([5; 8]),
            Some(SpanId([2; 8])),
            SpanKind::Client,
            11,
            "EVALSHA",
        );
        redis.end = 12;
        let limits = ["per_ip".to_owned(), "per_key".to_owned()];
        redis.set(
            "tollgate.limits",
            Value::Texts(limits.into_iter().collect()),
        );
        vec![RequestSpans {
            server,
            upstream: Some(client),
            store: vec![redis],
        }]
    }

    #[test]
    fn a_batch_decodes_as_the_spans_it_was_made_of() {
        let bytes = Encoder::default().encode("edge", &batch());
        let decoded = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let resource = decoded.resource_spans[0].resource.as_ref().unwrap();
        assert_eq!(resource.attributes[0].key, "service.name");
        let scope = &decoded.resource_spans[0].scope_spans[0];
        assert_eq!(scope.scope.as_ref().unwrap().name, SCOPE);
        assert_eq!(
            scope.scope.as_ref().unwrap().version,
            env!("CARGO_PKG_VERSION")
        );
        let spans = &scope.spans;
        assert_eq!(spans.len(), 3);
        assert_eq!(spans[0].name, "GET api");
        assert_eq!(spans[0].trace_id, vec![1; 16]);
        assert_eq!(spans[0].span_id, vec![2; 8]);
        assert_eq!(spans[0].kind, span::SpanKind::Server as i32);
        assert_eq!(spans[0].parent_span_id, vec![3; 8]);
        assert_eq!(spans[0].flags, 0x301);
        assert_eq!(
            (spans[0].start_time_unix_nano, spans[0].end_time_unix_nano),
            (10, 30)
        );
        let attribute = |span: &span_type::Span, key: &str| {
            span.attributes
                .iter()
                .find(|a| a.key == key)
                .and_then(|a| a.value.clone())
                .and_then(|v| v.value)
        };
        let text = |s: &str| Some(any_value::Value::StringValue(s.to_owned()));
        assert_eq!(spans[0].attributes.len(), 7);
        assert_eq!(
            attribute(&spans[0], "http.response.status_code"),
            Some(any_value::Value::IntValue(200))
        );
        assert_eq!(
            attribute(&spans[0], "negative"),
            Some(any_value::Value::IntValue(-5))
        );
        assert_eq!(
            attribute(&spans[0], "network.peer.address"),
            text("10.0.100.7")
        );
        assert_eq!(attribute(&spans[0], "client.address"), text("2001:db8::1"));
        assert_eq!(attribute(&spans[0], "url.path"), text("/api/é"));
        assert_eq!(attribute(&spans[0], "tollgate.route"), text("api"));
        assert_eq!(
            spans[0].status.as_ref().unwrap().code,
            status::StatusCode::Unset as i32
        );
        assert_eq!(spans[1].name, "GET");
        assert_eq!(spans[1].kind, span::SpanKind::Client as i32);
        assert_eq!(spans[1].parent_span_id, vec![2; 8]);
        assert_eq!(spans[1].flags, 0x101);
        assert_eq!(
            spans[1].status.as_ref().unwrap().code,
            status::StatusCode::Error as i32
        );
        assert_eq!(spans[2].name, "EVALSHA");
        let Some(any_value::Value::ArrayValue(limits)) = attribute(&spans[2], "tollgate.limits")
        else {
            panic!("{:?}", spans[2].attributes);
        };
        let limits: Vec<_> = limits.values.into_iter().filter_map(|v| v.value).collect();
        assert_eq!(limits, [text("per_ip").unwrap(), text("per_key").unwrap()]);
    }

    use opentelemetry_proto::tonic::trace::v1 as span_type;

    /// The same messages built with prost's types and encoded by prost:
    /// the same bytes.
    #[test]
    fn the_bytes_are_prosts_for_the_same_messages() {
        let ours = Encoder::default().encode("edge", &batch());
        let decoded = ExportTraceServiceRequest::decode(ours.as_slice()).unwrap();
        assert_eq!(decoded.encode_to_vec(), ours);
    }

    proptest! {
        /// Any ids, times and texts (lengths across the one- and two-byte
        /// varints) decode as written, the buffers reused between batches.
        #[test]
        fn fields_round_trip(
            trace in any::<[u8; 16]>(),
            id in any::<[u8; 8]>(),
            start in any::<u64>(),
            path in "\\PC{0,200}",
            ip in any::<[u8; 4]>(),
            n in any::<i64>(),
        ) {
            let mut span = SpanRecord::new(TraceId(trace), SpanId(id), None, SpanKind::Server, start, "POST");
            span.set("url.path", Value::Text(path.clone()));
            span.set("network.peer.address", Value::Ip(ip.into()));
            span.set("n", Value::Int(n));
            let mut encoder = Encoder::default();
            encoder.encode("s", &batch());
            let bytes = encoder.encode("s", &[RequestSpans { server: span, upstream: None, store: Vec::new() }]);
            let decoded = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
            let spans = &decoded.resource_spans[0].scope_spans[0].spans;
            prop_assert_eq!(spans.len(), 1);
            prop_assert_eq!(&spans[0].trace_id, &trace.to_vec());
            prop_assert_eq!(&spans[0].span_id, &id.to_vec());
            prop_assert!(spans[0].parent_span_id.is_empty());
            prop_assert_eq!(spans[0].start_time_unix_nano, start);
            let values: Vec<_> = spans[0].attributes.iter().map(|a| a.value.clone().unwrap().value.unwrap()).collect();
            prop_assert_eq!(&values[0], &any_value::Value::StringValue(path));
            prop_assert_eq!(&values[1], &any_value::Value::StringValue(std::net::Ipv4Addr::from(ip).to_string()));
            prop_assert_eq!(&values[2], &any_value::Value::IntValue(n));
        }
    }
}
