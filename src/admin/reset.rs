//! `POST /limits/NAME/reset?key=VALUE`: one key of a limit emptied
//! ([`crate::admission::reset`]), answered `200` with its state before
//! (the explain JSON), audited.
//!
//! `404` for a limit the configuration lacks, `400` for a key it cannot
//! have (none given, or not of the limit's kind), `503` when the limit is
//! shared and Redis does not answer (nothing is audited then).

use std::net::SocketAddr;

use http::{Response, StatusCode};

use super::audit::{self, Action};
use super::ok;
use crate::admission::explain::ExplainError;
use crate::admission::reset::{ResetError, reset};
use crate::answer::body::ResponseBody;
use crate::answer::response::problem;
use crate::app::App;

/// Resets `limit`'s key given by `query`, on behalf of `peer`.
pub(super) async fn answer(
    app: &App,
    limit: &str,
    query: Option<&str>,
    peer: Option<SocketAddr>,
) -> Response<ResponseBody> {
    let snapshot = app.snapshot();
    match reset(&snapshot, app.store(), limit, query, app.clock.now()).await {
        Ok(before) => {
            let parameters = serde_json::json!({ "plan": before["plan"] });
            audit::record(
                app,
                &audit::Write {
                    action: Action::Reset,
                    limit,
                    key_digest: before["digest"].as_str(),
                    parameters: &parameters,
                    peer,
                },
            );
            ok(before.to_string(), "application/json")
        }
        Err(ResetError::Explain(ExplainError::UnknownLimit(message))) => {
            problem(StatusCode::NOT_FOUND, &message)
        }
        Err(ResetError::Explain(ExplainError::BadKey(message))) => {
            problem(StatusCode::BAD_REQUEST, &message)
        }
        Err(ResetError::StoreDown) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "redis did not answer: the key's shared state was not reset; try again",
        ),
    }
}
