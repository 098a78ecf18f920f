//! The pipeline: what the gateway does with a request once it is parsed.
//! [`handler`] calls the steps in their fixed order (guard, route, admit,
//! act, settle); the send upstream ([`send`]) with the forwarding header
//! rules and the exchange ([`forward`]), retries ([`retry`]), upgrade
//! tunnels ([`upgrade`]), the request body forwarded ([`body`]) and token
//! quotas' settlement from the response ([`tokens`]), a quota route's
//! answer ([`quota`]) and a recorded request's spans ([`traced`]) are its
//! parts. Below
//! it: what every front answers with (`answer`: the 429s and rate-limit
//! fields, problem responses, error → status, the response body),
//! admission, the codec (`http1`), upstream connections (`upstream`), the
//! shared state (`app`); above it only the connection layer (`conn`),
//! which it never names.

pub(crate) mod body;
pub(crate) mod downstream;
pub(crate) mod forward;
pub(crate) mod handler;
pub(crate) mod quota;
pub(crate) mod retry;
pub(crate) mod send;
pub(crate) mod tokens;
pub(crate) mod traced;
pub(crate) mod upgrade;
