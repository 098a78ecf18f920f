//! `[prices."MODEL"]` and `[prices.default]` (contract section 14): US
//! dollars per million tokens, checked into an exact [`Prices`] of
//! micro-dollars per million tokens (see `llm::price` for the
//! arithmetic). Part of the configuration: a reload swaps them with it.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::amount::Amount;
use super::checker::Checker;
use super::error::KeyPath;
use crate::llm::price::{Price, Prices};

/// One `[prices.NAME]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPrice {
    pub(crate) input: Option<Amount>,
    pub(crate) output: Option<Amount>,
    pub(crate) cached_input: Option<Amount>,
}

/// The most a million tokens may cost: $100,000. No model is priced near
/// it; a larger number is a price per token or per thousand written as
/// per million, refused rather than charged.
const MAX_PER_MILLION_MICROS: u64 = 100_000 * 1_000_000;

/// The table name of the price for models not listed.
const DEFAULT: &str = "default";

/// Every `[prices.*]` table.
pub(super) fn check_prices(
    c: &mut Checker,
    path: &KeyPath,
    raw: &BTreeMap<String, RawPrice>,
) -> Prices {
    let mut prices = Prices::default();
    for (name, table) in raw {
        let price = check_price(c, &path.key(name), table);
        if name == DEFAULT {
            prices.default = Some(price);
        } else {
            prices.insert(name, price);
        }
    }
    prices
}

fn check_price(c: &mut Checker, path: &KeyPath, raw: &RawPrice) -> Price {
    let mut amount = |key: &str, value: Option<Amount>| -> Option<u64> {
        let value = value?;
        match value.millionths() {
            Ok(micros) if micros <= MAX_PER_MILLION_MICROS => Some(micros),
            _ => {
                c.problem(
                    path.key(key),
                    format!(
                        "`{value}` dollars per million tokens is more than $100,000: prices are per million tokens (gpt-4o's input is 2.50)"
                    ),
                );
                Some(0)
            }
        }
    };
    let input = amount("input", raw.input);
    let output = amount("output", raw.output);
    let cached_input = amount("cached_input", raw.cached_input);
    for (key, value) in [("input", input), ("output", output)] {
        // A key there but mistyped has its own problem already.
        if value.is_none() && !c.mistyped.contains(&path.key(key)) {
            c.problem(
                path.clone(),
                format!("needs `{key}` (dollars per million tokens, like {key} = 2.50)"),
            );
        }
    }
    let input = input.unwrap_or(0);
    Price {
        input,
        // Without its own price, a cached token costs what any input does.
        cached_input: cached_input.unwrap_or(input),
        output: output.unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;
    use crate::config::validate::errors;
    use crate::llm::price::Price;

    #[test]
    fn prices_are_micro_dollars_per_million_tokens() {
        let text = r#"
[prices."gpt-4o"]
input = 2.50
output = 10.00
cached_input = 1.25

[prices."gpt-4o-mini"]
input = 0.15
output = 0.6
cached_input = 0.075

[prices.default]
input = 5
output = 15
"#;
        let config = Config::from_bytes(Path::new("g.toml"), text.as_bytes()).unwrap();
        assert_eq!(
            config.prices.of(Some("gpt-4o")),
            Some(Price {
                input: 2_500_000,
                cached_input: 1_250_000,
                output: 10_000_000
            })
        );
        assert_eq!(
            config.prices.of(Some("gpt-4o-mini")),
            Some(Price {
                input: 150_000,
                cached_input: 75_000,
                output: 600_000
            })
        );
        // The default, its cached input priced as input.
        assert_eq!(
            config.prices.of(Some("claude")),
            Some(Price {
                input: 5_000_000,
                cached_input: 5_000_000,
                output: 15_000_000
            })
        );
    }

    #[test]
    fn bad_prices_are_refused_with_their_key() {
        let message = errors(
            "[prices.a]\ninput = -1\noutput = 1\n\n[prices.b]\ninput = 1\noutput = nan\n\n[prices.c]\ninput = 0.0000001\noutput = 1\n\n[prices.d]\ninput = 2500000\noutput = 1\n\n[prices.e]\ninput = 1\n\n[prices.f]\ninput = 1\noutput = 1\ncache = 1\n",
        );
        for expected in [
            "must not be negative",
            "is not a number",
            "more than six decimals",
            "`prices.d.input`: `2500000` dollars per million tokens is more than $100,000",
            "`prices.e`: needs `output`",
            "`prices.f.cache`: unknown key `cache`",
        ] {
            assert!(message.contains(expected), "{expected}: {message}");
        }
    }
}
