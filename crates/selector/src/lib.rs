//! Turns a pool of upstream accounts into an ordered plan of attempts.
//!
//! keypool answers each request with one upstream account out of a pool and fails over
//! to the next when an attempt fails. This crate decides the order: it filters the
//! request's snapshot of accounts (SPEC 3.5: inactive, out of usage window, cooling),
//! orders the survivors with the group's strategy (SPEC 4: `round_robin`, `priority`,
//! `weighted`, `rated`, `hedge`, `race`) and decides whether a backup runs beside the
//! primary. It also owns the key-rating engine that `rated`, `hedge` and `race` read.
//!
//! It is pure policy: no I/O, no runtime, no clock reads. The current time
//! (`now`, unix ms) and the random number generator are arguments, window and cooldown
//! facts come in through the [`Availability`] trait, and the round-robin/weighted
//! counter value is fetched by the caller (from a [`Counter`]) before planning.
//!
//! ```
//! use keypool_core::{AuthType, Provider, Strategy};
//! use keypool_selector::{
//!     plan, sort_snapshot, Candidate, FanOut, GateReason, MemoryCounter, PlanInput,
//!     RatingEngine, Sample, StaticAvailability,
//! };
//! use rand::SeedableRng;
//!
//! let mut snapshot: Vec<Candidate> = ["a", "b", "c"]
//!     .into_iter()
//!     .map(|id| Candidate::new(id, Provider::Anthropic, AuthType::ApiKey))
//!     .collect();
//! sort_snapshot(&mut snapshot);
//! let mut availability = StaticAvailability::new();
//! availability.cool_until("b".into(), 60_000); // b cools for a minute
//! let rating = RatingEngine::new();
//! let counter = MemoryCounter::new();
//! let mut rng = rand::rngs::StdRng::seed_from_u64(1);
//! let now = 1_000;
//!
//! // round_robin: the caller fetches the group's counter, then plans.
//! let input = PlanInput::new(&snapshot, &availability, Strategy::RoundRobin, &rating, now)
//!     .with_counter(counter.next_value("group-1"));
//! let p = plan(&input, &mut rng).unwrap();
//! let ids: Vec<&str> = p.candidates(&snapshot).map(|c| c.id.as_str()).collect();
//! assert_eq!(ids, ["a", "c"]);
//! assert_eq!(p.fan_out, FanOut::Single(GateReason::NotHedgeStrategy));
//!
//! // rated: report outcomes, the faster account goes first.
//! rating.record(&snapshot[0].id, Sample::Success { ttft_ms: 900, total_ms: 4_000 }, now);
//! rating.record(&snapshot[2].id, Sample::Success { ttft_ms: 300, total_ms: 2_000 }, now);
//! let input = PlanInput::new(&snapshot, &availability, Strategy::Rated, &rating, now);
//! let p = plan(&input, &mut rng).unwrap();
//! let ids: Vec<&str> = p.candidates(&snapshot).map(|c| c.id.as_str()).collect();
//! assert_eq!(ids, ["c", "a"]);
//! ```
//!
//! # Layout
//! - `candidate`: [`Candidate`], [`sort_snapshot`] and the snapshot order.
//! - `availability`: the [`Availability`] trait, [`AlwaysAvailable`], [`StaticAvailability`].
//! - `filter`: the SPEC 3.5 pipeline ([`filter_snapshot`]) and
//!   [`pick_earliest_cooldown_expiry`].
//! - `counter`: the [`Counter`] trait and [`MemoryCounter`].
//! - `rating`: the [`RatingEngine`], its [`Sample`]s, weights and export/import types.
//! - `hedge`: the gate's [`GateReason`]s and the [`HedgeBudget`].
//! - `plan`: [`plan`], its [`PlanInput`] (including the session-affinity `prefer`) and
//!   the resulting [`Plan`].
//! - `error`: [`SelectError`].

mod availability;
mod candidate;
mod counter;
mod error;
mod filter;
mod hash;
mod hedge;
mod plan;
mod rating;
mod routing;

pub use availability::{
    AccountStatus, AlwaysAvailable, Availability, StaticAvailability, WindowBlock,
};
pub use candidate::{Candidate, MAX_WEIGHT, MIN_WEIGHT, snapshot_order, sort_snapshot};
pub use counter::{Counter, MemoryCounter};
pub use error::{SelectError, window_name};
pub use filter::{Survivors, filter_snapshot, pick_earliest_cooldown_expiry};
pub use hedge::{DEFAULT_HEDGE_BUDGET, DEFAULT_HEDGE_MIN_DELAY_MS, GateReason, HedgeBudget};
pub use plan::{
    FanOut, KeepableSurvivors, Plan, PlanInput, needs_counter, plan, survivors_to_keep,
};
pub use rating::{
    AccountRating, AccountRatingState, DEFAULT_EWMA_ALPHA, DEFAULT_MAX_SAMPLE_AGE_MS, EwmaState,
    RECENT_TTFT_SAMPLES, RatingConfig, RatingEngine, RatingState, RatingWeights, Sample,
    TtftSample,
};
pub use routing::ModelChain;
