//! JWT identities (`[jwt]`): a bearer token verified against its issuer's
//! keys, then its claims as limit keys (`jwt:CLAIM`) and as the caller's
//! consumer, tenant and plan.
//!
//! - [`token`]: the compact serialisation parsed strictly, untrusted;
//! - [`jwks`]: an issuer's keys and the signature check (ring), defined
//!   below the configuration in [`crate::jose`], which reads them;
//! - [`remote`]: the keys of a `jwks_url`, swapped in by the fetcher
//!   (`app::jwks`) and refreshed early on an unknown `kid`;
//! - [`verify`]: the issuer's rules (algorithms, `iss`, `aud`, `exp`,
//!   `nbf`, `iat` within leeway) and the claims a request needs;
//! - [`cache`]: verified tokens until they expire, so a client's next
//!   request does not verify again.
//!
//! The raw token is never logged, counted or shown: a [`Failure`] says what
//! failed in words of its own.

pub(crate) mod cache;
pub mod remote;
pub mod token;
pub mod verified;
pub mod verify;

/// The keys of [`crate::jose`], under the name they have always had here.
pub use crate::jose::jwks;
pub use verified::Verified;
pub(crate) use verify::Verifier;

/// Why a token is not a valid identity. The text is safe to send to the
/// client (it never quotes the token) and goes into
/// `WWW-Authenticate: Bearer error="invalid_token", error_description=...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Malformed(&'static str),
    Expired,
    NotYetValid(&'static str),
    WrongIssuer,
    WrongAudience,
    UnknownKey,
    BadSignature(&'static str),
}

impl Failure {
    /// The `result` label of `tollgate_jwt_verifications_total`.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Malformed(_) => "malformed",
            Failure::Expired => "expired",
            Failure::NotYetValid(_) => "not_yet_valid",
            Failure::WrongIssuer => "wrong_issuer",
            Failure::WrongAudience => "wrong_audience",
            Failure::UnknownKey => "unknown_key",
            Failure::BadSignature(_) => "bad_signature",
        }
    }

    /// What failed, for the client: `error_description` and the problem's
    /// `detail`.
    pub fn description(self) -> &'static str {
        match self {
            Failure::Malformed(why) | Failure::NotYetValid(why) | Failure::BadSignature(why) => why,
            Failure::Expired => "the token has expired",
            Failure::WrongIssuer => "the token's issuer is not accepted",
            Failure::WrongAudience => "the token is not meant for this audience",
            Failure::UnknownKey => "the token's signing key is not known",
        }
    }
}
