//! Reading a request body (`inspect_request`): done for every request, on bodies of up
//! to hundreds of KB from Claude Code. Compared with the serde-derived parse it
//! replaced (every other member skipped as `IgnoredAny`, the four it reads built as
//! `serde_json::Value`s), reproduced here as the baseline.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use keypool_providers::{RequestInfo, inspect_request};
use serde::Deserialize;
use serde_json::Value;

include!("support/claude_code_request.rs");

/// The request of the proxy's benchmark (97 bytes).
const SMALL: &[u8] =
    br#"{"model":"claude-sonnet-4-5","max_tokens":64,"messages":[{"role":"user","content":"Say hello."}]}"#;

/// The members the serde-derived parse built (`null` aside, which only the error
/// paths tell apart).
#[derive(Deserialize)]
struct Members {
    model: Option<Value>,
    stream: Option<Value>,
    metadata: Option<Value>,
    max_tokens: Option<Value>,
}

/// The serde-derived `inspect_request` of a valid request, as it was.
fn serde_inspect(body: &[u8]) -> Option<RequestInfo> {
    let members: Members = serde_json::from_slice(body).ok()?;
    let user_id = match members.metadata {
        Some(Value::Object(mut metadata)) => match metadata.remove("user_id") {
            Some(Value::String(user_id)) => Some(user_id),
            _ => None,
        },
        _ => None,
    };
    Some(RequestInfo {
        model: members.model?.as_str()?.to_owned(),
        stream: members.stream.and_then(|stream| stream.as_bool()) == Some(true),
        user_id,
        max_tokens: members.max_tokens.as_ref().and_then(Value::as_u64),
    })
}

fn bench(c: &mut Criterion) {
    let big = claude_code_request(100_000);
    let mut group = c.benchmark_group("inspect_request");
    for (name, body) in [("97B", SMALL), ("100KB", &big[..])] {
        assert_eq!(inspect_request(body).ok(), serde_inspect(body));
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("serde", name), body, |b, body| {
            b.iter(|| serde_inspect(black_box(body)))
        });
        group.bench_with_input(BenchmarkId::new("scan", name), body, |b, body| {
            b.iter(|| inspect_request(black_box(body)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
