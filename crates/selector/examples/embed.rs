//! Embedding `keypool-selector` in another Rust service, without the rest of keypool.
//!
//! Builds a small pool, plans a request with a few strategies, reports outcomes to the
//! rating engine, and plans again. Run it with
//! `cargo run -p keypool-selector --example embed`.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use keypool_core::{AuthType, Provider, Strategy, UnixMs, Window};
use keypool_selector::{
    Candidate, Counter, FanOut, HedgeBudget, MemoryCounter, Plan, PlanInput, RatingEngine, Sample,
    SelectError, StaticAvailability, needs_counter, plan, sort_snapshot,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

/// `MemoryCounter`'s futures are ready at once; a Redis-backed counter would be awaited
/// on the service's runtime instead.
fn ready<F: Future>(future: F) -> F::Output {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(future).poll(&mut cx) {
        Poll::Ready(value) => value,
        Poll::Pending => unreachable!("MemoryCounter never waits"),
    }
}

fn account(id: &str, base_url: Option<&str>, priority: i32, weight: u8) -> Candidate {
    Candidate {
        base_url: base_url.map(Arc::from),
        priority,
        weight,
        ..Candidate::new(id, Provider::Anthropic, AuthType::ApiKey)
    }
}

fn show(label: &str, snapshot: &[Candidate], result: &Result<Plan, SelectError>) {
    match result {
        Ok(p) => {
            let ids: Vec<&str> = p.candidates(snapshot).map(|c| c.id.as_str()).collect();
            let fan_out = match p.fan_out {
                FanOut::Single(reason) => format!("single path ({reason})"),
                FanOut::Hedge { partner, delay_ms } => {
                    format!("hedge with {} after {delay_ms} ms", snapshot[partner].id)
                }
                FanOut::Race { partner } => format!("race with {}", snapshot[partner].id),
            };
            let last_resort = if p.last_resort { ", last resort" } else { "" };
            println!("{label:<28} {ids:?}  {fan_out}{last_resort}");
        }
        Err(e) => println!("{label:<28} error: {e}"),
    }
}

fn main() {
    let mut snapshot = vec![
        account("eu-primary", Some("https://eu.example"), 0, 3),
        account("us-primary", None, 0, 2),
        account("us-backup", None, 1, 1),
        account("eu-backup", Some("https://eu.example"), 1, 1),
    ];
    sort_snapshot(&mut snapshot);

    let mut availability = StaticAvailability::new();
    let rating = RatingEngine::new();
    let counter = MemoryCounter::new();
    let budget = HedgeBudget::default();
    let mut rng = StdRng::seed_from_u64(42);
    let mut now: UnixMs = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    let plan_with =
        |strategy: Strategy, availability: &StaticAvailability, now: UnixMs, rng: &mut StdRng| {
            // Fetch the counter first (it may be async), only when the strategy reads it.
            let value = if needs_counter(strategy) {
                ready(counter.next("team-a"))
            } else {
                0
            };
            let input = PlanInput::new(&snapshot, availability, strategy, &rating, now)
                .with_counter(value)
                .with_hedge_budget(&budget);
            plan(&input, rng)
        };

    println!("-- a fresh pool, no samples yet");
    for strategy in [
        Strategy::RoundRobin,
        Strategy::RoundRobin,
        Strategy::Weighted,
    ] {
        let p = plan_with(strategy, &availability, now, &mut rng);
        show(strategy.as_str(), &snapshot, &p);
    }
    let p = plan_with(Strategy::Hedge, &availability, now, &mut rng);
    show("hedge", &snapshot, &p);

    println!("-- after reporting outcomes");
    let outcomes = [
        (
            "eu-primary",
            Sample::Success {
                ttft_ms: 420,
                total_ms: 3_100,
            },
        ),
        (
            "eu-primary",
            Sample::Success {
                ttft_ms: 380,
                total_ms: 2_900,
            },
        ),
        (
            "us-primary",
            Sample::Success {
                ttft_ms: 650,
                total_ms: 4_000,
            },
        ),
        ("us-primary", Sample::Failure),
        (
            "us-backup",
            Sample::Success {
                ttft_ms: 900,
                total_ms: 5_200,
            },
        ),
        ("eu-backup", Sample::RequestError), // the request's fault: not counted
    ];
    for (id, sample) in outcomes {
        rating.record(&id.into(), sample, now);
    }
    // The hedge budget allows 10 % extra attempts: warm it up with some requests.
    for _ in 0..20 {
        budget.record_request(now);
    }
    for strategy in [Strategy::Rated, Strategy::Hedge, Strategy::Race] {
        let p = plan_with(strategy, &availability, now, &mut rng);
        show(strategy.as_str(), &snapshot, &p);
    }
    let ids: Vec<String> = snapshot.iter().map(|c| c.id.to_string()).collect();
    for (id, score) in ids.iter().zip(rating.scores(&snapshot, now)) {
        println!("   score {id:<12} {score:>8.1}");
    }

    println!("-- eu-primary cools for 60 s, us-backup is out of its 5h window");
    availability.cool_until("eu-primary".into(), now + 60_000);
    availability.block_window("us-backup".into(), Window::FiveHour, now + 3_600_000);
    let p = plan_with(Strategy::Rated, &availability, now, &mut rng);
    show("rated", &snapshot, &p);

    println!("-- everything else cools too: the earliest expiry is the last resort");
    availability.cool_until("us-primary".into(), now + 30_000);
    availability.cool_until("eu-backup".into(), now + 90_000);
    let p = plan_with(Strategy::Rated, &availability, now, &mut rng);
    show("rated", &snapshot, &p);

    println!("-- every account out of its window: the proxy answers 429");
    for c in &snapshot {
        availability.clear(&c.id);
        availability.block_window(c.id.clone(), Window::Weekly, now + 7_200_500);
    }
    let p = plan_with(Strategy::RoundRobin, &availability, now, &mut rng);
    show("round_robin", &snapshot, &p);

    println!("-- two hours later the windows have reset");
    now += 7_201_000;
    let p = plan_with(Strategy::Priority, &availability, now, &mut rng);
    show("priority", &snapshot, &p);
}
