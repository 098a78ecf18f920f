//! Advice on a configuration that is valid but lets some requests through
//! every limit unlimited, for `tollgate check` and `run`'s startup log.
//!
//! A new user who writes "a per-API-key token bucket" gets, with the
//! defaults, a limit that a request without the header simply skips
//! (`on_missing_key = "skip"`), and with `key = "consumer"` one that every
//! unknown API key skips too (`unknown_key = "anonymous"`): the gateway
//! fails open by default, so it must at least say so, naming the route and
//! the fix. A route whose stack holds one limit that applies to every
//! request (keyed by `ip` or `route` only, or with `on_missing_key` `deny`
//! or `shared`) gets no warning, and neither does a route with no limits or
//! only shadow limits (both deliberate).

use std::time::{Duration, SystemTime};

use super::{Config, KeyPart, LimitConfig, OnMissingKey, RedisServers, RouteConfig};
use crate::limit::Algorithm;

/// A certificate expiring sooner than this gets a warning.
pub(crate) const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 24 * 3600);

/// One warning per `[server.tls]` certificate that has expired or expires
/// within [`EXPIRY_WARNING`] of `now` (the caller's clock: `check`, start
/// and every reload).
pub fn expiry_warnings(config: &Config, now: SystemTime) -> Vec<String> {
    let Some(tls) = &config.server.tls else {
        return Vec::new();
    };
    tls.certificates
        .iter()
        .filter_map(|certificate| {
            let not_after = certificate.not_after?;
            let file = certificate.file.display();
            let key = &certificate.key;
            match not_after.duration_since(now) {
                Err(_) => Some(format!(
                    "`{key}`: the certificate in {file} has expired: clients refuse it; install a renewed one and reload"
                )),
                Ok(left) if left < EXPIRY_WARNING => Some(format!(
                    "`{key}`: the certificate in {file} expires in {} days: renew it and reload",
                    left.as_secs() / 86_400
                )),
                Ok(_) => None,
            }
        })
        .collect()
}

/// A warning per store URL that holds a password: the secret sits in the
/// configuration file (and wherever the file is copied, reviewed or
/// backed up), where `password_file` or `password_env` would keep it out.
pub fn store_warnings(config: &Config) -> Vec<String> {
    let Some(redis) = config.store.redis() else {
        return Vec::new();
    };
    let (key, urls) = match &redis.servers {
        RedisServers::One(url) => ("url", std::slice::from_ref(url)),
        RedisServers::Cluster(urls) => ("url", urls.as_slice()),
        RedisServers::Sentinel { sentinels, .. } => ("sentinels", sentinels.as_slice()),
    };
    let fix = if key == "url" {
        "move it to a file named by `password_file` (or an environment variable named by `password_env`)"
    } else {
        "move it to a file named by `sentinel_password_file` (or an environment variable named by `sentinel_password_env`)"
    };
    urls.iter()
        .filter(|url| url.password.is_some())
        .map(|url| {
            format!("`store.{key}`: {url} holds a password in the configuration file; {fix}")
        })
        .collect()
}

/// One warning per route where some request can pass every limit of its
/// stack unlimited, in file order.
pub fn bypass_warnings(config: &Config) -> Vec<String> {
    let mut warnings: Vec<String> = config
        .routes
        .iter()
        .filter_map(|route| route_warning(config, route))
        .collect();
    warnings.extend(decision_warnings(config));
    warnings
}

/// What the decision service cannot do with a route or rule: `/auth`
/// sees no body, so a `body:` key is always missing there; and neither
/// `/auth` nor Envoy says when the request ends, so a concurrency slot is
/// given back as soon as the decision is answered.
fn decision_warnings(config: &Config) -> Vec<String> {
    let Some(decision) = &config.decision else {
        return Vec::new();
    };
    let mut warnings = Vec::new();
    for route in &config.routes {
        for limit in route.limits.iter().map(|&i| &config.limits[i]) {
            if let Some(KeyPart::BodyField(field)) = limit
                .key
                .iter()
                .find(|p| matches!(p, KeyPart::BodyField(_)))
            {
                warnings.push(format!(
                    "route `{}`: limit `{}` keys on the body field `{field}`, which /auth never sees \
                     (forward-auth sends no body): decided by /auth, every request lacks the key \
                     (on_missing_key applies); key it on a header, query parameter or cookie",
                    route.name, limit.name
                ));
            }
            if matches!(limit.algorithm, Algorithm::Concurrency { .. }) {
                warnings.push(format!(
                    "route `{}`: concurrency limit `{}` holds a slot only while /auth answers \
                     (forward-auth does not say when the request ends): it limits nothing there",
                    route.name, limit.name
                ));
            }
            if matches!(limit.algorithm, Algorithm::Adaptive { .. }) {
                warnings.push(format!(
                    "route `{}`: adaptive limit `{}` holds a slot only while /auth answers and \
                     never sees the upstream's answer: it limits and learns nothing there",
                    route.name, limit.name
                ));
            }
        }
    }
    for rule in &decision.descriptors {
        for limit in rule.limits.iter().map(|&i| &config.limits[i]) {
            if matches!(limit.algorithm, Algorithm::Concurrency { .. }) {
                warnings.push(format!(
                    "decision.descriptors (domain `{}`): concurrency limit `{}` holds a slot only \
                     while the call is answered (Envoy does not say when the request ends): it \
                     limits nothing there",
                    rule.domain, limit.name
                ));
            }
            if matches!(limit.algorithm, Algorithm::Adaptive { .. }) {
                warnings.push(format!(
                    "decision.descriptors (domain `{}`): adaptive limit `{}` holds a slot only \
                     while the call is answered and never sees the upstream's answer: it limits \
                     and learns nothing there",
                    rule.domain, limit.name
                ));
            }
        }
    }
    warnings
}

fn route_warning(config: &Config, route: &RouteConfig) -> Option<String> {
    let enforced: Vec<&LimitConfig> = route
        .limits
        .iter()
        .map(|&i| &config.limits[i])
        .filter(|limit| !limit.shadow)
        .collect();
    if enforced.is_empty() {
        return None;
    }
    // Every enforced limit can miss its key: then a request that lacks all
    // of them passes unlimited. The first one names what such a request lacks.
    let mut gaps = Vec::with_capacity(enforced.len());
    for limit in &enforced {
        gaps.push(missing_part(config, route, limit)?);
    }
    let names: Vec<String> = enforced.iter().map(|l| format!("`{}`", l.name)).collect();
    let first = &enforced[0].name;
    let stack: Vec<String> = route
        .limits
        .iter()
        .map(|&i| format!("\"{}\"", config.limits[i].name))
        .chain(std::iter::once("\"per_ip\"".to_owned()))
        .collect();
    Some(format!(
        "route `{route}`: a request without {gap} passes every limit of its stack unlimited \
         ({names} {verb} a request without {its} key: on_missing_key = \"skip\"). \
         Fix: add a limit keyed by \"ip\" behind {them} (e.g. `[limits.per_ip]` with key = \"ip\", \
         then limits = [{stack}]), or set on_missing_key = \"deny\" (400) or \"shared\" \
         (one bucket for all such requests) on `{first}`",
        route = route.name,
        gap = gaps[0],
        names = names.join(", "),
        verb = if names.len() == 1 { "skips" } else { "skip" },
        its = if names.len() == 1 { "its" } else { "their" },
        them = if names.len() == 1 { "it" } else { "them" },
        stack = stack.join(", "),
    ))
}

/// What a request can lack so that `limit` does not apply to it on `route`,
/// in words; `None` when the limit applies to every request.
fn missing_part(config: &Config, route: &RouteConfig, limit: &LimitConfig) -> Option<String> {
    if limit.on_missing_key != OnMissingKey::Skip {
        return None;
    }
    let anonymous = if config.api_keys.reject_unknown {
        "a known API key (requests with no API key are anonymous)".to_owned()
    } else {
        "a known API key (unknown keys are anonymous: `[api_keys] unknown_key = \"anonymous\"`)"
            .to_owned()
    };
    limit.key.iter().find_map(|part| match part {
        KeyPart::Ip | KeyPart::Route => None,
        KeyPart::Header(name) => Some(format!("a `{name}` header")),
        KeyPart::Query(name) => Some(format!("a `{name}` query parameter")),
        KeyPart::Cookie(name) => Some(format!("a `{name}` cookie")),
        KeyPart::BodyField(name) => Some(format!("a `{name}` body field")),
        KeyPart::Consumer if !route.require_consumer => Some(anonymous.clone()),
        KeyPart::Consumer => None,
        // A consumer may have no tenant even where one is required.
        KeyPart::Tenant => Some(if route.require_consumer {
            "a tenant (a consumer without `tenant`)".to_owned()
        } else {
            anonymous.clone()
        }),
        KeyPart::Claim { path, .. } if route.require_jwt => {
            Some(format!("a `{path}` claim in its token"))
        }
        KeyPart::Claim { path, .. } => Some(format!(
            "a valid token with a `{path}` claim (an invalid token counts as none)"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn warnings(text: &str) -> Vec<String> {
        let config = super::super::validate::validate(Path::new("t.toml"), text.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        bypass_warnings(&config)
    }

    const BASE: &str = r#"
[upstreams.api]
url = "http://127.0.0.1:9000"
[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 20
refill = "10/s"
[limits.per_ip]
key = "ip"
algorithm = "fixed_window"
limit = 100
window = "1m"
[limits.per_consumer]
key = "consumer"
algorithm = "fixed_window"
limit = 100
window = "1m"
"#;

    fn route(limits: &str, extra: &str) -> String {
        format!(
            "{BASE}\n[[routes]]\nname = \"api\"\nmatch = {{ path_prefix = \"/\" }}\nupstream = \"api\"\nlimits = {limits}\n{extra}"
        )
    }

    #[test]
    fn auth_cannot_read_a_body_or_see_a_request_end() {
        let text = format!(
            "{BASE}[limits.login]\nkey = \"body:username\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n[limits.slots]\nkey = \"ip\"\nalgorithm = \"concurrency\"\nmax = 4\n[decision]\nlisten = \"127.0.0.1:0\"\n[[routes]]\nname = \"login\"\nmatch = {{ path = \"/login\" }}\nlimits = [\"login\", \"slots\", \"per_ip\"]\n"
        );
        let found = warnings(&text);
        assert!(
            found
                .iter()
                .any(|w| w
                    .contains("`login` keys on the body field `username`, which /auth never sees")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|w| w
                    .contains("concurrency limit `slots` holds a slot only while /auth answers")),
            "{found:?}"
        );
        // Without a decision service, neither applies.
        let proxy_only = text
            .replace("[decision]\nlisten = \"127.0.0.1:0\"\n", "")
            .replace(
                "name = \"login\"\n",
                "name = \"login\"\nupstream = \"api\"\n",
            );
        assert!(!warnings(&proxy_only).iter().any(|w| w.contains("/auth")));
    }

    #[test]
    fn auth_cannot_feed_an_adaptive_limit() {
        let text = format!(
            "{BASE}[limits.backend]\nkey = \"route\"\nalgorithm = \"adaptive\"\n[decision]\nlisten = \"127.0.0.1:0\"\n[[routes]]\nname = \"api\"\nmatch = {{ path = \"/api\" }}\nlimits = [\"backend\"]\n"
        );
        let found = warnings(&text);
        assert!(
            found.iter().any(|w| w.contains(
                "adaptive limit `backend` holds a slot only while /auth answers and never sees the upstream's answer"
            )),
            "{found:?}"
        );
    }

    #[test]
    fn a_per_key_limit_alone_is_walked_around_without_the_key() {
        let found = warnings(&route(r#"["per_key"]"#, ""));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("route `api`"), "{}", found[0]);
        assert!(found[0].contains("a `x-api-key` header"), "{}", found[0]);
        assert!(
            found[0].contains("limits = [\"per_key\", \"per_ip\"]"),
            "{}",
            found[0]
        );
    }

    #[test]
    fn an_ip_limit_behind_it_closes_the_gap() {
        assert!(warnings(&route(r#"["per_key", "per_ip"]"#, "")).is_empty());
        assert!(warnings(&route("[]", "")).is_empty());
    }

    #[test]
    fn deny_or_shared_closes_the_gap() {
        let text = route(r#"["per_key"]"#, "").replace(
            "refill = \"10/s\"",
            "refill = \"10/s\"\non_missing_key = \"deny\"",
        );
        assert!(warnings(&text).is_empty());
    }

    #[test]
    fn consumers_are_skipped_by_anonymous_callers() {
        let found = warnings(&route(r#"["per_consumer"]"#, ""));
        assert_eq!(found.len(), 1);
        assert!(
            found[0].contains("unknown keys are anonymous"),
            "{}",
            found[0]
        );
        // A route that requires a consumer leaves no caller without one.
        assert!(warnings(&route(r#"["per_consumer"]"#, "require_consumer = true")).is_empty());
    }
}
