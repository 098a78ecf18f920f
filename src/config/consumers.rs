//! `[api_keys]` and `[consumers."KEY"]`: where a request's API key is read,
//! what an unknown one means, and who each key belongs to (consumer, tenant,
//! plan), from the configuration and from a separate consumers file. The
//! sections' serde mirror, validated types and checks.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use http::HeaderName;
use serde::Deserialize;
use toml::de::DeTable;

use super::checker::Checker;
use super::error::{KeyPath, Problem, explain_serde_message, line_column, path_at, span_of};
use super::slots::check_priority;
use crate::limit::Priority;

/// How API keys are read and what an unknown one means.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawApiKeys {
    pub(crate) header: Option<String>,
    pub(crate) unknown_key: Option<String>,
    pub(crate) file: Option<String>,
}

/// A separate consumers file: only `[consumers."KEY"]` tables.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConsumersFile {
    #[serde(default)]
    pub(crate) consumers: BTreeMap<String, RawConsumer>,
}

/// A `[consumers."KEY"]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConsumer {
    pub(crate) consumer: String,
    pub(crate) tenant: Option<String>,
    pub(crate) plan: Option<String>,
    pub(crate) priority: Option<String>,
}

/// Where the API key is read and what an unknown one means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ApiKeyConfig {
    pub(crate) source: ApiKeySource,
    /// A presented key not in `[consumers]`: 401 everywhere (`true`), or
    /// anonymous except on routes with `require_consumer` (`false`, default).
    pub(crate) reject_unknown: bool,
}

/// Where a request's API key is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiKeySource {
    /// The whole value of this header (default `x-api-key`).
    Header(HeaderName),
    /// `Authorization: Bearer <key>`.
    Bearer,
}

/// Who an API key belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    pub(crate) consumer: Arc<str>,
    pub(crate) tenant: Option<Arc<str>>,
    pub(crate) plan: Option<Arc<str>>,
    /// Its requests' priority, over their route's.
    pub(crate) priority: Option<Priority>,
}

/// `[api_keys]`, then every API key of `[consumers]` and of the
/// consumers file (`api_keys.file`, resolved against `directory`).
pub(super) fn check_consumers(
    c: &mut Checker,
    root: &KeyPath,
    api_keys: &RawApiKeys,
    raw: &BTreeMap<String, RawConsumer>,
    directory: &Path,
) -> (ApiKeyConfig, HashMap<String, Consumer>) {
    let config = check_api_keys(c, &root.key("api_keys"), api_keys);
    let mut consumers = HashMap::with_capacity(raw.len());
    for (key, consumer) in raw {
        let entry = check_consumer(c, &root.key("consumers").key(key), consumer);
        consumers.insert(key.clone(), entry);
    }
    if let Some(file) = &api_keys.file {
        load_consumers_file(
            c,
            &root.key("api_keys").key("file"),
            &directory.join(file),
            &mut consumers,
        );
    }
    (config, consumers)
}

fn check_api_keys(c: &mut Checker, path: &KeyPath, raw: &RawApiKeys) -> ApiKeyConfig {
    let source = match raw.header.as_deref() {
        None => ApiKeySource::Header(HeaderName::from_static("x-api-key")),
        Some(name) if name.eq_ignore_ascii_case("authorization") => ApiKeySource::Bearer,
        Some(name) => c
            .header_name(path.key("header"), name)
            .map_or(ApiKeySource::Bearer, ApiKeySource::Header),
    };
    let reject_unknown = match raw.unknown_key.as_deref() {
        None => false,
        Some(text) => {
            c.one_of(path.key("unknown_key"), text, &["anonymous", "reject"]) == Some("reject")
        }
    };
    ApiKeyConfig {
        source,
        reject_unknown,
    }
}

fn check_consumer(c: &mut Checker, path: &KeyPath, raw: &RawConsumer) -> Consumer {
    if raw.consumer.is_empty() {
        c.problem(path.key("consumer"), "must not be empty");
    }
    check_priority(c, path.key("priority"), raw.priority.as_deref());
    consumer_of(raw)
}

/// The typed consumer of a `[consumers."KEY"]` table (inline or from a file).
fn consumer_of(raw: &RawConsumer) -> Consumer {
    Consumer {
        consumer: Arc::from(raw.consumer.as_str()),
        tenant: raw.tenant.as_deref().map(Arc::from),
        plan: raw.plan.as_deref().map(Arc::from),
        priority: raw.priority.as_deref().and_then(Priority::parse),
    }
}

/// Loads a consumers file (only `[consumers."KEY"]` tables) into `consumers`.
/// Its problems are located in that file.
fn load_consumers_file(
    c: &mut Checker,
    key_path: &KeyPath,
    file: &Path,
    consumers: &mut HashMap<String, Consumer>,
) {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            c.problem(
                key_path.clone(),
                format!("cannot read consumers file {}: {e}", file.display()),
            );
            return;
        }
    };
    let mut in_file = |path: KeyPath, message: String, offset: Option<usize>| {
        let mut problem = Problem::new(path, message);
        problem.file = Some(file.to_owned());
        problem.position = offset.map(|o| line_column(&text, o));
        c.problems.push(problem);
    };
    // The syntax tree places problems (line, key path) on either path.
    let document = DeTable::parse(&text).ok();
    let raw: RawConsumersFile = match toml::from_str(&text) {
        Ok(raw) => raw,
        Err(e) => {
            let offset = e.span().map(|s| s.start);
            let path = match (&document, offset) {
                (Some(doc), Some(o)) => path_at(doc.get_ref(), o),
                _ => KeyPath::default(),
            };
            in_file(path, explain_serde_message(e.message()), offset);
            return;
        }
    };
    for (key, consumer) in &raw.consumers {
        let path = KeyPath::default().key("consumers").key(key);
        let offset = document
            .as_ref()
            .and_then(|d| span_of(d.get_ref(), &path))
            .map(|s| s.start);
        if consumers.contains_key(key) {
            in_file(
                path,
                "this API key is also defined in the main configuration".to_owned(),
                offset,
            );
            continue;
        }
        if consumer.consumer.is_empty() {
            in_file(path.key("consumer"), "must not be empty".to_owned(), offset);
            continue;
        }
        if let Some(text) = consumer.priority.as_deref()
            && Priority::parse(text).is_none()
        {
            let message =
                format!("unknown value `{text}`, expected one of critical, normal, sheddable");
            in_file(path.key("priority"), message, offset);
            continue;
        }
        consumers.insert(key.clone(), consumer_of(consumer));
    }
}
