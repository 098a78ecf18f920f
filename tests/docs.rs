//! The documentation, checked against the code it describes: every TOML
//! block of `README.md` and `docs/src/` validates as a configuration, every
//! `tollgate ...` command line parses with the binary's own command line,
//! every relative link and anchor resolves, and the configuration reference
//! names exactly the keys the configuration parser accepts.
//!
//! Markers a block's info string may carry (after ` ```toml `):
//! - `fragment`: part of a file; checked merged into a minimal one (an
//!   upstream `api`, and what the fragment itself leaves out).
//! - `invalid`: shown for the error it makes; checked to fail validation.
//! - `files`: names files (certificates, key sets, secrets) a reader has and
//!   this test has not; problems that only say such a file cannot be read
//!   are accepted, every other problem fails the test.
//!
//! A block whose info string is `text` is not a command line (a synopsis,
//! an output) and is left alone by the command-line check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tollgate::config::Config;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The configuration reference whose keys are checked against the parser.
const REFERENCE: &str = "docs/src/reference/configuration.md";

/// The Markdown files a reader is sent through: the README, the benchmarks
/// and every page of the book.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = vec![
        Path::new(ROOT).join("README.md"),
        Path::new(ROOT).join("BENCHMARKS.md"),
    ];
    let mut dirs = vec![Path::new(ROOT).join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            // The built book (`mdbook build docs`) is not a source.
            if path.is_dir() && path.file_name() != Some("book".as_ref()) {
                dirs.push(path);
            } else if path.extension() == Some("md".as_ref()) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(ROOT)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A fenced code block: its info string, its text and the line its fence
/// opens on.
struct Block {
    info: String,
    text: String,
    line: usize,
}

/// The fenced code blocks of a Markdown text (fences of three or more
/// backticks, indented or not, as in list items).
fn code_blocks(markdown: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, String, usize, Block)> = None;
    for (index, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let ticks = trimmed.chars().take_while(|&c| c == '`').count();
        match &mut open {
            None if ticks >= 3 => {
                let info = trimmed[ticks..].trim().to_owned();
                let block = Block {
                    info,
                    text: String::new(),
                    line: index + 1,
                };
                open = Some((ticks, "`".repeat(ticks), indent, block));
            }
            None => {}
            Some((width, _, _, _)) if ticks >= *width && trimmed[ticks..].trim().is_empty() => {
                blocks.push(open.take().unwrap().3);
            }
            Some((_, _, indent, block)) => {
                let cut = line.len() - line.trim_start().len();
                block.text.push_str(&line[cut.min(*indent)..]);
                block.text.push('\n');
            }
        }
    }
    assert!(open.is_none(), "a code fence is never closed");
    blocks
}

/// The Markdown text outside code blocks and inline code, one entry per
/// line (code replaced by spaces, so links inside code are not links).
fn prose_lines(markdown: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut fence: Option<usize> = None;
    for (index, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let ticks = trimmed.chars().take_while(|&c| c == '`').count();
        if let Some(width) = fence {
            if ticks >= width && trimmed[ticks..].trim().is_empty() {
                fence = None;
            }
            continue;
        }
        if ticks >= 3 {
            fence = Some(ticks);
            continue;
        }
        let mut text = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
                text.push(' ');
            } else {
                text.push(if in_code { ' ' } else { c });
            }
        }
        lines.push((index + 1, text));
    }
    lines
}

// ---------------------------------------------------------------- TOML

fn info_words(info: &str) -> Vec<&str> {
    info.split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .collect()
}

/// The minimal file a fragment is completed into: what the fragment leaves
/// out of it is added, what it sets wins.
fn minimal() -> toml::Table {
    r#"
[upstreams.api]
url = "http://127.0.0.1:9000"
"#
    .parse()
    .unwrap()
}

/// Adds `base`'s entries that `into` lacks, table by table.
fn complete(into: &mut toml::Table, base: toml::Table) {
    for (key, value) in base {
        match (into.get_mut(&key), value) {
            (None, value) => {
                into.insert(key, value);
            }
            (Some(toml::Value::Table(mine)), toml::Value::Table(theirs)) => complete(mine, theirs),
            (Some(_), _) => {}
        }
    }
}

/// Whether every problem of a validation error only says that a file the
/// example names cannot be read.
fn only_missing_files(error: &str) -> bool {
    error.lines().filter(|l| !l.trim().is_empty()).all(|line| {
        line.contains("No such file or directory")
            || line.contains("cannot read")
            || line.contains("is not set")
    })
}

/// Validates one TOML block as written beside a `gateway.toml` in an empty
/// directory. `Err` is a message for the test's failure list.
fn check_toml_block(file: &str, block: &Block) -> Result<(), String> {
    let words = info_words(&block.info);
    let fragment = words.contains(&"fragment");
    let invalid = words.contains(&"invalid");
    let files = words.contains(&"files");
    let mut table: toml::Table = match block.text.parse() {
        Ok(table) => table,
        Err(e) if invalid => {
            let _ = e;
            return Ok(());
        }
        Err(e) => return Err(format!("{file}:{}: not TOML: {e}", block.line)),
    };
    if fragment {
        complete(&mut table, minimal());
    }
    let text = if fragment {
        toml::to_string(&table).unwrap()
    } else {
        block.text.clone()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    match (Config::from_bytes(&path, text.as_bytes()), invalid) {
        (Ok(_), false) => Ok(()),
        (Err(_), true) => Ok(()),
        (Ok(_), true) => Err(format!(
            "{file}:{}: marked `invalid` but validates",
            block.line
        )),
        (Err(e), false) => {
            let message = e.to_string();
            if files && only_missing_files(&message) {
                Ok(())
            } else {
                Err(format!(
                    "{file}:{}: does not validate{}:\n{message}",
                    block.line,
                    if fragment { " (as a fragment)" } else { "" }
                ))
            }
        }
    }
}

#[test]
fn every_toml_example_validates() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for path in markdown_files() {
        let markdown = std::fs::read_to_string(&path).unwrap();
        for block in code_blocks(&markdown) {
            if info_words(&block.info).first() != Some(&"toml") {
                continue;
            }
            checked += 1;
            if let Err(failure) = check_toml_block(&relative(&path), &block) {
                failures.push(failure);
            }
        }
    }
    assert!(checked >= 20, "only {checked} TOML blocks found");
    assert!(failures.is_empty(), "\n{}", failures.join("\n\n"));
}

#[test]
fn a_broken_toml_example_is_caught() {
    let block = |info: &str, text: &str| Block {
        info: info.into(),
        text: text.into(),
        line: 1,
    };
    // A misspelt key, a fragment's unknown limit, a fragment that is whole.
    assert!(check_toml_block("x", &block("toml", "[server]\nlistn = \"1\"\n")).is_err());
    let route = "[[routes]]\nname = \"a\"\nmatch = { path_prefix = \"/\" }\nupstream = \"api\"\nlimits = [\"nope\"]\n";
    assert!(check_toml_block("x", &block("toml fragment", route)).is_err());
    assert!(check_toml_block("x", &block("toml fragment", &route.replace("\"nope\"", ""))).is_ok());
    assert!(
        check_toml_block(
            "x",
            &block("toml invalid", "[server]\nlisten = \"127.0.0.1:1\"\n")
        )
        .is_err()
    );
    // `files` forgives a missing file, not a wrong key beside it.
    let tls = "[server.tls]\nlisten = \"127.0.0.1:0\"\ncert = \"a.crt\"\nkey = \"a.key\"\n";
    assert!(check_toml_block("x", &block("toml files", tls)).is_ok());
    assert!(check_toml_block("x", &block("toml", tls)).is_err());
    assert!(check_toml_block("x", &block("toml files", &format!("{tls}kye = 1\n"))).is_err());
}

// ---------------------------------------------------------- command lines

/// Splits a shell line into words: single and double quotes, backslash
/// escapes; a `#` starting a word starts a comment.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The arguments a documented command line gives tollgate, if it runs
/// tollgate: `tollgate ARGS`, `target/.../tollgate ARGS`, or `cargo run
/// [--release] [-- ARGS]`; environment assignments before it are skipped.
fn tollgate_arguments(command: &[String]) -> Option<Vec<String>> {
    let start = command
        .iter()
        .position(|w| !w.contains('=') || w.starts_with('-'))?;
    let command = &command[start..];
    let program = command.first()?;
    if program == "tollgate" || program.ends_with("/tollgate") {
        return Some(command[1..].to_vec());
    }
    if program == "cargo" && command.get(1).map(String::as_str) == Some("run") {
        return Some(match command.iter().position(|w| w == "--") {
            Some(dash) => command[dash + 1..].to_vec(),
            None => Vec::new(),
        });
    }
    None
}

/// The command lines of a code block that run tollgate, with the line each
/// starts on: a `$ ` prompt is dropped, `\` continues a line, and `&&`,
/// `||`, `;` and `|` separate commands.
fn command_lines(block: &Block) -> Vec<(usize, Vec<String>)> {
    // A script's every line is a command; elsewhere (a session with its
    // output) only a line after a `$ ` prompt is.
    let script =
        ["sh", "shell", "bash"].contains(&info_words(&block.info).first().copied().unwrap_or(""));
    let mut commands = Vec::new();
    let mut pending = String::new();
    let mut first = 0;
    for (offset, line) in block.text.lines().enumerate() {
        let line = match line.strip_prefix("$ ") {
            Some(command) => command,
            None if script || !pending.is_empty() => line,
            None => continue,
        };
        if pending.is_empty() {
            first = block.line + 1 + offset;
        }
        if let Some(head) = line.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let words = shell_words(&pending);
        pending.clear();
        for command in words.split(|w| ["&&", "||", ";", "|"].contains(&w.as_str())) {
            if let Some(arguments) = tollgate_arguments(command) {
                commands.push((first, arguments));
            }
        }
    }
    commands
}

/// Runs the binary with `arguments` in an empty directory, so that nothing
/// it names exists: a command line the parser accepts then fails on its
/// missing file (exit 1), prints what was asked (exit 0) or, should it find
/// something to serve, keeps running; a command line the parser refuses
/// exits 2 at once with clap's usage error.
fn parses(arguments: &[String]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(arguments)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            // Parsed long ago: clap answers before anything else runs.
            child.kill().unwrap();
            child.wait().unwrap();
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    if status.code() == Some(2) {
        Err(stderr)
    } else {
        Ok(())
    }
}

#[test]
fn every_documented_command_line_parses() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for path in markdown_files() {
        let markdown = std::fs::read_to_string(&path).unwrap();
        for block in code_blocks(&markdown) {
            let kind = info_words(&block.info).first().copied().unwrap_or("");
            if !["", "sh", "shell", "bash", "console"].contains(&kind) {
                continue;
            }
            for (line, arguments) in command_lines(&block) {
                checked += 1;
                if let Err(stderr) = parses(&arguments) {
                    failures.push(format!(
                        "{}:{line}: tollgate {}\n{stderr}",
                        relative(&path),
                        arguments.join(" ")
                    ));
                }
            }
        }
    }
    assert!(checked >= 10, "only {checked} command lines found");
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn a_command_line_the_parser_refuses_is_caught() {
    let block = Block {
        info: "sh".into(),
        text: "$ tollgate check -c a.toml && \\\n  tollgate simulate -c a.toml --trase x.csv   # typo\n"
            .into(),
        line: 10,
    };
    let commands = command_lines(&block);
    assert_eq!(commands.len(), 2);
    assert_eq!(commands[1].0, 11);
    assert!(parses(&commands[0].1).is_ok());
    assert!(parses(&commands[1].1).is_err());
    let cargo = shell_words("cargo run --release -- -c 'my file.toml'   # note the --");
    assert_eq!(
        tollgate_arguments(&cargo),
        Some(vec!["-c".to_owned(), "my file.toml".to_owned()])
    );
}

// ------------------------------------------------------------------ links

/// The anchor GitHub (and mdBook) gives a heading: lower case, punctuation
/// dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings, repeated ones numbered as
/// GitHub numbers them (`-1`, `-2`).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen = BTreeMap::<String, usize>::new();
    let mut all = BTreeSet::new();
    let mut fence = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
        }
        if fence {
            continue;
        }
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = anchor(&line[hashes..]);
            let count = seen.entry(base.clone()).or_default();
            all.insert(if *count == 0 {
                base.clone()
            } else {
                format!("{base}-{count}")
            });
            *count += 1;
        }
    }
    all
}

/// The targets of a line's Markdown links and images: `[text](target)`.
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let tail = &rest[at + 2..];
        let Some(end) = tail.find(')') else { break };
        let target = tail[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(|c| c == '<' || c == '>').to_owned());
        rest = &tail[end..];
    }
    targets
}

/// Checks one link of `from`; `Err` says what does not resolve.
fn check_link(from: &Path, target: &str) -> Result<(), String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(());
    }
    let (file, fragment) = match target.split_once('#') {
        Some((file, fragment)) => (file, Some(fragment)),
        None => (target, None),
    };
    let resolved = if file.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().unwrap().join(file)
    };
    if !resolved.exists() {
        return Err(format!("{target}: no such file"));
    }
    if let Some(fragment) = fragment {
        if resolved.extension() != Some("md".as_ref()) {
            return Err(format!(
                "{target}: an anchor into a file that is not Markdown"
            ));
        }
        let text = std::fs::read_to_string(&resolved).unwrap();
        if !anchors(&text).contains(fragment) {
            return Err(format!("{target}: no heading `#{fragment}` there"));
        }
    }
    Ok(())
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for path in markdown_files() {
        let markdown = std::fs::read_to_string(&path).unwrap();
        for (line, text) in prose_lines(&markdown) {
            for target in link_targets(&text) {
                checked += 1;
                if let Err(why) = check_link(&path, &target) {
                    failures.push(format!("{}:{line}: {why}", relative(&path)));
                }
            }
        }
    }
    assert!(checked >= 50, "only {checked} links found");
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn a_broken_link_or_anchor_is_caught() {
    let readme = Path::new(ROOT).join("README.md");
    assert!(check_link(&readme, "docs/src/SUMMARY.md").is_ok());
    assert!(check_link(&readme, "docs/src/no-such-page.md").is_err());
    assert!(check_link(&readme, "docs/src/operating.md#signals").is_ok());
    assert!(check_link(&readme, "docs/src/operating.md#no-such-heading").is_err());
    assert_eq!(
        anchor(" `[server.tls]`: TLS termination and HTTP/2"),
        "servertls-tls-termination-and-http2"
    );
    let numbered = anchors("# A\n## Usage\n```\n# not a heading\n```\n## Usage\n");
    assert!(numbered.contains("usage-1") && !numbered.contains("not-a-heading"));
    assert_eq!(
        link_targets(" see [the page](a.md#b) and ![chart](c.svg \"title\")"),
        ["a.md#b", "c.svg"]
    );
}

// ------------------------------------------------- the reference's keys

/// One step of a path into the configuration: a key, an element of an
/// array of tables, or an entry of a table of named tables.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Key(String),
    Element,
    Entry,
}

/// A section's name as the reference writes it: `upstreams.*.eject`,
/// `routes[].match` (`*`: any name; `[]`: any element).
fn section_name(path: &[Step]) -> String {
    let mut name = String::new();
    for step in path {
        match step {
            Step::Key(key) if name.is_empty() => name.push_str(key),
            Step::Key(key) => {
                name.push('.');
                name.push_str(key);
            }
            Step::Element => name.push_str("[]"),
            Step::Entry => name.push_str(".*"),
        }
    }
    name
}

const PROBE: &str = "zz_probe_unknown";

/// The keys the parser accepts in the table at `path`, from its error for an
/// unknown key there ("unknown key `k`, expected one of a, b, c"); `None`
/// when no table that refuses unknown keys is there.
fn accepted_keys(path: &[Step]) -> Option<BTreeSet<String>> {
    let mut value = format!("{{ {PROBE} = 1 }}");
    for step in path.iter().skip(1).rev() {
        value = match step {
            Step::Key(key) => format!("{{ {key} = {value} }}"),
            Step::Element => format!("[ {value} ]"),
            Step::Entry => format!("{{ x = {value} }}"),
        };
    }
    let text = match path.first() {
        Some(Step::Key(top)) => format!("{top} = {value}\n"),
        None => format!("{PROBE} = 1\n"),
        Some(_) => unreachable!("a path starts with a key"),
    };
    let error = Config::from_bytes(Path::new("gateway.toml"), text.as_bytes())
        .err()?
        .to_string();
    let marker = format!("unknown key `{PROBE}`, expected one of ");
    let list = &error[error.find(&marker)? + marker.len()..];
    let list = list
        .split(" (did you mean")
        .next()
        .unwrap()
        .lines()
        .next()?;
    Some(list.split(", ").map(str::to_owned).collect())
}

/// Every table the parser accepts, by section name, with its keys: found
/// from the top by trying each accepted key as a table, an array of tables
/// and a table of named tables.
fn parser_sections() -> BTreeMap<String, BTreeSet<String>> {
    let mut sections = BTreeMap::new();
    let mut queue = vec![Vec::new()];
    while let Some(path) = queue.pop() {
        let keys = accepted_keys(&path).expect("the top level refuses unknown keys");
        for key in &keys {
            let mut child = path.clone();
            child.push(Step::Key(key.clone()));
            for shape in [None, Some(Step::Element), Some(Step::Entry)] {
                let mut candidate = child.clone();
                candidate.extend(shape);
                if accepted_keys(&candidate).is_some() {
                    queue.push(candidate);
                    break;
                }
            }
        }
        sections.insert(section_name(&path), keys);
    }
    sections
}

/// A section named by a heading: its last code span, when that is a TOML
/// table header (`[server.tls]`, `[[routes]]`, `[upstreams.NAME]`) or a
/// path (`routes[].match`). Placeholders (`NAME`, `"KEY"`) are `*`.
fn heading_section(heading: &str) -> Option<String> {
    let span = heading.split('`').skip(1).step_by(2).last()?;
    let (inner, array) = if let Some(inner) = span.strip_prefix("[[") {
        (inner.strip_suffix("]]")?, true)
    } else if let Some(inner) = span.strip_prefix('[') {
        (inner.strip_suffix(']')?, false)
    } else if span.contains('.') || span.contains("[]") {
        (span, false)
    } else {
        return None;
    };
    let name = inner
        .split('.')
        .map(|part| {
            let placeholder = part.starts_with('"')
                || (part.chars().any(|c| c.is_ascii_uppercase())
                    && part.chars().all(|c| c.is_ascii_uppercase() || c == '_'));
            if placeholder { "*" } else { part }
        })
        .collect::<Vec<_>>()
        .join(".");
    Some(if array { format!("{name}[]") } else { name })
}

/// The keys the reference documents, by section: the first column of every
/// table headed `key`, under the section its heading names. A key written as
/// a path (`issuers[].issuer`) belongs to the section it leads into.
fn documented_sections(markdown: &str) -> Result<BTreeMap<String, BTreeSet<String>>, String> {
    let mut sections = BTreeMap::<String, BTreeSet<String>>::new();
    let mut section: Option<String> = None;
    let mut in_key_table = false;
    for (number, line) in prose_or_raw_lines(markdown) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes > 0 && line[hashes..].starts_with(' ') {
            section = heading_section(&line);
            if let Some(name) = &section {
                sections.entry(name.clone()).or_default();
            }
            continue;
        }
        if !line.starts_with('|') {
            in_key_table = false;
            continue;
        }
        let first = line
            .trim_matches('|')
            .split('|')
            .next()
            .unwrap_or("")
            .trim();
        if first == "key" {
            if section.is_none() {
                return Err(format!("line {number}: a key table under no section"));
            }
            in_key_table = true;
            continue;
        }
        if !in_key_table || first.starts_with("---") {
            continue;
        }
        let base = section.clone().unwrap();
        for key in first.split('`').skip(1).step_by(2) {
            let (inner, leaf) = match key.rsplit_once('.') {
                Some((inner, leaf)) => (format!("{base}.{inner}"), leaf),
                None => (base.clone(), key),
            };
            sections.entry(inner).or_default().insert(leaf.to_owned());
        }
    }
    Ok(sections)
}

/// The lines of a Markdown text outside code blocks, as they are.
fn prose_or_raw_lines(markdown: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut fence = false;
    for (index, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if !fence {
            lines.push((index + 1, line.to_owned()));
        }
    }
    lines
}

/// What the reference and the parser disagree on, one line each.
fn reference_mismatches(
    documented: &BTreeMap<String, BTreeSet<String>>,
    parser: &BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (section, keys) in parser {
        let Some(written) = documented.get(section) else {
            if !section.is_empty() {
                problems.push(format!("section `{section}` is not in the reference"));
            }
            continue;
        };
        for key in keys {
            let child = |suffix: &str| {
                let name = if section.is_empty() {
                    format!("{key}{suffix}")
                } else {
                    format!("{section}.{key}{suffix}")
                };
                documented.contains_key(&name)
            };
            // A key that is a table may be documented as its own section.
            if !written.contains(key) && !child("") && !child("[]") && !child(".*") {
                problems.push(format!(
                    "`{key}` of `{section}` is accepted but not documented"
                ));
            }
        }
    }
    for (section, keys) in documented {
        match parser.get(section) {
            None => problems.push(format!(
                "the reference documents `{section}`, which the parser has no table for"
            )),
            Some(accepted) => {
                for key in keys.difference(accepted) {
                    problems.push(format!(
                        "the reference documents `{key}` of `{section}`, which the parser refuses"
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn the_reference_names_exactly_the_keys_the_parser_accepts() {
    let parser = parser_sections();
    assert!(parser["server"].contains("listen"), "{parser:?}");
    assert!(parser.contains_key("upstreams.*.health"), "{parser:?}");
    assert!(parser.contains_key("routes[]"), "{parser:?}");
    let markdown = std::fs::read_to_string(Path::new(ROOT).join(REFERENCE)).unwrap();
    let documented = documented_sections(&markdown).unwrap();
    let problems = reference_mismatches(&documented, &parser);
    assert!(problems.is_empty(), "{REFERENCE}:\n{}", problems.join("\n"));
}

#[test]
fn a_reference_out_of_step_with_the_parser_is_caught() {
    let parser = parser_sections();
    let markdown = std::fs::read_to_string(Path::new(ROOT).join(REFERENCE)).unwrap();
    // A key dropped from the reference, and one the parser does not know.
    let dropped = markdown.replacen("| `shutdown_timeout` |", "| `shutdown` |", 1);
    assert_ne!(
        dropped, markdown,
        "the reference lacks the line this test edits"
    );
    let problems = reference_mismatches(&documented_sections(&dropped).unwrap(), &parser);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("`shutdown_timeout` of `server` is accepted but not documented")),
        "{problems:?}"
    );
    assert!(
        problems
            .iter()
            .any(|p| p.contains("documents `shutdown` of `server`")),
        "{problems:?}"
    );
    assert_eq!(
        heading_section("## `[upstreams.NAME.eject]`: passive health").as_deref(),
        Some("upstreams.*.eject")
    );
    assert_eq!(
        heading_section("## `[[routes]]`").as_deref(),
        Some("routes[]")
    );
    assert_eq!(
        heading_section("## `[consumers.\"KEY\"]`").as_deref(),
        Some("consumers.*")
    );
}
