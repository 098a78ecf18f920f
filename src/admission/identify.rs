//! Who is calling: the steps before the limits that every caller of
//! admission runs the same way (the proxy on a live request, `simulate` on
//! a trace record, the decision service on a described one) — the
//! caller's verified token and consumer (its claims' or its API
//! key's), the client IP behind trusted
//! proxies, the body's fields for `body:FIELD` keys, and the request's
//! priority ([`Identity::priority`]).

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use http::header::CONTENT_TYPE;
use ipnet::IpNet;

use crate::app::{App, Snapshot};
use crate::config::plans::plan_priority;
use crate::config::{Config, Consumer, RouteConfig};
use crate::identity::body_fields::BodyFields;
use crate::identity::client_ip::{client_net, resolve_with};
use crate::identity::consumer;
use crate::identity::jwt::verify::Refusal;
use crate::identity::jwt::{Failure, Verified, Verifier};
use crate::limit::{Nanos, Priority};

/// What is known of the caller when its limits decide.
#[derive(Debug, Clone, Copy)]
pub struct Identity<'r, 's> {
    /// The client after trusted-proxy resolution ([`client_ip`]).
    pub client_ip: IpAddr,
    /// The consumer its token's claims or API key map to ([`caller`]).
    pub consumer: Option<&'r Consumer>,
    /// The caller's plan, as a plan name of the configuration.
    pub plan: Option<&'s str>,
    /// Its verified token, for `jwt:CLAIM` keys.
    pub token: Option<&'r Verified>,
    /// The body's top-level fields, when a limit keys on them and the body
    /// was read whole within `max_key_body` ([`body_fields`]).
    pub body: Option<&'r BodyFields>,
}

impl<'r, 's> Identity<'r, 's> {
    /// The identity of a caller known by its API key alone (or by nothing).
    pub fn of_consumer(
        client_ip: IpAddr,
        consumer: Option<&'s Consumer>,
        body: Option<&'r BodyFields>,
    ) -> Identity<'r, 's>
    where
        's: 'r,
    {
        Identity {
            client_ip,
            consumer,
            plan: consumer.and_then(|c| c.plan.as_deref()),
            token: None,
            body,
        }
    }

    /// The request's priority at slot limits: the most specific that names
    /// one of its consumer's `priority` (an API key's consumer), its
    /// token's `priority_claim`, its plan's (`[plans.NAME]`), its route's
    /// (default `normal`). A caller's own setting wins over its plan's, as
    /// a plan's wins over the route's every caller shares.
    /// Spelled out as tests: `Option::or_else` with its closures stayed a
    /// call (~23 instructions a request, `bench/instructions.sh`), and a
    /// caller without a plan looks at no plan.
    #[inline(always)]
    pub(crate) fn priority(&self, config: &Config, route: &RouteConfig) -> Priority {
        if let Some(priority) = self.consumer.and_then(|c| c.priority) {
            return priority;
        }
        if let Some(priority) = self.token.and_then(|t| t.priority) {
            return priority;
        }
        if self.plan.is_some()
            && let Some(priority) = plan_priority(&config.plans, self.plan)
        {
            return priority;
        }
        route.priority
    }

    /// The client's network as its keys see it (the configured prefix).
    #[inline(always)]
    pub(crate) fn client_net(&self, snapshot: &Snapshot) -> IpNet {
        client_net(self.client_ip, &snapshot.client_ip)
    }
}

/// Who the request says is calling: the consumer of its API key and its
/// verified token.
#[derive(Debug, Default)]
pub struct Caller<'s> {
    api_consumer: Option<&'s Consumer>,
    token: Option<Arc<Verified>>,
}

impl<'s> Caller<'s> {
    /// The caller as its limits see it. A verified token with a consumer
    /// claim names the consumer (it is the stronger proof); else the API
    /// key's. The plan is the token's plan claim where it names one of the
    /// configuration's plans, else the chosen consumer's.
    // Always inlined, as the rest of keying a request (out of line in
    // the proxy's request future, each was a call, ~25 instructions).
    #[inline(always)]
    pub fn identity<'r>(
        &'r self,
        snapshot: &'s Snapshot,
        client_ip: IpAddr,
        body: Option<&'r BodyFields>,
    ) -> Identity<'r, 's>
    where
        's: 'r,
    {
        let token = self.token.as_deref();
        let api = Identity {
            token,
            ..Identity::of_consumer(client_ip, self.api_consumer, body)
        };
        let (Some(verified), Some(verifier)) = (token, &snapshot.jwt) else {
            return api;
        };
        let plan = verifier.plan(verified);
        match &verified.consumer {
            Some(consumer) => Identity {
                consumer: Some(consumer),
                plan,
                ..api
            },
            None => Identity {
                plan: plan.or(api.plan),
                ..api
            },
        }
    }

    /// The consumer its API key maps to.
    pub fn api_consumer(&self) -> Option<&'s Consumer> {
        self.api_consumer
    }
}

/// Why a request is answered 401 before its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unidentified {
    /// Its API key: none on a `require_consumer` route, or an unknown one
    /// where unknown keys are refused.
    ApiKey(&'static str),
    /// Its token, on a `require_jwt` route: `None` when it has none.
    Token(Option<Failure>),
    /// Its token names a key its `jwks_url` issuer (at `issuer`) may just
    /// have published: wait for that issuer's keys to refresh, then
    /// identify again ([`caller_refreshed`]).
    Refresh { issuer: usize },
}

/// The caller: the token verified (at `now`, ns since the epoch), the API
/// key looked up; `Err` where the route or the configuration demands what
/// the request does not carry. An invalid token on a route without
/// `require_jwt` is no token. Always inlined, with `caller_with`: see
/// there.
#[inline(always)]
pub fn caller<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    headers: &HeaderMap,
    now: Nanos,
) -> Result<Caller<'s>, Unidentified> {
    caller_with(app, snapshot, route, headers, now, true)
}

/// [`caller`] after an [`Unidentified::Refresh`]: waits for the issuer's
/// keys (at most a couple of seconds), then identifies again, without
/// asking for another refresh.
pub async fn caller_refreshed<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    headers: &HeaderMap,
    now: Nanos,
    issuer: usize,
) -> Result<Caller<'s>, Unidentified> {
    if let Some(remote) = snapshot.jwt.as_ref().and_then(|v| v.remote(issuer)) {
        remote.wait_for_fetch().await;
    }
    caller_with(app, snapshot, route, headers, now, false)
}

/// Always inlined: without `[jwt]` (most gateways) it is the API key's
/// look-up alone; out of line, with the token's verification in its
/// frame, it was a call of ~40 instructions a request, ~17 of them left
/// inlined (`bench/instructions.sh`). A token is verified out of line.
#[inline(always)]
fn caller_with<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    route: &RouteConfig,
    headers: &HeaderMap,
    now: Nanos,
    may_refresh: bool,
) -> Result<Caller<'s>, Unidentified> {
    let token = match &snapshot.jwt {
        None => None,
        Some(verifier) => verified_token(app, verifier, route, headers, now, may_refresh)?,
    };
    // A route that requires a consumer is served by a token's consumer too.
    let token_consumer = token.as_ref().is_some_and(|t| t.consumer.is_some());
    let api_consumer = consumer::admit(
        headers,
        &snapshot.config,
        route.require_consumer && !token_consumer,
    )
    .map_err(Unidentified::ApiKey)?;
    Ok(Caller {
        api_consumer,
        token,
    })
}

/// The request's token, verified: `None` without one, or with one that is
/// not valid on a route that does not require it.
#[inline(never)]
fn verified_token(
    app: &App,
    verifier: &Verifier,
    route: &RouteConfig,
    headers: &HeaderMap,
    now: Nanos,
    may_refresh: bool,
) -> Result<Option<Arc<Verified>>, Unidentified> {
    Ok(match verifier.token(headers) {
        None if route.require_jwt => return Err(Unidentified::Token(None)),
        None => None,
        Some(token) => {
            let metrics = app.metrics();
            let checked = verifier.verify(token, now, |issuer, result| {
                let label = result.map_or_else(|failure| failure.label(), |()| "valid");
                metrics.record_jwt_verification(verifier.issuer_label(issuer), label);
            });
            match checked {
                Ok(verified) => Some(verified),
                Err(
                    refusal @ Refusal {
                        issuer: Some(issuer),
                        ..
                    },
                ) if may_refresh && verifier.may_refresh(&refusal, now) => {
                    return Err(Unidentified::Refresh { issuer });
                }
                Err(refusal) if route.require_jwt => {
                    return Err(Unidentified::Token(Some(refusal.failure)));
                }
                Err(_) => None,
            }
        }
    })
}

/// The client behind the trusted proxies in front of `peer`, from the
/// configured forwarding header.
#[inline]
pub fn client_ip(snapshot: &Snapshot, headers: &HeaderMap, peer: IpAddr) -> IpAddr {
    let forward_header = || {
        headers
            .get_all(snapshot.client_ip.header.name())
            .iter()
            .map(|v| v.as_bytes())
    };
    resolve_with(peer, forward_header, &snapshot.client_ip)
}

/// A body read whole, parsed by its `Content-Type` for `body:FIELD` keys.
pub(crate) fn body_fields(headers: &HeaderMap, body: &[u8]) -> BodyFields {
    let content_type = headers.get(CONTENT_TYPE).and_then(|v| v.to_str().ok());
    BodyFields::parse(content_type, body)
}
