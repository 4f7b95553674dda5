//! Golden tests of the OpenAI Chat Completions translation (issue 23), both ways, and
//! property tests of the stream translator.
//!
//! Fixtures live in `tests/golden/openai/{requests,responses,streams}/<case>/`: the
//! input (`chat.json`, `message.json`, `upstream.sse` with `case.json`) and the expected
//! output (`expected.json`, `chat_completion.json`, `chat.sse`). After an intended change
//! of behaviour, regenerate the expectations with
//! `KEYPOOL_BLESS=1 cargo test -p keypool-providers --test openai` and review the diff.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::fs;
use std::path::{Path, PathBuf};

use bytes::BytesMut;
use http::StatusCode;
use keypool_providers::ErrorType;
use keypool_providers::openai::{
    ChatStream, ChatStreamOptions, DONE_FRAME, chat_to_messages, error_body, error_from_anthropic,
    invalid_request_body, message_to_chat_completion, overloaded_error_frame, translate_stream,
};
use proptest::prelude::*;
use serde_json::{Value, json};

fn cases(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/openai")
        .join(kind);
    let mut cases: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    cases.sort();
    assert!(!cases.is_empty(), "no fixtures in {}", dir.display());
    cases
}

fn blessing() -> bool {
    std::env::var_os("KEYPOOL_BLESS").is_some()
}

/// Compares `actual` with the JSON in `path` (as values: key order does not matter), or
/// writes it when blessing.
fn check_json(path: &Path, actual: &Value) {
    if blessing() {
        fs::write(path, serde_json::to_string_pretty(actual).unwrap() + "\n").unwrap();
        return;
    }
    let expected: Value = serde_json::from_slice(
        &fs::read(path).unwrap_or_else(|_| panic!("missing {}; bless and review", path.display())),
    )
    .unwrap();
    assert_eq!(
        actual,
        &expected,
        "{}: actual (left) differs from expected (right)",
        path.display()
    );
}

fn check_text(path: &Path, actual: &[u8]) {
    if blessing() {
        fs::write(path, actual).unwrap();
        return;
    }
    let expected =
        fs::read(path).unwrap_or_else(|_| panic!("missing {}; bless and review", path.display()));
    assert_eq!(
        String::from_utf8_lossy(actual),
        String::from_utf8_lossy(&expected),
        "{}",
        path.display()
    );
}

#[test]
fn chat_requests_become_the_expected_messages_requests() {
    for dir in cases("requests") {
        let body = fs::read(dir.join("chat.json")).unwrap();
        let actual = match chat_to_messages(&body) {
            Ok(request) => {
                // The translated body is itself a valid Messages request for the adapters.
                let info = keypool_providers::inspect_request(&request.body).unwrap();
                assert_eq!(info.model, request.model, "{}", dir.display());
                assert_eq!(info.stream, request.stream, "{}", dir.display());
                json!({
                    "model": request.model,
                    "stream": request.stream,
                    "include_usage": request.include_usage,
                    "messages_request": serde_json::from_slice::<Value>(&request.body).unwrap(),
                })
            }
            Err(error) => {
                assert!(error.is_client_error(), "{}: {error}", dir.display());
                json!({
                    "status": 400,
                    "error": serde_json::from_slice::<Value>(&invalid_request_body(&error)).unwrap(),
                })
            }
        };
        check_json(&dir.join("expected.json"), &actual);
    }
}

#[test]
fn messages_become_the_expected_chat_completions() {
    for dir in cases("responses") {
        let body = fs::read(dir.join("message.json")).unwrap();
        let completion = message_to_chat_completion(&body, 1_700_000_000).unwrap();
        let actual: Value = serde_json::from_slice(&completion).unwrap();
        check_json(&dir.join("chat_completion.json"), &actual);
    }
}

#[derive(serde::Deserialize)]
struct StreamCase {
    created: u64,
    include_usage: bool,
}

/// Every frame the translator writes: `data: <JSON>` or `data: [DONE]`, each ended by a
/// blank line; nothing after `[DONE]` or an error frame.
fn assert_well_formed(output: &[u8]) {
    let frames = keypool_sse::decode_all(output).unwrap();
    for (i, frame) in frames.iter().enumerate() {
        let data = frame.data().expect("a data field");
        let last = i + 1 == frames.len();
        if &data[..] == b"[DONE]" {
            assert!(last, "[DONE] is the last frame");
            continue;
        }
        let value: Value = serde_json::from_slice(&data).unwrap();
        if value.get("error").is_some() {
            assert!(last, "an error frame is the last frame");
        } else {
            assert_eq!(value["object"], "chat.completion.chunk");
        }
    }
}

#[test]
fn streams_become_the_expected_chunk_streams() {
    for dir in cases("streams") {
        let case: StreamCase =
            serde_json::from_slice(&fs::read(dir.join("case.json")).unwrap()).unwrap();
        let options = ChatStreamOptions {
            created: case.created,
            include_usage: case.include_usage,
        };
        let upstream = fs::read(dir.join("upstream.sse")).unwrap();
        let whole = translate_stream(&upstream, options);
        // Fed in 7-byte chunks, as an upstream might cut it: the same output.
        let mut stream = ChatStream::new(options);
        let mut out = BytesMut::new();
        for chunk in upstream.chunks(7) {
            stream.push_bytes(chunk, &mut out).unwrap();
        }
        stream.finish(&mut out);
        assert_eq!(out.freeze(), whole, "{}", dir.display());
        assert_well_formed(&whole);
        check_text(&dir.join("chat.sse"), &whole);
    }
}

#[test]
fn anthropic_errors_take_the_openai_shape() {
    let anthropic = |kind: &str, message: &str| {
        format!(
            r#"{{"type":"error","error":{{"type":"{kind}","message":"{message}"}},"request_id":"req_1"}}"#
        )
    };
    let cases = [
        (
            401,
            "authentication_error",
            "authentication_error",
            json!("invalid_api_key"),
            401,
        ),
        (
            429,
            "rate_limit_error",
            "rate_limit_error",
            json!("rate_limit_exceeded"),
            429,
        ),
        (
            402,
            "billing_error",
            "insufficient_quota",
            json!("insufficient_quota"),
            402,
        ),
        (
            403,
            "permission_error",
            "permission_error",
            Value::Null,
            403,
        ),
        (
            404,
            "not_found_error",
            "invalid_request_error",
            json!("not_found"),
            404,
        ),
        (
            400,
            "invalid_request_error",
            "invalid_request_error",
            Value::Null,
            400,
        ),
        (
            529,
            "overloaded_error",
            "server_error",
            json!("overloaded"),
            503,
        ),
        (
            503,
            "overloaded_error",
            "server_error",
            json!("overloaded"),
            503,
        ),
        (500, "api_error", "server_error", Value::Null, 500),
        (504, "timeout_error", "server_error", json!("timeout"), 504),
    ];
    for (status, kind, openai_kind, code, openai_status) in cases {
        let body = anthropic(kind, "the text");
        let (answer_status, answer) =
            error_from_anthropic(StatusCode::from_u16(status).unwrap(), body.as_bytes());
        assert_eq!(answer_status.as_u16(), openai_status, "{kind}");
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(
            answer,
            json!({"error": {"message": "the text", "type": openai_kind, "param": null, "code": code}}),
            "{kind}"
        );
    }
}

#[test]
fn bodies_without_a_type_and_keypools_own_errors_take_the_openai_shape() {
    // No Anthropic body: the status decides, its reason is the message.
    let (status, body) = error_from_anthropic(StatusCode::TOO_MANY_REQUESTS, b"not json");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(body["error"]["message"], "Too Many Requests");
    // keypool's own errors, from their Anthropic type.
    let own: Value =
        serde_json::from_slice(&error_body(ErrorType::Authentication, "invalid key", None))
            .unwrap();
    assert_eq!(own["error"]["code"], "invalid_api_key");
    assert_eq!(
        &overloaded_error_frame()[..],
        &b"data: {\"error\":{\"message\":\"Overloaded\",\"type\":\"server_error\",\"param\":null,\"code\":\"overloaded\"}}\n\n"[..]
    );
}

/// One Anthropic event with arbitrary parameters, or a frame of garbage.
fn arbitrary_frame() -> impl Strategy<Value = String> {
    let text = "\\PC{0,12}";
    let index = 0u64..4;
    prop_oneof![
        (text, text).prop_map(|(id, model)| frame(
            "message_start",
            json!({"type":"message_start","message":{"id":id,"model":model,"usage":{"input_tokens":3,"output_tokens":1}}})
        )),
        (index.clone(), text, text).prop_map(|(i, id, name)| frame(
            "content_block_start",
            json!({"type":"content_block_start","index":i,"content_block":{"type":"tool_use","id":id,"name":name,"input":{}}})
        )),
        index.clone().prop_map(|i| frame(
            "content_block_start",
            json!({"type":"content_block_start","index":i,"content_block":{"type":"text","text":""}})
        )),
        (index.clone(), text).prop_map(|(i, t)| frame(
            "content_block_delta",
            json!({"type":"content_block_delta","index":i,"delta":{"type":"text_delta","text":t}})
        )),
        (index.clone(), text).prop_map(|(i, t)| frame(
            "content_block_delta",
            json!({"type":"content_block_delta","index":i,"delta":{"type":"input_json_delta","partial_json":t}})
        )),
        index.prop_map(|i| frame("content_block_stop", json!({"type":"content_block_stop","index":i}))),
        (prop::option::of("[a-z_]{0,12}"), any::<u32>()).prop_map(|(reason, n)| frame(
            "message_delta",
            json!({"type":"message_delta","delta":{"stop_reason":reason},"usage":{"output_tokens":n}})
        )),
        Just(frame("message_stop", json!({"type":"message_stop"}))),
        Just(frame("ping", json!({"type":"ping"}))),
        text.prop_map(|m| frame(
            "error",
            json!({"type":"error","error":{"type":"overloaded_error","message":m}})
        )),
        "[a-z_]{1,10}".prop_map(|e| format!("event: {e}\ndata: {{\"type\":{}}}\n\n", json!(e))),
        "[^\r\n]{0,20}".prop_map(|garbage| format!("data: {garbage}\n\n")),
        Just(": keep-alive\n\n".to_owned()),
    ]
}

fn frame(event: &str, data: Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// A well-formed stream's start, so that generated sequences reach the open state.
fn opening() -> String {
    frame(
        "message_start",
        json!({"type":"message_start","message":{"id":"msg_p","model":"m","usage":{"input_tokens":1}}}),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_event_sequence_translates_without_panicking(
        frames in prop::collection::vec(arbitrary_frame(), 0..24),
        open in any::<bool>(),
        include_usage in any::<bool>(),
    ) {
        let mut upstream = if open { opening() } else { String::new() };
        upstream.extend(frames);
        let output = translate_stream(upstream.as_bytes(), ChatStreamOptions { created: 1, include_usage });
        assert_well_formed(&output);
        // Every stream ends, with [DONE] or an error frame.
        let ends_well = output.ends_with(DONE_FRAME) || output.ends_with(b"}}\n\n");
        prop_assert!(ends_well);
    }

    #[test]
    fn any_chunking_gives_the_same_output(
        frames in prop::collection::vec(arbitrary_frame(), 0..16),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        include_usage in any::<bool>(),
    ) {
        let mut upstream = opening();
        upstream.extend(frames);
        let bytes = upstream.as_bytes();
        let options = ChatStreamOptions { created: 5, include_usage };
        let whole = translate_stream(bytes, options);
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
        points.sort_unstable();
        let mut stream = ChatStream::new(options);
        let mut out = BytesMut::new();
        let mut from = 0;
        for at in points.into_iter().chain([bytes.len()]) {
            stream.push_bytes(&bytes[from..at], &mut out).unwrap();
            from = at;
        }
        stream.finish(&mut out);
        prop_assert_eq!(out.freeze(), whole);
    }

    #[test]
    fn any_json_request_translates_or_is_a_client_error(
        body in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        if let Err(error) = chat_to_messages(&body) {
            prop_assert!(error.is_client_error());
        }
    }
}

/// One chat message of a generated conversation: (role, text, tool calls it makes).
fn arbitrary_message() -> impl Strategy<Value = Value> {
    let text = "[a-zA-Z0-9 ]{0,12}";
    prop_oneof![
        text.prop_map(|t| json!({"role":"system","content":t})),
        text.prop_map(|t| json!({"role":"developer","content":[{"type":"text","text":t}]})),
        text.prop_map(|t| json!({"role":"user","content":t})),
        (text, 0usize..3).prop_map(|(t, calls)| {
            let calls: Vec<Value> = (0..calls)
                .map(|i| {
                    json!({"id":format!("call_{i}"),"type":"function",
                    "function":{"name":"f","arguments":format!("{{\"n\":{i}}}")}})
                })
                .collect();
            json!({"role":"assistant","content":t,"tool_calls":calls})
        }),
        text.prop_map(|t| json!({"role":"tool","tool_call_id":"call_0","content":t})),
    ]
}

proptest! {
    #[test]
    fn conversations_keep_every_part_and_alternate_turns(
        messages in prop::collection::vec(arbitrary_message(), 0..12),
    ) {
        let request = json!({"model":"m","messages":messages});
        let out = chat_to_messages(request.to_string().as_bytes()).unwrap();
        let body: Value = serde_json::from_slice(&out.body).unwrap();
        let turns = body["messages"].as_array().unwrap();
        // Consecutive messages of one Anthropic role share a turn.
        for pair in turns.windows(2) {
            prop_assert_ne!(&pair[0]["role"], &pair[1]["role"]);
        }
        let blocks = |kind: &str| {
            turns
                .iter()
                .flat_map(|t| t["content"].as_array().unwrap())
                .filter(|b| b["type"] == kind)
                .count()
        };
        let count = |role: &str| messages.iter().filter(|m| m["role"] == role).count();
        let calls: usize = messages
            .iter()
            .filter_map(|m| m["tool_calls"].as_array())
            .map(Vec::len)
            .sum();
        prop_assert_eq!(blocks("tool_use"), calls);
        prop_assert_eq!(blocks("tool_result"), count("tool"));
        let system_texts = messages
            .iter()
            .filter(|m| m["role"] == "system" || m["role"] == "developer")
            .filter(|m| m["content"] != "" && m["content"][0]["text"] != "")
            .count();
        let system = body.get("system").and_then(Value::as_array).map_or(0, Vec::len);
        prop_assert_eq!(system, system_texts);
        prop_assert!(keypool_providers::inspect_request(&out.body).is_ok());
    }
}
