//! Finds the external programs that some integration tests talk to
//! (`redis-server` and `redis-cli`, `curl`, `nginx`) and sets one cfg for
//! each that is installed: `has_redis`, `has_curl`, `has_nginx`.
//!
//! A test that needs one is marked
//! `#[cfg_attr(not(has_redis), ignore = "needs … : apt-get install …")]`,
//! so on a machine with only the Rust toolchain `cargo test` passes and
//! its summary counts that test as ignored, with the reason and the install
//! command beside its name. `TOLLGATE_TEST_REQUIRE_SERVERS=1` (`.ci/run`
//! sets it after installing them) sets every cfg whatever is installed:
//! each such test then runs, and fails with the install command when its
//! program is missing, so CI never skips one.
//!
//! The production code reads none of these cfgs.
//!
//! It also generates the Rust code of Envoy's rate-limit service protos
//! (`proto/`) that `src/envoy_proto.rs` includes: `build/protos.rs`.

use std::path::{Path, PathBuf};

#[path = "build/protos.rs"]
mod protos;

/// A cfg, the programs it needs, and how to install them on Debian.
const SERVERS: &[(&str, &[&str], &str)] = &[
    (
        "has_redis",
        &["redis-server", "redis-cli"],
        "apt-get install -y redis-server redis-tools",
    ),
    ("has_curl", &["curl"], "apt-get install -y curl"),
    ("has_nginx", &["nginx"], "apt-get install -y nginx"),
];

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=build/protos.rs");
    if let Err(error) = protos::generate() {
        eprintln!("generating the code of proto/: {error}");
        std::process::exit(1);
    }
    println!("cargo::rerun-if-env-changed=PATH");
    println!("cargo::rerun-if-env-changed=TOLLGATE_TEST_REQUIRE_SERVERS");
    let require = std::env::var_os("TOLLGATE_TEST_REQUIRE_SERVERS").is_some_and(|v| v == "1");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute() && dir.is_dir())
        .collect();
    let mut watch_dirs = false;
    for (cfg, programs, install) in SERVERS {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        let missing: Vec<&str> = programs
            .iter()
            .copied()
            .filter(|program| match find(&dirs, program) {
                Some(found) => {
                    // A reinstalled or removed program runs this again.
                    println!("cargo::rerun-if-changed={}", found.display());
                    false
                }
                None => true,
            })
            .collect();
        if missing.is_empty() || require {
            println!("cargo::rustc-cfg={cfg}");
        }
        if !missing.is_empty() {
            watch_dirs = true;
            let verdict = if require {
                "run and fail (TOLLGATE_TEST_REQUIRE_SERVERS=1)"
            } else {
                "are ignored"
            };
            println!(
                "cargo::warning={} not found: the tests that need it {verdict}; install: {install}",
                missing.join(" and ")
            );
        }
    }
    if watch_dirs {
        // Installing a missing program later changes its directory: the
        // next build finds it without a `cargo clean`.
        for dir in &dirs {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
    }
}

/// `program`'s path in the first directory of `PATH` that has it.
fn find(dirs: &[PathBuf], program: &str) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}
