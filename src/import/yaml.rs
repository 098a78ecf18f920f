//! A YAML document as a tree whose every node knows its line, for importers
//! whose errors name file and line. Scalars keep the text as written and
//! whether it was plain (unquoted), so the reader resolves types itself: a
//! config written for Go's `gopkg.in/yaml.v2` (YAML 1.1, where a plain `yes`
//! is true and a plain `8080` fills a string field as "8080") reads as its
//! own program read it. Aliases are expanded and `<<` merge keys applied, as
//! yaml.v2 does; a duplicate key is an error (yaml.v2 would keep the last).

use std::collections::{HashMap, HashSet};

use saphyr_parser::{Event, Parser, ScalarStyle};

/// Most nodes a document may expand to: aliases can multiply a small file
/// (the "billion laughs"), and the tree is held whole.
const MAX_NODES: usize = 1_000_000;
/// Deepest nesting read; the readers walk the tree recursively.
const MAX_DEPTH: usize = 128;

/// A node and the line (1-based) it starts on.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub(crate) line: usize,
    pub(crate) value: Value,
    /// Nodes in this subtree, this one included (what an alias to it costs).
    weight: usize,
}

#[derive(Debug, Clone)]
pub(crate) enum Value {
    /// `~`, `null`, or nothing after a key.
    Null,
    /// A scalar's text, and whether it was written plain (unquoted, no block).
    Scalar {
        text: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    Map(Vec<Entry>),
}

/// One key of a mapping, with the line of the key.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) key: String,
    pub(crate) line: usize,
    pub(crate) value: Node,
}

/// A problem at a line of the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) line: usize,
    pub(crate) message: String,
}

impl Node {
    /// What the node is, for "expected X, found Y" messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self.value {
            Value::Null => "nothing",
            Value::Scalar { .. } => "a scalar",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// A document read, with what was wrong in it that did not stop the reading.
#[derive(Debug)]
pub(crate) struct Document {
    /// `None` for a stream with no document (empty, or comments only).
    pub(crate) root: Option<Node>,
    /// Duplicate keys (the first one is kept), bad merges, a second document.
    pub(crate) problems: Vec<Problem>,
}

/// The first document of `text`. `Err` is what stopped the reading: a
/// syntax error, an unknown alias, a document too large or too deep.
pub(crate) fn parse(text: &str) -> Result<Document, Problem> {
    let mut builder = Builder::default();
    let mut documents = 0;
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|error| Problem {
            line: error.marker().line(),
            message: format!("YAML syntax: {}", error.info()),
        })?;
        let line = span.start.line();
        let completed = match event {
            Event::DocumentStart(_) => {
                documents += 1;
                if documents > 1 {
                    builder.problems.push(Problem {
                        line,
                        message: "a second YAML document: envoyproxy/ratelimit reads only the \
                                  first one of a file; give each domain a file of its own"
                            .to_owned(),
                    });
                    break;
                }
                continue;
            }
            Event::Scalar(text, style, anchor, _tag) => {
                let plain = style == ScalarStyle::Plain;
                let value = if plain && matches!(&*text, "" | "~" | "null" | "Null" | "NULL") {
                    Value::Null
                } else {
                    Value::Scalar {
                        text: text.into_owned(),
                        plain,
                    }
                };
                Some((
                    Node {
                        line,
                        value,
                        weight: 1,
                    },
                    anchor,
                ))
            }
            Event::Alias(anchor) => match builder.anchors.get(&anchor) {
                Some(node) => Some((node.clone(), 0)),
                None => {
                    return Err(Problem {
                        line,
                        message: "an alias to an anchor not defined before it".to_owned(),
                    });
                }
            },
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                if builder.stack.len() >= MAX_DEPTH {
                    return Err(Problem {
                        line,
                        message: format!("nested more than {MAX_DEPTH} levels deep"),
                    });
                }
                let is_map = matches!(event, Event::MappingStart(..));
                builder.stack.push(Frame {
                    line,
                    anchor,
                    is_map,
                    items: Vec::new(),
                });
                continue;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let frame = builder.stack.pop().expect("the parser balances its events");
                let node = if frame.is_map {
                    builder.mapping(frame.line, frame.items)
                } else {
                    Node {
                        line: frame.line,
                        weight: 1 + frame.items.iter().map(|n| n.weight).sum::<usize>(),
                        value: Value::Seq(frame.items),
                    }
                };
                Some((node, frame.anchor))
            }
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {
                continue;
            }
        };
        let Some((node, anchor)) = completed else {
            continue;
        };
        builder.nodes += node.weight;
        if builder.nodes > MAX_NODES {
            return Err(Problem {
                line,
                message: format!("more than {MAX_NODES} YAML nodes (with aliases expanded)"),
            });
        }
        if anchor != 0 {
            builder.anchors.insert(anchor, node.clone());
        }
        match builder.stack.last_mut() {
            Some(frame) => frame.items.push(node),
            None => builder.root = Some(node),
        }
    }
    Ok(Document {
        root: builder.root,
        problems: builder.problems,
    })
}

/// A sequence or mapping being read: its items so far (a mapping's are
/// key, value, key, value, ...).
struct Frame {
    line: usize,
    anchor: usize,
    is_map: bool,
    items: Vec<Node>,
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, Node>,
    root: Option<Node>,
    nodes: usize,
    problems: Vec<Problem>,
}

impl Builder {
    /// A mapping from its alternating keys and values: keys must be
    /// scalars and unique; `<<` merges in the mappings it names, below the
    /// keys written beside it (YAML 1.1's merge key, as yaml.v2 has it).
    fn mapping(&mut self, line: usize, items: Vec<Node>) -> Node {
        let mut entries: Vec<Entry> = Vec::new();
        // Each key's line, for duplicates (a mapping may be large).
        let mut written: HashMap<String, usize> = HashMap::new();
        let mut merged: Vec<Entry> = Vec::new();
        let mut items = items.into_iter();
        while let (Some(key), Some(value)) = (items.next(), items.next()) {
            let (text, plain) = match key.value {
                Value::Scalar { text, plain } => (text, plain),
                Value::Null => (String::new(), true),
                _ => {
                    self.problems.push(Problem {
                        line: key.line,
                        message: format!("a key must be a name, not {}", key.kind()),
                    });
                    continue;
                }
            };
            if plain && text == "<<" {
                self.merge(&value, &mut merged);
                continue;
            }
            if let Some(first) = written.get(&text) {
                self.problems.push(Problem {
                    line: key.line,
                    message: format!(
                        "duplicate key \"{text}\" (first at line {first}): envoyproxy/ratelimit \
                         would silently keep the last one; keep one"
                    ),
                });
                continue;
            }
            written.insert(text.clone(), key.line);
            entries.push(Entry {
                key: text,
                line: key.line,
                value,
            });
        }
        for entry in merged {
            if !written.contains_key(&entry.key) {
                entries.push(entry);
            }
        }
        Node {
            line,
            weight: 1 + entries.iter().map(|e| 1 + e.value.weight).sum::<usize>(),
            value: Value::Map(entries),
        }
    }

    /// The entries a `<<` value brings: a mapping's, or those of a list of
    /// mappings, earlier ones first; a key already merged stays.
    fn merge(&mut self, value: &Node, merged: &mut Vec<Entry>) {
        let maps: Vec<&Node> = match &value.value {
            Value::Seq(items) => items.iter().collect(),
            _ => vec![value],
        };
        let mut seen: HashSet<String> = merged.iter().map(|e| e.key.clone()).collect();
        for map in maps {
            match &map.value {
                Value::Map(entries) => {
                    for entry in entries {
                        if seen.insert(entry.key.clone()) {
                            merged.push(entry.clone());
                        }
                    }
                }
                _ => self.problems.push(Problem {
                    line: map.line,
                    message: format!(
                        "`<<` merges mappings (or a list of them), not {}",
                        map.kind()
                    ),
                }),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(node: &Node) -> &[Entry] {
        match &node.value {
            Value::Map(entries) => entries,
            other => panic!("not a mapping: {other:?}"),
        }
    }

    fn scalar(node: &Node) -> (&str, bool) {
        match &node.value {
            Value::Scalar { text, plain } => (text, *plain),
            other => panic!("not a scalar: {other:?}"),
        }
    }

    #[test]
    fn nodes_know_their_lines_and_scalars_their_text_and_style() {
        let root = parse("# c\ndomain: d\nlist:\n  - a: 010\n    b: 'yes'\n  - ~\n")
            .unwrap()
            .root
            .unwrap();
        let entries = map(&root);
        assert_eq!((entries[0].key.as_str(), entries[0].line), ("domain", 2));
        assert_eq!(scalar(&entries[0].value), ("d", true));
        let Value::Seq(items) = &entries[1].value.value else {
            panic!("a list")
        };
        assert_eq!(items[0].line, 4);
        let inner = map(&items[0]);
        assert_eq!(scalar(&inner[0].value), ("010", true));
        assert_eq!(
            (scalar(&inner[1].value), inner[1].line),
            (("yes", false), 5)
        );
        assert!(matches!(items[1].value, Value::Null));
    }

    #[test]
    fn nothing_null_and_empty_are_null_but_quoted_empty_is_text() {
        let root = parse("a:\nb: null\nc: \"\"\nd: NULL\n")
            .unwrap()
            .root
            .unwrap();
        let entries = map(&root);
        assert!(matches!(entries[0].value.value, Value::Null));
        assert!(matches!(entries[1].value.value, Value::Null));
        assert_eq!(scalar(&entries[2].value), ("", false));
        assert!(matches!(entries[3].value.value, Value::Null));
    }

    #[test]
    fn aliases_expand_and_merge_keys_sit_below_written_keys() {
        let text =
            "base: &b {x: 1, y: 2}\nm:\n  <<: *b\n  y: 3\nn:\n  <<: [{z: 1}, {z: 2, w: 4}]\n";
        let root = parse(text).unwrap().root.unwrap();
        let entries = map(&root);
        let m = map(&entries[1].value);
        let keys: Vec<(&str, &str)> = m
            .iter()
            .map(|e| (e.key.as_str(), scalar(&e.value).0))
            .collect();
        assert_eq!(keys, [("y", "3"), ("x", "1")]);
        // The merged entry keeps the line it was written on.
        assert_eq!(m[1].line, 1);
        let n = map(&entries[2].value);
        let keys: Vec<(&str, &str)> = n
            .iter()
            .map(|e| (e.key.as_str(), scalar(&e.value).0))
            .collect();
        assert_eq!(keys, [("z", "1"), ("w", "4")]);
    }

    #[test]
    fn duplicate_keys_are_all_reported_and_the_first_kept() {
        let document = parse("a: 1\nb: 2\na: 3\nb: 4\n").unwrap();
        let problems = &document.problems;
        let lines: Vec<usize> = problems.iter().map(|p| p.line).collect();
        assert_eq!(lines, [3, 4]);
        assert!(
            problems[0].message.contains("first at line 1"),
            "{problems:?}"
        );
        let entries = map(document.root.as_ref().unwrap());
        assert_eq!(entries.len(), 2);
        assert_eq!(scalar(&entries[0].value).0, "1");
    }

    #[test]
    fn syntax_errors_name_their_line() {
        let problem = parse("a: [b\nc: d\n").unwrap_err();
        assert_eq!(problem.line, 2);
        assert!(problem.message.starts_with("YAML syntax: "), "{problem:?}");
        assert_eq!(parse("'''\n").unwrap_err().line, 1);
    }

    #[test]
    fn empty_streams_have_no_document_and_a_second_document_is_refused() {
        assert!(parse("").unwrap().root.is_none());
        assert!(parse("# only a comment\n").unwrap().root.is_none());
        let document = parse("a: b\n---\nc: d\n").unwrap();
        assert_eq!(document.problems[0].line, 2);
        assert!(
            document.problems[0]
                .message
                .contains("second YAML document")
        );
        assert!(document.root.is_some());
    }

    #[test]
    fn alias_bombs_and_deep_nesting_are_errors_not_exhaustion() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..9 {
            let p = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
            ));
        }
        let problem = parse(&text).unwrap_err();
        assert!(problem.message.contains("YAML nodes"), "{problem:?}");
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let problem = parse(&deep).unwrap_err();
        assert!(problem.message.contains("levels deep"), "{problem:?}");
    }

    #[test]
    fn complex_keys_are_refused() {
        let problems = parse("? [a, b]\n: c\n").unwrap().problems;
        assert_eq!(problems[0].line, 1);
        assert!(problems[0].message.contains("not a list"), "{problems:?}");
    }
}
