//! What a request's usage event (`[usage]`, contract section 14) takes
//! from admission: the body's `model` and the caller's consumer or tenant,
//! learnt while the request is keyed ([`UsageFacts`]), and the note its
//! bill carries to the settlement ([`UsageNote`]), where the record is
//! handed to the exporter (`crate::usage`) with the tokens and the status.
//!
//! Only for a route whose requests send events (`usage_events`, on by
//! default with `tokens = {...}`) while the gateway has `[usage]`: for
//! every other request this is one `bool` read.

use std::sync::Arc;

use crate::app::App;
use crate::config::{Consumer, RouteConfig};
use crate::limit::{LimitKey, Nanos};
use crate::llm::usage::Usage;
use crate::usage::{Subject, Tokens, UsageRecord, UsageSink};

/// What keying a request learnt for its usage event.
#[derive(Debug, Default)]
pub(crate) struct UsageFacts {
    /// The request sends an event.
    pub(crate) wanted: bool,
    /// Its body's `model`.
    pub(crate) model: Option<Box<str>>,
    /// Its consumer's name, else its consumer's tenant.
    pub(crate) subject: Option<Arc<str>>,
}

impl UsageFacts {
    /// For a request on `route`: wanted when the route sends events and
    /// the gateway has somewhere to send them.
    #[inline(always)]
    pub(crate) fn for_route(app: &App, route: &RouteConfig) -> UsageFacts {
        UsageFacts {
            wanted: route.usage_events && app.usage().is_some(),
            ..UsageFacts::default()
        }
    }

    /// Notes the caller's consumer (its name, else its tenant).
    #[inline(always)]
    pub(crate) fn caller(&mut self, consumer: Option<&Consumer>) {
        if self.wanted {
            self.subject = consumer
                .map(|c| {
                    c.tenant
                        .as_ref()
                        .filter(|_| c.consumer.is_empty())
                        .unwrap_or(&c.consumer)
                })
                .cloned();
        }
    }

    /// The note a wanted request's bill carries, started at `now`; `key`
    /// names the caller when no consumer does.
    pub(crate) fn into_note(
        self,
        app: &App,
        key: Option<LimitKey>,
        now: Nanos,
    ) -> Option<Box<UsageNote>> {
        if !self.wanted {
            return None;
        }
        let sink = app.usage()?.clone();
        let subject = match (self.subject, key) {
            (Some(name), _) => Some(Subject::Name(name)),
            (None, Some(key)) => Some(Subject::Key(key)),
            (None, None) => None,
        };
        Some(Box::new(UsageNote {
            sink,
            model: self.model,
            subject,
            started: now,
            status: None,
        }))
    }
}

/// A request's usage event in the making: what admission knew, the
/// response's status once it came; recorded when the request settles.
#[derive(Debug)]
pub(crate) struct UsageNote {
    sink: Arc<UsageSink>,
    model: Option<Box<str>>,
    subject: Option<Subject>,
    /// The request's arrival, on the gateway's clock.
    started: Nanos,
    status: Option<u16>,
}

impl UsageNote {
    /// The body's `model`, which prices the event.
    pub(crate) fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// The response's status.
    pub(crate) fn set_status(&mut self, status: u16) {
        self.status = Some(status);
    }

    /// Hands the record to the exporter (never waits): the request on
    /// `route` settled at `now` on `used` tokens, split as `split` when
    /// the response said how (a count from a header has the total only).
    ///
    /// `cost_usd_micros` is the settled usage priced by the body's model
    /// (`None`: unpriced).
    pub(crate) fn record(
        self,
        route: &Arc<str>,
        used: Option<u64>,
        split: Option<Usage>,
        now: Nanos,
        cost_usd_micros: Option<u64>,
    ) {
        let tokens = match split {
            Some(usage) => Tokens {
                input: Some(usage.input),
                cached_input: Some(usage.cached),
                output: Some(usage.output),
                total: Some(usage.total),
            },
            None => Tokens {
                total: used,
                ..Tokens::default()
            },
        };
        self.sink.record(UsageRecord {
            route: route.clone(),
            model: self.model,
            subject: self.subject,
            tokens,
            status: self.status,
            duration: now.saturating_sub(self.started),
            at: now,
            cost_usd_micros,
        });
    }
}
