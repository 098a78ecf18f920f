//! The spans of one recorded request as the request path fills them: ids,
//! times and attributes as plain values, turned into OTLP's messages
//! only on the exporter's thread (`otlp`), so a traced request pays for
//! a few small allocations and nothing else.

use std::sync::Arc;

use super::context::{SpanId, TraceId};

/// OpenTelemetry's span kinds that the gateway records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpanKind {
    /// The request as the gateway served it.
    Server,
    /// The request as the gateway sent it upstream.
    Client,
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// A fixed text (`"allowed"`, `"1.1"`).
    Static(&'static str),
    /// A name shared with the configuration (a route, a limit).
    Shared(Arc<str>),
    /// A text of the request (its path, its `User-Agent`).
    Text(String),
    Int(i64),
}

/// One span: where it sits in its trace, when it ran, what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpanRecord {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    /// The span it descends from (for a server span, the caller's, if the
    /// trace came in with the request).
    pub(crate) parent: Option<SpanId>,
    pub(crate) kind: SpanKind,
    pub(crate) name: String,
    /// Nanoseconds since the Unix epoch, on the gateway's clock.
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) attributes: Vec<(&'static str, Value)>,
    /// The span's status is `Error` (OpenTelemetry's HTTP conventions:
    /// a server span's 5xx, a client span's 4xx, 5xx or failure).
    pub(crate) error: bool,
}

impl SpanRecord {
    /// A span of `kind` starting at `start`, with room for `attributes`.
    pub(crate) fn new(
        trace_id: TraceId,
        span_id: SpanId,
        parent: Option<SpanId>,
        kind: SpanKind,
        start: u64,
        attributes: usize,
    ) -> SpanRecord {
        SpanRecord {
            trace_id,
            span_id,
            parent,
            kind,
            name: String::new(),
            start,
            end: start,
            attributes: Vec::with_capacity(attributes),
            error: false,
        }
    }

    /// Adds (or replaces) the attribute `key`.
    pub(crate) fn set(&mut self, key: &'static str, value: Value) {
        match self.attributes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, old)) => *old = value,
            None => self.attributes.push((key, value)),
        }
    }

    /// The value of the attribute `key`, if set.
    pub(crate) fn get(&self, key: &str) -> Option<&Value> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }
}

/// What a recorded request hands the exporter: its server span and, if it
/// went upstream, the client span of that exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestSpans {
    pub(crate) server: SpanRecord,
    pub(crate) upstream: Option<SpanRecord>,
}

impl RequestSpans {
    /// How many spans this is (what a drop counts).
    pub(crate) fn len(&self) -> u64 {
        1 + u64::from(self.upstream.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setting_an_attribute_again_replaces_it() {
        let mut span = SpanRecord::new(
            TraceId([1; 16]),
            SpanId([2; 8]),
            None,
            SpanKind::Server,
            5,
            2,
        );
        span.set("a", Value::Int(1));
        span.set("b", Value::Static("x"));
        span.set("a", Value::Int(2));
        assert_eq!(span.attributes.len(), 2);
        assert_eq!(span.get("a"), Some(&Value::Int(2)));
        assert_eq!(span.get("c"), None);
    }
}
