//! [`Verifier`]: one configuration's issuers, checking a token into a
//! [`Verified`] identity — or saying which rule it broke.
//!
//! Order of the checks: the token's form, its issuer (`iss`, one of the
//! configured ones), its algorithm (in the issuer's list), its key (by
//! `kid`, of a type that fits the algorithm), the signature; only a token
//! whose signature verifies has its times (`exp`, required; `nbf`, `iat`;
//! each within the issuer's leeway) and its `aud` looked at, so a forged
//! token learns nothing about the claims it would need.
//!
//! A verified token's claims are read once, into the values the
//! configuration needs (each `jwt:CLAIM` path a limit keys on, and the
//! consumer, tenant and plan claims): a cached token costs no JSON walk.

use std::sync::Arc;

use http::HeaderMap;
use http::header::{AUTHORIZATION, COOKIE};
use serde_json::{Map, Value};

use super::Failure;
use super::cache::Cache;
use super::jwks::KeySet;
use super::remote::{Early, RemoteKeys};
use super::token::{self, Token};
use crate::config::jwt::{IssuerConfig, JwtConfig, KeySource, TokenSource};
use crate::config::{Config, Consumer};

/// Without a `kid`, at most this many keys are tried: a token cannot make
/// the gateway check every key of a large set.
const MAX_KEYS_TRIED: usize = 4;

/// A token that verified: what the request's limits need from it.
#[derive(Debug)]
pub struct Verified {
    /// Index of its issuer in the configuration.
    pub(crate) issuer: usize,
    /// Unix second from which it is no longer valid (`exp` + leeway).
    pub(crate) expires: u64,
    /// The value of each configured claim path, by slot; `None` where the
    /// token lacks it (or it is an object, an array or null).
    values: Box<[Option<Box<[u8]>>]>,
    /// From `consumer_claim` / `tenant_claim` / `plan_claim`.
    pub(crate) consumer: Option<Consumer>,
    /// The plan claim's value, as one of the configuration's plan names.
    plan: Option<usize>,
}

impl Verified {
    /// The value of claim slot `slot` (a `jwt:CLAIM` key part).
    #[inline]
    pub(crate) fn claim(&self, slot: usize) -> Option<&[u8]> {
        self.values.get(slot)?.as_deref()
    }

    #[cfg(test)]
    pub(crate) fn for_test(expires: u64) -> Verified {
        Verified {
            issuer: 0,
            expires,
            values: Box::new([]),
            consumer: None,
            plan: None,
        }
    }
}

/// An issuer with its keys at hand.
#[derive(Debug)]
struct Issuer {
    config: IssuerConfig,
    keys: Keys,
}

#[derive(Debug)]
enum Keys {
    Static(Arc<KeySet>),
    Remote(Arc<RemoteKeys>),
}

/// Why [`Verifier::verify`] refused, with the issuer when one was found
/// (for the metric's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) issuer: Option<usize>,
    pub(crate) failure: Failure,
}

/// One configuration's token verification.
#[derive(Debug)]
pub(crate) struct Verifier {
    issuers: Vec<Issuer>,
    /// Where tokens are looked for, each place once, in the issuers' order.
    sources: Vec<TokenSource>,
    claim_paths: Vec<Arc<str>>,
    /// Every plan name a limit defines, for the plan claim.
    plans: Vec<Arc<str>>,
    cache: Cache,
    /// The issuer label of a token that named no configured issuer.
    none: Arc<str>,
}

impl Verifier {
    /// The verifier of `config`'s `[jwt]`; `remote` gives the shared keys
    /// of a `jwks_url` (they outlive a configuration).
    pub(crate) fn new(
        config: &Config,
        jwt: &JwtConfig,
        mut remote: impl FnMut(&IssuerConfig) -> Arc<RemoteKeys>,
    ) -> Verifier {
        let issuers: Vec<Issuer> = jwt
            .issuers
            .iter()
            .map(|issuer| Issuer {
                keys: match &issuer.keys {
                    KeySource::Static(keys) => Keys::Static(keys.clone()),
                    KeySource::Url { .. } => Keys::Remote(remote(issuer)),
                },
                config: issuer.clone(),
            })
            .collect();
        let mut sources: Vec<TokenSource> = Vec::new();
        for issuer in &issuers {
            if !sources.contains(&issuer.config.source) {
                sources.push(issuer.config.source.clone());
            }
        }
        let mut plans: Vec<Arc<str>> = Vec::new();
        for limit in &config.limits {
            for (name, _) in &limit.plans {
                if !plans.iter().any(|p| p == name) {
                    plans.push(name.clone());
                }
            }
        }
        Verifier {
            issuers,
            sources,
            claim_paths: jwt.claim_paths.clone(),
            plans,
            cache: Cache::new(jwt.cache_size),
            none: Arc::from("none"),
        }
    }

    /// The metric label of an issuer: its `issuer` string, or `none`.
    pub(crate) fn issuer_label(&self, index: Option<usize>) -> &Arc<str> {
        index.map_or(&self.none, |i| &self.issuers[i].config.issuer)
    }

    /// The token the request carries, from the first configured place that
    /// has one.
    pub(crate) fn token<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        self.sources
            .iter()
            .find_map(|source| token_in(headers, source))
    }

    /// The caller's plan from a verified token, as a configured plan name.
    pub(crate) fn plan<'s>(&'s self, verified: &Verified) -> Option<&'s str> {
        verified.plan.map(|index| &*self.plans[index])
    }

    /// The `jwks_url` keys of the issuer at `index`, when it has them.
    pub(crate) fn remote(&self, index: usize) -> Option<&Arc<RemoteKeys>> {
        match &self.issuers[index].keys {
            Keys::Remote(remote) => Some(remote),
            Keys::Static(_) => None,
        }
    }

    /// `token` checked at `now` (ns since the Unix epoch): from the cache,
    /// or verified (and then cached). `verified` is told of each real
    /// verification (issuer and result), for the metrics.
    pub(crate) fn verify(
        &self,
        token: &str,
        now: u64,
        mut verified: impl FnMut(Option<usize>, Result<(), Failure>),
    ) -> Result<Arc<Verified>, Refusal> {
        let secs = now / 1_000_000_000;
        if let Some(hit) = self.cache.get(token, secs) {
            return Ok(hit);
        }
        let result = self.check(token, secs);
        match &result {
            Ok(identity) => {
                verified(Some(identity.issuer), Ok(()));
                self.cache.insert(token, identity.clone(), secs);
            }
            Err(refusal) => verified(refusal.issuer, Err(refusal.failure)),
        }
        result
    }

    /// For a token refused for an unknown `kid` of a `jwks_url` issuer:
    /// the keys to wait for before verifying again (an early refresh
    /// granted now, or the one under way); `None` when no refresh may help
    /// (another kind of refusal, static keys, or one was had within the
    /// issuer's `refresh` interval).
    pub(crate) fn refresh_for(&self, refusal: &Refusal, now: u64) -> Option<Arc<RemoteKeys>> {
        if refusal.failure != Failure::UnknownKey {
            return None;
        }
        let remote = self.remote(refusal.issuer?)?;
        (remote.ask_early(now) == Early::Wait).then(|| remote.clone())
    }

    fn check(&self, text: &str, now: u64) -> Result<Arc<Verified>, Refusal> {
        let refuse = |issuer, failure| Refusal { issuer, failure };
        let token = token::parse(text).map_err(|f| refuse(None, f))?;
        let index = match token.claims.get("iss") {
            Some(Value::String(iss)) => self
                .issuers
                .iter()
                .position(|issuer| *issuer.config.issuer == **iss),
            _ => None,
        }
        .ok_or(refuse(None, Failure::WrongIssuer))?;
        let issuer = &self.issuers[index];
        let refuse = |failure| refuse(Some(index), failure);
        if !issuer.config.algorithms.contains(&token.alg) {
            return Err(refuse(Failure::BadSignature(
                "the token's algorithm is not accepted",
            )));
        }
        let keys = match &issuer.keys {
            Keys::Static(keys) => Some(keys.clone()),
            Keys::Remote(remote) => remote.keys(),
        }
        .ok_or(refuse(Failure::UnknownKey))?;
        signature(&keys, &token).map_err(refuse)?;
        let config = &issuer.config;
        times(&token.claims, now, config.leeway).map_err(refuse)?;
        audience(&token.claims, &config.audiences).map_err(refuse)?;
        let exp = numeric(&token.claims, "exp").ok().flatten().unwrap_or(0);
        let claims = &token.claims;
        let text_of = |path: &Option<Arc<str>>| {
            let value = value_bytes(lookup(claims, path.as_deref()?)?)?;
            Some(Arc::<str>::from(String::from_utf8(value.into_vec()).ok()?))
        };
        let plan_value = text_of(&config.plan_claim);
        let consumer = text_of(&config.consumer_claim).map(|name| Consumer {
            consumer: name,
            tenant: text_of(&config.tenant_claim),
            plan: plan_value.clone(),
        });
        Ok(Arc::new(Verified {
            issuer: index,
            expires: exp.saturating_add(config.leeway),
            values: self
                .claim_paths
                .iter()
                .map(|path| lookup(claims, path).and_then(value_bytes))
                .collect(),
            consumer,
            plan: plan_value.and_then(|plan| self.plans.iter().position(|p| *p == plan)),
        }))
    }
}

/// The token in `source`, if the request has one there.
fn token_in<'h>(headers: &'h HeaderMap, source: &TokenSource) -> Option<&'h str> {
    let token = match source {
        TokenSource::Bearer => {
            let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
            let (scheme, token) = value.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim())?
        }
        TokenSource::Header(name) => headers.get(name)?.to_str().ok()?.trim(),
        TokenSource::Cookie(name) => headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|pair| {
                let (key, value) = pair.trim().split_once('=')?;
                (key == name).then_some(value)
            })?,
    };
    (!token.is_empty()).then_some(token)
}

/// The signature checked with the key the token names (or, without a
/// `kid`, the first few whose type fits). `pub` for the fuzz target
/// (`fuzz/fuzz_targets/jwt_token.rs`), which checks that a token verifies
/// exactly when the key it names signed it.
pub fn signature(keys: &KeySet, token: &Token<'_>) -> Result<(), Failure> {
    let mut fitting = 0;
    let mut named = false;
    for key in keys.candidates(token.kid.as_deref()) {
        named = true;
        if !key.fits(token.alg) {
            continue;
        }
        fitting += 1;
        if fitting > MAX_KEYS_TRIED {
            break;
        }
        if key.verifies(token.alg, token.signing_input, &token.signature) {
            return Ok(());
        }
    }
    match (named, fitting) {
        (false, _) => Err(Failure::UnknownKey),
        (true, 0) if token.kid.is_some() => Err(Failure::BadSignature(
            "the token's algorithm does not fit its key",
        )),
        (true, 0) => Err(Failure::UnknownKey),
        _ => Err(Failure::BadSignature(
            "the token's signature does not verify",
        )),
    }
}

/// `exp` (required), `nbf`, `iat` against `now` with `leeway`, in seconds.
fn times(claims: &Map<String, Value>, now: u64, leeway: u64) -> Result<(), Failure> {
    let malformed = |_| Failure::Malformed("a time claim of the token is not a number");
    let exp = numeric(claims, "exp")
        .map_err(malformed)?
        .ok_or(Failure::Malformed(
            "the token has no `exp`: it would never expire",
        ))?;
    if now >= exp.saturating_add(leeway) {
        return Err(Failure::Expired);
    }
    if let Some(nbf) = numeric(claims, "nbf").map_err(malformed)?
        && now.saturating_add(leeway) < nbf
    {
        return Err(Failure::NotYetValid("the token is not valid yet"));
    }
    if let Some(iat) = numeric(claims, "iat").map_err(malformed)?
        && now.saturating_add(leeway) < iat
    {
        return Err(Failure::NotYetValid("the token was issued in the future"));
    }
    Ok(())
}

/// A NumericDate claim, in whole seconds; `Err` when present and not a
/// non-negative number.
fn numeric(claims: &Map<String, Value>, name: &str) -> Result<Option<u64>, ()> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(secs), _) => Ok(Some(secs)),
            (None, Some(f)) if f >= 0.0 && f.is_finite() => Ok(Some(f as u64)),
            _ => Err(()),
        },
        Some(_) => Err(()),
    }
}

/// `aud` (a string or an array of them) holds one of `audiences`, when
/// the issuer names any.
fn audience(claims: &Map<String, Value>, audiences: &[String]) -> Result<(), Failure> {
    if audiences.is_empty() {
        return Ok(());
    }
    let accepted = |value: &Value| {
        value
            .as_str()
            .is_some_and(|a| audiences.iter().any(|x| x == a))
    };
    let ok = match claims.get("aud") {
        Some(Value::Array(values)) => values.iter().any(accepted),
        Some(value) => accepted(value),
        None => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Failure::WrongAudience)
    }
}

/// The claim at a dotted `path` (`org.id`): a top-level claim of that
/// exact name first (URL-like claim names hold dots), else the nested one.
pub(crate) fn lookup<'c>(claims: &'c Map<String, Value>, path: &str) -> Option<&'c Value> {
    if let Some(value) = claims.get(path) {
        return Some(value);
    }
    let mut segments = path.split('.');
    let mut value = claims.get(segments.next()?)?;
    for segment in segments {
        value = value.as_object()?.get(segment)?;
    }
    Some(value)
}

/// A claim's bytes as a key part: a string's text, a number's or a
/// boolean's JSON form; nothing for null, objects and arrays.
fn value_bytes(value: &Value) -> Option<Box<[u8]>> {
    match value {
        Value::String(text) if !text.is_empty() => Some(text.as_bytes().into()),
        Value::Number(n) => Some(n.to_string().into_bytes().into()),
        Value::Bool(b) => Some(b.to_string().into_bytes().into()),
        _ => None,
    }
}
