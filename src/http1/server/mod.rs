//! tollgate's own HTTP/1.1 server path, for plain requests.
//!
//! Nearly all API traffic is HTTP/1.1 on keep-alive connections: requests
//! with no body or a small one, no upgrade, no `Expect`. For those, hyper's
//! general machinery (a dispatcher state machine, a body channel per request,
//! a response head and body queued as separate buffers) cost about 2,000
//! instructions per request more than this module does, 7 % of the
//! gateway's work (BENCHMARKS.md, "Fourth round"). This module serves them
//! directly: it parses the head with httparse (as
//! hyper does), runs the handler in place, and writes the response head and
//! body from one buffer, one `write` for a small response.
//!
//! Every request head the gateway receives is parsed here first, whoever
//! serves it, and checked by one rule ([`framing`], RFC 9112 §6.3 as a
//! numbered list): a malformed head, an ambiguous framing (the stuff of
//! request smuggling), a head over `max_header_bytes` are answered here with
//! problem+json (400, 414, 431) and the connection is closed; nothing after
//! them is read. Of the rest, it serves only the requests it recognises as
//! plain (`parse`'s short allow-list). At the first request that is
//! anything else, it returns the bytes it has read ([`Ended::HandOff`]) and
//! the caller gives the connection to hyper, which reads them again
//! ([`Rewind`]) and serves the connection from then on: chunked and
//! streamed uploads, `Expect: 100-continue`, upgrades, HTTP/1.0. hyper reads
//! through a [`Gate`], which checks every later head by the same rule and
//! every chunked body strictly, so hyper never sees a head the gateway would
//! refuse and its own plain-text 400 and 431 never reach a client.
//! Responses are written by hyper's rules (`encode_head`), so a client
//! sees the same bytes from either.

mod activity;
mod body;
mod buffers;
pub(crate) mod framing;
pub mod gate;
pub(crate) mod linger;
mod request;
mod response;
mod rewind;
mod slot;
mod step_aside;

use std::future::{Future, poll_fn};
use std::io;
use std::mem::MaybeUninit;
use std::pin::{Pin, pin};
use std::task::{Poll, ready};

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response};
use http_body::Body;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use buffers::{Buffers, Keeping, WRITE_BATCH, make_room};
use slot::Slot;

use crate::http::chunked::LAST_CHUNK;
use crate::http::field_lines::FieldLines;
pub(crate) use activity::ActivityAnswered;
pub(crate) use activity::ConnActivity;
pub use body::ClientBody;
pub(crate) use framing::Refusal;
pub(crate) use gate::Gate;
pub(crate) use request::H2_PREFACE;
pub use request::{Parsed, parse};
pub(crate) use response::{BodyLength, Framing, encode_head};
pub use rewind::Rewind;

/// How a connection's fast path ended.
#[derive(Debug)]
pub enum Ended {
    /// The connection is finished (closed by either side, or after a
    /// response that ends it).
    Closed,
    /// A request the fast path does not serve starts at these bytes: hyper
    /// takes the connection from here.
    HandOff(BytesMut),
}

/// Fields a response carries outside its header map (the gateway keeps
/// relayed and rate-limit fields as lines: `http::field_lines`), written
/// into the head after the map's own.
pub trait ExtraFields {
    /// Appends complete `name: value\r\n` lines, never framing fields
    /// (`Content-Length` only in answer to `HEAD`, where it frames nothing).
    fn write_to(&self, out: &mut Vec<u8>);
    /// Whether the lines include a `Date` (the head then adds none).
    fn has_date(&self) -> bool;

    /// Whether the response denied its request for the client's rate: the
    /// connection's next request then waits its turn (see [`serve`]).
    fn steps_aside(&self) -> bool {
        false
    }
}

/// No extra fields.
impl ExtraFields for () {
    fn write_to(&self, _: &mut Vec<u8>) {}

    fn has_date(&self) -> bool {
        false
    }
}

/// The gateway's field lines (relayed and rate-limit fields), copied into the
/// head as they are.
impl ExtraFields for FieldLines {
    fn write_to(&self, out: &mut Vec<u8>) {
        FieldLines::write_to(self, out);
    }

    fn has_date(&self) -> bool {
        FieldLines::has_date(self)
    }

    fn steps_aside(&self) -> bool {
        self.is_rate_denial()
    }
}

/// What the connection tells the fast path while it serves: to finish (the
/// response in progress closes the connection, and no further request is
/// read), and the interim (1xx) heads to write before a final response.
pub trait Closing {
    fn is_closing(&self) -> bool;

    /// Whether interim heads are waiting ([`Closing::take_interim`]).
    fn interim_waiting(&self) -> bool {
        false
    }

    /// Appends the interim heads waiting, if any, to `out`.
    fn take_interim(&self, _out: &mut Vec<u8>) {}

    /// A request was refused ([`Refusal`]: answered here, 400 or 431; the
    /// connection closes after it), for the caller's metrics and log.
    fn refused(&self, _refusal: Refusal) {}
}

/// Serves plain requests on `io` with `respond` until the connection ends or
/// a request needs hyper. `respond` answers a request with a response and
/// the [`ExtraFields`] written into its head after the map's fields. A head
/// that is malformed, framed ambiguously or longer than `max_head` bytes is
/// answered here ([`Refusal`]) and ends the connection: nothing after it is
/// read, let alone served. I/O errors end the connection (returned for the
/// log); nothing here panics on what a client sends.
///
/// A connection whose last response denied its request for the client's
/// rate ([`ExtraFields::steps_aside`]) steps aside once its next request
/// has arrived: the task yields before it parses and answers it, so the
/// other connections that became ready meanwhile (a legitimate client among
/// an abusive one's denials) are served first. A flood of denied requests
/// then costs the others a read per flooding connection ahead of them, not
/// a whole answer each; a pipelined flood yields between its requests.
/// It stays aside for `step_aside::PASSES` passes through the worker's
/// ready tasks: a flooding connection then answers once per few passes, so a
/// pass holds fewer answers and a legitimate request, which may need
/// several passes (its store call, its upstream), waits less for each.
/// The worker's keeper (`step_aside`) counts the passes for every
/// connection stepping aside: each is polled once more, not once a pass.
///
/// Not an `async fn`: one keeps its arguments twice (as they came, and as
/// the locals its body moves them into), and every idle connection's task
/// would carry the copy; the block uses them in place.
#[allow(clippy::manual_async_fn)] // an `async fn` is what this avoids (above)
pub fn serve<T, C, F, Fut, B, L>(
    io: &mut T,
    closing: &C,
    max_head: usize,
    mut respond: F,
) -> impl Future<Output = io::Result<Ended>>
where
    T: AsyncRead + AsyncWrite + Unpin,
    C: Closing + ?Sized,
    F: FnMut(Request<ClientBody>) -> Fut,
    Fut: Future<Output = (Response<B>, L)>,
    L: ExtraFields,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    // Kept in 32 bits: every idle connection's future carries it.
    let max_head = u32::try_from(max_head).unwrap_or(u32::MAX);
    async move {
        // The last response was a rate-limit denial (see above).
        let mut step_aside = false;
        loop {
            // Idle: no buffer, and no room for a busy connection's state.
            let Some(mut buffers) = first_bytes(io).await? else {
                // Between requests: the client is done.
                return Ok(Ended::Closed);
            };
            // Busy: the state of serving requests lives in a block of its own
            // (`slot`), which travels with the buffers: an async function is as
            // large as its largest state, and every idle connection would carry
            // the room of a busy one's (the response's body being written, the
            // head's parts, the handler's slot) for as long as it is open.
            // Awaited by value (`finishing`): the block comes back with the
            // spell's end, and nothing but the slot is kept across the wait.
            let busy = {
                let mut room = buffers.busy.take();
                Slot::new_with(&mut room, || {
                    serve_busy(
                        io,
                        closing,
                        max_head as usize,
                        &mut respond,
                        buffers,
                        step_aside,
                    )
                })
            };
            let (spell, room) = busy.finishing().await;
            let mut buffers = spell.buffers;
            buffers.busy = room;
            buffers.give_back();
            match spell.next? {
                Next::Idle { steps_aside } => step_aside = steps_aside,
                Next::Ended(ended) => return Ok(ended),
            }
        }
    }
}

/// How a busy spell of a connection ended, with the buffers it was served
/// with (they go back to the thread's spares with the spell's block).
struct Spell {
    buffers: Box<Buffers>,
    next: io::Result<Next>,
}

/// What follows a busy spell.
enum Next {
    /// The connection waits for its next request, holding nothing; it
    /// steps aside before that one if the last response was a denial.
    Idle { steps_aside: bool },
    /// The fast path is done with the connection.
    Ended(Ended),
}

/// Serves requests from the bytes in `buffers` until the connection goes
/// idle (no byte of a next request read, the set given back) or ends. The
/// first [`KEEP_IDLE`] connections of a thread to go idle wait here
/// instead, keeping their buffers and this state ([`Keeping`], held until
/// the spell ends): the usual keep-alive client then reads its next
/// request straight into them, and a request after another costs nothing
/// more than its read.
///
/// [`KEEP_IDLE`]: buffers::KEEP_IDLE
async fn serve_busy<T, C, F, Fut, B, L>(
    io: &mut T,
    closing: &C,
    max_head: usize,
    respond: &mut F,
    mut buffers: Box<Buffers>,
    step_aside: bool,
) -> Spell
where
    T: AsyncRead + AsyncWrite + Unpin,
    C: Closing + ?Sized,
    F: FnMut(Request<ClientBody>) -> Fut,
    Fut: Future<Output = (Response<B>, L)>,
    L: ExtraFields,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let next = serve_requests(io, closing, max_head, respond, &mut buffers, step_aside).await;
    Spell { buffers, next }
}

/// Serves the requests in `buffers` (and those read into them) until the
/// connection goes idle without one of its thread's places to keep its
/// set while idle ([`Keeping`]), or ends.
async fn serve_requests<T, C, F, Fut, B, L>(
    io: &mut T,
    closing: &C,
    max_head: usize,
    respond: &mut F,
    buffers: &mut Buffers,
    mut step_aside: bool,
) -> io::Result<Next>
where
    T: AsyncRead + AsyncWrite + Unpin,
    C: Closing + ?Sized,
    F: FnMut(Request<ClientBody>) -> Fut,
    Fut: Future<Output = (Response<B>, L)>,
    L: ExtraFields,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    // Taken at the spell's first idle moment, if the thread has a place
    // left; released when the spell ends.
    let mut keeping: Option<Keeping> = None;
    let Buffers {
        read: buffer,
        out,
        fields,
        block,
        busy: _,
    } = buffers;
    loop {
        // Bytes of a partial head already parsed: a head arriving in many
        // small reads is parsed again only when it may have ended.
        let mut parsed_up_to = 0;
        let (request, close) = loop {
            if !buffer.is_empty() && may_be_complete(buffer, parsed_up_to, max_head) {
                // The next request has arrived (or its first bytes): a
                // connection whose last answer was a denial steps aside
                // now, before it is parsed and answered (see `serve`).
                if std::mem::take(&mut step_aside) {
                    step_aside::wait_passes().await;
                }
                match parse(buffer, fields, max_head) {
                    Parsed::Request { request, close } => break (request, close),
                    Parsed::HandOff => {
                        return Ok(Next::Ended(Ended::HandOff(std::mem::take(buffer))));
                    }
                    Parsed::Partial => parsed_up_to = buffer.len(),
                    Parsed::Refused(refusal) => {
                        // Told whether or not the client still reads it.
                        closing.refused(refusal);
                        refuse(io, out, refusal).await?;
                        return Ok(Next::Ended(Ended::Closed));
                    }
                }
            }
            make_room(buffer);
            if io.read_buf(buffer).await? == 0 {
                // Within a head: the client gave up; hyper answers nothing
                // then either.
                return Ok(Next::Ended(Ended::Closed));
            }
        };
        let is_head = request.method() == Method::HEAD;
        // In a block of its own (`slot`), not in this future: the handler's
        // future is large, and a busy connection would carry its room
        // between requests.
        // Awaited here, not passed to a helper: moving it once more showed
        // as +500 instructions of memcpy per request.
        let mut handling = Slot::new_with(block, || respond(request));
        let response = loop {
            // Watching the connection meanwhile, as hyper does: a client that
            // closes (or breaks) it before its answer is ready is gone, and
            // dropping the handler cancels the request (upstream exchange,
            // delay, held slots). Once bytes of a next request (pipelined)
            // are buffered, the connection is no longer watched (hyper's
            // rule too).
            if !buffer.is_empty() {
                break (&mut handling).await;
            }
            make_room(buffer);
            tokio::select! {
                biased;
                response = &mut handling => break response,
                // An interim response (`103 Early Hints`) the upstream sent
                // while the handler polled: written now, ahead of the final
                // one (RFC 9110 §15.2).
                () = poll_fn(|_| if closing.interim_waiting() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }) => {
                    out.clear();
                    closing.take_interim(out);
                    io.write_all(out).await?;
                }
                read = io.read_buf(buffer) => match read {
                    Ok(0) | Err(_) => return Ok(Next::Ended(Ended::Closed)),
                    Ok(_) => {}
                },
            }
        };
        // Done: its block waits, with the buffers, for the next request.
        handling.finish(block);
        let (response, extra_fields) = response;
        step_aside = extra_fields.steps_aside();
        let (mut parts, body) = response.into_parts();
        let length = if body.is_end_stream() {
            None
        } else {
            Some(match body.size_hint().exact() {
                Some(n) => BodyLength::Known(n),
                None => BodyLength::Unknown,
            })
        };
        let keep_alive = !close && !closing.is_closing();
        out.clear();
        // Interim heads not written yet (they came with the final one, or
        // the connection was not watched): they go first.
        closing.take_interim(out);
        let head = encode_head(
            out,
            parts.status,
            &mut parts.headers,
            &extra_fields,
            length,
            is_head,
            keep_alive,
        );
        // `clear` resets every index slot even of an empty map.
        if !parts.headers.is_empty() {
            parts.headers.clear();
        }
        *fields = parts.headers;
        let head = match head {
            Ok(head) => head,
            Err(error) => {
                tracing::warn!(%error, "response not sent; closing the connection");
                return Ok(Next::Ended(Ended::Closed));
            }
        };
        let complete = write_body(io, out, body, head.framing).await?;
        if !complete || head.last || closing.is_closing() {
            // Whatever the client still sends (pipelined requests) is read
            // and dropped for a moment, so its answer is not lost to a reset.
            crate::http1::server::linger::close(io).await;
            return Ok(Next::Ended(Ended::Closed));
        }
        if buffer.is_empty() && !keeps(&mut keeping, buffer, out) {
            // Idle without a place to keep the set: the next request is
            // read here only if its bytes are there already (the set is
            // given back only when the connection would wait).
            make_room(buffer);
            match poll_fn(|cx| Poll::Ready(pin!(io.read_buf(&mut *buffer)).poll(cx))).await {
                Poll::Pending => {
                    return Ok(Next::Idle {
                        steps_aside: step_aside,
                    });
                }
                Poll::Ready(Ok(0)) => return Ok(Next::Ended(Ended::Closed)),
                Poll::Ready(read) => {
                    read?;
                }
            }
        }
        // Pipelined bytes are waiting, or the connection keeps its set
        // while it waits: the next request is read (above) and served with
        // the same buffers.
    }
}

/// Whether a connection going idle keeps its set while it waits for its
/// next request: it holds a place of its thread's ([`Keeping`]: taken now
/// if it has none and one is left), and the set has its usual size.
#[inline]
fn keeps(keeping: &mut Option<Keeping>, read: &BytesMut, out: &Vec<u8>) -> bool {
    if Buffers::grown_parts(read, out) {
        return false;
    }
    if keeping.is_none() {
        *keeping = Keeping::try_take();
    }
    keeping.is_some()
}

/// Stack room for the first read of an idle connection: most request heads
/// fit, and a longer one goes on in the buffers taken for it.
const FIRST_READ: usize = 2 * 1024;

/// Waits, holding no buffer, for the first bytes of the next request, read
/// into a scratch array on the stack (not kept across polls, so not part of
/// the connection's future); then takes a set of buffers and puts them in.
/// `None`: the client closed the connection.
async fn first_bytes<T: AsyncRead + Unpin>(io: &mut T) -> io::Result<Option<Box<Buffers>>> {
    poll_fn(|cx| {
        let mut scratch = [MaybeUninit::<u8>::uninit(); FIRST_READ];
        let mut read = ReadBuf::uninit(&mut scratch);
        ready!(Pin::new(&mut *io).poll_read(cx, &mut read))?;
        if read.filled().is_empty() {
            return Poll::Ready(Ok(None));
        }
        let mut buffers = Buffers::take();
        buffers.read.extend_from_slice(read.filled());
        Poll::Ready(Ok(Some(buffers)))
    })
    .await
}

/// Whether a head that was partial at `parsed_up_to` bytes may be complete
/// (or too long) now: an end of line followed by an empty line (bare LF
/// included, for the check to refuse) is among the new bytes. Without this,
/// a head sent a byte at a time would be parsed from its start once per
/// byte, up to `max_head` bytes each time. The first parse of a head (at 0)
/// always runs: the usual head arrives whole.
pub(crate) fn may_be_complete(buffer: &[u8], parsed_up_to: usize, max_head: usize) -> bool {
    if parsed_up_to == 0 || buffer.len() > max_head {
        return true;
    }
    let new = &buffer[parsed_up_to.saturating_sub(3)..];
    new.windows(2).any(|pair| pair == b"\n\n") || new.windows(3).any(|w| w == b"\n\r\n")
}

/// Answers a refused request and closes the connection (lingering, so the
/// client reads the answer rather than a reset while it is still sending).
async fn refuse<T>(io: &mut T, out: &mut Vec<u8>, refusal: Refusal) -> io::Result<()>
where
    T: AsyncRead + AsyncWrite + Unpin,
{
    tracing::debug!(status = %refusal.status, detail = refusal.detail, "request refused");
    out.clear();
    refusal.encode(out);
    io.write_all(out).await?;
    crate::http1::server::linger::close(io).await;
    Ok(())
}

/// Writes the head in `out` and the body after it, framed as `framing`.
/// Returns false when the body failed or did not match its declared length:
/// the response is cut short and the connection must close. The body is
/// dropped only after its last byte is written (dropping it ends the
/// request).
async fn write_body<T, B>(
    io: &mut T,
    out: &mut Vec<u8>,
    body: B,
    framing: Framing,
) -> io::Result<bool>
where
    T: AsyncWrite + Unpin,
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let mut body = pin!(body);
    let mut remaining = match framing {
        Framing::Length(0) => {
            // HEAD, 204, 304 or empty: the body is not polled (as hyper).
            io.write_all(out).await?;
            return Ok(true);
        }
        Framing::Length(n) => Some(n),
        Framing::Chunked => None,
    };
    loop {
        // A frame if one is ready; `None` when the body must wait and there
        // are bytes to send first (a streamed response is not held back).
        let step = poll_fn(|cx| match body.as_mut().poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(Some(frame)),
            Poll::Pending if out.is_empty() => Poll::Pending,
            Poll::Pending => Poll::Ready(None),
        })
        .await;
        let frame = match step {
            None => {
                io.write_all(out).await?;
                out.clear();
                continue;
            }
            Some(None) => {
                let complete = match remaining {
                    Some(left) => left == 0,
                    None => {
                        out.extend_from_slice(LAST_CHUNK);
                        true
                    }
                };
                if !complete {
                    tracing::debug!("response body ended before its length");
                }
                io.write_all(out).await?;
                return Ok(complete);
            }
            Some(Some(Err(error))) => {
                tracing::debug!(%error, "response body failed; closing the connection");
                io.write_all(out).await?;
                return Ok(false);
            }
            Some(Some(Ok(frame))) => frame,
        };
        // Trailers are dropped: the fast path serves no request that asked
        // for them (`TE: trailers` goes to hyper, which drops them too).
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        match &mut remaining {
            Some(left) => {
                let fits = (data.len() as u64) <= *left;
                let take = if fits { data.len() } else { *left as usize };
                out.extend_from_slice(&data[..take]);
                *left -= take as u64;
                if !fits {
                    tracing::debug!("response body longer than its length");
                    io.write_all(out).await?;
                    return Ok(false);
                }
            }
            None => {
                response::chunk_size_line(out, data.len());
                out.extend_from_slice(&data);
                out.extend_from_slice(b"\r\n");
            }
        }
        if out.len() >= WRITE_BATCH {
            io.write_all(out).await?;
            out.clear();
        }
    }
}
