//! Calendar months in UTC on the limiters' clock (nanoseconds since the
//! Unix epoch), for fixed windows of `window = "1mo"`: which month an
//! instant falls in and when that month ends. Integer arithmetic only
//! (Howard Hinnant's `civil_from_days` / `days_from_civil`, exact for any
//! date the clock can hold); `store/stack.lua` and `store/settle.lua` do
//! the same in Lua for Redis' clock.
//!
//! Worked example: 2026-02-14T12:00:00Z is day 20,498 since the epoch,
//! in month 673 (Feb 2026: 56 years × 12 + 1), which ends at the start of
//! 2026-03-01, day 20,513.

use std::cell::Cell;

use super::{NANOS_PER_SEC, Nanos};

const DAY: Nanos = 86_400 * NANOS_PER_SEC;

/// The longest month: a monthly window's nominal length, for what needs
/// one number (the `w` of its fields, an expiry that outlives the month).
pub(crate) const MONTH: Nanos = 31 * DAY;

thread_local! {
    /// The last day [`month_of`] was asked about on this thread, with its
    /// answer: a budget is checked at admission and settled after the
    /// response, and every request of a day falls in the same month, so
    /// the calendar arithmetic (~120 instructions, divisions) runs once a
    /// day per thread instead of twice a request.
    static LAST_DAY: Cell<(u64, u64, Nanos)> = const { Cell::new((u64::MAX, 0, 0)) };
}

/// The month `now` falls in, counted from January 1970 (0), and the
/// instant the next one starts.
pub(crate) fn month_of(now: Nanos) -> (u64, Nanos) {
    let day = now / DAY;
    LAST_DAY.with(|last| {
        let (cached, index, end) = last.get();
        if cached == day {
            return (index, end);
        }
        let (index, end) = month_of_day(day);
        last.set((day, index, end));
        (index, end)
    })
}

/// [`month_of`] computed: the month of `day` (days since 1970-01-01).
fn month_of_day(day: u64) -> (u64, Nanos) {
    let (year, month) = civil_from_days(day);
    let index = (year - 1970) * 12 + (month - 1);
    let (next_year, next_month) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    let end = days_from_civil(next_year, next_month).saturating_mul(DAY);
    (index, end)
}

/// The year and month (1-12) of `days` since 1970-01-01.
fn civil_from_days(days: u64) -> (u64, u64) {
    // Shifted to 0000-03-01, so that a leap day ends its year.
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    (year, month)
}

/// Days since 1970-01-01 of the first day of `month` (1-12) of `year`
/// (1970 or later).
fn days_from_civil(year: u64, month: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let shifted_month = if month > 2 { month - 3 } else { month + 9 };
    let day_of_year = (153 * shifted_month + 2) / 5;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = NANOS_PER_SEC;

    #[test]
    fn the_worked_example() {
        // 2026-02-14T12:00:00Z.
        let now = 1_771_070_400 * S;
        assert_eq!(now / DAY, 20_498);
        let (index, end) = month_of(now);
        assert_eq!(index, 56 * 12 + 1);
        // 2026-03-01T00:00:00Z.
        assert_eq!(end, 1_772_323_200 * S);
    }

    #[test]
    fn months_have_their_lengths() {
        // 1970-01-01 is month 0, ending on Feb 1.
        assert_eq!(month_of(0), (0, 31 * DAY));
        // The last nanosecond of January is still January.
        assert_eq!(month_of(31 * DAY - 1), (0, 31 * DAY));
        assert_eq!(month_of(31 * DAY).0, 1);
        // A leap February (2024) has 29 days, a plain one (2023) 28,
        // 2000 (divisible by 400) 29, 2100 28.
        for (year, days) in [(2023, 28), (2024, 29), (2000, 29), (2100, 28)] {
            let start = days_from_civil(year, 2) * DAY;
            let (_, end) = month_of(start);
            assert_eq!(end - start, days * DAY, "{year}");
        }
        // December rolls into the next year.
        let december = days_from_civil(2025, 12) * DAY;
        assert_eq!(
            month_of(december),
            (55 * 12 + 11, days_from_civil(2026, 1) * DAY)
        );
    }

    /// The per-thread cache answers as the arithmetic does, whatever the
    /// order of the days asked (a clock stepped back, a test's time).
    #[test]
    fn the_cached_month_is_the_computed_one() {
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..10_000 {
            let day = rng.u64(0..200 * 366);
            let now = day * DAY + rng.u64(0..DAY);
            assert_eq!(month_of(now), month_of_day(day), "{now}");
            assert_eq!(month_of(now), month_of_day(day), "{now}, again");
        }
    }

    #[test]
    fn every_day_for_four_centuries_round_trips() {
        let mut previous = (0, 0);
        for days in 0..(400 * 366) {
            let (year, month) = civil_from_days(days);
            let first = days_from_civil(year, month);
            assert!(first <= days && days - first < 31, "{days}: {year}-{month}");
            let index = (year - 1970) * 12 + (month - 1);
            assert!(index == previous.0 || index == previous.0 + 1);
            if index != previous.0 {
                assert_eq!(first, days, "a month starts on its first day");
            }
            previous = (index, first);
        }
    }
}
