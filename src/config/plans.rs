//! `[plans.NAME]`: what a plan says about its callers beside the numbers
//! its limits give it (`[limits.NAME.plans.PLAN]`): today its requests'
//! `priority`. A caller's plan is its consumer's `plan` or its token's
//! `plan_claim`; the serde mirror, the checked [`PlanConfig`] and the check.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use super::checker::Checker;
use super::error::KeyPath;
use super::slots::check_priority;
use crate::limit::Priority;

/// A `[plans.NAME]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPlanSettings {
    pub(crate) priority: Option<String>,
}

/// A `[plans.NAME]`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlanConfig {
    pub(crate) name: Arc<str>,
    /// The priority of its callers' requests, where neither their consumer
    /// nor their token names one.
    pub(crate) priority: Option<Priority>,
}

/// Every `[plans.NAME]`, in name order.
pub(super) fn check_plans(
    c: &mut Checker,
    path: &KeyPath,
    raw: &BTreeMap<String, RawPlanSettings>,
) -> Vec<PlanConfig> {
    raw.iter()
        .map(|(name, plan)| {
            let at = path.key(name);
            if name.is_empty() {
                c.problem(at.clone(), "a plan's name must not be empty");
            }
            PlanConfig {
                name: Arc::from(name.as_str()),
                priority: check_priority(c, at.key("priority"), plan.priority.as_deref()),
            }
        })
        .collect()
}

/// The priority `plans` give the plan named `plan`, if any.
#[inline]
pub(crate) fn plan_priority(plans: &[PlanConfig], plan: Option<&str>) -> Option<Priority> {
    let plan = plan?;
    plans
        .iter()
        .find(|p| &*p.name == plan)
        .and_then(|p| p.priority)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;
    use crate::config::validate::errors;

    const BASE: &str = "[upstreams.up]\nurl = \"http://127.0.0.1:9\"\n[[routes]]\nname = \"r\"\nmatch = { path_prefix = \"/\" }\nupstream = \"up\"\n";

    #[test]
    fn a_plan_carries_a_priority() {
        let text = format!(
            "{BASE}[plans.gold]\npriority = \"critical\"\n[plans.batch]\npriority = \"sheddable\"\n[plans.plain]\n"
        );
        let config = Config::from_bytes(Path::new("gateway.toml"), text.as_bytes())
            .expect("a valid configuration");
        let plans = &config.plans;
        assert_eq!(plan_priority(plans, Some("gold")), Some(Priority::Critical));
        assert_eq!(
            plan_priority(plans, Some("batch")),
            Some(Priority::Sheddable)
        );
        assert_eq!(plan_priority(plans, Some("plain")), None);
        assert_eq!(plan_priority(plans, Some("other")), None);
        assert_eq!(plan_priority(plans, None), None);
    }

    #[test]
    fn a_bad_priority_or_key_is_refused_where_it_is() {
        let bad = errors(&format!("{BASE}[plans.gold]\npriority = \"urgent\"\n"));
        assert!(bad.contains("plans.gold.priority"), "{bad}");
        assert!(bad.contains("critical, normal, sheddable"), "{bad}");
        let unknown = errors(&format!("{BASE}[plans.gold]\nmax = 5\n"));
        assert!(unknown.contains("max"), "{unknown}");
        let empty = errors(&format!("{BASE}[plans.\"\"]\npriority = \"normal\"\n"));
        assert!(empty.contains("must not be empty"), "{empty}");
    }
}
