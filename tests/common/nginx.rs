//! A real `nginx` for a test: one process (`master_process off`, so one
//! PID to stop) on a free 127.0.0.1 port, its config, pid file, logs and
//! temporary files in a tempdir of its own, so that it runs as any user
//! and touches nothing of the machine's nginx; stopped by PID when
//! dropped. A machine without `nginx` fails the test with the command that
//! installs it.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::eventually_blocking;
use super::redis::free_port;

const INSTALL: &str = "apt-get update && apt-get install -y nginx";

pub struct Nginx {
    child: Option<Child>,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Nginx {
    /// Starts nginx with `http` as the body of its `http` block, `{listen}`
    /// in it replaced by the address it listens on; returns once that
    /// address accepts connections.
    pub fn start(http: &str) -> Nginx {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let conf = dir.path().join("nginx.conf");
        std::fs::write(
            &conf,
            main_conf(dir.path(), &http.replace("{listen}", &addr.to_string())),
        )
        .expect("write nginx.conf");
        // `-e`: the log of the start itself, before the config names one
        // (else the compiled-in /var/log/nginx/error.log).
        let child = Command::new("nginx")
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run nginx ({e}); install it: {INSTALL}"));
        let mut nginx = Nginx {
            child: Some(child),
            addr,
            dir,
        };
        let up = eventually_blocking(Duration::from_secs(10), || {
            let exited = nginx
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!("nginx exited ({status}): {}", nginx.error_log());
            }
            std::net::TcpStream::connect(addr).is_ok()
        });
        assert!(up, "nginx did not listen on {addr}: {}", nginx.error_log());
        nginx
    }

    /// What nginx wrote to its error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// Kills nginx (SIGKILL, by PID) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The whole `nginx.conf`: one process in the foreground, every file it
/// writes under `dir`, and `http` as the `http` block.
fn main_conf(dir: &Path, http: &str) -> String {
    let dir = dir.display();
    format!(
        "daemon off;\n\
         master_process off;\n\
         worker_processes 1;\n\
         pid {dir}/nginx.pid;\n\
         error_log {dir}/error.log info;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
         access_log {dir}/access.log;\n\
         client_body_temp_path {dir}/client_body;\n\
         proxy_temp_path {dir}/proxy;\n\
         fastcgi_temp_path {dir}/fastcgi;\n\
         uwsgi_temp_path {dir}/uwsgi;\n\
         scgi_temp_path {dir}/scgi;\n\
         {http}\n\
         }}\n"
    )
}
