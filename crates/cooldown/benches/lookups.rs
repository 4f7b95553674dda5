//! The per-request cost of this crate: the availability lookups the filter makes for
//! every account of a snapshot, recording a failure, and parsing a response's headers.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderMap, StatusCode};
use keypool_cooldown::headers::RateLimitInfo;
use keypool_cooldown::{AttemptFailure, PoolHealth, classify};
use keypool_core::AccountId;

const NOW: u64 = 1_700_000_000_000;
const ACCOUNTS: usize = 400;

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
    let ids: Vec<AccountId> = (0..ACCOUNTS)
        .map(|i| AccountId::from(format!("acct-{i}")))
        .collect();
    let health = PoolHealth::default();
    let headers = anthropic_headers();
    let info = RateLimitInfo::from_headers(&headers, NOW);
    let c429 = classify(
        &AttemptFailure::Status {
            status: StatusCode::TOO_MANY_REQUESTS,
            rate_limit: &info,
            marks: Default::default(),
        },
        NOW,
    );
    // Every account has window state; every fourth one is cooling.
    for (i, id) in ids.iter().enumerate() {
        health.windows.observe(id, &info, NOW);
        if i % 4 == 0 {
            health
                .cooldowns
                .record_failure(id, &c429, NOW - 1, ACCOUNTS, NOW);
        }
    }

    c.bench_function("from_headers_anthropic_response", |b| {
        b.iter(|| RateLimitInfo::from_headers(black_box(&headers), NOW))
    });
    c.bench_function("filter_lookups_400_accounts", |b| {
        b.iter(|| {
            ids.iter()
                .filter(|id| {
                    !health.disabled.is_disabled(id)
                        && health.windows.out_of_window(id, None, NOW + 1).is_none()
                        && health.cooldowns.cooldown_until(id, NOW + 1).is_none()
                })
                .count()
        })
    });
    // What the request path does instead: the signals resolved once (as a snapshot
    // does), then two atomic loads per account.
    let signals: Vec<_> = ids
        .iter()
        .map(|id| {
            (
                health.cooldowns.signal(id),
                health.windows.signal_with_threshold(id, None),
            )
        })
        .collect();
    c.bench_function("filter_signals_400_accounts", |b| {
        b.iter(|| {
            black_box(&signals)
                .iter()
                .filter(|(cooling, window)| {
                    !cooling.may_block(NOW + 1) && !window.may_block(NOW + 1)
                })
                .count()
        })
    });
    c.bench_function("observe_anthropic_headers", |b| {
        b.iter(|| health.windows.observe(black_box(&ids[2]), &info, NOW))
    });
    c.bench_function("record_failure_429", |b| {
        let mut now = NOW;
        b.iter(|| {
            now += 1;
            health
                .cooldowns
                .record_failure(&ids[1], &c429, now - 1, ACCOUNTS, now)
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
