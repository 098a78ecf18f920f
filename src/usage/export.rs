//! The exporter: two threads of its own, off the gateway's runtimes so
//! that nothing it does (an `fsync`, a slow collector) ever delays a
//! request.
//!
//! - The **writer** takes records from the sink's queue as they come,
//!   up to `batch` (to the spool at least [`PER_SYNC`]) at a time, a partial lot
//!   waiting [`LINGER`] for more, writes them as event lines and syncs
//!   them once per lot: to
//!   the spool (then wakes the sender when a batch is full or the spool
//!   was empty) or to the `file`.
//! - The **sender** (with a collector `url`) runs a one-thread tokio
//!   runtime for its HTTP client and sends the spool oldest first: a full
//!   batch at once, a partial one after `interval`; a failure waits a
//!   backoff of 250 ms doubling to 30 s (±25 % jitter) before the same
//!   batch goes again.
//!
//! [`Exporter::stop`] ends both: the writer first writes and syncs every
//! record still queued, so a gateway that stops loses nothing it had
//! accepted; the sender stops between POSTs (what it had not sent waits
//! in the spool for the next start).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::Notify;

use super::UsageRecord;
use super::event::{self, Ids};
use super::spool::{Batch, Spool};
use crate::config::usage::{CollectorUrl, UsageConfig, UsageSinkConfig};
use crate::metrics::UsageMetrics;
use crate::post_client::{Collector, PostError, Target};

/// How often an idle writer looks for the stop.
const TICK: Duration = Duration::from_millis(50);
/// How long a lot that is not full waits for more records before it is
/// written and synced: requests settling one at a time would otherwise
/// cost an `fsync` and a wake of the writer (and of the sender) each. At
/// 10 ms a gateway at 20,000 requests/s synced ~70 times a second, most of
/// the exporter's system time; at 50 ms, ~20. A crash loses at most the
/// records of the lot not yet synced: none of them was acknowledged to
/// anyone (a request's response never waits for its event).
const LINGER: Duration = Duration::from_millis(50);
/// Most records the writer syncs at once when `batch` is smaller: a sync
/// takes milliseconds on a busy disk, and one per 100 events would cap
/// the rate near the request rate of a busy gateway. A lot of [`LINGER`]
/// fills this at ~80,000 requests/s.
const PER_SYNC: usize = 4096;
/// The first wait after a failed POST.
const BACKOFF_BASE: Duration = Duration::from_millis(250);
/// The longest.
const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// The media type of a batch (CloudEvents' JSON batch format).
pub(crate) const BATCH_TYPE: &str = "application/cloudevents-batch+json";
/// How long a POST may take, connecting included; past it the batch is
/// sent again later (a collector that took it meanwhile deduplicates).
const DEADLINE: Duration = Duration::from_secs(10);

/// The running exporter's threads.
#[derive(Debug)]
pub(crate) struct Exporter {
    stop: Arc<Stop>,
    writer: JoinHandle<()>,
    sender: Option<JoinHandle<()>>,
}

/// The stop signal both threads watch.
#[derive(Debug, Default)]
struct Stop {
    flag: AtomicBool,
    /// Wakes the sender: the writer appended, or the stop.
    wake: Notify,
}

/// Where the writer puts events.
enum Output {
    Spool(Arc<Spool>),
    File(File),
}

impl Exporter {
    /// Opens the spool (or the file) and starts the threads.
    pub(crate) fn start(
        config: &UsageConfig,
        queue: Receiver<UsageRecord>,
        metrics: UsageMetrics,
    ) -> io::Result<Exporter> {
        let stop = Arc::new(Stop::default());
        let (output, collector) = match &config.sink {
            UsageSinkConfig::File(path) => (Output::File(open_file(path)?), None),
            UsageSinkConfig::Collector {
                url,
                spool,
                spool_max,
            } => {
                let (opened, found) = Spool::open(spool, *spool_max).map_err(|error| {
                    io::Error::new(
                        error.kind(),
                        format!("usage.spool `{}`: {error}", spool.display()),
                    )
                })?;
                if found.torn > 0 {
                    tracing::warn!(
                        bytes = found.torn,
                        "usage spool: a torn last line (a crash mid-write) was cut off"
                    );
                }
                if found.pending > 0 {
                    tracing::info!(
                        events = found.pending,
                        "usage spool: sending the events a previous run left"
                    );
                }
                metrics.spool_events.set(clamp_gauge(found.pending));
                (Output::Spool(Arc::new(opened)), Some(url.clone()))
            }
        };
        let sender = match (&output, collector) {
            (Output::Spool(spool), Some(url)) => {
                let sending = Sending {
                    spool: spool.clone(),
                    collector: url,
                    batch: config.batch,
                    interval: config.interval,
                    metrics: metrics.clone(),
                    stop: stop.clone(),
                };
                Some(
                    std::thread::Builder::new()
                        .name("usage-sender".into())
                        .spawn(move || sending.run())?,
                )
            }
            _ => None,
        };
        // `batch` is the file's write and sync (the config says so).
        let per_sync = match output {
            Output::Spool(_) => config.batch.max(PER_SYNC),
            Output::File(_) => config.batch,
        };
        let writing = Writing {
            queue,
            output,
            batch: config.batch,
            per_sync,
            ids: Ids::new(fastrand::u64(..), &event::source()),
            metrics,
            stop: stop.clone(),
        };
        let writer = std::thread::Builder::new()
            .name("usage-writer".into())
            .spawn(move || writing.run())?;
        Ok(Exporter {
            stop,
            writer,
            sender,
        })
    }

    /// Stops both threads and waits for them: every queued record is
    /// written first. Blocking: call it off the async workers.
    pub(crate) fn stop(self) {
        self.stop.flag.store(true, Ordering::Release);
        self.stop.wake.notify_one();
        let _ = self.writer.join();
        if let Some(sender) = self.sender {
            let _ = sender.join();
        }
    }
}

fn open_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("usage.file `{}`: {error}", path.display()),
            )
        })
}

fn clamp_gauge(events: u64) -> i64 {
    i64::try_from(events).unwrap_or(i64::MAX)
}

/// The writer thread's state.
struct Writing {
    queue: Receiver<UsageRecord>,
    output: Output,
    /// The sender's batch: a full one wakes it.
    batch: usize,
    /// Most records written per `fsync`.
    per_sync: usize,
    ids: Ids,
    metrics: UsageMetrics,
    stop: Arc<Stop>,
}

impl Writing {
    fn run(mut self) {
        let mut lines = Vec::new();
        loop {
            let first = match self.queue.recv_timeout(TICK) {
                Ok(record) => record,
                Err(RecvTimeoutError::Timeout) if self.stop.flag.load(Ordering::Acquire) => {
                    // Stopped, and the queue is empty.
                    return;
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            lines.clear();
            event::write_line(&first, &mut self.ids, &mut lines);
            let mut events = self.take(1, &mut lines);
            // Short of a batch: the records that come meanwhile join it
            // (a sleep, not a wait on the queue, so that no request wakes
            // the writer).
            if events < self.per_sync && !self.stop.flag.load(Ordering::Acquire) {
                std::thread::sleep(LINGER);
                events = self.take(events, &mut lines);
            }
            self.write(&lines, events as u64);
        }
    }

    /// Adds the queued records to the `events` in `lines`, up to
    /// `per_sync`; their count after.
    fn take(&mut self, mut events: usize, lines: &mut Vec<u8>) -> usize {
        while events < self.per_sync {
            let Ok(record) = self.queue.try_recv() else {
                break;
            };
            event::write_line(&record, &mut self.ids, lines);
            events += 1;
        }
        events
    }

    /// One batch written and synced.
    fn write(&mut self, lines: &[u8], events: u64) {
        match &mut self.output {
            Output::File(file) => match file.write_all(lines).and_then(|()| file.sync_data()) {
                Ok(()) => {
                    self.metrics.sent.inc_by(events);
                }
                Err(error) => {
                    tracing::error!(%error, events, "usage file: cannot write events; they are lost");
                    self.metrics.dropped.inc_by(events);
                }
            },
            Output::Spool(spool) => {
                match spool.append(lines, events) {
                    Ok(0) => {}
                    Ok(dropped) => {
                        tracing::warn!(
                            events = dropped,
                            "usage spool full (spool_max): the oldest events were dropped"
                        );
                        self.metrics.dropped.inc_by(dropped);
                    }
                    Err(error) => {
                        tracing::error!(%error, events, "usage spool: cannot write events; they are lost");
                        self.metrics.dropped.inc_by(events);
                    }
                }
                let pending = spool.publish_pending(|pending| {
                    self.metrics.spool_events.set(clamp_gauge(pending));
                    pending
                });
                // The sender waits for a full batch, or for `interval`
                // from the first event of a partial one: woken when one
                // is full, or when the spool had nothing before.
                if pending >= self.batch as u64 || pending <= events {
                    self.stop.wake.notify_one();
                }
            }
        }
    }
}

/// The sender thread's state.
struct Sending {
    spool: Arc<Spool>,
    collector: CollectorUrl,
    batch: usize,
    interval: Duration,
    metrics: UsageMetrics,
    stop: Arc<Stop>,
}

/// What became of one batch.
enum Sent {
    /// Acknowledged, or set aside: on to the next.
    Done,
    /// To be sent again after a backoff.
    Failed,
}

impl Sending {
    fn run(self) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::error!(%error, "usage exporter: cannot start its runtime; events stay in the spool");
                return;
            }
        };
        runtime.block_on(self.send_all());
    }

    fn stopped(&self) -> bool {
        self.stop.flag.load(Ordering::Acquire)
    }

    /// Waits `duration`, or less if woken (an append, the stop).
    async fn pause(&self, duration: Duration) {
        let _ = tokio::time::timeout(duration, self.stop.wake.notified()).await;
    }

    async fn send_all(&self) {
        let url = &self.collector;
        let mut collector = Collector::new(Target {
            authority: url.authority.clone(),
            host: url.host.clone(),
            path: url.path.clone(),
            content_type: BATCH_TYPE,
            deadline: DEADLINE,
        });
        let mut failures: u32 = 0;
        // When the first partial batch was seen: it goes `interval` later.
        let mut partial_since: Option<tokio::time::Instant> = None;
        while !self.stopped() {
            // Still short of a batch within `interval` of the partial one
            // read before (a wake by an append): wait on, without reading
            // it again.
            if let Some(since) = partial_since
                && failures == 0
                && self.spool.pending() < self.batch as u64
                && since.elapsed() < self.interval
            {
                self.pause(self.interval.saturating_sub(since.elapsed()))
                    .await;
                continue;
            }
            let batch = match self.spool.next_batch(self.batch) {
                Ok(Some(batch)) => batch,
                Ok(None) => {
                    partial_since = None;
                    self.pause(self.interval).await;
                    continue;
                }
                Err(error) => {
                    tracing::error!(%error, "usage spool: cannot read; trying again");
                    self.pause(BACKOFF_CAP).await;
                    continue;
                }
            };
            if batch.len() < self.batch && failures == 0 {
                let since = *partial_since.get_or_insert_with(tokio::time::Instant::now);
                let waited = since.elapsed();
                if waited < self.interval {
                    self.pause(self.interval - waited).await;
                    continue;
                }
            }
            partial_since = None;
            match self.send(&mut collector, &batch).await {
                Sent::Done => failures = 0,
                Sent::Failed => {
                    failures = failures.saturating_add(1);
                    self.backoff(failures).await;
                }
            }
        }
    }

    /// Waits the backoff after the `failures`th failure in a row, or
    /// until the stop.
    async fn backoff(&self, failures: u32) {
        let doubled = BACKOFF_BASE.saturating_mul(1 << failures.saturating_sub(1).min(16));
        let wait = doubled
            .min(BACKOFF_CAP)
            .mul_f64(0.75 + fastrand::f64() * 0.5);
        let deadline = tokio::time::Instant::now() + wait;
        while !self.stopped() && tokio::time::Instant::now() < deadline {
            // Appends wake the pause too: sleep out the rest.
            self.pause(deadline - tokio::time::Instant::now()).await;
        }
    }

    async fn send(&self, collector: &mut Collector, batch: &Batch) -> Sent {
        let events = batch.len() as u64;
        if events == 0 {
            // Only damaged lines, or a segment dropped meanwhile.
            return self.acknowledge(batch);
        }
        // The stop ends a POST in flight (the batch stays in the spool).
        let post = collector.post(batch.body());
        tokio::pin!(post);
        let posted = loop {
            tokio::select! {
                posted = &mut post => break posted,
                () = self.stop.wake.notified() => {
                    if self.stopped() {
                        return Sent::Failed;
                    }
                }
            }
        };
        match posted {
            Ok(answer) if answer.status.is_success() => {
                self.metrics.sent.inc_by(events);
                self.acknowledge(batch)
            }
            Ok(answer) if is_refusal(answer.status) => {
                tracing::warn!(
                    status = answer.status.as_u16(),
                    answer = %String::from_utf8_lossy(&answer.body),
                    events,
                    "usage collector refused a batch; it is set aside in the spool's dead-letter.jsonl"
                );
                if let Err(error) = self.spool.set_aside(batch) {
                    tracing::error!(%error, "usage spool: cannot write the dead-letter file; the batch is lost");
                }
                self.metrics.dead_letter.inc_by(events);
                self.acknowledge(batch)
            }
            Ok(answer) => {
                tracing::warn!(
                    status = answer.status.as_u16(),
                    events,
                    "usage collector failed a batch; sending it again later"
                );
                self.metrics.failed.inc_by(events);
                Sent::Failed
            }
            Err(error) => {
                log_failure(&error, events);
                self.metrics.failed.inc_by(events);
                Sent::Failed
            }
        }
    }

    fn acknowledge(&self, batch: &Batch) -> Sent {
        if let Err(error) = self.spool.ack(batch) {
            tracing::error!(%error, "usage spool: cannot save the acknowledged position; the batch may be sent again");
        }
        self.spool.publish_pending(|pending| {
            self.metrics.spool_events.set(clamp_gauge(pending));
        });
        Sent::Done
    }
}

/// A 4xx that says the batch itself is wrong (not 408 Request Timeout or
/// 429 Too Many Requests, which say "later").
fn is_refusal(status: http::StatusCode) -> bool {
    status.is_client_error()
        && status != http::StatusCode::REQUEST_TIMEOUT
        && status != http::StatusCode::TOO_MANY_REQUESTS
}

fn log_failure(error: &PostError, events: u64) {
    tracing::warn!(%error, events, "usage collector unreachable; events wait in the spool");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_4xx_about_the_batch_sets_it_aside() {
        for (status, refused) in [
            (400, true),
            (413, true),
            (422, true),
            (408, false),
            (429, false),
            (500, false),
            (503, false),
            (200, false),
        ] {
            let status = http::StatusCode::from_u16(status).unwrap();
            assert_eq!(is_refusal(status), refused, "{status}");
        }
    }
}
