//! Usage events (contract section 14): one CloudEvents 1.0 event per
//! settled request of a token route (or of a route with `usage_events =
//! true`), delivered at least once to an HTTP collector in
//! `application/cloudevents-batch+json` POSTs (OpenMeter's ingest API), or
//! appended to a JSON-lines file.
//!
//! The way of an event:
//!
//! 1. **record** — where the request settles, a [`UsageRecord`] (a small
//!    struct: route, model, subject, tokens, status, duration, cost) is
//!    handed to the [`UsageSink`]: a `try_send` into a bounded queue, never
//!    a wait; a full queue drops the record and counts it (`dropped`).
//! 2. **write** — the exporter's writer thread ([`export`]) turns records
//!    into CloudEvents JSON ([`event`]: the id, a UUIDv7 of the time, the
//!    process's random node bits and a counter) and appends them to the
//!    spool's newest segment ([`spool`]), one `fsync` per batch; past
//!    `spool_max` the oldest segments are deleted and their events counted
//!    `dropped`. With `file =` it appends to that file instead, also one
//!    `fsync` per batch, and is done.
//! 3. **send** — the exporter's sender thread reads the spool oldest first
//!    and POSTs up to `batch` events at a time ([`crate::post_client`]); a 2xx
//!    acknowledges them (the spool's `ack` position moves, a segment read
//!    to its end is deleted). A 5xx, a 408 or 429, a timeout or a refused
//!    connection is retried after an exponential backoff (capped); any other
//!    4xx says the batch itself is bad: it is set aside in the spool's
//!    `dead-letter.jsonl`, counted `dead_letter`, and the next goes.
//!
//! Restarting the gateway resumes from the spool's acknowledged position,
//! so an event is delivered at least once; a collector deduplicates by the
//! event's `id` (OpenMeter does).

pub(crate) mod event;
mod export;
pub(crate) mod spool;

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};

use parking_lot::Mutex;

pub(crate) use export::Exporter;

use crate::config::usage::UsageConfig;
use crate::limit::{LimitKey, Nanos};
use crate::metrics::UsageMetrics;

/// Records waiting for the writer thread: a burst of this many settles
/// at once without loss while the writer syncs; more are dropped (and
/// counted), never waited for.
const QUEUE: usize = 16 * 1024;

/// What a settled request reports for its usage event: the hook's struct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UsageRecord {
    pub(crate) route: Arc<str>,
    /// The request body's `model`, when it had one.
    pub(crate) model: Option<Box<str>>,
    /// Who to bill: the event's `subject`.
    pub(crate) subject: Option<Subject>,
    pub(crate) tokens: Tokens,
    /// The response's status (`None`: the request ended without one).
    pub(crate) status: Option<u16>,
    /// From the request's arrival to its end (the body's last byte).
    pub(crate) duration: Nanos,
    /// When it settled, on the gateway's clock: the event's `time`.
    pub(crate) at: Nanos,
    /// What the usage cost, in micro-dollars; `None` unpriced.
    pub(crate) cost_usd_micros: Option<u64>,
}

/// The event's `subject`: the consumer, else the tenant, else the digest
/// of the key a limit counted the request under (never a raw key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Subject {
    Name(Arc<str>),
    Key(LimitKey),
}

/// The tokens a response reported; `None` for what it did not say (a
/// count from a header has only the total; no usage, nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub(crate) input: Option<u64>,
    /// Of `input`, read from a prompt cache. The scanner does not yet tell
    /// them apart: 0 wherever `input` is known.
    pub(crate) cached_input: Option<u64>,
    pub(crate) output: Option<u64>,
    pub(crate) total: Option<u64>,
}

/// The request side of the exporter, held by the app: records go in here.
#[derive(Debug)]
pub(crate) struct UsageSink {
    queue: SyncSender<UsageRecord>,
    /// The writer's end, taken once when the gateway starts the exporter.
    pending: Mutex<Option<Receiver<UsageRecord>>>,
    config: UsageConfig,
    metrics: UsageMetrics,
}

impl UsageSink {
    pub(crate) fn new(config: UsageConfig, metrics: UsageMetrics) -> Arc<UsageSink> {
        let (queue, receiver) = sync_channel(QUEUE);
        Arc::new(UsageSink {
            queue,
            pending: Mutex::new(Some(receiver)),
            config,
            metrics,
        })
    }

    /// Hands `record` to the exporter without waiting: a full queue (or an
    /// exporter that has stopped) drops it, counted.
    pub(crate) fn record(&self, record: UsageRecord) {
        match self.queue.try_send(record) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.metrics.dropped.inc();
            }
        }
    }

    /// Starts the exporter's threads (once; `None` after the first call):
    /// opens the spool or the file, which may fail.
    pub(crate) fn start(&self) -> Option<std::io::Result<Exporter>> {
        let receiver = self.pending.lock().take()?;
        Some(Exporter::start(
            &self.config,
            receiver,
            self.metrics.clone(),
        ))
    }
}
