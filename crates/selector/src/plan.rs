//! Planning: the filter pipeline, then the group's strategy, then the hedge/race gate.

use keypool_core::{Strategy, UnixMs};
use rand::Rng;

use crate::availability::Availability;
use crate::candidate::Candidate;
use crate::error::SelectError;
use crate::filter::filter_into;
use crate::hedge::{DEFAULT_HEDGE_MIN_DELAY_MS, GateReason, HedgeBudget};
use crate::rating::{GroupSummary, RatingEngine};

/// Everything one plan depends on. Build it with [`PlanInput::new`] and the `with_*`
/// methods.
#[derive(Debug)]
pub struct PlanInput<'a, A: ?Sized> {
    /// The request's snapshot, in snapshot order ([`sort_snapshot`](crate::sort_snapshot)).
    pub snapshot: &'a [Candidate],
    /// Window and cooldown facts.
    pub availability: &'a A,
    /// The group's strategy.
    pub strategy: Strategy,
    /// The shared rating engine (read by `rated`, `hedge`, `race`, `reset_aware`).
    pub rating: &'a RatingEngine,
    /// The current time, unix ms.
    pub now: UnixMs,
    /// The group's counter value, fetched by the caller from a
    /// [`Counter`](crate::Counter) before planning; read only by `round_robin` and
    /// `weighted` (see [`needs_counter`]).
    pub counter: u64,
    /// The request is `count_tokens` (gate reason 2: never hedged).
    pub count_tokens: bool,
    /// The group's hedge budget. Every plan records one request in it; a fan-out spends
    /// one extra attempt. `None` means no budget limit (gate reason 6 never applies).
    pub hedge_budget: Option<&'a HedgeBudget>,
    /// `hedge_min_delay`: the hedge delay is never shorter (default 200 ms).
    pub hedge_min_delay_ms: u64,
}

impl<'a, A: Availability + ?Sized> PlanInput<'a, A> {
    /// An input with counter 0, not `count_tokens`, no hedge budget and the default
    /// `hedge_min_delay`.
    pub fn new(
        snapshot: &'a [Candidate],
        availability: &'a A,
        strategy: Strategy,
        rating: &'a RatingEngine,
        now: UnixMs,
    ) -> Self {
        Self {
            snapshot,
            availability,
            strategy,
            rating,
            now,
            counter: 0,
            count_tokens: false,
            hedge_budget: None,
            hedge_min_delay_ms: DEFAULT_HEDGE_MIN_DELAY_MS,
        }
    }

    /// Sets the counter value.
    pub fn with_counter(mut self, counter: u64) -> Self {
        self.counter = counter;
        self
    }

    /// Marks the request as `count_tokens` or not.
    pub fn with_count_tokens(mut self, count_tokens: bool) -> Self {
        self.count_tokens = count_tokens;
        self
    }

    /// Sets the group's hedge budget.
    pub fn with_hedge_budget(mut self, budget: &'a HedgeBudget) -> Self {
        self.hedge_budget = Some(budget);
        self
    }

    /// Sets `hedge_min_delay`.
    pub fn with_hedge_min_delay_ms(mut self, delay_ms: u64) -> Self {
        self.hedge_min_delay_ms = delay_ms;
        self
    }
}

/// Whether `strategy` reads the per-group counter (so the caller must fetch it).
pub fn needs_counter(strategy: Strategy) -> bool {
    matches!(strategy, Strategy::RoundRobin | Strategy::Weighted)
}

/// How many attempts run at once at the start of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanOut {
    /// One attempt at a time; the reason the gate gave.
    Single(GateReason),
    /// Fire `attempts[0]`; if no first chunk arrived after `delay_ms`, fire
    /// `partner` (`== attempts[1]`) too.
    Hedge {
        /// Snapshot index of the backup.
        partner: usize,
        /// max(`hedge_min_delay`, the primary's p90 TTFT).
        delay_ms: u64,
    },
    /// Fire `attempts[0]` and `partner` (`== attempts[1]`) at once.
    Race {
        /// Snapshot index of the backup.
        partner: usize,
    },
}

impl FanOut {
    /// The backup's snapshot index, for hedge and race.
    pub fn partner(&self) -> Option<usize> {
        match *self {
            FanOut::Single(_) => None,
            FanOut::Hedge { partner, .. } | FanOut::Race { partner } => Some(partner),
        }
    }

    /// The gate reason of a single-path plan.
    pub fn gate_reason(&self) -> Option<GateReason> {
        match *self {
            FanOut::Single(reason) => Some(reason),
            _ => None,
        }
    }
}

/// The ordered attempts of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Snapshot indices in the order the failover walks them; never the same index
    /// twice. For hedge/race the partner is moved to position 1, right after the
    /// primary; the rest keeps the strategy's order.
    pub attempts: Vec<usize>,
    /// Single path (with the gate reason), hedge or race.
    pub fan_out: FanOut,
    /// Every remaining account was cooling: `attempts` holds only the account whose
    /// cooldown ends first.
    pub last_resort: bool,
}

impl Plan {
    /// The first attempt's snapshot index (a plan is never empty).
    pub fn primary(&self) -> usize {
        self.attempts[0]
    }

    /// The attempts as candidates of `snapshot` (the one the plan was made from).
    pub fn candidates<'s>(
        &'s self,
        snapshot: &'s [Candidate],
    ) -> impl ExactSizeIterator<Item = &'s Candidate> + 's {
        self.attempts.iter().map(move |&i| &snapshot[i])
    }
}

/// Makes the plan for one request: filters the snapshot (SPEC 3.5), orders the
/// survivors with the strategy (SPEC 4), then applies the hedge/race gate.
///
/// Strategies:
/// - `round_robin`: the survivors rotated by `counter % n`;
/// - `priority`: the survivors in snapshot order;
/// - `weighted`: each survivor owns `weight` consecutive slots, `counter % sum(weights)`
///   picks the slot; its owner leads and the others follow in slot order;
/// - `rated`: ascending rating score, stable;
/// - `hedge`, `race`: `rated`, then the gate;
/// - `reset_aware`: planned exactly like `rated` for now; preferring the account whose
///   5-hour window resets soonest comes with the usage-window issue.
///
/// `rng` is used only to break ties between cooldown expiries.
pub fn plan<A, R>(input: &PlanInput<'_, A>, rng: &mut R) -> Result<Plan, SelectError>
where
    A: Availability + ?Sized,
    R: Rng + ?Sized,
{
    let snapshot = input.snapshot;
    let mut attempts = Vec::with_capacity(snapshot.len());
    let last_resort = filter_into(snapshot, input.availability, input.now, rng, &mut attempts)?;
    if let Some(budget) = input.hedge_budget {
        budget.record_request(input.now);
    }
    let mut summary = None;
    match input.strategy {
        Strategy::RoundRobin => {
            let start = (input.counter % attempts.len() as u64) as usize;
            attempts.rotate_left(start);
        }
        Strategy::Priority => {}
        Strategy::Weighted => {
            let start = weighted_start(snapshot, &attempts, input.counter);
            attempts.rotate_left(start);
        }
        Strategy::Rated | Strategy::Hedge | Strategy::Race | Strategy::ResetAware => {
            summary = Some(input.rating.rank(snapshot, &mut attempts, input.now));
        }
    }
    let fan_out = fan_out(input, &mut attempts, summary);
    Ok(Plan {
        attempts,
        fan_out,
        last_resort,
    })
}

/// The position (in `survivors`) of the account owning slot `counter % sum(weights)`.
fn weighted_start(snapshot: &[Candidate], survivors: &[usize], counter: u64) -> usize {
    let total: u64 = survivors
        .iter()
        .map(|&i| u64::from(snapshot[i].clamped_weight()))
        .sum();
    let mut slot = counter % total;
    for (pos, &i) in survivors.iter().enumerate() {
        let weight = u64::from(snapshot[i].clamped_weight());
        if slot < weight {
            return pos;
        }
        slot -= weight;
    }
    0
}

/// The hedge/race gate, in SPEC order. On a fan-out, moves the partner to position 1.
fn fan_out<A: ?Sized>(
    input: &PlanInput<'_, A>,
    attempts: &mut [usize],
    summary: Option<GroupSummary>,
) -> FanOut {
    let snapshot = input.snapshot;
    if !matches!(input.strategy, Strategy::Hedge | Strategy::Race) {
        return FanOut::Single(GateReason::NotHedgeStrategy);
    }
    if input.count_tokens {
        return FanOut::Single(GateReason::CountTokens);
    }
    if attempts.len() < 2 {
        return FanOut::Single(GateReason::FewerThanTwo);
    }
    let primary = &snapshot[attempts[0]];
    let Some(offset) = attempts[1..]
        .iter()
        .position(|&i| primary.can_pair_with(&snapshot[i]))
    else {
        return FanOut::Single(GateReason::NoPartner);
    };
    let Some(GroupSummary {
        has_ttft: true,
        median_ttft,
    }) = summary
    else {
        return FanOut::Single(GateReason::NoTtftData);
    };
    if input.hedge_budget.is_some_and(|b| !b.try_spend(input.now)) {
        return FanOut::Single(GateReason::BudgetSpent);
    }
    attempts[1..=offset + 1].rotate_right(1);
    let partner = attempts[1];
    if input.strategy == Strategy::Race {
        return FanOut::Race { partner };
    }
    // The primary's own p90; without recent samples, the TTFT it was ranked with.
    let primary_ttft = input
        .rating
        .p90_ttft_ms(&primary.id, input.now)
        .or_else(|| median_ttft.map(|m| m.ceil() as u64))
        .unwrap_or(0);
    FanOut::Hedge {
        partner,
        delay_ms: primary_ttft.max(input.hedge_min_delay_ms),
    }
}
