//! `body:FIELD` keys: the top-level fields of a JSON or
//! `application/x-www-form-urlencoded` request body.
//!
//! The handler buffers at most `server.max_key_body` bytes of the body for
//! this (and forwards those bytes unchanged, followed by the rest of the
//! stream). A body over the cap, or one that does not parse, has no fields:
//! the key is missing and the limit's `on_missing_key` decides. Only login-like
//! routes key on the body, so parsing here allocates freely.

/// The top-level fields of a body, as the bytes a key is made of: a JSON
/// string's contents, any other JSON value's text, a form value decoded.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BodyFields(Vec<(String, Vec<u8>)>);

impl BodyFields {
    /// Parses `body` by its `Content-Type` (JSON when it says `json`, a form
    /// when it says `x-www-form-urlencoded`, otherwise whichever parses).
    pub(crate) fn parse(content_type: Option<&str>, body: &[u8]) -> BodyFields {
        let content_type = content_type.unwrap_or("").to_ascii_lowercase();
        if content_type.contains("json") {
            return BodyFields::json(body).unwrap_or_default();
        }
        if content_type.contains("x-www-form-urlencoded") {
            return BodyFields::form(body);
        }
        BodyFields::json(body).unwrap_or_else(|| BodyFields::form(body))
    }

    /// The value of field `name`, if present.
    pub(crate) fn get(&self, name: &str) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_slice())
            .filter(|value| !value.is_empty())
    }

    fn json(body: &[u8]) -> Option<BodyFields> {
        let serde_json::Value::Object(map) = serde_json::from_slice(body).ok()? else {
            return None;
        };
        Some(BodyFields(
            map.into_iter()
                .map(|(key, value)| {
                    let bytes = match value {
                        serde_json::Value::String(s) => s.into_bytes(),
                        serde_json::Value::Null => Vec::new(),
                        other => other.to_string().into_bytes(),
                    };
                    (key, bytes)
                })
                .collect(),
        ))
    }

    fn form(body: &[u8]) -> BodyFields {
        BodyFields(
            body.split(|b| *b == b'&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let eq = pair.iter().position(|b| *b == b'=').unwrap_or(pair.len());
                    let key = percent_decode(&pair[..eq]);
                    let value = percent_decode(pair.get(eq + 1..).unwrap_or(&[]));
                    (String::from_utf8_lossy(&key).into_owned(), value)
                })
                .collect(),
        )
    }
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte;
/// a malformed escape is kept as written.
pub(crate) fn percent_decode(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        match input[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < input.len() => match (hex(input[i + 1]), hex(input[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            other => out.push(other),
        }
        i += 1;
    }
    out
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_fields() {
        let fields = BodyFields::parse(
            Some("application/json"),
            br#"{"username":"ann","id":42,"nested":{"username":"x"},"empty":""}"#,
        );
        assert_eq!(fields.get("username"), Some(&b"ann"[..]));
        assert_eq!(fields.get("id"), Some(&b"42"[..]));
        assert_eq!(fields.get("empty"), None);
        assert_eq!(fields.get("missing"), None);
    }

    #[test]
    fn form_fields_are_decoded() {
        let fields = BodyFields::parse(
            Some("application/x-www-form-urlencoded"),
            b"username=ann+lee%40example.com&password=x%2",
        );
        assert_eq!(fields.get("username"), Some(&b"ann lee@example.com"[..]));
        assert_eq!(fields.get("password"), Some(&b"x%2"[..]));
    }

    #[test]
    fn unparsable_json_has_no_fields() {
        let fields = BodyFields::parse(Some("application/json"), b"{\"username\": ");
        assert_eq!(fields.get("username"), None);
        // Without a content type, whichever parses.
        let fields = BodyFields::parse(None, b"username=bob");
        assert_eq!(fields.get("username"), Some(&b"bob"[..]));
    }
}
