//! The `text/event-stream` framing, as the HTML Living Standard's
//! "Interpreting an event stream" reads it: a leading BOM skipped, lines
//! ending at CR, LF or CRLF, `field: value` lines (one space after the
//! colon dropped), comments (`:`), `data` lines joined with `\n`, the last
//! `event` line naming the event, and a blank line dispatching it. Fed any
//! split of the bytes, it keeps at most [`DATA_MAX`] bytes of an event's
//! data: a longer event is skipped whole, never held.

use memchr::memmem;

/// The most data bytes of one event kept (the `\n`s joining its `data`
/// lines included). The events usage is read from are small; a longer one
/// (a big chunk of text) is skipped.
pub(crate) const DATA_MAX: usize = 64 * 1024;

/// The longest event name kept: longer names read as none (no event the
/// gateway looks for has such a name).
const NAME_MAX: usize = 32;

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// The end of a blank line written `\n\n` (always one: a line end right
/// after another), the first or the last (`find`) in `bytes`. The other
/// spellings (`\r\r`, `\r\n\r\n`) are not looked for: a stream written
/// so is read the slow way, whole.
fn boundary(bytes: &[u8], find: fn(&[u8], &[u8]) -> Option<usize>) -> Option<usize> {
    find(bytes, b"\n\n").map(|at| at + 2)
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
}

impl EventStream {
    pub(crate) fn new() -> EventStream {
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
        }
    }

    /// Reads `chunk`, calling `on_event` for each event it completes (the
    /// tests' reference for [`EventStream::feed_skipping`]).
    #[cfg(test)]
    pub(crate) fn feed(&mut self, chunk: &[u8], on_event: &mut impl FnMut(Event<'_>)) {
        let rest = self.skip_bom(chunk, on_event);
        self.read(rest, on_event);
    }

    /// [`EventStream::feed`] that skips, unread, the whole events of
    /// `chunk` whose bytes `may_matter` says nothing of interest can be in:
    /// the event the chunk starts inside is read to its end, then if the
    /// rest up to its last blank line may not matter, that part is passed
    /// over (its events are dispatched to no one) and the stream resumes
    /// after it as a blank line leaves it; the event the chunk ends inside
    /// is read, so it is whole when it ends in a later chunk. The events
    /// `on_event` sees are those [`EventStream::feed`] would give it for
    /// which `may_matter` holds; in a stream of small events, nearly every
    /// byte is then looked at once by a SIMD search instead of the framing.
    pub(crate) fn feed_skipping(
        &mut self,
        chunk: &[u8],
        on_event: &mut impl FnMut(Event<'_>),
        may_matter: impl Fn(&[u8]) -> bool,
    ) {
        let mut rest = self.skip_bom(chunk, on_event);
        if !self.bom_done {
            return self.read(rest, on_event);
        }
        // The event in progress, to its end.
        let Some(first) = boundary(rest, memmem::find) else {
            return self.read(rest, on_event);
        };
        self.read(&rest[..first], on_event);
        rest = &rest[first..];
        match boundary(rest, memmem::rfind) {
            Some(last) if !may_matter(&rest[..last]) => {
                // Whole events, none of interest: as if read, the stream
                // stands after a blank line.
                self.fresh_event(false);
                self.read(&rest[last..], on_event);
            }
            _ => self.read(rest, on_event),
        }
    }

    /// The stream's state after a blank line (whose last byte was a CR, or
    /// not): a new event, nothing of it read.
    fn fresh_event(&mut self, after_cr: bool) {
        self.line = Line::Start;
        self.after_cr = after_cr;
        self.field_len = 0;
        self.data.clear();
        self.has_data = false;
        self.oversized = false;
        self.name_len = 0;
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
    /// event without its blank line is still dispatched.
    pub(crate) fn finish(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
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
            b'\n' | b'\r' => self.end_line(on_event),
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

    /// The events of `input` split at `cuts`, read skipping what does not
    /// name `x`.
    fn skipping(input: &[u8], cuts: &[usize]) -> Vec<(String, String)> {
        let mut stream = EventStream::new();
        let mut found = Vec::new();
        let mut on_event = |event: Event<'_>| {
            found.push((
                String::from_utf8_lossy(event.name).into_owned(),
                String::from_utf8_lossy(event.data).into_owned(),
            ));
        };
        let mut at = 0;
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (input.len() + 1)).collect();
        points.sort_unstable();
        for point in points.into_iter().chain([input.len()]) {
            stream.feed_skipping(&input[at..point.max(at)], &mut on_event, |b| {
                b.contains(&b'x')
            });
            at = point.max(at);
        }
        stream.finish(&mut on_event);
        found
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
                    proptest::strategy::Just(": c\n".to_owned()),
                    proptest::strategy::Just("data:yx".to_owned()),
                    proptest::strategy::Just("\u{feff}".to_owned()),
                ],
                0..40,
            ),
            cuts in proptest::collection::vec(0usize..400, 0..6),
        ) {
            let input = parts.concat();
            let mattering: Vec<(String, String)> = events(input.as_bytes())
                .into_iter()
                .filter(|(name, data)| name.contains('x') || data.contains('x'))
                .collect();
            let skipped: Vec<(String, String)> = skipping(input.as_bytes(), &cuts)
                .into_iter()
                .filter(|(name, data)| name.contains('x') || data.contains('x'))
                .collect();
            proptest::prop_assert_eq!(skipped, mattering);
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
