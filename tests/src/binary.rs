//! The real `keypool` binary as a child process, for the suites that test what only
//! the binary does (signals, `--version`, the log format, the process environment):
//! [`keypool_binary`] builds it once per test process, [`KeypoolProcess`] runs it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The `keypool` binary, built once (`cargo build -p keypool --bin keypool`).
///
/// # Panics
/// When the build fails.
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

/// A free port on `127.0.0.1` (bound, then released).
///
/// # Panics
/// When no port can be bound.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// A running `keypool serve`; killed when dropped.
#[derive(Debug)]
pub struct KeypoolProcess {
    /// The child process.
    pub child: Child,
    stderr: PathBuf,
}

impl KeypoolProcess {
    /// Starts `keypool [global…] serve --config <config>` with `env` (and none of
    /// keypool's own override variables from the test's environment), its stderr in a
    /// file next to the config; waits (at most 20 s) until `port` accepts connections.
    ///
    /// # Panics
    /// When it does not start or listen.
    pub async fn start(config: &Path, port: u16, global: &[&str], env: &[(&str, &str)]) -> Self {
        let stderr = config.with_extension("stderr");
        let mut command = Command::new(keypool_binary());
        command
            .args(global)
            .args(["serve", "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("the stderr file"));
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
        let child = command.spawn().expect("keypool starts");
        let k = Self { child, stderr };
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "keypool did not listen within 20 s: {}",
                k.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        k
    }

    /// What it wrote on stderr so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Sends `signal` (`HUP`, `TERM`, …) with `kill`.
    ///
    /// # Panics
    /// When `kill` fails.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{signal}");
    }

    /// Waits (at most `within`) for the process to exit: its exit code.
    ///
    /// # Panics
    /// When it is still running after `within`.
    pub async fn wait_exit(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "keypool still running after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for KeypoolProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.stderr);
    }
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
