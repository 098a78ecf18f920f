//! Token quotas (`unit = "tokens"` on a limit, `tokens = { ... }` on a
//! route) and spend budgets (`unit = "usd"`, `warn_at`), checked into
//! [`Unit`], [`WarnAt`] and [`TokensRule`].
//!
//! A usd limit counts micro-dollars: its `limit`/`capacity` are dollars
//! (decimals allowed, read exactly) times 10⁶, its `refill` dollars per
//! period likewise; a request is charged its priced reservation and
//! settled from its priced usage (`llm::price`), so it needs the route's
//! `tokens` rule as a token limit does.
//!
//! A route's stack may mix request limits (charged the route's `cost`) and
//! token limits (charged the request's reservation, then settled from the
//! response's usage); a token limit on a route that does not say how a
//! request reserves is a config error, as is a token unit for an algorithm
//! that counts each unit on its own (`sliding_log`) or holds slots
//! (`concurrency`).

use http::HeaderName;
use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use crate::limit::Algorithm;

/// `tokens = { max_tokens_default = 1024, prompt = "bytes/4", usage = "auto" }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTokens {
    pub(crate) max_tokens_default: Option<u64>,
    pub(crate) prompt: Option<String>,
    pub(crate) usage: Option<String>,
    pub(crate) include_usage: Option<bool>,
}

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Unit {
    /// Requests, each charged the route's `cost`.
    #[default]
    Requests,
    /// LLM tokens: reserved at admission, settled from the response.
    Tokens,
    /// US dollars, counted in micro-dollars: the tokens' price, reserved
    /// and settled as tokens are.
    Usd,
}

impl Unit {
    /// The unit's name in answers (`"requests"`, `"tokens"`, `"usd"`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
            Unit::Usd => "usd",
        }
    }
}

/// Micro-dollars in a dollar.
pub(crate) const MICROS_PER_USD: u64 = 1_000_000;

/// Micro-dollars in a cent: a usd limit's `RateLimit` fields count whole
/// cents (`qu="usd-cents"`).
pub(crate) const MICROS_PER_CENT: u64 = 10_000;

/// A usd limit's `warn_at`, in hundredths of a percent of its quota
/// (`"80%"` is 8000; `"12.5%"` 1250).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WarnAt {
    pub(crate) basis_points: u32,
}

impl WarnAt {
    /// Whether `spent` of `quota` has reached the threshold, exactly.
    pub(crate) fn reached(self, spent: u64, quota: u64) -> bool {
        u128::from(spent) * 10_000 >= u128::from(self.basis_points) * u128::from(quota)
    }
}

/// The unit a limit's `unit` names, for reading its numbers (an unknown
/// name is reported by [`check_unit`]; its numbers are read as counts).
pub(super) fn unit_named(unit: Option<&str>) -> Unit {
    match unit {
        Some("tokens") => Unit::Tokens,
        Some("usd") => Unit::Usd,
        _ => Unit::Requests,
    }
}

/// A usd limit's refill of `rate.tokens` dollars per `rate.per` as
/// micro-dollars (saturating: validated rates are far below it).
pub(super) fn usd_rate(rate: crate::limit::Rate) -> crate::limit::Rate {
    let tokens = rate.tokens.saturating_mul(MICROS_PER_USD);
    let mut divisor = {
        let (mut a, mut b) = (tokens, rate.per);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    divisor = divisor.max(1);
    crate::limit::Rate {
        tokens: tokens / divisor,
        per: rate.per / divisor,
    }
}

/// `warn_at = "80%"`: a percentage above 0 and at most 100, two decimals
/// at most; only on a usd limit.
pub(super) fn check_warn_at(
    c: &mut Checker,
    path: &KeyPath,
    text: Option<&str>,
    unit: Unit,
) -> Option<WarnAt> {
    let text = text?;
    if unit != Unit::Usd {
        c.problem(
            path.key("warn_at"),
            "applies to spend budgets (unit = \"usd\") only",
        );
        return None;
    }
    let bad = || format!("`{text}` is not a percentage like \"80%\" (above 0, at most 100)");
    let Some(number) = text.trim().strip_suffix('%') else {
        c.problem(path.key("warn_at"), bad());
        return None;
    };
    match super::amount::Amount::parse(number).map(|a| a.millionths()) {
        // Percent in millionths: ÷ 100 for hundredths.
        Ok(Ok(millionths))
            if millionths > 0 && millionths <= 100_000_000 && millionths.is_multiple_of(10_000) =>
        {
            Some(WarnAt {
                basis_points: u32::try_from(millionths / 10_000).unwrap_or(10_000),
            })
        }
        _ => {
            c.problem(path.key("warn_at"), bad());
            None
        }
    }
}

/// How a request's prompt is estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PromptEstimate {
    /// A token per four bytes of the prompt's text.
    BytesOver4,
    /// The prompt's tokens in its model's BPE encoding, plus the chat
    /// formatting (`llm::tokenizer`).
    Tokenizer,
}

/// Where a response reports the tokens it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UsageSource {
    /// The body's `usage` (OpenAI or Anthropic, JSON or server-sent events).
    Auto,
    /// A response header holding the count.
    Header(HeaderName),
}

/// A route's `tokens = { ... }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokensRule {
    /// The completion budget of a body without `max_completion_tokens` or
    /// `max_tokens`.
    pub(crate) max_tokens_default: u64,
    pub(crate) prompt: PromptEstimate,
    pub(crate) usage: UsageSource,
    /// Streamed OpenAI requests without `stream_options.include_usage` get
    /// it, so that their stream ends with the usage.
    pub(crate) include_usage: bool,
}

/// The default completion budget of `max_tokens_default`.
pub(crate) const DEFAULT_MAX_TOKENS: u64 = 1024;

/// A limit's `unit`.
pub(super) fn check_unit(
    c: &mut Checker,
    path: &KeyPath,
    unit: Option<&str>,
    algorithm: &Algorithm,
) -> Unit {
    let unit = match unit {
        None => return Unit::Requests,
        Some(text) => match c.one_of(path.key("unit"), text, &["requests", "tokens", "usd"]) {
            Some("tokens") => Unit::Tokens,
            Some("usd") => Unit::Usd,
            _ => return Unit::Requests,
        },
    };
    let refused = match algorithm {
        Algorithm::SlidingLog { .. } => Some(
            "sliding_log keeps every unit's time: it cannot count tokens or dollars; use sliding_window or token_bucket",
        ),
        Algorithm::Concurrency { .. } => {
            Some("concurrency counts requests in flight, not tokens or dollars")
        }
        Algorithm::Adaptive { .. } => {
            Some("adaptive counts requests in flight, not tokens or dollars")
        }
        _ => None,
    };
    if let Some(reason) = refused {
        c.problem(path.key("unit"), reason);
    }
    unit
}

/// A route's `tokens` table.
pub(super) fn check_tokens_rule(c: &mut Checker, path: &KeyPath, raw: &RawTokens) -> TokensRule {
    let max_tokens_default = match raw.max_tokens_default {
        Some(0) => {
            c.problem(path.key("max_tokens_default"), "must be at least 1");
            DEFAULT_MAX_TOKENS
        }
        Some(n) => n,
        None => DEFAULT_MAX_TOKENS,
    };
    let prompt = match raw.prompt.as_deref() {
        None | Some("bytes/4") => PromptEstimate::BytesOver4,
        Some("tokenizer") => PromptEstimate::Tokenizer,
        Some(other) => {
            c.problem(
                path.key("prompt"),
                format!("unknown prompt estimate `{other}`, expected \"bytes/4\" or \"tokenizer\""),
            );
            PromptEstimate::BytesOver4
        }
    };
    let usage = match raw.usage.as_deref() {
        None | Some("auto") => UsageSource::Auto,
        Some(text) => match text.strip_prefix("header:") {
            Some(name) => c
                .header_name(path.key("usage"), name)
                .map_or(UsageSource::Auto, UsageSource::Header),
            None => {
                c.problem(
                    path.key("usage"),
                    format!("unknown usage source `{text}`, expected \"auto\" or \"header:NAME\""),
                );
                UsageSource::Auto
            }
        },
    };
    TokensRule {
        max_tokens_default,
        prompt,
        usage,
        include_usage: raw.include_usage.unwrap_or(false),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;
    use crate::config::routes::uses_tokenizer;

    fn config(prompt: &str) -> Result<Config, String> {
        let text = format!(
            r#"[upstreams.llm]
url = "http://127.0.0.1:9"

[limits.tpm]
key = "ip"
algorithm = "token_bucket"
capacity = 1000
refill = "1000/m"
unit = "tokens"

[[routes]]
name = "chat"
match = {{ path_prefix = "/" }}
upstream = "llm"
limits = ["tpm"]
tokens = {{ max_tokens_default = 10{prompt} }}
"#
        );
        Config::from_bytes(Path::new("gateway.toml"), text.as_bytes()).map_err(|e| e.to_string())
    }

    fn prompt(config: &Config) -> Option<PromptEstimate> {
        config.routes[0].tokens.as_ref().map(|rule| rule.prompt)
    }

    #[test]
    fn the_prompt_estimate_is_bytes_over_4_or_the_tokenizer() {
        let default = config("").unwrap();
        assert_eq!(prompt(&default), Some(PromptEstimate::BytesOver4));
        assert!(!uses_tokenizer(&default.routes));
        let bytes = config(r#", prompt = "bytes/4""#).unwrap();
        assert_eq!(prompt(&bytes), Some(PromptEstimate::BytesOver4));
        let tokenizer = config(r#", prompt = "tokenizer""#).unwrap();
        assert_eq!(prompt(&tokenizer), Some(PromptEstimate::Tokenizer));
        assert!(uses_tokenizer(&tokenizer.routes));
        let error = config(r#", prompt = "words""#).unwrap_err();
        assert!(
            error.contains("`routes[0].tokens.prompt`")
                && error.contains("expected \"bytes/4\" or \"tokenizer\""),
            "{error}"
        );
    }
}
