//! OpenTelemetry traces (`[tracing]`): which requests are recorded, their
//! spans, and their export over OTLP/HTTP.
//!
//! - [`context`]: W3C `traceparent`, parsed strictly and written.
//! - [`sampler`]: head sampling, parent-based with a ratio for new traces.
//! - [`span`]: the spans as the request path fills them.
//! - [`otlp`]: a batch as OTLP's protobuf `ExportTraceServiceRequest`.
//! - [`export`]: the bounded queue and the thread that posts batches.
//!
//! A snapshot with `[tracing]` holds a [`Tracing`]: the sampler of its
//! configuration and the app's one [`Exporter`], kept
//! across reloads. Without `[tracing]` a request pays one branch on the
//! snapshot's `None`. With it, an unsampled request pays a header lookup
//! and one random number; a sampled one fills its spans in a `Box` the
//! request's future points to (the future does not grow by the spans;
//! the attributes sit inline in it) and hands them to the exporter's
//! queue when it ends. What the spans say is the proxy's business
//! (`proxy::traced`); this module knows ids, times and attributes.
//!
//! Why not the `opentelemetry` SDK and `opentelemetry-otlp`: the SDK's
//! span is a dynamic object behind a global tracer provider, its batch
//! processor wants its own runtime glue, and `opentelemetry-otlp`'s HTTP
//! transport brings reqwest (a second HTTP client and TLS stack). The
//! gateway needs a few spans of a fixed shape per request; it writes
//! their OTLP protobuf itself (`otlp`, checked against
//! `opentelemetry-proto`'s types in the tests) and posts it with
//! `post_client`.

pub(crate) mod context;
pub(crate) mod export;
pub(crate) mod otlp;
pub(crate) mod sampler;
pub(crate) mod span;

use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::config::TracingConfig;
use context::{SpanId, TraceId, format_traceparent, parse_traceparent};
use export::Exporter;
use sampler::{Sampler, Start};
use span::RequestSpans;

/// The header a trace's context travels in (a constant name: looking it
/// up by a `&str` would parse the name on every request).
pub(crate) const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// One configuration's tracing: its sampler, and the app's exporter.
#[derive(Debug)]
pub(crate) struct Tracing {
    sampler: Sampler,
    exporter: Arc<Exporter>,
}

impl Tracing {
    pub(crate) fn new(config: &TracingConfig, exporter: Arc<Exporter>) -> Tracing {
        Tracing {
            sampler: Sampler::new(config.sample),
            exporter,
        }
    }

    /// Head sampling of a request with `headers`: `Some` where it is
    /// recorded. A `traceparent` field given more than once is malformed.
    #[inline]
    pub(crate) fn sample(&self, headers: &HeaderMap) -> Option<Start> {
        let mut values = headers.get_all(&TRACEPARENT).iter();
        let parent = match (values.next(), values.next()) {
            (Some(value), None) => parse_traceparent(value.as_bytes()),
            _ => None,
        };
        self.sampler.decide(parent, || fastrand::u64(..))
    }

    /// A recorded request's spans, ended: to the exporter's queue.
    pub(crate) fn export(&self, spans: Box<RequestSpans>) {
        self.exporter.submit(spans);
    }

    /// A recorded request's spans whose server span ends with the
    /// response's body, still arriving: exported when it ends.
    pub(crate) fn pending(&self, spans: Box<RequestSpans>) -> PendingSpans {
        PendingSpans {
            spans,
            exporter: self.exporter.clone(),
        }
    }
}

/// A recorded request's spans, the server span ended at the response's
/// head, waiting for its body to end.
#[derive(Debug)]
pub(crate) struct PendingSpans {
    spans: Box<RequestSpans>,
    exporter: Arc<Exporter>,
}

impl PendingSpans {
    /// The body ended `after` the head: the server span ends then, and
    /// the spans go to the exporter.
    pub(crate) fn end_after(mut self, after: std::time::Duration) {
        let after = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        self.spans.server.end = self.spans.server.end.saturating_add(after);
        self.exporter.submit(self.spans);
    }
}

/// A fresh span id.
pub(crate) fn new_span_id() -> SpanId {
    sampler::span_id(|| fastrand::u64(..))
}

/// The `traceparent` value naming `span_id` of `trace_id` as the parent of
/// what the receiver does (hex digits and `-`: always a valid value).
pub(crate) fn traceparent(trace_id: TraceId, span_id: SpanId) -> Option<HeaderValue> {
    HeaderValue::from_bytes(&format_traceparent(trace_id, span_id)).ok()
}
