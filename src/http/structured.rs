//! A small RFC 9651 (Structured Field Values) serializer: just what the
//! `RateLimit` and `RateLimit-Policy` fields (contract §3,
//! draft-ietf-httpapi-ratelimit-headers-10) need.
//!
//! This module owns the *syntax* of those fields; which numbers go into them
//! is the limiter's business. It writes Lists whose members are Items with a
//! String, Integer or Token bare item, each followed by Parameters whose values
//! are Integers, Strings, Tokens or Booleans (the module's tests run this):
//!
//! ```text
//! let mut field = String::new();
//! let mut list = ListWriter::new(&mut field);
//! list.item_string("per_key")?.param_int("q", 20)?.param_int("w", 2)?;
//! list.item_string("per_ip")?.param_int("q", 100)?.param_int("w", 60)?;
//! assert_eq!(field, r#""per_key";q=20;w=2, "per_ip";q=100;w=60"#);
//! ```
//!
//! # Why a writer into a caller-owned buffer
//!
//! These fields go on every response, allowed or denied, so the writer
//! appends to a `String` the caller owns and reuses: no allocation per item
//! or parameter (integers are formatted through `core::fmt` straight into the
//! buffer), only the buffer's own growth.
//!
//! # Failure instead of repair
//!
//! RFC 9651 §4.1 says serialization *fails* for a String with a character
//! outside %x20–7E, an Integer beyond ±999,999,999,999,999, a Token or key
//! that breaks its grammar. We fail too ([`SfError`]) rather than replace or
//! drop characters: a limit name is an identifier clients match on, and a
//! silently altered name would be a different policy. Config validation
//! restricts limit names, so these errors are bugs, not traffic; the caller
//! should drop the field (and log) rather than send a half-written one.
//!
//! Every call checks its input *before* writing, so a failed call leaves the
//! buffer as it was; earlier successful calls stay written.

/// Largest magnitude of an sf-integer (RFC 9651 §3.3.1: at most 15 digits).
pub(crate) const MAX_INTEGER: i64 = 999_999_999_999_999;

/// Why a value cannot be serialized as a Structured Field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SfError {
    /// An sf-string may only hold printable ASCII (%x20–7E).
    #[error("structured-field string has a non-printable or non-ASCII byte at offset {offset}")]
    StringNotPrintable {
        /// Byte offset of the first offending character.
        offset: usize,
    },
    /// An sf-integer has at most 15 decimal digits.
    #[error("structured-field integer {0} is outside ±999,999,999,999,999")]
    IntegerOutOfRange(i64),
    /// An sf-token starts with ALPHA or `*` and continues with tchar, `:`
    /// or `/`.
    #[cfg(test)]
    #[error("not a structured-field token")]
    InvalidToken,
    /// A key starts with a lowercase letter or `*` and continues with
    /// lowercase letters, digits, `_`, `-`, `.` or `*`.
    #[error("not a structured-field key")]
    InvalidKey,
}

/// Checks an sf-string (RFC 9651 §4.1.6, step 2).
pub(crate) fn check_string(value: &str) -> Result<(), SfError> {
    match value.bytes().position(|b| !(0x20..=0x7e).contains(&b)) {
        Some(offset) => Err(SfError::StringNotPrintable { offset }),
        None => Ok(()),
    }
}

/// Checks an sf-integer (RFC 9651 §4.1.4, step 1).
fn check_integer(value: i64) -> Result<(), SfError> {
    if (-MAX_INTEGER..=MAX_INTEGER).contains(&value) {
        Ok(())
    } else {
        Err(SfError::IntegerOutOfRange(value))
    }
}

/// RFC 9110 tchar. A table: the list of symbols as a slice was a `memchr`
/// call per byte, and a proxied request checks every byte of its `Host`.
#[inline]
pub(crate) fn is_tchar(b: u8) -> bool {
    TCHAR[usize::from(b)]
}

/// The bytes of [`is_tchar`].
static TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

/// Checks an sf-token (RFC 9651 §3.3.4).
#[cfg(test)]
fn check_token(value: &str) -> Result<(), SfError> {
    match value.as_bytes() {
        [first, rest @ ..]
            if (first.is_ascii_alphabetic() || *first == b'*')
                && rest.iter().all(|&b| is_tchar(b) || b == b':' || b == b'/') =>
        {
            Ok(())
        }
        _ => Err(SfError::InvalidToken),
    }
}

/// Checks a key (RFC 9651 §3.1.2). Inlined: keys are literals, so the
/// check folds away.
#[inline(always)]
fn check_key(key: &str) -> Result<(), SfError> {
    let ok_rest = |b: u8| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-' | b'.' | b'*')
    };
    match key.as_bytes() {
        [first, rest @ ..]
            if (first.is_ascii_lowercase() || *first == b'*')
                && rest.iter().all(|&b| ok_rest(b)) =>
        {
            Ok(())
        }
        _ => Err(SfError::InvalidKey),
    }
}

/// Appends `value` as an sf-string: quoted, with `"` and `\` escaped.
#[cfg(test)]
pub(crate) fn write_string(buf: &mut String, value: &str) -> Result<(), SfError> {
    check_string(value)?;
    push_string(buf, value);
    Ok(())
}

/// The escaping half of `write_string`, for callers that already checked.
fn push_string(buf: &mut String, value: &str) {
    debug_assert_eq!(check_string(value), Ok(()));
    buf.reserve(value.len() + 2);
    buf.push('"');
    // Names rarely need escaping: then the text goes in whole (a per-char
    // push was most of a RateLimit field's cost).
    if !value.bytes().any(|b| b == b'"' || b == b'\\') {
        buf.push_str(value);
    } else {
        for c in value.chars() {
            if c == '"' || c == '\\' {
                buf.push('\\');
            }
            buf.push(c);
        }
    }
    buf.push('"');
}

/// Appends `value` as an sf-integer.
#[cfg(test)]
pub(crate) fn write_integer(buf: &mut String, value: i64) -> Result<(), SfError> {
    check_integer(value)?;
    push_integer(buf, value);
    Ok(())
}

/// The formatting half of `write_integer`, for callers that already checked.
fn push_integer(buf: &mut String, value: i64) {
    debug_assert_eq!(check_integer(value), Ok(()));
    // itoa: this runs for every limit of every response, and `fmt` costs
    // several times as much.
    buf.push_str(itoa::Buffer::new().format(value));
}

/// Appends `value` as an sf-token (written as is, after checking it).
#[cfg(test)]
pub(crate) fn write_token(buf: &mut String, value: &str) -> Result<(), SfError> {
    check_token(value)?;
    buf.push_str(value);
    Ok(())
}

/// Appends a List (RFC 9651 §3.1) to a caller-owned buffer, one member at a
/// time. Members are separated by `, ` as §4.1.1 prescribes. Anything already
/// in the buffer is kept and treated as outside the list (the first member
/// gets no separator).
#[derive(Debug)]
pub(crate) struct ListWriter<'b> {
    buf: &'b mut String,
    members: usize,
}

impl<'b> ListWriter<'b> {
    /// Starts an empty list at the end of `buf`.
    pub(crate) fn new(buf: &'b mut String) -> Self {
        ListWriter { buf, members: 0 }
    }

    /// How many members have been written.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.members
    }

    /// Whether no member has been written (an empty List is serialized as
    /// nothing, and RFC 9651 says to omit the field then).
    pub(crate) fn is_empty(&self) -> bool {
        self.members == 0
    }

    fn separator(&mut self) {
        if self.members > 0 {
            self.buf.push_str(", ");
        }
        self.members += 1;
    }

    /// Appends an Item whose bare item is an sf-string; chain parameters on
    /// the returned [`Params`].
    pub(crate) fn item_string(&mut self, value: &str) -> Result<Params<'_>, SfError> {
        check_string(value)?;
        self.separator();
        push_string(self.buf, value);
        Ok(Params { buf: self.buf })
    }

    /// Appends an Item whose bare item is an sf-integer.
    #[cfg(test)]
    pub(crate) fn item_int(&mut self, value: i64) -> Result<Params<'_>, SfError> {
        check_integer(value)?;
        self.separator();
        push_integer(self.buf, value);
        Ok(Params { buf: self.buf })
    }

    /// Appends an Item whose bare item is an sf-token.
    #[cfg(test)]
    pub(crate) fn item_token(&mut self, value: &str) -> Result<Params<'_>, SfError> {
        check_token(value)?;
        self.separator();
        self.buf.push_str(value);
        Ok(Params { buf: self.buf })
    }
}

/// The Parameters of the member just written. Taken and returned by value so
/// calls chain with `?`; parameters can only follow an item, by construction.
#[derive(Debug)]
pub(crate) struct Params<'b> {
    buf: &'b mut String,
}

impl<'b> Params<'b> {
    #[inline(always)]
    fn key(&mut self, key: &str) {
        self.buf.push(';');
        self.buf.push_str(key);
    }

    /// Appends `;key=value` with an sf-integer value. Inlined, with the
    /// key's check: keys are literals, so `;r=` is a fixed-size copy.
    #[inline(always)]
    pub(crate) fn param_int(mut self, key: &str, value: i64) -> Result<Self, SfError> {
        check_key(key)?;
        check_integer(value)?;
        self.key(key);
        self.buf.push('=');
        push_integer(self.buf, value);
        Ok(self)
    }

    /// Appends `;key="value"` with an sf-string value.
    pub(crate) fn param_string(mut self, key: &str, value: &str) -> Result<Self, SfError> {
        check_key(key)?;
        check_string(value)?;
        self.key(key);
        self.buf.push('=');
        push_string(self.buf, value);
        Ok(self)
    }

    /// Appends `;key=value` with an sf-token value.
    #[cfg(test)]
    pub(crate) fn param_token(mut self, key: &str, value: &str) -> Result<Self, SfError> {
        check_key(key)?;
        check_token(value)?;
        self.key(key);
        self.buf.push('=');
        self.buf.push_str(value);
        Ok(self)
    }

    /// Appends a Boolean parameter: `;key` for true (RFC 9651 §4.1.1.2 omits
    /// the value) and `;key=?0` for false.
    #[cfg(test)]
    pub(crate) fn param_bool(mut self, key: &str, value: bool) -> Result<Self, SfError> {
        check_key(key)?;
        self.key(key);
        if !value {
            self.buf.push_str("=?0");
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(value: &str) -> Result<String, SfError> {
        let mut buf = String::new();
        write_string(&mut buf, value).map(|()| buf)
    }

    #[test]
    fn tchar_is_rfc_9110s_set() {
        for b in 0..=u8::MAX {
            let listed = b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
            assert_eq!(is_tchar(b), listed, "byte {b:#04x}");
        }
    }

    #[test]
    fn contract_policy_example() -> Result<(), SfError> {
        let mut field = String::new();
        let mut list = ListWriter::new(&mut field);
        list.item_string("per_key")?
            .param_int("q", 20)?
            .param_int("w", 2)?;
        list.item_string("per_ip")?
            .param_int("q", 100)?
            .param_int("w", 60)?;
        assert_eq!(list.len(), 2);
        assert_eq!(field, r#""per_key";q=20;w=2, "per_ip";q=100;w=60"#);
        Ok(())
    }

    #[test]
    fn contract_ratelimit_example() -> Result<(), SfError> {
        let mut field = String::new();
        let mut list = ListWriter::new(&mut field);
        list.item_string("per_key")?
            .param_int("r", 14)?
            .param_int("t", 1)?;
        list.item_string("per_ip")?
            .param_int("r", 0)?
            .param_int("t", 12)?;
        assert_eq!(field, r#""per_key";r=14;t=1, "per_ip";r=0;t=12"#);
        Ok(())
    }

    #[test]
    fn contract_concurrency_example() -> Result<(), SfError> {
        let mut field = String::new();
        ListWriter::new(&mut field)
            .item_string("concurrency-limit")?
            .param_int("q", 10)?
            .param_string("qu", "concurrent-requests")?;
        assert_eq!(
            field,
            r#""concurrency-limit";q=10;qu="concurrent-requests""#
        );
        Ok(())
    }

    #[test]
    fn strings_escape_quote_and_backslash() {
        assert_eq!(string("").as_deref(), Ok(r#""""#));
        assert_eq!(string("plain text").as_deref(), Ok(r#""plain text""#));
        assert_eq!(string(r#"a"b"#).as_deref(), Ok(r#""a\"b""#));
        assert_eq!(string(r"a\b").as_deref(), Ok(r#""a\\b""#));
        assert_eq!(string(r#"\""#).as_deref(), Ok(r#""\\\"""#));
        assert_eq!(string(" ~!").as_deref(), Ok(r#"" ~!""#));
    }

    #[test]
    fn strings_reject_non_printable() {
        for (value, offset) in [
            ("a\tb", 1),
            ("\n", 0),
            ("ok\u{7f}", 2),
            ("\u{1f}", 0),
            ("caf\u{e9}", 3),
        ] {
            assert_eq!(string(value), Err(SfError::StringNotPrintable { offset }));
        }
    }

    #[test]
    fn integer_bounds() {
        let int = |v| {
            let mut buf = String::new();
            write_integer(&mut buf, v).map(|()| buf)
        };
        assert_eq!(int(0).as_deref(), Ok("0"));
        assert_eq!(int(-42).as_deref(), Ok("-42"));
        assert_eq!(int(MAX_INTEGER).as_deref(), Ok("999999999999999"));
        assert_eq!(int(-MAX_INTEGER).as_deref(), Ok("-999999999999999"));
        for v in [MAX_INTEGER + 1, -MAX_INTEGER - 1, i64::MAX, i64::MIN] {
            assert_eq!(int(v), Err(SfError::IntegerOutOfRange(v)));
        }
    }

    #[test]
    fn tokens() {
        for ok in [
            "a",
            "*",
            "foo123/456",
            "text/html",
            "a:b",
            "A!#$%&'*+-.^_`|~",
        ] {
            let mut buf = String::new();
            assert_eq!(write_token(&mut buf, ok), Ok(()), "{ok:?}");
            assert_eq!(buf, ok);
        }
        for bad in ["", "1a", "-a", "a b", "a\"", "a,b", "a;b", "a=b", "é"] {
            assert_eq!(
                write_token(&mut String::new(), bad),
                Err(SfError::InvalidToken)
            );
        }
    }

    #[test]
    fn key_grammar() {
        for ok in ["q", "w", "qu", "*", "a1", "a_b-c.d*"] {
            let mut field = String::new();
            let mut list = ListWriter::new(&mut field);
            let r = list.item_int(1).and_then(|p| p.param_bool(ok, true));
            assert!(r.is_ok(), "{ok:?}");
        }
        for bad in ["", "Q", "1a", "_a", "-a", "a b", "aB", "a=", "é"] {
            let mut field = String::new();
            let mut list = ListWriter::new(&mut field);
            let r = list.item_int(1).and_then(|p| p.param_int(bad, 1));
            assert_eq!(r.err(), Some(SfError::InvalidKey), "{bad:?}");
        }
    }

    #[test]
    fn params_of_every_kind() -> Result<(), SfError> {
        let mut field = String::new();
        let mut list = ListWriter::new(&mut field);
        list.item_token("policy")?
            .param_bool("on", true)?
            .param_bool("off", false)?
            .param_token("t", "a/b")?
            .param_string("s", "x\"y")?
            .param_int("n", -5)?;
        list.item_int(7)?;
        assert_eq!(field, r#"policy;on;off=?0;t=a/b;s="x\"y";n=-5, 7"#);
        Ok(())
    }

    #[test]
    fn failed_call_writes_nothing() -> Result<(), SfError> {
        let mut field = String::from("prefix:");
        let mut list = ListWriter::new(&mut field);
        assert!(list.item_string("bad\n").is_err());
        assert!(list.is_empty());
        let params = list.item_string("ok")?;
        let err = params.param_int("q", i64::MAX).err();
        assert_eq!(err, Some(SfError::IntegerOutOfRange(i64::MAX)));
        assert!(list.item_int(MAX_INTEGER + 1).is_err());
        assert!(list.item_token("9").is_err());
        assert_eq!(list.len(), 1);
        assert_eq!(field, r#"prefix:"ok""#);
        Ok(())
    }

    proptest::proptest! {
        /// Undoing the escapes gives back exactly the input, for any
        /// printable ASCII; anything else is refused.
        #[test]
        fn string_round_trips(value in "[ -~]{0,40}", bad in "[^ -~]") {
            let written = string(&value).map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
            let inner = &written[1..written.len() - 1];
            let mut unescaped = String::new();
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                proptest::prop_assert!(c != '"', "unescaped quote in {}", written);
                unescaped.push(if c == '\\' { chars.next().unwrap_or('?') } else { c });
            }
            proptest::prop_assert_eq!(unescaped, value.clone());
            let mixed = format!("{value}{bad}");
            proptest::prop_assert_eq!(
                string(&mixed),
                Err(SfError::StringNotPrintable { offset: value.len() })
            );
        }
    }

    #[test]
    fn empty_list_writes_nothing() {
        let mut field = String::new();
        let list = ListWriter::new(&mut field);
        assert!(list.is_empty());
        assert_eq!(field, "");
    }
}
