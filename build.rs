//! Finds the external programs that some integration tests talk to
//! (`redis-server` and `redis-cli`, `curl`, `nginx`, `chromium`) and sets
//! one cfg for each that is installed: `has_redis`, `has_curl`,
//! `has_nginx`, `has_chromium`; and
//! `has_openai` where a Python interpreter (`TOLLGATE_TEST_PYTHON`, else
//! `python3`) can `import openai`, the official SDK `tests/openai_sdk.rs`
//! drives, passing the interpreter to the tests as `TOLLGATE_TEST_PYTHON`.
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
    ("has_chromium", &["chromium"], "apt-get install -y chromium"),
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
    watch_dirs |= !openai_sdk(require);
    if watch_dirs {
        // Installing a missing program later changes its directory: the
        // next build finds it without a `cargo clean`.
        for dir in &dirs {
            println!("cargo::rerun-if-changed={}", dir.display());
        }
    }
}

/// How the `openai` package is installed where `has_openai` is missing.
const OPENAI_INSTALL: &str = "python3 -m venv DIR && DIR/bin/pip install openai, \
     then TOLLGATE_TEST_PYTHON=DIR/bin/python";

/// Prints where `openai` is (exit 0), else where it would be installed.
const OPENAI_PROBE: &str = r"
import site, sys
try:
    import openai
except ImportError:
    print(*site.getsitepackages(), site.getusersitepackages(), sep='\n')
    sys.exit(3)
print(openai.__file__)
";

/// Sets `has_openai` when the tests' interpreter imports `openai` (or
/// `require`), and names that interpreter to them; whether it was found.
fn openai_sdk(require: bool) -> bool {
    println!("cargo::rerun-if-env-changed=TOLLGATE_TEST_PYTHON");
    println!("cargo::rustc-check-cfg=cfg(has_openai)");
    // Set by `cargo fuzz`: llm::event_stream shrinks a bound for it.
    println!("cargo::rustc-check-cfg=cfg(fuzzing)");
    let python = std::env::var("TOLLGATE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    println!("cargo::rustc-env=TOLLGATE_TEST_PYTHON={python}");
    let answer = std::process::Command::new(&python)
        .args(["-c", OPENAI_PROBE])
        .stderr(std::process::Stdio::null())
        .output();
    let (found, watched) = match &answer {
        Ok(output) => (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        ),
        Err(_) => (false, String::new()),
    };
    // Where the package is, or would be installed: a `pip install` or
    // uninstall there runs this again.
    for path in watched.lines().filter(|path| Path::new(path).exists()) {
        println!("cargo::rerun-if-changed={path}");
    }
    if found || require {
        println!("cargo::rustc-cfg=has_openai");
    }
    if !found {
        let verdict = if require {
            "run and fail (TOLLGATE_TEST_REQUIRE_SERVERS=1)"
        } else {
            "are ignored"
        };
        println!(
            "cargo::warning={python} cannot import openai: the tests that need it {verdict}; install: {OPENAI_INSTALL}"
        );
    }
    found
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
