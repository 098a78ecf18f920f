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
//! consumer, tenant, plan and priority claims): a cached token costs no
//! JSON walk.

use std::sync::Arc;

use http::HeaderMap;
use serde_json::{Map, Value};

use super::Failure;
use super::cache::{Cache, Known};
use super::jwks::KeySet;
use super::remote::{Early, RemoteKeys};
use super::token::{self, Token};
use super::verified::Verified;
use crate::config::jwt::{IssuerConfig, JwksUrl, JwtConfig, KeySource, TokenSource};
use crate::config::{Config, Consumer};
use crate::identity::consumer::bearer;
use crate::identity::keys::cookie_value;
use crate::limit::Priority;

/// Without a `kid`, at most this many keys are tried: a token cannot make
/// the gateway check every key of a large set.
const MAX_KEYS_TRIED: usize = 4;

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
    /// Every plan name a limit or `[plans]` defines, for the plan claim.
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
        mut remote: impl FnMut(&IssuerConfig, &JwksUrl) -> Arc<RemoteKeys>,
    ) -> Verifier {
        let issuers: Vec<Issuer> = jwt
            .issuers
            .iter()
            .map(|issuer| Issuer {
                keys: match &issuer.keys {
                    KeySource::Static(keys) => Keys::Static(keys.clone()),
                    KeySource::Url(jwks) => Keys::Remote(remote(issuer, jwks)),
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
        let named = config.limits.iter().flat_map(|limit| limit.plans.iter());
        for name in named
            .map(|(name, _)| name)
            .chain(config.plans.iter().map(|p| &p.name))
        {
            if !plans.iter().any(|p| p == name) {
                plans.push(name.clone());
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
        match self.cache.get(token, secs) {
            Some(Known::Valid(identity)) => return Ok(identity),
            Some(Known::Refused { issuer, failure }) => {
                return Err(Refusal {
                    issuer: Some(issuer),
                    failure,
                });
            }
            None => {}
        }
        let result = self.check(token, secs);
        match &result {
            Ok(identity) => {
                verified(Some(identity.issuer), Ok(()));
                self.cache.insert(token, identity.clone(), secs);
            }
            Err(refusal) => {
                verified(refusal.issuer, Err(refusal.failure));
                if let (Some(issuer), Failure::Expired | Failure::WrongAudience) =
                    (refusal.issuer, refusal.failure)
                {
                    // Signed by the issuer, refused for claims that will
                    // not change (not `nbf`: that one comes true).
                    self.cache
                        .insert_refusal(token, issuer, refusal.failure, secs);
                }
            }
        }
        result
    }

    /// Whether a token refused for an unknown `kid` of a `jwks_url` issuer
    /// should wait for that issuer's keys and be verified again (an early
    /// refresh granted now, or the one under way); `false` where no refresh
    /// may help (another kind of refusal, static keys, or one was had
    /// within the issuer's `refresh` interval).
    pub(crate) fn may_refresh(&self, refusal: &Refusal, now: u64) -> bool {
        refusal.failure == Failure::UnknownKey
            && refusal
                .issuer
                .and_then(|issuer| self.remote(issuer))
                .is_some_and(|remote| remote.ask_early(now) == Early::Wait)
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
        let exp = times(&token.claims, now, config.leeway).map_err(refuse)?;
        audience(&token.claims, &config.audiences).map_err(refuse)?;
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
            priority: None,
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
            // A value that names no priority is ignored, as an absent claim.
            priority: text_of(&config.priority_claim).and_then(|text| Priority::parse(&text)),
        }))
    }
}

/// The token in `source`, if the request has one there.
fn token_in<'h>(headers: &'h HeaderMap, source: &TokenSource) -> Option<&'h str> {
    let token = match source {
        TokenSource::Bearer => bearer(headers)?,
        // Bytes and `from_utf8`, as `bearer` reads them (a word at a time).
        TokenSource::Header(name) => {
            std::str::from_utf8(headers.get(name)?.as_bytes().trim_ascii()).ok()?
        }
        TokenSource::Cookie(name) => std::str::from_utf8(cookie_value(headers, name)?).ok()?,
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

/// `exp` (required), `nbf`, `iat` against `now` with `leeway`, in seconds;
/// `Ok` is the token's `exp`.
fn times(claims: &Map<String, Value>, now: u64, leeway: u64) -> Result<u64, Failure> {
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
    Ok(exp)
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use ring::hmac;

    use super::*;
    use http::header::{AUTHORIZATION, COOKIE};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NS: u64 = 1_000_000_000;

    fn verifier(issuer_lines: &str) -> (Config, Verifier) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("secret"), SECRET).unwrap();
        let text = format!(
            "[jwt]\n[[jwt.issuers]]\nissuer = \"iss-a\"\nsecret_file = \"secret\"\n{issuer_lines}\n\n[limits.l]\nkey = [\"jwt:sub\", \"jwt:org.id\", \"jwt:n\"]\nalgorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\nplans = {{ pro = {{ limit = 2 }} }}\n"
        );
        let path = dir.path().join("gateway.toml");
        let config = Config::from_bytes(Path::new(&path), text.as_bytes()).unwrap();
        let jwt = config.jwt.clone().unwrap();
        let verifier = Verifier::new(&config, &jwt, |_, _| unreachable!("no jwks_url"));
        (config, verifier)
    }

    fn sign(header: &str, claims: &str) -> String {
        let signing = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims)
        );
        let tag = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, SECRET),
            signing.as_bytes(),
        );
        format!("{signing}.{}", URL_SAFE_NO_PAD.encode(tag))
    }

    fn check(verifier: &Verifier, claims: &str, now: u64) -> Result<Arc<Verified>, Failure> {
        let token = sign(r#"{"alg":"HS256"}"#, claims);
        verifier
            .verify(&token, now * NS, |_, _| {})
            .map_err(|r| r.failure)
    }

    #[test]
    fn times_are_exact_within_the_leeway() {
        let (_, v) = verifier("leeway = \"10s\"");
        let claims = r#"{"iss":"iss-a","exp":1000,"nbf":500,"iat":400}"#;
        assert!(check(&v, claims, 1009).is_ok());
        // A fresh verifier each time: the cache would answer otherwise.
        let (_, v) = verifier("leeway = \"10s\"");
        assert_eq!(check(&v, claims, 1010).unwrap_err(), Failure::Expired);
        let (_, v) = verifier("leeway = \"10s\"");
        assert!(check(&v, claims, 490).is_ok());
        let (_, v) = verifier("leeway = \"10s\"");
        assert!(matches!(
            check(&v, claims, 489),
            Err(Failure::NotYetValid(_))
        ));
        let iat_ahead = r#"{"iss":"iss-a","exp":1000,"iat":700}"#;
        assert_eq!(
            check(&v, iat_ahead, 600).unwrap_err(),
            Failure::NotYetValid("the token was issued in the future")
        );
        for bad in [
            r#"{"iss":"iss-a"}"#,
            r#"{"iss":"iss-a","exp":"1000"}"#,
            r#"{"iss":"iss-a","exp":-5}"#,
        ] {
            assert!(
                matches!(check(&v, bad, 1), Err(Failure::Malformed(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_cached_token_expires_with_its_exp() {
        let (_, v) = verifier("leeway = \"0s\"");
        let token = sign(r#"{"alg":"HS256"}"#, r#"{"iss":"iss-a","exp":100}"#);
        let verified = std::cell::Cell::new(0);
        let count = |_: Option<usize>, _: Result<(), Failure>| verified.set(verified.get() + 1);
        let at = |secs: u64| v.verify(&token, secs * NS, count).map_err(|r| r.failure);
        assert!(at(10).is_ok());
        assert!(at(99).is_ok());
        assert_eq!(verified.get(), 1, "the second request was a cache hit");
        assert_eq!(at(100).unwrap_err(), Failure::Expired);
        // Signed, refused for its claims: the refusal is kept too.
        assert_eq!(at(101).unwrap_err(), Failure::Expired);
        assert_eq!(
            verified.get(),
            2,
            "the expired token was not verified again"
        );
    }

    #[test]
    fn issuer_audience_and_algorithm() {
        let (_, v) = verifier("audiences = [\"api\", \"web\"]");
        let with = |claims: &str| check(&v, claims, 1);
        assert!(with(r#"{"iss":"iss-a","exp":99,"aud":"web"}"#).is_ok());
        assert!(with(r#"{"iss":"iss-a","exp":99,"aud":["x","api"]}"#).is_ok());
        for (claims, failure) in [
            (
                r#"{"iss":"iss-a","exp":99,"aud":"x"}"#,
                Failure::WrongAudience,
            ),
            (r#"{"iss":"iss-a","exp":99}"#, Failure::WrongAudience),
            (
                r#"{"iss":"iss-b","exp":99,"aud":"api"}"#,
                Failure::WrongIssuer,
            ),
            (r#"{"exp":99,"aud":"api"}"#, Failure::WrongIssuer),
        ] {
            assert_eq!(with(claims).unwrap_err(), failure, "{claims}");
        }
        let hs384 = sign(
            r#"{"alg":"HS384"}"#,
            r#"{"iss":"iss-a","exp":99,"aud":"api"}"#,
        );
        assert!(matches!(
            v.verify(&hs384, NS, |_, _| {}).unwrap_err().failure,
            Failure::BadSignature("the token's algorithm is not accepted")
        ));
        let forged = format!(
            "{}x",
            &sign(
                r#"{"alg":"HS256"}"#,
                r#"{"iss":"iss-a","exp":99,"aud":"api"}"#
            )[..]
        );
        assert!(matches!(
            v.verify(&forged, NS, |_, _| {}).unwrap_err().failure,
            Failure::BadSignature(_) | Failure::Malformed(_)
        ));
    }

    #[test]
    fn claims_become_key_values_consumer_and_plan() {
        let (_, v) =
            verifier("consumer_claim = \"sub\"\ntenant_claim = \"org.id\"\nplan_claim = \"tier\"");
        let verified = check(
            &v,
            r#"{"iss":"iss-a","exp":99,"sub":"alice","org":{"id":42},"n":true,"tier":"pro"}"#,
            1,
        )
        .unwrap();
        assert_eq!(verified.claim(0), Some(&b"alice"[..]));
        assert_eq!(verified.claim(1), Some(&b"42"[..]));
        assert_eq!(verified.claim(2), Some(&b"true"[..]));
        let consumer = verified.consumer.as_ref().unwrap();
        assert_eq!(&*consumer.consumer, "alice");
        assert_eq!(consumer.tenant.as_deref(), Some("42"));
        assert_eq!(v.plan(&verified), Some("pro"));
        // A plan no limit defines, objects and empty strings: nothing.
        let other = check(
            &v,
            r#"{"iss":"iss-a","exp":99,"sub":"","org":{"id":{}},"tier":"gold"}"#,
            1,
        )
        .unwrap();
        assert_eq!(other.claim(0), None);
        assert_eq!(other.claim(1), None);
        assert!(other.consumer.is_none());
        assert_eq!(v.plan(&other), None);
        // A top-level claim named with a dot wins over the nested path.
        let dotted = check(
            &v,
            r#"{"iss":"iss-a","exp":99,"org.id":"flat","org":{"id":"nested"}}"#,
            1,
        )
        .unwrap();
        assert_eq!(dotted.claim(1), Some(&b"flat"[..]));
    }

    #[test]
    fn the_priority_claim_names_a_priority_or_nothing() {
        let (_, v) =
            verifier("plan_claim = \"tier\"\npriority_claim = \"ops.prio\"\n[plans.batch]");
        let priority = |claims: &str| check(&v, claims, 1).unwrap().priority;
        assert_eq!(
            priority(r#"{"iss":"iss-a","exp":99,"ops":{"prio":"critical"}}"#),
            Some(Priority::Critical)
        );
        assert_eq!(
            priority(r#"{"iss":"iss-a","exp":99,"ops":{"prio":"sheddable"}}"#),
            Some(Priority::Sheddable)
        );
        // Another value, another type, or none: ignored.
        for claims in [
            r#"{"iss":"iss-a","exp":99,"ops":{"prio":"urgent"}}"#,
            r#"{"iss":"iss-a","exp":99,"ops":{"prio":"Critical"}}"#,
            r#"{"iss":"iss-a","exp":99,"ops":{"prio":1}}"#,
            r#"{"iss":"iss-a","exp":99,"ops":{"prio":{}}}"#,
            r#"{"iss":"iss-a","exp":99}"#,
        ] {
            assert_eq!(priority(claims), None, "{claims}");
        }
        // A plan only `[plans]` names is a plan the claim can name.
        let batch = check(&v, r#"{"iss":"iss-a","exp":99,"tier":"batch"}"#, 1).unwrap();
        assert_eq!(v.plan(&batch), Some("batch"));
    }

    #[test]
    fn tokens_are_found_where_configured() {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, "bearer  abc ".parse().unwrap());
        assert_eq!(token_in(&headers, &TokenSource::Bearer), Some("abc"));
        headers.insert(AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(token_in(&headers, &TokenSource::Bearer), None);
        headers.insert(COOKIE, "a=1; sid=tok; b=2".parse().unwrap());
        assert_eq!(
            token_in(&headers, &TokenSource::Cookie("sid".into())),
            Some("tok")
        );
        assert_eq!(token_in(&headers, &TokenSource::Cookie("si".into())), None);
        headers.insert("x-token", " t ".parse().unwrap());
        let header = TokenSource::Header(http::HeaderName::from_static("x-token"));
        assert_eq!(token_in(&headers, &header), Some("t"));
    }
}
