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
    // A soft limit below the hard one, whatever the hard one is, so there
    // is always something to raise; below 64 the gateway cannot run at all.
    assert!(
        hard >= 64,
        "the hard open-file limit is {hard}: too low to run the gateway (ulimit -Hn)"
    );
    let soft = hard.saturating_sub(1).min(256);
    let script = format!(
        "ulimit -Sn {soft} && exec '{}' run -c '{}'",
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
    // Read on a thread of its own: a gateway that never says it raised the
    // limit fails the test at the deadline instead of hanging it.
    let stderr = child.stderr.take().unwrap();
    let (lines, seen_lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut seen = String::new();
    let found = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = seen_lines.recv_timeout(left) else {
            break false;
        };
        seen.push_str(&line);
        seen.push('\n');
        if line.contains("raised the open-file limit") {
            break true;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(found, "{seen}");
    assert!(seen.contains(&format!("from={soft}")), "{seen}");
}
