//! The layer order of the crate doc (`src/lib.rs`), kept: every `crate::` or
//! `super::` path in a file of `src/` (outside its `#[cfg(test)]` items,
//! wherever in the file they are; doc links included) is an arrow to the file it names, and no arrow may point
//! up a layer or close a cycle between files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first, by top-level module.
const LAYERS: &[&[&str]] = &[
    &["http", "envoy_proto"],
    &["http1"],
    &["upstream"],
    &["app"],
    &["admission"],
    &["answer"],
    &["proxy"],
    &["conn"],
    &[
        "admin", "decision", "reload", "gateway", "simulate", "import",
    ],
    &["", "main"],
];

/// The fronts: each turns its input into one admission call and the
/// answer into its own wire format. None imports another (what two share,
/// the 429, error → status, the body types, is `answer`, below them), and
/// neither does the admin listener: only the connection layer reaches the
/// proxy, for its handler.
const FRONTS: &[&str] = &["proxy", "decision", "simulate"];

/// Beside the layers and below the pipeline: they may use the wire
/// vocabulary (`http`, `envoy_proto`) and each other, nothing else of the
/// layers.
const BESIDE: &[&str] = &[
    "access_log",
    "allocator",
    "config",
    "fd_limit",
    "identity",
    "jose",
    "limit",
    "llm",
    "metrics",
    "post_client",
    "ratelimit_policy",
    "routing",
    "store",
    "summary",
    "trace",
    "usage",
    "worker",
];

/// Beside modules that build on one another, lowest first: an arrow
/// between two of them points down this list. The identities read the
/// configuration, so the configuration imports nothing of them; what both
/// need of JWTs (algorithms, key sets) is `jose`, below both.
const BESIDE_ORDER: &[&str] = &["jose", "config", "identity"];

/// What the wire vocabulary, the codec and the upstream layer may use from
/// beside the layers.
const BELOW_APP_MAY_USE: &[(&str, &[&str])] = &[
    ("http", &[]),
    ("envoy_proto", &[]),
    ("http1", &[]),
    ("upstream", &["config", "worker"]),
];

type Module = Vec<String>;

/// Every `.rs` file under `dir`, by module path (`src/a/mod.rs` is `a`).
fn files(dir: &Path, prefix: &Module, out: &mut BTreeMap<Module, String>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut module = prefix.clone();
            module.push(name);
            files(&path, &module, out);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let mut module = prefix.clone();
            if !matches!(stem, "mod" | "lib") {
                module.push(stem.to_owned());
            }
            let text = std::fs::read_to_string(&path).expect("read file");
            // Tests may import anything.
            out.insert(module, without_test_items(&text));
        }
    }
}

/// `text` without its `#[cfg(test)]` items (a `mod tests { … }`, a
/// `mod tests;`, a test-only function or `use`): the production code after
/// such an item is read like the code before it.
fn without_test_items(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut kept = String::new();
    let mut from = 0;
    while let Some(found) = text[from..].find("#[cfg(test)]") {
        let at = from + found;
        kept.push_str(&text[from..at]);
        from = item_end(bytes, at + "#[cfg(test)]".len());
    }
    kept.push_str(&text[from..]);
    kept
}

/// Where the item starting at or after `at` ends: after the `;` that ends
/// it at depth 0, or after the `}` that closes its first `{`. Strings,
/// character literals and comments are skipped, so a brace inside one
/// does not count.
fn item_end(bytes: &[u8], mut at: usize) -> usize {
    let mut depth = 0usize;
    while at < bytes.len() {
        match bytes[at] {
            b'/' if bytes[at..].starts_with(b"//") => {
                at += bytes[at..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .unwrap_or(bytes.len() - at);
                continue;
            }
            b'/' if bytes[at..].starts_with(b"/*") => {
                at += bytes[at..]
                    .windows(2)
                    .position(|w| w == b"*/")
                    .map_or(bytes.len() - at, |i| i + 2);
                continue;
            }
            b'r' if !is_ident(bytes[at.saturating_sub(1)])
                && matches!(bytes.get(at + 1), Some(b'"' | b'#')) =>
            {
                // A raw string: r"…", r#"…"#, …
                let hashes = bytes[at + 1..].iter().take_while(|&&b| b == b'#').count();
                let open = at + 1 + hashes;
                if bytes.get(open) == Some(&b'"') {
                    let mut close = vec![b'"'];
                    close.extend(std::iter::repeat_n(b'#', hashes));
                    at = bytes[open + 1..]
                        .windows(close.len())
                        .position(|w| w == close.as_slice())
                        .map_or(bytes.len(), |i| open + 1 + i + close.len());
                    continue;
                }
            }
            b'"' => {
                at += 1;
                while at < bytes.len() && bytes[at] != b'"' {
                    at += if bytes[at] == b'\\' { 2 } else { 1 };
                }
            }
            b'\'' => {
                // A character literal ('{', '\n', '\u{7b}'), not a lifetime.
                if bytes.get(at + 1) == Some(&b'\\') {
                    at += bytes[at + 2..]
                        .iter()
                        .position(|&b| b == b'\'')
                        .map_or(bytes.len() - at, |i| i + 2);
                } else if bytes.get(at + 2) == Some(&b'\'') {
                    at += 2;
                }
            }
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return at + 1;
                }
            }
            b';' if depth == 0 => return at + 1,
            _ => {}
        }
        at += 1;
    }
    bytes.len()
}

#[test]
fn test_items_are_left_out_and_the_code_after_them_is_read() {
    let text = "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n    const S: &str = \"}\";\n    const C: char = '}';\n    fn f<'a>(x: &'a str) -> &'a str { x }\n    // }\n}\nuse crate::c;\n#[cfg(test)]\nuse crate::d;\nfn g() {}\n#[cfg(test)]\nmod more;\nuse crate::e;\n";
    let kept = without_test_items(text);
    for wanted in ["crate::a", "crate::c", "crate::e", "fn g() {}"] {
        assert!(kept.contains(wanted), "{wanted} missing from {kept:?}");
    }
    for unwanted in ["crate::b", "crate::d", "mod more"] {
        assert!(!kept.contains(unwanted), "{unwanted} kept in {kept:?}");
    }
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The module paths a file's text names: `crate::a::b`, `super::c`, and each
/// member of a `crate::a::{b, c::d}` group. (Read as bytes: paths are ASCII,
/// the text around them need not be.)
fn paths(module: &Module, text: &str) -> Vec<Module> {
    let bytes = text.as_bytes();
    let word = |from: usize, to: usize| String::from_utf8_lossy(&bytes[from..to]).into_owned();
    let mut found = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let fresh = at == 0 || !is_ident(bytes[at - 1]);
        let (base, skip) = if fresh && rest.starts_with(b"crate::") {
            (Vec::new(), b"crate::".len())
        } else if fresh && rest.starts_with(b"super::") {
            let mut ups = 0;
            let mut len = 0;
            while bytes[at + len..].starts_with(b"super::") {
                ups += 1;
                len += b"super::".len();
            }
            if ups > module.len() {
                at += len;
                continue;
            }
            (module[..module.len() - ups].to_vec(), len)
        } else {
            at += 1;
            continue;
        };
        let mut end = at + skip;
        let mut path = base;
        loop {
            let start = end;
            while end < bytes.len() && is_ident(bytes[end]) {
                end += 1;
            }
            if start == end {
                break;
            }
            path.push(word(start, end));
            if bytes[end..].starts_with(b"::") && end + 2 < bytes.len() && is_ident(bytes[end + 2])
            {
                end += 2;
            } else {
                break;
            }
        }
        if bytes[end..].starts_with(b"::{") {
            let close = bytes[end..]
                .iter()
                .position(|&b| b == b'}')
                .map_or(bytes.len(), |i| end + i);
            for member in word(end + 3, close).split(',') {
                let member = member.split(" as ").next().unwrap_or("").trim();
                if member.is_empty() || member == "self" || member.starts_with('{') {
                    continue;
                }
                let mut full = path.clone();
                full.extend(member.split("::").map(|s| s.trim().to_owned()));
                found.push(full);
            }
            end = close;
        }
        found.push(path);
        at = end.max(at + 1);
    }
    found
}

/// The file a path lands in: its longest prefix that is a file.
fn resolve<'m>(files: &'m BTreeMap<Module, String>, path: &Module) -> Option<&'m Module> {
    (1..=path.len())
        .rev()
        .find_map(|k| files.get_key_value(&path[..k]).map(|(m, _)| m))
}

fn top(module: &Module) -> &str {
    module.first().map_or("", String::as_str)
}

fn layer(top: &str) -> Option<usize> {
    LAYERS.iter().position(|names| names.contains(&top))
}

/// The arrows between files: each file to the files it names (a file
/// naming its own ancestor module, as children do, is not an arrow).
fn arrows() -> BTreeMap<Module, BTreeSet<Module>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut all = BTreeMap::new();
    files(&src, &Vec::new(), &mut all);
    let mut arrows = BTreeMap::new();
    for (module, text) in &all {
        let targets: &mut BTreeSet<Module> = arrows.entry(module.clone()).or_default();
        for path in paths(module, text) {
            if let Some(target) = resolve(&all, &path)
                && target != module
                && !module.starts_with(target)
            {
                targets.insert(target.clone());
            }
        }
    }
    arrows
}

#[test]
fn every_arrow_points_down_the_layers() {
    let mut wrong = Vec::new();
    for (from, targets) in arrows() {
        for to in targets {
            let (a, b) = (top(&from), top(&to));
            if a == b {
                continue;
            }
            let allowed = match (layer(a), layer(b)) {
                (Some(x), Some(y)) => y < x,
                // Beside the layers: only the wire vocabulary below.
                (None, Some(y)) => y == 0,
                // A layer using what is beside: not the codec or the
                // upstream layer, beyond what they are allowed.
                (Some(_), None) => BELOW_APP_MAY_USE
                    .iter()
                    .find(|(layer, _)| *layer == a)
                    .is_none_or(|(_, may)| may.contains(&b)),
                (None, None) => {
                    let rank = |name| BESIDE_ORDER.iter().position(|m| *m == name);
                    match (rank(a), rank(b)) {
                        (Some(x), Some(y)) => y < x,
                        _ => true,
                    }
                }
            };
            if !allowed {
                wrong.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows up the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_front_imports_another_nor_does_admin() {
    let mut wrong = Vec::new();
    for (from, targets) in arrows() {
        let a = top(&from);
        if !FRONTS.contains(&a) && a != "admin" {
            continue;
        }
        for to in targets {
            let b = top(&to);
            if a != b && FRONTS.contains(&b) {
                wrong.push(format!("{} -> {}", from.join("::"), to.join("::")));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "a front (or admin) leaning on a front:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn every_module_has_a_place() {
    let unplaced: BTreeSet<String> = arrows()
        .keys()
        .map(|module| top(module).to_owned())
        .filter(|top| layer(top).is_none() && !BESIDE.contains(&top.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules in neither LAYERS nor BESIDE (place them, and say where in src/lib.rs): {unplaced:?}"
    );
}

#[test]
fn no_two_files_import_each_other() {
    let arrows = arrows();
    // A file on a cycle reaches itself.
    let mut cyclic = Vec::new();
    for start in arrows.keys() {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&Module> = arrows[start].iter().collect();
        while let Some(next) = stack.pop() {
            if next == start {
                cyclic.push(start.join("::"));
                break;
            }
            if seen.insert(next) {
                stack.extend(arrows.get(next).into_iter().flatten());
            }
        }
    }
    assert!(cyclic.is_empty(), "files on an import cycle: {cyclic:?}");
}

#[test]
fn the_checker_sees_arrows() {
    // The rules above pass vacuously if no arrow is found at all.
    let arrows = arrows();
    let handler = arrows
        .get(&vec!["proxy".to_owned(), "handler".to_owned()])
        .expect("src/proxy/handler.rs");
    assert!(handler.contains(&vec!["app".to_owned()]), "{handler:?}");
    assert!(
        handler.contains(&vec!["proxy".to_owned(), "body".to_owned()]),
        "{handler:?}"
    );
}
