//! A plain `http://host[:port][/path][?query]` URL of a collector the
//! gateway posts to (`[tracing] otlp`, `[usage] url`): one parse for both,
//! each caller's own rules and messages on top (`config::tracing`,
//! `config::usage`). Plain HTTP only: the exporters speak no TLS (a
//! collector on the host, or a TLS-terminating sidecar beside it).

/// A URL the exporters can reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpUrl {
    /// `host:port` to connect to (port 80 when the URL has none; an IPv6
    /// address in brackets).
    pub(crate) authority: String,
    /// The authority as written (the `Host` field).
    pub(crate) host: String,
    /// The path, `/` when the URL has none.
    pub(crate) path: String,
    /// The query, without its `?`.
    pub(crate) query: Option<String>,
}

/// Why a text is not such a URL; each caller words it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UrlError {
    /// Not a URL at all (a space, a bare word).
    NotUrl,
    /// `https://`.
    Https,
    /// Another scheme, or none (a bare path).
    NotHttp,
    /// `http://` with no host.
    NoHost,
    /// `user:password@` in the authority.
    Credentials,
}

/// `text` as a plain HTTP URL.
pub(crate) fn parse(text: &str) -> Result<HttpUrl, UrlError> {
    let uri: http::Uri = text.parse().map_err(|_| UrlError::NotUrl)?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(UrlError::Https),
        _ => return Err(UrlError::NotHttp),
    }
    let authority = uri.authority().ok_or(UrlError::NoHost)?;
    if authority.as_str().contains('@') {
        return Err(UrlError::Credentials);
    }
    if authority.host().is_empty() {
        return Err(UrlError::NoHost);
    }
    let port = authority.port_u16().unwrap_or(80);
    Ok(HttpUrl {
        authority: format!("{}:{port}", authority.host()),
        host: authority.as_str().to_owned(),
        path: match uri.path() {
            "" => "/".to_owned(),
            path => path.to_owned(),
        },
        query: uri.query().map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_split_with_port_80_by_default() {
        let url = parse("http://collector").unwrap();
        assert_eq!(
            url,
            HttpUrl {
                authority: "collector:80".into(),
                host: "collector".into(),
                path: "/".into(),
                query: None,
            }
        );
        let url = parse("http://[::1]:4318/otlp?a=b").unwrap();
        assert_eq!(url.authority, "[::1]:4318");
        assert_eq!(url.host, "[::1]:4318");
        assert_eq!(url.path, "/otlp");
        assert_eq!(url.query.as_deref(), Some("a=b"));
        assert_eq!(parse("http://a?x").unwrap().path, "/");
    }

    #[test]
    fn what_is_not_a_plain_http_url_says_why() {
        for (text, error) in [
            ("not a url", UrlError::NotUrl),
            ("http://a b/", UrlError::NotUrl),
            ("http:///x", UrlError::NotUrl),
            ("https://c:4318", UrlError::Https),
            ("grpc://c:4317", UrlError::NotHttp),
            ("ftp://a/", UrlError::NotHttp),
            ("/v1/traces", UrlError::NotHttp),
            ("http://u:p@c:4318", UrlError::Credentials),
        ] {
            assert_eq!(parse(text), Err(error), "{text}");
        }
    }
}
