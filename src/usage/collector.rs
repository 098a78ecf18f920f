//! The collector's client: one `application/cloudevents-batch+json` POST
//! at a time over a kept-alive HTTP/1.1 connection (hyper's client
//! connection, on the exporter's own runtime), with a deadline per POST.
//! A connection that failed or closed is dropped and made again on the
//! next POST.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::usage::CollectorUrl;

/// The media type of a batch (CloudEvents' JSON batch format).
pub(crate) const BATCH_TYPE: &str = "application/cloudevents-batch+json";

/// How long a POST may take, connecting included; past it the batch is
/// sent again later (a collector that took it meanwhile deduplicates).
const DEADLINE: Duration = Duration::from_secs(10);

/// The most bytes of an answer's body kept, for the log line of a refusal.
const ANSWER_KEPT: usize = 512;

/// A collector's answer to one POST.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    /// The start of its body, for the log.
    pub(crate) body: Bytes,
}

/// Why a POST has no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PostError {
    #[error("cannot connect to the collector at {authority}: {source}")]
    Connect {
        authority: String,
        source: std::io::Error,
    },
    #[error("the collector's connection failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("the collector did not answer within {DEADLINE:?}")]
    Timeout,
}

/// The client of one collector URL.
#[derive(Debug)]
pub(crate) struct Collector {
    url: CollectorUrl,
    connection: Option<SendRequest<Full<Bytes>>>,
}

impl Collector {
    pub(crate) fn new(url: CollectorUrl) -> Collector {
        Collector {
            url,
            connection: None,
        }
    }

    /// POSTs `body` (a JSON array of events) and reads the answer.
    pub(crate) async fn post(&mut self, body: Vec<u8>) -> Result<Answer, PostError> {
        match tokio::time::timeout(DEADLINE, self.exchange(body)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                self.connection = None;
                Err(error)
            }
            Err(_) => {
                self.connection = None;
                Err(PostError::Timeout)
            }
        }
    }

    async fn exchange(&mut self, body: Vec<u8>) -> Result<Answer, PostError> {
        let reusable = match self.connection.take() {
            Some(mut sender) => sender.ready().await.is_ok().then_some(sender),
            None => None,
        };
        let mut sender = match reusable {
            Some(sender) => sender,
            None => self.connect().await?,
        };
        let request = Request::post(&self.url.path)
            .header(http::header::HOST, &self.url.host)
            .header(http::header::CONTENT_TYPE, BATCH_TYPE)
            .header(http::header::USER_AGENT, "tollgate")
            .body(Full::new(Bytes::from(body)))
            .expect("a checked URL's path and host make a request");
        let response = sender.send_request(request).await?;
        let status = response.status();
        // The whole body is read (so the connection can be used again),
        // the start of it kept.
        let mut kept = Vec::new();
        let mut incoming = response.into_body();
        while let Some(frame) = incoming.frame().await {
            if let Some(data) = frame?.data_ref() {
                let room = ANSWER_KEPT.saturating_sub(kept.len());
                kept.extend_from_slice(&data[..data.len().min(room)]);
            }
        }
        self.connection = Some(sender);
        Ok(Answer {
            status,
            body: Bytes::from(kept),
        })
    }

    async fn connect(&self) -> Result<SendRequest<Full<Bytes>>, PostError> {
        let authority = &self.url.authority;
        let stream = TcpStream::connect(authority.as_str())
            .await
            .map_err(|source| PostError::Connect {
                authority: authority.clone(),
                source,
            })?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            // Ends when the connection closes; its error is the next
            // POST's to see.
            let _ = connection.await;
        });
        Ok(sender)
    }
}
