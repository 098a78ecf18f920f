//! Generates the Rust code of Envoy's rate-limit service protos (`proto/`)
//! that `src/envoy_proto.rs` includes: `build/protos.rs`.
//!
//! It reads nothing of the machine beyond its own inputs: whether the
//! programs some integration tests talk to (`redis-server`, `curl`,
//! `nginx`, the `openai` SDK) are installed is decided by each test when it
//! runs (`tests/common/needs.rs`). A cfg printed here would apply to the
//! library and the binary as well, so a build script that watched `PATH`
//! rebuilt the release binary whenever `PATH` or a directory on it changed.

#[path = "build/protos.rs"]
mod protos;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=build/protos.rs");
    // Set by `cargo fuzz`: llm::event_stream shrinks a bound for it.
    println!("cargo::rustc-check-cfg=cfg(fuzzing)");
    if let Err(error) = protos::generate() {
        eprintln!("generating the code of proto/: {error}");
        std::process::exit(1);
    }
}
