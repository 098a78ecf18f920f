//! `GET /dashboard`: one self-contained page, compiled into the binary,
//! that draws [`super::stats`]'s `/stats` every second (and asks
//! `/limits/NAME?key=` why a key is refused).
//!
//! Air-gapped and locked down: the page's style and script are inline
//! (`dashboard/page.css`, `dashboard/page.js`, put into
//! `dashboard/page.html` once), allowed by their SHA-256 in a
//! `Content-Security-Policy` whose default is `'none'`; it may fetch only
//! its own origin (`connect-src 'self'`), and loads no font, image, frame
//! or remote script. Inline, not served as files beside it: a script
//! `src` cannot carry the admin bearer token the page sends with `fetch`.

use std::sync::LazyLock;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::header::{CONTENT_SECURITY_POLICY, HeaderName, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS};
use http::{HeaderValue, Response};
use sha2::{Digest, Sha256};

use crate::answer::body::ResponseBody;

const HTML: &str = include_str!("dashboard/page.html");
const CSS: &str = include_str!("dashboard/page.css");
const JS: &str = include_str!("dashboard/page.js");

/// The page with its style and script in place, and the policy that
/// allows exactly those.
struct Page {
    html: bytes::Bytes,
    policy: HeaderValue,
}

static PAGE: LazyLock<Page> = LazyLock::new(|| {
    let html = HTML
        .replacen("/*STYLE*/", CSS, 1)
        .replacen("/*SCRIPT*/", JS, 1);
    let policy = policy(CSS, JS);
    Page {
        html: bytes::Bytes::from(html),
        // The policy is ASCII (base64 and keywords): always a valid value.
        policy: HeaderValue::from_str(&policy)
            .unwrap_or(HeaderValue::from_static("default-src 'none'")),
    }
});

/// `'sha256-…'` of an inline element's text, as CSP spells a hash source.
fn hash_source(text: &str) -> String {
    format!(
        "'sha256-{}'",
        STANDARD.encode(Sha256::digest(text.as_bytes()))
    )
}

/// The page's `Content-Security-Policy`: nothing but its own style and
/// script, and `fetch` to its own origin.
fn policy(css: &str, js: &str) -> String {
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; \
         img-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        hash_source(js),
        hash_source(css)
    )
}

/// The `/dashboard` response.
pub(crate) fn page() -> Response<ResponseBody> {
    let page = &*PAGE;
    let mut response = Response::new(ResponseBody::full(page.html.clone()));
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    headers.insert(CONTENT_SECURITY_POLICY, page.policy.clone());
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(
        HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("same-origin"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_holds_its_style_and_script_and_the_policy_hashes_them() {
        let page = &*PAGE;
        let html = std::str::from_utf8(&page.html).expect("utf-8");
        // Exactly what is hashed sits between the tags.
        assert!(html.contains(&format!("<style>{CSS}</style>")));
        assert!(html.contains(&format!("<script>{JS}</script>")));
        assert!(!html.contains("/*STYLE*/") && !html.contains("/*SCRIPT*/"));
        let policy = page.policy.to_str().expect("ascii");
        assert!(policy.starts_with("default-src 'none';"), "{policy}");
        assert!(policy.contains(&format!("script-src {};", hash_source(JS))));
        assert!(policy.contains(&format!("style-src {};", hash_source(CSS))));
        assert!(policy.contains("connect-src 'self'"));
        assert!(!policy.contains("unsafe"), "{policy}");
    }

    #[test]
    fn hash_sources_are_base64_of_sha256() {
        // `echo -n abc | openssl dgst -sha256 -binary | base64`
        assert_eq!(
            hash_source("abc"),
            "'sha256-ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0='"
        );
    }
}
