//! Reading one Anthropic answer's rate-limit headers into neutral facts: done for
//! every response, so on the request path.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::HeaderMap;
use keypool_providers::anthropic::rate_limit_facts;

const NOW: u64 = 1_700_000_000_000;

fn anthropic_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("retry-after", "17"),
        ("anthropic-ratelimit-unified-status", "allowed_warning"),
        ("anthropic-ratelimit-unified-reset", "1700018000"),
        (
            "anthropic-ratelimit-unified-representative-claim",
            "five_hour",
        ),
        ("anthropic-ratelimit-unified-5h-utilization", "0.91"),
        ("anthropic-ratelimit-unified-5h-reset", "1700018000"),
        ("anthropic-ratelimit-unified-5h-status", "allowed_warning"),
        ("anthropic-ratelimit-unified-7d-utilization", "0.4"),
        ("anthropic-ratelimit-unified-7d-reset", "1700500000"),
        ("anthropic-ratelimit-unified-7d-status", "allowed"),
        ("anthropic-ratelimit-requests-remaining", "42"),
        ("anthropic-ratelimit-requests-reset", "2023-11-14T22:14:20Z"),
    ] {
        h.insert(k, v.parse().expect("valid header value"));
    }
    h
}

fn bench(c: &mut Criterion) {
    let headers = anthropic_headers();
    c.bench_function("from_headers_anthropic_response", |b| {
        b.iter(|| rate_limit_facts(black_box(&headers), NOW))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
