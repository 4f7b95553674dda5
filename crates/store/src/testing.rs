//! Test support shared by this crate's tests and the end-to-end suites: a private
//! `redis-server` per test, and a temporary folder. Not used by keypool itself.
//!
//! ```no_run
//! use keypool_store::testing::RedisServer;
//! let Some(redis) = RedisServer::start_or_skip("my_test") else { return };
//! println!("{}", redis.url());
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A `redis-server` on a free loopback port, started for one test and killed when
/// dropped. It keeps nothing on disk (`--save '' --appendonly no`).
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: TempDir,
}

impl RedisServer {
    /// Starts a server, or returns `None` (after saying so on stderr) when `redis-server`
    /// is not installed. Under `CI=true` a missing `redis-server` panics: CI must run
    /// these tests, never skip them.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        match Self::start() {
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

    /// Starts a server on a free port.
    pub fn start() -> Result<Self, String> {
        let port = free_port().map_err(|e| format!("no free port: {e}"))?;
        let dir = TempDir::new("redis")?;
        let child = spawn(port, dir.path())?;
        let mut server = Self {
            child: Some(child),
            port,
            dir,
        };
        server.wait_ready()?;
        Ok(server)
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (as a crash would: no shutdown, nothing saved).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a fresh, empty server on the same port after [`RedisServer::kill`].
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.child = Some(spawn(self.port, self.dir.path())?);
        self.wait_ready()
    }

    /// Sends one inline command and returns the raw reply (for assertions).
    pub fn command(&self, line: &str) -> Result<String, String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        s.write_all(format!("{line}\r\n").as_bytes())
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 65536];
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
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

fn spawn(port: u16, dir: &Path) -> Result<Child, String> {
    Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run redis-server: {e}"))
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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
