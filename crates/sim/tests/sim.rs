//! The simulator over real loopback HTTP, with a hyper client.
#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use keypool_core::Window;
use keypool_sim::{
    AccountStats, Behaviour, Cut, Delay, ErrorReply, OkSpec, Script, Sim, SimConfig, SimHandle,
    UnifiedHeaders, Usage,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, timeout};

const KEY_A: &str = "sk-ant-api03-sim-a";
const KEY_B: &str = "sk-ant-oat01-sim-b";
const BODY: &str =
    r#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}"#;
const STREAM_BODY: &str = r#"{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
/// Long enough that a test never sees it end, short enough to never matter.
const FOREVER: Duration = Duration::from_secs(3600);

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn start(a: Script, b: Script) -> SimHandle {
    Sim::start(
        SimConfig::new()
            .account("a", KEY_A, a)
            .account("b", KEY_B, b),
    )
    .await
    .unwrap()
}

fn request(sim: &SimHandle, path: &str, key: Option<&str>, body: &str) -> Request<Full<Bytes>> {
    let mut req = Request::post(format!("{}{path}", sim.base_url()))
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01");
    if let Some(key) = key {
        req = req.header("x-api-key", key);
    }
    req.body(Full::new(Bytes::from(body.to_owned()))).unwrap()
}

async fn send(req: Request<Full<Bytes>>) -> http::Response<Incoming> {
    client().request(req).await.unwrap()
}

/// Sends a request and reads the whole answer.
async fn call(
    sim: &SimHandle,
    path: &str,
    key: Option<&str>,
    body: &str,
) -> (StatusCode, HeaderMap, Bytes) {
    let (parts, body) = send(request(sim, path, key, body)).await.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, bytes)
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// Parses an SSE body the simple way: frames end with a blank line, each has one
/// `event:` line and one `data:` line of JSON.
fn frames(body: &[u8]) -> Vec<(String, Value)> {
    let text = std::str::from_utf8(body).unwrap();
    assert!(
        text.is_empty() || text.ends_with("\n\n"),
        "stream ends mid-frame: {text:?}"
    );
    text.split_terminator("\n\n")
        .map(|frame| {
            let mut lines = frame.split('\n');
            let event = lines
                .next()
                .unwrap()
                .strip_prefix("event: ")
                .unwrap()
                .to_owned();
            let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
            assert_eq!(lines.next(), None, "one data line per frame");
            (event, serde_json::from_str(data).unwrap())
        })
        .collect()
}

fn events(frames: &[(String, Value)]) -> Vec<&str> {
    frames.iter().map(|(e, _)| e.as_str()).collect()
}

fn assert_error(status: StatusCode, headers: &HeaderMap, body: &[u8], code: u16, error_type: &str) {
    assert_eq!(status.as_u16(), code);
    assert_eq!(headers["content-type"], "application/json");
    let v = json_of(body);
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], error_type, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    assert_eq!(
        v["request_id"].as_str(),
        headers["request-id"].to_str().ok()
    );
}

#[tokio::test]
async fn json_answer_has_the_anthropic_message_shape() {
    let spec = OkSpec::default().text("ab").chunks(3).usage(Usage {
        input_tokens: 25,
        output_tokens: 7,
        cache_creation_input_tokens: 2,
        cache_read_input_tokens: 3,
    });
    let sim = start(Script::new(spec), Script::ok()).await;
    let (status, headers, body) = call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers["request-id"].to_str().unwrap().starts_with("req_"));
    assert_eq!(headers["content-length"], body.len().to_string().as_str());
    let v = json_of(&body);
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    let expected = json!({
        "id": v["id"], "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "ababab"}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 25, "cache_creation_input_tokens": 2, "cache_read_input_tokens": 3, "output_tokens": 7}
    });
    assert_eq!(v, expected);
}

#[tokio::test]
async fn count_tokens_accepts_a_query_string() {
    let spec = OkSpec::default().usage(Usage {
        input_tokens: 321,
        ..Usage::default()
    });
    let sim = start(Script::new(spec), Script::ok()).await;
    let (status, _, body) = call(
        &sim,
        "/v1/messages/count_tokens?beta=true",
        Some(KEY_A),
        BODY,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json_of(&body), json!({"input_tokens": 321}));
    assert_eq!(
        sim.requests()[0].path_and_query,
        "/v1/messages/count_tokens?beta=true"
    );
}

#[tokio::test]
async fn stream_has_the_real_event_sequence_and_framing() {
    let spec = OkSpec::default().text("tok").chunks(5).usage(Usage {
        output_tokens: 5,
        ..Usage::default()
    });
    let sim = start(Script::new(spec), Script::ok()).await;
    let (status, headers, body) =
        call(&sim, "/v1/messages?beta=true", Some(KEY_A), STREAM_BODY).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "text/event-stream; charset=utf-8");
    assert_eq!(headers["cache-control"], "no-cache");
    assert!(headers.contains_key("request-id"));
    let f = frames(&body);
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(["content_block_delta"; 5]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(events(&f), expected);
    for (event, data) in &f {
        assert_eq!(data["type"].as_str(), Some(event.as_str()));
    }
    assert_eq!(f[0].1["message"]["model"], "claude-sonnet-4-5");
    assert_eq!(f[0].1["message"]["content"], json!([]));
    assert_eq!(f[0].1["message"]["usage"]["input_tokens"], 12);
    assert_eq!(f[1].1["content_block"], json!({"type": "text", "text": ""}));
    assert_eq!(
        f[3].1["delta"],
        json!({"type": "text_delta", "text": "tok"})
    );
    assert_eq!(f[9].1["delta"]["stop_reason"], "end_turn");
    assert_eq!(f[9].1["usage"]["output_tokens"], 5);
    assert_eq!(sim.stats("a").unwrap().finished, 1);
}

#[tokio::test]
async fn each_error_status_has_its_anthropic_error_body() {
    let cases = [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (402, "billing_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
    ];
    let sim = start(Script::ok(), Script::ok()).await;
    for (code, error_type) in cases {
        sim.set_script("a", Script::new(Behaviour::status(code)))
            .unwrap();
        let (status, headers, body) = call(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY).await;
        assert_error(status, &headers, &body, code, error_type);
    }
}

#[tokio::test]
async fn rate_limits_carry_retry_after_or_unified_window_headers() {
    let reset = 1_900_000_000;
    let a = Script::new(Behaviour::ok())
        .then(
            ErrorReply::rate_limited()
                .retry_after_secs(30)
                .message("slow down"),
        )
        .then(ErrorReply::rate_limited().retry_after_ms(1500))
        .then(
            ErrorReply::rate_limited().unified(&UnifiedHeaders::rejected(reset).window(
                Window::FiveHour,
                1.0,
                reset,
                "rejected",
            )),
        )
        .then(ErrorReply::rate_limited());
    let sim = start(a, Script::ok()).await;

    let (status, headers, body) = call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    assert_error(status, &headers, &body, 429, "rate_limit_error");
    assert_eq!(headers["retry-after"], "30");
    assert_eq!(json_of(&body)["error"]["message"], "slow down");

    let (_, headers, _) = call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    assert_eq!(headers["retry-after-ms"], "1500");
    assert!(!headers.contains_key("retry-after"));

    let (status, headers, _) = call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(headers["anthropic-ratelimit-unified-status"], "rejected");
    assert_eq!(headers["anthropic-ratelimit-unified-reset"], "1900000000");
    assert_eq!(headers["anthropic-ratelimit-unified-5h-utilization"], "1");
    assert_eq!(headers["anthropic-ratelimit-unified-5h-status"], "rejected");

    let (status, headers, _) = call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        !headers.contains_key("retry-after")
            && !headers.contains_key("anthropic-ratelimit-unified-status")
    );

    let (status, _, _) = call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "the sequence is spent, the default answers"
    );
}

#[tokio::test]
async fn always_headers_come_with_successes_and_errors() {
    let unified = UnifiedHeaders::allowed()
        .window(Window::FiveHour, 0.42, 1_900_000_000, "allowed")
        .window(Window::Weekly, 0.9, 1_900_500_000, "allowed_warning");
    let a = Script::ok()
        .unified(&unified)
        .header("anthropic-organization-id", "org-sim")
        .then(Behaviour::status(529));
    let sim = start(a, Script::ok()).await;
    for expected in [529, 200] {
        let (status, headers, _) = call(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY).await;
        assert_eq!(status.as_u16(), expected);
        assert_eq!(headers["anthropic-ratelimit-unified-status"], "allowed");
        assert_eq!(
            headers["anthropic-ratelimit-unified-5h-utilization"],
            "0.42"
        );
        assert_eq!(
            headers["anthropic-ratelimit-unified-7d-status"],
            "allowed_warning"
        );
        assert_eq!(headers["anthropic-organization-id"], "org-sim");
    }
    let (_, headers, _) = call(&sim, "/v1/messages", Some(KEY_B), BODY).await;
    assert!(
        !headers.contains_key("anthropic-ratelimit-unified-status"),
        "headers are per account"
    );
}

#[tokio::test]
async fn credentials_identify_accounts_and_unknown_ones_get_401() {
    let sim = start(Script::ok(), Script::new(Behaviour::status(529))).await;
    let (status, headers, body) =
        call(&sim, "/v1/messages", Some("sk-ant-api03-nobody"), BODY).await;
    assert_error(status, &headers, &body, 401, "authentication_error");
    let (status, headers, body) = call(&sim, "/v1/messages", None, BODY).await;
    assert_error(status, &headers, &body, 401, "authentication_error");

    let mut req = request(&sim, "/v1/messages", None, BODY);
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY_B}").parse().unwrap());
    assert_eq!(
        send(req).await.status().as_u16(),
        529,
        "the bearer token is account b's credential"
    );

    let recorded = sim.requests();
    let accounts: Vec<Option<&str>> = recorded
        .iter()
        .map(|r| r.account.as_ref().map(|a| a.as_str()))
        .collect();
    assert_eq!(accounts, [None, None, Some("b")]);
    assert_eq!(sim.total_stats().requests, 3);
    assert_eq!(sim.stats("b").unwrap().requests, 1);
    assert_eq!(sim.stats("a").unwrap().requests, 0);
}

#[tokio::test]
async fn any_credential_fallback_serves_unknown_keys_as_account_star() {
    let config = SimConfig::new().any_credential(Script::ok());
    let sim = Sim::start(config).await.unwrap();
    let (status, _, _) = call(&sim, "/v1/messages", Some("whatever"), BODY).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = call(&sim, "/v1/messages", None, BODY).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "no credential at all is still refused"
    );
    assert_eq!(sim.stats("*").unwrap().requests, 1);
    sim.set_default("*", Behaviour::status(503)).unwrap();
    let (status, _, _) = call(&sim, "/v1/messages", Some("other"), BODY).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn unknown_paths_and_bodies_without_model_are_refused() {
    let sim = start(Script::ok(), Script::ok()).await;
    let (status, headers, body) = call(&sim, "/v1/complete", Some(KEY_A), BODY).await;
    assert_error(status, &headers, &body, 404, "not_found_error");
    let (status, headers, body) =
        call(&sim, "/v1/messages", Some(KEY_A), "{\"stream\":true}").await;
    assert_error(status, &headers, &body, 400, "invalid_request_error");
}

#[tokio::test]
async fn sequence_then_default_and_runtime_changes_take_effect() {
    let a = Script::ok()
        .then(Behaviour::status(500))
        .then(Behaviour::status(429));
    let sim = start(a, Script::ok()).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(
            call(&sim, "/v1/messages", Some(KEY_A), BODY)
                .await
                .0
                .as_u16(),
        );
    }
    assert_eq!(seen, [500, 429, 200, 200]);

    sim.set_default("a", Behaviour::status(401)).unwrap();
    assert_eq!(
        call(&sim, "/v1/messages", Some(KEY_A), BODY).await.0,
        StatusCode::UNAUTHORIZED
    );
    sim.push("a", [Behaviour::ok()]).unwrap();
    assert_eq!(
        call(&sim, "/v1/messages", Some(KEY_A), BODY).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&sim, "/v1/messages", Some(KEY_A), BODY).await.0,
        StatusCode::UNAUTHORIZED
    );

    sim.add_account(
        "c",
        "sk-ant-api03-sim-c",
        Script::new(Behaviour::status(402)),
    )
    .unwrap();
    assert_eq!(
        call(&sim, "/v1/messages", Some("sk-ant-api03-sim-c"), BODY)
            .await
            .0,
        StatusCode::PAYMENT_REQUIRED
    );
    assert!(sim.set_script("nobody", Script::ok()).is_err());
}

#[tokio::test]
async fn recorder_keeps_method_path_headers_body_and_account() {
    let sim = start(Script::ok(), Script::ok()).await;
    let mut req = request(&sim, "/v1/messages?beta=true", Some(KEY_A), BODY);
    req.headers_mut()
        .insert("x-leak", "sk-lb-0123456789".parse().unwrap());
    let before = Instant::now();
    send(req).await.into_body().collect().await.unwrap();
    call(&sim, "/v1/messages", Some(KEY_B), BODY).await;

    let all = sim.requests();
    assert_eq!(all.len(), 2);
    let r = &all[0];
    assert_eq!((r.seq, r.method.as_str()), (0, "POST"));
    assert_eq!(r.path_and_query, "/v1/messages?beta=true");
    assert_eq!(r.header("x-api-key"), Some(KEY_A));
    assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(r.body, BODY.as_bytes());
    assert_eq!(r.body_json().unwrap()["model"], "claude-sonnet-4-5");
    assert_eq!(r.account.as_ref().map(|a| a.as_str()), Some("a"));
    assert!(r.received_at >= before);

    let leaks = sim.requests_containing(b"sk-lb-");
    assert_eq!(leaks.len(), 1);
    assert_eq!(leaks[0].seq, 0);
    assert_eq!(sim.requests_for("b").len(), 1);
    sim.clear_requests();
    assert!(sim.requests().is_empty());
}

#[tokio::test]
async fn recorder_is_bounded() {
    let sim = Sim::start(
        SimConfig::new()
            .account("a", KEY_A, Script::ok())
            .record_limit(2),
    )
    .await
    .unwrap();
    for _ in 0..5 {
        call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    }
    let seqs: Vec<u64> = sim.requests().iter().map(|r| r.seq).collect();
    assert_eq!(seqs, [3, 4]);
    assert_eq!(sim.stats("a").unwrap().requests, 5);
}

/// Sends one raw HTTP/1.1 request and reads until the server closes.
async fn raw_exchange(sim: &SimHandle, body: &str) -> Result<Vec<u8>, std::io::Error> {
    let mut tcp = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: sim\r\nx-api-key: {KEY_A}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tcp.read_to_end(&mut out).await.map(|_| out)
}

#[tokio::test]
async fn reset_drops_the_connection_with_an_rst_and_no_response() {
    let sim = start(Script::new(Behaviour::Reset), Script::ok()).await;
    let err = raw_exchange(&sim, BODY).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);

    let err = client()
        .request(request(&sim, "/v1/messages", Some(KEY_A), BODY))
        .await
        .unwrap_err();
    assert!(
        err.is_connect()
            || format!("{err:?}").to_lowercase().contains("reset")
            || format!("{err:?}").contains("Incomplete"),
        "{err:?}"
    );
    let stats = sim.stats("a").unwrap();
    assert_eq!(
        (stats.requests, stats.finished, stats.cancelled),
        (2, 2, 0),
        "a scripted reset is not a cancellation"
    );
}

#[tokio::test]
async fn ok_keeps_the_connection_alive() {
    let sim = start(Script::ok(), Script::ok()).await;
    let mut tcp = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    for _ in 0..2 {
        let head = format!(
            "POST /v1/messages HTTP/1.1\r\nhost: sim\r\nx-api-key: {KEY_A}\r\ncontent-length: {}\r\n\r\n{BODY}",
            BODY.len()
        );
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut buf = vec![0; 4096];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK\r\n"));
    }
    assert_eq!(sim.stats("a").unwrap().finished, 2);
}

async fn wait_for(sim: &SimHandle, id: &str, what: impl Fn(AccountStats) -> bool) {
    let wait = sim.wait_until(|s| what(s.stats(id).unwrap()));
    timeout(Duration::from_secs(10), wait)
        .await
        .expect("the simulator's counters never got there");
}

#[tokio::test]
async fn stall_before_headers_sends_nothing_and_a_client_disconnect_cancels_it() {
    let sim = start(
        Script::new(Behaviour::StallBeforeHeaders(FOREVER)),
        Script::ok(),
    )
    .await;
    let pending =
        tokio::spawn(client().request(request(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY)));
    wait_for(&sim, "a", |s| s.in_flight == 1).await;
    let mut pending = pending;
    assert!(
        timeout(Duration::from_millis(50), &mut pending)
            .await
            .is_err(),
        "no answer while stalling"
    );
    pending.abort();
    wait_for(&sim, "a", |s| s.cancelled == 1).await;
    assert_eq!(sim.stats("a").unwrap().finished, 0);
}

#[tokio::test(start_paused = true)]
async fn stall_before_headers_ends_in_a_reset_after_its_duration() {
    let sim = start(
        Script::new(Behaviour::StallBeforeHeaders(Duration::from_secs(200))),
        Script::ok(),
    )
    .await;
    let start = Instant::now();
    let err = raw_exchange(&sim, BODY).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    assert!(start.elapsed() >= Duration::from_secs(200));
    assert_eq!(sim.stats("a").unwrap().finished, 1);
}

#[tokio::test(start_paused = true)]
async fn stall_before_first_frame_sends_the_head_then_nothing_then_resets() {
    let sim = start(
        Script::new(Behaviour::StallBeforeFirstFrame(Duration::from_secs(30))),
        Script::ok(),
    )
    .await;
    let start = Instant::now();
    let resp = send(request(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()["content-type"],
        "text/event-stream; charset=utf-8"
    );
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "the head is not held back"
    );
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap();
    assert!(first.is_err(), "no frame ever comes, the body fails");
    assert!(start.elapsed() >= Duration::from_secs(30));
}

#[tokio::test]
async fn stall_before_first_frame_is_cancelled_by_the_client() {
    let sim = start(
        Script::new(Behaviour::StallBeforeFirstFrame(FOREVER)),
        Script::ok(),
    )
    .await;
    let resp = send(request(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    drop(resp);
    wait_for(&sim, "a", |s| s.cancelled == 1 && s.in_flight == 0).await;
}

#[tokio::test]
async fn in_band_error_follows_message_start_then_the_stream_ends() {
    let a = Script::new(Behaviour::in_band_error()).then(Behaviour::InBandError {
        after_frames: 5,
        spec: OkSpec::default(),
    });
    let sim = start(a, Script::ok()).await;
    let (status, _, body) = call(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY).await;
    assert_eq!(status, StatusCode::OK);
    let f = frames(&body);
    assert_eq!(
        events(&f),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "error"
        ]
    );
    assert_eq!(
        f[5].1,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );

    let (status, _, body) = call(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(events(&frames(&body)), ["message_start", "error"]);

    let (status, headers, body) = call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    assert_error(status, &headers, &body, 529, "overloaded_error");
}

#[tokio::test]
async fn cut_stream_stops_after_k_frames_without_message_stop() {
    let a = Script::ok()
        .then(Behaviour::cut_after(4, Cut::EndOfBody))
        .then(Behaviour::cut_after(4, Cut::Reset))
        .then(Behaviour::cut_after(4, Cut::Close))
        .then(Behaviour::cut_after(1000, Cut::EndOfBody));
    let sim = start(a, Script::ok()).await;

    let (got, failed) = read_until_failure(&sim).await;
    assert!(!failed, "an end-of-body cut ends the HTTP body cleanly");
    assert_eq!(
        events(&frames(&got)),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta"
        ]
    );

    let (got, failed) = read_until_failure(&sim).await;
    assert!(failed, "a reset cut fails the HTTP body");
    assert_eq!(frames(&got).len(), 4);

    let (got, failed) = read_until_failure(&sim).await;
    assert!(failed, "a close cut fails the HTTP body");
    assert_eq!(frames(&got).len(), 4);

    let (_, _, body) = call(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY).await;
    let f = frames(&body);
    assert_eq!(f.len(), 9, "clamped to one frame short of the whole stream");
    assert_eq!(f.last().unwrap().0, "message_delta");
    assert_eq!(sim.stats("a").unwrap().cancelled, 0);
}

/// Streams one request of account a; returns the bytes and whether the body failed.
async fn read_until_failure(sim: &SimHandle) -> (Vec<u8>, bool) {
    let resp = send(request(sim, "/v1/messages", Some(KEY_A), STREAM_BODY)).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => got.extend_from_slice(f.data_ref().unwrap()),
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

#[tokio::test]
async fn dropping_a_stream_midway_counts_as_cancelled() {
    let spec = OkSpec::default()
        .chunks(10)
        .chunk_interval(Delay::Fixed(FOREVER));
    let sim = start(Script::new(spec), Script::ok()).await;
    let resp = send(request(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY)).await;
    let mut body = resp.into_body();
    let mut got = Vec::new();
    while frames_complete(&got) < 4 {
        got.extend_from_slice(body.frame().await.unwrap().unwrap().data_ref().unwrap());
    }
    assert_eq!(sim.stats("a").unwrap().in_flight, 1);
    drop(body);
    wait_for(&sim, "a", |s| {
        s.cancelled == 1 && s.in_flight == 0 && s.finished == 0
    })
    .await;
}

fn frames_complete(bytes: &[u8]) -> usize {
    bytes.windows(2).filter(|w| w == b"\n\n").count()
}

#[tokio::test(start_paused = true)]
async fn delays_follow_the_tokio_clock() {
    let spec = OkSpec::default()
        .latency(Delay::ms(7_000))
        .ttft(Delay::ms(2_000))
        .chunks(4)
        .chunk_interval(Delay::ms(500));
    let sim = start(Script::new(spec), Script::ok()).await;

    let start = Instant::now();
    call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    assert_eq!(start.elapsed().as_secs(), 7, "JSON answers wait `latency`");

    let start = Instant::now();
    let resp = send(request(&sim, "/v1/messages", Some(KEY_A), STREAM_BODY)).await;
    assert_eq!(
        start.elapsed().as_millis() / 100,
        20,
        "the head comes after `ttft`"
    );
    resp.into_body().collect().await.unwrap();
    assert_eq!(
        start.elapsed().as_millis() / 100,
        35,
        "three paced deltas after the first"
    );
}

#[tokio::test(start_paused = true)]
async fn uniform_delays_land_in_their_range() {
    let spec = OkSpec::default().latency(Delay::uniform_ms(1_000, 3_000));
    let sim = start(Script::new(spec), Script::ok()).await;
    let mut seen = Vec::new();
    for _ in 0..10 {
        let start = Instant::now();
        call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
        let ms = start.elapsed().as_millis();
        assert!((1_000..=3_100).contains(&ms), "{ms}");
        seen.push(ms / 100);
    }
    seen.sort_unstable();
    seen.dedup();
    assert!(
        seen.len() > 1,
        "ten draws of a uniform range are not all equal"
    );
}

#[tokio::test]
async fn concurrency_is_counted() {
    let spec = OkSpec::default().latency(Delay::Fixed(FOREVER));
    let sim = start(Script::new(spec), Script::ok()).await;
    let calls: Vec<_> = (0..3)
        .map(|_| tokio::spawn(client().request(request(&sim, "/v1/messages", Some(KEY_A), BODY))))
        .collect();
    wait_for(&sim, "a", |s| s.in_flight == 3).await;
    for c in &calls {
        c.abort();
    }
    wait_for(&sim, "a", |s| {
        s.in_flight == 0 && s.cancelled == 3 && s.peak_in_flight == 3
    })
    .await;
}

#[tokio::test]
async fn shutdown_releases_the_port() {
    let sim = start(Script::ok(), Script::ok()).await;
    let addr = sim.addr();
    call(&sim, "/v1/messages", Some(KEY_A), BODY).await;
    sim.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());

    let config = SimConfig::new()
        .account(
            "a",
            KEY_A,
            Script::new(Behaviour::StallBeforeHeaders(FOREVER)),
        )
        .shutdown_grace(Duration::from_millis(20));
    let sim = Sim::start(config).await.unwrap();
    let addr = sim.addr();
    let stalled = tokio::spawn(client().request(request(&sim, "/v1/messages", Some(KEY_A), BODY)));
    wait_for(&sim, "a", |s| s.in_flight == 1).await;
    drop(sim);
    // Dropping shuts down in the background; the stalled call is cut once the grace is over.
    let result = timeout(Duration::from_secs(10), stalled)
        .await
        .unwrap()
        .unwrap();
    assert!(
        result.is_err(),
        "a stalled request cannot have been answered"
    );
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// SPEC 14's simulator side: an OAuth login's access token serves until it expires,
/// then gets the real API's expired-token `401`; the token endpoint rotates refresh
/// tokens and refuses a second use of one.
#[tokio::test(start_paused = true)]
async fn oauth_access_tokens_expire_and_refresh_tokens_rotate() {
    let sim = start(Script::ok(), Script::ok()).await;
    sim.set_token_lifetime(Duration::from_millis(300));
    let tokens = sim.issue_tokens("b").unwrap();
    let (status, _, _) = call(&sim, "/v1/messages", Some(&tokens.access_token), BODY).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sim.stats("b").unwrap().requests, 1);
    tokio::time::advance(Duration::from_millis(350)).await;
    let (status, headers, body) =
        call(&sim, "/v1/messages", Some(&tokens.access_token), BODY).await;
    assert_error(status, &headers, &body, 401, "authentication_error");
    assert_eq!(
        json_of(&body)["error"]["message"],
        keypool_sim::oauth::EXPIRED_MESSAGE
    );
    let grant = |refresh: &str| {
        json!({"grant_type": "refresh_token", "refresh_token": refresh, "client_id": "x"})
            .to_string()
    };
    let (status, _, body) =
        call(&sim, "/v1/oauth/token", None, &grant(&tokens.refresh_token)).await;
    assert_eq!(status, StatusCode::OK);
    let fresh = json_of(&body);
    assert_eq!(fresh["token_type"], "Bearer");
    assert!(fresh["expires_in"].as_u64().is_some());
    let access = fresh["access_token"].as_str().unwrap();
    let (status, _, _) = call(&sim, "/v1/messages", Some(access), BODY).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) =
        call(&sim, "/v1/oauth/token", None, &grant(&tokens.refresh_token)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(json_of(&body)["error"], "invalid_grant");
    let stats = sim.oauth_stats("b").unwrap();
    assert_eq!((stats.refreshed, stats.reused), (1, 1));
    sim.shutdown().await;
}
