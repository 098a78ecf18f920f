//! A number as the user wrote it, kept exact: a limit's `limit` and
//! `capacity` (whole for requests and tokens; dollars with decimals for a
//! `unit = "usd"` limit) and the prices of `[prices]`.
//!
//! TOML (and JSON) hand a decimal over as a binary float, which cannot
//! hold `0.075`. The float's shortest round-trip decimal (what Rust's
//! `Display` writes: `0.075` for the float nearest 0.075) is exactly the
//! text the user wrote whenever it has at most 15 significant digits, so
//! it is read back as a decimal and kept in millionths, an integer. A
//! number with more than six decimals, negative, NaN or infinite is
//! refused where it is read, with its key and line.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// Millionths in one.
pub(crate) const MILLION: u128 = 1_000_000;

/// A non-negative decimal with at most six decimals, in millionths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Amount {
    millionths: u128,
}

impl Amount {
    /// A whole number.
    pub(crate) fn whole(n: u64) -> Amount {
        Amount {
            millionths: u128::from(n) * MILLION,
        }
    }

    /// The number as a whole count (requests, tokens); `Err` says why it
    /// is not one.
    pub(crate) fn count(self) -> Result<u64, String> {
        if !self.millionths.is_multiple_of(MILLION) {
            return Err(format!("`{self}` is not a whole number"));
        }
        u64::try_from(self.millionths / MILLION).map_err(|_| format!("`{self}` is too large"))
    }

    /// The number in millionths (dollars as micro-dollars); `Err` when it
    /// does not fit a u64.
    pub(crate) fn millionths(self) -> Result<u64, String> {
        u64::try_from(self.millionths).map_err(|_| format!("`{self}` is too large"))
    }

    /// Reads `text`, a plain decimal (`12`, `0.075`, `.5` not allowed).
    pub(crate) fn parse(text: &str) -> Result<Amount, String> {
        let trimmed = text.trim();
        let (whole, fraction) = trimmed.split_once('.').unwrap_or((trimmed, ""));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if trimmed.starts_with('-') {
            return Err(format!("`{text}`: must not be negative"));
        }
        if !digits(whole) || !(fraction.is_empty() || digits(fraction)) {
            return Err(format!("`{text}` is not a number like 12 or 0.075"));
        }
        let fraction = fraction.trim_end_matches('0');
        if fraction.len() > 6 {
            return Err(format!(
                "`{text}` has more than six decimals (a millionth is the finest unit)"
            ));
        }
        let too_large = || format!("`{text}` is too large");
        let whole: u128 = whole.parse().map_err(|_| too_large())?;
        let fraction: u128 = format!("{fraction:0<6}").parse().unwrap_or(0);
        let millionths = whole
            .checked_mul(MILLION)
            .and_then(|w| w.checked_add(fraction))
            .filter(|m| *m <= u128::from(u64::MAX))
            .ok_or_else(too_large)?;
        Ok(Amount { millionths })
    }

    /// As a JSON number (the state file, the admin API's answers): an
    /// integer when whole, else the decimal as a float (it round-trips).
    pub(crate) fn to_json(self) -> serde_json::Value {
        match self.count() {
            Ok(n) => serde_json::Value::from(n),
            Err(_) => serde_json::Value::from(self.to_string().parse::<f64>().unwrap_or(0.0)),
        }
    }
}

impl From<u64> for Amount {
    fn from(n: u64) -> Amount {
        Amount::whole(n)
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (whole, fraction) = (self.millionths / MILLION, self.millionths % MILLION);
        if fraction == 0 {
            return write!(f, "{whole}");
        }
        let digits = format!("{fraction:06}");
        write!(f, "{whole}.{}", digits.trim_end_matches('0'))
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct AmountVisitor;
        impl Visitor<'_> for AmountVisitor {
            type Value = Amount;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number like 500 or 2.50")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Amount, E> {
                Ok(Amount::whole(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Amount, E> {
                u64::try_from(v)
                    .map(Amount::whole)
                    .map_err(|_| E::custom(format!("`{v}`: must not be negative")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Amount, E> {
                if !v.is_finite() {
                    return Err(E::custom(format!("`{v}` is not a number")));
                }
                // The shortest decimal that reads back as `v`: what was written.
                Amount::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Amount, E> {
                // A quoted number is refused as serde refuses it for an
                // integer, so the configuration's hint ("without quotes")
                // still answers it.
                Err(E::invalid_type(de::Unexpected::Str(v), &self))
            }
        }
        deserializer.deserialize_any(AmountVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn toml(text: &str) -> Result<Amount, String> {
        #[derive(Deserialize)]
        struct One {
            n: Amount,
        }
        toml::from_str::<One>(&format!("n = {text}"))
            .map(|one| one.n)
            .map_err(|e| e.message().to_owned())
    }

    #[test]
    fn decimals_are_kept_exactly() {
        assert_eq!(toml("0.075").unwrap().millionths().unwrap(), 75_000);
        assert_eq!(toml("2.50").unwrap().millionths().unwrap(), 2_500_000);
        assert_eq!(toml("500").unwrap().millionths().unwrap(), 500_000_000);
        assert_eq!(toml("500").unwrap().count().unwrap(), 500);
        assert_eq!(toml("1e2").unwrap().count().unwrap(), 100);
        assert_eq!(toml("0.000001").unwrap().millionths().unwrap(), 1);
        assert_eq!(toml("0.1").unwrap().to_string(), "0.1");
        assert_eq!(toml("12.5").unwrap().to_json(), serde_json::json!(12.5));
        assert_eq!(toml("12").unwrap().to_json(), serde_json::json!(12));
    }

    #[test]
    fn what_is_not_an_exact_amount_is_refused() {
        for (text, says) in [
            ("-1", "must not be negative"),
            ("-0.5", "must not be negative"),
            ("nan", "is not a number"),
            ("inf", "is not a number"),
            ("0.0000001", "more than six decimals"),
            ("\"1.2\"", "invalid type: string"),
            ("\"abc\"", "expected a number"),
            ("1e30", "too large"),
        ] {
            let error = toml(text).unwrap_err();
            assert!(error.contains(says), "{text}: {error}");
        }
        assert!(toml("1.5").unwrap().count().unwrap_err().contains("whole"));
    }

    proptest! {
        /// Any decimal of up to six decimals written in TOML reads back as
        /// exactly that many millionths.
        #[test]
        fn written_decimals_read_exactly(whole in 0u64..10_000_000, fraction in 0u64..1_000_000) {
            let text = format!("{whole}.{fraction:06}");
            let read = toml(&text).unwrap();
            prop_assert_eq!(read.millionths().unwrap(), whole * 1_000_000 + fraction);
        }
    }
}
