//! The simulator's OpenAI wire format (issue 23) over real loopback HTTP: chat
//! completions (JSON and streams, with usage and tool calls), the model list, bearer
//! auth and OpenAI error bodies; and the tool calls of the Messages API.
#![allow(clippy::unwrap_used)] // tests may unwrap: a panic is the failure report

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keypool_sim::{
    Behaviour, ErrorReply, OkSpec, OpenAiRateLimitHeaders, SIM_MODELS, Script, Sim, SimConfig,
    SimHandle, Usage,
};
use serde_json::{Value, json};

const KEY: &str = "sk-openai-sim-a";

async fn start(script: Script) -> SimHandle {
    Sim::start(SimConfig::new().account("a", KEY, script))
        .await
        .unwrap()
}

/// How a request authenticates.
enum Auth<'a> {
    Bearer(&'a str),
    ApiKey(&'a str),
    None,
}

async fn call(
    sim: &SimHandle,
    method: Method,
    path: &str,
    auth: Auth<'_>,
    body: &Value,
) -> (StatusCode, HeaderMap, Bytes) {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("{}{path}", sim.base_url()))
        .header("content-type", "application/json");
    req = match auth {
        Auth::Bearer(key) => req.header("authorization", format!("Bearer {key}")),
        Auth::ApiKey(key) => req.header("x-api-key", key),
        Auth::None => req,
    };
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let (parts, body) = client.request(req).await.unwrap().into_parts();
    (
        parts.status,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

async fn chat(sim: &SimHandle, body: &Value) -> (StatusCode, HeaderMap, Bytes) {
    call(
        sim,
        Method::POST,
        "/v1/chat/completions",
        Auth::Bearer(KEY),
        body,
    )
    .await
}

fn json_of(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// The `data:` payloads of an OpenAI stream, `[DONE]` as a string.
fn chunks(body: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(body).unwrap();
    assert!(text.ends_with("\n\n"), "stream ends mid-frame: {text:?}");
    text.split_terminator("\n\n")
        .map(|frame| {
            let data = frame.strip_prefix("data: ").unwrap();
            assert!(!data.contains('\n'), "one data line per frame");
            if data == "[DONE]" {
                Value::from("[DONE]")
            } else {
                serde_json::from_str(data).unwrap()
            }
        })
        .collect()
}

fn ask(stream: bool) -> Value {
    json!({"model":"gpt-4o-mini","stream":stream,"messages":[{"role":"user","content":"hi"}]})
}

fn weather_tools() -> Value {
    json!([{"type":"function","function":{"name":"get_weather","parameters":{
        "type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])
}

fn assert_openai_error(status: StatusCode, body: &[u8], code: u16, kind: &str) -> Value {
    assert_eq!(status.as_u16(), code);
    let v = json_of(body);
    assert_eq!(v["error"]["type"], kind, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
    );
    assert!(v["error"].get("param").is_some() && v["error"].get("code").is_some());
    assert!(v.get("type").is_none(), "not the Anthropic shape: {v}");
    v
}

#[tokio::test]
async fn a_completion_has_the_openai_shape() {
    let usage = Usage {
        input_tokens: 10,
        output_tokens: 5,
        cache_creation_input_tokens: 2,
        cache_read_input_tokens: 30,
    };
    let sim = start(Script::new(
        OkSpec::default().text("Hi").chunks(3).usage(usage),
    ))
    .await;
    let (status, headers, body) = chat(&sim, &ask(false)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["content-type"], "application/json");
    let v = json_of(&body);
    assert_eq!(v["id"], "chatcmpl-sim00000000000000000000");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "gpt-4o-mini");
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(
        v["choices"][0],
        json!({"index":0,"message":{"role":"assistant","content":"HiHiHi","refusal":null},
            "logprobs":null,"finish_reason":"stop"})
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens":42,"completion_tokens":5,"total_tokens":47,
            "prompt_tokens_details":{"cached_tokens":30}})
    );
    assert_eq!(sim.stats("a").unwrap().requests, 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_stream_sends_chunks_usage_when_asked_and_done() {
    let sim = start(Script::new(OkSpec::default().chunks(2))).await;
    let mut body = ask(true);
    body["stream_options"] = json!({"include_usage": true});
    let (status, headers, bytes) = chat(&sim, &body).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let c = chunks(&bytes);
    assert_eq!(c.len(), 6, "{c:?}");
    assert_eq!(
        c[0]["choices"][0]["delta"],
        json!({"role":"assistant","content":""})
    );
    assert_eq!(c[1]["choices"][0]["delta"], json!({"content":"Hello"}));
    assert_eq!(c[2]["choices"][0]["delta"], json!({"content":"Hello"}));
    assert_eq!(c[3]["choices"][0]["finish_reason"], "stop");
    for chunk in &c[..4] {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["id"], c[0]["id"]);
        assert!(chunk["usage"].is_null() && chunk.get("usage").is_some());
    }
    assert_eq!(c[4]["choices"], json!([]));
    assert_eq!(c[4]["usage"]["total_tokens"], 16);
    assert_eq!(c[5], "[DONE]");

    // Without include_usage: no usage at all.
    let (_, _, bytes) = chat(&sim, &ask(true)).await;
    let c = chunks(&bytes);
    assert_eq!(c.len(), 5, "{c:?}"); // role, 2 deltas, finish, [DONE]
    assert!(c[..4].iter().all(|chunk| chunk.get("usage").is_none()));
    sim.shutdown().await;
}

#[tokio::test]
async fn tools_get_a_call_then_the_tool_result_gets_text() {
    let sim = start(Script::ok()).await;
    let mut body = ask(false);
    body["tools"] = weather_tools();
    let (status, _, bytes) = chat(&sim, &body).await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&bytes);
    let message = &v["choices"][0]["message"];
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert!(message["content"].is_null());
    let call = &message["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city":"sim"}));

    // The round trip: the tool's result comes back, the answer is text.
    body["messages"] = json!([
        {"role":"user","content":"hi"},
        {"role":"assistant","content":null,"tool_calls":[call]},
        {"role":"tool","tool_call_id":call["id"],"content":"18 C"}]);
    let v = json_of(&chat(&sim, &body).await.2);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "HelloHelloHelloHello"
    );

    // A script can turn tool calls off: text even when tools are offered.
    sim.set_default("a", OkSpec::default().tool_calls(false))
        .unwrap();
    body["messages"] = json!([{"role":"user","content":"hi"}]);
    let v = json_of(&chat(&sim, &body).await.2);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_streamed_tool_call_sends_its_arguments_in_fragments() {
    let sim = start(Script::new(OkSpec::default().chunks(3))).await;
    let mut body = ask(true);
    body["tools"] = weather_tools();
    let c = chunks(&chat(&sim, &body).await.2);
    let first = &c[1]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(first["index"], 0);
    assert_eq!(first["function"]["name"], "get_weather");
    assert_eq!(first["function"]["arguments"], "");
    assert!(first["id"].as_str().unwrap().starts_with("call_sim"));
    let fragments: Vec<&str> = c[2..5]
        .iter()
        .map(|chunk| {
            let call = &chunk["choices"][0]["delta"]["tool_calls"][0];
            assert!(call.get("id").is_none());
            call["function"]["arguments"].as_str().unwrap()
        })
        .collect();
    assert_eq!(fragments.concat(), r#"{"city":"sim"}"#);
    assert_eq!(c[5]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(c[6], "[DONE]");
    sim.shutdown().await;
}

#[tokio::test]
async fn bearer_auth_only_and_unknown_keys_get_an_openai_401() {
    let sim = start(Script::ok()).await;
    let path = "/v1/chat/completions";
    let (status, _, body) = call(
        &sim,
        Method::POST,
        path,
        Auth::Bearer("sk-nope"),
        &ask(false),
    )
    .await;
    let v = assert_openai_error(status, &body, 401, "invalid_request_error");
    assert_eq!(v["error"]["code"], "invalid_api_key");
    assert!(
        !v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-api-key")
    );
    let (status, _, body) = call(&sim, Method::POST, path, Auth::ApiKey(KEY), &ask(false)).await;
    assert_openai_error(status, &body, 401, "invalid_request_error");
    let (status, _, body) = call(&sim, Method::POST, path, Auth::None, &ask(false)).await;
    assert_openai_error(status, &body, 401, "invalid_request_error");
    assert_eq!(sim.stats("a").unwrap().requests, 0);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_scripted_429_carries_the_rate_limit_headers() {
    let limits = OpenAiRateLimitHeaders::requests_exhausted(500, "6m0s");
    let script = Script::ok().then(ErrorReply::rate_limited().openai_rate_limits(&limits));
    let sim = start(script).await;
    let (status, headers, body) = chat(&sim, &ask(false)).await;
    let v = assert_openai_error(status, &body, 429, "requests");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert_eq!(headers["x-ratelimit-limit-requests"], "500");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "0");
    assert_eq!(headers["x-ratelimit-reset-requests"], "6m0s");
    assert!(headers.get("x-ratelimit-reset-tokens").is_none());
    // The sequence is consumed: the next request succeeds, and always-headers come too.
    assert_eq!(chat(&sim, &ask(false)).await.0, StatusCode::OK);
    let tokens = OpenAiRateLimitHeaders::tokens_exhausted(30_000, "20ms");
    sim.set_script("a", Script::ok().openai_rate_limits(&tokens))
        .unwrap();
    let (status, headers, _) = chat(&sim, &ask(false)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-ratelimit-reset-tokens"], "20ms");
    sim.shutdown().await;
}

#[tokio::test]
async fn errors_and_in_band_errors_take_the_openai_shape() {
    let script = Script::ok()
        .then(Behaviour::status(500))
        .then(Behaviour::in_band_error())
        .then(Behaviour::in_band_error());
    let sim = start(script).await;
    let (status, _, body) = chat(&sim, &ask(false)).await;
    assert_openai_error(status, &body, 500, "server_error");
    let (status, _, body) = chat(&sim, &ask(false)).await;
    assert_openai_error(status, &body, 503, "server_error");
    let c = chunks(&chat(&sim, &ask(true)).await.2);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(c[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(c[1]["error"]["type"], "server_error");
    // A body without a model is refused in the OpenAI shape too.
    let (status, _, body) = chat(&sim, &json!({"messages": []})).await;
    assert_openai_error(status, &body, 400, "invalid_request_error");
    sim.shutdown().await;
}

#[tokio::test]
async fn the_model_list_needs_a_known_bearer_key() {
    let sim = start(Script::ok()).await;
    let (status, _, body) = call(
        &sim,
        Method::GET,
        "/v1/models",
        Auth::Bearer(KEY),
        &json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&body);
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["object"], "model");
            m["id"].as_str().unwrap()
        })
        .collect();
    assert_eq!(ids, SIM_MODELS);
    let (status, _, body) = call(
        &sim,
        Method::GET,
        "/openai/v1/models",
        Auth::Bearer("sk-nope"),
        &json!({}),
    )
    .await;
    assert_openai_error(status, &body, 401, "invalid_request_error");
    sim.shutdown().await;
}

#[tokio::test]
async fn messages_requests_with_tools_get_tool_use_blocks() {
    let sim = start(Script::new(OkSpec::default().chunks(2))).await;
    let tools = json!([{"name":"get_weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]);
    let ask = |stream: bool| {
        json!({"model":"claude-sonnet-4-5","max_tokens":64,"stream":stream,"tools":tools,
            "messages":[{"role":"user","content":"Weather in Paris?"}]})
    };
    let (status, _, body) = call(
        &sim,
        Method::POST,
        "/v1/messages",
        Auth::ApiKey(KEY),
        &ask(false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let v = json_of(&body);
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["content"][0]["type"], "tool_use");
    assert_eq!(v["content"][0]["name"], "get_weather");
    assert_eq!(v["content"][0]["input"], json!({"city":"sim"}));

    let (_, _, body) = call(
        &sim,
        Method::POST,
        "/v1/messages",
        Auth::ApiKey(KEY),
        &ask(true),
    )
    .await;
    let frames = messages_frames(&body);
    assert_eq!(frames[1]["content_block"]["type"], "tool_use");
    let partial: String = frames
        .iter()
        .filter(|f| f["delta"]["type"] == "input_json_delta")
        .map(|f| f["delta"]["partial_json"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(partial, r#"{"city":"sim"}"#);
    assert_eq!(frames[frames.len() - 2]["delta"]["stop_reason"], "tool_use");

    // The tool's result comes back: text.
    let mut answered = ask(false);
    answered["messages"] = json!([
        {"role":"user","content":"Weather in Paris?"},
        {"role":"assistant","content":[v["content"][0]]},
        {"role":"user","content":[{"type":"tool_result","tool_use_id":v["content"][0]["id"],"content":"18 C"}]}]);
    let (_, _, body) = call(
        &sim,
        Method::POST,
        "/v1/messages",
        Auth::ApiKey(KEY),
        &answered,
    )
    .await;
    assert_eq!(json_of(&body)["content"][0]["type"], "text");
    sim.shutdown().await;
}

/// The `data` JSON of each frame of a Messages API stream.
fn messages_frames(body: &[u8]) -> Vec<Value> {
    std::str::from_utf8(body)
        .unwrap()
        .split_terminator("\n\n")
        .map(|frame| {
            let data = frame
                .split('\n')
                .nth(1)
                .unwrap()
                .strip_prefix("data: ")
                .unwrap();
            serde_json::from_str(data).unwrap()
        })
        .collect()
}
