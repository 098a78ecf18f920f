//! HTTP/2 to an upstream (`http2 = true`): one multiplexed connection per
//! URL through hyper's client, made on first use and made again once it
//! has closed. TLS URLs must agree to `h2` by ALPN; `http://` ones get
//! HTTP/2 with prior knowledge (h2c).
//!
//! A request is first written as it would go out on HTTP/1.1
//! ([`encode_request`]: the same forwarding fields, the same hop-by-hop
//! rules), and those lines become its HTTP/2 fields (`Host` its
//! `:authority`). The response's fields are read back through the HTTP/1.1
//! client's head parser ([`parse_response`]), so what is relayed, dropped
//! or refused is what it is for an HTTP/1.1 upstream.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::{Bytes, BytesMut};
use http::request::Parts;
use http::uri::{Authority, Scheme};
use http::{HeaderName, HeaderValue, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::time::Sleep;

use super::pool::{PoolError, PoolTls, connect_within};
use crate::http::field_lines::FieldLines;
use crate::http1::client::OwnFields;
use crate::http1::client::UpstreamBody;
use crate::http1::client::head::{Parsed, RequestFraming, encode_request, parse_response};

/// A request body as hyper's client takes it.
type Outgoing = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// The handle of an open HTTP/2 connection ([`H2Client::connection`]).
pub(crate) type H2Sender = SendRequest<Outgoing>;

/// Request fields that are HTTP/1.1 connection business, never HTTP/2
/// fields (RFC 9113 §8.2.2); `te` goes only as `trailers`.
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// The HTTP/2 connection to one upstream URL.
pub(crate) struct H2Client {
    /// `host:port`.
    address: String,
    scheme: Scheme,
    connect_timeout: Duration,
    /// Longest wait for the next frame of a response body.
    read_timeout: Duration,
    /// `https://`: the handshake, offering ALPN `h2` only.
    tls: Option<PoolTls>,
    /// The connection's handle while it is open.
    sender: ArcSwapOption<SendRequest<Outgoing>>,
    /// Held while a connection is being made, so requests that find none
    /// wait for the one being made rather than each opening their own.
    connecting: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for H2Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Client")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl H2Client {
    pub(crate) fn new(
        address: String,
        scheme: Scheme,
        connect_timeout: Duration,
        read_timeout: Duration,
        tls: Option<PoolTls>,
    ) -> H2Client {
        H2Client {
            address,
            scheme,
            connect_timeout,
            read_timeout,
            tls,
            sender: ArcSwapOption::empty(),
            connecting: tokio::sync::Mutex::new(()),
        }
    }

    /// Sends `request` (with `own`'s fields, as [`encode_request`] writes
    /// them) and waits for the response head. The response's fields come as
    /// lines beside it, as from the HTTP/1.1 pool; its body streams from the
    /// HTTP/2 stream, cut after `read_timeout` without a frame.
    pub(crate) async fn send<B>(
        &self,
        request: Request<B>,
        own: OwnFields,
    ) -> Result<(Response<UpstreamBody>, FieldLines), PoolError>
    where
        B: Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
            + Send
            + 'static,
    {
        let (parts, body) = request.into_parts();
        let sender = self.connection().await?;
        self.send_on(sender, &parts, body, &own).await
    }

    /// The open connection's handle, or one to a new connection. Nothing is
    /// sent: a failure here is always a [`PoolError::Connect`].
    pub(crate) async fn connection(&self) -> Result<H2Sender, PoolError> {
        self.sender().await
    }

    /// [`H2Client::send`] on `sender`, from [`H2Client::connection`]; the
    /// request's head and `own` borrowed, as by the HTTP/1.1 pool's
    /// `send_on`.
    pub(crate) async fn send_on<B>(
        &self,
        mut sender: H2Sender,
        parts: &Parts,
        body: B,
        own: &OwnFields,
    ) -> Result<(Response<UpstreamBody>, FieldLines), PoolError>
    where
        B: Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
            + Send
            + 'static,
    {
        let framing = if body.is_end_stream() {
            RequestFraming::Empty
        } else {
            match body.size_hint().exact() {
                Some(length) => RequestFraming::Length(length),
                None => RequestFraming::Chunked,
            }
        };
        let mut head = Vec::with_capacity(512);
        encode_request(parts, framing, own, &mut head);
        let body = body.map_err(Into::into).boxed_unsync();
        let request = self.h2_request(&head, body).map_err(PoolError::Request)?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|error| PoolError::Request(exchange_error(error)))?;
        let (head, incoming) = response.into_parts();
        let mut lines = BytesMut::with_capacity(512);
        lines.extend_from_slice(b"HTTP/1.1 ");
        lines.extend_from_slice(head.status.as_str().as_bytes());
        lines.extend_from_slice(b" \r\n");
        for (name, value) in &head.headers {
            lines.extend_from_slice(name.as_str().as_bytes());
            lines.extend_from_slice(b": ");
            lines.extend_from_slice(value.as_bytes());
            lines.extend_from_slice(b"\r\n");
        }
        lines.extend_from_slice(b"\r\n");
        let head = match parse_response(&mut lines, &parts.method) {
            Ok(Parsed::Head(head)) => head,
            Ok(Parsed::Interim(_) | Parsed::Partial) => {
                return Err(PoolError::Request(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the upstream's HTTP/2 response is no final response",
                )));
            }
            Err(error) => return Err(PoolError::Request(error)),
        };
        let body = StreamBody {
            incoming,
            timeout: self.read_timeout,
            stall: Box::pin(tokio::time::sleep(self.read_timeout)),
        };
        let body = UpstreamBody::boxed(body.boxed_unsync());
        Ok((Response::from_parts(head.parts, body), head.fields))
    }

    /// The request as HTTP/2 takes it, from its HTTP/1.1 head `head`.
    fn h2_request(&self, head: &[u8], body: Outgoing) -> io::Result<Request<Outgoing>> {
        let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_owned());
        let mut fields = [httparse::EMPTY_HEADER; 128];
        let mut parsed = httparse::Request::new(&mut fields);
        match parsed.parse(head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return Err(invalid("the request head could not be read back")),
        }
        let method = parsed
            .method
            .ok_or_else(|| invalid("no method"))?
            .parse::<http::Method>()
            .map_err(|_| invalid("bad method"))?;
        let path = parsed.path.ok_or_else(|| invalid("no target"))?;
        let mut authority = None;
        let mut builder = Request::builder().method(method);
        for field in parsed.headers.iter() {
            let name = field.name.to_ascii_lowercase();
            if name == "host" {
                authority = Some(
                    Authority::try_from(field.value).map_err(|_| invalid("bad Host for HTTP/2"))?,
                );
                continue;
            }
            if CONNECTION_SPECIFIC.contains(&name.as_str())
                || (name == "te" && !field.value.eq_ignore_ascii_case(b"trailers"))
            {
                continue;
            }
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid("bad name"))?;
            let value = HeaderValue::from_bytes(field.value).map_err(|_| invalid("bad value"))?;
            builder = builder.header(name, value);
        }
        let authority = authority.ok_or_else(|| invalid("no Host"))?;
        let uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(authority)
            .path_and_query(path)
            .build()
            .map_err(|_| invalid("bad target"))?;
        builder
            .uri(uri)
            .version(http::Version::HTTP_2)
            .body(body)
            .map_err(|_| invalid("the request could not be built"))
    }

    /// The open connection's handle, or one to a new connection.
    async fn sender(&self) -> Result<SendRequest<Outgoing>, PoolError> {
        if let Some(sender) = self.open() {
            return Ok(sender);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(sender) = self.open() {
            return Ok(sender);
        }
        let sender = self.connect().await?;
        self.sender.store(Some(Arc::new(sender.clone())));
        Ok(sender)
    }

    fn open(&self) -> Option<SendRequest<Outgoing>> {
        let sender = self.sender.load_full()?;
        (!sender.is_closed()).then(|| (*sender).clone())
    }

    async fn connect(&self) -> Result<SendRequest<Outgoing>, PoolError> {
        connect_within(&self.address, self.connect_timeout, |stream| async {
            let Some(tls) = &self.tls else {
                return handshake(TokioIo::new(stream), self.liveness()).await;
            };
            let stream = tls.handshake(stream).await?;
            if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the upstream did not agree to HTTP/2 (ALPN h2); drop `http2 = true` for an HTTP/1.1 upstream",
                ));
            }
            handshake(TokioIo::new(stream), self.liveness()).await
        })
        .await
    }

    /// How a connection is kept honest while it carries nothing: silent for
    /// `read_timeout`, it is sent a PING, and no answer within
    /// `connect_timeout` closes it, so that the next request opens a new one
    /// rather than waiting on a connection whose upstream has gone.
    fn liveness(&self) -> Liveness {
        Liveness {
            ping_after: self.read_timeout,
            answer_within: self.connect_timeout,
        }
    }
}

/// PINGs on a quiet connection ([`H2Client::liveness`]).
#[derive(Debug, Clone, Copy)]
struct Liveness {
    ping_after: Duration,
    answer_within: Duration,
}

/// The HTTP/2 handshake on `io`; the connection is driven by a task of its
/// own until it closes (or fails `liveness`).
async fn handshake<T>(io: T, liveness: Liveness) -> io::Result<SendRequest<Outgoing>>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(liveness.ping_after)
        .keep_alive_timeout(liveness.answer_within)
        .keep_alive_while_idle(true)
        .handshake(io)
        .await
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "upstream HTTP/2 connection ended");
        }
    });
    Ok(sender)
}

/// A failed exchange as the pipeline reads it. A request body's own error
/// (the client's fault) stays reachable as the hyper error's source, where
/// the pipeline looks for it (`ClientBodyError::of`).
fn exchange_error(error: hyper::Error) -> io::Error {
    let kind = if error.is_user() {
        io::ErrorKind::Other
    } else if error.is_parse() {
        io::ErrorKind::InvalidData
    } else {
        io::ErrorKind::ConnectionReset
    };
    io::Error::new(kind, error)
}

/// A response body streamed from its HTTP/2 stream, failed after
/// `read_timeout` without a frame (as the HTTP/1.1 pool's bodies are).
struct StreamBody {
    incoming: hyper::body::Incoming,
    timeout: Duration,
    stall: Pin<Box<Sleep>>,
}

impl Body for StreamBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.incoming).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let next = tokio::time::Instant::now() + this.timeout;
                this.stall.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(error))) => Poll::Ready(Some(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                error,
            )))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.stall.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the upstream sent no body frame within read_timeout",
                )))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}
