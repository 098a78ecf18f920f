//! Where tollgate's first match over the written rules could answer
//! otherwise than envoyproxy/ratelimit's lookup, which takes one node per
//! descriptor entry (exact value, else the first matching wildcard, else the
//! key alone) and never backtracks (`config_impl.go`'s `GetLimit`): the
//! order rules are written in, and the `# note:`s where that order is not
//! enough.

use std::collections::HashMap;

use super::{Descriptor, Matcher, match_entry};

/// `list`'s indices grouped by key (in order of first appearance), each
/// group exact values first, then prefixes in file order (the first that
/// matches wins in envoyproxy/ratelimit), then key only.
pub(super) fn preference_order(list: &[Descriptor]) -> Vec<usize> {
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (at, node) in list.iter().enumerate() {
        first.entry(node.key.as_str()).or_insert(at);
    }
    let mut order: Vec<usize> = (0..list.len()).collect();
    order.sort_by_key(|&at| (first[list[at].key.as_str()], list[at].value.class()));
    order
}

/// Whether envoyproxy/ratelimit tries `a` (at index `i`) before `b` (at
/// `j`), siblings of one key.
fn preferred(a: &Descriptor, i: usize, b: &Descriptor, j: usize) -> bool {
    let (x, y) = (a.value.class(), b.value.class());
    x < y || (x == 1 && y == 1 && i < j)
}

/// The node envoyproxy/ratelimit takes among `list` for the entry
/// `key`=`value`: the exact one, else the first prefix, else key only.
fn choose<'d>(list: &'d [Descriptor], key: &str, value: &str) -> Option<&'d Descriptor> {
    let of_key = || list.iter().filter(move |n| n.key == key);
    of_key()
        .find(|n| n.value == Matcher::Exact(value.to_owned()))
        .or_else(|| {
            of_key()
                .find(|n| matches!(&n.value, Matcher::Prefix(p) if value.starts_with(p.as_str())))
        })
        .or_else(|| of_key().find(|n| n.value == Matcher::Any))
}

/// Whether every descriptor whose remaining entries match `rest` (key and
/// value matcher each), having reached `node`, ends in
/// envoyproxy/ratelimit at a node with a rule: then tollgate's first match
/// finds that node's rule (written earlier) and nothing after it.
fn covers(node: &Descriptor, rest: &[(&str, &Matcher)]) -> bool {
    let Some(((key, matcher), rest)) = rest.split_first() else {
        return node.has_rule();
    };
    let list = &node.children;
    match matcher {
        Matcher::Exact(value) => choose(list, key, value).is_some_and(|next| covers(next, rest)),
        _ => {
            let p = matcher.prefix().unwrap_or("");
            let of_key = || list.iter().filter(|n| n.key == *key);
            // Each node some matched value could be taken by.
            let reached = of_key()
                .filter(|n| n.value != Matcher::Any && n.value.overlaps(matcher))
                .all(|n| covers(n, rest));
            // Values no exact or prefix node takes fall to key only.
            let all_taken = of_key()
                .any(|n| matches!(&n.value, Matcher::Prefix(q) if p.starts_with(q.as_str())));
            let fallen = all_taken
                || of_key()
                    .find(|n| n.value == Matcher::Any)
                    .is_some_and(|n| covers(n, rest));
            reached && fallen
        }
    }
}

/// The `# note:`s of the rule for the node at the end of `steps` (each
/// level's nodes and the index taken), whose answer may differ from (or is
/// the same dead end as) envoyproxy/ratelimit's: at each level, a sibling
/// tried before the rule's node that matches some of the same values, and
/// below which a descriptor of this rule could end without a rule. `acts`:
/// the rule limits or replaces (one that does neither answers what "no
/// rule" answers).
pub(super) fn matching_notes(steps: &[(&[Descriptor], usize)], acts: bool) -> Vec<String> {
    let path: Vec<&Descriptor> = steps.iter().map(|(list, at)| &list[*at]).collect();
    let mut notes = Vec::new();
    for (level, &(list, at)) in steps.iter().enumerate() {
        let here = path[level];
        if here.value.class() == 0 {
            // Nothing is tried before an exact value (a long list of exact
            // values is the common shape: no pairs to compare).
            continue;
        }
        let rest: Vec<(&str, &Matcher)> = path[level + 1..]
            .iter()
            .map(|n| (n.key.as_str(), &n.value))
            .collect();
        for (i, other) in list.iter().enumerate() {
            if i == at
                || other.key != here.key
                || !preferred(other, i, here, at)
                || !other.value.overlaps(&here.value)
            {
                continue;
            }
            let entry = format!(
                "{} (line {})",
                match_entry(&other.key, &other.value),
                other.line
            );
            if !covers(other, &rest) {
                if acts {
                    notes.push(format!(
                        "note: where entry {} also matches {entry}, envoyproxy/ratelimit takes \
                         that branch and never backtracks, so a descriptor that branch has no \
                         rule for is not limited there; here this rule applies to it.",
                        level + 1
                    ));
                }
            } else if here.value.within(&other.value) {
                notes.push(format!(
                    "note: never applies, in envoyproxy/ratelimit as here: {entry} is tried \
                     first for every value of entry {} this rule matches, and has a rule for \
                     each such descriptor.",
                    level + 1
                ));
            }
        }
    }
    notes
}
