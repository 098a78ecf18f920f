//! `tollgate admin ...`: the admin API from the command line, so that an
//! operator need not hand-write curl. The admin listener's address and
//! token come from the configuration (`-c FILE`, loaded as `tollgate run`
//! loads it); the command becomes one request, and the answer is printed
//! as the API gives it: its body on stdout for a success, on stderr with a
//! non-zero exit for an error.
//!
//! | command | request |
//! | --- | --- |
//! | `admin reset LIMIT KEY` | `POST /limits/LIMIT/reset?key=KEY` |
//! | `admin overrides set LIMIT KEY (--json BODY \| name=value...)` | `PUT /limits/LIMIT/overrides?key=KEY` |
//! | `admin overrides list LIMIT` | `GET /limits/LIMIT/overrides` |
//! | `admin overrides delete LIMIT KEY` | `DELETE /limits/LIMIT/overrides?key=KEY` |
//! | `admin overrides prune LIMIT` | `DELETE /limits/LIMIT/overrides` |
//!
//! `name=value` pairs make a JSON object: a value that is an integer is a
//! number (`capacity=500`), anything else a string (`refill=50/s`,
//! `ttl=1h`, `reason="trial week"`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use http::{Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::config::Config;

/// How long the whole exchange may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// One `tollgate admin` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Reset {
        limit: String,
        key: String,
    },
    OverridesSet {
        limit: String,
        key: String,
        /// `--json BODY`, else built from `params`.
        json: Option<String>,
        /// `name=value` pairs.
        params: Vec<String>,
    },
    OverridesList {
        limit: String,
    },
    OverridesDelete {
        limit: String,
        key: String,
    },
    /// The overrides left in Redis by a limit no longer configured.
    OverridesPrune {
        limit: String,
    },
}

/// The request a command sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminRequest {
    pub method: Method,
    /// Path and query, percent-encoded.
    pub target: String,
    /// A JSON body.
    pub body: Option<String>,
}

/// The admin API's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminAnswer {
    pub status: u16,
    pub body: String,
}

impl AdminAnswer {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

impl Command {
    /// The request this command sends; `Err` for arguments that make none
    /// (`name=value` without `=`, `--json` beside pairs, neither).
    pub fn request(&self) -> Result<AdminRequest, String> {
        let limit_path = |limit: &str| format!("/limits/{}", encode(limit));
        Ok(match self {
            Command::Reset { limit, key } => AdminRequest {
                method: Method::POST,
                target: format!("{}/reset?key={}", limit_path(limit), encode(key)),
                body: None,
            },
            Command::OverridesSet {
                limit,
                key,
                json,
                params,
            } => AdminRequest {
                method: Method::PUT,
                target: format!("{}/overrides?key={}", limit_path(limit), encode(key)),
                body: Some(override_body(json.as_deref(), params)?),
            },
            Command::OverridesList { limit } => AdminRequest {
                method: Method::GET,
                target: format!("{}/overrides", limit_path(limit)),
                body: None,
            },
            Command::OverridesDelete { limit, key } => AdminRequest {
                method: Method::DELETE,
                target: format!("{}/overrides?key={}", limit_path(limit), encode(key)),
                body: None,
            },
            Command::OverridesPrune { limit } => AdminRequest {
                method: Method::DELETE,
                target: format!("{}/overrides", limit_path(limit)),
                body: None,
            },
        })
    }
}

/// An override's JSON body: `--json` as given, or the pairs as an object.
fn override_body(json: Option<&str>, params: &[String]) -> Result<String, String> {
    match (json, params.is_empty()) {
        (Some(_), false) => Err("give either --json BODY or name=value pairs, not both".to_owned()),
        (Some(json), true) => Ok(json.to_owned()),
        (None, true) => Err(
            "give the override's parameters: --json '{\"limit\": 1000}' or name=value pairs (limit=1000 ttl=1h)"
                .to_owned(),
        ),
        (None, false) => {
            let mut object = serde_json::Map::new();
            for pair in params {
                let Some((name, value)) = pair.split_once('=').filter(|(n, _)| !n.is_empty())
                else {
                    return Err(format!("`{pair}` is not name=value"));
                };
                let value = match value.parse::<i64>() {
                    Ok(number) => serde_json::Value::from(number),
                    Err(_) => serde_json::Value::from(value),
                };
                if object.insert(name.to_owned(), value).is_some() {
                    return Err(format!("`{name}` is given twice"));
                }
            }
            Ok(serde_json::Value::Object(object).to_string())
        }
    }
}

/// `text` percent-encoded for a path segment or a query value: everything
/// but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Where to reach the admin listener of `config`: its address, with an
/// unspecified one (`0.0.0.0`, `[::]`) reached on loopback.
fn admin_address(config: &Config) -> Result<SocketAddr, String> {
    let Some(mut address) = config.server.admin else {
        return Err(format!(
            "{} has no admin listener: set `admin = \"127.0.0.1:9091\"` in [server]",
            config.path.display()
        ));
    };
    if address.ip().is_unspecified() {
        address.set_ip(match address.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    Ok(address)
}

/// Sends `request` to `config`'s admin listener with its token; the
/// answer, or why there is none (the listener unreachable, no answer in
/// time).
pub async fn send(config: &Config, request: &AdminRequest) -> Result<AdminAnswer, String> {
    let address = admin_address(config)?;
    let exchange = async {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|e| format!("cannot reach the admin listener at {address}: {e}"))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("admin listener at {address}: {e}"))?;
        tokio::spawn(connection);
        let mut builder = Request::builder()
            .method(request.method.clone())
            .uri(request.target.as_str())
            .header(HOST, address.to_string());
        if let Some(token) = &config.server.admin_token {
            builder = builder.header(AUTHORIZATION, format!("Bearer {}", token.expose()));
        }
        if request.body.is_some() {
            builder = builder.header(CONTENT_TYPE, "application/json");
        }
        let body = Full::new(Bytes::from(request.body.clone().unwrap_or_default()));
        let http_request = builder
            .body(body)
            .map_err(|e| format!("cannot make the request: {e}"))?;
        let response = sender
            .send_request(http_request)
            .await
            .map_err(|e| format!("admin listener at {address}: {e}"))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("admin listener at {address}: {e}"))?
            .to_bytes();
        Ok(AdminAnswer {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "the admin listener at {address} did not answer within {TIMEOUT:?}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(command: Command) -> AdminRequest {
        command.request().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn commands_become_requests_with_encoded_names_and_keys() {
        let reset = request(Command::Reset {
            limit: "per_key".into(),
            key: "sk live/1&x=2".into(),
        });
        assert_eq!(reset.method, Method::POST);
        assert_eq!(
            reset.target,
            "/limits/per_key/reset?key=sk%20live%2F1%26x%3D2"
        );
        assert_eq!(reset.body, None);
        let list = request(Command::OverridesList {
            limit: "tpm".into(),
        });
        assert_eq!(
            (list.method, list.target.as_str()),
            (Method::GET, "/limits/tpm/overrides")
        );
        let delete = request(Command::OverridesDelete {
            limit: "tpm".into(),
            key: "k".into(),
        });
        assert_eq!(delete.method, Method::DELETE);
        assert_eq!(delete.target, "/limits/tpm/overrides?key=k");
        let prune = request(Command::OverridesPrune {
            limit: "old tpm".into(),
        });
        assert_eq!(
            (prune.method, prune.target.as_str()),
            (Method::DELETE, "/limits/old%20tpm/overrides")
        );
    }

    #[test]
    fn an_override_body_comes_from_json_or_pairs() {
        let set = |json: Option<&str>, params: &[&str]| {
            Command::OverridesSet {
                limit: "l".into(),
                key: "k".into(),
                json: json.map(str::to_owned),
                params: params.iter().map(|p| (*p).to_owned()).collect(),
            }
            .request()
        };
        let pairs = set(None, &["capacity=500", "refill=50/s", "reason=trial week"])
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(pairs.method, Method::PUT);
        let body: serde_json::Value =
            serde_json::from_str(pairs.body.as_deref().unwrap_or("")).unwrap_or_default();
        assert_eq!(
            body,
            serde_json::json!({"capacity": 500, "refill": "50/s", "reason": "trial week"})
        );
        let json = set(Some("{\"limit\": 1000}"), &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(json.body.as_deref(), Some("{\"limit\": 1000}"));
        assert!(set(Some("{}"), &["a=1"]).is_err());
        assert!(set(None, &[]).is_err());
        assert!(set(None, &["novalue"]).unwrap_err().contains("novalue"));
        assert!(set(None, &["a=1", "a=2"]).unwrap_err().contains("twice"));
    }
}
