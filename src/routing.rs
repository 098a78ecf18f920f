//! The router: first match in file order over `path`, `path_prefix`, `methods`,
//! `host` and `header`, built once per configuration snapshot.
//!
//! Lookups borrow the request and allocate nothing. Routes are few (tens), so a
//! linear scan in file order is both the contract's semantics and fast enough;
//! the bench `benches/gateway.rs` measures it on 50 routes.

use http::HeaderMap;
use http::request::Parts;

use crate::config::routes::strip_port;
use crate::config::{Config, RouteMatch};

/// Matches requests to route indexes of the snapshot's [`Config::routes`].
#[derive(Debug, Clone)]
pub struct Router {
    matchers: Vec<RouteMatch>,
    /// Some route matches on the host: only then is it worked out.
    needs_host: bool,
}

impl Router {
    pub fn new(config: &Config) -> Router {
        Router {
            matchers: config.routes.iter().map(|r| r.matcher.clone()).collect(),
            needs_host: config.routes.iter().any(|r| r.matcher.host.is_some()),
        }
    }

    /// The index of the first route matching the request, if any.
    pub fn find(&self, request: &Parts) -> Option<usize> {
        let path = request.uri.path();
        let host = if self.needs_host {
            request_host(request)
        } else {
            None
        };
        self.matchers
            .iter()
            .position(|m| matches(m, &request.method, path, host, &request.headers))
    }
}

/// The request's host without port, from the URI (HTTP/2 `:authority`, absolute
/// form) or the `Host` header.
pub(crate) fn request_host(request: &Parts) -> Option<&str> {
    let host = match request.uri.authority() {
        Some(authority) => authority.as_str(),
        None => request.headers.get(http::header::HOST)?.to_str().ok()?,
    };
    Some(strip_port(host))
}

fn matches(
    m: &RouteMatch,
    method: &http::Method,
    path: &str,
    host: Option<&str>,
    headers: &HeaderMap,
) -> bool {
    if let Some(exact) = &m.path
        && path != exact
    {
        return false;
    }
    if let Some(prefix) = &m.path_prefix
        && !path.starts_with(prefix.as_str())
    {
        return false;
    }
    if let Some(methods) = &m.methods
        && !methods.contains(method)
    {
        return false;
    }
    if let Some(wanted) = &m.host {
        match host {
            Some(h) if h.eq_ignore_ascii_case(wanted) => {}
            _ => return false,
        }
    }
    m.headers
        .iter()
        .all(|(name, value)| headers.get_all(name).iter().any(|v| v == value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn router(text: &str) -> Router {
        let config = Config::from_bytes(Path::new("t.toml"), text.as_bytes()).unwrap();
        Router::new(&config)
    }

    fn find(router: &Router, method: &str, uri: &str, headers: &[(&str, &str)]) -> Option<usize> {
        let mut builder = http::Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let (parts, _) = builder.body(()).unwrap().into_parts();
        router.find(&parts)
    }

    const ROUTES: &str = r#"
[[routes]]
name = "reports"
match = { path_prefix = "/reports", methods = ["GET"] }
respond = { status = 200 }

[[routes]]
name = "green"
match = { path_prefix = "/api", header = { "x-route" = "green" } }
respond = { status = 200 }

[[routes]]
name = "host"
match = { path = "/h", host = "Example.com" }
respond = { status = 200 }

[[routes]]
name = "login"
match = { path = "/login", methods = ["post"] }
respond = { status = 200 }
"#;

    #[test]
    fn first_match_in_file_order() {
        let r = router(ROUTES);
        assert_eq!(find(&r, "GET", "/reports/1?x=2", &[]), Some(0));
        assert_eq!(
            find(&r, "GET", "/reportsfoo", &[]),
            Some(0),
            "plain string prefix"
        );
        assert_eq!(
            find(&r, "POST", "/reports", &[]),
            None,
            "method mismatch is no match"
        );
        assert_eq!(find(&r, "GET", "/api/x", &[("x-route", "green")]), Some(1));
        assert_eq!(find(&r, "GET", "/api/x", &[("x-route", "blue")]), None);
        assert_eq!(
            find(&r, "GET", "/h", &[("host", "example.com:8080")]),
            Some(2)
        );
        assert_eq!(find(&r, "GET", "http://EXAMPLE.com/h", &[]), Some(2));
        assert_eq!(find(&r, "GET", "/h", &[("host", "other.com")]), None);
        assert_eq!(find(&r, "POST", "/login", &[]), Some(3));
        assert_eq!(find(&r, "POST", "/login/", &[]), None, "path is exact");
    }
}
