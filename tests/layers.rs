//! The layer order of the crate doc (`src/lib.rs`), kept: every `crate::` or
//! `super::` path in a file of `src/` (outside its `#[cfg(test)]` part, doc
//! links included) is an arrow to the file it names, and no arrow may point
//! up a layer or close a cycle between files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The layers, lowest first, by top-level module.
const LAYERS: &[&[&str]] = &[
    &["http"],
    &["http1"],
    &["upstream"],
    &["app"],
    &["proxy", "explain"],
    &["conn"],
    &["admin", "reload", "gateway", "simulate"],
    &["", "main"],
];

/// Beside the layers and below the pipeline: they may use the wire
/// vocabulary (`http`) and each other, nothing else of the layers.
const BESIDE: &[&str] = &[
    "access_log",
    "allocator",
    "config",
    "fd_limit",
    "identity",
    "limit",
    "metrics",
    "ratelimit_policy",
    "routing",
    "store",
    "summary",
    "worker",
];

/// What the codec and the upstream layer may use from beside the layers.
const BELOW_APP_MAY_USE: &[(&str, &[&str])] = &[
    ("http", &[]),
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
            let text = match text.find("#[cfg(test)]") {
                Some(at) => text[..at].to_owned(),
                None => text,
            };
            out.insert(module, text);
        }
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
                (None, None) => true,
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
