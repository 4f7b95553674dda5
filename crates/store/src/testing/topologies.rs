//! Redis topologies beyond one server, started per test on free loopback ports and
//! stopped when dropped: a three-node [`RedisCluster`] (`redis-server
//! --cluster-enabled yes`, joined by `redis-cli --cluster create`) and a
//! [`RedisSentinel`] (a primary and one sentinel monitoring it). Nothing is kept on
//! disk beyond the test's temporary folder. Under `CI=true` a missing `redis-server`
//! or `redis-cli` fails the test instead of skipping it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{TempDir, inline_command, on_a_free_port, skip_unless_ci};

/// How long a topology may take to come up (a fresh cluster agrees within a second or
/// two; a sentinel sees its primary at once).
const START_WITHIN: Duration = Duration::from_secs(30);

/// A running `redis-server` child, killed when dropped.
#[derive(Debug)]
struct Node {
    child: Child,
    port: u16,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `redis-server` with `args` (after the port, bind and no-persistence
/// options) in `dir`, and waits until it answers `PING`.
fn node(port: u16, dir: &Path, args: &[&str]) -> Result<Node, String> {
    // a config file (a sentinel's) must come first
    let (config, rest) = match args.split_first() {
        Some((config, rest)) if config.ends_with(".conf") => (Some(*config), rest),
        _ => (None, args),
    };
    let mut command = Command::new("redis-server");
    command
        .args(config)
        .args(super::server_args(port))
        .args(rest)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let child = command
        .spawn()
        .map_err(|e| format!("cannot run redis-server: {e}"))?;
    let mut node = Node { child, port };
    until(&format!("redis on {port} answers PING"), || {
        if let Ok(Some(status)) = node.child.try_wait() {
            return Err(format!("redis-server on {port} exited at start ({status})"));
        }
        Ok(inline_command(port, "PING").is_ok_and(|r| r.starts_with("+PONG")))
    })?;
    Ok(node)
}

/// Polls `ready` every 50 ms until it holds, within [`START_WITHIN`].
fn until(what: &str, mut ready: impl FnMut() -> Result<bool, String>) -> Result<(), String> {
    let deadline = Instant::now() + START_WITHIN;
    while Instant::now() < deadline {
        if ready()? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("{what}: not within {START_WITHIN:?}"))
}

/// A port whose cluster bus port (port + 10000) is free too.
fn free_cluster_port() -> Result<u16, String> {
    for _ in 0..100 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    Err("no free port pair for a cluster node".into())
}

/// A three-node Redis Cluster on loopback (three primaries, no replicas), every slot
/// assigned.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    _dir: TempDir,
}

impl RedisCluster {
    /// Starts a cluster, or `None` (said on stderr) when `redis-server` or `redis-cli`
    /// cannot run; under `CI=true` that panics.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        skip_unless_ci(
            test,
            "a Redis cluster (redis-server, redis-cli)",
            Self::start(),
        )
    }

    /// Starts three `--cluster-enabled` nodes, joins them with `redis-cli --cluster
    /// create` and waits until each reports `cluster_state:ok`.
    pub fn start() -> Result<Self, String> {
        let dir = TempDir::new("redis-cluster")?;
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(on_a_free_port(free_cluster_port, |port| {
                let conf = format!("nodes-{port}.conf");
                node(
                    port,
                    dir.path(),
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        &conf,
                        "--cluster-node-timeout",
                        "5000",
                    ],
                )
            })?);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run redis-cli: {e}"))?;
        if !created.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&created.stdout)
            ));
        }
        let cluster = Self { nodes, _dir: dir };
        until("the cluster agrees", || {
            Ok(cluster.nodes.iter().all(|n| {
                inline_command(n.port, "CLUSTER INFO").is_ok_and(|i| i.contains("cluster_state:ok"))
            }))
        })?;
        Ok(cluster)
    }

    /// `redis-cluster://127.0.0.1:<first>?node=…&node=…`.
    pub fn url(&self) -> String {
        let others: Vec<String> = self.nodes[1..]
            .iter()
            .map(|n| format!("node=127.0.0.1:{}", n.port))
            .collect();
        format!(
            "redis-cluster://127.0.0.1:{}?{}",
            self.nodes[0].port,
            others.join("&")
        )
    }

    /// `127.0.0.1:<port>` of each node.
    pub fn addresses(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect()
    }

    /// Sends one inline command to the node that owns `key`'s slot (following one
    /// `MOVED`); the raw reply.
    pub fn command_for_key(&self, key: &str, line: &str) -> Result<String, String> {
        let reply = inline_command(self.nodes[0].port, line)?;
        match reply.strip_prefix("-MOVED ") {
            Some(moved) => {
                let target = moved
                    .split_whitespace()
                    .nth(1)
                    .ok_or("a MOVED without address")?;
                let port: u16 = target
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("MOVED to {target} for {key}"))?;
                inline_command(port, line)
            }
            None => Ok(reply),
        }
    }

    /// How many keys each node holds (`DBSIZE`).
    pub fn keys_per_node(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| {
                inline_command(n.port, "DBSIZE")
                    .ok()
                    .and_then(|r| r.trim().trim_start_matches(':').parse().ok())
                    .unwrap_or(0)
            })
            .collect()
    }
}

/// A Redis primary and one sentinel monitoring it as `mymaster` (quorum 1).
#[derive(Debug)]
pub struct RedisSentinel {
    sentinel: Node,
    primary: Node,
    _dir: TempDir,
}

impl RedisSentinel {
    /// The name the sentinel monitors the primary as.
    pub const SERVICE: &'static str = "mymaster";

    /// Starts a primary and a sentinel, or `None` (said on stderr) when
    /// `redis-server` cannot run; under `CI=true` that panics.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        skip_unless_ci(
            test,
            "a Redis primary and sentinel (redis-server --sentinel)",
            Self::start(),
        )
    }

    /// Starts the primary, then a sentinel whose config file (the sentinel rewrites
    /// it) names it, and waits until the sentinel reports the primary's address.
    pub fn start() -> Result<Self, String> {
        let dir = TempDir::new("redis-sentinel")?;
        let free = || super::free_port().map_err(|e| e.to_string());
        let primary = on_a_free_port(free, |port| node(port, dir.path(), &[]))?;
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "sentinel monitor {} 127.0.0.1 {} 1\nsentinel down-after-milliseconds {} 5000\n",
                Self::SERVICE,
                primary.port,
                Self::SERVICE
            ),
        )
        .map_err(|e| format!("cannot write {}: {e}", conf.display()))?;
        let conf = conf.display().to_string();
        let sentinel = on_a_free_port(free, |port| node(port, dir.path(), &[&conf, "--sentinel"]))?;
        let primary_port = primary.port.to_string();
        until("the sentinel knows the primary", || {
            Ok(inline_command(
                sentinel.port,
                &format!("SENTINEL get-master-addr-by-name {}", Self::SERVICE),
            )
            .is_ok_and(|r| r.contains(&primary_port)))
        })?;
        Ok(Self {
            sentinel,
            primary,
            _dir: dir,
        })
    }

    /// `redis-sentinel://127.0.0.1:<sentinel>/0?sentinelServiceName=mymaster`.
    pub fn url(&self) -> String {
        format!(
            "redis-sentinel://127.0.0.1:{}/0?sentinelServiceName={}",
            self.sentinel.port,
            Self::SERVICE
        )
    }

    /// `127.0.0.1:<port>` of the sentinel and of the primary.
    pub fn addresses(&self) -> (String, String) {
        (
            format!("127.0.0.1:{}", self.sentinel.port),
            format!("127.0.0.1:{}", self.primary.port),
        )
    }

    /// Sends one inline command to the primary; the raw reply.
    pub fn primary_command(&self, line: &str) -> Result<String, String> {
        inline_command(self.primary.port, line)
    }
}
