//! What a request reserves on its stack's token limits (`unit = "tokens"`,
//! contract section 9), from its route's `tokens` rule and what was read of
//! its body: the one computation of every front, made in
//! [`super::admit_request`], so a trace is charged what the gateway would charge.

use crate::config::tokens::{PromptEstimate, TokensRule};
use crate::llm::price::{Price, Prices, reservation_micros};
use crate::llm::reserve::{self, ReserveRule};

/// The tokens a request reserves under `rule`, and the body's `model` when
/// it was read and names one (for its usage event). `body`: the whole body,
/// read within `max_key_body` — its `max_completion_tokens` (else
/// `max_tokens`, else the default) plus its prompt's estimate. `None`: a body
/// over `max_key_body`, not read — the default plus a quarter of its
/// `declared` length (of `max_key_body` when it declared none).
pub(crate) fn reservation(
    rule: &TokensRule,
    body: Option<&[u8]>,
    declared: Option<u64>,
    max_key_body: usize,
) -> (u64, Option<String>) {
    let (reservation, model) = reserved(rule, body, declared, max_key_body);
    (reservation.total(), model)
}

/// [`reservation`]'s parts, and the body's `model` (none for a body not
/// read).
fn reserved(
    rule: &TokensRule,
    body: Option<&[u8]>,
    declared: Option<u64>,
    max_key_body: usize,
) -> (reserve::Reservation, Option<String>) {
    match body {
        Some(bytes) => {
            let mut reservation = reserve::reservation(bytes, &reserve_rule(rule));
            let model = reservation.model.take();
            (reservation, model)
        }
        None => {
            let length = declared.unwrap_or(max_key_body as u64);
            let reservation = reserve::Reservation {
                completion: rule.max_tokens_default,
                prompt: length.div_ceil(4),
                streamed: false,
                model: None,
            };
            (reservation, None)
        }
    }
}

/// What a request of a route with a usd limit reserves: its tokens, and
/// their price at most (micro-dollars) under its model's price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Priced {
    pub(crate) tokens: u64,
    /// The prompt's estimate (a usage that reports only a total is priced
    /// as this much input, the rest output).
    pub(crate) prompt: u64,
    pub(crate) usd: u64,
    pub(crate) price: Price,
}

/// The request's model has no price and `[prices]` no default: refused
/// (400) before it goes upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Unpriced;

/// [`reservation`] priced by the body's `model` (`[prices."MODEL"]`, else
/// `[prices.default]`): prompt × input + completion × output, rounded up
/// to a micro-dollar (`llm::price`), with the model. A body not read has no
/// model: the default prices it.
pub(crate) fn priced_reservation(
    rule: &TokensRule,
    body: Option<&[u8]>,
    declared: Option<u64>,
    max_key_body: usize,
    prices: &Prices,
) -> Result<(Priced, Option<String>), Unpriced> {
    let (reservation, model) = reserved(rule, body, declared, max_key_body);
    let price = prices.of(model.as_deref()).ok_or(Unpriced)?;
    let priced = Priced {
        tokens: reservation.total(),
        prompt: reservation.prompt,
        usd: reservation_micros(&price, reservation.prompt, reservation.completion),
        price,
    };
    Ok((priced, model))
}

/// The configuration's rule in the `llm` vocabulary.
fn reserve_rule(rule: &TokensRule) -> ReserveRule {
    ReserveRule {
        max_tokens_default: rule.max_tokens_default,
        prompt: match rule.prompt {
            PromptEstimate::BytesOver4 => reserve::PromptEstimate::BytesOver4,
            PromptEstimate::Tokenizer => reserve::PromptEstimate::Tokenizer,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens_of(rule: &TokensRule, body: Option<&[u8]>, declared: Option<u64>, cap: usize) -> u64 {
        reservation(rule, body, declared, cap).0
    }

    fn priced_of(
        rule: &TokensRule,
        body: Option<&[u8]>,
        declared: Option<u64>,
        cap: usize,
        prices: &Prices,
    ) -> Result<Priced, Unpriced> {
        priced_reservation(rule, body, declared, cap, prices).map(|(priced, _)| priced)
    }
    use crate::config::tokens::UsageSource;

    fn rule() -> TokensRule {
        TokensRule {
            max_tokens_default: 100,
            prompt: PromptEstimate::BytesOver4,
            usage: UsageSource::Auto,
            include_usage: false,
        }
    }

    #[test]
    fn a_body_read_whole_reserves_its_budget_and_prompt() {
        // 9 bytes of message text: ceil(9 / 4) = 3.
        let body = br#"{"max_tokens":40,"messages":[{"role":"user","content":"abcdefghi"}]}"#;
        assert_eq!(tokens_of(&rule(), Some(body), None, 1024), 43);
        // No budget in the body: the default.
        let body = br#"{"messages":[{"role":"user","content":"abcd"}]}"#;
        assert_eq!(tokens_of(&rule(), Some(body), Some(9999), 1024), 101);
    }

    #[test]
    fn a_usd_reservation_prices_the_prompt_as_input_and_the_budget_as_output() {
        let mut prices = Prices::default();
        let price = Price {
            input: 2_500_000,
            cached_input: 1_250_000,
            output: 10_000_000,
        };
        prices.insert("gpt-4o", price);
        // 36 bytes of message text: 9 tokens; 40 of completion.
        let body = br#"{"model":"gpt-4o","max_tokens":40,"messages":[{"role":"user","content":"abcdefghijklmnopqrstuvwxyz0123456789"}]}"#;
        let priced = priced_of(&rule(), Some(body), None, 1024, &prices).unwrap();
        assert_eq!(
            priced,
            Priced {
                tokens: 49,
                prompt: 9,
                // 9 × 2.5 + 40 × 10 = 422.5 µ$, rounded up.
                usd: 423,
                price,
            }
        );
        let other = br#"{"model":"gpt-5","max_tokens":40}"#;
        assert_eq!(
            priced_of(&rule(), Some(other), None, 1024, &prices),
            Err(Unpriced)
        );
        // A body not read has no model: only a default prices it.
        assert_eq!(
            priced_of(&rule(), None, Some(40), 1024, &prices),
            Err(Unpriced)
        );
        prices.default = Some(price);
        let unread = priced_of(&rule(), None, Some(40), 1024, &prices).unwrap();
        assert_eq!((unread.tokens, unread.prompt, unread.usd), (110, 10, 1_025));
    }

    #[test]
    fn a_body_over_the_cap_reserves_the_default_and_its_length() {
        assert_eq!(tokens_of(&rule(), None, Some(4001), 1024), 100 + 1001);
        assert_eq!(tokens_of(&rule(), None, None, 1024), 100 + 256);
        assert_eq!(
            tokens_of(
                &TokensRule {
                    max_tokens_default: u64::MAX,
                    ..rule()
                },
                None,
                Some(8),
                1024
            ),
            u64::MAX,
            "saturates"
        );
    }
}
