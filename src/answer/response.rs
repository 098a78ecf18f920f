//! The gateway's own responses: RFC 9457 problem+json responses for every
//! error the gateway answers itself (the body written by
//! [`crate::http::problem`], as the codec's refusals and the 429s are), and
//! the `respond` routes.

use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};

use super::body::ResponseBody;
use crate::http::problem::{self as problem_json, about_blank, reason_title};

/// `application/problem+json`.
const PROBLEM_JSON: HeaderValue = HeaderValue::from_static(problem_json::CONTENT_TYPE);

/// A problem+json response of type `about:blank`, titled by the status's
/// reason phrase: `{"detail":...,"status":...,"title":...,"type":"about:blank"}`.
pub(crate) fn problem(status: StatusCode, detail: &str) -> Response<ResponseBody> {
    problem_titled(status, reason_title(status), detail)
}

/// [`problem`] with a title of its own, for a case the status's reason
/// phrase does not name.
pub(crate) fn problem_titled(
    status: StatusCode,
    title: &str,
    detail: &str,
) -> Response<ResponseBody> {
    let mut body = String::new();
    about_blank(&mut body, status, title, detail);
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, PROBLEM_JSON);
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn problem_bodies_are_json() {
        let response = problem(StatusCode::NOT_FOUND, "no route matches GET /\"x\"");
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/problem+json");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(value["status"], 404);
        assert_eq!(value["title"], "Not Found");
        assert_eq!(value["detail"], "no route matches GET /\"x\"");
    }
}
