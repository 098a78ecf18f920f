//! RFC 3339 timestamps (`2026-12-31T23:59:59Z`) to and from nanoseconds
//! since the Unix epoch, as the admin API reads and writes them (an
//! override's `expires`).

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

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` as nanoseconds since the epoch
/// (none before it).
pub(crate) fn parse(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |from: usize, to: usize| -> Option<i64> {
        let digits = b.get(from..to)?;
        digits
            .iter()
            .all(u8::is_ascii_digit)
            .then(|| std::str::from_utf8(digits).ok()?.parse().ok())?
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut fraction = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
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
            fraction = fraction * 10 + digit;
        }
    }
    let offset = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let minutes = num(i + 1, i + 3)? * 60 + num(i + 4, i + 6)?;
            if *sign == b'+' { minutes } else { -minutes }
        }
        _ => return None,
    };
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset * 60;
    u64::try_from(secs)
        .ok()?
        .checked_mul(NANOS)?
        .checked_add(u64::try_from(fraction).ok()?)
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
        assert_eq!(parse("2000-02-29 00:00:00Z"), None);
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
