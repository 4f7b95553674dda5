//! Planning cost per strategy for pools of 10, 100, 1,000 and 10,000 accounts.
//!
//! The pool is realistic rather than ideal: two providers, three base URLs, mixed
//! priorities and weights, 5 % of the accounts cooling and 2 % out of their window
//! (looked up in a [`StaticAvailability`] map), rating samples for 90 % of the accounts,
//! and a hedge budget. Run with
//! `cargo bench -p keypool-selector --bench plan -- --warm-up-time 1 --measurement-time 2`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use keypool_core::{AuthType, Provider, Strategy, UnixMs, Window};
use keypool_selector::{
    AlwaysAvailable, Candidate, HedgeBudget, PlanInput, RatingEngine, Sample, StaticAvailability,
    plan, sort_snapshot,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const NOW: UnixMs = 1_767_225_600_000;
const SIZES: [usize; 4] = [10, 100, 1_000, 10_000];
const STRATEGIES: [Strategy; 6] = [
    Strategy::RoundRobin,
    Strategy::Priority,
    Strategy::Weighted,
    Strategy::Rated,
    Strategy::Hedge,
    Strategy::Race,
];

struct Fixture {
    snapshot: Vec<Candidate>,
    availability: StaticAvailability,
    rating: RatingEngine,
    budget: HedgeBudget,
}

fn fixture(n: usize) -> Fixture {
    let mut rng = SmallRng::seed_from_u64(n as u64);
    let urls: [Option<Arc<str>>; 3] = [
        None,
        Some("https://a.example".into()),
        Some("https://b.example".into()),
    ];
    let mut snapshot: Vec<Candidate> = (0..n)
        .map(|i| Candidate {
            base_url: urls[i % 3].clone(),
            priority: rng.random_range(0..3),
            weight: rng.random_range(1..=100),
            last_used: NOW - rng.random_range(0..3_600_000),
            ..Candidate::new(
                format!("org-1/account-{i:05}"),
                if i % 5 == 0 {
                    Provider::AnthropicCompatible
                } else {
                    Provider::Anthropic
                },
                if i % 2 == 0 {
                    AuthType::OAuth
                } else {
                    AuthType::ApiKey
                },
            )
        })
        .collect();
    sort_snapshot(&mut snapshot);
    let mut availability = StaticAvailability::new();
    let rating = RatingEngine::new();
    for c in &snapshot {
        let roll = rng.random_range(0..100);
        if roll < 5 {
            availability.cool_until(c.id.clone(), NOW + 30_000);
        } else if roll < 7 {
            availability.block_window(c.id.clone(), Window::FiveHour, NOW + 3_600_000);
        }
        if rng.random_range(0..10) < 9 {
            for _ in 0..4 {
                let ttft_ms = rng.random_range(200..3_000);
                let sample = if rng.random_range(0..20) == 0 {
                    Sample::Failure
                } else {
                    Sample::Success {
                        ttft_ms,
                        total_ms: ttft_ms * 6,
                    }
                };
                rating.record(&c.id, sample, NOW - rng.random_range(0..60_000));
            }
        }
    }
    Fixture {
        snapshot,
        availability,
        rating,
        budget: HedgeBudget::default(),
    }
}

fn bench_plan(c: &mut Criterion) {
    for n in SIZES {
        let f = fixture(n);
        let mut group = c.benchmark_group(format!("plan/{n}"));
        for strategy in STRATEGIES {
            group.bench_with_input(
                BenchmarkId::from_parameter(strategy.as_str()),
                &strategy,
                |b, &strategy| {
                    let mut rng = SmallRng::seed_from_u64(1);
                    let mut counter = 0u64;
                    b.iter(|| {
                        counter += 1;
                        let input =
                            PlanInput::new(&f.snapshot, &f.availability, strategy, &f.rating, NOW)
                                .with_counter(counter)
                                .with_hedge_budget(&f.budget);
                        black_box(plan(black_box(&input), &mut rng))
                    });
                },
            );
        }
        group.finish();
    }
}

/// The planner's own cost at 1,000 accounts: the same pool without availability facts
/// ([`AlwaysAvailable`]), so no map lookup per account.
fn bench_plan_without_facts(c: &mut Criterion) {
    let f = fixture(1_000);
    let mut group = c.benchmark_group("plan_without_facts/1000");
    for strategy in STRATEGIES {
        group.bench_with_input(
            BenchmarkId::from_parameter(strategy.as_str()),
            &strategy,
            |b, &strategy| {
                let mut rng = SmallRng::seed_from_u64(1);
                let mut counter = 0u64;
                b.iter(|| {
                    counter += 1;
                    let input =
                        PlanInput::new(&f.snapshot, &AlwaysAvailable, strategy, &f.rating, NOW)
                            .with_counter(counter)
                            .with_hedge_budget(&f.budget);
                    black_box(plan(black_box(&input), &mut rng))
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bench_plan, bench_plan_without_facts);
criterion_main!(benches);
