//! A real `redis-server` for a test: started on a free 127.0.0.1 port,
//! driven with `redis-cli`, stopped by PID when dropped. A machine without
//! `redis-server` fails the test with the command that installs it.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str = "apt-get update && apt-get install -y redis-server redis-tools";

pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    paused: bool,
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

impl Redis {
    pub fn start() -> Redis {
        Redis::on_port(free_port())
    }

    pub fn on_port(port: u16) -> Redis {
        let mut redis = Redis {
            child: None,
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            paused: false,
        };
        redis.restart();
        redis
    }

    /// Starts the server (again) on its port, empty.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-server ({e}); install it: {INSTALL}"));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.try_cli(&["PING"]).as_deref() != Some("PONG") {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn try_cli(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); install it: {INSTALL}"));
        let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        (output.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }

    /// `redis-cli ARGS`, its output trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|| panic!("redis-cli {args:?} failed"))
    }

    /// Every key, by SCAN.
    pub fn keys(&self) -> Vec<String> {
        let out = self.cli(&["--scan"]);
        out.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Kills the server (SIGKILL, by PID) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.paused {
                self.signal(child.id(), "CONT");
                self.paused = false;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: it keeps accepting connections (the kernel does) and never
    /// answers.
    pub fn pause(&mut self) {
        let pid = self.child.as_ref().expect("running").id();
        self.signal(pid, "STOP");
        self.paused = true;
    }

    pub fn resume(&mut self) {
        let pid = self.child.as_ref().expect("running").id();
        self.signal(pid, "CONT");
        self.paused = false;
    }

    fn signal(&self, pid: u32, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
