//! The client of a collector that batches are POSTed to (usage events,
//! trace spans): one POST at a time over a kept-alive HTTP/1.1 connection
//! (hyper's client connection, on the exporter's own runtime), with a
//! deadline per POST. A connection that failed or closed is dropped and
//! made again on the next POST.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

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
    #[error("the collector did not answer within {0:?}")]
    Timeout(Duration),
}

/// Where a collector takes its batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// `host:port` to connect to.
    pub(crate) authority: String,
    /// The `Host` field.
    pub(crate) host: String,
    /// Path (and query) of the POST.
    pub(crate) path: String,
    /// The batches' media type.
    pub(crate) content_type: &'static str,
    /// How long a POST may take, connecting included.
    pub(crate) deadline: Duration,
}

/// The client of one collector.
#[derive(Debug)]
pub(crate) struct Collector {
    target: Target,
    connection: Option<SendRequest<Full<Bytes>>>,
}

impl Collector {
    pub(crate) fn new(target: Target) -> Collector {
        Collector {
            target,
            connection: None,
        }
    }

    /// Where it posts.
    pub(crate) fn target(&self) -> &Target {
        &self.target
    }

    /// POSTs `body` (a batch) and reads the answer.
    pub(crate) async fn post(&mut self, body: Bytes) -> Result<Answer, PostError> {
        let deadline = self.target.deadline;
        match tokio::time::timeout(deadline, self.exchange(body)).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(error)) => {
                self.connection = None;
                Err(error)
            }
            Err(_) => {
                self.connection = None;
                Err(PostError::Timeout(deadline))
            }
        }
    }

    async fn exchange(&mut self, body: Bytes) -> Result<Answer, PostError> {
        let reusable = match self.connection.take() {
            Some(mut sender) => sender.ready().await.is_ok().then_some(sender),
            None => None,
        };
        let mut sender = match reusable {
            Some(sender) => sender,
            None => self.connect().await?,
        };
        let target = &self.target;
        let request = Request::post(&target.path)
            .header(http::header::HOST, &target.host)
            .header(http::header::CONTENT_TYPE, target.content_type)
            .header(http::header::USER_AGENT, "tollgate")
            .body(Full::new(body))
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
        let authority = &self.target.authority;
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
