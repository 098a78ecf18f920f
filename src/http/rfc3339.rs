//! RFC 3339 timestamps (`2026-12-31T23:59:59Z`) to and from nanoseconds
//! since the Unix epoch, as the admin API reads and writes them (an
//! override's `expires`) and the simulator reads a trace's times.

const NANOS: u64 = 1_000_000_000;

/// `nanos` since the epoch as RFC 3339 in UTC with whole seconds.
pub(crate) fn format(nanos: u64) -> String {
    let seconds = nanos / NANOS;
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    // Howard Hinnant's civil_from_days, for non-negative day counts.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// `YYYY-MM-DD(T| )HH:MM:SS[.frac](Z|±HH:MM)` as nanoseconds since the
/// epoch (none before it, nor an impossible date or offset). RFC 3339 allows
/// a space for the `T`; the admin API and the simulator's traces read both.
pub(crate) fn parse(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = b.get(range)?;
        if !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut nanos = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        for k in 0..9 {
            let digit = if start + k < i {
                i64::from(b[start + k] - b'0')
            } else {
                0
            };
            nanos = nanos * 10 + digit;
        }
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return None;
            }
            let minutes = h * 60 + m;
            if *sign == b'+' { minutes } else { -minutes }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset * 60;
    let secs = u64::try_from(secs).ok()?;
    secs.checked_mul(NANOS)?
        .checked_add(u64::try_from(nanos).ok()?)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times_parse() {
        assert_eq!(parse("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse("2000-02-29T00:00:00Z"), Some(951_782_400 * NANOS));
        assert_eq!(
            parse("2000-02-29T01:00:00.5+01:00"),
            Some(951_782_400 * NANOS + NANOS / 2)
        );
        // RFC 3339 §5.6's note: a space may stand for the `T`.
        assert_eq!(parse("2000-02-29 00:00:00Z"), Some(951_782_400 * NANOS));
        assert_eq!(parse("2001-02-29T00:00:00Z"), None, "no such day");
        assert_eq!(parse("2000-02-29T00:00:00+24:00"), None, "no such offset");
        assert_eq!(parse("2000-13-01T00:00:00Z"), None);
        assert_eq!(parse("tomorrow"), None);
    }

    #[test]
    fn format_reads_back() {
        for text in [
            "1970-01-01T00:00:00Z",
            "2000-02-29T23:59:59Z",
            "2100-03-01T00:00:00Z",
        ] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
