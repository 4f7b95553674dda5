//! Test support shared by this crate's tests and the end-to-end suites: a private
//! `redis-server` per test, a fake Redis that misbehaves on demand ([`FakeRedis`]), and
//! a temporary folder. Not used by keypool itself.
//!
//! ```no_run
//! use keypool_store::testing::RedisServer;
//! let Some(redis) = RedisServer::start_or_skip("my_test") else { return };
//! println!("{}", redis.url());
//! ```

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

mod topologies;

pub use topologies::{RedisCluster, RedisSentinel};

/// A `redis-server` on a free loopback port, started for one test and killed when
/// dropped. It keeps nothing on disk (`--save '' --appendonly no`), unless started
/// [`RedisServer::durable`].
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
    durable: bool,
}

impl RedisServer {
    /// Starts a server, or returns `None` (after saying so on stderr) when `redis-server`
    /// is not installed. Under `CI=true` a missing `redis-server` panics: CI must run
    /// these tests, never skip them.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        skip_unless_ci(test, "redis-server", Self::start())
    }

    /// Starts a server on a free port.
    pub fn start() -> Result<Self, String> {
        Self::start_as(false)
    }

    /// Like [`RedisServer::start_or_skip`], for a server that writes every change to its
    /// append-only file before answering (`--appendonly yes --appendfsync always`): a
    /// [`RedisServer::kill`] and [`RedisServer::restart`] keep everything it
    /// acknowledged, as a production Redis with persistence does.
    pub fn durable(test: &str) -> Option<Self> {
        match Self::start_as(true) {
            Ok(s) => Some(s),
            Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
                panic!("{test}: cannot start redis-server under CI=true: {e}")
            }
            Err(e) => {
                eprintln!("{test}: SKIPPED, cannot start redis-server: {e}");
                None
            }
        }
    }

    fn start_as(durable: bool) -> Result<Self, String> {
        let free = || free_port().map_err(|e| format!("no free port: {e}"));
        Self::start_on(free, durable)
    }

    /// Starts a server on a port from `port`, trying the next one when it cannot start.
    fn start_on(port: impl FnMut() -> Result<u16, String>, durable: bool) -> Result<Self, String> {
        on_a_free_port(port, |port| {
            let dir = TempDir::new("redis")?;
            let child = spawn(port, dir.path(), durable)?;
            let mut server = Self {
                child: Some(child),
                port,
                dir,
                durable,
            };
            server.wait_ready()?;
            Ok(server)
        })
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Suspends the server (`kill -STOP`): connections stay open, nothing is answered,
    /// as with a hung host. [`RedisServer::resume`] lets it go on.
    pub fn pause(&self) -> Result<(), String> {
        self.signal("STOP")
    }

    /// Resumes a server suspended by [`RedisServer::pause`] (`kill -CONT`); it answers
    /// what it was sent meanwhile.
    pub fn resume(&self) -> Result<(), String> {
        self.signal("CONT")
    }

    fn signal(&self, name: &str) -> Result<(), String> {
        let child = self.child.as_ref().ok_or("redis-server is not running")?;
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(child.id().to_string())
            .status()
            .map_err(|e| format!("cannot run kill -{name}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("kill -{name} {} failed ({status})", child.id()))
        }
    }

    /// Kills the server (as a crash would: no shutdown, nothing saved).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port after [`RedisServer::kill`]: empty, or,
    /// [`RedisServer::durable`], with everything it had acknowledged.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.child = Some(spawn(self.port, self.dir.path(), self.durable)?);
        self.wait_ready()
    }

    /// How many times the server ran the command `name` (lower case) since it started,
    /// from `INFO commandstats`.
    pub fn calls(&self, name: &str) -> Result<u64, String> {
        let stats = self.command("INFO commandstats")?;
        let prefix = format!("cmdstat_{name}:calls=");
        Ok(stats
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0))
    }

    /// Sends one inline command and returns the raw reply (for assertions).
    pub fn command(&self, line: &str) -> Result<String, String> {
        inline_command(self.port, line)
    }

    /// Sends one command as a RESP array (arguments may hold spaces and newlines) and
    /// returns the raw reply.
    pub fn command_args(&self, args: &[&str]) -> Result<String, String> {
        let mut line = format!("*{}\r\n", args.len());
        for a in args {
            line.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        // inline_command appends one more CRLF: an empty inline command, ignored
        inline_command(self.port, line.trim_end_matches("\r\n"))
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        // bounded: a fresh redis-server answers within milliseconds
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.command("PING").is_ok_and(|r| r.starts_with("+PONG")) {
                return Ok(());
            }
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("redis-server exited at start ({status})"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("redis-server did not answer PING within 5 s".into())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The options of every test `redis-server`: `port` on loopback, nothing on disk.
fn server_args(port: u16) -> [String; 8] {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .map(str::to_owned)
}

/// Starts a `redis-server` on `port`; `durable` keeps an append-only file (fsync'd on
/// every write) in `dir`, so a restart keeps what it acknowledged.
fn spawn(port: u16, dir: &Path, durable: bool) -> Result<Child, String> {
    let mut args = server_args(port);
    let fsync: &[&str] = if durable {
        args[7] = "yes".to_owned();
        &["--appendfsync", "always"]
    } else {
        &[]
    };
    Command::new("redis-server")
        .args(args)
        .args(fsync)
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run redis-server: {e}"))
}

/// The commands keypool's request path sends to Redis: the rotation counter (`INCR`),
/// session bindings (`GET`, `SET`), concurrency leases (`EVAL`, `ZREM`).
pub const REQUEST_PATH_COMMANDS: [&str; 5] = ["INCR", "GET", "SET", "EVAL", "ZREM"];

/// A Redis a test makes misbehave, then recover: a real server suspended with
/// `SIGSTOP` ([`RedisServer::pause`]), or a [`FakeRedis`] that answers normally until it
/// turns to another [`FakeReply`].
#[derive(Debug)]
pub enum FaultyRedis {
    /// A real server; the fault is `SIGSTOP`, the recovery `SIGCONT`.
    Stopped(RedisServer),
    /// A fake answering normally; the fault is the reply kind given.
    Fake(FakeRedis, FakeReply),
}

impl FaultyRedis {
    /// A real server (`fault = None`; `None` back when redis-server is missing outside
    /// CI, see [`RedisServer::start_or_skip`]) or a fake that will turn to `fault`.
    ///
    /// # Panics
    /// When the fake cannot start.
    pub fn start_or_skip(fault: Option<FakeReply>, test: &str) -> Option<Self> {
        Some(match fault {
            None => Self::Stopped(RedisServer::start_or_skip(test)?),
            Some(reply) => match FakeRedis::start(FakeReply::Normal) {
                Ok(fake) => Self::Fake(fake, reply),
                Err(e) => panic!("{test}: the fake Redis does not start: {e}"),
            },
        })
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        match self {
            Self::Stopped(r) => r.url(),
            Self::Fake(f, _) => f.url(),
        }
    }

    /// Starts misbehaving.
    ///
    /// # Panics
    /// When `kill -STOP` fails.
    pub fn break_it(&self) {
        match self {
            Self::Stopped(r) => r.pause().unwrap_or_else(|e| panic!("{e}")),
            Self::Fake(f, reply) => f.set_mode(*reply),
        }
    }

    /// Behaves again (a fake answers what it held meanwhile, as a resumed server does).
    ///
    /// # Panics
    /// When `kill -CONT` fails.
    pub fn restore(&self) {
        match self {
            Self::Stopped(r) => r.resume().unwrap_or_else(|e| panic!("{e}")),
            Self::Fake(f, _) => f.set_mode(FakeReply::Normal),
        }
    }

    /// How many commands named `name` (upper case) it received so far; `None` while a
    /// real server is stopped (it cannot say).
    pub fn received(&self, name: &str) -> Option<u64> {
        match self {
            Self::Stopped(r) => r.calls(&name.to_ascii_lowercase()).ok(),
            Self::Fake(f, _) => Some(f.count(name) as u64),
        }
    }

    /// Concurrency leases of `account` held in it now (a fake grants every `EVAL`, so:
    /// `EVAL`s not yet followed by a `ZREM`); `None` while a real server is stopped.
    pub fn leases_held(&self, account: &str) -> Option<u64> {
        match self {
            Self::Stopped(r) => r
                .command(&format!("ZCARD keypool:leases:{account}"))
                .ok()?
                .trim_start_matches(':')
                .trim()
                .parse()
                .ok(),
            Self::Fake(f, _) => Some(f.count("EVAL").saturating_sub(f.count("ZREM")) as u64),
        }
    }

    /// How many [`REQUEST_PATH_COMMANDS`] it received so far (see
    /// [`FaultyRedis::received`]).
    pub fn request_path_commands(&self) -> Option<u64> {
        REQUEST_PATH_COMMANDS.iter().map(|c| self.received(c)).sum()
    }
}

/// What a [`FakeRedis`] answers to each command it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeReply {
    /// Well-formed answers to what keypool sends (connection set-up, `SUBSCRIBE`, `INCR`
    /// with a real count per key, empty `SCAN`/`HGETALL`, `GET` of nothing, `EVAL` taking
    /// a lease, `+OK` or `:0` to the rest): enough to connect, reconcile and serve.
    Normal,
    /// The given number of nested one-element arrays (`*1\r\n` each) around `:1`.
    Nested(usize),
    /// Nothing (a hung server): commands are read and held; once the mode changes they
    /// are answered in order under the new mode, as a server resumed after `SIGSTOP`.
    Silent,
    /// Bytes that are no RESP at all.
    Garbage,
    /// `-ERR …` to everything.
    Error,
}

/// A fake Redis on `127.0.0.1`: a plain TCP server answering RESP commands according
/// to its current [`FakeReply`] (switchable at any time), recording every command it
/// read. Stops (closing every connection) when dropped.
#[derive(Debug)]
pub struct FakeRedis {
    addr: SocketAddr,
    shared: Arc<FakeShared>,
}

#[derive(Debug)]
struct FakeShared {
    mode: Mutex<FakeReply>,
    commands: Mutex<Vec<Vec<String>>>,
    counters: Mutex<HashMap<String, i64>>,
    connections: Mutex<Vec<TcpStream>>,
    stop: AtomicBool,
}

impl FakeShared {
    fn mode(&self) -> FakeReply {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FakeRedis {
    /// Starts answering with `mode` on a free loopback port.
    pub fn start(mode: FakeReply) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let shared = Arc::new(FakeShared {
            mode: Mutex::new(mode),
            commands: Mutex::new(Vec::new()),
            counters: Mutex::new(HashMap::new()),
            connections: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let accepting = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if accepting.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                if let Ok(copy) = stream.try_clone() {
                    accepting
                        .connections
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(copy);
                }
                let shared = accepting.clone();
                std::thread::spawn(move || fake_connection(stream, shared));
            }
        });
        Ok(Self { addr, shared })
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Answers every command read from now on with `mode`.
    pub fn set_mode(&self, mode: FakeReply) {
        *self
            .shared
            .mode
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = mode;
    }

    /// Every command read so far (name in upper case, then the arguments), in order.
    pub fn commands(&self) -> Vec<Vec<String>> {
        self.shared
            .commands
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many commands named `name` (upper case) were read so far.
    pub fn count(&self, name: &str) -> usize {
        self.shared
            .commands
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|c| c.first().is_some_and(|n| n == name))
            .count()
    }
}

impl Drop for FakeRedis {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // wakes the accept loop so that it sees the flag
        let _ = TcpStream::connect(self.addr);
        for c in self
            .shared
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// Reads and records commands from one connection as they come; answers each, in
/// order, under the mode of the moment (holding them while it is silent).
fn fake_connection(stream: TcpStream, shared: Arc<FakeShared>) {
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    let (tx, rx) = std::sync::mpsc::channel::<Vec<String>>();
    let answering = shared.clone();
    std::thread::spawn(move || {
        for command in rx {
            let mode = loop {
                if answering.stop.load(Ordering::SeqCst) {
                    return;
                }
                match answering.mode() {
                    FakeReply::Silent => std::thread::sleep(Duration::from_millis(5)),
                    mode => break mode,
                }
            };
            if out
                .write_all(&fake_reply(mode, &command, &answering))
                .is_err()
            {
                return;
            }
        }
    });
    let mut input = BufReader::new(stream);
    while let Some(command) = read_command(&mut input) {
        shared
            .commands
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(command.clone());
        if tx.send(command).is_err() {
            return;
        }
    }
}

/// One RESP command (an array of bulk strings); `None` at the end of the stream or on
/// anything else.
fn read_command(input: &mut impl BufRead) -> Option<Vec<String>> {
    let mut line = String::new();
    let header = |input: &mut dyn BufRead, line: &mut String, kind: char| -> Option<usize> {
        line.clear();
        input.read_line(line).ok()?;
        line.trim_end().strip_prefix(kind)?.parse().ok()
    };
    let n = header(input, &mut line, '*')?;
    let mut command = Vec::with_capacity(n);
    for _ in 0..n {
        let len = header(input, &mut line, '$')?;
        let mut arg = vec![0; len + 2];
        input.read_exact(&mut arg).ok()?;
        arg.truncate(len);
        command.push(String::from_utf8_lossy(&arg).into_owned());
    }
    if let Some(name) = command.first_mut() {
        *name = name.to_ascii_uppercase();
    }
    Some(command)
}

fn fake_reply(mode: FakeReply, command: &[String], shared: &FakeShared) -> Vec<u8> {
    match mode {
        FakeReply::Normal | FakeReply::Silent => normal_reply(command, shared),
        FakeReply::Nested(levels) => {
            let mut reply = b"*1\r\n".repeat(levels);
            reply.extend_from_slice(b":1\r\n");
            reply
        }
        FakeReply::Garbage => b"\x00\x17\xffthis is no RESP\r\n".to_vec(),
        FakeReply::Error => b"-ERR fake redis refuses everything\r\n".to_vec(),
    }
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

fn normal_reply(command: &[String], shared: &FakeShared) -> Vec<u8> {
    let name = command.first().map_or("", String::as_str);
    let reply = match name {
        "PING" => "+PONG\r\n".to_owned(),
        "CLIENT" => ":1\r\n".to_owned(),
        "INFO" => bulk("# Server\r\nredis_version:7.0.0\r\n"),
        "SUBSCRIBE" => command[1..]
            .iter()
            .enumerate()
            .map(|(i, ch)| format!("*3\r\n{}{}:{}\r\n", bulk("subscribe"), bulk(ch), i + 1))
            .collect(),
        "INCR" => {
            let key = command.get(1).cloned().unwrap_or_default();
            let mut counters = shared
                .counters
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let n = counters.entry(key).or_default();
            *n += 1;
            format!(":{n}\r\n")
        }
        "GET" => "$-1\r\n".to_owned(),
        // no key exists: one null per key
        "MGET" => format!(
            "*{}\r\n{}",
            command.len() - 1,
            "$-1\r\n".repeat(command.len() - 1)
        ),
        "SCAN" => format!("*2\r\n{}*0\r\n", bulk("0")),
        "HGETALL" | "LRANGE" => "*0\r\n".to_owned(),
        // the usage flush's list of recent records: its length after the push
        "LPUSH" | "RPUSH" => ":1\r\n".to_owned(),
        "HMGET" => format!(
            "*{}\r\n{}",
            command.len().saturating_sub(2),
            "$-1\r\n".repeat(command.len().saturating_sub(2))
        ),
        "EVAL" => ":1\r\n".to_owned(),
        "HSET" | "HDEL" | "DEL" | "PUBLISH" | "ZREM" | "ZADD" => ":0\r\n".to_owned(),
        _ => "+OK\r\n".to_owned(),
    };
    reply.into_bytes()
}

/// `started`, or `None` after saying on stderr why `test` is skipped; under `CI=true`
/// a panic instead: CI must run every test that needs `what`, never skip it.
fn skip_unless_ci<T>(test: &str, what: &str, started: Result<T, String>) -> Option<T> {
    match started {
        Ok(s) => Some(s),
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: cannot start {what} under CI=true: {e}")
        }
        Err(e) => {
            eprintln!("{test}: SKIPPED, cannot start {what}: {e}");
            None
        }
    }
}

/// Sends one inline command to the Redis on `127.0.0.1:port`; the raw reply (one
/// read, at most 64 KiB, within 2 s).
fn inline_command(port: u16, line: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("{line}\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 65536];
    let n = s.read(&mut buf).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Starts a server with `start` on a port from `port`, again on another port (at most
/// five tries) when it fails to start: between finding a free port and the server
/// binding it, a test running in parallel may take it (a listener, or the local end of
/// an outgoing connection).
fn on_a_free_port<T>(
    mut port: impl FnMut() -> Result<u16, String>,
    mut start: impl FnMut(u16) -> Result<T, String>,
) -> Result<T, String> {
    let mut last = String::new();
    for _ in 0..5 {
        match start(port()?) {
            Ok(server) => return Ok(server),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A folder under the system temp dir, removed when dropped.
#[derive(Debug)]
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates a new empty folder whose name contains `label`.
    pub fn new(label: &str) -> Result<Self, String> {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "keypool-{label}-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            crate::now_ms()
        ));
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(Self(path))
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port taken between the free-port probe and the server's bind (by a listener
    /// here; in a parallel test run, by anything) costs a retry on another port, not
    /// the test.
    #[test]
    fn a_server_whose_port_was_taken_starts_on_another() {
        let taken = TcpListener::bind("127.0.0.1:0").expect("a listener");
        let taken_port = taken.local_addr().expect("its address").port();
        let mut ports = vec![taken_port];
        let next = || match ports.pop() {
            Some(port) => Ok(port),
            None => free_port().map_err(|e| e.to_string()),
        };
        let Some(server) =
            skip_unless_ci("retry", "redis-server", RedisServer::start_on(next, false))
        else {
            return;
        };
        assert_ne!(server.port(), taken_port);
        assert!(
            server
                .command("PING")
                .expect("an answer")
                .starts_with("+PONG")
        );
    }
}
