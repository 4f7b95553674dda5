//! A real client: the official Anthropic Python SDK drives keypool in front of
//! keypool-sim (`tests/sdk/sdk_client.py`). The venv is created under `target/py-sdk`
//! when missing (see `keypool_tests::venv`); it cannot be skipped silently.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keypool_sim::Script;
use keypool_tests::{Harness, MODEL, sdk_python, workspace_root};
use serde_json::{Value, json};

/// Runs the SDK script against `h` and parses what it printed.
async fn run_script(h: &Harness, python: PathBuf) -> Value {
    let script = workspace_root().join("tests/sdk/sdk_client.py");
    let mut command = Command::new(python);
    command
        .arg(script)
        .env("KEYPOOL_BASE_URL", h.pool_base_url())
        .env("KEYPOOL_KEY", h.key("alice"))
        .env(
            "KEYPOOL_BAD_KEY",
            "sk-lb-notakeynotakeynotakeynotakeynotakey00",
        )
        .env("KEYPOOL_MODEL", MODEL)
        // nothing from the developer's shell may steer the SDK elsewhere
        .env_remove("ANTHROPIC_BASE_URL")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("ANTHROPIC_AUTH_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("python starts");
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if child.try_wait().expect("wait for python").is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("python output")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the SDK script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("the script printed no JSON ({e}):\n{stdout}\n{stderr}"))
}

#[test]
fn the_anthropic_python_sdk_works_through_keypool() {
    let Some(python) = sdk_python("the_anthropic_python_sdk_works_through_keypool") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let h = Harness::with_accounts([("a", Script::ok())]).await;
        let out = run_script(&h, python).await;
        eprintln!("anthropic SDK {}", out["sdk_version"]);

        let create = &out["create"];
        assert_eq!(create["status"], 200);
        assert!(create["request_id"].as_str().is_some_and(|s| !s.is_empty()));
        assert_eq!(create["content_type"], "application/json");
        assert_eq!(create["type"], "message");
        assert_eq!(create["role"], "assistant");
        assert_eq!(create["text"], "HelloHelloHelloHello");
        assert_eq!(create["stop_reason"], "end_turn");
        assert_eq!(create["input_tokens"], 12);
        assert_eq!(create["output_tokens"], 4);

        let stream = &out["stream"];
        assert_eq!(
            stream["pieces"],
            json!(["Hello", "Hello", "Hello", "Hello"])
        );
        assert_eq!(stream["text"], "HelloHelloHelloHello");
        assert_eq!(stream["stop_reason"], "end_turn");
        assert_eq!(stream["input_tokens"], 12);
        assert_eq!(stream["output_tokens"], 4);
        assert_ne!(stream["id"], create["id"]);

        assert_eq!(out["count_tokens"], json!({"input_tokens": 12}));

        let unauthorized = &out["unauthorized"];
        assert_eq!(unauthorized["raised"], "AuthenticationError");
        assert_eq!(unauthorized["is_authentication_error"], true);
        assert_eq!(unauthorized["status"], 401);
        let request_id = unauthorized["request_id"].as_str().expect("x-request-id");
        assert_eq!(unauthorized["body"]["type"], "error");
        assert_eq!(
            unauthorized["body"]["error"]["type"],
            "authentication_error"
        );
        assert_eq!(unauthorized["body"]["request_id"], request_id);

        // exactly one upstream call per SDK call that should reach it, none for the 401
        let requests = h.sim().requests_for("a");
        let paths: Vec<&str> = requests.iter().map(|r| r.path_and_query.as_str()).collect();
        assert_eq!(
            paths,
            ["/v1/messages", "/v1/messages", "/v1/messages/count_tokens"]
        );
        assert_eq!(h.sim().total_stats().requests, 3);
        for r in &requests {
            assert!(
                r.header("user-agent")
                    .is_some_and(|ua| ua.contains("Python")),
                "the SDK's user-agent is forwarded: {:?}",
                r.header("user-agent")
            );
            assert!(r.header("anthropic-version").is_some());
            let stainless: Vec<&str> = r
                .headers
                .keys()
                .map(http::HeaderName::as_str)
                .filter(|n| n.starts_with("x-stainless"))
                .collect();
            assert!(stainless.is_empty(), "not in the allowlist: {stainless:?}");
        }
        h.finish().await;
    });
}
