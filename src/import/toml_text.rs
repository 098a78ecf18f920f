//! The pieces of TOML an importer writes by hand (strings, table keys,
//! comments), so its output keeps the order and comments it chose; a
//! serializer would sort or drop them.

use std::fmt::Write;

/// `text` as a TOML basic string, quotes included.
pub(crate) fn string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `text` as one key of a dotted table header: bare where TOML allows it.
pub(crate) fn key(text: &str) -> String {
    let bare = !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare { text.to_owned() } else { string(text) }
}

/// `text` fit for a comment: TOML allows no control character there but
/// tab, so the others are written as escapes.
pub(crate) fn comment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\t' {
            let _ = write!(out, "\\u{:04X}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_keys_read_back_as_written() {
        for text in [
            "plain",
            "a \"quoted\" \\ path",
            "tab\tnew\nline\r\u{1}\u{7f}",
            "ünï",
            "",
        ] {
            let document = format!("{} = {}\n", key(text), string(text));
            let table: toml::Table = toml::from_str(&document).expect(&document);
            assert_eq!(table[text].as_str(), Some(text), "{document}");
        }
        assert_eq!(key("mongo_cps-1"), "mongo_cps-1");
        assert_eq!(key("a.b"), "\"a.b\"");
    }

    #[test]
    fn comments_hold_no_line_break() {
        let text = comment("a\nb\r\u{0}\tc");
        assert_eq!(text, "a\\u000Ab\\u000D\\u0000\tc");
        let document = format!("# {text}\n");
        toml::from_str::<toml::Table>(&document).expect(&document);
    }
}
