//! Issue 21, the listeners: TLS termination (a test CA made here), HTTP/2 (`h2` by
//! ALPN over TLS, h2c with prior knowledge), the header-read bound on every
//! connection's first bytes, the body limits over HTTP/2, the admin listener, and the
//! certificate reloaded by `SIGHUP` in the real binary. Real clients: `curl --http2`
//! and the official Anthropic Python SDK over TLS.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::body::{Body, Frame};
use hyper_util::rt::{TokioExecutor, TokioIo};
use keypool_proxy::TlsCertificates;
use keypool_sim::Script;
use keypool_store::testing::TempDir;
use keypool_tests::process::{KeypoolProcess, free_port, keypool_command};
use keypool_tests::tls::TestCertificates;
use keypool_tests::{
    AccountSpec, Harness, HarnessBuilder, KEY, MODEL, admin_account, message_body, sdk_python,
    workspace_root,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `header_read_timeout_secs` of these tests: the bound on a silent client.
const HEADER_TIMEOUT_SECS: u64 = 1;

/// How long a test waits for keypool to close a silent connection: far beyond the
/// header read timeout, so that only a missing bound fails it.
const CLOSED_WITHIN: Duration = Duration::from_secs(15);

fn builder() -> HarnessBuilder {
    Harness::builder()
        .account(AccountSpec::new("a", Script::ok()))
        .server("header_read_timeout_secs", &HEADER_TIMEOUT_SECS.to_string())
}

/// A fresh folder with a test CA and a `localhost` leaf.
fn certificates(label: &str) -> (TempDir, TestCertificates) {
    let dir = TempDir::new(label).unwrap();
    let certs = TestCertificates::create(dir.path(), "", "keypool test CA");
    (dir, certs)
}

fn tls_of(certs: &TestCertificates) -> TlsCertificates {
    TlsCertificates::load(&certs.cert, &certs.key).unwrap()
}

/// Reads until keypool closes the connection (end of stream or reset), within
/// [`CLOSED_WITHIN`]; the bytes keypool wrote meanwhile.
async fn closed_by_keypool(
    what: &str,
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
) -> Vec<u8> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + CLOSED_WITHIN;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => panic!("{what}: still open after {CLOSED_WITHIN:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return seen,
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test]
async fn silent_clients_are_disconnected_after_the_header_read_timeout_plain_h2c_and_tls() {
    let plain = builder().start().await;
    let port = plain.addr().port();
    // plain TCP, nothing sent
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    assert_eq!(closed_by_keypool("plain, silent", &mut silent).await, b"");
    // h2c: half of the HTTP/2 preface, then nothing (the protocol is not known yet)
    let mut h2c = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    h2c.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert_eq!(
        closed_by_keypool("h2c, half a preface", &mut h2c).await,
        b""
    );
    // HTTP/1.1: half a request head (hyper's own head timeout; a 408 may be written)
    let mut h1 = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    h1.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let written = closed_by_keypool("http/1.1, half a head", &mut h1).await;
    assert!(
        written.is_empty() || written.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&written)
    );
    // the listener still serves
    assert_eq!(plain.send_message().await.status, 200);
    plain.finish().await;

    let (_dir, certs) = certificates("silent-tls");
    let tls = builder().tls(tls_of(&certs)).start().await;
    let port = tls.addr().port();
    // TCP connected, no ClientHello
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    assert_eq!(
        closed_by_keypool("TLS, no handshake", &mut silent).await,
        b""
    );
    // the handshake done with ALPN h2, then nothing (no HTTP/2 preface)
    let mut h2 = certs.connect(port, &[b"h2"]).await.unwrap();
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    assert_eq!(closed_by_keypool("TLS h2, no preface", &mut h2).await, b"");
    // the same over ALPN http/1.1
    let mut h1 = certs.connect(port, &[b"http/1.1"]).await.unwrap();
    assert_eq!(h1.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(
        closed_by_keypool("TLS http/1.1, nothing", &mut h1).await,
        b""
    );
    tls.finish().await;
}

/// `curl` when it is installed and speaks HTTP/2; under `CI=true` its absence fails
/// the test (`cargo xtask ci` installs Debian's curl), elsewhere it skips with a word.
fn curl(test: &str) -> Option<PathBuf> {
    let features = Command::new("curl").arg("--version").output();
    match features {
        Ok(out) if String::from_utf8_lossy(&out.stdout).contains("HTTP2") => {
            Some(PathBuf::from("curl"))
        }
        _ if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: curl with HTTP/2 is missing under CI=true (cargo xtask ci installs it)")
        }
        _ => {
            eprintln!("{test}: SKIPPED, no curl with HTTP/2 support");
            None
        }
    }
}

/// `curl <args> -w '\n%{http_version} %{http_code}'`: (version, status, body).
fn curl_run(curl: &Path, args: &[&str]) -> (String, u16, String) {
    let out = Command::new(curl)
        .args([
            "-sS",
            "--max-time",
            "30",
            "-w",
            "\n%{http_version} %{http_code}",
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, last) = text.rsplit_once('\n').unwrap_or(("", &text));
    let (version, status) = last.split_once(' ').unwrap_or(("", "0"));
    (
        version.to_owned(),
        status.parse().unwrap_or(0),
        body.to_owned(),
    )
}

/// The `curl` arguments of one Messages request with the harness's key.
fn message_args(h: &Harness, stream: bool) -> Vec<String> {
    vec![
        "-H".into(),
        format!("x-api-key: {}", h.key(KEY)),
        "-H".into(),
        "anthropic-version: 2023-06-01".into(),
        "-H".into(),
        "content-type: application/json".into(),
        "-d".into(),
        message_body(MODEL, stream).to_string(),
        h.messages_url(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_speaks_http2_over_tls_and_h2c_and_http1_still_works() {
    let Some(curl) = curl("curl_speaks_http2_over_tls_and_h2c_and_http1_still_works") else {
        return;
    };
    let (_dir, certs) = certificates("curl-tls");
    let h = builder().tls(tls_of(&certs)).start().await;
    let ca = certs.ca.display().to_string();
    for (flag, version) in [("--http2", "2"), ("--http1.1", "1.1")] {
        let mut args = vec!["--cacert".to_owned(), ca.clone(), flag.to_owned()];
        args.extend(message_args(&h, false));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (got, status, body) = curl_run(&curl, &args);
        assert_eq!((got.as_str(), status), (version, 200), "{flag}: {body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["type"], "message", "{body}");
    }
    // a streamed answer over h2, to its end
    let mut args = vec![
        "--cacert".to_owned(),
        ca.clone(),
        "--http2".to_owned(),
        "-N".to_owned(),
    ];
    args.extend(message_args(&h, true));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (got, status, body) = curl_run(&curl, &args);
    assert_eq!((got.as_str(), status), ("2", 200), "{body}");
    assert!(body.contains("event: message_stop"), "{body}");
    assert_eq!(h.sim().total_stats().requests, 3);
    // the health routes over h2 too
    let url = h.url("/readyz");
    let (got, status, body) = curl_run(&curl, &["--cacert", &ca, "--http2", &url]);
    assert_eq!((got.as_str(), status, body.as_str()), ("2", 200, "ready\n"));
    h.finish().await;

    let plain = builder().start().await;
    let mut args = vec!["--http2-prior-knowledge".to_owned()];
    args.extend(message_args(&plain, false));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (got, status, body) = curl_run(&curl, &args);
    assert_eq!((got.as_str(), status), ("2", 200), "{body}");
    let (got, status, _) = curl_run(&curl, &[&plain.url("/healthz")]);
    assert_eq!((got.as_str(), status), ("1.1", 200));
    assert_eq!(plain.sim().total_stats().requests, 1);
    plain.finish().await;
}

/// A request body sent as `chunks`, then (when `stall`) never ending.
struct Drip {
    chunks: VecDeque<Bytes>,
    stall: bool,
}

impl Body for Drip {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.chunks.pop_front() {
            Some(chunk) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
            // never woken: the stream stays open with nothing more to send
            None if self.stall => Poll::Pending,
            None => Poll::Ready(None),
        }
    }
}

fn drip(chunks: &[usize], stall: bool) -> Drip {
    Drip {
        chunks: chunks.iter().map(|n| Bytes::from(vec![b'x'; *n])).collect(),
        stall,
    }
}

/// One HTTP/2 request (prior knowledge) on `sender`: its status and `retry-after`.
async fn h2_post(
    sender: &mut hyper::client::conn::http2::SendRequest<Drip>,
    h: &Harness,
    length: Option<usize>,
    body: Drip,
) -> (u16, Option<String>) {
    let mut request = http::Request::post(h.messages_url())
        .header("x-api-key", h.key(KEY))
        .header("content-type", "application/json");
    if let Some(n) = length {
        request = request.header("content-length", n.to_string());
    }
    let response = tokio::time::timeout(
        CLOSED_WITHIN,
        sender.send_request(request.body(body).unwrap()),
    )
    .await
    .expect("an answer in time")
    .unwrap();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status().as_u16(), retry)
}

#[tokio::test]
async fn http2_requests_keep_the_body_limit_the_body_timeout_and_the_body_budget() {
    let h = builder()
        .server("max_body_bytes", "1000")
        .server("max_body_bytes_in_flight", "1000")
        .start()
        .await;
    let tcp = tokio::net::TcpStream::connect(h.addr()).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(connection);
    // announced larger than max_body_bytes: 413 from the head
    assert_eq!(
        h2_post(&mut sender, &h, Some(4000), drip(&[4000], false))
            .await
            .0,
        413
    );
    // no length, larger than max_body_bytes as it arrives: 413
    assert_eq!(
        h2_post(&mut sender, &h, None, drip(&[600, 600], false))
            .await
            .0,
        413
    );
    // a body that stalls: 408 after header_read_timeout
    assert_eq!(
        h2_post(&mut sender, &h, Some(100), drip(&[10], true))
            .await
            .0,
        408
    );
    // the body budget: one stalled stream holds 900 of the 1000 bytes, so the next
    // stream's 600 do not fit and get 503 at once, on the same connection
    let mut holder = sender.clone();
    let stalled = {
        let h_url = (h.messages_url(), h.key(KEY));
        tokio::spawn(async move {
            let request = http::Request::post(h_url.0)
                .header("x-api-key", h_url.1)
                .header("content-length", "900")
                .body(drip(&[100], true))
                .unwrap();
            holder
                .send_request(request)
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    let deadline = Instant::now() + CLOSED_WITHIN;
    while !h
        .metrics()
        .await
        .contains("keypool_body_in_flight_bytes{kind=\"request\"} 900")
    {
        assert!(
            Instant::now() < deadline,
            "the stalled body was never reserved"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        h2_post(&mut sender, &h, Some(600), drip(&[600], false)).await,
        (503, Some("1".to_owned()))
    );
    assert_eq!(stalled.await.unwrap(), 408);
    assert!(
        h.metrics()
            .await
            .contains("keypool_body_budget_rejections_total 1")
    );
    assert_eq!(
        h.sim().total_stats().requests,
        0,
        "no body reached the upstream"
    );
    h.finish().await;
}

#[tokio::test]
async fn the_admin_listener_alone_serves_the_admin_api_and_metrics() {
    let h = builder()
        .admin_listener()
        .extra_toml("[admin]\ntoken = \"admin-token-for-the-listener-test\"")
        .start()
        .await;
    let get = async |url: String| {
        let r = h
            .client()
            .request(http::Method::GET, url)
            .bearer("admin-token-for-the-listener-test")
            .send()
            .await;
        (r.status.as_u16(), r)
    };
    // the public listener: Messages and health, no admin API, no metrics
    assert_eq!(h.send_message().await.status, 200);
    for path in ["/metrics", "/admin/accounts", "/admin/ui"] {
        let (status, r) = get(h.url(path)).await;
        assert_eq!(status, 404, "public {path}");
        assert_eq!(r.json()["error"]["type"], "not_found_error");
    }
    assert_eq!(get(h.url("/readyz")).await.0, 200);
    // the admin listener: admin API, metrics, health; no Messages routes
    let (status, r) = get(h.admin_url("/admin/accounts")).await;
    assert_eq!(status, 200, "{}", r.text());
    assert_eq!(admin_account(&r.json(), "a")["state"], "active");
    let (status, metrics) = get(h.admin_url("/metrics")).await;
    assert_eq!(status, 200);
    let metrics = metrics.text();
    assert!(metrics.contains("keypool_requests_total{org=\"acme\",url=\"team\",status=\"200\"} 1"));
    assert!(
        metrics.contains("keypool_internal_requests_total{route=\"metrics\",status=\"404\"} 1")
    );
    assert_eq!(get(h.admin_url("/healthz")).await.0, 200);
    let r = h
        .client()
        .post(h.admin_url("/acme/team/v1/messages"))
        .api_key(&h.key(KEY))
        .json(&message_body(MODEL, false))
        .send()
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(h.sim().total_stats().requests, 1);
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_talks_to_keypool_over_tls_with_a_test_ca() {
    let Some(python) = sdk_python("the_python_sdk_talks_to_keypool_over_tls_with_a_test_ca") else {
        return;
    };
    let (_dir, certs) = certificates("sdk-tls");
    let h = builder().tls(tls_of(&certs)).start().await;
    let script = workspace_root().join("tests/sdk/sdk_tls.py");
    let (base, key, ca) = (h.pool_base_url(), h.key(KEY), certs.ca.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .env("KEYPOOL_BASE_URL", base)
            .env("KEYPOOL_KEY", key)
            .env("KEYPOOL_CA_FILE", ca)
            .env("KEYPOOL_MODEL", MODEL)
            .env_remove("ANTHROPIC_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("SSL_CERT_FILE")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out: Value = serde_json::from_str(stdout.trim()).unwrap();
    assert!(
        out["base_url"]
            .as_str()
            .unwrap()
            .starts_with("https://localhost:")
    );
    assert_eq!(out["create"]["status"], 200);
    assert_eq!(out["create"]["type"], "message");
    assert_eq!(
        out["stream"]["events"].as_array().unwrap().last().unwrap(),
        "message_stop"
    );
    // without the test CA the SDK refuses keypool's certificate
    assert_eq!(out["untrusted"], "APIConnectionError");
    assert_eq!(h.sim().total_stats().requests, 2);
    h.finish().await;
}

/// The binary with TLS and an admin listener: `SIGHUP` swaps the certificate for new
/// handshakes; `--log-format json` writes the request line's arrays; `--version` and
/// `keypool_build_info` name the commit; `keypool probe` asks the admin listener.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reloads_its_certificate_on_sighup_and_logs_json_arrays() {
    let h = builder().start().await;
    let dir = TempDir::new("sighup-tls").unwrap();
    let first = TestCertificates::create(dir.path(), "first-", "keypool first CA");
    let second = TestCertificates::create(dir.path(), "second-", "keypool second CA");
    let (cert, key) = (
        dir.path().join("tls-cert.pem"),
        dir.path().join("tls-key.pem"),
    );
    first.install_as(&cert, &key);
    let (port, admin) = (free_port(), free_port());
    let text = h.toml().replacen(
        "[server]\n",
        &format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n\
             tls_cert_file = \"tls-cert.pem\"\ntls_key_file = \"tls-key.pem\"\n"
        ),
        1,
    );
    let config = dir.path().join("keypool.toml");
    std::fs::write(&config, text).unwrap();
    let k = KeypoolProcess::start_with(&config, port, &["--log-format", "json"], &[]).await;

    // a request over TLS (h2), with a user agent
    let connector = tokio_rustls::TlsConnector::from(first.client_config(&[b"h2"]));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = connector
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::post(format!("https://localhost:{port}/acme/team/v1/messages"))
        .header("x-api-key", h.key(KEY))
        .header("user-agent", "listeners-test/1.0")
        .body(http_body_util::Full::new(Bytes::from(
            message_body(MODEL, false).to_string(),
        )))
        .unwrap();
    assert_eq!(sender.send_request(request).await.unwrap().status(), 200);

    // SIGHUP: new handshakes get the second certificate
    second.install_as(&cert, &key);
    k.signal("HUP");
    let deadline = Instant::now() + CLOSED_WITHIN;
    while second.connect(port, &[b"http/1.1"]).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the new certificate was not served: {}",
            k.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        first.connect(port, &[b"http/1.1"]).await.is_err(),
        "the old certificate is still served"
    );

    // the JSON request line
    let line = k
        .logs()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["target"] == "keypool::request")
        .unwrap_or_else(|| panic!("no request line: {}", k.logs()));
    let attempt = &line["attempts"][0];
    assert_eq!(line["attempts"].as_array().map(Vec::len), Some(1), "{line}");
    assert_eq!(
        (
            &attempt["account"],
            &attempt["outcome"],
            &attempt["status"],
            &attempt["class"]
        ),
        (&json!("a"), &json!("ok"), &json!(200), &Value::Null),
        "{line}"
    );
    assert!(attempt["ms"].is_u64(), "{line}");
    assert_eq!(line["upstream_statuses"], serde_json::json!([200]));
    assert_eq!(line["user_api_key_id"], "alice");
    assert_eq!(line["user_agent"], "listeners-test/1.0");
    assert!(
        line["client"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{line}"
    );
    assert_eq!(line["status"], 200);

    // the commit: --version, build_info and git agree
    let (code, version, _) = keypool_command(&["--version"], &[]);
    assert_eq!(code, Some(0));
    let commit = version
        .trim()
        .rsplit_once("(commit ")
        .and_then(|(_, c)| c.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no commit in {version:?}"))
        .to_owned();
    let git = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(workspace_root())
        .output();
    if let Ok(git) = git
        && git.status.success()
    {
        assert_eq!(commit, String::from_utf8_lossy(&git.stdout).trim());
    }
    let metrics = h
        .client()
        .request(
            http::Method::GET,
            format!("http://127.0.0.1:{admin}/metrics"),
        )
        .send()
        .await
        .text();
    assert!(
        metrics.contains(&format!(
            "keypool_build_info{{version=\"{}\",commit=\"{commit}\"}} 1",
            env!("CARGO_PKG_VERSION")
        )),
        "{metrics}"
    );
    // the probe finds the admin listener from the config, and it is plain HTTP
    let config_arg = config.display().to_string();
    let (code, body, err) = keypool_command(&["probe", "--config", &config_arg], &[]);
    assert_eq!((code, body.as_str()), (Some(0), "ready\n"), "{err}");
    let (code, _, _) = keypool_command(&["probe", &format!("http://127.0.0.1:{port}/readyz")], &[]);
    assert_eq!(code, Some(1), "plain HTTP to the TLS listener is no answer");
    drop(k);
    h.finish().await;
}
