//! A real browser for the status-page suites: Debian's `chromium` (headless, for
//! `--dump-dom` and screenshots) and [`WebDriver`], a session of Debian's
//! `chromedriver` that clicks and types into the page as a person does (W3C WebDriver
//! over HTTP, spoken with the suites' own [`Client`]).
//!
//! Both programs are installed with `apt-get` when missing (CI runs as root); under
//! `CI=true` a missing one is a failure, never a skip (`cargo xtask ci` installs them).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http::Method;
use serde_json::{Value, json};

use crate::Client;

/// How long a [`WebDriver`] wait lasts before the test fails.
pub const WAIT: Duration = Duration::from_secs(15);

/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn on_path(names: &[&str]) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// The first of `names` on `PATH`, Debian's `package` installed with apt when none is.
///
/// # Panics
/// When none is there under `CI=true`, or it cannot be installed.
fn debian_program(names: &[&str], package: &str) -> PathBuf {
    if let Some(path) = on_path(names) {
        return path;
    }
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!(
            "the status-page tests need {} and CI=true: `cargo xtask ci` installs it \
             (apt-get install -y {package}); it is missing",
            names[0]
        );
    }
    // Two tests may get here at once: one installs, the other waits and finds it.
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(path) = on_path(names) {
        return path;
    }
    eprintln!(
        "status page test: {} not found; trying `apt-get install -y {package}`",
        names[0]
    );
    let installed = Command::new("apt-get")
        .args(["install", "-y", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    match on_path(names) {
        Some(path) if installed => path,
        _ => panic!(
            "the status-page tests need {}: install Debian's `{package}` package \
             (apt-get install -y {package}, as root) and run the test again",
            names[0]
        ),
    }
}

/// Debian's `chromium`.
///
/// # Panics
/// See [`debian_program`].
pub fn chromium() -> PathBuf {
    debian_program(
        &["chromium", "chromium-browser", "google-chrome"],
        "chromium",
    )
}

/// Debian's `chromedriver` (package `chromium-driver`).
///
/// # Panics
/// See [`debian_program`].
pub fn chromedriver() -> PathBuf {
    debian_program(&["chromedriver"], "chromium-driver")
}

/// A WebDriver error: its W3C code (`stale element reference`, `no such element`, …)
/// and message.
#[derive(Debug, Clone)]
pub struct DriverError {
    /// The W3C error code.
    pub error: String,
    /// What chromedriver said.
    pub message: String,
}

/// One headless Chromium driven by its own `chromedriver` on a free loopback port.
/// Dropping it ends the session and the `chromedriver` it started.
#[derive(Debug)]
pub struct WebDriver {
    child: Child,
    port: u16,
    session: String,
    client: Client,
}

impl WebDriver {
    /// Starts `chromedriver` and a headless Chromium session (window `1360×1000`).
    ///
    /// # Panics
    /// When either cannot start within [`WAIT`].
    pub async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        let child = Command::new(chromedriver())
            .args([
                format!("--port={port}"),
                "--allowed-ips=127.0.0.1".to_owned(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut driver = Self {
            child,
            port,
            session: String::new(),
            client: Client::new(),
        };
        // Listening is not ready: chromedriver accepts connections before it takes
        // sessions (a `POST /session` then was reset once in CI). Its `GET /status`
        // says `"ready": true` when it does.
        let deadline = Instant::now() + WAIT;
        while !driver.status_ready() {
            assert!(
                Instant::now() < deadline,
                "chromedriver not ready for sessions within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {"goog:chromeOptions": {
            "binary": chromium().display().to_string(),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-extensions", "--no-first-run", "--window-size=1360,1000"],
        }}}});
        let created = driver
            .command(Method::POST, "/session", Some(capabilities))
            .await
            .unwrap_or_else(|e| panic!("no Chromium session: {e:?}"));
        driver.session = created["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        driver
    }

    /// One WebDriver command: `path` is `/session` or relative to the session
    /// (`/url`); the answer's `value`.
    ///
    /// # Errors
    /// The WebDriver error of a refused command.
    pub async fn command(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, DriverError> {
        let url = if path == "/session" {
            format!("http://127.0.0.1:{}/session", self.port)
        } else {
            format!(
                "http://127.0.0.1:{}/session/{}{path}",
                self.port, self.session
            )
        };
        let mut request = self.client.request(method.clone(), url);
        if let Some(body) = body {
            request = request.json(&body);
        } else if method == Method::POST {
            request = request.json(&json!({}));
        }
        let reply = request.send().await;
        let mut value = reply.json()["value"].take();
        if reply.status.is_success() {
            return Ok(value);
        }
        Err(DriverError {
            error: value["error"].as_str().unwrap_or("unknown").to_owned(),
            message: value["message"]
                .take()
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        })
    }

    async fn must(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        self.command(method, path, body)
            .await
            .unwrap_or_else(|e| panic!("WebDriver {path}: {e:?}"))
    }

    /// Opens `url` (and waits for its load).
    pub async fn goto(&self, url: &str) {
        self.must(Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    /// Reloads the page, as a person pressing F5.
    pub async fn reload(&self) {
        self.must(Method::POST, "/refresh", None).await;
    }

    /// The page's DOM as HTML, as it is now.
    pub async fn source(&self) -> String {
        let source = self.must(Method::GET, "/source", None).await;
        source.as_str().unwrap_or_default().to_owned()
    }

    /// The reference of the first element matching `css`.
    ///
    /// # Errors
    /// `no such element` when none matches.
    pub async fn find(&self, css: &str) -> Result<String, DriverError> {
        let found = self
            .command(
                Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await?;
        Ok(found[ELEMENT].as_str().unwrap_or_default().to_owned())
    }

    /// Retries `action` on the element matching `css` until it succeeds: the page
    /// redraws parts of itself every two seconds, so an element may not be there yet
    /// or be replaced between finding and using it.
    async fn on_element(&self, css: &str, what: &str, steps: &[(&str, Option<Value>)]) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let outcome = async {
                let id = self.find(css).await?;
                let mut last = Value::Null;
                for (step, body) in steps {
                    let path = format!("/element/{id}/{step}");
                    let method = if body.is_some() {
                        Method::POST
                    } else {
                        Method::GET
                    };
                    last = self.command(method, &path, body.clone()).await?;
                }
                Ok::<Value, DriverError>(last)
            }
            .await;
            match outcome {
                Ok(value) => return value,
                Err(e) if Instant::now() >= deadline => {
                    panic!("{what} {css}: not within {WAIT:?}: {e:?}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Clicks the element matching `css` (a real click: pointer down and up on it).
    pub async fn click(&self, css: &str) {
        self.on_element(css, "click", &[("click", Some(json!({})))])
            .await;
    }

    /// Empties the field matching `css` and types `text` into it, key by key.
    pub async fn type_into(&self, css: &str, text: &str) {
        let steps = [
            ("clear", Some(json!({}))),
            ("value", Some(json!({"text": text}))),
        ];
        self.on_element(css, "type into", &steps).await;
    }

    /// The visible text of the element matching `css`, once it has some.
    pub async fn text(&self, css: &str) -> String {
        self.wait_text(css, "some text", |t| !t.is_empty()).await
    }

    /// The visible text of the element matching `css` once `ok` holds for it.
    ///
    /// # Panics
    /// When it does not within [`WAIT`].
    pub async fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let text = self.on_element(css, "read", &[("text", None)]).await;
            let text = text.as_str().unwrap_or_default().to_owned();
            if ok(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{css}: not {what} within {WAIT:?}; it says {text:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until an element matches `css`.
    pub async fn wait_for(&self, css: &str) {
        self.on_element(css, "find", &[]).await;
    }
}

impl WebDriver {
    /// One request without a body on a fresh connection, with plain blocking I/O (it
    /// must work in `Drop`, on a panic too): the whole answer, `None` when the
    /// connection failed.
    fn blocking(&self, method: &str, path: &str, timeout: Duration) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(timeout)).ok()?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.port
        )
        .ok()?;
        // chromedriver keeps the connection open despite `Connection: close`: read
        // the head, then `Content-Length` bytes (or to the end when it says none).
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).ok()?;
            answer.extend_from_slice(&chunk[..n]);
            if n == 0 || answer_complete(&answer) {
                return Some(String::from_utf8_lossy(&answer).into_owned());
            }
        }
    }

    /// Whether chromedriver answers `GET /status` with `"ready": true`.
    fn status_ready(&self) -> bool {
        self.blocking("GET", "/status", Duration::from_secs(2))
            .and_then(|answer| {
                // the JSON object, whether the body came whole or in chunks
                let body = answer.split_once("\r\n\r\n")?.1;
                let json = &body[body.find('{')?..=body.rfind('}')?];
                let status: Value = serde_json::from_str(json).ok()?;
                status["value"]["ready"].as_bool()
            })
            .unwrap_or(false)
    }
}

/// Whether `answer` holds a whole HTTP/1.1 answer with a `Content-Length`.
fn answer_complete(answer: &[u8]) -> bool {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&answer[..end]).to_ascii_lowercase();
    head.lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|n| n.trim().parse::<usize>().ok())
        .is_some_and(|length| answer.len() >= end + 4 + length)
}

impl Drop for WebDriver {
    /// Ends the session (Chromium exits) with a plain blocking request, so that it
    /// happens on a panic too, then the `chromedriver` this driver started.
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = self.blocking("DELETE", &path, Duration::from_secs(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs headless Chromium on `url` with `mode` (`--dump-dom` or `--screenshot=…`) and a
/// fresh `profile` folder; returns what it printed (the DOM for `--dump-dom`).
///
/// # Panics
/// When Chromium fails.
pub fn headless(url: &str, mode: &str, profile: &Path) -> String {
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--no-first-run",
            "--no-default-browser-check",
            "--hide-scrollbars",
            "--window-size=1360,560",
            "--virtual-time-budget=4000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(mode)
        .arg(url)
        .output()
        .expect("chromium runs");
    assert!(
        out.status.success(),
        "chromium failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("chromium prints UTF-8")
}

/// The status page's `<tr>` of account `id` in a dumped DOM.
///
/// # Panics
/// When the page has no row for it.
pub fn row<'a>(dom: &'a str, id: &str) -> &'a str {
    let start = dom
        .find(&format!("data-account=\"{id}\""))
        .unwrap_or_else(|| panic!("no row for {id} in the page:\n{dom}"));
    let end = dom[start..].find("</tr>").expect("the row ends") + start;
    &dom[start..end]
}
