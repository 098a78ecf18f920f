//! The `Date` field of responses, formatted once a second per thread.
//!
//! Every response carries one (as hyper's do); formatting an IMF-fixdate
//! per response would cost more than the rest of the head, so each worker
//! thread keeps the current second's text and rewrites it when the second
//! changes.

use std::cell::RefCell;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// `Sun, 06 Nov 1994 08:49:37 GMT`: always this long.
const DATE_LEN: usize = 29;

struct Cached {
    second: u64,
    text: [u8; DATE_LEN],
}

thread_local! {
    static CACHED: RefCell<Cached> = const {
        RefCell::new(Cached {
            second: u64::MAX,
            text: [0; DATE_LEN],
        })
    };
}

/// Appends the current date, as `Date` wants it, to `out`.
pub(crate) fn extend(out: &mut Vec<u8>) {
    let now = SystemTime::now();
    let second = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|cached| {
        let mut cached = cached.borrow_mut();
        if cached.second != second {
            let mut text = [0u8; DATE_LEN];
            // httpdate formats exactly DATE_LEN bytes for any SystemTime.
            if write!(&mut text[..], "{}", httpdate::HttpDate::from(now)).is_ok() {
                cached.text = text;
                cached.second = second;
            }
        }
        out.extend_from_slice(&cached.text);
    });
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
}
