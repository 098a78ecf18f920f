//! The command line: `check` exit codes and summaries, and config errors that
//! name the file, line, column, key and the nearest valid name.

mod common;

use common::tollgate;

fn write(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path.to_string_lossy().into_owned())
}

#[test]
fn check_accepts_the_repository_config() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/gateway.toml");
    let (code, stdout, stderr) = tollgate(&["check", "-c", path]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("listeners: http://127.0.0.1:8080"),
        "{stdout}"
    );
    assert!(stdout.contains("routes:"), "{stdout}");
}

#[test]
fn check_rejects_a_misspelt_key_with_a_suggestion() {
    let (_dir, path) = write("[server]\nlisten = \"127.0.0.1:0\"\nshutdown_timout = \"5s\"\n");
    let (code, stdout, stderr) = tollgate(&["check", "-c", &path]);
    assert_eq!(code, 1);
    assert!(stdout.is_empty());
    assert!(stderr.contains("gateway.toml:3:1"), "{stderr}");
    assert!(stderr.contains("server.shutdown_timout"), "{stderr}");
    assert!(
        stderr.contains("did you mean `shutdown_timeout`?"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn check_reports_every_problem_with_its_line() {
    let text = r#"
[upstreams.api]
url = "ftp://nowhere"

[[routes]]
name = "a"
match = { path = "/a" }
upstream = "ap"

[[routes]]
name = "a"
match = { path = "/b" }
upstream = "api"
cost = 0
"#;
    let (_dir, path) = write(text);
    let (code, _, stderr) = tollgate(&["check", "-c", &path]);
    assert_eq!(code, 1);
    assert!(stderr.contains(":3:1: `upstreams.api.url`"), "{stderr}");
    assert!(
        stderr.contains(":8:1: `routes[0].upstream`: unknown upstream `ap`"),
        "{stderr}"
    );
    assert!(stderr.contains("did you mean `api`?"), "{stderr}");
    assert!(
        stderr.contains(":11:1: `routes[1].name`: duplicate route name"),
        "{stderr}"
    );
    assert!(stderr.contains(":14:1: `routes[1].cost`"), "{stderr}");
}

#[test]
fn run_refuses_an_invalid_config() {
    let (_dir, path) = write("[server]\nworkers = -1\n");
    let (code, _, stderr) = tollgate(&["run", "-c", &path]);
    assert_eq!(code, 1);
    assert!(stderr.contains("gateway.toml:2:"), "{stderr}");
}

#[test]
fn missing_file_is_a_clear_error() {
    let (code, _, stderr) = tollgate(&["check", "-c", "/nonexistent/gateway.toml"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("/nonexistent/gateway.toml"), "{stderr}");
    assert!(stderr.contains("cannot read"), "{stderr}");
}

#[test]
fn version_and_help() {
    let (code, stdout, _) = tollgate(&["--version"]);
    assert_eq!(code, 0);
    assert!(stdout.starts_with("tollgate "));
    let (code, stdout, _) = tollgate(&["--help"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("check"));
}
