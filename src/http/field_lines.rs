//! Header fields of a response that are not in its header map, kept as the
//! lines they will be on the wire (`name: value\r\n`) until the head is
//! written: the fields relayed from an upstream's response, and the
//! gateway's own rate-limit fields.
//!
//! Both used to go through the response's `HeaderMap`: the upstream's
//! parsed into one, the gateway's inserted into it, and the whole map
//! written back out — a name hash, a table probe and a value per field, for
//! fields nobody reads in between. The HTTP/1.1 fast path (`http1::server`)
//! copies these lines into the head as they are. Where a map is needed
//! (hyper's path), [`FieldLines::apply`] builds it.
//!
//! Relayed names are lower-cased as they are copied (as a header map would
//! have written them); relayed values are the upstream's bytes, already
//! checked by the parser. The gateway's own lines are its constants, numbers
//! and structured fields it serialized, so nothing here needs escaping. Their
//! names are [`OwnName`]s and fixed lines [`OwnLines`], both checked at
//! compile time, so a push copies constants.
//!
//! The lines also say whether the response is a rate-limit denial
//! ([`FieldLines::mark_rate_denial`]): they are what the HTTP/1.1 server
//! gets beside the response, and it lets a denied connection step aside.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::structured::ListWriter;

/// Fields to add to a response head: the relayed ones, then the gateway's.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FieldLines {
    /// Lines relayed from an upstream.
    relayed: Vec<u8>,
    /// The gateway's own lines (ASCII).
    own: String,
    /// Bit `len % 64` set for each name in `relayed` / `own`: whether an
    /// own field could replace a relayed one is then one AND, usually 0.
    relayed_lengths: u64,
    own_lengths: u64,
    /// A relayed `Date`: the head needs none of its own.
    relayed_date: bool,
    /// The response refuses the request for its rate ([`FieldLines::mark_rate_denial`]).
    rate_denial: bool,
}

/// Hands a request's header map, emptied, to its response when the
/// response's own map is empty (the gateway's responses carry their fields
/// as [`FieldLines`]). The HTTP/1.1 server reuses a response's map for the
/// connection's next request, so the request's allocation is kept rather
/// than freed here and made again for the next request (~300 instructions).
pub(crate) fn recycle_map(request: &mut HeaderMap, response: &mut HeaderMap) {
    if response.is_empty() {
        request.clear();
        std::mem::swap(request, response);
    }
}

/// Appends `bytes` lower-cased (ASCII), eight at a time and the rest one
/// by one: a byte loop cost nine instructions a byte, and every relayed
/// field name goes through here. (The rest is not padded into a word:
/// copying a variable-length piece is a `memcpy` call.)
fn extend_lowercase(out: &mut Vec<u8>, bytes: &[u8]) {
    out.reserve(bytes.len());
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        out.extend_from_slice(&lowercase_word(u64::from_le_bytes(word)).to_le_bytes());
    }
    for &b in chunks.remainder() {
        out.push(b.to_ascii_lowercase());
    }
}

/// `to_ascii_lowercase` of each byte of `word`: a byte gets bit 5 set when
/// it is `A`..=`Z`, found by adding to each 7-bit value so that bit 7
/// flips at `A` and at `[` (no carry crosses a byte).
fn lowercase_word(word: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let low = word & LOW7;
    let from_a = low + 0x3f3f_3f3f_3f3f_3f3f;
    let past_z = low + 0x2525_2525_2525_2525;
    let upper = from_a & !past_z & !word & HIGH;
    word | (upper >> 2)
}

const fn length_bit(name: &[u8]) -> u64 {
    1 << (name.len() % 64)
}

/// A byte of an own field name: lowercase letters, digits and `-` (the
/// names the gateway sets; a header map would have lower-cased them).
const fn is_own_name_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

/// Room for own lines taken at the first reservation: a denial's whole set
/// (its fixed lines, its numbers and a `RateLimit` item per limit), so the
/// buffer is allocated once.
pub(crate) const OWN_ROOM: usize = 384;

/// A field name of the gateway's own, lowercase, as the start of its line
/// (`name: `), with its [`length_bit`]: made at compile time
/// ([`OwnName::new`]), so a push copies a constant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnName {
    start: &'static str,
    length_bit: u64,
}

/// The [`OwnName`] of a lowercase token, checked at compile time:
/// `own_name!("ratelimit")`.
macro_rules! own_name {
    ($name:literal) => {
        $crate::http::field_lines::OwnName::new($name, concat!($name, ": "))
    };
}
pub(crate) use own_name;

impl OwnName {
    /// Use [`own_name!`]: `start` is `name` followed by `: ` (joined by the
    /// macro: a `const fn` cannot join strings); `name` must be a lowercase
    /// token (a compile-time error otherwise).
    pub(crate) const fn new(name: &'static str, start: &'static str) -> OwnName {
        let (name_bytes, start_bytes) = (name.as_bytes(), start.as_bytes());
        assert!(start_bytes.len() == name_bytes.len() + 2);
        let mut i = 0;
        while i < name_bytes.len() {
            let b = name_bytes[i];
            assert!(b == start_bytes[i], "start is not name followed by ': '");
            assert!(
                is_own_name_byte(b),
                "an own field name is a lowercase token"
            );
            i += 1;
        }
        assert!(start_bytes[i] == b':' && start_bytes[i + 1] == b' ');
        OwnName {
            start,
            length_bit: length_bit(name_bytes),
        }
    }

    /// The name itself.
    #[cfg(test)]
    pub(crate) fn as_str(&self) -> &'static str {
        let (name, _) = self.start.split_at(self.start.len() - 2);
        name
    }
}

/// Whole lines of the gateway's own (`name: value\r\n`…), fixed at compile
/// time, with their names' [`length_bit`]s.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OwnLines {
    text: &'static str,
    length_bits: u64,
}

impl OwnLines {
    /// `text` must be CRLF-ended `name: value` lines of lowercase names and
    /// visible-ASCII values (a compile-time error otherwise).
    pub(crate) const fn new(text: &'static str) -> OwnLines {
        let bytes = text.as_bytes();
        assert!(!bytes.is_empty(), "no lines");
        let (mut i, mut length_bits) = (0, 0);
        while i < bytes.len() {
            let start = i;
            while bytes[i] != b':' {
                let b = bytes[i];
                assert!(
                    is_own_name_byte(b),
                    "an own field name is a lowercase token"
                );
                i += 1;
            }
            assert!(i > start, "an empty field name");
            length_bits |= 1 << ((i - start) % 64);
            assert!(bytes[i + 1] == b' ', "': ' after the name");
            i += 2;
            while bytes[i] != b'\r' {
                assert!(
                    bytes[i] >= 0x20 && bytes[i] < 0x7f,
                    "a value is visible ASCII"
                );
                i += 1;
            }
            assert!(bytes[i + 1] == b'\n', "a line ends in CRLF");
            i += 2;
        }
        OwnLines { text, length_bits }
    }
}

impl FieldLines {
    /// No fields, and no allocation until one is added.
    pub(crate) fn new() -> Self {
        FieldLines::default()
    }

    /// Room for `bytes` of relayed lines, allocated once.
    pub(crate) fn with_relayed_capacity(bytes: usize) -> Self {
        FieldLines {
            relayed: Vec::with_capacity(bytes),
            ..FieldLines::default()
        }
    }

    /// Adds a field relayed from an upstream: the name lower-cased, the
    /// value as it came (httparse has checked both).
    pub(crate) fn push_relayed(&mut self, name: &[u8], value: &[u8]) {
        extend_lowercase(&mut self.relayed, name);
        self.relayed.extend_from_slice(b": ");
        self.relayed.extend_from_slice(value);
        self.relayed.extend_from_slice(b"\r\n");
        self.relayed_lengths |= length_bit(name);
        if crate::http::hop_by_hop::is_name(name, b"date") {
            self.relayed_date = true;
        }
    }

    /// Adds `name: value` of the gateway's own. `value` must be a valid field
    /// value (the gateway's own text). Always inlined: `name` is then a
    /// constant, and its line's start a fixed-size copy rather than a
    /// `memcpy` call (a push through a `HeaderName` was ~120 instructions).
    #[inline(always)]
    pub(crate) fn push(&mut self, name: OwnName, value: &str) {
        self.reserve_own(name.start.len() + value.len() + 2);
        self.own_lengths |= name.length_bit;
        self.own.push_str(name.start);
        self.own.push_str(value);
        self.own.push_str("\r\n");
    }

    /// Adds whole lines of the gateway's own, written out at compile time
    /// ([`OwnLines`]): one copy for fields that never change.
    #[inline(always)]
    pub(crate) fn push_lines(&mut self, lines: OwnLines) {
        self.reserve_own(lines.text.len());
        self.own_lengths |= lines.length_bits;
        self.own.push_str(lines.text);
    }

    /// Room for `more` bytes of own lines; the first reservation takes at
    /// least [`OWN_ROOM`].
    #[inline]
    pub(crate) fn reserve_own(&mut self, more: usize) {
        if self.own.capacity() == 0 {
            // Allocated outright: `reserve` on an empty string went through
            // the vector's general growth path first.
            self.own = String::with_capacity(more.max(OWN_ROOM));
        } else {
            self.own.reserve(more);
        }
    }

    /// Adds `name: n`.
    #[inline(always)]
    pub(crate) fn push_number(&mut self, name: OwnName, n: u64) {
        self.push(name, itoa::Buffer::new().format(n));
    }

    /// Adds `name: ` followed by a structured-field List that `write` fills;
    /// a list left empty adds nothing (RFC 9651: omit the field).
    pub(crate) fn push_list(&mut self, name: OwnName, write: impl FnOnce(&mut ListWriter<'_>)) {
        self.reserve_own(name.start.len() + 64);
        let start = self.own.len();
        self.own.push_str(name.start);
        let mut list = ListWriter::new(&mut self.own);
        write(&mut list);
        if list.is_empty() {
            self.own.truncate(start);
        } else {
            self.own.push_str("\r\n");
            self.own_lengths |= name.length_bit;
        }
    }

    /// Marks the lines as those of a rate-limit denial: the HTTP/1.1
    /// server then lets the connection's next request wait its turn behind
    /// the other connections' (`http1::server::serve`), so a flood of
    /// denied requests does not hold up the clients who behave.
    pub(crate) fn mark_rate_denial(&mut self) {
        self.rate_denial = true;
    }

    /// Whether the lines are those of a rate-limit denial.
    pub(crate) fn is_rate_denial(&self) -> bool {
        self.rate_denial
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.relayed.is_empty() && self.own.is_empty()
    }

    /// Appends all lines, relayed first, to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.relayed);
        out.extend_from_slice(self.own.as_bytes());
    }

    /// Whether the lines carry a `Date` (a relayed one).
    pub(crate) fn has_date(&self) -> bool {
        self.relayed_date
    }

    /// The value of the first relayed field called `name` (lower case).
    pub(crate) fn relayed_value(&self, name: &str) -> Option<&[u8]> {
        lines(&self.relayed).find_map(|(n, v)| (n == name.as_bytes()).then_some(v))
    }

    /// Drops relayed fields of a name the gateway sets itself: the
    /// gateway's rate-limit fields replace an upstream's.
    pub(crate) fn drop_replaced(&mut self) {
        if self.relayed_lengths & self.own_lengths == 0 {
            return;
        }
        let own: Vec<&[u8]> = lines(self.own.as_bytes()).map(|(name, _)| name).collect();
        let mut kept = Vec::with_capacity(self.relayed.len());
        let mut date = false;
        for (name, value) in lines(&self.relayed) {
            if own.contains(&name) {
                continue;
            }
            date |= name == b"date";
            kept.extend_from_slice(name);
            kept.extend_from_slice(b": ");
            kept.extend_from_slice(value);
            kept.extend_from_slice(b"\r\n");
        }
        self.relayed = kept;
        self.relayed_date = date;
    }

    /// Puts the fields into `headers`: relayed ones appended (an upstream's
    /// repeated fields stay repeated), the gateway's own each replacing any
    /// field of its name.
    pub(crate) fn apply(&self, headers: &mut HeaderMap) {
        for (name, value) in lines(&self.relayed) {
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                headers.append(name, value);
            }
        }
        for (name, value) in lines(self.own.as_bytes()) {
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                headers.insert(name, value);
            }
        }
    }

    /// The gateway's own fields as (name, value) pairs, in order, without a
    /// header map: for an answer that is not HTTP fields (the decision
    /// service's `response_headers_to_add`). Names are lowercase, as pushed.
    pub(crate) fn own_fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        lines(self.own.as_bytes())
    }

    /// The fields as a header map, for tests.
    #[cfg(test)]
    pub(crate) fn to_map(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        self.apply(&mut map);
        map
    }
}

/// The (name, value) pairs of CRLF-ended `name: value` lines.
fn lines(text: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    text.split(|b| *b == b'\n').filter_map(|line| {
        let line = line.strip_suffix(b"\r")?;
        let colon = line.iter().position(|b| *b == b':')?;
        let value = line[colon + 1..]
            .strip_prefix(b" ")
            .unwrap_or(&line[colon + 1..]);
        Some((&line[..colon], value))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowercasing_matches_the_byte_rule() {
        let all: Vec<u8> = (0..=u8::MAX).collect();
        for len in 0..=all.len() {
            for start in [0, 7, 60, 64, 90, 200] {
                let bytes = &all[start.min(all.len())..(start + len).min(all.len())];
                let mut out = b"x".to_vec();
                extend_lowercase(&mut out, bytes);
                assert_eq!(&out[..1], b"x");
                assert_eq!(out[1..], bytes.to_ascii_lowercase(), "{bytes:?}");
            }
        }
    }

    const RATELIMIT: OwnName = own_name!("ratelimit");
    const REMAINING: OwnName = own_name!("x-ratelimit-remaining");
    const CACHE_CONTROL: OwnName = own_name!("cache-control");

    fn written(lines: &FieldLines) -> Vec<u8> {
        let mut out = Vec::new();
        lines.write_to(&mut out);
        out
    }

    #[test]
    fn lines_are_written_as_on_the_wire_relayed_first() {
        let mut lines = FieldLines::new();
        assert!(lines.is_empty());
        lines.push_number(REMAINING, 42);
        lines.push(CACHE_CONTROL, "no-store");
        lines.push_relayed(b"X-Upstream", b"Yes \xff");
        assert_eq!(
            written(&lines),
            b"x-upstream: Yes \xff\r\nx-ratelimit-remaining: 42\r\ncache-control: no-store\r\n"
        );
        assert!(!lines.has_date());
        lines.push_relayed(b"Date", b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert!(lines.has_date());
        assert_eq!(lines.relayed_value("x-upstream"), Some(&b"Yes \xff"[..]));
        assert_eq!(lines.relayed_value("x-ratelimit-remaining"), None);
    }

    #[test]
    fn an_empty_list_adds_no_line() {
        let mut lines = FieldLines::new();
        lines.push_list(RATELIMIT, |_| {});
        assert!(lines.is_empty());
        lines.push_list(RATELIMIT, |list| {
            let _ = list.item_string("a").and_then(|p| p.param_int("r", 1));
        });
        assert_eq!(written(&lines), b"ratelimit: \"a\";r=1\r\n");
    }

    #[test]
    fn own_fields_replace_relayed_ones_of_their_name() {
        let mut lines = FieldLines::new();
        lines.push_relayed(b"X-RateLimit-Remaining", b"99");
        lines.push_relayed(b"Set-Cookie", b"a=1");
        lines.push_relayed(b"x-ratelimit-remaining", b"98");
        lines.push_relayed(b"Set-Cookie", b"b=2");
        lines.push_number(REMAINING, 7);
        lines.drop_replaced();
        assert_eq!(
            written(&lines),
            b"set-cookie: a=1\r\nset-cookie: b=2\r\nx-ratelimit-remaining: 7\r\n"
        );
        let map = lines.to_map();
        assert_eq!(
            map.get_all("set-cookie").iter().collect::<Vec<_>>(),
            ["a=1", "b=2"]
        );
        assert_eq!(
            map.get_all(REMAINING.as_str()).iter().collect::<Vec<_>>(),
            ["7"]
        );
    }

    #[test]
    fn apply_replaces_a_maps_field_with_an_own_one() {
        let mut lines = FieldLines::new();
        lines.push_number(REMAINING, 7);
        let mut headers = HeaderMap::new();
        headers.insert(REMAINING.as_str(), HeaderValue::from_static("99"));
        headers.insert("x-other", HeaderValue::from_static("kept"));
        lines.apply(&mut headers);
        assert_eq!(
            headers
                .get_all(REMAINING.as_str())
                .iter()
                .collect::<Vec<_>>(),
            ["7"]
        );
        assert_eq!(headers["x-other"], "kept");
    }

    #[test]
    fn fixed_lines_go_in_whole_and_replace_relayed_fields_of_their_names() {
        const FIXED: OwnLines = OwnLines::new("cache-control: no-store\r\nx-a: 1\r\n");
        let mut lines = FieldLines::new();
        lines.push_relayed(b"Cache-Control", b"max-age=60");
        lines.push_relayed(b"X-B", b"2");
        lines.push_lines(FIXED);
        lines.push(REMAINING, "3");
        lines.drop_replaced();
        assert_eq!(
            written(&lines),
            b"x-b: 2\r\ncache-control: no-store\r\nx-a: 1\r\nx-ratelimit-remaining: 3\r\n"
        );
        assert_eq!(REMAINING.as_str(), "x-ratelimit-remaining");
    }
}
