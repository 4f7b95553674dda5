//! [`KeypoolProcess`]: the real `keypool` binary as a child process on a free loopback
//! port, for the suites that test what only the process shows (signals, exit codes,
//! restarts, its memory and file descriptors).
//!
//! The binary is built once per test process (`cargo build -p keypool`, a no-op when it
//! is up to date).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use keypool_store::keys::LB_KEY_PREFIX;
use keypool_store::now_ms;

use crate::{Harness, KEY, MODEL, Reply, message_body, secret_of};

/// The `keypool` binary, built once per test process.
pub fn keypool_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = crate::workspace_root();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = Command::new(cargo)
            .current_dir(&root)
            .args(["build", "-p", "keypool", "--bin", "keypool"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cargo build -p keypool failed");
        let target =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
        let bin = target.join("debug").join("keypool");
        assert!(bin.exists(), "{} after the build", bin.display());
        bin
    })
    .clone()
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A fresh temporary folder (see [`temp_dir`]) holding `keypool.toml` = `text`: the
/// folder and the file.
pub fn config_file(name: &str, text: &str) -> (PathBuf, PathBuf) {
    let dir = temp_dir(name);
    let file = dir.join("keypool.toml");
    std::fs::write(&file, text).expect("write the config file");
    (dir, file)
}

/// A fresh temporary folder whose name holds `name`.
pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "keypool-faults-{name}-{}-{}",
        std::process::id(),
        now_ms()
    ));
    std::fs::create_dir_all(&dir).expect("create a temporary folder");
    dir
}

/// `kill -<signal> <pid>` on a child this test started.
pub fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([format!("-{signal}"), child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success(), "kill -{signal}");
}

/// A `keypool serve` child process.
pub struct KeypoolProcess {
    /// The process.
    pub child: Child,
    /// The port it listens on.
    pub port: u16,
    stderr: PathBuf,
}

impl KeypoolProcess {
    /// Starts `keypool serve --config <config>` (which must listen on `port`) with debug
    /// logs on a file, and waits until it accepts connections.
    pub async fn start(config: &Path, port: u16) -> Self {
        let k = Self::spawn(config, port);
        k.wait_listening().await;
        k
    }

    /// Starts `keypool [global…] serve --config <config>` with `env` (and none of
    /// keypool's own override variables or proxy variables from the test's
    /// environment), its stderr in a file next to the config; waits (at most 20 s) until
    /// `port` accepts connections.
    ///
    /// # Panics
    /// When it does not start or listen.
    pub async fn start_with(
        config: &Path,
        port: u16,
        global: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let k = Self::spawn_with(config, port, global, env);
        k.wait_listening().await;
        k
    }

    /// [`KeypoolProcess::start_with`] without waiting for the port.
    ///
    /// # Panics
    /// When it does not start.
    pub fn spawn_with(config: &Path, port: u16, global: &[&str], env: &[(&str, &str)]) -> Self {
        let stderr = config.with_extension(format!("stderr-{}", now_ms()));
        let mut command = Command::new(keypool_binary());
        command
            .args(global)
            .args(["serve", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("create the log file"));
        let own = [
            "KEYPOOL_LISTEN",
            "KEYPOOL_ADMIN_LISTEN",
            "REDIS_URL",
            "KEYPOOL_ADMIN_TOKEN",
        ];
        for name in own.into_iter().chain(keypool_proxy::upstream::PROXY_ENV) {
            command.env_remove(name);
        }
        command.envs(env.iter().copied());
        let child = command.spawn().expect("start keypool");
        Self {
            child,
            port,
            stderr,
        }
    }

    /// [`KeypoolProcess::start`] without waiting for the port
    /// ([`KeypoolProcess::wait_listening`]).
    pub fn spawn(config: &Path, port: u16) -> Self {
        Self::spawn_with(config, port, &[], &[("RUST_LOG", "debug")])
    }

    /// Waits (at most 20 s) until the port accepts connections.
    ///
    /// # Panics
    /// When it does not.
    pub async fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Ok(r)) = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::net::TcpStream::connect(("127.0.0.1", self.port)),
            )
            .await
            {
                drop(r);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "keypool did not listen within 20 s: {}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends `signal` (`HUP`, `TERM`, …) with `kill`.
    pub fn signal(&self, signal_name: &str) {
        signal(&self.child, signal_name);
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Sends one message (streamed or not) to the binary's `acme/team` URL config with
    /// the harness's LB key, and reads the answer to its end.
    pub async fn send_message(&self, h: &Harness, stream: bool) -> Reply {
        h.client()
            .post(self.url("/acme/team/v1/messages"))
            .api_key(&h.key(KEY))
            .json(&message_body(MODEL, stream))
            .send()
            .await
    }

    /// Everything the process logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits (at most `within`) for the process to exit; its exit code.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("the child's status") {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "keypool still running {within:?} after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Asserts that the binary's log holds no account secret, no LB key and none of
    /// `secrets`.
    pub fn assert_logs_clean(&self, h: &Harness, accounts: &[&str], secrets: &[&str]) {
        let logs = self.logs();
        assert!(!logs.is_empty(), "the binary logged nothing");
        for id in accounts {
            assert!(!logs.contains(&secret_of(id)), "secret of {id} in the log");
        }
        assert!(!logs.contains(LB_KEY_PREFIX), "an sk-lb- value in the log");
        let key = h.key(KEY);
        assert!(
            !logs.contains(&key[LB_KEY_PREFIX.len()..]),
            "the LB key in the log"
        );
        for secret in secrets {
            assert!(!logs.contains(secret), "a secret in the log");
        }
    }
}

impl Drop for KeypoolProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // a failing test keeps the process's log to read
        if std::thread::panicking() {
            eprintln!("keypool's log is kept at {}", self.stderr.display());
        } else {
            let _ = std::fs::remove_file(&self.stderr);
        }
    }
}

impl KeypoolProcess {
    /// The process's resident set size now, in KiB (0 when it cannot be read).
    pub fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// How many file descriptors the process has open now.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// Sets the process's open-file limit (soft and hard) to `nofile`, with util-linux's
    /// `prlimit` (always on Debian).
    pub fn set_file_limit(&self, nofile: usize) {
        let status = Command::new("prlimit")
            .arg(format!("--pid={}", self.child.id()))
            .arg(format!("--nofile={nofile}:{nofile}"))
            .status()
            .expect("prlimit runs");
        assert!(status.success(), "prlimit --nofile={nofile}");
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

/// The configuration text of `h` for the binary: listening on `port`, with `[server]`
/// options replaced.
pub fn binary_config(h: &Harness, port: u16, server: &[(&str, &str)]) -> String {
    let mut text = h.toml().replacen(
        "[server]\n",
        &format!("[server]\nlisten = \"127.0.0.1:{port}\"\n"),
        1,
    );
    for (option, value) in server {
        let start = text
            .find(&format!("\n{option} = "))
            .map(|i| i + 1)
            .unwrap_or_else(|| panic!("no {option} in the harness config"));
        let end = start + text[start..].find('\n').unwrap_or(text.len() - start);
        text.replace_range(start..end, &format!("{option} = {value}"));
    }
    text
}

/// Runs `keypool <args>` to its end with `env`: exit code, stdout, stderr.
///
/// # Panics
/// When it cannot run.
pub fn keypool_command(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(keypool_binary())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("keypool runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
