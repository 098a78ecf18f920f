//! Generates Envoy's rate-limit service (`proto/envoy/service/ratelimit/v3/rls.proto`)
//! into `OUT_DIR`: prost messages, the tonic server and client of
//! `RateLimitService`, and the messages' proto3 JSON serde impls, one
//! `PACKAGE.rs` and one `PACKAGE.serde.rs` per proto package, which
//! `src/envoy_proto.rs` includes.
//!
//! The protos are compiled by protox (pure Rust), so building needs no
//! `protoc`. Of what rls.proto imports, only the messages and enums that its
//! own messages reach are generated (`needed_by`): not the rest of Envoy's
//! core config (generated whole, the files holding what is reached come to
//! 433 KB of code, against 93 KB), nor protoc-gen-validate's rules and the
//! udpa/xds/envoy annotations, imported for their options, which the
//! generated code never reads.

use std::collections::{BTreeSet, HashMap};
use std::error::Error;
use std::path::Path;

use prost_types::{DescriptorProto, FileDescriptorSet};

/// The file everything generated is reached from, under `proto/`.
const ROOT: &str = "envoy/service/ratelimit/v3/rls.proto";

/// Google's well-known types: pbjson-types has them with their proto3 JSON
/// forms ("3s" durations, wrappers unwrapped), and prost must name the same
/// types.
const WELL_KNOWN: (&str, &str) = (".google.protobuf", "::pbjson_types");

/// Writes the generated code into `OUT_DIR`.
pub(crate) fn generate() -> Result<(), Box<dyn Error>> {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").ok_or("CARGO_MANIFEST_DIR is not set")?;
    let proto = Path::new(&manifest).join("proto");
    println!("cargo::rerun-if-changed={}", proto.display());
    // Only this run's output: a package no longer generated must fail its
    // `include!`, not compile from an earlier run's file.
    let out = std::env::var_os("OUT_DIR").ok_or("OUT_DIR is not set")?;
    for entry in std::fs::read_dir(&out)? {
        let path = entry?.path();
        if path.extension().is_some_and(|ext| ext == "rs") {
            std::fs::remove_file(path)?;
        }
    }

    let all = protox::Compiler::new([&proto])?
        .include_imports(true)
        // Source info carries the protos' comments into the generated docs.
        .include_source_info(true)
        .open_file(ROOT)?
        .file_descriptor_set();
    let needed = needed_by(&all, ROOT)?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // The client is generic over any gRPC service; `connect` (tonic's
        // transport `Channel`) would need tonic's transport in the library.
        .build_transport(false)
        // prost's codec with malformed requests answered INVALID_ARGUMENT.
        .codec_path("crate::envoy_proto::RlsCodec")
        // Not prost-types' well-known types (prost's default extern path for
        // them) but pbjson-types': with the extern path below, none is
        // generated.
        .compile_well_known_types(true)
        .extern_path(WELL_KNOWN.0, WELL_KNOWN.1)
        .compile_fds(needed.clone())?;

    let packages: BTreeSet<String> = needed
        .file
        .iter()
        .map(|file| format!(".{}", file.package()))
        .filter(|package| package != WELL_KNOWN.0)
        .collect();
    let mut json = pbjson_build::Builder::new();
    for file in needed.file {
        json.register_file_descriptor(file);
    }
    json.extern_path(WELL_KNOWN.0, WELL_KNOWN.1)
        .build(&packages.into_iter().collect::<Vec<_>>())?;
    Ok(())
}

/// A top-level message or enum of a file, by its index there.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Top {
    Message(usize),
    Enum(usize),
}

/// `set` cut down to what `root` needs: every message, enum and service of
/// `root`, and the top-level messages and enums (nested ones with them)
/// that those reach through the types of their fields and methods, in the
/// files that define them; other files and types are left out. The
/// well-known types' files stay whole: prost reads their messages (whether
/// a message holding one can derive `Eq`) and generates nothing for them
/// (they are extern).
///
/// A file's comments are found by their index among its messages and
/// enums (`source_code_info`), so those are renumbered to match.
fn needed_by(set: &FileDescriptorSet, root: &str) -> Result<FileDescriptorSet, Box<dyn Error>> {
    // Every type's full name (".pkg.Msg.Nested") to the top-level type of
    // the file that holds it.
    let mut defined: HashMap<String, (usize, Top)> = HashMap::new();
    for (at, file) in set.file.iter().enumerate() {
        let prefix = format!(".{}", file.package());
        for (i, message) in file.message_type.iter().enumerate() {
            let mut names = Vec::new();
            message_names(&prefix, message, &mut names);
            defined.extend(names.into_iter().map(|name| (name, (at, Top::Message(i)))));
        }
        for (i, enumeration) in file.enum_type.iter().enumerate() {
            defined.insert(
                format!("{prefix}.{}", enumeration.name()),
                (at, Top::Enum(i)),
            );
        }
    }
    let root_at = set
        .file
        .iter()
        .position(|file| file.name() == root)
        .ok_or_else(|| format!("{root} is not among the compiled protos"))?;
    let root_file = &set.file[root_at];

    let mut pending: Vec<(usize, Top)> = (0..root_file.message_type.len())
        .map(|i| (root_at, Top::Message(i)))
        .chain((0..root_file.enum_type.len()).map(|i| (root_at, Top::Enum(i))))
        .collect();
    let methods = root_file.service.iter().flat_map(|service| &service.method);
    let mut used: Vec<&str> = methods
        .flat_map(|method| [method.input_type(), method.output_type()])
        .collect();
    let mut kept = BTreeSet::new();
    loop {
        for type_name in used.drain(..) {
            let top = defined
                .get(type_name)
                .ok_or_else(|| format!("{type_name} is used but no compiled proto defines it"))?;
            pending.push(*top);
        }
        let Some(top) = pending.pop() else { break };
        if kept.insert(top)
            && let (at, Top::Message(i)) = top
        {
            field_types(&set.file[at].message_type[i], &mut used);
        }
    }

    let mut file = Vec::new();
    for (at, whole) in set.file.iter().enumerate() {
        if !kept.iter().any(|(of, _)| *of == at) && at != root_at {
            continue;
        }
        if format!(".{}", whole.package()) == WELL_KNOWN.0 {
            file.push(whole.clone());
            continue;
        }
        let mut cut = whole.clone();
        // Old index to new, per list (`None`: left out).
        let renumber = |count: usize, top: fn(usize) -> Top| -> Vec<Option<i32>> {
            let mut next = 0;
            (0..count)
                .map(|i| {
                    kept.contains(&(at, top(i))).then(|| {
                        next += 1;
                        next - 1
                    })
                })
                .collect()
        };
        let messages = renumber(whole.message_type.len(), Top::Message);
        let enums = renumber(whole.enum_type.len(), Top::Enum);
        cut.message_type = keep(&whole.message_type, &messages);
        cut.enum_type = keep(&whole.enum_type, &enums);
        if at != root_at {
            cut.service.clear();
        }
        if let Some(info) = &mut cut.source_code_info {
            info.location.retain_mut(|location| {
                // FileDescriptorProto's field numbers: message_type 4,
                // enum_type 5, service 6.
                let table = match location.path.first() {
                    Some(4) => &messages,
                    Some(5) => &enums,
                    Some(6) => return at == root_at,
                    _ => return true,
                };
                let Some(&old) = location.path.get(1) else {
                    return true;
                };
                match usize::try_from(old)
                    .ok()
                    .and_then(|old| table.get(old).copied().flatten())
                {
                    Some(new) => {
                        location.path[1] = new;
                        true
                    }
                    None => false,
                }
            });
        }
        file.push(cut);
    }
    Ok(FileDescriptorSet { file })
}

/// The items of `all` whose new index is `Some`, in order.
fn keep<T: Clone>(all: &[T], new_index: &[Option<i32>]) -> Vec<T> {
    all.iter()
        .zip(new_index)
        .filter(|(_, new)| new.is_some())
        .map(|(item, _)| item.clone())
        .collect()
}

/// The full names of `message` and of the messages and enums nested in it.
fn message_names(prefix: &str, message: &DescriptorProto, out: &mut Vec<String>) {
    let name = format!("{prefix}.{}", message.name());
    for nested in &message.nested_type {
        message_names(&name, nested, out);
    }
    out.extend(
        message
            .enum_type
            .iter()
            .map(|e| format!("{name}.{}", e.name())),
    );
    out.push(name);
}

/// The message and enum types `message`'s fields name, nested messages'
/// included (a map's entry is a nested message).
fn field_types<'a>(message: &'a DescriptorProto, out: &mut Vec<&'a str>) {
    out.extend(
        message
            .field
            .iter()
            .map(|field| field.type_name())
            .filter(|name| !name.is_empty()),
    );
    for nested in &message.nested_type {
        field_types(nested, out);
    }
}
