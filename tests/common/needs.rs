//! Whether the programs some tests talk to are installed, decided when the
//! test runs: `redis-server` and `redis-cli`, `curl`, `nginx`, and a Python
//! interpreter that imports the `openai` SDK, the `cloudevents` SDK or
//! OpenTelemetry's protobuf messages (`opentelemetry-proto`).
//!
//! A test that needs one starts with `if skip(REDIS) { return; }`. Where the
//! program is missing it passes at once, after writing `skipped <test>:
//! needs …: <install command>` to the terminal (past the harness's capture,
//! which would hide a passing test's output); under
//! `TOLLGATE_TEST_REQUIRE_SERVERS=1` (`.ci/run` sets it after installing
//! them) it fails instead, with the same install command, so CI never skips
//! one.
//!
//! Deciding here rather than in `build.rs` keeps `PATH` out of the
//! library's and binary's build fingerprints: a cfg set by the build script
//! applies to every target of the package, so looking at `PATH` there made
//! any change to it (an `apt-get install`, a new venv) rebuild the release
//! binary. Each test binary looks again when it runs, so installing a
//! program later needs no rebuild at all.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// What a test needs: the programs that must be on `PATH` and how to
/// install them on Debian.
pub struct Needs {
    what: &'static str,
    programs: &'static [&'static str],
    /// A Python module the interpreter of [`python`] must import.
    module: Option<&'static str>,
    install: &'static str,
}

pub const REDIS: Needs = Needs {
    what: "redis-server and redis-cli",
    programs: &["redis-server", "redis-cli"],
    module: None,
    install: "apt-get install -y redis-server redis-tools",
};

pub const CURL: Needs = Needs {
    what: "curl",
    programs: &["curl"],
    module: None,
    install: "apt-get install -y curl",
};

pub const NGINX: Needs = Needs {
    what: "nginx",
    programs: &["nginx"],
    module: None,
    install: "apt-get install -y nginx",
};

pub const CHROMIUM: Needs = Needs {
    what: "chromium",
    programs: &["chromium"],
    module: None,
    install: "apt-get install -y chromium",
};

/// The `openai` SDK, imported by [`python`]; no program of its own.
pub const OPENAI: Needs = Needs {
    what: "the openai Python package",
    programs: &[],
    module: Some("openai"),
    install: "python3 -m venv DIR && DIR/bin/pip install openai, \
              then TOLLGATE_TEST_PYTHON=DIR/bin/python",
};

/// The `cloudevents` SDK, imported by [`python`]; no program of its own.
pub const CLOUDEVENTS: Needs = Needs {
    what: "the cloudevents Python package",
    programs: &[],
    module: Some("cloudevents.core.formats.json"),
    install: "python3 -m venv DIR && DIR/bin/pip install cloudevents, \
              then TOLLGATE_TEST_PYTHON=DIR/bin/python",
};

/// OpenTelemetry's protobuf messages for Python, imported by [`python`]
/// (tests/traces.rs decodes the gateway's exports with them too).
pub const OTEL_PROTO: Needs = Needs {
    what: "the opentelemetry-proto Python package",
    programs: &[],
    module: Some("opentelemetry.proto.collector.trace.v1.trace_service_pb2"),
    install: "python3 -m venv DIR && DIR/bin/pip install opentelemetry-proto, \
              then TOLLGATE_TEST_PYTHON=DIR/bin/python",
};

/// Whether the test should return now because `needs` is missing (and not
/// required); panics with the install command where it is missing and
/// `TOLLGATE_TEST_REQUIRE_SERVERS=1`.
pub fn skip(needs: Needs) -> bool {
    if installed(&needs) {
        return false;
    }
    let message = format!("needs {}: {}", needs.what, needs.install);
    if std::env::var_os("TOLLGATE_TEST_REQUIRE_SERVERS").is_some_and(|v| v == "1") {
        panic!("{message} (TOLLGATE_TEST_REQUIRE_SERVERS=1 requires it)");
    }
    // Straight to the terminal: `eprintln!` would be captured, and the
    // harness shows a passing test's output to nobody.
    let thread = std::thread::current();
    let test = thread
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("a test");
    let _ = writeln!(std::io::stderr(), "skipped {test}: {message}");
    true
}

/// The interpreter the Python tests run: `TOLLGATE_TEST_PYTHON`, else
/// `python3`.
pub fn python() -> String {
    std::env::var("TOLLGATE_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn installed(needs: &Needs) -> bool {
    if let Some(module) = needs.module {
        static FOUND: OnceLock<std::sync::Mutex<Vec<(&str, bool)>>> = OnceLock::new();
        let found = FOUND.get_or_init(Default::default);
        let mut found = found.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, imported)) = found.iter().find(|(m, _)| *m == module) {
            return *imported;
        }
        let imported = imports(module);
        found.push((module, imported));
        return imported;
    }
    needs.programs.iter().all(|program| on_path(program))
}

fn imports(module: &str) -> bool {
    Command::new(python())
        .args(["-c", &format!("import {module}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Whether an executable `program` is in a directory of `PATH`.
fn on_path(program: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir: PathBuf| dir.join(program))
        .any(|candidate| is_executable(&candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}
