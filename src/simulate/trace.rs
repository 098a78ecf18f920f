//! Reading a trace: one request a record, as CSV with a header row or as
//! JSON lines, from a file or stdin (`-`), gzip-compressed or not.
//!
//! The format is told by the bytes, not the file name: gzip by its magic
//! bytes (`1f 8b`), then JSON lines when the first non-blank byte is `{`,
//! else CSV.
//!
//! A record has `time` (RFC 3339, `2026-03-01T10:00:00.250Z`, or seconds
//! since the Unix epoch, `1772359200.25`), `method`, `path` (with its query),
//! and optionally `host`, `ip` (the TCP peer the gateway would see; absent:
//! `0.0.0.0`), `headers`, `body` and `tokens`. In JSON lines `headers` is an
//! object of name to value (or list of values); in CSV it is a column
//! holding that object as JSON, and a column `header:NAME` holds one
//! header's value. An empty CSV cell is an absent field.
//!
//! `tokens` is what the request's response used (its usage, a non-negative
//! integer; in JSON lines a number or a string of digits), which settles a
//! token limit's reservation as the response's usage does on the gateway;
//! absent, the reservation stands, as for a response without usage.
//!
//! A record that does not parse is reported with its line number and
//! skipped; a header row that names an unknown column, or a stream that
//! cannot be read (a truncated gzip file), stops the run.
//!
//! Example (CSV):
//!
//! ```text
//! time,method,path,ip,header:x-api-key
//! 2026-03-01T10:00:00Z,GET,/reports/7,203.0.113.9,k-7f3a9c
//! ```

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr};

use bytes::Bytes;
use http::header::HOST;
use http::request::Parts;
use http::{HeaderName, HeaderValue, Method, Request, Uri};

use super::Error;
use crate::limit::{NANOS_PER_SEC, Nanos};

/// One request of a trace, ready for the gateway's functions.
#[derive(Debug)]
pub(crate) struct Record {
    /// Line in the trace (1-based; generated records count from 1).
    pub(crate) line: u64,
    /// When it arrived, in ns since the Unix epoch.
    pub(crate) time: Nanos,
    /// Method, target, headers (with `Host` from `host`).
    pub(crate) parts: Parts,
    /// The TCP peer.
    pub(crate) peer: IpAddr,
    pub(crate) body: Option<Bytes>,
    /// The tokens its response used (`tokens`), for token limits.
    pub(crate) tokens: Option<u64>,
}

/// A record that was skipped, or (`fatal`) why reading stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) line: u64,
    pub(crate) message: String,
    pub(crate) fatal: bool,
}

/// What a trace yields, record by record.
pub(crate) type Item = Result<Record, Problem>;

/// The fields of a record, as text, before they are checked.
#[derive(Debug, Default)]
struct Fields<'a> {
    time: Option<TimeField<'a>>,
    method: Option<&'a str>,
    path: Option<&'a str>,
    host: Option<&'a str>,
    ip: Option<&'a str>,
    headers: Vec<(&'a str, &'a str)>,
    body: Option<&'a str>,
    tokens: Option<TokensField<'a>>,
}

/// `tokens` as written: CSV text, or a JSON number or string.
#[derive(Debug, Clone, Copy)]
enum TokensField<'a> {
    Text(&'a str),
    Number(&'a serde_json::Number),
}

#[derive(Debug, Clone, Copy)]
enum TimeField<'a> {
    Text(&'a str),
    Number(&'a serde_json::Number),
}

/// Opens `source` (a path, or `-` for stdin) and reads its records lazily.
pub(crate) fn open(source: &str) -> Result<TraceReader, Error> {
    let name = if source == "-" { "stdin" } else { source };
    let raw: Box<dyn Read> = if source == "-" {
        Box::new(std::io::stdin())
    } else {
        Box::new(File::open(source).map_err(|e| Error::Failed(format!("cannot read {name}: {e}")))?)
    };
    TraceReader::new(raw, name)
}

/// Records of a trace, in file order.
pub(crate) struct TraceReader {
    format: Format,
}

enum Format {
    Json {
        input: Box<dyn BufRead>,
        line: u64,
        buffer: String,
        done: bool,
    },
    Csv {
        lines: Lines,
        columns: Vec<Column>,
    },
}

/// What a CSV column holds.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Column {
    Time,
    Method,
    Path,
    Host,
    Ip,
    Body,
    /// The tokens the response used.
    Tokens,
    /// A JSON object of headers.
    Headers,
    /// One header, `header:NAME`.
    Header(String),
}

const COLUMNS: &str = "time, method, path, host, ip, headers, body, tokens, header:NAME";

impl TraceReader {
    /// Reads a trace from `raw`, named `name` in messages.
    pub(crate) fn new(raw: Box<dyn Read>, name: &str) -> Result<TraceReader, Error> {
        let unreadable = |e: std::io::Error| Error::Failed(format!("cannot read {name}: {e}"));
        let mut input: Box<dyn BufRead> = Box::new(BufReader::with_capacity(1 << 16, raw));
        if input
            .fill_buf()
            .map_err(unreadable)?
            .starts_with(&[0x1f, 0x8b])
        {
            let inflated = flate2::bufread::MultiGzDecoder::new(input);
            input = Box::new(BufReader::with_capacity(1 << 16, inflated));
        }
        // Blank lines may precede the first record; look past them.
        let first = loop {
            let buffer = input.fill_buf().map_err(unreadable)?;
            match buffer.iter().position(|b| !b.is_ascii_whitespace()) {
                Some(i) => break Some(buffer[i]),
                None if buffer.is_empty() => break None,
                None => {
                    let n = buffer.len();
                    input.consume(n);
                }
            }
        };
        let format = if first == Some(b'{') || first.is_none() {
            Format::Json {
                input,
                line: 0,
                buffer: String::new(),
                done: false,
            }
        } else {
            let mut lines = Lines::new(input);
            let header = match lines.record() {
                Some(Ok((_, cells))) => cells,
                Some(Err(problem)) => {
                    return Err(Error::Failed(format!(
                        "{name}:{}: {}",
                        problem.line, problem.message
                    )));
                }
                None => Vec::new(),
            };
            let columns = csv_columns(&header)
                .map_err(|m| Error::Failed(format!("{name}:{}: {m}", lines.line)))?;
            Format::Csv { lines, columns }
        };
        Ok(TraceReader { format })
    }
}

fn csv_columns(header: &[String]) -> Result<Vec<Column>, String> {
    let mut columns = Vec::with_capacity(header.len());
    for name in header {
        let column = match name.to_ascii_lowercase().as_str() {
            "time" => Column::Time,
            "method" => Column::Method,
            "path" => Column::Path,
            "host" => Column::Host,
            "ip" => Column::Ip,
            "body" => Column::Body,
            "tokens" => Column::Tokens,
            "headers" => Column::Headers,
            other => match other.strip_prefix("header:") {
                Some(header) if !header.is_empty() => Column::Header(header.to_owned()),
                _ => {
                    return Err(format!(
                        "unknown column `{name}`, expected one of {COLUMNS}"
                    ));
                }
            },
        };
        if columns.contains(&column) {
            return Err(format!("column `{name}` appears twice"));
        }
        columns.push(column);
    }
    for (wanted, column) in [
        ("time", Column::Time),
        ("method", Column::Method),
        ("path", Column::Path),
    ] {
        if !columns.contains(&column) {
            return Err(format!("the header row has no `{wanted}` column"));
        }
    }
    Ok(columns)
}

impl Iterator for TraceReader {
    type Item = Item;

    fn next(&mut self) -> Option<Item> {
        match &mut self.format {
            Format::Json {
                input,
                line,
                buffer,
                done,
            } => loop {
                if *done {
                    return None;
                }
                buffer.clear();
                *line += 1;
                match input.read_line(buffer) {
                    Ok(0) => {
                        *done = true;
                        return None;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        *done = true;
                        return Some(Err(fatal(*line, e)));
                    }
                }
                if buffer.trim().is_empty() {
                    continue;
                }
                return Some(json_record(*line, buffer));
            },
            Format::Csv { lines, columns } => loop {
                let (line, cells) = match lines.record()? {
                    Ok(record) => record,
                    Err(problem) => return Some(Err(problem)),
                };
                if cells.iter().all(String::is_empty) {
                    continue;
                }
                if cells.len() > columns.len() {
                    return Some(Err(bad(
                        line,
                        format!(
                            "{} fields, but the header row names {} columns",
                            cells.len(),
                            columns.len()
                        ),
                    )));
                }
                return Some(csv_record(line, columns, &cells));
            },
        }
    }
}

/// CSV records (RFC 4180: `"` quotes a field, `""` is a quote inside one, a
/// quoted field may span lines), each with the line it starts on. Unquoted
/// fields are trimmed.
struct Lines {
    input: Box<dyn BufRead>,
    /// The last line read (1-based).
    line: u64,
    text: String,
    done: bool,
}

impl Lines {
    fn new(input: Box<dyn BufRead>) -> Lines {
        Lines {
            input,
            line: 0,
            text: String::new(),
            done: false,
        }
    }

    /// Reads one more line onto `text`; false at the end.
    fn more(&mut self) -> Result<bool, Problem> {
        match self.input.read_line(&mut self.text) {
            Ok(0) => Ok(false),
            Ok(_) => {
                self.line += 1;
                Ok(true)
            }
            Err(e) => {
                self.done = true;
                Err(fatal(self.line + 1, e))
            }
        }
    }

    /// The next record's line and fields; `None` at the end.
    fn record(&mut self) -> Option<Result<(u64, Vec<String>), Problem>> {
        if self.done {
            return None;
        }
        self.text.clear();
        match self.more() {
            Ok(true) => {}
            Ok(false) => {
                self.done = true;
                return None;
            }
            Err(problem) => return Some(Err(problem)),
        }
        let start = self.line;
        // A quoted field may hold line breaks: read on while a quote is open.
        while self.text.bytes().filter(|b| *b == b'"').count() % 2 == 1 {
            match self.more() {
                Ok(true) => {}
                Ok(false) => {
                    self.done = true;
                    return Some(Err(bad(start, "a quoted field is not closed")));
                }
                Err(problem) => return Some(Err(problem)),
            }
        }
        let text = self.text.trim_end_matches(['\r', '\n']);
        Some(
            split_fields(text)
                .map(|cells| (start, cells))
                .map_err(|m| bad(start, m)),
        )
    }
}

/// The fields of one CSV record.
fn split_fields(text: &str) -> Result<Vec<String>, String> {
    let mut cells = Vec::new();
    let mut rest = text;
    loop {
        let trimmed = rest.trim_start();
        if let Some(quoted) = trimmed.strip_prefix('"') {
            let mut cell = String::new();
            let mut chars = quoted.char_indices();
            let after = loop {
                match chars.next() {
                    None => return Err("a quoted field is not closed".into()),
                    Some((i, '"')) => {
                        if quoted[i + 1..].starts_with('"') {
                            cell.push('"');
                            chars.next();
                        } else {
                            break &quoted[i + 1..];
                        }
                    }
                    Some((_, c)) => cell.push(c),
                }
            };
            cells.push(cell);
            let after = after.trim_start();
            match after.strip_prefix(',') {
                Some(next) => rest = next,
                None if after.is_empty() => return Ok(cells),
                None => {
                    return Err(
                        "text after a closing quote; write \"\" for a quote inside a field".into(),
                    );
                }
            }
        } else {
            match rest.split_once(',') {
                Some((cell, next)) => {
                    cells.push(cell.trim().to_owned());
                    rest = next;
                }
                None => {
                    cells.push(rest.trim().to_owned());
                    return Ok(cells);
                }
            }
        }
    }
}

fn fatal(line: u64, e: std::io::Error) -> Problem {
    Problem {
        line,
        message: format!("cannot read the trace: {e}"),
        fatal: true,
    }
}

fn bad(line: u64, message: impl Into<String>) -> Problem {
    Problem {
        line,
        message: message.into(),
        fatal: false,
    }
}

/// One JSON-lines record.
fn json_record(line: u64, text: &str) -> Item {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(line, format!("not JSON: {e}")))?;
    let serde_json::Value::Object(object) = &value else {
        return Err(bad(line, "a record is a JSON object"));
    };
    let mut fields = Fields::default();
    let text_of = |key: &str, value: &'_ serde_json::Value| -> Result<(), Problem> {
        if value.is_string() {
            Ok(())
        } else {
            Err(bad(line, format!("`{key}` must be a string")))
        }
    };
    for (key, value) in object {
        match key.as_str() {
            "time" => {
                fields.time = Some(match value {
                    serde_json::Value::String(s) => TimeField::Text(s),
                    serde_json::Value::Number(n) => TimeField::Number(n),
                    _ => return Err(bad(line, "`time` must be a string or a number")),
                })
            }
            "method" | "path" | "host" | "ip" | "body" => {
                if value.is_null() {
                    continue;
                }
                text_of(key, value)?;
                let s = value.as_str();
                match key.as_str() {
                    "method" => fields.method = s,
                    "path" => fields.path = s,
                    "host" => fields.host = s,
                    "ip" => fields.ip = s,
                    _ => fields.body = s,
                }
            }
            "headers" => json_headers(line, value, &mut fields.headers)?,
            "tokens" => {
                fields.tokens = match value {
                    serde_json::Value::Null => None,
                    serde_json::Value::Number(n) => Some(TokensField::Number(n)),
                    serde_json::Value::String(s) => Some(TokensField::Text(s)),
                    _ => return Err(bad(line, TOKENS_WANTED)),
                }
            }
            other => {
                return Err(bad(
                    line,
                    format!(
                        "unknown field `{other}`, expected one of time, method, path, host, ip, headers, body, tokens"
                    ),
                ));
            }
        }
    }
    build(line, &fields)
}

fn json_headers<'a>(
    line: u64,
    value: &'a serde_json::Value,
    headers: &mut Vec<(&'a str, &'a str)>,
) -> Result<(), Problem> {
    let not_headers = || {
        bad(
            line,
            "`headers` must be an object of header name to a string or a list of strings",
        )
    };
    let serde_json::Value::Object(map) = value else {
        return if value.is_null() {
            Ok(())
        } else {
            Err(not_headers())
        };
    };
    for (name, value) in map {
        match value {
            serde_json::Value::String(s) => headers.push((name, s)),
            serde_json::Value::Array(values) => {
                for v in values {
                    headers.push((name, v.as_str().ok_or_else(not_headers)?));
                }
            }
            _ => return Err(not_headers()),
        }
    }
    Ok(())
}

/// One CSV record.
fn csv_record(line: u64, columns: &[Column], cells: &[String]) -> Item {
    let mut fields = Fields::default();
    let mut header_json = None;
    for (column, cell) in columns.iter().zip(cells) {
        let cell = cell.as_str();
        if cell.is_empty() {
            continue;
        }
        match column {
            Column::Time => fields.time = Some(TimeField::Text(cell)),
            Column::Method => fields.method = Some(cell),
            Column::Path => fields.path = Some(cell),
            Column::Host => fields.host = Some(cell),
            Column::Ip => fields.ip = Some(cell),
            Column::Body => fields.body = Some(cell),
            Column::Tokens => fields.tokens = Some(TokensField::Text(cell)),
            Column::Header(name) => fields.headers.push((name, cell)),
            Column::Headers => header_json = Some(cell),
        }
    }
    let parsed;
    if let Some(text) = header_json {
        parsed = serde_json::from_str::<serde_json::Value>(text)
            .map_err(|e| bad(line, format!("`headers` is not a JSON object: {e}")))?;
        json_headers(line, &parsed, &mut fields.headers)?;
    }
    build(line, &fields)
}

/// Checks the fields and builds the request head the gateway would parse.
fn build(line: u64, fields: &Fields<'_>) -> Item {
    let time = match fields.time {
        None => return Err(bad(line, "no `time`")),
        Some(TimeField::Text(text)) => parse_time(text),
        Some(TimeField::Number(n)) => number_time(n),
    }
    .map_err(|m| bad(line, m))?;
    let method = fields.method.ok_or_else(|| bad(line, "no `method`"))?;
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| bad(line, format!("`{method}` is not an HTTP method")))?;
    let path = fields.path.ok_or_else(|| bad(line, "no `path`"))?;
    let uri: Uri = path
        .parse()
        .ok()
        .filter(|u: &Uri| u.path().starts_with('/'))
        .ok_or_else(|| bad(line, format!("`{path}` is not a request path")))?;
    let peer = match fields.ip {
        None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        Some(ip) => ip
            .parse()
            .map_err(|_| bad(line, format!("`{ip}` is not an IP address")))?,
    };
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    let headers = request.headers_mut();
    if let Some(host) = fields.host {
        let value = HeaderValue::from_str(host)
            .map_err(|_| bad(line, format!("`{host}` is not a host")))?;
        headers.insert(HOST, value);
    }
    for (name, value) in &fields.headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| bad(line, format!("`{name}` is not a header name")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| bad(line, format!("the value of header `{name}` is not valid")))?;
        headers.append(header, value);
    }
    let body = fields.body.map(|b| Bytes::copy_from_slice(b.as_bytes()));
    let tokens = fields
        .tokens
        .map(|field| tokens_used(field).ok_or_else(|| bad(line, TOKENS_WANTED)))
        .transpose()?;
    Ok(Record {
        line,
        time,
        parts: request.into_parts().0,
        peer,
        body,
        tokens,
    })
}

const TOKENS_WANTED: &str = "`tokens` must be a non-negative integer, the tokens the response used";

/// `tokens` as a count: digits only (no sign, no fraction, no exponent).
fn tokens_used(field: TokensField<'_>) -> Option<u64> {
    match field {
        TokensField::Number(n) => n.as_u64(),
        TokensField::Text(text) => {
            let text = text.trim();
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            text.parse().ok()
        }
    }
}

/// `time` as a JSON number: seconds since the epoch.
fn number_time(n: &serde_json::Number) -> Result<Nanos, String> {
    if let Some(secs) = n.as_u64() {
        return secs
            .checked_mul(NANOS_PER_SEC)
            .ok_or_else(|| format!("time `{n}` is too far in the future"));
    }
    match n.as_f64() {
        Some(secs) if secs >= 0.0 && secs < (u64::MAX / NANOS_PER_SEC) as f64 => {
            Ok((secs * NANOS_PER_SEC as f64).round() as Nanos)
        }
        _ => Err(format!(
            "time `{n}` is not a time: seconds since 1970 (not negative)"
        )),
    }
}

/// RFC 3339 (`2026-03-01T10:00:00.25Z`, `...+01:00`) or decimal seconds
/// since the epoch (`1772359200.25`), to ns since the epoch.
pub(crate) fn parse_time(text: &str) -> Result<Nanos, String> {
    let text = text.trim();
    if text.bytes().next().is_some_and(|b| b.is_ascii_digit()) && !text.contains('-') {
        return decimal_seconds(text)
            .ok_or_else(|| format!("time `{text}` is not seconds since 1970 or RFC 3339"));
    }
    crate::http::rfc3339::parse(text).ok_or_else(|| {
        format!("time `{text}` is not RFC 3339 (2026-03-01T10:00:00Z) or seconds since 1970")
    })
}

/// `123` or `123.456789`, exactly (digits past the ninth are dropped).
fn decimal_seconds(text: &str) -> Option<Nanos> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let secs: u64 = whole.parse().ok()?;
    let mut nanos = 0u64;
    for i in 0..9 {
        let digit = fraction
            .as_bytes()
            .get(i)
            .map_or(0, |b| u64::from(b - b'0'));
        nanos = nanos * 10 + digit;
    }
    secs.checked_mul(NANOS_PER_SEC)?.checked_add(nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = NANOS_PER_SEC;

    fn read(text: &[u8]) -> Vec<Item> {
        TraceReader::new(Box::new(std::io::Cursor::new(text.to_vec())), "t")
            .unwrap()
            .collect()
    }

    #[test]
    fn times_in_both_spellings() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_time("2026-03-01T10:00:00Z"), Ok(1_772_359_200 * S));
        assert_eq!(
            parse_time("2026-03-01T11:00:00.25+01:00"),
            Ok(1_772_359_200 * S + 250_000_000)
        );
        assert_eq!(
            parse_time("1772359200.25"),
            Ok(1_772_359_200 * S + 250_000_000)
        );
        assert_eq!(parse_time("1772359200"), Ok(1_772_359_200 * S));
        assert_eq!(parse_time("2024-02-29 00:00:00Z"), Ok(1_709_164_800 * S));
        for bad in [
            "yesterday",
            "2023-02-29T00:00:00Z",
            "2026-03-01T10:00:00",
            "1969-12-31T23:59:59Z",
            "12.3.4",
            "",
        ] {
            assert!(parse_time(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn csv_with_header_columns_and_bad_lines() {
        let text = b"time,method,path,ip,header:x-api-key,host\n\
            1772359200,GET,/a?x=1,192.0.2.1,k1,example.com\n\
            soon,GET,/a,,,\n\
            1772359201,GET,/a,not-an-ip,,\n\
            \n\
            1772359202.5,POST,/login,,,\n";
        let items = read(text);
        assert_eq!(items.len(), 4);
        let first = items[0].as_ref().unwrap();
        assert_eq!(first.line, 2);
        assert_eq!(first.parts.uri, "/a?x=1");
        assert_eq!(first.parts.headers["x-api-key"], "k1");
        assert_eq!(first.parts.headers["host"], "example.com");
        assert_eq!(first.peer, "192.0.2.1".parse::<IpAddr>().unwrap());
        let second = items[1].as_ref().unwrap_err();
        assert_eq!(second.line, 3);
        assert!(second.message.contains("soon"), "{}", second.message);
        assert_eq!(items[2].as_ref().unwrap_err().line, 4);
        let last = items[3].as_ref().unwrap();
        assert_eq!((last.line, last.time), (6, 1_772_359_202 * S + S / 2));
        assert_eq!(last.peer, IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    }

    #[test]
    fn csv_quoting() {
        assert_eq!(
            split_fields(
                r#"a, "b,c" ,"say ""hi""",,"two
lines""#
            )
            .unwrap(),
            ["a", "b,c", "say \"hi\"", "", "two\nlines"]
        );
        assert!(split_fields(r#""open"#).is_err());
        assert!(split_fields(r#""a"b,c"#).is_err());
        let text = b"time,method,path,headers\n\
            1,GET,/,\"{\"\"x-a\"\": \"\"1\"\"}\"\n\
            2,GET,/,\"not\n\
            json\"\n\
            3,GET,/,,extra\n";
        let items = read(text);
        assert_eq!(items[0].as_ref().unwrap().parts.headers["x-a"], "1");
        assert_eq!(
            items[1].as_ref().unwrap_err().line,
            3,
            "a record's first line"
        );
        assert_eq!(items[2].as_ref().unwrap_err().line, 5);
    }

    #[test]
    fn unknown_csv_column_stops_at_once() {
        let reader = TraceReader::new(
            Box::new(std::io::Cursor::new(b"time,verb,path\n".to_vec())),
            "t",
        );
        let Err(Error::Failed(message)) = reader else {
            panic!("accepted an unknown column");
        };
        assert!(message.contains("unknown column `verb`"), "{message}");
    }

    #[test]
    fn json_lines_with_headers_and_body() {
        let text = br#"{"time":"2026-03-01T10:00:00Z","method":"POST","path":"/login","headers":{"cookie":["a=1","sid=2"],"content-type":"application/json"},"body":"{\"username\":\"bob\"}"}

{"time":1772359200.5,"method":"GET","path":"/x","extra":1}
{"time":1772359201,"method":"GET"}
not json
"#;
        let items = read(text);
        assert_eq!(items.len(), 4);
        let first = items[0].as_ref().unwrap();
        assert_eq!(first.parts.headers.get_all("cookie").iter().count(), 2);
        assert_eq!(first.body.as_deref(), Some(&b"{\"username\":\"bob\"}"[..]));
        let lines: Vec<u64> = items[1..]
            .iter()
            .map(|i| i.as_ref().unwrap_err().line)
            .collect();
        assert_eq!(lines, [3, 4, 5]);
        assert!(items[1].as_ref().unwrap_err().message.contains("extra"));
        assert!(items[2].as_ref().unwrap_err().message.contains("path"));
    }

    #[test]
    fn tokens_column_holds_the_usage_or_is_a_bad_record() {
        let text = b"time,method,path,tokens\n\
            1,POST,/v1,250\n\
            2,POST,/v1,\n\
            3,POST,/v1, 0 \n\
            4,POST,/v1,-5\n\
            5,POST,/v1,1.5\n\
            6,POST,/v1,many\n\
            7,POST,/v1,99999999999999999999999\n";
        let items = read(text);
        let tokens: Vec<Option<u64>> = items[..3]
            .iter()
            .map(|i| i.as_ref().unwrap().tokens)
            .collect();
        assert_eq!(tokens, [Some(250), None, Some(0)]);
        for item in &items[3..] {
            let problem = item.as_ref().unwrap_err();
            assert!(
                problem
                    .message
                    .contains("`tokens` must be a non-negative integer"),
                "{}",
                problem.message
            );
            assert!(!problem.fatal);
        }
        assert_eq!(items.len(), 7);
    }

    #[test]
    fn tokens_field_in_json_lines() {
        let text = br#"{"time":1,"method":"POST","path":"/v1","tokens":1200}
{"time":2,"method":"POST","path":"/v1","tokens":"30"}
{"time":3,"method":"POST","path":"/v1","tokens":null}
{"time":4,"method":"POST","path":"/v1"}
{"time":5,"method":"POST","path":"/v1","tokens":-1}
{"time":6,"method":"POST","path":"/v1","tokens":2.5}
{"time":7,"method":"POST","path":"/v1","tokens":true}
"#;
        let items = read(text);
        let tokens: Vec<Option<u64>> = items[..4]
            .iter()
            .map(|i| i.as_ref().unwrap().tokens)
            .collect();
        assert_eq!(tokens, [Some(1200), Some(30), None, None]);
        let lines: Vec<u64> = items[4..]
            .iter()
            .map(|i| i.as_ref().unwrap_err().line)
            .collect();
        assert_eq!(lines, [5, 6, 7]);
    }

    #[test]
    fn gzip_is_told_by_its_magic_bytes() {
        use std::io::Write;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder
            .write_all(b"{\"time\":1,\"method\":\"GET\",\"path\":\"/\"}\n")
            .unwrap();
        let items = read(&encoder.finish().unwrap());
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].as_ref().unwrap().time, S);
        // Cut short: the run stops with a fatal problem, never a panic.
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for _ in 0..2000 {
            encoder
                .write_all(b"{\"time\":1,\"method\":\"GET\",\"path\":\"/\"}\n")
                .unwrap();
        }
        let bytes = encoder.finish().unwrap();
        let items = read(&bytes[..bytes.len() / 2]);
        assert!(items.last().unwrap().as_ref().is_err_and(|p| p.fatal));
    }
}
