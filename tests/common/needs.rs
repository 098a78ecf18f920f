//! Whether the programs some tests talk to are installed, decided when the
//! test runs: `redis-server` and `redis-cli`, `curl`, `nginx`, and a Python
//! interpreter that imports the `openai` SDK (or the `cloudevents` SDK).
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
    install: &'static str,
    /// The Python module [`python`] must import (none: "").
    module: &'static str,
}

pub const REDIS: Needs = Needs {
    what: "redis-server and redis-cli",
    programs: &["redis-server", "redis-cli"],
    install: "apt-get install -y redis-server redis-tools",
    module: "",
};

pub const CURL: Needs = Needs {
    what: "curl",
    programs: &["curl"],
    install: "apt-get install -y curl",
    module: "",
};

pub const NGINX: Needs = Needs {
    what: "nginx",
    programs: &["nginx"],
    install: "apt-get install -y nginx",
    module: "",
};

pub const CHROMIUM: Needs = Needs {
    what: "chromium",
    programs: &["chromium"],
    install: "apt-get install -y chromium",
    module: "",
};

/// The `openai` SDK, imported by [`python`]; no program of its own.
pub const OPENAI: Needs = Needs {
    what: "the openai Python package",
    programs: &[],
    install: "python3 -m venv DIR && DIR/bin/pip install openai, \
              then TOLLGATE_TEST_PYTHON=DIR/bin/python",
    module: "openai",
};

/// The `cloudevents` SDK, imported by [`python`]; no program of its own.
pub const CLOUDEVENTS: Needs = Needs {
    what: "the cloudevents Python package",
    programs: &[],
    install: "python3 -m venv DIR && DIR/bin/pip install cloudevents, \
              then TOLLGATE_TEST_PYTHON=DIR/bin/python",
    module: "cloudevents",
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

/// The interpreter the `openai` tests run: `TOLLGATE_TEST_PYTHON`, else
/// `python3`.
pub fn python() -> String {
    std::env::var("TOLLGATE_TEST_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn installed(needs: &Needs) -> bool {
    if !needs.module.is_empty() {
        static OPENAI_FOUND: OnceLock<bool> = OnceLock::new();
        static CLOUDEVENTS_FOUND: OnceLock<bool> = OnceLock::new();
        let found = match needs.module {
            "openai" => &OPENAI_FOUND,
            _ => &CLOUDEVENTS_FOUND,
        };
        return *found.get_or_init(|| imports(needs.module));
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
