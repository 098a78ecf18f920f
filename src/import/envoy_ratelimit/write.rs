//! The converted domains as TOML text: one rule per node that has one, in
//! envoyproxy/ratelimit's order of preference, each limit named (its
//! `name`, or one made of domain, keys and values), `replaces` resolved to
//! those names, and the comments that say what changed or was dropped.

use std::collections::HashMap;
use std::fmt::Write;

use super::super::toml_text;
use super::matching::{matching_notes, preference_order};
use super::{Amount, Descriptor, Domain, Matcher, RateLimit, Unit, match_entry};

/// One `[[decision.descriptors]]` rule to write, for one node.
struct Rule<'d> {
    domain: &'d Domain,
    /// From the top: each level's nodes, and the index of the one taken.
    steps: Vec<(&'d [Descriptor], usize)>,
    /// The tollgate limit written for it (a node with a limited rate).
    limit: Option<String>,
    /// Why `limit` is not the name envoyproxy/ratelimit had.
    renamed: Option<String>,
    replaces: Vec<String>,
    notes: Vec<String>,
}

impl<'d> Rule<'d> {
    fn node(&self) -> &'d Descriptor {
        let (list, at) = *self.steps.last().expect("a rule has a node");
        &list[at]
    }

    fn path(&self) -> impl Iterator<Item = &'d Descriptor> + '_ {
        self.steps.iter().map(|(list, at)| &list[*at])
    }

    fn rate(&self) -> Option<(&'d RateLimit, u32, Unit)> {
        let rate_limit = self.node().rate_limit.as_ref()?;
        match rate_limit.amount {
            Amount::Limited { requests, unit } => Some((rate_limit, requests, unit)),
            Amount::Unlimited => None,
        }
    }
}

/// Every rule of a domain, in the order written.
fn rules(domain: &Domain) -> Vec<Rule<'_>> {
    let mut out = Vec::new();
    flatten(domain, &domain.descriptors, &mut Vec::new(), &mut out);
    out
}

/// A node's rule (if it has one) and then those below it, for each node of
/// `list` in the order envoyproxy/ratelimit prefers them.
fn flatten<'d>(
    domain: &'d Domain,
    list: &'d [Descriptor],
    steps: &mut Vec<(&'d [Descriptor], usize)>,
    out: &mut Vec<Rule<'d>>,
) {
    for at in preference_order(list) {
        steps.push((list, at));
        let node = &list[at];
        if node.has_rule() {
            out.push(Rule {
                domain,
                steps: steps.clone(),
                limit: None,
                renamed: None,
                replaces: Vec::new(),
                notes: Vec::new(),
            });
        }
        flatten(domain, &node.children, steps, out);
        steps.pop();
    }
}

/// Names every limit, explicit names first (as envoyproxy/ratelimit had
/// them, where tollgate allows), then made of domain, keys and values;
/// unique over all domains.
fn name_limits(names: &[String], rules: &mut [Vec<Rule<'_>>]) {
    let mut taken: HashMap<String, String> = HashMap::new();
    for rule in rules.iter_mut().flatten() {
        let Some((rate_limit, _, _)) = rule.rate() else {
            continue;
        };
        let Some(given) = &rate_limit.name else {
            continue;
        };
        let printable: String = given
            .chars()
            .map(|c| if (' '..='~').contains(&c) { c } else { '_' })
            .collect();
        let place = format!("{}:{}", names[rule.domain.file], rule.node().line);
        let (name, holder) = unique(&printable, &mut taken, place);
        rule.renamed = if let Some(holder) = holder {
            Some(format!(
                "{} in envoyproxy/ratelimit, the name of the limit at {holder} too",
                toml_text::string(given)
            ))
        } else if name != *given {
            Some(format!(
                "{} in envoyproxy/ratelimit: a tollgate limit name is printable ASCII",
                toml_text::string(given)
            ))
        } else {
            None
        };
        rule.limit = Some(name);
    }
    for rule in rules.iter_mut().flatten() {
        if rule.rate().is_none() || rule.limit.is_some() {
            continue;
        }
        let mut parts = vec![rule.domain.name.clone()];
        for node in rule.path() {
            parts.push(node.key.clone());
            match &node.value {
                Matcher::Any => {}
                Matcher::Exact(v) => parts.push(v.clone()),
                Matcher::Prefix(p) if p.is_empty() => parts.push("any".to_owned()),
                Matcher::Prefix(p) => parts.push(format!("{p}_prefix")),
            }
        }
        let place = format!("{}:{}", names[rule.domain.file], rule.node().line);
        let (name, _) = unique(&generated_name(&parts.join("_")), &mut taken, place);
        rule.limit = Some(name);
    }
}

/// `wanted`, or `wanted_2`, `wanted_3` ... when taken; and where the name
/// was taken, if it was.
fn unique(
    wanted: &str,
    taken: &mut HashMap<String, String>,
    place: String,
) -> (String, Option<String>) {
    let holder = taken.get(wanted).cloned();
    let mut name = wanted.to_owned();
    let mut n = 2;
    while taken.contains_key(&name) {
        name = format!("{wanted}_{n}");
        n += 1;
    }
    taken.insert(name.clone(), place);
    (name, holder)
}

/// A made-up limit name: letters, digits, `-` and single `_`s.
fn generated_name(text: &str) -> String {
    let mut name = String::with_capacity(text.len());
    for c in text.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' {
            c
        } else {
            '_'
        };
        if !(c == '_' && (name.is_empty() || name.ends_with('_'))) {
            name.push(c);
        }
    }
    while name.ends_with('_') {
        name.pop();
    }
    if name.is_empty() {
        name.push_str("limit");
    }
    name
}

/// Each rule's `replaces`: the tollgate names of the limits of its domain
/// that envoyproxy/ratelimit knew by the names it replaces (several limits
/// may share one there). An unlimited rate limit is never replaced there.
fn resolve_replaces(rules: &mut [Rule<'_>]) {
    let mut by_name: HashMap<String, Vec<String>> = HashMap::new();
    for rule in rules.iter() {
        if let (Some((rate_limit, _, _)), Some(limit)) = (rule.rate(), &rule.limit)
            && let Some(name) = &rate_limit.name
        {
            by_name.entry(name.clone()).or_default().push(limit.clone());
        }
    }
    for rule in rules.iter_mut() {
        let Some(rate_limit) = &rule.node().rate_limit else {
            continue;
        };
        for wanted in &rate_limit.replaces {
            match by_name.get(wanted) {
                Some(limits) => {
                    for limit in limits {
                        if !rule.replaces.contains(limit) {
                            rule.replaces.push(limit.clone());
                        }
                    }
                }
                None => rule.notes.push(format!(
                    "note: replaces {}, which names no limited rate_limit of domain {}: it \
                     replaces nothing, in envoyproxy/ratelimit as here.",
                    toml_text::string(wanted),
                    toml_text::string(&rule.domain.name)
                )),
            }
        }
    }
}

/// The whole fragment: per domain a header, then per rule its limit (if
/// any) and the rule.
pub(super) fn write(names: &[String], domains: &[Domain]) -> String {
    let mut all: Vec<Vec<Rule<'_>>> = domains.iter().map(rules).collect();
    name_limits(names, &mut all);
    for rules in &mut all {
        resolve_replaces(rules);
        for rule in rules.iter_mut() {
            let acts = rule.limit.is_some() || !rule.replaces.is_empty();
            let notes = matching_notes(&rule.steps, acts);
            rule.notes.extend(notes);
        }
    }
    let mut out = String::new();
    for (domain, rules) in domains.iter().zip(&all) {
        if !out.is_empty() {
            out.push('\n');
        }
        let _ = writeln!(
            out,
            "# envoyproxy/ratelimit domain {} (from {})",
            toml_text::comment(&toml_text::string(&domain.name)),
            toml_text::comment(&names[domain.file])
        );
        if rules.is_empty() {
            out.push_str("# (no descriptors)\n");
        }
        for (i, rule) in rules.iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            write_rule(&mut out, rule);
        }
    }
    out
}

fn write_rule(out: &mut String, rule: &Rule<'_>) {
    let node = rule.node();
    if let (Some((_, requests, unit)), Some(limit)) = (rule.rate(), &rule.limit) {
        let _ = writeln!(out, "[limits.{}]", toml_text::key(limit));
        if let Some(renamed) = &rule.renamed {
            comment(out, renamed);
        }
        out.push_str(
            "# envoyproxy/ratelimit counts in fixed windows, kept here so behaviour is unchanged;\n\
             # \"sliding_window\" would not let up to 2x the limit through around a window boundary.\n",
        );
        out.push_str("algorithm = \"fixed_window\"\n");
        let _ = writeln!(out, "limit = {requests}");
        let _ = writeln!(out, "window = \"{}\"", unit.window());
        if node.shadow {
            out.push_str("shadow = true\n");
        }
        out.push('\n');
    }
    out.push_str("[[decision.descriptors]]\n");
    match &node.rate_limit {
        Some(rate_limit) if matches!(rate_limit.amount, Amount::Unlimited) => {
            comment(out, "unlimited: true: matches, never limits");
        }
        None => comment(
            out,
            "no rate_limit and no descriptors below: envoyproxy/ratelimit lets it through \
             unlimited",
        ),
        Some(_) => {}
    }
    for dropped in &node.dropped {
        comment(out, dropped);
    }
    for note in &rule.notes {
        comment(out, note);
    }
    let _ = writeln!(out, "domain = {}", toml_text::string(&rule.domain.name));
    let entries: Vec<String> = rule.path().map(|n| match_entry(&n.key, &n.value)).collect();
    let _ = writeln!(out, "match = [{}]", entries.join(", "));
    let limits: Vec<String> = rule.limit.iter().map(|l| toml_text::string(l)).collect();
    let _ = writeln!(out, "limits = [{}]", limits.join(", "));
    if !rule.replaces.is_empty() {
        let replaces: Vec<String> = rule.replaces.iter().map(|l| toml_text::string(l)).collect();
        let _ = writeln!(out, "replaces = [{}]", replaces.join(", "));
    }
}

/// `text` as comment lines of at most 100 columns (a longer word stays whole).
fn comment(out: &mut String, text: &str) {
    let text = toml_text::comment(text);
    let mut line = String::from("#");
    for word in text.split(' ') {
        if line.len() > 1 && line.len() + 1 + word.len() > 100 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
}
