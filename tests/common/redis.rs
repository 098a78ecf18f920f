//! A real `redis-server` for a test: started on a free 127.0.0.1 port,
//! driven with `redis-cli`, stopped by PID when dropped. A machine without
//! `redis-server` fails the test with the command that installs it.
//! [`Options`] start it TLS-only, with a password or as a replica;
//! [`Sentinel`] is a `redis-server --sentinel` watching one master.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::eventually_blocking;

const INSTALL: &str = "apt-get update && apt-get install -y redis-server redis-tools";

pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    paused: bool,
    /// More `redis-server` arguments (cluster mode).
    extra: Vec<String>,
    options: Options,
}

/// How a test's `redis-server` is started, beyond the defaults.
#[derive(Default, Clone)]
pub struct Options {
    /// TLS only: the port is `--tls-port` and plain TCP is off.
    pub tls: Option<TlsFiles>,
    /// `requirepass` of the default user (redis-cli logs in with it).
    pub requirepass: Option<String>,
    /// `--replicaof 127.0.0.1 PORT`.
    pub replica_of: Option<u16>,
}

/// The server's certificate and key, and the CA that redis-cli trusts.
#[derive(Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// A port nobody listens on right now, for a server that must be given
/// its port. Taken below the kernel's ephemeral range
/// (`ip_local_port_range`, 32,768–60,999 by default) when there is room:
/// a port from that range can be taken, between this check and the
/// server's bind, by another test's socket bound to port 0 or by an
/// outgoing connection's local end (seen in CI: nginx "Address already in
/// use" on a port this returned). Successive calls walk the range from a
/// start of this process's own, so two calls never return one port.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOWEST: u32 = 10_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let below = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&low| low > LOWEST + 1_000 && low <= 65_536);
    if let Some(low) = below {
        let span = low - LOWEST;
        if NEXT.load(Ordering::Relaxed) == u32::MAX {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            let _ = NEXT.compare_exchange(
                u32::MAX,
                (std::process::id() ^ nanos) % span,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        for _ in 0..span {
            let port = LOWEST + NEXT.fetch_add(1, Ordering::Relaxed) % span;
            let port = u16::try_from(port).expect("below 65,536");
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A free port for a Cluster node: its cluster bus listens 10,000 above
/// it, so the port must be at most 55,535 (redis-server refuses to start
/// otherwise) and the bus port free as well. (Where [`free_port`] falls
/// back to the kernel's ephemeral range, 32,768–60,999 by default, that
/// reaches past 55,535.)
pub fn free_cluster_port() -> u16 {
    for _ in 0..1000 {
        let port = free_port();
        if port <= 55_535 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port with a free cluster bus port 10,000 above it");
}

impl Redis {
    pub fn start() -> Redis {
        Redis::on_port(free_port())
    }

    pub fn on_port(port: u16) -> Redis {
        Redis::with_args(port, &[])
    }

    pub fn with_args(port: u16, extra: &[&str]) -> Redis {
        Redis::new(port, extra, Options::default())
    }

    /// A server on a free port started with `options`.
    pub fn with_options(options: Options) -> Redis {
        Redis::new(free_port(), &[], options)
    }

    fn new(port: u16, extra: &[&str], options: Options) -> Redis {
        let mut redis = Redis {
            child: None,
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            paused: false,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            options,
        };
        redis.restart();
        redis
    }

    /// The `redis-server` arguments that `options` add.
    fn option_args(&self) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        let port = self.port.to_string();
        match &self.options.tls {
            None => args.extend(["--port".to_owned(), port]),
            Some(tls) => {
                args.extend(["--port", "0", "--tls-port", &port].map(String::from));
                for (flag, file) in [
                    ("--tls-cert-file", &tls.cert),
                    ("--tls-key-file", &tls.key),
                    ("--tls-ca-cert-file", &tls.ca),
                ] {
                    args.push(flag.to_owned());
                    args.push(file.display().to_string());
                }
                args.extend(
                    ["--tls-auth-clients", "no", "--tls-replication", "yes"].map(String::from),
                );
            }
        }
        if let Some(password) = &self.options.requirepass {
            // A replica logs in to its master with the same password.
            args.extend(["--requirepass", password, "--masterauth", password].map(String::from));
        }
        if let Some(master) = self.options.replica_of {
            args.extend(["--replicaof", "127.0.0.1", &master.to_string()].map(String::from));
        }
        args
    }

    /// Starts the server (again) on its port, empty.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(self.option_args())
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-server ({e}); install it: {INSTALL}"));
        self.child = Some(child);
        let pong = || self.try_cli(&["PING"]).as_deref() == Some("PONG");
        assert!(
            eventually_blocking(Duration::from_secs(10), pong),
            "redis-server did not start"
        );
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A `[store]` section on this server with key `prefix`, for a test's
    /// config (more `[store]` keys may follow it).
    pub fn store_toml(&self, prefix: &str) -> String {
        format!(
            "[store]\nbackend = \"redis\"\nurl = \"{}\"\nprefix = \"{prefix}\"\n",
            self.url()
        )
    }

    pub fn try_cli(&self, args: &[&str]) -> Option<String> {
        let mut login: Vec<String> = Vec::new();
        if let Some(tls) = &self.options.tls {
            login.extend(["--tls".to_owned(), "--cacert".to_owned()]);
            login.push(tls.ca.display().to_string());
        }
        if let Some(password) = &self.options.requirepass {
            login.extend(["-a", password, "--no-auth-warning"].map(String::from));
        }
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(login)
            .args(if self.extra.is_empty() {
                &[][..]
            } else {
                &["-c"][..]
            })
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

    /// The count of a fixed window key (`window count`), if it answers.
    pub fn try_count(&self, key: &str) -> Option<u64> {
        self.try_cli(&["GET", key])?.split(' ').nth(1)?.parse().ok()
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

/// A sentinel (`redis-server sentinel.conf --sentinel`) on a port of its
/// own, monitoring one master as `name` with a quorum of 1 and short
/// timeouts (down after 500 ms, failover within 5 s).
pub struct Sentinel {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    master: u16,
    name: String,
    /// The sentinel's own `requirepass`.
    requirepass: Option<String>,
}

/// The passwords a [`Sentinel`] uses and asks for.
#[derive(Default, Clone, Copy)]
pub struct SentinelAuth<'a> {
    /// The master's (and its replicas') `requirepass`: `sentinel auth-pass`.
    pub master: Option<&'a str>,
    /// The sentinel's own `requirepass`.
    pub own: Option<&'a str>,
}

impl Sentinel {
    /// Starts on `port` (picked beforehand with [`free_port`], so a config
    /// can name it before it runs), watching `127.0.0.1:master`.
    pub fn start(port: u16, name: &str, master: u16, auth: SentinelAuth<'_>) -> Sentinel {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut conf = format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\n\
             sentinel monitor {name} 127.0.0.1 {master} 1\n\
             sentinel down-after-milliseconds {name} 500\n\
             sentinel failover-timeout {name} 5000\n\
             sentinel parallel-syncs {name} 1\n",
            dir = dir.path().display(),
        );
        if let Some(password) = auth.master {
            conf.push_str(&format!("sentinel auth-pass {name} {password}\n"));
        }
        if let Some(password) = auth.own {
            conf.push_str(&format!("requirepass {password}\n"));
        }
        // Sentinel rewrites its file: it must be writable.
        let file = dir.path().join("sentinel.conf");
        std::fs::write(&file, conf).expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&file)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-server ({e}); install it: {INSTALL}"));
        let sentinel = Sentinel {
            child: Some(child),
            port,
            dir,
            master,
            name: name.to_owned(),
            requirepass: auth.own.map(str::to_owned),
        };
        assert!(
            eventually_blocking(Duration::from_secs(10), || sentinel.master_port().is_some()),
            "the sentinel did not start"
        );
        sentinel
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `redis-cli ARGS` to the sentinel, its output trimmed.
    pub fn try_cli(&self, args: &[&str]) -> Option<String> {
        let login: Vec<&str> = match &self.requirepass {
            Some(password) => vec!["-a", password, "--no-auth-warning"],
            None => Vec::new(),
        };
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(login)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); install it: {INSTALL}"));
        let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        (output.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }

    /// The master's port as the sentinel names it now.
    pub fn master_port(&self) -> Option<u16> {
        let answer = self.try_cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name])?;
        answer.lines().nth(1)?.trim().parse().ok()
    }

    /// Waits until the sentinel knows `replicas` replicas of the master
    /// (it finds them in the master's `INFO`), so that it can fail over.
    pub fn wait_replicas(&self, replicas: usize) {
        let found = || {
            self.try_cli(&["SENTINEL", "MASTER", &self.name])
                .and_then(|info| {
                    let lines: Vec<&str> = info.lines().collect();
                    let at = lines.iter().position(|l| *l == "num-slaves")?;
                    lines.get(at + 1)?.parse::<usize>().ok()
                })
                .is_some_and(|n| n >= replicas)
        };
        assert!(
            eventually_blocking(Duration::from_secs(30), found),
            "the sentinel did not find {replicas} replicas of port {}",
            self.master
        );
    }

    /// Kills the sentinel (SIGKILL, by PID) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster of `masters` primaries with `replicas` each, on free
/// ports, made with `redis-cli --cluster create`.
pub struct Cluster {
    pub nodes: Vec<Redis>,
}

impl Cluster {
    pub fn start(masters: usize, replicas: usize) -> Cluster {
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1000",
        ];
        let nodes: Vec<Redis> = (0..masters * (1 + replicas))
            .map(|_| Redis::with_args(free_cluster_port(), &args))
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); install it: {INSTALL}"));
        assert!(
            output.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = Cluster { nodes };
        cluster.wait_ok();
        cluster
    }

    /// Waits until every live node says `cluster_state:ok` and every
    /// replica is in sync with its primary (else it cannot take over).
    pub fn wait_ok(&self) {
        let ok = || {
            self.nodes.iter().filter(|n| n.child.is_some()).all(|n| {
                let state = n
                    .try_cli(&["CLUSTER", "INFO"])
                    .is_some_and(|info| info.contains("cluster_state:ok"));
                let synced = n.try_cli(&["INFO", "replication"]).is_some_and(|info| {
                    !info.contains("role:slave") || info.contains("master_link_status:up")
                });
                state && synced
            })
        };
        assert!(
            eventually_blocking(Duration::from_secs(20), ok),
            "the cluster did not become ok"
        );
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Redis::url).collect()
    }

    /// The nodes' URLs as the items of a TOML array (`"redis://…", …`),
    /// for a `[store]` section's `url = [...]`.
    pub fn toml_urls(&self) -> String {
        let quoted: Vec<String> = self.urls().iter().map(|u| format!("\"{u}\"")).collect();
        quoted.join(", ")
    }

    /// Every key on every live node (replicas repeat their primary's).
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .flat_map(Redis::keys)
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// A live node, to ask with `redis-cli -c`.
    pub fn any(&self) -> &Redis {
        self.nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a live node")
    }

    /// The node serving `key` as primary now.
    pub fn primary_of(&mut self, key: &str) -> &mut Redis {
        let slot = self.nodes[0].cli(&["CLUSTER", "KEYSLOT", key]);
        let slot: u32 = slot.parse().expect("slot");
        let nodes = self.nodes[0].cli(&["CLUSTER", "NODES"]);
        let port = nodes
            .lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .find(|l| {
                l.split(' ').skip(8).any(|range| {
                    let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                    matches!((lo.parse::<u32>(), hi.parse::<u32>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
                })
            })
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|addr| addr.split('@').next())
            .and_then(|addr| addr.rsplit(':').next())
            .and_then(|p| p.parse::<u16>().ok())
            .expect("a primary for the slot");
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("node")
    }
}
