//! Token quotas (`unit = "tokens"` on a limit, `tokens = { ... }` on a
//! route), checked into [`Unit`] and [`TokensRule`].
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
        Some(text) => match c.one_of(path.key("unit"), text, &["requests", "tokens"]) {
            Some("tokens") => Unit::Tokens,
            _ => return Unit::Requests,
        },
    };
    let refused = match algorithm {
        Algorithm::SlidingLog { .. } => Some(
            "sliding_log keeps every unit's time: it cannot count tokens; use sliding_window or token_bucket",
        ),
        Algorithm::Concurrency { .. } => Some("concurrency counts requests in flight, not tokens"),
        Algorithm::Adaptive { .. } => Some("adaptive counts requests in flight, not tokens"),
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
