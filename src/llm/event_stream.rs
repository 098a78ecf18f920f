//! The `text/event-stream` framing, as the HTML Living Standard's
//! "Interpreting an event stream" reads it: a leading BOM skipped, lines
//! ending at CR, LF or CRLF, `field: value` lines (one space after the
//! colon dropped), comments (`:`), `data` lines joined with `\n`, the last
//! `event` line naming the event, and a blank line dispatching it. Fed any
//! split of the bytes, it keeps at most [`DATA_MAX`] bytes of an event's
//! data (a longer event is skipped whole, never held) and [`CARRY_MAX`]
//! raw bytes of the event it is in.
//!
//! [`EventStream::feed_skipping`] frames only the events that contain a
//! wanted string (`usage`), found by one SIMD search of each chunk: a
//! stream's blank lines written the way its first one was (`\n\n`, or
//! `\r\n\r\n`) are sync points after which the framing stands at a fresh
//! event whatever came before, so the bytes between two of them (a unit)
//! can be passed over unread, or framed from a fresh state, with the same
//! result as reading every byte.

use memchr::memmem;

/// The most data bytes of one event kept (the `\n`s joining its `data`
/// lines included). The events usage is read from are small; a longer one
/// (a big chunk of text) is skipped.
pub(crate) const DATA_MAX: usize = 64 * 1024;

/// The most raw bytes of the unit in progress kept unread while it may
/// not matter: a longer one is framed from there on (in constant memory).
/// The bound of every stream outside fuzzing, tests included.
pub(crate) const CARRY_MAX: usize = 16 * 1024;

/// The carry bound of [`EventStream::new`]: small under fuzzing, so that
/// its short inputs reach it (the code past the bound is the same for any
/// bound; the unit tests run both this one and [`CARRY_MAX`]).
#[cfg(not(fuzzing))]
const NEW_CARRY_MAX: usize = CARRY_MAX;
#[cfg(fuzzing)]
const NEW_CARRY_MAX: usize = CARRY_MAX / 256; // 64 bytes

/// The longest event name kept: longer names read as none (no event the
/// gateway looks for has such a name).
const NAME_MAX: usize = 32;

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// How a stream ends its events, from its first blank line: with an LF
/// (`\n\n`), or a CR (`\r\n\r\n`; sse-starlette and other CRLF writers).
/// Each names a sync point: after `\n\n`, and after `\n\r\n`, the framing
/// is at a fresh event (a blank line was just read, its CRLF whole) from
/// any state. A stream of CR-only lines has none and is framed whole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Style {
    Lf,
    CrLf,
}

impl Style {
    /// Whether a sync point ends with the LF at `at` in `bytes`, `before`
    /// being the two bytes of the stream before `bytes` (zeros at its
    /// start).
    fn ends_at(self, before: [u8; 2], bytes: &[u8], at: usize) -> bool {
        let back = |n: usize| match at.checked_sub(n) {
            Some(i) => bytes.get(i).copied().unwrap_or(0),
            None => before.get(2 + at - n).copied().unwrap_or(0),
        };
        match self {
            Style::Lf => back(1) == b'\n',
            Style::CrLf => back(1) == b'\r' && back(2) == b'\n',
        }
    }

    /// The end of the first sync point in `bytes` (LFs are only line ends:
    /// JSON escapes the ones of its strings, so there are few to try).
    fn first_end(self, before: [u8; 2], bytes: &[u8]) -> Option<usize> {
        memchr::memchr_iter(b'\n', bytes)
            .find(|&at| self.ends_at(before, bytes, at))
            .map(|at| at + 1)
    }

    /// The end of the last sync point in `bytes`.
    fn last_end(self, before: [u8; 2], bytes: &[u8]) -> Option<usize> {
        memchr::memrchr_iter(b'\n', bytes)
            .find(|&at| self.ends_at(before, bytes, at))
            .map(|at| at + 1)
    }
}

/// The two bytes of the stream before `bytes[at]`, `tail` being the two
/// before `bytes`.
fn preceding(tail: [u8; 2], bytes: &[u8], at: usize) -> [u8; 2] {
    match at {
        0 => tail,
        1 => [tail[1], bytes.first().copied().unwrap_or(0)],
        _ => [
            bytes.get(at - 2).copied().unwrap_or(0),
            bytes.get(at - 1).copied().unwrap_or(0),
        ],
    }
}

/// One dispatched event: its name (empty when none was given or it was
/// longer than [`NAME_MAX`]) and its data.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Event<'a> {
    pub(crate) name: &'a [u8],
    pub(crate) data: &'a [u8],
}

/// The field a line sets: only `data` and `event` matter here (`id` and
/// `retry` are a client's reconnection business).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Data,
    Event,
    Other,
}

/// Where the current line is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    /// Nothing of it read yet: ending here is a blank line.
    Start,
    Comment,
    /// In the field name, before any `:`.
    Name,
    /// Right after the `:`, where one space is dropped.
    ValueFirst(Field),
    Value(Field),
}

/// The framing's state between chunks.
#[derive(Debug)]
pub(crate) struct EventStream {
    /// Bytes of the BOM matched at the start, until `bom_done`.
    bom_matched: usize,
    bom_done: bool,
    line: Line,
    /// The previous byte was a CR: an LF now ends nothing more.
    after_cr: bool,
    /// The field name so far (the longest that matters is `event`).
    field: [u8; 5],
    field_len: usize,
    data: Vec<u8>,
    has_data: bool,
    /// The event's data went past [`DATA_MAX`]: it is skipped.
    oversized: bool,
    name: [u8; NAME_MAX],
    name_len: usize,
    /// How the stream's first blank line was written, once read.
    style: Option<Style>,
    /// The unit in progress is being framed (from the stream's start until
    /// the first sync point after its style is known, and for a unit
    /// longer than [`CARRY_MAX`]); otherwise the framing stands at a fresh
    /// event and the unit's bytes so far are in `carry`, unread.
    framing: bool,
    carry: Vec<u8>,
    /// The most bytes `carry` holds: [`CARRY_MAX`], or a small bound for
    /// tests whose inputs must pass it.
    carry_max: usize,
    /// The stream's last two bytes so far: a sync point may span chunks.
    tail: [u8; 2],
}

impl EventStream {
    pub(crate) fn new() -> EventStream {
        EventStream::carrying_at_most(NEW_CARRY_MAX)
    }

    /// A stream whose unit in progress is carried unread up to `carry_max`
    /// bytes.
    fn carrying_at_most(carry_max: usize) -> EventStream {
        EventStream {
            bom_matched: 0,
            bom_done: false,
            line: Line::Start,
            after_cr: false,
            field: [0; 5],
            field_len: 0,
            data: Vec::new(),
            has_data: false,
            oversized: false,
            name: [0; NAME_MAX],
            name_len: 0,
            style: None,
            framing: true,
            carry: Vec::new(),
            carry_max,
            tail: [0; 2],
        }
    }

    /// Reads `chunk`, calling `on_event` for each event it completes (the
    /// tests' reference for [`EventStream::feed_skipping`]).
    #[cfg(test)]
    pub(crate) fn feed(&mut self, chunk: &[u8], on_event: &mut impl FnMut(Event<'_>)) {
        let rest = self.skip_bom(chunk, on_event);
        self.read(rest, on_event);
    }

    /// `EventStream::feed` (the tests' reference) that frames only the
    /// units (the bytes between two sync points) in which `wanted` occurs: the events `on_event`
    /// sees include every one `EventStream::feed` would give whose data
    /// contains `wanted`, in order, each by the end of the call that read
    /// its unit's end (in a unit longer than [`CARRY_MAX`], by the end of
    /// the call that read the event's end). What is seen by the end of a
    /// call depends only on the bytes fed so far, not on how they were
    /// split. In a stream of small events nearly every byte is looked at
    /// once, by the search for `wanted`.
    pub(crate) fn feed_skipping(
        &mut self,
        chunk: &[u8],
        on_event: &mut impl FnMut(Event<'_>),
        wanted: &memmem::Finder<'_>,
    ) {
        let tail = self.tail;
        self.tail = preceding(tail, chunk, chunk.len());
        let mut rest = self.skip_bom(chunk, on_event);
        if self.style.is_none() {
            rest = self.read_until_style(rest, on_event);
        }
        let Some(style) = self.style else {
            return;
        };
        let mut at = chunk.len() - rest.len();
        // The unit in progress, to its end.
        let end = style.first_end(preceding(tail, chunk, at), rest);
        match (end, self.framing) {
            (None, true) => return self.read(rest, on_event),
            (None, false) => return self.carry_on(rest, on_event),
            (Some(end), true) => {
                self.read(&rest[..end], on_event);
                self.framing = false;
            }
            (Some(end), false) => self.end_unit(&rest[..end], on_event, wanted),
        }
        debug_assert!(self.is_fresh(), "a sync point leaves a fresh event");
        at += end.unwrap_or_default();
        rest = &rest[end.unwrap_or_default()..];
        // Whole units, then the one the chunk ends inside.
        let before = preceding(tail, chunk, at);
        let last = style.last_end(before, rest).unwrap_or_default();
        self.read_wanted(style, &rest[..last], before, on_event, wanted);
        self.carry_on(&rest[last..], on_event);
    }

    /// `rest` read line by line until the stream's first blank line tells
    /// its style; what is left of it.
    fn read_until_style<'c>(
        &mut self,
        mut rest: &'c [u8],
        on_event: &mut impl FnMut(Event<'_>),
    ) -> &'c [u8] {
        while self.style.is_none() && !rest.is_empty() {
            let line = memchr::memchr2(b'\n', b'\r', rest).map_or(rest.len(), |end| end + 1);
            self.read(&rest[..line], on_event);
            rest = &rest[line..];
        }
        rest
    }

    /// The framing stands at a fresh event, nothing of it read.
    fn is_fresh(&self) -> bool {
        self.line == Line::Start && !self.after_cr && !self.has_data && self.name_len == 0
    }

    /// More of the unit in progress, not its end: kept unread up to
    /// [`CARRY_MAX`] bytes, framed from there on.
    fn carry_on(&mut self, bytes: &[u8], on_event: &mut impl FnMut(Event<'_>)) {
        if self.framing {
            return self.read(bytes, on_event);
        }
        let room = self.carry_max - self.carry.len();
        if bytes.len() <= room {
            self.carry.extend_from_slice(bytes);
            return;
        }
        self.carry.extend_from_slice(&bytes[..room]);
        self.read_carry(on_event);
        self.framing = true;
        self.read(&bytes[room..], on_event);
    }

    /// The carried bytes read by the framing, and let go.
    fn read_carry(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        let carry = std::mem::take(&mut self.carry);
        self.read(&carry, on_event);
        self.carry = carry;
        self.carry.clear();
    }

    /// The carried unit's last bytes (through its sync point): the unit is
    /// framed if `wanted` is in it, else let go unread.
    fn end_unit(
        &mut self,
        bytes: &[u8],
        on_event: &mut impl FnMut(Event<'_>),
        wanted: &memmem::Finder<'_>,
    ) {
        if self.carry.len() + bytes.len() > self.carry_max {
            // Framed from the bound on, to its end.
            self.carry_on(bytes, on_event);
            self.framing = false;
            return;
        }
        if self.carry.is_empty() {
            // The unit began in this chunk: no copy.
            if wanted.find(bytes).is_some() {
                self.read(bytes, on_event);
            }
            return;
        }
        self.carry.extend_from_slice(bytes);
        if wanted.find(&self.carry).is_some() {
            self.read_carry(on_event);
        }
        self.carry.clear();
    }

    /// Whole units (`bytes` starts and ends at sync points, `before` the
    /// two bytes before it): each one `wanted` occurs in is framed from a
    /// fresh event, the others are passed over.
    fn read_wanted(
        &mut self,
        style: Style,
        bytes: &[u8],
        before: [u8; 2],
        on_event: &mut impl FnMut(Event<'_>),
        wanted: &memmem::Finder<'_>,
    ) {
        let mut from = 0;
        while let Some(hit) = wanted.find(&bytes[from..]).map(|hit| from + hit) {
            let start = style
                .last_end(preceding(before, bytes, from), &bytes[from..hit])
                .map_or(from, |end| from + end);
            let end = style
                .first_end(preceding(before, bytes, hit), &bytes[hit..])
                .map_or(bytes.len(), |end| hit + end);
            self.read(&bytes[start..end], on_event);
            debug_assert!(self.is_fresh(), "a unit ends at a sync point");
            from = end;
        }
    }

    fn read(&mut self, chunk: &[u8], on_event: &mut impl FnMut(Event<'_>)) {
        let mut rest = chunk;
        while let Some((&byte, after)) = rest.split_first() {
            // The line nearly every line of a stream is: `data: ` read at
            // once, as the bytes one by one would read it.
            if self.line == Line::Start && rest.starts_with(b"data: ") {
                self.after_cr = false;
                self.begin_value(Field::Data);
                self.line = Line::Value(Field::Data);
                rest = &rest[6..];
                continue;
            }
            if matches!(self.line, Line::Comment | Line::Value(_)) && !is_line_end(byte) {
                // A run of the line at once: to its end, or the chunk's.
                let run = memchr::memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
                self.value_run(&rest[..run]);
                self.after_cr = false;
                rest = &rest[run..];
                continue;
            }
            self.byte(byte, on_event);
            rest = after;
        }
    }

    /// The end of the stream: an unterminated last line ends here, and an
    /// event without its blank line is still dispatched (a unit still
    /// carried is framed first).
    pub(crate) fn finish(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        if !self.carry.is_empty() {
            self.read_carry(on_event);
        }
        if !self.bom_done {
            self.bom_done = true;
            let matched = BOM.get(..self.bom_matched).unwrap_or_default();
            for &byte in matched {
                self.byte(byte, on_event);
            }
        }
        if self.line != Line::Start {
            self.end_line(on_event);
        }
        self.dispatch(on_event);
    }

    /// `chunk` past the BOM's bytes, while the stream's start may be one.
    /// Bytes that turn out not to be the BOM are read as the stream's.
    fn skip_bom<'c>(&mut self, chunk: &'c [u8], on_event: &mut impl FnMut(Event<'_>)) -> &'c [u8] {
        let mut rest = chunk;
        while !self.bom_done {
            let Some((&byte, after)) = rest.split_first() else {
                break;
            };
            if BOM.get(self.bom_matched) == Some(&byte) {
                self.bom_matched += 1;
                self.bom_done = self.bom_matched == BOM.len();
                rest = after;
                continue;
            }
            self.bom_done = true;
            let matched = BOM.get(..self.bom_matched).unwrap_or_default();
            for &byte in matched {
                self.byte(byte, on_event);
            }
        }
        rest
    }

    fn byte(&mut self, byte: u8, on_event: &mut impl FnMut(Event<'_>)) {
        let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
        match byte {
            // The LF of a CRLF: the CR ended the line.
            b'\n' if after_cr => {}
            b'\n' | b'\r' => {
                if self.line == Line::Start && self.style.is_none() {
                    self.style = Some(if byte == b'\n' {
                        Style::Lf
                    } else {
                        Style::CrLf
                    });
                }
                self.end_line(on_event)
            }
            _ => self.line_byte(byte),
        }
    }

    /// A byte of the current line, not a line end.
    fn line_byte(&mut self, byte: u8) {
        match self.line {
            Line::Start if byte == b':' => self.line = Line::Comment,
            Line::Start => {
                self.field_len = 0;
                self.push_field(byte);
                self.line = Line::Name;
            }
            Line::Name if byte == b':' => {
                let field = self.field();
                self.begin_value(field);
                self.line = Line::ValueFirst(field);
            }
            Line::Name => self.push_field(byte),
            Line::ValueFirst(field) => {
                self.line = Line::Value(field);
                if byte != b' ' {
                    self.value_run(&[byte]);
                }
            }
            Line::Comment | Line::Value(_) => self.value_run(&[byte]),
        }
    }

    /// Bytes of the current line's value (or comment), no line end among
    /// them.
    fn value_run(&mut self, run: &[u8]) {
        match self.line {
            Line::Value(Field::Data) => self.push_data(run),
            Line::Value(Field::Event) => {
                for &byte in run {
                    if let Some(slot) = self.name.get_mut(self.name_len) {
                        *slot = byte;
                    }
                    self.name_len = self.name_len.saturating_add(1);
                }
            }
            _ => {}
        }
    }

    fn end_line(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        match self.line {
            Line::Start => self.dispatch(on_event),
            // A field without a colon: the whole line is its name, its value
            // empty.
            Line::Name => {
                let field = self.field();
                self.begin_value(field);
            }
            Line::Comment | Line::ValueFirst(_) | Line::Value(_) => {}
        }
        self.line = Line::Start;
    }

    fn push_field(&mut self, byte: u8) {
        if let Some(slot) = self.field.get_mut(self.field_len) {
            *slot = byte;
        }
        self.field_len = self.field_len.saturating_add(1);
    }

    fn field(&self) -> Field {
        match self.field.get(..self.field_len) {
            Some(b"data") => Field::Data,
            Some(b"event") => Field::Event,
            _ => Field::Other,
        }
    }

    /// A `data` line adds a line to the data; an `event` line replaces the
    /// name.
    fn begin_value(&mut self, field: Field) {
        match field {
            Field::Data => {
                if self.has_data {
                    self.push_data(b"\n");
                }
                self.has_data = true;
            }
            Field::Event => self.name_len = 0,
            Field::Other => {}
        }
    }

    fn push_data(&mut self, bytes: &[u8]) {
        if self.oversized {
            return;
        }
        if self.data.len().saturating_add(bytes.len()) > DATA_MAX {
            self.oversized = true;
            self.data.clear();
            return;
        }
        self.data.extend_from_slice(bytes);
    }

    /// The blank line: the event, if it has data and was not too long, and
    /// a fresh one after it.
    fn dispatch(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        if self.has_data && !self.oversized {
            let name = self.name.get(..self.name_len).unwrap_or_default();
            on_event(Event {
                name,
                data: &self.data,
            });
        }
        self.data.clear();
        self.has_data = false;
        self.oversized = false;
        self.name_len = 0;
    }
}

fn is_line_end(byte: u8) -> bool {
    byte == b'\n' || byte == b'\r'
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use proptest::strategy::Strategy;

    use super::*;

    fn events(input: &[u8]) -> Vec<(String, String)> {
        let mut stream = EventStream::new();
        let mut found = Vec::new();
        let mut on_event = |event: Event<'_>| {
            found.push((
                String::from_utf8_lossy(event.name).into_owned(),
                String::from_utf8_lossy(event.data).into_owned(),
            ));
        };
        stream.feed(input, &mut on_event);
        stream.finish(&mut on_event);
        found
    }

    fn event(name: &str, data: &str) -> (String, String) {
        (name.to_owned(), data.to_owned())
    }

    #[test]
    fn names_data_and_dispatch() {
        assert_eq!(
            events(b"event: a\nevent: b\ndata: 1\ndata:2\n\ndata\n\n: c\n\nid: 5\n\nevent: x\n\ndata: 3"),
            vec![event("b", "1\n2"), event("", ""), event("", "3")]
        );
        let long = format!("event: {}\ndata: 1\n\n", "n".repeat(NAME_MAX + 1));
        assert_eq!(events(long.as_bytes()), vec![event("", "1")]);
    }

    #[test]
    fn a_partial_bom_is_read_as_data() {
        assert_eq!(events(b"\xef\xbbdata: 1\n\n"), vec![]);
        assert_eq!(events(b"\xef\xbb"), vec![]);
        assert_eq!(events(b"\xef\xbb\xbfdata: 1"), vec![event("", "1")]);
    }

    static X: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| memmem::Finder::new("x"));

    type Seen = Vec<(String, String)>;

    /// The carry bound of the tests whose inputs are short: 64 bytes.
    const SHORT: usize = 64;

    /// The events whose data has an `x`, of `input` split at `cuts` and
    /// read skipping what has none (carrying at most `carry_max` bytes):
    /// those seen by the end of the last feed, and by the end of the
    /// stream.
    fn skipping(input: &[u8], cuts: &[usize], carry_max: usize) -> (Seen, Seen) {
        let mut stream = EventStream::carrying_at_most(carry_max);
        let found = std::cell::RefCell::new(Vec::new());
        let mut on_event = |event: Event<'_>| {
            if event.data.contains(&b'x') {
                found.borrow_mut().push((
                    String::from_utf8_lossy(event.name).into_owned(),
                    String::from_utf8_lossy(event.data).into_owned(),
                ));
            }
        };
        let mut at = 0;
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        points.sort_unstable();
        for point in points.into_iter().chain([input.len()]) {
            stream.feed_skipping(&input[at..point.max(at)], &mut on_event, &X);
            assert!(stream.carry.len() <= carry_max, "carried past the bound");
            at = point.max(at);
        }
        let fed = found.borrow().clone();
        stream.finish(&mut on_event);
        (fed, found.take())
    }

    proptest::proptest! {
        #[test]
        fn skipping_gives_the_events_that_matter_in_any_split(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just("data: a\n".to_owned()),
                    proptest::strategy::Just("data: x\n".to_owned()),
                    proptest::strategy::Just("event: x\r\n".to_owned()),
                    proptest::strategy::Just("\n".to_owned()),
                    proptest::strategy::Just("\r".to_owned()),
                    proptest::strategy::Just("\r\n".to_owned()),
                    proptest::strategy::Just("\n\n".to_owned()),
                    proptest::strategy::Just("\r\n\r\n".to_owned()),
                    proptest::strategy::Just(": c\n".to_owned()),
                    proptest::strategy::Just("data:yx".to_owned()),
                    // Longer than SHORT with its neighbours.
                    proptest::strategy::Just(format!("data: {}\n", "a".repeat(40))),
                    proptest::strategy::Just(format!(": {}x\r\n", "c".repeat(40))),
                    proptest::strategy::Just("\u{feff}".to_owned()),
                ],
                0..40,
            ),
            cuts in proptest::collection::vec(0usize..600, 0..8),
        ) {
            let input = parts.concat();
            let mattering: Seen = events(input.as_bytes())
                .into_iter()
                .filter(|(_, data)| data.contains('x'))
                .collect();
            let (whole_fed, whole) = skipping(input.as_bytes(), &[], SHORT);
            let (split_fed, split) = skipping(input.as_bytes(), &cuts, SHORT);
            proptest::prop_assert_eq!(&whole, &mattering);
            proptest::prop_assert_eq!(&split, &mattering);
            proptest::prop_assert_eq!(split_fed, whole_fed);
        }

        /// The same at the production bound, [`CARRY_MAX`]: units of a few
        /// KiB, some past it, some not.
        #[test]
        fn skipping_at_the_production_bound_gives_the_events_that_matter(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::strategy::Just("data: x\n".to_owned()),
                    proptest::strategy::Just("\n\n".to_owned()),
                    proptest::strategy::Just("\r\n\r\n".to_owned()),
                    (1usize..9000).prop_map(|n| format!("data: {}\n", "a".repeat(n))),
                    (1usize..9000).prop_map(|n| format!(": {}x\r\n", "c".repeat(n))),
                ],
                0..24,
            ),
            cuts in proptest::collection::vec(0usize..120_000, 0..12),
        ) {
            let input = parts.concat();
            let mattering: Seen = events(input.as_bytes())
                .into_iter()
                .filter(|(_, data)| data.contains('x'))
                .collect();
            let (whole_fed, whole) = skipping(input.as_bytes(), &[], CARRY_MAX);
            let (split_fed, split) = skipping(input.as_bytes(), &cuts, CARRY_MAX);
            proptest::prop_assert_eq!(&whole, &mattering);
            proptest::prop_assert_eq!(&split, &mattering);
            proptest::prop_assert_eq!(split_fed, whole_fed);
        }
    }

    /// The gateway's streams ([`EventStream::new`]) carry at most
    /// [`CARRY_MAX`] bytes unread: a unit without the wanted string, fed in
    /// 1 KiB pieces past the bound, is framed from there on; one that
    /// ends just within it is carried whole and passed over; both ways
    /// the event after it with the wanted string is seen.
    #[test]
    fn the_gateways_streams_carry_at_most_the_production_bound() {
        for unit in [CARRY_MAX - 16, CARRY_MAX, CARRY_MAX + 1, 4 * CARRY_MAX] {
            let mut stream = EventStream::new();
            let mut seen = Vec::new();
            let mut on_event = |event: Event<'_>| {
                if event.data.contains(&b'x') {
                    seen.push(event.data.to_vec());
                }
            };
            // Framed up to the first sync point after the first blank line.
            stream.feed_skipping(b"data: 1\n\ndata: 2\n\n", &mut on_event, &X);
            assert!(!stream.framing);
            // A comment line `unit` bytes long with its blank line.
            let mut input = vec![b':'; unit - 2];
            input.extend_from_slice(b"\n\n");
            let (mut most, mut framed) = (0, false);
            for piece in input.chunks(1024) {
                stream.feed_skipping(piece, &mut on_event, &X);
                most = most.max(stream.carry.len());
                framed |= stream.framing;
            }
            assert!(most <= CARRY_MAX, "{unit}: carried {most} bytes");
            // Framed past the bound only (a unit that passes it in the
            // piece that ends it is framed and done within one call).
            if unit <= CARRY_MAX || unit > CARRY_MAX + 1024 {
                assert_eq!(
                    framed,
                    unit > CARRY_MAX,
                    "{unit}: framed past the bound only"
                );
            }
            stream.feed_skipping(b"data: x\n\n", &mut on_event, &X);
            assert_eq!(seen, vec![b"x".to_vec()], "{unit}");
        }
    }

    #[test]
    fn a_long_event_is_never_held() {
        let mut stream = EventStream::new();
        let mut count = 0;
        let mut on_event = |_: Event<'_>| count += 1;
        stream.feed(b"data: ", &mut on_event);
        let piece = vec![b'x'; 1000];
        for _ in 0..(4 * DATA_MAX / piece.len()) {
            stream.feed(&piece, &mut on_event);
            assert!(stream.data.capacity() <= 2 * DATA_MAX);
        }
        stream.feed(b"\n\ndata: y\n\n", &mut on_event);
        assert_eq!(count, 1, "only the short event");
    }
}
