//! [`Checker`]: the problems found while a configuration is checked, and
//! the small checks every part of it uses (durations, sizes, addresses,
//! header names, one-of values, references by name).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;

use super::error::{KeyPath, Problem, nearest};
use super::raw::RawSize;
use super::units::{parse_duration, parse_size};

/// Collects problems while walking the raw config.
pub(super) struct Checker {
    pub(super) problems: Vec<Problem>,
    /// Keys serde refused for their type (blanked before the retry).
    pub(super) mistyped: Vec<KeyPath>,
    /// The `jwt:CLAIM` paths limits key on, each once, by slot.
    pub(super) claim_paths: Vec<Arc<str>>,
}

impl Checker {
    pub(super) fn problem(&mut self, path: KeyPath, message: impl Into<String>) {
        self.problems.push(Problem::new(path, message));
    }

    pub(super) fn duration(
        &mut self,
        path: KeyPath,
        value: &Option<String>,
        default: Duration,
    ) -> Duration {
        match value {
            None => default,
            Some(text) => match parse_duration(text) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    self.problem(path, "must be greater than zero");
                    default
                }
                Err(message) => {
                    self.problem(path, message);
                    default
                }
            },
        }
    }

    pub(super) fn size(&mut self, path: KeyPath, value: &Option<RawSize>, default: u64) -> u64 {
        match value {
            None => default,
            Some(RawSize::Bytes(n)) if *n >= 0 => *n as u64,
            Some(RawSize::Bytes(n)) => {
                self.problem(path, format!("`{n}` is negative; expected a size in bytes"));
                default
            }
            Some(RawSize::Text(text)) => parse_size(text).unwrap_or_else(|message| {
                self.problem(path, message);
                default
            }),
        }
    }

    pub(super) fn socket_addr(&mut self, path: KeyPath, text: &str) -> Option<SocketAddr> {
        match text.parse() {
            Ok(addr) => Some(addr),
            Err(_) => {
                self.problem(
                    path,
                    format!("`{text}` is not a socket address; expected IP:PORT, like \"127.0.0.1:8080\""),
                );
                None
            }
        }
    }

    pub(super) fn header_name(&mut self, path: KeyPath, text: &str) -> Option<HeaderName> {
        match HeaderName::from_bytes(text.as_bytes()) {
            Ok(name) => Some(name),
            Err(_) => {
                self.problem(path, format!("`{text}` is not a valid header name"));
                None
            }
        }
    }

    pub(super) fn one_of<'a>(
        &mut self,
        path: KeyPath,
        value: &str,
        allowed: &[&'a str],
    ) -> Option<&'a str> {
        if let Some(found) = allowed.iter().find(|a| **a == value) {
            return Some(found);
        }
        let mut message = format!(
            "unknown value `{value}`, expected one of {}",
            allowed.join(", ")
        );
        if let Some(best) = nearest(value, allowed.iter().copied()) {
            message.push_str(&format!(" (did you mean `{best}`?)"));
        }
        self.problem(path, message);
        None
    }

    pub(super) fn reference(
        &mut self,
        path: KeyPath,
        kind: &str,
        name: &str,
        known: &[&str],
    ) -> Option<usize> {
        if let Some(index) = known.iter().position(|k| *k == name) {
            return Some(index);
        }
        let mut message = format!("unknown {kind} `{name}`");
        if known.is_empty() {
            message.push_str(&format!("; no {kind}s are defined"));
        } else {
            message.push_str(&format!(", expected one of {}", known.join(", ")));
        }
        if let Some(best) = nearest(name, known.iter().copied()) {
            message.push_str(&format!(" (did you mean `{best}`?)"));
        }
        self.problem(path, message);
        None
    }
}
