//! The spans of one recorded request as the request path fills them: ids,
//! times and attributes as plain values, written as OTLP's protobuf only
//! on the exporter's thread (`otlp`).
//!
//! Sized for the request path: a span's attributes sit inline (no
//! allocation for the list), keys are `&'static str`, a name is its two
//! parts (the method and the route, joined when written), addresses are
//! kept as addresses and written as text by the exporter. What stays a
//! copy is text of the request itself (its path, its `User-Agent`).

use std::net::IpAddr;
use std::sync::Arc;

use smallvec::SmallVec;

use super::context::{SpanId, TraceId};

/// OpenTelemetry's span kinds that the gateway records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpanKind {
    /// The request as the gateway served it.
    Server,
    /// A call the gateway made for it: upstream, or to Redis.
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
    /// An address, written as text.
    Ip(IpAddr),
    Int(i64),
    /// A list of texts (the limits a Redis call decided). A `Vec`: the
    /// value stays 32 bytes, each of a span's inline attributes with it.
    Texts(Vec<String>),
}

/// A span's name: `first`, then ` {then}` when there is a second part
/// (`GET api`: the method and the route).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Name {
    pub(crate) first: &'static str,
    pub(crate) then: Option<Arc<str>>,
}

impl Name {
    pub(crate) const fn of(first: &'static str) -> Name {
        Name { first, then: None }
    }
}

/// Attributes held inline: the most a server span sets (OpenTelemetry's
/// HTTP server attributes and the gateway's three).
pub(crate) type Attributes = SmallVec<[(&'static str, Value); 16]>;

/// One span: where it sits in its trace, when it ran, what it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpanRecord {
    pub(crate) trace_id: TraceId,
    pub(crate) span_id: SpanId,
    /// The span it descends from (for a server span, the caller's, if the
    /// trace came in with the request).
    pub(crate) parent: Option<SpanId>,
    pub(crate) kind: SpanKind,
    pub(crate) name: Name,
    /// Nanoseconds since the Unix epoch, on the gateway's clock.
    pub(crate) start: u64,
    pub(crate) end: u64,
    pub(crate) attributes: Attributes,
    /// The span's status is `Error` (OpenTelemetry's HTTP conventions:
    /// a server span's 5xx, a client span's 4xx, 5xx or failure).
    pub(crate) error: bool,
}

impl SpanRecord {
    /// A span of `kind` starting at `start`, named `first` until renamed.
    pub(crate) fn new(
        trace_id: TraceId,
        span_id: SpanId,
        parent: Option<SpanId>,
        kind: SpanKind,
        start: u64,
        first: &'static str,
    ) -> SpanRecord {
        SpanRecord {
            trace_id,
            span_id,
            parent,
            kind,
            name: Name::of(first),
            start,
            end: start,
            attributes: Attributes::new(),
            error: false,
        }
    }

    /// Adds the attribute `key`, which the span does not have yet (no
    /// search: a new span's first attributes).
    pub(crate) fn add(&mut self, key: &'static str, value: Value) {
        debug_assert!(self.get(key).is_none(), "{key} set twice");
        self.attributes.push((key, value));
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

/// What a recorded request hands the exporter: its server span, the
/// client span of its upstream exchange if it went upstream, and one
/// client span per Redis call its decision made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RequestSpans {
    pub(crate) server: SpanRecord,
    pub(crate) upstream: Option<SpanRecord>,
    pub(crate) store: Vec<SpanRecord>,
}

impl RequestSpans {
    /// How many spans this is (what a drop counts).
    pub(crate) fn len(&self) -> u64 {
        1 + u64::from(self.upstream.is_some()) + self.store.len() as u64
    }

    /// Every span, the server span first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &SpanRecord> {
        std::iter::once(&self.server)
            .chain(self.upstream.as_ref())
            .chain(&self.store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sixteen attributes sit inline in each span of a traced request's
    /// box: a value that grows grows them all.
    #[test]
    fn a_value_is_32_bytes() {
        assert!(size_of::<Value>() <= 32, "{}", size_of::<Value>());
    }

    #[test]
    fn setting_an_attribute_again_replaces_it() {
        let mut span = SpanRecord::new(
            TraceId([1; 16]),
            SpanId([2; 8]),
            None,
            SpanKind::Server,
            5,
            "GET",
        );
        span.set("a", Value::Int(1));
        span.set("b", Value::Static("x"));
        span.set("a", Value::Int(2));
        assert_eq!(span.attributes.len(), 2);
        assert_eq!(span.get("a"), Some(&Value::Int(2)));
        assert_eq!(span.get("c"), None);
    }
}
