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
use super::routes::{RawRespond, RawRoute, RouteAction, RouteConfig};

/// The action of a route whose `respond` has `quota`.
pub(super) fn check_quota_respond(
    c: &mut Checker,
    path: &KeyPath,
    raw: &RawRoute,
    respond: &RawRespond,
    limit_names: &[&str],
) -> RouteAction {
    let respond_path = path.key("respond");
    for (key, given) in [
        ("status", respond.status.is_some()),
        ("body", respond.body.is_some()),
        ("content_type", respond.content_type.is_some()),
    ] {
        if given {
            c.problem(
                respond_path.key(key),
                "a quota route answers its own JSON: remove it, or `quota`",
            );
        }
    }
    if !raw.limits.is_empty() {
        c.problem(
            path.key("limits"),
            "a quota route charges nothing: it has no limits of its own (name the limits to show in `respond.quota`)",
        );
    }
    let names = respond.quota.as_deref().unwrap_or_default();
    if names.is_empty() {
        c.problem(
            respond_path.key("quota"),
            "name at least one limit whose state the route shows",
        );
    }
    let limits = references(c, &respond_path.key("quota"), names, limit_names);
    RouteAction::Quota { limits }
}

/// The key kinds a quota route cannot read, checked once the limits are.
pub(super) fn check_quota_keys(
    c: &mut Checker,
    root: &KeyPath,
    limits: &[LimitConfig],
    routes: &[RouteConfig],
) {
    for (i, route) in routes.iter().enumerate() {
        let RouteAction::Quota { limits: shown } = &route.action else {
            continue;
        };
        for (j, limit) in shown.iter().filter_map(|&id| limits.get(id)).enumerate() {
            let unreadable = limit.key.iter().find_map(|part| match part {
                KeyPart::BodyField(_) => Some("a body field (the quota route reads no body)"),
                KeyPart::Route => Some("the route (it would be the quota route's own)"),
                _ => None,
            });
            if let Some(why) = unreadable {
                c.problem(
                    root.key("routes")
                        .index(i)
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
