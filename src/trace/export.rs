//! The exporter: recorded requests go into a bounded queue, and a thread
//! of its own (`tollgate-trace`, one single-threaded tokio runtime) posts
//! them to the collector in batches.
//!
//! Off the request path by construction: a request only `try_send`s its
//! spans (no lock, no wait); when the queue is full, as it is while a
//! collector is slow or down, the spans are dropped and counted
//! (`tollgate_trace_spans_dropped_total`), and so are those of a batch the
//! collector did not take. Nothing a collector does can hold a worker: the
//! connection, the timeout and the retry of a broken connection are all
//! on the exporter's thread.
//!
//! A batch is sent when it holds `batch` requests or `delay` after its
//! first one came, whichever is sooner; one export is in flight at a time,
//! bounded by `timeout` ([`Bounds::DEFAULT`]). The thread is woken twice
//! a batch, not once a request: by a batch's first request, and by the
//! request that fills it (until then it sleeps towards the delay and
//! takes what queued when it wakes). The body is written straight from
//! the records into buffers kept between batches (`otlp`); the client is
//! `post_client`'s HTTP/1.1 connection, kept alive between batches and
//! made again after a failure.
//!
//! The collector's address and the service name are read per batch, so a
//! reload that changes them takes effect at the next one.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Notify, mpsc};

use super::otlp;
use super::span::RequestSpans;
use crate::config::TracingConfig;
use crate::config::tracing::OtlpEndpoint;
use crate::post_client::{Collector, PostError, Target};

/// The exporter's bounds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Requests waiting for export at most; beyond it spans are dropped.
    pub(crate) queue: usize,
    /// Requests per export at most (up to twice as many spans).
    pub(crate) batch: usize,
    /// How long the first request of a batch waits for others.
    pub(crate) delay: Duration,
    /// One export's bound: connecting, sending and the collector's answer.
    pub(crate) timeout: Duration,
}

impl Bounds {
    /// The gateway's: 2,048 requests queued, 512 a batch (OpenTelemetry's
    /// default batch size; a few hundred KB of protobuf), a batch sent 1 s
    /// after its first request at the latest, 10 s an export
    /// (OpenTelemetry's export timeout).
    pub(crate) const DEFAULT: Bounds = Bounds {
        queue: 2048,
        batch: 512,
        delay: Duration::from_secs(1),
        timeout: Duration::from_secs(10),
    };
}

/// Where batches go, replaced whole by a reload.
#[derive(Debug, PartialEq, Eq)]
struct Destination {
    endpoint: OtlpEndpoint,
    service_name: Arc<str>,
}

/// The request path's end of the exporter: shared by every snapshot with
/// `[tracing]`, kept across reloads by the app.
#[derive(Debug)]
pub(crate) struct Exporter {
    queue: mpsc::Sender<Box<RequestSpans>>,
    /// Told when the queue holds a whole batch: the thread sends it
    /// without waiting out the delay.
    full: Arc<Notify>,
    batch: usize,
    destination: Arc<ArcSwap<Destination>>,
    dropped: Counter,
}

impl Exporter {
    /// Starts the exporter's thread for `config`; `dropped` counts the spans
    /// that never reached the collector. The thread ends once the exporter
    /// is dropped and its queue is drained.
    pub(crate) fn start(config: &TracingConfig, dropped: Counter) -> io::Result<Exporter> {
        Exporter::start_with(config, dropped, Bounds::DEFAULT)
    }

    /// [`Exporter::start`] within `bounds`.
    pub(crate) fn start_with(
        config: &TracingConfig,
        dropped: Counter,
        bounds: Bounds,
    ) -> io::Result<Exporter> {
        let (queue, receiver) = mpsc::channel(bounds.queue.max(1));
        let destination = Arc::new(ArcSwap::from_pointee(destination_of(config)));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let full = Arc::new(Notify::new());
        let sending = Sending {
            receiver,
            full: full.clone(),
            encoder: otlp::Encoder::default(),
            destination: destination.clone(),
            dropped: dropped.clone(),
            collector: None,
            failing: false,
            bounds,
        };
        std::thread::Builder::new()
            .name("tollgate-trace".into())
            .spawn(move || runtime.block_on(sending.run()))?;
        Ok(Exporter {
            queue,
            full,
            batch: bounds.batch.max(1),
            destination,
            dropped,
        })
    }

    /// A reload's `[tracing]`: the next batch goes where it says.
    pub(crate) fn reconfigure(&self, config: &TracingConfig) {
        let next = destination_of(config);
        if **self.destination.load() != next {
            self.destination.store(Arc::new(next));
        }
    }

    /// Hands a recorded request's spans to the exporter, or drops and
    /// counts them when the queue is full. Never waits.
    pub(crate) fn submit(&self, spans: Box<RequestSpans>) {
        let sent = self.queue.try_send(spans);
        if self.queue.max_capacity() - self.queue.capacity() >= self.batch {
            self.full.notify_one();
        }
        if let Err(error) = sent {
            let spans = match error {
                mpsc::error::TrySendError::Full(spans)
                | mpsc::error::TrySendError::Closed(spans) => spans,
            };
            self.dropped.inc_by(spans.len());
        }
    }
}

fn destination_of(config: &TracingConfig) -> Destination {
    Destination {
        endpoint: config.otlp.clone(),
        service_name: config.service_name.clone(),
    }
}

/// The exporter thread's state.
struct Sending {
    receiver: mpsc::Receiver<Box<RequestSpans>>,
    /// The request path's word that a batch is full.
    full: Arc<Notify>,
    /// Its buffers kept from one batch to the next.
    encoder: otlp::Encoder,
    destination: Arc<ArcSwap<Destination>>,
    dropped: Counter,
    /// The collector's client (its connection kept alive between
    /// batches), made again when a reload moves the endpoint.
    collector: Option<Collector>,
    /// Exports are failing: the first failure of a spell is a warning, the
    /// rest are debug lines, and the recovery is said once.
    failing: bool,
    bounds: Bounds,
}

/// Why an export did not reach the collector.
#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("{0}")]
    Post(#[from] PostError),
    #[error("the collector answered {0}")]
    Status(http::StatusCode),
}

impl Sending {
    /// Batches until every sender is gone, then sends what is left.
    async fn run(mut self) {
        let most = self.bounds.batch.max(1);
        let mut batch: Vec<Box<RequestSpans>> = Vec::with_capacity(most);
        loop {
            // A batch's first request wakes the thread.
            if self.receiver.recv_many(&mut batch, most).await == 0 {
                return;
            }
            let delay = tokio::time::sleep(self.bounds.delay);
            tokio::pin!(delay);
            let closed = loop {
                // Not `recv` while the batch fills: a waiting `recv` is
                // woken by every request.
                let closed = self.take_queued(&mut batch, most);
                if closed || batch.len() >= most {
                    break closed;
                }
                tokio::select! {
                    () = self.full.notified() => {}
                    () = &mut delay => break self.take_queued(&mut batch, most),
                }
            };
            self.export(&batch).await;
            batch.clear();
            if closed {
                return;
            }
        }
    }

    /// What waits in the queue into `batch`, up to `most`; whether every
    /// sender is gone and the queue empty. The boxes as they came: taking
    /// the spans out would copy each request's 1.7 KB record.
    #[expect(
        clippy::vec_box,
        reason = "the queue's boxes, kept to spare a copy of each"
    )]
    fn take_queued(&mut self, batch: &mut Vec<Box<RequestSpans>>, most: usize) -> bool {
        while batch.len() < most {
            match self.receiver.try_recv() {
                Ok(spans) => batch.push(spans),
                Err(mpsc::error::TryRecvError::Empty) => return false,
                Err(mpsc::error::TryRecvError::Disconnected) => return true,
            }
        }
        false
    }

    /// Sends one batch; a batch the collector did not take is counted as
    /// dropped spans.
    async fn export(&mut self, batch: &[Box<RequestSpans>]) {
        let destination = self.destination.load_full();
        let body = self.encoder.encode(
            &destination.service_name,
            batch.iter().map(|spans| &**spans),
        );
        let body = Bytes::from(body);
        match self.post(&destination.endpoint, body).await {
            Ok(()) => {
                if std::mem::replace(&mut self.failing, false) {
                    tracing::info!(collector = %destination.endpoint.url(), "trace export recovered");
                }
            }
            Err(error) => {
                let spans: u64 = batch.iter().map(|spans| spans.len()).sum();
                self.dropped.inc_by(spans);
                if std::mem::replace(&mut self.failing, true) {
                    tracing::debug!(collector = %destination.endpoint.url(), %error, spans, "trace export failed; spans dropped");
                } else {
                    tracing::warn!(collector = %destination.endpoint.url(), %error, spans, "trace export failed; spans dropped until the collector takes them");
                }
            }
        }
    }

    /// `POST` of `body` to the endpoint, within the export's bound, on
    /// the kept connection or a new one.
    async fn post(&mut self, endpoint: &OtlpEndpoint, body: Bytes) -> Result<(), ExportError> {
        let collector = match &mut self.collector {
            Some(collector)
                if collector.target().authority == endpoint.authority
                    && collector.target().path == endpoint.path =>
            {
                collector
            }
            kept => kept.insert(Collector::new(Target {
                authority: endpoint.authority.clone(),
                host: endpoint.authority.clone(),
                path: endpoint.path.clone(),
                content_type: "application/x-protobuf",
                deadline: self.bounds.timeout,
            })),
        };
        let answer = collector.post(body).await?;
        if !answer.status.is_success() {
            return Err(ExportError::Status(answer.status));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tracing::OtlpEndpoint;
    use crate::trace::context::{SpanId, TraceId};
    use crate::trace::span::{SpanKind, SpanRecord};

    fn spans() -> Box<RequestSpans> {
        let server = SpanRecord::new(
            TraceId([1; 16]),
            SpanId([2; 8]),
            None,
            SpanKind::Server,
            0,
            "GET",
        );
        Box::new(RequestSpans {
            server,
            upstream: None,
            store: Vec::new(),
        })
    }

    fn config(authority: String) -> TracingConfig {
        TracingConfig {
            otlp: OtlpEndpoint {
                authority,
                path: "/v1/traces".to_owned(),
            },
            sample: 1.0,
            service_name: "t".into(),
        }
    }

    /// A collector that takes the connection and never answers holds one
    /// batch in flight; the queue behind it fills, and what does not fit
    /// is dropped and counted at once, without waiting.
    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dropped = Counter::default();
        let bounds = Bounds {
            queue: 1,
            batch: 1,
            delay: Duration::from_millis(1),
            timeout: Duration::from_secs(60),
        };
        let exporter = Exporter::start_with(
            &config(silent.local_addr().unwrap().to_string()),
            dropped.clone(),
            bounds,
        )
        .unwrap();
        let started = std::time::Instant::now();
        for _ in 0..10 {
            exporter.submit(spans());
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        // One in the export, one in the queue, at most.
        assert!((8..=10).contains(&dropped.get()), "{}", dropped.get());
    }

    /// A collector that is down costs the batch's spans, counted.
    #[test]
    fn a_refused_export_counts_its_spans() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let authority = closed.local_addr().unwrap().to_string();
        drop(closed);
        let dropped = Counter::default();
        let bounds = Bounds {
            delay: Duration::from_millis(1),
            ..Bounds::DEFAULT
        };
        let exporter = Exporter::start_with(&config(authority), dropped.clone(), bounds).unwrap();
        for _ in 0..3 {
            exporter.submit(spans());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while dropped.get() < 3 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(dropped.get(), 3);
    }
}
