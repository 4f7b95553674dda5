//! Planning: the filter pipeline, then the group's strategy, then the hedge/race gate.

use std::sync::Arc;

use keypool_core::{Strategy, UnixMs};
use rand::Rng;

use rand::SeedableRng;

use crate::availability::{AccountStatus, Availability};
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
    /// A snapshot index to try first whatever the strategy (session affinity), if that
    /// account survives the filters. `None`, an index out of range or a filtered-out
    /// account leaves the strategy's order unchanged.
    pub prefer: Option<usize>,
    /// The filters' survivors for this snapshot at `now`, computed earlier
    /// ([`filter_snapshot`](crate::filter_snapshot), not a last-resort pick): planning
    /// then skips the filters. In snapshot order, or in rotation order for
    /// `round_robin`. A caller that keeps them must drop them when any fact they came
    /// from changes (an account's window or cooldown, or a block's expiry passing).
    pub survivors: Option<&'a Arc<[usize]>>,
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
            prefer: None,
            survivors: None,
        }
    }

    /// Plans from `survivors` instead of running the filters (see
    /// [`PlanInput::survivors`]).
    pub fn with_survivors(mut self, survivors: &'a Arc<[usize]>) -> Self {
        self.survivors = Some(survivors);
        self
    }

    /// Tries snapshot index `index` first if it survives the filters (see
    /// [`PlanInput::prefer`]).
    pub fn with_prefer(mut self, index: usize) -> Self {
        self.prefer = Some(index);
        self
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
#[derive(Debug, Clone)]
pub struct Plan {
    /// Snapshot indices in the order the failover walks them ([`Plan::get`]); never the
    /// same index twice. For hedge/race the partner is moved to position 1, right after
    /// the primary; the rest keeps the strategy's order.
    order: Order,
    /// Single path (with the gate reason), hedge or race.
    pub fan_out: FanOut,
    /// Every remaining account was cooling: the plan holds only the account whose
    /// cooldown ends first.
    pub last_resort: bool,
}

/// How a plan holds its order.
#[derive(Debug, Clone)]
enum Order {
    /// The indices, in order.
    Listed(Vec<usize>),
    /// A round robin over kept survivors: `ring` (in rotation order) from `start`,
    /// wrapping, and with `first = (index, at)` that index (the preferred account, at
    /// position `at` of the rotation) moved to the front. Not copied: a pool of 1,000
    /// accounts would otherwise copy its whole rotation for every request.
    Rotated {
        ring: Arc<[usize]>,
        start: usize,
        first: Option<(usize, usize)>,
    },
}

impl Plan {
    /// The first attempt's snapshot index (a plan is never empty).
    pub fn primary(&self) -> usize {
        self.get(0).unwrap_or_default()
    }

    /// How many attempts the plan holds.
    pub fn len(&self) -> usize {
        match &self.order {
            Order::Listed(v) => v.len(),
            Order::Rotated { ring, .. } => ring.len(),
        }
    }

    /// Whether the plan holds no attempt (never, for a plan [`plan`] made).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The snapshot index of attempt `position`.
    pub fn get(&self, position: usize) -> Option<usize> {
        match &self.order {
            Order::Listed(v) => v.get(position).copied(),
            Order::Rotated { ring, start, first } => {
                let n = ring.len();
                if position >= n {
                    return None;
                }
                let k = match *first {
                    None => position,
                    Some((index, _)) if position == 0 => return Some(index),
                    // The rotation without the preferred account, which went first.
                    Some((_, at)) if position - 1 < at => position - 1,
                    Some(_) => position,
                };
                Some(ring[(start + k) % n])
            }
        }
    }

    /// The snapshot indices in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = usize> + '_ {
        (0..self.len()).map(|position| self.get(position).unwrap_or_default())
    }

    /// The snapshot indices in order, as a list.
    pub fn attempts(&self) -> Vec<usize> {
        self.iter().collect()
    }

    /// The attempts as candidates of `snapshot` (the one the plan was made from).
    pub fn candidates<'s>(
        &'s self,
        snapshot: &'s [Candidate],
    ) -> impl ExactSizeIterator<Item = &'s Candidate> + 's {
        self.iter().map(move |i| &snapshot[i])
    }
}

/// Plans are equal when they walk the same accounts in the same order with the same
/// fan-out, however they hold the order.
impl PartialEq for Plan {
    fn eq(&self, other: &Self) -> bool {
        self.fan_out == other.fan_out
            && self.last_resort == other.last_resort
            && self.len() == other.len()
            && self.iter().eq(other.iter())
    }
}

impl Eq for Plan {}

/// Puts the survivors (snapshot indices) into the stable rotation order of their
/// [`Candidate::rotation_rank`]s, in O(n). When the ranks are not a numbering of the
/// snapshot (a snapshot not captured with [`sort_snapshot`]), the survivors keep the
/// snapshot order.
fn in_rotation_order(snapshot: &[Candidate], survivors: &mut [usize]) {
    const EMPTY: usize = usize::MAX;
    let mut by_rank = vec![EMPTY; snapshot.len()];
    for &i in survivors.iter() {
        match by_rank.get_mut(snapshot[i].rotation_rank as usize) {
            Some(slot) if *slot == EMPTY => *slot = i,
            _ => return,
        }
    }
    let ordered = by_rank.into_iter().filter(|&i| i != EMPTY);
    for (slot, i) in survivors.iter_mut().zip(ordered) {
        *slot = i;
    }
}

/// Survivors of the filters that a caller may keep and plan from again
/// ([`PlanInput::with_survivors`]) while nothing they came from changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeepableSurvivors {
    /// Snapshot indices, in the order [`PlanInput::with_survivors`] takes for the
    /// strategy they were filtered for: rotation order for `round_robin`, snapshot
    /// order otherwise.
    pub indices: Arc<[usize]>,
    /// They stay valid until this time (unix ms), unless an availability fact changes
    /// first: the earliest end of a block (a window, or a cooldown) of an active
    /// account that was blocked at `now`; `UnixMs::MAX` when none was.
    pub valid_until: UnixMs,
}

/// Runs the filters for `strategy` at `now` and returns survivors worth keeping:
/// `None` when the filters end in the last-resort pick or an error (neither is ever
/// kept: the last resort is a random choice among cooling accounts, and an error is
/// answered at once). The caller drops what it kept as soon as any account's window
/// or cooldown changes, or at [`KeepableSurvivors::valid_until`].
pub fn survivors_to_keep<A>(
    snapshot: &[Candidate],
    availability: &A,
    strategy: Strategy,
    now: UnixMs,
) -> Option<KeepableSurvivors>
where
    A: Availability + ?Sized,
{
    // The random tie-break is only used by the last resort, which is never kept.
    let mut no_random_use = rand::rngs::SmallRng::seed_from_u64(0);
    let mut indices = Vec::with_capacity(snapshot.len());
    if filter_into(
        snapshot,
        availability,
        now,
        &mut no_random_use,
        &mut indices,
    )
    .ok()?
    {
        return None;
    }
    if strategy == Strategy::RoundRobin {
        in_rotation_order(snapshot, &mut indices);
    }
    let valid_until = snapshot
        .iter()
        .enumerate()
        .filter(|(_, c)| c.active)
        .filter_map(|(i, c)| match availability.status_of(i, c, now) {
            AccountStatus::Available => None,
            AccountStatus::OutOfWindow(block) => Some(block.until),
            AccountStatus::CoolingUntil(until) => Some(until),
        })
        .min()
        .unwrap_or(UnixMs::MAX);
    Some(KeepableSurvivors {
        indices: indices.into(),
        valid_until,
    })
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
/// - `reset_aware`: the survivors whose 5-hour window reset is known
///   ([`Availability::five_hour_reset`]) first, soonest reset first (its remaining quota
///   expires first if unused); equal resets, and the accounts without a known reset
///   (last), keep the `rated` order.
///
/// Then the preferred account ([`PlanInput::prefer`]), if it survived, moves to the
/// front; the others keep their order. The hedge/race gate comes last, so a preferred
/// primary gets its partner like any other.
///
/// `rng` is used only to break ties between cooldown expiries.
pub fn plan<A, R>(input: &PlanInput<'_, A>, rng: &mut R) -> Result<Plan, SelectError>
where
    A: Availability + ?Sized,
    R: Rng + ?Sized,
{
    let snapshot = input.snapshot;
    // Kept survivors of a round robin are already in rotation order: the plan is
    // where the rotation starts, without copying them.
    if input.strategy == Strategy::RoundRobin
        && let Some(ring) = input.survivors.filter(|s| !s.is_empty())
    {
        if let Some(budget) = input.hedge_budget {
            budget.record_request(input.now);
        }
        let n = ring.len();
        let start = (input.counter % n as u64) as usize;
        let first = input
            .prefer
            .and_then(|prefer| ring.iter().position(|&i| i == prefer))
            .map(|pos| (ring[pos], (pos + n - start) % n));
        return Ok(Plan {
            order: Order::Rotated {
                ring: Arc::clone(ring),
                start,
                first,
            },
            fan_out: fan_out(input, &mut [], None),
            last_resort: false,
        });
    }
    let mut attempts = Vec::with_capacity(snapshot.len());
    let last_resort = match input.survivors {
        Some(survivors) if !survivors.is_empty() => {
            attempts.extend_from_slice(survivors);
            false
        }
        _ => filter_into(snapshot, input.availability, input.now, rng, &mut attempts)?,
    };
    if let Some(budget) = input.hedge_budget {
        budget.record_request(input.now);
    }
    let mut summary = None;
    match input.strategy {
        Strategy::RoundRobin => {
            in_rotation_order(snapshot, &mut attempts);
            let start = (input.counter % attempts.len() as u64) as usize;
            attempts.rotate_left(start);
        }
        Strategy::Priority => {}
        Strategy::Weighted => {
            let start = weighted_start(snapshot, &attempts, input.counter);
            attempts.rotate_left(start);
        }
        Strategy::Rated | Strategy::Hedge | Strategy::Race => {
            summary = Some(input.rating.rank(snapshot, &mut attempts, input.now));
        }
        Strategy::ResetAware => {
            summary = Some(input.rating.rank(snapshot, &mut attempts, input.now));
            // Stable: equal resets keep the rating order; unknown resets go last.
            attempts.sort_by_key(|&i| {
                input
                    .availability
                    .five_hour_reset(&snapshot[i].id, input.now)
                    .map_or((1, 0), |reset| (0, reset))
            });
        }
    }
    if let Some(prefer) = input.prefer
        && let Some(pos) = attempts.iter().position(|&i| i == prefer)
    {
        attempts[..=pos].rotate_right(1);
    }
    let fan_out = fan_out(input, &mut attempts, summary);
    Ok(Plan {
        order: Order::Listed(attempts),
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
    // The primary's own p90; without recent samples, the TTFT it was ranked with (its
    // own average, or the group median that filled its gap).
    let primary_ttft = input
        .rating
        .p90_ttft_ms(&primary.id, input.now)
        .map(|p90| p90 as f64)
        .or_else(|| input.rating.rating(&primary.id, input.now).ttft_ms)
        .or(median_ttft)
        .map_or(0, |ms| ms.ceil() as u64);
    FanOut::Hedge {
        partner,
        delay_ms: primary_ttft.max(input.hedge_min_delay_ms),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use keypool_core::{AuthType, Provider, Window};
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::availability::{AlwaysAvailable, StaticAvailability};
    use crate::candidate::sort_snapshot;
    use crate::rating::Sample;

    const NOW: UnixMs = 1_000_000;

    fn cand(id: &str, url: Option<&str>) -> Candidate {
        Candidate {
            base_url: url.map(Arc::from),
            ..Candidate::new(id, Provider::Anthropic, AuthType::OAuth)
        }
    }

    fn ids(p: &Plan, snapshot: &[Candidate]) -> Vec<String> {
        p.candidates(snapshot).map(|c| c.id.to_string()).collect()
    }

    fn run(input: &PlanInput<'_, impl Availability + ?Sized>) -> Plan {
        plan(input, &mut StdRng::seed_from_u64(9)).unwrap()
    }

    #[test]
    fn kept_survivors_plan_like_the_filters() {
        // Snapshot order differs from rotation order (last_used), one account cooling.
        let mut snapshot: Vec<Candidate> = ["a", "b", "c", "d", "e"]
            .iter()
            .enumerate()
            .map(|(i, id)| Candidate {
                last_used: 10 - i as u64,
                ..cand(id, None)
            })
            .collect();
        crate::sort_snapshot(&mut snapshot);
        let mut facts = crate::StaticAvailability::new();
        facts.cool_until(keypool_core::AccountId::from("c"), NOW + 1_000);
        let rating = RatingEngine::new();
        for strategy in [Strategy::RoundRobin, Strategy::Priority, Strategy::Weighted] {
            let kept = survivors_to_keep(&snapshot, &facts, strategy, NOW).expect("kept");
            assert_eq!(kept.valid_until, NOW + 1_000, "until c's cooldown ends");
            let kept = &kept.indices;
            for counter in 0..6 {
                let input =
                    PlanInput::new(&snapshot, &facts, strategy, &rating, NOW).with_counter(counter);
                let expected = ids(&run(&input), &snapshot);
                let input = input.with_survivors(kept);
                assert_eq!(
                    ids(&run(&input), &snapshot),
                    expected,
                    "{strategy:?} {counter}"
                );
            }
        }
    }

    fn ok(ttft_ms: u64) -> Sample {
        Sample::Success {
            ttft_ms,
            total_ms: ttft_ms * 4,
        }
    }

    #[test]
    fn weighted_three_two_one_walks_a_a_a_b_b_c() {
        let mut snapshot = vec![cand("A", None), cand("B", None), cand("C", None)];
        snapshot[0].weight = 3;
        snapshot[1].weight = 2;
        snapshot[2].weight = 1;
        let rating = RatingEngine::new();
        let leaders: String = (0..9)
            .map(|counter| {
                let input = PlanInput::new(
                    &snapshot,
                    &AlwaysAvailable,
                    Strategy::Weighted,
                    &rating,
                    NOW,
                )
                .with_counter(counter);
                ids(&run(&input), &snapshot)[0].clone()
            })
            .collect();
        assert_eq!(leaders, "AAABBCAAA");
        let input = PlanInput::new(
            &snapshot,
            &AlwaysAvailable,
            Strategy::Weighted,
            &rating,
            NOW,
        )
        .with_counter(4);
        assert_eq!(ids(&run(&input), &snapshot), ["B", "C", "A"]);
    }

    #[test]
    fn round_robin_rotates_and_priority_keeps_the_snapshot() {
        let snapshot = vec![cand("a", None), cand("b", None), cand("c", None)];
        let rating = RatingEngine::new();
        let rr = |counter| {
            let input = PlanInput::new(
                &snapshot,
                &AlwaysAvailable,
                Strategy::RoundRobin,
                &rating,
                NOW,
            )
            .with_counter(counter);
            ids(&run(&input), &snapshot)
        };
        assert_eq!(rr(0), ["a", "b", "c"]);
        assert_eq!(rr(1), ["b", "c", "a"]);
        assert_eq!(rr(5), ["c", "a", "b"]);
        assert_eq!(rr(u64::MAX), ["a", "b", "c"]); // u64::MAX % 3 == 0
        let input = PlanInput::new(
            &snapshot,
            &AlwaysAvailable,
            Strategy::Priority,
            &rating,
            NOW,
        )
        .with_counter(7);
        assert_eq!(ids(&run(&input), &snapshot), ["a", "b", "c"]);
    }

    /// The snapshot is re-sorted by `last_used` whenever it is captured again; the
    /// rotation must follow the stable (`priority`, `id`) order, not that moving one.
    #[test]
    fn round_robin_rotates_in_stable_order_when_the_snapshot_is_resorted() {
        let rating = RatingEngine::new();
        let mut last_used = [0u64; 3];
        let mut leaders = Vec::new();
        for counter in 0..9u64 {
            let mut snapshot: Vec<Candidate> = ["a", "b", "c"]
                .iter()
                .zip(last_used)
                .map(|(id, used)| Candidate {
                    last_used: used,
                    ..cand(id, None)
                })
                .collect();
            sort_snapshot(&mut snapshot);
            let input = PlanInput::new(
                &snapshot,
                &AlwaysAvailable,
                Strategy::RoundRobin,
                &rating,
                NOW,
            )
            .with_counter(counter);
            let p = run(&input);
            let leader = snapshot[p.primary()].id.to_string();
            let slot = ["a", "b", "c"].iter().position(|id| *id == leader).unwrap();
            last_used[slot] = NOW + counter;
            leaders.push(leader);
        }
        assert_eq!(leaders, ["a", "b", "c", "a", "b", "c", "a", "b", "c"]);
    }

    #[test]
    fn error_rate_outweighs_latency() {
        let snapshot = vec![cand("flaky", None), cand("slow", None)];
        let rating = RatingEngine::new();
        let fast_call = Sample::Success {
            ttft_ms: 100,
            total_ms: 0,
        };
        let slow_call = Sample::Success {
            ttft_ms: 3_000,
            total_ms: 0,
        };
        // flaky: 100 ms TTFT and error rate 0.25 (2,500 points) = 2,600 < 3,000.
        rating.record(&snapshot[0].id, fast_call, NOW);
        rating.record(&snapshot[0].id, Sample::Failure, NOW);
        rating.record(&snapshot[1].id, slow_call, NOW);
        let input = PlanInput::new(&snapshot, &AlwaysAvailable, Strategy::Rated, &rating, NOW);
        assert_eq!(ids(&run(&input), &snapshot), ["flaky", "slow"]);
        // One more failure: error rate 0.4375, 4,475 points > 3,000.
        rating.record(&snapshot[0].id, Sample::Failure, NOW);
        assert_eq!(ids(&run(&input), &snapshot), ["slow", "flaky"]);
        // reset_aware without known resets is rated.
        let input = PlanInput::new(
            &snapshot,
            &AlwaysAvailable,
            Strategy::ResetAware,
            &rating,
            NOW,
        );
        assert_eq!(ids(&run(&input), &snapshot), ["slow", "flaky"]);
    }

    #[test]
    fn reset_aware_prefers_the_soonest_reset_then_rating() {
        let snapshot = vec![
            cand("late", None),
            cand("soon-slow", None),
            cand("soon-fast", None),
            cand("unknown", None),
            cand("limited", None),
        ];
        let rating = RatingEngine::new();
        for (i, ttft) in [100, 900, 300, 50, 10].into_iter().enumerate() {
            rating.record(&snapshot[i].id, ok(ttft), NOW);
        }
        let mut av = StaticAvailability::new();
        av.five_hour_resets_at(snapshot[0].id.clone(), NOW + 4 * 3_600_000)
            .five_hour_resets_at(snapshot[1].id.clone(), NOW + 600_000)
            .five_hour_resets_at(snapshot[2].id.clone(), NOW + 600_000)
            // Over its threshold: filtered out, however soon it resets.
            .five_hour_resets_at(snapshot[4].id.clone(), NOW + 1_000)
            .block_window(snapshot[4].id.clone(), Window::FiveHour, NOW + 1_000);
        let input = PlanInput::new(&snapshot, &av, Strategy::ResetAware, &rating, NOW);
        assert_eq!(
            ids(&run(&input), &snapshot),
            ["soon-fast", "soon-slow", "late", "unknown"]
        );
    }

    #[test]
    fn prefer_moves_a_survivor_to_the_front_whatever_the_strategy() {
        let snapshot = vec![cand("a", None), cand("b", None), cand("c", None)];
        let rating = RatingEngine::new();
        let mut av = StaticAvailability::new();
        av.cool_until(snapshot[1].id.clone(), NOW + 5_000);
        for &strategy in Strategy::ALL {
            let input = PlanInput::new(&snapshot, &av, strategy, &rating, NOW)
                .with_counter(1)
                .with_prefer(2);
            let got = ids(&run(&input), &snapshot);
            assert_eq!(got, ["c", "a"], "{strategy:?}");
            // A cooling account is not preferred: the strategy's order stands.
            let cooling = PlanInput::new(&snapshot, &av, strategy, &rating, NOW)
                .with_counter(1)
                .with_prefer(1);
            let plain = PlanInput::new(&snapshot, &av, strategy, &rating, NOW).with_counter(1);
            assert_eq!(ids(&run(&cooling), &snapshot), ids(&run(&plain), &snapshot));
        }
        // Out of range: ignored.
        let input = PlanInput::new(&snapshot, &av, Strategy::Priority, &rating, NOW).with_prefer(9);
        assert_eq!(ids(&run(&input), &snapshot), ["a", "c"]);
    }

    #[test]
    fn hedge_delay_is_the_larger_of_min_delay_and_primary_p90() {
        let snapshot = vec![
            cand("a", None),
            cand("b", Some("https://b")),
            cand("c", None),
        ];
        let rating = RatingEngine::new();
        for ttft in [100, 120, 150] {
            rating.record(&snapshot[0].id, ok(ttft), NOW);
        }
        rating.record(&snapshot[1].id, ok(900), NOW);
        let input = PlanInput::new(&snapshot, &AlwaysAvailable, Strategy::Hedge, &rating, NOW);
        let p = run(&input);
        // p90 of 100, 120, 150 is 150 < 200.
        assert_eq!(
            p.fan_out,
            FanOut::Hedge {
                partner: 1,
                delay_ms: 200
            }
        );
        // a's no-sample neighbour c keeps its place after the partner moved up.
        assert_eq!(ids(&p, &snapshot), ["a", "b", "c"]);
        let p = run(&input.with_hedge_min_delay_ms(50));
        assert_eq!(
            p.fan_out,
            FanOut::Hedge {
                partner: 1,
                delay_ms: 150
            }
        );
    }

    #[test]
    fn primary_without_samples_hedges_after_the_group_median() {
        let snapshot = vec![
            cand("a", None),
            cand("b", Some("https://b")),
            cand("c", None),
        ];
        let rating = RatingEngine::new();
        // a: 400 ms + 1,600 ms total + 25 % errors = 3,060; b: 800 + 3,200 total = 1,120;
        // c (no sample): median 600 + median total 2,400 = 840.
        rating.record(&snapshot[0].id, ok(400), NOW);
        rating.record(&snapshot[0].id, Sample::Failure, NOW);
        rating.record(&snapshot[1].id, ok(800), NOW);
        let input = PlanInput::new(&snapshot, &AlwaysAvailable, Strategy::Hedge, &rating, NOW);
        let p = run(&input);
        assert_eq!(ids(&p, &snapshot), ["c", "b", "a"]);
        // c has no TTFT of its own: its delay is the median it was ranked with.
        assert_eq!(
            p.fan_out,
            FanOut::Hedge {
                partner: 1,
                delay_ms: 600
            }
        );
    }

    #[test]
    fn equal_scores_keep_the_snapshot_order() {
        let snapshot = vec![cand("b", Some("https://b")), cand("c", None)];
        let rating = RatingEngine::new();
        rating.record(&snapshot[0].id, ok(900), NOW);
        // c enters with the group median, 900: a tie, so b stays first.
        let input = PlanInput::new(&snapshot, &AlwaysAvailable, Strategy::Race, &rating, NOW);
        let p = run(&input);
        assert_eq!(ids(&p, &snapshot), ["b", "c"]);
        assert_eq!(p.fan_out, FanOut::Race { partner: 1 });
    }

    #[test]
    fn race_moves_the_first_partner_in_rated_order_to_second_place() {
        let snapshot = vec![
            cand("p", None),
            cand("same-url", None),
            cand("other-auth", Some("https://x")),
            cand("partner", Some("https://x")),
            cand("tail", Some("https://y")),
        ];
        let mut snapshot = snapshot;
        snapshot[2].auth = AuthType::ApiKey;
        let rating = RatingEngine::new();
        for (i, ttft) in [100, 200, 300, 400, 500].into_iter().enumerate() {
            rating.record(&snapshot[i].id, ok(ttft), NOW);
        }
        let input = PlanInput::new(&snapshot, &AlwaysAvailable, Strategy::Race, &rating, NOW);
        let p = run(&input);
        assert_eq!(p.fan_out, FanOut::Race { partner: 3 });
        assert_eq!(
            ids(&p, &snapshot),
            ["p", "partner", "same-url", "other-auth", "tail"]
        );
    }

    #[test]
    fn gate_reasons_in_order() {
        let rating = RatingEngine::new();
        let pair = vec![cand("a", None), cand("b", Some("https://b"))];
        let reason = |snapshot: &[Candidate], av: &StaticAvailability, ct: bool, budget| {
            let mut input =
                PlanInput::new(snapshot, av, Strategy::Hedge, &rating, NOW).with_count_tokens(ct);
            input.hedge_budget = budget;
            run(&input).fan_out.gate_reason()
        };
        let none = StaticAvailability::new();
        // No TTFT yet, and count_tokens is checked before it.
        assert_eq!(
            reason(&pair, &none, true, None),
            Some(GateReason::CountTokens)
        );
        assert_eq!(
            reason(&pair, &none, false, None),
            Some(GateReason::NoTtftData)
        );
        rating.record(&pair[0].id, ok(100), NOW);
        assert_eq!(reason(&pair, &none, false, None), None);
        // Same URL: no partner.
        let same = vec![cand("a", None), cand("b", None)];
        assert_eq!(
            reason(&same, &none, false, None),
            Some(GateReason::NoPartner)
        );
        // b cooling: one survivor.
        let mut cooling = StaticAvailability::new();
        cooling.cool_until(pair[1].id.clone(), NOW + 5);
        assert_eq!(
            reason(&pair, &cooling, false, None),
            Some(GateReason::FewerThanTwo)
        );
        // Everything cooling: the last resort is a single path too.
        cooling.cool_until(pair[0].id.clone(), NOW + 9);
        let p = run(&PlanInput::new(
            &pair,
            &cooling,
            Strategy::Race,
            &rating,
            NOW,
        ));
        assert!(p.last_resort);
        assert_eq!(ids(&p, &pair), ["b"]);
        assert_eq!(p.fan_out, FanOut::Single(GateReason::FewerThanTwo));
        // A fresh 10 % budget: the first request may not fan out.
        let budget = HedgeBudget::default();
        assert_eq!(
            reason(&pair, &none, false, Some(&budget)),
            Some(GateReason::BudgetSpent)
        );
        for _ in 0..8 {
            budget.record_request(NOW);
        }
        // 10th request of the minute: one extra allowed.
        assert_eq!(reason(&pair, &none, false, Some(&budget)), None);
        assert_eq!(budget.usage(NOW), (10, 1));
    }

    #[test]
    fn ranking_sees_new_accounts_and_new_snapshots() {
        let snapshot = vec![cand("a", None), cand("b", None), cand("c", None)];
        let rating = RatingEngine::new();
        rating.record(&snapshot[0].id, ok(500), NOW);
        let rated = |snapshot: &[Candidate]| {
            let input = PlanInput::new(snapshot, &AlwaysAvailable, Strategy::Rated, &rating, NOW);
            ids(&run(&input), snapshot)
        };
        assert_eq!(rated(&snapshot), ["a", "b", "c"]);
        // c gets its first sample after the snapshot's slots were cached.
        rating.record(&snapshot[2].id, ok(100), NOW);
        assert_eq!(rated(&snapshot), ["c", "b", "a"]);
        // A known account improves: no new slot, the cached slots still point at it.
        for _ in 0..10 {
            rating.record(&snapshot[0].id, ok(1), NOW);
        }
        // a ≈ 28 ms; b fills with the median of a and c.
        assert_eq!(rated(&snapshot), ["a", "b", "c"]);
        // Same ids in new allocations, another order: a different snapshot whose
        // position 0 must not inherit a's slot.
        let other = vec![cand("c", None), cand("b", None), cand("a", None)];
        assert_eq!(rated(&other), ["a", "b", "c"]);
        // Another engine over the same snapshot does not reuse the first one's slots.
        let fresh = RatingEngine::new();
        fresh.record(&snapshot[1].id, ok(10), NOW);
        let input = PlanInput::new(&snapshot, &AlwaysAvailable, Strategy::Rated, &fresh, NOW);
        assert_eq!(ids(&run(&input), &snapshot), ["a", "b", "c"]);
    }

    #[test]
    fn errors_come_from_the_filter() {
        let rating = RatingEngine::new();
        let input = PlanInput::new(&[], &AlwaysAvailable, Strategy::Rated, &rating, NOW);
        assert_eq!(
            plan(&input, &mut StdRng::seed_from_u64(0)),
            Err(SelectError::EmptyPool)
        );
        assert!(needs_counter(Strategy::RoundRobin) && needs_counter(Strategy::Weighted));
        assert!(!needs_counter(Strategy::Rated) && !needs_counter(Strategy::Hedge));
    }
}
