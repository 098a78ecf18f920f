//! Config numbers that would exhaust the machine are refused, and `run`
//! raises the open-file limit to what `max_connections` needs, saying so.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::tollgate;

fn write(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path.to_string_lossy().into_owned())
}

#[test]
fn numbers_that_would_exhaust_the_machine_are_refused() {
    let (_dir, path) = write(
        "[server]\nworkers = 5000\nmax_header_bytes = \"2MiB\"\nmax_connections = 2000000\nmax_key_body = \"1GiB\"\n",
    );
    let (code, _, stderr) = tollgate(&["check", "-c", &path]);
    assert_eq!(code, 1);
    for wanted in [
        ":2:1: `server.workers`: must be at most 1024",
        ":3:1: `server.max_header_bytes`: must be at most 1MiB",
        ":4:1: `server.max_connections`: must be at most 1000000",
        ":5:1: `server.max_key_body`: must be at most 16MiB",
    ] {
        assert!(stderr.contains(wanted), "{wanted}\n{stderr}");
    }
}

#[test]
fn run_raises_the_soft_open_file_limit_and_says_so() {
    let (_dir, path) =
        write("[server]\nlisten = \"127.0.0.1:0\"\nworkers = 1\nmax_connections = 100\n");
    // A soft limit of 256 under whatever hard limit the test runs with.
    let script = format!(
        "ulimit -Sn 256 && exec '{}' run -c '{}'",
        env!("CARGO_BIN_EXE_tollgate"),
        path
    );
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let hard: u64 = String::from_utf8(
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -Hn")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .parse()
    .unwrap_or(u64::MAX);
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = String::new();
    let found = loop {
        let Some(Ok(line)) = lines.next() else {
            break false;
        };
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("raised the open-file limit") {
            break true;
        }
        if line.contains("listening on") && hard <= 256 {
            break true; // Nothing to raise on this machine.
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(found, "{seen}");
    if hard > 256 {
        assert!(seen.contains("from=256"), "{seen}");
    }
}
