//! The gateway's own responses: RFC 9457 problem+json bodies for every error the
//! gateway answers itself, and the `respond` routes.

use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response, StatusCode};

use super::body::ResponseBody;

/// `application/problem+json`, as text (for lines, which then need not
/// check a header value's bytes again).
pub const PROBLEM_JSON_TEXT: &str = "application/problem+json";
/// `application/problem+json`.
pub const PROBLEM_JSON: HeaderValue = HeaderValue::from_static(PROBLEM_JSON_TEXT);

/// A problem+json response: `{"type":"about:blank","title":...,"status":...,"detail":...}`.
pub fn problem(status: StatusCode, detail: &str) -> Response<ResponseBody> {
    problem_titled(status, status.canonical_reason().unwrap_or("Error"), detail)
}

/// [`problem`] with a title of its own, for a case the status's reason
/// phrase does not name.
pub fn problem_titled(status: StatusCode, title: &str, detail: &str) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(ResponseBody::full(body.to_string()));
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
