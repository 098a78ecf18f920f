//! What a request reserves on its stack's token limits (`unit = "tokens"`,
//! contract section 9), from its route's `tokens` rule and what was read of
//! its body: the one computation of every front, made in
//! [`super::admit_request`], so a trace is charged what the gateway would charge.

use crate::config::tokens::{PromptEstimate, TokensRule};
use crate::llm::reserve::{self, ReserveRule};

/// The tokens a request reserves under `rule`. `body`: the whole body, read
/// within `max_key_body` — its `max_completion_tokens` (else `max_tokens`,
/// else the default) plus its prompt's estimate. `None`: a body over
/// `max_key_body`, not read — the default plus a quarter of its `declared`
/// length (of `max_key_body` when it declared none).
pub(crate) fn reservation(
    rule: &TokensRule,
    body: Option<&[u8]>,
    declared: Option<u64>,
    max_key_body: usize,
) -> u64 {
    match body {
        Some(bytes) => reserve::reservation(bytes, &reserve_rule(rule)).total(),
        None => {
            let length = declared.unwrap_or(max_key_body as u64);
            rule.max_tokens_default.saturating_add(length.div_ceil(4))
        }
    }
}

/// As [`reservation`], with the body's `model` when it was read and
/// names one (for its usage event).
pub(crate) fn reservation_and_model(
    rule: &TokensRule,
    body: Option<&[u8]>,
    declared: Option<u64>,
    max_key_body: usize,
) -> (u64, Option<String>) {
    match body {
        Some(bytes) => {
            let reserved = reserve::reservation(bytes, &reserve_rule(rule));
            (reserved.total(), reserved.model)
        }
        None => (reservation(rule, None, declared, max_key_body), None),
    }
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
        assert_eq!(reservation(&rule(), Some(body), None, 1024), 43);
        // No budget in the body: the default.
        let body = br#"{"messages":[{"role":"user","content":"abcd"}]}"#;
        assert_eq!(reservation(&rule(), Some(body), Some(9999), 1024), 101);
    }

    #[test]
    fn a_body_over_the_cap_reserves_the_default_and_its_length() {
        assert_eq!(reservation(&rule(), None, Some(4001), 1024), 100 + 1001);
        assert_eq!(reservation(&rule(), None, None, 1024), 100 + 256);
        assert_eq!(
            reservation(
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
