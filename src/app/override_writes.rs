//! The gateway's per-key override operations, as the admin listener asks
//! for them: put, delete, list, expire, and the set restored at start from
//! `server.state_file`. Each write holds the install lock (so a reload
//! never meets half of one), is persisted first and applied after: a write
//! the file refused changed nothing. With a Redis store a write goes to
//! Redis first; one this node then refuses is taken back from Redis.

use std::sync::Arc;

use super::overrides::{Override, Refused, Target};
use super::{App, Snapshot, state_file};
use crate::config::limits::{RawPlan, check_override};
use crate::limit::{LimitKey, Nanos};

/// Why an override write was refused.
#[derive(Debug)]
pub(crate) enum OverrideError {
    /// No limit of that name in the running configuration.
    UnknownLimit(String),
    /// Values the file would refuse: `(field, message)` each.
    Invalid(Vec<(String, String)>),
    /// The limit uses as many distinct override numbers as a snapshot
    /// holds, until the next reload.
    Full,
    /// The override could not be stored (the state file): nothing changed.
    Storage(String),
    /// A prune of a limit the running configuration has: its overrides
    /// are deleted one by one.
    Configured(String),
}

/// An override to install ([`App::put_override`]).
pub(crate) struct NewOverride {
    pub(crate) params: RawPlan,
    /// On the limiters' clock.
    pub(crate) expires: Option<Nanos>,
    pub(crate) reason: Option<String>,
}

impl App {
    /// Each limit of `snapshot` as an override write or attach sees it.
    fn override_targets<'s>(&self, snapshot: &'s Snapshot) -> Vec<Target<'s>> {
        let fraction = *self.fraction.lock();
        snapshot
            .limit_ids()
            .map(|id| {
                let set = snapshot.limiters(id);
                let config = snapshot.limit_config(id);
                Target {
                    config,
                    overrides: snapshot.overrides(id),
                    limiters: std::iter::once((None, set.base.clone()))
                        .chain(
                            set.plans
                                .iter()
                                .map(|(plan, l)| (Some(plan.clone()), l.clone())),
                        )
                        .collect(),
                    fraction: (self.store.is_some() && !config.local).then_some(fraction),
                }
            })
            .collect()
    }

    /// Puts the stored overrides in force in `snapshot` before it is
    /// swapped in; those it dropped (their limit gone or changed) are
    /// dropped from the state file too.
    pub(super) fn attach_overrides(&self, snapshot: &Snapshot) {
        let targets = self.override_targets(snapshot);
        if self.overrides.attach(&targets)
            && let Err(error) = self.persist(&self.overrides.list())
        {
            tracing::warn!("{error}");
        }
    }

    /// Reads `server.state_file` (absent: no overrides) and puts its
    /// overrides in force; how many are. A file that cannot be read or
    /// parsed is an error naming it: the gateway must not start with a
    /// silently empty set.
    pub fn restore_overrides(&self) -> Result<usize, String> {
        let Some(path) = self.state_file.as_ref().filter(|_| self.store.is_none()) else {
            // With a Redis store they are read from there
            // (`override_sync`).
            return Ok(0);
        };
        let mut records = state_file::read(path)?;
        // An override that expired while the gateway was stopped is not
        // brought back, and leaves the file now.
        let now = self.clock.now();
        let read = records.len();
        records.retain(|o| o.expires.is_none_or(|at| now < at));
        let _installing = self.install_lock.lock();
        self.overrides.restore(records);
        self.attach_overrides(&self.snapshot());
        let set = self.overrides.list();
        if set.len() < read {
            self.persist(&set)?;
        }
        Ok(set.len())
    }

    /// Writes the whole set to the state file, if there is one and no
    /// Redis store (which holds them then).
    fn persist(&self, set: &[Arc<Override>]) -> Result<(), String> {
        match &self.state_file {
            Some(path) if self.store.is_none() => state_file::write(path, set),
            _ => Ok(()),
        }
    }

    /// Puts `records` (all of them, as Redis holds them now) in force in
    /// place of the overrides this node had.
    pub(super) fn replace_overrides(&self, records: Vec<Override>) {
        let _installing = self.install_lock.lock();
        self.overrides.restore(records);
        self.attach_overrides(&self.snapshot());
    }

    /// Installs (or replaces) `limit`'s override for `key`: from the
    /// answer on, the key is decided with its numbers. With a Redis store
    /// the override is stored there first (every node applies it from
    /// there); Redis not answering refuses the write, changing nothing.
    pub(crate) async fn put_override(
        &self,
        limit: &str,
        key: LimitKey,
        new: NewOverride,
    ) -> Result<Arc<Override>, OverrideError> {
        let snapshot = self.snapshot();
        let id = snapshot
            .limit_named(limit)
            .ok_or_else(|| OverrideError::UnknownLimit(limit.to_owned()))?;
        // Checked before anything is stored anywhere: the values, and room
        // for their numbers among the limit's limiters.
        let numbers = check_override(snapshot.limit_config(id), &new.params)
            .map_err(OverrideError::Invalid)?;
        if !self
            .overrides
            .has_room(&self.override_targets(&snapshot)[id.index()], numbers)
        {
            return Err(OverrideError::Full);
        }
        drop(snapshot);
        let record = Override {
            limit: limit.to_owned(),
            key,
            params: new.params,
            expires: new.expires,
            reason: new.reason,
            set_at: self.clock.now(),
            plan: None,
        };
        let previous = self.overrides.get(limit, key);
        if let Some(store) = &self.store {
            let value = state_file::record_json(&record).to_string();
            store
                .write_override(limit, &digest(key), Some(&value))
                .await
                .map_err(|_| unstored())?;
        }
        let put = self.install_override(limit, record);
        if let (Some(store), Err(_)) = (&self.store, &put) {
            // Refused here after Redis took it (a reload meanwhile, the
            // last slot taken by another write): Redis gets back what it
            // held, so that the refusal holds for every node.
            let value = previous.map(|o| state_file::record_json(&o).to_string());
            if store
                .write_override(limit, &digest(key), value.as_deref())
                .await
                .is_err()
            {
                tracing::warn!(limit = %limit, "overrides: a refused override could not be taken back from redis");
            }
        }
        put
    }

    /// Puts `record` in force on this node (and in the state file), its
    /// limit as the running configuration has it.
    fn install_override(
        &self,
        limit: &str,
        record: Override,
    ) -> Result<Arc<Override>, OverrideError> {
        let _installing = self.install_lock.lock();
        let snapshot = self.snapshot();
        let id = snapshot
            .limit_named(limit)
            .ok_or_else(|| OverrideError::UnknownLimit(limit.to_owned()))?;
        let targets = self.override_targets(&snapshot);
        let now = self.clock.now();
        let put = self
            .overrides
            .put(&targets[id.index()], record, now, |set| self.persist(set))
            .map_err(OverrideError::Storage)?;
        if let Some(store) = &self.store {
            // A lease taken with the old numbers goes back.
            store.return_leases();
        }
        put.map_err(|refused| match refused {
            Refused::Invalid(problems) => OverrideError::Invalid(problems),
            Refused::Full => OverrideError::Full,
        })
    }

    /// Removes `limit`'s override for `key`; `Ok(None)` when it had none.
    /// With a Redis store it is removed there first, as
    /// [`App::put_override`] stores it.
    pub(crate) async fn delete_override(
        &self,
        limit: &str,
        key: LimitKey,
    ) -> Result<Option<Arc<Override>>, OverrideError> {
        if self.snapshot().limit_named(limit).is_none() {
            return Err(OverrideError::UnknownLimit(limit.to_owned()));
        }
        if self.override_of(limit, key).is_none() {
            return Ok(None);
        }
        if let Some(store) = &self.store {
            store
                .write_override(limit, &digest(key), None)
                .await
                .map_err(|_| unstored())?;
        }
        self.remove_override(limit, key)
    }

    /// Deletes every override stored for `limit`, a limit the running
    /// configuration no longer has (a reload on one node leaves a Redis
    /// fleet's overrides of it alone: the other nodes may still run a
    /// configuration with it). Whether there were any: a memory store's
    /// were dropped from the state file by the reload already.
    pub(crate) async fn prune_overrides(&self, limit: &str) -> Result<bool, OverrideError> {
        if self.snapshot().limit_named(limit).is_some() {
            return Err(OverrideError::Configured(limit.to_owned()));
        }
        match &self.store {
            Some(store) => store.prune_overrides(limit).await.map_err(|_| unstored()),
            None => Ok(false),
        }
    }

    /// Removes `limit`'s override for `key` on this node (and from the
    /// state file).
    fn remove_override(
        &self,
        limit: &str,
        key: LimitKey,
    ) -> Result<Option<Arc<Override>>, OverrideError> {
        let _installing = self.install_lock.lock();
        let snapshot = self.snapshot();
        let id = snapshot
            .limit_named(limit)
            .ok_or_else(|| OverrideError::UnknownLimit(limit.to_owned()))?;
        let targets = self.override_targets(&snapshot);
        let now = self.clock.now();
        let removed = self
            .overrides
            .remove(&targets[id.index()], key, now, |set| self.persist(set))
            .map_err(OverrideError::Storage)?;
        // An expired override is gone already.
        Ok(removed.filter(|o| o.expires.is_none_or(|at| now < at)))
    }

    /// `limit`'s overrides in force now, in key order; `None` for an
    /// unknown limit.
    pub(crate) fn overrides_of(&self, limit: &str) -> Option<Vec<Arc<Override>>> {
        self.snapshot().limit_named(limit)?;
        let now = self.clock.now();
        Some(
            self.overrides
                .list()
                .into_iter()
                .filter(|o| o.limit == limit && o.expires.is_none_or(|at| now < at))
                .collect(),
        )
    }

    /// `limit`'s override of `key` in force now, if any (explain).
    pub(crate) fn override_of(&self, limit: &str, key: LimitKey) -> Option<Arc<Override>> {
        let now = self.clock.now();
        self.overrides
            .get(limit, key)
            .filter(|o| o.expires.is_none_or(|at| now < at))
    }

    /// Removes the overrides whose time is up (the sweeper): their keys are
    /// decided with the limit's numbers again, which the request path
    /// already does from the expiry on. With a Redis store the poll does it
    /// (`override_sync`), removing them from Redis as well.
    pub(crate) fn expire_overrides(&self) {
        if self.store.is_some() {
            return;
        }
        let now = self.clock.now();
        for (limit, key) in self.overrides.expired(now) {
            if let Err(OverrideError::Storage(error)) = self.remove_override(&limit, key) {
                tracing::warn!("{error}");
            }
        }
    }
}

/// A key's digest as Redis and the state file spell it.
fn digest(key: LimitKey) -> String {
    format!("{:032x}", key.as_u128())
}

fn unstored() -> OverrideError {
    OverrideError::Storage(
        "the redis store did not answer; the override is stored there for every node".to_owned(),
    )
}
