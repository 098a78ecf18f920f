//! The request side after a hand-off to hyper: every byte hyper reads has
//! been checked first.
//!
//! Once the fast path hands a connection to hyper, hyper reads every later
//! request on it, and hyper is more lenient than the gateway (it takes
//! `Content-Length` with `Transfer-Encoding`, bare LF line ends, a chunk
//! extension with a bare CR, no `Host`). So hyper reads through a [`Gate`]:
//! an I/O wrapper that follows the messages on the connection with a
//! [`Scanner`] and hands hyper only bytes it has checked.
//!
//! - A **head** is held back until it is complete, then checked by the same
//!   parse and rule as the fast path's ([`framing::check`]). A refused head
//!   is never given to hyper: hyper sees the end of the stream instead,
//!   finishes the responses it owes (earlier pipelined requests), and shuts
//!   the connection down; the gate then writes the refusal (problem+json,
//!   `Connection: close`) before the shutdown. Nothing after it is read.
//! - A **body** is passed on as it arrives: `Content-Length` bytes exactly,
//!   or a chunked body checked byte by byte, stricter than hyper's decoder
//!   (chunk lines end only at CRLF; sizes are hex digits without overflow;
//!   extensions hold no control bytes; data is followed by CRLF; trailer
//!   lines are well-formed fields). At a malformed byte hyper sees the end
//!   of the stream: the request body fails, and the request is answered 400
//!   by the handler (the client's fault, not the upstream's).
//! - An **upgrade** (`Upgrade`, `CONNECT`): what follows its head is either
//!   the tunnel's or the next request, decided by the answer. The gate waits
//!   until every earlier request is answered ([`Answered`]), passes the
//!   request, and holds further bytes until hyper writes the answer's status
//!   line: `101` turns the gate into a pass-through, anything else resumes
//!   checking heads.
//!
//! The scanner is sans-I/O ([`Scanner::scan`]), so it is unit-tested and
//! fuzzed without sockets (`fuzz/fuzz_targets/request_head.rs`).

use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::framing::{self, BodyFraming, MAX_FIELDS, Refusal};
use crate::http::structured::is_tchar;

/// Longest chunk-size line (size, extensions, CRLF) the gateway reads;
/// hyper allows 16 KiB of extensions in all, which nothing legitimate uses.
const MAX_CHUNK_LINE: usize = 4 * 1024;

/// Most bytes of trailer fields after a chunked body.
const MAX_TRAILERS: usize = 16 * 1024;

/// Read from the connection at a time.
const READ_CHUNK: usize = 8 * 1024;

/// What the scanner decided about the bytes it was shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The first `n` bytes are checked and may be handed on (`n > 0`).
    Pass(usize),
    /// Nothing can be decided before more bytes arrive.
    More,
    /// An upgrade request comes next: wait until every earlier request has
    /// been answered, then call [`Scanner::release_upgrade`].
    AwaitIdle,
    /// An upgrade request has been passed: wait for its answer's status
    /// ([`Scanner::answered`]).
    AwaitAnswer,
    /// A refused head: answer it and close. Nothing of it is handed on.
    RefuseHead(Refusal),
    /// A malformed body: hand nothing more on, so the body ends early.
    RefuseBody(&'static str),
    /// The connection is a tunnel now: everything passes unchecked.
    Tunnel,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    /// An upgrade head checked and `len` bytes long, waiting for earlier
    /// requests to be answered.
    UpgradeHead {
        len: usize,
        framing: BodyFraming,
    },
    Length {
        remaining: u64,
        upgrade: bool,
    },
    Chunked {
        chunk: Chunk,
        upgrade: bool,
    },
    AwaitAnswer,
    Tunnel,
    Refused,
}

/// Where a chunked body is (RFC 9112 §7.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// In the size's hex digits (`digits` so far).
    Size {
        size: u64,
        digits: u8,
        line: usize,
    },
    /// Whitespace after the size (BWS before `;` or the line end).
    SizeSpace {
        size: u64,
        line: usize,
    },
    /// In the extensions.
    Extension {
        size: u64,
        line: usize,
    },
    /// A CR ended the size line: LF must follow.
    SizeLf {
        size: u64,
    },
    Data {
        remaining: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line (or of the final empty line).
    TrailerStart {
        total: usize,
    },
    TrailerName {
        total: usize,
    },
    TrailerValue {
        total: usize,
    },
    TrailerLf {
        total: usize,
    },
    /// The CR of the final empty line: LF must follow.
    EndLf,
}

/// Follows the requests of one connection through their heads and bodies.
#[derive(Debug)]
pub struct Scanner {
    state: State,
    max_head: usize,
    /// In [`State::AwaitAnswer`]: what the written response looks like so far.
    status: StatusWatch,
    /// In [`State::Head`]: how much of the input was a partial head when
    /// last parsed (see [`super::may_be_complete`]).
    parsed_up_to: usize,
}

impl Scanner {
    /// A scanner at the start of a request; heads longer than `max_head` are
    /// refused (431).
    pub fn new(max_head: usize) -> Scanner {
        Scanner {
            state: State::Head,
            max_head,
            status: StatusWatch::default(),
            parsed_up_to: 0,
        }
    }

    /// Whether the next bytes are a request head (the next `Pass` is one
    /// whole head).
    pub fn at_head(&self) -> bool {
        self.state == State::Head
    }

    /// Decides about `input`, the bytes after those already passed. A `Pass`
    /// moves the scanner past them; call again with what follows.
    pub fn scan(&mut self, input: &[u8]) -> Step {
        match self.state {
            State::Head => self.scan_head(input),
            State::UpgradeHead { .. } => Step::AwaitIdle,
            State::Length { remaining, upgrade } => {
                if input.is_empty() {
                    return Step::More;
                }
                let n = remaining.min(input.len() as u64);
                let remaining = remaining - n;
                if remaining == 0 {
                    self.end_body(upgrade);
                } else {
                    self.state = State::Length { remaining, upgrade };
                }
                Step::Pass(n as usize)
            }
            State::Chunked { chunk, upgrade } => self.scan_chunked(chunk, upgrade, input),
            State::AwaitAnswer => Step::AwaitAnswer,
            State::Tunnel => Step::Tunnel,
            State::Refused => Step::RefuseBody("the connection is closing"),
        }
    }

    /// Every earlier request has been answered: the upgrade head waiting in
    /// [`Step::AwaitIdle`] is passed (this many bytes).
    pub fn release_upgrade(&mut self) -> usize {
        let State::UpgradeHead { len, framing } = self.state else {
            return 0;
        };
        self.start_body(framing, true);
        len
    }

    /// Bytes hyper writes while an upgrade's answer is awaited: the status
    /// line decides whether the connection becomes a tunnel.
    pub fn answered(&mut self, written: &[u8]) {
        if self.state != State::AwaitAnswer {
            return;
        }
        match self.status.feed(written) {
            Some(101) => self.state = State::Tunnel,
            Some(_) => self.state = State::Head,
            None => {}
        }
    }

    fn scan_head(&mut self, input: &[u8]) -> Step {
        if input.is_empty() || !super::may_be_complete(input, self.parsed_up_to, self.max_head) {
            return Step::More;
        }
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_FIELDS];
        let mut request = httparse::Request::new(&mut []);
        let parsed = httparse::ParserConfig::default().parse_request_with_uninit_headers(
            &mut request,
            input,
            &mut slots,
        );
        let len = match parsed {
            Ok(httparse::Status::Complete(len)) if len <= self.max_head => len,
            Ok(httparse::Status::Partial) if input.len() <= self.max_head => {
                self.parsed_up_to = input.len();
                return Step::More;
            }
            Ok(_) => return self.refuse_head(Refusal::TOO_LARGE),
            Err(error) => return self.refuse_head(error.into()),
        };
        self.parsed_up_to = 0;
        let framing = match framing::check(&input[..len], &request) {
            Ok(framing) => framing,
            Err(refusal) => return self.refuse_head(refusal),
        };
        // The fast path builds a `Uri` of every target it serves; hyper
        // does the same and answers 400 when it fails. (This copies the
        // target: handed-off requests only.) The fast path serves origin
        // form only, so a target with an authority is checked here alone.
        let target = request.path.unwrap_or_default();
        let Ok(target) = http::Uri::try_from(target) else {
            return self.refuse_head(Refusal::MALFORMED);
        };
        if let Err(refusal) = framing::check_target(&target) {
            return self.refuse_head(refusal);
        }
        let connect = request.method == Some("CONNECT");
        let upgrade = connect
            || (request.version == Some(1)
                && request
                    .headers
                    .iter()
                    .any(|field| field.name.eq_ignore_ascii_case("upgrade")));
        if upgrade {
            self.state = State::UpgradeHead { len, framing };
            return Step::AwaitIdle;
        }
        self.start_body(framing, false);
        Step::Pass(len)
    }

    fn refuse_head(&mut self, refusal: Refusal) -> Step {
        self.state = State::Refused;
        Step::RefuseHead(refusal)
    }

    fn start_body(&mut self, framing: BodyFraming, upgrade: bool) {
        match framing {
            BodyFraming::Empty => self.end_body(upgrade),
            BodyFraming::Length(remaining) => self.state = State::Length { remaining, upgrade },
            BodyFraming::Chunked => {
                self.state = State::Chunked {
                    chunk: Chunk::Size {
                        size: 0,
                        digits: 0,
                        line: 0,
                    },
                    upgrade,
                }
            }
        }
    }

    fn end_body(&mut self, upgrade: bool) {
        if upgrade {
            self.state = State::AwaitAnswer;
            self.status = StatusWatch::default();
        } else {
            self.state = State::Head;
        }
    }

    fn scan_chunked(&mut self, mut chunk: Chunk, upgrade: bool, input: &[u8]) -> Step {
        if input.is_empty() {
            return Step::More;
        }
        let mut at = 0;
        while at < input.len() {
            if let Chunk::Data { remaining } = chunk {
                let n = remaining.min((input.len() - at) as u64);
                at += n as usize;
                chunk = if remaining == n {
                    Chunk::DataCr
                } else {
                    Chunk::Data {
                        remaining: remaining - n,
                    }
                };
                continue;
            }
            let byte = input[at];
            at += 1;
            let next = match step_chunk(chunk, byte) {
                Ok(Some(next)) => next,
                Ok(None) => {
                    // The final empty line: the message ends here.
                    self.end_body(upgrade);
                    return Step::Pass(at);
                }
                // Everything before the bad byte passes first, so what
                // passes does not depend on how the bytes arrived; the next
                // scan starts at the bad byte and refuses.
                Err(_) if at > 1 => {
                    self.state = State::Chunked { chunk, upgrade };
                    return Step::Pass(at - 1);
                }
                Err(reason) => {
                    self.state = State::Refused;
                    return Step::RefuseBody(reason);
                }
            };
            chunk = next;
        }
        self.state = State::Chunked { chunk, upgrade };
        Step::Pass(at)
    }
}

/// One byte of a chunked body outside chunk data: the next place, `None`
/// at the end of the message, or why the body is refused.
fn step_chunk(chunk: Chunk, byte: u8) -> Result<Option<Chunk>, &'static str> {
    const SIZE: &str = "a chunk size is not hexadecimal digits or overflows";
    const LINE: &str = "a chunk line does not end with CRLF";
    const EXTENSION: &str = "a chunk extension holds a control byte";
    const LONG: &str = "a chunk line is too long";
    const TRAILER: &str = "a trailer field is malformed";
    let line_limit = |line: usize| {
        if line >= MAX_CHUNK_LINE {
            Err(LONG)
        } else {
            Ok(line + 1)
        }
    };
    let trailer_limit = |total: usize| {
        if total >= MAX_TRAILERS {
            Err(TRAILER)
        } else {
            Ok(total + 1)
        }
    };
    Ok(Some(match chunk {
        Chunk::Size { size, digits, line } => {
            let line = line_limit(line)?;
            match byte {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    let digit = (byte as char).to_digit(16).unwrap_or(0);
                    let size = size
                        .checked_mul(16)
                        .and_then(|s| s.checked_add(u64::from(digit)))
                        .ok_or(SIZE)?;
                    Chunk::Size {
                        size,
                        digits: digits.saturating_add(1),
                        line,
                    }
                }
                _ if digits == 0 => return Err(SIZE),
                b' ' | b'\t' => Chunk::SizeSpace { size, line },
                b';' => Chunk::Extension { size, line },
                b'\r' => Chunk::SizeLf { size },
                b'\n' => return Err(LINE),
                _ => return Err(SIZE),
            }
        }
        Chunk::SizeSpace { size, line } => {
            let line = line_limit(line)?;
            match byte {
                b' ' | b'\t' => Chunk::SizeSpace { size, line },
                b';' => Chunk::Extension { size, line },
                b'\r' => Chunk::SizeLf { size },
                b'\n' => return Err(LINE),
                _ => return Err(SIZE),
            }
        }
        Chunk::Extension { size, line } => {
            let line = line_limit(line)?;
            match byte {
                b'\r' => Chunk::SizeLf { size },
                b'\n' => return Err(LINE),
                b'\t' | b' '..=b'~' | 0x80..=0xff => Chunk::Extension { size, line },
                _ => return Err(EXTENSION),
            }
        }
        Chunk::SizeLf { size } => match byte {
            b'\n' if size == 0 => Chunk::TrailerStart { total: 0 },
            b'\n' => Chunk::Data { remaining: size },
            _ => return Err(LINE),
        },
        Chunk::Data { .. } => unreachable_data(),
        Chunk::DataCr => match byte {
            b'\r' => Chunk::DataLf,
            _ => return Err("chunk data is not followed by CRLF"),
        },
        Chunk::DataLf => match byte {
            b'\n' => Chunk::Size {
                size: 0,
                digits: 0,
                line: 0,
            },
            _ => return Err("chunk data is not followed by CRLF"),
        },
        Chunk::TrailerStart { total } => {
            let total = trailer_limit(total)?;
            match byte {
                b'\r' => Chunk::EndLf,
                _ if is_tchar(byte) => Chunk::TrailerName { total },
                // SP or HT here would be obs-fold; LF a bare line end.
                _ => return Err(TRAILER),
            }
        }
        Chunk::TrailerName { total } => {
            let total = trailer_limit(total)?;
            match byte {
                b':' => Chunk::TrailerValue { total },
                _ if is_tchar(byte) => Chunk::TrailerName { total },
                _ => return Err(TRAILER),
            }
        }
        Chunk::TrailerValue { total } => {
            let total = trailer_limit(total)?;
            match byte {
                b'\r' => Chunk::TrailerLf { total },
                b'\t' | b' '..=b'~' | 0x80..=0xff => Chunk::TrailerValue { total },
                _ => return Err(TRAILER),
            }
        }
        Chunk::TrailerLf { total } => match byte {
            b'\n' => Chunk::TrailerStart { total },
            _ => return Err(TRAILER),
        },
        Chunk::EndLf => match byte {
            b'\n' => return Ok(None),
            _ => return Err(LINE),
        },
    }))
}

/// Chunk data is skipped whole by the caller, never stepped byte by byte.
fn unreachable_data() -> Chunk {
    debug_assert!(false, "chunk data stepped byte by byte");
    Chunk::DataCr
}

/// Reads the status of the final response in bytes written, skipping
/// interim (1xx other than 101) responses.
#[derive(Debug, Default)]
struct StatusWatch {
    /// The start of the current response's status line.
    line: [u8; 12],
    len: usize,
    /// In an interim response: how much of its ending CRLFCRLF has been seen.
    interim_end: Option<usize>,
}

impl StatusWatch {
    /// The final status, once its status line has been written.
    fn feed(&mut self, mut written: &[u8]) -> Option<u16> {
        while !written.is_empty() {
            if let Some(matched) = self.interim_end.as_mut() {
                let byte = written[0];
                written = &written[1..];
                *matched = match (*matched, byte) {
                    (0 | 2, b'\r') => *matched + 1,
                    (1 | 3, b'\n') => *matched + 1,
                    (_, b'\r') => 1,
                    _ => 0,
                };
                if *matched == 4 {
                    self.interim_end = None;
                    self.len = 0;
                }
                continue;
            }
            let take = (self.line.len() - self.len).min(written.len());
            self.line[self.len..self.len + take].copy_from_slice(&written[..take]);
            self.len += take;
            written = &written[take..];
            if self.len < self.line.len() {
                return None;
            }
            // `HTTP/1.1 101`: the three digits after the version and a space.
            let status = std::str::from_utf8(&self.line[9..12])
                .ok()
                .and_then(|digits| digits.parse::<u16>().ok())
                .unwrap_or(0);
            if (100..200).contains(&status) && status != 101 {
                self.interim_end = Some(0);
                continue;
            }
            return Some(status);
        }
        None
    }
}

/// Tells the gate when every request hyper has been given so far is
/// answered (their responses are over), so that an upgrade's answer is
/// known to be the next response written.
pub(crate) trait Answered {
    /// Ready when nothing is in flight; otherwise wakes `cx` when that
    /// changes.
    fn poll_answered(&self, cx: &mut Context<'_>) -> Poll<()>;

    /// The gate refused a request (its answer is being written and the
    /// connection closes): for the connection's metrics and log.
    fn refused(&self, _refusal: Refusal) {}
}

/// The I/O hyper reads through after a hand-off (see the module doc).
pub(crate) struct Gate<T, A> {
    inner: T,
    scanner: Scanner,
    /// Read from `inner`, not yet given to hyper.
    buffer: BytesMut,
    /// The first `passed` bytes of `buffer` are checked.
    passed: usize,
    /// A refused head, written before the shutdown.
    refusal: Option<Refusal>,
    /// The refusal's bytes, as far as written.
    answer: Option<(Vec<u8>, usize)>,
    /// hyper is shutting the connection down: reads pass unchecked (the
    /// lingering close drops them).
    closing: bool,
    /// A read waiting for an upgrade's answer.
    reader: Option<Waker>,
    answered: A,
}

impl<T, A> Gate<T, A> {
    /// `inner` starts at a request head (the one the fast path handed off).
    pub(crate) fn new(inner: T, max_head: usize, answered: A) -> Self {
        Gate {
            inner,
            scanner: Scanner::new(max_head),
            buffer: BytesMut::new(),
            passed: 0,
            refusal: None,
            answer: None,
            closing: false,
            reader: None,
            answered,
        }
    }
}

impl<T: AsyncRead + Unpin, A: Answered + Unpin> AsyncRead for Gate<T, A> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        out: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.passed > 0 {
                let n = this.passed.min(out.remaining());
                out.put_slice(&this.buffer[..n]);
                this.buffer.advance(n);
                this.passed -= n;
                return Poll::Ready(Ok(()));
            }
            if this.refusal.is_some() {
                // hyper sees the end of the stream only once it has
                // answered every request it was given: an end while one is
                // in flight would be a client gone, and its answer dropped.
                if this.answered.poll_answered(cx).is_pending() {
                    return Poll::Pending;
                }
                return Poll::Ready(Ok(()));
            }
            if this.closing {
                if !this.buffer.is_empty() {
                    this.buffer.clear();
                }
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            match this.scanner.scan(&this.buffer) {
                Step::Pass(n) => this.passed = n,
                Step::Tunnel => this.passed = this.buffer.len(),
                Step::More => {}
                Step::AwaitIdle => {
                    if this.answered.poll_answered(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.passed = this.scanner.release_upgrade();
                    continue;
                }
                Step::AwaitAnswer => {
                    this.reader = Some(cx.waker().clone());
                    return Poll::Pending;
                }
                Step::RefuseHead(refusal) => {
                    // The end of the stream, for hyper (above): it answers
                    // what it owes and shuts down, and the refusal is
                    // written then.
                    this.refusal = Some(refusal);
                    continue;
                }
                Step::RefuseBody(reason) => {
                    tracing::debug!(reason, "request body refused");
                    return Poll::Ready(Ok(()));
                }
            }
            if this.passed > 0 {
                continue;
            }
            if this.scanner.state == State::Tunnel {
                // Nothing buffered: read straight into hyper's buffer.
                return Pin::new(&mut this.inner).poll_read(cx, out);
            }
            // More bytes are needed to decide.
            this.buffer.reserve(READ_CHUNK);
            let spare = this.buffer.spare_capacity_mut();
            let mut read = ReadBuf::uninit(spare);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Ready(Ok(())) => {
                    let n = read.filled().len();
                    if n == 0 {
                        // The client is gone; an incomplete message is
                        // hyper's to end (it answers nothing).
                        return Poll::Ready(Ok(()));
                    }
                    // SAFETY: `ReadBuf` initialised these `n` bytes of the
                    // spare capacity.
                    unsafe { this.buffer.set_len(this.buffer.len() + n) };
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin, A: Unpin> Gate<T, A> {
    fn saw_written(&mut self, written: &[u8]) {
        if self.scanner.state == State::AwaitAnswer {
            self.scanner.answered(written);
            if self.scanner.state != State::AwaitAnswer
                && let Some(reader) = self.reader.take()
            {
                reader.wake();
            }
        }
    }
}

impl<T: AsyncWrite + Unpin, A: Answered + Unpin> AsyncWrite for Gate<T, A> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            this.saw_written(&buf[..n]);
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = written {
            for buf in bufs {
                let take = n.min(buf.len());
                this.saw_written(&buf[..take]);
                n -= take;
                if n == 0 {
                    break;
                }
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(refusal) = this.refusal.take() {
            tracing::debug!(status = %refusal.status, detail = refusal.detail, "request refused");
            this.answered.refused(refusal);
            let mut bytes = Vec::with_capacity(256);
            refusal.encode(&mut bytes);
            this.answer = Some((bytes, 0));
        }
        while let Some((bytes, at)) = this.answer.as_mut() {
            if *at == bytes.len() {
                this.answer = None;
                break;
            }
            match Pin::new(&mut this.inner).poll_write(cx, &bytes[*at..]) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *at += n,
            }
        }
        this.closing = true;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scans `input` to its end as a reader would, bytes arriving `split`
    /// at a time; returns the bytes passed and the final step.
    fn scan_all(scanner: &mut Scanner, input: &[u8], split: usize) -> (usize, Step) {
        let mut available = 0;
        let mut passed = 0;
        loop {
            match scanner.scan(&input[passed..available]) {
                Step::Pass(n) => passed += n,
                Step::More if available < input.len() => {
                    available = (available + split).min(input.len());
                }
                step => return (passed, step),
            }
        }
    }

    fn passes_whole(input: &[u8]) {
        for split in [1, 2, 7, input.len()] {
            let mut scanner = Scanner::new(8 * 1024);
            let (passed, step) = scan_all(&mut scanner, input, split);
            assert_eq!(
                (passed, step),
                (input.len(), Step::More),
                "{:?} split by {split}",
                String::from_utf8_lossy(input)
            );
            assert_eq!(scanner.state, State::Head);
        }
    }

    fn body_refused(input: &[u8]) {
        for split in [1, 3, input.len()] {
            let mut scanner = Scanner::new(8 * 1024);
            let (_, step) = scan_all(&mut scanner, input, split);
            assert!(
                matches!(step, Step::RefuseBody(_)),
                "{:?} split by {split}: {step:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    const CHUNKED_HEAD: &[u8] = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";

    fn chunked(body: &[u8]) -> Vec<u8> {
        [CHUNKED_HEAD, body].concat()
    }

    #[test]
    fn well_framed_messages_pass_whole() {
        passes_whole(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
        passes_whole(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello");
        passes_whole(&chunked(b"5\r\nhello\r\n0\r\n\r\n"));
        passes_whole(&chunked(
            b"5;name=value;x=\"q\"\r\nhello\r\nA \r\n0123456789\r\n0\r\n\r\n",
        ));
        passes_whole(&chunked(b"0\r\nX-Sum: 1\r\nY: \r\n\r\n"));
        passes_whole(&chunked(b"00000005\r\nhello\r\n0\r\n\r\n"));
        // Two pipelined.
        passes_whole(
            &[
                &chunked(b"1\r\na\r\n0\r\n\r\n")[..],
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
            ]
            .concat(),
        );
    }

    #[test]
    fn malformed_chunked_bodies_are_refused() {
        for body in [
            &b"10000000000000000\r\n"[..], // 2^64: overflow
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"+5\r\nhello\r\n0\r\n\r\n",
            b"\r\n",
            b";ext\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\rhello\r\n0\r\n\r\n",
            b"5;a\nhello\r\n0\r\n\r\n",
            b"5;a\rb\r\nhello\r\n0\r\n\r\n",
            b"5;a\x00\r\nhello\r\n0\r\n\r\n",
            b"5 zz\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloX\r\n0\r\n\r\n",
            b"5\r\nhello\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\n",
            b"5\r\nhello\r\n0\n\r\n",
            b"0\r\n folded: x\r\n\r\n",
            b"0\r\nX : 1\r\n\r\n",
            b"0\r\nX: a\x00\r\n\r\n",
            b"0\r\nX: 1\n\r\n",
            b"0\r\n:x\r\n\r\n",
        ] {
            body_refused(&chunked(body));
        }
    }

    #[test]
    fn what_passes_does_not_depend_on_how_the_bytes_arrive() {
        // Fuzz crash (request_head): a bad trailer after a good chunk; split
        // arrivals passed the chunk, the whole input refused it unpassed.
        let input = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
                      5;x=y\r\nhello\r\n0\r\nT: 1\r\n\n\rGET /ws HTTP/1.1\r\n";
        let mut outcomes = Vec::new();
        for split in [1, 2, 3, 16, input.len()] {
            let mut scanner = Scanner::new(8 * 1024);
            outcomes.push(scan_all(&mut scanner, input, split));
        }
        assert!(
            outcomes.windows(2).all(|pair| pair[0] == pair[1]),
            "{outcomes:?}"
        );
        assert!(matches!(outcomes[0].1, Step::RefuseBody(_)));
    }

    #[test]
    fn heads_after_a_hand_off_are_checked_like_the_first() {
        let mut scanner = Scanner::new(1024);
        let step = scanner
            .scan(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(
            matches!(step, Step::RefuseHead(r) if r.status == 400),
            "{step:?}"
        );
        let mut scanner = Scanner::new(16);
        assert_eq!(
            scanner.scan(b"GET / HTTP/1.1\r\nHost: a"),
            Step::RefuseHead(Refusal::TOO_LARGE)
        );
        let mut scanner = Scanner::new(1024);
        assert_eq!(
            scanner.scan(b"GET /a<b HTTP/1.1\r\nHost: a\r\n\r\n"),
            Step::RefuseHead(Refusal::MALFORMED)
        );
    }

    #[test]
    fn a_target_authority_is_held_to_the_host_rule() {
        // Only the gate sees absolute-form targets: the fast path hands
        // every one off.
        for head in [
            &b"GET http://a:abc/ HTTP/1.1\r\nHost: a\r\n\r\n"[..],
            b"GET http://a@b/ HTTP/1.1\r\nHost: b\r\n\r\n",
            b"CONNECT a:99999 HTTP/1.1\r\nHost: a\r\n\r\n",
        ] {
            let mut scanner = Scanner::new(1024);
            assert!(
                matches!(scanner.scan(head), Step::RefuseHead(r) if r.status == 400),
                "{:?}",
                String::from_utf8_lossy(head)
            );
        }
        passes_whole(b"GET http://a:8080/x HTTP/1.1\r\nHost: a:8080\r\n\r\n");
        // The target's authority wins (RFC 9112 §3.2.2); the Host is still
        // required and must be valid.
        passes_whole(b"GET http://a/ HTTP/1.1\r\nHost: b\r\n\r\n");
        let mut scanner = Scanner::new(1024);
        assert!(matches!(
            scanner.scan(b"GET http://a/ HTTP/1.1\r\n\r\n"),
            Step::RefuseHead(_)
        ));
        let mut scanner = Scanner::new(1024);
        assert!(matches!(
            scanner.scan(b"GET http://a/ HTTP/1.1\r\nHost: a:x\r\n\r\n"),
            Step::RefuseHead(_)
        ));
    }

    #[test]
    fn an_upgrade_waits_for_the_earlier_answers_then_for_its_own() {
        let head =
            b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n";
        let mut scanner = Scanner::new(1024);
        assert_eq!(scanner.scan(head), Step::AwaitIdle);
        assert_eq!(scanner.release_upgrade(), head.len());
        assert_eq!(scanner.scan(b"GET / HTTP/1.1\r\n"), Step::AwaitAnswer);
        // An interim response, then a refusal of the upgrade: heads again.
        scanner.answered(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 4");
        assert_eq!(scanner.scan(b"x"), Step::AwaitAnswer);
        scanner.answered(b"04 Not Found\r\n");
        assert_eq!(scanner.state, State::Head);

        let mut scanner = Scanner::new(1024);
        assert_eq!(scanner.scan(head), Step::AwaitIdle);
        scanner.release_upgrade();
        scanner.answered(b"HTTP/1.1 101 Switching Protocols\r\n");
        assert_eq!(scanner.scan(b"anything \x00 at all"), Step::Tunnel);
    }
}
