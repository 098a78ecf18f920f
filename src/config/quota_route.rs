//! `respond = { quota = ["LIMIT", ...] }`: a route that answers the
//! caller's own state of the named limits (contract §13, "Self-service
//! quota"), checked.
//!
//! The route charges nothing and reads the caller's keys the way a
//! proxied request's limits read them, so what such a route may say is
//! bounded here:
//! - the answer is the gateway's own JSON: no `status`, `body` or
//!   `content_type` beside `quota`;
//! - no `limits` of its own (asking costs nothing);
//! - every named limit exists, once;
//! - no limit keyed on `body:FIELD` (the route reads no body) or on
//!   `route` (its key would be the quota route's, never the caller's
//!   proxied route's).

use super::checker::Checker;
use super::error::KeyPath;
use super::limits::{KeyPart, LimitConfig, references};

/// A route's `respond` with `quota`, as written: the names, which of the
/// other `respond` keys are given, and whether the route has `limits`.
pub(super) struct QuotaRespond<'a> {
    pub(super) quota: &'a [String],
    /// `status`, `body`, `content_type`: each given or not.
    pub(super) others: [(&'static str, bool); 3],
    pub(super) has_limits: bool,
}

/// The limits a quota route at `path` shows (indexes into the limits).
pub(super) fn check_quota_respond(
    c: &mut Checker,
    path: &KeyPath,
    respond: &QuotaRespond<'_>,
    limit_names: &[&str],
) -> Vec<usize> {
    let respond_path = path.key("respond");
    for (key, given) in respond.others {
        if given {
            c.problem(
                respond_path.key(key),
                "a quota route answers its own JSON: remove it, or `quota`",
            );
        }
    }
    if respond.has_limits {
        c.problem(
            path.key("limits"),
            "a quota route charges nothing: it has no limits of its own (name the limits to show in `respond.quota`)",
        );
    }
    if respond.quota.is_empty() {
        c.problem(
            respond_path.key("quota"),
            "name at least one limit whose state the route shows",
        );
    }
    references(c, &respond_path.key("quota"), respond.quota, limit_names)
}

/// The key kinds a quota route cannot read, checked once the limits are:
/// `shown` are the limits of the quota route at `routes[route]`.
pub(super) fn check_quota_keys(
    c: &mut Checker,
    root: &KeyPath,
    limits: &[LimitConfig],
    route: usize,
    shown: &[usize],
) {
    for (j, limit) in shown.iter().filter_map(|&id| limits.get(id)).enumerate() {
        let unreadable = limit.key.iter().find_map(|part| match part {
            KeyPart::BodyField(_) => Some("a body field (the quota route reads no body)"),
            KeyPart::Route => Some("the route (it would be the quota route's own)"),
            _ => None,
        });
        if let Some(why) = unreadable {
            c.problem(
                root.key("routes")
                    .index(route)
                    .key("respond")
                    .key("quota")
                    .index(j),
                format!(
                    "`{}` is keyed by {why}: a quota route cannot show it",
                    limit.name
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::validate::errors;

    const LIMITS: &str = "[limits.per_key]\nkey = \"header:x-api-key\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n\n\
        [limits.by_body]\nkey = \"body:user\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n\n";

    #[test]
    fn a_quota_route_names_existing_limits_and_nothing_else() {
        let ok = format!(
            "{LIMITS}[[routes]]\nname = \"q\"\nmatch = {{ path = \"/quota\" }}\nrespond = {{ quota = [\"per_key\"] }}\n"
        );
        assert_eq!(errors(&ok), "");
        let unknown = errors(&format!(
            "{LIMITS}[[routes]]\nname = \"q\"\nrespond = {{ quota = [\"per_kee\"] }}\n"
        ));
        assert!(
            unknown.contains("`routes[0].respond.quota[0]`"),
            "{unknown}"
        );
        assert!(unknown.contains("per_key"), "{unknown}");
        let extra = errors(&format!(
            "{LIMITS}[[routes]]\nname = \"q\"\nrespond = {{ quota = [\"per_key\"], status = 200 }}\nlimits = [\"per_key\"]\n"
        ));
        assert!(extra.contains("`routes[0].respond.status`"), "{extra}");
        assert!(extra.contains("`routes[0].limits`"), "{extra}");
        let empty = errors(&format!(
            "{LIMITS}[[routes]]\nname = \"q\"\nrespond = {{ quota = [] }}\n"
        ));
        assert!(empty.contains("at least one limit"), "{empty}");
        let body = errors(&format!(
            "{LIMITS}[[routes]]\nname = \"q\"\nrespond = {{ quota = [\"per_key\", \"by_body\"] }}\n"
        ));
        assert!(body.contains("`routes[0].respond.quota[1]`"), "{body}");
        assert!(body.contains("body field"), "{body}");
    }
}
