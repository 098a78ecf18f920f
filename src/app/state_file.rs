//! `server.state_file`: the per-key overrides of a memory-store gateway,
//! kept across restarts as one JSON document, rewritten whole on every
//! write and read once at start.
//!
//! ```json
//! {"version": 1, "overrides": [{"limit": "per_key", "digest": "<32 hex>",
//!   "params": {"capacity": 500, "refill": "50/s"}, "expires_ns": null,
//!   "reason": "trial", "set_at_ns": 1764979200000000000, "plan": null}]}
//! ```
//!
//! A write goes to a temporary file beside it, which is synced, renamed
//! over the file and its directory synced: a crash leaves the old set or
//! the new one, never half of one. Times are nanoseconds since the epoch on
//! the limiters' clock; keys are digests, never the raw values.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};

use super::overrides::Override;
use crate::config::limits::RawPlan;
use crate::limit::LimitKey;

/// The format written; a file of another is refused.
const VERSION: u64 = 1;

/// The overrides in the file at `path`: none when it does not exist; an
/// error naming it when it cannot be read or is not a state file.
pub(crate) fn read(path: &Path) -> Result<Vec<Override>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => {
            return Err(format!(
                "cannot read the state file {} (server.state_file): {error}",
                path.display()
            ));
        }
    };
    parse(&bytes).map_err(|message| {
        format!(
            "the state file {} (server.state_file) is not a tollgate state file: {message}; \
             move it away to start without its overrides",
            path.display()
        )
    })
}

/// The overrides of a state file's bytes.
fn parse(bytes: &[u8]) -> Result<Vec<Override>, String> {
    let document: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if document["version"].as_u64() != Some(VERSION) {
        return Err(format!("expected \"version\": {VERSION}"));
    }
    let Some(items) = document["overrides"].as_array() else {
        return Err("expected an \"overrides\" array".to_owned());
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| entry(item).map_err(|message| format!("overrides[{i}]: {message}")))
        .collect()
}

/// An override of its JSON (a state file's item, a Redis hash's value).
pub(crate) fn entry(item: &Value) -> Result<Override, String> {
    let text = |name: &str| -> Result<Option<String>, String> {
        match &item[name] {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            _ => Err(format!("`{name}` is not a string")),
        }
    };
    let number = |name: &str| -> Result<Option<u64>, String> {
        match &item[name] {
            Value::Null => Ok(None),
            value => value
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("`{name}` is not a whole number")),
        }
    };
    let limit = text("limit")?.ok_or("`limit` is missing")?;
    let digest = text("digest")?.ok_or("`digest` is missing")?;
    let key = u128::from_str_radix(&digest, 16)
        .ok()
        .filter(|_| digest.len() == 32)
        .map(LimitKey::from_u128)
        .ok_or("`digest` is not 32 hex digits")?;
    let params: RawPlan =
        serde_json::from_value(item["params"].clone()).map_err(|e| format!("`params`: {e}"))?;
    Ok(Override {
        limit,
        key,
        params,
        expires: number("expires_ns")?,
        reason: text("reason")?,
        set_at: number("set_at_ns")?.unwrap_or(0),
        plan: text("plan")?.map(Arc::from),
    })
}

/// An override's values as JSON, only those it sets (the state file, the
/// admin API's answers).
pub(crate) fn params_json(params: &RawPlan) -> Value {
    let mut values = serde_json::Map::new();
    let mut put = |name: &str, value: Option<Value>| {
        if let Some(value) = value {
            values.insert(name.to_owned(), value);
        }
    };
    put("limit", params.limit.map(|limit| limit.to_json()));
    put("window", params.window.clone().map(Value::from));
    put(
        "capacity",
        params.capacity.map(|capacity| capacity.to_json()),
    );
    put("refill", params.refill.clone().map(Value::from));
    put("rate", params.rate.clone().map(Value::from));
    put("max", params.max.map(Value::from));
    Value::Object(values)
}

/// An override as JSON: what [`entry`] reads back.
pub(crate) fn record_json(o: &Override) -> Value {
    json!({
        "limit": o.limit,
        "digest": format!("{:032x}", o.key.as_u128()),
        "params": params_json(&o.params),
        "expires_ns": o.expires,
        "reason": o.reason,
        "set_at_ns": o.set_at,
        "plan": o.plan.as_deref(),
    })
}

fn document(set: &[Arc<Override>]) -> Value {
    let items: Vec<Value> = set.iter().map(|o| record_json(o)).collect();
    json!({"version": VERSION, "overrides": items})
}

/// Writes `set` as the file at `path`, atomically (see the module doc).
pub(crate) fn write(path: &Path, set: &[Arc<Override>]) -> Result<(), String> {
    let fail = |error: std::io::Error| {
        format!(
            "cannot write the state file {} (server.state_file): {error}",
            path.display()
        )
    };
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = std::path::PathBuf::from(temporary);
    let mut bytes = serde_json::to_vec_pretty(&document(set)).map_err(|e| e.to_string())?;
    bytes.push(b'\n');
    let mut file = File::create(&temporary).map_err(fail)?;
    file.write_all(&bytes).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(fail)?;
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(directory)
        .and_then(|dir| dir.sync_all())
        .map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_set_reads_back_and_garbage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert!(read(&path).unwrap().is_empty());
        let record = Override {
            limit: "per_key".into(),
            key: LimitKey::from_u128(0xabc),
            params: RawPlan {
                capacity: Some(5.into()),
                refill: Some("1/s".into()),
                ..RawPlan::default()
            },
            expires: Some(7),
            reason: Some("trial".into()),
            set_at: 3,
            plan: Some(Arc::from("pro")),
        };
        write(&path, &[Arc::new(record.clone())]).unwrap();
        assert_eq!(read(&path).unwrap(), vec![record]);
        std::fs::write(&path, b"{\"version\": 1, \"overrides\": [{}]").unwrap();
        let error = read(&path).unwrap_err();
        assert!(error.contains(&path.display().to_string()), "{error}");
        std::fs::write(
            &path,
            b"{\"version\": 1, \"overrides\": [{\"limit\": \"a\"}]}",
        )
        .unwrap();
        assert!(read(&path).unwrap_err().contains("`digest` is missing"));
    }
}
