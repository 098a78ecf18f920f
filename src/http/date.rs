//! The `Date` field of responses, formatted once a second per thread.
//!
//! Every response carries one (as hyper's do); formatting an IMF-fixdate
//! per response would cost more than the rest of the head, so each worker
//! thread keeps the current second's text and rewrites it when the second
//! changes.

use std::cell::RefCell;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `Sun, 06 Nov 1994 08:49:37 GMT`: always this long.
const DATE_LEN: usize = 29;

struct Cached {
    /// The second the text says, as `[from, until)`: a reading is checked
    /// against it by comparison alone. (Its seconds since the epoch, asked
    /// of every reading, were ~55 instructions a response of `SystemTime`'s
    /// subtraction, `bench/instructions.sh`.) A clock stepped back lands
    /// before `from` and is written afresh, as one stepped forward.
    from: SystemTime,
    until: SystemTime,
    text: [u8; DATE_LEN],
}

thread_local! {
    static CACHED: RefCell<Cached> = const {
        RefCell::new(Cached {
            // An empty range: the first reading writes the text.
            from: UNIX_EPOCH,
            until: UNIX_EPOCH,
            text: [0; DATE_LEN],
        })
    };
}

/// Appends the current date, as `Date` wants it, to `out`.
pub(crate) fn extend(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if now < cached.from || now >= cached.until {
            rewrite(&mut cached, now);
        }
        out.extend_from_slice(&cached.text);
    });
}

/// The text of `now`'s second, and that second's range. Out of line: once
/// a second.
#[cold]
#[inline(never)]
fn rewrite(cached: &mut Cached, now: SystemTime) {
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let from = UNIX_EPOCH + Duration::from_secs(second);
    let mut text = [0u8; DATE_LEN];
    // httpdate formats exactly DATE_LEN bytes for any SystemTime, to the
    // whole second.
    if write!(&mut text[..], "{}", httpdate::HttpDate::from(now)).is_ok() {
        cached.text = text;
        cached.from = from;
        cached.until = from + Duration::from_secs(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_date_httpdate_reads_back() {
        let mut out = Vec::new();
        extend(&mut out);
        let text = std::str::from_utf8(&out).unwrap();
        assert_eq!(text.len(), DATE_LEN);
        let parsed = httpdate::parse_http_date(text).unwrap();
        let skew = SystemTime::now()
            .duration_since(parsed)
            .unwrap_or_default()
            .as_secs();
        assert!(skew <= 2, "{text} is {skew} s old");
        // The cached text is reused within the second.
        let mut again = Vec::new();
        extend(&mut again);
        assert_eq!(again.len(), DATE_LEN);
    }

    #[test]
    fn a_second_s_text_holds_from_its_start_until_the_next() {
        let mut cached = Cached {
            from: UNIX_EPOCH,
            until: UNIX_EPOCH,
            text: [0; DATE_LEN],
        };
        let second = UNIX_EPOCH + Duration::from_secs(784_111_777);
        rewrite(&mut cached, second + Duration::from_millis(999));
        assert_eq!(&cached.text, b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(
            (cached.from, cached.until),
            (second, second + Duration::from_secs(1))
        );
        // The next second's first nanosecond is past it, as is the one
        // before its start (a clock stepped back).
        for now in [
            second + Duration::from_secs(1),
            second - Duration::from_nanos(1),
        ] {
            assert!(now < cached.from || now >= cached.until);
            rewrite(&mut cached, now);
            assert_eq!(&cached.text[..], httpdate::fmt_http_date(now).as_bytes());
        }
    }
}
