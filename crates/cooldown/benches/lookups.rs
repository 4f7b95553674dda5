//! The per-request cost of this crate: the availability lookups the filter makes for
//! every account of a snapshot, recording a failure, and observing a response's facts
//! (reading them from headers is `keypool-providers`' bench).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::StatusCode;
use keypool_cooldown::facts::{RateLimitInfo, UnifiedStatus, WindowUsage};
use keypool_cooldown::{AttemptFailure, PoolHealth, classify};
use keypool_core::AccountId;

const NOW: u64 = 1_700_000_000_000;
const ACCOUNTS: usize = 400;

/// The facts of a typical Anthropic answer (what the adapter reads from its headers).
fn anthropic_facts() -> RateLimitInfo {
    let window = |utilization, reset, status| WindowUsage {
        utilization: Some(utilization),
        reset: Some(reset),
        status: Some(status),
    };
    RateLimitInfo {
        retry_after_ms: Some(17_000),
        unified_status: Some(UnifiedStatus::AllowedWarning),
        unified_reset: Some(1_700_018_000_000),
        representative_claim: Some("five_hour".into()),
        five_hour: window(0.91, 1_700_018_000_000, UnifiedStatus::AllowedWarning),
        seven_day: window(0.4, 1_700_500_000_000, UnifiedStatus::Allowed),
        requests_remaining: Some(42),
        requests_reset: Some(1_700_000_060_000),
        ..RateLimitInfo::default()
    }
}

fn bench(c: &mut Criterion) {
    let ids: Vec<AccountId> = (0..ACCOUNTS)
        .map(|i| AccountId::from(format!("acct-{i}")))
        .collect();
    let health = PoolHealth::default();
    let info = anthropic_facts();
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
