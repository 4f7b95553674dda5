//! Golden tests (issue 4): per adapter, an incoming request and the exact upstream head
//! and body it becomes; per real-shaped upstream response, the metadata keypool reads.
//!
//! Fixtures live in `tests/golden/{requests,responses}/<case>/`. After an intended change
//! of behaviour, regenerate the expectations with
//! `KEYPOOL_BLESS=1 cargo test -p keypool-providers --test golden` and review the diff.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::fs;
use std::path::{Path, PathBuf};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use keypool_core::{AuthType, Provider};
use keypool_providers::{
    CommitGate, Endpoint, StreamCommit, StreamUsage, UpstreamAccount, UpstreamHeaders, Verdict,
    build_upstream_head, inspect_request, override_model, passthrough_body, rate_limits,
    response_meta,
};
use keypool_sse::Decoder;
use serde::Deserialize;
use serde_json::{Value, json};

fn cases(kind: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
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

fn header_map(pairs: &[(String, String)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

/// `name: value` lines, sorted: easy to read and diff in a fixture.
fn header_lines(headers: &UpstreamHeaders) -> Vec<String> {
    let mut pairs: Vec<String> = headers
        .iter()
        .map(|(k, v)| format!("{k}: {}", std::str::from_utf8(v).unwrap()))
        .collect();
    pairs.sort();
    pairs
}

/// Compares `actual` with the case's `expected`, or writes it when blessing.
fn check(case_dir: &Path, mut case: Value, actual: Value) {
    let path = case_dir.join("case.json");
    if blessing() {
        case["expected"] = actual;
        fs::write(&path, serde_json::to_string_pretty(&case).unwrap() + "\n").unwrap();
        return;
    }
    assert!(
        !case["expected"].is_null(),
        "{}: no expectation yet; run with KEYPOOL_BLESS=1 and review",
        path.display()
    );
    assert_eq!(
        actual,
        case["expected"],
        "{}: actual (left) differs from expected (right)",
        path.display()
    );
}

fn check_file(path: &Path, actual: &[u8]) {
    if blessing() {
        fs::write(path, actual).unwrap();
    } else {
        let expected = fs::read(path).unwrap_or_else(|_| panic!("missing {}", path.display()));
        assert_eq!(
            String::from_utf8_lossy(actual),
            String::from_utf8_lossy(&expected),
            "{}",
            path.display()
        );
    }
}

#[derive(Deserialize)]
struct RequestCase {
    account: AccountFixture,
    endpoint: String,
    model_override: Option<String>,
    request: ClientRequest,
}

#[derive(Deserialize)]
struct AccountFixture {
    provider: Provider,
    auth: AuthType,
    secret: String,
    base_url: Option<String>,
}

#[derive(Deserialize)]
struct ClientRequest {
    uri: String,
    headers: Vec<(String, String)>,
}

#[test]
fn adapters_build_the_expected_upstream_requests() {
    for dir in cases("requests") {
        let raw: Value = serde_json::from_slice(&fs::read(dir.join("case.json")).unwrap()).unwrap();
        let case: RequestCase = serde_json::from_value(raw.clone()).unwrap();
        let body = fs::read(dir.join("request.body")).unwrap();
        let client_headers = header_map(&case.request.headers);
        let client_uri: Uri = case.request.uri.parse().unwrap();
        let endpoint = match case.endpoint.as_str() {
            "messages" => Endpoint::Messages,
            "count_tokens" => Endpoint::CountTokens,
            other => panic!("unknown endpoint {other}"),
        };
        let account = UpstreamAccount {
            provider: case.account.provider,
            auth: case.account.auth,
            secret: &case.account.secret,
            base_url: case.account.base_url.as_deref(),
        };

        let info = inspect_request(&body).unwrap();
        let upstream_body = match &case.model_override {
            Some(model) => override_model(&body, model).unwrap().to_vec(),
            None => body.clone(),
        };
        let head = build_upstream_head(&client_uri, &client_headers, endpoint, &account).unwrap();

        // The invariants every case must hold, whatever the fixture says.
        for (name, value) in head.headers.iter() {
            let text = std::str::from_utf8(value).unwrap().to_ascii_lowercase();
            assert!(
                !text.contains("sk-lb-"),
                "{}: {name} carries an LB key",
                dir.display()
            );
        }
        assert!(!format!("{account:?}").contains(&case.account.secret));
        let upstream_info = inspect_request(&upstream_body).unwrap();
        assert_eq!(upstream_info.stream, info.stream);

        let actual = json!({
            "method": head.method.as_str(),
            "uri": head.uri.to_string(),
            "headers": header_lines(&head.headers),
            "stream": info.stream,
            "upstream_model": upstream_info.model,
        });
        check(&dir, raw, actual);
        check_file(&dir.join("upstream.body"), &upstream_body);
    }
}

#[derive(Deserialize)]
struct ResponseCase {
    status: u16,
    headers: Vec<(String, String)>,
    now_ms: u64,
}

/// Runs a gate over frames; describes where and how it decided.
/// The account the response fixtures were answered for (the pass-through redacts
/// what belongs to it).
fn golden_account() -> UpstreamAccount<'static> {
    UpstreamAccount {
        provider: keypool_core::Provider::Anthropic,
        auth: keypool_core::AuthType::ApiKey,
        secret: "sk-ant-api03-golden-fixture-secret",
        base_url: None,
    }
}

fn gate_outcome(mode: StreamCommit, frames: &[keypool_sse::Frame]) -> String {
    let mut gate = CommitGate::new(mode);
    for (i, frame) in frames.iter().enumerate() {
        match gate.observe(frame) {
            Verdict::Hold => {}
            Verdict::Commit => return format!("commit at frame {}", i + 1),
            Verdict::Fail(why) => return format!("fail at frame {}: {why:?}", i + 1),
        }
    }
    format!("{:?} at end of stream", gate.end_of_stream())
}

#[test]
fn responses_give_the_expected_metadata() {
    for dir in cases("responses") {
        let raw: Value = serde_json::from_slice(&fs::read(dir.join("case.json")).unwrap()).unwrap();
        let case: ResponseCase = serde_json::from_value(raw.clone()).unwrap();
        let headers = header_map(&case.headers);
        let status = StatusCode::from_u16(case.status).unwrap();
        let sse = dir.join("response.sse");
        let actual = if sse.exists() {
            let body = fs::read(&sse).unwrap();
            // Fed in 7-byte chunks, as an upstream might cut it.
            let mut decoder = Decoder::new();
            let mut frames = Vec::new();
            for chunk in body.chunks(7) {
                decoder.push(chunk);
                while let Some(frame) = decoder.next_frame().unwrap() {
                    frames.push(frame);
                }
            }
            assert_eq!(decoder.finish(), Ok(None));
            let mut usage = StreamUsage::default();
            for frame in &frames {
                usage.observe(frame);
            }
            let errors: Vec<_> = frames
                .iter()
                .filter_map(keypool_providers::stream_error)
                .collect();
            json!({
                "rate_limits": rate_limits(&headers, case.now_ms),
                "frames": frames.len(),
                "usage": usage.usage(),
                "stream_errors": errors,
                "first_content": gate_outcome(StreamCommit::FirstContent, &frames),
                "first_frame": gate_outcome(StreamCommit::FirstFrame, &frames),
            })
        } else {
            let body = fs::read(dir.join("response.json")).unwrap();
            let meta = response_meta(status, &headers, &body, case.now_ms);
            let passthrough = matches!(status.as_u16(), 429 | 402).then(|| {
                String::from_utf8(
                    passthrough_body(status, &body, Some("req_keypool"), &golden_account())
                        .to_vec(),
                )
                .unwrap()
            });
            json!({ "meta": meta, "passthrough_body": passthrough })
        };
        check(&dir, raw, actual);
    }
}
