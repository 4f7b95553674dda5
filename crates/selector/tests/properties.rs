//! Property tests of the planner (issue 2): filters, strategies, rating, last resort,
//! hedge/race gate.

use std::collections::{BTreeMap, HashSet};

use keypool_core::{AccountId, AuthType, Provider, Strategy, UnixMs, Window};
use keypool_selector::{
    Candidate, FanOut, GateReason, HedgeBudget, PlanInput, RatingEngine, Sample, SelectError,
    StaticAvailability, filter_snapshot, pick_earliest_cooldown_expiry, plan, sort_snapshot,
    survivors_to_keep,
};
use proptest::prelude::*;
use proptest::strategy::Strategy as Gen;
use rand::SeedableRng;
use rand::rngs::StdRng;

const NOW: UnixMs = 10_000_000;

/// What the test says about one account's availability at `NOW`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fact {
    Free,
    /// Out of a window until NOW + ms.
    Limited(Window, u64),
    /// Cooling until NOW + ms (few distinct values, so ties happen).
    Cooling(u64),
    /// A cooldown that already ended.
    Expired,
}

#[derive(Debug, Clone)]
struct Pool {
    snapshot: Vec<Candidate>,
    facts: Vec<Fact>,
}

impl Pool {
    fn availability(&self) -> StaticAvailability {
        let mut av = StaticAvailability::new();
        for (c, f) in self.snapshot.iter().zip(&self.facts) {
            match *f {
                Fact::Free => {}
                Fact::Limited(w, ms) => {
                    av.block_window(c.id.clone(), w, NOW + ms);
                }
                Fact::Cooling(ms) => {
                    av.cool_until(c.id.clone(), NOW + ms);
                }
                Fact::Expired => {
                    av.cool_until(c.id.clone(), NOW - 1);
                }
            }
        }
        av
    }

    /// Snapshot indices of the active, free accounts, in snapshot order.
    fn free(&self) -> Vec<usize> {
        (0..self.snapshot.len())
            .filter(|&i| {
                self.snapshot[i].active && matches!(self.facts[i], Fact::Free | Fact::Expired)
            })
            .collect()
    }

    fn fact_of(&self, i: usize) -> Fact {
        self.facts[i]
    }
}

fn fact() -> impl Gen<Value = Fact> {
    prop_oneof![
        6 => Just(Fact::Free),
        1 => (prop_oneof![Just(Window::FiveHour), Just(Window::Weekly)], 1u64..20_000)
            .prop_map(|(w, ms)| Fact::Limited(w, ms)),
        2 => (1u64..4).prop_map(|k| Fact::Cooling(k * 5_000)),
        1 => Just(Fact::Expired),
    ]
}

fn candidate(i: usize) -> impl Gen<Value = Candidate> {
    (
        prop_oneof![
            Just(Provider::Anthropic),
            Just(Provider::AnthropicCompatible)
        ],
        prop_oneof![Just(AuthType::ApiKey), Just(AuthType::OAuth)],
        prop_oneof![
            Just(None),
            Just(Some("https://u1")),
            Just(Some("https://u2"))
        ],
        -2i32..3,
        1u8..=100,
        0u64..5,
        prop::bool::weighted(0.9),
    )
        .prop_map(
            move |(provider, auth, url, priority, weight, last_used, active)| Candidate {
                base_url: url.map(Into::into),
                priority,
                weight,
                last_used,
                active,
                ..Candidate::new(format!("acct-{i:02}"), provider, auth)
            },
        )
}

/// A sorted snapshot of 1..max accounts with facts.
fn pool(max: usize) -> impl Gen<Value = Pool> {
    (1..max)
        .prop_flat_map(|n| {
            (
                (0..n).map(candidate).collect::<Vec<_>>(),
                prop::collection::vec(fact(), n),
            )
        })
        .prop_map(|(mut snapshot, facts)| {
            // Facts belong to ids, so attach them before sorting.
            let mut pairs: Vec<(Candidate, Fact)> = snapshot.drain(..).zip(facts).collect();
            pairs.sort_by(|a, b| keypool_selector::snapshot_order(&a.0, &b.0));
            let (snapshot, facts) = pairs.into_iter().unzip();
            Pool { snapshot, facts }
        })
}

/// A pool where every account is active and free.
fn free_pool(max: usize) -> impl Gen<Value = Vec<Candidate>> {
    (1..max)
        .prop_flat_map(|n| (0..n).map(candidate).collect::<Vec<_>>())
        .prop_map(|mut v| {
            v.iter_mut().for_each(|c| c.active = true);
            sort_snapshot(&mut v);
            v
        })
}

fn any_strategy() -> impl Gen<Value = Strategy> {
    prop::sample::select(Strategy::ALL.to_vec())
}

/// Random rating samples for some accounts of a snapshot of up to 40.
fn samples() -> impl Gen<Value = Vec<(usize, Option<(u64, u64)>)>> {
    prop::collection::vec(
        (
            0usize..40,
            prop::option::weighted(0.8, (1u64..3_000, 1u64..30_000)),
        ),
        0..40,
    )
}

fn feed(rating: &RatingEngine, snapshot: &[Candidate], samples: &[(usize, Option<(u64, u64)>)]) {
    for &(i, s) in samples {
        let Some(c) = snapshot.get(i) else { continue };
        let sample = match s {
            Some((ttft_ms, total_ms)) => Sample::Success { ttft_ms, total_ms },
            None => Sample::Failure,
        };
        rating.record(&c.id, sample, NOW - 1_000);
    }
}

fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Survivors kept by `survivors_to_keep` give exactly the plan a fresh filtering
    /// gives, for every strategy and any preferred account (a round robin's plan from
    /// them names its rotation instead of listing it); they are offered exactly when the filters end neither
    /// in an error nor in the last resort; and they stay valid until the first block of
    /// an active account ends.
    #[test]
    fn plans_from_kept_survivors_equal_fresh_plans(
        pool in pool(40),
        strategy in any_strategy(),
        counter in any::<u64>(),
        samples in samples(),
        seed in any::<u64>(),
        prefer in proptest::option::of(0usize..44),
    ) {
        let av = pool.availability();
        let rating = RatingEngine::new();
        feed(&rating, &pool.snapshot, &samples);
        let fresh = || {
            let input = PlanInput::new(&pool.snapshot, &av, strategy, &rating, NOW).with_counter(counter);
            match prefer {
                Some(p) => input.with_prefer(p),
                None => input,
            }
        };
        let found = filter_snapshot(&pool.snapshot, &av, NOW, &mut rng(seed));
        let kept = survivors_to_keep(&pool.snapshot, &av, strategy, NOW);
        let Some(kept) = kept else {
            prop_assert!(found.is_err() || found.unwrap().last_resort);
            return Ok(());
        };
        prop_assert!(found.is_ok_and(|f| !f.last_resort));
        let first_block_end = (0..pool.snapshot.len())
            .filter(|&i| pool.snapshot[i].active)
            .filter_map(|i| match pool.fact_of(i) {
                Fact::Limited(_, ms) | Fact::Cooling(ms) => Some(NOW + ms),
                Fact::Free | Fact::Expired => None,
            })
            .min()
            .unwrap_or(UnixMs::MAX);
        prop_assert_eq!(kept.valid_until, first_block_end);
        let expected = plan(&fresh(), &mut rng(seed)).unwrap();
        let from_kept = plan(&fresh().with_survivors(&kept.indices), &mut rng(seed)).unwrap();
        prop_assert_eq!(&from_kept.attempts(), &expected.attempts());
        prop_assert_eq!(from_kept.len(), expected.len());
        prop_assert_eq!(from_kept.get(from_kept.len()), None);
        prop_assert_eq!(from_kept.primary(), expected.primary());
        prop_assert_eq!(&from_kept, &expected);
        prop_assert_eq!(from_kept.fan_out, expected.fan_out);
        prop_assert!(!from_kept.last_resort);
    }

    /// A plan never names an account twice, never exceeds the snapshot and never
    /// contains an inactive, out-of-window or cooling account except the single
    /// last-resort pick; it drops nothing that survived; errors only when they must.
    #[test]
    fn plans_respect_the_filters(
        pool in pool(40),
        strategy in any_strategy(),
        counter in any::<u64>(),
        samples in samples(),
        seed in any::<u64>(),
        count_tokens in any::<bool>(),
    ) {
        let av = pool.availability();
        let rating = RatingEngine::new();
        feed(&rating, &pool.snapshot, &samples);
        let input = PlanInput::new(&pool.snapshot, &av, strategy, &rating, NOW)
            .with_counter(counter)
            .with_count_tokens(count_tokens);
        let result = plan(&input, &mut rng(seed));
        let active: Vec<usize> = (0..pool.snapshot.len()).filter(|&i| pool.snapshot[i].active).collect();
        let free = pool.free();
        let cooling: Vec<(usize, u64)> = active.iter().filter_map(|&i| match pool.fact_of(i) {
            Fact::Cooling(ms) => Some((i, ms)),
            _ => None,
        }).collect();
        match result {
            Ok(p) => {
                let unique: HashSet<usize> = p.attempts().iter().copied().collect();
                prop_assert_eq!(unique.len(), p.attempts().len(), "an account twice");
                prop_assert!(p.attempts().len() <= pool.snapshot.len());
                if p.last_resort {
                    prop_assert!(free.is_empty());
                    prop_assert_eq!(p.attempts().len(), 1);
                    let earliest = cooling.iter().map(|c| c.1).min().unwrap();
                    let chosen = p.attempts()[0];
                    prop_assert!(cooling.contains(&(chosen, earliest)), "not a minimum-expiry account");
                } else {
                    let mut got = p.attempts();
                    got.sort_unstable();
                    prop_assert_eq!(got, free, "exactly the surviving accounts");
                }
            }
            Err(SelectError::NoActiveAccounts { total }) => {
                prop_assert!(active.is_empty());
                prop_assert_eq!(total, pool.snapshot.len());
            }
            Err(SelectError::AllOutOfWindow { window, retry_after_secs, returns_at, .. }) => {
                prop_assert!(!active.is_empty() && free.is_empty() && cooling.is_empty());
                let (earliest_ms, w) = active.iter().filter_map(|&i| match pool.fact_of(i) {
                    Fact::Limited(w, ms) => Some((ms, w)),
                    _ => None,
                }).min_by_key(|x| x.0).unwrap();
                prop_assert_eq!(returns_at, NOW + earliest_ms);
                prop_assert_eq!(retry_after_secs, earliest_ms.div_ceil(1000).max(1));
                // Ties between windows name the first in snapshot order; check the
                // window is one of those that reset at that instant.
                let windows: Vec<Window> = active.iter().filter_map(|&i| match pool.fact_of(i) {
                    Fact::Limited(w2, ms) if ms == earliest_ms => Some(w2),
                    _ => None,
                }).collect();
                prop_assert!(windows.contains(&window), "{window} not among {windows:?} ({w})");
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    /// round_robin: with fixed availability, n consecutive plans start with each of the
    /// n surviving accounts exactly once; each plan is a rotation of the survivors.
    #[test]
    fn round_robin_leads_with_each_account_once(
        pool in pool(30),
        start in any::<u64>(),
    ) {
        let free = pool.free();
        prop_assume!(!free.is_empty());
        let av = pool.availability();
        let rating = RatingEngine::new();
        let n = free.len() as u64;
        let mut leaders = Vec::new();
        for k in 0..n {
            let counter = start.wrapping_add(k);
            let input = PlanInput::new(&pool.snapshot, &av, Strategy::RoundRobin, &rating, NOW)
                .with_counter(counter);
            let p = plan(&input, &mut rng(k)).unwrap();
            let at = free.iter().position(|&i| i == p.attempts()[0]).unwrap();
            let mut rotated = free.clone();
            rotated.rotate_left(at);
            prop_assert_eq!(&p.attempts(), &rotated);
            leaders.push(p.attempts()[0]);
        }
        leaders.sort_unstable();
        prop_assert_eq!(leaders, free);
    }

    /// weighted: over sum(weights) consecutive picks each account leads exactly
    /// `weight` times, and failover continues with the next distinct accounts in slot
    /// order.
    #[test]
    fn weighted_leads_each_account_weight_times(
        snapshot in free_pool(20),
        start in any::<u64>(),
    ) {
        let av = StaticAvailability::new();
        let rating = RatingEngine::new();
        let total: u64 = snapshot.iter().map(|c| u64::from(c.weight)).sum();
        let mut leads: BTreeMap<usize, u64> = BTreeMap::new();
        // Start at a multiple of the total so the window is aligned with slot 0 when
        // `start` is 0, and unaligned otherwise: the property holds for any window.
        for k in 0..total {
            let input = PlanInput::new(&snapshot, &av, Strategy::Weighted, &rating, NOW)
                .with_counter(start.wrapping_add(k) % (u64::MAX - u64::MAX % total));
            let p = plan(&input, &mut rng(k)).unwrap();
            let lead = p.attempts()[0];
            let mut rotated: Vec<usize> = (0..snapshot.len()).collect();
            rotated.rotate_left(lead);
            prop_assert_eq!(&p.attempts(), &rotated);
            *leads.entry(lead).or_default() += 1;
        }
        for (i, c) in snapshot.iter().enumerate() {
            prop_assert_eq!(leads.get(&i).copied().unwrap_or(0), u64::from(c.weight), "account {}", i);
        }
    }

    /// rated: the plan is sorted by score, equal scores keep snapshot order, and an
    /// account without samples scores with the group median TTFT (and total).
    #[test]
    fn rated_sorts_by_score_with_median_fill(
        snapshot in free_pool(30),
        values in prop::collection::vec(prop::option::of((0u64..2_000, 0u64..20_000)), 30),
        failures in prop::collection::vec(any::<bool>(), 30),
    ) {
        let av = StaticAvailability::new();
        let rating = RatingEngine::new();
        for (i, c) in snapshot.iter().enumerate() {
            if let Some((ttft_ms, total_ms)) = values[i] {
                rating.record(&c.id, Sample::Success { ttft_ms, total_ms }, NOW - 5);
            }
            if failures[i] {
                rating.record(&c.id, Sample::Failure, NOW - 5);
            }
        }
        let input = PlanInput::new(&snapshot, &av, Strategy::Rated, &rating, NOW);
        let p = plan(&input, &mut rng(0)).unwrap();

        // Sorted by the engine's scores, ties in snapshot order.
        let scores = rating.scores(&snapshot, NOW);
        for w in p.attempts().windows(2) {
            let (a, b) = (w[0], w[1]);
            prop_assert!(scores[a] < scores[b] || (scores[a] == scores[b] && a < b),
                "{a} ({}) before {b} ({})", scores[a], scores[b]);
        }

        // The scores follow the model: EWMA of one success is the value; a failure after
        // a success makes the error rate 0.25, alone it is 1.
        let with: Vec<(f64, f64)> = values.iter().take(snapshot.len()).flatten()
            .map(|&(t, tot)| (t as f64, tot as f64)).collect();
        let med = |mut v: Vec<f64>| -> f64 {
            v.sort_by(f64::total_cmp);
            let n = v.len();
            if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
        };
        for (i, &score) in scores.iter().enumerate() {
            let expected = if with.is_empty() {
                0.0
            } else {
                let (t, tot) = values[i].map(|(t, tot)| (t as f64, tot as f64)).unwrap_or_else(|| (
                    med(with.iter().map(|x| x.0).collect()),
                    med(with.iter().map(|x| x.1).collect()),
                ));
                let err = match (values[i].is_some(), failures[i]) {
                    (_, false) => 0.0,
                    (true, true) => 0.25,
                    (false, true) => 1.0,
                };
                t + 0.1 * tot + 10_000.0 * err
            };
            prop_assert!((score - expected).abs() <= 1e-6 * expected.max(1.0),
                "account {i}: score {score}, model {expected}");
        }
        if with.is_empty() {
            prop_assert_eq!(p.attempts(), (0..snapshot.len()).collect::<Vec<_>>());
        }
    }

    /// earliest-expiry: always a minimum-expiry account.
    #[test]
    fn earliest_expiry_is_a_minimum(
        cooling in prop::collection::vec((0usize..1000, 1u64..5), 1..30),
        seed in any::<u64>(),
    ) {
        let chosen = pick_earliest_cooldown_expiry(&cooling, &mut rng(seed)).unwrap();
        let min = cooling.iter().map(|c| c.1).min().unwrap();
        prop_assert!(cooling.iter().any(|&(i, until)| i == chosen && until == min));
    }

    /// earliest-expiry ties: with a fixed seed and many draws through the whole
    /// planner, every tied account is chosen at least once and none more than twice its
    /// fair share.
    #[test]
    fn earliest_expiry_ties_are_random(
        ties in 2usize..8,
        others in 0usize..5,
        seed in any::<u64>(),
    ) {
        let snapshot: Vec<Candidate> = (0..ties + others)
            .map(|i| Candidate::new(format!("a{i:02}"), Provider::Anthropic, AuthType::ApiKey))
            .collect();
        let mut av = StaticAvailability::new();
        for (i, c) in snapshot.iter().enumerate() {
            // The tied accounts are the last ones, so "the first of the list" would
            // never pick them all.
            let until = if i >= others { NOW + 1_000 } else { NOW + 2_000 + i as u64 };
            av.cool_until(c.id.clone(), until);
        }
        let rating = RatingEngine::new();
        let draws = 200 * ties;
        let mut rng = rng(seed);
        let mut counts = vec![0usize; ties];
        for _ in 0..draws {
            let input = PlanInput::new(&snapshot, &av, Strategy::Priority, &rating, NOW);
            let p = plan(&input, &mut rng).unwrap();
            prop_assert!(p.last_resort);
            prop_assert!(p.attempts()[0] >= others, "picked a later expiry");
            counts[p.attempts()[0] - others] += 1;
        }
        let fair = draws / ties;
        for (k, &c) in counts.iter().enumerate() {
            prop_assert!(c >= 1 && c <= 2 * fair, "tied account {k} chosen {c} times of {draws}");
        }
    }

    /// hedge/race: the partner has the primary's provider and auth type and a different
    /// base_url; the primary is exactly `rated`'s; the gate reasons come in SPEC order.
    #[test]
    fn hedge_and_race_follow_the_gate(
        pool in pool(12),
        race in any::<bool>(),
        count_tokens in prop::bool::weighted(0.2),
        samples in samples(),
        prior in (0u64..40, 0u64..6),
        min_delay in 0u64..1_000,
    ) {
        let strategy = if race { Strategy::Race } else { Strategy::Hedge };
        let av = pool.availability();
        let rating = RatingEngine::new();
        feed(&rating, &pool.snapshot, &samples);
        let budget = HedgeBudget::default();
        for _ in 0..prior.0 { budget.record_request(NOW - 10_000); }
        for _ in 0..prior.1.min(prior.0 / 10) { prop_assert!(budget.try_spend(NOW - 10_000)); }
        let (requests_before, extras_before) = budget.usage(NOW);

        let input = PlanInput::new(&pool.snapshot, &av, strategy, &rating, NOW)
            .with_count_tokens(count_tokens)
            .with_hedge_budget(&budget)
            .with_hedge_min_delay_ms(min_delay);
        let Ok(p) = plan(&input, &mut rng(1)) else { return Ok(()) };
        let rated = plan(&PlanInput::new(&pool.snapshot, &av, Strategy::Rated, &rating, NOW), &mut rng(1)).unwrap();
        prop_assert_eq!(p.attempts()[0], rated.attempts()[0], "primary exactly as rated");

        // The model of the gate, checked in SPEC order.
        let primary = &pool.snapshot[p.attempts()[0]];
        let partner_of_rated = rated.attempts()[1..].iter().copied().find(|&i| {
            let c = &pool.snapshot[i];
            c.provider == primary.provider && c.auth == primary.auth
                && c.base_url.as_deref() != primary.base_url.as_deref()
        });
        let survivors: Vec<&Candidate> = rated.candidates(&pool.snapshot).collect();
        let any_ttft = survivors.iter().any(|c| rating.rating(&c.id, NOW).ttft_ms.is_some());
        let budget_ok = (extras_before + 1) * 10 <= requests_before + 1;
        let expected = if count_tokens {
            Some(GateReason::CountTokens)
        } else if rated.attempts().len() < 2 {
            Some(GateReason::FewerThanTwo)
        } else if partner_of_rated.is_none() {
            Some(GateReason::NoPartner)
        } else if !any_ttft {
            Some(GateReason::NoTtftData)
        } else if !budget_ok {
            Some(GateReason::BudgetSpent)
        } else {
            None
        };
        prop_assert_eq!(p.fan_out.gate_reason(), expected);
        prop_assert_eq!(budget.usage(NOW), (requests_before + 1, extras_before + u64::from(expected.is_none())));

        match p.fan_out {
            FanOut::Single(_) => prop_assert_eq!(&p.attempts(), &rated.attempts()),
            FanOut::Hedge { partner, delay_ms } => {
                prop_assert!(!race);
                prop_assert_eq!(Some(partner), partner_of_rated);
                prop_assert_eq!(p.attempts()[1], partner);
                let p90 = rating.p90_ttft_ms(&primary.id, NOW);
                prop_assert!(delay_ms >= min_delay);
                if let Some(p90) = p90 { prop_assert_eq!(delay_ms, p90.max(min_delay)); }
            }
            FanOut::Race { partner } => {
                prop_assert!(race);
                prop_assert_eq!(Some(partner), partner_of_rated);
                prop_assert_eq!(p.attempts()[1], partner);
            }
        }
        if let Some(partner) = p.fan_out.partner() {
            let c = &pool.snapshot[partner];
            prop_assert!(c.provider == primary.provider && c.auth == primary.auth);
            prop_assert!(c.base_url != primary.base_url);
            // The rest keeps rated order.
            let rest: Vec<usize> = rated.attempts().iter().copied().filter(|&i| i != partner).collect();
            prop_assert_eq!(&p.attempts()[0..1], &rest[0..1]);
            prop_assert_eq!(&p.attempts()[2..], &rest[1..]);
        }
    }

    /// Every strategy other than hedge/race takes the single path for reason 1.
    #[test]
    fn other_strategies_never_fan_out(
        pool in pool(20),
        samples in samples(),
        strategy in prop::sample::select(vec![
            Strategy::RoundRobin, Strategy::Priority, Strategy::Weighted,
            Strategy::Rated, Strategy::ResetAware,
        ]),
    ) {
        let av = pool.availability();
        let rating = RatingEngine::new();
        feed(&rating, &pool.snapshot, &samples);
        if let Ok(p) = plan(&PlanInput::new(&pool.snapshot, &av, strategy, &rating, NOW), &mut rng(3)) {
            prop_assert_eq!(p.fan_out, FanOut::Single(GateReason::NotHedgeStrategy));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// reset_aware never plans an account over its threshold (out of its window) while
    /// another survives, orders known resets ascending (unknown last), and between equal
    /// resets keeps the rating order.
    #[test]
    fn reset_aware_orders_by_reset_then_rating(
        pool in pool(20),
        samples in samples(),
        resets in prop::collection::vec(prop::option::weighted(0.8, 1u64..4), 20),
        prefer in prop::option::of(0usize..20),
    ) {
        let mut av = pool.availability();
        for (c, r) in pool.snapshot.iter().zip(&resets) {
            if let Some(k) = r {
                // Few distinct values, so equal resets happen.
                av.five_hour_resets_at(c.id.clone(), NOW + k * 600_000);
            }
        }
        let reset_of = |i: usize| resets[i].map(|k| NOW + k * 600_000);
        let rating = RatingEngine::new();
        feed(&rating, &pool.snapshot, &samples);
        let input = PlanInput::new(&pool.snapshot, &av, Strategy::ResetAware, &rating, NOW);
        let Ok(p) = plan(&input, &mut rng(5)) else { return Ok(()) };
        for &i in &p.attempts() {
            prop_assert!(!matches!(pool.fact_of(i), Fact::Limited(..)), "{i} is out of its window");
        }
        let key = |i: usize| reset_of(i).map_or((1, 0), |r| (0, r));
        prop_assert!(p.attempts().windows(2).all(|w| key(w[0]) <= key(w[1])));
        let rated = plan(
            &PlanInput::new(&pool.snapshot, &av, Strategy::Rated, &rating, NOW),
            &mut rng(5),
        ).unwrap();
        // Within each group of equal resets: the rated order.
        let mut expected = rated.attempts();
        expected.sort_by_key(|&i| key(i));
        prop_assert_eq!(&p.attempts(), &expected);

        // A preferred survivor goes first; the others keep their order.
        if let Some(prefer) = prefer {
            let q = plan(&input.with_prefer(prefer), &mut rng(5)).unwrap();
            if p.attempts().contains(&prefer) {
                prop_assert_eq!(q.attempts()[0], prefer);
                let rest: Vec<usize> = p.attempts().iter().copied().filter(|&i| i != prefer).collect();
                prop_assert_eq!(&q.attempts()[1..], &rest[..]);
            } else {
                prop_assert_eq!(&q.attempts(), &p.attempts());
            }
        }
    }

    /// With every reset equal, reset_aware is exactly rated.
    #[test]
    fn reset_aware_with_equal_resets_is_rated(pool in pool(20), samples in samples()) {
        let mut av = pool.availability();
        for c in &pool.snapshot {
            av.five_hour_resets_at(c.id.clone(), NOW + 3_600_000);
        }
        let rating = RatingEngine::new();
        feed(&rating, &pool.snapshot, &samples);
        let reset_aware = plan(&PlanInput::new(&pool.snapshot, &av, Strategy::ResetAware, &rating, NOW), &mut rng(1));
        let rated = plan(&PlanInput::new(&pool.snapshot, &av, Strategy::Rated, &rating, NOW), &mut rng(1));
        prop_assert_eq!(reset_aware.map(|p| p.attempts()), rated.map(|p| p.attempts()));
    }
}

#[test]
fn unused_account_ids_have_no_rating() {
    let rating = RatingEngine::new();
    assert_eq!(
        rating.rating(&AccountId::from("nobody"), NOW),
        Default::default()
    );
}
