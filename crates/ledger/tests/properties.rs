//! Properties of the aggregates: every record is counted once in each of its
//! aggregates, and the deltas a shared store takes add up to exactly what was recorded,
//! whatever the store's failures.

use std::collections::HashMap;
use std::sync::Arc;

use keypool_core::{AccountId, Usage};
use keypool_ledger::*;
use proptest::prelude::*;

const T0: u64 = 1_796_126_400_000; // 2026-12-01T12:00:00Z

fn record(
    caller: u8,
    account: Option<u8>,
    model: u8,
    tokens: u64,
    cost: u64,
    at: u64,
) -> UsageRecord {
    UsageRecord {
        request_id: Arc::from("r"),
        at,
        org: Arc::from(if caller.is_multiple_of(2) {
            "acme"
        } else {
            "globex"
        }),
        url: Arc::from("team"),
        caller: CallerRef {
            kind: CallerKind::User,
            id: Arc::from(format!("k{caller}")),
        },
        endpoint: "messages".into(),
        model: Some(Arc::from(format!("m{model}"))),
        model_sent: Some(Arc::from(format!("m{model}"))),
        routing: None,
        stream: false,
        status: if account.is_some() { 200 } else { 503 },
        account: account.map(|a| AccountId::from(format!("a{a}"))),
        attempts: Vec::new(),
        usage: Usage {
            input_tokens: tokens,
            output_tokens: tokens / 2,
            cache_creation_input_tokens: tokens / 3,
            cache_read_input_tokens: tokens / 5,
        },
        cost_nano_usd: cost,
        cost_basis: CostBasis::Api,
        ttft_ms: None,
        total_ms: 1,
        stream_end: None,
        limit: None,
    }
}

fn records() -> impl Strategy<Value = Vec<UsageRecord>> {
    proptest::collection::vec(
        (
            0u8..4,
            proptest::option::of(0u8..3),
            0u8..3,
            0u64..10_000,
            0u64..1_000_000,
            0u64..3 * 86_400_000,
        ),
        0..60,
    )
    .prop_map(|rows| {
        rows.into_iter()
            .map(|(c, a, m, t, cost, dt)| record(c, a, m, t, cost, T0 + dt))
            .collect()
    })
}

fn sum<'a>(totals: impl IntoIterator<Item = &'a Totals>) -> Totals {
    let mut all = Totals::default();
    for t in totals {
        all.add(t);
    }
    all
}

proptest! {
    /// For every period and dimension, the rows add up to the records of that period
    /// that have the dimension (every request has a caller and a model; only served
    /// ones an account).
    #[test]
    fn rows_add_up_to_their_records(records in records()) {
        let aggregates = Aggregates::new(false);
        for r in &records {
            aggregates.record(r);
        }
        let periods: Vec<Period> = records
            .iter()
            .flat_map(|r| [Period::Day(Day::of(r.at)), Period::Month(Month::of(r.at))])
            .collect();
        for period in periods {
            for dimension in Dimension::ALL {
                let rows = aggregates.rows(period, dimension);
                let expected: Vec<Totals> = records
                    .iter()
                    .filter(|r| match period {
                        Period::Day(d) => Day::of(r.at) == d,
                        Period::Month(m) => Month::of(r.at) == m,
                    })
                    .filter(|r| dimension != Dimension::Account || r.account.is_some())
                    .map(Totals::of)
                    .collect();
                prop_assert_eq!(sum(rows.iter().map(|r| &r.2)), sum(&expected));
            }
        }
    }

    /// A shared store that takes the deltas at random moments and fails some of its
    /// writes (the deltas given back) ends with exactly the recorded totals, once the
    /// last deltas are taken: nothing lost, nothing counted twice.
    #[test]
    fn deltas_add_up_to_exactly_what_was_recorded(
        records in records(),
        flushes in proptest::collection::vec((0usize..60, any::<bool>()), 0..20),
    ) {
        let aggregates = Aggregates::new(true);
        let mut store: HashMap<AggregateKey, Totals> = HashMap::new();
        let mut flush = |ok: bool, aggregates: &Aggregates| {
            let deltas = aggregates.take_deltas();
            if ok {
                for (k, t) in deltas {
                    store.entry(k).or_default().add(&t);
                }
            } else {
                aggregates.restore_deltas(deltas);
            }
        };
        for (i, r) in records.iter().enumerate() {
            aggregates.record(r);
            for (at, ok) in &flushes {
                if *at == i {
                    flush(*ok, &aggregates);
                }
            }
        }
        flush(true, &aggregates);
        prop_assert_eq!(aggregates.pending(), 0);
        let mut local: Vec<_> = aggregates.export();
        local.sort_by(|a, b| a.0.cmp(&b.0));
        let mut shared: Vec<_> = store.into_iter().collect();
        shared.sort_by(|a, b| a.0.cmp(&b.0));
        prop_assert_eq!(local, shared);
    }
}

#[test]
fn old_periods_are_pruned_and_recent_ones_kept() {
    let aggregates = Aggregates::new(false);
    aggregates.record(&record(0, Some(0), 0, 10, 5, T0));
    let later = T0 + 401 * 86_400_000;
    aggregates.record(&record(0, Some(0), 0, 10, 5, later));
    aggregates.prune(later, 400);
    let periods: Vec<Period> = aggregates.export().iter().map(|(k, _)| k.period).collect();
    assert!(
        periods
            .iter()
            .all(|p| p.end() > Day::of(later).minus(400).start())
    );
    assert!(periods.contains(&Period::Day(Day::of(later))));
    assert!(!periods.contains(&Period::Day(Day::of(T0))));
}

#[test]
fn made_up_models_past_the_cap_are_counted_together() {
    let aggregates = Aggregates::new(false);
    let n = MAX_MODELS + 50;
    for m in 0..n {
        let mut r = record(0, None, 0, 10, 5, T0);
        r.model_sent = Some(Arc::from(format!("made-up-{m}")));
        aggregates.record(&r);
    }
    let rows = aggregates.rows(Period::Day(Day::of(T0)), Dimension::Model);
    assert_eq!(rows.len(), MAX_MODELS + 1);
    let other = rows
        .iter()
        .find(|(_, k, _)| &**k == OTHER_MODELS)
        .expect("the models past the cap");
    assert_eq!(other.2.requests, 50);
    // Every request is still counted once per dimension.
    let callers = aggregates.rows(Period::Day(Day::of(T0)), Dimension::Caller);
    assert_eq!(callers[0].2.requests, n as u64);
}

/// `records` with their names shared as the request path gives them (the config's own
/// `Arc`s for the org, caller and account; one per distinct model text here), so that
/// the fold sums records into groups.
fn interned(records: Vec<UsageRecord>) -> Vec<UsageRecord> {
    let mut names: HashMap<String, Arc<str>> = HashMap::new();
    let mut name = |s: &Arc<str>| {
        names
            .entry(s.to_string())
            .or_insert_with(|| s.clone())
            .clone()
    };
    records
        .into_iter()
        .map(|mut r| {
            r.org = name(&r.org);
            r.caller.id = name(&r.caller.id);
            r.account = r.account.map(|a| AccountId::new(name(a.as_arc())));
            r.model = r.model.as_ref().map(&mut name);
            r.model_sent = r.model_sent.as_ref().map(&mut name);
            r
        })
        .collect()
}

proptest! {
    /// With shared names, in batches of any size: every aggregate is exactly the sum
    /// of its records' contributions, and the per-caller totals since start (the token
    /// metrics) are the sums of the callers' tokens and costs.
    #[test]
    fn every_aggregate_is_exactly_its_records_when_batches_are_grouped(
        records in records(),
        batch in 1usize..70,
    ) {
        let records = interned(records);
        let aggregates = Aggregates::new(false);
        for chunk in records.chunks(batch) {
            aggregates.add_all(chunk);
        }
        let mut expected: HashMap<AggregateKey, Totals> = HashMap::new();
        let mut callers: HashMap<(Arc<str>, Arc<str>), (u64, u64)> = HashMap::new();
        for r in &records {
            for key in keys_of(r) {
                expected.entry(key).or_default().add(&Totals::of(r));
            }
            let c = callers.entry((r.org.clone(), r.caller.id.clone())).or_default();
            c.0 += r.usage.total();
            c.1 += r.cost_nano_usd;
        }
        let got: HashMap<AggregateKey, Totals> = aggregates.export().into_iter().collect();
        prop_assert_eq!(got, expected);
        callers.retain(|_, (tokens, cost)| *tokens > 0 || *cost > 0);
        let since: HashMap<(Arc<str>, Arc<str>), (u64, u64)> = aggregates
            .since_start_by_caller()
            .into_iter()
            .map(|(org, caller, t)| ((org, caller), (t.tokens(), t.cost_nano_usd)))
            .collect();
        prop_assert_eq!(since, callers);
    }
}

/// A pool of 40 accounts served in turn: an account comes back only after the 39
/// others (its group is found through the queue's index, never as the newest), but
/// every record has one caller and model. Each account's aggregates are exactly its
/// records, and the caller's and the model's are all of them.
#[test]
fn a_large_pool_in_turn_is_counted_exactly() {
    let records = interned(
        (0..3 * 40u64)
            .map(|i| record(0, Some((i % 40) as u8), 0, 10, 5, T0 + i))
            .collect(),
    );
    let aggregates = Aggregates::new(false);
    for r in &records {
        aggregates.record(r);
    }
    let day = Period::Day(Day::of(T0));
    let accounts = aggregates.rows(day, Dimension::Account);
    assert_eq!(accounts.len(), 40);
    assert!(
        accounts
            .iter()
            .all(|(_, _, t)| t.requests == 3 && t.output_tokens == 15)
    );
    for dimension in [Dimension::Caller, Dimension::Model] {
        let rows = aggregates.rows(day, dimension);
        assert_eq!(rows.len(), 1, "{dimension:?}");
        assert_eq!(rows[0].2.requests, 120);
        assert_eq!(rows[0].2.cost_nano_usd, 600);
    }
}

/// Records added by several threads (each with its own queue, some folded on the way
/// at FOLD_EVERY, some still queued when read) are all counted, and the deltas a
/// shared store takes hold them all too.
#[test]
fn records_of_every_thread_are_counted() {
    let aggregates = Aggregates::new(true);
    let fold = aggregates::FOLD_EVERY as u64;
    let per_thread = [fold * 2 + 17, 3, fold, 1, 0, 40];
    std::thread::scope(|s| {
        for (t, &n) in per_thread.iter().enumerate() {
            let aggregates = &aggregates;
            s.spawn(move || {
                for i in 0..n {
                    aggregates.record(&record(t as u8, Some(t as u8), 0, 10, 1, T0 + i));
                }
            });
        }
    });
    let day = Period::Day(Day::of(T0));
    let rows = aggregates.rows(day, Dimension::Account);
    for (t, &n) in per_thread.iter().enumerate() {
        let got = rows
            .iter()
            .find(|(_, key, _)| **key == *format!("a{t}"))
            .map_or(0, |(_, _, totals)| totals.requests);
        assert_eq!(got, n, "account a{t}");
    }
    let all: u64 = per_thread.iter().sum();
    let models = aggregates.rows(day, Dimension::Model);
    assert_eq!(models.iter().map(|r| r.2.requests).sum::<u64>(), all);
    let taken = aggregates.take_deltas();
    let day_models: u64 = taken
        .iter()
        .filter(|(k, _)| k.period == day && k.dimension == Dimension::Model)
        .map(|(_, t)| t.requests)
        .sum();
    assert_eq!(day_models, all);
}
