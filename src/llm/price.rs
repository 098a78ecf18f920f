//! What a request costs in US dollars (contract section 14, `[prices]`),
//! in integer arithmetic only: a price is whole micro-dollars per million
//! tokens (`0.075` $/M is 75 000 µ$/M, exact; config refuses anything
//! finer), so a token costs `price / 10^6` µ$, a rational, and a request's
//! exact cost in pico-dollars (10⁻¹² $) is the integer
//! `Σ tokens × price`. Its charge is that rounded **up** to a whole
//! micro-dollar ([`cost_micros`]): a request is never charged less than
//! it costs, at most 1 µ$ more; a budget's spend is then the exact integer
//! sum of those charges, whatever their number (no float, no drift).
//!
//! Worked example, `gpt-4o` at input 2.50, cached input 1.25, output
//! 10.00 $/M, a response of 1 000 prompt tokens of which 200 were cached
//! and 300 completion tokens: 800 × 2 500 000 + 200 × 1 250 000 +
//! 300 × 10 000 000 = 5 250 000 000 p$ = 5 250 µ$ = $0.00525.
//!
//! The prices of every model are a [`Prices`], built at config load and
//! swapped whole with the configuration on a reload.

use super::usage::Usage;

/// Pico-dollars in a micro-dollar: a price of `p` µ$ per million tokens
/// makes each token cost `p` p$.
const PICO_PER_MICRO: u128 = 1_000_000;

/// One model's prices, in micro-dollars per million tokens (integers, so
/// the accounting is exact).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Price {
    /// An uncached prompt token (Anthropic's cache-creation tokens too:
    /// they are priced as input, not at Anthropic's 1.25× rate).
    pub input: u64,
    /// A prompt token read from the provider's cache (OpenAI's
    /// `cached_tokens`, Anthropic's `cache_read_input_tokens`); the input
    /// price when the config gives none.
    pub cached_input: u64,
    /// A completion token (reasoning tokens included, as the APIs count
    /// them).
    pub output: u64,
}

/// `tokens × price`, exact, in pico-dollars.
fn pico(tokens: u64, price: u64) -> u128 {
    u128::from(tokens) * u128::from(price)
}

/// Pico-dollars as whole micro-dollars, rounded up (saturating).
fn micros_up(pico: u128) -> u64 {
    u64::try_from(pico.div_ceil(PICO_PER_MICRO)).unwrap_or(u64::MAX)
}

/// What a settled response costs, in micro-dollars, rounded up: its
/// uncached prompt tokens (`input − cached`) at `input`, its cached ones
/// at `cached_input`, its completion at `output`. A `cached` above the
/// input (no API reports one) is taken as all of the input.
///
/// The one pricing function of the gateway: a usd limit's settlement and
/// the usage events' `cost` both call it.
pub fn cost_micros(price: &Price, usage: &Usage) -> u64 {
    let cached = usage.cached.min(usage.input);
    let uncached = usage.input - cached;
    micros_up(
        pico(uncached, price.input)
            .saturating_add(pico(cached, price.cached_input))
            .saturating_add(pico(usage.output, price.output)),
    )
}

/// The most a request may cost before its response says what it used, in
/// micro-dollars, rounded up: its prompt estimate as uncached input plus
/// its whole completion budget as output. A usd limit reserves this at
/// admission.
pub fn reservation_micros(price: &Price, prompt: u64, completion: u64) -> u64 {
    micros_up(pico(prompt, price.input).saturating_add(pico(completion, price.output)))
}

/// The `[prices]` table: a price per model name (the request body's
/// `model`, exactly as sent) and the `default` for the models not listed.
///
/// The models sorted by name, looked up by a binary search: a token
/// request looks its model up at admission and at its settlement, and a
/// `HashMap`'s SipHash of the name cost more than the few comparisons of
/// a table of tens of models.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prices {
    models: Vec<(Box<str>, Price)>,
    pub(crate) default: Option<Price>,
}

impl Prices {
    /// The price of `model` (its own, else the default); `None` when it
    /// has neither (a body without a `model` takes the default).
    pub fn of(&self, model: Option<&str>) -> Option<Price> {
        model
            .and_then(|name| {
                let found = self.models.binary_search_by(|(m, _)| (**m).cmp(name));
                found.ok().map(|at| self.models[at].1)
            })
            .or(self.default)
    }

    /// Sets `model`'s price.
    pub(crate) fn insert(&mut self, model: &str, price: Price) {
        match self.models.binary_search_by(|(m, _)| (**m).cmp(model)) {
            Ok(at) => self.models[at].1 = price,
            Err(at) => self.models.insert(at, (model.into(), price)),
        }
    }

    /// No price at all is configured.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty() && self.default.is_none()
    }
}

/// Micro-dollars as dollars, exactly: `1234567` is `"1.234567"`, whole
/// dollars keep two decimals (`"500.00"`), trailing zeros past the cents
/// dropped. For answers people read (the 429's detail, explain, simulate).
pub fn dollars(micros: u64) -> String {
    let (whole, fraction) = (micros / 1_000_000, micros % 1_000_000);
    let mut digits = format!("{fraction:06}");
    while digits.len() > 2 && digits.ends_with('0') {
        digits.pop();
    }
    format!("{whole}.{digits}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GPT_4O: Price = Price {
        input: 2_500_000,
        cached_input: 1_250_000,
        output: 10_000_000,
    };

    fn usage(input: u64, cached: u64, output: u64) -> Usage {
        Usage {
            input,
            cached,
            output,
            total: input.saturating_add(output),
        }
    }

    #[test]
    fn the_worked_example() {
        assert_eq!(cost_micros(&GPT_4O, &usage(1_000, 200, 300)), 5_250);
        assert_eq!(dollars(5_250), "0.00525");
    }

    #[test]
    fn cached_tokens_are_priced_apart() {
        let all_cached = cost_micros(&GPT_4O, &usage(1_000_000, 1_000_000, 0));
        let none_cached = cost_micros(&GPT_4O, &usage(1_000_000, 0, 0));
        assert_eq!(all_cached, 1_250_000);
        assert_eq!(none_cached, 2_500_000);
        // A cached count above the input is the whole input.
        assert_eq!(cost_micros(&GPT_4O, &usage(10, 50, 0)), 13);
    }

    #[test]
    fn a_fraction_of_a_micro_dollar_rounds_up() {
        // 0.075 $/M: one token is 0.075 µ$, charged 1 µ$.
        let cheap = Price {
            input: 75_000,
            cached_input: 37_500,
            output: 300_000,
        };
        assert_eq!(cost_micros(&cheap, &usage(1, 0, 0)), 1);
        assert_eq!(cost_micros(&cheap, &usage(40, 0, 0)), 3);
        assert_eq!(cost_micros(&cheap, &usage(0, 0, 0)), 0);
        assert_eq!(reservation_micros(&cheap, 1_000_000, 0), 75_000);
    }

    #[test]
    fn the_reservation_prices_the_prompt_as_input_and_the_budget_as_output() {
        assert_eq!(reservation_micros(&GPT_4O, 1_000, 500), 2_500 + 5_000);
    }

    #[test]
    fn huge_counts_saturate_instead_of_wrapping() {
        let most = Price {
            input: u64::MAX,
            cached_input: u64::MAX,
            output: u64::MAX,
        };
        assert_eq!(cost_micros(&most, &usage(u64::MAX, 0, u64::MAX)), u64::MAX);
        assert_eq!(reservation_micros(&most, u64::MAX, u64::MAX), u64::MAX);
    }

    #[test]
    fn prices_by_model_else_the_default() {
        let mut prices = Prices::default();
        assert!(prices.is_empty());
        prices.insert("gpt-4o", GPT_4O);
        assert_eq!(prices.of(Some("gpt-4o")), Some(GPT_4O));
        assert_eq!(prices.of(Some("gpt-4o-mini")), None);
        assert_eq!(prices.of(None), None);
        let default = Price {
            input: 1,
            cached_input: 1,
            output: 2,
        };
        prices.default = Some(default);
        assert_eq!(prices.of(Some("gpt-4o-mini")), Some(default));
        assert_eq!(prices.of(None), Some(default));
        // Many models, inserted in any order: each found, one set twice
        // keeps the last.
        let names = ["o3", "claude-3", "gpt-4o", "a", "gpt-4o-mini", "zeta", "o1"];
        for (i, name) in names.iter().enumerate() {
            let price = Price {
                input: i as u64,
                cached_input: 0,
                output: 0,
            };
            prices.insert(name, price);
        }
        for (i, name) in names.iter().enumerate() {
            assert_eq!(
                prices.of(Some(name)).map(|p| p.input),
                Some(i as u64),
                "{name}"
            );
        }
        assert_eq!(prices.of(Some("gpt-4")), Some(default));
    }

    #[test]
    fn dollars_are_written_exactly() {
        assert_eq!(dollars(0), "0.00");
        assert_eq!(dollars(500_000_000), "500.00");
        assert_eq!(dollars(12_500_000), "12.50");
        assert_eq!(dollars(1), "0.000001");
        assert_eq!(dollars(1_234_567), "1.234567");
    }

    /// The exact cost as a fraction `numerator / 10^18` dollars, in
    /// arbitrary precision made of two u128 halves: each term is below
    /// 2^128, so the sum is carried by hand.
    fn exact_pico(price: &Price, usage: &Usage) -> (u128, u128) {
        let cached = usage.cached.min(usage.input);
        let terms = [
            u128::from(usage.input - cached) * u128::from(price.input),
            u128::from(cached) * u128::from(price.cached_input),
            u128::from(usage.output) * u128::from(price.output),
        ];
        terms.iter().fold((0u128, 0u128), |(high, low), &term| {
            let (sum, carry) = low.overflowing_add(term);
            (high + u128::from(carry), sum)
        })
    }

    proptest! {
        /// For any prices and counts, the charge is the least whole number
        /// of micro-dollars at or above the exact rational cost
        /// (`pico / 10^6`): `charge × 10^6 ≥ pico > (charge − 1) × 10^6`.
        #[test]
        fn the_charge_is_the_exact_cost_rounded_up(
            input in any::<u64>(),
            cached in any::<u64>(),
            output in any::<u64>(),
            // Config refuses prices above $1,000,000 per million tokens.
            prices in (0u64..=1_000_000_000_000, 0u64..=1_000_000_000_000, 0u64..=1_000_000_000_000),
        ) {
            let price = Price { input: prices.0, cached_input: prices.1, output: prices.2 };
            let usage = usage(input, cached, output);
            let charge = cost_micros(&price, &usage);
            let (high, low) = exact_pico(&price, &usage);
            prop_assert_eq!(high, 0, "validated prices keep the sum within u128");
            let exact = low;
            if charge == u64::MAX {
                prop_assert!(exact > (u128::from(u64::MAX) - 1) * PICO_PER_MICRO);
            } else {
                prop_assert!(u128::from(charge) * PICO_PER_MICRO >= exact);
                prop_assert!(charge == 0 || u128::from(charge - 1) * PICO_PER_MICRO < exact);
            }
        }

        /// Realistic counts never come near saturation: the charge is then
        /// exactly ceil(pico / 10^6), checked with integer division alone.
        #[test]
        fn realistic_charges_are_exact(
            input in 0u64..10_000_000,
            cached in 0u64..10_000_000,
            output in 0u64..10_000_000,
            prices in (0u64..=1_000_000_000, 0u64..=1_000_000_000, 0u64..=1_000_000_000),
        ) {
            let price = Price { input: prices.0, cached_input: prices.1, output: prices.2 };
            let usage = usage(input, cached, output);
            let (_, exact) = exact_pico(&price, &usage);
            let expected = exact / PICO_PER_MICRO + u128::from(exact % PICO_PER_MICRO != 0);
            prop_assert_eq!(u128::from(cost_micros(&price, &usage)), expected);
        }
    }

    #[test]
    fn a_million_charges_add_up_to_their_exact_sum() {
        // A million settlements of varied usage: the spend (the sum of the
        // integer charges) equals the sum recomputed independently, and is
        // within one micro-dollar per request above the exact total cost.
        let mut rng = fastrand::Rng::with_seed(47);
        let price = Price {
            input: 150_000,
            cached_input: 75_000,
            output: 600_000,
        };
        let (mut spend, mut exact_total, mut independent) = (0u64, 0u128, 0u128);
        const N: u64 = 1_000_000;
        for _ in 0..N {
            let input = rng.u64(0..20_000);
            let usage = usage(input, rng.u64(0..=input), rng.u64(0..4_000));
            let charge = cost_micros(&price, &usage);
            spend += charge;
            let (_, exact) = exact_pico(&price, &usage);
            exact_total += exact;
            independent += exact.div_ceil(PICO_PER_MICRO);
        }
        assert_eq!(u128::from(spend), independent);
        assert!(u128::from(spend) * PICO_PER_MICRO >= exact_total);
        assert!(u128::from(spend) * PICO_PER_MICRO - exact_total < u128::from(N) * PICO_PER_MICRO);
    }
}
