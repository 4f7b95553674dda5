//! The OpenAI-format front (issue 23) end to end: the official OpenAI Python SDK
//! (`tests/sdk/openai_client.py`, from the venv of `keypool_tests::venv`) drives keypool
//! in front of keypool-sim, once on Anthropic accounts (chat completions translated to
//! the Messages API and back) and once on `openai` accounts (passed through natively);
//! then Rust-level checks of the same path as Messages: failover, the usage record,
//! provider filtering in a mixed pool, `x-ratelimit-*` cooldowns.

// Test code may unwrap (helpers outside #[test] functions too).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keypool_sim::{Behaviour, ErrorReply, OpenAiRateLimitHeaders, Script};
use keypool_tests::{AccountSpec, Harness, MODEL, sdk_python, secret_of, workspace_root};
use serde_json::{Value, json};

const ADMIN_TOKEN: &str = "openai-admin-token-1a2b3c4d5e6f";

/// Runs the OpenAI SDK script against `h` and parses what it printed.
async fn run_script(h: &Harness, python: PathBuf) -> Value {
    let script = workspace_root().join("tests/sdk/openai_client.py");
    let mut command = Command::new(python);
    command
        .arg(script)
        .env("KEYPOOL_BASE_URL", format!("{}/v1", h.pool_base_url()))
        .env("KEYPOOL_KEY", h.key("alice"))
        .env(
            "KEYPOOL_BAD_KEY",
            "sk-lb-notakeynotakeynotakeynotakeynotakey00",
        )
        .env("KEYPOOL_MODEL", MODEL)
        // nothing from the developer's shell may steer the SDK elsewhere
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_ORG_ID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = tokio::task::spawn_blocking(move || {
        let mut child = command.spawn().expect("python starts");
        let deadline = Instant::now() + Duration::from_secs(90);
        while child.try_wait().expect("wait for python").is_none() {
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

/// What the SDK got, the same whichever provider served it.
fn assert_sdk_results(out: &Value) {
    eprintln!("openai SDK {}", out["sdk_version"]);
    let create = &out["create"];
    assert_eq!(create["status"], 200, "{out}");
    assert!(create["request_id"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(create["content_type"], "application/json");
    assert_eq!(create["object"], "chat.completion");
    assert_eq!(create["role"], "assistant");
    assert_eq!(create["text"], "HelloHelloHelloHello");
    assert_eq!(create["finish_reason"], "stop");
    assert_eq!(create["prompt_tokens"], 12);
    assert_eq!(create["completion_tokens"], 4);
    assert_eq!(create["total_tokens"], 16);

    let stream = &out["stream"];
    assert_eq!(
        stream["pieces"],
        json!(["Hello", "Hello", "Hello", "Hello"]),
        "{out}"
    );
    assert_eq!(stream["ids"], 1, "every chunk has the completion's id");
    assert_eq!(stream["finish_reason"], "stop");
    assert_eq!(stream["prompt_tokens"], 12);
    assert_eq!(stream["completion_tokens"], 4);

    let tools = &out["tools"];
    assert_eq!(tools["finish_reason"], "tool_calls", "{out}");
    assert_eq!(tools["name"], "get_weather");
    assert_eq!(tools["arguments"], json!({"city": "sim"}));
    assert_eq!(tools["answer"], "HelloHelloHelloHello");
    assert_eq!(tools["answer_finish_reason"], "stop");
    assert_eq!(tools["streamed_name"], "get_weather");
    assert_eq!(tools["streamed_arguments"], json!({"city": "sim"}));
    assert_eq!(tools["streamed_finish_reason"], "tool_calls");

    let models = out["models"].as_array().unwrap();
    assert!(models.contains(&json!("claude-sonnet-4-5")), "{out}");

    let unauthorized = &out["unauthorized"];
    assert_eq!(unauthorized["raised"], "AuthenticationError", "{out}");
    assert_eq!(unauthorized["is_authentication_error"], true);
    assert_eq!(unauthorized["status"], 401);
    assert!(unauthorized["request_id"].as_str().is_some());
    // The SDK keeps the `error` object of an OpenAI-shaped body.
    let body = &unauthorized["body"];
    let error = body.get("error").unwrap_or(body);
    assert_eq!(error["type"], "authentication_error", "{out}");
    assert_eq!(error["code"], "invalid_api_key");
}

/// Runs `test` on a runtime of its own (the SDK script blocks a thread).
fn on_runtime(test: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(test);
}

#[test]
fn the_openai_python_sdk_works_on_anthropic_accounts() {
    let Some(python) = sdk_python("the_openai_python_sdk_works_on_anthropic_accounts") else {
        return;
    };
    on_runtime(async {
        let h = Harness::with_accounts([("a", Script::ok())]).await;
        let out = run_script(&h, python).await;
        assert_sdk_results(&out);
        // Every call reached the Messages API (none for the model list or the 401).
        let requests = h.sim().requests_for("a");
        let paths: Vec<&str> = requests.iter().map(|r| r.path_and_query.as_str()).collect();
        assert_eq!(paths, ["/v1/messages"; 5]);
        for r in &requests {
            assert_eq!(r.header("x-api-key"), Some(secret_of("a").as_str()));
            assert_eq!(r.header("authorization"), None, "the LB key stays home");
        }
        h.finish().await;
    });
}

#[test]
fn the_openai_python_sdk_works_on_openai_accounts() {
    let Some(python) = sdk_python("the_openai_python_sdk_works_on_openai_accounts") else {
        return;
    };
    on_runtime(async {
        let h = Harness::builder()
            .account(AccountSpec::new("o", Script::ok()).provider("openai", "api_key"))
            .start()
            .await;
        let out = run_script(&h, python).await;
        assert_sdk_results(&out);
        let requests = h.sim().requests_for("o");
        let paths: Vec<&str> = requests.iter().map(|r| r.path_and_query.as_str()).collect();
        assert_eq!(paths, ["/v1/chat/completions"; 5]);
        let bearer = format!("Bearer {}", secret_of("o"));
        for r in &requests {
            assert_eq!(r.header("authorization"), Some(bearer.as_str()));
            assert_eq!(r.header("x-api-key"), None);
            assert_eq!(r.header("anthropic-version"), None);
        }
        h.finish().await;
    });
}

fn chat_body(stream: bool) -> Value {
    json!({
        "model": MODEL,
        "stream": stream,
        "messages": [{"role": "user", "content": "Hello"}],
    })
}

fn chat_url(h: &Harness) -> String {
    format!("{}/v1/chat/completions", h.pool_base_url())
}

/// `POST …/v1/chat/completions` with `body`, authenticated as alice by `Authorization:
/// Bearer` (how the OpenAI SDK sends its key).
async fn send_chat(h: &Harness, body: &serde_json::Value) -> keypool_tests::Reply {
    h.client()
        .post(chat_url(h))
        .bearer(&h.key("alice"))
        .json(body)
        .send()
        .await
}

#[tokio::test]
async fn a_429_on_the_chat_route_fails_over() {
    let h = Harness::with_accounts([
        (
            "a",
            Script::new(ErrorReply::rate_limited().retry_after_secs(30)),
        ),
        ("b", Script::ok()),
    ])
    .await;
    let r = send_chat(&h, &chat_body(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "chat.completion");
    assert_eq!(h.requests_per_account(&["a", "b"]), [1, 1]);
    assert!(h.cooldown("a").is_some(), "the 429 cooled a");
    // Both accounts 429: the pass-through, in the OpenAI shape.
    let h2 = Harness::with_accounts([
        (
            "a",
            Script::new(ErrorReply::rate_limited().retry_after_secs(7)),
        ),
        (
            "b",
            Script::new(ErrorReply::rate_limited().retry_after_secs(7)),
        ),
    ])
    .await;
    let r = h2
        .client()
        .post(chat_url(&h2))
        .bearer(&h2.key("alice"))
        .json(&chat_body(true))
        .send()
        .await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.header("retry-after").is_some());
    let body = r.json();
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert!(body.get("type").is_none(), "no Anthropic envelope: {body}");
    h.finish().await;
    h2.finish().await;
}

#[tokio::test]
async fn a_chat_request_leaves_a_usage_record() {
    let h = Harness::builder()
        .accounts([("a", Script::ok())])
        .extra_toml(&format!("[admin]\ntoken = \"{ADMIN_TOKEN}\""))
        .start()
        .await;
    let r = h
        .client()
        .post(chat_url(&h))
        .api_key(&h.key("alice"))
        .json(&chat_body(true))
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let text = r.text();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let id = r.header("x-request-id").unwrap().to_owned();
    let record = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let r = h
                .get(&format!("/admin/requests/{id}"))
                .bearer(ADMIN_TOKEN)
                .send()
                .await;
            if r.status == 200 {
                return r.json();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the record within 10 s");
    assert_eq!(record["account"], "a", "{record}");
    assert_eq!(record["model"], MODEL);
    assert_eq!(record["stream_end"], "completed");
    assert_eq!(record["usage"]["input_tokens"], 12, "{record}");
    assert_eq!(record["usage"]["output_tokens"], 4);
    h.finish().await;
}

#[tokio::test]
async fn a_mixed_pool_sends_each_format_where_it_is_spoken() {
    let h = Harness::builder()
        .account(
            AccountSpec::new("o", Script::ok())
                .provider("openai", "api_key")
                .priority(0),
        )
        .account(AccountSpec::new("a", Script::ok()).priority(1))
        .start()
        .await;
    // A Messages request skips the openai account, however high its priority.
    let r = h.send_message().await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["type"], "message");
    // A chat completion goes to it natively.
    let r = send_chat(&h, &chat_body(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let paths = |id| {
        h.sim()
            .requests_for(id)
            .iter()
            .map(|r| r.path_and_query.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(paths("a"), ["/v1/messages"]);
    assert_eq!(paths("o"), ["/v1/chat/completions"]);
    h.finish().await;
}

#[tokio::test]
async fn an_openai_accounts_exhausted_budget_cools_it() {
    let limits = OpenAiRateLimitHeaders {
        remaining_requests: Some(0),
        reset_requests: Some("20s".into()),
        ..OpenAiRateLimitHeaders::default()
    };
    let h = Harness::builder()
        .account(
            AccountSpec::new(
                "o",
                Script::new(ErrorReply::rate_limited().openai_rate_limits(&limits)),
            )
            .provider("openai", "api_key")
            .priority(0),
        )
        .account(
            AccountSpec::new("p", Script::ok())
                .provider("openai", "api_key")
                .priority(1),
        )
        .start()
        .await;
    let r = send_chat(&h, &chat_body(true)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().ends_with("data: [DONE]\n\n"));
    let cooldown = h.cooldown("o").expect("o is cooling");
    eprintln!("{cooldown:?}");
    // The next request goes straight to p.
    let r = send_chat(&h, &chat_body(false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(h.requests_per_account(&["o", "p"]), [1, 2]);
    h.finish().await;
}

#[tokio::test]
async fn chat_route_errors_are_openai_shaped() {
    let h = Harness::with_accounts([("a", Script::ok())]).await;
    // An untranslatable request: 400 naming the field, no upstream call.
    let r = send_chat(&h, &json!({"model": MODEL, "n": 3, "messages": []})).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert_eq!(r.json()["error"]["param"], "n");
    // An unknown URL config: the same 404 as on Messages, in the OpenAI shape.
    let r = h
        .client()
        .post(h.url("/acme/nope/v1/chat/completions"))
        .bearer(&h.key("alice"))
        .json(&chat_body(false))
        .send()
        .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "not_found");
    // The models list needs the key too.
    let r = h.get("/acme/team/v1/models").send().await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let r = h
        .get("/acme/team/v1/models")
        .bearer(&h.key("alice"))
        .send()
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["object"], "list");
    assert_eq!(h.sim().total_stats().requests, 0);
    // The legacy form works too, with the deprecation headers of every legacy route.
    let r = h
        .client()
        .post(h.url("/team/v1/chat/completions"))
        .bearer(&h.key("alice"))
        .json(&chat_body(false))
        .send()
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "chat.completion");
    assert_eq!(r.header("deprecation"), Some("true"));
    h.finish().await;
}

#[tokio::test]
async fn a_translated_stream_that_breaks_ends_with_the_openai_error_frame() {
    let h = Harness::with_accounts([(
        "a",
        Script::new(Behaviour::cut_after(4, keypool_sim::Cut::Reset)),
    )])
    .await;
    let r = send_chat(&h, &chat_body(true)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(text.starts_with("data: {"), "OpenAI chunks: {text}");
    assert!(!text.contains("event:"), "no Anthropic event leaks: {text}");
    assert!(
        text.ends_with(
            "data: {\"error\":{\"message\":\"Overloaded\",\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}\n\n"
        ),
        "{text}"
    );
    assert!(!text.contains("[DONE]"));
    h.finish().await;
}
