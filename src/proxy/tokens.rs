//! Token quotas on the request path: what the request forwarded asks the
//! upstream for (its usage), and how its response settles (a
//! usage header at once, or a usage trailer or the body's `usage` scanned
//! as it is relayed, settled when the body ends).

use bytes::Bytes;
use http::Response;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderName, HeaderValue};
use http::request::Parts;

use crate::admission::body::{PendingBody, declared_length};
use crate::admission::{self, tokens::TokenBill};
use crate::answer::body::ResponseBody;
use crate::config::tokens::{TokensRule, UsageSource};
use crate::http::field_lines::FieldLines;
use crate::http1::client::OwnFields;
use crate::llm::reserve;
use crate::llm::usage::{Format, UsageScanner};

/// With `include_usage`, a streamed OpenAI request read whole without
/// `stream_options.include_usage` gets it (and its `Content-Length` is
/// made to fit), so that its stream ends with the usage. Its reservation
/// was counted on the body as the client sent it (admission's).
pub(crate) fn include_usage(rule: &TokensRule, body: &mut PendingBody, parts: &mut Parts) {
    let PendingBody::Complete(bytes) = body else {
        return;
    };
    if rule.include_usage
        && let Some(rewritten) = reserve::with_include_usage(bytes)
    {
        // Only a body framed by its length is rewritten: its new length is
        // then the one field to change.
        if declared_length(parts).is_some() {
            parts
                .headers
                .insert(CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
            *bytes = Bytes::from(rewritten);
        }
    }
}

/// A route that reads its usage from a field (`usage = "header:NAME"`)
/// takes it as a trailer too, and says so upstream: `TE: trailers`, which
/// the `TE` connection option must accompany (RFC 9110 §10.1.4); some
/// servers (hyper's) send trailer fields only then. The client's own `TE`
/// never goes on (hop-by-hop); HTTP/2 keeps `te: trailers` and drops
/// `Connection`.
pub(crate) fn accept_usage_trailer(rule: &TokensRule, own: &mut OwnFields) {
    if let UsageSource::Header(_) = rule.usage {
        own.push("te", b"trailers");
        own.push("connection", b"te");
    }
}

/// A bill on a route without `tokens` (it carries a usage event only):
/// the response's status noted, settled when its body ends.
pub(crate) fn settle_at_end(
    mut bill: TokenBill,
    response: Response<ResponseBody>,
) -> Response<ResponseBody> {
    bill.set_status(response.status().as_u16());
    response.map(|body| body.settled_at_end(bill))
}

/// Settles `bill` from the response: at once from a usage header, or
/// when its body ends from a trailer field of that name (a head without
/// the header), or from the usage the body reports (a JSON body or a
/// server-sent-event stream); a body of another type reports none.
pub(crate) fn settle_from(
    rule: &TokensRule,
    mut bill: TokenBill,
    response: Response<ResponseBody>,
    fields: &FieldLines,
) -> Response<ResponseBody> {
    bill.set_status(response.status().as_u16());
    // A field the upstream sent: relayed as a line, or (hyper's path) in
    // the response's map.
    let field = |name: &HeaderName| {
        fields
            .relayed_value(name.as_str())
            .or_else(|| response.headers().get(name).map(HeaderValue::as_bytes))
    };
    match &rule.usage {
        UsageSource::Header(name) => match field(name) {
            Some(value) => {
                bill.settle(admission::reported_count(value));
                response
            }
            // Not in the head: the count may come as a trailer field.
            None => response.map(|body| body.metered_by_trailer(name.clone(), bill)),
        },
        UsageSource::Auto => {
            let format = field(&CONTENT_TYPE).and_then(Format::of_content_type);
            match format {
                Some(format) => response.map(|body| body.metered(UsageScanner::new(format), bill)),
                // Settled when the body ends all the same: a usage event
                // holds the request's whole duration.
                None => response.map(|body| body.settled_at_end(bill)),
            }
        }
    }
}
