//! Parsers for the unit-bearing values of `gateway.toml`: durations (`"250ms"`),
//! rates (`"10/s"`, `"0.5/s"`) and sizes (`4096`, `"64KiB"`).
//!
//! Each returns a short human sentence on failure; the validator adds the file
//! position and key path. Rates are kept exact (`"0.5/s"` is 5 tokens per 10 s)
//! because the RateLimit header arithmetic must not round (`ceil(120/1.0)` is 120).

use std::time::Duration;

use crate::limit::{NANOS_PER_SEC, Nanos, Rate};

/// What a duration looks like, for error messages.
pub(crate) const DURATION_EXPECTED: &str =
    "a duration with a unit, like \"250ms\", \"10s\", \"1m\", \"1h\", \"1d\" or \"1w\"";
/// What a rate looks like, for error messages.
pub(crate) const RATE_EXPECTED: &str =
    "a rate \"N/unit\", like \"10/s\", \"600/m\", \"1000/h\" or \"0.5/s\"";
/// What a size looks like, for error messages.
pub(crate) const SIZE_EXPECTED: &str =
    "a size in bytes, or a string with a binary unit like \"64KiB\" or \"10MiB\"";

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" | "second" => NANOS_PER_SEC,
        "m" | "min" | "minute" => 60 * NANOS_PER_SEC,
        "h" | "hour" => 3_600 * NANOS_PER_SEC,
        "d" | "day" => 86_400 * NANOS_PER_SEC,
        "w" | "week" => 7 * 86_400 * NANOS_PER_SEC,
        _ => return None,
    })
}

/// Splits `"12.5ms"` into `("12.5", "ms")`.
fn split_number(text: &str) -> (&str, &str) {
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    (text[..end].trim(), text[end..].trim())
}

/// A non-negative decimal as an exact fraction `(numerator, 10^scale)`.
fn parse_decimal(digits: &str) -> Option<(u64, u64)> {
    if digits.is_empty() || digits.starts_with('.') || digits.ends_with('.') {
        return None;
    }
    let (int, frac) = match digits.split_once('.') {
        Some((i, f)) => (i, f),
        None => (digits, ""),
    };
    if frac.contains('.') || frac.len() > 9 {
        return None;
    }
    let mut numerator: u64 = int.parse().ok()?;
    let mut denominator: u64 = 1;
    for c in frac.chars() {
        numerator = numerator
            .checked_mul(10)?
            .checked_add(c.to_digit(10)? as u64)?;
        denominator *= 10;
    }
    Some((numerator, denominator))
}

/// Parses `"250ms"`, `"10s"`, `"1.5h"`. A bare number is rejected: the unit is
/// what makes `timeout = 30` unambiguous.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let (digits, unit) = split_number(text.trim());
    let per = unit_nanos(unit).ok_or_else(|| format!("`{text}` is not {DURATION_EXPECTED}"))?;
    let (num, den) =
        parse_decimal(digits).ok_or_else(|| format!("`{text}` is not {DURATION_EXPECTED}"))?;
    let nanos = (num as u128 * per as u128) / den as u128;
    let nanos = u64::try_from(nanos).map_err(|_| format!("`{text}` is too long"))?;
    Ok(Duration::from_nanos(nanos))
}

/// Parses `"N/unit"` (also `"N/10s"`) into an exact [`Rate`]; N may be a decimal.
pub(crate) fn parse_rate(text: &str) -> Result<Rate, String> {
    let bad = || format!("`{text}` is not {RATE_EXPECTED}");
    let (count, unit) = text.trim().split_once('/').ok_or_else(bad)?;
    let (num, den) = parse_decimal(count.trim()).ok_or_else(bad)?;
    if num == 0 {
        return Err(format!("`{text}`: a rate must be greater than zero"));
    }
    let unit = unit.trim();
    // "10/s" and "10/5s" both work: a missing period count means 1.
    let period = if unit.starts_with(|c: char| c.is_ascii_digit()) {
        parse_duration(unit).map_err(|_| bad())?.as_nanos() as u64
    } else {
        unit_nanos(unit).ok_or_else(bad)?
    };
    let per: Nanos = period.checked_mul(den).ok_or_else(bad)?;
    if per == 0 {
        return Err(bad());
    }
    let divisor = gcd(num, per);
    Ok(Rate {
        tokens: num / divisor,
        per: per / divisor,
    })
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Parses `"64KiB"`, `"10MiB"`, `"1GiB"`, `"512B"` or a plain `"4096"`.
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let (digits, unit) = split_number(text.trim());
    let multiplier: u64 = match unit {
        "" | "B" => 1,
        "KiB" | "K" | "KB" | "kB" => 1 << 10,
        "MiB" | "M" | "MB" => 1 << 20,
        "GiB" | "G" | "GB" => 1 << 30,
        _ => return Err(format!("`{text}` is not {SIZE_EXPECTED}")),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("`{text}` is not {SIZE_EXPECTED}"))?;
    value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// `"20%"` → 200 (thousandths); one decimal at most (`"12.5%"`); 0–100 %.
pub(crate) fn parse_percent(text: &str) -> Option<u64> {
    let number = text.trim().strip_suffix('%')?.trim();
    let (whole, tenths) = match number.split_once('.') {
        Some((whole, tenth)) if tenth.len() == 1 => (whole, tenth.parse::<u64>().ok()?),
        Some(_) => return None,
        None => (number, 0),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let permille = whole.parse::<u64>().ok()?.checked_mul(10)? + tenths;
    (permille <= 1000).then_some(permille)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86400)));
        assert_eq!(parse_duration("1w"), Ok(Duration::from_secs(7 * 86400)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("10 parsecs").is_err());
    }

    #[test]
    fn rates_are_exact_fractions() {
        // Reduced to lowest terms: 10/s is one token every 100 ms.
        assert_eq!(
            parse_rate("10/s"),
            Ok(Rate {
                tokens: 1,
                per: NANOS_PER_SEC / 10
            })
        );
        assert_eq!(
            parse_rate("600/m"),
            Ok(Rate {
                tokens: 1,
                per: NANOS_PER_SEC / 10
            })
        );
        assert_eq!(
            parse_rate("0.5/s"),
            Ok(Rate {
                tokens: 1,
                per: 2 * NANOS_PER_SEC
            })
        );
        assert_eq!(
            parse_rate("1000/h"),
            Ok(Rate {
                tokens: 1,
                per: 3_600_000_000
            })
        );
        assert_eq!(
            parse_rate("3/10s"),
            Ok(Rate {
                tokens: 3,
                per: 10 * NANOS_PER_SEC
            })
        );
        assert!(parse_rate("0/s").is_err());
        assert!(parse_rate("10").is_err());
        assert!(parse_rate("10/fortnight").is_err());
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("10MiB"), Ok(10 << 20));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("12 bananas").is_err());
    }
}
