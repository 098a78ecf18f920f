//! `tollgate import`: other rate limiters' configuration files converted
//! into `gateway.toml`, for users migrating to tollgate. A tool beside the
//! gateway, as `simulate` is: it reads files and writes text, and nothing
//! of the gateway calls it.
//!
//! One importer per source format ([`envoy_ratelimit`]); what they share:
//! a YAML tree that knows its lines (`yaml`), the TOML they write by hand
//! (`toml_text`), and [`Problem`], an error that names file and line.

use std::fmt;

pub mod envoy_ratelimit;
mod toml_text;
mod yaml;

/// Something an importer cannot convert, where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The file as it was named on the command line.
    pub file: String,
    /// 1-based; `None` when the file could not be read at all.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}
