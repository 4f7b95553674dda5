//! [`Aggregates`]: totals per UTC day and month by (org, caller), (org, account) and
//! (org, model) (SPEC 11), and the deltas a shared store has not taken yet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use dashmap::DashMap;
use keypool_core::UnixMs;
use serde::{Deserialize, Serialize};

use crate::period::{Day, Month, Period};
use crate::record::UsageRecord;
use crate::totals::Totals;

/// What an aggregate is broken down by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dimension {
    /// The caller's key id.
    Caller,
    /// The account that served.
    Account,
    /// The model the usage is counted under.
    Model,
}

impl Dimension {
    /// Every dimension.
    pub const ALL: [Dimension; 3] = [Self::Caller, Self::Account, Self::Model];

    /// `caller`, `account` or `model`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Caller => "caller",
            Self::Account => "account",
            Self::Model => "model",
        }
    }
}

/// One aggregate: a period, a dimension, an org and the dimension's value in it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AggregateKey {
    /// The day or month.
    pub period: Period,
    /// What `key` is.
    pub dimension: Dimension,
    /// The org.
    pub org: Arc<str>,
    /// The caller's key id, the account id or the model.
    pub key: Arc<str>,
}

/// The aggregates one record adds to (at most six: each dimension it has, for its day
/// and its month).
pub fn keys_of(record: &UsageRecord) -> impl Iterator<Item = AggregateKey> + '_ {
    let day = Day::of(record.at);
    let periods = [Period::Day(day), Period::Month(day.month())];
    let values = [
        (Dimension::Caller, Some(&record.caller.id)),
        (
            Dimension::Account,
            record.account.as_ref().map(|a| a.as_arc()),
        ),
        (Dimension::Model, record.counted_model()),
    ];
    periods.into_iter().flat_map(move |period| {
        values.into_iter().filter_map(move |(dimension, key)| {
            Some(AggregateKey {
                period,
                dimension,
                org: record.org.clone(),
                key: key?.clone(),
            })
        })
    })
}

/// Totals per [`AggregateKey`]. With `track_deltas`, every addition is also kept as a
/// delta until a shared store takes it ([`Aggregates::take_deltas`]), so that a store
/// outage loses nothing: what it could not take is given back
/// ([`Aggregates::restore_deltas`]) and sent again.
#[derive(Debug, Default)]
pub struct Aggregates {
    totals: DashMap<AggregateKey, Totals>,
    deltas: Option<Mutex<HashMap<AggregateKey, Totals>>>,
}

impl Aggregates {
    /// Empty aggregates; `track_deltas` for a shared store.
    pub fn new(track_deltas: bool) -> Self {
        Self {
            totals: DashMap::new(),
            deltas: track_deltas.then(|| Mutex::new(HashMap::new())),
        }
    }

    /// Adds one record to its aggregates.
    pub fn record(&self, record: &UsageRecord) {
        let add = Totals::of(record);
        let mut deltas = self
            .deltas
            .as_ref()
            .map(|d| d.lock().unwrap_or_else(PoisonError::into_inner));
        for key in keys_of(record) {
            if let Some(deltas) = deltas.as_mut() {
                deltas.entry(key.clone()).or_default().add(&add);
            }
            self.totals.entry(key).or_default().add(&add);
        }
    }

    /// The totals of `key` (zero when nothing was added).
    pub fn get(&self, key: &AggregateKey) -> Totals {
        self.totals.get(key).map(|t| *t).unwrap_or_default()
    }

    /// Every `(org, key, totals)` of `period` and `dimension`, sorted by org and key.
    pub fn rows(&self, period: Period, dimension: Dimension) -> Vec<(Arc<str>, Arc<str>, Totals)> {
        let mut rows: Vec<_> = self
            .totals
            .iter()
            .filter(|e| e.key().period == period && e.key().dimension == dimension)
            .map(|e| (e.key().org.clone(), e.key().key.clone(), *e.value()))
            .collect();
        rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        rows
    }

    /// Everything, for the state file.
    pub fn export(&self) -> Vec<(AggregateKey, Totals)> {
        let mut rows: Vec<_> = self
            .totals
            .iter()
            .map(|e| (e.key().clone(), *e.value()))
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    }

    /// Sets every aggregate of `rows` to its totals (a state file at boot, or the
    /// shared store's totals, which include this process's flushed additions).
    pub fn import(&self, rows: impl IntoIterator<Item = (AggregateKey, Totals)>) {
        for (key, totals) in rows {
            self.totals.insert(key, totals);
        }
    }

    /// Drops the aggregates of days and months that ended more than `keep_days` days
    /// before `now`.
    pub fn prune(&self, now: UnixMs, keep_days: u32) {
        let horizon = Day::of(now).minus(keep_days).start();
        self.totals.retain(|k, _| k.period.end() > horizon);
    }

    /// The additions no shared store has taken yet, taken now (empty without
    /// `track_deltas`).
    pub fn take_deltas(&self) -> HashMap<AggregateKey, Totals> {
        self.deltas
            .as_ref()
            .map(|d| std::mem::take(&mut *d.lock().unwrap_or_else(PoisonError::into_inner)))
            .unwrap_or_default()
    }

    /// Gives back deltas a shared store could not take (added to what came since).
    pub fn restore_deltas(&self, deltas: HashMap<AggregateKey, Totals>) {
        if let Some(pending) = &self.deltas {
            let mut pending = pending.lock().unwrap_or_else(PoisonError::into_inner);
            for (key, totals) in deltas {
                pending.entry(key).or_default().add(&totals);
            }
        }
    }

    /// The deltas waiting of `period` and `dimension`, left in place.
    pub fn peek_deltas(&self, period: Period, dimension: Dimension) -> Vec<(AggregateKey, Totals)> {
        self.deltas.as_ref().map_or_else(Vec::new, |d| {
            d.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .filter(|(k, _)| k.period == period && k.dimension == dimension)
                .map(|(k, t)| (k.clone(), *t))
                .collect()
        })
    }

    /// How many aggregates have deltas waiting.
    pub fn pending(&self) -> usize {
        self.deltas.as_ref().map_or(0, |d| {
            d.lock().unwrap_or_else(PoisonError::into_inner).len()
        })
    }
}

/// The month of `day` as a period (for callers that have a day).
pub fn month_of(day: Day) -> Period {
    Period::Month(day.month())
}

/// The day of `at` as a period.
pub fn day_of(at: UnixMs) -> Period {
    Period::Day(Day::of(at))
}

/// The month of `at` as a period.
pub fn month_at(at: UnixMs) -> Period {
    Period::Month(Month::of(at))
}
