//! One routed request admitted in one call: what every front (the proxy,
//! `/auth`, `simulate`) hands admission and gets back, so that none of
//! them repeats the steps or their order.
//!
//! [`admit_request`] runs them in the order the contract answers them:
//! 1. the caller — its token verified (an unknown `kid` of a `jwks_url`
//!    issuer waits once for that issuer's keys) and its API key's
//!    consumer: a refusal is [`RequestAdmission::Unidentified`] (401), and
//!    the body is not read;
//! 2. the body, read within `max_key_body` where a limit keys on it or the
//!    route reserves tokens ([`super::body`]): over `max_body`, too slow or
//!    unreadable, [`RequestAdmission::BodyRefused`];
//! 3. with limits on the route: the client IP behind the trusted proxies,
//!    the body's fields, the token reservation, each limit's key;
//! 4. the stack decided in memory or in the store; in memory, a request
//!    refused only by slot limits with a `queue` waits for a slot and is
//!    decided again (`wait`);
//! 5. an admitted request's token bill.
//!
//! [`decide_request`] is the same without a store or a key refresh, for
//! `simulate`, which decides offline: [`identify_request`] (steps 1 to 3
//! but the keys) then [`decide_identified`] (the keys, 4 and 5), which
//! `simulate --compare` calls once per record and once per variant.

use std::net::IpAddr;

use bytes::Bytes;
use http::request::Parts;

use super::body::{BodyError, PendingBody, buffer_for_key, declared_length};
use super::identify::{self, Caller, Unidentified, body_fields};
use super::tokens::{self, TokenBill};
use super::usage::UsageFacts;
use super::{
    Admission, Admitting, Charge, Ticket, answer, check_in_memory, decide_in_memory, key_stack,
    reserve, shared, wait,
};
use crate::app::{App, RoutePlan, Snapshot};
use crate::config::RouteConfig;
use crate::identity::body_fields::BodyFields;
use crate::limit::Nanos;

/// A request its front has routed, as admission takes it.
pub struct Routed<'r, 's> {
    /// The matched route.
    pub route: &'s RouteConfig,
    /// Its plan as the front counts it (`snapshot.routes[index]`, or
    /// `/auth`'s `front = "auth"` copy).
    pub plan: &'s RoutePlan,
    /// The request's head, for the caller and the limits' keys.
    pub parts: &'r Parts,
    pub client: Client,
    pub body: RequestBody<'r>,
    /// The request's time on the limiters' clock (also the token check's).
    pub now: Nanos,
}

/// Who sent the request, as the front knows it.
#[derive(Debug, Clone, Copy)]
pub enum Client {
    /// The TCP peer: the client behind it is found by the trusted-proxy
    /// rule when a limit needs it.
    Peer(IpAddr),
    /// The client, found by the front (`/auth` reads `X-Real-IP` too).
    Resolved(IpAddr),
}

/// The request's body, as the front has it.
pub enum RequestBody<'r> {
    /// None to read (`/auth`): `body:` keys are missing, and token limits
    /// are charged the request's cost.
    Absent,
    /// In memory already (a trace's record), with the length its head
    /// declared; a body without one is taken as sent with its length.
    Held {
        bytes: &'r [u8],
        declared: Option<u64>,
    },
    /// The client's, not yet sent upstream: read here when the route needs
    /// it, and handed back in its place to be forwarded.
    Client(&'r mut PendingBody),
}

/// What admission answered for a routed request.
#[derive(Debug)]
pub enum RequestAdmission {
    /// Every limit admitted (or the route has none): the ticket holds the
    /// permits and the fields' numbers; `bill` is a token route's
    /// reservation, to settle when the response ends.
    Admitted { bill: Option<TokenBill> },
    /// The limit at `by` of the route's stack denied; nothing was charged.
    Denied { by: usize },
    /// The limit at `position` needs a key the request lacks
    /// (`on_missing_key = "deny"`).
    MissingKey { position: usize },
    /// The store is down and `on_failure = "deny"`.
    StoreDown,
    /// The body could not be read for the limits (413, 408, 400).
    BodyRefused(BodyError),
    /// The caller is refused before its limits (401). Never `Refresh` from
    /// [`admit_request`], which refreshes.
    Unidentified(Unidentified),
}

/// `request` admitted on `snapshot`'s limits into `ticket` (empty on
/// entry): its caller, its body, its keys, the decision, the bill. The one
/// call of a front with a live request: [`admit_at_once`], then, where it
/// stopped, [`admit_later`].
///
/// Where it waits: a key refresh (boxed: rare), reading a body a limit
/// keys on, and the store (its future boxed, as [`super::admit_keyed`]'s);
/// a request of a route without shared limits or body keys is decided
/// before its first poll returns.
pub async fn admit_request<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    request: Routed<'a, 's>,
    ticket: &'a mut Ticket<'s>,
) -> RequestAdmission {
    match admit_at_once(app, snapshot, request, ticket) {
        Ok(admitted) => admitted,
        Err(later) => admit_later(app, snapshot, later, ticket).await,
    }
}

/// [`admit_request`] as far as it goes without waiting: the whole of it
/// for a request of a route without shared limits or body keys, whose
/// caller needs no key refresh and which no slot limit refused; else what
/// is left, for [`admit_later`] to await. A plain function, so that the
/// requests decided at once (nearly all on such a route, denials
/// included) build no future of their own: the admission call's future,
/// built, moved and dropped for each, cost ~100 instructions a request
/// (`bench/instructions.sh`).
#[inline(always)]
pub fn admit_at_once<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    request: Routed<'a, 's>,
    ticket: &mut Ticket<'s>,
) -> Result<RequestAdmission, Later<'a, 's>> {
    let headers = &request.parts.headers;
    let identified = identify::caller(app, snapshot, request.route, headers, request.now);
    let plan = request.plan;
    // A body to read, or a store to ask: waited for later.
    let waits = plan.needs_body || (plan.shared && app.store().is_some());
    let caller = match identified {
        Ok(caller) if !waits => caller,
        Err(refused) if !matches!(refused, Unidentified::Refresh { .. }) => {
            return Ok(RequestAdmission::Unidentified(refused));
        }
        identified => return Err(Later(Step::Identified(request, identified))),
    };
    let mut usage = UsageFacts::for_route(app, request.route);
    let charge = match keyed(app, snapshot, &request, caller, false, ticket, &mut usage) {
        Ok(charge) => charge,
        Err(answered) => return Ok(answered),
    };
    check_in_memory(&charge, charge.now, ticket);
    if let Some(by) = ticket.decision.denied_by
        && wait::by_slot_limit(ticket, by)
    {
        return Err(Later(Step::Refused { charge, usage, by }));
    }
    let admission = answer(app, snapshot, &charge, ticket);
    Ok(conclude(
        app,
        snapshot,
        plan,
        admission,
        ticket,
        usage,
        request.now,
    ))
}

/// What [`admit_at_once`] left to wait for.
pub struct Later<'a, 's>(Step<'a, 's>);

enum Step<'a, 's> {
    /// The caller as identified (a key refresh to wait for, perhaps), and
    /// all the rest: a body to read, or a store to ask.
    Identified(Routed<'a, 's>, Result<Caller<'s>, Unidentified>),
    /// Refused in memory by the slot limit at `by`, whose queue it may
    /// wait in (`wait`) before it is decided again.
    Refused {
        charge: Charge<'s>,
        usage: UsageFacts,
        by: usize,
    },
}

/// The rest of [`admit_request`] where [`admit_at_once`] stopped.
pub async fn admit_later<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    later: Later<'a, 's>,
    ticket: &'a mut Ticket<'s>,
) -> RequestAdmission {
    match later.0 {
        Step::Identified(request, identified) => {
            admit_identified(app, snapshot, request, identified, ticket).await
        }
        Step::Refused { charge, usage, by } => {
            if let Some(waiting) = wait::refused(app, snapshot, &charge, ticket, by) {
                waiting.await;
            }
            let admission = answer(app, snapshot, &charge, ticket);
            conclude(
                app,
                snapshot,
                charge.plan,
                admission,
                ticket,
                usage,
                charge.now,
            )
        }
    }
}

/// Steps 1 (from the caller as `identify::caller` answered) to 5, waiting
/// where they do.
async fn admit_identified<'a, 's: 'a>(
    app: &'a App,
    snapshot: &'s Snapshot,
    mut request: Routed<'a, 's>,
    identified: Result<Caller<'s>, Unidentified>,
    ticket: &'a mut Ticket<'s>,
) -> RequestAdmission {
    let caller = match identified {
        Ok(caller) => caller,
        // Out of the request future: a boxed wait for the issuer's keys.
        Err(Unidentified::Refresh { issuer }) => {
            let (route, now) = (request.route, request.now);
            let headers = &request.parts.headers;
            let refreshed = identify::caller_refreshed(app, snapshot, route, headers, now, issuer);
            match Box::pin(refreshed).await {
                Ok(caller) => caller,
                Err(refused) => return RequestAdmission::Unidentified(refused),
            }
        }
        Err(refused) => return RequestAdmission::Unidentified(refused),
    };
    if request.plan.needs_body {
        let read = match &mut request.body {
            RequestBody::Client(body) => {
                read_client_body(body, request.parts, snapshot, request.route).await
            }
            held => check_held(held, request.route),
        };
        if let Err(refused) = read {
            return RequestAdmission::BodyRefused(refused);
        }
    }
    let mut usage = UsageFacts::for_route(app, request.route);
    let plan = request.plan;
    let store = app.store().filter(|_| plan.shared);
    let shared = store.is_some();
    let charge = match keyed(app, snapshot, &request, caller, shared, ticket, &mut usage) {
        Ok(charge) => charge,
        Err(answered) => return answered,
    };
    let admitting = match store {
        None => {
            check_in_memory(&charge, charge.now, ticket);
            if let Some(by) = ticket.decision.denied_by
                && let Some(waiting) = wait::refused(app, snapshot, &charge, ticket, by)
            {
                waiting.await;
            }
            Admitting::Decided(answer(app, snapshot, &charge, ticket))
        }
        Some(store) => {
            Admitting::Asking(shared::decide_boxed(store, app, snapshot, charge, ticket))
        }
    };
    let admission = admitting.await;
    conclude(app, snapshot, plan, admission, ticket, usage, request.now)
}

/// Steps 3 and the keys of 4 for an identified request whose body is
/// read: an unlimited route's admission, a token route's reservation, the
/// keys into `ticket`; the charge to decide, or the request's answer
/// (admitted without limits, its model unpriced, a key missing).
#[inline(always)]
// Each input comes from a different step of the caller.
#[allow(clippy::too_many_arguments)]
fn keyed<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    request: &Routed<'_, 's>,
    caller: Caller<'s>,
    shared: bool,
    ticket: &mut Ticket<'s>,
    usage: &mut UsageFacts,
) -> Result<Charge<'s>, RequestAdmission> {
    if request.plan.stack.is_empty() {
        let usage = std::mem::take(usage);
        return Err(RequestAdmission::Admitted {
            bill: unlimited_bill(app, snapshot, request, &caller, usage, ticket),
        });
    }
    // Asked only on a token route: the call returning nothing cost every
    // other request ~23 instructions (`bench/instructions.sh`).
    let reserved = match request.route.tokens {
        None => None,
        Some(_) => match reserve_for(snapshot, request) {
            Ok(reserved) => reserved,
            Err(_) => return Err(RequestAdmission::BodyRefused(BodyError::Unpriced)),
        },
    };
    key(
        app, snapshot, request, caller, reserved, shared, ticket, usage,
    )
    .map_err(|missing| {
        let usage = std::mem::take(usage);
        conclude(
            app,
            snapshot,
            request.plan,
            missing,
            ticket,
            usage,
            request.now,
        )
    })
}

/// A request of a route without limits: a bill only to carry its usage
/// event (`usage_events = true`), named by its consumer if it has one.
#[cold]
fn unlimited_bill(
    app: &App,
    snapshot: &Snapshot,
    request: &Routed<'_, '_>,
    caller: &Caller<'_>,
    mut usage: UsageFacts,
    ticket: &Ticket<'_>,
) -> Option<TokenBill> {
    if !usage.wanted {
        return None;
    }
    let ip = match request.client {
        Client::Peer(ip) | Client::Resolved(ip) => ip,
    };
    usage.caller(caller.identity(snapshot, ip, None).consumer);
    let note = usage.into_note(app, None, request.now);
    tokens::bill(app, snapshot, request.plan, ticket, note)
}

/// [`admit_request`] without a store, a key refresh (an unknown `kid` is
/// [`Unidentified::Refresh`]) or a client body to read: `simulate`'s
/// offline decision, on the same steps. It is [`identify_request`] then
/// [`decide_identified`].
pub fn decide_request<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    request: Routed<'_, 's>,
    ticket: &mut Ticket<'s>,
) -> RequestAdmission {
    match identify_request(app, snapshot, &request) {
        Ok(identified) => decide_identified(app, snapshot, &request, &identified, ticket),
        Err(refused) => refused.into(),
    }
}

/// What [`decide_request`] finds of a request before its keys: its
/// caller, its client (behind the trusted proxies), its body's fields and
/// its reservation. Found once ([`identify_request`]), it is decided on
/// any configuration that differs from the one it was found on only in
/// its limits' algorithms ([`decide_identified`]): `simulate --compare`
/// identifies a record once for all its variants.
pub struct Identified<'s> {
    caller: Caller<'s>,
    client_ip: IpAddr,
    fields: Option<BodyFields>,
    reserved: Option<Reserved>,
}

/// Why [`identify_request`] answered a request before its keys.
#[derive(Debug, Clone, Copy)]
pub enum Refused {
    /// 401: [`RequestAdmission::Unidentified`].
    Unidentified(Unidentified),
    /// 413, or 400 for a model without a price:
    /// [`RequestAdmission::BodyRefused`].
    Body(BodyError),
}

impl From<Refused> for RequestAdmission {
    fn from(refused: Refused) -> RequestAdmission {
        match refused {
            Refused::Unidentified(refused) => RequestAdmission::Unidentified(refused),
            Refused::Body(refused) => RequestAdmission::BodyRefused(refused),
        }
    }
}

/// Steps 1 to 3 of [`decide_request`] but the keys: the caller, the body
/// against `max_body`, the reservation, the client IP and the body's
/// fields.
pub fn identify_request<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    request: &Routed<'_, 's>,
) -> Result<Identified<'s>, Refused> {
    let headers = &request.parts.headers;
    let caller = identify::caller(app, snapshot, request.route, headers, request.now)
        .map_err(Refused::Unidentified)?;
    if request.plan.needs_body {
        check_held(&request.body, request.route).map_err(Refused::Body)?;
    }
    // Without limits nothing is reserved (or keyed).
    let reserved = if request.plan.stack.is_empty() {
        None
    } else {
        reserve_for(snapshot, request).map_err(|_| Refused::Body(BodyError::Unpriced))?
    };
    let (client_ip, fields) = client_and_fields(snapshot, request);
    Ok(Identified {
        caller,
        client_ip,
        fields,
        reserved,
    })
}

/// The rest of [`decide_request`] for a request [`identify_request`]
/// identified (on this `snapshot` or one differing only in its limits'
/// algorithms): each limit's key, the stack decided in memory, the
/// answer. Nothing of `identified` is used up.
pub fn decide_identified<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    request: &Routed<'_, 's>,
    identified: &Identified<'s>,
    ticket: &mut Ticket<'s>,
) -> RequestAdmission {
    if request.plan.stack.is_empty() {
        return RequestAdmission::Admitted { bill: None };
    }
    // Offline: no usage events, so the body's model is not carried.
    let mut usage = UsageFacts::default();
    let reserved = identified.reserved.as_ref().map(|r| Reserved {
        tokens: r.tokens,
        priced: r.priced.clone(),
        model: None,
    });
    let facts = (
        &identified.caller,
        identified.client_ip,
        identified.fields.as_ref(),
    );
    let keyed = key_as(
        app, snapshot, request, facts, reserved, false, ticket, &mut usage,
    );
    let admission = match keyed {
        Err(missing) => missing,
        Ok(charge) => decide_in_memory(app, snapshot, &charge, ticket),
    };
    conclude(
        app,
        snapshot,
        request.plan,
        admission,
        ticket,
        usage,
        request.now,
    )
}

/// A body in memory against the route's `max_body`, as reading it would
/// have found.
fn check_held(body: &RequestBody<'_>, route: &RouteConfig) -> Result<(), BodyError> {
    match (body, route.max_body) {
        (RequestBody::Held { bytes, .. }, Some(limit)) if bytes.len() as u64 > limit => {
            Err(BodyError::TooLarge { limit })
        }
        _ => Ok(()),
    }
}

/// The client's body read for the limits, put back in `body`'s place.
async fn read_client_body(
    body: &mut PendingBody,
    parts: &Parts,
    snapshot: &Snapshot,
    route: &RouteConfig,
) -> Result<(), BodyError> {
    // An empty `Bytes` holds the place meanwhile: it allocates nothing.
    *body = match std::mem::replace(body, PendingBody::Complete(Bytes::new())) {
        PendingBody::Fresh(incoming) => {
            buffer_for_key(incoming, parts, &snapshot.config, route).await?
        }
        read => read,
    };
    Ok(())
}

/// The body read whole (within `max_key_body`, declaring no more).
#[inline(always)]
fn whole_body<'b>(body: &'b RequestBody<'_>, cap: usize) -> Option<&'b [u8]> {
    match body {
        RequestBody::Held { bytes, declared } => (bytes.len() <= cap
            && declared.is_none_or(|length| length <= cap as u64))
        .then_some(*bytes),
        RequestBody::Client(PendingBody::Complete(bytes)) => Some(bytes),
        RequestBody::Client(_) | RequestBody::Absent => None,
    }
}

/// A token route's reservation (`None`: no `tokens` rule, or no body to
/// reserve on), priced when its stack has a usd limit; `Err` when the
/// body's model has no price (400).
fn reserve_for(
    snapshot: &Snapshot,
    request: &Routed<'_, '_>,
) -> Result<Option<Reserved>, reserve::Unpriced> {
    let Some(rule) = request.route.tokens.as_ref() else {
        return Ok(None);
    };
    let cap = snapshot.config.server.max_key_body;
    let whole = whole_body(&request.body, cap);
    // Its length, read only for a token route's reservation.
    let declared = match &request.body {
        RequestBody::Absent => return Ok(None),
        RequestBody::Held { bytes, declared } => declared.or(Some(bytes.len() as u64)),
        RequestBody::Client(_) => declared_length(request.parts),
    };
    let usd = request
        .plan
        .stack
        .iter()
        .any(|&id| snapshot.limit_config(id).unit == crate::config::tokens::Unit::Usd);
    if !usd {
        let (tokens, model) = reserve::reservation(rule, whole, declared, cap);
        return Ok(Some(Reserved {
            tokens,
            priced: None,
            model,
        }));
    }
    let prices = &snapshot.config.prices;
    let (priced, model) = reserve::priced_reservation(rule, whole, declared, cap, prices)?;
    Ok(Some(Reserved {
        tokens: priced.tokens,
        priced: Some(Box::new(priced)),
        model,
    }))
}

/// What a token route's request reserves: tokens, and with a usd limit in
/// its stack, their price (boxed: one pointer in the ticket, which every
/// request's future carries).
pub(super) struct Reserved {
    tokens: u64,
    priced: Option<Box<reserve::Priced>>,
    /// The body's `model`, for the request's usage event.
    model: Option<String>,
}

/// Steps 3 and the keys of 4: the client IP, the body's fields, the
/// reservation, each limit's key into `ticket`; the charge to decide, or
/// the missing key that refuses the request. `caller` is dropped here:
/// nothing of it waits for the store.
#[inline(always)]
// Each input comes from a different step of the caller; a struct of them
// would only be unpacked here.
#[allow(clippy::too_many_arguments)]
fn key<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    request: &Routed<'_, 's>,
    caller: Caller<'s>,
    reserved: Option<Reserved>,
    shared: bool,
    ticket: &mut Ticket<'s>,
    usage: &mut UsageFacts,
) -> Result<Charge<'s>, Admission> {
    let (client_ip, fields) = client_and_fields(snapshot, request);
    let facts = (&caller, client_ip, fields.as_ref());
    let keyed = key_as(
        app, snapshot, request, facts, reserved, shared, ticket, usage,
    );
    // Dropped by hand: the drop of the (nearly always absent) fields
    // stayed a call, ~15 instructions a request (`bench/instructions.sh`).
    if let Some(fields) = fields {
        drop(fields);
    }
    keyed
}

/// The client IP behind the trusted proxies and, where a limit keys on
/// the body and it was read whole, the body's fields.
#[inline(always)]
fn client_and_fields(
    snapshot: &Snapshot,
    request: &Routed<'_, '_>,
) -> (IpAddr, Option<BodyFields>) {
    let parts = request.parts;
    let client_ip = match request.client {
        Client::Peer(peer) => identify::client_ip(snapshot, &parts.headers, peer),
        Client::Resolved(client) => client,
    };
    let cap = snapshot.config.server.max_key_body;
    let whole = whole_body(&request.body, cap);
    let fields = whole
        .filter(|_| request.plan.needs_body)
        .map(|bytes| body_fields(&parts.headers, bytes));
    (client_ip, fields)
}

/// [`key`] with the caller, its client IP and the body's fields found.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn key_as<'s>(
    app: &App,
    snapshot: &'s Snapshot,
    request: &Routed<'_, 's>,
    (caller, client_ip, fields): (&Caller<'s>, IpAddr, Option<&BodyFields>),
    reserved: Option<Reserved>,
    shared: bool,
    ticket: &mut Ticket<'s>,
    usage: &mut UsageFacts,
) -> Result<Charge<'s>, Admission> {
    let parts = request.parts;
    ticket.client_ip = Some(client_ip);
    let (tokens, priced) = match reserved {
        Some(Reserved {
            tokens,
            priced,
            model,
        }) => {
            usage.model = model.filter(|_| usage.wanted).map(String::into_boxed_str);
            (Some(tokens), priced)
        }
        None => (None, None),
    };
    let charge = Charge {
        plan: request.plan,
        cost: request.route.cost,
        tokens,
        now: request.now,
    };
    let identity = caller.identity(snapshot, client_ip, fields);
    usage.caller(identity.consumer);
    ticket.priority = identity.priority(&snapshot.config, request.route);
    key_stack(app, snapshot, (parts, &identity), &charge, shared, ticket)?;
    if let Some(priced) = priced {
        ticket.reserved = super::ticket::Reservation::Priced(priced);
    }
    Ok(charge)
}

/// The decision as the front's answer; an admitted token request's bill
/// (or a bill only to carry its usage event, `usage`).
#[inline(always)]
fn conclude(
    app: &App,
    snapshot: &Snapshot,
    plan: &RoutePlan,
    admission: Admission,
    ticket: &Ticket<'_>,
    usage: UsageFacts,
    now: Nanos,
) -> RequestAdmission {
    match admission {
        Admission::Allowed if ticket.reserved.tokens().is_none() && !usage.wanted => {
            RequestAdmission::Admitted { bill: None }
        }
        Admission::Allowed => {
            let key = ticket.keys.iter().flatten().next().copied();
            let note = usage.into_note(app, key, now);
            RequestAdmission::Admitted {
                bill: tokens::bill(app, snapshot, plan, ticket, note),
            }
        }
        Admission::Denied { by } => RequestAdmission::Denied { by },
        Admission::MissingKey { position } => RequestAdmission::MissingKey { position },
        Admission::StoreDown => RequestAdmission::StoreDown,
    }
}
