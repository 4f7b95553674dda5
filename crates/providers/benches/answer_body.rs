//! Checking a non-streaming answer's body (`check_answer_body`): done for every
//! non-streaming answer, so on the request path. Compared with the serde-derived parse
//! it replaced, reproduced here as the baseline.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use keypool_providers::{AnswerProblem, Endpoint, Usage, UsageUpdate, check_answer_body};
use serde::Deserialize;

/// A Messages answer as Anthropic writes it (341 bytes).
const MESSAGE: &[u8] = br#"{"id":"msg_01XFDUDYJgAACzvnptvVo","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"Hi! How can I help?"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":2095,"cache_creation_input_tokens":0,"cache_read_input_tokens":18240,"output_tokens":503,"service_tier":"standard"}}"#;

include!("support/big_message.rs");

/// The answer struct the check deserialised into before the scanner.
#[derive(Deserialize)]
struct Answer {
    #[serde(rename = "type")]
    kind: Option<String>,
    usage: Option<UsageUpdate>,
    #[allow(dead_code)]
    input_tokens: Option<u64>,
    #[allow(dead_code)]
    choices: Option<serde::de::IgnoredAny>,
}

/// The serde-derived check of a Messages answer, as it was.
fn serde_check(body: &[u8]) -> Result<Option<Usage>, AnswerProblem> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(AnswerProblem::NotJson);
    }
    let answer: Answer = serde_json::from_slice(body).map_err(|e| {
        if e.is_data() {
            AnswerProblem::NotAnAnswer
        } else {
            AnswerProblem::NotJson
        }
    })?;
    if answer.kind.as_deref() != Some("message") {
        return Err(AnswerProblem::NotAnAnswer);
    }
    Ok(answer.usage.map(|update| {
        let mut usage = Usage::default();
        update.apply_to(&mut usage);
        usage
    }))
}

fn bench(c: &mut Criterion) {
    let big = big_message(20_000);
    let mut group = c.benchmark_group("check_answer_body");
    for (name, body) in [("341B", MESSAGE), ("20KB", &big[..])] {
        assert_eq!(
            check_answer_body(Endpoint::Messages, body),
            serde_check(body)
        );
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("serde", name), body, |b, body| {
            b.iter(|| serde_check(black_box(body)))
        });
        group.bench_with_input(BenchmarkId::new("scan", name), body, |b, body| {
            b.iter(|| check_answer_body(Endpoint::Messages, black_box(body)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
