//! One request and its response head on an upstream connection: the head
//! (and a body in memory) written with one `writev`, a streamed body written
//! as it arrives, then the response head read, interim (1xx) responses
//! handed to the client's connection on the way (`interim`), at most
//! [`MAX_INTERIM`] of them.
//!
//! All of it runs inside the task serving the client's request — there is no
//! connection task to hand the request to and no channel back — so a proxied
//! request costs no wake-ups beyond the socket's own.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;

use super::conn::{ReadHalf, UpstreamConn, WriteHalf, poll_fill};
use super::head::{Parsed, RequestFraming, ResponseHead, invalid, parse_response};
use super::interim::{InterimSink, MAX_INTERIM, MAX_INTERIM_BYTES};
use crate::http::chunked::{LAST_CHUNK, size_line};
use bytes::{Bytes, BytesMut};
use http::Method;
use http_body::Body;
use tokio::io::AsyncWriteExt;

/// A request body the client can send: the codec knows it only as this
/// (the pipeline's body type implements it).
pub trait OutgoingBody:
    Body<Data = Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>> + Unpin + Sized
{
    /// Takes the whole body out if it is in memory (`Some(None)`: no body),
    /// so that it can be sent again on another connection; `None` for a
    /// stream, which is left as it is.
    fn take_buffered(&mut self) -> Option<Option<Bytes>>;
}

/// A request body as it will be written.
#[derive(Debug)]
pub(crate) enum Outgoing<B> {
    Empty,
    /// In memory, so it can be sent again on another connection.
    Bytes(Bytes),
    /// Streamed from the client; sent once.
    Stream(B),
}

impl<B: OutgoingBody> Outgoing<B> {
    /// Classifies a body: nothing to send, bytes in hand, or a stream.
    pub(crate) fn new(mut body: B) -> Outgoing<B> {
        match body.take_buffered() {
            Some(None) => Outgoing::Empty,
            Some(Some(bytes)) => Outgoing::Bytes(bytes),
            None if body.is_end_stream() => Outgoing::Empty,
            None => Outgoing::Stream(body),
        }
    }

    pub(crate) fn framing(&self) -> RequestFraming {
        match self {
            Outgoing::Empty => RequestFraming::Empty,
            Outgoing::Bytes(bytes) => RequestFraming::Length(bytes.len() as u64),
            Outgoing::Stream(body) => match body.size_hint().exact() {
                Some(length) => RequestFraming::Length(length),
                None => RequestFraming::Chunked,
            },
        }
    }

    /// Whether the body could be written again after a failed attempt.
    pub(crate) fn is_replayable(&self) -> bool {
        !matches!(self, Outgoing::Stream(_))
    }
}

/// Why an exchange failed, and whether the upstream had sent anything.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: io::Error,
    /// Nothing at all came back: on a reused connection, the sign that the
    /// upstream had closed it before the request arrived.
    pub(crate) silent: bool,
}

impl Failure {
    fn silent(error: io::Error) -> Failure {
        Failure {
            error,
            silent: true,
        }
    }
}

/// Writes the request whose head is in `conn.write` and reads the final
/// response head. `method` decides whether a body follows (HEAD). Interim
/// responses go to `interim` as they arrive (dropped without one).
pub(crate) async fn exchange<B: OutgoingBody>(
    conn: &mut UpstreamConn,
    method: &Method,
    body: &mut Outgoing<B>,
    framing: RequestFraming,
    interim: Option<&dyn InterimSink>,
) -> Result<ResponseHead, Failure> {
    match body {
        Outgoing::Empty => conn.write_head(&[]).await.map_err(Failure::silent)?,
        Outgoing::Bytes(bytes) => conn.write_head(bytes).await.map_err(Failure::silent)?,
        Outgoing::Stream(stream) => {
            conn.write_head(&[]).await.map_err(Failure::silent)?;
            let chunked = framing == RequestFraming::Chunked;
            // Boxed: a streamed body is the rare case, and its two
            // futures inline made every exchange's future larger (it is
            // copied into a box per request, `proxy::forward`).
            let early = Box::pin(send_watching(conn, stream, chunked, method, interim))
                .await
                .map_err(|error| Failure {
                    error,
                    silent: false,
                })?;
            if let Some(mut head) = early {
                // Answered before the whole body went up: the connection
                // is mid-message and cannot carry another request.
                head.keep_alive = false;
                return Ok(head);
            }
        }
    }
    let (mut reader, _, read) = conn.split();
    read_head(&mut reader, read, method, interim).await
}

/// Reads from `reader` into `read` until a final response head is there,
/// handing interim ones to `interim` (more than [`MAX_INTERIM`] of them, or
/// of [`MAX_INTERIM_BYTES`], fail the exchange).
async fn read_head(
    reader: &mut ReadHalf<'_>,
    read: &mut BytesMut,
    method: &Method,
    interim: Option<&dyn InterimSink>,
) -> Result<ResponseHead, Failure> {
    let mut received = !read.is_empty();
    let (mut interim_count, mut interim_bytes) = (0usize, 0usize);
    loop {
        if !read.is_empty() {
            let before = read.len();
            match parse_response(read, method) {
                Ok(Parsed::Head(head)) => return Ok(head),
                Ok(Parsed::Interim(relayed)) => {
                    interim_count += 1;
                    interim_bytes += before - read.len();
                    if interim_count > MAX_INTERIM || interim_bytes > MAX_INTERIM_BYTES {
                        return Err(Failure {
                            error: invalid("too many interim (1xx) responses"),
                            silent: false,
                        });
                    }
                    if let (Some(sink), Some(head)) = (interim, relayed) {
                        sink.relay(&head);
                    }
                    continue;
                }
                Ok(Parsed::Partial) => {}
                Err(error) => {
                    return Err(Failure {
                        error,
                        silent: false,
                    });
                }
            }
        }
        match poll_fn(|cx| poll_fill(Pin::new(&mut *reader), read, cx)).await {
            Ok(0) => {
                let error = io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the upstream closed the connection before a complete response head",
                );
                return Err(Failure {
                    error,
                    silent: !received,
                });
            }
            Ok(_) => received = true,
            Err(error) => {
                return Err(Failure {
                    error,
                    silent: !received,
                });
            }
        }
    }
}

/// Writes a streamed body while watching the connection for an answer: an
/// upstream may answer before it has read the body (a `413`, a `401`) and
/// then stop reading, and that answer is the one to relay — writing on
/// until the send buffers fill would end in a timeout. `Some` is such an
/// early final head; `None`, the body went up whole.
async fn send_watching<B: OutgoingBody>(
    conn: &mut UpstreamConn,
    body: &mut B,
    chunked: bool,
    method: &Method,
    interim: Option<&dyn InterimSink>,
) -> io::Result<Option<ResponseHead>> {
    let (mut reader, mut writer, read) = conn.split();
    let write = write_stream(&mut writer, body, chunked);
    let answer = early_head(&mut reader, read, method, interim);
    tokio::pin!(write, answer);
    tokio::select! {
        biased;
        written = &mut write => written.map(|()| None),
        head = &mut answer => Ok(Some(head)),
    }
}

/// A final response head read while the body is still going up. Never
/// completes on a read error, a close or a malformed head: then the write
/// side decides, and the head is read (and judged) after it.
async fn early_head(
    reader: &mut ReadHalf<'_>,
    read: &mut BytesMut,
    method: &Method,
    interim: Option<&dyn InterimSink>,
) -> ResponseHead {
    match read_head(reader, read, method, interim).await {
        Ok(head) => head,
        Err(_) => std::future::pending().await,
    }
}

/// Writes a streamed body as its frames arrive, chunked when its length is
/// unknown. Trailers from the client are not forwarded.
async fn write_stream<B: OutgoingBody>(
    writer: &mut WriteHalf<'_>,
    body: &mut B,
    chunked: bool,
) -> io::Result<()> {
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        let frame = frame.map_err(io::Error::other)?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        if chunked {
            let mut line = [0u8; 18];
            writer.write_all(size_line(data.len(), &mut line)).await?;
            writer.write_all(&data).await?;
            writer.write_all(b"\r\n").await?;
        } else {
            writer.write_all(&data).await?;
        }
    }
    if chunked {
        writer.write_all(LAST_CHUNK).await?;
    }
    // What TLS still holds back (a no-op on TCP).
    writer.flush().await
}
