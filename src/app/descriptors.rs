//! The decision service's descriptor rules (`[[decision.descriptors]]`)
//! compiled for one snapshot: which rule decides each descriptor of an
//! Envoy rate-limit call, the stack a call's descriptors make together, and
//! the limiters of `limit` overrides.
//!
//! A call's descriptors are decided as one stack, all or nothing: the
//! limits of every matched rule in descriptor order, less those another
//! matched rule `replaces`. A stack depends only on which rule matched
//! which descriptor, so it is compiled once per combination (its metric
//! series resolved, as a route's are) and kept in a copy-on-write map read
//! without a lock; a configuration that meets more combinations than
//! [`MAX_STACKS`] compiles the rest per call.
//!
//! An override (`RateLimitDescriptor.limit`) gives a limit other numbers
//! for one call. Its state is its own — a limiter per limit and numbers,
//! made on first use (at most [`MAX_OVERRIDES`] per snapshot; beyond that
//! the call is refused rather than the table grown without bound), swept
//! with the others, started afresh on reload.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::{LimitId, LimiterSet, RoutePlan, Snapshot};
use crate::config::{Config, DescriptorRule, LimitConfig};
use crate::limit::{Algorithm, Limiter, Nanos, Rate};
use crate::metrics::{Front, Metrics};

/// Most descriptor-rule combinations compiled and kept per snapshot.
pub(crate) const MAX_STACKS: usize = 1024;

/// Most override limiters per snapshot.
pub(crate) const MAX_OVERRIDES: usize = 1024;

/// Rule index meaning "no rule matched this descriptor".
const NO_RULE: u32 = u32::MAX;

/// The rules of one snapshot and what calls have compiled from them.
#[derive(Debug, Default)]
pub(crate) struct DescriptorTable {
    /// The domains the rules name.
    domains: HashMap<String, Domain>,
    stacks: ArcSwap<HashMap<Box<[u32]>, Arc<DescriptorStack>>>,
    overrides: ArcSwap<HashMap<OverrideId, Arc<OverrideLimit>>>,
    /// Serialises the copy-on-write inserts (reads never take it).
    writing: Mutex<()>,
}

/// One domain's rules.
#[derive(Debug)]
struct Domain {
    /// The metric label, shared by the domain's stacks.
    label: Arc<str>,
    /// Rule indexes, in file order.
    rules: Vec<u32>,
}

/// The stack of one combination of matched rules.
#[derive(Debug)]
pub(crate) struct DescriptorStack {
    /// The limits as a route's plan: named after the domain, counted with
    /// `front = "rls"`.
    pub(crate) plan: RoutePlan,
    /// For each entry of `plan.stack`, the descriptor (its index in the
    /// call) whose entries are its key.
    pub(crate) origin: Vec<usize>,
}

/// A limit's numbers replaced for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct OverrideId {
    pub(crate) limit: LimitId,
    pub(crate) requests_per_unit: u64,
    pub(crate) unit: Nanos,
}

/// An override's configuration (the limit's, with the override's numbers)
/// and its own limiter.
#[derive(Debug)]
pub(crate) struct OverrideLimit {
    pub(crate) config: LimitConfig,
    pub(crate) limiters: LimiterSet,
}

/// The table is full: a call naming a new override is refused.
#[derive(Debug)]
pub(crate) struct TooManyOverrides;

impl DescriptorTable {
    pub(crate) fn new(config: &Config) -> DescriptorTable {
        let mut table = DescriptorTable::default();
        for (index, rule) in config
            .decision
            .iter()
            .flat_map(|d| &d.descriptors)
            .enumerate()
        {
            table
                .domains
                .entry(rule.domain.clone())
                .or_insert_with(|| Domain {
                    label: Arc::from(rule.domain.as_str()),
                    rules: Vec::new(),
                })
                .rules
                .push(index as u32);
        }
        table
    }

    /// The metric label of `domain`, if some rule names it.
    pub(crate) fn domain_label(&self, domain: &str) -> Option<&Arc<str>> {
        self.domains.get(domain).map(|d| &d.label)
    }

    /// Some rule names `domain`.
    pub(crate) fn knows(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The first rule of `domain` that `entries` (key, value pairs in
    /// order) match, if any.
    pub(crate) fn rule_for<'e>(
        &self,
        rules: &[DescriptorRule],
        domain: &str,
        entries: impl Iterator<Item = (&'e str, &'e str)> + Clone,
    ) -> Option<u32> {
        let candidates = &self.domains.get(domain)?.rules;
        candidates.iter().copied().find(|&index| {
            let rule = &rules[index as usize];
            let mut given = entries.clone();
            rule.entries.iter().all(|wanted| {
                given
                    .next()
                    .is_some_and(|(key, value)| key == wanted.key && wanted.value.matches(value))
            }) && given.next().is_none()
        })
    }

    /// The stack of a call whose descriptors matched `matched` (a rule
    /// index or `None` per descriptor, in call order).
    pub(crate) fn stack(
        &self,
        snapshot: &Snapshot,
        metrics: &Metrics,
        domain: &str,
        matched: &[Option<u32>],
    ) -> Arc<DescriptorStack> {
        let key: Box<[u32]> = matched.iter().map(|m| m.unwrap_or(NO_RULE)).collect();
        if let Some(stack) = self.stacks.load().get(&key) {
            return stack.clone();
        }
        let stack = Arc::new(self.compile(snapshot, metrics, domain, matched));
        let _writing = self.writing.lock();
        let current = self.stacks.load();
        if current.len() < MAX_STACKS {
            let mut next = HashMap::clone(&current);
            next.entry(key).or_insert_with(|| stack.clone());
            self.stacks.store(Arc::new(next));
        }
        stack
    }

    fn compile(
        &self,
        snapshot: &Snapshot,
        metrics: &Metrics,
        domain: &str,
        matched: &[Option<u32>],
    ) -> DescriptorStack {
        let rules = snapshot.descriptor_rules();
        let replaced: Vec<usize> = matched
            .iter()
            .flatten()
            .flat_map(|&index| rules[index as usize].replaces.iter().copied())
            .collect();
        let mut stack = Vec::new();
        let mut origin = Vec::new();
        for (descriptor, rule) in matched.iter().enumerate() {
            let Some(rule) = rule else { continue };
            for &limit in &rules[*rule as usize].limits {
                // A rule's own limits are never replaced by itself.
                let replaced_here =
                    replaced.contains(&limit) && !rules[*rule as usize].replaces.contains(&limit);
                if !replaced_here {
                    stack.push(LimitId(limit));
                    origin.push(descriptor);
                }
            }
        }
        let name = self
            .domain_label(domain)
            .cloned()
            .unwrap_or_else(|| Arc::from(domain));
        let limit_labels: Vec<Arc<str>> = stack
            .iter()
            .map(|&id| snapshot.limit_label(id).clone())
            .collect();
        let plan = RoutePlan {
            shared: stack.iter().any(|&id| snapshot.is_shared(id)),
            metrics: metrics.route_handles(&name, &limit_labels, Front::Rls),
            name,
            stack,
            // Rendered per call: an override changes the numbers.
            policy: None,
            plan_policies: Vec::new(),
            needs_body: false,
            retry_budget: None,
        };
        DescriptorStack { plan, origin }
    }

    /// The limit and limiter of an override, made on first use.
    pub(crate) fn override_limit(
        &self,
        snapshot: &Snapshot,
        id: OverrideId,
    ) -> Result<Arc<OverrideLimit>, TooManyOverrides> {
        if let Some(found) = self.overrides.load().get(&id) {
            return Ok(found.clone());
        }
        let _writing = self.writing.lock();
        let current = self.overrides.load();
        if let Some(found) = current.get(&id) {
            return Ok(found.clone());
        }
        if current.len() >= MAX_OVERRIDES {
            return Err(TooManyOverrides);
        }
        let base = snapshot.limit_config(id.limit);
        let algorithm = overridden(base.algorithm, id.requests_per_unit, id.unit);
        let mut config = base.clone();
        config.algorithm = algorithm;
        // The override's numbers are the call's, whatever the caller's plan.
        config.plans.clear();
        // A lease sized for the limit's own capacity may not fit the override's.
        config.lease = None;
        let limiter =
            Limiter::new(&config.name, algorithm, config.max_keys).with_align(config.align);
        let made = Arc::new(OverrideLimit {
            config,
            limiters: LimiterSet {
                base: Arc::new(limiter),
                plans: Vec::new(),
            },
        });
        let mut next = HashMap::clone(&current);
        next.insert(id, made.clone());
        self.overrides.store(Arc::new(next));
        Ok(made)
    }

    /// Evicts idle keys of the override limiters; the number removed.
    pub(crate) fn sweep(&self, now: Nanos) -> usize {
        self.overrides
            .load()
            .values()
            .map(|o| o.limiters.base.sweep(now))
            .sum()
    }
}

/// `algorithm` with `per_unit` cost units per `unit` nanoseconds: the
/// window algorithms' limit and window, a token bucket's capacity and
/// refill, a leaky bucket's `capacity + 1` and rate, a concurrency limit's
/// maximum.
pub(crate) fn overridden(algorithm: Algorithm, per_unit: u64, unit: Nanos) -> Algorithm {
    let rate = Rate {
        tokens: per_unit.max(1),
        per: unit.max(1),
    };
    match algorithm {
        Algorithm::FixedWindow { .. } => Algorithm::FixedWindow {
            limit: per_unit,
            window: unit,
        },
        Algorithm::SlidingWindow { .. } => Algorithm::SlidingWindow {
            limit: per_unit,
            window: unit,
        },
        Algorithm::SlidingLog { .. } => Algorithm::SlidingLog {
            limit: per_unit,
            window: unit,
        },
        Algorithm::TokenBucket { wait, .. } => Algorithm::TokenBucket {
            capacity: per_unit,
            refill: rate,
            wait,
        },
        Algorithm::LeakyBucket { mode, .. } => Algorithm::LeakyBucket {
            capacity: per_unit.saturating_sub(1),
            rate,
            mode,
        },
        Algorithm::Concurrency { .. } => Algorithm::Concurrency { max: per_unit },
        // It follows the upstream: no "N per unit" to override.
        Algorithm::Adaptive { params } => Algorithm::Adaptive { params },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::NANOS_PER_SEC;

    #[test]
    fn an_override_keeps_the_algorithm_and_takes_the_numbers() {
        let minute = 60 * NANOS_PER_SEC;
        let window = Algorithm::SlidingWindow {
            limit: 5,
            window: NANOS_PER_SEC,
        };
        assert_eq!(
            overridden(window, 100, minute),
            Algorithm::SlidingWindow {
                limit: 100,
                window: minute
            }
        );
        let bucket = Algorithm::TokenBucket {
            capacity: 5,
            refill: Rate {
                tokens: 1,
                per: NANOS_PER_SEC,
            },
            wait: 0,
        };
        assert_eq!(
            overridden(bucket, 10, minute),
            Algorithm::TokenBucket {
                capacity: 10,
                refill: Rate {
                    tokens: 10,
                    per: minute
                },
                wait: 0,
            }
        );
    }
}
