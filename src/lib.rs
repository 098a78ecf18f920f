//! tollgate: a rate-limiting reverse proxy and API gateway.

pub mod identity;
pub mod limit;
pub mod proxy;
