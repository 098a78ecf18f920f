//! JOSE vocabulary below both the configuration and the identities: the
//! signature algorithms of RFC 7518 ([`alg`]) and an issuer's verification
//! keys read from a JWKS document or an HMAC secret ([`jwks`]).
//!
//! It sits beside `config` and `identity` and imports neither: `config`
//! reads an issuer's `jwks` file and `algorithms` into these types when a
//! configuration is validated, and `identity::jwt` verifies tokens with
//! them, so the configuration never reaches up into the identities.

pub mod alg;
pub mod jwks;

pub use alg::Algorithm;
pub use jwks::KeySet;
