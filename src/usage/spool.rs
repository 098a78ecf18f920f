//! The spool: usage events on disk until the collector acknowledges them.
//!
//! A directory of append-only segments, `NNNNNNNNNNNNNNNNNNNN.jsonl` (a
//! sequence number), each one event per line; the writer appends whole
//! lines to the newest and syncs once per batch ([`Spool::append`]). The
//! first unacknowledged byte is the `ack` file's `SEQ OFFSET CHECK`,
//! written over in place (one `pwrite` of a fixed-width line, not synced)
//! after each acknowledged batch ([`Spool::ack`]); a segment acknowledged
//! to its end is deleted. The ack was a file written beside, synced and
//! renamed for every batch of 100 events: five system calls and a journal
//! commit a batch, most of what the export cost beyond its instructions.
//! An ack the disk did not keep only moves delivery back (duplicates,
//! which at least once allows, deduplicable by `id`); one torn by a crash
//! fails its check and sends from the first segment's start.
//! The sender reads oldest first from there ([`Spool::next_batch`]).
//!
//! Bounded: a segment holds about an eighth of `spool_max`; when the
//! segments pass `spool_max`, the oldest are deleted, their unacknowledged
//! events counted as dropped, until they fit (the newest, being written,
//! stays).
//!
//! One process at a time: the spool's `lock` file is held with `flock`
//! while it is open, and a second opener is refused.
//!
//! Crash-safe: a process that died mid-write leaves at most a torn last
//! line, cut off when the spool is opened again; in the segments a
//! previous process left, a line a crash or a disk damaged (not braces
//! around printable UTF-8) is skipped when read. Opening always starts a
//! new segment, so what this process reads of its own segments it wrote
//! whole itself. A crash between a collector's 2xx and the `ack` file's
//! write (or before the system wrote it to disk) sends that batch again:
//! delivery is at least once.
//!
//! Example, `spool_max` 8 KiB (segments of 1 KiB): 30 events of 400 bytes
//! make segments 1–10 of 3 events (1,200 bytes each: a segment is closed
//! once it has passed 1 KiB); after the ninth's third event the spool
//! holds 10,800 bytes > 8 KiB, so segments 1 and 2 (2,400 bytes, 6
//! events) are dropped, and 6 is counted.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use parking_lot::Mutex;

/// The most bytes a segment holds before the next append starts another.
const SEGMENT_MAX: u64 = 64 << 20;
/// The most one read of a segment takes (a batch's lines are read at
/// once up to this; longer lines in several reads).
const READ_MAX: u64 = 1 << 20;
/// The acknowledged position's file.
const ACK: &str = "ack";
/// Where refused batches are set aside.
pub(crate) const DEAD_LETTER: &str = "dead-letter.jsonl";

/// The spool of one exporter. Its state behind one lock: the writer
/// thread and the sender thread take it, never a request.
#[derive(Debug)]
pub(crate) struct Spool {
    dir: PathBuf,
    /// Holds the directory's `flock` while the spool is open.
    _lock: File,
    max_bytes: u64,
    segment_bytes: u64,
    /// Segments from this number on were created by this process; the
    /// ones before it, found at the open, have their lines checked when
    /// read.
    fresh_from: u64,
    state: Mutex<State>,
    /// The segment the sender reads (its number and file), kept open
    /// between batches: opening, seeking and closing it for every batch
    /// cost four system calls a batch. Only the sender takes this lock.
    reading: Mutex<Option<(u64, File)>>,
}

#[derive(Debug)]
struct State {
    /// Oldest first; never empty.
    segments: VecDeque<Segment>,
    /// The newest segment, open for appending.
    writer: File,
    /// The first unacknowledged byte: in `segments[0]`.
    ack: Position,
    /// The `ack` file, held open to be written over in place.
    ack_file: File,
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    seq: u64,
    /// Bytes written and synced: whole lines.
    bytes: u64,
    /// Lines in those bytes.
    events: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Position {
    seq: u64,
    offset: u64,
    /// Lines before `offset`.
    events: u64,
}

/// Events read for one POST, from one segment.
#[derive(Debug)]
pub(crate) struct Batch {
    seq: u64,
    start: u64,
    end: u64,
    /// Lines read, including skipped ones (for the acknowledged count).
    lines: u64,
    /// The events as `application/cloudevents-batch+json`: a JSON array
    /// of the spool's lines as they are (each line is an event's JSON).
    body: Bytes,
    /// Where each event is in `body`.
    events: Vec<Range<usize>>,
}

impl Batch {
    /// The batch as `application/cloudevents-batch+json`: a JSON array.
    pub(crate) fn body(&self) -> Bytes {
        self.body.clone()
    }

    /// How many events it holds.
    pub(crate) fn len(&self) -> usize {
        self.events.len()
    }

    /// Its events, each one JSON object.
    pub(crate) fn events(&self) -> impl Iterator<Item = &[u8]> {
        self.events.iter().map(|range| &self.body[range.clone()])
    }
}

/// What opening found.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Opened {
    /// Events not acknowledged yet: sent first.
    pub(crate) pending: u64,
    /// Bytes of a torn last line cut off.
    pub(crate) torn: u64,
}

impl Spool {
    /// Opens the spool in `dir` (created if missing) bounded by
    /// `max_bytes`, recovering what a previous process left.
    pub(crate) fn open(dir: &Path, max_bytes: u64) -> io::Result<(Spool, Opened)> {
        fs::create_dir_all(dir)?;
        let lock = lock(dir)?;
        let mut found = Vec::new();
        for entry in fs::read_dir(dir)? {
            let name = entry?.file_name();
            if let Some(seq) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".jsonl"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                found.push(seq);
            }
        }
        found.sort_unstable();
        let saved = read_ack(dir);
        let mut opened = Opened::default();
        let mut segments = VecDeque::new();
        for seq in found {
            let path = segment_path(dir, seq);
            if saved.is_some_and(|(acked, _)| seq < acked) {
                fs::remove_file(&path)?;
                continue;
            }
            let (bytes, events, torn) = recover(&path)?;
            opened.torn += torn;
            segments.push_back(Segment { seq, bytes, events });
        }
        let next = segments.back().map_or(1, |s| s.seq + 1);
        let mut ack = Position {
            seq: next,
            offset: 0,
            events: 0,
        };
        if let (Some((seq, offset)), Some(first)) = (saved, segments.front())
            && seq == first.seq
        {
            let offset = offset.min(first.bytes);
            ack = Position {
                seq,
                offset,
                events: count_lines(&segment_path(dir, seq), offset)?,
            };
        } else if let Some(first) = segments.front() {
            ack = Position {
                seq: first.seq,
                offset: 0,
                events: 0,
            };
        }
        let ack_file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(dir.join(ACK))?;
        write_ack(&ack_file, ack)?;
        let writer = create_segment(dir, next)?;
        segments.push_back(Segment {
            seq: next,
            bytes: 0,
            events: 0,
        });
        let state = State {
            segments,
            writer,
            ack,
            ack_file,
        };
        opened.pending = state.pending();
        let spool = Spool {
            dir: dir.to_owned(),
            _lock: lock,
            max_bytes,
            segment_bytes: (max_bytes / 8).clamp(1, SEGMENT_MAX),
            fresh_from: next,
            state: Mutex::new(state),
            reading: Mutex::new(None),
        };
        Ok((spool, opened))
    }

    /// Appends `lines` (`events` whole lines) to the newest segment and
    /// syncs them; then drops the oldest segments past `spool_max`.
    /// Returns the events dropped so.
    pub(crate) fn append(&self, lines: &[u8], events: u64) -> io::Result<u64> {
        debug_assert!(lines.is_empty() || lines.ends_with(b"\n"));
        let mut state = self.state.lock();
        let newest = *state.segments.back().expect("a segment");
        if newest.bytes >= self.segment_bytes {
            let seq = newest.seq + 1;
            state.writer = create_segment(&self.dir, seq)?;
            state.segments.push_back(Segment {
                seq,
                bytes: 0,
                events: 0,
            });
        }
        let written = state
            .writer
            .write_all(lines)
            .and_then(|()| state.writer.sync_data());
        let synced = state.segments.back().expect("a segment").bytes;
        if let Err(error) = written {
            // Whatever part was written is cut off: the segment stays whole lines.
            let _ = state.writer.set_len(synced);
            let _ = state.writer.seek(SeekFrom::Start(synced));
            return Err(error);
        }
        let newest = state.segments.back_mut().expect("a segment");
        newest.bytes += lines.len() as u64;
        newest.events += events;
        self.enforce_bound(&mut state)
    }

    /// Deletes the oldest segments while the spool is over its bound.
    fn enforce_bound(&self, state: &mut State) -> io::Result<u64> {
        let mut dropped = 0;
        while state.segments.len() > 1
            && state.segments.iter().map(|s| s.bytes).sum::<u64>() > self.max_bytes
        {
            let oldest = state.segments.pop_front().expect("two segments");
            let acked = if state.ack.seq == oldest.seq {
                state.ack.events
            } else {
                0
            };
            dropped += oldest.events - acked;
            let next = state.segments.front().expect("one segment").seq;
            state.ack = Position {
                seq: next,
                offset: 0,
                events: 0,
            };
            write_ack(&state.ack_file, state.ack)?;
            remove_segment(&self.dir, oldest.seq)?;
        }
        Ok(dropped)
    }

    /// Up to `max` events from the first unacknowledged one, all from one
    /// segment; `None` when every event is acknowledged.
    pub(crate) fn next_batch(&self, max: usize) -> io::Result<Option<Batch>> {
        // The position and the synced length under the lock; the read
        // outside it, so the writer's appends never wait for it (a
        // segment's synced bytes never change, and the segment is deleted
        // only by the acknowledgement or the bound).
        let found = {
            let mut state = self.state.lock();
            loop {
                let ack = state.ack;
                let Some(segment) = state.segments.iter().find(|s| s.seq == ack.seq).copied()
                else {
                    break Err(state.segments.front().map_or(u64::MAX, |s| s.seq));
                };
                if ack.offset < segment.bytes {
                    break Ok((ack, segment));
                }
                // Acknowledged to its end, and no longer the newest (the
                // writer has moved on since): deleted, on to the next.
                let Some(next) = state.segments.iter().find(|s| s.seq > ack.seq).copied() else {
                    break Err(segment.seq);
                };
                state.segments.retain(|s| s.seq != ack.seq);
                state.ack = Position {
                    seq: next.seq,
                    offset: 0,
                    events: 0,
                };
                write_ack(&state.ack_file, state.ack)?;
                remove_segment(&self.dir, ack.seq)?;
            }
        };
        let mut reading = self.reading.lock();
        let (position, segment) = match found {
            Ok(found) => found,
            Err(oldest) => {
                // Nothing to send. A segment read before and deleted since
                // is let go (its disk space with it); the one being
                // written stays open for the next events.
                if reading.as_ref().is_some_and(|(seq, _)| *seq < oldest) {
                    *reading = None;
                }
                return Ok(None);
            }
        };
        if reading.as_ref().map(|(seq, _)| *seq) != Some(position.seq) {
            *reading = None;
            match File::open(segment_path(&self.dir, position.seq)) {
                Ok(file) => *reading = Some((position.seq, file)),
                // Dropped by the bound meanwhile: the next call goes on.
                Err(error) if error.kind() == io::ErrorKind::NotFound => {
                    return Ok(Some(Batch {
                        seq: position.seq,
                        start: position.offset,
                        end: position.offset,
                        lines: 0,
                        body: Bytes::from_static(b"[]"),
                        events: Vec::new(),
                    }));
                }
                Err(error) => return Err(error),
            }
        }
        let Some((_, file)) = reading.as_ref() else {
            unreachable!("opened just above");
        };
        // Lines a previous process left are checked (a crash may have left
        // zeros or a damaged block where the disk had not written them);
        // this process's own were written whole from its memory and are
        // read back as written.
        let check = position.seq < self.fresh_from;
        // Only the batch's lines are read (a segment holds up to 64 MiB:
        // reading the rest of it for every batch made a drain quadratic),
        // by one `pread` of what `max` lines of the segment's mean length
        // take (a quarter more, and a page), more only for longer lines;
        // straight into the body: the lines are the events' JSON, so each
        // line's newline becomes the array's comma.
        let end = segment.bytes;
        let mean = segment.bytes / segment.events.max(1);
        let chunk = (max as u64)
            .saturating_mul(mean.saturating_add(mean / 4))
            .saturating_add(4096)
            .min(READ_MAX);
        let mut at = position.offset;
        let mut body = Vec::with_capacity((end - at).min(chunk) as usize + 2);
        body.push(b'[');
        let mut events = Vec::with_capacity(max.min(1024));
        let mut lines = 0;
        // Bytes of the segment in the lines taken (skipped ones included).
        let mut consumed = 0;
        // Where the next line starts in `body`; the bytes after it are
        // read but not yet taken.
        let mut next = 1;
        // Until `max` events, or the synced end (no read past it: a
        // partial batch would grow the body for nothing).
        while events.len() < max && at < end {
            let read = read_at(file, &mut body, (end - at).min(chunk) as usize, at)?;
            if read == 0 {
                break;
            }
            at += read as u64;
            while events.len() < max {
                let Some(length) = memchr::memchr(b'\n', &body[next..]) else {
                    break;
                };
                let newline = next + length;
                consumed += length as u64 + 1;
                lines += 1;
                if !check || is_event(&body[next..newline]) {
                    events.push(next..newline);
                    body[newline] = b',';
                    next = newline + 1;
                } else {
                    body.copy_within(newline + 1.., next);
                    body.truncate(body.len() - length - 1);
                    tracing::warn!(
                        segment = position.seq,
                        "usage spool: a damaged line skipped"
                    );
                }
            }
        }
        // What was read past the last line taken is read again next time;
        // the last comma closes the array.
        body.truncate(next);
        match body.last_mut() {
            Some(last) if *last == b',' => *last = b']',
            _ => body.push(b']'),
        }
        Ok(Some(Batch {
            seq: position.seq,
            start: position.offset,
            end: position.offset + consumed,
            lines,
            body: Bytes::from(body),
            events,
        }))
    }

    /// The collector took `batch`: the acknowledged position moves past
    /// it, saved; a segment acknowledged to its end (not the newest) is
    /// deleted. A batch whose segment was dropped meanwhile moves nothing.
    pub(crate) fn ack(&self, batch: &Batch) -> io::Result<()> {
        let mut state = self.state.lock();
        if state.ack.seq != batch.seq || state.ack.offset != batch.start {
            return Ok(());
        }
        state.ack.offset = batch.end;
        state.ack.events += batch.lines;
        let done = state.segments.len() > 1
            && state
                .segments
                .front()
                .is_some_and(|s| s.seq == batch.seq && s.bytes == batch.end);
        if done {
            state.segments.pop_front();
            let next = state.segments.front().expect("the newest").seq;
            state.ack = Position {
                seq: next,
                offset: 0,
                events: 0,
            };
        }
        write_ack(&state.ack_file, state.ack)?;
        if done {
            remove_segment(&self.dir, batch.seq)?;
        }
        Ok(())
    }

    /// Appends `batch`'s events to the dead-letter file, synced.
    pub(crate) fn set_aside(&self, batch: &Batch) -> io::Result<()> {
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(DEAD_LETTER))?;
        let mut lines = Vec::with_capacity(batch.body.len());
        for event in batch.events() {
            lines.extend_from_slice(event);
            lines.push(b'\n');
        }
        file.write_all(&lines)?;
        file.sync_data()
    }

    /// Events not acknowledged yet.
    pub(crate) fn pending(&self) -> u64 {
        self.state.lock().pending()
    }

    /// Calls `publish` with the events not yet acknowledged, under the
    /// lock: the writer's and the sender's publications of the count
    /// (the gauge) come in the order of the changes, so a stale count
    /// never overwrites a newer one.
    pub(crate) fn publish_pending<R>(&self, publish: impl FnOnce(u64) -> R) -> R {
        publish(self.state.lock().pending())
    }
}

impl State {
    fn pending(&self) -> u64 {
        let all: u64 = self.segments.iter().map(|s| s.events).sum();
        let acked = if self.segments.front().map(|s| s.seq) == Some(self.ack.seq) {
            self.ack.events
        } else {
            0
        };
        all - acked.min(all)
    }
}

/// Whether a spool line is an event, not a line a disk damaged (which
/// the collector would refuse with the whole batch): an object's braces
/// around UTF-8 text without a control byte, as the writer's JSON always
/// is, and a block of zeros or stray bytes is not. Its shape, not a
/// parse: the sender reads every event, and a JSON parse of each cost
/// more than the rest of its work on it (`bench/budget_cost.sh`).
fn is_event(line: &[u8]) -> bool {
    // A fold, not `any`: no early exit, so the loop is vectorized.
    let printable = line.iter().fold(true, |ok, &b| ok & (b >= 0x20));
    line.first() == Some(&b'{')
        && line.last() == Some(&b'}')
        && printable
        && (line.is_ascii() || std::str::from_utf8(line).is_ok())
}

/// The spool's `lock` file, locked: refused while another holds it.
fn lock(dir: &Path) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    // SAFETY: flock on a descriptor this function owns.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    if !locked {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            "the spool is in use by another gateway (its `lock` file is held)",
        ));
    }
    Ok(file)
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}.jsonl"))
}

fn create_segment(dir: &Path, seq: u64) -> io::Result<File> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(segment_path(dir, seq))?;
    sync_dir(dir)?;
    Ok(file)
}

fn remove_segment(dir: &Path, seq: u64) -> io::Result<()> {
    match fs::remove_file(segment_path(dir, seq)) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// A new or removed name is durable once its directory is synced.
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A segment's whole lines: its length cut back to its last newline (a
/// torn line of a crash is removed), with the lines counted. Returns
/// (bytes, lines, bytes cut).
fn recover(path: &Path) -> io::Result<(u64, u64, u64)> {
    let bytes = fs::read(path)?;
    let whole = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let torn = (bytes.len() - whole) as u64;
    if torn > 0 {
        let file = OpenOptions::new().write(true).open(path)?;
        file.set_len(whole as u64)?;
        file.sync_data()?;
    }
    let lines = memchr::memchr_iter(b'\n', &bytes[..whole]).count() as u64;
    Ok((whole as u64, lines, torn))
}

/// Appends up to `length` bytes from `offset` of `file` to `buffer` (one
/// `pread` into its spare capacity, retrying an interrupted call); the
/// bytes read (0 at the end). Into the spare capacity, not a zeroed
/// slice: zeroing a batch's ~40 KB before each read cost the sender more
/// than the rest of its work on the batch.
fn read_at(file: &File, buffer: &mut Vec<u8>, length: usize, offset: u64) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    let offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset past off_t"))?;
    buffer.reserve(length);
    loop {
        let spare = buffer.spare_capacity_mut();
        // SAFETY: the descriptor is `file`'s, open; `spare` is valid for
        // writes of `length` bytes (reserved just above), and pread writes
        // at most that many.
        let read = unsafe {
            libc::pread(
                file.as_raw_fd(),
                spare.as_mut_ptr().cast(),
                length.min(spare.len()),
                offset,
            )
        };
        match usize::try_from(read) {
            Ok(read) => {
                // SAFETY: pread initialized `read` bytes past the length
                // (at most the spare capacity).
                unsafe { buffer.set_len(buffer.len() + read) };
                return Ok(read);
            }
            Err(_) => {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::Interrupted {
                    return Err(error);
                }
            }
        }
    }
}

/// Lines in the first `offset` bytes of a segment.
fn count_lines(path: &Path, offset: u64) -> io::Result<u64> {
    let mut bytes = Vec::new();
    File::open(path)?.take(offset).read_to_end(&mut bytes)?;
    Ok(memchr::memchr_iter(b'\n', &bytes).count() as u64)
}

/// The saved position, if the file holds one whose check holds (or one in
/// the format before the check, `SEQ OFFSET`, which was renamed into place
/// whole).
fn read_ack(dir: &Path) -> Option<(u64, u64)> {
    let text = fs::read_to_string(dir.join(ACK)).ok()?;
    let mut fields = text.split_ascii_whitespace();
    let seq = fields.next()?.parse().ok()?;
    let offset = fields.next()?.parse().ok()?;
    match fields.next() {
        None => Some((seq, offset)),
        Some(check) if check.parse() == Ok(ack_check(seq, offset)) && fields.next().is_none() => {
            Some((seq, offset))
        }
        Some(_) => None,
    }
}

/// Writes `position` over the `ack` file's line: fixed width, so each write
/// covers the last whole.
fn write_ack(file: &File, position: Position) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let (seq, offset) = (position.seq, position.offset);
    let line = format!("{seq:020} {offset:020} {:020}\n", ack_check(seq, offset));
    file.write_all_at(line.as_bytes(), 0)
}

/// What a line's third field must be: a torn write (old digits beside
/// new) almost surely fails it, and is read as no position.
fn ack_check(seq: u64, offset: u64) -> u64 {
    (seq ^ offset.rotate_left(32) ^ 0x746f_6c6c_6761_7465).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` events numbered from `first`, each a JSON line of ~`pad` bytes.
    fn events(first: u64, n: u64, pad: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for i in first..first + n {
            out.extend_from_slice(
                format!("{{\"n\":{i},\"pad\":\"{}\"}}\n", "x".repeat(pad)).as_bytes(),
            );
        }
        out
    }

    fn numbers(batch: &Batch) -> Vec<u64> {
        batch
            .events()
            .map(|e| {
                serde_json::from_slice::<serde_json::Value>(e).unwrap()["n"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }

    /// Reads and acknowledges everything, `max` at a time.
    fn drain(spool: &Spool, max: usize) -> Vec<u64> {
        let mut all = Vec::new();
        while let Some(batch) = spool.next_batch(max).unwrap() {
            all.extend(numbers(&batch));
            spool.ack(&batch).unwrap();
        }
        all
    }

    #[test]
    fn events_are_read_in_order_and_acknowledged_once() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, opened) = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(opened, Opened::default());
        assert!(spool.next_batch(10).unwrap().is_none());
        assert_eq!(spool.append(&events(0, 25, 10), 25).unwrap(), 0);
        assert_eq!(spool.pending(), 25);
        let first = spool.next_batch(10).unwrap().unwrap();
        assert_eq!(numbers(&first), (0..10).collect::<Vec<_>>());
        // Not acknowledged: the same batch again.
        assert_eq!(
            numbers(&spool.next_batch(10).unwrap().unwrap()),
            numbers(&first)
        );
        spool.ack(&first).unwrap();
        // Acknowledging twice moves nothing more.
        spool.ack(&first).unwrap();
        assert_eq!(spool.pending(), 15);
        assert_eq!(drain(&spool, 10), (10..25).collect::<Vec<_>>());
        assert_eq!(spool.pending(), 0);
    }

    #[test]
    fn the_body_is_a_json_array() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
        spool.append(&events(7, 3, 0), 3).unwrap();
        let body = spool.next_batch(10).unwrap().unwrap().body();
        let parsed: Vec<serde_json::Value> = serde_json::from_slice(&body).unwrap();
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[2]["n"], 9);
    }

    #[test]
    fn a_batch_spans_reads_and_lines_longer_than_one() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, _) = Spool::open(dir.path(), 64 << 20).unwrap();
        // 300 events of ~400 bytes (120 KB: two reads for 250 of them),
        // then one of 100 KB, longer than a read.
        spool.append(&events(0, 300, 390), 300).unwrap();
        spool.append(&events(300, 1, 100_000), 1).unwrap();
        spool.append(&events(301, 2, 10), 2).unwrap();
        let first = spool.next_batch(250).unwrap().unwrap();
        assert_eq!(numbers(&first), (0..250).collect::<Vec<_>>());
        let body: Vec<serde_json::Value> = serde_json::from_slice(&first.body()).unwrap();
        assert_eq!(body.len(), 250);
        spool.ack(&first).unwrap();
        let second = spool.next_batch(250).unwrap().unwrap();
        assert_eq!(numbers(&second), (250..303).collect::<Vec<_>>());
        // `{"n":300,"pad":""}` around the pad.
        assert_eq!(second.events().nth(50).unwrap().len(), 100_000 + 18);
        spool.ack(&second).unwrap();
        assert_eq!(spool.pending(), 0);
    }

    #[test]
    fn segments_rotate_and_acknowledged_ones_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        // Segments of 1 KiB.
        let (spool, _) = Spool::open(dir.path(), 8 << 10).unwrap();
        for i in 0..10 {
            spool.append(&events(i * 3, 3, 100), 3).unwrap();
        }
        let segments = || {
            fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .path()
                        .extension()
                        .is_some_and(|x| x == "jsonl")
                })
                .count()
        };
        assert!(segments() > 2, "{} segments", segments());
        assert_eq!(drain(&spool, 4), (0..30).collect::<Vec<_>>());
        // Only the newest is left, and the reader holds no other open (a
        // deleted segment's file held open would keep its disk space).
        assert_eq!(segments(), 1);
        let newest = spool.state.lock().segments.back().unwrap().seq;
        let reading = spool.reading.lock().as_ref().map(|(seq, _)| *seq);
        assert!(reading.is_none_or(|seq| seq == newest), "{reading:?}");
    }

    #[test]
    fn past_its_bound_the_oldest_events_are_dropped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, _) = Spool::open(dir.path(), 8 << 10).unwrap();
        let mut dropped = 0;
        // 30 events of ~400 bytes: 12 KB into 8 KiB.
        for i in 0..30 {
            dropped += spool.append(&events(i, 1, 390), 1).unwrap();
        }
        assert!(dropped > 0);
        let left = drain(&spool, 7);
        assert_eq!(left.len() as u64 + dropped, 30);
        // The newest survive, in order.
        assert_eq!(left, ((30 - left.len() as u64)..30).collect::<Vec<_>>());
        let on_disk: u64 = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(on_disk <= 8 << 10, "{on_disk} bytes");
    }

    #[test]
    fn dropping_a_segment_being_read_skips_to_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, _) = Spool::open(dir.path(), 2 << 10).unwrap();
        spool.append(&events(0, 2, 200), 2).unwrap();
        let reading = spool.next_batch(1).unwrap().unwrap();
        spool.ack(&reading).unwrap();
        let mut dropped = 0;
        for i in 2..20 {
            dropped += spool.append(&events(i, 1, 200), 1).unwrap();
        }
        // The first event was acknowledged: never counted as dropped.
        let left = drain(&spool, 100);
        assert_eq!(1 + dropped + left.len() as u64, 20, "{left:?}");
        assert_eq!(*left.last().unwrap(), 19);
    }

    #[test]
    fn a_restart_resumes_after_the_acknowledged_events() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
            spool.append(&events(0, 10, 5), 10).unwrap();
            let batch = spool.next_batch(4).unwrap().unwrap();
            spool.ack(&batch).unwrap();
            // Read, not acknowledged: sent again after the restart.
            let _ = spool.next_batch(4).unwrap();
        }
        let (spool, opened) = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(opened.pending, 6);
        spool.append(&events(10, 2, 5), 2).unwrap();
        assert_eq!(spool.pending(), 8);
        assert_eq!(drain(&spool, 3), (4..12).collect::<Vec<_>>());
        // And once more: nothing left.
        drop(spool);
        let (spool, opened) = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(opened.pending, 0);
        assert!(spool.next_batch(3).unwrap().is_none());
    }

    /// An ack line whose check fails (a write torn by a crash: old digits
    /// beside new) is no position: everything is sent again from the
    /// first segment, never skipped. A line in the format before the
    /// check (`SEQ OFFSET`, renamed into place whole) is still read.
    #[test]
    fn a_torn_ack_sends_again_and_the_old_format_is_read() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
            spool.append(&events(0, 10, 5), 10).unwrap();
            let batch = spool.next_batch(4).unwrap().unwrap();
            spool.ack(&batch).unwrap();
        }
        let line = fs::read_to_string(dir.path().join(ACK)).unwrap();
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        assert_eq!(fields.len(), 3, "{line:?}");
        // The offset's last digit torn: the check no longer holds.
        let offset: u64 = fields[1].parse().unwrap();
        let torn = format!("{} {:020} {}\n", fields[0], offset + 1, fields[2]);
        fs::write(dir.path().join(ACK), torn).unwrap();
        {
            let (spool, opened) = Spool::open(dir.path(), 1 << 20).unwrap();
            assert_eq!(opened.pending, 10, "a torn ack must send everything again");
            assert_eq!(drain(&spool, 4), (0..10).collect::<Vec<_>>());
        }
        // Two new events, then an ack in the old format pointing at the
        // first of them: read as it was written.
        let (seq, offset) = {
            let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
            spool.append(&events(10, 2, 5), 2).unwrap();
            let state = spool.state.lock();
            (state.ack.seq, state.ack.offset)
        };
        fs::write(dir.path().join(ACK), format!("{seq} {offset}\n")).unwrap();
        let (spool, opened) = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(opened.pending, 2);
        assert_eq!(drain(&spool, 4), vec![10, 11]);
    }

    #[test]
    fn a_torn_last_line_is_cut_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
            spool.append(&events(0, 3, 5), 3).unwrap();
        }
        // A crash mid-write: half a line at the end of the newest segment.
        let newest = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .max()
            .unwrap();
        let mut file = OpenOptions::new().append(true).open(&newest).unwrap();
        file.write_all(b"{\"n\":3,\"pa").unwrap();
        drop(file);
        let (spool, opened) = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(
            opened,
            Opened {
                pending: 3,
                torn: 10
            }
        );
        spool.append(&events(4, 1, 5), 1).unwrap();
        assert_eq!(drain(&spool, 10), vec![0, 1, 2, 4]);
    }

    /// In a segment a previous process left (a crash's zeros, a damaged
    /// block), the lines that are not events are skipped.
    #[test]
    fn a_damaged_line_is_skipped_and_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
        let mut lines = events(0, 1, 0);
        lines.extend_from_slice(b"\x00\x00garbage\n");
        lines.extend_from_slice(&events(1, 1, 0));
        // Zeros inside, a torn end, bytes that are not UTF-8.
        lines.extend_from_slice(b"{\"n\":9,\"pad\":\"\x00\x00\x00\"}\n");
        lines.extend_from_slice(b"{\"n\":9,\"pad\":\"\n");
        lines.extend_from_slice(b"{\"n\":9,\"pad\":\"\xff\xfe\"}\n");
        lines.extend_from_slice(&events(2, 1, 0));
        spool.append(&lines, 7).unwrap();
        drop(spool);
        let (spool, opened) = Spool::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(opened.pending, 7);
        let batch = spool.next_batch(10).unwrap().unwrap();
        assert_eq!(numbers(&batch), vec![0, 1, 2]);
        // The body is the good lines' JSON array.
        let body: Vec<serde_json::Value> = serde_json::from_slice(&batch.body()).unwrap();
        assert_eq!(body.len(), 3);
        spool.ack(&batch).unwrap();
        assert_eq!(spool.pending(), 0);
    }

    #[test]
    fn one_process_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
        let error = Spool::open(dir.path(), 1 << 20).unwrap_err();
        assert!(error.to_string().contains("in use"), "{error}");
        drop(spool);
        Spool::open(dir.path(), 1 << 20).unwrap();
    }

    #[test]
    fn a_refused_batch_is_set_aside() {
        let dir = tempfile::tempdir().unwrap();
        let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
        spool.append(&events(0, 2, 0), 2).unwrap();
        let batch = spool.next_batch(10).unwrap().unwrap();
        spool.set_aside(&batch).unwrap();
        spool.set_aside(&batch).unwrap();
        let text = fs::read_to_string(dir.path().join(DEAD_LETTER)).unwrap();
        assert_eq!(text.lines().count(), 4);
    }
}
