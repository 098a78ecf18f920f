//! Per-key overrides kept in Redis, for a fleet: one hash per limit
//! (`<prefix>{overrides}:<limit>`, field the key's digest, value the
//! override's JSON) and a version (`<prefix>{overrides}:version`) bumped by
//! every write in the same script, so that a node learns of a write by one
//! `GET` (`app::override_sync` polls it) and reads the hashes only then.
//! The hash tag puts all of them in one Cluster slot. Every call goes
//! through the breaker, like a decision's: while Redis is down a write
//! fails at once and changes nothing.
//!
//! An expired override is removed by whichever node reads it first
//! ([`RedisStore::expire_override`]): only while the field still holds the
//! value that node read, so the other nodes' removals find nothing and do
//! not bump the version again, and a `PUT` that replaced it meanwhile is
//! kept. A limit no longer in the configuration keeps its hash until an
//! operator prunes it ([`RedisStore::prune_overrides`]).

use redis::Value;

use super::{RedisStore, Unavailable};

/// Sets (a value) or removes (none) one field and bumps the version, in
/// one step: a node never sees the write without the version moving.
const WRITE: &str = r"
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return redis.call('INCR', KEYS[2])
";

/// Removes one field if it still holds the value given, bumping the
/// version only then: `0` when it did not (already removed or replaced).
const EXPIRE: &str = r"
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return redis.call('INCR', KEYS[2])
end
return 0
";

/// Removes a limit's whole hash, bumping the version if there was one:
/// `0` when there was none.
const PRUNE: &str = r"
if redis.call('DEL', KEYS[1]) == 1 then
  return redis.call('INCR', KEYS[2])
end
return 0
";

impl RedisStore {
    fn overrides_key(&self, limit: &str) -> String {
        format!("{}{{overrides}}:{limit}", self.config.prefix)
    }

    fn overrides_version_key(&self) -> String {
        format!("{}{{overrides}}:version", self.config.prefix)
    }

    /// Stores `value` as `limit`'s override of `digest` (`None` removes
    /// it); the new version.
    pub(crate) async fn write_override(
        &self,
        limit: &str,
        digest: &str,
        value: Option<&str>,
    ) -> Result<u64, Unavailable> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(WRITE)
            .arg(2)
            .arg(self.overrides_key(limit))
            .arg(self.overrides_version_key())
            .arg(digest)
            .arg(value.unwrap_or(""));
        match self.call(&self.stack, &cmd).await? {
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            _ => Err(Unavailable),
        }
    }

    /// Removes `limit`'s override of `digest` if Redis still holds `value`
    /// for it (an expired override, as this node read it); whether this
    /// call removed it.
    pub(crate) async fn expire_override(
        &self,
        limit: &str,
        digest: &str,
        value: &str,
    ) -> Result<bool, Unavailable> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(EXPIRE)
            .arg(2)
            .arg(self.overrides_key(limit))
            .arg(self.overrides_version_key())
            .arg(digest)
            .arg(value);
        match self.call(&self.stack, &cmd).await? {
            Value::Int(n) => Ok(n != 0),
            _ => Err(Unavailable),
        }
    }

    /// Removes every override stored for `limit` (a limit gone from the
    /// fleet's configuration); whether there were any.
    pub(crate) async fn prune_overrides(&self, limit: &str) -> Result<bool, Unavailable> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(PRUNE)
            .arg(2)
            .arg(self.overrides_key(limit))
            .arg(self.overrides_version_key());
        match self.call(&self.stack, &cmd).await? {
            Value::Int(n) => Ok(n != 0),
            _ => Err(Unavailable),
        }
    }

    /// The overrides' version: 0 before the first write.
    pub(crate) async fn overrides_version(&self) -> Result<u64, Unavailable> {
        let mut cmd = redis::cmd("GET");
        cmd.arg(self.overrides_version_key());
        match self.call(&self.stack, &cmd).await? {
            Value::Nil => Ok(0),
            Value::BulkString(bytes) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or(Unavailable),
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            _ => Err(Unavailable),
        }
    }

    /// `limit`'s stored overrides, as (digest, JSON) pairs.
    pub(crate) async fn overrides_of(
        &self,
        limit: &str,
    ) -> Result<Vec<(String, String)>, Unavailable> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.overrides_key(limit));
        let text = |value: &Value| match value {
            Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
            Value::SimpleString(text) => Some(text.clone()),
            _ => None,
        };
        match self.call(&self.stack, &cmd).await? {
            Value::Array(items) => items
                .chunks(2)
                .map(|pair| match pair {
                    [field, value] => Some((text(field)?, text(value)?)),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()
                .ok_or(Unavailable),
            Value::Map(pairs) => pairs
                .iter()
                .map(|(field, value)| Some((text(field)?, text(value)?)))
                .collect::<Option<Vec<_>>>()
                .ok_or(Unavailable),
            _ => Err(Unavailable),
        }
    }
}
