//! What generated client N sends: the focus route's request (method, path,
//! host, match headers) with a value for every key kind the route's limits
//! read, so that N clients are N keys of each limit.
//!
//! The kinds are the ones `identity::keys` reads: `ip` (client N's address
//! in `10.0.0.0/8`, placed above `ipv4_prefix` so the masked networks differ
//! too), `header:NAME`, `query:NAME`, `cookie:NAME`, `body:FIELD` (the value
//! `client-N`), and the API key (`[api_keys]`: the header, or
//! `Authorization: Bearer`), which also stands for the `consumer` and
//! `tenant` keys it maps to. A route's match headers keep the route's values.
//!
//! **API keys.** Client N < C (the C consumers, by key) sends the N-th
//! consumer's key. Beyond them a client sends an *unknown* key (`client-N`),
//! as a real client without a consumer would: where the gateway admits
//! unknown keys as anonymous (`unknown_key = "anonymous"` and no
//! `require_consumer`), a `header:` limit on the key counts each one
//! separately while `consumer`/`tenant` limits skip them, exactly what
//! `identity::consumer::admit` makes of them. Where it would refuse them
//! (401), unknown keys would exercise no limit at all, so the consumers'
//! keys are cycled instead (and with no consumer, no key is sent); the
//! report's header line says which.
//!
//! `vary=` (a spec option) picks the kinds that vary; the others keep client
//! 0's value for every client.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, COOKIE, HOST};
use http::{HeaderName, HeaderValue, Method, Request};
use serde::Serialize;

use super::Error;
use super::trace::Record;
use crate::config::{ApiKeySource, Config, Consumer, KeyPart};
use crate::limit::Nanos;

/// One key kind the route's limits read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Ip,
    Header(HeaderName),
    Query(String),
    Cookie(String),
    Body(String),
    /// The API key, where `[api_keys]` reads it.
    ApiKey,
    /// A header the route matches on: it keeps the route's value.
    Matched(HeaderName),
}

impl Part {
    /// As a limit's `key` spells it.
    fn name(&self, api_keys: &ApiKeys) -> String {
        match self {
            Part::Ip => "ip".to_owned(),
            Part::Header(h) | Part::Matched(h) => format!("header:{h}"),
            Part::Query(q) => format!("query:{q}"),
            Part::Cookie(c) => format!("cookie:{c}"),
            Part::Body(f) => format!("body:{f}"),
            Part::ApiKey => format!("header:{}", api_keys.header()),
        }
    }
}

/// The API keys clients present (no `Debug`: it holds the keys).
struct ApiKeys {
    source: ApiKeySource,
    /// The first consumers' keys, in key order (as many as there are
    /// clients, at most).
    consumers: Vec<String>,
    /// Every consumer, by key: an unknown key must not be one.
    all: Arc<HashMap<String, Consumer>>,
    /// The gateway admits a key no consumer has (as anonymous).
    unknown_admitted: bool,
}

impl ApiKeys {
    fn header(&self) -> HeaderName {
        match &self.source {
            ApiKeySource::Header(name) => name.clone(),
            ApiKeySource::Bearer => AUTHORIZATION,
        }
    }

    /// Client `n`'s key, if it sends one.
    fn key(&self, n: u64) -> Option<String> {
        let c = self.consumers.len() as u64;
        if n < c {
            return Some(self.consumers[n as usize].clone());
        }
        if self.unknown_admitted {
            let key = format!("client-{n}");
            // A consumer may have been given a key of that spelling.
            return Some(if self.all.contains_key(&key) {
                format!("{key}-unknown")
            } else {
                key
            });
        }
        (c > 0).then(|| self.consumers[(n % c) as usize].clone())
    }
}

#[derive(Debug, Clone)]
struct Kind {
    part: Part,
    varies: bool,
}

/// Which API keys a run's clients sent, for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ApiKeyUse {
    /// The kind, e.g. `header:x-api-key`.
    pub(crate) kind: String,
    /// Consumers whose keys were sent.
    pub(crate) consumers: u64,
    /// Distinct unknown keys sent.
    pub(crate) unknown_keys: u64,
    /// The gateway refuses unknown keys here: the consumers' keys were
    /// cycled (or, with none, no key was sent).
    pub(crate) unknown_refused: bool,
}

/// What the generated clients varied, for the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Variation {
    /// Kinds whose value differs per client, as limits spell them.
    pub(crate) varied: Vec<String>,
    /// Kinds the limits read that every client sends alike.
    pub(crate) fixed: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) api_key: Option<ApiKeyUse>,
    /// The words of the header line: `50 keys varying ip, header:x-api-key
    /// (1 consumer, then unknown keys)`.
    #[serde(skip)]
    pub(crate) text: String,
}

/// The requests of clients 0..`keys`, as the focus route and its limits
/// want them.
pub(crate) struct Clients {
    method: Method,
    path: String,
    host: Option<HeaderValue>,
    headers: Vec<(HeaderName, HeaderValue)>,
    kinds: Vec<Kind>,
    api_keys: ApiKeys,
    ipv4_prefix: u8,
    keys: u64,
}

const KINDS: &str = "ip, header:NAME, query:NAME, cookie:NAME, body:FIELD, consumer, tenant";

impl Clients {
    /// `keys` clients of route `focus`, varying the kinds `vary` names (all
    /// the route's limits read when `None`).
    pub(crate) fn new(
        config: &Config,
        focus: Option<usize>,
        keys: u64,
        vary: Option<&[String]>,
    ) -> Result<Clients, Error> {
        let route = focus.map(|i| &config.routes[i]);
        let matcher = route.map(|r| &r.matcher);
        let path = matcher
            .and_then(|m| m.path.clone().or_else(|| m.path_prefix.clone()))
            .unwrap_or_else(|| "/".to_owned());
        let method = matcher
            .and_then(|m| m.methods.as_ref())
            .and_then(|methods| methods.first().cloned())
            .unwrap_or(Method::GET);
        let host = matcher
            .and_then(|m| m.host.as_deref())
            .and_then(|h| HeaderValue::from_str(h).ok());
        let headers = matcher.map(|m| m.headers.clone()).unwrap_or_default();
        let require_consumer = route.is_some_and(|r| r.require_consumer);
        let api_keys = {
            let mut sorted: Vec<&String> = config.consumers.keys().collect();
            sorted.sort();
            let wanted = usize::try_from(keys).unwrap_or(usize::MAX);
            ApiKeys {
                source: config.api_keys.source.clone(),
                consumers: sorted.iter().take(wanted).map(|k| (*k).clone()).collect(),
                all: config.consumers.clone(),
                unknown_admitted: !config.api_keys.reject_unknown && !require_consumer,
            }
        };
        let api_header = api_keys.header();
        let pinned = |name: &HeaderName| {
            (*name == HOST && host.is_some()) || headers.iter().any(|(h, _)| h == name)
        };
        let mut parts: Vec<Part> = Vec::new();
        let mut add = |part: Part| {
            if !parts.contains(&part) {
                parts.push(part);
            }
        };
        if require_consumer {
            add(Part::ApiKey);
        }
        let read = route
            .into_iter()
            .flat_map(|r| &r.limits)
            .flat_map(|&i| &config.limits[i].key);
        for part in read {
            match part {
                KeyPart::Ip => add(Part::Ip),
                KeyPart::Header(name) if pinned(name) => add(Part::Matched(name.clone())),
                KeyPart::Header(name) if *name == api_header => add(Part::ApiKey),
                KeyPart::Header(name) => add(Part::Header(name.clone())),
                KeyPart::Query(name) => add(Part::Query(name.clone())),
                KeyPart::Cookie(name) => add(Part::Cookie(name.clone())),
                KeyPart::BodyField(name) => add(Part::Body(name.clone())),
                KeyPart::Consumer | KeyPart::Tenant if pinned(&api_header) => {
                    add(Part::Matched(api_header.clone()));
                }
                KeyPart::Consumer | KeyPart::Tenant => add(Part::ApiKey),
                // A simulated client carries no signed token: its `jwt:`
                // keys are missing, as for a client without one.
                KeyPart::Route | KeyPart::Claim { .. } => {}
            }
        }
        let mut kinds: Vec<Kind> = parts
            .into_iter()
            .map(|part| Kind {
                varies: !matches!(part, Part::Matched(_)),
                part,
            })
            .collect();
        if let Some(vary) = vary {
            let route_name = route.map_or("(none)", |r| r.name.as_str());
            let chosen = vary
                .iter()
                .map(|item| chosen_kind(item, &kinds, &api_keys, route_name))
                .collect::<Result<Vec<usize>, Error>>()?;
            for (i, kind) in kinds.iter_mut().enumerate() {
                kind.varies = chosen.contains(&i);
            }
        }
        Ok(Clients {
            method,
            path,
            host,
            headers,
            kinds,
            api_keys,
            ipv4_prefix: config.client_ip.ipv4_prefix,
            keys,
        })
    }

    /// Client `client`'s request at `time`, record `line`.
    pub(crate) fn record(&self, line: u64, time: Nanos, client: u64) -> Record {
        let mut target = self.path.clone();
        let mut cookies = Vec::new();
        let mut fields = serde_json::Map::new();
        let mut set_headers: Vec<(HeaderName, String)> = Vec::new();
        let mut ip_client = client;
        for kind in &self.kinds {
            let n = if kind.varies { client } else { 0 };
            let value = format!("client-{n}");
            match &kind.part {
                Part::Ip => ip_client = n,
                Part::Header(name) => set_headers.push((name.clone(), value)),
                Part::Query(name) => {
                    target.push(if target.contains('?') { '&' } else { '?' });
                    target.push_str(name);
                    target.push('=');
                    target.push_str(&value);
                }
                Part::Cookie(name) => cookies.push(format!("{name}={value}")),
                Part::Body(name) => {
                    fields.insert(name.clone(), value.into());
                }
                Part::ApiKey => {
                    if let Some(key) = self.api_keys.key(n) {
                        let text = match self.api_keys.source {
                            ApiKeySource::Header(_) => key,
                            ApiKeySource::Bearer => format!("Bearer {key}"),
                        };
                        set_headers.push((self.api_keys.header(), text));
                    }
                }
                Part::Matched(_) => {}
            }
        }
        let mut request = Request::new(());
        *request.method_mut() = self.method.clone();
        // A route's path and plain names always make a valid target; the
        // fallback keeps a generator total.
        *request.uri_mut() = target
            .parse()
            .unwrap_or_else(|_| http::Uri::from_static("/"));
        let headers = request.headers_mut();
        if let Some(host) = &self.host {
            headers.insert(HOST, host.clone());
        }
        for (name, v) in &self.headers {
            headers.append(name.clone(), v.clone());
        }
        for (name, text) in set_headers {
            if let Ok(v) = HeaderValue::from_str(&text) {
                headers.insert(name, v);
            }
        }
        if !cookies.is_empty()
            && let Ok(v) = HeaderValue::from_str(&cookies.join("; "))
        {
            headers.append(COOKIE, v);
        }
        let body = (!fields.is_empty()).then(|| {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            Bytes::from(serde_json::Value::Object(fields).to_string())
        });
        Record {
            line,
            time,
            parts: request.into_parts().0,
            peer: client_address(ip_client, self.ipv4_prefix),
            body,
            // Generated traffic reports no usage: a token limit keeps each
            // reservation.
            tokens: None,
        }
    }

    /// What varied, in words and for the JSON.
    pub(crate) fn variation(&self) -> Variation {
        let name = |k: &Kind| {
            let mut name = k.part.name(&self.api_keys);
            if k.part == Part::ApiKey {
                name.push_str(&format!(" ({})", self.api_key_text(k.varies)));
            } else if let Part::Matched(_) = k.part {
                name.push_str(" (the route matches on it)");
            }
            name
        };
        let varied: Vec<&Kind> = self.kinds.iter().filter(|k| k.varies).collect();
        let fixed: Vec<&Kind> = self.kinds.iter().filter(|k| !k.varies).collect();
        let join = |kinds: &[&Kind]| kinds.iter().map(|k| name(k)).collect::<Vec<_>>().join(", ");
        let keys = self.keys;
        let plural = if keys == 1 { "key" } else { "keys" };
        let mut text = if self.kinds.is_empty() {
            format!("{keys} {plural} (the route's limits read no key of a client)")
        } else if varied.is_empty() {
            format!("{keys} {plural} varying nothing")
        } else if keys == 1 {
            format!("1 key: {}", join(&varied))
        } else {
            format!("{keys} keys varying {}", join(&varied))
        };
        if !fixed.is_empty() {
            text.push_str(&format!("; fixed: {}", join(&fixed)));
        }
        let api_key = self
            .kinds
            .iter()
            .find(|k| k.part == Part::ApiKey)
            .map(|k| self.api_key_use(k.varies));
        let names = |kinds: &[&Kind]| {
            kinds
                .iter()
                .map(|k| k.part.name(&self.api_keys))
                .collect::<Vec<_>>()
        };
        Variation {
            varied: names(&varied),
            fixed: names(&fixed),
            api_key,
            text,
        }
    }

    /// How many consumers' and unknown keys the clients send.
    fn api_key_use(&self, varies: bool) -> ApiKeyUse {
        let clients = if varies { self.keys } else { 1 };
        let c = self.api_keys.consumers.len() as u64;
        let admitted = self.api_keys.unknown_admitted;
        ApiKeyUse {
            kind: Part::ApiKey.name(&self.api_keys),
            consumers: clients.min(c),
            unknown_keys: if admitted {
                clients.saturating_sub(c)
            } else {
                0
            },
            unknown_refused: !admitted,
        }
    }

    fn api_key_text(&self, varies: bool) -> String {
        let used = self.api_key_use(varies);
        let consumers = |n: u64| {
            if n == 1 {
                "1 consumer".to_owned()
            } else {
                format!("{n} consumers")
            }
        };
        match (used.consumers, used.unknown_keys, used.unknown_refused) {
            (0, 0, true) => "not sent: no consumers, and unknown keys get 401".to_owned(),
            (0, 1, false) => "one unknown key".to_owned(),
            (0, _, false) => "unknown keys, no consumers".to_owned(),
            (1, 0, _) if !varies => "one consumer".to_owned(),
            (n, 0, true) if self.keys > n && varies => {
                format!("{}, cycled: unknown keys get 401", consumers(n))
            }
            (n, 0, _) => consumers(n),
            (n, _, _) => format!("{}, then unknown keys", consumers(n)),
        }
    }
}

/// The index in `kinds` of the kind `item` of a `vary=` list names.
fn chosen_kind(
    item: &str,
    kinds: &[Kind],
    api_keys: &ApiKeys,
    route: &str,
) -> Result<usize, Error> {
    let usage = |m: String| Error::Usage(format!("--generate: vary: {m}"));
    let read = || {
        if kinds.is_empty() {
            "none".to_owned()
        } else {
            kinds
                .iter()
                .map(|k| k.part.name(api_keys))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let (kind, name) = item.split_once(':').unwrap_or((item, ""));
    let wanted = match (kind, name) {
        ("ip", "") => "ip".to_owned(),
        ("consumer" | "tenant", "") => Part::ApiKey.name(api_keys),
        ("header", name) if !name.is_empty() => match HeaderName::from_bytes(name.as_bytes()) {
            Ok(name) => format!("header:{name}"),
            Err(_) => return Err(usage(format!("`{name}` is not a header name"))),
        },
        ("query" | "cookie" | "body", name) if !name.is_empty() => item.to_owned(),
        ("route", "") => {
            return Err(usage(
                "`route` is the same for every request of the route: nothing to vary".into(),
            ));
        }
        _ => {
            return Err(usage(format!(
                "unknown key kind `{item}`, expected {KINDS}"
            )));
        }
    };
    match kinds.iter().position(|k| k.part.name(api_keys) == wanted) {
        Some(i) if matches!(kinds[i].part, Part::Matched(_)) => Err(usage(format!(
            "route `{route}` matches on `{wanted}`: its value cannot vary"
        ))),
        Some(i) => Ok(i),
        None => Err(usage(format!(
            "the limits of route `{route}` do not read `{item}`; they read {}",
            read()
        ))),
    }
}

/// Client `n`'s address in `10.0.0.0/8`, `n` in the bits above the IPv4
/// prefix the gateway masks clients to, so different clients are different
/// networks (wrapping when the prefix leaves fewer than `n` networks).
fn client_address(n: u64, ipv4_prefix: u8) -> IpAddr {
    let prefix = u32::from(ipv4_prefix.min(32));
    let host_bits = 32 - prefix;
    let address = if prefix > 8 {
        let networks = 1u64 << (prefix - 8);
        0x0a00_0000 | (((n % networks) as u32) << host_bits)
    } else {
        // All of 10.0.0.0/8 would be one network: spread over the space.
        let networks = 1u64 << prefix;
        ((n % networks) as u32).checked_shl(host_bits).unwrap_or(0)
    };
    IpAddr::V4(Ipv4Addr::from(address))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::path::Path;

    use crate::identity::client_ip::client_net;
    use crate::identity::consumer::admit;

    fn config(text: &str) -> Config {
        Config::from_bytes(Path::new("gateway.toml"), text.as_bytes()).unwrap()
    }

    const KEYED: &str = r#"
[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 20
refill = "10/s"

[limits.per_tenant]
key = "tenant"
algorithm = "fixed_window"
limit = 1000
window = "1d"

[limits.per_ip]
key = ["ip", "cookie:sid"]
algorithm = "sliding_window"
limit = 100
window = "1m"

[consumers."k-b"]
consumer = "b"
tenant = "tb"

[consumers."k-a"]
consumer = "a"
tenant = "ta"

[[routes]]
name = "api"
match = { path_prefix = "/api" }
respond = { status = 200 }
limits = ["per_key", "per_tenant", "per_ip"]
"#;

    fn clients(config: &Config, keys: u64, vary: Option<&[&str]>) -> Result<Clients, Error> {
        let vary: Option<Vec<String>> = vary.map(|v| v.iter().map(|s| s.to_string()).collect());
        Clients::new(config, Some(0), keys, vary.as_deref())
    }

    fn distinct(clients: &Clients, keys: u64, f: impl Fn(&Record) -> String) -> usize {
        (0..keys)
            .map(|n| f(&clients.record(1, 0, n)))
            .collect::<HashSet<_>>()
            .len()
    }

    fn api_key(r: &Record) -> String {
        r.parts
            .headers
            .get("x-api-key")
            .map(|v| v.to_str().unwrap().to_owned())
            .unwrap_or_default()
    }

    #[test]
    fn consumers_first_then_unknown_keys_the_gateway_admits() {
        let config = config(KEYED);
        let clients = clients(&config, 50, None).unwrap();
        let keys: Vec<String> = (0..4).map(|n| api_key(&clients.record(1, 0, n))).collect();
        assert_eq!(keys, ["k-a", "k-b", "client-2", "client-3"]);
        assert_eq!(distinct(&clients, 50, api_key), 50);
        assert_eq!(distinct(&clients, 50, |r| r.peer.to_string()), 50);
        assert_eq!(
            distinct(&clients, 50, |r| format!(
                "{:?}",
                r.parts.headers.get("cookie")
            )),
            50
        );
        // As the gateway's identification sees them: the consumers' keys
        // known, the rest anonymous (not refused).
        for n in [0, 1, 2, 49] {
            let record = clients.record(1, 0, n);
            let caller = admit(&record.parts.headers, &config, false).unwrap();
            assert_eq!(caller.is_some(), n < 2, "client {n}");
        }
        let variation = clients.variation();
        assert_eq!(variation.varied, ["header:x-api-key", "ip", "cookie:sid"]);
        assert!(variation.fixed.is_empty());
        assert_eq!(
            variation.text,
            "50 keys varying header:x-api-key (2 consumers, then unknown keys), ip, cookie:sid"
        );
        assert_eq!(
            variation.api_key,
            Some(ApiKeyUse {
                kind: "header:x-api-key".into(),
                consumers: 2,
                unknown_keys: 48,
                unknown_refused: false,
            })
        );
    }

    #[test]
    fn where_unknown_keys_get_401_the_consumers_are_cycled() {
        let config = config(&KEYED.replace(
            "[limits.per_key]",
            "[api_keys]\nunknown_key = \"reject\"\n\n[limits.per_key]",
        ));
        let clients = clients(&config, 5, None).unwrap();
        for n in 0..5 {
            let record = clients.record(1, 0, n);
            assert!(admit(&record.parts.headers, &config, false).is_ok());
        }
        assert_eq!(distinct(&clients, 5, api_key), 2);
        assert!(
            clients
                .variation()
                .text
                .contains("header:x-api-key (2 consumers, cycled: unknown keys get 401)"),
            "{}",
            clients.variation().text
        );
    }

    #[test]
    fn vary_picks_the_kinds_and_the_rest_stay_fixed() {
        let config = config(KEYED);
        let clients = clients(&config, 20, Some(&["ip"])).unwrap();
        assert_eq!(distinct(&clients, 20, |r| r.peer.to_string()), 20);
        assert_eq!(distinct(&clients, 20, api_key), 1);
        let variation = clients.variation();
        assert_eq!(variation.varied, ["ip"]);
        assert_eq!(variation.fixed, ["header:x-api-key", "cookie:sid"]);
        assert_eq!(
            variation.text,
            "20 keys varying ip; fixed: header:x-api-key (one consumer), cookie:sid"
        );
        // `tenant` names the API key it comes from.
        let clients = self::clients(&config, 20, Some(&["tenant", "cookie:sid"])).unwrap();
        assert_eq!(distinct(&clients, 20, api_key), 20);
        assert_eq!(distinct(&clients, 20, |r| r.peer.to_string()), 1);
        for (vary, needle) in [
            (
                "query:page",
                "do not read `query:page`; they read header:x-api-key, ip, cookie:sid",
            ),
            ("route", "nothing to vary"),
            ("colour", "unknown key kind `colour`"),
            ("header:bad header", "not a header name"),
        ] {
            let Err(Error::Usage(message)) = self::clients(&config, 2, Some(&[vary])) else {
                panic!("accepted vary={vary}");
            };
            assert!(message.contains(needle), "{vary}: {message}");
        }
    }

    #[test]
    fn bearer_keys_go_in_authorization() {
        let config = config(&KEYED.replace(
            "[limits.per_key]\nkey = \"header:x-api-key\"",
            "[api_keys]\nheader = \"authorization\"\n\n[limits.per_key]\nkey = \"ip\"",
        ));
        let clients = clients(&config, 3, None).unwrap();
        let record = clients.record(1, 0, 1);
        assert_eq!(record.parts.headers["authorization"], "Bearer k-b");
        assert!(
            admit(&record.parts.headers, &config, false)
                .unwrap()
                .is_some()
        );
        assert_eq!(
            clients.variation().varied,
            ["ip", "header:authorization", "cookie:sid"]
        );
    }

    #[test]
    fn match_headers_keep_the_routes_value() {
        let config = config(
            r#"
[limits.per_team]
key = ["header:x-team", "query:user"]
algorithm = "fixed_window"
limit = 10
window = "1m"

[[routes]]
name = "team"
match = { path = "/t", header = { x-team = "red" } }
respond = { status = 200 }
limits = ["per_team"]
"#,
        );
        let clients = clients(&config, 3, None).unwrap();
        let record = clients.record(1, 0, 2);
        assert_eq!(record.parts.headers["x-team"], "red");
        assert_eq!(record.parts.uri, "/t?user=client-2");
        assert_eq!(
            clients.variation().text,
            "3 keys varying query:user; fixed: header:x-team (the route matches on it)"
        );
        let Err(Error::Usage(message)) = self::clients(&config, 3, Some(&["header:x-team"])) else {
            panic!("varied a match header");
        };
        assert!(message.contains("matches on"), "{message}");
    }

    #[test]
    fn addresses_differ_under_the_ipv4_prefix() {
        for prefix in [32u8, 24, 16, 8, 4] {
            let policy = crate::identity::client_ip::ClientIpPolicy {
                ipv4_prefix: prefix,
                ..Default::default()
            };
            let networks: HashSet<_> = (0..16)
                .map(|n| client_net(client_address(n, prefix), &policy))
                .collect();
            assert_eq!(networks.len(), 16, "/{prefix}");
        }
        assert_eq!(
            client_address(3, 32),
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3))
        );
        assert_eq!(
            client_address(3, 24),
            IpAddr::V4(Ipv4Addr::new(10, 0, 3, 0))
        );
        // Prefix 0: every client is one network; nothing to spread.
        assert_eq!(client_address(5, 0), IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    }
}
