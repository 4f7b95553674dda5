//! Properties of the caller limits (SPEC 12): the GCRA never admits more than
//! `burst + rate × t` in any window, and reservations settle to exactly the recorded
//! spend, whatever the order of checks and settlements.

use std::sync::Arc;

use keypool_ledger::*;
use proptest::prelude::*;

const T0: u64 = 1_796_126_400_000; // 2026-12-01T12:00:00Z

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Requests arrive at arbitrary times (several in the same millisecond too); for
    /// every window `[a, b]` between two admitted requests, the admitted ones in it are
    /// at most `burst + per_minute × (b − a) / 60 s`.
    #[test]
    fn gcra_never_admits_more_than_burst_plus_rate_times_t(
        per_minute in 1u32..2_000,
        burst in 1u32..20,
        gaps in proptest::collection::vec(0u64..400, 1..300),
    ) {
        let rate = Rate { per_minute, burst };
        let mut tat = None;
        let mut now = T0;
        let mut admitted = Vec::new();
        for gap in gaps {
            now += gap;
            match rate.admit(tat, now) {
                Ok(next) => {
                    tat = Some(next);
                    admitted.push(now);
                }
                Err(wait_us) => {
                    // A refusal says truly how long: admitted then, not a µs earlier.
                    prop_assert!(wait_us > 0);
                    let at_us = now * 1000 + wait_us;
                    prop_assert!(rate.admit(tat, at_us.div_ceil(1000)).is_ok());
                    if at_us.is_multiple_of(1000) && at_us / 1000 > now {
                        prop_assert!(rate.admit(tat, at_us / 1000 - 1).is_err());
                    }
                }
            }
        }
        for (i, a) in admitted.iter().enumerate() {
            for (j, b) in admitted.iter().enumerate().skip(i) {
                let count = (j - i + 1) as u64;
                // per_minute × (b − a) ms / 60,000 ms, exactly, in integers.
                let bound = u64::from(burst) * 60_000 + u64::from(per_minute) * (b - a);
                prop_assert!(
                    count * 60_000 <= bound,
                    "{} admitted in {} ms at {}/min, burst {}", count, b - a, per_minute, burst
                );
            }
        }
    }

    /// Random checks and settlements, in any order, against budgets large and small:
    /// at the end every entry's settled spend is its seed plus exactly the spends of
    /// the reservations settled in it, and nothing stays reserved.
    #[test]
    fn reservations_settle_to_exactly_the_recorded_spend(
        ops in proptest::collection::vec((0u8..3, 0u64..500, 0u64..500, any::<bool>()), 1..200),
        limit in 100u64..5_000,
        seed_tokens in 0u64..200,
    ) {
        let book = LimitBook::new();
        let who = Who { org: Arc::from("acme"), caller: Arc::from("alice") };
        let limits = Limits {
            tokens_per_day: Some(limit),
            usd_per_month: Some(limit * 10),
            max_concurrent: Some(8),
            ..Limits::default()
        };
        let seed = |_: &SpendKey| Spend { tokens: seed_tokens, nano_usd: 0 };
        let mut open: Vec<Reservation> = Vec::new();
        let mut settled_total = Spend::default();
        for (op, worst, actual, settle_first) in ops {
            if op == 0 || (settle_first && !open.is_empty()) {
                if let Some(r) = (!open.is_empty()).then(|| open.remove(worst as usize % open.len())) {
                    // The real spend may be below or above the worst case.
                    let real = Spend { tokens: actual, nano_usd: actual * 2 };
                    settled_total = settled_total.plus(real);
                    book.settle(r, real);
                }
                continue;
            }
            let ask = Ask {
                who: &who,
                limits: &limits,
                team_usd_per_month: Some(limit * 20),
                worst: Spend { tokens: worst, nano_usd: worst * 3 },
                rate_only: false,
            };
            match book.check(&ask, T0, &seed) {
                Ok(r) => {
                    // Admitted: it fit beside everything settled and reserved.
                    let day = r.keys().iter().find(|k| k.caller.is_some() && matches!(k.period, Period::Day(_))).cloned().unwrap();
                    prop_assert!(book.entry(&day).unwrap().used().tokens <= limit);
                    open.push(r);
                }
                Err(refusal) if refusal.kind == LimitKind::MaxConcurrent => {
                    prop_assert_eq!(open.len(), 8);
                }
                Err(refusal) => {
                    let asked = if refusal.kind.is_usd() { worst * 3 } else { worst };
                    prop_assert!(refusal.used + asked > refusal.limit);
                    prop_assert!(refusal.resets_at.is_some());
                }
            }
        }
        for r in open.drain(..) {
            settled_total = settled_total.plus(r.ask);
            let ask = r.ask;
            book.settle(r, ask);
        }
        prop_assert_eq!(book.in_flight(&who), 0);
        for period in [Period::Day(Day::of(T0)), Period::Month(Month::of(T0))] {
            for caller in [Some(who.caller.clone()), None] {
                let key = SpendKey { org: who.org.clone(), caller: caller.clone(), period };
                if let Some(entry) = book.entry(&key) {
                    prop_assert_eq!(entry.reserved, Spend::default());
                    prop_assert_eq!(entry.settled, seed(&key).plus(settled_total));
                }
            }
        }
    }
}
