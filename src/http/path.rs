//! Request-path normalisation (RFC 3986 §6.2.2), so that every spelling of a
//! path meets the route, the keys and the limits of its plain form.
//!
//! An upstream resolves `/x/../login`, `//login`, `/./login` and `/%6cogin`
//! to `/login`. A gateway that matched them raw would let each one walk
//! around the `/login` route's limit; so the path is normalised first, and
//! the normalised path is what routes match, what `route` and composite keys
//! see, and what is forwarded. The query is left as it is.
//!
//! The rules, in the order they apply:
//!
//! 1. **Percent-encodings** (§6.2.2.1, §6.2.2.2): a malformed one (`%`
//!    without two hex digits) is refused. An encoded unreserved character
//!    (`ALPHA DIGIT - . _ ~`) is decoded; any other keeps its encoding with
//!    the hex upper-cased (`%2f` → `%2F`). `%25` stays `%25`: nothing is
//!    decoded twice.
//! 2. **Separators that hide a segment:** an encoded `/` (`%2F`) or `\`
//!    (`%5C`) is refused under [`EscapedSlashes::Reject`] (the default: an
//!    upstream that decodes them sees other segments than the router did),
//!    kept encoded under [`EscapedSlashes::Keep`]. A raw `\` (Windows-style
//!    servers treat it as `/`) and any NUL (raw or `%00`) are always refused.
//! 3. **Runs of `/`** are merged into one.
//! 4. **Dot segments** (§6.2.2.3, §5.2.4) are removed, including those that
//!    step 1 decoded (`/%2e%2e/`). A `..` above the root is refused rather
//!    than clamped: no honest client sends it.
//!
//! A path that is already normal — the usual case — is recognised in one
//! pass without allocating ([`normalize`] returns `Ok(None)`).

use std::fmt;

/// What an encoded `/` or `\` in a path means (`[server] escaped_slashes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum EscapedSlashes {
    /// Refuse the request (400): the default.
    #[default]
    Reject,
    /// Keep `%2F`/`%5C` encoded and forward them (for upstreams that use
    /// encoded slashes inside a segment).
    Keep,
}

/// Why a path cannot be normalised; the request is answered 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathError {
    /// `%` not followed by two hex digits.
    BadEscape,
    /// `%2F` or `%5C` under [`EscapedSlashes::Reject`].
    EncodedSlash,
    /// A raw `\`.
    Backslash,
    /// A NUL byte, raw or `%00`.
    Nul,
    /// A `..` segment above the root.
    EscapesRoot,
}

impl PathError {
    /// The problem+json detail for the client.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            PathError::BadEscape => "the request path has a malformed percent-encoding",
            PathError::EncodedSlash => "the request path contains an encoded slash (%2F or %5C)",
            PathError::Backslash => "the request path contains a backslash",
            PathError::Nul => "the request path contains a NUL byte",
            PathError::EscapesRoot => "the request path climbs above the root (..)",
        }
    }
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// The normal form of `path` (which starts with `/`; anything else, like
/// `*`, is returned as normal), or `Ok(None)` when it already is.
pub(crate) fn normalize(path: &str, slashes: EscapedSlashes) -> Result<Option<String>, PathError> {
    if !path.starts_with('/') || is_normal(path.as_bytes()) {
        return Ok(None);
    }
    let decoded = decode(path.as_bytes(), slashes)?;
    let normal = remove_dot_segments(&decoded)?;
    Ok((normal != path).then_some(normal))
}

/// Normalises the path of `uri` in place (scheme, authority and query kept);
/// leaves `uri` untouched, without allocating, when its path is normal.
pub(crate) fn normalize_uri(uri: &mut http::Uri, slashes: EscapedSlashes) -> Result<(), PathError> {
    let Some(path) = normalize(uri.path(), slashes)? else {
        return Ok(());
    };
    let target = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = std::mem::take(uri).into_parts();
    // The normal form only removes characters or decodes unreserved ones,
    // so it is a valid path-and-query whenever the original was.
    parts.path_and_query = Some(target.parse().map_err(|_| PathError::BadEscape)?);
    *uri = http::Uri::from_parts(parts).map_err(|_| PathError::BadEscape)?;
    Ok(())
}

/// True when no rule would change or refuse `path` (which starts with
/// `/`): no `%`, `\` or NUL, no empty segment but a trailing one, no `.` or
/// `..` segment. One pass over the bytes, each segment judged at its end:
/// a scan for the refused bytes and then a split into segments cost every
/// request ~60 instructions on `/` (`bench/instructions.sh`).
fn is_normal(path: &[u8]) -> bool {
    // Where the current segment starts (after its `/`).
    let mut start = 1;
    for (i, &b) in path.iter().enumerate().skip(1) {
        match b {
            b'%' | b'\\' | 0 => return false,
            b'/' => {
                if matches!(&path[start..i], b"" | b"." | b"..") {
                    return false;
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    // The last segment may be empty (a trailing slash), not a dot segment.
    !matches!(path.get(start..), Some(b"." | b".."))
}

/// Rules 1 and 2: percent-encodings decoded or upper-cased; what must be
/// refused, refused.
fn decode(path: &[u8], slashes: EscapedSlashes) -> Result<Vec<u8>, PathError> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        match path[i] {
            b'%' => {
                let (Some(hi), Some(lo)) = (
                    path.get(i + 1).copied().and_then(hex),
                    path.get(i + 2).copied().and_then(hex),
                ) else {
                    return Err(PathError::BadEscape);
                };
                let byte = hi << 4 | lo;
                match byte {
                    0 => return Err(PathError::Nul),
                    b'/' | b'\\' if slashes == EscapedSlashes::Reject => {
                        return Err(PathError::EncodedSlash);
                    }
                    b if is_unreserved(b) => out.push(b),
                    b => {
                        out.push(b'%');
                        out.push(HEX[usize::from(b >> 4)]);
                        out.push(HEX[usize::from(b & 0xf)]);
                    }
                }
                i += 3;
            }
            b'\\' => return Err(PathError::Backslash),
            0 => return Err(PathError::Nul),
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Rules 3 and 4 on a decoded path that starts with `/`.
fn remove_dot_segments(path: &[u8]) -> Result<String, PathError> {
    let mut kept: Vec<&[u8]> = Vec::new();
    let mut trailing_slash = false;
    let mut segments = path[1..].split(|&b| b == b'/').peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        match segment {
            b"" | b"." => trailing_slash = last,
            b".." => {
                if kept.pop().is_none() {
                    return Err(PathError::EscapesRoot);
                }
                trailing_slash = last;
            }
            _ => {
                kept.push(segment);
                trailing_slash = false;
            }
        }
    }
    let mut out = Vec::with_capacity(path.len());
    for segment in &kept {
        out.push(b'/');
        out.extend_from_slice(segment);
    }
    if out.is_empty() || trailing_slash {
        out.push(b'/');
    }
    // Only ASCII went in: the input was a URI path and decoding produced
    // unreserved (ASCII) characters only.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(path: &str) -> Result<String, PathError> {
        normalize(path, EscapedSlashes::Reject).map(|n| n.unwrap_or_else(|| path.to_owned()))
    }

    #[test]
    fn normal_paths_are_recognised_without_work() {
        for path in ["/", "/login", "/a/b/", "/a.b/c..d/.e", "/~user/x-y_z"] {
            assert_eq!(normalize(path, EscapedSlashes::Reject), Ok(None), "{path}");
        }
        assert_eq!(normalize("*", EscapedSlashes::Reject), Ok(None));
    }

    #[test]
    fn percent_encodings() {
        assert_eq!(norm("/%6cogin").unwrap(), "/login");
        assert_eq!(norm("/%4C%4f%47").unwrap(), "/LOG");
        assert_eq!(norm("/a%2db%7E").unwrap(), "/a-b~");
        assert_eq!(norm("/caf%c3%a9").unwrap(), "/caf%C3%A9");
        assert_eq!(
            norm("/100%25").unwrap(),
            "/100%25",
            "%25 is not decoded twice"
        );
        assert_eq!(norm("/a%20b").unwrap(), "/a%20b");
        assert_eq!(norm("/%"), Err(PathError::BadEscape));
        assert_eq!(norm("/%4"), Err(PathError::BadEscape));
        assert_eq!(norm("/%zz"), Err(PathError::BadEscape));
    }

    #[test]
    fn slashes_backslashes_and_nul() {
        assert_eq!(norm("/a%2Fb"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/a%2fb"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/a%5cb"), Err(PathError::EncodedSlash));
        assert_eq!(norm("/a\\b"), Err(PathError::Backslash));
        assert_eq!(norm("/a%00"), Err(PathError::Nul));
        assert_eq!(
            normalize("/a%2fb/./c", EscapedSlashes::Keep),
            Ok(Some("/a%2Fb/c".to_owned()))
        );
        assert_eq!(
            normalize("/a%5Cb", EscapedSlashes::Keep),
            Ok(None),
            "kept as written when already upper-case"
        );
        assert_eq!(
            normalize("/a%00", EscapedSlashes::Keep),
            Err(PathError::Nul)
        );
    }

    #[test]
    fn uris_keep_their_query_and_authority() {
        let mut uri: http::Uri = "/x/../%6cogin?next=/a/../b".parse().unwrap();
        normalize_uri(&mut uri, EscapedSlashes::Reject).unwrap();
        assert_eq!(uri, "/login?next=/a/../b");
        let mut uri: http::Uri = "http://example.com//a/./b".parse().unwrap();
        normalize_uri(&mut uri, EscapedSlashes::Reject).unwrap();
        assert_eq!(uri, "http://example.com/a/b");
        let mut uri: http::Uri = "/a%2fb".parse().unwrap();
        assert_eq!(
            normalize_uri(&mut uri, EscapedSlashes::Reject),
            Err(PathError::EncodedSlash)
        );
    }

    #[test]
    fn slash_runs_and_dot_segments() {
        assert_eq!(norm("//login").unwrap(), "/login");
        assert_eq!(norm("///a//b///").unwrap(), "/a/b/");
        assert_eq!(norm("/./login").unwrap(), "/login");
        assert_eq!(norm("/x/../login").unwrap(), "/login");
        assert_eq!(norm("/x/%2e%2e/login").unwrap(), "/login");
        assert_eq!(norm("/x/.%2E/login").unwrap(), "/login");
        assert_eq!(norm("/a/b/../../c").unwrap(), "/c");
        assert_eq!(norm("/a/.").unwrap(), "/a/");
        assert_eq!(norm("/a/..").unwrap(), "/");
        assert_eq!(norm("/a/b/..").unwrap(), "/a/");
        assert_eq!(norm("/.").unwrap(), "/");
        assert_eq!(norm("/.."), Err(PathError::EscapesRoot));
        assert_eq!(norm("/a/../.."), Err(PathError::EscapesRoot));
        assert_eq!(norm("/%2e%2e/etc"), Err(PathError::EscapesRoot));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    /// Paths built from the pieces that matter: dots, slashes, escapes of
    /// every class, and ordinary characters.
    fn paths() -> impl Strategy<Value = String> {
        let piece = prop::sample::select(vec![
            "a", "B", "~", "-", ".", "..", "/", "//", "%2e", "%2E", "%2f", "%5c", "%41", "%6c",
            "%c3%a9", "%25", "%", "%4", "%zz", "\\", "%00", "x.y",
        ]);
        prop::collection::vec(piece, 0..12).prop_map(|pieces| format!("/{}", pieces.concat()))
    }

    /// [`is_normal`] as the rule reads, in two passes.
    fn is_normal_by_rule(path: &[u8]) -> bool {
        if path.iter().any(|&b| matches!(b, b'%' | b'\\' | 0)) {
            return false;
        }
        let mut segments = path[1..].split(|&b| b == b'/').peekable();
        while let Some(segment) = segments.next() {
            let last = segments.peek().is_none();
            match segment {
                b"." | b".." => return false,
                b"" if !last => return false,
                _ => {}
            }
        }
        true
    }

    proptest! {
        #[test]
        fn the_one_pass_check_is_the_rule(path in paths()) {
            prop_assert_eq!(is_normal(path.as_bytes()), is_normal_by_rule(path.as_bytes()), "{}", path);
        }

        #[test]
        fn normalising_twice_is_normalising_once(path in paths()) {
            for slashes in [EscapedSlashes::Reject, EscapedSlashes::Keep] {
                if let Ok(normal) = normalize(&path, slashes) {
                    let normal = normal.unwrap_or_else(|| path.clone());
                    prop_assert_eq!(normalize(&normal, slashes), Ok(None), "{} -> {}", path, normal);
                    prop_assert!(normal.starts_with('/'));
                    for bad in ["/../", "/./", "//"] {
                        prop_assert!(!normal.contains(bad), "{} -> {}", path, normal);
                    }
                    prop_assert!(!normal.ends_with("/.") && !normal.ends_with("/.."), "{}", normal);
                    prop_assert!(!normal.contains('\\'));
                }
            }
        }
    }
}
