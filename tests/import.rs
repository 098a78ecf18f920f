//! `tollgate import envoy-ratelimit`, through the built binary: the
//! converted files on stdout with exit 0 (no gateway.toml needed), every
//! problem as `file:line: ...` on stderr with exit 1 and nothing on stdout,
//! and the output accepted by `tollgate check` as part of a gateway.toml.

use std::path::Path;
use std::process::Command;

const MONGO: &str = "\
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
";

const INTERNAL: &str = "\
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
      name: azure
    shadow_mode: true
  - key: remote_address
    value: 10.0.0.1
    rate_limit:
      replaces: [{name: azure}]
      unit: hour
      requests_per_unit: 10
";

/// A directory holding `files` (relative paths).
fn directory(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}

/// `tollgate ARGS` run in `dir`: exit code, stdout, stderr.
fn tollgate(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run tollgate");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn converted_files_go_to_stdout_in_argument_order() {
    // No gateway.toml in the directory: import does not read one.
    let dir = directory(&[
        ("config/mongo.yaml", MONGO),
        ("config/internal.yaml", INTERNAL),
    ]);
    let (code, stdout, stderr) = tollgate(
        dir.path(),
        &[
            "import",
            "envoy-ratelimit",
            "config/mongo.yaml",
            "config/internal.yaml",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "");
    let expected = r#"# envoyproxy/ratelimit domain "mongo_cps" (from config/mongo.yaml)
[limits.mongo_cps_database_users]
# envoyproxy/ratelimit counts in fixed windows, kept here so behaviour is unchanged;
# "sliding_window" would not let up to 2x the limit through around a window boundary.
algorithm = "fixed_window"
limit = 500
window = "1s"

[[decision.descriptors]]
domain = "mongo_cps"
match = [{ key = "database", value = "users" }]
limits = ["mongo_cps_database_users"]

# envoyproxy/ratelimit domain "internal" (from config/internal.yaml)
[[decision.descriptors]]
# unlimited: true: matches, never limits
domain = "internal"
match = [{ key = "ldap" }]
limits = []

[limits.azure]
# envoyproxy/ratelimit counts in fixed windows, kept here so behaviour is unchanged;
# "sliding_window" would not let up to 2x the limit through around a window boundary.
algorithm = "fixed_window"
limit = 100
window = "1m"
shadow = true

[[decision.descriptors]]
domain = "internal"
match = [{ key = "azure" }]
limits = ["azure"]

[limits.internal_remote_address_10_0_0_1]
# envoyproxy/ratelimit counts in fixed windows, kept here so behaviour is unchanged;
# "sliding_window" would not let up to 2x the limit through around a window boundary.
algorithm = "fixed_window"
limit = 10
window = "1h"

[[decision.descriptors]]
domain = "internal"
match = [{ key = "remote_address", value = "10.0.0.1" }]
limits = ["internal_remote_address_10_0_0_1"]
replaces = ["azure"]
"#;
    assert_eq!(stdout, expected);
}

#[test]
fn bad_input_is_file_and_line_on_stderr_exit_1_and_nothing_on_stdout() {
    let misspelt = MONGO.replace("rate_limit:", "rate_limitt:");
    let wildcard = "domain: w\ndescriptors:\n  - key: path\n    value: /api/*/users\n";
    let dir = directory(&[
        ("config/mongo.yaml", &misspelt),
        ("config/wild.yaml", wildcard),
    ]);
    let (code, stdout, stderr) = tollgate(
        dir.path(),
        &[
            "import",
            "envoy-ratelimit",
            "config/mongo.yaml",
            "config/wild.yaml",
            "config/missing.yaml",
        ],
    );
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(stdout, "");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines[0].starts_with(
            "config/mongo.yaml:5: unknown field \"rate_limitt\" (expected one of key, value, "
        ),
        "{stderr}"
    );
    assert!(
        lines[0].ends_with("did you mean \"rate_limit\"?"),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with("config/wild.yaml:4: value \"/api/*/users\" cannot be converted"),
        "{stderr}"
    );
    assert!(
        lines[2].starts_with("config/missing.yaml: cannot read: "),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_yaml_syntax_error_names_its_line() {
    let dir = directory(&[("bad.yaml", "domain: x\ndescriptors:\n  - key: [a\n")]);
    let (code, stdout, stderr) = tollgate(dir.path(), &["import", "envoy-ratelimit", "bad.yaml"]);
    assert_eq!(code, 1);
    assert_eq!(stdout, "");
    assert!(stderr.starts_with("bad.yaml:4: YAML syntax: "), "{stderr}");
}

#[test]
fn import_without_files_is_a_usage_error() {
    let dir = directory(&[]);
    let (code, stdout, stderr) = tollgate(dir.path(), &["import", "envoy-ratelimit"]);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stdout, "");
    assert!(stderr.contains("<FILE>..."), "{stderr}");
}

/// The output is meant to be added to a gateway.toml: with the lead's
/// `[decision]` configuration in place, `check` accepts the result.
#[test]
fn imported_config_passes_check() {
    let dir = directory(&[
        ("config/mongo.yaml", MONGO),
        ("config/internal.yaml", INTERNAL),
    ]);
    let (code, imported, stderr) = tollgate(
        dir.path(),
        &[
            "import",
            "envoy-ratelimit",
            "config/mongo.yaml",
            "config/internal.yaml",
        ],
    );
    assert_eq!(code, 0, "{stderr}");
    let gateway = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n\n[decision]\nlisten = \"127.0.0.1:0\"\n\n{imported}"
    );
    std::fs::write(dir.path().join("gateway.toml"), gateway).unwrap();
    let (code, stdout, stderr) = tollgate(dir.path(), &["check", "-c", "gateway.toml"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("gateway.toml: ok"), "{stdout}");
}
