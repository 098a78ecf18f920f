//! tollgate: a rate-limiting reverse proxy and API gateway.
//!
//! # Architecture
//!
//! A request goes through plain steps in a fixed order, each in its own module:
//!
//! **accept** ([`server`]) → **snapshot** ([`app`]) → **route** ([`routing`]) →
//! **limit** ([`limit`]) → **forward** ([`proxy::forward`]) → **respond**
//! ([`proxy::response`], errors via [`error`]) → **observe** ([`metrics`],
//! [`access_log`]).
//!
//! With `workers = N > 1` a connection lives on one of N threads, each its
//! own single-threaded runtime ([`server`], [`worker`]); state that must be
//! exact for the process (limiters, metrics, the snapshot) is shared.
//!
//! Every request head is checked by one framing rule before anything
//! serves it ([`h1::framing`]; `Content-Length` by [`http::content_length`]):
//! an ambiguous or malformed request is answered 400 and its connection
//! closed, so nothing can be smuggled past the gateway.
//!
//! [`handler`] is the one function that calls these steps. Operators read the
//! metrics, health and running configuration on a separate listener, [`admin`].
//! Configuration ([`config`]) is validated whole and swapped whole
//! (`arc-swap`); limiter state and metrics live outside the snapshot so a
//! reload keeps them.

pub mod access_log;
pub mod admin;
pub mod allocator;
pub mod app;
pub mod config;
pub mod deadline;
pub mod drain;
pub mod error;
pub mod h1;
pub mod handler;
pub mod http;
pub mod identity;
pub mod limit;
pub mod linger;
pub mod metrics;
pub mod proxy;
pub mod reload;
pub mod routing;
pub mod server;
pub mod summary;
pub mod worker;
